# LSA ViT-S on CIFAR-10: the CIFAR-10 ViT-S recipe (config/softmax_vit.py, the official KViT-S recipe) with
# Locality Self-Attention, y = softmax(t·q kᵀ with the diagonal -inf) v, t one learned temperature per layer starting
# at 1/√D ("Vision Transformer for Small-Size Datasets", Lee, Lee, Song 2021, arXiv 2112.13492; docs/rules.md#lsa).
# It is the attention of the ViT AttentionX builds on (kentaroy47/vision-transformers-cifar10 vit_small), so this row
# sits between config/softmax_vit.py and config/attentionx_vit.py: only the attention differs between the three.
# Departures from the papers' recipes: no Shifted Patch Tokenization (the paper's other half; a plain patch embedding
# here, as for every rule). The LSA paper's ViT is 9 layers x 12 heads x 192 wide (head size 16, MLP ratio 2),
# 100 epochs of AdamW lr 1e-3, batch 128, AutoAugment, repeated augmentation, random erasing; the vit_small that
# AttentionX trained is 6 layers x 8 heads of 64, 512 wide, MLP 512, dropout 0.1, Adam lr 1e-4, batch 512, 200
# epochs, RandAugment. Here: ViT-S, 12 layers x 6 heads of 64, 384 wide, the KViT-S recipe below. The authors' code
# learns t per head (t itself, not its log): --lsa_per_head=True gives one log t per head.
# 1 GPU:  python train.py config/lsa_vit.py
# CPU smoke run: config/softmax_vit.py's cpu_recipe, naming this config (train.py prints it on a CPU).

import os
exec(open(os.path.join(os.path.dirname(__file__), 'softmax_vit.py')).read())  # the shared ViT-S / CIFAR-10 recipe

out_dir = 'out-lsa-vit'
attention = 'lsa'
lsa_per_head = False     # one temperature per layer, as in AttentionX's base (kentaroy47/lucidrains vit_small)
