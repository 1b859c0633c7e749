"""
The lab's tables, written: a cell per row and system, the mean ± the sample standard deviation over seeds (table.md,
table.json, with a header naming the budget, machine, torch, date, commit and data); a paper's table adds each row's
paired difference from its first row and the line of what they tell apart, and the paper's claims with their
verdicts (studies/verdicts.py, studies/claims.py); the figures beside table.md (studies/figures.py).
"""
import datetime
import json
import os
import platform
from dataclasses import asdict

import numpy as np

from prepare.atomic import write_or_exit, write_text
from studies.cells import tasks_of
from studies.claims import CLAIMS
from studies.figures import curves_figure, pyplot, read_log, values_figure
from studies.lab import planned_cells
from studies.runs import EVERY_RULE, commit_text, run_command, system_args
from studies.systems import SYSTEMS, Metric, at
from studies.tables import ANALYSIS
from studies.verdicts import against_threshold, paired, verdict


STATISTIC = "mean ± sample standard deviation (ddof=1) over the seeds"
PAIRED = ("each seed's run minus the first row's run of the same seed: the mean of the differences and its 95% "
          "interval, mean ± t(0.975, n − 1)·sd/√n (Student's t, n seeds)")


def mean_sd(values):
    """(mean, sample standard deviation (ddof=1); None for a single value)."""
    return float(np.mean(values)), (float(np.std(values, ddof=1)) if len(values) > 1 else None)


def seed_values(cell, key):
    """{seed: a cell's value of metric `key`}; None where it has none (not run, failed, n/a)."""
    if cell['status'] != 'ok':
        return None
    values = {seed: run['metrics'].get(key) for seed, run in cell['seeds'].items()}
    return None if not values or None in values.values() else values


def values_of(cell, key):
    """A cell's values of metric `key`, one per seed; None where it has none."""
    values = seed_values(cell, key)
    return None if values is None else list(values.values())


def measured_text(values, digits, mark=''):
    if values is None:
        return 'n/a'
    m, s = mean_sd(values)
    return f"{m:.{digits}f}" + ('' if s is None else f" ± {s:.{digits}f}") + mark


def wall_text(runs):
    """The runs' mean wall time (training and scoring), and their median training speed."""
    wall = np.mean([r['train_wall_s'] + r['score_wall_s'] for r in runs])
    rate = f", {np.median([r['rate'] for r in runs]):,.0f} {runs[0]['rate_unit']}" if runs[0]['rate'] else ''
    return f"{wall:,.0f} s{rate}"


def cell_text(cell, system):
    """A cell of the every-rule table.md: its metrics (joined as its system says), then wall time and speed."""
    if cell['status'] != 'ok':
        return cell['why'].replace('|', '/')
    numbers = [measured_text(values_of(cell, m.key), m.digits) for m in SYSTEMS[system].metrics]
    return f"{SYSTEMS[system].cell_join.join(numbers)}<br>{wall_text(list(cell['seeds'].values()))}"


def table_metrics(spec, system, task_names):
    """[Metric] a paper's table (a Table) shows for a system: the system's, analyze.py's where the table asks, and
    its zero-shot tasks `task_names`."""
    analysed = system in spec.analysis
    return [*SYSTEMS[system].metrics, *(ANALYSIS if analysed else ()), *(Metric(f'task_{n}', n, 4) for n in task_names)]


def metrics_of(lab, system):
    """[Metric] the lab's table shows for a system."""
    return table_metrics(lab.table, system, tasks_of(lab, system)) if lab.table else list(SYSTEMS[system].metrics)


def compared(cell, other, key):
    """verdicts.paired of a cell against another on metric `key`, seed by seed; None where either has no value."""
    values, against = seed_values(cell, key), seed_values(other, key)
    return None if values is None or against is None else paired(values, against)


def count_text(x):
    """A count in three significant digits with k, M or G; n/a for None."""
    if x is None:
        return 'n/a'
    scale, unit = next(((s, u) for s, u in ((1e9, 'G'), (1e6, 'M'), (1e3, 'k')) if x >= s), (1, ''))
    return f"{x / scale:.3g}{unit}"


