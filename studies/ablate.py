"""
The lab's table: every attention rule on every system, trained and scored at one budget, with one command; and each
seed paper's comparison (--table=NAME), its rows on equal terms, with one command.

$ python studies/ablate.py --budget=cpu --text_source=input.txt --cifar_source=DIR    # the whole table on a CPU
$ python studies/ablate.py --budget=tiny --systems=recall,passkey --rows=softmax,krause  # seconds a run

The lab is data: the systems (the columns) in studies/systems.py, each one System: its train.py arguments at each
budget (tiny: seconds a run, the tests; cpu: the whole table in under two hours on 2 cores; paper: the seed papers'
configs, a GPU's job), the metric its paper reports and which way is better, how a run is scored, its data and the
run it starts from. The rows in studies/tables.py: ROWS, every rule in rules.ATTENTION with its official settings
per system (a rule registered there and not named in ROWS runs with its defaults), the mix form (Krause beside
softmax) and the sliding-window softmax baseline; and TABLES, the papers' tables. --recipe adds train.py arguments
to every run. Adding a system: one System in SYSTEMS (its arguments per budget, its metrics; `passkeys` where it is
scored on fresh passkeys, `full_keys` where train.py's full evaluation has its number; a row's own arguments in ROWS
where a rule needs them). Adding a table: one Table in TABLES (a TableSystem per system: its rows, the settings they
share, the paper's recipe).

The papers' tables (TABLES, --table=NAME): each seed paper's comparison, its rows and systems as the paper has them,
on equal terms: between two rows of a system only the rule differs (one position encoding, RoPE for the language
models; one shape, one recipe, one data order per seed). --rows and --systems pick among the table's own; a row it
does not have is an error before any run. At the paper budget each table runs its paper's recipe (TABLES says where
it departs). Three seeds by default at cpu (one at tiny and paper; --seeds for others). Each cell, of either table:
mean ± sample standard deviation (ddof=1) over the seeds. A paper's table adds the run's parameter count (every
parameter of the model, its own get_num_params(non_embedding=False)) and attention FLOPs per token and layer,
counted on the path that ran and the rule's ideal (support/flops.py), and compares each row with the system's
first row seed by seed (studies/verdicts.py: the mean of the paired differences and its 95% Student's t interval; `*`
where it excludes 0, one seed marks nothing); a line under each system's table says which rows it tells apart, which
way, and for the others the smallest difference their seeds could have shown. Then the paper's claims
(studies/claims.py), each with the paper's numbers, ours and a verdict: holds, contradicted, not told apart, or
untestable here. Figures beside table.md (matplotlib): each seed as a point with the paired intervals, and every row's
training curves from its runs' log.jsonl. --rows=ROW runs ROW beside the table's first row, the first row's runs
reused where they are trained. One command per table (the cpu budget, the default; --budget=tiny or paper for the
others):
$ python studies/ablate.py --table=tda --text_source=input.txt        # val loss, zeros, sink ratio; passkeys at 4x
$ python studies/ablate.py --table=krause_lm --text_source=input.txt   # standard, window .. krause (mix)
$ python studies/ablate.py --table=krause_vision --cifar_source=C10 --cifar100_source=C100  # ViT top-1
$ python studies/ablate.py --table=krause_images --cifar_source=C10    # pixel models: bits/dim, images/s
$ python studies/ablate.py --table=krause_llm --text_source=input.txt  # LoRA alone, LoRA + Krause shortcut
$ python studies/ablate.py --table=attentionx --text_source=input.txt --cifar_source=C10 --cifar100_source=C100
$ python studies/ablate.py --table=cluster --text_source=input.txt --cifar_source=C10  # trained, and swapped in
$ python studies/ablate.py --table=tda --budget=tiny --rows=softmax,tda --text_source=input.txt   # seconds a run
At the paper budget the language models' cells add the paper's zero-shot tasks, and the tda table's long system
SCROLLS, each a column (studies/harness.py on the run: lm-eval, an extra; the hub's data, or --harness_args naming
local files); --tasks=NAMES scores named tasks at any budget, on a GPT-2 BPE model (--recipe=--dataset=shakespeare).

Each run is trained once, whatever tables need it: it is named by what determines it (its command: the system's
arguments at the budget, the row's, the recipe, the data, the seed, its base), a hash in its folder's name,
out_root/runs/S/RULE-HASH-sN (train.log, ckpt.pt, run.json: its command and the table it was trained for), and every
table that needs it scores that run (the softmax GPT of attentionx and cluster, the softmax ViT of krause_vision and
cluster). A table's cell of row R, system S, seed N is out_root/S/R-sN (a table's: out_root/TABLE/S/R-sN; cell.json,
eval.log), its `run` the run's folder; table.md names the rows another table trained. A run whose cell.json is
there is never scored again, a trained run never trained again, and a run stopped in training goes on from its last
checkpoint: a killed table goes on where it was. A rule with no form for a system says why in its
cell; a run that fails holds its error: line and its log's path, and the others go on. Writes table.md, table.json
(in out_root, or out_root/TABLE), and a PNG per metric when matplotlib is installed. Times are the machine's: run
nothing else on it meanwhile.

The cost before the first step, and a node's GPUs:
$ python studies/ablate.py --table=cluster --budget=paper --dry_run=True   # each run's command, parameters, tokens,
                       # FLOPs and GPU-hours (studies/cost.py; --gpu=H100 --mfu=0.4), the runs done, the table's sum
$ python studies/ablate.py --budget=paper --dry_run=True   # every table at once: each table's sum, each run once
$ python studies/ablate.py --table=tda --budget=paper --nproc_per_node=8   # each run on 8 GPUs (torchrun, DDP)
$ python studies/ablate.py --table=krause_vision --budget=paper --cells_at_once=8  # 8 runs at once, a GPU each
A run's processes share each of its steps: where they do not divide its gradient_accumulation_steps, each micro-batch
is cut and the micro-steps multiplied, the samples of a step the recipe's (the dry run says so); a count of processes
that cannot share it is refused before anything runs, the dry run too. cells_at_once × nproc_per_node GPUs must be
there; scoring runs on one process (the first GPU of its cell's).
$ python studies/ablate.py --table=tda --budget=paper --launcher=slurm --nodes=2 --gpus_per_node=8 --partition=P
Each run one SLURM job (studies/launch.py, submitit), nodes × gpus_per_node processes under torchrun's rendezvous
(--cpus_per_task, 8 a GPU by default; --mem_gb); a job preempted or out of time goes on from its checkpoint; the
table is written when the last job lands (--launcher=submitit_local: the jobs on this machine).
Each run.json keeps the commit and a hash of the code that trains the run: a kept run of other code is flagged (dry
run, table.md), set aside (kept, renamed) and trained again, or reused with --reuse_stale=True, its table saying so.
A local source (--text_source, ...) is named in the dry run and table.md's header, with the dataset it stands for.
"""
import collections
import datetime
import hashlib
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from typing import NamedTuple

