"""GPT-2 BPE token datasets from web text: the machinery that fineweb_edu.py and openwebtext.py share.

Documents come from a `datasets` streaming table: the hub, or a local --source read by the same loaders, so both
go down one code path. Each document becomes [EOT] + its tokens: the EOT goes *before* the document, as in
build-nanogpt, so every document starts right after an EOT. Document i goes to val.bin when i % val_every == 0 and
to train.bin otherwise: a fixed 1% held out (about 100M tokens of 10B, 2 docs of a 150-doc sample). A folder that
train.py prepares also sends its first documents to val until val holds what the run's evaluation needs (val_first
in meta.json), so that a small budget or a small source still gets a val split to evaluate on.

meta.json is the record of what is done. The token files are only ever appended to, under temporary names while a
run is on, and are cut back to the counts in meta.json when a run starts. So a killed run, or a rerun with a larger
--max_tokens, continues from the last record and ends byte-identical to one uninterrupted run. A run stopped by a
failed write (disk full), Ctrl-C or an error puts them back under their final names, cut to that record: no
temporary file is left, and a failed write is one `error:` line saying how many tokens are kept.
"""
import argparse
import itertools
import json
import os
from collections import Counter
from multiprocessing import Pool
from pathlib import Path

import numpy as np
from datasets import load_dataset
from tqdm import tqdm

from prepare.atomic import write_atomically, write_text
from prepare.folder import check_not_read, read_meta, stop_if_disk_full
from prepare.script import whole_number
from prepare.sources import gpt2_encoding, hub_or_cache, local_copy

EOT = 50256  # <|endoftext|>
FORMATS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".txt": "text"}  # suffix -> datasets loader
SOURCE_HELP = ("a parquet or jsonl file (or a folder of them) with a `text` column, "
               "or a txt file whose documents are separated by blank lines")


def local_files(source):
    """(datasets loader, files) for a local file or a folder of files; ValueError if it is not a format we read."""
    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(f"--source={source} does not exist")
    files = sorted(p for p in path.rglob("*") if p.suffix in FORMATS) if path.is_dir() else [path]
    kinds = {FORMATS.get(p.suffix) for p in files}
    if len(kinds) > 1 and None not in kinds:  # one loader reads a folder: its files must share a format
        found = ", ".join(f"{n} {suffix}" for suffix, n in sorted(Counter(p.suffix for p in files).items()))
        raise ValueError(f"--source={source} mixes formats ({found} files), and a folder is read by one loader; pass "
                         f"--source=PATH of one of its files, or of a folder of one format")
    if len(kinds) != 1 or None in kinds:
        what = "holds none of" if path.is_dir() else f"({path.suffix or 'no suffix'}) is not one of"
        raise ValueError(f"--source={source} {what} the formats read here ({', '.join(FORMATS)}): expected "
                         f"{SOURCE_HELP}")
    return kinds.pop(), [str(p) for p in files]


def open_dataset(source, load_hub, name):
    """(dataset, label): a local --source if given, else load_hub(); checked for a `text` column before any work."""
    if source is not None:
        kind, files = local_files(source)
        label = str(Path(source).resolve())
        options = {"sample_by": "paragraph"} if kind == "text" else {}  # txt: a document per blank-line-separated block
        try:  # the loaders the hub uses too, so a local copy and the hub take one code path
            dataset = load_dataset(kind, data_files=files, split="train", streaming=True, **options)
            first = next(iter(dataset), None)
        except Exception as e:  # a file that is not what its suffix says
            raise ValueError(f"could not read --source={source} ({e}): expected {SOURCE_HELP}") from e
    else:
        with hub_or_cache() as unreachable:
            try:
                dataset, label = load_hub()
                first = next(iter(dataset), None)
            except Exception as e:  # offline, or the hub repo moved
                why = unreachable or f"{type(e).__name__}: {e}"
                raise RuntimeError(f"could not load {name} from the Hugging Face hub ({why}). Offline? Get a copy "
                                   f"and pass {local_copy('PATH')}, {SOURCE_HELP}.") from e
    if first is None or "text" not in first:
        raise ValueError(f"{label} has no documents with a `text` column (columns: {sorted(first or {})}): "
                         f"expected {SOURCE_HELP}")
    return dataset, label


def tokenize(docs):
    """[EOT] + GPT-2 tokens of each document, as uint16 arrays (runs in the worker processes)."""
    enc = gpt2_encoding()  # cached by tiktoken: free after the first call in each process
    return [np.array([EOT] + enc.encode_ordinary(doc), dtype=np.uint16) for doc in docs]


