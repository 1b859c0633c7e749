"""
The frame every attention rule fits, then softmax, the rule every other is read against: `y = attn(x)`, x (B, T, C).
Read it top to bottom: the frame (`Attention`: project, attend, out); softmax, its `attend` the formula as tensor
ops; the frame of the rules whose rows need all their scores at once (entmax, ReLA); the keys every layer reads.
Each other rule is one file in rules/, named by its key; rules/__init__.py is the registry (`attention=<key>`).
What the rules are built from (the masks, the band and query tiles, the top-k selection, caches, RoPE, the
kernels) is in machinery/, none of it a rule.
Exact formulas, derivations, the papers' settings and their code's defects: docs/rules.md.
"""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from machinery.band import band_keys, band_layout, band_queries, tile_mask, tile_queries, unband
from machinery.caches import KVCache, decode_sdpa
from machinery.heads import merge_heads, split_heads, weights_of_linear_map
from machinery.masks import (FLEX_DEVICES, band_mask, block_mask, causal_mask, dense_mask, run_flex,
                             sliding_window_mask, visible_keys)
from machinery.rope import Rotary, check_rope_scaling
from machinery.kernels.triton_available import kernel_on


# -----------------------------------------------------------------------------
# the frame

class Attention(nn.Module):
    """
    The frame every rule shares: forward(x) = out(attend(*project(x))).

      project(x)   c_attn maps x to one n_embd-wide tensor per name in `projections`, each split into heads
                   (B, H, T, D); RoPE rotates those whose name starts with q or k
      attend(...)  the rule, math path: plain PyTorch, any device; takes what project returns, gives (B, H, T, D)
      out(y)       merge heads, c_proj, residual dropout

    A rule writes `attend`; everything else has a default here. Its fast paths compute the same function, and one
    method, `path`, picks what forward runs. What a rule has beyond the causal math path, it declares; tests run
    every rule on what it declares and skip the rest, saying why. A rule whose `attend` saves memory (tiles, a band,
    chunks) opens its file with its formula as code, every (i, j) pair at once, which `attend_reference` calls.
    """
    # what the rule has, declared
    has_causal_form = True          # a causal=True form (the GPT); without it, building one is a ValueError
    has_bidirectional_form = False  # a causal=False form (the ViT); without it, building one is a ValueError
    has_cache = False               # new_cache / fill / decode: GPT.generate(use_cache=True)
    has_flex = False                # attend_flex: the same function through flex_attention (flex=True on CUDA)
    fused = False                   # attend_fused: the same function through SDPA (flash on a GPU)
    has_kernel = False              # attend_kernel: the same function as a Triton kernel (machinery/, CUDA)
    # what the rest of the code reads, on Attention instances only
    projections = ('q', 'k', 'v')   # what project returns, in order; None: the rule brings its own projections
    no_decay = ()                   # names of parameters AdamW must not decay (model.configure_adamw)
    lr_scale = {}                   # {parameter name: its learning rate / the schedule's}; never mutated
    weights_note = None             # analyze.py: why attention_weights is not a distribution; None if it is
    first_token_note = None         # analyze.py: why token 0's share of the weights means nothing; None if it does
    Config = None                   # the rule's own keys, a dataclass (rules/__init__.py makes AttentionConfig of them)
    reads = ()                      # the keys it reads beyond its Config's (window, tile_weights); others refused

    def __init__(self, config, layer_idx):
        super().__init__()
        if config.n_head < 1 or config.n_embd % config.n_head:
            raise ValueError(f"n_embd={config.n_embd} must be a multiple of n_head={config.n_head}; pass e.g. "
                             f"--n_embd={max(1, config.n_head) * max(1, config.n_embd // max(1, config.n_head))}")
        if config.causal and not self.has_causal_form:
            raise ValueError(f"attention='{config.attention}' ({type(self).__name__}) has no causal form (causal=True, "
                             f"a GPT); use it in a ViT")
        if not config.causal and not self.has_bidirectional_form:
            raise ValueError(f"attention='{config.attention}' ({type(self).__name__}) has no bidirectional form "
                             f"(causal=False, a ViT); use it in a GPT")
        if config.flex and not self.has_flex:  # else it would fail at the first forward on a GPU
            raise ValueError(f"attention='{config.attention}' ({type(self).__name__}) has no flex path; pass "
                             f"--flex=False (its math path computes the same function)")
        check_rope_scaling(config)
        self.n_head, self.head_dim = config.n_head, config.n_embd // config.n_head
        self.causal, self.flex, self.dropout = config.causal, config.flex, config.dropout
        if 'tile_weights' in self.reads and not config.tile_weights >= 1:
            raise ValueError(f"tile_weights must be >= 1, got {config.tile_weights}")
        self.tile_weights = config.tile_weights  # weights per head one query tile may hold (tile_queries)
        if self.projections is None:
            return
        self.c_attn = nn.Linear(config.n_embd, len(self.projections) * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)  # GPT: the residual init
        self.resid_dropout = nn.Dropout(config.dropout)
        self.rope = (Rotary(self.head_dim, config.block_size, config.rope_base, config.rope_scaling, config.rope_factor)
                     if config.pos_emb == 'rope' else None)

    def forward(self, x, cache=None, masks=None):  # masks: this layer's flex_masks, when the model built them
        tensors = self.project(x, 0 if cache is None else cache.pos)
        if cache is not None and cache.pos:  # generation: one new token against what the cache holds
            if x.size(1) != 1:
                raise ValueError(f"a filled cache takes one token at a time, got {x.size(1)}; prefill a new cache")
            return self.out(self.decode(*tensors, cache=cache))
        y = self.attend_flex(*tensors, masks=masks) if self.path_name(x.device) == 'flex' else self.path(x.device)(*tensors)
        if cache is not None:  # prefill: the prompt computed as in training, then its state into the cache
            self.fill(cache, *tensors)
        return self.out(y)

    def project(self, x, offset=0):  # offset: the absolute position of x's first token (generation)
        tensors = [split_heads(t, self.n_head) for t in self.c_attn(x).chunk(len(self.projections), dim=2)]
        if self.rope is not None:  # positions enter through the queries and keys only
            tensors = [self.rope(t, offset) if name[0] in 'qk' else t for name, t in zip(self.projections, tensors)]
        return tuple(tensors)  # (B, H, T, D) each

    def attend(self, q, k, v):
        raise NotImplementedError

    def out(self, y):
        return self.resid_dropout(self.c_proj(merge_heads(y)))

    def path_name(self, device, flex=True):
        """The one place forward's path is chosen: 'flex' where flex=True on FLEX_DEVICES (CUDA), else 'kernel' where
        the rule's Triton kernel runs (kernel_on: CUDA), else 'fused' (SDPA) where it has one, else 'math' (attend)."""
        if flex and self.flex and torch.device(device).type in FLEX_DEVICES:
            return 'flex'
        return 'kernel' if self.has_kernel and kernel_on(device) else 'fused' if self.fused else 'math'

    def path(self, device, flex=True):  # the method path_name names; flex=False: off flex (analysis probes there)
        name = self.path_name(device, flex)
        return self.attend if name == 'math' else getattr(self, f'attend_{name}')

    def attend_flex(self, *tensors, masks=None):  # has_flex: the same function as attend, through flex_attention
        raise NotImplementedError(f"{type(self).__name__} has no flex path; set flex=False")

    def flex_masks(self, T, device):
        """What attend_flex needs that depends only on the shape (a BlockMask; Krause adds its pre-pass's mask), each
        built once per shape and cached. The model builds every layer's before the compiled graph (build_flex_masks)
        and hands them in: a graph would not see the cache and would rebuild them in every layer at every call."""
        return block_mask(self.mask_mod, T, device)

    def ideal_flops(self, T):  # the products the formula needs per token at T tokens (support/flops.py)
        raise NotImplementedError(f"{type(self).__name__} has no ideal_flops; write its closed form beside its attend")

    def init_extra(self):  # runs after the model's init (N(0, 0.02) Linears): a rule's own init goes here
        pass

    def report(self, *tensors):  # {name: tensor} the rule says of itself (cluster usage), printed at each evaluation
        return None

    def extra_loss(self):  # a training term from the last forward (routing's), read once; GPT adds every layer's
        return None

    def after_optimizer_step(self):  # updates outside the gradient after each step (routing's k-means centroids)
        pass

    # generation (has_cache): the state one layer keeps between tokens; a rule's own sit next to its attend
    def new_cache(self):  # a KVCache, or the rule's own object with `pos` and `nbytes()`
        raise NotImplementedError(f"{type(self).__name__} has no cache; generate with use_cache=False")

    def fill(self, cache, *tensors):  # store a prompt's tensors; attend has already computed the prompt
        raise NotImplementedError(f"{type(self).__name__} has no cache; generate with use_cache=False")

    def decode(self, *tensors, cache):  # one new token's tensors (B, H, 1, D): add it to cache, return its output
        raise NotImplementedError(f"{type(self).__name__} has no cache; generate with use_cache=False")

    @torch.no_grad()
    def attention_weights(self, *tensors):
        """For analysis (short T, eval mode): the (B, H, T, T) effective weights W of y = attend(...) = W v, from
        what project returns, for every rule linear in v (its last tensor). A rule that is not overrides it."""
        if self.projections is None or [name[0] for name in self.projections].count('v') != 1:
            raise NotImplementedError(f"{type(self).__name__} is not y = W v with one v; it has no single weight matrix")
        return weights_of_linear_map(self.path(tensors[0].device, flex=False), *tensors)  # forward's path off flex



