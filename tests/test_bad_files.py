"""Bad files, options for another kind of model, and the last tracebacks: each is one `error:` line, last, naming the
file or key and what to do, before any work (no data prepared, nothing written), with every file given left
byte-identical. Checkpoints are made in this process (no training); every run is forked (tests/faults.py)."""
import hashlib
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, checkpoint, run_forked
from model import GPT, GPTConfig
from vit import ViT, ViTConfig


@pytest.fixture(scope='module')
def d(tmp_path_factory):
    """A folder of runs and files: a character GPT on its prepared data (chars, text), a pixel GPT (pixels), a ViT
    (vit), ckpt.pt files that are not train.py checkpoints, Hub-layout folders with a damaged config.json, a damaged
    meta.json, a binary config file, and sources with no text or too little."""
    from prepare.shakespeare_char import prepare
    from safetensors.torch import save_file
    d = tmp_path_factory.mktemp('bad')
    (d / 'input.txt').write_text('the quick brown fox jumps over the lazy dog.\n' * 40)
    prepare(str(d / 'chars'), str(d / 'input.txt'))
    meta = json.loads((d / 'chars' / 'meta.json').read_text())
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=meta['vocab_size']))
    text = checkpoint(gpt, 'shakespeare_char', {**meta, 'data_dir': str(d / 'chars')})
    pixels = checkpoint(GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=47, vocab_size=256)),
                        'cifar10_pixels', {'kind': 'image', 'dataset': 'cifar10'})
    vit = checkpoint(ViT(ViTConfig(n_layer=1, n_head=2, n_embd=16, patch_size=8, num_classes=10)), 'cifar10',
                     {'kind': 'image', 'dataset': 'cifar10'})
    for name, obj in {'text': text, 'pixels': pixels, 'vit': vit, 'alist': [1, 2, 3],
                      'nomodelargs': {'model': text['model'], 'iter_num': 1},
                      'argsstr': {**text, 'model_args': {**text['model_args'], 'n_embd': 'wide'}},
                      'export': {k: text[k] for k in ('model', 'model_args', 'config', 'meta')}}.items():
        (d / name).mkdir()
        torch.save(obj, d / name / 'ckpt.pt')
    gpt2 = dict(model_type='gpt2', n_embd=8, n_layer=1, n_head=2, n_positions=16, vocab_size=50257)
    for name, cfg in (('hub_missing', {k: v for k, v in gpt2.items() if k != 'n_embd'}),
                      ('hub_str', {**gpt2, 'n_layer': 'one'})):
        (d / name).mkdir()
        save_file({'wte.weight': torch.zeros(1)}, d / name / 'model.safetensors')
        (d / name / 'config.json').write_text(json.dumps(cfg))
    (d / 'damaged').mkdir()
    (d / 'damaged' / 'meta.json').write_text('{"dataset": "recall", ')
    (d / 'binary.py').write_bytes(b'\xff\xfe\x00\x01\x89PNG\r\n')
    (d / 'empty.txt').write_text('\n\n')
    (d / 'one.txt').write_text('a')
    return d


def digests(folder):
    """{path: sha256} of every file under folder: what must be byte-identical after a refused run."""
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob('*')) if p.is_file()}


def assert_one_error_line(rc, out, *names):
    """Exit 1, no traceback, the last line `error: ...` naming every one of names."""
    last = out.strip().splitlines()[-1] if out.strip() else ''
    assert rc == 1 and 'Traceback' not in out, out[-3000:]
    assert last.startswith('error: ') and all(str(n) in last for n in names), (names, last)


def run_cases(d, cases, env=None):
    """Fork every case ((argv, names the last line must hold, a folder that must not be made)); assert each is one
    error line naming them, that folder absent, and every file under d byte-identical."""
    before = digests(d)
    results = run_forked(*({'argv': argv, 'env': env or {}} for argv, _, _ in cases))
    for (argv, names, unmade), (rc, out) in zip(cases, results):
        assert_one_error_line(rc, out, *names)
        assert unmade is None or not os.path.exists(unmade), (argv, os.listdir(unmade))
    assert digests(d) == before  # nothing written or changed, no temporary file left
    return results


