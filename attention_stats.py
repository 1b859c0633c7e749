"""
Per-layer attention statistics of a trained GPT on its own validation text (a small stand-in until the
diagnostics issue folds these into one analysis tool for every rule):

  zeros        fraction of the visible pairs (j <= i) whose weight is exactly 0 (TDA: a¹ - λa² = 0)
  first-token  mean over rows i >= 1 of |w_i0| / Σ_j |w_ij|: the share of a row's weight on the window's first
               token, the attention sink (rows with no weight at all are left out and counted as `empty`);
               `uniform` is the same mean for w_ij = 1/(i+1), the share no sink gives (SPEC §2, gSinkRatio(1))

Weights come from each layer's own projections: TDA's `attention_weights`, softmax(qkᵀ/√D) for full causal
softmax; other rules are skipped. Dense T×T per layer: for short contexts.

$ python attention_stats.py --out_dir=out-shakespeare-char --batches=10
"""
import os

import numpy as np
import torch

from attention import SoftmaxAttention, ThresholdDifferentialAttention
from model import GPT, GPTConfig
from runtime import load_checkpoint

# -----------------------------------------------------------------------------
out_dir = 'out'
data_dir = ''       # default: the data_dir the checkpoint was trained on
batches = 10
batch_size = 12
seed = 1337
exec(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'configurator.py')).read())
# -----------------------------------------------------------------------------


def weights(attn, x):
    """(B, H, T, T) attention weights of one layer on its input x (B, T, C), or None for other rules."""
    tensors = attn.project(x)
    if isinstance(attn, ThresholdDifferentialAttention):
        return attn.attention_weights(*tensors)
    if type(attn) is SoftmaxAttention and not attn.window:
        q, k, _ = tensors
        T = q.size(2)
        scores = (q @ k.transpose(-1, -2)) / q.size(-1) ** 0.5
        return scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float('-inf')).softmax(-1)
    return None


def layer_stats(w):
    """zeros among visible pairs, first-token share over non-empty rows i >= 1, fraction of empty rows."""
    T = w.size(-1)
    visible = torch.ones(T, T, dtype=torch.bool).tril()
    mass = w.abs()[..., 1:, :].sum(-1)  # (B, H, T-1): rows i >= 1
    live = mass > 0
    share = w.abs()[..., 1:, 0][live] / mass[live]
    return (w[..., visible] == 0).double().mean().item(), share.double().mean().item(), 1 - live.double().mean().item()


if __name__ == '__main__':
    torch.manual_seed(seed)
    checkpoint = load_checkpoint(os.path.join(out_dir, 'ckpt.pt'), 'cpu', hint="train a GPT first or pass --out_dir")
    model = GPT(GPTConfig(**checkpoint['model_args']))
    model.load_state_dict(checkpoint['model'])
    model.eval()
    T, trained = model.config.block_size, checkpoint['config']
    data_dir = data_dir or trained['data_dir'] or os.path.join(os.path.dirname(__file__), 'data', trained['dataset'])
    data = np.memmap(os.path.join(data_dir, 'val.bin'), dtype=np.uint16, mode='r')
    inputs = {}
    for i, block in enumerate(model.transformer.h):
        block.attn.register_forward_hook(lambda m, args, out, i=i: inputs.setdefault(i, []).append(args[0]))
    with torch.no_grad():
        for _ in range(batches):
            starts = torch.randint(len(data) - T, (batch_size,)).tolist()
            model(torch.stack([torch.from_numpy(data[s:s + T].astype(np.int64)) for s in starts]))
        print(f"{out_dir}: {batches} batches x {batch_size} val windows of {T} tokens; "
              f"uniform first-token share {np.mean([1 / (i + 1) for i in range(1, T)]):.4f}")
        for i, block in enumerate(model.transformer.h):
            w = [weights(block.attn, x) for x in inputs[i]]
            if w[0] is None:
                print(f"layer {i}: {type(block.attn).__name__} has no weights here")
                continue
            zeros, first, empty = np.mean([layer_stats(wb) for wb in w], axis=0)
            print(f"layer {i}: zeros {zeros:.4f}  first-token {first:.4f}  empty rows {empty:.4f}")
