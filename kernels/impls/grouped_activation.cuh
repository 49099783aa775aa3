/* impls/grouped_activation.cuh: activations of a grouped MLP and their
 * gradients
 *
 * Laid out as the bias addition of grouped_bias.cuh: the host splits every
 * group into tiles of act_tile_rows() rows and numbers the tiles of all groups
 * in one list (GmlpKernelActivationGroup.first_tile is a prefix sum), so
 * that blockIdx.x walks that list and the grid is spread evenly however MoE
 * routing split the rows. blockIdx.y walks strips of columns: a warp's 32
 * lanes cover kActLanes consecutive packs of one row (of out for the
 * forward pass, of d_out for the backward one), and the block's warps take
 * turns over the rows of the tile. A block finds its group with a binary
 * search of the table, which stays in L1 after the first blocks.
 *
 * Element-wise, so every element of out is written by the thread that read
 * the inputs it depends on: out may be an input of the same row width.
 *
 * The kernel of device-only sizes (impls/grouped_activation_device.cuh)
 * runs the same per-tile code over a table the device builds.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <math.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "gmlp-activation-numeric.h"
#include "impls/common.cuh"

namespace gmlp {

constexpr int kActThreads = 256;
constexpr int kActLanes = 32;
constexpr int kActWarps = kActThreads / kActLanes;
/* One aligned 16-byte access per pack in the vectorised kernels. */
constexpr int kActPackBytes = 16;
/* Rows of a tile, all loaded by a thread before any is computed. The
 * activation's arithmetic (an exp and a division per value, in software so
 * that every backend gives the same bits) costs about as much time as the
 * memory traffic, so what matters is that warps overlap one and the other.
 * The forward pass keeps 4 rows per thread (64 bytes per operand in
 * flight). The gated gradient reads three operands and needs about 120
 * registers at 4 rows, which leaves 2 blocks per SM: with 2 rows per thread
 * twice the warps share an SM and hide each other's arithmetic better, for
 * the same bytes in flight. */
__host__ __device__ constexpr int
act_tile_rows (bool backward)
{
  return backward ? 16 : 32;
}

static_assert (kActThreads % kActLanes == 0, "whole warps only");
static_assert (act_tile_rows (false) % kActWarps == 0 && act_tile_rows (true) % kActWarps == 0,
               "every warp gets the same rows");

struct GroupedActivationParams
{
  const GmlpKernelActivationGroup *groups;
  uint32_t                         n_groups;
  int64_t                          f;
  uint64_t                         n_tiles;
  uint64_t                         n_strips;   /* strips of kActLanes packs */
};

__host__ __device__ constexpr bool
is_gated_activation (int activation)
{
  return activation == GMLP_KERNEL_ACT_SWIGLU || activation == GMLP_KERNEL_ACT_GEGLU;
}

/* An input pack that this launch reads exactly once: marked evict-first, so
 * that streaming through the inputs does not push out of L2 the output the
 * next GEMM reads. (ld.global.cs is coherent, so in-place use stays safe.) */
template <typename PackType>
__device__ __forceinline__ PackType
act_load (const PackType *p)
{
  PackType out;

  if constexpr (sizeof (PackType) == 16)
    {
      const uint4 v = __ldcs ((const uint4 *) p);
      __builtin_memcpy (&out, &v, sizeof out);
    }
  else if constexpr (sizeof (PackType) == 4)
    {
      const unsigned int v = __ldcs ((const unsigned int *) p);
      __builtin_memcpy (&out, &v, sizeof out);
    }
  else
    {
      const unsigned short v = __ldcs ((const unsigned short *) p);
      __builtin_memcpy (&out, &v, sizeof out);
    }
  return out;
}

/* A pack of output, stored as an explicit global store with the default
 * write-back policy (the next GEMM reads it): out comes from the table, so
 * the compiler cannot tell its address space and would emit a generic
 * store. */
template <typename PackType>
__device__ __forceinline__ void
act_store (PackType *p, const PackType &value)
{
  if constexpr (sizeof (PackType) == 16)
    {
      uint4 v;
      __builtin_memcpy (&v, &value, sizeof v);
      __stwb ((uint4 *) p, v);
    }
  else if constexpr (sizeof (PackType) == 4)
    {
      unsigned int v;
      __builtin_memcpy (&v, &value, sizeof v);
      __stwb ((unsigned int *) p, v);
    }
  else
    {
      unsigned short v;
      __builtin_memcpy (&v, &value, sizeof v);
      __stwb ((unsigned short *) p, v);
    }
}

/* act(x) and act'(x) of the (ungated) function behind an activation, from
 * gmlp-activation-numeric.h: the same bits as the CPU backend and the fused
 * activation + quantization. Both are always computed: the compiler drops
 * whichever the caller ignores. */
struct ActValue
{
  float value;
  float grad;
};

