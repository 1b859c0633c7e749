"""The lab at scale (studies/ablate.py): each run trained once and reused by every table that needs it; the cost of
a table said before the first step (--dry_run); a cell on every process of a node (--nproc_per_node, torchrun), cells
side by side (--cells_at_once) and cells as jobs (--launcher, submitit), each giving the serial run's cells."""
import json
import pickle
import re

import pytest

from conftest import checkout_files, run_script
from test_lab import ablate, tiny_text_table

RECALL_PAIR = ['--budget=tiny', '--systems=recall', '--rows=softmax,krause']  # two cells, each a run


def launches(out_root):
    """The train.py processes that trained in out_root: each prints its tokens per iteration once, into its run's
    train.log (scoring writes to the cell's eval.log)."""
    return sum(log.read_text().count('tokens per iteration will be') for log in out_root.glob('runs/*/*/train.log'))


def test_two_tables_that_share_a_run_train_it_once_and_the_dry_run_between_prices_what_is_left(tmp_path):
    """The softmax GPT of attentionx and cluster (the same arguments, data and seed): the dry run of cluster after
    attentionx says each run's cost and the table's sum, the shared run done, and trains nothing; cluster then
    trains nothing for that row and scores the run attentionx trained."""
    lab, first, _ = tiny_text_table(tmp_path, 'attentionx', 'softmax')
    trained = first['softmax']['text']['seeds']['1337']
    out = run_script('studies/ablate.py', '--table=cluster', '--systems=text', '--budget=tiny', '--dry_run=True',
                     f'--text_source={tmp_path / "input.txt"}', f'--recipe=--data_dir={tmp_path / "chars"}',
                     f'--out_root={lab}', '--gpu=A100', '--mfu=0.5')
    assert not (lab / 'cluster').exists() and launches(lab) == 1, out  # nothing made, nothing trained
    lines = [line for line in out.splitlines() if line.startswith(('[', 'total:'))]
    N, T, tokens = trained['metrics']['params'], 32, 20 * 1 * 8 * 32  # max_iters · accumulation · batch · block
    flops = 6 * N * tokens + 3 * 1 * (2 * 32 * (T + 1)) * tokens  # 1 layer of causal softmax, C = 32: 2·C·(T+1)
    assert lines[0] == (f"[done (for attentionx)] {trained['run']}: {N / 1e3:.3g}k parameters, 5.12k tokens (T 32), "
                        f"{flops:.3g} FLOPs, 0.0 GPU-hours")
    assert lines[1].startswith('[to train] runs/text/cluster-') and lines[2].startswith('[to train] runs/text/cluster'
                                                                                      '-swapped-')
    assert lines[2].endswith(f": swapped into {trained['run']}, no training")
    cluster = float(lines[1].split(' FLOPs')[0].rsplit(' ', 1)[1])
    hours = lambda f: f / (0.5 * 312e12) / 3600  # A100's dense bf16 peak at MFU 0.5
    assert lines[3] == (f"total: 3 runs (2 to train, 1 done), {flops + cluster:.3g} FLOPs, "
                        f"{hours(flops + cluster):,.1f} GPU-hours; to train: {cluster:.3g} FLOPs, "
                        f"{hours(cluster):,.1f} GPU-hours ({hours(cluster) / 8:,.1f} hours on 8 GPUs)")
    assert "python train.py config/shakespeare_char.py --device=cpu" in out
    assert f"; data --text_source={tmp_path / 'input.txt'} (text: in place of shakespeare_char)" in out.splitlines()[
        [line.startswith('dry run:') for line in out.splitlines()].index(True)]  # a local source named, not hidden

    _, second, out = tiny_text_table(tmp_path, 'cluster', 'softmax')  # the same softmax GPT: arguments, data, seed
    assert launches(lab) == 1, out  # trained for attentionx, scored for both
    mine, theirs = (rows['softmax']['text']['seeds']['1337'] for rows in (second, first))
    assert mine['run'] == theirs['run'] and (lab / mine['run'] / 'ckpt.pt').exists()
    assert mine['trained_for'] == theirs['trained_for'] == 'attentionx'
    assert mine['metrics']['val_loss'] == theirs['metrics']['val_loss']  # one model, scored twice the same way
    assert json.loads((lab / mine['run'] / 'run.json').read_text())['trained_for'] == 'attentionx'
    assert ("Trained once for another table and reused here (its folder: table.json's `run`): softmax (attentionx)."
            in (lab / 'cluster' / 'table.md').read_text())


