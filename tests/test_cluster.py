"""Cluster attention (docs/rules.md#cluster) against a slow reference written straight from the formula (per query: the soft
assignment, the cluster sums of the past chunks, one softmax over [own chunk ; clusters]); exactness against full
softmax when keys sit on m exact centres; no future leakage; gradients (gradcheck, float64) to q, k, v, the seeds
and the sharpness; seeds that learn at their own rate, undecayed; usage statistics; bad settings."""
import math

import pytest
import torch
import torch.nn.functional as F

from machinery.clusters import cluster_usage
from rules import AttentionConfig, build_attention
from conftest import assert_causal, build_layer, qkv
from model import GPT, GPTConfig, attention_reports
from prepare.recall import make_examples


def make(T=20, causal=True, H=3, D=8, **kw):
    attn = build_layer('cluster', T, n_head=H, head_dim=D, causal=causal,
                       **{**dict(cluster_m=4, cluster_chunk=4), **kw})
    with torch.no_grad():  # a different sharpness per head, so a mix-up of heads would show
        attn.log_sharpness.copy_(torch.log(torch.tensor([1.5, 4.0, 9.0], dtype=torch.float64)[:H]))
    return attn


def assignment(k, seeds, sharpness):  # k (D,), seeds (m, D) -> (m,)
    return torch.softmax(sharpness * F.cosine_similarity(k.unsqueeze(0), seeds, dim=-1), -1)


def joint_softmax(q, keys, values, clusters):
    """softmax over exact keys (q·k/√D) and clusters (q·K̄/√D + log N; none if empty), then Σ weight·value."""
    scale = 1 / math.sqrt(q.numel())
    scores = [q @ k * scale for k in keys]
    outs = list(values)
    for N, sum_k, sum_v in clusters:
        if N > 0:
            scores.append(q @ (sum_k / N) * scale + torch.log(N))
            outs.append(sum_v / N)
    weights = torch.softmax(torch.stack(scores), 0)
    return sum(w * o for w, o in zip(weights, outs))


