"""
How much worse is cluster attention than the softmax attention it replaces? Swap it into a trained softmax GPT with
the same q, k, v and output weights, its seeds found by spherical k-means on that model's own keys (per layer and
head, on training batches), and report per layer ||y_cluster - y_softmax|| / ||y_softmax|| (each layer fed the
softmax model's own input to that layer) and the validation loss with every layer swapped.

$ python studies/cluster_swap.py --out_dir=out-shakespeare-char --cluster_chunk=8 --cluster_ms=4,16,64
$ python studies/cluster_swap.py --out_dir=RUN --cluster_ms=16 --swap_out_dir=RUN-swap   # and keep the swapped model

--swap_out_dir=DIR writes the swapped model of the first m as DIR/ckpt.pt, a run of its own: train.py scores it as
any run (--init_from=resume --eval_only=True, with the row's --attention=cluster --cluster_m=M ... settings), and
sample.py reads it. Its optimizer state is fresh (the swap trained nothing); the rest is the softmax run's.

The validation batches are drawn as train.py's evaluation draws them (eval_iters batches, rows from a generator
seeded seed + 1, support.data.Batches), so with the run's seed and eval_iters the softmax row repeats the
checkpoint's last `val loss`. With cluster_chunk >= the context there is no earlier chunk and nothing changes.
"""
import json
import os
import sys
from dataclasses import replace

import torch
import torch.nn.functional as F

if __package__ in (None, ''):  # run as a script: the repo root on the path, as for prepare/
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from model import GPT, layer_inputs_outputs
from prepare import ROOT, check_files
from support.atomic import save_checkpoint
from support.loading import checkpoint_path, load_checkpoint, load_run
from support.checks import (check_distinct, check_fits, check_folder, check_int_list, check_or_exit, check_ranges,
                            script_settings)
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
swap_out_dir = ''                  # also write the swapped model of the first m there (DIR/ckpt.pt); '' = none
json_out = False                   # also print one JSON line per m (the lab reads them)


def check_cluster_swap_settings(c):
    """ValueError naming the first bad setting, before the checkpoint is opened."""
    if not c['out_dir']:
        raise ValueError("out_dir is empty; pass --out_dir=DIR of a softmax GPT trained by train.py")
    check_distinct('cluster_ms', check_int_list(c, 'cluster_ms', '4,16,64'))
    check_ranges(c, at_least_one=('cluster_chunk', 'kmeans_batches', 'eval_iters'), not_negative=('kmeans_iters',))
    check_fits([(8 * c[k], f"the rows of {k}", {k: c[k]}) for k in ('kmeans_batches', 'eval_iters')], 'cpu',
               doing='drawing the batches')  # at least a row index each, int64
    if not c['cluster_sharpness'] > 0:
        raise ValueError(f"cluster_sharpness={c['cluster_sharpness']} must be positive; pass e.g. "
                         f"--cluster_sharpness=20")
    check_folder(c, 'data_dir', "the dataset the checkpoint was trained on")
    if c['swap_out_dir'] and os.path.abspath(c['swap_out_dir']) == os.path.abspath(c['out_dir']):
        raise ValueError(f"swap_out_dir={c['swap_out_dir']} is out_dir: the swap would replace the softmax run's "
                         f"checkpoint; pass --swap_out_dir=ANOTHER_DIR")


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
    if not isinstance(softmax, GPT):  # a ViT: its blocks and batches are another model's
        raise SystemExit(f"error: {out_dir} holds a ViT image classifier ({run.config.get('dataset')}); the swap "
                         f"starts from a softmax GPT: pass --out_dir=DIR of one (text or pixels)")
    if softmax.config.attention != 'softmax' or softmax.config.window or softmax.config.mix:
        raise SystemExit(f"error: {out_dir} holds a '{softmax.config.attention}' model; the swap starts from full "
                         f"softmax")
    dataset, T, batch_size = run.config['dataset'], softmax.config.block_size, run.config['batch_size']
    keys_per_head, most = kmeans_batches * batch_size * T, max(int(m) for m in cluster_ms.split(','))
    if most > keys_per_head:  # k-means starts from m distinct keys of those it is fitted to
        raise SystemExit(f"error: cluster_ms={cluster_ms}: m={most} is more than the {keys_per_head:,} keys per head "
                         f"that k-means fits the seeds to (kmeans_batches={kmeans_batches} x the run's batch_size "
                         f"{batch_size} x block_size {T}); pass --cluster_ms with each m at most {keys_per_head} (or "
                         f"more --kmeans_batches)")
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
        loss, errors = val_loss(swapped), (err / ref).sqrt().tolist()
        print(f"| {m} | {' | '.join(f'{e:.3f}' for e in errors)} | {loss:.4f} | {loss - base:+.4f} |")
        if json_out:
            print(json.dumps({'cluster_m': m, 'val_loss': loss, 'softmax_val_loss': base, 'rel_errors': errors}))
        if swap_out_dir and m == int(cluster_ms.split(',')[0]):
            path = save_swapped(swapped, dict(cluster_m=m, cluster_chunk=cluster_chunk,
                                              cluster_sharpness=cluster_sharpness))
            print(f"wrote the swapped model (m = {m}) to {path}")


def save_swapped(swapped, overrides):
    """swap_out_dir/ckpt.pt: the softmax run's checkpoint with the swapped model's weights, its settings (attention
    'cluster' and `overrides`) and a fresh optimizer state of its parameters (the swap trained nothing)."""
    source = checkpoint_path(out_dir)
    checkpoint = load_checkpoint(source, 'cpu')
    path = checkpoint_path(swap_out_dir)
    if os.path.exists(path) and not load_checkpoint(path, 'cpu').get('swapped_from'):
        raise SystemExit(f"error: {path} holds a run that is not a swap; nothing was written; pass "
                         f"--swap_out_dir=A_NEW_DIR")
    changed = {'attention': 'cluster', **overrides}
    config = {**checkpoint['config'], **changed, 'out_dir': swap_out_dir}
    optimizer = swapped.configure_optimizers(config['weight_decay'], config['learning_rate'],
                                             (config['beta1'], config['beta2']), 'cpu')
    os.makedirs(swap_out_dir, exist_ok=True)
    save_checkpoint({**checkpoint, 'model': swapped.state_dict(), 'optimizer': optimizer.state_dict(),
                     'model_args': {**checkpoint['model_args'], **changed}, 'config': config,
                     'swapped_from': source}, path)
    return path


if __name__ == '__main__':
    main()
