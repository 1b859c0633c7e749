"""
A table's cells: a trained run scored with its system's metric (score_run: extrapolate.py's passkeys, train.py's
evaluation of the whole val split, the zero-shot tasks of studies/harness.py) and, in a paper's table, measured
(parameters, attention FLOPs, analyze.py's zeros and sink); its cell.json (cell_run: scored once, never again); and
a table's runs into their cells (run_cells): one after the other, side by side on GPUs of their own, or each a job
(studies/launch.py), with a bar of the runs to go.
"""
import collections
import json
import os
import shlex
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

import numpy as np
from tqdm import tqdm

from prepare.atomic import write_atomically, write_text
from studies.lab import lab_settings
from studies.launch import job_results
from studies.runs import (SLOT, Failed, cell_dir, first_run, follow_training, launched, needed_runs, read_json,
                          run_args, run_dir, set_aside, stale, train_run)
from studies.systems import SYSTEMS, at
from studies.tables import ANALYSIS


def score_run(lab, run):
    """Score a trained run with its system's metric (a table's cell: and measure it, measure_run): {'metrics', 'log'}
    or the failure {'error', 'log'}."""
    system, folder = SYSTEMS[run.system], run_dir(lab, run)
    os.makedirs(cell_dir(lab, run), exist_ok=True)
    log = os.path.join(cell_dir(lab, run), 'eval.log')  # the table's scoring, beside its cell
    try:
        metrics = passkey_metrics(lab, run, log) if system.passkeys else full_metrics(lab, run, log)
        if system.draw_batch:  # measured in this process: whatever goes wrong is this cell's, not the table's
            metrics['draw_images_per_s'] = draw_speed(folder, at(system.draw_batch, lab.budget))
        if lab.table:
            metrics.update(measure_run(folder, run.system in lab.table.analysis))
        if tasks_of(lab, run.system):
            metrics.update(task_metrics(lab, folder, tasks_of(lab, run.system), log))
    except Failed as e:
        return {'error': str(e), 'log': log}
    return {'metrics': metrics, 'log': log}


def passkey_metrics(lab, run, log):
    """extrapolate.py's whole-passkey accuracy on fresh episodes, a metric per line it writes (its system's
    passkey_key)."""
    system = SYSTEMS[run.system]
    launched('studies/extrapolate.py', [f'--out_dir={run_dir(lab, run)}', *shlex.split(at(system.passkeys, lab.budget)),
                                        '--json_out=True', f'--device={score_device(lab.budget)}'], log)
    with open(log) as f:
        lines = [json.loads(line) for line in f if line.startswith('{')]
    return {system.passkey_key.format(**line): line['passkey_acc'] for line in lines}


def full_metrics(lab, run, log):
    """train.py's evaluation of the whole val split: val_loss, examples, and the system's full_keys."""
    launched('train.py', [*run_args(lab, run), '--init_from=resume', '--eval_only=True', '--eval_full=True'], log)
    with open(os.path.join(run_dir(lab, run), 'eval_full.json')) as f:
        full = json.load(f)
    return {'val_loss': full['val_loss'], 'examples': full['examples'],
            **{key: full[key] for key in SYSTEMS[run.system].full_keys}}


def task_metrics(lab, folder, names, log):
    """The zero-shot tasks `names`, studies/harness.py on the run's checkpoint: {task_NAME: its number}."""
    launched('studies/harness.py', [f'--out_dir={folder}', f"--tasks={','.join(names)}",
                                    f'--device={score_device(lab.budget)}', *shlex.split(lab.harness_args)], log)
    with open(os.path.join(folder, 'harness.json')) as f:
        results = json.load(f)['results']
    return {f'task_{name}': task_score(results[name], name) for name in names}


def score_device(budget):
    """Where the scoring scripts run: the GPU at the paper budget where there is one, else the CPU."""
    import torch
    return 'cuda' if budget == 'paper' and torch.cuda.is_available() else 'cpu'


def tasks_of(lab, system):
    """The harness tasks a table's system is scored on at this budget: --tasks where given (on the systems whose
    spec has tasks), else the spec's own at the paper budget; none outside a table, or with --tasks=none."""
    spec = lab.table.systems[system] if lab.table else None
    if not (spec and spec.tasks) or lab.tasks == 'none':
        return []
    return [name for name in (lab.tasks or (spec.tasks if lab.budget == 'paper' else '')).split(',') if name]


