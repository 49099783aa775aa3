/* gmlp-cuda-activation-quantize.c: the fused activation and FP8
 * quantization of the CUDA backend
 *
 * Host side of kernels/activation_quantize.cu: the call is translated as
 * gmlp-cuda-quantize.c translates a quantize call, and run by the same code
 * (gmlp_cuda_quantize_run()): checked first, so that a case the kernels do
 * not cover is refused with its reason before anything is enqueued; current
 * scaling takes its small amax workspace from the stream-ordered pool and
 * gives it back in stream order. Nothing here waits for the device.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-cuda-private.h"
#include "gmlp-cuda-activation-quantize.h"
#include "gmlp-cuda-quantize.h"

gboolean
gmlp_cuda_activation_quantize (GmlpBackendDevice          *device,
                               const GmlpBackendQuantize  *quantize,
                               GError                    **error)
{
  GmlpKernelActivationQuantize q = { 0 };

  if (quantize->shape.n_groups == 0)
    return TRUE;

  q.activation = quantize->activation;
  q.dtype = quantize->src_dtype;
  q.in = quantize->src;
  gmlp_cuda_quantize_set_outputs (&q, quantize);
  return gmlp_cuda_quantize_run (device, NULL, &q, error);
}
