"""
The lab's figures (studies/ablate.py writes them beside table.md and links them from it; matplotlib, an extra):

- per system and metric, two panels: each row's runs as points (one per seed) with their mean as a bar, and each
  row's paired difference from the first row (a point per seed, the mean with its 95% interval, 0 dashed): the
  picture of the table's `*`. A panel whose axis does not start at 0 says so in its title.
- per system, the validation curves of every row overlaid from its runs' log.jsonl (train.py's estimate at each
  evaluation, on eval_iters batches): the mean over seeds as a line, the seeds' range as a band; beside it the
  training loss logged every log_interval, the same way. The axes show the runs past the first tenth of training
  (the first steps' fall would flatten the rest), and say so.
"""
import json
import os

import numpy as np


def pyplot():
    """matplotlib's pyplot drawing to files, or None where matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    return plt


def axis_cut(ax):
    """' (axis not from 0)' where the y-axis's range leaves 0 out, else ''."""
    low, high = ax.get_ylim()
    return '' if low <= 0 <= high else ', axis not from 0'


def values_figure(plt, title, label, rows, values, comparisons):
    """rows: the names, the first the one compared with; values: {row: {seed: value}}; comparisons: {row:
    verdicts.paired's result against the first row} for the others."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(max(6.0, 2.0 + 1.2 * len(rows)), 3.6))
    for x, row in enumerate(rows):
        seeds = list(values[row].values())
        left.scatter([x] * len(seeds), seeds, s=14, color=f'C{x}', zorder=3)
        left.hlines(np.mean(seeds), x - 0.3, x + 0.3, color=f'C{x}', linewidth=2)
    left.set_xticks(range(len(rows)), rows, rotation=45, ha='right', fontsize=8)
    left.set_ylabel(label, fontsize=8)
    left.set_title(f"each seed a point, the mean a bar\n({label}{axis_cut(left)})", fontsize=8)
    others = [r for r in rows[1:] if r in comparisons]
    for x, row in enumerate(others):
        c = comparisons[row]
        right.scatter([x] * len(c['diffs']), c['diffs'], s=14, color='0.6', zorder=2)
        if c['half_width'] is not None:
            right.errorbar(x, c['mean'], yerr=c['half_width'], fmt='o', color=f'C{rows.index(row)}', capsize=4,
                           zorder=3)
    right.axhline(0, color='k', linestyle='--', linewidth=0.8)
    right.set_xticks(range(len(others)), others, rotation=45, ha='right', fontsize=8)
    right.set_xlim(-0.6, max(len(others), 1) - 0.4)
    right.set_ylabel(f"difference from {rows[0]}", fontsize=8)
    right.set_title(f"minus {rows[0]}, seed by seed (grey):\nthe mean and its 95% interval", fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def read_log(folder):
    """A run's log.jsonl records, [] where it has none (a swapped row trains nothing)."""
    path = os.path.join(folder, 'log.jsonl')
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def seeds_curve(logs, kind, key):
    """(iterations every seed logged, [mean, low, high] over seeds) of records of `kind` with `key`; None where
    the seeds share no iteration."""
    curves = [{r['iter']: r[key] for r in log if r.get('type') == kind and key in r} for log in logs]
    iters = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
    if not iters:
        return None
    values = np.array([[c[i] for i in iters] for c in curves])  # (seeds, iters)
    return iters, values.mean(0), values.min(0), values.max(0)


def curves_figure(plt, title, rows, logs, val_key, val_label):
    """rows: the names; logs: {row: [each seed's log.jsonl records]}; val_key: the eval records' number drawn."""
    fig, axes = plt.subplots(1, 2, figsize=(8.0, 3.6))
    drawn = False
    for ax, (kind, key, label) in zip(axes, (('eval', val_key, val_label), ('train', 'loss', 'train loss'))):
        later = []  # the band's values past the first tenth of training, where the rows part
        for x, row in enumerate(rows):
            curve = seeds_curve(logs.get(row, []), kind, key)
            if curve is None:
                continue
            iters, mean, low, high = curve
            ax.plot(iters, mean, color=f'C{x}', label=row, marker='o' if len(iters) < 8 else None, markersize=3)
            ax.fill_between(iters, low, high, color=f'C{x}', alpha=0.2, linewidth=0)
            later += [v for i, a, b in zip(iters, low, high) if i >= 0.1 * iters[-1] for v in (a, b)]
            drawn = True
        zoom = ''
        if len(later) > 2 and max(later) > min(later):  # the first steps' fall would flatten the rest
            pad = 0.05 * (max(later) - min(later))
            ax.set_ylim(min(later) - pad, max(later) + pad)
            zoom = '\nthe first tenth of training above the axis'
        ax.set_xlabel('iteration', fontsize=8)
        ax.set_title(f"{label}{axis_cut(ax)}\nthe mean over seeds, their range shaded{zoom}", fontsize=8)
    if not drawn:
        plt.close(fig)
        return None
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig
