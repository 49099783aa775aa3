/* gmlp-cpu-gemm-fp8.h: FP8 grouped products of the CPU backend
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "backend/gmlp-backend.h"

G_BEGIN_DECLS

/* A GmlpBackendGemm taken apart group by group, with the sizes on the
 * host (the device sizes read and clamped): the pointers of each group's
 * members, and for FP8 its scales. */
typedef struct {
  GmlpGemmKind          kind;
  guint                 n_groups;
  const gint64         *rows;
  gint64                n;
  gint64                k;
  int                   a_dtype;
  int                   b_dtype;
  int                   c_dtype;
  gpointer             *a;
  gpointer             *b;
  gpointer             *c;
  gpointer             *bias;          /* FPROP, or NULL */
  const float         **a_scale_inv;   /* FP8 */
  const float         **b_scale_inv;
  GmlpBackendFp8Scales  a_scales;
  GmlpBackendFp8Scales  b_scales;
  const guint8         *accumulate;    /* WGRAD, or NULL */
} GmlpCpuGemm;

/* The FP8 products of the gemm entry (the CPU adds an FPROP's bias before
 * the one rounding). */
gboolean gmlp_cpu_fp8_products      (const GmlpCpuGemm  *gemm,
                                     GError            **error);

/* c[r, :] += bias[:] for the @rows rows of the FP32 product @c (@n
 * columns), @bias of @dtype: the fused bias of the CPU's products, added in
 * FP32 before C is rounded to its dtype (once). */
void     gmlp_cpu_add_bias_rows (float                      *c,
                                 gint64                      rows,
                                 gint64                      n,
                                 const void                 *bias,
                                 int                         dtype);

G_END_DECLS
