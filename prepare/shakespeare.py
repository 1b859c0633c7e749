"""
Tiny Shakespeare as GPT-2 BPE tokens, as nanoGPT's data/shakespeare: the text for fine-tuning GPT-2
(config/finetune_shakespeare.py). 90% train / 10% val by characters, each part encoded on its own, uint16 tokens.

$ python prepare/shakespeare.py [--source=path/to/input.txt] [--data_dir=data/shakespeare]
"""
import os
import sys

import numpy as np

if __name__ == '__main__':  # run as a script: make the `prepare` package importable from the repo root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from prepare.catalog import default_data_dir
from prepare.folder import read_meta
from prepare.sources import check_source, gpt2_encoding
from prepare.shakespeare_char import URL, main, read_text, write_splits

DEFAULT_DIR = default_data_dir('shakespeare')


def prepare(data_dir=DEFAULT_DIR, source=None):
    """Write train.bin, val.bin and meta.json into data_dir; return at once if they are already there."""
    check_source(data_dir, source, 'source')  # a folder prepared from another text: said, not ignored
    if read_meta(data_dir) is not None:  # a damaged one is a ValueError naming it
        return
    text = read_text(source)  # a missing source said before the tokenizer is loaded
    enc = gpt2_encoding()
    n = int(0.9 * len(text))
    splits = {split: np.array(enc.encode_ordinary(part), dtype=np.uint16)
              for split, part in (('train', text[:n]), ('val', text[n:]))}
    write_splits(data_dir, splits, dict(dataset='shakespeare', kind='text', encoding='gpt2', vocab_size=enc.n_vocab,
                                        source=os.path.realpath(source) if source else URL))
    print(f"{len(text):,} characters: train {len(splits['train']):,} GPT-2 tokens, val {len(splits['val']):,} -> "
          f"{data_dir}")


if __name__ == '__main__':
    main(prepare, DEFAULT_DIR, __doc__)
