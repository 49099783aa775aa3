/* gmlp-cuda-gemm-device.c: grouped products whose group sizes are on the device
 *
 * A GmlpBackendGemm with device sizes becomes the kernels'
 * GmlpKernelDeviceGemm (gmlp_cuda_kernel_device_gemm(), for the entry's
 * description): the grouped operands by their bases, the per-group ones
 * (weights, weight gradients, bias, per-tensor scales) as the host tables
 * the kernels take, built from the descriptor. The product runs on
 * libgmlp's Hopper kernel where it applies (sm_90, 16-bit or FP8
 * operands, feature counts that TMA can address) and on the portable
 * kernel everywhere else, as the route the entry asked says, each with the
 * device's scratch workspace for its tables. Nothing here reads the sizes,
 * waits for the stream or allocates per call (the workspace only grows,
 * once), so the call can be captured in a graph. Products with host sizes
 * that the route sends to the Hopper kernel run here too
 * (gmlp_cuda_groups_kernel_gemm(): their sizes passed like the other host
 * tables), and whether the kernel covers a product is asked here
 * (gmlp_cuda_gemm_sm90_covers()).
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-numeric.h"
#include "backend/gmlp-backend-gemm.h"
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

/* The kernels' view of the backend's FP8 scale layout (the same fields). */
static GmlpKernelFp8Scales
gmlp_cuda_kernel_fp8_scales (const GmlpBackendFp8Scales *s)
{
  return (GmlpKernelFp8Scales) {
    .row_block = s->row_block,
    .row_stride = s->row_stride,
    .depth_stride = s->depth_stride,
  };
}

/* The kernels' view of a descriptor with device sizes; tables holds
 * GMLP_CUDA_DEVICE_TABLES × n_groups pointers, one block for the host
 * tables of all its per-group operands. Grouped scales (blockwise,
 * following the sizes) go by their base, the others by a table. */
void
gmlp_cuda_kernel_device_gemm (const GmlpBackendGemm *gemm,
                              gpointer              *tables,
                              GmlpKernelDeviceGemm  *kernel_gemm)
{
  gboolean wgrad = gemm->kind == GMLP_GEMM_WGRAD;
  guint n = gemm->n_groups;
  const GmlpBackendOperand *fixed = wgrad ? &gemm->c : &gemm->b;
  gpointer *pfixed = tables, *pbias = tables + n;
  const float **sa = (const float **) (tables + 2 * n), **sb = (const float **) (tables + 3 * n);
  gboolean fp8 = gmlp_backend_gemm_is_fp8 (gemm);
  gboolean bias = gemm->kind == GMLP_GEMM_FPROP && gemm->bias.layout != GMLP_BACKEND_OPERAND_NONE;
  gboolean a_rows = gmlp_backend_operand_scales_follow_rows (&gemm->a);
  gboolean b_rows = gmlp_backend_operand_scales_follow_rows (&gemm->b);

  for (guint g = 0; g < n; g++)
    {
      pfixed[g] = gmlp_backend_operand_fixed (fixed, g);
      if (bias)
        pbias[g] = gmlp_backend_operand_fixed (&gemm->bias, g);
      if (fp8)
        {
          sa[g] = gmlp_backend_operand_fixed_scales (&gemm->a, g);
          sb[g] = gmlp_backend_operand_fixed_scales (&gemm->b, g);
        }
    }
  *kernel_gemm = (GmlpKernelDeviceGemm) {
    .kind = gmlp_cuda_kernel_gemm_kind (gemm->kind),
    .n_groups = n,
    .device_rows = (const int64_t *) gemm->device_rows,
    .row_capacity = gemm->row_capacity,
    .n = gemm->n,
    .k = gemm->k,
    .ab_dtype = gemm->a.dtype,
    .c_dtype = gemm->c.dtype,
    .a = gemm->a.base,
    .b_rows = wgrad ? gemm->b.base : NULL,
    .c_rows = wgrad ? NULL : gemm->c.base,
    .weight = wgrad ? NULL : (const void * const *) pfixed,
    .wgrad = wgrad ? (void * const *) pfixed : NULL,
    .bias = bias ? (const void * const *) pbias : NULL,
    .accumulate = wgrad ? gemm->accumulate : NULL,
  };
  if (!fp8)
    return;
  kernel_gemm->b_dtype = gemm->b.dtype;
  kernel_gemm->a_scale_inv = a_rows || gemm->a.scale_inv == NULL ? NULL : sa;
  kernel_gemm->b_scale_inv = b_rows || gemm->b.scale_inv == NULL ? NULL : sb;
  kernel_gemm->a_scales = gmlp_cuda_kernel_fp8_scales (&gemm->a.scales);
  kernel_gemm->b_scales = gmlp_cuda_kernel_fp8_scales (&gemm->b.scales);
  kernel_gemm->a_scale_rows = a_rows ? gemm->a.scale_inv : NULL;
  kernel_gemm->b_scale_rows = b_rows ? gemm->b.scale_inv : NULL;
}

