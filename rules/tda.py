"""attention='tda': threshold differential attention: exact zeros, no sink (docs/rules.md#tda)."""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention.flex_attention import AuxRequest

from attention import Attention
from machinery.band import tile_mask, tile_queries
from machinery.caches import KVCache
from machinery.heads import split_heads
from machinery.kernels.tda import tda_attention
from machinery.masks import causal_mask, run_flex, visible_keys
from machinery.rope import Rotary


def tda_reference(queries, keys, v, beta, lam, kappa, p, causal, head_norm):
    """The formula, every (i, j) pair at once: each view's (B, H, T, d) queries [q1, q2] and keys [k1, k2] (one of
    each: TRA), v (B, H, T, D), β, λ, κ, p, causal, the per-head RMSNorm. O(T²) memory: the reference the other
    paths equal (tests/test_tda.py); `attend` computes the same in tiles of queries."""
    T, view_dim = v.size(2), queries[0].size(-1)
    n = torch.arange(1, T + 1, dtype=v.dtype, device=v.device) if causal else \
        torch.full((T,), T, dtype=v.dtype, device=v.device)                    # the keys row i sees
    tau = beta * (2 * torch.log(n / kappa).clamp_min(0) / view_dim).sqrt()     # τ_i, (T,)
    visible = torch.ones(T, T, dtype=torch.bool, device=v.device).tril(0 if causal else T)  # j <= i where causal

    def view(q, k):  # a_ij = relu(q̂_i·k̂_j - τ_i)^p on visible pairs, 0 elsewhere, (B, H, T, T)
        s = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-1, -2)
        return ((s - tau[:, None]).relu() ** p).masked_fill(~visible, 0)

    a = view(queries[0], keys[0])                                              # a¹
    if len(queries) == 2:
        a = a - lam * view(queries[1], keys[1])                                # a¹ - λa²
    return head_norm(a @ v)                                                    # o_i = RMSNorm(Σ_j a_ij v_j)


@dataclass
class TDAConfig:
    tda_beta: float = 1.0        # TDA: initial threshold scale β > 0 (learned per layer, as log β)
    tda_lambda: float = 0.5      # TDA: initial inhibition λ in (0, 1) of the second view (learned, as its logit)
    tda_kappa: float = 1.0       # TDA: κ > 0, fixed; the threshold's position offset (κ = 1: τ_0 = 0)
    tda_p: float = 2.0           # TDA: power p >= 1 of the rectified excess relu(s - τ)^p, fixed
    tda_differential: bool = True  # TDA: two views, a¹ - λa²; False: one view (the paper's TRA ablation)
    tda_matched: bool = False    # TDA: the views are the halves of each head's q, k (D/2 each): softmax's c_attn (3C)
    tda_eps: float = 1e-4        # TDA: eps of the per-head RMSNorm; a row is amplified at most 1/sqrt(eps) times


