"""The local tasks' documents, read from the files harness.py names in the task metadata (hellaswag_source,
text_source, scrolls_source): the harness calls these as each YAML's custom_dataset, with the metadata as keyword
arguments. SCROLLS' multiple-choice tasks are written here too (its prompts, after Shaham et al. 2022), from the hub
or a local jsonl: the harness's own scrolls_* tasks import a module that transformers 5 removed."""
import json
import re
from pathlib import Path

import datasets


def hellaswag_rows(hellaswag_source='', **kwargs):
    """The rows of a HellaSwag jsonl in its original schema (ctx, ctx_a, ctx_b, activity_label, endings, label)."""
    rows = [json.loads(line) for line in Path(hellaswag_source).read_text().splitlines() if line.strip()]
    for row in rows:
        row['label'] = int(row['label'])  # the hub's copy has strings
    return datasets.DatasetDict({'validation': datasets.Dataset.from_list(rows)})


def text_documents(text_source='', **kwargs):
    """A txt file as one document, or a jsonl's `text` fields as one document each."""
    path = Path(text_source)
    if path.suffix == '.jsonl':
        texts = [json.loads(line)['text'] for line in path.read_text().splitlines() if line.strip()]
    else:
        texts = [path.read_text()]
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
