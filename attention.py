"""
Every attention rule, side by side: each an nn.Module built as `build_attention(config, layer_idx)` and called as
`y = attn(x)`, x (B, T, C). Read it top to bottom: the masks (which keys a query sees); the frame (`Attention`:
project, attend, out); softmax, whose `attend` is the formula as tensor ops; then each seed rule, its keys, its
formula and paper, its checks and `attend` first, its flex path and cache after; then, the same way, the baselines
the seed papers compare theirs with; the table `ATTENTION`; a softmax branch
beside any rule (`mix`); last the keys every layer reads. What makes the rules fast and lets them generate (the
band, query tiles, BlockMasks, KV caches, RoPE) is in machinery/, imported here and never needed to read a formula.
Exact formulas, derivations, the papers' settings and their code's defects: docs/rules.md.
"""
import math
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention.flex_attention import AuxRequest, and_masks, or_masks

from machinery.band import (band_keys, band_layout, band_queries, band_strip, band_view, exclusive_cumsum,
                            query_tiles, recompute_in_backward, unband)
from machinery.caches import CacheGroup, KVCache, decode_sdpa
from machinery.heads import merge_heads, split_heads, weights_of_linear_map
from machinery.masks import FLEX_DEVICES, band_mask, block_mask, dense_mask, run_flex
from machinery.rope import Rotary, check_rope_scaling


# -----------------------------------------------------------------------------
# masks: which key j a query i may see, as small named mask_mods in the attention-gym style (compose them with
# flex_attention's and_masks / or_masks). machinery/masks.py makes one into a BlockMask, a dense bool or the band's
# tiles, once per shape; a factory is cached, so one mask is one object.

def causal_mask(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def off_diagonal_mask(b, h, q_idx, kv_idx):  # every key but the query's own token (AttentionX's ViT form)
    return q_idx != kv_idx


@lru_cache(maxsize=None)
def sliding_window_mask(window):
    def sliding_window(b, h, q_idx, kv_idx):  # i - W < j <= i
        return (kv_idx <= q_idx) & (q_idx - kv_idx < window)
    return sliding_window


@lru_cache(maxsize=None)
def two_sided_window_mask(half):
    def two_sided_window(b, h, q_idx, kv_idx):  # |i - j| <= half: half keys on each side, and the query's own
        return (q_idx - kv_idx).abs() <= half
    return two_sided_window


@lru_cache(maxsize=None)
def global_tokens_mask(n_global):
    def global_tokens(b, h, q_idx, kv_idx):  # the first n_global tokens see all and are seen by all
        return (q_idx < n_global) | (kv_idx < n_global)
    return global_tokens


@lru_cache(maxsize=None)
def grid_mask(grid_size, radius, metric):
    """Token 0 (CLS) sees and is seen by all; patch i (token 1 + i, row-major) sees patch j iff their distance on
    the grid is at most `radius`, |Δr| + |Δc| ('manhattan') or max(|Δr|, |Δc|) ('chebyshev')."""
    def grid_neighbours(b, h, q_idx, kv_idx):
        dr = ((q_idx - 1) // grid_size - (kv_idx - 1) // grid_size).abs()
        dc = ((q_idx - 1) % grid_size - (kv_idx - 1) % grid_size).abs()
        distance = dr + dc if metric == 'manhattan' else torch.maximum(dr, dc)
        return (q_idx == 0) | (kv_idx == 0) | (distance <= radius)
    return grid_neighbours


# -----------------------------------------------------------------------------
# the frame

class Attention(nn.Module):
    """
    The frame every rule shares: forward(x) = out(attend(*project(x))).

      project(x)   c_attn maps x to one n_embd-wide tensor per name in `projections`, each split into heads
                   (B, H, T, D); RoPE rotates those whose name starts with q or k
      attend(...)  the rule, math path: plain PyTorch, any device; takes what project returns, gives (B, H, T, D)
      out(y)       merge heads, c_proj, residual dropout

    A rule writes `attend`; everything else has a default here. Its fast paths compute the same function, and one
    method, `path`, picks what forward runs. What a rule has beyond the causal math path, it declares; tests run
    every rule on what it declares and skip the rest, saying why.
    """
    # what the rule has, declared
    has_causal_form = True          # a causal=True form (the GPT); without it, building one is a ValueError
    has_bidirectional_form = False  # a causal=False form (the ViT); without it, building one is a ValueError
    has_cache = False               # new_cache / fill / decode: GPT.generate(use_cache=True)
    has_flex = False                # attend_flex: the same function through flex_attention (flex=True on CUDA)
    fused = False                   # attend_fused: the same function through SDPA, forward's default (tests: False)
    # what the rest of the code reads, on Attention instances only
    projections = ('q', 'k', 'v')   # what project returns, in order; None: the rule brings its own projections
    no_decay = ()                   # names of parameters AdamW must not decay (model.configure_adamw)
    lr_scale = {}                   # {parameter name: its learning rate / the schedule's}; never mutated
    weights_note = None             # analyze.py: why attention_weights is not a distribution; None if it is
    first_token_note = None         # analyze.py: why token 0's share of the weights means nothing; None if it does

    def __init__(self, config, layer_idx):
        super().__init__()
        if config.n_head < 1 or config.n_embd % config.n_head:
            raise ValueError(f"n_embd={config.n_embd} must be a multiple of n_head={config.n_head}; pass e.g. "
                             f"--n_embd={max(1, config.n_head) * max(1, config.n_embd // max(1, config.n_head))}")
        if config.causal and not self.has_causal_form:
            raise ValueError(f"attention='{config.attention}' ({type(self).__name__}) has no causal form (causal=True, "
                             f"a GPT); use it in a ViT")
        if not config.causal and not self.has_bidirectional_form:
            raise ValueError(f"attention='{config.attention}' ({type(self).__name__}) has no bidirectional form "
                             f"(causal=False, a ViT); use it in a GPT")
        if config.flex and not self.has_flex:  # else it would fail at the first forward on a GPU
            raise ValueError(f"attention='{config.attention}' ({type(self).__name__}) has no flex path; pass "
                             f"--flex=False (its math path computes the same function)")
        check_rope_scaling(config)
        self.n_head, self.head_dim = config.n_head, config.n_embd // config.n_head
        self.causal, self.flex, self.dropout = config.causal, config.flex, config.dropout
        if self.projections is None:
            return
        self.c_attn = nn.Linear(config.n_embd, len(self.projections) * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)  # GPT: the residual init
        self.resid_dropout = nn.Dropout(config.dropout)
        self.rope = (Rotary(self.head_dim, config.block_size, config.rope_base, config.rope_scaling, config.rope_factor)
                     if config.pos_emb == 'rope' else None)

    def forward(self, x, cache=None, masks=None):  # masks: this layer's flex_masks, when the model built them
        tensors = self.project(x, 0 if cache is None else cache.pos)
        if cache is not None and cache.pos:  # generation: one new token against what the cache holds
            if x.size(1) != 1:
                raise ValueError(f"a filled cache takes one token at a time, got {x.size(1)}; prefill a new cache")
            return self.out(self.decode(*tensors, cache=cache))
        y = self.attend_flex(*tensors, masks=masks) if self.uses_flex(x.device) else self.path()(*tensors)
        if cache is not None:  # prefill: the prompt computed as in training, then its state into the cache
            self.fill(cache, *tensors)
        return self.out(y)

    def uses_flex(self, device):
        """The one place flex is chosen: flex=True on a device in FLEX_DEVICES (CUDA; the tests add the CPU)."""
        return self.flex and device.type in FLEX_DEVICES

    def path(self):
        """What forward runs off flex, each the same function: attend_fused (SDPA) where the rule has it (fused),
        else attend, the math path."""
        return self.attend_fused if self.fused else self.attend

    def project(self, x, offset=0):  # offset: the absolute position of x's first token (generation)
        tensors = [split_heads(t, self.n_head) for t in self.c_attn(x).chunk(len(self.projections), dim=2)]
        if self.rope is not None:  # positions enter through the queries and keys only
            tensors = [self.rope(t, offset) if name[0] in 'qk' else t for name, t in zip(self.projections, tensors)]
        return tuple(tensors)  # (B, H, T, D) each

    def attend(self, q, k, v):
        raise NotImplementedError

    def out(self, y):
        return self.resid_dropout(self.c_proj(merge_heads(y)))

    def attend_flex(self, *tensors, masks=None):  # has_flex: the same function as attend, through flex_attention
        raise NotImplementedError(f"{type(self).__name__} has no flex path; set flex=False")

    def flex_masks(self, T, device):
        """What attend_flex needs that depends only on the shape (a BlockMask; Krause adds its pre-pass's mask), each
        built once per shape and cached. The model builds every layer's before the compiled graph (build_flex_masks)
        and hands them in: a graph would not see the cache and would rebuild them in every layer at every call."""
        return block_mask(self.mask_mod, T, device)

    def init_extra(self):  # runs after the model's init (N(0, 0.02) Linears): a rule's own init goes here
        pass

    def report(self, *tensors):
        """What the rule says about itself, {name: tensor}, from what project returns; None if nothing. train.py
        asks every layer for it at each evaluation (model.attention_reports) and prints it (cluster usage)."""
        return None

    def extra_loss(self):
        """A rule's own training term from its last forward (routing's commitment loss), a scalar, or None; read once
        (it is then cleared). model.GPT's forward adds every layer's to the loss, by its gradient only."""
        return None

    def after_optimizer_step(self):
        """What a rule updates once per optimizer step, after it, outside the gradient (routing's k-means centroids):
        model.configure_adamw's optimizer calls it on every attention layer. Nothing by default."""

    # generation (has_cache): the state one layer keeps between tokens; a rule's own sit next to its attend
    def new_cache(self):  # a KVCache, or the rule's own object with `pos` and `nbytes()`
        raise NotImplementedError(f"{type(self).__name__} has no cache; generate with use_cache=False")

    def fill(self, cache, *tensors):  # store a prompt's tensors; attend has already computed the prompt
        raise NotImplementedError(f"{type(self).__name__} has no cache; generate with use_cache=False")

    def decode(self, *tensors, cache):  # one new token's tensors (B, H, 1, D): add it to cache, return its output
        raise NotImplementedError(f"{type(self).__name__} has no cache; generate with use_cache=False")

    @torch.no_grad()
    def attention_weights(self, *tensors):
        """For analysis (short T, eval mode): the (B, H, T, T) effective weights W of y = attend(...) = W v, from
        what project returns, for every rule linear in v (its last tensor). A rule that is not overrides it."""
        if self.projections is None or [name[0] for name in self.projections].count('v') != 1:
            raise NotImplementedError(f"{type(self).__name__} is not y = W v with one v; it has no single weight matrix")
        return weights_of_linear_map(self.path(), *tensors)  # what forward computes off flex


# -----------------------------------------------------------------------------
# softmax

@dataclass
class SoftmaxConfig:
    window: int = 0              # softmax: sliding window of W keys (i-W < j <= i); 0 = full context


class SoftmaxAttention(Attention):
    """
    y = softmax(q kᵀ / √D + mask) v
    ("Attention Is All You Need", Vaswani et al. 2017, arXiv 1706.03762, eq. 1; docs/rules.md#softmax)

    The mask hides what a query may not see: the future in a GPT (causal), nothing in a ViT, and with `window` W
    every key but the last W, i - W < j <= i (sliding-window attention, the Krause paper's "window" baseline).
    `attend` is the formula as tensor ops, a T×T score matrix. `attend_fused`, what forward runs, hands the same
    function to F.scaled_dot_product_attention, one fused kernel (flash on a GPU), and a window shorter than T to
    the band: O(T·W) time and memory, no T×T tensor (machinery/band.py).
    """
    has_bidirectional_form, has_cache, has_flex, fused = True, True, True, True

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        if config.window < 0:
            raise ValueError(f"window must be >= 0 (0 = full context), got {config.window}")
        if config.window and not config.causal:
            raise ValueError("window (a causal sliding window) needs causal=True; use window=0 for a ViT")
        self.window = config.window
        self.mask_mod = sliding_window_mask(self.window) if self.window else causal_mask if self.causal else None

    def attend(self, q, k, v):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))                          # (B, H, T, T)
        if self.mask_mod is not None:  # a hidden key scores -inf: its weight exp(-inf) is 0
            scores = scores.masked_fill(~dense_mask(self.mask_mod, q.size(2), q.device), float('-inf'))
        weights = F.dropout(scores.softmax(-1), self.dropout, self.training)               # each row sums to 1
        return weights @ v                                                                  # (B, H, T, D)

    def attend_fused(self, q, k, v):
        T, dropout_p = q.size(2), self.dropout if self.training else 0.0
        if self.window and self.window < T:  # each query tile against the keys that can reach it: O(T·W)
            W, tile, lookback = band_layout(self.window, T)
            y = F.scaled_dot_product_attention(band_queries(q, tile), band_keys(k, tile, lookback),
                                               band_keys(v, tile, lookback), dropout_p=dropout_p,
                                               attn_mask=band_mask(self.mask_mod, T, tile, lookback, q.device))
            return unband(y, T)
        if self.window or self.mask_mod in (None, causal_mask):  # full or causal: SDPA's flag (flash on a GPU)
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=self.causal)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=dense_mask(self.mask_mod, T, q.device),
                                              dropout_p=dropout_p)  # any other mask (AttentionX's off-diagonal)

    def attend_flex(self, q, k, v, masks=None):
        # flex has no attention-weight dropout; the residual dropout in `out` still applies
        return run_flex(q, k, v, block_mask=self.flex_masks(q.size(2), q.device) if masks is None else masks)

    def new_cache(self):  # every key and value (grows with the context), or a ring of the last `window` (constant)
        return KVCache(self.window or None)

    def fill(self, cache, q, k, v):
        cache.append(k, v)

    def decode(self, q, k, v, cache):  # (B, H, 1, D): the cache holds exactly the keys the new query sees, no mask
        cache.append(k, v)
        return decode_sdpa(q, *cache.tensors())


