"""Every script a user runs refuses bad input as train.py does: one `error:` line, last, that names the key and says
what to do, before any checkpoint is opened or data read (the device first: a good checkpoint is never called
corrupt because the device is missing); a write that fails ends in one line that says what was kept, with no
temporary file left; merge_lora.py never overwrites its input. One batch of forked runs (tests/faults.py) for all the
bad inputs: milliseconds each."""
import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch

from conftest import ROOT, TEXT_RUN, run_forked

SMALL = ['--seq_lens=32', '--n_embd=16', '--n_head=2', '--n_layer=1', '--repeats=1', '--device=cpu', '--dtype=float32']
ROLLING = ['--tasks=text_rolling', '--text_source={d}/input.txt', '--device=cpu']
# (script, arguments, the last line's pattern); {d}: the fixture's folder, B: its text run, P: its pixel run
CASES = [
    ('sample.py', ['--out_dir=B', '--device=gpu'], r"device='gpu' is not a device; pass --device=cpu"),
    ('sample.py', ['--out_dir=B', '--dtype=float64'], r"dtype must be .* got 'float64'; pass --dtype=float32"),
    ('sample.py', ['--out_dir=B', '--top_k=-1'], r"top_k=-1 must not be negative; pass --top_k=0"),
    ('sample.py', ['--out_dir=B', '--temperature=-1'], r"temperature=-1.0 must not be negative.*pass --temperature"),
    ('sample.py', ['--out_dir=B', '--max_new_tokens=-5'], r"max_new_tokens=-5 must not be negative"),
    ('sample.py', ['--out_dir=B', '--num_samples=0'], r"num_samples=0 must be at least 1; pass --num_samples=1"),
    ('sample.py', ['--out_dir=P', '--batch_size=0'], r"batch_size=0 must be at least 1; pass --batch_size=1"),
    ('sample.py', ['--out_dir=P', '--num_samples=-2'], r"num_samples=-2 must be at least 1"),
    ('sample.py', ['--out_dir=P', '--png={d}/missing/x.png'], r"png=.*missing/x.png: its folder .* does not exist"),
    ('sample.py', ['--out_dir=P', '--png={d}/grid.jpg'], r"png=.*grid.jpg must end in .png"),
    ('sample.py', ['--out_dir=P', '--png={d}'], r"png=.* is a folder; pass --png=PATH"),
    ('sample.py', ['--out_dir=P', '--num_samples=100', '--batch_size=50', '--complete=True'],
     r"num_samples=100 with complete=True .* holds 5; pass --num_samples=5 or fewer"),
    ('sample.py', ['--out_dir=P', '--data_dir={d}/nowhere'], r"data_dir=.*nowhere is not a folder; pass --data_dir"),
    ('bench.py', [*SMALL, '--device=gpu'], r"device='gpu' is not a device"),
    ('bench.py', [*SMALL, '--seq_lens=32,abc'], r"seq_lens='32,abc' must be comma-separated whole numbers"),
    ('bench.py', [*SMALL, '--seq_lens=0'], r"seq_lens='0' must be .* each at least 1; pass e.g. --seq_lens="),
    ('bench.py', [*SMALL, '--seq_lens='], r"seq_lens='' must be comma-separated"),
    ('bench.py', [*SMALL, '--seq_lens=32,32'], r"seq_lens=32,32 gives 32 more than once; pass each once: "
     r"--seq_lens=32$"),
    ('bench.py', [*SMALL, '--batch_size=0'], r"batch_size=0 must be at least 1"),
    ('bench.py', [*SMALL, '--repeats=0'], r"repeats=0 must be at least 1"),
    ('bench.py', [*SMALL, '--n_head=3'], r"n_embd=16 must be a multiple of n_head=3"),
    ('bench.py', [*SMALL, '--n_embd=0'], r"n_embd=0 must be at least 1"),
    ('bench.py', [*SMALL, '--mode=model', '--n_layer=0'], r"n_layer=0 must be at least 1"),
    ('bench.py', [*SMALL, '--dtype=float64'], r"dtype must be .* got 'float64'"),
    ('bench.py', [*SMALL, '--mode=generate', '--decode_tokens=0'], r"decode_tokens=0 must be at least 1"),
    ('bench.py', [*SMALL, '--mode=generate', '--vocab_size=0'], r"vocab_size=0 must be at least 1"),
    ('bench.py', [*SMALL, '--mode=pixels', '--subpixels=1'], r"subpixels=1 must be at least 2"),
    ('bench.py', [*SMALL, '--attention=nope'], r"unknown attention 'nope'"),
    # each baseline's keys, out of range, before any work (their full lists: tests/test_<rule>.py)
    ('bench.py', [*SMALL, '--attention=topk', '--topk_k=0'], r"topk_k must be >= 1"),
    ('bench.py', [*SMALL, '--attention=longformer', '--longformer_window=0'], r"longformer_window must be"),
    ('bench.py', [*SMALL, '--attention=routing', '--routing_decay=1.5'], r"routing_decay must be"),
    ('bench.py', [*SMALL, '--attention=linear', '--linear_eps=1e999'],
     r"linear_eps must be a finite number, got inf in --linear_eps; pass e\.g\. --linear_eps=1e-06"),
    ('bench.py', [*SMALL, '--attention=gated,entmax', '--entmax_alpha=1'], r"entmax_alpha must be a finite number > 1"),
    ('bench.py', [*SMALL, '--attention=rela', '--rela_eps=-1'], r"rela_eps must be a finite number > 0"),
    ('bench.py', [*SMALL, '--attention=diff', '--n_head=1'], r"n_head"),
    ('bench.py', [*SMALL, '--attention=ssmax', '--ssmax_s=0'], r"ssmax_s must be"),
    ('bench.py', [*SMALL, '--attention=dex', '--dex_lambda=1'], r"dex_lambda must be"),
    ('bench.py', [*SMALL, '--attention=lsa'], r"attention='lsa' .* has no causal form .*use it in a ViT"),
    ('bench.py', [*SMALL, '--attention=linear', '--flex=True'], r"attention='linear' .* has no flex path; pass --flex=False"),
    ('bench.py', [*SMALL, '--mode=xyz'], r"mode must be one of attention, model, pace, generate, pixels; got 'xyz'"),
    ('studies/extrapolate.py', ['--out_dir=B', '--multiples=1,x'], r"multiples='1,x' must be comma-separated"),
    ('studies/extrapolate.py', ['--out_dir=B', '--multiples=0'], r"multiples='0' must be .* at least 1"),
    ('studies/extrapolate.py', ['--out_dir=B', '--num_tokens=0'], r"num_tokens=0 must be at least 1"),
    ('studies/extrapolate.py', ['--out_dir=B', '--rope_scaling=yarn'], r"rope_scaling must be '', 'none', 'linear' or"),
    ('studies/extrapolate.py', ['--out_dir=B', '--rope_factor=-1'], r"rope_factor=-1.0 must not be negative"),
    ('studies/extrapolate.py', ['--out_dir=B', '--rope_scaling=ntk', '--rope_factor=4'],
     r"pos_emb='learned': learned absolute positions cannot be scaled"),
    ('studies/extrapolate.py', ['--out_dir=B', '--batch_size=0'], r"batch_size=0 must be at least 1"),
    ('studies/extrapolate.py', ['--out_dir=B', '--num_examples=0'], r"num_examples=0 must be at least 1"),
    ('studies/extrapolate.py', ['--out_dir=B', '--dtype=float64'], r"dtype must be .* got 'float64'"),
    ('studies/extrapolate.py', ['--out_dir=B', '--data_dir={d}/nowhere'], r"data_dir=.*nowhere is not a folder"),
    ('studies/extrapolate.py', ['--out_dir='], r"out_dir is empty; pass --out_dir=DIR"),
    ('studies/harness.py', ['--out_dir=B', *ROLLING, '--bootstrap_iters=-1'], r"bootstrap_iters=-1 must not be negative"),
    ('studies/harness.py', ['--out_dir=B', *ROLLING, '--batch_size=0'], r"batch_size=0 must be at least 1"),
    ('studies/harness.py', ['--out_dir=B', *ROLLING, '--limit=-1'], r"limit=-1 must not be negative"),
    ('studies/harness.py', ['--out_dir=B', *ROLLING, '--dtype=float64'], r"dtype must be .* got 'float64'"),
    ('studies/harness.py', ['--out_dir=B', '--device=cpu', '--tasks=,'], r"tasks is empty; pass e.g. --tasks="),
    ('studies/analyze.py', ['--out_dir=B', '--batch_size=0'], r"batch_size=0 must be at least 1"),
    ('studies/analyze.py', ['--out_dir=B', '--example=-1'], r"example=-1 must not be negative"),
    ('studies/analyze.py', ['--out_dir=B', '--example=9', '--batch_size=2'], r"example=9 must be below batch_size=2"),
    ('studies/analyze.py', ['--out_dir=,'], r"out_dir is empty; pass --out_dir=DIR"),
    ('studies/analyze.py', ['--out_dir={d}/nowhere'], r"none of the 1 out_dir\(s\) could be analysed"),
    ('studies/analyze.py', ['--out_dir=B', '--json_path={d}/missing/a.json'], r"json_path=.*: its folder .* does not exist"),
    ('studies/analyze.py', ['--out_dir=B', '--json_path={d}'], r"json_path=.* is a folder"),
    ('studies/analyze.py', ['--out_dir=B', '--data_dir={d}/nowhere'], r"data_dir=.*nowhere is not a folder"),
    ('studies/analyze.py', ['--out_dir=B', '--plots={d}/input.txt'], r"plots=.*input.txt is a file, not a folder"),
    ('studies/ablate.py', ['--out_root={d}/abl', '--rows=softmax,nope'], r"rows: unknown name\(s\) nope; pass e.g."),
    ('studies/ablate.py', ['--out_root={d}/abl', '--rules=softmax'], r"unknown key 'rules' in --rules; valid keys: .* rows, "),
    ('studies/ablate.py', ['--out_root={d}/abl', '--systems=recall,nope'], r"systems: unknown name\(s\) nope; pass e"),
    ('studies/ablate.py', ['--out_root={d}/abl', '--systems='], r"systems: none picked; pass e.g. --systems=recall,"),
    ('studies/ablate.py', ['--out_root={d}/abl', '--budget=huge'], r"budget='huge' is not a budget; pass --budget=tiny"),
    ('studies/ablate.py', ['--out_root={d}/abl', '--seeds=1,x'], r"seeds='1,x' must be comma-separated"),
    ('studies/ablate.py', ['--out_root={d}/abl', '--seeds='], r"seeds='' must be comma-separated"),
    ('studies/ablate.py', ['--out_root={d}/abl', '--recipe="--device=cpu'], r"recipe does not parse .* balanced quotes"),
    ('studies/ablate.py', ['--out_root={d}/abl', '--cifar_source={d}/nowhere'], r"cifar_source=.*nowhere does not exist"),
    ('studies/ablate.py', ['--out_root={d}/input.txt'], r"out_root=.*input.txt is a file, not a folder"),
    ('studies/ablate.py', ['--out_root={d}/abl', '--nproc_per_node=0'], r"nproc_per_node=0 is not a process count"),
    ('studies/ablate.py', ['--out_root={d}/abl', '--gpu=V100'], r"gpu='V100' has no peak FLOP/s here; pass --gpu="),
    ('studies/ablate.py', ['--out_root={d}/abl', '--mfu=0'], r"mfu=0.0 is not a fraction of the peak; pass e.g."),
    ('studies/ablate.py', ['--out_root={d}/abl', '--cells_at_once=2'], r"cells_at_once=2 runs side by side on GPUs, "
     r"and this machine has none; pass --cells_at_once=1, or --cells_on_cpu=True"),
    ('studies/ablate.py', ['--out_root={d}/abl', '--launcher=mpi'], r"launcher='mpi' is not a launcher; pass --launc"),
    ('studies/ablate.py', ['--out_root={d}/abl', '--partition=gpu'], r"partition is a SLURM job's setting and "
     r"launcher=local; pass --launcher=slurm, or leave --partition out"),
    ('studies/ablate.py', ['--out_root={d}/abl', '--launcher=submitit_local', '--nodes=2'], r"nodes is a SLURM job's "
     r"setting and launcher=submitit_local; pass --launcher=slurm"),
    ('studies/ablate.py', ['--out_root={d}/abl', '--launcher=slurm'], r"launcher=slurm submits with sbatch, and this "
     r"machine has none; run on a SLURM cluster's login node"),
    ('studies/ablate.py', ['--out_root={d}/abl', '--launcher=submitit_local', '--cells_at_once=2',
                           '--cells_on_cpu=True'], r"cells_at_once=2 is the local launcher's setting; "
     r"launcher=submitit_local makes each run a job, .* leave --cells_at_once out, or pass --launcher=local$"),
    ('studies/cluster_swap.py', ['--out_dir=B', '--cluster_ms=4,16,4'], r"cluster_ms=4,16,4 gives 4 more than once; "
     r"pass each once: --cluster_ms=4,16$"),
    ('studies/cluster_swap.py', ['--out_dir=B', '--cluster_chunk=0'], r"cluster_chunk=0 must be at least 1"),
    ('studies/cluster_swap.py', ['--out_dir=B', '--cluster_ms=4,x'], r"cluster_ms='4,x' must be comma-separated"),
    ('studies/cluster_swap.py', ['--out_dir=B', '--cluster_ms=0'], r"cluster_ms='0' must be .* at least 1"),
    ('studies/cluster_swap.py', ['--out_dir=B', '--eval_iters=0'], r"eval_iters=0 must be at least 1"),
    ('studies/cluster_swap.py', ['--out_dir=B', '--kmeans_batches=0'], r"kmeans_batches=0 must be at least 1"),
    ('studies/cluster_swap.py', ['--out_dir=B', '--kmeans_iters=-1'], r"kmeans_iters=-1 must not be negative"),
    ('studies/cluster_swap.py', ['--out_dir=B', '--cluster_sharpness=0'], r"cluster_sharpness=0.0 must be positive"),
    ('studies/cluster_swap.py', ['--out_dir=B', '--data_dir={d}/nowhere'], r"data_dir=.*nowhere is not a folder"),
    ('studies/merge_lora.py', ['--ckpt={d}/base', '--out={d}/merged.pt'], r"ckpt=.*base is not a file; pass --ckpt"),
    ('studies/merge_lora.py', ['--ckpt={d}/lora/ckpt.pt', '--out={d}/lora'], r"out=.*lora is a folder; pass --out="),
    ('studies/export.py', ['--out_dir={d}/nowhere', '--hub_dir={d}/hub'], r"out_dir=.*nowhere holds no checkpoint "
     r"\(.*nowhere/ckpt.pt\); pass --out_dir=DIR of a run of train.py"),
    ('studies/export.py', ['--out_dir=B'], r"hub_dir is empty; pass --hub_dir=DIR, a new folder for the export"),
    ('studies/export.py', ['--out_dir=B', '--hub_dir={d}/input.txt'], r"hub_dir=.*input.txt is a file; pass --hub_d"),
    ('studies/export.py', ['--out_dir=B', '--hub_dir=B'], r"hub_dir=.*base already holds .*ckpt.pt.*: the export would "
     r"replace what is there; pass --hub_dir=A_NEW_FOLDER, or delete .*base first"),
    ('studies/export.py', ['--out_dir=B', '--hub=x'], r"unknown key 'hub' in --hub; did you mean 'hub_dir'\?"),
    ('studies/export.py', ['--out_dir=B', '--hub_dir={d}/hub'], r"ckpt.pt reads character tokens \(shakespeare_char\), "
     r"and GPT-2's tokenizer makes GPT-2 BPE ones: train on GPT-2 BPE text \(--dataset=shakespeare"),
]
if shutil.which('sbatch'):  # a SLURM login node: there --launcher=slurm submits jobs instead of refusing
    CASES = [case for case in CASES if '--launcher=slurm' not in case[1]]
