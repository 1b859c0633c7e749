# GPT-2 (124M) on Tiny Shakespeare with LoRA: the Krause paper's fine-tune without its shortcut (rank 16, α 32,
# dropout 0.1, on attention's q/k/v and output and on the MLP; the base frozen). Its pair, the same with a Krause
# branch beside every pretrained attention layer: config/finetune_shakespeare_krause.py.
#   python train.py config/finetune_shakespeare_lora.py
# Recipe: config/finetune_shakespeare.py (nanoGPT's), with a rate fit for LoRA, whose updates start at zero: the
# paper's 5e-5 is for thousands of steps, these are 20. Not run on GPT-2 here (no Hub reachable from our machines).
import os
exec(open(os.path.join(os.path.dirname(__file__), 'finetune_shakespeare.py')).read())  # the recipe, then LoRA
out_dir = 'out-shakespeare-lora'
lora_rank = 16
lora_alpha = 32.0
lora_dropout = 0.1
lora_targets = 'c_attn,c_proj,c_fc'
learning_rate = 1e-3
decay_lr = True     # cosine, as the paper
warmup_iters = 2
lr_decay_iters = 20
min_lr = 1e-4
