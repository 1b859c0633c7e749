"""
What the Triton kernels (machinery/kernels/) share: whether they can run on a tensor's device (CUDA with triton
importable, or the CPU through triton's interpreter, TRITON_INTERPRET=1, set before the kernels are defined: the
tests, which also patch the interpreter, tests/triton_interpreter.py), where a rule takes them (KERNEL_DEVICES), and
their tile loads and launch strides. Without triton the kernel files still import (their kernels are then plain
functions never launched) and the rules take the paths they had.
"""
import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # an optional extra (requirements-extras.txt)
    triton = None

    class tl:  # what the kernels' signatures and constants name, so that their files import without triton
        constexpr = staticmethod(lambda value=None: value)


def jit(fn):
    return triton.jit(fn) if triton is not None else fn


INTERPRETED = os.environ.get('TRITON_INTERPRET', '0') not in ('', '0')  # read once, as triton.jit reads it


def interpreted():
    return INTERPRETED


def triton_runs_on(device):
    """True where a kernel can launch on `device` (a torch.device or a tensor's): CUDA compiled, or the CPU under the
    interpreter."""
    device = torch.device(device)
    if triton is None:
        return False
    return device.type == 'cpu' if interpreted() else device.type == 'cuda'


KERNEL_DEVICES = ('cuda',)  # where forward takes a rule's Triton kernel (kernel_on); tests add the interpreted CPU


def kernel_on(device):
    """True where forward runs a rule's Triton kernel (Attention.path_name): a device in KERNEL_DEVICES (CUDA) that
    triton runs on. Elsewhere the rule's math path computes the same function."""
    return torch.device(device).type in KERNEL_DEVICES and triton_runs_on(device)


def bh_t_strides(x):  # (B, H, T, n) with unit last stride -> its (batch, head, position) strides
    return x.stride(0), x.stride(1), x.stride(2)


def unit_last_stride(x):  # a view of the halves of q keeps its unit channel stride; anything else is copied
    return x if x.stride(-1) == 1 else x.contiguous()


@jit
def load_rows(ptr, stride_t, rows, cols, T, width):  # (len(rows), len(cols)) of a (T, width) matrix, 0 outside
    mask = (rows[:, None] >= 0) & (rows[:, None] < T) & (cols[None, :] < width)
    return tl.load(ptr + rows[:, None] * stride_t + cols[None, :], mask=mask, other=0.0)


def dot_precision(dtype):
    """tl.dot's input precision: float32 as float32 (not TF32, which rounds the scores a kernel selects on)."""
    return 'ieee' if dtype == torch.float32 else 'tf32'
