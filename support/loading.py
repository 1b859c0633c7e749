"""
Loading a run: a train.py checkpoint (ckpt.pt) read back with one clear error, and the one way from it to a model
(load_run: the model, its config, meta and data folder). A checkpoint whose model_args hold a key the model no longer
has (written by an older version) is one `error:` line, before any model is built.
"""
import os
from dataclasses import fields
from typing import NamedTuple

import torch

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


def load_checkpoint(path, device, hint="check out_dir"):
    """The checkpoint dict at `path`, or SystemExit with one `error:` line that says what to do: also where its
    model_args hold a key that neither model has any more (check_model_keys)."""
    try:
        checkpoint = torch.load(path, map_location=device, weights_only=True)
    except FileNotFoundError:
        raise SystemExit(f"error: no checkpoint at {path}; {hint}")
    except Exception as e:
        raise SystemExit(f"error: cannot read checkpoint {path} ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
                         f"it is corrupt or not ours: delete it, or point out_dir elsewhere")
    if isinstance(checkpoint, dict) and isinstance(checkpoint.get('model_args'), dict):
        check_model_keys(checkpoint['model_args'], path)
    return checkpoint


def check_model_keys(model_args, path):
    """SystemExit with one `error:` line naming the keys of model_args that neither GPTConfig nor ViTConfig has: a
    checkpoint of an older version, whose keys are not guessed at (a key's meaning may have changed with its name)."""
    known = {f.name for cls in (GPTConfig, ViTConfig) for f in fields(cls)}
    old = sorted(set(model_args) - known)
    if old:
        raise SystemExit(f"error: {path} was written by an older version, with model key(s) {', '.join(old)} that the "
                         f"model no longer has; retrain it, or rename the key(s) in its model_args to today's "
                         f"(python train.py --help lists them)")
