"""The ViT (vit.py): position is only known through the position embedding; shapes, losses, bad sizes."""
import pytest
import torch

from vit import ViT, ViTConfig

# ----------------------------------------------------------------------------- the model

def shuffle_patches(x, perm, p):
    # (B, C, H, W) -> the same image with its p x p patches moved: patch perm[n] goes to place n (row-major)
    B, C, H, W = x.shape
    g = H // p
    patches = x.view(B, C, g, p, g, p).permute(0, 2, 4, 1, 3, 5).reshape(B, g * g, C, p, p)
    return patches[:, perm].view(B, g, g, C, p, p).permute(0, 3, 1, 4, 2, 5).reshape(B, C, H, W)


def test_only_position_embeddings_know_where_a_patch_is():
    torch.manual_seed(0)
    model = ViT(ViTConfig(n_layer=2, n_head=2, n_embd=32, patch_size=4, drop_path=0.1)).eval()
    x, perm = torch.randn(3, 3, 32, 32), torch.randperm(64)
    shuffled = shuffle_patches(x, perm, 4)
    tokens = model.patch_embed(x).flatten(2).transpose(1, 2)  # (B, 64, C): the shuffle permutes the tokens
    assert torch.allclose(model.patch_embed(shuffled).flatten(2).transpose(1, 2), tokens[:, perm], atol=1e-6)
    with torch.no_grad():
        for p in model.parameters():  # weights large enough that the patches visibly interact through attention
            p.normal_(std=0.3)
        model.pos_embed.normal_()
        moved = (model(x)[0] - model(shuffled)[0]).abs().max().item()
        model.pos_embed.zero_()
        same = (model(x)[0] - model(shuffled)[0]).abs().max().item()
    assert moved > 1e-2 and same < 1e-5, (moved, same)


def test_shapes_and_losses():
    cfg = ViTConfig(n_layer=1, n_head=2, n_embd=16, patch_size=8, num_classes=7)
    assert (cfg.grid_size, cfg.block_size, cfg.causal) == (4, 17, False)
    model = ViT(cfg)
    x, y = torch.randn(5, 3, 32, 32), torch.randint(0, 7, (5,))
    logits, loss = model(x, y)
    assert logits.shape == (5, 7) and model(x)[1] is None
    assert torch.allclose(loss, torch.nn.functional.cross_entropy(logits, y))
    soft = torch.softmax(torch.randn(5, 7), -1)
    assert torch.allclose(model(x, soft)[1], -(soft * logits.log_softmax(-1)).sum(-1).mean())


def test_patch_size_must_divide_the_image():
    with pytest.raises(ValueError, match=r"patch_size=5 does not divide img_size=32; use one of 1, 2, 4, 8, 16, 32"):
        ViTConfig(patch_size=5)
    with pytest.raises(ValueError, match="pos_emb must be 'learned'"):
        ViTConfig(pos_emb='rope')
