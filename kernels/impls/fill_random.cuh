/* impls/fill_random.cuh: counter-based random fill
 *
 * Element i gets gmlp_num_random_uniform(seed, i, scale) rounded to the
 * destination dtype, so the result does not depend on the launch shape and
 * matches the CPU backend bit for bit.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "impls/common.cuh"

namespace gmlp {

constexpr int kFillVector = 8;

struct FillRandomParams
{
  void     *dst;
  uint64_t  n_elements;
  uint64_t  seed;
  float     scale;
};

template <int kDtype, int kVector>
__global__ void __launch_bounds__ (kElementwiseThreads)
fill_random_kernel (const __grid_constant__ FillRandomParams params)
{
  using Type = StorageType<kDtype>;
  using TypePack = Pack<Type, kVector>;

  static_assert (is_float_dtype (kDtype), "random fill is for floating types");

  const uint64_t n = params.n_elements;
  const uint64_t n_packs = n / kVector;
  const uint64_t stride = (uint64_t) gridDim.x * kElementwiseThreads;
  const uint64_t first = (uint64_t) blockIdx.x * kElementwiseThreads + threadIdx.x;
  Type *__restrict__ dst = (Type *) params.dst;

  for (uint64_t i = first; i < n_packs; i += stride)
    {
      TypePack out;

#pragma unroll
      for (int k = 0; k < kVector; k++)
        gmlp_num_store_float (out.v, kDtype, k,
                              gmlp_num_random_uniform (params.seed, i * kVector + k,
                                                       params.scale));
      ((TypePack *) dst)[i] = out;
    }

  for (uint64_t i = n_packs * kVector + first; i < n; i += stride)
    gmlp_num_store_float (dst, kDtype, i,
                          gmlp_num_random_uniform (params.seed, i, params.scale));
}

}  // namespace gmlp
