"""The Triton kernels (machinery/kernels/) against their rules' math paths (`attend`, itself checked against the
formula in tests/test_krause.py and tests/test_tda.py), in float32: forward and every gradient, at a length that is
no multiple of the kernels' blocks (T = 70; 150 where a case needs more), per-head parameters that differ, and
Krause at a tie at the k-th score.
Without a GPU they run on the CPU through triton's interpreter (TRITON_INTERPRET=1, set in conftest.py before any
kernel is defined); on a GPU, compiled (tests/test_gpu.py adds long sequences). bfloat16 as tests/test_gpu.py bars
it, at the end. Sizes stay tiny (B=1, H=2, D=16): the interpreter runs each program in Python."""
import pytest
import torch

from conftest import ROOT

import rules.krause
import rules.tda
from machinery.kernels.triton_available import triton, triton_runs_on
from rules import AttentionConfig, build_attention

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'
pytestmark = pytest.mark.skipif(not triton_runs_on(DEVICE),
                                reason="needs triton (requirements-extras.txt): compiled on CUDA, or TRITON_INTERPRET=1 "
                                       "on the CPU" if triton is not None else "triton is not installed")
# the interpreter's time grows with the programs and loop trips a length makes, so each case takes the shorter length
# that covers its tiles: T = 70 is no multiple of any block (16, 32, 64) and spans several of each, a masked tail
# among them; T_WIDE = 150 reaches past the widest window (W = 128) and holds a whole 64-key block before its tail
T, T_WIDE = 70, 150


@pytest.fixture
def kernel_calls(monkeypatch):
    """Forward's path (Attention.path) on the rules' kernels here too (the CPU through the interpreter:
    KERNEL_DEVICES), each call of a kernel counted, so that a comparison cannot pass by falling back to the math
    path."""
    import machinery.kernels.triton_available as available
    monkeypatch.setattr(available, 'KERNEL_DEVICES', ('cuda', 'cpu'))
    calls = []
    for module, name in ((rules.krause, 'krause_band_attention'), (rules.tda, 'tda_attention')):
        kernel = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *args, kernel=kernel, name=name: calls.append(name) or kernel(*args))
    return calls


def compare(attn, attend, tensors, names, tolerance=1e-5):
    """attend and attn.attend on the same inputs: the output and the gradients of the inputs and of the rule's own
    parameters, each error relative to the largest value of the math path's; prints them, returns them."""
    own = {n: p for n, p in attn.named_parameters() if not {'c_attn', 'c_proj', 'gate'} & set(n.split('.'))}
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


def tda_module(causal, differential, matched, p, T=T):
    cfg = AttentionConfig(n_embd=32, n_head=2, block_size=T, attention='tda', tda_beta=0.6, tda_lambda=0.3,
                          causal=causal, tda_differential=differential, tda_matched=matched, tda_p=p)
    attn = build_attention(cfg, 0).to(DEVICE)
    with torch.no_grad():  # a norm weight that is not all ones
        attn.head_norm.weight.copy_(torch.linspace(0.5, 1.5, attn.head_dim))
    return attn


def tda_inputs(attn, seed=0, T=T):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 2, T, 16, generator=g).to(DEVICE) for _ in attn.projections]


# (causal, differential, matched, p): both views and one (TRA), full-width and matched (d = D/2) views, the GPT's
# causal form and the ViT's bidirectional one, p = 2 (squared), 1 and 3 (the general power)
TDA_CASES = [(True, True, False, 2.0), (False, True, False, 2.0), (True, False, False, 2.0), (False, False, False, 1.0),
             (True, True, True, 2.0), (False, True, True, 2.0), (True, True, False, 3.0)]


@pytest.mark.parametrize('causal,differential,matched,p', TDA_CASES)
def test_tda_kernel_equals_math(causal, differential, matched, p, kernel_calls):
    # T_WIDE: τ's and λ's gradients sum every weight's, and at T = 70 their float32 sums cancel past the 1e-5 bar
    attn = tda_module(causal, differential, matched, p, T_WIDE)
    tensors = tda_inputs(attn, T=T_WIDE)
    weights = attn.attention_weights(*tensors)
    visible = torch.ones(T_WIDE, T_WIDE, device=DEVICE).tril().bool() if causal else \
        torch.ones(T_WIDE, T_WIDE, device=DEVICE).bool()
    assert 0.2 < (weights == 0)[..., visible].float().mean().item() < 0.99  # weights that pass and that do not
    compare(attn, attn.path(DEVICE), tensors, attn.projections)
    assert kernel_calls == ['tda_attention']


