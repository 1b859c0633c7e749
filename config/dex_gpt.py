# DEX GPT: the "Dex" row of the Threshold Differential Attention paper's Table 1 (arXiv 2601.12145), on that table's
# setup (config/tda_gpt.py): GPT-2-162M = 12 layers, 12 heads, 768 wide, RoPE and no learned positions, untied
# output head; FineWeb-Edu sample-10BT; AdamW lr 1e-3 warm-up then cosine to 1e-4, weight decay 0.1. The rule is
# DEX ("Understanding Differential Transformer Unchains Pretrained Self-Attentions", Kong, Jang, Kwak 2025, arXiv
# 2505.16333; docs/rules.md#dex): y = O - λ·f_D(O) on half of each layer's heads, trained from scratch here as in the
# TDA table. The DEX paper adapts pretrained LLMs instead, and does not publish f_D, λ's schedule or its head choice:
# this project's choices (a per-head D×D linear f_D from 0, λ learned per head from 0.1, the last 6 heads) are
# explained in docs/rules.md#dex. Everything else is build-nanogpt's recipe, config/softmax_fineweb.py.
# 8 GPUs:  python train.py config/dex_gpt.py --nproc_per_node=8
# 1 GPU:   python train.py config/dex_gpt.py            (same global batch, 8x the accumulation steps)
# Softmax on the same setup:   python train.py config/dex_gpt.py --attention=softmax

import os
exec(open(os.path.join(os.path.dirname(__file__), 'softmax_fineweb.py')).read())  # data, batch, schedule, eval

out_dir = 'out-dex-gpt'
pos_emb = 'rope'         # no learned positions
tie_weights = False      # untied head: 124M + 38.6M = 162M parameters (DEX adds 6·64² + 6 = 24.6K per layer)

attention = 'dex'
dex_heads = 6            # the last 6 of 12 heads in every layer
dex_lambda = 0.1         # λ, learned per head (as its logit)
dex_init = 'zero'        # f_D starts at 0: the model starts as softmax attention
cpu_recipe += ' --dex_heads=0'  # the recipe's 2 heads: DEX on half of them (0), as on 6 of 12 here

learning_rate = 1e-3
min_lr = 1e-4
weight_decay = 0.1
