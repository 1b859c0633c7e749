"""The lab's table (studies/ablate.py): every rule on every system with one command, at the tiny budget. A table is
written with a number in every cell; running it again trains nothing and writes the same table; a table killed in
the middle of a run goes on to the same numbers; a rule a reader registers is a row with no change to the lab; a run
that fails holds its error line in its cell while the others go on. A paper's table (--table) runs its rows on
equal terms (one position encoding and shape, read back from the checkpoints), each cell with its model's own
parameter count and its attention FLOPs (counted, and the closed form); a row whose paired differences from the first
row, seed by seed, have a 95% interval that excludes 0 is marked, and each paper's claim gets the verdict its interval
gives, as the paper states it (a bound against the bound, comparable rows never a lead, untestable where the table
lacks what the claim presumes; a task's number the paper's metric); an unknown table, or a rule it has no row for,
is one error line before any run. (Other bad input: tests/test_script_errors.py.)"""
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from conftest import ROOT, SHARED, checkout_files, needs_shared, readme_rule_source, run_forked, run_script
from model import GPT, GPTConfig
from studies.tables import TABLES

TINY = ['--budget=tiny', '--systems=recall,passkey', '--rows=softmax,krause']
NO_MATPLOTLIB = ['', '', 0, "import sys; sys.modules['matplotlib'] = None"]  # before the lab starts: as not installed


def ablate(*args, figures=False, check=True):
    """studies/ablate.py with `args`, forked as run_script runs it: its output. Its figures (seconds a table) only
    where a test asks for them: without, matplotlib is hidden from it, as where it is not installed."""
    (code, out), = run_forked({'argv': ['studies/ablate.py', *args], 'fault': None if figures else NO_MATPLOTLIB},
                              timeout=600)
    if check and code != 0:
        raise AssertionError(f"studies/ablate.py {args} failed ({code}):\n{out[-3000:]}")
    return out


def metrics(out_root):
    """{(row, system): {seed: metrics}} of a table.json, and the table itself."""
    table = json.loads((out_root / 'table.json').read_text())
    return {(row, system): {seed: run['metrics'] for seed, run in cell['seeds'].items()}
            for row, cells in table['rows'].items() for system, cell in cells.items()}, table


def run_folder(out_root, system, row, seed=1337):
    """The folder a run was trained in, out_root/runs/SYSTEM/RULE-KEY-sSEED (its cell's `run`), found by its row's
    rule: the one folder of that rule and seed."""
    found = list((out_root / 'runs' / system).glob(f'{row}-*-s{seed}'))
    assert len(found) == 1, found
    return found[0]


