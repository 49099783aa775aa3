/* gmlp-grouped-linear-split.c: an FP32 layer's products of a BF16 input on
 * BF16 tensor cores
 *
 * GmlpRouter's gate is an FP32 layer (n_experts × hidden) whose input is
 * mostly BF16 tokens. Rather than an FP32 copy of the input and FP32
 * products, each FP32 operand is split into BF16 parts (the backend's
 * split_bfloat16: v = hi + mid + lo, which holds a normal FP32 value to
 * its last bit or so): a product of two BF16 values is exact in FP32 and
 * the tensor cores add in FP32, so one BF16 product whose columns or depth
 * hold the parts gives the FP32 product to FP32 accuracy. With x (T × k)
 * BF16, W (n × k) and dy (T × n) FP32, one group, host sizes:
 *
 *   FPROP  y = x [W_hi; W_mid; W_lo]ᵀ: one BF16 product of 3n columns into
 *          FP32 (T × 3n), whose three column blocks sum_parts adds into y;
 *   WGRAD  dW (+)= [dy_hi | dy_mid | dy_lo]ᵀ x: one BF16 product of 3n × k
 *          into FP32, whose three row blocks sum_parts adds into wgrad or
 *          main_grad (the accumulation mask's entry decides which);
 *   DGRAD  dx (+)= Σ dy_a W_b over the six pairs (a, b) that matter (hi·hi,
 *          hi·mid, hi·lo, mid·hi, lo·hi, mid·mid; those left out are under
 *          2^-24 relative), one product of depth 6n: the parts of dy
 *          concatenated along the depth, [hi hi hi mid lo mid], against
 *          [W_hi; W_mid; W_lo; W_hi; W_hi; W_mid]. dx is BF16: the
 *          product is rounded once into it, or added to what it holds (the
 *          MoE layer's input gradient) before that one rounding. The entry
 *          has no adding DGRAD, so it is issued as the WGRAD it equals,
 *          C (T × k) += Aᵀ B with A the parts of dy transposed (6n × T,
 *          which the split writes so) and B the parts of W (6n × k).
 *
 * Every product is the backend's gemm with one group (host sizes): on CUDA
 * a single product takes cuBLAS's tuned kernel (docs/routes.md, G7). The
 * scratch (parts and sums) is O(T n + n k), never T × k in FP32.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-grouped-linear-impl.h"
#include "gmlp-error.h"

/* DGRAD's pairs of parts, (dy's, W's), in the order of the depth. */
static const guint dgrad_dy_parts[] = { 0, 0, 0, 1, 2, 1 };
static const guint dgrad_w_parts[] = { 0, 1, 2, 0, 0, 1 };
#define N_PARTS 3
#define N_DGRAD_TERMS G_N_ELEMENTS (dgrad_dy_parts)

G_STATIC_ASSERT (N_DGRAD_TERMS <= GMLP_BACKEND_MAX_SPLIT_OUTPUTS);
G_STATIC_ASSERT (N_PARTS <= GMLP_BACKEND_MAX_SPLIT_PARTS);

void
gmlp_grouped_linear_take_bf16_input (GmlpGroupedLinear *self)
{
  g_return_if_fail (GMLP_IS_GROUPED_LINEAR (self));
  g_return_if_fail (self->dtype == GMLP_DTYPE_FLOAT32 && self->n_groups == 1 &&
                    self->bias.grouped == NULL);

  self->bf16_input = TRUE;
}

gboolean
gmlp_linear_splits (GmlpGroupedLinear  *self,
                    GmlpGroupedTensor  *input)
{
  return self->bf16_input && gmlp_grouped_tensor_get_dtype (input) == GMLP_DTYPE_BFLOAT16;
}

