# GPT-2 (124M) on OpenWebText with softmax attention: nanoGPT's config/train_gpt2.py, the baseline row.
# 8 GPUs:  python train.py config/softmax_gpt.py --nproc_per_node=8
# nanoGPT reaches val loss ~2.85 after 600k iterations (about 4 days on 8 A100s).

out_dir = 'out-softmax-gpt'
dataset = 'openwebtext'

# 12 batch size * 1024 block size * 40 gradaccum = 491,520 tokens per iteration
batch_size = 12
block_size = 1024
gradient_accumulation_steps = 5 * 8

n_layer = 12
n_head = 12
n_embd = 768
dropout = 0.0
bias = False
attention = 'softmax'

# this makes total number of tokens be 300B
learning_rate = 6e-4
max_iters = 600000
lr_decay_iters = 600000
min_lr = 6e-5
warmup_iters = 2000
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0

eval_interval = 1000
eval_iters = 200
log_interval = 10
always_save_checkpoint = True
