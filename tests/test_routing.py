"""Routing attention against a slow reference written straight from the formula (docs/rules.md#routing): per head and
query, the layer norm by hand, the nearest centroid by a loop, the visible keys listed (the last w of the query's
cluster among j <= i; a local head's last w tokens), a softmax over them. Float64, forward and gradients (q, k, v).
Then what is not in the formula: the k-means (once per optimizer step, never in eval, the EMA formula, the same on
every rank), the commitment loss, memory linear in T, the cache, the settings."""
import math
import multiprocessing
from functools import partial

import pytest
import torch
import torch.nn.functional as F

from rules import AttentionConfig, build_attention
from conftest import assert_causal, build_layer, cached_generation_equals_the_forward
from conftest import qkv as shared_qkv
from model import GPT, GPTConfig, configure_adamw


def layer_norm(x, eps=1e-5):  # no scale, no bias
    mean = x.mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(((x - mean) ** 2).mean(-1, keepdim=True) + eps)


def routing_reference(q, k, v, centroids, n_route, w, rope=None):
    """y_i = Σ_{j ∈ N_i} softmax(q'_i·k'_j/√D) v_j: a routing head's q' = k' = LN(q), N_i the last w of the j <= i in
    i's cluster (nearest centroid to LN(q)/√D); a local head's own q, k and the last w tokens."""
    B, H, T, D = q.shape
    heads = []
    for h in range(H):
        if h < n_route:
            queries = keys = layer_norm(q[:, h])                                       # (B, T, D)
            x = queries / math.sqrt(D)
            cluster = [[max(range(centroids.size(1)), key=lambda c: (x[b, t] * centroids[h, c]).sum().item())
                        for t in range(T)] for b in range(B)]
        else:
            queries, keys, cluster = q[:, h], k[:, h], [[0] * T for _ in range(B)]
        if rope is not None:
            queries, keys = rope(queries.unsqueeze(1))[:, 0], rope(keys.unsqueeze(1))[:, 0]
        rows = []
        for b in range(B):
            out = []
            for i in range(T):
                js = [j for j in range(i + 1) if cluster[b][j] == cluster[b][i]][-w:]
                scores = torch.stack([(queries[b, i] * keys[b, j]).sum() / math.sqrt(D) for j in js])
                out.append(sum(p * v[b, h, j] for p, j in zip(torch.softmax(scores, 0), js)))
            rows.append(torch.stack(out))                                              # (T, D)
        heads.append(torch.stack(rows))                                                # (B, T, D)
    return torch.stack(heads, 1)                                                       # (B, H, T, D)


def make(T, n_head=4, **kw):
    attn = build_layer('routing', T, n_head=n_head, **{**dict(routing_clusters=3, routing_window=5), **kw})
    g = torch.Generator().manual_seed(7)  # centroids by hand, different per head
    with torch.no_grad():
        attn.centroids.copy_(F.normalize(torch.randn(attn.centroids.shape, generator=g, dtype=torch.float64), dim=-1))
    return attn


qkv = partial(shared_qkv, H=4)  # conftest's q, k, v at this file's head shape


# T, local heads, C, w, RoPE: the window binding in clusters (w < cluster sizes) and not (w > T), T not a multiple of
# the band's tile, every head routing, every head local, one cluster
CASES = [(40, 2, 3, 5, False), (37, 1, 4, 64, False), (70, 0, 2, 9, True), (33, 4, 3, 4, False), (30, 1, 1, 6, True)]


