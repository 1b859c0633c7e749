"""Generation with a KV cache: for every rule in ATTENTION, cached greedy generation gives exactly the
tokens of uncached generation, and the cached logits equal the full forward's at every step, past the window, the
cluster chunk and block_size; and a cache refuses what it cannot serve."""
import pytest
import torch

from rules import ATTENTION
from machinery.caches import KVCache
from machinery.rope import Rotary
from conftest import cached_generation_equals_the_forward, rule_cases
from model import GPT, GPTConfig

# small windows and chunks, so a 16 + 64 token run crosses each boundary several times (and block_size = 32)
SMALL = dict(n_layer=2, n_head=2, n_embd=16, block_size=32, vocab_size=11, bias=False, pos_emb='rope', window=0,
             krause_window=8, krause_topk=4, cluster_chunk=8, cluster_m=4, tda_beta=0.5)
# (no Krause with pos_emb='none' here: repeated tokens then give layer 0 identical keys, tied scores at the top-k
# boundary that the band and the decode path may round apart; positions break the ties)
CASES = [dict(attention=name) for name in ATTENTION] + [
    dict(attention='softmax', window=8), dict(attention='krause', mix=True),
    dict(attention='krause', mix=True, mix_matched=True),
    dict(attention='attentionx', window=8),
    dict(attention='cluster', cluster_chunk=5), dict(attention='cluster', cluster_chunk=24), dict(attention='softmax', pos_emb='none'),
    dict(attention='softmax', pos_emb='learned', block_size=96)]


def tiny(**kw):
    torch.manual_seed(0)
    return GPT(GPTConfig(**{**SMALL, **kw})).double().eval()


@pytest.mark.parametrize('kw', rule_cases(CASES, 'has_cache'))
def test_cached_generation_equals_uncached_and_the_forward(kw):
    prompt = torch.randint(0, 11, (2, 16), generator=torch.Generator().manual_seed(1))
    cache = cached_generation_equals_the_forward(tiny(**kw), prompt, 64, atol=1e-5)  # 80 > block_size = 32
    assert cache.pos == 80


def test_bounded_caches_stay_constant_and_full_ones_grow():
    sizes = {}
    for kw in [dict(attention='softmax'), dict(attention='softmax', window=8), dict(attention='krause'),
               dict(attention='cluster')]:
        model, cache = tiny(**kw), None
        with torch.no_grad():
            cache = model.new_cache(1)
            model(torch.zeros(1, 16, dtype=torch.long), cache=cache)
            small = cache.nbytes()
            for _ in range(48):
                model(torch.zeros(1, 1, dtype=torch.long), cache=cache)
        sizes[tuple(kw.values())] = (small, cache.nbytes())
    assert sizes[('softmax',)][1] == 4 * sizes[('softmax',)][0]  # 64 positions held, 16 before
    for key in [('softmax', 8), ('krause',), ('cluster',)]:
        assert sizes[key][1] <= sizes[key][0] * 1.5, (key, sizes[key])


def test_a_cache_refuses_another_model_another_batch_and_a_second_prompt():
    model, other = tiny(), tiny()
    with torch.no_grad():
        cache = model.new_cache(2)
        model(torch.zeros(2, 4, dtype=torch.long), cache=cache)
        with pytest.raises(ValueError, match='another model or batch size'):
            other(torch.zeros(2, 1, dtype=torch.long), cache=cache)
        with pytest.raises(ValueError, match='another model or batch size'):
            model(torch.zeros(3, 1, dtype=torch.long), cache=cache)
        with pytest.raises(ValueError, match='one token at a time'):
            model(torch.zeros(2, 3, dtype=torch.long), cache=cache)


def test_learned_positions_refuse_past_block_size_and_generate_crops():
    model = tiny(pos_emb='learned', block_size=16)
    with pytest.raises(ValueError, match='learned position embeddings stop at block_size=16'):
        model(torch.zeros(1, 17, dtype=torch.long))
    prompt = torch.randint(0, 11, (1, 20), generator=torch.Generator().manual_seed(2))  # longer than block_size
    assert torch.equal(model.generate(prompt, 10, temperature=0), model.generate(prompt, 10, temperature=0,
                                                                                 use_cache=False))
    with pytest.raises(ValueError, match="pos_emb must be 'learned', 'rope' or 'none'"):
        GPTConfig(pos_emb='alibi')


def test_rope_at_an_offset_and_past_its_tables():
    rope = Rotary(8, 4).double()
    x = torch.randn(1, 1, 12, 8, dtype=torch.float64)
    whole = rope(x)  # grows its tables past max_len = 4
    torch.testing.assert_close(rope(x[:, :, 9:10], offset=9), whole[:, :, 9:10], atol=0, rtol=0)
    assert torch.equal(Rotary(8, 64).double().cos[:12], rope.cos[:12])  # growing keeps the stored positions


def test_ring_holds_the_last_window():
    ring = KVCache(3)
    ring.append(torch.arange(5.).view(1, 1, 5, 1))
    ring.append(torch.tensor(5.).view(1, 1, 1, 1))
    assert sorted(ring.tensors()[0].flatten().tolist()) == [3., 4., 5.] and ring.pos == 6


def test_passkey_task_hides_the_number_and_asks_for_it_at_the_end():
    from prepare import DATASETS
    from prepare.passkey import FILLER, make_examples
    assert DATASETS['passkey'][1] == 'examples'
    x, y = make_examples(50, 40, 4, seed=0)
    assert x.shape == y.shape == (50, 40) and (y[:, :-4] == -1).all()
    KEY, QUERY = FILLER + 10, FILLER + 11
    for row, target in zip(x, y):
        depth = list(row).index(KEY)
        assert list(row[depth + 1:depth + 5]) == list(target[-4:]) and row[-4] == QUERY
