"""Reliability and the first hour: every bad setting or damaged dataset ends in one `error:` line before
any work, kill -9 at any moment loses nothing, a torchrun worker killed mid-run restarts and resumes by itself."""
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, iter_losses, run_forked, run_script
from prepare import recall, shakespeare_char

TINY = ['--n_layer=1', '--n_head=2', '--n_embd=32', '--batch_size=16', '--eval_iters=2', '--log_interval=1',
        '--warmup_iters=2', '--compile=False', '--device=cpu']

# id: (script and arguments, a pattern its one error line must match); {d} is the folder of the module's data. Each
# train.py row gets an out_dir of its own, and the recall data unless it names a data_dir: a check that failed to
# stop it would train there, never in the repo's data/.
ROWS = {
    # every bad setting a first hour meets, and the line it must give
    'eval_iters=0': ('train.py --eval_iters=0', r"eval_iters=0 must be at least 1; pass --eval_iters=1"),
    'gradient_accumulation_steps=0': ('train.py --gradient_accumulation_steps=0',
                                      r"gradient_accumulation_steps=0 must be at least 1"),
    'n_embd=130,n_head=4': ('train.py --n_embd=130 --n_head=4',
                            r"n_embd=130 must be a multiple of n_head=4; pass e\.g\. --n_embd=128"),
    'batch_size=0': ('train.py --batch_size=0', r"batch_size=0 must be at least 1"),
    'max_iters=-5': ('train.py --max_iters=-5', r"max_iters=-5 trains no iteration, so the run would write no "
                                                r"checkpoint; pass --max_iters=1 or more$"),
    'learning_rate=1e6': (f'train.py {" ".join(TINY)} --learning_rate=1e6 --eval_interval=10 --log_interval=10',
                          r"loss is (nan|inf) at iteration 10; this run wrote no checkpoint yet; lower learning_rate"),
    'odd-size train.bin': ('train.py --dataset=shakespeare_char --data_dir={d}/odd',
                           r"odd/train.bin holds \S+ bytes, not the \S+ bytes of the \S+ tokens meta.json records: "
                           r"the file is damaged; delete \S+ to prepare it again, or pass --data_dir="),
    'bad meta.json, shakespeare_char': ('train.py --dataset=shakespeare_char --data_dir={d}/badmeta',
                                        r"badmeta/meta.json cannot be read \(JSONDecodeError.*\): the folder is "
                                        r"damaged; delete \S+ to prepare it again, or pass --data_dir="),
    'bad meta.json, recall': ('train.py --data_dir={d}/badmeta', r"badmeta/meta.json cannot be read"),
    'bad meta.json, fineweb_edu': ('train.py --dataset=fineweb_edu --data_dir={d}/badmeta',
                                   r"badmeta/meta.json cannot be read"),
    'eval_interval=0': ('train.py --eval_interval=0', r"eval_interval=0 must be at least 1"),
    'log_interval=0': ('train.py --log_interval=0', r"log_interval=0 must be at least 1"),
    'warmup_iters=lr_decay_iters': ('train.py --warmup_iters=50 --lr_decay_iters=50',
                                    r"lr_decay_iters=50 must be greater than warmup_iters=50; pass "
                                    r"--lr_decay_iters=600 \(usually max_iters\)"),
    'krause_topk=999 before preparing': ('train.py --attention=krause --krause_topk=999 --dataset=shakespeare_char '
                                         '--data_dir={d}/never --data_source={d}/missing.txt',
                                         r"krause_topk must be in \[1, krause_window=32\], got 999"),
    'rope_scaling=yarn before preparing': ('train.py --pos_emb=rope --rope_scaling=yarn --dataset=shakespeare_char '
                                           '--data_dir={d}/never --data_source={d}/missing.txt',
                                           r"rope_scaling must be 'none', 'linear' or 'ntk', got 'yarn'"),
    'rope_factor=0': ('train.py --pos_emb=rope --rope_scaling=ntk --rope_factor=0', r"rope_factor=0.0 must be positive"),
    'scaling learned positions': ('train.py --rope_scaling=ntk --rope_factor=4',
                                  r"pos_emb='learned': learned absolute positions cannot be scaled; pass --pos_emb=rope"),
    'unknown characters': ('sample.py --out_dir={d}/ckpt_chars --start=ROMEO€_日本',
                           r"the prompt has 7 character\(s\) this model never saw: 'E' 'M' 'O' 'R' '€' '日' '本'; "
                           r"remove or replace them"),
    # siblings
    'another dataset in data_dir': ('train.py --dataset=shakespeare_char --data_dir={d}/recall',
                                    r"recall holds the dataset 'recall', not 'shakespeare_char': pass --data_dir="),
    'val.bin missing': ('train.py --dataset=shakespeare_char --data_dir={d}/noval', r"noval/val.bin is missing"),
    'truncated .npy': ('train.py --data_dir={d}/cut', r"cut/train_y.npy cannot be read"),
    'val split too small': ('train.py --dataset=shakespeare_char --data_dir={d}/chars --block_size=3000',
                            r"val.bin holds \S+ tokens, fewer than block_size \+ 1 = 3001, and all of its source is "
                            r"in it: pass a smaller --block_size, or a larger --data_source with --data_dir="),
    'dropout=1': ('train.py --dropout=1.0', r"dropout=1.0 must be at least 0 and below 1"),
    'beta2=1': ('train.py --beta2=1.0', r"beta2=1.0 must be at least 0 and below 1"),
    'learning_rate=0': ('train.py --learning_rate=0.0', r"learning_rate=0.0 must be positive"),
    'weight_decay<0': ('train.py --weight_decay=-0.1', r"weight_decay=-0.1 must not be negative"),
    'recall_pairs>recall_keys': ('train.py --recall_pairs=20', r"recall_pairs=20 must be at most recall_keys=16"),
    'init_from=x': ('train.py --init_from=x', r"init_from='x' is neither 'scratch', 'resume', 'auto'"),
    'device=gpu': ('train.py --device=gpu', r"device='gpu' is not a device; pass --device=cpu"),
    'hellaswag on recall': ('train.py --hellaswag=True', r"hellaswag=True needs a GPT-2 BPE dataset"),
    'accumulation vs processes': ('train.py --gradient_accumulation_steps=4',  # run with WORLD_SIZE=3 (ENV)
                                  r"gradient_accumulation_steps=4 must be a multiple of the 3 processes"),
    'resume past max_iters': (f'train.py {" ".join(TINY)} --out_dir={{d}}/ckpt_recall --init_from=resume '
                              f'--max_iters=1', r"is at iteration 4, past max_iters=1; pass --max_iters=4 or more"),
    'recall prompt not ids': ('sample.py --out_dir={d}/ckpt_recall --start=hello',
                              r"this model reads token ids 0\.\.31 separated by spaces, got 'hello'"),
    'prompt file missing': ('sample.py --out_dir={d}/ckpt_chars --start=FILE:{d}/nope.txt',
                            r"cannot read the prompt file \S+nope.txt"),
    # LoRA and bases: a base is needed, the rank fits the layers, the data's tokens fit the base's vocabulary
    'lora_rank without a base': ('train.py --lora_rank=4', r"lora_rank=4 trains low-rank updates of a base's frozen "
                                 r"weights, but init_from='scratch' starts from random ones; pass --init_from=BASE"),
    'lora_rank above the layer': (f'train.py {" ".join(TINY)} --init_from={{d}}/ckpt_recall/ckpt.pt --lora_rank=64',
                                  r"lora_rank=64 is larger than 32, the smaller side of the c_attn weights it adapts "
                                  r"in \S+ckpt.pt \(n_embd=32, MLP hidden 128\); pass --lora_rank=32 or less"),
    'base vocabulary smaller': (f'train.py {" ".join(TINY)} --init_from={{d}}/ckpt_recall/ckpt.pt --recall_keys=64 '
                                f'--data_dir={{d}}/recall64', r"the dataset recall has 128 tokens but \S+ckpt.pt reads "
                                r"only 32; fine-tune on data of its vocabulary"),
    # what the configurator and the folders are given
    'ViT key, text dataset': ('train.py --dataset=shakespeare_char --patch_size=8',
                              r"patch_size is a ViT setting, but dataset shakespeare_char \(text\) trains a GPT; drop "
                              r"--patch_size \(and the ViT config that sets it\), or pass an image dataset \(cifar10"),
    'config, bad syntax': ('train.py {d}/bad_config.py', r"bad_config.py, line 2: '\(' was never closed; fix the "
                                                          r"config file"),
    'config raises': ('train.py {d}/raising_config.py', r"raising_config.py, line 1: NameError: name 'nope' is not "
                                                        r"defined; fix the config file"),
    'out_dir empty': ('train.py --out_dir=', r"out_dir is empty; pass --out_dir=DIR"),
    'out_dir a file': ('train.py --out_dir={d}/input.txt', r"out_dir=\S+input.txt is a file, not a folder"),
    'resume, no checkpoint': ('train.py --init_from=resume', r"init_from='resume' but there is no checkpoint at "),
}
ENV = {'accumulation vs processes': {'WORLD_SIZE': '3'}}
# rows that must stop in the check block, before any work: their out_dir is never made, no data is prepared
EARLY = ['eval_iters=0', 'gradient_accumulation_steps=0', 'n_embd=130,n_head=4', 'batch_size=0', 'max_iters=-5',
         'eval_interval=0', 'log_interval=0', 'warmup_iters=lr_decay_iters', 'krause_topk=999 before preparing',
         'dropout=1', 'beta2=1', 'learning_rate=0', 'weight_decay<0', 'recall_pairs>recall_keys', 'init_from=x',
         'device=gpu', 'hellaswag on recall', 'accumulation vs processes', 'lora_rank without a base',
         'lora_rank above the layer', 'ViT key, text dataset', 'config, bad syntax', 'config raises', 'out_dir empty',
         'out_dir a file']
