# TDA ViT-S on CIFAR-10: the same training as config/softmax_vit.py (the official KViT-S recipe, which this runs)
# with attention='tda'. A ViT is not causal: every token sees all N = 65 tokens (CLS + 8x8 patches) under one
# constant threshold τ = β·sqrt(2·ln(N/κ)/D) (the project's extension, docs/rules.md#tda; the paper has no ViT).
# 1 GPU:  python train.py config/tda_vit.py
# CPU smoke run: config/softmax_vit.py's cpu_recipe, naming this config (train.py prints it on a CPU).

import os
exec(open(os.path.join(os.path.dirname(__file__), 'softmax_vit.py')).read())  # the shared ViT-S / CIFAR-10 recipe

out_dir = 'out-tda-vit'
attention = 'tda'
tda_beta = 1.0
tda_lambda = 0.5
tda_kappa = 1.0
tda_p = 2.0
flex = False             # 65 tokens: one chunk of the math path
