r"""Triton beta-mixed batch norm (FedL2P Eq. 1-2), forward and backward.

Math (per channel c; M = N * prod(spatial) elements; fp32 throughout):

    forward    m_b = mean(x),  v_b = mean((x - m_b)^2)                (batch statistics, biased)
               (m_c, v_c) = (m_b, v_b) when the batch is used, else the client's running (mu_i, s2_i)
               mu  = (1 - beta) mu_pt + beta m_c,    s2 = (1 - beta) s2_pt + beta v_c     (Eq. 2)
               r = (s2 + eps)^-1/2,   xhat = (x - mu) r,   y = gamma xhat + delta         (Eq. 1)
    mode "batch" (FT BN I): mu = m_b, s2 = v_b (the formulas above with beta = 1, no mixing).

    backward   with S1 = sum(dy), S2 = sum(dy * xhat):
               dL/ddelta = S1,    dL/dgamma = S2,
               dL/dmu = -gamma r S1,    dL/ds2 = -1/2 gamma r^2 S2,
               dL/dbeta = dL/dmu (m_c - mu_pt) + dL/ds2 (v_c - s2_pt)
                 (training: through the batch statistics; evaluation: through the running-stat
                 mixture, m_c = mu_i; a scalar beta gets the sum over channels),
               dL/dx = gamma r dy + b (dL/dmu dm_b/dx + dL/ds2 dv_b/dx)
                     = gamma r dy - b gamma r S1 / M - b gamma r^2 S2 (x - m_b) / M
               where b = beta (mixed) or 1 (batch mode) when the batch statistics are used,
               and b = 0 in evaluation (mu, s2 do not depend on x then).

Kernels, split path (3 launches forward, 3 backward, each a single read of what it needs):
  1. `_stats_kernel`   split reduction over M: each program merges tiles of a block of
                       channels with Chan's parallel formula (count, mean, M2); no
                       sum-of-squares cancellation even for large means.
  2. `_finalize_kernel` merges the splits, mixes with the pretrained / running statistics,
                       updates the running statistics in place (unbiased variance, momentum,
                       as torch BatchNorm does) and writes the per-channel vectors.
  3. `_affine_kernel`  y = (x - mu) * (gamma r) + delta.
  Backward: `_grad_sums_kernel` (S1, S2 partials), `_grad_finalize_kernel` (gradients of
  gamma, delta, beta and the three dx coefficients), `_affine_kernel` again for dx.
  Small channels-first inputs (at most FUSED_MAX_M positions per channel) take one launch each
  way instead: `_fused_forward_kernel` and `_fused_backward_kernel` give each program a block of
  channels and every position of them (the reduction, then a second pass for y or dx). At those
  sizes six launches cost the host more time than the GPU spends on the data.

Layouts: x is viewed as (N, C, S) with S the flattened spatial size and strides read from
the tensor, so channels-first and channels-last inputs run without a copy. Tiles are
(BLOCK_C channels) x (BLOCK_M positions): along the spatial axis for channels-first inputs
with a large S (contiguous, vectorizable loads), along flattened (n, s) otherwise, with wide
channel blocks for channels-last. fp16 / bf16 activations are read and written in their
dtype, all arithmetic in fp32.

Second order: the backward is first-order Triton. When a graph of the backward itself is
requested (``create_graph=True``, e.g. Hessian-vector products in Alg. 2), the backward
re-derives the gradients from the differentiable PyTorch reference instead, so higher-order
derivatives stay correct.
"""
from __future__ import annotations

import math

import torch

from . import reference
from ._triton_common import cdiv, lazy_jit, next_pow2, programs_target

# `tl` is bound to triton.language in the namespace the kernels are jitted in
# (`_triton_common.lazy_jit`), so importing this module does not import Triton.
tl = None

TILE = 2048            # elements per (channel block x position block) tile: 8 per thread at 8 warps
SPATIAL_MIN = 256      # channels-first inputs with S >= this tile along the spatial axis
FIN_BLOCK_C = 128      # channels per program of the finalize kernels
FIN_BLOCK_S = 16       # splits merged per step by the finalize kernels
FUSED_MAX_M = 8192     # channels-first inputs with at most this many positions per channel: one launch each way
FUSED_BLOCK_M = 1024   # positions per tile of the fused kernels
GENERAL, UNIT_S, UNIT_C = 0, 1, 2   # layout codes: arbitrary strides, sS == 1, sC == 1


@lazy_jit
def _tile(t, S, M, s_blocks, SPATIAL: tl.constexpr, BLOCK_M: tl.constexpr):
    """Positions of tile ``t``: image index n, spatial index s, validity, element count.

    SPATIAL tiles cover BLOCK_M consecutive positions of one image (n is a scalar); the
    others cover BLOCK_M consecutive flattened (n, s) positions (n is a vector).
    """
    if SPATIAL:
        n = t // s_blocks
        s0 = (t - n * s_blocks) * BLOCK_M
        s = s0 + tl.arange(0, BLOCK_M)
        valid = s < S
        count = tl.minimum(S - s0, BLOCK_M)
    else:
        m0 = t * BLOCK_M
        m = m0 + tl.arange(0, BLOCK_M)
        valid = m < M
        n = m // S
        s = m - n * S
        count = tl.minimum(M - m0, BLOCK_M)
    return n, s, valid, count


