# Krause attention GPT: the official 100M language-model recipe of Krause Synchronization Transformers (arXiv
# 2602.11534; docs/rules.md#krause), on FineWeb-Edu sample-10BT.
# 8 layers, 768 wide, 12 heads, MLP 2048, context 1024, tied embeddings, pre-norm, biases in every Linear and
# LayerNorm (the official language_models_100m code: nn.Linear and nn.LayerNorm at their defaults; only the tied
# output head has none); every layer mixes a causal softmax branch and a Krause branch (W=32, k=16, σ₀=2.5) through
# a per-token gate (mix).
# 8 GPUs:   python train.py config/krause_gpt.py --nproc_per_node=8
# 1 GPU:    python train.py config/krause_gpt.py            (same global batch, 8x the accumulation steps)
# Pure Krause (no softmax branch):  python train.py config/krause_gpt.py --mix=False
# Compare with config/softmax_fineweb.py (GPT-2 124M, same data and tokens per step).

out_dir = 'out-krause-gpt'
dataset = 'fineweb_edu'

# 0.5M tokens per step: 64 sequences x 1024 tokens x 8 accumulation steps = 524,288
batch_size = 64
block_size = 1024
gradient_accumulation_steps = 8

n_layer = 8
n_head = 12
n_embd = 768
mlp_hidden = 2048
dropout = 0.1
bias = True              # as the official model: every Linear (q/k/v/o of both branches, the MLP) and LayerNorm has one
tie_weights = True

attention = 'krause'
mix = True               # the paper's LM form: softmax branch + Krause branch, gate starts at 0.8 / 0.2
krause_window = 32
krause_topk = 16
krause_sigma = 2.5
# on CUDA forward runs Krause's Triton kernel (no dropout on its weights: flex, --flex=True, has none either), the
# math path elsewhere

learning_rate = 6e-4
max_iters = 19073        # one pass over 10e9 tokens at 524,288 tokens per step
lr_decay_iters = 19073
warmup_iters = 954       # 5% of the steps
min_lr = 6e-5            # cosine to 0.1 x learning_rate
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0

eval_interval = 250
eval_iters = 20
log_interval = 10
hellaswag = True
always_save_checkpoint = True