# -----------------------------------------------------------------------------
# Krause

@dataclass
class KrauseConfig:
    krause_window: int = 32      # Krause 1-D: W keys per query (i-W < j <= i)
    krause_topk: int = 16        # Krause: keys kept per row (ViT: first layer's k, growing to 2k)
    krause_sigma: float = 2.5    # Krause: initial RBF bandwidth σ (learned per head as log_sigma)
    krause_radius: int = 1       # Krause 2-D: patches within this distance of a patch are its neighbours
    krause_metric: str = 'manhattan'  # Krause 2-D: 'manhattan' (official CIFAR) or 'chebyshev' (official ImageNet)


class KrauseAttention(Attention):
    """
    score_ij = -||q_i - k_j||² / (2 σ_h²)  for j in N_i, then only the top k of each row survive
    y_i = Σ_j softmax_j(score_i) v_j
    ("Krause Synchronization Transformers", arXiv 2602.11534, eq. 3; docs/rules.md#krause)

    Bounded confidence: a token listens only to its neighbours N_i, and among them only to the k closest; σ_h is
    learned per head (log_sigma). N_i is the causal window i - W < j <= i in the GPT; in the ViT, the patches
    within `krause_radius` on the grid (+ CLS, which sees and is seen by all), k growing over depth from k to 2k.
    -||q_i||²/(2σ²) is the same along a row (it changes neither the top k nor the softmax), so it is dropped:
    score_ij = q_i·k_j/σ² - ||k_j||²/(2σ²). The GPT's math path works on the band, O(T·W), never T×T; the ViT's
    (65 tokens) on every pair, as the official code computes it (`attend_dense`, also bench.py's reference).
    With mix=True, build_attention makes the paper's LM form: a softmax branch beside it (MixAttention).
    """
    has_bidirectional_form, has_cache, has_flex = True, True, True

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        W, k, grid_size = config.krause_window, config.krause_topk, config.grid_size
        if not (math.isfinite(config.krause_sigma) and config.krause_sigma > 0):
            raise ValueError(f"krause_sigma must be > 0 and finite, got {config.krause_sigma}")
        if config.causal and W < 1:
            raise ValueError(f"krause_window must be >= 1, got {W}")
        if config.causal and not 1 <= k <= W:
            raise ValueError(f"krause_topk must be in [1, krause_window={W}], got {k}")
        if not config.causal and (grid_size < 1 or config.block_size != 1 + grid_size * grid_size):
            raise ValueError(f"non-causal Krause needs a square patch grid: grid_size={grid_size} with block_size = "
                             f"1 + grid_size² tokens (got block_size={config.block_size}); use it in a ViT")
        if not config.causal and config.krause_metric not in ('manhattan', 'chebyshev'):
            raise ValueError(f"krause_metric must be 'manhattan' or 'chebyshev', got '{config.krause_metric}'")
        if not config.causal and (config.krause_radius < 0 or k < 1):
            raise ValueError(f"krause_radius must be >= 0 and krause_topk >= 1, got {config.krause_radius}, {k}")
        self.log_sigma = nn.Parameter(torch.full((self.n_head,), math.log(config.krause_sigma)))
        if config.causal:  # N_i: the last W keys
            self.krause_window, self.topk, self.grid = W, k, None
            self.mask_mod = sliding_window_mask(W)
        else:  # N_i: the patch grid's neighbourhood, k growing over depth
            self.topk = krause_topk_schedule(k, config.n_layer)[layer_idx]
            self.grid = (grid_size, config.krause_radius, config.krause_metric)
            self.mask_mod = grid_mask(*self.grid)

    def inv_var(self):
        return torch.exp(-2 * self.log_sigma).view(1, -1, 1, 1)  # 1/σ² per head, (1, H, 1, 1)

    def key_bias(self, k):  # (B, H, T, D) -> (B, H, T): -||k||²/(2σ²)
        return -0.5 * (k * k).sum(-1) * self.inv_var()[..., 0]

    def scores(self, q, k, key_bias=None, band=None, view=False):
        """score_ij = (q_i/σ²)·k_j - ||k_j||²/(2σ²) for every pair (B, H, T, L), or with band = (tile, lookback) on
        the band (B, H, n, tile, tile + lookback). key_bias (B, H, L, 1): the keys' biases, where a cache holds them.
        view: the band's keys as a strided view (band_view), not a copy; no gradient (flex's pre-pass)."""
        q_scaled = q * self.inv_var()
        key_bias = self.key_bias(k).unsqueeze(-1) if key_bias is None else key_bias        # (B, H, L, 1)
        if band is None:
            return q_scaled @ k.transpose(-1, -2) + key_bias.transpose(-1, -2)
        tile, lookback = band
        if view:
            keys, biases = band_view(k, tile, lookback), band_view(key_bias, tile, lookback)
        else:
            keys, biases = (band_keys(t, tile, lookback).transpose(-1, -2) for t in (k, key_bias))
        return band_queries(q_scaled, tile) @ keys + biases

    def topk_softmax(self, scores, mask, reachable=None):
        """The weights from fresh scores and the neighbourhood mask (None: all visible): the top k of each row
        (among `reachable(scores)`, the slots a row can reach, if given) kept by a boundary halfway between its k-th
        and (k+1)-th score, so flex, which rounds its own way, keeps the same keys; softmax; dropout. Out-of-place
        fills: torch.compile's inductor fails on in-place ones here (KeyError 'buf1', torch 2.13)."""
        scores = scores if mask is None else scores.masked_fill(~mask, float('-inf'))
        boundary = topk_boundary(scores if reachable is None else reachable(scores), self.topk)
        scores = scores.masked_fill(scores < boundary, float('-inf'))
        return F.dropout(scores.softmax(-1), self.dropout, self.training)

    def attend(self, q, k, v):
        if self.grid:  # the ViT: 65 tokens, every pair
            return self.attend_dense(q, k, v)
        T = q.size(2)
        W, tile, lookback = band_layout(self.krause_window, T)
        weights = self.topk_softmax(self.scores(q, k, band=(tile, lookback)), self.neighbours(T, q.device),
                                    lambda s: band_strip(s, W))          # (B, H, n, tile, tile+lookback)
        return unband(weights @ band_keys(v, tile, lookback), T)          # (B, H, T, D)

    def attend_dense(self, q, k, v):
        """Every (i, j) pair, a (B, H, T, T) matrix: the ViT's path, and the official code's way for the GPT."""
        return self.topk_softmax(self.scores(q, k), dense_mask(self.mask_mod, q.size(2), q.device)) @ v

    def neighbours(self, T, device):  # N_i off flex: on the band (GPT), every pair (ViT)
        if self.grid:
            return dense_mask(self.mask_mod, T, device)
        _, tile, lookback = band_layout(self.krause_window, T)
        return band_mask(self.mask_mod, T, tile, lookback, device)

    def attend_flex(self, q, k, v, masks=None):
        # exp((q/σ²)·k + bias_j) under the neighbourhood BlockMask, the top k kept by each row's boundary from a
        # no-grad pre-pass. bias_j enters detached through the score_mod and with its gradient through one more
        # column: 1 in q′, bias - bias.detach() (exactly 0) in k′. No dropout on the weights.
        block, prepass_mask = self.flex_masks(q.size(2), q.device) if masks is None else masks
        boundary = self.topk_boundaries(q, k, prepass_mask)                              # (B, H, T)
        key_bias = self.key_bias(k)
        bias = key_bias.detach()                                                         # (B, H, T)
        q_aug = torch.cat([q * self.inv_var(), torch.ones_like(q[..., :1])], -1)         # (B, H, T, D + 1)
        k_aug = torch.cat([k, (key_bias - bias).unsqueeze(-1)], -1)                      # (B, H, T, D + 1)

        def krause_score(score, b, h, q_idx, kv_idx):
            score = score + bias[b, h, kv_idx]
            return torch.where(score >= boundary[b, h, q_idx], score, float('-inf'))

        return run_flex(q_aug, k_aug, v, score_mod=krause_score, block_mask=block, scale=1.0)

    def flex_masks(self, T, device):  # the BlockMask, and the pre-pass's neighbourhood
        return block_mask(self.mask_mod, T, device), self.neighbours(T, device)

    @torch.no_grad()
    def topk_boundaries(self, q, k, mask):
        """Each row's top-k boundary (B, H, T) from the scores alone (the GPT: one selection among the W slots a
        row reaches on the band; the ViT: every pair)."""
        if self.grid:
            return topk_boundary(self.scores(q, k).masked_fill(~mask, float('-inf')), self.topk)[..., 0]
        T = q.size(2)
        W, tile, lookback = band_layout(self.krause_window, T)
        scores = self.scores(q, k, band=(tile, lookback), view=True).masked_fill(~mask, float('-inf'))
        return unband(topk_boundary(band_strip(scores, W), self.topk), T)[..., 0]

    def new_cache(self):  # a ring of the last krause_window keys and values: constant memory for ever
        if self.grid:
            raise ValueError("the 2-D (ViT) Krause form does not generate; a cache is for the causal GPT form")
        return KVCache(self.krause_window)

    def fill(self, cache, q, k, v):  # each key's bias goes in the ring beside it: computed once, not W times
        cache.append(k, v, self.key_bias(k).unsqueeze(-1))

    def decode(self, q, k, v, cache):  # (B, H, 1, D): the top k of the (up to W) keys the ring holds
        cache.append(k, v, self.key_bias(k).unsqueeze(-1))
        keys, values, key_bias = cache.tensors()                # (B, H, n <= W, D), (B, H, n, D), (B, H, n, 1)
        return self.topk_softmax(self.scores(q, keys, key_bias), None) @ values  # every key the ring holds: visible


def krause_topk_schedule(topk, n_layer):
    """ViT top-k over depth, k at the first layer to 2k at the last: round(linspace(k, 2k, n_layer))."""
    return [round(x) for x in torch.linspace(topk, 2 * topk, n_layer, dtype=torch.float64).tolist()]


def topk_boundary(x, k):
    """(..., n) -> (..., 1), no gradient: halfway between the k-th and the (k+1)-th largest value along the last
    dim, so the top k are exactly the values at or above it (a tie at the k-th keeps all of it). A row with k or
    fewer finite values gives -inf: keep them all."""
    n = x.size(-1)
    if k >= n:
        return x.new_full((*x.shape[:-1], 1), float('-inf'))
    if x.device.type == 'cpu' and x.dtype in (torch.float32, torch.float64):  # one selection finds both
        with torch.no_grad():
            both = np.partition(x.detach().numpy(), (n - k - 1, n - k), axis=-1)
        return (torch.from_numpy(both[..., n - k:n - k + 1]) + torch.from_numpy(both[..., n - k - 1:n - k])) / 2
    with torch.no_grad():
        top = x.topk(k + 1, dim=-1).values  # one selection: the k-th and (k+1)-th are its last two
    return (top[..., k - 1:k] + top[..., k:]) / 2


# -----------------------------------------------------------------------------
# AttentionX

@dataclass
class AttentionXConfig:
    attnx_gamma: float = 1.0     # AttentionX: y = v - γ·softmax(qkᵀ/√D)v; paper: 3 (GPT), 1 (ViT, diagonal masked)
    attnx_learnable_gamma: bool = False  # AttentionX: γ a learned parameter per head, initialised at attnx_gamma
    attnx_mask_diagonal: bool = False    # AttentionX: no token attends to itself (paper's ViT); needs causal=False
    attnx_learned_temperature: bool = False  # AttentionX: t·q kᵀ, t learned per layer from 1/√D (LSA's; paper's ViT)


class LearnedTemperature:
    """
    softmax(t · q kᵀ + mask) in place of softmax(q kᵀ / √D + mask), t = exp(log_temperature) learned, init 1/√D
    (LSA's temperature, docs/rules.md#lsa), mixed into a softmax rule (first in its bases). Each softmax path (math,
    SDPA, flex, the cache) is handed q·t·√D, so it runs unchanged and t keeps its gradient (no score_mod captures
    it). A layer built without one (log_temperature None) hands q through as it is.
    """

    def init_temperature(self, learned, per_head=False):  # one t per layer, or one per head
        shape = (self.n_head,) if per_head else ()
        self.log_temperature = nn.Parameter(torch.full(shape, -0.5 * math.log(self.head_dim))) if learned else None

    def sharpen(self, q):  # q·t·√D: softmax's q kᵀ/√D then gives t·q kᵀ
        if self.log_temperature is None:
            return q
        scale = (self.log_temperature.exp() * math.sqrt(self.head_dim)).to(q.dtype).view(-1, 1, 1)  # (H or 1, 1, 1)
        return q * scale

    def attend(self, q, k, v):
        return super().attend(self.sharpen(q), k, v)

    def attend_fused(self, q, k, v):
        return super().attend_fused(self.sharpen(q), k, v)

    def attend_flex(self, q, k, v, masks=None):
        return super().attend_flex(self.sharpen(q), k, v, masks)

    def decode(self, q, k, v, cache):  # the cache keeps k and v as they are: only the new query is scaled
        return super().decode(self.sharpen(q), k, v, cache)


