"""
The lab's settings, checked (studies/ablate.py's command line): the Lab every part of the lab is given (what runs:
the systems, the rows in the table's order and their train.py arguments at the budget, the seeds; where, and how),
each setting's check (a bad one is an error naming it, before any run starts), a table's cells planned (a Run per
seed) and the lab's folder taken, one table at a time in it.
"""
import os
import shlex
from dataclasses import dataclass
from typing import NamedTuple

from rules import ATTENTION
from studies.launch import SLURM_KEYS, check_launcher
from studies.systems import BUDGETS, SYSTEMS
from studies.tables import ROWS, TABLES, Table
from support.checks import check_distinct, check_int_list
from support.rundir import RunDir
from support.runtime import PEAK_FLOPS


SOURCES = ('text_source', 'cifar_source', 'cifar100_source')  # the settings a System's `data` names


@dataclass(frozen=True)
class Lab:
    """The checked settings, what every function of the lab is given: what runs, where, and how."""
    budget: str
    table_name: str         # '': every rule on every system
    table: Table | None     # TABLES[table_name]
    systems: list           # the columns picked
    rows: list              # the rows picked, in order
    rows_of: dict           # {system: [row]}: each system's rows, in the table's order
    arguments_of: dict      # {system: {row: train.py arguments}} at this budget
    seeds: list
    out_root: str
    recipe: str
    sources: dict           # {setting in SOURCES: a local copy of the data, or ''}
    tasks: str
    harness_args: str
    train_missing: bool
    reuse_stale: bool
    dry_run: bool
    gpu: str
    mfu: float
    nproc_per_node: int
    cells_at_once: int
    launcher: str           # studies/launch.py's: local, submitit_local or slurm
    nodes: int              # the SLURM settings (SLURM_KEYS)
    gpus_per_node: int
    partition: str
    time_min: int
    account: str
    cpus_per_task: int
    mem_gb: int
    command: tuple          # (settings, given): what a job rebuilds this Lab from where it lands

    @property
    def folder(self):
        """The runs, the table and its figures: out_root, or out_root/TABLE."""
        return os.path.join(self.out_root, self.table_name) if self.table_name else self.out_root

    @property
    def world_size(self):
        """The processes that train each run: nproc_per_node here (or a local job), nodes × gpus_per_node a SLURM
        job."""
        return self.nodes * self.gpus_per_node if self.launcher == 'slurm' else self.nproc_per_node


class Run(NamedTuple):
    row: str
    system: str
    seed: int
    arguments: str          # the row's train.py arguments for the system


def every_rule_rows():
    """{row: {system or 'causal': arguments}}: ROWS, then every other registered rule with its defaults."""
    every = dict(ROWS)
    for name, cls in ATTENTION.items():
        if name not in every:
            vit = (f'--attention={name}' if cls.has_bidirectional_form else
                   f'n/a: {cls.__name__} does not declare has_bidirectional_form')
            causal = (f'--attention={name}' if cls.has_causal_form else
                      f'n/a: {cls.__name__} does not declare has_causal_form')
            every[name] = {'causal': causal, 'vit': vit}
    return every


def row_arguments(row, system):
    """A row of every_rule_rows()'s arguments for a system: its own, else its kin's (vit100: vit's), else the GPT
    systems'."""
    return next(row[name] for name in (system, SYSTEMS[system].kin, 'causal') if name in row)


def own_rows(spec, budget):
    """{row: its own train.py arguments} of a table's system (a TableSystem) at `budget`, in the table's order (a
    row's paper_rows entry at the paper budget)."""
    return {**spec.rows, **(spec.paper_rows if budget == 'paper' else {})}


def table_rows(spec, budget):
    """{row: train.py arguments} of a table's system at `budget`: the settings every row shares, then the row's own."""
    return {row: f"{spec.shared} {arguments}".strip() for row, arguments in own_rows(spec, budget).items()}


def picked(key, text, valid, where=''):
    """The comma-separated names in `text` (setting `key`), each in `valid`; ValueError naming the key where one is
    unknown or none is picked."""
    names = [n for n in text.split(',') if n]
    unknown = [n for n in names if n not in valid]
    if not names or unknown:
        raise ValueError(f"{key}: {'unknown name(s) ' + ', '.join(unknown) + where if unknown else 'none picked'}; "
                         f"pass e.g. --{key}={','.join(valid[:2])} (valid: {', '.join(valid)})")
    check_distinct(key, names)
    return names


