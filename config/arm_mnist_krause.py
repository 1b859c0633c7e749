# Krause ARM on MNIST: config/arm_mnist_softmax.py with Krause attention, window 128, top-k 96.
# python train.py config/arm_mnist_krause.py
import os
exec(open(os.path.join(os.path.dirname(__file__), 'arm_mnist_softmax.py')).read())  # same recipe, another rule
out_dir = 'out-arm-mnist-krause'
attention = 'krause'
krause_window = 128
krause_topk = 96
krause_sigma = 2.5
