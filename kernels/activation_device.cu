/* activation_device.cu: gmlp_kernel_grouped_activation_device() and its
 * workspace
 *
 * The activations of a grouped MLP when only the device knows the group
 * sizes: device_groups_kernel (impls/device_groups.cuh) turns the sizes
 * into a table of member offsets, clamped rows and tiles in the
 * workspace, then one launch of activation_device_kernel
 * (impls/grouped_activation_device.cuh) runs the tiles. The host checks
 * what it can without the sizes (pointers, alignment, widths) and never
 * waits, so the call can be captured in a graph.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "gmlp-kernels.h"
#include "impls/common.cuh"
#include "impls/device_groups.cuh"
#include "impls/grouped_activation_device.cuh"

namespace gmlp {
namespace {

constexpr uint32_t kMaxGroups = 65535;
constexpr uint64_t kMaxGridX = 0x7fffffffu;
constexpr uint64_t kMaxGridY = 65535u;

constexpr uint64_t
align_up (uint64_t bytes)
{
  return div_up (bytes, kGmlpMemberAlignment) * kGmlpMemberAlignment;
}

/* The workspace: the group table, then the length of the tile list. */
uint64_t
total_tiles_offset (uint32_t n_groups)
{
  return align_up ((uint64_t) n_groups * sizeof (DeviceGroup));
}

/* The device-sizes kernels, for select_activation_instance(). */
struct DeviceSizesInstances
{
  using Kernel = void (*) (const GroupedActivationDeviceParams);

  template <int kDtype, int kActivation, bool kBackward, int kVector>
  static Kernel
  get ()
  {
    return activation_device_kernel<kDtype, kActivation, kBackward, kVector>;
  }
};

}  // namespace
}  // namespace gmlp

extern "C" size_t
gmlp_kernel_grouped_activation_device_workspace_bytes (uint32_t n_groups)
{
  return (size_t) (gmlp::total_tiles_offset (n_groups) + sizeof (uint64_t));
}

extern "C" GmlpKernelStatus
gmlp_kernel_grouped_activation_device (const GmlpKernelGroupedShape *shape,
                                       int                           activation,
                                       int                           dtype,
                                       int                           backward,
                                       const void                   *in,
                                       const void                   *d_out,
                                       void                         *out,
                                       void                         *workspace,
                                       cudaStream_t                  stream)
{
  using namespace gmlp;
  uint32_t size = gmlp_num_dtype_size (dtype);
  uint8_t *ws = static_cast<uint8_t *> (workspace);
  GmlpKernelGroupedShape in_shape, narrow_shape;
  GroupedActivationDeviceParams params;
  DeviceSizesInstances::Kernel kernel;
  DeviceGroupsParams scan;
  uint64_t packs_per_row, max_tiles;
  bool vectorised;
  int sm_count = 0;
  dim3 grid;
  GmlpKernelStatus status;
  cudaError_t err;

  if (shape == nullptr || shape->cols < 0 || shape->row_capacity < 0 || size == 0 ||
      (backward != 0 && backward != 1))
    return GMLP_KERNEL_INVALID_VALUE;
  if (!is_activation_dtype (dtype) || !is_activation (activation))
    return GMLP_KERNEL_UNSUPPORTED;
  /* Offsets within a group are computed in 64 bits. */
  if ((uint64_t) shape->cols > (1ull << 40))
    return GMLP_KERNEL_UNSUPPORTED;
  /* No groups or no columns: nothing to write. */
  if (shape->n_groups == 0 || shape->cols == 0)
    return GMLP_KERNEL_SUCCESS;
  if (shape->n_groups > kMaxGroups)
    return GMLP_KERNEL_UNSUPPORTED;
  if (shape->device_rows == nullptr || in == nullptr || out == nullptr || (backward && d_out == nullptr) ||
      !is_aligned (in, size) || !is_aligned (out, size) || (backward && !is_aligned (d_out, size)) ||
      workspace == nullptr || !is_aligned (workspace, sizeof (uint64_t)))
    return GMLP_KERNEL_INVALID_VALUE;

  /* The two row widths: in's (2f when gated; a backward's out too) and
   * f's (out forward, d_out backward). */
  in_shape = *shape;
  in_shape.cols = is_gated_activation (activation) ? 2 * shape->cols : shape->cols;
  narrow_shape = *shape;
  scan.device_rows = shape->device_rows;
  scan.n_groups = shape->n_groups;
  if (!describe_operand (&scan.operands[0], in, size, &in_shape) ||
      !describe_operand (&scan.operands[1], backward ? d_out : out, size, &narrow_shape))
    return GMLP_KERNEL_UNSUPPORTED;
  scan.tile_rows = act_tile_rows (backward != 0);
  scan.col_tiles = 1;
  scan.fixed_tiles = 0;
  scan.groups = reinterpret_cast<DeviceGroup *> (ws);
  scan.total_tiles = reinterpret_cast<uint64_t *> (ws + total_tiles_offset (shape->n_groups));

  /* Members start on 256-byte boundaries from their operand's base: whole
   * 16-byte packs when the bases are aligned and f values are whole
   * packs, as the host-sizes plan decides. */
  vectorised = is_aligned (in, kActPackBytes) && is_aligned (out, kActPackBytes) &&
               (!backward || is_aligned (d_out, kActPackBytes)) &&
               ((uint64_t) shape->cols * size) % kActPackBytes == 0;
  kernel = select_activation_instance<DeviceSizesInstances> (dtype, activation, backward != 0, vectorised);
  if (kernel == nullptr)
    return GMLP_KERNEL_UNSUPPORTED;

  err = current_sm_count (&sm_count);
  if (err != cudaSuccess)
    return record_cuda_error (err);

  device_groups_kernel<<<1, kElementwiseThreads, 0, stream>>> (scan);
  status = check_launch ();
  if (status != GMLP_KERNEL_SUCCESS)
    return status;

  packs_per_row = vectorised ? (uint64_t) shape->cols * size / kActPackBytes : (uint64_t) shape->cols;
  params.groups = scan.groups;
  params.total_tiles = scan.total_tiles;
  params.n_groups = shape->n_groups;
  params.f = shape->cols;
  params.n_strips = div_up (packs_per_row, kActLanes);
  params.in = static_cast<const uint8_t *> (in);
  params.d_out = static_cast<const uint8_t *> (d_out);
  params.out = static_cast<uint8_t *> (out);

  /* The tiles hold at most the rows that fit in the narrow operand's
   * allocation, plus one partial tile per group; a few waves of blocks
   * stride over however many the list has. */
  max_tiles = scan.operands[1].capacity / scan.operands[1].row_bytes /
              (uint64_t) act_tile_rows (backward != 0) + shape->n_groups;
  grid.y = (unsigned) min_u64 (params.n_strips, kMaxGridY);
  grid.x = (unsigned) min_u64 (min_u64 (max_tiles, kMaxGridX),
                               div_up ((uint64_t) sm_count * kBlocksPerSm * 4, grid.y));
  grid.z = 1;
  kernel<<<grid, kActThreads, 0, stream>>> (params);
  return check_launch ();
}
