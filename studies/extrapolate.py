"""
Length extrapolation: val loss of a GPT checkpoint at contexts of 1x, 2x, 4x, 8x its training block_size.

$ python studies/extrapolate.py --out_dir=out-shakespeare-char [--multiples=1,2,4,8 --num_tokens=65536]

For each length L = m x block_size: num_tokens // L windows of the val split at fixed random offsets (the same
seed for every checkpoint), the mean loss over all positions ('all') and over the positions past the training
length, block_size..L-1 ('beyond'). Learned position embeddings stop at block_size: those rows say so.
With pos_emb 'rope' or 'none' the model runs at any length (RoPE's tables grow; see GPT.forward).
--rope_scaling=ntk --rope_factor=4 evaluates the same weights with RoPE scaled (machinery/rope.py), untrained.
A passkey checkpoint (dataset=passkey, prepare/passkey.py) gets instead the answer accuracy per length on
num_examples fresh episodes: per digit, whole answers, and the loss on the answer digits; --needles=1,2,4 scores
1, 2 and 4 passkeys per episode (asked for together; a model trained with --passkey_needles=1,2,4 has seen each).
A GPT-2-token language model with --passkey=True gets the same test in words (prepare/passkey.py's
make_text_examples: the TDA paper's passkey, up to 4,096 tokens and more): whole-answer and per-token accuracy, and
the answer's loss, per needle count and length.
A length whose forward would not fit the free memory is one error line before any is scored.
"""
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

if __package__ in (None, ''):  # run as a script: the repo root on the path, as for prepare/
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from prepare import ROOT, check_files
from prepare.passkey import make_examples, make_text_examples, parse_needles, shortest
from prepare.sources import gpt2_encoding
from machinery.rope import ROPE_SCALINGS
from support.loading import load_run
from support.checks import (check_device, check_dtype, check_folder, check_int_list, check_or_exit, check_ranges,
                            script_settings)
from support.data import Batches
from support.runtime import precision

# -----------------------------------------------------------------------------
out_dir = 'out'
data_dir = ''               # default: the checkpoint's own data_dir (else its dataset's default folder)
multiples = '1,2,4,8'
lengths = ''                # token lengths instead of multiples ('64,128,256,512': a model extended to 256 at 64 too)
num_tokens = 65536          # val tokens per length
batch_size = 8
device = 'cpu'
dtype = 'float32'
num_examples = 500          # passkey: fresh episodes per length
needles = ''                # passkey: needle counts to score, each on its own ('1,2,4'); '' = those it trained on
passkey = False             # a GPT-2-token language model: passkey accuracy in words instead of val loss
seed = 1337
rope_scaling = ''           # RoPE scaling at evaluation ('none', 'linear', 'ntk'); '' keeps the checkpoint's
rope_factor = 0.0           # its factor s; 0 keeps the checkpoint's
json_out = False
exec(open(ROOT / 'configurator.py').read())
# -----------------------------------------------------------------------------


def check_extrapolate_settings(c):
    """ValueError naming the first bad setting, before the checkpoint is opened: the device first."""
    check_device(c['device'])
    check_dtype(c['dtype'])
    if not c['out_dir']:
        raise ValueError("out_dir is empty; pass --out_dir=DIR of the run to evaluate (its ckpt.pt)")
    check_int_list(c, 'multiples', '1,2,4,8')
    if c['lengths']:
        check_int_list(c, 'lengths', '64,128,256,512', at_least=2)
    check_ranges(c, at_least_one=('num_tokens', 'batch_size', 'num_examples'), not_negative=('rope_factor',))
    if c['needles']:
        parse_needles(c['needles'], 'needles')
    if c['rope_scaling'] not in ('', *ROPE_SCALINGS):
        raise ValueError(f"rope_scaling must be '', 'none', 'linear' or 'ntk', got {c['rope_scaling']!r}; pass e.g. "
                         f"--rope_scaling=ntk --rope_factor=4")
    check_folder(c, 'data_dir', "the dataset the checkpoint was trained on")


check_or_exit(check_extrapolate_settings, script_settings(globals()))


