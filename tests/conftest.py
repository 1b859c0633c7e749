"""Shared test helpers: the repo on sys.path, the offline data samples (skipped with a reason where absent),
running the scripts as a user would (forked from one process per session that imported torch once), the runs that
several test files read, and the cases of the tests that run every rule (each on what it declares)."""
import atexit
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
from dataclasses import fields
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / 'shared' / 'data'
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / 'tests'))
import triton_interpreter  # noqa: E402
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"offline data samples not found at {SHARED}")
if (SHARED / 'tiktoken_cache').is_dir():
    os.environ.setdefault('TIKTOKEN_CACHE_DIR', str(SHARED / 'tiktoken_cache'))
# one thread, as the scripts run here get (OMP_NUM_THREADS=1): the tests' tensors are tiny, and a second thread on a
# busy core makes each op wait for it (a 30-token generation took 12 s on 2 threads of a shared machine, 0.07 s on 1)
torch.set_num_threads(1)
# without a GPU the Triton kernels (machinery/kernels/, tests/test_kernels.py) run through triton's interpreter,
# which a kernel reads when it is defined: set before any test module imports one (nothing else here runs triton),
# and the interpreter patched to compute as a GPU does (tests/triton_interpreter.py)
if not torch.cuda.is_available():
    os.environ.setdefault('TRITON_INTERPRET', '1')
    triton_interpreter.patch()