class ThresholdDifferentialAttention(Attention):
    """
    s_ij = q̂_i·k̂_j,  q̂ = q/‖q‖, k̂ = k/‖k‖        per view t = 1, 2 (its own q, k of width d; one v); no 1/√D
    τ_i  = β·sqrt(2·ln((i+1)/κ)/d)                d = the views' width; 0-based i (ViT: one τ, (i+1) → N keys)
    a_ij = relu(s_ij - τ_i)^p for j <= i, else 0   the causal mask after the threshold
    o_i  = RMSNorm(Σ_j (a¹_ij - λ a²_ij) v_j)      per head, learnable weight
    ("Threshold Differential Attention: Sink-free, Ultra-sparse, and Non-dispersive Long-context Attention",
    arXiv 2601.12145; docs/rules.md#tda)

    The threshold grows like the largest spurious similarity among i+1 random keys, so only real matches survive:
    weights are exactly 0 elsewhere and nothing forces a row to sum to 1 (no sink). β = exp(log_beta) and
    λ = sigmoid(lambda_logit) are learned per layer; κ and p are fixed; rows with i+1 < κ get τ = 0. The RMSNorm's
    eps (tda_eps) bounds how much a row is amplified: an empty row gives exactly 0. tda_differential=False keeps
    view 1 only (TRA). The views are full width (d = D, c_attn 5C) or, with tda_matched, the two halves of one q
    and k per head (d = D/2, c_attn 3C: softmax's parameters, as Diff's views are), each half rotated by RoPE as a
    head of D/2; v is D wide either way. Paths: the math path in query tiles (recomputed in backward: memory linear
    in T); the kernel (machinery/kernels/tda.py), what forward runs on CUDA; flex, both views on the head axis, τ
    through the queries (docs/rules.md#tda). No attention-weight dropout on any path.
    """
    has_bidirectional_form = True
    has_cache = True
    has_flex = True
    has_kernel = True
    projections = ('q1', 'k1', 'q2', 'k2', 'v')
    weights_note = "a1 - lam*a2: signed, rows not summing to 1, and the per-head RMSNorm after W v rescales each row"
    Config, reads = TDAConfig, ('tile_weights',)
    log_floor = 1e-12  # flex: log's argument is kept >= this, so s = τ exactly never gives 0·∞ = NaN in backward

    def __init__(self, config, layer_idx):
        if config.tda_matched:  # set before the frame sizes c_attn from it
            self.projections = ('q', 'k', 'v')  # each head's q, k halves are the two views (`split_views`)
        elif not config.tda_differential:
            self.projections = ('q1', 'k1', 'v')
        super().__init__(config, layer_idx)
        if config.tda_matched and not config.tda_differential:
            raise ValueError("tda_matched=True splits each head's q and k into two views; tda_differential=False has "
                             "one view, whose c_attn (3C) is softmax's already: pass tda_matched=False")
        parts = 4 if self.rope is not None else 2  # two halves; with RoPE each half is rotated in pairs of channels
        if config.tda_matched and self.head_dim % parts:
            fit = config.n_head * parts * (self.head_dim // parts + 1)
            raise ValueError(f"tda_matched=True needs a head size n_embd/n_head divisible by {parts}, got "
                             f"{self.head_dim}; pass e.g. --n_embd={fit}")
        for key, ok, need in [('tda_beta', config.tda_beta > 0, '> 0'), ('tda_kappa', config.tda_kappa > 0, '> 0'),
                              ('tda_lambda', 0 < config.tda_lambda < 1, 'in (0, 1)'), ('tda_p', config.tda_p >= 1, '>= 1'),
                              ('tda_eps', config.tda_eps > 0, '> 0')]:
            if not (ok and math.isfinite(getattr(config, key))):
                raise ValueError(f"{key} must be {need} and finite, got {getattr(config, key)}")
        self.two_views, self.kappa, self.p = config.tda_differential, config.tda_kappa, config.tda_p
        self.matched = config.tda_matched
        self.view_dim = self.head_dim // 2 if self.matched else self.head_dim  # d: q̂·k̂'s width, τ's dimension
        if self.matched and self.rope is not None:  # each view rotated at its own width (`project`)
            self.rope = Rotary(self.view_dim, config.block_size, config.rope_base, config.rope_scaling,
                               config.rope_factor)
        self.log_beta = nn.Parameter(torch.tensor(math.log(config.tda_beta)))
        if self.two_views:
            self.lambda_logit = nn.Parameter(torch.tensor(math.log(config.tda_lambda / (1 - config.tda_lambda))))
        self.head_norm = nn.RMSNorm(self.head_dim, eps=config.tda_eps)
        self.mask_mod = causal_mask if self.causal else None  # after the threshold (weights); flex's BlockMask

    def attend_reference(self, *tensors):  # the formula (tda_reference) with this layer's views and parameters
        lam = torch.sigmoid(self.lambda_logit) if self.two_views else None
        return tda_reference(*self.split_views(tensors), self.log_beta.exp(), lam, self.kappa, self.p, self.causal,
                             self.head_norm)

    def attend(self, *tensors):  # q1, k1, q2, k2, v (single view: q1, k1, v; matched: q, k, v), (B, H, T, D) each
        queries, keys, v = self.split_views(tensors, normalise=True)
        tau = self.threshold(v.size(2), v.device)

        def tile_output(start, end, n_keys):  # queries start..end-1 against keys 0..n_keys-1
            return self.weights_in_tile(queries, keys, tau, start, end, n_keys) @ v[:, :, :n_keys]
        return self.head_norm(tile_queries(tile_output, v.size(2), self.tile_weights, self.causal))  # (B, H, T, D)

    def attend_kernel(self, *tensors):
        """The sum over keys as one Triton kernel (machinery/kernels/tda.py: relu(s - τ)^p times v in one pass, no
        softmax statistics, a backward that recomputes the scores), what forward runs on CUDA."""
        queries, keys, v = self.split_views(tensors, normalise=True)
        q2, k2, lam = (queries[1], keys[1], torch.sigmoid(self.lambda_logit)) if self.two_views else (None,) * 3
        y = tda_attention(queries[0], keys[0], q2, k2, v, self.threshold(v.size(2), v.device), lam, self.p, self.causal)
        return self.head_norm(y)  # (B, H, T, D)

    def threshold(self, T, device, start=0):
        """τ per query, (T,): τ_i on the 0-based position i = start..start+T-1; without causality one τ for all,
        from the T keys. Generation passes start = the absolute position of the new token."""
        n = torch.arange(start + 1, start + T + 1, device=device) if self.causal else torch.full((T,), T, device=device)
        spurious = 2 * torch.log(n.to(self.log_beta.dtype) / self.kappa).clamp_min(0) / self.view_dim
        return self.log_beta.exp() * spurious.sqrt()

    def project(self, x, offset=0):
        if not (self.matched and self.rope is not None):
            return super().project(x, offset)
        # matched: each half of q and k rotated as a head of D/2, so a view's q̂·k̂ depends on positions by i - j alone
        q, k, v = [split_heads(t, self.n_head) for t in self.c_attn(x).chunk(3, dim=2)]
        return self.rope.rotate_halves(q, offset), self.rope.rotate_halves(k, offset), v

    def split_views(self, tensors, normalise=False):
        """What project returns -> ([q1(, q2)], [k1(, k2)], v), each view's queries and keys unit length where
        `normalise`; matched: the halves of each head's q and k."""
        *qk, v = tensors
        if self.matched:
            (q, k), half = qk, self.view_dim
            qk = [q[..., :half], k[..., :half], q[..., half:], k[..., half:]]
        if normalise:
            qk = [F.normalize(x, dim=-1) for x in qk]
        return qk[0::2], qk[1::2], v

    def view_weights(self, q, k, threshold):  # (B, H, C, D), (B, H, L, D), (C, L) -> (B, H, C, L)
        return (q @ k.transpose(-1, -2) - threshold).relu() ** self.p

    def threshold_weights(self, queries, keys, threshold):
        """a¹ - λa² from each view's unit queries and keys and the thresholds (C, L), +inf where a key is hidden."""
        a = self.view_weights(queries[0], keys[0], threshold)
        if self.two_views:
            a = a - torch.sigmoid(self.lambda_logit) * self.view_weights(queries[1], keys[1], threshold)
        return a

    def weights_in_tile(self, queries, keys, tau, start, end, n_keys):  # queries start..end-1, keys 0..n_keys-1
        threshold = tau[start:end, None].expand(-1, n_keys)  # (C, L)
        if self.causal:  # a hidden key gets an infinite threshold: relu(s - ∞) = 0, whatever s is
            threshold = threshold.masked_fill(~tile_mask(causal_mask, start, end, n_keys, tau.device), float('inf'))
        return self.threshold_weights([q[:, :, start:end] for q in queries], [k[:, :, :n_keys] for k in keys],
                                      threshold)  # (B, H, C, L)

    def attend_flex(self, *tensors, masks=None):
        # exp(score_mod) = relu(q̃·k̂ - τ̃_i)^p, q̃ = q̂/c_i, τ̃_i = τ_i/c_i: Σ_j a_ij v_j = c_i^p · y_i · exp(lse_i),
        # y flex's output (c_i = τ_i, or 1 where τ_i = 0: τ̃_i is 1 or 0): nothing captured needs a gradient. λ after.
        queries, keys, v = self.split_views(tensors, normalise=True)
        B, H, T, D = v.shape
        views, p, floor = len(queries), self.p, self.log_floor
        tau = self.threshold(T, v.device)                                        # (T,)
        passed = tau > 0
        scale = torch.where(passed, tau, torch.ones_like(tau))                   # c_i, (T,)
        scaled_tau = passed.to(v.dtype)                                          # τ̃_i, (T,): needs no gradient
        q = torch.cat(queries, 1) / scale.to(v.dtype)[:, None]                   # (B, views·H, T, view_dim)
        k = torch.cat(keys, 1)

        def threshold_score(score, b, h, q_idx, kv_idx):  # log relu(q̃·k̂ - τ̃_i)^p; -inf (weight 0) at or below
            excess = score - scaled_tau[q_idx]
            return torch.where(excess > 0, p * torch.log(excess.clamp_min(floor)), float('-inf'))

        y, aux = run_flex(q, k, v.repeat(1, views, 1, 1), score_mod=threshold_score, scale=1.0,
                          block_mask=self.flex_masks(T, v.device) if masks is None else masks,
                          return_aux=AuxRequest(lse=True))
        y = (y * (aux.lse + p * torch.log(scale)).exp().unsqueeze(-1)).view(B, views, H, T, D)  # Σ_j a_ij v_j per view
        if self.two_views:
            return self.head_norm((y[:, 0] - torch.sigmoid(self.lambda_logit) * y[:, 1]).to(v.dtype))
        return self.head_norm(y[:, 0].to(v.dtype))

    def ideal_flops(self, T):  # per view a score map d wide (matched: the halves, D/2), then one W v
        views, C = (2 if self.two_views else 1), self.n_head * self.head_dim
        return (2 * views * self.view_dim / self.head_dim + 2) * C * visible_keys(self, T).mean().item()

    def new_cache(self):  # every normalised key of each view and every value: grows with the context
        return KVCache()

    def fill(self, cache, *tensors):
        _, keys, v = self.split_views(tensors, normalise=True)
        cache.append(*keys, v)

    def decode(self, *tensors, cache):  # what project returns for one token, (B, H, 1, D) each
        queries, keys, v = self.split_views(tensors, normalise=True)
        tau = self.threshold(1, v.device, start=cache.pos)  # τ at the new token's absolute position
        cache.append(*keys, v)
        *keys, values = cache.tensors()                      # (B, H, pos, D) each: every key is visible
        return self.head_norm(self.threshold_weights(queries, keys, tau) @ values)

    def attention_weights(self, *tensors):
        """For analysis: the whole (B, H, T, T) matrix a¹ - λa² from what project returns (short T only): the weights
        before the RMSNorm, which is not linear in v (so the frame's identity-basis weights do not apply)."""
        queries, keys, v = self.split_views(tensors, normalise=True)
        T = v.size(2)
        return self.weights_in_tile(queries, keys, self.threshold(T, v.device), 0, T, T)