def table_line(row, cell, first, metrics):
    """A row of a system's table: the row's own arguments, its metrics (`*`: the paired interval against the first
    row's cell excludes 0), parameters, attention FLOPs counted · ideal, wall time and speed."""
    own = f"| {row} | `{cell['own']}` | "
    if cell['status'] != 'ok':
        return own + cell['why'].replace('|', '/') + ' |' * (len(metrics) + 3)
    numbers = []
    for metric in metrics:
        comparison = compared(cell, first, metric.key) if cell is not first else None
        numbers.append(measured_text(values_of(cell, metric.key), metric.digits,
                                     '*' if comparison and comparison['apart'] else ''))
    params = values_of(cell, 'params')
    flops = [values_of(cell, key) for key in ('flops_counted', 'flops_ideal')]
    return own + ' | '.join([*numbers, 'n/a' if params is None else f"{round(np.mean(params)):,}",
                             ' · '.join(count_text(None if v is None else np.mean(v)) for v in flops),
                             wall_text(list(cell['seeds'].values()))]) + ' |'


def signed(x, digits):
    return f"{x:+.{digits}f}".replace('-', '−')


def difference_text(comparison, digits):
    """A paired difference as table.md shows it: mean [low, high], `*` where the interval excludes 0."""
    if comparison is None:
        return 'n/a'
    if comparison['half_width'] is None:
        return f"{signed(comparison['mean'], digits)} (one seed)"
    return (f"{signed(comparison['mean'], digits)} [{signed(comparison['low'], digits)}, "
            f"{signed(comparison['high'], digits)}]" + ('*' if comparison['apart'] else ''))


def paired_line(row, cell, first, metrics):
    """A row of a system's paired table: each metric's difference from the first row, seed by seed."""
    return f"| {row} | " + ' | '.join(difference_text(compared(cell, first, m.key), m.digits) for m in metrics) + ' |'


def told_apart(system, row_names, cells, metric):
    """The line under a system's table: on `metric` (its first), which rows the paired intervals tell apart from
    the first row, which way, and for the others the smallest difference their seeds could have shown."""
    first, better = row_names[0], 'lower' if metric.lower_is_better else 'higher'
    if len(row_names) == 1:
        return f"**{system}**, {metric.label}: {first} alone, nothing to compare."
    ways = {}
    for row in row_names[1:]:
        c = compared(cells[row][system], cells[first][system], metric.key)
        if c is None:
            ways.setdefault('no number', []).append(row)
        elif c['half_width'] is None:
            ways.setdefault('one seed, no interval', []).append(row)
        elif c['apart']:
            ways.setdefault('lower (the interval below 0)' if c['apart'] < 0 else 'higher (above 0)', []).append(row)
        else:
            ways.setdefault("not told apart (± the smallest difference its seeds could show)", []).append(
                f"{row} (±{c['half_width']:.{metric.digits}f})")
    said = '; '.join(f"{way}: {', '.join(rows)}" for way, rows in ways.items())
    return f"**{system}**, {metric.label} ({better} is better), against {first}, paired by seed: {said}."


def head_line(head):
    """The line above either table: budget, machine, torch, date, commit, seeds and recipe."""
    return (f"machine {head['machine']}; torch {head['torch']}; date {head['date']}; commit {head['commit']}; seeds "
            f"{head['seeds']}" + (f"; recipe `{head['recipe']}`" if head['recipe'] else '') +
            (f"; data {head['data']}" if head.get('data') else '') + '.')


def table_markdown(lab, head, cells, figures=None):
    """table.md of a paper's table: per system, its rows, their paired differences from the first row and the line
    of what they tell apart, its figures; then the paper's claims with their verdicts."""
    lines = [f"Table `{lab.table_name}`; budget `{head['budget']}`; {head_line(head)}", '',
             f"Each cell: {STATISTIC}; `*`: the row's paired difference from the first row has a 95% interval that "
             "excludes 0 (the differences under each table). Parameters: every parameter of the model. Attention "
             "FLOPs per token and layer (mean over layers): counted on the path that ran (FlopCounterMode) · the "
             "rule's ideal (support/flops.py)."]
    if lab.table.departs:
        lines += ['', f"Against the paper (at the paper budget): {lab.table.departs}."]
    for system in lab.systems:
        metrics, row_names = metrics_of(lab, system), lab.rows_of[system]
        first = cells[row_names[0]][system]
        lines += ['', f"### {system}: {SYSTEMS[system].about}", '',
                  f"Every row: {every_row(lab, system)}, then its own arguments.", '',
                  '| rule | arguments | ' + ' | '.join(m.label for m in metrics) +
                  ' | parameters | attention FLOPs: counted · ideal | time, speed |',
                  '| --- | --- |' + ' --- |' * (len(metrics) + 3)]
        lines += [table_line(row, cells[row][system], first, metrics) for row in row_names]
        if len(row_names) > 1:
            lines += ['', f"Against {row_names[0]}: {PAIRED}; `*` where it excludes 0.", '',
                      '| rule | ' + ' | '.join(m.label for m in metrics) + ' |', '| --- |' + ' --- |' * len(metrics)]
            lines += [paired_line(row, cells[row][system], first, metrics) for row in row_names[1:]]
        lines += ['', told_apart(system, row_names, cells, metrics[0]), *reused_line(lab, cells, row_names, system)]
        if figures and figures.get(system):
            lines += ['', 'Figures: ' + ' · '.join(f"[{label}]({name})" for label, name in figures[system]) + '.']
    return '\n'.join(lines + claims_markdown(lab, claim_results(lab, cells))) + '\n'


