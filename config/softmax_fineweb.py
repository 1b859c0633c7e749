# GPT-2 (124M) on FineWeb-Edu sample-10BT with softmax attention: build-nanogpt's recipe, the baseline row for
# the other rules on FineWeb-Edu. One epoch of 10B tokens: 19,073 steps of 524,288 tokens, HellaSwag at every
# evaluation.
# 8 GPUs:  python train.py config/softmax_fineweb.py --nproc_per_node=8
# CPU smoke test on a local sample (PATH.parquet): cpu_recipe below, which train.py prints when this config (or one
# built on it) runs on a CPU

out_dir = 'out-softmax-fineweb'
# __file__: the config run, so that each config built on this one (tda_gpt.py, ...) names itself
cpu_recipe = (f'{__file__} --data_source=PATH.parquet --data_dir=data/fw_sample --device=cpu --compile=False '
              '--n_layer=2 --n_head=2 --n_embd=64 --block_size=64 --batch_size=8 --gradient_accumulation_steps=1 '
              '--max_iters=50 --eval_interval=25 --eval_iters=5 --hellaswag=False')
dataset = 'fineweb_edu'

# 64 batch size * 1024 block size * 8 gradaccum = 524,288 tokens per iteration (2**19)
batch_size = 64
block_size = 1024
gradient_accumulation_steps = 8

n_layer = 12
n_head = 12
n_embd = 768
dropout = 0.0
bias = True              # GPT-2 has biases
attention = 'softmax'

learning_rate = 6e-4
max_iters = 19073        # 10e9 tokens / 524,288 tokens per step
lr_decay_iters = 19073
min_lr = 6e-5            # 0.1 x learning_rate
warmup_iters = 715       # GPT-3 paper: 375M tokens of warm-up
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0

eval_interval = 250
eval_iters = 20
log_interval = 10
hellaswag = True
always_save_checkpoint = True
