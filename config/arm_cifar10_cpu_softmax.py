# A CIFAR-10 pixel model (ARM) that trains in minutes on 2 CPU cores, softmax: 2 layers x 128, 4 heads, batch 8
# of 3,071-token images, 60 steps (about 3 minutes for softmax, 5 for Krause). Far from the paper's model: it shows
# the pipeline, bits/dim and samples without a GPU. Its Krause twin: config/arm_cifar10_cpu_krause.py (same
# everything, window 256, top-k 192).
# python train.py config/arm_cifar10_cpu_softmax.py
# python sample.py --out_dir=out-arm-cifar10-cpu-softmax --num_samples=16 --batch_size=16
out_dir = 'out-arm-cifar10-cpu-softmax'
dataset = 'cifar10_pixels'
device = 'cpu'
block_size = 3071
batch_size = 8
n_layer = 2
n_head = 4
n_embd = 128
dropout = 0.0
attention = 'softmax'
learning_rate = 3e-3
max_iters = 60
lr_decay_iters = 60
warmup_iters = 3
min_lr = 3e-4
eval_interval = 30
eval_iters = 2
log_interval = 10
