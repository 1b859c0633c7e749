"""
CIFAR-10 / CIFAR-100 / MNIST -> uint8 arrays for the image batcher (ViT) and the pixel model's sequences in data.py.
Writes to data_dir: train_x.npy (N, side, side, channels) uint8 (CIFAR 32x32x3, MNIST 28x28x1), train_y.npy (N,)
int64, val_x.npy, val_y.npy (val = the official test split) and meta.json. Source: the Hugging Face Hub
(uoft-cs/cifar10, uoft-cs/cifar100, ylecun/mnist) or a local folder with train.parquet and test.parquet in the same
schema (columns img + label, or img + fine_label/coarse_label; MNIST: image + label).
    python prepare/cifar.py --dataset=cifar100 --source=/path/to/parquet_dir
    python prepare/cifar.py --dataset=mnist --source=/path/to/parquet_dir
"""
import argparse
import io
import os
import sys
from pathlib import Path

import numpy as np
from PIL import Image
from tqdm import tqdm

if __name__ == '__main__':  # run as a script: make the `prepare` package importable from the repo root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from prepare.folder import array_file, read_meta, stop_if_disk_full, write_prepared
from prepare.script import script_errors
from prepare.sources import check_source, hub_or_cache, local_copy

DATASETS = {'cifar10': 'uoft-cs/cifar10', 'cifar100': 'uoft-cs/cifar100', 'mnist': 'ylecun/mnist'}  # name -> Hub id
IMAGES = {'cifar10': ('img', 32, 'RGB'), 'cifar100': ('img', 32, 'RGB'),  # name -> image column, side, PIL mode
          'mnist': ('image', 28, 'L')}
NUM_CLASSES = {'label': 10, 'fine_label': 100, 'coarse_label': 20}  # used when the parquet carries no class names
SPLITS = {'train': 'train', 'val': 'test'}  # our name -> split name in the source

def expected_format(dataset, label_col):
    column, side, _ = IMAGES[dataset]
    return (f"a folder with train.parquet and test.parquet in the {DATASETS[dataset]} schema: "
            f"column '{column}' (image bytes, {side}x{side}) and column '{label_col}' (int class index)")

def load(dataset, source, label_col):
    """read_source; a full disk under the datasets cache (where the source is first converted) is one line."""
    import datasets  # here, not at the top: train.py calls prepare() on every start, and this import takes a second
    try:
        return read_source(dataset, source, label_col)
    except Exception as e:
        stop_if_disk_full(e, datasets.config.HF_DATASETS_CACHE, "nothing is written to the data folder yet")
        raise

def read_source(dataset, source, label_col):
    import datasets
    # both paths end in the same DatasetDict with splits 'train' and 'test', so everything after is shared
    if source is None:
        with hub_or_cache() as unreachable:
            try:
                return datasets.load_dataset(DATASETS[dataset])
            except OSError as e:  # ConnectionError and the Hub's not-found errors are OSErrors
                why = f"{unreachable}, and the datasets cache holds no copy" if unreachable else e
                raise RuntimeError(f"could not load {dataset} from the Hugging Face Hub ({why}). Offline? Pass "
                                   f"{local_copy('DIR')}, {expected_format(dataset, label_col)}") from e
    files = {split: Path(source) / f'{split}.parquet' for split in SPLITS.values()}
    missing = [str(f) for f in files.values() if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"missing {', '.join(missing)}; --source must be {expected_format(dataset, label_col)}")
    return datasets.load_dataset('parquet', data_files={split: str(f) for split, f in files.items()})

