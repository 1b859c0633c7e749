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
from torch.nn.attention.flex_attention import create_block_mask, flex_attention


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
    pos_emb: str = 'learned'     # 'learned' (added to the input) or 'rope' (rotates q and k in every layer)
    rope_base: float = 10000.0
    window: int = 0              # softmax: sliding window of W keys (i-W < j <= i); 0 = full context
    n_layer: int = 12            # depth (the ViT's Krause top-k grows over it)
    krause_window: int = 32      # Krause 1-D: W keys per query (i-W < j <= i)
    krause_topk: int = 16        # Krause: keys kept per row (ViT: first layer's k, growing to 2k)
    krause_sigma: float = 2.5    # Krause: initial RBF bandwidth σ (learned per head as log_sigma)
    krause_radius: int = 1       # Krause 2-D: patches within this distance of a patch are its neighbours
    krause_metric: str = 'manhattan'  # Krause 2-D: 'manhattan' (official CIFAR) or 'chebyshev' (official ImageNet)
    krause_mix: bool = False     # Krause GPT: the paper's LM form, a softmax branch and a Krause branch, gated


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
      - A bad setting raises ValueError in __init__, naming the key; train.py checks it before any work starts.
    """
    projections = ('q', 'k', 'v')  # what project returns, in order; None: the rule brings its own projections
    no_decay = ()                  # names of this module's parameters that AdamW must not decay

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

    def project(self, x):
        tensors = [split_heads(t, self.n_head) for t in self.c_attn(x).chunk(len(self.projections), dim=2)]
        if self.rope is not None:  # positions enter through the queries and keys only
            tensors = [self.rope(t) if name[0] in 'qk' else t for name, t in zip(self.projections, tensors)]
        return tuple(tensors)  # (B, H, T, D) each

    def out(self, y):
        return self.resid_dropout(self.c_proj(merge_heads(y)))

    def forward(self, x):
        tensors = self.project(x)
        y = self.attend_flex(*tensors) if (self.flex and x.is_cuda) else self.attend(*tensors)
        return self.out(y)

    def attend(self, q, k, v):
        raise NotImplementedError

    def attend_flex(self, q, k, v):
        raise NotImplementedError(f"{type(self).__name__} has no flex path; set flex=False")

    def init_extra(self):
        pass


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
        torch.compile's inductor fails on (KeyError 'buf1', torch 2.13). The threshold itself carries no gradient."""
        scores = scores.masked_fill(~mask, float('-inf'))
        threshold = kth_largest(scores if reachable is None else reachable(scores), self.topk)
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
        # threshold found by a pre-pass on the band (no gradient). A small tolerance keeps the k-th key itself
        # when flex rounds its score differently from the pre-pass. No dropout on the weights, as for softmax.
        T = q.size(2)
        with torch.no_grad():
            threshold = (self.dense_weights if self.grid else self.band_weights)(q, k)[1]  # (B, H, T)
        threshold = threshold - 1e-5 * (1 + threshold.abs())
        q_scaled, key_bias = self.rbf_terms(q, k)

        def krause_score(score, b, h, q_idx, kv_idx):
            score = score + key_bias[b, h, kv_idx]
            return torch.where(score >= threshold[b, h, q_idx], score, float('-inf'))

        mask_mod = grid_mask(*self.grid, q.device) if self.grid else sliding_window_mask(self.window)
        return run_flex(q_scaled, k, v, score_mod=krause_score, block_mask=block_mask(mask_mod, T, q.device), scale=1.0)


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

    def project(self, x):
        return self.softmax.project(x) + self.krause.project(x)  # q, k, v of the softmax branch, then Krause's

    def attend(self, q, k, v, q_krause, k_krause, v_krause):
        return torch.cat([self.softmax.attend(q, k, v), self.krause.attend(q_krause, k_krause, v_krause)], -1)

    def attend_flex(self, q, k, v, q_krause, k_krause, v_krause):
        return torch.cat([self.softmax.attend_flex(q, k, v),
                          self.krause.attend_flex(q_krause, k_krause, v_krause)], -1)

    def out(self, y):  # (B, H, T, 2D): the two branches' heads side by side
        y_softmax, y_krause = self.softmax.out(y[..., :self.head_dim]), self.krause.out(y[..., self.head_dim:])
        g = self.gate(torch.cat([y_softmax, y_krause], dim=-1)).softmax(-1)  # (B, T, 2)
        return g[..., :1] * y_softmax + g[..., 1:] * y_krause


# -----------------------------------------------------------------------------
# the table of rules: `attention=<name>` in a config picks the class

ATTENTION = {
    'softmax': SoftmaxAttention,
    'krause': KrauseAttention,
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
    """Rotary position embedding (Su et al. 2021), rotate-half form, positions 0..T-1."""

    def __init__(self, head_dim, max_len, base=10000.0):
        super().__init__()
        inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)  # (max_len, D/2)
        self.register_buffer('cos', angles.cos().repeat(1, 2), persistent=False)   # (max_len, D)
        self.register_buffer('sin', angles.sin().repeat(1, 2), persistent=False)

    def forward(self, x):  # (B, H, T, D)
        T, half = x.size(2), x.size(3) // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return (x * self.cos[:T] + rotated * self.sin[:T]).type_as(x)


# -----------------------------------------------------------------------------
# masks: which key j a query i may see. Small named mask_mods in the attention-gym style (compose them with
# flex_attention's and_masks / or_masks), each made once (module-level, or by a cached factory) so that one
# mask is one object and block_mask's cache can key on it.

def in_causal_window(query, key, window):
    """The sliding window, i - W < j <= i, on position tensors: the one definition, for flex, the band and Krause."""
    return (key <= query) & (query - key < window)


def causal_mask(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


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


def unband(y, T):  # (B, H, n, chunk, D) -> (B, H, T, D)
    B, H, n, chunk, D = y.shape
    return y.reshape(B, H, n * chunk, D)[:, :, :T]