@lazy_jit
def _offsets(c, n, s, sN, sC, sS, LAYOUT: tl.constexpr):
    """int64 element offsets (BLOCK_C, BLOCK_M) of x[n, c, s]; a unit stride is made a
    compile-time constant so the compiler sees contiguity and vectorizes the accesses."""
    c64 = c.to(tl.int64)
    row = n.to(tl.int64) * sN
    if LAYOUT == 1:
        off = c64[:, None] * sC + (row + s.to(tl.int64))[None, :]
    elif LAYOUT == 2:
        off = c64[:, None] + (row + s.to(tl.int64) * sS)[None, :]
    else:
        off = c64[:, None] * sC + (row + s.to(tl.int64) * sS)[None, :]
    return off


@lazy_jit
def _merge_tile(x_ptr, c, cmask, t, S, M, s_blocks, sN, sC, sS, mean, m2, count,
                SPATIAL: tl.constexpr, LAYOUT: tl.constexpr, BLOCK_M: tl.constexpr):
    """Chan's parallel merge of tile ``t``'s per-channel (count, mean, M2) into the running ones."""
    n, s, valid, k = _tile(t, S, M, s_blocks, SPATIAL, BLOCK_M)
    mask = cmask[:, None] & valid[None, :]
    x = tl.load(x_ptr + _offsets(c, n, s, sN, sC, sS, LAYOUT), mask=mask, other=0.0).to(tl.float32)
    kf = k.to(tl.float32)
    t_mean = tl.sum(x, axis=1) / kf
    d = tl.where(mask, x - t_mean[:, None], 0.0)
    t_m2 = tl.sum(d * d, axis=1)
    total = count + kf
    w = kf / total
    delta = t_mean - mean
    return mean + delta * w, m2 + t_m2 + delta * delta * count * w, total


@lazy_jit
def _stats_kernel(x_ptr, mean_ptr, m2_ptr, cnt_ptr, C, M, S, s_blocks, sN, sC, sS, n_tiles, tiles_per_prog,
                  SPATIAL: tl.constexpr, LAYOUT: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_M: tl.constexpr):
    """Per split and channel: count, mean and M2 of x over this split's tiles (Chan merge)."""
    pid = tl.program_id(0)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = c < C
    mean = tl.zeros([BLOCK_C], dtype=tl.float32)
    m2 = tl.zeros([BLOCK_C], dtype=tl.float32)
    count = tl.zeros([BLOCK_C], dtype=tl.float32)
    first = pid * tiles_per_prog
    last = tl.minimum(first + tiles_per_prog, n_tiles)
    for t in range(first, last):
        mean, m2, count = _merge_tile(x_ptr, c, cmask, t, S, M, s_blocks, sN, sC, sS, mean, m2, count,
                                      SPATIAL, LAYOUT, BLOCK_M)
    out = pid * C + c
    tl.store(mean_ptr + out, mean, mask=cmask)
    tl.store(m2_ptr + out, m2, mask=cmask)
    tl.store(cnt_ptr + out, count, mask=cmask)


@lazy_jit
def _mix(c, cmask, mean, m2, count, pt_mean_ptr, pt_var_ptr, run_mean_ptr, run_var_ptr, beta_ptr, beta_stride,
         beta_val, w_ptr, b_ptr, mu_ptr, rstd_ptr, bmean_ptr, dmean_ptr, dvar_ptr, eps, momentum, unbias,
         BATCH: tl.constexpr, MIX: tl.constexpr, UPDATE: tl.constexpr, BETA_T: tl.constexpr, HAS_W: tl.constexpr,
         HAS_B: tl.constexpr, BLOCK_C: tl.constexpr):
    """Eq. 2 on the current statistics: the batch's (count, mean, M2 merged over x) when BATCH, else
    the client's running ones. Stores mu, rstd, the batch mean and the mixing differences, updates
    the running statistics when UPDATE; returns (mu, scale = gamma rstd, shift = delta)."""
    if BATCH:
        tl.store(bmean_ptr + c, mean, mask=cmask)
        cur_m = mean
        cur_v = m2 / tl.maximum(count, 1.0)
    else:
        cur_m = tl.load(run_mean_ptr + c, mask=cmask, other=0.0).to(tl.float32)
        cur_v = tl.load(run_var_ptr + c, mask=cmask, other=1.0).to(tl.float32)
    if MIX:
        if BETA_T:
            beta = tl.load(beta_ptr + c * beta_stride, mask=cmask, other=0.0).to(tl.float32)
        else:
            beta = beta_val
        p_m = tl.load(pt_mean_ptr + c, mask=cmask, other=0.0).to(tl.float32)
        p_v = tl.load(pt_var_ptr + c, mask=cmask, other=1.0).to(tl.float32)
        mu = (1.0 - beta) * p_m + beta * cur_m
        var_mix = (1.0 - beta) * p_v + beta * cur_v
        tl.store(dmean_ptr + c, cur_m - p_m, mask=cmask)
        tl.store(dvar_ptr + c, cur_v - p_v, mask=cmask)
    else:
        mu = cur_m
        var_mix = cur_v
    rstd = 1.0 / tl.sqrt(var_mix + eps)
    scale = rstd
    if HAS_W:
        scale = scale * tl.load(w_ptr + c, mask=cmask, other=1.0).to(tl.float32)
    shift = tl.zeros([BLOCK_C], dtype=tl.float32)
    if HAS_B:
        shift = tl.load(b_ptr + c, mask=cmask, other=0.0).to(tl.float32)
    tl.store(mu_ptr + c, mu, mask=cmask)
    tl.store(rstd_ptr + c, rstd, mask=cmask)
    if UPDATE:
        rm = tl.load(run_mean_ptr + c, mask=cmask, other=0.0).to(tl.float32)
        rv = tl.load(run_var_ptr + c, mask=cmask, other=0.0).to(tl.float32)
        rm = rm * (1.0 - momentum) + momentum * cur_m
        rv = rv * (1.0 - momentum) + momentum * (cur_v * unbias)
        tl.store(run_mean_ptr + c, rm.to(run_mean_ptr.dtype.element_ty), mask=cmask)
        tl.store(run_var_ptr + c, rv.to(run_var_ptr.dtype.element_ty), mask=cmask)
    return mu, scale, shift