@torch.no_grad()
def evaluate(model, batches, L, ctx):
    """(mean loss over all positions, over positions >= block_size or None) on num_tokens // L windows of L; batches:
    the val split read in windows of L (support.data.Batches with block_size L)."""
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, batches.split_rows['val'] - L - 1, size=max(1, num_tokens // L))
    block = model.config.block_size
    total, beyond = [], []
    for i in range(0, len(starts), batch_size):
        x, y = batches.load_batch('val', torch.from_numpy(starts[i:i + batch_size]))  # (b, L) each
        with ctx:
            logits, _ = model(x, y)
        loss = F.cross_entropy(logits.float().transpose(1, 2), y, reduction='none')  # (b, L)
        total.append(loss.mean(1))
        beyond.append(loss[:, block:].mean(1) if L > block else loss[:, :0].sum(1))
    return torch.cat(total).mean().item(), (torch.cat(beyond).mean().item() if L > block else None)


def passkey_episodes(task, encode, L, needles):
    """num_examples fresh episodes (x, y) of length L with `needles` passkeys: the checkpoint's own task (task), or
    in words through the tokenizer (encode); y is -1 but at the answer."""
    episode_seed = seed + 1000 + L + (needles - 1) * 7919  # needles=1: the episodes of before needles existed
    if encode is not None:
        return make_text_examples(encode, num_examples, L, episode_seed, needles)
    return make_examples(num_examples, L, task['digits'], episode_seed, needles)


@torch.no_grad()
def passkey_accuracy(model, episodes, ctx, rows):
    """(accuracy per answer token, whole-answer accuracy: every passkey right, the answer's loss) on episodes, `rows`
    at a time."""
    x, y = (torch.from_numpy(a.astype(np.int64)).to(device) for a in episodes)
    right, whole, losses = [], [], []
    for i in range(0, len(x), rows):
        with ctx:
            logits, _ = model(x[i:i + rows], y[i:i + rows])  # (b, L, V): every position
        target = y[i:i + rows]
        asked = target >= 0                                                      # (b, L): the answer's positions
        hit = (logits.argmax(-1) == target) | ~asked
        right.append(hit[asked])
        whole.append(hit.all(1))
        losses.append(F.cross_entropy(logits.float()[asked], target[asked], reduction='none'))
    return (torch.cat(right).float().mean().item(), torch.cat(whole).float().mean().item(),
            torch.cat(losses).mean().item())


def check_memory(cfg, sizes, rows):
    """SystemExit with one line where a forward of `rows` sequences at the longest length would not fit the memory
    this machine has free: about 3 float32 (T, T) score tensors per head (the math path's worst case) and the
    activations and logits. Linux's MemAvailable; elsewhere nothing is checked."""
    try:
        with open('/proc/meminfo') as f:
            free = next(int(line.split()[1]) * 1024 for line in f if line.startswith('MemAvailable'))
    except (OSError, StopIteration):
        return
    T = max(sizes)
    starts = 8 * (num_tokens // min(sizes))  # every window's offset at once (int64)
    if starts > free:
        raise SystemExit(f"error: num_tokens={num_tokens} at T={min(sizes)} draws {num_tokens // min(sizes):,} "
                         f"windows, whose offsets alone need {starts / 2**30:,.1f} GiB of the {free / 2**30:.1f} GiB "
                         f"free; pass a smaller --num_tokens")
    need = rows * (3 * cfg.n_head * T * T + 20 * T * cfg.n_embd + T * cfg.vocab_size) * 4
    if need > free and device == 'cpu':
        setting = f"lengths={lengths!r}" if lengths else f"multiples={multiples!r}"
        raise SystemExit(f"error: {setting} reaches T={T}: a forward of {rows} sequences needs about "
                         f"{need / 2**30:.1f} GiB, and this machine has {free / 2**30:.1f} GiB free; pass smaller "
                         f"--{setting.split('=')[0]} or --batch_size")


def multiple(L, cfg):  # L / block_size: a whole number where it is one
    return L // cfg.block_size if L % cfg.block_size == 0 else L / cfg.block_size


def rope_name(cfg):
    scaled = cfg.pos_emb == 'rope' and cfg.rope_scaling != 'none'
    return f"pos_emb={cfg.pos_emb}" + (f" {cfg.rope_scaling}x{cfg.rope_factor:g}" if scaled else '')


if __name__ == '__main__':
    device_type, ptdtype, ctx = precision(device, dtype)
    scaling = {k: v for k, v in (('rope_scaling', rope_scaling), ('rope_factor', rope_factor)) if v}
    try:
        run = load_run(out_dir, device, **scaling)  # the checkpoint's weights with this scaling of RoPE
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    if run.meta.get('kind') != 'text' and run.meta.get('dataset') != 'passkey':
        raise SystemExit(f"error: {out_dir} is not a text model; extrapolate.py evaluates a GPT on a token stream")
    model = run.model
    cfg, task = model.config, run.meta.get('task')
    sizes = ([int(n) for n in str(lengths).split(',')] if lengths else
               [m * cfg.block_size for m in check_int_list({'multiples': multiples}, 'multiples', '1,2,4,8')])
    encode = None
    if passkey and run.meta['dataset'] != 'passkey':  # in words: the model must read GPT-2's tokens
        if run.meta.get('encoding') != 'gpt2':
            raise SystemExit(f"error: passkey=True asks in English with GPT-2's tokens, but {out_dir} reads "
                             f"{run.meta.get('encoding')!r} tokens; pass --passkey=False (val loss per length)")
        try:
            encode = gpt2_encoding().encode
        except RuntimeError as e:  # offline with no tokenizer cached
            raise SystemExit(f"error: {e}") from None
    if run.meta['dataset'] == 'passkey' or encode is not None:
        counts = parse_needles(needles or (task.get('needles', '1') if encode is None else '1'), 'needles')
        try:  # in words, an episode's length in tokens varies with its keys: make every one once before scoring
            for k in counts if encode is not None else ():
                for L in sizes:
                    passkey_episodes(task, encode, L, k)
        except ValueError as e:
            raise SystemExit(f"error: needles={needles!r}: {e}; pass fewer --needles or longer --lengths")
        if encode is None and min(task['seq_len'], min(sizes)) < shortest(task['digits'], max(counts)):
            raise SystemExit(f"error: needles={needles!r}: {max(counts)} passkeys do not fit "
                             f"{min(task['seq_len'], min(sizes))} tokens (the trained length, or the shortest of "
                             f"--lengths); pass fewer --needles or longer --lengths")
        rows = batch_size * 8 if encode is None else batch_size  # a language model's logits are 50,304 wide
        check_memory(cfg, sizes, rows)
        for k in counts:
            for L in sizes:
                if cfg.pos_emb == 'learned' and L > cfg.block_size:
                    print(f"{cfg.attention} {multiple(L, cfg):g}x T={L}: n/a (learned positions stop at block_size)")
                    continue
                digit, whole, loss = passkey_accuracy(model, passkey_episodes(task, encode, L, k), ctx, rows)
                row = dict(checkpoint=out_dir, model=f"{cfg.attention} {rope_name(cfg)}", needles=k,
                           multiple=multiple(L, cfg), T=L, digit_acc=digit, passkey_acc=whole, loss=loss)
                print(json.dumps(row) if json_out else f"{row['model']:<24s} {k} needle(s) {row['multiple']:g}x "
                                                       f"T={L:<6d} passkey accuracy {whole:.3f} (digits {digit:.3f}, "
                                                       f"answer loss {loss:.4f})")
        raise SystemExit(0)
    check_memory(cfg, sizes, batch_size)
    data_dir, dataset = data_dir or run.data_dir, run.config['dataset']
    try:
        meta, split_rows = check_files(dataset, data_dir)
    except ValueError as e:
        raise SystemExit(f"error: {e} (the checkpoint was trained on {dataset}; pass --data_dir=DIR of it)")
    name = cfg.attention + ('-mix' if cfg.mix else '') + f" {rope_name(cfg)}"
    for L in sizes:
        m = multiple(L, cfg)
        row = dict(checkpoint=out_dir, model=name, multiple=m, T=L)
        if cfg.pos_emb == 'learned' and L > cfg.block_size:
            row['loss'] = row['beyond'] = None  # learned positions stop at block_size
        elif L + 1 >= split_rows['val']:
            raise SystemExit(f"error: {data_dir}/val.bin holds {split_rows['val']:,} tokens, too few for length {L}")
        else:
            row['loss'], row['beyond'] = evaluate(model, Batches(dataset, data_dir, meta, split_rows, L, batch_size,
                                                                 device), L, ctx)
        if json_out:
            print(json.dumps(row))
        else:
            fmt = lambda x: 'n/a (learned positions)' if x is None and row['loss'] is None else (
                '-' if x is None else f"{x:.4f}")
            print(f"{name:<24s} {m:g}x T={L:<6d} val loss {fmt(row['loss'])}  beyond block_size {fmt(row['beyond'])}")
