"""AttentionX against a slow reference written straight from the formula (docs/rules.md#attentionx): y_i = v_i - γ_h
Σ_j softmax_j(q_i·k_j/√D) v_j over the keys j that query i sees, one query at a time. Float64, forward and
gradients (q, k, v, γ), with a different γ per head (one of them negative) so that a mix-up of heads would show; and
on the paper's ViT base, LSA's learned temperature in place of 1/√D, where A is LSA's exactly."""
import math
from functools import partial

import pytest
import torch

from machinery.masks import off_diagonal_mask
from rules import AttentionConfig, build_attention
from conftest import ROOT, assert_causal, build_layer, cached_generation_equals_the_forward, run_script
from conftest import qkv as shared_qkv
from model import GPT, GPTConfig
from vit import ViT, ViTConfig

GAMMA = [3.0, 1.0, -0.5, 2.0]  # per head


def attentionx_reference(q, k, v, gamma, visible, t=None):
    """One query at a time: softmax over the visible keys of q_i·k_j/√D (or t·q_i·k_j, t a learned temperature), the
    weighted sum of their values, v_i minus γ_h of it."""
    B, H, T, D = q.shape
    scale = 1 / math.sqrt(D) if t is None else t
    rows = []
    for i in range(T):
        js = visible(i)
        scores = torch.stack([(q[:, :, i] * k[:, :, j]).sum(-1) * scale for j in js], -1)  # (B, H, n)
        weights = scores.softmax(-1)
        gathered = sum(weights[..., n, None] * v[:, :, j] for n, j in enumerate(js))           # (B, H, D)
        rows.append(v[:, :, i] - gamma.view(1, H, 1) * gathered)
    return torch.stack(rows, 2)  # (B, H, T, D)


def make(T, **kw):
    attn = build_layer('attentionx', T, n_head=4, **kw)
    with torch.no_grad():
        attn.gamma.copy_(torch.tensor(GAMMA))
    return attn


qkv = partial(shared_qkv, H=4)  # conftest's q, k, v at this file's head shape


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


@pytest.mark.parametrize('T,causal,mask_diagonal,learnable', [
    (13, False, True, False),  # the paper's ViT: an LSA base, γ = 1 fixed (here per head)
    (13, False, True, True),
    (13, True, False, True),   # a GPT with a learned temperature: the cache path scales its query alone
], ids=['lsa-vit', 'lsa-vit-learnable', 'causal'])
def test_learned_temperature_matches_reference(T, causal, mask_diagonal, learnable):
    attn = make(T, causal=causal, attnx_mask_diagonal=mask_diagonal, attnx_learnable_gamma=learnable,
                attnx_learned_temperature=True)
    assert attn.log_temperature.shape == () and attn.log_temperature.item() == pytest.approx(-0.5 * math.log(8))
    with torch.no_grad():
        attn.log_temperature.fill_(math.log(0.6))  # away from its initial 1/√8 = 0.354
    q, k, v = qkv(T)
    ref = attentionx_reference(q, k, v, attn.gamma, visible_keys(T, causal, mask_diagonal, 0),
                               t=attn.log_temperature.exp())
    inputs = (q, k, v, attn.log_temperature) + ((attn.gamma,) if learnable else ())
    g = torch.randn_like(ref)
    grads_ref = torch.autograd.grad(ref, inputs, g)
    for attend in (attn.attend, attn.attend_fused):
        y = attend(q, k, v)
        torch.testing.assert_close(y, ref, atol=1e-12, rtol=1e-10)
        for name, a, b in zip('q k v log_temperature gamma'.split(), torch.autograd.grad(y, inputs, g), grads_ref):
            assert b.abs().sum() > 0, name  # the reference gradient is not trivially zero
            torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10, msg=f'gradient of {name}')


