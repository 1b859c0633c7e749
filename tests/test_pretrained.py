"""Starting from a pretrained model (support/pretrained.py, model.py's LoRA, rules/mix.py's MixAttention): a GPT-2
in the Hugging Face Hub's file layout, written here, loads and computes GPT-2's function (a float64 forward written
from GPT-2's formula, and transformers' GPT2LMHeadModel where it is installed); the shortcut beside the pretrained
attention starts as the base model; LoRA trains only what it should and merges exactly; caches; train.py and
sample.py end to end, offline; one error line for each bad base."""
import json
import math
import os

import pytest
import torch
import torch.nn.functional as F

from rules import ATTENTION, MixAttention
from conftest import SHARED, iter_losses, needs_shared, rule_cases, run_forked, run_script, write_tiny_cifar
from model import LoRALinear, merge_lora, trainable
from model import GPT, GPTConfig
from support.pretrained import fine_tune_args, load_base, load_base_weights

SHAPE = dict(n_layer=2, n_head=2, n_embd=16, n_positions=24, vocab_size=37)
RULE_KEYS = dict(krause_window=8, krause_topk=4, cluster_chunk=8, cluster_m=4, tda_beta=0.5)


def write_hub_gpt2(folder, n_layer=2, n_head=2, n_embd=16, n_positions=24, vocab_size=37, seed=0,
                   prefix='transformer.'):
    """A random GPT-2 saved as the Hub has it: config.json and model.safetensors, Conv1D weights stored (in, out),
    names under `prefix`, no lm_head (tied). LayerNorms away from (1, 0), so a wrong mapping shows. Returns the
    tensors by their GPT-2 names."""
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(seed)
    C, hidden = n_embd, 4 * n_embd
    tensors = {'wte.weight': (vocab_size, C), 'wpe.weight': (n_positions, C), 'ln_f.weight': (C,), 'ln_f.bias': (C,)}
    for i in range(n_layer):
        tensors.update({f'h.{i}.{name}': shape for name, shape in (
            ('ln_1.weight', (C,)), ('ln_1.bias', (C,)), ('attn.c_attn.weight', (C, 3 * C)),
            ('attn.c_attn.bias', (3 * C,)), ('attn.c_proj.weight', (C, C)), ('attn.c_proj.bias', (C,)),
            ('ln_2.weight', (C,)), ('ln_2.bias', (C,)), ('mlp.c_fc.weight', (C, hidden)), ('mlp.c_fc.bias', (hidden,)),
            ('mlp.c_proj.weight', (hidden, C)), ('mlp.c_proj.bias', (C,)))})
    tensors = {k: (1.0 if 'ln' in k and k.endswith('weight') else 0.0) + 0.3 * torch.randn(s, generator=g)
               for k, s in tensors.items()}
    os.makedirs(folder, exist_ok=True)
    save_file({prefix + k: v for k, v in tensors.items()}, os.path.join(folder, 'model.safetensors'))
    config = dict(model_type='gpt2', architectures=['GPT2LMHeadModel'], n_layer=n_layer, n_head=n_head, n_embd=n_embd,
                  n_positions=n_positions, n_ctx=n_positions, vocab_size=vocab_size, activation_function='gelu_new',
                  layer_norm_epsilon=1e-5, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, n_inner=None,
                  bos_token_id=0, eos_token_id=0)
    with open(os.path.join(folder, 'config.json'), 'w') as f:
        json.dump(config, f)
    return tensors


