# 1.5-entmax attention GPT: the TDA paper's "Entmax" row of its Table 1 (arXiv 2601.12145; the rule: Peters, Niculae,
# Martins 2019, arXiv 1905.05702, in attention as Correia et al. 2019, arXiv 1909.00015; docs/rules.md#entmax) on
# the paper's GPT-2-162M setup, config/tda_gpt.py's (12 layers, 12 heads, 768 wide, RoPE, untied head; FineWeb-Edu
# sample-10BT; AdamW lr 1e-3 to 1e-4, weight decay 0.1), which this runs with the attention swapped. Nothing is
# learned beyond softmax's parameters (162.25M).
# 8 GPUs:  python train.py config/entmax_gpt.py --nproc_per_node=8
# 1 GPU:   python train.py config/entmax_gpt.py            (same global batch, 8x the accumulation steps)
# Sparsemax (α = 2, by bisection):  python train.py config/entmax_gpt.py --entmax_alpha=2.0

import os
exec(open(os.path.join(os.path.dirname(__file__), 'tda_gpt.py')).read())  # the TDA table's shape and recipe

out_dir = 'out-entmax-gpt'
attention = 'entmax'
entmax_alpha = 1.5       # exact, by sort (the paper's and the TDA table's 1.5-entmax)
entmax_iters = 50        # bisection steps, used only where α != 1.5
flex = False             # no flex path: the query-tiled math path (memory linear in T)
