"""
A GPT language model whose attention rule is one config key (`attention`, a key of rules.ATTENTION).
Follows nanoGPT's model.py: pre-norm Blocks, GELU MLP, learned or rotary positions, tied or untied head.
The same Block serves the ViT (vit.py) with causal=False.
"""
import inspect
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

from attention import Attention, flex_mask_builder
from rules import AttentionConfig, MixAttention, build_attention
from machinery.caches import CacheGroup


@dataclass
class GPTConfig(AttentionConfig):
    block_size: int = 1024
    vocab_size: int = 50304  # GPT-2's 50257 padded up to a multiple of 64 for speed
    n_layer: int = 12
    mlp_hidden: int = 0      # MLP hidden width; 0 means 4 * n_embd
    tie_weights: bool = True  # share the token embedding with the output head
    drop_path: float = 0.0   # stochastic depth, linear over depth (ViT); 0 for the GPT
    gelu_approximate: str = 'none'  # the MLP's GELU: 'none' (exact) or 'tanh' (GPT-2's gelu_new: its weights want it)
    lora_rank: int = 0       # LoRA (below): rank of the update of each target Linear; 0: none. >0 freezes the rest
    lora_alpha: float = 32.0  # LoRA: the update is scaled by lora_alpha / lora_rank
    lora_dropout: float = 0.0  # LoRA: dropout on the update's input
    lora_targets: str = 'c_attn,c_proj,c_fc'  # LoRA: the Linears it adapts (attention q/k/v and out, the MLP's two)

    def __post_init__(self):  # checked with the config, so train.py can check it before any work
        if self.pos_emb not in ('learned', 'rope', 'none'):
            raise ValueError(f"pos_emb must be 'learned', 'rope' or 'none', got '{self.pos_emb}'")
        if self.gelu_approximate not in ('none', 'tanh'):
            raise ValueError(f"gelu_approximate must be 'none' or 'tanh', got '{self.gelu_approximate}'")
        for key, ok, need in (('lora_rank', self.lora_rank >= 0, '>= 0'), ('lora_dropout', 0 <= self.lora_dropout < 1,
                              'in [0, 1)'), ('lora_alpha', 0 < self.lora_alpha < math.inf, '> 0 and finite')):
            if not ok:
                raise ValueError(f"LoRA needs {key} {need}, got {getattr(self, key)}; pass e.g. --{key}="
                                 f"{getattr(GPTConfig, key)}")
        unknown = set(target_names(self.lora_targets)) - {'c_attn', 'c_proj', 'c_fc'}
        if self.lora_rank and (unknown or not target_names(self.lora_targets)):
            raise ValueError(f"lora_targets={self.lora_targets!r} must name some of c_attn, c_proj, c_fc (the "
                             f"attention and MLP Linears); pass e.g. --lora_targets=c_attn,c_proj,c_fc")


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (PyTorch's has no bias=False before 2.1 on every path)."""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class MLP(nn.Module):

    def __init__(self, config):
        super().__init__()
        hidden = config.mlp_hidden or 4 * config.n_embd
        self.c_fc = nn.Linear(config.n_embd, hidden, bias=config.bias)
        self.gelu = nn.GELU(approximate=getattr(config, 'gelu_approximate', 'none'))  # the ViT's config has no key
        self.c_proj = nn.Linear(hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class DropPath(nn.Module):
    """Stochastic depth: drop a whole residual branch per sample, scaling the kept ones by 1/keep."""

    def __init__(self, rate):
        super().__init__()
        self.rate = rate

    def forward(self, x):
        if not self.training or self.rate == 0.0:
            return x
        keep = 1.0 - self.rate
        mask = x.new_empty(x.size(0), *([1] * (x.dim() - 1))).bernoulli_(keep)
        return x * mask / keep


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x)). Shared by GPT and ViT."""

    def __init__(self, config, layer_idx):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = build_attention(config, layer_idx)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)
        self.drop_path = DropPath(config.drop_path * layer_idx / max(1, config.n_layer - 1))

    def forward(self, x, cache=None, masks=None):  # cache: this layer's generation state; masks: its flex masks
        x = x + self.drop_path(self.attn(self.ln_1(x), cache, masks))
        x = x + self.drop_path(self.mlp(self.ln_2(x)))
        return x


def init_weights(model, n_layer):
    """nanoGPT/GPT-2 init: N(0, 0.02) for Linears and Embeddings, zero biases, the projections that write into the
    residual stream (c_proj of every attention layer and MLP) scaled by 1/sqrt(2 n_layer); then the rules' own."""
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            torch.nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            torch.nn.init.zeros_(m.bias)
    for m in model.modules():  # module order, as GPT-2's named c_proj weights: the same random stream
        if isinstance(m, (Attention, MLP)) and hasattr(m, 'c_proj'):
            torch.nn.init.normal_(m.c_proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))
    init_rules(model)


