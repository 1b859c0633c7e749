"""
Train a GPT (text) or a ViT (images) with any attention rule: nanoGPT's train.py, extended.

With no arguments a small GPT learns multi-query associative recall, offline, on a CPU, in minutes:
$ python train.py

A config file, then single overrides; an image dataset trains a ViT (augmented on the device):
$ python train.py config/softmax_vit.py --batch_size=64

DDP on one node (NCCL on CUDA, gloo on CPU), train.py starting torchrun's processes once the settings are checked:
$ python train.py config/krause_gpt.py --nproc_per_node=8
"""
import math
import os
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from rules import AttentionConfig
from support.loading import load_checkpoint
from support.resume import check_resumable, restore_rng_states, rng_states
from support.rundir import RunDir
from support.checks import check_train_config, one_line_errors
from support.data import Batches, answer_counts, bits_per_dim
from model import GPT, GPTConfig, attention_paths, attention_reports
from support.pretrained import OWN_STARTS, check_tokens, fine_tune_args, load_base, load_base_weights
from prepare import (ROOT, check_dataset_dir, check_files, dataset_kind, default_data_dir,
                     prepare_dataset, val_tokens_needed)
from support.runtime import (all_sum, batch_progress, init_ddp, dataclass_defaults, dataclass_values,
                             exit_with_error, launch_torchrun, note_cpu_recipe, peak_flops, precision,
                             wait_for_rank0)
from vit import ViT, ViTConfig

# -----------------------------------------------------------------------------
# default config values: a 2-layer GPT learning multi-query associative recall, offline, on a CPU
# I/O
out_dir = 'out'             # ckpt.pt goes here
eval_interval = 100         # evaluate (and write ckpt.pt) every this many iterations
log_interval = 10           # print the training loss every this many iterations
eval_iters = 20             # batches per split in an evaluation
eval_only = False           # evaluate once and exit
eval_full = False           # with eval_only: every val example once, exactly (text: every window)
eval_examples = 0           # eval_full: the first this many val examples only (0: all of them)
wandb_log = False           # also log to Weights & Biases (wandb imported only when on)
wandb_project = 'attention-lab'
wandb_run_name = 'run'
always_save_checkpoint = True  # else only when val loss improves
init_from = 'scratch'       # 'scratch', 'resume', 'auto' (resume if out_dir has ckpt.pt), or a
                            # base to fine-tune (support/pretrained.py): 'gpt2' (-medium, -large,
                            # -xl), a Hub-layout folder, a ckpt.pt