SETUP = {  # checkpoints the rows use, trained first in the same batch
    'ckpt_chars': f'train.py {" ".join(TINY)} --dataset=shakespeare_char --data_dir={{d}}/chars --block_size=16 '
                  f'--max_iters=2 --eval_interval=2 --out_dir={{d}}/ckpt_chars',
    'ckpt_recall': f'train.py {" ".join(TINY)} --max_iters=4 --eval_interval=4 --out_dir={{d}}/ckpt_recall',
}


def out_dir(folder, name):
    return folder / 'out' / re.sub(r'\W', '_', name)


def run_of(name, folder):
    """The forked run of a row or setup command (a space inside an argument is written _ in the table)."""
    script, *args = [a.replace('_日', ' 日').format(d=folder) for a in {**SETUP, **{k: v[0] for k, v in ROWS.items()}}[name].split()]
    if script == 'train.py':
        args = [f'--data_dir={folder / "recall"}', f'--out_dir={out_dir(folder, name)}', *args]  # later ones win
    return {'argv': [script, *args], 'env': ENV.get(name, {})}


@pytest.fixture(scope='module')
def rows(tmp_path_factory):
    """Every row, run once in one batch of forked processes: {id: (exit code, output)}, setup runs' included."""
    d = tmp_path_factory.mktemp('rows')
    (d / 'bad_config.py').write_text("n_layer = 1\nbatch_size = (\n")
    (d / 'raising_config.py').write_text("n_layer = nope\n")
    (d / 'input.txt').write_text(''.join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(400)))
    shakespeare_char.prepare(d / 'chars', source=d / 'input.txt')
    for name in ('odd', 'badmeta', 'noval'):
        shutil.copytree(d / 'chars', d / name)
    with open(d / 'odd' / 'train.bin', 'ab') as f:
        f.write(b'\0')  # one byte more: half a token
    (d / 'badmeta' / 'meta.json').write_text('{"kind": "text", ')
    (d / 'noval' / 'val.bin').unlink()
    recall.prepare(d / 'recall')
    shutil.copytree(d / 'recall', d / 'cut')
    with open(d / 'cut' / 'train_y.npy', 'r+b') as f:
        f.truncate(1000)  # an array cut short
    names = [*SETUP, *ROWS]
    return d, dict(zip(names, run_forked(*(run_of(name, d) for name in names))))


