"""
Every attention rule in one file, side by side.

Each variant is an nn.Module built as `build_attention(config, layer_idx)` and called as `y = attn(x)`,
x of shape (B, T, C). Inside, the same three steps in the same words:

    q, k, v = self.project(x)     # (B, H, T, D) each; RoPE applied here when the config asks for it
    y = self.attend(q, k, v)      # the interaction rule: the only part that differs between variants
    return self.out(y)            # merge heads, output projection, dropout

`attend` is the math path (plain PyTorch, any device). `attend_flex` computes the same function with
torch.nn.attention.flex_attention and is used when `config.flex` is set and x is on CUDA.
The shared pieces (heads, RoPE, masks, the banded layout, cached BlockMasks) come first.
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
# shared helpers: heads, RoPE

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
# shared helpers: masks. Small named mask_mods for flex, and the banded layout for the math path.

def causal_mask(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def sliding_window_mask(window):
    def mask_mod(b, h, q_idx, kv_idx):  # key j visible to query i iff i - W < j <= i
        return (q_idx >= kv_idx) & (q_idx - kv_idx < window)
    return mask_mod


def grid_neighbourhood(grid_size, radius, metric):
    """(N, N) bool, N = 1 + grid_size²: token 0 (CLS) sees and is seen by all; patch i sees patch j iff their
    distance on the grid (row-major patches) is at most `radius`, |Δr| + |Δc| or max(|Δr|, |Δc|)."""
    rows, cols = torch.arange(grid_size).repeat_interleave(grid_size), torch.arange(grid_size).repeat(grid_size)
    dr, dc = (rows[:, None] - rows[None, :]).abs(), (cols[:, None] - cols[None, :]).abs()
    distance = dr + dc if metric == 'manhattan' else torch.maximum(dr, dc)
    return F.pad(distance <= radius, (1, 0, 1, 0), value=True)


def tensor_mask(mask):
    def mask_mod(b, h, q_idx, kv_idx):  # look the pair up in a precomputed (T, T) bool mask
        return mask[q_idx, kv_idx]
    return mask_mod


@lru_cache(maxsize=64)
def block_mask(T, device, causal=True, window=0, grid=None):
    """BlockMask for flex_attention, built once per (T, device, causal, window, grid) and reused by every layer.
    grid = (grid_size, radius, metric) asks for a 2-D neighbourhood (grid_neighbourhood)."""
    if grid:
        mask_mod = tensor_mask(grid_neighbourhood(*grid).to(device))
    elif window:
        mask_mod = sliding_window_mask(window)
    elif causal:
        mask_mod = causal_mask
    else:
        return None  # full attention needs no mask
    return create_block_mask(mask_mod, None, None, T, T, device=device)


# The banded layout: queries in chunks of C, each chunk against the C + P keys that can reach it (positions
# cC - P .. cC + C - 1, P >= W a whole number of chunks). A sliding window of W keys then costs O(T·(C+P)) time
# and memory and no T×T tensor ever exists.

def band_layout(window, T):
    """(W, C, P): the window that matters for a sequence of T (never more than T); the query chunk C (up to 64
    queries keeps the matmuls efficient and the band narrow); the look-back P >= W, a multiple of C."""
    W = min(window, T)
    C = min(W, 64)
    return W, C, -(-W // C) * C


def band_queries(x, C):  # (B, H, T, D) -> (B, H, n, C, D), zero-padded to n·C positions
    B, H, T, D = x.shape
    n = -(-T // C)
    return F.pad(x, (0, 0, 0, n * C - T)).view(B, H, n, C, D)


def band_keys(x, C, P):  # (B, H, T, D) -> (B, H, n, C+P, D)
    B, H, T, D = x.shape
    n = -(-T // C)
    chunks = F.pad(x, (0, 0, P, n * C - T)).view(B, H, n + P // C, C, D)  # P zero keys in front: chunk 0 looks back
    return ShiftedChunks.apply(chunks, P // C + 1)


class ShiftedChunks(torch.autograd.Function):
    """(B, H, n+m-1, C, D) -> (B, H, n, m·C, D): chunk c followed by the next m-1, for every c (a cat of m shifted
    views). Autograd would give each shifted view its own full-size gradient; backward sums them into one."""

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
def band_mask(T, C, P, W, device):
    """(n, C, C+P) bool: in chunk c, key slot s (position cC - P + s) is visible to query r (position cC + r)."""
    n = -(-T // C)
    query = torch.arange(n * C, device=device).view(n, C, 1)
    key = (torch.arange(n, device=device) * C - P).view(n, 1, 1) + torch.arange(C + P, device=device)
    return (key >= 0) & (key <= query) & (query - key < W)


def band_strip(x, W):
    """The W slots that row r of a (..., C, C+P) band can reach (keys r-W+1..r: slots P-W+1+r ..), a (..., C, W) view."""
    *lead, C, CP = x.shape
    assert x.is_contiguous()
    return x.as_strided((*lead, C, W), (*x.stride()[:-2], CP + 1, 1), x.storage_offset() + CP - C - W + 1)


def kth_largest(x, k):
    """(..., n) -> (..., 1): the k-th largest value along the last dim, without gradient (-inf sorts first, so a
    row with fewer than k finite values gives -inf). On CPU NumPy's SIMD selection is ~5x faster than kthvalue."""
    k = min(k, x.size(-1))
    with torch.no_grad():
        if x.device.type == 'cpu' and x.dtype in (torch.float32, torch.float64):
            n = x.size(-1)
            return torch.from_numpy(np.partition(x.detach().numpy(), n - k, axis=-1)[..., n - k:n - k + 1])
        return x.kthvalue(x.size(-1) - k + 1, dim=-1, keepdim=True).values