@lazy_jit
def _finalize_kernel(mean_ptr, m2_ptr, cnt_ptr, n_split, C, pt_mean_ptr, pt_var_ptr, run_mean_ptr, run_var_ptr,
                     beta_ptr, beta_stride, beta_val, w_ptr, b_ptr,
                     mu_ptr, rstd_ptr, bmean_ptr, dmean_ptr, dvar_ptr, scale_ptr, shift_ptr,
                     eps, momentum, unbias,
                     BATCH: tl.constexpr, MIX: tl.constexpr, UPDATE: tl.constexpr, BETA_T: tl.constexpr,
                     HAS_W: tl.constexpr, HAS_B: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr):
    """Merge split statistics, mix them (Eq. 2), update running stats, emit per-channel vectors."""
    c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = c < C
    mean = tl.zeros([BLOCK_C], dtype=tl.float32)
    m2 = tl.zeros([BLOCK_C], dtype=tl.float32)
    count = tl.zeros([BLOCK_C], dtype=tl.float32)
    if BATCH:
        for s0 in range(0, n_split, BLOCK_S):
            sp = s0 + tl.arange(0, BLOCK_S)
            mask = (sp < n_split)[:, None] & cmask[None, :]
            off = sp[:, None] * C + c[None, :]
            pm = tl.load(mean_ptr + off, mask=mask, other=0.0)
            pc = tl.load(cnt_ptr + off, mask=mask, other=0.0)
            bc = tl.sum(pc, axis=0)
            bmean = tl.sum(pc * pm, axis=0) / tl.maximum(bc, 1.0)
            dev = tl.where(mask, pm - bmean[None, :], 0.0)
            bm2 = tl.sum(tl.load(m2_ptr + off, mask=mask, other=0.0) + pc * dev * dev, axis=0)
            total = count + bc
            w = bc / tl.maximum(total, 1.0)
            delta = bmean - mean
            mean += delta * w
            m2 += bm2 + delta * delta * count * w
            count = total
    mu, scale, shift = _mix(c, cmask, mean, m2, count, pt_mean_ptr, pt_var_ptr, run_mean_ptr, run_var_ptr, beta_ptr,
                            beta_stride, beta_val, w_ptr, b_ptr, mu_ptr, rstd_ptr, bmean_ptr, dmean_ptr, dvar_ptr,
                            eps, momentum, unbias, BATCH, MIX, UPDATE, BETA_T, HAS_W, HAS_B, BLOCK_C)
    tl.store(scale_ptr + c, scale, mask=cmask)
    tl.store(shift_ptr + c, shift, mask=cmask)


@lazy_jit
def _affine_kernel(x_ptr, u_ptr, out_ptr, center_ptr, kx_ptr, ku_ptr, k0_ptr, C, M, S, s_blocks,
                   sxN, sxC, sxS, suN, suC, suS, soN, soC, soS,
                   HAS_X: tl.constexpr, HAS_U: tl.constexpr, SPATIAL: tl.constexpr, X_LAYOUT: tl.constexpr,
                   U_LAYOUT: tl.constexpr, O_LAYOUT: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_M: tl.constexpr):
    """out = kx[c] * (x - center[c]) + ku[c] * u + k0[c]: the forward y (no u) and the backward dx."""
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = c < C
    n, s, valid, _ = _tile(tl.program_id(0), S, M, s_blocks, SPATIAL, BLOCK_M)
    mask = cmask[:, None] & valid[None, :]
    acc = tl.zeros([BLOCK_C, BLOCK_M], dtype=tl.float32) + tl.load(k0_ptr + c, mask=cmask, other=0.0)[:, None]
    if HAS_X:
        x = tl.load(x_ptr + _offsets(c, n, s, sxN, sxC, sxS, X_LAYOUT), mask=mask, other=0.0)
        kx = tl.load(kx_ptr + c, mask=cmask, other=0.0)
        ctr = tl.load(center_ptr + c, mask=cmask, other=0.0)
        acc += kx[:, None] * (x.to(tl.float32) - ctr[:, None])
    if HAS_U:
        u = tl.load(u_ptr + _offsets(c, n, s, suN, suC, suS, U_LAYOUT), mask=mask, other=0.0)
        ku = tl.load(ku_ptr + c, mask=cmask, other=0.0)
        acc += ku[:, None] * u.to(tl.float32)
    tl.store(out_ptr + _offsets(c, n, s, soN, soC, soS, O_LAYOUT), acc.to(out_ptr.dtype.element_ty), mask=mask)


@lazy_jit
def _grad_tile_terms(x_ptr, dy_ptr, c, cmask, mu, rstd, t, S, M, s_blocks, sxN, sxC, sxS, sdN, sdC, sdS,
                     SPATIAL: tl.constexpr, X_LAYOUT: tl.constexpr, D_LAYOUT: tl.constexpr, BLOCK_M: tl.constexpr):
    """Tile ``t``'s terms of S1 and S2: dy and dy * xhat (zero off the tensor), not yet summed."""
    n, s, valid, _ = _tile(t, S, M, s_blocks, SPATIAL, BLOCK_M)
    mask = cmask[:, None] & valid[None, :]
    x = tl.load(x_ptr + _offsets(c, n, s, sxN, sxC, sxS, X_LAYOUT), mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + _offsets(c, n, s, sdN, sdC, sdS, D_LAYOUT), mask=mask, other=0.0).to(tl.float32)
    xhat = (x - mu[:, None]) * rstd[:, None]
    return dy, tl.where(mask, dy * xhat, 0.0)


