"""HellaSwag scoring (support/hellaswag.py): a row rendered to tokens, the mean-loss rule by hand, a random model at
chance on the offline sample, the download cached and its offline error."""
import io
import json
import math
import types
import urllib.error

import pytest
import torch
import torch.nn as nn

from conftest import SHARED

HELLASWAG = SHARED / "hellaswag" / "hellaswag_val_1000.jsonl"
if not HELLASWAG.exists() or not (SHARED / "tiktoken_cache").is_dir():
    pytest.skip(f"offline HellaSwag sample or GPT-2's tokenizer cache not found under {SHARED}",
                allow_module_level=True)

import tiktoken  # noqa: E402

from support import hellaswag  # noqa: E402

enc = tiktoken.get_encoding("gpt2")


class BigramModel(nn.Module):
    """Logits 0 everywhere, except `boost` on next token n wherever the current token is p, for (p, n) in pairs."""

    def __init__(self, pairs, boost, block_size=1024):
        super().__init__()
        self.config = types.SimpleNamespace(block_size=block_size)
        self.pairs, self.boost = pairs, boost

    def forward(self, idx, targets=None):
        logits = torch.zeros(*idx.shape, 50257)
        for p, n in self.pairs:
            logits[..., n] += self.boost * (idx == p)
        return logits, None


class TinyRandomGPT(nn.Module):
    """A randomly initialised stand-in with the model interface: logits, loss = model(idx, targets)."""

    def __init__(self, dim=8, block_size=64):
        super().__init__()
        self.config = types.SimpleNamespace(block_size=block_size)
        self.wte = nn.Embedding(50257, dim)
        self.head = nn.Linear(dim, 50257, bias=False)

    def forward(self, idx, targets=None):
        return self.head(self.wte(idx)), None


def hand_example(context):
    """A row whose ending 1 ("ate a big apple") the BigramModel predicts; sum-loss and mean-loss disagree on it."""
    row = {"ctx": context, "endings": ["sat", "ate a big apple", "ran home", "slept there"], "label": 1}
    chain = enc.encode_ordinary(context)[-1:] + enc.encode_ordinary(" ate a big apple")
    return row, BigramModel(list(zip(chain[:-1], chain[1:])), boost=5.0)


def test_render_example():
    tokens, mask, label = hellaswag.render_example(hand_example("The man")[0], enc)
    assert label == 1 and tokens.shape == mask.shape == (4, 6)  # 2 context tokens + the longest ending (4)
    assert tokens[1].tolist() == [464, 582, 15063, 257, 1263, 17180]  # "The man" + " ate a big apple"
    assert tokens[0].tolist() == [464, 582, 3332, 0, 0, 0]  # " sat", then padding
    assert mask.tolist() == [[0, 0, 1, 0, 0, 0], [0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 0, 0], [0, 0, 1, 1, 0, 0]]


@pytest.mark.parametrize("context, block_size", [("The man", 1024), ("Yesterday in the park the man", 6)])
def test_hellaswag_scores_mean_loss_by_hand(context, block_size):
    row, model = hand_example(context)
    model.config.block_size = block_size  # 6 < 10 tokens: the context is cut from the left, the endings survive
    V, b = 50257, 5.0
    hit = math.log(V - 1 + math.exp(b)) - b  # the boosted next token is the target
    miss = math.log(V - 1 + math.exp(b))  # a boost for another token
    plain = math.log(V)  # all logits 0
    mean = torch.tensor([miss, hit, (miss + plain) / 2, (miss + plain) / 2])  # by hand, per ending
    lengths = torch.tensor([1, 4, 2, 2])
    assert (mean * lengths).argmin() == 0 and mean.argmin() == 1  # summed loss picks "sat", mean loss "ate a big apple"

    tokens, mask, _ = hellaswag.render_example(row, enc)
    tokens, mask = tokens[:, -block_size:], mask[:, -block_size:]
    torch.testing.assert_close(hellaswag.ending_losses(model(tokens)[0], tokens, mask), mean)
    wrong = dict(row, label=0)  # right by summed loss, wrong by acc_norm
    assert hellaswag.evaluate(model, [row, wrong, row], "cpu") == (2, 3)
    assert hellaswag.evaluate(model, [row, wrong, row], "cpu", rank=1, world_size=2) == (0, 1)  # rows[1::2]


def test_hellaswag_random_model_is_at_chance():
    rows = hellaswag.load_rows(HELLASWAG)
    assert len(rows) == 1000
    torch.manual_seed(0)
    model = TinyRandomGPT()
    # every 4th row (250 rows, ~3 s): a full-vocabulary forward is ~13 ms a row on 2 CPU cores
    correct, total = hellaswag.evaluate(model, rows, "cpu", rank=0, world_size=4)
    assert total == 250 and abs(correct / total - 0.25) < 0.05
    assert model.training  # evaluate restores the mode it found


def test_hellaswag_download_and_offline_error(tmp_path, monkeypatch, capsys):
    def offline(*args, **kwargs):
        raise urllib.error.URLError("no network")
    monkeypatch.setattr(hellaswag.urllib.request, "urlopen", offline)
    with pytest.raises(RuntimeError, match="source"):
        hellaswag.load_rows(cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []

    monkeypatch.setattr(hellaswag.urllib.request, "urlopen", lambda url, timeout: io.BytesIO(HELLASWAG.read_bytes()))
    assert hellaswag.load_rows(cache_dir=tmp_path) == hellaswag.load_rows(HELLASWAG)
    assert [p.name for p in tmp_path.iterdir()] == ["hellaswag_val.jsonl"]  # cached under its final name only

    row, model = hand_example("The man")
    source = tmp_path / "two.jsonl"
    source.write_text(json.dumps(row) + "\n" + json.dumps(dict(row, label=0)) + "\n")
    assert hellaswag.main(model, source) == 0.5
    assert "hellaswag acc_norm 0.5000" in capsys.readouterr().out