def test_tiny_table_trains_once_and_a_killed_table_goes_on_to_the_same_numbers(tmp_path):
    whole, checkout = tmp_path / 'whole', checkout_files()
    out = ablate(*TINY, f'--out_root={whole}')
    assert sorted((whole / 'data').iterdir()) == [whole / 'data' / 'passkey', whole / 'data' / 'recall']  # tiny's own
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
    ablate(*TINY, f'--out_root={whole}')
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    assert (whole / 'table.md').read_text() == text

    # stopped (SIGTERM to the lab, which kills its train.py, -9) while the second run trains, then the same command
    # again: the table as the first command left it, less the second run (the first and the last two are not trained
    # again)
    killed = tmp_path / 'killed'
    trained = run_folder(whole, 'recall', 'krause')
    shutil.copytree(whole, killed, ignore=lambda folder, names: ['krause-s1337'] if folder == str(whole / 'recall')
                    else [trained.name] if folder == str(trained.parent) else [])
    env = {**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONUNBUFFERED': '1'}
    proc = subprocess.Popen([sys.executable, 'studies/ablate.py', *TINY, f'--out_root={killed}'], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    second = killed / trained.relative_to(whole) / 'train.log'
    deadline = time.time() + 120
    while not (second.exists() and 'iter 5:' in second.read_text()) and time.time() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGTERM)
    said = [line for line in proc.communicate(timeout=60)[1].splitlines() if line.startswith('error:')]
    assert len(said) == 1, said
    assert said[0].startswith(f"error: interrupted (SIGTERM); the finished runs are kept in {killed}"), said
    assert 'iter 5:' in second.read_text() and not (killed / 'recall' / 'krause-s1337' / 'cell.json').exists()
    out = ablate(*TINY, f'--out_root={killed}', figures=True)
    assert metrics(killed)[0] == cells, out
    figures = re.findall(r"\]\(([\w.]+\.png)\)", (killed / 'table.md').read_text())  # each metric's, the curves
    assert len(figures) == 6 and all((killed / name).is_file() for name in figures), out
    assert checkout_files() == checkout  # nothing written in the checkout: the data too in out_root


def test_a_rule_a_reader_adds_is_a_row_and_a_failed_run_keeps_its_error_line(tmp_path):
    # a copy of the code with README's example rule registered at the end of the registry, the lab's code unchanged;
    # its runs forked from a process that imported the copy's modules (its tests/faults.py)
    repo = tmp_path / 'repo'
    shutil.copytree(ROOT, repo, ignore=shutil.ignore_patterns('.git', 'data', 'docs', 'out*', '__pycache__', 'tests'))
    with open(repo / 'rules' / '__init__.py', 'a') as f:
        f.write('\n\nimport torch\nfrom attention import Attention\n' + readme_rule_source())
    (repo / 'tests').mkdir()
    shutil.copy(ROOT / 'tests' / 'faults.py', repo / 'tests')
    out_root = tmp_path / 'lab'
    (_, out), = run_forked({'argv': ['studies/ablate.py', '--budget=tiny', '--systems=recall,vit',
                                     '--rows=uniform,krause', '--recipe=--krause_topk=0', f'--out_root={out_root}'],
                            'fault': NO_MATPLOTLIB}, root=repo)
    cells, table = metrics(out_root)
    assert 0.0 <= cells[('uniform', 'recall')]['1337']['val_acc'] <= 1.0, out
    rows = table['rows']
    assert rows['uniform']['vit']['why'] == 'n/a: UniformAttention does not declare has_bidirectional_form'
    krause = rows['krause']['recall']  # krause_topk=0: train.py refused it, before any data; the others ran
    assert krause['status'] == 'failed' and krause['why'].startswith('error: krause_topk must be in [1, '), krause
    assert krause['why'].endswith(f"(log: {run_folder(out_root, 'recall', 'krause') / 'train.log'})")
    assert rows['krause']['vit']['status'] == 'failed'
    assert '| uniform | ' in (out_root / 'table.md').read_text()
    assert out.strip().splitlines()[-1].startswith('error: 2 cell(s) failed (recall krause, vit krause)')


def test_a_cell_of_two_seeds_is_the_mean_and_the_sample_standard_deviation():
    from studies.report import cell_text
    run = lambda acc, wall: {'metrics': {'val_acc': acc}, 'train_wall_s': wall, 'score_wall_s': 1.0, 'rate': 100.0,
                             'rate_unit': 'tok/s'}
    cell = {'status': 'ok', 'seeds': {'1337': run(0.4, 9.0), '1338': run(0.6, 19.0)}}
    assert cell_text(cell, 'recall') == '0.5000 ± 0.1414<br>15 s, 100 tok/s'  # sqrt(2 · 0.1² / 1), ddof=1
    passkey = {'status': 'ok', 'seeds': {'1': {**run(0, 1.0), 'metrics': {'acc_1x': 1.0, 'acc_2x': 0.5, 'acc_4x': 0.0}}}}
    assert cell_text(passkey, 'passkey') == '1.000 / 0.500 / 0.000<br>2 s, 100 tok/s'
    assert cell_text({'status': 'n/a', 'why': 'n/a: a | b'}, 'vit') == 'n/a: a / b'  # a table cell stays one


# -----------------------------------------------------------------------------
# the papers' tables (--table): equal terms, each cell's parameters and FLOPs, seeds and what holds


def tiny_text_table(tmp_path, name, row_names, figures=False):
    """(out_root, table.json's rows, the output) of table `name`'s text system at the tiny budget, on a text the test
    writes; its figures where `figures`."""
    source = tmp_path / 'input.txt'
    source.write_text(''.join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(400)))
    lab = tmp_path / 'lab'
    out = ablate(f'--table={name}', '--systems=text', f'--rows={row_names}', '--budget=tiny', f'--text_source={source}',
                 f'--recipe=--data_dir={tmp_path / "chars"}', f'--out_root={lab}', figures=figures)
    return lab, json.loads((lab / name / 'table.json').read_text())['rows'], out


