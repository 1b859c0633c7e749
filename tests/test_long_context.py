"""Long context: RoPE scaling (machinery/rope.py's Rotary: linear position interpolation and NTK-aware frequencies) against
its formulas, in every layer and in generation, and its checks; an extension (a fine-tune at a longer block_size
with a scaling) resumes exactly and records its scaling; passkeys, one or several, as tokens and in words."""
import json
import math
import re

import pytest
import torch
import torch.nn.functional as F

from rules import AttentionConfig, build_attention
from machinery.rope import Rotary
from conftest import SHARED, iter_losses, run_forked
from model import GPT, GPTConfig
from support.loading import load_run


def rotate(x, angles):
    """RoPE written out in float64: pairs (x_i, x_{i+D/2}) turned by angles (T, D/2)."""
    half = x.size(-1) // 2
    cos, sin = angles.cos(), angles.sin()
    a, b = x[..., :half], x[..., half:]
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)


def test_ntk_frequencies_are_the_formula():
    D, base, s, T = 16, 10000.0, 4.0, 50
    rope = Rotary(D, T, base, 'ntk', s)
    theta = base * s ** (D / (D - 2))  # NTK-aware: the base raised so the lowest frequency is interpolated by s
    angles = torch.outer(torch.arange(T, dtype=torch.float64), theta ** (-torch.arange(0, D, 2).double() / D))
    torch.testing.assert_close(rope.cos.double(), angles.cos().repeat(1, 2), atol=2e-5, rtol=0)
    torch.testing.assert_close(rope.sin.double(), angles.sin().repeat(1, 2), atol=2e-5, rtol=0)
    # the highest frequency (i = 0) is kept, the lowest (i = D/2 - 1) is divided by s
    inv = lambda b, i: b ** (-2 * i / D)
    assert math.isclose(inv(theta, 0), 1.0)
    assert math.isclose(inv(theta, D // 2 - 1), inv(base, D // 2 - 1) / s ** ((D - 2) / (D - 2)), rel_tol=1e-12)


def test_linear_scaling_is_rope_at_positions_divided_by_s():
    D, s, T = 8, 2.5, 30
    x = torch.randn(2, 3, T, D, dtype=torch.float64)
    positions = torch.arange(T, dtype=torch.float64) / s
    angles = torch.outer(positions, 10000.0 ** (-torch.arange(0, D, 2).double() / D))
    # the tables are float32 (Rotary.tables), so agreement is to float32 precision
    torch.testing.assert_close(Rotary(D, T, scaling='linear', factor=s).double()(x), rotate(x, angles), atol=1e-5,
                               rtol=0)
    # at an offset and past its tables, as generation reads it
    rope = Rotary(D, 4, scaling='linear', factor=s).double()
    torch.testing.assert_close(rope(x[:, :, 20:21], offset=20), rotate(x, angles)[:, :, 20:21], atol=1e-5, rtol=0)


@pytest.mark.parametrize('scaling', ['none', 'linear', 'ntk'])
def test_factor_one_is_no_scaling(scaling):
    plain, scaled = Rotary(16, 40), Rotary(16, 40, scaling=scaling, factor=1.0)
    assert torch.equal(plain.cos, scaled.cos) and torch.equal(plain.sin, scaled.sin)
    torch.manual_seed(0)
    config = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=11, pos_emb='rope', attention='tda')
    a = GPT(GPTConfig(**config)).eval()
    b = GPT(GPTConfig(**config, rope_scaling=scaling, rope_factor=1.0)).eval()
    b.load_state_dict(a.state_dict())
    idx = torch.randint(0, 11, (2, 16))
    assert torch.equal(a(idx)[0], b(idx)[0])


@pytest.mark.parametrize('attention', ['softmax', 'krause', 'tda', 'cluster'])
@pytest.mark.parametrize('scaling', ['linear', 'ntk'])
def test_cached_generation_equals_uncached_with_a_scaling(attention, scaling):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=12, vocab_size=13, pos_emb='rope',
                          attention=attention, krause_window=4, krause_topk=2, cluster_chunk=4, cluster_m=3,
                          rope_scaling=scaling, rope_factor=3.0)).double().eval()
    prompt = torch.randint(0, 13, (2, 5))
    cached = model.generate(prompt, 20, temperature=0)  # past block_size: the tables grow, scaled the same way
    assert torch.equal(cached, model.generate(prompt, 20, temperature=0, use_cache=False))
    plain = GPT(GPTConfig(**{**model.config.__dict__, 'rope_scaling': 'none', 'rope_factor': 1.0})).double().eval()
    plain.load_state_dict(model.state_dict())
    assert not torch.allclose(plain(prompt)[0], model(prompt)[0])  # the scaling is in use


