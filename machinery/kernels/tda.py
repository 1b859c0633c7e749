"""
TDA's thresholded attention as Triton kernels: y_i = Σ_j (relu(q1_i·k1_j - τ_i)^p - λ relu(q2_i·k2_j - τ_i)^p) v_j
(j <= i causal, every j otherwise) in one pass over the key blocks, with no softmax statistics: the weights are the
rectified excesses themselves. Causal key blocks above the diagonal are never visited. The backward recomputes the
scores, so nothing T×T is kept, in two kernels: one per key block for dk and dv, then one per query block for dq, dτ
and dλ. Each program owns the rows it writes, so there are no atomic adds; each tile is scored twice, and that was
still faster on an H200 than one pass adding dq, dτ, dλ by float32 atomics (attention alone, T = 4096: 2.40 ms
against 2.62 ms).
What is skipped, exactly: a tile where no visible excess s - τ is positive in either view has a = 0 and ∂a/∂s = 0, so
it contributes nothing; the forward skips its value product, the backward every product after the scores (94-99% of
the weights are exact zeros, so most tiles are such). A tile where view 1 has no survivor still needs view 2's
product: a¹ = 0 does not make a² = 0 (the weight is a¹ - λa², and the second view's excess may be positive), so both
views' scores are always computed and the second's is never skipped on the first's account.
q, k arrive L2-normalised per view (the rule normalises, autograd flows through that); τ (T,) and λ (a scalar tensor)
get their gradients; p >= 1 is fixed per model, a compile-time constant P (p = 1, 2 without a pow), so no float
argument reaches a kernel (inside a torch.compile graph Inductor would pass one as fp64).
"""
import torch

from machinery.band import cdiv
from machinery.kernels.triton_available import bh_t_strides, dot_precision, jit, load_rows, tl, triton, unit_last_stride



def tiles(dtype):
    """Each kernel's launch shape, (BLOCK_M queries, BLOCK_N keys, warps): the rows per program and keys per step of
    the forward and the queries' kernel, the queries per step and keys per program of the keys' kernel. Chosen so that
    no kernel spills registers at d = 64 (tests/kernel_builds.py); float32's dots run on FMA units and hold more
    registers, so its tiles are smaller."""
    if dtype == torch.float32:
        shapes = dict(forward=(32, 16, 4), keys=(16, 64, 8), queries=(32, 16, 8))
    else:
        shapes = dict(forward=(64, 64, 4), keys=(32, 64, 8), queries=(64, 32, 4))
    return {kernel: dict(BLOCK_M=m, BLOCK_N=n, num_warps=warps) for kernel, (m, n, warps) in shapes.items()}


@jit
def excess_power(x, P: tl.constexpr):  # relu(x)^P, and its derivative P·relu(x)^(P-1)
    positive = x > 0
    r = tl.where(positive, x, 0.0)
    if P == 1:
        return r, tl.where(positive, 1.0, 0.0)
    if P == 2:
        return r * r, 2.0 * r
    log_r = tl.log2(tl.where(positive, x, 1.0))
    return tl.where(positive, tl.exp2(P * log_r), 0.0), tl.where(positive, P * tl.exp2((P - 1.0) * log_r), 0.0)


@jit
def causal_visible(rows, cols, T, CAUSAL: tl.constexpr):  # (M, N): key j in the sequence, and j <= i if causal
    visible = (cols[None, :] < T) & (rows[:, None] >= 0)
    if CAUSAL:
        visible = visible & (cols[None, :] <= rows[:, None])
    return visible


@jit
def view_scores(Q, K, sq, sk, rows, cols, dims, T, d, PRECISION: tl.constexpr):  # q·k of one view, (M, N) float32
    q = load_rows(Q, sq, rows, dims, T, d)
    k = load_rows(K, sk, cols, dims, T, d)
    return tl.dot(q, tl.trans(k), input_precision=PRECISION), q, k


