/* bias_device.cu: gmlp_kernel_grouped_bias_grad_device() and its workspace
 *
 * The bias gradient for group sizes that only the device knows: the dbias
 * pointers go into the workspace through kernel parameters, the group
 * table and tile list are worked out on the device (impls/device_groups.cuh),
 * and two kernels add up the rows (impls/grouped_bias_device.cuh). Nothing
 * is allocated and nothing waits, so the call can be captured in a graph.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "gmlp-kernels.h"
#include "impls/common.cuh"
#include "impls/device_groups.cuh"
#include "impls/grouped_bias_device.cuh"

namespace gmlp {
namespace {

constexpr uint32_t kMaxGroups = 65535;
constexpr uint64_t kMaxGridX = 0x7fffffffu;
constexpr uint64_t kMaxGridY = 65535u;
/* The smallest element the kernels take: the one that fits the most rows
 * in an allocation, which bounds the tiles for every dtype. */
constexpr uint32_t kSmallestElement = 2;

using BiasGradDeviceKernel = void (*) (const BiasGradDeviceParams);

constexpr uint64_t
align_up (uint64_t bytes)
{
  return div_up (bytes, kGmlpMemberAlignment) * kGmlpMemberAlignment;
}

struct WorkspaceLayout
{
  uint64_t dbias;        /* n_groups pointers */
  uint64_t groups;       /* n_groups DeviceGroup */
  uint64_t total_tiles;  /* one uint64_t */
  uint64_t partials;     /* max_tiles rows of cols floats */
  uint64_t max_tiles;
  uint64_t bytes;        /* 0: the shape is too large */
};

/* The tiles of every group add up to at most the rows that fit in the
 * allocation over the tile height, plus one partial tile per group. */
WorkspaceLayout
workspace_layout (const GmlpKernelGroupedShape *shape)
{
  WorkspaceLayout layout = {};
  GroupedOperand widest;

  if (shape->cols <= 0 || shape->row_capacity < 0 ||
      !describe_operand (&widest, nullptr, kSmallestElement, shape))
    return layout;

  layout.max_tiles = widest.capacity / widest.row_bytes / kBiasGradTileRows + shape->n_groups;
  if (layout.max_tiles > (1ull << 60) / sizeof (float) / (uint64_t) shape->cols)
    return layout;

  layout.dbias = 0;
  layout.groups = layout.dbias + align_up ((uint64_t) shape->n_groups * sizeof (void *));
  layout.total_tiles = layout.groups + align_up ((uint64_t) shape->n_groups * sizeof (DeviceGroup));
  layout.partials = layout.total_tiles + kGmlpMemberAlignment;
  layout.bytes = layout.partials + align_up (layout.max_tiles * (uint64_t) shape->cols * sizeof (float));
  return layout;
}

template <int kDtype>
void
pick (BiasGradDeviceKernel *sum, BiasGradDeviceKernel *finish)
{
  *sum = bias_grad_device_kernel<kDtype>;
  *finish = bias_grad_device_finish_kernel<kDtype>;
}

}  // namespace
}  // namespace gmlp

extern "C" size_t
gmlp_kernel_grouped_bias_grad_device_workspace_bytes (const GmlpKernelGroupedShape *shape)
{
  if (shape == nullptr)
    return 0;
  return (size_t) gmlp::workspace_layout (shape).bytes;
}

