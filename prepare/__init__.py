"""
Every dataset train.py knows, in one table: name -> (module in prepare/, kind of data, the prepare()
arguments a run's config implies). Kinds: 'text' is a uint16 token stream (train.bin, val.bin);
'examples' are fixed (x, y) pairs ({split}_x.npy, {split}_y.npy). Each module's prepare(data_dir,
source=None, ...) is idempotent: it returns at once when data_dir already holds what was asked.
"""
import importlib


def _recall_args(cfg):
    return dict(num_keys=cfg['recall_keys'], num_pairs=cfg['recall_pairs'], seq_len=cfg['block_size'])


DATASETS = {
    'shakespeare_char': ('shakespeare_char', 'text', None),
    'recall': ('recall', 'examples', _recall_args),
}


def check_dataset_name(name):
    if name not in DATASETS:
        raise ValueError(f"unknown dataset '{name}'; valid: {', '.join(sorted(DATASETS))}")


def dataset_kind(name):
    check_dataset_name(name)
    return DATASETS[name][1]


def prepare_dataset(name, data_dir, source, config):
    """Prepare dataset `name` into data_dir (download, or read `source`) unless it is already there."""
    check_dataset_name(name)
    module, _, args = DATASETS[name]
    importlib.import_module(f'prepare.{module}').prepare(data_dir, source=source or None, **(args(config) if args else {}))
