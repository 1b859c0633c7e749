"""
LoRA: fine-tune a frozen model through low-rank updates of some of its Linears.
("LoRA: Low-Rank Adaptation of Large Language Models", Hu et al. 2021, arXiv 2106.09685)

    y = x Wᵀ + b + (α / r) · dropout(x) Aᵀ Bᵀ      A (r, in) random, B (out, r) zero: training starts at W exactly

GPT builds it when lora_rank > 0 (model.py): the Linears named in lora_targets become LoRALinear, and only what a
fine-tune should move is trained (`trainable`): the LoRA matrices, each MixAttention's gate, and every rule's own
parameters (σ, β, λ, γ, seeds). `merge_lora` folds the updates into the weights for sampling and export:

$ python lora.py --ckpt=out-finetune/ckpt.pt --out=out-finetune/merged.pt   # a plain checkpoint, LoRA merged
"""
import math
import os

import torch
import torch.nn as nn

from attention import Attention, MixAttention

class LoRALinear(nn.Linear):
    """An nn.Linear (weight and bias keep their names, so a base model's state dict loads as it is) plus the low-rank
    update lora_B @ lora_A, scaled by alpha / rank."""

    def __init__(self, in_features, out_features, bias, rank, alpha, dropout):
        super().__init__(in_features, out_features, bias=bias)
        self.scale = alpha / rank
        self.lora_A = nn.Parameter(torch.empty(rank, in_features))
        self.lora_B = nn.Parameter(torch.zeros(out_features, rank))  # zero: the update starts at nothing
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))        # as nn.Linear's own weights (and PEFT's A)
        self.lora_dropout = nn.Dropout(dropout)

    def forward(self, x):
        return super().forward(x) + (self.lora_dropout(x) @ self.lora_A.T @ self.lora_B.T) * self.scale

    def delta(self):  # (out, in): what merging adds to the weight
        return lora_delta(self.lora_A, self.lora_B, self.scale)

    def merged(self):
        """A plain nn.Linear computing the same function (without the dropout of training)."""
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                           device=self.weight.device, dtype=self.weight.dtype)
        with torch.no_grad():
            linear.weight.copy_(self.weight + self.delta())
            if self.bias is not None:
                linear.bias.copy_(self.bias)
        return linear


def lora_delta(lora_A, lora_B, scale):
    return scale * lora_B @ lora_A  # (out, r) @ (r, in): the update as one (out, in) matrix


def target_names(lora_targets):
    """'c_attn,c_proj' -> ('c_attn', 'c_proj'): the attribute names of the Linears LoRA adapts."""
    return tuple(name.strip() for name in lora_targets.split(',') if name.strip())


def add_lora(model, rank, alpha, dropout, targets):
    """Replace every nn.Linear whose attribute name is in `targets` by a LoRALinear holding the same weight and bias."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if name in targets and type(child) is nn.Linear:
                lora = LoRALinear(child.in_features, child.out_features, child.bias is not None, rank, alpha, dropout)
                lora.weight, lora.bias = child.weight, child.bias
                setattr(module, name, lora)


def trainable(model):
    """What a LoRA fine-tune trains: the LoRA matrices, the gates of two-branch layers, and the attention rules' own
    parameters (those a rule holds itself, outside its Linears: σ, β, λ, γ, seeds); the rest stays frozen."""
    keep = [p for m in model.modules() if isinstance(m, LoRALinear) for p in (m.lora_A, m.lora_B)]
    keep += [p for m in model.modules() if isinstance(m, MixAttention) for p in m.gate.parameters()]
    keep += [p for m in model.modules() if isinstance(m, Attention) for p in m.parameters(recurse=False)]
    return keep


def freeze_all_but_trainable(model):
    keep = {id(p) for p in trainable(model)}
    for p in model.parameters():
        p.requires_grad_(id(p) in keep)


def merge_lora(model):
    """Fold every LoRALinear into a plain nn.Linear of the same function, in place; returns the model."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, LoRALinear):
                setattr(module, name, child.merged())
    if hasattr(model, 'config'):
        model.config.lora_rank = 0
    return model


def merged_state(state, scale):
    """A state dict with LoRA, as train.py saves it, with each lora_B @ lora_A folded into its weight (scale: alpha /
    rank) and the LoRA entries gone: a base model's state dict."""
    out = {k: v for k, v in state.items() if not k.endswith(('.lora_A', '.lora_B'))}
    for key in state:
        if key.endswith('.lora_A'):
            prefix = key[:-len('lora_A')]
            out[prefix + 'weight'] = state[prefix + 'weight'] + lora_delta(state[key], state[prefix + 'lora_B'], scale)
    return out


if __name__ == '__main__':
    import argparse
    from checkpoint import load_checkpoint, save_checkpoint
    parser = argparse.ArgumentParser(description="Write a checkpoint with its LoRA updates merged into the weights.")
    parser.add_argument('--ckpt', required=True, help="a train.py checkpoint made with lora_rank > 0")
    parser.add_argument('--out', required=True, help="where the merged checkpoint goes")
    args = parser.parse_args()
    checkpoint = load_checkpoint(args.ckpt, 'cpu', hint="pass --ckpt=PATH of a train.py checkpoint")
    model_args = checkpoint['model_args']
    if not model_args.get('lora_rank'):
        raise SystemExit(f"error: {args.ckpt} has no LoRA (lora_rank=0); it is already a plain checkpoint")
    state = merged_state(checkpoint['model'], model_args['lora_alpha'] / model_args['lora_rank'])
    keep = ('model_args', 'iter_num', 'best_val_loss', 'config', 'meta')
    merged = {**{k: checkpoint[k] for k in keep if k in checkpoint}, 'model': state,
              'model_args': {**model_args, 'lora_rank': 0}}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    save_checkpoint(merged, args.out)
    print(f"wrote {args.out}: {len(state)} tensors, LoRA merged (rank {model_args['lora_rank']})")
