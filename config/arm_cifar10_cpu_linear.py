# The CPU-sized CIFAR-10 ARM with linear attention (Katharopoulos et al. 2020, the Krause paper's "LARM"); see
# config/arm_cifar10_cpu_softmax.py. python train.py config/arm_cifar10_cpu_linear.py
import os
exec(open(os.path.join(os.path.dirname(__file__), 'arm_cifar10_cpu_softmax.py')).read())  # same recipe, another rule
out_dir = 'out-arm-cifar10-cpu-linear'
attention = 'linear'
