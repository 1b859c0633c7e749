"""attention='dex': differential extension, a learned map of softmax's output subtracted (docs/rules.md#dex)."""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from attention import SoftmaxAttention
from machinery.heads import weights_of_linear_map
from machinery.masks import visible_keys


@dataclass
class DEXConfig:
    dex_heads: int = 0           # DEX: heads with the differential step, the layer's last; 0 = half (n_head // 2, >= 1)
    dex_lambda: float = 0.1      # DEX: initial λ in (0, 1), learned per head as its logit (λ = sigmoid)
    dex_init: str = 'zero'       # DEX: f_D's initial W, 'zero' (y = O: softmax at init) or 'identity' (y = (1 - λ)O)


class DEXAttention(SoftmaxAttention):
    """
    O = softmax(q kᵀ / √D + mask) v,   y = O - λ_h · f_D(O),   f_D(O) = O W_hᵀ      on the last dex_heads heads
    y = O                                                                            on the others
    ("Understanding Differential Transformer Unchains Pretrained Self-Attentions", Kong, Jang, Kwak 2025,
    arXiv 2505.16333, Fig. 9; docs/rules.md#dex)

    Differential Extension: the softmax scores are kept as they are and a λ-weighted map of each selected head's
    output is subtracted from it, the paper's way of giving a (pretrained) softmax model what differential attention
    has. No code was released; the paper calls f_D a projection, anneals λ and picks a layer-specific subset of heads,
    without the details. Chosen here (docs/rules.md#dex): f_D a per-head D×D linear map W_h (`f_d`, not decayed),
    starting at 0 (`dex_init`); λ_h = sigmoid(lambda_logit_h) learned per head from `dex_lambda`; the heads, each
    layer's last `dex_heads` (heads are interchangeable when trained from scratch). y is A v (I - λW_hᵀ): linear in v
    but mixing its channels, so the weights reported are A. Every path of softmax (SDPA, window, flex, cache) with
    the step after it; it acts on each token's own output, so it keeps causality.
    """
    Config = DEXConfig
    no_decay = ('f_d',)

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        H, n, lam = self.n_head, config.dex_heads, config.dex_lambda
        if not 0 <= n <= H:
            raise ValueError(f"dex_heads must be in [0, n_head={H}] (0 = half of them), got {n}")
        if not 0 < lam < 1:  # NaN and infinities fail this too
            raise ValueError(f"dex_lambda must be in (0, 1), got {lam}")
        if config.dex_init not in ('zero', 'identity'):
            raise ValueError(f"dex_init must be 'zero' or 'identity', got '{config.dex_init}'")
        n = n or max(1, H // 2)
        self.first_head = H - n  # heads first_head..H-1 take the differential step
        self.lambda_logit = nn.Parameter(torch.full((n,), math.log(lam / (1 - lam))))
        eye = torch.eye(self.head_dim).expand(n, -1, -1)
        self.f_d = nn.Parameter(eye.clone() if config.dex_init == 'identity' else torch.zeros_like(eye))  # (n, D, D)

    def dex_step(self, o):  # (B, H, T, D): O - λ_h·O W_hᵀ on the selected heads
        kept, chosen = o[:, :self.first_head], o[:, self.first_head:]
        lam = torch.sigmoid(self.lambda_logit).to(o.dtype).view(1, -1, 1, 1)  # the activations' dtype (bf16 stays bf16)
        return torch.cat([kept, chosen - lam * (chosen @ self.f_d.transpose(-1, -2).to(o.dtype))], 1)

    def attend(self, q, k, v):
        return self.dex_step(super().attend(q, k, v))

    def attend_fused(self, q, k, v):
        return self.dex_step(super().attend_fused(q, k, v))

    def attend_flex(self, q, k, v, masks=None):
        return self.dex_step(super().attend_flex(q, k, v, masks))

    def decode(self, q, k, v, cache):  # softmax's cache: every key, or the window's ring
        return self.dex_step(super().decode(q, k, v, cache))

    def ideal_flops(self, T):  # softmax's, and each selected head's D×D map
        C, D = self.n_head * self.head_dim, self.head_dim
        return 4 * C * visible_keys(self, T).mean().item() + 2 * D * D * (self.n_head - self.first_head)

    @torch.no_grad()
    def attention_weights(self, *tensors):
        """A, the softmax weights every head keeps (y = A v (I - λW_hᵀ) mixes v's channels: no one T×T matrix)."""
        softmax = SoftmaxAttention.attend_fused if self.fused else SoftmaxAttention.attend
        return weights_of_linear_map(lambda q, k, v: softmax(self, q, k, v), *tensors)
