# AttentionX GPT-2 (124M) on OpenWebText: nanoGPT's recipe (config/softmax_gpt.py, nanoGPT's train_gpt2.py) with
# attention='attentionx' and γ = 3, as in the paper's nanoGPT run (seed 004 §4; SPEC §3): y = v - 3·softmax(qkᵀ/√D)v
# per head, causal, the diagonal kept. The paper reports a slightly better validation curve than softmax.
# 8 GPUs:  torchrun --standalone --nproc_per_node=8 train.py config/attentionx_gpt.py
# 1 GPU:   python train.py config/attentionx_gpt.py
# CPU, nanoGPT's baby GPT with it (README's Results): python train.py config/shakespeare_char.py --device=cpu
#   --compile=False --attention=attentionx --attnx_gamma=3 ... (the rest of README's command)
# Compare with config/softmax_gpt.py: same data, same tokens per step; AttentionX stays on SDPA with
# is_causal=True (flash on GPU), so a step costs the same.

import os
exec(open(os.path.join(os.path.dirname(__file__), 'softmax_gpt.py')).read())  # nanoGPT's GPT-2 / OpenWebText recipe

out_dir = 'out-attentionx-gpt'
attention = 'attentionx'
attnx_gamma = 3.0
attnx_learnable_gamma = False  # the paper: "no additional learnable parameters"; True learns γ per head from 3
attnx_mask_diagonal = False    # causal: each token keeps its own key (row 0 would otherwise be empty)
