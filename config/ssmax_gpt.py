# SSMax GPT: Scalable-Softmax (Nakanishi 2025, arXiv 2501.19399; docs/rules.md#ssmax), softmax with its logits
# multiplied by s_h·log n (n the keys a query sees, s learned per head), on the TDA paper's setup (config/tda_gpt.py:
# GPT-2-162M, 12 layers, 12 heads, 768 wide, RoPE, untied head, FineWeb-Edu sample-10BT, lr 1e-3 cosine to 1e-4),
# which has the same parameter count as the SSMax paper's 162M model; SSMax adds 12 × 12 = 144 parameters.
# 8 GPUs:  python train.py config/ssmax_gpt.py --nproc_per_node=8
# 1 GPU:   python train.py config/ssmax_gpt.py            (same global batch, 8x the accumulation steps)
# Softmax on the same setup:  python train.py config/tda_gpt.py --attention=softmax

import os
exec(open(os.path.join(os.path.dirname(__file__), 'tda_gpt.py')).read())  # the TDA paper's recipe (tda_* unused)

out_dir = 'out-ssmax-gpt'
attention = 'ssmax'
ssmax_s = 0.43           # initial s per head (the paper's Fig. 1 value; docs/rules.md#ssmax says why)
flex = False             # SDPA (flash on a GPU) on the row-scaled queries: a causal softmax needs no flex
