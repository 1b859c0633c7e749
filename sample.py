"""
Sample text from a trained GPT checkpoint, decoding with the dataset meta stored in the checkpoint.

$ python sample.py --out_dir=out-shakespeare-char --start="ROMEO:" --num_samples=3
$ python sample.py --start=FILE:prompt.txt
$ python sample.py --init_from=gpt2-xl \
      --start="What is the answer to life, the universe, and everything?"

A checkpoint fine-tuned with LoRA is sampled with its updates merged in (model.merge_lora).

On a recall checkpoint (the default `python train.py`), with no --start, it shows recall episodes
instead: the pairs, the queries, the model's answers beside the truth, and the accuracy.

On a pixel model's checkpoint (a 'pixels' dataset) it draws num_samples images, `batch_size` at a
time, with the KV cache, writes them as a PNG grid (--png, default out_dir/samples.png), and prints
images/s (a warm-up left out, the device synchronised) and the MiB the caches hold; --complete=True
gives the top half of the first num_samples test images as prompts and writes originals and
completions side by side (out_dir/completions.png):
$ python sample.py --out_dir=out-arm-cifar10-cpu-krause --num_samples=16 --batch_size=16 \
      --temperature=1.0 --top_k=0
"""
import io
import os
import time

import numpy as np
import torch

from prepare.atomic import write_or_exit
from support.loading import load_run
from support.checks import (check_device, check_dtype, check_fits, check_folder, check_or_exit,
                            check_ranges, check_writable_file, one_line_errors, script_settings)
from support.pixels import cache_mib, png_grid, timed_draw, to_images
from model import GPT, GPTConfig
from support.pretrained import OWN_STARTS, check_init_from, load_base
from prepare import ROOT, dataset_kind
from prepare.recall import make_examples
from prepare.sources import gpt2_encoding
from support.runtime import precision

# -----------------------------------------------------------------------------
init_from = 'resume'      # 'resume' (out_dir/ckpt.pt) or a base (support/pretrained.py): gpt2..,
                          # a folder, a ckpt
out_dir = 'out'
start = "\n"              # or "<|endoftext|>" or etc.; a file's text: "FILE:prompt.txt"
num_samples = 10          # number of samples to draw (recall: episodes to show)
max_new_tokens = 500      # number of tokens generated in each sample
temperature = 0.8         # 1.0 = no change, < 1.0 = less random, > 1.0 = more random
top_k = 200               # retain only the top_k most likely tokens, clamp others to 0; 0: all
batch_size = 16           # pixels: sequences drawn at once
complete = False          # pixels: complete the top half of test images (beside the originals)
png = ''                  # pixels: the grid's path; default out_dir/samples.png or completions.png
data_dir = ''             # pixels: the prepared dataset; default the checkpoint's data_dir
use_cache = True          # KV cache (prefill, then a token at a time); False: recompute the context
seed = 1337
device = 'cuda' if torch.cuda.is_available() else 'cpu'
dtype = 'bfloat16' if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else 'float32'
exec(open(ROOT / 'configurator.py').read())
# -----------------------------------------------------------------------------


def check_sample_settings(c):
    """ValueError naming the first bad setting, before a checkpoint is opened: the device first."""
    check_device(c['device'])
    check_dtype(c['dtype'])
    check_ranges(c, at_least_one=('num_samples', 'batch_size'),
                 not_negative=('max_new_tokens', 'top_k'))
    if c['temperature'] < 0:
        raise ValueError(f"temperature={c['temperature']} must not be negative (0 is greedy, 1 the "
                         f"model's own distribution); pass --temperature=0.8 or another value of 0 "
                         f"or more")
    if not c['out_dir'] and c['init_from'] == 'resume':
        raise ValueError("out_dir is empty; pass --out_dir=DIR of the run to sample (its ckpt.pt)")
    check_writable_file(c, 'png', 'PNG grid')
    if c['png'] and not c['png'].lower().endswith('.png'):
        raise ValueError(f"png={c['png']} must end in .png (a PNG grid is written there); pass "
                         f"--png=PATH.png")
    check_folder(c, 'data_dir', 'the prepared image dataset')


check_or_exit(check_sample_settings, script_settings(globals()))
PIXEL_KEYS = ('complete', 'png', 'data_dir', 'batch_size')  # read only where a pixel model draws images
TEXT_KEYS = ('start', 'max_new_tokens')                       # read only where a model writes text
DECODING_KEYS = ('max_new_tokens', 'temperature', 'top_k', 'use_cache')  # recall's episodes answer by argmax


def check_keys_read(meta, set_keys):
    """ValueError naming the first key a config or --key=value set that sampling this checkpoint does not read (a
    pixel model's keys on a text model, text's on a pixel model): refused, not ignored, before any sampling."""
    src = out_dir if init_from == 'resume' else init_from
    if meta['pixels']:
        unread, why = TEXT_KEYS, f"is for text, but {src} holds a pixel model (it draws images)"
    elif 'num_keys' in meta.get('task', {}) and start == '\n':
        unread, why = PIXEL_KEYS + DECODING_KEYS, (f"is not read for {src}'s recall model with no --start (it shows "
                                                   f"episodes, answered by argmax)")
    else:
        unread, why = PIXEL_KEYS, f"is for a pixel model's images, but {src} holds a text model"
    key = next((k for k in unread if k in set_keys), None)
    if key:
        raise ValueError(f"{key}={globals()[key]!r} {why}; drop --{key}")


