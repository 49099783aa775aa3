/* impls/sm90_gemm_heuristics.cuh: the Hopper grouped GEMM's choices,
 * made on the host from the problem alone
 *
 * Pure functions of the product (GmlpKernelDeviceGemm), the forced
 * choices of a tuning (GmlpKernelSm90Tuning) and the SM count: the
 * kernel instance (operand types, tile width), short tiles, paired CTAs,
 * even waves, the stream-k tail split and the bounds of the direct
 * schedule. Each rule says its reason beside it. grouped_gemm_sm90.cu
 * checks and launches by them.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "gmlp-kernels.h"
#include "impls/sm90_gemm_schedule.cuh"

namespace gmlp {
namespace sm90 {

/* The columns of the row-grouped operand a, of rows2 (c_rows or b_rows)
 * and of the output; the reduction length when it is fixed. */
struct Extents
{
  int64_t a_cols;
  int64_t rows2_cols;
  int64_t out_cols;
  int64_t reduction;
};

inline Extents
extents_of (const GmlpKernelDeviceGemm *g)
{
  switch (g->kind)
    {
    case GMLP_KERNEL_GEMM_FPROP: return { g->k, g->n, g->n, g->k };
    case GMLP_KERNEL_GEMM_DGRAD: return { g->n, g->k, g->k, g->n };
    case GMLP_KERNEL_GEMM_WGRAD:
    default:                     return { g->n, g->k, g->k, 0 };
    }
}

inline bool
blockwise (const GmlpKernelDeviceGemm *g)
{
  return g->a_scales.row_block != 0 || g->b_scales.row_block != 0;
}

/* The tuning of a call that passed none: every choice the heuristics'. */
inline const GmlpKernelSm90Tuning kNoTuning = {};

/* Where a tuning forces choice, its answer; else the heuristic's. */
inline bool
choose (GmlpKernelChoice choice, bool heuristic)
{
  return choice == GMLP_KERNEL_CHOICE_AUTO ? heuristic : choice == GMLP_KERNEL_CHOICE_ALWAYS;
}

/* Whether an FP8 product takes the wide instances' 128 × 192 tiles
 * (Config), per-tensor or blockwise: WGRAD always, FPROP and DGRAD where
 * padding the output's columns to 192 adds at most 1/25 of them (the
 * narrow tiles won where it added 1/8: small-e64's 1024 columns). Wider
 * tiles read A fewer times, which pays wherever the padding is small, in
 * every direction and in both per-tensor and blockwise scaling.
 * The tuning's fp8_tile_n forces one width (the tests run both). */
inline bool
wide_tiles (const GmlpKernelDeviceGemm *g, const GmlpKernelSm90Tuning &t)
{
  const int64_t block_n = Config<kOpsE4m3E4m3Wide>::kBlockN;
  const int64_t out_cols = extents_of (g).out_cols;
  const int64_t padded = div_up (out_cols, block_n) * block_n;

  if (t.fp8_tile_n != 0)
    return t.fp8_tile_n == block_n;
  return g->kind == GMLP_KERNEL_GEMM_WGRAD || 25 * (padded - out_cols) <= out_cols;
}

/* The kernel instance's operand types (Operands), or -1 for a pair it
 * does not multiply. */
inline int
operands_of (const GmlpKernelDeviceGemm *g, const GmlpKernelSm90Tuning &t)
{
  const bool blocks = blockwise (g);
  int pair;

  if (!gmlp_num_dtype_is_fp8 (g->ab_dtype))
    return g->ab_dtype == GMLP_NUM_BFLOAT16 ? kOpsBf16 :
           g->ab_dtype == GMLP_NUM_FLOAT16 ? kOpsFp16 : -1;
  if (g->ab_dtype == GMLP_NUM_FLOAT8_E4M3 && g->b_dtype == GMLP_NUM_FLOAT8_E4M3)
    pair = blocks ? kOpsE4m3E4m3Blocks : kOpsE4m3E4m3;
  else if (g->ab_dtype == GMLP_NUM_FLOAT8_E4M3 && g->b_dtype == GMLP_NUM_FLOAT8_E5M2)
    pair = blocks ? -1 : kOpsE4m3E5m2;
  else if (g->ab_dtype == GMLP_NUM_FLOAT8_E5M2 && g->b_dtype == GMLP_NUM_FLOAT8_E4M3)
    pair = blocks ? kOpsE5m2E4m3Blocks : kOpsE5m2E4m3;
  else
    return -1;
  if (wide_tiles (g, t))
    pair += kWideOffset;
  return pair;
}

/* The longest reduction (K of FPROP, N of DGRAD) for which the 16-bit
 * kernels leave a short tile's second consumer idle (IdleHalves): they pay
 * on short reductions and cost on long ones. A CTA that finishes a short
 * tile early falls out of step with the CTAs that share its operands, whose
 * stages then miss in L2: more DRAM reads, and a lower clock at the power
 * limit. Measured on skewed routing: idle halves gain at K 1024, are level
 * at K 2048 and lose at K 7168. */
constexpr int64_t kIdleHalvesMaxReduction = 1024;

/* Whether a product's group's last tile of 64 rows or fewer is a short
 * tile (GemmParams::short_tiles): always for FP8 (both consumers take half
 * its columns), for 16-bit operands (idle halves) when the reduction is at
 * most kIdleHalvesMaxReduction. For comparisons in benchmarks, the
 * tuning's short_tiles NEVER computes every such tile as a whole 128-row
 * one, both consumers busy, and ALWAYS gives the 16-bit kernels idle
 * halves on every reduction. */
