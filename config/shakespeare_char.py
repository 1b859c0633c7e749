# nanoGPT's baby GPT on character-level tiny Shakespeare (config/train_shakespeare_char.py there).
# 1 GPU:  python train.py config/shakespeare_char.py       (a GPU reaches val loss ~1.47 in a few minutes)
# On a CPU, nanoGPT's own recipe (docs/RESULTS.md#baby-gpt-against-nanogpt): cpu_recipe below, which train.py
# prints when this config runs on a CPU without it

out_dir = 'out-shakespeare-char'
cpu_recipe = ('config/shakespeare_char.py --device=cpu --compile=False --eval_iters=20 --log_interval=1 '
              '--block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 '
              '--lr_decay_iters=2000 --dropout=0.0')
eval_interval = 250  # keep frequent because we'll overfit
eval_iters = 200
log_interval = 10    # don't print too too often

# we expect to overfit on this small dataset, so only save when val improves
always_save_checkpoint = False

dataset = 'shakespeare_char'
gradient_accumulation_steps = 1
batch_size = 64
block_size = 256     # context of up to 256 previous characters

# baby GPT model :)
n_layer = 6
n_head = 6
n_embd = 384
dropout = 0.2
bias = False

learning_rate = 1e-3  # with baby networks can afford to go a bit higher
max_iters = 5000
lr_decay_iters = 5000  # make equal to max_iters usually
min_lr = 1e-4          # learning_rate / 10 usually
beta2 = 0.99           # make a bit bigger because number of tokens per iter is small
warmup_iters = 100     # not super necessary potentially
weight_decay = 1e-1
