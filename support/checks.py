"""
Settings checked before any work is done (no folder made, no data prepared, no checkpoint opened): a bad value is a
ValueError whose message names the key and the fix, and the script prints it as its one `error:` line
(`check_or_exit`, or `one_line_errors` around a block). train.py's checks are the model; every script a user runs
checks its own the same way, with the same range helpers. The checks run in the order written, which is the order of
precedence: when two settings are wrong, the earlier check names its own.

This module is the one hub that imports from every floor below the scripts (the rules' names, the models' dataclasses,
the data sets, the pretrained starts, a checkpoint to resume), and it has to be one: train.py checks every setting
before any work, in one order of precedence. What checks one thing lives beside it and is only called from here
(check_attention_name with the rules, check_init_from with the pretrained bases, a generated task's keys in its
prepare/ module, check_attention_layers with the runtime); what stays here is the order, the range helpers every
script shares, and the checks that span floors (a ViT's key given to a GPT, the memory a run needs).
"""
import importlib.util
import os
from contextlib import contextmanager
from dataclasses import fields

import torch

from rules import check_attention_name, check_keys_read
from model import GPTConfig
from support.loading import load_checkpoint
from support.pretrained import OWN_STARTS, check_init_from
from prepare import DATASETS, check_dataset_name, dataset_kind
from prepare import passkey, recall
from prepare.examples import memory_bytes as machine_memory
from support.runtime import DTYPES, check_attention_layers, dataclass_values, exit_with_error
from vit import ViTConfig

AT_LEAST_ONE = ('batch_size', 'block_size', 'gradient_accumulation_steps', 'eval_iters', 'eval_interval',
                'log_interval', 'n_layer', 'n_head', 'n_embd', 'recall_keys', 'recall_pairs',
                'nproc_per_node')  # sizes, intervals and counts
NOT_NEGATIVE = ('max_iters', 'warmup_iters', 'lr_decay_iters', 'mlp_hidden', 'num_classes', 'min_lr', 'weight_decay',
                'grad_clip', 'mixup_alpha', 'cutmix_alpha', 'eval_examples')
GPT2_BPE = ('openwebtext', 'fineweb_edu', 'shakespeare')  # the datasets HellaSwag can score: GPT-2 BPE text
BELOW_ONE = ('dropout', 'drop_path', 'beta1', 'beta2', 'label_smoothing')  # probabilities and decay rates, in [0, 1)
VIT_KEYS = ('patch_size', 'num_classes', 'augment', 'mixup_alpha', 'cutmix_alpha', 'cutmix_prob',
            'label_smoothing')  # train.py's keys that only a ViT (an image dataset) reads
# the attention keys of one form of a rule alone: the GPT's causal form (a window, chunks, the mix branch) or the
# ViT's bidirectional one (the patch grid's neighbours, refinement over the whole sequence, a masked diagonal)
CAUSAL_ONLY = ('window', 'krause_window', 'cluster_chunk', 'linear_chunk', 'mix', 'mix_matched')
BIDIRECTIONAL_ONLY = ('krause_radius', 'krause_metric', 'cluster_iters', 'cluster_self', 'attnx_mask_diagonal',
                      'longformer_global')
TASK_CHECKS = {'recall': recall.check_train_settings, 'passkey': passkey.check_train_settings}
TASK_KEYS = {'recall_keys': 'recall', 'recall_pairs': 'recall', 'passkey_needles': 'passkey'}  # the generated tasks'


@contextmanager
def one_line_errors(*errors):
    """A ValueError (or an error of the kinds given) raised inside ends the script with its message as one
    `error:` line."""
    try:
        yield
    except (ValueError, *errors) as e:
        exit_with_error(e)  # under torchrun: said once, by local rank 0


def check_or_exit(check, *args, **kwargs):
    """Run a settings check; a ValueError ends the script with its message as one `error:` line."""
    with one_line_errors():
        return check(*args, **kwargs)


