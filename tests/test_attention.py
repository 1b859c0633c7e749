"""Softmax attention and the shared helpers against references written from the formulas."""
import math
from functools import partial

import pytest
import torch

from machinery.selection import topk_boundary
from rules import ATTENTION
from machinery.band import band_keys, band_layout, band_queries, band_strip, unband
from machinery.masks import band_mask, sliding_window_mask
from machinery.rope import Rotary
from conftest import assert_causal, build_layer
from conftest import qkv as shared_qkv
from model import GPT, GPTConfig


def softmax_reference(q, k, v, causal, window=0):
    """y_i = sum_j softmax_j(q_i.k_j / sqrt(D)) v_j over the visible j, one pair at a time."""
    B, H, T, D = q.shape
    y = torch.zeros_like(v)
    for i in range(T):
        visible = [j for j in range(T) if (not causal or j <= i) and (not window or i - j < window)]
        scores = torch.stack([(q[:, :, i] * k[:, :, j]).sum(-1) / math.sqrt(D) for j in visible], -1)
        weights = scores.softmax(-1)
        y[:, :, i] = sum(weights[..., n, None] * v[:, :, j] for n, j in enumerate(visible))
    return y


def make(T=16, attention='softmax', **kw):
    return build_layer(attention, T, n_head=4, **kw)


qkv = partial(shared_qkv, H=4)  # conftest's q, k, v at this file's head shape


@pytest.mark.parametrize('T,window,causal', [(13, 0, True), (13, 0, False), (13, 4, True), (16, 4, True),
                                             (5, 8, True), (17, 1, True)])
def test_softmax_matches_reference(T, window, causal):
    attn = make(T, window=window, causal=causal)
    q, k, v = qkv(T)
    ref = softmax_reference(q, k, v, causal, window)
    g = torch.randn_like(ref)
    grads_ref = torch.autograd.grad(ref, (q, k, v), g)
    for attend in (attn.attend, attn.attend_fused):  # the formula as tensor ops, and SDPA / the band
        y = attend(q, k, v)
        torch.testing.assert_close(y, ref, atol=1e-10, rtol=1e-10)
        for a, b in zip(torch.autograd.grad(y, (q, k, v), g), grads_ref):
            torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize('T,window,causal', [(13, 0, True), (13, 0, False), (13, 4, True), (70, 16, True),
                                             (5, 8, True), (17, 1, True)])
@pytest.mark.parametrize('attention', ['softmax', 'attentionx'])
def test_the_formula_as_tensor_ops_equals_the_fused_path(T, window, causal, attention):
    # SoftmaxAttention.attend written out (T×T scores, mask, softmax, @ v) against SDPA and the band; AttentionX
    # subtracts it from v, with its masked diagonal too in a ViT
    kw = dict(window=window, causal=causal, attention=attention, attnx_gamma=3.0,
              attnx_mask_diagonal=attention == 'attentionx' and not causal)
    attn = make(T, **kw)
    q, k, v = qkv(T)
    fused = attn.attend_fused(q, k, v)
    explicit = attn.attend(q, k, v)
    torch.testing.assert_close(explicit, fused, atol=1e-12, rtol=1e-12)
    g = torch.randn_like(fused)
    for a, b in zip(torch.autograd.grad(explicit, (q, k, v), g), torch.autograd.grad(fused, (q, k, v), g)):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize('C,P', [(16, 16), (4, 16), (16, 32)])
def test_band_layout_is_linear_in_T(C, P):
    # the band holds C+P keys per chunk of C queries: (1 + P/C)·T keys in all, never T*T
    T = 1000
    x = torch.randn(1, 1, T, 4)
    n = math.ceil(T / C)
    assert band_keys(x, C, P).shape == (1, 1, n, C + P, 4)
    assert band_queries(x, C).shape == (1, 1, n, C, 4)
    assert band_mask(sliding_window_mask(P), T, C, P, torch.device('cpu')).shape == (n, C, C + P)
    torch.testing.assert_close(unband(band_queries(x, C), T), x)
    # band slot s of chunk c is key c*C - P + s (zero before the sequence)
    keys = torch.arange(1, T + 1, dtype=torch.float32).view(1, 1, T, 1)
    for c, s in [(5, 3), (0, P - 1), (0, P), (n - 1, C + P - 1), (7, C + P - 1)]:
        position = c * C - P + s
        assert band_keys(keys, C, P)[0, 0, c, s, 0].item() == (position + 1 if 0 <= position < T else 0)


