"""attention='routing': softmax within the query's k-means cluster, local heads beside (docs/rules.md#routing)."""
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attention import Attention
from machinery.band import band_keys, band_layout, band_queries, unband
from machinery.caches import ClusterRingCache
from machinery.clusters import cluster_usage
from machinery.heads import split_heads
from machinery.masks import band_mask, sliding_window_mask, visible_keys


def routing_reference(q, k, v, centroids, w, rope=None):
    """The formula, every (i, j) pair at once: (B, H, T, D) q, k, v, the unit centroids (R, C, D) of the first R
    heads (they route; the others are local), w, RoPE (None: off). O(T²) memory: the reference the other paths equal
    (tests/test_routing.py); `attend` computes the same on a band of w over the tokens sorted by cluster. The forward
    function alone: no k-means statistics, no commitment loss, no dropout."""
    (B, H, T, D), R = q.shape, centroids.size(0)
    routed = q[:, :R].to(torch.promote_types(q.dtype, torch.float32))   # the routing heads' q, float32 at least
    x = F.layer_norm(routed, (D,)) / math.sqrt(D)                       # x_i = LN(q_i)/√D, LN unscaled, (B, R, T, D)
    with torch.autocast(q.device.type, enabled=False):                  # the choice in float32 too
        c = (x @ centroids.to(x.dtype).transpose(-1, -2)).argmax(-1)    # c(i) = argmax_c x_i·μ_c, (B, R, T)
    c = torch.cat([c, c.new_zeros(B, H - R, T)], 1)                     # a local head: one cluster, (B, H, T)
    shared = (x * math.sqrt(D)).to(q.dtype)                             # LN(q_i): a routing head's query and key
    queries, keys = (torch.cat([shared, t[:, R:]], 1) for t in (q, k))  # q', k': a local head's own, (B, H, T, D)
    if rope is not None:                                                # turned after routing
        queries, keys = rope(queries), rope(keys)
    same = (c.unsqueeze(-1) == c.unsqueeze(-2)).tril()                  # c(j) = c(i) and j <= i, (B, H, T, T)
    rank = same.sum(-1)                                                 # i's number in its cluster, (B, H, T)
    visible = same & (rank.unsqueeze(-1) - rank.unsqueeze(-2) < w)      # N_i: the last w of them
    s = queries @ keys.transpose(-1, -2) / math.sqrt(D)                 # s_ij = q'_i·k'_j/√D, (B, H, T, T)
    return s.masked_fill(~visible, float('-inf')).softmax(-1) @ v       # y_i = Σ_{j ∈ N_i} softmax_j(s_ij) v_j


@dataclass
class RoutingConfig:
    routing_clusters: int = 8        # routing: k-means centroids C per routing head
    routing_window: int = 16         # routing: w, the most recent keys of its cluster a query sees (local: tokens)
    routing_local_heads: int = -1    # routing: heads of sliding-window attention, the rest route; -1: n_head // 2
    routing_decay: float = 0.999     # routing: EMA decay λ of the centroids, applied once per optimizer step
    routing_commitment: float = 1e-4  # routing: weight β of the commitment loss β·mean‖x - sg(μ_c(x))‖²


