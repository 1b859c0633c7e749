"""Diff attention (docs/rules.md#diff) against a slow reference written straight from the paper's formula and the
official code's layout: the layer's input x through c_attn by hand, differential head h's q1, q2 (and k1, k2) the
d-wide slices 2h, 2h+1 and its value the 2d-wide slice h, two softmaxes per row, λ from its four vectors, the
RMSNorm × (1 - λ_init), then c_proj. Float64, forward and gradients (x, c_attn, c_proj, λq1, λk1, λq2, λk2, the
norm weight), on the math and SDPA paths; flex, SDPA and the cache against the math path."""
import math

import pytest
import torch

from rules import AttentionConfig, build_attention
from rules.diff import pair_heads
from conftest import ROOT, assert_causal, build_layer
from model import GPT, GPTConfig

C, H = 16, 4  # the frame's heads: H/2 differential heads, q1, k1, q2, k2 of d = C/H, a value of 2d


def diff_reference(x, attn, lambda_init, visible):
    """c_proj(concat_h (1 - λ_init)·RMSNorm(Σ_j (softmax(q1_i·k1_j/√d) - λ softmax(q2_i·k2_j/√d)) v_j)), j visible."""
    W, b, H, d = attn.c_attn.weight, attn.c_attn.bias, attn.n_head, attn.head_dim
    q, k, v = (x @ W[n * C:(n + 1) * C].T + b[n * C:(n + 1) * C] for n in range(3))   # (B, T, C) each
    lam = torch.exp(attn.lambda_q1 @ attn.lambda_k1) - torch.exp(attn.lambda_q2 @ attn.lambda_k2) + lambda_init
    B, T, _ = x.shape
    rows = []
    for i in range(T):
        js = visible(i)
        heads = []
        for h in range(H // 2):
            one, two, value = slice(2 * h * d, (2 * h + 1) * d), slice((2 * h + 1) * d, (2 * h + 2) * d), \
                slice(2 * h * d, (2 * h + 2) * d)
            maps = []
            for view in (one, two):
                scores = torch.stack([(q[:, i, view] * k[:, j, view]).sum(-1) / math.sqrt(d) for j in js], -1)
                e = torch.exp(scores - scores.max(-1, keepdim=True).values)
                maps.append(e / e.sum(-1, keepdim=True))                                 # (B, J)
            y = sum((maps[0][:, n:n + 1] - lam * maps[1][:, n:n + 1]) * v[:, j, value] for n, j in enumerate(js))
            o = y / torch.sqrt((y * y).mean(-1, keepdim=True) + 1e-5) * attn.head_norm.weight * (1 - lambda_init)
            heads.append(o)                                                              # (B, 2d)
        rows.append(torch.cat(heads, -1))
    return attn.c_proj(torch.stack(rows, 1))


def make(T=11, layer_idx=0, **kw):
    torch.manual_seed(0)
    attn = build_layer('diff', T, layer_idx, **{**dict(n_head=H, n_embd=C), **kw})  # n_embd C whatever n_head
    with torch.no_grad():  # everything away from its init: λ = 0.2 + (e^a - e^b) far from λ_init, a norm weight ≠ 1
        attn.c_attn.weight.normal_(0, 0.4)
        attn.c_attn.bias.normal_(0, 0.2)
        attn.c_proj.bias.normal_(0, 0.2)
        ramp = torch.linspace(-0.6, 0.6, attn.head_dim, dtype=torch.float64)
        for n, name in enumerate(['lambda_q1', 'lambda_k1', 'lambda_q2', 'lambda_k2']):
            getattr(attn, name).copy_(ramp.roll(n) * (1 + 0.5 * n))
        attn.head_norm.weight.copy_(torch.linspace(0.5, 1.5, 2 * attn.head_dim, dtype=torch.float64))
    return attn


def schedule(layer):  # the paper's λ_init at 0-based layer l (its l - 1 with l from 1)
    return 0.8 - 0.6 * math.exp(-0.3 * layer)


CASES = [  # (keys, layer, λ_init, which keys query i sees)
    (dict(), 0, 0.2, lambda i: list(range(i + 1))),
    (dict(), 3, schedule(3), lambda i: list(range(i + 1))),
    (dict(diff_lambda_init=0.5), 3, 0.5, lambda i: list(range(i + 1))),
    (dict(causal=False), 1, schedule(1), lambda i: list(range(11))),
    (dict(n_head=2), 2, schedule(2), lambda i: list(range(i + 1))),  # one differential head, d = 8
]


@pytest.mark.parametrize('kw,layer,lambda_init,visible', CASES)
@pytest.mark.parametrize('fused', [True, False])  # forward's two SDPA calls, and the math path
def test_matches_reference(kw, layer, lambda_init, visible, fused):
    attn = make(layer_idx=layer, **kw)
    attn.fused = fused
    assert attn.lambda_init == pytest.approx(lambda_init, abs=1e-15)
    x = torch.randn(2, 11, C, dtype=torch.float64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    y, ref = attn(x), diff_reference(x, attn, lambda_init, visible)
    torch.testing.assert_close(y, ref, atol=1e-12, rtol=1e-10)
    own = {'x': x, **dict(attn.named_parameters())}
    assert {'lambda_q1', 'lambda_k1', 'lambda_q2', 'lambda_k2', 'head_norm.weight'} <= set(own)
    g = torch.randn_like(y)
    grads = torch.autograd.grad(y, list(own.values()), g, retain_graph=True)
    for name, a, b in zip(own, grads, torch.autograd.grad(ref, list(own.values()), g)):
        assert b.abs().sum() > 0, name  # the reference gradient is not trivially zero
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10, msg=f'gradient of {name}')


def test_initial_values():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=4, n_head=2, n_embd=512, block_size=8, vocab_size=11, attention='diff'))
    for layer, block in enumerate(model.transformer.h):
        attn = block.attn
        assert attn.lambda_init == pytest.approx(schedule(layer))  # 0.2, 0.356, 0.471, 0.556
        assert torch.equal(attn.head_norm.weight, torch.ones(512)) and attn.head_norm.eps == 1e-5
        lambdas = torch.stack([attn.lambda_q1, attn.lambda_k1, attn.lambda_q2, attn.lambda_k2])
        assert lambdas.shape == (4, 256) and 0.09 < lambdas.std().item() < 0.11 and abs(lambdas.mean()) < 0.02
    fixed = build_attention(AttentionConfig(n_embd=16, n_head=4, attention='diff', diff_lambda_init=0.8), 7)
    assert fixed.lambda_init == 0.8


