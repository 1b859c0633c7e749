"""
The lab's table: every attention rule on every system, trained and scored at one budget, with one command.

$ python studies/ablate.py --budget=cpu --text_source=input.txt --cifar_source=DIR    # the whole table on a CPU
$ python studies/ablate.py --budget=tiny --systems=recall,passkey --rules=softmax,krause  # seconds a run

Rows (ROWS): every rule in attention.ATTENTION with its official settings per system (a rule registered there and
not named in ROWS runs with its defaults), the mix form (Krause beside softmax) and the sliding-window softmax
baseline. Columns (SYSTEMS): the systems, each scored with the metric its paper reports. A budget (BUDGETS) is each
system's train.py arguments: tiny (seconds a run: the tests), cpu (the whole table in under two hours on 2 cores),
paper (the seed papers' configs: a GPU's job). --recipe adds train.py arguments to every run.

Run R of system S with seed N lives in out_root/S/R-sN (train.log, eval.log, ckpt.pt, cell.json). A run whose
cell.json is there is never trained again, and a run stopped in training goes on from its last checkpoint: a
killed table goes on where it was. A rule with no form for a system says why in its cell; a run that fails holds
its error: line and its log's path, and the others go on. Writes out_root/table.md, table.json, and a PNG per
metric when matplotlib is installed. Times are the machine's: run nothing else on it meanwhile.
"""
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time

import numpy as np
from tqdm import tqdm

if __package__ in (None, ''):  # run as a script: the repo root on the path, as for prepare/
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from attention import ATTENTION
from prepare import ROOT
from support.atomic import write_atomically, write_or_exit, write_text
from support.rundir import RunDir
from support.checks import check_int_list, check_or_exit, script_settings

