"""
Passkey retrieval (as in the long-context literature, e.g. Mohtashami & Jaggi 2023), generated in code.

A number of `digits` digits is hidden at a random depth in random filler, announced by a KEY token; the sequence
ends with QUERY and the number again. Loss and accuracy count only the answer digits (other targets are -1).
Filler is tokens 0..F-1, digits F..F+9, then KEY and QUERY. With F = 16, 4 digits, length 24:

    f3 f9 KEY 7 0 2 5 f1 f12 f0 f8 f3 f3 f15 f2 f7 f9 f4 f11 f6 QUERY 7 0 2 5    (targets: the last 4 digits)

Several needles (needles='1,2,4': each sequence draws its count from the list): each passkey behind its own KEY at
random depths that do not overlap, and the question asks for all of them together, in the order they were hidden
(QUERY, then every digit of the first, of the second, ...); a sequence with 1 needle is the task above, unchanged.

Trained at one length (seq_len = block_size), tested at 2-8x that length by studies/extrapolate.py: the answer is
wherever the KEY was, however far back, which local windows can only reach through depth.

$ python prepare/passkey.py [--seq_len=64 --digits=4 --needles=1 --data_dir=data/passkey]
"""
import os
import sys

import numpy as np

if __name__ == '__main__':  # run as a script: make the `prepare` package importable from the repo root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from prepare.examples import main, write_examples

DEFAULT_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'data', 'passkey')
FILLER = 16
DIGITS = 4  # digits of a passkey (what train.py's passkey runs use)


def vocab_size():
    return FILLER + 10 + 2  # filler, digits, KEY, QUERY


def shortest(digits, needles):
    """The shortest sequence that holds `needles` passkeys of `digits` digits, the question and its answer."""
    return needles * (2 * digits + 1) + 2


def parse_needles(needles, key='passkey_needles'):
    """'1,2,4' -> [1, 2, 4]; ValueError naming the setting `key` unless whole numbers >= 1."""
    try:
        counts = [int(c) for c in str(needles).split(',')]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise ValueError(f"{key}={needles!r} must be comma-separated whole numbers >= 1; pass e.g. --{key}=1,2,4")
    return counts


def make_examples(n, seq_len, digits, seed, needles=1):
    """Return inputs x (n, seq_len) and targets y (n, seq_len), -1 except at the answer digits. needles: the count
    of passkeys per sequence, or a list to draw each sequence's count from."""
    counts = parse_needles(needles)
    if seq_len < shortest(digits, max(counts)):
        raise ValueError(f"passkey needs seq_len >= {shortest(digits, max(counts))} for {max(counts)} passkey(s) of "
                         f"{digits} digits, got {seq_len}")
    if counts != [1]:
        return make_needles(n, seq_len, digits, seed, counts)
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


def make_needles(n, seq_len, digits, seed, counts):
    """make_examples with counts[r] passkeys in a sequence r, each behind its KEY at a random depth, none
    overlapping, asked for together at the end in the order they were hidden."""
    KEY, QUERY = FILLER + 10, FILLER + 11
    rng = np.random.default_rng(seed)
    x, y = np.empty((n, seq_len), np.int16), np.full((n, seq_len), -1, np.int16)
    for r in range(n):
        k = counts[rng.integers(len(counts))]
        seq = rng.integers(0, FILLER, size=seq_len + 1)
        keys = FILLER + rng.integers(0, 10, size=(k, digits))
        room = seq_len + 1 - (k * digits + 1) - k * (digits + 1)  # free filler once every needle and the question fit
        starts = np.sort(rng.integers(0, room + 1, size=k)).tolist()  # in order, apart: the i-th after i needles
        for i, start in enumerate(starts):  # scalars and slices, no list of a row's tokens: 100,000 rows in seconds
            at = start + i * (digits + 1)
            seq[at], seq[at + 1:at + digits + 1] = KEY, keys[i]
        seq[-(k * digits + 1)], seq[-k * digits:] = QUERY, keys.ravel()
        x[r], y[r, -k * digits:] = seq[:-1], seq[-k * digits:]
    return x, y


# The same test in English, for a language model with GPT-2's tokens (the form TDA's paper scores at 4,000 tokens,
# after Mohtashami & Jaggi 2023): passkeys of TEXT_DIGITS digits hidden between repeated filler sentences.
TEXT_FILLER = ('The grass is green.', 'The sky is blue.', 'The sun is yellow.', 'Here we go.', 'There and back again.')
TEXT_DIGITS = 5


