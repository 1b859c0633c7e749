"""
The machinery attention rules are built from, written once: heads and RoPE, KV caches, masks (named mask_mods,
evaluated densely or as cached flex BlockMasks), the banded layout that keeps a windowed rule O(T·W), and query
chunks that keep a full-context rule's memory linear in T.

attention.py holds the rules and reads top to bottom as their formulas; this file is what a rule reaches for.
Nothing here is a rule, and nothing here knows which rules exist.
"""
import warnings
from functools import lru_cache

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from torch.utils.checkpoint import checkpoint


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


def dense_mask(mask_mod, T, device):
    """The (T, T) bool of `mask_mod`, True where query i sees key j: the same named function a BlockMask is built
    from, evaluated on every (i, j) pair, for the paths that hand SDPA or a softmax an explicit mask."""
    position = torch.arange(T, device=device)
    return mask_mod(None, None, position.view(-1, 1), position)


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
    checkpointing): a loop over query chunks then holds one chunk's intermediates at a time, not all of them."""
    if not torch.is_grad_enabled():
        return fn(*args)
    return checkpoint(fn, *args, use_reentrant=False)

