"""
Every dataset train.py knows, in one table: name -> (module in prepare/, kind of data, the prepare()
arguments a run's config implies). Kinds: 'text' is a uint16 token stream (train.bin, val.bin);
'examples' are fixed (x, y) pairs ({split}_x.npy, {split}_y.npy); 'image' are uint8 images and labels
stored the same way; 'pixels' read an image dataset's files (PIXELS_OF: no copy of their own) as sequences of
subpixels, one token each (data.py). Each module's prepare(data_dir,
source=None, ...) is idempotent: it returns at once when data_dir already holds what was asked.
"""
import errno
import fcntl
import importlib
import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from prepare.atomic import failure_line, write_or_exit, write_text

ROOT = Path(__file__).resolve().parents[1]  # the repository, which holds data/ and the scripts


def whole_number(key, example, at_least=0, at_most=2 ** 63 - 1):
    """An argparse type for --key: a whole number in [at_least, at_most] (1e9 reads as 10**9); anything else ends
    the script with one `error:` line naming the key, before any work."""
    def parse(text):
        try:
            number = float(text)
            value = int(text) if text.strip().lstrip('+-').isdigit() else int(number) if number.is_integer() else None
        except ValueError:  # not a number at all
            value = None
        if value is None or not at_least <= value <= at_most:
            raise SystemExit(f"error: --{key}={text} must be a whole number from {at_least} to {at_most:,}; pass e.g. "
                             f"--{key}={example}")
        return value
    return parse


def memory_bytes():
    """This machine's memory and swap (Linux's /proc/meminfo); None where it is not known."""
    try:
        with open('/proc/meminfo') as f:
            sizes = {line.split(':')[0]: int(line.split()[1]) * 1024 for line in f}
        return sizes['MemTotal'] + sizes.get('SwapTotal', 0)
    except (OSError, KeyError, ValueError, IndexError):
        return None


def check_examples_fit(args):
    """One `error:` line, before any work, where a generated task's split (num_train or num_val sequences of
    seq_len + 1 int64 tokens, made at once) would not fit this machine's memory."""
    rows, have = max(args['num_train'], args['num_val']), memory_bytes()
    need = 8 * rows * (args['seq_len'] + 1)
    if have is not None and need > have:
        raise SystemExit(f"error: num_train={args['num_train']}, num_val={args['num_val']}, seq_len={args['seq_len']}: "
                         f"a split needs at least {need / 2**30:,.1f} GiB, more than the {have / 2**30:,.1f} GiB of "
                         f"this machine; pass a smaller --num_train, --num_val or --seq_len")


def val_tokens_needed(cfg):
    """The val split a text run can evaluate on: block_size + 1 tokens for one window, and enough that each of an
    evaluation's eval_iters x batch_size rows can start at its own offset, so its batches differ."""
    return cfg['block_size'] + max(1, cfg['eval_iters'] * cfg['batch_size'])


def _token_budget(cfg):
    """What a run consumes: every training token it reads at most once, the 1% validation hold-out, and a val
    split it can evaluate on (the first documents go to val until it holds that many tokens); and a train split of
    one window at least, however small the budget (the first document, gone to val, may exceed it)."""
    tokens = (cfg['max_iters'] + 1) * cfg['gradient_accumulation_steps'] * cfg['batch_size'] * cfg['block_size']
    val = val_tokens_needed(cfg)
    return dict(max_tokens=int(tokens / 0.99) + 1 + val, min_val_tokens=val, min_train_tokens=cfg['block_size'] + 1)


def _recall_args(cfg):
    return dict(num_keys=cfg['recall_keys'], num_pairs=cfg['recall_pairs'], seq_len=cfg['block_size'])


DATASETS = {
    'shakespeare_char': ('shakespeare_char', 'text', None),
    'shakespeare': ('shakespeare', 'text', None),  # GPT-2 BPE: for fine-tuning GPT-2
    'recall': ('recall', 'examples', _recall_args),
    'passkey': ('passkey', 'examples', lambda cfg: dict(seq_len=cfg['block_size'], needles=cfg['passkey_needles'])),
    'openwebtext': ('openwebtext', 'text', _token_budget),
    'fineweb_edu': ('fineweb_edu', 'text', _token_budget),
    'cifar10': ('cifar', 'image', lambda cfg: dict(dataset='cifar10')),
    'cifar100': ('cifar', 'image', lambda cfg: dict(dataset='cifar100')),
    'cifar10_pixels': ('cifar', 'pixels', lambda cfg: dict(dataset='cifar10')),  # for the pixel model
    'mnist_pixels': ('cifar', 'pixels', lambda cfg: dict(dataset='mnist')),
}
PIXELS_OF = {'cifar10_pixels': 'cifar10', 'mnist_pixels': 'mnist'}  # pixel dataset -> the image dataset it reads


