# Passkey retrieval (this project's task, prepare/passkey.py; docs/RESULTS.md#passkey): a 4-digit number at a random
# depth in random filler, asked for at the end.
# Trained at 64 tokens; extrapolate.py tests it at 2-8x that length:
# python train.py config/passkey.py --attention=krause --pos_emb=none --device=cpu --compile=False
# python studies/extrapolate.py --out_dir=out-passkey

out_dir = 'out-passkey'
dataset = 'passkey'
block_size = 64
batch_size = 64
eval_interval = 250
eval_iters = 10
log_interval = 50
always_save_checkpoint = True

n_layer = 4
n_head = 4
n_embd = 128
dropout = 0.0
bias = False
pos_emb = 'rope'

learning_rate = 1e-3
max_iters = 500
lr_decay_iters = 500
warmup_iters = 50
min_lr = 1e-4
beta2 = 0.99
