"""prepare/shakespeare_char.py, prepare/shakespeare.py and prepare/recall.py on local data, every prepare script on a
bad --source; sample.py on a fresh checkpoint."""
import json
import os
import urllib.request

import numpy as np
import pytest

from conftest import SHARED, needs_shared, run_script
from prepare import recall, shakespeare, shakespeare_char


def prepared(folder):
    """(meta, train tokens, val tokens) of a prepared text folder."""
    return (json.load(open(folder / 'meta.json')), np.fromfile(folder / 'train.bin', dtype=np.uint16),
            np.fromfile(folder / 'val.bin', dtype=np.uint16))


@needs_shared
def test_shakespeare_char_matches_nanogpt(tmp_path):
    shakespeare_char.prepare(tmp_path, source=SHARED / 'tinyshakespeare' / 'input.txt')
    meta, train, val = prepared(tmp_path)
    # nanoGPT's data/shakespeare_char/prepare.py prints these three numbers
    assert (meta['vocab_size'], len(train), len(val)) == (65, 1_003_854, 111_540)
    text = (SHARED / 'tinyshakespeare' / 'input.txt').read_text()
    assert ''.join(meta['itos'][i] for i in train[:100]) == text[:100]
    assert not list(tmp_path.glob('*.tmp'))


@needs_shared
def test_shakespeare_bpe_matches_nanogpt(tmp_path):
    shakespeare.prepare(tmp_path, source=SHARED / 'tinyshakespeare' / 'input.txt')
    meta, train, val = prepared(tmp_path)
    # nanoGPT's data/shakespeare/prepare.py prints these two numbers
    assert (meta['encoding'], len(train), len(val)) == ('gpt2', 301_966, 36_059)
    assert meta['tokens'] == {'train': 301_966, 'val': 36_059}
    import tiktoken
    text = (SHARED / 'tinyshakespeare' / 'input.txt').read_text()
    assert tiktoken.get_encoding('gpt2').decode(val.tolist()) == text[int(0.9 * len(text)):]
    assert not list(tmp_path.glob('*.tmp'))


def test_a_character_text_in_a_base_models_characters(tmp_path):
    """A fine-tune's text is encoded with its base's characters, in their order; a character the base never saw
    is one error."""
    (tmp_path / 'a.txt').write_text('abba cab\n' * 50)
    shakespeare_char.prepare(tmp_path / 'x', source=tmp_path / 'a.txt', chars=['\n', ' ', 'a', 'b', 'c', 'd'])
    meta = json.load(open(tmp_path / 'x' / 'meta.json'))
    assert meta['itos'] == ['\n', ' ', 'a', 'b', 'c', 'd'] and meta['vocab_size'] == 6
    assert np.fromfile(tmp_path / 'x' / 'train.bin', dtype=np.uint16)[:5].tolist() == [2, 3, 3, 2, 1]
    with pytest.raises(ValueError, match=r"1 character\(s\) the base model does not know: 'c'"):
        shakespeare_char.prepare(tmp_path / 'y', source=tmp_path / 'a.txt', chars=['\n', ' ', 'a', 'b'])


def test_shakespeare_char_offline_says_how_to_pass_source(tmp_path, monkeypatch):
    def no_network(*args, **kwargs):
        raise OSError('network is unreachable')
    monkeypatch.setattr(urllib.request, 'urlopen', no_network)
    with pytest.raises(RuntimeError, match='--source=PATH'):
        shakespeare_char.prepare(tmp_path / 'data')
    assert not (tmp_path / 'data').exists()  # nothing half-made


def test_recall_answers_are_the_paired_values():
    x, y = recall.make_examples(500, num_keys=16, num_pairs=4, seq_len=32, seed=3)
    assert x.shape == y.shape == (500, 32)
    assert (y != -1).sum(1).tolist() == [12] * 500  # one answer after every query key
    for xs, ys in zip(x, y):
        pairs = dict(zip(xs[0:8:2].tolist(), xs[1:8:2].tolist()))
        assert len(pairs) == 4 and all(k < 16 <= v < 32 for k, v in pairs.items())
        for t in np.flatnonzero(ys != -1):
            assert ys[t] == pairs[xs[t]]
            if t + 1 < 32:
                assert xs[t + 1] == ys[t]  # the answer is the next input token


