"""
What a run keeps in out_dir, and what resuming from it needs: ckpt.pt (written atomically, read back with one clear
error, checked against the run that resumes it, with the RNG states that make the resumed run exact) and the metrics
log, log.jsonl, which a resumed run trims back to its checkpoint so that each iteration appears in it once.
"""
import json
import os

import torch
import torch.distributed as dist

from attention import RENAMED_KEYS


def load_checkpoint(path, device, hint="check out_dir"):
    """The checkpoint dict at `path`, or SystemExit with one `error:` line that says what to do. A checkpoint written
    before a config key was renamed (attention.RENAMED_KEYS) reads as if written with the new name."""
    try:
        checkpoint = torch.load(path, map_location=device, weights_only=True)
    except FileNotFoundError:
        raise SystemExit(f"error: no checkpoint at {path}; {hint}")
    except Exception as e:
        raise SystemExit(f"error: cannot read checkpoint {path} ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
                         f"it is corrupt or not ours: delete it, or point out_dir elsewhere")
    for settings in (checkpoint.get('model_args', {}), checkpoint.get('config', {})):
        for old, new in RENAMED_KEYS.items():
            if old in settings:
                settings[new] = settings.pop(old)
    if checkpoint.get('model_args', {}).get('krause_mix') and 'model' in checkpoint:  # the Krause branch of the mix
        # form was `krause` until the mix took any rule (MixAttention's `rule`)
        checkpoint['model'] = {k.replace('.attn.krause.', '.attn.rule.'): v for k, v in checkpoint['model'].items()}
    return checkpoint


def save_checkpoint(checkpoint, path):
    """Write `checkpoint` to `path` atomically: a temporary file, then a rename, so a crash never leaves half a file."""
    torch.save(checkpoint, path + '.tmp')
    os.replace(path + '.tmp', path)


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

    def __init__(self, out_dir, resumed_iter=None, wandb_log=False):
        self.path, self.wandb_log = os.path.join(out_dir, 'log.jsonl'), wandb_log
        kept_lines = []
        if resumed_iter is not None and os.path.exists(self.path):
            with open(self.path) as f:
                for line in f:
                    try:
                        if json.loads(line)['iter'] < resumed_iter:
                            kept_lines.append(line if line.endswith('\n') else line + '\n')
                    except (ValueError, KeyError, TypeError):
                        pass  # a line cut short by a kill mid-write
        with open(self.path + '.tmp', 'w') as f:
            f.writelines(kept_lines)
        os.replace(self.path + '.tmp', self.path)

    def write(self, record):
        with open(self.path, 'a') as f:
            f.write(json.dumps(record) + '\n')
        if self.wandb_log:
            import wandb  # train.py imported it and called wandb.init
            wandb.log(record, step=record['iter'])