def decode(split, label_col, desc, column='img', side=32, mode='RGB'):
    import datasets
    split = split.cast_column(column, datasets.Image(decode=False))  # decode ourselves: faster, and we check sizes
    x = np.empty((len(split), side, side, len(mode)), dtype=np.uint8)  # 'RGB': 3 channels, 'L' (grey): 1
    images = (img for batch in split.iter(batch_size=1000) for img in batch[column])  # streams, never all in memory
    for i, img in enumerate(tqdm(images, total=len(split), desc=desc)):
        im = Image.open(io.BytesIO(img['bytes']) if img['bytes'] else img['path']).convert(mode)
        if im.size != (side, side):
            raise ValueError(f'{desc}: image {i} is {im.size[0]}x{im.size[1]}, expected {side}x{side}')
        x[i] = np.asarray(im).reshape(side, side, len(mode))
    return x, np.asarray(split[label_col], dtype=np.int64)

def prepare(data_dir=None, dataset='cifar10', source=None, label='fine'):
    # check everything cheap first, so a bad call fails before any decoding or writing; returns at once (the
    # meta) when data_dir already holds this dataset
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; known: {', '.join(DATASETS)}")
    if label not in ('fine', 'coarse') or (dataset != 'cifar100' and label != 'fine'):
        raise ValueError(f"label={label!r}: 'fine' or 'coarse' for cifar100, 'fine' for {dataset}")
    label_col = 'label' if dataset != 'cifar100' else f'{label}_label'
    data_dir = Path(data_dir) if data_dir else Path(__file__).resolve().parents[1] / 'data' / dataset
    check_source(data_dir, source, 'source')  # a folder prepared from another copy: said, not ignored
    if (meta := read_meta(data_dir)) is not None:  # written last, so the arrays are complete: nothing to do
        if (meta.get('dataset'), meta.get('label')) != (dataset, label_col):
            raise ValueError(f"{data_dir} already holds {meta.get('dataset')} ({meta.get('label')}), not {dataset} "
                             f"({label_col}); pass another data_dir, or delete that one to prepare it again")
        return meta
    import datasets
    ds = load(dataset, source, label_col)
    for split in SPLITS.values():
        if missing := {IMAGES[dataset][0], label_col} - set(ds[split].column_names):
            raise ValueError(f"{split} split has no column(s) {sorted(missing)} (has {ds[split].column_names}); "
                             f"expected {expected_format(dataset, label_col)}")
    feature = ds['train'].features[label_col]
    classes = list(feature.names) if isinstance(feature, datasets.ClassLabel) else []
    num_classes = len(classes) or NUM_CLASSES[label_col]
    arrays, counts = {}, {}
    for name, split in SPLITS.items():
        x, y = decode(ds[split], label_col, f'{dataset} {split}', *IMAGES[dataset])
        if len(y) and (y.min() < 0 or y.max() >= num_classes):
            raise ValueError(f'{split} labels span [{y.min()}, {y.max()}], expected [0, {num_classes})')
        arrays[f'{name}_x'], arrays[f'{name}_y'], counts[name] = x, y, len(y)
    meta = {'kind': 'image', 'dataset': dataset, 'num_classes': num_classes, 'classes': classes, 'counts': counts,
            'source': os.path.realpath(source) if source else DATASETS[dataset], 'label': label_col}
    # each array atomically, meta.json last: it appears only when all arrays are there
    write_prepared(data_dir, {f'{name}.npy': array_file(arr) for name, arr in arrays.items()}, meta)
    return meta

if __name__ == '__main__':
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--dataset', default='cifar10', choices=sorted(DATASETS))
    parser.add_argument('--source', type=os.path.expanduser, default=None,
                        help='local folder with train.parquet and test.parquet')
    parser.add_argument('--data_dir', type=os.path.expanduser, default=None,
                        help='output folder (default: data/<dataset> in the repo)')
    parser.add_argument('--label', default='fine', choices=['fine', 'coarse'], help='CIFAR-100 label set')
    args = parser.parse_args()
    with script_errors():  # bad --source, no network, Ctrl-C: one line, not a traceback
        meta = prepare(args.data_dir, args.dataset, args.source, args.label)
    print(f"{meta['dataset']}: {meta['counts']} images, {meta['num_classes']} classes, from {meta['source']}")
