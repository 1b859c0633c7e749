"""
Attention speed and memory. For each sequence length: forward+backward time and peak memory of one
attention rule (`attend`, the part that differs between rules, on q/k/v of shape
(batch_size, n_head, T, D)), beside causal softmax SDPA measured in the same run
(`vs_softmax` = ms / softmax ms).

$ python bench.py --attention=softmax --window=256 --seq_lens=2048,8192
$ python bench.py --attention=krause --krause_window=256 --krause_topk=192 --seq_lens=8192 \
      --dense=True --json=True
$ python bench.py --attention=topk,linear,longformer --seq_lens=1024,8192   # several, each beside softmax

Every attention config key (rules.AttentionConfig) is a flag. --flex=True times the
flex_attention path (forward only on CPU, where flex has no backward); --dense=True also times a
rule's formula as code, dense O(T²) (`attend_reference`), where it has one. --mode=model times a whole GPT train step
(tokens/s) instead. Peak memory: CUDA allocator peak on GPU; on CPU the rise of the process's
resident set (Linux only), which glibc's reuse of freed heap blocks can swell far past the live
tensors (the query-tiled rules: many tiles' blocks); --live_memory=True measures those alone. Each
row is printed as it is measured; on CPU its time first, and the peaks after every time (measure).

--mode=pace: the rule's attention alone (forward+backward) and its whole GPT train step (tokens/s),
each beside causal flash softmax (SDPA) in the same run, with peak memory; --profile=True adds each
case's top operations (torch.profiler, one step after the timing). Its defaults are a GPU's: on a
CPU it says so first, with a CPU-sized command (PACE_CPU_RECIPE). The flex paths on a GPU, e.g.:
$ python bench.py --mode=pace --attention=krause --flex=True --compile=True --n_layer=12 \
      --n_head=12 --n_embd=768 --bias=False --batch_size=12 --seq_lens=1024,4096,8192 --profile=True
--kernel=True adds the rule off flex, its fused path: the Triton kernel on CUDA (machinery/kernels/; Krause's
band, TDA, the mix's Krause or TDA branch), beside flash and the flex path in the same run; --pace_step=False times
the attention alone; with --compile=True the attention alone is compiled too.

--mode=generate: decoding with the KV cache (GPT.generate). For each context length T, the ms per
new token of a GPT whose caches hold T tokens, and the MiB those caches hold, for the rule beside
full softmax in the same run:
$ python bench.py --mode=generate --attention=krause --krause_window=32 --pos_emb=rope --n_layer=6 \
      --n_embd=384 --n_head=6 --vocab_size=65 --seq_lens=1024,4096,16384

--mode=pixels: drawing images from a pixel model: `batch_size` images of `subpixels` tokens each
(vocab 256, first subpixel uniform) drawn with GPT.generate and each rule's cache, random weights;
images/s (warm-up left out, synchronised) and the MiB the caches hold at the last subpixel, for the
rule beside full softmax in the same run:
$ python bench.py --mode=pixels --attention=krause --krause_window=256 --krause_topk=192 \
      --n_layer=2 --n_embd=128 --n_head=4 --batch_size=64 --subpixels=3072 --device=cpu
"""
import ctypes
import json
import sys
import time

import torch

from rules import AttentionConfig, build_attention, check_keys_read
from model import GPT, GPTConfig
from prepare import ROOT
from support.checks import (check_device, check_distinct, check_dtype, check_fits, check_int_list, check_or_exit,
                            check_ranges, model_memory, script_settings)
from support.runtime import (DTYPES, check_attention_layers, dataclass_defaults, dataclass_values,
                             note_cpu_recipe, peak_flops, precision)

# -----------------------------------------------------------------------------
mode = 'attention'          # 'attention' (the rule alone), 'model' (a GPT train step), 'pace'
                            # (both, beside flash softmax), 'generate' (decode), 'pixels' (drawing)
seq_lens = '1024,4096,8192'
batch_size = 1              # sequences at once
n_head = 8
n_embd = 512                # 8 heads x 64 dims
n_layer = 12                # model and generate modes
vocab_size = 50304          # generate mode (model mode: always 50304)
decode_tokens = 16          # generate mode: new tokens per timed run
subpixels = 3072            # pixels mode: tokens per image (CIFAR-10 3,072, MNIST 784)
dense = False               # also time the rule's dense reference form, where it has one
backward = True             # forward+backward; flex on CPU is always forward only
repeats = 5
device = 'cuda' if torch.cuda.is_available() else 'cpu'
dtype = 'bfloat16' if torch.cuda.is_available() else 'float32'
compile = False             # model and pace modes: torch.compile the model (CUDA)
profile = False             # pace mode: print each case's top operations (torch.profiler)
kernel = False              # pace mode: also the rule off flex, its Triton kernel on CUDA (triton installed)
pace_step = True            # pace mode: also the whole GPT train step (False: the attention alone)
live_memory = False         # CPU: blocks of 64 KiB and up mapped from the start, so a peak is the live tensors',
                            # not the allocator's reuse (slower: compare times only within such a run)
