"""attention='linear': linear attention, a kernel in place of exp: an O(D²) state (docs/rules.md#linear)."""
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attention import Attention
from machinery.band import band_queries, exclusive_cumsum, unband
from machinery.masks import causal_mask, dense_mask


def linear_reference(q, k, v, visible, eps):
    """The formula, every (i, j) pair at once: (B, H, T, D) q, k, v, Vis as a (T, T) bool (None: every pair), ε.
    O(T²) memory: the reference the other paths equal (tests/test_linear.py); `attend` computes the same without the
    T×T matrix: the sums over j first, the D×D state S and z (the GPT's chunk by chunk), then φ(q_i) against them."""
    a = (F.elu(q) + 1) @ (F.elu(k) + 1).transpose(-1, -2)    # φ(q_i)·φ(k_j), φ = elu + 1, (B, H, T, T)
    a = a if visible is None else a.masked_fill(~visible, 0)  # j in Vis(i) only
    return (a @ v) / (a.sum(-1, keepdim=True) + eps)          # φ(q_i)ᵀS_i / (φ(q_i)ᵀz_i + ε), (B, H, T, D)


@dataclass
class LinearConfig:
    linear_chunk: int = 64       # linear GPT: tokens per chunk (causal C×C within it, the D×D state carried across)
    linear_eps: float = 1e-6     # linear: ε added to the denominator φ(q_i)·z_i (fast-transformers' default)


class LinearAttention(Attention):
    """
    φ(x) = elu(x) + 1,   o_i = φ(q_i)ᵀ S_i / (φ(q_i)ᵀ z_i + ε)                          per head; no 1/√D
    S_i = Σ_{j∈Vis(i)} φ(k_j) v_jᵀ (D×D),   z_i = Σ_{j∈Vis(i)} φ(k_j) (D)
    ("Transformers are RNNs: Fast Autoregressive Transformers with Linear Attention", Katharopoulos, Vyas, Pappas,
    Fleuret 2020, arXiv 2006.16236, §3.2-3.4; docs/rules.md#linear)

    Softmax's exp(q·k) replaced by the kernel φ(q)·φ(k) > 0: a row's weights φ(q_i)·φ(k_j) / (φ(q_i)·z_i + ε) are
    still a distribution (up to ε), and the sums over keys factor out of the queries: O(T·D²), no T×T. Nothing is
    learned beyond q, k, v, and there is no dropout on the weights (the authors' code has none). ViT: one S and z
    over all tokens. GPT, in chunks of `linear_chunk` tokens: the causal C×C form within a chunk, and across, the
    state of all earlier chunks (an exclusive cumulative sum over chunks of φ(K_c)ᵀV_c: n × D×D, never T × D×D);
    memory linear in T, backward included. Sums over chunks and the cache are float32 or wider (bf16 would drift).
    The cache is the paper's RNN (§3.4): S and z, O(D²) per head at any length. No flex path: the math path is
    already dense matmuls. The formula on every (i, j) pair, O(T²): `linear_reference`.
    """
    Config = LinearConfig
    has_bidirectional_form, has_cache = True, True

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        if not config.linear_chunk >= 1:
            raise ValueError(f"linear_chunk must be >= 1, got {config.linear_chunk}")
        if not (config.linear_eps > 0 and math.isfinite(config.linear_eps)):
            raise ValueError(f"linear_eps must be a finite number > 0, got {config.linear_eps}")
        self.chunk, self.eps = config.linear_chunk, config.linear_eps

    def attend_reference(self, q, k, v):  # the formula (linear_reference) with this layer's Vis(i) and ε
        T = q.size(2)
        return linear_reference(q, k, v, dense_mask(causal_mask, T, q.device) if self.causal else None, self.eps)

    def attend(self, q, k, v):
        q, k = elu_plus_one(q), elu_plus_one(k)  # (B, H, T, D), > 0
        return (self.attend_chunks if self.causal else self.attend_all)(q, k, v)

    def attend_all(self, q, k, v):  # bidirectional: S and z of the whole sequence; q, k are φ(q), φ(k)
        S, z = linear_sums(k, v)                                                  # (B, H, D, D), (B, H, 1, D)
        return self.divide(*linear_readout(q, S, z), v.dtype)

    def attend_chunks(self, q, k, v):  # causal, chunkwise; q, k are φ(q), φ(k)
        T, L = q.size(2), min(self.chunk, q.size(2))
        qc, kc, vc = (band_queries(t, L) for t in (q, k, v))  # (B, H, n, L, D); padded keys φ(k) = 0 add nothing
        S, z = carried_state(kc, vc)                                              # (B, H, n, D, D), (B, H, n, 1, D)
        numerator, denominator = linear_readout(qc, S, z)                         # the earlier chunks
        weights = torch.tril(qc @ kc.transpose(-1, -2))                           # (B, H, n, L, L): j <= i within
        numerator = numerator + weights @ vc
        denominator = denominator + weights.sum(-1, keepdim=True, dtype=denominator.dtype)
        return unband(self.divide(numerator, denominator, v.dtype), T)         # (B, H, T, D)

    def divide(self, numerator, denominator, dtype):  # o = φ(q)ᵀS / (φ(q)ᵀz + ε), back in the activations' dtype
        return (numerator / (denominator + self.eps)).to(dtype)

    def ideal_flops(self, T):  # per head φ(k)vᵀ into the state and φ(q)ᵀ S out, D×D each: no T in it
        return 4 * self.n_head * self.head_dim * self.head_dim

    def new_cache(self):  # S and z: O(D²) per head, whatever the length
        if not self.causal:
            raise ValueError("the bidirectional (ViT) linear form does not generate; a cache is for the GPT form")
        return LinearCache()

    def fill(self, cache, q, k, v):  # the prompt's sums
        cache.add(elu_plus_one(k), v)

    def decode(self, q, k, v, cache):  # (B, H, 1, D): the new token into the sums, then read them out
        cache.add(elu_plus_one(k), v)
        return self.divide(*linear_readout(elu_plus_one(q), cache.S, cache.z), v.dtype)


