"""
Each paper's claims beside its table (studies/ablate.py --table=NAME): CLAIMS[table] lists them, one Claim each, and
table.md shows per claim the paper's numbers, ours (the paired difference over seeds, studies/verdicts.py) and the
verdict. Edit freely: a claim is data, checked against its table by tests/test_lab.py.

A claim is the paper's as the paper states it, its qualifiers in `says`. It says how `row` compares with `against`
on one metric of one system: `way` 'lower' or 'higher' (the row's metric below or above the other's), 'not_higher'
/ 'not_lower' where the paper says the row matches or beats the other (a verdict of holds then needs the row told
apart on the good side; a match alone is 'not told apart', with the smallest difference the seeds could have seen),
or 'comparable' where the paper calls the two alike (contradicted where the seeds tell them apart either way, else
not told apart: seeds bound a match, never show one). A claim of a bound ("99% of the weights exactly zero") has
`threshold` and no `against`: the row's own values against that number. A claim that presumes something of the
table (that softmax has a sink for TDA to be free of) has a `premise`; where the table does not show it, the
verdict is 'untestable here', with why. `paper`: the paper's own numbers for the rows it reports, in the table's
units (a fraction for accuracy and zeros; a task's number is the metric the paper reports, studies/cells.py's
PAPER_METRIC), on its own model and data; {} where it reports none for this metric. A claim on a system or metric
the table did not run at this budget is left out of its table.md.
"""
from dataclasses import dataclass, field

WAYS = ('lower', 'higher', 'not_higher', 'not_lower', 'comparable')


@dataclass(frozen=True)
class Premise:
    """What a claim presumes of its table: `row`'s value of the claim's metric `way` against `threshold` (a
    verdict of holds on the row's own seeds). Not shown, the claim is untestable here."""
    says: str                # what must be so, in a phrase
    row: str
    way: str                 # one of WAYS
    threshold: float


@dataclass(frozen=True)
class Claim:
    says: str                # the claim in a sentence, the paper's own
    system: str
    metric: str              # a metric key of the system's table (studies/systems.py's, ANALYSIS's, task_NAME)
    row: str
    against: str             # the row compared with; '' for a claim of a bound (threshold)
    way: str                 # one of WAYS: the row's metric against the other's, or against the threshold
    paper: dict = field(default_factory=dict)  # {row: the paper's number}
    note: str = ''           # what the reader must know beside the verdict
    threshold: float | None = None   # the paper's bound, where the claim compares the row with a number
    premise: Premise | None = None   # what the claim presumes of the table


TDA_PAPER = 'the TDA paper, Table 1: GPT-2-162M on FineWeb-Edu-10B'
KRAUSE_LM = "the Krause paper's language models, zero-shot accuracy"
KRAUSE_LM_NOTE = ("the paper reports zero-shot accuracy, which a character model cannot score: val loss stands in, "
                  "one number where the paper counts tasks; the krause row is the mix form, with a third more "
                  "parameters than the other rows")
