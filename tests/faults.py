"""Run repo scripts as a user would, cheaply and with faults injected at chosen moments.

Server mode (conftest.run_forked): a request per line of stdin, its results as one line of stdout, until stdin closes.
This process imports torch and the repo's modules once, then forks a child per run that executes the script exactly
as `python script args` would (its argv, sys.path, exit code, output; an uncaught exception prints its traceback; in
the repo root unless "cwd" names another folder; in the request's environment), so a run that stops at a bad setting
costs milliseconds instead of two seconds of imports and teardown, and one process serves a whole test session. A
script the run launches the lab's way (subprocess.run of `python script args`, its output to a file) is forked the
same way.

    request: {"runs": [{"argv": ["train.py", "--eval_iters=0"], "kill": null, "env": {}, "cwd": "/tmp"}, ...],
              "environ": {the caller's os.environ}}
    results: [{"rc": 1, "out": "...error: eval_iters=0 ...", "seconds": 0.01}, ...]    (rc -9: SIGKILLed)

A kill [within, target, n] SIGKILLs the run the n-th time a function named `target` (Python or builtin) is called
while a function named `within` is running ('' for anywhere): e.g. ["save_checkpoint", "write_record", 5] stops it in
the middle of writing its checkpoint, with nothing flushed or cleaned up, as kill -9 would. A fault
[within, target, n, code] runs the Python code `code` at that moment instead (n = 0: before the script starts), in
the script's process: a data file truncated, the disk full (RLIMIT_FSIZE), Ctrl-C (SIGINT to itself).

Wrapper mode, for torchrun: `torchrun ... tests/faults.py --kill=within:target:n:rank script args...` runs the script
in this process and kills rank `rank` at that moment, on the first attempt only (TORCHELASTIC_RESTART_COUNT=0).
"""
import atexit
import json
import os
import runpy
import signal
import socket
import subprocess
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
real_run = subprocess.run
results_fd = None  # where the server writes its results (serve)


def kill_at(within, target, n):
    """SIGKILL this process the n-th time `target` is called inside `within` (a profile hook: this thread only)."""
    at_call(within, target, n, lambda: os.kill(os.getpid(), signal.SIGKILL))


def at_call(within, target, n, action):
    """Call action() the n-th time `target` is called inside `within` ('' for anywhere; a profile hook: this thread
    only), or now where n is 0."""
    if n == 0:
        return action()
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
                sys.setprofile(None)
                action()
    sys.setprofile(hook)


def fault_action(code):
    """A fault as Python code run inside the script's process (os, signal, shutil and resource imported): e.g.
    os.truncate(a data file), shutil.rmtree(the data folder), os.kill(os.getpid(), signal.SIGINT) for Ctrl-C,
    resource.setrlimit(resource.RLIMIT_FSIZE, ...) for a disk that fills up."""
    import resource
    import shutil
    return lambda: exec(code, {'os': os, 'signal': signal, 'shutil': shutil, 'resource': resource})


def run(argv, kill=None, fault=None):
    """Execute a repo script as `python argv...` does; returns only if it finished without sys.exit."""
    sys.argv = list(argv)
    if kill:
        kill_at(*kill)
    if fault:
        within, target, n, code = fault
        at_call(within, target, n, fault_action(code))
    runpy.run_path(argv[0], run_name='__main__')
    sys.setprofile(None)


def forking_run(cmd, *args, **kwargs):
    """subprocess.run for a script's own runs: `python script args` with its output to a file (the lab's runs) forked
    from this process as a run of its own, the rest as subprocess.run does them."""
    script = isinstance(cmd, (list, tuple)) and len(cmd) > 1 and cmd[0] == sys.executable and str(cmd[1]).endswith(
        '.py')
    to_a_file = hasattr(kwargs.get('stdout'), 'fileno') and kwargs.get('stderr') is subprocess.STDOUT
    if not (script and to_a_file and not args and set(kwargs) <= {'cwd', 'env', 'stdout', 'stderr'}):
        return real_run(cmd, *args, **kwargs)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        child({'argv': [str(a) for a in cmd[1:]], 'cwd': str(kwargs.get('cwd') or os.getcwd())},
              os.dup(kwargs['stdout'].fileno()), kwargs.get('env'))
    _, status = os.waitpid(pid, 0)
    return subprocess.CompletedProcess(cmd, os.waitstatus_to_exitcode(status))


