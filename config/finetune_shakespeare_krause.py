# GPT-2 (124M) on Tiny Shakespeare, the Krause paper's language-model fine-tune: every layer keeps its pretrained
# attention and gains a Krause branch beside it (a shortcut whose q/k/v/out start as copies of the pretrained ones;
# W=32, k=16, σ₀=5.5), mixed per token by a gate that starts at 0.8 / 0.2; LoRA on both branches and the MLP; trained:
# LoRA, the gates and σ. Its pair without the shortcut: config/finetune_shakespeare_lora.py.
#   python train.py config/finetune_shakespeare_krause.py
#   python studies/analyze.py --out_dir=out-shakespeare-krause      # first-token share of the pretrained branch and the mix
import os
exec(open(os.path.join(os.path.dirname(__file__), 'finetune_shakespeare_lora.py')).read())  # same recipe, + shortcut
out_dir = 'out-shakespeare-krause'
attention = 'krause'
mix = True
krause_window = 32
krause_topk = 16
krause_sigma = 5.5
