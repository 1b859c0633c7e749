"""attention='krause': Krause synchronization attention, the top k of each token's nearest keys (docs/rules.md#krause)."""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from attention import Attention
from machinery.band import band_keys, band_layout, band_queries, band_strip, band_view, unband
from machinery.caches import KVCache
from machinery.kernels.krause import MAX_WINDOW, krause_band_attention
from machinery.masks import band_mask, block_mask, dense_mask, grid_mask, run_flex, sliding_window_mask, visible_keys
from machinery.selection import topk_boundary


def krause_reference(q, k, v, log_sigma, neighbours, topk):
    """The formula, every (i, j) pair at once: (B, H, T, D) q, k, v, log σ per head (H,), N_i as a (T, T) bool, k.
    O(T²) memory: the reference the other paths equal (tests/test_krause.py); `attend` computes it on the band."""
    T = q.size(2)
    sigma2 = torch.exp(2 * log_sigma).view(1, -1, 1, 1)                        # σ_h², (1, H, 1, 1)
    score = -(q.unsqueeze(3) - k.unsqueeze(2)).pow(2).sum(-1) / (2 * sigma2)  # -‖q_i - k_j‖²/(2σ²), (B, H, T, T)
    score = score.masked_fill(~neighbours, float('-inf'))                     # j in N_i only
    kth = score.topk(min(topk, T), dim=-1).values[..., -1:]                   # each row's k-th (-inf: fewer than k)
    score = score.masked_fill(score < kth, float('-inf'))                     # the top k, a tie at the k-th kept whole
    return score.softmax(-1) @ v                                              # y_i = Σ_j w_ij v_j, (B, H, T, D)


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
    learned per head (log_sigma). Two models, two pieces below: the GPT's N_i is the causal window i - W < j <= i
    (KrauseBand); the ViT's, the patches within `krause_radius` on the grid (+ CLS, which sees and is seen by all),
    k growing over depth from k to 2k (KrauseGrid); building KrauseAttention gives the one `causal` asks for.
    -||q_i||²/(2σ²) is the same along a row (it changes neither the top k nor the softmax), so the paths drop it:
    score_ij = q_i·k_j/σ² - ||k_j||²/(2σ²). With mix=True, build_attention makes the paper's LM form: a softmax
    branch beside it (MixAttention).
    """
    # what the two pieces have together (the registry's); each piece below says what it lacks
    has_bidirectional_form = True
    has_cache = True
    has_flex = True
    Config = KrauseConfig

    def __new__(cls, config, layer_idx):  # the GPT's band or the ViT's grid, as config.causal says
        if cls is KrauseAttention:
            cls = KrauseBand if config.causal else KrauseGrid
        return super().__new__(cls)

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        if not (math.isfinite(config.krause_sigma) and config.krause_sigma > 0):
            raise ValueError(f"krause_sigma must be > 0 and finite, got {config.krause_sigma}")
        self.log_sigma = nn.Parameter(torch.full((self.n_head,), math.log(config.krause_sigma)))

    def attend_reference(self, q, k, v):  # the formula (krause_reference) with this layer's σ, N_i and k
        return krause_reference(q, k, v, self.log_sigma, dense_mask(self.mask_mod, q.size(2), q.device), self.topk)

    def inv_var(self):
        return torch.exp(-2 * self.log_sigma).view(1, -1, 1, 1)  # 1/σ² per head, (1, H, 1, 1)

    def key_bias(self, k):  # (B, H, T, D) -> (B, H, T): -||k||²/(2σ²)
        return -0.5 * (k * k).sum(-1) * self.inv_var()[..., 0]

    def scores(self, q, k, key_bias=None):
        """score_ij = (q_i/σ²)·k_j - ||k_j||²/(2σ²) for every pair, (B, H, T, L). key_bias (B, H, L, 1): the keys'
        biases, where a cache holds them."""
        key_bias = self.key_bias(k).unsqueeze(-1) if key_bias is None else key_bias        # (B, H, L, 1)
        return (q * self.inv_var()) @ k.transpose(-1, -2) + key_bias.transpose(-1, -2)

    def topk_softmax_within(self, scores, mask, reachable=None):
        """The weights from fresh scores and the neighbourhood mask (None: all visible): the top k of each row
        (among `reachable(scores)`, the slots a row can reach, if given) kept by a boundary halfway between its k-th
        and (k+1)-th score, so flex, which rounds its own way, keeps the same keys; softmax; dropout. Out-of-place
        fills: torch.compile's inductor fails on in-place ones here (KeyError 'buf1', torch 2.13)."""
        scores = scores if mask is None else scores.masked_fill(~mask, float('-inf'))
        boundary = topk_boundary(scores if reachable is None else reachable(scores), self.topk)
        scores = scores.masked_fill(scores < boundary, float('-inf'))
        return F.dropout(scores.softmax(-1), self.dropout, self.training)

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

    def ideal_flops(self, T):  # every neighbour scored, the top k summed: n_i the window or the grid neighbourhood
        n, C = visible_keys(self, T), self.n_head * self.head_dim
        return 2 * C * n.mean().item() + 2 * C * n.clamp_max(self.topk).mean().item()