def check_ranges(c, at_least_one=(), not_negative=(), below_one=()):
    """ValueError naming the first key of `c` (a script's settings) out of its range: sizes and counts at least 1,
    amounts not negative, probabilities and decay rates in [0, 1)."""
    for key in at_least_one:  # `not >=`: NaN is out of every range
        if not c[key] >= 1:
            raise ValueError(f"{key}={c[key]} must be at least 1; pass --{key}=1 or more")
    for key in not_negative:
        if not c[key] >= 0:
            raise ValueError(f"{key}={c[key]} must not be negative; pass --{key}=0 or more")
    for key in below_one:
        if not 0.0 <= c[key] < 1.0:
            raise ValueError(f"{key}={c[key]} must be at least 0 and below 1; pass --{key}=VALUE in [0, 1)")


def check_train_config(config, world_size=1, set_keys=(), typed=()):
    """ValueError naming the first bad setting in `config` (train.py's config keys and their values) for a run of
    world_size processes; set_keys: those a config file or the command line set, typed: the command line's. The
    model's own settings, and every attention layer's, are checked last."""
    c = config
    check_attention_name(c['attention'])
    check_dataset_name(c['dataset'])
    kind = dataset_kind(c['dataset'])
    check_model_form(c, kind, set_keys)
    check_keys_read(c, set_keys, typed)
    lora = [f.name for f in fields(GPTConfig) if f.name.startswith('lora_') and f.name != 'lora_rank' and
            f.name in set_keys and c[f.name] != f.default]
    if not c['lora_rank'] and lora:  # read only where LoRA trains
        raise ValueError(f"{lora[0]}={c[lora[0]]} is read only with LoRA, and lora_rank=0 trains every weight; pass "
                         f"--lora_rank=R (e.g. 16), or drop --{lora[0]}")
    if not c['out_dir']:
        raise ValueError("out_dir is empty; pass --out_dir=DIR (ckpt.pt and log.jsonl go there)")
    if os.path.exists(c['out_dir']) and not os.path.isdir(c['out_dir']):
        raise ValueError(f"out_dir={c['out_dir']} is a file, not a folder; pass --out_dir=DIR")
    if not c['max_iters'] >= 1 and not c['eval_only']:  # iteration 0 is evaluated, never saved: no ckpt.pt
        raise ValueError(f"max_iters={c['max_iters']} trains no iteration, so the run would write no checkpoint; pass "
                         f"--max_iters=1 or more")
    check_ranges(c, AT_LEAST_ONE, NOT_NEGATIVE, BELOW_ONE)
    if not 0.0 <= c['cutmix_prob'] <= 1.0:
        raise ValueError(f"cutmix_prob={c['cutmix_prob']} is a probability; pass --cutmix_prob=VALUE in [0, 1]")
    if not c['learning_rate'] > 0:
        raise ValueError(f"learning_rate={c['learning_rate']} must be positive; pass e.g. --learning_rate=1e-3")
    warmup, decay = c['warmup_iters'], c['lr_decay_iters']
    if c['decay_lr'] and decay <= warmup:  # the cosine runs from warmup_iters to lr_decay_iters
        raise ValueError(f"lr_decay_iters={decay} must be greater than warmup_iters={warmup}; pass "
                         f"--lr_decay_iters={max(c['max_iters'], warmup + 1)} (usually max_iters), a smaller "
                         f"--warmup_iters, or --decay_lr=False")
    started = os.environ.get('LOCAL_WORLD_SIZE')  # torchrun's count of this node's processes
    if started and c['nproc_per_node'] not in (1, int(started)):
        raise ValueError(f"nproc_per_node={c['nproc_per_node']}, but torchrun started {started} processes on this "
                         f"node; under torchrun drop --nproc_per_node (torchrun's own says how many)")
    if c['gradient_accumulation_steps'] % world_size:
        raise ValueError(f"gradient_accumulation_steps={c['gradient_accumulation_steps']} must be a multiple of the "
                         f"{world_size} processes; pass a multiple of {world_size}")
    if c['dataset'] in TASK_CHECKS:  # a generated task's own keys, checked beside the task (prepare/)
        TASK_CHECKS[c['dataset']](c)
    check_dtype(c['dtype'])
    if c['eval_full'] and not c['eval_only']:
        raise ValueError("eval_full=True is a one-off measurement of a checkpoint; pass it with --eval_only=True "
                         "--init_from=resume")
    check_init_from(c['init_from'])
    no_checkpoint = not os.path.exists(os.path.join(c['out_dir'], 'ckpt.pt'))
    if c['init_from'] in ('resume', 'auto') and not no_checkpoint:  # what it goes on from, before any data is prepared
        load_checkpoint(os.path.join(c['out_dir'], 'ckpt.pt'), 'cpu', resume=True, mmap=True)
    if c['lora_rank'] and (c['init_from'] == 'scratch' or c['init_from'] == 'auto' and no_checkpoint):
        raise ValueError(f"lora_rank={c['lora_rank']} trains low-rank updates of a base's frozen weights, but "
                         f"init_from={c['init_from']!r} starts from random ones; pass --init_from=BASE (gpt2, a "
                         f"ckpt.pt, a folder in the Hub's layout), or --lora_rank=0")
    check_device(c['device'])
    if kind == 'image' and c['init_from'] not in OWN_STARTS:
        raise ValueError(f"init_from={c['init_from']} fine-tunes a GPT, but dataset {c['dataset']} trains a ViT; "
                         f"pass --init_from=scratch, or a text or pixels dataset")
    if c['hellaswag'] and c['dataset'] not in GPT2_BPE:
        raise ValueError(f"hellaswag=True needs a GPT-2 BPE dataset ({', '.join(GPT2_BPE)}), not {c['dataset']}; "
                         f"pass --hellaswag=False")
    if c['hellaswag'] and c['hellaswag_source'] and not os.path.isfile(c['hellaswag_source']):
        raise ValueError(f"hellaswag_source={c['hellaswag_source']} is not a file; pass --hellaswag_source=PATH of a "
                         f"local hellaswag_val.jsonl, or leave it empty to download it")
    if c['wandb_log'] and importlib.util.find_spec('wandb') is None:  # not after the data and the model
        raise ValueError("wandb_log=True logs to Weights & Biases, which is not installed; pip install wandb, or pass "
                         "--wandb_log=False (log.jsonl in out_dir has every record)")
    # the model (a ViT for images, a GPT otherwise) checks its settings as it is configured, its size against the
    # memory, and every attention layer its own as it is built; the data's sizes (vocab_size, num_classes) come later
    ModelConfig = ViTConfig if kind == 'image' else GPTConfig
    model_config = ModelConfig(**dataclass_values(ModelConfig, c))
    check_fits(training_memory(c, model_config), c['device'], set_keys)
    check_attention_layers(model_config)
    check_model_form(c, kind, set_keys, rule_keys=True)


