"""CIFAR preparation (prepare/cifar.py) and image augmentation (support/data.py). Offline, a few seconds on a CPU."""
import json

import datasets
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from conftest import SHARED, needs_shared, run_forked
from support import data as A
from prepare import cifar
from vit import soft_cross_entropy

CIFAR10_NAMES = ['airplane', 'automobile', 'bird', 'cat', 'deer', 'dog', 'frog', 'horse', 'ship', 'truck']

@pytest.fixture(autouse=True)
def hf_cache(tmp_path, monkeypatch):
    # keep the datasets library's arrow cache inside the test's tmp dir
    monkeypatch.setattr(datasets.config, 'HF_DATASETS_CACHE', str(tmp_path / 'hf_cache'))

def make_images(n, seed):
    return np.random.default_rng(seed).integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)

def write_parquet(path, images, columns, features=None):
    # images stored as PNG (lossless) through the datasets Image feature, the same schema as the Hub parquet
    data = {'img': [Image.fromarray(im) for im in images], **columns}
    features = features or datasets.Features({'img': datasets.Image(), **{k: datasets.Value('int64') for k in columns}})
    datasets.Dataset.from_dict(data, features=features).to_parquet(str(path))

def cifar10_source(folder, n_train=5, n_test=3):
    folder.mkdir()
    features = datasets.Features({'img': datasets.Image(), 'label': datasets.ClassLabel(names=CIFAR10_NAMES)})
    train_x, test_x = make_images(n_train, 0), make_images(n_test, 1)
    train_y, test_y = [3, 0, 9, 3, 7][:n_train], [1, 9, 0][:n_test]
    write_parquet(folder / 'train.parquet', train_x, {'label': train_y}, features)
    write_parquet(folder / 'test.parquet', test_x, {'label': test_y}, features)
    return train_x, np.array(train_y), test_x, np.array(test_y)

def check_written(out, arrays):
    names = ['meta.json', 'train_x.npy', 'train_y.npy', 'val_x.npy', 'val_y.npy']
    assert sorted(p.name for p in out.iterdir()) == names  # no temporary files left behind
    for name, expected in arrays.items():
        got = np.load(out / f'{name}.npy')
        assert got.dtype == expected.dtype and np.array_equal(got, expected), name
    return json.loads((out / 'meta.json').read_text())

# ----------------------------------------------------------------------------- prepare

def test_prepare_tiny_parquet_exact(tmp_path):
    train_x, train_y, val_x, val_y = cifar10_source(tmp_path / 'src')
    meta = cifar.prepare(tmp_path / 'out', 'cifar10', source=tmp_path / 'src')
    written = check_written(tmp_path / 'out', {'train_x': train_x, 'train_y': train_y.astype(np.int64),
                                               'val_x': val_x, 'val_y': val_y.astype(np.int64)})
    assert written == meta
    assert meta == {'kind': 'image', 'dataset': 'cifar10', 'num_classes': 10, 'classes': CIFAR10_NAMES,
                    'counts': {'train': 5, 'val': 3}, 'source': str(tmp_path / 'src'), 'label': 'label'}

def test_prepare_as_script(tmp_path):
    train_x, train_y, val_x, val_y = cifar10_source(tmp_path / 'src')
    (rc, out), = run_forked({'argv': ['prepare/cifar.py', '--dataset=cifar10', f'--source={tmp_path / "src"}',
                                      f'--data_dir={tmp_path / "out"}'],
                             'env': {'HF_DATASETS_CACHE': str(tmp_path / 'hf_cache')}})
    assert rc == 0, out[-2000:]
    check_written(tmp_path / 'out', {'train_x': train_x, 'train_y': train_y, 'val_x': val_x, 'val_y': val_y})

def test_prepare_cifar100_fine_and_coarse(tmp_path):
    (tmp_path / 'src').mkdir()
    x = make_images(4, 2)
    columns = {'fine_label': [99, 0, 42, 7], 'coarse_label': [19, 4, 0, 3]}  # no ClassLabel: counts from the table
    write_parquet(tmp_path / 'src' / 'train.parquet', x, columns)
    write_parquet(tmp_path / 'src' / 'test.parquet', x[:2], {k: v[:2] for k, v in columns.items()})
    fine = cifar.prepare(tmp_path / 'fine', 'cifar100', source=tmp_path / 'src')
    coarse = cifar.prepare(tmp_path / 'coarse', 'cifar100', source=tmp_path / 'src', label='coarse')
    assert (fine['num_classes'], fine['classes'], coarse['num_classes']) == (100, [], 20)
    assert np.load(tmp_path / 'fine' / 'train_y.npy').tolist() == [99, 0, 42, 7]
    assert np.load(tmp_path / 'coarse' / 'train_y.npy').tolist() == [19, 4, 0, 3]
    assert np.array_equal(np.load(tmp_path / 'coarse' / 'val_x.npy'), x[:2])

