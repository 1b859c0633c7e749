"""Nothing is lost, and nothing changes under a run unseen: a run stopped before its first checkpoint leaves an
earlier run's files in its out_dir byte for byte; a preparation stopped by a full disk leaves no temporary file; data
rewritten at the same size, or prepared again with other settings, mid-run, stops the run; a source other than the
one a folder was prepared from is refused; a run that ends without a checkpoint says why. Each ends in one `error:`
line, the last, saying what is kept. One batch of forked runs (tests/faults.py) per class."""
import hashlib
import json
import re
import shutil

import pytest

from conftest import SHARED, iter_losses, run_forked
from prepare import recall, shakespeare_char

TINY = ['--n_layer=1', '--n_head=2', '--n_embd=32', '--batch_size=16', '--eval_iters=2', '--log_interval=1',
        '--warmup_iters=2', '--compile=False', '--device=cpu']
SIGINT = "os.kill(os.getpid(), signal.SIGINT)"


def limit_files(size):
    """Fault code: writes past `size` bytes fail (EFBIG: RLIMIT_FSIZE, as a disk that is full)."""
    return f"resource.setrlimit(resource.RLIMIT_FSIZE, ({size}, resource.RLIM_INFINITY))"


def digests(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def leftovers(folder):
    """Temporary or pending files anywhere under folder: what a stop must not leave."""
    return [p for p in folder.rglob('*') if p.name.endswith(('.tmp', '.new')) or '.tmp.' in p.name]


def assert_last_error(rc, out, pattern, code=1):
    """One `error:` line, the last, matching pattern; no traceback; the exit code."""
    last = out.strip().splitlines()[-1]
    assert rc == code and 'Traceback' not in out and last.startswith('error: '), out[-3000:]
    assert re.search(pattern, last), last
    return last


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    """A recall folder and a character folder (from input.txt), prepared once for the module."""
    d = tmp_path_factory.mktemp('data')
    (d / 'input.txt').write_text(''.join(f"line {i}: the quick brown fox jumps over the lazy dog.\n"
                                         for i in range(400)))
    (d / 'other.txt').write_text(''.join(f"row {i}: pack my box with five dozen liquor jugs.\n" for i in range(400)))
    recall.prepare(d / 'recall')
    shakespeare_char.prepare(d / 'chars', source=d / 'input.txt')
    return d


def test_a_stop_before_the_first_checkpoint_keeps_the_earlier_run(data, tmp_path):
    """A new run in an out_dir that holds an earlier run (scratch, fine-tune) stopped before its first checkpoint by
    Ctrl-C, a NaN loss or a full disk: the earlier run's ckpt.pt and log.jsonl byte for byte, no log.jsonl.new left,
    one line saying they are kept. Its first checkpoint replaces both; a kill between the two renames is completed
    by the resume."""
    common = ['train.py', *TINY, f'--data_dir={data / "recall"}', '--max_iters=4', '--eval_interval=2',
              '--lr_decay_iters=4']
    assert run_forked({'argv': [*common, f'--out_dir={tmp_path / "earlier"}']})[0][0] == 0
    stops = {'ctrl-c': (['--learning_rate=2e-3'], ['', 'clip_grad_norm_', 2, SIGINT], 130, r"interrupted \(Ctrl-C\)"),
             'fine-tune': ([f'--init_from={tmp_path / "earlier" / "ckpt.pt"}'], ['', 'clip_grad_norm_', 2, SIGINT],
                           130, r"interrupted \(Ctrl-C\)"),
             'nan': (['--learning_rate=1e6', '--eval_interval=3'], None, 1, r"(val )?loss is nan at iteration \d+"),
             'disk_full': ([], ['', 'clip_grad_norm_', 1, limit_files(10)], 1,
                           r"cannot write \S+/log.jsonl.new \(File too large\)")}
    for name in [*stops, 'saved', 'killed']:
        shutil.copytree(tmp_path / 'earlier', tmp_path / name)
    before = digests(tmp_path / 'earlier')
    new = [*common, '--learning_rate=2e-3']  # a run the earlier one's log cannot pass for
    results = run_forked(*({'argv': [*common, *args, f'--out_dir={tmp_path / name}'], 'fault': fault}
                           for name, (args, fault, _, _) in stops.items()),
                         {'argv': [*new, f'--out_dir={tmp_path / "saved"}']},
                         {'argv': [*new, f'--out_dir={tmp_path / "killed"}'], 'kill': ['save', 'commit', 1]},
                         {'argv': [*new, f'--out_dir={tmp_path / "killed"}', '--init_from=resume']})
    for (rc, out), (name, (_, _, code, what)) in zip(results, stops.items()):
        assert_last_error(rc, out, rf"^error: {what}.*this run wrote no checkpoint yet \(the earlier run's ckpt.pt "
                                   rf"and log.jsonl in {tmp_path / name} are kept as they were\)", code)
        assert digests(tmp_path / name) == before and not leftovers(tmp_path / name), name
    (rc, saved), (rc_killed, killed), (rc_resumed, resumed) = results[len(stops):]
    assert rc == 0 and rc_killed == -9 and rc_resumed == 0, (saved[-2000:], resumed[-2000:])
    for name in ('saved', 'killed'):  # the new run's records alone, each iteration once
        records = [json.loads(line) for line in (tmp_path / name / 'log.jsonl').read_text().splitlines()]
        train = {r['iter']: r['loss'] for r in records if r['type'] == 'train'}
        assert sorted(train) == list(range(5)) and not leftovers(tmp_path / name), records
        assert all(abs(loss - iter_losses(saved)[n]) < 5e-5 for n, loss in train.items()), (train, saved)
    assert min(iter_losses(resumed)) == 2  # it went on from the checkpoint the kill left


def test_a_preparation_stopped_by_a_full_disk_leaves_no_temporary_file(data, tmp_path):
    """Every preparation (each script on its own, and train.py's) stopped by a full disk or Ctrl-C: no temporary
    file left, one line naming the file and saying what is kept; a web-text folder keeps its recorded tokens under
    their final names, and goes on from them."""
    source = data / 'input.txt'
    fineweb = SHARED / 'fineweb_edu' / 'fineweb_edu_150docs.jsonl'
    runs = {'prepare/shakespeare_char.py': ([f'--source={source}'], limit_files(10_000)),
            'prepare/recall.py': (['--num_train=4000'], limit_files(50_000)),
            'prepare/passkey.py': (['--num_train=4000'], limit_files(50_000)),
            'train.py': ([*TINY, '--dataset=shakespeare_char', f'--data_source={source}',
                          f'--out_dir={tmp_path / "out"}'], limit_files(10_000)),
            'prepare/shakespeare_char.py Ctrl-C': ([f'--source={source}'], SIGINT)}
    if fineweb.exists():  # a folder with tokens recorded, then a full disk on the way to more
        runs['prepare/fineweb_edu.py'] = ([f'--source={fineweb}', '--num_proc=1'], limit_files(100_000))
        assert run_forked({'argv': ['prepare/fineweb_edu.py', f'--source={fineweb}', '--num_proc=1', '--max_tokens=2e4',
                                    f'--data_dir={tmp_path / "prepare_fineweb_edu_py"}']})[0][0] == 0
    folders = {name: tmp_path / re.sub(r'\W', '_', name) for name in runs}
    results = run_forked(*({'argv': [name.split()[0], *args, f'--data_dir={folders[name]}'],
                            'fault': ['write_prepared', 'write_or_exit', 2, code] if code == SIGINT else
                            ['', '', 0, code]} for name, (args, code) in runs.items()))
    for (rc, out), name in zip(results, runs):
        if name.endswith('Ctrl-C'):
            assert_last_error(rc, out, r"^error: interrupted \(Ctrl-C\); no temporary file is left", 130)
        elif 'fineweb' in name:
            assert_last_error(rc, out, rf"^error: cannot write {folders[name]}/train.bin \(File too large\); "
                                       rf"{folders[name]} keeps the [\d,]+ tokens its meta.json records, no "
                                       rf"temporary file left; free some space")
        else:
            assert_last_error(rc, out, rf"^error: cannot write {folders[name]}/\w+\.(bin|npy) \(.*\); no temporary "
                                       rf"file is left, and {folders[name]} has no meta.json: it is prepared again "
                                       rf"on the next run; free some space")
        assert not leftovers(folders[name]), (name, sorted(folders[name].iterdir()))
    if fineweb.exists():
        folder = folders['prepare/fineweb_edu.py']
        meta = json.loads((folder / 'meta.json').read_text())
        assert {p.name: p.stat().st_size for p in folder.glob('*.bin')} == {
            f'{split}.bin': 2 * n for split, n in meta['tokens'].items()}
        assert run_forked({'argv': ['prepare/fineweb_edu.py', f'--source={fineweb}', '--num_proc=1',
                                    f'--data_dir={folder}']})[0][0] == 0  # goes on, space back
        assert json.loads((folder / 'meta.json').read_text())['complete'] is True


def test_data_that_changes_at_the_same_size_is_caught(data, tmp_path):
    """train.bin rewritten in place at the same size (its time kept, too), meta.json rewritten, a recall split
    written again (by hand: a preparation is refused while the run reads the folder, test_prepare.py), mid-run: one
    line naming the file, the checkpoint of iteration 4 kept byte for byte. A --data_source (train.py) or --source
    (prepare/) other than the folder's own is refused, naming it."""
    tokens_reversed = ("p = '{p}'; s = os.stat(p); b = open(p, 'rb').read(); "
                       "open(p, 'r+b').write(b''.join(b[i:i + 2] for i in range(len(b) - 2, -1, -2)))")
    keep_time = "; os.utime(p, ns=(s.st_atime_ns, s.st_mtime_ns))"
    chars = ['--dataset=shakespeare_char', '--block_size=16']
    changes = {
        'rewritten': (chars, tokens_reversed, 'train.bin', r"was written again during the run, at the same size"),
        'time kept': (chars, tokens_reversed + keep_time, 'train.bin',
                      r"holds other bytes than when the run began \(rewritten in place, at the same size and time\)"),
        'meta.json': (chars, "p = '{d}/meta.json'; m = open(p).read(); open(p, 'w').write(m.replace('\"source\"', "
                             "'\"source\": 1, \"was\"'))", 'meta.json', r"was written again \(source="),
        'recall split': ([], "np = __import__('numpy'); np.save('{d}/train_x.npy', np.load('{d}/train_x.npy')[::-1])",
                         'train_x.npy', r"was written again during the run"),
    }
    runs = []
    for name, (args, code, file, _) in changes.items():
        d = tmp_path / re.sub(r'\W', '_', name)
        shutil.copytree(data / ('recall' if 'recall' in name else 'chars'), d)
        keep = f"shutil.copy('{d}-out/ckpt.pt', '{d}.before'); "
        runs.append({'argv': ['train.py', *TINY, *args, f'--data_dir={d}', f'--out_dir={d}-out', '--max_iters=8',
                              '--eval_interval=4', '--lr_decay_iters=8'],
                     'fault': ['', 'clip_grad_norm_', 7, keep + code.format(p=d / file, d=d)]})  # in iteration 6
    source_runs = [{'argv': ['train.py', *TINY, *chars, f'--data_source={data / "other.txt"}',
                             f'--data_dir={data / "chars"}', f'--out_dir={tmp_path / "never"}']},
                   {'argv': ['prepare/shakespeare_char.py', f'--source={data / "other.txt"}',
                             f'--data_dir={data / "chars"}']}]
    before = digests(data / 'chars')
    results = run_forked(*runs, *source_runs)
    for (rc, out), (name, (_, _, file, what)) in zip(results, changes.items()):
        d = tmp_path / re.sub(r'\W', '_', name)
        assert_last_error(rc, out, rf"^error: {d}/{file} {what}.*; the last good checkpoint, iteration 4, is kept in "
                                   rf"{d}-out/ckpt.pt; .*then go on with --init_from=resume$")
        assert (d.parent / f'{d.name}-out' / 'ckpt.pt').read_bytes() == (d.parent / f'{d.name}.before').read_bytes()
        assert not leftovers(d.parent / f'{d.name}-out')
    for (rc, out), key in zip(results[len(runs):], ['data_source', 'source']):
        assert_last_error(rc, out, rf"^error: {key}={data / 'other.txt'} but {data / 'chars'} is already prepared "
                                   rf"from {data / 'input.txt'} \(its meta.json\): pass another --data_dir .*, or "
                                   rf"drop --{key} to use what")
    assert digests(data / 'chars') == before and not (tmp_path / 'never').exists()  # refused before any work


def test_a_run_that_writes_no_checkpoint_says_why(data, tmp_path):
    """always_save_checkpoint=False (nanoGPT's fine-tune recipe) where the val loss never improves, and max_iters=0:
    no ckpt.pt, so the last line says so and why, naming the key, exit code 1 (max_iters=0 before any work); an
    earlier run's files stay as they were."""
    common = ['train.py', *TINY, f'--data_dir={data / "recall"}']
    assert run_forked({'argv': [*common, f'--out_dir={tmp_path / "earlier"}', '--max_iters=2',
                                '--eval_interval=2']})[0][0] == 0
    shutil.copytree(tmp_path / 'earlier', tmp_path / 'over')
    before = digests(tmp_path / 'over')
    worse = ['--always_save_checkpoint=False', '--learning_rate=3.0', '--warmup_iters=0', '--max_iters=4',
             '--eval_interval=2']
    (rc, out), (rc2, out2), (rc3, out3) = run_forked(
        {'argv': [*common, *worse, f'--out_dir={tmp_path / "worse"}']},
        {'argv': [*common, *worse, f'--init_from={tmp_path / "earlier" / "ckpt.pt"}', f'--out_dir={tmp_path / "over"}']},
        {'argv': [*common, '--max_iters=0', f'--out_dir={tmp_path / "none"}']})
    never = r"the val loss never went below [\d.]+, iteration 0's, and always_save_checkpoint=False writes a " \
            r"checkpoint only when it does, so this run wrote no checkpoint"
    assert_last_error(rc, out, rf"^error: {never}; pass --always_save_checkpoint=True to keep the trained model")
    assert_last_error(rc2, out2, rf"^error: {never} \(the earlier run's ckpt.pt and log.jsonl in {tmp_path / 'over'} "
                                 rf"are kept as they were\); pass --always_save_checkpoint=True")
    assert_last_error(rc3, out3, r"^error: max_iters=0 trains no iteration, so the run would write no checkpoint; "
                                 r"pass --max_iters=1 or more$")
    assert not (tmp_path / 'none').exists()  # refused before any work
    assert not (tmp_path / 'worse' / 'ckpt.pt').exists() and (tmp_path / 'worse' / 'log.jsonl').exists()
    assert digests(tmp_path / 'over') == before and not leftovers(tmp_path / 'over')
