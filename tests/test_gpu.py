"""On CUDA only (skipped elsewhere): each rule's flex path against its math path, forward AND backward, which no
CPU can check (flex has no CPU backward). Float32 without TF32 on both paths; gradients of the per-head tensors
and of the rule's own learnable parameters (σ, β, λ, γ, seeds: captured scalars have had gradient bugs in flex,
pytorch#145208). Run on a lent GPU: python -m pytest -q tests/test_gpu.py"""
import pytest
import torch

from attention import AttentionConfig, build_attention

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (flex backward)")

# (config overrides, T): T not a multiple of flex's 128-token blocks where it matters
CASES = [
    (dict(attention='softmax'), 1000),
    (dict(attention='softmax', causal=False), 300),
    (dict(attention='softmax', window=64), 1000),
    (dict(attention='krause', krause_window=32, krause_topk=16), 1000),
    (dict(attention='krause', krause_window=256, krause_topk=192), 1000),
    (dict(attention='krause', causal=False, grid_size=8, krause_topk=2), 65),
    (dict(attention='krause', krause_mix=True, krause_window=32, krause_topk=16), 1000),
    (dict(attention='tda'), 1000),                           # rows with no survivors among them: T·P(s > τ) small
    (dict(attention='tda', tda_beta=0.5, tda_lambda=0.3), 1000),  # more survivors per row
    (dict(attention='tda', causal=False), 65),               # the ViT's constant threshold
    (dict(attention='tda', tda_differential=False), 300),
]


def case_id(case):
    kw, T = case
    return '-'.join(f'{k}={v}' for k, v in kw.items()) + f'-T={T}'


@pytest.mark.parametrize('case', CASES, ids=case_id)
def test_flex_equals_math_forward_and_backward(case):
    kw, T = case
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    cfg = AttentionConfig(**{**dict(n_embd=256, n_head=4, block_size=T), **kw})
    attn = build_attention(cfg, layer_idx=0).cuda()
    with torch.no_grad():
        for name, p in attn.named_parameters():  # per-head parameters differ, so a mix-up of heads shows
            if 'c_attn' not in name and 'c_proj' not in name and p.dim() == 1 and p.numel() == cfg.n_head:
                p.add_(torch.linspace(-0.3, 0.3, p.numel(), device='cuda'))
        tensors = attn.project(torch.randn(2, T, cfg.n_embd, device='cuda'))
    own = {n: p for n, p in attn.named_parameters() if 'c_attn' not in n and 'c_proj' not in n and 'gate' not in n}
    results = []
    for attend in (attn.attend, attn.attend_flex):
        inputs = [t.detach().clone().requires_grad_() for t in tensors]
        y = attend(*inputs)
        grad_y = torch.randn_like(y, generator=torch.Generator('cuda').manual_seed(1))
        grads = torch.autograd.grad(y, inputs + list(own.values()), grad_y, allow_unused=True)
        results.append((y, grads))
    (y_math, g_math), (y_flex, g_flex) = results
    torch.testing.assert_close(y_flex, y_math, atol=2e-4, rtol=2e-4)
    names = [f'input {i}' for i in range(len(tensors))] + list(own)
    for name, a, b in zip(names, g_flex, g_math):
        assert a is not None and b is not None, f"no gradient for {name}"
        scale = b.abs().max().clamp_min(1e-6)
        assert (a - b).abs().max() / scale < 2e-3, f"gradient of {name}: flex {a.flatten()[:4]} math {b.flatten()[:4]}"
