/* fill.cu: gmlp_kernel_fill_random()
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "gmlp-kernels.h"
#include "impls/common.cuh"
#include "impls/fill_random.cuh"

namespace gmlp {
namespace {

/* Blocks of a grid-stride fill: four full waves. */
constexpr uint64_t kFillBlocksPerSm = 4 * kBlocksPerSm;

using FillRandomKernel = void (*) (const FillRandomParams);

template <int kDtype>
FillRandomKernel
pick (bool vectorised)
{
  if (vectorised)
    return fill_random_kernel<kDtype, kFillVector>;
  return fill_random_kernel<kDtype, 1>;
}

FillRandomKernel
select_kernel (int dtype, bool vectorised)
{
  switch (dtype)
    {
    case GMLP_NUM_FLOAT32:     return pick<GMLP_NUM_FLOAT32> (vectorised);
    case GMLP_NUM_FLOAT16:     return pick<GMLP_NUM_FLOAT16> (vectorised);
    case GMLP_NUM_BFLOAT16:    return pick<GMLP_NUM_BFLOAT16> (vectorised);
    case GMLP_NUM_FLOAT8_E4M3: return pick<GMLP_NUM_FLOAT8_E4M3> (vectorised);
    case GMLP_NUM_FLOAT8_E5M2: return pick<GMLP_NUM_FLOAT8_E5M2> (vectorised);
    default:                   return nullptr;
    }
}

}  // namespace
}  // namespace gmlp

extern "C" GmlpKernelStatus
gmlp_kernel_fill_random (void         *dst,
                         int           dtype,
                         uint64_t      n_elements,
                         uint64_t      seed,
                         float         scale,
                         cudaStream_t  stream)
{
  using namespace gmlp;
  uint32_t size = gmlp_num_dtype_size (dtype);
  FillRandomParams params;
  FillRandomKernel kernel;
  uint64_t blocks;
  int sm_count = 0;
  cudaError_t err;

  if (size == 0)
    return GMLP_KERNEL_INVALID_VALUE;
  if (!is_float_dtype (dtype))
    return GMLP_KERNEL_UNSUPPORTED;
  if (n_elements == 0)
    return GMLP_KERNEL_SUCCESS;
  if (dst == nullptr)
    return GMLP_KERNEL_INVALID_VALUE;

  kernel = select_kernel (dtype, (uintptr_t) dst % ((uint64_t) kFillVector * size) == 0);

  err = current_sm_count (&sm_count);
  if (err != cudaSuccess)
    return record_cuda_error (err);

  blocks = div_up (n_elements, (uint64_t) kElementwiseThreads * kFillVector);
  if (blocks > (uint64_t) sm_count * kFillBlocksPerSm)
    blocks = (uint64_t) sm_count * kFillBlocksPerSm;

  params.dst = dst;
  params.n_elements = n_elements;
  params.seed = seed;
  params.scale = scale;

  kernel<<<(unsigned) blocks, kElementwiseThreads, 0, stream>>> (params);
  return check_launch ();
}
