"""
How many counting passes Krause's Triton kernel runs to select each row's top k, counted through Triton's
interpreter on the CPU (no GPU needed): a program's search ends with its slowest row, so the count that sets the
forward's time is the passes per program. Random q, k, v (standard normal, bfloat16 as training runs it, σ = 1),
one head.

$ python tests/selection_passes.py                      # W = 256, k = 192, T = 1,024, D = 64
$ python tests/selection_passes.py --W=32 --k=16 --T=512
"""
import os
import sys
from pathlib import Path

os.environ['TRITON_INTERPRET'] = '1'  # before the kernels are defined
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import triton_interpreter  # noqa: E402  (this script's folder: tests/)

triton_interpreter.patch()

import torch  # noqa: E402

import machinery.kernels.krause as krause_kernel  # noqa: E402


def selection_passes(W=256, topk=192, T=1024, D=64, seed=0):
    """(programs, passes per program: mean, max) of one forward at this shape: each program calls band_boundaries
    once and narrow once a pass, both counted (the interpreter runs the programs one after another)."""
    torch.manual_seed(seed)
    q, k, v = (torch.randn(1, 1, T, D).bfloat16() for _ in range(3))
    passes, saved = [], (krause_kernel.band_boundaries, krause_kernel.narrow)

    def program(*args, **kwargs):
        passes.append(0)
        return saved[0](*args, **kwargs)

    def counted(*args, **kwargs):
        passes[-1] += 1
        return saved[1](*args, **kwargs)
    krause_kernel.band_boundaries, krause_kernel.narrow = program, counted
    try:
        krause_kernel.krause_band_attention(q, k, v, torch.zeros(1), W, topk)
    finally:
        krause_kernel.band_boundaries, krause_kernel.narrow = saved
    return len(passes), sum(passes) / len(passes), max(passes)


def main():
    settings = dict(W=256, k=192, T=1024, D=64)
    for arg in sys.argv[1:]:
        key, _, value = arg.lstrip('-').partition('=')
        if key not in settings or not value.isdigit():
            sys.exit(f"error: {arg}: the keys are {', '.join('--' + s + '=N' for s in settings)}")
        settings[key] = int(value)
    programs, mean, most = selection_passes(settings['W'], settings['k'], settings['T'], settings['D'])
    rows = krause_kernel.tiles(min(settings['W'], settings['T']), settings['D'], torch.bfloat16)[0][0]
    print(f"W={settings['W']} k={settings['k']} T={settings['T']} D={settings['D']}: "
          f"{programs} programs of {rows} rows, "
          f"passes per program {mean:.2f} on average, at most {most}")


if __name__ == '__main__':
    main()
