/* impls/grouped_gemm_sm90.cuh: libgmlp's Hopper grouped GEMM, sizes on the device
 *
 * Two launches, neither of which needs the host to know the group sizes,
 * or for FPROP and DGRAD on packed operands the second alone (the direct
 * schedule, DirectSchedule):
 *
 * 1. The plan (one block, grouped_gemm_sm90.cu): scans the device sizes
 *    into each group's member offsets, clamped rows and first output tile,
 *    and writes three TMA tensor maps per group (A, B, C) into the
 *    workspace, copies of the host-built templates edited on the device
 *    (tensormap.replace) to point at the group's matrices with the group's
 *    row count. Rows past a group's end then read as zeros and are not
 *    written, which is what makes any row count work without padding. The
 *    GEMM is launched as its programmatic dependent.
 *
 * 2. The persistent GEMM (one CTA per SM): CTA b takes tiles b, b + grid,
 *    ... of the list of all groups' output tiles. Per CTA, warpgroup 0 is
 *    the producer: its warp finds each tile's group by walking the plan's
 *    tile offsets (or the sizes themselves; each consumer warp walks the
 *    same way), and one thread issues the TMA copies of A and B tiles into
 *    a kStages-deep shared-memory ring, each stage guarded by a "full"
 *    mbarrier (copy bytes landed) and an "empty" one (both consumers
 *    done). With blockwise FP8 scales, two more of its warps copy the
 *    scales into a ring of their own (kScaleDepth stages at a time).
 *    Warpgroups 1 and 2 are the consumers: each multiplies one 64-row half
 *    of the output tile (16-bit: 128 × 256; FP8: 128 × 128 or 128 × 192,
 *    Config) with wgmma (FP32 accumulators in registers) and hands it,
 *    bias added, to TMA stores (reduce-add for an accumulating FP32
 *    output) that drain while the next tile computes; the producer is
 *    already filling the ring for that tile. Large per-tensor FP8
 *    products on the wide tiles run in clusters of two CTAs that share B's
 *    tiles (TMA multicast; Pairable).
 *    A group's last row tile, where it holds 64 rows or fewer, is a short
 *    tile: with per-tensor FP8 both consumers take its 64 rows, half the
 *    columns each (of 192 columns, 128 and 64); in the 16-bit kernels the
 *    first consumer takes them while the second stands idle (IdleHalves).
 *
 * Layouts (C = A · Bᵀ, reduction over r, every matrix row-major):
 *   FPROP  A = x_g   [m × k]  K-major    B = W_g  [n × k]  K-major
 *   DGRAD  A = dy_g  [m × n]  K-major    B = W_g  [n × k]  MN-major
 *   WGRAD  A = dy_g  [m × n]  MN-major   B = x_g  [m × k]  MN-major
 * K-major tiles arrive as one box of 64 reduction elements × rows; MN-major
 * tiles as 64-element chunks of M or N × 64 reduction rows. Both use the
 * 128-byte swizzle that wgmma reads directly.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "impls/device_cache.cuh"
#include "impls/sm90_gemm_config.cuh"
#include "impls/sm90_gemm_schedule.cuh"
#include "impls/sm90_gemm_producer.cuh"
#include "impls/sm90_gemm_epilogue.cuh"
#include "impls/sm90_gemm_consumer.cuh"

namespace gmlp {
namespace sm90 {

template <int kOps, int kKind>
__global__ void __launch_bounds__ (kThreads, 1)
gemm_kernel (const __grid_constant__ GemmParams p)
{
  using Cfg = Config<kOps>;
  constexpr int kStages = Ring<kOps, kKind>::kStages;
  extern __shared__ uint8_t smem_raw[];
  uint8_t *ring = reinterpret_cast<uint8_t *> (
    (reinterpret_cast<uintptr_t> (smem_raw) + 1023) & ~(uintptr_t) 1023);
  float *staging = reinterpret_cast<float *> (ring + kStages * Cfg::kStageBytes);
  uint64_t *full = reinterpret_cast<uint64_t *> (ring + kStages * Cfg::kStageBytes +
                                                 kConsumers * Cfg::kEpilogueBytes);
  uint64_t *empty = full + kStages;
  uint64_t *scale_full = empty + kStages;
  uint64_t *scale_empty = scale_full + Cfg::kScaleBufs;
  float *scales = reinterpret_cast<float *> (scale_empty + Cfg::kScaleBufs);
  ScaleBlocks sb = { scales + kStages * Cfg::kScaleSlot, scale_full, scale_empty, 0 };
  /* Broadcast, so that the compiler knows it is the same across a warp
   * and keeps what derives from it (the consumers' wgmma descriptors) in
   * uniform registers. */
  const int warpgroup = __shfl_sync (0xffffffffu, threadIdx.x / 128, 0);

  if (threadIdx.x == 0)
    {
      /* A stage is full once the producer's leader has armed it for the
       * operands' bytes (copied per-tensor scales: and its copies have
       * landed); both consumers give it back. A blockwise scale buffer is
       * full once the scale warps' lanes' copies have landed; the
       * consumers' 256 threads give it back. */
      for (int s = 0; s < kStages; s++)
        {
          mbarrier_init (&full[s], copies_tile_scales<kOps, kKind> (p) ? 2 : 1);
          mbarrier_init (&empty[s], kConsumers * (paired<kOps, kKind> () ? 2 : 1));
        }
      for (int b = 0; b < Cfg::kScaleBufs; b++)
        {
          mbarrier_init (&scale_full[b], 32 * kScaleWarps);
          mbarrier_init (&scale_empty[b], 128 * kConsumers);
        }
      mbarrier_init_fence ();
    }
  /* Paired CTAs: the partner's barriers are ready before anything of
   * this CTA's reaches them. */
  if (paired<kOps, kKind> ())
    cluster_sync ();
  else
    __syncthreads ();
  /* Launched as a programmatic dependent (of the plan, or on the direct
   * schedule of whatever came before): what it wrote is read from here on. */
  grid_dependency_wait ();
  /* The stream-K tail's split (TailSplit), or none. Every warp works it
   * out (a warp alone, diverged from the others, made ptxas spill the
   * consumers' sums); a split tail takes every CTA of the grid. */
  bool split = false;

  if constexpr (StreamKCapable<kOps, kKind>::value)
    {
      const TailSplit mine = p.stream_k ? plan_tail_split<kOps, kKind> (p) : TailSplit { UINT32_MAX, 0, 0, 0 };

      if (threadIdx.x == 0)
        tail_split = mine;
      __syncthreads ();
      split = mine.whole_tiles != UINT32_MAX;
    }
  /* (Each warp counts for itself: the sizes are read-only, and hit in L1.) */
  const uint32_t ctas = split ? gridDim.x : working_ctas<kOps, kKind> (p);

  if (warpgroup == 0)
    {
      const int warp = threadIdx.x / 32;

      registers_decrease<Ring<kOps, kKind>::kProducerRegs> ();
      if (warp == 0)
        {
          produce<kOps, kKind> (p, ctas, ring, scales, full, empty);
        }
      else if constexpr (Cfg::kBlockScaled)
        {
          if (warp <= kScaleWarps)
            produce_scales<kOps, kKind> (p, ctas, sb, warp - 1);
        }
    }
  else
    {
      registers_increase<Ring<kOps, kKind>::kConsumerRegs> ();
      consume<kOps, kKind> (p, ctas, ring, scales, sb, full, empty,
                            staging + (warpgroup - 1) * (Cfg::kEpilogueBytes / 4), warpgroup - 1);
    }
  /* Paired CTAs: neither leaves while the other's consumers may still
   * give stages back to it. */
  if (paired<kOps, kKind> ())
    cluster_sync ();
}

}  // namespace sm90
}  // namespace gmlp

