"""SSMax against a slow reference written straight from the formula (docs/rules.md#ssmax): per row, n = the keys it
sees, the logits s_h·log n · q·k/√D, a softmax. Float64, forward and gradients (q, k, v and s, different per head),
on the math path and on SDPA's; then causality, flex (forward, and a backward through eager flex), the cache's
absolute positions, the optimizer group of s, and bad settings."""
import math

import pytest
import torch

from rules import AttentionConfig, build_attention
from conftest import assert_causal, build_layer, cached_generation_equals_the_forward, qkv
from model import GPT, GPTConfig, configure_adamw

S = [0.3, 0.9, 1.7]  # s per head, away from the initial value, so a mix-up of heads would show


def ssmax_reference(q, k, v, s, visible):
    """y_i = Σ_j softmax_j((s_h·log n_i)·q_i·k_j/√D) v_j over the visible j, n_i = how many there are."""
    B, H, T, D = q.shape
    rows = []
    for i in range(T):
        js = visible(i)
        per_head = []
        for h in range(H):
            logits = torch.stack([s[h] * math.log(len(js)) * (q[:, h, i] * k[:, h, j]).sum(-1) / math.sqrt(D)
                                  for j in js], -1)                                    # (B, J)
            weights = torch.softmax(logits, -1)
            per_head.append(sum(weights[:, n, None] * v[:, h, j] for n, j in enumerate(js)))  # (B, D)
        rows.append(torch.stack(per_head, 1))                                          # (B, H, D)
    return torch.stack(rows, 2)                                                        # (B, H, T, D)


def make(T, s=S, **kw):
    attn = build_layer('ssmax', T, n_head=len(s), **kw)
    with torch.no_grad():
        attn.scale.copy_(torch.tensor(s, dtype=torch.float64))
    return attn


@pytest.mark.parametrize('T,kw', [(13, dict()), (21, dict(causal=False)), (17, dict(window=5)), (1, dict())])
@pytest.mark.parametrize('path', ['attend', 'attend_fused'])
def test_matches_reference(T, kw, path):
    attn = make(T, **kw)
    W = kw.get('window', 0)
    visible = (lambda i: list(range(T))) if not kw.get('causal', True) else \
        (lambda i: [j for j in range(i + 1) if not W or i - j < W])
    q, k, v = qkv(T)
    y = getattr(attn, path)(q, k, v)
    ref = ssmax_reference(q, k, v, attn.scale, visible)
    torch.testing.assert_close(y, ref, atol=1e-10, rtol=1e-10)
    g = torch.randn_like(y)
    wrt = (q, k, v, attn.scale)
    for name, a, b in zip(['q', 'k', 'v', 'scale'], torch.autograd.grad(y, wrt, g), torch.autograd.grad(ref, wrt, g)):
        if T > 1 or name == 'v':  # (one token: n = 1, log n = 0, y = v whatever q, k and s are)
            assert b.abs().sum() > 0, name  # the reference gradient is not trivially zero
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10, msg=f'gradient of {name}')


def test_first_row_is_its_value_and_scale_starts_at_ssmax_s():
    attn = build_attention(AttentionConfig(n_embd=24, n_head=3, block_size=8, attention='ssmax', ssmax_s=0.7), 0)
    assert attn.scale.shape == (3,) and torch.equal(attn.scale, torch.full((3,), 0.7))
    q, k, v = (t.float() for t in qkv(8))
    torch.testing.assert_close(attn.attend(q, k, v)[:, :, 0], v[:, :, 0])  # n = 1: log 1 = 0, its one key


@pytest.mark.parametrize('kw', [dict(), dict(pos_emb='rope', window=6)])
def test_gpt_is_causal(kw):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=40, vocab_size=11, attention='ssmax',
                          **kw)).eval()
    assert_causal(model, T=40, cut=21)


@pytest.mark.parametrize('T,kw', [(150, dict()), (65, dict(causal=False)), (100, dict(window=24))])
def test_flex_forward_equals_math(T, kw):
    attn = make(T, **kw).float()
    q, k, v = (t.detach().float() for t in qkv(T))
    with torch.no_grad():
        torch.testing.assert_close(attn.attend_flex(q, k, v), attn.attend(q, k, v), atol=1e-5, rtol=1e-5)


def test_flex_backward_on_cpu_through_eager_flex(eager_flex_backward):
    # s reaches flex through the scaled queries, not a score_mod: its gradient through eager flex's reference
    # backward equals the math path's
    attn = make(50)
    tensors = qkv(50)
    grads = []
    for attend in (attn.attend, attn.attend_flex):
        y = attend(*tensors)
        grads.append(torch.autograd.grad(y, tensors + [attn.scale], torch.ones_like(y)))
    assert grads[0][3].abs().sum() > 0
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-8, rtol=1e-8)


@pytest.mark.parametrize('kw', [dict(), dict(window=8)])
def test_cached_generation_uses_absolute_positions(kw):
    # n of a decoded token is its absolute position + 1 (min W with a window): the cached logits equal the full
    # forward's at every step, s different per head
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=32, vocab_size=11, bias=False, pos_emb='rope',
                          attention='ssmax', **kw)).double().eval()
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.scale.copy_(torch.tensor([0.4, 2.0], dtype=torch.float64))
    prompt = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(1))
    cached_generation_equals_the_forward(model, prompt, 40)


def test_scale_is_learned_and_not_decayed():
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=11, attention='ssmax'))
    scale = model.transformer.h[0].attn.scale
    optimizer = configure_adamw(model, 0.1, 1e-3, (0.9, 0.95), 'cpu')
    group, = [g for g in optimizer.param_groups if any(p is scale for p in g['params'])]
    assert group['weight_decay'] == 0.0
    idx = torch.randint(0, 11, (2, 16))
    model(idx, idx)[1].backward()
    assert scale.grad is not None and (scale.grad != 0).all()


@pytest.mark.parametrize('value', [0.0, -0.5, float('nan'), float('inf')])
def test_bad_settings_fail_at_construction(value):
    with pytest.raises(ValueError, match='ssmax_s must be a finite number > 0'):
        build_attention(AttentionConfig(n_embd=24, n_head=3, attention='ssmax', ssmax_s=value), 0)


def test_window_needs_causal():
    with pytest.raises(ValueError, match='window .* needs causal=True'):
        build_attention(AttentionConfig(n_embd=24, n_head=3, attention='ssmax', window=4, causal=False), 0)
