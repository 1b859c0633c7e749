"""
A task generated in code (recall.py, passkey.py): what its two scripts share. Each split is made at once, as (x, y)
int16 arrays (make(n, seed)), and written as {train,val}_{x,y}.npy with meta.json last; the command line takes the
task's whole-number settings and --data_dir, and says a bad one, or a split too large for this machine, in one line.
"""
import argparse
import os

from prepare.catalog import check_dataset_dir
from prepare.folder import array_file, write_prepared
from prepare.script import script_errors, whole_number


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


def write_examples(name, data_dir, task, make, vocab_size):
    """Write {train,val}_{x,y}.npy and meta.json; return at once if data_dir holds this exact task already.
    make(n, seed): a split's (x, y), the train split from task's seed, the val split from the next one."""
    if (check_dataset_dir(name, data_dir) or {}).get('task') == task:  # a damaged or foreign folder: ValueError
        return
    files = {}
    for split, n, split_seed in (('train', task['num_train'], task['seed']),
                                 ('val', task['num_val'], task['seed'] + 1)):
        for part, arr in zip('xy', make(n, split_seed)):
            files[f'{split}_{part}.npy'] = array_file(arr)
    write_prepared(data_dir, files, dict(dataset=name, kind='examples', encoding='tokens', vocab_size=vocab_size,
                                         task=task))


def main(name, description, prepare, default_dir, **settings):
    """The task's script: --key for each of settings, a whole number where its default is one (at least 1, a seed 0
    or more), else text (passkey's --needles), and --data_dir; then prepare(data_dir, **the others), any error one
    `error:` line."""
    parser = argparse.ArgumentParser(description=description)
    for key, default in settings.items():
        number = whole_number(key, default, at_least=0 if key == 'seed' else 1) if isinstance(default, int) else None
        parser.add_argument(f'--{key}', type=number, default=default)
    parser.add_argument('--data_dir', type=os.path.expanduser, default=default_dir)
    args = vars(parser.parse_args())
    with script_errors():  # a bad setting, too many examples, a foreign data_dir, a full disk, Ctrl-C: one line
        check_examples_fit(args)
        prepare(args.pop('data_dir'), **args)
    print(f"{name} task {args} -> ok")
