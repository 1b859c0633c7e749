"""
A checkpoint written atomically (prepare/atomic.py's write_atomically): a reader sees the old ckpt.pt or the new one,
never half of one, and a failed write (disk full, Ctrl-C) leaves the old one as it was.
"""
import torch

from prepare.atomic import write_atomically


def save_checkpoint(checkpoint, path):
    """Write `checkpoint` to `path` atomically (write_atomically). Through a Python file, so that a failed write
    (disk full) is an OSError behind torch's RuntimeError, which failure_line reads."""
    def write(tmp):
        with open(tmp, 'wb') as f:
            torch.save(checkpoint, f)
    write_atomically(path, write)