class AttentionX(LearnedTemperature, SoftmaxAttention):
    """
    y = v - γ · softmax(q kᵀ / √D + mask) v      per head, then heads merged and c_proj as usual
    ("AttentionX: Exploiting Consensus Discrepancy In Attention from A Distributed Optimization Perspective",
    arXiv 2409.04275, eq. 12-13; docs/rules.md#attentionx)

    The "consensus discrepancy" between a token's own value and what it gathers from the others: with A the
    attention matrix, y = (I - γA)V; at γ = 1, I - A is the attention graph's random-walk Laplacian, a high-pass
    filter, the opposite of the smoothing AV that, stacked over layers, drives rank collapse. The paper keeps
    γ >= 1: γ = 3 for its causal nanoGPT (diagonal kept), γ = 1 for its ViT with the diagonal masked
    (`attnx_mask_diagonal`: a token attends only to the others). γ is fixed, or learned per head
    (`attnx_learnable_gamma`). The paper's ViT is an LSA ViT: `attnx_learned_temperature` puts LSA's learned
    temperature in A, softmax(t·q kᵀ + mask) (LearnedTemperature); with the diagonal masked, A is LSA's exactly.
    A is SoftmaxAttention's, on each of its paths (SDPA, the window, flex, the cache); the masked diagonal is
    `off_diagonal_mask`, a boolean SDPA mask (no flash).
    """

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        if not math.isfinite(config.attnx_gamma):
            raise ValueError(f"attnx_gamma must be a finite number, got {config.attnx_gamma}")
        if config.attnx_mask_diagonal and config.causal:
            raise ValueError("attnx_mask_diagonal=True needs causal=False: with causal attention the first token "
                             "would see no key at all; use it in a ViT, or keep the diagonal in a GPT")
        self.mask_diagonal = config.attnx_mask_diagonal
        if self.mask_diagonal:
            self.mask_mod = off_diagonal_mask
        gamma = torch.full((self.n_head,), float(config.attnx_gamma))
        if config.attnx_learnable_gamma:
            self.gamma = nn.Parameter(gamma)  # 1-D, so AdamW does not decay it
        else:
            self.register_buffer('gamma', gamma, persistent=False)
        self.init_temperature(config.attnx_learned_temperature)  # one t per layer, as the paper's LSA ViT has

    def discrepancy(self, v, y):
        # v - γ_h·y in one op (no γ·y temporary: one (B, H, T, D) tensor less at the peak); γ in the activations'
        # dtype, so bf16 stays bf16 under autocast
        return torch.addcmul(v, self.gamma.to(v.dtype).view(1, -1, 1, 1), y, value=-1.0)

    def attend(self, q, k, v):
        return self.discrepancy(v, super().attend(q, k, v))

    def attend_fused(self, q, k, v):
        return self.discrepancy(v, super().attend_fused(q, k, v))

    def attend_flex(self, q, k, v, masks=None):
        return self.discrepancy(v, super().attend_flex(q, k, v, masks))

    def decode(self, q, k, v, cache):  # softmax's cache (all keys, or the window's ring); the diagonal is kept
        return self.discrepancy(v, super().decode(q, k, v, cache))

    def attention_weights(self, *tensors):
        """A, the softmax weights, from the frame's effective weights I - γA of y = v - γ·A v (analyze.py reports A,
        the paper's attention matrix)."""
        if not self.gamma.all():
            raise NotImplementedError("a head has γ = 0: y = v, A does not reach the output")
        effective = super().attention_weights(*tensors)
        eye = torch.eye(effective.size(-1), dtype=effective.dtype, device=effective.device)
        return (eye - effective) / self.gamma.to(effective.dtype).view(1, -1, 1, 1)


# -----------------------------------------------------------------------------
# TDA

