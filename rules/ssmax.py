"""attention='ssmax': scalable-softmax, logits scaled by s·log n (docs/rules.md#ssmax)."""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from attention import SoftmaxAttention
from machinery.masks import dense_mask


@dataclass
class SSMaxConfig:
    ssmax_s: float = 0.43        # SSMax: initial s (learned per head); the logits are multiplied by s·log n


class SSMaxAttention(SoftmaxAttention):
    """
    y_i = Σ_j softmax_j((s_h · log n_i) · q_i·k_j / √D + mask_ij) v_j     n_i = |Vis(i)|: i + 1 causal, T in a ViT
    ("Scalable-Softmax Is Superior for Attention", Nakanishi 2025, arXiv 2501.19399; docs/rules.md#ssmax)

    Scalable-Softmax: softmax's largest weight fades towards 0 as a row sees more keys; multiplying the logits by
    s·log n, n the keys the row sees, keeps it from fading. s is learned per head (`scale`, 1-D so AdamW does not
    decay it), from ssmax_s. Row 0 of a GPT (n = 1) has log 1 = 0: all its logits are 0, over the one key it sees.
    With `window` W, n_i = min(i + 1, W). `attend` is the formula as tensor ops; the other paths are softmax's on
    queries scaled per row by s_h·log n_i: SDPA (attend_fused, flash on a GPU), flex (q scaled, nothing captured
    by a score_mod: a learned scalar captured there has had gradient bugs), and the cache (softmax's), where a new
    token's n is its absolute position + 1.
    """
    Config = SSMaxConfig

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        if not (math.isfinite(config.ssmax_s) and config.ssmax_s > 0):
            raise ValueError(f"ssmax_s must be a finite number > 0 (the initial s of s·log n), got {config.ssmax_s}")
        self.scale = nn.Parameter(torch.full((self.n_head,), float(config.ssmax_s)))  # s per head; 1-D: not decayed

    def row_scale(self, T, dtype, start=0):
        """(1, H, T, 1): s_h·log n_i for the T queries at positions start..start+T-1 (the ViT: n = T for all)."""
        device = self.scale.device
        n = torch.arange(start + 1, start + T + 1, device=device) if self.causal else torch.full((T,), T, device=device)
        if self.window:
            n = n.clamp_max(self.window)
        return (self.scale.view(-1, 1) * n.to(self.scale.dtype).log()).to(dtype)[None, :, :, None]

    def attend(self, q, k, v):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)) * self.row_scale(q.size(2), q.dtype)  # (B, H, T, T)
        if self.mask_mod is not None:
            scores = scores.masked_fill(~dense_mask(self.mask_mod, q.size(2), q.device), float('-inf'))
        weights = F.dropout(scores.softmax(-1), self.dropout, self.training)
        return weights @ v                                                                  # (B, H, T, D)

    def attend_fused(self, q, k, v):
        return super().attend_fused(q * self.row_scale(q.size(2), q.dtype), k, v)

    def attend_flex(self, q, k, v, masks=None):
        return super().attend_flex(q * self.row_scale(q.size(2), q.dtype), k, v, masks)

    def decode(self, q, k, v, cache):  # (B, H, 1, D): n from the new token's absolute position, cache.pos
        return super().decode(q * self.row_scale(1, q.dtype, start=cache.pos), k, v, cache)
