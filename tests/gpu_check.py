"""The pace half of tests/gpu_check.sh and its table: each rule's Triton kernel beside flash softmax, one bench.py
--mode=pace run per case (GPT-2 124M's shape, compiled), then one table for docs/RESULTS.md with the lines of the
GPU tests and of the two train runs that gpu_check.sh left in its log folder. Exit status 1 where a test or a train
run failed or timed out, or a bench run failed; a missed speed bar, or a bench run out of time, is only reported.

$ python tests/gpu_check.py --log=DIR --deadline=EPOCH_S   (what gpu_check.sh runs after the tests and train runs)
$ python tests/gpu_check.py --cases=2,3                    (the pace rows alone, e.g. those a short run left out)
"""
import argparse
import datetime
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GPT2 = '--mode=pace --compile=True --n_layer=12 --n_head=12 --n_embd=768 --bias=False --kernel=True --json=True'
CPU = '--device=cpu --seq_lens=256 --batch_size=2 --n_layer=2 --n_head=4 --n_embd=128 --repeats=2'  # a dry run
# (check, bench.py flags, the rows compared, bar, whether the bar is a floor): 'model' rows (the whole train step)
# give kernel tok/s / flash's; 'attend' rows (the attention alone, fwd+bwd) flash ms / kernel ms (times faster)
# against a floor, kernel ms / flash ms against a ceiling
CASES = [
    ('Krause W=256 k=192, attention alone, T=8192, B=4',
     '--attention=krause --krause_window=256 --krause_topk=192 --seq_lens=8192 --batch_size=4 --pace_step=False',
     'attend', 4.0, True),
    ('Krause W=32 k=16, train step, T=1024, B=12',
     '--attention=krause --krause_window=32 --krause_topk=16 --seq_lens=1024 --batch_size=12', 'model', 1.0, True),
    ('mix (Krause W=32 k=16 beside softmax), train step, T=1024, B=12',
     '--attention=krause --mix=True --krause_window=32 --krause_topk=16 --seq_lens=1024 --batch_size=12',
     'model', 0.8, True),
    ('TDA matched, RoPE, attention alone, T=4096, B=3',
     '--attention=tda --tda_matched=True --pos_emb=rope --seq_lens=4096 --batch_size=3 --pace_step=False',
     'attend', 1.3, False),
    ('TDA, RoPE, train step, T=4096, B=3',
     '--attention=tda --pos_emb=rope --seq_lens=4096 --batch_size=3', 'model', 0.85, True),
    ('mix matched (each branch half the heads), train step, T=1024, B=12',
     '--attention=krause --mix=True --mix_matched=True --krause_window=32 --krause_topk=16 --seq_lens=1024 '
     '--batch_size=12', 'model', 0.9, True),
]
LIMIT_S = {'attend': 90, 'model': 150}  # one bench run: process start, compiles (softmax's and the rule's), timing
TIMED_OUT = (124, 137)  # timeout(1)'s status: TERM sent at the limit, or KILL after its grace


def run_bench(i, args, log):
    """Case i through bench.py under timeout(1) (it ends the run's whole process group: compile workers too), its
    output in log/bench_<i>.log and its command and exit status beside it, as gpu_check.sh writes its steps."""
    check, flags, path, bar, floor = CASES[i - 1]
    left = int(args.deadline - time.time())
    cmd = [sys.executable, 'bench.py', *GPT2.split(), *flags.split(), *(CPU.split() if args.cpu else [])]
    (log / f'bench_{i}.cmd').write_text(' '.join(['python', *cmd[1:]]) + '\n')
    if left < 20:  # not enough left to compile anything: said in the table, not run
        (log / f'bench_{i}.rc').write_text('skipped\n')
        print(f"[{time.strftime('%T')}] bench {i} ({check}): not run, {max(left, 0)} s left", flush=True)
        return
    limit = min(LIMIT_S[path], left)
    print(f"[{time.strftime('%T')}] bench {i} ({check}): at most {limit} s", flush=True)
    with open(log / f'bench_{i}.log', 'w') as out:
        rc = subprocess.run(['timeout', '-k', '5', str(limit), *cmd], cwd=ROOT, stdout=out,
                            stderr=subprocess.STDOUT).returncode
    (log / f'bench_{i}.rc').write_text(f'{rc}\n')
    (log / f'bench_{i}.limit').write_text(f'{limit}\n')