def test_a_table_under_torchrun_gives_the_serial_tables_cells(tmp_path):
    """--nproc_per_node=2: each run trained by two gloo processes (train.py's DDP: each takes half of a step's
    micro-batches of the same global batch) gives the cells of one process, up to the order of the gradient sums."""
    accumulate = f'--recipe=--gradient_accumulation_steps=2 --data_dir={tmp_path / "chars"}'
    source = tmp_path / 'input.txt'
    source.write_text(''.join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(400)))
    common = ['studies/ablate.py', '--table=tda', '--systems=text', '--rows=softmax', '--budget=tiny',
              f'--text_source={source}', accumulate]
    # the recipe's one micro-step of 8 rows: two processes take 4 rows each, three cannot share it (refused)
    spread = run_script(*common[:-1], f'--out_root={tmp_path / "dry"}', '--nproc_per_node=2', '--dry_run=True')
    assert "batch 8 × 1 micro-steps as 4 × 2 on 2 processes (a step's samples unchanged)" in spread
    assert "--batch_size=4 --gradient_accumulation_steps=2" in spread
    refused = run_script(*common[:-1], f'--out_root={tmp_path / "refused"}', '--nproc_per_node=3', check=False)
    assert [line for line in refused.splitlines() if line.startswith('error:')] == [
        "error: text softmax at budget tiny: 3 processes (--nproc_per_node=3) cannot share a step of "
        "gradient_accumulation_steps=1 × batch_size=8 (no 3-way cut of the batch); pass a count of processes that "
        "shares it: 2 or 4"] and not (tmp_path / 'refused').exists()
    ablate(*common[1:], f'--out_root={tmp_path / "serial"}')
    ddp = ablate(*common[1:], f'--out_root={tmp_path / "ddp"}', '--nproc_per_node=2')
    one, two = (json.loads((tmp_path / name / 'tda' / 'table.json').read_text())['rows']['softmax']['text']
                for name in ('serial', 'ddp'))
    assert one['status'] == two['status'] == 'ok', ddp
    trained = [tmp_path / name / cell['seeds']['1337']['run'] for name, cell in (('serial', one), ('ddp', two))]
    assert [json.loads((t / 'trained.json').read_text())['nproc_per_node'] for t in trained] == [1, 2]
    log = (trained[1] / 'train.log').read_text()
    assert log.count('tokens per iteration will be: 512') == 1  # rank 0 says it: 2 steps of 8 rows of 32
    a, b = one['seeds']['1337']['metrics'], two['seeds']['1337']['metrics']
    assert a.keys() == b.keys() and all(b[k] == pytest.approx(a[k], rel=1e-5) for k in a), (a, b)


def recall_metrics(out_root):
    """{row: seed 1337's metrics} of the recall table in out_root (RECALL_PAIR's), and its rows."""
    rows = json.loads((out_root / 'table.json').read_text())['rows']
    return {row: rows[row]['recall']['seeds']['1337']['metrics'] for row in rows}, rows


@pytest.fixture(scope='module')
def serial_cells(tmp_path_factory):
    """RECALL_PAIR's cells trained one after the other: what the cells side by side and as jobs are compared with
    (trained once for both), nothing written in the checkout."""
    checkout, out_root = checkout_files(), tmp_path_factory.mktemp('serial')
    out = ablate(*RECALL_PAIR, f'--out_root={out_root}')
    metrics, rows = recall_metrics(out_root)
    assert all(r['recall']['status'] == 'ok' for r in rows.values()) and checkout_files() == checkout, out
    return metrics


