"""harness.py's cross-checks, shared by tests/test_harness.py (tiny models) and RESULTS.md (a trained checkpoint):
the harness's HellaSwag log-likelihoods against hellaswag.py's, and its rolling log-likelihood against train.py's
--eval_full on the same tokens and windows.

$ python tests/harness_check.py --out_dir=DIR --hellaswag_source=hellaswag_val.jsonl [--limit=N] [--batch_size=16]
$ python tests/harness_check.py --out_dir=DIR --text_source=doc.txt --windows=20 --data_dir=FOLDER
    (then: python train.py <the run's arguments> --data_dir=FOLDER --eval_only=True --eval_full=True --init_from=resume)
"""
import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from studies import harness  # noqa: E402
from support import hellaswag  # noqa: E402


def run_harness(scorer, names, metadata, limit=None):
    """simple_evaluate on the local tasks `names` with every sample kept: the harness's own results dict."""
    import lm_eval
    from lm_eval.tasks import TaskManager
    manager = TaskManager(include_path=[str(harness.TASKS_DIR)], include_defaults=False, metadata=metadata)
    return lm_eval.simple_evaluate(model=harness.harness_model(scorer), tasks=names, limit=limit, task_manager=manager,
                                   log_samples=True, bootstrap_iters=0)


@torch.no_grad()
def hellaswag_reference(model, rows):
    """hellaswag.py's numbers per row: (summed log-likelihood of each ending (4,), its token counts (4,), label)."""
    import tiktoken
    enc = tiktoken.get_encoding("gpt2")
    out = []
    for row in rows:
        tokens, mask, label = hellaswag.render_example(row, enc)
        tokens, mask = tokens[:, -model.config.block_size:], mask[:, -model.config.block_size:]
        logits, _ = model(tokens, tokens)
        count = mask[:, 1:].sum(1)
        out.append((-(hellaswag.ending_losses(logits, tokens, mask) * count).double(), count, label))
    return out


def hellaswag_check(scorer, source, limit=None):
    """The harness on hellaswag_nanogpt beside hellaswag.py, on the first `limit` rows of `source`: the largest
    per-choice difference and each accuracy, with how often the harness's normalisations pick what the mean over
    tokens (build-nanogpt's acc_norm) picks."""
    results = run_harness(scorer, ['hellaswag_nanogpt'], {'hellaswag_source': str(source)}, limit)
    samples = sorted(results['samples']['hellaswag_nanogpt'], key=lambda s: s['doc_id'])
    rows = hellaswag.load_rows(source)[:len(samples)]
    reference = hellaswag_reference(scorer.model, rows)
    diff, picks = 0.0, dict.fromkeys(('acc', 'acc_norm', 'acc_bytes', 'token_mean', 'chars_as_tokens',
                                      'bytes_as_tokens'), 0)
    for sample, row, (ll, count, label) in zip(samples, rows, reference):
        theirs = torch.tensor([ll_ for ll_, _ in sample['filtered_resps']], dtype=torch.float64)
        diff = max(diff, (theirs - ll).abs().max().item())
        chars = torch.tensor([float(len(e)) for e in row['endings']], dtype=torch.float64)
        nbytes = torch.tensor([float(len(e.encode('utf-8'))) for e in row['endings']], dtype=torch.float64)
        token_pick = int((ll / count).argmax())
        picks['acc'] += int(ll.argmax()) == label  # hellaswag.py's summed log-likelihood, argmax
        picks['acc_norm'] += int((theirs / chars).argmax()) == label  # recomputed from the harness's numbers
        picks['acc_bytes'] += int((theirs / nbytes).argmax()) == label
        picks['token_mean'] += token_pick == label  # hellaswag.py's acc_norm
        picks['chars_as_tokens'] += int((theirs / chars).argmax()) == token_pick
        picks['bytes_as_tokens'] += int((theirs / nbytes).argmax()) == token_pick
    n = len(samples)
    metrics = results['results']['hellaswag_nanogpt']
    return {'rows': n, 'max_abs_diff': diff, 'harness_acc': metrics['acc,none'],
            'harness_acc_norm': metrics['acc_norm,none'], 'hellaswag_py_acc_sum': picks['acc'] / n,
            'hellaswag_py_acc_norm': picks['token_mean'] / n, 'harness_acc_norm_recomputed': picks['acc_norm'] / n,
            'acc_bytes': picks['acc_bytes'] / n, 'chars_pick_as_tokens': picks['chars_as_tokens'] / n,
            'bytes_pick_as_tokens': picks['bytes_as_tokens'] / n}


