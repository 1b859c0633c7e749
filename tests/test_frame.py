"""The frame every rule shares (attention.Attention): every registered rule fits it, a new rule can be added the
way README's "Adding a variant" says, and the contracts it names (c_proj, init_extra, no_decay) hold."""
import json

import pytest
import torch
import torch.nn as nn

import attention
from attention import ATTENTION, Attention, AttentionConfig, build_attention
from conftest import run_script
from model import GPT, GPTConfig
from prepare.recall import make_examples

# every registered rule, in the forms a GPT (causal) and a ViT (65 tokens on an 8x8 grid) build it
CAUSAL = [dict(attention=name) for name in ATTENTION] + [dict(attention='krause', krause_mix=True),
                                                         dict(attention='softmax', window=5)]
VIT = [dict(attention=name) for name in ATTENTION]


def small(**kw):
    return AttentionConfig(**{**dict(n_embd=32, n_head=4, block_size=65, krause_window=8, krause_topk=4), **kw})


@pytest.mark.parametrize('kw', CAUSAL + [dict(causal=False, grid_size=8, **kw) for kw in VIT],
                         ids=lambda kw: '-'.join(f'{k}={v}' for k, v in kw.items()))
def test_every_rule_is_project_attend_out(kw):
    torch.manual_seed(0)
    attn = build_attention(small(**kw), 0).double().eval()
    assert isinstance(attn, Attention)
    x = torch.randn(2, 65, 32, dtype=torch.float64)
    tensors = attn.project(x)
    assert all(t.shape[:3] == (2, 4, 65) for t in tensors)
    if attn.projections is not None:
        assert len(tensors) == len(attn.projections)
    y = attn.attend(*tensors)
    assert y.shape[:3] == (2, 4, 65)
    torch.testing.assert_close(attn(x), attn.out(y), atol=0, rtol=0)


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
    cpu = torch.device('cpu')
    assert attention.sliding_window_mask(8) is attention.sliding_window_mask(8)
    assert attention.block_mask(attention.sliding_window_mask(8), 200, cpu) is \
        attention.block_mask(attention.sliding_window_mask(8), 200, cpu)
    assert attention.block_mask(attention.causal_mask, 200, cpu) is not \
        attention.block_mask(attention.causal_mask, 300, cpu)  # one per length
    assert attention.block_mask(None, 200, cpu) is None       # full attention needs none


def test_bench_times_the_krause_mix_form():
    out = run_script('bench.py', '--attention=krause', '--krause_mix=True', '--seq_lens=96', '--repeats=1',
                     '--n_embd=64', '--n_head=2', '--krause_window=16', '--krause_topk=8', '--json')
    rows = [json.loads(line) for line in out.splitlines() if line.startswith('{')]
    assert [(r['attention'], r['path'], r['T']) for r in rows] == [('softmax', 'sdpa', 96), ('krause', 'math', 96)]
    assert rows[1]['ms'] > 0
