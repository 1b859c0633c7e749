"""ReLA (rectified linear attention, ReLA-g) against a slow reference written straight from the formula
(docs/rules.md#rela): a loop over query rows, relu of the scaled scores over the visible keys, no normalisation,
the heads merged, the gated RMSNorm g ⊙ z/√(mean z² + ε) ⊙ σ(w ⊙ z), c_proj. Float64, forward and gradients (q, k,
v, g, w, with g and w set by hand, different per channel)."""
import math

import pytest
import torch

from rules import AttentionConfig, build_attention
from conftest import assert_causal, build_layer
from machinery.heads import merge_heads
from model import GPT, GPTConfig


def rela_reference(q, k, v, g, w, eps, causal, c_proj):
    """c_proj(g ⊙ z/√(mean z² + ε) ⊙ σ(w ⊙ z)), z_i = [Σ_j relu(q_i·k_j/√D) v_j, per head], visible j only."""
    B, H, T, D = q.shape
    tokens = []
    for i in range(T):
        js = list(range(i + 1)) if causal else list(range(T))
        heads = []
        for h in range(H):
            s = (q[:, h, i].unsqueeze(1) * k[:, h, js]).sum(-1) / math.sqrt(D)      # (B, J)
            a = torch.where(s > 0, s, torch.zeros_like(s))
            heads.append((a.unsqueeze(-1) * v[:, h, js]).sum(1))                      # (B, D)
        z = torch.cat(heads, -1)                                                      # (B, C): head h at h·D
        rms = torch.sqrt((z * z).mean(-1, keepdim=True) + eps)
        tokens.append(g * (z / rms) * torch.sigmoid(w * z))
    return c_proj(torch.stack(tokens, 1))                                             # (B, T, C)


def make(T, **kw):
    attn = build_layer('rela', T, **kw)
    with torch.no_grad():  # g and w away from their init, different per channel, so their use and gradients show
        attn.norm_scale.copy_(torch.linspace(0.5, 1.5, 24, dtype=torch.float64))
        attn.norm_gate.copy_(torch.linspace(-2.0, 3.0, 24, dtype=torch.float64))
    return attn


def inputs(T, B=2, H=3, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, D, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3)]


# (T, queries per tile, causal, ε): T below, at and not a multiple of the tile; ε large enough to matter
CASES = [(13, 4, True, 1e-8), (16, 16, True, 1e-8), (11, 3, False, 1e-8), (9, 64, True, 0.5), (12, 5, False, 0.5)]


@pytest.mark.parametrize('T,tile,causal,eps', CASES)
def test_matches_reference(T, tile, causal, eps):
    attn = make(T, causal=causal, rela_eps=eps, tile_weights=tile * T)
    q, k, v = inputs(T)
    ref = rela_reference(q, k, v, attn.norm_scale, attn.norm_gate, eps, causal, attn.c_proj)
    weights = attn.attention_weights(q, k, v)
    visible = torch.ones(T, T).tril().bool() if causal else torch.ones(T, T).bool()
    assert (weights[..., ~visible] == 0).all()
    zero = (weights == 0)[..., visible].double().mean().item()
    assert 0.3 < zero < 0.7, zero  # about half the scores are negative: both sides of the ReLU are tested
    g = torch.randn_like(ref)
    own = {'norm_scale (g)': attn.norm_scale, 'norm_gate (w)': attn.norm_gate}
    wrt, names = [q, k, v] + list(own.values()), ['q', 'k', 'v'] + list(own)
    grads_ref = torch.autograd.grad(ref, wrt, g)
    for path in (attn.attend_reference, attn.attend):  # the formula as code (every pair at once), the math path
        y = attn.out(path(q, k, v))
        torch.testing.assert_close(y, ref, atol=1e-10, rtol=1e-10, msg=path.__name__)
        for name, a, b in zip(names, torch.autograd.grad(y, wrt, g), grads_ref):
            assert b.abs().sum() > 0, name  # the reference gradient is not trivially zero
            torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10, msg=f'{path.__name__}: gradient of {name}')


