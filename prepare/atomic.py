"""
Writing a file atomically: a reader sees the old file or the new one, never half of one, and a write that fails
(disk full, a missing folder, Ctrl-C) leaves nothing behind. failure_line is the one line a failed write is told in;
write_or_exit ends a script's output write in it (a prepared folder's files too: prepare.folder.write_prepared). It
sits here, at the floor of the data (it needs nothing but os), so that the prepare scripts and everything above them
(support.atomic.save_checkpoint, the scripts, the studies) write through one mechanism.
"""
import errno
import os


def write_atomically(path, write):
    """write(temporary path), then a rename onto `path`: a reader sees the old file or the new one, never half of
    one. Where writing fails (disk full, a missing folder, Ctrl-C) the temporary file is removed and the error
    raised again: nothing is left behind, and `path` is as it was."""
    tmp = f"{path}.tmp"
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_text(path, text):
    with open(path, 'w') as f:
        f.write(text)


def failure_line(path, e):
    """'cannot write PATH (why)': the OSError's words (No space left on device, File too large) where there is one,
    also where torch.save raised a RuntimeError for it."""
    cause = e
    while cause is not None and not isinstance(cause, OSError):
        cause = cause.__cause__ or cause.__context__
    if cause is not None:
        return f"cannot write {path} ({cause.strerror or cause})"
    return f"cannot write {path} ({type(e).__name__}: {(str(e).splitlines() or [''])[0][:150]})"


def write_or_exit(path, write, kept, todo):
    """write_atomically(path, write) for a script's output; where it fails (a missing folder, no permission, the disk
    full) the temporary file is gone and the script ends in one `error:` line: what failed (failure_line), what was
    kept (`kept`), what to do (`todo`; where the folder may not be written, to write elsewhere: permission_todo)."""
    try:
        write_atomically(path, write)
    except (OSError, RuntimeError) as e:
        raise SystemExit(f"error: {failure_line(path, e)}; {kept}; {permission_todo(path, e) or todo}") from None


def permission_todo(path, e):
    """What to do where `e` says the folder of `path` may not be written (no permission, a read-only file system),
    else '': space is not what it lacks."""
    while e is not None and not (isinstance(e, OSError) and e.errno in (errno.EACCES, errno.EPERM, errno.EROFS)):
        e = e.__cause__ or e.__context__
    if e is None:
        return ''
    return (f"{os.path.dirname(os.path.abspath(path))} may not be written here ({e.strerror}): make it writable, or "
            f"pass a folder you can write to")
