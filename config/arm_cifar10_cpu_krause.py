# The CPU-sized CIFAR-10 ARM with Krause attention, window 256, top-k 192; see
# config/arm_cifar10_cpu_softmax.py. python train.py config/arm_cifar10_cpu_krause.py
import os
exec(open(os.path.join(os.path.dirname(__file__), 'arm_cifar10_cpu_softmax.py')).read())  # same recipe, another rule
out_dir = 'out-arm-cifar10-cpu-krause'
attention = 'krause'
krause_window = 256
krause_topk = 192