def rolling_text(enc, text, n_tokens):
    """(the prefix of `text` of exactly n_tokens GPT-2 tokens, those tokens); ValueError unless it round-trips."""
    tokens = enc.encode_ordinary(text)[:n_tokens]
    if len(tokens) < n_tokens or enc.encode_ordinary(enc.decode(tokens)) != tokens:
        raise ValueError(f"the first {n_tokens} tokens do not round-trip through GPT-2 BPE; take another length")
    return enc.decode(tokens), tokens


def write_text_dataset(data_dir, tokens):
    """A fineweb_edu-kind folder whose val.bin is EOT + tokens (train.bin the same): what train.py --eval_full reads."""
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    stream = np.array([50256] + list(tokens), dtype=np.uint16)
    for split in ('train', 'val'):
        stream.tofile(data_dir / f'{split}.bin')
    meta = {'dataset': 'fineweb_edu', 'vocab_size': 50257, 'encoding': 'gpt2', 'kind': 'text',
            'tokens': {'train': len(stream), 'val': len(stream)}, 'documents': {'train': 1, 'val': 1},
            'source': 'harness_check', 'val_every': 100, 'val_first': 0, 'complete': True}
    (data_dir / 'meta.json').write_text(json.dumps(meta))


def rolling_check(scorer, text_path):
    """The harness's rolling log-likelihood of the text in text_path: (its sum, its token count, mean loss)."""
    results = run_harness(scorer, ['text_rolling'], {'text_source': str(text_path)})
    (sample,) = results['samples']['text_rolling']
    ll = sample['filtered_resps'][0]
    ll = ll[0] if isinstance(ll, (list, tuple)) else ll
    n = len(scorer.enc.encode_ordinary(Path(text_path).read_text()))
    return ll, n, -ll / n


def main():
    import tiktoken
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--out_dir', required=True)
    parser.add_argument('--hellaswag_source', default=None)
    parser.add_argument('--text_source', default=None, help='a text whose first windows x block_size tokens are scored')
    parser.add_argument('--windows', type=int, default=20)
    parser.add_argument('--data_dir', default=None, help='where the same tokens go as a val split for --eval_full')
    parser.add_argument('--limit', type=int, default=None)
    parser.add_argument('--batch_size', type=int, default=16)
    args = parser.parse_args()
    harness.device = 'cpu'
    model = harness.load_bpe_run(args.out_dir).model
    scorer = harness.GPTScorer(model, tiktoken.get_encoding('gpt2'), batch_size=args.batch_size)
    t0 = time.time()
    if args.hellaswag_source:
        result = hellaswag_check(scorer, args.hellaswag_source, args.limit)
        print(json.dumps({**result, 'seconds': round(time.time() - t0, 1)}, indent=1))
    if args.text_source:
        n_tokens = args.windows * model.config.block_size
        text, tokens = rolling_text(scorer.enc, Path(args.text_source).read_text(), n_tokens)
        write_text_dataset(args.data_dir, tokens)
        (Path(args.data_dir) / 'text.txt').write_text(text)
        ll, n, loss = rolling_check(scorer, Path(args.data_dir) / 'text.txt')
        print(f"rolling: log-likelihood {ll:.4f} over {n} tokens, mean loss {loss:.6f}")


if __name__ == '__main__':
    main()