def qkv(T, B=2, H=3, D=8, seed=0):
    """The rule tests' q, k, v: (B, H, T, D) each, float64, standard normal from `seed`, requiring gradients."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, D, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3)]


def paths_match(paths, args, ref, wrt=None, names=None, tol=1e-10, grad_tol=None, nonzero=lambda name: True):
    """Each path (a rule's attend_reference, attend, ...) called on `args` equals `ref`, the test's own float64
    reference from the formula: its output within tol, and the gradients of `wrt` (default: args; named `names`)
    within grad_tol (default: tol). The reference's gradient of each name `nonzero` says is not trivially zero."""
    wrt, g = list(args if wrt is None else wrt), torch.randn_like(ref)
    names = names or [f'input {i}' for i in range(len(wrt))]
    grads_ref = torch.autograd.grad(ref, wrt, g)
    for path in paths:
        y = path(*args)
        torch.testing.assert_close(y, ref, atol=tol, rtol=tol, msg=path.__name__)
        for name, a, b in zip(names, torch.autograd.grad(y, wrt, g), grads_ref):
            assert not nonzero(name) or b.abs().sum() > 0, name
            torch.testing.assert_close(a, b, atol=grad_tol or tol, rtol=grad_tol or tol,
                                       msg=f'{path.__name__}: gradient of {name}')


def build_layer(attention, T, layer_idx=0, n_head=3, head_dim=8, **keys):
    """The rule tests' layer: attention=<attention> at n_head heads of head_dim (n_embd in keys overrides it),
    block_size T, in float64; keys: any other config keys. A test file binds its rule's own parameters after it."""
    from rules import AttentionConfig, build_attention  # after the interpreter is set: a rule imports its kernel
    config = AttentionConfig(**{**dict(n_embd=n_head * head_dim, n_head=n_head, block_size=T, attention=attention),
                                **keys})
    return build_attention(config, layer_idx).double()


def run_script(*args, launcher=None, ddp=0, check=True, timeout=600, cwd=ROOT):
    """Run a repo script as `python script args` runs it, on one CPU thread, from the repo root unless cwd says
    otherwise; return its combined output. A .py file is forked from a process that imported torch and this repo's
    modules once (run_forked): the same run without two seconds of imports; ddp=N: as N processes of
    `torchrun --standalone --nproc_per_node=N`, forked with the variables torchrun sets. Anything else (`-c`, a
    launcher such as torchrun, or (sys.executable,) for an interpreter of its own) runs as a subprocess."""
    if launcher is None and str(args[0]).endswith('.py'):
        (code, out), = run_forked({'argv': [str(a) for a in args], 'cwd': str(cwd), 'ddp': ddp}, timeout=timeout)
        stdout, stderr = out, ''
    else:
        env = {**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONUNBUFFERED': '1'}
        proc = subprocess.run([*(launcher or (sys.executable,)), *map(str, args)], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=timeout)
        code, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    if check and code != 0:
        raise AssertionError(f"{args} failed ({code}):\n{stdout[-3000:]}\n{stderr[-3000:]}")
    return stdout + stderr


class Forker:
    """tests/faults.py, one process for the test session: it imports torch and the repo once and forks a child per
    run, in the caller's environment of the moment (what its own imports read from the environment, they read when it
    started)."""

    def __init__(self, root=ROOT):
        self.log = tempfile.TemporaryFile()  # its own messages (its children write to pipes of their own)
        env = {**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONUNBUFFERED': '1'}
        self.proc = subprocess.Popen([sys.executable, str(root / 'tests' / 'faults.py')], cwd=root, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     start_new_session=True)

    def request(self, request, timeout):
        self.proc.stdin.write(json.dumps(request) + '\n')
        self.proc.stdin.flush()
        if not select.select([self.proc.stdout], [], [], timeout)[0]:
            raise subprocess.TimeoutExpired('tests/faults.py', timeout)
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            self.log.seek(0)
            raise AssertionError(f"tests/faults.py ended ({self.proc.returncode}):\n"
                                 f"{self.log.read().decode(errors='replace')[-3000:]}")
        return json.loads(line)

    def stop(self):
        """End it and the run it is in (its session: its process group)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def close(self):
        self.proc.stdin.close()  # it ends when its stdin does
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.stop()


forker = None


def run_forked(*runs, timeout=300, root=ROOT):
    """Each run ({'argv': [script, *args], 'kill': [within, target, n] or None, ...}, see tests/faults.py) as a process
    of its own, forked from one that imported torch and the repo once for the session: [(exit code, output)], in
    order; -9 is SIGKILL. With another root (a copy of the repo, its tests/faults.py included), from one that imported
    that copy's modules, for these runs alone."""
    global forker
    environ = {**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONUNBUFFERED': '1'}
    request = {'runs': runs, 'environ': environ}
    if Path(root) != ROOT:
        other = Forker(Path(root))
        try:
            results = other.request(request, timeout)
        except BaseException:
            other.stop()
            raise
        other.close()
        return [(r['rc'], r['out']) for r in results]
    if forker is None:
        forker = Forker()
        atexit.register(forker.close)
    try:
        results = forker.request(request, timeout)
    except BaseException:  # a timeout, Ctrl-C, or the forker gone: the next call starts another
        forker.stop()
        forker = None
        raise
    return [(r['rc'], r['out']) for r in results]


def checkout_files():
    """{path: (size, mtime)} of every file in the checkout but git's and Python's caches: the same before and after a
    test that writes nothing there (only under its temporary folders)."""
    found = {}
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in ('.git', '__pycache__', '.pytest_cache')]
        for name in files:
            stat = os.stat(os.path.join(folder, name))
            found[os.path.join(folder, name)] = (stat.st_size, stat.st_mtime_ns)
    return found


def write_tiny_cifar(folder):
    """A prepared 'cifar10' folder (prepare/cifar.py's files) of random 4x4 RGB images, 6 train and 5 val."""
    import numpy as np
    folder.mkdir()
    rng = np.random.default_rng(0)
    for split, n in (('train', 6), ('val', 5)):
        np.save(folder / f'{split}_x.npy', rng.integers(0, 256, (n, 4, 4, 3), dtype=np.uint8))
        np.save(folder / f'{split}_y.npy', rng.integers(0, 10, n))
    (folder / 'meta.json').write_text(json.dumps({'kind': 'image', 'dataset': 'cifar10', 'label': 'label',
                                                  'num_classes': 10, 'classes': [], 'counts': {'train': 6, 'val': 5}}))
    return folder


def checkpoint(model, dataset, meta, **extra):
    """What train.py writes for `model`, but the optimizer and RNG states (nothing here resumes a good one)."""
    args = {f.name: getattr(model.config, f.name) for f in fields(model.config) if f.init}
    return {'model': model.state_dict(), 'model_args': args, 'iter_num': 1, 'best_val_loss': 1.0,
            'config': {'dataset': dataset, 'data_dir': meta.pop('data_dir', '')}, 'meta': meta, **extra}


TEXT_RUN = ['--dataset=shakespeare_char', '--n_layer=1', '--n_embd=32', '--n_head=2', '--block_size=32',
            '--batch_size=4', '--eval_iters=1', '--device=cpu', '--compile=False', '--warmup_iters=1',
            '--lr_decay_iters=4']
PIXEL_RUN = ['--dataset=cifar10_pixels', '--block_size=47', '--n_layer=1', '--n_head=2', '--n_embd=16',
             '--batch_size=2', '--eval_iters=2', '--device=cpu', '--compile=False', '--warmup_iters=1',
             '--lr_decay_iters=3', '--max_iters=1', '--eval_interval=1']


@pytest.fixture(scope='session')
def trained_runs(tmp_path_factory):
    """Trained once for the session, in one batch of forked runs, for the tests of what scripts do with a checkpoint
    (test_loading.py, test_script_errors.py): a character GPT (base, 4 iterations), a LoRA fine-tune of it (lora) and
    its merged export (lora/merged.pt), a pixel GPT on 4x4 CIFAR-like images (pixels). The folder (its input.txt the
    character model's text) and {name: (exit code, output)}."""
    d = tmp_path_factory.mktemp('trained')
    (d / 'input.txt').write_text(''.join(f"line {i}: the quick brown fox jumps over the lazy dog.\n"
                                         for i in range(400)))
    images = write_tiny_cifar(d / 'cifar10')
    text = [*TEXT_RUN, f'--data_source={d / "input.txt"}', f'--data_dir={d / "chars"}']
    names = ['base', 'lora', 'merge', 'pixels']
    return d, dict(zip(names, run_forked(
        {'argv': ['train.py', *text, f'--out_dir={d / "base"}', '--max_iters=4', '--eval_interval=2',
                  '--learning_rate=1e-2']},
        {'argv': ['train.py', *text, f'--out_dir={d / "lora"}', f'--init_from={d / "base" / "ckpt.pt"}',
                  '--lora_rank=2', '--max_iters=4', '--eval_interval=4', '--learning_rate=3e-2']},
        {'argv': ['studies/merge_lora.py', f'--ckpt={d / "lora" / "ckpt.pt"}', f'--out={d / "lora" / "merged.pt"}']},
        {'argv': ['train.py', *PIXEL_RUN, f'--data_dir={images}', f'--out_dir={d / "pixels"}']})))


def iter_losses(log):
    """{iteration: loss} from train.py's `iter {n}: loss {x}` lines."""
    return {int(n): float(x) for n, x in re.findall(r"^iter (\d+): loss ([\d.naninf]+)", log, re.M)}


def assert_causal(model, T, cut, vocab=11):
    """Changing the tokens from position `cut` on changes the GPT's logits there and nowhere before."""
    idx = torch.randint(0, vocab, (2, T))
    changed = idx.clone()
    changed[:, cut:] = (changed[:, cut:] + 1) % vocab
    with torch.no_grad():
        a, _ = model(idx, idx)
        b, _ = model(changed, changed)
    assert torch.equal(a[:, :cut], b[:, :cut])
    assert not torch.equal(a[:, cut:], b[:, cut:])


def cached_generation_equals_the_forward(model, prompt, steps, atol=1e-10):
    """Greedy generation of `steps` tokens with the cache gives the tokens of generation without it, and the cached
    logits equal the full forward's at every step; returns the cache, filled with every token."""
    cache = model.new_cache(prompt.size(0))
    tokens = model.generate(prompt, steps, temperature=0)
    assert torch.equal(tokens, model.generate(prompt, steps, temperature=0, use_cache=False))
    with torch.no_grad():
        logits, _ = model(tokens[:, :prompt.size(1)], cache=cache)
        for t in range(prompt.size(1), tokens.size(1)):
            torch.testing.assert_close(logits, model(tokens[:, :t])[0], atol=atol, rtol=0)
            logits, _ = model(tokens[:, t:t + 1], cache=cache)
    return cache


def readme_rule_source():
    """The first ```python block under README.md's "## Adding a rule": the example rule, exactly as a reader copies it."""
    text = (ROOT / 'README.md').read_text()
    section = text[text.index('## Adding a rule'):]
    return section[section.index('```python') + len('```python'):section.index('```', section.index('```python') + 9)]


def register_readme_rule():
    """Run README's example, which defines a rule and registers it in ATTENTION, as a reader's own module would."""
    import attention
    import rules
    exec(readme_rule_source(), {'torch': torch, 'Attention': attention.Attention, 'ATTENTION': rules.ATTENTION})


# REGISTER_README_RULE=1: README's example rule is registered before collection, so every test that runs "all rules"
# runs it too (tests/test_frame.py::test_the_readme_rule_passes_every_all_rules_test does this in a subprocess)
if os.environ.get('REGISTER_README_RULE') == '1':
    register_readme_rule()


def rule_cases(cases, capability=None):
    """pytest params for a test that runs every rule: each case (config keys naming its `attention` rule) runs
    where its rule declares `capability` (an Attention class attribute: has_cache, has_flex,
    has_bidirectional_form), and a causal case where it declares has_causal_form, and is skipped, saying why,
    where it does not."""
    from rules import ATTENTION, rule_class
    params = []
    for kw in cases:
        mix = kw.get('mix', False)
        rules = [rule_class(kw['attention'], mix)] + ([ATTENTION[kw['attention']]] if mix else [])  # a mix: both
        needs = ([capability] if capability else []) + (['has_causal_form'] if kw.get('causal', True) else [])
        lacking = [(rule, need) for rule in rules for need in needs if not getattr(rule, need)]
        marks = pytest.mark.skip(reason=f"{lacking[0][0].__name__} does not declare {lacking[0][1]}") if lacking else ()
        params.append(pytest.param(kw, marks=marks, id='-'.join(f'{k}={v}' for k, v in kw.items())))
    return params


@pytest.fixture
def eager_flex_backward(monkeypatch):
    """Flex refuses a CPU backward by a device check only; past it, eager flex's reference backward runs: a rule's
    wiring (its gradients through flex), not the GPU's compiled kernel, which tests/test_gpu.py compares on a GPU."""
    import torch.nn.attention.flex_attention as flex
    if not hasattr(flex, '_validate_device'):
        pytest.skip("torch's flex device check moved")
    monkeypatch.setattr(flex, '_validate_device', lambda *args: None)
    torch.compiler.reset()  # eager flex traces itself; after other tests' shapes that trace turns dynamic and fails
