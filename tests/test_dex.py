"""DEX against a slow reference written straight from the formula (docs/rules.md#dex): per head and query, softmax
over the visible keys, O_i = Σ_j a_ij v_j, then y_i = O_i - λ_h W_h O_i on the selected (last dex_heads) heads and
y_i = O_i on the others. Float64, forward and gradients (q, k, v, λ's logits, f_D's W), with λ and W different per
head, away from their initial values."""
import math
from functools import partial

import pytest
import torch

from attention import SoftmaxAttention
from rules import AttentionConfig, build_attention
from conftest import ROOT, assert_causal, build_layer
from conftest import qkv as shared_qkv
from model import GPT, GPTConfig

H, D = 4, 8


def dex_reference(q, k, v, lam, W, first, visible):
    """One head and one query at a time: the softmax-weighted sum of the visible values, then its differential step."""
    B, _, T, _ = q.shape
    heads = []
    for h in range(H):
        rows = []
        for i in range(T):
            js = visible(i)
            scores = torch.stack([(q[:, h, i] * k[:, h, j]).sum(-1) / math.sqrt(D) for j in js], -1)  # (B, n)
            o = sum(w[:, None] * v[:, h, j] for w, j in zip(scores.softmax(-1).unbind(-1), js))     # (B, D)
            if h >= first:
                o = o - lam[h - first] * torch.einsum('de,be->bd', W[h - first], o)  # O - λ_h W_h O
            rows.append(o)
        heads.append(torch.stack(rows, 1))  # (B, T, D)
    return torch.stack(heads, 1)            # (B, H, T, D)


def make(T, **kw):
    attn = build_layer('dex', T, n_head=H, head_dim=D, **kw)
    n = attn.lambda_logit.numel()
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():  # per head, and away from the initial values
        attn.lambda_logit.copy_(torch.linspace(-1.5, 1.0, n, dtype=torch.float64))
        attn.f_d.copy_(torch.randn(n, D, D, generator=g, dtype=torch.float64) / math.sqrt(D))
    return attn


qkv = partial(shared_qkv, H=H, D=D)  # conftest's q, k, v at this file's head shape


def visible_keys(T, causal, window):
    return lambda i: [j for j in range(T) if (not causal or j <= i) and (not window or i - j < window)]


@pytest.mark.parametrize('T,causal,window,heads', [
    (13, True, 0, 0),     # the GPT form, half the heads (2 of 4)
    (13, False, 0, 1),    # bidirectional, one head
    (11, True, 0, 4),     # every head
    (17, True, 4, 3),     # the sliding window comes with SoftmaxAttention's paths (the band past T > W)
], ids=['causal-half', 'bidirectional-one', 'causal-all', 'window'])
def test_matches_reference(T, causal, window, heads):
    attn = make(T, causal=causal, window=window, dex_heads=heads)
    first = H - (heads or H // 2)
    assert attn.first_head == first and attn.f_d.shape == (H - first, D, D)
    q, k, v = qkv(T)
    params = (attn.lambda_logit, attn.f_d)
    ref = dex_reference(q, k, v, torch.sigmoid(attn.lambda_logit), attn.f_d, first, visible_keys(T, causal, window))
    g = torch.randn_like(ref)
    grads_ref = torch.autograd.grad(ref, (q, k, v, *params), g)
    for attend in (attn.attend, attn.attend_fused):  # the formula as tensor ops, and SDPA / the band
        y = attend(q, k, v)
        torch.testing.assert_close(y, ref, atol=1e-12, rtol=1e-10)
        grads = torch.autograd.grad(y, (q, k, v, *params), g)
        for name, a, b in zip(['q', 'k', 'v', 'lambda_logit', 'f_d'], grads, grads_ref):
            assert b.abs().sum() > 0, name  # the reference gradient is not trivially zero
            torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10, msg=f'gradient of {name}')
    if first:  # the heads without the step are softmax's exactly
        torch.testing.assert_close(attn.attend(q, k, v)[:, :first], SoftmaxAttention.attend(attn, q, k, v)[:, :first],
                                   atol=0, rtol=0)


def test_initial_values():
    # zero f_D: softmax at step 0; identity f_D: (1 - λ)·O on the chosen heads; λ from dex_lambda on every such head
    q, k, v = qkv(9)
    softmax = build_attention(AttentionConfig(n_embd=H * D, n_head=H, block_size=9), 0).double()
    o = softmax.attend(q, k, v)
    zero = build_attention(AttentionConfig(n_embd=H * D, n_head=H, block_size=9, attention='dex'), 0).double()
    assert torch.equal(zero.f_d, torch.zeros(2, D, D, dtype=torch.float64))
    torch.testing.assert_close(torch.sigmoid(zero.lambda_logit), torch.full((2,), 0.1, dtype=torch.float64))
    torch.testing.assert_close(zero.attend(q, k, v), o, atol=0, rtol=0)
    eye = build_attention(AttentionConfig(n_embd=H * D, n_head=H, block_size=9, attention='dex', dex_heads=3,
                                          dex_lambda=0.25, dex_init='identity'), 0).double()
    assert torch.equal(eye.f_d, torch.eye(D, dtype=torch.float64).expand(3, D, D))
    lam = torch.sigmoid(eye.lambda_logit).view(1, 3, 1, 1)  # 0.25 up to the float32 its logit was made in
    torch.testing.assert_close(lam.flatten(), torch.full((3,), 0.25, dtype=torch.float64))
    torch.testing.assert_close(eye.attend(q, k, v), torch.cat([o[:, :1], (1 - lam) * o[:, 1:]], 1), atol=1e-14, rtol=0)


