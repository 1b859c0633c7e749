"""
What makes the rules (attention.py, rules/) run fast and remember, written once; none of it is a rule, and none of
it knows which rules exist. The rules import it at their top; read attention.py first.

  heads.py   split and merge heads; the weight matrix of any attention that is linear in v (analysis)
  rope.py    rotary position embedding and its scaling past the trained context
  band.py    windowed rules without a T×T tensor: queries in tiles against the keys that can reach them; query
             tiles recomputed in backward for full-context rules without a fused kernel
  masks.py   a named mask_mod (attention.py's or a rule's) made into what a kernel takes: a flex BlockMask, a dense (T, T)
             bool, the band's tiles; each built once per shape; running flex_attention
  caches.py  generation: the keys and values one layer keeps between tokens (all of them, or a ring)
  kernels/   Triton kernels of single rules (Krause's band, TDA), what forward runs on CUDA: their own index

Nothing here imports a module of the repo outside machinery/ (tests/test_layout.py checks it).
"""