@pytest.mark.parametrize('T,local,C,w,rope', CASES)
def test_matches_reference(T, local, C, w, rope):
    """The rule's formula as code (attend_reference, every pair at once) and its math path (attend, on the sorted
    band), each against the per-query reference above: the output and the gradients of q, k and v."""
    attn = make(T, routing_local_heads=local, routing_clusters=C, routing_window=w,
                pos_emb='rope' if rope else 'learned').eval()
    q, k, v = qkv(T)
    ref = routing_reference(q, k, v, attn.centroids, attn.n_route, w, attn.rope)
    if attn.n_route and C > 1:  # the routing is real: several clusters, and some longer than the window
        _, clusters = attn.route(q)
        sizes = F.one_hot(clusters, C).sum(2)
        assert (sizes > 0).sum(-1).min() > 1 and (w >= T or sizes.max() > w)
    g = torch.randn_like(ref)
    grads_ref = [torch.zeros_like(t) if d is None else d
                 for t, d in zip((q, k, v), torch.autograd.grad(ref, (q, k, v), g, allow_unused=True))]
    for path in (attn.attend_reference, attn.attend):
        y = path(q, k, v)
        torch.testing.assert_close(y, ref, atol=1e-10, rtol=1e-10, msg=path.__name__)
        grads = [torch.zeros_like(t) if d is None else d
                 for t, d in zip((q, k, v), torch.autograd.grad(y, (q, k, v), g, allow_unused=True))]
        for name, a, b in zip('qkv', grads, grads_ref):
            if name != 'k' or local:  # a routing head reads no k: its key is its query
                assert b.abs().sum() > 0, name  # the reference gradient is not trivially zero
            torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10, msg=f'{path.__name__}: gradient of {name}')
        print(f"T={T} {path.__name__}: max |y - ref| {(y - ref).abs().max().item():.1e}")


def test_a_routing_head_shares_its_query_and_key():
    attn = make(16, routing_local_heads=1)  # 3 routing heads, 1 local, D = 8
    x = torch.randn(2, 16, 32, dtype=torch.float64)
    q, k, v = attn.project(x)
    assert torch.equal(q[:, :3], k[:, :3]) and not torch.equal(q[:, 3], k[:, 3])
    assert attn.c_attn.weight.shape == (96, 32)  # q, k, v of every head, as softmax (and the official code)
    attn.train()(x).square().sum().backward()
    rows = attn.c_attn.weight.grad.abs().sum(1).view(3, 4, 8).sum(-1)  # (q/k/v, head)
    assert not rows[1, :3].any() and rows[1, 3].all() and rows[0].all() and rows[2].all()  # routing heads' k: unused
    assert torch.allclose(attn.centroids.norm(dim=-1), torch.ones(3, 3, dtype=torch.float64))


@pytest.mark.parametrize('kw', [dict(pos_emb='rope'), dict(pos_emb='learned', routing_local_heads=0)])
def test_gpt_is_causal(kw):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=40, vocab_size=11, attention='routing',
                          routing_clusters=3, routing_window=4, **kw)).eval()
    assert_causal(model, T=40, cut=21)


def routed_sums(attn, x):
    """Σ x (float64) and counts per head and centroid of an input's routing heads, straight from the formula."""
    q = attn.project(x)[0][:, :attn.n_route]
    x_hat = layer_norm(q) / math.sqrt(q.size(-1))                                      # (B, R, T, D)
    one_hot = F.one_hot((x_hat @ attn.centroids.transpose(-1, -2)).argmax(-1), attn.centroids.size(1)).double()
    return torch.einsum('brtc,brtd->rcd', one_hot, x_hat.detach()), one_hot.sum((0, 2))


def test_centroids_move_once_per_optimizer_step_by_the_ema_and_never_in_eval():
    torch.manual_seed(0)
    attn = make(24, routing_clusters=4, routing_decay=0.9).train()
    with torch.no_grad():  # ±u: one of them always scores >= 0; the last, along (1, ..., 1), scores 0 (LN's mean is 0)
        attn.centroids[:, 1] = -attn.centroids[:, 0]
        attn.centroids[:, 3] = 1 / math.sqrt(8)
    optimizer = configure_adamw(attn, 0.0, 1e-3, (0.9, 0.95), 'cpu')
    start, sums, counts = attn.centroids.clone(), 0, 0
    for _ in range(2):  # two micro-steps of one optimizer step
        x = torch.randn(2, 24, 32, dtype=torch.float64)
        s, n = routed_sums(attn, x)
        sums, counts = sums + s, counts + n
        attn(x).square().sum().backward()
        assert torch.equal(attn.centroids, start)  # not in a forward or backward
    assert not counts[:, 3].any() and counts[:, :3].all()  # the last got no key this step: it must stay
    optimizer.step()
    moved = F.normalize(0.9 * start + 0.1 * F.normalize(sums, dim=-1), dim=-1)
    expected = torch.where(counts.unsqueeze(-1) > 0, moved, start)
    torch.testing.assert_close(attn.centroids, expected, atol=1e-14, rtol=0)
    assert not torch.equal(attn.centroids, start)
    after = attn.centroids.clone()
    optimizer.step()  # no forward since: nothing to move
    assert torch.equal(attn.centroids, after)
    attn.eval()
    attn(torch.randn(2, 24, 32, dtype=torch.float64)).sum().backward()
    optimizer.step()  # eval forwards route but never update
    assert torch.equal(attn.centroids, after) and not attn.cluster_counts.any()


