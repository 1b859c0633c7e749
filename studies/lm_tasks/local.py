"""The local tasks' documents, read from the files harness.py names in the task metadata (hellaswag_source,
text_source, scrolls_source): the harness calls these as each YAML's custom_dataset, with the metadata as keyword
arguments. SCROLLS' tasks are written here too (the harness's scrolls_* prompts and requests, SCROLLS' own F1 and
ROUGE), from the hub or a local jsonl: the harness's own scrolls_* tasks import a module that transformers 5 removed."""
import math
import re
import string
from collections import Counter

import datasets
from lm_eval.api.instance import Instance
from lm_eval.api.task import ConfigurableTask

from prepare.sources import read_documents
from support.hellaswag import SCHEMA, read_rows


def hellaswag_rows(hellaswag_source='', **kwargs):
    """The rows of a HellaSwag jsonl in its original schema (ctx, ctx_a, ctx_b, activity_label, endings, label)."""
    rows = read_rows(hellaswag_source, SCHEMA)  # checked by harness.py first, as here
    return datasets.DatasetDict({'validation': datasets.Dataset.from_list(rows)})


def text_documents(text_source='', **kwargs):
    """A txt file as one document, or a jsonl's `text` fields as one document each."""
    texts = read_documents(text_source, 'text_source')  # checked by harness.py first, as here
    return datasets.DatasetDict({'test': datasets.Dataset.from_list([{'text': t} for t in texts])})



SCROLLS_ZIP = 'https://huggingface.co/datasets/tau/scrolls/resolve/main/{name}.zip'  # {name}/{split}.jsonl inside


def scrolls_rows(scrolls_source='', scrolls_name='quality', **kwargs):
    """A SCROLLS dataset's rows (id, pid, input, output): a local jsonl (scrolls_source: the validation split and the
    few-shot pool), else the validation and train splits of tau/scrolls from the hub. The rows of one id (one
    question with several references) become one document with every output in `outputs`."""
    if scrolls_source:
        files = {'validation': scrolls_source, 'train': scrolls_source}
    else:
        files = {split: f"zip://{scrolls_name}/{split}.jsonl::{SCROLLS_ZIP.format(name=scrolls_name)}"
                 for split in ('validation', 'train')}
    splits = datasets.load_dataset('json', data_files=files)
    return datasets.DatasetDict({split: merge_outputs(rows) for split, rows in splits.items()})


def merge_outputs(rows):
    documents = {}
    for row in rows:
        documents.setdefault(row['id'], {**{k: v for k, v in row.items() if k != 'output'}, 'outputs': []})
        documents[row['id']]['outputs'].append(row['output'])
    return datasets.Dataset.from_list(list(documents.values()))


def split_question(doc):
    """SCROLLS prepends the question to the text with a blank line between them."""
    question, text = doc['input'].split('\n\n', 1)
    return question, text


def quality_docs(dataset):
    """QuALITY: the options (A)-(D) open the text, up to the blank line after (D); the answer is one of them."""
    def process(doc):
        question, text = split_question(doc)
        end = text.find('\n\n', text.find('(D)'))
        choices = [' '.join(c.split()) for c in re.split(r' *\([A-D]\) *', text[:end])[1:]]
        return {'question': question, 'text': text[end:].strip(), 'choices': choices,
                'gold': choices.index(' '.join(doc['outputs'][0].split()))}
    return dataset.map(process)


CONTRACTNLI_CHOICES = ['Not mentioned', 'Entailment', 'Contradiction']


def contractnli_docs(dataset):
    """ContractNLI: the hypothesis, then the contract; the answer one of three labels."""
    def process(doc):
        question, text = split_question(doc)
        return {'question': question, 'text': text, 'choices': CONTRACTNLI_CHOICES,
                'gold': CONTRACTNLI_CHOICES.index(doc['outputs'][0])}
    return dataset.map(process)


