"""
The lab's dry run (studies/ablate.py --dry_run=True): every run's command and cost before the first step
(studies/cost.py: parameters, tokens, FLOPs, GPU-hours), whether it is trained, and the sums, of one table or of
every table at once; and the check a dry run and a real run both make first, that the processes that train each run
share its step.
"""
import os
import shlex

from studies.lab import lab_settings, planned_cells
from studies.report import count_text, sources_text
from studies.runs import base_run, first_run, needed_runs, read_json, run_command, run_dir, spread_batch, stale
from studies.tables import TABLES
from support.checks import check_or_exit
from support.runtime import PEAK_FLOPS


def run_state(lab, run, folder):
    """'done' (trained, for this table or another), 'started' (a checkpoint to go on from) or 'to train'; a run
    the code no longer trains alike is said so, and what the real run does with it."""
    old = stale(lab, run)
    if old and not lab.reuse_stale:
        return f"to train ({old}: the kept run set aside, or --reuse_stale=True)"
    if os.path.exists(os.path.join(folder, 'trained.json')):
        made = read_json(os.path.join(folder, 'run.json'))
        return f"done (for {made['trained_for']}{'; ' + old + ', reused' if old else ''})"
    return 'started' if os.path.exists(os.path.join(folder, 'ckpt.pt')) else 'to train'


def every_table(lab):
    """The Lab of each paper's table and of the every-rule table, at lab's budget and settings (a dry run without
    --table, --systems or --rows prices them all at once)."""
    settings, given = lab.command
    labs = [check_or_exit(lab_settings, {**settings, 'table': name}, given) for name in TABLES]
    for each in labs:
        check_or_exit(check_processes_share_each_step, each)
    return labs + [lab]


def print_cost(labs):
    """Print every run's command, parameters, tokens, training FLOPs and GPU-hours (studies/cost.py), whether it is
    trained, and the sums: of one table, or of several (each run once, under the first table that needs it, and each
    table's own sum, the runs it shares with a table above counted there). Nothing is trained, no data prepared, no
    folder made."""
    from studies.cost import gpu_hours
    lab = labs[0]
    hours = lambda flops: f"{gpu_hours(flops, lab.gpu, lab.mfu):,.1f} GPU-hours"
    names = ', '.join(f"{x.table_name or 'every rule'} (seeds {','.join(map(str, x.seeds))})" for x in labs)
    print(f"dry run: {'table ' + names if len(labs) == 1 and lab.table else names}, budget {lab.budget}; GPU-hours of "
          f"one {lab.gpu} ({PEAK_FLOPS[lab.gpu] / 1e12:.0f} TFLOP/s dense bf16) at MFU {lab.mfu}; training only "
          f"(scoring left out); nothing is trained" + (f"; data {sources_text(lab)}" if sources_text(lab) else ''))
    shapes, flops_of, states, sums = {}, {}, {}, []
    for lab in labs:
        runs = needed_runs(lab, planned_cells(lab)[1])
        for folder, run in runs.items():
            if folder not in states:  # a run two tables share: once
                states[folder] = run_state(lab, run, folder)
                flops_of[folder] = print_run(lab, run, folder, states[folder], shapes)
        table_flops = sum(flops_of[f] for f in runs)
        sums.append(f"{lab.table_name or 'every rule'}: {len(runs)} runs, {table_flops:.3g} FLOPs, "
                    f"{hours(table_flops)}")
    total = sum(flops_of.values())
    left = sum(flops_of[f] for f, state in states.items() if not state.startswith('done'))
    done = sum(state.startswith('done') for state in states.values())
    if len(labs) > 1:  # each table alone (a run it shares counted in each), then the papers' together
        print('\n'.join(f"table {line}" for line in sums))
        papers = {f for x in labs if x.table for f in needed_runs(x, planned_cells(x)[1])}
        print(f"the papers' tables together: {len(papers)} runs, {sum(flops_of[f] for f in papers):.3g} FLOPs, "
              f"{hours(sum(flops_of[f] for f in papers))}")
    print(f"total: {len(states)} runs ({len(states) - done} to train, {done} done), {total:.3g} FLOPs, "
          f"{hours(total)}; to train: {left:.3g} FLOPs, {hours(left)} ({gpu_hours(left, lab.gpu, lab.mfu) / 8:,.1f} "
          f"hours on 8 GPUs)")


def print_run(lab, run, folder, state, shapes):
    """Print one run's line of the dry run and its command; its training FLOPs (0 for a swapped row)."""
    from studies.cost import gpu_hours, run_cost
    script, args = run_command(lab, run)
    name = os.path.relpath(folder, lab.out_root)
    if script != 'train.py':  # a swapped row: k-means on one batch of the trained run, no training
        print(f"[{state}] {name}: swapped into {os.path.relpath(run_dir(lab, first_run(lab, run)), lab.out_root)}"
              f", no training\n    python {shlex.join([script, *args])}")
        return 0.0
    spread, note = spread_batch(lab, args)
    args = args + spread  # what its processes run: the step's samples unchanged
    base = base_run(lab, run)
    cost = run_cost(args, shapes.get(run_dir(lab, base)) if base else None)
    shapes[folder] = cost['model_args']
    print(f"[{state}] {name}: {count_text(cost['params'])} parameters, {count_text(cost['tokens'])} tokens (T "
          f"{cost['T']}), {cost['flops']:.3g} FLOPs, {gpu_hours(cost['flops'], lab.gpu, lab.mfu):,.1f} GPU-hours"
          f"{'; ' + note if note else ''}\n    python {shlex.join([script, *args])}")
    return cost['flops']


def check_processes_share_each_step(lab):
    """ValueError where the processes that train each run (lab.world_size: the launcher's, SLURM's nodes × GPUs
    included) cannot share some run's step (spread_batch), before anything runs or is submitted; a dry run too."""
    if lab.world_size == 1:
        return
    for run in needed_runs(lab, planned_cells(lab)[1]).values():
        script, args = run_command(lab, run)
        if script == 'train.py':
            try:
                spread_batch(lab, args)
            except ValueError as e:
                raise ValueError(f"{run.system} {run.row} at budget {lab.budget}: {e}") from None


def check_recipe_is_read(lab):
    """ValueError where the recipe holds a key that some rules read (recipe_args gives it to their runs) and no run
    of the lab's is one of theirs: it would change nothing."""
    from rules import ATTENTION, keys_read
    from studies.cost import train_settings
    given = {a.removeprefix('--').split('=', 1)[0] for a in shlex.split(lab.recipe)}
    owned = given & set().union(*(keys_read(name) for name in ATTENTION))
    if not owned:
        return
    runs = [run_command(lab, run) for run in needed_runs(lab, planned_cells(lab)[1]).values()]
    settings = [train_settings(args) for script, args in runs if script == 'train.py']
    for key in sorted(owned - set().union(*(keys_read(s['attention'], s['mix']) for s in settings))):
        readers = ', '.join(name for name in ATTENTION if key in keys_read(name))
        raise ValueError(f"recipe: --{key} is read only by {readers}, and no run of this table is one: it would "
                         f"change nothing; drop it, or pick a row that reads it with --rows")
