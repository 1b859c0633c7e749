# Fine-tune GPT-2 (124M) on Tiny Shakespeare in GPT-2 BPE: nanoGPT's config/finetune_shakespeare.py (which starts
# from gpt2-xl: add --init_from=gpt2-xl), every weight trained, the shape and rule GPT-2's.
#   python train.py config/finetune_shakespeare.py
#   python sample.py --out_dir=out-shakespeare --start="ROMEO:"
# GPT-2's weights come from the Hugging Face Hub on first use; offline, pass --init_from=FOLDER holding its
# config.json and model.safetensors. With LoRA: config/finetune_shakespeare_lora.py; with LoRA and a Krause shortcut
# beside every pretrained attention layer (the Krause paper's fine-tune): config/finetune_shakespeare_krause.py.
import time

out_dir = 'out-shakespeare'
eval_interval = 5
eval_iters = 40
wandb_log = False  # feel free to turn on
wandb_project = 'shakespeare'
wandb_run_name = 'ft-' + str(time.time())

dataset = 'shakespeare'
init_from = 'gpt2'  # 'gpt2-medium', 'gpt2-large', 'gpt2-xl' for the larger ones

# only save checkpoints if the validation loss improves
always_save_checkpoint = False

# the number of examples per iter: 1 batch_size * 32 grad_accum * 1024 tokens = 32,768 tokens/iter;
# shakespeare has 301,966 tokens, so 1 epoch ~= 9.2 iters
batch_size = 1
gradient_accumulation_steps = 32
max_iters = 20

# finetune at constant LR
learning_rate = 3e-5
decay_lr = False
