# Pixel model (ARM) on MNIST, softmax baseline (Krause Synchronization Transformers, arXiv 2602.11534):
# config/arm_cifar10_softmax.py's recipe (dropout 0.1, AdamW lr 1e-3, 5% warm-up then cosine, 30 epochs, batch 64:
# ours, 937 steps per epoch) on 784 grey subpixels per image, 12 layers x 256, 8 heads.
# The paper: 0.5685 bits/dim (softmax), 0.5652 (Krause, config/arm_mnist_krause.py), sampling 83 -> 106 images/s.
# MNIST is prepared from the Hub (ylecun/mnist) or a local copy: --data_source=DIR with train.parquet, test.parquet.
# python train.py config/arm_mnist_softmax.py
import os
exec(open(os.path.join(os.path.dirname(__file__), 'arm_cifar10_softmax.py')).read())  # the paper's ARM recipe
out_dir = 'out-arm-mnist-softmax'
dataset = 'mnist_pixels'
block_size = 783
n_layer = 12
n_embd = 256
max_iters = 28110           # 30 epochs
lr_decay_iters = 28110
warmup_iters = 1405         # 5%
eval_interval = 937
