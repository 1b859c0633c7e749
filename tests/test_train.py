"""train.py end to end, as a user runs it: learning, exact resume, DDP equivalence, and clear errors."""
import re

import pytest
import torch

from conftest import ROOT, SHARED, iter_losses, needs_shared, run_forked, run_script

TINY = ['--n_layer=1', '--n_head=2', '--n_embd=32', '--batch_size=16', '--eval_iters=2', '--log_interval=1',
        '--warmup_iters=2', '--compile=False', '--device=cpu']


def eval_lines(log):
    return re.findall(r"^step (\d+): train loss ([\d.]+), val loss ([\d.]+)", log, re.M)


@pytest.fixture(scope='module')
def recall_dir(tmp_path_factory):
    return tmp_path_factory.mktemp('recall')


@pytest.fixture(scope='module')
def text_dir(tmp_path_factory):
    """A small character-level corpus prepared through prepare/shakespeare_char.py's --source path."""
    folder = tmp_path_factory.mktemp('chars')
    source = folder / 'input.txt'
    source.write_text(''.join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(400)))
    return folder / 'data', source


def test_recall_loss_goes_down(recall_dir, tmp_path):
    log = run_script('train.py', *TINY, f'--data_dir={recall_dir}', f'--out_dir={tmp_path}', '--max_iters=30',
                     '--eval_interval=30', '--learning_rate=3e-3')
    losses = iter_losses(log)
    assert losses[0] > 3.0                    # about ln(32): chance over the 32 tokens
    assert losses[30] < losses[0] - 0.5
    assert re.search(r"^step 30: .* val acc [\d.]+$", log, re.M)   # the task has an accuracy, the last step is evaluated
    assert (tmp_path / 'ckpt.pt').exists()


@pytest.mark.parametrize('kind', ['recall', 'text'])
def test_resume_continues_exactly(kind, recall_dir, text_dir, tmp_path):
    if kind == 'recall':
        data = [f'--data_dir={recall_dir}']
    else:
        data = ['--dataset=shakespeare_char', f'--data_dir={text_dir[0]}', f'--data_source={text_dir[1]}',
                '--block_size=16']
    common = [*TINY, *data, '--dropout=0.1', '--eval_interval=5', '--max_iters=12', '--lr_decay_iters=12']
    straight = iter_losses(run_script('train.py', *common, f'--out_dir={tmp_path / "a"}'))
    run_script('train.py', *common, f'--out_dir={tmp_path / "b"}', '--max_iters=6')
    resumed = iter_losses(run_script('train.py', *common, f'--out_dir={tmp_path / "b"}', '--init_from=resume'))
    assert min(resumed) == 6 and max(resumed) == 12
    assert {i: straight[i] for i in resumed} == resumed


DDP = [*TINY, '--max_iters=6', '--eval_interval=6', '--eval_iters=4', '--learning_rate=3e-3']


def mfu_wrapper(folder):
    """train.py as a script that also prints each logged MFU computed at dt = 1 s, with a peak set (a CPU has none)."""
    wrapper = folder / 'mfu_at_one_second.py'
    wrapper.write_text(
        "import runpy, sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "import model, support.runtime\n"
        "support.runtime.peak_flops = lambda device: 1e12\n"
        "estimate = model.GPT.estimate_mfu\n"
        "def logged(self, fwdbwd_per_iter, dt, peak):\n"
        "    print(f'mfu at 1 s: {estimate(self, fwdbwd_per_iter, 1.0, peak):.6e}')\n"
        "    return estimate(self, fwdbwd_per_iter, dt, peak)\n"
        "model.GPT.estimate_mfu = logged\n"
        f"sys.argv = ['train.py', *sys.argv[1:]]\n"
        f"runpy.run_path({str(ROOT / 'train.py')!r}, run_name='__main__')\n")
    return wrapper


@pytest.fixture(scope='module')
def two_processes(recall_dir, tmp_path_factory):
    """One run of 2 gloo processes (forked as torchrun starts them), read by the DDP and the MFU tests: train.py
    through mfu_wrapper (its training untouched), a global accumulation of 2 micro-batches: one per process."""
    folder = tmp_path_factory.mktemp('ddp')
    return run_script(mfu_wrapper(folder), *DDP, f'--data_dir={recall_dir}', '--gradient_accumulation_steps=2',
                      f'--out_dir={folder / "two"}', ddp=2)


