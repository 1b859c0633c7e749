"""The pixel model: pixel sequences read from a prepared image dataset, MNIST prepared from
its parquet, bits/dim from --eval_full exact (all-equal logits: 8 bits; by hand on a tiny split; 2 gloo processes
== 1), and images drawn with the cache exactly as without it. Tiny 4x4 images: a few seconds each."""
import json
import math

import datasets
import numpy as np
import pytest
import torch
from PIL import Image

from rules import ATTENTION
from conftest import rule_cases, run_script, write_tiny_cifar
from support.data import Batches, bits_per_dim
from support.pixels import draw, png_grid
from model import GPT, GPTConfig
from prepare import check_files, cifar

TINY = ['--dataset=cifar10_pixels', '--block_size=47', '--n_layer=1', '--n_head=2', '--n_embd=16', '--batch_size=2',
        '--eval_iters=2', '--device=cpu', '--warmup_iters=1', '--lr_decay_iters=3', '--dropout=0.0']


@pytest.fixture
def pixel_dir(tmp_path):
    """A prepared 'cifar10' folder of 4x4 RGB images: 6 train, 5 val."""
    return write_tiny_cifar(tmp_path / 'cifar10')


def test_pixels_are_subpixel_tokens_in_raster_order(pixel_dir):
    meta, rows = check_files('cifar10_pixels', str(pixel_dir))
    batches = Batches('cifar10_pixels', str(pixel_dir), meta, rows, 47, 2, 'cpu')
    assert batches.model_sizes == {'vocab_size': 256} and batches.sizes == {'train': 6, 'val': 5}
    image = np.load(pixel_dir / 'val_x.npy')[3]  # (4, 4, 3)
    x, y = batches.load_batch('val', torch.tensor([3]))
    seq = [int(image[r, c, ch]) for r in range(4) for c in range(4) for ch in range(3)]  # R, G, B of each pixel
    assert x[0].tolist() == seq[:-1] and y[0].tolist() == seq[1:]
    with pytest.raises(ValueError, match='pass --block_size=47'):
        Batches('cifar10_pixels', str(pixel_dir), meta, rows, 48, 2, 'cpu')


def test_mnist_prepared_from_a_parquet_written_here(tmp_path, monkeypatch):
    # the shared data has no MNIST: a parquet in the Hub's schema (image + label), 28x28 grey
    monkeypatch.setattr(datasets.config, 'HF_DATASETS_CACHE', str(tmp_path / 'hf_cache'))
    rng, src = np.random.default_rng(1), tmp_path / 'src'
    src.mkdir()
    images = {'train': rng.integers(0, 256, (3, 28, 28), dtype=np.uint8),
              'test': rng.integers(0, 256, (2, 28, 28), dtype=np.uint8)}
    labels = {'train': [5, 0, 4], 'test': [7, 2]}
    for split in images:
        datasets.Dataset.from_dict({'image': [Image.fromarray(im) for im in images[split]], 'label': labels[split]},
                                   features=datasets.Features({'image': datasets.Image(),
                                                               'label': datasets.Value('int64')})
                                   ).to_parquet(str(src / f'{split}.parquet'))
    out = tmp_path / 'mnist'
    meta = cifar.prepare(out, 'mnist', source=src)
    assert sorted(p.name for p in out.iterdir()) == ['meta.json', 'train_x.npy', 'train_y.npy', 'val_x.npy',
                                                     'val_y.npy']  # no temporary file left
    assert np.array_equal(np.load(out / 'train_x.npy'), images['train'][..., None])  # (3, 28, 28, 1)
    assert np.array_equal(np.load(out / 'val_y.npy'), labels['test'])
    assert meta['dataset'] == 'mnist' and meta['counts'] == {'train': 3, 'val': 2}
    meta, rows = check_files('mnist_pixels', str(out))
    x, y = Batches('mnist_pixels', str(out), meta, rows, 783, 2, 'cpu').load_batch('val', torch.tensor([1]))
    assert x.shape == (1, 783) and y[0].tolist() == images['test'][1].flatten()[1:].tolist()


def eval_full(out_dir, data_dir, ddp=0):
    args = ['train.py', *TINY, f'--data_dir={data_dir}', f'--out_dir={out_dir}', '--init_from=resume',
            '--eval_only=True', '--eval_full=True', f'--gradient_accumulation_steps={ddp or 1}']
    log = run_script(*args, ddp=ddp)
    return json.loads((out_dir / 'eval_full.json').read_text()), log