def test_a_tables_rows_share_positions_and_shape_and_each_cell_counts_its_own_model(tmp_path):
    lab, rows, out = tiny_text_table(tmp_path, 'tda', 'tda', figures=True)  # one row: beside the first, softmax
    assert list(rows) == ['softmax', 'tda'] and all(r['text']['status'] == 'ok' for r in rows.values()), out
    shapes, params = {}, {}
    for row in rows:
        folder = lab / rows[row]['text']['seeds']['1337']['run']  # out_root/runs/text/RULE-KEY-s1337
        assert folder.parent == lab / 'runs' / 'text' and folder.name.startswith(f'{row}-')
        model_args = torch.load(folder / 'ckpt.pt', map_location='cpu', weights_only=True)['model_args']
        shapes[row] = {k: model_args[k] for k in ('pos_emb', 'n_layer', 'n_head', 'n_embd', 'block_size', 'vocab_size',
                                                  'mlp_hidden', 'bias', 'tie_weights')}
        metrics = rows[row]['text']['seeds']['1337']['metrics']  # tiny: one seed
        printed = re.search(r"^parameters: ([\d,]+)", (folder / 'train.log').read_text(), re.M).group(1)
        params[row] = sum(p.numel() for p in GPT(GPTConfig(**model_args)).parameters())
        assert metrics['params'] == params[row] == int(printed.replace(',', ''))  # the model's own count
        assert model_args['attention'] == row
    assert shapes['softmax'] == shapes['tda'] and shapes['tda']['pos_emb'] == 'rope', shapes  # RoPE for both rows
    C, D, T = 32, 16, 32  # the tiny text system: 1 layer of 2 heads, no biases
    assert params['tda'] - params['softmax'] == 2 * C * C + 2 + D  # the second view's q, k; log β, λ; the RMSNorm
    softmax, tda = (rows[row]['text']['seeds']['1337']['metrics'] for row in ('softmax', 'tda'))
    softmax_metrics = softmax
    assert softmax['flops_counted'] == 4 * C * T and softmax['flops_ideal'] == 2 * C * (T + 1)  # SDPA: all T×T
    assert tda['flops_counted'] == 6 * C * T and tda['flops_ideal'] == 6 * C * (T + 1) / 2  # 2 score maps + W v
    assert softmax['sparsity'] == 0.0 and 0.0 <= tda['sparsity'] <= 1.0  # analyze.py's, on the same val batch
    assert softmax['sink_ratio'] > 0 and tda['sink_ratio'] >= 0
    text = (lab / 'tda' / 'table.md').read_text()
    departs = TABLES['tda'].departs  # where the paper budget departs from the paper: above the table, in its record
    assert f"Against the paper (at the paper budget): {departs}." in text and "176M" in departs
    assert json.loads((lab / 'tda' / 'table.json').read_text())['departs'] == departs
    assert "Every row: `config/shakespeare_char.py" in text and "--pos_emb=rope`, then its own arguments." in text
    assert f"| tda | `--attention=tda --tda_beta=0.5` | {tda['val_loss']:.4f} | {tda['sparsity']:.3f} |" in text
    assert "**text**, val loss (lower is better), against softmax, paired by seed: one seed, no interval: tda." in text
    figures = re.findall(r"\]\(([\w.]+\.png)\)", text)  # each metric's, the paired differences beside, the curves
    assert len(figures) == 4 and all((lab / 'tda' / name).is_file() for name in figures), text

    # another row on its own: softmax's run is reused (none of its files touched), the new row trained beside it
    softmax = lab / rows['softmax']['text']['seeds']['1337']['run']
    stamps = {p: p.stat().st_mtime_ns for p in softmax.rglob('*')}
    lab, again, out = tiny_text_table(tmp_path, 'tda', 'dex')
    assert list(again) == ['softmax', 'dex'] and again['dex']['text']['status'] == 'ok', out
    assert {p: p.stat().st_mtime_ns for p in softmax.rglob('*')} == stamps
    assert again['softmax']['text']['seeds']['1337']['metrics'] == softmax_metrics
    dex = again['dex']['text']
    difference = dex['values']['val_loss']['1337'] - softmax_metrics['val_loss']
    assert dex['against_first']['val_loss']['diffs'] == [difference]


def test_the_flops_counted_for_softmax_equal_its_closed_form():
    from rules import AttentionConfig, build_attention
    from support.flops import counted_flops
    T, C, H = 24, 32, 4
    full = build_attention(AttentionConfig(n_embd=C, n_head=H, block_size=T, causal=False), 0).eval()
    assert counted_flops(full, T) == full.ideal_flops(T) == 4 * C * T  # each query: T keys scored, T values summed
    causal = build_attention(AttentionConfig(n_embd=C, n_head=H, block_size=T), 0).eval()
    assert causal.ideal_flops(T) == 2 * C * (T + 1)  # per head 2·D·(i+1)·2 for query i, (T+1)/2 keys on average
    assert counted_flops(causal, T) == 4 * C * T  # SDPA is counted whole, T×T, as the math path computes it
    causal.fused = False  # the math path: the T×T scores and weights as two matmuls
    assert counted_flops(causal, T) == 4 * C * T
    W = 8  # a window: the ideal counts min(i+1, W) keys, the band computes whole tiles of them
    window = build_attention(AttentionConfig(n_embd=C, n_head=H, block_size=T, window=W), 0).eval()
    keys = sum(min(i + 1, W) for i in range(T))
    assert window.ideal_flops(T) == pytest.approx(4 * C * keys / T, rel=1e-12)
    assert counted_flops(window, T) > window.ideal_flops(T)
    matched = build_attention(AttentionConfig(n_embd=C, n_head=H, block_size=T, attention='tda', tda_matched=True), 0)
    assert matched.ideal_flops(T) == causal.ideal_flops(T)  # two score maps of D/2, one W v: softmax's products


