# Cluster attention GPT (this project's rule, docs/rules.md#cluster): nanoGPT's GPT-2 124M recipe on OpenWebText
# (config/softmax_gpt.py) with attention='cluster'. Each query attends exactly to its own chunk of 64 tokens and to
# m = 64 cluster summaries (mass, mean key, mean value) of all earlier chunks: 128 entries per query, not up to 1024.
# 8 GPUs:  python train.py config/cluster_gpt.py --nproc_per_node=8
# CPU, nanoGPT's baby GPT (docs/RESULTS.md#cluster-attention): cpu_recipe below, which train.py prints when this
# config runs on a CPU

import os
exec(open(os.path.join(os.path.dirname(__file__), 'softmax_gpt.py')).read())  # the baseline recipe

out_dir = 'out-cluster-gpt'
cpu_recipe = ('config/shakespeare_char.py --attention=cluster --cluster_chunk=16 --device=cpu --compile=False '
              '--eval_iters=20 --log_interval=1 --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 '
              '--max_iters=2000 --lr_decay_iters=2000 --dropout=0.0')
attention = 'cluster'
cluster_m = 64           # seeds per head
cluster_chunk = 64       # exact causal attention within a chunk; clusters of the chunks before it
cluster_sharpness = 10.0 # initial s of softmax_c(s·cos(k, seed_c)), learned per head
cluster_seed_lr = 10.0   # seeds: 10x the learning rate, no weight decay (unit seeds; see ClusterAttention)