cpu_recipe = ''             # a GPU-sized config's CPU command line (train.py's arguments), said when it runs on a CPU
# data
dataset = 'recall'          # a name in prepare.DATASETS
data_dir = ''               # default: data/<dataset>
data_source = ''            # a local copy of the dataset to prepare from instead of downloading
gradient_accumulation_steps = 1  # per optimizer step, summed over all processes
batch_size = 256            # micro-batch size per process
block_size = 32             # tokens per sequence (text: the context length)
recall_keys = 16            # recall task: key vocabulary, pairs per sequence (of block_size tokens)
recall_pairs = 4            # (recall_pairs <= recall_keys, 2 * recall_pairs < block_size)
passkey_needles = '1'       # passkey task: passkeys per sequence, or counts to draw from ('1,2,4')
hellaswag = False           # GPT-2 BPE models: HellaSwag acc_norm at every evaluation
hellaswag_source = ''       # a local hellaswag_val.jsonl instead of the download
# model
n_layer = 2                 # transformer blocks
n_head = 4                  # attention heads; must divide n_embd
n_embd = 128                # model width
dropout = 0.0               # dropout probability everywhere in the model; in [0, 1)
bias = False
attention = 'softmax'       # a key of rules.ATTENTION
flex = False                # flex_attention path on CUDA
pos_emb = 'learned'         # 'learned', 'rope' or 'none' (causality alone orders the tokens)
mlp_hidden = 0              # 0 means 4 * n_embd
tie_weights = True
drop_path = 0.0             # stochastic depth of the last block, linear from 0 at the first (ViTs)
gelu_approximate = 'none'   # MLP GELU: 'none' (exact) or 'tanh' (GPT-2's; a GPT-2 base sets it)
# fine-tuning a base: LoRA trains low-rank updates of some Linears and freezes the rest (model.py)
lora_rank = 0               # rank of each update; 0: no LoRA, every weight trains
lora_alpha = 32.0           # the update is scaled by lora_alpha / lora_rank
lora_dropout = 0.0          # dropout on the update's input
lora_targets = 'c_attn,c_proj,c_fc'  # attention's q/k/v and out (every branch), the MLP's two
# images (ViT): a dataset of kind 'image' trains a ViT; training batches are augmented on the device
patch_size = 4              # must divide the 32-pixel image side
num_classes = 0             # 0: from the prepared dataset's meta.json; else checked against it
augment = True              # random crop of the 4-pixel zero-padded image, and horizontal flip
mixup_alpha = 0.0           # MixUp with lam ~ Beta(a, a); 0 disables
cutmix_alpha = 0.0          # CutMix with lam ~ Beta(a, a); 0 disables
cutmix_prob = 0.8           # with both on, CutMix on this fraction of batches and MixUp on the rest
label_smoothing = 0.0       # images: in [0, 1)
# AdamW
learning_rate = 1e-3        # peak, after warm-up
max_iters = 600             # the last iteration; training stops after it
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.99
grad_clip = 1.0             # 0 disables
# learning rate: linear warm-up, then cosine decay to min_lr
decay_lr = True             # else learning_rate throughout
warmup_iters = 50           # linear warm-up iterations
lr_decay_iters = 600        # cosine ends here (> warmup_iters); usually max_iters
min_lr = 1e-4               # after lr_decay_iters; usually learning_rate / 10
# system (dtype: the autocast on CUDA; a CPU runs in float32)
device = 'cuda' if torch.cuda.is_available() else 'cpu'  # or 'cpu', 'cuda:1', 'mps'
dtype = 'bfloat16' if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else 'float32'
compile = True              # torch.compile the model (CUDA only)
nproc_per_node = 1          # DDP: this many processes of this node (a GPU each), under torchrun, started by train.py
seed = 1337                 # model init, dropout and batches
# every attention rule's own keys (window, ...) are config keys too, with the rule's defaults
globals().update(dataclass_defaults(AttentionConfig, globals()))
# -----------------------------------------------------------------------------
config_keys = [k for k, v in globals().items() if not k.startswith('_') and isinstance(v, (int, float, bool, str))]
exec(open(ROOT / 'configurator.py').read())
config = {k: globals()[k] for k in config_keys}  # will be useful for logging
# -----------------------------------------------------------------------------


# the run's hold on out_dir (RunDir): Ctrl-C, a failed write or the data gone mid-run end in one
# line saying what is kept; run.open() makes out_dir and takes its lock, released at exit
run = RunDir(out_dir, master=int(os.environ.get('RANK', 0)) == 0)
# every setting is checked before any work: a bad value is one `error:` line naming it and the fix
set_keys = overridden & set(config_keys)  # what config files and --key=value set (configurator.py)
with one_line_errors():
    check_train_config(config, world_size=int(os.environ.get('WORLD_SIZE', nproc_per_node)), set_keys=set_keys,
                       typed=typed)
if nproc_per_node > 1 and 'RANK' not in os.environ:  # torchrun runs this command as the processes
    launch_torchrun(nproc_per_node)  # never returns: a process's first `error:` line is said last
note_cpu_recipe('this config', 'train.py', cpu_recipe, config, show=run.master)  # GPU-sized, on a CPU: one line
kind = dataset_kind(dataset)  # 'text', 'examples', 'image' (a ViT) or 'pixels' (prepare.DATASETS)

# a base to fine-tune (support/pretrained.py), read and checked against the settings first
base = base_name = None  # base_name: what a checkpoint records
if init_from not in OWN_STARTS:  # support/checks.py refused a base for a ViT
    base_name = init_from
    with one_line_errors():
        base = load_base(init_from, dataset)  # its shape and vocabulary are the run's model's
        base_args = fine_tune_args(base, dataclass_values(GPTConfig, globals()), set_keys)

# DDP: torchrun sets RANK, LOCAL_RANK, WORLD_SIZE; a process per GPU (NCCL) or on the CPU (gloo)
ddp, ddp_rank, ddp_local_rank, ddp_world_size, device = init_ddp(device)
master_process = ddp_rank == 0
local_accum_steps = gradient_accumulation_steps // ddp_world_size
samples_per_iter = gradient_accumulation_steps * batch_size
tokens_per_iter = samples_per_iter * block_size
if master_process:
    print(f"images per iteration will be: {samples_per_iter:,}" if kind == 'image' else
          f"tokens per iteration will be: {tokens_per_iter:,}")
    run.open(lock=not eval_only, replacing=init_from not in ('resume', 'auto'))  # eval_only only reads: no lock
torch.manual_seed(seed + ddp_rank)  # dropout differs between processes
torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
device_type, ptdtype, ctx = precision(device, dtype)  # autocast on CUDA; CPU runs in float32

