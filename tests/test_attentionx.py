"""AttentionX against a slow reference written straight from the formula (docs/rules.md#attentionx): y_i = v_i - γ_h
Σ_j softmax_j(q_i·k_j/√D) v_j over the keys j that query i sees, one query at a time. Float64, forward and
gradients (q, k, v, γ), with a different γ per head (one of them negative) so that a mix-up of heads would show."""
import math

import pytest
import torch

from attention import AttentionConfig, build_attention, off_diagonal_mask
from conftest import ROOT, assert_causal, run_script
from model import GPT, GPTConfig
from vit import ViT, ViTConfig

GAMMA = [3.0, 1.0, -0.5, 2.0]  # per head


def attentionx_reference(q, k, v, gamma, visible):
    """One query at a time: softmax over the visible keys, the weighted sum of their values, v_i minus γ_h of it."""
    B, H, T, D = q.shape
    rows = []
    for i in range(T):
        js = visible(i)
        scores = torch.stack([(q[:, :, i] * k[:, :, j]).sum(-1) / math.sqrt(D) for j in js], -1)  # (B, H, n)
        weights = scores.softmax(-1)
        gathered = sum(weights[..., n, None] * v[:, :, j] for n, j in enumerate(js))           # (B, H, D)
        rows.append(v[:, :, i] - gamma.view(1, H, 1) * gathered)
    return torch.stack(rows, 2)  # (B, H, T, D)


def make(T, **kw):
    cfg = AttentionConfig(**{**dict(n_embd=32, n_head=4, block_size=T, attention='attentionx'), **kw})
    attn = build_attention(cfg, 0).double()
    with torch.no_grad():
        attn.gamma.copy_(torch.tensor(GAMMA))
    return attn


def qkv(T, B=2, H=4, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, D, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3)]


def visible_keys(T, causal, mask_diagonal, window):
    return lambda i: [j for j in range(T) if (not causal or j <= i) and (not window or i - j < window)
                      and not (mask_diagonal and j == i)]


@pytest.mark.parametrize('learnable', [False, True], ids=['fixed', 'learnable'])
@pytest.mark.parametrize('T,causal,mask_diagonal,window', [
    (13, True, False, 0),    # the GPT form (paper: γ = 3)
    (13, False, False, 0),   # bidirectional
    (13, False, True, 0),    # the ViT form: bidirectional, no token attends to itself (paper: γ = 1)
    (2, False, True, 0),     # two tokens, diagonal masked: y_0 = v_0 - γ v_1 exactly
    (17, True, False, 4),    # the sliding window comes with SoftmaxAttention's attend
], ids=['causal', 'bidirectional', 'diagonal-masked', 'two-tokens', 'window'])
def test_matches_reference(T, causal, mask_diagonal, window, learnable):
    attn = make(T, causal=causal, attnx_mask_diagonal=mask_diagonal, window=window, attnx_learnable_gamma=learnable)
    assert isinstance(attn.gamma, torch.nn.Parameter) == learnable
    q, k, v = qkv(T)
    for attend in (attn.attend, attn.attend_fused):  # the formula as tensor ops, and SDPA / the band
        y = attend(q, k, v)
        ref = attentionx_reference(q, k, v, attn.gamma, visible_keys(T, causal, mask_diagonal, window))
        torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5)
        g = torch.randn_like(y)
        inputs = (q, k, v, attn.gamma) if learnable else (q, k, v)
        grads = torch.autograd.grad(y, inputs, g)
        grads_ref = torch.autograd.grad(ref, inputs, g)
        for name, a, b in zip('q k v gamma'.split(), grads, grads_ref):
            if T > 2 or name in ('v', 'gamma'):  # (with one key per row the weights are 1: q and k get no gradient)
                assert b.abs().sum() > 0, name  # the reference gradient is not trivially zero
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=f'gradient of {name}')
        if T == 2:  # one key per row: the weights are 1, y_0 = v_0 - γ v_1 and y_1 = v_1 - γ v_0
            torch.testing.assert_close(y, v - attn.gamma.view(1, -1, 1, 1) * v.flip(2), atol=1e-12, rtol=0)