TINY = ['--n_layer=1', '--n_head=2', '--n_embd=16', '--block_size=8', '--batch_size=2', '--eval_iters=1',
        '--device=cpu', '--compile=False', '--warmup_iters=1', '--lr_decay_iters=4', '--max_iters=2']


def test_a_file_that_is_not_what_it_claims_is_one_line_naming_it(d):
    """A ckpt.pt of another object, without model_args, with a model_args value of the wrong type, or without the
    training state a resume needs (train.py resume and fine-tune, merge_lora.py, sample.py, cluster_swap.py); a
    Hub-layout config.json missing a size or with a string for one; a damaged meta.json to a standalone prepare; a
    config file that is not text; a source with no text, or too little for both splits."""
    chars = [*TINY, '--dataset=shakespeare_char', f'--data_source={d / "input.txt"}']
    cases = [
        (['train.py', *chars, f'--data_dir={d}/new1', f'--out_dir={d / "alist"}', '--init_from=resume'],
         [d / 'alist' / 'ckpt.pt', 'not a train.py checkpoint'], f'{d}/new1'),
        (['train.py', *chars, f'--data_dir={d}/new2', f'--out_dir={d / "nomodelargs"}', '--init_from=resume'],
         [d / 'nomodelargs' / 'ckpt.pt', 'model_args'], f'{d}/new2'),
        (['train.py', *chars, f'--data_dir={d}/new3', f'--out_dir={d / "export"}', '--init_from=resume'],
         [d / 'export' / 'ckpt.pt', 'no optimizer', '--init_from='], f'{d}/new3'),
        (['train.py', *chars, f'--data_dir={d}/new4', f'--out_dir={d}/out4', f'--init_from={d / "argsstr/ckpt.pt"}',
          '--lora_rank=2'], [d / 'argsstr' / 'ckpt.pt', "n_embd='wide' is not a whole number"], f'{d}/new4'),
        (['studies/merge_lora.py', f'--ckpt={d / "alist/ckpt.pt"}', f'--out={d}/merged.pt'],
         [d / 'alist' / 'ckpt.pt', '--ckpt='], f'{d}/merged.pt'),
        (['sample.py', f'--out_dir={d / "argsstr"}', '--device=cpu'], [d / 'argsstr' / 'ckpt.pt', 'n_embd'], None),
        (['studies/cluster_swap.py', f'--out_dir={d / "nomodelargs"}'], [d / 'nomodelargs' / 'ckpt.pt'], None),
        (['train.py', *TINY, '--dataset=shakespeare', f'--data_source={d / "input.txt"}', f'--data_dir={d}/new5',
          f'--out_dir={d}/out5', f'--init_from={d / "hub_missing"}'],
         [d / 'hub_missing' / 'config.json', 'lacks n_embd'], f'{d}/new5'),
        (['sample.py', f'--init_from={d / "hub_str"}', '--device=cpu'],
         [d / 'hub_str' / 'config.json', "n_layer='one'"], None),
        (['prepare/recall.py', f'--data_dir={d / "damaged"}'], [d / 'damaged' / 'meta.json', 'delete'], None),
        (['prepare/shakespeare_char.py', f'--data_dir={d / "damaged"}'], [d / 'damaged' / 'meta.json'], None),
        (['train.py', str(d / 'binary.py')], [d / 'binary.py', 'not UTF-8 text'], None),
        (['prepare/shakespeare_char.py', f'--source={d / "empty.txt"}', f'--data_dir={d}/new6'],
         [f'--source={d / "empty.txt"} is empty'], f'{d}/new6'),
        (['train.py', *TINY, '--dataset=shakespeare_char', f'--data_source={d / "one.txt"}', f'--data_dir={d}/new7',
          f'--out_dir={d}/out7'], [d / 'one.txt', 'too short', '--data_source='], f'{d}/new7'),
    ]
    run_cases(d, cases)