import numpy as np
from tqdm import tqdm

if __package__ in (None, ''):  # run as a script: the repo root on the path, as for prepare/
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from rules import ATTENTION
from prepare import ROOT
from prepare.atomic import write_atomically, write_or_exit, write_text
from studies.claims import CLAIMS
from studies.figures import curves_figure, pyplot, read_log, values_figure
from studies.launch import SLURM_KEYS, check_launcher, job_results, slurm_job, torchrun_args
from studies.systems import BUDGETS, SYSTEMS, Metric, at
from studies.tables import ANALYSIS, ROWS, TABLES, Table
from studies.verdicts import against_threshold, paired, verdict
from support.rundir import RunDir
from support.runtime import PEAK_FLOPS
from support.checks import check_distinct, check_int_list, check_or_exit, script_settings

# -----------------------------------------------------------------------------
budget = 'cpu'              # a name in systems.BUDGETS: 'tiny', 'cpu' or 'paper'
table = ''                  # a name in TABLES (a paper's comparison); '' = every rule on every system
systems = 'recall,text,passkey,vit,pixels,shortcut'  # names in SYSTEMS, the table's columns (a table: its own)
rows = ''                   # the table's rows by name (rules, mix, window); '' = every row (a table: its own)
seeds = '1337'              # a run per seed; cells show mean ± sample sd (a table: 1337,1338,1339 at cpu)
out_root = 'lab'            # the runs (a folder per run) and the table
train_missing = True        # train the runs that are missing; False: only tabulate what is there
recipe = ''                 # more train.py arguments for every run, after the budget's (e.g. "--dtype=float32")
text_source = ''            # the text and shortcut systems' data instead of the download (train.py --data_source)
cifar_source = ''           # the vit and pixels systems' CIFAR-10 (a folder with train/test.parquet)
cifar100_source = ''        # the vit100 system's CIFAR-100 (a folder with train/test.parquet)
tasks = ''                  # a table's zero-shot tasks (studies/harness.py) on its cells that have them: '' = the
                            # table's own at the paper budget and none below; 'none'; or names, at any budget
