"""
A Vision Transformer for 32x32 images (Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words"), built from the
GPT's own Block (model.py) with causal=False, so every attention rule (attention.py, rules/) runs on images unchanged.
Pieces as in timm's vision_transformer.py: conv patch embedding, CLS token, learned position embedding,
drop-path linear over depth (in Block), final LayerNorm, linear head on the CLS token.
"""
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch.nn import functional as F

from attention import flex_mask_builder
from rules import AttentionConfig
from model import GPT, Block, LayerNorm, configure_adamw, init_rules


@dataclass
class ViTConfig(AttentionConfig):
    n_layer: int = 12
    mlp_hidden: int = 0      # MLP hidden width; 0 means 4 * n_embd
    drop_path: float = 0.0   # stochastic depth of the last block; linear from 0 at the first
    patch_size: int = 4
    num_classes: int = 10
    img_size: int = 32
    # derived from the image and patch sizes, never set by hand: attention reads them to know the layout
    causal: bool = field(default=False, init=False)
    grid_size: int = field(default=0, init=False)   # patches per side
    block_size: int = field(default=0, init=False)  # tokens: 1 CLS + grid_size²

    def __post_init__(self):
        if self.patch_size < 1 or self.img_size % self.patch_size:
            sizes = ', '.join(str(p) for p in range(1, self.img_size + 1) if self.img_size % p == 0)
            raise ValueError(f"patch_size={self.patch_size} does not divide img_size={self.img_size}; "
                             f"use one of {sizes}")
        if self.pos_emb != 'learned':
            raise ValueError(f"the ViT adds learned position embeddings: pos_emb must be 'learned', "
                             f"got '{self.pos_emb}'")
        self.grid_size = self.img_size // self.patch_size
        self.block_size = 1 + self.grid_size ** 2


class ViT(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.config = config
        C, T = config.n_embd, config.block_size
        # a patch_size x patch_size conv with the same stride is a Linear on each flattened patch
        self.patch_embed = nn.Conv2d(3, C, kernel_size=config.patch_size, stride=config.patch_size, bias=config.bias)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, C))
        self.pos_embed = nn.Parameter(torch.zeros(1, T, C))  # CLS at position 0, then the patches row by row
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.ModuleList([Block(config, i) for i in range(config.n_layer)])
        self.ln_f = LayerNorm(C, bias=config.bias)
        self.head = nn.Linear(C, config.num_classes, bias=True)
        self.build_flex_masks = flex_mask_builder(config.flex)
        # the official KViT code's init: PyTorch's defaults for every layer, CLS and positions N(0, 0.02) truncated.
        # At 400 CPU steps it beat the GPT's init (N(0, 0.02), scaled c_proj) by 0.02-0.05 test accuracy (docs/RESULTS.md)
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        init_rules(self)

    def get_num_params(self, non_embedding=True):
        """Parameter count; the position embedding is not counted (as for the GPT)."""
        n_params = sum(p.numel() for p in self.parameters())
        return n_params - (self.pos_embed.numel() if non_embedding else 0)

    def forward(self, x, targets=None):
        # x: (B, 3, H, W) normalised floats; targets: (B,) class indices or (B, num_classes) soft targets
        x = self.patch_embed(x).flatten(2).transpose(1, 2)              # (B, g², C)
        x = torch.cat((self.cls_token.expand(x.size(0), -1, -1), x), 1)  # (B, T, C)
        x = self.drop(x + self.pos_embed)
        masks = self.build_flex_masks([block.attn for block in self.h], x.size(1), x.device)  # None off flex
        for i, block in enumerate(self.h):
            x = block(x, None, None if masks is None else masks[i])
        logits = self.head(self.ln_f(x[:, 0]))                          # (B, num_classes), from the CLS token
        if targets is None:
            return logits, None
        if targets.dim() == 2:  # MixUp / CutMix / label smoothing
            return logits, soft_cross_entropy(logits, targets)
        return logits, F.cross_entropy(logits.float(), targets)

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        return configure_adamw(self, weight_decay, learning_rate, betas, device_type)

    estimate_mfu = GPT.estimate_mfu  # the same count: 6N per token plus attention over block_size tokens


def soft_cross_entropy(logits, y_soft):
    # mean over the batch of -sum_k y_k log softmax(logits)_k; (B, K) logits and targets
    return torch.sum(-y_soft * F.log_softmax(logits.float(), dim=-1), dim=-1).mean()
