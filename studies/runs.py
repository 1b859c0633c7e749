"""
One run of the lab, trained once for every table that needs it: its folder, named by what determines it (run_dir,
run_key), and a table's cell of it (cell_dir); its command (train.py with the system's arguments at the budget, the
row's, the recipe's, or studies/cluster_swap.py for a swapped row), its step shared among the processes that train
it (spread_batch); the hash of the code that trains it, a kept run of other code set aside (stale); its training, a
process of its own (launched, under torchrun), the run it starts from first, one thread at a time per run folder.
"""
import collections
import hashlib
import json
import math
import os
import shlex
import subprocess
import sys
import threading
import time

from prepare import ROOT
from prepare.atomic import write_atomically, write_text
from studies.lab import Run, row_arguments, table_rows
from studies.launch import slurm_job, torchrun_args
from studies.systems import SYSTEMS, at
from studies.tables import ROWS


EVERY_RULE = 'every-rule table'  # what a run's run.json says it was trained for outside a paper's table
SLOT = threading.local()  # .env: the GPUs this thread's runs are pinned to (CUDA_VISIBLE_DEVICES), cells_at_once > 1
RUN_LOCKS = collections.defaultdict(threading.Lock)  # {run folder: its lock}: two cells never train one run at once
RUN_LOCKS_HELD = threading.Lock()  # while a thread finds or makes a run's lock


class Failed(Exception):
    """A step of a run that failed; its message is the error: line its cell holds."""


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
    args = [*shlex.split(args), *shlex.split(own)]
    return [*args, *recipe_args(lab, args), *source, f'--seed={run.seed}',
            *([f'--out_dir={run_dir(lab, run)}'] if out_dir else [])]


def recipe_args(lab, args):
    """The recipe's arguments for a run of train.py `args`: a key some rules read (their Config's, their `reads`:
    rules.keys_read) goes to the runs of a rule that reads it, every other key to every run."""
    from rules import ATTENTION, keys_read
    from studies.cost import train_settings
    recipe = shlex.split(lab.recipe)
    if not recipe:
        return []
    settings = train_settings(args)
    unread = set().union(*(keys_read(name) for name in ATTENTION)) - keys_read(settings['attention'], settings['mix'])
    return [a for a in recipe if a.removeprefix('--').split('=', 1)[0] not in unread]


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


def read_json(path):
    with open(path) as f:
        return json.load(f)


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
