"""On CUDA only (skipped elsewhere): each rule's flex path against its math path, forward AND backward, which no
CPU can check (flex has no CPU backward). Float32 without TF32 on both paths; gradients of the per-head tensors
and of the rule's own learnable parameters (σ, β, λ, γ, seeds: captured scalars have had gradient bugs in flex,
pytorch#145208). Also train.py's resume on CUDA, where the checkpoint's RNG states come back on the GPU.
Run on a lent GPU: python -m pytest -q tests/test_gpu.py"""
import pytest
import torch

from conftest import iter_losses, run_script

from machinery.masks import dense_mask
from rules import AttentionConfig, KrauseAttention, MixAttention, TopkAttention, build_attention

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (flex backward)")

# (config overrides, T): T not a multiple of flex's 128-token blocks where it matters
CASES = [
    (dict(attention='softmax'), 1000),
    (dict(attention='softmax', causal=False), 300),
    (dict(attention='softmax', window=64), 1000),
    (dict(attention='softmax', window=64), 1024),
    (dict(attention='krause', krause_window=32, krause_topk=16), 1000),
    (dict(attention='krause', krause_window=32, krause_topk=16), 1024),
    (dict(attention='krause', krause_window=256, krause_topk=192), 1000),
    (dict(attention='krause', causal=False, grid_size=8, krause_topk=2), 65),
    (dict(attention='krause', mix=True, krause_window=32, krause_topk=16), 1000),
    (dict(attention='tda', mix=True), 1000),
    (dict(attention='attentionx', attnx_gamma=3.0, attnx_learnable_gamma=True), 1000),
    (dict(attention='attentionx', attnx_gamma=3.0, attnx_learnable_gamma=True, window=64), 1000),
    (dict(attention='attentionx', causal=False, attnx_learnable_gamma=True), 300),
    (dict(attention='attentionx', causal=False, attnx_mask_diagonal=True, attnx_learnable_gamma=True), 65),
    (dict(attention='attentionx', causal=False, attnx_mask_diagonal=True, attnx_learnable_gamma=True), 300),
    (dict(attention='tda'), 1000),                           # rows with no survivors among them: T·P(s > τ) small
    (dict(attention='tda', tda_beta=0.5, tda_lambda=0.3), 1000),  # more survivors per row
    (dict(attention='tda', causal=False), 65),               # the ViT's constant threshold
    (dict(attention='tda', tda_differential=False), 300),
    (dict(attention='tda', tda_matched=True, tda_beta=0.5), 1000),   # views of D/2 = 32: q, k narrower than v
    (dict(attention='attentionx', causal=False, attnx_mask_diagonal=True, attnx_learned_temperature=True), 65),
    (dict(attention='topk', topk_k=32), 1000),
    (dict(attention='topk', topk_k=8, causal=False), 65),
    (dict(attention='topk', topk_k=16, window=64), 1000),
    (dict(attention='ssmax'), 1000),
    (dict(attention='ssmax', causal=False), 300),
    (dict(attention='ssmax', window=64), 1000),
    (dict(attention='gated'), 1000),
    (dict(attention='gated', gated_headwise=True, window=64), 1000),
    (dict(attention='diff'), 1000),                          # flex: values twice as wide as q, k
    (dict(attention='diff', causal=False), 300),
    (dict(attention='longformer', longformer_window=64), 1000),
    (dict(attention='longformer', longformer_window=512), 1000),  # the paper's top window: half the sequence
    (dict(attention='longformer', causal=False, longformer_window=16), 65),  # CLS global, with Q_g, K_g, V_g
    (dict(attention='longformer', causal=False, longformer_window=64, longformer_global=3), 300),
    (dict(attention='dex', dex_heads=4, dex_init='identity'), 1000),  # λ per head on every head
    (dict(attention='dex', dex_init='identity', window=64), 1000),
    (dict(attention='lsa', causal=False, lsa_per_head=True), 65),     # t per head
    (dict(attention='lsa', causal=False), 300),                       # t per layer
]


