"""harness.py: any GPT checkpoint as an lm-evaluation-harness model, on local tasks (no download). Its HellaSwag
log-likelihoods equal hellaswag.py's, its rolling log-likelihood equals train.py --eval_full's loss on the same
windows, its answers do not depend on the batch size or the KV cache, and every kind of rule goes through it.
SCROLLS through it: its prompts, and its scores (accuracy, F1, ROUGE) equal the same scores worked out by hand."""
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


@pytest.fixture
def no_environment_report(monkeypatch):
    """The harness called in this process reports no environment: its two seconds of `pip list` per evaluation are
    no score these tests compare (harness.py's own runs, forked, still write it)."""
    import lm_eval.evaluator
    monkeypatch.setattr(lm_eval.evaluator, 'add_env_info', lambda results: None)


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
@pytest.mark.usefixtures('no_environment_report')
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
                     f'--hellaswag_source={HELLASWAG}', f'--text_source={root / "text.txt"}', '--limit=2',
                     '--bootstrap_iters=0', '--device=cpu')
    results = json.loads((root / 'out' / 'harness.json').read_text())
    assert results['results']['hellaswag_nanogpt']['sample_len'] == 2 and 'lm_eval 0.4.13' in out
    bits = results['results']['text_rolling']['bits_per_byte,none']
    assert 0 < bits < 20 and math.isfinite(bits)
    table = (root / 'out' / 'harness.md').read_text()
    assert '|hellaswag_nanogpt|' in table.replace(' ', '') and 'bits_per_byte' in table
    out = run_script('studies/harness.py', f'--out_dir={root / "no_run"}',
                     '--tasks=hellaswag_nanogpt,arc_eazy,qmsum_scrols', f'--hellaswag_source={HELLASWAG}',
                     check=False)  # named before the (missing) model is loaded
    assert out.strip().splitlines()[-1] == ("error: tasks: arc_eazy, qmsum_scrols is no task the harness knows; did "
                                            "you mean arc_easy? (lm_eval ls tasks lists them)")


RULES = [dict(attention='softmax'), dict(attention='tda', pos_emb='rope', tie_weights=False),
         dict(attention='cluster', cluster_m=4, cluster_chunk=16),
         dict(attention='krause', mix=True, krause_window=8, krause_topk=4)]


@needs_harness
@pytest.mark.usefixtures('no_environment_report')
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


class TableScorer:
    """A scorer whose answers the test writes: each prompt's generation from `generations`, each continuation's
    log-likelihood from `loglikelihoods`; `asked` keeps every request the harness made, in order."""

    def __init__(self, generations, loglikelihoods=None):
        self.generations, self.loglikelihoods, self.asked = generations, loglikelihoods or {}, []

    def generate_until(self, requests):
        self.asked += [(context, kwargs) for context, kwargs in requests]
        return [self.generations[context] for context, _ in requests]

    def loglikelihood(self, pairs):
        self.asked += list(pairs)
        return [(self.loglikelihoods[continuation], False) for _, continuation in pairs]


def scrolls_results(tmp_path, task, rows, scorer):
    """harness_check.run_harness on one SCROLLS task over the rows, written as a local jsonl of SCROLLS' schema."""
    from harness_check import run_harness
    path = tmp_path / f'{task}.jsonl'
    path.write_text(''.join(json.dumps(row) + '\n' for row in rows))
    return run_harness(scorer, [task], {'scrolls_source': str(path)})['results'][task]


SUMMARY = "\n\nQuestion: What is a summary of the preceding text?\nAnswer:"  # SCROLLS' summary prompt, after the text
GOVREPORT = [
    {'id': 'g1', 'pid': 'g1_0', 'input': 'In 2020 the agency received 4 billion dollars and spent most of it on roads '
     'and bridges.', 'output': 'The agency spent the money on roads.'},
    {'id': 'g2', 'pid': 'g2_0', 'input': 'Costs for the program rose from 10 to 14 million dollars over two years.',
     'output': 'Costs rose.'},
]
MEETING = 'What did the group decide?\n\nAnna: the blue one is cheaper. Ben: then we take the blue remote.'
QMSUM = [{'id': 'm1', 'pid': 'm1_0', 'input': MEETING, 'output': 'The group chose a blue remote.'},
         {'id': 'm1', 'pid': 'm1_1', 'input': MEETING, 'output': 'The blue design.'}]  # one query, two references


