"""
What train.py, sample.py and bench.py share, written once: config keys from the model dataclasses, checking them,
the device's precision and autocast, its peak FLOP/s, sums over DDP processes, an `error:` line said once under
torchrun, and what a long run says while it works (a GPU-sized run on a CPU, an evaluation's progress).
"""
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from ast import literal_eval
from contextlib import nullcontext, suppress
from dataclasses import fields

import torch
import torch.distributed as dist
import torch.nn as nn
from tqdm import tqdm

from rules import build_attention

DTYPES = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}


def dataclass_defaults(cls, scope):
    """{key: default} of the dataclass's fields that `scope` (a script's globals) does not define yet, so that
    every model key becomes a config key of the script with the model's default."""
    return {f.name: f.default for f in fields(cls) if f.init and f.name not in scope}


def dataclass_values(cls, scope, **overrides):
    """{key: value} for the dataclass's fields, read from `scope` (a script's globals), then the overrides."""
    return {**{f.name: scope[f.name] for f in fields(cls) if f.init and f.name in scope}, **overrides}


def check_attention_layers(config):
    """Build every attention layer of `config` once and throw it away, so that each rule's own checks (a ValueError
    naming the key, the rules' contract) run before any data is prepared. Linear's random init, nearly all of the
    time, is skipped: a 32-layer 4096-wide model's layers take a fraction of a second, one at a time in memory."""
    reset_parameters, nn.Linear.reset_parameters = nn.Linear.reset_parameters, lambda self: None
    try:
        with torch.no_grad():
            for layer_idx in range(config.n_layer):
                build_attention(config, layer_idx)
    except (RuntimeError, MemoryError) as e:  # a size of the rule's own (cluster_m=10**12): no allocation holds it
        if 'allocate' not in str(e) and not isinstance(e, MemoryError):
            raise
        default = type(config)()
        sizes = [f"{f.name}={getattr(config, f.name)}" for f in fields(config) if f.type in (int, 'int') and
                 getattr(config, f.name) != getattr(default, f.name)]
        raise ValueError(f"attention='{config.attention}': a layer of these sizes does not fit this machine's "
                         f"memory ({', '.join(sizes)}); pass smaller ones") from None
    finally:
        nn.Linear.reset_parameters = reset_parameters


