"""
Which key j a query i may see, as small named mask_mods in the attention-gym style (compose them with
flex_attention's and_masks / or_masks); a factory is cached, so one mask is one object. Then a mask_mod made into
what a kernel takes: a flex BlockMask (block_mask), a dense (T, T) bool for SDPA or a softmax (dense_mask), the
band's tiles (band_mask), each built once per mask and shape; the keys each query sees (visible_keys); running
flex_attention.
"""
import warnings
from functools import lru_cache

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from machinery.band import cdiv


# -----------------------------------------------------------------------------
# which keys a query sees

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
# what a kernel takes

@lru_cache(maxsize=64)
def block_mask(mask_mod, T, device):
    """The flex BlockMask of `mask_mod` for T queries and T keys, built once per (mask_mod, T, device) and shared
    by every layer (a BlockMask built for one length is wrong for another). None: every key visible, no mask."""
    if mask_mod is None:
        return None
    return create_block_mask(mask_mod, None, None, T, T, device=device)


@lru_cache(maxsize=64)
def dense_mask(mask_mod, T, device):
    """The (T, T) bool of `mask_mod`, True where query i sees key j: the same named function a BlockMask is built
    from, evaluated on every (i, j) pair, for the paths that hand SDPA or a softmax an explicit mask. Shared: never
    modify it in place."""
    position = torch.arange(T, device=device)
    return mask_mod(*batch_and_head(device), position.view(-1, 1), position)


def batch_and_head(device):  # b = h = 0 for a mask_mod off flex: or_masks / and_masks need them as tensors
    zero = torch.zeros((), dtype=torch.long, device=device)
    return zero, zero


def visible_keys(attn, T):
    """(T,) the keys each query sees: from the rule's mask_mod where it has one, else all earlier (causal) or all."""
    mask_mod = getattr(attn, 'mask_mod', None)
    if mask_mod is not None:
        return dense_mask(mask_mod, T, 'cpu').sum(-1).double()
    return torch.arange(1, T + 1, dtype=torch.float64) if attn.causal else torch.full((T,), float(T),
                                                                                       dtype=torch.float64)


FLEX_DEVICES = ('cuda',)  # where flex=True runs attend_flex (Attention.path_name); elsewhere SDPA or the math path


def run_flex(q, k, v, **kwargs):
    """flex_attention, compiled on CUDA (eager flex is a slow reference there); eager on CPU, forward only."""
    fn = compiled_flex_attention() if q.is_cuda else flex_attention
    return fn(q, k, v, **kwargs)


# eager flex on CPU is our forward-only check against the math path; its "not compiled" warning is expected there
warnings.filterwarnings('ignore', message='flex_attention called without torch.compile')


@lru_cache(maxsize=1)
def compiled_flex_attention():
    return torch.compile(flex_attention, dynamic=False)


@lru_cache(maxsize=64)
def band_mask(mask_mod, T, tile, lookback, device, lookahead=0):
    """(n, tile, lookback+tile+lookahead) bool of `mask_mod` on the band: in tile c, key slot s (position c·tile -
    lookback + s; before the sequence: hidden, past it: hidden from the real queries) is visible to query r
    (position c·tile + r). A padding query (past T, dropped by unband) keeps the padding keys its mask_mod lets
    through, so that no row of the band is empty (an all -inf row is NaN, and NaN reaches the gradients)."""
    n = cdiv(T, tile)
    query = torch.arange(n * tile, device=device).view(n, tile, 1)
    start = (torch.arange(n, device=device) * tile - lookback).view(n, 1, 1)  # each tile's first key slot
    key = start + torch.arange(lookback + tile + lookahead, device=device)
    return (key >= 0) & ((key < T) | (query >= T)) & mask_mod(*batch_and_head(device), query, key)
