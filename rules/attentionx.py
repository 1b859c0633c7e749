"""attention='attentionx': consensus discrepancy, v minus γ times softmax attention (docs/rules.md#attentionx)."""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from attention import SoftmaxAttention
from machinery.masks import off_diagonal_mask
from machinery.temperature import LearnedTemperature


@dataclass
class AttentionXConfig:
    attnx_gamma: float = 1.0     # AttentionX: y = v - γ·softmax(qkᵀ/√D)v; paper: 3 (GPT), 1 (ViT, diagonal masked)
    attnx_learnable_gamma: bool = False  # AttentionX: γ a learned parameter per head, initialised at attnx_gamma
    attnx_mask_diagonal: bool = False    # AttentionX: no token attends to itself (paper's ViT); needs causal=False
    attnx_learned_temperature: bool = False  # AttentionX: t·q kᵀ, t learned per layer from 1/√D (LSA's; paper's ViT)



class AttentionX(LearnedTemperature, SoftmaxAttention):
    """
    y = v - γ · softmax(q kᵀ / √D + mask) v      per head, then heads merged and c_proj as usual
    ("AttentionX: Exploiting Consensus Discrepancy In Attention from A Distributed Optimization Perspective",
    arXiv 2409.04275, eq. 12-13; docs/rules.md#attentionx)

    The "consensus discrepancy" between a token's own value and what it gathers from the others: with A the
    attention matrix, y = (I - γA)V; at γ = 1, I - A is the attention graph's random-walk Laplacian, a high-pass
    filter, the opposite of the smoothing AV that, stacked over layers, drives rank collapse. The paper keeps
    γ >= 1: γ = 3 for its causal nanoGPT (diagonal kept), γ = 1 for its ViT with the diagonal masked
    (`attnx_mask_diagonal`: a token attends only to the others). γ is fixed, or learned per head
    (`attnx_learnable_gamma`). The paper's ViT is an LSA ViT: `attnx_learned_temperature` puts LSA's learned
    temperature in A, softmax(t·q kᵀ + mask) (LearnedTemperature); with the diagonal masked, A is LSA's exactly.
    A is SoftmaxAttention's, on each of its paths (SDPA, the window, flex, the cache); the masked diagonal is
    `off_diagonal_mask`, a boolean SDPA mask (no flash).
    """
    Config = AttentionXConfig

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        if not math.isfinite(config.attnx_gamma):
            raise ValueError(f"attnx_gamma must be a finite number, got {config.attnx_gamma}")
        if config.attnx_mask_diagonal and config.causal:
            raise ValueError("attnx_mask_diagonal=True needs causal=False: with causal attention the first token "
                             "would see no key at all; use it in a ViT, or keep the diagonal in a GPT")
        self.mask_diagonal = config.attnx_mask_diagonal
        if self.mask_diagonal:
            self.mask_mod = off_diagonal_mask
        gamma = torch.full((self.n_head,), float(config.attnx_gamma))
        if config.attnx_learnable_gamma:
            self.gamma = nn.Parameter(gamma)  # 1-D, so AdamW does not decay it
        else:
            self.register_buffer('gamma', gamma, persistent=False)
        self.init_temperature(config.attnx_learned_temperature)  # one t per layer, as the paper's LSA ViT has

    def discrepancy(self, v, y):
        # v - γ_h·y in one op (no γ·y temporary: one (B, H, T, D) tensor less at the peak); γ in the activations'
        # dtype, so bf16 stays bf16 under autocast
        return torch.addcmul(v, self.gamma.to(v.dtype).view(1, -1, 1, 1), y, value=-1.0)

    def attend(self, q, k, v):
        return self.discrepancy(v, super().attend(q, k, v))

    def attend_fused(self, q, k, v):
        return self.discrepancy(v, super().attend_fused(q, k, v))

    def attend_flex(self, q, k, v, masks=None):
        return self.discrepancy(v, super().attend_flex(q, k, v, masks))

    def decode(self, q, k, v, cache):  # softmax's cache (all keys, or the window's ring); the diagonal is kept
        return self.discrepancy(v, super().decode(q, k, v, cache))

    def attention_weights(self, *tensors):
        """A, the softmax weights, from the frame's effective weights I - γA of y = v - γ·A v (analyze.py reports A,
        the paper's attention matrix)."""
        if not self.gamma.all():
            raise NotImplementedError("a head has γ = 0: y = v, A does not reach the output")
        effective = super().attention_weights(*tensors)
        eye = torch.eye(effective.size(-1), dtype=effective.dtype, device=effective.device)
        return (eye - effective) / self.gamma.to(effective.dtype).view(1, -1, 1, 1)