def tokenized(texts, num_proc, chunk_docs):
    """Token arrays of `texts`, in order, from a pool of workers that reads only a few chunks ahead."""
    chunks = iter(lambda: list(itertools.islice(texts, chunk_docs)), [])
    pool, finished = Pool(num_proc), False
    try:
        while batch := list(itertools.islice(chunks, 4 * num_proc)):  # bounded read-ahead: a budget never pulls it all
            for chunk in pool.imap(tokenize, batch):
                yield from chunk
        pool.close()  # every task done: the workers exit by themselves. Pool's `with` terminates them instead,
        pool.join()   # which can hang for good in Pool._terminate_pool (its task thread stuck on the queue's lock)
        finished = True
    finally:
        if not finished:  # stopped early (a budget, an error, Ctrl-C): no task is worth waiting for
            pool.terminate()


def write_json(path, obj):
    """Write to a temporary name, then rename: the file under its final name is always whole (write_atomically)."""
    write_atomically(path, lambda tmp: write_text(tmp, json.dumps(obj, indent=2) + "\n"))


def open_tokens(data_dir, split, n_tokens):
    """split.bin, moved to its temporary name and cut back to the n_tokens that meta.json records, for appending."""
    final, tmp = data_dir / f"{split}.bin", data_dir / f"{split}.bin.tmp"
    if final.exists():
        os.replace(final, tmp)  # while we write, nothing half-written sits under the final name
    if n_tokens and (not tmp.exists() or tmp.stat().st_size < 2 * n_tokens):
        raise RuntimeError(f"{final} holds fewer tokens than meta.json says: delete {data_dir} and prepare again")
    f = open(tmp, "r+b" if tmp.exists() else "wb")
    f.truncate(2 * n_tokens)  # drop whatever a killed run wrote after its last record
    f.seek(2 * n_tokens)
    return f


def commit(files, data_dir, meta, final=False):
    """Make the tokens written so far durable, then record them in meta.json (written last: it is the commit)."""
    for split, f in files.items():
        f.flush()
        os.fsync(f.fileno())
        if final:
            f.close()
            os.replace(data_dir / f"{split}.bin.tmp", data_dir / f"{split}.bin")
    write_json(data_dir / "meta.json", meta)


def put_back(data_dir):
    """After a stop: each split under its final name again, cut to the tokens meta.json records (removed where there
    is no meta.json, nothing recorded), so that no temporary file is left and the next run goes on from there."""
    meta = read_meta(data_dir)
    for split in ("train", "val"):
        final, tmp = data_dir / f"{split}.bin", data_dir / f"{split}.bin.tmp"
        path = tmp if tmp.exists() else final
        if path.exists() and meta is None:
            path.unlink()
        elif path.exists():
            os.truncate(path, 2 * meta["tokens"][split])
            os.replace(path, final)
    return meta


def prepared_enough(data_dir, max_tokens, min_val_tokens=0, min_train_tokens=0):
    """meta if data_dir already holds the whole source, or max_tokens of which min_val_tokens in val and
    min_train_tokens in train, else None: then nothing is opened or downloaded, so a prepared dataset trains offline."""
    meta = read_meta(data_dir)
    if meta and (meta["complete"] or (max_tokens is not None and sum(meta["tokens"].values()) >= max_tokens
                                      and meta["tokens"]["val"] >= min_val_tokens
                                      and meta["tokens"]["train"] >= min_train_tokens)):
        print(f"{data_dir}: {sum(meta['tokens'].values()):,} tokens already prepared"
              + (" (all of the source)" if meta["complete"] else ""))
        return meta
    return None


