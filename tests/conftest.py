"""Shared test helpers: the repo on sys.path, the offline data samples (skipped with a reason where absent),
and running train.py as a user would."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / 'shared' / 'data'
sys.path.insert(0, str(ROOT))
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"offline data samples not found at {SHARED}")
if (SHARED / 'tiktoken_cache').is_dir():
    os.environ.setdefault('TIKTOKEN_CACHE_DIR', str(SHARED / 'tiktoken_cache'))


def run_script(*args, launcher=(sys.executable,), check=True, timeout=600, cwd=ROOT):
    """Run a repo script in a subprocess on one CPU thread (from the repo root unless cwd says otherwise);
    return its combined output."""
    env = {**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONUNBUFFERED': '1'}
    proc = subprocess.run([*launcher, *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{args} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout + proc.stderr


def run_forked(*runs, timeout=300):
    """Each run ({'argv': [script, *args], 'kill': [within, target, n] or None}, see tests/faults.py) as a process of
    its own, forked from one that imported torch and the repo once: [(exit code, output)], in order; -9 is SIGKILL."""
    env = {**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONUNBUFFERED': '1'}
    proc = subprocess.run([sys.executable, str(ROOT / 'tests' / 'faults.py')], input=json.dumps(runs), env=env,
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if proc.returncode != 0:
        raise AssertionError(f"tests/faults.py failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return [(r['rc'], r['out']) for r in json.loads(proc.stdout)]


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