@jit
def excesses(q1, k1, q2, k2, tau, TWO_VIEWS: tl.constexpr, PRECISION: tl.constexpr):  # s - τ per view, (M, N) each
    x1 = tl.dot(q1, tl.trans(k1), input_precision=PRECISION) - tau
    x2 = x1
    if TWO_VIEWS:
        x2 = tl.dot(q2, tl.trans(k2), input_precision=PRECISION) - tau
    return x1, x2


@jit
def has_excess(x1, x2, visible):  # a tile with work: a visible excess > 0 in either view (else a = 0, ∂a/∂s = 0)
    return tl.max(tl.where(visible & ((x1 > 0) | (x2 > 0)), 1, 0)) > 0


@jit
def tda_forward_kernel(Q1, K1, Q2, K2, V, TAU, LAM, Y,
                       sq1b, sq1h, sq1t, sk1b, sk1h, sk1t, sq2b, sq2h, sq2t, sk2b, sk2h, sk2t,
                       svb, svh, svt, syb, syh, syt, H, T, d, D,
                       TWO_VIEWS: tl.constexpr, CAUSAL: tl.constexpr, P: tl.constexpr, PRECISION: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_d: tl.constexpr, BLOCK_D: tl.constexpr):
    m, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    Q1, K1, V = Q1 + b * sq1b + h * sq1h, K1 + b * sk1b + h * sk1h, V + b * svb + h * svh
    Q2, K2 = Q2 + b * sq2b + h * sq2h, K2 + b * sk2b + h * sk2h
    rows = m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims, vdims = tl.arange(0, BLOCK_d), tl.arange(0, BLOCK_D)
    tau = tl.load(TAU + rows, mask=rows < T, other=0.0)[:, None]
    lam = tl.load(LAM) if TWO_VIEWS else 0.0
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    end = (m + 1) * BLOCK_M if CAUSAL else T  # causal: no key block past the diagonal (past T: masked)
    for start in range(0, end, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        visible = causal_visible(rows, cols, T, CAUSAL)
        s1, _, _ = view_scores(Q1, K1, sq1t, sk1t, rows, cols, dims, T, d, PRECISION)
        x1 = s1 - tau
        x2 = x1
        if TWO_VIEWS:  # scored whatever view 1 holds: a¹ = 0 leaves -λa²
            s2, _, _ = view_scores(Q2, K2, sq2t, sk2t, rows, cols, dims, T, d, PRECISION)
            x2 = s2 - tau
        if has_excess(x1, x2, visible):
            a = excess_power(x1, P)[0]
            if TWO_VIEWS:
                a = a - lam * excess_power(x2, P)[0]
            a = tl.where(visible, a, 0.0)
            v = load_rows(V, svt, cols, vdims, T, D)
            acc += tl.dot(a.to(v.dtype), v, input_precision=PRECISION)
    Y = Y + b * syb + h * syh
    tl.store(Y + rows[:, None] * syt + vdims[None, :], acc, mask=(rows[:, None] < T) & (vdims[None, :] < D))


@jit
def tda_backward_keys_kernel(Q1, K1, Q2, K2, V, TAU, LAM, DY, DK1, DK2, DV,
                             sq1b, sq1h, sq1t, sk1b, sk1h, sk1t, sq2b, sq2h, sq2t, sk2b, sk2h, sk2t,
                             svb, svh, svt, sdyb, sdyh, sdyt, H, T, d, D,
                             TWO_VIEWS: tl.constexpr, CAUSAL: tl.constexpr, P: tl.constexpr, PRECISION: tl.constexpr,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_d: tl.constexpr,
                             BLOCK_D: tl.constexpr):
    """One key block: dv_j = Σ_i a_ij dy_i, dk_j = Σ_i ds_ij q_i per view (ds = ∂y/∂s through the weights). The
    gradients are written contiguous, (B, H, T, d) and (B, H, T, D)."""
    n, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    Q1, K1, V = Q1 + b * sq1b + h * sq1h, K1 + b * sk1b + h * sk1h, V + b * svb + h * svh
    Q2, K2, DY = Q2 + b * sq2b + h * sq2h, K2 + b * sk2b + h * sk2h, DY + b * sdyb + h * sdyh
    cols = n * BLOCK_N + tl.arange(0, BLOCK_N)
    dims, vdims = tl.arange(0, BLOCK_d), tl.arange(0, BLOCK_D)
    lam = tl.load(LAM) if TWO_VIEWS else 0.0
    k1 = load_rows(K1, sk1t, cols, dims, T, d)
    k2 = load_rows(K2, sk2t, cols, dims, T, d) if TWO_VIEWS else k1
    v = load_rows(V, svt, cols, vdims, T, D)
    dk1 = tl.zeros((BLOCK_N, BLOCK_d), dtype=tl.float32)
    dk2 = tl.zeros((BLOCK_N, BLOCK_d), dtype=tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    first = (n * BLOCK_N // BLOCK_M) * BLOCK_M if CAUSAL else 0  # causal: queries at or after the block's first key
    for start in range(first, T, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        visible = causal_visible(rows, cols, T, CAUSAL) & (rows[:, None] < T)
        tau = tl.load(TAU + rows, mask=rows < T, other=0.0)[:, None]
        q1 = load_rows(Q1, sq1t, rows, dims, T, d)
        q2 = load_rows(Q2, sq2t, rows, dims, T, d) if TWO_VIEWS else q1
        x1, x2 = excesses(q1, k1, q2, k2, tau, TWO_VIEWS, PRECISION)
        if has_excess(x1, x2, visible):  # else the tile adds nothing to dk or dv
            a, g1 = excess_power(x1, P)
            dy = load_rows(DY, sdyt, rows, vdims, T, D)
            da = tl.dot(dy, tl.trans(v), input_precision=PRECISION)      # ∂y/∂a_ij = dy_i·v_j, (M, N)
            ds1 = tl.where(visible, da * g1, 0.0)
            dk1 += tl.dot(tl.trans(ds1).to(q1.dtype), q1, input_precision=PRECISION)
            if TWO_VIEWS:
                a2, g2 = excess_power(x2, P)
                a = a - lam * a2
                ds2 = tl.where(visible, -lam * da * g2, 0.0)
                dk2 += tl.dot(tl.trans(ds2).to(q2.dtype), q2, input_precision=PRECISION)
            a = tl.where(visible, a, 0.0)
            dv += tl.dot(tl.trans(a).to(dy.dtype), dy, input_precision=PRECISION)
    out = bh * T * d + cols[:, None] * d + dims[None, :]
    mask = (cols[:, None] < T) & (dims[None, :] < d)
    tl.store(DK1 + out, dk1, mask=mask)
    if TWO_VIEWS:
        tl.store(DK2 + out, dk2, mask=mask)
    tl.store(DV + bh * T * D + cols[:, None] * D + vdims[None, :], dv, mask=(cols[:, None] < T) & (vdims[None, :] < D))


@jit
def tda_backward_queries_kernel(Q1, K1, Q2, K2, V, TAU, LAM, DY, DQ1, DQ2, DTAU, DLAM,
                                sq1b, sq1h, sq1t, sk1b, sk1h, sk1t, sq2b, sq2h, sq2t, sk2b, sk2h, sk2t,
                                svb, svh, svt, sdyb, sdyh, sdyt, H, T, d, D,
                                TWO_VIEWS: tl.constexpr, CAUSAL: tl.constexpr, P: tl.constexpr, PRECISION: tl.constexpr,
                                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_d: tl.constexpr,
                                BLOCK_D: tl.constexpr):
    """One query block: dq_i = Σ_j ds_ij k_j per view, dτ_i = -Σ_j (ds1_ij + ds2_ij), and row i's share of
    dλ = -Σ_ij dy_i·v_j relu(s2_ij - τ_i)^p, per (batch, head) (summed over them outside)."""
    m, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    Q1, K1, V = Q1 + b * sq1b + h * sq1h, K1 + b * sk1b + h * sk1h, V + b * svb + h * svh
    Q2, K2, DY = Q2 + b * sq2b + h * sq2h, K2 + b * sk2b + h * sk2h, DY + b * sdyb + h * sdyh
    rows = m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims, vdims = tl.arange(0, BLOCK_d), tl.arange(0, BLOCK_D)
    tau = tl.load(TAU + rows, mask=rows < T, other=0.0)[:, None]
    lam = tl.load(LAM) if TWO_VIEWS else 0.0
    q1 = load_rows(Q1, sq1t, rows, dims, T, d)
    q2 = load_rows(Q2, sq2t, rows, dims, T, d) if TWO_VIEWS else q1
    dy = load_rows(DY, sdyt, rows, vdims, T, D)
    dq1 = tl.zeros((BLOCK_M, BLOCK_d), dtype=tl.float32)
    dq2 = tl.zeros((BLOCK_M, BLOCK_d), dtype=tl.float32)
    dtau = tl.zeros((BLOCK_M,), dtype=tl.float32)
    dlam = tl.zeros((BLOCK_M,), dtype=tl.float32)
    end = (m + 1) * BLOCK_M if CAUSAL else T
    for start in range(0, end, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        visible = causal_visible(rows, cols, T, CAUSAL)
        k1 = load_rows(K1, sk1t, cols, dims, T, d)
        k2 = load_rows(K2, sk2t, cols, dims, T, d) if TWO_VIEWS else k1
        x1, x2 = excesses(q1, k1, q2, k2, tau, TWO_VIEWS, PRECISION)
        if has_excess(x1, x2, visible):  # else the tile adds nothing to dq, dτ or dλ
            v = load_rows(V, svt, cols, vdims, T, D)
            da = tl.dot(dy, tl.trans(v), input_precision=PRECISION)
            _, g1 = excess_power(x1, P)
            ds1 = tl.where(visible, da * g1, 0.0)
            dq1 += tl.dot(ds1.to(k1.dtype), k1, input_precision=PRECISION)
            dtau -= tl.sum(ds1, 1)
            if TWO_VIEWS:
                a2, g2 = excess_power(x2, P)
                ds2 = tl.where(visible, -lam * da * g2, 0.0)
                dq2 += tl.dot(ds2.to(k2.dtype), k2, input_precision=PRECISION)
                dtau -= tl.sum(ds2, 1)
                dlam -= tl.sum(tl.where(visible, da * a2, 0.0), 1)
    out = bh * T * d + rows[:, None] * d + dims[None, :]
    mask = (rows[:, None] < T) & (dims[None, :] < d)
    tl.store(DQ1 + out, dq1, mask=mask)
    tl.store(DTAU + bh * T + rows, dtau, mask=rows < T)
    if TWO_VIEWS:
        tl.store(DQ2 + out, dq2, mask=mask)
        tl.store(DLAM + bh * T + rows, dlam, mask=rows < T)


class TDAKernel(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q1, k1, q2, k2, v, tau, lam, p, causal):
        two_views = q2 is not None
        q1, k1, v = unit_last_stride(q1), unit_last_stride(k1), unit_last_stride(v)
        q2, k2 = (unit_last_stride(q2), unit_last_stride(k2)) if two_views else (q1, k1)
        tau32 = tau.detach().float().contiguous()
        lam32 = (lam.detach().float() if two_views else tau32.new_zeros(())).reshape(1)
        B, H, T, D = v.shape
        y = torch.empty_like(v, memory_format=torch.contiguous_format)
        args = launch_args(q1, k1, q2, k2, v, tau32, lam32, p, two_views, causal)
        shape = tiles(v.dtype)['forward']
        tda_forward_kernel[(cdiv(T, shape['BLOCK_M']), B * H)](
            *args['tensors'], y, *args['strides'], *bh_t_strides(y), *args['sizes'], **args['flags'], **shape)
        ctx.save_for_backward(q1, k1, q2, k2, v, tau32, lam32)
        ctx.p, ctx.causal, ctx.two_views, ctx.tau_dtype = p, causal, two_views, tau.dtype
        ctx.lam_shape = lam.shape if two_views else None
        return y

    @staticmethod
    def backward(ctx, dy):
        q1, k1, q2, k2, v, tau32, lam32 = ctx.saved_tensors
        dy = unit_last_stride(dy)
        B, H, T, D = v.shape
        d = q1.size(-1)
        args = launch_args(q1, k1, q2, k2, v, tau32, lam32, ctx.p, ctx.two_views, ctx.causal)
        new = lambda width: torch.empty(B, H, T, width, dtype=v.dtype, device=v.device)
        dq1, dk1, dv = new(d), new(d), new(D)
        dq2, dk2 = (new(d), new(d)) if ctx.two_views else (dq1, dk1)
        # dτ and dλ per (batch·head, row), float32, summed over batch and heads below
        dtau = torch.empty(B * H, T, dtype=torch.float32, device=v.device)
        dlam = torch.empty_like(dtau) if ctx.two_views else dtau
        shapes = tiles(v.dtype)
        tda_backward_keys_kernel[(cdiv(T, shapes['keys']['BLOCK_N']), B * H)](
            *args['tensors'], dy, dk1, dk2, dv, *args['strides'], *bh_t_strides(dy), *args['sizes'], **args['flags'],
            **shapes['keys'])
        tda_backward_queries_kernel[(cdiv(T, shapes['queries']['BLOCK_M']), B * H)](
            *args['tensors'], dy, dq1, dq2, dtau, dlam, *args['strides'], *bh_t_strides(dy), *args['sizes'],
            **args['flags'], **shapes['queries'])
        dtau = dtau.sum(0).to(ctx.tau_dtype)
        if not ctx.two_views:
            return dq1, dk1, None, None, dv, dtau, None, None, None
        return dq1, dk1, dq2, dk2, dv, dtau, dlam.sum().reshape(ctx.lam_shape), None, None


def launch_args(q1, k1, q2, k2, v, tau32, lam32, p, two_views, causal):
    """What the three kernels share: the inputs, their strides, the sizes and the compile-time flags."""
    T, d, D = v.size(2), q1.size(-1), v.size(-1)
    return dict(tensors=(q1, k1, q2, k2, v, tau32, lam32),
                strides=(*bh_t_strides(q1), *bh_t_strides(k1), *bh_t_strides(q2), *bh_t_strides(k2),
                         *bh_t_strides(v)),
                sizes=(v.size(1), T, d, D),
                flags=dict(TWO_VIEWS=two_views, CAUSAL=causal, P=float(p),
                           PRECISION=dot_precision(v.dtype), BLOCK_d=max(16, triton.next_power_of_2(d)),
                           BLOCK_D=max(16, triton.next_power_of_2(D))))


def tda_attention(q1, k1, q2, k2, v, tau, lam, p=2.0, causal=True):
    """Σ_j (relu(q1_i·k1_j - τ_i)^p - λ relu(q2_i·k2_j - τ_i)^p) v_j, (B, H, T, D): q1, k1, q2, k2 (B, H, T, d)
    L2-normalised (q2, k2, lam None: one view, TRA), v (B, H, T, D), tau (T,), lam a scalar tensor, p >= 1.
    Causal: key j <= i; else every key. Gradients of every tensor argument."""
    if q2 is not None:
        q2, k2 = q2.to(v.dtype), k2.to(v.dtype)
    return TDAKernel.apply(q1.to(v.dtype), k1.to(v.dtype), q2, k2, v, tau, lam, p, causal)
