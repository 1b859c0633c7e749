"""A learned softmax temperature, mixed into a softmax rule (LSA, AttentionX): every softmax path left as it is."""
import math

import torch
import torch.nn as nn


class LearnedTemperature:
    """
    softmax(t · q kᵀ + mask) in place of softmax(q kᵀ / √D + mask), t = exp(log_temperature) learned, init 1/√D
    (LSA's temperature, docs/rules.md#lsa), mixed into a softmax rule (first in its bases). Each softmax path (math,
    SDPA, flex, the cache) is handed q·t·√D, so it runs unchanged and t keeps its gradient (no score_mod captures
    it). A layer built without one (log_temperature None) hands q through as it is.
    """

    def init_temperature(self, learned, per_head=False):  # one t per layer, or one per head
        shape = (self.n_head,) if per_head else ()
        self.log_temperature = nn.Parameter(torch.full(shape, -0.5 * math.log(self.head_dim))) if learned else None

    def sharpen(self, q):  # q·t·√D: softmax's q kᵀ/√D then gives t·q kᵀ
        if self.log_temperature is None:
            return q
        scale = (self.log_temperature.exp() * math.sqrt(self.head_dim)).to(q.dtype).view(-1, 1, 1)  # (H or 1, 1, 1)
        return q * scale

    def attend(self, q, k, v):
        return super().attend(self.sharpen(q), k, v)

    def attend_fused(self, q, k, v):
        return super().attend_fused(self.sharpen(q), k, v)

    def attend_flex(self, q, k, v, masks=None):
        return super().attend_flex(self.sharpen(q), k, v, masks)

    def decode(self, q, k, v, cache):  # the cache keeps k and v as they are: only the new query is scaled
        return super().decode(self.sharpen(q), k, v, cache)
