"""
Every dataset train.py knows, in one table: name -> (module in prepare/, kind of data, the prepare() arguments a
run's config implies). Kinds: 'text' is a uint16 token stream (train.bin, val.bin); 'examples' are fixed (x, y)
pairs ({split}_x.npy, {split}_y.npy); 'image' are uint8 images and labels stored the same way; 'pixels' read an
image dataset's files (PIXELS_OF: no copy of their own) as sequences of subpixels, one token each (data.py). Each
module's prepare(data_dir, source=None, ...) is idempotent: it returns at once when data_dir already holds what was
asked. Below the table: a dataset prepared by name, and a folder checked to hold the dataset it is named for.
"""
import importlib
import os
import re
from pathlib import Path

import numpy as np

from prepare.folder import alone, read_meta, redo
from prepare.sources import check_source

ROOT = Path(__file__).resolve().parents[1]  # the repository, which holds data/ and the scripts


def val_tokens_needed(cfg):
    """The val split a text run can evaluate on: block_size + 1 tokens for one window, and enough that each of an
    evaluation's eval_iters x batch_size rows can start at its own offset, so its batches differ."""
    return cfg['block_size'] + max(1, cfg['eval_iters'] * cfg['batch_size'])


def _token_budget(cfg):
    """What a run consumes: every training token it reads at most once, the 1% validation hold-out, and a val
    split it can evaluate on (the first documents go to val until it holds that many tokens); and a train split of
    one window at least, however small the budget (the first document, gone to val, may exceed it)."""
    tokens = (cfg['max_iters'] + 1) * cfg['gradient_accumulation_steps'] * cfg['batch_size'] * cfg['block_size']
    val = val_tokens_needed(cfg)
    return dict(max_tokens=int(tokens / 0.99) + 1 + val, min_val_tokens=val, min_train_tokens=cfg['block_size'] + 1)


def _recall_args(cfg):
    return dict(num_keys=cfg['recall_keys'], num_pairs=cfg['recall_pairs'], seq_len=cfg['block_size'])


DATASETS = {
    'shakespeare_char': ('shakespeare_char', 'text', None),
    'shakespeare': ('shakespeare', 'text', None),  # GPT-2 BPE: for fine-tuning GPT-2
    'recall': ('recall', 'examples', _recall_args),
    'passkey': ('passkey', 'examples', lambda cfg: dict(seq_len=cfg['block_size'], needles=cfg['passkey_needles'])),
    'openwebtext': ('openwebtext', 'text', _token_budget),
    'fineweb_edu': ('fineweb_edu', 'text', _token_budget),
    'cifar10': ('cifar', 'image', lambda cfg: dict(dataset='cifar10')),
    'cifar100': ('cifar', 'image', lambda cfg: dict(dataset='cifar100')),
    'cifar10_pixels': ('cifar', 'pixels', lambda cfg: dict(dataset='cifar10')),  # for the pixel model
    'mnist_pixels': ('cifar', 'pixels', lambda cfg: dict(dataset='mnist')),
}
PIXELS_OF = {'cifar10_pixels': 'cifar10', 'mnist_pixels': 'mnist'}  # pixel dataset -> the image dataset it reads


def stored_as(name):
    """The dataset whose folder (data/<it>) and meta.json hold `name`'s files: an image dataset for its pixels."""
    return PIXELS_OF.get(name, name)


def default_data_dir(name):
    """Where `name` is prepared unless data_dir says otherwise: data/<stored_as(name)> at the repo root."""
    return os.path.join(ROOT, 'data', stored_as(name))


def check_dataset_name(name):
    if name not in DATASETS:
        raise ValueError(f"unknown dataset '{name}'; valid: {', '.join(sorted(DATASETS))}")


def dataset_kind(name):
    check_dataset_name(name)
    return DATASETS[name][1]


def prepare_dataset(name, data_dir, source, config, **extra):
    """Prepare dataset `name` into data_dir (download, or read `source`) unless it is already there. extra: passed
    on to the module's prepare (chars=: a character dataset encoded with a base model's characters)."""
    check_dataset_name(name)
    check_source(data_dir, source, 'data_source')
    module, _, args = DATASETS[name]
    try:
        with alone(data_dir):
            importlib.import_module(f'prepare.{module}').prepare(data_dir, source=source or None,
                                                                 **(args(config) if args else {}), **extra)
    except (OSError, ValueError) as e:  # the modules name their scripts' flag; train.py's is data_source
        said = re.sub(r'(?<!\.py )--source=', '--data_source=', str(e))  # a script's own command line kept
        if said != str(e):
            raise type(e)(said) from None
        raise


def recorded_dataset(meta, name):
    """The dataset a meta.json describes: its `dataset` field, or for a folder prepared before that field existed,
    what its kind and encoding tell (GPT-2 BPE web text then passes for either web-text dataset)."""
    if 'dataset' in meta:
        return meta['dataset']
    if meta.get('kind') == 'examples':
        return 'recall'
    if meta.get('encoding') == 'chars':
        return 'shakespeare_char'
    return name if meta.get('encoding') == 'gpt2' and DATASETS[name][2] is _token_budget else meta.get('kind')


def check_dataset_dir(name, data_dir):
    """Before preparing: data_dir's meta (None if there is none); ValueError if it is damaged or holds another
    dataset than `name`."""
    meta, name = read_meta(data_dir), stored_as(name)
    if meta is not None and (theirs := recorded_dataset(meta, name)) != name:
        raise ValueError(f"{data_dir} holds the dataset {theirs!r}, not {name!r}: pass --data_dir=ANOTHER_FOLDER "
                         f"for {name} (or delete {data_dir} to prepare {name} there)")
    return meta


def check_files(name, data_dir):
    """After preparing: (meta, {split: rows}) where rows are tokens (text) or examples; ValueError naming the file
    when one is missing or its size disagrees with meta.json."""
    meta = check_dataset_dir(name, data_dir)
    if meta is None:
        raise ValueError(f"{data_dir} has no meta.json: {redo(data_dir)}")
    rows = _text_tokens if DATASETS[name][1] == 'text' else _example_rows
    return meta, {split: rows(data_dir, split, meta) for split in ('train', 'val')}


def _text_tokens(data_dir, split, meta):
    path = os.path.join(data_dir, f'{split}.bin')
    if not os.path.exists(path):
        raise ValueError(f"{path} is missing: the folder is damaged; {redo(data_dir)}")
    size, expected = os.path.getsize(path), meta.get('tokens', {}).get(split)
    if size % 2 or (expected is not None and size != 2 * expected):
        want = f"the {2 * expected:,} bytes of the {expected:,} tokens meta.json records" if expected is not None \
            else "a whole number of 2-byte tokens"
        raise ValueError(f"{path} holds {size:,} bytes, not {want}: the file is damaged; {redo(data_dir)}")
    return size // 2


def _example_rows(data_dir, split, meta):
    rows = []
    for part in 'xy':
        path = os.path.join(data_dir, f'{split}_{part}.npy')
        try:
            rows.append(len(np.load(path, mmap_mode='r')))
        except (OSError, ValueError) as e:  # missing, truncated, or not an array
            raise ValueError(f"{path} cannot be read ({type(e).__name__}: {str(e).splitlines()[0][:120]}): "
                             f"the folder is damaged; {redo(data_dir)}")
    if rows[0] != rows[1]:
        raise ValueError(f"{data_dir}: {split}_x.npy has {rows[0]:,} rows but {split}_y.npy {rows[1]:,}: "
                         f"the folder is damaged; {redo(data_dir)}")
    return rows[0]
