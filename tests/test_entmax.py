"""Entmax attention against a slow reference written straight from the definition (docs/rules.md#entmax): per row,
the visible scores, the support found by trying every support size (1.5: τ in closed form; other α: τ by a
float64 bisection of its own), p_j = [(α-1)s_j - τ]₊^(1/(α-1)). Float64, forward and gradients (q, k, v): the
reference's gradients come from autograd through τ on the fixed support (1.5: the closed form; other α: one Newton
step, whose derivative at the root is the implicit function's). Also the `entmax` package, where installed."""
import math

import pytest
import torch

from rules import AttentionConfig, build_attention
from rules.entmax import EntmaxFunction
from conftest import assert_causal, build_layer
from model import GPT, GPTConfig


def tau_15(z):
    """1.5-entmax's threshold of the visible z = s/2 (1-D): the support size k whose closed-form τ (the smaller
    root of Σ_{top k} (z - τ)² = 1) lies below the k-th largest z and at or above the (k+1)-th."""
    zs = torch.sort(z, descending=True).values
    for k in range(1, len(zs) + 1):
        top = zs[:k]
        mean = top.mean()
        disc = mean * mean - ((top * top).sum() - 1) / k
        if disc < 0:
            continue
        tau = mean - disc.sqrt()
        if tau < zs[k - 1] and (k == len(zs) or tau >= zs[k]):
            return tau
    raise AssertionError('no support size fits')


def tau_bisect(z, alpha):
    """α-entmax's threshold of the visible z = (α-1)s (1-D): Σ [z - τ]₊^(1/(α-1)) = 1 solved by bisection to the
    last bit of a float64, then attached to z by one Newton step on the fixed support (value unchanged, gradient
    the implicit function's)."""
    lo, hi = z.max().item() - 1.0, z.max().item()
    total = lambda t: ((z.detach() - t).clamp_min(0) ** (1 / (alpha - 1))).sum().item()
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if total(mid) >= 1 else (lo, mid)
    tau = torch.tensor(lo, dtype=z.dtype)
    excess = z[z.detach() > lo] - tau                                     # the support's
    F = (excess ** (1 / (alpha - 1))).sum() - 1                            # 0 at τ, up to rounding
    dF = -(excess ** (1 / (alpha - 1) - 1)).sum() / (alpha - 1)
    return tau - F / dF


def entmax_reference(q, k, v, alpha, causal):
    """y_i = Σ_j p_ij v_j, p_i = α-entmax(q_i·k_j/√D over the visible j); and the weights (B, H, T, T)."""
    B, H, T, D = q.shape
    rows_y, rows_w = [], []
    for b in range(B):
        for h in range(H):
            for i in range(T):
                js = list(range(i + 1)) if causal else list(range(T))
                s = (q[b, h, i] * k[b, h, js]).sum(-1) / math.sqrt(D)        # (J,)
                z = (alpha - 1) * s
                tau = tau_15(z) if alpha == 1.5 else tau_bisect(z, alpha)
                p = (z - tau).clamp_min(0) ** (1 / (alpha - 1))
                rows_y.append((p.unsqueeze(-1) * v[b, h, js]).sum(0))
                rows_w.append(torch.cat([p, p.new_zeros(T - len(js))]))
    return torch.stack(rows_y).view(B, H, T, D), torch.stack(rows_w).view(B, H, T, T).detach()


def make(T, **kw):
    return build_layer('entmax', T, **kw)


def inputs(T, B=2, H=3, D=8, seed=0, scale=1.5):
    g = torch.Generator().manual_seed(seed)
    return [(scale * torch.randn(B, H, T, D, generator=g, dtype=torch.float64)).requires_grad_() for _ in range(3)]


# (T, queries per tile, causal, α): T below, at and not a multiple of the tile; α = 1.5 (sort), others (bisection)
CASES = [(13, 4, True, 1.5), (16, 16, True, 1.5), (11, 3, False, 1.5), (12, 5, True, 1.3), (9, 4, False, 2.0),
         (10, 64, True, 3.0)]


@pytest.mark.parametrize('T,tile,causal,alpha', CASES)
def test_matches_reference(T, tile, causal, alpha):
    attn = make(T, causal=causal, entmax_alpha=alpha, tile_weights=tile * T)
    q, k, v = inputs(T)
    ref, ref_weights = entmax_reference(q, k, v, alpha, causal)
    weights = attn.attention_weights(q, k, v)
    torch.testing.assert_close(weights, ref_weights, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:3], dtype=torch.float64), atol=1e-12, rtol=0)
    visible = torch.ones(T, T).tril().bool() if causal else torch.ones(T, T).bool()
    assert (weights[..., ~visible] == 0).all()                           # hidden keys: exactly 0
    zero = (weights == 0)[..., visible].double().mean().item()
    assert 0.2 < zero < 0.9, zero  # some visible keys are cut, many are kept: both sides of τ are tested
    g = torch.randn_like(ref)
    grads_ref = torch.autograd.grad(ref, (q, k, v), g)
    for path in (attn.attend_reference, attn.attend):  # the formula as code (every pair at once), the math path
        y = path(q, k, v)
        torch.testing.assert_close(y, ref, atol=1e-10, rtol=1e-10, msg=path.__name__)
        for name, a, b in zip('qkv', torch.autograd.grad(y, (q, k, v), g), grads_ref):
            assert b.abs().sum() > 0, name  # the reference gradient is not trivially zero
            torch.testing.assert_close(a, b, atol=1e-8, rtol=1e-8, msg=f'{path.__name__}: gradient of {name}')


