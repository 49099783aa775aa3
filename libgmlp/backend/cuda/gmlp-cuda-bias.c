/* gmlp-cuda-bias.c: the bias of the CUDA backend's cuBLAS products with
 * host sizes (gmlp_cuda_add_bias(), onto what cuBLAS stored),
 * bias_grad and bias_grad_device
 *
 * With host sizes, both are one planned launch of the grouped bias kernels
 * (gmlp-kernels.h): the per-group table is built and planned on the host,
 * goes up in one copy into a pool allocation that also holds the gradient's
 * scratch, and the allocation is released, stream-ordered, once the launch
 * is enqueued. With device sizes, see gmlp_cuda_bias_grad_device().
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-numeric.h"
#include "gmlp-cuda-private.h"

static gboolean
gmlp_cuda_bias_run (GmlpBackendDevice   *device,
                    GmlpKernelBiasOp     op,
                    guint                n_groups,
                    const gint64        *rows,
                    gint64               n,
                    int                  dtype,
                    void * const        *matrices,
                    void * const        *vectors,
                    GError             **error)
{
  const char *what = op == GMLP_KERNEL_BIAS_ADD ? "bias" : "bias_grad";
  g_autofree GmlpKernelBiasGroup *groups = NULL;
  GmlpKernelBiasPlan plan;
  GmlpKernelStatus status;
  gpointer table, scratch = NULL;

  if (dtype != GMLP_NUM_FLOAT32 && dtype != GMLP_NUM_FLOAT16 && dtype != GMLP_NUM_BFLOAT16)
    {
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "CUDA: %s: dtype %d is not supported (FLOAT32, FLOAT16 or BFLOAT16)",
                   what, dtype);
      return FALSE;
    }
  if (n < 0)
    {
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "CUDA: %s: negative size n=%" G_GINT64_FORMAT, what, n);
      return FALSE;
    }
  if (n_groups == 0 || n == 0)
    return TRUE;
  if (rows == NULL || matrices == NULL || vectors == NULL)
    {
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "CUDA: %s: missing group sizes or operand arrays", what);
      return FALSE;
    }

  groups = g_new (GmlpKernelBiasGroup, n_groups);
  for (guint i = 0; i < n_groups; i++)
    {
      if (rows[i] < 0)
        {
          g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                       "CUDA: %s: group %u has %" G_GINT64_FORMAT " rows", what, i, rows[i]);
          return FALSE;
        }
      groups[i].matrix = matrices[i];
      groups[i].vector = vectors[i];
      groups[i].rows = rows[i];
      groups[i].first_tile = 0;
    }

  status = gmlp_kernel_grouped_bias_plan (op, dtype, n, groups, n_groups, &plan);
  if (!gmlp_cuda_kernel_result (status, "gmlp_kernel_grouped_bias_plan", error))
    return FALSE;
  if (plan.n_tiles == 0)
    return TRUE;
  if (plan.scratch_bytes > G_MAXSIZE)
    {
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_OUT_OF_MEMORY,
                   "CUDA: %s: %" G_GUINT64_FORMAT " bytes of scratch do not fit in memory",
                   what, plan.scratch_bytes);
      return FALSE;
    }

  if (!gmlp_cuda_activate (device, error))
    return FALSE;

  table = gmlp_cuda_upload_table (device, groups, (gsize) n_groups * sizeof *groups,
                                  (gsize) plan.scratch_bytes, &scratch, error);
  if (table == NULL)
    return FALSE;

  status = gmlp_kernel_grouped_bias (&plan, table,
                                     plan.scratch_bytes > 0 ? scratch : NULL,
                                     device->stream);
  gmlp_cuda_free (device, table);
  return gmlp_cuda_kernel_result (status, "gmlp_kernel_grouped_bias", error);
}

gboolean
gmlp_cuda_add_bias (GmlpBackendDevice   *device,
                    guint                n_groups,
                    const gint64        *rows,
                    gint64               n,
                    int                  dtype,
                    void * const        *c,
                    const void * const  *bias,
                    GError             **error)
{
  /* The kernels' table has no const: the bias is only read. */
  return gmlp_cuda_bias_run (device, GMLP_KERNEL_BIAS_ADD, n_groups, rows, n, dtype,
                             c, (void * const *) bias, error);
}

gboolean
gmlp_cuda_bias_grad (GmlpBackendDevice   *device,
                     guint                n_groups,
                     const gint64        *rows,
                     gint64               n,
                     int                  dtype,
                     const void * const  *a,
                     void * const        *dbias,
                     GError             **error)
{
  /* The input is only read. */
  return gmlp_cuda_bias_run (device, GMLP_KERNEL_BIAS_GRAD, n_groups, rows, n, dtype,
                             (void * const *) a, dbias, error);
}

/* The sizes stay on the device: the kernels find the members themselves,
 * with the dbias pointers and their partial sums in the device's scratch
 * workspace, so nothing is allocated or waited for (graph-capturable). */
gboolean
gmlp_cuda_bias_grad_device (GmlpBackendDevice       *device,
                            const GmlpBackendShape  *shape,
                            int                      dtype,
                            gconstpointer            a,
                            void * const            *dbias,
                            GError                 **error)
{
  GmlpKernelGroupedShape kernel_shape;
  gsize workspace_bytes;
  gpointer workspace;
  gboolean ok;

  gmlp_cuda_kernel_shape (shape, &kernel_shape);
  if (!gmlp_cuda_activate (device, error))
    return FALSE;

  workspace_bytes = gmlp_kernel_grouped_bias_grad_device_workspace_bytes (&kernel_shape);
  if (workspace_bytes == 0 && shape->n_groups > 0 && shape->cols > 0)
    {
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "CUDA: bias_grad_device: %u groups of %" G_GINT64_FORMAT " columns and %"
                   G_GINT64_FORMAT " rows are too large", shape->n_groups, shape->cols,
                   shape->row_capacity);
      return FALSE;
    }
  /* The pointers and partial sums go through the device's workspace: see
   * scratch_lock. */
  g_rec_mutex_lock (&device->scratch_lock);
  workspace = gmlp_cuda_device_workspace (device, workspace_bytes, error);
  ok = workspace != NULL &&
       gmlp_cuda_kernel_result (gmlp_kernel_grouped_bias_grad_device (&kernel_shape, dtype, a,
                                                                      dbias, workspace,
                                                                      device->stream),
                                "gmlp_kernel_grouped_bias_grad_device", error);
  g_rec_mutex_unlock (&device->scratch_lock);
  return ok;
}
