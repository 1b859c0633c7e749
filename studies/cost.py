"""
What a run of train.py costs, said before its first step (studies/ablate.py --dry_run): its settings resolved as
train.py resolves them (its defaults, then its config files and --key=value, through configurator.py), its model's
parameters counted on the meta device (no weights are allocated where the rule allows it), the tokens it trains on,
its training FLOPs and the GPU-hours they take at a stated MFU on a named GPU. No data is read or prepared.

  tokens        max_iters · gradient_accumulation_steps · batch_size · T, T the model's sequence (a GPT's block_size,
                a ViT's 1 + patches)
  FLOPs         6·N·tokens (N every parameter; for a LoRA fine-tune an upper bound: it computes no frozen weight's
                gradient) + 3·L·A(T)·tokens, A(T) the rule's ideal attention FLOPs per token and layer at T
                (support/flops.py), the mean over the L layers, 3 for the forward and the backward
  GPU-hours     FLOPs / (MFU · the GPU's dense bf16 peak, support/runtime.PEAK_FLOPS) / 3600; scoring is left out
"""
import contextlib
import functools
import io
import json
import os
import sys

import torch

from model import GPT, GPTConfig
from prepare import ROOT, dataset_kind, default_data_dir
from prepare.passkey import vocab_size as passkey_vocab
from rules import AttentionConfig
from support.loading import load_checkpoint
from support.pretrained import OWN_STARTS, fine_tune_args
from support.runtime import PEAK_FLOPS, dataclass_defaults, dataclass_values
from vit import ViT, ViTConfig

GPT2_SHAPES = {'gpt2': (12, 12, 768), 'gpt2-medium': (24, 16, 1024), 'gpt2-large': (36, 20, 1280),
               'gpt2-xl': (48, 25, 1600)}  # (n_layer, n_head, n_embd) of the Hub's GPT-2 bases
GPT2_VOCAB = 50304  # GPT-2's 50257 padded, as train.py pads it (support/data.py model_sizes)
VOCAB_UNPREPARED = {'shakespeare_char': 65}  # a character set before its data is read: Tiny Shakespeare's


def train_settings(args):
    """{key: value} train.py runs with for `args` (its command-line arguments): its defaults block, then
    configurator.py on the arguments, without running train.py. SystemExit with train.py's error: line for a bad
    argument."""
    settings = resolved_settings(tuple(args))
    return {**settings, 'overridden': list(settings['overridden'])}  # the caller's own copy


@functools.lru_cache(maxsize=None)  # a lab resolves each run's arguments many times (its folder, its recipe, its cost)
def resolved_settings(args):
    defaults, configurator = settings_code()
    scope = {'torch': torch, 'AttentionConfig': AttentionConfig, 'dataclass_defaults': dataclass_defaults}
    exec(defaults, scope)
    keys = [k for k, v in scope.items() if not k.startswith('_') and isinstance(v, (int, float, bool, str))]
    argv = [a if a.startswith('--') else str(ROOT / a) for a in args]  # config files: from the repo root
    saved, sys.argv = sys.argv, ['train.py', *argv]
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # its "Overriding ..." lines
            exec(configurator, scope)
    finally:
        sys.argv = saved
    return {**{k: scope[k] for k in keys}, 'overridden': scope['overridden']}


@functools.lru_cache(maxsize=None)
def settings_code():
    """train.py's defaults block and configurator.py, compiled once."""
    source = open(ROOT / 'train.py').read()
    defaults = source[source.index('# default config values'):source.index('config_keys = ')]
    return compile(defaults, '<string>', 'exec'), compile(open(ROOT / 'configurator.py').read(), '<string>', 'exec')


def data_sizes(config):
    """What the model takes from the data ({'vocab_size'} or {'num_classes'}): the prepared meta.json where the data
    is there, else what the dataset holds (an unprepared character set: Tiny Shakespeare's 65)."""
    name, kind = config['dataset'], dataset_kind(config['dataset'])
    path = os.path.join(config['data_dir'] or default_data_dir(name), 'meta.json')
    meta = json.load(open(path)) if os.path.exists(path) else {}
    if kind == 'image':
        return {'num_classes': meta.get('num_classes', 100 if name == 'cifar100' else 10)}
    if kind == 'pixels':
        return {'vocab_size': 256}
    if meta:
        return {'vocab_size': GPT2_VOCAB if meta.get('encoding') == 'gpt2' else meta['vocab_size']}
    unprepared = {'recall': 2 * config['recall_keys'], 'passkey': passkey_vocab(), **VOCAB_UNPREPARED}
    return {'vocab_size': unprepared.get(name, GPT2_VOCAB)}  # the rest: GPT-2 BPE


