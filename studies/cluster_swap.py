"""
How much worse is cluster attention than the softmax attention it replaces? Swap it into a trained softmax GPT with
the same q, k, v and output weights, its seeds found by spherical k-means on that model's own keys (per layer and
head, on training batches), and report per layer ||y_cluster - y_softmax|| / ||y_softmax|| (each layer fed the
softmax model's own input to that layer) and the validation loss with every layer swapped.

$ python studies/cluster_swap.py --out_dir=out-shakespeare-char --cluster_chunk=8 --cluster_ms=4,16,64

The validation batches are drawn as train.py's evaluation draws them (eval_iters batches, rows from a generator
seeded seed + 1, support.data.Batches), so with the run's seed and eval_iters the softmax row repeats the
checkpoint's last `val loss`. With cluster_chunk >= the context there is no earlier chunk and nothing changes.
"""
import os
import sys
from dataclasses import replace

import torch
import torch.nn.functional as F

if __package__ in (None, ''):  # run as a script: the repo root on the path, as for prepare/
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from model import GPT, layer_inputs_outputs
from prepare import ROOT, check_files
from support.loading import load_run
from support.checks import check_fits, check_folder, check_int_list, check_or_exit, check_ranges, script_settings
from support.data import Batches

# -----------------------------------------------------------------------------
out_dir = 'out-shakespeare-char'   # a softmax GPT trained by train.py
data_dir = ''                      # default: the one it was trained on
cluster_chunk = 8
cluster_ms = '4,16,64'
cluster_sharpness = 20.0           # s of the soft assignment, every head
kmeans_batches = 20                # training batches whose keys the seeds are fitted to
kmeans_iters = 25
eval_iters = 20
seed = 1337


def check_cluster_swap_settings(c):
    """ValueError naming the first bad setting, before the checkpoint is opened."""
    if not c['out_dir']:
        raise ValueError("out_dir is empty; pass --out_dir=DIR of a softmax GPT trained by train.py")
    check_int_list(c, 'cluster_ms', '4,16,64')
    check_ranges(c, at_least_one=('cluster_chunk', 'kmeans_batches', 'eval_iters'), not_negative=('kmeans_iters',))
    check_fits([(8 * c[k], f"the rows of {k}", {k: c[k]}) for k in ('kmeans_batches', 'eval_iters')], 'cpu',
               doing='drawing the batches')  # at least a row index each, int64
    if not c['cluster_sharpness'] > 0:
        raise ValueError(f"cluster_sharpness={c['cluster_sharpness']} must be positive; pass e.g. "
                         f"--cluster_sharpness=20")
    check_folder(c, 'data_dir', "the dataset the checkpoint was trained on")


if __name__ == '__main__':  # tests import the functions without reading the command line
    exec(open(ROOT / 'configurator.py').read())
    check_or_exit(check_cluster_swap_settings, script_settings(globals()))
# -----------------------------------------------------------------------------


def batches(reader, split, n, generator_seed):
    """n batches of (x, y) as train.py draws them from `reader` (a support.data.Batches; a fresh generator per call:
    the same rows every time)."""
    rows = torch.randint(reader.sizes[split], (n, reader.batch_size),
                         generator=torch.Generator().manual_seed(generator_seed))
    for ix in rows:
        yield reader.load_batch(split, ix)


def swapped_in(softmax, **overrides):
    """A GPT of `softmax`'s config with overrides (another rule), holding its weights; the new rule's own parameters
    (cluster seeds and sharpness) as initialised."""
    model = GPT(replace(softmax.config, **overrides))
    missing, unexpected = model.load_state_dict(softmax.state_dict(), strict=False)
    assert not unexpected and all(k.endswith(('seeds', 'log_sharpness')) for k in missing), (missing, unexpected)
    return model.eval()


@torch.no_grad()
def attention_inputs(model, x):
    """The input of every layer's attention (after ln_1), from a forward pass of the model."""
    seen = layer_inputs_outputs(model, [b.attn for b in model.transformer.h], x)
    return [seen[b.attn][0] for b in model.transformer.h]


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
    torch.manual_seed(seed)
    run = load_run(out_dir, 'cpu', hint="train a softmax GPT first")
    softmax, folder = run.model, data_dir or run.data_dir
    if softmax.config.attention != 'softmax' or softmax.config.window or softmax.config.mix:
        raise SystemExit(f"error: {out_dir} holds a '{softmax.config.attention}' model; the swap starts from full "
                         f"softmax")
    dataset, T, batch_size = run.config['dataset'], softmax.config.block_size, run.config['batch_size']
    try:
        meta, split_rows = check_files(dataset, folder)
        reader = Batches(dataset, folder, meta, split_rows, T, batch_size, 'cpu')
    except ValueError as e:
        raise SystemExit(f"error: {e} (the checkpoint was trained on {dataset}; pass --data_dir=DIR of it)")
    layers = softmax.transformer.h
    keys = [[] for _ in layers]  # per layer: (H, tokens, D) pieces
    for x, _ in batches(reader, 'train', kmeans_batches, seed + 2):
        for keys_l, block, x_l in zip(keys, layers, attention_inputs(softmax, x)):
            k = block.attn.project(x_l)[1]                                          # (B, H, T, D)
            keys_l.append(k.transpose(0, 1).flatten(1, 2))
    val = list(batches(reader, 'val', eval_iters, seed + 1))
    val_loss = lambda model: sum(model(x, y)[1].item() for x, y in val) / len(val)
    base = val_loss(softmax)
    print(f"{out_dir}: context {T}, cluster_chunk {cluster_chunk}, sharpness {cluster_sharpness}, "
          f"seeds by spherical k-means on {kmeans_batches}x{batch_size}x{T} training tokens per head")
    print(f"softmax val loss {base:.4f} ({eval_iters} batches)")
    print(f"| m | {' | '.join(f'layer {i} rel. error' for i in range(len(layers)))} | val loss | change |")
    for m in [int(s) for s in cluster_ms.split(',')]:
        swapped = swapped_in(softmax, attention='cluster', cluster_m=m, cluster_chunk=cluster_chunk,
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


if __name__ == '__main__':
    main()