def case_id(case):
    kw, T = case
    return '-'.join(f'{k}={v}' for k, v in kw.items()) + f'-T={T}'


def run(attn, attend, tensors, grad_y):
    """attend's output and the gradients of its inputs and of the rule's own parameters (not the projections)."""
    own = [p for n, p in attn.named_parameters() if not any(s in n for s in ('c_attn', 'c_proj', 'gate'))]
    inputs = [t.detach().clone().requires_grad_() for t in tensors]
    y = attend(*inputs)
    return [y] + list(torch.autograd.grad(y, inputs + own, grad_y.to(y.dtype), allow_unused=True))


def ambiguous_topk_rows(attn, tensors):
    """(B, H, T) bool: Krause or top-k rows whose k-th and (k+1)-th scores (float64) lie within float32 rounding of
    each other. There the top k is ambiguous in float32, and flex (its own summation order) may keep the other key:
    one key of k swapped moves that row's output by about 1/k (seen on an H100: W=256 k=192, and the mix form)."""
    if isinstance(attn, MixAttention):
        return ambiguous_topk_rows(attn.rule, tensors[3:])
    if not isinstance(attn, (KrauseAttention, TopkAttention)):
        return torch.zeros(tensors[0].shape[:3], dtype=torch.bool, device=tensors[0].device)
    q, k = tensors[0].double(), tensors[1].double()
    T = q.size(2)
    scores = attn.scores(q, k) if isinstance(attn, KrauseAttention) else attn.tile_scores(q, k, 0, T, T)  # (B, H, T, T)
    # the neighbourhood (Krause: the causal window, or the grid); top-k: what softmax sees
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device) if attn.mask_mod is None else \
        dense_mask(attn.mask_mod, T, q.device)
    top = scores.masked_fill(~mask, float('-inf')).topk(min(attn.topk + 1, q.size(2)), -1).values
    if top.size(-1) <= attn.topk:
        return torch.zeros_like(top[..., 0], dtype=torch.bool)
    kth, next_ = top[..., attn.topk - 1], top[..., attn.topk]
    return torch.isfinite(next_) & (kth - next_ < 1e-5 * (1 + kth.abs()))


@pytest.mark.parametrize('case', CASES, ids=case_id)
def test_flex_equals_math_forward_and_backward(case):
    """Both float32 paths, math and flex, against the math path in float64 (checked on CPU against the formula)."""
    kw, T = case
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    cfg = AttentionConfig(**{**dict(n_embd=256, n_head=4, block_size=T), **kw})
    attn = build_attention(cfg, layer_idx=0).cuda().eval()
    with torch.no_grad():
        for name, p in attn.named_parameters():  # per-head parameters differ, so a mix-up of heads shows
            if p.dim() == 1 and p.numel() == cfg.n_head:
                p.add_(torch.linspace(-0.3, 0.3, p.numel(), device='cuda'))
        tensors = attn.project(torch.randn(2, T, cfg.n_embd, device='cuda'))
    ambiguous = ambiguous_topk_rows(attn, tensors)  # (B, H, T): left out of the comparison
    # an ambiguous row may keep another key on each path, which moves its output and, through the gradient that flows
    # back from it, the gradients of q, k, v and σ: such a row gets no upstream gradient
    grad_y = torch.randn(2, cfg.n_head, T, attn.attend(*tensors).size(-1), device='cuda')
    grad_y = grad_y.masked_fill(ambiguous[..., None], 0)
    math32, flex32 = run(attn, attn.attend, tensors, grad_y), run(attn, attn.attend_flex, tensors, grad_y)
    attn.double()
    math64 = run(attn, attn.attend, [t.double() for t in tensors], grad_y)
    names = ['y'] + [f'grad input {i}' for i in range(len(tensors))] + \
        [f'grad {n}' for n, _ in attn.named_parameters() if not any(s in n for s in ('c_attn', 'c_proj', 'gate'))]
    errors = {}
    for name, *results in zip(names, math32, flex32, math64):
        assert all(r is not None for r in results), f"no {name} on some path"
        m32, f32, m64 = (r.double() for r in results)
        if name == 'y':
            m32, f32, m64 = (r.masked_fill(ambiguous[..., None], 0) for r in (m32, f32, m64))
        scale = m64.abs().max().clamp_min(1e-12)
        errors[name] = (((m32 - m64).abs().max() / scale).item(), ((f32 - m64).abs().max() / scale).item())
    print(f"\n{case_id(case)}: {ambiguous.sum().item()} ambiguous top-k rows of {ambiguous.numel()}; "
          f"max error / max |value| vs float64 math, (math32, flex32):",
          {n: f'{a:.1e}, {b:.1e}' for n, (a, b) in errors.items()})
    for name, (err_math, err_flex) in errors.items():
        assert err_flex < 1e-3, f"flex {name}: error {err_flex:.2e} (float32 math: {err_math:.2e})"
        assert err_math < 1e-3, f"math {name}: error {err_math:.2e} (flex: {err_flex:.2e})"


