/* gmlp-backend-gemm.h: reading a GmlpBackendGemm, for the backends
 *
 * Where the members of a descriptor's operands lie (gmlp-backend.h states
 * the layouts), for the backends' executors: the per-group pointers of an
 * operand with host sizes, built inside the executor that needs them.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <string.h>

#include "backend/gmlp-backend.h"
#include "gmlp-numeric.h"

G_BEGIN_DECLS

/* The per-group tables of a call live on the caller's stack, in an array
 * of this many pointers, where they fit: a call allocates nothing for
 * them up to a few hundred groups. */
#define GMLP_BACKEND_GEMM_LOCAL_TABLES 1024

/* n_pointers zeroed pointers: local (GMLP_BACKEND_GEMM_LOCAL_TABLES of
 * them) where they fit, else *heap, which the caller frees. */
static inline gpointer *
gmlp_backend_gemm_tables (gpointer  *local,
                          gsize      n_pointers,
                          gpointer **heap)
{
  if (n_pointers > GMLP_BACKEND_GEMM_LOCAL_TABLES)
    return *heap = g_new0 (gpointer, n_pointers);
  memset (local, 0, n_pointers * sizeof (gpointer));
  return local;
}

static inline gboolean
gmlp_backend_gemm_is_fp8 (const GmlpBackendGemm *gemm)
{
  return gmlp_num_dtype_is_fp8 (gemm->a.dtype);
}

/* The columns of a row of a grouped (ROWS) operand: a's (x: k, dy: n),
 * WGRAD's b (x: k), FPROP's and DGRAD's c (y: n, dx: k). */
static inline gint64
gmlp_backend_gemm_row_cols (const GmlpBackendGemm    *gemm,
                            const GmlpBackendOperand *op)
{
  if (op == &gemm->a)
    return gemm->kind == GMLP_GEMM_FPROP ? gemm->k : gemm->n;
  if (op == &gemm->b)
    return gemm->k;
  return gemm->kind == GMLP_GEMM_FPROP ? gemm->n : gemm->k;
}

/* Member g of a fixed-shape (STRIDED or TABLE) operand; NULL for NONE. */
static inline gpointer
gmlp_backend_operand_fixed (const GmlpBackendOperand *op,
                            guint                     g)
{
  switch (op->layout)
    {
    case GMLP_BACKEND_OPERAND_STRIDED:
      return (guint8 *) op->base + (guint64) g * op->stride;
    case GMLP_BACKEND_OPERAND_TABLE:
      return op->table[g];
    case GMLP_BACKEND_OPERAND_NONE:
    case GMLP_BACKEND_OPERAND_ROWS:
    default:
      return NULL;
    }
}

/* Whether op's FP8 scales are grouped by the sizes (blockwise scales of
 * a grouped operand) rather than one fixed-size block per group. */
static inline gboolean
gmlp_backend_operand_scales_follow_rows (const GmlpBackendOperand *op)
{
  return op->layout == GMLP_BACKEND_OPERAND_ROWS && op->scales.row_block != 0;
}

/* Group g's scales where they do not follow the rows. */
static inline const float *
gmlp_backend_operand_fixed_scales (const GmlpBackendOperand *op,
                                   guint                     g)
{
  if (op->scale_inv == NULL)
    return NULL;
  return (const float *) ((const guint8 *) op->scale_inv + (guint64) g * op->scale_stride);
}

/* The scales of a grouped operand whose scales follow the rows, as rows
 * of FP32: a member of m rows has *scale_rows rows of *row_floats. */
static inline void
gmlp_backend_gemm_scale_rows (const GmlpBackendGemm    *gemm,
                              const GmlpBackendOperand *op,
                              gint64                    m,
                              gint64                   *scale_rows,
                              gint64                   *row_floats)
{
  gint64 block = GMLP_BACKEND_FP8_DEPTH_BLOCK;

  m = MAX (m, 0);
  if (gemm->kind == GMLP_GEMM_WGRAD)
    {
      *scale_rows = (m + block - 1) / block;
      *row_floats = op == &gemm->a ? gemm->n : gemm->k;
    }
  else
    {
      *scale_rows = m;
      *row_floats = (gmlp_backend_gemm_row_cols (gemm, &gemm->a) + block - 1) / block;
    }
}

/* With host sizes: the member of every group of op (n_groups pointers
 * into members), grouped ones from their base by the sizes. */
static inline void
gmlp_backend_gemm_members (const GmlpBackendGemm    *gemm,
                           const GmlpBackendOperand *op,
                           gpointer                 *members)
{
  guint64 offset = 0, row_bytes;
  guint g;

  if (op->layout != GMLP_BACKEND_OPERAND_ROWS)
    {
      for (g = 0; g < gemm->n_groups; g++)
        members[g] = gmlp_backend_operand_fixed (op, g);
      return;
    }
  row_bytes = (guint64) gmlp_backend_gemm_row_cols (gemm, op) * gmlp_num_dtype_size (op->dtype);
  for (g = 0; g < gemm->n_groups; g++)
    {
      members[g] = (guint8 *) op->base + offset;
      offset += gmlp_num_member_stride (gemm->rows[g], row_bytes);
    }
}

/* With host sizes: the scales of every group of op. */
static inline void
gmlp_backend_gemm_scale_members (const GmlpBackendGemm    *gemm,
                                 const GmlpBackendOperand *op,
                                 const float             **scales)
{
  guint64 offset = 0;
  guint g;

  if (!gmlp_backend_operand_scales_follow_rows (op))
    {
      for (g = 0; g < gemm->n_groups; g++)
        scales[g] = gmlp_backend_operand_fixed_scales (op, g);
      return;
    }
  for (g = 0; g < gemm->n_groups; g++)
    {
      gint64 scale_rows, row_floats;

      scales[g] = (const float *) ((const guint8 *) op->scale_inv + offset);
      gmlp_backend_gemm_scale_rows (gemm, op, gemm->rows[g], &scale_rows, &row_floats);
      offset += gmlp_num_member_stride (scale_rows, (guint64) row_floats * sizeof (float));
    }
}

G_END_DECLS
