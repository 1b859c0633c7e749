"""
Batches of a prepared dataset for train.py, whatever its kind (prepare/catalog.py): 'text' is a uint16 token stream
read at random offsets, 'examples' are fixed (x, y) rows, 'image' are uint8 images kept on the device and augmented
there, 'pixels' are those images read as sequences of subpixels (raster order, channels side by side: one token
each, 256 values) for the pixel model, which predicts subpixels 2..N from their prefix. A batch is named by its
rows ix (and a training batch of images by an augmentation seed too), drawn from a generator the caller owns, so a
resumed run and N DDP processes read exactly what one uninterrupted run would.
"""
import hashlib
import math
import os

import numpy as np
import torch
import torch.nn.functional as F

from prepare import dataset_kind
from prepare.folder import hold_for_reading, read_meta


# -----------------------------------------------------------------------------
# augmentation
# CIFAR training augmentation as tensor ops on the batch's device (there is no CPU build of torchvision).
# Every random function takes a torch.Generator (None: the global RNG) so that runs are reproducible. The generator
# may live on another device than the batch (e.g. a CPU generator for a CUDA batch): draws are made on its device.
# The official KViT recipe, in the order torchvision applies it (crop pads with black, before normalisation):
#     x = normalize(random_flip(random_crop(x_uint8, 4, g), g))                # (B, 3, 32, 32) float
#     x, y = mixup_cutmix(x, one_hot_smooth(y, 10, 0.1), 0.8, 1.0, 0.8, g)    # y: (B, 10) soft targets
#     loss = soft_cross_entropy(model(x), y)

CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)

def _device(x, generator):
    return generator.device if generator is not None else x.device