namespace gmlp {
namespace sm90 {

/* Enqueues gemm_kernel<kOps, kKind>; the instances are spread over files
 * of their own (grouped_gemm_sm90_<kind>.cu) so that they compile in
 * parallel. FP8 DGRAD runs the FPROP instance: with K-major operands the
 * two differ only in the bias, which DGRAD never has. */
template <int kOps, int kKind>
GmlpKernelStatus launch_gemm (const GemmParams &params, int n_sms, cudaStream_t stream);

/* The launch attribute of clusters of two CTAs along x (paired CTAs). */
inline cudaLaunchAttribute
pair_clusters ()
{
  cudaLaunchAttribute attribute;

  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = 2;
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  return attribute;
}

/* Whether gemm_kernel<kOps, kKind> can run in clusters of two CTAs
 * (Pairable): an even n_sms, and that many CTAs fitting at once in pairs
 * (on the H200, 66 pairs on its 132 SMs). The count of pairs that fit is
 * asked once per instance and device (current_max_clusters()). */
template <int kOps, int kKind>
bool
pairs_fit (int n_sms)
{
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute attribute = pair_clusters ();
  int fit = 0;

  if (!Pairable<kOps, kKind>::value || n_sms % 2 != 0)
    return false;
  config.gridDim = dim3 (n_sms);
  config.blockDim = dim3 (kThreads);
  config.dynamicSmemBytes = Ring<kOps, kKind>::kSmemBytes;
  config.attrs = &attribute;
  config.numAttrs = 1;
  if (current_max_clusters ((const void *) gemm_kernel<kOps, kKind>, &config, 2, &fit) !=
      cudaSuccess)
    {
      (void) cudaGetLastError ();
      fit = 0;
    }
  return 2 * fit >= n_sms;
}

#define GMLP_SM90_DEFINE_LAUNCH(kOpsArg, kKindArg)                                  \
  template <>                                                                       \
  GmlpKernelStatus                                                                  \
  launch_gemm<kOpsArg, kKindArg> (const GemmParams &params, int n_sms,              \
                                  cudaStream_t stream)                              \
  {                                                                                 \
    cudaLaunchConfig_t config = {};                                                 \
    cudaLaunchAttribute attributes[2];                                              \
    cudaError_t err;                                                                \
                                                                                    \
    /* Once per device: the attribute belongs to the device's context. */           \
    err = current_max_dynamic_smem ((const void *) gemm_kernel<kOpsArg, kKindArg>,  \
                                    (Ring<kOpsArg, kKindArg>::kSmemBytes));         \
    if (err != cudaSuccess)                                                         \
      return record_cuda_error (err);                                               \
    /* A dependent of the plan (programmatic stream serialization): its CTAs     \
     * set up while the plan runs. */                                               \
    attributes[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;          \
    attributes[0].val.programmaticStreamSerializationAllowed = 1;                   \
    config.numAttrs = 1;                                                            \
    if (params.pairs && pairs_fit<kOpsArg, kKindArg> (n_sms))                       \
      {                                                                             \
        attributes[1] = pair_clusters ();                                           \
        config.numAttrs = 2;                                                        \
      }                                                                             \
    config.gridDim = dim3 (n_sms);                                                  \
    config.blockDim = dim3 (kThreads);                                              \
    config.dynamicSmemBytes = Ring<kOpsArg, kKindArg>::kSmemBytes;                  \
    config.stream = stream;                                                         \
    config.attrs = attributes;                                                      \
    err = cudaLaunchKernelEx (&config, gemm_kernel<kOpsArg, kKindArg>, params);      \
    if (err != cudaSuccess)                                                         \
      return record_cuda_error (err);                                               \
    return check_launch ();                                                         \
  }

}  // namespace sm90
}  // namespace gmlp
