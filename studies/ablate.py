"""
One honest table: train each named rule on the same recipe, budget and seeds, one run after another, then evaluate
each checkpoint on the whole val split (train.py --eval_only=True --eval_full=True) and analyse it (analyze.py).

$ python studies/ablate.py --out_root=abl-sh --seeds=1337,1338 --recipe="config/shakespeare_char.py --device=cpu \\
      --compile=False --eval_iters=20 --log_interval=1 --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 \\
      --n_embd=128 --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0"
$ python studies/ablate.py --out_root=abl-recall --rules=softmax,krause                  # the default recall job

Run R with seed S lives in out_root/R-sS; a run whose eval_full.json is there is not trained again, so a stopped
ablation goes on where it was, and more seeds can be added later. Writes out_root/ablation.md (the table),
out_root/ablation.json, and out_root/loss.png when matplotlib is installed. Times are the machine's: run nothing
else on it meanwhile.
"""
import json
import os
import shlex
import subprocess
import sys

import numpy as np

if __package__ in (None, ''):  # run as a script: the repo root on the path, as for prepare/
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from prepare import dataset_kind
from studies import analyze
from support.checkpoint import write_or_exit
from support.checks import check_int_list, check_or_exit, check_ranges, script_settings

# -----------------------------------------------------------------------------
recipe = ''                 # train.py arguments shared by every run (a config file and --key=value overrides)
rules = 'softmax,krause,attentionx,tda,cluster'  # names in RULES
seeds = '1337'
out_root = 'ablation'
train = True                # train the runs that are missing; False: only tabulate what is there
analysis_batch = 32         # val examples analyzed per checkpoint
harness_tasks = ''          # GPT-2 BPE runs: lm-eval tasks that harness.py scores per run, a column each (README)
harness_args = ''           # more harness.py arguments, e.g. "--hellaswag_source=PATH --batch_size=32"
exec(open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'configurator.py')).read())
# -----------------------------------------------------------------------------
# each name: its train.py arguments on top of the recipe (the settings RESULTS.md's tables use)
RULES = {
    'softmax': '--attention=softmax',
    'softmax_rope': '--attention=softmax --pos_emb=rope',
    'krause': '--attention=krause --krause_window=32 --krause_topk=16',
    'attentionx': '--attention=attentionx --attnx_gamma=3',
    'tda': '--attention=tda --pos_emb=rope --tda_beta=0.5',
    'tda_beta1': '--attention=tda --pos_emb=rope',
    'cluster': '--attention=cluster --cluster_chunk=16',
}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def check_ablate_settings(c):
    """(rule names, seeds); ValueError naming the first bad setting, before any run is trained or read."""
    names = [n for n in c['rules'].split(',') if n]
    if not names:
        raise ValueError(f"rules is empty; pass e.g. --rules=softmax,krause (valid: {', '.join(RULES)})")
    unknown = [n for n in names if n not in RULES]
    if unknown:
        raise ValueError(f"rules: unknown rule name(s) {', '.join(unknown)}; valid: {', '.join(RULES)}")
    seed_list = check_int_list(c, 'seeds', '1337,1338', at_least=0)
    check_ranges(c, at_least_one=('analysis_batch',))
    for key in ('recipe', 'harness_args'):
        try:
            shlex.split(c[key])
        except ValueError as e:
            raise ValueError(f"{key} does not parse as command-line arguments ({e}); pass --{key}=\"...\" with "
                             f"balanced quotes") from None
    if not c['out_root']:
        raise ValueError("out_root is empty; pass --out_root=DIR (the runs and the table go there)")
    if os.path.exists(c['out_root']) and not os.path.isdir(c['out_root']):
        raise ValueError(f"out_root={c['out_root']} is a file, not a folder; pass --out_root=DIR")
    return names, seed_list