# -----------------------------------------------------------------------------
# softmax

@dataclass
class SoftmaxConfig:
    window: int = 0              # softmax: sliding window of W keys (i-W < j <= i); 0 = full context


class SoftmaxAttention(Attention):
    """
    y = softmax(q kᵀ / √D + mask) v
    ("Attention Is All You Need", Vaswani et al. 2017, arXiv 1706.03762, eq. 1; docs/rules.md#softmax)

    The mask hides what a query may not see: the future in a GPT (causal), nothing in a ViT, and with `window` W
    every key but the last W, i - W < j <= i (sliding-window attention, the Krause paper's "window" baseline).
    `attend` is the formula as tensor ops, a T×T score matrix. `attend_fused`, what forward runs, hands the same
    function to F.scaled_dot_product_attention, one fused kernel (flash on a GPU), and a window shorter than T to
    the band: O(T·W) time and memory, no T×T tensor (machinery/band.py).
    """
    has_bidirectional_form = True
    has_cache = True
    has_flex = True
    fused = True
    Config, reads = SoftmaxConfig, ('window',)  # every rule built on softmax reads its window

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        if config.window < 0:
            raise ValueError(f"window must be >= 0 (0 = full context), got {config.window}")
        if config.window and not config.causal:
            raise ValueError("window (a causal sliding window) needs causal=True; use window=0 for a ViT")
        self.window = config.window
        self.mask_mod = sliding_window_mask(self.window) if self.window else causal_mask if self.causal else None

    def attend(self, q, k, v):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))                          # (B, H, T, T)
        if self.mask_mod is not None:  # a hidden key scores -inf: its weight exp(-inf) is 0
            scores = scores.masked_fill(~dense_mask(self.mask_mod, q.size(2), q.device), float('-inf'))
        weights = F.dropout(scores.softmax(-1), self.dropout, self.training)               # each row sums to 1
        return weights @ v                                                                  # (B, H, T, D)

    def attend_fused(self, q, k, v):
        T, dropout_p = q.size(2), self.dropout if self.training else 0.0
        if self.window and self.window < T:  # each query tile against the keys that can reach it: O(T·W)
            W, tile, lookback = band_layout(self.window, T)
            y = F.scaled_dot_product_attention(band_queries(q, tile), band_keys(k, tile, lookback),
                                               band_keys(v, tile, lookback), dropout_p=dropout_p,
                                               attn_mask=band_mask(self.mask_mod, T, tile, lookback, q.device))
            return unband(y, T)
        if self.window or self.mask_mod in (None, causal_mask):  # full or causal: SDPA's flag (flash on a GPU)
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=self.causal)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=dense_mask(self.mask_mod, T, q.device),
                                              dropout_p=dropout_p)  # any other mask (AttentionX's off-diagonal)

    def attend_flex(self, q, k, v, masks=None):
        # flex has no attention-weight dropout; the residual dropout in `out` still applies
        return run_flex(q, k, v, block_mask=self.flex_masks(q.size(2), q.device) if masks is None else masks)

    def new_cache(self):  # every key and value (grows with the context), or a ring of the last `window` (constant)
        return KVCache(self.window or None)

    def fill(self, cache, q, k, v):
        cache.append(k, v)

    def decode(self, q, k, v, cache):  # (B, H, 1, D): the cache holds exactly the keys the new query sees, no mask
        cache.append(k, v)
        return decode_sdpa(q, *cache.tensors())

    def ideal_flops(self, T):  # per head and query: 2·D per key scored, 2·D per value summed
        C = self.n_head * self.head_dim
        return 4 * C * visible_keys(self, T).mean().item()



