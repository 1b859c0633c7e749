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
from support.atomic import save_checkpoint
from support.loading import load_checkpoint
from support.checks import check_or_exit


def check_merge_settings(ckpt, out):
    """ValueError naming the first bad argument, before the checkpoint is read: the input must be a file, and the
    output never the input (a training checkpoint's optimizer and RNG state would be lost), however it is spelled."""
    if not os.path.isfile(ckpt):
        raise ValueError(f"ckpt={ckpt} is not a file; pass --ckpt=PATH of a train.py checkpoint (out_dir/ckpt.pt)")
    if os.path.realpath(out) == os.path.realpath(ckpt) or os.path.exists(out) and os.path.samefile(out, ckpt):
        raise ValueError(f"out={out} is the input checkpoint {ckpt}: merging there would overwrite it and lose its "
                         f"optimizer and RNG state (its run could not resume); pass --out=ANOTHER_PATH, e.g. "
                         f"{os.path.join(os.path.dirname(ckpt), 'merged.pt')}")
    if os.path.isdir(out):
        raise ValueError(f"out={out} is a folder; pass --out=PATH of the merged checkpoint file, e.g. "
                         f"{os.path.join(out, 'merged.pt')}")


def main():
    parser = argparse.ArgumentParser(description="Write a checkpoint with its LoRA updates merged into the weights.")
    parser.add_argument('--ckpt', required=True, help="a train.py checkpoint made with lora_rank > 0")
    parser.add_argument('--out', required=True, help="where the merged checkpoint goes")
    args = parser.parse_args()
    check_or_exit(check_merge_settings, args.ckpt, args.out)
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
    try:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        save_checkpoint(merged, args.out)
    except (OSError, RuntimeError) as e:  # torch.save's RuntimeError wraps a failed write (disk full)
        why = getattr(e, 'strerror', None) or (str(e).splitlines() or [''])[0][:200]
        raise SystemExit(f"error: cannot write {args.out} ({why}); nothing was written "
                         f"there and {args.ckpt} is as it was; pass --out=PATH where there is room and run again")
    print(f"wrote {args.out}: {len(state)} tensors, LoRA merged (rank {model_args['lora_rank']})")


if __name__ == '__main__':
    main()
