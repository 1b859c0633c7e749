"""Threshold Differential Attention against a slow reference written straight from the formula (docs/rules.md#tda): a
loop over query rows, explicit thresholds from math.log, the rectified power, the two views, the per-head RMSNorm.
Float64, forward and gradients (q's, k's, v, β, λ, the RMSNorm weight); the full-width views and the matched form,
whose views are the halves of one q and k per head (softmax's parameters)."""
import math

import pytest
import torch

from rules import AttentionConfig, build_attention
from conftest import assert_causal, build_layer, cached_generation_equals_the_forward
from model import GPT, GPTConfig


def tda_reference(views, v, beta, lam, kappa, p, weight, eps, causal):
    """o_i = RMSNorm(Σ_j (a¹_ij - λ a²_ij) v_j), a_ij = relu(q̂_i·k̂_j - τ_i)^p over the visible j."""
    T, d = v.size(2), views[0][0].size(-1)  # τ's dimension: that of q̂·k̂ (D/2 in the matched form)
    rows = []
    for i in range(T):
        n = i + 1 if causal else T  # ViT: one threshold, from the N = T keys
        tau = beta * math.sqrt(2 * max(math.log(n / kappa), 0.0) / d)
        js = list(range(i + 1)) if causal else list(range(T))
        y = 0
        for sign, (q, k) in zip([1, -lam], views):
            q_hat = q[:, :, i] / q[:, :, i].norm(dim=-1, keepdim=True)                 # (B, H, D)
            k_hat = k[:, :, js] / k[:, :, js].norm(dim=-1, keepdim=True)               # (B, H, J, D)
            s = (q_hat.unsqueeze(2) * k_hat).sum(-1)                                   # (B, H, J)
            a = torch.where(s > tau, (s - tau).clamp_min(0) ** p, torch.zeros_like(s))
            y = y + sign * (a.unsqueeze(-1) * v[:, :, js]).sum(2)                      # (B, H, D)
        rows.append(y * torch.rsqrt((y * y).mean(-1, keepdim=True) + eps) * weight)
    return torch.stack(rows, 2)                                                        # (B, H, T, D)


def make(T, **kw):
    attn = build_layer('tda', T, **{**dict(tda_beta=0.6, tda_lambda=0.3), **kw})
    with torch.no_grad():  # a norm weight that is not all ones, so its gradient and its use both show
        attn.head_norm.weight.copy_(torch.linspace(0.5, 1.5, attn.head_dim, dtype=torch.float64))
    return attn


def inputs(n, T, B=2, H=3, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, D, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(n)]


def parameters(attn):
    """The rule's own parameters (β, λ, RMSNorm weight) and what the reference takes: β, λ (0 in one view)."""
    own = {'log_beta': attn.log_beta, 'head_norm.weight': attn.head_norm.weight}
    if attn.two_views:
        own['lambda_logit'] = attn.lambda_logit
    lam = torch.sigmoid(attn.lambda_logit) if attn.two_views else 0.0
    return own, attn.log_beta.exp(), lam


def reference_views(tensors, matched):
    """The (q, k) of each view from what project returns: q1, k1(, q2, k2), v; matched: q, k, v, each head's q and k
    cut into its first and its second half."""
    if not matched:
        return list(zip(tensors[:-1:2], tensors[1:-1:2]))
    q, k, _ = tensors
    d = q.size(-1) // 2
    return [(q[..., :d], k[..., :d]), (q[..., d:], k[..., d:])]


# (T, queries per chunk, causal, differential, p, κ, matched): T below, at and not a multiple of the chunk; κ > 1
# (τ = 0 for early rows); the matched form (views of D/2) causal and bidirectional
CASES = [(13, 4, True, True, 2.0, 1.0, False), (16, 4, True, True, 2.0, 1.0, False),
         (21, 8, False, True, 2.0, 1.0, False), (9, 64, True, False, 2.0, 1.0, False),
         (30, 7, True, True, 3.0, 2.0, False), (17, 5, False, False, 1.0, 0.5, False),
         (13, 4, True, True, 2.0, 1.0, True), (21, 8, False, True, 2.0, 1.0, True), (30, 7, True, True, 3.0, 2.0, True)]


@pytest.mark.parametrize('T,chunk,causal,differential,p,kappa,matched', CASES)
def test_matches_reference(T, chunk, causal, differential, p, kappa, matched):
    attn = make(T, tile_weights=chunk * T, causal=causal, tda_differential=differential, tda_p=p, tda_kappa=kappa,
                tda_matched=matched)
    tensors = inputs(len(attn.projections), T)
    own, beta, lam = parameters(attn)
    views = reference_views(tensors, matched)
    ref = tda_reference(views, tensors[-1], beta, lam, kappa, p, attn.head_norm.weight, attn.head_norm.eps, causal)
    weights = attn.attention_weights(*tensors)
    visible = torch.ones(T, T).tril().bool() if causal else torch.ones(T, T).bool()
    zero = (weights == 0)[..., visible].double().mean().item()
    assert 0.2 < zero < 0.95  # some pairs survive the threshold, many do not: both branches are tested
    g = torch.randn_like(ref)
    wrt = tensors + list(own.values())
    names = list(attn.projections) + list(own)
    grads_ref = torch.autograd.grad(ref, wrt, g)
    for path in (attn.attend_reference, attn.attend):  # the rule's formula as code, and its math path in tiles
        y = path(*tensors)
        torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5, msg=path.__name__)
        for name, a, b in zip(names, torch.autograd.grad(y, wrt, g), grads_ref):
            assert b.abs().sum() > 0, name  # the reference gradient is not trivially zero
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=f'{path.__name__}: gradient of {name}')


