"""Longformer attention against a slow reference written straight from the formula (docs/rules.md#longformer): per
row, the list of keys it sees and one softmax over them; the global rows with their own qg, kg, vg over every key.
Float64, forward and gradients (q, k, v, qg, kg, vg, and c_attn's global blocks through the module). Also the
window over depth, causality, flex against math, the cache past every window, memory linear in T, bad settings."""
import math

import pytest
import torch

from rules.longformer import longformer_mask, longformer_windows
from conftest import assert_causal, build_layer, cached_generation_equals_the_forward
from machinery.band import band_keys
from machinery.heads import merge_heads
from machinery.masks import band_mask, dense_mask
from model import GPT, GPTConfig


def visible_keys(i, T, causal, W, G):
    """The keys row i sees: the last W (GPT); |i - j| <= W//2 or a global token (ViT); every key (a global row)."""
    if causal:
        return [j for j in range(T) if i - W < j <= i]
    if i < G:
        return list(range(T))
    return [j for j in range(T) if abs(i - j) <= W // 2 or j < G]


def longformer_reference(tensors, causal, W, G):
    """y_i = Σ_j softmax_j(q_i·k_j/√D) v_j over visible_keys(i), with qg, kg, vg in the global rows: loops."""
    q, k, v, *global_qkv = tensors
    B, H, T, D = q.shape
    rows = []
    for i in range(T):
        qs, ks, vs = global_qkv if i < G else (q, k, v)
        js = visible_keys(i, T, causal, W, G)
        per_head = []
        for h in range(H):
            scores = torch.stack([(qs[:, h, i] * ks[:, h, j]).sum(-1) / math.sqrt(D) for j in js], -1)  # (B, n)
            weights = torch.softmax(scores, -1)
            per_head.append(sum(weights[:, n, None] * vs[:, h, j] for n, j in enumerate(js)))         # (B, D)
        rows.append(torch.stack(per_head, 1))                                                          # (B, H, D)
    return torch.stack(rows, 2)                                                                        # (B, H, T, D)


def make(T, layer_idx=0, **kw):
    attn = build_layer('longformer', T, layer_idx, **kw)
    attn.init_extra()
    return attn


def inputs(n, T, B=2, H=3, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, D, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(n)]


def check_against_reference(attn, T, W, G, zero_grads=()):
    """The rule's formula as code (attend_reference, every pair at once), its math path (attend) and attend_fused
    against the per-row reference above, forward and every input's gradient; zero_grads: the inputs whose gradient
    is 0 by construction (one key per row: q and k; every token global: q, k and v)."""
    tensors = inputs(len(attn.projections), T)
    ref = longformer_reference(tensors, attn.causal, W, G)  # once for the three paths: its loops are the test's time
    g = torch.randn_like(ref)
    grads_ref = torch.autograd.grad(ref, tensors, g, allow_unused=True, materialize_grads=True)
    for path in (attn.attend_reference, attn.attend, attn.attend_fused):
        y = path(*tensors)
        torch.testing.assert_close(y, ref, atol=1e-12, rtol=1e-10, msg=path.__name__)
        grads = torch.autograd.grad(y, tensors, g, allow_unused=True, materialize_grads=True)
        for name, a, b in zip(attn.projections, grads, grads_ref):
            assert (b.abs().sum() > 0) == (name not in zero_grads), name  # not trivially zero
            torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10, msg=f'{path.__name__}: gradient of {name}')


# (T, W, layer): windows longer than the sequence, W = 1, T not a multiple of the band's tile
@pytest.mark.parametrize('T,W', [(23, 5), (16, 4), (21, 8), (5, 8), (9, 1), (70, 16)])
def test_causal_matches_reference(T, W):
    attn = make(T, longformer_window=W)
    assert attn.projections == ('q', 'k', 'v') and attn.n_global == 0  # the default global count: none in a GPT
    check_against_reference(attn, T, W, 0, zero_grads=('q', 'k') if W == 1 else ())


# (T, W, G): CLS alone (the default), several globals, windows wider than the sequence, W odd and W = 1, all global
@pytest.mark.parametrize('T,W,G', [(26, 6, -1), (26, 7, 3), (9, 40, 1), (30, 1, 2), (65, 16, 1), (4, 4, 4), (20, 5, 0)])
def test_bidirectional_matches_reference(T, W, G):
    attn = make(T, causal=False, longformer_window=W, longformer_global=G)
    G = 1 if G == -1 else G
    assert attn.n_global == G and attn.projections == (('q', 'k', 'v', 'qg', 'kg', 'vg') if G else ('q', 'k', 'v'))
    check_against_reference(attn, T, W, G, zero_grads=('q', 'k', 'v') if G >= T else ())


