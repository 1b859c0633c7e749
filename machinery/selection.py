"""
The top k of each row, kept by a boundary: the selection Krause and top-k attention share (their math paths, flex's
pre-pass). The boundary lies halfway between the k-th and the (k+1)-th largest score, so every path keeps the same
keys, whatever its rounding. The Krause kernel selects the same way in registers (machinery/kernels/krause.py).
"""
import numpy as np
import torch


def topk_boundary(x, k):
    """(..., n) -> (..., 1), no gradient: halfway between the k-th and the (k+1)-th largest value along the last
    dim, so the top k are exactly the values at or above it (a tie at the k-th keeps all of it). A row with k or
    fewer finite values gives -inf: keep them all."""
    n = x.size(-1)
    if k >= n:
        return x.new_full((*x.shape[:-1], 1), float('-inf'))
    if x.device.type == 'cpu' and x.dtype in (torch.float32, torch.float64):  # one selection finds both
        with torch.no_grad():
            both = np.partition(x.detach().numpy(), (n - k - 1, n - k), axis=-1)
        return (torch.from_numpy(both[..., n - k:n - k + 1]) + torch.from_numpy(both[..., n - k - 1:n - k])) / 2
    with torch.no_grad():
        top = x.topk(k + 1, dim=-1).values  # one selection: the k-th and (k+1)-th are its last two
    return (top[..., k - 1:k] + top[..., k:]) / 2
