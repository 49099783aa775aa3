/* gmlp-cuda-gemm-device.c: grouped products whose group sizes are on the device
 *
 * The backend's GmlpBackendGemmDevice becomes the kernels'
 * GmlpKernelDeviceGemm (the same fields, in the kernels' plain types). The
 * product runs on libgmlp's Hopper kernel where it applies (sm_90, 16-bit
 * operands, feature counts that TMA can address) and on the portable
 * kernel everywhere else, each with the device's scratch workspace for its
 * tables. Nothing here reads
 * the sizes, waits for the stream or allocates per call (the workspace only
 * grows, once), so the call can be captured in a graph. Products with host
 * sizes that gmlp-cuda-gemm.c routes here run on the Hopper kernel too,
 * their sizes passed like the other host tables.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-numeric.h"
#include "gmlp-cuda-private.h"

static GmlpKernelGemmKind
gmlp_cuda_kernel_gemm_kind (GmlpGemmKind kind)
{
  switch (kind)
    {
    case GMLP_GEMM_FPROP: return GMLP_KERNEL_GEMM_FPROP;
    case GMLP_GEMM_DGRAD: return GMLP_KERNEL_GEMM_DGRAD;
    case GMLP_GEMM_WGRAD: return GMLP_KERNEL_GEMM_WGRAD;
    default:              return (GmlpKernelGemmKind) -1;
    }
}

/* The kernels' view of the backend's description. */
static void
gmlp_cuda_kernel_device_gemm (const GmlpBackendGemmDevice *gemm,
                              GmlpKernelDeviceGemm        *kernel_gemm)
{
  kernel_gemm->kind = gmlp_cuda_kernel_gemm_kind (gemm->kind);
  kernel_gemm->n_groups = gemm->n_groups;
  kernel_gemm->device_rows = (const int64_t *) gemm->device_rows;
  kernel_gemm->host_rows = NULL;
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

/* Whether the members of a grouped operand lie as a grouped tensor lays
 * them out (gmlp_num_member_stride() apart, from pointers[0]): the
 * Hopper kernel addresses them from the first one. */
static gboolean
gmlp_cuda_gemm_is_packed (const void * const *pointers,
                          const gint64       *rows,
                          guint               n_groups,
                          guint64             row_bytes)
{
  const guint8 *expected = pointers[0];

  for (guint g = 0; g < n_groups; g++)
    {
      if ((const guint8 *) pointers[g] != expected)
        return FALSE;
      expected += gmlp_num_member_stride (rows[g], row_bytes);
    }
  return TRUE;
}

gboolean
gmlp_cuda_gemm_host_rows_sm90 (GmlpBackendDevice      *device,
                               const GmlpBackendGemm  *gemm,
                               gboolean               *taken,
                               GError                **error)
{
  gboolean wgrad = gemm->kind == GMLP_GEMM_WGRAD;
  const void * const *second = wgrad ? gemm->b : (const void * const *) gemm->c;
  guint64 ab_size = gmlp_num_dtype_size (gemm->ab_dtype);
  guint64 second_size = wgrad ? ab_size : (guint64) gmlp_num_dtype_size (gemm->c_dtype);
  gint64 a_cols = gemm->kind == GMLP_GEMM_FPROP ? gemm->k : gemm->n;
  gint64 second_cols = gemm->kind == GMLP_GEMM_FPROP ? gemm->n : gemm->k;
  gint64 capacity = 0;
  GmlpKernelDeviceGemm kernel_gemm;
  gpointer workspace;
  int n_sms = 0;

  *taken = FALSE;
  if (gemm->n_groups == 0 ||
      !gmlp_cuda_gemm_is_packed (gemm->a, gemm->rows, gemm->n_groups, a_cols * ab_size) ||
      !gmlp_cuda_gemm_is_packed (second, gemm->rows, gemm->n_groups, second_cols * second_size))
    return FALSE;

  for (guint g = 0; g < gemm->n_groups; g++)
    capacity += MAX (gemm->rows[g], 0);
  kernel_gemm = (GmlpKernelDeviceGemm) {
    .kind = gmlp_cuda_kernel_gemm_kind (gemm->kind),
    .n_groups = gemm->n_groups,
    .host_rows = gemm->rows,
    .row_capacity = capacity,
    .n = gemm->n,
    .k = gemm->k,
    .ab_dtype = gemm->ab_dtype,
    .c_dtype = gemm->c_dtype,
    .a = gemm->a[0],
    .b_rows = wgrad ? gemm->b[0] : NULL,
    .c_rows = wgrad ? NULL : gemm->c[0],
    .weight = wgrad ? NULL : gemm->b,
    .wgrad = wgrad ? gemm->c : NULL,
    .accumulate = gemm->accumulate,
  };
  if (!gmlp_cuda_use_sm90 (device, &kernel_gemm, &n_sms))
    return FALSE;

  *taken = TRUE;
  workspace = gmlp_cuda_device_workspace (device,
                                          gmlp_kernel_device_gemm_sm90_workspace_bytes (&kernel_gemm),
                                          error);
  if (workspace == NULL)
    return FALSE;
  return gmlp_cuda_kernel_result (gmlp_kernel_device_gemm_sm90 (&kernel_gemm, workspace,
                                                                n_sms, device->stream),
                                  "gmlp_kernel_device_gemm_sm90", error);
}
