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
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention.flex_attention import AuxRequest

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
        if config.krause_sigma <= 0:
            raise ValueError(f"krause_sigma must be > 0, got {config.krause_sigma}")
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


class AttentionX(SoftmaxAttention):
    """
    y = v - γ · softmax(q kᵀ / √D + mask) v      per head, then heads merged and c_proj as usual
    ("AttentionX: Exploiting Consensus Discrepancy In Attention from A Distributed Optimization Perspective",
    arXiv 2409.04275, eq. 12-13; docs/rules.md#attentionx)

    The "consensus discrepancy" between a token's own value and what it gathers from the others: with A the
    attention matrix, y = (I - γA)V; at γ = 1, I - A is the attention graph's random-walk Laplacian, a high-pass
    filter, the opposite of the smoothing AV that, stacked over layers, drives rank collapse. The paper keeps
    γ >= 1: γ = 3 for its causal nanoGPT (diagonal kept), γ = 1 for its ViT with the diagonal masked
    (`attnx_mask_diagonal`: a token attends only to the others). γ is fixed, or learned per head
    (`attnx_learnable_gamma`). A is SoftmaxAttention's, on each of its paths (SDPA, the window, flex, the cache);
    the masked diagonal is `off_diagonal_mask`, a boolean SDPA mask (no flash).
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
    tda_chunk_weights: int = 2**18  # TDA math path: weights per head one query tile may hold (that // T queries)
    tda_eps: float = 1e-4        # TDA: eps of the per-head RMSNorm; a row is amplified at most 1/sqrt(eps) times


class ThresholdDifferentialAttention(Attention):
    """
    s_ij = q̂_i·k̂_j,  q̂ = q/‖q‖, k̂ = k/‖k‖        per view t = 1, 2 (two full-width q, k; one v); no 1/√D
    τ_i  = β·sqrt(2·ln((i+1)/κ)/D)                0-based position i (ViT: one τ for all, (i+1) → N keys)
    a_ij = relu(s_ij - τ_i)^p for j <= i, else 0   the causal mask after the threshold
    o_i  = RMSNorm(Σ_j (a¹_ij - λ a²_ij) v_j)      per head, learnable weight
    ("Threshold Differential Attention: Sink-free, Ultra-sparse, and Non-dispersive Long-context Attention",
    arXiv 2601.12145; docs/rules.md#tda)

    The threshold grows like the largest spurious similarity among i+1 random keys, so only real matches survive:
    weights are exactly 0 elsewhere and nothing forces a row to sum to 1 (no sink). β = exp(log_beta) and
    λ = sigmoid(lambda_logit) are learned per layer; κ and p are fixed; rows with i+1 < κ get τ = 0. The RMSNorm's
    eps (tda_eps) bounds how much a row is amplified: an empty row gives exactly 0. tda_differential=False keeps
    view 1 only (TRA). Math path: queries in tiles of tda_chunk_weights // T, each recomputed in backward, so
    memory is linear in T. Flex path: one call, both views on the head axis, τ through the queries (derivation:
    docs/rules.md#tda). No attention-weight dropout on either path.
    """
    has_bidirectional_form, has_cache, has_flex = True, True, True
    projections = ('q1', 'k1', 'q2', 'k2', 'v')
    weights_note = "a1 - lam*a2: signed, rows not summing to 1, and the per-head RMSNorm after W v rescales each row"
    log_floor = 1e-12  # flex: log's argument is kept >= this, so s = τ exactly never gives 0·∞ = NaN in backward

    def __init__(self, config, layer_idx):
        if not config.tda_differential:
            self.projections = ('q1', 'k1', 'v')  # set before the frame sizes c_attn from it
        super().__init__(config, layer_idx)
        for key, ok, need in [('tda_beta', config.tda_beta > 0, '> 0'), ('tda_kappa', config.tda_kappa > 0, '> 0'),
                              ('tda_lambda', 0 < config.tda_lambda < 1, 'in (0, 1)'), ('tda_p', config.tda_p >= 1, '>= 1'),
                              ('tda_chunk_weights', config.tda_chunk_weights >= 1, '>= 1'),
                              ('tda_eps', config.tda_eps > 0, '> 0')]:
            if not ok:
                raise ValueError(f"{key} must be {need}, got {getattr(config, key)}")
        self.differential, self.kappa, self.p = config.tda_differential, config.tda_kappa, config.tda_p
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
        spurious = 2 * torch.log(n.to(self.log_beta.dtype) / self.kappa).clamp_min(0) / self.head_dim
        return self.log_beta.exp() * spurious.sqrt()

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

    def attend(self, *tensors):  # q1, k1, q2, k2, v (single view: q1, k1, v), (B, H, T, D) each
        *qk, v = tensors
        qk, T = [F.normalize(t, dim=-1) for t in qk], v.size(2)
        tau = self.threshold(T, v.device)
        tile_output = lambda start, end, n_keys: self.tile_weights(qk, tau, start, end, n_keys) @ v[:, :, :n_keys]
        rows = max(1, self.chunk_weights // T)  # queries per tile
        y = torch.cat([recompute_in_backward(tile_output, *tile) for tile in query_tiles(T, rows, self.causal)], 2)
        return self.head_norm(y)  # (B, H, T, D)

    def attend_flex(self, *tensors, masks=None):
        # exp(score_mod) = relu(q̃·k̂ - t_i)^p with q̃ = q̂/d_i, so Σ_j a_ij v_j = d_i^p · y_i · exp(lse_i), y flex's
        # output (d_i = τ_i, or 1 where τ_i = 0; t_i = [τ_i > 0]): nothing captured needs a gradient. λ after flex.
        *qk, v = tensors
        B, H, T, D = v.shape
        views, p, floor = len(qk) // 2, self.p, self.log_floor
        tau = self.threshold(T, v.device)                                        # (T,)
        passed = tau > 0
        d, t = torch.where(passed, tau, torch.ones_like(tau)), passed.to(v.dtype)  # (T,) each; t needs no gradient
        q = torch.cat([F.normalize(x, dim=-1) for x in qk[0::2]], 1) / d.to(v.dtype)[:, None]  # (B, views·H, T, D)
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
        *qk, v = tensors
        cache.append(*[F.normalize(k, dim=-1) for k in qk[1::2]], v)

    def decode(self, *tensors, cache):  # q1, k1, q2, k2, v of one token, (B, H, 1, D) each
        *qk, v = tensors
        tau = self.threshold(1, v.device, start=cache.pos)  # τ at the new token's absolute position
        cache.append(*[F.normalize(k, dim=-1) for k in qk[1::2]], v)
        *keys, values = cache.tensors()                      # (B, H, pos, D) each: every key is visible
        queries = [F.normalize(q, dim=-1) for q in qk[0::2]]
        return self.head_norm(self.weights([x for pair in zip(queries, keys) for x in pair], tau) @ values)

    def attention_weights(self, *tensors):
        """For analysis: the whole (B, H, T, T) matrix a¹ - λa² from what project returns (short T only): the weights
        before the RMSNorm, which is not linear in v (so the frame's identity-basis weights do not apply)."""
        *qk, v = tensors
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
        if config.cluster_sharpness <= 0 or config.cluster_seed_lr <= 0:
            raise ValueError(f"cluster_sharpness and cluster_seed_lr must be > 0, got {config.cluster_sharpness}, "
                             f"{config.cluster_seed_lr}")
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

# [topk]


# [longformer]


# [routing]


# [linear]


# [gated]


# -----------------------------------------------------------------------------
# entmax

@dataclass
class EntmaxConfig:
    entmax_alpha: float = 1.5    # entmax: α > 1 (1.5: exact, by sort; 2: sparsemax; others: bisection); α = 1: softmax
    entmax_iters: int = 50       # entmax: bisection steps where α != 1.5 (the entmax package's n_iter)
    entmax_chunk_weights: int = 2**18  # entmax math path: weights per head one query tile may hold (that // T queries)


class EntmaxAttention(Attention):
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
    dtype; backward is entmax's Jacobian (EntmaxFunction). Math path: query tiles of entmax_chunk_weights // T rows,
    each recomputed in backward, so memory is linear in T; the cache holds every key (decode: entmax over them). No
    flex path (the weights are not exp of a score) and no fused one.
    """
    has_bidirectional_form, has_cache = True, True

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

    def attend(self, q, k, v):
        return attend_in_query_tiles(self.weights, q, k, v, self.causal, self.chunk_weights)

    def new_cache(self):  # every key and value: grows with the context
        return KVCache()

    def fill(self, cache, q, k, v):
        cache.append(k, v)

    def decode(self, q, k, v, cache):  # (B, H, 1, D): every cached key is visible
        cache.append(k, v)
        keys, values = cache.tensors()
        return self.weights(q, keys).to(v.dtype) @ values


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


def attend_in_query_tiles(weights, q, k, v, causal, chunk_weights):
    """y = W v for a rule whose rows need all their keys at once (entmax, ReLA): W's rows from
    weights(q_tile, k_seen, visible) (B, H, C, L), visible (C, L) the causal mask or None, queries in tiles of
    chunk_weights // T rows, each recomputed in backward: memory linear in T, never T×T."""
    T = q.size(2)

    def tile_output(start, end, n_keys):  # queries start..end-1 against keys 0..n_keys-1
        visible = causal_mask(None, None, torch.arange(start, end, device=q.device)[:, None],
                              torch.arange(n_keys, device=q.device)) if causal else None
        return weights(q[:, :, start:end], k[:, :, :n_keys], visible).to(v.dtype) @ v[:, :, :n_keys]

    rows = max(1, chunk_weights // T)  # queries per tile
    return torch.cat([recompute_in_backward(tile_output, *tile) for tile in query_tiles(T, rows, causal)], 2)


# -----------------------------------------------------------------------------
# ReLA

@dataclass
class ReLAConfig:
    rela_eps: float = 1e-8       # ReLA: ε of the gated RMSNorm over the merged heads (the official code's: 1e-8)
    rela_chunk_weights: int = 2**18  # ReLA math path: weights per head one query tile may hold (that // T queries)


class ReLAAttention(Attention):
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
    in float32 at least. Math path: query tiles of rela_chunk_weights // T rows, each recomputed in backward, so
    memory is linear in T; the cache holds every key (decode: relu over them). No flex path, no fused one.
    """
    has_bidirectional_form, has_cache = True, True
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

    def attend(self, q, k, v):
        return attend_in_query_tiles(self.weights, q, k, v, self.causal, self.chunk_weights)

    def out(self, y):  # the gated RMSNorm between the merge and c_proj
        return self.resid_dropout(self.c_proj(self.gated_rms_norm(merge_heads(y))))

    def gated_rms_norm(self, z):  # (B, T, C): g ⊙ z/√(mean z² + ε) ⊙ σ(w ⊙ z); z = 0 gives exactly 0
        x = z.to(torch.promote_types(z.dtype, torch.float32))
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.norm_scale * normed * torch.sigmoid(self.norm_gate * x)).to(z.dtype)

    def new_cache(self):  # every key and value: grows with the context
        return KVCache()

    def fill(self, cache, q, k, v):
        cache.append(k, v)

    def decode(self, q, k, v, cache):  # (B, H, 1, D): every cached key is visible
        cache.append(k, v)
        keys, values = cache.tensors()
        return self.weights(q, keys) @ values


# [diff]


# [ssmax]


# [dex]


# [lsa]


# -----------------------------------------------------------------------------
# the table of rules: `attention=<name>` in a config picks the class

ATTENTION = {
    'softmax': SoftmaxAttention,
    'krause': KrauseAttention,
    'attentionx': AttentionX,
    'tda': ThresholdDifferentialAttention,
    'cluster': ClusterAttention,
    # the baselines
    'entmax': EntmaxAttention,
    'rela': ReLAAttention,
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
    both per-head outputs side by side, (B, H, T, 2D); out projects each through its branch and gates them.
    """
    has_cache, has_flex, fused = True, True, True  # has_*: where the rule's branch has them too (set below)
    projections = None  # each branch brings its own

    def __init__(self, config, layer_idx):
        if not config.causal:
            raise ValueError("mix is the language-model form (causal=True); use mix=False in a ViT")
        super().__init__(config, layer_idx)
        self.softmax = SoftmaxAttention(config, layer_idx)
        self.rule = ATTENTION[config.attention](config, layer_idx)
        self.has_cache, self.has_flex = self.rule.has_cache, self.rule.has_flex
        self.gate = nn.Linear(2 * config.n_embd, 2)
        if self.rule.weights_note:  # analyze.py: the mix is then no distribution either
            self.weights_note = self.rule.weights_note
        if self.rule.first_token_note:  # nor is token 0's share of it meaningful
            self.first_token_note = self.rule.first_token_note

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
    rope_base: float = 10000.0   # RoPE: the base θ of the frequencies θ^(-2i/D)
    rope_scaling: str = 'none'   # RoPE past the trained context: 'none', 'linear' (positions / s), 'ntk' (θ·s^(D/(D-2)))
    rope_factor: float = 1.0     # RoPE scaling's s: the longer context / the trained one


@dataclass
class AttentionConfig(ReLAConfig, EntmaxConfig, ClusterConfig, TDAConfig, AttentionXConfig, KrauseConfig, SoftmaxConfig,
                      FrameConfig):
    """Every key an attention layer reads: the frame's, then each rule's (dataclass fields come base class last
    first, so FrameConfig's lead). GPTConfig and ViTConfig extend it; every field is a config key of train.py."""
