/* impls/grouped_bias_device.cuh: the bias gradient of a grouped tensor
 * whose group sizes are on the device
 *
 * device_groups_kernel (impls/device_groups.cuh) cuts every group into
 * tiles of kBiasGradTileRows rows and numbers them in one list. The first
 * kernel strides over that list: for each tile and strip of kBiasLanes
 * columns, the block's warps add up interleaved rows (sum_rows() of
 * impls/grouped_bias.cuh), their sums are added in warp order, and the
 * tile's sum lands in a scratch row of partials. The second kernel adds a
 * group's partials in tile order into dbias_i, zero for a group without
 * tiles. No atomics and a fixed order: every run gives the same bits.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "impls/common.cuh"
#include "impls/device_groups.cuh"
#include "impls/grouped_bias.cuh"

namespace gmlp {

struct BiasGradDeviceParams
{
  const DeviceGroup  *groups;
  const uint64_t     *total_tiles;
  uint32_t            n_groups;
  int64_t             cols;
  uint64_t            n_strips;     /* strips of kBiasLanes columns */
  const uint8_t      *matrix;       /* member i at DeviceGroup.offset[0] */
  void * const       *dbias;        /* device copy of the caller's host array */
  float              *partials;     /* one row of cols per tile */
};

template <int kDtype>
__global__ void __launch_bounds__ (kBiasThreads)
bias_grad_device_kernel (const __grid_constant__ BiasGradDeviceParams params)
{
  using Type = StorageType<kDtype>;

  __shared__ float warp_sums[kBiasWarps - 1][kBiasLanes];

  const int lane = threadIdx.x % kBiasLanes;
  const int warp = threadIdx.x / kBiasLanes;
  const uint64_t cols = (uint64_t) params.cols;
  const uint64_t total = *params.total_tiles;

  for (uint64_t tile = blockIdx.x; tile < total; tile += gridDim.x)
    {
      const uint32_t g = find_device_group (params.groups, params.n_groups, tile);
      const DeviceGroup group = params.groups[g];
      const int64_t first_row = (int64_t) (tile - device_group_first_tile (params.groups, g)) *
                                kBiasGradTileRows;
      const int64_t rows = group.rows - first_row < kBiasGradTileRows ?
                           group.rows - first_row : kBiasGradTileRows;
      const Type *const matrix = (const Type *) (params.matrix + group.offset[0]) +
                                 (uint64_t) first_row * cols;

      for (uint64_t strip = blockIdx.y; strip < params.n_strips; strip += gridDim.y)
        {
          const uint64_t col = strip * kBiasLanes + lane;
          const bool active = col < cols;
          float acc[1] = { 0.0f };

          if (active)
            sum_rows<kDtype, 1> (matrix, cols, col, rows, warp, acc);

          /* The loops above are uniform over the block: every thread
           * reaches the barriers. */
          if (warp > 0)
            warp_sums[warp - 1][lane] = acc[0];
          __syncthreads ();
          if (warp == 0 && active)
            {
#pragma unroll
              for (int w = 0; w < kBiasWarps - 1; w++)
                acc[0] += warp_sums[w][lane];
              params.partials[tile * cols + col] = acc[0];
            }
          __syncthreads ();   /* warp_sums is rewritten by the next strip */
        }
    }
}

/* blockIdx.y walks the groups, the threads of blockIdx.x the columns. */
template <int kDtype>
__global__ void __launch_bounds__ (kBiasThreads)
bias_grad_device_finish_kernel (const __grid_constant__ BiasGradDeviceParams params)
{
  using Type = StorageType<kDtype>;

  const uint64_t cols = (uint64_t) params.cols;
  const uint64_t stride = (uint64_t) gridDim.x * kBiasThreads;

  for (uint32_t g = blockIdx.y; g < params.n_groups; g += gridDim.y)
    {
      const uint64_t first = device_group_first_tile (params.groups, g);
      const uint64_t end = params.groups[g].tile_end;
      Type *const dbias = (Type *) params.dbias[g];

      for (uint64_t j = (uint64_t) blockIdx.x * kBiasThreads + threadIdx.x; j < cols; j += stride)
        {
          float sum = 0.0f;

          for (uint64_t t = first; t < end; t++)
            sum += params.partials[t * cols + j];
          dbias[j] = from_float<kDtype> (sum);
        }
    }
}

}  // namespace gmlp
