/* convert.cu: gmlp_kernel_convert_grouped()
 *
 * Checks the arguments, sizes the grid and picks the kernel instance for the
 * dtype pair; the device code is in impls/grouped_convert.cuh.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "gmlp-kernels.h"
#include "impls/common.cuh"
#include "impls/device_cache.cuh"
#include "impls/grouped_convert.cuh"

namespace gmlp {
namespace {

/* Every block reads every group size, so the cost of a launch grows with
 * n_groups; this bounds it (and is the gridDim.y limit, should the kernel
 * ever index groups by block). */
constexpr uint32_t kMaxGroups = 65535;

using GroupedConvertKernel = void (*) (const GroupedConvertParams);

/* The dtype whose kernels copy elements of the given size bit for bit. */
constexpr int
copy_dtype (uint32_t element_size)
{
  return element_size == 1 ? GMLP_NUM_FLOAT8_E4M3 :
         element_size == 2 ? GMLP_NUM_FLOAT16 :
         element_size == 4 ? GMLP_NUM_INT32 : GMLP_NUM_INT64;
}

template <int kSrc, int kDst>
GroupedConvertKernel
pick (bool vectorised)
{
  /* Same-dtype pairs share one bit-copy instance per element size. */
  constexpr int kFrom = kSrc == kDst ? copy_dtype (sizeof (StorageType<kSrc>)) : kSrc;
  constexpr int kTo = kSrc == kDst ? kFrom : kDst;

  if (vectorised)
    return grouped_convert_kernel<kFrom, kTo, kConvertVector>;
  return grouped_convert_kernel<kFrom, kTo, 1>;
}

template <int kSrc>
GroupedConvertKernel
pick_float_to (int dst_dtype, bool vectorised)
{
  switch (dst_dtype)
    {
    case GMLP_NUM_FLOAT32:     return pick<kSrc, GMLP_NUM_FLOAT32> (vectorised);
    case GMLP_NUM_FLOAT16:     return pick<kSrc, GMLP_NUM_FLOAT16> (vectorised);
    case GMLP_NUM_BFLOAT16:    return pick<kSrc, GMLP_NUM_BFLOAT16> (vectorised);
    case GMLP_NUM_FLOAT8_E4M3: return pick<kSrc, GMLP_NUM_FLOAT8_E4M3> (vectorised);
    case GMLP_NUM_FLOAT8_E5M2: return pick<kSrc, GMLP_NUM_FLOAT8_E5M2> (vectorised);
    default:                   return nullptr;
    }
}

/* The kernel for a valid dtype pair, or nullptr where none exists. */
GroupedConvertKernel
select_kernel (int src_dtype, int dst_dtype, bool vectorised)
{
  if (src_dtype == GMLP_NUM_INT32 && dst_dtype == GMLP_NUM_INT32)
    return pick<GMLP_NUM_INT32, GMLP_NUM_INT32> (vectorised);
  if (src_dtype == GMLP_NUM_INT32 && dst_dtype == GMLP_NUM_INT64)
    return pick<GMLP_NUM_INT32, GMLP_NUM_INT64> (vectorised);
  if (src_dtype == GMLP_NUM_INT64 && dst_dtype == GMLP_NUM_INT32)
    return pick<GMLP_NUM_INT64, GMLP_NUM_INT32> (vectorised);
  if (src_dtype == GMLP_NUM_INT64 && dst_dtype == GMLP_NUM_INT64)
    return pick<GMLP_NUM_INT64, GMLP_NUM_INT64> (vectorised);

  switch (src_dtype)
    {
    case GMLP_NUM_FLOAT32:     return pick_float_to<GMLP_NUM_FLOAT32> (dst_dtype, vectorised);
    case GMLP_NUM_FLOAT16:     return pick_float_to<GMLP_NUM_FLOAT16> (dst_dtype, vectorised);
    case GMLP_NUM_BFLOAT16:    return pick_float_to<GMLP_NUM_BFLOAT16> (dst_dtype, vectorised);
    case GMLP_NUM_FLOAT8_E4M3: return pick_float_to<GMLP_NUM_FLOAT8_E4M3> (dst_dtype, vectorised);
    case GMLP_NUM_FLOAT8_E5M2: return pick_float_to<GMLP_NUM_FLOAT8_E5M2> (dst_dtype, vectorised);
    default:                   return nullptr;
    }
}


}  // namespace
}  // namespace gmlp