def test_resume_on_cuda(tmp_path):
    """A checkpoint loads onto the GPU (its RNG states too: set_rng_state wants CPU tensors) and training goes on
    as it would have; dropout on, so the CUDA RNG stream is part of what must resume."""
    common = ['--device=cuda', '--dtype=float32', '--compile=False', '--n_layer=1', '--n_head=2', '--n_embd=32',
              '--batch_size=16', '--eval_iters=2', '--log_interval=1', '--warmup_iters=2', '--dropout=0.1',
              '--eval_interval=5', '--max_iters=12', '--lr_decay_iters=12', f'--data_dir={tmp_path / "data"}']
    straight = iter_losses(run_script('train.py', *common, f'--out_dir={tmp_path / "a"}'))
    run_script('train.py', *common, f'--out_dir={tmp_path / "b"}', '--max_iters=6')
    resumed = iter_losses(run_script('train.py', *common, f'--out_dir={tmp_path / "b"}', '--init_from=resume'))
    assert min(resumed) == 6 and max(resumed) == 12
    for i, loss in resumed.items():  # GPU kernels may sum in another order from run to run: not bit-exact
        assert loss == pytest.approx(straight[i], abs=1e-3), (i, loss, straight[i])


# the Triton kernels (machinery/kernels/) compiled: (rule settings, T, head size D); per-head σ that differ, T no
# multiple of the blocks, each head size the kernels take, and the long sequences the benchmarks run
KERNEL_CASES = [
    (dict(attention='krause', krause_window=32, krause_topk=16), 1000, 64),
    (dict(attention='krause', krause_window=256, krause_topk=192), 1000, 64),
    (dict(attention='krause', krause_window=64, krause_topk=8), 1000, 16),
    (dict(attention='krause', krause_window=100, krause_topk=60), 1000, 32),
    (dict(attention='krause', krause_window=256, krause_topk=192), 1000, 128),
    (dict(attention='krause', krause_window=256, krause_topk=192), 8192, 64),
    (dict(attention='tda'), 1000, 64),                                   # rows with no survivors among them
    (dict(attention='tda', tda_beta=0.5, tda_lambda=0.3), 1000, 64),     # more survivors per row
    (dict(attention='tda', causal=False), 300, 64),                      # the ViT's constant threshold
    (dict(attention='tda', tda_differential=False, tda_beta=0.5), 1000, 32),
    (dict(attention='tda', tda_matched=True, tda_beta=0.5), 1000, 64),   # views of D/2 = 32: q, k narrower than v
    (dict(attention='tda', tda_matched=True, tda_beta=0.5), 1000, 128),
    (dict(attention='tda', tda_beta=0.5, tda_p=3.0), 1000, 16),
    (dict(attention='tda', tda_beta=0.5), 4096, 64),
]


def kernel_case_id(case):
    kw, T, D = case
    return '-'.join(f'{k}={v}' for k, v in kw.items()) + f'-T={T}-D={D}'


