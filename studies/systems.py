"""
The lab's systems (studies/ablate.py's columns), each one object: what it trains at each budget, the metric its
paper reports and which way is better, how a trained run is scored, what data it trains on and the run it starts
from. A new system is one System here (and a row's arguments in tables.py's ROWS where a rule needs its own).

A budget is a name in BUDGETS: tiny (seconds a run: the tests), cpu (the whole table in under two hours on 2 cores),
paper (the seed papers' configs: a GPU's job). A field given per budget is a {budget: value} dict; `at` reads it.
"""
from dataclasses import dataclass

BUDGETS = ('tiny', 'cpu', 'paper')


@dataclass(frozen=True)
class Metric:
    key: str                       # its name in a run's metrics (cell.json, table.json)
    label: str                     # its column in table.md
    digits: int                    # decimals shown
    lower_is_better: bool = False  # a loss; the others: higher is better


@dataclass(frozen=True)
class System:
    about: str                     # what it trains, and its metric, as table.md says it
    args: dict                     # {budget: train.py arguments}; a system with a base: added after the base's
    metrics: tuple                 # (Metric, ...): the first is the one its paper reports
    full_keys: tuple = ()          # eval_full.json's numbers its cells keep beside val_loss and examples
    data: object = ''              # (per budget) the lab setting naming its data ('text_source'), 'own' (prepared in
                                   # the lab's folder, data/SYSTEM, apart from the default's), or '' (train.py's own)
    base: object = ''              # (per budget) the system whose run this one starts from (--init_from), or ''
    base_row: str = ''             # the base's row: '' the run's own (a stage of it), else that one run (shared)
    passkeys: object = None        # (per budget) studies/extrapolate.py arguments: scored on fresh passkeys
    passkey_key: str = ''          # the metric of each extrapolate.py line, a format of its fields
    draw_batch: object = None      # (per budget) images drawn at once for images/s
    every_rule_args: str = ''      # what the every-rule table adds to each row (a paper's rows say their own)
    cell_join: str = ' · '         # between its metrics in an every-rule cell
    kin: str = ''                  # the system whose rows' arguments it takes where a row names none of its own
    column: bool = True            # a column --systems picks; False: a stage of another system only


def at(value, budget):
    """A field's value at `budget`: its entry where it is given per budget, else the one value."""
    return value[budget] if isinstance(value, dict) else value


CPU = '--device=cpu --compile=False'
LORA = '--lora_rank=16 --lora_alpha=32 --lora_dropout=0.1'
SHORT = '--eval_iters=1 --log_interval=5 --warmup_iters=2'
VIT_TINY = (f'{CPU} {SHORT} --n_layer=1 --n_head=2 --n_embd=32 --batch_size=16 --max_iters=4 --lr_decay_iters=4 '
            '--warmup_iters=1 --eval_interval=4 --eval_examples=64')
VIT_CPU = (f'{CPU} --n_layer=4 --n_head=4 --n_embd=128 --batch_size=64 --max_iters=200 --lr_decay_iters=200 '
           '--warmup_iters=10 --eval_interval=200 --eval_iters=10')  # a quarter epoch
EXTEND = ('--rope_scaling=ntk --rope_factor=4 --learning_rate=3e-4 --min_lr=3e-5 --always_save_checkpoint=True'
          )  # at 4x the base's block_size (the lr is ours: the TDA paper does not give it)
PASSKEY_TINY = (f'config/passkey.py {CPU} {SHORT} --n_layer=1 --n_embd=32 --batch_size=16 --max_iters=20 '
                '--lr_decay_iters=20 --eval_interval=20')
LOSS = Metric('val_loss', 'val loss', 4, lower_is_better=True)
TINY_OWN = {'tiny': 'own', 'cpu': '', 'paper': ''}  # the tests' budget prepares in the lab's folder: none in the repo's
TOP1 = Metric('val_acc', 'top-1', 4)

