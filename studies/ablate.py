"""
The lab's table: every attention rule on every system, trained and scored at one budget, with one command; and each
seed paper's comparison (--table=NAME), its rows on equal terms, with one command.

$ python studies/ablate.py --budget=cpu --text_source=input.txt --cifar_source=DIR    # the whole table on a CPU
$ python studies/ablate.py --budget=tiny --systems=recall,passkey --rules=softmax,krause  # seconds a run

Rows (ROWS): every rule in rules.ATTENTION with its official settings per system (a rule registered there and
not named in ROWS runs with its defaults), the mix form (Krause beside softmax) and the sliding-window softmax
baseline. Columns (SYSTEMS): the systems, each scored with the metric its paper reports. A budget (BUDGETS) is each
system's train.py arguments: tiny (seconds a run: the tests), cpu (the whole table in under two hours on 2 cores),
paper (the seed papers' configs: a GPU's job). --recipe adds train.py arguments to every run.

The papers' tables (TABLES, --table=NAME): each seed paper's comparison, its rows and systems as the paper has them,
on equal terms: between two rows of a system only the rule differs (one position encoding, RoPE for the language
models; one shape, one recipe, one data order per seed). --rules and --systems pick among the table's own; a rule
it has no row for is an error before any run. At the paper budget each table runs its paper's recipe (TABLES says
where it departs). Three seeds by default at cpu (one at tiny and paper; --seeds for others). Each cell: mean ±
sample standard deviation (ddof=1) over the seeds, the run's parameter count (every parameter of the model, its own
get_num_params(non_embedding=False)) and attention FLOPs per token and layer, counted on the path that ran and the
rule's ideal (support/flops.py). A row whose mean differs from the system's first row's by more than twice the
combined spread, |m - m₀| > 2·sqrt(s² + s₀²), is marked `*` (one seed: nothing is marked), and a line under each
system's table says which rows differ beyond noise, and which way. One command per table (the cpu budget, the
default; --budget=tiny or paper for the others):
$ python studies/ablate.py --table=tda --text_source=input.txt        # val loss, zeros, sink ratio; passkeys at 4x
$ python studies/ablate.py --table=krause_lm --text_source=input.txt   # standard, window .. krause (mix)
$ python studies/ablate.py --table=krause_vision --cifar_source=C10 --cifar100_source=C100  # ViT top-1
$ python studies/ablate.py --table=krause_images --cifar_source=C10    # pixel models: bits/dim, images/s
$ python studies/ablate.py --table=krause_llm --text_source=input.txt  # LoRA alone, LoRA + Krause shortcut
$ python studies/ablate.py --table=attentionx --text_source=input.txt --cifar_source=C10 --cifar100_source=C100
$ python studies/ablate.py --table=cluster --text_source=input.txt --cifar_source=C10  # trained, and swapped in
$ python studies/ablate.py --table=tda --budget=tiny --rules=softmax,tda --text_source=input.txt   # seconds a run
At the paper budget the language models' cells add the paper's zero-shot tasks, and the tda table's long system
SCROLLS, each a column (studies/harness.py on the run: lm-eval, an extra; the hub's data, or --harness_args naming
local files); --tasks=NAMES scores named tasks at any budget, on a GPT-2 BPE model (--recipe=--dataset=shakespeare).

Run R of system S with seed N lives in out_root/S/R-sN (a table's in out_root/TABLE/S/R-sN; train.log, eval.log,
ckpt.pt, cell.json). A run whose cell.json is there is never trained again, and a run stopped in training goes on
from its last checkpoint: a killed table goes on where it was. A rule with no form for a system says why in its
cell; a run that fails holds its error: line and its log's path, and the others go on. Writes table.md, table.json
(in out_root, or out_root/TABLE), and a PNG per metric when matplotlib is installed. Times are the machine's: run
nothing else on it meanwhile.
"""
import datetime
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time

import numpy as np
from tqdm import tqdm

if __package__ in (None, ''):  # run as a script: the repo root on the path, as for prepare/
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from rules import ATTENTION
from prepare import ROOT
from support.atomic import write_atomically, write_or_exit, write_text
from support.rundir import RunDir
from support.checks import check_int_list, check_or_exit, script_settings

# -----------------------------------------------------------------------------
budget = 'cpu'              # a name in BUDGETS: 'tiny', 'cpu' or 'paper'
table = ''                  # a name in TABLES (a paper's comparison); '' = every rule on every system
systems = 'recall,text,passkey,vit,pixels,shortcut'  # names in SYSTEMS, the table's columns (a table: its own)
rules = ''                  # names in rows(), the table's rows; '' = every row (a table: every row of its own)
seeds = '1337'              # a run per seed; cells show mean ± half the range (a table: 1337,1338,1339 at cpu; ± sd)
out_root = 'lab'            # the runs (a folder per run) and the table
train = True                # train the runs that are missing; False: only tabulate what is there
recipe = ''                 # more train.py arguments for every run, after the budget's (e.g. "--dtype=float32")
text_source = ''            # the text and shortcut systems' data instead of the download (train.py --data_source)
cifar_source = ''           # the vit and pixels systems' CIFAR-10 (a folder with train/test.parquet)
cifar100_source = ''        # the vit100 system's CIFAR-100 (a folder with train/test.parquet)
tasks = ''                  # a table's zero-shot tasks (studies/harness.py) on its cells that have them: '' = the
                            # table's own at the paper budget and none below; 'none'; or names, at any budget
harness_args = ''           # more studies/harness.py arguments for those (e.g. "--limit=200 --batch_size=8")
exec(open(ROOT / 'configurator.py').read())
# -----------------------------------------------------------------------------
SYSTEMS = {  # the columns: what each trains, and the metric its paper reports
    'recall': 'multi-query associative recall (the default job): answer accuracy, whole val split',
    'text': 'language model (tiny-shakespeare characters; paper: GPT-2 on FineWeb-Edu): val loss, whole val split',
    'passkey': 'passkey retrieval trained at T: whole-passkey accuracy at 1x / 2x / 4x T',
    'vit': 'ViT on CIFAR-10: top-1 accuracy, test split',
    'vit100': 'ViT on CIFAR-100: top-1 accuracy, test split (not in the default columns: --systems=vit100)',
    'pixels': 'pixel model on CIFAR-10: bits/dim on the test split; images/s drawn at a fixed batch',
    'shortcut': 'a pretrained base fine-tuned with the rule as a LoRA shortcut beside its softmax: val loss',
    'long': 'long context the TDA way: a base with RoPE, then 4x its length with NTK scaling (s = 4): whole-passkey '
            'accuracy at 4x with 1, 2 and 4 needles',
}
SOURCES = {'text': 'text_source', 'shortcut': 'text_source', 'vit': 'cifar_source', 'vit100': 'cifar100_source',
           'pixels': 'cifar_source'}
