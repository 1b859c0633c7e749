"""attention='diff': differential attention, two softmax maps per head, the second subtracted (docs/rules.md#diff)."""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from attention import Attention
from machinery.caches import KVCache
from machinery.masks import causal_mask, dense_mask, run_flex, visible_keys


@dataclass
class DiffConfig:
    diff_lambda_init: float = 0.0  # Diff: λ_init in [0, 1); 0 = the paper's depth schedule 0.8 - 0.6·exp(-0.3·layer)


class DiffAttention(Attention):
    """
    y_h = (softmax(q1 k1ᵀ / √D + mask) - λ softmax(q2 k2ᵀ / √D + mask)) [v1, v2]      differential head h: the
    o_h = (1 - λ_init) · RMSNorm(y_h)                      frame's heads 2h (q1, k1, v1) and 2h + 1 (q2, k2, v2)
    λ = exp(λq1·λk1) - exp(λq2·λk2) + λ_init,   λ_init = 0.8 - 0.6·exp(-0.3·l), l the 0-based layer
    ("Differential Transformer", Ye et al. 2024, arXiv 2410.05258, eq. 1-3; docs/rules.md#diff)

    Two softmax maps per head, the second subtracted: noise both maps put on irrelevant keys (the sink) cancels.
    H/2 differential heads, each a pair of the frame's H heads of D = C/H, exactly the official code's layout (its
    2·H/2 q, k heads of D, its H/2 values of 2D): `project` is the frame's, c_attn and c_proj are softmax's, and the
    output's channels come back in the frame's heads (2h: o_h's first D, 2h + 1: its last D). Learned beyond
    softmax: λq1, λk1, λq2, λk2 (D each, per layer, shared by the heads, N(0, 0.1²) as the official code draws
    them) and the RMSNorm's weight (2D, eps 1e-5, shared). λ_init follows depth, or is `diff_lambda_init`. Paths:
    attend (the two maps as tensor ops, T×T), attend_fused (SDPA per half of the values: q, k, v all D wide, flash on
    a GPU), attend_flex (one call, values 2D wide), a cache of every key and value.
    """
    Config = DiffConfig
    has_bidirectional_form, has_cache, has_flex, fused = True, True, True, True
    weights_note = ("softmax1 - lam*softmax2 per pair of heads (both heads of a pair report it): signed, rows "
                    "summing to 1 - lam, and the RMSNorm after W v rescales each row")

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        if config.n_head % 2:
            raise ValueError(f"diff needs an even n_head (each differential head is a pair of heads), got "
                             f"n_head={config.n_head}")
        if not (math.isfinite(config.diff_lambda_init) and 0 <= config.diff_lambda_init < 1):
            raise ValueError(f"diff_lambda_init must be in [0, 1) (0: the depth schedule), got "
                             f"{config.diff_lambda_init}")
        self.lambda_init = config.diff_lambda_init or 0.8 - 0.6 * math.exp(-0.3 * layer_idx)
        D = self.head_dim
        self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (nn.Parameter(0.1 * torch.randn(D))
                                                                          for _ in range(4))
        self.head_norm = nn.RMSNorm(2 * D, eps=1e-5)
        self.mask_mod = causal_mask if self.causal else None

    def lam(self):  # λ, one scalar per layer
        return (torch.exp((self.lambda_q1 * self.lambda_k1).sum()) - torch.exp((self.lambda_q2 * self.lambda_k2).sum())
                + self.lambda_init)

    def diff_weights(self, q, k, mask=None):
        """softmax₁ - λ softmax₂ of each pair of heads, (B, H, T, L) -> (B, H/2, T, L); mask (T, L), None: all."""
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))                          # (B, H, T, L)
        if mask is not None:
            scores = scores.masked_fill(~mask, float('-inf'))
        maps = F.dropout(scores.softmax(-1), self.dropout, self.training).unflatten(1, (-1, 2))  # (B, H/2, 2, T, L)
        return maps[:, :, 0] - self.lam().to(maps.dtype) * maps[:, :, 1]

    def attend(self, q, k, v):  # (B, H, T, D) each
        mask = None if self.mask_mod is None else dense_mask(self.mask_mod, q.size(2), q.device)
        return self.norm_and_unpair(self.diff_weights(q, k, mask) @ pair_heads(v))                  # (B, H, T, D)

    def attend_fused(self, q, k, v):
        # each head's softmax of its pair's two value heads, one SDPA call per value head (v1 to both heads, then v2)
        dropout_p = self.dropout if self.training else 0.0
        halves = [F.scaled_dot_product_attention(q, k, half.repeat_interleave(2, 1), dropout_p=dropout_p,
                                                 is_causal=self.causal) for half in (v[:, 0::2], v[:, 1::2])]
        return self.subtract(torch.cat(halves, -1))

    def attend_flex(self, q, k, v, masks=None):  # one call on the H heads, each with its pair's values (2D wide)
        y = run_flex(q, k, pair_heads(v).repeat_interleave(2, 1),
                     block_mask=self.flex_masks(q.size(2), q.device) if masks is None else masks)
        return self.subtract(y)

    def subtract(self, y):  # (B, H, T, 2D): each head's softmax of its pair's values -> o (B, H, T, D)
        y = y.unflatten(1, (-1, 2))                                                      # (B, H/2, 2, T, 2D)
        return self.norm_and_unpair(y[:, :, 0] - self.lam().to(y.dtype) * y[:, :, 1])

    def norm_and_unpair(self, y):  # (B, H/2, T, 2D) -> (B, H, T, D): (1 - λ_init)·RMSNorm per differential head
        return unpair_heads(self.head_norm(y) * (1 - self.lambda_init))

    def ideal_flops(self, T):  # H/2 heads of two D-wide maps each, against 2D-wide values: softmax's products
        C = self.n_head * self.head_dim
        return 4 * C * visible_keys(self, T).mean().item()

    def new_cache(self):  # every key (B, H, n, D) and every value, paired (B, H/2, n, 2D): grows with the context
        return KVCache()

    def fill(self, cache, q, k, v):
        cache.append(k, pair_heads(v))

    def decode(self, q, k, v, cache):  # (B, H, 1, D): every cached key is visible
        cache.append(k, pair_heads(v))
        keys, values = cache.tensors()
        return self.norm_and_unpair(self.diff_weights(q, keys) @ values)

    @torch.no_grad()
    def attention_weights(self, q, k, v):
        """softmax₁ - λ softmax₂ (B, H, T, T), differential head h's for both its heads 2h and 2h + 1: head 2h + i's
        output is RMSNorm'd (with its pair) from this W times v_{2h+i}."""
        mask = None if self.mask_mod is None else dense_mask(self.mask_mod, q.size(2), q.device)
        return self.diff_weights(q, k, mask).repeat_interleave(2, 1)


def pair_heads(x):  # (B, H, T, D) -> (B, H/2, T, 2D): heads 2h and 2h + 1 side by side, one differential head's
    return x.unflatten(1, (-1, 2)).transpose(2, 3).flatten(3)


def unpair_heads(y):  # (B, H/2, T, 2D) -> (B, H, T, D), the inverse: merge_heads then gives the official layout
    return y.unflatten(-1, (2, -1)).transpose(2, 3).flatten(1, 2)
