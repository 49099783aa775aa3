/* impls/grouped_bias.cuh: bias addition and bias gradient of a grouped tensor
 *
 * The host splits every group into tiles of rows and numbers the tiles of
 * all groups in one list (GmlpKernelBiasGroup.first_tile is a prefix sum),
 * so that blockIdx.x walks that list and the grid is spread evenly however
 * MoE routing split the rows. blockIdx.y walks strips of columns: a warp's
 * 32 lanes cover kBiasLanes consecutive packs of one row, and the block's
 * warps take turns over the rows of the tile. A block finds its group with a
 * binary search of the table, which stays in L1 after the first blocks.
 *
 * Bias addition is element-wise. The bias gradient keeps one FP32 sum per
 * column in each thread, adds the warps' sums in warp order through shared
 * memory, and, for a group spanning several tiles, leaves one partial sum
 * per tile in a scratch buffer that a second kernel adds up in tile order:
 * no atomics, so every run gives the same bits.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "impls/common.cuh"

namespace gmlp {

constexpr int kBiasThreads = 256;
constexpr int kBiasLanes = 32;
constexpr int kBiasWarps = kBiasThreads / kBiasLanes;
/* One aligned 16-byte access per pack in the vectorised kernels. */
constexpr int kBiasPackBytes = 16;

/* Rows of an addition tile: 8 rows per thread, all loaded before any is
 * stored, to keep 128 bytes per thread in flight. */
constexpr int kAddBiasTileRows = 64;
/* Rows of a gradient tile. Large enough that a group of 65536 rows leaves
 * only 128 partial sums per column for the second pass (under 1% of the
 * traffic of reading the input), small enough that a few hundred rows per
 * group still give every SM work. */
constexpr int kBiasGradTileRows = 512;
/* Packs a gradient thread loads before adding any of them. */
constexpr int kBiasGradUnroll = 8;

static_assert (kBiasThreads % kBiasLanes == 0, "whole warps only");
static_assert (kAddBiasTileRows % kBiasWarps == 0, "every warp gets the same rows");
static_assert (kBiasGradTileRows % (kBiasWarps * kBiasGradUnroll) == 0,
               "full tiles need no remainder loop");

struct GroupedBiasParams
{
  const GmlpKernelBiasGroup *groups;
  uint32_t                   n_groups;
  int64_t                    cols;
  uint64_t                   n_tiles;
  uint64_t                   n_strips;   /* strips of kBiasLanes packs */
  float                     *scratch;    /* gradient: n_tiles × cols partial sums */
};

/* The group that tile belongs to: the last one whose first tile is at or
 * before it (groups with no tiles share their first_tile with the next). */
__device__ __forceinline__ uint32_t
find_group (const GmlpKernelBiasGroup *groups,
            uint32_t                   n_groups,
            uint64_t                   tile)
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

/* A pack of input that is read exactly once: a global load marked
 * evict-first, so that streaming through a large matrix does not push the
 * group table and the bias vectors out of the caches. */
template <typename PackType>
__device__ __forceinline__ PackType
load_once (const PackType *p)
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

template <int kDtype, int kVector>
__global__ void __launch_bounds__ (kBiasThreads)
add_bias_kernel (const __grid_constant__ GroupedBiasParams params)
{
  using Type = StorageType<kDtype>;
  using TypePack = Pack<Type, kVector>;
  constexpr int kRowsPerThread = kAddBiasTileRows / kBiasWarps;

  const int lane = threadIdx.x % kBiasLanes;
  const int warp = threadIdx.x / kBiasLanes;
  const uint64_t cols = (uint64_t) params.cols;
  const uint64_t packs_per_row = cols / kVector;

  for (uint64_t tile = blockIdx.x; tile < params.n_tiles; tile += gridDim.x)
    {
      const uint32_t g = find_group (params.groups, params.n_groups, tile);
      const int64_t group_rows = params.groups[g].rows;
      const int64_t first_row = (int64_t) (tile - params.groups[g].first_tile) * kAddBiasTileRows;
      const int64_t rows = group_rows - first_row < kAddBiasTileRows ?
                           group_rows - first_row : kAddBiasTileRows;
      Type *const matrix = (Type *) params.groups[g].matrix + (uint64_t) first_row * cols;
      const TypePack *const bias = (const TypePack *) params.groups[g].vector;

      for (uint64_t strip = blockIdx.y; strip < params.n_strips; strip += gridDim.y)
        {
          const uint64_t pack = strip * kBiasLanes + lane;
          TypePack in[kRowsPerThread];
          float b[kVector];

          if (pack >= packs_per_row)
            continue;

          {
            const TypePack bias_pack = bias[pack];
#pragma unroll
            for (int e = 0; e < kVector; e++)
              b[e] = to_float<kDtype> (bias_pack.v[e]);
          }

#pragma unroll
          for (int u = 0; u < kRowsPerThread; u++)
            {
              const int64_t r = warp + u * kBiasWarps;
              if (r < rows)
                in[u] = ((const TypePack *) (matrix + (uint64_t) r * cols))[pack];
            }
#pragma unroll
          for (int u = 0; u < kRowsPerThread; u++)
            {
              const int64_t r = warp + u * kBiasWarps;
              TypePack out;

              if (r >= rows)
                continue;
#pragma unroll
              for (int e = 0; e < kVector; e++)
                out.v[e] = from_float<kDtype> (to_float<kDtype> (in[u].v[e]) + b[e]);
              ((TypePack *) (matrix + (uint64_t) r * cols))[pack] = out;
            }
        }
    }
}

/* Adds kVector columns of pack over the rows of this warp: warp,
 * warp + kBiasWarps, ... below rows, in that order. */
