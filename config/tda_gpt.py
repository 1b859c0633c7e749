# Threshold Differential Attention GPT: the paper's setup (arXiv 2601.12145; docs/rules.md#tda): GPT-2-162M =
# 12 layers, 12 heads, 768 wide, RoPE and no learned positions, untied output head; FineWeb-Edu sample-10BT; AdamW
# lr 1e-3 warm-up then cosine to 1e-4, weight decay 0.1; HellaSwag at every evaluation. The paper reports val loss
# 3.1190 (softmax 3.1196) at 99% exact zeros. Everything else is build-nanogpt's recipe, config/softmax_fineweb.py,
# which this runs.
# 8 GPUs:  python train.py config/tda_gpt.py --nproc_per_node=8
# 1 GPU:   python train.py config/tda_gpt.py            (same global batch, 8x the accumulation steps)
# Single-view ablation (TRA):  python train.py config/tda_gpt.py --tda_differential=False
# Matched form (views = the halves of one q, k per head; softmax's parameters + 792):
#                              python train.py config/tda_gpt.py --tda_matched=True
# Softmax on the same setup:   python train.py config/tda_gpt.py --attention=softmax

import os
exec(open(os.path.join(os.path.dirname(__file__), 'softmax_fineweb.py')).read())  # data, batch, schedule, eval

out_dir = 'out-tda-gpt'
pos_emb = 'rope'         # no learned positions
tie_weights = False      # untied head: 124M + 38.6M = 162M parameters

attention = 'tda'
tda_beta = 1.0           # β, learned per layer
tda_lambda = 0.5         # λ, learned per layer
tda_kappa = 1.0          # κ, fixed: τ_0 = 0
tda_p = 2.0              # p, fixed
tda_matched = False      # full-width views: 176.43M (+14.18M); the paper's width is unpublished (its name, 162M, fits
                         # tda_matched=True: views of D/2 = 32, 162.25M; docs/rules.md#tda)
# on CUDA forward runs TDA's Triton kernel (--flex=True: flex_attention, to compare), the chunked math path elsewhere

learning_rate = 1e-3
min_lr = 1e-4
weight_decay = 0.1