template <int kActivation>
__device__ __forceinline__ ActValue
act_eval (float x)
{
  const GmlpActValue v = gmlp_act_eval (kActivation, x);

  return ActValue { v.value, v.grad };
}

/* The group that tile belongs to: the last one whose first tile is at or
 * before it (groups with no tiles share their first_tile with the next). */
__device__ __forceinline__ uint32_t
find_activation_group (const GmlpKernelActivationGroup *groups,
                       uint32_t                         n_groups,
                       uint64_t                         tile)
{
  uint32_t lo = 0, hi = n_groups - 1;

  while (lo < hi)
    {
      uint32_t mid = hi - (hi - lo) / 2;

      if (__ldg (&groups[mid].first_tile) <= tile)
        lo = mid;
      else
        hi = mid - 1;
    }
  return lo;
}

/* One tile of rows of one group, every strip of columns this block
 * walks: in, d_out and out point at the tile's first row (d_out backward
 * only), rows is at most act_tile_rows (kBackward). The packs of pack are those of
 * columns pack·kVector .. +kVector-1 of the f columns; for a gated row, b
 * and d_b lie f columns further on. Shared by the kernels of host sizes
 * and of device sizes, so both give the same bits. */
template <int kDtype, int kActivation, bool kBackward, int kVector>
__device__ __forceinline__ void
activation_tile (const StorageType<kDtype> *in,
                 const StorageType<kDtype> *d_out,
                 StorageType<kDtype>       *out,
                 int64_t                    rows,
                 uint64_t                   f,
                 uint64_t                   n_strips)
{
  using Type = StorageType<kDtype>;
  using TypePack = Pack<Type, kVector>;
  constexpr bool kGated = is_gated_activation (kActivation);
  /* Arrays of operands this instance does not use shrink to one pack that
   * is never touched. */
  constexpr int kRows = act_tile_rows (kBackward) / kActWarps;
  constexpr int kGateRows = kGated ? kRows : 1;
  constexpr int kGradRows = kBackward ? kRows : 1;

  const int lane = threadIdx.x % kActLanes;
  const int warp = threadIdx.x / kActLanes;
  const uint64_t packs_per_row = f / kVector;
  /* Leading dimensions: in is 2f wide when gated, and so is the gradient
   * with respect to it. */
  const uint64_t in_cols = kGated ? 2 * f : f;
  const uint64_t out_cols = kBackward ? in_cols : f;

  for (uint64_t strip = blockIdx.y; strip < n_strips; strip += gridDim.y)
    {
      const uint64_t pack = strip * kActLanes + lane;
      TypePack a[kRows];
      TypePack b[kGateRows];
      TypePack dy[kGradRows];

      if (pack >= packs_per_row)
        continue;

#pragma unroll
      for (int u = 0; u < kRows; u++)
        {
          const uint64_t r = (uint64_t) (warp + u * kActWarps);
          const Type *const row = in + r * in_cols;

          if ((int64_t) r >= rows)
            continue;
          a[u] = act_load ((const TypePack *) row + pack);
          if constexpr (kGated)
            b[u] = act_load ((const TypePack *) (row + f) + pack);
          if constexpr (kBackward)
            dy[u] = act_load ((const TypePack *) (d_out + r * f) + pack);
        }

#pragma unroll
      for (int u = 0; u < kRows; u++)
        {
          const uint64_t r = (uint64_t) (warp + u * kActWarps);
          Type *const row = out + r * out_cols;
          TypePack o;

          if ((int64_t) r >= rows)
            continue;

          if constexpr (!kBackward)
            {
#pragma unroll
              for (int e = 0; e < kVector; e++)
                {
                  float y = act_eval<kActivation> (to_float<kDtype> (a[u].v[e])).value;

                  if constexpr (kGated)
                    y *= to_float<kDtype> (b[u].v[e]);
                  o.v[e] = from_float<kDtype> (y);
                }
              act_store ((TypePack *) row + pack, o);
            }
          else if constexpr (!kGated)
            {
#pragma unroll
              for (int e = 0; e < kVector; e++)
                {
                  const float grad = act_eval<kActivation> (to_float<kDtype> (a[u].v[e])).grad;

                  o.v[e] = from_float<kDtype> (to_float<kDtype> (dy[u].v[e]) * grad);
                }
              act_store ((TypePack *) row + pack, o);
            }
          else
            {
              TypePack o_b;

#pragma unroll
              for (int e = 0; e < kVector; e++)
                {
                  const ActValue act = act_eval<kActivation> (to_float<kDtype> (a[u].v[e]));
                  const float d = to_float<kDtype> (dy[u].v[e]);

                  o.v[e] = from_float<kDtype> (d * to_float<kDtype> (b[u].v[e]) * act.grad);
                  o_b.v[e] = from_float<kDtype> (d * act.value);
                }
              act_store ((TypePack *) row + pack, o);
              act_store ((TypePack *) (row + f) + pack, o_b);
            }
        }
    }
}

