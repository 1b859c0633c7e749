"""
Krause attention on the causal band as Triton kernels: per query i the W keys i-W < j <= i, score_ij = σ⁻²(q_i·k_j)
- σ⁻²‖k_j‖²/2 (σ per head), each row's top k kept by the boundary halfway between its k-th and (k+1)-th score (a tie
at the k-th keeps all of it; a row reaching k keys or fewer keeps them all), a softmax over the kept keys, y = Σ w
v. Forward: one program per block of BLOCK_M queries holds the band's scores in registers, as two tiles (the LEFT
keys before the block, the block's own keys on the diagonal), each score as its order key (the uint32 that sorts as
the float does), and finds each row's k-th by a radix search on the keys: 3 bits a pass, seven counts packed in one
sum, from the highest bit where the row's least and largest keys differ, ending a row as soon as a threshold has
exactly k keys at or above it (about 5 passes for a program's slowest row at W = 256, k = 192; exact: integers, ties
whole), nothing sorted and no score written to memory. It saves each row's boundary and log-sum-exp. Backward
recomputes the scores flash-style from them (one kernel per query block for dq and each row's dy·y, then one per key
block for dk, dv and σ's gradient), with no temporary the size of q; the boundary carries no gradient, as in the math
path. Tile shapes per dtype (`tiles`): float32's dot runs on FMA units and holds more registers, so its tiles are
smaller; at every shape the benchmarks and tests build, no kernel spills (tests/kernel_builds.py).
"""
import torch

from machinery.band import cdiv
from machinery.kernels.triton_available import bh_t_strides, dot_precision, jit, load_rows, tl, triton, unit_last_stride

DIGITS = tl.constexpr(8)  # the selection's radix: 3 bits a pass, 7 counts packed in one int64 sum
MAX_WINDOW = 511  # a count packed in 9 bits: the keys a row reaches


@jit
def band_scores(q, k, inv_var, PRECISION: tl.constexpr):  # σ⁻²(q·k) - σ⁻²‖k‖²/2, (M, N) float32
    k32 = k.to(tl.float32)
    key_bias = (-0.5 * tl.sum(k32 * k32, 1)) * inv_var
    return tl.dot(q, tl.trans(k), input_precision=PRECISION) * inv_var + key_bias[None, :]


@jit
def in_window(rows, cols, W):  # (M, N): key j within query i's window, i - W < j <= i, and in the sequence
    return (cols[None, :] <= rows[:, None]) & (cols[None, :] > rows[:, None] - W) & (cols[None, :] >= 0)


@jit
def order_key(a):  # float32 -> uint32 in the same order (-inf above 0, so 0 can stand for "unreached")
    bits = a.to(tl.uint32, bitcast=True)
    return tl.where((bits >> 31) != 0, bits ^ 0xFFFFFFFF, bits | 0x80000000)


@jit
def from_order_key(key):  # order_key's inverse
    return tl.where((key >> 31) != 0, key & 0x7FFFFFFF, key ^ 0xFFFFFFFF).to(tl.float32, bitcast=True)


@jit
def tile_keys(a, reach):  # (M, N) uint32: each reached score's order key, 0 where unreached
    return tl.where(reach, order_key(a), 0)


@jit
def digit_counts(keys, lo, shift):
    """(M,) uint64: for each row, how many keys fall in digits 1..7 of (key - lo) >> shift (keys below lo in digit 0,
    keys past the last digit in digit 7), packed 9 bits a digit (a row reaches at most MAX_WINDOW keys): the seven
    counts in one sum."""
    digit = tl.minimum((tl.maximum(keys, lo[:, None]) - lo[:, None]) >> shift[:, None], DIGITS - 1)
    one = tl.full(keys.shape, 1, tl.uint64)
    return tl.sum((one << (9 * digit).to(tl.uint64)) >> 9, 1)  # digit 0 adds nothing, digit 7 2^54


@jit
def count_at_least(keys_left, keys_diag, t):  # (M,) how many of a row's keys are >= t (unreached keys are 0)
    return tl.sum((keys_left >= t[:, None]).to(tl.int32), 1) + tl.sum((keys_diag >= t[:, None]).to(tl.int32), 1)


