"""harness.py: any GPT checkpoint as an lm-evaluation-harness model, on local tasks (no download). Its HellaSwag
log-likelihoods equal hellaswag.py's, its rolling log-likelihood equals train.py --eval_full's loss on the same
windows, its answers do not depend on the batch size or the KV cache, and every kind of rule goes through it."""
import json
import math
import re
import sys
from importlib.util import find_spec

import pytest
import torch

from conftest import ROOT, SHARED, needs_shared, run_forked, run_script

sys.path.insert(0, str(ROOT / 'tests'))
needs_harness = pytest.mark.skipif(find_spec('lm_eval') is None,
                                   reason="lm-eval is not installed: pip install -r requirements-extras.txt")
pytestmark = needs_shared
HELLASWAG = SHARED / 'hellaswag' / 'hellaswag_val_1000.jsonl'
FINEWEB = SHARED / 'fineweb_edu' / 'fineweb_edu_150docs.jsonl'
T = 256  # block_size: every HellaSwag row of the sample (at most 135 tokens) fits uncropped
MODEL = ['--n_layer=2', '--n_head=2', '--n_embd=32', f'--block_size={T}']


def tiny_gpt(**kw):
    from model import GPT, GPTConfig
    torch.manual_seed(0)
    sizes = dict(block_size=64, vocab_size=50304, n_layer=2, n_head=2, n_embd=32)
    return GPT(GPTConfig(**{**sizes, **kw})).eval()


def scorer(model, **kw):
    import tiktoken
    from studies import harness
    return harness.GPTScorer(model, tiktoken.get_encoding('gpt2'), progress=False, **kw)


@pytest.fixture(scope='module')
def run(tmp_path_factory):
    """A GPT-2 BPE checkpoint (2 iterations of train.py) and a local text of 3 windows that is its val split."""
    import tiktoken
    from harness_check import rolling_text, write_text_dataset
    root = tmp_path_factory.mktemp('harness')
    document = json.loads(FINEWEB.read_text().splitlines()[1])['text']
    text, tokens = rolling_text(tiktoken.get_encoding('gpt2'), document, 3 * T)
    (root / 'text.txt').write_text(text)
    write_text_dataset(root / 'data', tokens)
    args = ['--dataset=fineweb_edu', f'--data_dir={root / "data"}', f'--out_dir={root / "out"}', *MODEL,
            '--batch_size=2', '--device=cpu', '--compile=False']
    run_script('train.py', *args, '--max_iters=2', '--eval_interval=2', '--eval_iters=1', '--learning_rate=1e-2')
    return root, args


@needs_harness
def test_hellaswag_through_the_harness_equals_hellaswag_py(run):
    from studies import harness
    from harness_check import hellaswag_check
    model = harness.load_bpe_run(str(run[0] / 'out')).model
    result = hellaswag_check(scorer(model), HELLASWAG, limit=16)
    assert result['rows'] == 16 and result['max_abs_diff'] < 1e-4  # every choice's summed log-likelihood
    assert result['harness_acc'] == result['hellaswag_py_acc_sum']  # argmax of the sum: the same rule, same answers
    assert result['harness_acc_norm'] == result['harness_acc_norm_recomputed']  # acc_norm: divided by characters


@needs_harness
def test_rolling_loglikelihood_equals_eval_full(run):
    from studies import harness
    from harness_check import rolling_check
    root, args = run
    out = run_script('train.py', *args, '--eval_only=True', '--eval_full=True', '--init_from=resume')
    full = json.loads((root / 'out' / 'eval_full.json').read_text())
    assert (full['examples'], full['targets']) == (3, 3 * T), out  # 3 windows of T: every token after the EOT
    model = harness.load_bpe_run(str(root / 'out' / 'ckpt.pt')).model
    ll, n, loss = rolling_check(scorer(model, batch_size=2), root / 'text.txt')
    assert n == 3 * T and loss == pytest.approx(full['val_loss'], abs=1e-5)
    assert 5 < loss < 12  # a 2-iteration model: near log(50304) = 10.83, not a broken sum


