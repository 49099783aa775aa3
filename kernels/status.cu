/* status.cu: status strings and the per-thread record of CUDA errors
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "gmlp-kernels.h"
#include "impls/common.cuh"

namespace {

/* NOTE: thread-local because launches from different host threads must not
 * see each other's failures. Trivially initialised, so no TLS constructor. */
thread_local cudaError_t last_cuda_error = cudaSuccess;

}  // namespace

namespace gmlp {

GmlpKernelStatus
record_cuda_error (cudaError_t err)
{
  last_cuda_error = err;
  return GMLP_KERNEL_LAUNCH_FAILED;
}

}  // namespace gmlp

extern "C" const char *
gmlp_kernel_status_to_string (GmlpKernelStatus status)
{
  switch (status)
    {
    case GMLP_KERNEL_SUCCESS:
      return "success";
    case GMLP_KERNEL_INVALID_VALUE:
      return "invalid value";
    case GMLP_KERNEL_UNSUPPORTED:
      return "unsupported";
    case GMLP_KERNEL_LAUNCH_FAILED:
      return "launch failed";
    default:
      return "unknown status";
    }
}

extern "C" cudaError_t
gmlp_kernel_get_last_cuda_error (void)
{
  return last_cuda_error;
}
