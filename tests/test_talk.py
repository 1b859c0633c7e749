"""What a long command says while it works, and where it writes: a GPU-sized config on a CPU says so first, with its
CPU recipe; an evaluation that takes a while shows how far it is; bench.py prints each row as it measures it; a new
run in a folder that holds another says which run it replaces; a path setting's ~ is the home folder. (The lab's
tiny table writing nothing in the checkout: tests/test_lab.py.)"""
import json
import re
import shlex

from conftest import ROOT, run_forked, run_script

TINY = ['--n_layer=1', '--n_head=2', '--n_embd=32', '--batch_size=16', '--eval_iters=2', '--log_interval=1',
        '--warmup_iters=2', '--compile=False', '--device=cpu']
STOP = "import support.pretrained, support.runtime\ndef stop(*args, **kwargs): os._exit(7)\n" \
       "support.pretrained.load_base = support.runtime.init_ddp = stop"  # the first work after the checks
NOTE = re.compile(r"^note: this config is sized for a GPU \((.*)\) and runs on the CPU here, which takes far longer; "
                  r"its CPU recipe: python train.py (.*)$", re.M)


def test_a_gpu_sized_config_on_a_cpu_says_so_with_its_cpu_recipe_which_runs(tmp_path):
    """Each config's cpu_recipe (train.py's arguments) is said in one line where the config runs on a CPU, before
    any work, naming the sizes that differ; a config built on another (cluster_vit.py on softmax_vit.py) names
    itself; every recipe passes train.py's checks, and a run of it says nothing more."""
    configs = sorted((ROOT / 'config').glob('*.py'))
    plain = run_forked(*({'argv': ['train.py', str(path), '--device=cpu', f'--out_dir={tmp_path / path.stem}'],
                          'fault': ['', '', 0, STOP]} for path in configs))
    recipes = {}
    for path, (rc, out) in zip(configs, plain):
        notes = NOTE.findall(out)
        assert len(notes) <= 1 and (rc == 7 or rc == 1 and not notes), (path.name, out[-2000:])
        if notes:
            recipes[path.stem] = notes[0][1]
    assert recipes['shakespeare_char'] == (
        'config/shakespeare_char.py --device=cpu --compile=False --eval_iters=20 --log_interval=1 --block_size=64 '
        '--batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0')
    assert recipes['cluster_vit'].startswith(f"{ROOT / 'config' / 'cluster_vit.py'} --device=cpu ")
    assert recipes['tda_gpt'].startswith(f"{ROOT / 'config' / 'tda_gpt.py'} --data_source=PATH.parquet ")
    assert {'attentionx_gpt', 'cluster_gpt', 'softmax_vit', 'softmax_fineweb'} <= set(recipes)
    assert not {'recall', 'passkey', 'arm_cifar10_cpu_softmax'} & set(recipes)  # CPU-sized: nothing to say
    sizes = NOTE.search(plain[configs.index(ROOT / 'config' / 'shakespeare_char.py')][1]).group(1)
    assert sizes == 'eval_iters=200, not 20; block_size=256, not 64; batch_size=64, not 12; ...'
    names = list(recipes)
    runs = run_forked(*({'argv': ['train.py', *shlex.split(recipes[name]), f'--out_dir={tmp_path / name}'],
                         'fault': ['', '', 0, STOP]} for name in names))
    for name, (rc, out) in zip(names, runs):
        assert rc == 7 and 'note:' not in out, (name, out[-2000:])
    assert not any(tmp_path.iterdir())  # stopped before any work


def test_a_long_evaluation_shows_its_progress_on_the_master_process(tmp_path):
    """An evaluation that lasts past support.runtime.QUIET_S shows a bar per split (here the threshold is 0: every
    evaluation counts as long), and the result lines come as before; a quick one shows none."""
    args = ['train.py', *TINY, f'--data_dir={tmp_path / "data"}', '--max_iters=2', '--eval_interval=2']
    quiet = "import support.runtime\nsupport.runtime.QUIET_S = 0"
    (rc, out), = run_forked({'argv': [*args, f'--out_dir={tmp_path / "out"}'], 'fault': ['', '', 0, quiet]})
    assert rc == 0, out[-2000:]
    for split in ('train', 'val'):
        assert re.search(rf"eval {split}: +\d+%\|.*\| \d/2 \[", out), out[-2000:]  # of eval_iters=2 batches
    assert re.search(r"^step 2: train loss [\d.]+, val loss [\d.]+, val acc [\d.]+$", out, re.M)


