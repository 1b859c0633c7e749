"""
CIFAR training augmentation as tensor ops on the batch's device (there is no CPU build of torchvision).
Every random function takes a torch.Generator (None: the global RNG) so that runs are reproducible. The generator
may live on another device than the batch (e.g. a CPU generator for a CUDA batch): draws are made on its device.
The official KViT recipe, in the order torchvision applies it (crop pads with black, before normalisation):
    x = normalize(random_flip(random_crop(x_uint8, 4, g), g))                # (B, 3, 32, 32) float
    x, y = mixup_cutmix(x, one_hot_smooth(y, 10, 0.1), 0.8, 1.0, 0.8, g)    # y: (B, 10) soft targets
    loss = soft_cross_entropy(model(x), y)
"""
import numpy as np
import torch
import torch.nn.functional as F

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

def soft_cross_entropy(logits, y_soft):
    # mean over the batch of -sum_k y_k log softmax(logits)_k; (B, K) logits and targets
    return torch.sum(-y_soft * F.log_softmax(logits.float(), dim=-1), dim=-1).mean()
