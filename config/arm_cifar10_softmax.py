# Pixel model (ARM) on CIFAR-10, the Krause paper's third system, softmax baseline:
# every subpixel a token of 256 values, raster order with R, G, B side by side (3,072 per image; the model reads
# the first 3,071 and predicts subpixels 2..3,072). 16 layers x 512, 8 heads, learned positions, pre-norm, GELU MLP
# x4, dropout 0.1; AdamW lr 1e-3, 5% linear warm-up then cosine, 30 epochs. Val loss is reported as bits/dim.
# The paper: 3.0224 bits/dim (softmax), 3.0032 (Krause, config/arm_cifar10_krause.py). Batch size is ours (the
# paper's text gives none): 64 images per step, 50,000 / 64 = 781 steps per epoch.
# 1 GPU:   python train.py config/arm_cifar10_softmax.py
# Exact bits/dim of the whole test split:  ... --init_from=resume --eval_only=True --eval_full=True
# Any other rule by flag: --attention=tda, --attention=cluster, --attention=attentionx, --window=256 (softmax)
out_dir = 'out-arm-cifar10-softmax'
dataset = 'cifar10_pixels'
block_size = 3071
batch_size = 64
n_layer = 16
n_head = 8
n_embd = 512
dropout = 0.1
bias = True
pos_emb = 'learned'
attention = 'softmax'
learning_rate = 1e-3
max_iters = 23430           # 30 epochs
lr_decay_iters = 23430
warmup_iters = 1172         # 5%
min_lr = 0.0
weight_decay = 0.01
eval_interval = 781         # once per epoch
eval_iters = 20
