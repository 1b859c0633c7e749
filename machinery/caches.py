"""
Generation: what one layer keeps between tokens. KVCache holds keys and values (every one, or a ring of the last
W); ClusterRingCache a ring of the last W per cluster (rules/routing.py); CacheGroup advances several together (a
two-branch rule's branches, a model's layers); decode_sdpa is one query against what a cache holds. A rule whose
state is not keys and values keeps its own object beside its attend (rules/cluster.py's ClusterCache): it needs
`pos` and `nbytes()`.
"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


class KVCache:
    """One layer's cached tensors (B, H, n, D_i), e.g. k and v, and `pos`, the positions seen so far. capacity None:
    all of them, in buffers that double when full (amortised O(1) per token). capacity W: a ring of the last W,
    position p in slot p % W, which is exactly the window i - W < j <= i of the newest query i."""

    def __init__(self, capacity=None):
        self.capacity, self.pos, self.buffers = capacity, 0, None

    def append(self, *tensors):  # (B, H, T, D_i) each: T new positions
        T = tensors[0].size(2)
        size = self.capacity or max(2 * self.pos, self.pos + T, 64)
        if self.buffers is None or (self.capacity is None and self.pos + T > self.buffers[0].size(2)):
            old, self.buffers = self.buffers, [t.new_zeros(*t.shape[:2], size, t.size(3)) for t in tensors]
            for b, o in zip(self.buffers, old or []):
                b[:, :, :self.pos] = o[:, :, :self.pos]
        if self.capacity is None:
            for b, t in zip(self.buffers, tensors):
                b[:, :, self.pos:self.pos + T] = t
        elif T == 1:  # one token: its slot in the ring, no index tensor
            for b, t in zip(self.buffers, tensors):
                b[:, :, self.pos % self.capacity] = t[:, :, 0]
        else:  # only the last W can ever be seen again
            m = min(T, self.capacity)
            slots = torch.arange(self.pos + T - m, self.pos + T, device=tensors[0].device) % self.capacity
            for b, t in zip(self.buffers, tensors):
                b[:, :, slots] = t[:, :, T - m:]
        self.pos += T

    def tensors(self):  # the held positions, (B, H, min(pos, capacity), D_i) each; a ring's in slot order
        n = self.pos if self.capacity is None else min(self.pos, self.capacity)
        return [b[:, :, :n] for b in self.buffers]

    def nbytes(self):  # the held positions' bytes (a growing buffer may hold up to 2x this, allocated)
        return sum(t.numel() * t.element_size() for t in self.tensors())


class ClusterRingCache:
    """Keys and values by cluster: for each batch row, head and cluster id, a ring of the last `capacity` (W) keys
    and values the cluster received (its r-th key in slot r % W), and `count` (B, H, C), how many it received; a
    head whose ids are all 0 keeps one ring, the last W tokens. O(C·W) per head, at any length."""

    def __init__(self, capacity, clusters):
        self.capacity, self.clusters, self.pos = capacity, clusters, 0
        self.keys = self.values = self.count = None

    def fill(self, k, v, ids):  # a prompt's keys and values (B, H, T, D) and clusters (B, H, T)
        (B, H, T, D), w = k.shape, self.capacity
        self.keys, self.values = (t.new_zeros(B, H, self.clusters, w, D) for t in (k, v))
        one_hot = F.one_hot(ids, self.clusters)                   # (B, H, T, C)
        rank = (one_hot.cumsum(2) * one_hot).sum(-1) - 1           # (B, H, T): the key's number in its cluster
        self.count = one_hot.sum(2)                                # (B, H, C)
        b, h, t = (rank >= self.count.gather(2, ids) - w).nonzero(as_tuple=True)  # the last w of each cluster
        slot = (b, h, ids[b, h, t], rank[b, h, t] % w)
        self.keys[slot], self.values[slot] = k[b, h, t], v[b, h, t]
        self.pos = T

    def append(self, k, v, ids):
        """One token (B, H, 1, D), (B, H, 1) into its cluster's ring; that ring's keys and values (B, H, W, D) and
        which of its slots hold one (B, H, W)."""
        B, H, _, D = k.shape
        b, h = torch.arange(B, device=k.device).view(B, 1), torch.arange(H, device=k.device).view(1, H)
        c = ids[..., 0]                                            # (B, H)
        n = self.count[b, h, c]                                    # keys the cluster held before
        slot = n % self.capacity                                   # its n-th key's slot
        self.keys[b, h, c, slot], self.values[b, h, c, slot] = k[:, :, 0], v[:, :, 0]
        self.count[b, h, c] = n + 1
        self.pos += 1
        held = torch.arange(self.capacity, device=k.device) < (n + 1).unsqueeze(-1)
        return self.keys[b, h, c], self.values[b, h, c], held

    def nbytes(self):
        return sum(t.numel() * t.element_size() for t in (self.keys, self.values, self.count) if t is not None)


class CacheGroup:
    """Caches that advance together, one per part: a two-branch rule's branches (MixAttention), a model's layers
    (model.GenerationCache). `pos` is the first one's; `nbytes()` is what they all hold."""

    def __init__(self, *caches):
        self.caches = caches

    @property
    def pos(self):
        return self.caches[0].pos

    def nbytes(self):
        return sum(c.nbytes() for c in self.caches)


# SDPA's kernels for one query against a cache that grows by a key per token. Not cuDNN's: it builds a new graph
# for every new key length (tens of ms per token on an H100; pytorch#155958), where flash reads any length.
DECODE_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def decode_sdpa(q, k, v):  # q (B, H, 1, D), k, v (B, H, n, D): every cached key is visible
    with sdpa_kernel(DECODE_BACKENDS):
        return F.scaled_dot_product_attention(q, k, v)
