/* gmlp-kernels.h: the C ABI of libgmlp's CUDA kernels
 *
 * Plain C: no GLib, no C++ types. The kernels own no memory; callers pass
 * device pointers and a stream. Every entry point checks its arguments and the
 * launch and returns a status code; none exits or throws.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#ifndef GMLP_KERNELS_H
#define GMLP_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  GMLP_KERNEL_SUCCESS = 0,
  GMLP_KERNEL_INVALID_VALUE,   /* a NULL pointer, a bad dtype, a bad size */
  GMLP_KERNEL_UNSUPPORTED,     /* valid, but not implemented for these types */
  GMLP_KERNEL_LAUNCH_FAILED,   /* the CUDA launch failed: see the cuda error */
} GmlpKernelStatus;

/* dtype codes are the GMLP_NUM_* values of gmlp-numeric.h (= GmlpDType). */

/* A grouped shape whose group sizes are on the device. */
typedef struct {
  const int64_t *device_rows;  /* n_groups values, device memory */
  uint32_t       n_groups;
  int64_t        cols;
  int64_t        row_capacity; /* rows the allocation can hold in total */
} GmlpKernelGroupedShape;

const char      *gmlp_kernel_status_to_string (GmlpKernelStatus status);

/* The cudaError_t of the last failed launch on this thread. */
cudaError_t      gmlp_kernel_get_last_cuda_error (void);

/* Converts every member of a grouped tensor from src_dtype to dst_dtype in
 * one launch; both tensors use the member layout of gmlp_num_member_stride()
 * with their own element size. Floating types convert through float with
 * round-to-nearest-even and FP8 saturation; INT32 <-> INT64 converts exactly. */
GmlpKernelStatus gmlp_kernel_convert_grouped  (const GmlpKernelGroupedShape *shape,
                                               const void                   *src,
                                               int                           src_dtype,
                                               void                         *dst,
                                               int                           dst_dtype,
                                               cudaStream_t                  stream);

/* dst[i] = gmlp_num_random_uniform(seed, i, scale) for i < n_elements. */
GmlpKernelStatus gmlp_kernel_fill_random      (void                         *dst,
                                               int                           dtype,
                                               uint64_t                      n_elements,
                                               uint64_t                      seed,
                                               float                         scale,
                                               cudaStream_t                  stream);

#ifdef __cplusplus
}
#endif

#endif /* GMLP_KERNELS_H */