TASK_METRICS = ('rouge_geometric_mean', 'f1', 'acc_norm', 'acc', 'bits_per_byte')  # the first a task reports
PAPER_METRIC = {  # a task whose paper reports another of the numbers the harness gives than TASK_METRICS' first
    'cb': 'acc',  # the Krause paper's CB numbers, 60.71 → 64.29, are accuracy (its F1, 47.81 → 48.04, beside them)
}


def task_score(result, task=''):
    """A task's number in a table: the metric its paper reports, PAPER_METRIC's where it names one, else the first
    of TASK_METRICS its harness result has (SCROLLS' ROUGE geometric mean or F1; acc_norm where the harness
    normalises by length, as the papers report HellaSwag, ARC, PIQA; else acc)."""
    if task in PAPER_METRIC:
        return result[f'{PAPER_METRIC[task]},none']
    return next(result[f'{name},none'] for name in TASK_METRICS if f'{name},none' in result)


def measure_run(folder, analysed):
    """A table's measurements of a trained run, in this process: `params`, every parameter of the model (its own
    count, get_num_params(non_embedding=False)); `flops_counted` and `flops_ideal`, attention FLOPs per token and
    layer on the path that ran and the rule's ideal (support/flops.py); and where `analysed`, analyze.py's
    exact-zero `sparsity` and first-token `sink_ratio` of its validation batch, the mean over layers and heads (None
    where analyze.py says n/a). Failed where the run cannot be read or measured."""
    try:
        from support.flops import attention_flops
        from support.loading import load_run
        run = load_run(folder, 'cpu')
        flops = attention_flops(run.model)
        measured = {'params': run.model.get_num_params(non_embedding=False), 'flops_counted': flops['counted'],
                    'flops_ideal': flops['ideal']}
        if analysed:
            from studies.analyze import analyse, val_batch
            layers, _ = analyse(run.model, val_batch(run.config, run.data_dir, run.model.config.block_size))
            for metric in ANALYSIS:
                values = [layer.get('heads', {}).get(metric.key) for layer in layers]
                measured[metric.key] = float(np.mean(values)) if all(isinstance(v, list) for v in values) else None
    except (Exception, SystemExit) as e:  # load_run's SystemExit: a checkpoint it cannot read
        raise Failed(f"error: measuring {folder} failed ({type(e).__name__}: {e})") from None
    return measured


def draw_speed(folder, batch_size):
    """Images per second drawn from a pixel model with its cache, `batch_size` images at once, on the device it
    trained on (support/pixels.py; here in the lab's process). Failed where drawing fails."""
    from support.loading import load_run
    from support.pixels import timed_draw
    try:
        run = load_run(folder, 'cpu')
        model = run.model.to(run.config.get('device', 'cpu')).eval()
        return timed_draw(model, batch_size, batch_size, model.config.block_size + 1)[1]
    except Exception as e:
        raise Failed(f"error: drawing {batch_size} images failed ({type(e).__name__}: {e})") from None


def training_rate(folder):
    """(median tokens/s or images/s of the run's logged iterations, its unit) from log.jsonl; (None, None) for a run
    that trained nothing (a swapped row)."""
    if not os.path.exists(os.path.join(folder, 'log.jsonl')):
        return None, None
    with open(os.path.join(folder, 'log.jsonl')) as f:
        records = [json.loads(line) for line in f if line.strip()]
    for key, unit in (('tokens_per_s', 'tok/s'), ('images_per_s', 'images/s')):
        values = [r[key] for r in records if key in r]
        if values:
            return float(np.median(values)), unit
    return None, None


def cell_run(lab, run):
    """One run's result, from its cell.json when it has one (never trained again), else trained and scored now."""
    folder, old = run_dir(lab, run), stale(lab, run)
    path = os.path.join(cell_dir(lab, run), 'cell.json')
    if old and not lab.reuse_stale and os.path.exists(path):  # scored from a run trained by other code: kept aside
        set_aside(cell_dir(lab, run), read_json(os.path.join(folder, 'run.json')))
    if os.path.exists(path):
        return {**read_json(path), **({'stale': old} if old else {})}
    if not lab.train_missing:
        return {'not_run': 'not run yet: pass --train_missing=True'}
    failed = train_run(lab, run)
    if failed:
        return failed
    t0 = time.time()
    scored = score_run(lab, run)
    if 'error' in scored:
        return scored
    trained, made = (read_json(os.path.join(folder, name)) for name in ('trained.json', 'run.json'))
    rate, unit = training_rate(folder)
    old = stale(lab, run)  # reused as asked (reuse_stale): its cell says so
    result = {**scored, **({'stale': old} if old else {}), 'train_wall_s': trained['wall_s'],
              'score_wall_s': time.time() - t0, 'rate': rate, 'rate_unit': unit, 'args': shlex.join(trained['args']),
              'run': os.path.relpath(folder, lab.out_root), 'trained_for': made['trained_for']}
    write_atomically(path, lambda tmp: write_text(tmp, json.dumps(result)))
    return result


