"""
What attention does in trained checkpoints: sinks, sparsity, entropy, rank collapse and token groups, per layer and head
(docs/rules.md says which weights each rule reports), on one batch of validation data, for any rule, GPT or ViT.

$ python studies/analyze.py --out_dir=out-shakespeare-char                       # a table, and out_dir/analysis.json
$ python studies/analyze.py --out_dir=out-a,out-b --plots=plots                  # several checkpoints; PNGs need matplotlib

Per layer l, from the attention weights W (B, H, T, T) of block l on its own input (every rule gives W through one
mechanism, Attention.attention_weights: the rule's `attend` run on the identity basis, y = W v):
  first-token   mean over queries i >= 1 of |w_i0| / sum_j |w_ij| (the attention sink), and its ratio to the share
                uniform weights give (mean of 1/(i+1) causal, 1/T otherwise): 1 means no sink
  sparsity      fraction of exact zeros among the visible pairs (j <= i causal, all pairs otherwise): a window or top-k
                counts as sparsity here
  entropy       mean over rows of -sum_j w_ij ln w_ij, in nats (distributions only)
and from the residual stream X (T, C) after block l (per example, then averaged over the batch):
  residual      ||X - 1 x̄ᵀ||_F / ||X||_F, x̄ the token mean (Dong et al. 2021): 0 = every token the same
  eff. rank     exp(entropy of the normalised singular values of X itself, not centred): identical tokens give 1
  groups        token groups: connected components of the graph 1[cos(x_i, x_j) > τ] for τ = 0.9, 0.95, 0.99
                (groups of tokens that have come together, not cluster attention's clusters)
A mix layer (mix=True: a softmax branch beside the rule, gated per token) reports W = g_0 W_softmax + g_1 W_rule, and
per branch its first-token share and the mean gate g_0 to the softmax branch ('branches'; dashed in the sink plot).
A metric with no meaning for a rule (its weights are not a distribution; token 0 folded into cluster summaries) is
n/a, with the reason. `untrained=True` adds a freshly initialised model of the same config beside each checkpoint.
Install matplotlib (`pip install matplotlib`) for the plots; nothing else needs it.
"""
import json
import os
import sys
from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F

if __package__ in (None, ''):  # run as a script: the repo root on the path, as for prepare/
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from machinery.masks import causal_mask, dense_mask
from rules import MixAttention
from model import layer_inputs_outputs
from prepare import ROOT, check_files, dataset_kind, recorded_dataset, stored_as
from prepare.atomic import write_atomically, write_or_exit
from prepare.folder import read_meta
from support.loading import load_run
from support.checks import (check_device, check_fits, check_folder, check_or_exit, check_ranges, check_writable_file,
                            script_settings)
from support.data import Batches
from vit import ViT

# -----------------------------------------------------------------------------
out_dir = 'out'             # a train.py out_dir, or several separated by commas
data_dir = ''               # default: the data_dir each checkpoint was trained on
batch_size = 8              # validation examples (text: windows of block_size tokens) in the batch analysed: the
                            # first rows of train.py's evaluation batches (its generator, seeded its seed + 1)
untrained = False           # also analyse a fresh model of each checkpoint's config (the same seed's init)
example = 0                 # the example whose attention maps are plotted
json_path = ''              # where the JSON goes; default: analysis.json in the first out_dir
plots = ''                  # a folder for PNG plots (needs matplotlib); '' for none
device = 'cpu'              # where the models run ('cuda' for long contexts); the metrics are computed on the CPU
seed = 1337


def check_analyze_settings(c):
    """ValueError naming the first bad setting, before any checkpoint is opened: the device first."""
    check_device(c['device'])
    if not [d for d in c['out_dir'].split(',') if d]:
        raise ValueError("out_dir is empty; pass --out_dir=DIR of a run, or several: --out_dir=DIR1,DIR2")
    check_ranges(c, at_least_one=('batch_size',), not_negative=('example',))
    check_fits([(16 * c['batch_size'], "the batch's inputs and targets", {'batch_size': c['batch_size']})], 'cpu',
               doing='the analysis')  # at least a token each, int64
    if c['example'] >= c['batch_size']:
        raise ValueError(f"example={c['example']} must be below batch_size={c['batch_size']} (the examples are "
                         f"numbered from 0); pass --example={c['batch_size'] - 1} or less, or a larger --batch_size")
    check_folder(c, 'data_dir', "the dataset the checkpoints were trained on")
    check_writable_file(c, 'json_path', 'analysis JSON')
    if c['plots'] and os.path.exists(c['plots']) and not os.path.isdir(c['plots']):
        raise ValueError(f"plots={c['plots']} is a file, not a folder; pass --plots=FOLDER for the PNGs")
    if c['plots']:  # asked for plots: none made would not be a success
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ValueError(f"plots={c['plots']} needs matplotlib, which is not installed: pip install matplotlib, "
                             f"or drop --plots for the tables and analysis.json alone") from None


