# AttentionX ViT-S on CIFAR-10, the paper's ViT setting: y = (I - A)V per head (γ = 1) on an LSA base, A =
# softmax(t·q kᵀ) with the diagonal masked (no token attends to itself) and t one learned temperature per layer from
# 1/√D (AttentionX, arXiv 2409.04275, §4.1; docs/rules.md#attentionx). The paper trained kentaroy47/vision-
# transformers-cifar10's vit_small, an LSA ViT (lucidrains' vit_for_small_dataset: LSA, learned log t per layer, the
# diagonal masked), and set γ = 1 "as the diagonal elements are set to zero on purpose": both the mask and t are the
# base's, so its softmax row is config/lsa_vit.py, and this differs from it in y = v - γ·A v alone. The paper
# reports 89.41% vs 88.15% for that base, with another ViT-small training recipe (SET-Adam lr 1e-4; the base's SPT
# patch embedding); here the CIFAR-10 ViT-S recipe of config/softmax_vit.py (the official KViT-S recipe).
# 1 GPU:  python train.py config/attentionx_vit.py
# Without the temperature (1/√D; the diagonal still masked): add --attnx_learned_temperature=False
# CPU smoke run (docs/RESULTS.md#vit-on-cifar-10-cpu): config/softmax_vit.py's cpu_recipe, naming this config
# (train.py prints it on a CPU).
# The masked diagonal is a boolean SDPA mask (no flash kernel); flex=True runs it through flex_attention on CUDA.

import os
exec(open(os.path.join(os.path.dirname(__file__), 'softmax_vit.py')).read())  # the shared ViT-S / CIFAR-10 recipe

out_dir = 'out-attentionx-vit'
attention = 'attentionx'
attnx_gamma = 1.0
attnx_learnable_gamma = False
attnx_mask_diagonal = True          # the LSA base's mask
attnx_learned_temperature = True    # the LSA base's temperature: log t per layer, from log(1/√D)