@pytest.mark.parametrize('zeroed', [(1, 3), (1,)], ids=['both views', 'view 1 only'])
def test_tda_kernel_skips_a_key_block_without_survivors(zeroed, kernel_calls):
    """Keys 64..127 all zero: every score there is 0 < τ. In both views, that key block's tiles have no positive
    excess and are skipped after their scores; in view 1 only, they still carry -λa², which must not be skipped.
    The math path's function either way."""
    attn = tda_module(True, True, False, 2.0, T_WIDE)  # the keys' kernel's second 64-key block, whole
    tensors = tda_inputs(attn, T=T_WIDE)
    for i in zeroed:  # k1, k2
        tensors[i][:, :, 64:128] = 0
    survivors = (attn.attention_weights(*tensors)[..., 64:128] != 0).any().item()
    assert survivors == (len(zeroed) == 1)  # the case is the one named
    compare(attn, attn.path(DEVICE), tensors, attn.projections)
    assert kernel_calls


def krause_module(W, topk, T=T):
    cfg = AttentionConfig(n_embd=32, n_head=2, block_size=T, attention='krause', krause_window=W, krause_topk=topk)
    attn = build_attention(cfg, 0).to(DEVICE)
    with torch.no_grad():  # a different σ per head, so a mix-up of heads would show
        attn.log_sigma.copy_(torch.log(torch.tensor([0.7, 1.3])))
    return attn


def krause_inputs(seed=0, T=T):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 2, T, 16, generator=g).to(DEVICE) for _ in range(3)]


# (W, k): the GPT setting; a narrow window; W = k (every row keeps all); W no power of two with a wider left tile
# (32-query blocks); in each, the first rows reach k keys or fewer and keep them all (the wide windows at T_WIDE: the
# kernel narrows a window to T)
@pytest.mark.parametrize('W,topk,T', [(32, 16, T), (8, 3, T), (20, 20, T), (100, 60, T_WIDE), (128, 96, T_WIDE)])
def test_krause_kernel_equals_math(W, topk, T, kernel_calls):
    attn = krause_module(W, topk, T)
    # scores of tens (σ = 0.7): float32 rounds them by ~1e-6, which exp carries into every output and gradient
    compare(attn, attn.path(DEVICE), krause_inputs(T=T), 'qkv', tolerance=1e-4)
    assert kernel_calls


@pytest.mark.parametrize('rule', ['krause', 'tda'])
def test_the_mix_forms_rule_branch_runs_its_kernel(rule, kernel_calls):
    """The mix form (the Krause paper's LM form: softmax beside the rule): forward's path runs the rule's branch on
    its kernel and the softmax branch on SDPA (flash on a GPU), and equals the two branches' math paths."""
    cfg = AttentionConfig(n_embd=32, n_head=2, block_size=T, attention=rule, mix=True, krause_window=32,
                          krause_topk=16, tda_beta=0.6, tda_lambda=0.3)
    attn = build_attention(cfg, 0).to(DEVICE)
    if rule == 'krause':
        with torch.no_grad():
            attn.rule.log_sigma.copy_(torch.log(torch.tensor([0.7, 1.3])))
    names = ['q', 'k', 'v', *(f"rule's {n}" for n in (attn.rule.projections or 'qkv'))]
    tensors = krause_inputs() + (krause_inputs(1) if rule == 'krause' else tda_inputs(attn.rule, 1))
    compare(attn, attn.path(DEVICE), tensors, names, tolerance=1e-4)
    assert kernel_calls == [f"{'krause_band' if rule == 'krause' else 'tda'}_attention"]


def whole_number_krause(scale, W=32, topk=16, T=T):
    """Krause (σ = 1 and 2: σ⁻² exact) on whole-number q and k in [-4, 4] scaled by a power of two: every score is
    exact in float32 in any order of summation, scores of either sign and zeros among them, and ties abound."""
    attn = krause_module(W, topk, T)
    with torch.no_grad():
        attn.log_sigma.copy_(torch.log(torch.tensor([1.0, 2.0])))
    g = torch.Generator().manual_seed(1)
    q, k = (torch.randint(-4, 5, (1, 2, T, 16), generator=g).float().to(DEVICE) * scale for _ in range(2))
    return attn, [q, k, torch.randn(1, 2, T, 16, generator=g).to(DEVICE)]


@pytest.mark.parametrize('scale', [2.0 ** -10, 1.0])
def test_krause_kernel_selects_exactly_at_any_scale(scale, kernel_calls):
    """Scores crowded near 0 (~1e-4) or spread over hundreds, ties abounding: the kernel keeps exactly the math
    path's keys, so the outputs and gradients agree to float32's rounding of exp."""
    attn, tensors = whole_number_krause(scale)
    compare(attn, attn.path(DEVICE), tensors, 'qkv', tolerance=1e-4)
    assert kernel_calls


