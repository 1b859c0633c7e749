"""
Batches of a prepared dataset for train.py, whatever its kind (prepare/__init__.py): 'text' is a uint16 token stream
read at random offsets, 'examples' are fixed (x, y) rows, 'image' are uint8 images kept on the device and augmented
there, 'pixels' are those images read as sequences of subpixels (raster order, channels side by side: one token
each, 256 values) for an autoregressive image model, which predicts subpixels 2..N from their prefix. A batch is
named by its rows ix (and a training batch of images by an augmentation seed too), drawn from a generator the
caller owns, so a resumed run and N DDP processes read exactly what one uninterrupted run would.
"""
import math
import os

import numpy as np
import torch

from augment import (CIFAR10_MEAN, CIFAR10_STD, CIFAR100_MEAN, CIFAR100_STD, mixup_cutmix, normalize,
                     one_hot_smooth, random_crop, random_flip)
from prepare import dataset_kind


def bits_per_dim(loss):
    """A mean cross-entropy in nats per predicted subpixel, in bits per subpixel (the image models' measure)."""
    return loss / math.log(2)


class Batches:
    """Batches of `dataset` in data_dir, whose meta.json and {split: rows} (tokens for text, else examples)
    prepare.check_files gives. A ValueError if num_classes (0: take it from the data) disagrees with the data."""

    def __init__(self, dataset, data_dir, meta, split_rows, block_size, batch_size, device, num_classes=0,
                 augment=True, mixup_alpha=0.0, cutmix_alpha=0.0, cutmix_prob=0.8, label_smoothing=0.0):
        self.kind = dataset_kind(dataset)
        self.data_dir, self.meta, self.split_rows = data_dir, meta, split_rows
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

    def load_batch(self, split, ix, augment_seed=None):
        """Rows ix of a split as (x, y) on the device; y is -1 where there is nothing to predict."""
        if self.kind == 'image':
            return self.image_batch(split, ix, augment_seed)
        if self.kind == 'text':
            # a fresh memmap per batch, as nanoGPT does, avoids a memory leak over long runs
            data = np.memmap(os.path.join(self.data_dir, f'{split}.bin'), dtype=np.uint16, mode='r')
            T = self.block_size
            x = torch.stack([torch.from_numpy(data[i:i + T].astype(np.int64)) for i in ix.tolist()])  # (B, T)
            y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + T].astype(np.int64)) for i in ix.tolist()])
        elif self.kind == 'pixels':
            rows = np.sort(ix.numpy())  # sorted reads from the memmap (the image dataset's own file)
            images = np.load(os.path.join(self.data_dir, f'{split}_x.npy'), mmap_mode='r')[rows]  # (B, H, W, C)
            seq = torch.from_numpy(images.reshape(len(rows), -1).astype(np.int64))  # (B, H*W*C) in raster order
            x, y = seq[:, :-1], seq[:, 1:]  # (B, T) each, T = H*W*C - 1
        else:
            rows = np.sort(ix.numpy())  # sorted reads from the memmap; the order within a batch does not matter
            x, y = (np.load(os.path.join(self.data_dir, f'{split}_{part}.npy'), mmap_mode='r')[rows] for part in 'xy')
            x, y = torch.from_numpy(x.astype(np.int64)), torch.from_numpy(y.astype(np.int64))  # (B, T) each
        if 'cuda' in self.device:
            return x.pin_memory().to(self.device, non_blocking=True), y.pin_memory().to(self.device, non_blocking=True)
        return x.to(self.device), y.to(self.device)

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