KIN = {'vit100': 'vit'}  # a system whose rows' arguments are another's where a row names none of its own
# The budgets: each system's train.py arguments (the shortcut's are added to the base's), and the lab's own settings:
# base ('text': the text system's softmax run of the same seed is the base; else a name for --init_from, 'gpt2'),
# passkey_examples (fresh episodes per length) and draw_batch (images drawn at once for images/s). `long` trains in
# two stages: `long_base` (passkeys with 1, 2 and 4 needles at T; 'text': the text system's run of the same row and
# seed), then `long`'s arguments from its checkpoint, at 4T with NTK-scaled RoPE (docs/rules.md's RoPE scaling).
CPU = '--device=cpu --compile=False'
LORA = '--lora_rank=16 --lora_alpha=32 --lora_dropout=0.1'
SHORT = '--eval_iters=1 --log_interval=5 --warmup_iters=2'
VIT_TINY = (f'{CPU} {SHORT} --n_layer=1 --n_head=2 --n_embd=32 --batch_size=16 --max_iters=4 --lr_decay_iters=4 '
            '--warmup_iters=1 --eval_interval=4 --eval_examples=64')
EXTEND = ('--rope_scaling=ntk --rope_factor=4 --learning_rate=3e-4 --min_lr=3e-5 --always_save_checkpoint=True'
          )  # at 4x the base's block_size (the lr is ours: the TDA paper does not give it)
VIT_CPU = (f'{CPU} --n_layer=4 --n_head=4 --n_embd=128 --batch_size=64 --max_iters=200 --lr_decay_iters=200 '
           '--warmup_iters=10 --eval_interval=200 --eval_iters=10')  # a quarter epoch
BUDGETS = {
    'tiny': {  # seconds a run: what the tests use
        'recall': f'{CPU} {SHORT} --n_layer=1 --n_embd=32 --batch_size=32 --max_iters=20 --lr_decay_iters=20',
        'text': f'config/shakespeare_char.py {CPU} {SHORT} --n_layer=1 --n_head=2 --n_embd=32 --block_size=32 '
                '--batch_size=8 --dropout=0 --max_iters=20 --lr_decay_iters=20 --eval_interval=20 --eval_examples=64',
        'passkey': f'config/passkey.py {CPU} {SHORT} --n_layer=1 --n_embd=32 --batch_size=16 --max_iters=20 '
                   '--lr_decay_iters=20 --eval_interval=20',
        'vit': f'config/softmax_vit.py {VIT_TINY}', 'vit100': f'config/softmax_vit100.py {VIT_TINY}',
        'pixels': f'config/arm_cifar10_cpu_softmax.py {SHORT} --n_layer=1 --n_embd=32 --batch_size=2 --max_iters=2 '
                  '--lr_decay_iters=2 --warmup_iters=1 --eval_interval=2 --eval_examples=2',
        'shortcut': f'{LORA} --max_iters=10 --lr_decay_iters=10 --eval_interval=10',
        'long_base': f'config/passkey.py {CPU} {SHORT} --n_layer=1 --n_embd=32 --batch_size=16 --max_iters=20 '
                     '--lr_decay_iters=20 --eval_interval=20 --passkey_needles=1,2,4',
        'long': f'{EXTEND} --block_size=256 --batch_size=4 --max_iters=4 --lr_decay_iters=4 --warmup_iters=1 '
                '--eval_interval=4',
        'base': 'text', 'passkey_examples': 64, 'draw_batch': 2,
    },
    'cpu': {  # the whole table in under two hours on 2 cores, one seed; RESULTS.md's CPU recipes, some shortened
        'recall': CPU,  # the default job: 600 iterations of 256 sequences
        'text': f'config/shakespeare_char.py {CPU} --n_layer=4 --n_head=4 --n_embd=128 --block_size=64 --batch_size=12 '
                '--dropout=0 --max_iters=1000 --lr_decay_iters=1000 --eval_iters=20',  # the ablation's baby GPT, 1/2
        'passkey': f'config/passkey.py {CPU}',  # 500 iterations of 64 episodes of 64 tokens
        'vit': f'config/softmax_vit.py {VIT_CPU}', 'vit100': f'config/softmax_vit100.py {VIT_CPU}',
        'pixels': 'config/arm_cifar10_cpu_softmax.py --max_iters=20 --lr_decay_iters=20 --warmup_iters=2 '
                  '--eval_interval=20 --eval_examples=100',  # bits/dim of the first 100 test images
        'shortcut': f'{LORA} --max_iters=300 --lr_decay_iters=300 --warmup_iters=20 --eval_interval=300',
        'long_base': f'config/passkey.py {CPU} --passkey_needles=1,2,4',  # 500 iterations of 64 episodes of 64
        'long': f'{EXTEND} --block_size=256 --batch_size=16 --max_iters=300 --lr_decay_iters=300 --warmup_iters=10 '
                '--eval_interval=100',  # RESULTS.md's "long context the TDA way": the same tokens a step
        'base': 'text', 'passkey_examples': 500, 'draw_batch': 8,
    },
    'paper': {  # the seed papers' configs (a GPU's job; not run here)
        'recall': '', 'text': 'config/softmax_fineweb.py', 'passkey': 'config/passkey.py',
        'vit': 'config/softmax_vit.py', 'vit100': 'config/softmax_vit100.py', 'pixels': 'config/arm_cifar10_softmax.py',
        'shortcut': 'config/finetune_shakespeare_lora.py', 'base': 'gpt2', 'passkey_examples': 500, 'draw_batch': 200,
        'long_base': 'text',  # the pre-trained language model, then 500 steps at 4,096 tokens (the TDA paper's)
        'long': f'{EXTEND} --block_size=4096 --batch_size=16 --max_iters=500 --lr_decay_iters=500 --warmup_iters=20',
    },
}
# The rows: each rule's train.py arguments per system; 'causal' serves every GPT system the row does not name.
# A value starting 'n/a' says why the row has no such run.
ROWS = {
    'softmax': {'causal': '--attention=softmax', 'vit': '--attention=softmax'},
    'krause': {'causal': '--attention=krause --krause_window=32 --krause_topk=16',  # the paper's LM
               'pixels': '--attention=krause --krause_window=256 --krause_topk=192',  # its pixel model
               'vit': '--attention=krause --krause_topk=2 --krause_radius=1 --krause_sigma=2.5'},  # config/krause_vit.py
    'attentionx': {'causal': '--attention=attentionx --attnx_gamma=3',
                   'vit': '--attention=attentionx --attnx_gamma=1 --attnx_mask_diagonal=True '
                          '--attnx_learned_temperature=True'},  # its paper's LSA base (--table=attentionx: beside it)
    'tda': {'causal': '--attention=tda --pos_emb=rope --tda_beta=0.5',  # β₀ = 0.5 fits small models (RESULTS.md)
            'shortcut': '--attention=tda --tda_beta=0.5', 'vit': '--attention=tda'},  # the base's positions
    'cluster': {'causal': '--attention=cluster --cluster_chunk=16', 'pixels': '--attention=cluster --cluster_chunk=64',
                'vit': '--attention=cluster --cluster_iters=1 --cluster_self=True'},
    'mix': {'causal': '--attention=krause --mix=True --krause_window=32 --krause_topk=16',
            'pixels': '--attention=krause --mix=True --krause_window=256 --krause_topk=192',
            'vit': 'n/a: the mix form adds a causal softmax branch (GPT systems)',
            'shortcut': 'n/a: every shortcut is a mix form beside the base softmax (the krause row is this one)'},
    # the baselines (every other one runs with its defaults, each the paper's setting where it has one)
    'longformer': {'causal': '--attention=longformer --longformer_window=32 --longformer_window_last=512',  # grows
                   'pixels': '--attention=longformer --longformer_window=256'},  # over depth (config/longformer_gpt.py)
    'window': {'causal': '--attention=softmax --window=32', 'pixels': '--attention=softmax --window=256',
               'vit': 'n/a: the sliding window is causal and 1-D (GPT systems)',
               'shortcut': "n/a: a window is the base softmax's own shape (window=0), which a fine-tune keeps"},
}