def init_rules(model):
    """Every attention rule's own init (Attention.init_extra: a gate, say), after the model's own init."""
    for m in attention_layers(model):
        m.init_extra()


def attention_layers(model):
    """Every attention module of a model, the branches of a two-branch rule included: where its contracts are read."""
    return [m for m in model.modules() if isinstance(m, Attention)]


PATH_LABELS = dict(flex='flex_attention', kernel='Triton kernel', fused='SDPA', math='math path')


def attention_paths(model, device):
    """What forward runs in the model's attention layers on `device` (Attention.path_name), for a start-up line:
    'tda, Triton kernel'; the mix form 'krause (mix), Triton kernel beside SDPA' (its rule's branch, then its
    softmax's); layers that differ, each once. Neither a kernel nor flex drops attention weights: said if dropout."""
    def label(attn):
        if isinstance(attn, MixAttention):
            return f"{label(attn.rule)} beside SDPA"
        name = attn.path_name(device)
        dropped = attn.dropout and name in ('kernel', 'flex')
        return PATH_LABELS[name] + (' (no dropout on the weights)' if dropped else '')

    config = model.config
    paths = dict.fromkeys(label(m.attn) for m in model.modules() if isinstance(m, Block))
    return f"{config.attention}{' (mix)' if config.mix else ''}, {'; '.join(paths)}"


def with_extra_losses(model, loss):
    """The loss plus every attention layer's own training term from this forward (Attention.extra_loss: routing's
    commitment loss), by its gradient alone: the value stays the task's loss, the one logs and evaluations compare,
    and the term is scaled as the loss is (gradient accumulation, fp16's GradScaler, DDP's mean)."""
    for m in attention_layers(model):
        extra = m.extra_loss()
        if extra is not None:
            loss = loss + (extra - extra.detach())
    return loss


@torch.no_grad()
def layer_inputs_outputs(model, modules, *inputs):
    """{module: (x, y)}: what each of `modules` (layers of `model`: attention layers, blocks) is given (x, its first
    argument) and returns (y) the first time model(*inputs) calls it, in eval mode (no dropout: what an evaluation
    sees). The one way to take a layer's own input out of a model and run the layer again on it."""
    seen, was_training = {}, model.training

    def keep(module, args, out):  # returns None: a forward hook's return value would replace the output
        seen.setdefault(module, (args[0], out))
    hooks = [m.register_forward_hook(keep) for m in modules]
    try:
        model.eval()
        model(*inputs)
    finally:
        model.train(was_training)
        for hook in hooks:
            hook.remove()
    return seen


@torch.no_grad()
def attention_reports(model, *inputs):
    """[(module name, report)] of the attention layers that report on themselves (Attention.report, e.g. cluster
    usage), asked on one batch: each layer is given the input it sees in model(*inputs)."""
    layers = [(name, m) for name, m in model.named_modules()
              if isinstance(m, Attention) and type(m).report is not Attention.report]
    if not layers:
        return []
    seen = layer_inputs_outputs(model, [m for _, m in layers], *inputs)
    reports = [(name, m.report(*m.project(seen[m][0]))) for name, m in layers if m in seen]
    return [(name, report) for name, report in reports if report]


