# AttentionX GPT-2 (124M) on OpenWebText, γ = 3: nanoGPT's recipe (config/softmax_gpt.py, from nanoGPT's
# config/train_gpt2.py) with y = v - 3·softmax(qkᵀ/√D)v per head, causal, diagonal kept: the paper's nanoGPT run
# (AttentionX, arXiv 2409.04275, §4.2; docs/rules.md#attentionx), which reports a slightly better validation curve.
# 8 GPUs:  python train.py config/attentionx_gpt.py --nproc_per_node=8
# 1 GPU:   python train.py config/attentionx_gpt.py
# CPU, nanoGPT's baby GPT with it (docs/RESULTS.md#attentionx): cpu_recipe below, which train.py prints when
# this config runs on a CPU
# Compare with config/softmax_gpt.py: same data and tokens per step. The attention is softmax's SDPA call with
# is_causal=True (flash on GPU) plus one subtraction, so a step costs the same.

import os
exec(open(os.path.join(os.path.dirname(__file__), 'softmax_gpt.py')).read())  # nanoGPT's GPT-2 / OpenWebText recipe

out_dir = 'out-attentionx-gpt'
cpu_recipe = ('config/shakespeare_char.py --device=cpu --compile=False --attention=attentionx --attnx_gamma=3 '
              '--eval_iters=20 --log_interval=1 --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 '
              '--max_iters=2000 --lr_decay_iters=2000 --dropout=0.0')
attention = 'attentionx'
attnx_gamma = 3.0
attnx_learnable_gamma = False  # the paper: "no additional learnable parameters"; True learns γ per head from 3
attnx_mask_diagonal = False    # causal: a token keeps its own key (row 0 would otherwise be empty)