@jit
def narrow(keys_left, keys_diag, lo, shift, t, active, TOPK):
    """One pass of the radix search for rows still active: the keys counted by their digit of (key - lo) >> shift,
    all 7 counts in one sum; the thresholds lo + j·2^shift then give count(>= threshold) for j = 1..7, and the largest
    j with count >= k holds the k-th key (count(>= lo) >= k holds throughout). A row ends when that count is exactly
    k (t: its threshold) or the digit is one key wide (t: the k-th key itself, a tie kept whole); else lo moves to
    that threshold and the digit narrows by 3 bits."""
    packed = digit_counts(keys_left, lo, shift) + digit_counts(keys_diag, lo, shift)
    above, digit, count = tl.zeros_like(shift), tl.zeros_like(shift), tl.zeros_like(shift)
    for j in tl.static_range(DIGITS - 1, 0, -1):  # count(>= lo + j·2^shift) from the top digit down
        above += ((packed >> (9 * (j - 1))) & 511).to(tl.int32)
        first = (above >= TOPK) & (digit == 0)
        digit, count = tl.where(first, j, digit), tl.where(first, above, count)
    threshold = lo + (digit.to(tl.uint32) << shift)
    ends = active & (((digit > 0) & (count == TOPK)) | (shift == 0))
    t = tl.where(ends, threshold, t)
    return tl.where(active, threshold, lo), tl.maximum(shift - 3, 0), t, active & ~ends


@jit
def kept_exp(keys, boundary, row_max):  # (M, N) exp(s - row max) where s is reached and >= its row's boundary, else 0
    s = from_order_key(keys)
    return tl.where((keys > 0) & (s >= boundary[:, None]), tl.exp(s - row_max[:, None]), 0.0)


@jit
def key_bits(span):  # (M,) at least the bit length of each uint32 span > 0 (its float's exponent: rounding only adds)
    return ((span.to(tl.float32).to(tl.uint32, bitcast=True) >> 23).to(tl.int32) - 126)


@jit
def band_boundaries(keys_left, keys_diag, TOPK):
    """Each row's boundary (M,) from its scores' order keys (0 where unreached): halfway between its k-th and (k+1)-th
    largest reached score, as the math path's topk_boundary; -inf where a row reaches k keys or fewer. Any t with
    exactly k keys >= t keeps the same scores, so a radix search on the keys between the row's least and largest
    (`narrow`: 3 bits a pass, from the highest bit where they differ) stops at such a t or at the k-th key: at W =
    256, k = 192 about 5 passes for a program's slowest row where a bisection on the values takes 11, exact (integers:
    no rounding). Then the k-th and (k+1)-th themselves, and their mean."""
    reached = tl.sum((keys_left > 0).to(tl.int32), 1) + tl.sum((keys_diag > 0).to(tl.int32), 1)
    hi = tl.maximum(tl.max(keys_left, 1), tl.max(keys_diag, 1))
    lo = tl.minimum(tl.min(tl.where(keys_left > 0, keys_left, 0xFFFFFFFF), 1),
                    tl.min(tl.where(keys_diag > 0, keys_diag, 0xFFFFFFFF), 1))
    active = (reached > TOPK) & (count_at_least(keys_left, keys_diag, hi) < TOPK)  # else the k-th is the largest
    shift = tl.where(active, tl.maximum(key_bits(hi - lo) - 3, 0), 0)  # (hi - lo) >> shift < 8: one pass's digits
    t = hi  # a key with exactly k keys at or above it, or the k-th itself, once found
    while tl.max(active.to(tl.int32), 0) > 0:
        lo, shift, t, active = narrow(keys_left, keys_diag, lo, shift, t, active, TOPK)
    kth = tl.minimum(tl.min(tl.where(keys_left >= t[:, None], keys_left, 0xFFFFFFFF), 1),
                     tl.min(tl.where(keys_diag >= t[:, None], keys_diag, 0xFFFFFFFF), 1))  # the least key >= t
    below = tl.maximum(tl.max(tl.where(keys_left < kth[:, None], keys_left, 0), 1),
                       tl.max(tl.where(keys_diag < kth[:, None], keys_diag, 0), 1))
    following = tl.where(count_at_least(keys_left, keys_diag, kth) > TOPK, kth, below)  # the (k+1)-th
    return tl.where(reached > TOPK, (from_order_key(kth) + from_order_key(following)) * 0.5, float('-inf'))