class GenerationCache(CacheGroup):
    """What generation keeps between tokens: a CacheGroup of one cache per layer (each rule's own,
    Attention.new_cache), for one model and one batch size. `pos`: the positions seen so far; `nbytes()`: what the
    layers' caches hold."""

    def __init__(self, model, batch):
        super().__init__(*[block.attn.new_cache() for block in model.transformer.h])
        self.model_id, self.batch = id(model), batch

    @property
    def layers(self):  # the group's caches, one per layer
        return self.caches


class GPT(nn.Module):

    def __init__(self, config):
        super().__init__()
        assert config.vocab_size is not None and config.block_size is not None
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd) if config.pos_emb == 'learned' else None,
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
            ln_f=LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.build_flex_masks = flex_mask_builder(config.flex)
        init_weights(self, config.n_layer)
        if config.tie_weights:  # https://paperswithcode.com/method/weight-tying
            self.transformer.wte.weight = self.lm_head.weight
        if config.lora_rank:  # fine-tuning: low-rank updates of the target Linears train, the base stays frozen
            add_lora(self, config.lora_rank, config.lora_alpha, config.lora_dropout, target_names(config.lora_targets))
            freeze_all_but_trainable(self)

    def get_num_params(self, non_embedding=True):
        """Parameter count; the position embedding is not counted, the (tied) token embedding is."""
        n_params = sum(p.numel() for p in self.parameters())
        if non_embedding and self.transformer.wpe is not None:
            n_params -= self.transformer.wpe.weight.numel()
        return n_params

    def new_cache(self, batch):
        return GenerationCache(self, batch)

    @torch.no_grad()
    def filled_cache(self, x):
        """A cache holding T positions, put there by each layer's own fill on the activations x (B, T, n_embd), with
        no forward: for benchmarks, where what the context holds does not change what a token costs."""
        cache = self.new_cache(x.size(0))
        for block, layer in zip(self.transformer.h, cache.layers):
            block.attn.fill(layer, *block.attn.project(x, 0))
        return cache

    def forward(self, idx, targets=None, cache=None):
        """idx (b, t). cache (from new_cache): empty, idx is the prompt (prefill); else idx is one new token."""
        b, t = idx.size()
        start = 0 if cache is None else cache.pos  # absolute position of idx[:, 0]
        if cache is not None and (cache.model_id != id(self) or cache.batch != b):
            raise ValueError(f"this cache was made for another model or batch size (batch {cache.batch}, got {b}); "
                             f"make one with model.new_cache({b})")
        if self.transformer.wpe is not None and start + t > self.config.block_size:  # rope/none: no bound
            raise ValueError(f"positions up to {start + t} but learned position embeddings stop at block_size="
                             f"{self.config.block_size}: crop the context (generate does) or use pos_emb='rope'/'none'")
        x = self.transformer.wte(idx)  # (b, t, n_embd)
        if self.transformer.wpe is not None:
            x = x + self.transformer.wpe(torch.arange(start, start + t, dtype=torch.long, device=idx.device))
        x = self.transformer.drop(x)
        masks = self.build_flex_masks([block.attn for block in self.transformer.h], t, idx.device)  # None off flex
        for i, block in enumerate(self.transformer.h):
            x = block(x, None if cache is None else cache.layers[i], None if masks is None else masks[i])
        x = self.transformer.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
            loss = with_extra_losses(self, loss)
        else:  # inference: only the last position is needed
            logits = self.lm_head(x[:, [-1], :])
            loss = None
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        return configure_adamw(self, weight_decay, learning_rate, betas, device_type)

    def estimate_mfu(self, fwdbwd_per_iter, dt, peak_flops):
        """Model FLOPs utilisation (PaLM appendix B), for dense attention over the full context."""
        N, cfg = self.get_num_params(), self.config
        L, H, Q, T = cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head, cfg.block_size
        flops_per_iter = (6 * N + 12 * L * H * Q * T) * T * fwdbwd_per_iter
        return flops_per_iter / dt / peak_flops

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True):
        """Extend idx (b, t) by max_new_tokens, sampling each from the model's distribution (temperature 0: greedy).
        use_cache: prefill the prompt, then one token at a time against each layer's cache (Attention.new_cache);
        False: recompute the whole context for every token (nanoGPT's loop, the reference).
        Learned positions stop at block_size: the context is cropped to its last block_size tokens, as nanoGPT
        does, and the cache refilled from the crop at every token past it (positions are absolute: a cache cannot
        slide). With 'rope' or 'none' the whole context is kept past block_size; windowed and cluster caches stay
        constant, full-context ones (softmax, AttentionX, TDA, the mix form's softmax branch) grow with it."""
        learned, cache = self.transformer.wpe is not None, None
        for _ in range(max_new_tokens):
            idx_cond = idx[:, -self.config.block_size:] if learned else idx
            if not use_cache:
                logits, _ = self(idx_cond)
            elif cache is None or (learned and cache.pos >= self.config.block_size):
                cache = self.new_cache(idx.size(0))
                logits, _ = self(idx_cond, cache=cache)  # prefill
            else:
                logits, _ = self(idx[:, -1:], cache=cache)  # one token
            logits = logits[:, -1, :]
            if temperature == 0:
                idx = torch.cat((idx, logits.argmax(-1, keepdim=True)), dim=1)
                continue
            logits = logits / temperature
            if top_k:  # None or 0: every token stays a candidate
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float('Inf')
            probs = F.softmax(logits, dim=-1)
            idx = torch.cat((idx, torch.multinomial(probs, num_samples=1)), dim=1)
        return idx


