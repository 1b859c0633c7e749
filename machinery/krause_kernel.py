"""
Krause attention on the causal band as Triton kernels: per query i the W keys i-W < j <= i, score_ij = σ⁻²(q_i·k_j)
- σ⁻²‖k_j‖²/2 (σ per head), each row's top k kept by the boundary halfway between its k-th and (k+1)-th score (a tie
at the k-th keeps all of it; a row reaching k keys or fewer keeps them all), a softmax over the kept keys, y = Σ w
v. Forward: one program per block of BLOCK_M queries holds the band's scores in registers, as two tiles (the LEFT
keys before the block, the block's own keys on the diagonal), and finds each row's k-th score by a bisection on the
scores' values that ends a row as soon as exactly k scores lie at or above its midpoint (about log2(W) counting
passes; exact: a tie at the k-th runs on to adjacent floats), nothing sorted and no score written to memory. It
saves each row's boundary and log-sum-exp. Backward recomputes the scores flash-style from them (one kernel per
query block for dq and each row's dy·y, then one per key block for dk, dv and σ's gradient), with no temporary the
size of q; the boundary carries no gradient, as in the math path.
"""
import torch

from machinery.band import cdiv
from machinery.triton_available import bh_t_strides, dot_precision, jit, load_rows, tl, triton, unit_last_stride

BLOCK_N = 64  # backward: keys per program (and queries per step of it)


@jit
def band_scores(q, k, inv_var, PRECISION: tl.constexpr):  # σ⁻²(q·k) - σ⁻²‖k‖²/2, (M, N) float32
    k32 = k.to(tl.float32)
    key_bias = (-0.5 * tl.sum(k32 * k32, 1)) * inv_var
    return tl.dot(q, tl.trans(k), input_precision=PRECISION) * inv_var + key_bias[None, :]


@jit
def in_window(rows, cols, W):  # (M, N): key j within query i's window, i - W < j <= i, and in the sequence
    return (cols[None, :] <= rows[:, None]) & (cols[None, :] > rows[:, None] - W) & (cols[None, :] >= 0)


@jit
def count_at_least(a_left, a_diag, t):  # per row: how many reached scores are >= t (M,); unreached are -inf
    return tl.sum((a_left >= t[:, None]).to(tl.int32), 1) + tl.sum((a_diag >= t[:, None]).to(tl.int32), 1)


@jit
def tiles_max(a_left, a_diag):  # (M,) the largest of a row's two tiles
    return tl.maximum(tl.max(a_left, 1), tl.max(a_diag, 1))