/* One kernel for every (dtype, activation, direction, vector width), over
 * the tiles of the host's table. */
template <int kDtype, int kActivation, bool kBackward, int kVector>
__global__ void __launch_bounds__ (kActThreads)
activation_kernel (const __grid_constant__ GroupedActivationParams params)
{
  using Type = StorageType<kDtype>;
  constexpr bool kGated = is_gated_activation (kActivation);

  constexpr int64_t kTileRows = act_tile_rows (kBackward);
  const uint64_t f = (uint64_t) params.f;
  const uint64_t in_cols = kGated ? 2 * f : f;
  const uint64_t out_cols = kBackward ? in_cols : f;

  for (uint64_t tile = blockIdx.x; tile < params.n_tiles; tile += gridDim.x)
    {
      const uint32_t g = find_activation_group (params.groups, params.n_groups, tile);
      const GmlpKernelActivationGroup group = params.groups[g];
      const int64_t first_row = (int64_t) (tile - group.first_tile) * kTileRows;
      const int64_t rows = group.rows - first_row < kTileRows ? group.rows - first_row : kTileRows;
      const Type *const in = (const Type *) group.in + (uint64_t) first_row * in_cols;
      const Type *const d_out = kBackward ?
                                (const Type *) group.d_out + (uint64_t) first_row * f : nullptr;
      Type *const out = (Type *) group.out + (uint64_t) first_row * out_cols;

      activation_tile<kDtype, kActivation, kBackward, kVector> (in, d_out, out, rows, f, params.n_strips);
    }
}

/* The instance of a kernel template for a call's dtype, activation,
 * direction and vector width (16-byte packs, or one value): Instances::
 * get<kDtype, kActivation, kBackward, kVector> () names it, so that the
 * kernels of host and of device sizes pick theirs the same way. nullptr
 * for a dtype or activation without kernels. */
template <typename Instances, int kDtype, int kActivation>
typename Instances::Kernel
pick_activation_instance (bool backward, bool vectorised)
{
  constexpr int kVector = kActPackBytes / (int) sizeof (StorageType<kDtype>);

  if (backward)
    return vectorised ? Instances::template get<kDtype, kActivation, true, kVector> () :
                        Instances::template get<kDtype, kActivation, true, 1> ();
  return vectorised ? Instances::template get<kDtype, kActivation, false, kVector> () :
                      Instances::template get<kDtype, kActivation, false, 1> ();
}

template <typename Instances, int kDtype>
typename Instances::Kernel
pick_activation_instance (int activation, bool backward, bool vectorised)
{
  switch (activation)
    {
    case GMLP_KERNEL_ACT_GELU:
      return pick_activation_instance<Instances, kDtype, GMLP_KERNEL_ACT_GELU> (backward, vectorised);
    case GMLP_KERNEL_ACT_RELU:
      return pick_activation_instance<Instances, kDtype, GMLP_KERNEL_ACT_RELU> (backward, vectorised);
    case GMLP_KERNEL_ACT_SRELU:
      return pick_activation_instance<Instances, kDtype, GMLP_KERNEL_ACT_SRELU> (backward, vectorised);
    case GMLP_KERNEL_ACT_SWIGLU:
      return pick_activation_instance<Instances, kDtype, GMLP_KERNEL_ACT_SWIGLU> (backward, vectorised);
    case GMLP_KERNEL_ACT_GEGLU:
      return pick_activation_instance<Instances, kDtype, GMLP_KERNEL_ACT_GEGLU> (backward, vectorised);
    default:
      return nullptr;
    }
}

template <typename Instances>
typename Instances::Kernel
select_activation_instance (int dtype, int activation, bool backward, bool vectorised)
{
  switch (dtype)
    {
    case GMLP_NUM_FLOAT32:
      return pick_activation_instance<Instances, GMLP_NUM_FLOAT32> (activation, backward, vectorised);
    case GMLP_NUM_FLOAT16:
      return pick_activation_instance<Instances, GMLP_NUM_FLOAT16> (activation, backward, vectorised);
    case GMLP_NUM_BFLOAT16:
      return pick_activation_instance<Instances, GMLP_NUM_BFLOAT16> (activation, backward, vectorised);
    default:
      return nullptr;
    }
}

inline bool
is_activation_dtype (int dtype)
{
  return dtype == GMLP_NUM_FLOAT32 || dtype == GMLP_NUM_FLOAT16 || dtype == GMLP_NUM_BFLOAT16;
}

inline bool
is_activation (int activation)
{
  return activation >= GMLP_KERNEL_ACT_GELU && activation <= GMLP_KERNEL_ACT_GEGLU;
}

}  // namespace gmlp