def form_keys():
    """{form: the keys only that form of the model reads}: the model's own from the dataclasses (a field one has and
    the other lacks), train.py's image keys, each rule's form-only keys; and the ViT's layout (causal, grid_size),
    which the ViT derives from its patch grid and a GPT, causal and without one, never reads."""
    gpt, vit = ({f.name for f in fields(cls) if f.init} for cls in (GPTConfig, ViTConfig))
    layout = {f.name for f in fields(ViTConfig) if not f.init} - set(GPTConfig.__annotations__)
    return {'GPT': (gpt - vit - layout) | set(CAUSAL_ONLY),
            'ViT': (vit - gpt) | set(VIT_KEYS) | set(BIDIRECTIONAL_ONLY) | layout}, layout


def check_model_form(c, kind, set_keys, rule_keys=False):
    """ValueError naming the first key that a config file or the command line set (set_keys) and that the model this
    dataset trains does not read: a ViT's key for a GPT (`causal=False` would let it see the future), a GPT's for a
    ViT, or a generated task's for another dataset; accepted and ignored, it would change nothing the user meant.
    rule_keys: the rules' form-only keys alone, checked after the layers are built, so that the rule a run picks
    says first, in its own words, why it refuses its own key (attnx_mask_diagonal=True needs causal=False)."""
    only, layout = form_keys()
    form, other = ('ViT', 'GPT') if kind == 'image' else ('GPT', 'ViT')
    dataset, rules = c['dataset'], {*CAUSAL_ONLY, *BIDIRECTIONAL_ONLY}
    keys = [k for k in c if k in set_keys and (k in rules) == rule_keys and (
            k in only[other] or form == 'ViT' and k in layout or TASK_KEYS.get(k, dataset) != dataset)]
    if not keys:
        return
    key = keys[0]
    if key in TASK_KEYS and TASK_KEYS[key] != dataset:
        raise ValueError(f"{key} is a setting of the {TASK_KEYS[key]} task, but dataset {dataset} does not read it; "
                         f"drop --{key}, or pass --dataset={TASK_KEYS[key]}")
    if form == 'ViT' and key in layout:
        raise ValueError(f"{key} is the ViT's own, set from its patch grid (patch_size), not a setting; drop --{key}")
    named = ', '.join(name for name in DATASETS if (dataset_kind(name) == 'image') == (other == 'ViT'))
    why = ": a GPT is causal and has no patch grid" if key in layout else ''
    raise ValueError(f"{key} is a {other} setting, but dataset {dataset} ({kind}) trains a {form}{why}; drop --{key} "
                     f"(and the {other} config that sets it), or pass {'an image' if other == 'ViT' else 'a GPT'} "
                     f"dataset ({named})")