DEVICE_SCRIPTS = ['sample.py', 'bench.py', 'studies/extrapolate.py', 'studies/harness.py', 'studies/analyze.py']


def spelled(arg, d):
    return arg.replace('{d}', str(d)).replace('=B', f'={d / "base"}').replace('=P', f'={d / "pixels"}')


@pytest.fixture(scope='module')
def runs(trained_runs):
    """conftest's trained runs: a character GPT (base), a LoRA fine-tune of it (lora), a pixel GPT on 4x4 CIFAR-like
    images (pixels), and the character model's text (input.txt). The folder."""
    d, results = trained_runs
    assert all(rc == 0 for rc, _ in results.values()), [out[-2000:] for rc, out in results.values() if rc]
    return d


@pytest.fixture(scope='module')
def bad_inputs(runs):
    """{case index: (exit code, output)} of every case in CASES, one forked run each."""
    d = runs
    results = run_forked(*({'argv': [script, *(spelled(a, d) for a in args)]} for script, args, _ in CASES))
    return dict(enumerate(results))


def last_line(out):
    return out.strip().splitlines()[-1] if out.strip() else ''


@pytest.mark.parametrize('i', range(len(CASES)), ids=[f"{s}:{' '.join(a)[:70]}" for s, a, _ in CASES])
def test_a_bad_input_is_one_error_line_naming_its_key(bad_inputs, i):
    """The last line is `error:` and names the key (each pattern names it) and what to pass; no traceback."""
    script, args, pattern = CASES[i]
    rc, out = bad_inputs[i]
    assert rc == 1 and 'Traceback' not in out, out[-3000:]
    assert last_line(out).startswith('error: ') and re.search(pattern, last_line(out)), last_line(out)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_a_missing_device_is_named_before_any_checkpoint_is_opened(runs):
    """--device=cuda on a CPU-only machine: the device is not available, not the checkpoint 'corrupt: delete it'."""
    d = runs
    extra = {'bench.py': SMALL[:-2], 'studies/harness.py': [spelled(a, d) for a in ROLLING[:-1]]}
    results = run_forked(*({'argv': [script, f'--out_dir={d / "base"}', *extra.get(script, []), '--device=cuda']}
                           for script in DEVICE_SCRIPTS if script != 'bench.py'),
                         {'argv': ['bench.py', *extra['bench.py'], '--device=cuda']})
    for script, (rc, out) in zip([s for s in DEVICE_SCRIPTS if s != 'bench.py'] + ['bench.py'], results):
        assert rc == 1 and 'Traceback' not in out, (script, out[-2000:])
        assert last_line(out) == "error: device='cuda' is not available on this machine; pass --device=cpu", script
        assert 'delete' not in out and 'corrupt' not in out, (script, out[-2000:])


