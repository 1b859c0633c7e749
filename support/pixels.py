"""
The pixel model (a GPT over subpixels, data.py's 'pixels' kind), what sample.py and bench.py share: drawing images
subpixel by subpixel with each rule's KV cache (GPT.generate), timed the same way everywhere (a warm-up left out,
the device synchronised), the memory those caches hold, and a PNG grid of the results. An image is a sequence of
H*W*C tokens in raster order, channels side by side; with no prompt, the first subpixel is drawn uniformly.
"""
import time

import numpy as np
import torch
from PIL import Image


def synchronize(device):
    if 'cuda' in str(device):
        torch.cuda.synchronize()


@torch.no_grad()
def draw(model, n, batch_size, tokens, temperature=1.0, top_k=None, prompts=None, use_cache=True):
    """n sequences of `tokens` subpixels, `batch_size` at a time: (n, tokens) int64 on the model's device. prompts
    (n, P) start each sequence (completion); else a first subpixel uniform over 256."""
    device, out = next(model.parameters()).device, []
    for start in range(0, n, batch_size):
        b = min(batch_size, n - start)
        first = torch.randint(256, (b, 1), device=device) if prompts is None else prompts[start:start + b]
        out.append(model.generate(first, tokens - first.size(1), temperature, top_k or None, use_cache))
    return torch.cat(out)


def timed_draw(model, n, batch_size, tokens, temperature=1.0, top_k=None, prompts=None, use_cache=True):
    """draw(...) and its images/s: the wall time of all n, after a warm-up of 8 tokens at the same batch size (left
    out), with the device synchronised before and after. Returns (sequences, images per second, seconds)."""
    device = next(model.parameters()).device
    warm = None if prompts is None else prompts[:batch_size]
    warm_tokens = (1 if warm is None else warm.size(1)) + 8
    draw(model, min(batch_size, n), batch_size, warm_tokens, temperature, top_k, warm, use_cache)
    synchronize(device)
    t0 = time.perf_counter()
    seqs = draw(model, n, batch_size, tokens, temperature, top_k, prompts, use_cache)
    synchronize(device)
    dt = time.perf_counter() - t0
    return seqs, n / dt, dt


@torch.no_grad()
def cache_mib(model, batch_size, tokens):
    """MiB the layers' caches hold for `batch_size` sequences after `tokens` positions (what the last subpixel's
    step reads: softmax every key, a window or Krause the last W), filled by each layer's own fill on zero
    activations."""
    p = next(model.parameters())
    x = torch.zeros(batch_size, tokens, model.config.n_embd, device=p.device, dtype=p.dtype)
    return model.filled_cache(x).nbytes() / 2**20


def to_images(seqs, shape):
    """(N, H*W*C) tokens -> (N, H, W, C) uint8 on the CPU."""
    return seqs.cpu().to(torch.uint8).view(-1, *shape).numpy()


def png_grid(images, path, columns=8, scale=4, pad=4):
    """(N, H, W, C) uint8 images in a grid at most `columns` wide, as many rows as they fill, each pixel a scale x scale
    block (a 32-pixel image is too small to see), on a white ground, written to path as PNG (grey for C=1)."""
    images = images.repeat(scale, axis=1).repeat(scale, axis=2)  # nearest neighbour: every pixel stays as drawn
    n, h, w, c = images.shape
    columns = min(columns, n)
    rows = -(-n // columns)
    grid = np.full((rows * (h + pad) + pad, columns * (w + pad) + pad, c), 255, dtype=np.uint8)
    for i, im in enumerate(images):
        r, col = divmod(i, columns)
        grid[pad + r * (h + pad):pad + r * (h + pad) + h, pad + col * (w + pad):pad + col * (w + pad) + w] = im
    Image.fromarray(grid[..., 0] if c == 1 else grid).save(path)