if hellaswag:  # its rows first: a missing file stops the run before any data is prepared
    from support import hellaswag as hellaswag_eval
    with one_line_errors(OSError, RuntimeError):
        hellaswag_rows = hellaswag_eval.load_rows(hellaswag_source or None, ddp=ddp)

# -----------------------------------------------------------------------------
# data: prepared on rank 0 if missing (the others wait), then read batch by batch (support/data.py)
data_dir = config['data_dir'] = os.path.abspath(data_dir or default_data_dir(dataset))
if master_process:
    with one_line_errors(OSError, RuntimeError):
        check_dataset_dir(dataset, data_dir)  # a damaged or foreign folder is never written to
        char_base = base is not None and base['meta'].get('encoding') == 'chars'
        prepare_dataset(dataset, data_dir, data_source, config,  # a character base: its alphabet
                        **({'chars': base['meta']['itos']} if char_base else {}))
wait_for_rank0(ddp, ddp_rank)  # where rank 0 stopped instead, it says why
with one_line_errors():
    meta, split_rows = check_files(dataset, data_dir)  # every file the size meta.json says
    batches = Batches(dataset, data_dir, meta, split_rows, block_size, batch_size, device,
                      num_classes=num_classes, augment=augment, mixup_alpha=mixup_alpha,
                      cutmix_alpha=cutmix_alpha, cutmix_prob=cutmix_prob,
                      label_smoothing=label_smoothing, on_change=run.stop)  # a file gone: stop
    batches.check_sizes(val_tokens_needed(config))  # every split holds a whole batch row
    if base:
        check_tokens(base, meta)
train_generator = torch.Generator().manual_seed(seed)  # its state, the data position, is saved

# -----------------------------------------------------------------------------
# model init: a ViT for images, a GPT otherwise; its classes or its vocabulary from the data
ModelConfig, Model = (ViTConfig, ViT) if kind == 'image' else (GPTConfig, GPT)
model_args = dataclass_values(ModelConfig, globals(), **batches.model_sizes)
iter_num, best_val_loss, checkpoint, ckpt_path = 0, 1e9, None, run.ckpt_path
if init_from == 'auto':  # a restarted torchrun worker goes on from the checkpoint if there is one
    init_from = 'resume' if os.path.exists(ckpt_path) else 'scratch'
if init_from == 'resume':
    if not os.path.exists(ckpt_path):
        exit_with_error(f"init_from='resume' but there is no checkpoint at {ckpt_path}; check out_dir or use "
                        f"init_from='scratch'")
    checkpoint = load_checkpoint(ckpt_path, device, resume=True)
    with one_line_errors():
        if checkpoint.get('base'):  # a fine-tune: its shape is the checkpoint's, as was its base's
            base_name = checkpoint['base']
            resumed = {'name': ckpt_path, 'model_args': checkpoint['model_args']}
            model_args = fine_tune_args(resumed, model_args, set_keys)
        check_resumable(checkpoint, ckpt_path, model_args, dataset, max_iters,  # not past the end
                        dataclass_defaults(ModelConfig, {}))
    iter_num, best_val_loss = run.resume_from(checkpoint)  # what this run's ckpt.pt holds, said
elif base:
    model_args = base_args
with one_line_errors():
    model = Model(ModelConfig(**model_args))
    if base:
        load_base_weights(model, base)
        base = None  # free memory
if checkpoint is not None:
    model.load_state_dict(checkpoint['model'])
model.to(device)
raw_model = model  # unwrapped: what is saved and what estimate_mfu asks
if master_process:
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    print(f"parameters: {sum(p.numel() for p in model.parameters()):,}, trained: {trained:,}"
          + (f" (fine-tuning {base_name})" if base_name else ''))
    print(f"attention: {attention_paths(model, device)}")  # the path forward runs: kernel, flex, SDPA or math

scaler = torch.amp.GradScaler(device_type, enabled=(ptdtype == torch.float16))
optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), device_type)
if checkpoint is not None:
    optimizer.load_state_dict(checkpoint['optimizer'])
    train_generator.set_state(checkpoint['data_rng'].cpu())  # load_checkpoint moved it to device
    restore_rng_states(checkpoint['rng'], ddp_rank, ddp_world_size, device_type)  # dropout streams
checkpoint = None  # free memory

if compile and device_type == 'cuda':
    if master_process:
        print("compiling the model... (takes a ~minute)")
    model = torch.compile(model)
if ddp:
    model = DDP(model, device_ids=[ddp_local_rank] if device_type == 'cuda' else None)
eval_model = model.module if ddp else model  # eval: batches differ per process; DDP's forward syncs RoPE's buffers