def test_cells_side_by_side_give_the_serial_tables_cells(tmp_path, serial_cells):
    """--cells_at_once=2: two runs at once, each its own process (on a GPU node, its own GPU; here --cells_on_cpu
    lets them share the CPU), the same cells as one after the other."""
    checkout = checkout_files()
    out = ablate(*RECALL_PAIR, f'--out_root={tmp_path / "two"}', '--cells_at_once=2', '--cells_on_cpu=True')
    metrics, two = recall_metrics(tmp_path / 'two')
    assert metrics == serial_cells and all(r['recall']['status'] == 'ok' for r in two.values()), out
    assert launches(tmp_path / 'two') == 2 and checkout_files() == checkout  # the data too under out_root


def test_cells_as_local_jobs_give_the_serial_tables_cells(tmp_path, serial_cells):
    """--launcher=submitit_local: each run one submitit job on this machine (two cells, two jobs at once), the cells
    of the runs one after the other."""
    pytest.importorskip('submitit', reason="submitit (requirements-extras.txt) runs the lab's jobs")
    checkout = checkout_files()
    out = ablate(*RECALL_PAIR, f'--out_root={tmp_path / "jobs"}', '--launcher=submitit_local')
    metrics, two = recall_metrics(tmp_path / 'jobs')
    assert metrics == serial_cells and all(r['recall']['status'] == 'ok' for r in two.values()), out
    assert launches(tmp_path / 'jobs') == 2 and len(list((tmp_path / 'jobs' / 'jobs').glob('*_submitted.pkl'))) == 2
    assert checkout_files() == checkout


