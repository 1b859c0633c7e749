# Longformer GPT: the Krause paper's language-model comparison row "Longformer" (Krause Synchronization Transformers,
# arXiv 2602.11534), on config/krause_gpt.py's shape and recipe (8 layers, 768 wide, 12 heads, context 1024,
# FineWeb-Edu sample-10BT) with Longformer's causal attention alone, no softmax branch (mix=False).
# Longformer (Beltagy et al. 2020, arXiv 2004.05150; docs/rules.md#longformer): sliding-window softmax over the last
# W_l keys, the window growing with depth as in the paper's character LM (its Table 4, phase 1: 32 at the bottom
# layer to 512 at the top), here 32 (Krause's W) to 512 in rounded linear steps: 32, 101, 169, 238, 306, 375, 443,
# 512. No global tokens (a language model has none) and no dilation.
# 8 GPUs:   python train.py config/longformer_gpt.py --nproc_per_node=8
# 1 GPU:    python train.py config/longformer_gpt.py            (same global batch, 8x the accumulation steps)
# One W in every layer (the "window" row):  python train.py config/longformer_gpt.py --longformer_window_last=0

import os
exec(open(os.path.join(os.path.dirname(__file__), 'krause_gpt.py')).read())  # shape, data, batch, schedule, eval

out_dir = 'out-longformer-gpt'
attention = 'longformer'
mix = False              # the rule alone, as in the paper's table's baseline rows
longformer_window = 32   # the first layer's W
longformer_window_last = 512  # the last layer's W
flex = True              # flex_attention on CUDA (the band's math path elsewhere)