def test_global_projections_start_as_copies_and_reach_only_the_global_rows():
    T, C = 30, 24
    attn = make(T, causal=False, longformer_window=6, longformer_global=2)
    w, b = attn.c_attn.weight, attn.c_attn.bias
    assert w.shape == (6 * C, C) and torch.equal(w[3 * C:], w[:3 * C]) and torch.equal(b[3 * C:], b[:3 * C])
    x = torch.randn(2, T, C, dtype=torch.float64)
    q, k, v, qg, kg, vg = attn.project(x)
    y = attn.attend(q, k, v, qg, kg, vg)
    # at init the global rows are full softmax attention with Q, K, V (§3.1: the copies)
    full = torch.softmax(q[:, :, :2] @ k.transpose(-1, -2) / math.sqrt(8), -1) @ v
    torch.testing.assert_close(y[:, :, :2], full, atol=1e-12, rtol=1e-12)
    # through the module: c_attn's gradient, its global blocks included, against the reference from x
    with torch.no_grad():
        w.add_(0.05 * torch.randn_like(w))  # Q_g, K_g, V_g away from their copies
    g = torch.randn(2, T, C, dtype=torch.float64)
    grad = torch.autograd.grad(attn(x), w, g)[0]
    tensors = [t.transpose(1, 2) for t in (x @ w.T + b).view(2, T, 6, 3, 8).unbind(2)]  # (B, H, T, D) each
    ref = attn.c_proj(merge_heads(longformer_reference(tensors, False, 6, 2)))
    torch.testing.assert_close(attn(x), ref, atol=1e-12, rtol=1e-10)
    grad_ref = torch.autograd.grad(ref, w, g)[0]
    torch.testing.assert_close(grad, grad_ref, atol=1e-12, rtol=1e-10)
    assert (grad_ref[3 * C:].abs().sum(1) > 0).all()  # every row of Q_g, K_g, V_g learns
    # Q_g, K_g, V_g change the global rows and nothing else
    with torch.no_grad():
        before = attn.attend(*attn.project(x))
        w[3 * C:].add_(torch.randn_like(w[3 * C:]))
        after = attn.attend(*attn.project(x))
    assert not torch.allclose(after[:, :, :2], before[:, :, :2])
    assert torch.equal(after[:, :, 2:], before[:, :, 2:])


def test_window_grows_over_depth():
    assert longformer_windows(32, 512, 8) == [32, 101, 169, 238, 306, 375, 443, 512]
    assert longformer_windows(32, 0, 4) == [32] * 4 and longformer_windows(4, 12, 1) == [4]
    windows = [make(40, i, n_layer=3, longformer_window=4, longformer_window_last=12).layer_window for i in range(3)]
    assert windows == [4, 8, 12]
    attn = make(40, 2, n_layer=3, longformer_window=4, longformer_window_last=12)  # the last layer: W = 12
    check_against_reference(attn, 40, 12, 0)


def test_pattern_and_two_sided_band_are_exact():
    cpu = torch.device('cpu')
    m = dense_mask(longformer_mask(3, 2), 20, cpu)  # or_masks of the window and the globals, off flex too
    i, j = torch.arange(20).view(-1, 1), torch.arange(20)
    assert torch.equal(m, ((i - j).abs() <= 3) | (i < 2) | (j < 2))
    # the band with look-ahead: slot s of tile c is key c·tile - behind + s, zero outside the sequence
    T, tile, behind, ahead = 23, 4, 4, 8
    keys = band_keys(torch.arange(1., T + 1).view(1, 1, T, 1), tile, behind, ahead)
    assert keys.shape == (1, 1, 6, behind + tile + ahead, 1)
    for c in range(6):
        for s in range(behind + tile + ahead):
            position = c * tile - behind + s
            assert keys[0, 0, c, s, 0].item() == (position + 1 if 0 <= position < T else 0)
    mask = band_mask(longformer_mask(3, 0), T, tile, behind, cpu, ahead)
    for c in range(6):
        for r in range(tile):
            row = c * tile + r
            positions = [(s, c * tile - behind + s) for s in range(behind + tile + ahead)]
            want = [s for s, j in positions if abs(row - j) <= 3 and 0 <= j and (j < T or row >= T)]  # padding rows
            assert mask[c, r].nonzero().flatten().tolist() == want
            assert want  # no empty row, padding rows included


