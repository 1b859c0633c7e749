"""FineWeb-Edu as GPT-2 tokens: data/fineweb_edu/train.bin, val.bin and meta.json (see prepare/text.py).

python prepare/fineweb_edu.py                          # sample-10BT, streamed from the hub
python prepare/fineweb_edu.py --max_tokens=1e9         # only the first ~1B tokens; rerun with more to continue
python prepare/fineweb_edu.py --sample=sample-100BT    # a bigger sample (sample-10BT, sample-100BT, sample-350BT)
python prepare/fineweb_edu.py --source=PATH            # a local copy: parquet/jsonl with a `text` column, or txt
"""
import sys
from pathlib import Path

if __name__ == "__main__":  # run as a script: make the `prepare` package importable from the repo root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from datasets import load_dataset

from prepare.catalog import default_data_dir
from prepare.script import script_errors
from prepare.sources import check_source
from prepare.text import arg_parser, open_dataset, prepare_text, prepared_enough

HUB = "HuggingFaceFW/fineweb-edu"
DATA_DIR = default_data_dir("fineweb_edu")


def prepare(data_dir=DATA_DIR, source=None, max_tokens=None, sample="sample-10BT", **kwargs):
    """Tokenize FineWeb-Edu (the hub, or a local `source`) into data_dir; kwargs go to prepare_text. Returns meta."""
    check_source(data_dir, source, "source")  # a folder prepared from another copy: said, not ignored
    if meta := prepared_enough(data_dir, max_tokens, kwargs.get("min_val_tokens", 0),
                               kwargs.get("min_train_tokens", 0)):
        return meta
    def load_hub():  # streaming, so a partial budget downloads only what it reads
        return load_dataset(HUB, name=sample, split="train", streaming=True), f"{HUB}/{sample}"
    dataset, label = open_dataset(source, load_hub, f"{HUB} ({sample})")
    return prepare_text(dataset, data_dir, label, max_tokens, name="fineweb_edu", **kwargs)


if __name__ == "__main__":
    parser = arg_parser(__doc__, DATA_DIR)
    parser.add_argument("--sample", default="sample-10BT", help="which FineWeb-Edu sample on the hub")
    with script_errors():  # bad --source, no network, Ctrl-C: one line, not a traceback
        prepare(**vars(parser.parse_args()))
