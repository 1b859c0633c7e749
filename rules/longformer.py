"""attention='longformer': softmax on a sliding window, with global tokens in the ViT (docs/rules.md#longformer)."""
import math
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import and_masks, or_masks

from attention import Attention
from machinery.band import band_keys, band_layout, band_queries, unband
from machinery.caches import KVCache, decode_sdpa
from machinery.heads import weights_of_linear_map
from machinery.masks import (band_mask, dense_mask, global_tokens_mask, run_flex, sliding_window_mask,
                             two_sided_window_mask, visible_keys)


def longformer_reference(q, k, v, visible, n_global=0, qg=None, kg=None, vg=None):
    """The formula, every (i, j) pair at once: (B, H, T, D) q, k, v, the pattern N_i as a (T, T) bool, G and (the ViT
    where G > 0) the global rows' qg, kg, vg. O(T²) memory: the reference the other paths equal
    (tests/test_longformer.py); `attend` computes the same on the band of keys around each tile of queries, plus the
    G global keys, and the G global rows apart. No dropout."""
    D, G = q.size(-1), min(n_global, q.size(2))
    s = q @ k.transpose(-1, -2) / math.sqrt(D)                     # q_i·k_j/√D, (B, H, T, T)
    y = s.masked_fill(~visible, float('-inf')).softmax(-1) @ v     # y_i = Σ_{j ∈ N_i} softmax_j(s_ij) v_j, (B, H, T, D)
    if not G:
        return y
    s_global = qg[:, :, :G] @ kg.transpose(-1, -2) / math.sqrt(D)  # i < G: qg_i·kg_j/√D, every j, (B, H, G, T)
    return torch.cat([s_global.softmax(-1) @ vg, y[:, :, G:]], 2)  # the G global rows first, (B, H, T, D)


@dataclass
class LongformerConfig:
    longformer_window: int = 32       # Longformer: the first layer's W (GPT: i-W < j <= i; ViT: |i-j| <= W//2)
    longformer_window_last: int = 0   # Longformer: the last layer's W, rounded linear steps between (0: W everywhere)
    longformer_global: int = -1       # Longformer ViT: the first G tokens are global; -1: 1 (CLS) in a ViT, 0 in a GPT