def test_recall_prepare_is_idempotent_and_regenerates_on_a_new_task(tmp_path):
    recall.prepare(tmp_path, num_train=100, num_val=10)
    first = (tmp_path / 'train_x.npy').stat().st_mtime_ns
    recall.prepare(tmp_path, num_train=100, num_val=10)
    assert (tmp_path / 'train_x.npy').stat().st_mtime_ns == first
    recall.prepare(tmp_path, num_train=100, num_val=10, num_pairs=3)
    assert json.load(open(tmp_path / 'meta.json'))['task']['num_pairs'] == 3
    with pytest.raises(ValueError, match='num_pairs'):
        recall.prepare(tmp_path, num_pairs=20)


def test_sample_from_a_checkpoint(tmp_path):
    data = tmp_path / 'data'
    run_script('train.py', f'--data_dir={data}', f'--out_dir={tmp_path}', '--max_iters=2', '--eval_interval=2',
               '--eval_iters=1', '--batch_size=8', '--n_layer=1', '--device=cpu')
    out = run_script('sample.py', f'--out_dir={tmp_path}', '--start=1 17 2 20', '--num_samples=2',
                     '--max_new_tokens=5', '--device=cpu')
    samples = [line.split() for line in out.splitlines() if line.startswith('1 17 2 20')]
    assert len(samples) == 2 and all(len(s) == 9 and all(0 <= int(t) < 32 for t in s) for s in samples)
    log = run_script('sample.py', f'--out_dir={tmp_path / "missing"}', check=False)
    assert 'no checkpoint at' in log and 'Traceback' not in log


@pytest.mark.parametrize('script', ['shakespeare_char', 'shakespeare', 'openwebtext', 'fineweb_edu', 'cifar'])
def test_scripts_say_a_bad_source_in_one_line(script, tmp_path):
    log = run_script(f'prepare/{script}.py', f'--source={tmp_path / "nope"}', f'--data_dir={tmp_path / "out"}',
                     check=False)
    assert log.startswith('error: ') and 'nope' in log and 'Traceback' not in log, log[-2000:]
    assert not (tmp_path / 'out').exists() or not any((tmp_path / 'out').iterdir())  # nothing half-written


def test_a_folder_that_may_not_be_written_says_so_not_to_free_space(tmp_path):
    """A write refused for permission (a read-only data folder or Hub folder) names the folder and says to write
    elsewhere; a full disk still says to free space. (As root, permissions are not enforced: the error is raised.)"""
    import errno
    from prepare.atomic import write_or_exit

    def refused(code):
        def write(path):
            raise OSError(code, os.strerror(code), path)
        return write
    for code, said in ((errno.EPERM, f"{tmp_path} may not be written here (Operation not permitted): make it "
                                     f"writable, or pass a folder you can write to"),
                       (errno.EROFS, "may not be written here (Read-only file system)"),
                       (errno.ENOSPC, "free some space")):
        with pytest.raises(SystemExit) as e:
            write_or_exit(str(tmp_path / 'meta.json'), refused(code), 'nothing is kept', 'free some space')
        assert str(e.value).startswith(f"error: cannot write {tmp_path / 'meta.json'} (") and said in str(e.value)
        assert ('free some space' in str(e.value)) == (code == errno.ENOSPC)
    assert list(tmp_path.iterdir()) == []


def test_a_folder_a_live_run_reads_is_not_prepared_again_under_it(tmp_path):
    """train.py's reader holds data_dir/.reading shared; preparing the folder again with other settings meanwhile is
    one line and changes nothing; once the run has ended it goes ahead."""
    from prepare.folder import hold_for_reading
    recall.prepare(str(tmp_path), num_keys=8, num_pairs=2, seq_len=16, num_train=64, num_val=16)
    reading = hold_for_reading(str(tmp_path))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    with pytest.raises(SystemExit, match=rf"^error: {tmp_path} is read by a live run, and preparing it again would "
                                         r"change its files under that run; nothing was changed"):
        recall.prepare(str(tmp_path), num_keys=6, num_pairs=2, seq_len=16, num_train=64, num_val=16)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before
    reading.close()  # the run ended
    recall.prepare(str(tmp_path), num_keys=6, num_pairs=2, seq_len=16, num_train=64, num_val=16)
    assert json.loads((tmp_path / 'meta.json').read_text())['task']['num_keys'] == 6