@pytest.mark.parametrize('row', ROWS)
def test_every_bad_setting_ends_in_one_error_line(row, rows):
    folder, results = rows
    assert all(results[name][0] == 0 for name in SETUP), [results[name][1][-2000:] for name in SETUP]
    rc, out = results[row]
    errors = [line for line in out.splitlines() if 'error' in line.lower()]
    assert rc == 1 and 'Traceback' not in out and len(errors) == 1, out[-3000:]
    assert errors[0].startswith('error: ') and re.search(ROWS[row][1], errors[0]), errors[0]
    if row in EARLY:  # stopped before any work
        assert not out_dir(folder, row).exists() and not (folder / 'never').exists()
    # an out_dir the run made and left empty is removed; the lock is released
    assert not out_dir(folder, row).exists() or any(out_dir(folder, row).iterdir())
    assert not list(folder.glob('**/run.lock'))


def test_sample_shows_recall_episodes(rows):
    folder, _ = rows
    out = run_forked({'argv': ['sample.py', f'--out_dir={folder / "ckpt_recall"}', '--num_samples=2']})[0][1]
    assert re.search(r"^episode 1: pairs (k\d+=v\d+ ){3}k\d+=v\d+; \d+/12 right$", out, re.M), out
    for name in ('queries', 'model', 'truth'):
        assert len(re.findall(rf"^  {name} +((k|v)\d+\*? *){{12}}$", out, re.M)) == 2, out
    assert re.search(r"^accuracy [01]\.\d{4} over 1,000 fresh episodes \(12,000 answers; chance 1/16", out, re.M)