def cell_results(lab, todo):
    """(run, cell_run's result) of each run of `todo`: one after the other, or cells_at_once side by side, each
    thread's runs pinned to GPUs of their own (CUDA_VISIBLE_DEVICES: nproc_per_node of them), in the order they end."""
    if lab.launcher != 'local':  # each job rebuilds the lab where it lands (lab_settings)
        landed = job_results(lab, job_waves(lab, todo), *lab.command, lab_settings, follow_training)
        yield from ((run, result) for work, run, result in landed if work is cell_run)
        return
    if lab.cells_at_once == 1:
        yield from ((run, cell_run(lab, run)) for run in todo)
        return
    import torch
    slots = [{'CUDA_VISIBLE_DEVICES': ','.join(str(i * lab.nproc_per_node + g) for g in range(lab.nproc_per_node))}
             if torch.cuda.is_available() else {} for i in range(lab.cells_at_once)]
    free = collections.deque(slots)
    held = threading.Lock()

    def pinned(run):
        with held:
            SLOT.env = free.popleft()  # as many threads as slots: one is free
        try:
            return cell_run(lab, run)
        finally:
            with held:
                free.append(SLOT.env)
    with ThreadPoolExecutor(lab.cells_at_once) as pool:
        futures = {pool.submit(pinned, run): run for run in todo}
        yield from ((futures[f], f.result()) for f in as_completed(futures))


def job_waves(lab, todo):
    """[[(work, Run)]] of the jobs (studies/launch.py): the runs of `todo` (cell_run) and those they start from
    (train_run, where no cell of todo is that run), each in the wave after the run it starts from, and never two
    jobs of one run folder in one wave (two jobs never train one run)."""
    depth = lambda run: 1 + depth(first_run(lab, run)) if first_run(lab, run) else 0
    cells = {run_dir(lab, run) for run in todo}
    jobs = [(cell_run, run) for run in todo]
    jobs += [(train_run, run) for folder, run in needed_runs(lab, todo).items() if folder not in cells]
    wave_of, waves = {}, collections.defaultdict(list)  # {run folder: the last wave that makes it}
    for work, run in sorted(jobs, key=lambda job: depth(job[1])):
        first, folder = first_run(lab, run), run_dir(lab, run)
        wave = wave_of[run_dir(lab, first)] + 1 if first else 0
        while any(run_dir(lab, other) == folder for _, other in waves[wave]):
            wave += 1
        wave_of[folder] = max(wave, wave_of.get(folder, 0))
        waves[wave].append((work, run))
    return [waves[w] for w in sorted(waves)]


def run_cells(lab, cells, todo):
    """Each run of `todo` into its cell (its result, or why it has none), with a bar of the runs to go."""
    finished = {run for run in todo if os.path.exists(os.path.join(cell_dir(lab, run), 'cell.json'))}
    progress = tqdm(total=len(todo), initial=len(finished), unit='run', dynamic_ncols=True)  # its ETA: runs to go
    try:
        for run, result in cell_results(lab, todo):
            cell = cells[run.row][run.system]
            if 'not_run' in result:
                cell.update(status='not run', why=result['not_run'])
            elif 'error' in result:
                cell.update(status='failed', why=f"{result['error']} (log: {result['log']})")
                progress.write(f"{run.system} {run.row} seed {run.seed}: {result['error']}; see {result['log']}")
            else:
                cell['seeds'][str(run.seed)] = result
            progress.update(0 if run in finished else 1)
        for cell in (cell for row in cells.values() for cell in row.values()):  # seeds in order, as they ended
            cell['seeds'] = {str(n): cell['seeds'][str(n)] for n in lab.seeds if str(n) in cell['seeds']}
    except SystemExit as e:
        if e.code not in (130, 143):  # RunDir's Ctrl-C and SIGTERM
            raise
        progress.close()  # the bar before the line, not after it
        raise SystemExit(f"error: interrupted ({'Ctrl-C' if e.code == 130 else 'SIGTERM'}); the finished runs are "
                         f"kept in {lab.folder} (a cell.json each) and a run stopped in training goes on from its "
                         f"checkpoint; run the same command again to go on") from None
    progress.close()