def fake_cells(**losses):
    """{row: {'text': a cell}} of val losses, one run per seed from 1337 on, as cell_run writes them."""
    run = lambda loss: {'metrics': {'val_loss': loss, 'params': 801664, 'flops_counted': 4096.0,
                                    'flops_ideal': 2112.0}, 'train_wall_s': 9.0, 'score_wall_s': 1.0, 'rate': 100.0,
                        'rate_unit': 'tok/s', 'run': f'runs/text/x-s{1337}'}
    return {row: {'text': {'status': 'ok', 'own': '--attention=x',
                           'seeds': {str(1337 + i): run(loss) for i, loss in enumerate(values)}}}
            for row, values in losses.items()}


def test_the_95_percent_t_quantile_equals_the_tables_and_scipy():
    from studies.verdicts import t_quantile, t_two_sided
    printed = {1: 12.706204736174705, 2: 4.302652729911275, 3: 3.182446305284263, 4: 2.7764451051977934,
               9: 2.2621571627409915, 10: 2.2281388519649385, 30: 2.0422724563012373}  # t(0.975, df), 16 digits
    for df, t in printed.items():
        assert t_quantile(0.95, df) == pytest.approx(t, rel=1e-9), df
        assert t_two_sided(t, df) == pytest.approx(0.95, abs=1e-10)  # atan, then sin or cos: float error
    scipy = pytest.importorskip('scipy.stats', reason='scipy (not a dependency) compares every df to 60')
    for df in range(1, 61):
        for level in (0.8, 0.95, 0.99):
            assert t_quantile(level, df) == pytest.approx(scipy.t.ppf((1 + level) / 2, df), rel=1e-9), (df, level)


def test_a_paper_table_marks_a_row_whose_paired_interval_excludes_zero():
    from studies.report import compared, paired_line, table_line, table_metrics, told_apart
    cells = fake_cells(softmax=(1.0, 1.1, 1.2),    # 1.1 ± 0.1 (the sample standard deviation, ddof=1)
                       window=(0.5, 0.6, 0.7),     # each seed 0.5 lower: d = -0.5 ± 0, the interval [-0.5, -0.5]
                       topk=(1.0, 1.2, 1.4),       # d = 0, 0.1, 0.2: 0.1 ± t·0.1/√3 = 0.1 ± 0.2484, holds 0
                       longformer=(1.06, 1.15, 1.26),  # each seed about 0.057 higher, d's sd 0.0058: marked,
                       #   though its mean is 0.057 from softmax's and the two spreads are 0.1 each
                       routing=(1.6, 1.5, 1.4),    # 0.4 higher on average, but d = 0.6, 0.4, 0.2: 0.4 ± 0.4968, holds 0,
                       #   though |1.5 - 1.1| = 0.4 > 2·sqrt(0.1² + 0.1²) = 0.28 (the unpaired rule would mark it)
                       krause=(1.05,))             # one seed: no interval
    metrics, first = table_metrics(TABLES['krause_lm'], 'text', []), cells['softmax']['text']  # val loss
    line = lambda row: table_line(row, cells[row]['text'], first, metrics)
    assert line('softmax') == '| softmax | `--attention=x` | 1.1000 ± 0.1000 | 801,664 | 4.1k · 2.11k | 10 s, 100 tok/s |'
    assert line('window').startswith('| window | `--attention=x` | 0.6000 ± 0.1000* | 801,664 |')
    assert line('topk').startswith('| topk | `--attention=x` | 1.2000 ± 0.2000 | 801,664 |')
    assert line('longformer').startswith('| longformer | `--attention=x` | 1.1567 ± 0.1002* |')
    assert line('routing').startswith('| routing | `--attention=x` | 1.5000 ± 0.1000 |')
    assert line('krause').startswith('| krause | `--attention=x` | 1.0500 | 801,664 |')
    t2 = 4.302652729911275  # t(0.975, 2), by hand: half-width t·sd(d)/√3
    half = {'topk': t2 * 0.1 / math.sqrt(3), 'routing': t2 * 0.2 / math.sqrt(3),
            'longformer': t2 * float(np.std([0.06, 0.05, 0.06], ddof=1)) / math.sqrt(3)}
    assert half['routing'] == pytest.approx(0.49683, abs=1e-5)
    pair = lambda row: paired_line(row, cells[row]['text'], first, metrics)
    assert pair('window') == '| window | −0.5000 [−0.5000, −0.5000]* |'
    assert pair('topk') == f"| topk | +0.1000 [{0.1 - half['topk']:+.4f}, +{0.1 + half['topk']:.4f}] |".replace('-', '−')
    assert pair('routing') == '| routing | +0.4000 [−0.0968, +0.8968] |'
    longformer = compared(cells['longformer']['text'], first, 'val_loss')
    assert longformer['diffs'] == pytest.approx([0.06, 0.05, 0.06]) and longformer['apart'] == 1
    assert longformer['half_width'] == pytest.approx(half['longformer'], rel=1e-9)
    assert pair('krause') == '| krause | +0.0500 (one seed) |'  # its seed 1337 against softmax's 1.0
    assert told_apart('text', list(cells), cells, metrics[0]) == (
        "**text**, val loss (lower is better), against softmax, paired by seed: lower (the interval below 0): "
        "window; not told apart (± the smallest difference its seeds could show): topk (±0.2484), routing (±0.4968); "
        "higher (above 0): longformer; one seed, no interval: krause.")
    failed = {'status': 'failed', 'own': '--attention=x', 'why': 'error: a | b'}
    assert table_line('topk', failed, first, metrics) == '| topk | `--attention=x` | error: a / b | | | |'