def test_a_slurm_job_is_nodes_times_gpus_under_torchruns_rendezvous(tmp_path, monkeypatch):
    """--launcher=slurm, built without a cluster: the sbatch script of a run's job (2 nodes, a task each, 4 GPUs
    each, its partition, time and account), and the torchrun arguments each node's task starts train.py under in a
    (faked) 2-node job: c10d at the job's first node, a rendezvous named by the job and the run."""
    submitit = pytest.importorskip('submitit', reason="submitit (requirements-extras.txt) submits the lab's jobs")
    for tool in ('srun', 'sbatch'):  # submitit's SlurmExecutor looks for srun; the lab's check for sbatch
        (tmp_path / tool).write_text('#!/bin/sh\nexit 1\n')
        (tmp_path / tool).chmod(0o755)
    monkeypatch.setenv('PATH', f"{tmp_path}:{__import__('os').environ['PATH']}")
    monkeypatch.setattr('sys.argv', ['ablate.py'])
    from studies import ablate, launch  # ablate: the script's settings, their defaults
    from studies.cells import cell_run
    from studies.lab import lab_settings, planned_cells
    from studies.runs import follow_training, run_command, run_dir, torchrun, training_command
    from support.checks import script_settings
    given = {'launcher', 'nodes', 'gpus_per_node', 'partition', 'time_min', 'account', 'budget', 'out_root'}
    settings = {**script_settings(vars(ablate)), 'launcher': 'slurm', 'nodes': 2, 'gpus_per_node': 4, 'budget': 'tiny',
                'partition': 'h100', 'time_min': 90, 'account': 'attn', 'out_root': str(tmp_path / 'lab')}
    lab = lab_settings(settings, given)
    ex = launch.executor(lab, tmp_path / 'jobs')
    assert {k: ex.parameters[k] for k in ('nodes', 'ntasks_per_node', 'gpus_per_node', 'partition', 'time',
                                          'account')} == {'nodes': 2, 'ntasks_per_node': 1, 'gpus_per_node': 4,
                                                          'partition': 'h100', 'time': 90, 'account': 'attn'}
    sbatch = ex._make_submission_file_text('python -u -m submitit.core._submit JOBS', 'uid')
    for line in ('#SBATCH --nodes=2', '#SBATCH --ntasks-per-node=1', '#SBATCH --gpus-per-node=4',
                 '#SBATCH --partition=h100', '#SBATCH --time=90', '#SBATCH --account=attn', '#SBATCH --signal=USR2@90'):
        assert line in sbatch.splitlines(), sbatch
    for key, value in {'SUBMITIT_EXECUTOR': 'slurm', 'SLURM_JOB_ID': '4242', 'SLURM_JOB_NODELIST': 'gpu[07-08]',
                       'SLURM_JOB_NUM_NODES': '2', 'SLURM_NTASKS': '2', 'SLURM_PROCID': '1', 'SLURM_NODEID': '1',
                       'SLURM_LOCALID': '0'}.items():
        monkeypatch.setenv(key, value)
    assert launch.slurm_job() == {'hosts': ['gpu07', 'gpu08'], 'rank': 1, 'id': '4242'}
    _, todo = planned_cells(lab)
    folder = run_dir(lab, todo[0])
    assert torchrun(lab, folder) == [
        '-m', 'torch.distributed.run', '--nnodes=2', '--nproc_per_node=4', '--rdzv_backend=c10d',
        '--rdzv_endpoint=gpu07:29500', f'--rdzv_id=4242-{folder.rsplit("/", 1)[1]}']
    # 8 processes share each step: each micro-batch cut, the micro-steps multiplied, a step's samples unchanged
    from studies.cost import train_settings
    recipe = train_settings(run_command(lab, todo[0])[1])
    spread = train_settings(training_command(lab, todo[0], folder)[1])
    assert spread['gradient_accumulation_steps'] % 8 == 0 and spread['batch_size'] < recipe['batch_size']
    assert (spread['batch_size'] * spread['gradient_accumulation_steps'] ==
            recipe['batch_size'] * recipe['gradient_accumulation_steps'])
    assert ex.parameters['cpus_per_task'] == 32 and 'mem' not in ex.parameters  # 8 CPUs a GPU; the cluster's memory
    job = launch.Job(settings, given, cell_run, todo[0], lab_settings, follow_training)
    again = job.checkpoint()  # preempted or out of time: the same job resubmitted
    assert isinstance(again, submitit.helpers.DelayedSubmission) and again.function is job
    landed = pickle.loads(pickle.dumps(job))  # its functions by name: imported where the job lands
    assert (landed.work, landed.lab_of, landed.follow, landed.run) == (cell_run, lab_settings, follow_training, todo[0])


def test_a_world_that_cannot_share_a_step_is_refused_before_any_job_and_a_jobs_cpus_and_memory_are_set(tmp_path,
                                                                                                     monkeypatch):
    """nodes × gpus_per_node is the world a run's step is shared by: 3 processes cannot share the tiny recipe's step
    (one micro-batch of 8), refused before a job is submitted, a dry run too; --cpus_per_task and --mem_gb reach the
    sbatch script."""
    submitit = pytest.importorskip('submitit', reason="submitit (requirements-extras.txt) submits the lab's jobs")
    for tool in ('srun', 'sbatch'):
        (tmp_path / tool).write_text('#!/bin/sh\nexit 1\n')
        (tmp_path / tool).chmod(0o755)
    env = f"{tmp_path}:{__import__('os').environ['PATH']}"
    monkeypatch.setenv('PATH', env)
    for dry in ('False', 'True'):
        out = run_script('studies/ablate.py', '--budget=tiny', '--systems=recall', '--rows=softmax', '--launcher=slurm',
                         '--nodes=3', '--gpus_per_node=1', f'--dry_run={dry}', f'--out_root={tmp_path / "lab"}',
                         check=False)
        assert out.strip().splitlines()[-1] == (
            "error: recall softmax at budget tiny: 3 processes (--nodes=3 × --gpus_per_node=1) cannot share a step of "
            "gradient_accumulation_steps=1 × batch_size=32 (no 3-way cut of the batch); pass a count of processes "
            "that shares it: 2 or 4"), out
    assert not (tmp_path / 'lab').exists()
    monkeypatch.setattr('sys.argv', ['ablate.py'])
    from studies import ablate, launch  # ablate: the script's settings, their defaults
    from studies.lab import lab_settings
    from support.checks import script_settings
    settings = {**script_settings(vars(ablate)), 'launcher': 'slurm', 'gpus_per_node': 2, 'cpus_per_task': 12,
                'mem_gb': 200, 'budget': 'tiny', 'out_root': str(tmp_path / 'lab')}
    ex = launch.executor(lab_settings(settings, {'launcher', 'gpus_per_node', 'cpus_per_task', 'mem_gb'}),
                         tmp_path / 'jobs')
    sbatch = ex._make_submission_file_text('python -u -m submitit.core._submit JOBS', 'uid').splitlines()
    assert '#SBATCH --cpus-per-task=12' in sbatch and '#SBATCH --mem=200G' in sbatch, sbatch


