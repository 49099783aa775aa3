/* gmlp-cuda-gemm-device.c: grouped products whose group sizes are on the device
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-cuda-private.h"

gboolean
gmlp_cuda_gemm_device (GmlpBackendDevice            *device,
                       const GmlpBackendGemmDevice  *gemm,
                       GError                      **error)
{
  g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_UNSUPPORTED,
               "CUDA: grouped products with device sizes are not implemented yet");
  return FALSE;
}
