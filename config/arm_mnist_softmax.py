# Autoregressive image model on MNIST (issue 22), softmax baseline: 784 grey subpixels per image, 12 layers x 256,
# 8 heads, dropout 0.1, AdamW lr 1e-3, 5% warm-up then cosine, 30 epochs (batch 64, ours: 937 steps per epoch).
# The paper: 0.5685 bits/dim (softmax), 0.5652 (Krause, config/arm_mnist_krause.py), sampling 83 -> 106 images/s.
# MNIST is prepared from the Hub (ylecun/mnist) or a local copy: --data_source=DIR with train.parquet, test.parquet.
# python train.py config/arm_mnist_softmax.py
out_dir = 'out-arm-mnist-softmax'
dataset = 'mnist_pixels'
block_size = 783
batch_size = 64
n_layer = 12
n_head = 8
n_embd = 256
dropout = 0.1
bias = True
pos_emb = 'learned'
attention = 'softmax'
learning_rate = 1e-3
max_iters = 28110           # 30 epochs
lr_decay_iters = 28110
warmup_iters = 1405         # 5%
min_lr = 0.0
weight_decay = 0.01
eval_interval = 937
eval_iters = 20