def test_a_run_the_code_no_longer_trains_alike_is_flagged_and_trained_again_unless_reused(tmp_path):
    """run.json keeps the commit and a hash of the code that trains a run: a kept run of other code is flagged in
    the dry run, reused only with --reuse_stale=True (its table says so), else set aside (kept) and trained again."""
    common = ['--budget=tiny', '--systems=recall', '--rows=softmax', f'--out_root={tmp_path}']
    ablate(*common)
    folder, = (tmp_path / 'runs' / 'recall').iterdir()
    made = json.loads((folder / 'run.json').read_text())
    assert len(made['code']) == 12 and made['commit']
    (folder / 'run.json').write_text(json.dumps({**made, 'code': 'older', 'commit': 'abc1234'}))  # another code's
    dry = ablate(*common, '--dry_run=True')
    assert (f"[to train (trained at abc1234, the code now {made['commit']}: the kept run set aside, or "
            f"--reuse_stale=True)] runs/recall/{folder.name}") in dry
    reused = ablate(*common, '--reuse_stale=True')
    assert launches(tmp_path) == 1, reused
    assert (f"Trained by other code and reused as asked (--reuse_stale=True): softmax (trained at abc1234, the code "
            f"now {made['commit']}).") in (tmp_path / 'table.md').read_text()
    ablate(*common)
    aside = folder.parent / f'{folder.name}-code-older'
    assert (aside / 'ckpt.pt').exists() and (folder / 'trained.json').exists() and launches(tmp_path) == 2
    assert json.loads((folder / 'run.json').read_text())['code'] == made['code']
    assert 'Trained by other code' not in (tmp_path / 'table.md').read_text()


def test_a_dry_run_without_a_table_prices_every_table_each_shared_run_once(tmp_path):
    out = run_script('studies/ablate.py', '--budget=tiny', '--dry_run=True', '--seeds=5,6', f'--out_root={tmp_path}')
    from studies.tables import TABLES
    runs = {m[0]: int(m[1]) for m in re.findall(r"^table (.+): (\d+) runs, ", out, re.M)}
    assert list(runs) == [*TABLES, 'every rule'] and all(n % 2 == 0 for n in runs.values()), out  # two seeds each
    together = int(re.search(r"^the papers' tables together: (\d+) runs", out, re.M).group(1))
    total = int(re.search(r"^total: (\d+) runs", out, re.M).group(1))
    assert together < sum(runs[name] for name in TABLES)  # the softmax runs attentionx and cluster share: once
    assert total == len(re.findall(r"^\[to train\] ", out, re.M)) < together + runs['every rule']
    assert "attentionx (seeds 5,6)" in out and not tmp_path.joinpath('runs').exists()
