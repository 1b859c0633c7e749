# Routing Transformer GPT: the Krause paper's language-model comparison row "Routing" (Roy et al. 2021, arXiv
# 2003.05997; docs/rules.md#routing) on the Krause 100M recipe, config/krause_gpt.py: 8 layers, 768 wide, 12 heads,
# MLP 2048, context 1024, FineWeb-Edu sample-10BT, 0.5M tokens per step; no softmax branch (mix=False).
# Per layer: 6 routing heads (shared q/k, C = 32 = √1024 centroids, k-means by EMA λ = 0.999, commitment 1e-4) and
# 6 local heads (the last 32 tokens); a routing query sees the last w = 32 keys of its cluster. C and w are this
# project's choice: √T clusters as the paper, and w = T/C = 32, the balanced form's cluster size and the Krause and
# window rows' 32 keys per query.
# 8 GPUs:   python train.py config/routing_gpt.py --nproc_per_node=8
# 1 GPU:    python train.py config/routing_gpt.py            (same global batch, 8x the accumulation steps)

import os
exec(open(os.path.join(os.path.dirname(__file__), 'krause_gpt.py')).read())  # shape, data, batch, schedule, eval

out_dir = 'out-routing-gpt'
attention = 'routing'
mix = False              # the Routing row alone, no softmax branch
routing_clusters = 32    # C per routing head
routing_window = 32      # w: the last 32 keys of the query's cluster; the local heads' window
routing_local_heads = 6  # half the heads local, as the paper mixes them
routing_decay = 0.999
routing_commitment = 1e-4
flex = False             # routing has no flex path (the math path: a band over the cluster-sorted tokens)
