"""The Triton kernels (machinery/*_kernel.py) against their rules' math paths (`attend`, itself checked against the
formula in tests/test_krause.py and tests/test_tda.py), in float32: forward and every gradient, at a length that is
no multiple of the kernels' blocks (T = 150), per-head parameters that differ, and Krause at a tie at the k-th score.
Without a GPU they run on the CPU through triton's interpreter (TRITON_INTERPRET=1, set in conftest.py before any
kernel is defined); on a GPU, compiled (tests/test_gpu.py adds bfloat16 and long sequences). Sizes stay tiny
(B=1, H=2, D=16): the interpreter runs each program in Python."""
import pytest
import torch
import torch.nn.functional as F

from attention import AttentionConfig, build_attention
from machinery.triton_available import triton, triton_runs_on

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'
pytestmark = pytest.mark.skipif(not triton_runs_on(DEVICE),
                                reason="needs triton (requirements-extras.txt): compiled on CUDA, or TRITON_INTERPRET=1 "
                                       "on the CPU" if triton is not None else "triton is not installed")
T = 150  # no multiple of any block


def tda_kernel_attend(attn, *tensors):
    """The TDA rule's attend with its sum over keys in the kernel: the views normalised, τ and λ, the RMSNorm after."""
    from machinery.tda_kernel import tda_attention
    qk, v = attn.split_views(tensors)
    qk = [F.normalize(t, dim=-1) for t in qk]
    tau = attn.threshold(v.size(2), v.device)
    lam = torch.sigmoid(attn.lambda_logit) if attn.differential else None
    q2, k2 = qk[2:] if attn.differential else (None, None)
    return attn.head_norm(tda_attention(qk[0], qk[1], q2, k2, v, tau, lam, attn.p, attn.causal))


def compare(attn, attend, tensors, names, tolerance=1e-5):
    """attend and attn.attend on the same inputs: the output and the gradients of the inputs and of the rule's own
    parameters, each error relative to the largest value of the math path's; prints them, returns them."""
    own = {n: p for n, p in attn.named_parameters() if not n.startswith(('c_attn', 'c_proj'))}
    results = []
    for fn in (attn.attend, attend):
        inputs = [t.detach().clone().requires_grad_() for t in tensors]
        y = fn(*inputs)
        grad_y = torch.linspace(-1, 1, y.numel(), device=y.device).view_as(y)  # a gradient that is no constant
        results.append([y, *torch.autograd.grad(y, inputs + list(own.values()), grad_y)])
    errors = {}
    for name, reference, result in zip(['y', *names, *own], *results):
        assert reference.abs().max() > 0, f"{name}: the math path's is zero, so the comparison shows nothing"
        errors[name] = ((result - reference).abs().max() / reference.abs().max()).item()
    print(' '.join(f"{n} {e:.1e}" for n, e in errors.items()))
    for name, error in errors.items():
        assert error < tolerance, f"{name}: error {error:.2e}"
    return errors


def tda_module(causal, differential, matched, p):
    cfg = AttentionConfig(n_embd=32, n_head=2, block_size=T, attention='tda', tda_beta=0.6, tda_lambda=0.3,
                          causal=causal, tda_differential=differential, tda_matched=matched, tda_p=p)
    attn = build_attention(cfg, 0).to(DEVICE)
    with torch.no_grad():  # a norm weight that is not all ones
        attn.head_norm.weight.copy_(torch.linspace(0.5, 1.5, attn.head_dim))
    return attn


def tda_inputs(attn, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 2, T, 16, generator=g).to(DEVICE) for _ in attn.projections]


# (causal, differential, matched, p): both views and one (TRA), full-width and matched (d = D/2) views, the GPT's
# causal form and the ViT's bidirectional one, p = 2 (squared), 1 and 3 (the general power)
TDA_CASES = [(True, True, False, 2.0), (False, True, False, 2.0), (True, False, False, 2.0), (False, False, False, 1.0),
             (True, True, True, 2.0), (False, True, True, 2.0), (True, True, False, 3.0)]


@pytest.mark.parametrize('causal,differential,matched,p', TDA_CASES)
def test_tda_kernel_equals_math(causal, differential, matched, p):
    attn = tda_module(causal, differential, matched, p)
    tensors = tda_inputs(attn)
    weights = attn.attention_weights(*tensors)
    visible = torch.ones(T, T, device=DEVICE).tril().bool() if causal else torch.ones(T, T, device=DEVICE).bool()
    assert 0.2 < (weights == 0)[..., visible].float().mean().item() < 0.99  # weights that pass and that do not
    compare(attn, lambda *t: tda_kernel_attend(attn, *t), tensors, attn.projections)


@pytest.mark.parametrize('skip', [True, False])
def test_tda_kernel_skips_a_key_block_without_survivors(skip, monkeypatch):
    """Keys 64..127 all zero: every score there is 0 < τ, so those key blocks' value products are skipped (or not);
    the same function either way."""
    import machinery.tda_kernel as kernel
    monkeypatch.setattr(kernel, 'SKIP_EMPTY_BLOCKS', skip)
    attn = tda_module(True, True, False, 2.0)
    tensors = tda_inputs(attn)
    for i in (1, 3):  # k1, k2
        tensors[i][:, :, 64:128] = 0
    compare(attn, lambda *t: tda_kernel_attend(attn, *t), tensors, attn.projections)


def krause_kernel_attend(attn, q, k, v):
    """The Krause rule's band in the kernel: W keys per query, the top k kept, a softmax over them."""
    from machinery.krause_kernel import krause_band_attention
    return krause_band_attention(q, k, v, attn.log_sigma, attn.krause_window, attn.topk)


def krause_module(W, topk):
    cfg = AttentionConfig(n_embd=32, n_head=2, block_size=T, attention='krause', krause_window=W, krause_topk=topk)
    attn = build_attention(cfg, 0).to(DEVICE)
    with torch.no_grad():  # a different σ per head, so a mix-up of heads would show
        attn.log_sigma.copy_(torch.log(torch.tensor([0.7, 1.3])))
    return attn


def krause_inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 2, T, 16, generator=g).to(DEVICE) for _ in range(3)]


# (W, k): the GPT setting; a narrow window; W = k (every row keeps all); W no power of two with a wider left tile
# (32-query blocks); in each, the first rows reach k keys or fewer and keep them all
@pytest.mark.parametrize('W,topk', [(32, 16), (8, 3), (20, 20), (100, 60), (128, 96)])
def test_krause_kernel_equals_math(W, topk):
    attn = krause_module(W, topk)
    # scores of tens (σ = 0.7): float32 rounds them by ~1e-6, which exp carries into every output and gradient
    compare(attn, lambda *t: krause_kernel_attend(attn, *t), krause_inputs(), 'qkv', tolerance=1e-4)


def test_krause_kernel_keeps_every_key_tied_at_the_kth():
    """Keys 40..89 identical: their scores tie exactly, at and around each row's k-th, and the rows keep every tied
    key (the math path's boundary halfway between the k-th and the (k+1)-th: >= keeps the tie)."""
    attn = krause_module(32, 16)
    q, k, v = krause_inputs()
    k[:, :, 40:90] = k[:, :, 40:41]
    scores = attn.scores(q, k)[..., 89, 58:90]  # row 89's window: 32 keys, all tied
    assert (scores == scores[..., :1]).all()
    compare(attn, lambda *t: krause_kernel_attend(attn, *t), [q, k, v], 'qkv', tolerance=1e-4)