def read(log, name, suffix, default=''):
    path = log / f'{name}.{suffix}'
    return path.read_text(errors='replace').strip() if path.exists() else default


def bench_rows(text):
    """The JSON rows of a bench.py --json=True output (its other lines, e.g. configurator's, skipped)."""
    rows = []
    for line in text.splitlines():
        if line.startswith('{'):
            try:
                rows.append(json.loads(line))
            except ValueError:  # a line cut by a timeout
                pass
    return rows


def flash_and_kernel(rows, path):
    """The flash softmax row and the rule's kernel row of a kind ('attend' or 'model'): bench names them
    'softmax sdpa' and '<rule>[-mix] kernel'."""
    rows = [r for r in rows if r.get('path') == path]
    flash = next((r for r in rows if r['attention'].startswith('softmax')), None)
    kernel = next((r for r in rows if r['attention'].endswith(' kernel')), None)
    return flash, kernel


def status(log, name):
    """'ok', or why a step left no result: 'not run', 'not run: no time left', 'timed out after N s', 'exit N'."""
    rc = read(log, name, 'rc', None)
    if rc is None:
        return 'not run'
    if rc == 'skipped':
        return 'not run: no time left'
    if not rc.isdigit():  # the step was killed before it wrote its status
        return 'exit ?'
    if int(rc) in TIMED_OUT:
        return f"timed out after {read(log, name, 'limit', '?')} s"
    return 'ok' if rc == '0' else f'exit {rc}'


def pace_row(log, i):
    """(table cells, failed): the case's flash and kernel figures, their ratio, its bar and whether it holds."""
    check, flags, path, bar, floor = CASES[i - 1]
    bar_text = (f"≥ {bar}× flash's tok/s" if path == 'model' else
                f"≥ {bar}× faster than flash" if floor else f"≤ {bar}× flash's ms")
    state = status(log, f'bench_{i}')
    flash, kernel = flash_and_kernel(bench_rows(read(log, f'bench_{i}', 'log')), path)
    if not (flash and kernel):
        lines = read(log, f'bench_{i}', 'log').splitlines()
        why = state if state != 'ok' else 'no flash or kernel row'
        if state.startswith('exit') and lines:
            why += f": {lines[-1][:120]}"  # the error line a failed run ends with
        return [check, why, bar_text, 'not measured'], not (state.startswith('timed out') or state.startswith('not'))
    if path == 'model':
        a, b = flash['tokens_per_s'], kernel['tokens_per_s']
        measured, ratio = f"{a:,.0f} / {b:,.0f} tok/s: {b / a:.2f}×", b / a
    else:
        a, b = flash['ms'], kernel['ms']
        ratio = a / b if floor else b / a
        measured = f"{a:.2f} / {b:.2f} ms: " + (f"{ratio:.2f}× faster" if floor else f"{ratio:.2f}× flash's")
    holds = ratio >= bar if floor else ratio <= bar
    return [check, measured, bar_text, 'yes' if holds else 'MISSED'], False


def tests_line(log):
    """(line, failed): the pytest command and its summary ('12 passed, 3 skipped in 98.1s'), or why there is none."""
    state, text = status(log, 'tests'), read(log, 'tests', 'log')
    lines = text.splitlines()
    summary = [ln.strip('= ') for ln in lines if re.search(r'\d+ (passed|failed|errors?)\b.* in ', ln)]
    if state.startswith('timed out'):  # what pytest -q had shown by then: a character per test
        done = ''.join(ln.split('[')[0] for ln in lines if re.fullmatch(r'[.FEsxX]+ *(\[ *\d+%\])?', ln.strip()))
        summary = [f"{state}, {done.count('.')} passed and {done.count('F') + done.count('E')} failed by then"]
    if state == 'not run':  # the pace rows alone (gpu_check.py by itself)
        return 'tests: not run here', False
    line = f"tests: {read(log, 'tests', 'cmd')}: {summary[-1] if summary else state}"
    return line, state != 'ok'


