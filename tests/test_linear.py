"""Linear attention (docs/rules.md#linear) against a slow reference written straight from the formula: for each query
i, S_i and z_i summed key by key over the visible j, φ written out as x + 1 (x > 0) or exp(x). Float64, forward and
gradients of q, k, v, at T below, at and not a multiple of the chunk, chunk 1 and the bidirectional form; no future
leakage; the O(1) cache (constant bytes, equal to the uncached model); memory linear in T, backward included; the
running sums in float32 under bf16; bad settings."""
import math

import pytest
import torch

from rules import AttentionConfig, build_attention
from rules.linear import LinearCache, carried_state
from conftest import assert_causal, build_layer, cached_generation_equals_the_forward, paths_match, qkv
from model import GPT, GPTConfig


def phi(x):  # elu(x) + 1, written out
    return torch.where(x > 0, x + 1, torch.exp(x))


def linear_reference(q, k, v, causal, eps=1e-6):
    """o_i = φ(q_i)ᵀS_i / (φ(q_i)ᵀz_i + ε), S_i = Σ_j φ(k_j)v_jᵀ and z_i = Σ_j φ(k_j) over the visible j, one by one."""
    B, H, T, D = q.shape
    rows = []
    for i in range(T):
        S, z = q.new_zeros(B, H, D, D), q.new_zeros(B, H, D)
        for j in range(i + 1) if causal else range(T):
            S = S + phi(k[:, :, j]).unsqueeze(-1) * v[:, :, j].unsqueeze(-2)  # φ(k_j) v_jᵀ, (B, H, D, D)
            z = z + phi(k[:, :, j])
        fq = phi(q[:, :, i])                                                   # (B, H, D)
        rows.append((fq.unsqueeze(-1) * S).sum(-2) / ((fq * z).sum(-1, keepdim=True) + eps))
    return torch.stack(rows, 2)                                                # (B, H, T, D)


def make(T, **kw):
    return build_layer('linear', T, **kw)


# T not a multiple of the chunk, a multiple of it, shorter than it, chunk 1, the bidirectional form; ε large enough
# to matter once
@pytest.mark.parametrize('kw', [dict(T=13, linear_chunk=4), dict(T=16, linear_chunk=4), dict(T=5, linear_chunk=8),
                                dict(T=9, linear_chunk=1), dict(T=11, causal=False),
                                dict(T=10, linear_chunk=3, linear_eps=0.5)],
                         ids=lambda kw: '-'.join(f'{k}={v}' for k, v in kw.items()))
def test_matches_reference(kw):
    # the rule's formula as code (attend_reference, every pair at once) and its math path (attend), each against
    # the per-pair reference above
    attn = make(**kw)
    q, k, v = qkv(kw['T'])
    ref = linear_reference(q, k, v, attn.causal, attn.eps)
    paths_match((attn.attend_reference, attn.attend), (q, k, v), ref, names='qkv', tol=1e-12, grad_tol=1e-11)


def test_every_chunk_size_is_the_same_function():
    T = 70  # a multiple of none of the chunks but 1 and 70
    q, k, v = (t.detach() for t in qkv(T, B=1, H=2, seed=1))
    ref = linear_reference(q, k, v, causal=True)
    for chunk in (1, 3, 16, 64, 70, 128):
        torch.testing.assert_close(make(T, n_embd=16, n_head=2, linear_chunk=chunk).attend(q, k, v), ref,
                                   atol=1e-12, rtol=1e-12, msg=f'chunk {chunk}')


def test_weights_are_a_distribution_and_give_the_output():
    attn = make(12, linear_chunk=5)
    q, k, v = (t.detach() for t in qkv(12))
    weights = attn.attention_weights(q, k, v)                                   # (B, H, T, T)
    assert (weights >= 0).all() and (weights.triu(1) == 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, 12, dtype=torch.float64), atol=1e-6, rtol=0)
    torch.testing.assert_close(weights @ v, attn.attend(q, k, v), atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize('chunk', [1, 4, 64])
def test_gpt_is_causal(chunk):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=40, vocab_size=11, attention='linear',
                          linear_chunk=chunk)).eval()
    for cut in (1, 3, 4, 5, 21, 38):
        assert_causal(model, T=39, cut=cut)


def tiny_gpt(**kw):
    torch.manual_seed(0)
    return GPT(GPTConfig(**{**dict(n_layer=2, n_head=2, n_embd=16, block_size=32, vocab_size=11, bias=False,
                                   pos_emb='rope', attention='linear'), **kw})).double().eval()


