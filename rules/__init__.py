"""
The registry: `attention=<key>` in a config picks the class ATTENTION names, and build_attention(config, layer_idx)
builds one layer of it (with mix=True, a softmax branch beside it: rules/mix.py). Softmax and the frame every rule
fits are in attention.py; every other rule is one file here, named by its key, its keys a dataclass beside it.
Adding a rule: one file here, its import and one line in ATTENTION; its keys join AttentionConfig by themselves
(the class's `Config`).
"""
from dataclasses import dataclass

from attention import FrameConfig, SoftmaxAttention
from rules.attentionx import AttentionX
from rules.cluster import ClusterAttention
from rules.dex import DEXAttention
from rules.diff import DiffAttention
from rules.entmax import EntmaxAttention
from rules.gated import GatedAttention
from rules.krause import KrauseAttention
from rules.linear import LinearAttention
from rules.longformer import LongformerAttention
from rules.lsa import LocalitySelfAttention
from rules.mix import MixAttention
from rules.rela import ReLAAttention
from rules.routing import RoutingAttention
from rules.ssmax import SSMaxAttention
from rules.tda import ThresholdDifferentialAttention
from rules.topk import TopkAttention

ATTENTION = {
    'softmax': SoftmaxAttention,
    'krause': KrauseAttention,
    'attentionx': AttentionX,
    'tda': ThresholdDifferentialAttention,
    'cluster': ClusterAttention,
    # the baselines: the rules the seed papers compare theirs with, each exact to its paper (docs/rules.md#baselines)
    'topk': TopkAttention,
    'longformer': LongformerAttention,
    'routing': RoutingAttention,
    'linear': LinearAttention,
    'gated': GatedAttention,
    'entmax': EntmaxAttention,
    'rela': ReLAAttention,
    'diff': DiffAttention,
    'ssmax': SSMaxAttention,
    'dex': DEXAttention,
    'lsa': LocalitySelfAttention,
}


@dataclass
class AttentionConfig(*(rule.Config for rule in reversed(ATTENTION.values())), FrameConfig):
    """Every key an attention layer reads: the frame's, then each rule's `Config` (dataclass fields come base class
    last first, so FrameConfig's lead, then the table's in its order). GPTConfig and ViTConfig extend it; every
    field is a config key of train.py."""


def build_attention(config, layer_idx):
    if config.mix_matched and not config.mix:
        raise ValueError("mix_matched=True halves the branches of a mix; pass --mix=True with it, or drop "
                         "--mix_matched")
    check_attention_name(config.attention)
    rule = ATTENTION[config.attention]
    return MixAttention(config, layer_idx, rule) if config.mix else rule(config, layer_idx)


def rule_class(attention, mix=False):
    """The class `attention=<name>` builds: ATTENTION's, or with mix the two-branch form (MixAttention)."""
    check_attention_name(attention)
    return MixAttention if mix else ATTENTION[attention]


def check_attention_name(name):
    if name not in ATTENTION:
        raise ValueError(f"unknown attention '{name}'; valid: {', '.join(sorted(ATTENTION))}")


def keys_read(attention, mix=False):
    """The keys beyond the frame's a layer of `attention` reads: its Config's and its `reads` (with mix: and those of
    its softmax branch). The one table of who reads what is these declarations."""
    rules = [ATTENTION[attention]] + ([SoftmaxAttention] if mix else [])
    return {key for rule in rules for key in (*(rule.Config.__dataclass_fields__ if rule.Config else ()), *rule.reads)}


def check_keys_read(config, set_keys=(), typed=(), attentions=None):
    """ValueError naming a key that no rule of the run reads, set away from its default: a key several rules share
    (`reads`: softmax's window, the query tiles' tile_weights) set by a config or the command line, or a rule's own
    key typed on the command line (a recipe's config file may hold another rule's keys: config/krause_gpt.py under
    --attention=softmax). config: the run's keys and values; attentions: the rules it runs (bench.py: several), else
    config['attention']. A mix reads its softmax branch's keys too."""
    attentions = attentions or [config['attention']]
    reads = set().union(*(keys_read(name, config['mix']) for name in attentions))
    shared = {key for rule in ATTENTION.values() for key in rule.reads}
    defaults = AttentionConfig.__dataclass_fields__
    for key in sorted(set().union(*(keys_read(name) for name in ATTENTION)) - reads):
        if (key in typed or key in shared and key in set_keys) and config[key] != defaults[key].default:
            readers = ', '.join(name for name in ATTENTION if key in keys_read(name))
            mix = ", or pass --mix=True (its softmax branch reads it)" if key in SoftmaxAttention.reads else ''
            raise ValueError(f"{key}={config[key]} is not read by attention={','.join(attentions)}, only by {readers}; "
                             f"drop --{key}{mix}")
