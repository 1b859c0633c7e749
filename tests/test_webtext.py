"""Web-text preparation (prepare/text.py, fineweb_edu.py, openwebtext.py) on offline samples. (HellaSwag:
tests/test_hellaswag.py.)"""
import json
import os

import numpy as np
import pytest

from conftest import ROOT, SHARED

if not SHARED.exists():
    pytest.skip(f"offline data samples not found at {SHARED}", allow_module_level=True)
if (SHARED / "tiktoken_cache").exists():
    os.environ["TIKTOKEN_CACHE_DIR"] = str(SHARED / "tiktoken_cache")  # GPT-2 BPE without the network

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import tiktoken  # noqa: E402

from conftest import run_script  # noqa: E402
import prepare  # noqa: E402
from prepare import fineweb_edu, openwebtext, text  # noqa: E402
from prepare.folder import read_meta  # noqa: E402

PARQUET = SHARED / "fineweb_edu" / "fineweb_edu_150docs.parquet"
JSONL = SHARED / "fineweb_edu" / "fineweb_edu_150docs.jsonl"
TXT = SHARED / "openwebtext" / "openwebtext_sample.txt"
EOT = 50256
enc = tiktoken.get_encoding("gpt2")


def fineweb_docs():
    """The sample's documents, read with pyarrow directly (not through the code under test)."""
    return pq.read_table(PARQUET).column("text").to_pylist()


def doc_tokens(docs):
    return [[EOT] + enc.encode_ordinary(doc) for doc in docs]  # EOT first, once per document


def expected_splits(docs, val_every=100):
    """The reference concatenation: document i in val when i % val_every == 0."""
    tokens = doc_tokens(docs)
    join = lambda keep: np.array([t for i, d in enumerate(tokens) if keep(i) for t in d], dtype=np.uint16)
    return {"train": join(lambda i: i % val_every != 0), "val": join(lambda i: i % val_every == 0)}


def read_bins(data_dir):
    return {split: np.fromfile(data_dir / f"{split}.bin", dtype=np.uint16) for split in ("train", "val")}


def files_of(data_dir):
    return {p.name: p.read_bytes() for p in sorted(data_dir.iterdir())}


@pytest.mark.parametrize("source", [PARQUET, JSONL], ids=["parquet", "jsonl"])
def test_fineweb_tokens_are_exact(tmp_path, source):
    docs = fineweb_docs()
    meta = fineweb_edu.prepare(tmp_path, source=source, num_proc=2)
    expected = expected_splits(docs)
    bins = read_bins(tmp_path)
    assert len(docs) == 150
    assert len(bins["train"]) + len(bins["val"]) == sum(len(enc.encode_ordinary(d)) + 1 for d in docs) == 89438
    for split in ("train", "val"):
        np.testing.assert_array_equal(bins[split], expected[split])
        assert meta["tokens"][split] == len(bins[split])
    assert meta["documents"] == {"train": 148, "val": 2} and meta["complete"] is True
    assert json.loads((tmp_path / "meta.json").read_text()) == meta
    assert meta["vocab_size"] == 50257 and meta["encoding"] == "gpt2" and meta["kind"] == "text"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["meta.json", "train.bin", "val.bin"]  # no temporary left


