/* test-grouped-linear-fp8-check.c: the references and checks of test-grouped-linear-fp8
 *
 * The configurations, layers with their quantizers, problems, the
 * reference (a) of the quantized operands and (b) of the BF16 layer, and
 * a layer's step run and checked against both (see
 * test-grouped-linear-fp8.c).
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "test-grouped-linear-fp8.h"

gboolean
per_tensor (GmlpScalingRecipe recipe)
{
  return recipe == GMLP_SCALING_RECIPE_DELAYED || recipe == GMLP_SCALING_RECIPE_CURRENT;
}

/* Whether the layer's products multiply this recipe's FP8 operands on the
 * device (host sizes): per-tensor recipes everywhere, blockwise on the CPU
 * and on Hopper (fp8_device_native()); else dequantized operands. */
gboolean
multiplies_fp8 (GmlpDevice *device, GmlpScalingRecipe recipe)
{
  return per_tensor (recipe) ||
         (recipe == GMLP_SCALING_RECIPE_BLOCKWISE && gmlp_test_fp8_native (device));
}

void
quantizers_clear (Quantizers *q)
{
  g_clear_object (&q->input);
  g_clear_object (&q->weight);
  g_clear_object (&q->grad_output);
}

void
quantizers_new (Quantizers *q, GmlpDevice *device, GmlpScalingRecipe recipe, GmlpFp8Format format,
                guint history)
{
  GmlpQuantizerRole roles[] = {
    GMLP_QUANTIZER_ROLE_INPUT, GMLP_QUANTIZER_ROLE_WEIGHT, GMLP_QUANTIZER_ROLE_GRAD_OUTPUT,
  };
  GmlpQuantizer **slots[] = { &q->input, &q->weight, &q->grad_output };
  guint i;

  for (i = 0; i < 3; i++)
    *slots[i] = g_object_new (GMLP_TYPE_QUANTIZER, "device", device, "recipe", recipe,
                              "fp8-format", format, "role", roles[i],
                              "amax-history-length", history, NULL);
}

GmlpGroupedLinear *
new_layer (GmlpDevice *device, guint n, gint64 k, gint64 o, GmlpDType dtype, GmlpLinearFlags flags,
           const Quantizers *q)
{
  g_autoptr(GError) error = NULL;
  GmlpGroupedLinear *layer = gmlp_grouped_linear_new_full (device, n, k, o, dtype, flags, &error);

  g_assert_no_error (error);
  if (q != NULL)
    {
      g_assert_true (gmlp_grouped_linear_set_quantizers (layer, q->input, q->weight, q->grad_output,
                                                         &error));
      g_assert_no_error (error);
    }
  return layer;
}

static GBytes *
encode_values (const double *values, gsize n, GmlpDType dtype)
{
  gsize size = gmlp_dtype_get_size (dtype), i;
  guint8 *data = g_malloc (MAX (n * size, 1));

  for (i = 0; i < n; i++)
    {
      float f = (float) values[i];
      if (dtype == GMLP_DTYPE_FLOAT32)
        ((float *) data)[i] = f;
      else if (dtype == GMLP_DTYPE_FLOAT16)
        ((guint16 *) data)[i] = gmlp_dtype_float_to_half (f);
      else
        ((guint16 *) data)[i] = gmlp_dtype_float_to_bfloat16 (f);
    }
  return g_bytes_new_take (data, n * size);
}

void
problem_free (Problem *p)
{
  g_free (p->rows);
  g_free (p->x); g_free (p->w); g_free (p->b); g_free (p->dy);
  g_clear_pointer (&p->w_bytes, g_bytes_unref);
  g_clear_pointer (&p->b_bytes, g_bytes_unref);
  g_clear_object (&p->xt);
  g_clear_object (&p->dyt);
  g_clear_object (&p->wt);
  g_free (p);
}

/* Fresh data for @layer (its shape and dtype); x and dy are amplitude ×
 * N(0, 1), W uniform in ±0.5, b uniform in ±1. Sets the layer's
 * parameters. */
