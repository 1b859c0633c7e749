"""
Triton kernels: a rule computed directly where a general kernel (SDPA, flex) spends its time outside the rule. Each
is the same function as its rule's math path, checked against it (tests/test_kernels.py through the interpreter on a
CPU; tests/kernel_builds.py builds each for a Hopper GPU), and what forward runs on CUDA (Attention.path_name).

  triton_available.py  whether a kernel can run on a device, the optional import of triton, the tile loads
  krause.py            Krause's causal band: the top k of each row's window by a radix search in registers, the
                       softmax over them, `@ v`; a flash-style backward from the saved boundaries
  tda.py               TDA's thresholded weights relu(s - τ)^p of one or two views times v, no softmax statistics;
                       a backward in two kernels (keys, then queries)

Each kernel file: its kernels, `tiles` (the launch shapes per dtype), an autograd Function, and the function its rule
calls.
"""