def test_a_failed_write_is_one_line_and_leaves_no_temporary_file(runs, tmp_path):
    """sample.py's PNG and analyze.py's JSON on a full disk (their temporary file a link to /dev/full): one line that
    says what was kept and what to do; no temporary file, no half-written file."""
    if not os.path.exists('/dev/full'):
        pytest.skip("no /dev/full on this machine")
    d = runs
    png, analysis = tmp_path / 'grid.png', tmp_path / 'a.json'
    for path in (png, analysis):
        os.symlink('/dev/full', f'{path}.tmp')
    (rc_s, out_s), (rc_a, out_a) = run_forked(
        {'argv': ['sample.py', f'--out_dir={d / "pixels"}', '--num_samples=2', '--batch_size=2', f'--png={png}']},
        {'argv': ['studies/analyze.py', f'--out_dir={d / "base"}', f'--json_path={analysis}', '--batch_size=2']})
    assert rc_s == 1 and 'Traceback' not in out_s, out_s[-2000:]
    assert last_line(out_s) == (f"error: cannot write {png} (No space left on device); nothing was written, and the 2 "
                                f"images drawn are not kept; pass --png=PATH.png in a folder you can write to, and "
                                f"run again")
    assert rc_a == 1 and 'Traceback' not in out_a, out_a[-2000:]
    assert last_line(out_a) == (f"error: cannot write {analysis} (No space left on device); the tables printed above "
                                f"are all that was kept; pass --json_path=PATH in a folder you can write to (or free "
                                f"space there) and run again")
    assert '== ' in out_a  # the tables were printed before
    assert sorted(os.listdir(tmp_path)) == []  # no temporary file (nor its link), no half-written file


