"""Gated attention (docs/rules.md#gated) against a slow reference written straight from the formula: the layer's
input x through c_attn's q, k, v and gate rows by hand, a softmax per row over the visible keys, the head's output
times σ(x W_g), then c_proj. Float64, forward and gradients (x, c_attn's weight and bias, the gate rows among them,
c_proj), elementwise and headwise, on each of softmax's paths."""
import math

import pytest
import torch

from rules import AttentionConfig, build_attention
from conftest import ROOT, assert_causal, build_layer
from model import GPT, GPTConfig

C, H, D = 16, 4, 4


def gated_reference(x, attn, visible, headwise):
    """c_proj(concat_h softmax_j(q_i·k_j/√D over visible(i)) v ⊙ σ(x_i W_g)), every weight read from the layer."""
    W, b = attn.c_attn.weight, attn.c_attn.bias
    proj = lambda rows: x @ W[rows].T + (0 if b is None else b[rows])           # (B, T, len(rows))
    q, k, v, gate = proj(slice(0, C)), proj(slice(C, 2 * C)), proj(slice(2 * C, 3 * C)), proj(slice(3 * C, None))
    B, T, _ = x.shape
    rows = []
    for i in range(T):
        js = visible(i)
        heads = []
        for h in range(H):
            ch = slice(h * D, (h + 1) * D)
            scores = torch.stack([(q[:, i, ch] * k[:, j, ch]).sum(-1) / math.sqrt(D) for j in js], -1)  # (B, J)
            weights = torch.exp(scores - scores.max(-1, keepdim=True).values)
            weights = weights / weights.sum(-1, keepdim=True)
            y = sum(weights[:, n:n + 1] * v[:, j, ch] for n, j in enumerate(js))                    # (B, D)
            g = gate[:, i, h:h + 1] if headwise else gate[:, i, ch]                                   # (B, 1 or D)
            heads.append(y * torch.sigmoid(g))
        rows.append(torch.cat(heads, -1))                                                             # (B, C)
    return attn.c_proj(torch.stack(rows, 1))


def make(T=13, **kw):
    torch.manual_seed(0)
    attn = build_layer('gated', T, n_head=H, head_dim=D, **kw)
    with torch.no_grad():  # weights away from N(0, 0.02): gates far from 1/2 and different per head and channel
        attn.c_attn.weight.normal_(0, 0.4)
        if attn.c_attn.bias is not None:
            attn.c_attn.bias.normal_(0, 0.3)
    return attn


CASES = [  # (keys, which keys query i sees)
    (dict(), lambda i: list(range(i + 1))),
    (dict(gated_headwise=True), lambda i: list(range(i + 1))),
    (dict(gated_headwise=True, bias=False), lambda i: list(range(i + 1))),
    (dict(causal=False), lambda i: list(range(13))),
    (dict(window=5), lambda i: list(range(max(0, i - 4), i + 1))),  # softmax's band under the gate (5 < T)
]


@pytest.mark.parametrize('kw,visible', CASES)
@pytest.mark.parametrize('fused', [True, False])  # forward's SDPA (or the band), and the math path
def test_matches_reference(kw, visible, fused):
    attn = make(**kw)
    attn.fused = fused
    x = torch.randn(2, 13, C, dtype=torch.float64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    y, ref = attn(x), gated_reference(x, attn, visible, attn.gate_width == H)
    torch.testing.assert_close(y, ref, atol=1e-12, rtol=1e-10)
    own = {'x': x, **dict(attn.named_parameters())}
    g = torch.randn_like(y)
    grads = torch.autograd.grad(y, list(own.values()), g, retain_graph=True)
    for name, a, b in zip(own, grads, torch.autograd.grad(ref, list(own.values()), g)):
        assert b.abs().sum() > 0, name  # the reference gradient is not trivially zero
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10, msg=f'gradient of {name}')
    assert dict(zip(own, grads))['c_attn.weight'][3 * C:].abs().sum() > 0  # the gate's own rows learn