@lazy_jit
def _grad_sums_kernel(x_ptr, dy_ptr, mu_ptr, rstd_ptr, s1_ptr, s2_ptr, C, M, S, s_blocks,
                      sxN, sxC, sxS, sdN, sdC, sdS, n_tiles, tiles_per_prog,
                      SPATIAL: tl.constexpr, X_LAYOUT: tl.constexpr, D_LAYOUT: tl.constexpr,
                      BLOCK_C: tl.constexpr, BLOCK_M: tl.constexpr):
    """Per split and channel: S1 = sum(dy), S2 = sum(dy * xhat) with xhat = (x - mu) * rstd."""
    pid = tl.program_id(0)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = c < C
    mu = tl.load(mu_ptr + c, mask=cmask, other=0.0)
    rstd = tl.load(rstd_ptr + c, mask=cmask, other=0.0)
    s1 = tl.zeros([BLOCK_C], dtype=tl.float32)
    s2 = tl.zeros([BLOCK_C], dtype=tl.float32)
    first = pid * tiles_per_prog
    last = tl.minimum(first + tiles_per_prog, n_tiles)
    for t in range(first, last):
        t1, t2 = _grad_tile_terms(x_ptr, dy_ptr, c, cmask, mu, rstd, t, S, M, s_blocks, sxN, sxC, sxS, sdN, sdC,
                                  sdS, SPATIAL, X_LAYOUT, D_LAYOUT, BLOCK_M)
        s1 += tl.sum(t1, axis=1)
        s2 += tl.sum(t2, axis=1)
    out = pid * C + c
    tl.store(s1_ptr + out, s1, mask=cmask)
    tl.store(s2_ptr + out, s2, mask=cmask)


@lazy_jit
def _grad_coefficients(c, cmask, s1, s2, M, w_ptr, rstd_ptr, beta_ptr, beta_stride, beta_val, dmean_ptr, dvar_ptr,
                       dw_ptr, db_ptr, dbeta_ptr, MIX: tl.constexpr, BATCH: tl.constexpr, BETA_T: tl.constexpr,
                       HAS_W: tl.constexpr, BLOCK_C: tl.constexpr):
    """From S1, S2: stores the gradients of gamma, delta and beta; returns dx's coefficients
    (kdy, kx, k0) in dx = kdy dy + kx (x - m_b) + k0 (M is the per-channel count, a float)."""
    rstd = tl.load(rstd_ptr + c, mask=cmask, other=0.0)
    gamma = tl.full([BLOCK_C], 1.0, dtype=tl.float32)
    if HAS_W:
        gamma = tl.load(w_ptr + c, mask=cmask, other=0.0).to(tl.float32)
    tl.store(dw_ptr + c, s2, mask=cmask)
    tl.store(db_ptr + c, s1, mask=cmask)
    g_mu = -gamma * rstd * s1
    g_var = -0.5 * gamma * rstd * rstd * s2
    bcoef = tl.full([BLOCK_C], 1.0, dtype=tl.float32)
    if MIX:
        if BETA_T:
            bcoef = tl.load(beta_ptr + c * beta_stride, mask=cmask, other=0.0).to(tl.float32)
        else:
            bcoef = bcoef * beta_val
        dmean = tl.load(dmean_ptr + c, mask=cmask, other=0.0)
        dvar = tl.load(dvar_ptr + c, mask=cmask, other=0.0)
        tl.store(dbeta_ptr + c, g_mu * dmean + g_var * dvar, mask=cmask)
    if BATCH:
        # dx = gamma r dy + (b / M) dL/dmu + (2 b / M) dL/ds2 (x - m_b)
        kx = 2.0 * bcoef * g_var / M
        k0 = bcoef * g_mu / M
    else:
        kx = tl.zeros([BLOCK_C], dtype=tl.float32)
        k0 = tl.zeros([BLOCK_C], dtype=tl.float32)
    return gamma * rstd, kx, k0


@lazy_jit
def _grad_finalize_kernel(s1_ptr, s2_ptr, n_split, C, M, w_ptr, rstd_ptr, beta_ptr, beta_stride, beta_val,
                          dmean_ptr, dvar_ptr, dw_ptr, db_ptr, dbeta_ptr, kdy_ptr, kx_ptr, k0_ptr,
                          MIX: tl.constexpr, BATCH: tl.constexpr, BETA_T: tl.constexpr, HAS_W: tl.constexpr,
                          BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr):
    """Sum the split partials; gradients of gamma, delta, beta; coefficients of dx."""
    c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = c < C
    acc1 = tl.zeros([BLOCK_S, BLOCK_C], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_S, BLOCK_C], dtype=tl.float32)
    for s0 in range(0, n_split, BLOCK_S):
        sp = s0 + tl.arange(0, BLOCK_S)
        mask = (sp < n_split)[:, None] & cmask[None, :]
        off = sp[:, None] * C + c[None, :]
        acc1 += tl.load(s1_ptr + off, mask=mask, other=0.0)
        acc2 += tl.load(s2_ptr + off, mask=mask, other=0.0)
    kdy, kx, k0 = _grad_coefficients(c, cmask, tl.sum(acc1, axis=0), tl.sum(acc2, axis=0), M, w_ptr, rstd_ptr,
                                     beta_ptr, beta_stride, beta_val, dmean_ptr, dvar_ptr, dw_ptr, db_ptr, dbeta_ptr,
                                     MIX, BATCH, BETA_T, HAS_W, BLOCK_C)
    tl.store(kdy_ptr + c, kdy, mask=cmask)
    tl.store(kx_ptr + c, kx, mask=cmask)
    tl.store(k0_ptr + c, k0, mask=cmask)


