"""
Every Triton kernel in machinery/ compiled as a GPU compiles it, on a machine with or without one: each kernel's
launches are recorded from the rules' own wrappers (krause_band_attention, tda_attention, forward and backward, in
every setting the rules use), and each is built to a cubin for a Hopper GPU (sm_90) as the launch would build it
(kernel.warmup with the recorded arguments, so the same specialisation: integers and pointers divisible by 16), with
the ptxas that ships in the triton wheel. A kernel taking a Python float argument is also built with it as fp64, as a
launch inside a torch.compile graph passes it (Inductor). Prints one row per build: kernel, setting, compiled or the
error, registers, spilled bytes, shared memory, blocks per SM, and the longest loop's instructions and barriers.

$ python tests/kernel_builds.py   # the table; --quick: 12 builds that cover every flag; --json: the rows as JSON

--graph CONFIG [CONFIG ...]: the kernels inside torch.compile's forward and backward graphs of each config's attention
layer, traced with fullgraph=True (a graph break fails) and recorded, not run: a list, one entry per config. Run
without TRITON_INTERPRET (the interpreter's kernels are neither compiled nor traced); nothing is launched.
"""
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

os.environ.pop('TRITON_INTERPRET', None)  # before the kernels are defined: compiled kernels, not interpreted ones
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import machinery.kernels.krause as krause_kernel  # noqa: E402
import machinery.kernels.tda as tda_kernel  # noqa: E402

TARGET = ('cuda', 90, 32)  # Hopper (H100, H200): compute capability 9.0, warps of 32
DTYPES = {torch.float32: 'fp32', torch.bfloat16: 'bf16', torch.float16: 'fp16', torch.int32: 'i32'}


class Recorder:
    """Stands in for the kernel `module.name`: kernel[grid](*args, **kwargs) records the launch and runs nothing."""

    def __init__(self, module, name, setting, launches):
        self.where, self.setting, self.launches = (module.__name__, name), setting, launches

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((*self.where, self.setting(), args, kwargs))


def record(run, modules, setting):
    """The launches `run` makes through the kernels of `modules`, each kernel replaced by a Recorder meanwhile."""
    launches, saved = [], []
    for module in modules:
        for name, value in vars(module).items():
            if name.endswith('_kernel') and hasattr(value, 'arg_names'):
                saved.append((module, name, value))
                setattr(module, name, Recorder(module, name, setting, launches))
    try:
        run()
    finally:
        for module, name, value in saved:
            setattr(module, name, value)
    return launches


def krause_launches(W, topk, D, dtype):
    def run():
        q, k, v = (torch.randn(1, 2, 256, D, dtype=dtype, requires_grad=True) for _ in range(3))
        log_sigma = torch.zeros(2, requires_grad=True)
        krause_kernel.krause_band_attention(q, k, v, log_sigma, W, topk).sum().backward()
    return record(run, [krause_kernel], lambda: f"W={W} k={topk} D={D} {DTYPES[dtype]}")


def tda_launches(causal, two_views, d, p, dtype):
    def run():
        q1, k1, q2, k2 = (torch.randn(1, 2, 256, d, dtype=dtype, requires_grad=True) for _ in range(4))
        v = torch.randn(1, 2, 256, 64, dtype=dtype, requires_grad=True)
        tau = torch.rand(256, requires_grad=True)
        lam = torch.tensor(0.5, requires_grad=True)
        views = (q2, k2, lam) if two_views else (None, None, None)
        tda_kernel.tda_attention(q1, k1, views[0], views[1], v, tau, views[2], p, causal).sum().backward()
    setting = (f"{'causal' if causal else 'bidirectional'} {'two views' if two_views else 'one view'} d={d} p={p:g} "
               f"{DTYPES[dtype]}")
    return record(run, [tda_kernel], lambda: setting)


# the settings the rules launch: Krause's GPT band (its narrow and wide left tiles, head sizes 64 and 128) and TDA in
# each form (causal and not, two views and one, full and half-width views, p = 1, 2, 3); bfloat16 (training on a
# GPU), and float32
KRAUSE = [(32, 16, 64, torch.bfloat16), (256, 192, 64, torch.bfloat16), (256, 192, 128, torch.bfloat16),
          (32, 16, 64, torch.float32), (256, 192, 64, torch.float32)]
TDA = [(True, True, 64, 2.0, torch.bfloat16), (True, True, 32, 2.0, torch.bfloat16), (True, False, 64, 2.0, torch.bfloat16),
       (False, True, 64, 2.0, torch.bfloat16), (True, True, 64, 1.0, torch.bfloat16), (True, True, 64, 3.0, torch.bfloat16),
       (True, True, 64, 2.0, torch.float32)]