def test_threshold_values():
    attn = build_attention(AttentionConfig(n_embd=64, n_head=1, block_size=1024, attention='tda'), 0)  # D = 64
    tau = attn.threshold(1024, 'cpu')
    assert tau[0].item() == 0.0
    assert tau[1].item() == pytest.approx(0.14718, abs=1e-5)
    assert tau[1023].item() == pytest.approx(0.46541, abs=1e-5)
    vit = build_attention(AttentionConfig(n_embd=64, n_head=1, block_size=65, attention='tda', causal=False,
                                          tda_beta=0.5), 0)
    torch.testing.assert_close(vit.threshold(65, 'cpu'), torch.full((65,), 0.5 * math.sqrt(2 * math.log(65) / 64)))


def test_rows_without_survivors_give_exactly_zero():
    attn = make(40, tda_beta=20.0).float()  # τ_i > 1 >= s for every i >= 1: only row 0 (τ_0 = 0) can keep keys
    tensors = [t.detach().float() for t in inputs(5, 40)]
    with torch.no_grad():
        for y in (attn.attend(*tensors), attn.attend_flex(*tensors)):
            assert torch.isfinite(y).all() and (y[:, :, 1:] == 0).all() and (y[:, :, 0] != 0).any()


def test_saves_no_chunk_of_weights_for_backward():
    # everything autograd keeps outside the recomputed chunks is O(T·D): inputs, normalised q/k, y, the norm
    T, chunk = 256, 16
    attn = make(T, tile_weights=chunk * T)
    tensors = inputs(5, T)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        attn.attend(*tensors).sum().backward()
    B, H, _, D = tensors[0].shape
    assert max(saved) <= B * H * T * D < B * H * chunk * T  # no chunk × T weights, let alone T × T
    assert sum(saved) <= 20 * B * H * T * D


@pytest.mark.parametrize('kw', [dict(pos_emb='rope'), dict(pos_emb='learned', tda_differential=False),
                                dict(pos_emb='rope', tda_matched=True)])
def test_gpt_is_causal(kw):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=40, vocab_size=11, attention='tda',
                          tile_weights=8 * 40, **kw)).eval()
    assert_causal(model, T=40, cut=21)


@pytest.mark.parametrize('T,kw', [(200, dict()), (65, dict(causal=False)), (100, dict(tda_differential=False)),
                                  (150, dict(tda_matched=True)), (65, dict(causal=False, tda_matched=True))])
def test_flex_forward_equals_math(T, kw):
    attn = make(T, tile_weights=32 * T, **kw).float()
    tensors = [t.detach().float() for t in inputs(len(attn.projections), T)]
    with torch.no_grad():
        torch.testing.assert_close(attn.attend_flex(*tensors), attn.attend(*tensors), atol=1e-5, rtol=1e-5)


def test_flex_backward_on_cpu_through_eager_flex(eager_flex_backward):
    # this rule's wiring through flex: the lse gradient, β captured by the score_mod, λ outside
    attn = make(50)
    tensors = inputs(5, 50)
    own = list(parameters(attn)[0].values())
    grads = []
    for attend in (attn.attend, attn.attend_flex):
        y = attend(*tensors)
        grads.append(torch.autograd.grad(y, tensors + own, torch.ones_like(y)))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-8, rtol=1e-8)


def test_single_view_has_three_projections_and_no_lambda():
    attn = make(10, tda_differential=False)
    assert attn.projections == ('q1', 'k1', 'v') and attn.c_attn.weight.shape == (3 * 24, 24)
    assert not hasattr(attn, 'lambda_logit')
    assert make(10).c_attn.weight.shape == (5 * 24, 24)


def test_matched_form_has_softmax_parameters():
    # the baby GPT (4 layers x 128, 4 heads of 32, RoPE, biases, 65 characters): full-width views add two C x C
    # projections and their biases per layer; the matched form adds only what TDA learns beyond softmax: β, λ and
    # the RMSNorm's weight (D + 2 per layer)
    def count(**kw):
        model = GPT(GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=64, vocab_size=65, bias=True,
                              pos_emb='rope', **kw))
        return sum(p.numel() for p in model.parameters())
    softmax, full, matched = count(), count(attention='tda'), count(attention='tda', tda_matched=True)
    assert (softmax, full, matched) == (801_664, 933_896, 801_800)
    assert full - softmax == 4 * (2 * 128 * 128 + 2 * 128 + 32 + 2) and matched - softmax == 4 * (32 + 2)
    attn = make(10, tda_matched=True)
    assert attn.projections == ('q', 'k', 'v') and attn.c_attn.weight.shape == (3 * 24, 24) and attn.view_dim == 4


