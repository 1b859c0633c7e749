"""
Where a dataset comes from: the GPT-2 tokenizer, the Hugging Face Hub (or its cache, offline), or a local copy
passed as --source; a local file is read whole, and what is wrong with it names the file, before any work.
"""
import json
import os
from contextlib import contextmanager

from prepare.folder import read_meta


def gpt2_encoding():
    """tiktoken's GPT-2 BPE, the one way every script gets it; RuntimeError saying what to do where its files are
    neither in tiktoken's cache nor downloadable (offline)."""
    import tiktoken
    try:
        return tiktoken.get_encoding('gpt2')
    except Exception as e:  # offline with nothing cached: a network error from deep inside requests
        cache = os.environ.get('TIKTOKEN_CACHE_DIR') or "tiktoken's default cache folder"
        raise RuntimeError(f"cannot load the GPT-2 tokenizer: its BPE files are not in {cache} and could not be "
                           f"downloaded ({type(e).__name__}); set TIKTOKEN_CACHE_DIR to a folder that holds them, or "
                           f"go online once") from None


def local_copy(what):
    """How to pass a local copy instead of the Hub's: train.py's key and the prepare scripts' key."""
    return f"--data_source={what} to train.py (--source={what} to a prepare/ script)"


def hub_unreachable(timeout=5):
    """Why the Hugging Face Hub (HF_ENDPOINT) cannot be reached, from one TCP connection of at most `timeout` s;
    None where it answers, and behind a proxy (only the download itself can go through one)."""
    import socket
    import urllib.parse
    import urllib.request
    from huggingface_hub.constants import ENDPOINT
    if urllib.request.getproxies():
        return None
    url = urllib.parse.urlsplit(ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or (80 if url.scheme == 'http' else 443)), timeout).close()
    except OSError as e:
        return f"{url.hostname} cannot be reached: {e}"
    return None


@contextmanager
def hub_or_cache():
    """Yields None, or why the Hub cannot be reached: then the datasets library runs offline inside, as under
    HF_HUB_OFFLINE=1 (its cache, or an error at once), instead of retrying each request for 25 s before that."""
    import datasets
    import huggingface_hub.constants as hub
    unreachable = None if hub.HF_HUB_OFFLINE else hub_unreachable()
    offline = datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE
    if unreachable:  # the flags the libraries read HF_HUB_OFFLINE into when imported
        datasets.config.HF_HUB_OFFLINE = hub.HF_HUB_OFFLINE = True
    try:
        yield unreachable
    finally:
        datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE = offline


def same_source(source, recorded):
    """Whether a source path given now is the one a meta.json records (as given then, or resolved)."""
    return str(source) == str(recorded) or os.path.realpath(source) in (str(recorded), os.path.realpath(recorded))


def check_source(data_dir, source, key):
    """ValueError where `source` (a local copy, given as --key) is not what data_dir was prepared from (its
    meta.json): a prepared folder is never prepared again, so the source would be ignored without a word."""
    meta = read_meta(data_dir)
    if not source or meta is None or meta.get('source') is None or same_source(source, meta['source']):
        return
    raise ValueError(f"{key}={source} but {data_dir} is already prepared from {meta['source']} (its meta.json): "
                     f"pass another --data_dir to prepare {source} there, delete {data_dir} to prepare it "
                     f"again from it, or drop --{key} to use what {data_dir} holds")


# -----------------------------------------------------------------------------
# a local source file (a text, a jsonl of rows), read whole: what is wrong with it names the file, before any work

def read_source_text(path, label, todo):
    """The text of the local file `path`; FileNotFoundError or ValueError `{label} <what is wrong>; {todo}` where it is
    missing, a folder, not UTF-8 text or empty. label: how the user named it (--source=PATH); todo: what to pass."""
    if os.path.isdir(path):
        raise ValueError(f"{label} is a folder, not a file; {todo}")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{label} does not exist; {todo}")
    try:
        with open(path, encoding='utf-8') as f:
            text = f.read()
    except UnicodeDecodeError as e:  # a binary file, or text in another encoding
        raise ValueError(f"{label} is not UTF-8 text (byte {e.start}: {e.reason}); {todo}") from None
    if not text.strip():  # nothing to learn from or score: refused, not read as 0 tokens
        raise ValueError(f"{label} is empty; {todo}")
    return text


def read_source_rows(path, fields, label, todo):
    """The rows (dicts) of the local jsonl `path`, each with every one of `fields`; ValueError naming the file and the
    line that is not a JSON object or lacks a field (read_source_text's errors too)."""
    rows = []
    for number, line in enumerate(read_source_text(path, label, todo).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise ValueError(f"{label}, line {number}, is not JSON ({e}); {todo}") from None
        missing = [name for name in fields if not isinstance(row, dict) or name not in row]
        if missing:
            has = f"its fields: {', '.join(list(row)[:8])}" if isinstance(row, dict) else f"a {type(row).__name__}"
            raise ValueError(f"{label}, line {number}, lacks {', '.join(missing)} ({has}); {todo}")
        rows.append(row)
    return rows


def read_documents(path, key):
    """The documents of a local text given as --key: a jsonl's `text` fields, one document each, or any other file
    as one document; ValueError naming the file where it holds no text."""
    label, todo = f"--{key}={path}", f"pass --{key}=PATH of a text file, or of a jsonl with a `text` field in each row"
    if str(path).endswith('.jsonl'):
        texts = [row['text'] for row in read_source_rows(path, ('text',), label, todo)]
    else:
        texts = [read_source_text(path, label, todo)]
    if not all(isinstance(text, str) for text in texts) or not any(text.strip() for text in texts):
        raise ValueError(f"{label} holds no text (its `text` fields are empty or not strings); {todo}")
    return texts