def test_krause_kernel_keeps_every_key_tied_at_the_kth(kernel_calls):
    """Keys 20..69 identical: their scores tie exactly, at and around each row's k-th, and the rows keep every tied
    key (the math path's boundary halfway between the k-th and the (k+1)-th: >= keeps the tie). Whole-number q and
    k (whole_number_krause), so the tie is one inside the kernel too: identical random-float keys' dot products round
    differently by the key's place in the tile where the interpreter's tl.dot runs on numpy's BLAS (OpenBLAS's
    Haswell kernels), and the tie breaks in the last bit."""
    attn, (q, k, v) = whole_number_krause(2.0 ** -2)  # (1, 2, T, 16) each; scores of a few units, not tens
    k[:, :, 20:70] = k[:, :, 20:21]  # the tied keys carry most of rows 20..69's weight, the masked tail's among them
    scores = attn.scores(q, k)[..., 69, 38:70]  # row 69's window: 32 keys, all tied
    assert (scores == scores[..., :1]).all()
    compare(attn, attn.path(DEVICE), [q, k, v], 'qkv', tolerance=1e-4)
    assert kernel_calls


@pytest.mark.parametrize('scale,W,topk,T', [(2.0 ** -10, 32, 16, T), (1.0, 32, 16, T), (2.0 ** 6, 32, 16, T),
                                            (1.0, 128, 96, T_WIDE), (2.0 ** -10, 128, 96, T_WIDE)])
def test_krause_kernel_boundaries_are_the_math_paths(scale, W, topk, T):
    """Each row's boundary as the kernel saves it equals the math path's topk_boundary bit for bit, at scores near
    0, over hundreds and over ~1e6 (there the gradients are float32 cancellations on either path, Σ_j ds_ij = 0
    against scores of 1e6, so the selection is compared directly), in the narrow band and the wide one (its radix
    search runs more passes, over scores of both signs)."""
    from machinery.kernels.krause import krause_band_attention
    attn, (q, k, v) = whole_number_krause(scale, W, topk, T)
    y = krause_band_attention(q, k, v, attn.log_sigma, attn.krause_window, attn.topk)
    boundary = y.grad_fn.saved_tensors[-1].view(1, 2, T)  # (B·H, T), the last tensor the forward saves
    expected = attn.topk_boundaries(q, k, attn.neighbours(T, q.device))
    assert (expected > float('-inf')).sum() > 0 and (expected == float('-inf')).sum() > 0  # rows of both kinds
    assert torch.equal(boundary, expected)


def test_a_krause_window_wider_than_the_kernel_counts_takes_the_math_path(kernel_calls):
    """The kernel packs a row's counts 9 bits each, so it takes windows of up to MAX_WINDOW keys: a wider band runs
    the math path, and the kernel itself refuses one."""
    from machinery.kernels.krause import MAX_WINDOW, krause_band_attention
    wide = AttentionConfig(n_embd=32, n_head=2, block_size=1024, attention='krause', krause_window=MAX_WINDOW + 1,
                           krause_topk=16)
    assert build_attention(wide, 0).path_name(DEVICE) != 'kernel'
    assert krause_module(MAX_WINDOW, 16).path_name(DEVICE) == 'kernel'
    q = torch.randn(1, 1, 8, 16, device=DEVICE)
    with pytest.raises(ValueError, match=f"at most {MAX_WINDOW} keys"):
        krause_band_attention(q, q, q, torch.zeros(1, device=DEVICE), MAX_WINDOW + 1, 16)


@pytest.mark.parametrize('config,expected', [('krause_gpt', 'krause (mix), Triton kernel (no dropout on the weights) '
                                                            'beside SDPA'),
                                             ('tda_gpt', 'tda, Triton kernel')])
def test_the_paper_configs_run_their_kernels_on_cuda(config, expected, monkeypatch):
    """What train.py's start-up line says on CUDA (compiled triton, no interpreter) for each paper config as it is, at
    one layer: the kernel, not flex and not the math path."""
    import machinery.kernels.triton_available as available
    from model import GPT, GPTConfig, attention_paths
    from support.runtime import dataclass_values
    monkeypatch.setattr(available, 'INTERPRETED', False)  # as on a GPU: compiled kernels
    path = ROOT / 'config' / f'{config}.py'
    settings = {'__file__': str(path)}
    exec(path.read_text(), settings)
    model = GPT(GPTConfig(**{**dataclass_values(GPTConfig, settings), 'n_layer': 1, 'vocab_size': 64}))
    assert attention_paths(model, 'cuda') == expected
    assert attention_paths(model, 'cpu').endswith('math path beside SDPA' if config == 'krause_gpt' else 'math path')


@pytest.mark.parametrize('kw', [dict(attention='krause', krause_window=32, krause_topk=16),
                                dict(attention='tda', tda_beta=0.5, tda_lambda=0.3)], ids=['krause', 'tda'])
def test_the_kernels_in_bfloat16_as_the_gpu_test_bars_them(kw, kernel_calls):
    """tests/test_gpu.py's bfloat16 case here (the interpreter's tl.dot widening bfloat16 operands to float32, as a
    GPU's tensor cores take them): each error within bfloat16's rounding of the float64 math path, or twice the math
    path's own error under the same autocast."""
    from test_gpu import kernel_against_float64
    kernel_against_float64(AttentionConfig(n_embd=32, n_head=2, block_size=T, **kw), 1, 'bfloat16', DEVICE, kw)
    assert kernel_calls
