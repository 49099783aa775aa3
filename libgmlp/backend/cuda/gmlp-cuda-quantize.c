/* gmlp-cuda-quantize.c: FP8 quantization of the CUDA backend
 *
 * Host side of the kernels of kernels/quantize.cu, and the running of a
 * quantization that the fused activation and quantization
 * (gmlp-cuda-activation-quantize.c) shares. A quantize call is checked
 * first, so that a case the kernels do not cover is refused with its reason
 * before anything is enqueued; current scaling takes a small amax workspace
 * from the stream-ordered pool and gives it back in stream order. Nothing
 * here waits for the device.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-cuda-private.h"
#include "gmlp-cuda-quantize.h"

gboolean
gmlp_cuda_quantize_run (GmlpBackendDevice                  *device,
                        const GmlpKernelQuantize           *plain,
                        const GmlpKernelActivationQuantize *fused,
                        GError                            **error)
{
  GmlpKernelStatus status;
  const char *reason = NULL;
  gpointer workspace = NULL;
  gsize workspace_bytes;

  if (!gmlp_cuda_activate (device, error))
    return FALSE;

  status = plain != NULL ? gmlp_kernel_grouped_quantize_check (plain, &reason)
                         : gmlp_kernel_grouped_activation_quantize_check (fused, &reason);
  if (status == GMLP_KERNEL_UNSUPPORTED || status == GMLP_KERNEL_INVALID_VALUE)
    {
      g_set_error (error, GMLP_CUDA_ERROR,
                   status == GMLP_KERNEL_UNSUPPORTED ? GMLP_ERROR_UNSUPPORTED : GMLP_ERROR_INVALID_ARGUMENT,
                   "CUDA: %s: %s", plain != NULL ? "FP8 quantization" : "activation and FP8 quantization",
                   reason != NULL ? reason : "invalid arguments");
      return FALSE;
    }
  if (status != GMLP_KERNEL_SUCCESS)
    return gmlp_cuda_kernel_result (status,
                                    plain != NULL ? "gmlp_kernel_grouped_quantize_check"
                                                  : "gmlp_kernel_grouped_activation_quantize_check",
                                    error);

  workspace_bytes = plain != NULL ? gmlp_kernel_grouped_quantize_workspace_bytes (plain)
                                  : gmlp_kernel_grouped_activation_quantize_workspace_bytes (fused);
  if (workspace_bytes > 0)
    {
      workspace = gmlp_cuda_alloc (device, workspace_bytes, error);
      if (workspace == NULL)
        return FALSE;
    }
  status = plain != NULL ? gmlp_kernel_grouped_quantize (plain, workspace, device->stream)
                         : gmlp_kernel_grouped_activation_quantize (fused, workspace, device->stream);
  /* Used only by the work just enqueued: back to the pool in stream order. */
  gmlp_cuda_free (device, workspace);
  return gmlp_cuda_kernel_result (status,
                                  plain != NULL ? "gmlp_kernel_grouped_quantize"
                                                : "gmlp_kernel_grouped_activation_quantize",
                                  error);
}

gboolean
gmlp_cuda_quantize (GmlpBackendDevice          *device,
                    const GmlpBackendQuantize  *quantize,
                    GError                    **error)
{
  GmlpKernelQuantize q = { 0 };

  q.src_dtype = quantize->src_dtype;
  q.src = quantize->src;
  gmlp_cuda_quantize_set_outputs (&q, quantize);
  return gmlp_cuda_quantize_run (device, &q, NULL, error);
}

gboolean
gmlp_cuda_dequantize (GmlpBackendDevice          *device,
                      const GmlpBackendQuantize  *quantize,
                      GError                    **error)
{
  GmlpKernelDequantize d = { 0 };

  if (!gmlp_cuda_activate (device, error))
    return FALSE;

  gmlp_cuda_kernel_shape (&quantize->shape, &d.shape);
  d.recipe = quantize->recipe;
  d.flags = quantize->flags;
  d.fp8_dtype = quantize->fp8_dtype;
  d.data = quantize->data;
  d.scale_inv = quantize->scale_inv;
  d.dst = quantize->dst;
  d.dst_dtype = quantize->dst_dtype;
  return gmlp_cuda_kernel_result (gmlp_kernel_grouped_dequantize (&d, device->stream),
                                  "gmlp_kernel_grouped_dequantize", error);
}

gboolean
gmlp_cuda_quantizer_update (GmlpBackendDevice       *device,
                            float                   *state,
                            guint                    n_groups,
                            guint                    history_length,
                            int                      fp8_dtype,
                            int                      margin,
                            GError                 **error)
{
  if (!gmlp_cuda_activate (device, error))
    return FALSE;

  return gmlp_cuda_kernel_result (gmlp_kernel_quantizer_update (state, n_groups, history_length,
                                                                fp8_dtype, margin, device->stream),
                                  "gmlp_kernel_quantizer_update", error);
}