Problem *
problem_new (GmlpGroupedLinear *layer, const gint64 *rows, double amplitude)
{
  GmlpDevice *device = gmlp_grouped_linear_get_device (layer);
  gboolean has_bias = (gmlp_grouped_linear_get_flags (layer) & GMLP_LINEAR_BIAS) != 0;
  Problem *p = g_new0 (Problem, 1);
  g_autofree gint64 *w_rows = NULL;
  g_autoptr(GError) error = NULL;
  gsize i, n_w;
  guint g;

  p->n = gmlp_grouped_linear_get_n_groups (layer);
  p->k = gmlp_grouped_linear_get_in_features (layer);
  p->o = gmlp_grouped_linear_get_out_features (layer);
  p->dtype = gmlp_grouped_linear_get_dtype (layer);
  p->rows = g_memdup2 (rows, p->n * sizeof (gint64));
  for (g = 0; g < p->n; g++)
    p->total += rows[g];

  n_w = (gsize) p->n * p->o * p->k;
  p->w = g_new (double, n_w);
  for (i = 0; i < n_w; i++)
    p->w[i] = gmlp_test_round ((float) g_test_rand_double_range (-0.5, 0.5), p->dtype);
  p->w_bytes = encode_values (p->w, n_w, p->dtype);
  g_assert_true (gmlp_grouped_linear_set_weight_from_bytes (layer, p->w_bytes, &error));
  g_assert_no_error (error);
  w_rows = g_new (gint64, p->n);
  for (g = 0; g < p->n; g++)
    w_rows[g] = p->o;
  p->wt = gmlp_grouped_tensor_new_from_bytes (device, p->dtype, w_rows, p->n, p->k, p->w_bytes, &error);
  g_assert_no_error (error);

  if (has_bias)
    {
      p->b = g_new (double, p->n * p->o);
      for (i = 0; i < (gsize) (p->n * p->o); i++)
        p->b[i] = gmlp_test_round ((float) g_test_rand_double_range (-1.0, 1.0), p->dtype);
      p->b_bytes = encode_values (p->b, p->n * p->o, p->dtype);
      g_assert_true (gmlp_grouped_linear_set_bias_from_bytes (layer, p->b_bytes, &error));
      g_assert_no_error (error);
    }

  p->xt = gmlp_test_random_tensor (device, p->dtype, rows, p->n, p->k, amplitude, &p->x);
  p->dyt = gmlp_test_random_tensor (device, p->dtype, rows, p->n, p->o, amplitude, &p->dy);
  return p;
}

void
results_clear (Results *r)
{
  g_clear_pointer (&r->y, g_free);
  g_clear_pointer (&r->dx, g_free);
  g_clear_pointer (&r->dw, g_free);
  g_clear_pointer (&r->db, g_free);
}

/* float64 y = x Wᵀ + b, dx = dy W, dW = dyᵀ x, db = Σ dy_bias, group by
 * group, over the given operand values. */
void
reference (const Problem *p, const double *x, const double *w, const double *dy,
           const double *dy_bias, Results *out)
{
  out->y = g_new0 (double, MAX (p->total * p->o, 1));
  out->dx = g_new0 (double, MAX (p->total * p->k, 1));
  out->dw = g_new0 (double, p->n * p->o * p->k);
  out->db = g_new0 (double, p->n * p->o);
  gmlp_test_linear_reference (p->rows, p->n, p->k, p->o, x, w, p->b, dy, dy_bias,
                              out->y, out->dx, out->dw, out->db);
}

/* dW of reference (a) from the columnwise copies of x8 and dy8, as
 * blockwise WGRAD multiplies them. */
void
reference_wgrad_from_copies (const Problem *p, GmlpGroupedTensor *x8, GmlpGroupedTensor *dy8,
                             const double *wq, Results *out)
{
  g_autofree double *xt = gmlp_test_dequantize (gmlp_grouped_tensor_get_columnwise (x8));
  g_autofree double *dyt = gmlp_test_dequantize (gmlp_grouped_tensor_get_columnwise (dy8));
  Results copies = { 0, };

  reference (p, xt, wq, dyt, p->dy, &copies);
  g_free (out->dw);
  out->dw = g_steal_pointer (&copies.dw);
  results_clear (&copies);
}

/* Reference (a): the quantized operands of this step, made by the layer's
 * quantizers (the same bytes as the layer's); with wgrad_copies, dW from
 * the columnwise copies (blockwise WGRAD multiplying FP8). */
void
reference_quantized (const Problem *p, const Quantizers *q, gboolean wgrad_copies, Results *out)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedTensor) x8 = gmlp_quantizer_quantize_full (q->input, p->xt, wgrad_copies, &error);
  g_autoptr(GmlpGroupedTensor) w8 = gmlp_quantizer_quantize (q->weight, p->wt, &error);
  g_autoptr(GmlpGroupedTensor) dy8 = gmlp_quantizer_quantize_full (q->grad_output, p->dyt, wgrad_copies, &error);
  g_autofree double *xq = NULL, *wq = NULL, *dyq = NULL;

  g_assert_no_error (error);
  xq = gmlp_test_dequantize (x8);
  wq = gmlp_test_dequantize (w8);
  dyq = gmlp_test_dequantize (dy8);
  reference (p, xq, wq, dyq, p->dy, out);
  if (wgrad_copies)
    reference_wgrad_from_copies (p, x8, dy8, wq, out);
}

