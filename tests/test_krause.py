"""Krause attention against a slow reference written straight from the formula (docs/rules.md#krause): explicit
per-pair distances, a per-row sort, a softmax over the survivors. Float64, forward and gradients (q, k, v, log σ)."""

import os
import shutil

import pytest
import torch

from attention import SoftmaxAttention
from machinery.masks import dense_mask, grid_mask
from rules import AttentionConfig, build_attention
from rules.krause import krause_topk_schedule
from conftest import assert_causal, build_layer, qkv
from model import GPT, GPTConfig


def krause_reference(q, k, v, sigma, visible, topk):
    """y_i = Σ_{j kept} softmax(-||q_i - k_j||² / 2σ²) v_j, kept = the top-k of the visible j (all if fewer)."""
    B, H, T, D = q.shape
    rows = []
    for i in range(T):
        js = visible(i)
        per_head = []
        for h in range(H):
            scores = torch.stack([-((q[:, h, i] - k[:, h, j]) ** 2).sum(-1) / (2 * sigma[h] ** 2) for j in js], -1)
            out = []
            for b in range(B):
                order = sorted(range(len(js)), key=lambda n: -scores[b, n].item())[:topk]  # a per-row sort
                weights = torch.softmax(scores[b, order], -1)
                out.append(sum(w * v[b, h, js[n]] for w, n in zip(weights, order)))
            per_head.append(torch.stack(out))  # (B, D)
        rows.append(torch.stack(per_head, 1))   # (B, H, D)
    return torch.stack(rows, 2)                 # (B, H, T, D)


def make(T, layer_idx=0, **kw):
    attn = build_layer('krause', T, layer_idx, **kw)
    with torch.no_grad():  # a different σ per head, so a mix-up of heads would show
        attn.log_sigma.copy_(torch.log(torch.tensor([0.7, 1.3, 2.5], dtype=torch.float64)))
    return attn


def check_against_reference(attn, T, visible, topk):
    """The rule's formula as code (attend_reference, every pair at once) and its math path (attend), each against
    the per-pair reference above: the output and the gradients of q, k, v and log σ."""
    q, k, v = qkv(T)
    ref = krause_reference(q, k, v, attn.log_sigma.exp(), visible, topk)
    g = torch.randn_like(ref)
    inputs = (q, k, v, attn.log_sigma)
    grads_ref = torch.autograd.grad(ref, inputs, g)
    for path in (attn.attend_reference, attn.attend):
        y = path(q, k, v)
        torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5, msg=path.__name__)
        for name, a, b in zip('q k v log_sigma'.split(), torch.autograd.grad(y, inputs, g), grads_ref):
            if topk > 1:  # (with one key per row the weights are all 1: only v has a gradient)
                assert b.abs().sum() > 0, name  # the reference gradient is not trivially zero
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=f'{path.__name__}: gradient of {name}')


# (T, W, k): windows longer than the sequence, W = 1, T not a multiple of W, and early rows with < k keys
@pytest.mark.parametrize('T,W,k', [(13, 4, 2), (16, 4, 4), (21, 8, 5), (5, 8, 3), (9, 1, 1), (30, 16, 12)])
def test_1d_matches_reference(T, W, k):
    attn = make(T, krause_window=W, krause_topk=k)
    check_against_reference(attn, T, lambda i: [j for j in range(T) if i - W < j <= i], k)


@pytest.mark.parametrize('grid,radius,metric,layer_idx,n_layer', [
    (4, 1, 'manhattan', 0, 12),    # official CIFAR neighbourhood, k = 2
    (4, 1, 'manhattan', 11, 12),   # last layer, k = 4
    (5, 2, 'chebyshev', 5, 12),    # official ImageNet neighbourhood (5x5), k = 11 at layer 5 of k = 8
    (3, 0, 'manhattan', 0, 2),     # a patch sees only itself and CLS: fewer keys than k
])
def test_2d_matches_reference(grid, radius, metric, layer_idx, n_layer):
    T = 1 + grid * grid
    k0 = 8 if metric == 'chebyshev' else 2
    attn = make(T, layer_idx, causal=False, grid_size=grid, krause_radius=radius, krause_metric=metric,
                krause_topk=k0, n_layer=n_layer)
    topk = krause_topk_schedule(k0, n_layer)[layer_idx]
    assert attn.topk == topk

    def visible(i):  # CLS (0) sees all and is seen by all; patches by grid distance
        if i == 0:
            return list(range(T))
        ri, ci = divmod(i - 1, grid)
        near = [1 + r * grid + c for r in range(grid) for c in range(grid)
                if (abs(r - ri) + abs(c - ci) if metric == 'manhattan' else max(abs(r - ri), abs(c - ci))) <= radius]
        return [0] + near
    check_against_reference(attn, T, visible, topk)


