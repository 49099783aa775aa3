/* gmlp-cuda-gemm-device.c: grouped products whose group sizes are on the device
 *
 * The backend's GmlpBackendGemmDevice becomes the kernels'
 * GmlpKernelDeviceGemm (the same fields, in the kernels' plain types). The
 * product runs on libgmlp's Hopper kernel where it applies (sm_90, 16-bit
 * operands, feature counts that TMA can address) and on the portable
 * kernel everywhere else, each with the device's scratch workspace for its
 * tables. Nothing here reads
 * the sizes, waits for the stream or allocates per call (the workspace only
 * grows, once), so the call can be captured in a graph.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-cuda-private.h"

/* The kernels' view of the backend's description. */
static void
gmlp_cuda_kernel_device_gemm (const GmlpBackendGemmDevice *gemm,
                              GmlpKernelDeviceGemm        *kernel_gemm)
{
  switch (gemm->kind)
    {
    case GMLP_GEMM_FPROP: kernel_gemm->kind = GMLP_KERNEL_GEMM_FPROP; break;
    case GMLP_GEMM_DGRAD: kernel_gemm->kind = GMLP_KERNEL_GEMM_DGRAD; break;
    case GMLP_GEMM_WGRAD: kernel_gemm->kind = GMLP_KERNEL_GEMM_WGRAD; break;
    default:              kernel_gemm->kind = (GmlpKernelGemmKind) -1; break;
    }
  kernel_gemm->n_groups = gemm->n_groups;
  kernel_gemm->device_rows = (const int64_t *) gemm->device_rows;
  kernel_gemm->row_capacity = gemm->row_capacity;
  kernel_gemm->n = gemm->n;
  kernel_gemm->k = gemm->k;
  kernel_gemm->ab_dtype = gemm->ab_dtype;
  kernel_gemm->c_dtype = gemm->c_dtype;
  kernel_gemm->a = gemm->a;
  kernel_gemm->b_rows = gemm->b_rows;
  kernel_gemm->c_rows = gemm->c_rows;
  kernel_gemm->weight = gemm->weight;
  kernel_gemm->wgrad = gemm->wgrad;
  kernel_gemm->bias = gemm->bias;
  kernel_gemm->accumulate = gemm->accumulate;
}

/* TRUE when libgmlp's Hopper kernel takes these arguments on this device.
 * GMLP_CUDA_DEVICE_GEMM=portable sends every call to the portable kernel
 * (the tests use it to check that path on Hopper too). */
static gboolean
gmlp_cuda_use_sm90 (GmlpBackendDevice          *device,
                    const GmlpKernelDeviceGemm *kernel_gemm,
                    int                        *n_sms)
{
  static gsize forced_portable = 0;   /* 0: not read yet, 1: no, 2: yes */
  int major = 0, minor = 0;

  if (g_once_init_enter (&forced_portable))
    g_once_init_leave (&forced_portable,
                       g_strcmp0 (g_getenv ("GMLP_CUDA_DEVICE_GEMM"), "portable") == 0 ? 2 : 1);
  if (forced_portable == 2)
    return FALSE;
  if (cudaDeviceGetAttribute (&major, cudaDevAttrComputeCapabilityMajor, device->ordinal) != cudaSuccess ||
      cudaDeviceGetAttribute (&minor, cudaDevAttrComputeCapabilityMinor, device->ordinal) != cudaSuccess ||
      cudaDeviceGetAttribute (n_sms, cudaDevAttrMultiProcessorCount, device->ordinal) != cudaSuccess)
    return FALSE;
  return gmlp_kernel_device_gemm_sm90_check (kernel_gemm, major, minor, NULL) == GMLP_KERNEL_SUCCESS;
}

gboolean
gmlp_cuda_gemm_device (GmlpBackendDevice            *device,
                       const GmlpBackendGemmDevice  *gemm,
                       GError                      **error)
{
  GmlpKernelDeviceGemm kernel_gemm;
  gpointer workspace;
  int n_sms = 0;

  gmlp_cuda_kernel_device_gemm (gemm, &kernel_gemm);
  if (!gmlp_cuda_activate (device, error))
    return FALSE;

  if (gmlp_cuda_use_sm90 (device, &kernel_gemm, &n_sms))
    {
      workspace = gmlp_cuda_device_workspace (device,
                                              gmlp_kernel_device_gemm_sm90_workspace_bytes (&kernel_gemm),
                                              error);
      if (workspace == NULL)
        return FALSE;
      return gmlp_cuda_kernel_result (gmlp_kernel_device_gemm_sm90 (&kernel_gemm, workspace,
                                                                    n_sms, device->stream),
                                      "gmlp_kernel_device_gemm_sm90", error);
    }

  /* Elsewhere (other GPUs, float32, odd feature counts) the portable
   * kernel is correct, if slower. */
  workspace = gmlp_cuda_device_workspace (device,
                                          gmlp_kernel_device_gemm_simt_workspace_bytes (&kernel_gemm),
                                          error);
  if (workspace == NULL)
    return FALSE;

  return gmlp_cuda_kernel_result (gmlp_kernel_device_gemm_simt (&kernel_gemm, workspace,
                                                                device->stream),
                                  "gmlp_kernel_device_gemm_simt", error);
}
