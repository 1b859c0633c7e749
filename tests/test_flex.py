"""Every flex path against its math path, and the structure that keeps flex fast on a GPU (checked on the CPU).

Flex's backward does not run on the CPU (torch 2.13), so gradients take an exact route: `flex_by_hand`, flex's
definition written as tensor ops (score_mod and mask_mod evaluated on every pair, softmax, lse), which autograd
differentiates through q, k and v only, as flex does when nothing its score_mod captures requires grad (checked
below). It is first checked against flex's own forward; then every parameter's gradient through it must equal the
math path's, in float64, at T not a multiple of flex's 128-block.
"""
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import attention
import machinery.masks
from rules import AttentionConfig, build_attention
from model import GPT, GPTConfig

RULES = {  # name: config keys of one layer
    'softmax': dict(attention='softmax'),
    'softmax window': dict(attention='softmax', window=40),
    'attentionx': dict(attention='attentionx', attnx_gamma=3.0, attnx_learnable_gamma=True),
    'attentionx lsa vit': dict(attention='attentionx', causal=False, grid_size=8, block_size=65,
                               attnx_mask_diagonal=True, attnx_learned_temperature=True, attnx_learnable_gamma=True),
    'krause': dict(attention='krause', krause_window=32, krause_topk=16),
    'krause W > T': dict(attention='krause', krause_window=256, krause_topk=192),
    'krause vit': dict(attention='krause', causal=False, grid_size=8, krause_topk=3, block_size=65),
    'tda': dict(attention='tda', tda_beta=0.7, tda_kappa=2.0),
    'tda one view': dict(attention='tda', tda_differential=False, tda_p=3.0),
    'tda vit': dict(attention='tda', causal=False, grid_size=8, block_size=65),
    'tda matched': dict(attention='tda', tda_matched=True, tda_beta=0.7, tda_kappa=2.0),
    'tda matched vit': dict(attention='tda', tda_matched=True, causal=False, grid_size=8, block_size=65),
    'mix krause': dict(attention='krause', mix=True, krause_window=32, krause_topk=16),
    'mix tda': dict(attention='tda', mix=True),
    'topk': dict(attention='topk', topk_k=16),
    'topk vit': dict(attention='topk', causal=False, topk_k=8, block_size=65),
    'topk window': dict(attention='topk', topk_k=5, window=40),
    'ssmax': dict(attention='ssmax'),
    'ssmax vit': dict(attention='ssmax', causal=False, block_size=65),
    'gated': dict(attention='gated'),
    'gated headwise window': dict(attention='gated', gated_headwise=True, window=40),
    'diff': dict(attention='diff'),
    'diff vit': dict(attention='diff', causal=False, block_size=65),
    'longformer': dict(attention='longformer', longformer_window=32, longformer_window_last=64),  # layer 1: W = 43
    'longformer vit': dict(attention='longformer', causal=False, block_size=65, longformer_window=16,
                           longformer_global=2),
    'dex': dict(attention='dex', dex_heads=1, dex_init='identity'),
    'dex window': dict(attention='dex', window=40, dex_lambda=0.4),
    'lsa vit': dict(attention='lsa', causal=False, grid_size=8, block_size=65, lsa_per_head=True),
    'dex in mix': dict(attention='dex', mix=True, dex_init='identity'),  # no score_mod: nothing captured
}
T = 150  # not a multiple of flex's 128-token block


def patch_run_flex(monkeypatch, run_flex):  # in every module that calls flex: softmax's (attention.py), each rule's
    for module in [attention, *(m for name, m in sys.modules.items() if name.startswith('rules.'))]:
        if hasattr(module, 'run_flex'):
            monkeypatch.setattr(module, 'run_flex', run_flex)