def test_kill_9_at_any_moment_loses_nothing(tmp_path):
    """SIGKILL a run mid-step, mid-evaluation and mid-checkpoint-write (moments drawn at random), resume each time
    with init_from=auto: every iteration logs exactly the loss of an uninterrupted run, dropout on."""
    rng = random.Random(17)
    common = ['train.py', *TINY, f'--data_dir={tmp_path / "recall"}', '--dropout=0.1', '--max_iters=16',
              '--eval_interval=4', '--lr_decay_iters=16', '--init_from=auto']
    kills = [['', 'clip_grad_norm_', rng.randint(2, 12)],           # mid-step: after backward, before the update
             ['estimate_loss', 'load_batch', rng.randint(5, 12)],   # mid-evaluation: the 2nd to 3rd one
             ['save_checkpoint', 'write_record', rng.randint(3, 30)]]  # mid-write: a tmp file, half written
    rng.shuffle(kills)
    runs = [{'argv': [*common, f'--out_dir={tmp_path / "straight"}']}]
    runs += [{'argv': [*common, f'--out_dir={tmp_path / "killed"}'], 'kill': kill} for kill in [*kills, None]]
    (_, straight), *segments = run_forked(*runs)
    reference = iter_losses(straight)
    assert sorted(reference) == list(range(17))
    logged = {}
    for (rc, out), kill in zip(segments, [*kills, None]):
        assert rc == (-9 if kill else 0), out[-2000:]
        resumed = re.search(r"^resuming from \S+ at iteration (\d+)$", out, re.M)
        first = min(iter_losses(out), default=None)
        assert first == (int(resumed.group(1)) if resumed else 0)  # started where its checkpoint (if any) ended
        for n, loss in iter_losses(out).items():
            logged.setdefault(n, []).append(loss)
    assert sorted(logged) == list(range(17))
    assert all(losses == [reference[n]] * len(losses) for n, losses in logged.items()), (logged, reference)
    checkpoint = torch.load(tmp_path / 'killed' / 'ckpt.pt', weights_only=True)  # loadable, and at the end
    assert checkpoint['iter_num'] == 16
    assert not (tmp_path / 'killed' / 'run.lock').exists()  # each kill left its lock; the next run took it over
    # log.jsonl: after the kills and resumes, each iteration once, with the uninterrupted run's loss
    records = [json.loads(line) for line in (tmp_path / 'killed' / 'log.jsonl').read_text().splitlines()]
    train = [(r['iter'], r['loss']) for r in records if r['type'] == 'train']
    assert [n for n, _ in train] == list(range(17)), records
    assert all(abs(loss - reference[n]) < 5e-5 for n, loss in train)  # the printed loss has 4 decimals
    assert [r['iter'] for r in records if r['type'] == 'eval'] == [0, 4, 8, 12, 16], records