@jit
def krause_forward_kernel(Q, K, V, INV_VAR, Y, LSE, BOUNDARY,
                          sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, syb, syh, syt, H, T, D, W, TOPK,
                          PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, LEFT: tl.constexpr, BLOCK_D: tl.constexpr):
    m, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    Q, K, V = Q + b * sqb + h * sqh, K + b * skb + h * skh, V + b * svb + h * svh
    inv_var = tl.load(INV_VAR + h)
    rows = m * BLOCK_M + tl.arange(0, BLOCK_M)
    left = m * BLOCK_M - LEFT + tl.arange(0, LEFT)  # the keys before the block a row may reach (LEFT >= W - 1)
    dims = tl.arange(0, BLOCK_D)
    q = load_rows(Q, sqt, rows, dims, T, D)
    k_left, k_diag = load_rows(K, skt, left, dims, T, D), load_rows(K, skt, rows, dims, T, D)
    # the band's scores held as order keys alone (0 outside the window) through the selection: half the registers
    keys_left = tile_keys(band_scores(q, k_left, inv_var, PRECISION), in_window(rows, left, W))
    keys_diag = tile_keys(band_scores(q, k_diag, inv_var, PRECISION), in_window(rows, rows, W))
    boundary = band_boundaries(keys_left, keys_diag, TOPK)
    row_max = from_order_key(tl.maximum(tl.max(keys_left, 1), tl.max(keys_diag, 1)))  # the largest is always kept
    p_left, p_diag = kept_exp(keys_left, boundary, row_max), kept_exp(keys_diag, boundary, row_max)
    total = tl.sum(p_left, 1) + tl.sum(p_diag, 1)
    v_left, v_diag = load_rows(V, svt, left, dims, T, D), load_rows(V, svt, rows, dims, T, D)
    acc = tl.dot(p_left.to(v_left.dtype), v_left, input_precision=PRECISION)
    acc += tl.dot(p_diag.to(v_diag.dtype), v_diag, input_precision=PRECISION)
    Y = Y + b * syb + h * syh
    tl.store(Y + rows[:, None] * syt + dims[None, :], acc / total[:, None], mask=(rows[:, None] < T) & (dims[None, :] < D))
    tl.store(LSE + bh * T + rows, row_max + tl.log(total), mask=rows < T)
    tl.store(BOUNDARY + bh * T + rows, boundary, mask=rows < T)


@jit
def kept_weights(q, k, inv_var, rows, cols, lse, boundary, T, W, PRECISION: tl.constexpr):
    """The recomputed scores and softmax weights of a (queries, keys) tile from the saved boundaries and lse."""
    s = band_scores(q, k, inv_var, PRECISION)
    kept = in_window(rows, cols, W) & (rows[:, None] < T) & (s >= boundary[:, None])
    return s, tl.where(kept, tl.exp(s - lse[:, None]), 0.0)


