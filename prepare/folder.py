"""
A prepared folder (data/<dataset>): its meta.json, the record of what it holds, read first by every preparation
and every run (read_meta) and written last (write_prepared, never half of a folder under its final names), one
process at a time preparing it (alone), and a full disk told in one line saying what is kept.
"""
import errno
import fcntl
import json
import os
from contextlib import contextmanager
from types import SimpleNamespace

import numpy as np

from prepare.atomic import failure_line, write_or_exit, write_text


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
        raise ValueError(f"{path} holds {type(meta).__name__}, not a JSON object: the folder is damaged; "
                         f"{redo(data_dir)}")
    return meta


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


def hold_for_reading(data_dir):
    """A shared lock on data_dir's meta.json (a read-only folder's too; no file added), held while the returned file
    is open (a run's life): a preparation that would rewrite the folder meanwhile is refused (check_not_read)."""
    f = open(os.path.join(data_dir, 'meta.json'))
    fcntl.flock(f, fcntl.LOCK_SH)
    return f


def check_not_read(data_dir):
    """SystemExit where a live run reads the prepared data_dir (hold_for_reading): preparing it again would change
    its files under that run."""
    path = os.path.join(data_dir, 'meta.json')
    if not os.path.exists(path):
        return
    with open(path) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released when f closes
        except BlockingIOError:
            raise SystemExit(f"error: {data_dir} is read by a live run, and preparing it again would change its files "
                             f"under that run; nothing was changed; wait for that run to end, or pass another "
                             f"--data_dir") from None


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
        check_not_read(data_dir)  # a live run's data is never rewritten under it
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