@pytest.mark.parametrize('T,window', [(23, 5), (23, 3), (200, 100), (50, 64), (130, 70)])
def test_band_mask_and_strip_are_exactly_the_window(T, window):
    W, C, P = band_layout(window, T)
    assert W == min(window, T) and P >= W and P % C == 0
    mask = band_mask(sliding_window_mask(W), T, C, P, torch.device('cpu'))
    for c in range(mask.size(0)):
        for r in range(C):
            i = c * C + r
            visible = [s for s in range(C + P) if 0 <= c * C - P + s <= i and i - (c * C - P + s) < window]
            assert mask[c, r].nonzero().flatten().tolist() == visible
    strip = band_strip(mask, W)  # (n, C, W): the slots of keys i-W+1 .. i
    assert torch.equal(strip.sum(-1), mask.sum(-1))  # every visible slot is in the strip


def test_topk_boundary_sits_between_the_kth_and_the_next_on_either_route():
    x = torch.tensor([[3.0, -1.0, 7.0, 5.0], [float('-inf'), 2.0, float('-inf'), float('-inf')]])
    for dtype in (torch.float64, torch.bfloat16):  # NumPy's selection on the CPU; torch's topk elsewhere (bf16 here)
        assert topk_boundary(x.to(dtype), 2).flatten().tolist() == [4.0, float('-inf')]  # row 2: keep its only key
        assert topk_boundary(x.to(dtype), 1).flatten().tolist() == [6.0, float('-inf')]
        assert topk_boundary(x.to(dtype), 4).flatten().tolist() == [float('-inf')] * 2  # k >= n: keep every key
    y = torch.randn(6, 37, dtype=torch.float64)
    top = y.topk(12, -1).values
    torch.testing.assert_close(topk_boundary(y, 11), (top[:, 10:11] + top[:, 11:12]) / 2)


def test_rope_preserves_norm_and_depends_on_offsets_only():
    rope = Rotary(8, 32).double()
    q = torch.randn(1, 1, 1, 8, dtype=torch.float64).expand(1, 1, 32, 8)
    k = torch.randn(1, 1, 1, 8, dtype=torch.float64).expand(1, 1, 32, 8)
    rq, rk = rope(q), rope(k)
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1))
    dots = (rq[0, 0, :, None] * rk[0, 0, None, :]).sum(-1)  # (32, 32): position i against position j
    # same offset 3, same score, up to the float32 precision of the sin/cos tables (a random pair missed 1e-7)
    torch.testing.assert_close(dots[10, 7], dots[25, 22], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(dots[10, 7], dots[10, 9])


@pytest.mark.parametrize('window,causal', [(0, True), (0, False), (8, True), (5, True)])
def test_flex_forward_equals_math(window, causal):
    T = 200  # not a multiple of the flex block size (128)
    attn = make(T, window=window, causal=causal).float()
    q, k, v = (t.detach().float() for t in qkv(T))
    with torch.no_grad():
        torch.testing.assert_close(attn.attend_flex(q, k, v), attn.attend(q, k, v), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('kw', [dict(), dict(window=4), dict(pos_emb='rope'), dict(window=4, pos_emb='rope')])
def test_gpt_is_causal(kw):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=24, vocab_size=11, **kw)).eval()
    assert_causal(model, T=24, cut=15)


def test_unknown_attention_lists_valid_names():
    with pytest.raises(ValueError, match="unknown attention 'nope'; valid: .*softmax"):
        make(attention='nope')
    assert 'softmax' in ATTENTION


def test_bad_window():
    with pytest.raises(ValueError, match='window'):
        make(window=-1)
    with pytest.raises(ValueError, match='causal'):
        make(window=4, causal=False)