@pytest.mark.skipif(not os.environ.get('TORCHRUN_RESTART_TEST'), reason="opt-in (TORCHRUN_RESTART_TEST=1): two "
                    "torchrun jobs, about 18 s, more than this file's share of the suite's time")
def test_torchrun_restarts_a_killed_worker(tmp_path):
    """torchrun --max-restarts=1 with init_from=auto: rank 1 SIGKILLed mid-step in iteration 7 (first attempt only),
    both workers restart, resume from the checkpoint of iteration 6, and log the losses of an uninterrupted
    2-process run, the last evaluation's included."""
    common = [*TINY, f'--data_dir={tmp_path / "recall"}', '--dropout=0.1', '--max_iters=8', '--eval_interval=3',
              '--lr_decay_iters=8', '--gradient_accumulation_steps=2', '--init_from=auto']
    # without this torchrun's restarted workers can read the dead ones' addresses from the shared store and fail
    # to connect (pytorch#135712; it happened here on every try)
    launcher = ('env', 'TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1', 'torchrun', '--standalone', '--nproc_per_node=2',
                '--max-restarts=1')
    straight = run_script('train.py', *common, f'--out_dir={tmp_path / "straight"}', launcher=launcher)
    restarted = run_script('tests/faults.py', '--kill=:clip_grad_norm_:8:1', 'train.py', *common,
                           f'--out_dir={tmp_path / "restarted"}', launcher=launcher)
    assert re.search(r"^resuming from \S+ at iteration 6$", restarted, re.M), restarted[-3000:]
    reference = iter_losses(straight)
    logged = [(int(n), float(x)) for n, x in re.findall(r"^iter (\d+): loss ([\d.]+)", restarted, re.M)]
    assert sorted(reference) == list(range(9)) and {n for n, _ in logged} == set(range(9))
    assert len(logged) > 9 and all(x == reference[n] for n, x in logged)  # 6 at least twice: before and after
    last = re.compile(r"^step 8: train loss ([\d.]+), val loss ([\d.]+)", re.M)
    assert last.search(straight).groups() == last.search(restarted).groups()


