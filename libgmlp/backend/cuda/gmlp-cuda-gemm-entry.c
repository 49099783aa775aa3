/* gmlp-cuda-gemm-entry.c: the CUDA backend's gemm and gemm_supported
 *
 * One entry for every product (GmlpBackendGemm). Each call describes its
 * product once (gmlp_cuda_gemm_describe(): the kernels' view of a
 * descriptor with device sizes, or with host sizes its GmlpCudaGroups,
 * each group's members in per-group pointer tables on the stack; the
 * route's statistics; the Hopper kernel's answer), asks gmlp_cuda_route()
 * once (docs/routes.md), and hands the answer to the executors of the
 * route: gmlp-cuda-gemm-device.c for device sizes, gmlp-cuda-gemm.c for
 * 16-bit and FP32 operands and gmlp-cuda-gemm-fp8.c for FP8 ones with host
 * sizes. gemm_supported reads the same description and route, so that
 * the dequantized fall-back it asks for and the product's route never
 * disagree.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-numeric.h"
#include "backend/gmlp-backend-gemm.h"
#include "gmlp-cuda-private.h"

/* The pointer tables of a call's description: on the stack up to
 * GMLP_BACKEND_GEMM_LOCAL_TABLES pointers. */
static gpointer *
gmlp_cuda_gemm_tables (const GmlpBackendGemm  *gemm,
                       gpointer               *local,
                       gpointer              **heap)
{
  gsize per_group = gemm->rows == NULL ? GMLP_CUDA_DEVICE_TABLES : GMLP_CUDA_GROUPS_TABLES;

  return gmlp_backend_gemm_tables (local, per_group * gemm->n_groups, heap);
}

/* Describes gemm to the route, in route->product: the descriptor's
 * statistics (gmlp_cuda_route_describe()) and, where the route reads it,
 * the Hopper kernel's answer. On the way route->kernel_gemm, the kernels'
 * view of the product, for the executors: with device sizes always (its
 * per-group tables in tables, of gmlp_cuda_gemm_tables()), with host
 * sizes where the kernel is asked; and with host sizes *groups, its
 * members' tables in tables. */
static void
gmlp_cuda_gemm_describe (GmlpBackendDevice      *device,
                         const GmlpBackendGemm  *gemm,
                         gpointer               *tables,
                         GmlpCudaGroups         *groups,
                         GmlpCudaGemmRoute      *route)
{
  GmlpCudaRouteProduct *product = &route->product;

  if (gemm->rows == NULL)
    gmlp_cuda_kernel_device_gemm (gemm, tables, &route->kernel_gemm);
  else
    gmlp_cuda_groups_init (gemm, tables, groups);
  gmlp_cuda_route_describe (gemm, gemm->rows != NULL ? groups : NULL, product);

  if (gmlp_cuda_route_asks_sm90 (product))
    {
      if (gemm->rows != NULL &&
          !gmlp_cuda_groups_kernel_gemm (groups, &route->kernel_gemm, &product->sm90_reason))
        product->sm90_unpacked = TRUE;
      else
        product->sm90_covers = gmlp_cuda_gemm_sm90_covers (device, &route->kernel_gemm,
                                                           &product->sm90_reason);
    }
}

/* The route reads the tuning, and its executors use the device's
 * handles, workspaces, side stream and scratch workspace: all under
 * scratch_lock. */
gboolean
gmlp_cuda_gemm (GmlpBackendDevice      *device,
                const GmlpBackendGemm  *gemm,
                GError                **error)
{
  gpointer local[GMLP_BACKEND_GEMM_LOCAL_TABLES];
  g_autofree gpointer *heap = NULL;
  gpointer *tables = gmlp_cuda_gemm_tables (gemm, local, &heap);
  GmlpCudaGroups groups;
  GmlpCudaGemmRoute route = { 0, };
  gboolean ok;

  g_rec_mutex_lock (&device->scratch_lock);
  gmlp_cuda_gemm_describe (device, gemm, tables, &groups, &route);
  route.choice = gmlp_cuda_route (&route.product, &device->props, &device->tuning);
  if (gemm->rows == NULL)
    ok = gmlp_cuda_gemm_device_sizes (device, &route, error);
  else if (gmlp_backend_gemm_is_fp8 (gemm))
    ok = gmlp_cuda_gemm_fp8_groups (device, &groups, &route, error);
  else
    ok = gmlp_cuda_gemm_groups (device, &groups, &route, error);
  g_rec_mutex_unlock (&device->scratch_lock);
  return ok;
}

/* Only FP8 operands are ever refused here, where the route answers
 * DEQUANTIZED (device sizes, and blockwise scales on the Hopper kernel
 * alone), or SM90_PADDED and the kernel does not take the padded copies;
 * under scratch_lock, as gemm. */
gboolean
gmlp_cuda_gemm_supported (GmlpBackendDevice      *device,
                          const GmlpBackendGemm  *gemm,
                          const char            **reason)
{
  gpointer local[GMLP_BACKEND_GEMM_LOCAL_TABLES];
  g_autofree gpointer *heap = NULL;
  gpointer *tables;
  GmlpCudaGroups groups;
  GmlpCudaGemmRoute route = { 0, };
  gboolean ok = TRUE;

  if (!gmlp_cuda_route_may_dequantize (gemm))
    return TRUE;

  tables = gmlp_cuda_gemm_tables (gemm, local, &heap);
  g_rec_mutex_lock (&device->scratch_lock);
  gmlp_cuda_gemm_describe (device, gemm, tables, &groups, &route);
  route.choice = gmlp_cuda_route (&route.product, &device->props, &device->tuning);
  switch (route.choice.route)
    {
    case GMLP_CUDA_ROUTE_SM90_PADDED:
      ok = gmlp_cuda_gemm_fp8_padded_supported (device, &groups, reason);
      break;

    case GMLP_CUDA_ROUTE_DEQUANTIZED:
      *reason = route.choice.reason != NULL ? route.choice.reason : "not covered";
      ok = FALSE;
      break;

    default:
      break;
    }
  g_rec_mutex_unlock (&device->scratch_lock);
  return ok;
}
