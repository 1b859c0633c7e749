"""attention='entmax': α-entmax attention, softmax's sparse sibling (docs/rules.md#entmax)."""
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attention import RowWeightsAttention
from machinery.masks import causal_mask, dense_mask


def entmax_reference(q, k, v, visible, alpha, iters):
    """The formula, every (i, j) pair at once: (B, H, T, D) q, k, v, Vis as a (T, T) bool (None: every pair), α, the
    bisection's steps. O(T²) memory: the reference the other paths equal (tests/test_entmax.py); `attend` computes
    the same a tile of queries at a time (RowWeightsAttention). The forward function, without dropout on the weights."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))                       # s_ij = q_i·k_j/√D, (B, H, T, T)
    s = s.to(torch.promote_types(s.dtype, torch.float32))                     # τ's sums: never in 16 bits
    s = s if visible is None else s.masked_fill(~visible, float('-inf'))      # j in Vis(i) only: p_ij = 0 elsewhere
    p = EntmaxFunction.apply(s, alpha, iters)  # p_ij = [(α-1)s_ij - τ_i]₊^(1/(α-1)), τ_i such that Σ_j p_ij = 1
    return p.to(v.dtype) @ v                                                  # y_i = Σ_j p_ij v_j, (B, H, T, D)


@dataclass
class EntmaxConfig:
    entmax_alpha: float = 1.5    # entmax: α > 1 (1.5: exact, by sort; 2: sparsemax; others: bisection); α = 1: softmax
    entmax_iters: int = 50       # entmax: bisection steps where α != 1.5 (the entmax package's n_iter)


class EntmaxAttention(RowWeightsAttention):
    """
    p_ij = [(α-1)·s_ij - τ_i]₊^(1/(α-1)),  τ_i such that Σ_j p_ij = 1,   s_ij = q_i·k_j/√D over Vis(i)
    y_i  = Σ_j p_ij v_j            α = 1.5:  p_ij = [s_ij/2 - τ_i]₊²
    ("Sparse Sequence-to-Sequence Models", Peters, Niculae, Martins 2019, arXiv 1905.05702; in attention: "Adaptively
    Sparse Transformers", Correia, Niculae, Martins 2019, arXiv 1909.00015; docs/rules.md#entmax)

    α-entmax, softmax's sparse sibling (the argmax of p·s plus the Tsallis α-entropy over the simplex): a row is
    still a distribution, but keys scoring below the row's threshold get exactly 0. α is fixed for every head
    (`entmax_alpha`; the adaptive α of Correia et al. is not here); nothing is learned beyond q, k, v, o. α = 1.5:
    τ in closed form from the sorted row (Peters et al.'s exact algorithm); any other α > 1: `entmax_iters` steps of
    bisection on τ, as the `entmax` package's entmax_bisect. Both in float32 at least, whatever the activations'
    dtype; backward is entmax's Jacobian (EntmaxFunction). Math path (query tiles of tile_weights // T rows)
    and cache: RowWeightsAttention's. No flex path: the weights are not exp of a score. The formula on every
    (i, j) pair, O(T²): `entmax_reference`.
    """
    Config = EntmaxConfig

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        alpha = config.entmax_alpha
        if not (math.isfinite(alpha) and alpha > 1):
            raise ValueError(f"entmax_alpha must be a finite number > 1 (1.5, or 2 for sparsemax), got {alpha}; "
                             f"α = 1 is softmax: use attention=softmax")
        if config.entmax_iters < 1:
            raise ValueError(f"entmax_iters must be >= 1, got {config.entmax_iters}")
        self.alpha, self.iters = float(alpha), config.entmax_iters

    def attend_reference(self, q, k, v):  # the formula (entmax_reference) with this layer's Vis(i), α and steps
        visible = dense_mask(causal_mask, q.size(2), q.device) if self.causal else None
        return entmax_reference(q, k, v, visible, self.alpha, self.iters)

    def row_weights(self, q, k, visible=None):  # (B, H, C, D), (B, H, L, D), (C, L) bool or None -> (B, H, C, L)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        scores = scores.to(torch.promote_types(scores.dtype, torch.float32))  # the threshold's sums: never in 16 bits
        if visible is not None:  # a hidden key scores -inf: its weight is exactly 0
            scores = scores.masked_fill(~visible, float('-inf'))
        return F.dropout(EntmaxFunction.apply(scores, self.alpha, self.iters), self.dropout, self.training)



class EntmaxFunction(torch.autograd.Function):
    """α-entmax along the last dim of scores (float32 or wider; -inf: weight 0), with its Jacobian in backward:
    g = p^(2-α) on the support (0 off it), ds = g·dp - g·Σ(g·dp)/Σg. The support carries no gradient; a row with
    one key in its support has a zero Jacobian."""

    @staticmethod
    def forward(ctx, scores, alpha, iters):
        z = (scores - scores.amax(-1, keepdim=True)) * (alpha - 1)  # the row's maximum at 0 (p <= 1 there)
        p = entmax15_sorted(z) if alpha == 1.5 else entmax_bisect(z, alpha, iters)
        ctx.save_for_backward(p)
        ctx.alpha = alpha
        return p

    @staticmethod
    def backward(ctx, grad):
        p, = ctx.saved_tensors
        g = p.sqrt() if ctx.alpha == 1.5 else torch.where(p > 0, p, 1.0) ** (2 - ctx.alpha) * (p > 0)
        gd = g * grad
        return gd - g * (gd.sum(-1, keepdim=True) / g.sum(-1, keepdim=True)), None, None


def entmax15_sorted(z):
    """1.5-entmax of z = s/2 (max 0, -inf hidden), exactly: for the k largest z, Σ (z - τ)² = 1 gives
    τ(k) = mean - √((1 - Σ(z - mean)²)/k); the support is the k with τ(k) <= z_(k) (Peters et al.'s sort)."""
    zs = z.sort(-1, descending=True).values
    seen = zs > float('-inf')
    zs0 = zs.masked_fill(~seen, 0.0)  # hidden keys sort last: their zeros touch no visible k's sums
    k = torch.arange(1, z.size(-1) + 1, device=z.device, dtype=z.dtype)
    mean, mean_sq = zs0.cumsum(-1) / k, (zs0 * zs0).cumsum(-1) / k
    tau = mean - ((1 - k * (mean_sq - mean * mean)) / k).clamp_min(0).sqrt()
    support = ((tau <= zs) & seen).sum(-1, keepdim=True)  # >= 1: the largest z always passes
    return (z - tau.gather(-1, support - 1)).clamp_min(0) ** 2


def entmax_bisect(z, alpha, iters):
    """α-entmax of z = (α-1)·s (max 0, -inf hidden) by bisection on τ in [-1, -(1/n)^(α-1)], where Σ_j p_j(τ) goes
    from >= 1 to <= 1, then renormalised (the entmax package's entmax_bisect, ensure_sum_one)."""
    p_of = lambda tau: (z - tau).clamp_min(0) ** (1 / (alpha - 1))
    lo = torch.full_like(z[..., :1], -1.0)
    width = 1 - z.size(-1) ** (1 - alpha)
    for _ in range(iters):
        width /= 2
        lo = torch.where(p_of(lo + width).sum(-1, keepdim=True) >= 1, lo + width, lo)
    p = p_of(lo)
    return p / p.sum(-1, keepdim=True)