@dataclass
class TDAConfig:
    tda_beta: float = 1.0        # TDA: initial threshold scale β > 0 (learned per layer, as log β)
    tda_lambda: float = 0.5      # TDA: initial inhibition λ in (0, 1) of the second view (learned, as its logit)
    tda_kappa: float = 1.0       # TDA: κ > 0, fixed; the threshold's position offset (κ = 1: τ_0 = 0)
    tda_p: float = 2.0           # TDA: power p >= 1 of the rectified excess relu(s - τ)^p, fixed
    tda_differential: bool = True  # TDA: two views, a¹ - λa²; False: one view (the paper's TRA ablation)
    tda_matched: bool = False    # TDA: the views are the halves of each head's q, k (D/2 each): softmax's c_attn (3C)
    tda_chunk_weights: int = 2**18  # TDA math path: weights per head one query tile may hold (that // T queries)
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
    head of D/2; v is D wide either way. Math path: queries in tiles of tda_chunk_weights // T, each recomputed in
    backward, so memory is linear in T. Flex path: one call, both views on the head axis, τ through the queries
    (derivation: docs/rules.md#tda). No attention-weight dropout on either path.
    """
    has_bidirectional_form, has_cache, has_flex = True, True, True
    projections = ('q1', 'k1', 'q2', 'k2', 'v')
    weights_note = "a1 - lam*a2: signed, rows not summing to 1, and the per-head RMSNorm after W v rescales each row"
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
                              ('tda_chunk_weights', config.tda_chunk_weights >= 1, '>= 1'),
                              ('tda_eps', config.tda_eps > 0, '> 0')]:
            if not (ok and math.isfinite(getattr(config, key))):
                raise ValueError(f"{key} must be {need} and finite, got {getattr(config, key)}")
        self.differential, self.kappa, self.p = config.tda_differential, config.tda_kappa, config.tda_p
        self.matched = config.tda_matched
        self.view_dim = self.head_dim // 2 if self.matched else self.head_dim  # d: q̂·k̂'s width, τ's dimension
        if self.matched and self.rope is not None:  # each view rotated at its own width (`project`)
            self.rope = Rotary(self.view_dim, config.block_size, config.rope_base, config.rope_scaling,
                               config.rope_factor)
        self.chunk_weights = config.tda_chunk_weights  # weights per head one query tile may hold
        self.log_beta = nn.Parameter(torch.tensor(math.log(config.tda_beta)))
        if self.differential:
            self.lambda_logit = nn.Parameter(torch.tensor(math.log(config.tda_lambda / (1 - config.tda_lambda))))
        self.head_norm = nn.RMSNorm(self.head_dim, eps=config.tda_eps)
        self.mask_mod = causal_mask if self.causal else None  # after the threshold (weights); flex's BlockMask

    def threshold(self, T, device, start=0):
        """τ per query, (T,): τ_i on the 0-based position i = start..start+T-1; without causality one τ for all,
        from the T keys. Generation passes start = the absolute position of the new token."""
        n = torch.arange(start + 1, start + T + 1, device=device) if self.causal else torch.full((T,), T, device=device)
        spurious = 2 * torch.log(n.to(self.log_beta.dtype) / self.kappa).clamp_min(0) / self.view_dim
        return self.log_beta.exp() * spurious.sqrt()

    def project(self, x, offset=0):
        if not (self.matched and self.rope is not None):
            return super().project(x, offset)
        # matched: each half of q and k rotated as a head of D/2, so that a view's q̂·k̂ depends on positions
        # through i - j alone (the frame's rotation at D pairs channel c of one view with channel c of the other)
        q, k, v = [split_heads(t, self.n_head) for t in self.c_attn(x).chunk(3, dim=2)]
        return self.rotate_halves(q, offset), self.rotate_halves(k, offset), v

    def rotate_halves(self, x, offset):  # (B, H, T, D): each head's two halves as 2H heads of D/2, rotated, back
        halves = x.unflatten(-1, (2, -1)).transpose(2, 3).flatten(1, 2)                # (B, 2H, T, D/2)
        return self.rope(halves, offset).unflatten(1, (-1, 2)).transpose(2, 3).flatten(3)

    def split_views(self, tensors):
        """What project returns -> ([q1, k1(, q2, k2)], v): matched, the halves of each head's q and k."""
        *qk, v = tensors
        if self.matched:
            (q, k), d = qk, self.view_dim
            qk = [q[..., :d], k[..., :d], q[..., d:], k[..., d:]]
        return qk, v

    def view_weights(self, q, k, threshold):  # (B, H, C, D), (B, H, L, D), (C, L) -> (B, H, C, L)
        return (q @ k.transpose(-1, -2) - threshold).relu() ** self.p

    def weights(self, qk, threshold):
        """a¹ - λa² from normalised q1, k1(, q2, k2) and the thresholds (C, L), +inf where a key is hidden."""
        a = self.view_weights(qk[0], qk[1], threshold)
        if self.differential:
            a = a - torch.sigmoid(self.lambda_logit) * self.view_weights(qk[2], qk[3], threshold)
        return a

    def tile_weights(self, qk, tau, start, end, n_keys):  # queries start..end-1, keys 0..n_keys-1: (B, H, C, L)
        threshold = tau[start:end, None].expand(-1, n_keys)  # (C, L)
        if self.causal:  # a hidden key gets an infinite threshold: relu(s - ∞) = 0, whatever s is
            query, key = torch.arange(start, end, device=tau.device), torch.arange(n_keys, device=tau.device)
            threshold = threshold.masked_fill(~causal_mask(None, None, query[:, None], key), float('inf'))
        return self.weights([t[:, :, start:end] if i % 2 == 0 else t[:, :, :n_keys] for i, t in enumerate(qk)],
                            threshold)

    def attend(self, *tensors):  # q1, k1, q2, k2, v (single view: q1, k1, v; matched: q, k, v), (B, H, T, D) each
        qk, v = self.split_views(tensors)
        qk, T = [F.normalize(t, dim=-1) for t in qk], v.size(2)
        tau = self.threshold(T, v.device)
        tile_output = lambda start, end, n_keys: self.tile_weights(qk, tau, start, end, n_keys) @ v[:, :, :n_keys]
        rows = max(1, self.chunk_weights // T)  # queries per tile
        y = torch.cat([recompute_in_backward(tile_output, *tile) for tile in query_tiles(T, rows, self.causal)], 2)
        return self.head_norm(y)  # (B, H, T, D)

    def attend_flex(self, *tensors, masks=None):
        # exp(score_mod) = relu(q̃·k̂ - t_i)^p with q̃ = q̂/d_i, so Σ_j a_ij v_j = d_i^p · y_i · exp(lse_i), y flex's
        # output (d_i = τ_i, or 1 where τ_i = 0; t_i = [τ_i > 0]): nothing captured needs a gradient. λ after flex.
        qk, v = self.split_views(tensors)
        B, H, T, D = v.shape
        views, p, floor = len(qk) // 2, self.p, self.log_floor
        tau = self.threshold(T, v.device)                                        # (T,)
        passed = tau > 0
        d, t = torch.where(passed, tau, torch.ones_like(tau)), passed.to(v.dtype)  # (T,) each; t needs no gradient
        q = torch.cat([F.normalize(x, dim=-1) for x in qk[0::2]], 1) / d.to(v.dtype)[:, None]  # (B, views·H, T, d)
        k = torch.cat([F.normalize(x, dim=-1) for x in qk[1::2]], 1)

        def threshold_score(score, b, h, q_idx, kv_idx):  # log relu(q̃·k̂ - t_i)^p; -inf (weight 0) at or below
            excess = score - t[q_idx]
            return torch.where(excess > 0, p * torch.log(excess.clamp_min(floor)), float('-inf'))

        y, aux = run_flex(q, k, v.repeat(1, views, 1, 1), score_mod=threshold_score, scale=1.0,
                          block_mask=self.flex_masks(T, v.device) if masks is None else masks,
                          return_aux=AuxRequest(lse=True))
        y = (y * (aux.lse + p * torch.log(d)).exp().unsqueeze(-1)).view(B, views, H, T, D)  # Σ_j a_ij v_j per view
        if self.differential:
            return self.head_norm((y[:, 0] - torch.sigmoid(self.lambda_logit) * y[:, 1]).to(v.dtype))
        return self.head_norm(y[:, 0].to(v.dtype))

    def new_cache(self):  # every normalised key of each view and every value: grows with the context
        return KVCache()

    def fill(self, cache, *tensors):
        qk, v = self.split_views(tensors)
        cache.append(*[F.normalize(k, dim=-1) for k in qk[1::2]], v)

    def decode(self, *tensors, cache):  # what project returns for one token, (B, H, 1, D) each
        qk, v = self.split_views(tensors)
        tau = self.threshold(1, v.device, start=cache.pos)  # τ at the new token's absolute position
        cache.append(*[F.normalize(k, dim=-1) for k in qk[1::2]], v)
        *keys, values = cache.tensors()                      # (B, H, pos, D) each: every key is visible
        queries = [F.normalize(q, dim=-1) for q in qk[0::2]]
        return self.head_norm(self.weights([x for pair in zip(queries, keys) for x in pair], tau) @ values)

    def attention_weights(self, *tensors):
        """For analysis: the whole (B, H, T, T) matrix a¹ - λa² from what project returns (short T only): the weights
        before the RMSNorm, which is not linear in v (so the frame's identity-basis weights do not apply)."""
        qk, v = self.split_views(tensors)
        T = v.size(2)
        return self.tile_weights([F.normalize(t, dim=-1) for t in qk], self.threshold(T, v.device), 0, T, T)


# -----------------------------------------------------------------------------
# cluster

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
    """
    has_bidirectional_form, has_cache = True, True
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

    def assign(self, k, seeds):
        """S: (B, H, T, m), each key's soft assignment to the seeds (H, m, D) or (B, H, m, D)."""
        seeds = F.normalize(seeds, dim=-1) * self.log_sharpness.exp().view(-1, 1, 1)  # s folded into the seeds
        return (F.normalize(k, dim=-1) @ seeds.transpose(-1, -2)).softmax(-1)

    def assignments(self, k):
        """S of the keys (B, H, T, m) as attend uses it: the ViT form first refines the seeds on this sequence (soft
        spherical k-means: each seed moves to the mean direction of its keys), cluster_iters times."""
        S = self.assign(k, self.seeds)
        for _ in range(self.iters):
            S = self.assign(k, S.transpose(-1, -2) @ F.normalize(k, dim=-1))  # seeds (B, H, m, D)
        return S

    def report(self, q, k, v):
        return cluster_usage(self.assignments(k))

    def attend(self, q, k, v):
        kv1 = kv_one(k, v)  # (B, H, T, 2D+1)
        return (self.attend_chunks if self.causal else self.attend_all)(q / math.sqrt(q.size(-1)), k, v, kv1)

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

    def new_cache(self):  # Σ S·[k, v, 1] of the finished chunks + the current chunk: O(m + chunk) for ever
        if not self.causal:
            raise ValueError("the bidirectional (ViT) cluster form does not generate; a cache is for the GPT form")
        return ClusterCache()

    def fill(self, cache, q, k, v):
        (B, H, T, D), L = k.shape, self.chunk
        kv1 = kv_one(k, v)                                                       # (B, H, T, 2D+1)
        n, running = T // L, torch.promote_types(k.dtype, torch.float32)
        Sc = self.assign(k[:, :, :n * L], self.seeds).view(B, H, n, L, self.seeds.size(1))  # (B, H, n, L, m); n may be 0
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
            S = self.assign(cache.current[..., :D], self.seeds)                            # (B, H, L, m)
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


@torch.no_grad()
def cluster_usage(S):
    """Soft assignments S (B, H, T, m) -> {'perplexity': exp H(mean assignment), 'entropy': mean H(S_j)}, (H,) each:
    how many of the m clusters a head uses, and how hard its assignment is (0: one cluster per key)."""
    mean = S.mean((0, 2))  # (H, m)
    return {'perplexity': torch.exp(-torch.special.xlogy(mean, mean).sum(-1)),
            'entropy': -torch.special.xlogy(S, S).sum(-1).mean((0, 2))}


# -----------------------------------------------------------------------------
# the baselines: the rules the seed papers compare theirs with, each exact to its paper (docs/rules.md#baselines)

# -----------------------------------------------------------------------------
# top-k

@dataclass
class TopkConfig:
    topk_k: int = 32             # top-k: keys kept per row (a row with fewer visible keys keeps them all)
    topk_chunk_weights: int = 2**18  # top-k math path: scores per head one query tile may hold (that // T queries)


class TopkAttention(SoftmaxAttention):
    """
    s_ij = q_i·k_j / √D for j in Vis(i);  y_i = Σ_j softmax_j(s_ij over the k largest s_i·) v_j, the others weigh 0
    ("Memory-efficient Transformers via Top-k Attention", Gupta et al. 2021, arXiv 2106.06899; docs/rules.md#top-k)

    Softmax over the k largest scores of each row only, k_eff = min(k, |Vis(i)|): a causal row with k or fewer
    visible keys keeps them all. Vis(i) is softmax's: causal (the GPT), every key (the ViT), or `window`. Nothing is
    learned beyond the projections, and the selection carries no gradient. The cut is a per-row boundary halfway
    between the k-th and the (k+1)-th score (topk_boundary): a tie at the k-th score keeps every tied key (the
    official code's sort keeps exactly k), and flex, which rounds its own way, keeps the same keys. Math path: the
    paper's query chunking, tiles of topk_chunk_weights // T queries against the keys they see, each recomputed in
    backward, so memory is linear in T. Flex: a no-grad pre-pass finds each row's boundary and the score_mod keeps
    the scores at or above it (as Krause's). Cache: softmax's (every key and value), the top k taken among them.
    """
    has_bidirectional_form, has_cache, has_flex, fused = True, True, True, False  # no SDPA: the cut needs the scores

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        if not config.topk_k >= 1:
            raise ValueError(f"topk_k must be >= 1 (keys kept per row), got {config.topk_k}")
        if not config.topk_chunk_weights >= 1:
            raise ValueError(f"topk_chunk_weights must be >= 1, got {config.topk_chunk_weights}")
        self.topk, self.chunk_weights = config.topk_k, config.topk_chunk_weights

    def attend(self, q, k, v):
        tile_output = lambda start, end, n_keys: self.topk_softmax(self.tile_scores(q, k, start, end, n_keys)) @ \
            v[:, :, :n_keys]                                                             # (B, H, C, D)
        return torch.cat([recompute_in_backward(tile_output, *tile) for tile in self.tiles(q.size(2))], 2)

    def tiles(self, T):  # (start, end, n_keys) per query tile: as many queries as chunk_weights // T allows
        return query_tiles(T, max(1, self.chunk_weights // T), self.causal)

    def tile_scores(self, q, k, start, end, n_keys):
        """s_ij = q_i·k_j/√D, queries start..end-1 against keys 0..n_keys-1 (B, H, C, L); -inf where j is hidden."""
        scores = q[:, :, start:end] @ k[:, :, :n_keys].transpose(-1, -2) / math.sqrt(q.size(-1))
        if self.mask_mod is None:
            return scores
        query, key = torch.arange(start, end, device=q.device), torch.arange(n_keys, device=q.device)
        return scores.masked_fill(~self.mask_mod(None, None, query[:, None], key), float('-inf'))

    def topk_softmax(self, scores):
        """Softmax over each row's k largest scores (at or above its boundary), the rest -inf: weight 0; dropout."""
        scores = scores.masked_fill(scores < topk_boundary(scores, self.topk), float('-inf'))
        return F.dropout(scores.softmax(-1), self.dropout, self.training)

    def attend_flex(self, q, k, v, masks=None):
        # softmax's flex call, the top k kept by each row's boundary from a no-grad pre-pass (nothing captured needs
        # a gradient); no dropout on the weights
        boundary = self.boundaries(q, k)                                                 # (B, H, T)

        def topk_score(score, b, h, q_idx, kv_idx):
            return torch.where(score >= boundary[b, h, q_idx], score, float('-inf'))

        return run_flex(q, k, v, score_mod=topk_score,
                        block_mask=self.flex_masks(q.size(2), q.device) if masks is None else masks)

    @torch.no_grad()
    def boundaries(self, q, k):
        """Each row's top-k boundary (B, H, T), tile by tile, in float32 at least: flex scores in float32, and a
        boundary rounded to bf16 could land on a kept score."""
        q, k = (t.to(torch.promote_types(t.dtype, torch.float32)) for t in (q, k))
        return torch.cat([topk_boundary(self.tile_scores(q, k, *tile), self.topk)[..., 0]
                          for tile in self.tiles(q.size(2))], -1)

    def decode(self, q, k, v, cache):  # (B, H, 1, D): the top k of the keys the cache holds, every one visible
        cache.append(k, v)
        keys, values = cache.tensors()
        return self.topk_softmax(q @ keys.transpose(-1, -2) / math.sqrt(q.size(-1))) @ values


# -----------------------------------------------------------------------------
# Longformer

@dataclass
class LongformerConfig:
    longformer_window: int = 32       # Longformer: the first layer's W (GPT: i-W < j <= i; ViT: |i-j| <= W//2)
    longformer_window_last: int = 0   # Longformer: the last layer's W, rounded linear steps between (0: W everywhere)
    longformer_global: int = -1       # Longformer ViT: the first G tokens are global; -1: 1 (CLS) in a ViT, 0 in a GPT


class LongformerAttention(Attention):
    """
    GPT:  y_i = Σ_{i-W_l < j <= i} softmax_j(q_i·k_j / √D) v_j                        W_l: layer l's window
    ViT:  y_i = Σ_{j ∈ N_i} softmax_j(q_i·k_j / √D) v_j,   N_i = {j : |i-j| <= ⌊W_l/2⌋} ∪ {j < G}  i >= G
          y_i = Σ_j softmax_j(qg_i·kg_j / √D) vg_j,  every j; qg, kg, vg from Q_g, K_g, V_g         i < G
    ("Longformer: The Long-Document Transformer", Beltagy, Peters, Cohan 2020, arXiv 2004.05150, §3.1, §4.1;
    docs/rules.md#longformer)

    Softmax on a sparse pattern. The GPT form is the paper's autoregressive one: a window of the last W_l keys,
    growing with depth from longformer_window (layer 0) to longformer_window_last (the last layer) in rounded linear
    steps (the paper: small windows low, large ones high; the steps between are unpublished); no dilation. The ViT
    form is its bidirectional one: a two-sided window, and the first G tokens (the CLS) global: they attend to every
    token and every token attends to them. A global row uses its own projections Q_g, K_g, V_g (c_attn three
    blocks wider; copies of Q, K, V at init, init_extra), as the official code does; every other row sees the global
    tokens through their ordinary keys and values. Math path: each tile of queries against the band of keys that can
    reach it, plus the G global keys: O(T·(W + G)); the global rows apart, O(G·T); no T×T tensor. attend_fused: the
    same through SDPA. Flex: the pattern's BlockMask (or_masks of window and globals), the global rows replaced after.
    Cache (GPT): a ring of the last W_l keys and values.
    """
    has_bidirectional_form, has_cache, has_flex, fused = True, True, True, True

    def __init__(self, config, layer_idx):
        first, last, G = config.longformer_window, config.longformer_window_last, config.longformer_global
        if first < 1 or last < 0:
            raise ValueError(f"longformer_window must be >= 1 and longformer_window_last >= 0 (0: the same), got "
                             f"{first}, {last}")
        if G < -1:
            raise ValueError(f"longformer_global must be >= -1 (-1: 1 in a ViT, 0 in a GPT), got {G}")
        if config.causal and G > 0:
            raise ValueError(f"longformer_global must be 0 or -1 in a GPT (causal=True), got {G}: a global token "
                             f"attends to every token, the future too (the paper's language model has none)")
        self.n_global = (0 if config.causal else 1) if G == -1 else G
        if self.n_global > config.block_size:
            raise ValueError(f"longformer_global must be <= block_size={config.block_size}, got {self.n_global}")
        if self.n_global:
            self.projections = ('q', 'k', 'v', 'qg', 'kg', 'vg')  # set before the frame sizes c_attn from it
            self.first_token_note = "token 0 is a global token: every query sees it by construction"
        super().__init__(config, layer_idx)
        self.window = longformer_windows(first, last, config.n_layer)[layer_idx]
        self.half = self.window // 2  # the ViT: keys on each side
        if self.causal:
            self.mask_mod = self.band_mod = sliding_window_mask(self.window)
        else:
            self.mask_mod = longformer_mask(self.half, self.n_global)         # the whole pattern (flex)
            self.band_mod = longformer_band_mask(self.half, self.n_global)   # the band's share of it

    def init_extra(self):  # Q_g, K_g, V_g start as copies of Q, K, V (§3.1): c_attn's second half = its first
        if self.n_global:
            with torch.no_grad():
                for p in (self.c_attn.weight, self.c_attn.bias):
                    if p is not None:
                        p[p.size(0) // 2:].copy_(p[:p.size(0) // 2])

    def attend(self, q, k, v, *global_qkv):  # (B, H, T, D) each; the ViT's qg, kg, vg after them where G > 0
        return self.longformer(q, k, v, *global_qkv, fused=False)

    def attend_fused(self, q, k, v, *global_qkv):
        return self.longformer(q, k, v, *global_qkv, fused=True)

    def longformer(self, q, k, v, *global_qkv, fused):
        T = q.size(2)
        tile, behind, ahead = self.band(T)
        keys, values = band_keys(k, tile, behind, ahead), band_keys(v, tile, behind, ahead)  # (B, H, n, width, D)
        visible = band_mask(self.band_mod, T, tile, behind, q.device, ahead)                  # (n, tile, width)
        G = min(self.n_global, T)
        if G:  # every query also sees the G global keys, once: as columns of their own (the band's mask drops them)
            n = keys.size(2)
            keys, values = (torch.cat([t[:, :, None, :G].expand(-1, -1, n, -1, -1), band], 3)
                            for t, band in ((k, keys), (v, values)))                          # (B, H, n, G+width, D)
            visible = torch.cat([visible.new_ones(n, tile, G), visible], -1)
        y = unband(self.softmax_attention(band_queries(q, tile), keys, values, visible, fused), T)
        return self.with_global_rows(y, global_qkv, fused)  # (B, H, T, D)

    def band(self, T):
        """(tile, behind, ahead): each tile of queries against keys from `behind` before it to `ahead` after it."""
        if self.causal:
            _, tile, lookback = band_layout(self.window, T)
            return tile, lookback, 0
        _, tile, reach = band_layout(max(self.half, 1), T)  # reach >= half, a whole number of tiles
        return tile, reach, reach

    def softmax_attention(self, q, k, v, visible, fused):  # softmax(q kᵀ/√D, -inf where not visible) v
        if fused:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=visible,
                                                  dropout_p=self.dropout if self.training else 0.0)
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
        if visible is not None:
            scores = scores.masked_fill(~visible, float('-inf'))
        return F.dropout(scores.softmax(-1), self.dropout, self.training) @ v

    def with_global_rows(self, y, global_qkv, fused):
        """y with its first G rows replaced: qg of the global tokens against kg, vg of every token, (B, H, G, T)."""
        G = min(self.n_global, y.size(2))
        if not G:
            return y
        qg, kg, vg = global_qkv
        return torch.cat([self.softmax_attention(qg[:, :, :G], kg, vg, None, fused), y[:, :, G:]], 2)

    def attend_flex(self, q, k, v, *global_qkv, masks=None):
        # the whole pattern's BlockMask (its global rows, computed with q, k, v, are replaced: G x T through SDPA)
        y = run_flex(q, k, v, block_mask=self.flex_masks(q.size(2), q.device) if masks is None else masks)
        return self.with_global_rows(y, global_qkv, fused=True)

    def new_cache(self):  # a ring of the last W_l keys and values: constant memory
        if not self.causal:
            raise ValueError("the bidirectional (ViT) Longformer does not generate; a cache is for the GPT form")
        return KVCache(self.window)

    def fill(self, cache, q, k, v):
        cache.append(k, v)

    def decode(self, q, k, v, cache):  # (B, H, 1, D): the ring holds exactly the keys the new query sees
        cache.append(k, v)
        return decode_sdpa(q, *cache.tensors())

    @torch.no_grad()
    def attention_weights(self, *tensors):
        """(B, H, T, T), each row a distribution: rows >= G over v, the G global rows over vg (two v's, so the
        frame's identity basis is run once for each)."""
        if not self.n_global:
            return super().attention_weights(*tensors)
        q, k, v, qg, kg, vg = tensors
        local = weights_of_linear_map(lambda *qkv: self.path()(*qkv, qg, kg, vg), q, k, v)
        rows = weights_of_linear_map(lambda *global_qkv: self.path()(q, k, v, *global_qkv), qg, kg, vg)
        G = min(self.n_global, q.size(2))
        return torch.cat([rows[:, :, :G], local[:, :, G:]], 2)


def longformer_windows(first, last, n_layer):
    """Each layer's window: `first` at layer 0 to `last` at the last layer, round(linspace) between; last = 0:
    `first` in every layer."""
    return [round(x) for x in torch.linspace(first, last or first, n_layer, dtype=torch.float64).tolist()]


@lru_cache(maxsize=None)
def longformer_mask(half, n_global):  # the bidirectional pattern (the paper's Fig. 2d): the window or a global token
    return or_masks(two_sided_window_mask(half), global_tokens_mask(n_global))


@lru_cache(maxsize=None)
def longformer_band_mask(half, n_global):  # the band's share: the window less the global keys (columns of their own)
    return and_masks(two_sided_window_mask(half), lambda b, h, q_idx, kv_idx: kv_idx >= n_global)


# -----------------------------------------------------------------------------
# routing

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
    a sliding window instead, as the paper mixes them. Math path: tokens sorted by (cluster, position), a causal
    band of w over that order masked to the query's cluster, put back: O(T·w), never T×T (a local head is the
    same band with one cluster). RoPE turns the routing vectors after they are routed: clusters of content, not
    position. Cache: a ring of the last w keys per head and cluster, O(C·w) for ever. No flex path.
    """
    has_cache = True

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
        self.window, self.n_route = w, H - L
        self.decay, self.commitment = config.routing_decay, config.routing_commitment
        self.mask_mod = sliding_window_mask(w)  # on the band: over the sorted order (routing) or positions (local)
        self.commitment_loss = None  # what the last training forward left for extra_loss
        self.register_buffer('centroids', F.normalize(torch.randn(self.n_route, C, D), dim=-1))  # (R, C, D)
        # what training forwards routed since the last optimizer step: Σ x and how many, per head and centroid
        self.register_buffer('cluster_sums', torch.zeros(self.n_route, C, D), persistent=False)
        self.register_buffer('cluster_counts', torch.zeros(self.n_route, C), persistent=False)

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
        _, tile, lookback = band_layout(self.window, T)
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
        clusters = self.assign(x)
        if self.training and self.commitment and self.n_route and torch.is_grad_enabled():  # β·mean‖x - sg(μ)‖²
            self.commitment_loss = self.commitment * (x - self.chosen(clusters).to(x.dtype)).pow(2).sum(-1).mean()
        return x, clusters

    def extra_loss(self):  # the last training forward's commitment loss, once
        loss, self.commitment_loss = self.commitment_loss, None
        return loss

    @torch.no_grad()
    def assign(self, x):  # (B, R, T, D) -> (B, R, T): the nearest unit centroid, the largest x·μ_c, in float32+
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

    def new_cache(self):  # the last w keys and values of each head's clusters: O(C·w) per head, any length
        return RoutingCache(self.window, self.centroids.size(1))

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


class RoutingCache:
    """Routing attention between tokens: for each batch row, head and cluster, a ring of the last w keys and values
    the cluster received (its r-th key in slot r % w), and `count` (B, H, C), how many it received; a local head
    uses cluster 0 alone. O(C·w) per head, at any length."""

    def __init__(self, window, clusters):
        self.window, self.clusters, self.pos = window, clusters, 0
        self.keys = self.values = self.count = None

    def fill(self, k, v, ids):  # a prompt's keys and values (B, H, T, D) and clusters (B, H, T)
        (B, H, T, D), w = k.shape, self.window
        self.keys, self.values = (t.new_zeros(B, H, self.clusters, w, D) for t in (k, v))
        one_hot = F.one_hot(ids, self.clusters)                   # (B, H, T, C)
        rank = (one_hot.cumsum(2) * one_hot).sum(-1) - 1           # (B, H, T): the key's number in its cluster
        self.count = one_hot.sum(2)                                # (B, H, C)
        b, h, t = (rank >= self.count.gather(2, ids) - w).nonzero(as_tuple=True)  # the last w of each cluster
        slot = (b, h, ids[b, h, t], rank[b, h, t] % w)
        self.keys[slot], self.values[slot] = k[b, h, t], v[b, h, t]
        self.pos = T

    def append(self, k, v, ids):
        """One token (B, H, 1, D), (B, H, 1) into its cluster's ring; that ring's keys and values (B, H, w, D) and
        which of its slots hold one (B, H, w)."""
        B, H, _, D = k.shape
        b, h = torch.arange(B, device=k.device).view(B, 1), torch.arange(H, device=k.device).view(1, H)
        c = ids[..., 0]                                            # (B, H)
        n = self.count[b, h, c]                                    # keys the cluster held before
        self.keys[b, h, c, n % self.window], self.values[b, h, c, n % self.window] = k[:, :, 0], v[:, :, 0]
        self.count[b, h, c] = n + 1
        self.pos += 1
        held = torch.arange(self.window, device=k.device) < (n + 1).unsqueeze(-1)
        return self.keys[b, h, c], self.values[b, h, c], held

    def nbytes(self):
        return sum(t.numel() * t.element_size() for t in (self.keys, self.values, self.count) if t is not None)


# -----------------------------------------------------------------------------
# linear

@dataclass
class LinearConfig:
    linear_chunk: int = 64       # linear GPT: tokens per chunk (causal C×C within it, the D×D state carried across)
    linear_eps: float = 1e-6     # linear: ε added to the denominator φ(q_i)·z_i (fast-transformers' default)


class LinearAttention(Attention):
    """
    φ(x) = elu(x) + 1,   o_i = φ(q_i)ᵀ S_i / (φ(q_i)ᵀ z_i + ε)                          per head; no 1/√D
    S_i = Σ_{j∈Vis(i)} φ(k_j) v_jᵀ (D×D),   z_i = Σ_{j∈Vis(i)} φ(k_j) (D)
    ("Transformers are RNNs: Fast Autoregressive Transformers with Linear Attention", Katharopoulos, Vyas, Pappas,
    Fleuret 2020, arXiv 2006.16236, §3.2-3.4; docs/rules.md#linear)

    Softmax's exp(q·k) replaced by the kernel φ(q)·φ(k) > 0: a row's weights φ(q_i)·φ(k_j) / (φ(q_i)·z_i + ε) are
    still a distribution (up to ε), and the sums over keys factor out of the queries: O(T·D²), no T×T. Nothing is
    learned beyond q, k, v, and there is no dropout on the weights (the authors' code has none). ViT: one S and z
    over all tokens. GPT, in chunks of `linear_chunk` tokens: the causal C×C form within a chunk, and across, the
    state of all earlier chunks (an exclusive cumulative sum over chunks of φ(K_c)ᵀV_c: n × D×D, never T × D×D);
    memory linear in T, backward included. Sums over chunks and the cache are float32 or wider (bf16 would drift).
    The cache is the paper's RNN (§3.4): S and z, O(D²) per head at any length. No flex path: the math path is
    already dense matmuls.
    """
    has_bidirectional_form, has_cache = True, True

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        if not config.linear_chunk >= 1:
            raise ValueError(f"linear_chunk must be >= 1, got {config.linear_chunk}")
        if not (config.linear_eps > 0 and math.isfinite(config.linear_eps)):
            raise ValueError(f"linear_eps must be a finite number > 0, got {config.linear_eps}")
        self.chunk, self.eps = config.linear_chunk, config.linear_eps

    def attend(self, q, k, v):
        q, k = elu_plus_one(q), elu_plus_one(k)  # (B, H, T, D), > 0
        return (self.attend_chunks if self.causal else self.attend_all)(q, k, v)

    def attend_all(self, q, k, v):  # bidirectional: S and z of the whole sequence; q, k are φ(q), φ(k)
        S, z = linear_sums(k, v)                                                  # (B, H, D, D), (B, H, 1, D)
        return self.normalise(*linear_readout(q, S, z), v.dtype)

    def attend_chunks(self, q, k, v):  # causal, chunkwise; q, k are φ(q), φ(k)
        T, L = q.size(2), min(self.chunk, q.size(2))
        qc, kc, vc = (band_queries(t, L) for t in (q, k, v))  # (B, H, n, L, D); padded keys φ(k) = 0 add nothing
        S, z = carried_state(kc, vc)                                              # (B, H, n, D, D), (B, H, n, 1, D)
        numerator, denominator = linear_readout(qc, S, z)                         # the earlier chunks
        weights = torch.tril(qc @ kc.transpose(-1, -2))                           # (B, H, n, L, L): j <= i within
        numerator = numerator + weights @ vc
        denominator = denominator + weights.sum(-1, keepdim=True, dtype=denominator.dtype)
        return unband(self.normalise(numerator, denominator, v.dtype), T)         # (B, H, T, D)

    def normalise(self, numerator, denominator, dtype):  # o = φ(q)ᵀS / (φ(q)ᵀz + ε), back in the activations' dtype
        return (numerator / (denominator + self.eps)).to(dtype)

    def new_cache(self):  # S and z: O(D²) per head, whatever the length
        if not self.causal:
            raise ValueError("the bidirectional (ViT) linear form does not generate; a cache is for the GPT form")
        return LinearCache()

    def fill(self, cache, q, k, v):  # the prompt's sums
        cache.add(elu_plus_one(k), v)

    def decode(self, q, k, v, cache):  # (B, H, 1, D): the new token into the sums, then read them out
        cache.add(elu_plus_one(k), v)
        return self.normalise(*linear_readout(elu_plus_one(q), cache.S, cache.z), v.dtype)


def elu_plus_one(x):  # the paper's feature map φ, > 0 everywhere
    return F.elu(x) + 1


def linear_sums(k, v):
    """φ(k) (..., T, D), v (..., T, D) -> S = Σ_j φ(k_j) v_jᵀ (..., D, D) and z = Σ_j φ(k_j) (..., 1, D), in float32
    or wider."""
    running = torch.promote_types(k.dtype, torch.float32)
    return k.to(running).transpose(-1, -2) @ v.to(running), k.sum(-2, keepdim=True, dtype=running)


def carried_state(kc, vc):
    """φ(K), V in chunks (B, H, n, L, D) -> what each chunk sees of the past, S and z over every strictly earlier
    chunk: (B, H, n, D, D), (B, H, n, 1, D), summed over chunks in float32 or wider (chunk 0: zeros)."""
    running = torch.promote_types(kc.dtype, torch.float32)
    S = exclusive_cumsum((kc.transpose(-1, -2) @ vc).to(running), 2)  # each chunk's own S in the activations' dtype
    return S, exclusive_cumsum(kc.sum(-2, keepdim=True, dtype=running), 2)


def linear_readout(q, S, z):
    """φ(q) (..., n, D) against S (..., D, D) and z (..., 1, D): the numerator φ(q)ᵀS (..., n, D) and the
    denominator φ(q)ᵀz (..., n, 1), in S's dtype."""
    q = q.to(S.dtype)
    return q @ S, (q * z).sum(-1, keepdim=True)


class LinearCache:
    """Causal linear attention between tokens, the paper's RNN: S = Σ_j φ(k_j)v_jᵀ (B, H, D, D) and z = Σ_j φ(k_j)
    (B, H, 1, D) over every token so far, in float32 or wider. O(D²) per head, any length."""

    def __init__(self):
        self.pos, self.S, self.z = 0, None, None

    def add(self, k, v):  # φ(k), v (B, H, n, D): n more tokens
        S, z = linear_sums(k, v)
        self.S, self.z = (S, z) if self.S is None else (self.S + S, self.z + z)
        self.pos += k.size(2)

    def nbytes(self):
        return sum(t.numel() * t.element_size() for t in (self.S, self.z) if t is not None)


# -----------------------------------------------------------------------------
# gated

@dataclass
class GatedConfig:
    gated_headwise: bool = False  # gated: one gate per head (W_g: C×H); False: one per head and channel (C×C)


class GatedAttention(SoftmaxAttention):
    """
    y = softmax(q kᵀ / √D + mask) v ⊙ σ(x W_g)      per head; x the layer's input, σ(x W_g) this head's D gates
    ("Gated Attention for Large Language Models: Non-linearity, Sparsity, and Attention-Sink-Free", Qiu et al. 2025,
    arXiv 2505.06708, §2.2, position G1; docs/rules.md#gated)

    Softmax attention whose output is gated, after SDPA and before c_proj, by a sigmoid of the token's own input:
    elementwise (one gate per head and channel, W_g C×C) or headwise (`gated_headwise`, one per head, C×H). The
    gate is one more projection, fused into c_attn as the official code fuses it into q_proj (and biased when
    c_attn is, config.bias, as the official gate follows q_proj's bias): c_attn is C → 3C + C (or 3C + H), and
    `project` gives q, k, v (RoPE on q, k) and the gate's logits g (B, H, T, D or 1). It starts as the model's other
    Linears do (N(0, 0.02), zero bias): every gate near σ(0) = 1/2. Every path is softmax's (attend, SDPA, the
    window's band, flex, the cache), the gate applied after; decoding gates the new token's output by its own gate.
    """
    projections = ('q', 'k', 'v', 'g')  # 'g' is not rotated: RoPE rotates the names starting with q or k

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)  # c_attn: q, k, v and an elementwise gate, 4C wide
        if not isinstance(config.gated_headwise, bool):
            raise ValueError(f"gated_headwise must be True or False, got {config.gated_headwise!r}")
        self.gate_width = self.n_head if config.gated_headwise else config.n_embd
        if config.gated_headwise:  # q, k, v and one gate per head: 3C + H wide
            self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd + self.n_head, bias=config.bias)

    def project(self, x, offset=0):  # q, k, v (B, H, T, D), as softmax's; g: the gate's logits (B, H, T, D or 1)
        qkv, g = self.c_attn(x).split([3 * self.n_head * self.head_dim, self.gate_width], dim=2)
        q, k, v = (split_heads(t, self.n_head) for t in qkv.chunk(3, dim=2))
        if self.rope is not None:  # positions enter through the queries and keys only
            q, k = self.rope(q, offset), self.rope(k, offset)
        return q, k, v, split_heads(g, self.n_head)

    def attend(self, q, k, v, g):
        return super().attend(q, k, v) * torch.sigmoid(g)

    def attend_fused(self, q, k, v, g):
        return super().attend_fused(q, k, v) * torch.sigmoid(g)

    def attend_flex(self, q, k, v, g, masks=None):
        return super().attend_flex(q, k, v, masks) * torch.sigmoid(g)

    def fill(self, cache, q, k, v, g):  # softmax's cache: keys and values; a gate is used once, by its own token
        super().fill(cache, q, k, v)

    def decode(self, q, k, v, g, cache):  # (B, H, 1, ·): the new token's output, gated by its own gate
        return super().decode(q, k, v, cache) * torch.sigmoid(g)

    @torch.no_grad()
    def attention_weights(self, q, k, v, g):
        """A, the softmax weights (B, H, T, T), as the paper reads them: the gate scales A v after, per channel."""
        return weights_of_linear_map(super().attend_fused if self.fused else super().attend, q, k, v)


# -----------------------------------------------------------------------------
# rules whose rows need every score at once (entmax, ReLA): y = W v, W from weights(q, k, visible)

class RowWeightsAttention(Attention):
    """
    y = W v,  W_i· = weights(q_i, k, visible(i))          a rule whose rows need all their keys' scores at once

    The frame of entmax and ReLA: a rule writes `weights`; its math path runs queries in tiles of chunk_weights // T
    rows against the keys they see, each tile recomputed in backward, so memory is linear in T, never T×T; its
    cache holds every key and value (decode: the new query's weights over all of them). No flex or fused path.
    """
    has_bidirectional_form, has_cache = True, True
    chunk_weights = 2**18  # weights per head one query tile may hold; a rule's own key sets it

    def weights(self, q, k, visible=None):  # (B, H, C, D), (B, H, L, D), (C, L) bool or None -> (B, H, C, L)
        raise NotImplementedError

    def attend(self, q, k, v):
        T = q.size(2)

        def tile_output(start, end, n_keys):  # queries start..end-1 against keys 0..n_keys-1
            visible = causal_mask(None, None, torch.arange(start, end, device=q.device)[:, None],
                                  torch.arange(n_keys, device=q.device)) if self.causal else None
            return self.weights(q[:, :, start:end], k[:, :, :n_keys], visible).to(v.dtype) @ v[:, :, :n_keys]

        rows = max(1, self.chunk_weights // T)  # queries per tile
        return torch.cat([recompute_in_backward(tile_output, *tile) for tile in query_tiles(T, rows, self.causal)], 2)

    def new_cache(self):  # every key and value: grows with the context
        return KVCache()

    def fill(self, cache, q, k, v):
        cache.append(k, v)

    def decode(self, q, k, v, cache):  # (B, H, 1, D): every cached key is visible
        cache.append(k, v)
        keys, values = cache.tensors()
        return self.weights(q, keys).to(v.dtype) @ values


# -----------------------------------------------------------------------------
# entmax

@dataclass
class EntmaxConfig:
    entmax_alpha: float = 1.5    # entmax: α > 1 (1.5: exact, by sort; 2: sparsemax; others: bisection); α = 1: softmax
    entmax_iters: int = 50       # entmax: bisection steps where α != 1.5 (the entmax package's n_iter)
    entmax_chunk_weights: int = 2**18  # entmax math path: weights per head one query tile may hold (that // T queries)


class EntmaxAttention(RowWeightsAttention):
    """
    p_ij = [(α-1)·s_ij - τ_i]₊^(1/(α-1)),  τ_i such that Σ_j p_ij = 1,   s_ij = q_i·k_j/√D over Vis(i)
    y_i  = Σ_j p_ij v_j            α = 1.5:  p_ij = [s_ij/2 - τ_i]₊²
    ("Sparse Sequence-to-Sequence Models", Peters, Niculae, Martins 2019, arXiv 1905.05702; in attention: "Adaptively
    Sparse Transformers", Correia, Niculae, Martins 2019, arXiv 1909.00015; docs/rules.md#entmax)

    α-entmax, softmax's sparse sibling (the argmax of p·s plus the Tsallis α-entropy over the simplex): a row is
    still a distribution, but keys scoring below the row's threshold get exactly 0. α is fixed for every head
    (`entmax_alpha`; the adaptive α of Correia et al. is not here); nothing is learned beyond q, k, v, o. α = 1.5:
    τ in closed form from the sorted row (Peters et al.'s exact algorithm); any other α > 1: `entmax_iters` steps of
    bisection on τ, as the `entmax` package's entmax_bisect. Both in float32 at least, whatever the activations'
    dtype; backward is entmax's Jacobian (EntmaxFunction). Math path (query tiles of entmax_chunk_weights // T rows)
    and cache: RowWeightsAttention's. No flex path: the weights are not exp of a score.
    """

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        alpha = config.entmax_alpha
        if not (math.isfinite(alpha) and alpha > 1):
            raise ValueError(f"entmax_alpha must be a finite number > 1 (1.5, or 2 for sparsemax), got {alpha}; "
                             f"α = 1 is softmax: use attention=softmax")
        if config.entmax_iters < 1:
            raise ValueError(f"entmax_iters must be >= 1, got {config.entmax_iters}")
        if config.entmax_chunk_weights < 1:
            raise ValueError(f"entmax_chunk_weights must be >= 1, got {config.entmax_chunk_weights}")
        self.alpha, self.iters, self.chunk_weights = float(alpha), config.entmax_iters, config.entmax_chunk_weights

    def weights(self, q, k, visible=None):  # (B, H, C, D), (B, H, L, D), (C, L) bool or None -> (B, H, C, L)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        scores = scores.to(torch.promote_types(scores.dtype, torch.float32))  # the threshold's sums: never in 16 bits
        if visible is not None:  # a hidden key scores -inf: its weight is exactly 0
            scores = scores.masked_fill(~visible, float('-inf'))
        return F.dropout(EntmaxFunction.apply(scores, self.alpha, self.iters), self.dropout, self.training)



class EntmaxFunction(torch.autograd.Function):
    """α-entmax along the last dim of scores (float32 or wider; -inf: weight 0), with its Jacobian in backward:
    g = p^(2-α) on the support (0 off it), ds = g·dp - g·Σ(g·dp)/Σg. The support carries no gradient; a row with
    one key in its support has a zero Jacobian."""

    @staticmethod
    def forward(ctx, scores, alpha, iters):
        z = (scores - scores.amax(-1, keepdim=True)) * (alpha - 1)  # the row's maximum at 0 (p <= 1 there)
        p = entmax15_sorted(z) if alpha == 1.5 else entmax_bisect(z, alpha, iters)
        ctx.save_for_backward(p)
        ctx.alpha = alpha
        return p

    @staticmethod
    def backward(ctx, grad):
        p, = ctx.saved_tensors
        g = p.sqrt() if ctx.alpha == 1.5 else torch.where(p > 0, p, 1.0) ** (2 - ctx.alpha) * (p > 0)
        gd = g * grad
        return gd - g * (gd.sum(-1, keepdim=True) / g.sum(-1, keepdim=True)), None, None


def entmax15_sorted(z):
    """1.5-entmax of z = s/2 (max 0, -inf hidden), exactly: for the k largest z, Σ (z - τ)² = 1 gives
    τ(k) = mean - √((1 - Σ(z - mean)²)/k); the support is the k with τ(k) <= z_(k) (Peters et al.'s sort)."""
    zs = z.sort(-1, descending=True).values
    seen = zs > float('-inf')
    zs0 = zs.masked_fill(~seen, 0.0)  # hidden keys sort last: their zeros touch no visible k's sums
    k = torch.arange(1, z.size(-1) + 1, device=z.device, dtype=z.dtype)
    mean, mean_sq = zs0.cumsum(-1) / k, (zs0 * zs0).cumsum(-1) / k
    tau = mean - ((1 - k * (mean_sq - mean * mean)) / k).clamp_min(0).sqrt()
    support = ((tau <= zs) & seen).sum(-1, keepdim=True)  # >= 1: the largest z always passes
    return (z - tau.gather(-1, support - 1)).clamp_min(0) ** 2


def entmax_bisect(z, alpha, iters):
    """α-entmax of z = (α-1)·s (max 0, -inf hidden) by bisection on τ in [-1, -(1/n)^(α-1)], where Σ_j p_j(τ) goes
    from >= 1 to <= 1, then renormalised (the entmax package's entmax_bisect, ensure_sum_one)."""
    p_of = lambda tau: (z - tau).clamp_min(0) ** (1 / (alpha - 1))
    lo = torch.full_like(z[..., :1], -1.0)
    width = 1 - z.size(-1) ** (1 - alpha)
    for _ in range(iters):
        width /= 2
        lo = torch.where(p_of(lo + width).sum(-1, keepdim=True) >= 1, lo + width, lo)
    p = p_of(lo)
    return p / p.sum(-1, keepdim=True)


# -----------------------------------------------------------------------------
# ReLA

@dataclass
class ReLAConfig:
    rela_eps: float = 1e-8       # ReLA: ε of the gated RMSNorm over the merged heads (the official code's: 1e-8)
    rela_chunk_weights: int = 2**18  # ReLA math path: weights per head one query tile may hold (that // T queries)


class ReLAAttention(RowWeightsAttention):
    """
    a_ij = relu(q_i·k_j/√D) for j in Vis(i), else 0;   y_i = Σ_j a_ij v_j        per head, no normalisation over j
    o = g ⊙ z/√(mean(z²) + ε) ⊙ σ(w ⊙ z),   z = the merged heads (B, T, C);   then c_proj
    ("Sparse Attention with Linear Units", Zhang, Titov, Sennrich 2021, arXiv 2104.07012, ReLA-g; authors' code:
    bzhangGo/zero modules/rela.py; docs/rules.md#rela)

    Rectified linear attention: softmax replaced by a ReLU, so a key with a negative score gets exactly 0, a row
    need not sum to 1 and may be all zero (the head "switches off": y = 0, and o = 0 if every head does). The
    scale is kept in check by a gated RMSNorm over all heads between the merge and c_proj (`out`), with learned
    g (`norm_scale`, init 1) and w (`norm_gate`, init U(±√(3/C)), the official code's default: TF's variance
    scaling, fan_avg, uniform, on a vector of C), 2C parameters per layer; ε = `rela_eps` (1e-8 as there), the norm
    in float32 at least. Math path (query tiles of rela_chunk_weights // T rows) and cache: RowWeightsAttention's.
    """
    weights_note = "relu(s): rows are not normalised (they may sum to anything, or be all zero), and the gated " \
                   "RMSNorm over the merged heads after W v rescales each token"

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        if not (math.isfinite(config.rela_eps) and config.rela_eps > 0):
            raise ValueError(f"rela_eps must be a finite number > 0, got {config.rela_eps}")
        if config.rela_chunk_weights < 1:
            raise ValueError(f"rela_chunk_weights must be >= 1, got {config.rela_chunk_weights}")
        self.eps, self.chunk_weights = config.rela_eps, config.rela_chunk_weights
        C = config.n_embd
        self.norm_scale = nn.Parameter(torch.ones(C))                                    # g
        self.norm_gate = nn.Parameter(torch.empty(C).uniform_(-math.sqrt(3 / C), math.sqrt(3 / C)))  # w

    def weights(self, q, k, visible=None):  # (B, H, C, D), (B, H, L, D), (C, L) bool or None -> (B, H, C, L)
        a = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).relu()
        if visible is not None:  # a hidden key's weight is 0, whatever its score
            a = a.masked_fill(~visible, 0.0)
        return F.dropout(a, self.dropout, self.training)

    def out(self, y):  # the gated RMSNorm between the merge and c_proj
        return self.resid_dropout(self.c_proj(self.gated_rms_norm(merge_heads(y))))

    def gated_rms_norm(self, z):  # (B, T, C): g ⊙ z/√(mean z² + ε) ⊙ σ(w ⊙ z); z = 0 gives exactly 0
        x = z.to(torch.promote_types(z.dtype, torch.float32))
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.norm_scale * normed * torch.sigmoid(self.norm_gate * x)).to(z.dtype)


# -----------------------------------------------------------------------------
# Diff

@dataclass
class DiffConfig:
    diff_lambda_init: float = 0.0  # Diff: λ_init in [0, 1); 0 = the paper's depth schedule 0.8 - 0.6·exp(-0.3·layer)


class DiffAttention(Attention):
    """
    y_h = (softmax(q1 k1ᵀ / √D + mask) - λ softmax(q2 k2ᵀ / √D + mask)) [v1, v2]      differential head h: the
    o_h = (1 - λ_init) · RMSNorm(y_h)                      frame's heads 2h (q1, k1, v1) and 2h + 1 (q2, k2, v2)
    λ = exp(λq1·λk1) - exp(λq2·λk2) + λ_init,   λ_init = 0.8 - 0.6·exp(-0.3·l), l the 0-based layer
    ("Differential Transformer", Ye et al. 2024, arXiv 2410.05258, eq. 1-3; docs/rules.md#diff)

    Two softmax maps per head, the second subtracted: noise both maps put on irrelevant keys (the sink) cancels.
    H/2 differential heads, each a pair of the frame's H heads of D = C/H, exactly the official code's layout (its
    2·H/2 q, k heads of D, its H/2 values of 2D): `project` is the frame's, c_attn and c_proj are softmax's, and the
    output's channels come back in the frame's heads (2h: o_h's first D, 2h + 1: its last D). Learned beyond
    softmax: λq1, λk1, λq2, λk2 (D each, per layer, shared by the heads, N(0, 0.1²) as the official code draws
    them) and the RMSNorm's weight (2D, eps 1e-5, shared). λ_init follows depth, or is `diff_lambda_init`. Paths:
    attend (the two maps as tensor ops, T×T), attend_fused (SDPA per half of the values: q, k, v all D wide, flash on
    a GPU), attend_flex (one call, values 2D wide), a cache of every key and value.
    """
    has_bidirectional_form, has_cache, has_flex, fused = True, True, True, True
    weights_note = ("softmax1 - lam*softmax2 per pair of heads (both heads of a pair report it): signed, rows "
                    "summing to 1 - lam, and the RMSNorm after W v rescales each row")

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        if config.n_head % 2:
            raise ValueError(f"diff needs an even n_head (each differential head is a pair of heads), got "
                             f"n_head={config.n_head}")
        if not (math.isfinite(config.diff_lambda_init) and 0 <= config.diff_lambda_init < 1):
            raise ValueError(f"diff_lambda_init must be in [0, 1) (0: the depth schedule), got "
                             f"{config.diff_lambda_init}")
        self.lambda_init = config.diff_lambda_init or 0.8 - 0.6 * math.exp(-0.3 * layer_idx)
        D = self.head_dim
        self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (nn.Parameter(0.1 * torch.randn(D))
                                                                          for _ in range(4))
        self.head_norm = nn.RMSNorm(2 * D, eps=1e-5)
        self.mask_mod = causal_mask if self.causal else None

    def lam(self):  # λ, one scalar per layer
        return (torch.exp((self.lambda_q1 * self.lambda_k1).sum()) - torch.exp((self.lambda_q2 * self.lambda_k2).sum())
                + self.lambda_init)

    def weights(self, q, k, mask=None):
        """softmax₁ - λ softmax₂ of each pair of heads, (B, H, T, L) -> (B, H/2, T, L); mask (T, L), None: all."""
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))                          # (B, H, T, L)
        if mask is not None:
            scores = scores.masked_fill(~mask, float('-inf'))
        maps = F.dropout(scores.softmax(-1), self.dropout, self.training).unflatten(1, (-1, 2))  # (B, H/2, 2, T, L)
        return maps[:, :, 0] - self.lam().to(maps.dtype) * maps[:, :, 1]

    def attend(self, q, k, v):  # (B, H, T, D) each
        mask = None if self.mask_mod is None else dense_mask(self.mask_mod, q.size(2), q.device)
        return self.normalise(self.weights(q, k, mask) @ pair_heads(v))                  # (B, H, T, D)

    def attend_fused(self, q, k, v):
        # each head's softmax of its pair's two value heads, one SDPA call per value head (v1 to both heads, then v2)
        dropout_p = self.dropout if self.training else 0.0
        halves = [F.scaled_dot_product_attention(q, k, half.repeat_interleave(2, 1), dropout_p=dropout_p,
                                                 is_causal=self.causal) for half in (v[:, 0::2], v[:, 1::2])]
        return self.subtract(torch.cat(halves, -1))

    def attend_flex(self, q, k, v, masks=None):  # one call on the H heads, each with its pair's values (2D wide)
        y = run_flex(q, k, pair_heads(v).repeat_interleave(2, 1),
                     block_mask=self.flex_masks(q.size(2), q.device) if masks is None else masks)
        return self.subtract(y)

    def subtract(self, y):  # (B, H, T, 2D): each head's softmax of its pair's values -> o (B, H, T, D)
        y = y.unflatten(1, (-1, 2))                                                      # (B, H/2, 2, T, 2D)
        return self.normalise(y[:, :, 0] - self.lam().to(y.dtype) * y[:, :, 1])

    def normalise(self, y):  # (B, H/2, T, 2D) -> (B, H, T, D): (1 - λ_init)·RMSNorm per differential head
        return unpair_heads(self.head_norm(y) * (1 - self.lambda_init))

    def new_cache(self):  # every key (B, H, n, D) and every value, paired (B, H/2, n, 2D): grows with the context
        return KVCache()

    def fill(self, cache, q, k, v):
        cache.append(k, pair_heads(v))

    def decode(self, q, k, v, cache):  # (B, H, 1, D): every cached key is visible
        cache.append(k, pair_heads(v))
        keys, values = cache.tensors()
        return self.normalise(self.weights(q, keys) @ values)

    @torch.no_grad()
    def attention_weights(self, q, k, v):
        """softmax₁ - λ softmax₂ (B, H, T, T), differential head h's for both its heads 2h and 2h + 1: head 2h + i's
        output is RMSNorm'd (with its pair) from this W times v_{2h+i}."""
        mask = None if self.mask_mod is None else dense_mask(self.mask_mod, q.size(2), q.device)
        return self.weights(q, k, mask).repeat_interleave(2, 1)