# --quick (the test suite's): every kernel and every value of each compile-time flag in bfloat16, and the forward
# kernels in float32 (a float32 backward takes ptxas 10-30 s), in 12 builds
QUICK_KRAUSE = KRAUSE[:2] + [(32, 16, 64, torch.float32)]
QUICK_TDA = [(True, True, 64, 2.0, torch.bfloat16), (False, False, 64, 3.0, torch.bfloat16),
             (True, True, 32, 1.0, torch.float32)]


def all_launches(quick=False):
    launches = []
    for W, topk, D, dtype in QUICK_KRAUSE if quick else KRAUSE:
        launches += krause_launches(W, topk, D, dtype)
    for causal, two_views, d, p, dtype in QUICK_TDA if quick else TDA:
        launches += tda_launches(causal, two_views, d, p, dtype)
    return launches


def arg_type(value, float_type):
    if isinstance(value, torch.Tensor):
        return '*' + DTYPES[value.dtype]
    if isinstance(value, bool):
        return 'i1'
    if isinstance(value, int):
        return 'i32' if -2 ** 31 <= value < 2 ** 31 else 'i64'
    if isinstance(value, float):
        return float_type
    raise TypeError(f"an argument of type {type(value).__name__}: add it to arg_type")


def builds(launches):
    """One build per distinct (kernel, argument types, constexprs, warps) of the recorded launches: each Python float
    argument as fp32 and as fp64."""
    seen, out = set(), []
    for module, name, setting, args, kwargs in launches:
        kernel = getattr(importlib.import_module(module), name)
        floats = ('fp32', 'fp64') if any(isinstance(a, float) for a in args) else ('fp32',)
        for float_type in floats:
            options = {key: kwargs[key] for key in ('num_warps', 'num_stages') if key in kwargs}
            constexprs = {key: value for key, value in kwargs.items() if key not in options}
            signature = {arg: arg_type(value, float_type) for arg, value in zip(kernel.arg_names, args)}
            key = (name, tuple(signature.values()), tuple(sorted(constexprs.items())), tuple(sorted(options.items())))
            if key not in seen:
                seen.add(key)
                out.append(dict(module=module, kernel=name, setting=setting, floats=float_type if len(floats) > 1 else '-',
                                signature=signature, constexprs=constexprs, options=options, kwargs=kwargs,
                                args=[a.detach() if isinstance(a, torch.Tensor) else a for a in args]))
    return out


def builds_to_run(quick):
    every = builds(all_launches(quick))
    return [b for b in every if 'fp32' not in b['setting'] or 'forward' in b['kernel']] if quick else every