@needs_harness
@pytest.mark.usefixtures('no_environment_report')
def test_scrolls_rouge_tasks_score_rouge_as_scrolls_does(tmp_path):
    pytest.importorskip('rouge_score', reason="rouge-score is not installed: pip install -r requirements-extras.txt")
    # ROUGE by hand (rouge-score's words: lower case, letters and digits; no stemmer, as SCROLLS). F = 2 overlap /
    # (words of the prediction + words of the reference); ROUGE-L's overlap is the longest common subsequence.
    # g1: "the agency spent money on new road" (7 words) against "the agency spent the money on roads" (7), road not
    #   roads (no stemmer): unigrams the agency spent money on: 5 -> 10/14; bigrams the-agency agency-spent money-on:
    #   3 of 6 and 6 -> 6/12; LCS the agency spent money on: 5 -> 10/14
    # g2: "costs rose sharply" (3) against "costs rose" (2): unigrams 2 -> 4/5; bigram costs-rose: 1 of 2 and 1 -> 2/3;
    #   LCS 2 -> 4/5
    govreport = {'rouge1': (5 / 7 + 4 / 5) / 2, 'rouge2': (1 / 2 + 2 / 3) / 2, 'rougeL': (5 / 7 + 4 / 5) / 2}
    # m1: "they chose the blue remote" (5) against A "the group chose a blue remote" (6) and B "the blue design" (3):
    #   unigrams: A the chose blue remote 4 -> 8/11, B the blue 2 -> 4/8; bigrams (4 in the prediction): A
    #   blue-remote 1 of 5 -> 2/9, B the-blue 1 of 2 -> 2/6; LCS: A chose blue remote 3 -> 6/11, B the blue 2 -> 4/8.
    #   The best of each on its own: ROUGE-1 and -L from A, ROUGE-2 from B.
    qmsum = {'rouge1': 8 / 11, 'rouge2': 1 / 3, 'rougeL': 6 / 11}
    generations = {GOVREPORT[0]['input'] + SUMMARY: 'the agency spent money on new road',
                   GOVREPORT[1]['input'] + SUMMARY: 'costs rose sharply',
                   "Anna: the blue one is cheaper. Ben: then we take the blue remote.\n\nQuestion: What did the group "
                   "decide?\nAnswer:": 'they chose the blue remote'}  # QMSum: the text, then its query
    cases = [('govreport_scrolls', GOVREPORT, govreport), ('summscreenfd_scrolls', GOVREPORT, govreport),  # one prompt
             ('qmsum_scrolls', QMSUM, qmsum)]
    for task, rows, expected in cases:
        scorer = TableScorer(generations)
        result = scrolls_results(tmp_path, task, rows, scorer)
        until_newline = {'until': ['\n'], 'max_gen_toks': 256}  # as the harness's scrolls_*
        assert [kwargs for _, kwargs in scorer.asked] == [until_newline] * len({row['id'] for row in rows})
        for key, value in expected.items():
            assert result[f'{key},none'] == pytest.approx(100 * value, abs=1e-9), (task, key)
        # SCROLLS' score: the geometric mean of the three means, not the mean of each document's geometric mean
        assert result['rouge_geometric_mean,none'] == pytest.approx(
            100 * (expected['rouge1'] * expected['rouge2'] * expected['rougeL']) ** (1 / 3), abs=1e-9)
    assert result['sample_len'] == 1  # QMSum's two rows of one id: one query, scored against both references


QASPER = [  # a yes/no question (its every reference yes or no), an extractive one, an unanswerable one
    {'id': 'a1', 'pid': 'a1_0', 'input': 'Is the model trained on English?\n\nWe train it on English news.',
     'output': 'Yes'},
    {'id': 'a1', 'pid': 'a1_1', 'input': 'Is the model trained on English?\n\nWe train it on English news.',
     'output': 'yes.'},
    {'id': 'a2', 'pid': 'a2_0', 'input': 'Which model do they use?\n\nThey fine-tune BERT on SQuAD data.',
     'output': 'a BERT model'},
    {'id': 'a2', 'pid': 'a2_1', 'input': 'Which model do they use?\n\nThey fine-tune BERT on SQuAD data.',
     'output': 'BERT fine-tuned on SQuAD data'},
    {'id': 'a3', 'pid': 'a3_0', 'input': 'What is the learning rate?\n\nThe paper does not say.',
     'output': 'Unanswerable'},
]


def qasper_prompt(row):
    question, text = row['input'].split('\n\n', 1)
    return f"{text}\n\nQuestion: {question}\nAnswer:"


def squad_f1(prediction, reference):
    """SCROLLS' F1 (SQuAD's), written out: lower case, punctuation dropped, then the articles, words counted."""
    def words(text):
        text = ''.join(ch for ch in text.lower() if ch not in '!"#$%&\'()*+,-./:;<=>?@[\\]^_`{|}~')
        return [word for word in text.split() if word not in ('a', 'an', 'the')]
    predicted, wanted = words(prediction), words(reference)
    same = sum(min(predicted.count(word), wanted.count(word)) for word in set(predicted))
    return 0.0 if same == 0 else 2 * same / (len(predicted) + len(wanted))