@pytest.mark.parametrize('alpha', [1.5, 1.25, 2.0])
def test_function_gradcheck(alpha):
    # the Jacobian in backward against finite differences of the forward, -inf (hidden) entries included
    s = torch.randn(3, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 2
    hidden = torch.zeros(3, 9, dtype=torch.bool)
    hidden[0, 5:] = True
    s = s.masked_fill(hidden, float('-inf')).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: EntmaxFunction.apply(x, alpha, 60), (s,), atol=1e-6)


def test_a_support_of_one_has_a_zero_jacobian():
    s = torch.tensor([[4.0, 1.0, 0.5, -1.0], [0.3, 0.2, 0.1, 0.0]], dtype=torch.float64, requires_grad=True)
    p = EntmaxFunction.apply(s, 1.5, 50)
    assert torch.equal(p[0], torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64))  # s/2 gap of 1.5 > 1
    grad, = torch.autograd.grad(p, s, torch.randn(2, 4, dtype=torch.float64))
    assert torch.equal(grad[0], torch.zeros(4, dtype=torch.float64)) and grad[1].abs().sum() > 0


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_half_precision_scores_are_solved_in_float32(dtype):
    # scores ~1e3: Σ z² over a row would overflow float16 (65504); the threshold is solved in float32 from the
    # 16-bit scores, exactly as from those same scores cast up by hand
    attn = make(20).float()
    q, k, _ = (t.detach().to(dtype) * 30 for t in inputs(20))
    with torch.no_grad():
        low = attn.row_weights(q, k)
        by_hand = EntmaxFunction.apply((q @ k.transpose(-1, -2) / math.sqrt(8)).float(), 1.5, 50)
    assert low.dtype == torch.float32 and torch.isfinite(low).all()
    assert torch.equal(low, by_hand)
    torch.testing.assert_close(low.sum(-1), torch.ones(low.shape[:3]), atol=1e-5, rtol=0)
    assert (low == 0).any()


def test_matches_the_entmax_package():
    entmax = pytest.importorskip('entmax')
    T = 30
    q, k, v = (t.detach() for t in inputs(T, scale=2.0))
    scores = (q @ k.transpose(-1, -2) / math.sqrt(8)).masked_fill(~torch.ones(T, T).tril().bool(), float('-inf'))
    for alpha, theirs in [(1.5, entmax.entmax15(scores, dim=-1)),
                          (1.3, entmax.entmax_bisect(scores, 1.3, dim=-1, n_iter=50)),
                          (2.0, entmax.sparsemax(scores, dim=-1))]:
        ours = make(T, entmax_alpha=alpha, tile_weights=7 * T).attention_weights(q, k, v)
        torch.testing.assert_close(ours, theirs, atol=1e-12, rtol=0, msg=f'alpha={alpha}')


def test_saves_no_tile_of_weights_for_backward():
    T, tile = 128, 16
    attn = make(T, tile_weights=tile * T)
    q, k, v = inputs(T)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        attn.attend(q, k, v).sum().backward()
    B, H, _, D = q.shape
    assert max(saved, default=0) <= B * H * T * D < B * H * tile * T  # no tile × T weights, let alone T × T


@pytest.mark.parametrize('kw', [dict(pos_emb='rope'), dict(pos_emb='learned', entmax_alpha=1.7)])
def test_gpt_is_causal(kw):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=40, vocab_size=11, attention='entmax',
                          tile_weights=8 * 40, **kw)).eval()
    assert_causal(model, T=40, cut=21)


def test_cached_decode_with_bisection_equals_the_forward():
    # tests/test_generate.py runs the default α = 1.5; this is the bisection's decode
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=32, vocab_size=11, attention='entmax',
                          entmax_alpha=1.3, pos_emb='rope')).double().eval()
    idx = torch.randint(0, 11, (2, 30), generator=torch.Generator().manual_seed(1))
    cache = model.new_cache(2)
    with torch.no_grad():
        model(idx[:, :10], cache=cache)
        for t in range(10, 30):
            logits, _ = model(idx[:, t:t + 1], cache=cache)
            torch.testing.assert_close(logits, model(idx[:, :t + 1])[0], atol=1e-10, rtol=0)


@pytest.mark.parametrize('kw,match', [
    (dict(entmax_alpha=1.0), 'entmax_alpha must be a finite number > 1'),
    (dict(entmax_alpha=0.5), 'entmax_alpha must be a finite number > 1'),
    (dict(entmax_alpha=float('inf')), 'entmax_alpha must be a finite number > 1'),
    (dict(entmax_alpha=float('nan')), 'entmax_alpha must be a finite number > 1'),
    (dict(entmax_iters=0), 'entmax_iters must be >= 1'),
    (dict(tile_weights=0), 'tile_weights must be >= 1'),
])
def test_bad_settings_fail_at_construction(kw, match):
    with pytest.raises(ValueError, match=match):
        build_attention(AttentionConfig(n_embd=24, n_head=3, attention='entmax', **kw), 0)
