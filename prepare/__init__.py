"""
Every dataset train.py knows, in one table: name -> (module in prepare/, kind of data, the prepare()
arguments a run's config implies). Kinds: 'text' is a uint16 token stream (train.bin, val.bin);
'examples' are fixed (x, y) pairs ({split}_x.npy, {split}_y.npy); 'image' are uint8 images and labels
stored the same way. Each module's prepare(data_dir,
source=None, ...) is idempotent: it returns at once when data_dir already holds what was asked.
"""
import importlib


def _token_budget(cfg):
    """What a run consumes: every training token it reads at most once, plus the 1% validation hold-out."""
    tokens = (cfg['max_iters'] + 1) * cfg['gradient_accumulation_steps'] * cfg['batch_size'] * cfg['block_size']
    return dict(max_tokens=int(tokens / 0.99) + 1)


def _recall_args(cfg):
    return dict(num_keys=cfg['recall_keys'], num_pairs=cfg['recall_pairs'], seq_len=cfg['block_size'])


DATASETS = {
    'shakespeare_char': ('shakespeare_char', 'text', None),
    'recall': ('recall', 'examples', _recall_args),
    'openwebtext': ('openwebtext', 'text', _token_budget),
    'fineweb_edu': ('fineweb_edu', 'text', _token_budget),
    'cifar10': ('cifar', 'image', lambda cfg: dict(dataset='cifar10')),
    'cifar100': ('cifar', 'image', lambda cfg: dict(dataset='cifar100')),
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
