"""
The band, for windowed rules without a T×T tensor: queries in tiles of `tile`, each tile against the tile + lookback
keys that can reach it (positions c·tile - lookback .. c·tile + tile - 1; lookback >= W, a whole number of tiles;
a bidirectional window also looks ahead: + lookahead keys after the tile).
A sliding window of W keys then costs O(T·(tile + lookback)) time and memory. Query tiles, for full-context rules
whose weights are no softmax (no fused kernel): each tile recomputed in backward, so memory stays linear in T.
"""
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def cdiv(a, b):
    return -(-a // b)


def band_layout(window, T):
    """(W, tile, lookback): the window that matters for a sequence of T (never more than T); the query tile (up
    to 64 queries keeps the matmuls efficient and the band narrow); the look-back >= W, a multiple of the tile."""
    W = min(window, T)
    tile = min(W, 64)
    return W, tile, cdiv(W, tile) * tile


def band_queries(x, tile):  # (B, H, T, D) -> (B, H, n, tile, D), zero-padded to n·tile positions
    B, H, T, D = x.shape
    n = cdiv(T, tile)
    return F.pad(x, (0, 0, 0, n * tile - T)).view(B, H, n, tile, D)


def band_keys(x, tile, lookback, lookahead=0):  # (B, H, T, D) -> (B, H, n, lookback + tile + lookahead, D)
    """Tile c's keys c·tile - lookback .. c·tile + tile - 1 + lookahead (lookahead, a multiple of the tile, for a
    window with keys ahead of the query: a bidirectional one)."""
    B, H, T, D = x.shape
    n = cdiv(T, tile)
    # lookback zero keys in front, so tile 0 looks back too; lookahead after the end, so the last tile looks ahead
    reach = (lookback + lookahead) // tile  # tiles beside the query's own
    tiles = F.pad(x, (0, 0, lookback, n * tile - T + lookahead)).view(B, H, n + reach, tile, D)
    return ShiftedTiles.apply(tiles, reach + 1)


def band_view(x, tile, lookback):  # (B, H, T, D) -> (B, H, n, D, tile + lookback): band_keys transposed, a view
    n = cdiv(x.size(2), tile)
    return F.pad(x, (0, 0, lookback, n * tile - x.size(2))).unfold(2, tile + lookback, tile)


class ShiftedTiles(torch.autograd.Function):
    """(B, H, n+m-1, tile, D) -> (B, H, n, m·tile, D): tile c followed by the next m-1, for every c (a cat of
    m shifted views). Autograd would give each shifted view its own full-size gradient; backward sums them."""

    @staticmethod
    def forward(ctx, tiles, m):
        ctx.m, ctx.shape = m, tiles.shape
        n = tiles.size(2) - m + 1
        return torch.cat([tiles[:, :, j:j + n] for j in range(m)], dim=3)

    @staticmethod
    def backward(ctx, grad):
        grad_tiles, n = grad.new_zeros(ctx.shape), grad.size(2)
        for j, grad_shift in enumerate(grad.chunk(ctx.m, dim=3)):
            grad_tiles[:, :, j:j + n] += grad_shift
        return grad_tiles, None


def band_strip(x, W):
    """The W slots that row r of a (..., tile, tile+lookback) band can reach (keys r-W+1..r: slots
    lookback-W+1+r ..), as a (..., tile, W) view."""
    *lead, tile, width = x.shape
    assert x.is_contiguous()
    return x.as_strided((*lead, tile, W), (*x.stride()[:-2], width + 1, 1), x.storage_offset() + width - tile - W + 1)


def unband(y, T):  # (B, H, n, tile, D) -> (B, H, T, D)
    B, H, n, tile, D = y.shape
    return y.reshape(B, H, n * tile, D)[:, :, :T]


# query tiles, and sums over chunks

def query_tiles(T, tile, causal):
    """(start, end, n_keys) per tile of queries start..end-1, which see keys 0..n_keys-1 (causal: up to end)."""
    return [(start, min(start + tile, T), min(start + tile, T) if causal else T) for start in range(0, T, tile)]


def recompute_in_backward(fn, *args):
    """fn(*args) keeping none of its intermediates for backward, where they are recomputed (activation
    checkpointing): a loop over query tiles then holds one tile's intermediates at a time, not all of them."""
    if not torch.is_grad_enabled():
        return fn(*args)
    return checkpoint(fn, *args, use_reentrant=False)


def tile_queries(tile_output, T, tile_weights, causal):
    """The query-tile loop: tile_output(start, end, n_keys), queries start..end-1 against the keys 0..n_keys-1 they
    can see, for tiles of tile_weights // T queries, each recomputed in backward: memory linear in T, never T×T."""
    tiles = query_tiles(T, max(1, tile_weights // T), causal)
    return torch.cat([recompute_in_backward(tile_output, *tile) for tile in tiles], 2)  # (B, H, T, ·)


def tile_mask(mask_mod, start, end, n_keys, device):  # (C, L) bool: which keys 0..n_keys-1 queries start..end-1 see
    query, key = torch.arange(start, end, device=device), torch.arange(n_keys, device=device)
    return mask_mod(None, None, query[:, None], key)


def exclusive_cumsum(x, dim):
    """Σ of the entries strictly before each index along dim (the first gets 0): x[0] + ... + x[i-1]."""
    head = x.narrow(dim, 0, x.size(dim) - 1).cumsum(dim)
    return torch.cat([torch.zeros_like(x.narrow(dim, 0, 1)), head], dim)
