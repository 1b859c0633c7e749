"""Rotary position embedding (RoPE), and its scaling for contexts longer than the trained one."""
import torch
import torch.nn as nn


class Rotary(nn.Module):
    """Rotary position embedding (Su et al. 2021), rotate-half form, positions offset..offset+T-1. The tables hold
    max_len positions and grow (doubling) when a sequence or generation goes past them: no bound on the position.
    scaling, for contexts `factor` times longer than trained: 'linear' divides the positions by it (position
    interpolation, arXiv 2306.15595), 'ntk' raises the base to base·factor^(D/(D-2)) (NTK-aware: the highest
    frequency kept, the lowest interpolated by `factor`); 'none' (or factor 1) is plain RoPE."""

    def __init__(self, head_dim, max_len, base=10000.0, scaling='none', factor=1.0):
        super().__init__()
        self.head_dim, self.base, self.scaling, self.factor = head_dim, base, scaling, factor
        cos, sin = self.tables(max_len, torch.float32, None)
        self.register_buffer('cos', cos, persistent=False)  # (max_len, D)
        self.register_buffer('sin', sin, persistent=False)

    def tables(self, n, dtype, device):  # always computed in float32, so growing never changes a stored position
        D = self.head_dim
        base = self.base * self.factor ** (D / max(D - 2, 1)) if self.scaling == 'ntk' else self.base
        inv_freq = base ** (-torch.arange(0, D, 2, dtype=torch.float32, device=device) / D)  # (D/2,)
        positions = torch.arange(n, dtype=torch.float32, device=device)
        if self.scaling == 'linear':
            positions = positions / self.factor
        angles = torch.outer(positions, inv_freq)  # (n, D/2)
        return angles.cos().repeat(1, 2).to(dtype), angles.sin().repeat(1, 2).to(dtype)

    def forward(self, x, offset=0):  # (B, H, T, D), offset: the absolute position of x's first token
        T, half = x.size(2), x.size(3) // 2
        if offset + T > self.cos.size(0):  # past the tables (longer than block_size): make them longer
            self.cos, self.sin = self.tables(max(2 * self.cos.size(0), offset + T), self.cos.dtype, self.cos.device)
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return (x * self.cos[offset:offset + T] + rotated * self.sin[offset:offset + T]).type_as(x)

    def rotate_halves(self, x, offset=0):  # (B, H, T, 2d): each head's two halves rotated as 2H heads of d, back
        halves = x.unflatten(-1, (2, -1)).transpose(2, 3).flatten(1, 2)                # (B, 2H, T, d)
        return self(halves, offset).unflatten(1, (-1, 2)).transpose(2, 3).flatten(3)


ROPE_SCALINGS = ('none', 'linear', 'ntk')


def check_rope_scaling(config):
    """ValueError naming the key: a scaling Rotary knows, a positive finite factor and base, and RoPE to scale."""
    if config.rope_scaling not in ROPE_SCALINGS:
        raise ValueError(f"rope_scaling must be 'none', 'linear' or 'ntk', got {config.rope_scaling!r}; pass e.g. "
                         f"--rope_scaling=ntk")
    if not 0 < config.rope_factor < float('inf'):  # NaN is neither
        raise ValueError(f"rope_factor={config.rope_factor} must be positive and finite (the new context / the "
                         f"trained one); pass e.g. --rope_factor=4")
    if not 0 < config.rope_base < float('inf'):
        raise ValueError(f"rope_base={config.rope_base} must be positive and finite (RoPE's θ); pass e.g. "
                         f"--rope_base=10000")
    if config.rope_scaling != 'none' and config.pos_emb != 'rope':
        what = 'learned absolute positions' if config.pos_emb == 'learned' else 'no positions'
        raise ValueError(f"rope_scaling={config.rope_scaling!r} scales RoPE's frequencies, but pos_emb="
                         f"{config.pos_emb!r}: {what} cannot be scaled; pass --pos_emb=rope, or --rope_scaling=none")
    if config.pos_emb != 'rope' and (config.rope_base, config.rope_factor) != (10000.0, 1.0):
        key = 'rope_base' if config.rope_base != 10000.0 else 'rope_factor'
        raise ValueError(f"{key}={getattr(config, key)} is read only with RoPE, and pos_emb={config.pos_emb!r}; pass "
                         f"--pos_emb=rope, or drop --{key}")
    if config.rope_factor != 1.0 and config.rope_scaling == 'none':
        raise ValueError(f"rope_factor={config.rope_factor} is read only where RoPE is scaled, and "
                         f"rope_scaling='none'; pass --rope_scaling=ntk (or linear), or drop --rope_factor")

