"""The ViT (vit.py) and train.py's image path: position is only known through the position embedding, bad settings
fail early and clearly, a tiny CIFAR-shaped dataset trains, resume is exact with all the augmentations on, and two
DDP processes train as one. (Augmentation itself is checked against references in test_cifar.py.) Offline, ~40 s."""
import json
import re

import numpy as np
import pytest
import torch

from conftest import iter_losses, run_script
from vit import ViT, ViTConfig

TINY = ['config/softmax_vit.py', '--n_layer=2', '--n_head=2', '--n_embd=32', '--batch_size=16', '--eval_iters=2',
        '--log_interval=1', '--warmup_iters=2', '--compile=False', '--device=cpu']


def write_prepared(folder, n_train=512, n_val=128, num_classes=10):
    """A dataset as prepare/cifar.py writes it: images whose red level and noise depend on the class."""
    folder.mkdir()
    for split, n, seed in (('train', n_train, 0), ('val', n_val, 1)):
        rng = np.random.default_rng(seed)
        y = rng.integers(0, num_classes, n)
        x = rng.integers(0, 64, (n, 32, 32, 3)).astype(np.uint8)
        x[..., 0] += (y * 19).astype(np.uint8)[:, None, None]
        np.save(folder / f'{split}_x.npy', x)
        np.save(folder / f'{split}_y.npy', y.astype(np.int64))
    meta = {'kind': 'image', 'dataset': 'cifar10', 'num_classes': num_classes, 'classes': [],
            'counts': {'train': n_train, 'val': n_val}, 'source': 'test', 'label': 'label'}
    (folder / 'meta.json').write_text(json.dumps(meta))
    return folder


@pytest.fixture(scope='module')
def tiny_cifar(tmp_path_factory):
    return write_prepared(tmp_path_factory.mktemp('cifar') / 'data')


# ----------------------------------------------------------------------------- the model

def shuffle_patches(x, perm, p):
    # (B, C, H, W) -> the same image with its p x p patches moved: patch perm[n] goes to place n (row-major)
    B, C, H, W = x.shape
    g = H // p
    patches = x.view(B, C, g, p, g, p).permute(0, 2, 4, 1, 3, 5).reshape(B, g * g, C, p, p)
    return patches[:, perm].view(B, g, g, C, p, p).permute(0, 3, 1, 4, 2, 5).reshape(B, C, H, W)


def test_only_position_embeddings_know_where_a_patch_is():
    torch.manual_seed(0)
    model = ViT(ViTConfig(n_layer=2, n_head=2, n_embd=32, patch_size=4, drop_path=0.1)).eval()
    x, perm = torch.randn(3, 3, 32, 32), torch.randperm(64)
    shuffled = shuffle_patches(x, perm, 4)
    tokens = model.patch_embed(x).flatten(2).transpose(1, 2)  # (B, 64, C): the shuffle permutes the tokens
    assert torch.allclose(model.patch_embed(shuffled).flatten(2).transpose(1, 2), tokens[:, perm], atol=1e-6)
    with torch.no_grad():
        for p in model.parameters():  # weights large enough that the patches visibly interact through attention
            p.normal_(std=0.3)
        model.pos_embed.normal_()
        moved = (model(x)[0] - model(shuffled)[0]).abs().max().item()
        model.pos_embed.zero_()
        same = (model(x)[0] - model(shuffled)[0]).abs().max().item()
    assert moved > 1e-2 and same < 1e-5, (moved, same)


def test_shapes_and_losses():
    cfg = ViTConfig(n_layer=1, n_head=2, n_embd=16, patch_size=8, num_classes=7)
    assert (cfg.grid_size, cfg.block_size, cfg.causal) == (4, 17, False)
    model = ViT(cfg)
    x, y = torch.randn(5, 3, 32, 32), torch.randint(0, 7, (5,))
    logits, loss = model(x, y)
    assert logits.shape == (5, 7) and model(x)[1] is None
    assert torch.allclose(loss, torch.nn.functional.cross_entropy(logits, y))
    soft = torch.softmax(torch.randn(5, 7), -1)
    assert torch.allclose(model(x, soft)[1], -(soft * logits.log_softmax(-1)).sum(-1).mean())


def test_init_is_the_official_kvit_one():
    # PyTorch's Linear default is U(±1/√fan_in), std 1/√(3·fan_in), residual projections not scaled down;
    # CLS and positions are N(0, 0.02) truncated at ±2
    torch.manual_seed(0)
    model = ViT(ViTConfig(n_layer=2, n_head=4, n_embd=256))
    for name, fan_in in (('h.1.mlp.c_fc.weight', 256), ('h.1.mlp.c_proj.weight', 1024), ('head.weight', 256)):
        w = model.get_parameter(name)
        assert w.abs().max() <= fan_in ** -0.5, name
        assert w.std().item() == pytest.approx((3 * fan_in) ** -0.5, rel=0.05), name
    assert model.pos_embed.std().item() == pytest.approx(0.02, rel=0.05) and model.pos_embed.abs().max() <= 2
    assert model.cls_token.std().item() == pytest.approx(0.02, rel=0.3)