def gpt2_reference(t, idx, n_layer, n_head):
    """GPT-2's logits from its own tensors (Conv1D: x @ W), float64, written from the formula: pre-LayerNorm blocks,
    causal softmax(q kᵀ/√D) v, tanh-GELU MLP, the head tied to the token embedding."""
    t = {k: v.double() for k, v in t.items()}
    ln = lambda x, p: F.layer_norm(x, x.shape[-1:], t[p + '.weight'], t[p + '.bias'], 1e-5)
    gelu = lambda x: 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    T = idx.size(1)
    x = t['wte.weight'][idx] + t['wpe.weight'][:T]
    for i in range(n_layer):
        p = f'h.{i}.'
        q, k, v = (ln(x, p + 'ln_1') @ t[p + 'attn.c_attn.weight'] + t[p + 'attn.c_attn.bias']).chunk(3, -1)
        q, k, v = (z.view(*z.shape[:2], n_head, -1).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
        scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float('-inf'))
        y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(x.shape)
        x = x + y @ t[p + 'attn.c_proj.weight'] + t[p + 'attn.c_proj.bias']
        h = gelu(ln(x, p + 'ln_2') @ t[p + 'mlp.c_fc.weight'] + t[p + 'mlp.c_fc.bias'])
        x = x + h @ t[p + 'mlp.c_proj.weight'] + t[p + 'mlp.c_proj.bias']
    return ln(x, 'ln_f') @ t['wte.weight'].T


@pytest.fixture(scope='module')
def hub(tmp_path_factory):
    folder = tmp_path_factory.mktemp('gpt2-hub')
    return folder, write_hub_gpt2(folder, **SHAPE)


def all_logits(model, idx):
    logits, _ = model(idx, torch.zeros_like(idx))  # with targets: the logits of every position
    return logits


def fine_tune(hub_folder, **kw):
    """A float64 fine-tune of the hub model: the base's settings with kw on top, its weights loaded."""
    base = load_base(str(hub_folder))
    args = fine_tune_args(base, {**base['model_args'], **RULE_KEYS, **kw}, set(kw))
    torch.manual_seed(0)
    model = GPT(GPTConfig(**args))
    load_base_weights(model, base)
    return model.double().eval()