def stored_as(name):
    """The dataset whose folder (data/<it>) and meta.json hold `name`'s files: an image dataset for its pixels."""
    return PIXELS_OF.get(name, name)


def default_data_dir(name):
    """Where `name` is prepared unless data_dir says otherwise: data/<stored_as(name)> at the repo root."""
    return os.path.join(ROOT, 'data', stored_as(name))


def check_dataset_name(name):
    if name not in DATASETS:
        raise ValueError(f"unknown dataset '{name}'; valid: {', '.join(sorted(DATASETS))}")


def dataset_kind(name):
    check_dataset_name(name)
    return DATASETS[name][1]


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


def prepare_dataset(name, data_dir, source, config, **extra):
    """Prepare dataset `name` into data_dir (download, or read `source`) unless it is already there. extra: passed
    on to the module's prepare (chars=: a character dataset encoded with a base model's characters)."""
    check_dataset_name(name)
    check_source(data_dir, source, 'data_source')
    module, _, args = DATASETS[name]
    with alone(data_dir):
        importlib.import_module(f'prepare.{module}').prepare(data_dir, source=source or None,
                                                             **(args(config) if args else {}), **extra)


@contextmanager
def alone(data_dir):
    """No other process preparing data_dir meanwhile (the lab's cells side by side, each run preparing its system's
    folder): where it holds no meta.json yet, the lock file data_dir/.preparing is taken, so a second process waits
    and then finds the folder prepared. The lock file is removed before the lock is released: a process that comes
    later sees meta.json and takes no lock (a prepared folder, read-only perhaps, is never written to). A folder
    made for it and left empty (a source refused) is removed."""
    if read_meta(data_dir) is not None:
        yield
        return
    made = not os.path.exists(data_dir)
    os.makedirs(data_dir, exist_ok=True)
    path = os.path.join(data_dir, '.preparing')
    with open(path, 'a') as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when f closes
        try:
            yield
        finally:
            if os.path.exists(path):  # one that waited finds it removed by the one that prepared
                os.remove(path)
            if made and not os.listdir(data_dir):
                os.rmdir(data_dir)


# -----------------------------------------------------------------------------
# writing a prepared folder: never half of it under its final names, a failure one line saying what is kept

def write_prepared(data_dir, files, meta):
    """Write a prepared folder: a meta.json of other settings is removed first (until the new one is written the
    folder is not prepared: a run reading it stops, the next run prepares it again), then each file, {name:
    write(temporary path)}, atomically, and meta.json last. A failed write (disk full) ends the script in one
    `error:` line saying what is kept, no temporary file left (write_or_exit); Ctrl-C leaves none either."""
    os.makedirs(data_dir, exist_ok=True)
    meta_path = os.path.join(data_dir, 'meta.json')
    if os.path.exists(meta_path):
        os.remove(meta_path)
    kept = f"no temporary file is left, and {data_dir} has no meta.json: it is prepared again on the next run"
    for name, write in {**files, 'meta.json': lambda tmp: write_text(tmp, json.dumps(meta))}.items():
        write_or_exit(os.path.join(data_dir, name), write, kept,
                      "free some space (or raise the file size limit), then run it again")


def array_file(array, npy=True):
    """A write(path) of `array` for write_prepared: as .npy, or raw (a .bin of uint16 tokens). Through a Python file,
    so that a failed write is an OSError that names its cause (No space left on device, File too large)."""
    def write(path):
        with open(path, 'wb') as f:
            if npy:  # through f.write in chunks: np.save to a real file writes with C's fwrite, which drops errno
                np.save(SimpleNamespace(write=f.write), array)
            else:
                f.write(np.ascontiguousarray(array).tobytes())
    return write


def disk_full(e):
    """The OSError behind `e` (or `e` itself) where it says the disk is full (or a file size limit is reached)."""
    while e is not None and not (isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)):
        e = e.__cause__ or e.__context__
    return e


def stop_if_disk_full(e, path, kept):
    """One `error:` line where `e` is a full disk writing `path`: what failed, what is kept, to free space."""
    if disk_full(e) is not None:
        raise SystemExit(f"error: {failure_line(path, disk_full(e))}; {kept}; free some space (or raise the file "
                         f"size limit), then run it again") from None