@pytest.mark.parametrize('kw, message', [
    (dict(rope_scaling='yarn'), r"rope_scaling must be 'none', 'linear' or 'ntk', got 'yarn'; pass e.g."),
    (dict(rope_scaling='ntk', rope_factor=0.0), r"rope_factor=0.0 must be positive"),
    (dict(rope_scaling='ntk', rope_factor=-2.0), r"rope_factor=-2.0 must be positive"),
    (dict(rope_scaling='linear', rope_factor=2.0, pos_emb='learned'),
     r"pos_emb='learned': learned absolute positions cannot be scaled; pass --pos_emb=rope, or --rope_scaling=none"),
])
def test_bad_scalings_are_one_line_naming_the_key(kw, message):
    config = AttentionConfig(**{**dict(n_embd=16, n_head=2, block_size=8, pos_emb='rope'), **kw})
    with pytest.raises(ValueError, match=message):
        build_attention(config, 0)


def test_an_extension_fine_tune_resumes_exactly_after_a_kill(tmp_path):
    # a RoPE model trained at 16 tokens, extended to 64 with NTK scaling (s = 4) by a fine-tune from its checkpoint
    common = ['--dataset=passkey', '--device=cpu', '--compile=False', '--n_layer=1', '--n_head=2', '--n_embd=16',
              '--batch_size=8', '--pos_emb=rope', '--eval_iters=1', '--log_interval=1', '--warmup_iters=1',
              '--dropout=0.1']
    extend = [*common, '--block_size=64', '--rope_scaling=ntk', '--rope_factor=4', f'--data_dir={tmp_path / "pk64"}',
              '--max_iters=8', '--lr_decay_iters=8', '--eval_interval=3']
    runs = run_forked(
        {'argv': ['train.py', *common, '--block_size=16', f'--data_dir={tmp_path / "pk16"}', '--max_iters=4',
                  '--lr_decay_iters=4', f'--out_dir={tmp_path / "base"}'], 'kill': None},
        {'argv': ['train.py', *extend, f'--init_from={tmp_path / "base" / "ckpt.pt"}', f'--out_dir={tmp_path / "a"}'],
         'kill': None},
        {'argv': ['train.py', *extend, f'--init_from={tmp_path / "base" / "ckpt.pt"}', f'--out_dir={tmp_path / "b"}'],
         'kill': ['', 'save_checkpoint', 2]},  # killed as it saves at iteration 6: the one of iteration 3 is kept
        {'argv': ['train.py', *extend, '--init_from=resume', f'--out_dir={tmp_path / "b"}'], 'kill': None})
    (_, base), (_, straight), (killed_rc, _), (_, resumed) = runs
    assert [rc for rc, _ in runs] == [0, 0, -9, 0], runs[-1][1][-2000:]
    assert 'resuming from' in resumed and 'at iteration 3' in resumed
    straight, resumed = iter_losses(straight), iter_losses(resumed)
    assert min(resumed) == 3 and max(resumed) == 8 and {i: straight[i] for i in resumed} == resumed
    run = load_run(str(tmp_path / 'b'))  # the checkpoint records the scaling: every script loads the same frequencies
    assert (run.model.config.block_size, run.model.config.rope_scaling, run.model.config.rope_factor) == (64, 'ntk', 4)
    assert run.model.transformer.h[0].attn.rope.scaling == 'ntk'


