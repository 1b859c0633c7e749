"""
A named mask_mod (attention.py names them: which key j a query i may see) made into what a kernel takes: a
flex BlockMask (block_mask), a dense (T, T) bool for SDPA or a softmax (dense_mask), the band's tiles (band_mask).
Each is built once per mask and shape, and cached: one mask is one object. Then running flex_attention.
"""
import warnings
from functools import lru_cache

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from machinery.band import cdiv


@lru_cache(maxsize=64)
def block_mask(mask_mod, T, device):
    """The flex BlockMask of `mask_mod` for T queries and T keys, built once per (mask_mod, T, device) and shared
    by every layer (a BlockMask built for one length is wrong for another). None: every key visible, no mask."""
    if mask_mod is None:
        return None
    return create_block_mask(mask_mod, None, None, T, T, device=device)


@torch.compiler.disable  # run eagerly, before the compiled graph: a graph cannot see block_mask's cache
def build_flex_masks(layers, T, device):
    """Each layer's flex_masks for T tokens (attention modules, in order), or None where no layer runs flex. A model
    calls it once per forward and hands each layer its own: built once per shape, whatever the layers and calls."""
    if not any(attn.path_name(device) == 'flex' for attn in layers):
        return None
    return [attn.flex_masks(T, device) if attn.path_name(device) == 'flex' else None for attn in layers]


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