def test_grid_neighbourhood_counts():
    cpu = torch.device('cpu')
    m = dense_mask(grid_mask(8, 1, 'manhattan'), 65, cpu)  # official CIFAR: 8x8 patches + CLS
    assert m.shape == (65, 65) and m[0].all() and m[:, 0].all()
    assert m[1 + 3 * 8 + 3].sum() == 1 + 5            # an inner patch: CLS + itself + 4 neighbours
    assert m[1].sum() == 1 + 3                         # a corner patch: CLS + itself + 2
    assert dense_mask(grid_mask(8, 2, 'chebyshev'), 65, cpu)[1 + 3 * 8 + 3].sum() == 1 + 25  # a 5x5 square


def test_vit_topk_schedule():
    assert krause_topk_schedule(2, 12) == [2, 2, 2, 3, 3, 3, 3, 3, 3, 4, 4, 4]
    assert krause_topk_schedule(8, 12) == [8, 9, 9, 10, 11, 12, 12, 13, 14, 15, 15, 16]


def test_the_formula_equals_the_band():
    T = 40
    attn = make(T, krause_window=8, krause_topk=5)
    q, k, v = qkv(T)
    torch.testing.assert_close(attn.attend_reference(q, k, v), attn.attend(q, k, v), atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize('kw', [dict(), dict(mix=True), dict(mix=True, mix_matched=True), dict(pos_emb='rope')])
def test_gpt_is_causal(kw):
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=40, vocab_size=11, attention='krause',
                    krause_window=8, krause_topk=4, **kw)
    model = GPT(cfg).eval()
    assert_causal(model, T=40, cut=21)


@pytest.mark.parametrize('T,W,k', [(200, 32, 16), (150, 256, 192), (64, 8, 8)])
def test_flex_forward_equals_math_1d(T, W, k):
    attn = make(T, krause_window=W, krause_topk=k).float()
    q, k_, v = (t.detach().float() for t in qkv(T))
    with torch.no_grad():
        torch.testing.assert_close(attn.attend_flex(q, k_, v), attn.attend(q, k_, v), atol=1e-5, rtol=1e-5)


def test_flex_forward_equals_math_2d():
    attn = make(65, 11, causal=False, grid_size=8, krause_topk=2, n_layer=12).float()
    q, k, v = (t.detach().float() for t in qkv(65))
    with torch.no_grad():
        torch.testing.assert_close(attn.attend_flex(q, k, v), attn.attend(q, k, v), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('matched', [False, True])
def test_mix_gate_starts_at_point_eight_and_mixes_per_token(matched):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=12, vocab_size=7, attention='krause',
                          mix=True, mix_matched=matched, krause_window=4, krause_topk=2))
    mix = model.transformer.h[0].attn
    heads, C = (1, 16) if matched else (2, 16)  # matched: half the heads each, head size 8 as before
    for branch in (mix.softmax, mix.rule):
        assert (branch.n_head, branch.head_dim) == (heads, 8)
        assert branch.c_attn.weight.shape == (3 * heads * 8, C) and branch.c_proj.weight.shape == (C, heads * 8)
    softmax = SoftmaxAttention(AttentionConfig(n_embd=16, n_head=2), 0)
    own = sum(p.numel() for p in softmax.parameters())  # q, k, v, out and their biases: 4C² + 4C
    pair = sum(p.numel() for name, p in mix.named_parameters() if name.split('.')[-1] not in ('log_sigma',)
               and not name.startswith('gate'))
    assert pair == (own + C if matched else 2 * own)  # matched: softmax's weights; one more out bias
    assert mix.gate.bias.softmax(-1).tolist() == pytest.approx([0.8, 0.2])
    assert 0 < mix.gate.weight.std().item() < 0.02  # N(0, 0.01), not the Linears' N(0, 0.02)
    x = torch.randn(2, 12, 16)
    y_softmax, y_krause = mix.softmax(x), mix.rule(x)
    logits = torch.cat([y_softmax, y_krause], -1) @ mix.gate.weight.T + mix.gate.bias
    g = logits.softmax(-1)
    torch.testing.assert_close(mix(x), g[..., :1] * y_softmax + g[..., 1:] * y_krause)
    assert 'rule.log_sigma' in dict(mix.named_parameters())