def configure_adamw(model, weight_decay, learning_rate, betas, device_type):
    """AdamW with weight decay on matrices (Linears, embeddings) only; biases, norms, scalars and the parameters a
    rule names in its `no_decay` (Attention's contract) are not decayed. Parameters a rule names in its `lr_scale`
    go in groups of their own, marked with the factor; train.py sets each group's lr to the schedule's × it. Each
    step ends with every attention layer's after_optimizer_step, where a rule overrides it (routing's k-means)."""
    exempt = {id(getattr(m, name)) for m in attention_layers(model) for name in m.no_decay}
    scale = {id(getattr(m, name)): f for m in attention_layers(model) for name, f in m.lr_scale.items()}
    params = [p for p in model.parameters() if p.requires_grad]
    groups = []
    for factor in [1.0] + sorted(set(scale.values()) - {1.0}):
        mine = [p for p in params if scale.get(id(p), 1.0) == factor]
        decay = [p for p in mine if p.dim() >= 2 and id(p) not in exempt]
        no_decay = [p for p in mine if p.dim() < 2 or id(p) in exempt]
        groups += [{'params': decay, 'weight_decay': weight_decay, 'lr_scale': factor},
                   {'params': no_decay, 'weight_decay': 0.0, 'lr_scale': factor}]
    groups = groups[:2] + [g for g in groups[2:] if g['params']]  # always decay, no_decay first
    use_fused = device_type == 'cuda' and 'fused' in inspect.signature(torch.optim.AdamW).parameters
    optimizer = torch.optim.AdamW(groups, lr=learning_rate, betas=betas, **(dict(fused=True) if use_fused else {}))
    updated = [m for m in attention_layers(model) if type(m).after_optimizer_step is not Attention.after_optimizer_step]
    if updated:  # what a rule moves once per step, after the parameters (routing's centroids); not on a skipped step
        optimizer.register_step_post_hook(lambda *_: [m.after_optimizer_step() for m in updated])
    return optimizer


# -----------------------------------------------------------------------------
# LoRA: fine-tune a frozen model through low-rank updates of some of its Linears.
# ("LoRA: Low-Rank Adaptation of Large Language Models", Hu et al. 2021, arXiv 2106.09685)
#
#     y = x Wᵀ + b + (α / r) · dropout(x) Aᵀ Bᵀ      A (r, in) random, B (out, r) zero: training starts at W exactly
#
# GPT builds it when lora_rank > 0 (below): the Linears named in lora_targets become LoRALinear, and only what a
# fine-tune should move is trained (`trainable`): the LoRA matrices, each MixAttention's gate, and every rule's own
# parameters (σ, β, λ, γ, seeds). `merge_lora` folds the updates into the weights for sampling and export:
# python studies/merge_lora.py --ckpt=out-finetune/ckpt.pt --out=out-finetune/merged.pt: a plain checkpoint, LoRA merged