class LongformerAttention(Attention):
    """
    GPT:  y_i = Σ_{i-W_l < j <= i} softmax_j(q_i·k_j / √D) v_j                        W_l: layer l's window
    ViT:  y_i = Σ_{j ∈ N_i} softmax_j(q_i·k_j / √D) v_j,   N_i = {j : |i-j| <= ⌊W_l/2⌋} ∪ {j < G}  i >= G
          y_i = Σ_j softmax_j(qg_i·kg_j / √D) vg_j,  every j; qg, kg, vg from Q_g, K_g, V_g         i < G
    ("Longformer: The Long-Document Transformer", Beltagy, Peters, Cohan 2020, arXiv 2004.05150, §3.1, §4.1;
    docs/rules.md#longformer)

    Softmax on a sparse pattern. The GPT form is the paper's autoregressive one: a window of the last W_l keys,
    growing with depth from longformer_window (layer 0) to longformer_window_last (the last layer) in rounded linear
    steps (the paper: small windows low, large ones high; the steps between are unpublished); no dilation. The ViT
    form is its bidirectional one: a two-sided window, and the first G tokens (the CLS) global: they attend to every
    token and every token attends to them. A global row uses its own projections Q_g, K_g, V_g (c_attn three
    blocks wider; copies of Q, K, V at init, init_extra), as the official code does; every other row sees the global
    tokens through their ordinary keys and values. Math path: each tile of queries against the band of keys that can
    reach it, plus the G global keys: O(T·(W + G)); the global rows apart, O(G·T); no T×T tensor. attend_fused: the
    same through SDPA. The formula as dense code, O(T²): longformer_reference (attend_reference). Flex: the
    pattern's BlockMask (or_masks of window and globals), the global rows replaced after. Cache (GPT): a ring of the
    last W_l keys and values.
    """
    has_bidirectional_form, has_cache, has_flex, fused = True, True, True, True
    Config = LongformerConfig

    def __init__(self, config, layer_idx):
        first, last, G = config.longformer_window, config.longformer_window_last, config.longformer_global
        if first < 1 or last < 0:
            raise ValueError(f"longformer_window must be >= 1 and longformer_window_last >= 0 (0: the same), got "
                             f"{first}, {last}")
        if G < -1:
            raise ValueError(f"longformer_global must be >= -1 (-1: 1 in a ViT, 0 in a GPT), got {G}")
        if config.causal and G > 0:
            raise ValueError(f"longformer_global must be 0 or -1 in a GPT (causal=True), got {G}: a global token "
                             f"attends to every token, the future too (the paper's language model has none)")
        self.n_global = (0 if config.causal else 1) if G == -1 else G
        if self.n_global > config.block_size:
            raise ValueError(f"longformer_global must be <= block_size={config.block_size}, got {self.n_global}")
        if self.n_global:
            self.projections = ('q', 'k', 'v', 'qg', 'kg', 'vg')  # set before the frame sizes c_attn from it
            self.first_token_note = "token 0 is a global token: every query sees it by construction"
        super().__init__(config, layer_idx)
        self.layer_window = longformer_windows(first, last, config.n_layer)[layer_idx]
        self.half = self.layer_window // 2  # the ViT: keys on each side
        if self.causal:
            self.mask_mod = self.band_mod = sliding_window_mask(self.layer_window)
        else:
            self.mask_mod = longformer_mask(self.half, self.n_global)         # the whole pattern (flex)
            self.band_mod = longformer_band_mask(self.half, self.n_global)   # the band's share of it

    def attend_reference(self, q, k, v, *global_qkv):  # the formula (longformer_reference) with this layer's N_i, G
        visible = dense_mask(self.mask_mod, q.size(2), q.device)
        return longformer_reference(q, k, v, visible, self.n_global, *global_qkv)

    def init_extra(self):  # Q_g, K_g, V_g start as copies of Q, K, V (§3.1): c_attn's second half = its first
        if self.n_global:
            with torch.no_grad():
                for p in (self.c_attn.weight, self.c_attn.bias):
                    if p is not None:
                        p[p.size(0) // 2:].copy_(p[:p.size(0) // 2])

    def attend(self, q, k, v, *global_qkv):  # (B, H, T, D) each; the ViT's qg, kg, vg after them where G > 0
        return self.longformer(q, k, v, *global_qkv, fused=False)

    def attend_fused(self, q, k, v, *global_qkv):
        return self.longformer(q, k, v, *global_qkv, fused=True)

    def longformer(self, q, k, v, *global_qkv, fused):
        T = q.size(2)
        tile, behind, ahead = self.band(T)
        keys, values = band_keys(k, tile, behind, ahead), band_keys(v, tile, behind, ahead)  # (B, H, n, width, D)
        visible = band_mask(self.band_mod, T, tile, behind, q.device, ahead)                  # (n, tile, width)
        G = min(self.n_global, T)
        if G:  # every query also sees the G global keys, once: as columns of their own (the band's mask drops them)
            n = keys.size(2)
            keys, values = (torch.cat([t[:, :, None, :G].expand(-1, -1, n, -1, -1), band], 3)
                            for t, band in ((k, keys), (v, values)))                          # (B, H, n, G+width, D)
            visible = torch.cat([visible.new_ones(n, tile, G), visible], -1)
        y = unband(self.softmax_attention(band_queries(q, tile), keys, values, visible, fused), T)
        return self.with_global_rows(y, global_qkv, fused)  # (B, H, T, D)

    def band(self, T):
        """(tile, behind, ahead): each tile of queries against keys from `behind` before it to `ahead` after it."""
        if self.causal:
            _, tile, lookback = band_layout(self.layer_window, T)
            return tile, lookback, 0
        _, tile, reach = band_layout(max(self.half, 1), T)  # reach >= half, a whole number of tiles
        return tile, reach, reach

    def softmax_attention(self, q, k, v, visible, fused):  # softmax(q kᵀ/√D, -inf where not visible) v
        if fused:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=visible,
                                                  dropout_p=self.dropout if self.training else 0.0)
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
        if visible is not None:
            scores = scores.masked_fill(~visible, float('-inf'))
        return F.dropout(scores.softmax(-1), self.dropout, self.training) @ v

    def with_global_rows(self, y, global_qkv, fused):
        """y with its first G rows replaced: qg of the global tokens against kg, vg of every token, (B, H, G, T)."""
        G = min(self.n_global, y.size(2))
        if not G:
            return y
        qg, kg, vg = global_qkv
        return torch.cat([self.softmax_attention(qg[:, :, :G], kg, vg, None, fused), y[:, :, G:]], 2)

    def attend_flex(self, q, k, v, *global_qkv, masks=None):
        # the whole pattern's BlockMask (its global rows, computed with q, k, v, are replaced: G x T through SDPA)
        y = run_flex(q, k, v, block_mask=self.flex_masks(q.size(2), q.device) if masks is None else masks)
        return self.with_global_rows(y, global_qkv, fused=True)

    def new_cache(self):  # a ring of the last W_l keys and values: constant memory
        if not self.causal:
            raise ValueError("the bidirectional (ViT) Longformer does not generate; a cache is for the GPT form")
        return KVCache(self.layer_window)

    def fill(self, cache, q, k, v):
        cache.append(k, v)

    def decode(self, q, k, v, cache):  # (B, H, 1, D): the ring holds exactly the keys the new query sees
        cache.append(k, v)
        return decode_sdpa(q, *cache.tensors())

    def ideal_flops(self, T):  # softmax's products on the pattern (the window, the global rows and columns)
        C = self.n_head * self.head_dim
        return 4 * C * visible_keys(self, T).mean().item()

    @torch.no_grad()
    def attention_weights(self, *tensors):
        """(B, H, T, T), each row a distribution: rows >= G over v, the G global rows over vg (two v's, so the
        frame's identity basis is run once for each)."""
        if not self.n_global:
            return super().attention_weights(*tensors)
        q, k, v, qg, kg, vg = tensors
        path = self.path(q.device, flex=False)
        local = weights_of_linear_map(lambda *qkv: path(*qkv, qg, kg, vg), q, k, v)
        rows = weights_of_linear_map(lambda *global_qkv: path(q, k, v, *global_qkv), qg, kg, vg)
        G = min(self.n_global, q.size(2))
        return torch.cat([rows[:, :, :G], local[:, :, G:]], 2)


def longformer_windows(first, last, n_layer):
    """Each layer's window: `first` at layer 0 to `last` at the last layer, round(linspace) between; last = 0:
    `first` in every layer."""
    return [round(x) for x in torch.linspace(first, last or first, n_layer, dtype=torch.float64).tolist()]


@lru_cache(maxsize=None)
def longformer_mask(half, n_global):  # the bidirectional pattern (the paper's Fig. 2d): the window or a global token
    return or_masks(two_sided_window_mask(half), global_tokens_mask(n_global))


@lru_cache(maxsize=None)
def longformer_band_mask(half, n_global):  # the band's share: the window less the global keys (columns of their own)
    return and_masks(two_sided_window_mask(half), lambda b, h, q_idx, kv_idx: kv_idx >= n_global)
