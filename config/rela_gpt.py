# ReLA GPT: the TDA paper's "ReLA" row of its Table 1 (arXiv 2601.12145; the rule: Zhang, Titov, Sennrich 2021,
# "Sparse Attention with Linear Units", arXiv 2104.07012, ReLA-g; docs/rules.md#rela) on the paper's GPT-2-162M
# setup, config/tda_gpt.py's (12 layers, 12 heads, 768 wide, RoPE, untied head; FineWeb-Edu sample-10BT; AdamW lr
# 1e-3 to 1e-4, weight decay 0.1), which this runs with the attention swapped. Beyond softmax's parameters: the
# gated RMSNorm's g and w, 2 x 768 per layer, +18,432 in all.
# 8 GPUs:  python train.py config/rela_gpt.py --nproc_per_node=8
# 1 GPU:   python train.py config/rela_gpt.py            (same global batch, 8x the accumulation steps)

import os
exec(open(os.path.join(os.path.dirname(__file__), 'tda_gpt.py')).read())  # the TDA table's shape and recipe

out_dir = 'out-rela-gpt'
attention = 'rela'
rela_eps = 1e-8          # ε of the gated RMSNorm (the authors' code)
flex = False             # no flex path: the query-tiled math path (memory linear in T)
