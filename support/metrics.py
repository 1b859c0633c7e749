"""
The metrics log: out_dir/log.jsonl, one JSON object a line ('train' every log_interval, 'eval' every evaluation),
which a resumed run trims back to its checkpoint so that each iteration appears in it once, and which a new run in a
folder holding an earlier run writes beside it (log.jsonl.new) until its first checkpoint replaces that run's.
"""
import hashlib
import json
import os

from prepare.atomic import write_atomically, write_text


def digest(path):
    with open(path, 'rb') as f:
        return hashlib.sha256(f.read()).hexdigest()


class MetricsLog:
    """out_dir/log.jsonl, written by rank 0, and the same records to wandb where it is on. A resumed run first drops
    every record from its checkpoint's iteration on (written after that checkpoint by a run that then died, and
    about to be written again), so after any kill each iteration appears once. A run that does not resume, in a
    folder that holds an earlier run's ckpt.pt or log.jsonl, writes to log.jsonl.new (pending) and leaves the earlier
    run's files as they are: commit() renames its log onto log.jsonl once its first checkpoint has replaced ckpt.pt
    (that checkpoint records the pending log's digest, so a resume after a kill between the two renames does it),
    and discard() removes it where the run ends without one."""

    def __init__(self, out_dir, resumed_iter=None, wandb_log=False, failed=None, pending_digest=None):
        """failed(path, error): what a failed write (disk full) does, e.g. RunDir.stop_on_failed_write; None: raise
        it. pending_digest: the resumed checkpoint's record of the log it was saved beside (its log_digest)."""
        self.path, self.wandb_log, self.failed = os.path.join(out_dir, 'log.jsonl'), wandb_log, failed
        self.pending_path = self.path + '.new'
        earlier = os.path.exists(self.path) or os.path.exists(os.path.join(out_dir, 'ckpt.pt'))
        self.earlier = resumed_iter is None and earlier  # an earlier run's files, kept until this run's checkpoint
        if resumed_iter is not None and os.path.exists(self.pending_path):
            if pending_digest is not None and digest(self.pending_path) == pending_digest:
                self.guarded(os.replace, self.pending_path, self.path)  # a kill came between the two renames
            else:
                os.remove(self.pending_path)  # a run that died before its first checkpoint: nothing goes on from it
        kept_lines = []
        if resumed_iter is not None and os.path.exists(self.path):
            with open(self.path) as f:
                for line in f:
                    try:
                        if json.loads(line)['iter'] < resumed_iter:
                            kept_lines.append(line if line.endswith('\n') else line + '\n')
                    except (ValueError, KeyError, TypeError):
                        pass  # a line cut short by a kill mid-write
        self.guarded(write_atomically, self.current(), lambda tmp: write_text(tmp, ''.join(kept_lines)))

    def current(self):
        """The file records go to: log.jsonl.new while an earlier run's log.jsonl is kept, else log.jsonl."""
        return self.pending_path if self.earlier else self.path

    def guarded(self, write, *args):
        try:
            write(*args)
        except OSError as e:
            if self.failed is None:
                raise
            self.failed(self.current(), e)

    def write(self, record):
        self.guarded(self.append, json.dumps(record) + '\n')
        if self.wandb_log:
            import wandb  # train.py imported it and called wandb.init
            wandb.log(record, step=record['iter'])

    def append(self, line):
        with open(self.current(), 'a') as f:
            f.write(line)

    def pending_digest(self):
        """The digest a checkpoint records while this log is pending (None once it is log.jsonl)."""
        return digest(self.pending_path) if self.earlier else None

    def commit(self):
        """After this run's first checkpoint replaced the earlier run's ckpt.pt: its log replaces that run's too."""
        if self.earlier:
            self.guarded(os.replace, self.pending_path, self.path)
            self.earlier = False

    def discard(self):
        """At the end of a run that wrote no checkpoint: the earlier run's files stay as they are, alone."""
        if self.earlier and os.path.exists(self.pending_path):
            os.remove(self.pending_path)