if __name__ == '__main__':  # tests import the metrics without reading the command line
    exec(open(ROOT / 'configurator.py').read())
    check_or_exit(check_analyze_settings, script_settings(globals()))
# -----------------------------------------------------------------------------
THRESHOLDS = (0.9, 0.95, 0.99)


# -----------------------------------------------------------------------------
# the metrics, each on plain tensors (tests/test_analyze.py builds inputs for them)

def visible_mask(T, causal):
    return dense_mask(causal_mask, T, None) if causal else torch.ones(T, T, dtype=torch.bool)


def uniform_share(T, causal):
    """The first-token share uniform weights give: mean over i >= 1 of 1/(i+1) (causal) or 1/T."""
    return float(np.mean([1 / (i + 1) for i in range(1, T)])) if causal else 1 / T


def first_token_share(w):
    """(H,) mean over queries i >= 1 (all examples) of |w_i0| / sum_j |w_ij|, rows with no weight left out; and the
    fraction of such empty rows."""
    mass = w.abs()[..., 1:, :].sum(-1)   # (B, H, T-1)
    live = mass > 0
    share = torch.where(live, w.abs()[..., 1:, 0] / mass.clamp_min(1e-30), 0.0)
    per_head = share.sum((0, 2)) / live.sum((0, 2)).clamp_min(1)
    return per_head, 1 - live.double().mean((0, 2))


def sparsity(w, causal):
    """(H,) fraction of exact zeros among the visible pairs."""
    visible = visible_mask(w.size(-1), causal)
    return (w[..., visible] == 0).double().mean((0, 2))


def entropy(w):
    """(H,) mean over rows of -sum_j w_ij ln w_ij (0 ln 0 = 0), nats."""
    return -(w * w.clamp_min(1e-30).log()).sum(-1).double().mean((0, 2))


def collapse_residual(x):
    """||X - 1 x̄ᵀ||_F / ||X||_F of X (T, C)."""
    return ((x - x.mean(0, keepdim=True)).norm() / x.norm().clamp_min(1e-30)).item()


def effective_rank(x):
    """exp(entropy of the normalised singular values) of X (T, C), not centred."""
    s = torch.linalg.svdvals(x.double())
    p = s / s.sum().clamp_min(1e-300)
    return float(torch.exp(-(p * p.clamp_min(1e-300).log()).sum()))


def token_groups(x, threshold):
    """Connected components of the graph with an edge where cos(x_i, x_j) > threshold, X (T, C)."""
    u = F.normalize(x.double(), dim=-1)
    adjacent = (u @ u.T) > threshold
    adjacent |= torch.eye(len(x), dtype=torch.bool)
    labels = torch.arange(len(x))
    while True:  # every node takes the smallest label among its neighbours, until nothing changes
        new = torch.where(adjacent, labels.view(1, -1), len(x)).min(1).values
        if torch.equal(new, labels):
            return int(labels.unique().numel())
        labels = new


# -----------------------------------------------------------------------------
# one checkpoint

class Skip(Exception):
    """A checkpoint that cannot be analysed: one line saying what to do."""


def open_run(path):
    """load_run(path) (Run: model, config, meta, data_dir, iter_num) on the CPU; Skip with what to do if it cannot be
    read."""
    try:
        return load_run(path, 'cpu', hint="train one there first, or check --out_dir")
    except SystemExit as e:
        raise Skip(str(e).removeprefix('error: '))


def val_batch(config, folder, block_size):
    """batch_size validation inputs from `folder` through the data reader train.py uses (support.data.Batches): the
    rows train.py's estimate_loss draws first (a generator seeded the run's seed + 1). Skip if the folder holds
    another dataset, or is damaged."""
    name = config['dataset']
    kind = dataset_kind(name)
    try:
        meta = read_meta(folder)
        theirs = recorded_dataset(meta, stored_as(name)) if meta else stored_as(name)
        if theirs != stored_as(name):  # a pixel dataset's folder is its image dataset's
            raise Skip(f"{folder} holds {theirs!r} ({dataset_kind(theirs)}) data, but the checkpoint was trained on "
                       f"{name!r} ({kind}); pass --data_dir=FOLDER of {name}, or leave --data_dir out to use "
                       f"{config.get('data_dir') or 'the one it was trained on'}")
        meta, split_rows = check_files(name, folder)
        batches = Batches(name, folder, meta, split_rows, block_size, batch_size, 'cpu')
    except ValueError as e:
        raise Skip(f"{e} (the checkpoint was trained on {name!r}; pass --data_dir=FOLDER of it)")
    if batches.sizes['val'] < 1:
        raise Skip(batches.too_little_data('val', block_size + 1))
    generator = torch.Generator().manual_seed(config.get('seed', seed) + 1)
    rows = torch.randint(batches.sizes['val'], (1, batch_size), generator=generator)  # estimate_loss's first batch
    return batches.load_batch('val', rows[0])[0]