def test_an_option_for_another_kind_of_model_is_refused_naming_it(d):
    """sample.py's pixel keys on a text model and text keys on a pixel model are refused before any sampling, not
    ignored; analyze.py given several out_dirs, one of them unreadable, names it before analysing any and writes no
    JSON."""
    cases = [
        (['sample.py', f'--out_dir={d / "text"}', '--device=cpu', '--complete=True'],
         ['complete=True', d / 'text', 'text model', 'drop --complete'], None),
        (['sample.py', f'--out_dir={d / "text"}', '--device=cpu', f'--png={d}/grid.png'],
         ['png=', 'drop --png'], f'{d}/grid.png'),
        (['sample.py', f'--out_dir={d / "pixels"}', '--device=cpu', '--start=hello', f'--png={d}/p.png'],
         ["start='hello'", 'pixel model', 'drop --start'], f'{d}/p.png'),
        (['studies/analyze.py', f'--out_dir={d / "text"},{d / "missing"}', f'--json_path={d}/a.json'],
         [f'{d / "missing"} (said why above) cannot be analysed', 'drop it from --out_dir'], f'{d}/a.json'),
    ]
    results = run_cases(d, cases)
    assert '== ' not in results[-1][1]  # no table: nothing was analysed


def test_the_last_tracebacks_are_one_line_each(d):
    """prepare/passkey.py and recall.py's own settings; wandb_log=True without wandb; the GPT-2 tokenizer offline with
    nothing cached; cluster_swap.py on a ViT; a character base fine-tuned on a dataset of other tokens (before any
    data is prepared); train.py --help into a pipe closed after one line."""
    cases = [
        (['prepare/passkey.py', '--seq_len=3', f'--data_dir={d}/pk'], ['seq_len=3', '--seq_len=11'], f'{d}/pk'),
        (['prepare/passkey.py', '--needles=x', f'--data_dir={d}/pk'], ["needles='x'"], f'{d}/pk'),
        (['prepare/recall.py', '--num_pairs=20', f'--data_dir={d}/rc'], ['num_pairs=20', '--num_pairs'], f'{d}/rc'),
        (['prepare/recall.py', '--num_val=-1', f'--data_dir={d}/rc'], ['num_val=-1', '--num_val=2000'], f'{d}/rc'),
        (['studies/cluster_swap.py', f'--out_dir={d / "vit"}'], [d / 'vit', 'ViT', '--out_dir='], None),
        (['train.py', *TINY, '--dataset=recall', '--recall_pairs=2', f'--data_dir={d}/rc', f'--out_dir={d}/o1',
          f'--init_from={d / "text/ckpt.pt"}', '--lora_rank=2'], ['dataset=recall', 'character', '--dataset='], f'{d}/rc'),
        (['prepare/shakespeare.py', f'--source={d / "input.txt"}', f'--data_dir={d}/bpe'],
         ['GPT-2 tokenizer', 'TIKTOKEN_CACHE_DIR'], f'{d}/bpe'),
    ]
    if importlib.util.find_spec('wandb') is None:
        cases.append((['train.py', *TINY, '--dataset=shakespeare_char', f'--data_source={d / "input.txt"}',
                       f'--data_dir={d}/w', f'--out_dir={d}/ow', '--wandb_log=True'],
                      ['wandb_log=True', 'pip install wandb'], f'{d}/w'))
    (d / 'no_cache').mkdir()
    offline = {'TIKTOKEN_CACHE_DIR': str(d / 'no_cache'), 'HTTPS_PROXY': 'http://127.0.0.1:9',
               'https_proxy': 'http://127.0.0.1:9'}
    try:
        run_cases(d, cases, env=offline)  # the tokenizer is the only one of these that reads the network
    finally:
        (d / 'no_cache').rmdir()
    help_into_head = subprocess.run(f"{sys.executable} train.py --help | head -1", shell=True, cwd=ROOT,
                                    capture_output=True, text=True, env={**os.environ, 'OMP_NUM_THREADS': '1'})
    assert help_into_head.stdout.startswith('usage: python train.py') and help_into_head.stderr == '', \
        help_into_head.stderr[-2000:]