@needs_shared
def test_prepare_cifar100_shared_test_split(tmp_path):
    # the shared sample has only test.parquet: without a train file it must fail clearly, with one it works
    (tmp_path / 'src').mkdir()
    (tmp_path / 'src' / 'test.parquet').symlink_to(SHARED / 'cifar100' / 'test.parquet')
    with pytest.raises(FileNotFoundError, match='train.parquet'):
        cifar.prepare(tmp_path / 'out', 'cifar100', source=tmp_path / 'src')
    assert not (tmp_path / 'out').exists()
    features = datasets.load_dataset('parquet', data_files=str(SHARED / 'cifar100' / 'test.parquet'))['train'].features
    columns = {'fine_label': [5, 6], 'coarse_label': [1, 2]}  # same schema as the real file, class names included
    write_parquet(tmp_path / 'src' / 'train.parquet', make_images(2, 3), columns, features)
    meta = cifar.prepare(tmp_path / 'out', 'cifar100', source=tmp_path / 'src')
    val_y = np.load(tmp_path / 'out' / 'val_y.npy')
    assert np.load(tmp_path / 'out' / 'val_x.npy').shape == (148, 32, 32, 3) and val_y.shape == (148,)
    assert meta['num_classes'] == 100 and meta['classes'][:2] == ['apple', 'aquarium_fish']
    assert meta['counts'] == {'train': 2, 'val': 148} and 0 <= val_y.min() and val_y.max() < 100

@needs_shared
def test_prepare_cifar10_shared_full(tmp_path):
    meta = cifar.prepare(tmp_path / 'out', 'cifar10', source=SHARED / 'cifar10')
    train_x, train_y = np.load(tmp_path / 'out' / 'train_x.npy'), np.load(tmp_path / 'out' / 'train_y.npy')
    val_x, val_y = np.load(tmp_path / 'out' / 'val_x.npy'), np.load(tmp_path / 'out' / 'val_y.npy')
    assert train_x.shape == (50000, 32, 32, 3) and val_x.shape == (10000, 32, 32, 3) and train_x.dtype == np.uint8
    assert train_y.dtype == np.int64 and val_y.shape == (10000,)
    assert np.bincount(train_y).tolist() == [5000] * 10 and np.bincount(val_y).tolist() == [1000] * 10
    assert meta['num_classes'] == 10 and meta['classes'] == CIFAR10_NAMES
    assert abs(train_x.mean() / 255 - 0.473) < 0.01  # CIFAR-10's mean pixel: real images, not noise or zeros

def test_prepare_again_returns_what_is_there(tmp_path):
    # train.py calls prepare on every start: a prepared folder is used as it is (no source, no Hub), never rewritten
    cifar10_source(tmp_path / 'src')
    meta = cifar.prepare(tmp_path / 'out', 'cifar10', source=tmp_path / 'src')
    assert cifar.prepare(tmp_path / 'out', 'cifar10') == meta
    with pytest.raises(ValueError, match=r"already holds cifar10 \(label\), not cifar100 \(fine_label\)"):
        cifar.prepare(tmp_path / 'out', 'cifar100', source=tmp_path / 'src')

def test_prepare_errors_before_writing(tmp_path):
    cifar10_source(tmp_path / 'src')
    out = tmp_path / 'out'
    with pytest.raises(ValueError, match='unknown dataset'):
        cifar.prepare(out, 'cifar11', source=tmp_path / 'src')
    with pytest.raises(ValueError, match='coarse'):
        cifar.prepare(out, 'cifar10', source=tmp_path / 'src', label='coarse')
    with pytest.raises(FileNotFoundError, match='test.parquet'):
        cifar.prepare(out, 'cifar10', source=tmp_path / 'nowhere')
    (tmp_path / 'bad').mkdir()
    for split in ('train', 'test'):  # 'image' instead of 'img', as in some other CIFAR copies
        bad = datasets.Dataset.from_dict({'image': [b'x'], 'label': [0]})
        bad.to_parquet(str(tmp_path / 'bad' / f'{split}.parquet'))
    with pytest.raises(ValueError, match=r"no column\(s\) \['img'\]"):
        cifar.prepare(out, 'cifar10', source=tmp_path / 'bad')
    with pytest.raises(ValueError, match=r"no column\(s\) \['fine_label'\]"):
        cifar.prepare(out, 'cifar100', source=tmp_path / 'src')
    assert not out.exists()

