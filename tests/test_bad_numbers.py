"""Numbers that are not numbers, and keys for another kind of model: each is one `error:` line naming its key, before
any work (no folder made, no data prepared, no model built). An infinite or NaN float, a whole number past 64 bits or
a seed numpy cannot take is refused by configurator.py for every script, by whole_number for the prepare scripts,
and by each rule's own check where a config is built in code; a model that fits no memory is said before it is
built; a key that the model the dataset trains does not read (a ViT's `causal=False` in a GPT) is refused, not
ignored. One batch of forked runs (tests/faults.py): milliseconds each."""
import math
import os
import re

import pytest

from rules import AttentionConfig, build_attention
from conftest import ROOT, run_forked
from model import GPTConfig
from support.checks import BIDIRECTIONAL_ONLY, CAUSAL_ONLY, form_keys

HUGE_INT = str(2 ** 64)  # past torch's and numpy's whole numbers
SMALL = ['--seq_lens=32', '--n_embd=16', '--n_head=2', '--n_layer=1', '--repeats=1', '--device=cpu', '--dtype=float32']
VIT = ['--dataset=cifar10', '--device=cpu', '--compile=False']
# (script, arguments, a config file's text or None, the key the last line must name, its pattern); {d}: a folder
NUMBERS = [
    ('train.py', ['--attention=krause', '--krause_sigma=1e999'], None, 'krause_sigma', r"must be a finite number"),
    ('train.py', ['--attention=tda', '--tda_eps=1e999'], None, 'tda_eps', r"must be a finite number"),
    ('train.py', ['--pos_emb=rope', '--rope_factor=1e999'], None, 'rope_factor', r"must be a finite number"),
    ('train.py', ['--lora_alpha=1e999'], None, 'lora_alpha', r"must be a finite number"),
    ('train.py', [], "min_lr = float('nan')\n", 'min_lr', r"must be a finite number, got nan in .*cfg"),
    ('train.py', [], "grad_clip = float('nan')\n", 'grad_clip', r"must be a finite number, got nan"),
    ('train.py', [], "weight_decay = float('inf')\n", 'weight_decay', r"must be a finite number, got inf"),
    ('train.py', ['--learning_rate=1' + '0' * 400], None, 'learning_rate', r"must be a finite number"),
    ('train.py', [f'--seed={HUGE_INT}'], None, 'seed', r"past 64 bits"),
    ('train.py', ['--seed=-1'], None, 'seed', r"seed must be in 0 \.\. 2\*\*63 - 1, got -1"),
    ('train.py', [f'--max_iters={HUGE_INT}'], None, 'max_iters', r"past 64 bits"),
    ('train.py', ['--n_embd=1000000000'], None, 'n_embd', r"holds at least .* GiB, the model's weights"),
    ('train.py', ['--block_size=1000000000000'], None, 'block_size', r"holds at least .* GiB.*pass a smaller "
                                                                      r"--block_size"),
    ('train.py', ['--pos_emb=none', '--block_size=1000000000000'], None, 'block_size', r"the activations"),
    ('train.py', ['--recall_keys=100000', '--recall_pairs=4'], None, 'recall_keys', r"int16 files"),
    ('train.py', ['--attention=cluster', '--cluster_m=1000000000000'], None, 'cluster_m', r"does not fit this "
                                                                                         r"machine's memory"),
    ('train.py', [*VIT, '--n_layer=1000000000'], None, 'n_layer', r"GiB"),
    ('sample.py', ['--out_dir={d}', '--temperature=1e999'], None, 'temperature', r"must be a finite number"),
    ('bench.py', [*SMALL, '--attention=cluster', '--cluster_sharpness=1e999'], None, 'cluster_sharpness',
     r"must be a finite number"),
    ('bench.py', [*SMALL[1:], '--seq_lens=1000000000000'], None, 'seq_lens', r"the attention mode .* GiB"),
    ('bench.py', [*SMALL, '--mode=model', '--n_layer=100000000'], None, 'n_layer', r"the model mode .* GiB"),
    ('bench.py', [*SMALL, '--n_layer=1000000000000'], None, 'n_layer', r"the attention layers' weights"),
    ('studies/extrapolate.py', ['--out_dir={d}', '--rope_factor=1e999'], None, 'rope_factor', r"finite number"),
    ('studies/extrapolate.py', ['--out_dir={d}', '--num_tokens=1000000000000000'], None, 'num_tokens', r"GiB"),
    ('studies/analyze.py', ['--out_dir={d}', '--batch_size=1000000000000'], None, 'batch_size', r"GiB"),
    ('studies/cluster_swap.py', ['--out_dir={d}', '--eval_iters=1000000000000'], None, 'eval_iters', r"GiB"),
    ('studies/analyze.py', ['--out_dir={d}', f'--seed={HUGE_INT}'], None, 'seed', r"past 64 bits"),
    ('studies/ablate.py', ['--out_root={d}/abl', f'--seeds=1,{HUGE_INT}'], None, 'seeds', r"past 64 bits"),
    ('prepare/fineweb_edu.py', ['--max_tokens=inf', '--data_dir={d}/fw'], None, 'max_tokens', r"a whole number"),
    # more tokenizer processes than cores: never forked (a Pool of that many would take the machine)
    ('prepare/openwebtext.py', [f'--num_proc={(os.cpu_count() or 1) + 1}', '--data_dir={d}/ow'], None, 'num_proc',
     r"a whole number from 1 to"),
    ('prepare/recall.py', ['--seed=-1', '--data_dir={d}/rc'], None, 'seed', r"a whole number from 0"),
    ('prepare/passkey.py', [f'--num_train={HUGE_INT}', '--data_dir={d}/pk'], None, 'num_train', r"a whole number"),
    ('prepare/recall.py', ['--num_train=1000000000000', '--data_dir={d}/rc'], None, 'num_train', r"GiB"),
]
# a key the built model does not read: a ViT's in a GPT (text, examples, pixels), a GPT's in a ViT, a generated
# task's for another dataset
FORMS = [
    ([], '--causal=False', 'causal', r"causal is a ViT setting, but dataset recall \(examples\) trains a GPT: a GPT "
                                     r"is causal"),
    ([], '--grid_size=8', 'grid_size', r"grid_size is a ViT setting"),
    (['--attention=krause'], '--krause_metric=chebyshev', 'krause_metric', r"krause_metric is a ViT setting"),
    (['--attention=krause'], '--krause_radius=2', 'krause_radius', r"krause_radius is a ViT setting"),
    (['--dataset=shakespeare_char'], '--augment=False', 'augment', r"augment is a ViT setting"),
    (VIT, '--block_size=64', 'block_size', r"block_size is a GPT setting, but dataset cifar10 \(image\) trains a ViT"),
    ([*VIT, '--attention=krause'], '--krause_window=8', 'krause_window', r"krause_window is a GPT setting"),
    (VIT, '--lora_alpha=16', 'lora_alpha', r"lora_alpha is a GPT setting"),
    (VIT, '--causal=False', 'causal', r"causal is the ViT's own, set from its patch grid"),
    (VIT, '--recall_keys=8', 'recall_keys', r"recall_keys is a setting of the recall task, but dataset cifar10"),
    (['--dataset=shakespeare_char'], '--passkey_needles=2', 'passkey_needles', r"setting of the passkey task"),
    # a key only some rules read, for a rule that ignores it
    (['--attention=diff'], '--window=4', 'window', r"window=4 is not read by attention=diff, only by softmax, "
                                                   r"attentionx, topk, gated, ssmax, dex, lsa; drop --window"),
    (['--attention=softmax'], '--tile_weights=4096', 'tile_weights', r"only by tda, topk, entmax, rela"),
    # a rule's own key typed for another rule; RoPE's without RoPE (or unscaled); LoRA's without LoRA
    (['--attention=softmax'], '--krause_window=8', 'krause_window', r"krause_window=8 is not read by "
                                                                    r"attention=softmax, only by krause; drop"),
    (['--attention=softmax'], '--tda_beta=0.3', 'tda_beta', r"not read by attention=softmax, only by tda"),
    (['--attention=krause'], '--cluster_m=4', 'cluster_m', r"not read by attention=krause, only by cluster"),
    ([], '--rope_base=500', 'rope_base', r"rope_base=500.0 is read only with RoPE, and pos_emb='learned'"),
    ([], '--rope_factor=4', 'rope_factor', r"rope_factor=4.0 is read only with RoPE"),
    (['--pos_emb=rope'], '--rope_factor=4', 'rope_factor', r"read only where RoPE is scaled, and rope_scaling='none'"),
    ([], '--lora_alpha=16', 'lora_alpha', r"lora_alpha=16.0 is read only with LoRA, and lora_rank=0"),
]