def table_picks(c, given, name):
    """(rows, systems, seeds text) of table `name`: its own systems and rows, in its order; --systems and --rows pick
    among them, --seeds where given."""
    spec, where = TABLES[name].systems, f" (not in table {name})"
    system_names = picked('systems', c['systems'] if 'systems' in given else ','.join(spec), list(spec), where)
    own = list(dict.fromkeys(row for s in system_names for row in spec[s].rows))
    row_names = [row for row in own if row in picked('rows', c['rows'] or ','.join(own), own, where)]
    system_names = [s for s in system_names if set(spec[s].rows) & set(row_names)]  # with a row picked
    return row_names, system_names, c['seeds'] if 'seeds' in given else '1337,1338,1339' if c['budget'] == 'cpu' \
        else '1337'


def compared_rows(spec, row_names):
    """A table's system's rows among `row_names`, in its order, after its first row (what each row is compared
    with: --rows=ROW runs ROW beside it, the first row's runs reused where they are trained)."""
    first = next(iter(spec.rows))
    return [first] + [r for r in spec.rows if r in row_names and r != first]


def every_rule_picks(c):
    """(rows, systems, seeds text) of the every-rule table."""
    columns = [name for name, system in SYSTEMS.items() if system.column]
    system_names, every = picked('systems', c['systems'], columns), list(every_rule_rows())
    return picked('rows', c['rows'] or ','.join(every), every), system_names, c['seeds']


LAB_KEYS = {  # train.py's keys the lab sets itself, and where a user sets them instead
    'seed': 'pass --seeds=N,... to the lab', 'out_dir': 'its folder under --out_root',
    'init_from': "a system's base run, or the run it resumes", 'data_source': 'pass --text_source or --cifar_source',
    'attention': 'a row\'s rule: pick rows with --rows', 'mix': "a row's form: pick rows with --rows",
    'nproc_per_node': "the lab's own --nproc_per_node (or --nodes, --gpus_per_node): it starts the processes"}


def check_the_rest(c, name, system_names):
    """ValueError naming the first bad setting of those that pick no row: commands, tasks, data and out_root."""
    for key in ('recipe', 'harness_args'):
        try:
            shlex.split(c[key])
        except ValueError as e:
            raise ValueError(f"{key} does not parse as command-line arguments ({e}); pass --{key}=\"...\" with "
                             f"balanced quotes") from None
    for arg in shlex.split(c['recipe']):  # a key the lab sets for each run itself: the recipe would contradict it
        key = arg.removeprefix('--').split('=', 1)[0]
        if key in LAB_KEYS:
            raise ValueError(f"recipe: --{key} is set by the lab for each run ({LAB_KEYS[key]}); drop it from "
                             f"--recipe")
    if c['tasks'] not in ('', 'none') and not (name and any(TABLES[name].systems[s].tasks for s in system_names)):
        raise ValueError(f"tasks={c['tasks']} scores a table's language models, and "
                         f"{'table ' + name + ' has none picked' if name else 'no table is picked'}; pass "
                         f"--table=tda or krause_lm (with --systems=text), or leave --tasks out")
    for key in SOURCES:
        if c[key] and not os.path.exists(c[key]):
            raise ValueError(f"{key}={c[key]} does not exist; pass a local copy of the data, or nothing to download it")
    if not c['out_root']:
        raise ValueError("out_root is empty; pass --out_root=DIR (the runs and the table go there)")
    if os.path.exists(c['out_root']) and not os.path.isdir(c['out_root']):
        raise ValueError(f"out_root={c['out_root']} is a file, not a folder; pass --out_root=DIR")
    if c['gpu'] not in PEAK_FLOPS:
        raise ValueError(f"gpu={c['gpu']!r} has no peak FLOP/s here; pass --gpu=NAME, one of {', '.join(PEAK_FLOPS)}")
    if not 0 < c['mfu'] <= 1:
        raise ValueError(f"mfu={c['mfu']} is not a fraction of the peak; pass e.g. --mfu=0.4")
    check_processes(c)


