/* impls/device_cache.cuh: device attributes and kernel settings, asked once
 *
 * The launch code sizes grids from the SM count and the occupancy of its
 * kernels, and raises a kernel's dynamic shared memory limit before it
 * launches. The answers depend only on the device and the kernel, yet each
 * query is a call into the driver that costs microseconds of host time, and a
 * layer's call makes dozens of launches. These functions ask once per device
 * ordinal (and kernel, block size and shared memory) and keep the answer; a
 * later call costs a cudaGetDevice (a thread-local read in the runtime) and a
 * look-up. Failed queries are not kept, so an error is reported as before.
 *
 * NOTE: a kernel's attributes belong to the device's (primary) context. The
 * library never resets a device; a reset by other code in the process frees
 * the library's memory as well, so nothing the cache keeps outlives it
 * usefully.
 *
 * Internal to the kernels library: nothing here is part of the C ABI.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <stddef.h>

#include <cuda_runtime.h>

#include "impls/common.cuh"

namespace gmlp {

/* attr of the current device (cudaDeviceGetAttribute). */
cudaError_t GMLP_KERNEL_INTERNAL current_device_attribute (cudaDeviceAttr attr, int *value);

/* cudaOccupancyMaxActiveBlocksPerMultiprocessor (kernel, threads, smem) on
 * the current device. */
cudaError_t GMLP_KERNEL_INTERNAL current_blocks_per_sm (const void *kernel,
                                                        int         threads,
                                                        size_t      dynamic_smem,
                                                        int        *blocks);

/* The static shared memory of kernel (cudaFuncGetAttributes'
 * sharedSizeBytes) on the current device. */
cudaError_t GMLP_KERNEL_INTERNAL current_static_smem (const void *kernel, size_t *bytes);

/* Sets kernel's cudaFuncAttributeMaxDynamicSharedMemorySize to bytes on the
 * current device, unless bytes is what it was last set to there. */
cudaError_t GMLP_KERNEL_INTERNAL current_max_dynamic_smem (const void *kernel, int bytes);

/* cudaOccupancyMaxActiveClusters (kernel, config) on the current device, for
 * a config whose only attribute is its cluster dimension (cluster_ctas CTAs
 * along x): kept per kernel, grid, block, shared memory and cluster. */
cudaError_t GMLP_KERNEL_INTERNAL current_max_clusters (const void               *kernel,
                                                       const cudaLaunchConfig_t *config,
                                                       int                       cluster_ctas,
                                                       int                      *clusters);

}  // namespace gmlp