def blocks(model):
    return model.h if isinstance(model, ViT) else model.transformer.h


@torch.no_grad()
def analyse(model, x):
    """Per layer: the metrics (dict) and the (B, H, T, T) weights or None."""
    seen = layer_inputs_outputs(model, [m for b in blocks(model) for m in (b, b.attn)], x)
    layers, maps = [], []
    for i, block in enumerate(blocks(model)):
        attn, X = block.attn, seen[block][1].cpu()  # the residual stream after block i
        row = {'layer': i, 'rule': type(attn).__name__, 'T': X.size(1),
               'residual': float(np.mean([collapse_residual(t) for t in X])),
               'effective_rank': float(np.mean([effective_rank(t) for t in X])),
               'token_groups': {str(t): float(np.mean([token_groups(e, t) for e in X])) for t in THRESHOLDS}}
        tensors = attn.project(seen[attn][0])  # the attention's own input in the model
        try:
            w = attn.attention_weights(*tensors).float().cpu()
        except NotImplementedError as e:
            row['weights'] = f"n/a: {e}"
            layers.append(row)
            maps.append(None)
            continue
        causal, T = attn.causal, w.size(-1)
        share, empty = first_token_share(w)
        base = uniform_share(T, causal)
        row['heads'] = {'sparsity': sparsity(w, causal).tolist(), 'empty_rows': empty.tolist()}
        if attn.weights_note:
            row['weights'] = f"not a distribution: {attn.weights_note}"
            row['heads']['entropy'] = f"n/a: {attn.weights_note}"
        else:
            row['heads']['entropy'] = entropy(w).tolist()
        if attn.first_token_note:
            row['heads']['first_token_share'] = row['heads']['sink_ratio'] = f"n/a: {attn.first_token_note}"
        else:
            row['heads']['first_token_share'] = share.tolist()
            row['heads']['sink_ratio'] = (share / base).tolist()
        row['uniform_share'] = base
        if isinstance(attn, MixAttention):
            row['branches'] = branches(attn, tensors)
        layers.append(row)
        maps.append(w)
    return layers, maps


def branches(attn, tensors):
    """A mix layer's two branches: each one's first-token share per head, and the mean gate to the softmax branch."""
    w_softmax, w_rule, g = attn.branch_weights(*tensors)
    note = attn.rule.first_token_note
    return {'softmax': first_token_share(w_softmax.float().cpu())[0].tolist(),
            'rule': f"n/a: {note}" if note else first_token_share(w_rule.float().cpu())[0].tolist(),
            'gate_softmax': g[..., 0].mean().item()}  # in the model's dtype


def mean(v):
    return float(np.mean(v)) if isinstance(v, list) else None


def fmt(v, spec='.4f'):
    return format(v, spec) if isinstance(v, (int, float)) else 'n/a'


