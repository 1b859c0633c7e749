"""
Write a LoRA fine-tune's checkpoint as a plain one, each update B·A folded into its weight (model.merged_state):
what another tool, or a base for the next fine-tune, reads without knowing LoRA.

$ python studies/merge_lora.py --ckpt=out-finetune/ckpt.pt --out=out-finetune/merged.pt
"""
import argparse
import os
import sys

if __package__ in (None, ''):  # run as a script: the repo root on the path, as for prepare/
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from model import merged_state
from support.checkpoint import load_checkpoint, save_checkpoint


def main():
    parser = argparse.ArgumentParser(description="Write a checkpoint with its LoRA updates merged into the weights.")
    parser.add_argument('--ckpt', required=True, help="a train.py checkpoint made with lora_rank > 0")
    parser.add_argument('--out', required=True, help="where the merged checkpoint goes")
    args = parser.parse_args()
    # checkpoint to checkpoint: the dict (load_checkpoint), not a model (load_run), so that iter_num, config and meta
    # go across as they are and the state dict keeps train.py's names
    checkpoint = load_checkpoint(args.ckpt, 'cpu', hint="pass --ckpt=PATH of a train.py checkpoint")
    model_args = checkpoint['model_args']
    if not model_args.get('lora_rank'):
        raise SystemExit(f"error: {args.ckpt} has no LoRA (lora_rank=0); it is already a plain checkpoint")
    state = merged_state(checkpoint['model'], model_args['lora_alpha'] / model_args['lora_rank'])
    keep = ('model_args', 'iter_num', 'best_val_loss', 'config', 'meta')
    merged = {**{k: checkpoint[k] for k in keep if k in checkpoint}, 'model': state,
              'model_args': {**model_args, 'lora_rank': 0}}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    save_checkpoint(merged, args.out)
    print(f"wrote {args.out}: {len(state)} tensors, LoRA merged (rank {model_args['lora_rank']})")


if __name__ == '__main__':
    main()