def threshold_compared(cell, threshold, key):
    """verdicts.against_threshold of a cell's values of metric `key`; None where it has none."""
    values = seed_values(cell, key)
    return None if values is None else against_threshold(values, threshold)


def premise_absent(premise, cell, metric):
    """Why a claim's premise (studies/claims.py) is not shown by `cell`, its row's, on the claim's metric; '' where
    it is, or where one seed can say neither (the claim's own verdict is then 'one seed')."""
    shown = threshold_compared(cell, premise.threshold, metric.key)
    if shown is not None and verdict(premise.way, shown) in ('holds', 'one seed'):
        return ''
    values = values_of(cell, metric.key)
    return (f"it presumes {premise.says}, and this table does not show it: {premise.row}'s {metric.label} "
            f"{measured_text(values, metric.digits)}" + ('' if shown is None else
            f", {premise.row} − {premise.threshold:g}: {difference_text(shown, metric.digits)}"))


def claim_results(lab, cells):
    """The table's claims (studies/claims.py) on the systems, metrics and rows it ran, each with its paired
    comparison (against the other row, or against its threshold) and verdict, as table.json keeps them."""
    results = []
    for claim in CLAIMS.get(lab.table_name, ()):
        system = claim.system
        named = {claim.row, claim.against, claim.premise.row if claim.premise else ''} - {''}
        if system not in lab.systems or not named <= set(lab.rows_of[system]):
            continue
        metric = next((m for m in metrics_of(lab, system) if m.key == claim.metric), None)
        if metric is None:
            continue
        cell = cells[claim.row][system]
        ours = (threshold_compared(cell, claim.threshold, claim.metric) if claim.threshold is not None else
                compared(cell, cells[claim.against][system], claim.metric))
        why = premise_absent(claim.premise, cells[claim.premise.row][system], metric) if claim.premise else ''
        said = 'no number' if ours is None else 'untestable here' if why else verdict(claim.way, ours)
        results.append({**asdict(claim), 'label': metric.label, 'digits': metric.digits, 'ours': ours,
                        'verdict': said, 'why': why})
    return results


def paper_text(result):
    """The paper's numbers of a claim: row − against = difference, or the one it reports."""
    paper, d = result['paper'], result['digits']
    if result['row'] in paper and result['against'] in paper:
        a, b = paper[result['row']], paper[result['against']]
        return f"{a:.{d}f} − {b:.{d}f} = {signed(a - b, d)}"
    return '; '.join(f"{row} {value:.{d}f}" for row, value in paper.items()) or 'no number for this metric'


def verdict_text(result):
    """A claim's verdict, with the smallest difference its seeds could have shown where they tell nothing."""
    ours = result['ours']
    if result['verdict'] == 'not told apart':
        return f"not told apart at this budget (±{ours['half_width']:.{result['digits']}f})"
    if result['verdict'] == 'untestable here':
        return f"untestable here: {result['why']}"
    return result['verdict']


def claims_markdown(lab, results):
    """table.md's last part: each claim, the paper's numbers, ours and the verdict."""
    if not results:
        return []
    scale = ("At the paper budget the rows follow the paper's recipe, where it departs as said above" if
             lab.budget == 'paper' else f"At budget `{lab.budget}` the models, data and steps are far smaller "
             "than the paper's: a verdict says whether this table's difference has the claimed direction, not that "
             "the paper's numbers hold")
    lines = ['', "### The paper's claims", '', f"{scale}. Ours: the paired difference (row − compared) and its 95% "
             "interval, from the tables above; for a claim of a bound (at least 99%), each seed's value less the "
             "bound. Holds: the interval on the claimed side of 0 (for a claim that a row matches or beats another: "
             "on its good side); contradicted: on the other side (for a claim that two rows are comparable: on "
             "either side); not told apart: the interval holds 0, with the smallest difference these seeds could "
             "have shown; untestable here: what the claim presumes (a sink to be free of) this table does not "
             "show.", '',
             '| claim | system: metric | compared | the paper | ours | verdict |',
             '| --- | --- | --- | --- | --- | --- |']
    for r in results:
        note = f" *({r['note']})*" if r['note'] else ''
        against = r['against'] or f"{r['threshold']:g} (the claim's bound)"
        lines.append(f"| {r['says']}{note} | {r['system']}: {r['label']} | {r['row']} − {against}: "
                     f"{r['way'].replace('_', ' ')} | {paper_text(r)} | {difference_text(r['ours'], r['digits'])} | "
                     f"{verdict_text(r)} |")
    return lines