def test_merge_lora_never_overwrites_its_input(runs, tmp_path):
    """--out naming --ckpt, however spelled (the same path, through .., through a link): refused before anything is
    read, the checkpoint byte-identical after; a real --out still works."""
    d = runs
    run = tmp_path / 'run'
    run.mkdir()
    ckpt = Path(shutil.copy(d / 'lora' / 'ckpt.pt', run))
    before = hashlib.sha256(ckpt.read_bytes()).hexdigest()
    os.symlink(run, tmp_path / 'link')
    spellings = [ckpt, run / '..' / 'run' / '.' / 'ckpt.pt', tmp_path / 'link' / 'ckpt.pt',
                 os.path.relpath(ckpt, ROOT)]
    results = run_forked(*({'argv': ['studies/merge_lora.py', f'--ckpt={ckpt}', f'--out={out}']} for out in spellings),
                         {'argv': ['studies/merge_lora.py', f'--ckpt={ckpt}', f'--out={run / "merged.pt"}']})
    for out_path, (rc, out) in zip(spellings, results):
        assert rc == 1 and 'Traceback' not in out, out[-2000:]
        assert last_line(out).startswith(f"error: out={out_path} is the input checkpoint {ckpt}: merging there would "
                                         f"overwrite it"), last_line(out)
    assert hashlib.sha256(ckpt.read_bytes()).hexdigest() == before
    rc, out = results[-1]
    assert rc == 0 and (run / 'merged.pt').is_file(), out[-2000:]
    assert hashlib.sha256(ckpt.read_bytes()).hexdigest() == before


