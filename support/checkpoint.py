"""
What a run keeps in out_dir, and what resuming from it needs: ckpt.pt (written atomically, read back with one clear
error, checked against the run that resumes it, with the RNG states that make the resumed run exact) and the metrics
log, log.jsonl, which a resumed run trims back to its checkpoint so that each iteration appears in it once.
"""
import json
import os
from typing import NamedTuple

import torch
import torch.distributed as dist

from attention import RENAMED_KEYS
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


def load_run(path, device='cpu', hint="train one first or pass --out_dir=DIR"):
    """The one way from a checkpoint to a model: `path` an out_dir or a ckpt.pt -> Run(model, config, meta, data_dir,
    iter_num). The model is a ViT for an image dataset, else a GPT (prepare.dataset_kind), its LoRA updates merged
    (one Linear per target: the same function, faster). data_dir: config['data_dir'] where the run recorded one, else
    its dataset's default folder (an older train.py recorded '' when none was typed). SystemExit with one `error:`
    line (load_checkpoint's) where the checkpoint cannot be read."""
    checkpoint = load_checkpoint(checkpoint_path(path), device, hint)
    if not isinstance(checkpoint, dict) or 'model_args' not in checkpoint or 'model' not in checkpoint:
        raise SystemExit(f"error: {checkpoint_path(path)} holds no model_args and model: it is not a train.py "
                         f"checkpoint; {hint}")
    config, meta = checkpoint.get('config', {}), checkpoint.get('meta', {})
    dataset = config.get('dataset')
    image = dataset_kind(dataset) == 'image' if dataset else meta.get('kind') == 'image'
    model = ViT(ViTConfig(**checkpoint['model_args'])) if image else GPT(GPTConfig(**checkpoint['model_args']))
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
    """Write `checkpoint` to `path` atomically (write_atomically)."""
    write_atomically(path, lambda tmp: torch.save(checkpoint, tmp))


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
