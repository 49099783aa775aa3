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
 *   DGRAD  dx (+)= Σ dy_a W_b over the six pairs (a, b) that matter (hi·hi,
 *          hi·mid, hi·lo, mid·hi, lo·hi, mid·mid; those left out are under
 *          2^-24 relative), one product of depth 6n: the parts of dy
 *          concatenated along the depth, [hi hi hi mid lo mid], against
 *          [W_hi; W_mid; W_lo; W_hi; W_hi; W_mid], issued as the WGRAD it
 *          equals, C (T × k) = Aᵀ B with A the parts of dy transposed
 *          (6n × T, which the split writes so) and B the parts of W
 *          (6n × k), into FP32. A BF16 dx: that sum is rounded once into
 *          it (convert). An FP32 dx (the MoE layer's, which its permute
 *          backward adds before its one rounding, so that cuBLAS never adds
 *          into a BF16 output, which would round the product first) is the
 *          product's own output;
 *   WGRAD  dW (+)= [dy_hi; dy_mid; dy_lo] x (dy's parts transposed, 3n × T:
 *          blocks 2 to 4 of DGRAD's A, so the backward splits dy once), one
 *          BF16 product of 3n × k issued as the DGRAD it equals, into FP32,
 *          whose three row blocks sum_parts adds into wgrad or main_grad
 *          (the accumulation mask's entry decides which).
 *
 * W's six parts (FPROP reads the first three) are split once per version
 * of W and kept with the layer (6n × k BF16), so that a forward and its
 * backward share one split, and forwards with no optimizer step between
 * them share it too. One split call cannot write both of dy's layouts
 * (its strides are per call, only the offsets per output), hence WGRAD's
 * transposed operand.
 *
 * Every product is the backend's gemm with one group (host sizes): on CUDA
 * a single product takes cuBLAS's tuned kernel (docs/routes.md, G7). The
 * scratch is O(T n + n k) but for DGRAD's FP32 sum of dx (T × k).
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-grouped-linear-impl.h"
#include "gmlp-error.h"
#include "gmlp-saved-activations-private.h"

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
    case GMLP_GEMM_DGRAD: bf16 = product->sized_by; break;
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
                              gboolean            fp32,
                              GError            **error)
{
  gint64 rows = gmlp_grouped_tensor_get_total_rows (input);

  return gmlp_grouped_tensor_new (self->device, fp32 ? GMLP_DTYPE_FLOAT32 : GMLP_DTYPE_BFLOAT16, &rows, 1,
                                  self->in_features, error);
}

/* A product's scratch, one allocation: n_parts BF16 values (the parts of
 * an operand), then n_sums FP32 values (the product, whose parts are then
 * summed) from a 256-byte boundary. */
#define SUMS_AT(n_parts) (((n_parts) + 127) / 128 * 128)

static GmlpGroupedTensor *
scratch_new (GmlpGroupedLinear  *self,
             gint64              n_parts,
             gint64              n_sums,
             GError            **error)
{
  return gmlp_grouped_tensor_new_uniform (self->device, GMLP_DTYPE_BFLOAT16, 1, 1,
                                          SUMS_AT (n_parts) + 2 * n_sums, error);
}

static guint16 *
scratch_parts (GmlpGroupedTensor *scratch)
{
  return gmlp_grouped_tensor_get_data (scratch);
}

static float *
scratch_sums (GmlpGroupedTensor  *scratch,
              gint64              n_parts)
{
  return (float *) (scratch_parts (scratch) + SUMS_AT (n_parts));
}

/* The parts of @src (rows × cols FP32, dense), part parts[j] of each value
 * to output j of @dst at offset j × block, along a row of dst by
 * col_stride (1, or rows: the transpose, output j then cols × rows). */
static gboolean
split (GmlpGroupedLinear  *self,
       gconstpointer       src,
       gint64              rows,
       gint64              cols,
       guint16            *dst,
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
    .dst = dst,
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
 * @sums: column blocks (rows × N_PARTS cols), or row blocks (N_PARTS rows ×
 * cols) when !columns. */
static gboolean
sum_parts (GmlpGroupedLinear  *self,
           const float        *sums,
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
    .src = sums,
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
 * for m, n, k) of operands at a and b; @add: WGRAD adds into c. */
static gboolean
bf16_product (GmlpGroupedLinear  *self,
              GmlpGemmKind        kind,
              gint64              m,
              gint64              n,
              gint64              k,
              gconstpointer       a,
              gconstpointer       b,
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
    .base = (gpointer) a,
  };
  const GmlpBackendOperand second = {
    .layout = wgrad ? GMLP_BACKEND_OPERAND_ROWS : GMLP_BACKEND_OPERAND_STRIDED,
    .dtype = GMLP_DTYPE_BFLOAT16,
    .base = (gpointer) b,
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

/* The weight's parts as DGRAD pairs them, [hi; mid; lo; hi; hi; mid]
 * (6n × k BF16), whose first three blocks FPROP reads: split once per
 * version of the weight, so that a forward and its backward, or the
 * forwards of microbatches, share one split. An optimizer step or a write
 * through the API bumps the version, and the next product splits again.
 * Not kept
 * where the weight may change behind its version: storage shared through
 * DLPack, a device that captured graphs (a replay writes without bumping),
 * and while capturing (the graph must split on every replay). */
static GmlpGroupedTensor *
weight_parts (GmlpGroupedLinear  *self,
              GmlpGroupedTensor  *weight,
              GError            **error)
{
  gint64 n = self->out_features, k = self->in_features;
  gboolean keep = !gmlp_grouped_tensor_is_shared (weight) && !gmlp_device_has_captured (self->device);
  g_autoptr(GMutexLocker) locker = g_mutex_locker_new (&self->split_lock);
  g_autoptr(GmlpGroupedTensor) parts = NULL;

  if (keep && self->w_parts != NULL && self->w_parts_of == weight &&
      gmlp_version_records_check (self->w_parts_version, "Router's gate", NULL))
    return g_object_ref (self->w_parts);

  /* Into the kept tensor when no product holds it (those enqueued read
   * it first, in stream order), else into a new one. */
  if (keep && self->w_parts != NULL && g_atomic_int_get (&G_OBJECT (self->w_parts)->ref_count) == 1)
    parts = g_object_ref (self->w_parts);
  g_clear_object (&self->w_parts);
  g_clear_object (&self->w_parts_of);
  g_clear_pointer (&self->w_parts_version, g_array_unref);
  if (parts == NULL)
    parts = gmlp_grouped_tensor_new_uniform (self->device, GMLP_DTYPE_BFLOAT16, 1, N_DGRAD_TERMS * n, k,
                                             error);
  if (parts == NULL ||
      !split (self, gmlp_grouped_tensor_get_data (weight), n, k, gmlp_grouped_tensor_get_data (parts),
              FALSE, dgrad_w_parts, N_DGRAD_TERMS, error))
    return NULL;

  if (keep)
    {
      self->w_parts = g_object_ref (parts);
      self->w_parts_of = g_object_ref (weight);
      self->w_parts_version = gmlp_version_records_new ();
      gmlp_version_records_add (self->w_parts_version, "weight", "forward", weight);
    }
  return g_steal_pointer (&parts);
}

/* dy's parts as DGRAD pairs them, transposed, [hi hi hi mid lo mid] (each
 * n × T): blocks 2 to 4 hold hi, mid and lo, WGRAD's operand. */
#define DY_PARTS_IN_ORDER 2

gboolean
gmlp_linear_run_split_product (GmlpGroupedLinear  *self,
                               const Product      *product,
                               GError            **error)
{
  static const guint in_order[N_PARTS] = { 0, 1, 2 };
  gint64 n = self->out_features, k = self->in_features;
  gint64 t = gmlp_grouped_tensor_get_total_rows (product->sized_by);
  GmlpGroupedTensor *weight = product->fixed->members[0];
  gpointer fixed = gmlp_grouped_tensor_get_member_data (weight, 0);
  gboolean add = product->accumulate != NULL && product->accumulate[0];
  /* An FP32 dx: the product writes it. */
  gboolean direct = product->kind == GMLP_GEMM_DGRAD &&
                    gmlp_grouped_tensor_get_dtype (product->c_rows) == GMLP_DTYPE_FLOAT32;
  /* DGRAD's scratch: dy's six parts, then dx's sum (unless direct), with
   * room for the WGRAD's sum that reuses it. */
  gint64 dgrad_parts = N_DGRAD_TERMS * n * t;
  gint64 dgrad_sums = direct ? N_PARTS * n * k : MAX (t * k, N_PARTS * n * k);
  g_autoptr(GmlpGroupedTensor) scratch = NULL, w_parts = NULL;

  g_assert (self->n_groups == 1 && !product->bias &&
            gmlp_grouped_tensor_has_host_sizes (product->sized_by));
  g_assert (dgrad_dy_parts[DY_PARTS_IN_ORDER] == 0 && dgrad_dy_parts[DY_PARTS_IN_ORDER + 1] == 1 &&
            dgrad_dy_parts[DY_PARTS_IN_ORDER + 2] == 2 && dgrad_w_parts[1] == 1 &&
            dgrad_w_parts[2] == 2);

  switch (product->kind)
    {
    case GMLP_GEMM_FPROP:
      if (t == 0)
        return TRUE;
      w_parts = weight_parts (self, weight, error);
      scratch = w_parts != NULL ? scratch_new (self, 0, t * N_PARTS * n, error) : NULL;
      return scratch != NULL &&
             bf16_product (self, GMLP_GEMM_FPROP, t, N_PARTS * n, k,
                           gmlp_grouped_tensor_get_data (product->a),
                           gmlp_grouped_tensor_get_data (w_parts),
                           scratch_sums (scratch, 0), GMLP_DTYPE_FLOAT32, FALSE, error) &&
             sum_parts (self, scratch_sums (scratch, 0), TRUE, t, n,
                        gmlp_grouped_tensor_get_data (product->c_rows), FALSE, error);

    case GMLP_GEMM_WGRAD:
      {
        /* The parts of dy stacked, P = [dy_hi; dy_mid; dy_lo]ᵀ (3n × T):
         * those the DGRAD left, else split now; then P x (3n × k) as a
         * DGRAD-shaped product. */
        const guint16 *stacked;
        float *sums;

        if (t > 0 && product->dy_parts != NULL && *product->dy_parts != NULL)
          {
            scratch = g_steal_pointer (product->dy_parts);
            stacked = scratch_parts (scratch) + DY_PARTS_IN_ORDER * n * t;
            sums = scratch_sums (scratch, dgrad_parts);
          }
        else
          {
            scratch = scratch_new (self, N_PARTS * n * t, N_PARTS * n * k, error);
            if (scratch == NULL)
              return FALSE;
            stacked = scratch_parts (scratch);
            sums = scratch_sums (scratch, N_PARTS * n * t);
            /* No rows: dW = 0, or main_grad as it was. */
            if (t == 0 &&
                !GMLP_DEVICE_CALL (self->device, fill_bytes, sums, 0,
                                   (gsize) (N_PARTS * n * k) * sizeof (float), error))
              return FALSE;
            if (t > 0 &&
                !split (self, gmlp_grouped_tensor_get_data (product->a), t, n, scratch_parts (scratch),
                        TRUE, in_order, N_PARTS, error))
              return FALSE;
          }
        return (t == 0 ||
                bf16_product (self, GMLP_GEMM_DGRAD, N_PARTS * n, t, k, stacked,
                              gmlp_grouped_tensor_get_data (product->b_rows), sums, GMLP_DTYPE_FLOAT32,
                              FALSE, error)) &&
               sum_parts (self, sums, FALSE, n, k, fixed, add, error);
      }

    case GMLP_GEMM_DGRAD:
      if (t == 0)
        return TRUE;
      w_parts = weight_parts (self, weight, error);
      /* The sum in FP32: dx itself, or rounded once into it. */
      scratch = w_parts != NULL ? scratch_new (self, dgrad_parts, dgrad_sums, error) : NULL;
      if (scratch == NULL ||
          !split (self, gmlp_grouped_tensor_get_data (product->a), t, n, scratch_parts (scratch), TRUE,
                  dgrad_dy_parts, N_DGRAD_TERMS, error) ||
          !bf16_product (self, GMLP_GEMM_WGRAD, N_DGRAD_TERMS * n, t, k, scratch_parts (scratch),
                         gmlp_grouped_tensor_get_data (w_parts),
                         direct ? gmlp_grouped_tensor_get_data (product->c_rows)
                                : (gpointer) scratch_sums (scratch, dgrad_parts),
                         GMLP_DTYPE_FLOAT32, FALSE, error))
        return FALSE;
      if (!direct)
        {
          /* dx's shape serves its FP32 sum: one dense group of T × k. */
          GmlpBackendShape shape;
          GmlpDType dx_dtype = gmlp_grouped_tensor_get_dtype (product->c_rows);
          gpointer dx = gmlp_grouped_tensor_get_data (product->c_rows);
          float *sums = scratch_sums (scratch, dgrad_parts);

          if (!gmlp_grouped_tensor_get_backend_shape (product->c_rows, &shape, error) ||
              !GMLP_DEVICE_CALL (self->device, convert, &shape, sums, GMLP_DTYPE_FLOAT32, dx,
                                 (int) dx_dtype, error))
            return FALSE;
        }
      /* The WGRAD of this backward reads three of dy's parts, and sums
       * into the same scratch. */
      if (product->dy_parts != NULL)
        g_set_object (product->dy_parts, scratch);
      return TRUE;

    default:
      g_assert_not_reached ();
    }
}
