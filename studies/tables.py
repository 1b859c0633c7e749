"""
The lab's rows (studies/ablate.py): ROWS, each rule's official settings per system for the every-rule table, and
TABLES, each seed paper's comparison (--table=NAME), its systems and rows as the paper has them, on equal terms. A
new table is one Table in TABLES; a new row of one, one line in its `rows`.

A row ends with the settings the paper config of its rule sets; `--flex=False` where the rule has no flex path (the
paper configs turn flex on) or its config runs SDPA.
"""
from dataclasses import dataclass, field

from studies.systems import Metric

# The every-rule table's rows: each rule's train.py arguments per system; 'causal' serves every GPT system the row does
# not name. A value starting 'n/a' says why the row has no such run. A rule registered in rules.ATTENTION and not
# named here runs with its defaults (studies/lab.py's every_rule_rows).
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


@dataclass(frozen=True)
class TableSystem:
    """A system of a paper's table: its rows on equal terms, at each budget."""
    rows: dict                     # {row: train.py arguments}: the row's rule with its official settings, in order
    shared: str = ''               # the settings every row shares beyond the budget's (equal terms)
    paper: str = ''                # its train.py arguments at the paper budget, for every row (the paper's recipe);
                                   # '': the system's own
    paper_rows: dict = field(default_factory=dict)    # {row: its arguments at the paper budget} where they differ
    tasks: str = ''                # the paper's zero-shot tasks (studies/harness.py; the paper budget, or --tasks)
    swapped_from: dict = field(default_factory=dict)  # {row: the row whose trained run it is swapped into}: not
                                   # trained (studies/cluster_swap.py), then scored as every row is


@dataclass(frozen=True)
class Table:
    systems: dict                  # {system: TableSystem}, in the table's order
    analysis: tuple = ()           # the systems given ANALYSIS's numbers
    departs: str = ''              # where the paper budget departs from the paper's own runs (table.md's header)


ANALYSIS = (Metric('sparsity', 'exact zeros', 3), Metric('sink_ratio', 'sink ratio', 2))  # analyze.py's, mean over
# layers and heads
ROPE = '--pos_emb=rope'  # one position encoding for every language-model row: RoPE (the TDA paper's)
KRAUSE_VIT = {  # the Krause ViT table's rows, on CIFAR-10 and CIFAR-100
    'softmax': '--attention=softmax',
    'krause': '--attention=krause --krause_topk=2 --krause_radius=1 --krause_metric=manhattan --krause_sigma=2.5 '
              '--flex=False',  # config/krause_vit.py
}
ATTENTIONX_VIT = {  # AttentionX's ViT table's rows, on CIFAR-10 and CIFAR-100
    'lsa': '--attention=lsa',  # the base: diagonal masked, a learned temperature per layer
    'attentionx': '--attention=attentionx --attnx_gamma=1 --attnx_mask_diagonal=True '
                  '--attnx_learned_temperature=True',  # on the LSA ViT: its mask and temperature
}