def print_table(entry):
    print(f"\n== {entry['name']}: {entry['attention']} at iteration {entry['iter']}, {entry['examples']} val examples "
          f"of {entry['T']} tokens; uniform first-token share {fmt(entry['layers'][0].get('uniform_share'))}")
    notes = {r.get('weights') for r in entry['layers']} | {h for r in entry['layers'] for h in
                                                           [r.get('heads', {}).get('first_token_share')]
                                                           if isinstance(h, str)}
    notes |= {r['branches']['rule'] for r in entry['layers'] if isinstance(r.get('branches', {}).get('rule'), str)}
    for note in sorted(n for n in notes if n):
        print(f"  note: {note}")
    print(f"{'layer':>5} {'head':>4} {'1st-tok':>8} {'ratio':>7} {'sparsity':>8} {'entropy':>7} | {'residual':>8} "
          f"{'effrank':>7} {'grp@.9':>7} {'grp@.95':>7} {'grp@.99':>7}")
    for r in entry['layers']:
        heads = r.get('heads', {})
        stats = [heads.get(k) for k in ('first_token_share', 'sink_ratio', 'sparsity', 'entropy')]
        collapse = (f"{r['residual']:8.4f} {r['effective_rank']:7.2f} "
                    + ' '.join(f"{r['token_groups'][str(t)]:7.2f}" for t in THRESHOLDS))
        print(f"{r['layer']:>5} {'mean':>4} " + ' '.join(f"{fmt(mean(v)):>{n}}" for v, n in zip(stats, (8, 7, 8, 7)))
              + f" | {collapse}")
        for h in range(len(heads.get('sparsity', []))):
            print(f"{'':>5} {h:>4} " + ' '.join(f"{fmt(v[h] if isinstance(v, list) else None):>{n}}"
                                               for v, n in zip(stats, (8, 7, 8, 7))))
        if 'branches' in r:  # a mix layer: its two branches, and how much of each token the softmax branch gives
            b = r['branches']
            print(f"{'':>5} softmax branch 1st-tok {fmt(mean(b['softmax']))}, rule branch {fmt(mean(b['rule']))}, "
                  f"gate to softmax {fmt(b['gate_softmax'])}")


# -----------------------------------------------------------------------------
# plots (matplotlib only here)

def save_figure(fig, path, written):
    """fig as a PNG at path, written atomically (write_atomically: no half file, no temporary left), then noted in
    `written`; OSError where it cannot be written."""
    write_atomically(path, lambda tmp: fig.savefig(tmp, dpi=80, format='png'))
    written.append(path)


