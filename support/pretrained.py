"""
Start from a pretrained model, as nanoGPT's init_from='gpt2' does, and optionally add a rule beside its attention.

A base is one of:
  'gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl'   GPT-2's weights from the Hugging Face Hub (huggingface_hub and
                                                   safetensors read them; transformers is not needed)
  a folder in the Hub's layout                      config.json + model.safetensors of a GPT-2 (offline users, tests)
  a checkpoint of ours (path/to/ckpt.pt)            any GPT trained here, its LoRA merged if it has one

The base fixes the model's shape; a fine-tune may set dropout, a shorter block_size, LoRA (model.py) and, with
mix=True on a softmax base, a rule beside the pretrained attention in every layer (MixAttention): the pretrained
attention becomes the softmax branch, the rule's branch starts with copies of its q/k/v/out projections, and the
gate starts at 0.8 / 0.2 (the Krause paper's language-model fine-tune: attention='krause', krause_sigma=5.5,
krause_window=32, krause_topk=16, LoRA r=16, α=32, dropout 0.1).
"""
import difflib
import json
import os
from dataclasses import asdict, fields

import torch

from attention import FrameConfig, SoftmaxConfig
from rules import AttentionConfig
from model import GPT, target_names
from prepare import DATASETS, dataset_kind
from support.loading import load_run

GPT2_MODELS = {'gpt2': 'openai-community/gpt2', 'gpt2-medium': 'openai-community/gpt2-medium',
               'gpt2-large': 'openai-community/gpt2-large', 'gpt2-xl': 'openai-community/gpt2-xl'}  # name -> Hub id
HUB_FILES = ('config.json', 'model.safetensors')
DATASET_ENCODING = {'shakespeare_char': 'chars', 'shakespeare': 'gpt2', 'openwebtext': 'gpt2', 'fineweb_edu': 'gpt2',
                    'recall': 'tokens', 'passkey': 'tokens'}  # meta.json's encoding of each dataset (pixels: none)
TOKEN_NAMES = {'chars': 'character', 'gpt2': 'GPT-2 BPE', 'tokens': 'token-id', None: 'pixel'}  # encodings, in words
OWN_STARTS = ('scratch', 'resume', 'auto')  # train.py's init_from values that are not a base
GELU = {'gelu_new': 'tanh', 'gelu_pytorch_tanh': 'tanh', 'gelu': 'none'}  # GPT-2 config's activation -> ours
HUB_GELU = {'tanh': 'gelu_new', 'none': 'gelu'}  # ours -> the activation an export names (GPT-2's own for tanh)
# what a fine-tune sets itself (block_size shorter, or longer with RoPE: an extension); the rest comes from the base
FINE_TUNE_KEYS = ('dropout', 'flex', 'lora_rank', 'lora_alpha', 'lora_dropout', 'lora_targets', 'rope_scaling',
                  'rope_factor', 'tile_weights')
# and, where it adds a rule beside a softmax base (mix=True), that rule and its keys
SHORTCUT_KEYS = ('attention', 'mix') + tuple(  # every rule's own keys (softmax's window is the base's shape)
    f.name for f in fields(AttentionConfig) if f.name not in {g.name for g in fields(FrameConfig) + fields(SoftmaxConfig)})


def hub_layout_help(folder='DIR'):
    return (f"a folder in the Hugging Face layout ({' and '.join(HUB_FILES)}; e.g. `hf download "
            f"openai-community/gpt2 {' '.join(HUB_FILES)} --local-dir {folder}`)")


def check_init_from(init_from):
    """ValueError unless init_from is scratch/resume/auto, a GPT-2 name, a file, or a folder in the Hub's layout."""
    if init_from in OWN_STARTS or init_from in GPT2_MODELS:
        return
    if os.path.isdir(init_from):
        missing = [f for f in HUB_FILES if not os.path.isfile(os.path.join(init_from, f))]
        if missing:
            raise ValueError(f"init_from={init_from} lacks {', '.join(missing)}; a base is {hub_layout_help(init_from)}")
        return
    if os.path.isfile(init_from):
        return
    hint = difflib.get_close_matches(init_from, list(OWN_STARTS) + list(GPT2_MODELS), n=1)
    raise ValueError(f"init_from={init_from!r} is neither 'scratch', 'resume', 'auto', a GPT-2 model "
                     f"({', '.join(GPT2_MODELS)}) nor an existing path (a ckpt.pt of ours, or {hub_layout_help()})"
                     + (f"; did you mean '{hint[0]}'?" if hint else ''))


