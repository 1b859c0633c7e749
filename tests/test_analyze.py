"""analyze.py's metrics on constructed inputs, and the one mechanism every rule exposes its weights through."""
import math

import pytest
import torch

from studies.analyze import (analyse, token_groups, collapse_residual, effective_rank, entropy, first_token_share, sparsity,
                     uniform_share)
from attention import Attention
from rules import AttentionConfig, MixAttention, build_attention
from model import GPT, GPTConfig


def test_identical_tokens_are_collapsed():
    x = torch.randn(1, 16).expand(10, 16)
    assert collapse_residual(x) == pytest.approx(0, abs=1e-6)
    assert effective_rank(x) == pytest.approx(1, abs=1e-6)
    assert all(token_groups(x, t) == 1 for t in (0.9, 0.95, 0.99))


def test_two_tight_separated_groups_are_two_token_groups():
    torch.manual_seed(0)
    a, b = torch.zeros(16), torch.zeros(16)
    a[0], b[1] = 1, 1  # orthogonal directions
    x = torch.cat([a + 0.01 * torch.randn(5, 16), b + 0.01 * torch.randn(7, 16)])
    assert token_groups(x, 0.9) == 2
    assert token_groups(torch.eye(6), 0.9) == 6  # orthogonal tokens: each its own
    assert effective_rank(torch.eye(6)) == pytest.approx(6)


def test_uniform_causal_attention_has_sink_ratio_one():
    T = 12
    w = torch.ones(T, T).tril()
    w = (w / w.sum(-1, keepdim=True)).expand(2, 3, T, T)
    share, empty = first_token_share(w)
    assert torch.allclose(share / uniform_share(T, True), torch.ones(3, dtype=share.dtype))
    assert (empty == 0).all() and (sparsity(w, True) == 0).all()
    assert torch.allclose(entropy(w), torch.tensor([math.log(i + 1) for i in range(T)]).mean().double())


def test_known_sparse_matrix_gives_its_exact_sparsity():
    T = 4  # visible pairs: 10; zeros placed in 3 of them (and noise above the diagonal, which must not count)
    w = torch.tensor([[1.0, 9, 9, 9], [0.5, 0.5, 9, 9], [0, 1, 0, 9], [0.2, 0, 0.3, 0.5]]).view(1, 1, T, T)
    assert sparsity(w, True).item() == pytest.approx(3 / 10)
    assert sparsity(torch.zeros(1, 1, T, T), False).item() == 1


class Uniform(Attention):
    def attend(self, q, k, v):
        return v.cumsum(2) / torch.arange(1, v.size(2) + 1, dtype=v.dtype).view(-1, 1)


@pytest.mark.parametrize('rule,extra', [('softmax', {}), ('krause', dict(krause_window=8, krause_topk=4)),
                                        ('attentionx', dict(attnx_gamma=3.0)), ('cluster', dict(cluster_chunk=4)),
                                        ('tda', {}), ('uniform', {})])
def test_every_rule_gives_its_weights_through_the_frame(rule, extra):
    """attention_weights W reproduces the rule's own output: y = W v (AttentionX: v - γ A v; TDA: RMSNorm(W v))."""
    torch.manual_seed(0)
    config = AttentionConfig(n_embd=32, n_head=2, block_size=20, attention=rule if rule != 'uniform' else 'softmax',
                             **extra)
    attn = (Uniform(config, 0) if rule == 'uniform' else build_attention(config, 0)).eval()
    tensors = attn.project(torch.randn(2, 20, 32))
    with torch.no_grad():
        y, w = attn.attend(*tensors), attn.attention_weights(*tensors)
    v = tensors[-1]
    expected = {'attentionx': lambda: v - 3.0 * (w @ v), 'tda': lambda: attn.head_norm(w @ v)}.get(rule, lambda: w @ v)
    assert w.shape == (2, 2, 20, 20)
    assert torch.allclose(expected(), y, atol=1e-5)
    assert (w.triu(1) == 0).all()  # causal: nothing from the future
    if attn.weights_note is None:
        assert (w >= 0).all() and torch.allclose(w.sum(-1), torch.ones(2, 2, 20), atol=1e-5)
    if rule == 'uniform':
        share, _ = first_token_share(w)
        assert torch.allclose(share / uniform_share(20, True), torch.ones(2, dtype=share.dtype))