class RoutingAttention(Attention):
    """
    x_i = LN(q_i)/√D,  c(i) = argmax_c x_i·μ_c          routing heads: one vector is query and key; unit centroids
    y_i = Σ_{j ∈ N_i} softmax_j(LN(q_i)·LN(q_j)/√D) v_j,   N_i = the last w of the j <= i with c(j) = c(i)
    local heads: the same softmax of q_i·k_j/√D over the last w tokens, i - w < j <= i
    ("Efficient Content-Based Sparse Attention with Routing Transformers", Roy, Saffar, Vaswani, Grangier 2021,
    arXiv 2003.05997, sec. 4; docs/rules.md#routing)

    Content-based sparsity: a routing head's query is its key (shared q/k), layer-normed without scale or bias, and
    goes to its nearest of C unit centroids (spherical k-means; no gradient through the choice); a query sees the
    most recent w keys of its own cluster. Each token to its nearest centroid is the unbalanced, causal-safe form:
    the official balanced top-w routing lets future tokens decide which past keys a query sees. The centroids are
    buffers (random unit vectors at init, checkpointed), moved once per optimizer step by after_optimizer_step
    toward the mean direction of the keys routed to them in that step's training forwards (decay λ), never in eval;
    the commitment loss goes to the model's loss by extra_loss. `routing_local_heads` heads (the last ones) attend to
    a sliding window instead, as the paper mixes them. The formula as dense code, O(T²): routing_reference
    (attend_reference). Math path: tokens sorted by (cluster, position), a causal band of w over that order masked
    to the query's cluster, put back: O(T·w), never T×T (a local head is the same band with one cluster). RoPE turns
    the routing vectors after they are routed: clusters of content, not position. Cache: a ring of the last w keys
    per head and cluster (ClusterRingCache), O(C·w) for ever. No flex path.
    """
    has_cache = True
    Config = RoutingConfig

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        H, D = self.n_head, self.head_dim
        C, w, L = config.routing_clusters, config.routing_window, config.routing_local_heads
        L = H // 2 if L == -1 else L
        if C < 1:
            raise ValueError(f"routing_clusters must be >= 1, got {C}")
        if w < 1:
            raise ValueError(f"routing_window must be >= 1, got {w}")
        if not 0 <= L <= H:
            raise ValueError(f"routing_local_heads must be in [0, n_head={H}] (or -1: n_head // 2), got "
                             f"{config.routing_local_heads}")
        if not (math.isfinite(config.routing_decay) and 0 <= config.routing_decay <= 1):
            raise ValueError(f"routing_decay must be in [0, 1], got {config.routing_decay}")
        if not (math.isfinite(config.routing_commitment) and config.routing_commitment >= 0):
            raise ValueError(f"routing_commitment must be a finite number >= 0, got {config.routing_commitment}")
        self.cluster_window, self.n_route = w, H - L
        self.decay, self.commitment = config.routing_decay, config.routing_commitment
        self.mask_mod = sliding_window_mask(w)  # on the band: over the sorted order (routing) or positions (local)
        self.commitment_loss = None  # what the last training forward left for extra_loss
        self.register_buffer('centroids', F.normalize(torch.randn(self.n_route, C, D), dim=-1))  # (R, C, D)
        # what training forwards routed since the last optimizer step: Σ x and how many, per head and centroid
        self.register_buffer('cluster_sums', torch.zeros(self.n_route, C, D), persistent=False)
        self.register_buffer('cluster_counts', torch.zeros(self.n_route, C), persistent=False)

    def attend_reference(self, q, k, v):  # the formula (routing_reference) with this layer's centroids, w and RoPE
        return routing_reference(q, k, v, self.centroids, self.cluster_window, self.rope)

    def project(self, x, offset=0):  # the frame's, but no RoPE here: a routing head is routed first, then turned
        q, k, v = (split_heads(t, self.n_head) for t in self.c_attn(x).chunk(3, dim=2))
        # a routing head's key is its query: its own k rows of c_attn go unused, as in the official code (softmax's
        # parameter count, and a pretrained softmax's q, k, v can start the rule's branch)
        return q, torch.cat([q[:, :self.n_route], k[:, self.n_route:]], 1), v  # (B, H, T, D) each

    def attend(self, q, k, v):
        x, clusters = self.route(q)
        if self.training:
            self.accumulate(x.detach(), clusters)
        queries, keys, ids = self.heads(q, k, x, clusters)
        T = q.size(2)
        order = (ids * T + torch.arange(T, device=q.device)).argsort(-1)    # (B, H, T): by cluster, then position
        qs, ks, vs, ids = (sort_tokens(t, order) for t in (queries, keys, v, ids.unsqueeze(-1)))
        _, tile, lookback = band_layout(self.cluster_window, T)
        same = band_queries(ids, tile) == band_keys(ids, tile, lookback).transpose(-1, -2)  # (B, H, n, tile, tile+lb)
        visible = same & band_mask(self.mask_mod, T, tile, lookback, q.device)  # the last w slots of the own cluster
        scores = band_queries(qs, tile) @ band_keys(ks, tile, lookback).transpose(-1, -2) / math.sqrt(q.size(-1))
        weights = F.dropout(scores.masked_fill(~visible, float('-inf')).softmax(-1), self.dropout, self.training)
        y = unband(weights @ band_keys(vs, tile, lookback), T)                 # (B, H, T, D), sorted
        return sort_tokens(y, order.argsort(-1))                               # back in position order

    def route(self, q):
        """The routing heads' x = LN(q)/√D (B, R, T, D), on the unit sphere up to LN's eps, in float32 or wider, and
        each token's cluster (B, R, T). A training forward leaves the commitment loss for extra_loss."""
        D = self.head_dim
        x = F.layer_norm(q[:, :self.n_route].to(torch.promote_types(q.dtype, torch.float32)), (D,)) / math.sqrt(D)
        clusters = self.nearest_centroid(x)
        if self.training and self.commitment and self.n_route and torch.is_grad_enabled():  # β·mean‖x - sg(μ)‖²
            self.commitment_loss = self.commitment * (x - self.chosen(clusters).to(x.dtype)).pow(2).sum(-1).mean()
        return x, clusters

    def extra_loss(self):  # the last training forward's commitment loss, once
        loss, self.commitment_loss = self.commitment_loss, None
        return loss

    @torch.no_grad()
    def nearest_centroid(self, x):  # (B, R, T, D) -> (B, R, T): the nearest unit centroid (largest x·μ_c), float32+
        with torch.autocast(x.device.type, enabled=False):
            return (x @ self.centroids.to(x.dtype).transpose(-1, -2)).argmax(-1)

    def chosen(self, clusters):  # (B, R, T) -> (B, R, T, D): each token's centroid
        return self.centroids[torch.arange(self.n_route, device=clusters.device).view(1, -1, 1), clusters]

    def heads(self, q, k, x, clusters, offset=0):
        """What each head attends with: queries and keys (B, H, T, D), RoPE-rotated from position `offset` where it
        is on, and each token's cluster (B, H, T): the routing heads' LN(q) and clusters, the local heads' own q and
        k in one cluster, 0."""
        B, R, T, D = x.shape
        shared = (x * math.sqrt(D)).to(q.dtype)  # LN(q): a routing head's query and key
        queries, keys = torch.cat([shared, q[:, R:]], 1), torch.cat([shared, k[:, R:]], 1)
        if self.rope is not None:
            queries, keys = self.rope(queries, offset), self.rope(keys, offset)
        ids = torch.cat([clusters, clusters.new_zeros(B, self.n_head - R, T)], 1)
        return queries, keys, ids

    @torch.no_grad()
    def accumulate(self, x, clusters):  # a training forward: Σ x and the count of each centroid's tokens, per head
        R, C, D = self.centroids.shape
        index = (clusters + C * torch.arange(R, device=x.device).view(1, R, 1)).flatten()  # head·C + cluster
        self.cluster_sums.view(R * C, D).index_add_(0, index, x.reshape(-1, D).to(self.cluster_sums.dtype))
        self.cluster_counts.view(R * C).index_add_(0, index, torch.ones_like(index, dtype=self.cluster_counts.dtype))

    @torch.no_grad()
    def after_optimizer_step(self):
        """The k-means step, once per optimizer step (model.configure_adamw's hook): each centroid that keys were
        routed to since the last step becomes normalize(λ μ + (1 - λ) normalize(Σ x)); the others stay. Under
        torch.distributed the sums are all-reduced first, so every rank keeps the same centroids. Then they restart."""
        sums, counts = self.cluster_sums, self.cluster_counts
        if not self.n_route:  # every head local: nothing to move
            return
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(sums)
            torch.distributed.all_reduce(counts)
        moved = F.normalize(self.decay * self.centroids + (1 - self.decay) * F.normalize(sums, dim=-1), dim=-1)
        self.centroids.copy_(torch.where(counts.unsqueeze(-1) > 0, moved, self.centroids))
        sums.zero_()
        counts.zero_()

    @torch.no_grad()
    def report(self, q, k, v):
        """Per routing head: the perplexity of its cluster sizes (clusters in use, 1..C) and the mean ‖x - μ_c(x)‖²
        (what the commitment loss weighs: 0 when every key sits on its centroid)."""
        if not self.n_route:
            return None
        x, clusters = self.route(q)
        sizes = F.one_hot(clusters, self.centroids.size(1)).to(x.dtype)
        return {'perplexity': cluster_usage(sizes)['perplexity'],
                'distance': (x - self.chosen(clusters).to(x.dtype)).pow(2).sum(-1).mean((0, 2))}

    def ideal_flops(self, T):  # at most: softmax's on the last w of a cluster (it may hold fewer), and the routing
        C, D, K = self.n_head * self.head_dim, self.head_dim, self.centroids.size(1)
        return 4 * C * visible_keys(self, T).mean().item() + 2 * D * K * self.n_route

    def new_cache(self):  # the last w keys and values of each head's clusters: O(C·w) per head, any length
        return ClusterRingCache(self.cluster_window, self.centroids.size(1))

    def fill(self, cache, q, k, v):
        _, keys, ids = self.heads(q, k, *self.route(q), offset=cache.pos)
        cache.fill(keys, v, ids)

    def decode(self, q, k, v, cache):  # (B, H, 1, D): the keys its cluster's ring holds (a local head: the last w)
        queries, keys, ids = self.heads(q, k, *self.route(q), offset=cache.pos)
        keys, values, held = cache.append(keys, v, ids)                  # (B, H, w, D) each, (B, H, w)
        scores = queries @ keys.transpose(-1, -2) / math.sqrt(q.size(-1))  # (B, H, 1, w)
        return scores.masked_fill(~held.unsqueeze(-2), float('-inf')).softmax(-1) @ values


def sort_tokens(x, order):  # (B, H, T, D), (B, H, T) -> x[:, :, order] per head
    return x.gather(2, order.unsqueeze(-1).expand(-1, -1, -1, x.size(-1)))
