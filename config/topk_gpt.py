# Top-k attention GPT: the Krause paper's "top-k" row in its language-model comparison (arXiv 2602.11534), i.e.
# Gupta et al.'s top-k attention (arXiv 2106.06899; docs/rules.md#top-k) trained from scratch on the Krause 100M
# recipe: config/krause_gpt.py's data, shape, batch and schedule, with every layer's attention a softmax over each
# query's k largest scaled dot products (k = 32) over the whole causal context, and no softmax branch (mix=False).
# The Krause paper does not say which k its top-k row used; 32 is its Krause window W (Krause keeps 16 of those):
# try --topk_k=16 for as many keys per query as Krause keeps.
# 8 GPUs:  python train.py config/topk_gpt.py --nproc_per_node=8
# 1 GPU:   python train.py config/topk_gpt.py            (same global batch, 8x the accumulation steps)
# Compare with config/krause_gpt.py (--mix=False for pure Krause) and config/softmax_fineweb.py.

import os
exec(open(os.path.join(os.path.dirname(__file__), 'krause_gpt.py')).read())  # the Krause LM recipe (krause_* unused)

out_dir = 'out-topk-gpt'
attention = 'topk'
mix = False              # top-k alone, as the paper's baseline rows are single rules
topk_k = 32              # keys kept per query (rows with fewer visible keys keep them all)
flex = True              # flex_attention on CUDA: a no-grad pre-pass finds each row's cut (the math path elsewhere)
