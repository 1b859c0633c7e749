# ViT-S on CIFAR-100 with softmax attention: config/softmax_vit.py's recipe (the official KViT-S recipe of Krause
# Synchronization Transformers, arXiv 2602.11534) on the 100-class dataset.
# The Krause paper's CIFAR-100 table reports ViT-B (softmax 72.28%), not this ViT-S: its baseline is its own run.
# 1 GPU:  python train.py config/softmax_vit100.py
# 8 GPUs: python train.py config/softmax_vit100.py --nproc_per_node=8
#   --batch_size=32 --gradient_accumulation_steps=8  (32 per GPU x 8 = 256 per iteration)

import os
exec(open(os.path.join(os.path.dirname(__file__), 'softmax_vit.py')).read())  # the same recipe; only the data and out_dir differ
out_dir = 'out-softmax-vit100'
dataset = 'cifar100'  # 50,000 training images too, so the epochs-to-iterations arithmetic is unchanged