# -----------------------------------------------------------------------------
# the flex masks of a model's layers, each layer asked for its own (a model calls it once per forward)

def build_flex_masks(layers, T, device):
    """Each layer's flex_masks for T tokens (attention modules, in order), or None where no layer runs flex. A model
    calls it once per forward and hands each layer its own: built once per shape, whatever the layers and calls."""
    if not any(attn.path_name(device) == 'flex' for attn in layers):
        return None
    return [attn.flex_masks(T, device) if attn.path_name(device) == 'flex' else None for attn in layers]


def flex_mask_builder(flex):
    """build_flex_masks as a model of flex=`flex` calls it: with flex, outside any compiled graph (a graph cannot see
    block_mask's cache); without, as it is (torch.compiler.disable imports torch._dynamo: 2 s at every start)."""
    return torch.compiler.disable(build_flex_masks) if flex else build_flex_masks



# -----------------------------------------------------------------------------
# the frame of the rules whose rows need all their keys' scores at once

class RowWeightsAttention(Attention):
    """
    y = W v,  W_i· = weights(q_i, k, visible(i))          a rule whose rows need all their keys' scores at once

    The frame of entmax and ReLA: a rule writes `row_weights`; its math path runs queries in tiles of
    tile_weights // T rows against the keys they see (tile_queries), so memory is linear in T, never T×T; its
    cache holds every key and value (decode: the new query's weights over all of them). No flex or fused path.
    """
    has_bidirectional_form, has_cache = True, True
    reads = ('tile_weights',)

    def row_weights(self, q, k, visible=None):  # (B, H, C, D), (B, H, L, D), (C, L) bool or None -> (B, H, C, L)
        raise NotImplementedError

    def attend(self, q, k, v):
        def tile_output(start, end, n_keys):  # queries start..end-1 against keys 0..n_keys-1
            visible = tile_mask(causal_mask, start, end, n_keys, q.device) if self.causal else None
            return self.row_weights(q[:, :, start:end], k[:, :, :n_keys], visible).to(v.dtype) @ v[:, :, :n_keys]
        return tile_queries(tile_output, q.size(2), self.tile_weights, self.causal)

    def ideal_flops(self, T):  # softmax's products: every visible key scored, every value summed
        C = self.n_head * self.head_dim
        return 4 * C * visible_keys(self, T).mean().item()

    def new_cache(self):  # every key and value: grows with the context
        return KVCache()

    def fill(self, cache, q, k, v):
        cache.append(k, v)

    def decode(self, q, k, v, cache):  # (B, H, 1, D): every cached key is visible
        cache.append(k, v)
        keys, values = cache.tensors()
        return self.row_weights(q, keys).to(v.dtype) @ values