# -----------------------------------------------------------------------------
budget = 'cpu'              # a name in BUDGETS: 'tiny', 'cpu' or 'paper'
systems = 'recall,text,passkey,vit,pixels,shortcut'  # names in SYSTEMS, the table's columns
rules = ''                  # names in rows(), the table's rows; '' = every row
seeds = '1337'              # a run per seed; cells show mean ± half the range
out_root = 'lab'            # the runs (a folder per run) and the table
train = True                # train the runs that are missing; False: only tabulate what is there
recipe = ''                 # more train.py arguments for every run, after the budget's (e.g. "--dtype=float32")
text_source = ''            # the text and shortcut systems' data instead of the download (train.py --data_source)
cifar_source = ''           # the vit and pixels systems' CIFAR-10 (a folder with train/test.parquet)
exec(open(ROOT / 'configurator.py').read())
# -----------------------------------------------------------------------------
SYSTEMS = {  # the columns: what each trains, and the metric its paper reports
    'recall': 'multi-query associative recall (the default job): answer accuracy, whole val split',
    'text': 'language model (tiny-shakespeare characters; paper: GPT-2 on FineWeb-Edu): val loss, whole val split',
    'passkey': 'passkey retrieval trained at T: whole-passkey accuracy at 1x / 2x / 4x T',
    'vit': 'ViT on CIFAR-10: top-1 accuracy, test split',
    'pixels': 'pixel model on CIFAR-10: bits/dim on the test split; images/s drawn at a fixed batch',
    'shortcut': 'a pretrained base fine-tuned with the rule as a LoRA shortcut beside its softmax: val loss',
}
SOURCES = {'text': 'text_source', 'shortcut': 'text_source', 'vit': 'cifar_source', 'pixels': 'cifar_source'}
# The budgets: each system's train.py arguments (the shortcut's are added to the base's), and the lab's own settings:
# base ('text': the text system's softmax run of the same seed is the base; else a name for --init_from, 'gpt2'),
# passkey_examples (fresh episodes per length) and draw_batch (images drawn at once for images/s).
CPU = '--device=cpu --compile=False'
LORA = '--lora_rank=16 --lora_alpha=32 --lora_dropout=0.1'
SHORT = '--eval_iters=1 --log_interval=5 --warmup_iters=2'
BUDGETS = {
    'tiny': {  # seconds a run: what the tests use
        'recall': f'{CPU} {SHORT} --n_layer=1 --n_embd=32 --batch_size=32 --max_iters=20 --lr_decay_iters=20',
        'text': f'config/shakespeare_char.py {CPU} {SHORT} --n_layer=1 --n_head=2 --n_embd=32 --block_size=32 '
                '--batch_size=8 --dropout=0 --max_iters=20 --lr_decay_iters=20 --eval_interval=20 --eval_examples=64',
        'passkey': f'config/passkey.py {CPU} {SHORT} --n_layer=1 --n_embd=32 --batch_size=16 --max_iters=20 '
                   '--lr_decay_iters=20 --eval_interval=20',
        'vit': f'config/softmax_vit.py {CPU} {SHORT} --n_layer=1 --n_head=2 --n_embd=32 --batch_size=16 --max_iters=4 '
               '--lr_decay_iters=4 --warmup_iters=1 --eval_interval=4 --eval_examples=64',
        'pixels': f'config/arm_cifar10_cpu_softmax.py {SHORT} --n_layer=1 --n_embd=32 --batch_size=2 --max_iters=2 '
                  '--lr_decay_iters=2 --warmup_iters=1 --eval_interval=2 --eval_examples=2',
        'shortcut': f'{LORA} --max_iters=10 --lr_decay_iters=10 --eval_interval=10',
        'base': 'text', 'passkey_examples': 64, 'draw_batch': 2,
    },
    'cpu': {  # the whole table in under two hours on 2 cores, one seed; RESULTS.md's CPU recipes, some shortened
        'recall': CPU,  # the default job: 600 iterations of 256 sequences
        'text': f'config/shakespeare_char.py {CPU} --n_layer=4 --n_head=4 --n_embd=128 --block_size=64 --batch_size=12 '
                '--dropout=0 --max_iters=1000 --lr_decay_iters=1000 --eval_iters=20',  # the ablation's baby GPT, 1/2
        'passkey': f'config/passkey.py {CPU}',  # 500 iterations of 64 episodes of 64 tokens
        'vit': f'config/softmax_vit.py {CPU} --n_layer=4 --n_head=4 --n_embd=128 --batch_size=64 --max_iters=200 '
               '--lr_decay_iters=200 --warmup_iters=10 --eval_interval=200 --eval_iters=10',  # a quarter epoch
        'pixels': 'config/arm_cifar10_cpu_softmax.py --max_iters=20 --lr_decay_iters=20 --warmup_iters=2 '
                  '--eval_interval=20 --eval_examples=100',  # bits/dim of the first 100 test images
        'shortcut': f'{LORA} --max_iters=300 --lr_decay_iters=300 --warmup_iters=20 --eval_interval=300',
        'base': 'text', 'passkey_examples': 500, 'draw_batch': 8,
    },
    'paper': {  # the seed papers' configs (a GPU's job; not run here)
        'recall': '', 'text': 'config/softmax_fineweb.py', 'passkey': 'config/passkey.py',
        'vit': 'config/softmax_vit.py', 'pixels': 'config/arm_cifar10_softmax.py',
        'shortcut': 'config/finetune_shakespeare_lora.py', 'base': 'gpt2', 'passkey_examples': 500, 'draw_batch': 200,
    },
}
# The rows: each rule's train.py arguments per system; 'causal' serves every GPT system the row does not name.
# A value starting 'n/a' says why the row has no such run.
ROWS = {
    'softmax': {'causal': '--attention=softmax', 'vit': '--attention=softmax'},
    'krause': {'causal': '--attention=krause --krause_window=32 --krause_topk=16',  # the paper's LM
               'pixels': '--attention=krause --krause_window=256 --krause_topk=192',  # its pixel model
               'vit': '--attention=krause --krause_topk=2 --krause_radius=1 --krause_sigma=2.5'},  # config/krause_vit.py
    'attentionx': {'causal': '--attention=attentionx --attnx_gamma=3',
                   'vit': '--attention=attentionx --attnx_gamma=1 --attnx_mask_diagonal=True'},
    'tda': {'causal': '--attention=tda --pos_emb=rope --tda_beta=0.5',  # β₀ = 0.5 fits small models (RESULTS.md)
            'shortcut': '--attention=tda --tda_beta=0.5', 'vit': '--attention=tda'},  # the base's positions
    'cluster': {'causal': '--attention=cluster --cluster_chunk=16', 'pixels': '--attention=cluster --cluster_chunk=64',
                'vit': '--attention=cluster --cluster_iters=1 --cluster_self=True'},
    'mix': {'causal': '--attention=krause --mix=True --krause_window=32 --krause_topk=16',
            'pixels': '--attention=krause --mix=True --krause_window=256 --krause_topk=192',
            'vit': 'n/a: the mix form adds a causal softmax branch (GPT systems)',
            'shortcut': 'n/a: every shortcut is a mix form beside the base softmax (the krause row is this one)'},
    # the baselines (every other one runs with its defaults, each the paper's setting where it has one)
    'longformer': {'causal': '--attention=longformer --longformer_window=32 --longformer_window_last=512',  # grows
                   'pixels': '--attention=longformer --longformer_window=256'},  # over depth (config/longformer_gpt.py)
    'window': {'causal': '--attention=softmax --window=32', 'pixels': '--attention=softmax --window=256',
               'vit': 'n/a: the sliding window is causal and 1-D (GPT systems)',
               'shortcut': "n/a: a window is the base softmax's own shape (window=0), which a fine-tune keeps"},
}