def resource_usage(cubin, warps, shared):
    """What a GPU's driver would report for the loaded kernel, as the tools in the triton wheel read the cubin:
    registers per thread and the stack (where ptxas spills) from cuobjdump; the blocks an SM of a Hopper GPU holds at
    once (65,536 registers allocated 256 a warp, 228 KB of shared memory with 1 KB a block, 64 warps); and the
    longest loop's instructions and barriers per iteration (the SASS between a backward branch and its target)."""
    import triton
    tool = Path(triton.__file__).parent / 'backends' / 'nvidia' / 'bin' / 'cuobjdump'
    with tempfile.NamedTemporaryFile(suffix='.cubin') as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([str(tool), '--dump-resource-usage', f.name], capture_output=True, text=True).stdout
        sass = subprocess.run([str(tool), '--dump-sass', f.name], capture_output=True, text=True).stdout
    found = re.search(r'REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)', usage)
    registers = int(found[1])
    by_registers = 65536 // (-(-registers * 32 // 256) * 256 * warps)
    by_shared = 233472 // (shared + 1024)
    return dict(registers=registers, spill_bytes=int(found[2]) + int(found[3]),
                blocks_per_sm=min(by_registers, by_shared, 64 // warps, 32), **longest_loop(sass))


def longest_loop(sass):
    """{'loop_instructions', 'loop_barriers'} of the longest loop in a kernel's SASS (0, 0 without one)."""
    code = [(int(m[1], 16), m[2]) for m in re.finditer(r'/\*([0-9a-f]{4,})\*/\s+([^;]*);', sass)]
    loops = [(int(jump[1], 16), at) for at, text in code for jump in [re.search(r'BRA (0x[0-9a-f]+)', text)]
             if jump and int(jump[1], 16) < at]
    start, end = max(loops, key=lambda loop: loop[1] - loop[0]) if loops else (0, -1)
    body = [text for at, text in code if start <= at <= end]
    return dict(loop_instructions=len(body), loop_barriers=sum('BAR.' in text for text in body))


def error_line(e):
    """The innermost cause's last line of text: a CompilationError ends its own message with the source and a caret."""
    while e.__cause__ is not None:
        e = e.__cause__
    lines = [line.strip() for line in str(e).splitlines() if line.strip(' ^')]
    return (lines[-1] if lines else type(e).__name__)[:200]


def compile_one(build):
    """build's kernel compiled for TARGET: the row, with 'error' or its registers, spills and shared memory. As a
    launch compiles it (kernel.warmup with the recorded arguments: the same specialisation, e.g. an integer or a
    pointer divisible by 16, which lets the loads vectorise), and with a float argument as fp64, as Inductor passes
    it (triton.compile of the signature)."""
    import triton
    from triton.compiler import ASTSource
    from triton.backends.compiler import GPUTarget
    kernel = getattr(importlib.import_module(build['module']), build['kernel'])
    row = {key: build[key] for key in ('kernel', 'setting', 'floats')}
    triton.runtime.driver.set_active(HopperDriver())
    try:
        if build['floats'] == 'fp64':
            signature = {**build['signature'], **{key: 'constexpr' for key in build['constexprs']}}
            compiled = triton.compile(ASTSource(kernel, signature=signature, constexprs=build['constexprs']),
                                      target=GPUTarget(*TARGET), options=build['options'])
        else:
            compiled = kernel.warmup(*build['args'], grid=(1,), **build['kwargs'])
        row.update(compiled=True, shared_bytes=compiled.metadata.shared,
                   **resource_usage(compiled.asm['cubin'], compiled.metadata.num_warps, compiled.metadata.shared))
    except Exception as e:  # the row says why, and the table goes on
        row.update(compiled=False, error=error_line(e))
    return row


class HopperDriver:
    """What torch.compile asks triton's driver while it traces a kernel launch (the target it analyses the kernel
    for), on a machine without a GPU."""

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget
        return GPUTarget(*TARGET)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):  # a warmup asks, and launches nothing on it
        return 0


def graph_kernels(**config):
    """The kernels inside torch.compile's graphs of one attention layer (config: its rule's keys), forward and
    backward: {'forward': [kernel names], 'backward': [...]}. fullgraph=True, so a graph break fails; Dynamo and
    AOTAutograd trace with fake tensors and the graphs are recorded, not run (a backend that returns zeros)."""
    import torch.utils._triton
    import triton
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table
    import machinery.kernels.triton_available as available
    from rules import AttentionConfig, build_attention
    torch.utils._triton.has_triton = lambda: True  # Dynamo traces a triton launch where it finds a GPU
    triton.runtime.driver.set_active(HopperDriver())
    available.KERNEL_DEVICES, available.INTERPRETED = ('cuda', 'cpu'), True  # forward's path: the kernel, here too
    graphs = []

    def record(gm, example_inputs):
        graphs.append([kernel_side_table.get_kernel(node.kwargs['kernel_idx']).fn.__name__
                       for node in gm.graph.nodes if 'triton_kernel_wrapper' in str(node.target)])
        outputs = next(node for node in gm.graph.nodes if node.op == 'output').args[0]
        return make_boxed_func(lambda *args: [torch.zeros(o.meta['val'].shape, dtype=o.meta['val'].dtype)
                                              if isinstance(o, torch.fx.Node) else o for o in outputs])

    attn = build_attention(AttentionConfig(n_embd=32, n_head=2, block_size=128, **config), 0)
    assert attn.path_name('cpu') == 'kernel'
    compiled = torch.compile(attn, fullgraph=True, backend=aot_autograd(fw_compiler=record, bw_compiler=record))
    compiled(torch.randn(1, 128, 32, requires_grad=True)).sum().backward()
    return dict(zip(('forward', 'backward'), graphs))


def main():
    if '--graph' in sys.argv:  # each layer's graphs: --graph '{"attention": "krause", "mix": true}' '{...}'
        configs = [json.loads(arg) for arg in sys.argv[sys.argv.index('--graph') + 1:]]
        print(json.dumps([graph_kernels(**config) for config in configs]))
        return
    rows = list(ProcessPoolExecutor(max_workers=os.cpu_count() or 1).map(compile_one, builds_to_run('--quick' in sys.argv)))
    if '--json' in sys.argv:
        print(json.dumps(rows))
        return
    print(f"Triton kernels built for {TARGET[0]} sm_{TARGET[1]}: floats = how a Python float argument is passed "
          f"(fp32 eager, fp64 inside torch.compile; - none)")
    print('| kernel | setting | floats | compiled | registers | spilled bytes | shared bytes | blocks per SM | '
          'longest loop: instructions, barriers |')
    print('| --- | --- | --- | --- | --- | --- | --- | --- | --- |')
    for r in rows:
        result = ('yes', r['registers'], r['spill_bytes'], r['shared_bytes'], r['blocks_per_sm'],
                  f"{r['loop_instructions']}, {r['loop_barriers']}") if r['compiled'] else \
            (f"no: {r['error']}", '', '', '', '', '')
        print(f"| {r['kernel']} | {r['setting']} | {r['floats']} | " + ' | '.join(map(str, result)) + ' |')
    failed = sum(not r['compiled'] for r in rows)
    print(f"{len(rows) - failed} of {len(rows)} built")
    sys.exit(1 if failed else 0)


if __name__ == '__main__':
    main()