# bad inputs whose line named the wrong thing or came late, each refused before any work; {d}: the fixture's folder
# (its bad files written by bad_files), N: a folder no run may make; a data_dir or out_dir there is never created
HELLASWAG_SCHEMA = r"lacks ctx, ctx_a, ctx_b, activity_label, endings, label \(its fields: text\)"
LATE_CASES = [
    ('train.py', ['--dataset=shakespeare', '--hellaswag=True', '--hellaswag_source={d}/fineweb.jsonl',
                  '--data_dir=N/data', '--out_dir=N/out', '--device=cpu'],
     r"--hellaswag_source=\S+fineweb.jsonl, line 1, lacks ctx, endings, label \(its fields: text\); pass "
     r"--hellaswag_source=PATH of HellaSwag's hellaswag_val.jsonl"),
    ('studies/cluster_swap.py', ['--out_dir=B', '--cluster_ms=4,100000'], r"cluster_ms=4,100000: m=100000 is more "
     r"than the 2,560 keys per head .*batch_size 4 x block_size 32\); pass --cluster_ms with each m at most 2560"),
    ('studies/ablate.py', ['--out_root=N/abl', '--seeds=1337,1337'],
     r"seeds=1337,1337 gives 1337 more than once; pass each once: --seeds=1337$"),
    ('studies/ablate.py', ['--out_root=N/abl', '--rows=softmax,softmax'],
     r"rows=softmax,softmax gives softmax more than once; pass each once: --rows=softmax$"),
    ('train.py', ['--nproc_per_node=0', '--data_dir=N/data', '--out_dir=N/out'],
     r"nproc_per_node=0 must be at least 1; pass --nproc_per_node=1 or more$"),
    ('train.py', ['--max_iters=-1', '--data_dir=N/data', '--out_dir=N/out'],
     r"max_iters=-1 trains no iteration, so the run would write no checkpoint; pass --max_iters=1 or more$"),
    ('train.py', ['--init_from={d}/hub_heads', '--dataset=shakespeare', '--data_dir=N/data', '--out_dir=N/out'],
     r"hub_heads/config.json has n_embd=32, n_head=3: 32 cannot be split into 3 heads; set its n_head to the one the "
     r"weights were trained with, which divides 32 \(1, 2, 4, 8, 16, 32\), or pass another --init_from$"),
    ('train.py', ['--dataset=shakespeare_char', '--data_source={d}/binary.bin', '--data_dir=N/data', '--out_dir=N/out'],
     r"--data_source=\S+binary.bin is not UTF-8 text \(byte 0: invalid start byte\); give the path of "
     r"tiny-shakespeare's"),
    ('train.py', ['--data_dir={d}/input.txt', '--out_dir=N/out'],
     r"data_dir=\S+input.txt is a file, not a folder; pass --data_dir=DIR of a folder \(made if missing\)"),
    ('train.py', ['--dataset=shakespeare_char', '--data_source={d}/input.txt', '--data_dir={d}/input.txt/chars',
                  '--out_dir=N/out'], r"data_dir=\S+input.txt/chars would be made in \S+input.txt, which is a file"),
    ('prepare/recall.py', ['--data_dir={d}/input.txt'], r"data_dir=\S+input.txt is a file, not a folder"),
    ('train.py', ['--dataset=fineweb_edu', '--data_source={d}/mixed', '--data_dir=N/data', '--out_dir=N/out'],
     r"--data_source=\S+mixed mixes formats \(1 .jsonl, 1 .parquet files\), and a folder is read by one loader; "
     r"pass --data_source=PATH of one of its files, or of a folder of one format$"),
    ('prepare/shakespeare_char.py', ['--source={d}/chars', '--data_dir=N/data'],
     r"--source=\S+chars is a folder, not a file; give the path of tiny-shakespeare's input.txt"),
    ('studies/harness.py', ['--out_dir=B', '--device=cpu', '--tasks=hellaswag_nanogpt',
                            '--hellaswag_source={d}/fineweb.jsonl'], rf"fineweb.jsonl, line 1, {HELLASWAG_SCHEMA}"),
    ('studies/harness.py', ['--out_dir=B', '--device=cpu', '--tasks=hellaswag_local',
                            '--hellaswag_source={d}/fineweb.jsonl'], rf"fineweb.jsonl, line 1, {HELLASWAG_SCHEMA}"),
    ('studies/harness.py', ['--out_dir=B', '--device=cpu', '--tasks=text_rolling', '--text_source={d}/empty.txt'],
     r"--text_source=\S+empty.txt is empty; pass --text_source=PATH of a text file, or of a jsonl with a `text`"),
    ('studies/harness.py', ['--out_dir=B', '--device=cpu', '--tasks=text_rolling',
                            '--text_source={d}/no_text.jsonl'], r"no_text.jsonl holds no text"),
    ('studies/harness.py', ['--out_dir=B', '--device=cpu', '--tasks=quality_scrolls',
                            '--scrolls_source={d}/fineweb.jsonl'], r"fineweb.jsonl, line 1, lacks id, input, output"),
    ('train.py', ['--krause_mix=True', '--data_dir=N/data', '--out_dir=N/out'],
     r"unknown key 'krause_mix' in --krause_mix; did you mean 'mix'\?$"),
    ('bench.py', [*SMALL, '--image_tokens=3072'], r"unknown key 'image_tokens' in --image_tokens; did you mean "
                                                  r"'subpixels'\?$"),
]