@pytest.mark.parametrize('prefix', ['transformer.', ''])  # both layouts the Hub has (with and without the prefix)
def test_hub_folder_computes_gpt2(hub, tmp_path, prefix):
    folder, tensors = hub
    if not prefix:
        folder, tensors = tmp_path, write_hub_gpt2(tmp_path, **SHAPE, prefix='')
    base = load_base(str(folder))
    assert base['model_args']['gelu_approximate'] == 'tanh' and base['model_args']['block_size'] == 24
    model = GPT(GPTConfig(**base['model_args'])).double().eval()
    model.load_state_dict(base['state'])
    idx = torch.randint(0, 37, (3, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = all_logits(model, idx)
        torch.testing.assert_close(ours, gpt2_reference(tensors, idx, SHAPE['n_layer'], SHAPE['n_head']),
                                   atol=1e-5, rtol=0)
    transformers = pytest.importorskip('transformers', reason="transformers not installed: the formula alone checks")
    theirs = transformers.GPT2LMHeadModel.from_pretrained(str(folder), dtype=torch.float64).eval()
    with torch.no_grad():
        torch.testing.assert_close(ours, theirs(idx).logits, atol=1e-5, rtol=0)


def test_block_size_crops_the_position_table(hub):
    model = fine_tune(hub[0], block_size=10)
    full = fine_tune(hub[0])
    assert model.transformer.wpe.weight.shape == (10, 16)
    idx = torch.randint(0, 37, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(all_logits(model, idx), all_logits(full, idx), atol=1e-12, rtol=0)


@pytest.mark.parametrize('kw', rule_cases([dict(attention=name, mix=True) for name in sorted(ATTENTION)]))
def test_a_shortcut_with_its_gate_shut_is_the_base(hub, kw):  # every rule with a causal form (a ViT-only one: skipped)
    base, model = fine_tune(hub[0]), fine_tune(hub[0], **kw)
    for block in model.transformer.h:  # gate (1, 0): the rule's branch gets weight exactly 0
        block.attn.gate.weight.data.zero_()
        block.attn.gate.bias.data = torch.tensor([0.0, -math.inf], dtype=torch.float64)
    idx = torch.randint(0, 37, (2, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(all_logits(model, idx), all_logits(base, idx))


def test_a_softmax_shortcut_at_init_is_the_base(hub):
    """Gate at 0.8 / 0.2 (its init, weight N(0, 0.01) included) and a branch that copies the pretrained one:
    0.8 y + 0.2 y = y."""
    base, model = fine_tune(hub[0]), fine_tune(hub[0], attention='softmax', mix=True)
    attn = model.transformer.h[0].attn
    assert isinstance(attn, MixAttention) and attn.gate.bias.softmax(-1).tolist() == pytest.approx([0.8, 0.2])
    assert torch.equal(attn.rule.c_attn.weight, attn.softmax.c_attn.weight)
    assert attn.rule.c_attn.weight is not attn.softmax.c_attn.weight  # a copy, free to move apart
    idx = torch.randint(0, 37, (2, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(all_logits(model, idx), all_logits(base, idx), atol=1e-12, rtol=0)


def test_the_shortcut_copies_each_projection_by_its_letter(hub):
    """TDA projects q1, k1, q2, k2, v: each q* starts as the pretrained q, each k* as k."""
    model = fine_tune(hub[0], attention='tda', mix=True)
    attn, C = model.transformer.h[1].attn, 16
    q, k, v = attn.softmax.c_attn.weight.split(C)
    assert torch.equal(attn.rule.c_attn.weight, torch.cat([q, k, q, k, v]))
    assert torch.equal(attn.rule.c_proj.bias, attn.softmax.c_proj.bias)


def test_lora_trains_only_lora_the_gate_and_the_rule(hub):
    model = fine_tune(hub[0], attention='krause', mix=True, lora_rank=4, lora_alpha=8.0).train()
    assert all(isinstance(m, LoRALinear) for b in model.transformer.h for m in
               (b.attn.softmax.c_attn, b.attn.rule.c_attn, b.attn.softmax.c_proj, b.mlp.c_fc, b.mlp.c_proj))
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    assert names == {n for n, p in model.named_parameters() if any(p is q for q in trainable(model))}
    assert {n.split('.')[-1] for n in names} == {'lora_A', 'lora_B', 'weight', 'bias', 'log_sigma'}
    assert all('.lora_' in n or '.gate.' in n or n.endswith('rule.log_sigma') for n in names)
    idx = torch.randint(0, 37, (2, 24))
    _, loss = model(idx, idx)
    loss.backward()
    for n, p in model.named_parameters():
        if n in names:
            assert p.grad is not None and (p.grad.abs().sum() > 0 or n.endswith('lora_A')), n  # B = 0: A's grad is 0
        else:
            assert p.grad is None, n


def test_merged_lora_gives_the_unmerged_logits(hub):
    model = fine_tune(hub[0], attention='krause', mix=True, lora_rank=4, lora_alpha=8.0)
    torch.manual_seed(1)
    for m in model.modules():
        if isinstance(m, LoRALinear):
            m.lora_B.data.normal_(std=0.3)  # a trained update, not the zero it starts at
    idx = torch.randint(0, 37, (2, 24))
    with torch.no_grad():
        before = all_logits(model, idx)
        assert (before - all_logits(fine_tune(hub[0], attention='krause', mix=True), idx)).abs().max() > 1e-2
        merge_lora(model)
        assert not any(isinstance(m, LoRALinear) for m in model.modules())
        torch.testing.assert_close(all_logits(model, idx), before, atol=1e-6, rtol=0)


@pytest.mark.parametrize('kw', rule_cases([dict(attention=name, mix=True) for name in ATTENTION], 'has_cache'))
def test_cached_generation_with_a_shortcut_equals_uncached(hub, kw):
    model = fine_tune(hub[0], pos_emb='learned', lora_rank=2, **kw)
    prompt = torch.randint(0, 37, (2, 5), generator=torch.Generator().manual_seed(4))
    cached = model.generate(prompt, 30, temperature=0)  # 35 > block_size 24: the crop and refill too
    assert torch.equal(cached, model.generate(prompt, 30, temperature=0, use_cache=False))


def test_an_old_krause_mix_checkpoint_as_a_base_is_one_error_line(tmp_path):
    """A base of ours written before mix took any rule (krause_mix, attn.krause.*) is not guessed at: load_base ends
    in load_checkpoint's one line naming the key and what to do."""
    args = dict(n_layer=1, n_head=2, n_embd=16, block_size=12, vocab_size=7, attention='krause', krause_window=4,
                krause_topk=2)
    model = GPT(GPTConfig(**args, mix=True))
    old = {k.replace('.attn.rule.', '.attn.krause.'): v for k, v in model.state_dict().items()}
    torch.save({'model': old, 'model_args': {**args, 'krause_mix': True}}, tmp_path / 'ckpt.pt')  # mix's old spelling
    with pytest.raises(SystemExit) as stop:
        load_base(str(tmp_path / 'ckpt.pt'))
    assert str(stop.value).startswith(f"error: {tmp_path / 'ckpt.pt'} was written by an older version, with model "
                                      f"key(s) krause_mix that the model no longer has; retrain it"), stop.value
    assert '\n' not in str(stop.value)


# -----------------------------------------------------------------------------
# end to end, offline: a character model trained here as the base, fine-tuned on another text

CHARS = ['--n_layer=2', '--n_head=2', '--n_embd=32', '--block_size=32', '--batch_size=8', '--eval_iters=2',
         '--log_interval=1', '--warmup_iters=2', '--compile=False', '--device=cpu', '--dropout=0.0']


@pytest.fixture(scope='module')
def char_base(tmp_path_factory):
    """A softmax GPT trained for 30 iterations on one text; a second text with a subset of its characters."""
    folder = tmp_path_factory.mktemp('char-base')
    (folder / 'a.txt').write_text(''.join(f"line {i}: the quick brown fox jumps over the lazy dog!\n"
                                          for i in range(300)))
    (folder / 'b.txt').write_text(''.join(f"dog {i}: a lazy fox jumps over the brown dog!\n" for i in range(300)))
    run_script('train.py', 'config/shakespeare_char.py', *CHARS, f'--data_source={folder / "a.txt"}',
               f'--data_dir={folder / "a"}', f'--out_dir={folder / "base"}', '--max_iters=30', '--lr_decay_iters=30',
               '--eval_interval=30')
    return folder


def test_fine_tune_a_checkpoint_with_lora_and_a_shortcut_then_resume_and_sample(char_base, tmp_path):
    common = ['train.py', '--dataset=shakespeare_char', '--device=cpu', '--compile=False', '--batch_size=8',
              '--eval_iters=2', '--log_interval=1', '--warmup_iters=2', f'--init_from={char_base / "base" / "ckpt.pt"}',
              f'--data_source={char_base / "b.txt"}', f'--data_dir={tmp_path / "b"}', '--attention=krause',
              '--mix=True', '--krause_window=8', '--krause_topk=4', '--lora_rank=4', '--learning_rate=3e-3',
              '--lr_decay_iters=12', '--eval_interval=6']
    log = run_script(*common, f'--out_dir={tmp_path / "ft"}', '--max_iters=6')
    # the shape came from the base; trained: LoRA (rank 4) on both branches' c_attn and c_proj and the MLP's two
    # Linears, the gates (2C -> 2) and Krause's σ per head
    C, L = 32, 2
    lora = L * 4 * (2 * (C + 3 * C) + 2 * (C + C) + (C + 4 * C) + (4 * C + C))
    assert f"trained: {lora + L * (2 * 2 * C + 2 + 2):,} (fine-tuning {char_base / 'base' / 'ckpt.pt'})" in log
    meta = json.loads((tmp_path / 'b' / 'meta.json').read_text())
    base_meta = torch.load(char_base / 'base' / 'ckpt.pt', weights_only=True)['meta']
    assert meta['itos'] == base_meta['itos'] and len(meta['itos']) > len(set((char_base / 'b.txt').read_text()))
    resumed = run_script(*common, f'--out_dir={tmp_path / "ft"}', '--init_from=resume', '--max_iters=12')
    assert "resuming from" in resumed
    straight = run_script(*common, f'--out_dir={tmp_path / "ft2"}', '--max_iters=12')
    assert iter_losses(resumed)[12] == iter_losses(straight)[12]  # resumed exactly
    sampled = run_script('sample.py', f'--out_dir={tmp_path / "ft"}', '--device=cpu', '--num_samples=1',
                         '--max_new_tokens=20', '--start=dog')
    assert '\ndog' in sampled and 'tokens/s' in sampled  # the prompt, then what the merged model wrote


def test_lora_export_writes_a_merged_checkpoint(char_base, tmp_path):
    run_script('train.py', '--dataset=shakespeare_char', '--device=cpu', '--compile=False', '--batch_size=8',
               '--eval_iters=2', f'--init_from={char_base / "base" / "ckpt.pt"}', f'--data_dir={char_base / "a"}',
               f'--out_dir={tmp_path}', '--lora_rank=2', '--max_iters=4', '--lr_decay_iters=4', '--eval_interval=4',
               '--warmup_iters=1', '--learning_rate=1e-2')
    out = run_script('studies/merge_lora.py', f'--ckpt={tmp_path / "ckpt.pt"}', f'--out={tmp_path / "merged.pt"}')
    assert 'LoRA merged' in out
    lora_ckpt = torch.load(tmp_path / 'ckpt.pt', weights_only=True)
    merged_ckpt = torch.load(tmp_path / 'merged.pt', weights_only=True)
    assert merged_ckpt['model_args']['lora_rank'] == 0 and not any('lora_' in k for k in merged_ckpt['model'])
    assert any(v.abs().sum() > 0 for k, v in lora_ckpt['model'].items() if k.endswith('lora_B'))  # it trained
    a, b = GPT(GPTConfig(**lora_ckpt['model_args'])), GPT(GPTConfig(**merged_ckpt['model_args']))
    a.load_state_dict(lora_ckpt['model'])
    b.load_state_dict(merged_ckpt['model'])
    idx = torch.randint(0, 10, (2, 32))
    with torch.no_grad():
        torch.testing.assert_close(all_logits(a.eval(), idx), all_logits(b.eval(), idx), atol=1e-5, rtol=0)


@needs_shared
def test_a_gpt2_folder_fine_tunes_on_bpe_shakespeare_and_samples(tmp_path):
    """The GPT-2 path of config/finetune_shakespeare_krause.py, offline: a GPT-2-shaped folder (GPT-2's vocabulary,
    tiny otherwise) as the base, BPE tiny-shakespeare, a Krause shortcut and LoRA, then sample.py with GPT-2's
    tokenizer."""
    write_hub_gpt2(tmp_path / 'gpt2', n_layer=1, n_head=2, n_embd=16, n_positions=64, vocab_size=50257)
    log = run_script('train.py', 'config/finetune_shakespeare_krause.py', f'--init_from={tmp_path / "gpt2"}',
                     f'--data_source={SHARED / "tinyshakespeare" / "input.txt"}', f'--data_dir={tmp_path / "data"}',
                     f'--out_dir={tmp_path / "ft"}', '--device=cpu', '--compile=False', '--block_size=32',
                     '--gradient_accumulation_steps=2', '--max_iters=2', '--eval_iters=1', '--eval_interval=2',
                     '--lr_decay_iters=2', '--warmup_iters=1')
    assert 'step 2: train loss' in log and f"(fine-tuning {tmp_path / 'gpt2'})" in log
    checkpoint = torch.load(tmp_path / 'ft' / 'ckpt.pt', weights_only=True)
    args = checkpoint['model_args']
    assert (args['n_embd'], args['block_size'], args['vocab_size'], args['gelu_approximate']) == (16, 32, 50257, 'tanh')
    assert (args['attention'], args['mix'], args['lora_rank'], args['krause_sigma']) == ('krause', True, 16, 5.5)
    out = run_script('sample.py', f'--out_dir={tmp_path / "ft"}', '--device=cpu', '--num_samples=1',
                     '--max_new_tokens=8', '--start=ROMEO:')
    assert '\nROMEO:' in out and 'tokens/s' in out


def test_a_pixel_gpt_is_the_base_of_a_pixel_fine_tune(tmp_path):
    """A GPT trained on cifar10_pixels fine-tunes (LoRA) on pixels: a base may be a pixel model."""
    data = write_tiny_cifar(tmp_path / 'cifar10')
    common = ['train.py', '--dataset=cifar10_pixels', '--block_size=47', '--n_layer=1', '--n_head=2', '--n_embd=16',
              '--batch_size=2', '--eval_iters=2', '--device=cpu', '--compile=False', '--warmup_iters=1',
              '--lr_decay_iters=2', '--max_iters=2', '--eval_interval=2', f'--data_dir={data}']
    base = tmp_path / 'base' / 'ckpt.pt'
    (rc, out), (rc_ft, ft) = run_forked({'argv': [*common, f'--out_dir={tmp_path / "base"}']},
                                        {'argv': [*common, f'--out_dir={tmp_path / "ft"}', f'--init_from={base}',
                                                  '--lora_rank=4']})
    assert rc == 0 and rc_ft == 0 and f"(fine-tuning {base})" in ft, ft[-2000:]
    assert 'val bits/dim' in ft and torch.load(tmp_path / 'ft' / 'ckpt.pt', weights_only=True)['base'] == str(base)


# -----------------------------------------------------------------------------
# a bad base: one error line, before any folder is made

def damaged(folder):
    write_hub_gpt2(folder, **SHAPE)
    data = (folder / 'model.safetensors').read_bytes()
    (folder / 'model.safetensors').write_bytes(data[:len(data) // 2])
    return folder


@pytest.mark.parametrize('case', ['unknown name', 'no weights', 'damaged weights', 'shape contradicts', 'too long',
                                  'rule contradicts', 'shortcut on a krause base'])
def test_a_bad_base_is_one_error_line_before_any_work(hub, char_base, tmp_path, case):
    folder = tmp_path / 'weights'
    folder.mkdir()
    init, extra, match = {
        'unknown name': ('gpt-2', [], "init_from='gpt-2' is neither .* did you mean 'gpt2'"),
        'no weights': (folder, [], "lacks model.safetensors"),
        'damaged weights': (None, [], "cannot read .*model.safetensors.*damaged"),
        'shape contradicts': (hub[0], ['--n_layer=3'], r"n_layer=3 contradicts the base .* \(n_layer=2\)"),
        'too long': (hub[0], ['--block_size=48'], "block_size=48 is longer than .*24 learned positions"),
        'rule contradicts': (hub[0], ['--attention=krause'], "attention='krause' contradicts .*mix=True"),
        'shortcut on a krause base': (None, ['--mix=True', '--attention=tda', '--dataset=shakespeare_char'],  # its
                                      "start from a softmax model"),  # own tokens: the mix is what is wrong
    }[case]
    (folder / 'config.json').write_text('{}') if case == 'no weights' else None
    if case == 'damaged weights':
        init = damaged(tmp_path / 'damaged')
    if case == 'shortcut on a krause base':
        run_script('train.py', 'config/shakespeare_char.py', *CHARS, '--attention=krause', '--krause_window=8',
                   '--krause_topk=4', f'--data_dir={char_base / "a"}', f'--out_dir={tmp_path / "k"}', '--max_iters=1',
                   '--eval_interval=1', '--lr_decay_iters=1', '--warmup_iters=0')
        init = tmp_path / 'k' / 'ckpt.pt'
    out = run_script('train.py', f'--init_from={init}', '--dataset=shakespeare', f'--out_dir={tmp_path / "out"}',
                     f'--data_dir={tmp_path / "data"}', '--device=cpu', *extra, check=False)
    lines = [line for line in out.splitlines() if line.startswith('error:')]
    assert len(lines) == 1 and __import__('re').search(match, lines[0]), out[-2000:]
    assert not (tmp_path / 'out').exists() and not (tmp_path / 'data').exists()