def unband(y, T):  # (B, H, n, W, D) -> (B, H, T, D)
    B, H, n, W, D = y.shape
    return y.reshape(B, H, n * W, D)[:, :, :T]


# -----------------------------------------------------------------------------
# the variants

class Attention(nn.Module):
    """The frame every variant shares: q, k, v projections (+RoPE), then `attend`, then the output projection."""

    def __init__(self, config, layer_idx):
        super().__init__()
        assert config.n_embd % config.n_head == 0, f"n_embd={config.n_embd} must be divisible by n_head={config.n_head}"
        self.n_head, self.head_dim = config.n_head, config.n_embd // config.n_head
        self.causal, self.flex, self.dropout = config.causal, config.flex, config.dropout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.rope = Rotary(self.head_dim, config.block_size, config.rope_base) if config.pos_emb == 'rope' else None

    def project(self, x):
        q, k, v = (split_heads(t, self.n_head) for t in self.c_attn(x).chunk(3, dim=2))  # (B, H, T, D) each
        if self.rope is not None:
            q, k = self.rope(q), self.rope(k)
        return q, k, v

    def out(self, y):
        return self.resid_dropout(self.c_proj(merge_heads(y)))

    def forward(self, x):
        qkv = self.project(x)
        y = self.attend_flex(*qkv) if (self.flex and x.is_cuda) else self.attend(*qkv)
        return self.out(y)

    def attend(self, q, k, v):
        raise NotImplementedError

    def attend_flex(self, q, k, v):
        raise NotImplementedError(f"{type(self).__name__} has no flex path; set flex=False")


def run_flex(q, k, v, **kwargs):
    """flex_attention, compiled on CUDA (eager flex is a slow reference there); eager on CPU, forward only."""
    fn = compiled_flex_attention() if q.is_cuda else flex_attention
    return fn(q, k, v, **kwargs)


# eager flex on CPU is our forward-only check against the math path; its "not compiled" warning is expected there
warnings.filterwarnings('ignore', message='flex_attention called without torch.compile')


@lru_cache(maxsize=1)
def compiled_flex_attention():
    return torch.compile(flex_attention, dynamic=False)


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
        W, C, P = band_layout(self.window, T)
        y = F.scaled_dot_product_attention(band_queries(q, C), band_keys(k, C, P), band_keys(v, C, P),
                                           attn_mask=band_mask(T, C, P, W, q.device), dropout_p=dropout_p)
        return unband(y, T)

    def attend_flex(self, q, k, v):
        # flex has no attention-weight dropout; the residual dropout in `out` still applies
        T = q.size(2)
        window = self.window if self.window < T else 0
        return run_flex(q, k, v, block_mask=block_mask(T, str(q.device), self.causal, window))


