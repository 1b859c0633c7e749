"""One loader (support.loading.load_run) from a checkpoint to (model, config, meta, data folder), used by every
script: the same checkpoint read by each script's path gives the same logits, LoRA included; an old checkpoint with no
data_dir recorded reads as it was meant, one with a key the model no longer has (krause_mix) is one error line;
analyze.py reads a pixel model's data through the one reader (support.data.Batches); the scripts given only
--out_dir run from the repo root."""
import json
import re
import sys
from dataclasses import asdict

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import ROOT, run_forked
from model import GPT, GPTConfig
from prepare import check_files, default_data_dir
from support.loading import load_checkpoint, load_run
from support.data import Batches

@pytest.fixture(scope='module')
def runs(trained_runs):
    """conftest's trained runs: a character GPT (base), a LoRA fine-tune of it (lora) and its merged export
    (lora/merged.pt), a pixel GPT on 4x4 CIFAR-like images (pixels). The folder and {name: (exit code, output)}."""
    d, results = trained_runs
    assert all(rc == 0 for rc, _ in results.values()), {k: out[-2000:] for k, (rc, out) in results.items() if rc}
    return d, results


def reference(path):
    """The checkpoint's GPT built by hand from its dict, LoRA unmerged: what every path must compute."""
    checkpoint = torch.load(path, weights_only=True)
    model = GPT(GPTConfig(**checkpoint['model_args']))
    model.load_state_dict(checkpoint['model'])
    return model.eval()


def logits(model, idx):
    with torch.no_grad():
        return model(idx, idx)[0]  # with targets: the logits of every position


def copy_with(path, to, **config):
    """The checkpoint at `path` written to `to` with config keys changed (an older train.py's checkpoint)."""
    checkpoint = torch.load(path, weights_only=True)
    checkpoint['config'].update(config)
    to.parent.mkdir(parents=True, exist_ok=True)
    torch.save(checkpoint, to)
    return to


@pytest.mark.parametrize('name', ['base', 'lora'])
def test_every_script_loads_the_same_function(runs, name, monkeypatch):
    """sample.py (resume, and the checkpoint as a base), analyze.py, harness.py, cluster_swap.py's swap, pretrained.py's
    base and merge_lora.py's export: each one's model gives the logits of the checkpoint built by hand."""
    d, _ = runs
    out_dir, ckpt = d / name, d / name / 'ckpt.pt'
    monkeypatch.setattr(sys, 'argv', ['sample.py'])  # sample.py reads its command line on import
    import sample
    from studies import analyze, cluster_swap, harness
    from support.pretrained import load_base
    idx = torch.randint(0, 30, (3, 32), generator=torch.Generator().manual_seed(0))
    want = logits(reference(ckpt).double(), idx)  # float64: what remains is the merge's one float32 rounding
    monkeypatch.setattr(sample, 'out_dir', str(out_dir))
    monkeypatch.setattr(harness, 'device', 'cpu')
    bpe = copy_with(ckpt, d / f'{name}-bpe' / 'ckpt.pt')  # the harness takes only GPT-2 BPE models: meta says so
    checkpoint = torch.load(bpe, weights_only=True)
    torch.save({**checkpoint, 'meta': {**checkpoint['meta'], 'encoding': 'gpt2'}}, bpe)
    base = load_base(str(ckpt))
    from_base = GPT(GPTConfig(**base['model_args']))
    from_base.load_state_dict(base['state'])
    models = {'load_run(out_dir)': load_run(str(out_dir)).model, 'load_run(ckpt.pt)': load_run(str(ckpt)).model,
              'sample.py resume': sample.load_gpt('resume', 'cpu')[0],
              'sample.py base': sample.load_gpt(str(ckpt), 'cpu')[0],
              'analyze.py': analyze.open_run(str(out_dir)).model,
              'harness.py': harness.load_bpe_run(str(bpe.parent)).model,
              'cluster_swap.py': cluster_swap.swapped_in(load_run(str(out_dir)).model),
              'pretrained.py base': from_base.eval()}
    if name == 'lora':
        models['merge_lora.py export'] = load_run(str(d / 'lora' / 'merged.pt')).model
        assert (want - logits(reference(d / 'base' / 'ckpt.pt'), idx)).abs().max() > 1e-3  # LoRA trained: it counts
        assert reference(ckpt).config.lora_rank == 2
    for path, model in models.items():
        assert not model.training and model.config.lora_rank == 0, path  # eval mode, LoRA merged
        torch.testing.assert_close(logits(model.double(), idx), want, atol=1e-5, rtol=0, msg=path)