def test_every_layer_moves_with_the_model_optimizer_and_a_checkpoint_holds_the_centroids():
    torch.manual_seed(0)
    config = GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=32, vocab_size=11, attention='routing', mix=True)
    model = GPT(config)
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), 'cpu')
    layers = [block.attn.rule for block in model.transformer.h]
    start = [m.centroids.clone() for m in layers]
    idx = torch.randint(0, 11, (2, 32))
    model(idx, idx)[1].backward()
    optimizer.step()
    assert all(not torch.equal(m.centroids, s) for m, s in zip(layers, start))
    state = model.state_dict()
    assert 'transformer.h.0.attn.rule.centroids' in state and not any('cluster_' in key for key in state)
    resumed = GPT(config)
    resumed.load_state_dict(state)
    assert torch.equal(resumed.transformer.h[1].attn.rule.centroids, layers[1].centroids)


def ddp_rank(rank, path, queue):
    """One of two gloo ranks: each routes its own batch, steps, and sends back its centroids."""
    torch.distributed.init_process_group('gloo', init_method=f'file://{path}', rank=rank, world_size=2)
    try:
        attn = make(24, routing_clusters=4, routing_decay=0.9).train()
        optimizer = configure_adamw(attn, 0.0, 1e-3, (0.9, 0.95), 'cpu')
        x = torch.randn(2, 24, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(rank))
        sums, counts = routed_sums(attn, x)
        attn(x).sum().backward()
        optimizer.step()
        # sent by value: a tensor would go by a shared file descriptor, whose socket is gone once this process ends
        queue.put((rank, *(t.detach().numpy().copy() for t in (attn.centroids, sums, counts))))
    finally:
        torch.distributed.destroy_process_group()


def test_ranks_all_reduce_their_sums_and_keep_the_same_centroids(tmp_path):
    torch.manual_seed(0)  # each rank's copy of make() starts from the same centroids and weights (forked)
    context = multiprocessing.get_context('fork')
    queue = context.Queue()
    ranks = [context.Process(target=ddp_rank, args=(r, tmp_path / 'store', queue)) for r in range(2)]
    for p in ranks:
        p.start()
    results = {r: [torch.from_numpy(a) for a in rest] for r, *rest in (queue.get(timeout=60) for _ in ranks)}
    for p in ranks:
        p.join(timeout=60)
    start = make(24, routing_clusters=4).centroids
    sums, counts = results[0][1] + results[1][1], results[0][2] + results[1][2]
    moved = F.normalize(0.9 * start + 0.1 * F.normalize(sums, dim=-1), dim=-1)
    expected = torch.where(counts.unsqueeze(-1) > 0, moved, start)
    torch.testing.assert_close(results[0][0], expected, atol=1e-14, rtol=0)
    assert torch.equal(results[0][0], results[1][0])