def reused_line(lab, cells, row_names, system):
    """[the line under a system's table naming its rows whose runs another table trained (a run is trained once,
    in out_root/runs, table.json's `run`)], or [] where this table trained them all."""
    mine = lab.table_name or EVERY_RULE
    reused = [f"{row} ({', '.join(sorted({r['trained_for'] for r in cells[row][system]['seeds'].values()}))})"
              for row in row_names if any(r.get('trained_for', mine) != mine
                                          for r in cells[row][system]['seeds'].values())]
    lines = ['', f"Trained once for another table and reused here (its folder: table.json's `run`): "
                 f"{', '.join(reused)}."] if reused else []
    stale_runs = [f"{row} ({r['stale']})" for row in row_names for r in cells[row][system]['seeds'].values()
                  if r.get('stale')]
    return lines + (['', f"Trained by other code and reused as asked (--reuse_stale=True): "
                         f"{', '.join(stale_runs)}."] if stale_runs else [])


def every_row(lab, system):
    """What every row of a table's system runs before its own arguments, as table.md says it: a base that is a stage
    of the row's own (the long system's), then the system's from the base's checkpoint."""
    shared = lab.table.systems[system].shared
    text = f"`{' '.join(a for a in (system_args(lab, system), shared) if a) or '(train.py defaults)'}`"
    base, base_row = at(SYSTEMS[system].base, lab.budget), SYSTEMS[system].base_row
    if not base or base_row:
        return text
    said = f"the {base} system" if SYSTEMS[base].column else SYSTEMS[base].about
    return f"the base `{' '.join(a for a in (system_args(lab, base), shared) if a)}` ({said}), then from its " \
           f"checkpoint {text}"


def markdown(lab, head, cells, figures=None):
    """table.md of the every-rule table: each system's line, then a row per rule."""
    lines = [f"Budget `{head['budget']}`; {head_line(head)}", '', f"Each cell: {STATISTIC}; then the runs' mean wall "
             "time (training and scoring) and median training speed.", '']
    lines += [f"- **{s}**: {SYSTEMS[s].about}. `{SYSTEMS[s].args[lab.budget] or '(train.py defaults)'}`"
              for s in lab.systems]
    lines += ['', '| rule | ' + ' | '.join(f"{s}: {', '.join(m.label for m in SYSTEMS[s].metrics)}"
                                           for s in lab.systems) + ' |', '| --- |' + ' --- |' * len(lab.systems)]
    lines += [f"| {row} | " + ' | '.join(cell_text(cells[row][s], s) for s in lab.systems) + ' |' for row in lab.rows]
    for s in lab.systems:
        lines += reused_line(lab, cells, [r for r in lab.rows if r in cells and s in cells[r]], s)
    if figures:
        lines += ['', 'Figures: ' + ' · '.join(f"[{s}, {label}]({name})" for s, pairs in figures.items()
                                               for label, name in pairs) + '.']
    return '\n'.join(lines) + '\n'


def header(lab):
    """What table.md and table.json say above the table: the budget, machine, torch, date and commit; a paper's
    table's departures from the paper's setup (its Table's `departs`)."""
    import torch
    commit = commit_text()
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU'
    return {'budget': lab.budget, 'machine': f"{platform.machine()}, {os.cpu_count()} cores, {device}",
            'torch': torch.__version__, 'date': datetime.date.today().isoformat(), 'commit': commit,
            'seeds': ','.join(map(str, lab.seeds)), 'recipe': lab.recipe, 'data': sources_text(lab),
            **({'table': lab.table_name, 'departs': lab.table.departs} if lab.table else {})}


def sources_text(lab):
    """The local data a table's systems trained on in place of their own ('' where none): each source and the
    systems that read it, the system's dataset named (at the paper budget, the paper's)."""
    from studies.cost import train_settings
    said, todo = [], planned_cells(lab)[1]
    for key, path in lab.sources.items():
        readers = [s for s in lab.systems if at(SYSTEMS[s].data, lab.budget) == key]
        runs = [run_command(lab, run, out_dir=None) for run in todo if run.system in readers]
        if path and runs:
            datasets = sorted({train_settings(args)['dataset'] for script, args in runs if script == 'train.py'})
            said.append(f"--{key}={path} ({', '.join(readers)}: in place of {', '.join(datasets)})")
    return '; '.join(said)