def test_matched_views_see_positions_only_through_their_distance():
    # RoPE rotates each half as a head of D/2: shifting every position by 7 leaves every view's q̂·k̂, hence the
    # weights, as they were (the frame's rotation at D, cut in halves afterwards, would not)
    torch.manual_seed(0)
    attn = build_attention(AttentionConfig(n_embd=32, n_head=2, block_size=40, attention='tda', pos_emb='rope',
                                           tda_matched=True, tda_beta=0.3), 0).double()
    assert attn.rope.head_dim == 8
    x = torch.randn(2, 20, 32, dtype=torch.float64)
    here, shifted = attn.attention_weights(*attn.project(x)), attn.attention_weights(*attn.project(x, 7))
    torch.testing.assert_close(shifted, here, atol=1e-6, rtol=0)  # RoPE's tables are float32
    assert (here != 0).double().mean() > 0.1 and not torch.equal(attn.project(x)[0], attn.project(x, 7)[0])


def test_matched_cached_generation_equals_the_forward():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=32, vocab_size=11, bias=False, pos_emb='rope',
                          attention='tda', tda_matched=True, tda_beta=0.5)).double().eval()
    prompt = torch.randint(0, 11, (2, 16), generator=torch.Generator().manual_seed(1))
    cached_generation_equals_the_forward(model, prompt, 40)  # 56 > block_size: past the trained context


def test_initial_values_and_vit():
    from vit import ViT, ViTConfig
    torch.manual_seed(0)
    model = ViT(ViTConfig(n_layer=2, n_head=2, n_embd=64, patch_size=8, attention='tda', tda_beta=0.8,
                          tda_lambda=0.2))
    attn = model.h[0].attn
    assert attn.log_beta.exp().item() == pytest.approx(0.8) and torch.sigmoid(attn.lambda_logit).item() == \
        pytest.approx(0.2)
    assert torch.equal(attn.head_norm.weight, torch.ones(32))
    _, loss = model(torch.randn(2, 3, 32, 32), torch.tensor([1, 7]))
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in (attn.log_beta, attn.lambda_logit))


@pytest.mark.parametrize('kw,match', [
    (dict(tda_p=0.5), 'tda_p must be >= 1'),
    (dict(tda_kappa=0.0), 'tda_kappa must be > 0'),
    (dict(tda_kappa=-1.0), 'tda_kappa must be > 0'),
    (dict(tda_lambda=0.0), r'tda_lambda must be in \(0, 1\)'),
    (dict(tda_lambda=1.0), r'tda_lambda must be in \(0, 1\)'),
    (dict(tda_beta=0.0), 'tda_beta must be > 0'),
    (dict(tda_beta=-0.5), 'tda_beta must be > 0'),
    (dict(tile_weights=0), 'tile_weights must be >= 1'),
    (dict(tda_eps=0.0), 'tda_eps must be > 0'),
])
def test_bad_settings_fail_at_construction(kw, match):
    with pytest.raises(ValueError, match=match):
        build_attention(AttentionConfig(n_embd=24, n_head=3, attention='tda', **kw), 0)


@pytest.mark.parametrize('kw,match', [
    (dict(n_embd=24, tda_differential=False), "tda_matched=True splits each head's q and k into two views"),
    (dict(n_embd=27), 'tda_matched=True needs a head size n_embd/n_head divisible by 2, got 9; pass e.g. --n_embd=30'),
    (dict(n_embd=18, pos_emb='rope'), 'needs a head size n_embd/n_head divisible by 4, got 6; pass e.g. --n_embd=24'),
])
def test_bad_matched_settings_fail_at_construction(kw, match):
    with pytest.raises(ValueError, match=match):
        build_attention(AttentionConfig(n_head=3, attention='tda', tda_matched=True, **kw), 0)


def test_train_py_learns_recall_with_tda(tmp_path):
    from conftest import iter_losses, run_script
    log = run_script('train.py', '--attention=tda', '--pos_emb=rope', '--n_layer=2', '--n_head=2', '--n_embd=32',
                     '--batch_size=32', '--eval_iters=2', '--log_interval=1', '--warmup_iters=2', '--compile=False',
                     '--device=cpu', '--max_iters=30', '--eval_interval=30', '--learning_rate=3e-3',
                     f'--data_dir={tmp_path / "recall"}', f'--out_dir={tmp_path / "out"}')
    losses = iter_losses(log)
    assert losses[30] < losses[0] - 0.5
    state = torch.load(tmp_path / 'out' / 'ckpt.pt', weights_only=True)['model']
    assert state['transformer.h.0.attn.log_beta'].item() != 0.0  # β = 1 at the start: it was trained