def test_ddp_two_processes_equal_one(recall_dir, two_processes, tmp_path):
    one = run_script('train.py', *DDP, f'--data_dir={recall_dir}', '--gradient_accumulation_steps=2',
                     f'--out_dir={tmp_path / "one"}')
    a, b = eval_lines(one), eval_lines(two_processes)
    assert [n for n, *_ in a] == ['0', '6'] and [n for n, *_ in b] == ['0', '6']
    for (_, *x), (_, *y) in zip(a, b):
        assert [float(v) for v in x] == pytest.approx([float(v) for v in y], abs=2e-4)
    assert float(a[1][2]) < float(a[0][2]) - 0.1  # it trained


def test_torchrun_says_an_error_once_first(tmp_path):
    """Under torchrun a bad key, which every process meets, is said once, by rank 0, before torchrun's own report,
    whose root cause names it; the other process says nothing, and torchrun ends it."""
    said = "error: unknown key 'bad_key' in --bad_key; valid keys: "
    out = run_script('train.py', '--bad_key=1', f'--out_dir={tmp_path / "out"}', check=False,
                     launcher=('torchrun', '--standalone', '--nproc_per_node=2'))
    ours = [line for line in out.splitlines() if not re.match(r'[WEI]\d{4} \d\d:\d\d', line)]  # not torchrun's logs
    ours = [line for line in ours if not line.startswith(('Overriding', 'tokens per iteration'))]
    assert ours[0].startswith(said), out
    assert [line for line in out.splitlines() if line.startswith('error:')] == [ours[0]]
    assert ours[1] == 'Traceback (most recent call last):' and 'rank1' not in out  # torchrun's, not a process's
    assert re.search(r"(?m)^Root Cause \(first observed failure\):\n\[0\]:\n(  .*\n)*  rank      : 0 .*\n(  .*\n)*"
                     rf"  traceback : {re.escape(ours[0])}$", out), out


def test_nproc_per_node_checks_first_and_says_a_process_error_last(tmp_path):
    """train.py --nproc_per_node=2: a setting two processes cannot run is said before torchrun starts any; an error a
    process meets (rank 0, a folder of another dataset, while rank 1 waits for it) is said once, as the last line,
    after torchrun's report, whose root cause names it; the other process says nothing; the exit code is torchrun's."""
    (code, out), = run_forked({'argv': ['train.py', *TINY, '--nproc_per_node=2', '--gradient_accumulation_steps=3',
                                        f'--out_dir={tmp_path / "a"}']})
    assert code == 1 and out.strip().splitlines()[-1] == ("error: gradient_accumulation_steps=3 must be a multiple of "
                                                           "the 2 processes; pass a multiple of 2"), out
    assert 'Traceback' not in out  # no torchrun (its report opens with one)
    under_torchrun = {'LOCAL_WORLD_SIZE': '4', 'WORLD_SIZE': '4'}  # a count of its own beside torchrun's: refused
    (code, out), = run_forked({'argv': ['train.py', *TINY, '--nproc_per_node=2', f'--out_dir={tmp_path / "a"}'],
                               'env': under_torchrun})
    said = out.strip().splitlines()[-1]
    assert code == 1 and said == ("error: nproc_per_node=2, but torchrun started 4 processes on this node; under "
                                  "torchrun drop --nproc_per_node (torchrun's own says how many)"), out
    (tmp_path / 'data').mkdir()
    (tmp_path / 'data' / 'meta.json').write_text('{"dataset": "recall", "kind": "examples"}')
    (code, out), = run_forked({'argv': ['train.py', *TINY, '--nproc_per_node=2', '--dataset=shakespeare_char',
                                        f'--data_dir={tmp_path / "data"}', '--gradient_accumulation_steps=2',
                                        f'--out_dir={tmp_path / "b"}']})
    said, lines = f"error: {tmp_path / 'data'} holds the dataset 'recall', not 'shakespeare_char': ", out.splitlines()
    assert code == 1 and lines[-1].startswith(said), out
    assert [line for line in lines if line.startswith('error:')] == [lines[-1]] and 'rank1' not in out
    assert re.search(r"(?m)^Root Cause \(first observed failure\):\n\[0\]:\n(  .*\n)*  rank      : 0 .*\n(  .*\n)*"
                     rf"  traceback : {re.escape(lines[-1])}\n=+\n{re.escape(lines[-1])}$", out), out


