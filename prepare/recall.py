"""
Multi-query associative recall (MQAR, as in the Zoology benchmark), generated in code.

A sequence lists P key-value pairs, then asks for keys again; after each query key the model must
produce that key's value. Loss and accuracy count only those answer tokens (other targets are -1).
Keys are tokens 0..K-1, values K..2K-1. With 4 pairs of 16 keys and length 32:

    k3 v7 k9 v2 k0 v5 k12 v0 | k9 v2 k3 v7 k9 v2 ...      (targets: v2 after k9, v7 after k3, ...)

Solving it needs in-context lookup (an induction head): the answer is wherever the key last appeared,
which is what attention rules differ on (a window shorter than the context cannot see the pairs).

$ python prepare/recall.py [--num_keys=16 --num_pairs=4 --seq_len=32 --data_dir=data/recall]
"""
import os
import sys

import numpy as np

if __name__ == '__main__':  # run as a script: make the `prepare` package importable from the repo root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from prepare.examples import main, write_examples

DEFAULT_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'data', 'recall')


def make_examples(n, num_keys, num_pairs, seq_len, seed):
    """Return inputs x (n, seq_len) and targets y (n, seq_len), -1 where nothing is asked."""
    rng = np.random.default_rng(seed)
    keys = rng.permuted(np.tile(np.arange(num_keys), (n, 1)), axis=1)[:, :num_pairs]  # distinct keys per sequence
    values = rng.integers(num_keys, 2 * num_keys, size=(n, num_pairs))
    pairs = np.stack((keys, values), axis=2).reshape(n, -1)                          # k v k v ...
    region = seq_len + 1 - 2 * num_pairs                                             # query-answer tokens
    asked = rng.integers(0, num_pairs, size=(n, (region + 1) // 2))                  # which pair each query asks
    answers = np.stack((np.take_along_axis(keys, asked, 1), np.take_along_axis(values, asked, 1)), axis=2)
    seq = np.concatenate((pairs, answers.reshape(n, -1)[:, :region]), axis=1)         # (n, seq_len + 1)
    x, y = seq[:, :-1], seq[:, 1:].copy()
    is_query = (np.arange(seq_len) >= 2 * num_pairs) & (np.arange(seq_len) % 2 == 0)  # x holds a query key
    y[:, ~is_query] = -1
    return x.astype(np.int16), y.astype(np.int16)


def check_task(task):
    """ValueError naming the first of the task's settings out of range (as prepare's --key), before anything is
    written."""
    for key in ('num_keys', 'num_pairs', 'seq_len', 'num_train', 'num_val'):
        if task[key] < 1:
            raise ValueError(f"{key}={task[key]} must be at least 1; pass --{key}=1 or more")
    if task['seed'] < 0:
        raise ValueError(f"seed={task['seed']} must not be negative; pass --seed=0 or more")
    if task['num_pairs'] > task['num_keys'] or 2 * task['num_pairs'] >= task['seq_len']:
        raise ValueError(f"num_pairs={task['num_pairs']} must be at most num_keys={task['num_keys']} and below "
                         f"seq_len/2={task['seq_len'] / 2:g} (the pairs, then queries); pass a smaller --num_pairs or "
                         f"a larger --num_keys or --seq_len")


def check_train_settings(c):
    """ValueError naming the first of train.py's recall keys (c: its settings) that the task cannot hold."""
    pairs, keys, block_size = c['recall_pairs'], c['recall_keys'], c['block_size']
    if 2 * keys > 2 ** 15:  # its tokens (keys, then values) are stored as int16
        raise ValueError(f"recall_keys={keys} makes {2 * keys} tokens, more than the 32768 the task's int16 files "
                         f"hold; pass --recall_keys=16384 or fewer")
    if pairs > keys or 2 * pairs >= block_size:
        raise ValueError(f"recall_pairs={pairs} must be at most recall_keys={keys} and below block_size/2="
                         f"{block_size / 2:g} (the pairs, then queries); pass a smaller --recall_pairs or a larger "
                         f"--recall_keys or --block_size")


def prepare(data_dir=DEFAULT_DIR, source=None, num_keys=16, num_pairs=4, seq_len=32,
            num_train=100_000, num_val=2_000, seed=0):
    """Write {train,val}_{x,y}.npy and meta.json; return at once if data_dir holds this exact task already."""
    if source:
        raise ValueError("the recall task is generated in code; it takes no --source")
    task = dict(num_keys=num_keys, num_pairs=num_pairs, seq_len=seq_len, num_train=num_train, num_val=num_val,
                seed=seed)
    check_task(task)
    write_examples('recall', data_dir, task, lambda n, seed: make_examples(n, num_keys, num_pairs, seq_len, seed),
                   2 * num_keys)


if __name__ == '__main__':
    main('recall', "multi-query associative recall", prepare, DEFAULT_DIR, num_keys=16, num_pairs=4, seq_len=32,
         num_train=100_000, num_val=2_000, seed=0)
