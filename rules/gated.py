"""attention='gated': softmax attention gated by a sigmoid of the token's input (docs/rules.md#gated)."""
from dataclasses import dataclass

import torch
import torch.nn as nn

from attention import SoftmaxAttention
from machinery.heads import split_heads, weights_of_linear_map


@dataclass
class GatedConfig:
    gated_headwise: bool = False  # gated: one gate per head (W_g: C×H); False: one per head and channel (C×C)


class GatedAttention(SoftmaxAttention):
    """
    y = softmax(q kᵀ / √D + mask) v ⊙ σ(x W_g)      per head; x the layer's input, σ(x W_g) this head's D gates
    ("Gated Attention for Large Language Models: Non-linearity, Sparsity, and Attention-Sink-Free", Qiu et al. 2025,
    arXiv 2505.06708, §2.2, position G1; docs/rules.md#gated)

    Softmax attention whose output is gated, after SDPA and before c_proj, by a sigmoid of the token's own input:
    elementwise (one gate per head and channel, W_g C×C) or headwise (`gated_headwise`, one per head, C×H). The
    gate is one more projection, fused into c_attn as the official code fuses it into q_proj (and biased when
    c_attn is, config.bias, as the official gate follows q_proj's bias): c_attn is C → 3C + C (or 3C + H), and
    `project` gives q, k, v (RoPE on q, k) and the gate's logits g (B, H, T, D or 1). It starts as the model's other
    Linears do (N(0, 0.02), zero bias): every gate near σ(0) = 1/2. Every path is softmax's (attend, SDPA, the
    window's band, flex, the cache), the gate applied after; decoding gates the new token's output by its own gate.
    """
    Config = GatedConfig
    projections = ('q', 'k', 'v', 'g')  # 'g' is not rotated: RoPE rotates the names starting with q or k

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)  # c_attn: q, k, v and an elementwise gate, 4C wide
        if not isinstance(config.gated_headwise, bool):
            raise ValueError(f"gated_headwise must be True or False, got {config.gated_headwise!r}")
        self.gate_width = self.n_head if config.gated_headwise else config.n_embd
        if config.gated_headwise:  # q, k, v and one gate per head: 3C + H wide
            self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd + self.n_head, bias=config.bias)

    def project(self, x, offset=0):  # q, k, v (B, H, T, D), as softmax's; g: the gate's logits (B, H, T, D or 1)
        qkv, g = self.c_attn(x).split([3 * self.n_head * self.head_dim, self.gate_width], dim=2)
        q, k, v = (split_heads(t, self.n_head) for t in qkv.chunk(3, dim=2))
        if self.rope is not None:  # positions enter through the queries and keys only
            q, k = self.rope(q, offset), self.rope(k, offset)
        return q, k, v, split_heads(g, self.n_head)

    def attend(self, q, k, v, g):
        return super().attend(q, k, v) * torch.sigmoid(g)

    def attend_fused(self, q, k, v, g):
        return super().attend_fused(q, k, v) * torch.sigmoid(g)

    def attend_flex(self, q, k, v, g, masks=None):
        return super().attend_flex(q, k, v, masks) * torch.sigmoid(g)

    def fill(self, cache, q, k, v, g):  # softmax's cache: keys and values; a gate is used once, by its own token
        super().fill(cache, q, k, v)

    def decode(self, q, k, v, g, cache):  # (B, H, 1, ·): the new token's output, gated by its own gate
        return super().decode(q, k, v, cache) * torch.sigmoid(g)

    @torch.no_grad()
    def attention_weights(self, q, k, v, g):
        """A, the softmax weights (B, H, T, T), as the paper reads them: the gate scales A v after, per channel."""
        return weights_of_linear_map(super().attend_fused if self.fused else super().attend, q, k, v)