def test_needles_are_hidden_apart_and_asked_for_together_in_order():
    from prepare.passkey import FILLER, make_examples
    KEY, QUERY = FILLER + 10, FILLER + 11
    x, y = make_examples(200, 48, 4, seed=3, needles='1,2,4')
    counts = set()
    for row, target in zip(x.tolist(), y.tolist()):
        keys = [i for i, t in enumerate(row) if t == KEY]
        k = len(keys)
        counts.add(k)
        assert row[len(row) - 4 * k] == QUERY  # then the answer: the last 4k targets
        hidden = [row[i + 1:i + 5] for i in keys]  # the passkeys in the order they were hidden
        assert all(d - k_ >= 5 for k_, d in zip(keys, keys[1:]))  # apart: KEY and 4 digits each
        answer = [t for t in target if t != -1]
        assert answer == sum(hidden, []) and target[-4 * k:] == answer
        assert all(FILLER <= t < FILLER + 10 for t in answer)
    assert counts == {1, 2, 4}


def test_a_model_trained_on_needles_is_scored_per_count_and_length(tmp_path):
    common = ['--dataset=passkey', '--device=cpu', '--compile=False', '--n_layer=1', '--n_head=2', '--n_embd=16',
              '--batch_size=8', '--pos_emb=rope', '--eval_iters=1', '--warmup_iters=1', '--block_size=24',
              f'--data_dir={tmp_path / "pk"}', '--max_iters=3', '--lr_decay_iters=3', f'--out_dir={tmp_path / "run"}']
    runs = run_forked(
        {'argv': ['train.py', *common, '--passkey_needles=1,2'], 'kill': None},
        {'argv': ['studies/extrapolate.py', f'--out_dir={tmp_path / "run"}', '--multiples=1,2', '--num_examples=16',
                  '--json_out=True', '--rope_scaling=ntk', '--rope_factor=2'], 'kill': None},
        {'argv': ['studies/extrapolate.py', f'--out_dir={tmp_path / "run"}', '--lengths=12,60', '--needles=1',
                  '--num_examples=4', '--json_out=True'], 'kill': None},
        {'argv': ['studies/extrapolate.py', f'--out_dir={tmp_path / "run"}', '--needles=4'], 'kill': None},
        {'argv': ['studies/extrapolate.py', f'--out_dir={tmp_path / "run"}', '--needles=0'], 'kill': None},
        {'argv': ['studies/extrapolate.py', f'--out_dir={tmp_path / "run"}', '--multiples=4000'], 'kill': None},
        {'argv': ['train.py', *common, '--passkey_needles=1,x'], 'kill': None},
        {'argv': ['train.py', *common, '--passkey_needles=4'], 'kill': None})
    assert runs[0][0] == 0, runs[0][1][-2000:]
    rows = [json.loads(line) for line in runs[1][1].splitlines() if line.startswith('{')]
    assert [(r['needles'], r['multiple'], r['T']) for r in rows] == [(1, 1, 24), (1, 2, 48), (2, 1, 24), (2, 2, 48)]
    assert all(0 <= r['passkey_acc'] <= r['digit_acc'] <= 1 and 0 < r['loss'] < 10 for r in rows)
    assert rows[0]['model'] == 'softmax pos_emb=rope ntkx2'  # the scaling given on the command line
    rows = [json.loads(line) for line in runs[2][1].splitlines() if line.startswith('{')]
    assert [(r['T'], r['multiple']) for r in rows] == [(12, 0.5), (60, 2.5)]  # lengths, not multiples
    last = [out.strip().splitlines()[-1] for _, out in runs[3:]]
    assert last[0] == ("error: needles='4': 4 passkeys do not fit 24 tokens (the trained length, or the shortest of "
                       "--lengths); pass fewer --needles or longer --lengths")
    assert last[1].startswith("error: needles='0' must be comma-separated whole numbers >= 1; pass e.g. --needles=")
    assert re.match(r"error: multiples='4000' reaches T=96000: a forward of 64 sequences needs about [\d.]+ GiB, and "
                    r"this machine has [\d.]+ GiB free; pass smaller --multiples or --batch_size", last[2]), last[2]
    assert last[3].startswith("error: passkey_needles='1,x' must be comma-separated whole numbers >= 1")
    assert last[4] == ("error: block_size=24 cannot hold 4 passkeys and the question; pass --block_size=38 or more, "
                       "or fewer --passkey_needles")