def question_docs(dataset):
    """QMSum, Qasper: the query, then the text (SCROLLS prepends the query with a blank line between them)."""
    def process(doc):
        question, text = split_question(doc)
        return {'question': question, 'text': text}
    return dataset.map(process)


def qasper_docs(dataset):
    """Qasper: a question whose every reference is yes or no (after SQuAD's normalisation) is a yes/no question."""
    return question_docs(dataset).map(lambda doc: {'is_yes_no': all(normalize_answer(o) in ('yes', 'no')
                                                                    for o in doc['outputs'])})


def joined_outputs(doc):
    """The few-shot answer: every reference, comma-separated, as the harness's scrolls_* tasks write it."""
    return ', '.join(doc['outputs'])


def normalize_answer(text):
    """SQuAD's normalisation, which SCROLLS' F1 uses: lower case, no punctuation, no articles, single spaces."""
    text = ''.join(ch for ch in text.lower() if ch not in string.punctuation)
    return ' '.join(re.sub(r'\b(a|an|the)\b', ' ', text).split())


def token_f1(prediction, reference):
    """SCROLLS' F1 (SQuAD's): the F1 of the two normalised texts' words, counted with repetition."""
    predicted, wanted = normalize_answer(prediction).split(), normalize_answer(reference).split()
    same = sum((Counter(predicted) & Counter(wanted)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(wanted)
    return 2 * precision * recall / (precision + recall)


def qasper_f1(doc, results):
    """Qasper as the harness's scrolls_qasper answers it (the likelier of ' yes' / ' no' for a yes/no question, else
    the generation, an empty one read as 'Unanswerable'), scored as SCROLLS does: the best F1 over the references,
    times 100."""
    if doc['is_yes_no']:
        (yes, _), (no, _) = results  # (log-likelihood, is greedy) of ' yes', of ' no'
        prediction = ' yes' if yes > no else ' no'
    else:
        prediction = results[0] if results[0].strip() else 'Unanswerable'
    return {'f1': 100 * max(token_f1(prediction, reference) for reference in doc['outputs'])}


ROUGE_TYPES = ('rouge1', 'rouge2', 'rougeL')


def rouge_scores(doc, results):
    """SCROLLS' ROUGE of one generation: Google's rouge-score without the stemmer (SCROLLS' use_stemmer=False; the
    package's words: lower case, any character but a-z and 0-9 a space), the F-measure times 100, the best over
    the references for each of ROUGE-1, -2, -L on its own. (SCROLLS puts a newline after each sentence first: that
    changes only ROUGE-Lsum, which it does not report.)"""
    from rouge_score import rouge_scorer
    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=False)
    scores = [scorer.score(reference, results[0]) for reference in doc['outputs']]  # score(target, prediction)
    best = {key: 100 * max(score[key].fmeasure for score in scores) for key in ROUGE_TYPES}
    return {**best, 'rouge_geometric_mean': tuple(best.values())}


def geometric_mean(items):
    """SCROLLS' ROUGE score: the geometric mean of the means of ROUGE-1, -2 and -L over the documents.
    items: [(rouge1, rouge2, rougeL)], one per document."""
    means = [sum(column) / len(items) for column in zip(*items)]
    return math.prod(means) ** (1 / len(means))


class QasperTask(ConfigurableTask):
    """The YAML's task, but a yes/no question asks for the log-likelihoods of ' yes' and ' no' instead of a
    generation, as the harness's scrolls_qasper does."""

    def __init__(self, config):
        super().__init__(config={k: v for k, v in config.items() if k != 'class'})  # 'class' names this class

    def construct_requests(self, doc, ctx, **kwargs):
        if not doc['is_yes_no']:
            return super().construct_requests(doc, ctx, **kwargs)
        kwargs = {k: v for k, v in kwargs.items() if k not in ('apply_chat_template', 'chat_template')}
        return [Instance(request_type='loglikelihood', doc=doc, arguments=(ctx, answer), idx=i, **kwargs)
                for i, answer in enumerate((' yes', ' no'))]