inline bool
short_tiles_on (const GmlpKernelSm90Tuning &t, bool fp8, int64_t reduction)
{
  if (t.short_tiles == GMLP_KERNEL_CHOICE_NEVER)
    return false;
  return fp8 || t.short_tiles == GMLP_KERNEL_CHOICE_ALWAYS || reduction <= kIdleHalvesMaxReduction;
}

inline int
block_n_of (const GmlpKernelDeviceGemm *g, const GmlpKernelSm90Tuning &t)
{
  const int ops = operands_of (g, t);

  if (ops == kOpsBf16 || ops == kOpsFp16)
    return Config<kOpsBf16>::kBlockN;
  return ops_wide (ops) ? Config<kOpsE4m3E4m3Wide>::kBlockN : Config<kOpsE4m3E4m3>::kBlockN;
}

/* The reduction elements of a stage (every FP8 instance's are the same). */
inline int
block_k_of (const GmlpKernelDeviceGemm *g)
{
  return gmlp_num_dtype_is_fp8 (g->ab_dtype) ? Config<kOpsE4m3E4m3>::kBlockK : Config<kOpsBf16>::kBlockK;
}

/* Blockwise FP8 takes the direct schedule for products of at most this
 * many multiply-adds (by the rows A can hold), where its instance can
 * (direct_capable(): 128 × 128 tiles): on a small product the plan's
 * launch is a large part of the call (small-e64's fprop, 2^33). */
constexpr double kBlockwiseDirectMaxMacs = 0x1p34;

/* 16-bit DGRAD (B MN-major) takes the direct schedule for products of at
 * most this many multiply-adds too; larger ones run faster after the plan
 * (qwen3-fc1, 2^36.6, clearly; the larger shapes a little), smaller ones
 * direct, where the plan's launch is a large part of the call (small-e64,
 * 2^33). FPROP and FP8 DGRAD (K-major operands) read level or better
 * direct. */
constexpr double kDgrad16DirectMaxMacs = 0x1p34;

/* Whether the direct schedule's CTAs run in pairs that share B's tiles
 * (for the instances that can, Pairable): products of at least
 * kPairedTilesPerSm output tiles an SM at the capacity's rows and
 * kPairedStages stages of reduction; the tuning's pairs NEVER or ALWAYS for
 * none or all that can (the tests run both). Pairs halve B's traffic from L2,
 * which pays on long products (most on skewed routing); on short
 * reductions (16 stages) and few tiles an SM (4) they cost more than they
 * save, hence both bounds. */
constexpr int64_t kPairedTilesPerSm = 8;
constexpr int64_t kPairedStages = 32;

/* Whether an FPROP or DGRAD has at least kPairedTilesPerSm output tiles
 * an SM at the capacity's rows (as many as the sizes can make, where every
 * group's rows fill whole tiles) and kPairedStages stages of reduction. */
inline bool
long_product (const GmlpKernelDeviceGemm *g, int block_n, int n_sms)
{
  const Extents e = extents_of (g);
  const int64_t tiles = div_up (g->row_capacity, (int64_t) kBlockM) * div_up (e.out_cols, (int64_t) block_n);

  return tiles >= kPairedTilesPerSm * n_sms && div_up (e.reduction, (int64_t) block_k_of (g)) >= kPairedStages;
}

inline bool
pairs_pay (const GmlpKernelDeviceGemm *g, const GmlpKernelSm90Tuning &t, int block_n, int n_sms)
{
  if (!pairable (operands_of (g, t), g->kind))
    return false;
  return choose (t.pairs, long_product (g, block_n, n_sms));
}

/* Whether the kernel runs on as few CTAs as keep its waves
 * (working_ctas()), where its instance can (even_waves_capable()): the
 * long products, as for paired CTAs: at the power limit, SMs that work
 * the whole kernel on an even share cost less than a last wave of SMs
 * working alone (a product of 21.3 waves gains). Small products, bound by
 * latency and bandwidth, which fewer SMs have less of, lose, hence the
 * rule. The tuning's even_waves NEVER or ALWAYS for none or all that can. */
inline bool
even_waves (const GmlpKernelDeviceGemm *g, const GmlpKernelSm90Tuning &t, int block_n, int n_sms)
{
  if (!even_waves_capable (operands_of (g, t), g->kind))
    return false;
  return choose (t.even_waves, long_product (g, block_n, n_sms));
}

/* The CTAs of a launch on n_sms SMs: all of them, or the tuning's
 * max_ctas (even, at least 2; for the tests, which thus make several
 * waves of small products). */
inline int
grid_ctas (const GmlpKernelSm90Tuning &t, int n_sms)
{
  const int cap = t.max_ctas >= 2 ? t.max_ctas & ~1 : 0;

  return cap > 0 && cap < n_sms ? cap : n_sms;
}

/* Whether an FPROP or DGRAD on the direct schedule may split its tail's
 * reductions (TailSplit, for the instances that can: stream_k_capable()):
 * 16-bit long products, as for paired CTAs and even waves;
 * the tuning's stream_k NEVER or ALWAYS for none or all that can (the tests run
 * both). The kernel splits only where a last partial wave holds at most
 * half a wave (plan_tail_split()). Against even waves alone, the split
 * pays on 16-bit products and costs per-tensor FP8 a little at the power
 * limit, so FP8 splits only where forced. */
inline bool
stream_k_pays (const GmlpKernelDeviceGemm *g, const GmlpKernelSm90Tuning &t, int block_n, int n_sms)
{
  const int ops = operands_of (g, t);

  if (ops < 0 || !stream_k_capable (ops, g->kind))
    return false;
  return choose (t.stream_k, !gmlp_num_dtype_is_fp8 (g->ab_dtype) && long_product (g, block_n, n_sms));
}

}  // namespace sm90
}  // namespace gmlp