def model_args(config, base_model_args=None):
    """(model class, its config's arguments) of a run: its own settings, or a fine-tune's base's shape
    (base_model_args: a base not trained yet; else a GPT-2 of the Hub, or the base checkpoint's)."""
    image = dataset_kind(config['dataset']) == 'image'
    ModelConfig, Model = (ViTConfig, ViT) if image else (GPTConfig, GPT)
    own = dataclass_values(ModelConfig, config, **data_sizes(config))
    start = config['init_from']
    if start in OWN_STARTS:
        return Model, ModelConfig, own
    if base_model_args is None and start in GPT2_SHAPES:
        n_layer, n_head, n_embd = GPT2_SHAPES[start]
        base_model_args = dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=1024, vocab_size=50257,
                               bias=True, mlp_hidden=0, tie_weights=True, pos_emb='learned', attention='softmax',
                               mix=False, window=0, gelu_approximate='tanh')  # as support/pretrained.py reads it
    if base_model_args is None:  # a trained base's checkpoint
        base_model_args = load_checkpoint(start, 'cpu', mmap=True)['model_args']
    return Model, ModelConfig, fine_tune_args({'name': start, 'model_args': base_model_args}, own,
                                              config['overridden'])


def built(Model, ModelConfig, arguments):
    """The model on the meta device (shapes, no weights); on the CPU where a rule reads values as it is built."""
    try:
        with torch.device('meta'):
            return Model(ModelConfig(**arguments))
    except (NotImplementedError, RuntimeError):  # e.g. a window per layer computed with a tensor's .tolist()
        return Model(ModelConfig(**arguments))


def ideal_attention_flops(model, T):
    """The rule's ideal attention FLOPs per token and layer at T (each layer's `ideal_flops`), the mean over the
    layers; built on the CPU where the meta model cannot say it."""
    layers = lambda m: [block.attn for block in (m.h if hasattr(m, 'h') else m.transformer.h)]
    try:
        per_layer = [attn.ideal_flops(T) for attn in layers(model)]
    except (NotImplementedError, RuntimeError):
        per_layer = [attn.ideal_flops(T) for attn in layers(type(model)(model.config))]
    return sum(per_layer) / len(per_layer)


def run_cost(args, base_model_args=None):
    """{'params', 'tokens', 'T', 'flops', 'attention_flops', 'model_args'} of a train.py run with `args`
    (the module's docstring); base_model_args: the shape of a base it fine-tunes that is not trained yet."""
    config = train_settings(args)
    Model, ModelConfig, arguments = model_args(config, base_model_args)
    params, T, n_layer, attention = model_cost(Model, ModelConfig, json.dumps(arguments, sort_keys=True))
    tokens = config['max_iters'] * config['gradient_accumulation_steps'] * config['batch_size'] * T
    flops = 6 * params * tokens + 3 * n_layer * (attention or 0) * tokens
    return {'params': params, 'tokens': tokens, 'T': T, 'flops': flops, 'attention_flops': attention,
            'model_args': arguments, 'config': config}


@functools.lru_cache(maxsize=None)  # a model built once per shape: the seeds and tables that share one
def model_cost(Model, ModelConfig, arguments):
    """(parameters, T, layers, ideal attention FLOPs per token and layer) of the model of `arguments` (JSON)."""
    model = built(Model, ModelConfig, json.loads(arguments))
    T = model.config.block_size
    return sum(p.numel() for p in model.parameters()), T, model.config.n_layer, ideal_attention_flops(model, T)


def gpu_hours(flops, gpu, mfu):
    """Hours of one GPU named `gpu` (a key of PEAK_FLOPS) at model FLOPs utilisation `mfu` for `flops`."""
    return flops / (mfu * PEAK_FLOPS[gpu]) / 3600