def rows():
    """{row: {system or 'causal': arguments}}: ROWS, then every other registered rule with its defaults."""
    every = dict(ROWS)
    for name, cls in ATTENTION.items():
        if name not in every:
            vit = (f'--attention={name}' if cls.has_bidirectional_form else
                   f'n/a: {cls.__name__} does not declare has_bidirectional_form')
            causal = (f'--attention={name}' if cls.has_causal_form else
                      f'n/a: {cls.__name__} does not declare has_causal_form')
            every[name] = {'causal': causal, 'vit': vit}
    return every


# The papers' tables: each seed paper's comparison, its systems, and per system: `shared`, the settings every row
# shares beyond the budget's (equal terms); `paper`, the system's train.py arguments at the paper budget (the paper's
# recipe, for every row); `rows`, each row's rule (its official settings); `paper_rows`, a row's at the paper budget
# where they differ; `tasks`, the paper's zero-shot tasks (studies/harness.py, at the paper budget: --tasks);
# `swapped_from`, a row not trained but swapped into another row's trained run (studies/cluster_swap.py), then scored
# as every row is. `analysis`: the systems given analyze.py's exact-zero sparsity and first-token sink ratio. A row
# ends with the settings the paper config of its rule sets; `--flex=False` where the rule has no flex path (the paper
# configs turn flex on) or its config runs SDPA.
ROPE = '--pos_emb=rope'  # one position encoding for every language-model row: RoPE (the TDA paper's)
TABLES = {
    'tda': {  # Threshold Differential Attention (arXiv 2601.12145), Table 1, and its long-context part
        'analysis': ['text'],
        'systems': {'text': {
            'shared': ROPE,
            'paper': 'config/tda_gpt.py',  # GPT-2-162M, untied head, FineWeb-Edu, lr 1e-3 to 1e-4
            'tasks': 'hellaswag,arc_easy,arc_challenge,openbookqa,piqa,winogrande',  # zero-shot, as the paper
            'rows': {
                'softmax': '--attention=softmax',
                'gated': '--attention=gated',  # elementwise gate (config/gated_gpt.py): +C² per layer
                'entmax': '--attention=entmax --flex=False',  # 1.5-entmax (config/entmax_gpt.py)
                'rela': '--attention=rela --flex=False',  # ReLA-g (config/rela_gpt.py)
                'diff': '--attention=diff --flex=False',  # λ_init over depth (config/diff_gpt.py: SDPA)
                'dex': '--attention=dex',  # the last half of the heads, f_D from 0 (config/dex_gpt.py)
                'tda': '--attention=tda --tda_beta=0.5',  # β₀ = 0.5 fits small models (RESULTS.md); paper: 1
                'tda_matched': '--attention=tda --tda_beta=0.5 --tda_matched=True',  # half-width views: softmax's size
                'tra': '--attention=tda --tda_differential=False --tda_beta=0.5',  # the paper's single-view ablation
            },
            'paper_rows': {'tda': '--attention=tda', 'tda_matched': '--attention=tda --tda_matched=True',  # β₀ = 1
                           'tra': '--attention=tda --tda_differential=False'},
        }, 'long': {  # passkeys after the NTK extension; at paper, the text rows extended, in words, and SCROLLS
            'shared': ROPE,
            'tasks': 'qmsum_scrolls,summscreenfd_scrolls,govreport_scrolls,qasper_scrolls',  # ROUGE, F1 (SCROLLS')
            'rows': {'softmax': '--attention=softmax', 'tda': '--attention=tda --tda_beta=0.5'},
            'paper_rows': {'tda': '--attention=tda'},
        }},
    },
    'krause_lm': {  # Krause Synchronization Transformers (arXiv 2602.11534), the language-model table
        'systems': {'text': {
            'shared': ROPE,  # config/krause_gpt.py has learned positions; RoPE for every row here
            # 8 x 768, FineWeb-Edu, biases as the official code; the baselines alone (mix=False, as
            # config/{topk,longformer,routing}_gpt.py)
            'paper': 'config/krause_gpt.py --mix=False',
            'tasks': 'lambada_openai,hellaswag,arc_easy,piqa,blimp',  # zero-shot (CBT is not in the harness)
            'rows': {
                'softmax': '--attention=softmax',  # "standard"
                'window': '--attention=softmax --window=32',  # Krause's W
                'topk': '--attention=topk --topk_k=32',  # config/topk_gpt.py (the paper does not say its k)
                'longformer': '--attention=longformer --longformer_window=32 --longformer_window_last=512',  # grows
                'routing': '--attention=routing --routing_clusters=32 --routing_window=32 --flex=False',  # half local
                'krause': '--attention=krause --mix=True --krause_window=32 --krause_topk=16 --krause_sigma=2.5',
                'krause_matched': '--attention=krause --mix=True --mix_matched=True --krause_window=32 --krause_topk=16 '
                                  '--krause_sigma=2.5',  # each branch half the heads: softmax's parameters
            },
        }},
    },
    'krause_vision': {  # Krause Synchronization Transformers, the CIFAR table: top-1, parameters, FLOPs
        'systems': {system: {
            'shared': '',
            'paper': f'config/{config}.py',  # the official KViT-S recipe, both datasets
            'rows': {
                'softmax': '--attention=softmax',
                'krause': '--attention=krause --krause_topk=2 --krause_radius=1 --krause_metric=manhattan '
                          '--krause_sigma=2.5 --flex=False',  # config/krause_vit.py
            },
        } for system, config in (('vit', 'softmax_vit'), ('vit100', 'softmax_vit100'))},
    },
    'krause_images': {  # Krause Synchronization Transformers, the pixel-model table: bits/dim and images/s
        'systems': {'pixels': {
            'shared': '',
            'paper': 'config/arm_cifar10_softmax.py',  # 16 x 512; 64 images a step is ours (no batch in the paper)
            'rows': {
                'softmax': '--attention=softmax',
                'linear': '--attention=linear',  # "LARM" at the Krause ARM's 16 x 512 (its own: 16 x 256)
                'krause': '--attention=krause --krause_window=256 --krause_topk=192 --krause_sigma=2.5',
            },
        }},
    },
    'krause_llm': {  # Krause Synchronization Transformers, the fine-tune: a base with LoRA, with LoRA and the shortcut
        'systems': {'shortcut': {
            'shared': '',  # the base's shape and positions (a fine-tune keeps them)
            'paper': 'config/finetune_shakespeare_lora.py',  # GPT-2 124M on Tiny Shakespeare (ours: 20 steps, lr 1e-3)
            'rows': {
                'lora': '--attention=softmax --mix=False',  # LoRA alone: no shortcut
                'krause': '--attention=krause --mix=True --krause_window=32 --krause_topk=16 --krause_sigma=5.5',
            },
        }},
    },
    'attentionx': {  # AttentionX (arXiv 2409.04275): its ViT on an LSA ViT, and its nanoGPT
        'systems': {
            'text': {
                'shared': ROPE,  # the paper's nanoGPT: learned positions; RoPE for every row here
                'paper': 'config/softmax_gpt.py',  # nanoGPT's GPT-2 124M on OpenWebText (config/attentionx_gpt.py)
                'rows': {'softmax': '--attention=softmax', 'attentionx': '--attention=attentionx --attnx_gamma=3'},
            },
            **{system: {
                'shared': '',
                # the KViT-S recipe, as config/lsa_vit.py and config/attentionx_vit.py (the paper's: vit_small, 6 x
                # 8 heads of 64, Adam 1e-4, batch 512, 200 epochs)
                'paper': f'config/{config}.py',
                'rows': {
                    'lsa': '--attention=lsa',  # the base: diagonal masked, a learned temperature per layer
                    'attentionx': '--attention=attentionx --attnx_gamma=1 --attnx_mask_diagonal=True '
                                  '--attnx_learned_temperature=True',  # on the LSA ViT: its mask and temperature
                },
            } for system, config in (('vit', 'softmax_vit'), ('vit100', 'softmax_vit100'))},
        },
    },
    'cluster': {  # this project's cluster attention against softmax, trained and swapped into a trained softmax
        'systems': {
            'text': {
                'shared': ROPE,
                'paper': 'config/softmax_gpt.py',  # nanoGPT's GPT-2 124M on OpenWebText (config/cluster_gpt.py)
                'rows': {'softmax': '--attention=softmax', 'cluster': '--attention=cluster --cluster_chunk=16',
                         'swap': '--attention=cluster --cluster_chunk=16 --cluster_m=16 --cluster_sharpness=20'},
                'paper_rows': {'cluster': '--attention=cluster --cluster_m=64 --cluster_chunk=64',  # at 1,024 tokens
                               'swap': '--attention=cluster --cluster_m=64 --cluster_chunk=64 --cluster_sharpness=20'},
                'swapped_from': {'swap': 'softmax'},  # not trained: studies/cluster_swap.py on softmax's run
            },
            'vit': {
                'shared': '',
                'paper': 'config/softmax_vit.py',
                'rows': {'softmax': '--attention=softmax',
                         'cluster': '--attention=cluster --cluster_iters=1 --cluster_self=True'},  # cluster_vit.py
            },
        },
    },
}
ANALYSIS = [('sparsity', 'exact zeros', 3), ('sink_ratio', 'sink ratio', 2)]  # analyze.py's, mean over layers, heads