gboolean
gmlp_linear_product_splits (GmlpGroupedLinear  *self,
                            const Product      *product)
{
  GmlpGroupedTensor *bf16;

  if (!self->bf16_input || product->dequantized)
    return FALSE;
  switch (product->kind)
    {
    case GMLP_GEMM_FPROP: bf16 = product->a; break;
    case GMLP_GEMM_DGRAD: bf16 = product->c_rows; break;
    case GMLP_GEMM_WGRAD: bf16 = product->b_rows; break;
    default: return FALSE;
    }
  return bf16 != NULL && gmlp_grouped_tensor_get_dtype (bf16) == GMLP_DTYPE_BFLOAT16;
}

gboolean
gmlp_linear_check_split_input (GmlpGroupedLinear  *self,
                               GmlpGroupedTensor  *input,
                               GError            **error)
{
  if (!gmlp_grouped_tensor_has_host_sizes (input))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "A BF16 input of an FP32 layer needs its group sizes on the host");
      return FALSE;
    }
  return TRUE;
}

GmlpGroupedTensor *
gmlp_linear_split_grad_input (GmlpGroupedLinear  *self,
                              GmlpGroupedTensor  *input,
                              GmlpGroupedTensor  *into,
                              GError            **error)
{
  gint64 rows = gmlp_grouped_tensor_get_total_rows (input);

  if (into == NULL)
    return gmlp_grouped_tensor_new (self->device, GMLP_DTYPE_BFLOAT16, &rows, 1, self->in_features,
                                    error);
  if (gmlp_grouped_tensor_get_device (into) != self->device ||
      gmlp_grouped_tensor_get_dtype (into) != GMLP_DTYPE_BFLOAT16 ||
      gmlp_grouped_tensor_get_n_groups (into) != 1 || !gmlp_grouped_tensor_has_host_sizes (into) ||
      gmlp_grouped_tensor_get_total_rows (into) != rows ||
      gmlp_grouped_tensor_get_cols (into) != self->in_features)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "The input gradient goes into a tensor of the input's shape, dtype (bfloat16) "
                   "and device");
      return NULL;
    }
  /* The weight gradient reads the input after dgrad has written. */
  if (gmlp_grouped_tensor_overlaps (into, input))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "The input gradient cannot go into the input itself: the weight gradient "
                   "reads it afterwards");
      return NULL;
    }
  return g_object_ref (into);
}

/* Scratch of one rows × cols matrix. */
static GmlpGroupedTensor *
matrix (GmlpGroupedLinear  *self,
        GmlpDType           dtype,
        gint64              rows,
        gint64              cols,
        GError            **error)
{
  return gmlp_grouped_tensor_new_uniform (self->device, dtype, 1, rows, cols, error);
}

/* The parts of @src (rows × cols FP32, dense), part parts[j] of each value
 * to output j of @dst at offset j × block, along a row of dst by
 * col_stride (1, or rows: the transpose, output j then cols × rows). */
static gboolean
split (GmlpGroupedLinear  *self,
       gconstpointer       src,
       gint64              rows,
       gint64              cols,
       GmlpGroupedTensor  *dst,
       gboolean            transposed,
       const guint        *parts,
       guint               n_outputs,
       GError            **error)
{
  GmlpBackendSplit s = {
    .rows = rows,
    .cols = cols,
    .src = src,
    .src_stride = cols,
    .n_parts = N_PARTS,
    .dst = gmlp_grouped_tensor_get_data (dst),
    .dst_row_stride = transposed ? 1 : cols,
    .dst_col_stride = transposed ? rows : 1,
    .n_outputs = n_outputs,
  };
  guint j;

  for (j = 0; j < n_outputs; j++)
    {
      s.part[j] = parts[j];
      s.offset[j] = (gint64) j * rows * cols;
    }
  return GMLP_DEVICE_CALL (self->device, split_bfloat16, &s, error);
}

/* dst (rows × cols FP32, dense) = [dst +] the sum of the N_PARTS blocks of
 * @sums (one FP32 tensor): column blocks (rows × N_PARTS cols), or row
 * blocks (N_PARTS rows × cols) when !columns. */