def codec(meta):
    """encode/decode for the checkpoint's data: characters, GPT-2 BPE, or plain token ids."""
    if meta['encoding'] == 'chars':
        itos = meta['itos']
        stoi = {ch: i for i, ch in enumerate(itos)}
        return ((lambda s: [stoi[c] for c in known_chars(s, stoi)]),
                (lambda ids: ''.join(itos[i] for i in ids)))
    if meta['encoding'] == 'gpt2':
        with one_line_errors(RuntimeError):  # offline with no tokenizer cached
            enc = gpt2_encoding()
        return (lambda s: enc.encode(s, allowed_special={"<|endoftext|>"})), enc.decode
    # token ids written as numbers, e.g. the recall task's
    return (lambda s: token_ids(s, meta['vocab_size'])), (lambda ids: ' '.join(map(str, ids)))


def known_chars(text, stoi):
    """text, or SystemExit naming the characters the model never saw (rather than dropping them)."""
    unknown = sorted(set(text) - set(stoi))
    if unknown:
        raise SystemExit(f"error: the prompt has {len(unknown)} character(s) this model never saw: "
                         f"{' '.join(map(repr, unknown[:20]))}; remove or replace them (it knows "
                         f"{''.join(stoi)!r})")
    return text


def token_ids(text, vocab_size):
    """Token ids written as numbers, or SystemExit saying what this model reads."""
    try:
        ids = [int(t) for t in text.split()]
    except ValueError:
        ids = [-1]
    if any(not 0 <= i < vocab_size for i in ids):
        raise SystemExit(f"error: this model reads token ids 0..{vocab_size - 1} separated by "
                         f"spaces, got {text!r}")
    return ids


def word(token, num_keys):
    """A recall token as it reads: keys k0.., values v0.."""
    return f"k{token}" if token < num_keys else f"v{token - num_keys}"


@torch.no_grad()
def recall_episodes(model, task, shown, device, seed, n=1000):
    """n fresh recall episodes (another seed than train and val): print `shown` of them, the model's
    answer at each query beside the truth (wrong ones marked *), and the accuracy over all n, as
    train.py's val acc counts it."""
    K, P = task['num_keys'], task['num_pairs']
    examples = make_examples(n, K, P, task['seq_len'], seed)
    x, y = (torch.from_numpy(a.astype('int64')).to(device) for a in examples)
    logits, _ = model(x, y)
    answer, asked = logits.argmax(-1), y != -1
    print(f"recall: {P} key-value pairs over {K} keys, then queries; keys k0..k{K - 1} are tokens "
          f"0..{K - 1}, values v0..v{K - 1} are tokens {K}..{2 * K - 1}")
    for e in range(min(shown, n)):
        where = asked[e].nonzero().flatten().tolist()
        marked = [word(answer[e, t].item(), K) + ('' if answer[e, t] == y[e, t] else '*')
                  for t in where]
        rows = {'queries': [word(x[e, t].item(), K) for t in where],
                'model': marked,
                'truth': [word(y[e, t].item(), K) for t in where]}
        pairs = ' '.join(f"{word(x[e, 2 * i].item(), K)}={word(x[e, 2 * i + 1].item(), K)}"
                         for i in range(P))
        right = sum(not w.endswith('*') for w in rows['model'])
        print(f"episode {e + 1}: pairs {pairs}; {right}/{len(where)} right")
        for name, row in rows.items():
            print(f"  {name:<8}" + ' '.join(f"{w:<4}" for w in row).rstrip())
    accuracy = (answer == y)[asked].float().mean().item()
    print(f"accuracy {accuracy:.4f} over {n:,} fresh episodes ({asked.sum().item():,} answers; "
          f"chance 1/{K} = {1 / K:.4f})")


def load_gpt(init_from, device):
    """(model, meta) of out_dir's checkpoint (init_from='resume', support.loading.load_run) or of
    a base, in eval mode on the device, LoRA merged; meta holds the run's config and data_dir too.
    One error line if it cannot be had."""
    if init_from != 'resume':
        with one_line_errors():
            check_init_from(init_from)
            if init_from in OWN_STARTS:  # 'scratch', 'auto': train.py's, not a model to sample
                raise ValueError(f"init_from={init_from} has no model to sample; pass "
                                 f"--init_from=resume (out_dir's ckpt.pt) or a base ('gpt2', a "
                                 f"folder, a ckpt.pt)")
            base = load_base(init_from)
        model = GPT(GPTConfig(**base['model_args']))
        model.load_state_dict(base['state'])
        return model.to(device).eval(), {**base['meta'], 'pixels': False, 'data_dir': None,
                                         'config': {'attention': base['model_args']['attention']}}
    run = load_run(out_dir, device)
    pixels = 'dataset' in run.config and dataset_kind(run.config['dataset']) == 'pixels'
    if not isinstance(run.model, GPT):
        raise SystemExit(f"error: {out_dir} holds a ViT image classifier "
                         f"({run.config['dataset']}); sample.py generates text from a GPT. "
                         f"Evaluate it with train.py and the config it was trained with, e.g.: "
                         f"python train.py config/softmax_vit.py --out_dir={out_dir} "
                         f"--init_from=resume --eval_only=True")
    return run.model, {**run.meta, 'pixels': pixels, 'config': run.config, 'data_dir': run.data_dir}