def test_max_tokens_stops_at_budget_and_continues(tmp_path, monkeypatch):
    lengths = np.array([len(d) for d in doc_tokens(fineweb_docs())])
    ends = np.cumsum(lengths)  # total tokens after each document
    full, part = tmp_path / "full", tmp_path / "part"
    fineweb_edu.prepare(full, source=PARQUET)
    expected = read_bins(full)

    tokenized = []  # documents the tokenizer is handed, counted in the parent process
    def counting(texts, *args):
        for tokens in text_tokenized(texts, *args):
            tokenized.append(len(tokens))
            yield tokens
    text_tokenized = text.tokenized
    monkeypatch.setattr(text, "tokenized", counting)

    consumed = 0
    for budget in (10_000, 40_000):
        tokenized.clear()
        meta = fineweb_edu.prepare(part, source=PARQUET, max_tokens=budget)
        total = meta["tokens"]["train"] + meta["tokens"]["val"]
        docs = meta["documents"]["train"] + meta["documents"]["val"]
        assert budget <= total < budget + lengths.max()  # within one document of the budget
        assert total == ends[docs - 1] and ends[docs - 2] < budget  # stopped at the first document reaching it
        assert meta["complete"] is False
        assert len(tokenized) == docs - consumed  # continuing skipped what was consumed, tokenized only new documents
        consumed = docs
        bins = read_bins(part)
        for split in ("train", "val"):
            np.testing.assert_array_equal(bins[split], expected[split][:len(bins[split])])
    assert (consumed, total) == (64, 40_180)  # counted independently from the sample

    tokenized.clear()
    meta = fineweb_edu.prepare(part, source=PARQUET)  # no budget: the rest of the source
    assert meta["complete"] is True and len(tokenized) == 150 - consumed
    assert files_of(part) == files_of(full)  # byte for byte, meta.json included