json_out = False
seed = 1337
globals().update(dataclass_defaults(AttentionConfig, globals()))
sys.argv = ['--json_out=True' if a == '--json' else a.replace('--json=', '--json_out=')
            for a in sys.argv]  # --json reads better
exec(open(ROOT / 'configurator.py').read())
# -----------------------------------------------------------------------------
MODES = ('attention', 'model', 'pace', 'generate', 'pixels')
PACE_CPU_RECIPE = '--mode=pace --seq_lens=256,1024 --n_layer=2 --n_head=4 --n_embd=128'  # its defaults are a GPU's


def check_bench_settings(c):
    """ValueError naming the first bad setting, before anything is built: the device first, then the
    mode and sizes, then the model's and every attention layer's own checks at the sizes the mode
    runs."""
    check_device(c['device'])
    check_dtype(c['dtype'])
    if c['mode'] not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}; got '{c['mode']}': pass e.g. "
                         f"--mode=attention")
    lengths = check_int_list(c, 'seq_lens', '1024,4096')
    check_distinct('seq_lens', lengths)
    check_ranges(c, at_least_one=('batch_size', 'n_head', 'n_embd', 'n_layer', 'vocab_size',
                                  'decode_tokens', 'repeats'))
    if c['subpixels'] < 2:
        raise ValueError(f"subpixels={c['subpixels']} must be at least 2 (a first subpixel, then "
                         f"those drawn); pass e.g. --subpixels=3072 (CIFAR-10) or 784 (MNIST)")
    block = c['subpixels'] - 1 if c['mode'] == 'pixels' else max(lengths)
    names = c['attention'].split(',')
    if len(names) > 1 and c['mode'] != 'attention':
        raise ValueError(f"attention='{c['attention']}': several rules at once is the attention mode's; pass "
                         f"--mode=attention, or one rule")
    for name in names:
        cfg = GPTConfig(**dataclass_values(GPTConfig, c, block_size=block, attention=name))
        check_fits(bench_memory(c, cfg), c['device'], doing=f"the {c['mode']} mode at T={block}")
        check_attention_layers(cfg)


def bench_memory(c, cfg):
    """The parts of what the mode holds at the longest length, at the least: q, k, v and the output with their
    gradients (every mode), the GPT's weights and a train step's activations (model, pace) or its caches (generate,
    pixels)."""
    element = DTYPES[c['dtype']].itemsize if c['device'].startswith('cuda') else 4
    tokens = c['batch_size'] * cfg.block_size
    length = {'subpixels': c['subpixels']} if c['mode'] == 'pixels' else {'seq_lens': c['seq_lens']}
    sizes = {**length, 'batch_size': c['batch_size'], 'n_embd': cfg.n_embd}
    parts = [(8 * tokens * cfg.n_embd * element, "q, k, v and the output", sizes)]
    sizes = {**sizes, 'n_layer': cfg.n_layer}
    if c['mode'] == 'attention':  # every layer is built once by the check, the mode times one
        return [*parts, (4 * cfg.n_layer * 4 * cfg.n_embd ** 2, "the attention layers' weights",
                         {'n_layer': cfg.n_layer, 'n_embd': cfg.n_embd})]
    if c['mode'] in ('model', 'pace'):
        return [*parts, *model_memory(cfg, vocab_size=50304),
                (tokens * cfg.n_layer * 8 * cfg.n_embd * element, "the activations", sizes)]
    vocab_size = c['vocab_size'] if c['mode'] == 'generate' else 256  # pixels: a token per subpixel value
    return [*parts, *model_memory(cfg, vocab_size, trained=False),
            (2 * tokens * cfg.n_layer * cfg.n_embd * element, "the caches' keys and values", sizes)]


check_or_exit(check_bench_settings, script_settings(globals()))
check_or_exit(check_keys_read, script_settings(globals()), overridden, typed, attention.split(','))  # none ignored
note_cpu_recipe('--mode=pace', 'bench.py', PACE_CPU_RECIPE, script_settings(globals()), show=mode == 'pace')
sys.stdout.reconfigure(line_buffering=True)  # each row appears as it is measured, through a pipe too
torch.manual_seed(seed)
ptdtype = DTYPES[dtype]
is_cuda = device.startswith('cuda')
if live_memory and not is_cuda:  # before any tensor: the heap never holds a large freed block for reuse
    ctypes.CDLL('libc.so.6').mallopt(-3, 1 << 16)  # M_MMAP_THRESHOLD = 64 KiB


