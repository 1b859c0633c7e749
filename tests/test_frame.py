"""The frame every rule shares (attention.Attention): every registered rule fits it, in each form it declares; a new
rule can be added the way README's "Adding a rule" says (its example, registered, passes every test that runs all
rules); and the contracts it names (c_proj, init_extra, no_decay) hold."""
import json
import math
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import attention
from attention import Attention
from rules import ATTENTION, AttentionConfig, build_attention
from conftest import ROOT, register_readme_rule, rule_cases, run_script
from model import GPT, GPTConfig
from prepare.recall import make_examples

# every registered rule, in the forms a GPT (causal) and a ViT (65 tokens on an 8x8 grid) build it
CAUSAL = [dict(attention=name) for name in ATTENTION] + [dict(attention='softmax', window=5)]
CAUSAL += [dict(attention=name, mix=True) for name in ATTENTION]  # each rule beside a softmax branch
CAUSAL += [dict(attention='krause', mix=True, mix_matched=True)]  # each branch with half the heads
VIT = [dict(attention=name, causal=False, grid_size=8) for name in ATTENTION]


def small(**kw):
    return AttentionConfig(**{**dict(n_embd=32, n_head=4, block_size=65, krause_window=8, krause_topk=4), **kw})


@pytest.mark.parametrize('kw', rule_cases(CAUSAL) + rule_cases(VIT, 'has_bidirectional_form'))
def test_every_rule_is_project_attend_out(kw):
    torch.manual_seed(0)
    attn = build_attention(small(**kw), 0).double().eval()
    assert isinstance(attn, Attention)
    x = torch.randn(2, 65, 32, dtype=torch.float64)
    tensors = attn.project(x)
    heads = 2 if kw.get('mix_matched') else 4  # a matched mix: each branch half the heads
    assert all(t.shape[:3] == (2, heads, 65) for t in tensors)
    if attn.projections is not None:
        assert len(tensors) == len(attn.projections)
    y = attn.path(x.device)(*tensors)  # what forward runs here: attend, or SDPA (the same function)
    assert y.shape[:3] == (2, heads, 65)
    torch.testing.assert_close(attn(x), attn.out(y), atol=0, rtol=0)
    torch.testing.assert_close(attn.attend(*tensors), y, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize('kw', rule_cases(CAUSAL) + rule_cases(VIT, 'has_bidirectional_form'))
def test_forward_equals_the_formula(kw):
    """A rule whose attend saves memory writes its formula as code (attend_reference, every pair at once): what
    forward runs here equals it, in every form the rule has (each rule's own tests check gradients, and against a
    per-pair reference of their own)."""
    torch.manual_seed(0)
    attn = build_attention(small(**kw), 0).double().eval()
    rules = [attn.softmax, attn.rule] if kw.get('mix') else [attn]
    x = torch.randn(2, 65, 32, dtype=torch.float64)
    for rule in rules:
        if not hasattr(rule, 'attend_reference'):  # its attend is the formula, every pair at once
            continue
        tensors = rule.project(x)
        torch.testing.assert_close(rule.path(x.device)(*tensors), rule.attend_reference(*tensors), atol=1e-10,
                                   rtol=1e-10, msg=type(rule).__name__)


@pytest.mark.parametrize('kw', rule_cases(CAUSAL) + rule_cases(VIT, 'has_bidirectional_form'))
def test_every_rule_has_its_ideal_flops(kw):
    # support/flops.py reads each layer's count from its rule: one without it would raise, never count nothing
    attn = build_attention(small(**kw), 0)
    assert type(attn).ideal_flops is not Attention.ideal_flops, type(attn).__name__
    flops = attn.ideal_flops(65)
    assert math.isfinite(flops) and flops > 0


def test_a_rule_without_ideal_flops_says_so():
    with pytest.raises(NotImplementedError, match='UniformAttention has no ideal_flops'):
        Attention.ideal_flops(UniformAttention(small(attention='uniform'), 0), 65)


def test_the_readme_rule_passes_every_all_rules_test():
    # README's example, exec'd exactly as written and registered before collection, through every test that runs
    # all rules: it runs where it declares a form and is skipped, with a reason, where it does not
    all_rules_tests = ['tests/test_frame.py', 'tests/test_generate.py', 'tests/test_gpu.py']
    env = {**os.environ, 'REGISTER_README_RULE': '1', 'OMP_NUM_THREADS': '1'}
    proc = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-n', '0', '-rs', '-p', 'no:cacheprovider', '-k',
                           'uniform and not readme_rule_passes', *all_rules_tests], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert int(re.search(r'(\d+) passed', out).group(1)) >= 1, out[-3000:]  # the causal frame
    assert 'UniformAttention does not declare has_cache' in out            # generation: skipped, saying why
    assert 'UniformAttention does not declare has_bidirectional_form' in out


def test_the_readme_rule_trains_and_generates_without_a_cache(monkeypatch):
    monkeypatch.setitem(ATTENTION, 'uniform', None)  # restored after the test: README's block then registers it
    register_readme_rule()
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=11, attention='uniform'))
    idx = torch.randint(0, 11, (1, 4))
    assert model.generate(idx, 6, temperature=0, use_cache=False).shape == (1, 10)
    with pytest.raises(NotImplementedError, match='generate with use_cache=False'):
        model.generate(idx, 1, use_cache=True)


class UniformAttention(Attention):
    """y_i = mean of v_j over the visible keys j <= i: attention with every weight 1/(i+1)."""

    def attend(self, q, k, v):
        count = torch.arange(1, v.size(2) + 1, device=v.device, dtype=v.dtype).view(-1, 1)  # (T, 1)
        return v.cumsum(2) / count