def make_text_examples(encode, n, seq_len, seed, needles=1, digits=TEXT_DIGITS):
    """make_examples in words: `encode` (text -> token ids) the model's tokenizer. Each passkey is the sentence
    'The pass key is 71432. Remember it. 71432 is the pass key.' between two filler sentences at a random depth, in
    order; the sequence ends 'What is the pass key? The pass key is 71432' ('What are the pass keys, in order? The
    pass keys are 71432, 03918'), the filler's start cut to make it seq_len + 1 tokens. Targets: the answer's tokens."""
    counts, rng = parse_needles(needles), np.random.default_rng(seed)
    filler = [encode(' ' + sentence) for sentence in TEXT_FILLER]
    x, y = np.empty((n, seq_len), np.int64), np.full((n, seq_len), -1, np.int64)
    for r in range(n):
        keys = [''.join(map(str, rng.integers(0, 10, size=digits))) for _ in range(counts[rng.integers(len(counts))])]
        hidden = [encode(f' The pass key is {key}. Remember it. {key} is the pass key.') for key in keys]
        question = encode(' What is the pass key? The pass key is' if len(keys) == 1 else
                          ' What are the pass keys, in order? The pass keys are')
        answer = encode(' ' + ', '.join(keys))
        room = seq_len + 1 - len(question) - len(answer) - sum(map(len, hidden))  # filler tokens left
        if room < 0:
            raise ValueError(f"{len(keys)} passkey(s) in words need seq_len >= {seq_len - room}, got {seq_len}")
        sentences = [filler[i % len(filler)] for i in range(room // min(map(len, filler)) + 1)]
        cut = sum(map(len, sentences)) - room  # the filler starts mid-sentence, so the question follows a whole one
        stream = [t for sentence in sentences for t in sentence][cut:]
        ends = np.cumsum([len(t) for t in sentences]) - cut
        depths = np.sort(rng.choice(ends[ends >= 0], size=len(keys)))  # after whole sentences
        seq, last = [], 0
        for depth, needle in zip(depths, hidden):
            seq += stream[last:depth] + needle
            last = depth
        seq += stream[last:] + question + answer
        x[r], y[r, -len(answer):] = seq[:-1], answer
    return x, y


def check_task(task, needles):
    """ValueError naming the first of the task's settings out of range (as prepare's --key), before anything is
    written."""
    for key in ('digits', 'num_train', 'num_val'):
        if task[key] < 1:
            raise ValueError(f"{key}={task[key]} must be at least 1; pass --{key}=1 or more")
    if task['seed'] < 0:
        raise ValueError(f"seed={task['seed']} must not be negative; pass --seed=0 or more")
    most = max(parse_needles(needles, 'needles'))
    if task['seq_len'] < shortest(task['digits'], most):
        raise ValueError(f"seq_len={task['seq_len']} cannot hold {most} passkey(s) of {task['digits']} digits and the "
                         f"question; pass --seq_len={shortest(task['digits'], most)} or more, or fewer --needles")


def check_train_settings(c):
    """ValueError where train.py's block_size (c: its settings) cannot hold passkey_needles' most passkeys: trained
    short, tested long (studies/extrapolate.py)."""
    most = max(parse_needles(c['passkey_needles']))
    if c['block_size'] < shortest(DIGITS, most):
        raise ValueError(f"block_size={c['block_size']} cannot hold {most} passkeys and the question; pass "
                         f"--block_size={shortest(DIGITS, most)} or more, or fewer --passkey_needles")


def prepare(data_dir=DEFAULT_DIR, source=None, seq_len=64, digits=DIGITS, num_train=100_000, num_val=2_000,
            seed=0, needles='1'):
    """Write {train,val}_{x,y}.npy and meta.json; return at once if data_dir holds this exact task already."""
    if source:
        raise ValueError("the passkey task is generated in code; it takes no --source")
    task = dict(seq_len=seq_len, digits=digits, num_train=num_train, num_val=num_val, seed=seed)
    check_task(task, needles)
    if str(needles) != '1':  # a single needle's folders, from before needles existed, stay valid
        task['needles'] = str(needles)
    write_examples('passkey', data_dir, task, lambda n, seed: make_examples(n, seq_len, digits, seed, needles),
                   vocab_size())


if __name__ == '__main__':
    main('passkey', "passkey retrieval", prepare, DEFAULT_DIR, seq_len=64, digits=4, num_train=100_000, num_val=2_000,
         seed=0, needles='1')