def test_whole_split_eval_and_analyze_bad_input(rows):
    """--eval_full counts every val example once; analyze.py given a missing checkpoint or another dataset's data says
    so in one line each, then stops before analysing any (the last line names both), writing nothing; given the
    checkpoint it can read alone, it writes the table and JSON."""
    folder, _ = rows
    ckpt = folder / 'ckpt_recall'
    (rc_eval, out_eval), (rc, out), (rc_good, out_good) = run_forked(
        {'argv': ['train.py', *TINY, f'--data_dir={folder / "recall"}', '--max_iters=4', '--eval_interval=4',
                  f'--out_dir={ckpt}', '--eval_only=True', '--eval_full=True', '--init_from=resume']},
        {'argv': ['studies/analyze.py', f'--out_dir={folder / "nope"},{ckpt},{folder / "ckpt_chars"}',
                  f'--data_dir={folder / "recall"}', f'--json_path={folder / "bad.json"}']},
        {'argv': ['studies/analyze.py', f'--out_dir={ckpt}', f'--data_dir={folder / "recall"}',
                  f'--json_path={folder / "analysis.json"}']})
    assert rc_eval == 0 and re.search(r"^full val split at iteration 4: val loss [\d.]+, val acc [\d.]+ over 2,000 "
                                      r"examples \(24,000 targets\)$", out_eval, re.M), out_eval[-2000:]
    assert json.loads((ckpt / 'eval_full.json').read_text())['targets'] == 24000
    errors = [line for line in out.splitlines() if line.startswith('error')]
    assert rc == 1 and 'Traceback' not in out and len(errors) == 3, out[-3000:]
    assert 'nope/ckpt.pt' in errors[0] and "holds 'recall' (examples) data, but the checkpoint was trained on " \
        "'shakespeare_char' (text)" in errors[1], errors
    assert errors[2] == (f"error: {folder / 'nope'}, {folder / 'ckpt_chars'} (said why above) cannot be analysed, so "
                         f"nothing was: fix them or drop them from --out_dir") and out.strip().endswith(errors[2])
    assert '== ' not in out and not (folder / 'bad.json').exists()  # stopped before any analysis, nothing written
    assert rc_good == 0, out_good[-3000:]
    result = json.loads((folder / 'analysis.json').read_text())
    assert [e['name'] for e in result['checkpoints']] == [str(ckpt)] and result['errors'] == []
    assert re.search(r"^    0 mean +0\.\d{4} +\d\.\d{4} +0\.0000 ", out_good, re.M), out_good  # layer 0: share, ratio, sparsity


# -----------------------------------------------------------------------------
# faults at the borders: a disk that fills up, a second run on the same out_dir, data that changes mid-run, Ctrl-C.
# Each ends in one `error:` line (the last) saying what is kept; ckpt.pt stays byte for byte, no *.tmp is left.

def fault(code, target='', n=0, within=''):
    return [within, target, n, code]


def limit_files(size):
    """Fault code: writes past `size` bytes fail (EFBIG: RLIMIT_FSIZE, as a disk that is full)."""
    return f"resource.setrlimit(resource.RLIMIT_FSIZE, ({size}, resource.RLIM_INFINITY))"


def assert_one_error_line(rc, out, pattern, code=1):
    last = out.strip().splitlines()[-1]
    assert rc == code and 'Traceback' not in out and last.startswith('error: '), out[-3000:]
    assert re.search(pattern, last), last
    return last


def assert_nothing_lost(out, before):
    assert (out / 'ckpt.pt').read_bytes() == before
    assert not list(out.glob('*.tmp')) and not (out / 'run.lock').exists(), sorted(out.iterdir())