@lazy_jit
def _fused_forward_kernel(x_ptr, y_ptr, pt_mean_ptr, pt_var_ptr, run_mean_ptr, run_var_ptr, beta_ptr, beta_stride,
                          beta_val, w_ptr, b_ptr, mu_ptr, rstd_ptr, bmean_ptr, dmean_ptr, dvar_ptr, C, M, S,
                          sxN, sxC, sxS, syN, syC, syS, n_tiles, eps, momentum, unbias,
                          BATCH: tl.constexpr, MIX: tl.constexpr, UPDATE: tl.constexpr, BETA_T: tl.constexpr,
                          HAS_W: tl.constexpr, HAS_B: tl.constexpr, X_LAYOUT: tl.constexpr, Y_LAYOUT: tl.constexpr,
                          BLOCK_C: tl.constexpr, BLOCK_M: tl.constexpr):
    """The whole forward in one launch for small per-channel counts: one program owns a block of
    channels, reduces their statistics over every tile, mixes them (Eq. 2) and writes y (Eq. 1)."""
    c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = c < C
    mean = tl.zeros([BLOCK_C], dtype=tl.float32)
    m2 = tl.zeros([BLOCK_C], dtype=tl.float32)
    count = tl.zeros([BLOCK_C], dtype=tl.float32)
    if BATCH:
        for t in range(0, n_tiles):
            mean, m2, count = _merge_tile(x_ptr, c, cmask, t, S, M, 1, sxN, sxC, sxS, mean, m2, count,
                                          False, X_LAYOUT, BLOCK_M)
    mu, scale, shift = _mix(c, cmask, mean, m2, count, pt_mean_ptr, pt_var_ptr, run_mean_ptr, run_var_ptr, beta_ptr,
                            beta_stride, beta_val, w_ptr, b_ptr, mu_ptr, rstd_ptr, bmean_ptr, dmean_ptr, dvar_ptr,
                            eps, momentum, unbias, BATCH, MIX, UPDATE, BETA_T, HAS_W, HAS_B, BLOCK_C)
    for t in range(0, n_tiles):
        n, s, valid, _ = _tile(t, S, M, 1, False, BLOCK_M)
        mask = cmask[:, None] & valid[None, :]
        x = tl.load(x_ptr + _offsets(c, n, s, sxN, sxC, sxS, X_LAYOUT), mask=mask, other=0.0).to(tl.float32)
        y = (x - mu[:, None]) * scale[:, None] + shift[:, None]
        tl.store(y_ptr + _offsets(c, n, s, syN, syC, syS, Y_LAYOUT), y.to(y_ptr.dtype.element_ty), mask=mask)


@lazy_jit
def _fused_backward_kernel(x_ptr, dy_ptr, dx_ptr, mu_ptr, rstd_ptr, bmean_ptr, w_ptr, beta_ptr, beta_stride,
                           beta_val, dmean_ptr, dvar_ptr, dw_ptr, db_ptr, dbeta_ptr, C, M, Mf, S,
                           sxN, sxC, sxS, sdN, sdC, sdS, soN, soC, soS, n_tiles,
                           MIX: tl.constexpr, BATCH: tl.constexpr, BETA_T: tl.constexpr, HAS_W: tl.constexpr,
                           NEED_X: tl.constexpr, X_LAYOUT: tl.constexpr, D_LAYOUT: tl.constexpr,
                           O_LAYOUT: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_M: tl.constexpr):
    """The whole backward in one launch for small per-channel counts (twin of the fused forward):
    S1 and S2 over every tile, the parameter gradients, then dx on a second pass."""
    c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = c < C
    mu = tl.load(mu_ptr + c, mask=cmask, other=0.0)
    rstd = tl.load(rstd_ptr + c, mask=cmask, other=0.0)
    # Element-wise accumulators, reduced once after the loop (a reduction per tile inside this
    # loop trips Triton 3.6's thread-locality pass when the dx loop follows).
    a1 = tl.zeros([BLOCK_C, BLOCK_M], dtype=tl.float32)
    a2 = tl.zeros([BLOCK_C, BLOCK_M], dtype=tl.float32)
    for t in range(0, n_tiles):
        t1, t2 = _grad_tile_terms(x_ptr, dy_ptr, c, cmask, mu, rstd, t, S, M, 1, sxN, sxC, sxS, sdN, sdC, sdS,
                                  False, X_LAYOUT, D_LAYOUT, BLOCK_M)
        a1 += t1
        a2 += t2
    kdy, kx, k0 = _grad_coefficients(c, cmask, tl.sum(a1, axis=1), tl.sum(a2, axis=1), Mf, w_ptr, rstd_ptr,
                                     beta_ptr, beta_stride, beta_val, dmean_ptr, dvar_ptr, dw_ptr, db_ptr, dbeta_ptr,
                                     MIX, BATCH, BETA_T, HAS_W, BLOCK_C)
    if NEED_X:
        if BATCH:  # dx's centre; the batch mean is only written when the batch statistics are used
            ctr = tl.load(bmean_ptr + c, mask=cmask, other=0.0)
        for t in range(0, n_tiles):
            n, s, valid, _ = _tile(t, S, M, 1, False, BLOCK_M)
            mask = cmask[:, None] & valid[None, :]
            dy = tl.load(dy_ptr + _offsets(c, n, s, sdN, sdC, sdS, D_LAYOUT), mask=mask, other=0.0)
            dx = kdy[:, None] * dy.to(tl.float32) + k0[:, None]
            if BATCH:
                x = tl.load(x_ptr + _offsets(c, n, s, sxN, sxC, sxS, X_LAYOUT), mask=mask, other=0.0)
                dx += kx[:, None] * (x.to(tl.float32) - ctr[:, None])
            tl.store(dx_ptr + _offsets(c, n, s, soN, soC, soS, O_LAYOUT), dx.to(dx_ptr.dtype.element_ty),
                     mask=mask)


