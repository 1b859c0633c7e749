# Krause ViT-S on CIFAR-10: the official KViT-S recipe of Krause Synchronization Transformers (arXiv 2602.11534;
# docs/rules.md#krause), the same training as config/softmax_vit.py
# with attention='krause'. Each patch attends to CLS, itself and the 4 patches at Manhattan distance 1 (the
# official "window 4"), keeps the top k of those (k = 2 at the first layer growing to 4 at the last), and
# CLS attends to every token. The paper reports 95.35% (vs 92.45% for softmax) for ViT-B, not this ViT-S.
# Differences from the official code: pre-norm blocks (the official KViT is post-norm; its softmax baseline is
# pre-norm, and here both share one Block), and σ learned per head rather than per layer.
# 1 GPU:  python train.py config/krause_vit.py
# CPU smoke run: config/softmax_vit.py's cpu_recipe, naming this config (train.py prints it on a CPU).

import os
exec(open(os.path.join(os.path.dirname(__file__), 'softmax_vit.py')).read())  # the shared ViT-S / CIFAR-10 recipe

out_dir = 'out-krause-vit'
attention = 'krause'
krause_topk = 2          # k at the first layer; round(linspace(k, 2k, n_layer)) over depth
krause_radius = 1
krause_metric = 'manhattan'
krause_sigma = 2.5
flex = False             # 65 tokens: the dense masked form is as fast as flex here