def test_patch_size_must_divide_the_image():
    with pytest.raises(ValueError, match=r"patch_size=5 does not divide img_size=32; use one of 1, 2, 4, 8, 16, 32"):
        ViTConfig(patch_size=5)
    with pytest.raises(ValueError, match="pos_emb must be 'learned'"):
        ViTConfig(pos_emb='rope')


# ----------------------------------------------------------------------------- train.py

@pytest.mark.parametrize('args,message', [
    # checked before any data work: the cifar100 request would otherwise fail on the cifar10 folder first
    (['--patch_size=5', '--dataset=cifar100'], r"^error: patch_size=5 does not divide img_size=32; use one of"),
    (['--num_classes=100'], r"^error: num_classes=100 but .* holds 10 classes \(cifar10\); set num_classes=0"),
])
def test_bad_image_settings_are_one_clear_line(args, message, tiny_cifar, tmp_path):
    log = run_script('train.py', *TINY, f'--data_dir={tiny_cifar}', f'--out_dir={tmp_path}', *args, check=False)
    assert re.search(message, log, re.M), log[-2000:]
    assert 'Traceback' not in log and 'step 0' not in log


def eval_lines(log):
    return {int(n): (float(loss), float(acc)) for n, loss, acc in
            re.findall(r"^step (\d+): train loss [\d.]+, val loss ([\d.]+), val acc ([\d.]+)$", log, re.M)}


def test_learns_and_resumes_exactly_with_every_augmentation(tiny_cifar, tmp_path):
    # config/softmax_vit.py turns on crop, flip, MixUp/CutMix, label smoothing and drop-path: all must replay
    common = [*TINY, f'--data_dir={tiny_cifar}', '--dropout=0.1', '--eval_interval=20', '--eval_iters=8',
              '--max_iters=60', '--lr_decay_iters=60', '--learning_rate=3e-3']
    straight_log = run_script('train.py', *common, f'--out_dir={tmp_path / "a"}')
    assert 'images per iteration will be: 16' in straight_log
    assert re.search(r"^iter 1: loss [\d.]+, time [\d.]+ms, [\d,]+ images/s$", straight_log, re.M)
    evals = eval_lines(straight_log)
    assert sorted(evals) == [0, 20, 40, 60]
    assert evals[0][0] == pytest.approx(np.log(10), abs=0.1)  # chance at init
    assert evals[60][0] < evals[0][0] - 0.3 and evals[60][1] > 0.15  # it learns (chance is 0.1) through the mixing
    run_script('train.py', *common, f'--out_dir={tmp_path / "b"}', '--max_iters=40')
    resumed_log = run_script('train.py', *common, f'--out_dir={tmp_path / "b"}', '--init_from=resume')
    straight, resumed = iter_losses(straight_log), iter_losses(resumed_log)
    assert min(resumed) == 40 and max(resumed) == 60
    assert {i: straight[i] for i in resumed} == resumed
    assert len(set(straight.values())) > 50  # the losses are real and differ from step to step
    final = re.search(r"^step 60: .*$", straight_log, re.M).group()
    assert re.search(r"^step 60: .*$", resumed_log, re.M).group() == final
    # the checkpoint evaluates as it trained, and sample.py sends it there instead of sampling text from it
    evaluated = run_script('train.py', *common, f'--out_dir={tmp_path / "b"}', '--init_from=resume', '--eval_only=True')
    assert re.search(r"^step 60: .*$", evaluated, re.M).group() == final
    log = run_script('sample.py', f'--out_dir={tmp_path / "b"}', '--device=cpu', check=False)
    assert 'holds a ViT image classifier (cifar10)' in log and '--eval_only=True' in log and 'Traceback' not in log


def test_ddp_two_processes_equal_one_with_augmentation(tiny_cifar, tmp_path):
    # each micro-batch's augmentation seed comes from the shared data generator, so the split does not matter
    # (drop-path off: it draws from each process's own RNG, by design)
    common = [*TINY, f'--data_dir={tiny_cifar}', '--max_iters=4', '--eval_interval=4', '--eval_iters=4',
              '--gradient_accumulation_steps=2', '--drop_path=0', '--learning_rate=3e-3']
    one = run_script('train.py', *common, f'--out_dir={tmp_path / "one"}')
    two = run_script('train.py', *common, f'--out_dir={tmp_path / "two"}', ddp=2)  # two gloo processes
    pattern = r"^step 4: train loss ([\d.]+), val loss ([\d.]+), val acc ([\d.]+)$"
    a, b = re.search(pattern, one, re.M).groups(), re.search(pattern, two, re.M).groups()
    assert [float(v) for v in a] == pytest.approx([float(v) for v in b], abs=2e-4)
