"""
Every attention rule in one file, side by side.

Each rule is an nn.Module built as `build_attention(config, layer_idx)` and called as `y = attn(x)`, x of shape
(B, T, C). Inside, the same three steps in the same words (the frame, `Attention`, below):

    tensors = self.project(x)     # per-head tensors, (B, H, T, D) each: q, k, v unless the rule asks for others
    y = self.attend(*tensors)     # the interaction rule: the only part that differs between rules
    return self.out(y)            # merge heads, output projection, dropout

`attend` is the math path (plain PyTorch, any device). `attend_flex` computes the same function with
torch.nn.attention.flex_attention and is used when `config.flex` is set and x is on CUDA.

Reading order: the config, the frame, then one rule after another (softmax first: the one to copy), the table
of rules, and last the machinery the rules share (heads, RoPE, masks, BlockMasks, the banded layout).
"""
import math
import warnings
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention
from torch.utils.checkpoint import checkpoint


@dataclass
class AttentionConfig:
    """What an attention layer needs to know. GPTConfig and ViTConfig extend it; every field is a config key."""
    n_embd: int = 768
    n_head: int = 12
    block_size: int = 1024       # longest sequence (GPT context; ViT: 1 + number of patches)
    dropout: float = 0.0
    bias: bool = True            # bias in Linears and LayerNorms
    attention: str = 'softmax'   # a key of ATTENTION
    flex: bool = False           # use the flex_attention path on CUDA
    causal: bool = True          # GPT: True; ViT: False
    grid_size: int = 0           # ViT: side of the patch grid (tokens = 1 CLS + grid_size²); 0 for sequences
    pos_emb: str = 'learned'     # 'learned' (added to the input), 'rope' (rotates q and k in every layer) or 'none'
    rope_base: float = 10000.0
    window: int = 0              # softmax: sliding window of W keys (i-W < j <= i); 0 = full context
    n_layer: int = 12            # depth (the ViT's Krause top-k grows over it)
    krause_window: int = 32      # Krause 1-D: W keys per query (i-W < j <= i)
    krause_topk: int = 16        # Krause: keys kept per row (ViT: first layer's k, growing to 2k)
    krause_sigma: float = 2.5    # Krause: initial RBF bandwidth σ (learned per head as log_sigma)
    krause_radius: int = 1       # Krause 2-D: patches within this distance of a patch are its neighbours
    krause_metric: str = 'manhattan'  # Krause 2-D: 'manhattan' (official CIFAR) or 'chebyshev' (official ImageNet)
    krause_mix: bool = False     # Krause GPT: the paper's LM form, a softmax branch and a Krause branch, gated
    attnx_gamma: float = 1.0     # AttentionX: y = v - γ·softmax(qkᵀ/√D)v; paper: 3 (GPT), 1 (ViT, diagonal masked)
    attnx_learnable_gamma: bool = False  # AttentionX: γ a learned parameter per head, initialised at attnx_gamma
    attnx_mask_diagonal: bool = False    # AttentionX: no token attends to itself (paper's ViT); needs causal=False
    tda_beta: float = 1.0        # TDA: initial threshold scale β > 0 (learned per layer, as log β)
    tda_lambda: float = 0.5      # TDA: initial inhibition λ in (0, 1) of the second view (learned, as its logit)
    tda_kappa: float = 1.0       # TDA: κ > 0, fixed; the threshold's position offset (κ = 1: τ_0 = 0)
    tda_p: float = 2.0           # TDA: power p >= 1 of the rectified excess relu(s - τ)^p, fixed
    tda_differential: bool = True  # TDA: two views, a¹ - λa²; False: one view (the paper's TRA ablation)
    tda_chunk: int = 2**18       # TDA math path: weights per head a query chunk may hold (tda_chunk // T queries)
    tda_eps: float = 1e-4        # TDA: eps of the per-head RMSNorm; a row is amplified at most 1/sqrt(eps) times
    cluster_m: int = 16          # cluster: seeds (clusters) per head
    cluster_block: int = 64      # cluster GPT: tokens per block; exact within it, cluster summaries of earlier blocks
    cluster_iters: int = 0       # cluster ViT: soft k-means refinements of the seeds on each sequence (0 = none)
    cluster_self: bool = False   # cluster ViT: each query also attends exactly to its own key
    cluster_sharpness: float = 10.0  # cluster: initial sharpness s of the assignment (learned per head, log_sharpness)
    cluster_seed_lr: float = 10.0    # cluster: the seeds' learning rate, as a multiple of learning_rate


# -----------------------------------------------------------------------------
# the frame