def test_a_claims_verdict_follows_its_paired_interval():
    from types import SimpleNamespace
    from studies.claims import CLAIMS
    from studies.report import claim_results, claims_markdown
    cells = fake_cells(softmax=(1.0, 1.1, 1.2), window=(0.5, 0.6, 0.7), topk=(1.0, 1.2, 1.4),
                       longformer=(1.06, 1.15, 1.26), routing=(1.6, 1.5, 1.4), krause=(0.9, 1.0, 1.1),
                       krause_matched=(1.1, 1.2, 1.3))
    lab = SimpleNamespace(table_name='krause_lm', table=TABLES['krause_lm'], systems=['text'], budget='cpu',
                          rows_of={'text': list(cells)}, tasks='')
    results = {(r['row'], r['against']): r for r in claim_results(lab, cells)}
    assert {pair: r['verdict'] for pair, r in results.items()} == {  # each a claim that the row matches or beats
        ('krause', 'softmax'): 'holds',            # d = -0.1 in each seed: the interval below 0
        ('krause', 'window'): 'contradicted',      # d = +0.4 in each seed
        ('krause', 'topk'): 'not told apart',      # d = -0.1, -0.2, -0.3: -0.2 ± 0.2484 holds 0
        ('krause', 'longformer'): 'holds',         # d = -0.16, -0.15, -0.16
        ('krause', 'routing'): 'holds',            # d = -0.7, -0.5, -0.3: -0.5 ± 0.4968, just below 0
        ('krause_matched', 'softmax'): 'contradicted'}  # d = +0.1 in each seed
    assert len(results) == len(CLAIMS['krause_lm'])
    text = '\n'.join(claims_markdown(lab, list(results.values())))
    assert "At budget `cpu` the models, data and steps are far smaller than the paper's" in text
    assert "| text: val loss | krause − routing: not higher | no number for this metric | −0.5000 [−0.9968, −0.0032]* " \
           "| holds |" in text
    assert "| krause − topk: not higher | no number for this metric | −0.2000 [−0.4484, +0.0484] | not told apart at " \
           "this budget (±0.2484) |" in text
    lab.rows_of = {'text': ['softmax', 'krause']}  # --rows=krause: the claims against rows not run are left out
    assert [(r['row'], r['against']) for r in claim_results(lab, cells)] == [('krause', 'softmax')]


def test_every_claim_names_its_tables_system_rows_and_metric():
    from studies.claims import CLAIMS, WAYS
    from studies.report import table_metrics
    assert set(CLAIMS) <= set(TABLES)
    for name, claims in CLAIMS.items():
        for claim in claims:
            spec = TABLES[name].systems[claim.system]
            tasks = [t for t in spec.tasks.split(',') if t]  # the paper budget's columns
            keys = [m.key for m in table_metrics(TABLES[name], claim.system, tasks)]
            assert claim.metric in keys and claim.way in WAYS, (name, claim)
            assert claim.row in spec.rows and claim.row != claim.against, (name, claim)
            assert (claim.against in spec.rows) == (claim.threshold is None) != (claim.against == ''), (name, claim)
            assert not claim.premise or (claim.premise.row in spec.rows and claim.premise.way in WAYS), (name, claim)
            assert set(claim.paper) <= {claim.row, claim.against}, (name, claim)


def analysed_cells(system='text', **rows):
    """{row: {system: a cell}} whose seeds, from 1337 on, have the metrics given: row={key: (a value per seed)}."""
    run = lambda metrics: {'metrics': metrics, 'train_wall_s': 9.0, 'score_wall_s': 1.0, 'rate': 100.0,
                           'rate_unit': 'tok/s', 'run': 'runs/x/x-s1337'}
    return {row: {system: {'status': 'ok', 'own': '--attention=x', 'seeds': {
        str(1337 + i): run({key: values[i] for key, values in metrics.items()})
        for i in range(len(next(iter(metrics.values()))))}}} for row, metrics in rows.items()}


def claims_of(name, cells, tasks=''):
    """({(row, against or the threshold, metric): claim_results' result}, the lab) of table `name` on `cells` (one
    system's), at cpu."""
    from types import SimpleNamespace
    from studies.report import claim_results
    system = next(iter(next(iter(cells.values()))))
    lab = SimpleNamespace(table_name=name, table=TABLES[name], systems=[system], budget='cpu',
                          rows_of={system: list(cells)}, tasks=tasks)
    results = claim_results(lab, cells)
    return {(r['row'], r['against'] or r['threshold'], r['metric']): r for r in results}, lab


