# AttentionX ViT-S on CIFAR-10, γ = 1, diagonal masked: the CIFAR-10 ViT-S recipe (config/softmax_vit.py, the
# official KViT-S recipe) with y = (I - A)V per head, A's diagonal zero (no token attends to itself): the paper's
# ViT-small setting (AttentionX, arXiv 2409.04275, §4.1; docs/rules.md#attentionx). The paper reports 89.41% vs
# 88.15% for softmax, with another ViT-small training recipe (kentaroy47/vision-transformers-cifar10, SET-Adam).
# 1 GPU:  python train.py config/attentionx_vit.py
# CPU smoke run (docs/docs/RESULTS.md#vit-on-cifar-10-cpu): python train.py config/attentionx_vit.py --device=cpu --compile=False
#   --n_layer=4 --n_head=4 --n_embd=128 --batch_size=64 --max_iters=400 --lr_decay_iters=400 --warmup_iters=20
#   --eval_interval=400 --eval_iters=10
# The masked diagonal is a boolean SDPA mask (no flash kernel); flex=True runs it through flex_attention on CUDA.

import os
exec(open(os.path.join(os.path.dirname(__file__), 'softmax_vit.py')).read())  # the shared ViT-S / CIFAR-10 recipe

out_dir = 'out-attentionx-vit'
attention = 'attentionx'
attnx_gamma = 1.0
attnx_learnable_gamma = False
attnx_mask_diagonal = True
