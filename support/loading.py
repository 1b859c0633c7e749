"""
Loading a run: a train.py checkpoint (ckpt.pt) read back with one clear error, and the one way from it to a model
(load_run: the model, its config, meta and data folder). Every checkpoint is checked once, where it is loaded
(check_checkpoint): a file that is not a train.py checkpoint (another object pickled, model_args missing or of the
wrong types, a run's training state missing where it is resumed), or whose model_args hold a key the model no longer
has (written by an older version), is one `error:` line, before any model is built.
"""
import os
from dataclasses import fields
from typing import NamedTuple

import torch

from model import GPT, GPTConfig, merge_lora
from prepare import DATASETS, dataset_kind, default_data_dir
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
    config, meta = checkpoint.get('config', {}), checkpoint.get('meta', {})
    dataset = config.get('dataset')
    image = dataset_kind(dataset) == 'image' if dataset else meta.get('kind') == 'image'
    args = {**checkpoint['model_args'], **model_args}
    model = ViT(ViTConfig(**args)) if image else GPT(GPTConfig(**args))
    try:
        model.load_state_dict(checkpoint['model'])
    except RuntimeError as e:  # weights of another shape or names than its model_args make
        why = str(e).strip().splitlines()[-1].strip()[:200]
        raise SystemExit(f"error: {checkpoint_path(path)}: its weights do not fit its model_args ({why}): the "
                         f"checkpoint is damaged or not ours; {hint}") from None
    data_dir = config.get('data_dir') or (default_data_dir(dataset) if dataset else None)
    return Run(merge_lora(model).to(device).eval(), config, meta, data_dir, checkpoint.get('iter_num', 0))


def load_checkpoint(path, device, hint="check out_dir", resume=False, mmap=False):
    """The checkpoint dict at `path`, or SystemExit with one `error:` line that says what to do: also where it is not
    a train.py checkpoint, or not one a run can go on from where `resume` (check_checkpoint). mmap: its tensors are
    not read until used (a check before any work costs no memory)."""
    try:
        checkpoint = torch.load(path, map_location=device, weights_only=True, mmap=mmap)
    except FileNotFoundError:
        raise SystemExit(f"error: no checkpoint at {path}; {hint}")
    except Exception as e:
        raise SystemExit(f"error: cannot read checkpoint {path} ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
                         f"it is corrupt or not ours: delete it, or point out_dir elsewhere")
    check_checkpoint(checkpoint, path, hint, resume)
    return checkpoint


RESUME_KEYS = ('optimizer', 'iter_num', 'best_val_loss', 'config', 'rng', 'data_rng')  # what train.py goes on from


def check_checkpoint(checkpoint, path, hint, resume=False):
    """SystemExit with one `error:` line unless `checkpoint` is what train.py writes: a dict whose model_args are the
    model's keys with values of their types and whose model is a dict of tensors (config and meta dicts where
    present); with `resume`, also the training state a run goes on from (RESUME_KEYS)."""
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get('model_args'), dict) or \
            not isinstance(checkpoint.get('model'), dict):
        raise SystemExit(f"error: {path} holds no model_args and model: it is not a train.py checkpoint; {hint}")
    check_model_keys(checkpoint['model_args'], path)
    types = {f.name: type(f.default) for cls in (ViTConfig, GPTConfig) for f in fields(cls)}
    for key, value in checkpoint['model_args'].items():
        want = types[key]
        if not (type(value) is want or want is float and type(value) is int):
            what = {int: 'a whole number', float: 'a number', bool: 'True or False', str: 'a string'}[want]
            raise SystemExit(f"error: {path}: model_args {key}={value!r} is not {what}: the checkpoint is damaged or "
                             f"not ours; {hint}")
    bad = next((k for k, v in checkpoint['model'].items() if not isinstance(v, torch.Tensor)), None)
    bad = bad or next((k for k in ('config', 'meta') if not isinstance(checkpoint.get(k, {}), dict)), None)
    if bad is None and checkpoint.get('config', {}).get('dataset', 'recall') not in DATASETS:
        bad = f"config's dataset {checkpoint['config']['dataset']!r}"
    if bad is not None:
        raise SystemExit(f"error: {path}: {bad} is not what train.py writes there: the checkpoint is damaged or not "
                         f"ours; {hint}")
    missing = [k for k in RESUME_KEYS if k not in checkpoint]
    if resume and missing:
        raise SystemExit(f"error: {path} holds a model but not the training state a run goes on from (no "
                         f"{', '.join(missing)}): it is an export (merge_lora.py's) or another tool's; fine-tune from "
                         f"it with --init_from={path} and a new --out_dir, or --init_from=scratch")


def check_model_keys(model_args, path):
    """SystemExit with one `error:` line naming the keys of model_args that neither GPTConfig nor ViTConfig has: a
    checkpoint of an older version, whose keys are not guessed at (a key's meaning may have changed with its name)."""
    known = {f.name for cls in (GPTConfig, ViTConfig) for f in fields(cls)}
    old = sorted(set(model_args) - known)
    if old:
        raise SystemExit(f"error: {path} was written by an older version, with model key(s) {', '.join(old)} that the "
                         f"model no longer has; retrain it, or rename the key(s) in its model_args to today's "
                         f"(python train.py --help lists them)")
