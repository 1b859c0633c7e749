"""mix=True: a softmax branch beside any rule of the registry, mixed per token (docs/rules.md#krause)."""
import math
from dataclasses import replace

import torch
import torch.nn as nn

from attention import Attention, SoftmaxAttention
from machinery.caches import CacheGroup


class MixAttention(Attention):
    """
    y = g_0 · y_softmax + g_1 · y_rule,   g = softmax(Linear(2C → 2)([y_softmax, y_rule]))   per token

    Two attention layers side by side: causal softmax attention, and the rule `attention` names, each with its own
    q/k/v/out projections, mixed by a learned gate that starts at 0.8 for the softmax branch (mix=True). Trained from
    scratch with attention='krause' it is the Krause paper's language-model form; on a pretrained model
    (support/pretrained.py) the softmax branch is the pretrained attention and the rule's branch a parallel shortcut
    that starts as a copy of it. In the frame: project gives both branches' tensors, softmax's first; attend gives
    both per-head outputs side by side, (B, H', T, 2D); out projects each through its branch and gates them.
    mix_matched=True gives each branch half the heads (H' = H/2 of the same size D: q, k, v C → C/2, out C/2 → C),
    so the pair holds one softmax layer's attention parameters, plus the gate and the rule's own: the parameter-
    matched form of a comparison with softmax. Otherwise H' = H and the pair holds twice softmax's.
    """
    # has_*: where the rule's branch has them (set per layer, below); the softmax branch has all of them
    has_cache = True
    has_flex = True
    fused = True
    has_kernel = True
    projections = None  # each branch brings its own

    def __init__(self, config, layer_idx, rule):  # rule: the class of the rule's branch (the registry's)
        if not config.causal:
            raise ValueError("mix is the language-model form (causal=True); use mix=False in a ViT")
        super().__init__(config, layer_idx)
        branch = self.branch_config(config)
        self.softmax = SoftmaxAttention(branch, layer_idx)
        self.rule = rule(branch, layer_idx)
        if config.mix_matched:  # each branch reads from and writes to the C-wide residual stream
            for layer in (self.softmax, self.rule):
                layer.c_attn = nn.Linear(config.n_embd, layer.c_attn.out_features, bias=config.bias)
                layer.c_proj = nn.Linear(layer.c_proj.in_features, config.n_embd, bias=config.bias)
        self.has_cache, self.has_flex, self.has_kernel = self.rule.has_cache, self.rule.has_flex, self.rule.has_kernel
        self.gate = nn.Linear(2 * config.n_embd, 2)
        if self.rule.weights_note:  # analyze.py: the mix is then no distribution either
            self.weights_note = self.rule.weights_note
        if self.rule.first_token_note:  # nor is token 0's share of it meaningful
            self.first_token_note = self.rule.first_token_note

    @staticmethod
    def branch_config(config):
        """A branch's settings: the model's, or with mix_matched half the heads at the same head size (C/2 wide)."""
        if not config.mix_matched:
            return config
        if config.n_head % 2:
            raise ValueError(f"mix_matched=True gives each branch half the heads, and n_head={config.n_head} is odd; "
                             f"pass an even --n_head, or --mix_matched=False")
        return replace(config, n_head=config.n_head // 2, n_embd=config.n_embd // 2)

    def ideal_flops(self, T):  # the softmax branch's and the rule's
        return self.softmax.ideal_flops(T) + self.rule.ideal_flops(T)

    def init_extra(self):
        nn.init.normal_(self.gate.weight, std=0.01)
        with torch.no_grad():
            self.gate.bias.copy_(torch.tensor([math.log(0.8 / 0.2), 0.0]))  # softmax(bias) = (0.8, 0.2)

    def project(self, x, offset=0):
        return self.softmax.project(x, offset) + self.rule.project(x, offset)  # softmax's q, k, v, then the rule's

    def attend(self, q, k, v, *rule_tensors):
        return torch.cat([self.softmax.attend(q, k, v), self.rule.attend(*rule_tensors)], -1)

    def attend_fused(self, q, k, v, *rule_tensors):  # the softmax branch on SDPA, the rule's on its own SDPA or math
        rule = self.rule.attend_fused if self.rule.fused else self.rule.attend
        return torch.cat([self.softmax.attend_fused(q, k, v), rule(*rule_tensors)], -1)

    def attend_kernel(self, q, k, v, *rule_tensors):  # the softmax branch on SDPA (flash), the rule's on its kernel
        return torch.cat([self.softmax.attend_fused(q, k, v), self.rule.attend_kernel(*rule_tensors)], -1)

    def attend_flex(self, q, k, v, *rule_tensors, masks=None):  # the softmax branch through SDPA: flash on a GPU
        return torch.cat([self.softmax.attend_fused(q, k, v), self.rule.attend_flex(*rule_tensors, masks=masks)], -1)

    def flex_masks(self, T, device):  # the rule's: the softmax branch runs SDPA
        return self.rule.flex_masks(T, device)

    def new_cache(self):  # the softmax branch's (every key unless `window`: grows) beside the rule's own
        return CacheGroup(self.softmax.new_cache(), self.rule.new_cache())

    def fill(self, cache, q, k, v, *rule_tensors):
        self.softmax.fill(cache.caches[0], q, k, v)
        self.rule.fill(cache.caches[1], *rule_tensors)

    def decode(self, q, k, v, *rule_tensors, cache):
        return torch.cat([self.softmax.decode(q, k, v, cache.caches[0]),
                          self.rule.decode(*rule_tensors, cache=cache.caches[1])], -1)

    def out(self, y):  # (B, H, T, 2D): the two branches' heads side by side
        y_softmax, y_rule = self.softmax.out(y[..., :self.head_dim]), self.rule.out(y[..., self.head_dim:])
        return self.gated_sum(y_softmax, y_rule, self.gates(y_softmax, y_rule))

    def gates(self, y_softmax, y_rule):  # (B, T, C) each -> (B, T, 2): each token's share of the two branches
        return self.gate(torch.cat([y_softmax, y_rule], dim=-1)).softmax(-1)

    @staticmethod
    def gated_sum(a, b, g):  # g_0·a + g_1·b
        return g[..., :1] * a + g[..., 1:] * b

    @torch.no_grad()
    def branch_weights(self, *tensors):
        """For analysis (short T, eval mode): (W_softmax, W_rule) (B, H, T, T), each branch's own attention_weights,
        and the gates g (B, T, 2) from the two branches' outputs, from what project returns."""
        q, k, v, *rule_tensors = tensors
        device = q.device
        g = self.gates(self.softmax.out(self.softmax.path(device, flex=False)(q, k, v)),
                       self.rule.out(self.rule.path(device, flex=False)(*rule_tensors)))
        return self.softmax.attention_weights(q, k, v), self.rule.attention_weights(*rule_tensors), g

    def attention_weights(self, *tensors):
        # each token's output is g_0 of the softmax branch's plus g_1 of the rule's: its weights mix the same way
        w_softmax, w_rule, g = self.branch_weights(*tensors)
        return self.gated_sum(w_softmax, w_rule, g.unsqueeze(1))  # g (B, 1, T, 2): each g_i (B, 1, T, 1)
