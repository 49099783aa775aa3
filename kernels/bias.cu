/* bias.cu: gmlp_kernel_grouped_bias_plan() and gmlp_kernel_grouped_bias()
 *
 * The plan runs on the host over the host copy of the group table; the
 * launch picks the kernel instance for the dtype and sizes the grid. The
 * device code is in impls/grouped_bias.cuh.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "gmlp-kernels.h"
#include "impls/common.cuh"
#include "impls/grouped_bias.cuh"

namespace gmlp {
namespace {

/* Grid limits: blockIdx.x walks tiles and blockIdx.y strips or groups, each
 * in a loop, so capping the grid only lengthens the loops. */
constexpr uint64_t kMaxGridX = 0x7fffffffu;
constexpr uint64_t kMaxGridY = 65535u;

using GroupedBiasKernel = void (*) (const GroupedBiasParams);

template <int kDtype>
constexpr int
bias_vector ()
{
  return kBiasPackBytes / (int) sizeof (StorageType<kDtype>);
}

template <int kDtype>
GroupedBiasKernel
pick (GmlpKernelBiasOp op, bool vectorised)
{
  constexpr int kVector = bias_vector<kDtype> ();

  if (op == GMLP_KERNEL_BIAS_ADD)
    return vectorised ? add_bias_kernel<kDtype, kVector> : add_bias_kernel<kDtype, 1>;
  return vectorised ? bias_grad_kernel<kDtype, kVector> : bias_grad_kernel<kDtype, 1>;
}

GroupedBiasKernel
select_kernel (GmlpKernelBiasOp op, int dtype, bool vectorised)
{
  switch (dtype)
    {
    case GMLP_NUM_FLOAT32:  return pick<GMLP_NUM_FLOAT32> (op, vectorised);
    case GMLP_NUM_FLOAT16:  return pick<GMLP_NUM_FLOAT16> (op, vectorised);
    case GMLP_NUM_BFLOAT16: return pick<GMLP_NUM_BFLOAT16> (op, vectorised);
    default:                return nullptr;
    }
}

GroupedBiasKernel
select_finish_kernel (int dtype)
{
  switch (dtype)
    {
    case GMLP_NUM_FLOAT32:  return bias_grad_finish_kernel<GMLP_NUM_FLOAT32>;
    case GMLP_NUM_FLOAT16:  return bias_grad_finish_kernel<GMLP_NUM_FLOAT16>;
    case GMLP_NUM_BFLOAT16: return bias_grad_finish_kernel<GMLP_NUM_BFLOAT16>;
    default:                return nullptr;
    }
}

bool
is_bias_dtype (int dtype)
{
  return dtype == GMLP_NUM_FLOAT32 || dtype == GMLP_NUM_FLOAT16 ||
         dtype == GMLP_NUM_BFLOAT16;
}

}  // namespace
}  // namespace gmlp

