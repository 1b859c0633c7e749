"""
Score a GPT checkpoint with EleutherAI's lm-evaluation-harness (lm_eval), any attention rule, GPT-2 BPE.

$ python studies/harness.py --out_dir=DIR --tasks=hellaswag,arc_easy                 # harness tasks (their data: the hub)
$ python studies/harness.py --out_dir=DIR --tasks=hellaswag_nanogpt --hellaswag_source=hellaswag_val.jsonl   # local tasks
$ python studies/harness.py --out_dir=DIR --tasks=text_rolling --text_source=doc.txt  # rolling log-likelihood, perplexity
$ python studies/harness.py --out_dir=DIR --tasks=qmsum_scrolls,summscreenfd_scrolls,govreport_scrolls,qasper_scrolls

Writes the harness's results as DIR/harness.json and its table as DIR/harness.md. The local tasks (lm_tasks/):
hellaswag_local (the harness's hellaswag over a local jsonl), hellaswag_nanogpt (hellaswag.py's strings: ctx + " " +
ending), text_rolling (a local txt, one document, or jsonl with a `text` column), and SCROLLS, scored as SCROLLS
scores it: quality_scrolls, contractnli_scrolls (acc), qasper_scrolls (F1), qmsum_scrolls, summscreenfd_scrolls,
govreport_scrolls (ROUGE, rouge-score), from the hub or a local jsonl of one task's schema (id, pid, input, output;
the harness's scrolls_* do not import beside transformers 5). A model sees the last block_size tokens of a prompt
(the left crop below): SCROLLS measures long context only where block_size is long (--rope_scaling: docs/rules.md).
The harness is an optional extra (requirements-extras.txt), imported only here; the scoring (GPTScorer) is plain PyTorch:
- loglikelihood: context + continuation cropped from the left to block_size + 1 tokens, the last left out of the
  input (the harness's convention); an empty context is the EOT token. Batched, right-padded (the model is causal).
- loglikelihood_rolling: the text after one EOT, in disjoint windows of block_size predicted tokens (the last
  window takes a full block_size of context and scores only its new tokens), as the harness's rolling windows.
- generate_until: greedy, with the rule's KV cache (use_cache), context cropped to block_size - max_gen_toks.
"""
import difflib
import json
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

if __package__ in (None, ''):  # run as a script: the repo root on the path, as for prepare/
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# -----------------------------------------------------------------------------
out_dir = 'out'             # the run whose ckpt.pt is scored; harness.json and harness.md go here
tasks = 'hellaswag'         # comma-separated harness task names (lm_eval ls tasks) or local ones (lm_tasks/)
num_fewshot = 0             # solved examples before each prompt (0: zero-shot)
limit = 0                   # only the first N documents of each task (0: all): a quick look, not a score
batch_size = 16             # sequences per forward; the answers do not depend on it
use_cache = True            # generate_until with the rule's KV cache; False recomputes the context per token
include_path = ''           # a folder of your own task YAMLs, beside lm_tasks/
hellaswag_source = ''       # a local hellaswag_val.jsonl, for hellaswag_local and hellaswag_nanogpt
text_source = ''            # a local txt (one document) or jsonl (`text` column), for text_rolling
scrolls_source = ''         # a local jsonl of SCROLLS' schema for the one *_scrolls task named ('': each from the hub)
bootstrap_iters = 100000    # the harness's bootstrap for the stderr of perplexities; 0 skips it
seed = 1337
device = 'cuda' if torch.cuda.is_available() else 'cpu'
dtype = 'bfloat16' if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else 'float32'
# -----------------------------------------------------------------------------
TASKS_DIR = Path(__file__).resolve().parent / 'lm_tasks'
LOCAL_TASKS = {'hellaswag_local': 'hellaswag_source', 'hellaswag_nanogpt': 'hellaswag_source',
               'text_rolling': 'text_source'}  # local task -> the key that names its file
ROUGE_TASKS = ('qmsum_scrolls', 'summscreenfd_scrolls', 'govreport_scrolls')  # scored with Google's rouge-score
SCROLLS_TASKS = ('quality_scrolls', 'contractnli_scrolls', 'qasper_scrolls', *ROUGE_TASKS)  # hub or scrolls_source
SCROLLS_FIELDS = ('id', 'input', 'output')  # what lm_tasks/local.py reads of a SCROLLS row