class Attention(nn.Module):
    """
    The frame every rule shares: forward(x) = out(attend(*project(x))).

      project(x)   c_attn maps x to one n_embd-wide tensor per name in `projections`, each split into heads
                   (B, H, T, D); RoPE rotates those whose name starts with q or k. Default: ('q', 'k', 'v').
      attend(...)  the rule, math path: takes exactly what project returns, gives (B, H, T, D).
      attend_flex  the same function with flex_attention (optional; used when config.flex and x is on CUDA).
      out(y)       merge heads, c_proj, residual dropout.

    What the rest of the code assumes of a rule (its contracts):
      - `c_proj` is the output projection: GPT's init_weights gives every Linear named c_proj GPT-2's residual
        init N(0, 0.02/√(2·n_layer)); every other Linear and Embedding gets N(0, 0.02), biases 0.
      - `init_extra()` runs after the model's own init, on every Attention: give a rule's Linears another init
        there (a plain nn.Parameter keeps the value set in __init__; the model's init touches only Linears and
        Embeddings).
      - AdamW decays every parameter with two or more dimensions; name a rule's parameters in `no_decay` (a tuple
        of attribute names) to exempt them (seeds, per-head tables).
      - `lr_scale` ({attribute name: factor}) gives a parameter its own learning rate, factor × the schedule's:
        configure_adamw puts it in a param group with `lr_scale`, and train.py sets each group's lr to lr × that.
      - `stats` (None, or {name: tensor}) is what a rule reports about itself, set in eval mode (cluster usage);
        train.py prints it per layer at every evaluation.
      - A bad setting raises ValueError in __init__, naming the key; train.py checks it before any work starts.
      - `attention_weights(*tensors)` (analysis, analyze.py) gives the (B, H, T, T) weights W with y = W v, found
        for any rule linear in v by running `attend` on the identity basis; a rule that is not y = W v overrides
        it. `weights_note` says why W is not a distribution (None: rows >= 0 summing to 1), `first_token_note` why
        the share of token 0 means nothing for the rule (None: it does).
      - A rule's cache (generation, GPT.generate): `new_cache()` gives the state one layer keeps between tokens
        (a KVCache, or the rule's own object with `pos` and `nbytes()`); `fill(cache, *tensors)` stores a prompt's
        projected tensors after `attend` has computed the prompt as in training; `decode(*tensors, cache=cache)`
        takes one new token's tensors (B, H, 1, D), adds it to the cache and returns its output (B, H, 1, D),
        equal to what `attend` gives the last position of the whole sequence. The frame rotates q and k at the
        absolute position `cache.pos`. tests/test_generate.py checks every rule in ATTENTION against the forward.
    """
    projections = ('q', 'k', 'v')  # what project returns, in order; None: the rule brings its own projections
    no_decay = ()                  # names of this module's parameters that AdamW must not decay
    lr_scale = {}                  # {name of a parameter: its learning rate / the schedule's}; never mutated
    stats = None                   # {name: tensor} a rule reports in eval mode; train.py logs it
    weights_note = None            # analysis: why attention_weights is not a distribution; None if it is
    first_token_note = None        # analysis: why token 0's share of the weights has no meaning; None if it has

    def __init__(self, config, layer_idx):
        super().__init__()
        if config.n_head < 1 or config.n_embd % config.n_head:
            raise ValueError(f"n_embd={config.n_embd} must be a multiple of n_head={config.n_head}; pass e.g. "
                             f"--n_embd={max(1, config.n_head) * max(1, config.n_embd // max(1, config.n_head))}")
        self.n_head, self.head_dim = config.n_head, config.n_embd // config.n_head
        self.causal, self.flex, self.dropout = config.causal, config.flex, config.dropout
        if self.projections is None:
            return
        self.c_attn = nn.Linear(config.n_embd, len(self.projections) * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.rope = Rotary(self.head_dim, config.block_size, config.rope_base) if config.pos_emb == 'rope' else None

    def project(self, x, offset=0):  # offset: the absolute position of x's first token (generation)
        tensors = [split_heads(t, self.n_head) for t in self.c_attn(x).chunk(len(self.projections), dim=2)]
        if self.rope is not None:  # positions enter through the queries and keys only
            tensors = [self.rope(t, offset) if name[0] in 'qk' else t for name, t in zip(self.projections, tensors)]
        return tuple(tensors)  # (B, H, T, D) each

    def out(self, y):
        return self.resid_dropout(self.c_proj(merge_heads(y)))

    def forward(self, x, cache=None):
        tensors = self.project(x, 0 if cache is None else cache.pos)
        if cache is not None and cache.pos:  # generation: one new token against what the cache holds
            if x.size(1) != 1:
                raise ValueError(f"a filled cache takes one token at a time, got {x.size(1)}; prefill a new cache")
            return self.out(self.decode(*tensors, cache=cache))
        y = self.attend_flex(*tensors) if (self.flex and x.is_cuda) else self.attend(*tensors)
        if cache is not None:  # prefill: the prompt computed as in training, then its state into the cache
            self.fill(cache, *tensors)
        return self.out(y)

    def attend(self, q, k, v):
        raise NotImplementedError

    def new_cache(self):
        raise NotImplementedError(f"{type(self).__name__} has no cache; generate with use_cache=False")

    def attend_flex(self, q, k, v):
        raise NotImplementedError(f"{type(self).__name__} has no flex path; set flex=False")

    def init_extra(self):
        pass

    @torch.no_grad()
    def attention_weights(self, *tensors):
        """For analysis (short T, eval mode): the (B, H, T, T) effective weights W of y = attend(...) = W v, from
        what project returns, for every rule linear in v (its last tensor): attend is run with v = the identity
        basis, D columns of it at a time (rules may rely on v being D wide), so column j of the output is W[:, j]."""
        if self.projections is None or [name[0] for name in self.projections].count('v') != 1:
            raise NotImplementedError(f"{type(self).__name__} is not y = W v with one v; it has no single weight matrix")
        *rest, v = tensors
        (B, H, T, D), columns = v.shape, []
        eye = torch.eye(T, dtype=v.dtype, device=v.device).expand(B, H, T, T)
        for start in range(0, T, D):
            basis = F.pad(eye[..., start:start + D], (0, max(0, start + D - T)))  # (B, H, T, D), zero-padded
            columns.append(self.attend(*rest, basis)[..., :min(D, T - start)])
        return torch.cat(columns, -1)


# -----------------------------------------------------------------------------
# the rules

class SoftmaxAttention(Attention):
    """
    y = softmax(q kᵀ / √D + mask) v        (Vaswani et al. 2017, eq. 1)

    Causal for GPT, full for ViT. With `window` W, key j is visible to query i iff i - W < j <= i
    (sliding-window attention, the "window" baseline of the Krause paper), computed on the band.
    The math path is F.scaled_dot_product_attention (flash kernels on GPU).
    """

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        if config.window < 0:
            raise ValueError(f"window must be >= 0 (0 = full context), got {config.window}")
        if config.window and not config.causal:
            raise ValueError("window (a causal sliding window) needs causal=True; use window=0 for a ViT")
        self.window = config.window

    def attend(self, q, k, v):
        T = q.size(2)
        dropout_p = self.dropout if self.training else 0.0
        if not self.window or self.window >= T:  # the window covers everything: plain causal/full attention
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=self.causal)
        W, chunk, lookback = band_layout(self.window, T)
        y = F.scaled_dot_product_attention(band_queries(q, chunk), band_keys(k, chunk, lookback),
                                           band_keys(v, chunk, lookback),
                                           attn_mask=band_mask(T, chunk, lookback, W, q.device), dropout_p=dropout_p)
        return unband(y, T)

    def attend_flex(self, q, k, v):
        # flex has no attention-weight dropout; the residual dropout in `out` still applies
        mask_mod = sliding_window_mask(self.window) if self.window else causal_mask if self.causal else None
        return run_flex(q, k, v, block_mask=block_mask(mask_mod, q.size(2), q.device))

    def new_cache(self):  # every key and value (grows with the context), or a ring of the last `window` (constant)
        return KVCache(self.window or None)

    def fill(self, cache, q, k, v):
        cache.append(k, v)

    def decode(self, q, k, v, cache):  # (B, H, 1, D): the cache holds exactly the keys the new query sees, no mask
        cache.append(k, v)
        return decode_sdpa(q, *cache.tensors())