static gboolean
sum_parts (GmlpGroupedLinear  *self,
           GmlpGroupedTensor  *sums,
           gboolean            columns,
           gint64              rows,
           gint64              cols,
           gpointer            dst,
           gboolean            accumulate,
           GError            **error)
{
  GmlpBackendSumParts s = {
    .rows = rows,
    .cols = cols,
    .src = gmlp_grouped_tensor_get_data (sums),
    .src_stride = columns ? N_PARTS * cols : cols,
    .n_parts = N_PARTS,
    .dst = dst,
    .dst_stride = cols,
    .accumulate = accumulate,
  };
  guint p;

  for (p = 0; p < N_PARTS; p++)
    s.offset[p] = columns ? (gint64) p * cols : (gint64) p * rows * cols;
  return GMLP_DEVICE_CALL (self->device, sum_parts, &s, error);
}

/* One BF16 product of the backend's gemm, one group (see GmlpBackendGemm
 * for m, n, k); @add: WGRAD adds into c. */
static gboolean
bf16_product (GmlpGroupedLinear  *self,
              GmlpGemmKind        kind,
              gint64              m,
              gint64              n,
              gint64              k,
              GmlpGroupedTensor  *a,
              GmlpGroupedTensor  *b,
              gpointer            c,
              GmlpDType           c_dtype,
              gboolean            add,
              GError            **error)
{
  const gboolean wgrad = kind == GMLP_GEMM_WGRAD;
  const guint8 accumulate = add ? 1 : 0;
  /* One group: a grouped operand's member 0 and a fixed one's both lie at
   * their base. */
  const GmlpBackendOperand rows_a = {
    .layout = GMLP_BACKEND_OPERAND_ROWS,
    .dtype = GMLP_DTYPE_BFLOAT16,
    .base = gmlp_grouped_tensor_get_data (a),
  };
  const GmlpBackendOperand second = {
    .layout = wgrad ? GMLP_BACKEND_OPERAND_ROWS : GMLP_BACKEND_OPERAND_STRIDED,
    .dtype = GMLP_DTYPE_BFLOAT16,
    .base = gmlp_grouped_tensor_get_data (b),
  };
  const GmlpBackendOperand out = {
    .layout = wgrad ? GMLP_BACKEND_OPERAND_STRIDED : GMLP_BACKEND_OPERAND_ROWS,
    .dtype = (int) c_dtype,
    .base = c,
  };
  GmlpBackendGemm gemm = {
    .kind = kind,
    .n_groups = 1,
    .n = n,
    .k = k,
    .rows = &m,
    .a = rows_a,
    .b = second,
    .c = out,
    .accumulate = wgrad ? &accumulate : NULL,
  };

  return GMLP_DEVICE_CALL (self->device, gemm, &gemm, error);
}

