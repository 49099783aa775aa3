/* gmlp-cuda-gemm-entry.c: the CUDA backend's gemm and gemm_supported
 *
 * One entry for every product (GmlpBackendGemm). With the group sizes on
 * the device the descriptor goes as it is to gmlp-cuda-gemm-device.c,
 * whose kernels read the sizes there. With host sizes it is taken apart
 * here, once, into each group's members (GmlpCudaGroups: the per-group
 * pointer tables that cuBLAS and cuBLASLt take, on the stack), for
 * the 16-bit executors (gmlp-cuda-gemm.c) or the FP8 ones
 * (gmlp-cuda-gemm-fp8.c). Each executor's file describes the product to
 * gmlp_cuda_route() (docs/routes.md) and runs the route's answer.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-numeric.h"
#include "backend/gmlp-backend-gemm.h"
#include "gmlp-cuda-private.h"

/* The pointer tables a group has: a, b, c, bias and FP8's two scales, on
 * the stack up to GMLP_BACKEND_GEMM_LOCAL_TABLES pointers. */
#define GMLP_CUDA_GROUPS_TABLES 6

/* A descriptor with host sizes, group by group; tables holds
 * GMLP_CUDA_GROUPS_TABLES × n_groups pointers. */
static void
gmlp_cuda_groups_init (const GmlpBackendGemm *gemm,
                       gpointer              *tables,
                       GmlpCudaGroups        *groups)
{
  guint n = gemm->n_groups;
  gboolean fp8 = gmlp_backend_gemm_is_fp8 (gemm);
  gboolean bias = gemm->kind == GMLP_GEMM_FPROP && gemm->bias.layout != GMLP_BACKEND_OPERAND_NONE;

  *groups = (GmlpCudaGroups) {
    .kind = gemm->kind,
    .n_groups = n,
    .rows = gemm->rows,
    .n = gemm->n,
    .k = gemm->k,
    .ab_dtype = gemm->a.dtype,
    .b_dtype = gemm->b.dtype,
    .c_dtype = gemm->c.dtype,
    .a = (const void * const *) tables,
    .b = (const void * const *) (tables + n),
    .c = (void * const *) (tables + 2 * n),
    .bias = bias ? (const void * const *) (tables + 3 * n) : NULL,
    .accumulate = gemm->kind == GMLP_GEMM_WGRAD ? gemm->accumulate : NULL,
    .a_scales = gemm->a.scales,
    .b_scales = gemm->b.scales,
  };
  gmlp_backend_gemm_members (gemm, &gemm->a, tables);
  gmlp_backend_gemm_members (gemm, &gemm->b, tables + n);
  gmlp_backend_gemm_members (gemm, &gemm->c, tables + 2 * n);
  if (bias)
    gmlp_backend_gemm_members (gemm, &gemm->bias, tables + 3 * n);
  if (!fp8)
    return;
  if (gemm->a.scale_inv != NULL && gemm->b.scale_inv != NULL)
    {
      groups->a_scale_inv = (const float * const *) (tables + 4 * n);
      groups->b_scale_inv = (const float * const *) (tables + 5 * n);
      gmlp_backend_gemm_scale_members (gemm, &gemm->a, (const float **) (tables + 4 * n));
      gmlp_backend_gemm_scale_members (gemm, &gemm->b, (const float **) (tables + 5 * n));
    }
}

gboolean
gmlp_cuda_gemm (GmlpBackendDevice      *device,
                const GmlpBackendGemm  *gemm,
                GError                **error)
{
  gpointer local[GMLP_BACKEND_GEMM_LOCAL_TABLES];
  g_autofree gpointer *heap = NULL;
  GmlpCudaGroups groups;

  if (gemm->rows == NULL)
    return gmlp_cuda_gemm_device_sizes (device, gemm, error);

  gmlp_cuda_groups_init (gemm, gmlp_backend_gemm_tables (local, GMLP_CUDA_GROUPS_TABLES *
                                                          (gsize) gemm->n_groups, &heap),
                         &groups);
  if (gmlp_backend_gemm_is_fp8 (gemm))
    return gmlp_cuda_gemm_fp8_groups (device, &groups, error);
  return gmlp_cuda_gemm_groups (device, &groups, error);
}

/* Only FP8 operands are ever refused here: device sizes and blockwise
 * scales on the Hopper kernel alone (the route's DEQUANTIZED). */
gboolean
gmlp_cuda_gemm_supported (GmlpBackendDevice      *device,
                          const GmlpBackendGemm  *gemm,
                          const char            **reason)
{
  gpointer local[GMLP_BACKEND_GEMM_LOCAL_TABLES];
  g_autofree gpointer *heap = NULL;
  GmlpCudaGroups groups;

  if (!gmlp_backend_gemm_is_fp8 (gemm))
    return TRUE;
  if (gemm->rows == NULL)
    return gmlp_cuda_gemm_device_supported (device, gemm, reason);
  if (!gmlp_backend_gemm_blockwise (gemm))
    return TRUE;

  gmlp_cuda_groups_init (gemm, gmlp_backend_gemm_tables (local, GMLP_CUDA_GROUPS_TABLES *
                                                          (gsize) gemm->n_groups, &heap),
                         &groups);
  return gmlp_cuda_gemm_fp8_supported (device, &groups, reason);
}