@dataclass
class FrameConfig:
    """What every attention layer needs to know, whatever its rule. Each rule adds its own keys, beside the rule."""
    n_embd: int = 768
    n_head: int = 12
    n_layer: int = 12            # depth (the ViT's Krause top-k grows over it)
    block_size: int = 1024       # longest sequence (GPT context; ViT: 1 + number of patches)
    dropout: float = 0.0
    bias: bool = True            # bias in Linears and LayerNorms
    attention: str = 'softmax'   # a key of rules.ATTENTION
    flex: bool = False           # use the flex_attention path on CUDA
    causal: bool = True          # GPT: True; ViT: False
    grid_size: int = 0           # ViT: side of the patch grid (tokens = 1 CLS + grid_size²); 0 for sequences
    pos_emb: str = 'learned'     # 'learned' (added to the input), 'rope' (rotates q and k in every layer) or 'none'
    mix: bool = False            # GPT: a causal softmax branch beside the rule, gated per token (MixAttention)
    mix_matched: bool = False    # mix: each branch with half the heads, the pair softmax's attention parameters
    rope_base: float = 10000.0   # RoPE: the base θ of the frequencies θ^(-2i/D)
    rope_scaling: str = 'none'   # RoPE past the trained context: 'none', 'linear' (positions / s), 'ntk' (θ·s^(D/(D-2)))
    rope_factor: float = 1.0     # RoPE scaling's s: the longer context / the trained one
    tile_weights: int = 2**18    # tda, topk, entmax, rela math paths: weights per head one query tile holds (// T queries)