class KrauseBand(KrauseAttention):
    """The GPT's Krause: N_i the last W keys. Its math path works on the band, O(T·W), never T×T; its kernel
    (machinery/kernels/krause.py) on CUDA; its cache a ring of the last W keys."""
    has_bidirectional_form = False
    has_kernel = True  # up to MAX_WINDOW keys (a count fits the kernel's selection)

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        W, k = config.krause_window, config.krause_topk
        if W < 1:
            raise ValueError(f"krause_window must be >= 1, got {W}")
        if not 1 <= k <= W:
            raise ValueError(f"krause_topk must be in [1, krause_window={W}], got {k}")
        self.krause_window, self.topk, self.mask_mod = W, k, sliding_window_mask(W)
        self.has_kernel = W <= MAX_WINDOW

    def attend(self, q, k, v):
        T = q.size(2)
        W, tile, lookback = band_layout(self.krause_window, T)
        weights = self.topk_softmax_within(self.band_scores(q, k, tile, lookback), self.neighbours(T, q.device),
                                           lambda s: band_strip(s, W))   # (B, H, n, tile, tile+lookback)
        return unband(weights @ band_keys(v, tile, lookback), T)          # (B, H, T, D)

    def attend_kernel(self, q, k, v):
        """The band as one Triton kernel (machinery/kernels/krause.py: the top k by an exact selection in registers,
        flash-style backward), what forward runs on CUDA. Like flex, it drops no weights (train.py's start-up line
        says so where dropout is set); the residual dropout in `out` applies."""
        return krause_band_attention(q, k, v, self.log_sigma, self.krause_window, self.topk)

    def band_scores(self, q, k, tile, lookback, view=False):
        """The scores on the band, (B, H, n, tile, tile + lookback). view: the band's keys as a strided view
        (band_view), not a copy; no gradient (flex's pre-pass)."""
        key_bias = self.key_bias(k).unsqueeze(-1)                                          # (B, H, T, 1)
        if view:
            keys, biases = band_view(k, tile, lookback), band_view(key_bias, tile, lookback)
        else:
            keys, biases = (band_keys(t, tile, lookback).transpose(-1, -2) for t in (k, key_bias))
        return band_queries(q * self.inv_var(), tile) @ keys + biases

    def neighbours(self, T, device):  # N_i on the band, (n, tile, tile + lookback) bool
        _, tile, lookback = band_layout(self.krause_window, T)
        return band_mask(self.mask_mod, T, tile, lookback, device)

    @torch.no_grad()
    def topk_boundaries(self, q, k, mask):  # (B, H, T): one selection among the W slots each row reaches
        T = q.size(2)
        W, tile, lookback = band_layout(self.krause_window, T)
        scores = self.band_scores(q, k, tile, lookback, view=True).masked_fill(~mask, float('-inf'))
        return unband(topk_boundary(band_strip(scores, W), self.topk), T)[..., 0]

    def new_cache(self):  # a ring of the last krause_window keys and values: constant memory for ever
        return KVCache(self.krause_window)

    def fill(self, cache, q, k, v):  # each key's bias goes in the ring beside it: computed once, not W times
        cache.append(k, v, self.key_bias(k).unsqueeze(-1))

    def decode(self, q, k, v, cache):  # (B, H, 1, D): the top k of the (up to W) keys the ring holds
        cache.append(k, v, self.key_bias(k).unsqueeze(-1))
        keys, values, key_bias = cache.tensors()                # (B, H, n <= W, D), (B, H, n, D), (B, H, n, 1)
        return self.topk_softmax_within(self.scores(q, keys, key_bias), None) @ values  # the ring: all visible


class KrauseGrid(KrauseAttention):
    """The ViT's Krause: N_i the patches within krause_radius on the grid, + CLS; k growing over depth. Its math
    path scores every pair (65 tokens), as the official code does. A ViT does not generate: no cache."""
    has_causal_form = False
    has_cache = False

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        grid_size, k = config.grid_size, config.krause_topk
        if grid_size < 1 or config.block_size != 1 + grid_size * grid_size:
            raise ValueError(f"non-causal Krause needs a square patch grid: grid_size={grid_size} with block_size = "
                             f"1 + grid_size² tokens (got block_size={config.block_size}); use it in a ViT")
        if config.krause_metric not in ('manhattan', 'chebyshev'):
            raise ValueError(f"krause_metric must be 'manhattan' or 'chebyshev', got '{config.krause_metric}'")
        if config.krause_radius < 0 or k < 1:
            raise ValueError(f"krause_radius must be >= 0 and krause_topk >= 1, got {config.krause_radius}, {k}")
        self.topk = krause_topk_schedule(k, config.n_layer)[layer_idx]
        self.grid = (grid_size, config.krause_radius, config.krause_metric)
        self.mask_mod = grid_mask(*self.grid)

    def attend(self, q, k, v):  # every (i, j) pair, a (B, H, T, T) matrix
        return self.topk_softmax_within(self.scores(q, k), self.neighbours(q.size(2), q.device)) @ v

    def neighbours(self, T, device):  # N_i on every pair, (T, T) bool
        return dense_mask(self.mask_mod, T, device)

    @torch.no_grad()
    def topk_boundaries(self, q, k, mask):  # (B, H, T): from every pair's scores
        return topk_boundary(self.scores(q, k).masked_fill(~mask, float('-inf')), self.topk)[..., 0]


def krause_topk_schedule(topk, n_layer):
    """ViT top-k over depth, k at the first layer to 2k at the last: round(linspace(k, 2k, n_layer))."""
    return [round(x) for x in torch.linspace(topk, 2 * topk, n_layer, dtype=torch.float64).tolist()]
