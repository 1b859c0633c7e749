"""
What makes the rules (attention.py, rules/) run fast and remember, written once; none of it is a rule, and none of
it knows which rules exist. The rules import it at their top; read attention.py first.

  masks.py        which keys a query sees, as named mask_mods (causal, sliding window, the ViT's grid, ...), and
                  each made into what a kernel takes: a flex BlockMask, a dense (T, T) bool, the band's tiles; each
                  built once per shape; the keys each query sees; running flex_attention
  band.py         windowed rules without a T×T tensor: queries in tiles against the keys that can reach them; query
                  tiles recomputed in backward for full-context rules without a fused kernel (tile_queries)
  selection.py    the top k of each row, kept by a boundary between the k-th and (k+1)-th score (Krause, top-k)
  temperature.py  a learned softmax temperature mixed into a softmax rule (LSA, AttentionX)
  clusters.py     how many clusters a clustering rule uses, and how hard its assignment is (cluster, routing)
  heads.py        split and merge heads; the weight matrix of any attention that is linear in v (analysis)
  rope.py         rotary position embedding and its scaling past the trained context
  caches.py       generation: the keys and values one layer keeps between tokens (all of them, or a ring)
  kernels/        Triton kernels of single rules (Krause's band, TDA), what forward runs on CUDA: their own index

Nothing here imports a module of the repo outside machinery/ (tests/test_layout.py checks it).
"""
