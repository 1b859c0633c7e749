"""OpenWebText as GPT-2 tokens: data/openwebtext/train.bin, val.bin and meta.json (see prepare/text.py).

python prepare/openwebtext.py                          # from the hub (about 9B tokens), streamed
python prepare/openwebtext.py --max_tokens=1e9         # only the first ~1B tokens; rerun with more to continue
python prepare/openwebtext.py --source=PATH            # a local copy: parquet/jsonl with a `text` column, or txt

The hub repo Skylion007/openwebtext carries a loading script, which datasets>=4 refuses ("Dataset scripts are no
longer supported", nanoGPT issue #633), so parquet copies of it are tried in turn.
"""
import sys
from pathlib import Path

if __name__ == "__main__":  # run as a script: make the `prepare` package importable from the repo root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from datasets import load_dataset

from prepare.catalog import default_data_dir
from prepare.folder import read_meta
from prepare.script import script_errors
from prepare.sources import check_source
from prepare.text import arg_parser, open_dataset, prepare_text, prepared_enough

HUB = "Skylion007/openwebtext"
DATA_DIR = default_data_dir("openwebtext")
# label -> load_dataset arguments, tried in this order; each keeps the documents in the repo's order
CANDIDATES = {
    HUB: dict(path=HUB),  # works once the repo's loading script is gone
    f"{HUB}/data/*.parquet": dict(path="parquet", data_files=f"hf://datasets/{HUB}/data/train-*.parquet"),
    f"{HUB}@refs/convert/parquet": dict(path=HUB, revision="refs/convert/parquet"),  # the hub's own export
    "dylanebert/openwebtext": dict(path="dylanebert/openwebtext"),  # a parquet mirror
}


def load_hub(prefer=None):
    """The first candidate that loads, trying `prefer` (the one an earlier run used) first: (dataset, label)."""
    errors = []
    for label in sorted(CANDIDATES, key=lambda label: label != prefer):
        try:
            dataset = load_dataset(**CANDIDATES[label], split="train", streaming=True)
            print(f"openwebtext: reading {label}")
            return dataset, label
        except Exception as e:
            errors.append(f"{label}: {type(e).__name__}: {e}")
    raise RuntimeError("no copy of OpenWebText could be loaded:\n  " + "\n  ".join(errors))


def prepare(data_dir=DATA_DIR, source=None, max_tokens=None, **kwargs):
    """Tokenize OpenWebText (the hub, or a local `source`) into data_dir; kwargs go to prepare_text. Returns meta."""
    check_source(data_dir, source, "source")  # a folder prepared from another copy: said, not ignored
    if meta := prepared_enough(data_dir, max_tokens, kwargs.get("min_val_tokens", 0),
                               kwargs.get("min_train_tokens", 0)):
        return meta
    previous = (read_meta(data_dir) or {}).get("source")  # continue from the same copy, not another one
    dataset, label = open_dataset(source, lambda: load_hub(prefer=previous), HUB)
    return prepare_text(dataset, data_dir, label, max_tokens, name="openwebtext", **kwargs)


if __name__ == "__main__":
    with script_errors():  # bad --source, no network, Ctrl-C: one line, not a traceback
        prepare(**vars(arg_parser(__doc__, DATA_DIR).parse_args()))
