"""
What train.py, sample.py and bench.py share, written once: config keys from the model dataclasses, the device's
precision and autocast, and reading a checkpoint.
"""
from contextlib import nullcontext
from dataclasses import fields

import torch

DTYPES = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}


def dataclass_defaults(cls, scope):
    """{key: default} of the dataclass's fields that `scope` (a script's globals) does not define yet, so that
    every model key becomes a config key of the script with the model's default."""
    return {f.name: f.default for f in fields(cls) if f.init and f.name not in scope}


def dataclass_values(cls, scope, **overrides):
    """{key: value} for the dataclass's fields, read from `scope` (a script's globals), then the overrides."""
    return {**{f.name: scope[f.name] for f in fields(cls) if f.init and f.name in scope}, **overrides}


def precision(device, dtype):
    """(device_type, torch dtype, autocast context) for a device string and a dtype name. CPU runs in float32
    without autocast; on CUDA the forward runs under autocast in the given dtype."""
    device_type = 'cuda' if 'cuda' in device else 'cpu'
    if device_type == 'cpu':
        return device_type, torch.float32, nullcontext()
    ptdtype = DTYPES[dtype]
    return device_type, ptdtype, torch.amp.autocast(device_type=device_type, dtype=ptdtype)


def load_checkpoint(path, device, hint="check out_dir"):
    """The checkpoint dict at `path`, or SystemExit with one `error:` line that says what to do."""
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except FileNotFoundError:
        raise SystemExit(f"error: no checkpoint at {path}; {hint}")
    except Exception as e:
        raise SystemExit(f"error: cannot read checkpoint {path} ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
                         f"it is corrupt or not ours: delete it, or point out_dir elsewhere")


def peak_flops(device):
    """Dense bf16 peak of this GPU in FLOP/s, for MFU; None where unknown (CPU)."""
    if 'cuda' not in device:
        return None
    name = torch.cuda.get_device_name(device)
    return next((f for key, f in (('H200', 989e12), ('H100', 989e12), ('A100', 312e12)) if key in name), None)
