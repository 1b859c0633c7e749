"""
The metrics log: out_dir/log.jsonl, one JSON object a line ('train' every log_interval, 'eval' every evaluation),
which a resumed run trims back to its checkpoint so that each iteration appears in it once.
"""
import json
import os

from support.atomic import write_atomically, write_text


class MetricsLog:
    """out_dir/log.jsonl, written by rank 0, and the same records to wandb where it is on. A resumed run first drops
    every record from its checkpoint's iteration on (written after that checkpoint by a run that then died, and
    about to be written again), so after any kill each iteration appears once."""

    def __init__(self, out_dir, resumed_iter=None, wandb_log=False, failed=None):
        """failed(path, error): what a failed write (disk full) does, e.g. RunDir.stop_on_failed_write; None: raise
        it."""
        self.path, self.wandb_log, self.failed = os.path.join(out_dir, 'log.jsonl'), wandb_log, failed
        kept_lines = []
        if resumed_iter is not None and os.path.exists(self.path):
            with open(self.path) as f:
                for line in f:
                    try:
                        if json.loads(line)['iter'] < resumed_iter:
                            kept_lines.append(line if line.endswith('\n') else line + '\n')
                    except (ValueError, KeyError, TypeError):
                        pass  # a line cut short by a kill mid-write
        self.guarded(write_atomically, self.path, lambda tmp: write_text(tmp, ''.join(kept_lines)))

    def guarded(self, write, *args):
        try:
            write(*args)
        except OSError as e:
            if self.failed is None:
                raise
            self.failed(self.path, e)

    def write(self, record):
        self.guarded(self.append, json.dumps(record) + '\n')
        if self.wandb_log:
            import wandb  # train.py imported it and called wandb.init
            wandb.log(record, step=record['iter'])

    def append(self, line):
        with open(self.path, 'a') as f:
            f.write(line)