def test_a_failed_write_is_one_line_and_loses_nothing(rows, tmp_path):
    """The disk full (writes past RLIMIT_FSIZE fail with EFBIG) while writing ckpt.pt, a log.jsonl record, the log
    trimmed on resume, eval_full.json: one line each, naming the file and the checkpoint kept; ckpt.pt as it was,
    and the run resumed once space is back logs an uninterrupted run's losses."""
    folder, _ = rows
    out = tmp_path / 'out'
    common = ['train.py', *TINY, f'--data_dir={folder / "recall"}', '--dropout=0.1', '--eval_interval=4',
              '--lr_decay_iters=12']
    resume = [*common, f'--out_dir={out}', '--init_from=resume', '--max_iters=8']
    log_size = f"os.path.getsize({str(out / 'log.jsonl')!r})"
    then = (f"shutil.copy('{out}/ckpt.pt', '{tmp_path}/after'); "
            f"open('{tmp_path}/listing', 'w').write(str(os.listdir('{out}')))")
    (rc, _), *failed, (_, straight), (rc_resumed, resumed) = run_forked(
        {'argv': [*common, f'--out_dir={out}', '--max_iters=4']},
        {'argv': resume, 'fault': fault(f"shutil.copy('{out}/ckpt.pt', '{tmp_path}/before'); {limit_files(50_000)}")},
        {'argv': resume, 'fault': fault(limit_files(log_size), 'append', 2, 'guarded')},  # the 2nd record
        {'argv': resume, 'fault': fault(limit_files(100))},  # the lock fits, the trimmed log does not
        {'argv': [*resume, '--eval_only=True', '--eval_full=True'], 'fault': fault(limit_files(50))},
        {'argv': [*common, f'--out_dir={tmp_path / "straight"}', '--max_iters=12']},
        {'argv': [*resume, '--max_iters=12'], 'fault': fault(then)})  # space back: ckpt.pt and the folder noted first
    assert rc == 0
    kept = rf"; the last good checkpoint, iteration 4, is kept in {out}/ckpt.pt; free some space \(or raise the " \
           rf"file size limit\), then go on with --init_from=resume$"
    for (rc, log), name in zip(failed, ['ckpt.pt', 'log.jsonl', 'log.jsonl', 'eval_full.json']):
        assert_one_error_line(rc, log, rf"^error: cannot write {out}/{name} \(File too large\){kept}")
    assert (tmp_path / 'after').read_bytes() == (tmp_path / 'before').read_bytes()  # after all four failures
    assert sorted(eval((tmp_path / 'listing').read_text())) == ['ckpt.pt', 'log.jsonl']  # no *.tmp, no run.lock
    assert rc_resumed == 0 and min(iter_losses(resumed)) == 4, resumed[-2000:]
    assert {n: iter_losses(straight)[n] for n in iter_losses(resumed)} == iter_losses(resumed)


def test_data_that_shrinks_or_vanishes_mid_run_is_one_line(rows, tmp_path):
    """train.bin truncated mid-run (it was a NaN loss and advice to lower learning_rate) and the data folder deleted
    (a traceback): one line naming the file, and the checkpoint of iteration 4 kept, byte for byte."""
    folder, _ = rows
    shutil.copytree(folder / 'chars', tmp_path / 'chars')
    shutil.copytree(folder / 'recall', tmp_path / 'recall')
    common = ['train.py', *TINY, '--eval_interval=4', '--max_iters=20']
    keep = "shutil.copy('{out}/ckpt.pt', '{out}/../{name}.before'); "
    runs = {'chars': (['--dataset=shakespeare_char', '--block_size=16'], f"os.truncate('{tmp_path}/chars/train.bin', "
                                                                         f"1000)"),
            'recall': ([], f"shutil.rmtree('{tmp_path}/recall')")}
    results = run_forked(*({'argv': [*common, *args, f'--data_dir={tmp_path / name}',
                                     f'--out_dir={tmp_path / name}-out'],
                            'fault': fault(keep.format(out=tmp_path / f'{name}-out', name=name) + code,
                                           'clip_grad_norm_', 7)}  # in iteration 6, after the checkpoint of 4
                           for name, (args, code) in runs.items()))
    then = r"; the last good checkpoint, iteration 4, is kept in \S+/ckpt.pt; restore \S+, or delete it to prepare " \
           r"it again, then go on with --init_from=resume$"
    (rc, out), (rc2, out2) = results
    assert_one_error_line(rc, out, rf"^error: {tmp_path}/chars/train.bin holds 1,000 bytes, [\d,]+ when the run "
                                   rf"began: the data changed during the run{then}")
    assert_one_error_line(rc2, out2, rf"^error: {tmp_path}/recall/train_x.npy is gone \(No such file or directory\): "
                                     rf"the data changed during the run{then}")
    for name in runs:
        assert_nothing_lost(tmp_path / f'{name}-out', (tmp_path / f'{name}.before').read_bytes())


