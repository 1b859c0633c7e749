"""
Tiny Shakespeare as GPT-2 BPE tokens, as nanoGPT's data/shakespeare: the text for fine-tuning GPT-2
(config/finetune_shakespeare.py). 90% train / 10% val by characters, each part encoded on its own, uint16 tokens.

$ python prepare/shakespeare.py [--source=path/to/input.txt] [--data_dir=data/shakespeare]
"""
import argparse
import json
import os
import sys

import numpy as np

if __name__ == '__main__':  # run as a script: make the `prepare` package importable from the repo root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from prepare.shakespeare_char import URL, read_text

DEFAULT_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'data', 'shakespeare')


def prepare(data_dir=DEFAULT_DIR, source=None):
    """Write train.bin, val.bin and meta.json into data_dir; return at once if they are already there."""
    if os.path.exists(os.path.join(data_dir, 'meta.json')):
        return
    import tiktoken
    text = read_text(source)
    n = int(0.9 * len(text))
    enc = tiktoken.get_encoding('gpt2')
    os.makedirs(data_dir, exist_ok=True)
    tokens = {}
    for split, part in (('train', text[:n]), ('val', text[n:])):
        ids = np.array(enc.encode_ordinary(part), dtype=np.uint16)
        ids.tofile(os.path.join(data_dir, f'{split}.bin.tmp'))
        os.replace(os.path.join(data_dir, f'{split}.bin.tmp'), os.path.join(data_dir, f'{split}.bin'))
        tokens[split] = len(ids)
    meta = dict(dataset='shakespeare', kind='text', encoding='gpt2', vocab_size=enc.n_vocab, tokens=tokens,
                source=str(source or URL))
    with open(os.path.join(data_dir, 'meta.json.tmp'), 'w') as f:
        json.dump(meta, f)
    os.replace(os.path.join(data_dir, 'meta.json.tmp'), os.path.join(data_dir, 'meta.json'))  # last: marks done
    print(f"{len(text):,} characters: train {tokens['train']:,} GPT-2 tokens, val {tokens['val']:,} -> {data_dir}")


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument('--source', default=None, help="local input.txt instead of the download")
    parser.add_argument('--data_dir', default=DEFAULT_DIR)
    args = parser.parse_args()
    try:
        prepare(args.data_dir, args.source)
    except (OSError, RuntimeError, ValueError) as e:  # bad --source, or no network: one line, not a traceback
        raise SystemExit(f"error: {e}")
