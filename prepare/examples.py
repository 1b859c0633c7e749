"""
A task generated in code (recall.py, passkey.py): each split is made at once, so its script says, before any work,
a split too large for this machine's memory.
"""


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
