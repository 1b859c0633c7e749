"""What the rules that cluster keys (cluster, routing) report about their clusters at each evaluation."""
import torch


@torch.no_grad()
def cluster_usage(S):
    """Soft assignments S (B, H, T, m) -> {'perplexity': exp H(mean assignment), 'entropy': mean H(S_j)}, (H,) each:
    how many of the m clusters a head uses, and how hard its assignment is (0: one cluster per key)."""
    mean = S.mean((0, 2))  # (H, m)
    return {'perplexity': torch.exp(-torch.special.xlogy(mean, mean).sum(-1)),
            'entropy': -torch.special.xlogy(S, S).sum(-1).mean((0, 2))}