@jit
def krause_backward_keys_kernel(Q, K, V, INV_VAR, DY, LSE, BOUNDARY, DELTA, DK, DV, DLOG_SIGMA,
                                sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdyb, sdyh, sdyt, H, T, D, W,
                                PRECISION: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr,
                                BLOCK_D: tl.constexpr):
    """One key block: dv_j = Σ_i w_ij dy_i, dk_j = σ⁻² Σ_i ds_ij (q_i - k_j) (ds the scores' gradient), and
    key j's share of d log σ = -2 Σ_ij ds_ij s_ij. Queries j .. j + W - 1 reach key j."""
    n, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    Q, K, V, DY = Q + b * sqb + h * sqh, K + b * skb + h * skh, V + b * svb + h * svh, DY + b * sdyb + h * sdyh
    inv_var = tl.load(INV_VAR + h)
    cols = n * BLOCK_N + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    k, v = load_rows(K, skt, cols, dims, T, D), load_rows(V, svt, cols, dims, T, D)
    dk = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    ds_sum = tl.zeros((BLOCK_N,), dtype=tl.float32)
    ds_score = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for start in range(n * BLOCK_N, n * BLOCK_N + BLOCK_N + W - 1, STEP):
        rows = start + tl.arange(0, STEP)
        q, dy = load_rows(Q, sqt, rows, dims, T, D), load_rows(DY, sdyt, rows, dims, T, D)
        lse = tl.load(LSE + bh * T + rows, mask=rows < T, other=0.0)
        boundary = tl.load(BOUNDARY + bh * T + rows, mask=rows < T, other=0.0)
        delta = tl.load(DELTA + bh * T + rows, mask=rows < T, other=0.0)
        s, p = kept_weights(q, k, inv_var, rows, cols, lse, boundary, T, W, PRECISION)
        dv += tl.dot(tl.trans(p).to(dy.dtype), dy, input_precision=PRECISION)
        ds = p * (tl.dot(dy, tl.trans(v), input_precision=PRECISION) - delta[:, None])
        dk += tl.dot(tl.trans(ds).to(q.dtype), q, input_precision=PRECISION)
        ds_sum += tl.sum(ds, 0)
        ds_score += tl.sum(ds * s, 0)
    dk = inv_var * (dk - ds_sum[:, None] * k.to(tl.float32))
    out, mask = bh * T * D + cols[:, None] * D + dims[None, :], (cols[:, None] < T) & (dims[None, :] < D)
    tl.store(DK + out, dk, mask=mask)
    tl.store(DV + out, dv, mask=mask)
    tl.store(DLOG_SIGMA + bh * T + cols, -2.0 * ds_score, mask=cols < T)