@pytest.fixture(scope='module')
def bad_files(runs):
    """The fixture's folder with the files LATE_CASES read: FineWeb-like rows as HellaSwag, SCROLLS and text, a
    binary file, an empty one, a folder of two formats, a Hub-layout config whose heads do not divide its width."""
    d = runs
    (d / 'fineweb.jsonl').write_text(''.join(json.dumps({'text': f"document {i}"}) + '\n' for i in range(3)))
    (d / 'no_text.jsonl').write_text(json.dumps({'text': ' '}) + '\n')
    (d / 'binary.bin').write_bytes(bytes([0xff, 0xfe, 0, 1]) * 64)
    (d / 'empty.txt').write_text('')
    (d / 'mixed').mkdir()
    (d / 'mixed' / 'a.parquet').write_bytes(b'')
    (d / 'mixed' / 'b.jsonl').write_text('')
    (d / 'hub_heads').mkdir()
    (d / 'hub_heads' / 'config.json').write_text(json.dumps(dict(model_type='gpt2', n_embd=32, n_head=3, n_layer=1,
                                                                 n_positions=16, vocab_size=50257)))
    from safetensors.torch import save_file
    save_file({'wte.weight': torch.zeros(1)}, str(d / 'hub_heads' / 'model.safetensors'))  # the heads are refused first
    return d