def last_line(out):
    return out.strip().splitlines()[-1] if out.strip() else ''


def assert_one_error_line(rc, out, key, pattern):
    assert rc != 0 and 'Traceback' not in out, out[-3000:]
    line = last_line(out)
    assert line.startswith('error: ') and key in line and re.search(pattern, line), line


@pytest.fixture(scope='module')
def checkpoint(trained_runs):
    d, results = trained_runs
    assert results['base'][0] == 0, results['base'][1][-2000:]
    return d / 'base'


def test_a_number_that_is_not_one_is_one_line_naming_its_key(checkpoint, tmp_path):
    """Every script: inf, NaN, past 64 bits, a negative seed, a size no memory holds; the line names the key it is
    (a NaN min_lr is min_lr's, not learning_rate's), and nothing was made."""
    runs = []
    for i, (script, args, config, _, _) in enumerate(NUMBERS):
        argv = [script, *(a.replace('{d}', str(checkpoint if script in ('sample.py', 'studies/extrapolate.py',
                                                                         'studies/analyze.py', 'studies/cluster_swap.py')
                                                        else tmp_path))
                          for a in args)]
        if script == 'train.py':
            argv += [f'--out_dir={tmp_path / f"out{i}"}', f'--data_dir={tmp_path / f"data{i}"}']
        if config is not None:
            (tmp_path / f'cfg{i}.py').write_text(config)
            argv.insert(1, str(tmp_path / f'cfg{i}.py'))
        runs.append({'argv': argv})
    for (script, args, _, key, pattern), (rc, out) in zip(NUMBERS, run_forked(*runs)):
        assert_one_error_line(rc, out, key, pattern)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f'cfg{i}.py' for i, c in enumerate(NUMBERS)
                                                                 if c[2] is not None)  # no folder, no data