def test_on_the_lsa_base_a_is_lsas_exactly():
    # the paper's ViT: AttentionX on an LSA ViT. With the diagonal masked and the learned temperature, its A is an LSA
    # layer's with the same weights: y = v - γ·(LSA's output) on every path, and the weights it reports are LSA's
    T, x = 17, torch.randn(2, 17, 32, dtype=torch.float64)
    common = dict(n_embd=32, n_head=4, block_size=T, causal=False, flex=True)
    lsa = build_attention(AttentionConfig(attention='lsa', **common), 0).double()
    attnx = build_attention(AttentionConfig(attention='attentionx', attnx_mask_diagonal=True,
                                            attnx_learned_temperature=True, attnx_learnable_gamma=True, **common), 0)
    attnx = attnx.double()
    with torch.no_grad():
        lsa.log_temperature.fill_(math.log(0.7))
        attnx.gamma.copy_(torch.tensor(GAMMA))
    missing, unexpected = attnx.load_state_dict(lsa.state_dict(), strict=False)  # c_attn, c_proj and log t
    assert missing == ['gamma'] and unexpected == []
    with torch.no_grad():  # (flex has no backward on the CPU)
        q, k, v = lsa.project(x)
        for a, b in zip(attnx.project(x), (q, k, v)):
            assert torch.equal(a, b)
        gamma = attnx.gamma.view(1, -1, 1, 1)
        for ours, theirs in [(attnx.attend, lsa.attend), (attnx.attend_fused, lsa.attend_fused),
                             (attnx.attend_flex, lsa.attend_flex)]:
            torch.testing.assert_close(ours(q, k, v), v - gamma * theirs(q, k, v), atol=1e-12, rtol=0)
    torch.testing.assert_close(attnx.attention_weights(q, k, v), lsa.attention_weights(q, k, v), atol=1e-12, rtol=0)


def test_learned_temperature_is_one_per_layer_learned_and_not_decayed():
    torch.manual_seed(0)
    model = ViT(ViTConfig(n_layer=2, n_head=4, n_embd=32, num_classes=10, attention='attentionx',
                          attnx_mask_diagonal=True, attnx_learned_temperature=True))
    attn = model.h[1].attn
    assert attn.log_temperature.shape == () and 'h.1.attn.log_temperature' in dict(model.named_parameters())
    decay, no_decay = model.configure_optimizers(0.05, 1e-3, (0.9, 0.999), 'cpu').param_groups
    assert any(p is attn.log_temperature for p in no_decay['params'])
    assert not any(p is attn.log_temperature for p in decay['params'])
    _, loss = model(torch.randn(2, 3, 32, 32), torch.tensor([3, 7]))
    loss.backward()
    assert attn.log_temperature.grad != 0
    plain = build_attention(AttentionConfig(n_embd=32, n_head=4, attention='attentionx'), 0)
    assert plain.log_temperature is None and not any('temperature' in n for n, _ in plain.named_parameters())


def test_cached_generation_with_a_learned_temperature_equals_the_forward():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=32, vocab_size=11, attention='attentionx',
                          attnx_gamma=3.0, attnx_learned_temperature=True, pos_emb='rope')).double().eval()
    for block in model.transformer.h:
        with torch.no_grad():
            block.attn.log_temperature.fill_(math.log(0.9))
    prompt = torch.randint(0, 11, (2, 8), generator=torch.Generator().manual_seed(1))
    cached_generation_equals_the_forward(model, prompt, 30)  # 38 > block_size


def test_gamma_one_is_the_attention_graph_laplacian():
    # with γ = 1, y = (I - A)V; the rows of I - A sum to 0, so a constant v gives y = 0 (a high-pass filter)
    attn = make(9, causal=False, attnx_mask_diagonal=True)
    with torch.no_grad():
        attn.gamma.fill_(1.0)
    q, k, _ = qkv(9)
    v = torch.ones(2, 4, 9, 8, dtype=torch.float64)
    torch.testing.assert_close(attn.attend(q, k, v), torch.zeros_like(v), atol=1e-12, rtol=0)


@pytest.mark.parametrize('kw', [dict(attnx_gamma=3.0), dict(attnx_gamma=3.0, attnx_learnable_gamma=True, window=5),
                                dict(attnx_gamma=-1.0, pos_emb='rope'), dict(attnx_learned_temperature=True)])
def test_gpt_is_causal(kw):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=24, vocab_size=11, attention='attentionx',
                          **kw)).eval()
    assert_causal(model, T=24, cut=15)


@pytest.mark.parametrize('kw', [dict(), dict(causal=False), dict(causal=False, attnx_mask_diagonal=True),
                                dict(window=8),
                                dict(causal=False, attnx_mask_diagonal=True, attnx_learned_temperature=True)],
                         ids=['causal', 'bidirectional', 'diagonal-masked', 'window', 'lsa-base'])
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
    ('attentionx_vit', dict(dataset='cifar10', n_layer=12, attnx_gamma=1.0, attnx_mask_diagonal=True,
                            attnx_learned_temperature=True)),  # on an LSA base, as the paper's ViT
])
def test_configs_are_the_papers_forms_on_the_softmax_recipes(name, expect):
    scope = {'__file__': str(ROOT / 'config' / f'{name}.py')}
    exec(open(scope['__file__']).read(), scope)
    assert {k: scope[k] for k in expect} == expect and scope['attention'] == 'attentionx'