@pytest.mark.parametrize('kw', [dict(), dict(dex_heads=2, window=6, pos_emb='rope')])
def test_gpt_is_causal(kw):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=32, block_size=24, vocab_size=11, attention='dex',
                          dex_init='identity', **kw)).eval()
    for block in model.transformer.h:  # a differential step that is not (1 - λ)·O
        with torch.no_grad():
            block.attn.f_d.add_(0.3 * torch.randn_like(block.attn.f_d))
    assert_causal(model, T=24, cut=15)


@pytest.mark.parametrize('kw', [dict(), dict(causal=False), dict(window=40)], ids=['causal', 'bidirectional', 'window'])
def test_flex_forward_equals_math(kw):
    T = 150  # not a multiple of the flex block size (128)
    attn = make(T, **kw).float()
    q, k, v = (t.detach().float() for t in qkv(T))
    with torch.no_grad():
        torch.testing.assert_close(attn.attend_flex(q, k, v), attn.attend(q, k, v), atol=1e-5, rtol=1e-5)


def test_cached_generation_takes_the_step_past_the_window():
    # test_generate.py runs DEX at its initial f_D = 0 (softmax); here the step is on, and the ring wraps
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=32, vocab_size=11, bias=False, pos_emb='rope',
                          attention='dex', dex_heads=1, dex_init='identity', window=8)).double().eval()
    for block in model.transformer.h:
        with torch.no_grad():
            block.attn.f_d.add_(0.5 * torch.randn_like(block.attn.f_d))
    idx = torch.randint(0, 11, (2, 30), generator=torch.Generator().manual_seed(1))
    cache = model.new_cache(2)
    with torch.no_grad():
        logits, _ = model(idx[:, :10], cache=cache)
        for t in range(10, 30):
            torch.testing.assert_close(logits, model(idx[:, :t])[0], atol=1e-10, rtol=0)
            logits, _ = model(idx[:, t:t + 1], cache=cache)


def test_attention_weights_are_the_softmax_weights():
    attn = make(10)
    q, k, v = qkv(10)
    w = attn.attention_weights(q, k, v)
    softmax = build_attention(AttentionConfig(n_embd=H * D, n_head=H, block_size=10), 0).double()
    torch.testing.assert_close(w, softmax.attention_weights(q, k, v), atol=1e-14, rtol=0)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, H, 10, dtype=torch.float64))
    assert attn.weights_note is None  # A is a distribution


def test_parameters_are_learned_and_f_d_not_decayed():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=11, attention='dex',
                          dex_init='identity'))
    attn = model.transformer.h[1].attn
    decay, no_decay = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), 'cpu').param_groups
    for p in (attn.f_d, attn.lambda_logit):
        assert any(p is x for x in no_decay['params']) and not any(p is x for x in decay['params'])
    _, loss = model(torch.randint(0, 11, (2, 16)), torch.randint(0, 11, (2, 16)))
    loss.backward()
    assert (attn.lambda_logit.grad != 0).all() and attn.f_d.grad.abs().sum() > 0


@pytest.mark.parametrize('kw,match', [
    (dict(dex_heads=-1), r'dex_heads must be in \[0, n_head=4\]'), (dict(dex_heads=5), r'dex_heads must be in'),
    (dict(dex_lambda=0.0), r'dex_lambda must be in \(0, 1\)'), (dict(dex_lambda=1.0), 'dex_lambda must be in'),
    (dict(dex_lambda=float('nan')), 'dex_lambda must be in'), (dict(dex_lambda=float('inf')), 'dex_lambda must be in'),
    (dict(dex_init='eye'), "dex_init must be 'zero' or 'identity'"),
])
def test_bad_settings_fail_at_construction(kw, match):
    with pytest.raises(ValueError, match=match):
        build_attention(AttentionConfig(n_embd=H * D, n_head=H, attention='dex', **kw), 0)


def test_config_is_the_tda_table_shape():
    scope = {'__file__': str(ROOT / 'config' / 'dex_gpt.py')}
    exec(open(scope['__file__']).read(), scope)
    expect = dict(dataset='fineweb_edu', n_layer=12, n_head=12, n_embd=768, pos_emb='rope', tie_weights=False,
                  attention='dex', learning_rate=1e-3, min_lr=1e-4, weight_decay=0.1)
    assert {k: scope[k] for k in expect} == expect
    build_attention(AttentionConfig(**{k: scope[k] for k in ('n_embd', 'n_head', 'attention', 'dex_heads',
                                                              'dex_lambda', 'dex_init')}), 0)