def test_commitment_loss_is_the_formula_and_reaches_the_model_loss_by_its_gradient_alone():
    beta = 0.5  # large, so the term stands well above rounding
    attn = make(20, routing_commitment=beta)
    q, k, v = qkv(20)
    attn.eval().attend(q, k, v)
    assert attn.extra_loss() is None  # eval: no term
    attn.train().attend(q, k, v)
    term = attn.extra_loss()
    assert attn.extra_loss() is None  # read once
    x = layer_norm(q[:, :attn.n_route]) / math.sqrt(8)
    mu = attn.centroids[torch.arange(attn.n_route).view(1, -1, 1), (x @ attn.centroids.transpose(-1, -2)).argmax(-1)]
    explicit = beta * (x - mu.detach()).pow(2).sum(-1).mean()                          # β·mean‖x - sg(μ)‖²
    torch.testing.assert_close(term, explicit, atol=1e-14, rtol=0)
    grad, = torch.autograd.grad(term, q)
    assert grad[:, :attn.n_route].abs().sum() > 0 and not grad[:, attn.n_route:].any()
    torch.testing.assert_close(grad, torch.autograd.grad(explicit, q)[0], atol=1e-14, rtol=0)
    # in a GPT: the training loss's value is the task's, its gradient has the term's
    grads, losses = [], []
    for commitment, training in [(0.0, True), (1e-2, True), (1e-2, False)]:
        torch.manual_seed(0)
        model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=24, vocab_size=11, attention='routing',
                              routing_commitment=commitment)).double().train(training)
        idx = torch.randint(0, 11, (2, 24), generator=torch.Generator().manual_seed(1))
        loss = model(idx, idx)[1]
        losses.append(loss.item())
        grads.append(torch.autograd.grad(loss, model.transformer.h[0].attn.c_attn.weight)[0])
    assert losses[0] == losses[1] == losses[2]
    assert not torch.equal(grads[0], grads[1]) and torch.equal(grads[0], grads[2])


def test_saves_memory_linear_in_T_for_backward():
    # everything autograd keeps is O(T·w) per head (the band's weights and masks) or O(T·D): no T×T, no chunk × T
    def saved_by_backward(T, w=8):
        attn = make(T, routing_clusters=4, routing_window=w).train()
        q, k, v = qkv(T)
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
            attn.attend(q, k, v).sum().backward()
        return max(saved), sum(saved)
    B, H, D, w = 2, 4, 8, 8
    (big, total), (big2, total2) = saved_by_backward(256), saved_by_backward(512)
    assert big <= B * H * 256 * 2 * w < B * H * 256 * 256 // 8  # the band: T × 2w per head
    assert total <= 40 * B * H * 256 * max(2 * w, D)
    assert big2 == 2 * big and total2 <= 2 * total + 1000  # twice the tokens, twice the memory


@pytest.mark.parametrize('kw', [dict(routing_local_heads=0), dict(routing_local_heads=1, pos_emb='rope')])
def test_cache_crosses_every_ring_and_stays_constant(kw):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=64, vocab_size=11, attention='routing',
                          routing_clusters=2, routing_window=3, **kw)).double().eval()
    prompt = torch.randint(0, 11, (2, 10), generator=torch.Generator().manual_seed(1))
    cache = cached_generation_equals_the_forward(model, prompt, 40)
    rings = cache.layers[0]
    assert rings.count.sum(-1).eq(50).all() and rings.count.max() > 3  # a ring wrapped around
    assert cache.nbytes() == GPT.filled_cache(model, torch.zeros(2, 10, 16, dtype=torch.float64)).nbytes()


BAD = [(dict(routing_clusters=0), 'routing_clusters must be >= 1'),
       (dict(routing_window=0), 'routing_window must be >= 1'),
       (dict(routing_local_heads=5), r'routing_local_heads must be in \[0, n_head=4\]'),
       (dict(routing_local_heads=-2), r'routing_local_heads must be in \[0, n_head=4\]'),
       (dict(routing_decay=1.5), r'routing_decay must be in \[0, 1\]'),
       (dict(routing_decay=float('nan')), r'routing_decay must be in \[0, 1\]'),
       (dict(routing_commitment=-1e-4), 'routing_commitment must be a finite number >= 0'),
       (dict(routing_commitment=float('inf')), 'routing_commitment must be a finite number >= 0'),
       (dict(causal=False, grid_size=4), r"attention='routing' \(RoutingAttention\) has no bidirectional form")]


@pytest.mark.parametrize('kw,match', BAD)
def test_bad_settings_fail_at_construction(kw, match):
    with pytest.raises(ValueError, match=match):
        build_attention(AttentionConfig(n_embd=32, n_head=4, block_size=17, attention='routing', **kw), 0)
