"""
The lab's runs as jobs (studies/ablate.py --launcher=slurm or submitit_local), through submitit (an optional extra):
each run one job, on SLURM of --nodes × --gpus_per_node processes under torchrun's multi-node rendezvous (c10d at
the job's first node); a job preempted or out of time is resubmitted and its run goes on from its checkpoint (the
lab resumes a run whose folder holds ckpt.pt). The job runs the lab's own cell_run (or train_run, for a run others
start from), the lab rebuilt from its settings where the job lands; the lab hands it those functions, and this file
imports no other part of the lab.
"""
import os
import shutil

LAUNCHERS = ('local', 'submitit_local', 'slurm')  # local: a process per run, here (studies/runs.py's `launched`)
SLURM_KEYS = ('nodes', 'gpus_per_node', 'partition', 'time_min', 'account', 'cpus_per_task', 'mem_gb')
CPUS_PER_GPU = 8  # a node's task's CPUs where cpus_per_task=0: a data loader and the process of each GPU
RENDEZVOUS_PORT = 29500  # torchrun's c10d store on the job's first node


def check_launcher(c, given):
    """ValueError where the launcher is unknown, its extra is missing, or a SLURM setting is given without it."""
    if c['launcher'] not in LAUNCHERS:
        raise ValueError(f"launcher={c['launcher']!r} is not a launcher; pass --launcher=local, submitit_local or slurm")
    slurm_set = [key for key in SLURM_KEYS if key in given]
    if slurm_set and c['launcher'] != 'slurm':
        raise ValueError(f"{slurm_set[0]} is a SLURM job's setting and launcher={c['launcher']}; pass "
                         f"--launcher=slurm, or leave --{slurm_set[0]} out")
    if c['launcher'] != 'local' and c['cells_at_once'] != 1:  # jobs run side by side as the scheduler has room
        raise ValueError(f"cells_at_once={c['cells_at_once']} is the local launcher's setting; launcher="
                         f"{c['launcher']} makes each run a job, run side by side as the scheduler has room; leave "
                         f"--cells_at_once out, or pass --launcher=local")
    if c['launcher'] != 'local':
        try:
            import submitit  # noqa: F401
        except ImportError:
            raise ValueError(f"launcher={c['launcher']} submits through submitit, which is not installed; pip install "
                             f"submitit (requirements-extras.txt), or pass --launcher=local") from None
    if c['launcher'] == 'slurm' and not c['dry_run'] and not shutil.which('sbatch'):
        raise ValueError("launcher=slurm submits with sbatch, and this machine has none; run on a SLURM cluster's "
                         "login node, or pass --launcher=local (or --dry_run=True for the cost alone)")
    for key in ('nodes', 'gpus_per_node', 'time_min'):
        if c[key] < 1:
            raise ValueError(f"{key}={c[key]} must be at least 1; pass --{key}=1 or more")
    for key in ('cpus_per_task', 'mem_gb'):
        if c[key] < 0:
            raise ValueError(f"{key}={c[key]} must be 0 (the default) or more; pass --{key}=0 or more")


def torchrun_args(nproc, nodes=1, job=None):
    """python's arguments before a training script: none for one process; torchrun --standalone on one node; on
    `nodes` nodes of a SLURM job, torchrun's c10d rendezvous at the job's first node. job: {'hosts': [node names],
    'id': a name the job's nodes share for this training}."""
    if nproc * nodes == 1:
        return []
    if nodes == 1:
        return ['-m', 'torch.distributed.run', '--standalone', f'--nproc_per_node={nproc}']
    return ['-m', 'torch.distributed.run', f'--nnodes={nodes}', f'--nproc_per_node={nproc}', '--rdzv_backend=c10d',
            f"--rdzv_endpoint={job['hosts'][0]}:{RENDEZVOUS_PORT}", f"--rdzv_id={job['id']}"]


def slurm_job():
    """{'hosts', 'rank', 'id'} of the SLURM job this process runs in (submitit's JobEnvironment: SLURM_JOB_NODELIST
    expanded, this node's task rank)."""
    import submitit
    job = submitit.JobEnvironment()
    return {'hosts': job.hostnames, 'rank': job.global_rank, 'id': job.job_id}


class Job:
    """One run as a submitit job: `work` (studies/cells.py's cell_run: trained and scored; studies/runs.py's
    train_run: a run others start from) on `run` (a Run), the lab rebuilt where the job lands by `lab_of(settings,
    given)` (studies/lab.py's lab_settings); on a SLURM job's other nodes `follow` (runs.follow_training) instead.
    Each a module-level function: pickled by name, imported where the job lands."""

    def __init__(self, settings, given, work, run, lab_of, follow):
        self.settings, self.given, self.work, self.run = settings, sorted(given), work, run
        self.lab_of, self.follow = lab_of, follow

    def __call__(self):
        lab = self.lab_of(self.settings, self.given)
        if lab.launcher == 'slurm' and slurm_job()['rank']:  # another node: its processes of the trainings only
            return self.follow(lab, self.run)
        return self.work(lab, self.run)

    def checkpoint(self, *args, **kwargs):
        """Preempted or out of time: the same job again (submitit requeues it); its run resumes from ckpt.pt."""
        import submitit
        return submitit.helpers.DelayedSubmission(self)


def executor(lab, folder):
    """The submitit executor of the lab's jobs, its logs in `folder`: one node's processes here (submitit_local), or
    a SLURM job of nodes × gpus_per_node (a task per node, each running torchrun), its partition, time, account, CPUs
    and memory."""
    import submitit
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.environ['PYTHONPATH'] = os.pathsep.join(  # the job's python imports studies/ from the repo
        p for p in (root, os.environ.get('PYTHONPATH')) if p)
    if lab.launcher == 'submitit_local':
        ex = submitit.LocalExecutor(folder)
        ex.update_parameters(timeout_min=lab.time_min)
        return ex
    ex = submitit.SlurmExecutor(folder)
    ex.update_parameters(nodes=lab.nodes, ntasks_per_node=1, gpus_per_node=lab.gpus_per_node, time=lab.time_min,
                         cpus_per_task=lab.cpus_per_task or CPUS_PER_GPU * lab.gpus_per_node,
                         **{key: value for key, value in (('partition', lab.partition), ('account', lab.account),
                                                          ('mem', lab.mem_gb and f'{lab.mem_gb}G')) if value})
    return ex


def job_results(lab, waves, settings, given, lab_of, follow):
    """(work, run, its result) of every run of `waves` ([[(work, Run)]]: a run after the one it starts from, so two
    jobs never train one run), each run one job (a Job of `lab_of` and `follow`), a wave's jobs at once; a job that
    failed is the run's error."""
    ex = executor(lab, os.path.join(os.path.abspath(lab.folder), 'jobs'))
    for wave in waves:
        jobs = [(run, work, ex.submit(Job(settings, given, work, run, lab_of, follow))) for work, run in wave]
        for run, work, job in jobs:
            try:
                result = job.result()
            except Exception as e:  # submitit's FailedJobError: the job's own traceback is in its log
                result = {'error': f"error: job {job.job_id} failed ({type(e).__name__}: {str(e).splitlines()[0]})",
                          'log': str(job.paths.stderr)}
            yield work, run, result
