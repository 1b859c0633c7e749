"""attention='cluster': attention to soft cluster summaries of the keys (docs/rules.md#cluster)."""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from attention import Attention
from machinery.band import band_queries, exclusive_cumsum, unband
from machinery.clusters import cluster_usage
from machinery.masks import band_mask, causal_mask


def cluster_reference(q, k, v, seeds, log_sharpness, chunk, iters, self_term):
    """The formula, every (i, j) pair at once: (B, H, T, D) q, k, v, the seeds (H, m, D), log s per head (H,), the
    GPT's chunk L (None: the ViT), the ViT's refinements and self term. O(T²) memory: the reference the other paths
    equal (tests/test_cluster.py); `attend` computes the same chunk by chunk, the sums of earlier chunks carried
    across (ViT: one set of sums). The forward function, without dropout on the weights."""
    T, D, pos = q.size(2), q.size(-1), torch.arange(q.size(2), device=q.device)
    if chunk:  # query i: its own chunk exactly (j <= i), every earlier chunk summarised
        exact = (pos[:, None] // chunk == pos // chunk) & (pos[:, None] >= pos)             # (T, T)
        past = (pos[:, None] // chunk > pos // chunk).to(q.dtype)                          # (T, T)
    else:  # every key summarised, and with the self term its own key exactly
        exact, past = torch.eye(T, dtype=torch.bool, device=q.device) & self_term, q.new_ones(T, T)
    k_hat, s = F.normalize(k, dim=-1), log_sharpness.exp().view(-1, 1, 1)
    S = (s * k_hat @ F.normalize(seeds, dim=-1).transpose(-1, -2)).softmax(-1)          # S_jc, (B, H, T, m)
    for _ in range(iters):  # soft spherical k-means: seed c <- Σ_j S_jc k̂_j
        S = (s * k_hat @ F.normalize(S.transpose(-1, -2) @ k_hat, dim=-1).transpose(-1, -2)).softmax(-1)
    N = torch.einsum('ij,bhjc->bhic', past, S)                     # N_c of the keys query i summarises, (B, H, T, m)
    safe = N.clamp_min(torch.finfo(N.dtype).tiny).unsqueeze(-1)    # an empty cluster (no past): 0/tiny, not 0/0
    mean_k = torch.einsum('ij,bhjc,bhjd->bhicd', past, S, k) / safe                     # K̄_c, (B, H, T, m, D)
    mean_v = torch.einsum('ij,bhjc,bhjd->bhicd', past, S, v) / safe                     # V̄_c, (B, H, T, m, D)
    log_N = safe[..., 0].log().masked_fill(N == 0, float('-inf'))                       # log N_c, -inf if empty
    exact_scores = (q @ k.transpose(-1, -2) / math.sqrt(D)).masked_fill(~exact, float('-inf'))  # (B, H, T, T)
    cluster_scores = torch.einsum('bhid,bhicd->bhic', q, mean_k) / math.sqrt(D) + log_N  # q_i·K̄_c/√D + log N_c
    w = torch.cat([exact_scores, cluster_scores], -1).softmax(-1)                       # one joint softmax
    return w[..., :T] @ v + torch.einsum('bhic,bhicd->bhid', w[..., T:], mean_v)        # y_i, (B, H, T, D)


@dataclass
class ClusterConfig:
    cluster_m: int = 16          # cluster: seeds (clusters) per head
    cluster_chunk: int = 64      # cluster GPT: tokens per chunk; exact within it, cluster summaries of earlier chunks
    cluster_iters: int = 0       # cluster ViT: soft k-means refinements of the seeds on each sequence (0 = none)
    cluster_self: bool = False   # cluster ViT: each query also attends exactly to its own key
    cluster_sharpness: float = 10.0  # cluster: initial sharpness s of the assignment (learned per head, log_sharpness)
    cluster_seed_lr: float = 10.0    # cluster: the seeds' learning rate, as a multiple of learning_rate


class ClusterAttention(Attention):
    """
    S_jc = softmax_c(s · cos(k_j, seed_c))                    soft assignment of key j to the head's m seeds
    N_c = Σ_j S_jc,  K̄_c = Σ_j S_jc k_j / N_c,  V̄_c = Σ_j S_jc v_j / N_c     cluster mass, mean key, mean value
    y_i = Σ_c softmax_c(q_i·K̄_c/√D + log N_c) V̄_c
    (this project's cluster attention, an answer to the "cluster-attention" note's question 4; docs/rules.md#cluster)

    Attention to m cluster summaries in place of T keys: O(T·m·D), differentiable through the soft assignment; the
    log-mass bias makes it exact when a cluster's keys coincide. Seeds and sharpness s are learned per head.
      - ViT: over the whole sequence, after `cluster_iters` soft spherical k-means refinements of the seeds on the
        keys; `cluster_self` adds the query's own key as one more exact entry of the softmax.
      - GPT, in chunks of `cluster_chunk` tokens: a query attends exactly (causally) to its own chunk and to the
        summaries of all earlier chunks, one joint softmax; the past never depends on the future. O(T·(L + m)·D).
    Seeds are unit-norm, not decayed (cos ignores their norm) and learn at `cluster_seed_lr` × the schedule's rate.
    No flex path: the math path is already dense per-chunk matmuls. `report`: per head, the perplexity of the mean
    assignment (clusters in use, 1..m) and the mean entropy of a key's assignment (0 = hard, log m = uniform).
    The formula on every (i, j) pair, O(T²): `cluster_reference`.
    """
    has_bidirectional_form, has_cache = True, True
    Config = ClusterConfig
    no_decay = ('seeds',)
    first_token_note = "token 0 is folded into cluster summaries beyond its own chunk (GPT) or always (ViT)"

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        m, L, iters = config.cluster_m, config.cluster_chunk, config.cluster_iters
        for key, value in (('cluster_m', m), ('cluster_chunk', L)):
            if value < 1:
                raise ValueError(f"{key} must be >= 1, got {value}")
        if iters < 0:
            raise ValueError(f"cluster_iters must be >= 0, got {iters}")
        if config.causal and (iters or config.cluster_self):
            raise ValueError("cluster_iters and cluster_self are the bidirectional (ViT) form: refining the seeds on "
                             "the sequence would let the past depend on the future, and the causal form already "
                             "attends exactly to its own chunk; use cluster_iters=0, cluster_self=False")
        rates = (config.cluster_sharpness, config.cluster_seed_lr)
        if not all(math.isfinite(r) and r > 0 for r in rates):
            raise ValueError(f"cluster_sharpness and cluster_seed_lr must be > 0 and finite, got {rates[0]}, "
                             f"{rates[1]}")
        self.chunk, self.iters, self.self_term = L, iters, config.cluster_self
        seeds = torch.stack([nn.init.orthogonal_(torch.empty(m, self.head_dim)) for _ in range(self.n_head)])
        self.seeds = nn.Parameter(F.normalize(seeds, dim=-1))  # (H, m, D), unit rows, orthogonal per head if m <= D
        self.log_sharpness = nn.Parameter(torch.full((self.n_head,), math.log(config.cluster_sharpness)))
        self.lr_scale = {'seeds': config.cluster_seed_lr}

    def attend_reference(self, q, k, v):  # the formula (cluster_reference) with this layer's seeds, s and form
        return cluster_reference(q, k, v, self.seeds, self.log_sharpness, self.chunk if self.causal else None,
                                 self.iters, self.self_term)

    def attend(self, q, k, v):
        kv1 = kv_one(k, v)  # (B, H, T, 2D+1)
        return (self.attend_chunks if self.causal else self.attend_all)(q / math.sqrt(q.size(-1)), k, v, kv1)

    def soft_assign(self, k, seeds):
        """S: (B, H, T, m), each key's soft assignment to the seeds (H, m, D) or (B, H, m, D)."""
        seeds = F.normalize(seeds, dim=-1) * self.log_sharpness.exp().view(-1, 1, 1)  # s folded into the seeds
        return (F.normalize(k, dim=-1) @ seeds.transpose(-1, -2)).softmax(-1)

    def assignments(self, k):
        """S of the keys (B, H, T, m) as attend uses it: the ViT form first refines the seeds on this sequence (soft
        spherical k-means: each seed moves to the mean direction of its keys), cluster_iters times."""
        S = self.soft_assign(k, self.seeds)
        for _ in range(self.iters):
            S = self.soft_assign(k, S.transpose(-1, -2) @ F.normalize(k, dim=-1))  # seeds (B, H, m, D)
        return S

    def report(self, q, k, v):
        return cluster_usage(self.assignments(k))

    def attend_all(self, q, k, v, kv1):  # bidirectional; q is already scaled by 1/√D
        S = self.assignments(k)
        mean_k, mean_v, log_mass = cluster_means(S.transpose(-1, -2) @ kv1, q.size(-1))  # (B, H, m, D), (B, H, m)
        scores = q @ mean_k.transpose(-1, -2) + log_mass.unsqueeze(-2)                    # (B, H, T, m)
        if not self.self_term:
            return F.dropout(scores.softmax(-1), self.dropout, self.training) @ mean_v
        scores = torch.cat([scores, (q * k).sum(-1, keepdim=True)], -1)                   # + the own key, exactly
        weights = F.dropout(scores.softmax(-1), self.dropout, self.training)
        return weights[..., :-1] @ mean_v + weights[..., -1:] * v

    def attend_chunks(self, q, k, v, kv1):  # causal, chunkwise; q is already scaled by 1/√D
        (B, H, T, D), L = q.shape, min(self.chunk, q.size(2))
        qc, kvc, Sc = (band_queries(t, L) for t in (q, kv1, self.assignments(k)))  # (B, H, n, L, ·)
        # what each chunk sees of the past: Σ S·[k, v, 1] over all strictly earlier chunks (chunk 0: nothing, N = 0)
        running = torch.promote_types(q.dtype, torch.float32)  # sums over many chunks: bf16 would drift
        sums = exclusive_cumsum((Sc.transpose(-1, -2) @ kvc).to(running), 2)              # (B, H, n, m, 2D+1)
        mean_k, mean_v, log_mass = (t.to(q.dtype) for t in cluster_means(sums, D))
        keys = torch.cat([kvc[..., :D], mean_k], -2)                                       # (B, H, n, L+m, D)
        values = torch.cat([kvc[..., D:2 * D], mean_v], -2)
        within = torch.zeros((), dtype=q.dtype, device=q.device).masked_fill(
            ~band_mask(causal_mask, T, L, 0, q.device), float('-inf'))  # (n, L, L): causal within the chunk
        bias = torch.cat([within.expand(B, H, -1, -1, -1), log_mass.unsqueeze(-2).expand(-1, -1, -1, L, -1)], -1)
        weights = F.dropout((qc @ keys.transpose(-1, -2) + bias).softmax(-1), self.dropout, self.training)
        return unband(weights @ values, T)  # (B, H, T, D)

    def ideal_flops(self, T):
        """Per head: the assignment (2·D·m, and 2·D·m·2 per refinement), Σ S·[k, v, 1] (2·m·(2D+1)), then 4·D per
        entry a query attends to: m summaries (+ its own key, the ViT's self term), or in the GPT its chunk so far
        and the m summaries of earlier chunks where there are some."""
        (H, m, D), iters = self.seeds.shape, self.iters
        if not self.causal:
            return H * (4 * D * m + 2 * D * m * (1 + 2 * iters) + 2 * m * (2 * D + 1) + 4 * D * self.self_term)
        L = min(self.chunk, T)
        i = torch.arange(T, dtype=torch.float64)
        within, summaries = (i % L + 1).mean().item(), m * (i >= L).double().mean().item()
        return H * (4 * D * (within + summaries) + 2 * D * m + 2 * m * (2 * D + 1))

    def new_cache(self):  # Σ S·[k, v, 1] of the finished chunks + the current chunk: O(m + chunk) for ever
        if not self.causal:
            raise ValueError("the bidirectional (ViT) cluster form does not generate; a cache is for the GPT form")
        return ClusterCache()

    def fill(self, cache, q, k, v):
        (B, H, T, D), L = k.shape, self.chunk
        kv1 = kv_one(k, v)                                                       # (B, H, T, 2D+1)
        n, running = T // L, torch.promote_types(k.dtype, torch.float32)
        Sc = self.soft_assign(k[:, :, :n * L], self.seeds).view(B, H, n, L, self.seeds.size(1))  # (B, H, n, L, m); n may be 0
        cache.sums = (Sc.transpose(-1, -2) @ kv1[:, :, :n * L].view(B, H, n, L, 2 * D + 1)).to(running).sum(2)
        cache.current, cache.pos = kv1[:, :, n * L:], T                         # (B, H, T - n·L, 2D+1)

    def decode(self, q, k, v, cache):  # (B, H, 1, D): its own chunk exactly, the finished chunks as summaries
        D = q.size(-1)
        cache.current = torch.cat([cache.current, kv_one(k, v)], 2)
        mean_k, mean_v, log_mass = (t.to(q.dtype) for t in cluster_means(cache.sums, D))  # (B, H, m, ·)
        keys = torch.cat([cache.current[..., :D], mean_k], 2)                              # (B, H, n + m, D)
        values = torch.cat([cache.current[..., D:2 * D], mean_v], 2)
        bias = torch.cat([log_mass.new_zeros(log_mass.shape[:2] + (cache.current.size(2),)), log_mass], -1)
        y = ((q / math.sqrt(D)) @ keys.transpose(-1, -2) + bias.unsqueeze(-2)).softmax(-1) @ values
        cache.pos += 1
        if cache.current.size(2) == self.chunk:  # the chunk is finished: fold it into the summaries
            S = self.soft_assign(cache.current[..., :D], self.seeds)                            # (B, H, L, m)
            cache.sums = cache.sums + (S.transpose(-1, -2) @ cache.current).to(cache.sums.dtype)
            cache.current = cache.current[:, :, :0]
        return y


def kv_one(k, v):  # (B, H, T, 2D+1): [k, v, 1], whose S-weighted sums are ΣSk, ΣSv and the mass N at once
    return torch.cat([k, v, torch.ones_like(k[..., :1])], -1)


def cluster_means(sums, D):
    """Σ S·[k, v, 1] (..., m, 2D+1) -> mean keys, mean values (..., m, D) and log masses (..., m); an empty cluster
    (mass 0) gets log mass -inf and zero means (0 / tiny), not NaN."""
    mass = sums[..., -1]
    safe = mass.clamp_min(torch.finfo(mass.dtype).tiny)  # no 0/0 in the forward, no 1/0 in the backward
    log_mass = safe.log().masked_fill(mass == 0, float('-inf'))
    return sums[..., :D] / safe.unsqueeze(-1), sums[..., D:2 * D] / safe.unsqueeze(-1), log_mass


class ClusterCache:
    """Causal cluster attention between tokens: `sums`, Σ S·[k, v, 1] over the finished chunks (B, H, m, 2D+1), in
    float32 or wider; `current`, the current chunk's [k, v, 1] (B, H, < chunk, 2D+1). O(m + chunk), any length."""

    def __init__(self):
        self.pos, self.sums, self.current = 0, None, None

    def nbytes(self):
        return sum(t.numel() * t.element_size() for t in (self.sums, self.current) if t is not None)