harness_args = ''           # more studies/harness.py arguments for those (e.g. "--limit=200 --batch_size=8")
dry_run = False             # print every run's command and cost (studies/cost.py) and the table's sum; train nothing
gpu = 'H100'                # the dry run's GPU-hours: on this GPU (a key of support/runtime.PEAK_FLOPS)
mfu = 0.4                   # at this model FLOPs utilisation
nproc_per_node = 1          # each run's training on this many processes of the node (torchrun, DDP: a GPU each;
                            # gloo processes on a CPU)
cells_at_once = 1           # runs side by side, each on its own GPU (its own nproc_per_node GPUs), never two on one
cells_on_cpu = False        # allow cells_at_once > 1 on a machine without GPUs (the runs share its cores: tests)
launcher = 'local'          # 'local': each run a process here; 'slurm': each run a SLURM job; 'submitit_local': a
                            # job on this machine (studies/launch.py, submitit)
nodes = 1                   # slurm: each run's job on this many nodes (torchrun's c10d rendezvous among them)
gpus_per_node = 1           # slurm: and this many processes, a GPU each, on each node
partition = ''              # slurm: the partition ('': the cluster's default)
time_min = 4320             # slurm (and submitit_local): a job's time limit in minutes; one that runs out, or is
                            # preempted, is resubmitted and goes on from its checkpoint
account = ''                # slurm: the account the jobs are charged to ('': the user's default)
reuse_stale = False         # reuse a kept run the code no longer trains alike (its cell says so); False: set it
                            # aside (kept, renamed) and train it again
cpus_per_task = 0           # slurm: CPUs of a node's task (torchrun and its gpus_per_node processes); 0 = 8 a GPU
mem_gb = 0                  # slurm: memory of each node's task in GB; 0 = the cluster's default
exec(open(ROOT / 'configurator.py').read())
# -----------------------------------------------------------------------------
SOURCES = ('text_source', 'cifar_source', 'cifar100_source')  # the settings a System's `data` names
EVERY_RULE = 'every-rule table'  # what a run's run.json says it was trained for outside a paper's table


@dataclass(frozen=True)
class Lab:
    """The checked settings, what every function below is given: what runs, where, and how."""
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
        """The processes that train each run: nproc_per_node here (or a local job), nodes × gpus_per_node a SLURM job."""
        return self.nodes * self.gpus_per_node if self.launcher == 'slurm' else self.nproc_per_node


class Run(NamedTuple):
    row: str
    system: str
    seed: int
    arguments: str          # the row's train.py arguments for the system


SLOT = threading.local()  # .env: the GPUs this thread's runs are pinned to (CUDA_VISIBLE_DEVICES), cells_at_once > 1
RUN_LOCKS = collections.defaultdict(threading.Lock)  # {run folder: its lock}: two cells never train one run at once
RUN_LOCKS_HELD = threading.Lock()  # while a thread finds or makes a run's lock


class Failed(Exception):
    """A step of a run that failed; its message is the error: line its cell holds."""


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


def check_the_rest(c, name, system_names):
    """ValueError naming the first bad setting of those that pick no row: commands, tasks, data and out_root."""
    for key in ('recipe', 'harness_args'):
        try:
            shlex.split(c[key])
        except ValueError as e:
            raise ValueError(f"{key} does not parse as command-line arguments ({e}); pass --{key}=\"...\" with "
                             f"balanced quotes") from None
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
    check_the_rest(c, name, system_names)
    check_launcher(c, given)
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
               c['reuse_stale'], c['dry_run'], c['gpu'], c['mfu'], c['nproc_per_node'], c['cells_at_once'], c['launcher'],
               *(c[key] for key in SLURM_KEYS), (c, tuple(given)))


