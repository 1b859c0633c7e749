"""attention='topk': softmax over the k largest scores of each row (docs/rules.md#top-k)."""
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attention import SoftmaxAttention
from machinery.band import query_tiles, tile_mask, tile_queries
from machinery.masks import dense_mask, run_flex, visible_keys
from machinery.selection import topk_boundary


def topk_reference(q, k, v, visible, topk):
    """The formula, every (i, j) pair at once: (B, H, T, D) q, k, v, Vis(i) as a (T, T) bool (None: every key), the
    k kept per row. O(T²) memory: the reference the other paths equal (tests/test_topk.py); `attend` computes the
    same in tiles of queries, each recomputed in backward. No dropout."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))           # s_ij = q_i·k_j/√D, (B, H, T, T)
    if visible is not None:
        s = s.masked_fill(~visible, float('-inf'))                # j in Vis(i) only
    kth = s.topk(min(topk, s.size(-1)), dim=-1).values[..., -1:]  # each row's k-th largest (-inf: fewer than k)
    s = s.masked_fill(s < kth, float('-inf'))                     # the k largest, a tie at the k-th kept whole
    return s.softmax(-1) @ v                                      # y_i = Σ_j softmax_j(s_ij) v_j, (B, H, T, D)


@dataclass
class TopkConfig:
    topk_k: int = 32             # top-k: keys kept per row (a row with fewer visible keys keeps them all)


class TopkAttention(SoftmaxAttention):
    """
    s_ij = q_i·k_j / √D for j in Vis(i);  y_i = Σ_j softmax_j(s_ij over the k largest s_i·) v_j, the others weigh 0
    ("Memory-efficient Transformers via Top-k Attention", Gupta et al. 2021, arXiv 2106.06899; docs/rules.md#top-k)

    Softmax over the k largest scores of each row only, k_eff = min(k, |Vis(i)|): a causal row with k or fewer
    visible keys keeps them all. Vis(i) is softmax's: causal (the GPT), every key (the ViT), or `window`. Nothing is
    learned beyond the projections, and the selection carries no gradient. The cut is a per-row boundary halfway
    between the k-th and the (k+1)-th score (topk_boundary): a tie at the k-th score keeps every tied key (the
    official code's sort keeps exactly k), and flex, which rounds its own way, keeps the same keys. The formula as
    dense code, O(T²): topk_reference (attend_reference). Math path: the paper's query chunking, tiles of
    tile_weights // T queries against the keys they see, each recomputed in backward, so memory is linear in T.
    Flex: a no-grad pre-pass finds each row's boundary and the score_mod keeps the scores at or above it (as
    Krause's). Cache: softmax's (every key and value), the top k taken among them.
    """
    has_bidirectional_form, has_cache, has_flex, fused = True, True, True, False  # no SDPA: the cut needs the scores
    Config, reads = TopkConfig, ('window', 'tile_weights')

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        if not config.topk_k >= 1:
            raise ValueError(f"topk_k must be >= 1 (keys kept per row), got {config.topk_k}")
        self.topk = config.topk_k

    def attend_reference(self, q, k, v):  # the formula (topk_reference) with this layer's Vis(i) and k
        visible = None if self.mask_mod is None else dense_mask(self.mask_mod, q.size(2), q.device)
        return topk_reference(q, k, v, visible, self.topk)

    def attend(self, q, k, v):
        tile_output = lambda start, end, n_keys: self.topk_softmax(self.tile_scores(q, k, start, end, n_keys)) @ \
            v[:, :, :n_keys]                                                             # (B, H, C, D)
        return tile_queries(tile_output, q.size(2), self.tile_weights, self.causal)

    def tile_scores(self, q, k, start, end, n_keys):
        """s_ij = q_i·k_j/√D, queries start..end-1 against keys 0..n_keys-1 (B, H, C, L); -inf where j is hidden."""
        scores = q[:, :, start:end] @ k[:, :, :n_keys].transpose(-1, -2) / math.sqrt(q.size(-1))
        if self.mask_mod is None:
            return scores
        return scores.masked_fill(~tile_mask(self.mask_mod, start, end, n_keys, q.device), float('-inf'))

    def topk_softmax(self, scores):
        """Softmax over each row's k largest scores (at or above its boundary), the rest -inf: weight 0; dropout."""
        scores = scores.masked_fill(scores < topk_boundary(scores, self.topk), float('-inf'))
        return F.dropout(scores.softmax(-1), self.dropout, self.training)

    def attend_flex(self, q, k, v, masks=None):
        # softmax's flex call, the top k kept by each row's boundary from a no-grad pre-pass (nothing captured needs
        # a gradient); no dropout on the weights
        boundary = self.boundaries(q, k)                                                 # (B, H, T)

        def topk_score(score, b, h, q_idx, kv_idx):
            return torch.where(score >= boundary[b, h, q_idx], score, float('-inf'))

        return run_flex(q, k, v, score_mod=topk_score,
                        block_mask=self.flex_masks(q.size(2), q.device) if masks is None else masks)

    @torch.no_grad()
    def boundaries(self, q, k):
        """Each row's top-k boundary (B, H, T), tile by tile, in float32 at least: flex scores in float32, and a
        boundary rounded to bf16 could land on a kept score."""
        q, k = (t.to(torch.promote_types(t.dtype, torch.float32)) for t in (q, k))
        return torch.cat([topk_boundary(self.tile_scores(q, k, *tile), self.topk)[..., 0]
                          for tile in query_tiles(q.size(2), max(1, self.tile_weights // q.size(2)), self.causal)],
                         -1)

    def decode(self, q, k, v, cache):  # (B, H, 1, D): the top k of the keys the cache holds, every one visible
        cache.append(k, v)
        keys, values = cache.tensors()
        return self.topk_softmax(q @ keys.transpose(-1, -2) / math.sqrt(q.size(-1))) @ values

    def ideal_flops(self, T):  # every visible key scored, the k largest summed
        n, C = visible_keys(self, T), self.n_head * self.head_dim
        return 2 * C * n.mean().item() + 2 * C * n.clamp_max(self.topk).mean().item()