@needs_harness
def test_script_writes_results_and_table(run):
    root, _ = run
    out = run_script('studies/harness.py', f'--out_dir={root / "out"}', '--tasks=hellaswag_nanogpt,text_rolling',
                     f'--hellaswag_source={HELLASWAG}', f'--text_source={root / "text.txt"}', '--limit=8',
                     '--bootstrap_iters=0', '--device=cpu')
    results = json.loads((root / 'out' / 'harness.json').read_text())
    assert results['results']['hellaswag_nanogpt']['sample_len'] == 8 and 'lm_eval 0.4.13' in out
    bits = results['results']['text_rolling']['bits_per_byte,none']
    assert 0 < bits < 20 and math.isfinite(bits)
    table = (root / 'out' / 'harness.md').read_text()
    assert '|hellaswag_nanogpt|' in table.replace(' ', '') and 'bits_per_byte' in table
    out = run_script('studies/harness.py', f'--out_dir={root / "no_run"}', '--tasks=hellaswag_nanogpt,arc_eazy',
                     f'--hellaswag_source={HELLASWAG}', check=False)  # named before the (missing) model is loaded
    assert out.strip().splitlines()[-1] == ("error: tasks: arc_eazy is no task the harness knows; did you mean "
                                            "arc_easy? (lm_eval ls tasks lists them)")


RULES = [dict(attention='softmax'), dict(attention='tda', pos_emb='rope', tie_weights=False),
         dict(attention='cluster', cluster_m=4, cluster_chunk=16),
         dict(attention='krause', mix=True, krause_window=8, krause_topk=4)]


@needs_harness
@pytest.mark.parametrize('kw', RULES, ids=[r['attention'] + ('_mix' if r.get('mix') else '') for r in RULES])
def test_every_rule_through_the_harness_batch_and_cache_invariant(kw):
    from harness_check import hellaswag_check
    model = tiny_gpt(block_size=160, **kw)  # the rows fit uncropped
    result = hellaswag_check(scorer(model, batch_size=16), HELLASWAG, limit=2)
    assert result['rows'] == 2 and result['max_abs_diff'] < 1e-4
    assert result['harness_acc'] == result['hellaswag_py_acc_sum']
    rows = [json.loads(line) for line in HELLASWAG.read_text().splitlines()[:2]]
    pairs = [(row['ctx'], ' ' + ending) for row in rows for ending in row['endings']] + [('', ' the')]
    text = json.loads(FINEWEB.read_text().splitlines()[2])['text'][:1200]  # ~270 tokens: 2 windows of 160
    prompts = [(row['ctx'], {'until': ['.'], 'max_gen_toks': 6}) for row in rows] * 2
    answers = {}
    for batch_size, use_cache in ((1, True), (16, True), (16, False)):
        s = scorer(model, batch_size=batch_size, use_cache=use_cache)
        answers[batch_size, use_cache] = (s.loglikelihood(pairs), s.loglikelihood_rolling([text]),
                                          s.generate_until(prompts))
    (ll1, roll1, gen1), (ll16, roll16, gen16), (_, _, gen_nocache) = answers.values()
    torch.testing.assert_close(torch.tensor([v for v, _ in ll16]), torch.tensor([v for v, _ in ll1]), rtol=0, atol=1e-4)
    assert [g for _, g in ll16] == [g for _, g in ll1] and roll16 == pytest.approx(roll1, abs=1e-3)
    assert gen16 == gen1 == gen_nocache and any(gen1)