TABLES = {
    'tda': Table(  # Threshold Differential Attention (arXiv 2601.12145), Table 1, and its long-context part
        analysis=('text',),
        departs="the tda row has full-width views, 176M parameters against the paper's GPT-2-162M (the paper does "
                "not publish the views' width; the tda_matched row, views of half width, has its 162M); the long "
                "system's rows are softmax and TDA; the paper's SCROLLS table also has Entmax and ReLA rows, "
                "missing here (the long system is each text row extended, and it extends these two)",
        systems={
            'text': TableSystem(
                shared=ROPE,
                paper='config/tda_gpt.py',  # GPT-2-162M, untied head, FineWeb-Edu, lr 1e-3 to 1e-4
                tasks='hellaswag,arc_easy,arc_challenge,openbookqa,piqa,winogrande',  # zero-shot, as the paper
                rows={
                    'softmax': '--attention=softmax',
                    'gated': '--attention=gated',  # elementwise gate (config/gated_gpt.py): +C² per layer
                    'entmax': '--attention=entmax --flex=False',  # 1.5-entmax (config/entmax_gpt.py)
                    'rela': '--attention=rela --flex=False',  # ReLA-g (config/rela_gpt.py)
                    'diff': '--attention=diff --flex=False',  # λ_init over depth (config/diff_gpt.py: SDPA)
                    'dex': '--attention=dex',  # the last half of the heads, f_D from 0 (config/dex_gpt.py)
                    'tda': '--attention=tda --tda_beta=0.5',  # β₀ = 0.5 fits small models (RESULTS.md); paper: 1
                    'tda_matched': '--attention=tda --tda_beta=0.5 --tda_matched=True',  # half-width views
                    'tra': '--attention=tda --tda_differential=False --tda_beta=0.5',  # the single-view ablation
                },
                paper_rows={'tda': '--attention=tda', 'tda_matched': '--attention=tda --tda_matched=True',  # β₀ = 1
                            'tra': '--attention=tda --tda_differential=False'}),
            'long': TableSystem(  # passkeys after the NTK extension; at paper, the text rows extended, and SCROLLS
                shared=ROPE,
                tasks='qmsum_scrolls,summscreenfd_scrolls,govreport_scrolls,qasper_scrolls',  # ROUGE, F1 (SCROLLS')
                rows={'softmax': '--attention=softmax', 'tda': '--attention=tda --tda_beta=0.5'},
                paper_rows={'tda': '--attention=tda'}),
        }),
    'krause_lm': Table(  # Krause Synchronization Transformers (arXiv 2602.11534), the language-model table
        departs="the paper's language models have 200M parameters; the paper budget trains the official 100M recipe "
                "(config/krause_gpt.py: 8 layers × 768, FineWeb-Edu, 19,073 steps of 524,288 tokens, about 10B "
                "tokens); every row has RoPE, where the official recipe (config/krause_gpt.py) has learned "
                "positions; CBT, one of the paper's six zero-shot tasks, is not in lm-eval and has no column",
        systems={'text': TableSystem(
            shared=ROPE,  # config/krause_gpt.py has learned positions; RoPE for every row here
            # 8 x 768, FineWeb-Edu, biases as the official code; the baselines alone (mix=False, as
            # config/{topk,longformer,routing}_gpt.py)
            paper='config/krause_gpt.py --mix=False',
            tasks='lambada_openai,hellaswag,arc_easy,piqa,blimp',  # zero-shot (CBT is not in the harness)
            rows={
                'softmax': '--attention=softmax',  # "standard"
                'window': '--attention=softmax --window=32',  # Krause's W
                'topk': '--attention=topk --topk_k=32',  # config/topk_gpt.py (the paper does not say its k)
                'longformer': '--attention=longformer --longformer_window=32 --longformer_window_last=512',  # grows
                'routing': '--attention=routing --routing_clusters=32 --routing_window=32 --flex=False',  # half local
                'krause': '--attention=krause --mix=True --krause_window=32 --krause_topk=16 --krause_sigma=2.5',
                'krause_matched': '--attention=krause --mix=True --mix_matched=True --krause_window=32 '
                                  '--krause_topk=16 --krause_sigma=2.5',  # each branch half the heads: softmax's size
            })}),
    'krause_vision': Table(  # Krause Synchronization Transformers, the CIFAR table: top-1, parameters, FLOPs
        departs="the paper's CIFAR rows are ViT-B; the paper budget trains ViT-S (the official KViT-S recipe: 12 "
                "layers × 384, 6 heads, 65 tokens), whose softmax row is its own baseline: no ViT-B figure is "
                "this table's; the Krause ViT here is pre-norm as the softmax row (the official KViT is post-norm) "
                "and learns σ per head (the official: per layer)",
        systems={'vit': TableSystem(KRAUSE_VIT, paper='config/softmax_vit.py'),  # the official KViT-S recipe
                 'vit100': TableSystem(KRAUSE_VIT, paper='config/softmax_vit100.py')}),
    'krause_images': Table(  # Krause Synchronization Transformers, the pixel-model table: bits/dim and images/s
        departs="the linear row (the paper's LARM) has the Krause ARM's shape and recipe, 16 layers × 512, where "
                "the LARM of Katharopoulos et al. is 16 × 256 (config/linear_arm_cifar10.py); every row trains on "
                "64 images a step, this project's choice (the paper gives no batch)",
        systems={'pixels': TableSystem(
            paper='config/arm_cifar10_softmax.py',  # 16 x 512; 64 images a step is ours (no batch in the paper)
            rows={
                'softmax': '--attention=softmax',
                'linear': '--attention=linear',  # "LARM" at the Krause ARM's 16 x 512 (its own: 16 x 256)
                'krause': '--attention=krause --krause_window=256 --krause_topk=192 --krause_sigma=2.5',
            })}),
    'krause_llm': Table(  # Krause Synchronization Transformers, the fine-tune: a base with LoRA, and with the shortcut
        departs="the paper fine-tunes Llama-3-8B on Flan-v2; the paper budget fine-tunes GPT-2 124M on Tiny "
                "Shakespeare; the zero-shot tasks are the paper's lm-eval has (CB's number is its accuracy, the "
                "first of the paper's Acc/F1); IFEval, the paper's generation task, has no column",
        systems={'shortcut': TableSystem(  # shared: none, the base's shape and positions (a fine-tune keeps them)
            paper='config/finetune_shakespeare_lora.py',  # GPT-2 124M on Tiny Shakespeare (ours: 20 steps, lr 1e-3)
            tasks='boolq,cb,piqa,mnli,anli_r1,anli_r2,anli_r3',  # zero-shot, as the paper (lm-eval's names)
            rows={
                'lora': '--attention=softmax --mix=False',  # LoRA alone: no shortcut
                'krause': '--attention=krause --mix=True --krause_window=32 --krause_topk=16 --krause_sigma=5.5',
            })}),
    'attentionx': Table(  # AttentionX (arXiv 2409.04275): its nanoGPT, and its ViT on an LSA ViT
        departs="the paper trains its nanoGPT on \"a small subset\" of OpenWebText (its size unsaid); the paper "
                "budget's text system trains nanoGPT's whole recipe, 600,000 steps of 491,520 tokens (about 295B "
                "tokens); every text row has RoPE, where nanoGPT has learned positions; the paper's ViT is "
                "vit_small (6 layers × 512, SPT patches) trained with SET-Adam (lr 1e-4, batch 512, 200 epochs); "
                "here the KViT-S one, a plain patch embedding, trained with AdamW (lr 3e-4, batch 256, 300 epochs)",
        systems={
            'text': TableSystem(
                shared=ROPE,  # the paper's nanoGPT: learned positions; RoPE for every row here
                paper='config/softmax_gpt.py',  # nanoGPT's GPT-2 124M on OpenWebText (config/attentionx_gpt.py)
                rows={'softmax': '--attention=softmax', 'attentionx': '--attention=attentionx --attnx_gamma=3'}),
            # the KViT-S recipe, as config/lsa_vit.py and config/attentionx_vit.py (the paper's: vit_small, 6 x 8 heads
            # of 64, Adam 1e-4, batch 512, 200 epochs)
            'vit': TableSystem(ATTENTIONX_VIT, paper='config/softmax_vit.py'),
            'vit100': TableSystem(ATTENTIONX_VIT, paper='config/softmax_vit100.py'),
        }),
    'cluster': Table(  # this project's cluster attention against softmax, trained and swapped into a trained softmax
        departs="no paper: the text system is AttentionX's nanoGPT run, at nanoGPT's whole recipe (600,000 steps of "
                "491,520 tokens, about 295B tokens of OpenWebText), not that paper's \"small subset\"",
        systems={
            'text': TableSystem(
                shared=ROPE,
                paper='config/softmax_gpt.py',  # nanoGPT's GPT-2 124M on OpenWebText (config/cluster_gpt.py)
                rows={'softmax': '--attention=softmax', 'cluster': '--attention=cluster --cluster_chunk=16',
                      'swap': '--attention=cluster --cluster_chunk=16 --cluster_m=16 --cluster_sharpness=20'},
                paper_rows={'cluster': '--attention=cluster --cluster_m=64 --cluster_chunk=64',  # at 1,024 tokens
                            'swap': '--attention=cluster --cluster_m=64 --cluster_chunk=64 --cluster_sharpness=20'},
                swapped_from={'swap': 'softmax'}),  # not trained: studies/cluster_swap.py on softmax's run
            'vit': TableSystem(
                paper='config/softmax_vit.py',
                rows={'softmax': '--attention=softmax',
                      'cluster': '--attention=cluster --cluster_iters=1 --cluster_self=True'}),  # cluster_vit.py
        }),
}
