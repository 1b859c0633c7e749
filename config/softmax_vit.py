# ViT-S on CIFAR-10 with softmax attention: the baseline row of the CIFAR table of Krause Synchronization
# Transformers (arXiv 2602.11534): the official KViT-S recipe with attention='softmax' (docs/rules.md#krause).
# The paper's CIFAR-10 table reports ViT-B (softmax 92.45%), not this ViT-S: its baseline is its own run.
# 1 GPU:  python train.py config/softmax_vit.py
# 8 GPUs: python train.py config/softmax_vit.py --nproc_per_node=8
#   --batch_size=32 --gradient_accumulation_steps=8  (32 per GPU x 8 = 256 per iteration)
# CPU smoke run (a 4-layer, 128-wide ViT for 400 iterations, a few minutes on 2 cores): cpu_recipe below, which
# train.py prints when this config (or one built on it) runs on a CPU

out_dir = 'out-softmax-vit'
# __file__: the config run, so that each config built on this one (cluster_vit.py, ...) names itself
cpu_recipe = (f'{__file__} --device=cpu --compile=False --n_layer=4 --n_head=4 --n_embd=128 --batch_size=64 '
              '--max_iters=400 --lr_decay_iters=400 --warmup_iters=20 --eval_interval=400 --eval_iters=10')
dataset = 'cifar10'  # prepared on first use (from the Hub, or --data_source=DIR with train/test.parquet)

# 256 images per iteration: 50,000 / 256 = 195.3125 iterations per epoch
batch_size = 256
gradient_accumulation_steps = 1

# ViT-S: 4x4 patches (8x8 grid + CLS = 65 tokens), width 384, 6 heads, 12 layers, MLP 4*384 = 1536
patch_size = 4
n_layer = 12
n_head = 6
n_embd = 384
mlp_hidden = 0        # 0 means 4 * n_embd (1536 here), so --n_embd overrides keep the 4x ratio
dropout = 0.0
drop_path = 0.1       # linear over depth: 0 at the first block, 0.1 at the last
bias = True
attention = 'softmax'

# AdamW, 300 epochs: 10 epochs of linear warm-up, then cosine to 0 (the official CosineAnnealingLR)
learning_rate = 3e-4
weight_decay = 0.05
beta1 = 0.9
beta2 = 0.999         # torch.optim.AdamW's default, as in the official script
grad_clip = 1.0
max_iters = 58594     # 300 epochs * 195.3125 = 58,593.75
lr_decay_iters = 58594
warmup_iters = 1953   # 10 epochs * 195.3125 = 1,953.1
min_lr = 0.0

# augmentation: random crop (pad 4) + flip, then MixUp(0.8) / CutMix(1.0, on 80% of batches), label smoothing 0.1
augment = True
mixup_alpha = 0.8
cutmix_alpha = 1.0
cutmix_prob = 0.8
label_smoothing = 0.1

# evaluate every 5 epochs (5 * 195.3 = 977) on 40 * 256 = 10,240 val images drawn with replacement, no augmentation
eval_interval = 977
eval_iters = 40
log_interval = 50
always_save_checkpoint = True
