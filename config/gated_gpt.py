# Gated softmax GPT, the TDA paper's "Gated Softmax" row (Table 1): softmax attention whose output is gated per head
# and channel by σ(x W_g) after SDPA, before c_proj (Qiu et al. 2025, arXiv 2505.06708, G1 elementwise;
# docs/rules.md#gated), on the TDA paper's GPT-2-162M setup (config/tda_gpt.py: 12 layers, 12 heads, 768 wide, RoPE,
# untied head, FineWeb-Edu, its recipe). The gate adds 7.09M parameters (768² + 768 per layer); headwise 0.11M.
# 8 GPUs:  python train.py config/gated_gpt.py --nproc_per_node=8
# 1 GPU:   python train.py config/gated_gpt.py            (same global batch, 8x the accumulation steps)
# Headwise (one gate per head):  python train.py config/gated_gpt.py --gated_headwise=True

import os
exec(open(os.path.join(os.path.dirname(__file__), 'tda_gpt.py')).read())  # the TDA table's shape, data and recipe

out_dir = 'out-gated-gpt'
attention = 'gated'
gated_headwise = False   # elementwise, the paper's best form
