/* gmlp-cpu-gemm-fp8.h: FP8 grouped products of the CPU backend
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "backend/gmlp-backend.h"

G_BEGIN_DECLS

/* See the gemm_fp8 entry of GmlpBackend (the CPU adds an FPROP's bias
 * before the one rounding: gemm_adds_bias). */
gboolean gmlp_cpu_gemm_fp8      (GmlpBackendDevice          *device,
                                 const GmlpBackendGemmFp8   *gemm,
                                 GError                    **error);

/* c[r, :] += bias[:] for the @rows rows of the FP32 product @c (@n
 * columns), @bias of @dtype: the fused bias of the CPU's products, added in
 * FP32 before C is rounded to its dtype (once). */
void     gmlp_cpu_add_bias_rows (float                      *c,
                                 gint64                      rows,
                                 gint64                      n,
                                 const void                 *bias,
                                 int                         dtype);

G_END_DECLS
