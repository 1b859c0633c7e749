"""
What a run keeps in out_dir, and what resuming from it needs: ckpt.pt (written atomically, read back with one clear
error, checked against the run that resumes it, with the RNG states that make the resumed run exact) and the metrics
log, log.jsonl, which a resumed run trims back to its checkpoint so that each iteration appears in it once.

A training run holds its out_dir through a RunDir: the lock (run.lock) that keeps a second run out, the atomic writes
whose failure (disk full) is one line saying what is kept, Ctrl-C as one such line, and the cleanup at exit.
"""
import atexit
import json
import os
import signal
import socket
import sys
import time
from typing import NamedTuple

import torch
import torch.distributed as dist

RENAMED_KEYS = {}  # TEMP
from model import GPT, GPTConfig, merge_lora
from prepare import dataset_kind, default_data_dir
from vit import ViT, ViTConfig


class Run(NamedTuple):
    """What a checkpoint holds, ready to use (load_run)."""
    model: object       # GPT or ViT, eval mode, on the device, LoRA merged
    config: dict        # train.py's config of the run ({} for a checkpoint written without one)
    meta: dict          # the dataset's meta.json as the run saw it: what its tokens or images are
    data_dir: str       # the run's data folder: the one it recorded, else its dataset's default (None if unknown)
    iter_num: int       # the iteration the checkpoint was written at


def checkpoint_path(path):
    """An out_dir's ckpt.pt, or `path` itself where it names a checkpoint file."""
    return path if os.path.isfile(path) or str(path).endswith('.pt') else os.path.join(path, 'ckpt.pt')


def load_run(path, device='cpu', hint="train one first or pass --out_dir=DIR", **model_args):
    """The one way from a checkpoint to a model: `path` an out_dir or a ckpt.pt -> Run(model, config, meta, data_dir,
    iter_num). The model is a ViT for an image dataset, else a GPT (prepare.dataset_kind), its LoRA updates merged
    (one Linear per target: the same function, faster). data_dir: config['data_dir'] where the run recorded one, else
    its dataset's default folder (an older train.py recorded '' when none was typed). model_args: settings that change
    no weight, over the checkpoint's (extrapolate.py's rope_scaling); a bad one is a ValueError naming it. SystemExit
    with one `error:` line (load_checkpoint's) where the checkpoint cannot be read."""
    checkpoint = load_checkpoint(checkpoint_path(path), device, hint)
    if not isinstance(checkpoint, dict) or 'model_args' not in checkpoint or 'model' not in checkpoint:
        raise SystemExit(f"error: {checkpoint_path(path)} holds no model_args and model: it is not a train.py "
                         f"checkpoint; {hint}")
    config, meta = checkpoint.get('config', {}), checkpoint.get('meta', {})
    dataset = config.get('dataset')
    image = dataset_kind(dataset) == 'image' if dataset else meta.get('kind') == 'image'
    args = {**checkpoint['model_args'], **model_args}
    model = ViT(ViTConfig(**args)) if image else GPT(GPTConfig(**args))
    model.load_state_dict(checkpoint['model'])
    data_dir = config.get('data_dir') or (default_data_dir(dataset) if dataset else None)
    return Run(merge_lora(model).to(device).eval(), config, meta, data_dir, checkpoint.get('iter_num', 0))


def migrate_krause_mix(settings):
    """krause_mix=True (the older spelling, Krause only) read as mix=True: mix = mix or (krause_mix and krause)."""
    if 'krause_mix' in settings:
        krause_mix = settings.pop('krause_mix')
        settings['mix'] = bool(settings.get('mix')) or bool(krause_mix and settings.get('attention') == 'krause')


def load_checkpoint(path, device, hint="check out_dir"):
    """The checkpoint dict at `path`, or SystemExit with one `error:` line that says what to do. A checkpoint written
    before a config key was renamed (attention.RENAMED_KEYS) reads as if written with the new name; krause_mix=True,
    mix's older spelling for Krause, as mix=True."""
    try:
        checkpoint = torch.load(path, map_location=device, weights_only=True)
    except FileNotFoundError:
        raise SystemExit(f"error: no checkpoint at {path}; {hint}")
    except Exception as e:
        raise SystemExit(f"error: cannot read checkpoint {path} ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
                         f"it is corrupt or not ours: delete it, or point out_dir elsewhere")
    if checkpoint.get('model_args', {}).get('krause_mix') and 'model' in checkpoint:  # the Krause branch of the mix
        # form was `krause` until the mix took any rule (MixAttention's `rule`)
        checkpoint['model'] = {k.replace('.attn.krause.', '.attn.rule.'): v for k, v in checkpoint['model'].items()}
    for settings in (checkpoint.get('model_args', {}), checkpoint.get('config', {})):
        migrate_krause_mix(settings)  # not the plain rename below: it would overwrite mix, and only Krause mixed
        for old, new in RENAMED_KEYS.items():
            if old in settings:
                settings[new] = settings.pop(old)
    return checkpoint