class GPTScorer:
    """The three requests of an lm-eval model, on a GPT of this project, with strings in and out.
    model: a GPT in eval mode; enc: tiktoken's GPT-2 encoding; ctx: autocast (CUDA) or nullcontext."""

    def __init__(self, model, enc, device='cpu', batch_size=16, use_cache=True, ctx=nullcontext(), progress=True):
        self.model, self.enc, self.device, self.ctx = model, enc, device, ctx
        self.batch_size, self.progress = batch_size, progress
        self.use_cache = use_cache and all(block.attn.has_cache for block in model.transformer.h)  # a rule without
        # a cache (Attention.has_cache False) generates by recomputing the context, as GPT.generate(use_cache=False)
        self.block_size, self.eot = model.config.block_size, enc.eot_token

    def encode_pair(self, context, continuation):
        """(context tokens, continuation tokens); the context's trailing spaces go to the continuation and the two
        are encoded together, as the harness's own models do (GPT-2 BPE puts the space on the next word)."""
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole = self.enc.encode_ordinary(context + continuation)
        context_tokens = self.enc.encode_ordinary(context) if context else []
        return context_tokens, whole[len(context_tokens):]

    def loglikelihood(self, pairs):
        """[(context, continuation)] -> [(log p(continuation | context), whether greedy decoding gives it)]."""
        rows = []
        for context, continuation in pairs:
            context_tokens, tokens = self.encode_pair(context, continuation)
            whole = ([self.eot] if not context_tokens else context_tokens) + tokens
            rows.append((whole[-(self.block_size + 1):], min(len(tokens), self.block_size)))  # crop from the left
        return self.score(rows, 'loglikelihood')

    def loglikelihood_rolling(self, texts):
        """[text] -> [log p(text | EOT)], every token predicted once, in windows of block_size."""
        rows, owner = [], []
        for i, text in enumerate(texts):
            full = [self.eot] + self.enc.encode_ordinary(text)  # full[j] predicts full[j + 1]
            n = len(full) - 1
            for done in range(0, n, self.block_size):  # this window predicts full[done + 1 : end + 1]
                end = min(n, done + self.block_size)
                rows.append((full[max(0, end - self.block_size):end + 1], end - done))
                owner.append(i)
        sums = [0.0] * len(texts)
        for i, (logprob, _) in zip(owner, self.score(rows, 'loglikelihood_rolling')):
            sums[i] += logprob
        return sums

    @torch.no_grad()
    def score(self, rows, desc):
        """rows: [(tokens, n)]: the model reads tokens[:-1] and the last n tokens are scored. Longest first, in
        batches, right-padded. Returns [(sum of log-probabilities, every scored token the argmax)] in row order."""
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))
        out = [None] * len(rows)
        for b in tqdm(range(0, len(order), self.batch_size), desc=desc, unit='batch', disable=not self.progress,
                      mininterval=2):
            batch = [rows[i] for i in order[b:b + self.batch_size]]
            idx = torch.zeros(len(batch), max(len(t) for t, _ in batch) - 1, dtype=torch.long)  # (B, T)
            for j, (tokens, _) in enumerate(batch):
                idx[j, :len(tokens) - 1] = torch.tensor(tokens[:-1])
            idx = idx.to(self.device)
            with self.ctx:
                logits, _ = self.model(idx, idx)  # targets: logits at every position (B, T, V)
            for j, (tokens, n) in enumerate(batch):
                end = len(tokens) - 1
                logp = F.log_softmax(logits[j, end - n:end].float(), dim=-1)  # (n, V): the scored positions
                target = torch.tensor(tokens[-n:], device=logp.device)
                greedy = bool((logp.argmax(-1) == target).all())
                out[order[b + j]] = (logp.gather(1, target[:, None]).sum().item(), greedy)
        return out

    @torch.no_grad()
    def generate_until(self, requests):
        """[(context, {'until': [str], 'max_gen_toks': int})] -> [greedy continuation cut before the first stop
        string]. Requests with the same context length and settings go in one batch."""
        jobs = {}  # (context length, max_gen_toks, until) -> [(request index, context tokens)]
        for i, (context, kwargs) in enumerate(requests):
            until = kwargs.get('until') or [self.enc.decode([self.eot])]
            until = (until,) if isinstance(until, str) else tuple(until)
            steps = int(kwargs.get('max_gen_toks', 256))
            tokens = (self.enc.encode_ordinary(context) or [self.eot])[-max(1, self.block_size - steps):]
            jobs.setdefault((len(tokens), steps, until), []).append((i, tokens))
        out = [None] * len(requests)
        groups = [(key, group[b:b + self.batch_size]) for key, group in jobs.items()
                  for b in range(0, len(group), self.batch_size)]
        for (t, steps, until), group in tqdm(groups, desc='generate_until', unit='batch', disable=not self.progress):
            idx = torch.tensor([tokens for _, tokens in group], device=self.device)  # (B, t)
            learned = self.model.transformer.wpe is not None
            steps = min(steps, self.block_size - t) if learned else steps  # learned positions stop at block_size
            texts = self.greedy(idx, steps, until)
            for (i, _), text in zip(group, texts):
                out[i] = cut(text, until)
        return out

    def greedy(self, idx, steps, until):
        """The texts of `steps` greedy tokens after idx (B, t), stopping once every row holds a stop string."""
        cache, t = None, idx.size(1)
        for _ in range(steps):
            with self.ctx:
                if not self.use_cache:
                    logits, _ = self.model(idx)  # the whole context again: the reference
                elif cache is None:
                    cache = self.model.new_cache(idx.size(0))
                    logits, _ = self.model(idx, cache=cache)  # prefill
                else:
                    logits, _ = self.model(idx[:, -1:], cache=cache)  # one token against the cache
            idx = torch.cat((idx, logits[:, -1].argmax(-1, keepdim=True)), dim=1)
            texts = [self.enc.decode(row[t:]) for row in idx.tolist()]
            if all(any(stop in text for stop in until) for text in texts):
                break
        return [self.enc.decode(row[t:]) for row in idx.tolist()]