def load_base(init_from, dataset=None):
    """{'name', 'model_args', 'state' (our parameter names, CPU), 'meta' (what its tokens are)} of a base;
    ValueError (one line, saying what to do) where it cannot be had, or cannot read `dataset` (a fine-tune's)."""
    base = read_base(init_from)
    if dataset is not None:
        check_base_dataset(base, dataset)
    return base


def read_base(init_from):
    if init_from in GPT2_MODELS:
        return {**read_hub_folder(hub_folder(init_from)), 'name': init_from}
    if os.path.isdir(init_from):
        return {**read_hub_folder(init_from), 'name': init_from}
    run = load_run(init_from, 'cpu', hint="pass --init_from=PATH of a ckpt.pt")  # a fine-tune of a fine-tune
    if not isinstance(run.model, GPT):                                            # starts from the merged weights
        raise ValueError(f"init_from={init_from} is not a GPT checkpoint of ours; a base is a GPT (text or pixels)")
    return {'name': init_from, 'model_args': asdict(run.model.config), 'state': run.model.state_dict(),
            'meta': run.meta}


def hub_folder(name):
    """The local folder of GPT-2 `name`'s config.json and model.safetensors, downloaded once (the Hub's cache)."""
    from huggingface_hub import snapshot_download  # installed with datasets
    try:
        return snapshot_download(GPT2_MODELS[name], allow_patterns=list(HUB_FILES))
    except Exception as e:  # offline, the Hub down, a proxy: all say the same thing to the user
        raise ValueError(f"could not download {name} ({GPT2_MODELS[name]}) from the Hugging Face Hub "
                         f"({type(e).__name__}: {(str(e).splitlines() or [''])[0][:150]}); offline? fetch "
                         f"its {' and '.join(HUB_FILES)} elsewhere, then pass --init_from=THAT_FOLDER") from None