@jit
def krause_backward_queries_kernel(Q, K, V, INV_VAR, DY, LSE, BOUNDARY, DELTA, DQ, Y,
                                   sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdyb, sdyh, sdyt, H, T, D, W, syt,
                                   PRECISION: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr,
                                   BLOCK_D: tl.constexpr):
    """One query block: δ_i = dy_i·y_i (= Σ_j w_ij dy_i·v_j), stored for the keys' kernel, which runs after; and
    dq_i = σ⁻² Σ_j ds_ij k_j over the keys i - W < j <= i."""
    m, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    Q, K, V, DY = Q + b * sqb + h * sqh, K + b * skb + h * skh, V + b * svb + h * svh, DY + b * sdyb + h * sdyh
    inv_var = tl.load(INV_VAR + h)
    rows = m * BLOCK_N + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    q, dy = load_rows(Q, sqt, rows, dims, T, D), load_rows(DY, sdyt, rows, dims, T, D)
    lse = tl.load(LSE + bh * T + rows, mask=rows < T, other=0.0)
    boundary = tl.load(BOUNDARY + bh * T + rows, mask=rows < T, other=0.0)
    y = load_rows(Y + bh * T * D, syt, rows, dims, T, D)  # y is contiguous, (B, H, T, D)
    delta = tl.sum(dy.to(tl.float32) * y.to(tl.float32), 1)
    tl.store(DELTA + bh * T + rows, delta, mask=rows < T)
    dq = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    first = (tl.maximum(m * BLOCK_N - W + 1, 0) // STEP) * STEP  # the step of the first key row 0 reaches
    for start in range(first, (m + 1) * BLOCK_N, STEP):
        cols = start + tl.arange(0, STEP)
        k, v = load_rows(K, skt, cols, dims, T, D), load_rows(V, svt, cols, dims, T, D)
        _, p = kept_weights(q, k, inv_var, rows, cols, lse, boundary, T, W, PRECISION)
        ds = p * (tl.dot(dy, tl.trans(v), input_precision=PRECISION) - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    tl.store(DQ + bh * T * D + rows[:, None] * D + dims[None, :], inv_var * dq,
             mask=(rows[:, None] < T) & (dims[None, :] < D))


def tiles(W, D, dtype):
    """The launch shapes, forward (queries per program, keys before them, warps) and backward (rows per program, the
    other side's rows per step, warps): the left tile holds the W - 1 keys before a block's first query (a power of
    two, at least 16 for tl.dot); narrower query blocks where it is wide, smaller steps and more threads for float32
    (its dots on FMA units) and wide heads, each chosen so that no kernel spills registers and, in bfloat16, two
    blocks fit an SM (tests/kernel_builds.py; float32 at W = 256 spills all the same)."""
    left, wide = max(16, triton.next_power_of_2(max(W - 1, 1))), dtype == torch.float32
    forward = (32, left, 8) if wide or D > 64 else (32, left, 4) if left > 64 else (64, left, 4)
    return forward, (64, 16 if wide else 32, 8 if wide or D > 64 else 4)


class KrauseBandKernel(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q, k, v, log_sigma, W, topk):
        q, k, v = unit_last_stride(q), unit_last_stride(k), unit_last_stride(v)
        B, H, T, D = q.shape
        inv_var = torch.exp(-2 * log_sigma.detach().float()).contiguous()  # σ⁻² per head, as the rule computes it
        y = torch.empty(B, H, T, D, dtype=v.dtype, device=v.device)
        lse = torch.empty(B * H, T, dtype=torch.float32, device=v.device)
        boundary = torch.empty_like(lse)
        (block_m, left, warps), ctx.backward_tiles = tiles(W, D, v.dtype)
        krause_forward_kernel[(cdiv(T, block_m), B * H)](
            q, k, v, inv_var, y, lse, boundary, *bh_t_strides(q), *bh_t_strides(k), *bh_t_strides(v),
            *bh_t_strides(y), H, T, D, W, topk, PRECISION=dot_precision(v.dtype), BLOCK_M=block_m, LEFT=left,
            BLOCK_D=max(16, triton.next_power_of_2(D)), num_warps=warps)
        ctx.save_for_backward(q, k, v, inv_var, y, lse, boundary)
        ctx.W, ctx.sigma_dtype = W, log_sigma.dtype
        return y

    @staticmethod
    def backward(ctx, dy):
        q, k, v, inv_var, y, lse, boundary = ctx.saved_tensors
        dy = unit_last_stride(dy)
        B, H, T, D = q.shape
        delta = torch.empty(B * H, T, dtype=torch.float32, device=q.device)  # written by the queries' kernel
        dq, dk, dv = (torch.empty(B, H, T, D, dtype=t.dtype, device=t.device) for t in (q, k, v))
        dlog_sigma = torch.empty(B * H, T, dtype=torch.float32, device=q.device)
        common = (*bh_t_strides(q), *bh_t_strides(k), *bh_t_strides(v), *bh_t_strides(dy), H, T, D, ctx.W)
        block_n, step, warps = ctx.backward_tiles
        flags = dict(PRECISION=dot_precision(v.dtype), BLOCK_N=block_n, STEP=step,
                     BLOCK_D=max(16, triton.next_power_of_2(D)), num_warps=warps)
        grid = (cdiv(T, block_n), B * H)
        krause_backward_queries_kernel[grid](q, k, v, inv_var, dy, lse, boundary, delta, dq, y, *common, y.stride(2),
                                             **flags)
        krause_backward_keys_kernel[grid](q, k, v, inv_var, dy, lse, boundary, delta, dk, dv, dlog_sigma,
                                          *common, **flags)
        return dq, dk, dv, dlog_sigma.view(B, H, T).sum((0, 2)).to(ctx.sigma_dtype), None, None


def krause_band_attention(q, k, v, log_sigma, window, topk):
    """Krause's causal band, (B, H, T, D): q, k, v (B, H, T, D), log_sigma (H,) (σ per head), the window W and the
    keys kept per row k (1 <= k). Gradients of q, k, v and log_sigma."""
    if window > MAX_WINDOW:
        raise ValueError(f"the Krause kernel takes a window of at most {MAX_WINDOW} keys, got {window}")
    return KrauseBandKernel.apply(q, k.to(q.dtype), v.to(q.dtype), log_sigma, min(window, q.size(2)), topk)