def flex_by_hand(q, k, v, score_mod=None, block_mask=None, scale=None, return_aux=None):
    """flex_attention's definition as tensor ops: softmax over keys of score_mod(scale·q·kᵀ) where the mask lets
    them through; a row with no key left gives 0 and lse -inf."""
    B, H, L, S = q.size(0), q.size(1), q.size(2), k.size(2)
    scores = q @ k.transpose(-1, -2) * (q.size(-1) ** -0.5 if scale is None else scale)   # (B, H, L, S)
    b, h = torch.arange(B).view(-1, 1, 1, 1), torch.arange(H).view(1, -1, 1, 1)
    q_idx, kv_idx = torch.arange(L).view(1, 1, -1, 1), torch.arange(S).view(1, 1, 1, -1)
    if score_mod is not None:
        scores = score_mod(scores, b, h, q_idx, kv_idx)
    if block_mask is not None:
        scores = scores.masked_fill(~block_mask.mask_mod(b, h, q_idx, kv_idx), float('-inf'))
    lse = scores.logsumexp(-1)                                                            # (B, H, L)
    weights = torch.where(lse.isfinite().unsqueeze(-1), (scores - lse.unsqueeze(-1)).exp(), 0.0)
    y = weights @ v
    return (y, SimpleNamespace(lse=lse)) if return_aux is not None else y


def layer(name, **kw):
    torch.manual_seed(0)
    cfg = AttentionConfig(**{**dict(n_embd=32, n_head=2, block_size=T, n_layer=4, flex=True), **RULES[name], **kw})
    attn = build_attention(cfg, 1).double().train()  # dropout 0: train mode must change nothing
    with torch.no_grad():  # parameters a rule learns, different per head, and away from their initial values
        for module in attn.modules():
            if hasattr(module, 'log_sigma'):
                module.log_sigma.copy_(torch.log(torch.tensor([0.8, 1.9], dtype=torch.float64)))
            if hasattr(module, 'lambda_logit'):
                module.lambda_logit.fill_(0.3)
            if hasattr(module, 'head_norm'):
                module.head_norm.weight.uniform_(0.5, 1.5)
    return attn


def inputs(attn):  # what project gives for random activations, as leaves: T tokens, or the ViT's 65
    torch.manual_seed(1)
    x = torch.randn(2, T if attn.causal else 65, 32, dtype=torch.float64)
    return [t.detach().requires_grad_() for t in attn.project(x)]


def gradients(attn, attend, tensors, grad_y):
    for p in attn.parameters():
        p.grad = None
    for t in tensors:
        t.grad = None
    attend(*tensors).backward(grad_y)
    grads = {name: p.grad.clone() for name, p in attn.named_parameters() if p.grad is not None}
    return grads, [t.grad.clone() for t in tensors]