def read_hub_folder(folder):
    """A GPT-2 in the Hugging Face layout -> {'model_args', 'state', 'meta'}: its tensors by gpt2_layout (Conv1D
    weights (in, out) transposed to our Linears' (out, in)), every shape checked against config.json."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    damaged = f"the folder is damaged or holds another model: a GPT-2 base is {hub_layout_help(folder)}"
    try:
        with open(os.path.join(folder, 'config.json')) as f:
            cfg = json.load(f)
        hf = load_file(os.path.join(folder, 'model.safetensors'))
    except (OSError, ValueError, SafetensorError) as e:  # missing, unreadable, not JSON, a truncated safetensors
        reason = (str(e).splitlines() or [''])[0][:150]
        raise ValueError(f"cannot read {folder} ({type(e).__name__}: {reason}); {damaged}") from None
    model_type = cfg.get('model_type') if isinstance(cfg, dict) else None
    if model_type != 'gpt2':
        raise ValueError(f"{folder}/config.json is not a GPT-2's (model_type {model_type!r}); {damaged}")
    unsupported = {'activation_function': cfg.get('activation_function', 'gelu_new') not in GELU,
                   'layer_norm_epsilon': cfg.get('layer_norm_epsilon', 1e-5) != 1e-5,
                   'scale_attn_weights': not cfg.get('scale_attn_weights', True),
                   'scale_attn_by_inverse_layer_idx': cfg.get('scale_attn_by_inverse_layer_idx', False)}
    if any(unsupported.values()):
        key = next(k for k, bad in unsupported.items() if bad)
        raise ValueError(f"{folder}/config.json sets {key}={cfg.get(key)!r}, which this GPT does not compute "
                         f"(it has GELU or tanh-GELU, LayerNorm eps 1e-5, scores scaled by 1/sqrt(head size))")
    check_hub_config(cfg, folder, damaged)
    tied = cfg.get('tie_word_embeddings', True) is not False
    model_args = dict(n_layer=cfg['n_layer'], n_head=cfg['n_head'], n_embd=cfg['n_embd'],
                      block_size=cfg['n_positions'], vocab_size=cfg['vocab_size'], bias=True,
                      mlp_hidden=cfg.get('n_inner') or 0, tie_weights=tied, pos_emb='learned', attention='softmax',
                      mix=False, window=0, gelu_approximate=GELU[cfg.get('activation_function', 'gelu_new')])
    # the Hub holds both spellings: GPT-2's own file without the 'transformer.' prefix, save_pretrained's with it
    hf = {k if k.startswith(('transformer.', 'lm_head.')) else 'transformer.' + k: v for k, v in hf.items()}
    state = {}
    for name, shape, conv1d in gpt2_layout(cfg):
        if name not in hf or tuple(hf[name].shape) != shape:
            found = 'is missing' if name not in hf else f"has shape {tuple(hf[name].shape)}"
            raise ValueError(f"{folder}/model.safetensors: {name} {found}, config.json implies {shape}; {damaged}")
        state[name] = (hf[name].t() if conv1d else hf[name]).float().contiguous()
    if tied:
        state['lm_head.weight'] = state['transformer.wte.weight']  # as GPT-2's
    return {'model_args': model_args, 'state': state,
            'meta': {'kind': 'text', 'encoding': 'gpt2', 'vocab_size': cfg['vocab_size']}}


def gpt2_layout(cfg):
    """[(name, shape, conv1d)] of the tensors of a GPT-2 of config.json `cfg`, in GPT2LMHeadModel's names, which are
    ours: the one map between the Hub's files and our GPT, read both ways (read_hub_folder, hub_tensors). conv1d: a
    Conv1D weight, stored (in, out) where our Linear's is (out, in). lm_head.weight only where the head is untied."""
    C, V = cfg['n_embd'], cfg['vocab_size']
    hidden = cfg.get('n_inner') or 4 * C
    layout = [('transformer.wte.weight', (V, C)), ('transformer.wpe.weight', (cfg['n_positions'], C)),
              ('transformer.ln_f.weight', (C,)), ('transformer.ln_f.bias', (C,))]
    for i in range(cfg['n_layer']):
        layout += [(f'transformer.h.{i}.{name}', shape) for name, shape in (
            ('ln_1.weight', (C,)), ('ln_1.bias', (C,)), ('attn.c_attn.weight', (C, 3 * C)),
            ('attn.c_attn.bias', (3 * C,)), ('attn.c_proj.weight', (C, C)), ('attn.c_proj.bias', (C,)),
            ('ln_2.weight', (C,)), ('ln_2.bias', (C,)), ('mlp.c_fc.weight', (C, hidden)), ('mlp.c_fc.bias', (hidden,)),
            ('mlp.c_proj.weight', (hidden, C)), ('mlp.c_proj.bias', (C,)))]
    if cfg.get('tie_word_embeddings', True) is False:
        layout.append(('lm_head.weight', (V, C)))
    return [(name, shape, name.endswith('.weight') and ('.attn.' in name or '.mlp.' in name)) for name, shape in layout]


def hub_config(model_args, eos_token_id):
    """config.json of the GPT2LMHeadModel that computes our GPT of `model_args` (a softmax GPT over the whole context
    with learned positions: what studies/export.py checks first): read_hub_folder's reading, the other way."""
    block = model_args['block_size']
    dropout = model_args.get('dropout', 0.0)
    return dict(architectures=['GPT2LMHeadModel'], model_type='gpt2', vocab_size=model_args['vocab_size'],
                n_positions=block, n_ctx=block, n_embd=model_args['n_embd'], n_layer=model_args['n_layer'],
                n_head=model_args['n_head'], n_inner=model_args.get('mlp_hidden') or None,
                activation_function=HUB_GELU[model_args.get('gelu_approximate', 'none')], resid_pdrop=dropout,
                embd_pdrop=dropout, attn_pdrop=dropout, layer_norm_epsilon=1e-5, initializer_range=0.02,
                scale_attn_weights=True, tie_word_embeddings=model_args.get('tie_weights', True),
                bos_token_id=eos_token_id, eos_token_id=eos_token_id, use_cache=True, dtype='float32')


def hub_tensors(state, cfg):
    """Our GPT's state dict (LoRA merged) -> model.safetensors' tensors for config.json `cfg` (gpt2_layout): Conv1D
    weights back to (in, out); a bias our GPT lacks (bias=False) written as zeros, which GPT-2's Conv1D and LayerNorm
    always add: the same function."""
    tensors = {}
    for name, shape, conv1d in gpt2_layout(cfg):
        tensor = state[name] if name in state or not name.endswith('.bias') else torch.zeros(shape)
        tensors[name] = (tensor.t() if conv1d else tensor).float().contiguous()
        assert tuple(tensors[name].shape) == shape, (name, tuple(tensors[name].shape), shape)
    return tensors