@pytest.mark.parametrize("first_budget", [None, 20_000], ids=["fresh", "continuing"])
def test_interrupted_run_resumes_byte_identical(tmp_path, monkeypatch, first_budget):
    full, part = tmp_path / "full", tmp_path / "part"
    options = dict(source=PARQUET, checkpoint_tokens=5_000, chunk_docs=4)
    fineweb_edu.prepare(full, **options)
    if first_budget:
        fineweb_edu.prepare(part, max_tokens=first_budget, **options)

    real_commit = text.commit
    calls = []
    def killed_on_third_commit(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # as if killed after writing tokens it had not yet recorded
        real_commit(*args, **kwargs)
    monkeypatch.setattr(text, "commit", killed_on_third_commit)
    monkeypatch.setattr(text, "put_back", lambda data_dir: None)  # a kill runs no cleanup (Ctrl-C does: put_back)
    with pytest.raises(KeyboardInterrupt):
        fineweb_edu.prepare(part, **options)
    monkeypatch.undo()

    # what a reader finds now: a whole meta.json recording a prefix; no split.bin under its final name
    meta = json.loads((part / "meta.json").read_text())
    total = meta["tokens"]["train"] + meta["tokens"]["val"]
    assert (first_budget or 0) < total < 89_438 and meta["complete"] is False
    assert not (part / "train.bin").exists() and not (part / "val.bin").exists()
    assert (part / "train.bin.tmp").stat().st_size > 2 * meta["tokens"]["train"]  # an unrecorded tail to discard

    fineweb_edu.prepare(part, **options)
    assert files_of(part) == files_of(full)


@pytest.mark.parametrize("config_file,dataset,source", [("softmax_gpt.py", "openwebtext", TXT),
                                                         ("krause_gpt.py", "fineweb_edu", PARQUET)])
def test_a_quick_trial_of_a_main_config_gets_a_val_split(tmp_path, config_file, dataset, source):
    # `train.py config/X --max_iters=2 --batch_size=2 --data_source=SAMPLE`: the budget covers training, and the
    # first documents go to val until it can serve the run's evaluation (block_size + eval_iters x batch_size)
    cfg = {}
    exec((ROOT / "config" / config_file).read_text(), cfg)
    cfg.update(max_iters=2, batch_size=2)
    prepare.prepare_dataset(dataset, tmp_path, str(source), cfg)
    meta, tokens = prepare.check_files(dataset, tmp_path)
    need = cfg["block_size"] + cfg["eval_iters"] * 2
    assert meta["val_first"] == need and meta["dataset"] == dataset
    assert need <= tokens["val"] < need + 20_000 and tokens["train"] > 3 * 2 * cfg["block_size"]


def test_a_budget_the_first_document_exceeds_still_gets_a_train_window(tmp_path):
    # `train.py --max_iters=1 --batch_size=1 --block_size=8 --eval_iters=1 --data_source=SAMPLE`: the budget (27
    # tokens) is passed by the first document, which goes to val; train reads on to its first window (9 tokens)
    cfg = dict(max_iters=1, gradient_accumulation_steps=1, batch_size=1, block_size=8, eval_iters=1)
    prepare.prepare_dataset("fineweb_edu", tmp_path, str(PARQUET), cfg)
    meta, tokens = prepare.check_files("fineweb_edu", tmp_path)
    first, second = map(len, doc_tokens(fineweb_docs()[:2]))
    assert meta["documents"] == {"train": 1, "val": 1} and meta["complete"] is False
    assert tokens == {"train": second, "val": first} and second >= 9


def test_a_folder_prepared_for_less_reads_on_until_val_suffices(tmp_path):
    docs = fineweb_docs()
    fineweb_edu.prepare(tmp_path, source=PARQUET, max_tokens=5_000)  # as the script does: 1 doc in 100 to val
    small = read_meta(tmp_path)["tokens"]["val"]
    meta = fineweb_edu.prepare(tmp_path, source=PARQUET, max_tokens=5_000, min_val_tokens=small + 1)
    assert meta["documents"]["val"] == 2 and meta["val_first"] == 0 and meta["complete"] is False
    expected, bins = expected_splits(docs), read_bins(tmp_path)  # the split rule it was prepared with, kept
    for split in ("train", "val"):
        np.testing.assert_array_equal(bins[split], expected[split][:len(bins[split])])


def test_openwebtext_txt_as_a_script(tmp_path):
    docs = [doc for doc in TXT.read_text().split("\n\n") if doc]  # documents are blank-line separated
    run_script("prepare/openwebtext.py", f"--source={TXT}", f"--data_dir={tmp_path}")  # GPT-2 BPE from SHARED's cache
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["documents"] == {"train": len(docs) - 22, "val": 22} and len(docs) == 2121
    assert meta["tokens"]["train"] + meta["tokens"]["val"] == sum(len(d) for d in doc_tokens(docs))
    expected, bins = expected_splits(docs), read_bins(tmp_path)
    for split in ("train", "val"):
        np.testing.assert_array_equal(bins[split], expected[split])


def test_bad_source_fails_before_any_output(tmp_path):
    wrong_column = tmp_path / "wrong_column.parquet"
    pq.write_table(pa.table({"content": ["a document", "another"]}), wrong_column)
    no_text_key = tmp_path / "no_text.jsonl"
    no_text_key.write_text('{"body": "a document"}\n')
    csv = tmp_path / "docs.csv"
    csv.write_text("text\na document\n")
    not_parquet = tmp_path / "fake.parquet"
    not_parquet.write_text("this is not parquet\n")
    for source in (wrong_column, no_text_key, csv, not_parquet):
        out = tmp_path / f"out_{source.name}"
        with pytest.raises(ValueError, match="text"):
            fineweb_edu.prepare(out, source=source)
        assert not out.exists()

    # a data_dir that holds another source is not appended to
    out = tmp_path / "out"
    fineweb_edu.prepare(out, source=PARQUET, max_tokens=1_000)
    before = files_of(out)
    with pytest.raises(ValueError, match="another --data_dir"):
        fineweb_edu.prepare(out, source=JSONL)
    assert files_of(out) == before


@pytest.mark.parametrize("module, name", [(fineweb_edu, "HuggingFaceFW/fineweb-edu"),
                                          (openwebtext, "Skylion007/openwebtext")])
def test_no_network_and_no_source_says_what_to_do(tmp_path, monkeypatch, module, name):
    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach the Hub")
    monkeypatch.setattr(module, "load_dataset", offline)
    with pytest.raises(RuntimeError) as error:
        module.prepare(tmp_path / "out")
    message = str(error.value)
    for words in (name, "--source", "parquet", "jsonl", "`text` column", "txt"):
        assert words in message
    assert not (tmp_path / "out").exists()