def rows():
    """{row: {system or 'causal': arguments}}: ROWS, then every other registered rule with its defaults."""
    table = dict(ROWS)
    for name, cls in ATTENTION.items():
        if name not in table:
            vit = (f'--attention={name}' if cls.has_bidirectional_form else
                   f'n/a: {cls.__name__} does not declare has_bidirectional_form')
            causal = (f'--attention={name}' if cls.has_causal_form else
                      f'n/a: {cls.__name__} does not declare has_causal_form')
            table[name] = {'causal': causal, 'vit': vit}
    return table


def check_lab_settings(c):
    """(rows, systems, seeds); ValueError naming the first bad setting, before any run starts."""
    if c['budget'] not in BUDGETS:
        raise ValueError(f"budget={c['budget']!r} is not a budget; pass --budget=tiny, cpu or paper")
    names = {}
    for key, valid in (('systems', list(SYSTEMS)), ('rules', list(rows()))):
        picked = [n for n in c[key].split(',') if n] or (valid if key == 'rules' else [])
        unknown = [n for n in picked if n not in valid]
        if not picked or unknown:
            raise ValueError(f"{key}: {'unknown name(s) ' + ', '.join(unknown) if unknown else 'none picked'}; pass "
                             f"e.g. --{key}={','.join(valid[:2])} (valid: {', '.join(valid)})")
        names[key] = picked
    seed_list = check_int_list(c, 'seeds', '1337,1338', at_least=0)
    try:
        shlex.split(c['recipe'])
    except ValueError as e:
        raise ValueError(f"recipe does not parse as command-line arguments ({e}); pass --recipe=\"...\" with "
                         f"balanced quotes") from None
    for key in ('text_source', 'cifar_source'):
        if c[key] and not os.path.exists(c[key]):
            raise ValueError(f"{key}={c[key]} does not exist; pass a local copy of the data, or nothing to download it")
    if not c['out_root']:
        raise ValueError("out_root is empty; pass --out_root=DIR (the runs and the table go there)")
    if os.path.exists(c['out_root']) and not os.path.isdir(c['out_root']):
        raise ValueError(f"out_root={c['out_root']} is a file, not a folder; pass --out_root=DIR")
    return names['rules'], names['systems'], seed_list


# -----------------------------------------------------------------------------
# one run: train.py, then its scoring, each a process with its log in the run's folder


def run_args(row, system, seed, arguments):
    """train.py arguments of one run: the budget's system, the row's rule, the recipe, the run's seed and folder."""
    plan = BUDGETS[budget]
    system_args = plan[system]
    if system == 'shortcut':  # the rule beside the base's own softmax, LoRA on both
        arguments += ' --mix=True'
        if plan['base'] == 'text':
            system_args = f"{plan['text']} {system_args} --init_from={run_dir('softmax', 'text', seed)}/ckpt.pt"
    source = globals()[SOURCES[system]] if system in SOURCES else ''
    source = [f'--data_source={os.path.abspath(source)}'] if source and (system != 'shortcut' or
                                                                           plan['base'] == 'text') else []
    return [*shlex.split(system_args), *shlex.split(arguments), *shlex.split(recipe), *source, f'--seed={seed}',
            f'--out_dir={run_dir(row, system, seed)}']


def run_dir(row, system, seed):
    return os.path.abspath(os.path.join(out_root, system, f'{row}-s{seed}'))