template <int kDtype, int kVector>
__device__ __forceinline__ void
sum_rows (const StorageType<kDtype> *matrix,
          uint64_t                   cols,
          uint64_t                   pack,
          int64_t                    rows,
          int                        warp,
          float                    (&acc)[kVector])
{
  using TypePack = Pack<StorageType<kDtype>, kVector>;
  constexpr int64_t kStep = kBiasWarps * kBiasGradUnroll;
  int64_t r = warp;

  for (; r + (kBiasGradUnroll - 1) * kBiasWarps < rows; r += kStep)
    {
      TypePack in[kBiasGradUnroll];

#pragma unroll
      for (int u = 0; u < kBiasGradUnroll; u++)
        in[u] = load_once ((const TypePack *) (matrix + (uint64_t) (r + u * kBiasWarps) * cols) + pack);
#pragma unroll
      for (int u = 0; u < kBiasGradUnroll; u++)
#pragma unroll
        for (int e = 0; e < kVector; e++)
          acc[e] += to_float<kDtype> (in[u].v[e]);
    }
  for (; r < rows; r += kBiasWarps)
    {
      const TypePack in = load_once ((const TypePack *) (matrix + (uint64_t) r * cols) + pack);

#pragma unroll
      for (int e = 0; e < kVector; e++)
        acc[e] += to_float<kDtype> (in.v[e]);
    }
}

template <int kDtype, int kVector>
__global__ void __launch_bounds__ (kBiasThreads)
bias_grad_kernel (const __grid_constant__ GroupedBiasParams params)
{
  using Type = StorageType<kDtype>;
  using TypePack = Pack<Type, kVector>;

  /* The sums of warps 1 .. kBiasWarps-1, element-major so that the lanes of
   * a warp touch consecutive banks. */
  __shared__ float warp_sums[kBiasWarps - 1][kVector][kBiasLanes];

  const int lane = threadIdx.x % kBiasLanes;
  const int warp = threadIdx.x / kBiasLanes;
  const uint64_t cols = (uint64_t) params.cols;
  const uint64_t packs_per_row = cols / kVector;

  for (uint64_t tile = blockIdx.x; tile < params.n_tiles; tile += gridDim.x)
    {
      const uint32_t g = find_group (params.groups, params.n_groups, tile);
      const int64_t group_rows = params.groups[g].rows;
      const uint64_t tile_in_group = tile - params.groups[g].first_tile;
      const int64_t first_row = (int64_t) tile_in_group * kBiasGradTileRows;
      /* An empty group has one tile of no rows, which writes its zeros. */
      const int64_t rows = group_rows - first_row < kBiasGradTileRows ?
                           group_rows - first_row : kBiasGradTileRows;
      const bool whole_group = group_rows <= kBiasGradTileRows;
      const Type *const matrix = (const Type *) params.groups[g].matrix +
                                 (uint64_t) first_row * cols;

      for (uint64_t strip = blockIdx.y; strip < params.n_strips; strip += gridDim.y)
        {
          const uint64_t pack = strip * kBiasLanes + lane;
          const bool active = pack < packs_per_row;
          float acc[kVector];

#pragma unroll
          for (int e = 0; e < kVector; e++)
            acc[e] = 0.0f;
          if (active)
            sum_rows<kDtype, kVector> (matrix, cols, pack, rows, warp, acc);

          /* Every thread reaches the barriers: the loops above are uniform
           * over the block. */
          if (warp > 0)
#pragma unroll
            for (int e = 0; e < kVector; e++)
              warp_sums[warp - 1][e][lane] = acc[e];
          __syncthreads ();

          if (warp == 0 && active)
            {
#pragma unroll
              for (int w = 0; w < kBiasWarps - 1; w++)
#pragma unroll
                for (int e = 0; e < kVector; e++)
                  acc[e] += warp_sums[w][e][lane];

              if (whole_group)
                {
                  TypePack out;

#pragma unroll
                  for (int e = 0; e < kVector; e++)
                    out.v[e] = from_float<kDtype> (acc[e]);
                  ((TypePack *) params.groups[g].vector)[pack] = out;
                }
              else
                {
                  float *partial = params.scratch + tile * cols + pack * kVector;

#pragma unroll
                  for (int e = 0; e < kVector; e++)
                    partial[e] = acc[e];
                }
            }
          __syncthreads ();   /* warp_sums is rewritten by the next strip */
        }
    }
}

/* The second pass of the gradient: for every group spanning several tiles,
 * adds its tiles' partial sums in tile order. blockIdx.y walks the groups,
 * the threads of blockIdx.x the columns. */
template <int kDtype>
__global__ void __launch_bounds__ (kBiasThreads)
bias_grad_finish_kernel (const __grid_constant__ GroupedBiasParams params)
{
  using Type = StorageType<kDtype>;

  const uint64_t cols = (uint64_t) params.cols;
  const uint64_t stride = (uint64_t) gridDim.x * kBiasThreads;

  for (uint32_t g = blockIdx.y; g < params.n_groups; g += gridDim.y)
    {
      const int64_t group_rows = params.groups[g].rows;
      const uint64_t tiles = div_up ((uint64_t) group_rows, kBiasGradTileRows);
      const float *const partials = params.scratch + params.groups[g].first_tile * cols;
      Type *const dbias = (Type *) params.groups[g].vector;

      if (group_rows <= kBiasGradTileRows)
        continue;

      for (uint64_t j = (uint64_t) blockIdx.x * kBiasThreads + threadIdx.x; j < cols; j += stride)
        {
          float sum = 0.0f;

#pragma unroll 8
          for (uint64_t t = 0; t < tiles; t++)
            sum += partials[t * cols + j];
          dbias[j] = from_float<kDtype> (sum);
        }
    }
}

}  // namespace gmlp
