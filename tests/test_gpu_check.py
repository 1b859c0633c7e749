"""tests/gpu_check.py's table from real CPU outputs, as a lent GPU's would reach it (no GPU, nothing run here, < 1 s):
which bench.py rows it compares and the ratio and bar of each, and what fails the check (a test, a train run or a
crashed bench run; never a missed bar, a timed-out bench run or one there was no time for)."""
import json
import re

import pytest

import gpu_check

# bench.py --mode=pace --compile=True --json=True --device=cpu --seq_lens=256 --n_layer=2 --n_head=4 --n_embd=128
# --bias=False --batch_size=2 --kernel=True --repeats=2 and each case's rule flags (torch 2.13.0 CPU, 2026-11-28)
BENCH = {
    1: """Overriding: mode = pace
Overriding: device = cpu
{"attention": "softmax sdpa", "path": "attend", "T": 256, "device": "cpu", "ms": 110.44713299997966, "peak_mib": 2.0, "vs_softmax": 1.0}
{"attention": "krause kernel", "path": "attend", "T": 256, "device": "cpu", "ms": 720.1158860000305, "peak_mib": 10.3046875, "vs_softmax": 6.520005240879934}""",
    2: """Overriding: mode = pace
{"attention": "softmax sdpa", "path": "attend", "T": 256, "device": "cpu", "ms": 107.91517600000589, "peak_mib": 1.64453125, "vs_softmax": 1.0}
{"attention": "softmax sdpa", "path": "model", "T": 256, "device": "cpu", "ms": 3210.516193000103, "peak_mib": 401.55859375, "vs_softmax": 1.0, "tokens_per_s": 159.4759126636131}
{"attention": "krause kernel", "path": "attend", "T": 256, "device": "cpu", "ms": 42.67966199995499, "peak_mib": 3.015625, "vs_softmax": 0.39549267843433494}
{"attention": "krause kernel", "path": "model", "T": 256, "device": "cpu", "ms": 4451.805464000017, "peak_mib": 405.2890625, "vs_softmax": 1.3866323034614496, "tokens_per_s": 115.00951785524786}""",
    3: """{"attention": "softmax sdpa", "path": "attend", "T": 256, "device": "cpu", "ms": 107.87295700004051, "peak_mib": 2.12109375, "vs_softmax": 1.0}
{"attention": "softmax sdpa", "path": "model", "T": 256, "device": "cpu", "ms": 3441.743444999929, "peak_mib": 401.84375, "vs_softmax": 1.0, "tokens_per_s": 148.7618145227587}
{"attention": "krause-mix kernel", "path": "attend", "T": 256, "device": "cpu", "ms": 700.2256739999666, "peak_mib": 3.59375, "vs_softmax": 6.491206818403093}
{"attention": "krause-mix kernel", "path": "model", "T": 256, "device": "cpu", "ms": 3026.180826999962, "peak_mib": 409.8515625, "vs_softmax": 0.8792581072236266, "tokens_per_s": 169.1901539497813}""",
    4: """{"attention": "softmax sdpa", "path": "attend", "T": 256, "device": "cpu", "ms": 103.82437800001298, "peak_mib": 2.3828125, "vs_softmax": 1.0}
{"attention": "tda kernel", "path": "attend", "T": 256, "device": "cpu", "ms": 1031.991152000046, "peak_mib": 16.01171875, "vs_softmax": 9.93977687976052}""",
    5: """{"attention": "softmax sdpa", "path": "attend", "T": 256, "device": "cpu", "ms": 107.97604000003957, "peak_mib": 1.88671875, "vs_softmax": 1.0}
{"attention": "softmax sdpa", "path": "model", "T": 256, "device": "cpu", "ms": 3692.141764999974, "peak_mib": 402.90234375, "vs_softmax": 1.0, "tokens_per_s": 138.67289843893727}
{"attention": "tda kernel", "path": "attend", "T": 256, "device": "cpu", "ms": 1496.2092670000402, "peak_mib": 15.60546875, "vs_softmax": 13.856863680122848}
{"attention": "tda kernel", "path": "model", "T": 256, "device": "cpu", "ms": 1664.0318720000096, "peak_mib": 407.625, "vs_softmax": 0.45069555231447656, "tokens_per_s": 307.6864143140625}""",
}
# the rows each case compares, by bench.py's names: (path, the kernel's row)
KERNEL_ROWS = {1: ('attend', 'krause kernel'), 2: ('model', 'krause kernel'), 3: ('model', 'krause-mix kernel'),
               4: ('attend', 'tda kernel'), 5: ('model', 'tda kernel')}
# a CPU dry run's (GPU_CHECK_CPU=1 bash tests/gpu_check.sh): pytest's last lines, and a train run before its line
TESTS = """ssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssss.... [ 72%]
..................F........                                              [100%]
FAILED tests/test_kernels.py::test_krause_kernel_keeps_every_key_tied_at_the_kth
1 failed, 30 passed, 68 skipped, 3 warnings in 168.25s (0:02:48)"""
TRAIN = """tokens per iteration will be: 512
1,115,394 characters, vocab 65: train 1,003,854 tokens, val 111,540 -> $LOG/data_krause
parameters: 16,006,940, trained: 16,006,940
step 0: train loss 4.4159, val loss 4.3663
iter 0: loss 4.4153, time 71453.94ms, 7 tok/s"""


def write_step(log, name, rc, output='', limit=150):
    """A step as gpu_check.sh leaves it: its command, output, time limit and exit status."""
    (log / f'{name}.cmd').write_text(f'python {name}.py\n')
    (log / f'{name}.log').write_text(output)
    (log / f'{name}.limit').write_text(f'{limit}\n')
    (log / f'{name}.rc').write_text(f'{rc}\n')