def attention_config(**overrides):
    return AttentionConfig(**dataclass_values(AttentionConfig, globals(), **overrides))


def rule_name(cfg, with_topk=False):
    """A row's name for the rule of a GPT config: the rule, -mix, its window (and Krause's k)."""
    name = cfg.attention + ('-mix' if cfg.mix else '')
    if cfg.attention == 'krause':
        return name + f" W={cfg.krause_window}" + (f" k={cfg.krause_topk}" if with_topk else '')
    return name + (f" W={cfg.window}" if cfg.window else '')


class PeakMemory:
    """Peak memory above the level at entry, in MiB: the CUDA allocator's peak, or the CPU resident
    set's."""

    def __enter__(self):
        if is_cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start = torch.cuda.memory_allocated()
        else:
            open('/proc/self/clear_refs', 'w').write('5')  # reset the resident-set high-water mark
            self.start = self.status('VmRSS')
        return self

    def __exit__(self, *exc):
        if is_cuda:
            torch.cuda.synchronize()
            self.mib = (torch.cuda.max_memory_allocated() - self.start) / 2**20
        else:
            self.mib = (self.status('VmHWM') - self.start) / 2**20

    @staticmethod
    def status(field):  # bytes
        lines = open('/proc/self/status')
        return next(int(line.split()[1]) * 1024 for line in lines if line.startswith(field))


