"""Top-k attention against a slow reference written straight from the formula (docs/rules.md#top-k): per row, the
visible keys' scaled dot products, a sort, a softmax over the first k. Float64, forward and gradients (q, k, v; the
rule learns nothing else). Then ties, causality, flex, the cache inside a window, memory, and bad settings."""
import math

import pytest
import torch

from attention import SoftmaxAttention
from rules import AttentionConfig, build_attention
from conftest import assert_causal, build_layer, cached_generation_equals_the_forward, paths_match, qkv
from model import GPT, GPTConfig


def topk_reference(q, k, v, visible, topk):
    """y_i = Σ_{j kept} softmax_j(q_i·k_j/√D) v_j, kept = the first min(k, |Vis(i)|) of the visible j by a sort."""
    B, H, T, D = q.shape
    rows = []
    for i in range(T):
        js = visible(i)
        per_head = []
        for h in range(H):
            out = []
            for b in range(B):
                scores = torch.stack([q[b, h, i] @ k[b, h, j] / math.sqrt(D) for j in js])
                order = sorted(range(len(js)), key=lambda n: -scores[n].item())[:topk]  # a per-row sort
                weights = torch.softmax(scores[order], -1)
                out.append(sum(w * v[b, h, js[n]] for w, n in zip(weights, order)))
            per_head.append(torch.stack(out))  # (B, D)
        rows.append(torch.stack(per_head, 1))   # (B, H, D)
    return torch.stack(rows, 2)                 # (B, H, T, D)


def make(T, **kw):
    return build_layer('topk', T, **kw)


# (T, k, keys): causal rows with fewer than k keys, k > T (softmax), k = 1, the ViT, query tiles of 4 rows (T not a
# multiple), a sliding window
CASES = [(13, 4, dict()), (9, 16, dict()), (12, 1, dict()), (21, 5, dict(causal=False)),
         (30, 7, dict(tile_weights=4 * 30)), (17, 3, dict(window=6)),
         (19, 6, dict(causal=False, tile_weights=5 * 19))]


@pytest.mark.parametrize('T,topk,kw', CASES)
def test_matches_reference(T, topk, kw):
    """The rule's formula as code (attend_reference, every pair at once) and its math path (attend, in tiles), each
    against the per-row reference above: the output and the gradients of q, k and v."""
    attn = make(T, topk_k=topk, **kw)
    W = kw.get('window', 0)
    visible = (lambda i: list(range(T))) if not kw.get('causal', True) else \
        (lambda i: [j for j in range(i + 1) if not W or i - j < W])
    q, k, v = qkv(T)
    ref = topk_reference(q, k, v, visible, topk)
    # (one key per row: its weight is 1 whatever q and k are, so only v's gradient must be nonzero)
    paths_match((attn.attend_reference, attn.attend), (q, k, v), ref, names='qkv',
                nonzero=lambda name: topk > 1 or name == 'v')


def test_a_tie_at_the_kth_score_keeps_every_tied_key():
    # a threshold between the k-th and (k+1)-th score keeps all keys tied at the k-th; a sort would keep exactly k
    attn = make(6, topk_k=2, causal=False)
    q = torch.ones(1, 3, 6, 8, dtype=torch.float64)
    k = torch.zeros(1, 3, 6, 8, dtype=torch.float64)
    k[..., 0, :], k[..., 1, :], k[..., 2, :], k[..., 3, :] = 1.0, 0.5, 0.5, 0.25  # scores 2.83, 1.41, 1.41, 0.71, 0, 0
    v = torch.randn(1, 3, 6, 8, dtype=torch.float64)
    kept = torch.tensor([8, 4, 4], dtype=torch.float64) / math.sqrt(8)
    expected = (kept.softmax(0)[:, None] * v[..., :3, :].unsqueeze(2)).sum(-2)   # keys 0, 1 and 2, for every row
    torch.testing.assert_close(attn.attend(q, k, v), expected.expand(1, 3, 6, 8))


def test_k_at_least_the_context_is_softmax():
    torch.manual_seed(0)
    topk = build_attention(AttentionConfig(n_embd=24, n_head=3, block_size=20, attention='topk', topk_k=20), 0)
    softmax = SoftmaxAttention(AttentionConfig(n_embd=24, n_head=3, block_size=20), 0)
    softmax.load_state_dict(topk.state_dict())
    x = torch.randn(2, 20, 24)
    torch.testing.assert_close(topk(x), softmax(x))


@pytest.mark.parametrize('kw', [dict(), dict(pos_emb='rope', tile_weights=5 * 40)])
def test_gpt_is_causal(kw):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=40, vocab_size=11, attention='topk',
                          topk_k=4, **kw)).eval()
    assert_causal(model, T=40, cut=21)


@pytest.mark.parametrize('T,kw', [(150, dict(topk_k=16)), (150, dict(topk_k=16, tile_weights=40 * 150)),
                                  (65, dict(topk_k=8, causal=False)), (100, dict(topk_k=5, window=24))])
def test_flex_forward_equals_math(T, kw):
    attn = make(T, **kw).float()
    q, k, v = (t.detach().float() for t in qkv(T))
    with torch.no_grad():
        torch.testing.assert_close(attn.attend_flex(q, k, v), attn.attend(q, k, v), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('kw', [dict(topk_k=3), dict(topk_k=3, window=8)])
def test_cached_generation_equals_uncached_with_a_small_k(kw):
    # k below every context from the fourth token on, and (window) a ring of 8 keys of which the top 3 are taken
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=32, vocab_size=11, bias=False, pos_emb='rope',
                          attention='topk', **kw)).double().eval()
    prompt = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(1))
    cached_generation_equals_the_forward(model, prompt, 40)


def test_saves_no_tile_of_scores_for_backward():
    # the paper's query chunking: what autograd keeps outside the recomputed tiles is O(T·D)
    T, rows = 256, 16
    attn = make(T, topk_k=8, tile_weights=rows * T)
    q, k, v = qkv(T)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        attn.attend(q, k, v).sum().backward()
    B, H, _, D = q.shape
    assert max(saved, default=0) <= B * H * T * D < B * H * rows * T  # no tile × T scores, let alone T × T
    assert q.grad.abs().sum() > 0


@pytest.mark.parametrize('kw,match', [
    (dict(topk_k=0), 'topk_k must be >= 1'),
    (dict(topk_k=-3), 'topk_k must be >= 1'),
    (dict(tile_weights=0), 'tile_weights must be >= 1'),
    (dict(window=4, causal=False), 'window .* needs causal=True'),
])
def test_bad_settings_fail_at_construction(kw, match):
    with pytest.raises(ValueError, match=match):
        build_attention(AttentionConfig(n_embd=24, n_head=3, attention='topk', **kw), 0)
