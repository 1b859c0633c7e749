"""
Passkey retrieval (as in the long-context literature, e.g. Mohtashami & Jaggi 2023), generated in code.

A number of `digits` digits is hidden at a random depth in random filler, announced by a KEY token; the sequence
ends with QUERY and the number again. Loss and accuracy count only the answer digits (other targets are -1).
Filler is tokens 0..F-1, digits F..F+9, then KEY and QUERY. With F = 16, 4 digits, length 24:

    f3 f9 KEY 7 0 2 5 f1 f12 f0 f8 f3 f3 f15 f2 f7 f9 f4 f11 f6 QUERY 7 0 2 5    (targets: the last 4 digits)

Trained at one length (seq_len = block_size), tested at 2-8x that length by extrapolate.py --passkey=True:
the answer is wherever the KEY was, however far back, which local windows can only reach through depth.

$ python prepare/passkey.py [--seq_len=64 --digits=4 --data_dir=data/passkey]
"""
import argparse
import json
import os

import numpy as np

DEFAULT_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'data', 'passkey')
FILLER = 16


def vocab_size():
    return FILLER + 10 + 2  # filler, digits, KEY, QUERY


def make_examples(n, seq_len, digits, seed):
    """Return inputs x (n, seq_len) and targets y (n, seq_len), -1 except at the answer digits."""
    if seq_len < 2 * digits + 3:
        raise ValueError(f"passkey needs seq_len >= 2*digits + 3 = {2 * digits + 3}, got {seq_len}")
    KEY, QUERY = FILLER + 10, FILLER + 11
    rng = np.random.default_rng(seed)
    seq = rng.integers(0, FILLER, size=(n, seq_len + 1))                   # filler everywhere
    key = FILLER + rng.integers(0, 10, size=(n, digits))                  # the passkey's digit tokens
    depth = rng.integers(0, seq_len + 1 - 2 * (digits + 1) + 1, size=n)   # where KEY goes, before the question
    rows, cols = np.arange(n)[:, None], depth[:, None] + np.arange(digits + 1)
    seq[rows, cols] = np.concatenate([np.full((n, 1), KEY), key], 1)
    seq[:, -(digits + 1):] = np.concatenate([np.full((n, 1), QUERY), key], 1)
    x, y = seq[:, :-1], seq[:, 1:].copy()
    y[:, :-digits] = -1                                                   # only the answer digits are asked
    return x.astype(np.int16), y.astype(np.int16)


def prepare(data_dir=DEFAULT_DIR, source=None, seq_len=64, digits=4, num_train=100_000, num_val=2_000, seed=0):
    """Write {train,val}_{x,y}.npy and meta.json; return at once if data_dir holds this exact task already."""
    if source:
        raise ValueError("the passkey task is generated in code; it takes no --source")
    task = dict(seq_len=seq_len, digits=digits, num_train=num_train, num_val=num_val, seed=seed)
    meta_path = os.path.join(data_dir, 'meta.json')
    if os.path.exists(meta_path) and json.load(open(meta_path)).get('task') == task:
        return
    os.makedirs(data_dir, exist_ok=True)
    for split, n, split_seed in (('train', num_train, seed), ('val', num_val, seed + 1)):
        for name, arr in zip('xy', make_examples(n, seq_len, digits, split_seed)):
            np.save(os.path.join(data_dir, f'{split}_{name}.tmp.npy'), arr)
            os.replace(os.path.join(data_dir, f'{split}_{name}.tmp.npy'), os.path.join(data_dir, f'{split}_{name}.npy'))
    meta = dict(dataset='passkey', kind='examples', encoding='tokens', vocab_size=vocab_size(), task=task)
    with open(meta_path + '.tmp', 'w') as f:
        json.dump(meta, f)
    os.replace(meta_path + '.tmp', meta_path)


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description="passkey retrieval")
    for key, default in (('seq_len', 64), ('digits', 4), ('num_train', 100_000), ('num_val', 2_000), ('seed', 0)):
        parser.add_argument(f'--{key}', type=int, default=default)
    parser.add_argument('--data_dir', default=DEFAULT_DIR)
    args = vars(parser.parse_args())
    prepare(args.pop('data_dir'), **args)
    print(f"passkey task {args} -> ok")
