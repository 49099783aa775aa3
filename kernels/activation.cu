/* activation.cu: gmlp_kernel_grouped_activation_plan() and
 * gmlp_kernel_grouped_activation()
 *
 * The plan runs on the host over the host copy of the group table; the
 * launch picks the kernel instance for the dtype, activation and direction
 * and sizes the grid. The device code is in impls/grouped_activation.cuh.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "gmlp-kernels.h"
#include "impls/common.cuh"
#include "impls/grouped_activation.cuh"

namespace gmlp {
namespace {

/* Grid limits: blockIdx.x walks tiles and blockIdx.y strips, each in a
 * loop, so capping the grid only lengthens the loops. */
constexpr uint64_t kMaxGridX = 0x7fffffffu;
constexpr uint64_t kMaxGridY = 65535u;

/* No operand may be larger than this many bytes, so that every offset the
 * kernels compute fits in 64 bits with room to spare. */
constexpr uint64_t kMaxOperandBytes = 1ull << 62;

/* The host-sizes kernels, for select_activation_instance(). */
struct HostSizesInstances
{
  using Kernel = void (*) (const GroupedActivationParams);

  template <int kDtype, int kActivation, bool kBackward, int kVector>
  static Kernel
  get ()
  {
    return activation_kernel<kDtype, kActivation, kBackward, kVector>;
  }
};

}  // namespace
}  // namespace gmlp

extern "C" GmlpKernelStatus
gmlp_kernel_grouped_activation_plan (int                        activation,
                                     int                        dtype,
                                     int                        backward,
                                     int64_t                    f,
                                     GmlpKernelActivationGroup *groups,
                                     uint32_t                   n_groups,
                                     GmlpKernelActivationPlan  *plan)
{
  using namespace gmlp;
  uint32_t size = gmlp_num_dtype_size (dtype);
  uint64_t in_row_bytes;
  uint64_t n_tiles = 0;
  bool aligned = true;

  if (plan == nullptr || (n_groups > 0 && groups == nullptr) || f < 0 || size == 0 ||
      (backward != 0 && backward != 1))
    return GMLP_KERNEL_INVALID_VALUE;
  if (!is_activation_dtype (dtype) || !is_activation (activation))
    return GMLP_KERNEL_UNSUPPORTED;
  /* Offsets within a group are computed in 64 bits. */
  if ((uint64_t) f > (1ull << 40))
    return GMLP_KERNEL_UNSUPPORTED;

  /* in is the widest operand: 2f values when gated (as is the gradient). */
  in_row_bytes = (uint64_t) f * size * (is_gated_activation (activation) ? 2 : 1);

  for (uint32_t g = 0; g < n_groups; g++)
    {
      const int64_t rows = groups[g].rows;
      uint64_t tiles;

      if (rows < 0)
        return GMLP_KERNEL_INVALID_VALUE;
      if (in_row_bytes > 0 && (uint64_t) rows > kMaxOperandBytes / in_row_bytes)
        return GMLP_KERNEL_INVALID_VALUE;

      tiles = f == 0 ? 0 : div_up ((uint64_t) rows, act_tile_rows (backward != 0));
      if (tiles > 0)
        {
          if (groups[g].in == nullptr || groups[g].out == nullptr ||
              (backward && groups[g].d_out == nullptr))
            return GMLP_KERNEL_INVALID_VALUE;
          aligned = aligned && is_aligned (groups[g].in, kActPackBytes) &&
                    is_aligned (groups[g].out, kActPackBytes) &&
                    (!backward || is_aligned (groups[g].d_out, kActPackBytes));
        }
      /* Each group's count is bounded by its size, their sum is not. */
      if (n_tiles + tiles < n_tiles)
        return GMLP_KERNEL_INVALID_VALUE;
      groups[g].first_tile = n_tiles;
      n_tiles += tiles;
    }

  plan->activation = activation;
  plan->dtype = dtype;
  plan->backward = backward;
  plan->n_groups = n_groups;
  plan->f = f;
  plan->n_tiles = n_tiles;
  /* Whole 16-byte packs: every row, and the second half of a gated row,
   * starts aligned when the operand does and f values are whole packs. */
  plan->vectorised = aligned && ((uint64_t) f * size) % kActPackBytes == 0;
  return GMLP_KERNEL_SUCCESS;
}

extern "C" GmlpKernelStatus
gmlp_kernel_grouped_activation (const GmlpKernelActivationPlan  *plan,
                                const GmlpKernelActivationGroup *device_groups,
                                cudaStream_t                     stream)
{
  using namespace gmlp;
  GroupedActivationParams params;
  HostSizesInstances::Kernel kernel;
  uint64_t packs_per_row;
  dim3 grid;

  if (plan == nullptr)
    return GMLP_KERNEL_INVALID_VALUE;
  if (plan->n_tiles == 0)
    return GMLP_KERNEL_SUCCESS;
  if (device_groups == nullptr || plan->n_groups == 0 || plan->f <= 0)
    return GMLP_KERNEL_INVALID_VALUE;

  kernel = select_activation_instance<HostSizesInstances> (plan->dtype, plan->activation,
                                                          plan->backward != 0, plan->vectorised != 0);
  if (kernel == nullptr)
    return GMLP_KERNEL_UNSUPPORTED;

  packs_per_row = plan->vectorised ?
                  (uint64_t) plan->f * gmlp_num_dtype_size (plan->dtype) / kActPackBytes :
                  (uint64_t) plan->f;

  params.groups = device_groups;
  params.n_groups = plan->n_groups;
  params.f = plan->f;
  params.n_tiles = plan->n_tiles;
  params.n_strips = div_up (packs_per_row, kActLanes);

  grid.x = (unsigned) min_u64 (params.n_tiles, kMaxGridX);
  grid.y = (unsigned) min_u64 (params.n_strips, kMaxGridY);
  grid.z = 1;
  kernel<<<grid, kActThreads, 0, stream>>> (params);
  return check_launch ();
}