def plots(lab, cells):
    """The figures (studies/figures.py) written beside table.md: {system: [(what it shows, file name)]}; None where
    matplotlib is missing."""
    plt = pyplot()
    if plt is None:
        return None
    written = {}
    for system in lab.systems:
        row_names = lab.rows_of[system]
        for metric in metrics_of(lab, system):
            values = {r: seed_values(cells[r][system], metric.key) for r in row_names}
            names = [r for r in row_names if values[r] is not None]
            if not names:
                continue
            first = cells[names[0]][system]
            comparisons = {r: compared(cells[r][system], first, metric.key) for r in names[1:]}
            title = (f"{system}: {metric.label} ({'lower' if metric.lower_is_better else 'higher'} is better), "
                     f"budget {lab.budget}, seeds {','.join(map(str, lab.seeds))}")
            fig = values_figure(plt, title, metric.label, names, values, comparisons)
            written.setdefault(system, []).append((metric.label, save_figure(lab, plt, fig, f"{system}_{metric.key}")))
        curves = run_curves(lab, plt, cells, system)
        if curves:
            written.setdefault(system, []).append(('curves', curves))
    return written


def run_curves(lab, plt, cells, system):
    """The validation and training curves of a system's rows, from their runs' log.jsonl: the file name, or None
    where no row logged any."""
    row_names = [r for r in lab.rows_of[system] if cells[r][system]['status'] == 'ok']
    logs = {r: [read_log(os.path.join(lab.out_root, run['run'])) for run in cells[r][system]['seeds'].values()]
            for r in row_names}
    key, label = next(((m.key, m.label) for m in SYSTEMS[system].metrics if m.key in ('val_loss', 'val_acc')),
                      ('val_loss', 'val loss'))
    fig = curves_figure(plt, f"{system}: training curves, budget {lab.budget}", row_names, logs, key,
                        f"{label} (train.py's estimate)")
    return fig and save_figure(lab, plt, fig, f"{system}_curves")


def save_figure(lab, plt, fig, name):
    """fig written as lab.folder/NAME.png; its file name."""
    path = os.path.join(lab.folder, f"{name}.png")
    write_or_exit(path, lambda tmp: fig.savefig(tmp, dpi=90, format='png'),
                  f"the runs, table.md and table.json are kept in {lab.folder}",
                  "free space, then run again with --train_missing=False")
    plt.close(fig)
    return os.path.basename(path)


def write_tables(lab, cells):
    """The figures written, then the table printed and written: table.md (linking the figures) and table.json."""
    head = header(lab)
    figures = plots(lab, cells)
    text = table_markdown(lab, head, cells, figures) if lab.table else markdown(lab, head, cells, figures)
    print('\n' + text)
    kept = f"the runs are kept in {lab.folder} and the table is printed above"
    todo = "free space (or fix the folder's permissions), then run again with --train_missing=False to write them"
    write_or_exit(os.path.join(lab.folder, 'table.md'), lambda tmp: write_text(tmp, text), kept, todo)
    record = {**head, 'statistic': STATISTIC, **({'paired': PAIRED} if lab.table else {}),
              'systems': {s: {'metric': SYSTEMS[s].about, 'budget_args': system_args(lab, s),
                              **({'shared': lab.table.systems[s].shared} if lab.table else {})}
                          for s in lab.systems}, 'rows': cells_record(lab, cells)}
    if lab.table:
        record['claims'] = claim_results(lab, cells)
    write_or_exit(os.path.join(lab.folder, 'table.json'), lambda tmp: write_text(tmp, json.dumps(record, indent=1)),
                  f"{kept}, table.md is written", todo)
    count = sum(len(pairs) for pairs in figures.values()) if figures is not None else 0
    print(f"wrote {lab.folder}/table.md, table.json" + (f" and {count} figures" if figures is not None else
                                                        " (no figures: pip install matplotlib for them)"))


def cells_record(lab, cells):
    """table.json's rows: each cell as run (its seeds' runs, their metrics), with, in a paper's table, each metric's
    values by seed and its paired difference from the system's first row (`against_first`)."""
    if not lab.table:
        return cells
    record = {}
    for system in lab.systems:
        first = cells[lab.rows_of[system][0]][system]
        for row in lab.rows_of[system]:
            cell = cells[row][system]
            keys = [m.key for m in metrics_of(lab, system)]
            extra = {'values': {k: seed_values(cell, k) for k in keys}}
            if cell is not first:
                extra['against_first'] = {k: compared(cell, first, k) for k in keys}
            record.setdefault(row, {})[system] = {**cell, **extra}
    return record
