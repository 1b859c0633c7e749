"""
Tiny Shakespeare at the character level, as in nanoGPT: 65 characters, 90% train / 10% val, uint16 tokens.

$ python prepare/shakespeare_char.py [--source=path/to/input.txt] [--data_dir=data/shakespeare_char]
"""
import argparse
import os
import sys
import urllib.request

import numpy as np

if __name__ == '__main__':  # run as a script: make the `prepare` package importable from the repo root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from prepare.folder import array_file, read_meta, write_prepared
from prepare.script import script_errors
from prepare.sources import check_source, read_source_text

URL = 'https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt'
DEFAULT_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'data', 'shakespeare_char')


def read_text(source):
    if source:  # a folder, a binary file, an empty one: one line naming it
        return read_source_text(source, f"--source={source}", "give the path of tiny-shakespeare's input.txt or "
                                                                "another text")
    try:
        with urllib.request.urlopen(URL, timeout=30) as r:
            return r.read().decode('utf-8')
    except OSError as e:
        raise RuntimeError(f"could not download tiny-shakespeare from {URL} ({e}); with no network, pass a local "
                           f"copy of input.txt: python prepare/shakespeare_char.py --source=PATH "
                           f"(or --data_source=PATH to train.py)") from e


def prepare(data_dir=DEFAULT_DIR, source=None, chars=None):
    """Write train.bin, val.bin and meta.json into data_dir; return at once if they are already there. chars: the
    characters to encode with, in token order (a base model's, to fine-tune it on another text); default the text's."""
    check_source(data_dir, source, 'source')  # a folder prepared from another text: said, not ignored
    if read_meta(data_dir) is not None:  # a damaged one is a ValueError naming it
        return
    text = read_text(source)
    unknown = sorted(set(text) - set(chars or text))
    if unknown:
        raise ValueError(f"{source or URL} has {len(unknown)} character(s) the base model does not know: "
                         f"{' '.join(map(repr, unknown[:20]))}; remove them from the text")
    chars = list(chars) if chars else sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(chars)}
    tokens = np.array([stoi[c] for c in text], dtype=np.uint16)
    n = int(0.9 * len(tokens))
    splits = {'train': tokens[:n], 'val': tokens[n:]}
    write_splits(data_dir, splits, dict(dataset='shakespeare_char', kind='text', encoding='chars', vocab_size=len(chars),
                                        itos=chars, source=os.path.realpath(source) if source else URL))
    print(f"{len(text):,} characters, vocab {len(chars)}: train {n:,} tokens, val {len(tokens) - n:,} -> {data_dir}")


def write_splits(data_dir, splits, meta):
    """train.bin and val.bin (uint16 tokens) and meta.json (with each split's token count), through write_prepared:
    each atomically, meta.json last, since its presence marks the folder done. A split with no token is a ValueError
    naming the source, before anything is written."""
    if not all(len(ids) for ids in splits.values()):
        counts = ' and '.join(f"{len(ids)} {split}" for split, ids in splits.items())
        raise ValueError(f"{meta['source']} is too short: it makes {counts} tokens, and each split needs some; give "
                         f"--source=PATH of a longer text")
    write_prepared(data_dir, {f'{split}.bin': array_file(np.asarray(ids, dtype=np.uint16), npy=False)
                              for split, ids in splits.items()},
                   {**meta, 'tokens': {split: len(ids) for split, ids in splits.items()}})


def main(prepare, default_dir, doc):
    """The command line of a tiny-shakespeare preparation: --source, --data_dir; a bad source is one error line."""
    parser = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    parser.add_argument('--source', type=os.path.expanduser, default=None,
                        help="local input.txt instead of the download")
    parser.add_argument('--data_dir', type=os.path.expanduser, default=default_dir)
    args = parser.parse_args()
    with script_errors():  # bad --source, no network, Ctrl-C: one line, not a traceback
        prepare(args.data_dir, args.source)


if __name__ == '__main__':
    main(prepare, DEFAULT_DIR, __doc__)