def test_the_data_folder_is_the_recorded_one_else_the_datasets_default(runs):
    """A checkpoint of an older train.py recorded data_dir='' when none was typed: its data is the dataset's default
    folder, data/<stored_as(dataset)> at the repo root (a pixel dataset's is its image dataset's), never the current
    directory. analyze.py and extrapolate.py look there, from the repo root, and say so when it is not prepared."""
    d, _ = runs
    assert load_run(str(d / 'base')).data_dir == str(d / 'chars')
    assert load_run(str(d / 'pixels')).data_dir == str(d / 'cifar10')
    old_text = copy_with(d / 'base' / 'ckpt.pt', d / 'old-text' / 'ckpt.pt', data_dir='')
    old_pixels = copy_with(d / 'pixels' / 'ckpt.pt', d / 'old-pixels' / 'ckpt.pt', data_dir='')
    assert load_run(str(old_text)).data_dir == default_data_dir('shakespeare_char') == str(ROOT / 'data' /
                                                                                          'shakespeare_char')
    assert load_run(str(old_pixels.parent)).data_dir == str(ROOT / 'data' / 'cifar10')
    folder = ROOT / 'data' / 'shakespeare_char'
    if folder.exists():
        pytest.skip(f"{folder} is prepared in this checkout: the scripts would read it")
    (rc_a, out_a), (rc_e, out_e) = run_forked(
        {'argv': ['studies/analyze.py', f'--out_dir={old_text.parent}', f'--json_path={d / "old.json"}']},
        {'argv': ['studies/extrapolate.py', f'--out_dir={old_text.parent}']})
    assert rc_a == 1 and f"error: {old_text.parent}: {folder} has no meta.json" in out_a, out_a[-2000:]
    assert rc_e == 1 and 'Traceback' not in out_e and f"error: {folder} has no meta.json" in out_e, out_e[-2000:]