@pytest.mark.parametrize('headwise', [False, True])
def test_parameters_beyond_softmax_are_the_gate(headwise):
    def count(**kw):
        return sum(p.numel() for p in build_attention(AttentionConfig(**kw), 0).parameters())
    for n_embd, n_head, bias in [(C, H, True), (C, H, False), (24, 3, True)]:
        shape = dict(n_embd=n_embd, n_head=n_head, bias=bias)
        extra = count(attention='gated', gated_headwise=headwise, **shape) - count(attention='softmax', **shape)
        width = n_head if headwise else n_embd
        assert extra == n_embd * width + (width if bias else 0)
    # GPT-2-162M (config/tda_gpt.py: 12 layers, 768 wide, 12 heads, biases): +7.08M / +0.11M, and the biases
    per_layer = count(attention='gated', gated_headwise=headwise, n_embd=768, n_head=12) - \
        count(attention='softmax', n_embd=768, n_head=12)
    assert 12 * per_layer == (12 * (768 * 12 + 12) if headwise else 12 * (768 * 768 + 768))  # 110,736 / 7,087,104


def test_project_rotates_q_and_k_not_the_gate():
    attn = make(gated_headwise=True, pos_emb='rope')
    x = torch.randn(2, 13, C, dtype=torch.float64)
    q, k, v, g = attn.project(x)
    plain = attn.c_attn(x)
    assert g.shape == (2, H, 13, 1) and torch.equal(g[:, :, :, 0], plain[..., 3 * C:].transpose(1, 2))
    assert torch.equal(v, plain[..., 2 * C:3 * C].view(2, 13, H, D).transpose(1, 2))
    assert not torch.allclose(q, plain[..., :C].view(2, 13, H, D).transpose(1, 2))  # rotated


@pytest.mark.parametrize('kw', [dict(pos_emb='rope'), dict(pos_emb='learned', gated_headwise=True, window=6)])
def test_gpt_is_causal(kw):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=40, vocab_size=11, attention='gated', **kw)).eval()
    assert_causal(model, T=40, cut=21)


@pytest.mark.parametrize('kw', [dict(), dict(gated_headwise=True), dict(window=40), dict(causal=False)])
def test_every_path_gives_the_same(kw):
    T = 150  # not a multiple of flex's 128-token block
    attn = make(T, **kw).eval()
    with torch.no_grad():
        tensors = attn.project(torch.randn(2, T, C, dtype=torch.float64))
        y = attn.attend(*tensors)
        for other in (attn.attend_fused, attn.attend_flex):
            torch.testing.assert_close(other(*tensors), y, atol=1e-12, rtol=1e-10)


def test_decode_gates_the_new_token_by_its_own_gate():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=32, vocab_size=11, attention='gated',
                          gated_headwise=True, window=8, pos_emb='rope', bias=False)).double().eval()
    idx = torch.randint(0, 11, (2, 50), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        cache = model.new_cache(2)
        logits = [model(idx[:, :10], cache=cache)[0]]
        logits += [model(idx[:, t:t + 1], cache=cache)[0] for t in range(10, 50)]  # past the window and block_size
        for t, got in zip(range(10, 51), logits):
            torch.testing.assert_close(got, model(idx[:, :t])[0], atol=1e-10, rtol=0)


def test_attention_weights_are_the_softmax_weights_before_the_gate():
    attn = make(20).eval()
    q, k, v, g = attn.project(torch.randn(2, 20, C, dtype=torch.float64))
    w = attn.attention_weights(q, k, v, g)
    assert w.shape == (2, H, 20, 20) and (w.triu(1) == 0).all() and (w >= 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(2, H, 20, dtype=torch.float64))
    with torch.no_grad():
        torch.testing.assert_close((w @ v) * torch.sigmoid(g), attn.attend(q, k, v, g))


def test_bad_settings_fail_at_construction():
    for value in (1, 'yes', None):
        with pytest.raises(ValueError, match='gated_headwise must be True or False'):
            make(gated_headwise=value)
    with pytest.raises(ValueError, match='window must be >= 0'):
        make(window=-1)


def test_config_is_the_tda_table_row():
    scope = {'__file__': str(ROOT / 'config' / 'gated_gpt.py')}
    exec(open(scope['__file__']).read(), scope)
    tda = {'__file__': str(ROOT / 'config' / 'tda_gpt.py')}
    exec(open(tda['__file__']).read(), tda)
    assert scope['attention'] == 'gated' and scope['gated_headwise'] is False and scope['out_dir'] == 'out-gated-gpt'
    for key in ('n_layer', 'n_head', 'n_embd', 'pos_emb', 'tie_weights', 'dataset', 'learning_rate', 'max_iters'):
        assert scope[key] == tda[key], key