def test_a_process_that_alone_meets_an_error_says_it_after_the_wait(tmp_path, monkeypatch):
    """Under torchrun a process other than local rank 0 that is not ended within ERROR_WAIT_S met an error rank 0 did
    not: it says it then, and writes it where torchrun's summary reads a process's root cause."""
    import signal
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
    from support import runtime
    monkeypatch.setenv('TORCHELASTIC_ERROR_FILE', str(tmp_path / 'error.json'))
    monkeypatch.setenv('LOCAL_RANK', '1')
    monkeypatch.setattr(runtime, 'ERROR_WAIT_S', 0)
    handlers = []
    monkeypatch.setattr(signal, 'signal', lambda *args: handlers.append(args))  # not this test process's SIGTERM
    with pytest.raises(SystemExit) as stop:
        runtime.exit_with_error("loss is nan at iteration 7")
    assert stop.value.code == "error: loss is nan at iteration 7"
    assert handlers == [(signal.SIGTERM, signal.SIG_DFL)]
    failure = ProcessFailure(local_rank=1, pid=1, exitcode=1, error_file=str(tmp_path / 'error.json'))
    assert "  traceback : error: loss is nan at iteration 7\n" in ChildFailedError('train.py', {1: failure}).format_msg()


@pytest.mark.parametrize('args,message', [
    (['--nope=1'], "(?m)^error: unknown key 'nope'"),
    (['--n_layr=1'], "did you mean 'n_layer'"),
    (['--batch_size=abc'], "batch_size expects int"),
    (['--attention=nope'], "unknown attention 'nope'; valid: .*softmax"),
    (['--dataset=nope'], "unknown dataset 'nope'; valid:"),
    (['config/does_not_exist.py'], "cannot read config file"),
])
def test_bad_config_is_one_clear_line(args, message, tmp_path):
    log = run_script('train.py', *args, f'--out_dir={tmp_path}', check=False)
    assert re.search(message, log), log[-2000:]
    assert 'Traceback' not in log


def test_an_old_key_is_one_error_line_naming_it(tmp_path):
    """A key an older version had (cluster_block, krause_mix: cluster_chunk and mix today) on the command line or in
    a config file is the configurator's unknown key; in a checkpoint's model_args it is one line naming the keys and
    what to do, before any model is built. No key is read as another: its meaning may have changed with its name."""
    cfg, old = tmp_path / 'old.py', tmp_path / 'old'
    cfg.write_text("attention = 'krause'\nkrause_mix = True\n")  # the Krause paper's LM form, as configs said it
    old.mkdir()
    args = dict(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=11, attention='cluster', cluster_m=4)
    torch.save({'model': {}, 'model_args': {**args, 'cluster_block': 8, 'tda_chunk': 99}, 'iter_num': 1,
                'config': {'dataset': 'recall', 'cluster_block': 8}}, old / 'ckpt.pt')
    before = (old / 'ckpt.pt').read_bytes()
    (rc_flag, flag), (rc_cfg, config), (rc_ckpt, resumed) = run_forked(
        {'argv': ['train.py', '--cluster_block=8', f'--out_dir={tmp_path / "a"}']},
        {'argv': ['train.py', str(cfg), f'--out_dir={tmp_path / "b"}']},
        {'argv': ['train.py', '--init_from=resume', '--device=cpu', f'--data_dir={tmp_path / "data"}',
                  f'--out_dir={old}']})
    assert rc_flag == 1 and flag.strip().splitlines()[-1] == ("error: unknown key 'cluster_block' in "
                                                              "--cluster_block; did you mean 'cluster_chunk'?"), flag
    assert rc_cfg == 1 and config.strip().splitlines()[-1].startswith(f"error: unknown key 'krause_mix' in {cfg}")
    assert 'note:' not in flag + config  # read as no other key
    assert rc_ckpt == 1 and resumed.strip().splitlines()[-1] == (
        f"error: {old / 'ckpt.pt'} was written by an older version, with model key(s) cluster_block, tda_chunk that "
        f"the model no longer has; retrain it, or rename the key(s) in its model_args to today's (python train.py "
        f"--help lists them)"), resumed[-2000:]
    assert 'parameters:' not in resumed  # stopped before a model was built
    assert all('Traceback' not in out for out in (flag, config, resumed))
    assert (old / 'ckpt.pt').read_bytes() == before


def test_help_lists_every_key_with_its_default(tmp_path):
    log = run_script('train.py', '--help', f'--out_dir={tmp_path}')
    assert log.startswith('usage: python train.py')
    # each key's one-line comment beside its default, from train.py's source or the model dataclasses' (attention.py, rules/)
    assert re.search(r"^  --attention=softmax +# a key of rules.ATTENTION$", log, re.M)
    assert re.search(r"^  --window=0 +# softmax: sliding window", log, re.M) and '  --eval_only=False ' in log
    assert 'step 0' not in log and not any(tmp_path.iterdir())


def test_every_config_loads_from_any_directory(tmp_path):
    # all of config/ in one run, from a foreign directory: the configs that exec softmax_vit.py must find it,
    # and every key they set must be one train.py knows; the bad override then stops the run before any work
    configs = sorted((ROOT / 'config').glob('*.py'))
    assert len(configs) >= 8
    log = run_script(ROOT / 'train.py', *configs, '--batch_size=abc', cwd=tmp_path, check=False)
    assert log.count('Overriding config with') == len(configs), log[-2000:]
    assert '\nerror: batch_size expects int' in log and 'Traceback' not in log