SYSTEMS = {  # the columns, in the every-rule table's order; the cpu budget: RESULTS.md's CPU recipes, some shortened
    'recall': System(
        'multi-query associative recall (the default job): answer accuracy, whole val split',
        {'tiny': f'{CPU} {SHORT} --n_layer=1 --n_embd=32 --batch_size=32 --max_iters=20 --lr_decay_iters=20',
         'cpu': CPU,  # the default job: 600 iterations of 256 sequences
         'paper': ''},
        (Metric('val_acc', 'answer acc', 4),), full_keys=('val_acc',), data=TINY_OWN),
    'text': System(
        'language model (tiny-shakespeare characters; paper: GPT-2 on FineWeb-Edu): val loss, whole val split',
        {'tiny': f'config/shakespeare_char.py {CPU} {SHORT} --n_layer=1 --n_head=2 --n_embd=32 --block_size=32 '
                 '--batch_size=8 --dropout=0 --max_iters=20 --lr_decay_iters=20 --eval_interval=20 --eval_examples=64',
         'cpu': f'config/shakespeare_char.py {CPU} --n_layer=4 --n_head=4 --n_embd=128 --block_size=64 '
                '--batch_size=12 --dropout=0 --max_iters=1000 --lr_decay_iters=1000 --eval_iters=20',  # baby GPT, 1/2
         'paper': 'config/softmax_fineweb.py'},
        (LOSS,), data='text_source'),
    'passkey': System(  # fresh episodes at 1x, 2x and 4x the trained length
        'passkey retrieval trained at T: whole-passkey accuracy at 1x / 2x / 4x T',
        {'tiny': PASSKEY_TINY,
         'cpu': f'config/passkey.py {CPU}',  # 500 iterations of 64 episodes of 64 tokens
         'paper': 'config/passkey.py'},
        (Metric('acc_1x', '1x', 3), Metric('acc_2x', '2x', 3), Metric('acc_4x', '4x', 3)),
        passkeys={'tiny': '--multiples=1,2,4 --num_examples=64', 'cpu': '--multiples=1,2,4 --num_examples=500',
                  'paper': '--multiples=1,2,4 --num_examples=500'},
        passkey_key='acc_{multiple}x', cell_join=' / ', data=TINY_OWN),
    'vit': System(
        'ViT on CIFAR-10: top-1 accuracy, test split',
        {'tiny': f'config/softmax_vit.py {VIT_TINY}', 'cpu': f'config/softmax_vit.py {VIT_CPU}',
         'paper': 'config/softmax_vit.py'},
        (TOP1,), full_keys=('val_acc',), data='cifar_source'),
    'vit100': System(
        'ViT on CIFAR-100: top-1 accuracy, test split (not in the default columns: --systems=vit100)',
        {'tiny': f'config/softmax_vit100.py {VIT_TINY}', 'cpu': f'config/softmax_vit100.py {VIT_CPU}',
         'paper': 'config/softmax_vit100.py'},
        (TOP1,), full_keys=('val_acc',), data='cifar100_source', kin='vit'),
    'pixels': System(
        'pixel model on CIFAR-10: bits/dim on the test split; images/s drawn at a fixed batch',
        {'tiny': f'config/arm_cifar10_cpu_softmax.py {SHORT} --n_layer=1 --n_embd=32 --batch_size=2 --max_iters=2 '
                 '--lr_decay_iters=2 --warmup_iters=1 --eval_interval=2 --eval_examples=2',
         'cpu': 'config/arm_cifar10_cpu_softmax.py --max_iters=20 --lr_decay_iters=20 --warmup_iters=2 '
                '--eval_interval=20 --eval_examples=100',  # bits/dim of the first 100 test images
         'paper': 'config/arm_cifar10_softmax.py'},
        (Metric('bits_per_dim', 'bits/dim', 4, lower_is_better=True), Metric('draw_images_per_s', 'images/s drawn', 3)),
        full_keys=('bits_per_dim',), data='cifar_source', draw_batch={'tiny': 2, 'cpu': 8, 'paper': 200}),
    'shortcut': System(  # the rule beside the base's own softmax, LoRA on both; paper: GPT-2 (its config's init_from)
        'a pretrained base fine-tuned with the rule as a LoRA shortcut beside its softmax: val loss',
        {'tiny': f'{LORA} --max_iters=10 --lr_decay_iters=10 --eval_interval=10',
         'cpu': f'{LORA} --max_iters=300 --lr_decay_iters=300 --warmup_iters=20 --eval_interval=300',
         'paper': 'config/finetune_shakespeare_lora.py'},
        (LOSS,), data={'tiny': 'text_source', 'cpu': 'text_source', 'paper': ''},
        base={'tiny': 'text', 'cpu': 'text', 'paper': ''}, base_row='softmax', every_rule_args='--mix=True'),
    'long': System(  # the base (passkeys of 1, 2 and 4 needles at T; paper: the text system's run of the same row),
        # then 4x its length from its checkpoint with NTK-scaled RoPE (docs/rules.md's RoPE scaling); scored at its
        # own length with 1, 2 and 4 needles, in words where it extends the language model
        'long context the TDA way: a base with RoPE, then 4x its length with NTK scaling (s = 4): whole-passkey '
        'accuracy at 4x with 1, 2 and 4 needles',
        {'tiny': f'{EXTEND} --block_size=256 --batch_size=4 --max_iters=4 --lr_decay_iters=4 --warmup_iters=1 '
                 '--eval_interval=4',
         'cpu': f'{EXTEND} --block_size=256 --batch_size=16 --max_iters=300 --lr_decay_iters=300 --warmup_iters=10 '
                '--eval_interval=100',  # RESULTS.md's "long context the TDA way": the same tokens a step
         'paper': f'{EXTEND} --block_size=4096 --batch_size=16 --max_iters=500 --lr_decay_iters=500 '
                  '--warmup_iters=20'},  # then 500 steps at 4,096 tokens (the TDA paper's)
        (Metric('needles_1', '1 needle', 3), Metric('needles_2', '2 needles', 3), Metric('needles_4', '4 needles', 3)),
        data={'tiny': 'own', 'cpu': 'own', 'paper': 'text_source'},
        base={'tiny': 'long_base', 'cpu': 'long_base', 'paper': 'text'},
        passkeys={'tiny': '--multiples=1 --needles=1,2,4 --num_examples=64',
                  'cpu': '--multiples=1 --needles=1,2,4 --num_examples=500',
                  'paper': '--multiples=1 --needles=1,2,4 --num_examples=500 --passkey=True'},
        passkey_key='needles_{needles}'),
    'long_base': System(
        'passkeys of 1, 2 and 4 needles',  # the long system's base below the paper budget
        {'tiny': f'{PASSKEY_TINY} --passkey_needles=1,2,4',
         'cpu': f'config/passkey.py {CPU} --passkey_needles=1,2,4'},  # 500 iterations of 64 episodes of 64
        (), data='own', column=False),
}
