"""studies/export.py: a GPT trained here, written in the Hugging Face Hub's layout, is what transformers loads: its
GPT2LMHeadModel computes our logits (float32) and its tokenizer makes tiktoken's GPT-2 ids; a LoRA fine-tune exports
merged; the folder read back as a base (support/pretrained.py: one map, both ways) is the same model. A run the
layout cannot hold and a folder that already holds something are one `error:` line each, nothing written. The
checkpoints are made in this process (random weights, no training) as train.py writes them; the script runs forked
(tests/faults.py)."""
import hashlib
import os

import pytest
import torch

from conftest import SHARED, checkpoint, run_forked
from model import GPT, GPTConfig
from support.pretrained import load_base
from vit import ViT, ViTConfig

needs_bpe = pytest.mark.skipif(not (SHARED / 'tiktoken_cache').is_dir(), reason=f"GPT-2's BPE files (tiktoken's "
                               f"cache in the offline data samples) not found at {SHARED}: the export writes them")
BPE_META = {'kind': 'text', 'dataset': 'shakespeare', 'encoding': 'gpt2', 'vocab_size': 50257}
SHAPE = dict(n_layer=2, n_head=2, n_embd=16, block_size=24, vocab_size=50304)  # GPT-2's vocabulary, padded as ours
HUB_FILES = ['config.json', 'generation_config.json', 'merges.txt', 'model.safetensors', 'tokenizer_config.json',
             'vocab.json']
SENTENCES = ["ROMEO:\nBut, soft! what light through yonder window breaks?", "  two  spaces,\ttabs\n\nand lines ",
             "naïve café — 東京 🤖 ½", "x = f(1e-3) + 'quoted' + \"dq\" # 12,345.67"]