def test_prepare_offline_message(tmp_path, monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'uoft-cs/cifar100' on the Hub")
    monkeypatch.setattr(datasets, 'load_dataset', offline)
    with pytest.raises(RuntimeError) as err:
        cifar.prepare(tmp_path / 'out', 'cifar100')
    assert all(s in str(err.value) for s in ('cifar100', '--source', 'test.parquet', "'img'", "'fine_label'"))
    assert not (tmp_path / 'out').exists()

def test_an_unreachable_hub_fails_at_once_and_names_train_pys_key(tmp_path, monkeypatch, caplog):
    """No network: one connection refused, then the datasets library runs offline (its cache, or an error at once)
    instead of retrying each request for 25 s; the line names train.py's --data_source, and the libraries' offline
    flags are as they were after it."""
    import huggingface_hub.constants as hub
    import socket
    import urllib.request
    def no_network(*args, **kwargs):
        raise OSError('[Errno -2] Name or service not known')
    monkeypatch.setattr(socket, 'create_connection', no_network)  # what the download would call too
    monkeypatch.setattr(urllib.request, 'getproxies', lambda: {})
    monkeypatch.setattr(hub, 'HF_HUB_OFFLINE', False)
    monkeypatch.setattr(datasets.config, 'HF_HUB_OFFLINE', False)
    with pytest.raises(RuntimeError) as err:
        cifar.prepare(tmp_path / 'out', 'cifar10')
    assert "huggingface.co cannot be reached: [Errno -2] Name or service not known" in str(err.value)
    assert "Pass --data_source=DIR to train.py (--source=DIR to a prepare/ script)" in str(err.value)
    assert 'Retrying' not in caplog.text
    assert (hub.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE) == (False, False)
    assert not (tmp_path / 'out').exists()

def test_hf_hub_offline_is_not_probed(tmp_path, monkeypatch):
    """HF_HUB_OFFLINE=1 (read into the libraries' flags when they are imported): no connection is tried at all."""
    import huggingface_hub.constants as hub
    import socket
    def probed(*args, **kwargs):
        raise AssertionError('a connection was tried under HF_HUB_OFFLINE=1')
    monkeypatch.setattr(socket, 'create_connection', probed)
    monkeypatch.setattr(hub, 'HF_HUB_OFFLINE', True)
    monkeypatch.setattr(datasets.config, 'HF_HUB_OFFLINE', True)
    with pytest.raises(RuntimeError, match=r"\(Couldn't reach 'uoft-cs/cifar10' on the Hub.*Pass --data_source=DIR"):
        cifar.prepare(tmp_path / 'out', 'cifar10')

# ----------------------------------------------------------------------------- augment

def test_normalize():
    x = torch.randint(0, 256, (2, 32, 32, 3), dtype=torch.uint8)
    y = A.normalize(x)
    assert y.shape == (2, 3, 32, 32) and y.dtype == torch.float32
    expected = (x[1, 5, 7, 2].item() / 255 - A.CIFAR10_MEAN[2]) / A.CIFAR10_STD[2]
    assert abs(y[1, 2, 5, 7].item() - expected) < 1e-6

def slow_crop(img, top, left, pad):
    # obviously-correct reference: paste into a zero canvas, slice the window
    H, W, C = img.shape
    canvas = np.zeros((H + 2 * pad, W + 2 * pad, C), dtype=img.dtype)
    canvas[pad:pad + H, pad:pad + W] = img
    return canvas[top:top + H, left:left + W]

def test_crop_matches_reference():
    x = torch.randint(1, 256, (5, 32, 32, 3), dtype=torch.uint8)
    top, left = torch.tensor([0, 8, 4, 1, 8]), torch.tensor([0, 8, 4, 7, 0])
    out = A.crop(x, top, left, pad=4)
    assert out.shape == x.shape and out.dtype == torch.uint8
    assert torch.equal(out[2], x[2])  # offset (pad, pad) is the original image
    for b in range(5):
        assert np.array_equal(out[b].numpy(), slow_crop(x[b].numpy(), top[b].item(), left[b].item(), 4))

def test_random_crop_is_some_padded_window_and_reproducible():
    x = torch.randint(1, 256, (16, 32, 32, 3), dtype=torch.uint8)
    out = A.random_crop(x, 4, torch.Generator().manual_seed(0))
    assert torch.equal(out, A.random_crop(x, 4, torch.Generator().manual_seed(0)))
    offsets = []
    for b in range(16):  # find the window each output came from by trying all 81 offsets
        windows = {(t, l): slow_crop(x[b].numpy(), t, l, 4) for t in range(9) for l in range(9)}
        found = [offset for offset, window in windows.items() if np.array_equal(out[b].numpy(), window)]
        assert len(found) == 1
        offsets += found
    assert len(set(offsets)) > 8  # offsets are drawn per image

def test_random_flip():
    x = torch.randint(0, 256, (64, 32, 32, 3), dtype=torch.uint8)
    out = A.random_flip(x, torch.Generator().manual_seed(0))
    flipped = [b for b in range(64) if np.array_equal(out[b].numpy(), x[b].numpy()[:, ::-1])]
    kept = [b for b in range(64) if torch.equal(out[b], x[b])]
    assert len(flipped) + len(kept) == 64 and 20 < len(flipped) < 44

def test_one_hot_smooth():
    y = A.one_hot_smooth(torch.tensor([3, 0]), 10, 0.1)
    expected = torch.full((2, 10), 0.01)
    expected[0, 3] = expected[1, 0] = 0.91
    assert torch.allclose(y, expected, atol=1e-7) and torch.allclose(y.sum(1), torch.ones(2))
    assert torch.equal(A.one_hot_smooth(torch.tensor([2]), 4, 0.0), torch.tensor([[0.0, 0.0, 1.0, 0.0]]))

def test_soft_cross_entropy():
    logits, y = torch.randn(6, 10), torch.randint(0, 10, (6,))
    assert torch.allclose(soft_cross_entropy(logits, A.one_hot_smooth(y, 10)), F.cross_entropy(logits, y))
    assert torch.allclose(soft_cross_entropy(logits, A.one_hot_smooth(y, 10, 0.1)),
                          F.cross_entropy(logits, y, label_smoothing=0.1))

def batch_of_constants(B=6, K=10):
    # image b is filled with the value b + 1 and has label b, so every pixel and label says where it came from
    x = (torch.arange(B, dtype=torch.float32) + 1).view(B, 1, 1, 1).expand(B, 3, 32, 32).contiguous()
    return x, A.one_hot_smooth(torch.arange(B), K)

def test_mixup_exact():
    x, y = torch.randn(6, 3, 32, 32), A.one_hot_smooth(torch.arange(6), 10)
    x_in, y_in = x.clone(), y.clone()
    xm, ym = A.mixup_cutmix(x, y, mixup_alpha=0.8, cutmix_alpha=0.0, generator=torch.Generator().manual_seed(1))
    assert torch.equal(x, x_in) and torch.equal(y, y_in)  # inputs untouched
    lam = ym[0, 0].item()  # image 0 has label 0; its partner (image 5) has label 5
    assert 0 < lam < 1 and abs(ym[0, 5].item() - (1 - lam)) < 1e-6
    assert torch.allclose(xm, lam * x + (1 - lam) * x.flip(0), atol=1e-6)
    assert torch.allclose(ym.sum(1), torch.ones(6))

def test_cutmix_area_equals_corrected_lambda():
    x, y = batch_of_constants()
    nontrivial = 0
    for seed in range(20):
        xm, ym = A.mixup_cutmix(x, y, mixup_alpha=0.0, cutmix_alpha=1.0, generator=torch.Generator().manual_seed(seed))
        assert torch.allclose(ym.sum(1), torch.ones(6))
        from_partner = xm == x.flip(0)  # (B, 3, 32, 32); no pixel equals its partner's value otherwise
        assert torch.equal(from_partner | (xm == x), torch.ones_like(from_partner))  # nothing blended
        assert torch.equal(from_partner, from_partner[:1].expand_as(from_partner))  # one box for the batch
        for b in range(6):
            lam = ym[b, b].item()
            assert abs(from_partner[b].float().mean().item() - (1 - lam)) < 1e-6
            assert abs(ym[b, 5 - b].item() - (1 - lam)) < 1e-6
        box = from_partner[0, 0].nonzero()  # a rectangle: as many pixels as its bounding box
        if len(box):
            h, w = (box.max(0).values - box.min(0).values + 1).tolist()
            assert h * w == len(box)
        nontrivial += 0 < len(box) < 32 * 32
    assert nontrivial >= 10

def test_mixup_cutmix_switch_and_identity():
    x, y = batch_of_constants(B=2)
    used_cutmix = []
    for seed in range(200):
        xm, _ = A.mixup_cutmix(x, y, 0.8, 1.0, cutmix_prob=0.8, generator=torch.Generator().manual_seed(seed))
        used_cutmix.append(bool(((xm == 1) | (xm == 2)).all()))  # MixUp blends 1 and 2 into values in between
    assert 0.7 < np.mean(used_cutmix) < 0.9
    first, second = (A.mixup_cutmix(x, y, generator=torch.Generator().manual_seed(7)) for _ in range(2))
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])  # same seed, same batch
    xm, ym = A.mixup_cutmix(x, y, mixup_alpha=0.0, cutmix_alpha=0.0)
    assert xm is x and ym is y