def train_line(log, rule):
    """(line, failed): the run's start-up `attention:` line; it fails unless it exits 0 naming the Triton kernel."""
    name, state = f'train_{rule}', status(log, f'train_{rule}')
    said = [ln.strip() for ln in read(log, name, 'log').splitlines() if ln.strip().startswith('attention:')]
    if state == 'not run':  # the pace rows alone (gpu_check.py by itself)
        return f"train {rule}: not run here", False
    problems = ([] if state == 'ok' else [state]) + (['no attention: line'] if not said else
                                                    [] if 'Triton kernel' in said[0] else ['not the Triton kernel'])
    if not problems:
        return f"train {rule}: {said[0]}", False
    last = (read(log, name, 'log').splitlines() or [''])[-1][:160]  # how far it got, or its error
    return f"train {rule}: FAILED ({', '.join(problems)}){': ' + said[0] if said else ''}; its last line: {last}", True


def machine_line(log):
    """The GPU's name, torch and triton versions, the commit, the date and the whole check's wall time."""
    def out(cmd):
        try:
            return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ''
    gpu = out(['nvidia-smi', '--query-gpu=name', '--format=csv,noheader']).replace('\n', ', ') or 'no nvidia-smi'
    versions = out([sys.executable, '-c', 'import torch, triton; print(torch.__version__, triton.__version__)'])
    torch_v, triton_v = (versions.split() + ['?', '?'])[:2]
    head = out(['git', 'rev-parse', '--short', 'HEAD'])
    changed = head and out(['git', 'status', '--porcelain', '--untracked-files=no'])  # then not that commit's alone
    commit = (head + (' with uncommitted changes' if changed else '')) or 'unknown (no git here)'
    start = float(read(log, 'start', 'txt', '') or time.time())
    return (f"machine: {gpu}; torch {torch_v}, triton {triton_v}; commit {commit}; "
            f"{datetime.date.today().isoformat()}; wall {time.time() - start:.0f} s")


def report(log, cases, machine, extra=''):
    """The table and the lines under it, as one block to paste; True where something failed (not a missed bar)."""
    rows = [pace_row(log, i) for i in cases]
    tests, tests_failed = tests_line(log)
    trains = [train_line(log, rule) for rule in ('krause', 'tda')]
    print("\n| check | measured: flash / kernel, ratio | bar | holds |\n| --- | --- | --- | --- |")
    for cells, _ in rows:
        print('| ' + ' | '.join(cells) + ' |')
    print(f"\n```bash\nG=\"{GPT2}\"")
    for i in cases:
        print(f"python bench.py $G {CASES[i - 1][1]}{extra}")
    print("```\n")
    for line in [tests] + [line for line, _ in trains] + [machine]:
        print(line)
    return tests_failed or any(f for _, f in trains) or any(f for _, f in rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--log', help="gpu_check.sh's log folder (default: a new one)")
    parser.add_argument('--deadline', type=float, help='epoch seconds by which every bench run ends (default: 6 min)')
    parser.add_argument('--cases', default=','.join(str(i) for i in range(1, len(CASES) + 1)), help='which, 1-based')
    parser.add_argument('--cpu', action='store_true', help='a dry run on the CPU at tiny sizes')
    args = parser.parse_args()
    log = Path(args.log or tempfile.mkdtemp(prefix='gpu_check.'))
    if not (log / 'start.txt').exists():
        (log / 'start.txt').write_text(f'{time.time()}\n')
    args.deadline = args.deadline or float(read(log, 'start', 'txt')) + 340
    cases = [int(i) for i in args.cases.split(',')]
    for i in sorted(cases, key=lambda i: CASES[i - 1][2] != 'attend'):  # the quick ones (no model to compile) first
        run_bench(i, args, log)
    failed = report(log, cases, machine_line(log), ' ' + CPU if args.cpu else '')
    sys.exit(1 if failed else 0)


if __name__ == '__main__':
    main()