HUB_SIZES = ('n_embd', 'n_layer', 'n_head', 'n_positions', 'vocab_size')  # config.json's keys that make the shape


def check_hub_config(cfg, folder, damaged):
    """ValueError naming the first of config.json's sizes that is missing or not a whole number >= 1 (n_inner: absent,
    null, or one too), before any tensor is compared with it."""
    for key in HUB_SIZES + ('n_inner',):
        value = cfg.get(key)
        if key == 'n_inner' and value is None:
            continue
        if key not in cfg or type(value) is not int or value < 1:
            found = 'lacks ' + key if key not in cfg else f"has {key}={value!r}, not a whole number >= 1"
            raise ValueError(f"{folder}/config.json {found}; {damaged}")
    C, H = cfg['n_embd'], cfg['n_head']
    if C % H:  # a base's weights keep their size: the heads are what config.json must get right
        divisors = [h for h in range(1, C + 1) if C % h == 0]
        raise ValueError(f"{folder}/config.json has n_embd={C}, n_head={H}: {C} cannot be split into {H} heads; set "
                         f"its n_head to the one the weights were trained with, which divides {C} "
                         f"({', '.join(map(str, divisors))}), or pass another --init_from")


def check_base_dataset(base, dataset):
    """ValueError unless `dataset` is of the tokens the base reads (GPT-2 BPE, its characters, token ids, pixels),
    before any data is prepared: a fine-tune reads its data with the base's vocabulary."""
    theirs, ours = base['meta'].get('encoding'), DATASET_ENCODING.get(dataset)
    if theirs != ours:
        fits = [name for name in DATASETS if DATASET_ENCODING.get(name) == theirs and
                (theirs or dataset_kind(name) == 'pixels')]
        raise ValueError(f"dataset={dataset} is {TOKEN_NAMES.get(ours, ours)} data, but the base {base['name']} "
                         f"reads {TOKEN_NAMES.get(theirs, theirs)} tokens; pass --dataset="
                         f"{' or '.join(fits) or 'one of its kind'}, or another --init_from")


def fine_tune_args(base, run_args, set_keys):
    """The model settings of a fine-tune of `base` (or of a resumed fine-tune, its checkpoint): the base's, except
    the keys a fine-tune may set and did (FINE_TUNE_KEYS; a block_size no longer than the base's; with mix=True on a
    softmax base, the rule beside it). run_args: this run's model settings; set_keys: those its config or command
    line set. A set key that contradicts the base is a ValueError, one line naming it."""
    args = {**run_args, **base['model_args']}
    adds_shortcut = mixed_args(run_args) and not mixed_args(base['model_args'])
    if adds_shortcut and base['model_args'].get('attention') != 'softmax':
        raise ValueError(f"mix=True adds a rule beside a softmax base's attention, but {base['name']} has "
                         f"attention={base['model_args'].get('attention')!r}; start from a softmax model")
    free = FINE_TUNE_KEYS + (SHORTCUT_KEYS if adds_shortcut else ())
    for key, value in run_args.items():
        if key in free and key in set_keys:
            args[key] = value
        elif key == 'block_size' and key in set_keys:
            if value > base['model_args']['block_size'] and args.get('pos_emb') == 'learned':
                longest = base['model_args']['block_size']
                raise ValueError(f"block_size={value} is longer than {base['name']}'s {longest} learned positions; "
                                 f"pass --block_size={longest} or less")
            args[key] = value  # base_state crops the position table
        elif key in set_keys and key != 'vocab_size' and value != args[key]:
            raise ValueError(f"{key}={value!r} contradicts the base {base['name']} ({key}={args[key]!r}): a fine-tune "
                             f"keeps the base's shape and rule; drop --{key} (or add a rule beside it with mix=True)")
    check_lora_rank(args, base['name'])
    return args