def pair_heads(x):  # (B, H, T, D) -> (B, H/2, T, 2D): heads 2h and 2h + 1 side by side, one differential head's
    return x.unflatten(1, (-1, 2)).transpose(2, 3).flatten(3)


def unpair_heads(y):  # (B, H/2, T, 2D) -> (B, H, T, D), the inverse: merge_heads then gives the official layout
    return y.unflatten(-1, (2, -1)).transpose(2, 3).flatten(1, 2)


# -----------------------------------------------------------------------------
# SSMax

@dataclass
class SSMaxConfig:
    ssmax_s: float = 0.43        # SSMax: initial s (learned per head); the logits are multiplied by s·log n


class SSMaxAttention(SoftmaxAttention):
    """
    y_i = Σ_j softmax_j((s_h · log n_i) · q_i·k_j / √D + mask_ij) v_j     n_i = |Vis(i)|: i + 1 causal, T in a ViT
    ("Scalable-Softmax Is Superior for Attention", Nakanishi 2025, arXiv 2501.19399; docs/rules.md#ssmax)

    Scalable-Softmax: softmax's largest weight fades towards 0 as a row sees more keys; multiplying the logits by
    s·log n, n the keys the row sees, keeps it from fading. s is learned per head (`scale`, 1-D so AdamW does not
    decay it), from ssmax_s. Row 0 of a GPT (n = 1) has log 1 = 0: all its logits are 0, over the one key it sees.
    With `window` W, n_i = min(i + 1, W). `attend` is the formula as tensor ops; the other paths are softmax's on
    queries scaled per row by s_h·log n_i: SDPA (attend_fused, flash on a GPU), flex (q scaled, nothing captured
    by a score_mod: a learned scalar captured there has had gradient bugs), and the cache (softmax's), where a new
    token's n is its absolute position + 1.
    """

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        if not (math.isfinite(config.ssmax_s) and config.ssmax_s > 0):
            raise ValueError(f"ssmax_s must be a finite number > 0 (the initial s of s·log n), got {config.ssmax_s}")
        self.scale = nn.Parameter(torch.full((self.n_head,), float(config.ssmax_s)))  # s per head; 1-D: not decayed

    def row_scale(self, T, dtype, start=0):
        """(1, H, T, 1): s_h·log n_i for the T queries at positions start..start+T-1 (the ViT: n = T for all)."""
        device = self.scale.device
        n = torch.arange(start + 1, start + T + 1, device=device) if self.causal else torch.full((T,), T, device=device)
        if self.window:
            n = n.clamp_max(self.window)
        return (self.scale.view(-1, 1) * n.to(self.scale.dtype).log()).to(dtype)[None, :, :, None]

    def attend(self, q, k, v):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)) * self.row_scale(q.size(2), q.dtype)  # (B, H, T, T)
        if self.mask_mod is not None:
            scores = scores.masked_fill(~dense_mask(self.mask_mod, q.size(2), q.device), float('-inf'))
        weights = F.dropout(scores.softmax(-1), self.dropout, self.training)
        return weights @ v                                                                  # (B, H, T, D)

    def attend_fused(self, q, k, v):
        return super().attend_fused(q * self.row_scale(q.size(2), q.dtype), k, v)

    def attend_flex(self, q, k, v, masks=None):
        return super().attend_flex(q * self.row_scale(q.size(2), q.dtype), k, v, masks)

    def decode(self, q, k, v, cache):  # (B, H, 1, D): n from the new token's absolute position, cache.pos
        return super().decode(q * self.row_scale(1, q.dtype, start=cache.pos), k, v, cache)


