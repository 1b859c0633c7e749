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


@lru_cache(maxsize=64)
def block_mask(T, device, causal=True, window=0):
    """BlockMask for flex_attention, built once per (T, device, causal, window) and reused by every layer."""
    if window:
        mask_mod = sliding_window_mask(window)
    elif causal:
        mask_mod = causal_mask
    else:
        return None  # full attention needs no mask
    return create_block_mask(mask_mod, None, None, T, T, device=device)


# The banded layout: queries in chunks of W, each chunk against the 2W keys that can reach it.
# Chunk c holds queries cW..cW+W-1 and keys (c-1)W..cW+W-1, so a sliding window of W keys costs
# O(T·W) time and memory and no T×T tensor ever exists.

def band_queries(x, W):  # (B, H, T, D) -> (B, H, n, W, D), zero-padded to n·W positions
    B, H, T, D = x.shape
    n = -(-T // W)
    return F.pad(x, (0, 0, 0, n * W - T)).view(B, H, n, W, D)


def band_keys(x, W):  # (B, H, T, D) -> (B, H, n, 2W, D)
    B, H, T, D = x.shape
    n = -(-T // W)
    x = F.pad(x, (0, 0, W, n * W - T))                # W zero keys in front, so chunk 0 has a left half
    return x.unfold(2, 2 * W, W).transpose(-1, -2)  # unfold: (B, H, n, D, 2W)


@lru_cache(maxsize=64)
def band_mask(T, W, window, device):
    """(n, W, 2W) bool: in chunk c, key slot s (position cW - W + s) is visible to query r (position cW + r)."""
    n = -(-T // W)
    query = torch.arange(n * W, device=device).view(n, W, 1)
    key = (torch.arange(n, device=device) * W - W).view(n, 1, 1) + torch.arange(2 * W, device=device)
    return (key >= 0) & (key <= query) & (query - key < window)


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
        W = self.window
        y = F.scaled_dot_product_attention(band_queries(q, W), band_keys(k, W), band_keys(v, W),
                                           attn_mask=band_mask(T, W, W, q.device), dropout_p=dropout_p)
        return unband(y, T)

    def attend_flex(self, q, k, v):
        # flex has no attention-weight dropout; the residual dropout in `out` still applies
        T = q.size(2)
        window = self.window if self.window < T else 0
        return run_flex(q, k, v, block_mask=block_mask(T, str(q.device), self.causal, window))


ATTENTION = {
    'softmax': SoftmaxAttention,
}


def build_attention(config, layer_idx):
    check_attention_name(config.attention)
    return ATTENTION[config.attention](config, layer_idx)


def check_attention_name(name):
    if name not in ATTENTION:
        raise ValueError(f"unknown attention '{name}'; valid: {', '.join(sorted(ATTENTION))}")