# ----------------------------------------------------------------------------------------------
# Host side: layout, tiling, launches, autograd.
# ----------------------------------------------------------------------------------------------

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _ncs_strides(t: torch.Tensor) -> tuple[int, int, int] | None:
    """Strides of ``t`` viewed as (N, C, S), or None when its spatial dims do not merge."""
    dims = [(size, stride) for size, stride in zip(t.shape[2:], t.stride()[2:]) if size != 1]
    for (_, st_a), (sz_b, st_b) in zip(dims, dims[1:]):
        if st_a != st_b * sz_b:
            return None
    return t.stride(0), t.stride(1), dims[-1][1] if dims else 1


def _layout(strides: tuple[int, int, int], C: int, S: int) -> int:
    """The layout code of an (N, C, S) view: which stride, if any, is a compile-time 1."""
    _, s_c, s_s = strides
    if (s_c == 1 or C == 1) and (S == 1 or s_s != 1):
        return UNIT_C
    if s_s == 1 or S == 1:
        return UNIT_S
    return GENERAL


def _as_ncs(t: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int, int]]:
    strides = _ncs_strides(t)
    if strides is None:  # e.g. a permuted view: one copy, then the contiguous layout
        t = t.contiguous()
        strides = _ncs_strides(t)
    return t, strides