/* Whether libgmlp's Hopper kernel covers kernel_gemm on this device; if
 * not, why in *reason (a static string). The tuning's device_gemm is the
 * route's to read (gmlp-cuda-route.c). */
gboolean
gmlp_cuda_gemm_sm90_covers (GmlpBackendDevice          *device,
                            const GmlpKernelDeviceGemm *kernel_gemm,
                            const char                **reason)
{
  return gmlp_kernel_device_gemm_sm90_check (kernel_gemm, &device->sm90_tuning, device->props.major,
                                             device->props.minor, reason) == GMLP_KERNEL_SUCCESS;
}

/* Enqueues kernel_gemm, which the Hopper kernel covers, on it. */
gboolean
gmlp_cuda_gemm_sm90_run (GmlpBackendDevice          *device,
                         const GmlpKernelDeviceGemm *kernel_gemm,
                         GError                    **error)
{
  gpointer workspace;

  workspace = gmlp_cuda_device_workspace (device,
                                          gmlp_kernel_device_gemm_sm90_workspace_bytes (kernel_gemm,
                                                                                        &device->sm90_tuning),
                                          error);
  if (workspace == NULL)
    return FALSE;
  return gmlp_cuda_kernel_result (gmlp_kernel_device_gemm_sm90 (kernel_gemm, &device->sm90_tuning,
                                                                workspace, device->props.n_sms,
                                                                device->stream),
                                  "gmlp_kernel_device_gemm_sm90", error);
}

static const char gmlp_cuda_device_fp8_only_sm90[] =
  "CUDA: FP8 products with device sizes run on libgmlp's Hopper kernel only";

/* The route's executors with device sizes, on the kernels' view that the
 * entry built (route->kernel_gemm), under scratch_lock: the tables and
 * plans go through the device's workspace. */
gboolean
gmlp_cuda_gemm_device_sizes (GmlpBackendDevice        *device,
                             const GmlpCudaGemmRoute  *route,
                             GError                  **error)
{
  const GmlpKernelDeviceGemm *kernel_gemm = &route->kernel_gemm;
  gpointer workspace;

  if (!gmlp_cuda_activate (device, error))
    return FALSE;

  switch (route->choice.route)
    {
    case GMLP_CUDA_ROUTE_SM90:
      return gmlp_cuda_gemm_sm90_run (device, kernel_gemm, error);

    case GMLP_CUDA_ROUTE_PORTABLE:
      /* Elsewhere (other GPUs, float32, odd feature counts) the portable
       * kernel is correct, if slower. */
      workspace = gmlp_cuda_device_workspace (device,
                                              gmlp_kernel_device_gemm_simt_workspace_bytes (kernel_gemm),
                                              error);
      if (workspace == NULL)
        return FALSE;
      return gmlp_cuda_kernel_result (gmlp_kernel_device_gemm_simt (kernel_gemm, workspace,
                                                                    device->stream),
                                      "gmlp_kernel_device_gemm_simt", error);

    case GMLP_CUDA_ROUTE_DEQUANTIZED:
    default:
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_UNSUPPORTED, "%s: %s",
                   gmlp_cuda_device_fp8_only_sm90,
                   route->choice.reason != NULL ? route->choice.reason : "not covered");
      return FALSE;
    }
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