class LoRALinear(nn.Linear):
    """An nn.Linear (weight and bias keep their names, so a base model's state dict loads as it is) plus the low-rank
    update lora_B @ lora_A, scaled by alpha / rank."""

    def __init__(self, in_features, out_features, bias, rank, alpha, dropout):
        super().__init__(in_features, out_features, bias=bias)
        self.scale = alpha / rank
        self.lora_A = nn.Parameter(torch.empty(rank, in_features))
        self.lora_B = nn.Parameter(torch.zeros(out_features, rank))  # zero: the update starts at nothing
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))        # as nn.Linear's own weights (and PEFT's A)
        self.lora_dropout = nn.Dropout(dropout)

    def forward(self, x):
        return super().forward(x) + (self.lora_dropout(x) @ self.lora_A.T @ self.lora_B.T) * self.scale

    def delta(self):  # (out, in): what merging adds to the weight
        return lora_delta(self.lora_A, self.lora_B, self.scale)

    def merged(self):
        """A plain nn.Linear computing the same function (without the dropout of training)."""
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                           device=self.weight.device, dtype=self.weight.dtype)
        with torch.no_grad():
            linear.weight.copy_(self.weight + self.delta())
            if self.bias is not None:
                linear.bias.copy_(self.bias)
        return linear


def lora_delta(lora_A, lora_B, scale):
    return scale * lora_B @ lora_A  # (out, r) @ (r, in): the update as one (out, in) matrix


def target_names(lora_targets):
    """'c_attn,c_proj' -> ('c_attn', 'c_proj'): the attribute names of the Linears LoRA adapts."""
    return tuple(name.strip() for name in lora_targets.split(',') if name.strip())


def add_lora(model, rank, alpha, dropout, targets):
    """Replace every nn.Linear whose attribute name is in `targets` by a LoRALinear holding the same weight and bias."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if name in targets and type(child) is nn.Linear:
                lora = LoRALinear(child.in_features, child.out_features, child.bias is not None, rank, alpha, dropout)
                lora.weight, lora.bias = child.weight, child.bias
                setattr(module, name, lora)


def trainable(model):
    """What a LoRA fine-tune trains: the LoRA matrices, the gates of two-branch layers, and the attention rules' own
    parameters (those a rule holds itself, outside its Linears: σ, β, λ, γ, seeds); the rest stays frozen."""
    keep = [p for m in model.modules() if isinstance(m, LoRALinear) for p in (m.lora_A, m.lora_B)]
    keep += [p for m in model.modules() if isinstance(m, MixAttention) for p in m.gate.parameters()]
    keep += [p for m in model.modules() if isinstance(m, Attention) for p in m.parameters(recurse=False)]
    return keep


def freeze_all_but_trainable(model):
    keep = {id(p) for p in trainable(model)}
    for p in model.parameters():
        p.requires_grad_(id(p) in keep)


def merge_lora(model):
    """Fold every LoRALinear into a plain nn.Linear of the same function, in place; returns the model."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, LoRALinear):
                setattr(module, name, child.merged())
    if hasattr(model, 'config'):
        model.config.lora_rank = 0
    return model


def merged_state(state, scale):
    """A state dict with LoRA, as train.py saves it, with each lora_B @ lora_A folded into its weight (scale: alpha /
    rank) and the LoRA entries gone: a base model's state dict."""
    out = {k: v for k, v in state.items() if not k.endswith(('.lora_A', '.lora_B'))}
    for key in state:
        if key.endswith('.lora_A'):
            prefix = key[:-len('lora_A')]
            out[prefix + 'weight'] = state[prefix + 'weight'] + lora_delta(state[key], state[prefix + 'lora_B'], scale)
    return out