def make_plots(entries, all_maps, folder, written=None):
    """The PNGs in folder; their paths are appended to `written` as each is written (kept where a later one
    fails)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    os.makedirs(folder, exist_ok=True)
    written = [] if written is None else written
    for entry, maps in zip(entries, all_maps):
        shown = [(i, m) for i, m in enumerate(maps) if m is not None]
        if not shown:
            continue
        H = shown[0][1].size(1)
        fig, axes = plt.subplots(len(shown), H, figsize=(2.2 * H, 2.2 * len(shown)), squeeze=False)
        signed = any((m < 0).any() for _, m in shown)
        for row, (i, m) in enumerate(shown):
            for h in range(H):
                w = m[min(example, m.size(0) - 1), h].numpy()
                ax = axes[row][h]
                if signed:
                    lim = max(abs(w).max(), 1e-12)
                    ax.imshow(w, cmap='RdBu_r', vmin=-lim, vmax=lim)
                else:
                    ax.imshow(w, cmap='viridis', vmin=0)
                ax.set_xticks([]), ax.set_yticks([])
                ax.set_title(f"layer {i} head {h}", fontsize=8)
        fig.suptitle(f"{entry['name']} ({entry['attention']}): attention weights, example {example}"
                     f"\n(rows: queries, columns: keys{'; signed, red > 0 > blue' if signed else ''})", fontsize=9)
        fig.tight_layout()
        path = os.path.join(folder, f"maps_{entry['slug']}.png")
        save_figure(fig, path, written)
        plt.close(fig)

    def per_layer(ax, key, title, ylabel, baseline=None, branch=None):
        for entry in entries:
            ys, colour = [key(r) for r in entry['layers']], None
            if any(y is not None for y in ys):
                colour = ax.plot(range(len(ys)), [np.nan if y is None else y for y in ys], marker='o',
                                 label=entry['name'])[0].get_color()
            ys = [branch(r) for r in entry['layers']] if branch else []
            if any(y is not None for y in ys):  # mix checkpoints: the softmax branch, dashed, in the entry's colour
                ax.plot(range(len(ys)), [np.nan if y is None else y for y in ys], marker='o', linestyle='--',
                        color=colour, label=f"{entry['name']} softmax branch")
        if baseline is not None:
            ax.axhline(baseline, color='grey', linestyle='--', label='uniform weights')
        ax.set_title(title, fontsize=9)
        ax.set_xlabel('layer')
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=6)

    fig, ax = plt.subplots(figsize=(6, 4))
    base = next((r['uniform_share'] for e in entries for r in e['layers'] if 'uniform_share' in r), None)
    per_layer(ax, lambda r: mean(r.get('heads', {}).get('first_token_share')), 'first-token share (attention sink) '
              'vs layer, mean over heads', 'share of weight on token 0', base,
              branch=lambda r: mean(r.get('branches', {}).get('softmax')))
    fig.tight_layout()
    save_figure(fig, os.path.join(folder, 'sink.png'), written)
    plt.close(fig)

    fig, axes = plt.subplots(1, 1 + len(THRESHOLDS), figsize=(4 * (1 + len(THRESHOLDS)), 3.6))
    per_layer(axes[0], lambda r: r['effective_rank'], 'effective rank of X vs layer', 'effective rank')
    for ax, t in zip(axes[1:], THRESHOLDS):
        per_layer(ax, lambda r, t=t: r['token_groups'][str(t)], f'token groups at cos > {t} vs layer', 'token groups')
    fig.tight_layout()
    save_figure(fig, os.path.join(folder, 'collapse.png'), written)
    plt.close(fig)

    logs = [(e['name'], e['log']) for e in entries if e.get('log')]
    if logs:
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, records in logs:
            train = [(r['iter'], r['loss']) for r in records if r.get('type') == 'train']
            val = [(r['iter'], r['val_loss']) for r in records if r.get('type') == 'eval']
            if train:
                it, loss = zip(*train)
                k = max(1, len(loss) // 50)  # a running mean over ~2% of the run
                smooth = np.convolve(loss, np.ones(k) / k, mode='valid')
                line, = ax.plot(it[k - 1:], smooth, alpha=0.6, label=f'{name} train')
                if val:
                    ax.plot(*zip(*val), marker='o', color=line.get_color(), label=f'{name} val')
        ax.set_title('loss curves from log.jsonl (train: running mean)', fontsize=9)
        ax.set_xlabel('iteration')
        ax.set_ylabel('loss')
        ax.legend(fontsize=6)
        fig.tight_layout()
        save_figure(fig, os.path.join(folder, 'loss.png'), written)
        plt.close(fig)
    return written


def read_log(path):
    records = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    records.append(json.loads(line))
                except ValueError:
                    pass
    return records


def main():
    entries, all_maps, opened, problems = [], [], [], []
    dirs = [d for d in out_dir.split(',') if d]
    for path in dirs:  # every checkpoint and its batch first: one that cannot be read stops all before any work
        try:
            run = open_run(path)
            opened.append((path, run, val_batch(run.config, data_dir or run.data_dir, run.model.config.block_size)))
        except Skip as e:
            print(f"error: {path}: {e}")
            problems.append((path, str(e)))
    if problems:  # a line each (above), then the verdict naming them
        names, many = ', '.join(path for path, _ in problems), len(problems) > 1
        if len(problems) == len(dirs):
            raise SystemExit(f"error: none of the {len(dirs)} out_dir(s) could be analysed ({names}: each said why "
                             f"above); pass --out_dir=DIR of a train.py run")
        raise SystemExit(f"error: {names} (said why above) cannot be analysed, so nothing was: fix "
                         f"{'them' if many else 'it'} or drop {'them' if many else 'it'} from --out_dir")
    for path, run, x in opened:
        model, config = run.model, run.config
        runs = [(path, model, run.iter_num)]
        if untrained:
            torch.manual_seed(config.get('seed', seed))
            runs.append((f"{path} (untrained)", type(model)(replace(model.config)).eval(), 0))  # the same init
        for name, m, it in runs:
            layers, maps = analyse(m.to(device), x.to(device))
            slug = name.strip('/').replace('/', '_').replace(' ', '_').replace('(', '').replace(')', '')
            entries.append({'name': name, 'slug': slug, 'attention': model.config.attention, 'iter': it,
                            'T': layers[0]['T'],
                            'examples': x.size(0), 'layers': layers,
                            'log': read_log(os.path.join(path, 'log.jsonl')) if it else []})
            all_maps.append(maps)
            print_table(entries[-1])
    target = json_path or os.path.join(next((d for d in dirs if os.path.isdir(d)), '.'), 'analysis.json')

    def write_json(tmp):
        with open(tmp, 'w') as f:
            json.dump({'checkpoints': [{k: v for k, v in e.items() if k not in ('log', 'slug')} for e in entries],
                       'errors': []}, f, indent=1)
    write_or_exit(target, write_json, "the tables printed above are all that was kept",
                  "pass --json_path=PATH in a folder you can write to (or free space there) and run again")
    print(f"\nwrote {target}")
    if plots:  # matplotlib is there: check_analyze_settings
        written = []
        try:
            make_plots(entries, all_maps, plots, written)
        except OSError as e:
            done = f"; the plots written before it are kept: {', '.join(written)}" if written else ''
            raise SystemExit(f"error: cannot write the plots in {plots} ({e.strerror or e}); {target} is written "
                             f"and kept{done}; pass --plots=FOLDER you can write to and run again") from None
        for p in written:
            print(f"wrote {p}")


if __name__ == '__main__':
    main()