def mix_model(rule, **extra):
    """A tiny float64 GPT whose layers are MixAttention (a softmax branch beside `rule`), gates far from constant."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=10, vocab_size=11, attention=rule, mix=True,
                          **extra)).double().eval()
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.gate.weight.normal_(0, 0.5)
    return model


def mix_reference(mix, x):
    """(W_softmax, W_rule, g) by hand: softmax(q kᵀ/√D + causal mask), the rule's own attention_weights, and
    g = softmax(Linear([y_softmax, y_rule])) with y = c_proj(merged heads of W v) per branch."""
    q, k, v, *rule_tensors = mix.project(x)
    T = x.size(1)
    scores = (q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))).masked_fill(~torch.ones(T, T).tril().bool(), -math.inf)
    w_softmax, w_rule = scores.softmax(-1), mix.rule.attention_weights(*rule_tensors)
    y = [(w @ value).transpose(1, 2).reshape(x.shape) @ branch.c_proj.weight.T + branch.c_proj.bias
         for w, value, branch in ((w_softmax, v, mix.softmax), (w_rule, rule_tensors[-1], mix.rule))]
    g = (torch.cat(y, -1) @ mix.gate.weight.T + mix.gate.bias).softmax(-1)
    return w_softmax, w_rule, g, y


@pytest.mark.parametrize('rule,extra', [('krause', dict(krause_window=4, krause_topk=2)), ('softmax', {})])
def test_mix_weights_are_the_gated_sum_of_the_branches(rule, extra):
    """MixAttention.attention_weights = g_0 W_softmax + g_1 W_rule, per query, against the formula by hand."""
    mix = mix_model(rule, **extra).transformer.h[0].attn
    x = torch.randn(2, 10, 16, dtype=torch.float64)
    w_softmax, w_rule, g, y = mix_reference(mix, x)
    with torch.no_grad():
        torch.testing.assert_close(mix(x), g[..., :1] * y[0] + g[..., 1:] * y[1])  # the hand gate is the mix's
        w = mix.attention_weights(*mix.project(x))
        for got, want in zip(mix.branch_weights(*mix.project(x)), (w_softmax, w_rule, g)):
            torch.testing.assert_close(got, want)
    torch.testing.assert_close(w, g[:, None, :, :1] * w_softmax + g[:, None, :, 1:] * w_rule)
    assert g.std() > 0.01 and mix.weights_note is None  # the gate varies per token; both branches distributions
    assert (w.triu(1) == 0).all() and torch.allclose(w.sum(-1), torch.ones(2, 2, 10, dtype=w.dtype))


def test_mix_of_two_equal_softmax_branches_has_the_softmax_weights():
    mix = mix_model('softmax').transformer.h[0].attn
    mix.rule.load_state_dict(mix.softmax.state_dict())  # the rule's branch a copy of the softmax branch
    tensors = mix.project(torch.randn(2, 10, 16, dtype=torch.float64))
    with torch.no_grad():
        torch.testing.assert_close(mix.attention_weights(*tensors), mix.softmax.attention_weights(*tensors[:3]))


def test_analyse_reports_each_branch_of_a_mix_layer():
    model = mix_model('krause', krause_window=4, krause_topk=2)
    x = torch.randint(11, (3, 10))
    inputs = []
    hook = model.transformer.h[1].attn.register_forward_hook(lambda m, a, o: inputs.append(a[0]))
    layers, _ = analyse(model, x)
    hook.remove()
    mix, row = model.transformer.h[1].attn, layers[1]
    with torch.no_grad():
        w_softmax, _, g, _ = mix_reference(mix, inputs[0])
    assert isinstance(mix, MixAttention) and row['heads']['entropy'] != 'n/a'
    assert row['branches']['softmax'] == pytest.approx(first_token_share(w_softmax.float())[0].tolist())
    assert row['branches']['gate_softmax'] == pytest.approx(g[..., 0].mean().item())
    assert len(row['branches']['rule']) == 2
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.gate.weight.zero_()
            block.attn.gate.bias.copy_(torch.tensor([math.log(4), 0.0], dtype=torch.float64))
    assert [r['branches']['gate_softmax'] for r in analyse(model, x)[0]] == pytest.approx([0.8, 0.8], abs=1e-12)
    cluster = analyse(mix_model('cluster', cluster_chunk=4), x)[0][0]  # token 0 in summaries: n/a, the rule's reason
    assert cluster['branches']['rule'].startswith('n/a: token 0 is folded')
    assert cluster['heads']['first_token_share'] == cluster['branches']['rule']


def test_plots_without_matplotlib_is_one_error_line_before_any_work(tmp_path):
    """--plots asks for PNGs: without matplotlib none can be made, so the run is refused (exit code 1) with one line
    saying how to get it, before any checkpoint is opened or analysis.json written."""
    from conftest import run_forked
    blocked = ['', '', 0, "import sys; sys.modules['matplotlib'] = None"]  # before the script starts: not installed
    (code, out), = run_forked({'argv': ['studies/analyze.py', f'--out_dir={tmp_path / "run"}',
                                        f'--plots={tmp_path / "plots"}'], 'fault': blocked})
    assert code == 1
    assert out.strip().splitlines()[-1] == (f"error: plots={tmp_path / 'plots'} needs matplotlib, which is not "
                                            f"installed: pip install matplotlib, or drop --plots for the tables and "
                                            f"analysis.json alone")
    assert not list(tmp_path.iterdir())
