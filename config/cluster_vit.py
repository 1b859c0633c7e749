# Cluster attention ViT-S on CIFAR-10 (this project's rule, docs/rules.md#cluster): the recipe of
# config/softmax_vit.py with attention='cluster'. Each token attends to m = 16 cluster summaries of all 65 tokens
# (1 CLS + 8x8 patches), the seeds refined once by soft k-means on each image's keys, plus its own key exactly
# (the self term).
# 1 GPU:  python train.py config/cluster_vit.py
# CPU smoke run: config/softmax_vit.py's cpu_recipe, naming this config (train.py prints it on a CPU).

import os
exec(open(os.path.join(os.path.dirname(__file__), 'softmax_vit.py')).read())  # the shared ViT-S / CIFAR-10 recipe

out_dir = 'out-cluster-vit'
attention = 'cluster'
cluster_m = 16           # seeds per head
cluster_iters = 1        # soft spherical k-means refinements of the seeds on each image
cluster_self = True      # each token also sees its own key exactly
cluster_sharpness = 10.0
cluster_seed_lr = 10.0