def write_atomically(path, write):
    """write(temporary path), then a rename onto `path`: a reader sees the old file or the new one, never half of
    one. Where writing fails (disk full, a missing folder, Ctrl-C) the temporary file is removed and the error
    raised again: nothing is left behind, and `path` is as it was."""
    tmp = f"{path}.tmp"
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def save_checkpoint(checkpoint, path):
    """Write `checkpoint` to `path` atomically (write_atomically). Through a Python file, so that a failed write
    (disk full) is an OSError behind torch's RuntimeError, which write_failed reads."""
    def write(tmp):
        with open(tmp, 'wb') as f:
            torch.save(checkpoint, f)
    write_atomically(path, write)


def write_text(path, text):
    with open(path, 'w') as f:
        f.write(text)


def write_failed(path, e):
    """'cannot write PATH (why)': the OSError's words (No space left on device, File too large) where there is one,
    also where torch.save raised a RuntimeError for it."""
    cause = e
    while cause is not None and not isinstance(cause, OSError):
        cause = cause.__cause__ or cause.__context__
    if cause is not None:
        return f"cannot write {path} ({cause.strerror or cause})"
    return f"cannot write {path} ({type(e).__name__}: {(str(e).splitlines() or [''])[0][:150]})"


def write_or_exit(path, write, kept, todo):
    """write_atomically(path, write) for a script's output; where it fails (a missing folder, no permission, the disk
    full) the temporary file is gone and the script ends in one `error:` line: what failed (write_failed), what was
    kept (`kept`), what to do (`todo`)."""
    try:
        write_atomically(path, write)
    except (OSError, RuntimeError) as e:
        raise SystemExit(f"error: {write_failed(path, e)}; {kept}; {todo}") from None


def check_resumable(checkpoint, path, model_args, dataset, max_iters, defaults=None):
    """ValueError unless the checkpoint at `path` is of this run's model and dataset, and not past its max_iters.
    defaults: the model's default settings, which a checkpoint written before a key existed was made with."""
    theirs = {**(defaults or {}), **checkpoint['model_args']}
    differ = [f"{k}={theirs.get(k)!r} (this run: {v!r})" for k, v in model_args.items() if theirs.get(k) != v]
    if checkpoint['config'].get('dataset') != dataset:
        differ.append(f"dataset={checkpoint['config'].get('dataset')!r} (this run: {dataset!r})")
    if differ:
        raise ValueError(f"checkpoint {path} is from another config: {', '.join(differ)}; "
                         f"resume with the settings it was trained with, or use a new out_dir")
    if checkpoint['iter_num'] > max_iters:
        raise ValueError(f"checkpoint {path} is at iteration {checkpoint['iter_num']}, past max_iters={max_iters}; "
                         f"pass --max_iters={checkpoint['iter_num']} or more to go on from it, or use a new out_dir")


def kept(saved_iter, path):
    """What a stop can truthfully say about the checkpoint at `path`; saved_iter: the iteration this run saved
    there (or resumed from), None if neither."""
    if saved_iter is not None:
        return f"the last good checkpoint, iteration {saved_iter}, is kept in {path}"
    earlier = f" ({path} is from an earlier run)" if os.path.exists(path) else ''
    return f"this run wrote no checkpoint yet{earlier}"


# -----------------------------------------------------------------------------
# the run's hold on out_dir

