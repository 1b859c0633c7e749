"""Locality Self-Attention against a slow reference written straight from the formula (docs/rules.md#lsa): per head and
query, softmax over every key but the query's own of t·q_i·k_j, t = exp(log t) (one per layer, or one per head),
then the weighted sum of the values. Float64, forward and gradients (q, k, v, log t), with t different per head and
away from its initial 1/√D; the LSA ViT, and the GPT it refuses."""

from functools import partial

import pytest
import torch

from rules import AttentionConfig, build_attention
from conftest import ROOT, build_layer, run_script
from conftest import qkv as shared_qkv
from model import GPT, GPTConfig
from vit import ViT, ViTConfig

H, D = 4, 8


def lsa_reference(q, k, v, t):
    """One head and one query at a time: the other tokens' scores t_h·q_i·k_j, softmax, the sum of their values."""
    B, _, T, _ = q.shape
    heads = []
    for h in range(H):
        rows = []
        for i in range(T):
            js = [j for j in range(T) if j != i]
            scores = torch.stack([t[h] * (q[:, h, i] * k[:, h, j]).sum(-1) for j in js], -1)        # (B, T - 1)
            rows.append(sum(w[:, None] * v[:, h, j] for w, j in zip(scores.softmax(-1).unbind(-1), js)))
        heads.append(torch.stack(rows, 1))  # (B, T, D)
    return torch.stack(heads, 1)            # (B, H, T, D)


def make(T, per_head, **kw):
    attn = build_layer('lsa', T, n_head=H, head_dim=D, **{**dict(causal=False, lsa_per_head=per_head), **kw})
    with torch.no_grad():  # away from 1/√D, and different per head where there is one per head
        attn.log_temperature.copy_(torch.log(torch.tensor([0.9, 0.2, 0.45, 1.3] if per_head else 0.6)))
    return attn


qkv = partial(shared_qkv, H=H, D=D)  # conftest's q, k, v at this file's head shape


@pytest.mark.parametrize('per_head', [False, True], ids=['per-layer', 'per-head'])
@pytest.mark.parametrize('T', [2, 13])
def test_matches_reference(T, per_head):
    attn = make(T, per_head)
    assert attn.log_temperature.shape == ((H,) if per_head else ())
    q, k, v = qkv(T)
    t = attn.log_temperature.exp().expand(H)
    ref = lsa_reference(q, k, v, t)
    g = torch.randn_like(ref)
    inputs = (q, k, v, attn.log_temperature)
    grads_ref = torch.autograd.grad(ref, inputs, g)
    for attend in (attn.attend, attn.attend_fused):  # the formula as tensor ops, and SDPA with the off-diagonal mask
        y = attend(q, k, v)
        torch.testing.assert_close(y, ref, atol=1e-12, rtol=1e-10)
        grads = torch.autograd.grad(y, inputs, g)
        for name, a, b in zip(['q', 'k', 'v', 'log_temperature'], grads, grads_ref):
            if T > 2 or name == 'v':  # (two tokens: each sees the other alone, weight 1: no gradient to q, k, t)
                assert b.abs().sum() > 0, name  # the reference gradient is not trivially zero
            torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10, msg=f'gradient of {name}')
    if T == 2:  # each token sees only the other: y_0 = v_1, y_1 = v_0
        torch.testing.assert_close(y, v.flip(2), atol=0, rtol=0)


def test_initial_temperature_is_softmax_scale_and_weights_skip_the_diagonal():
    attn = build_attention(AttentionConfig(n_embd=H * D, n_head=H, block_size=9, causal=False, attention='lsa'), 0)
    torch.testing.assert_close(attn.log_temperature.exp(), torch.tensor(D ** -0.5))
    q, k, v = (x.float() for x in qkv(9))
    w = attn.attention_weights(q, k, v)  # the frame's: y = W v, a distribution over the other tokens
    torch.testing.assert_close(w.sum(-1), torch.ones(2, H, 9))
    assert torch.equal(w.diagonal(dim1=-2, dim2=-1), torch.zeros(2, H, 9)) and attn.weights_note is None


@pytest.mark.parametrize('T,per_head', [(65, True), (150, False)])
def test_flex_forward_equals_math(T, per_head):
    attn = make(T, per_head).float()
    q, k, v = (x.detach().float() for x in qkv(T))
    with torch.no_grad():
        torch.testing.assert_close(attn.attend_flex(q, k, v), attn.attend(q, k, v), atol=1e-5, rtol=1e-5)


def test_a_tiny_vit_learns_its_temperatures_without_decay():
    torch.manual_seed(0)
    model = ViT(ViTConfig(n_layer=2, n_head=H, n_embd=H * D, num_classes=10, attention='lsa', lsa_per_head=True))
    attn = model.h[1].attn
    assert attn.has_flex and not attn.has_cache and attn.log_temperature.shape == (H,)
    decay, no_decay = model.configure_optimizers(0.05, 1e-3, (0.9, 0.999), 'cpu').param_groups
    assert any(p is attn.log_temperature for p in no_decay['params'])
    assert not any(p is attn.log_temperature for p in decay['params'])
    logits, loss = model(torch.randn(2, 3, 32, 32), torch.tensor([3, 7]))
    loss.backward()
    assert logits.shape == (2, 10) and (attn.log_temperature.grad != 0).all()


def test_a_gpt_is_refused_in_one_line_saying_why(tmp_path):
    message = (r"attention='lsa' \(LocalitySelfAttention\) has no causal form \(causal=True, a GPT\): its diagonal "
               r"is masked, so row 0 would see no key; use it in a ViT")
    with pytest.raises(ValueError, match=message):
        build_attention(AttentionConfig(n_embd=H * D, n_head=H, attention='lsa'), 0)
    with pytest.raises(ValueError, match=message):
        GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=11, attention='lsa'))
    with pytest.raises(ValueError, match='mix is the language-model form'):
        build_attention(AttentionConfig(n_embd=H * D, n_head=H, causal=False, attention='lsa', mix=True), 0)
    log = run_script('train.py', '--attention=lsa', f'--out_dir={tmp_path}', f'--data_dir={tmp_path / "recall"}',
                     check=False)  # a GPT: causal
    assert "error: attention='lsa' (LocalitySelfAttention) has no causal form" in log and 'Traceback' not in log


def test_config_is_the_softmax_vit_recipe_with_lsa():
    scope = {'__file__': str(ROOT / 'config' / 'lsa_vit.py')}
    exec(open(scope['__file__']).read(), scope)
    expect = dict(dataset='cifar10', n_layer=12, n_head=6, n_embd=384, patch_size=4, attention='lsa',
                  lsa_per_head=False, out_dir='out-lsa-vit')
    assert {k: scope[k] for k in expect} == expect
    model = ViT(ViTConfig(n_layer=1, n_head=scope['n_head'], n_embd=scope['n_embd'], attention='lsa'))
    assert model.h[0].attn.log_temperature.shape == ()
