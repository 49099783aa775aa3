/* gmlp-cpu-gemm-fp8.c: FP8 grouped products on the CPU backend
 *
 * The reference for the CUDA backend's cuBLASLt products: each operand of
 * a group is dequantized with the arithmetic every backend shares
 * (gmlp_quant_decode: fl32 (q × scale_inv)), and the product runs on the
 * same FP32 sgemm as the CPU's other products. cuBLASLt scales the FP32
 * sum once by both scale inverses instead; the two differ by FP32
 * rounding only. With blockwise scales each value is decoded with its
 * block's scale (GmlpBackendFp8Scales), as the Hopper kernel's promotion
 * scales each 128-deep block's sum.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <string.h>

#include <cblas.h>

#include "backend/cpu/gmlp-cpu-gemm-fp8.h"
#include "gmlp-error.h"
#include "gmlp-numeric.h"
#include "gmlp-quantize-numeric.h"

/* The rows × depth FP8 values of one group's operand, each times its
 * scale inverse, as floats. */
static float *
dequantize_operand (const guint8               *q,
                    int                         fp8_dtype,
                    const float                *scale_inv,
                    const GmlpBackendFp8Scales *scales,
                    gint64                      rows,
                    gint64                      depth)
{
  float *out = g_new (float, MAX (rows * depth, 1));
  gint64 r, d;

  for (r = 0; r < rows; r++)
    for (d = 0; d < depth; d++)
      out[r * depth + d] = gmlp_quant_decode (q[r * depth + d],
                                              gmlp_backend_fp8_scale_at (scales, scale_inv, r, d),
                                              fp8_dtype);
  return out;
}

void
gmlp_cpu_add_bias_rows (float      *c,
                        gint64      rows,
                        gint64      n,
                        const void *bias,
                        int         dtype)
{
  gint64 r, j;

  for (r = 0; r < rows; r++)
    for (j = 0; j < n; j++)
      c[r * n + j] += gmlp_num_load_float (bias, dtype, (guint64) j);
}

/* The product of group g as C (rows × cols) = A (rows × depth) · B (cols ×
 * depth)ᵀ. */
static void
fp8_shape (const GmlpCpuGemm *gemm,
           guint              g,
           gint64            *rows,
           gint64            *cols,
           gint64            *depth)
{
  gmlp_backend_gemm_group_shape (gemm->kind, gemm->rows[g], gemm->n, gemm->k, rows, cols, depth);
}

static void
fp8_group (const GmlpCpuGemm *gemm,
           guint              g,
           const void        *bias)
{
  gint64 rows, cols, depth;
  gboolean accumulate = gemm->kind == GMLP_GEMM_WGRAD && gemm->accumulate != NULL &&
                        gemm->accumulate[g];
  g_autofree float *a = NULL, *b = NULL, *c_owned = NULL;
  gsize c_len, i;
  float *c;

  fp8_shape (gemm, g, &rows, &cols, &depth);
  c_len = (gsize) (rows * cols);
  if (c_len == 0)
    return;
  if (depth == 0)
    {
      /* An empty sum: zero, or C left as it is. */
      if (!accumulate)
        memset (gemm->c[g], 0, c_len * gmlp_num_dtype_size (gemm->c_dtype));
      return;
    }

  a = dequantize_operand (gemm->a[g], gemm->a_dtype, gemm->a_scale_inv[g], &gemm->a_scales, rows, depth);
  b = dequantize_operand (gemm->b[g], gemm->b_dtype, gemm->b_scale_inv[g], &gemm->b_scales, cols, depth);

  if (gemm->c_dtype == GMLP_NUM_FLOAT32)
    {
      c = gemm->c[g];
    }
  else
    {
      c = c_owned = g_new (float, c_len);
      if (accumulate)
        for (i = 0; i < c_len; i++)
          c[i] = gmlp_num_load_float (gemm->c[g], gemm->c_dtype, i);
    }

  cblas_sgemm (CblasRowMajor, CblasNoTrans, CblasTrans, (int) rows, (int) cols, (int) depth,
               1.0f, a, (int) depth, b, (int) depth, accumulate ? 1.0f : 0.0f, c, (int) cols);

  if (bias != NULL)
    gmlp_cpu_add_bias_rows (c, rows, cols, bias, gemm->c_dtype);
  if (c_owned != NULL)
    for (i = 0; i < c_len; i++)
      gmlp_num_store_float (gemm->c[g], gemm->c_dtype, i, c_owned[i]);
}

