"""
Seed 002's question 5: how much worse is cluster attention than the softmax attention it replaces? Swap it into a
trained softmax GPT with the same q, k, v and output weights, its seeds found by spherical k-means on that model's
own keys (per layer and head, on training batches), and report per layer ||y_cluster - y_softmax|| / ||y_softmax||
(each layer fed the softmax model's own input to that layer) and the validation loss with every layer swapped.

$ python cluster_swap.py --out_dir=out-shakespeare-char --cluster_chunk=8 --cluster_ms=4,16,64

The validation batches are train.py's (eval_iters batches, rows from seed + 1), so the softmax row repeats the
checkpoint's last `val loss`. With cluster_chunk >= the context there is no earlier chunk and nothing changes.
"""
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

if __package__ in (None, ''):  # run as a script: the repo root on the path, as for prepare/
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from model import GPT, GPTConfig
from support.checkpoint import load_checkpoint

# -----------------------------------------------------------------------------
out_dir = 'out-shakespeare-char'   # a softmax GPT trained by train.py on a text dataset
data_dir = ''                      # default: the one it was trained on
cluster_chunk = 8
cluster_ms = '4,16,64'
cluster_sharpness = 20.0           # s of the soft assignment, every head
kmeans_batches = 20                # training batches whose keys the seeds are fitted to
kmeans_iters = 25
eval_iters = 20
seed = 1337
exec(open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'configurator.py')).read())
# -----------------------------------------------------------------------------
torch.manual_seed(seed)
checkpoint = load_checkpoint(os.path.join(out_dir, 'ckpt.pt'), 'cpu', hint="train a softmax GPT first")
model_args, train_config = checkpoint['model_args'], checkpoint['config']
if model_args['attention'] != 'softmax' or model_args.get('window'):
    raise SystemExit(f"error: {out_dir} holds a '{model_args['attention']}' model; the swap starts from full softmax")
data_dir = data_dir or train_config['data_dir'] or os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'data',
                                                                train_config['dataset'])
T, batch_size = model_args['block_size'], train_config['batch_size']


def batches(split, n, generator_seed):
    """n batches of (x, y) as train.py draws them (a fresh generator per call: the same rows every time)."""
    data = np.memmap(os.path.join(data_dir, f'{split}.bin'), dtype=np.uint16, mode='r')
    rows = torch.randint(len(data) - T, (n, batch_size), generator=torch.Generator().manual_seed(generator_seed))
    for ix in rows:
        x = torch.stack([torch.from_numpy(data[i:i + T + 1].astype(np.int64)) for i in ix.tolist()])
        yield x[:, :-1], x[:, 1:]


def build(**overrides):
    model = GPT(GPTConfig(**{**model_args, **overrides}))
    missing, unexpected = model.load_state_dict(checkpoint['model'], strict=False)
    assert not unexpected and all(k.endswith(('seeds', 'log_sharpness')) for k in missing), (missing, unexpected)
    return model.eval()


@torch.no_grad()
def attention_inputs(model, x):
    """The input of every layer's attention (after ln_1), from a forward pass of the softmax model."""
    inputs = []
    hooks = [b.attn.register_forward_hook(lambda m, args, out: inputs.append(args[0])) for b in model.transformer.h]
    model(x)
    for h in hooks:
        h.remove()
    return inputs


def spherical_kmeans(keys, m, iters):
    """keys (H, N, D) -> (H, m, D) unit centres: hard assignment by cosine, centre = mean direction; an empty
    cluster keeps its centre. Initialised from m distinct random keys."""
    keys = F.normalize(keys, dim=-1)
    H, N, _ = keys.shape
    centres = torch.stack([keys[h, torch.randperm(N)[:m]] for h in range(H)])
    for _ in range(iters):
        label = (keys @ centres.transpose(1, 2)).argmax(-1)                       # (H, N)
        sums = torch.zeros_like(centres).scatter_add_(1, label.unsqueeze(-1).expand_as(keys), keys)
        centres = torch.where(sums.norm(dim=-1, keepdim=True) > 0, F.normalize(sums, dim=-1), centres)
    return centres


@torch.no_grad()
def main():
    softmax = build()
    layers = softmax.transformer.h
    keys = [[] for _ in layers]  # per layer: (H, tokens, D) pieces
    for x, _ in batches('train', kmeans_batches, seed + 2):
        for keys_l, block, x_l in zip(keys, layers, attention_inputs(softmax, x)):
            k = block.attn.project(x_l)[1]                                          # (B, H, T, D)
            keys_l.append(k.transpose(0, 1).flatten(1, 2))
    val = list(batches('val', eval_iters, seed + 1))
    val_loss = lambda model: sum(model(x, y)[1].item() for x, y in val) / len(val)
    base = val_loss(softmax)
    print(f"{out_dir}: context {T}, cluster_chunk {cluster_chunk}, sharpness {cluster_sharpness}, "
          f"seeds by spherical k-means on {kmeans_batches}x{batch_size}x{T} training tokens per head")
    print(f"softmax val loss {base:.4f} ({eval_iters} batches)")
    print(f"| m | {' | '.join(f'layer {i} rel. error' for i in range(len(layers)))} | val loss | change |")
    for m in [int(s) for s in cluster_ms.split(',')]:
        swapped = build(attention='cluster', cluster_m=m, cluster_chunk=cluster_chunk,
                        cluster_sharpness=cluster_sharpness)
        for block, keys_l in zip(swapped.transformer.h, keys):
            block.attn.seeds.copy_(spherical_kmeans(torch.cat(keys_l, 1), m, kmeans_iters))
        err, ref = torch.zeros(len(layers)), torch.zeros(len(layers))
        for x, _ in val:  # each layer on the softmax model's own input to it: the error of that layer alone
            for i, x_l in enumerate(attention_inputs(softmax, x)):
                y_full, y_cluster = layers[i].attn(x_l), swapped.transformer.h[i].attn(x_l)
                err[i] += (y_cluster - y_full).pow(2).sum()
                ref[i] += y_full.pow(2).sum()
        loss = val_loss(swapped)
        print(f"| {m} | {' | '.join(f'{e:.3f}' for e in (err / ref).sqrt().tolist())} | {loss:.4f} | "
              f"{loss - base:+.4f} |")


main()