/* Whether the layer's WGRAD with host sizes multiplies the columnwise
 * copies of a blockwise recipe (reference_quantized()). */
gboolean
wgrad_copies (GmlpDevice *device, GmlpScalingRecipe recipe)
{
  return recipe == GMLP_SCALING_RECIPE_BLOCKWISE && multiplies_fp8 (device, recipe);
}

/* The layer's weight gradients (wgrad or main_grad, either face), packed. */
double *
download_weight_grads (GmlpGroupedLinear *layer, guint n, gint64 len)
{
  GmlpLinearFlags flags = gmlp_grouped_linear_get_flags (layer);
  gboolean fused = (flags & GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION) != 0;
  double *all;
  gsize got;
  guint g;

  if (flags & GMLP_LINEAR_SINGLE_GROUPED_WEIGHT)
    {
      all = gmlp_test_download (fused ? gmlp_grouped_linear_get_main_grad (layer)
                                      : gmlp_grouped_linear_get_wgrad (layer), &got);
      g_assert_cmpuint (got, ==, n * len);
      return all;
    }
  all = g_new (double, n * len);
  for (g = 0; g < n; g++)
    {
      g_autofree double *one = gmlp_test_download (fused ? gmlp_grouped_linear_get_main_grad_member (layer, g)
                                                         : gmlp_grouped_linear_get_wgrad_member (layer, g),
                                                   &got);
      g_assert_cmpuint (got, ==, len);
      memcpy (all + g * len, one, len * sizeof (double));
    }
  return all;
}

/* Group by group, so that an empty reference group must be exactly zero. */
void
assert_groups_close (const double *got, const double *want, guint n, const gint64 *len,
                     double tol, const char *what)
{
  gsize offset = 0;
  guint g;

  for (g = 0; g < n; g++)
    {
      g_autofree char *name = g_strdup_printf ("%s, group %u", what, g);
      gmlp_test_assert_close (got + offset, want + offset, len[g], tol, name);
      offset += len[g];
    }
}

gboolean on_gpu;

GmlpDevice *
device_or_skip (void)
{
  GmlpDevice *device = gmlp_test_device_or_skip ();

  on_gpu = device != NULL && gmlp_device_get_kind (device) != GMLP_DEVICE_KIND_CPU;
  return device;
}

/* The tolerance of (a): the products' own error. The per-tensor recipes
 * multiply FP8 exactly and sum in FP32: the output dtype's tolerance; but
 * Hopper's FP8 tensor cores keep about 14 significant bits in the partial
 * sums they hand to FP32 (every 128 products or so, with promotion), so
 * FP32 outputs on a GPU get 5e-4. The others (and device sizes) round each
 * operand once more, to BF16 (FP16 for FP16 layers): 2^-9 (2^-11) at most,
 * per element. */
double
tolerance_a (GmlpDType dtype, gboolean dequantized)
{
  double tol = gmlp_test_tolerance (dtype);

  if (dequantized)
    tol = MAX (tol, dtype == GMLP_DTYPE_FLOAT16 ? 3e-3 : 8e-3);
  else if (on_gpu)
    tol = MAX (tol, 5e-4);
  return tol;
}

void
outputs_clear (Outputs *o)
{
  g_clear_pointer (&o->y, g_free);
  g_clear_pointer (&o->dx, g_free);
  g_clear_pointer (&o->dw, g_free);
  g_clear_pointer (&o->db, g_free);
}