@needs_harness
@pytest.mark.usefixtures('no_environment_report')
def test_qasper_scores_f1_as_scrolls_does(tmp_path):
    a1, _, a2, _, a3 = (qasper_prompt(row) for row in QASPER)
    scorer = TableScorer({a2: 'The BERT model, fine-tuned on SQuAD', a3: '  '}, {' yes': -1.0, ' no': -2.0})
    result = scrolls_results(tmp_path, 'qasper_scrolls', QASPER, scorer)
    until_newline = {'until': ['\n'], 'max_gen_toks': 256}
    assert sorted(scorer.asked) == sorted([(a1, ' yes'), (a1, ' no'), (a2, until_newline), (a3, until_newline)])
    # a1: ' yes' is likelier -> "yes" against "Yes", "yes.": 1. a2: "bert model finetuned on squad" (5 words) against
    # "bert model" (2): 2 shared -> 4/7, against "bert finetuned on squad data" (5): 4 shared -> 8/10; the best: 4/5.
    # a3: an empty generation reads "Unanswerable": 1.
    assert result['f1,none'] == pytest.approx(100 * (1 + 4 / 5 + 1) / 3, abs=1e-9) and result['sample_len'] == 3
    assert squad_f1('The BERT model, fine-tuned on SQuAD', 'BERT fine-tuned on SQuAD data') == pytest.approx(4 / 5)


@needs_harness
def test_qasper_through_the_script_equals_f1_by_hand(run, tmp_path):
    from studies import harness
    root, _ = run
    path = tmp_path / 'qasper.jsonl'
    path.write_text(''.join(json.dumps(row) + '\n' for row in QASPER))
    out = run_script('studies/harness.py', f'--out_dir={root / "out"}', '--tasks=qasper_scrolls',
                     f'--scrolls_source={path}', '--bootstrap_iters=0', '--device=cpu')
    result = json.loads((root / 'out' / 'harness.json').read_text())['results']['qasper_scrolls']
    # the same questions by hand on the same model: ' yes' against ' no', else the greedy answer up to a newline
    s = scorer(harness.load_bpe_run(str(root / 'out' / 'ckpt.pt')).model)
    prompts, references = {row['id']: qasper_prompt(row) for row in QASPER}, {}
    for row in QASPER:
        references.setdefault(row['id'], []).append(row['output'])
    (yes, _), (no, _) = s.loglikelihood([(prompts['a1'], ' yes'), (prompts['a1'], ' no')])  # a1: yes or no
    texts = s.generate_until([(prompts[q], {'until': ['\n'], 'max_gen_toks': 256}) for q in ('a2', 'a3')])  # batched
    answers = {'a1': ' yes' if yes > no else ' no', **{q: text if text.strip() else 'Unanswerable'
                                                       for q, text in zip(('a2', 'a3'), texts)}}
    f1 = [100 * max(squad_f1(answers[q], r) for r in references[q]) for q in answers]
    assert result['sample_len'] == 3 and result['f1,none'] == pytest.approx(sum(f1) / 3, abs=1e-9), out
    assert '|f1|' in (root / 'out' / 'harness.md').read_text().replace(' ', '')


@needs_harness
def test_scrolls_bad_input_is_one_line(tmp_path):
    path = tmp_path / 'qmsum.jsonl'
    path.write_text(''.join(json.dumps(row) + '\n' for row in QMSUM))
    blocked = ['', '', 0, "import sys; sys.modules['rouge_score'] = None"]  # rouge-score not installed
    (_, out), = run_forked({'argv': ['studies/harness.py', f'--out_dir={tmp_path}', '--tasks=qmsum_scrolls',
                                     f'--scrolls_source={path}'], 'fault': blocked})
    assert out.strip().splitlines()[-1] == ("error: qmsum_scrolls: SCROLLS scores these with Google's ROUGE; pip "
                                            "install -r requirements-extras.txt (rouge-score==0.1.2)")
    out = run_script('studies/harness.py', f'--out_dir={tmp_path}', '--tasks=qmsum_scrolls,qasper_scrolls',
                     f'--scrolls_source={path}', check=False)
    assert out.strip().splitlines()[-1] == (f"error: scrolls_source={path} is one task's rows, and tasks names 2 "
                                            f"SCROLLS tasks (qmsum_scrolls, qasper_scrolls); pass one per run with "
                                            f"its own --scrolls_source")
    out = run_script('studies/harness.py', f'--out_dir={tmp_path}', '--tasks=qasper_scrolls',
                     f'--scrolls_source={tmp_path / "no.jsonl"}', check=False)
    assert out.strip().splitlines()[-1].startswith(f"error: scrolls_source={tmp_path / 'no.jsonl'} does not exist")