@pytest.mark.skipif(not (SHARED / 'tiktoken_cache').is_dir(), reason=f"GPT-2's tokenizer cache not found under {SHARED}")
def test_the_passkey_in_words_for_a_language_model(tmp_path):
    import tiktoken
    from prepare.passkey import make_text_examples
    enc = tiktoken.get_encoding('gpt2')
    x, y = make_text_examples(enc.encode, 20, 120, seed=5, needles='1,2,4')
    counts = set()
    for row, target in zip(x.tolist(), y.tolist()):
        text, answer = enc.decode(row), enc.decode([t for t in target if t >= 0])
        keys = re.findall(r"The pass key is (\d{5})\. Remember it\. \1 is the pass key\.", text)
        counts.add(len(keys))
        assert len(row) == 120 and answer == ' ' + ', '.join(keys)  # every passkey, in the order hidden
        asked = [i for i, t in enumerate(target) if t >= 0]
        assert asked == list(range(120 - len(asked), 120)) and target[-len(asked):] == row[-len(asked) + 1:] + [
            target[-1]]  # the answer's tokens, next-token targets at the end
        assert text[:len(text) - len(enc.decode(row[-len(asked) + 1:]))].rstrip().endswith(
            'What is the pass key? The pass key is' if len(keys) == 1 else 'The pass keys are')
    assert counts == {1, 2, 4}
    # extrapolate.py on a language model with GPT-2's tokens: accuracy and the answer's loss, by hand
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=64, vocab_size=50304, pos_emb='rope')).eval()
    meta = dict(dataset='fineweb_edu', kind='text', encoding='gpt2')
    for name, encoding in (('lm', 'gpt2'), ('chars', 'chars')):
        (tmp_path / name).mkdir()
        torch.save(dict(model_args=dict(model.config.__dict__), model=model.state_dict(), iter_num=1,
                        config=dict(dataset='fineweb_edu'), meta={**meta, 'encoding': encoding}),
                   tmp_path / name / 'ckpt.pt')
    (rc, out), (rc_chars, out_chars), (rc_short, out_short) = run_forked(
        {'argv': ['studies/extrapolate.py', f'--out_dir={tmp_path / "lm"}', '--passkey=True', '--lengths=80,130',
                  '--needles=1,2', '--num_examples=5', '--batch_size=2', '--json_out=True']},
        {'argv': ['studies/extrapolate.py', f'--out_dir={tmp_path / "chars"}', '--passkey=True']},
        {'argv': ['studies/extrapolate.py', f'--out_dir={tmp_path / "lm"}', '--passkey=True', '--lengths=200,60',
                  '--needles=1,4']})
    assert rc == 0, out[-2000:]
    rows = [json.loads(line) for line in out.splitlines() if line.startswith('{')]
    assert [(r['needles'], r['T']) for r in rows] == [(1, 80), (1, 130), (2, 80), (2, 130)]
    for r in rows:
        x, y = (torch.from_numpy(a) for a in make_text_examples(enc.encode, 5, r['T'],
                                                                  1337 + 1000 + r['T'] + (r['needles'] - 1) * 7919,
                                                                  r['needles']))
        with torch.no_grad():
            logits = model(x, y)[0]
        asked = y >= 0
        hit = (logits.argmax(-1) == y) | ~asked
        assert r['digit_acc'] == pytest.approx(hit[asked].float().mean().item())
        assert r['passkey_acc'] == pytest.approx(hit.all(1).float().mean().item())
        assert r['loss'] == pytest.approx(F.cross_entropy(logits[asked], y[asked]).item(), rel=1e-5)
    assert rc_chars == 1 and out_chars.strip().splitlines()[-1] == (
        f"error: passkey=True asks in English with GPT-2's tokens, but {tmp_path / 'chars'} reads 'chars' tokens; "
        f"pass --passkey=False (val loss per length)")
    # four needles in words do not fit 60 tokens: one line before anything is scored
    assert rc_short == 1 and 'passkey accuracy' not in out_short, out_short[-2000:]
    assert re.fullmatch(r"error: needles='1,4': 4 passkey\(s\) in words need seq_len >= \d+, got 60; pass fewer "
                        r"--needles or longer --lengths", out_short.strip().splitlines()[-1]), out_short[-500:]
