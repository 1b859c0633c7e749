# Differential Transformer GPT, the TDA paper's "Diff Softmax" row (Table 1): per pair of heads, (softmax(Q1K1ᵀ/√d)
# - λ softmax(Q2K2ᵀ/√d))V, RMSNorm × (1 - λ_init), λ_init = 0.8 - 0.6·exp(-0.3·l) over depth (Ye et al. 2024,
# arXiv 2410.05258; docs/rules.md#diff), on the TDA paper's GPT-2-162M setup (config/tda_gpt.py: 12 layers, 12 heads
# = 6 differential heads, 768 wide, RoPE, untied head, FineWeb-Edu, its recipe). Parameters: softmax's + 384 a layer.
# 8 GPUs:  python train.py config/diff_gpt.py --nproc_per_node=8
# 1 GPU:   python train.py config/diff_gpt.py            (same global batch, 8x the accumulation steps)
# A constant λ_init (the paper's ablation):  python train.py config/diff_gpt.py --diff_lambda_init=0.8

import os
exec(open(os.path.join(os.path.dirname(__file__), 'tda_gpt.py')).read())  # the TDA table's shape, data and recipe

out_dir = 'out-diff-gpt'
attention = 'diff'
diff_lambda_init = 0.0   # 0: the depth schedule
flex = False             # SDPA, two flash calls (q, k, v all 64 wide); flex=True: one flex call with 128-wide values