def run_train(args, log_path):
    with open(log_path, 'w') as f:
        return subprocess.run([sys.executable, 'train.py', *args], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode


def summary(out_dir):
    """What the table needs from one finished run."""
    with open(os.path.join(out_dir, 'eval_full.json')) as f:
        full = json.load(f)
    records = analyze.read_log(os.path.join(out_dir, 'log.jsonl'))
    times = [r['time_ms'] for r in records if r.get('type') == 'train']
    rate_key = next((k for k in ('tokens_per_s', 'images_per_s') if any(k in r for r in records)), None)
    run = analyze.open_run(out_dir)
    model, config, kind = run.model, run.config, dataset_kind(run.config['dataset'])
    analyze.batch_size = analysis_batch
    x = analyze.val_batch(config, run.data_dir, model.config.block_size)
    layers, _ = analyze.analyse(model, x)
    # tokens per iteration for every sequence task (text, recall, passkey), images for a ViT
    per_sample = config['batch_size'] * config['gradient_accumulation_steps'] * (model.config.block_size
                                                                                 if kind != 'image' else 1)
    shares = [h for r in layers for h in r.get('heads', {}).get('first_token_share', []) if isinstance(h, float)]
    share_note = next((r['heads']['first_token_share'] for r in layers
                       if isinstance(r.get('heads', {}).get('first_token_share'), str)), None)
    sparsities = [h for r in layers for h in r.get('heads', {}).get('sparsity', [])]
    return {'params': sum(p.numel() for p in model.parameters()), 'val_loss': full['val_loss'],
            'val_acc': full['val_acc'] if kind != 'text' else None, 'median_ms': float(np.median(times)),
            'rate': per_sample / (np.median(times) / 1000), 'rate_unit': 'images/s' if kind == 'image' else 'tok/s',
            'sink_share': float(np.mean(shares)) if shares else None, 'sink_note': share_note,
            'sparsity': float(np.mean(sparsities)) if sparsities else None,
            'last_rank': layers[-1]['effective_rank'], 'log': records, 'rate_key': rate_key}


def run_harness(out_dir):
    """harness.py on a finished run, unless its harness.json already holds these tasks: True if it is there."""
    path = os.path.join(out_dir, 'harness.json')
    if os.path.exists(path):
        with open(path) as f:
            if json.load(f).get('attention_lab', {}).get('tasks') == harness_tasks:
                return True
    args = ['studies/harness.py', f'--out_dir={out_dir}', f'--tasks={harness_tasks}', *shlex.split(harness_args)]
    with open(out_dir + '.harness.log', 'w') as f:
        failed = subprocess.run([sys.executable, *args], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode
    if failed:
        print(f"harness.py failed on {out_dir}; see {out_dir}.harness.log")
    return not failed


def harness_scores(out_dir):
    """{task: (metric, value)} from a run's harness.json: acc_norm where a task has it, else acc, else its first."""
    with open(os.path.join(out_dir, 'harness.json')) as f:
        results = json.load(f)['results']
    scores = {}
    for task, metrics in results.items():
        values = {k.split(',')[0]: v for k, v in metrics.items()
                  if ',' in k and '_stderr' not in k and isinstance(v, (int, float))}
        metric = next((m for m in ('acc_norm', 'acc') if m in values), next(iter(values), None))
        if metric:
            scores[task] = (metric, values[metric])
    return scores


def spread(values, digits=4):
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{np.mean(values):.{digits}f} ± {(max(values) - min(values)) / 2:.{digits}f}"


def main():
    names, seed_list = check_or_exit(check_ablate_settings, script_settings(globals()))  # before any work
    try:
        os.makedirs(out_root, exist_ok=True)
    except OSError as e:
        raise SystemExit(f"error: cannot make out_root={out_root} ({e.strerror}); nothing was trained yet; pass "
                         f"--out_root=DIR you can write to") from None
    results = {}
    for name in names:
        for seed in seed_list:
            out_dir = os.path.abspath(os.path.join(out_root, f'{name}-s{seed}'))
            args = [*shlex.split(recipe), *shlex.split(RULES[name]), f'--seed={seed}', f'--out_dir={out_dir}']
            if not os.path.exists(os.path.join(out_dir, 'eval_full.json')):
                if not train:
                    print(f"{name} seed {seed}: not trained yet ({out_dir}); pass --train=True")
                    continue
                print(f"training {name} seed {seed} -> {out_dir}", flush=True)
                if (run_train(args, out_dir + '.train.log') or
                        run_train([*args, '--eval_only=True', '--eval_full=True', '--init_from=resume'],
                                  out_dir + '.eval.log')):
                    print(f"{name} seed {seed}: train.py failed; see {out_dir}.train.log and .eval.log")
                    continue
            results.setdefault(name, {})[seed] = summary(out_dir)
            if harness_tasks and run_harness(out_dir):
                results[name][seed]['harness'] = harness_scores(out_dir)
    lines = ["| rule | train.py arguments | params | seeds | val loss (whole split) | val acc | median iteration | "
             "throughput | first-token share | sparsity | last-layer effective rank |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, runs in results.items():
        rows = list(runs.values())
        mean_of = lambda key: np.mean([r[key] for r in rows]) if all(r[key] is not None for r in rows) else None
        acc = spread([r['val_acc'] for r in rows]) if rows[0]['val_acc'] is not None else 'n/a'
        sink = (f"{mean_of('sink_share'):.4f}" if mean_of('sink_share') is not None else
                f"n/a ({rows[0]['sink_note'].removeprefix('n/a: ')})")
        sparse = f"{mean_of('sparsity'):.4f}" if mean_of('sparsity') is not None else 'n/a'
        lines.append(f"| {name} | `{RULES[name]}` | {rows[0]['params']:,} | {', '.join(map(str, runs))} | "
                     f"{spread([r['val_loss'] for r in rows])} | {acc} | {np.median([r['median_ms'] for r in rows]):.1f} ms"
                     f" | {np.median([r['rate'] for r in rows]):,.0f} {rows[0]['rate_unit']} | {sink} | {sparse} | "
                     f"{mean_of('last_rank'):.2f} |")
    columns = next((r['harness'] for runs in results.values() for r in runs.values() if 'harness' in r), {})
    if columns:  # the harness's scores, one column per task, beside the rest
        lines[0] += ''.join(f" {task} {metric} |" for task, (metric, _) in columns.items())
        lines[1] += ' --- |' * len(columns)
        for i, runs in enumerate(results.values(), start=2):
            scores = [r.get('harness', {}) for r in runs.values()]
            cells = [[s[t][1] for s in scores if t in s] for t in columns]
            lines[i] += ''.join(f" {spread(values) if values else 'n/a'} |" for values in cells)
    table = '\n'.join(lines)
    print(f"\nrecipe: {recipe or '(train.py defaults: recall)'}\n{table}")

    def write_table(tmp):
        with open(tmp, 'w') as f:
            f.write(f"recipe: `{recipe}`\n\n{table}\n")

    def write_json(tmp):
        with open(tmp, 'w') as f:
            json.dump({'recipe': recipe, 'runs': {n: {s: {k: v for k, v in r.items() if k != 'log'}
                                                      for s, r in runs.items()} for n, runs in results.items()}},
                      f, indent=1)
    kept = f"the runs are kept in {out_root} and the table is printed above"
    todo = "free space (or fix the folder's permissions), then run again with --train=False to write them"
    write_or_exit(os.path.join(out_root, 'ablation.md'), write_table, kept, todo)
    write_or_exit(os.path.join(out_root, 'ablation.json'), write_json, f"{kept}, ablation.md is written", todo)
    try:
        import matplotlib
    except ImportError:
        print("plots: matplotlib is not installed, so no loss.png; pip install matplotlib, then run again with "
              "--train=False")
        return
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (name, runs) in enumerate(results.items()):
        for j, (seed, r) in enumerate(runs.items()):
            val = [(x['iter'], x['val_loss']) for x in r['log'] if x.get('type') == 'eval']
            if val:
                ax.plot(*zip(*val), marker='o', markersize=3, color=f'C{i}', linestyle='-' if j == 0 else ':',
                        label=f'{name} seed {seed}')
    ax.set_xlabel('iteration')
    ax.set_ylabel('val loss (eval_iters batches)')
    ax.set_title(f'val loss curves from log.jsonl, {out_root}', fontsize=9)
    ax.legend(fontsize=6)
    fig.tight_layout()
    write_or_exit(os.path.join(out_root, 'loss.png'), lambda tmp: fig.savefig(tmp, dpi=80, format='png'),
                  f"the runs, ablation.md and ablation.json are kept in {out_root}",
                  "free space (or fix the folder's permissions), then run again with --train=False")
    print(f"wrote {os.path.join(out_root, 'loss.png')}")


if __name__ == '__main__':
    main()
