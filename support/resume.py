"""
Resuming a run from its checkpoint: whether this run may go on from it (check_resumable), the RNG states that make
the resumed run draw what an uninterrupted one would (rng_states, restore_rng_states), and what a stop can truthfully
say about the checkpoint it leaves to go on from (kept_checkpoint_line).
"""
import os

import torch
import torch.distributed as dist


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


def rng_states(device_type):
    """[{'cpu': state, 'cuda': state or None}] of every process, in rank order: each one's dropout stream. Under DDP
    every process must call it (an all-gather)."""
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


def kept_checkpoint_line(saved_iter, path, earlier_log=False):
    """What a stop can truthfully say about the checkpoint at `path`; saved_iter: the iteration this run saved
    there (or resumed from), None if neither. earlier_log: the folder's log.jsonl is an earlier run's, kept too."""
    if saved_iter is not None:
        return f"the last good checkpoint, iteration {saved_iter}, is kept in {path}"
    names = [name for name, there in (('ckpt.pt', os.path.exists(path)), ('log.jsonl', earlier_log)) if there]
    earlier = f" (the earlier run's {' and '.join(names)} in {os.path.dirname(path) or '.'} " \
              f"{'are kept as they were' if len(names) > 1 else 'is kept as it was'})" if names else ''
    return f"this run wrote no checkpoint yet{earlier}"