def memory_bytes(device):
    """What a run on `device` can hold: the GPU's memory, else this machine's memory and swap (Linux); None where
    it is not known."""
    if torch.device(device).type == 'cuda':
        return torch.cuda.get_device_properties(torch.device(device)).total_memory
    return machine_memory()


def check_fits(parts, device, set_keys=(), doing='a training step'):
    """ValueError where parts [(bytes, what, {key: value})], a lower bound of what a run holds at once, need more
    than `device` has: said before any work, naming the keys of the largest part (those the user set first), rather
    than an allocation's traceback, or the machine's memory taken, later."""
    have = memory_bytes(device)
    need = sum(size for size, _, _ in parts)
    if have is None or need <= have:
        return
    _, what, keys = max(parts, key=lambda part: part[0])
    names = sorted(keys, key=lambda k: k not in set_keys)
    raise ValueError(f"{', '.join(f'{k}={keys[k]}' for k in names)}: {doing} holds at least {need / 2**30:,.1f} GiB, "
                     f"{what} the most of it, more than the {have / 2**30:,.1f} GiB that {device} has; pass a smaller "
                     f"--{' or --'.join(names)}")


def model_memory(cfg, vocab_size=0, trained=True):
    """The parts of what a model of cfg's shape holds, at the least, any rule: q, k, v and out, the MLP's two
    Linears, the embeddings (vocab_size 0: not known yet) and the learned positions, in float32, with (trained) their
    gradients and AdamW's two moments; RoPE's tables in every layer."""
    C, hidden, T = cfg.n_embd, cfg.mlp_hidden or 4 * cfg.n_embd, cfg.block_size
    parameters = cfg.n_layer * (4 * C * C + 2 * C * hidden) + (vocab_size + T * (cfg.pos_emb == 'learned')) * C
    shape = {'n_layer': cfg.n_layer, 'n_embd': C, **({'mlp_hidden': cfg.mlp_hidden} if cfg.mlp_hidden else {})}
    sequence = {'patch_size': cfg.patch_size} if isinstance(cfg, ViTConfig) else {'block_size': T}
    rope = 2 * cfg.n_layer * T * (C // max(cfg.n_head, 1)) * 4 if cfg.pos_emb == 'rope' else 0
    return [(parameters * 4 * (4 if trained else 1), "the model's weights" + (", gradients and AdamW state" if
             trained else ''), {**shape, **(sequence if cfg.pos_emb == 'learned' else {})}),
            (rope, "RoPE's tables", {**sequence, 'n_layer': cfg.n_layer})]


def training_memory(c, cfg):
    """The parts of what a training step of train.py's settings c and the model's config cfg holds at once, at the
    least: the model (frozen weights under LoRA train no state), each layer's activations (8 C a token), and the rows
    drawn at once for an optimizer step's micro-batches and for an evaluation (int64)."""
    element = 4 if torch.device(c['device']).type == 'cpu' or c['dtype'] == 'float32' else 2
    sequence = {'patch_size': cfg.patch_size} if isinstance(cfg, ViTConfig) else {'block_size': cfg.block_size}
    activations = c['batch_size'] * cfg.block_size * cfg.n_layer * 8 * cfg.n_embd * element
    rows = {k: c[k] for k in ('gradient_accumulation_steps', 'eval_iters', 'batch_size')}
    return [*model_memory(cfg, trained=not c['lora_rank']),
            (activations, "the activations of one micro-batch", {'batch_size': c['batch_size'], **sequence,
                                                                  'n_layer': cfg.n_layer, 'n_embd': cfg.n_embd}),
            (8 * c['batch_size'] * max(c['gradient_accumulation_steps'], c['eval_iters']), "the batch rows drawn at "
             "once", rows)]


def check_device(device):
    """ValueError unless `device` names a device this machine has."""
    try:
        device_type = torch.device(device).type
    except RuntimeError:
        raise ValueError(f"device='{device}' is not a device; pass --device=cpu, cuda, cuda:1 or mps") from None
    if device_type == 'cuda' and not torch.cuda.is_available() or \
            device_type == 'mps' and not torch.backends.mps.is_available():
        raise ValueError(f"device='{device}' is not available on this machine; pass --device=cpu")


def check_dtype(dtype):
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(map(repr, DTYPES))}, got '{dtype}'; pass --dtype=float32")


