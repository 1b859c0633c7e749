"""attention='lsa': locality self-attention, the diagonal masked and a learned temperature (docs/rules.md#lsa)."""
from dataclasses import dataclass

from attention import SoftmaxAttention
from machinery.masks import off_diagonal_mask
from machinery.temperature import LearnedTemperature


@dataclass
class LSAConfig:
    lsa_per_head: bool = False   # LSA: one learned temperature per layer (AttentionX's base); True: one per head


class LocalitySelfAttention(LearnedTemperature, SoftmaxAttention):
    """
    y = softmax(t · q kᵀ + M) v,   M_ij = -inf if i = j else 0,   t = exp(log_temperature), init 1/√D
    ("Vision Transformer for Small-Size Datasets", Lee, Lee, Song 2021, arXiv 2112.13492, Locality Self-Attention;
    docs/rules.md#lsa)

    Softmax attention with the diagonal masked (no token attends to itself) and a learned temperature t in place of
    1/√D: both sharpen the weights onto the other tokens. t is kept as its log, one per layer as in the ViT
    AttentionX builds on (kentaroy47/vision-transformers-cifar10 vit_small), or one per head (`lsa_per_head`, as the
    authors' code has it). ViT only: with causal attention row 0 would see no key. Every path is softmax's with
    the queries scaled by t·√D (LearnedTemperature, shared with AttentionX on its LSA base: SDPA with the
    off-diagonal mask, flex with it as a BlockMask), so t keeps its gradient and no score_mod captures it. The
    paper's other half, Shifted Patch Tokenization, is not here.
    """
    Config = LSAConfig
    has_causal_form, has_cache = False, False

    def __init__(self, config, layer_idx):
        if config.causal:  # the frame would refuse it too; this says why
            raise ValueError(f"attention='{config.attention}' ({type(self).__name__}) has no causal form (causal=True, "
                             f"a GPT): its diagonal is masked, so row 0 would see no key; use it in a ViT")
        super().__init__(config, layer_idx)
        self.mask_mod = off_diagonal_mask
        self.init_temperature(True, per_head=config.lsa_per_head)  # t = 1/√D