CLAIMS = {
    'tda': (
        Claim(f"TDA matches softmax's validation loss ({TDA_PAPER})", 'text', 'val_loss', 'tda', 'softmax',
              'not_higher', {'softmax': 3.1196, 'tda': 3.1190}),
        Claim("Gated attention's loss is above softmax's (Table 1)", 'text', 'val_loss', 'gated', 'softmax',
              'higher', {'softmax': 3.1196, 'gated': 3.1489},
              "gated adds a C × C gate to each layer: more parameters than softmax, as the table counts"),
        Claim("Entmax's loss is above softmax's (Table 1)", 'text', 'val_loss', 'entmax', 'softmax', 'higher',
              {'softmax': 3.1196, 'entmax': 3.1941}),
        Claim("ReLA's loss is above softmax's (Table 1)", 'text', 'val_loss', 'rela', 'softmax', 'higher',
              {'softmax': 3.1196, 'rela': 3.1657}),
        Claim("Differential attention's loss is above softmax's (Table 1)", 'text', 'val_loss', 'diff',
              'softmax', 'higher', {'softmax': 3.1196, 'diff': 3.1941}),
        Claim("DEX's loss is above softmax's (Table 1)", 'text', 'val_loss', 'dex', 'softmax', 'higher',
              {'softmax': 3.1196, 'dex': 3.1349}, "DEX starts as softmax (its f_D = 0 at step 0): a short run "
                                                 "keeps it near softmax whatever the claim"),
        Claim("TDA is ultra-sparse: 99% of its weights exactly zero", 'text', 'sparsity', 'tda', '', 'not_lower',
              {'tda': 0.99}, "at least the paper's 99%: the row's own fraction against that bound, not its lead "
                             "over softmax, which has no zeros", threshold=0.99),
        Claim("TDA is sparser than ReLA (99% of the weights zero against 94%)", 'text', 'sparsity', 'tda', 'rela',
              'higher', {'rela': 0.94, 'tda': 0.99}),
        Claim("TDA is free of the attention sink softmax has: token 0's share lower than softmax's", 'text',
              'sink_ratio', 'tda', 'softmax', 'lower', {}, "the ratio to the uniform share 1/(i+1)",
              premise=Premise("softmax has a sink: its sink ratio above 1 (token 0 gets more than the uniform share)",
                              'softmax', 'higher', 1.0)),
        Claim("TDA retrieves a single passkey more often than softmax after the length extension (at 4,000 tokens: "
              "15% against 6%)", 'long', 'needles_1', 'tda', 'softmax', 'higher', {'softmax': 0.06, 'tda': 0.15},
              "the paper's models are 162M language models extended to 4,000 tokens and asked zero-shot; here each "
              "is trained on passkeys at 64 tokens and extended to 256: another task"),
        Claim("TDA's lead is larger with 2 needles", 'long', 'needles_2', 'tda', 'softmax', 'higher', {},
              "as above"),
    ),
    'krause_lm': (
        Claim(f"Krause attention outperforms or matches standard attention on 3-4 of 6 tasks ({KRAUSE_LM})", 'text',
              'val_loss', 'krause', 'softmax', 'not_higher', {}, KRAUSE_LM_NOTE),
        Claim("... and sliding-window attention", 'text', 'val_loss', 'krause', 'window', 'not_higher'),
        Claim("... and top-k attention", 'text', 'val_loss', 'krause', 'topk', 'not_higher'),
        Claim("... and Longformer", 'text', 'val_loss', 'krause', 'longformer', 'not_higher'),
        Claim("... and the Routing Transformer", 'text', 'val_loss', 'krause', 'routing', 'not_higher'),
        Claim("The first at softmax's parameter count (this project's matched form, not the paper's)", 'text',
              'val_loss', 'krause_matched', 'softmax', 'not_higher'),
    ),
    'krause_vision': (
        Claim("The Krause ViT is more accurate than the softmax ViT on CIFAR-10 (ViT-B: 92.45% → 95.35%)", 'vit',
              'val_acc', 'krause', 'softmax', 'higher', {'softmax': 0.9245, 'krause': 0.9535},
              "the paper's numbers are ViT-B's, trained to the end"),
        Claim("The same on CIFAR-100 (72.28% → 78.03%)", 'vit100', 'val_acc', 'krause', 'softmax', 'higher',
              {'softmax': 0.7228, 'krause': 0.7803}, "the paper's numbers are ViT-B's, trained to the end"),
    ),
    'krause_images': (
        Claim("The Krause pixel model's bits/dim match softmax's (CIFAR-10: 3.0224 → 3.0032)", 'pixels',
              'bits_per_dim', 'krause', 'softmax', 'not_higher', {'softmax': 3.0224, 'krause': 3.0032},
              "the paper's models are 16 × 512 trained to the end; near 7 bits/dim a model has learned little"),
        Claim("Its bits/dim are below linear attention's (LARM)", 'pixels', 'bits_per_dim', 'krause', 'linear',
              'lower', {}),
        Claim("It draws images faster than softmax (1.9 → 4.5 images/s)", 'pixels', 'draw_images_per_s', 'krause',
              'softmax', 'higher', {'softmax': 1.9, 'krause': 4.5},
              "the paper's: 200 images at once on one GPU; here 8 on the CPU. Drawing speed does not depend on "
              "training"),
    ),
    'krause_llm': (
        Claim("The Krause shortcut beside LoRA beats LoRA alone (Llama-3-8B fine-tuned on Flan-v2)", 'shortcut',
              'val_loss', 'krause', 'lora', 'lower', {},
              "the paper reports zero-shot accuracy (CB, PIQA, MNLI and IFEval up, BoolQ comparable); val loss "
              "stands in"),
        Claim("On BoolQ zero-shot it is comparable with LoRA alone (80.41% → 80.59%)", 'shortcut', 'task_boolq',
              'krause', 'lora', 'comparable', {'lora': 0.8041, 'krause': 0.8059}),
        Claim("On CB zero-shot it is more accurate (60.71% → 64.29%)", 'shortcut', 'task_cb', 'krause', 'lora',
              'higher', {'lora': 0.6071, 'krause': 0.6429}, "accuracy, the paper's numbers (its F1: 47.81 → 48.04)"),
        *(Claim(f"The same on {name} zero-shot ({before:.2%} → {after:.2%})", 'shortcut', f'task_{task}', 'krause',
                'lora', 'higher', {'lora': before, 'krause': after})
          for task, name, before, after in (('piqa', 'PIQA', 0.7516, 0.7777), ('mnli', 'MNLI', 0.5953, 0.6327))),
    ),
    'attentionx': (
        Claim("AttentionX gives nanoGPT a slightly better validation curve (OpenWebText)", 'text', 'val_loss',
              'attentionx', 'softmax', 'lower', {}, "the paper shows a curve, no number; the curves are drawn "
                                                    "beside this table"),
        Claim("AttentionX on the LSA ViT-small is more accurate on CIFAR-10 (88.15% → 89.41%)", 'vit', 'val_acc',
              'attentionx', 'lsa', 'higher', {'lsa': 0.8815, 'attentionx': 0.8941}, "the paper's ViT trains 200 "
                                                                                      "epochs"),
        Claim("The same on CIFAR-100 (61.86% → 64.00%)", 'vit100', 'val_acc', 'attentionx', 'lsa', 'higher',
              {'lsa': 0.6186, 'attentionx': 0.6400}, "the paper's ViT trains 200 epochs"),
    ),
    'cluster': (
        Claim("Cluster attention trained from scratch matches softmax (this project's hypothesis, no paper)", 'text',
              'val_loss', 'cluster', 'softmax', 'not_higher', {}),
        Claim("The same on the ViT", 'vit', 'val_acc', 'cluster', 'softmax', 'not_lower', {}),
        Claim("Swapped into a trained softmax model without training, cluster attention keeps its loss", 'text',
              'val_loss', 'swap', 'softmax', 'not_higher', {}),
    ),
}