# -----------------------------------------------------------------------------
# shared by the other scripts' checks (sample.py, bench.py, studies/)

def script_settings(scope):
    """{key: value} of a script's settings: the plain values of its globals, as configurator.py reads them."""
    return {k: v for k, v in scope.items() if not k.startswith('_') and isinstance(v, (int, float, bool, str))}


def check_int_list(c, key, example, at_least=1):
    """The comma-separated whole numbers of setting `key`, each at least `at_least`; ValueError naming the key."""
    text = str(c[key])
    try:
        values = [int(s) for s in text.split(',')]
    except ValueError:
        values = []
    if not values or any(v < at_least for v in values):
        raise ValueError(f"{key}={text!r} must be comma-separated whole numbers, each at least {at_least}; pass e.g. "
                         f"--{key}={example}")
    if max(values) >= 2 ** 63:  # torch's and numpy's whole numbers: sizes, seeds
        raise ValueError(f"{key}={text!r}: {max(values)} is past 64 bits (the most is 2**63 - 1); pass e.g. "
                         f"--{key}={example}")
    return values


def check_distinct(key, values):
    """ValueError naming setting `key` where its list of values (names, seeds) holds one twice: a row, a column or a
    seed given twice would be run and counted twice."""
    twice = list(dict.fromkeys(str(v) for v in values if values.count(v) > 1))
    if twice:
        raise ValueError(f"{key}={','.join(map(str, values))} gives {', '.join(twice)} more than once; pass each once: "
                         f"--{key}={','.join(dict.fromkeys(map(str, values)))}")


def check_folder(c, key, what="a folder"):
    """ValueError unless setting `key` is empty (its default) or an existing folder."""
    if c[key] and not os.path.isdir(c[key]):
        raise ValueError(f"{key}={c[key]} is not a folder; pass --{key}=DIR of {what}, or leave it out")


def check_writable_file(c, key, what):
    """ValueError unless setting `key` (a file about to be written) is empty or a path in an existing folder and not
    a folder itself."""
    path = c[key]
    if not path:
        return
    if os.path.isdir(path):
        raise ValueError(f"{key}={path} is a folder; pass --{key}=PATH of the {what} to write")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"{key}={path}: its folder {folder} does not exist; make it first, or pass --{key}=PATH in "
                         f"an existing folder")