@pytest.mark.parametrize('key, value', [('krause_sigma', math.inf), ('tda_eps', math.inf), ('tda_beta', math.nan),
                                        ('tda_p', math.inf), ('tda_kappa', math.inf), ('cluster_sharpness', math.inf),
                                        ('cluster_seed_lr', math.nan), ('attnx_gamma', math.nan),
                                        ('rope_factor', math.inf), ('rope_base', math.nan), ('rope_base', math.inf)])
def test_a_rule_built_in_code_refuses_a_number_that_is_not_one(key, value):
    """The seed rules' own keys, where no configurator stands between (a config built in code, a checkpoint's):
    inf and NaN are a ValueError that names the key."""
    rule = key.split('_')[0].replace('attnx', 'attentionx').replace('rope', 'softmax')
    cfg = AttentionConfig(n_embd=16, n_head=2, block_size=8, attention=rule, pos_emb='rope', **{key: value})
    with pytest.raises(ValueError, match=key):
        build_attention(cfg, 0)


@pytest.mark.parametrize('value', [math.inf, math.nan, 0.0])
def test_lora_alpha_not_a_positive_finite_number_is_refused_by_name(value):
    with pytest.raises(ValueError, match=r"LoRA needs lora_alpha > 0 and finite"):
        GPTConfig(lora_alpha=value)