@torch.no_grad()
def estimate_loss():
    """Mean loss (and accuracy, where the task has one) over eval_iters batches per split, shared
    out among the processes, and this process's last val batch. The batches are the same at every
    evaluation (a fixed generator): curves compare without noise."""
    out, X = {}, None
    model.eval()
    for split in ('train', 'val'):
        generator = torch.Generator().manual_seed(seed + 1)
        rows = torch.randint(batches.sizes[split], (eval_iters, batch_size), generator=generator)
        loss_sum, correct, counted = 0.0, 0, 0
        for ix in batch_progress(rows[ddp_rank::ddp_world_size], f"eval {split}", master_process):
            X, Y = batches.load_batch(split, ix)
            with ctx:
                logits, loss = eval_model(X, Y)
            right, asked = answer_counts(logits, Y)
            loss_sum, correct, counted = loss_sum + loss.item(), correct + right, counted + asked
        loss_sum, correct, counted = all_sum((loss_sum, correct, counted), device)
        out[split], out[split + '_acc'] = loss_sum / eval_iters, correct / max(counted, 1)
    model.train()
    return out, X


@torch.no_grad()
def evaluate_full():
    """One exact pass over the whole val split, every example once (text: every block_size window;
    see Batches.full_split_starts). Loss summed per target and divided by their count (so batch size
    does not matter); accuracy where the task has one."""
    model.eval()
    starts = batches.full_split_starts('val')[:eval_examples or None]
    loss_sum, correct, counted = 0.0, 0, 0
    mine = list(starts.split(batch_size))[ddp_rank::ddp_world_size]  # this process's batches
    for ix in batch_progress(mine, 'eval_full', master_process):
        X, Y = batches.load_batch('val', ix)
        with ctx:
            logits, _ = eval_model(X, Y)
        logits, Y = logits.float().view(-1, logits.size(-1)), Y.reshape(-1)  # (B*T, V), (B*T,)
        loss = torch.nn.functional.cross_entropy(logits, Y, ignore_index=-1, reduction='sum')
        right, asked = answer_counts(logits, Y)
        loss_sum, correct, counted = loss_sum + loss.item(), correct + right, counted + asked
    loss_sum, correct, counted = all_sum((loss_sum, correct, counted), device)
    model.train()
    return {'val_loss': loss_sum / counted, 'val_acc': correct / counted, 'examples': len(starts),
            'targets': int(counted)}


def get_lr(it):
    if it < warmup_iters:  # linear warm-up
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))  # 1 -> 0
    return min_lr + coeff * (learning_rate - min_lr)


# logging: out_dir/log.jsonl on rank 0, trimmed back on resume (MetricsLog), wandb; not eval_only's
metrics = run.metrics_log(wandb_log) if master_process and not eval_only else None
if master_process and wandb_log:
    import wandb
    wandb.init(project=wandb_project, name=wandb_run_name, config=config)

# -----------------------------------------------------------------------------
# training loop
has_accuracy = kind not in ('text', 'pixels')


def score_text(val_loss, val_acc):
    """What follows the val loss when printed: a pixel model's bits/dim, else any task accuracy."""
    if kind == 'pixels':
        return f", val bits/dim {bits_per_dim(val_loss):.4f}"
    return f", val acc {val_acc:.4f}" if has_accuracy else ''


if eval_full:
    result = evaluate_full()
    if master_process:
        if kind == 'pixels':  # every predicted subpixel of the test split, once across ranks
            result['bits_per_dim'] = bits_per_dim(result['val_loss'])
        print(f"full val split at iteration {iter_num}: val loss {result['val_loss']:.4f}"
              f"{score_text(result['val_loss'], result['val_acc'])} over {result['examples']:,} "
              f"{'windows' if kind == 'text' else 'examples'} ({result['targets']:,} targets)")
        run.write_json('eval_full.json', {'iter': iter_num, 'attention': attention, **result})
    if ddp:
        dist.destroy_process_group()
    raise SystemExit(0)
start_iter = iter_num
t0 = time.time()
running_mfu = -1.0
gpu_peak_flops = peak_flops(device)
progress = tqdm(total=max_iters, initial=iter_num, unit='it', dynamic_ncols=True,
                disable=None if master_process else True)  # the bar shows only on a terminal