def test_bad_checkpoints(recall_dir, tmp_path):
    common = [*TINY, f'--data_dir={recall_dir}', f'--out_dir={tmp_path}', '--max_iters=2', '--eval_interval=2']
    log = run_script('train.py', *common, '--init_from=resume', check=False)
    assert 'no checkpoint at' in log and 'Traceback' not in log
    run_script('train.py', *common)
    log = run_script('train.py', *common, '--init_from=resume', '--n_embd=64', '--max_iters=4', check=False)
    assert 'is from another config: n_embd=32 (this run: 64)' in log and 'Traceback' not in log
    (tmp_path / 'ckpt.pt').write_bytes(b'not a checkpoint')
    log = run_script('train.py', *common, '--init_from=resume', check=False)
    assert 'cannot read checkpoint' in log and 'Traceback' not in log


def test_divergence_stops_and_keeps_the_last_good_checkpoint(recall_dir, tmp_path):
    common = [*TINY, f'--data_dir={recall_dir}', f'--out_dir={tmp_path}', '--eval_interval=4']
    run_script('train.py', *common, '--max_iters=4')
    good = torch.load(tmp_path / 'ckpt.pt', weights_only=True)
    log = run_script('train.py', *common, '--init_from=resume', '--max_iters=40', '--learning_rate=1e12',
                     '--warmup_iters=0', '--decay_lr=False', '--grad_clip=0.0', check=False)
    assert re.search(r"(val )?loss is (nan|inf)", log), log[-2000:]
    kept = torch.load(tmp_path / 'ckpt.pt', weights_only=True)
    assert kept['iter_num'] == good['iter_num']
    assert all(torch.isfinite(p).all() for p in kept['model'].values())


@needs_shared
def test_fineweb_trains_offline_with_hellaswag(tmp_path):
    rows = (SHARED / 'hellaswag' / 'hellaswag_val_1000.jsonl').read_text().splitlines()[:8]
    (tmp_path / 'hs.jsonl').write_text('\n'.join(rows) + '\n')
    log = run_script('train.py', 'config/softmax_fineweb.py', *TINY, '--block_size=32', '--gradient_accumulation_steps=1',
                     f'--data_source={SHARED / "fineweb_edu" / "fineweb_edu_150docs.parquet"}',
                     f'--data_dir={tmp_path / "fw"}', f'--out_dir={tmp_path / "out"}', '--max_iters=20',
                     '--eval_interval=20', '--batch_size=8', '--learning_rate=6e-3',  # 8 x 32 tokens: half the time
                     f'--hellaswag_source={tmp_path / "hs.jsonl"}')
    losses = iter_losses(log)
    assert losses[0] == pytest.approx(10.83, abs=0.1)  # ln(50304): chance at init
    assert losses[20] < losses[0] - 2
    scores = re.findall(r"^hellaswag acc_norm ([\d.]+)$", log, re.M)
    assert len(scores) == 2 and all(float(s) * 8 == round(float(s) * 8) for s in scores)  # k of 8 rows


def test_mfu_counts_each_process_own_work(recall_dir, two_processes, tmp_path):
    """MFU is this process's FLOPs over its time and its GPU's peak: 2 gloo processes with one micro-batch each
    report the MFU of 1 process with one micro-batch (it was world_size times too high: the global accumulation
    count was passed). A CPU has no peak, so the run's peak is set, and each MFU is computed at dt = 1 s."""
    one = run_script(mfu_wrapper(tmp_path), *DDP, f'--data_dir={recall_dir}', '--gradient_accumulation_steps=1',
                     f'--out_dir={tmp_path / "one"}')
    mfu_one, mfu_two = (re.findall(r"^mfu at 1 s: (\S+)$", log, re.M) for log in (one, two_processes))
    assert mfu_one and mfu_one == mfu_two  # iterations 5 and 6 (MFU is logged once the loop has settled)
    assert float(mfu_one[0]) > 0


def test_top_k_zero_samples_from_every_token():
    """sample.py documents --top_k=0 as 'all'; GPT.generate took it as a top-0 cut and raised an IndexError."""
    from model import GPT, GPTConfig
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=11)).eval()
    idx = torch.zeros(2, 1, dtype=torch.long)
    torch.manual_seed(0)
    every = model.generate(idx, 6, top_k=0)
    torch.manual_seed(0)
    assert torch.equal(every, model.generate(idx, 6, top_k=None)) and every.shape == (2, 7)
