"""
A training run's hold on out_dir (RunDir): the lock (run.lock) that keeps a second run out, read through /proc
(alive) to tell a live holder from a dead one; the atomic writes whose failure (disk full) is one line saying what
is kept; Ctrl-C or SIGTERM as one such line; the metrics log, which keeps an earlier run's log.jsonl until this
run's first checkpoint; the line a run starts with where it resumes, or replaces another run; the line a run that
wrote no checkpoint ends in; and the cleanup at exit.
"""
import atexit
import json
import os
import signal
import socket
import sys
import threading
import time

from prepare.atomic import failure_line, permission_todo, write_atomically, write_text
from support.atomic import save_checkpoint
from support.loading import load_checkpoint
from support.metrics import MetricsLog
from support.resume import kept_checkpoint_line


class RunDir:
    """What a training run holds in out_dir, and the one line any stop ends in. Made before any setting is checked
    (nothing is written then): Ctrl-C (or SIGTERM, outside torchrun) from then on stops the run with one `error:`
    line saying what is kept and how to go on, exit code 130 (SIGTERM: 143). open() makes out_dir and, for a run that
    writes there, takes its lock, run.lock (created with O_EXCL, holding `pid host`): a lock of a live process refuses
    the run, naming the pid; one left by a dead process (a crash, kill -9) is taken over. At exit (atexit; after an
    error or Ctrl-C too) the lock is released and the folders open() made are removed where they are still empty.
    save() and write_json() write atomically; a failed write (disk full) or data gone mid-run (stop) ends the run in
    one line saying what is kept. A run that does not resume leaves an earlier run's ckpt.pt and log.jsonl byte for
    byte until its own first checkpoint (metrics_log: MetricsLog); a training run that ends with none says why
    (finish).
    saved_iter: the iteration of the checkpoint this run saved (or resumed from), None if neither."""

    def __init__(self, out_dir, master=True):
        self.out_dir, self.master = out_dir, master
        self.ckpt_path, self.lock_path = os.path.join(out_dir, 'ckpt.pt'), os.path.join(out_dir, 'run.lock')
        self.saved_iter, self.made, self.locked, self.interrupted = None, [], False, None  # interrupted: by what
        self.log, self.log_digest, self.writes = None, None, False
        signal.signal(signal.SIGINT, self.interrupt)
        if 'TORCHELASTIC_RESTART_COUNT' not in os.environ:  # under torchrun a worker's SIGTERM is from its agent,
            signal.signal(signal.SIGTERM, self.interrupt)  # after another worker failed and said why; alone: as Ctrl-C
        atexit.register(self.close)

    def kept(self):
        """What this run keeps: kept_checkpoint_line of its ckpt.pt (and of an earlier run's log.jsonl)."""
        return kept_checkpoint_line(self.saved_iter, self.ckpt_path, self.log is not None and self.log.earlier)

    def resume_from(self, checkpoint):
        """Note (and say) the checkpoint this run goes on from; its (iteration, best val loss)."""
        self.saved_iter, self.log_digest = checkpoint['iter_num'], checkpoint.get('log_digest')
        if self.master:
            print(f"resuming from {self.ckpt_path} at iteration {self.saved_iter}")
        return checkpoint['iter_num'], checkpoint['best_val_loss']

    def metrics_log(self, wandb_log=False):
        """The run's MetricsLog: trimmed back to the checkpoint it resumes from, or beside an earlier run's."""
        self.log = MetricsLog(self.out_dir, self.saved_iter, wandb_log, self.stop_on_failed_write, self.log_digest)
        return self.log

    def go_on(self):
        """How to go on after a stop: from this run's checkpoint where there is one."""
        return "then go on with --init_from=resume" if self.saved_iter is not None else "then run it again"

    def stop(self, what, todo):
        """End the run: `error: what; what is kept; todo, then how to go on`."""
        raise SystemExit(f"error: {what}; {self.kept()}; {todo}, {self.go_on()}")

    def interrupt(self, signum, frame):
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C stops the cleanup too
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # and a second SIGTERM
        self.interrupted = 'Ctrl-C' if signum == signal.SIGINT else signal.Signals(signum).name
        raise SystemExit(128 + signum)  # 130, 143: unwinds as KeyboardInterrupt would; close() says the rest

    def open(self, lock=True, replacing=False):
        """Make out_dir (noting the folders made) and, with lock, take its lock; SystemExit with one line where the
        folder cannot be made or another run holds it. replacing: this run starts anew (does not resume), so where
        out_dir holds another run's ckpt.pt, say which run its first checkpoint replaces and how to keep it."""
        folder = os.path.abspath(self.out_dir)
        while not os.path.exists(folder):
            self.made.append(folder)  # the deepest first
            folder = os.path.dirname(folder)
        try:
            os.makedirs(self.out_dir, exist_ok=True)
        except OSError as e:
            raise SystemExit(f"error: cannot make out_dir={self.out_dir} ({e.strerror}); pass --out_dir=A_FOLDER "
                             f"you can write to") from None
        if lock:
            self.take_lock()
        self.writes = lock
        if lock and replacing and os.path.exists(self.ckpt_path):
            print(self.replacing_line())

    def replacing_line(self):
        """What a new run in out_dir replaces at its first checkpoint: the run in its ckpt.pt (rule, dataset,
        iteration), and how to keep that run."""
        try:  # mmap: nothing of the weights is read
            earlier = load_checkpoint(self.ckpt_path, 'cpu', resume=True, mmap=True)
            config = earlier['config']
            what = (f"a {earlier['model_args'].get('attention', 'softmax')} run on {config.get('dataset', '?')} at "
                    f"iteration {earlier['iter_num']:,} of {config.get('max_iters', earlier['iter_num']):,}")
        except (SystemExit, AttributeError, TypeError, ValueError):  # damaged, not ours: replaced all the same
            what = "a ckpt.pt that is not a run train.py can go on from"
        return (f"note: out_dir={self.out_dir} holds {what}; this run replaces its ckpt.pt and log.jsonl at its first "
                f"checkpoint: to keep it, stop now and pass --out_dir=ANOTHER_DIR (or --init_from=resume to go on "
                f"with it)")

    def take_lock(self):
        for _ in range(5):  # a stale lock removed, then created again: another run may do the same at once
            try:
                fd = os.open(self.lock_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                holder = self.lock_holder()
                if holder:
                    raise SystemExit(f"error: out_dir={self.out_dir} is in use by another run ({holder}; "
                                     f"{self.lock_path}); wait for it to end or stop it, or pass another --out_dir")
                try:
                    os.remove(self.lock_path)  # left by a dead process: taken over
                except FileNotFoundError:
                    pass
                continue
            except OSError as e:  # a folder we may not write to
                raise SystemExit(f"error: {failure_line(self.lock_path, e)}; pass another --out_dir") from None
            try:
                with os.fdopen(fd, 'w') as f:
                    f.write(f"{os.getpid()} {socket.gethostname()}\n")
            except OSError as e:  # the disk full
                os.remove(self.lock_path)
                raise SystemExit(f"error: {failure_line(self.lock_path, e)}; free some space, or pass another "
                                 f"--out_dir") from None
            self.locked = True
            return
        raise SystemExit(f"error: cannot take {self.lock_path}: other runs keep taking it; pass another --out_dir")

    def lock_holder(self):
        """'pid N' (or 'pid N on host H') of a live run holding the lock; None where the lock is stale."""
        try:
            with open(self.lock_path) as f:
                pid, host = f.read().split()
            pid = int(pid)
        except FileNotFoundError:
            return None
        except (OSError, ValueError):  # being written this moment, or damaged: fresh means being taken
            try:
                return 'a lock being taken' if time.time() - os.path.getmtime(self.lock_path) < 10 else None
            except OSError:
                return None
        if host != socket.gethostname():  # a shared disk: that process cannot be looked at from here
            return f"pid {pid} on host {host}; if that run is gone, delete the lock"
        return f"pid {pid}" if pid != os.getpid() and alive(pid) else None

    def save(self, checkpoint):
        """save_checkpoint to ckpt.pt, then this run's pending log onto log.jsonl (MetricsLog.commit); a failed write
        ends the run in one line, the previous ckpt.pt as it was."""
        if self.log is not None and self.log.earlier:
            checkpoint = {**checkpoint, 'log_digest': self.log.pending_digest()}  # a kill before the log's rename
        try:
            save_checkpoint(checkpoint, self.ckpt_path)
        except (OSError, RuntimeError) as e:
            self.stop_on_failed_write(self.ckpt_path, e)
        if self.log is not None:
            self.log.commit()

    def finish(self, always_save_checkpoint, best_val_loss, start_iter, max_iters):
        """The end of a training run: where it wrote no checkpoint (and resumed from none), one line saying why and
        what is kept, exit code 1: a run asked for a model that ends without ckpt.pt is not a success."""
        if self.saved_iter is not None or not self.writes or not self.master:
            return
        if max_iters <= start_iter:
            why, todo = f"max_iters={max_iters} trains no iteration", f"pass --max_iters={start_iter + 1} or more"
        else:
            why = (f"the val loss never went below {best_val_loss:.4f}, iteration {start_iter}'s, and "
                   f"always_save_checkpoint=False writes a checkpoint only when it does")
            todo = "pass --always_save_checkpoint=True to keep the trained model, or lower learning_rate"
        raise SystemExit(f"error: {why}, so {self.kept().replace(' yet', '')}; {todo}")

    def write_json(self, name, obj):
        path = os.path.join(self.out_dir, name)
        try:
            write_atomically(path, lambda tmp: write_text(tmp, json.dumps(obj)))
        except OSError as e:
            self.stop_on_failed_write(path, e)

    def stop_on_failed_write(self, path, e):
        """End the run: the write of `path` failed (failure_line), what is kept, and to free space."""
        self.stop(failure_line(path, e), permission_todo(path, e) or "free some space (or raise the file size limit)")

    def close(self):
        """At exit: release the lock, drop a pending log that no checkpoint of this run took up, remove the empty
        folders open() made, and after Ctrl-C say what is kept."""
        if self.log is not None:
            try:
                self.log.discard()
            except OSError:
                pass
        if self.locked:
            try:
                with open(self.lock_path) as f:
                    mine = f.read().split()[:1] == [str(os.getpid())]
                if mine:
                    os.remove(self.lock_path)
            except OSError:
                pass
            self.locked = False
        for folder in self.made:
            try:
                os.rmdir(folder)
            except OSError:
                pass  # not empty: what it holds is kept
        self.made = []
        if self.interrupted and self.master:
            how, self.interrupted = self.interrupted, None
            print(f"error: interrupted ({how}); {self.kept()}; {self.go_on().removeprefix('then ')}",
                  file=sys.stderr, flush=True)
        elif threading.current_thread() is threading.main_thread():  # from here to the process's end, a signal
            signal.signal(signal.SIGINT, self.after_close)            # still says what is kept
            if 'TORCHELASTIC_RESTART_COUNT' not in os.environ:
                signal.signal(signal.SIGTERM, self.after_close)

    def after_close(self, signum, frame):
        """A signal once the run has ended (its files written, its lock released), as the process exits."""
        how = 'Ctrl-C' if signum == signal.SIGINT else signal.Signals(signum).name
        if self.master:
            print(f"error: interrupted ({how}) as the run was exiting; {self.kept()}", file=sys.stderr, flush=True)
        os._exit(128 + signum)


def alive(pid):
    """Whether process `pid` runs on this machine (a zombie, dead but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except (OSError, IndexError):
        return True