def launch(script, args, log_path):
    """A script of the repo in a process of its own, its output added to log_path: (exit code, its error: line)."""
    with open(log_path, 'a') as f:  # a run stopped and started again keeps both attempts' output
        start = f.tell()
        code = subprocess.run([sys.executable, script, *args], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode
    with open(log_path) as f:
        f.seek(start)
        errors = [line.strip() for line in f if line.startswith('error:')]
    return code, (errors[-1] if errors else f"error: {script} exited with code {code}")


def train_run(row, system, seed, arguments):
    """Train one run unless it is trained (its trained.json); go on from its checkpoint where a stop left one.
    Returns None, or the failure {'error', 'log'}."""
    folder = run_dir(row, system, seed)
    if os.path.exists(os.path.join(folder, 'trained.json')):
        return None
    if system == 'shortcut' and BUDGETS[budget]['base'] == 'text':  # the base first: the text system's softmax run
        failed = train_run('softmax', 'text', seed, ROWS['softmax']['causal'])
        if failed:
            return {'error': f"the base (text softmax seed {seed}) failed: {failed['error']}", 'log': failed['log']}
    os.makedirs(folder, exist_ok=True)
    args = run_args(row, system, seed, arguments)
    if os.path.exists(os.path.join(folder, 'ckpt.pt')):
        args.append('--init_from=resume')
    log = os.path.join(folder, 'train.log')
    t0 = time.time()
    code, error = launch('train.py', args, log)
    if code:
        return {'error': error, 'log': log}
    write_atomically(os.path.join(folder, 'trained.json'), lambda tmp: write_text(tmp, json.dumps(
        {'wall_s': time.time() - t0, 'args': args})))
    return None


def score_run(row, system, seed, arguments):
    """Score a trained run with its system's metric: {'metrics', 'log'} or the failure {'error', 'log'}."""
    folder, plan = run_dir(row, system, seed), BUDGETS[budget]
    log = os.path.join(folder, 'eval.log')
    if system == 'passkey':  # accuracy at 1x, 2x and 4x the trained length, fresh episodes
        code, error = launch('studies/extrapolate.py', [f'--out_dir={folder}', '--multiples=1,2,4', '--json_out=True',
                                                       f"--num_examples={plan['passkey_examples']}"], log)
        if code:
            return {'error': error, 'log': log}
        with open(log) as f:
            lines = [json.loads(line) for line in f if line.startswith('{')]
        return {'metrics': {f"acc_{r['multiple']}x": r['passkey_acc'] for r in lines}, 'log': log}
    args = [*run_args(row, system, seed, arguments), '--init_from=resume', '--eval_only=True', '--eval_full=True']
    code, error = launch('train.py', args, log)
    if code:
        return {'error': error, 'log': log}
    with open(os.path.join(folder, 'eval_full.json')) as f:
        full = json.load(f)
    metrics = {'val_loss': full['val_loss'], 'examples': full['examples']}
    if system in ('recall', 'vit'):
        metrics['val_acc'] = full['val_acc']
    if system == 'pixels':
        metrics['bits_per_dim'] = full['bits_per_dim']
        try:
            metrics['draw_images_per_s'] = draw_speed(folder, plan['draw_batch'])
        except Exception as e:  # measured in this process: whatever goes wrong is this cell's, not the table's
            return {'error': f"error: drawing {plan['draw_batch']} images failed ({type(e).__name__}: {e})",
                    'log': log}
    return {'metrics': metrics, 'log': log}


def draw_speed(folder, batch_size):
    """Images per second drawn from a pixel model with its cache, `batch_size` images at once, on the device it
    trained on (support/pixels.py; here in the lab's process)."""
    from support.loading import load_run
    from support.pixels import timed_draw
    run = load_run(folder, 'cpu')
    model = run.model.to(run.config.get('device', 'cpu')).eval()
    return timed_draw(model, batch_size, batch_size, model.config.block_size + 1)[1]


def training_rate(folder):
    """(median tokens/s or images/s of the run's logged iterations, its unit) from log.jsonl."""
    with open(os.path.join(folder, 'log.jsonl')) as f:
        records = [json.loads(line) for line in f if line.strip()]
    for key, unit in (('tokens_per_s', 'tok/s'), ('images_per_s', 'images/s')):
        values = [r[key] for r in records if key in r]
        if values:
            return float(np.median(values)), unit
    return None, None


def cell_run(row, system, seed, arguments):
    """One run's result, from its cell.json when it has one (never trained again), else trained and scored now."""
    path = os.path.join(run_dir(row, system, seed), 'cell.json')
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    if not train:
        return {'not_run': 'not run yet: pass --train=True'}
    failed = train_run(row, system, seed, arguments)
    if failed:
        return failed
    t0 = time.time()
    scored = score_run(row, system, seed, arguments)
    if 'error' in scored:
        return scored
    with open(os.path.join(run_dir(row, system, seed), 'trained.json')) as f:
        trained = json.load(f)
    rate, unit = training_rate(run_dir(row, system, seed))
    result = {**scored, 'train_wall_s': trained['wall_s'], 'score_wall_s': time.time() - t0, 'rate': rate,
              'rate_unit': unit, 'args': shlex.join(trained['args'])}
    write_atomically(path, lambda tmp: write_text(tmp, json.dumps(result)))
    return result


# -----------------------------------------------------------------------------
# the table: a cell per row and system, the mean ± half the range over seeds
METRICS = {  # system: [(result key, label, digits)]; the first is the one its paper reports
    'recall': [('val_acc', 'answer acc', 4)], 'text': [('val_loss', 'val loss', 4)],
    'passkey': [('acc_1x', '1x', 3), ('acc_2x', '2x', 3), ('acc_4x', '4x', 3)], 'vit': [('val_acc', 'top-1', 4)],
    'pixels': [('bits_per_dim', 'bits/dim', 4), ('draw_images_per_s', 'images/s drawn', 3)],
    'shortcut': [('val_loss', 'val loss', 4)],
}


def spread(values, digits):
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{np.mean(values):.{digits}f} ± {(max(values) - min(values)) / 2:.{digits}f}"


def cell_text(cell, system):
    """A cell of table.md: its metrics (passkey's three lengths joined by /), then wall time and training speed."""
    if cell['status'] != 'ok':
        return cell['why'].replace('|', '/')
    runs = list(cell['seeds'].values())
    numbers = [spread([r['metrics'][key] for r in runs], digits) for key, _, digits in METRICS[system]]
    text = ' / '.join(numbers) if system == 'passkey' else ' · '.join(numbers)
    wall = np.mean([r['train_wall_s'] + r['score_wall_s'] for r in runs])
    rate = f", {np.median([r['rate'] for r in runs]):,.0f} {runs[0]['rate_unit']}" if runs[0]['rate'] else ''
    return f"{text}<br>{wall:,.0f} s{rate}"


def header():
    """What table.md and table.json say above the table: the budget, machine, torch, date and commit."""
    import torch
    git = lambda *a: subprocess.run(['git', *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    commit = git('rev-parse', '--short', 'HEAD') or 'unknown (not a git checkout)'
    if git('status', '--porcelain', '--untracked-files=no'):
        commit += ' with uncommitted changes'
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU'
    return {'budget': budget, 'machine': f"{platform.machine()}, {os.cpu_count()} cores, {device}",
            'torch': torch.__version__, 'date': datetime.date.today().isoformat(), 'commit': commit,
            'seeds': seeds, 'recipe': recipe}


def markdown(head, cells, row_names, system_names):
    lines = [f"Budget `{head['budget']}`; machine {head['machine']}; torch {head['torch']}; date {head['date']}; "
             f"commit {head['commit']}; seeds {head['seeds']}" + (f"; recipe `{head['recipe']}`" if head['recipe']
                                                                   else '') + '.', '']
    lines += [f"- **{s}**: {SYSTEMS[s]}. `{BUDGETS[budget][s] or '(train.py defaults)'}`" for s in system_names]
    lines += ['', '| rule | ' + ' | '.join(f"{s}: {', '.join(label for _, label, _ in METRICS[s])}"
                                           for s in system_names) + ' |',
              '| --- |' + ' --- |' * len(system_names)]
    for row in row_names:
        lines.append(f"| {row} | " + ' | '.join(cell_text(cells[row][s], s) for s in system_names) + ' |')
    return '\n'.join(lines) + '\n'


def plots(cells, row_names, system_names):
    """A PNG per system and metric, the rows side by side (mean over seeds); None where matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    written = []
    for system in system_names:
        for key, label, digits in METRICS[system]:
            names = [r for r in row_names if cells[r][system]['status'] == 'ok']
            if not names:
                continue
            values = [np.mean([run['metrics'][key] for run in cells[r][system]['seeds'].values()]) for r in names]
            fig, ax = plt.subplots(figsize=(1.0 + 0.7 * len(names), 3.2))
            bars = ax.bar(names, values, color=[f'C{row_names.index(r)}' for r in names])
            ax.bar_label(bars, fmt=f'%.{digits}f', fontsize=7)
            if key in ('val_loss', 'bits_per_dim'):  # a loss: the differences, not the distance from zero
                ax.set_ylim(0.98 * min(values), 1.01 * max(values))
            ax.set_title(f"{system}: {label} (budget {budget})", fontsize=9)
            ax.tick_params(axis='x', labelrotation=45, labelsize=8)
            fig.tight_layout()
            path = os.path.join(out_root, f"{system}_{key}.png")
            write_or_exit(path, lambda tmp: fig.savefig(tmp, dpi=80, format='png'), f"the runs, table.md and "
                          f"table.json are kept in {out_root}", "free space, then run again with --train=False")
            plt.close(fig)
            written.append(path)
    return written


def main():
    row_names, system_names, seed_list = check_or_exit(check_lab_settings, script_settings(globals()))  # before work
    table = rows()
    try:
        os.makedirs(out_root, exist_ok=True)
    except OSError as e:
        raise SystemExit(f"error: cannot make out_root={out_root} ({e.strerror}); nothing was trained yet; pass "
                         f"--out_root=DIR you can write to") from None
    lab = RunDir(out_root, master=False)  # one table at a time in out_root; Ctrl-C ends in one line
    try:
        lab.take_lock()
    except SystemExit as e:
        raise SystemExit(str(e.code).replace('out_dir', 'out_root')) from None
    cells, todo = {}, []
    for system in system_names:
        for row in row_names:
            arguments = table[row].get(system, table[row]['causal'])
            cells.setdefault(row, {})[system] = {'args': arguments, 'seeds': {}, 'status': 'ok'}
            if arguments.startswith('n/a'):
                cells[row][system].update(status='n/a', why=arguments)
            else:
                todo += [(row, system, seed) for seed in seed_list]
    finished = {run for run in todo if os.path.exists(os.path.join(run_dir(*run), 'cell.json'))}
    progress = tqdm(total=len(todo), initial=len(finished), unit='run', dynamic_ncols=True)  # its ETA: runs to go
    try:
        for row, system, seed in todo:
            cell, result = cells[row][system], cell_run(row, system, seed, cells[row][system]['args'])
            if 'not_run' in result:
                cell.update(status='not run', why=result['not_run'])
            elif 'error' in result:
                cell.update(status='failed', why=f"{result['error']} (log: {result['log']})")
                progress.write(f"{system} {row} seed {seed}: {result['error']}; see {result['log']}")
            else:
                cell['seeds'][str(seed)] = result
            progress.update(0 if (row, system, seed) in finished else 1)
    except SystemExit as e:
        if e.code != 130:
            raise
        raise SystemExit(f"error: interrupted (Ctrl-C); the finished runs are kept in {out_root} (a cell.json "
                         f"each) and a run stopped in training goes on from its checkpoint; run the same command "
                         f"again to go on") from None
    progress.close()
    head = header()
    text = markdown(head, cells, row_names, system_names)
    print('\n' + text)
    kept = f"the runs are kept in {out_root} and the table is printed above"
    todo_line = "free space (or fix the folder's permissions), then run again with --train=False to write them"
    write_or_exit(os.path.join(out_root, 'table.md'), lambda tmp: write_text(tmp, text), kept, todo_line)
    record = {**head, 'systems': {s: {'metric': SYSTEMS[s], 'budget_args': BUDGETS[budget][s]} for s in system_names},
              'rows': cells}
    write_or_exit(os.path.join(out_root, 'table.json'), lambda tmp: write_text(tmp, json.dumps(record, indent=1)),
                  f"{kept}, table.md is written", todo_line)
    figures = plots(cells, row_names, system_names)
    print(f"wrote {out_root}/table.md, table.json" + (f" and {len(figures)} figures" if figures else
                                                      " (no figures: pip install matplotlib for them)"))
    failed = [f"{s} {r}" for r in row_names for s in system_names if cells[r][s]['status'] == 'failed']
    if failed:
        raise SystemExit(f"error: {len(failed)} cell(s) failed ({', '.join(failed)}); each says why in the table; "
                         f"the other runs are kept in {out_root}; fix the cause, then run the same command again")


if __name__ == '__main__':
    main()
