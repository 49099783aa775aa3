/* impls/grouped_activation_device.cuh: the activations of a grouped MLP
 * and their gradients for group sizes that only the device knows
 *
 * device_groups_kernel (impls/device_groups.cuh) walks the sizes first and
 * leaves, for every group, its member offsets in the two row widths of the
 * call (in's, which a backward's out shares, and the f-wide operand's:
 * out forward, d_out backward), its rows clamped to what fits in both
 * allocations, and the end of its tiles of act_tile_rows() rows in one list.
 * The kernel here strides over that list, finds a tile's group with a
 * binary search and runs activation_tile() of grouped_activation.cuh on
 * it: the per-tile code of the host-sizes kernel, so both give the same
 * bits. Offsets and row indices are 64-bit throughout.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "impls/common.cuh"
#include "impls/device_groups.cuh"
#include "impls/grouped_activation.cuh"

namespace gmlp {

struct GroupedActivationDeviceParams
{
  const DeviceGroup *groups;
  const uint64_t    *total_tiles;
  uint32_t           n_groups;
  int64_t            f;
  uint64_t           n_strips;   /* strips of kActLanes packs */
  const uint8_t     *in;         /* member i at groups[i].offset[0] */
  const uint8_t     *d_out;      /* backward: member i at offset[1] */
  uint8_t           *out;        /* forward: offset[1]; backward: offset[0] */
};

template <int kDtype, int kActivation, bool kBackward, int kVector>
__global__ void __launch_bounds__ (kActThreads)
activation_device_kernel (const __grid_constant__ GroupedActivationDeviceParams params)
{
  using Type = StorageType<kDtype>;
  constexpr bool kGated = is_gated_activation (kActivation);

  constexpr int64_t kTileRows = act_tile_rows (kBackward);
  const uint64_t f = (uint64_t) params.f;
  const uint64_t in_cols = kGated ? 2 * f : f;
  const uint64_t total = *params.total_tiles;

  for (uint64_t tile = blockIdx.x; tile < total; tile += gridDim.x)
    {
      const uint32_t g = find_device_group (params.groups, params.n_groups, tile);
      const DeviceGroup group = params.groups[g];
      const int64_t first_row = (int64_t) (tile - device_group_first_tile (params.groups, g)) *
                                kTileRows;
      const int64_t rows = group.rows - first_row < kTileRows ? group.rows - first_row : kTileRows;
      const Type *const in = (const Type *) (params.in + group.offset[0]) + (uint64_t) first_row * in_cols;
      const Type *const d_out = kBackward ?
                                (const Type *) (params.d_out + group.offset[1]) + (uint64_t) first_row * f :
                                nullptr;
      Type *const out = kBackward ?
                        (Type *) (params.out + group.offset[0]) + (uint64_t) first_row * in_cols :
                        (Type *) (params.out + group.offset[1]) + (uint64_t) first_row * f;

      activation_tile<kDtype, kActivation, kBackward, kVector> (in, d_out, out, rows, f, params.n_strips);
    }
}

}  // namespace gmlp
