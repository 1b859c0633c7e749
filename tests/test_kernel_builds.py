"""The Triton kernels compiled as a GPU compiles them, on any machine: tests/kernel_builds.py records each kernel's
launches from the rules' wrappers and builds each for a Hopper GPU (sm_90) as the launch would (kernel.warmup), and a
Python float argument also as fp64 (a launch inside a torch.compile graph). The interpreter (tests/test_kernels.py)
checks the values; this checks what only a compiler sees: types on every branch, tl.dot's shapes, registers and
spills. Each runs in a process of its own, without TRITON_INTERPRET."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT

triton = pytest.importorskip('triton', reason="triton is not installed (requirements-extras.txt)")


def run_python(code, *args, cwd=ROOT):
    env = {key: value for key, value in os.environ.items() if key != 'TRITON_INTERPRET'}
    out = subprocess.run([sys.executable, *code, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode in (0, 1), out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_kernel_builds_for_a_hopper_gpu():
    """Every kernel, every value of each compile-time flag, bfloat16 and float32 tensors (--quick: the full table is
    `python tests/kernel_builds.py`): each compiles, within the 255 registers a thread may hold, and none spills
    registers to memory (the tile shapes are chosen for it: machinery's `tiles`)."""
    rows = run_python(['tests/kernel_builds.py'], '--quick', '--json')
    assert {r['kernel'] for r in rows} == {'krause_forward_kernel', 'krause_backward_queries_kernel',
                                           'krause_backward_keys_kernel', 'tda_forward_kernel',
                                           'tda_backward_keys_kernel', 'tda_backward_queries_kernel'}
    failed = [f"{r['kernel']} ({r['setting']}, floats {r['floats']}): {r['error']}" for r in rows if not r['compiled']]
    assert not failed, '\n'.join(failed)
    assert all(0 < r['registers'] <= 255 for r in rows)
    spilled = [f"{r['kernel']} ({r['setting']}): {r['spill_bytes']} bytes" for r in rows if r['spill_bytes']]
    assert not spilled, '\n'.join(spilled)


GRAPH_CONFIGS = [dict(attention='krause', krause_window=32, krause_topk=16, mix=True, dropout=0.1),
                 dict(attention='tda', tda_matched=True, tda_p=3.0)]


@pytest.fixture(scope='module')
def compiled_graphs():
    """Each GRAPH_CONFIGS layer's graphs, traced in one process: torch and Dynamo imported once for both."""
    return run_python(['tests/kernel_builds.py'], '--graph', *map(json.dumps, GRAPH_CONFIGS))


@pytest.mark.parametrize('case', range(len(GRAPH_CONFIGS)), ids=['krause mix with dropout', 'tda matched p=3'])
def test_the_kernels_stay_inside_a_compiled_graph(case, compiled_graphs):
    """torch.compile(fullgraph=True) of a layer whose forward path is its kernel (as on CUDA; here traced, not run):
    no graph break, the forward kernel in the forward graph and the backward kernels in the backward graph."""
    graphs = compiled_graphs[case]
    rule = GRAPH_CONFIGS[case]['attention']
    backward = {'krause': ['krause_backward_queries_kernel', 'krause_backward_keys_kernel'],
                'tda': ['tda_backward_keys_kernel', 'tda_backward_queries_kernel']}[rule]  # dk, dv; then dq, dτ, dλ
    assert graphs == {'forward': [f'{rule}_forward_kernel'], 'backward': backward}


PROBE = '''
import torch
import triton
import triton.language as tl


@triton.jit
def power(x, p, P_MODE: tl.constexpr):  # an early return in fp32, a late one in p's type
    if P_MODE == 2:
        return x * x
    return tl.exp2(p * tl.log2(x))


@triton.jit
def probe_kernel(X, Y, p, P_MODE: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(Y + i, power(tl.load(X + i), p, P_MODE))


def run():
    x = torch.ones(16)
    probe_kernel[(1,)](x, x, 3.0, P_MODE=2, BLOCK=16)
'''


def test_a_float_argument_is_built_as_inductor_passes_it(tmp_path):
    """The builder's own check: a kernel whose helper returns fp32 on one branch and the float argument's type on
    another compiles with the float as fp32 and fails as fp64, as TDA's kernel failed inside torch.compile."""
    (tmp_path / 'probe.py').write_text(PROBE)
    code = textwrap.dedent(f'''
        import json, sys
        sys.path[:0] = [{str(ROOT / 'tests')!r}, {str(tmp_path)!r}]
        import kernel_builds, probe
        launches = kernel_builds.record(probe.run, [probe], lambda: 'probe')
        print(json.dumps([kernel_builds.compile_one(build) for build in kernel_builds.builds(launches)]))''')
    rows = {r['floats']: r for r in run_python(['-c', code])}
    assert rows['fp32']['compiled'], rows['fp32']
    assert not rows['fp64']['compiled'] and 'Inconsistent return types' in rows['fp64']['error']