# -----------------------------------------------------------------------------
# one run: train.py, then its scoring, each a process with its log in the run's folder


def system_args(lab, system):
    """The budget's train.py arguments of a system; at the paper budget a table's own recipe for it."""
    spec = lab.table.systems.get(system) if lab.table else None
    return spec.paper if spec and spec.paper and lab.budget == 'paper' else SYSTEMS[system].args[lab.budget]


def cell_dir(lab, run):
    """A table's cell of one run and seed: its cell.json and its scoring's eval.log (the table's own)."""
    return os.path.abspath(os.path.join(lab.folder, run.system, f'{run.row}-s{run.seed}'))


def run_dir(lab, run):
    """Where a run is trained, once for every table: out_root/runs/SYSTEM/RULE-KEY-sSEED, KEY the hash of what
    determines it (run_key)."""
    digest = hashlib.sha256(run_key(lab, run).encode()).hexdigest()[:10]
    name = f'{run_label(lab, run)}-{digest}-s{run.seed}'
    return os.path.abspath(os.path.join(lab.out_root, 'runs', run.system, name))


def run_label(lab, run):
    """The rule a run trains (its last --attention), for a readable folder name; a swapped row's is marked."""
    rules = [a.split('=', 1)[1] for a in shlex.split(run.arguments) if a.startswith('--attention=')]
    return (rules[-1] if rules else 'run') + ('-swapped' if swapped_from(lab, run) else '')


def run_key(lab, run):
    """What determines a run, as one text: the script and its arguments (the system's at the budget, the row's, the
    recipe, the data, the seed; its base's or trained run's folder, itself named by its key), out_root left out so
    that a lab moved elsewhere keeps its names."""
    script, args = run_command(lab, run, out_dir=None)
    return shlex.join([script, *args]).replace(os.path.abspath(lab.out_root), '<out_root>')


def base_run(lab, run):
    """The run this one starts from (its system's base: the text softmax run, the long base), or None."""
    system = SYSTEMS[run.system]
    base = at(system.base, lab.budget)
    if not base:
        return None
    if system.base_row:  # one run every row starts from
        return Run(system.base_row, base, run.seed, row_arguments(ROWS[system.base_row], base))
    return Run(run.row, base, run.seed, run.arguments)  # a stage of the row's own


def run_args(lab, run, out_dir=True):
    """train.py arguments of one run: the budget's system (after its base's, from the base's checkpoint), the row's
    rule, the recipe, the system's data, the run's seed and (out_dir) folder."""
    system, base = SYSTEMS[run.system], base_run(lab, run)
    args = system_args(lab, run.system)
    if base:
        args = f"{system_args(lab, base.system)} {args} --init_from={run_dir(lab, base)}/ckpt.pt"
    own = run.arguments if lab.table else f"{run.arguments} {system.every_rule_args}"
    data = at(system.data, lab.budget)
    source = [f'--data_source={os.path.abspath(lab.sources[data])}'] if lab.sources.get(data) else []
    if data == 'own':  # apart from the default's (passkeys of 1, 2, 4 needles at each length)
        source = [f"--data_dir={os.path.join(os.path.abspath(lab.out_root), 'data', run.system)}"]
    return [*shlex.split(args), *shlex.split(own), *shlex.split(lab.recipe), *source, f'--seed={run.seed}',
            *([f'--out_dir={run_dir(lab, run)}'] if out_dir else [])]


def swapped_from(lab, run):
    """The row of a table whose trained run `run` is swapped into (its `swapped_from`), or None: a row trained."""
    spec = lab.table.systems.get(run.system) if lab.table else None
    return spec.swapped_from.get(run.row) if spec else None


def swap_args(lab, run, out_dir=True):
    """studies/cluster_swap.py's arguments for a swapped row: the trained run it starts from, the row's cluster
    settings (its cluster_m the one m), and (out_dir) the row's folder, where the swapped model is written as
    ckpt.pt."""
    cluster = [a.replace('--cluster_m=', '--cluster_ms=') for a in shlex.split(run.arguments)
               if a.startswith('--cluster_')]
    return [f'--out_dir={run_dir(lab, first_run(lab, run))}', *cluster, f'--seed={run.seed}',
            *([f'--swap_out_dir={run_dir(lab, run)}'] if out_dir else [])]