def row_arguments(row, system):
    """A row of rows()'s arguments for a system: its own, else its kin's (vit100: vit's), else the GPT systems'."""
    return next(row[name] for name in (system, KIN.get(system), 'causal') if name in row)


def own_rows(name, system):
    """{row: its own train.py arguments} of table `name`'s system at this budget, in the table's order (a row's
    paper_rows entry at the paper budget)."""
    spec = TABLES[name]['systems'][system]
    return {**spec['rows'], **(spec.get('paper_rows', {}) if budget == 'paper' else {})}


def table_rows(name, system):
    """{row: train.py arguments} of table `name`'s system at this budget: the settings every row shares, then the
    row's own."""
    shared = TABLES[name]['systems'][system]['shared']
    return {row: f"{shared} {arguments}".strip() for row, arguments in own_rows(name, system).items()}


def picked(key, text, valid, where=''):
    """The comma-separated names in `text` (setting `key`), each in `valid`; ValueError naming the key where one is
    unknown or none is picked."""
    names = [n for n in text.split(',') if n]
    unknown = [n for n in names if n not in valid]
    if not names or unknown:
        raise ValueError(f"{key}: {'unknown name(s) ' + ', '.join(unknown) + where if unknown else 'none picked'}; "
                         f"pass e.g. --{key}={','.join(valid[:2])} (valid: {', '.join(valid)})")
    return names


def check_lab_settings(c, given=()):
    """(rows, systems, seeds); ValueError naming the first bad setting, before any run starts. given: the keys the
    command line set (a table's systems and seeds are its own unless given)."""
    if c['budget'] not in BUDGETS:
        raise ValueError(f"budget={c['budget']!r} is not a budget; pass --budget=tiny, cpu or paper")
    name = c['table']
    if name and name not in TABLES:
        raise ValueError(f"table={name!r} is not a table; pass --table=NAME, one of {', '.join(TABLES)}, or leave it "
                         f"out for every rule on every system")
    if name:  # the table's own systems and rows, in its order; --systems and --rules pick among them
        spec, where = TABLES[name]['systems'], f" (not in table {name})"
        system_names = picked('systems', c['systems'] if 'systems' in given else ','.join(spec), list(spec), where)
        own = list(dict.fromkeys(row for s in system_names for row in spec[s]['rows']))
        rule_names = picked('rules', c['rules'] or ','.join(own), own, where)
        row_names = [row for row in own if row in rule_names]
        system_names = [s for s in system_names if set(spec[s]['rows']) & set(row_names)]  # with a row picked
        seed_text = c['seeds'] if 'seeds' in given else '1337,1338,1339' if c['budget'] == 'cpu' else '1337'
    else:
        system_names = picked('systems', c['systems'], list(SYSTEMS))
        row_names = picked('rules', c['rules'] or ','.join(rows()), list(rows()))
        seed_text = c['seeds']
    seed_list = check_int_list({'seeds': seed_text}, 'seeds', '1337,1338', at_least=0)
    for key in ('recipe', 'harness_args'):
        try:
            shlex.split(c[key])
        except ValueError as e:
            raise ValueError(f"{key} does not parse as command-line arguments ({e}); pass --{key}=\"...\" with "
                             f"balanced quotes") from None
    if c['tasks'] not in ('', 'none') and not (name and any('tasks' in spec[s] for s in system_names)):
        raise ValueError(f"tasks={c['tasks']} scores a table's language models, and "
                         f"{'table ' + name + ' has none picked' if name else 'no table is picked'}; pass "
                         f"--table=tda or krause_lm (with --systems=text), or leave --tasks out")
    for key in ('text_source', 'cifar_source', 'cifar100_source'):
        if c[key] and not os.path.exists(c[key]):
            raise ValueError(f"{key}={c[key]} does not exist; pass a local copy of the data, or nothing to download it")
    if not c['out_root']:
        raise ValueError("out_root is empty; pass --out_root=DIR (the runs and the table go there)")
    if os.path.exists(c['out_root']) and not os.path.isdir(c['out_root']):
        raise ValueError(f"out_root={c['out_root']} is a file, not a folder; pass --out_root=DIR")
    return row_names, system_names, seed_list