gboolean
gmlp_linear_run_split_product (GmlpGroupedLinear  *self,
                               const Product      *product,
                               GError            **error)
{
  static const guint in_order[N_PARTS] = { 0, 1, 2 };
  gint64 n = self->out_features, k = self->in_features;
  gint64 t = gmlp_grouped_tensor_get_total_rows (product->sized_by);
  gpointer fixed = gmlp_grouped_tensor_get_member_data (product->fixed->members[0], 0);
  gboolean add = product->accumulate != NULL && product->accumulate[0];
  g_autoptr(GmlpGroupedTensor) parts = NULL, sums = NULL, w_parts = NULL;

  g_assert (self->n_groups == 1 && !product->bias &&
            gmlp_grouped_tensor_has_host_sizes (product->sized_by));

  switch (product->kind)
    {
    case GMLP_GEMM_FPROP:
      if (t == 0)
        return TRUE;
      parts = matrix (self, GMLP_DTYPE_BFLOAT16, N_PARTS * n, k, error);
      sums = parts != NULL ? matrix (self, GMLP_DTYPE_FLOAT32, t, N_PARTS * n, error) : NULL;
      return sums != NULL &&
             split (self, fixed, n, k, parts, FALSE, in_order, N_PARTS, error) &&
             bf16_product (self, GMLP_GEMM_FPROP, t, N_PARTS * n, k, product->a, parts,
                           gmlp_grouped_tensor_get_data (sums), GMLP_DTYPE_FLOAT32, FALSE, error) &&
             sum_parts (self, sums, TRUE, t, n, gmlp_grouped_tensor_get_data (product->c_rows), FALSE,
                        error);

    case GMLP_GEMM_WGRAD:
      /* With no rows the product zeroes the sums: dW = 0, or main_grad
       * as it was. */
      parts = matrix (self, GMLP_DTYPE_BFLOAT16, t, N_PARTS * n, error);
      sums = parts != NULL ? matrix (self, GMLP_DTYPE_FLOAT32, N_PARTS * n, k, error) : NULL;
      if (sums == NULL)
        return FALSE;
      {
        /* dy's parts side by side: output j at column j n of rows of 3n. */
        GmlpBackendSplit s = {
          .rows = t,
          .cols = n,
          .src = gmlp_grouped_tensor_get_data (product->a),
          .src_stride = n,
          .n_parts = N_PARTS,
          .dst = gmlp_grouped_tensor_get_data (parts),
          .dst_row_stride = N_PARTS * n,
          .dst_col_stride = 1,
          .n_outputs = N_PARTS,
          .part = { 0, 1, 2 },
          .offset = { 0, n, 2 * n },
        };

        if (!GMLP_DEVICE_CALL (self->device, split_bfloat16, &s, error))
          return FALSE;
      }
      return bf16_product (self, GMLP_GEMM_WGRAD, t, N_PARTS * n, k, parts, product->b_rows,
                           gmlp_grouped_tensor_get_data (sums), GMLP_DTYPE_FLOAT32, FALSE, error) &&
             sum_parts (self, sums, FALSE, n, k, fixed, add, error);

    case GMLP_GEMM_DGRAD:
      if (t == 0)
        return TRUE;
      parts = matrix (self, GMLP_DTYPE_BFLOAT16, N_DGRAD_TERMS * n, t, error);
      w_parts = parts != NULL ? matrix (self, GMLP_DTYPE_BFLOAT16, N_DGRAD_TERMS * n, k, error) : NULL;
      /* The sum in FP32, then rounded once into dx (added to what dx
       * holds, or stored): cuBLAS adding into a 16-bit output (beta = 1)
       * may round the product before the addition. */
      sums = w_parts != NULL ? matrix (self, GMLP_DTYPE_FLOAT32, t, k, error) : NULL;
      if (sums == NULL ||
          !split (self, gmlp_grouped_tensor_get_data (product->a), t, n, parts, TRUE, dgrad_dy_parts,
                  N_DGRAD_TERMS, error) ||
          !split (self, fixed, n, k, w_parts, FALSE, dgrad_w_parts, N_DGRAD_TERMS, error) ||
          !bf16_product (self, GMLP_GEMM_WGRAD, N_DGRAD_TERMS * n, t, k, parts, w_parts,
                         gmlp_grouped_tensor_get_data (sums), GMLP_DTYPE_FLOAT32, FALSE, error))
        return FALSE;
      {
        GmlpBackendShape shape;
        GmlpDType dx_dtype = gmlp_grouped_tensor_get_dtype (product->c_rows);

        if (!gmlp_grouped_tensor_get_backend_shape (sums, &shape, error))
          return FALSE;
        if (add)
          return GMLP_DEVICE_CALL (self->device, axpby, &shape, gmlp_grouped_tensor_get_data (sums),
                                   GMLP_DTYPE_FLOAT32, gmlp_grouped_tensor_get_data (product->c_rows),
                                   (int) dx_dtype, 1.0f, 1.0f, error);
        return GMLP_DEVICE_CALL (self->device, convert, &shape, gmlp_grouped_tensor_get_data (sums),
                                 GMLP_DTYPE_FLOAT32, gmlp_grouped_tensor_get_data (product->c_rows),
                                 (int) dx_dtype, error);
      }

    default:
      g_assert_not_reached ();
    }
}