def test_missing_harness_and_missing_files_are_one_line(tmp_path):
    blocked = ['', '', 0, "import sys; sys.modules['lm_eval'] = None"]  # before the script starts: not installed
    (_, out), = run_forked({'argv': ['studies/harness.py', f'--out_dir={tmp_path}'], 'fault': blocked})
    assert out.strip().splitlines()[-1] == ("error: harness.py needs EleutherAI's lm-evaluation-harness: pip install "
                                            "-r requirements-extras.txt (lm-eval==0.4.13)")
    out = run_script('studies/harness.py', f'--out_dir={tmp_path}', '--tasks=hellaswag_local', check=False)
    assert out.strip().splitlines()[-1] == ("error: task hellaswag_local reads a local file: pass "
                                            "--hellaswag_source=PATH")
    out = run_script('studies/harness.py', '--tasks=text_rolling', f'--text_source={tmp_path / "no.txt"}', check=False)
    assert f"error: text_source={tmp_path / 'no.txt'} does not exist" in out
    # train.py: a missing HellaSwag file stops the run, naming its key, before any data is prepared
    out = run_script('train.py', 'config/krause_gpt.py', f'--data_dir={tmp_path / "data"}', f'--out_dir={tmp_path}',
                     f'--hellaswag_source={tmp_path / "no.jsonl"}', '--device=cpu', check=False)
    assert out.strip().splitlines()[-1].startswith(f"error: hellaswag_source={tmp_path / 'no.jsonl'} is not a file")
    assert not (tmp_path / 'data').exists()


QUALITY = [  # SCROLLS' schema (id, pid, input, output), as tau/scrolls ships it; two rows of one id are one question
    {'id': 'q1', 'pid': 'q1_0', 'input': 'Which colour is the door?\n\n (A) red (B) blue (C) green (D) black\n\nThe '
     'house had a blue door and a red roof, and the garden was green all year.', 'output': 'blue'},
    {'id': 'q1', 'pid': 'q1_1', 'input': 'Which colour is the door?\n\n (A) red (B) blue (C) green (D) black\n\nThe '
     'house had a blue door and a red roof, and the garden was green all year.', 'output': 'blue'},
    {'id': 'q2', 'pid': 'q2_0', 'input': 'Who rang the bell?\n\n (A) a cat (B) the baker (C) nobody (D) the king\n\n'
     'In the morning the baker rang the bell twice and left the bread at the door.', 'output': 'the baker'},
]
CONTRACT = [
    {'id': 'c1', 'pid': 'c1_0', 'input': 'The tenant may keep pets.\n\nThe tenant shall not keep animals of any kind '
     'in the flat.', 'output': 'Contradiction'},
    {'id': 'c2', 'pid': 'c2_0', 'input': 'The contract ends in May.\n\nPayment is due on the first day of each month.',
     'output': 'Not mentioned'},
    {'id': 'c3', 'pid': 'c3_0', 'input': 'Payment is monthly.\n\nThe rent is paid every month, in advance.',
     'output': 'Entailment'},
]


@needs_harness
def test_scrolls_through_the_harness_offline_on_rows_the_test_writes(run, tmp_path):
    from studies import harness
    root, _ = run
    s = scorer(harness.load_bpe_run(str(root / 'out' / 'ckpt.pt')).model, batch_size=4)
    for task, rows in (('quality_scrolls', QUALITY), ('contractnli_scrolls', CONTRACT)):
        path = tmp_path / f'{task}.jsonl'
        path.write_text(''.join(json.dumps(row) + '\n' for row in rows))
        out = run_script('studies/harness.py', f'--out_dir={root / "out"}', f'--tasks={task}',
                         f'--scrolls_source={path}', '--bootstrap_iters=0', '--device=cpu')
        result = json.loads((root / 'out' / 'harness.json').read_text())['results'][task]
        # the same questions by hand: prompt and choices as SCROLLS' paper writes them, each choice's log-likelihood
        questions = {row['id']: row for row in rows}.values()
        correct = 0
        for row in questions:
            question, text = row['input'].split('\n\n', 1)
            if task == 'quality_scrolls':
                options, text = text.split('\n\n', 1)
                choices = [c.strip() for c in re.split(r' *\([A-D]\) *', options)[1:]]
                prompt = f"{text.strip()}\n\nQuestion: {question}\nAnswer:"
            else:
                choices = ['Not mentioned', 'Entailment', 'Contradiction']
                prompt = f"{text}\n\nHypothesis: {question}\nConclusion:"
            lls = [ll for ll, _ in s.loglikelihood([(prompt, ' ' + c) for c in choices])]
            correct += int(max(range(len(choices)), key=lls.__getitem__) == choices.index(row['output']))
        assert result['sample_len'] == len(questions) and result['acc,none'] == correct / len(questions), out