def test_one_run_per_out_dir_a_stale_lock_is_taken_over_and_ctrl_c_is_one_line(rows, tmp_path):
    """A second run on a live run's out_dir is refused, naming its pid (an eval_only run, which only reads, is not);
    the lock of a run killed with SIGKILL is taken over; Ctrl-C is one line saying what is kept, exit code 130, the
    lock released; resumed, the run logs an uninterrupted run's losses."""
    folder, _ = rows
    out = tmp_path / 'out'
    common = ['train.py', *TINY, f'--data_dir={folder / "recall"}', '--dropout=0.1', '--eval_interval=3',
              '--lr_decay_iters=60', f'--out_dir={out}']
    env = {**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONUNBUFFERED': '1'}

    def start(*args):
        return subprocess.Popen([sys.executable, *common, '--max_iters=100000', *args], cwd=ROOT, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def wait_for(proc, pattern):
        seen = ''
        for line in proc.stdout:
            seen += line
            if re.search(pattern, line):
                return seen
        raise AssertionError(f"ended before {pattern!r}:\n{seen[-3000:]}")

    first = start()
    try:
        wait_for(first, r"^iter 4:")  # the checkpoint of iteration 3 is written
        assert (out / 'run.lock').read_text().split()[0] == str(first.pid)
        (rc, second), (rc_eval, evaluated) = run_forked(
            {'argv': [*common, '--max_iters=10']},
            {'argv': [*common, '--max_iters=100000', '--eval_only=True', '--init_from=resume']})
        assert_one_error_line(rc, second, rf"^error: out_dir={out} is in use by another run \(pid {first.pid}; "
                                          rf"{out}/run.lock\); wait for it to end or stop it, or pass another "
                                          rf"--out_dir$")
        assert rc_eval == 0 and re.search(r"^step \d+: train loss", evaluated, re.M), evaluated[-2000:]
    finally:
        first.kill()
        first.wait()
    assert (out / 'run.lock').read_text().split()[0] == str(first.pid)  # stale: its process is gone
    third = start('--init_from=resume')
    try:
        seen = wait_for(third, r"^saving checkpoint")  # it took the stale lock, and wrote a checkpoint
        seen += wait_for(third, r"^iter \d+:")
        assert (out / 'run.lock').read_text().split()[0] == str(third.pid)
        third.send_signal(signal.SIGINT)
        seen += third.communicate(timeout=60)[0]
    finally:
        third.kill()
    last = assert_one_error_line(third.returncode, seen, r"^error: interrupted \(Ctrl-C\); the last good checkpoint, "
                                 rf"iteration (\d+), is kept in {out}/ckpt.pt; go on with --init_from=resume$",
                                 code=130)
    saved = int(re.search(r"iteration (\d+)", last).group(1))
    assert torch.load(out / 'ckpt.pt', weights_only=True)['iter_num'] == saved
    assert_nothing_lost(out, (out / 'ckpt.pt').read_bytes())
    end = saved + 3
    (_, straight), (rc, resumed) = run_forked(
        {'argv': [*common, f'--out_dir={tmp_path / "straight"}', f'--max_iters={end}']},
        {'argv': [*common, '--init_from=resume', f'--max_iters={end}']})
    assert rc == 0 and sorted(iter_losses(resumed)) == list(range(saved, end + 1)), resumed[-2000:]
    assert {n: iter_losses(straight)[n] for n in iter_losses(resumed)} == iter_losses(resumed)
    assert not (out / 'run.lock').exists()


def test_a_signal_as_the_run_exits_is_one_line_too(tmp_path):
    """After the run has ended (RunDir.close at exit: the lock released), a SIGTERM or Ctrl-C still ends in one
    line saying what is kept, with its exit code, not a silent 143."""
    code = ("import os, signal; from support.rundir import RunDir; "
            f"run = RunDir({str(tmp_path / 'out')!r}); run.open(); run.close(); os.kill(os.getpid(), signal.SIGTERM)")
    proc = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 143 and proc.stderr.strip().splitlines()[-1] == (
        "error: interrupted (SIGTERM) as the run was exiting; this run wrote no checkpoint yet"), proc.stderr