def cut(text, until):
    """text up to the first of the stop strings."""
    for stop in until:
        text = text.split(stop)[0]
    return text


def harness_model(scorer):
    """The scorer as an lm_eval model (lm_eval.api.model.LM): what simple_evaluate takes."""
    from lm_eval.api.model import LM

    class AttentionLabLM(LM):
        def loglikelihood(self, requests):
            return scorer.loglikelihood([r.args for r in requests])

        def loglikelihood_rolling(self, requests):
            return scorer.loglikelihood_rolling([r.args[0] for r in requests])

        def generate_until(self, requests):
            return scorer.generate_until([r.args for r in requests])

    return AttentionLabLM()


def check_harness_settings(c):
    """The task names; ValueError naming the first bad setting or missing local file, before the harness is imported
    or any model loaded: the device first."""
    from support.checks import check_device, check_dtype, check_ranges
    check_device(c['device'])
    check_dtype(c['dtype'])
    if not c['out_dir']:
        raise ValueError("out_dir is empty; pass --out_dir=DIR of the run to score (its ckpt.pt)")
    names = [t for t in c['tasks'].split(',') if t]
    if not names:
        raise ValueError("tasks is empty; pass e.g. --tasks=hellaswag,arc_easy (lm_eval ls tasks lists them)")
    for name in names:
        key = LOCAL_TASKS.get(name)
        if key and not c[key]:
            raise ValueError(f"task {name} reads a local file: pass --{key}=PATH")
    scrolls = [name for name in names if name in SCROLLS_TASKS]
    if c['scrolls_source'] and len(scrolls) > 1:  # each task would read the same rows as its own
        raise ValueError(f"scrolls_source={c['scrolls_source']} is one task's rows, and tasks names {len(scrolls)} "
                         f"SCROLLS tasks ({', '.join(scrolls)}); pass one per run with its own --scrolls_source")
    for key in ('hellaswag_source', 'text_source', 'scrolls_source', 'include_path'):
        if c[key] and not os.path.exists(c[key]):
            raise ValueError(f"{key}={c[key]} does not exist; pass the path of an existing "
                             f"{'folder of task YAMLs' if key == 'include_path' else 'file'}")
    check_ranges(c, at_least_one=('batch_size',), not_negative=('limit', 'num_fewshot', 'bootstrap_iters'))
    check_local_files(c, names, scrolls)
    return names


def check_local_files(c, names, scrolls):
    """ValueError naming the local file a task reads where its rows lack the task's fields or it holds no text: read
    as the task reads it (lm_tasks/local.py), now, not a KeyError or a ZeroDivisionError from inside the harness."""
    from prepare.sources import read_documents, read_source_rows
    from support.hellaswag import SCHEMA, read_rows
    if {'hellaswag_local', 'hellaswag_nanogpt'} & set(names):
        read_rows(c['hellaswag_source'], SCHEMA)
    if 'text_rolling' in names:
        read_documents(c['text_source'], 'text_source')
    if scrolls and c['scrolls_source']:
        path = c['scrolls_source']
        read_source_rows(path, SCROLLS_FIELDS, f"--scrolls_source={path}", f"pass --scrolls_source=PATH of a jsonl "
                         f"of SCROLLS' schema ({', '.join(SCROLLS_FIELDS)} in each row)")


def load_bpe_run(path):
    """load_run(path) on `device` (a LoRA fine-tune scored as its merged weights); SystemExit unless its model
    reads GPT-2 BPE."""
    from support.loading import load_run
    run = load_run(path, device)
    encoding = run.meta.get('encoding')
    if encoding != 'gpt2':
        raise SystemExit(f"error: {path} is a model of {run.config.get('dataset')} ({encoding or 'images'}), not of "
                         f"GPT-2 BPE text; the harness's tasks are English text: score a model trained on "
                         f"fineweb_edu, openwebtext or shakespeare")
    return run