class KrauseAttention(Attention):
    """
    score_ij = -||q_i - k_j||² / (2 σ_h²)  for j in N_i, then only the top k of each row survive
    y_i = Σ_j softmax_j(score_i) v_j       (Krause attention, seed 000 eq. 3; SPEC §1)

    Bounded confidence: a token listens only to its neighbours N_i, and among them only to the k closest.
    σ_h is learned per head (log_sigma). N_i is a causal window i - W < j <= i for the GPT, and for the ViT the
    patches within `krause_radius` on the grid (+ CLS, which sees and is seen by all); the ViT's k grows over
    depth from k to 2k. -||q_i||²/(2σ²) is the same for a whole row, so it changes neither the top k nor the
    softmax and is dropped: score_ij = q_i·k_j/σ² - ||k_j||²/(2σ²). The 1-D math path works on the band
    (O(T·W) time and memory); the official code builds the dense T×T matrix, kept here as `attend_dense`.
    With krause_mix=True build_attention makes the paper's LM form instead (KrauseMixAttention, below).
    """

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        if config.krause_sigma <= 0:
            raise ValueError(f"krause_sigma must be > 0, got {config.krause_sigma}")
        self.log_sigma = nn.Parameter(torch.full((self.n_head,), math.log(config.krause_sigma)))
        if config.causal:
            W, k = config.krause_window, config.krause_topk
            if W < 1:
                raise ValueError(f"krause_window must be >= 1, got {W}")
            if not 1 <= k <= W:
                raise ValueError(f"krause_topk must be in [1, krause_window={W}], got {k}")
            self.window, self.topk, self.grid = W, k, None
            return
        grid_size = config.grid_size
        if grid_size < 1 or config.block_size != 1 + grid_size * grid_size:
            raise ValueError(f"non-causal Krause needs a square patch grid: grid_size={grid_size} with block_size = "
                             f"1 + grid_size² tokens (got block_size={config.block_size}); use it in a ViT")
        if config.krause_metric not in ('manhattan', 'chebyshev'):
            raise ValueError(f"krause_metric must be 'manhattan' or 'chebyshev', got '{config.krause_metric}'")
        if config.krause_radius < 0 or config.krause_topk < 1:
            raise ValueError(f"krause_radius must be >= 0 and krause_topk >= 1, got {config.krause_radius}, "
                             f"{config.krause_topk}")
        self.topk = krause_topk_schedule(config.krause_topk, config.n_layer)[layer_idx]
        self.grid = (grid_size, config.krause_radius, config.krause_metric)
        self.register_buffer('neighbourhood', grid_neighbourhood(*self.grid), persistent=False)  # (N, N)

    def rbf_terms(self, q, k):
        """q/σ² and the per-key bias -||k||²/(2σ²), so that score = (q/σ²)·k + bias: (B, H, T, D), (B, H, T)."""
        inv_var = torch.exp(-2 * self.log_sigma).view(1, -1, 1, 1)  # 1/σ² per head
        return q * inv_var, -0.5 * (k * k).sum(-1) * inv_var[..., 0]

    def topk_softmax(self, scores, mask, reachable=None):
        """Attention weights and per-row thresholds (..., 1) from fresh RBF scores and the neighbourhood mask:
        the top k of each row (chosen among `reachable(scores)`, a view of the slots a row can reach, if given),
        softmax, dropout. Out-of-place fills: as fast and as small here as in-place ones under no_grad, which
        torch.compile's inductor fails on (KeyError 'buf1', torch 2.13). The threshold itself carries no gradient:
        it sits halfway between a row's k-th and (k+1)-th score (topk_boundary), so flex, which rounds the scores
        its own way, keeps the same keys."""
        scores = scores.masked_fill(~mask, float('-inf'))
        threshold = topk_boundary(scores if reachable is None else reachable(scores), self.topk)
        scores = scores.masked_fill(scores < threshold, float('-inf'))
        return F.dropout(scores.softmax(-1), self.dropout, self.training), threshold

    def band_weights(self, q, k):
        """1-D: weights on the band (B, H, n, chunk, chunk+lookback) and thresholds (B, H, T); no T×T tensor."""
        T = q.size(2)
        W, chunk, lookback = band_layout(self.window, T)
        q_scaled, key_bias = self.rbf_terms(q, k)
        scores = band_queries(q_scaled, chunk) @ band_keys(k, chunk, lookback).transpose(-1, -2)
        scores = scores + band_keys(key_bias.unsqueeze(-1), chunk, lookback).transpose(-1, -2)  # each slot's bias
        weights, threshold = self.topk_softmax(scores, band_mask(T, chunk, lookback, W, q.device),
                                               lambda s: band_strip(s, W))
        return weights, unband(threshold, T)[..., 0]

    def dense_weights(self, q, k):
        """Every (i, j) pair: (B, H, T, T) weights and (B, H, T) thresholds. The ViT's path (65 tokens)."""
        T = q.size(2)
        q_scaled, key_bias = self.rbf_terms(q, k)
        scores = q_scaled @ k.transpose(-1, -2) + key_bias.unsqueeze(-2)  # (B, H, T, T)
        if self.grid:
            mask = self.neighbourhood[:T, :T]
        else:
            position = torch.arange(T, device=q.device)
            mask = in_causal_window(position.view(-1, 1), position, self.window)
        weights, threshold = self.topk_softmax(scores, mask)
        return weights, threshold[..., 0]

    def attend(self, q, k, v):
        if self.grid:
            return self.dense_weights(q, k)[0] @ v
        T = q.size(2)
        W, chunk, lookback = band_layout(self.window, T)
        weights, _ = self.band_weights(q, k)
        return unband(weights @ band_keys(v, chunk, lookback), T)  # (B, H, T, D)

    def attend_dense(self, q, k, v):
        """The same function through a dense T×T matrix, as the official code computes it (bench.py's reference)."""
        return self.dense_weights(q, k)[0] @ v

    def attend_flex(self, q, k, v):
        # flex computes exp((q/σ²)·k + bias_j) under the neighbourhood BlockMask; the top k enter as a per-row
        # threshold found by a pre-pass on the band (no gradient), halfway between the k-th and (k+1)-th score, so
        # flex's own rounding of a score does not move it across. No dropout on the weights, as for softmax.
        T = q.size(2)
        with torch.no_grad():
            threshold = (self.dense_weights if self.grid else self.band_weights)(q, k)[1]  # (B, H, T)
        q_scaled, key_bias = self.rbf_terms(q, k)

        def krause_score(score, b, h, q_idx, kv_idx):
            score = score + key_bias[b, h, kv_idx]
            return torch.where(score >= threshold[b, h, q_idx], score, float('-inf'))

        mask_mod = grid_mask(*self.grid, q.device) if self.grid else sliding_window_mask(self.window)
        return run_flex(q_scaled, k, v, score_mod=krause_score, block_mask=block_mask(mask_mod, T, q.device), scale=1.0)

    def new_cache(self):  # a ring of the last krause_window keys and values: constant memory for ever
        if self.grid:
            raise ValueError("the 2-D (ViT) Krause form does not generate; a cache is for the causal GPT form")
        return KVCache(self.window)

    def fill(self, cache, q, k, v):
        cache.append(k, v)

    def decode(self, q, k, v, cache):  # (B, H, 1, D): the top k of the (up to W) keys the ring holds
        cache.append(k, v)
        keys, values = cache.tensors()                                             # (B, H, n <= W, D)
        q_scaled, key_bias = self.rbf_terms(q, keys)
        scores = q_scaled @ keys.transpose(-1, -2) + key_bias.unsqueeze(-2)         # (B, H, 1, n)
        weights, _ = self.topk_softmax(scores, torch.ones((), dtype=torch.bool, device=q.device))
        return weights @ values


def krause_topk_schedule(topk, n_layer):
    """ViT top-k over depth, k at the first layer to 2k at the last: round(linspace(k, 2k, n_layer))."""
    return [round(x) for x in torch.linspace(topk, 2 * topk, n_layer, dtype=torch.float64).tolist()]


class KrauseMixAttention(Attention):
    """
    y = g_0 · y_softmax + g_1 · y_krause,   g = softmax(Linear(2C → 2)([y_softmax, y_krause]))   per token

    The Krause paper's language-model form (SPEC §1): a causal softmax branch and a Krause branch, each with its
    own q/k/v/out projections, mixed by a learned gate that starts at 0.8 for the softmax branch. In the frame:
    project gives both branches' q, k, v; attend gives both per-head outputs side by side, (B, H, T, 2D); out
    projects each through its branch and gates them.
    """
    projections = None  # each branch brings its own

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        if not config.causal:
            raise ValueError("krause_mix is the language-model form (causal=True); use krause_mix=False in a ViT")
        self.softmax = SoftmaxAttention(config, layer_idx)
        self.krause = KrauseAttention(config, layer_idx)
        self.gate = nn.Linear(2 * config.n_embd, 2)

    def init_extra(self):
        nn.init.normal_(self.gate.weight, std=0.01)
        with torch.no_grad():
            self.gate.bias.copy_(torch.tensor([math.log(0.8 / 0.2), 0.0]))  # softmax(bias) = (0.8, 0.2)

    def project(self, x, offset=0):
        return self.softmax.project(x, offset) + self.krause.project(x, offset)  # softmax's q, k, v, then Krause's

    def attend(self, q, k, v, q_krause, k_krause, v_krause):
        return torch.cat([self.softmax.attend(q, k, v), self.krause.attend(q_krause, k_krause, v_krause)], -1)

    def attend_flex(self, q, k, v, q_krause, k_krause, v_krause):
        return torch.cat([self.softmax.attend_flex(q, k, v),
                          self.krause.attend_flex(q_krause, k_krause, v_krause)], -1)

    def new_cache(self):  # the softmax branch's (every key unless `window`: grows) beside Krause's ring
        return CacheGroup(self.softmax.new_cache(), self.krause.new_cache())

    def fill(self, cache, *tensors):
        self.softmax.fill(cache.caches[0], *tensors[:3])
        self.krause.fill(cache.caches[1], *tensors[3:])

    def decode(self, q, k, v, q_krause, k_krause, v_krause, cache):
        return torch.cat([self.softmax.decode(q, k, v, cache.caches[0]),
                          self.krause.decode(q_krause, k_krause, v_krause, cache.caches[1])], -1)

    def out(self, y):  # (B, H, T, 2D): the two branches' heads side by side
        y_softmax, y_krause = self.softmax.out(y[..., :self.head_dim]), self.krause.out(y[..., self.head_dim:])
        g = self.gate(torch.cat([y_softmax, y_krause], dim=-1)).softmax(-1)  # (B, T, 2)
        return g[..., :1] * y_softmax + g[..., 1:] * y_krause