def with_line(line):  # train.py's output with its start-up line after the parameter count
    head, tail = TRAIN.split('step 0')
    return f"{head}{line}\nstep 0{tail}"


@pytest.fixture
def log(tmp_path):  # every step passed, the train runs on their kernels
    write_step(tmp_path, 'tests', 0, TESTS.replace('F', '.').replace('1 failed, 30 passed', '31 passed'))
    write_step(tmp_path, 'train_krause', 0, with_line('attention: krause (mix), Triton kernel beside SDPA'))
    write_step(tmp_path, 'train_tda', 0, with_line('attention: tda, Triton kernel'))
    for i, text in BENCH.items():
        write_step(tmp_path, f'bench_{i}', 0, text)
    return tmp_path


def test_each_case_compares_flash_with_its_kernel_row_against_its_bar(log):
    holds = []
    for i, (path, name) in KERNEL_ROWS.items():
        rows = [json.loads(line) for line in BENCH[i].splitlines() if line.startswith('{')]
        flash, = [r for r in rows if r['path'] == path and r['attention'] == 'softmax sdpa']
        kernel, = [r for r in rows if r['path'] == path and r['attention'] == name]
        bar, floor = gpu_check.CASES[i - 1][3:]
        ratio = (kernel['tokens_per_s'] / flash['tokens_per_s'] if path == 'model' else
                 flash['ms'] / kernel['ms'] if floor else kernel['ms'] / flash['ms'])
        cells, failed = gpu_check.pace_row(log, i)
        assert re.search(rf'\b{ratio:.2f}×', cells[1]) and not failed, (i, cells)
        assert cells[3] == ('yes' if (ratio >= bar if floor else ratio <= bar) else 'MISSED'), (i, cells)
        holds.append(cells[3])
    assert holds == ['MISSED', 'MISSED', 'yes', 'MISSED', 'yes']  # these CPU figures: both verdicts are read


def test_a_missed_bar_passes_the_check_and_the_table_has_a_row_per_case(log, capsys):
    assert not gpu_check.report(log, [1, 2, 3, 4, 5], 'machine: here')
    out = capsys.readouterr().out
    assert len(re.findall(r'^\| (Krause|mix|TDA)', out, re.M)) == 5 and out.count('MISSED') == 3
    assert 'tests: python tests.py: 31 passed, 68 skipped, 3 warnings in 168.25s (0:02:48)' in out
    assert 'train krause: attention: krause (mix), Triton kernel beside SDPA\n' in out


@pytest.mark.parametrize('output,rc,said', [
    (TRAIN, 0, 'FAILED (no attention: line); its last line: iter 0'),
    (with_line('attention: krause, flex_attention'), 0, 'FAILED (not the Triton kernel): attention: krause, flex'),
    (with_line('attention: krause, Triton kernel'), 1, 'FAILED (exit 1): attention: krause, Triton kernel; its last'),
    (TRAIN, 137, 'FAILED (timed out after 150 s, no attention: line); its last line: iter 0'),
])
def test_a_train_run_fails_the_check_unless_it_exits_0_on_the_kernel(log, output, rc, said):
    write_step(log, 'train_krause', rc, output)
    line, failed = gpu_check.train_line(log, 'krause')
    assert failed and line.startswith(f'train krause: {said}'), line
    assert gpu_check.report(log, [1], 'machine: here')


def test_failed_or_timed_out_tests_fail_the_check_and_say_how_far_they_got(log):
    write_step(log, 'tests', 1, TESTS)
    assert gpu_check.tests_line(log) == ('tests: python tests.py: 1 failed, 30 passed, 68 skipped, 3 warnings in '
                                         '168.25s (0:02:48)', True)
    write_step(log, 'tests', 124, TESTS.split('FAILED')[0], limit=200)
    assert gpu_check.tests_line(log) == ('tests: python tests.py: timed out after 200 s, 30 passed and 1 failed by '
                                         'then', True)


def test_a_bench_run_fails_the_check_only_where_it_crashed(log):
    write_step(log, 'bench_2', 124, BENCH[2].rsplit('\n', 1)[0], limit=150)  # cut before the kernel's model row
    (log / 'bench_3.rc').write_text('skipped\n')  # and no output: not run
    (log / 'bench_3.log').unlink()
    write_step(log, 'bench_5', 1, BENCH[5][:400] + '\nRuntimeError: Triton Error [CUDA]: out of memory')
    assert gpu_check.pace_row(log, 2) == (['Krause W=32 k=16, train step, T=1024, B=12', 'timed out after 150 s',
                                           "≥ 1.0× flash's tok/s", 'not measured'], False)
    assert gpu_check.pace_row(log, 3)[0][1:] == ['not run: no time left', "≥ 0.8× flash's tok/s", 'not measured']
    cells, failed = gpu_check.pace_row(log, 5)
    assert failed and cells[1] == 'exit 1: RuntimeError: Triton Error [CUDA]: out of memory'
    assert not gpu_check.report(log, [1, 2, 3, 4], 'machine: here') and gpu_check.report(log, [5], 'machine: here')


def test_the_pace_rows_alone_fail_nothing_where_no_test_or_train_ran(tmp_path, capsys):
    for i, text in BENCH.items():  # python tests/gpu_check.py --cases=...: its own log folder
        write_step(tmp_path, f'bench_{i}', 0, text)
    assert gpu_check.tests_line(tmp_path) == ('tests: not run here', False)
    assert not gpu_check.report(tmp_path, [1, 2, 3, 4, 5], 'machine: here')
    assert 'train tda: not run here\n' in capsys.readouterr().out