def reference(q, k, v, seeds, sharpness, causal, L=4, iters=0, self_term=False):
    B, H, T, D = q.shape
    y = [[[None] * T for _ in range(H)] for _ in range(B)]
    for b in range(B):
        for h in range(H):
            seeds_h = seeds[h]
            S = [assignment(k[b, h, j], seeds_h, sharpness[h]) for j in range(T)]
            for _ in range(iters):  # soft spherical k-means: seed c <- Σ_j S_jc k_j/|k_j|
                seeds_h = sum(S[j].unsqueeze(1) * k[b, h, j] / k[b, h, j].norm() for j in range(T))
                S = [assignment(k[b, h, j], seeds_h, sharpness[h]) for j in range(T)]
            for i in range(T):
                past = range(i // L * L) if causal else range(T)    # the tokens summarised by clusters
                exact = range(i // L * L, i + 1) if causal else ([i] if self_term else [])
                clusters = [(sum(S[j][c] for j in past) + 0 * q.sum(),  # a tensor even when there is no past
                             sum(S[j][c] * k[b, h, j] for j in past), sum(S[j][c] * v[b, h, j] for j in past))
                            for c in range(len(seeds_h))]
                y[b][h][i] = joint_softmax(q[b, h, i], [k[b, h, j] for j in exact], [v[b, h, j] for j in exact],
                                           clusters)
    return torch.stack([torch.stack([torch.stack(row) for row in head]) for head in y])


# (T, L): T not a multiple of L, L = 1, L >= T (exact causal softmax), and the bidirectional forms
@pytest.mark.parametrize('kw', [dict(T=13, cluster_chunk=4), dict(T=9, cluster_chunk=1), dict(T=6, cluster_chunk=8),
                                dict(T=11, causal=False), dict(T=11, causal=False, cluster_iters=2),
                                dict(T=11, causal=False, cluster_iters=1, cluster_self=True)],
                         ids=lambda kw: '-'.join(f'{k}={v}' for k, v in kw.items()))
def test_matches_reference(kw):
    # the rule's formula as code (attend_reference, every pair at once) and its math path (attend), each against
    # the per-query reference above
    attn = make(**kw)
    q, k, v = qkv(kw['T'])
    ref = reference(q, k, v, attn.seeds, attn.log_sharpness.exp(), attn.causal, attn.chunk, attn.iters, attn.self_term)
    g = torch.randn_like(ref)
    inputs = (q, k, v, attn.seeds, attn.log_sharpness)
    # with one block there is no past: no gradient to seeds or sharpness
    grad = lambda out: torch.autograd.grad(out, inputs, g, allow_unused=True, materialize_grads=True)
    grads_ref = grad(ref)
    for path in (attn.attend_reference, attn.attend):
        y = path(q, k, v)
        torch.testing.assert_close(y, ref, atol=1e-10, rtol=1e-10, msg=path.__name__)
        for name, a, b in zip('q k v seeds log_sharpness'.split(), grad(y), grads_ref):
            torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-9, msg=f'{path.__name__}: gradient of {name}')
    if kw['T'] > attn.chunk or not attn.causal:
        assert grads_ref[3].abs().sum() > 0 and grads_ref[4].abs().sum() > 0


@pytest.mark.parametrize('causal,kw', [(True, dict(cluster_chunk=4)), (True, dict(cluster_chunk=16)),
                                       (False, dict()), (False, dict(cluster_iters=3))])
def test_exact_when_keys_sit_on_the_centres(causal, kw):
    # keys drawn from m exact centres, seeds near them, a very large sharpness: every key in exactly one cluster,
    # and the log-mass bias makes the summaries equal to the keys they replace
    B, H, T, D, m = 2, 3, 37, 8, 5
    g = torch.Generator().manual_seed(1)
    centres = torch.randn(H, m, D, generator=g, dtype=torch.float64)
    label = torch.randint(0, m, (B, H, T), generator=g)
    k = centres[torch.arange(H).view(1, H, 1), label]                       # (B, H, T, D)
    q, v = (torch.randn(B, H, T, D, generator=g, dtype=torch.float64) for _ in range(2))
    attn = make(T, causal, cluster_m=m, **kw)
    with torch.no_grad():
        attn.seeds.copy_(centres + 0.01 * torch.randn(H, m, D, generator=g, dtype=torch.float64))
        attn.log_sharpness.fill_(math.log(1e5))
    full = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.testing.assert_close(attn.attend(q, k, v), full, atol=1e-5, rtol=1e-5)
    assert (attn.attend(q, k, v) - full).abs().max() < 1e-12  # in float64 it is exact to rounding


def test_a_block_as_long_as_the_sequence_is_causal_softmax():
    attn = make(12, cluster_chunk=12)
    q, k, v = qkv(12)
    torch.testing.assert_close(attn.attend(q, k, v), F.scaled_dot_product_attention(q, k, v, is_causal=True))


@pytest.mark.parametrize('L', [1, 4, 16, 64])
def test_no_future_leakage(L):
    torch.manual_seed(0)
    T = 70  # a multiple of none of the blocks but 1
    attn = build_attention(AttentionConfig(n_embd=32, n_head=4, block_size=T, attention='cluster', cluster_m=8,
                                           cluster_chunk=L), 0).eval()
    x = torch.randn(2, T, 32)
    for cut in sorted({1, L - 1, L, L + 1, 37, T - 1} - {0}):
        changed = x.clone()
        changed[:, cut:] = torch.randn(2, T - cut, 32)
        with torch.no_grad():
            a, b = attn(x), attn(changed)
        assert torch.equal(a[:, :cut], b[:, :cut]), f'cut {cut}'
        assert not torch.equal(a[:, cut:], b[:, cut:])


@pytest.mark.parametrize('L', [1, 4, 16, 64])
def test_gpt_is_causal(L):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=40, vocab_size=11, attention='cluster',
                          cluster_m=4, cluster_chunk=L)).eval()
    assert_causal(model, T=39, cut=21)


@pytest.mark.parametrize('kw', [dict(T=7, cluster_chunk=3),
                                dict(T=6, causal=False, cluster_iters=1, cluster_self=True)])
def test_gradcheck(kw):
    # finite differences in float64 for every input: q, k, v, the seeds and the sharpness
    attn = make(H=2, D=3, cluster_m=3, **kw)
    q, k, v = qkv(kw['T'], B=1, H=2, D=3, seed=3)
    assert torch.autograd.gradcheck(lambda q, k, v, seeds, log_sharpness: attn.attend(q, k, v),
                                    (q, k, v, attn.seeds, attn.log_sharpness))