class AttentionX(SoftmaxAttention):
    """
    y = v - γ · softmax(q kᵀ / √D + mask) v      per head, then heads merged and c_proj as usual
                                                  (AttentionX, seed 004 eq. 12-13, arXiv 2409.04275; SPEC §3)

    The "consensus discrepancy" between a token's own value and what it gathers from the others. With A the
    attention matrix, y = (I - γA)V: at γ = 1 it is (I - A)V, a high-pass filter on the attention graph (I - A is
    the graph's random-walk Laplacian), the opposite of the smoothing AV that, stacked over layers, drives rank
    collapse. The paper keeps γ >= 1: γ = 3 for its causal nanoGPT (the diagonal of A kept), γ = 1 for its ViT
    with the diagonal masked (`attnx_mask_diagonal`: a token attends only to the others). γ = 0 is y = v (no
    mixing); a negative γ adds the smoothed AV to v, a low-pass filter. γ is fixed, or learned per head
    (`attnx_learnable_gamma`). The attention is SoftmaxAttention's (SDPA, is_causal=True on a GPT: flash on GPU;
    the sliding `window` too); the masked diagonal is a boolean SDPA mask (no flash), `off_diagonal_mask` on flex.
    """

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        if not math.isfinite(config.attnx_gamma):
            raise ValueError(f"attnx_gamma must be a finite number, got {config.attnx_gamma}")
        if config.attnx_mask_diagonal and config.causal:
            raise ValueError("attnx_mask_diagonal=True needs causal=False: with causal attention the first token "
                             "would see no key at all; use it in a ViT, or keep the diagonal in a GPT")
        self.mask_diagonal = config.attnx_mask_diagonal
        gamma = torch.full((self.n_head,), float(config.attnx_gamma))
        if config.attnx_learnable_gamma:
            self.gamma = nn.Parameter(gamma)  # 1-D, so AdamW does not decay it
        else:
            self.register_buffer('gamma', gamma, persistent=False)
        if self.mask_diagonal:
            self.register_buffer('off_diagonal', ~torch.eye(config.block_size, dtype=torch.bool), persistent=False)

    def discrepancy(self, v, y):
        # v - γ_h·y in one op (no γ·y temporary: one (B, H, T, D) tensor less at the peak); γ in the activations'
        # dtype, so bf16 stays bf16 under autocast
        return torch.addcmul(v, self.gamma.to(v.dtype).view(1, -1, 1, 1), y, value=-1.0)

    def attend(self, q, k, v):
        if not self.mask_diagonal:
            return self.discrepancy(v, super().attend(q, k, v))  # causal, full or windowed softmax, (B, H, T, D)
        T = q.size(2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=self.off_diagonal[:T, :T],
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.discrepancy(v, y)

    def attention_weights(self, *tensors):
        """A, the softmax weights, from the frame's effective weights I - γA of y = v - γ·A v (SPEC §5: report A)."""
        if not self.gamma.all():
            raise NotImplementedError("a head has γ = 0: y = v, A does not reach the output")
        effective = super().attention_weights(*tensors)
        eye = torch.eye(effective.size(-1), dtype=effective.dtype, device=effective.device)
        return (eye - effective) / self.gamma.to(effective.dtype).view(1, -1, 1, 1)

    def attend_flex(self, q, k, v):
        if not self.mask_diagonal:
            return self.discrepancy(v, super().attend_flex(q, k, v))
        return self.discrepancy(v, run_flex(q, k, v, block_mask=block_mask(off_diagonal_mask, q.size(2), q.device)))

    def decode(self, q, k, v, cache):  # softmax's cache (all keys, or the window's ring); the diagonal is kept
        return self.discrepancy(v, super().decode(q, k, v, cache))


class ThresholdDifferentialAttention(Attention):
    """
    s_ij = q̂_i·k̂_j,  q̂ = q/‖q‖, k̂ = k/‖k‖        per view t = 1, 2 (two full-width q, k; one v); no 1/√D
    τ_i  = β·sqrt(2·ln((i+1)/κ)/D)                0-based position i (ViT: one τ for all, (i+1) → N keys)
    a_ij = relu(s_ij - τ_i)^p for j <= i, else 0   the causal mask after the threshold
    o_i  = RMSNorm(Σ_j (a¹_ij - λ a²_ij) v_j)      per head, learnable weight
    (Threshold Differential Attention, seed 003 / arXiv 2601.12145; SPEC §2)

    The threshold grows like the largest spurious similarity among i+1 random keys, so only real matches survive:
    weights are exactly 0 elsewhere and nothing forces a row to sum to 1 (no sink). β = exp(log_beta) and
    λ = sigmoid(lambda_logit) are learned per layer; κ and p are fixed. With κ > 1 the rows i+1 < κ would take
    the root of a negative number: they get τ = 0. tda_differential=False keeps view 1 only (TRA).

    RMSNorm eps (tda_eps) = 1e-4: o = w·y/sqrt(mean(y²) + 1e-4). An empty row (y = 0) gives exactly 0; no row is
    amplified more than 1/sqrt(eps) = 100×, so a lone survivor passing τ by δ (v of unit RMS, p = 2) comes out
    at RMS 0.01 for δ = 0.01 and 0.71 for δ = 0.1, growing continuously from the empty row's 0 instead of
    jumping to unit size; rows with RMS(y) >= 0.03 are normalised to within 5% of unit RMS.

    Math path: queries in chunks of tda_chunk // T against the keys they can see, each chunk's weights recomputed
    in backward (recompute_in_backward), so forward and backward hold at most tda_chunk weights per head at a
    time whatever T, besides the O(T·D) inputs and outputs: never T×T. Flex path: exp(score_mod) = relu(s - τ)^p,
    and flex's softmax-normalised output times exp(lse) is Σ_j a_ij v_j.
    No attention-weight dropout on either path (flex has none); the residual dropout in `out` applies.
    """
    projections = ('q1', 'k1', 'q2', 'k2', 'v')
    weights_note = "a1 - lam*a2: signed, rows not summing to 1, and the per-head RMSNorm after W v rescales each row"
    log_floor = 1e-12  # flex: log's argument is kept >= this, so s = τ exactly never gives 0·∞ = NaN in backward

    def __init__(self, config, layer_idx):
        if not config.tda_differential:
            self.projections = ('q1', 'k1', 'v')  # set before the frame sizes c_attn from it
        super().__init__(config, layer_idx)
        for key, ok, need in [('tda_beta', config.tda_beta > 0, '> 0'), ('tda_kappa', config.tda_kappa > 0, '> 0'),
                              ('tda_lambda', 0 < config.tda_lambda < 1, 'in (0, 1)'),
                              ('tda_p', config.tda_p >= 1, '>= 1'), ('tda_chunk', config.tda_chunk >= 1, '>= 1'),
                              ('tda_eps', config.tda_eps > 0, '> 0')]:
            if not ok:
                raise ValueError(f"{key} must be {need}, got {getattr(config, key)}")
        self.differential, self.kappa, self.p, self.chunk = (config.tda_differential, config.tda_kappa,
                                                             config.tda_p, config.tda_chunk)
        self.log_beta = nn.Parameter(torch.tensor(math.log(config.tda_beta)))
        if self.differential:
            self.lambda_logit = nn.Parameter(torch.tensor(math.log(config.tda_lambda / (1 - config.tda_lambda))))
        self.head_norm = nn.RMSNorm(self.head_dim, eps=config.tda_eps)

    def threshold(self, T, device, start=0):
        """τ per query, (T,): τ_i on the 0-based position i = start..start+T-1; without causality one τ for all,
        from the T keys. Generation passes start = the absolute position of the new token (SPEC §2)."""
        n = torch.arange(start + 1, start + T + 1, device=device) if self.causal else torch.full((T,), T, device=device)
        spurious = 2 * torch.log(n.to(self.log_beta.dtype) / self.kappa).clamp_min(0) / self.head_dim
        return self.log_beta.exp() * spurious.sqrt()

    def view_weights(self, q, k, threshold):  # (B, H, C, D), (B, H, L, D), (C, L) -> (B, H, C, L)
        return (q @ k.transpose(-1, -2) - threshold).relu() ** self.p

    def weights(self, qk, tau, start, end, n_keys):
        """a¹ - λa² for queries start..end-1 and keys 0..n_keys-1, from normalised q1, k1(, q2, k2): (B, H, C, L)."""
        threshold = tau[start:end, None].expand(-1, n_keys)  # (C, L)
        if self.causal:  # the mask as an infinite threshold: relu(s - ∞) = 0 for j > i, whatever s is
            query, key = torch.arange(start, end, device=tau.device), torch.arange(n_keys, device=tau.device)
            threshold = threshold.masked_fill(key > query[:, None], float('inf'))
        a = self.view_weights(qk[0][:, :, start:end], qk[1][:, :, :n_keys], threshold)
        if self.differential:
            a = a - torch.sigmoid(self.lambda_logit) * self.view_weights(qk[2][:, :, start:end], qk[3][:, :, :n_keys],
                                                                          threshold)
        return a

    def attend(self, *tensors):  # q1, k1, q2, k2, v (single view: q1, k1, v), (B, H, T, D) each
        *qk, v = tensors
        qk, T = [F.normalize(t, dim=-1) for t in qk], v.size(2)
        tau = self.threshold(T, v.device)
        chunk_output = lambda start, end, n_keys: self.weights(qk, tau, start, end, n_keys) @ v[:, :, :n_keys]
        rows = max(1, self.chunk // T)  # queries per chunk
        y = torch.cat([recompute_in_backward(chunk_output, *c) for c in query_chunks(T, rows, self.causal)], 2)
        return self.head_norm(y)  # (B, H, T, D)

    def attend_flex(self, *tensors):
        *qk, v = tensors
        qk, T = [F.normalize(t, dim=-1) for t in qk], v.size(2)
        tau, p, floor = self.threshold(T, v.device), self.p, self.log_floor
        mask = block_mask(causal_mask if self.causal else None, T, v.device)

        # β reaches flex as the (T,) tensor τ indexed by q_idx, a learnable bias flex differentiates; a captured 0-dim
        # scalar is what has failed (pytorch#145208, attention-gym#171). λ is applied outside flex.
        def threshold_score(score, b, h, q_idx, kv_idx):  # log relu(s - τ_i)^p; -inf (weight 0) below τ
            excess = score - tau[q_idx]
            return torch.where(excess > 0, p * torch.log(excess.clamp_min(floor)), float('-inf'))

        def view(q, k):  # Σ_j a_ij v_j = (softmax-weighted mean) · Σ_j a_ij; a row with no survivors: 0 · 0
            y, aux = run_flex(q, k, v, score_mod=threshold_score, block_mask=mask, scale=1.0,
                              return_aux=AuxRequest(lse=True))
            return y * aux.lse.exp().unsqueeze(-1)
        y = view(qk[0], qk[1])
        if self.differential:
            y = y - torch.sigmoid(self.lambda_logit) * view(qk[2], qk[3])
        return self.head_norm(y.to(v.dtype))

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
        a = self.view_weights(queries[0], keys[0], tau)      # (B, H, 1, pos)
        if self.differential:
            a = a - torch.sigmoid(self.lambda_logit) * self.view_weights(queries[1], keys[1], tau)
        return self.head_norm(a @ values)

    def attention_weights(self, *tensors):
        """For analysis: the whole (B, H, T, T) matrix a¹ - λa² from what project returns (short T only): the weights
        before the RMSNorm, which is not linear in v (so the frame's identity-basis weights do not apply)."""
        *qk, v = tensors
        T = v.size(2)
        return self.weights([F.normalize(t, dim=-1) for t in qk], self.threshold(T, v.device), 0, T, T)
class ClusterAttention(Attention):
    """
    S_jc = softmax_c(s · cos(k_j, seed_c))                    soft assignment of key j to the head's m seeds
    N_c = Σ_j S_jc,  K̄_c = Σ_j S_jc k_j / N_c,  V̄_c = Σ_j S_jc v_j / N_c     cluster mass, mean key, mean value
    y_i = Σ_c softmax_c(q_i·K̄_c/√D + log N_c) V̄_c             (cluster attention, SPEC §4; seed 002's question 4)

    Attention to m cluster summaries in place of T keys: O(T·m·D), and differentiable through the soft assignment.
    The log-mass bias makes it exact when a cluster's keys coincide: N_c·exp(q·K̄_c/√D) = Σ_{j∈c} exp(q·k_j/√D).
    Seeds and sharpness s are learned per head; an empty cluster (N_c = 0) gets -inf.
      - ViT (causal=False): over the whole sequence, after `cluster_iters` soft spherical k-means refinements of
        the seeds on the current keys (seed_c ← Σ_j S_jc k_j/‖k_j‖); `cluster_self` adds the query's own key as
        one more exact entry of the softmax (its mass is then counted twice, once in its clusters).
      - GPT (causal=True), blockwise: blocks of L = `cluster_block` tokens; a query attends exactly (causally) to
        its own block and to the summaries of all strictly earlier blocks (exclusive cumulative sums of N, ΣSk,
        ΣSv), one joint softmax over [local keys ; clusters]. S_jc depends on token j alone and nothing is
        normalised along the sequence, so the past never depends on the future. O(T·(L + m)·D) time, memory
        linear in T; with L >= T it is exactly causal softmax. The sequence is zero-padded to whole blocks.
    Seeds: unit-norm (orthogonal where m <= D) at init. cos(k, seed) ignores a seed's norm, so the norm only sets
    its step size: weight decay would shrink it and speed the seed up without bound, so seeds are not decayed
    (`no_decay`), and their learning rate is `cluster_seed_lr` × the schedule's (`lr_scale`): Adam moves every
    entry by about lr per step, and a unit seed's entries (~1/√D) are several times the Linears' (~0.02).
    No flex path: the math path is already dense per-block matmuls, (L + m) keys per query, no T×T tensor.
    `stats` (eval mode): per head, the perplexity of the mean assignment (how many clusters are in use, 1..m) and
    the mean entropy of a key's assignment (0 = hard, log m = uniform).
    """
    no_decay = ('seeds',)
    first_token_note = "token 0 is folded into cluster summaries beyond its own block (GPT) or always (ViT)"

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        m, L, iters = config.cluster_m, config.cluster_block, config.cluster_iters
        if m < 1:
            raise ValueError(f"cluster_m must be >= 1, got {m}")
        if L < 1:
            raise ValueError(f"cluster_block must be >= 1, got {L}")
        if iters < 0:
            raise ValueError(f"cluster_iters must be >= 0, got {iters}")
        if config.causal and (iters or config.cluster_self):
            raise ValueError("cluster_iters and cluster_self are the bidirectional (ViT) form: refining the seeds on "
                             "the sequence would let the past depend on the future, and the causal form already "
                             "attends exactly to its own block; use cluster_iters=0, cluster_self=False")
        if config.cluster_sharpness <= 0 or config.cluster_seed_lr <= 0:
            raise ValueError(f"cluster_sharpness and cluster_seed_lr must be > 0, got {config.cluster_sharpness}, "
                             f"{config.cluster_seed_lr}")
        self.block, self.iters, self.self_term = L, iters, config.cluster_self
        seeds = torch.stack([nn.init.orthogonal_(torch.empty(m, self.head_dim)) for _ in range(self.n_head)])
        self.seeds = nn.Parameter(F.normalize(seeds, dim=-1))  # (H, m, D), unit rows, orthogonal per head if m <= D
        self.log_sharpness = nn.Parameter(torch.full((self.n_head,), math.log(config.cluster_sharpness)))
        self.lr_scale = {'seeds': config.cluster_seed_lr}

    def assign(self, k, seeds):
        """S: (B, H, T, m), each key's soft assignment to the seeds (H, m, D) or (B, H, m, D)."""
        seeds = F.normalize(seeds, dim=-1) * self.log_sharpness.exp().view(-1, 1, 1)  # s folded into the seeds
        S = (F.normalize(k, dim=-1) @ seeds.transpose(-1, -2)).softmax(-1)
        if not self.training and not torch.compiler.is_compiling():
            self.stats = cluster_usage(S)
        return S

    def attend(self, q, k, v):
        kv1 = torch.cat([k, v, torch.ones_like(k[..., :1])], -1)  # (B, H, T, 2D+1): S-weighted sums give ΣSk, ΣSv, N
        return (self.attend_blocks if self.causal else self.attend_all)(q / math.sqrt(q.size(-1)), k, v, kv1)

    def attend_all(self, q, k, v, kv1):  # bidirectional; q is already scaled by 1/√D
        S = self.assign(k, self.seeds)
        for _ in range(self.iters):  # soft spherical k-means on this sequence: seeds move to their keys' direction
            S = self.assign(k, S.transpose(-1, -2) @ F.normalize(k, dim=-1))  # seeds (B, H, m, D)
        mean_k, mean_v, log_mass = cluster_means(S.transpose(-1, -2) @ kv1, q.size(-1))  # (B, H, m, D), (B, H, m)
        scores = q @ mean_k.transpose(-1, -2) + log_mass.unsqueeze(-2)                    # (B, H, T, m)
        if not self.self_term:
            return F.dropout(scores.softmax(-1), self.dropout, self.training) @ mean_v
        scores = torch.cat([scores, (q * k).sum(-1, keepdim=True)], -1)                   # + the own key, exactly
        weights = F.dropout(scores.softmax(-1), self.dropout, self.training)
        return weights[..., :-1] @ mean_v + weights[..., -1:] * v

    def attend_blocks(self, q, k, v, kv1):  # causal, blockwise; q is already scaled by 1/√D
        (B, H, T, D), L = q.shape, min(self.block, q.size(2))
        qb, kvb, Sb = (band_queries(t, L) for t in (q, kv1, self.assign(k, self.seeds)))  # (B, H, n, L, ·)
        # what each block sees of the past: Σ S·[k, v, 1] over all strictly earlier blocks (block 0: nothing, N = 0)
        running = torch.promote_types(q.dtype, torch.float32)  # sums over many blocks: bf16 would drift
        sums = exclusive_cumsum((Sb.transpose(-1, -2) @ kvb).to(running), 2)              # (B, H, n, m, 2D+1)
        mean_k, mean_v, log_mass = (t.to(q.dtype) for t in cluster_means(sums, D))
        keys = torch.cat([kvb[..., :D], mean_k], -2)                                       # (B, H, n, L+m, D)
        values = torch.cat([kvb[..., D:2 * D], mean_v], -2)
        within = torch.zeros((), dtype=q.dtype, device=q.device).masked_fill(~band_mask(T, L, 0, L, q.device),
                                                                             float('-inf'))  # (n, L, L): causal
        bias = torch.cat([within.expand(B, H, -1, -1, -1), log_mass.unsqueeze(-2).expand(-1, -1, -1, L, -1)], -1)
        weights = F.dropout((qb @ keys.transpose(-1, -2) + bias).softmax(-1), self.dropout, self.training)
        return unband(weights @ values, T)  # (B, H, T, D)

    def new_cache(self):  # Σ S·[k, v, 1] of the finished blocks + the current block: O(m + block) for ever
        if not self.causal:
            raise ValueError("the bidirectional (ViT) cluster form does not generate; a cache is for the GPT form")
        return ClusterCache()

    def fill(self, cache, q, k, v):
        (B, H, T, D), L = k.shape, self.block
        kv1 = torch.cat([k, v, torch.ones_like(k[..., :1])], -1)                 # (B, H, T, 2D+1)
        n, running = T // L, torch.promote_types(k.dtype, torch.float32)
        Sb = self.assign(k[:, :, :n * L], self.seeds).view(B, H, n, L, self.seeds.size(1))  # (B, H, n, L, m); n may be 0
        cache.sums = (Sb.transpose(-1, -2) @ kv1[:, :, :n * L].view(B, H, n, L, 2 * D + 1)).to(running).sum(2)
        cache.current, cache.pos = kv1[:, :, n * L:], T                         # (B, H, T - n·L, 2D+1)

    def decode(self, q, k, v, cache):  # (B, H, 1, D): its own block exactly, the finished blocks as summaries
        D = q.size(-1)
        cache.current = torch.cat([cache.current, torch.cat([k, v, torch.ones_like(k[..., :1])], -1)], 2)
        mean_k, mean_v, log_mass = (t.to(q.dtype) for t in cluster_means(cache.sums, D))  # (B, H, m, ·)
        keys = torch.cat([cache.current[..., :D], mean_k], 2)                              # (B, H, n + m, D)
        values = torch.cat([cache.current[..., D:2 * D], mean_v], 2)
        bias = torch.cat([log_mass.new_zeros(log_mass.shape[:2] + (cache.current.size(2),)), log_mass], -1)
        y = ((q / math.sqrt(D)) @ keys.transpose(-1, -2) + bias.unsqueeze(-2)).softmax(-1) @ values
        cache.pos += 1
        if cache.current.size(2) == self.block:  # the block is finished: fold it into the summaries
            S = self.assign(cache.current[..., :D], self.seeds)                            # (B, H, L, m)
            cache.sums = cache.sums + (S.transpose(-1, -2) @ cache.current).to(cache.sums.dtype)
            cache.current = cache.current[:, :, :0]
        return y


class ClusterCache:
    """Causal cluster attention between tokens: `sums`, Σ S·[k, v, 1] over the finished blocks (B, H, m, 2D+1), in
    float32 or wider; `current`, the current block's [k, v, 1] (B, H, < block, 2D+1). O(m + block), any length."""

    def __init__(self):
        self.pos, self.sums, self.current = 0, None, None

    def nbytes(self):
        return sum(t.numel() * t.element_size() for t in (self.sums, self.current) if t is not None)


# -----------------------------------------------------------------------------
# the table of rules: `attention=<name>` in a config picks the class

ATTENTION = {
    'softmax': SoftmaxAttention,
    'krause': KrauseAttention,
    'attentionx': AttentionX,
    'tda': ThresholdDifferentialAttention,
    'cluster': ClusterAttention,
}


def build_attention(config, layer_idx):
    check_attention_name(config.attention)
    rule = ATTENTION[config.attention]
    if rule is KrauseAttention and config.krause_mix:  # the paper's LM form: a softmax and a Krause branch, gated
        rule = KrauseMixAttention
    return rule(config, layer_idx)


def check_attention_name(name):
    if name not in ATTENTION:
        raise ValueError(f"unknown attention '{name}'; valid: {', '.join(sorted(ATTENTION))}")


# =============================================================================
# The machinery the rules share. Nothing below is a rule; each piece is written once and used by every rule
# that needs it.

# -----------------------------------------------------------------------------
# heads and RoPE

def split_heads(x, n_head):
    B, T, C = x.size()
    return x.view(B, T, n_head, C // n_head).transpose(1, 2)  # (B, H, T, D)


def merge_heads(y):
    B, H, T, D = y.size()
    return y.transpose(1, 2).contiguous().view(B, T, H * D)  # (B, T, C)


class Rotary(nn.Module):
    """Rotary position embedding (Su et al. 2021), rotate-half form, positions offset..offset+T-1. The tables hold
    max_len positions and grow (doubling) when a sequence or generation goes past them: no bound on the position."""

    def __init__(self, head_dim, max_len, base=10000.0):
        super().__init__()
        self.head_dim, self.base = head_dim, base
        cos, sin = self.tables(max_len, torch.float32, None)
        self.register_buffer('cos', cos, persistent=False)  # (max_len, D)
        self.register_buffer('sin', sin, persistent=False)

    def tables(self, n, dtype, device):  # always computed in float32, so growing never changes a stored position
        inv_freq = self.base ** (-torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=device) / self.head_dim)
        angles = torch.outer(torch.arange(n, dtype=torch.float32, device=device), inv_freq)  # (n, D/2)
        return angles.cos().repeat(1, 2).to(dtype), angles.sin().repeat(1, 2).to(dtype)

    def forward(self, x, offset=0):  # (B, H, T, D), offset: the absolute position of x's first token
        T, half = x.size(2), x.size(3) // 2
        if offset + T > self.cos.size(0):  # past the tables (longer than block_size): make them longer
            self.cos, self.sin = self.tables(max(2 * self.cos.size(0), offset + T), self.cos.dtype, self.cos.device)
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return (x * self.cos[offset:offset + T] + rotated * self.sin[offset:offset + T]).type_as(x)


# -----------------------------------------------------------------------------
# generation: the bookkeeping every rule's cache shares (positions, ring indexing). A rule's own cache object and
# its decode method sit next to its attend; GPT.generate holds one cache per layer (model.GenerationCache).

class KVCache:
    """One layer's cached tensors (B, H, n, D_i), e.g. k and v, and `pos`, the positions seen so far. capacity None:
    all of them, in buffers that double when full (amortised O(1) per token). capacity W: a ring of the last W,
    position p in slot p % W, which is exactly the window i - W < j <= i of the newest query i."""

    def __init__(self, capacity=None):
        self.capacity, self.pos, self.buffers = capacity, 0, None

    def append(self, *tensors):  # (B, H, T, D_i) each: T new positions
        T = tensors[0].size(2)
        size = self.capacity or max(2 * self.pos, self.pos + T, 64)
        if self.buffers is None or (self.capacity is None and self.pos + T > self.buffers[0].size(2)):
            old, self.buffers = self.buffers, [t.new_zeros(*t.shape[:2], size, t.size(3)) for t in tensors]
            for b, o in zip(self.buffers, old or []):
                b[:, :, :self.pos] = o[:, :, :self.pos]
        if self.capacity is None:
            for b, t in zip(self.buffers, tensors):
                b[:, :, self.pos:self.pos + T] = t
        elif T == 1:  # one token: its slot in the ring, no index tensor
            for b, t in zip(self.buffers, tensors):
                b[:, :, self.pos % self.capacity] = t[:, :, 0]
        else:  # only the last W can ever be seen again
            m = min(T, self.capacity)
            slots = torch.arange(self.pos + T - m, self.pos + T, device=tensors[0].device) % self.capacity
            for b, t in zip(self.buffers, tensors):
                b[:, :, slots] = t[:, :, T - m:]
        self.pos += T

    def tensors(self):  # the held positions, (B, H, min(pos, capacity), D_i) each; a ring's in slot order
        n = self.pos if self.capacity is None else min(self.pos, self.capacity)
        return [b[:, :, :n] for b in self.buffers]

    def nbytes(self):  # the held positions' bytes (a growing buffer may hold up to 2x this, allocated)
        return sum(t.numel() * t.element_size() for t in self.tensors())


# SDPA's kernels for one query against a cache that grows by a key per token. Not cuDNN's: it builds a new graph
# for every new key length (tens of ms per token on an H100; pytorch#155958), where flash reads any length.
DECODE_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def decode_sdpa(q, k, v):  # q (B, H, 1, D), k, v (B, H, n, D): every cached key is visible
    with sdpa_kernel(DECODE_BACKENDS):
        return F.scaled_dot_product_attention(q, k, v)


class CacheGroup:
    """Several caches that advance together (a rule with two branches): `pos` is the first one's."""

    def __init__(self, *caches):
        self.caches = caches

    @property
    def pos(self):
        return self.caches[0].pos

    def nbytes(self):
        return sum(c.nbytes() for c in self.caches)


# -----------------------------------------------------------------------------
# masks: which key j a query i may see. Small named mask_mods in the attention-gym style (compose them with
# flex_attention's and_masks / or_masks), each made once (module-level, or by a cached factory) so that one
# mask is one object and block_mask's cache can key on it.

def in_causal_window(query, key, window):
    """The sliding window, i - W < j <= i, on position tensors: the one definition, for flex, the band and Krause."""
    return (key <= query) & (query - key < window)


def causal_mask(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def off_diagonal_mask(b, h, q_idx, kv_idx):  # every key but the query's own token (AttentionX's ViT form)
    return q_idx != kv_idx


@lru_cache(maxsize=None)
def sliding_window_mask(window):
    def sliding_window(b, h, q_idx, kv_idx):
        return in_causal_window(q_idx, kv_idx, window)
    return sliding_window


def grid_neighbourhood(grid_size, radius, metric):
    """(N, N) bool, N = 1 + grid_size²: token 0 (CLS) sees and is seen by all; patch i sees patch j iff their
    distance on the grid (row-major patches) is at most `radius`, |Δr| + |Δc| or max(|Δr|, |Δc|)."""
    rows, cols = torch.arange(grid_size).repeat_interleave(grid_size), torch.arange(grid_size).repeat(grid_size)
    dr, dc = (rows[:, None] - rows[None, :]).abs(), (cols[:, None] - cols[None, :]).abs()
    distance = dr + dc if metric == 'manhattan' else torch.maximum(dr, dc)
    return F.pad(distance <= radius, (1, 0, 1, 0), value=True)


@lru_cache(maxsize=None)
def grid_mask(grid_size, radius, metric, device):
    neighbourhood = grid_neighbourhood(grid_size, radius, metric).to(device)  # (N, N) bool

    def grid_neighbours(b, h, q_idx, kv_idx):
        return neighbourhood[q_idx, kv_idx]
    return grid_neighbours


@lru_cache(maxsize=64)
def block_mask(mask_mod, T, device):
    """The flex BlockMask of `mask_mod` for T queries and T keys, built once per (mask_mod, T, device) and shared
    by every layer (a BlockMask built for one length is wrong for another). None: every key visible, no mask."""
    if mask_mod is None:
        return None
    return create_block_mask(mask_mod, None, None, T, T, device=device)


def run_flex(q, k, v, **kwargs):
    """flex_attention, compiled on CUDA (eager flex is a slow reference there); eager on CPU, forward only."""
    fn = compiled_flex_attention() if q.is_cuda else flex_attention
    return fn(q, k, v, **kwargs)


# eager flex on CPU is our forward-only check against the math path; its "not compiled" warning is expected there
warnings.filterwarnings('ignore', message='flex_attention called without torch.compile')


@lru_cache(maxsize=1)
def compiled_flex_attention():
    return torch.compile(flex_attention, dynamic=False)


# -----------------------------------------------------------------------------
# The banded layout, for windowed rules on the math path: queries in chunks of `chunk`, each chunk against the
# chunk + lookback keys that can reach it (positions c·chunk - lookback .. c·chunk + chunk - 1; lookback >= W, a
# whole number of chunks). A sliding window of W keys then costs O(T·(chunk + lookback)) time and memory, and
# no T×T tensor ever exists.

def cdiv(a, b):
    return -(-a // b)


def band_layout(window, T):
    """(W, chunk, lookback): the window that matters for a sequence of T (never more than T); the query chunk (up
    to 64 queries keeps the matmuls efficient and the band narrow); the look-back >= W, a multiple of the chunk."""
    W = min(window, T)
    chunk = min(W, 64)
    return W, chunk, cdiv(W, chunk) * chunk


def band_queries(x, chunk):  # (B, H, T, D) -> (B, H, n, chunk, D), zero-padded to n·chunk positions
    B, H, T, D = x.shape
    n = cdiv(T, chunk)
    return F.pad(x, (0, 0, 0, n * chunk - T)).view(B, H, n, chunk, D)


def band_keys(x, chunk, lookback):  # (B, H, T, D) -> (B, H, n, chunk + lookback, D)
    B, H, T, D = x.shape
    n = cdiv(T, chunk)
    # lookback zero keys in front, so chunk 0 looks back too
    chunks = F.pad(x, (0, 0, lookback, n * chunk - T)).view(B, H, n + lookback // chunk, chunk, D)
    return ShiftedChunks.apply(chunks, lookback // chunk + 1)


class ShiftedChunks(torch.autograd.Function):
    """(B, H, n+m-1, chunk, D) -> (B, H, n, m·chunk, D): chunk c followed by the next m-1, for every c (a cat of
    m shifted views). Autograd would give each shifted view its own full-size gradient; backward sums them."""

    @staticmethod
    def forward(ctx, chunks, m):
        ctx.m, ctx.shape = m, chunks.shape
        n = chunks.size(2) - m + 1
        return torch.cat([chunks[:, :, j:j + n] for j in range(m)], dim=3)

    @staticmethod
    def backward(ctx, grad):
        grad_chunks, n = grad.new_zeros(ctx.shape), grad.size(2)
        for j, grad_shift in enumerate(grad.chunk(ctx.m, dim=3)):
            grad_chunks[:, :, j:j + n] += grad_shift
        return grad_chunks, None


@lru_cache(maxsize=64)
def band_mask(T, chunk, lookback, window, device):
    """(n, chunk, chunk+lookback) bool: in chunk c, key slot s (position c·chunk - lookback + s) is visible to
    query r (position c·chunk + r)."""
    n = cdiv(T, chunk)
    query = torch.arange(n * chunk, device=device).view(n, chunk, 1)
    key = (torch.arange(n, device=device) * chunk - lookback).view(n, 1, 1) + torch.arange(chunk + lookback,
                                                                                           device=device)
    return (key >= 0) & in_causal_window(query, key, window)


def band_strip(x, W):
    """The W slots that row r of a (..., chunk, chunk+lookback) band can reach (keys r-W+1..r: slots
    lookback-W+1+r ..), as a (..., chunk, W) view."""
    *lead, chunk, width = x.shape
    assert x.is_contiguous()
    return x.as_strided((*lead, chunk, W), (*x.stride()[:-2], width + 1, 1), x.storage_offset() + width - chunk - W + 1)


def kth_largest(x, k):
    """(..., n) -> (..., 1): the k-th largest value along the last dim, without gradient (-inf sorts first, so a
    row with fewer than k finite values gives -inf). On CPU NumPy's SIMD selection is ~5x faster than kthvalue."""
    k = min(k, x.size(-1))
    with torch.no_grad():
        if x.device.type == 'cpu' and x.dtype in (torch.float32, torch.float64):
            n = x.size(-1)
            return torch.from_numpy(np.partition(x.detach().numpy(), n - k, axis=-1)[..., n - k:n - k + 1])
        return x.kthvalue(x.size(-1) - k + 1, dim=-1, keepdim=True).values


def topk_boundary(x, k):
    """(..., n) -> (..., 1), no gradient: halfway between the k-th and the (k+1)-th largest value along the last
    dim, so the top k are exactly the values at or above it (a tie at the k-th keeps all of it). A row with k or
    fewer finite values gives -inf: keep them all."""
    if k >= x.size(-1):
        return x.new_full((*x.shape[:-1], 1), float('-inf'))
    return (kth_largest(x, k) + kth_largest(x, k + 1)) / 2


def unband(y, T):  # (B, H, n, chunk, D) -> (B, H, T, D)
    B, H, n, chunk, D = y.shape
    return y.reshape(B, H, n * chunk, D)[:, :, :T]


# -----------------------------------------------------------------------------
# Query chunks, for full-context rules whose weights are no softmax (no fused kernel) on the math path: queries in
# chunks against the keys they can see, each chunk recomputed in backward, so memory stays linear in T.

def query_chunks(T, chunk, causal):
    """(start, end, n_keys) per chunk of queries start..end-1, which see keys 0..n_keys-1 (causal: up to end)."""
    return [(start, min(start + chunk, T), min(start + chunk, T) if causal else T) for start in range(0, T, chunk)]


def recompute_in_backward(fn, *args):
    """fn(*args) keeping none of its intermediates for backward, where they are recomputed (activation
    checkpointing): a loop over chunks then holds one chunk's intermediates at a time, not all of them."""
    if not torch.is_grad_enabled():
        return fn(*args)
    return checkpoint(fn, *args, use_reentrant=False)


# -----------------------------------------------------------------------------
# cluster summaries: attention to m (mass, mean key, mean value) triples in place of the keys they summarise

def cluster_means(sums, D):
    """Σ S·[k, v, 1] (..., m, 2D+1) -> mean keys, mean values (..., m, D) and log masses (..., m); an empty cluster
    (mass 0) gets log mass -inf and zero means (0 / tiny), not NaN."""
    mass = sums[..., -1]
    safe = mass.clamp_min(torch.finfo(mass.dtype).tiny)  # no 0/0 in the forward, no 1/0 in the backward
    log_mass = safe.log().masked_fill(mass == 0, float('-inf'))
    return sums[..., :D] / safe.unsqueeze(-1), sums[..., D:2 * D] / safe.unsqueeze(-1), log_mass


def exclusive_cumsum(x, dim):
    """Σ of the entries strictly before each index along dim (the first gets 0): x[0] + ... + x[i-1]."""
    head = x.narrow(dim, 0, x.size(dim) - 1).cumsum(dim)
    return torch.cat([torch.zeros_like(x.narrow(dim, 0, 1)), head], dim)


@torch.no_grad()
def cluster_usage(S):
    """Soft assignments S (B, H, T, m) -> {'perplexity': exp H(mean assignment), 'entropy': mean H(S_j)}, (H,) each:
    how many of the m clusters a head uses, and how hard its assignment is (0: one cluster per key)."""
    mean = S.mean((0, 2))  # (H, m)
    return {'perplexity': torch.exp(-torch.special.xlogy(mean, mean).sum(-1)),
            'entropy': -torch.special.xlogy(S, S).sum(-1).mean((0, 2))}
