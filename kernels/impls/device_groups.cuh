/* impls/device_groups.cuh: the per-group table of the kernels that take
 * their group sizes from the device
 *
 * The host knows neither the sizes nor where the members start, so one
 * small kernel (a single block) walks the sizes first, 256 groups at a time,
 * and leaves for every group in device memory:
 *
 *  - the byte offset of its member in two grouped operands (the layout of
 *    gmlp_num_member_stride() for each operand's row width);
 *  - its row count, clamped to the rows that fit in both allocations from
 *    those offsets (impls/grouped_operand.cuh);
 *  - the end of its tiles in one list of all groups' tiles (an inclusive
 *    scan), so that the main kernel's grid strides over the tiles and a
 *    block finds its group with a binary search.
 *
 * A group has fixed_tiles + div_up (rows, tile_rows) × col_tiles tiles
 * (tile_rows == 0 leaves out the second term).
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "impls/common.cuh"
#include "impls/grouped_convert.cuh"   /* block_scan, Add */
#include "impls/grouped_operand.cuh"

namespace gmlp {

struct DeviceGroup
{
  uint64_t offset[2];   /* bytes from the start of each operand */
  int64_t  rows;        /* rows that fit in both operands */
  uint64_t tile_end;    /* tiles of this group and all before it */
};

struct DeviceGroupsParams
{
  const int64_t  *device_rows;
  uint32_t        n_groups;
  GroupedOperand  operands[2];  /* may be the same operand twice */
  uint64_t        tile_rows;    /* rows per tile, or 0 */
  uint64_t        col_tiles;    /* tiles per tile of rows */
  uint64_t        fixed_tiles;  /* tiles every group has regardless of its rows */
  DeviceGroup    *groups;       /* out: n_groups entries */
  uint64_t       *total_tiles;  /* out: the length of the tile list */
};

/* Launched with one block of kElementwiseThreads threads. Static: each
 * entry file that includes this has its own copy (no -rdc). */
static __global__ void __launch_bounds__ (kElementwiseThreads)
device_groups_kernel (const __grid_constant__ DeviceGroupsParams params)
{
  constexpr int kWarps = kElementwiseThreads / 32;
  __shared__ uint64_t scratch[2][kWarps];

  uint64_t base[2] = { 0, 0 };   /* offsets of the chunk's first group */
  uint64_t tile_base = 0;        /* tiles of all earlier chunks */

  for (uint32_t first = 0; first < params.n_groups; first += kElementwiseThreads)
    {
      const uint32_t g = first + threadIdx.x;
      const int64_t rows = g < params.n_groups ? params.device_rows[g] : 0;
      uint64_t strides[2] = { member_stride (rows, params.operands[0]),
                              member_stride (rows, params.operands[1]) };
      uint64_t strides_before[2], stride_totals[2];
      uint64_t tiles[1], tiles_before[1], tile_totals[1];
      uint64_t offset[2];
      int64_t fitting;

      block_scan<2> (strides, strides_before, stride_totals, scratch, SaturatingAdd ());
      offset[0] = SaturatingAdd () (base[0], strides_before[0]);
      offset[1] = SaturatingAdd () (base[1], strides_before[1]);
      /* rows_that_fit() counts a negative size as 0. */
      fitting = rows_that_fit (rows, offset[0], params.operands[0]);
      fitting = rows_that_fit (fitting, offset[1], params.operands[1]);

      tiles[0] = g < params.n_groups ? params.fixed_tiles : 0;
      if (g < params.n_groups && params.tile_rows > 0)
        tiles[0] += div_up ((uint64_t) fitting, params.tile_rows) * params.col_tiles;
      block_scan<1> (tiles, tiles_before, tile_totals, scratch, Add ());

      if (g < params.n_groups)
        {
          DeviceGroup out;

          out.offset[0] = offset[0];
          out.offset[1] = offset[1];
          out.rows = fitting;
          out.tile_end = tile_base + tiles[0];
          params.groups[g] = out;
        }

      base[0] = SaturatingAdd () (base[0], stride_totals[0]);
      base[1] = SaturatingAdd () (base[1], stride_totals[1]);
      tile_base += tile_totals[0];
    }

  if (threadIdx.x == 0)
    *params.total_tiles = tile_base;
}

/* The group that tile belongs to: the first whose tiles end after it
 * (groups without tiles end where the one before them does). */
__device__ __forceinline__ uint32_t
find_device_group (const DeviceGroup *groups,
                   uint32_t           n_groups,
                   uint64_t           tile)
{
  uint32_t lo = 0, hi = n_groups - 1;

  while (lo < hi)
    {
      uint32_t mid = lo + (hi - lo) / 2;

      if (groups[mid].tile_end <= tile)
        lo = mid + 1;
      else
        hi = mid;
    }
  return lo;
}

/* The first tile of group g in the list. */
__device__ __forceinline__ uint64_t
device_group_first_tile (const DeviceGroup *groups,
                         uint32_t           g)
{
  return g > 0 ? groups[g - 1].tile_end : 0;
}

}  // namespace gmlp
