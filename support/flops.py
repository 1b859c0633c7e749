"""
Attention FLOPs per token: what a rule's path computes, counted by PyTorch, beside what its formula needs.

  counted  torch.utils.flop_counter.FlopCounterMode around one layer's path as forward runs it on `device` (attn.path:
           flex, SDPA or the math path; for a Triton kernel, the math path's products), on one sequence of T tokens,
           divided by T. It counts matrix products only, 2 FLOPs a multiply-add (softmax, exp, norms and other
           elementwise work are not counted), and an SDPA call as the whole T×T product whatever its mask (PyTorch's
           formula, here also for the CPU's kernel). The projections (c_attn, c_proj) are not in it.
  ideal    the products the rule's formula needs, by the same convention, in closed form (attn.ideal_flops): per head
           and query i, 2·D for each key it scores and 2·D for each value it sums, plus the rule's own maps. With C =
           H·D the width, n_i the keys query i sees and n̄ their mean over the T queries ((T+1)/2 causal, T
           bidirectional, T-1 with the diagonal masked, mean min(i+1, W) for a window of W, counted from the rule's
           own mask for Krause's grid and Longformer's pattern):
             softmax, gated, ssmax, attentionx, lsa, entmax, rela, diff, longformer   4·C·n̄  (diff: H/2 heads of two
                                   D-wide maps each, against 2D-wide values: the same)
             dex                   4·C·n̄ + 2·D²·(heads with the differential step)
             top-k (k)             2·C·n̄ + 2·C·mean min(k, n_i)        every visible key scored, k summed
             krause (k)            2·C·n̄ + 2·C·mean min(k, n_i)        n_i: the window or the grid neighbourhood
             tda (views V = 2, TRA 1)  (2V·d/D + 2)·C·n̄              V score maps d wide (matched: D/2), one v
             routing (w, clusters K, R routing heads)  4·C·mean min(i+1, w) + 2·D·K·R   (at most: a cluster may
                                   hold fewer than w earlier keys)
             linear                4·C·D                                φ(k)vᵀ into the state, φ(q)ᵀ S out
             cluster GPT (chunk L, m)  per head 4·D·(c̄ + m̄) + 2·D·m + 2·m·(2D+1)   c̄ = mean (i mod L) + 1, m̄ = m
                                   where a chunk has earlier ones (0 in the first); assignment; Σ S·[k, v, 1]
             cluster ViT (m, iters)    per head 4·D·m + 2·D·m·(1 + 2·iters) + 2·m·(2D+1), + 4·D for the self term
                                   (one key more; its path computes it elementwise, which is not counted)
             mix                   the softmax branch's + the rule's
  The ideal leaves out what the counted leaves out (norms, Krause's ||k||², linear's φ(q)·z). A band or chunked path
  computes more than its ideal (whole tiles of keys), and SDPA is counted whole (a causal call as T×T): both show.
  Each rule writes its own beside its formula (`ideal_flops(T)`: the frame's default raises, so a rule without one
  fails tests/test_frame.py), using machinery.masks.visible_keys for n_i.
"""
import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count


def cpu_sdpa_flop(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
    return sdpa_flop_count(query_shape, key_shape, value_shape)  # PyTorch's formula for its other SDPA kernels


CPU_SDPA = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: cpu_sdpa_flop}  # not in PyTorch's table


@torch.no_grad()
def counted_flops(attn, T, device='cpu'):
    """FLOPs per token of one layer's path at T tokens (one sequence), as FlopCounterMode counts them: the path
    forward runs on `device` (attn.path; a Triton kernel's counted as the math path's)."""
    param = next(attn.parameters())
    x = torch.randn(1, T, attn.n_head * attn.head_dim, dtype=param.dtype, device=device)
    tensors = attn.project(x)
    path = attn.path(device)
    if attn.path_name(device) == 'kernel':  # a Triton kernel is no aten op FlopCounterMode sees: the same products
        path = attn.attend                    # as the math path's
    with FlopCounterMode(display=False, custom_mapping=CPU_SDPA) as counter:
        path(*tensors)
    return counter.get_total_flops() / T


def attention_flops(model, T=None, device='cpu'):
    """{'counted', 'ideal'}: attention FLOPs per token and layer, the mean over the model's layers (a Longformer's
    window and a Krause ViT's k change with depth), at T tokens (default: the model's block_size)."""
    T = T or model.config.block_size
    layers = [block.attn for block in (model.h if hasattr(model, 'h') else model.transformer.h)]
    counted = [counted_flops(attn, T, device) for attn in layers]
    ideal = [attn.ideal_flops(T) for attn in layers]
    return {'counted': sum(counted) / len(layers), 'ideal': sum(ideal) / len(layers)}
