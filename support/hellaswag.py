"""HellaSwag validation accuracy of a GPT, scored as in build-nanogpt (acc_norm).

Each row is a context and four endings. The model reads context + " " + ending for all four, and picks the ending
whose tokens have the lowest *mean* cross-entropy (the mean, not the sum, so long endings are not penalised).
The loader takes the original jsonl (https://github.com/rowanz/hellaswag): ctx, endings (4 strings), label.
"""
import os
import shutil
import urllib.request
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

from prepare import ROOT
from prepare.sources import gpt2_encoding, read_source_rows

URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"
CACHE_DIR = ROOT / "data" / "hellaswag"
FIELDS = ("ctx", "endings", "label")  # what a row must have to be scored here
SCHEMA = ("ctx", "ctx_a", "ctx_b", "activity_label", "endings", "label")  # the original's, which the harness reads


def download(cache_dir=CACHE_DIR):
    """The validation jsonl, fetched once into cache_dir (under a temporary name, renamed when whole)."""
    path = Path(cache_dir) / "hellaswag_val.jsonl"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        try:
            with urllib.request.urlopen(URL, timeout=60) as response, open(tmp, "wb") as f:
                shutil.copyfileobj(response, f)
        except OSError as e:
            raise RuntimeError(f"could not download HellaSwag from {URL} ({e}). Offline? Download that file "
                               f"elsewhere and pass its path as --hellaswag_source=PATH (train.py) or source (a jsonl "
                               f"with ctx, endings, label)") from e
        os.replace(tmp, path)
    return path


def load_rows(source=None, cache_dir=CACHE_DIR, ddp=False):
    """The rows of a local HellaSwag jsonl `source`, or of the downloaded validation set. ddp: every process calls it;
    rank 0 downloads first, the others then read its copy."""
    first = not ddp or dist.get_rank() == 0
    if not first:
        dist.barrier()
    path = Path(source) if source is not None else download(cache_dir)
    if ddp and first:
        dist.barrier()
    rows = read_rows(path)  # a bad local file named before the tokenizer is loaded
    gpt2_encoding()  # the tokenizer too, before any work: offline with none cached is one line now
    return rows


def read_rows(path, fields=FIELDS, key="hellaswag_source"):
    """The rows of a HellaSwag jsonl (given as --key), each label an int; ValueError naming the file and the row where
    one lacks one of `fields`, or its endings are not 4 strings or its label not 0..3, before any is scored."""
    label = f"--{key}={path}"
    todo = f"pass --{key}=PATH of HellaSwag's hellaswag_val.jsonl ({', '.join(fields)} in each row)"
    rows = read_source_rows(path, fields, label, todo)
    for number, row in enumerate(rows, 1):
        endings = row["endings"]
        if not (isinstance(row["ctx"], str) and isinstance(endings, list) and len(endings) == 4
                and all(isinstance(ending, str) for ending in endings) and str(row["label"]) in ("0", "1", "2", "3")):
            raise ValueError(f"{label}, row {number}: ctx must be a string, endings 4 strings and label 0..3 (label "
                             f"{row['label']!r}); {todo}")
        row["label"] = int(row["label"])  # the hub's copy has strings
    return rows


def render_example(row, enc):
    """(tokens (4, L), mask (4, L) that is 1 on ending tokens, label): the four context + ending candidates."""
    context = enc.encode_ordinary(row["ctx"])
    endings = [enc.encode_ordinary(" " + ending) for ending in row["endings"]]  # GPT-2 BPE puts the space on the word
    length = max(len(context) + len(ending) for ending in endings)
    tokens = torch.zeros(4, length, dtype=torch.long)  # right-padded; the padding is masked out
    mask = torch.zeros(4, length, dtype=torch.long)
    for i, ending in enumerate(endings):
        tokens[i, :len(context) + len(ending)] = torch.tensor(context + ending)
        mask[i, len(context):len(context) + len(ending)] = 1
    return tokens, mask, int(row["label"])


def ending_losses(logits, tokens, mask):
    """Mean cross-entropy over each candidate's ending tokens: (4,)."""
    mask = mask[:, 1:].bool()  # position t predicts token t + 1
    losses = torch.zeros(mask.shape, device=logits.device)
    losses[mask] = F.cross_entropy(logits[:, :-1][mask].float(), tokens[:, 1:][mask], reduction="none")  # endings only
    return losses.sum(1) / mask.sum(1)


@torch.no_grad()
def evaluate(model, rows, device, rank=0, world_size=1, autocast_ctx=nullcontext(), progress=False):
    """(correct, total) under acc_norm over rows[rank::world_size]; the caller all-reduces across ranks.
    progress: a bar on stderr (10,042 rows of a 100M model take minutes on a CPU).

    model: the unwrapped GPT (raw_model, not the DDP wrapper); `logits, loss = model(idx, targets)`.
    """
    enc = gpt2_encoding()
    block_size = model.config.block_size
    was_training = model.training
    model.eval()
    correct = total = 0
    for row in tqdm(rows[rank::world_size], desc='hellaswag', unit='row', disable=not progress, mininterval=2):
        tokens, mask, label = render_example(row, enc)
        tokens, mask = tokens[:, -block_size:], mask[:, -block_size:]  # longer than the model sees: drop oldest context
        tokens, mask = tokens.to(device), mask.to(device)
        with autocast_ctx:
            logits, _ = model(tokens, tokens)  # targets make the model return logits at every position
        correct += int(ending_losses(logits, tokens, mask).argmin().item() == label)
        total += 1
    model.train(was_training)
    return correct, total


def main(model, source=None, device="cpu"):
    """Print and return the acc_norm of `model` on HellaSwag (a local jsonl `source`, or the downloaded val set)."""
    correct, total = evaluate(model, load_rows(source), device, progress=True)
    print(f"hellaswag acc_norm {correct / total:.4f}")
    return correct / total