def test_a_new_run_says_which_run_it_replaces_and_a_resumed_one_where_it_goes_on(tmp_path):
    """python train.py --attention=linear in a folder that holds a softmax run: one line first, naming that run
    (its rule, dataset and iteration) and how to keep it; going on from it instead says so."""
    common = ['train.py', *TINY, f'--data_dir={tmp_path / "data"}', f'--out_dir={tmp_path / "out"}',
              '--eval_interval=2']
    first = run_script(*common, '--max_iters=2')
    assert 'note:' not in first
    second = run_script(*common, '--max_iters=4', '--attention=linear')
    assert (f"note: out_dir={tmp_path / 'out'} holds a softmax run on recall at iteration 2 of 2; this run replaces "
            f"its ckpt.pt and log.jsonl at its first checkpoint: to keep it, stop now and pass --out_dir=ANOTHER_DIR "
            f"(or --init_from=resume to go on with it)") in second.splitlines()
    resumed = run_script(*common, '--max_iters=6', '--attention=linear', '--init_from=resume')
    assert 'note:' not in resumed and f"resuming from {tmp_path / 'out' / 'ckpt.pt'} at iteration 4" in resumed


def test_a_path_setting_starting_with_a_tilde_is_in_the_home_folder(tmp_path, monkeypatch):
    """--out_dir=~/x (the shell leaves a ~ after = as typed): the run goes to $HOME/x, for the configurator's
    scripts and the prepare scripts alike; no folder named ~ appears where the command ran."""
    home, cwd = tmp_path / 'home', tmp_path / 'cwd'
    home.mkdir(), cwd.mkdir()
    monkeypatch.setenv('HOME', str(home))
    (rc, out), (rc_prepare, out_prepare) = run_forked(
        {'argv': [str(ROOT / 'train.py'), *TINY, '--out_dir=~/run', '--data_dir=~/data/recall', '--max_iters=2',
                  '--eval_interval=2'], 'cwd': str(cwd)},
        {'argv': [str(ROOT / 'prepare' / 'recall.py'), '--data_dir=~/prepared', '--num_train=64', '--num_val=16'],
         'cwd': str(cwd)})
    assert rc == 0 and rc_prepare == 0, out[-2000:] + out_prepare[-2000:]
    assert (home / 'run' / 'ckpt.pt').exists() and (home / 'data' / 'recall' / 'meta.json').exists()
    assert json.loads((home / 'prepared' / 'meta.json').read_text())
    assert f"Overriding: out_dir = {home / 'run'}" in out
    assert list(cwd.iterdir()) == [] and not (ROOT / '~').exists()


def test_bench_prints_each_row_as_it_is_measured(tmp_path):
    """On a CPU each row's time is printed as it is measured, then each peak after every time (measuring it slows
    allocation); --json prints whole rows. --mode=pace on a CPU with its GPU-sized defaults says so first."""
    small = ['--seq_lens=32,48', '--n_embd=32', '--n_head=2', '--repeats=1', '--device=cpu', '--dtype=float32']
    text = run_script('bench.py', *small, '--attention=topk').splitlines()
    header = text.index("peak memory, a run of each case after all the times (on a CPU, measuring it slows "
                        "allocation):")
    timed = [line.split()[:3] for line in text[:header] if ' ms ' in line]
    peaks = [line.split()[:3] for line in text[header + 1:] if line.endswith(' MiB')]
    assert timed == peaks == [['softmax', 'sdpa', 'T=32'], ['topk', 'math', 'T=32'], ['softmax', 'sdpa', 'T=48'],
                              ['topk', 'math', 'T=48']]
    assert all(' MiB' not in line for line in text[:header])
    rows = [json.loads(line) for line in run_script('bench.py', *small, '--json').splitlines() if line[:1] == '{']
    assert [(r['T'], r['ms'] > 0, r['peak_mib'] >= 0) for r in rows] == [(32, True, True)] * 2 + [(48, True, True)] * 2
    (rc, out), = run_forked({'argv': ['bench.py', '--mode=pace', '--device=cpu'],
                             'fault': ['', 'bench_pace', 1, 'os._exit(7)']})
    assert rc == 7 and out.splitlines()[-1] == (
        "note: --mode=pace is sized for a GPU (n_layer=12, not 2; n_head=8, not 4; n_embd=512, not 128) "
        "and runs on the CPU here, which takes far longer; its CPU recipe: python bench.py --mode=pace "
        "--seq_lens=256,1024 --n_layer=2 --n_head=4 --n_embd=128"), out[-2000:]