def run_command(lab, run, out_dir=True):
    """(script, arguments) that make a run: studies/cluster_swap.py for a swapped row, else train.py."""
    if swapped_from(lab, run):
        return 'studies/cluster_swap.py', swap_args(lab, run, out_dir)
    return 'train.py', run_args(lab, run, out_dir)


def first_run(lab, run):
    """The run trained before this one: its base, or the row a swapped row is swapped into; None."""
    swapped = swapped_from(lab, run)
    if swapped:
        return Run(swapped, run.system, run.seed, table_rows(lab.table.systems[run.system], lab.budget)[swapped])
    return base_run(lab, run)


def code_of(lab, run):
    """{'commit', 'code'}: the checkout's commit, and a hash of the files that train `run` (its script, train.py, the
    model files, the registry, the mix, its rule's file and the machinery), as run.json keeps them."""
    from studies.cost import train_settings
    script, args = run_command(lab, run, out_dir=None)
    rule = train_settings(args)['attention'] if script == 'train.py' else 'cluster'
    files = [script, 'train.py', 'model.py', 'vit.py', 'attention.py', 'rules/__init__.py', 'rules/mix.py',
             f'rules/{rule}.py', *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / 'machinery').rglob('*.py'))]
    digest = hashlib.sha256()
    for name in dict.fromkeys(files):
        path = ROOT / name
        digest.update(name.encode() + b'\0' + (path.read_bytes() if path.exists() else b'') + b'\0')
    return {'commit': commit_text(), 'code': digest.hexdigest()[:12]}