def milliseconds(fn, warmup=1):
    """Median milliseconds of fn() over `repeats` runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if is_cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if is_cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1000)
    return sorted(times)[len(times) // 2]


def measure(cases, warmup=1, show=None):
    """cases: [(row, fn)]. Times every case with the allocator as training runs it, and the peak
    memory of one run each; show(row, part), where given, prints each row as it is measured. On a
    GPU a case's peak follows its time (part 'whole'). On CPU the peaks are taken last, with large
    blocks going straight back to the OS when freed (so each case starts from a clean level): that
    setting slows allocation and must not touch the times; so each row is shown twice, its time as
    it is measured (part 'time'), then its peak (part 'memory')."""
    for row, fn in cases:
        row['ms'] = milliseconds(fn, warmup)
        if is_cuda:
            row['peak_mib'] = peak_mib(fn)
        if show:
            show(row, 'whole' if is_cuda else 'time')
    if is_cuda:
        return [row for row, _ in cases]
    libc = ctypes.CDLL('libc.so.6')
    libc.mallopt(-3, 1 << 16)  # M_MMAP_THRESHOLD = 64 KiB
    if show and not json_out:
        print("peak memory, a run of each case after all the times (on a CPU, measuring it slows allocation):")
    for row, fn in cases:
        libc.malloc_trim(0)  # the heap's free pages back to the OS: they would hide this peak
        row['peak_mib'] = peak_mib(fn)
        if show:
            show(row, 'memory')
    return [row for row, _ in cases]


def peak_mib(fn):
    """The peak memory of one run of fn above the level at its start (PeakMemory), in MiB."""
    with PeakMemory() as mem:
        fn()
    return mem.mib


def attention_case(module, attend, T):
    """A closure running attend forward (and backward) on fresh random per-head tensors from
    module.project."""
    run_backward = backward and not (attend == module.attend_flex and not is_cuda)
    with torch.no_grad():
        x = torch.randn(batch_size, T, n_embd, device=device, dtype=ptdtype)
        inputs = [t.detach().contiguous().requires_grad_(run_backward) for t in module.project(x)]
    grad = None

    def step():
        nonlocal grad
        with torch.set_grad_enabled(run_backward):
            y = attend(*inputs)
            if run_backward:
                grad = torch.randn_like(y) if grad is None else grad
                y.backward(grad)
                for t in inputs:
                    t.grad = None
    return step


def report(row, part='whole'):
    """Print a row (measure's parts): whole; or on a CPU its time as it is measured, then its peak
    memory after every time (JSON: the whole row, then)."""
    if json_out:
        if part != 'time':
            print(json.dumps(row))
        return
    name = f"{row['attention']:>10s} {row['path']:>6s} T={row['T']:<6d}"
    if part == 'memory':
        print(f"{name} {'':12s} {row['peak_mib']:9.1f} MiB")  # in the MiB column of a whole row
        return
    extra = f"  x{row['vs_softmax']:.3f} softmax" if row.get('vs_softmax') is not None else ''
    extra += f"  {row['tokens_per_s']:,.0f} tok/s" if 'tokens_per_s' in row else ''
    extra += f"  mfu {row['mfu'] * 100:.1f}%" if row.get('mfu') else ''
    memory = f" {row['peak_mib']:9.1f} MiB" if part == 'whole' else ''
    print(f"{name} {row['ms']:9.2f} ms{memory}{extra}")


def bench_attention():
    """Per length, causal softmax SDPA once, then each rule of `attention` (a comma list: each alone beside
    softmax, all in one run) on the path forward takes."""
    cases = []
    for T in [int(s) for s in str(seq_lens).split(',')]:
        softmax = attention_config(attention='softmax', window=0, mix=False, mix_matched=False, flex=False,
                                   causal=True, block_size=T)
        baseline = build_attention(softmax, 0).to(device, ptdtype)
        cases.append((dict(attention='softmax', path='sdpa', T=T, device=device),
                      attention_case(baseline, baseline.path(device), T)))  # SDPA, as forward
        for name in attention.split(','):
            module = build_attention(attention_config(attention=name, block_size=T), 0).to(device, ptdtype)
            # flex=True: the flex path here too (forward only on the CPU); else what forward runs
            paths = [('flex', module.attend_flex) if flex else (module.path_name(device), module.path(device))]
            if dense and hasattr(module, 'attend_reference'):
                paths.append(('dense', module.attend_reference))
            for path, attend in paths:
                row = dict(attention=name, path=path, T=T, device=device,
                           backward=backward and (path != 'flex' or is_cuda))
                cases.append((row, attention_case(module, attend, T)))
    base_ms = {}  # softmax's ms at each length: its case comes first

    def show(row, part):
        base_ms.setdefault(row['T'], row['ms'])
        report({**row, 'vs_softmax': row['ms'] / base_ms[row['T']]}, part)
    measure(cases, show=show)


def model_case(T, **overrides):
    """(model, step): a GPT of the settings (and overrides) for T tokens, and a closure running one
    train step."""
    cfg = dataclass_values(GPTConfig, globals(), block_size=T, vocab_size=50304, **overrides)
    model = GPT(GPTConfig(**cfg)).to(device)
    optimizer = model.configure_optimizers(0.1, 1e-4, (0.9, 0.95), 'cuda' if is_cuda else 'cpu')
    step_model = torch.compile(model) if compile and is_cuda else model
    ctx = precision(device, dtype)[2]
    idx = torch.randint(50257, (batch_size, T + 1), device=device)

    def step():
        with ctx:
            _, loss = step_model(idx[:, :-1], idx[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model, step


def bench_model():
    cases, models = [], {}
    for T in [int(s) for s in str(seq_lens).split(',')]:
        model, step = model_case(T)
        cases.append((dict(attention=attention, path='model', T=T, device=device), step))
        models[T] = model
    peak = peak_flops(device)

    def show(row, part):
        mfu = models[row['T']].estimate_mfu(batch_size, row['ms'] / 1000, peak) if peak else None
        tokens_per_s = batch_size * row['T'] / row['ms'] * 1000
        report({**row, 'vs_softmax': None, 'tokens_per_s': tokens_per_s, 'mfu': mfu}, part)
    measure(cases, warmup=2, show=show)


def bench_pace():
    """Per length: flash softmax and the rule (its flex path with flex=True; off flex with kernel=True, its fused path:
    the Triton kernel on CUDA), attention alone and the whole model, in one run; ratios to softmax, each row printed
    as it is measured."""
    softmax = dict(attention='softmax', window=0, mix=False, mix_matched=False, flex=False)
    name = attention + ('-mix' if mix else '')
    paths = [('softmax sdpa', softmax)]  # (label, config overrides)
    if flex and is_cuda:
        paths.append((name + ' flex', {}))
    if kernel or not (flex and is_cuda):
        paths.append((name + (' kernel' if kernel else ''), dict(flex=False)))
    for T in [int(s) for s in str(seq_lens).split(',')]:
        cases, base = [], {}
        for label, overrides in paths:
            config = attention_config(block_size=T, causal=True, **overrides)
            module = build_attention(config, 0).to(device, ptdtype)
            attend = module.path(device)
            kinds = [('attend', lambda: attention_case(module, compiled(attend), T))]
            if pace_step:
                kinds.append(('model', lambda: model_case(T, **overrides)[1]))
            for kind, make in kinds:
                case = (dict(attention=label, path=kind, T=T, device=device), make())
                row, = measure([case], warmup=2)
                base.setdefault(kind, row['ms'])  # softmax's row of this kind: the first
                row = {**row, 'vs_softmax': row['ms'] / base[kind]}
                if kind == 'model':
                    row['tokens_per_s'] = batch_size * T / row['ms'] * 1000
                report(row)
                cases.append(case)
        if profile:
            for row, fn in cases:
                print_profile(f"{row['attention']} {row['path']} T={T}", fn)


def compiled(fn):  # with compile on CUDA, the attention alone compiled as in the model (its norms fused)
    return torch.compile(fn) if compile and is_cuda else fn


def print_profile(title, fn):
    """The top operations of one run of fn by their own time (CUDA kernels on a GPU): where a path's
    time goes."""
    from torch.profiler import ProfilerActivity, profile as profiler
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if is_cuda else [])
    with profiler(activities=activities) as prof:
        fn()
        if is_cuda:
            torch.cuda.synchronize()
    print(f"\n{title}\n" + prof.key_averages().table(
        sort_by='self_cuda_time_total' if is_cuda else 'self_cpu_time_total', row_limit=10))


@torch.no_grad()
def bench_generate():
    rules = [dict(attention='softmax', window=0, mix=False, mix_matched=False)]  # softmax beside the rule
    if attention != 'softmax' or window or mix:
        rules.append({})
    lengths = [int(s) for s in str(seq_lens).split(',')]
    # every position a run reaches: the longest context, then decode_tokens per timed run (warm-up
    # included), so that learned position embeddings (which stop at block_size) cover them
    longest = max(lengths) + (1 + repeats) * decode_tokens
    for T in lengths:
        rows = []
        for overrides in rules:
            torch.manual_seed(seed)
            cfg = GPTConfig(**dataclass_values(GPTConfig, globals(), vocab_size=vocab_size,
                                               dropout=0.0, block_size=max(block_size, longest),
                                               **overrides))
            model = GPT(cfg).to(device, ptdtype).eval()
            # random activations: a real prefill of 16k tokens with full softmax would take minutes
            # on a CPU
            x = torch.randn(batch_size, T, model.config.n_embd, device=device, dtype=ptdtype)
            cache = model.filled_cache(x)
            token = torch.zeros(batch_size, 1, dtype=torch.long, device=device)

            def step():
                for _ in range(decode_tokens):
                    model(token, cache=cache)
            ms = milliseconds(step, warmup=1) / decode_tokens
            rows.append(dict(attention=rule_name(cfg), path='decode', T=T, device=device, ms=ms,
                             peak_mib=cache.nbytes() / 2**20, tokens_per_s=batch_size * 1000 / ms))
            del model, cache
        for row in rows:  # peak_mib: what the caches hold after the run
            report({**row, 'vs_softmax': row['ms'] / rows[0]['ms']})


@torch.no_grad()
def bench_pixels():
    from support.pixels import cache_mib, timed_draw
    rules = [dict(attention='softmax', window=0, mix=False, mix_matched=False)]  # softmax beside the rule
    if attention != 'softmax' or window or mix:
        rules.append({})
    rows = []
    for overrides in rules:
        torch.manual_seed(seed)
        cfg = GPTConfig(**dataclass_values(GPTConfig, globals(), vocab_size=256, dropout=0.0,
                                           block_size=subpixels - 1, **overrides))
        model = GPT(cfg).to(device, ptdtype).eval()
        with precision(device, dtype)[2]:
            _, images_per_s, seconds = timed_draw(model, batch_size, batch_size, subpixels,
                                                  temperature=1.0)
        rows.append(dict(attention=rule_name(cfg, with_topk=True), path='pixels', T=subpixels,
                         batch_size=batch_size, device=device, dtype=dtype, ms=seconds * 1000,
                         images_per_s=images_per_s,
                         peak_mib=cache_mib(model, batch_size, subpixels - 1)))
        del model
    for row in rows:  # peak_mib: what the caches hold at the last subpixel
        row['vs_softmax'] = row['images_per_s'] / rows[0]['images_per_s']
        if json_out:
            print(json.dumps(row))
        else:
            print(f"{row['attention']:>18s} T={row['T']} batch {row['batch_size']}: "
                  f"{row['images_per_s']:8.3f} images/s ({row['ms'] / 1000:.1f} s)  "
                  f"x{row['vs_softmax']:.2f} softmax's images/s  cache {row['peak_mib']:.1f} MiB")


{'attention': bench_attention, 'model': bench_model, 'pace': bench_pace, 'generate': bench_generate,
 'pixels': bench_pixels}[mode]()
