/* gmlp-cuda-quantize.h: FP8 quantization entries of the CUDA backend
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "gmlp-kernels.h"
#include "backend/gmlp-backend.h"

G_BEGIN_DECLS

/* See the quantize, dequantize and quantizer_update entries of GmlpBackend. */
gboolean gmlp_cuda_quantize         (GmlpBackendDevice          *device,
                                     const GmlpBackendQuantize  *quantize,
                                     GError                    **error);
gboolean gmlp_cuda_dequantize       (GmlpBackendDevice          *device,
                                     const GmlpBackendQuantize  *quantize,
                                     GError                    **error);
gboolean gmlp_cuda_quantizer_update (GmlpBackendDevice       *device,
                                     float                   *state,
                                     guint                    n_groups,
                                     guint                    history_length,
                                     int                      fp8_dtype,
                                     int                      margin,
                                     GError                 **error);

/* For the quantize entries, plain and fused (gmlp-cuda-activation-quantize.c). */

/* Sets the fields that GmlpKernelQuantize and GmlpKernelActivationQuantize
 * name alike (the shape, the scaling and the FP8 outputs) from an entry's
 * GmlpBackendQuantize: a macro, as it fills either. */
#define gmlp_cuda_quantize_set_outputs(q, quantize_) \
  G_STMT_START { \
    const GmlpBackendQuantize *q_in_ = (quantize_); \
    gmlp_cuda_kernel_shape (&q_in_->shape, &(q)->shape); \
    (q)->recipe = q_in_->recipe; \
    (q)->flags = q_in_->flags; \
    (q)->fp8_dtype = q_in_->fp8_dtype; \
    (q)->data = q_in_->data; \
    (q)->scale_inv = q_in_->scale_inv; \
    (q)->columnwise = q_in_->columnwise; \
    (q)->columnwise_scale_inv = q_in_->columnwise_scale_inv; \
    (q)->derived_rows = (int64_t *) q_in_->derived_rows; \
    (q)->state = q_in_->state; \
    (q)->history_length = q_in_->history_length; \
  } G_STMT_END

/* Runs the quantization that plain (gmlp_kernel_grouped_quantize()) or, when
 * plain is NULL, fused (gmlp_kernel_grouped_activation_quantize())
 * describes: checked first, so that a case the kernels do not cover is
 * refused with its reason before anything is enqueued; current scaling takes
 * its small amax workspace from the stream-ordered pool and gives it back in
 * stream order. */
gboolean gmlp_cuda_quantize_run     (GmlpBackendDevice                  *device,
                                     const GmlpKernelQuantize           *plain,
                                     const GmlpKernelActivationQuantize *fused,
                                     GError                            **error);

G_END_DECLS
