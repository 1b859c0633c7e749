"""Run repo scripts as a user would, cheaply and with faults injected at chosen moments.

Batch mode (conftest.run_forked): runs as JSON on stdin, results as JSON on stdout. This process imports torch and
the repo's modules once, then forks a child per run that executes the script exactly as `python script args` would
(its argv, exit code, output; an uncaught exception prints its traceback), so a run that stops at a bad setting costs
milliseconds instead of two seconds of imports and teardown.

    runs:    [{"argv": ["train.py", "--eval_iters=0"], "kill": null, "env": {}}, ...]
    results: [{"rc": 1, "out": "...error: eval_iters=0 ...", "seconds": 0.01}, ...]    (rc -9: SIGKILLed)

A kill [within, target, n] SIGKILLs the run the n-th time a function named `target` (Python or builtin) is called
while a function named `within` is running ('' for anywhere): e.g. ["save_checkpoint", "write_record", 5] stops it in
the middle of writing its checkpoint, with nothing flushed or cleaned up, as kill -9 would.

Wrapper mode, for torchrun: `torchrun ... tests/faults.py --kill=within:target:n:rank script args...` runs the script
in this process and kills rank `rank` at that moment, on the first attempt only (TORCHELASTIC_RESTART_COUNT=0).
"""
import json
import os
import runpy
import signal
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def kill_at(within, target, n):
    """SIGKILL this process the n-th time `target` is called inside `within` (a profile hook: this thread only)."""
    calls = 0

    def inside(frame):
        while frame is not None:
            if frame.f_code.co_name == within:
                return True
            frame = frame.f_back
        return False

    def hook(frame, event, arg):
        nonlocal calls
        name = frame.f_code.co_name if event == 'call' else getattr(arg, '__name__', '') if event == 'c_call' else None
        if name == target and (not within or inside(frame)):
            calls += 1
            if calls == n:
                os.kill(os.getpid(), signal.SIGKILL)
    sys.setprofile(hook)


def run(argv, kill=None):
    """Execute a repo script as `python argv...` does; returns only if it finished without sys.exit."""
    sys.argv = list(argv)
    if kill:
        kill_at(*kill)
    runpy.run_path(argv[0], run_name='__main__')
    sys.setprofile(None)


def child(spec, out_path):
    """Run one script and end the process as the interpreter would end it (the exit code and message of a
    SystemExit, the traceback of any other exception), without the half second torch's teardown takes."""
    os.environ.update(spec.get('env', {}))
    fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    try:
        run(spec['argv'], spec.get('kill'))
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def batch():
    import numpy, torch, torch.distributed, torch.nn.parallel, tqdm  # noqa: F401 E401 what every run imports, paid once
    import attention, model, prepare, prepare.recall, support.data, support.runtime, vit  # noqa: F401 E401
    runs, results = json.load(sys.stdin), []
    out_path = os.path.join(os.environ.get('TMPDIR', '/tmp'), f'faults-{os.getpid()}.out')
    for spec in runs:
        start = time.time()
        pid = os.fork()
        if pid == 0:
            child(spec, out_path)  # never returns: the child ends as its script ends
        _, status = os.waitpid(pid, 0)
        with open(out_path) as f:
            results.append({'rc': os.waitstatus_to_exitcode(status), 'out': f.read(), 'seconds': time.time() - start})
    os.remove(out_path)
    json.dump(results, sys.stdout)


if __name__ == '__main__':
    os.chdir(ROOT)
    sys.path[0] = ROOT  # as for a script in the repo root: its modules import as train.py's do
    if len(sys.argv) > 1 and sys.argv[1].startswith('--kill='):
        within, target, n, rank = sys.argv[1][len('--kill='):].split(':')
        first_attempt = os.environ.get('TORCHELASTIC_RESTART_COUNT', '0') == '0'
        chosen = first_attempt and os.environ.get('RANK', '0') == rank
        run(sys.argv[2:], (within, target, int(n)) if chosen else None)
    else:
        batch()
