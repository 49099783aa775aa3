/* impls/common.cuh: pieces shared by the kernels' entry files
 *
 * Device-side storage types, register packs for vectorised loads and stores,
 * launch-size helpers and the thread-local record of the last CUDA error.
 * Internal to the kernels library: nothing here is part of the C ABI.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <stdint.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "gmlp-kernels.h"
#include "gmlp-numeric.h"

#define GMLP_KERNEL_INTERNAL __attribute__((visibility ("hidden")))

namespace gmlp {

/* Threads per block of the element-wise kernels. */
constexpr int kElementwiseThreads = 256;
/* Resident blocks of kElementwiseThreads per SM on every arch we build for
 * (2048 threads per SM on sm_80 .. sm_90; sm_86/sm_89 hold 1536, which only
 * means the last wave is shorter). */
constexpr int kBlocksPerSm = 8;

static_assert (kElementwiseThreads % 32 == 0, "whole warps only");

/* The storage type of a dtype code. Floating types are stored as their bit
 * patterns; gmlp-numeric.h does all arithmetic on them. */
template <int kDtype> struct Storage;
template <> struct Storage<GMLP_NUM_FLOAT32>     { using Type = float; };
template <> struct Storage<GMLP_NUM_FLOAT16>     { using Type = uint16_t; };
template <> struct Storage<GMLP_NUM_BFLOAT16>    { using Type = uint16_t; };
template <> struct Storage<GMLP_NUM_FLOAT8_E4M3> { using Type = uint8_t; };
template <> struct Storage<GMLP_NUM_FLOAT8_E5M2> { using Type = uint8_t; };
template <> struct Storage<GMLP_NUM_INT32>       { using Type = int32_t; };
template <> struct Storage<GMLP_NUM_INT64>       { using Type = int64_t; };

template <int kDtype>
using StorageType = typename Storage<kDtype>::Type;

/* Floating storage (FP32, FP16, BF16) to float and back. Widening is
 * exact; narrowing rounds to nearest even, as gmlp-numeric.h does (the
 * hardware conversions agree with it on every value but NaN payloads, and
 * NaNs that went through arithmetic are the GPU's canonical NaN anyway). */
template <int kDtype>
__device__ __forceinline__ float
to_float (StorageType<kDtype> v)
{
  if constexpr (kDtype == GMLP_NUM_FLOAT32)
    return v;
  else if constexpr (kDtype == GMLP_NUM_FLOAT16)
    return __half2float (__ushort_as_half (v));
  else
    return __uint_as_float ((uint32_t) v << 16);
}

template <int kDtype>
__device__ __forceinline__ StorageType<kDtype>
from_float (float f)
{
  if constexpr (kDtype == GMLP_NUM_FLOAT32)
    return f;
  else if constexpr (kDtype == GMLP_NUM_FLOAT16)
    return __half_as_ushort (__float2half_rn (f));
  else
    return __bfloat16_as_ushort (__float2bfloat16_rn (f));
}

__host__ __device__ constexpr bool
is_float_dtype (int dtype)
{
  return dtype >= GMLP_NUM_FLOAT32 && dtype <= GMLP_NUM_FLOAT8_E5M2;
}

__host__ __device__ constexpr bool
is_int_dtype (int dtype)
{
  return dtype == GMLP_NUM_INT32 || dtype == GMLP_NUM_INT64;
}

/* kN consecutive elements moved as one aligned load or store. A pack of
 * up to 16 bytes is one instruction; larger packs are split by the compiler
 * into 16-byte accesses, all still in registers. */
template <typename T, int kN>
struct alignas (sizeof (T) * kN) Pack
{
  T v[kN];
};

/* Ceiling division for launch sizes. */
__host__ __device__ constexpr uint64_t
div_up (uint64_t a, uint64_t b)
{
  return (a + b - 1) / b;
}

/* Host-side helpers of the launch code. */
inline bool
is_aligned (const void *p, uint64_t alignment)
{
  return (uintptr_t) p % alignment == 0;
}

inline uint64_t
min_u64 (uint64_t a, uint64_t b)
{
  return a < b ? a : b;
}

/* The number of SMs of the current device, for sizing grid-stride launches;
 * asked once per device (device_cache.cu). */
cudaError_t GMLP_KERNEL_INTERNAL current_sm_count (int *sm_count);

/* Records err as this thread's last CUDA error and returns the status for a
 * failed launch. */
GmlpKernelStatus GMLP_KERNEL_INTERNAL record_cuda_error (cudaError_t err);

/* Checks the launch just made on this thread. */
static inline GmlpKernelStatus
check_launch (void)
{
  cudaError_t err = cudaGetLastError ();

  if (err != cudaSuccess)
    return record_cuda_error (err);
  return GMLP_KERNEL_SUCCESS;
}

}  // namespace gmlp
