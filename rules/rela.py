"""attention='rela': rectified linear attention and its gated RMSNorm (docs/rules.md#rela)."""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from attention import RowWeightsAttention
from machinery.heads import merge_heads
from machinery.masks import causal_mask, dense_mask


def rela_reference(q, k, v, visible):
    """The formula's attention, every (i, j) pair at once: (B, H, T, D) q, k, v, Vis as a (T, T) bool (None: every
    pair). O(T²) memory: the reference the other paths equal (tests/test_rela.py); `attend` computes the same a tile
    of queries at a time (RowWeightsAttention). The gated RMSNorm follows in `out`, on every path. The forward
    function, without dropout on the weights."""
    a = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).relu()  # a_ij = relu(q_i·k_j/√D), (B, H, T, T)
    a = a if visible is None else a.masked_fill(~visible, 0.0)     # j in Vis(i) only: 0 elsewhere
    return a @ v                                                   # y_i = Σ_j a_ij v_j, (B, H, T, D)


@dataclass
class ReLAConfig:
    rela_eps: float = 1e-8       # ReLA: ε of the gated RMSNorm over the merged heads (the official code's: 1e-8)


class ReLAAttention(RowWeightsAttention):
    """
    a_ij = relu(q_i·k_j/√D) for j in Vis(i), else 0;   y_i = Σ_j a_ij v_j        per head, no normalisation over j
    o = g ⊙ z/√(mean(z²) + ε) ⊙ σ(w ⊙ z),   z = the merged heads (B, T, C);   then c_proj
    ("Sparse Attention with Linear Units", Zhang, Titov, Sennrich 2021, arXiv 2104.07012, ReLA-g; authors' code:
    bzhangGo/zero modules/rela.py; docs/rules.md#rela)

    Rectified linear attention: softmax replaced by a ReLU, so a key with a negative score gets exactly 0, a row
    need not sum to 1 and may be all zero (the head "switches off": y = 0, and o = 0 if every head does). The
    scale is kept in check by a gated RMSNorm over all heads between the merge and c_proj (`out`), with learned
    g (`norm_scale`, init 1) and w (`norm_gate`, init U(±√(3/C)), the official code's default: TF's variance
    scaling, fan_avg, uniform, on a vector of C), 2C parameters per layer; ε = `rela_eps` (1e-8 as there), the norm
    in float32 at least. Math path (query tiles of tile_weights // T rows) and cache: RowWeightsAttention's. The
    formula's attention on every (i, j) pair, O(T²): `rela_reference`.
    """
    Config = ReLAConfig
    weights_note = "relu(s): rows are not normalised (they may sum to anything, or be all zero), and the gated " \
                   "RMSNorm over the merged heads after W v rescales each token"

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        if not (math.isfinite(config.rela_eps) and config.rela_eps > 0):
            raise ValueError(f"rela_eps must be a finite number > 0, got {config.rela_eps}")
        self.eps = config.rela_eps
        C = config.n_embd
        self.norm_scale = nn.Parameter(torch.ones(C))                                    # g
        self.norm_gate = nn.Parameter(torch.empty(C).uniform_(-math.sqrt(3 / C), math.sqrt(3 / C)))  # w

    def attend_reference(self, q, k, v):  # the formula (rela_reference) with this layer's Vis(i)
        return rela_reference(q, k, v, dense_mask(causal_mask, q.size(2), q.device) if self.causal else None)

    def row_weights(self, q, k, visible=None):  # (B, H, C, D), (B, H, L, D), (C, L) bool or None -> (B, H, C, L)
        a = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).relu()
        if visible is not None:  # a hidden key's weight is 0, whatever its score
            a = a.masked_fill(~visible, 0.0)
        return F.dropout(a, self.dropout, self.training)

    def out(self, y):  # the gated RMSNorm between the merge and c_proj
        return self.resid_dropout(self.c_proj(self.gated_rms_norm(merge_heads(y))))

    def gated_rms_norm(self, z):  # (B, T, C): g ⊙ z/√(mean z² + ε) ⊙ σ(w ⊙ z); z = 0 gives exactly 0
        x = z.to(torch.promote_types(z.dtype, torch.float32))
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.norm_scale * normed * torch.sigmoid(self.norm_gate * x)).to(z.dtype)