extern "C" GmlpKernelStatus
gmlp_kernel_grouped_bias_grad_device (const GmlpKernelGroupedShape *shape,
                                      int                           dtype,
                                      const void                   *a,
                                      void * const                 *dbias,
                                      void                         *workspace,
                                      cudaStream_t                  stream)
{
  using namespace gmlp;
  uint32_t size = gmlp_num_dtype_size (dtype);
  uint8_t *ws = static_cast<uint8_t *> (workspace);
  BiasGradDeviceKernel sum_kernel, finish_kernel;
  BiasGradDeviceParams params;
  DeviceGroupsParams scan;
  WorkspaceLayout layout;
  int sm_count = 0;
  dim3 grid;
  GmlpKernelStatus status;
  cudaError_t err;

  if (shape == nullptr || shape->cols < 0 || shape->row_capacity < 0 || size == 0)
    return GMLP_KERNEL_INVALID_VALUE;
  switch (dtype)
    {
    case GMLP_NUM_FLOAT32:  pick<GMLP_NUM_FLOAT32> (&sum_kernel, &finish_kernel); break;
    case GMLP_NUM_FLOAT16:  pick<GMLP_NUM_FLOAT16> (&sum_kernel, &finish_kernel); break;
    case GMLP_NUM_BFLOAT16: pick<GMLP_NUM_BFLOAT16> (&sum_kernel, &finish_kernel); break;
    default:                return GMLP_KERNEL_UNSUPPORTED;
    }
  /* No groups or no columns: there is no gradient to write. */
  if (shape->n_groups == 0 || shape->cols == 0)
    return GMLP_KERNEL_SUCCESS;
  if (shape->n_groups > kMaxGroups)
    return GMLP_KERNEL_UNSUPPORTED;
  if (shape->device_rows == nullptr || a == nullptr || !is_aligned (a, size) ||
      dbias == nullptr || workspace == nullptr || !is_aligned (workspace, sizeof (uint64_t)))
    return GMLP_KERNEL_INVALID_VALUE;
  for (uint32_t g = 0; g < shape->n_groups; g++)
    if (dbias[g] == nullptr || !is_aligned (dbias[g], size))
      return GMLP_KERNEL_INVALID_VALUE;

  layout = workspace_layout (shape);
  if (layout.bytes == 0)
    return GMLP_KERNEL_UNSUPPORTED;
  scan.device_rows = shape->device_rows;
  scan.n_groups = shape->n_groups;
  if (!describe_operand (&scan.operands[0], a, size, shape))
    return GMLP_KERNEL_INVALID_VALUE;
  scan.operands[1] = scan.operands[0];
  scan.tile_rows = kBiasGradTileRows;
  scan.col_tiles = 1;
  scan.fixed_tiles = 0;
  scan.groups = reinterpret_cast<DeviceGroup *> (ws + layout.groups);
  scan.total_tiles = reinterpret_cast<uint64_t *> (ws + layout.total_tiles);

  err = current_sm_count (&sm_count);
  if (err != cudaSuccess)
    return record_cuda_error (err);

  status = gmlp_kernel_write_table (ws + layout.dbias, dbias,
                                    (size_t) shape->n_groups * sizeof (void *), stream);
  if (status != GMLP_KERNEL_SUCCESS)
    return status;
  device_groups_kernel<<<1, kElementwiseThreads, 0, stream>>> (scan);
  status = check_launch ();
  if (status != GMLP_KERNEL_SUCCESS)
    return status;

  params.groups = scan.groups;
  params.total_tiles = scan.total_tiles;
  params.n_groups = shape->n_groups;
  params.cols = shape->cols;
  params.n_strips = div_up ((uint64_t) shape->cols, kBiasLanes);
  params.matrix = scan.operands[0].data;
  params.dbias = reinterpret_cast<void * const *> (ws + layout.dbias);
  params.partials = reinterpret_cast<float *> (ws + layout.partials);

  /* A few waves of blocks over tiles × strips: enough to fill the GPU, and
   * the kernel strides over whatever the device-side list holds. */
  grid.y = (unsigned) min_u64 (params.n_strips, kMaxGridY);
  grid.x = (unsigned) min_u64 (min_u64 (layout.max_tiles, kMaxGridX),
                               div_up ((uint64_t) sm_count * kBlocksPerSm * 4, grid.y));
  grid.z = 1;
  sum_kernel<<<grid, kBiasThreads, 0, stream>>> (params);
  status = check_launch ();
  if (status != GMLP_KERNEL_SUCCESS)
    return status;

  grid.x = (unsigned) min_u64 (div_up ((uint64_t) shape->cols, kBiasThreads), kMaxGridX);
  grid.y = (unsigned) min_u64 (shape->n_groups, kMaxGridY);
  finish_kernel<<<grid, kBiasThreads, 0, stream>>> (params);
  return check_launch ();
}
