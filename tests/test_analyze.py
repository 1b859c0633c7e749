"""analyze.py's metrics on constructed inputs, and the one mechanism every rule exposes its weights through."""
import math

import pytest
import torch

from analyze import (token_groups, collapse_residual, effective_rank, entropy, first_token_share, sparsity,
                     uniform_share)
from attention import AttentionConfig, Attention, build_attention


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