@pytest.mark.parametrize('name', RULES)
def test_flex_equals_math_forward_and_every_gradient_in_float64(name, monkeypatch):
    attn = layer(name)
    tensors = inputs(attn)
    with torch.no_grad():  # flex's own forward (eager, CPU), and the hand-written one, against the math path
        math_y = attn.attend(*tensors)
        torch.testing.assert_close(attn.attend_flex(*[t.detach() for t in tensors]), math_y, rtol=1e-10, atol=1e-10)
        patch_run_flex(monkeypatch, flex_by_hand)
        torch.testing.assert_close(attn.attend_flex(*tensors), math_y, rtol=1e-10, atol=1e-10)
    grad_y = torch.randn_like(math_y)
    math_params, math_inputs = gradients(attn, attn.attend, tensors, grad_y)
    flex_params, flex_inputs = gradients(attn, attn.attend_flex, tensors, grad_y)
    assert set(flex_params) == set(math_params)  # every parameter the rule learns gets one
    assert math_params or name.startswith(('softmax', 'topk', 'gated', 'longformer'))  # none in attend (gated's W_g is in c_attn)
    assert set(flex_params) == set(math_params)  # every parameter the rule learns gets one (softmax learns none)
    for key in math_params:
        torch.testing.assert_close(flex_params[key], math_params[key], rtol=1e-9, atol=1e-10, msg=key)
    for flex_grad, math_grad in zip(flex_inputs, math_inputs):
        torch.testing.assert_close(flex_grad, math_grad, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize('name', RULES)
def test_nothing_a_score_mod_captures_requires_grad(name, monkeypatch):
    # a captured tensor that requires grad is differentiated by flex with atomic adds, and rules out its FLASH backend
    captured = []

    def recording(q, k, v, score_mod=None, **kwargs):
        if score_mod is not None:
            captured.extend(cell.cell_contents for cell in score_mod.__closure__ or ())
        return flex_by_hand(q, k, v, score_mod=score_mod, **kwargs)
    patch_run_flex(monkeypatch, recording)
    attn = layer(name)
    tensors = inputs(attn)
    attn.attend_flex(*tensors).sum().backward()
    tensors_captured = [c for c in captured if isinstance(c, torch.Tensor)]
    assert all(not t.requires_grad for t in tensors_captured)
    if name.startswith(('krause', 'tda', 'mix')):
        assert tensors_captured  # the check saw the tensors these score_mods do capture


def test_the_mix_softmax_branch_runs_sdpa_not_flex(monkeypatch):
    calls = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(F, 'scaled_dot_product_attention', lambda *a, **k: calls.append('sdpa') or sdpa(*a, **k))
    patch_run_flex(monkeypatch, lambda *a, **k: calls.append('flex') or flex_by_hand(*a, **k))
    attn = layer('mix krause')
    with torch.no_grad():
        attn.attend_flex(*inputs(attn))
    assert calls == ['sdpa', 'flex']  # softmax's branch through SDPA (flash on a GPU), Krause's through flex


@pytest.mark.parametrize('rule', ['krause', 'tda'])
def test_a_compiled_forward_builds_each_mask_once_per_shape(rule, monkeypatch):
    # under torch.compile a graph does not see block_mask's cache: masks built inside forward would be rebuilt in
    # every layer at every call. The model builds them before its graph and hands them in.
    made, create = [], machinery.masks.create_block_mask
    monkeypatch.setattr(machinery.masks, 'create_block_mask', lambda *a, **k: made.append(a[3]) or create(*a, **k))
    monkeypatch.setattr(attention, 'FLEX_DEVICES', ('cuda', 'cpu'))
    for cached in (machinery.masks.block_mask, machinery.masks.band_mask, machinery.masks.dense_mask):
        cached.cache_clear()
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=3, n_head=2, n_embd=32, block_size=64, vocab_size=50, attention=rule, flex=True,
                          krause_window=8, krause_topk=4, pos_emb='rope')).eval()
    compiled = torch.compile(model, backend='eager')  # Dynamo's tracing is what ignores the cache
    with torch.no_grad():
        for T in (40, 40, 24, 40):
            idx = torch.randint(50, (2, T))
            _, loss = compiled(idx, idx)
            monkeypatch.setattr(attention, 'FLEX_DEVICES', ('cuda',))  # the math path, uncompiled
            torch.testing.assert_close(loss, model(idx, idx)[1], rtol=1e-5, atol=1e-5)
            monkeypatch.setattr(attention, 'FLEX_DEVICES', ('cuda', 'cpu'))
    assert sorted(made) == [24, 40]  # three layers, four calls, two shapes: two masks
    torch._dynamo.reset()


@pytest.mark.parametrize('rule', ['krause', 'tda', 'tda matched', 'mix krause'])
def test_a_flex_prefill_leaves_the_cache_as_the_math_path_does(rule, monkeypatch):
    torch.manual_seed(0)
    keys = {**RULES[rule], 'krause_window': 16, 'krause_topk': 8}
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=160, vocab_size=30, flex=True,
                          pos_emb='rope', **keys)).double().eval()
    idx = torch.randint(30, (2, T + 3))
    monkeypatch.setattr(attention, 'FLEX_DEVICES', ('cuda', 'cpu'))
    with torch.no_grad():
        cache = model.new_cache(2)
        logits = [model(idx[:, :T], cache=cache)[0]]  # prefill through flex
        logits += [model(idx[:, t:t + 1], cache=cache)[0] for t in range(T, T + 3)]  # then the cache
        monkeypatch.setattr(attention, 'FLEX_DEVICES', ('cuda',))
        expected = [model(idx[:, :t])[0] for t in range(T, T + 4)]  # the math path, no cache
    for got, want in zip(logits, expected):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