/* The kernel description of a host-sizes product, dtypes and scales left
 * to the caller: FPROP and DGRAD have a and c grouped by rows and b the
 * per-group matrices; WGRAD a and b grouped by rows (a_size and b_size
 * bytes a value) and c the per-group outputs. FALSE, *out untouched, where
 * a grouped operand is not packed from its first member, as the kernel
 * addresses it; row_capacity is the sum of the rows. */
static gboolean
gmlp_cuda_host_rows_gemm (GmlpGemmKind         kind,
                          guint                n_groups,
                          const gint64        *rows,
                          gint64               n,
                          gint64               k,
                          const void * const  *a,
                          const void * const  *b,
                          void * const        *c,
                          guint64              a_size,
                          guint64              b_size,
                          guint64              c_size,
                          const guint8        *accumulate,
                          GmlpKernelDeviceGemm *out)
{
  gboolean wgrad = kind == GMLP_GEMM_WGRAD;
  gint64 a_cols = kind == GMLP_GEMM_FPROP ? k : n;
  gint64 second_cols = kind == GMLP_GEMM_FPROP ? n : k;
  const void * const *second = wgrad ? b : (const void * const *) c;
  gint64 capacity = 0;

  if (n_groups == 0 || !gmlp_cuda_gemm_is_packed (a, rows, n_groups, a_cols * a_size) ||
      !gmlp_cuda_gemm_is_packed (second, rows, n_groups, second_cols * (wgrad ? b_size : c_size)))
    return FALSE;
  for (guint g = 0; g < n_groups; g++)
    capacity += MAX (rows[g], 0);
  *out = (GmlpKernelDeviceGemm) {
    .kind = gmlp_cuda_kernel_gemm_kind (kind),
    .n_groups = n_groups,
    .host_rows = rows,
    .row_capacity = capacity,
    .n = n,
    .k = k,
    .a = a[0],
    .b_rows = wgrad ? b[0] : NULL,
    .c_rows = wgrad ? NULL : c[0],
    .weight = wgrad ? NULL : b,
    .wgrad = wgrad ? c : NULL,
    .accumulate = accumulate,
  };
  return TRUE;
}

/* FPROP and DGRAD: a and c grouped by rows, b the per-group matrices (W_i,
 * or FP8 DGRAD's Wᵀ_i). WGRAD: a and b grouped by rows (FP8: the
 * columnwise copies of dy and x, member i n × m_i and k × m_i, laid out as
 * the rowwise members), c the per-group outputs. */
gboolean
gmlp_cuda_groups_kernel_gemm (const GmlpCudaGroups  *groups,
                              GmlpKernelDeviceGemm  *kernel_gemm,
                              const char           **reason)
{
  gboolean fp8 = gmlp_num_dtype_is_fp8 (groups->ab_dtype);

  *reason = "the operands are not laid out as grouped tensors lay them out";
  if (groups->kind != GMLP_GEMM_FPROP && groups->kind != GMLP_GEMM_DGRAD &&
      groups->kind != GMLP_GEMM_WGRAD)
    return FALSE;
  if (!gmlp_cuda_host_rows_gemm (groups->kind, groups->n_groups, groups->rows, groups->n, groups->k,
                                 groups->a, groups->b, groups->c, gmlp_num_dtype_size (groups->ab_dtype),
                                 gmlp_num_dtype_size (groups->b_dtype),
                                 gmlp_num_dtype_size (groups->c_dtype), groups->accumulate, kernel_gemm))
    return FALSE;
  *reason = NULL;
  kernel_gemm->ab_dtype = groups->ab_dtype;
  kernel_gemm->c_dtype = groups->c_dtype;
  kernel_gemm->bias = groups->kind == GMLP_GEMM_FPROP ? groups->bias : NULL;
  if (!fp8)
    return TRUE;
  kernel_gemm->b_dtype = groups->b_dtype;
  kernel_gemm->a_scale_inv = groups->a_scale_inv;
  kernel_gemm->b_scale_inv = groups->b_scale_inv;
  kernel_gemm->a_scales = gmlp_cuda_kernel_fp8_scales (&groups->a_scales);
  kernel_gemm->b_scales = gmlp_cuda_kernel_fp8_scales (&groups->b_scales);
  return TRUE;
}