@pytest.mark.parametrize('kw', [dict(), dict(mix=True), dict(pos_emb='rope')])
def test_gpt_is_causal(kw):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=3, n_head=2, n_embd=16, block_size=40, vocab_size=11, attention='longformer',
                          longformer_window=4, longformer_window_last=12, **kw)).eval()
    assert_causal(model, T=40, cut=21)


@pytest.mark.parametrize('T,kw', [(150, dict(longformer_window=32)), (150, dict(longformer_window=200)),
                                  (65, dict(causal=False, longformer_window=16)),
                                  (100, dict(causal=False, longformer_window=21, longformer_global=3))])
def test_flex_forward_equals_math(T, kw):
    attn = make(T, n_head=2, n_embd=16, **kw).float()
    tensors = [t.detach().float() for t in inputs(len(attn.projections), T, H=2)]
    with torch.no_grad():
        torch.testing.assert_close(attn.attend_flex(*tensors), attn.attend(*tensors), atol=1e-5, rtol=1e-5)


def test_cached_generation_past_every_window_of_a_growing_schedule():
    # windows 4, 8, 12 over three layers: 16 prompt + 40 new tokens cross each ring several times
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=3, n_head=2, n_embd=16, block_size=32, vocab_size=11, bias=False, pos_emb='rope',
                          attention='longformer', longformer_window=4, longformer_window_last=12)).double().eval()
    prompt = torch.randint(0, 11, (2, 16), generator=torch.Generator().manual_seed(1))
    cache = cached_generation_equals_the_forward(model, prompt, 40)
    assert [c.capacity for c in cache.caches] == [4, 8, 12]  # each layer's ring holds its own window


@pytest.mark.parametrize('kw', [dict(), dict(causal=False, longformer_global=2)])
def test_saves_nothing_quadratic_for_backward(kw):
    def saved_for_backward(T):
        attn = make(T, longformer_window=16, **kw)
        tensors = inputs(len(attn.projections), T)
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
            attn.attend(*tensors).sum().backward()
        return saved
    B, H, T = 2, 3, 256
    saved = saved_for_backward(T)
    assert max(saved) <= B * H * T * (2 + 3 * 16) < B * H * T * T // 4  # the band's weights: G + 3W per query at most
    assert sum(saved_for_backward(2 * T)) <= 2.05 * sum(saved)           # linear in T


@pytest.mark.parametrize('kw,message', [
    (dict(longformer_window=0), 'longformer_window must be >= 1'),
    (dict(longformer_window_last=-1), 'longformer_window must be >= 1 and longformer_window_last >= 0'),
    (dict(longformer_global=-2), r'longformer_global must be >= -1'),
    (dict(longformer_global=1), r'longformer_global must be 0 or -1 in a GPT'),
    (dict(causal=False, longformer_global=66), r'longformer_global must be <= block_size=65'),
])
def test_bad_settings_are_one_clear_line(kw, message):
    with pytest.raises(ValueError, match=message):
        make(65, **kw)


def test_the_vit_form_does_not_generate_and_its_weights_are_distributions():
    attn = make(30, causal=False, longformer_window=6, longformer_global=2)
    with pytest.raises(ValueError, match='does not generate'):
        attn.new_cache()
    tensors = [t.detach() for t in inputs(6, 30)]
    weights, y = attn.attention_weights(*tensors), attn.attend(*tensors)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, 30, dtype=torch.float64))
    torch.testing.assert_close(weights[:, :, 2:] @ tensors[2], y[:, :, 2:])  # rows >= G weigh v
    torch.testing.assert_close(weights[:, :, :2] @ tensors[5], y[:, :, :2])  # the global rows weigh vg
    row = weights[:, :, 10]  # sees 7..13 (|i-j| <= 3) and the globals 0, 1
    assert (row[..., :2] > 0).all() and (row[..., 7:14] > 0).all()
    assert (row[..., 2:7] == 0).all() and (row[..., 14:] == 0).all()