# -----------------------------------------------------------------------------
# one run: train.py, then its scoring, each a process with its log in the run's folder


def system_args(system):
    """The budget's train.py arguments of a system; at the paper budget a table's own recipe for it."""
    spec = TABLES[table]['systems'].get(system) if table else None
    return spec['paper'] if spec and 'paper' in spec and budget == 'paper' else BUDGETS[budget][system]


def run_args(row, system, seed, arguments):
    """train.py arguments of one run: the budget's system, the row's rule, the recipe, the run's seed and folder."""
    plan, base_args, data = BUDGETS[budget], system_args(system), []
    if system == 'shortcut':  # the rule beside the base's own softmax, LoRA on both (a table's rows say their mix)
        arguments += '' if table else ' --mix=True'
        if plan['base'] == 'text':
            base_args = f"{plan['text']} {base_args} --init_from={run_dir('softmax', 'text', seed)}/ckpt.pt"
    if system == 'long':  # the extension: the base's arguments, then the budget's, from the base's checkpoint
        base = long_base()
        base_args = f"{system_args(base)} {base_args} --init_from={run_dir(row, base, seed)}/ckpt.pt"
    if system in ('long', 'long_base') and long_base() == 'long_base':  # passkeys of 1, 2, 4 needles at each length
        data = [f"--data_dir={os.path.join(os.path.abspath(out_root), table, 'data', system)}"]
    source = globals()[SOURCES[system]] if system in SOURCES else text_source if system == 'long' else ''
    source = [f'--data_source={os.path.abspath(source)}'] if source and (
        system not in ('shortcut', 'long') or plan['base' if system == 'shortcut' else 'long_base'] == 'text') else []
    return [*shlex.split(base_args), *shlex.split(arguments), *shlex.split(recipe), *source, *data, f'--seed={seed}',
            f'--out_dir={run_dir(row, system, seed)}']


def long_base():
    """The system whose run the long system extends: 'text' (the budget's long_base says so), else 'long_base'."""
    return 'text' if BUDGETS[budget]['long_base'] == 'text' else 'long_base'


def swapped_from(row, system):
    """The row of a table whose trained run `row` is swapped into (its `swapped_from`), or None: a row trained."""
    return TABLES[table]['systems'].get(system, {}).get('swapped_from', {}).get(row) if table else None


def swap_args(row, system, seed, arguments):
    """studies/cluster_swap.py's arguments for a swapped row: the trained run it starts from, the row's cluster
    settings (its cluster_m the one m), and the row's folder, where the swapped model is written as ckpt.pt."""
    cluster = [a.replace('--cluster_m=', '--cluster_ms=') for a in shlex.split(arguments) if a.startswith('--cluster_')]
    return [f'--out_dir={run_dir(swapped_from(row, system), system, seed)}', *cluster, f'--seed={seed}',
            f'--swap_out_dir={run_dir(row, system, seed)}']


def run_dir(row, system, seed):
    return os.path.abspath(os.path.join(out_root, table, system, f'{row}-s{seed}'))