/* forward, backward (and backward_dw when delayed) of @layer on @p. */
void
run_layer (GmlpGroupedLinear *layer, const Problem *p, Outputs *out)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GmlpGroupedTensor) y = NULL, dx = NULL;
  GmlpLinearFlags flags = gmlp_grouped_linear_get_flags (layer);
  gsize n;

  y = gmlp_grouped_linear_forward (layer, p->xt, &saved, &error);
  g_assert_no_error (error);
  g_assert_cmpint (gmlp_grouped_tensor_get_dtype (y), ==, p->dtype);
  dx = gmlp_grouped_linear_backward (layer, saved, p->dyt, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_saved_activations_is_consumed (saved));
  if (flags & GMLP_LINEAR_DELAY_WGRAD_COMPUTE)
    {
      g_assert_cmpuint (gmlp_grouped_linear_get_pending_wgrads (layer), ==, 1);
      g_assert_true (gmlp_grouped_linear_backward_dw (layer, &error));
      g_assert_no_error (error);
    }
  out->y = gmlp_test_download (y, &out->n_y);
  out->dx = gmlp_test_download (dx, &out->n_dx);
  g_assert_cmpuint (out->n_y, ==, p->total * p->o);
  g_assert_cmpuint (out->n_dx, ==, p->total * p->k);
  out->dw = download_weight_grads (layer, p->n, p->o * p->k);
  if (p->b != NULL)
    {
      if (flags & GMLP_LINEAR_SINGLE_GROUPED_WEIGHT)
        out->db = gmlp_test_download (gmlp_grouped_linear_get_bgrad (layer), &n);
      else
        {
          guint g;
          out->db = g_new (double, p->n * p->o);
          for (g = 0; g < p->n; g++)
            {
              g_autofree double *one = gmlp_test_download (gmlp_grouped_linear_get_bgrad_member (layer, g), &n);
              memcpy (out->db + g * p->o, one, p->o * sizeof (double));
            }
        }
    }
}

/* Checks (a) for one step's outputs. @dw_base, when given, is what main_grad
 * held before (fused accumulation adds to it in the groups @accumulate
 * marks). */
void
check_a (const Problem *p, const Results *ref, const Outputs *out, double tol, double tol_dw,
         const double *dw_base, const gboolean *accumulate, const char *what)
{
  g_autofree gint64 *len_y = g_new (gint64, p->n);
  g_autofree gint64 *len_dx = g_new (gint64, p->n);
  g_autofree gint64 *len_w = g_new (gint64, p->n);
  g_autofree double *dw_want = g_memdup2 (ref->dw, sizeof (double) * p->n * p->o * p->k);
  g_autofree char *name = NULL;
  guint g;

  for (g = 0; g < p->n; g++)
    {
      len_y[g] = p->rows[g] * p->o;
      len_dx[g] = p->rows[g] * p->k;
      len_w[g] = p->o * p->k;
      if (dw_base != NULL && accumulate[g])
        for (gint64 i = 0; i < p->o * p->k; i++)
          dw_want[g * p->o * p->k + i] += dw_base[g * p->o * p->k + i];
    }
  name = g_strdup_printf ("%s: fprop", what);
  assert_groups_close (out->y, ref->y, p->n, len_y, tol, name);
  g_free (name);
  name = g_strdup_printf ("%s: dgrad", what);
  assert_groups_close (out->dx, ref->dx, p->n, len_dx, tol, name);
  g_free (name);
  name = g_strdup_printf ("%s: wgrad", what);
  assert_groups_close (out->dw, dw_want, p->n, len_w, tol_dw, name);
  if (p->b != NULL)
    {
      g_autofree gint64 *len_b = g_new (gint64, p->n);
      g_free (name);
      name = g_strdup_printf ("%s: dbias", what);
      for (g = 0; g < p->n; g++)
        len_b[g] = p->o;
      assert_groups_close (out->db, ref->db, p->n, len_b, gmlp_test_tolerance (p->dtype), name);
    }
}

/* (b): the FP8 outputs against those of a BF16 layer with the same
 * parameters on the same data (p in BF16); returns the three errors. */
void
measure_b (GmlpDevice *device, const Problem *p, GmlpLinearFlags flags, const Outputs *fp8,
           double err[3])
{
  g_autoptr(GmlpGroupedLinear) bf16 = new_layer (device, p->n, p->k, p->o, GMLP_DTYPE_BFLOAT16,
                                                 flags & ~GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION, NULL);
  g_autoptr(GError) error = NULL;
  Outputs ref = { 0, };
  Problem bp = *p;

  g_assert_cmpint (p->dtype, ==, GMLP_DTYPE_BFLOAT16);
  g_assert_true (gmlp_grouped_linear_set_weight_from_bytes (bf16, p->w_bytes, &error));
  g_assert_no_error (error);
  if (p->b != NULL)
    g_assert_true (gmlp_grouped_linear_set_bias_from_bytes (bf16, p->b_bytes, &error));
  g_assert_no_error (error);
  run_layer (bf16, &bp, &ref);
  err[0] = gmlp_test_relative_error (fp8->y, ref.y, ref.n_y, "(b) fprop");
  err[1] = gmlp_test_relative_error (fp8->dx, ref.dx, ref.n_dx, "(b) dgrad");
  err[2] = gmlp_test_relative_error (fp8->dw, ref.dw, p->n * p->o * p->k, "(b) wgrad");
  outputs_clear (&ref);
}