class ScaledUniformAttention(UniformAttention):
    """The same, times a per-head, per-channel gain: a 2-D table that must not be decayed, with its own init."""
    projections = ('v',)  # a rule chooses what project makes: here v alone, so c_attn is n_embd wide
    no_decay = ('gain',)

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        self.gain = nn.Parameter(torch.empty(self.n_head, self.head_dim))
        self.mix = nn.Linear(config.n_embd, config.n_embd)

    def init_extra(self):
        nn.init.ones_(self.gain)
        nn.init.zeros_(self.mix.weight)  # overrides the model's N(0, 0.02): init_extra runs after it

    def attend(self, v):
        return super().attend(None, None, v) * self.gain.view(1, -1, 1, self.head_dim)


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(ATTENTION, 'uniform', UniformAttention)
    monkeypatch.setitem(ATTENTION, 'scaled_uniform', ScaledUniformAttention)


def test_a_toy_rule_registers_and_trains_on_recall(registered):
    torch.manual_seed(0)
    x, y = (torch.from_numpy(a.astype('int64')) for a in make_examples(512, 16, 4, 32, seed=0))
    model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=64, block_size=32, vocab_size=32, attention='uniform'))
    assert isinstance(model.transformer.h[0].attn, UniformAttention)
    optimizer = model.configure_optimizers(0.1, 3e-3, (0.9, 0.99), 'cpu')
    losses = []
    for step in range(30):
        rows = torch.randint(0, 512, (64,), generator=torch.Generator().manual_seed(step))
        _, loss = model(x[rows], y[rows])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[0] > 3.0 and losses[-1] < 2.9  # ln(32) = 3.47 at the start; answering with some value: ln(16) = 2.77


def test_a_rule_without_a_bidirectional_form_refuses_one_in_a_line(registered):
    with pytest.raises(ValueError, match=r"attention='uniform' \(UniformAttention\) has no bidirectional form"):
        build_attention(small(attention='uniform', causal=False, grid_size=8), 0)


def test_the_contracts_hold_for_a_toy_rule(registered):
    model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=11, attention='scaled_uniform'))
    attn = model.transformer.h[1].attn
    assert attn.c_attn.weight.shape == (32, 32)                       # one projection: v
    assert torch.equal(attn.gain, torch.ones(4, 8))                   # init_extra ran ...
    assert torch.equal(attn.mix.weight, torch.zeros(32, 32))          # ... after the model's init
    assert abs(attn.c_proj.weight.std().item() - 0.02 / 2) < 0.003    # c_proj: 0.02 / sqrt(2 n_layer)
    decay, no_decay = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), 'cpu').param_groups
    assert any(p is attn.gain for p in no_decay['params']) and not any(p is attn.gain for p in decay['params'])
    assert any(p is attn.mix.weight for p in decay['params'])
    _, loss = model(torch.randint(0, 11, (2, 16)), torch.randint(0, 11, (2, 16)))
    loss.backward()
    assert attn.gain.grad.abs().sum() > 0


def test_block_masks_are_cached_by_the_mask_that_defines_them():
    cpu, tools = torch.device('cpu'), attention
    assert tools.sliding_window_mask(8) is tools.sliding_window_mask(8)
    assert tools.block_mask(tools.sliding_window_mask(8), 200, cpu) is \
        tools.block_mask(tools.sliding_window_mask(8), 200, cpu)
    assert tools.block_mask(tools.causal_mask, 200, cpu) is not \
        tools.block_mask(tools.causal_mask, 300, cpu)  # one per length
    assert tools.block_mask(None, 200, cpu) is None       # full attention needs none


@pytest.mark.parametrize('matched', [False, True])
def test_bench_times_the_krause_mix_form(matched):
    """The mix form, and matched (each branch half the heads), beside softmax alone (neither mix key)."""
    out = run_script('bench.py', '--attention=krause', '--mix=True', f'--mix_matched={matched}', '--seq_lens=96',
                     '--repeats=1', '--n_embd=64', '--n_head=2', '--krause_window=16', '--krause_topk=8', '--json')
    rows = [json.loads(line) for line in out.splitlines() if line.startswith('{')]
    # the mix's path on the CPU: 'fused' (Attention.path_name), its softmax branch on SDPA beside Krause's math path
    assert [(r['attention'], r['path'], r['T']) for r in rows] == [('softmax', 'sdpa', 96), ('krause', 'fused', 96)]
    assert rows[1]['ms'] > 0


def test_bench_pace_puts_the_rule_beside_softmax_alone_and_in_the_model():
    out = run_script('bench.py', '--mode=pace', '--attention=tda', '--seq_lens=48', '--repeats=1', '--n_layer=1',
                     '--n_embd=32', '--n_head=2', '--batch_size=2', '--profile=True', '--json')
    rows = [json.loads(line) for line in out.splitlines() if line.startswith('{')]
    assert [(r['attention'], r['path']) for r in rows] == [('softmax sdpa', 'attend'), ('softmax sdpa', 'model'),
                                                           ('tda', 'attend'), ('tda', 'model')]
    assert [r['vs_softmax'] for r in rows[:2]] == [1.0, 1.0]
    for softmax, rule in zip(rows[:2], rows[2:]):
        assert rule['vs_softmax'] == pytest.approx(rule['ms'] / softmax['ms']) and rule['peak_mib'] >= 0
    assert rows[3]['tokens_per_s'] == pytest.approx(2 * 48 / rows[3]['ms'] * 1000)
    assert out.count('Self CPU time total') == 4  # a profile per case