extern "C" GmlpKernelStatus
gmlp_kernel_grouped_bias_plan (GmlpKernelBiasOp     op,
                               int                  dtype,
                               int64_t              cols,
                               GmlpKernelBiasGroup *groups,
                               uint32_t             n_groups,
                               GmlpKernelBiasPlan  *plan)
{
  using namespace gmlp;
  const uint64_t tile_rows = op == GMLP_KERNEL_BIAS_ADD ? kAddBiasTileRows : kBiasGradTileRows;
  uint32_t size = gmlp_num_dtype_size (dtype);
  uint64_t n_tiles = 0;
  bool multi_tile = false;
  bool aligned = true;

  if (plan == nullptr || (n_groups > 0 && groups == nullptr) || cols < 0 || size == 0 ||
      (op != GMLP_KERNEL_BIAS_ADD && op != GMLP_KERNEL_BIAS_GRAD))
    return GMLP_KERNEL_INVALID_VALUE;
  if (!is_bias_dtype (dtype))
    return GMLP_KERNEL_UNSUPPORTED;
  /* Offsets within a group are computed in 64 bits. */
  if ((uint64_t) cols > (1ull << 40))
    return GMLP_KERNEL_UNSUPPORTED;

  for (uint32_t g = 0; g < n_groups; g++)
    {
      const int64_t rows = groups[g].rows;
      uint64_t tiles;

      if (rows < 0 || (uint64_t) rows > (1ull << 48))
        return GMLP_KERNEL_INVALID_VALUE;

      /* An empty group adds nothing but still has a gradient of zeros. */
      tiles = div_up ((uint64_t) rows, tile_rows);
      if (op == GMLP_KERNEL_BIAS_GRAD && tiles == 0)
        tiles = 1;
      if (cols == 0)
        tiles = 0;

      if (tiles > 0)
        {
          if (groups[g].vector == nullptr || (rows > 0 && groups[g].matrix == nullptr))
            return GMLP_KERNEL_INVALID_VALUE;
          aligned = aligned && is_aligned (groups[g].vector, kBiasPackBytes) &&
                    is_aligned (groups[g].matrix, kBiasPackBytes);
        }
      multi_tile = multi_tile || tiles > 1;
      groups[g].first_tile = n_tiles;
      n_tiles += tiles;
    }

  plan->op = op;
  plan->dtype = dtype;
  plan->n_groups = n_groups;
  plan->cols = cols;
  plan->n_tiles = n_tiles;
  /* Whole 16-byte packs: every row starts aligned when the matrix does and
   * a row is a whole number of packs. */
  plan->vectorised = aligned && ((uint64_t) cols * size) % kBiasPackBytes == 0;
  plan->scratch_bytes = 0;
  if (op == GMLP_KERNEL_BIAS_GRAD && multi_tile)
    {
      if (n_tiles > (1ull << 62) / sizeof (float) / (uint64_t) cols)
        return GMLP_KERNEL_UNSUPPORTED;
      plan->scratch_bytes = n_tiles * (uint64_t) cols * sizeof (float);
    }
  return GMLP_KERNEL_SUCCESS;
}

extern "C" GmlpKernelStatus
gmlp_kernel_grouped_bias (const GmlpKernelBiasPlan  *plan,
                          const GmlpKernelBiasGroup *device_groups,
                          void                      *scratch,
                          cudaStream_t               stream)
{
  using namespace gmlp;
  GroupedBiasParams params;
  GroupedBiasKernel kernel;
  uint64_t packs_per_row;
  dim3 grid;
  GmlpKernelStatus status;

  if (plan == nullptr)
    return GMLP_KERNEL_INVALID_VALUE;
  if (plan->n_tiles == 0)
    return GMLP_KERNEL_SUCCESS;
  if (device_groups == nullptr || plan->n_groups == 0 || plan->cols <= 0 ||
      (plan->scratch_bytes > 0 && scratch == nullptr))
    return GMLP_KERNEL_INVALID_VALUE;

  kernel = select_kernel (plan->op, plan->dtype, plan->vectorised != 0);
  if (kernel == nullptr)
    return GMLP_KERNEL_UNSUPPORTED;

  packs_per_row = plan->vectorised ?
                  (uint64_t) plan->cols * gmlp_num_dtype_size (plan->dtype) / kBiasPackBytes :
                  (uint64_t) plan->cols;

  params.groups = device_groups;
  params.n_groups = plan->n_groups;
  params.cols = plan->cols;
  params.n_tiles = plan->n_tiles;
  params.n_strips = div_up (packs_per_row, kBiasLanes);
  params.scratch = (float *) scratch;

  grid.x = (unsigned) min_u64 (params.n_tiles, kMaxGridX);
  grid.y = (unsigned) min_u64 (params.n_strips, kMaxGridY);
  grid.z = 1;
  kernel<<<grid, kBiasThreads, 0, stream>>> (params);
  status = check_launch ();
  if (status != GMLP_KERNEL_SUCCESS || plan->scratch_bytes == 0)
    return status;

  /* The gradient of groups that span several tiles: add up the partials. */
  grid.x = (unsigned) min_u64 (div_up ((uint64_t) plan->cols, kBiasThreads), kMaxGridX);
  grid.y = (unsigned) min_u64 (plan->n_groups, kMaxGridY);
  select_finish_kernel (plan->dtype)<<<grid, kBiasThreads, 0, stream>>> (params);
  return check_launch ();
}
