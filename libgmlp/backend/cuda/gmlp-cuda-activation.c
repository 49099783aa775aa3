/* gmlp-cuda-activation.c: the activation entry point of the CUDA backend
 *
 * One planned launch of the grouped activation kernels (gmlp-kernels.h), as
 * for the bias operations: the per-group table is built and planned on the
 * host, goes up through kernel parameters into a pool allocation, and the
 * allocation is released, stream-ordered, once the launch is enqueued.
 * With device sizes (gmlp_cuda_activation_device()) the table is worked out
 * on the device, in the device's workspace. Nothing waits for the device.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-numeric.h"
#include "gmlp-cuda-private.h"

/* The backend's activation codes are passed to the kernels unchanged. */
G_STATIC_ASSERT (GMLP_ACT_GELU == (int) GMLP_KERNEL_ACT_GELU);
G_STATIC_ASSERT (GMLP_ACT_RELU == (int) GMLP_KERNEL_ACT_RELU);
G_STATIC_ASSERT (GMLP_ACT_SRELU == (int) GMLP_KERNEL_ACT_SRELU);
G_STATIC_ASSERT (GMLP_ACT_SWIGLU == (int) GMLP_KERNEL_ACT_SWIGLU);
G_STATIC_ASSERT (GMLP_ACT_GEGLU == (int) GMLP_KERNEL_ACT_GEGLU);
/* Whole 8-byte words, so that gmlp_cuda_upload_table() sends the table
 * through kernel parameters rather than a pageable copy that may wait. */
G_STATIC_ASSERT (sizeof (GmlpKernelActivationGroup) % sizeof (guint64) == 0);

/* The dtype and activation both entries take. */
static gboolean
check_activation (int      activation,
                  int      dtype,
                  GError **error)
{
  if (dtype != GMLP_NUM_FLOAT32 && dtype != GMLP_NUM_FLOAT16 && dtype != GMLP_NUM_BFLOAT16)
    {
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "CUDA: activation: dtype %d is not supported (FLOAT32, FLOAT16 or BFLOAT16)",
                   dtype);
      return FALSE;
    }
  if (activation < GMLP_ACT_GELU || activation > GMLP_ACT_GEGLU)
    {
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "CUDA: activation: unknown activation %d", activation);
      return FALSE;
    }
  return TRUE;
}

gboolean
gmlp_cuda_activation (GmlpBackendDevice   *device,
                      int                  activation,
                      guint                n_groups,
                      const gint64        *rows,
                      gint64               f,
                      int                  dtype,
                      const void * const  *in,
                      const void * const  *d_out,
                      void * const        *out,
                      GError             **error)
{
  const gboolean backward = d_out != NULL;
  g_autofree GmlpKernelActivationGroup *groups = NULL;
  GmlpKernelActivationPlan plan;
  GmlpKernelStatus status;
  gboolean any_rows = FALSE;
  gpointer table;

  if (!check_activation (activation, dtype, error))
    return FALSE;
  if (f < 0)
    {
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "CUDA: activation: negative size f=%" G_GINT64_FORMAT, f);
      return FALSE;
    }
  if (n_groups == 0)
    return TRUE;
  if (rows == NULL)
    {
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "CUDA: activation: missing group sizes");
      return FALSE;
    }
  /* Every size is checked, even where there turns out to be nothing to do. */
  for (guint i = 0; i < n_groups; i++)
    {
      if (rows[i] < 0)
        {
          g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                       "CUDA: activation: group %u has %" G_GINT64_FORMAT " rows",
                       i, rows[i]);
          return FALSE;
        }
      any_rows = any_rows || rows[i] > 0;
    }
  if (f == 0 || !any_rows)
    return TRUE;
  if (in == NULL || out == NULL)
    {
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "CUDA: activation: missing operand arrays");
      return FALSE;
    }

  groups = g_new (GmlpKernelActivationGroup, n_groups);
  for (guint i = 0; i < n_groups; i++)
    {
      groups[i].in = in[i];
      groups[i].d_out = backward ? d_out[i] : NULL;
      groups[i].out = out[i];
      groups[i].rows = rows[i];
      groups[i].first_tile = 0;
    }

  /* The plan checks the remaining arguments (the pointers of every group
   * with rows, sizes too large to address) before anything is enqueued. */
  status = gmlp_kernel_grouped_activation_plan (activation, dtype, backward ? 1 : 0, f,
                                                groups, n_groups, &plan);
  if (!gmlp_cuda_kernel_result (status, "gmlp_kernel_grouped_activation_plan", error))
    return FALSE;
  if (plan.n_tiles == 0)
    return TRUE;

  if (!gmlp_cuda_activate (device, error))
    return FALSE;

  table = gmlp_cuda_upload_table (device, groups, (gsize) n_groups * sizeof *groups,
                                  0, NULL, error);
  if (table == NULL)
    return FALSE;

  status = gmlp_kernel_grouped_activation (&plan, table, device->stream);
  gmlp_cuda_free (device, table);
  return gmlp_cuda_kernel_result (status, "gmlp_kernel_grouped_activation", error);
}

/* The sizes stay on the device: the kernels find the members and their
 * rows themselves, in the device's scratch workspace, so nothing is
 * allocated or waited for (graph-capturable). */
gboolean
gmlp_cuda_activation_device (GmlpBackendDevice       *device,
                             const GmlpBackendShape  *shape,
                             int                      activation,
                             int                      dtype,
                             gconstpointer            in,
                             gconstpointer            d_out,
                             gpointer                 out,
                             GError                 **error)
{
  GmlpKernelGroupedShape kernel_shape;
  gpointer workspace;
  gboolean ok;

  if (!check_activation (activation, dtype, error))
    return FALSE;
  if (shape->n_groups == 0 || shape->cols == 0)
    return TRUE;

  gmlp_cuda_kernel_shape (shape, &kernel_shape);
  if (!gmlp_cuda_activate (device, error))
    return FALSE;
  /* The group table goes through the device's workspace: see
   * scratch_lock. */
  g_rec_mutex_lock (&device->scratch_lock);
  workspace = gmlp_cuda_device_workspace (device,
                                          gmlp_kernel_grouped_activation_device_workspace_bytes (shape->n_groups),
                                          error);
  ok = workspace != NULL &&
       gmlp_cuda_kernel_result (gmlp_kernel_grouped_activation_device (&kernel_shape, activation, dtype,
                                                                       d_out != NULL ? 1 : 0, in, d_out,
                                                                       out, workspace, device->stream),
                                "gmlp_kernel_grouped_activation_device", error);
  g_rec_mutex_unlock (&device->scratch_lock);
  return ok;
}