def test_sigma_is_learned_per_head():
    attn = make(10, krause_window=4, krause_topk=2, krause_sigma=2.5)
    assert attn.log_sigma.shape == (3,)
    fresh = build_attention(AttentionConfig(n_embd=24, n_head=3, attention='krause', krause_sigma=2.5), 0)
    torch.testing.assert_close(fresh.log_sigma.exp(), torch.full((3,), 2.5))


@pytest.mark.parametrize('kw,match', [
    (dict(krause_topk=0), 'krause_topk must be in'),
    (dict(krause_topk=9, krause_window=8), 'krause_topk must be in'),
    (dict(krause_window=0), 'krause_window must be >= 1'),
    (dict(krause_sigma=0.0), 'krause_sigma must be > 0'),
    (dict(causal=False, grid_size=8, block_size=65, krause_metric='euclid'), "krause_metric must be 'manhattan'"),
    (dict(causal=False, grid_size=8, block_size=50), 'square patch grid'),
    (dict(causal=False, grid_size=0, block_size=64), 'square patch grid'),
    (dict(causal=False, grid_size=8, block_size=65, mix=True), 'is the language-model form'),
])
def test_bad_settings_fail_at_construction(kw, match):
    cfg = AttentionConfig(**{**dict(n_embd=24, n_head=3, attention='krause'), **kw})
    with pytest.raises(ValueError, match=match):
        build_attention(cfg, 0)


def test_train_py_learns_recall_with_krause(tmp_path):
    from conftest import iter_losses, run_script
    log = run_script('train.py', '--attention=krause', '--krause_window=32', '--krause_topk=8', '--n_layer=2',
                     '--n_head=2', '--n_embd=32', '--batch_size=32', '--eval_iters=2', '--log_interval=1',
                     '--warmup_iters=2', '--compile=False', '--device=cpu', '--max_iters=40', '--eval_interval=40',
                     '--learning_rate=3e-3', f'--data_dir={tmp_path / "recall"}', f'--out_dir={tmp_path / "out"}')
    losses = iter_losses(log)
    assert losses[40] < losses[0] - 0.5
    checkpoint = torch.load(tmp_path / 'out' / 'ckpt.pt', weights_only=True)
    sigma = checkpoint['model']['transformer.h.0.attn.log_sigma'].exp()
    assert sigma.shape == (2,) and not torch.allclose(sigma, torch.full((2,), 2.5))  # σ was trained


def test_krause_in_a_vit_follows_the_schedule_and_sees_its_grid():
    from vit import ViT, ViTConfig
    torch.manual_seed(0)
    model = ViT(ViTConfig(n_layer=12, n_head=2, n_embd=16, patch_size=4, attention='krause', krause_topk=2)).eval()
    assert [block.attn.topk for block in model.h] == [2, 2, 2, 3, 3, 3, 3, 3, 3, 4, 4, 4]
    assert model.h[0].attn.grid == (8, 1, 'manhattan')  # 8x8 patches + CLS: the mask is grid_mask(*grid)
    assert model.h[0].attn.mask_mod is grid_mask(8, 1, 'manhattan')
    logits, loss = model(torch.randn(2, 3, 32, 32), torch.tensor([1, 7]))
    assert logits.shape == (2, 10) and torch.isfinite(loss)
    loss.backward()
    assert model.h[0].attn.log_sigma.grad.abs().sum() > 0


@pytest.mark.skipif(not shutil.which(os.environ.get('CXX', 'c++')), reason="torch.compile on CPU needs a C++ compiler")
def test_compiled_math_path_equals_eager():
    # train.py's compile=True on the band path (the masks once went in place under no_grad, and inductor failed
    # on that). The forward with autograd on compiles the training graph; compiling the backward too would double
    # this test's ~30 s (compiled gradients of a whole Krause GPT matched eager to 6e-8 when checked by hand).
    attn = make(70, krause_window=16, krause_topk=6).float()
    q, k, v = (t.detach().float().requires_grad_() for t in qkv(70))
    compiled = torch.compile(attn.attend, backend='inductor')(q, k, v)
    torch.testing.assert_close(compiled, attn.attend(q, k, v), atol=1e-5, rtol=1e-5)
