/* gmlp-cuda-activation-quantize.c: the fused activation and FP8
 * quantization of the CUDA backend
 *
 * Host side of kernels/activation_quantize.cu, the way
 * gmlp-cuda-quantize.c drives the quantize kernels: the call is checked
 * first, so that a case the kernels do not cover is refused with its reason
 * before anything is enqueued; current scaling takes its small amax
 * workspace from the stream-ordered pool and gives it back in stream order.
 * Nothing here waits for the device.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-cuda-private.h"
#include "gmlp-cuda-activation-quantize.h"

gboolean
gmlp_cuda_activation_quantize (GmlpBackendDevice       *device,
                               const GmlpBackendShape  *shape,
                               int                      activation,
                               gconstpointer            in,
                               int                      dtype,
                               int                      recipe,
                               int                      flags,
                               int                      fp8_dtype,
                               gpointer                 data,
                               gpointer                 scale_inv,
                               gpointer                 columnwise,
                               gpointer                 columnwise_scale_inv,
                               gint64                  *derived_rows,
                               float                   *state,
                               guint                    history_length,
                               GError                 **error)
{
  GmlpKernelActivationQuantize q = { 0 };
  GmlpKernelStatus status;
  const char *reason = NULL;
  gpointer workspace = NULL;
  gsize workspace_bytes;

  if (shape->n_groups == 0)
    return TRUE;
  if (!gmlp_cuda_activate (device, error))
    return FALSE;

  gmlp_cuda_kernel_shape (shape, &q.shape);
  q.activation = activation;
  q.dtype = dtype;
  q.in = in;
  q.recipe = recipe;
  q.flags = flags;
  q.fp8_dtype = fp8_dtype;
  q.data = data;
  q.scale_inv = scale_inv;
  q.columnwise = columnwise;
  q.columnwise_scale_inv = columnwise_scale_inv;
  q.derived_rows = (int64_t *) derived_rows;
  q.state = state;
  q.history_length = history_length;

  status = gmlp_kernel_grouped_activation_quantize_check (&q, &reason);
  if (status == GMLP_KERNEL_UNSUPPORTED || status == GMLP_KERNEL_INVALID_VALUE)
    {
      g_set_error (error, GMLP_CUDA_ERROR,
                   status == GMLP_KERNEL_UNSUPPORTED ? GMLP_ERROR_UNSUPPORTED : GMLP_ERROR_INVALID_ARGUMENT,
                   "CUDA: activation and FP8 quantization: %s",
                   reason != NULL ? reason : "invalid arguments");
      return FALSE;
    }
  if (status != GMLP_KERNEL_SUCCESS)
    return gmlp_cuda_kernel_result (status, "gmlp_kernel_grouped_activation_quantize_check", error);

  workspace_bytes = gmlp_kernel_grouped_activation_quantize_workspace_bytes (&q);
  if (workspace_bytes > 0)
    {
      workspace = gmlp_cuda_alloc (device, workspace_bytes, error);
      if (workspace == NULL)
        return FALSE;
    }
  status = gmlp_kernel_grouped_activation_quantize (&q, workspace, device->stream);
  /* Used only by the work just enqueued: back to the pool in stream order. */
  gmlp_cuda_free (device, workspace);
  return gmlp_cuda_kernel_result (status, "gmlp_kernel_grouped_activation_quantize", error);
}