static gboolean
is_fp8 (int dtype)
{
  return dtype == GMLP_NUM_FLOAT8_E4M3 || dtype == GMLP_NUM_FLOAT8_E5M2;
}

static gboolean
check_scales (const GmlpBackendFp8Scales  *s,
              GError                     **error)
{
  if ((s->row_block == 0 && s->row_stride == 0 && s->depth_stride == 0) ||
      (s->row_block > 0 && s->row_stride >= 0 && s->depth_stride >= 0))
    return TRUE;
  g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
               "CPU: FP8 GEMM: invalid scale layout (row block %" G_GINT64_FORMAT ", strides %"
               G_GINT64_FORMAT " and %" G_GINT64_FORMAT ")", s->row_block, s->row_stride,
               s->depth_stride);
  return FALSE;
}

gboolean
gmlp_cpu_fp8_products (const GmlpCpuGemm  *gemm,
                       GError            **error)
{
  guint g;

  if (gemm->kind != GMLP_GEMM_FPROP && gemm->kind != GMLP_GEMM_DGRAD &&
      gemm->kind != GMLP_GEMM_WGRAD)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "CPU: FP8 GEMM: no such kind of product (%d)", (int) gemm->kind);
      return FALSE;
    }
  if (!is_fp8 (gemm->a_dtype) || !is_fp8 (gemm->b_dtype))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "CPU: FP8 GEMM takes FLOAT8_E4M3 or FLOAT8_E5M2 operands, not dtypes %d and %d",
                   gemm->a_dtype, gemm->b_dtype);
      return FALSE;
    }
  if (gemm->c_dtype != GMLP_NUM_FLOAT32 && gemm->c_dtype != GMLP_NUM_FLOAT16 &&
      gemm->c_dtype != GMLP_NUM_BFLOAT16)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "CPU: FP8 GEMM writes float32, float16 or bfloat16, not dtype %d", gemm->c_dtype);
      return FALSE;
    }
  if (gemm->n < 0 || gemm->k < 0 || gemm->n > G_MAXINT32 || gemm->k > G_MAXINT32)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "CPU: FP8 GEMM dimensions out of range (n=%" G_GINT64_FORMAT ", k=%"
                   G_GINT64_FORMAT ")", gemm->n, gemm->k);
      return FALSE;
    }
  if (gemm->n_groups == 0)
    return TRUE;
  if (gemm->rows == NULL || gemm->a == NULL || gemm->b == NULL || gemm->c == NULL ||
      gemm->a_scale_inv == NULL || gemm->b_scale_inv == NULL)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "CPU: FP8 GEMM: missing group sizes, operands or scales");
      return FALSE;
    }
  if (!check_scales (&gemm->a_scales, error) || !check_scales (&gemm->b_scales, error))
    return FALSE;
  for (g = 0; g < gemm->n_groups; g++)
    if (gemm->rows[g] < 0 || gemm->rows[g] > G_MAXINT32)
      {
        g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                     "CPU: FP8 GEMM: group %u has %" G_GINT64_FORMAT " rows", g, gemm->rows[g]);
        return FALSE;
      }

  for (g = 0; g < gemm->n_groups; g++)
    fp8_group (gemm, g, gemm->bias != NULL && gemm->kind == GMLP_GEMM_FPROP ? gemm->bias[g] : NULL);
  return TRUE;
}
