"""Heads: (B, T, C) <-> (B, H, T, D), and the weight matrix of an attention that is linear in v."""
import torch
import torch.nn.functional as F


def split_heads(x, n_head):
    B, T, C = x.size()
    return x.view(B, T, n_head, C // n_head).transpose(1, 2)  # (B, H, T, D)


def merge_heads(y):
    B, H, T, D = y.size()
    return y.transpose(1, 2).contiguous().view(B, T, H * D)  # (B, T, C)


@torch.no_grad()
def weights_of_linear_map(attend, *tensors):
    """The (B, H, T, T) W of y = attend(*rest, v) = W v, for attend linear in v (the last tensor): attend is run
    with v = the identity basis, D columns of it at a time (rules may rely on v being D wide), so column j of the
    output is W[:, j]."""
    *rest, v = tensors
    (B, H, T, D), columns = v.shape, []
    eye = torch.eye(T, dtype=v.dtype, device=v.device).expand(B, H, T, T)
    for start in range(0, T, D):
        basis = F.pad(eye[..., start:start + D], (0, max(0, start + D - T)))  # (B, H, T, D), zero-padded
        columns.append(attend(*rest, basis)[..., :min(D, T - start)])
    return torch.cat(columns, -1)