def test_rows_with_no_positive_score_give_exactly_zero():
    attn = make(12)
    q, k, v = inputs(12)
    with torch.no_grad():  # every head of tokens 4..7 scores every key below 0: they attend to nothing
        k.copy_(k.abs())
        q[:, :, 4:8] = -q[:, :, 4:8].abs()
    y = attn.attend(q, k, v)
    z = attn.gated_rms_norm(merge_heads(y))
    assert (y[:, :, 4:8] == 0).all() and (y[:, :, 8:] != 0).any()
    assert (z[:, 4:8] == 0).all() and torch.isfinite(z).all()
    grads = torch.autograd.grad(attn.out(y).square().sum(), [q, k, v, attn.norm_scale, attn.norm_gate])
    assert all(torch.isfinite(t).all() for t in grads)
    assert (grads[0][:, :, 4:8] == 0).all()  # relu's gradient below 0


def test_two_c_parameters_per_layer_beyond_softmax():
    def count(attention, **kw):
        shape = dict(n_layer=2, n_head=2, n_embd=16, block_size=32, vocab_size=11)
        return sum(p.numel() for p in GPT(GPTConfig(**{**shape, **kw}, attention=attention)).parameters())
    assert count('rela') - count('softmax') == 2 * 2 * 16
    # the TDA paper's GPT-2-162M shape (12 layers, 768 wide): +18,432, counted on its layers
    size = lambda name: sum(p.numel() for p in build_attention(AttentionConfig(n_embd=768, n_head=12,
                                                                                attention=name), 0).parameters())
    extra = 12 * (size('rela') - size('softmax'))
    assert extra == 18432


def test_initial_values():
    torch.manual_seed(0)
    attn = build_attention(AttentionConfig(n_embd=768, n_head=12, attention='rela'), 0)
    bound = math.sqrt(3 / 768)  # the official code's default init of the gate vector: TF variance scaling, fan_avg
    assert torch.equal(attn.norm_scale, torch.ones(768))
    assert attn.norm_gate.abs().max() <= bound and attn.norm_gate.abs().max() > 0.9 * bound
    assert abs(attn.norm_gate.std().item() - bound / math.sqrt(3)) < 0.1 * bound
    assert attn.eps == 1e-8


def test_saves_no_tile_of_weights_for_backward():
    T, tile = 128, 16
    attn = make(T, tile_weights=tile * T)
    q, k, v = inputs(T)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        attn.attend(q, k, v).sum().backward()
    B, H, _, D = q.shape
    assert max(saved, default=0) <= B * H * T * D < B * H * tile * T  # no tile × T weights, let alone T × T


@pytest.mark.parametrize('kw', [dict(pos_emb='rope'), dict(pos_emb='learned')])
def test_gpt_is_causal(kw):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=40, vocab_size=11, attention='rela',
                          tile_weights=8 * 40, **kw)).eval()
    assert_causal(model, T=40, cut=21)


def test_vit_trains_its_norm():
    from vit import ViT, ViTConfig
    torch.manual_seed(0)
    model = ViT(ViTConfig(n_layer=2, n_head=2, n_embd=32, patch_size=8, attention='rela'))
    _, loss = model(torch.randn(2, 3, 32, 32), torch.tensor([1, 7]))
    loss.backward()
    attn = model.h[0].attn
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in (attn.norm_scale, attn.norm_gate))


@pytest.mark.parametrize('kw,match', [
    (dict(rela_eps=0.0), 'rela_eps must be a finite number > 0'),
    (dict(rela_eps=-1e-6), 'rela_eps must be a finite number > 0'),
    (dict(rela_eps=float('inf')), 'rela_eps must be a finite number > 0'),
    (dict(rela_eps=float('nan')), 'rela_eps must be a finite number > 0'),
    (dict(tile_weights=0), 'tile_weights must be >= 1'),
])
def test_bad_settings_fail_at_construction(kw, match):
    with pytest.raises(ValueError, match=match):
        build_attention(AttentionConfig(n_embd=24, n_head=3, attention='rela', **kw), 0)