extern "C" GmlpKernelStatus
gmlp_kernel_convert_grouped (const GmlpKernelGroupedShape *shape,
                             const void                   *src,
                             int                           src_dtype,
                             void                         *dst,
                             int                           dst_dtype,
                             cudaStream_t                  stream)
{
  using namespace gmlp;
  uint32_t src_size, dst_size;
  GroupedConvertParams params;
  GroupedConvertKernel kernel;
  uint64_t max_elements, packs, blocks;
  bool vectorised;
  int sm_count = 0;
  int blocks_per_sm = 0;
  cudaError_t err;

  if (shape == nullptr || shape->cols < 0 || shape->row_capacity < 0)
    return GMLP_KERNEL_INVALID_VALUE;
  src_size = gmlp_num_dtype_size (src_dtype);
  dst_size = gmlp_num_dtype_size (dst_dtype);
  if (src_size == 0 || dst_size == 0)
    return GMLP_KERNEL_INVALID_VALUE;
  if (is_float_dtype (src_dtype) != is_float_dtype (dst_dtype))
    return GMLP_KERNEL_UNSUPPORTED;

  if (shape->n_groups == 0 || shape->cols == 0)
    return GMLP_KERNEL_SUCCESS;
  if (shape->device_rows == nullptr || src == nullptr || dst == nullptr)
    return GMLP_KERNEL_INVALID_VALUE;
  if (shape->n_groups > kMaxGroups)
    return GMLP_KERNEL_UNSUPPORTED;

  params.device_rows = shape->device_rows;
  params.n_groups = shape->n_groups;
  params.cols = shape->cols;
  if (!describe_operand (&params.src, src, src_size, shape) ||
      !describe_operand (&params.dst, dst, dst_size, shape))
    return GMLP_KERNEL_INVALID_VALUE;

  /* Members start at multiples of kGmlpMemberAlignment from the base, so
   * whole packs are aligned when the bases are. */
  vectorised = is_aligned (src, (uint64_t) kConvertVector * src_size) &&
               is_aligned (dst, (uint64_t) kConvertVector * dst_size);
  kernel = select_kernel (src_dtype, dst_dtype, vectorised);
  if (kernel == nullptr)
    return GMLP_KERNEL_UNSUPPORTED;

  /* One wave of resident blocks, each striding over the list of all packs;
   * no more blocks than the largest possible list needs. The host does not
   * know the group sizes: the list is at most the elements that fit in the
   * smaller allocation, plus one partial pack per group. */
  err = current_sm_count (&sm_count);
  if (err == cudaSuccess)
    err = current_blocks_per_sm ((const void *) kernel, kElementwiseThreads, 0, &blocks_per_sm);
  if (err != cudaSuccess)
    return record_cuda_error (err);
  max_elements = params.src.capacity / src_size;
  if (max_elements > params.dst.capacity / dst_size)
    max_elements = params.dst.capacity / dst_size;
  packs = div_up (max_elements, vectorised ? kConvertVector : 1) + shape->n_groups;
  blocks = div_up (packs, kElementwiseThreads);
  if (blocks > (uint64_t) sm_count * (blocks_per_sm > 0 ? blocks_per_sm : 1))
    blocks = (uint64_t) sm_count * (blocks_per_sm > 0 ? blocks_per_sm : 1);

  kernel<<<(unsigned) blocks, kElementwiseThreads, 0, stream>>> (params);
  return check_launch ();
}
