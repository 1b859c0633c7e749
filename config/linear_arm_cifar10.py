# Linear-attention ARM on CIFAR-10 ("LARM", the Krause paper's pixel-model baseline; docs/rules.md#linear):
# Katharopoulos, Vyas, Pappas, Fleuret 2020, "Transformers are RNNs" (arXiv 2006.16236), their CIFAR-10 model's
# shape: 16 layers x 256 wide (8 heads of 32, MLP 1024), dropout 0.1 (their idiap/linear-transformer-experiments
# command). Everything else is this project's ARM recipe, config/arm_cifar10_softmax.py (a 256-way softmax per
# subpixel, learned positions, AdamW 1e-3, 30 epochs of 64 images), not theirs (a mixture of 10 discretized
# logistics, sinusoidal positions beside a 128-wide value embedding, RAdam 2e-4, batches of 10, 500k steps). Their
# Table 2 (CIFAR-10 bits/dim): 3.40 linear, 3.47 softmax.
# python train.py config/linear_arm_cifar10.py
# Softmax at this shape:  python train.py config/linear_arm_cifar10.py --attention=softmax --out_dir=out-larm-softmax
# Beside the Krause ARM's shape (16 x 512):  python train.py config/arm_cifar10_softmax.py --attention=linear
#     --out_dir=out-arm-cifar10-linear
import os
exec(open(os.path.join(os.path.dirname(__file__), 'arm_cifar10_softmax.py')).read())  # same recipe, their shape
out_dir = 'out-larm-cifar10'
n_embd = 256
attention = 'linear'
linear_chunk = 64        # the causal math path's chunk: the same function at any chunk
linear_eps = 1e-6        # fast-transformers' default
