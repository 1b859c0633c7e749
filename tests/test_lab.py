"""The lab's table (studies/ablate.py): every rule on every system with one command, at the tiny budget. A table is
written with a number in every cell; running it again trains nothing and writes the same table; a table killed in
the middle of a run goes on to the same numbers; a rule a reader registers is a row with no change to the lab; a run
that fails holds its error line in its cell while the others go on. (Bad input: tests/test_script_errors.py.)"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

from conftest import ROOT, readme_rule_source, run_forked, run_script

TINY = ['--budget=tiny', '--systems=recall,passkey', '--rules=softmax,krause']


def metrics(out_root):
    """{(row, system): {seed: metrics}} of a table.json, and the table itself."""
    table = json.loads((out_root / 'table.json').read_text())
    return {(row, system): {seed: run['metrics'] for seed, run in cell['seeds'].items()}
            for row, cells in table['rows'].items() for system, cell in cells.items()}, table


def test_tiny_table_trains_once_and_a_killed_table_goes_on_to_the_same_numbers(tmp_path):
    whole = tmp_path / 'whole'
    out = run_script('studies/ablate.py', *TINY, f'--out_root={whole}')
    cells, table = metrics(whole)
    assert len(cells) == 4 and all(c['status'] == 'ok' for r in table['rows'].values() for c in r.values()), out
    for (row, system), runs in cells.items():  # a number in each cell: the system's own metric, for seed 1337
        keys = ['val_acc'] if system == 'recall' else ['acc_1x', 'acc_2x', 'acc_4x']
        assert all(0.0 <= runs['1337'][k] <= 1.0 for k in keys), (row, system, runs)
    assert cells[('softmax', 'recall')]['1337']['examples'] == 2000  # the whole val split
    text = (whole / 'table.md').read_text()
    assert text.count('\n| softmax |') == 1 and text.count('\n| krause |') == 1 and 'Budget `tiny`' in text

    # again: nothing is trained or scored (no file of any run is touched), and the same table is written
    stamps = {p: p.stat().st_mtime_ns for p in whole.rglob('*') if p.is_file() and p.parent != whole}
    run_script('studies/ablate.py', *TINY, f'--out_root={whole}')
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    assert (whole / 'table.md').read_text() == text

    # killed (the lab and its train.py, -9) while the second run trains, then the same command again: the table
    # as the first command left it, less the second run (the first and the last two are not trained again)
    killed = tmp_path / 'killed'
    shutil.copytree(whole, killed, ignore=lambda folder, names: ['krause-s1337'] if folder == str(whole / 'recall')
                    else [])
    env = {**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONUNBUFFERED': '1'}
    proc = subprocess.Popen([sys.executable, 'studies/ablate.py', *TINY, f'--out_root={killed}'], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    second = killed / 'recall' / 'krause-s1337' / 'train.log'
    deadline = time.time() + 120
    while not (second.exists() and 'iter 5:' in second.read_text()) and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert 'iter 5:' in second.read_text() and not (killed / 'recall' / 'krause-s1337' / 'cell.json').exists()
    out = run_script('studies/ablate.py', *TINY, f'--out_root={killed}')
    assert metrics(killed)[0] == cells, out


def test_a_rule_a_reader_adds_is_a_row_and_a_failed_run_keeps_its_error_line(tmp_path):
    # a copy of the code with README's example rule registered at the end of attention.py, the lab's code unchanged;
    # its runs forked from a process that imported the copy's modules (its tests/faults.py)
    repo = tmp_path / 'repo'
    shutil.copytree(ROOT, repo, ignore=shutil.ignore_patterns('.git', 'data', 'docs', 'out*', '__pycache__', 'tests'))
    with open(repo / 'attention.py', 'a') as f:
        f.write('\n\n' + readme_rule_source())
    (repo / 'tests').mkdir()
    shutil.copy(ROOT / 'tests' / 'faults.py', repo / 'tests')
    out_root = tmp_path / 'lab'
    (_, out), = run_forked({'argv': ['studies/ablate.py', '--budget=tiny', '--systems=recall,vit',
                                     '--rules=uniform,krause', '--recipe=--krause_topk=0', f'--out_root={out_root}']},
                           root=repo)
    cells, table = metrics(out_root)
    assert 0.0 <= cells[('uniform', 'recall')]['1337']['val_acc'] <= 1.0, out
    rows = table['rows']
    assert rows['uniform']['vit']['why'] == 'n/a: UniformAttention does not declare has_bidirectional_form'
    krause = rows['krause']['recall']  # krause_topk=0: train.py refused it, before any data; the others ran
    assert krause['status'] == 'failed' and krause['why'].startswith('error: krause_topk must be in [1, '), krause
    assert krause['why'].endswith(f"(log: {out_root / 'recall' / 'krause-s1337' / 'train.log'})")
    assert rows['krause']['vit']['status'] == 'failed'
    assert '| uniform | ' in (out_root / 'table.md').read_text()
    assert out.strip().splitlines()[-1].startswith('error: 2 cell(s) failed (recall krause, vit krause)')


def test_a_cell_of_two_seeds_is_the_mean_and_half_the_range(monkeypatch):
    monkeypatch.setattr(sys, 'argv', ['ablate.py'])
    from studies import ablate
    run = lambda acc, wall: {'metrics': {'val_acc': acc}, 'train_wall_s': wall, 'score_wall_s': 1.0, 'rate': 100.0,
                             'rate_unit': 'tok/s'}
    cell = {'status': 'ok', 'seeds': {'1337': run(0.4, 9.0), '1338': run(0.6, 19.0)}}
    assert ablate.cell_text(cell, 'recall') == '0.5000 ± 0.1000<br>15 s, 100 tok/s'
    passkey = {'status': 'ok', 'seeds': {'1': {**run(0, 1.0), 'metrics': {'acc_1x': 1.0, 'acc_2x': 0.5, 'acc_4x': 0.0}}}}
    assert ablate.cell_text(passkey, 'passkey') == '1.000 / 0.500 / 0.000<br>2 s, 100 tok/s'
    assert ablate.cell_text({'status': 'n/a', 'why': 'n/a: a | b'}, 'vit') == 'n/a: a / b'  # a table cell stays one