def krause_topk_schedule(topk, n_layer):
    """ViT top-k over depth, k at the first layer to 2k at the last: round(linspace(k, 2k, n_layer))."""
    return [round(x) for x in torch.linspace(topk, 2 * topk, n_layer, dtype=torch.float64).tolist()]


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
        g = config.grid_size
        if g < 1 or config.block_size != 1 + g * g:
            raise ValueError(f"non-causal Krause needs a square patch grid: grid_size={g} with block_size = 1 + "
                             f"grid_size² tokens (got block_size={config.block_size}); use it in a ViT")
        if config.krause_metric not in ('manhattan', 'chebyshev'):
            raise ValueError(f"krause_metric must be 'manhattan' or 'chebyshev', got '{config.krause_metric}'")
        if config.krause_radius < 0 or config.krause_topk < 1:
            raise ValueError(f"krause_radius must be >= 0 and krause_topk >= 1, got {config.krause_radius}, "
                             f"{config.krause_topk}")
        self.topk = krause_topk_schedule(config.krause_topk, config.n_layer)[layer_idx]
        self.grid = (g, config.krause_radius, config.krause_metric)
        self.register_buffer('neighbourhood', grid_neighbourhood(*self.grid), persistent=False)  # (N, N)

    def scaled(self, q, k):
        """q/σ² and the per-key bias -||k||²/(2σ²), so that score = (q/σ²)·k + bias: (B, H, T, D), (B, H, T)."""
        inv_var = torch.exp(-2 * self.log_sigma).view(1, -1, 1, 1)  # 1/σ² per head
        return q * inv_var, -0.5 * (k * k).sum(-1) * inv_var[..., 0]

    def weights(self, scores, mask, reachable=None):
        """Attention weights and per-row thresholds (..., 1) from fresh RBF scores and the neighbourhood mask:
        the top k of each row (chosen among `reachable(scores)`, a view of the slots a row can reach, if given),
        softmax, dropout. Out-of-place fills: as fast and as small here as in-place ones under no_grad, which
        torch.compile's inductor fails on (KeyError 'buf1', torch 2.13). The threshold itself carries no gradient."""
        scores = scores.masked_fill(~mask, float('-inf'))
        threshold = kth_largest(scores if reachable is None else reachable(scores), self.topk)
        scores = scores.masked_fill(scores < threshold, float('-inf'))
        return F.dropout(scores.softmax(-1), self.dropout, self.training), threshold

    def band_weights(self, q, k):
        """1-D: weights on the band (B, H, n, C, C+P) and thresholds (B, H, T); no T×T tensor."""
        T = q.size(2)
        W, C, P = band_layout(self.window, T)
        q_scaled, key_bias = self.scaled(q, k)
        scores = band_queries(q_scaled, C) @ band_keys(k, C, P).transpose(-1, -2)     # (B, H, n, C, C+P)
        scores = scores + band_keys(key_bias.unsqueeze(-1), C, P).transpose(-1, -2)   # + each key slot's bias
        weights, threshold = self.weights(scores, band_mask(T, C, P, W, q.device), lambda s: band_strip(s, W))
        return weights, unband(threshold, T)[..., 0]

    def dense_weights(self, q, k):
        """Every (i, j) pair: (B, H, T, T) weights and (B, H, T) thresholds. The ViT's path (65 tokens)."""
        T = q.size(2)
        q_scaled, key_bias = self.scaled(q, k)
        scores = q_scaled @ k.transpose(-1, -2) + key_bias.unsqueeze(-2)  # (B, H, T, T)
        if self.grid:
            mask = self.neighbourhood[:T, :T]
        else:
            i, j = torch.arange(T, device=q.device).view(-1, 1), torch.arange(T, device=q.device)
            mask = (j <= i) & (i - j < self.window)
        weights, threshold = self.weights(scores, mask)
        return weights, threshold[..., 0]

    def attend(self, q, k, v):
        if self.grid:
            return self.dense_weights(q, k)[0] @ v
        T = q.size(2)
        W, C, P = band_layout(self.window, T)
        weights, _ = self.band_weights(q, k)
        return unband(weights @ band_keys(v, C, P), T)  # (B, H, T, D)

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
        q_scaled, key_bias = self.scaled(q, k)

        def krause_score(score, b, h, q_idx, kv_idx):
            score = score + key_bias[b, h, kv_idx]
            return torch.where(score >= threshold[b, h, q_idx], score, float('-inf'))

        mask = block_mask(T, str(q.device), True, min(self.window, T)) if not self.grid else \
            block_mask(T, str(q.device), False, 0, self.grid)
        return run_flex(q_scaled, k, v, score_mod=krause_score, block_mask=mask, scale=1.0)


class KrauseMixAttention(nn.Module):
    """
    y = g_0 · y_softmax + g_1 · y_krause,   g = softmax(Linear(2C → 2)([y_softmax, y_krause]))   per token

    The Krause paper's language-model form (SPEC §1): a causal softmax branch and a Krause branch, each with its
    own q/k/v/out projections, mixed by a learned gate that starts at 0.8 for the softmax branch.
    """

    def __init__(self, config, layer_idx):
        super().__init__()
        if not config.causal:
            raise ValueError("krause_mix is the language-model form (causal=True); use krause_mix=False in a ViT")
        self.softmax = SoftmaxAttention(config, layer_idx)
        self.krause = KrauseAttention(config, layer_idx)
        self.gate = nn.Linear(2 * config.n_embd, 2)

    def init_extra(self):
        nn.init.normal_(self.gate.weight, std=0.01)
        with torch.no_grad():
            self.gate.bias.copy_(torch.tensor([math.log(0.8 / 0.2), 0.0]))  # softmax(bias) = (0.8, 0.2)

    def forward(self, x):
        y_softmax, y_krause = self.softmax(x), self.krause(x)  # (B, T, C) each
        g = self.gate(torch.cat([y_softmax, y_krause], dim=-1)).softmax(-1)  # (B, T, 2)
        return g[..., :1] * y_softmax + g[..., 1:] * y_krause


def krause_attention(config, layer_idx):
    """`attention='krause'`: pure Krause, or the paper's gated LM form when krause_mix is set."""
    return (KrauseMixAttention if config.krause_mix else KrauseAttention)(config, layer_idx)


ATTENTION = {
    'softmax': SoftmaxAttention,
    'krause': krause_attention,
}


def build_attention(config, layer_idx):
    check_attention_name(config.attention)
    return ATTENTION[config.attention](config, layer_idx)


def check_attention_name(name):
    if name not in ATTENTION:
        raise ValueError(f"unknown attention '{name}'; valid: {', '.join(sorted(ATTENTION))}")