def check_lora_rank(args, name):
    """ValueError where lora_rank exceeds the smaller side of a Linear it adapts (an update of rank r needs r <= both
    sides of the weight: beyond that it only adds parameters)."""
    C = args['n_embd']
    hidden = args.get('mlp_hidden') or 4 * C
    sides = {'c_attn': ('c_attn', C), 'c_proj': ('c_proj', min(C, hidden)), 'c_fc': ('c_fc', min(C, hidden))}
    targets = [sides[t] for t in target_names(args.get('lora_targets', '')) if t in sides]
    if args.get('lora_rank', 0) and targets:
        layer, limit = min(targets, key=lambda t: t[1])
        if args['lora_rank'] > limit:
            raise ValueError(f"lora_rank={args['lora_rank']} is larger than {limit}, the smaller side of the {layer} "
                             f"weights it adapts in {name} (n_embd={C}, MLP hidden {hidden}); pass --lora_rank={limit} "
                             f"or less")


def mixed_args(args):  # config.mix on a dict of model settings
    return bool(args.get('mix', False))


def check_tokens(base, meta):
    """ValueError unless the data's tokens (meta.json) are the base's: GPT-2 BPE for GPT-2, the same characters for
    a character model, and no more of them than the base's vocabulary holds."""
    theirs, ours = base['meta'].get('encoding'), meta.get('encoding')
    if theirs != ours:
        raise ValueError(f"{base['name']} reads {theirs} tokens, the dataset {meta.get('dataset')} has {ours}; "
                         f"fine-tune on a dataset of its tokens (GPT-2 BPE: shakespeare, openwebtext, fineweb_edu)")
    if ours == 'chars' and base['meta'].get('itos') != meta.get('itos'):
        raise ValueError(f"the dataset's characters are not {base['name']}'s; prepare it into a new --data_dir "
                         f"(train.py encodes it with the base's characters)")
    needed, have = 50257 if ours == 'gpt2' else meta.get('vocab_size'), base['model_args']['vocab_size']
    if needed is not None and needed > have:
        raise ValueError(f"the dataset {meta.get('dataset')} has {needed:,} tokens but {base['name']} reads only "
                         f"{have:,}; fine-tune on data of its vocabulary (prepared with the base's settings)")


def base_state(base, model):
    """The base's weights in the names of `model` (a fine-tune of it): the position table cropped to its
    block_size; with a shortcut added (MixAttention), the pretrained attention as its softmax branch and copies of
    its projections in the rule's branch (c_attn's q, k, v rows to each q*, k*, v* projection the rule has, c_proj
    as it is), the rule's own parameters and projections (gated's g) and the gate as the model initialised them."""
    state = dict(base['state'])
    wpe = 'transformer.wpe.weight'
    if wpe in state:
        state[wpe] = state[wpe][:model.config.block_size]
    if not (model.config.mix and not mixed_args(base['model_args'])):
        return state
    C, own = model.config.n_embd, model.state_dict()
    for i, block in enumerate(model.transformer.h):
        prefix, rule = f'transformer.h.{i}.attn', block.attn.rule
        for name in [k[len(prefix) + 1:] for k in list(state) if k.startswith(prefix + '.')]:
            state[f'{prefix}.softmax.{name}'] = state.pop(f'{prefix}.{name}')
        for part in ('weight', 'bias'):
            if f'{prefix}.softmax.c_attn.{part}' not in state:
                continue  # bias=False
            q, k, v = state[f'{prefix}.softmax.c_attn.{part}'].split(C, dim=0)
            copies = {'q': q, 'k': k, 'v': v}
            rows = own[f'{prefix}.rule.c_attn.{part}'].clone()  # a projection of its own (gated's g) keeps its init
            for j, name in enumerate(rule.projections):
                if name[0] in copies:
                    rows[j * C:(j + 1) * C] = copies[name[0]]
            state[f'{prefix}.rule.c_attn.{part}'] = rows
            state[f'{prefix}.rule.c_proj.{part}'] = state[f'{prefix}.softmax.c_proj.{part}'].clone()
    for key in own:  # what the base has nothing for: the gate, the rule's own parameters, LoRA
        state.setdefault(key, own[key])
    return state


def load_base_weights(model, base):
    """Put the base's weights into `model`; ValueError naming what does not fit."""
    state = base_state(base, model)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith(('.lora_A', '.lora_B'))]
    if missing or unexpected:
        raise ValueError(f"{base['name']}'s weights do not fit this model (missing {missing[:3]}, unexpected "
                         f"{unexpected[:3]}); it was made by another version of the model")