def normalize(x, mean=CIFAR10_MEAN, std=CIFAR10_STD):
    # (B, H, W, 3) uint8 -> (B, 3, H, W) float, per-channel standardised
    x = x.permute(0, 3, 1, 2).float() / 255
    mean = torch.tensor(mean, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(std, device=x.device).view(1, 3, 1, 1)
    return (x - mean) / std

def crop(x, top, left, pad=4):
    # x (B, H, W, C); top, left (B,) offsets into the zero-padded image, each in [0, 2*pad]
    B, H, W, C = x.shape
    xp = F.pad(x, (0, 0, pad, pad, pad, pad))  # (B, H+2p, W+2p, C), zeros = black pixels
    rows = top.view(B, 1) + torch.arange(H, device=x.device)  # (B, H)
    cols = left.view(B, 1) + torch.arange(W, device=x.device)  # (B, W)
    batch = torch.arange(B, device=x.device).view(B, 1, 1)
    return xp[batch, rows.view(B, H, 1), cols.view(B, 1, W)]  # (B, H, W, C)

def random_crop(x, pad=4, generator=None):
    # RandomCrop(32, padding=pad): an independent offset per image
    offsets = torch.randint(0, 2 * pad + 1, (2, x.shape[0]), generator=generator, device=_device(x, generator))
    top, left = offsets.to(x.device)
    return crop(x, top, left, pad)

def random_flip(x, generator=None):
    # horizontal flip of each (B, H, W, C) image with probability 0.5
    flip = torch.rand(x.shape[0], generator=generator, device=_device(x, generator)).to(x.device) < 0.5
    return torch.where(flip.view(-1, 1, 1, 1), x.flip(2), x)

def one_hot_smooth(y, num_classes, smoothing=0.0):
    # (B,) int -> (B, num_classes): smoothing spread uniformly over all classes, the target keeps the rest
    off = smoothing / num_classes
    y_soft = torch.full((y.shape[0], num_classes), off, device=y.device)
    return y_soft.scatter_(1, y.view(-1, 1), 1.0 - smoothing + off)

def cutmix_box(lam, H, W, rng):
    # a box of area (1 - lam) H W centred uniformly at random, clipped to the image: (y0, y1, x0, x1)
    cut_h, cut_w = int(H * np.sqrt(1 - lam)), int(W * np.sqrt(1 - lam))
    cy, cx = rng.integers(H), rng.integers(W)
    y0, y1 = np.clip([cy - cut_h // 2, cy + cut_h - cut_h // 2], 0, H)
    x0, x1 = np.clip([cx - cut_w // 2, cx + cut_w - cut_w // 2], 0, W)
    return int(y0), int(y1), int(x0), int(x1)

def mixup_cutmix(x, y_soft, mixup_alpha=0.8, cutmix_alpha=1.0, cutmix_prob=0.8, generator=None):
    # timm-style batch mixing: one lam per batch, image b is paired with image B-1-b (the batch flipped)
    # x (B, C, H, W) float, y_soft (B, K) -> mixed x (B, C, H, W), mixed y (B, K); inputs are not modified
    if mixup_alpha <= 0 and cutmix_alpha <= 0:
        return x, y_soft
    # one draw from the torch RNG seeds numpy for the per-batch scalars: torch has no Beta sampler with a generator
    seed = torch.randint(0, 2**62, (), generator=generator, device=_device(x, generator)).item()
    rng = np.random.default_rng(seed)
    use_cutmix = cutmix_alpha > 0 and (mixup_alpha <= 0 or rng.random() < cutmix_prob)
    lam = float(rng.beta(cutmix_alpha, cutmix_alpha) if use_cutmix else rng.beta(mixup_alpha, mixup_alpha))
    x_flip = x.flip(0)
    if use_cutmix:
        H, W = x.shape[-2:]
        y0, y1, x0, x1 = cutmix_box(lam, H, W, rng)
        x = x.clone()
        x[..., y0:y1, x0:x1] = x_flip[..., y0:y1, x0:x1]
        lam = 1 - (y1 - y0) * (x1 - x0) / (H * W)  # the box may have been clipped: lam = area kept
    else:
        x = lam * x + (1 - lam) * x_flip
    return x, lam * y_soft + (1 - lam) * y_soft.flip(0)


class DataChanged(ValueError):
    """A data file shrank, vanished or was written again while a run read it, or its folder was prepared again."""


def file_stamp(path):
    """(size, modification time in ns, inode): what a write in place or a rename onto the file changes."""
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns, st.st_ino


def sampled_digest(path, blocks=4, block=4096):
    """A digest of `blocks` blocks spread over the file, its first and last among them: a rewrite that kept the size
    and the modification time shows, for a few reads."""
    size, h = os.path.getsize(path), hashlib.blake2b(digest_size=16)
    with open(path, 'rb') as f:
        for i in range(blocks):
            f.seek(max(0, size - block) * i // (blocks - 1))
            h.update(f.read(block))
    return h.hexdigest()


def differences(old, new, prefix=''):
    """'key=old is now new' for each setting of two meta.json dicts that differs (a nested dict's keys by name)."""
    out = []
    for key in [k for k in {**old, **new} if old.get(k) != new.get(k)]:
        if isinstance(old.get(key), dict) and isinstance(new.get(key), dict):
            out += differences(old[key], new[key], f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}={old.get(key)!r} is now {new.get(key)!r}")
    return out


def bits_per_dim(loss):
    """A mean cross-entropy in nats per predicted subpixel, in bits per subpixel (the pixel model's measure)."""
    return loss / math.log(2)


def answer_counts(logits, targets):
    """(right, asked): of the targets that ask for an answer (-1: none), how many the logits' argmax gets right."""
    asked = targets != -1
    return (logits.argmax(-1) == targets)[asked].sum().item(), asked.sum().item()


class Batches:
    """Batches of `dataset` in data_dir, whose meta.json and {split: rows} (tokens for text, else examples)
    prepare.check_files gives. A ValueError if num_classes (0: take it from the data) disagrees with the data.
    on_change(what, todo): what a data file that shrinks, vanishes or is written again mid-run does (train.py: stop
    in one line saying what is kept); None: a DataChanged. Each file read batch by batch is stamped when the run
    begins (size, modification time, inode: checked at every batch) and sampled (check_unchanged)."""

    def __init__(self, dataset, data_dir, meta, split_rows, block_size, batch_size, device, num_classes=0,
                 augment=True, mixup_alpha=0.0, cutmix_alpha=0.0, cutmix_prob=0.8, label_smoothing=0.0,
                 on_change=None):
        self.kind, self.on_change = dataset_kind(dataset), on_change
        self.data_dir, self.meta, self.split_rows = data_dir, meta, split_rows
        self.reading = hold_for_reading(data_dir)  # no preparation rewrites the folder while this run reads it
        self.block_size, self.batch_size, self.device = block_size, batch_size, device
        self.augment, self.label_smoothing = augment, label_smoothing
        self.mixup_alpha, self.cutmix_alpha, self.cutmix_prob = mixup_alpha, cutmix_alpha, cutmix_prob
        if self.kind == 'image':
            if num_classes and num_classes != meta['num_classes']:
                raise ValueError(f"num_classes={num_classes} but {data_dir} holds {meta['num_classes']} classes "
                                 f"({meta['dataset']}); set num_classes=0 to take it from the data, or check "
                                 f"dataset and data_dir")
            # the whole dataset lives on the device as uint8 (CIFAR: 180 MB); a batch is an index into it
            self.images = {}  # split -> (x, y): (N, 32, 32, 3) uint8, (N,)
            for split in ('train', 'val'):
                x, y = (np.load(os.path.join(data_dir, f'{split}_{part}.npy')) for part in 'xy')
                self.images[split] = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
            self.image_stats = (CIFAR100_MEAN, CIFAR100_STD) if dataset == 'cifar100' else (CIFAR10_MEAN, CIFAR10_STD)
        if self.kind == 'pixels':
            self.image_shape = np.load(os.path.join(data_dir, 'val_x.npy'), mmap_mode='r').shape[1:]  # (H, W, C)
            tokens = int(np.prod(self.image_shape))
            if block_size != tokens - 1:  # no start token: the first subpixel is read, never predicted
                raise ValueError(f"block_size={block_size} but {dataset} images are {tokens:,} subpixels, of which a "
                                 f"model reads the first {tokens - 1:,}; pass --block_size={tokens - 1}")
        # the files read batch by batch, stamped and sampled now: one that changes mid-run is caught (file,
        # check_unchanged); images are read once, into memory, and a change on disk does not touch the run
        names = {'text': ('{}.bin',), 'examples': ('{}_x.npy', '{}_y.npy'), 'pixels': ('{}_x.npy',)}.get(self.kind, ())
        paths = {name.format(split): os.path.join(data_dir, name.format(split))
                 for split in ('train', 'val') for name in names}
        self.stamps = {name: file_stamp(path) for name, path in paths.items()}
        self.digests = {name: sampled_digest(path) for name, path in paths.items()}
        # distinct batch rows: a text row is a window of block_size tokens and its targets, one token further
        self.sizes = {split: n - block_size if self.kind == 'text' else n for split, n in split_rows.items()}

    @property
    def model_sizes(self):
        """What the model takes from the data: the classes of images, else the vocabulary."""
        if self.kind == 'image':
            return {'num_classes': self.meta['num_classes']}
        if self.kind == 'pixels':
            return {'vocab_size': 256}  # one token per 8-bit subpixel value
        gpt2 = self.meta['encoding'] == 'gpt2'
        return {'vocab_size': 50304 if gpt2 else self.meta['vocab_size']}  # GPT-2's 50257 padded for speed

    def check_sizes(self, val_tokens_needed):
        """ValueError unless every split holds a whole batch row; val_tokens_needed is what a run's evaluation
        reads (prepare.val_tokens_needed), for the advice on web text."""
        for split in ('train', 'val'):
            if self.sizes[split] < 1:
                raise ValueError(self.too_little_data(split, val_tokens_needed))

    def too_little_data(self, split, val_tokens_needed):
        """What to pass when a split holds no whole batch row, never advice that leads back to the same data."""
        if self.kind != 'text':
            return f"{self.data_dir} holds no {split} examples: it is damaged; delete it to prepare it again"
        have = (f"{self.data_dir}/{split}.bin holds {self.split_rows[split]:,} tokens, fewer than block_size + 1 = "
                f"{self.block_size + 1}")
        if split == 'val' and 'val_every' in self.meta and self.meta.get('val_first', 0) < val_tokens_needed:
            return (f"{have}: it was prepared for a smaller run; pass --data_dir=ANOTHER_FOLDER (or delete this one) "
                    f"and train.py prepares it again, its first {val_tokens_needed:,} tokens in val")  # web text
        if not self.meta.get('complete', True):  # web text prepared up to a budget: there is more of its source
            return (f"{have}, and it holds part of its source (complete=false in its meta.json): pass "
                    f"--data_dir=ANOTHER_FOLDER (or delete this one) and train.py prepares it again")
        return (f"{have}, and all of its source is in it: pass a smaller --block_size, or a larger --data_source "
                f"with --data_dir=ANOTHER_FOLDER")

    def iteration_rows(self, generator, steps, rank=0, world_size=1):
        """The (rows, augmentation seed) of each training micro-batch of one optimizer step for process `rank`:
        every process draws the same global batch from the same generator and takes its own micro-batches, so N
        processes see what one process would see. Only images draw seeds (after the rows: text batches are as
        they always were)."""
        n = world_size * steps
        ix = torch.randint(self.sizes['train'], (n, self.batch_size), generator=generator)
        seeds = torch.randint(2 ** 62, (n,), generator=generator).tolist() if self.kind == 'image' else [None] * n
        mine = slice(rank * steps, (rank + 1) * steps)
        return list(zip(ix[mine], seeds[mine]))

    def full_split_starts(self, split='val'):
        """The rows that cover a split once: text in consecutive non-overlapping windows of block_size tokens (the
        last partial window left out), examples and images every row."""
        if self.kind == 'text':
            return torch.arange(0, self.split_rows[split] - self.block_size, self.block_size)  # y needs i+1..i+T
        return torch.arange(self.split_rows[split])

    def file(self, name):
        """The path of data file `name` (one load_batch reads), unless it shrank, vanished or was written again since
        the run began (the folder deleted, or prepared again by another process): then changed() says so, naming
        it. An os.stat per batch: microseconds, and a truncated file is never read as a batch (nor memory-mapped past
        its end)."""
        path = os.path.join(self.data_dir, name)
        try:
            stamp = file_stamp(path)
        except OSError as e:
            self.changed(f"{path} is gone ({e.strerror}): the data changed during the run")
        if stamp[0] != self.stamps[name][0]:
            self.changed(f"{path} holds {stamp[0]:,} bytes, {self.stamps[name][0]:,} when the run began: the data "
                         f"changed during the run")
        if stamp != self.stamps[name]:
            self.changed(f"{path} was written again during the run, at the same size (another modification time or "
                         f"file): the data changed during the run")
        return path

    def check_unchanged(self):
        """At each evaluation, before a checkpoint: every file still holds the blocks it held when the run began (a
        rewrite that kept the size and the time), and meta.json the same settings (the folder prepared again, with
        other settings); else changed() says which. A few reads per file."""
        if self.kind == 'image':
            return
        for name, before in self.digests.items():
            path = self.file(name)
            if sampled_digest(path) != before:
                self.changed(f"{path} holds other bytes than when the run began (rewritten in place, at the same "
                             f"size and time): the data changed during the run")
        path = os.path.join(self.data_dir, 'meta.json')
        try:
            meta = read_meta(self.data_dir)
        except ValueError:  # damaged: being written this moment, or by hand
            self.changed(f"{path} cannot be read: the data folder changed during the run")
        if meta is None:
            self.changed(f"{path} is gone: the data folder changed during the run")
        if meta != self.meta:
            self.changed(f"{path} was written again ({', '.join(differences(self.meta, meta)[:3])}): the data folder "
                         f"was prepared again during the run (a run of other data settings needs a --data_dir of its "
                         f"own)")

    def changed(self, what):
        """A data file changed mid-run: on_change(what, what to do) where the caller gave one (train.py: one line with
        what is kept), else a DataChanged."""
        todo = f"restore {self.data_dir}, or delete it to prepare it again"
        if self.on_change is not None:
            self.on_change(what, todo)
        raise DataChanged(f"{what}; {todo}")

    def load_batch(self, split, ix, augment_seed=None):
        """Rows ix of a split as (x, y) on the device; y is -1 where there is nothing to predict."""
        if self.kind == 'image':
            return self.image_batch(split, ix, augment_seed)
        try:
            x, y = self.read_batch(split, ix)
        except DataChanged:  # file() said which file and how: not said again, worse
            raise
        except (OSError, ValueError) as e:  # changed between the size check and the read
            why = (str(e).splitlines() or [''])[0][:150]
            self.changed(f"{self.data_dir} cannot be read ({type(e).__name__}: {why}): the data changed during the run")
        if 'cuda' in self.device:
            return x.pin_memory().to(self.device, non_blocking=True), y.pin_memory().to(self.device, non_blocking=True)
        return x.to(self.device), y.to(self.device)

    def read_batch(self, split, ix):
        """Rows ix of a split as CPU (x, y) int64, from the files (text, examples, pixels)."""
        if self.kind == 'text':
            # a fresh memmap per batch, as nanoGPT does, avoids a memory leak over long runs
            data = np.memmap(self.file(f'{split}.bin'), dtype=np.uint16, mode='r')
            T = self.block_size
            x = torch.stack([torch.from_numpy(data[i:i + T].astype(np.int64)) for i in ix.tolist()])  # (B, T)
            y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + T].astype(np.int64)) for i in ix.tolist()])
        elif self.kind == 'pixels':
            rows = np.sort(ix.numpy())  # sorted reads from the memmap (the image dataset's own file)
            images = np.load(self.file(f'{split}_x.npy'), mmap_mode='r')[rows]  # (B, H, W, C)
            seq = torch.from_numpy(images.reshape(len(rows), -1).astype(np.int64))  # (B, H*W*C) in raster order
            x, y = seq[:, :-1], seq[:, 1:]  # (B, T) each, T = H*W*C - 1
        else:
            rows = np.sort(ix.numpy())  # sorted reads from the memmap; the order within a batch does not matter
            x, y = (np.load(self.file(f'{split}_{part}.npy'), mmap_mode='r')[rows] for part in 'xy')
            x, y = torch.from_numpy(x.astype(np.int64)), torch.from_numpy(y.astype(np.int64))  # (B, T) each
        return x, y

    def image_batch(self, split, ix, augment_seed=None):
        """Rows ix as normalised images (B, 3, 32, 32) and labels (B,). A training batch (augment_seed given) is
        augmented on the device; with MixUp/CutMix or label smoothing its labels become soft targets (B, K)."""
        x, y = (t[ix.to(self.device)] for t in self.images[split])  # (B, 32, 32, 3) uint8, (B,)
        if augment_seed is None:
            return normalize(x, *self.image_stats), y
        generator = torch.Generator(self.device).manual_seed(augment_seed)
        if self.augment:
            x = random_flip(random_crop(x, 4, generator), generator)
        x = normalize(x, *self.image_stats)
        if self.mixup_alpha > 0 or self.cutmix_alpha > 0 or self.label_smoothing > 0:
            y = one_hot_smooth(y, self.meta['num_classes'], self.label_smoothing)
            x, y = mixup_cutmix(x, y, self.mixup_alpha, self.cutmix_alpha, self.cutmix_prob, generator)
        return x, y