def sample_images(model, meta, device):
    """Draw (or complete) num_samples images with the cache; write the PNG grid; print images/s and
    cache MiB."""
    config = meta['config']
    folder = data_dir or meta['data_dir']
    try:
        test = np.load(os.path.join(folder, 'val_x.npy'), mmap_mode='r')  # (N, H, W, C): test split
    except (OSError, ValueError) as e:
        raise SystemExit(f"error: cannot read the prepared {config['dataset']} test images in "
                         f"{folder} ({e}); pass --data_dir=DIR of the prepared dataset")
    shape, tokens = test.shape[1:], int(np.prod(test.shape[1:]))
    if complete and num_samples > len(test):  # before any drawing
        raise SystemExit(f"error: num_samples={num_samples} with complete=True completes the first "
                         f"num_samples test images, but {folder} holds {len(test)}; pass "
                         f"--num_samples={len(test)} or fewer")
    with one_line_errors():  # every image drawn is kept for the grid: said before any is drawn
        check_fits([(num_samples * tokens * 8, "the images drawn", {'num_samples': num_samples})], device,
                   doing=f"drawing {num_samples} images of {tokens:,} subpixels")
    prompts = None
    if complete:  # the top half of each of the first num_samples test images: its first H/2 rows
        originals = test[:num_samples].reshape(num_samples, -1).astype(np.int64)
        originals = torch.from_numpy(originals).to(device)
        prompts = originals[:, :shape[0] // 2 * shape[1] * shape[2]]
    seqs, images_per_s, seconds = timed_draw(model, num_samples, batch_size, tokens, temperature,
                                             top_k, prompts, use_cache)
    path = png or os.path.join(out_dir, 'completions.png' if complete else 'samples.png')
    images = to_images(seqs, shape)
    if complete:  # rows of originals and completions side by side: original, completion, ...
        images = np.stack([to_images(originals, shape), images], 1).reshape(-1, *shape)
    grid = io.BytesIO()
    grid.name = 'grid.png'  # png_grid's format; the PNG is made in memory, then written in one go
    png_grid(images, grid)

    def write(tmp):
        with open(tmp, 'wb') as f:
            f.write(grid.getvalue())
    write_or_exit(path, write,
                  f"nothing was written, and the {num_samples} images drawn are not kept",
                  "pass --png=PATH.png in a folder you can write to, and run again")
    mib = cache_mib(model, batch_size, tokens - 1) if use_cache else 0.0
    how = 'completed' if complete else 'drawn'
    print(f"{num_samples} images of {tokens:,} subpixels ({how}, batch {batch_size}, "
          f"{config['attention']}) in {seconds:.2f} s: {images_per_s:.3f} images/s; caches hold "
          f"{mib:.1f} MiB at the last subpixel; wrote {path}")


if __name__ == '__main__':
    torch.manual_seed(seed)
    torch.cuda.manual_seed(seed)
    device_type, ptdtype, ctx = precision(device, dtype)
    model, meta = load_gpt(init_from, device)
    check_or_exit(check_keys_read, meta, overridden)  # configurator.py's: the keys a config or --key=value set
    if meta['pixels']:
        with ctx:
            sample_images(model, meta, device)
        raise SystemExit(0)
    if 'num_keys' in meta.get('task', {}) and start == '\n':  # a recall model, no prompt: what it learned
        recall_episodes(model, meta['task'], num_samples, device, seed)
        raise SystemExit(0)
    encode, decode = codec(meta)
    if start.startswith('FILE:'):
        try:
            with open(start[5:], 'r', encoding='utf-8') as f:
                start = f.read()
        except (OSError, ValueError) as e:
            raise SystemExit(f"error: cannot read the prompt file {start[5:]} ({e}); give "
                             f"--start=FILE:PATH of a UTF-8 text file, or the prompt itself")
    start_ids = encode(start)
    if not start_ids:
        raise SystemExit(f"error: the prompt {start!r} has no token this model knows; give another "
                         f"--start")
    x = torch.tensor(start_ids, dtype=torch.long, device=device)[None, ...]
    with torch.no_grad(), ctx:
        for k in range(num_samples):
            t0 = time.perf_counter()
            y = model.generate(x, max_new_tokens, temperature=temperature, top_k=top_k,
                               use_cache=use_cache)
            if device_type == 'cuda':
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            print(decode(y[0].tolist()))
            print(f"--------------- {max_new_tokens / dt:,.1f} tokens/s ({max_new_tokens} tokens "
                  f"in {dt:.2f} s, use_cache={use_cache})")