def write_results(results, elapsed, table):
    """DIR/harness.json (the harness's results, configs and versions) and DIR/harness.md (its table), each written
    atomically; a failed write is one `error:` line (the table is printed before)."""
    from prepare.atomic import write_or_exit
    keep = {k: v for k, v in results.items() if k != 'samples'}
    keep['attention_lab'] = {'out_dir': out_dir, 'tasks': tasks, 'limit': limit, 'batch_size': batch_size,
                             'use_cache': use_cache, 'device': device, 'dtype': dtype, 'seconds': elapsed}

    def write_json(tmp):
        with open(tmp, 'w') as f:
            json.dump(keep, f, indent=2, default=str)

    def write_table(tmp):
        with open(tmp, 'w') as f:
            f.write(table)
    todo = "pass --out_dir=DIR of the run in a folder you can write to (or free space there) and run again"
    write_or_exit(os.path.join(out_dir, 'harness.json'), write_json,
                  "the scores are only in the table printed above", todo)
    write_or_exit(os.path.join(out_dir, 'harness.md'), write_table,
                  f"{out_dir}/harness.json was written and is kept; the table is printed above", todo)


def main():
    from prepare.sources import gpt2_encoding
    from support.runtime import precision
    from support.checks import check_or_exit, one_line_errors, script_settings
    names = check_or_exit(check_harness_settings, script_settings(globals()))
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
    except ImportError:
        raise SystemExit("error: harness.py needs EleutherAI's lm-evaluation-harness: pip install -r "
                         "requirements-extras.txt (lm-eval==0.4.13)")
    rouge = [name for name in names if name in ROUGE_TASKS]
    if rouge:
        try:
            import rouge_score  # noqa: F401
        except ImportError:
            raise SystemExit(f"error: {', '.join(rouge)}: SCROLLS scores these with Google's ROUGE; pip install -r "
                             f"requirements-extras.txt (rouge-score==0.1.2)")
    torch.manual_seed(seed)
    paths = [str(TASKS_DIR)] + ([include_path] if include_path else [])
    metadata = {key: os.path.abspath(globals()[key]) if globals()[key] else ''
                for key in ('hellaswag_source', 'text_source', 'scrolls_source')}
    local_only = all(name in LOCAL_TASKS or name in SCROLLS_TASKS for name in names)  # the harness's 200+ unscanned
    manager = TaskManager(include_path=paths, include_defaults=not local_only, metadata=metadata)
    unknown = [name for name in names if name not in manager.all_tasks and not os.path.exists(name)]
    if unknown:  # before the model is loaded; a task's data is fetched later, by the harness
        hint = difflib.get_close_matches(unknown[0], manager.all_tasks, n=1)
        raise SystemExit(f"error: tasks: {', '.join(unknown)} is no task the harness knows"
                         + (f"; did you mean {hint[0]}?" if hint else "") + " (lm_eval ls tasks lists them)")
    _, _, ctx = precision(device, dtype)
    with one_line_errors(RuntimeError):  # offline with no tokenizer cached: before the model is loaded
        enc = gpt2_encoding()
    run = load_bpe_run(os.path.join(out_dir, 'ckpt.pt'))
    scorer = GPTScorer(run.model, enc, device, batch_size, use_cache, ctx)
    print(f"lm_eval {lm_eval.__version__}: {', '.join(names)} on {out_dir}/ckpt.pt (iteration "
          f"{run.iter_num}, {run.model.config.attention}), {num_fewshot}-shot"
          + (f", first {limit} documents" if limit else ''))
    t0 = time.time()
    try:
        results = lm_eval.simple_evaluate(model=harness_model(scorer), tasks=names, num_fewshot=num_fewshot,
                                          limit=limit or None, task_manager=manager, bootstrap_iters=bootstrap_iters,
                                          log_samples=False, random_seed=seed, numpy_random_seed=seed,
                                          torch_random_seed=seed, fewshot_random_seed=seed)
    except Exception as e:  # a task's data not reachable offline, or its YAML broken
        first = (str(e).splitlines() or [''])[0][:300]
        raise SystemExit(f"error: the harness stopped ({type(e).__name__}: {first}); check --tasks (lm_eval ls "
                         f"tasks), or, offline, use the local tasks (--hellaswag_source, --text_source) or your own "
                         f"YAMLs (--include_path)")
    elapsed = time.time() - t0
    from lm_eval.utils import make_table
    table = make_table(results)
    print(table)
    write_results(results, elapsed, table)
    print(f"{elapsed:.1f} s; wrote {out_dir}/harness.json and {out_dir}/harness.md")


if __name__ == '__main__':
    from prepare import ROOT
    exec(open(ROOT / 'configurator.py').read())
    main()