@jit
def topk_boundary(s_left, reach_left, s_diag, reach_diag, TOPK):
    """Each row's boundary (M,): halfway between its k-th and (k+1)-th largest reached score, as the math path's
    topk_boundary; -inf where a row reaches k keys or fewer. Any t with exactly k scores >= t keeps the same keys, so
    a bisection on the scores' values between the row's least and largest (count(>= lo) >= k > count(>= hi)) ends a
    row as soon as count(>= mid) == k, or when no float lies between lo and hi (then the k-th is lo, and a tie at
    it keeps all of it): about log2(W) counting passes, exact. Then the k-th and (k+1)-th themselves, and their
    mean."""
    a_left, a_diag = tl.where(reach_left, s_left, float('-inf')), tl.where(reach_diag, s_diag, float('-inf'))
    reached = tl.sum(reach_left.to(tl.int32), 1) + tl.sum(reach_diag.to(tl.int32), 1)
    hi = tiles_max(a_left, a_diag)
    lo = -tiles_max(tl.where(reach_left, -s_left, float('-inf')), tl.where(reach_diag, -s_diag, float('-inf')))
    active = (reached > TOPK) & (count_at_least(a_left, a_diag, hi) < TOPK)  # else the k-th is the largest
    t = tl.where(active, lo, hi)  # a threshold with exactly k scores at or above it, once found
    while tl.max(active.to(tl.int32), 0) > 0:
        mid = lo + (hi - lo) * 0.5
        inside = active & (mid > lo) & (mid < hi)
        count = count_at_least(a_left, a_diag, mid)
        lo = tl.where(inside & (count >= TOPK), mid, lo)
        hi = tl.where(inside & (count < TOPK), mid, hi)
        t = tl.where(inside & (count == TOPK), mid, tl.where(active & ~inside, lo, t))
        active = inside & (count != TOPK)
    kth = -tiles_max(tl.where(a_left >= t[:, None], -a_left, float('-inf')),
                   tl.where(a_diag >= t[:, None], -a_diag, float('-inf')))  # the least score >= t
    below = tiles_max(tl.where(a_left < kth[:, None], a_left, float('-inf')),
                    tl.where(a_diag < kth[:, None], a_diag, float('-inf')))
    following = tl.where(count_at_least(a_left, a_diag, kth) > TOPK, kth, below)  # the (k+1)-th
    return tl.where(reached > TOPK, (kth + following) * 0.5, float('-inf'))


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
    s_left, s_diag = band_scores(q, k_left, inv_var, PRECISION), band_scores(q, k_diag, inv_var, PRECISION)
    reach_left, reach_diag = in_window(rows, left, W), in_window(rows, rows, W)
    boundary = topk_boundary(s_left, reach_left, s_diag, reach_diag, TOPK)
    row_max = tl.maximum(tl.max(tl.where(reach_left, s_left, float('-inf')), 1),
                         tl.max(tl.where(reach_diag, s_diag, float('-inf')), 1))  # the largest is always kept
    p_left = tl.where(reach_left & (s_left >= boundary[:, None]), tl.exp(s_left - row_max[:, None]), 0.0)
    p_diag = tl.where(reach_diag & (s_diag >= boundary[:, None]), tl.exp(s_diag - row_max[:, None]), 0.0)
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
                                PRECISION: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
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
    for start in range(n * BLOCK_N, n * BLOCK_N + BLOCK_N + W - 1, BLOCK_N):
        rows = start + tl.arange(0, BLOCK_N)
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
                                   PRECISION: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
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
    first = (tl.maximum(m * BLOCK_N - W + 1, 0) // BLOCK_N) * BLOCK_N  # the block of the first key row 0 reaches
    for start in range(first, (m + 1) * BLOCK_N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        k, v = load_rows(K, skt, cols, dims, T, D), load_rows(V, svt, cols, dims, T, D)
        _, p = kept_weights(q, k, inv_var, rows, cols, lse, boundary, T, W, PRECISION)
        ds = p * (tl.dot(dy, tl.trans(v), input_precision=PRECISION) - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    tl.store(DQ + bh * T * D + rows[:, None] * D + dims[None, :], inv_var * dq,
             mask=(rows[:, None] < T) & (dims[None, :] < D))


def forward_blocks(W):
    """(queries per program, keys before them, warps): the left tile holds the W - 1 keys before a block's first
    query (a power of two, at least 16 for tl.dot); narrower query blocks where it is wide, to keep the registers."""
    left = max(16, triton.next_power_of_2(max(W - 1, 1)))
    return (64, left, 4) if left <= 64 else (32, left, 8)


class KrauseBandKernel(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q, k, v, log_sigma, W, topk):
        q, k, v = unit_last_stride(q), unit_last_stride(k), unit_last_stride(v)
        B, H, T, D = q.shape
        inv_var = torch.exp(-2 * log_sigma.detach().float()).contiguous()  # σ⁻² per head, as the rule computes it
        y = torch.empty(B, H, T, D, dtype=v.dtype, device=v.device)
        lse = torch.empty(B * H, T, dtype=torch.float32, device=v.device)
        boundary = torch.empty_like(lse)
        block_m, left, warps = forward_blocks(W)
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
        flags = dict(PRECISION=dot_precision(v.dtype), BLOCK_N=BLOCK_N, BLOCK_D=max(16, triton.next_power_of_2(D)))
        grid = (cdiv(T, BLOCK_N), B * H)
        krause_backward_queries_kernel[grid](q, k, v, inv_var, dy, lse, boundary, delta, dq, y, *common, y.stride(2),
                                             **flags)
        krause_backward_keys_kernel[grid](q, k, v, inv_var, dy, lse, boundary, delta, dk, dv, dlog_sigma,
                                          *common, **flags)
        return dq, dk, dv, dlog_sigma.view(B, H, T).sum((0, 2)).to(ctx.sigma_dtype), None, None


def krause_band_attention(q, k, v, log_sigma, window, topk):
    """Krause's causal band, (B, H, T, D): q, k, v (B, H, T, D), log_sigma (H,) (σ per head), the window W and the
    keys kept per row k (1 <= k). Gradients of q, k, v and log_sigma."""
    return KrauseBandKernel.apply(q, k.to(q.dtype), v.to(q.dtype), log_sigma, min(window, q.size(2)), topk)