@contextmanager
def script_errors():
    """A prepare script's own run: a bad --source or no network (OSError, RuntimeError, ValueError) is one `error:`
    line; Ctrl-C too, exit code 130 (every write is atomic, meta.json last: nothing half-written is left)."""
    try:
        yield
    except (OSError, RuntimeError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None
    except KeyboardInterrupt:
        print("error: interrupted (Ctrl-C); no temporary file is left, and meta.json (written last) says what is "
              "prepared; run it again", file=sys.stderr)
        raise SystemExit(130) from None


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


# -----------------------------------------------------------------------------
# damaged or foreign data names itself: one line each, saying how to prepare it again

def redo(data_dir):
    return f"delete {data_dir} to prepare it again, or pass --data_dir=ANOTHER_FOLDER"


def read_meta(data_dir):
    """data_dir's meta.json as a dict, None where there is none; ValueError if it cannot be read, or if data_dir (or
    the folder it would be made in) is a file: every preparation and every run reads it first."""
    folder = os.path.abspath(data_dir)
    while not os.path.exists(folder):  # the nearest that exists: data_dir, or where it would be made
        folder = os.path.dirname(folder)
    if not os.path.isdir(folder):
        where = '' if folder == os.path.abspath(data_dir) else f" would be made in {folder}, which"
        raise ValueError(f"data_dir={data_dir}{where} is a file, not a folder; pass --data_dir=DIR of a folder (made "
                         f"if missing), or leave it out")
    path = os.path.join(data_dir, 'meta.json')
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:  # ValueError: not JSON, or not UTF-8
        raise ValueError(f"{path} cannot be read ({type(e).__name__}: {e}): the folder is damaged; {redo(data_dir)}")
    if not isinstance(meta, dict):
        raise ValueError(f"{path} holds {type(meta).__name__}, not a JSON object: the folder is damaged; {redo(data_dir)}")
    return meta


def recorded_dataset(meta, name):
    """The dataset a meta.json describes: its `dataset` field, or for a folder prepared before that field existed,
    what its kind and encoding tell (GPT-2 BPE web text then passes for either web-text dataset)."""
    if 'dataset' in meta:
        return meta['dataset']
    if meta.get('kind') == 'examples':
        return 'recall'
    if meta.get('encoding') == 'chars':
        return 'shakespeare_char'
    return name if meta.get('encoding') == 'gpt2' and DATASETS[name][2] is _token_budget else meta.get('kind')


def check_dataset_dir(name, data_dir):
    """Before preparing: data_dir's meta (None if there is none); ValueError if it is damaged or holds another
    dataset than `name`."""
    meta, name = read_meta(data_dir), stored_as(name)
    if meta is not None and (theirs := recorded_dataset(meta, name)) != name:
        raise ValueError(f"{data_dir} holds the dataset {theirs!r}, not {name!r}: pass --data_dir=ANOTHER_FOLDER "
                         f"for {name} (or delete {data_dir} to prepare {name} there)")
    return meta


def check_files(name, data_dir):
    """After preparing: (meta, {split: rows}) where rows are tokens (text) or examples; ValueError naming the file
    when one is missing or its size disagrees with meta.json."""
    meta = check_dataset_dir(name, data_dir)
    if meta is None:
        raise ValueError(f"{data_dir} has no meta.json: {redo(data_dir)}")
    rows = _text_tokens if DATASETS[name][1] == 'text' else _example_rows
    return meta, {split: rows(data_dir, split, meta) for split in ('train', 'val')}


def _text_tokens(data_dir, split, meta):
    path = os.path.join(data_dir, f'{split}.bin')
    if not os.path.exists(path):
        raise ValueError(f"{path} is missing: the folder is damaged; {redo(data_dir)}")
    size, expected = os.path.getsize(path), meta.get('tokens', {}).get(split)
    if size % 2 or (expected is not None and size != 2 * expected):
        want = f"the {2 * expected:,} bytes of the {expected:,} tokens meta.json records" if expected is not None \
            else "a whole number of 2-byte tokens"
        raise ValueError(f"{path} holds {size:,} bytes, not {want}: the file is damaged; {redo(data_dir)}")
    return size // 2


def _example_rows(data_dir, split, meta):
    rows = []
    for part in 'xy':
        path = os.path.join(data_dir, f'{split}_{part}.npy')
        try:
            rows.append(len(np.load(path, mmap_mode='r')))
        except (OSError, ValueError) as e:  # missing, truncated, or not an array
            raise ValueError(f"{path} cannot be read ({type(e).__name__}: {str(e).splitlines()[0][:120]}): "
                             f"the folder is damaged; {redo(data_dir)}")
    if rows[0] != rows[1]:
        raise ValueError(f"{data_dir}: {split}_x.npy has {rows[0]:,} rows but {split}_y.npy {rows[1]:,}: "
                         f"the folder is damaged; {redo(data_dir)}")
    return rows[0]