class _Tiling:
    """Tile shape and launch geometry for an (N, C, S) tensor with strides (sN, sC, sS)."""

    def __init__(self, N: int, C: int, S: int, strides: tuple[int, int, int], device: torch.device):
        _, s_c, s_s = strides
        self.C, self.M, self.S = C, N * S, S
        # Small per-channel counts (ResNet-18's late stages, small batches): one program per block of
        # channels does a whole pass, so the forward and the backward are one launch each and the
        # host's launch overhead, not the GPU, stops being most of the time. Channels-last inputs
        # keep the split path (their channel blocks must be wide to read contiguous rows).
        self.fused = self.M <= FUSED_MAX_M and (s_c != 1 or C == 1)
        self.spatial = s_s == 1 and S >= SPATIAL_MIN and C > 1 and s_c != 1 and not self.fused
        if self.fused:
            self.block_m = min(next_pow2(self.M), FUSED_BLOCK_M)
            self.block_c = max(1, min(next_pow2(C), TILE // self.block_m))
            self.s_blocks = 1
            self.n_tiles = cdiv(self.M, self.block_m)
        elif self.spatial:
            # Channels-first, large maps: tiles run along contiguous positions of one image;
            # pick the block (256..1024) that pads the spatial size least.
            self.block_m = min((256, 512, 1024), key=lambda b: (cdiv(S, b) * b, -b))
            self.block_c = max(1, min(next_pow2(C), TILE // self.block_m))
            self.s_blocks = cdiv(S, self.block_m)
            self.n_tiles = N * self.s_blocks
        else:
            # Channels-last (channels contiguous): wide channel blocks give contiguous rows;
            # channels-first with small maps: moderate channel blocks, positions flattened.
            self.block_c = min(next_pow2(C), 64 if s_c == 1 else 16)
            self.block_m = max(1, min(next_pow2(self.M), TILE // self.block_c))
            self.s_blocks = 1
            self.n_tiles = cdiv(self.M, self.block_m)
        self.c_blocks = cdiv(C, self.block_c)
        splits_wanted = max(1, cdiv(programs_target(device), self.c_blocks))
        self.tiles_per_prog = cdiv(self.n_tiles, splits_wanted)
        self.n_split = cdiv(self.n_tiles, self.tiles_per_prog)
        self.num_warps = 8 if self.block_c * self.block_m >= 2048 else 4


def _beta_args(beta) -> tuple[torch.Tensor | None, int, float]:
    if isinstance(beta, torch.Tensor):
        bt = beta.detach().float().reshape(-1).contiguous()
        return bt, (0 if bt.numel() == 1 else 1), 0.0
    return None, 0, float(beta)


def _forward(x, stats, beta, weight, bias, training, momentum, eps, mode):
    """Launch the forward kernels; returns y and the per-channel fp32 vectors for backward."""
    pt_mean, pt_var, client_mean, client_var = stats
    N, C = x.shape[0], x.shape[1]
    S = math.prod(x.shape[2:])
    batch, mix = mode == "batch" or training, mode == "mixed"
    update = mix and training and client_mean is not None
    x, strides = _as_ncs(x)
    tiling = _Tiling(N, C, S, strides, x.device)
    vec = torch.empty(7, C, dtype=torch.float32, device=x.device)
    mu, rstd, bmean, dmean, dvar, scale, shift = vec.unbind(0)
    run_m, run_v = client_mean, client_var
    if run_m is not None and not (run_m.is_contiguous() and run_v.is_contiguous()):
        run_m, run_v = run_m.contiguous(), run_v.contiguous()
    beta_t, beta_stride, beta_val = _beta_args(beta)
    n = tiling.M
    y = torch.empty_like(x)
    y, y_strides = (y, _ncs_strides(y)) if _ncs_strides(y) is not None else _as_ncs(y.contiguous())
    flags = dict(BATCH=batch, MIX=mix, UPDATE=update, BETA_T=beta_t is not None, HAS_W=weight is not None,
                 HAS_B=bias is not None)
    if tiling.fused:
        _fused_forward_kernel[(tiling.c_blocks,)](
            x, y, pt_mean, pt_var, run_m, run_v, beta_t, beta_stride, beta_val, weight, bias, mu, rstd, bmean,
            dmean, dvar, C, tiling.M, S, *strides, *y_strides, tiling.n_tiles, float(eps), float(momentum),
            n / max(n - 1, 1), **flags, X_LAYOUT=_layout(strides, C, S), Y_LAYOUT=_layout(y_strides, C, S),
            BLOCK_C=tiling.block_c, BLOCK_M=tiling.block_m, num_warps=tiling.num_warps)
    else:  # split path: statistics, finalize (Eq. 2 and running stats), affine (Eq. 1)
        part = None
        if batch:
            part = torch.empty(3, tiling.n_split, C, dtype=torch.float32, device=x.device)
            _stats_kernel[(tiling.n_split, tiling.c_blocks)](
                x, part[0], part[1], part[2], C, tiling.M, S, tiling.s_blocks, *strides, tiling.n_tiles,
                tiling.tiles_per_prog, SPATIAL=tiling.spatial, LAYOUT=_layout(strides, C, S),
                BLOCK_C=tiling.block_c, BLOCK_M=tiling.block_m, num_warps=tiling.num_warps)
        _finalize_kernel[(cdiv(C, FIN_BLOCK_C),)](
            part[0] if batch else None, part[1] if batch else None, part[2] if batch else None,
            tiling.n_split, C, pt_mean, pt_var, run_m, run_v, beta_t, beta_stride, beta_val, weight, bias,
            mu, rstd, bmean, dmean, dvar, scale, shift, float(eps), float(momentum), n / max(n - 1, 1),
            **flags, BLOCK_C=FIN_BLOCK_C, BLOCK_S=FIN_BLOCK_S, num_warps=4)
        _affine_kernel[(tiling.n_tiles, tiling.c_blocks)](
            x, None, y, mu, scale, None, shift, C, tiling.M, S, tiling.s_blocks, *strides, 0, 0, 0, *y_strides,
            HAS_X=True, HAS_U=False, SPATIAL=tiling.spatial, X_LAYOUT=_layout(strides, C, S), U_LAYOUT=GENERAL,
            O_LAYOUT=_layout(y_strides, C, S), BLOCK_C=tiling.block_c, BLOCK_M=tiling.block_m,
            num_warps=tiling.num_warps)
    if update and run_m is not client_mean:  # strided running statistics: updated through a copy
        client_mean.copy_(run_m)
        client_var.copy_(run_v)
    return y, (mu, rstd, bmean, dmean, dvar)


def _backward(ctx, dy):
    """First-order gradients of x, beta, weight, bias with the Triton kernels."""
    x, weight, beta_t, _bias, mu, rstd, bmean, dmean, dvar = ctx.saved_tensors
    need_x = ctx.needs_input_grad[0]
    C = x.shape[1]
    S = math.prod(x.shape[2:])
    x, xs = _as_ncs(x)
    dy, ds = _as_ncs(dy)
    tiling = _Tiling(x.shape[0], C, S, xs, x.device)
    f32 = dict(dtype=torch.float32, device=x.device)
    out = torch.empty(6, C, **f32)
    dw, db, dbeta_c, kdy, kx, k0 = out.unbind(0)
    beta_arg = beta_t if beta_t is not None else ctx.beta_val
    bt, beta_stride, beta_val = _beta_args(beta_arg)
    flags = dict(MIX=ctx.mode == "mixed", BATCH=ctx.batch, BETA_T=bt is not None, HAS_W=weight is not None)
    dx, dxs = None, (0, 0, 0)
    if need_x:
        dx = torch.empty_like(x)
        dx, dxs = (dx, _ncs_strides(dx)) if _ncs_strides(dx) is not None else _as_ncs(dx.contiguous())
    if tiling.fused:
        _fused_backward_kernel[(tiling.c_blocks,)](
            x, dy, dx, mu, rstd, bmean, weight, bt, beta_stride, beta_val, dmean, dvar, dw, db, dbeta_c, C,
            tiling.M, float(tiling.M), S, *xs, *ds, *dxs, tiling.n_tiles, **flags, NEED_X=bool(need_x),
            X_LAYOUT=_layout(xs, C, S), D_LAYOUT=_layout(ds, C, S), O_LAYOUT=_layout(dxs, C, S),
            BLOCK_C=tiling.block_c, BLOCK_M=tiling.block_m, num_warps=tiling.num_warps)
        return _parameter_grads(ctx, dx, dbeta_c, dw, db, beta_t, weight)
    part = torch.empty(2, tiling.n_split, C, **f32)
    _grad_sums_kernel[(tiling.n_split, tiling.c_blocks)](
        x, dy, mu, rstd, part[0], part[1], C, tiling.M, S, tiling.s_blocks, *xs, *ds, tiling.n_tiles,
        tiling.tiles_per_prog, SPATIAL=tiling.spatial, X_LAYOUT=_layout(xs, C, S), D_LAYOUT=_layout(ds, C, S),
        BLOCK_C=tiling.block_c, BLOCK_M=tiling.block_m, num_warps=tiling.num_warps)
    _grad_finalize_kernel[(cdiv(C, FIN_BLOCK_C),)](
        part[0], part[1], tiling.n_split, C, float(tiling.M), weight, rstd, bt, beta_stride, beta_val,
        dmean, dvar, dw, db, dbeta_c, kdy, kx, k0, **flags, BLOCK_C=FIN_BLOCK_C, BLOCK_S=FIN_BLOCK_S, num_warps=4)
    if need_x:
        _affine_kernel[(tiling.n_tiles, tiling.c_blocks)](
            x, dy, dx, bmean, kx, kdy, k0, C, tiling.M, S, tiling.s_blocks, *xs, *ds, *dxs,
            HAS_X=ctx.batch, HAS_U=True, SPATIAL=tiling.spatial, X_LAYOUT=_layout(xs, C, S),
            U_LAYOUT=_layout(ds, C, S), O_LAYOUT=_layout(dxs, C, S), BLOCK_C=tiling.block_c,
            BLOCK_M=tiling.block_m, num_warps=tiling.num_warps)
    return _parameter_grads(ctx, dx, dbeta_c, dw, db, beta_t, weight)


def _parameter_grads(ctx, dx, dbeta_c, dw, db, beta_t, weight):
    """(dx, d beta, d gamma, d delta) in the inputs' shapes and dtypes, None where not needed."""
    _, need_beta, need_w, need_b = ctx.needs_input_grad[:4]
    g_beta = None
    if need_beta:
        g_beta = (dbeta_c.sum() if beta_t.numel() == 1 else dbeta_c).reshape(beta_t.shape).to(beta_t.dtype)
    g_w = dw.to(weight.dtype) if need_w else None
    g_b = db.to(ctx.bias_dtype) if need_b else None
    return dx, g_beta, g_w, g_b


def _backward_by_reference(ctx, dy):
    """Differentiable backward (create_graph=True): re-derive the gradients from the reference."""
    x, weight, beta_t, bias = ctx.saved_tensors[:4]
    pt_mean, pt_var, client_mean, client_var = ctx.stats
    if ctx.training:  # the batch statistics are recomputed; the running ones are not touched again
        client_mean = client_var = None
    beta = beta_t if beta_t is not None else ctx.beta_val
    inputs = [t for t, need in zip((x, beta_t, weight, bias), ctx.needs_input_grad[:4]) if need]
    with torch.enable_grad():
        y = reference.mixed_batch_norm(x, pt_mean, pt_var, client_mean, client_var, beta, weight, bias,
                                       ctx.training, ctx.momentum, ctx.eps, ctx.mode)
        grads = iter(torch.autograd.grad(y, inputs, dy, create_graph=True, allow_unused=True))
    return tuple(next(grads) if need else None for need in ctx.needs_input_grad[:4])


class _MixedBatchNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, beta_t, weight, bias, stats, beta_val, training, momentum, eps, mode):
        beta = beta_t if beta_t is not None else beta_val
        y, vectors = _forward(x, stats, beta, weight, bias, training, momentum, eps, mode)
        ctx.save_for_backward(x, weight, beta_t, bias, *vectors)
        pt_mean, pt_var, client_mean, client_var = stats
        if not training and client_mean is not None:  # keep the values read, for a re-derivation
            client_mean, client_var = client_mean.detach().clone(), client_var.detach().clone()
        ctx.stats = (pt_mean, pt_var, client_mean, client_var)
        ctx.beta_val, ctx.training, ctx.momentum, ctx.eps, ctx.mode = beta_val, training, momentum, eps, mode
        ctx.batch = mode == "batch" or training
        ctx.bias_dtype = bias.dtype if bias is not None else None
        return y

    @staticmethod
    def backward(ctx, dy):
        if torch.is_grad_enabled():
            grads = _backward_by_reference(ctx, dy)
        else:
            grads = _backward(ctx, dy)
        return (*grads, None, None, None, None, None, None)


def unsupported_reason(x, pt_mean, pt_var, client_mean, client_var, beta, weight, bias) -> str | None:
    """Why the Triton op cannot take these inputs (the dispatcher then uses the reference), or None."""
    if x.dtype not in SUPPORTED_DTYPES:
        return f"activation dtype {x.dtype} (supported: fp32, fp16, bf16)"
    if x.dim() < 2 or x.shape[0] * math.prod(x.shape[2:]) >= 2**31:
        return "more than 2^31 elements per channel"
    stats = [t for t in (pt_mean, pt_var, client_mean, client_var) if t is not None]
    if torch.is_grad_enabled() and any(t.requires_grad for t in stats):
        return "running statistics that require grad (the Triton op treats them as constants)"
    return None


def mixed_batch_norm(x, pt_mean, pt_var, client_mean, client_var, beta, weight, bias, training: bool,
                     momentum: float = 0.1, eps: float = 1e-5, mode: str = "mixed") -> torch.Tensor:
    """Triton twin of `pflkit.kernels.reference.mixed_batch_norm` (same signature and semantics)."""
    reference.check_mixed_batch_norm_args(x, pt_mean, pt_var, client_mean, client_var, beta, weight, bias,
                                          training, mode)
    reason = unsupported_reason(x, pt_mean, pt_var, client_mean, client_var, beta, weight, bias)
    if reason is not None:
        raise ValueError(f"mixed_batch_norm (triton): unsupported input: {reason}")
    if x.numel() == 0:
        return reference.mixed_batch_norm(x, pt_mean, pt_var, client_mean, client_var, beta, weight, bias,
                                          training, momentum, eps, mode)
    beta_t = beta if isinstance(beta, torch.Tensor) else None
    beta_val = 0.0 if beta_t is not None else float(beta)
    # Kernels index per-channel vectors densely; running stats stay the caller's objects
    # (updated in place, through a copy when they are strided).
    pt_mean, pt_var, weight, bias = (t if t is None or t.is_contiguous() else t.contiguous()
                                     for t in (pt_mean, pt_var, weight, bias))
    stats = (pt_mean, pt_var, client_mean, client_var)
    return _MixedBatchNorm.apply(x, beta_t, weight, bias, stats, beta_val, bool(training), float(momentum),
                                 float(eps), mode)
