# Krause ARM on CIFAR-10: config/arm_cifar10_softmax.py with Krause attention, window 256, top-k 192,
# σ₀ 2.5 as in our Krause GPT. The paper: 3.0032 bits/dim, sampling 1.9 -> 4.5 images/s (softmax -> Krause).
# python train.py config/arm_cifar10_krause.py
import os
exec(open(os.path.join(os.path.dirname(__file__), 'arm_cifar10_softmax.py')).read())  # same recipe, another rule
out_dir = 'out-arm-cifar10-krause'
attention = 'krause'
krause_window = 256
krause_topk = 192
krause_sigma = 2.5