def test_a_claim_of_a_bound_is_tested_against_it_and_one_whose_premise_is_absent_is_untestable():
    """TDA's "99% of its weights exactly zero": the row's own zeros against 0.99, not its lead over softmax (which
    has none); "free of the attention sink softmax has": untestable where softmax's sink ratio is not above 1."""
    from studies.report import claims_markdown, compared
    zeros = {'softmax': (0.0, 0.0, 0.0), 'tda': (0.93, 0.95, 0.94)}  # far above softmax's, below 0.99 in each seed
    no_sink = {'softmax': (0.50, 0.52, 0.54), 'tda': (0.30, 0.35, 0.33)}  # softmax: half the uniform share
    cells = analysed_cells(**{row: {'sparsity': zeros[row], 'sink_ratio': no_sink[row]} for row in zeros})
    results, lab = claims_of('tda', cells)
    bound, sink = results[('tda', 0.99, 'sparsity')], results[('tda', 'softmax', 'sink_ratio')]
    assert compared(cells['tda']['text'], cells['softmax']['text'], 'sparsity')['apart'] == 1  # beats softmax
    assert bound['ours']['diffs'] == pytest.approx([-0.06, -0.04, -0.05]) and bound['verdict'] == 'contradicted'
    assert sink['ours']['apart'] == -1 and sink['verdict'] == 'untestable here'  # lower than softmax's, told apart
    text = '\n'.join(claims_markdown(lab, list(results.values())))
    assert "| text: exact zeros | tda − 0.99 (the claim's bound): not lower | tda 0.990 | −0.050 [−0.075, −0.025]* " \
           "| contradicted |" in text
    assert "| untestable here: it presumes softmax has a sink: its sink ratio above 1 (token 0 gets more than the " \
           "uniform share), and this table does not show it: softmax's sink ratio 0.52 ± 0.02, softmax − 1: −0.48 " \
           "[−0.53, −0.43]* |" in text

    # at 99.6% zeros the bound holds; with a sink in softmax (its ratio about 2), TDA's lower share holds
    cells = analysed_cells(softmax={'sparsity': (0.0, 0.0, 0.0), 'sink_ratio': (1.8, 2.0, 2.2)},
                           tda={'sparsity': (0.995, 0.996, 0.997), 'sink_ratio': (0.9, 1.0, 1.1)})
    results, _ = claims_of('tda', cells)
    assert results[('tda', 0.99, 'sparsity')]['verdict'] == 'holds'
    assert results[('tda', 'softmax', 'sink_ratio')]['verdict'] == 'holds'
    cells['softmax']['text']['seeds']['1337']['metrics']['sink_ratio'] = 0.2  # 0.2, 2.0, 2.2: a sink not shown
    assert claims_of('tda', cells)[0][('tda', 'softmax', 'sink_ratio')]['verdict'] == 'untestable here'


def test_a_task_is_scored_by_the_papers_metric_and_a_comparable_claim_is_never_a_lead():
    """CB's number is its accuracy, as the Krause paper's 60.71 → 64.29 (the harness's F1 beside it); the paper
    calls BoolQ's 80.41 → 80.59 comparable: told apart either way is contradicted, a lead included."""
    from studies.cells import task_score
    cb = {'alias': 'cb', 'acc,none': 0.6429, 'acc_stderr,none': 0.06, 'f1,none': 0.4804, 'f1_stderr,none': 'N/A'}
    assert task_score(cb, 'cb') == 0.6429
    assert task_score({'f1,none': 0.3, 'acc,none': 0.5}, 'qasper_scrolls') == 0.3  # the first of TASK_METRICS
    assert task_score({'acc,none': 0.5, 'acc_norm,none': 0.6}, 'piqa') == 0.6
    boolq = lambda *krause: analysed_cells('shortcut', lora={'task_boolq': (0.80, 0.81, 0.82)},
                                           krause={'task_boolq': krause})
    verdict = lambda cells: claims_of('krause_llm', cells, 'boolq')[0][('krause', 'lora', 'task_boolq')]
    assert verdict(boolq(0.80, 0.812, 0.819))['verdict'] == 'not told apart'  # +0.0003 [−0.0121, +0.0127]
    lead = verdict(boolq(0.85, 0.86, 0.87))  # +0.05 in each seed: 'higher' would hold
    assert lead['way'] == 'comparable' and lead['ours']['apart'] == 1 and lead['verdict'] == 'contradicted'