def test_cached_generation_crosses_chunks_and_equals_the_forward():
    # chunks of 5: the prompt (16) and every later position cross chunk boundaries; 80 > block_size = 32
    model = tiny_gpt(linear_chunk=5)
    prompt = torch.randint(0, 11, (2, 16), generator=torch.Generator().manual_seed(1))
    assert cached_generation_equals_the_forward(model, prompt, 64).pos == 80


def test_cache_bytes_are_constant_in_the_tokens():
    model = tiny_gpt()
    sizes = []
    with torch.no_grad():
        cache = model.new_cache(3)
        model(torch.zeros(3, 16, dtype=torch.long), cache=cache)
        sizes.append(cache.nbytes())
        for _ in range(48):
            model(torch.zeros(3, 1, dtype=torch.long), cache=cache)
        sizes.append(cache.nbytes())
    D = 16 // 2
    assert sizes == [2 * 3 * 2 * (D * D + D) * 8] * 2  # layers x batch x heads x (S and z), float64: not the tokens


def test_saves_nothing_of_size_t_squared_or_t_d_squared_for_backward():
    B, H, T, D, L = 1, 2, 256, 8, 16
    attn = make(T, n_embd=H * D, n_head=H, linear_chunk=L)
    q, k, v = qkv(T, B, H, D)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        attn.attend(q, k, v).sum().backward()
    assert max(saved) <= B * H * T * max(L, D) < B * H * T * D * D < B * H * T * T  # within-chunk weights at most
    assert sum(saved) <= 12 * B * H * T * max(L, D)


def test_running_sums_stay_float32_under_bf16():
    B, H, n, L, D = 1, 2, 40, 64, 16
    g = torch.Generator().manual_seed(2)
    k, v = (torch.randn(B, H, n, L, D, generator=g) for _ in range(2))
    with torch.autocast('cpu', dtype=torch.bfloat16):  # each chunk's matmul in bf16, the sum over chunks not
        S, z = carried_state(k.exp(), v)
    assert S.dtype == z.dtype == torch.float32
    S, z = carried_state(k.exp().bfloat16(), v.bfloat16())  # bf16 activations, no autocast
    assert S.dtype == z.dtype == torch.float32
    # the cache, token by token over 2,048 bf16 tokens: in float32 it stays exact to 1e-5 (a bf16 z drifts by ~40%)
    fk, values = k.exp().bfloat16().view(B, H, n * L, D)[:, :, :2048], v.bfloat16().view(B, H, n * L, D)[:, :, :2048]
    cache = LinearCache()
    for t in range(2048):
        cache.add(fk[:, :, t:t + 1], values[:, :, t:t + 1])
    assert cache.S.dtype == cache.z.dtype == torch.float32
    for got, want in [(cache.S, fk.double().transpose(-1, -2) @ values.double()), (cache.z, fk.double().sum(2, True))]:
        assert (got.double() - want).abs().max() < 1e-5 * want.abs().max()
    # the whole path in bf16 activations over 2,560 tokens (40 chunks) stays near the float64 result
    attn = make(n * L, n_embd=H * D, n_head=H)
    q, k, v = (torch.randn(B, H, n * L, D, generator=g).bfloat16() for _ in range(3))
    y = attn.float().attend(q, k, v)
    assert y.dtype == torch.bfloat16
    ref = attn.double().attend(*(t.double() for t in (q, k, v)))
    assert (y.double() - ref).abs().max() < 0.01 * ref.abs().max()  # bf16's own rounding of y: 0.3%


def test_the_bidirectional_form_has_no_cache():
    attn = make(11, causal=False)
    with pytest.raises(ValueError, match='does not generate'):
        attn.new_cache()


@pytest.mark.parametrize('kw,match', [
    (dict(linear_chunk=0), 'linear_chunk must be >= 1'),
    (dict(linear_chunk=-3), 'linear_chunk must be >= 1'),
    (dict(linear_eps=0.0), 'linear_eps must be a finite number > 0'),
    (dict(linear_eps=-1e-6), 'linear_eps must be a finite number > 0'),
    (dict(linear_eps=math.inf), 'linear_eps must be a finite number > 0'),
    (dict(linear_eps=math.nan), 'linear_eps must be a finite number > 0'),
])
def test_bad_settings_fail_at_construction(kw, match):
    with pytest.raises(ValueError, match=match):
        build_attention(AttentionConfig(n_embd=24, n_head=3, attention='linear', **kw), 0)