def init_ddp(device):
    """(ddp, rank, local_rank, world_size, device) of this process. Under torchrun (RANK set) the process group is
    started, NCCL on CUDA with one GPU per local rank, gloo on the CPU; else one process, rank 0 of 1."""
    if int(os.environ.get('RANK', -1)) == -1:
        return False, 0, 0, 1, device
    rank, local_rank, world_size = (int(os.environ[k]) for k in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE'))
    if device.startswith('cuda'):
        device = f'cuda:{local_rank}'
        torch.cuda.set_device(device)
    dist.init_process_group(backend='nccl' if device.startswith('cuda') else 'gloo')
    return True, rank, local_rank, world_size, device


ERROR_WAIT_S = 30  # seconds: processes running the same code meet the same error well within it


def exit_with_error(message):
    """End the process with `message` as its `error:` line, exit code 1. Under torchrun every process runs the same
    checks and meets the same error: local rank 0 says it, first, and writes it to torchrun's error file, so that
    torchrun's summary names it as the root cause. The others say nothing and wait for torchrun to end them (it ends
    all as soon as one exits: one exiting first could end rank 0 before it says why); one still running after
    ERROR_WAIT_S met an error rank 0 did not, and says it then."""
    error_file = os.environ.get('TORCHELASTIC_ERROR_FILE')  # set by torchrun for each process
    if error_file and int(os.environ.get('LOCAL_RANK', 0)) != 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # ended quietly, whatever handler the script set
        time.sleep(ERROR_WAIT_S)
    if error_file:  # the format torch.distributed.elastic's ErrorHandler writes and its summary reads
        line = {'message': f"error: {message}", 'extraInfo': {'timestamp': str(int(time.time()))}}
        with suppress(OSError):
            with open(error_file, 'w') as f:
                json.dump({'message': line}, f)
    raise SystemExit(f"error: {message}")


def launch_torchrun(nproc):
    """train.py --nproc_per_node=N: this same command again as N processes of this node under torchrun (DDP), started
    once the settings are checked here (a bad one is said before any process starts). Their output passes through as
    it comes, but for the first `error:` line, said last: after torchrun's report, where the eye stops. Exits with
    torchrun's exit code."""
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', f'--nproc_per_node={nproc}', *sys.argv]
    sys.stdout.flush()
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C reaches torchrun too: it ends the processes
    signal.signal(signal.SIGTERM, lambda *_: proc.terminate())  # torchrun ends them, then exits
    held = pass_through(proc.stderr.fileno(), sys.stderr.buffer)
    code = proc.wait()
    sys.stderr.buffer.write(held or b'')
    raise SystemExit(code)


def pass_through(fd, out, hold=b'error: '):
    """Copy what comes from `fd` to `out` as it comes, but the first line that starts with `hold`: returned instead.
    A line is kept back only while it may still be that one."""
    held, line = None, b''
    for chunk in iter(lambda: os.read(fd, 1 << 16), b''):
        for piece in chunk.splitlines(keepends=True):
            line += piece
            if held is not None or not (line.startswith(hold) or hold.startswith(line)):
                out.write(line)
                line = b''
            elif line.endswith(b'\n'):  # whole, and it started as `hold` does
                if line.startswith(hold):
                    held = line
                else:
                    out.write(line)
                line = b''
        out.flush()
    out.write(line)
    out.flush()
    return held


def wait_for_rank0(ddp, rank):
    """The other processes wait here while rank 0 prepares the data. Where rank 0 stops instead (its `error:` line
    says why) the connection closes under them: they end as exit_with_error does, quietly."""
    if not ddp:
        return
    try:
        dist.barrier()
    except RuntimeError as e:  # gloo: 'Connection closed by peer'
        exit_with_error(f"rank {rank}: waiting for rank 0 to prepare the data failed ({str(e).splitlines()[0]}); "
                        f"the process that stopped first says why")


def precision(device, dtype):
    """(device_type, torch dtype, autocast context) for a device string and a dtype name. CPU runs in float32
    without autocast; on CUDA the forward runs under autocast in the given dtype."""
    device_type = 'cuda' if 'cuda' in device else 'cpu'
    if device_type == 'cpu':
        return device_type, torch.float32, nullcontext()
    ptdtype = DTYPES[dtype]
    return device_type, ptdtype, torch.amp.autocast(device_type=device_type, dtype=ptdtype)


PEAK_FLOPS = {'H200': 989e12, 'H100': 989e12, 'A100': 312e12}  # dense bf16 FLOP/s, by a name in the GPU's


def peak_flops(device):
    """Dense bf16 peak of this GPU in FLOP/s (PEAK_FLOPS), for MFU; None where unknown (CPU)."""
    if 'cuda' not in device:
        return None
    name = torch.cuda.get_device_name(device)
    return next((f for key, f in PEAK_FLOPS.items() if key in name), None)


def all_sum(values, device):
    """Sums of floats over all DDP processes (as they are without DDP)."""
    if not (dist.is_available() and dist.is_initialized()):
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


# -----------------------------------------------------------------------------
# a long run talks: what it is in for, and how far it is

QUIET_S = 5.0  # a pass over batches that ends sooner shows no bar
SIZE_KEYS = ('n_layer', 'n_head', 'n_embd', 'block_size', 'batch_size', 'gradient_accumulation_steps',
             'eval_iters')  # what a run's time grows with: named first where a run is sized for a GPU


def batch_progress(batches, desc, show=True):
    """`batches` (an iterable of known length) as a bar on stderr once QUIET_S seconds have passed, where `show` (the
    master process): an evaluation of a GPU-sized config on a CPU (200 batches a split) says how far it is, minutes
    before its result line; a quick one prints nothing. A bar shown ends in its last state and a newline, so that a
    log's next line starts clean."""
    return tqdm(batches, desc=desc, unit='batch', disable=not show, delay=QUIET_S, mininterval=2)


def note_cpu_recipe(what, script, recipe, settings, show=True):
    """Where `show` (the master process), say in one line that `what` is sized for a GPU and runs on a CPU, with its
    CPU recipe (`python script recipe`: arguments whose --key=value numbers are a CPU's sizes), and return the line;
    None on another device, without a recipe, or where the run already has every number the recipe sets (its names
    and paths, a rule or a data file, are the run's own)."""
    if not (show and recipe) or torch.device(settings['device']).type != 'cpu':
        return None
    differ = []
    for arg in shlex.split(recipe):
        key, _, text = arg[2:].partition('=')
        if arg.startswith('--') and type(settings.get(key)) in (int, float) and settings[key] != number(text):
            differ.append((key not in SIZE_KEYS, f"{key}={settings[key]}, not {text}"))
    if not differ:
        return None
    differ = [text for _, text in sorted(differ, key=lambda d: d[0])]  # the sizes first
    line = (f"note: {what} is sized for a GPU ({'; '.join(differ[:3])}{'; ...' if len(differ) > 3 else ''}) and "
            f"runs on the CPU here, which takes far longer; its CPU recipe: python {script} {recipe}")
    print(line)
    return line


def number(text):
    """The number a --key=value text is (as configurator.py reads it), else None."""
    try:
        return literal_eval(text)
    except (ValueError, SyntaxError):
        return None