@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
@pytest.mark.parametrize('case', KERNEL_CASES, ids=kernel_case_id)
def test_kernel_equals_math_forward_and_backward(case, dtype):
    """The kernel on float32 or bfloat16 inputs against the math path in float64 (kernel_against_float64)."""
    kw, T, D = case
    torch.backends.cuda.matmul.allow_tf32 = False
    H, B = (2, 1) if T > 1000 else (4, 2)
    kernel_against_float64(AttentionConfig(**{**dict(n_embd=H * D, n_head=H, block_size=T), **kw}), B, dtype, 'cuda',
                           kernel_case_id(case))


def kernel_against_float64(cfg, B, dtype, device, case_id):
    """A layer's kernel (forward's path on `device`) on float32 or bfloat16 inputs against its math path in float64 on
    the same (rounded) inputs: the output and every gradient, each error relative to the largest value, per-head
    parameters that differ. float32: 1e-3. bfloat16 (autocast, as training runs it): the weights enter the value
    product (and the gradients' products) in bfloat16, as flash's do, so about its rounding is allowed (3e-2), or
    twice the math path's own error under the same autocast where that is larger (flash-attention's rule): sums of
    signed terms lose more (TDA's a¹ - λa² before its RMSNorm; the scalars' gradients, where dy·y enters from the
    bfloat16 output, as in flash's backward: the math path reaches 3.5e-2 on log σ at W=256 k=192 D=128)."""
    torch.manual_seed(0)
    attn = build_attention(cfg, layer_idx=0).to(device).eval()
    with torch.no_grad():
        for name, p in attn.named_parameters():  # per-head parameters differ, so a mix-up of heads shows
            if p.dim() == 1 and p.numel() == cfg.n_head:
                p.add_(torch.linspace(-0.3, 0.3, p.numel(), device=device))
        tensors = [t.to(getattr(torch, dtype)) for t in attn.project(torch.randn(B, cfg.block_size, cfg.n_embd,
                                                                                device=device))]
    ambiguous = ambiguous_topk_rows(attn, [t.double() for t in tensors])  # (B, H, T): left out, as in the flex test
    grad_y = torch.randn(*ambiguous.shape, cfg.n_embd // cfg.n_head, device=device).masked_fill(ambiguous[..., None], 0)
    assert attn.path_name(device) == 'kernel'
    with torch.autocast(device, torch.bfloat16, enabled=dtype == 'bfloat16'):
        result = run(attn, attn.path(device), tensors, grad_y)  # forward's path: the kernel
        pytorch = run(attn, attn.attend, tensors, grad_y)      # the math path, rounded the same way
    attn.double()
    reference = run(attn, attn.attend, [t.double() for t in tensors], grad_y)
    names = ['y'] + [f'grad input {i}' for i in range(len(tensors))] + \
        [f'grad {n}' for n, _ in attn.named_parameters() if not any(s in n for s in ('c_attn', 'c_proj', 'gate'))]
    errors, pytorch_errors = (relative_errors(names, r, reference, ambiguous) for r in (result, pytorch))
    print(f"\n{case_id} {dtype}: {ambiguous.sum().item()} ambiguous top-k rows; max error / max |value| vs float64 "
          f"math, the kernel's:", {n: f'{e:.1e}' for n, e in errors.items()},
          "the math path's:", {n: f'{e:.1e}' for n, e in pytorch_errors.items()})
    for name, error in errors.items():
        tolerance = 1e-3 if dtype == 'float32' else max(3e-2, 2 * pytorch_errors[name])
        assert error < tolerance, f"kernel {name}: error {error:.2e} (the math path's: {pytorch_errors[name]:.2e})"
    return errors


def relative_errors(names, result, reference, ambiguous):
    """{name: max |result - reference| / max |reference|}, the output's ambiguous top-k rows left out."""
    errors = {}
    for name, r, m in zip(names, result, reference):
        assert r is not None, f"no {name} from the path"
        r, m = r.double(), m.double()
        if name == 'y':
            r, m = (x.masked_fill(ambiguous[..., None], 0) for x in (r, m))
        errors[name] = ((r - m).abs().max() / m.abs().max().clamp_min(1e-12)).item()
    return errors