def randomised(model, seed=0):
    """Every weight moved away from its init (LayerNorms off (1, 0), biases and LoRA's B off zero), so that a weight
    mapped to the wrong place, untransposed, or left out changes the logits."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g))
    return model


def save_run(folder, model, dataset='shakespeare', meta=None):
    """`model` saved in `folder` as train.py saves a run of `dataset` (conftest.checkpoint); the folder."""
    folder.mkdir(parents=True)
    torch.save(checkpoint(model, dataset, dict(meta or BPE_META)), folder / 'ckpt.pt')
    return folder


def last_line(out):
    return out.strip().splitlines()[-1] if out.strip() else ''


def all_logits(model, idx):
    with torch.no_grad():
        return model(idx, torch.zeros_like(idx))[0]  # with targets: the logits of every position


# -----------------------------------------------------------------------------
# the round trip

CASES = {  # train.py's defaults (no biases, exact GELU, tied head); GPT-2's choices and then some; a LoRA fine-tune
    'trained here': dict(bias=False, gelu_approximate='none', tie_weights=True),
    'gpt2-like, untied': dict(bias=True, gelu_approximate='tanh', tie_weights=False, mlp_hidden=40),
    'lora fine-tune': dict(bias=True, gelu_approximate='tanh', lora_rank=2, lora_alpha=4.0),
}


@pytest.fixture(scope='module')
def exported(tmp_path_factory):
    """{case: (our model in float32, eval mode, LoRA unmerged; the exported folder)}, one forked export each."""
    d = tmp_path_factory.mktemp('export')
    models = {}
    for i, (name, kw) in enumerate(CASES.items()):
        torch.manual_seed(i)
        models[name] = randomised(GPT(GPTConfig(**SHAPE, **kw)), seed=i).eval()
        save_run(d / f'run{i}', models[name])
    results = run_forked(*({'argv': ['studies/export.py', f'--out_dir={d / f"run{i}"}', f'--hub_dir={d / f"hub{i}"}']}
                           for i in range(len(CASES))))
    for (rc, out), i in zip(results, range(len(CASES))):
        assert rc == 0 and last_line(out).startswith(f"wrote {d / f'hub{i}'}: GPT2LMHeadModel"), out[-3000:]
    return {name: (models[name], d / f'hub{i}') for i, name in enumerate(CASES)}


@needs_bpe
@pytest.mark.parametrize('case', list(CASES))
def test_transformers_computes_our_logits(exported, case):
    """AutoModelForCausalLM on the exported folder, offline: GPT2LMHeadModel, float32, our logits at every position
    to float32's rounding (a LoRA fine-tune: those of its unmerged model, the merge folded into the weights);
    greedy generation with its defaults is ours, to the end of the context (where its learned positions end)."""
    transformers = pytest.importorskip('transformers', reason="transformers (an extra) not installed: the export is "
                                                              "still read back as a base below")
    ours, hub = exported[case]
    assert sorted(os.listdir(hub)) == HUB_FILES
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(hub), local_files_only=True).eval()
    assert type(theirs).__name__ == 'GPT2LMHeadModel' and theirs.dtype == torch.float32
    assert theirs.generation_config.max_length == SHAPE['block_size']  # generation stops where positions do
    idx = torch.randint(0, 50257, (3, SHAPE['block_size']), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(theirs(idx).logits, all_logits(ours, idx), atol=1e-5, rtol=0)
        greedy = theirs.generate(idx[:1, :4], do_sample=False)[0].tolist()  # its defaults: to the context's end
    want = ours.generate(idx[:1, :4], SHAPE['block_size'] - 4, temperature=0)[0].tolist()
    assert greedy == want[:len(greedy)] and (len(greedy) == SHAPE['block_size'] or greedy[-1] == 50256)


@needs_bpe
@pytest.mark.parametrize('case', list(CASES))
def test_the_export_read_back_as_a_base_is_the_model(exported, case):
    """The folder as train.py's --init_from reads it (support/pretrained.py's read_hub_folder): the same logits."""
    ours, hub = exported[case]
    base = load_base(str(hub))
    model = GPT(GPTConfig(**base['model_args'])).eval()
    model.load_state_dict(base['state'])
    idx = torch.randint(0, 50257, (2, SHAPE['block_size']), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(all_logits(model, idx), all_logits(ours, idx), atol=1e-5, rtol=0)


@needs_bpe
def test_transformers_tokenizer_makes_tiktokens_ids(exported):
    """AutoTokenizer on the exported folder, offline: tiktoken's GPT-2 ids for text with spaces, tabs, newlines,
    accents, CJK, emoji and digits; the text back from them; <|endoftext|> as every special token (50256)."""
    transformers = pytest.importorskip('transformers', reason="transformers (an extra) not installed")
    from prepare.sources import gpt2_encoding
    enc = gpt2_encoding()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(exported['trained here'][1]), local_files_only=True)
    for text in SENTENCES:
        ids = tokenizer(text)['input_ids']
        assert ids == enc.encode(text), text
        assert tokenizer.decode(ids) == text
    assert tokenizer.eos_token_id == tokenizer.bos_token_id == enc.eot_token == 50256
    assert tokenizer.model_max_length == SHAPE['block_size']


# -----------------------------------------------------------------------------
# what the layout cannot hold: one error line, nothing written

KEEP = "keep its ckpt.pt, which sample.py and support.loading.load_run read"


@pytest.fixture(scope='module')
def refused(tmp_path_factory):
    """{kind: (exit code, output, ckpt.pt, hub_dir)} of an export of a run GPT-2's layout cannot hold, one forked run
    each; every checkpoint's sha256 before."""
    d = tmp_path_factory.mktemp('refused')
    small = dict(n_layer=1, n_head=2, n_embd=16, block_size=16)
    runs = {
        'rule': (GPT(GPTConfig(**small, vocab_size=50304, attention='linear')), 'shakespeare', BPE_META),
        'window': (GPT(GPTConfig(**small, vocab_size=50304, window=4)), 'openwebtext', BPE_META),
        'mix': (GPT(GPTConfig(**small, vocab_size=50304, attention='linear', mix=True)), 'fineweb_edu', BPE_META),
        'rope': (GPT(GPTConfig(**small, vocab_size=50304, pos_emb='rope')), 'shakespeare', BPE_META),
        'characters': (GPT(GPTConfig(**small, vocab_size=65)), 'shakespeare_char',
                       {'kind': 'text', 'dataset': 'shakespeare_char', 'encoding': 'chars', 'vocab_size': 65}),
        'token ids': (GPT(GPTConfig(**small, vocab_size=20)), 'recall',
                      {'kind': 'examples', 'dataset': 'recall', 'encoding': 'tokens', 'vocab_size': 20}),
        'pixels': (GPT(GPTConfig(**{**small, 'block_size': 47}, vocab_size=256)), 'cifar10_pixels',
                   {'kind': 'image', 'dataset': 'cifar10'}),
        'vit': (ViT(ViTConfig(n_layer=1, n_head=2, n_embd=16, patch_size=8, num_classes=10)), 'cifar10',
                {'kind': 'image', 'dataset': 'cifar10'}),
    }
    for kind, (model, dataset, meta) in runs.items():
        save_run(d / kind, model, dataset, meta)
    digests = {kind: hashlib.sha256((d / kind / 'ckpt.pt').read_bytes()).hexdigest() for kind in runs}
    results = run_forked(*({'argv': ['studies/export.py', f'--out_dir={d / kind}', f'--hub_dir={d / kind}-hub']}
                           for kind in runs))
    return {kind: (rc, out, d / kind / 'ckpt.pt', d / f'{kind}-hub', digests[kind])
            for kind, (rc, out) in zip(runs, results)}