@pytest.fixture(scope='module')
def late_inputs(bad_files):
    d = bad_files
    spell = lambda a: spelled(a, d).replace('=N/', f'={d / "never"}/')
    return dict(enumerate(run_forked(*({'argv': [script, *map(spell, args)]} for script, args, _ in LATE_CASES))))


@pytest.mark.parametrize('i', range(len(LATE_CASES)), ids=[f"{s}:{' '.join(a)[:70]}" for s, a, _ in LATE_CASES])
def test_a_late_bad_input_is_one_error_line_before_any_work(late_inputs, bad_files, i):
    """The last line is `error:`, names the key or the file and what to pass; no traceback, nothing made."""
    rc, out = late_inputs[i]
    assert rc == 1 and 'Traceback' not in out, out[-3000:]
    assert last_line(out).startswith('error: ') and re.search(LATE_CASES[i][2], last_line(out)), last_line(out)
    assert not (bad_files / 'never').exists()


def test_sigterm_stops_a_run_as_ctrl_c_does(runs, tmp_path):
    """SIGTERM mid-run (kill, a scheduler's stop): one line saying what is kept and how to go on, exit code 143, the
    lock released; from a checkpoint, as Ctrl-C."""
    d = runs
    train = ['train.py', *TEXT_RUN, f'--data_dir={d / "chars"}', '--max_iters=4', '--eval_interval=2']
    sigterm = ['', 'clip_grad_norm_', 3, "os.kill(os.getpid(), signal.SIGTERM)"]  # in iteration 2, after a save
    (rc, out), = run_forked({'argv': [*train, f'--out_dir={tmp_path}'], 'fault': sigterm})
    assert rc == 143 and 'Traceback' not in out, out[-3000:]
    assert re.search(r"^error: interrupted \(SIGTERM\); the last good checkpoint, iteration 2, is kept in \S+; go on "
                     r"with --init_from=resume", last_line(out)), last_line(out)
    assert not (tmp_path / 'run.lock').exists()