# -----------------------------------------------------------------------------
# DEX

@dataclass
class DEXConfig:
    dex_heads: int = 0           # DEX: heads with the differential step, the layer's last; 0 = half (n_head // 2, >= 1)
    dex_lambda: float = 0.1      # DEX: initial λ in (0, 1), learned per head as its logit (λ = sigmoid)
    dex_init: str = 'zero'       # DEX: f_D's initial W, 'zero' (y = O: softmax at init) or 'identity' (y = (1 - λ)O)


class DEXAttention(SoftmaxAttention):
    """
    O = softmax(q kᵀ / √D + mask) v,   y = O - λ_h · f_D(O),   f_D(O) = O W_hᵀ      on the last dex_heads heads
    y = O                                                                            on the others
    ("Understanding Differential Transformer Unchains Pretrained Self-Attentions", Kong, Jang, Kwak 2025,
    arXiv 2505.16333, Fig. 9; docs/rules.md#dex)

    Differential Extension: the softmax scores are kept as they are and a λ-weighted map of each selected head's
    output is subtracted from it, the paper's way of giving a (pretrained) softmax model what differential attention
    has. No code was released; the paper calls f_D a projection, anneals λ and picks a layer-specific subset of heads,
    without the details. Chosen here (docs/rules.md#dex): f_D a per-head D×D linear map W_h (`f_d`, not decayed),
    starting at 0 (`dex_init`); λ_h = sigmoid(lambda_logit_h) learned per head from `dex_lambda`; the heads, each
    layer's last `dex_heads` (heads are interchangeable when trained from scratch). y is A v (I - λW_hᵀ): linear in v
    but mixing its channels, so the weights reported are A. Every path of softmax (SDPA, window, flex, cache) with
    the step after it; it acts on each token's own output, so it keeps causality.
    """
    no_decay = ('f_d',)

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        H, n, lam = self.n_head, config.dex_heads, config.dex_lambda
        if not 0 <= n <= H:
            raise ValueError(f"dex_heads must be in [0, n_head={H}] (0 = half of them), got {n}")
        if not 0 < lam < 1:  # NaN and infinities fail this too
            raise ValueError(f"dex_lambda must be in (0, 1), got {lam}")
        if config.dex_init not in ('zero', 'identity'):
            raise ValueError(f"dex_init must be 'zero' or 'identity', got '{config.dex_init}'")
        n = n or max(1, H // 2)
        self.first_head = H - n  # heads first_head..H-1 take the differential step
        self.lambda_logit = nn.Parameter(torch.full((n,), math.log(lam / (1 - lam))))
        eye = torch.eye(self.head_dim).expand(n, -1, -1)
        self.f_d = nn.Parameter(eye.clone() if config.dex_init == 'identity' else torch.zeros_like(eye))  # (n, D, D)

    def differential(self, o):  # (B, H, T, D): O - λ_h·O W_hᵀ on the selected heads
        kept, chosen = o[:, :self.first_head], o[:, self.first_head:]
        lam = torch.sigmoid(self.lambda_logit).to(o.dtype).view(1, -1, 1, 1)  # the activations' dtype (bf16 stays bf16)
        return torch.cat([kept, chosen - lam * (chosen @ self.f_d.transpose(-1, -2).to(o.dtype))], 1)

    def attend(self, q, k, v):
        return self.differential(super().attend(q, k, v))

    def attend_fused(self, q, k, v):
        return self.differential(super().attend_fused(q, k, v))

    def attend_flex(self, q, k, v, masks=None):
        return self.differential(super().attend_flex(q, k, v, masks))

    def decode(self, q, k, v, cache):  # softmax's cache: every key, or the window's ring
        return self.differential(super().decode(q, k, v, cache))

    @torch.no_grad()
    def attention_weights(self, *tensors):
        """A, the softmax weights every head keeps (y = A v (I - λW_hᵀ) mixes v's channels: no one T×T matrix)."""
        softmax = SoftmaxAttention.attend_fused if self.fused else SoftmaxAttention.attend
        return weights_of_linear_map(lambda q, k, v: softmax(self, q, k, v), *tensors)


# -----------------------------------------------------------------------------
# LSA

@dataclass
class LSAConfig:
    lsa_per_head: bool = False   # LSA: one learned temperature per layer (AttentionX's base); True: one per head


class LocalitySelfAttention(LearnedTemperature, SoftmaxAttention):
    """
    y = softmax(t · q kᵀ + M) v,   M_ij = -inf if i = j else 0,   t = exp(log_temperature), init 1/√D
    ("Vision Transformer for Small-Size Datasets", Lee, Lee, Song 2021, arXiv 2112.13492, Locality Self-Attention;
    docs/rules.md#lsa)

    Softmax attention with the diagonal masked (no token attends to itself) and a learned temperature t in place of
    1/√D: both sharpen the weights onto the other tokens. t is kept as its log, one per layer as in the ViT
    AttentionX builds on (kentaroy47/vision-transformers-cifar10 vit_small), or one per head (`lsa_per_head`, as the
    authors' code has it). ViT only: with causal attention row 0 would see no key. Every path is softmax's with
    the queries scaled by t·√D (LearnedTemperature, shared with AttentionX on its LSA base: SDPA with the
    off-diagonal mask, flex with it as a BlockMask), so t keeps its gradient and no score_mod captures it. The
    paper's other half, Shifted Patch Tokenization, is not here.
    """
    has_causal_form, has_cache = False, False

    def __init__(self, config, layer_idx):
        if config.causal:  # the frame would refuse it too; this says why
            raise ValueError(f"attention='{config.attention}' ({type(self).__name__}) has no causal form (causal=True, "
                             f"a GPT): its diagonal is masked, so row 0 would see no key; use it in a ViT")
        super().__init__(config, layer_idx)
        self.mask_mod = off_diagonal_mask
        self.init_temperature(True, per_head=config.lsa_per_head)  # t = 1/√D


# -----------------------------------------------------------------------------
# the table of rules: `attention=<name>` in a config picks the class

ATTENTION = {
    'softmax': SoftmaxAttention,
    'krause': KrauseAttention,
    'attentionx': AttentionX,
    'tda': ThresholdDifferentialAttention,
    'cluster': ClusterAttention,
    # the baselines
    'topk': TopkAttention,
    'longformer': LongformerAttention,
    'routing': RoutingAttention,
    'linear': LinearAttention,
    'gated': GatedAttention,
    'entmax': EntmaxAttention,
    'rela': ReLAAttention,
    'diff': DiffAttention,
    'ssmax': SSMaxAttention,
    'dex': DEXAttention,
    'lsa': LocalitySelfAttention,
}


# -----------------------------------------------------------------------------
# two branches: a softmax branch beside any rule of the table, mixed per token (mix=True)

class MixAttention(Attention):
    """
    y = g_0 · y_softmax + g_1 · y_rule,   g = softmax(Linear(2C → 2)([y_softmax, y_rule]))   per token

    Two attention layers side by side: causal softmax attention, and the rule `attention` names, each with its own
    q/k/v/out projections, mixed by a learned gate that starts at 0.8 for the softmax branch (mix=True). Trained from
    scratch with attention='krause' it is the Krause paper's language-model form; on a pretrained model
    (support/pretrained.py) the softmax branch is the pretrained attention and the rule's branch a parallel shortcut
    that starts as a copy of it. In the frame: project gives both branches' tensors, softmax's first; attend gives
    both per-head outputs side by side, (B, H', T, 2D); out projects each through its branch and gates them.
    mix_matched=True gives each branch half the heads (H' = H/2 of the same size D: q, k, v C → C/2, out C/2 → C),
    so the pair holds one softmax layer's attention parameters, plus the gate and the rule's own: the parameter-
    matched form of a comparison with softmax. Otherwise H' = H and the pair holds twice softmax's.
    """
    has_cache, has_flex, fused = True, True, True  # has_*: where the rule's branch has them too (set below)
    projections = None  # each branch brings its own

    def __init__(self, config, layer_idx):
        if not config.causal:
            raise ValueError("mix is the language-model form (causal=True); use mix=False in a ViT")
        super().__init__(config, layer_idx)
        branch = self.branch_config(config)
        self.softmax = SoftmaxAttention(branch, layer_idx)
        self.rule = ATTENTION[config.attention](branch, layer_idx)
        if config.mix_matched:  # each branch reads from and writes to the C-wide residual stream
            for layer in (self.softmax, self.rule):
                layer.c_attn = nn.Linear(config.n_embd, layer.c_attn.out_features, bias=config.bias)
                layer.c_proj = nn.Linear(layer.c_proj.in_features, config.n_embd, bias=config.bias)
        self.has_cache, self.has_flex = self.rule.has_cache, self.rule.has_flex
        self.gate = nn.Linear(2 * config.n_embd, 2)
        if self.rule.weights_note:  # analyze.py: the mix is then no distribution either
            self.weights_note = self.rule.weights_note
        if self.rule.first_token_note:  # nor is token 0's share of it meaningful
            self.first_token_note = self.rule.first_token_note

    @staticmethod
    def branch_config(config):
        """A branch's settings: the model's, or with mix_matched half the heads at the same head size (C/2 wide)."""
        if not config.mix_matched:
            return config
        if config.n_head % 2:
            raise ValueError(f"mix_matched=True gives each branch half the heads, and n_head={config.n_head} is odd; "
                             f"pass an even --n_head, or --mix_matched=False")
        return replace(config, n_head=config.n_head // 2, n_embd=config.n_embd // 2)

    def init_extra(self):
        nn.init.normal_(self.gate.weight, std=0.01)
        with torch.no_grad():
            self.gate.bias.copy_(torch.tensor([math.log(0.8 / 0.2), 0.0]))  # softmax(bias) = (0.8, 0.2)

    def project(self, x, offset=0):
        return self.softmax.project(x, offset) + self.rule.project(x, offset)  # softmax's q, k, v, then the rule's

    def attend(self, q, k, v, *rule_tensors):
        return torch.cat([self.softmax.attend(q, k, v), self.rule.attend(*rule_tensors)], -1)

    def attend_fused(self, q, k, v, *rule_tensors):  # each branch as forward would run it alone
        return torch.cat([self.softmax.attend_fused(q, k, v), self.rule.path()(*rule_tensors)], -1)

    def attend_flex(self, q, k, v, *rule_tensors, masks=None):  # the softmax branch through SDPA: flash on a GPU
        return torch.cat([self.softmax.attend_fused(q, k, v), self.rule.attend_flex(*rule_tensors, masks=masks)], -1)

    def flex_masks(self, T, device):  # the rule's: the softmax branch runs SDPA
        return self.rule.flex_masks(T, device)

    def new_cache(self):  # the softmax branch's (every key unless `window`: grows) beside the rule's own
        return CacheGroup(self.softmax.new_cache(), self.rule.new_cache())

    def fill(self, cache, q, k, v, *rule_tensors):
        self.softmax.fill(cache.caches[0], q, k, v)
        self.rule.fill(cache.caches[1], *rule_tensors)

    def decode(self, q, k, v, *rule_tensors, cache):
        return torch.cat([self.softmax.decode(q, k, v, cache.caches[0]),
                          self.rule.decode(*rule_tensors, cache=cache.caches[1])], -1)

    def out(self, y):  # (B, H, T, 2D): the two branches' heads side by side
        y_softmax, y_rule = self.softmax.out(y[..., :self.head_dim]), self.rule.out(y[..., self.head_dim:])
        return self.gated_sum(y_softmax, y_rule, self.gates(y_softmax, y_rule))

    def gates(self, y_softmax, y_rule):  # (B, T, C) each -> (B, T, 2): each token's share of the two branches
        return self.gate(torch.cat([y_softmax, y_rule], dim=-1)).softmax(-1)

    @staticmethod
    def gated_sum(a, b, g):  # g_0·a + g_1·b
        return g[..., :1] * a + g[..., 1:] * b

    @torch.no_grad()
    def branch_weights(self, *tensors):
        """For analysis (short T, eval mode): (W_softmax, W_rule) (B, H, T, T), each branch's own attention_weights,
        and the gates g (B, T, 2) from the two branches' outputs, from what project returns."""
        q, k, v, *rule_tensors = tensors
        g = self.gates(self.softmax.out(self.softmax.path()(q, k, v)), self.rule.out(self.rule.path()(*rule_tensors)))
        return self.softmax.attention_weights(q, k, v), self.rule.attention_weights(*rule_tensors), g

    def attention_weights(self, *tensors):
        # each token's output is g_0 of the softmax branch's plus g_1 of the rule's: its weights mix the same way
        w_softmax, w_rule, g = self.branch_weights(*tensors)
        return self.gated_sum(w_softmax, w_rule, g.unsqueeze(1))  # g (B, 1, T, 2): each g_i (B, 1, T, 1)


def build_attention(config, layer_idx):
    if config.mix_matched and not config.mix:
        raise ValueError("mix_matched=True halves the branches of a mix; pass --mix=True with it, or drop "
                         "--mix_matched")
    return rule_class(config.attention, config.mix)(config, layer_idx)


def rule_class(attention, mix=False):
    """The class `attention=<name>` builds: ATTENTION's, or with mix the two-branch form (MixAttention)."""
    check_attention_name(attention)
    return MixAttention if mix else ATTENTION[attention]


def check_attention_name(name):
    if name not in ATTENTION:
        raise ValueError(f"unknown attention '{name}'; valid: {', '.join(sorted(ATTENTION))}")


# -----------------------------------------------------------------------------
# the keys: what every layer reads (FrameConfig), then each rule's, beside the rule above

@dataclass
class FrameConfig:
    """What every attention layer needs to know, whatever its rule. Each rule adds its own keys, beside the rule."""
    n_embd: int = 768
    n_head: int = 12
    n_layer: int = 12            # depth (the ViT's Krause top-k grows over it)
    block_size: int = 1024       # longest sequence (GPT context; ViT: 1 + number of patches)
    dropout: float = 0.0
    bias: bool = True            # bias in Linears and LayerNorms
    attention: str = 'softmax'   # a key of attention.ATTENTION
    flex: bool = False           # use the flex_attention path on CUDA
    causal: bool = True          # GPT: True; ViT: False
    grid_size: int = 0           # ViT: side of the patch grid (tokens = 1 CLS + grid_size²); 0 for sequences
    pos_emb: str = 'learned'     # 'learned' (added to the input), 'rope' (rotates q and k in every layer) or 'none'
    mix: bool = False            # GPT: a causal softmax branch beside the rule, gated per token (MixAttention)
    mix_matched: bool = False    # mix: each branch with half the heads, the pair softmax's attention parameters
    rope_base: float = 10000.0   # RoPE: the base θ of the frequencies θ^(-2i/D)
    rope_scaling: str = 'none'   # RoPE past the trained context: 'none', 'linear' (positions / s), 'ntk' (θ·s^(D/(D-2)))
    rope_factor: float = 1.0     # RoPE scaling's s: the longer context / the trained one


@dataclass
class AttentionConfig(LSAConfig, DEXConfig, SSMaxConfig, DiffConfig, ReLAConfig, EntmaxConfig, GatedConfig,
                      LinearConfig, RoutingConfig, LongformerConfig, TopkConfig, ClusterConfig, TDAConfig,
                      AttentionXConfig, KrauseConfig, SoftmaxConfig, FrameConfig):
    """Every key an attention layer reads: the frame's, then each rule's (dataclass fields come base class last
    first, so FrameConfig's lead). GPTConfig and ViTConfig extend it; every field is a config key of train.py."""