def launch(script, args, log_path):
    """A script of the repo in a process of its own, its output added to log_path: (exit code, its error: line)."""
    with open(log_path, 'a') as f:  # a run stopped and started again keeps both attempts' output
        start = f.tell()
        code = subprocess.run([sys.executable, script, *args], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode
    with open(log_path) as f:
        f.seek(start)
        errors = [line.strip() for line in f if line.startswith('error:')]
    return code, (errors[-1] if errors else f"error: {script} exited with code {code}")


def train_run(row, system, seed, arguments):
    """Train one run unless it is trained (its trained.json); go on from its checkpoint where a stop left one.
    Returns None, or the failure {'error', 'log'}."""
    folder = run_dir(row, system, seed)
    if os.path.exists(os.path.join(folder, 'trained.json')):
        return None
    first = (('softmax', 'text', ROWS['softmax']['causal']) if system == 'shortcut' and BUDGETS[budget]['base'] ==
             'text' else (row, long_base(), arguments) if system == 'long' else  # the same rule, at T
             (swapped_from(row, system), system, table_rows(table, system)[swapped_from(row, system)])
             if swapped_from(row, system) else None)
    if first:  # the run this one starts from, trained first: the text softmax base, the long base, the swapped row
        failed = train_run(first[0], first[1], seed, first[2])
        if failed:
            return {'error': f"its base ({first[1]} {first[0]} seed {seed}) failed: {failed['error']}",
                    'log': failed['log']}
    os.makedirs(folder, exist_ok=True)
    script, args = (('studies/cluster_swap.py', swap_args(row, system, seed, arguments)) if swapped_from(row, system)
                    else ('train.py', run_args(row, system, seed, arguments)))
    if os.path.exists(os.path.join(folder, 'ckpt.pt')) and script == 'train.py':
        args.append('--init_from=resume')
    log = os.path.join(folder, 'train.log')
    t0 = time.time()
    code, error = launch(script, args, log)
    if code:
        return {'error': error, 'log': log}
    write_atomically(os.path.join(folder, 'trained.json'), lambda tmp: write_text(tmp, json.dumps(
        {'wall_s': time.time() - t0, 'args': args})))
    return None


def score_run(row, system, seed, arguments):
    """Score a trained run with its system's metric (a table's cell: and measure it, measure_run): {'metrics', 'log'}
    or the failure {'error', 'log'}."""
    folder, plan = run_dir(row, system, seed), BUDGETS[budget]
    log = os.path.join(folder, 'eval.log')
    if system in ('passkey', 'long'):  # fresh episodes: at 1x, 2x and 4x the trained length; long: at its own (4x
        # the base's) with 1, 2 and 4 needles, in words where it extends the language model
        asked = (['--multiples=1,2,4'] if system == 'passkey' else
                 ['--multiples=1', '--needles=1,2,4', *(['--passkey=True'] if long_base() == 'text' else [])])
        code, error = launch('studies/extrapolate.py', [f'--out_dir={folder}', *asked, '--json_out=True',
                                                       f"--num_examples={plan['passkey_examples']}",
                                                       f'--device={score_device()}'], log)
        if code:
            return {'error': error, 'log': log}
        with open(log) as f:
            lines = [json.loads(line) for line in f if line.startswith('{')]
        metrics = {(f"acc_{r['multiple']}x" if system == 'passkey' else f"needles_{r['needles']}"): r['passkey_acc']
                   for r in lines}
    else:
        args = [*run_args(row, system, seed, arguments), '--init_from=resume', '--eval_only=True', '--eval_full=True']
        code, error = launch('train.py', args, log)
        if code:
            return {'error': error, 'log': log}
        with open(os.path.join(folder, 'eval_full.json')) as f:
            full = json.load(f)
        metrics = {'val_loss': full['val_loss'], 'examples': full['examples']}
        if system in ('recall', 'vit', 'vit100'):
            metrics['val_acc'] = full['val_acc']
    # measured in this process: whatever goes wrong is this cell's, not the table's
    if system == 'pixels':
        metrics['bits_per_dim'] = full['bits_per_dim']
        try:
            metrics['draw_images_per_s'] = draw_speed(folder, plan['draw_batch'])
        except Exception as e:
            return {'error': f"error: drawing {plan['draw_batch']} images failed ({type(e).__name__}: {e})",
                    'log': log}
    if table:
        try:
            metrics.update(measure_run(folder, system))
        except (Exception, SystemExit) as e:  # load_run's SystemExit: a checkpoint it cannot read
            return {'error': f"error: measuring {folder} failed ({type(e).__name__}: {e})", 'log': log}
    if tasks_of(system):  # the zero-shot tasks, studies/harness.py on the run's checkpoint
        code, error = launch('studies/harness.py', [f'--out_dir={folder}', f"--tasks={','.join(tasks_of(system))}",
                                                   f'--device={score_device()}', *shlex.split(harness_args)], log)
        if code:
            return {'error': error, 'log': log}
        with open(os.path.join(folder, 'harness.json')) as f:
            results = json.load(f)['results']
        metrics.update({f'task_{name}': task_score(results[name]) for name in tasks_of(system)})
    return {'metrics': metrics, 'log': log}


def score_device():
    """Where the scoring scripts run: the GPU at the paper budget where there is one, else the CPU."""
    import torch
    return 'cuda' if budget == 'paper' and torch.cuda.is_available() else 'cpu'


def tasks_of(system):
    """The harness tasks a table's system is scored on at this budget: --tasks where given (on the systems whose
    spec has tasks), else the spec's own at the paper budget; none outside a table, or with --tasks=none."""
    spec = TABLES[table]['systems'][system] if table else {}
    if 'tasks' not in spec or tasks == 'none':
        return []
    return [name for name in (tasks or (spec['tasks'] if budget == 'paper' else '')).split(',') if name]


TASK_METRICS = ('rouge_geometric_mean', 'f1', 'acc_norm', 'acc', 'bits_per_byte')  # the first a task reports


def task_score(result):
    """A task's number in a table: the first of TASK_METRICS its harness result has (SCROLLS' ROUGE geometric mean
    or F1; acc_norm where the harness normalises by length, as the papers report HellaSwag, ARC, PIQA; else acc)."""
    return next(result[f'{name},none'] for name in TASK_METRICS if f'{name},none' in result)


def measure_run(folder, system):
    """A table's measurements of a trained run, in this process: `params`, every parameter of the model (its own
    count, get_num_params(non_embedding=False)); `flops_counted` and `flops_ideal`, attention FLOPs per token and
    layer on the path that ran and the rule's ideal (support/flops.py); and where the table asks for analysis,
    analyze.py's exact-zero `sparsity` and first-token `sink_ratio` of its validation batch, the mean over layers
    and heads (None where analyze.py says n/a)."""
    from support.flops import attention_flops
    from support.loading import load_run
    run = load_run(folder, 'cpu')
    flops = attention_flops(run.model)
    measured = {'params': run.model.get_num_params(non_embedding=False), 'flops_counted': flops['counted'],
                'flops_ideal': flops['ideal']}
    if system in TABLES[table].get('analysis', ()):
        from studies.analyze import analyse, val_batch
        layers, _ = analyse(run.model, val_batch(run.config, run.data_dir, run.model.config.block_size))
        for key, _, _ in ANALYSIS:
            values = [layer.get('heads', {}).get(key) for layer in layers]
            measured[key] = float(np.mean(values)) if all(isinstance(v, list) for v in values) else None
    return measured


def draw_speed(folder, batch_size):
    """Images per second drawn from a pixel model with its cache, `batch_size` images at once, on the device it
    trained on (support/pixels.py; here in the lab's process)."""
    from support.loading import load_run
    from support.pixels import timed_draw
    run = load_run(folder, 'cpu')
    model = run.model.to(run.config.get('device', 'cpu')).eval()
    return timed_draw(model, batch_size, batch_size, model.config.block_size + 1)[1]


def training_rate(folder):
    """(median tokens/s or images/s of the run's logged iterations, its unit) from log.jsonl; (None, None) for a run
    that trained nothing (a swapped row)."""
    if not os.path.exists(os.path.join(folder, 'log.jsonl')):
        return None, None
    with open(os.path.join(folder, 'log.jsonl')) as f:
        records = [json.loads(line) for line in f if line.strip()]
    for key, unit in (('tokens_per_s', 'tok/s'), ('images_per_s', 'images/s')):
        values = [r[key] for r in records if key in r]
        if values:
            return float(np.median(values)), unit
    return None, None


def cell_run(row, system, seed, arguments):
    """One run's result, from its cell.json when it has one (never trained again), else trained and scored now."""
    path = os.path.join(run_dir(row, system, seed), 'cell.json')
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    if not train:
        return {'not_run': 'not run yet: pass --train=True'}
    failed = train_run(row, system, seed, arguments)
    if failed:
        return failed
    t0 = time.time()
    scored = score_run(row, system, seed, arguments)
    if 'error' in scored:
        return scored
    with open(os.path.join(run_dir(row, system, seed), 'trained.json')) as f:
        trained = json.load(f)
    rate, unit = training_rate(run_dir(row, system, seed))
    result = {**scored, 'train_wall_s': trained['wall_s'], 'score_wall_s': time.time() - t0, 'rate': rate,
              'rate_unit': unit, 'args': shlex.join(trained['args'])}
    write_atomically(path, lambda tmp: write_text(tmp, json.dumps(result)))
    return result


# -----------------------------------------------------------------------------
# the table: a cell per row and system, the mean ± half the range over seeds (a paper's table: ± the standard deviation)
METRICS = {  # system: [(result key, label, digits)]; the first is the one its paper reports
    'recall': [('val_acc', 'answer acc', 4)], 'text': [('val_loss', 'val loss', 4)],
    'passkey': [('acc_1x', '1x', 3), ('acc_2x', '2x', 3), ('acc_4x', '4x', 3)], 'vit': [('val_acc', 'top-1', 4)],
    'vit100': [('val_acc', 'top-1', 4)],
    'pixels': [('bits_per_dim', 'bits/dim', 4), ('draw_images_per_s', 'images/s drawn', 3)],
    'shortcut': [('val_loss', 'val loss', 4)],
    'long': [('needles_1', '1 needle', 3), ('needles_2', '2 needles', 3), ('needles_4', '4 needles', 3)],
}
LOWER_IS_BETTER = ('val_loss', 'bits_per_dim')  # the other metrics: higher is better


def spread(values, digits):
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{np.mean(values):.{digits}f} ± {(max(values) - min(values)) / 2:.{digits}f}"


def wall_text(runs):
    """The runs' mean wall time (training and scoring), and their median training speed."""
    wall = np.mean([r['train_wall_s'] + r['score_wall_s'] for r in runs])
    rate = f", {np.median([r['rate'] for r in runs]):,.0f} {runs[0]['rate_unit']}" if runs[0]['rate'] else ''
    return f"{wall:,.0f} s{rate}"


def cell_text(cell, system):
    """A cell of table.md: its metrics (passkey's three lengths joined by /), then wall time and training speed."""
    if cell['status'] != 'ok':
        return cell['why'].replace('|', '/')
    runs = list(cell['seeds'].values())
    numbers = [spread([r['metrics'][key] for r in runs], digits) for key, _, digits in METRICS[system]]
    text = ' / '.join(numbers) if system == 'passkey' else ' · '.join(numbers)
    return f"{text}<br>{wall_text(runs)}"


# a paper's table: each system's rows against its first, mean ± sample standard deviation

def table_metrics(system):
    """[(result key, label, digits)] a table shows for a system: the system's, analyze.py's where it asks, and its
    zero-shot tasks at this budget."""
    analysed = system in TABLES[table].get('analysis', ())
    return METRICS[system] + (ANALYSIS if analysed else []) + [(f'task_{n}', n, 4) for n in tasks_of(system)]


def mean_sd(values):
    """(mean, sample standard deviation (ddof=1); None for a single value)."""
    return float(np.mean(values)), (float(np.std(values, ddof=1)) if len(values) > 1 else None)


def difference(values, first):
    """How a row's values (one per seed) compare with the first row's: +1 or -1 where the means differ by more than
    twice the combined spread, |m - m₀| > 2·sqrt(s² + s₀²) with s, s₀ the sample standard deviations (ddof=1), 0
    within it; None where either has a single value (no spread to compare with)."""
    (m, s), (m0, s0) = mean_sd(values), mean_sd(first)
    if s is None or s0 is None:
        return None
    return int(np.sign(m - m0)) if abs(m - m0) > 2 * math.sqrt(s * s + s0 * s0) else 0


def values_of(cell, key):
    """A cell's values of metric `key`, one per seed; None where it has none (not run, failed, n/a)."""
    if cell['status'] != 'ok':
        return None
    values = [run['metrics'].get(key) for run in cell['seeds'].values()]
    return None if not values or None in values else values


def measured_text(values, digits, mark=''):
    if values is None:
        return 'n/a'
    m, s = mean_sd(values)
    return f"{m:.{digits}f}" + ('' if s is None else f" ± {s:.{digits}f}") + mark


def count_text(x):
    """A count in three significant digits with k, M or G; n/a for None."""
    if x is None:
        return 'n/a'
    scale, unit = next(((s, u) for s, u in ((1e9, 'G'), (1e6, 'M'), (1e3, 'k')) if x >= s), (1, ''))
    return f"{x / scale:.3g}{unit}"


def table_line(row, cell, first, metrics):
    """A row of a system's table: the row's own arguments, its metrics against the first row's cell (`*`: beyond
    noise), parameters, attention FLOPs counted · ideal, wall time and speed."""
    own = f"| {row} | `{cell['own']}` | "
    if cell['status'] != 'ok':
        return own + cell['why'].replace('|', '/') + ' |' * (len(metrics) + 3)
    numbers = []
    for key, _, digits in metrics:
        values, base = values_of(cell, key), values_of(first, key)
        beyond = cell is not first and values is not None and base is not None and difference(values, base)
        numbers.append(measured_text(values, digits, '*' if beyond else ''))
    params = values_of(cell, 'params')
    flops = [values_of(cell, key) for key in ('flops_counted', 'flops_ideal')]
    return own + ' | '.join([*numbers, 'n/a' if params is None else f"{round(np.mean(params)):,}",
                             ' · '.join(count_text(None if v is None else np.mean(v)) for v in flops),
                             wall_text(list(cell['seeds'].values()))]) + ' |'


WAYS = {-1: 'lower beyond noise', 1: 'higher beyond noise', 0: 'within noise', None: 'one seed, not told from noise',
        'none': 'no number'}


def holds(system, row_names, cells, key, label):
    """The line under a system's table: on its first metric, which rows differ from the first row beyond noise
    (difference), and which way."""
    first, better = row_names[0], 'lower' if key in LOWER_IS_BETTER else 'higher'
    if len(row_names) == 1:
        return f"**{system}**, {label}: {first} alone, nothing to compare."
    base, ways = values_of(cells[first][system], key), {}
    for row in row_names[1:]:
        values = values_of(cells[row][system], key)
        ways.setdefault('none' if base is None or values is None else difference(values, base), []).append(row)
    said = '; '.join(f"{WAYS[way]}: {', '.join(ways[way])}" for way in WAYS if way in ways)
    return f"**{system}**, {label} ({better} is better), against {first}: {said}."


def table_markdown(head, cells, rows_of, system_names):
    """table.md of a paper's table: per system, its rows against the first, and the line of what holds."""
    lines = [f"Table `{table}`; budget `{head['budget']}`; machine {head['machine']}; torch {head['torch']}; date "
             f"{head['date']}; commit {head['commit']}; seeds {head['seeds']}" +
             (f"; recipe `{head['recipe']}`" if head['recipe'] else '') + '.', '',
             "Each cell: mean ± sample standard deviation (ddof=1) over the seeds; `*`: the mean differs from the "
             "first row's by more than twice the combined spread, |m - m₀| > 2·sqrt(s² + s₀²). Parameters: every "
             "parameter of the model. Attention FLOPs per token and layer (mean over layers): counted on the path "
             "that ran (FlopCounterMode) · the rule's ideal (support/flops.py)."]
    for system in system_names:
        metrics, shared = table_metrics(system), TABLES[table]['systems'][system]['shared']
        lines += ['', f"### {system}: {SYSTEMS[system]}", '',
                  f"Every row: {every_row(system, shared)}, then its own arguments.", '',
                  '| rule | arguments | ' + ' | '.join(label for _, label, _ in metrics) +
                  ' | parameters | attention FLOPs: counted · ideal | time, speed |',
                  '| --- | --- |' + ' --- |' * (len(metrics) + 3)]
        first = cells[rows_of[system][0]][system]
        lines += [table_line(row, cells[row][system], first, metrics) for row in rows_of[system]]
        lines += ['', holds(system, rows_of[system], cells, *metrics[0][:2])]
    return '\n'.join(lines) + '\n'


def every_row(system, shared):
    """What every row of a system runs before its own arguments, as table.md says it: the long system's base, then
    its extension from the base's checkpoint."""
    text = f"`{' '.join(a for a in (system_args(system), shared) if a) or '(train.py defaults)'}`"
    if system != 'long':
        return text
    base = f"`{' '.join(a for a in (system_args(long_base()), shared) if a)}`"
    return (f"the base {base} ({'the text system' if long_base() == 'text' else 'passkeys of 1, 2 and 4 needles'}), "
            f"then from its checkpoint {text}")


def header(seed_list):
    """What table.md and table.json say above the table: the budget, machine, torch, date and commit."""
    import torch
    git = lambda *a: subprocess.run(['git', *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    commit = git('rev-parse', '--short', 'HEAD') or 'unknown (not a git checkout)'
    if git('status', '--porcelain', '--untracked-files=no'):
        commit += ' with uncommitted changes'
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU'
    return {'budget': budget, 'machine': f"{platform.machine()}, {os.cpu_count()} cores, {device}",
            'torch': torch.__version__, 'date': datetime.date.today().isoformat(), 'commit': commit,
            'seeds': ','.join(map(str, seed_list)), 'recipe': recipe, **({'table': table} if table else {})}


def markdown(head, cells, row_names, system_names):
    lines = [f"Budget `{head['budget']}`; machine {head['machine']}; torch {head['torch']}; date {head['date']}; "
             f"commit {head['commit']}; seeds {head['seeds']}" + (f"; recipe `{head['recipe']}`" if head['recipe']
                                                                   else '') + '.', '']
    lines += [f"- **{s}**: {SYSTEMS[s]}. `{BUDGETS[budget][s] or '(train.py defaults)'}`" for s in system_names]
    lines += ['', '| rule | ' + ' | '.join(f"{s}: {', '.join(label for _, label, _ in METRICS[s])}"
                                           for s in system_names) + ' |',
              '| --- |' + ' --- |' * len(system_names)]
    for row in row_names:
        lines.append(f"| {row} | " + ' | '.join(cell_text(cells[row][s], s) for s in system_names) + ' |')
    return '\n'.join(lines) + '\n'


def plots(cells, rows_of, system_names, metrics_of, folder):
    """A PNG per system and metric in `folder`, the rows side by side (mean over seeds); None where matplotlib is
    missing."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    written = []
    for system in system_names:
        for key, label, digits in metrics_of(system):
            names = [r for r in rows_of[system] if values_of(cells[r][system], key) is not None]
            if not names:
                continue
            values = [np.mean(values_of(cells[r][system], key)) for r in names]
            fig, ax = plt.subplots(figsize=(1.0 + 0.7 * len(names), 3.2))
            bars = ax.bar(names, values, color=[f'C{rows_of[system].index(r)}' for r in names])
            ax.bar_label(bars, fmt=f'%.{digits}f', fontsize=7)
            if key in LOWER_IS_BETTER:  # a loss: the differences, not the distance from zero
                ax.set_ylim(0.98 * min(values), 1.01 * max(values))
            ax.set_title(f"{system}: {label} (budget {budget})", fontsize=9)
            ax.tick_params(axis='x', labelrotation=45, labelsize=8)
            fig.tight_layout()
            path = os.path.join(folder, f"{system}_{key}.png")
            write_or_exit(path, lambda tmp: fig.savefig(tmp, dpi=80, format='png'), f"the runs, table.md and "
                          f"table.json are kept in {folder}", "free space, then run again with --train=False")
            plt.close(fig)
            written.append(path)
    return written


def main():
    row_names, system_names, seed_list = check_or_exit(check_lab_settings, script_settings(globals()),
                                                       overridden)  # before any work
    folder = os.path.join(out_root, table) if table else out_root  # the runs, the table and its figures
    if table:  # each system's rows in the table's order, and their arguments at this budget
        rows_of = {s: [r for r in TABLES[table]['systems'][s]['rows'] if r in row_names] for s in system_names}
        arguments_of = {s: table_rows(table, s) for s in system_names}
    else:
        every = rows()
        rows_of = {s: row_names for s in system_names}
        arguments_of = {s: {r: row_arguments(every[r], s) for r in row_names} for s in system_names}
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise SystemExit(f"error: cannot make out_root={out_root} ({e.strerror}); nothing was trained yet; pass "
                         f"--out_root=DIR you can write to") from None
    lab = RunDir(folder, master=False)  # one table at a time in its folder; Ctrl-C ends in one line
    try:
        lab.take_lock()
    except SystemExit as e:
        raise SystemExit(str(e.code).replace('out_dir', 'out_root')) from None
    cells, todo = {}, []
    for system in system_names:
        for row in rows_of[system]:
            arguments = arguments_of[system][row]
            cells.setdefault(row, {})[system] = {'args': arguments, 'seeds': {}, 'status': 'ok'}
            if table:  # the row's own, beside the settings every row of the system shares
                cells[row][system]['own'] = own_rows(table, system)[row]
            if arguments.startswith('n/a'):
                cells[row][system].update(status='n/a', why=arguments)
            else:
                todo += [(row, system, seed) for seed in seed_list]
    finished = {run for run in todo if os.path.exists(os.path.join(run_dir(*run), 'cell.json'))}
    progress = tqdm(total=len(todo), initial=len(finished), unit='run', dynamic_ncols=True)  # its ETA: runs to go
    try:
        for row, system, seed in todo:
            cell, result = cells[row][system], cell_run(row, system, seed, cells[row][system]['args'])
            if 'not_run' in result:
                cell.update(status='not run', why=result['not_run'])
            elif 'error' in result:
                cell.update(status='failed', why=f"{result['error']} (log: {result['log']})")
                progress.write(f"{system} {row} seed {seed}: {result['error']}; see {result['log']}")
            else:
                cell['seeds'][str(seed)] = result
            progress.update(0 if (row, system, seed) in finished else 1)
    except SystemExit as e:
        if e.code != 130:
            raise
        raise SystemExit(f"error: interrupted (Ctrl-C); the finished runs are kept in {folder} (a cell.json "
                         f"each) and a run stopped in training goes on from its checkpoint; run the same command "
                         f"again to go on") from None
    progress.close()
    head = header(seed_list)
    text = (table_markdown(head, cells, rows_of, system_names) if table else
            markdown(head, cells, row_names, system_names))
    print('\n' + text)
    kept = f"the runs are kept in {folder} and the table is printed above"
    todo_line = "free space (or fix the folder's permissions), then run again with --train=False to write them"
    write_or_exit(os.path.join(folder, 'table.md'), lambda tmp: write_text(tmp, text), kept, todo_line)
    record = {**head, 'systems': {s: {'metric': SYSTEMS[s], 'budget_args': system_args(s),
                                      **({'shared': TABLES[table]['systems'][s]['shared']} if table else {})}
                                  for s in system_names}, 'rows': cells}
    write_or_exit(os.path.join(folder, 'table.json'), lambda tmp: write_text(tmp, json.dumps(record, indent=1)),
                  f"{kept}, table.md is written", todo_line)
    figures = plots(cells, rows_of, system_names, table_metrics if table else METRICS.get, folder)
    print(f"wrote {folder}/table.md, table.json" + (f" and {len(figures)} figures" if figures else
                                                    " (no figures: pip install matplotlib for them)"))
    failed = [f"{s} {r}" for r in row_names for s in system_names if r in rows_of[s] and
              cells[r][s]['status'] == 'failed']
    if failed:
        raise SystemExit(f"error: {len(failed)} cell(s) failed ({', '.join(failed)}); each says why in the table; "
                         f"the other runs are kept in {folder}; fix the cause, then run the same command again")


if __name__ == '__main__':
    main()