def test_seeds_are_undecayed_learn_at_their_own_rate_and_move():
    torch.manual_seed(0)
    x, y = (torch.from_numpy(a.astype('int64')) for a in make_examples(512, 16, 4, 32, seed=0))
    model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=64, block_size=32, vocab_size=32, attention='cluster',
                          cluster_m=8, cluster_chunk=8, cluster_seed_lr=10.0))
    attn = model.transformer.h[0].attn
    assert torch.allclose(attn.seeds.norm(dim=-1), torch.ones(4, 8))  # unit seeds, orthogonal per head
    torch.testing.assert_close(attn.seeds @ attn.seeds.transpose(1, 2), torch.eye(8).expand(4, 8, 8))
    optimizer = model.configure_optimizers(0.1, 3e-3, (0.9, 0.99), 'cpu')
    (group,) = [g for g in optimizer.param_groups if any(p is attn.seeds for p in g['params'])]
    assert group['lr_scale'] == 10.0 and group['weight_decay'] == 0.0
    seeds0 = [F.normalize(b.attn.seeds.detach().clone(), dim=-1) for b in model.transformer.h]
    model.eval()
    usage0 = dict(attention_reports(model, x[:64]))['transformer.h.0.attn']['perplexity'].clone()
    model.train()
    for step in range(15):
        for g in optimizer.param_groups:
            g['lr'] = 3e-3 * g['lr_scale']  # as train.py does
        rows = torch.randint(0, 512, (64,), generator=torch.Generator().manual_seed(step))
        _, loss = model(x[rows], y[rows])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    for block, before in zip(model.transformer.h, seeds0):  # every seed turned
        cos = (F.normalize(block.attn.seeds.detach(), dim=-1) * before).sum(-1)
        assert (cos < 0.999).all() and block.attn.log_sharpness.grad.abs().sum() > 0
    model.eval()
    usage = dict(attention_reports(model, x[:64]))['transformer.h.0.attn']['perplexity']
    assert not torch.allclose(usage, usage0, atol=1e-2)


def test_usage_statistics():
    H, T, m = 2, 6, 4
    hard = F.one_hot(torch.tensor([[0] * T, [0, 1, 2, 3, 0, 1]]), m).double().unsqueeze(0)  # (1, H, T, m)
    stats = cluster_usage(hard)
    torch.testing.assert_close(stats['entropy'], torch.zeros(2, dtype=torch.float64))
    assert stats['perplexity'][0].item() == pytest.approx(1.0)
    p = torch.tensor([2, 2, 1, 1]) / 6.0
    assert stats['perplexity'][1].item() == pytest.approx(math.exp(-(p * p.log()).sum().item()))
    uniform = cluster_usage(torch.full((1, H, T, m), 1 / m))
    torch.testing.assert_close(uniform['perplexity'], torch.full((H,), float(m)))
    torch.testing.assert_close(uniform['entropy'], torch.full((H,), math.log(m)))
    attn = make(10).eval()
    x = torch.randn(1, 10, 24, dtype=torch.float64)
    attn(x)
    assert not hasattr(attn, 'stats')  # a forward leaves nothing behind: the report is asked for
    report = attn.report(*attn.project(x))
    assert report['perplexity'].shape == (3,) and (report['perplexity'] <= 4 + 1e-9).all()


@pytest.mark.parametrize('kw,match', [
    (dict(cluster_m=0), 'cluster_m must be >= 1'),
    (dict(cluster_chunk=0), 'cluster_chunk must be >= 1'),
    (dict(cluster_iters=1), 'cluster_iters and cluster_self are the bidirectional'),
    (dict(cluster_self=True), 'cluster_iters and cluster_self are the bidirectional'),
    (dict(causal=False, cluster_iters=-1), 'cluster_iters must be >= 0'),
    (dict(cluster_sharpness=0.0), 'cluster_sharpness and cluster_seed_lr must be > 0'),
    (dict(cluster_seed_lr=-1.0), 'cluster_sharpness and cluster_seed_lr must be > 0'),
])
def test_bad_settings_fail_at_construction(kw, match):
    with pytest.raises(ValueError, match=match):
        build_attention(AttentionConfig(**{**dict(n_embd=24, n_head=3, attention='cluster'), **kw}), 0)