def child(spec, out_fd, environ=None):
    """Run one script and end the process as the interpreter would end it (the exit code and message of a
    SystemExit, the traceback of any other exception, then the atexit functions the script registered), without the
    half second torch's teardown takes."""
    global results_fd
    atexit._clear()  # this process's own, registered before the fork, are not the script's
    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)
    os.environ.update(spec.get('env', {}))
    # Ctrl-C raises KeyboardInterrupt, as in a script started from a terminal, also where this server's Python found
    # SIGINT ignored at its start (the suite started in the background by a shell without job control)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(spec.get('cwd', ROOT))
    sys.path[0] = os.path.dirname(os.path.abspath(spec['argv'][0]))  # as `python script` sets it
    subprocess.run = forking_run
    null = os.open(os.devnull, os.O_RDONLY)  # stdin: nothing (in server mode it is the requests' pipe)
    os.dup2(null, 0)
    os.close(null)
    if results_fd is not None:
        os.close(results_fd)  # the server's, not the script's (nor a run it forks)
        results_fd = None
    os.dup2(out_fd, 1)  # a pipe, not a file: a run that limits its file sizes (RLIMIT_FSIZE) still has its output
    os.dup2(out_fd, 2)
    os.close(out_fd)
    try:
        run(spec['argv'], spec.get('kill'), spec.get('fault'))
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def preload():
    """Import what every run imports in this process, paid once for all the runs forked from it."""
    import numpy, torch, torch.distributed, torch.nn.parallel, tqdm  # noqa: F401 E401
    import torch._dynamo  # noqa: F401  torch.optim's first param group imports it: 2 s in every run that trains
    import attention, model, prepare, prepare.recall, rules, support.data, support.runtime, vit  # noqa: F401 E401


def run_all(runs, environ=None):
    """Fork a child per run (a run with "ddp": N, N children at once), one run after the other, in `environ` where
    given: the results, in order."""
    results = []
    for spec in runs:
        start = time.time()
        read_fd, write_fd = os.pipe()
        pids = [fork_child(spec, read_fd, write_fd, environ, env) for env in ddp_envs(spec.get('ddp', 0))]
        os.close(write_fd)
        with os.fdopen(read_fd, 'rb') as f:  # until every child's end closes it
            out = f.read().decode(errors='replace')
        codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
        results.append({'rc': next((c for c in codes if c), 0), 'out': out, 'seconds': time.time() - start})
    return results


def fork_child(spec, read_fd, write_fd, environ, env):
    """A child running `spec` with `env` added to its environment, its output to write_fd: its pid."""
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        child({**spec, 'env': {**spec.get('env', {}), **env}}, write_fd, environ)  # never returns
    return pid


def ddp_envs(n):
    """The variables `torchrun --standalone --nproc_per_node=n` gives each of its processes (n = 0: one plain run):
    DDP's processes without torchrun's own two seconds of imports, for the tests of what the processes compute. A run
    that fails in one process leaves the others waiting: torchrun's own ending of them is tested through torchrun."""
    if not n:
        return [{}]
    with socket.socket() as s:  # a free port for the processes' rendezvous
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    return [{'RANK': str(r), 'LOCAL_RANK': str(r), 'WORLD_SIZE': str(n), 'LOCAL_WORLD_SIZE': str(n), 'GROUP_RANK': '0',
             'MASTER_ADDR': '127.0.0.1', 'MASTER_PORT': str(port)} for r in range(n)]


def serve():
    """A request per line of stdin, its results as one line of stdout, until stdin closes. The results go out on a
    descriptor of their own: anything else printed here (an import's message) goes to stderr."""
    global results_fd
    results_fd = os.dup(1)
    os.dup2(2, 1)
    preload()
    with os.fdopen(results_fd, 'w') as results:
        for line in sys.stdin:
            request = json.loads(line)
            results.write(json.dumps(run_all(request['runs'], request.get('environ'))) + '\n')
            results.flush()


if __name__ == '__main__':
    os.chdir(ROOT)
    sys.path[0] = ROOT  # as for a script in the repo root: its modules import as train.py's do
    if len(sys.argv) > 1 and sys.argv[1].startswith('--kill='):
        within, target, n, rank = sys.argv[1][len('--kill='):].split(':')
        first_attempt = os.environ.get('TORCHELASTIC_RESTART_COUNT', '0') == '0'
        chosen = first_attempt and os.environ.get('RANK', '0') == rank
        run(sys.argv[2:], (within, target, int(n)) if chosen else None)
    else:
        serve()