def prepare_text(dataset, data_dir, source, max_tokens=None, val_every=100, num_proc=None, chunk_docs=64,
                 checkpoint_tokens=100_000_000, name=None, min_val_tokens=0, min_train_tokens=0):
    """Tokenize `dataset` into data_dir/{train,val}.bin until about max_tokens (None: all of it) and until val
    holds min_val_tokens and train min_train_tokens; returns meta. A fresh folder sends its first documents to val
    until val holds min_val_tokens (recorded as val_first, the split rule thereafter), so a small budget still gets a
    val split to evaluate on; a continued one reads on until its 1-in-val_every documents reach min_val_tokens."""
    gpt2_encoding()  # offline with no tokenizer cached: one line now, not a worker's traceback later
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    fresh = read_meta(data_dir) is None
    meta = read_meta(data_dir) or {"dataset": name, "vocab_size": 50257, "encoding": "gpt2", "kind": "text",
                                   "tokens": {"train": 0, "val": 0}, "documents": {"train": 0, "val": 0},
                                   "source": source, "val_every": val_every, "val_first": min_val_tokens,
                                   "complete": False}
    if (meta["source"], meta["val_every"]) != (source, val_every):  # appending another stream would mix two datasets
        raise ValueError(f"{data_dir} holds {meta['source']} (val_every={meta['val_every']}), not {source} "
                         f"(val_every={val_every}): delete it or choose another --data_dir")
    total = sum(meta["tokens"].values())
    if not fresh:  # its token files are moved aside to be appended to: never under a live run
        check_not_read(data_dir)
    files = {split: open_tokens(data_dir, split, n) for split, n in meta["tokens"].items()}
    doc_index = sum(meta["documents"].values())
    val_first = meta.get("val_first", 0)  # absent in folders prepared before it existed
    texts = (row["text"] for row in dataset.skip(doc_index))  # documents consumed by earlier runs are skipped
    docs = tokenized(texts, num_proc or max(1, os.cpu_count() // 2), chunk_docs)
    progress = tqdm(total=max_tokens, initial=total, unit="tok", unit_scale=True, desc=f"tokenizing {data_dir.name}")
    committed, split, finished = total, "train", False
    try:
        for tokens in docs:
            split = "val" if doc_index % val_every == 0 or meta["tokens"]["val"] < val_first else "train"
            files[split].write(tokens.tobytes())
            meta["tokens"][split] += len(tokens)
            meta["documents"][split] += 1
            doc_index += 1
            total += len(tokens)
            progress.update(len(tokens))
            if max_tokens is not None and total >= max_tokens and meta["tokens"]["val"] >= min_val_tokens \
                    and meta["tokens"]["train"] >= min_train_tokens:
                break  # stop within one document of the budget
            if total - committed >= checkpoint_tokens:
                commit(files, data_dir, meta)
                committed = total
        else:
            meta["complete"] = True  # the source ran out before the budget
        commit(files, data_dir, meta, final=True)
        finished = True
    except OSError as e:  # a full disk: one line saying what is kept (meta.json's record: put_back leaves it)
        stop_if_disk_full(e, str(e.filename).removesuffix(".tmp") if e.filename else data_dir / f"{split}.bin",
                          kept_tokens(data_dir))
        raise
    finally:  # also when interrupted: stop the workers, close the files, put them back as meta.json records them
        docs.close()
        progress.close()
        for f in files.values():
            try:
                f.close()
            except OSError:
                pass  # a full disk: the buffered tail is lost, and put_back cuts it anyway
        if not finished:
            put_back(data_dir)
    if meta["complete"] and not all(meta["tokens"].values()):  # the whole source leaves a split empty
        if fresh:  # nothing worth keeping: the folder is left as it was found
            for name in ("train.bin", "val.bin", "meta.json"):
                (data_dir / name).unlink(missing_ok=True)
        raise ValueError(f"{source} is too small: its {sum(meta['documents'].values())} document(s) make "
                         f"{meta['tokens']['train']} train and {meta['tokens']['val']} val tokens (one document in "
                         f"{val_every} goes to val), and each split needs some; give --source=PATH with more documents")
    print(f"{data_dir}: train {meta['tokens']['train']:,} tokens ({meta['documents']['train']:,} docs), "
          f"val {meta['tokens']['val']:,} tokens ({meta['documents']['val']:,} docs), complete={meta['complete']}")
    return meta


def kept_tokens(data_dir):
    """What a stopped run keeps (read after put_back): the tokens meta.json records."""
    meta = read_meta(data_dir)
    if meta is None:
        return f"{data_dir} holds nothing prepared (no meta.json), and no temporary file"
    return f"{data_dir} keeps the {sum(meta['tokens'].values()):,} tokens its meta.json records, no temporary file left"


def arg_parser(description, data_dir):
    """The flags every web-text script takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--source", type=os.path.expanduser, default=None,
                        help=f"a local copy instead of the hub: {SOURCE_HELP}")
    parser.add_argument("--data_dir", type=os.path.expanduser, default=str(data_dir),
                        help="where train.bin, val.bin and meta.json go")
    parser.add_argument("--max_tokens", type=whole_number("max_tokens", "1e9", at_least=1), default=None,
                        help="stop after about this many tokens (e.g. 1e9); rerun with more to continue")
    parser.add_argument("--num_proc", type=whole_number("num_proc", 1, 1, os.cpu_count() or 1), default=None,
                        help="tokenizer processes, at most the cores (default: half of them)")  # each is a fork
    return parser