def commit_text():
    """The checkout's short commit, said as such where it has uncommitted changes."""
    git = lambda *a: subprocess.run(['git', *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    commit = git('rev-parse', '--short', 'HEAD') or 'unknown (not a git checkout)'
    return commit + (' with uncommitted changes' if git('status', '--porcelain', '--untracked-files=no') else '')


def stale(lab, run):
    """'' where the run's folder is empty or this code trained it; else 'trained at C, the code now C2'."""
    path = os.path.join(run_dir(lab, run), 'run.json')
    if not os.path.exists(path):
        return ''
    made, now = read_json(path), code_of(lab, run)
    if made.get('code') == now['code']:
        return ''
    return f"trained at {made.get('commit', 'a commit not recorded')}, the code now {now['commit']}"


def set_aside(folder, made):
    """Rename a folder a stale run left (its run, or a cell of it), kept beside the new one; its new name."""
    aside = f"{folder}-code-{made.get('code', 'unrecorded')}"
    n = 1
    while os.path.exists(aside if n == 1 else f'{aside}-{n}'):
        n += 1
    os.rename(folder, aside if n == 1 else f'{aside}-{n}')
    return aside if n == 1 else f'{aside}-{n}'


def launched(script, args, log_path, ddp=()):
    """A script of the repo in a process of its own (ddp: python's torchrun arguments, torchrun_args), its output
    added to log_path; Failed with its error: line."""
    with open(log_path, 'a') as f:  # a run stopped and started again keeps both attempts' output
        start = f.tell()
        code = subprocess.run([sys.executable, *ddp, script, *args], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                              env={**os.environ, **getattr(SLOT, 'env', {})}).returncode
    if code:
        with open(log_path) as f:
            f.seek(start)
            errors = [line.strip() for line in f if line.startswith('error:')]
        raise Failed(errors[-1] if errors else f"error: {script} exited with code {code}")


def torchrun(lab, folder):
    """The torchrun arguments a run's training (in `folder`) starts under: nproc_per_node processes here, or in a
    SLURM job nodes × gpus_per_node, the nodes meeting at the job's first (a rendezvous named by job and run)."""
    if lab.launcher != 'slurm':
        return torchrun_args(lab.nproc_per_node)
    job = slurm_job() if lab.nodes > 1 else None
    return torchrun_args(lab.gpus_per_node, lab.nodes, job and {**job, 'id': f"{job['id']}-{os.path.basename(folder)}"})


def training_command(lab, run, folder):
    """(script, arguments) that make a run now: train.py on the lab's processes (spread_batch), going on from the
    run's checkpoint where a stop (Ctrl-C, a job preempted or out of time) left one."""
    script, args = run_command(lab, run)
    if script == 'train.py':
        args += spread_batch(lab, args)[0]
        if os.path.exists(os.path.join(folder, 'ckpt.pt')):
            args.append('--init_from=resume')
    return script, args


def spread_batch(lab, args):
    """([train.py arguments], what they change) that train a run of `args` on lab.world_size processes with the
    recipe's batch of a step. train.py's DDP shares a step's gradient_accumulation_steps G out among the processes;
    where they do not divide G, each micro-batch is cut in f (the least f that makes G·f a multiple of them) and G
    multiplied by f: batch_size·G, the samples of a step, unchanged. ValueError where batch_size has no such cut."""
    from studies.cost import train_settings
    settings, n = train_settings(args), lab.world_size
    steps, batch = settings['gradient_accumulation_steps'], settings['batch_size']
    if steps % n == 0:
        return [], ''
    cut = cut_of(steps, n)
    if batch % cut:
        shares = [m for m in range(1, steps * batch + 1) if batch % cut_of(steps, m) == 0]
        near = [max([m for m in shares if m < n], default=0), min([m for m in shares if m > n], default=0)]
        raise ValueError(f"{n} processes ({world_text(lab)}) cannot share a step of gradient_accumulation_steps="
                         f"{steps} × batch_size={batch} (no {cut}-way cut of the batch); pass a count of processes "
                         f"that shares it: {' or '.join(str(m) for m in near if m)}")
    return ([f'--batch_size={batch // cut}', f'--gradient_accumulation_steps={steps * cut}'],
            f"batch {batch} × {steps} micro-steps as {batch // cut} × {steps * cut} on {n} processes (a step's "
            f"samples unchanged)")


def cut_of(steps, n):  # the least f that makes steps·f a multiple of n
    return n // math.gcd(steps, n)


def world_text(lab):
    return (f"--nodes={lab.nodes} × --gpus_per_node={lab.gpus_per_node}" if lab.launcher == 'slurm' else
            f"--nproc_per_node={lab.nproc_per_node}")


def train_run(lab, run):
    """Train one run unless it is trained (its trained.json), the run it starts from first; go on from its
    checkpoint where a stop left one. Returns None, or the failure {'error', 'log'}."""
    folder = run_dir(lab, run)
    with RUN_LOCKS_HELD:
        lock = RUN_LOCKS[folder]
    with lock:  # a base two cells side by side start from is trained by one, then read by both
        if stale(lab, run) and not lab.reuse_stale:  # trained (or begun) by other code: kept aside, trained again
            set_aside(folder, read_json(os.path.join(folder, 'run.json')))
        if os.path.exists(os.path.join(folder, 'trained.json')):
            return None
        return train_missing_run(lab, run, folder)


def train_missing_run(lab, run, folder):
    """train_run of a run not trained yet, in `folder`."""
    first = first_run(lab, run)
    failed = first and train_run(lab, first)
    if failed:
        return {'error': f"its base ({first.system} {first.row} seed {run.seed}) failed: {failed['error']}",
                'log': failed['log']}
    os.makedirs(folder, exist_ok=True)
    if not os.path.exists(os.path.join(folder, 'run.json')):  # what determines it, and the table it was made for
        write_atomically(os.path.join(folder, 'run.json'), lambda tmp: write_text(tmp, json.dumps(
            {'key': run_key(lab, run), 'trained_for': lab.table_name or EVERY_RULE, 'budget': lab.budget,
             **code_of(lab, run)})))
    log, t0 = os.path.join(folder, 'train.log'), time.time()
    script, args = training_command(lab, run, folder)
    try:
        launched(script, args, log, torchrun(lab, folder) if script == 'train.py' else ())
    except Failed as e:
        return {'error': str(e), 'log': log}
    write_atomically(os.path.join(folder, 'trained.json'), lambda tmp: write_text(tmp, json.dumps(
        {'wall_s': time.time() - t0, 'args': args, 'nproc_per_node': lab.nproc_per_node, 'launcher': lab.launcher,
         **({'nodes': lab.nodes, 'gpus_per_node': lab.gpus_per_node} if lab.launcher == 'slurm' else {})})))
    return None


def follow_training(lab, run):
    """On a SLURM job's other nodes: their processes of each training the first node starts for `run` (the runs
    it starts from, then its own, those not trained), in its order, met at torchrun's rendezvous; no scoring, no
    record (the first node's). None."""
    chain = []
    while run and not os.path.exists(os.path.join(run_dir(lab, run), 'trained.json')):
        chain.insert(0, run)
        run = first_run(lab, run)
    for run in chain:
        folder = run_dir(lab, run)
        script, args = training_command(lab, run, folder)
        if script == 'train.py':
            launched(script, args, os.path.join(folder, f"train-node{slurm_job()['rank']}.log"), torchrun(lab, folder))


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


def read_json(path):
    with open(path) as f:
        return json.load(f)


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
    result = {**scored, **({'stale': old} if old else {}), 'train_wall_s': trained['wall_s'], 'score_wall_s': time.time() - t0, 'rate': rate,
              'rate_unit': unit, 'args': shlex.join(trained['args']), 'run': os.path.relpath(folder, lab.out_root),
              'trained_for': made['trained_for']}
    write_atomically(path, lambda tmp: write_text(tmp, json.dumps(result)))
    return result


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


def cell_results(lab, todo):
    """(run, cell_run's result) of each run of `todo`: one after the other, or cells_at_once side by side, each
    thread's runs pinned to GPUs of their own (CUDA_VISIBLE_DEVICES: nproc_per_node of them), in the order they end."""
    if lab.launcher != 'local':
        yield from job_results(lab, job_waves(lab, todo), *lab.command)
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
    """[[(work, Run)]] of the jobs (studies/launch.py): the runs of `todo` ('cell_run') and those they start from
    ('train_run', where no cell of todo is that run), each in the wave after the run it starts from, and never two
    jobs of one run folder in one wave (two jobs never train one run)."""
    depth = lambda run: 1 + depth(first_run(lab, run)) if first_run(lab, run) else 0
    cells = {run_dir(lab, run) for run in todo}
    jobs = [('cell_run', run) for run in todo]
    jobs += [('train_run', run) for folder, run in needed_runs(lab, todo).items() if folder not in cells]
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
        raise SystemExit(f"error: interrupted ({'Ctrl-C' if e.code == 130 else 'SIGTERM'}); the finished runs are kept in {lab.folder} (a cell.json "
                         f"each) and a run stopped in training goes on from its checkpoint; run the same command "
                         f"again to go on") from None
    progress.close()


# -----------------------------------------------------------------------------
# the tables: a cell per row and system, the mean ± the sample standard deviation over seeds; a paper's table adds
# each row's paired difference from its first row, and the paper's claims with their verdicts (studies/verdicts.py)
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
             '| claim | system: metric | compared | the paper | ours | verdict |', '| --- | --- | --- | --- | --- | --- |']
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


# -----------------------------------------------------------------------------
# the dry run: every run's command and cost, before the first step


def needed_runs(lab, todo):
    """Every run `todo` needs, each once (by its folder: a run two cells share is one), a run's first before it."""
    runs = {}

    def add(run):
        first = first_run(lab, run)
        if first:
            add(first)
        runs.setdefault(run_dir(lab, run), run)
    for run in todo:
        add(run)
    return runs


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


def main():
    lab = check_or_exit(lab_settings, script_settings(globals()), overridden)  # before any work
    check_or_exit(check_processes_share_each_step, lab)  # the dry run too: it prices what would run
    if lab.dry_run:
        return print_cost(every_table(lab) if not lab.table_name and not {'systems', 'rows'} & set(overridden) else
                          [lab])
    take_folder(lab)
    cells, todo = planned_cells(lab)
    run_cells(lab, cells, todo)
    write_tables(lab, cells)
    failed = [f"{s} {r}" for r in lab.rows for s in lab.systems if r in lab.rows_of[s] and
              cells[r][s]['status'] == 'failed']
    if failed:
        raise SystemExit(f"error: {len(failed)} cell(s) failed ({', '.join(failed)}); each says why in the table; "
                         f"the other runs are kept in {lab.folder}; fix the cause, then run the same command again")


if __name__ == '__main__':
    main()