class RunDir:
    """What a training run holds in out_dir, and the one line any stop ends in. Made before any setting is checked
    (nothing is written then): Ctrl-C from then on stops the run with one `error:` line saying what is kept and how
    to go on, exit code 130. open() makes out_dir and, for a run that writes there, takes its lock, run.lock (created
    with O_EXCL, holding `pid host`): a lock of a live process refuses the run, naming the pid; one left by a dead
    process (a crash, kill -9) is taken over. At exit (atexit; after an error or Ctrl-C too) the lock is released and
    the folders open() made are removed where they are still empty. save() and write_json() write atomically; a
    failed write (disk full) or data gone mid-run (stop) ends the run in one line saying what is kept.
    saved_iter: the iteration of the checkpoint this run saved (or resumed from), None if neither."""

    def __init__(self, out_dir, master=True):
        self.out_dir, self.master = out_dir, master
        self.ckpt_path, self.lock_path = os.path.join(out_dir, 'ckpt.pt'), os.path.join(out_dir, 'run.lock')
        self.saved_iter, self.made, self.locked, self.interrupted = None, [], False, False
        signal.signal(signal.SIGINT, self.interrupt)
        atexit.register(self.close)

    def kept(self):
        return kept(self.saved_iter, self.ckpt_path)

    def go_on(self):
        """How to go on after a stop: from this run's checkpoint where there is one."""
        return "then go on with --init_from=resume" if self.saved_iter is not None else "then run it again"

    def stop(self, what, todo):
        """End the run: `error: what; what is kept; todo, then how to go on`."""
        raise SystemExit(f"error: {what}; {self.kept()}; {todo}, {self.go_on()}")

    def interrupt(self, signum, frame):
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C stops the cleanup too
        self.interrupted = True
        raise SystemExit(130)  # unwinds as KeyboardInterrupt would (temporary files removed); close() says the rest

    def open(self, lock=True):
        """Make out_dir (noting the folders made) and, with lock, take its lock; SystemExit with one line where the
        folder cannot be made or another run holds it."""
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
                raise SystemExit(f"error: {write_failed(self.lock_path, e)}; pass another --out_dir") from None
            try:
                with os.fdopen(fd, 'w') as f:
                    f.write(f"{os.getpid()} {socket.gethostname()}\n")
            except OSError as e:  # the disk full
                os.remove(self.lock_path)
                raise SystemExit(f"error: {write_failed(self.lock_path, e)}; free some space, or pass another "
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
        """save_checkpoint to ckpt.pt; a failed write ends the run in one line, the previous ckpt.pt as it was."""
        try:
            save_checkpoint(checkpoint, self.ckpt_path)
        except (OSError, RuntimeError) as e:
            self.write_failed(self.ckpt_path, e)

    def write_json(self, name, obj):
        path = os.path.join(self.out_dir, name)
        try:
            write_atomically(path, lambda tmp: write_text(tmp, json.dumps(obj)))
        except OSError as e:
            self.write_failed(path, e)

    def write_failed(self, path, e):
        self.stop(write_failed(path, e), "free some space (or raise the file size limit)")

    def close(self):
        """At exit: release the lock, remove the empty folders open() made, and after Ctrl-C say what is kept."""
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
            self.interrupted = False
            print(f"error: interrupted (Ctrl-C); {self.kept()}; {self.go_on().removeprefix('then ')}",
                  file=sys.stderr, flush=True)


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


# -----------------------------------------------------------------------------
# RNG states: each process's dropout stream, so that a resumed run draws what an uninterrupted one would

def rng_states(device_type):
    """[{'cpu': state, 'cuda': state or None}] of every process, in rank order; under DDP every process must call
    it (an all-gather)."""
    state = {'cpu': torch.get_rng_state(), 'cuda': torch.cuda.get_rng_state() if device_type == 'cuda' else None}
    if not (dist.is_available() and dist.is_initialized()):
        return [state]
    states = [None] * dist.get_world_size()
    dist.all_gather_object(states, {k: (v.cpu() if v is not None else None) for k, v in state.items()})
    return states


def restore_rng_states(states, rank, world_size, device_type):
    """Process `rank` continues its own dropout stream where the checkpoint has one per process (else it keeps the
    fresh seed's). RNG states must be CPU ByteTensors, and load_checkpoint mapped every tensor to the device."""
    if len(states) == world_size:
        torch.set_rng_state(states[rank]['cpu'].cpu())
        if device_type == 'cuda' and states[rank]['cuda'] is not None:
            torch.cuda.set_rng_state(states[rank]['cuda'].cpu())


# -----------------------------------------------------------------------------
# the metrics log: out_dir/log.jsonl, one JSON object a line ('train' every log_interval, 'eval' every evaluation)

class MetricsLog:
    """out_dir/log.jsonl, written by rank 0, and the same records to wandb where it is on. A resumed run first drops
    every record from its checkpoint's iteration on (written after that checkpoint by a run that then died, and
    about to be written again), so after any kill each iteration appears once."""

    def __init__(self, out_dir, resumed_iter=None, wandb_log=False, failed=None):
        """failed(path, error): what a failed write (disk full) does, e.g. RunDir.write_failed; None: raise it."""
        self.path, self.wandb_log, self.failed = os.path.join(out_dir, 'log.jsonl'), wandb_log, failed
        kept_lines = []
        if resumed_iter is not None and os.path.exists(self.path):
            with open(self.path) as f:
                for line in f:
                    try:
                        if json.loads(line)['iter'] < resumed_iter:
                            kept_lines.append(line if line.endswith('\n') else line + '\n')
                    except (ValueError, KeyError, TypeError):
                        pass  # a line cut short by a kill mid-write
        self.guarded(write_atomically, self.path, lambda tmp: write_text(tmp, ''.join(kept_lines)))

    def guarded(self, write, *args):
        try:
            write(*args)
        except OSError as e:
            if self.failed is None:
                raise
            self.failed(self.path, e)

    def write(self, record):
        self.guarded(self.append, json.dumps(record) + '\n')
        if self.wandb_log:
            import wandb  # train.py imported it and called wandb.init
            wandb.log(record, step=record['iter'])

    def append(self, line):
        with open(self.path, 'a') as f:
            f.write(line)
