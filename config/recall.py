# Multi-query associative recall (Zoology's MQAR; the embedded default of train.py, written out): 4 key-value pairs
# over 16 keys, sequences of 32 tokens, then queries. Loss and accuracy count answer tokens only (docs/RESULTS.md#recall).
# python train.py config/recall.py                  (the same as python train.py)
# Swap `attention` to compare rules:
# python train.py config/recall.py --attention=softmax --window=8   (a window too short to see the pairs)

out_dir = 'out-recall'
dataset = 'recall'
recall_keys = 16
recall_pairs = 4
block_size = 32
batch_size = 256
eval_interval = 100
eval_iters = 20
log_interval = 10

n_layer = 2
n_head = 4
n_embd = 128
dropout = 0.0

learning_rate = 1e-3
max_iters = 600
lr_decay_iters = 600
warmup_iters = 50
min_lr = 1e-4
beta2 = 0.99