log = tqdm.write
while True:
    lr = get_lr(iter_num) if decay_lr else learning_rate
    for param_group in optimizer.param_groups:
        param_group['lr'] = lr * param_group.get('lr_scale', 1.0)  # a rule's own rate for its seeds

    # evaluate the loss on train/val sets and write checkpoints; always at the last iteration
    if iter_num % eval_interval == 0 or iter_num == max_iters or eval_only:
        losses, last_val_batch = estimate_loss()
        batches.check_unchanged()  # a file rewritten at the same size, or prepared again: stop before saving
        if master_process:
            log(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}"
                f"{score_text(losses['val'], losses['val_acc'])}")
            with ctx:  # what a rule reports on itself (cluster usage), per layer, as head means
                reports = attention_reports(raw_model, last_val_batch)
            for name, report in reports:
                means = ', '.join(f"{k} {v.float().mean():.3f}" for k, v in report.items())
                log(f"  {name}: {means}")
            record = {'type': 'eval', 'iter': iter_num, 'train_loss': losses['train'],
                      'val_loss': losses['val']}
            if has_accuracy:
                record['val_acc'] = losses['val_acc']
            if kind == 'pixels':
                record['val_bits_per_dim'] = bits_per_dim(losses['val'])
            if metrics:  # None with eval_only
                metrics.write(record)
        if not math.isfinite(losses['val']):
            exit_with_error(f"val loss is {losses['val']} at iteration {iter_num}; {run.kept()}; lower "
                            f"learning_rate or check the data")
        if losses['val'] < best_val_loss or always_save_checkpoint:
            best_val_loss = min(best_val_loss, losses['val'])
            if iter_num > start_iter:
                rng = rng_states(device_type)  # every process takes part
                if master_process:
                    print(f"saving checkpoint to {out_dir}")  # a failed write keeps the old ckpt.pt
                    run.save({'model': raw_model.state_dict(), 'optimizer': optimizer.state_dict(),
                              'model_args': model_args, 'iter_num': iter_num, 'rng': rng,
                              'best_val_loss': best_val_loss, 'config': config, 'meta': meta,
                              'data_rng': train_generator.get_state(), 'base': base_name})
                run.saved_iter = iter_num
        if hellaswag:
            counts = hellaswag_eval.evaluate(raw_model, hellaswag_rows, device, ddp_rank,
                                             ddp_world_size, ctx, progress=master_process)
            correct, total = all_sum(counts, device)
            if master_process:
                log(f"hellaswag acc_norm {correct / total:.4f}")
    if eval_only:
        break

    # forward backward update, with gradient accumulation; all-reduced at the last micro-step only
    rows = batches.iteration_rows(train_generator, local_accum_steps, ddp_rank, ddp_world_size)
    for micro_step, (ix, augment_seed) in enumerate(rows):
        X, Y = batches.load_batch('train', ix, augment_seed)
        sync = ddp and micro_step == local_accum_steps - 1
        with (model.no_sync() if ddp and not sync else nullcontext()), ctx:
            logits, loss = model(X, Y)
            loss = loss / local_accum_steps  # scale the loss to account for gradient accumulation
        scaler.scale(loss).backward()
    if grad_clip != 0.0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)

    # timing and logging
    t1 = time.time()
    dt, t0 = t1 - t0, t1
    if iter_num % log_interval == 0:
        lossf = loss.item() * local_accum_steps  # a CPU-GPU sync point; the last micro-step's loss
        if not math.isfinite(lossf):
            exit_with_error(f"loss is {lossf} at iteration {iter_num}; stopped: {run.kept()}; lower "
                            f"learning_rate, or raise warmup_iters or grad_clip")
        if master_process:
            per_s = samples_per_iter / dt if kind == 'image' else tokens_per_iter / dt
            extra = f", {per_s:,.0f} {'images/s' if kind == 'image' else 'tok/s'}"
            if gpu_peak_flops and iter_num >= start_iter + 5:  # let the training loop settle a bit
                mfu = raw_model.estimate_mfu(batch_size * local_accum_steps, dt, gpu_peak_flops)
                running_mfu = mfu if running_mfu == -1.0 else 0.9 * running_mfu + 0.1 * mfu
                extra += f", mfu {running_mfu * 100:.2f}%"
            log(f"iter {iter_num}: loss {lossf:.4f}, time {dt * 1000:.2f}ms{extra}")
            rate_name = 'images_per_s' if kind == 'image' else 'tokens_per_s'
            metrics.write({'type': 'train', 'iter': iter_num, 'loss': lossf, 'lr': lr,
                           'time_ms': dt * 1000, rate_name: per_s})
    iter_num += 1
    progress.update(1)
    if iter_num > max_iters:
        break

progress.close()
if ddp:
    dist.destroy_process_group()
run.finish(always_save_checkpoint, best_val_loss, start_iter, max_iters)  # no ckpt.pt written: say why, exit 1