def test_an_unknown_table_or_a_rule_it_cannot_run_is_one_error_line_before_any_run(tmp_path):
    lab = tmp_path / 'lab'
    cases = [(['--table=nope'], "error: table='nope' is not a table; pass --table=NAME, one of tda, krause_lm, "
                                "krause_vision, krause_images, krause_llm, attentionx, cluster, or leave it out for "
                                "every rule on every system"),
             (['--table=tda', '--rows=softmax,window'], "error: rows: unknown name(s) window (not in table tda); "
              "pass e.g. --rows=softmax,gated (valid: softmax, gated, entmax, rela, diff, dex, tda, tda_matched, tra)"),
             (['--table=attentionx', '--systems=vit', '--rows=softmax'], "error: rows: unknown name(s) softmax (not "
              "in table attentionx); pass e.g. --rows=lsa,attentionx (valid: lsa, attentionx)"),
             (['--table=tda', '--systems=vit'], "error: systems: unknown name(s) vit (not in table tda); pass e.g. "
                                                "--systems=text,long (valid: text, long)"),
             (['--tasks=hellaswag'], "error: tasks=hellaswag scores a table's language models, and no table is picked; "
                                     "pass --table=tda or krause_lm (with --systems=text), or leave --tasks out"),
             (['--table=tda', '--harness_args="--limit=1'], "error: harness_args does not parse as command-line "
              "arguments (No closing quotation); pass --harness_args=\"...\" with balanced quotes")]
    results = run_forked(*[{'argv': ['studies/ablate.py', *args, f'--out_root={lab}']} for args, _ in cases])
    for (code, out), (_, error) in zip(results, cases):
        assert code == 1 and [line for line in out.splitlines() if line.startswith('error:')] == [error], out
    assert not lab.exists()  # nothing was made, nothing trained


# the papers' tables beyond training: a row swapped into a trained run, a system in two stages, zero-shot tasks

def test_a_swapped_row_is_the_trained_softmax_run_with_cluster_attention_scored_as_every_row(tmp_path):
    """The cluster table's swap trains nothing: its checkpoint is the softmax run's, every shared weight equal, with
    cluster attention (seeds by k-means on that run's keys) in its place, and train.py scores it as it scores a row."""
    lab, rows, out = tiny_text_table(tmp_path, 'cluster', 'softmax,swap')
    assert all(rows[r]['text']['status'] == 'ok' for r in ('softmax', 'swap')), out
    folder = {r: lab / rows[r]['text']['seeds']['1337']['run'] for r in ('softmax', 'swap')}
    softmax, swap = (torch.load(folder[r] / 'ckpt.pt', map_location='cpu', weights_only=True)
                     for r in ('softmax', 'swap'))
    assert swap['model_args'] == {**softmax['model_args'], 'attention': 'cluster', 'cluster_m': 16, 'cluster_chunk': 16,
                                  'cluster_sharpness': 20}
    own = {k for k in swap['model'] if k not in softmax['model']}
    assert own == {'transformer.h.0.attn.seeds', 'transformer.h.0.attn.log_sharpness'}, own
    assert all(torch.equal(swap['model'][k], v) for k, v in softmax['model'].items())  # nothing trained
    metrics = rows['swap']['text']['seeds']['1337']['metrics']
    full = json.loads((folder['swap'] / 'eval_full.json').read_text())  # train.py's score, as every row's
    assert metrics['val_loss'] == full['val_loss'] and full['examples'] == 64
    H, m, D = 2, 16, 16
    assert metrics['params'] == rows['softmax']['text']['seeds']['1337']['metrics']['params'] + H * m * D + H
    assert not (folder['swap'] / 'log.jsonl').exists()  # no training: no speed in its cell
    assert '| swap | `--attention=cluster --cluster_chunk=16 --cluster_m=16 --cluster_sharpness=20` |' in \
        (lab / 'cluster' / 'table.md').read_text()


def test_the_long_system_extends_its_base_to_four_times_its_length_with_ntk_rope(tmp_path):
    """The tda table's long system: a base trained on passkeys of 1, 2 and 4 needles at T, then from its checkpoint
    at 4T with NTK-scaled RoPE; its cell is extrapolate.py's whole-passkey accuracy at 4T per needle count."""
    lab = tmp_path / 'lab'
    out = ablate('--table=tda', '--systems=long', '--rows=softmax', '--budget=tiny', f'--out_root={lab}')
    table = json.loads((lab / 'tda' / 'table.json').read_text())
    assert table['rows']['softmax']['long']['status'] == 'ok', out
    base, extended = (torch.load(run_folder(lab, system, 'softmax') / 'ckpt.pt', map_location='cpu',
                                 weights_only=True) for system in ('long_base', 'long'))
    assert base['config']['passkey_needles'] == extended['config']['passkey_needles'] == '1,2,4'
    assert (base['model_args']['block_size'], extended['model_args']['block_size']) == (64, 256)
    assert (extended['model_args']['rope_scaling'], extended['model_args']['rope_factor']) == ('ntk', 4.0)
    assert base['model_args']['rope_scaling'] in ('', 'none') and base['model_args']['pos_emb'] == 'rope'
    assert f"fine-tuning {run_folder(lab, 'long_base', 'softmax') / 'ckpt.pt'}" in \
        (run_folder(lab, 'long', 'softmax') / 'train.log').read_text()
    scored = [json.loads(line) for line in (lab / 'tda' / 'long' / 'softmax-s1337' / 'eval.log').read_text()
              .splitlines() if line.startswith('{')]
    assert [(r['needles'], r['T']) for r in scored] == [(1, 256), (2, 256), (4, 256)]
    metrics = table['rows']['softmax']['long']['seeds']['1337']['metrics']
    assert [metrics[f'needles_{k}'] for k in (1, 2, 4)] == [r['passkey_acc'] for r in scored]