def test_bits_per_dim_exact(pixel_dir, tmp_path):
    out = tmp_path / 'out'
    log = run_script('train.py', *TINY, f'--data_dir={pixel_dir}', f'--out_dir={out}', '--max_iters=3',
                     '--eval_interval=3', '--learning_rate=1e-2')
    assert 'val bits/dim' in log
    # by hand: the summed CE of subpixels 2..48 of all 5 val images (batch 2: the last batch holds one) / 235 / ln 2
    ckpt = torch.load(out / 'ckpt.pt', weights_only=True)
    model = GPT(GPTConfig(**ckpt['model_args']))
    model.load_state_dict(ckpt['model'])
    seq = torch.from_numpy(np.load(pixel_dir / 'val_x.npy').reshape(5, 48).astype(np.int64))
    with torch.no_grad():
        logits, _ = model.eval()(seq[:, :-1], seq[:, 1:])
    nats = -logits.double().log_softmax(-1).gather(-1, seq[:, 1:, None]).sum().item()
    one, text = eval_full(out, pixel_dir)
    assert one['targets'] == 5 * 47 and one['examples'] == 5 and 'val bits/dim' in text
    assert one['bits_per_dim'] == pytest.approx(nats / (5 * 47) / math.log(2), rel=1e-6)
    # two gloo processes (batches [0, 1] and [4] on rank 0, [2, 3] on rank 1) count every image once
    two, _ = eval_full(out, pixel_dir, ddp=2)
    assert two['targets'] == one['targets'] and two['bits_per_dim'] == pytest.approx(one['bits_per_dim'], rel=1e-9)
    # a model whose logits are all equal: every subpixel has probability 1/256, exactly 8 bits
    ckpt['model']['lm_head.weight'].zero_()  # tied to the token embedding: the final features meet a zero head
    torch.save(ckpt, out / 'ckpt.pt')
    flat, _ = eval_full(out, pixel_dir)
    assert flat['bits_per_dim'] == pytest.approx(8.0, abs=1e-6) and bits_per_dim(math.log(256)) == 8.0


# every rule on 4x4 RGB images (48 subpixels), windows and chunks small enough to be crossed several times
PIXEL_MODEL = dict(n_layer=2, n_head=2, n_embd=16, block_size=47, vocab_size=256, bias=False, pos_emb='learned',
                   krause_window=8, krause_topk=4, cluster_chunk=8, cluster_m=4, tda_beta=0.5)
CASES = [dict(attention=name) for name in ATTENTION] + [dict(attention='krause', mix=True),
                                                       dict(attention='softmax', window=8)]


@pytest.mark.parametrize('kw', rule_cases(CASES, 'has_cache'))
def test_cached_pixel_sampling_equals_uncached(kw):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**PIXEL_MODEL, **kw})).double().eval()
    torch.manual_seed(1)  # the first subpixels, uniform
    cached = draw(model, 3, 2, 48, temperature=0)
    torch.manual_seed(1)
    assert torch.equal(cached, draw(model, 3, 2, 48, temperature=0, use_cache=False)) and cached.shape == (3, 48)


def test_sample_py_draws_and_completes_images(pixel_dir, tmp_path):
    out = tmp_path / 'out'
    run_script('train.py', *TINY, f'--data_dir={pixel_dir}', f'--out_dir={out}', '--max_iters=1', '--eval_interval=1')
    log = run_script('sample.py', f'--out_dir={out}', '--num_samples=3', '--batch_size=2', '--device=cpu', '--top_k=0')
    assert '3 images of 48 subpixels (drawn, batch 2, softmax)' in log and 'images/s' in log and 'MiB' in log
    assert np.asarray(Image.open(out / 'samples.png')).shape == (4 + 1 * 20, 4 + 3 * 20, 3)  # 4x4 at 16x16 + 4 pad
    run_script('sample.py', f'--out_dir={out}', '--num_samples=2', '--batch_size=2', '--device=cpu', '--complete=True',
               '--temperature=0.0')
    grid = np.asarray(Image.open(out / 'completions.png'))  # original, completion, original, completion
    val = np.load(pixel_dir / 'val_x.npy')
    assert grid.shape == (4 + 1 * 20, 4 + 4 * 20, 3)
    for i in range(2):
        original, completion = (grid[4:20, 4 + 20 * j:20 + 20 * j] for j in (2 * i, 2 * i + 1))
        big = val[i].repeat(4, axis=0).repeat(4, axis=1)  # each pixel a 4x4 block
        assert np.array_equal(original, big) and np.array_equal(completion[:8], big[:8])  # the top half kept


@pytest.mark.parametrize('n,columns,rows', [(1, 1, 1), (3, 3, 1), (8, 8, 1), (9, 8, 2), (16, 8, 2), (17, 8, 3)])
def test_a_png_grid_is_sized_to_its_images(n, columns, rows, tmp_path):
    """Each 32-pixel image drawn 4x (a pixel a 4x4 block), in at most 8 columns and as many rows as it fills: no blank
    columns for a few images."""
    images = np.random.default_rng(n).integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    png_grid(images, tmp_path / 'grid.png')
    grid = np.asarray(Image.open(tmp_path / 'grid.png'))
    assert grid.shape == (4 + rows * 132, 4 + columns * 132, 3)
    r, c = divmod(n - 1, columns)  # the last image, where it belongs, nearest-neighbour
    assert np.array_equal(grid[4 + 132 * r:132 + 132 * r, 4 + 132 * c:132 + 132 * c],
                          images[-1].repeat(4, axis=0).repeat(4, axis=1))