def test_gamma_one_is_the_attention_graph_laplacian():
    # with γ = 1, y = (I - A)V; the rows of I - A sum to 0, so a constant v gives y = 0 (a high-pass filter)
    attn = make(9, causal=False, attnx_mask_diagonal=True)
    with torch.no_grad():
        attn.gamma.fill_(1.0)
    q, k, _ = qkv(9)
    v = torch.ones(2, 4, 9, 8, dtype=torch.float64)
    torch.testing.assert_close(attn.attend(q, k, v), torch.zeros_like(v), atol=1e-12, rtol=0)


@pytest.mark.parametrize('kw', [dict(attnx_gamma=3.0), dict(attnx_gamma=3.0, attnx_learnable_gamma=True, window=5),
                                dict(attnx_gamma=-1.0, pos_emb='rope')])
def test_gpt_is_causal(kw):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=24, vocab_size=11, attention='attentionx',
                          **kw)).eval()
    assert_causal(model, T=24, cut=15)


@pytest.mark.parametrize('kw', [dict(), dict(causal=False), dict(causal=False, attnx_mask_diagonal=True),
                                dict(window=8)], ids=['causal', 'bidirectional', 'diagonal-masked', 'window'])
def test_flex_forward_equals_math(kw):
    T = 200  # not a multiple of the flex block size (128)
    attn = make(T, **kw).float()
    q, k, v = (t.detach().float() for t in qkv(T))
    with torch.no_grad():
        torch.testing.assert_close(attn.attend_flex(q, k, v), attn.attend(q, k, v), atol=1e-5, rtol=1e-5)


def test_learnable_gamma_is_per_head_learned_and_not_decayed():
    torch.manual_seed(0)
    model = ViT(ViTConfig(n_layer=2, n_head=4, n_embd=32, num_classes=10, attention='attentionx', attnx_gamma=1.0,
                          attnx_learnable_gamma=True, attnx_mask_diagonal=True))
    attn = model.h[1].attn
    assert torch.equal(attn.gamma, torch.ones(4)) and attn.mask_mod is off_diagonal_mask
    decay, no_decay = model.configure_optimizers(0.05, 1e-3, (0.9, 0.999), 'cpu').param_groups
    assert any(p is attn.gamma for p in no_decay['params']) and not any(p is attn.gamma for p in decay['params'])
    _, loss = model(torch.randn(2, 3, 32, 32), torch.tensor([3, 7]))
    loss.backward()
    assert (attn.gamma.grad != 0).all()
    fixed = GPT(GPTConfig(n_layer=1, n_head=4, n_embd=32, block_size=8, vocab_size=11, attention='attentionx',
                          attnx_gamma=3.0))
    assert torch.equal(fixed.transformer.h[0].attn.gamma, torch.full((4,), 3.0))
    assert not any('gamma' in name for name, _ in fixed.named_parameters())  # fixed: a buffer, set by the config
    assert not any('gamma' in name for name in fixed.state_dict())


def test_bad_settings_are_refused_naming_the_key(tmp_path):
    for gamma in (float('nan'), float('inf'), float('-inf')):
        with pytest.raises(ValueError, match='attnx_gamma must be a finite number'):
            make(8, attnx_gamma=gamma)
    with pytest.raises(ValueError, match='attnx_mask_diagonal=True needs causal=False'):
        make(8, attnx_mask_diagonal=True)  # causal by default: row 0 would see no key
    make(8, attnx_gamma=-2.0)  # a negative γ is allowed: v + |γ|·AV, a smoothing (low-pass) rule
    log = run_script('train.py', '--attention=attentionx', '--attnx_mask_diagonal=True', f'--out_dir={tmp_path}',
                     f'--data_dir={tmp_path / "recall"}', check=False)  # a GPT: causal
    assert 'error: attnx_mask_diagonal=True needs causal=False' in log and 'Traceback' not in log


@pytest.mark.parametrize('name,expect', [
    ('attentionx_gpt', dict(dataset='openwebtext', n_layer=12, attnx_gamma=3.0, attnx_mask_diagonal=False)),
    ('attentionx_vit', dict(dataset='cifar10', n_layer=12, attnx_gamma=1.0, attnx_mask_diagonal=True)),
])
def test_configs_are_the_papers_forms_on_the_softmax_recipes(name, expect):
    scope = {'__file__': str(ROOT / 'config' / f'{name}.py')}
    exec(open(scope['__file__']).read(), scope)
    assert {k: scope[k] for k in expect} == expect and scope['attention'] == 'attentionx'