def test_parameters_are_softmax_s_plus_the_lambdas_and_the_norm():
    def count(**kw):
        return sum(p.numel() for p in build_attention(AttentionConfig(**kw), 0).parameters())
    for n_embd, n_head in [(C, H), (24, 2), (768, 12)]:  # the last: GPT-2-162M's layer, 4·64 + 128 = 384 more
        extra = count(attention='diff', n_embd=n_embd, n_head=n_head) - count(attention='softmax', n_embd=n_embd,
                                                                               n_head=n_head)
        assert extra == 4 * (n_embd // n_head) + 2 * (n_embd // n_head)


@pytest.mark.parametrize('kw', [dict(pos_emb='rope'), dict(pos_emb='learned')])
def test_gpt_is_causal(kw):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=16, block_size=40, vocab_size=11, attention='diff', **kw)).eval()
    assert_causal(model, T=40, cut=21)


@pytest.mark.parametrize('kw', [dict(), dict(causal=False)])
def test_every_path_gives_the_same(kw):
    T = 150  # not a multiple of flex's 128-token block
    attn = make(T, layer_idx=2, **kw).eval()
    with torch.no_grad():
        tensors = attn.project(torch.randn(2, T, C, dtype=torch.float64))
        y = attn.attend(*tensors)
        for other in (attn.attend_fused, attn.attend_flex):
            torch.testing.assert_close(other(*tensors), y, atol=1e-12, rtol=1e-10)


def test_decode_equals_the_forward_token_by_token():
    attn = make(30, layer_idx=1).eval()
    q, k, v = attn.project(torch.randn(2, 30, C, dtype=torch.float64))
    with torch.no_grad():
        cache = attn.new_cache()
        attn.fill(cache, q[:, :, :7], k[:, :, :7], v[:, :, :7])
        steps = [attn.decode(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], cache=cache) for t in range(7, 30)]
        torch.testing.assert_close(torch.cat(steps, 2), attn.attend(q, k, v)[:, :, 7:], atol=1e-12, rtol=1e-10)
    assert cache.pos == 30


def test_attention_weights_are_signed_and_give_the_output():
    attn = make(20, layer_idx=0).eval()
    q, k, v = attn.project(torch.randn(2, 20, C, dtype=torch.float64))
    w = attn.attention_weights(q, k, v)  # (B, H, T, T): each pair's W twice
    lam = attn.lam().item()
    assert w.shape == (2, H, 20, 20) and (w.triu(1) == 0).all() and (w < 0).any() and attn.weights_note
    assert torch.equal(w[:, 0::2], w[:, 1::2])
    torch.testing.assert_close(w.sum(-1), torch.full((2, H, 20), 1 - lam, dtype=torch.float64))
    with torch.no_grad():
        torch.testing.assert_close(attn.norm_and_unpair(w[:, 0::2] @ pair_heads(v)), attn.attend(q, k, v))


def test_bad_settings_fail_at_construction():
    with pytest.raises(ValueError, match='diff needs an even n_head'):
        make(n_embd=18, n_head=3)
    for value in (1.0, -0.1, 1.5, float('nan'), float('inf')):
        with pytest.raises(ValueError, match=r'diff_lambda_init must be in \[0, 1\)'):
            make(diff_lambda_init=value)


def test_config_is_the_tda_table_row():
    scope = {'__file__': str(ROOT / 'config' / 'diff_gpt.py')}
    exec(open(scope['__file__']).read(), scope)
    tda = {'__file__': str(ROOT / 'config' / 'tda_gpt.py')}
    exec(open(tda['__file__']).read(), tda)
    assert scope['attention'] == 'diff' and scope['diff_lambda_init'] == 0.0 and scope['out_dir'] == 'out-diff-gpt'
    assert scope['n_head'] % 2 == 0
    for key in ('n_layer', 'n_head', 'n_embd', 'pos_emb', 'tie_weights', 'dataset', 'learning_rate', 'max_iters'):
        assert scope[key] == tda[key], key