def test_a_key_the_model_does_not_read_is_one_line_naming_it(tmp_path):
    """A ViT's key in a GPT run (causal=False would let it see the future) and a GPT's in a ViT run, a rule's key for
    another rule, RoPE's without RoPE, LoRA's without LoRA: refused when set, before any work, saying who reads it."""
    runs = [{'argv': ['train.py', *base, arg, f'--out_dir={tmp_path / f"out{i}"}',
                      f'--data_dir={tmp_path / f"data{i}"}']} for i, (base, arg, _, _) in enumerate(FORMS)]
    for (_, _, key, pattern), (rc, out) in zip(FORMS, run_forked(*runs)):
        assert_one_error_line(rc, out, key, pattern)
    assert list(tmp_path.iterdir()) == []


def test_the_form_table_comes_from_the_dataclasses_and_no_shipped_config_is_refused(tmp_path):
    """The GPT-only keys are GPTConfig's fields the ViTConfig lacks (block_size, LoRA's, ...) and the rules' causal
    forms'; the ViT's its own fields and layout (causal, grid_size); every config/*.py passes all of train.py's checks
    (the run stopped at the first work after them, a base's loading or the processes' start: exit 7)."""
    only, layout = form_keys()
    assert layout == {'causal', 'grid_size'}
    assert {'block_size', 'lora_rank', 'tie_weights', 'gelu_approximate', *CAUSAL_ONLY} <= only['GPT']
    assert {'patch_size', 'num_classes', 'augment', *layout, *BIDIRECTIONAL_ONLY} <= only['ViT']
    assert not only['GPT'] & only['ViT']
    configs = sorted((ROOT / 'config').glob('*.py'))
    stop = ['', '', 0, "import support.pretrained, support.runtime\ndef stop(*args, **kwargs): os._exit(7)\n"
                       "support.pretrained.load_base = support.runtime.init_ddp = stop"]  # the first work after
    results = run_forked(*({'argv': ['train.py', str(path), f'--out_dir={tmp_path / path.stem}', '--batch_size=1'],
                            'fault': stop} for path in configs))  # one sequence: a GPU's config fits a CPU's memory
    for path, (rc, out) in zip(configs, results):
        assert rc == 7, (path.name, out[-2000:])
    assert list(tmp_path.iterdir()) == []


def test_bench_refuses_a_key_none_of_its_rules_reads_and_a_config_may_hold_another_rules_keys(tmp_path):
    """bench.py as train.py: a key no rule of the bench reads is one line; of several rules, one reading it is
    enough. A recipe's config file may carry another rule's keys (config/krause_gpt.py under --attention=softmax):
    only a key typed on the command line is refused."""
    quick = ['--seq_lens=16', '--repeats=1', '--n_layer=1', '--n_embd=16', '--n_head=2', '--batch_size=1']
    (rc, out), (rc2, out2), (rc3, out3) = run_forked(
        {'argv': ['bench.py', '--attention=krause', '--window=8', *quick]},
        {'argv': ['bench.py', '--attention=topk,krause', '--krause_window=8', '--krause_topk=4', *quick]},
        {'argv': ['train.py', 'config/krause_gpt.py', '--attention=softmax', '--mix=False', '--device=cpu',
                  f'--out_dir={tmp_path / "out"}', f'--data_dir={tmp_path / "data"}'],
         'fault': ['', '', 0, "import support.pretrained, support.runtime\ndef stop(*args, **kwargs): os._exit(7)\n"
                             "support.pretrained.load_base = support.runtime.init_ddp = stop"]})
    assert_one_error_line(rc, out, 'window', r"window=8 is not read by attention=krause, only by softmax")
    assert rc2 == 0 and 'krause' in out2, out2[-2000:]
    assert rc3 == 7, out3[-2000:]  # past every check, stopped at the first work