@needs_shared
def test_a_tables_zero_shot_task_is_a_column_scored_by_the_harness(tmp_path):
    """--tasks scores a table's language-model cells with studies/harness.py; the column is the task's acc_norm (the
    harness's: the summed log-likelihood of each ending over its characters), recomputed here from the model."""
    pytest.importorskip('lm_eval', reason="lm-evaluation-harness is not installed: pip install -r "
                                          "requirements-extras.txt")
    import tiktoken
    import torch.nn.functional as F
    from support.hellaswag import render_example
    from support.loading import load_run
    source, rows = tmp_path / 'input.txt', tmp_path / 'hellaswag.jsonl'
    source.write_text((SHARED / 'tinyshakespeare' / 'input.txt').read_text()[:20000])
    rows.write_text(''.join((SHARED / 'hellaswag' / 'hellaswag_val_1000.jsonl').read_text().splitlines(True)[:6]))
    lab = tmp_path / 'lab'
    out = ablate('--table=tda', '--systems=text', '--rows=softmax', '--budget=tiny', f'--text_source={source}',
                 f'--out_root={lab}', '--tasks=hellaswag_nanogpt',
                 f'--recipe=--dataset=shakespeare --block_size=256 --data_dir={tmp_path / "bpe"}'  # uncropped
                 ' --max_iters=2 --lr_decay_iters=2 --warmup_iters=1 --eval_interval=2 --batch_size=2',  # any model
                 f'--harness_args=--hellaswag_source={rows}')
    cell = json.loads((lab / 'tda' / 'table.json').read_text())['rows']['softmax']['text']
    assert cell['status'] == 'ok', out
    model, enc, right = load_run(lab / cell['seeds']['1337']['run']).model, tiktoken.get_encoding('gpt2'), 0
    for row in map(json.loads, rows.read_text().splitlines()):
        tokens, mask, label = render_example(row, enc)  # ctx + " " + ending, the endings' tokens masked in
        with torch.no_grad():
            logp = F.log_softmax(model(tokens, tokens)[0][:, :-1].double(), -1).gather(-1, tokens[:, 1:, None])[..., 0]
        summed = (logp * mask[:, 1:]).sum(1)  # (4,): log p(ending | ctx)
        right += int((summed / torch.tensor([len(e) for e in row['endings']])).argmax() == label)
    assert cell['seeds']['1337']['metrics']['task_hellaswag_nanogpt'] == right / 6
    assert '| sink ratio | hellaswag_nanogpt | parameters |' in (lab / 'tda' / 'table.md').read_text()


def test_a_recipe_key_goes_to_the_runs_that_read_it_and_one_the_lab_sets_is_refused(tmp_path):
    """--recipe: a rule's own key reaches that rule's runs alone (the others would refuse it), one no run reads is one
    line, and a key the lab sets per run itself (the seed, the folder) is refused, not silently overridden."""
    common = ['studies/ablate.py', '--budget=tiny', '--systems=recall', f'--out_root={tmp_path}', '--dry_run=True']
    out = run_script(*common, '--rows=softmax,krause', '--recipe=--krause_topk=4 --dtype=float32')
    commands = {line.split('--attention=')[1].split()[0]: line for line in out.splitlines()
                if 'python train.py' in line}
    assert '--krause_topk=4 --dtype=float32' in commands['krause'], out
    assert '--krause_topk' not in commands['softmax'] and '--dtype=float32' in commands['softmax'], out
    for rows, recipe, line in [
        ('softmax', '--krause_topk=4', "error: recipe: --krause_topk is read only by krause, and no run of this table "
                                       "is one: it would change nothing; drop it, or pick a row that reads it with "
                                       "--rows"),
        ('softmax', '--seed=5', "error: recipe: --seed is set by the lab for each run (pass --seeds=N,... to the lab); "
                                "drop it from --recipe"),
        ('softmax', f'--out_dir={tmp_path}/x', "error: recipe: --out_dir is set by the lab for each run (its folder "
                                               "under --out_root); drop it from --recipe"),
        ('softmax', '--nproc_per_node=2', "error: recipe: --nproc_per_node is set by the lab for each run (the lab's "
                                          "own --nproc_per_node (or --nodes, --gpus_per_node): it starts the "
                                          "processes); drop it from --recipe")]:
        refused = run_script(*common[:-1], f'--rows={rows}', f'--recipe={recipe}', check=False)
        assert refused.strip().splitlines()[-1] == line, refused
    assert list(tmp_path.iterdir()) == []
