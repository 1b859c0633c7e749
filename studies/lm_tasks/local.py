"""The local tasks' documents, read from the files harness.py names in the task metadata (hellaswag_source,
text_source): the harness calls these as each YAML's custom_dataset, with the metadata as keyword arguments."""
import json
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