def test_scripts_given_only_out_dir_run_from_the_repo_root(runs):
    """analyze.py, extrapolate.py and sample.py with nothing but --out_dir (the data: the one the run recorded), on a
    text and on a pixel model; extrapolate's 1x loss and cluster_swap's softmax row are the loss of the checkpoint
    built by hand on the same windows, and cluster_swap's (train.py's evaluation batches) repeats train.py's last."""
    d, trained = runs
    names = ['analyze text', 'analyze pixels', 'extrapolate', 'sample text', 'sample pixels', 'cluster_swap']
    results = dict(zip(names, run_forked(
        {'argv': ['studies/analyze.py', f'--out_dir={d / "lora"}']},
        {'argv': ['studies/analyze.py', f'--out_dir={d / "pixels"}']},
        {'argv': ['studies/extrapolate.py', f'--out_dir={d / "lora"}']},
        {'argv': ['sample.py', f'--out_dir={d / "lora"}', '--num_samples=1', '--max_new_tokens=10']},
        {'argv': ['sample.py', f'--out_dir={d / "pixels"}']},
        {'argv': ['studies/cluster_swap.py', f'--out_dir={d / "base"}', '--eval_iters=1', '--cluster_ms=4',
                  '--kmeans_batches=2', '--kmeans_iters=2']})))
    for name, (rc, out) in results.items():
        assert rc == 0 and 'Traceback' not in out and 'error:' not in out, (name, out[-3000:])
    for run, T in (('lora', 32), ('pixels', 47)):
        analysis = json.loads((d / run / 'analysis.json').read_text())
        assert analysis['errors'] == [] and [(e['iter'], e['T']) for e in analysis['checkpoints']] == [(4 if run ==
                                                                                                        'lora' else 1, T)]
    # extrapolate: num_tokens // 32 windows at the starts its seed draws, scored by the hand-built model
    model, val = reference(d / 'lora' / 'ckpt.pt'), np.fromfile(d / 'chars' / 'val.bin', dtype=np.uint16)
    starts = np.random.default_rng(1337).integers(0, len(val) - 33, size=65536 // 32)
    xy = torch.stack([torch.from_numpy(val[s:s + 33].astype(np.int64)) for s in starts])
    with torch.no_grad():
        want = F.cross_entropy(model(xy[:, :-1], xy[:, 1:])[0].transpose(1, 2), xy[:, 1:])
    got = re.search(r"1x T=32 +val loss ([\d.]+)", results['extrapolate'][1])
    assert got and float(got.group(1)) == pytest.approx(want.item(), abs=1e-4), results['extrapolate'][1]
    assert re.search(r"2x T=64 +val loss n/a \(learned positions\)", results['extrapolate'][1])
    # cluster_swap: the softmax row is train.py's last evaluation (eval_iters=1, the run's seed and batch size)
    last = re.findall(r"^step 4: train loss [\d.]+, val loss ([\d.]+)", trained['base'][1], re.M)
    assert last and f"softmax val loss {last[-1]} (1 batches)" in results['cluster_swap'][1], results['cluster_swap']
    assert '10 images of 48 subpixels (drawn, batch 16' in results['sample pixels'][1]
    assert (d / 'pixels' / 'samples.png').exists()


def test_analyze_reads_a_pixel_model_through_the_data_reader(runs):
    """analyze.py's batch is support.data.Batches's: token sequences a GPT takes (not (B, H, W, C) images), the rows
    train.py's evaluation draws first (a generator seeded seed + 1)."""
    from studies import analyze
    d, _ = runs
    run = analyze.open_run(str(d / 'pixels'))
    x = analyze.val_batch(run.config, run.data_dir, run.model.config.block_size)
    meta, rows = check_files('cifar10_pixels', str(d / 'cifar10'))
    batches = Batches('cifar10_pixels', str(d / 'cifar10'), meta, rows, 47, analyze.batch_size, 'cpu')
    ix = torch.randint(batches.sizes['val'], (2, analyze.batch_size), generator=torch.Generator().manual_seed(1338))
    assert x.shape == (analyze.batch_size, 47) and x.dtype == torch.long
    assert torch.equal(x, batches.load_batch('val', ix[0])[0])
    layers, maps = analyze.analyse(run.model, x)
    assert layers[0]['T'] == 47 and maps[0].shape == (analyze.batch_size, 2, 47, 47)


@pytest.mark.parametrize('old', [dict(krause_mix=True), dict(cluster_block=8, tda_chunk=99)])
def test_a_checkpoint_with_a_key_the_model_no_longer_has_is_one_error_line(tmp_path, monkeypatch, old):
    """A checkpoint of an older version (krause_mix, mix's Krause-only spelling; cluster_block and tda_chunk, which
    cluster_chunk and tda_chunk_weights, now tile_weights, replaced) is one `error:` line naming those keys and what to do, from
    load_checkpoint and so from every script's load_run, before a model is built; without them it loads as saved."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=12, vocab_size=7, attention='krause', mix=True,
                          krause_window=4, krause_topk=2)).eval()
    saved = {'model': model.state_dict(), 'model_args': asdict(model.config), 'iter_num': 3,
             'config': {'dataset': 'recall', 'data_dir': ''}, 'meta': {'kind': 'examples'}}
    torch.save(saved, tmp_path / 'ckpt.pt')
    run, idx = load_run(str(tmp_path)), torch.randint(0, 7, (2, 12), generator=torch.Generator().manual_seed(1))
    assert run.iter_num == 3 and run.data_dir == default_data_dir('recall')  # '': an older train.py's no data_dir
    assert torch.equal(logits(run.model, idx), logits(model, idx))
    torch.save({**saved, 'model_args': {**saved['model_args'], **old}}, tmp_path / 'ckpt.pt')
    before = (tmp_path / 'ckpt.pt').read_bytes()

    def built(config):
        raise AssertionError(f"a model was built from a checkpoint with {old}")
    monkeypatch.setattr('support.loading.GPT', built)
    line = (f"error: {tmp_path / 'ckpt.pt'} was written by an older version, with model key(s) {', '.join(sorted(old))}"
            f" that the model no longer has; retrain it, or rename the key(s) in its model_args to today's (python "
            f"train.py --help lists them)")
    for load in (lambda: load_checkpoint(str(tmp_path / 'ckpt.pt'), 'cpu'), lambda: load_run(str(tmp_path))):
        with pytest.raises(SystemExit) as stop:
            load()
        assert stop.value.code == line
    assert (tmp_path / 'ckpt.pt').read_bytes() == before