def assert_refused(refused, kind, line):
    """Exit 1, no traceback, `line` the last; no hub_dir made, the checkpoint byte-identical."""
    rc, out, ckpt, hub, digest = refused[kind]
    assert rc == 1 and 'Traceback' not in out, out[-3000:]
    assert last_line(out) == f"error: {ckpt} {line}"
    assert not hub.exists() and hashlib.sha256(ckpt.read_bytes()).hexdigest() == digest


def test_another_rule_is_refused(refused):
    assert_refused(refused, 'rule', "has attention='linear', and GPT-2's class computes softmax attention alone; "
                                    f"export a softmax run, or {KEEP}")


def test_a_window_is_refused(refused):
    assert_refused(refused, 'window', "attends to the last 4 keys (window=4), and GPT-2's class to the whole "
                                      f"context; export a run of window=0, or {KEEP}")


def test_a_shortcut_is_refused(refused):
    assert_refused(refused, 'mix', "has a linear branch beside softmax in every layer (mix=True), which GPT-2's "
                                   f"class does not compute; export a softmax run (--mix=False), or {KEEP}")


def test_rope_is_refused(refused):
    assert_refused(refused, 'rope', "has pos_emb='rope', and GPT-2's class adds learned positions to the input (a "
                                    "rotary model would go to a class like GPT-NeoX's, not written here); train with "
                                    f"--pos_emb=learned to export, or {KEEP}")


@pytest.mark.parametrize('kind, words, dataset', [('characters', 'character', 'shakespeare_char'),
                                                  ('token ids', 'token-id', 'recall'),
                                                  ('pixels', 'pixel', 'cifar10_pixels')])
def test_tokens_not_gpt2s_are_refused(refused, kind, words, dataset):
    assert_refused(refused, kind, f"reads {words} tokens ({dataset}), and GPT-2's tokenizer makes GPT-2 BPE ones: "
                                  f"train on GPT-2 BPE text (--dataset=shakespeare, openwebtext or fineweb_edu) to "
                                  f"export, or {KEEP}")


def test_a_vit_is_refused(refused):
    assert_refused(refused, 'vit', "holds a ViT image classifier (cifar10), and GPT-2's layout holds a language "
                                   "model; transformers' ViT classes would hold it in a layout of their own, not "
                                   f"written here: {KEEP}")


def test_a_folder_that_holds_something_is_left_as_it_was(tmp_path):
    """hub_dir with files in it (an earlier export, or anything): refused before the checkpoint is read, every file
    byte-identical."""
    run = save_run(tmp_path / 'run', GPT(GPTConfig(**SHAPE)))
    hub = tmp_path / 'hub'
    hub.mkdir()
    for name in HUB_FILES[:5]:
        (hub / name).write_text(name)
    before = {p.name: p.read_bytes() for p in hub.iterdir()}
    (rc, out), = run_forked({'argv': ['studies/export.py', f'--out_dir={run}', f'--hub_dir={hub}']})
    assert rc == 1 and 'Traceback' not in out, out[-3000:]
    assert last_line(out) == (f"error: hub_dir={hub} already holds config.json, generation_config.json, merges.txt, "
                              f"model.safetensors and 1 more: the export would replace what is there; pass "
                              f"--hub_dir=A_NEW_FOLDER, or delete {hub} first")
    assert {p.name: p.read_bytes() for p in hub.iterdir()} == before