def check_processes(c):
    """ValueError where nproc_per_node asks for more GPUs than this node has (a CPU takes any count: gloo)."""
    import torch
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if c['nproc_per_node'] < 1 or (gpus and c['nproc_per_node'] > gpus):
        raise ValueError(f"nproc_per_node={c['nproc_per_node']} is not a process count this node runs (it has "
                         f"{gpus} GPUs); pass --nproc_per_node=1 .. {max(gpus, 1)}")
    if c['cells_at_once'] < 1 or (gpus and c['cells_at_once'] * c['nproc_per_node'] > gpus):
        raise ValueError(f"cells_at_once={c['cells_at_once']} runs of {c['nproc_per_node']} GPUs each do not fit "
                         f"this node's {gpus} GPUs (never two on one); pass --cells_at_once=1 .. "
                         f"{max(gpus // c['nproc_per_node'], 1)}")
    if not gpus and c['cells_at_once'] > 1 and not c['cells_on_cpu']:
        raise ValueError(f"cells_at_once={c['cells_at_once']} runs side by side on GPUs, and this machine has none; "
                         f"pass --cells_at_once=1, or --cells_on_cpu=True to share the CPU's cores among them")


def lab_settings(c, given=()):
    """The Lab of settings `c`; ValueError naming the first bad setting, before any run starts. given: the keys the
    command line set (a table's systems and seeds are its own unless given)."""
    if c['budget'] not in BUDGETS:
        raise ValueError(f"budget={c['budget']!r} is not a budget; pass --budget=tiny, cpu or paper")
    name, spec = c['table'], TABLES.get(c['table'])
    if name and not spec:
        raise ValueError(f"table={name!r} is not a table; pass --table=NAME, one of {', '.join(TABLES)}, or leave it "
                         f"out for every rule on every system")
    row_names, system_names, seed_text = table_picks(c, given, name) if spec else every_rule_picks(c)
    seed_list = check_int_list({'seeds': seed_text}, 'seeds', '1337,1338', at_least=0)
    check_distinct('seeds', seed_list)
    check_launcher(c, given)  # first: its advice on cells_at_once (jobs, not threads) is the one that works
    check_the_rest(c, name, system_names)
    if spec:  # each system's rows in the table's order, and their arguments at this budget
        rows_of = {s: compared_rows(spec.systems[s], row_names) for s in system_names}
        arguments_of = {s: table_rows(spec.systems[s], c['budget']) for s in system_names}
        row_names = [r for r in dict.fromkeys(r for s in system_names for r in spec.systems[s].rows)
                     if any(r in rows for rows in rows_of.values())]
    else:
        every = every_rule_rows()
        rows_of = {s: row_names for s in system_names}
        arguments_of = {s: {r: row_arguments(every[r], s) for r in row_names} for s in system_names}
    return Lab(c['budget'], name, spec, system_names, row_names, rows_of, arguments_of, seed_list, c['out_root'],
               c['recipe'], {k: c[k] for k in SOURCES}, c['tasks'], c['harness_args'], c['train_missing'],
               c['reuse_stale'], c['dry_run'], c['gpu'], c['mfu'], c['nproc_per_node'], c['cells_at_once'],
               c['launcher'], *(c[key] for key in SLURM_KEYS), (c, tuple(given)))


def planned_cells(lab):
    """({row: {system: cell}} with each cell's arguments (a table's: and the row's own), or why it has no run;
    [Run] of the cells to run, a run per seed)."""
    cells, todo = {}, []
    for system in lab.systems:
        own = own_rows(lab.table.systems[system], lab.budget) if lab.table else {}
        for row in lab.rows_of[system]:
            arguments = lab.arguments_of[system][row]
            cells.setdefault(row, {})[system] = {'args': arguments, 'seeds': {}, 'status': 'ok'}
            if lab.table:  # the row's own, beside the settings every row of the system shares
                cells[row][system]['own'] = own[row]
            if arguments.startswith('n/a'):
                cells[row][system].update(status='n/a', why=arguments)
            else:
                todo += [Run(row, system, seed, arguments) for seed in lab.seeds]
    return cells, todo


def take_folder(lab):
    """The lab's folder made and locked: one table at a time in it; Ctrl-C ends in one line."""
    try:
        os.makedirs(lab.folder, exist_ok=True)
    except OSError as e:
        raise SystemExit(f"error: cannot make out_root={lab.out_root} ({e.strerror}); nothing was trained yet; pass "
                         f"--out_root=DIR you can write to") from None
    try:
        RunDir(lab.folder, master=False).take_lock()
    except SystemExit as e:
        raise SystemExit(str(e.code).replace('out_dir', 'out_root')) from None