def elu_plus_one(x):  # the paper's feature map φ, > 0 everywhere
    return F.elu(x) + 1


def linear_sums(k, v):
    """φ(k) (..., T, D), v (..., T, D) -> S = Σ_j φ(k_j) v_jᵀ (..., D, D) and z = Σ_j φ(k_j) (..., 1, D), in float32
    or wider."""
    running = torch.promote_types(k.dtype, torch.float32)
    return k.to(running).transpose(-1, -2) @ v.to(running), k.sum(-2, keepdim=True, dtype=running)


def carried_state(kc, vc):
    """φ(K), V in chunks (B, H, n, L, D) -> what each chunk sees of the past, S and z over every strictly earlier
    chunk: (B, H, n, D, D), (B, H, n, 1, D), summed over chunks in float32 or wider (chunk 0: zeros)."""
    running = torch.promote_types(kc.dtype, torch.float32)
    S = exclusive_cumsum((kc.transpose(-1, -2) @ vc).to(running), 2)  # each chunk's own S in the activations' dtype
    return S, exclusive_cumsum(kc.sum(-2, keepdim=True, dtype=running), 2)


def linear_readout(q, S, z):
    """φ(q) (..., n, D) against S (..., D, D) and z (..., 1, D): the numerator φ(q)ᵀS (..., n, D) and the
    denominator φ(q)ᵀz (..., n, 1), in S's dtype."""
    q = q.to(S.dtype)
    return q @ S, (q * z).sum(-1, keepdim=True)


class LinearCache:
    """Causal linear attention between tokens, the paper's RNN: S = Σ_j φ(k_j)v_jᵀ (B, H, D, D) and z = Σ_j φ(k_j)
    (B, H, 1, D) over every token so far, in float32 or wider. O(D²) per head, any length."""

    def __init__(self):
        self.pos, self.S, self.z = 0, None, None

    def add(self, k, v):  # φ(k), v (B, H, n, D): n more tokens
        S, z = linear_sums(k, v)
        self.S, self.z = (S, z) if self.S is None else (self.S + S, self.z + z)
        self.pos += k.size(2)

    def nbytes(self):
        return sum(t.numel() * t.element_size() for t in (self.S, self.z) if t is not None)
