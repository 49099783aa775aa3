/* test-grouped-linear-fp8.c: GroupedLinear through quantizers
 *
 * Every FP8 product is checked twice, on fresh random data:
 *
 *  (a) against a float64 reference of the same quantized operands: the test
 *      quantizes x, W and dy with the layer's own quantizers (deterministic:
 *      the same bytes as the layer's), decodes them independently of the
 *      library (FP8 bits times the stored scale) and multiplies in float64.
 *      What is left is the products' own error: FP32 sums and the output
 *      dtype where the layer multiplies FP8 (per-tensor and blockwise
 *      recipes on the CPU and on Hopper), plus one rounding of each operand
 *      to BF16 (FP16 for FP16 layers) where it multiplies dequantized
 *      operands (MXFP8, the CPU's WGRAD with device sizes, other GPUs).
 *      Blockwise WGRAD multiplies the columnwise copies, quantized in
 *      128 × 1 blocks down the tokens: its reference decodes those;
 *  (b) against the BF16 layer on the original data: the error FP8 costs,
 *      held to the bounds of docs/fp8.md, recipe by recipe.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <locale.h>
#include <math.h>
#include <string.h>

#include "gmlp-test-util.h"
#include "gmlp-grouped-tensor-private.h"
#include "gmlp-quantizer-private.h"
#include "gmlp-saved-activations-private.h"
#include "backend/gmlp-backend-gemm.h"

static const GmlpScalingRecipe all_recipes[] = {
  GMLP_SCALING_RECIPE_DELAYED, GMLP_SCALING_RECIPE_CURRENT,
  GMLP_SCALING_RECIPE_BLOCKWISE, GMLP_SCALING_RECIPE_MXFP8,
};
static const GmlpFp8Format test_formats[] = { GMLP_FP8_FORMAT_E4M3, GMLP_FP8_FORMAT_HYBRID };
static const GmlpDType layer_dtypes[] = {
  GMLP_DTYPE_FLOAT32, GMLP_DTYPE_FLOAT16, GMLP_DTYPE_BFLOAT16,
};

/* (b): relative error (‖fp8 − bf16‖ / ‖bf16‖) of the FP8 layer against
 * the BF16 layer, per recipe and format, for normal inputs and gradients
 * and uniform weights; docs/fp8.md records the values measured. Index:
 * [recipe − 1][format is HYBRID][0 fprop, 1 dgrad, 2 wgrad]. */
static const double bound_b[4][2][3] = {
  /* DELAYED (after an update; the first step, with scale 1, is a little worse) */
  { { 0.06, 0.06, 0.06 }, { 0.06, 0.10, 0.10 } },
  /* CURRENT */
  { { 0.06, 0.06, 0.06 }, { 0.06, 0.10, 0.10 } },
  /* BLOCKWISE */
  { { 0.06, 0.06, 0.06 }, { 0.06, 0.10, 0.10 } },
  /* MXFP8 */
  { { 0.08, 0.08, 0.08 }, { 0.08, 0.13, 0.13 } },
};

static gboolean
per_tensor (GmlpScalingRecipe recipe)
{
  return recipe == GMLP_SCALING_RECIPE_DELAYED || recipe == GMLP_SCALING_RECIPE_CURRENT;
}


/* Whether the layer's products multiply this recipe's FP8 operands on the
 * device (host sizes): per-tensor recipes everywhere, blockwise on the CPU
 * and on Hopper (fp8_device_native()); else dequantized operands. */
static gboolean
multiplies_fp8 (GmlpDevice *device, GmlpScalingRecipe recipe)
{
  return per_tensor (recipe) ||
         (recipe == GMLP_SCALING_RECIPE_BLOCKWISE && gmlp_test_fp8_native (device));
}

/* ---- Layers, quantizers and data ----------------------------------------- */

typedef struct {
  GmlpQuantizer *input, *weight, *grad_output;
} Quantizers;

static void
quantizers_clear (Quantizers *q)
{
  g_clear_object (&q->input);
  g_clear_object (&q->weight);
  g_clear_object (&q->grad_output);
}

static void
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

static GmlpGroupedLinear *
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

/* A problem: shapes and fresh random data, as stored in the layer's dtype,
 * and the tensors holding them (the weights as a grouped tensor of their
 * own, for the test to quantize). */
typedef struct {
  guint              n;
  gint64             k, o;
  gint64            *rows;
  gint64             total;
  GmlpDType          dtype;
  double            *x, *w, *b, *dy;
  GBytes            *w_bytes, *b_bytes;
  GmlpGroupedTensor *xt, *dyt, *wt;
} Problem;

static void
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
G_DEFINE_AUTOPTR_CLEANUP_FUNC (Problem, problem_free)

/* Fresh data for @layer (its shape and dtype); x and dy are amplitude ×
 * N(0, 1), W uniform in ±0.5, b uniform in ±1. Sets the layer's
 * parameters. */
static Problem *
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

/* ---- References ----------------------------------------------------------- */

typedef struct {
  double *y, *dx, *dw, *db;
} Results;

static void
results_clear (Results *r)
{
  g_clear_pointer (&r->y, g_free);
  g_clear_pointer (&r->dx, g_free);
  g_clear_pointer (&r->dw, g_free);
  g_clear_pointer (&r->db, g_free);
}

/* float64 y = x Wᵀ + b, dx = dy W, dW = dyᵀ x, db = Σ dy_bias, group by
 * group, over the given operand values. */
static void
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
static void
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
static void
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
static gboolean
wgrad_copies (GmlpDevice *device, GmlpScalingRecipe recipe)
{
  return recipe == GMLP_SCALING_RECIPE_BLOCKWISE && multiplies_fp8 (device, recipe);
}

/* The layer's weight gradients (wgrad or main_grad, either face), packed. */
static double *
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
static void
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

/* Whether the suite runs on a GPU (see tolerance_a()). */
static gboolean on_gpu;

static GmlpDevice *
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
static double
tolerance_a (GmlpDType dtype, gboolean dequantized)
{
  double tol = gmlp_test_tolerance (dtype);

  if (dequantized)
    tol = MAX (tol, dtype == GMLP_DTYPE_FLOAT16 ? 3e-3 : 8e-3);
  else if (on_gpu)
    tol = MAX (tol, 5e-4);
  return tol;
}

/* What one forward and backward gave. */
typedef struct {
  double *y, *dx, *dw, *db;
  gsize   n_y, n_dx;
} Outputs;

static void
outputs_clear (Outputs *o)
{
  g_clear_pointer (&o->y, g_free);
  g_clear_pointer (&o->dx, g_free);
  g_clear_pointer (&o->dw, g_free);
  g_clear_pointer (&o->db, g_free);
}

/* forward, backward (and backward_dw when delayed) of @layer on @p. */
static void
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
static void
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
static void
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

/* ---- Tests ---------------------------------------------------------------- */

/* Every recipe, both formats, every layer dtype: (a) tight, and (b) for
 * BF16 layers within the recipe's bounds. */
static void
test_recipes (void)
{
  g_autoptr(GmlpDevice) device = device_or_skip ();
  gint64 rows[] = { 37, 0, 130, 9 };
  guint r, f, d, step;

  if (device == NULL)
    return;

  for (r = 0; r < G_N_ELEMENTS (all_recipes); r++)
    for (f = 0; f < G_N_ELEMENTS (test_formats); f++)
      for (d = 0; d < G_N_ELEMENTS (layer_dtypes); d++)
        {
          GmlpScalingRecipe recipe = all_recipes[r];
          g_autoptr(GmlpGroupedLinear) layer = NULL;
          Quantizers q = { 0, };
          g_autoptr(GError) error = NULL;

          quantizers_new (&q, device, recipe, test_formats[f], 16);
          layer = new_layer (device, 4, 160, 144, layer_dtypes[d],
                             GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS, &q);

          /* Delayed scaling: a second step, with the scales of the first. */
          for (step = 0; step < (recipe == GMLP_SCALING_RECIPE_DELAYED ? 2u : 1u); step++)
            {
              g_autoptr(Problem) p = problem_new (layer, rows, 1.0);
              g_autofree char *what = g_strdup_printf ("%s %s %s step %u", gmlp_test_recipe_name (recipe),
                                                       test_formats[f] == GMLP_FP8_FORMAT_HYBRID ? "hybrid" : "e4m3",
                                                       gmlp_dtype_get_name (layer_dtypes[d]), step);
              Results ref = { 0, };
              Outputs out = { 0, };
              double tol = tolerance_a (p->dtype, !multiplies_fp8 (device, recipe));

              reference_quantized (p, &q, wgrad_copies (device, recipe), &ref);
              run_layer (layer, p, &out);
              check_a (p, &ref, &out, tol, tol, NULL, NULL, what);
              g_test_message ("(a) %s: fprop %.2e dgrad %.2e wgrad %.2e", what,
                              gmlp_test_relative_error (out.y, ref.y, out.n_y, what),
                              gmlp_test_relative_error (out.dx, ref.dx, out.n_dx, what),
                              gmlp_test_relative_error (out.dw, ref.dw, p->n * p->o * p->k, what));

              if (p->dtype == GMLP_DTYPE_BFLOAT16)
                {
                  double err[3];
                  const double *bound = bound_b[recipe - 1][test_formats[f] == GMLP_FP8_FORMAT_HYBRID];

                  measure_b (device, p, gmlp_grouped_linear_get_flags (layer), &out, err);
                  g_test_message ("(b) %s: fprop %.4f dgrad %.4f wgrad %.4f", what, err[0], err[1], err[2]);
                  for (guint e = 0; e < 3; e++)
                    if (!(err[e] <= bound[e]))
                      g_error ("(b) %s: %s relative error %.4f beyond %.4f", what,
                               e == 0 ? "fprop" : e == 1 ? "dgrad" : "wgrad", err[e], bound[e]);
                }
              results_clear (&ref);
              outputs_clear (&out);
              g_assert_true (gmlp_grouped_linear_update_quantizers (layer, &error));
              g_assert_no_error (error);
            }
          quantizers_clear (&q);
        }
}

/* Shapes and options: one group and many, empty groups (all of them too),
 * row counts that are not multiples of 16 (the CUDA WGRAD pads them),
 * fewer rows than a block; per-group weights, fused accumulation with a
 * mask, delayed weight gradients. */
static void
test_shapes (void)
{
  g_autoptr(GmlpDevice) device = device_or_skip ();
  static const struct {
    guint           n;
    gint64          k, o;
    GmlpLinearFlags flags;
  } cases[] = {
    { 1, 32, 16, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT },
    { 40, 16, 32, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS },
    { 5, 48, 16, GMLP_LINEAR_BIAS },
    { 6, 32, 48, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION },
    { 3, 16, 16, GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION | GMLP_LINEAR_DELAY_WGRAD_COMPUTE },
    { 4, 64, 32, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_DELAY_WGRAD_COMPUTE | GMLP_LINEAR_BIAS },
  };
  guint c, r, g;

  if (device == NULL)
    return;

  for (c = 0; c < G_N_ELEMENTS (cases); c++)
    for (r = 0; r < G_N_ELEMENTS (all_recipes); r++)
      {
        GmlpScalingRecipe recipe = all_recipes[r];
        gboolean fused = (cases[c].flags & GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION) != 0;
        g_autoptr(GmlpGroupedLinear) layer = NULL;
        g_autofree gint64 *rows = g_new (gint64, cases[c].n);
        g_autofree gboolean *mask = g_new (gboolean, cases[c].n);
        g_autofree double *base = NULL;
        g_autoptr(GError) error = NULL;
        Quantizers q = { 0, };
        guint pass;

        quantizers_new (&q, device, recipe, GMLP_FP8_FORMAT_HYBRID, 4);
        layer = new_layer (device, cases[c].n, cases[c].k, cases[c].o, GMLP_DTYPE_BFLOAT16,
                           cases[c].flags, &q);
        for (g = 0; g < cases[c].n; g++)
          mask[g] = g % 2 == 0;
        if (fused)
          g_assert_true (gmlp_grouped_linear_set_wgrad_accumulation_mask (layer, mask, cases[c].n, &error));
        g_assert_no_error (error);

        /* Random sizes with empty groups, then all empty. */
        for (pass = 0; pass < 2; pass++)
          {
            g_autoptr(Problem) p = NULL;
            g_autofree char *what = NULL;
            Results ref = { 0, };
            Outputs out = { 0, };
            double tol = tolerance_a (GMLP_DTYPE_BFLOAT16, !multiplies_fp8 (device, recipe));

            for (g = 0; g < cases[c].n; g++)
              rows[g] = pass == 1 ? 0 : g == 0 ? 1 : g_test_rand_int_range (0, 5) == 0 ? 0
                                                      : g_test_rand_int_range (1, 70);
            p = problem_new (layer, rows, 1.0);
            what = g_strdup_printf ("%s, case %u, pass %u", gmlp_test_recipe_name (recipe), c, pass);
            if (fused)
              base = download_weight_grads (layer, p->n, p->o * p->k);
            reference_quantized (p, &q, wgrad_copies (device, recipe), &ref);
            run_layer (layer, p, &out);
            /* main_grad is FP32: the sums' own error. */
            check_a (p, &ref, &out, tol, fused ? tolerance_a (GMLP_DTYPE_FLOAT32, !multiplies_fp8 (device, recipe)) : tol,
                     fused ? base : NULL, mask, what);
            g_assert_cmpint (gmlp_grouped_linear_get_grad_added_to_main_grad (layer), ==, fused);
            g_clear_pointer (&base, g_free);
            results_clear (&ref);
            outputs_clear (&out);
          }
        quantizers_clear (&q);
      }
}

/* Per-tensor and blockwise recipes on shapes of several output tiles and
 * reduction stages of the CUDA backend's kernels (128 × 128 tiles, 128 FP8
 * values a stage), each with a partial last one, an empty group and a
 * group of one whole tile and one row: the tiles' edges, the promotion of
 * the partial sums and the per-group (per-block) scales. The second split has multiples of 16 rows
 * (the CUDA kernel's FP8 WGRAD takes those) and adds the weight gradients
 * into main_grad in the groups of a mask. The third has features whose
 * rows are whole multiples of 256 bytes: the Hopper kernel's direct
 * schedule for FPROP and DGRAD, with host sizes. The fourth reduces over
 * more than 8 stages in each product (1152 inputs, 1040 outputs, a group
 * of 1040 rows), each ending in a partial block of 8: the Hopper kernel
 * copies blockwise scales 8 stages at a time. Blockwise only: its float64
 * reference is the slow part of the GPU suite. */
static void
test_tiles (void)
{
  g_autoptr(GmlpDevice) device = device_or_skip ();
  static const GmlpScalingRecipe recipes[] = {
    GMLP_SCALING_RECIPE_DELAYED, GMLP_SCALING_RECIPE_CURRENT, GMLP_SCALING_RECIPE_BLOCKWISE,
  };
  static const gint64 splits[4][3] = { { 260, 0, 129 }, { 256, 0, 144 }, { 300, 0, 129 }, { 1040, 0, 48 } };
  static const gint64 features[4][2] = { { 528, 272 }, { 528, 272 }, { 512, 256 }, { 1152, 1040 } };
  static const gboolean mask[3] = { TRUE, FALSE, FALSE };
  guint r, f, sp;

  if (device == NULL)
    return;

  /* The third split puts the rows on the Hopper kernel's direct schedule
   * (rows of 512 bytes) and the fourth its blocks of scales; the CPU
   * backend has neither, and its suite under valgrind is the slow part of
   * CI. */
  for (sp = 0; sp < (gmlp_device_get_kind (device) == GMLP_DEVICE_KIND_CPU ? 2 : G_N_ELEMENTS (splits)); sp++)
    for (r = 0; r < G_N_ELEMENTS (recipes); r++)
      for (f = 0; f < G_N_ELEMENTS (test_formats); f++)
        {
          GmlpDType dtype = layer_dtypes[(2 * r + f + sp) % G_N_ELEMENTS (layer_dtypes)];
          gboolean fused = sp == 1;
          g_autoptr(GmlpGroupedLinear) layer = NULL;
          g_autoptr(Problem) p = NULL;
          g_autoptr(GError) error = NULL;
          g_autofree char *what = NULL;
          g_autofree double *base = NULL;
          Results ref = { 0, };
          Outputs out = { 0, };
          Quantizers q = { 0, };
          double tol = tolerance_a (dtype, !multiplies_fp8 (device, recipes[r]));

          if (sp == 3 && recipes[r] != GMLP_SCALING_RECIPE_BLOCKWISE)
            continue;

          quantizers_new (&q, device, recipes[r], test_formats[f], 4);
          layer = new_layer (device, G_N_ELEMENTS (splits[sp]), features[sp][0], features[sp][1], dtype,
                             GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS |
                             (fused ? GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION : 0), &q);
          if (fused)
            g_assert_true (gmlp_grouped_linear_set_wgrad_accumulation_mask (layer, mask, 3, &error));
          g_assert_no_error (error);
          p = problem_new (layer, splits[sp], 1.0);
          what = g_strdup_printf ("split %u, %s, %s, %s", sp, gmlp_test_recipe_name (recipes[r]),
                                  test_formats[f] == GMLP_FP8_FORMAT_HYBRID ? "hybrid" : "e4m3",
                                  gmlp_dtype_get_name (dtype));
          if (fused)
            base = download_weight_grads (layer, p->n, p->o * p->k);
          reference_quantized (p, &q, wgrad_copies (device, recipes[r]), &ref);
          run_layer (layer, p, &out);
          check_a (p, &ref, &out, tol,
                   fused ? tolerance_a (GMLP_DTYPE_FLOAT32, !multiplies_fp8 (device, recipes[r])) : tol,
                   base, fused ? mask : NULL, what);
          results_clear (&ref);
          outputs_clear (&out);
          quantizers_clear (&q);
        }
}

/* The largest |got - want| over n values. */
static double
max_difference (const double *got, const double *want, gsize n)
{
  double worst = 0.0;
  gsize i;

  for (i = 0; i < n; i++)
    worst = MAX (worst, fabs (got[i] - want[i]));
  return worst;
}

/* The forward's output for @p's input, downloaded. */
static double *
forward_output (GmlpGroupedLinear *layer, const Problem *p)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedTensor) y = gmlp_grouped_linear_forward (layer, p->xt, NULL, &error);
  gsize n;

  g_assert_no_error (error);
  return gmlp_test_download (y, &n);
}

/* cache-fp8-weights: forwards reuse the quantized weights until the layer
 * changes them or the caller invalidates the cache; without the cache a
 * change made in place shows at once. */
static void
test_weight_cache (void)
{
  g_autoptr(GmlpDevice) device = device_or_skip ();
  gint64 rows[] = { 33, 0, 17 };
  g_autoptr(GmlpGroupedLinear) layer = NULL;
  g_autoptr(Problem) p = NULL;
  g_autofree gint64 *len_y = NULL;
  g_autoptr(GError) error = NULL;
  double tol = tolerance_a (GMLP_DTYPE_BFLOAT16, FALSE);
  Results ref = { 0, };
  Outputs out = { 0, };
  Quantizers q = { 0, };
  guint g;

  if (device == NULL)
    return;

  quantizers_new (&q, device, GMLP_SCALING_RECIPE_CURRENT, GMLP_FP8_FORMAT_HYBRID, 4);
  layer = new_layer (device, G_N_ELEMENTS (rows), 64, 48, GMLP_DTYPE_BFLOAT16,
                     GMLP_LINEAR_SINGLE_GROUPED_WEIGHT, &q);
  g_assert_false (gmlp_grouped_linear_get_cache_fp8_weights (layer));
  g_object_set (layer, "cache-fp8-weights", TRUE, NULL);
  g_assert_true (gmlp_grouped_linear_get_cache_fp8_weights (layer));
  len_y = g_new (gint64, G_N_ELEMENTS (rows));
  for (g = 0; g < G_N_ELEMENTS (rows); g++)
    len_y[g] = rows[g] * 48;

  /* set_weight_from_bytes (in problem_new) drops what an earlier forward
   * cached: two steps with fresh weights, both right. */
  for (g = 0; g < 2; g++)
    {
      g_clear_pointer (&p, problem_free);
      p = problem_new (layer, rows, 1.0);
      reference_quantized (p, &q, FALSE, &ref);
      run_layer (layer, p, &out);
      check_a (p, &ref, &out, tol, tol, NULL, NULL, "cached weights");
      outputs_clear (&out);
      if (g == 0)
        results_clear (&ref);
    }

  /* Weights changed in place: the cache still holds the old ones... */
  g_assert_true (gmlp_grouped_tensor_fill_random (gmlp_grouped_linear_get_weight (layer), 7, 0.5, &error));
  g_assert_no_error (error);
  {
    g_autofree double *y = forward_output (layer, p);
    assert_groups_close (y, ref.y, p->n, len_y, tol, "forward from the cache");
  }
  /* ...until invalidated. */
  gmlp_grouped_linear_invalidate_fp8_weights (layer);
  {
    g_autofree double *y = forward_output (layer, p);
    g_assert_cmpfloat (max_difference (y, ref.y, p->total * p->o), >, 0.1);
  }

  /* Without the cache an in-place change shows at once. */
  g_object_set (layer, "cache-fp8-weights", FALSE, NULL);
  g_assert_true (gmlp_grouped_linear_set_weight_from_bytes (layer, p->w_bytes, &error));
  g_assert_no_error (error);
  {
    g_autofree double *y = forward_output (layer, p);
    assert_groups_close (y, ref.y, p->n, len_y, tol, "forward after set_weight_from_bytes");
  }
  g_assert_true (gmlp_grouped_tensor_fill_random (gmlp_grouped_linear_get_weight (layer), 8, 0.5, &error));
  g_assert_no_error (error);
  {
    g_autofree double *y = forward_output (layer, p);
    g_assert_cmpfloat (max_difference (y, ref.y, p->total * p->o), >, 0.1);
  }

  results_clear (&ref);
  quantizers_clear (&q);
}

/* Delayed scaling over several steps: the first step quantizes with scale
 * 1, each update takes the scale from the amax history, and every step
 * stays within (a) and (b). */
static void
test_delayed_steps (void)
{
  g_autoptr(GmlpDevice) device = device_or_skip ();
  static const double amplitudes[] = { 2.0, 1.0, 0.5, 1.0 };
  gint64 rows[] = { 45, 16, 0, 77 };
  g_autoptr(GmlpGroupedLinear) layer = NULL;
  g_autoptr(GError) error = NULL;
  double previous_scale = 0.0;
  Quantizers q = { 0, };
  guint step;

  if (device == NULL)
    return;

  quantizers_new (&q, device, GMLP_SCALING_RECIPE_DELAYED, GMLP_FP8_FORMAT_HYBRID, 4);
  layer = new_layer (device, 4, 64, 48, GMLP_DTYPE_BFLOAT16,
                     GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS, &q);

  for (step = 0; step < G_N_ELEMENTS (amplitudes); step++)
    {
      g_autoptr(Problem) p = problem_new (layer, rows, amplitudes[step]);
      g_autoptr(GVariant) state = NULL;
      g_autoptr(GVariant) scales = NULL;
      g_autofree char *what = g_strdup_printf ("delayed step %u", step);
      const double *s;
      double err[3];
      Results ref = { 0, };
      Outputs out = { 0, };
      gsize n_scales;
      guint e;

      /* The scales this step quantizes with. */
      state = gmlp_quantizer_save_state (q.input, &error);
      g_assert_no_error (error);
      scales = g_variant_lookup_value (state, "scale", G_VARIANT_TYPE ("ad"));
      s = g_variant_get_fixed_array (scales, &n_scales, sizeof (double));
      if (step == 0)
        g_assert_cmpuint (n_scales, ==, 0);   /* no state yet: scale 1 */
      else
        {
          g_assert_cmpuint (n_scales, ==, 4);
          /* 448 / amax: the largest amax seen so far (step 0's). */
          g_assert_cmpfloat (s[0], >, 10.0);
          g_assert_true (s[0] == previous_scale || step == 1);
          previous_scale = s[0];
        }

      reference_quantized (p, &q, FALSE, &ref);
      run_layer (layer, p, &out);
      check_a (p, &ref, &out, tolerance_a (p->dtype, FALSE), tolerance_a (p->dtype, FALSE),
               NULL, NULL, what);
      measure_b (device, p, gmlp_grouped_linear_get_flags (layer), &out, err);
      g_test_message ("(b) %s: fprop %.4f dgrad %.4f wgrad %.4f", what, err[0], err[1], err[2]);
      for (e = 0; e < 3; e++)
        if (!(err[e] <= bound_b[0][1][e]))
          g_error ("(b) %s: relative error %.4f beyond %.4f", what, err[e], bound_b[0][1][e]);
      results_clear (&ref);
      outputs_clear (&out);

      g_assert_true (gmlp_grouped_linear_update_quantizers (layer, &error));
      g_assert_no_error (error);
    }
  quantizers_clear (&q);
}

/* The two per-tensor recipes meet in one product: current scaling for the
 * activations, delayed for the weights. */
static void
test_mixed_per_tensor (void)
{
  g_autoptr(GmlpDevice) device = device_or_skip ();
  gint64 rows[] = { 31, 0, 48 };
  g_autoptr(GmlpGroupedLinear) layer = NULL;
  g_autoptr(GmlpQuantizer) q_w = NULL;
  g_autoptr(GError) error = NULL;
  Quantizers q = { 0, };
  guint step;

  if (device == NULL)
    return;

  quantizers_new (&q, device, GMLP_SCALING_RECIPE_CURRENT, GMLP_FP8_FORMAT_HYBRID, 4);
  q_w = g_object_new (GMLP_TYPE_QUANTIZER, "device", device, "recipe", GMLP_SCALING_RECIPE_DELAYED,
                      "role", GMLP_QUANTIZER_ROLE_WEIGHT, "amax-history-length", 2, NULL);
  g_set_object (&q.weight, q_w);
  layer = new_layer (device, 3, 48, 32, GMLP_DTYPE_BFLOAT16, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT, &q);
  for (step = 0; step < 2; step++)
    {
      g_autoptr(Problem) p = problem_new (layer, rows, 1.0);
      Results ref = { 0, };
      Outputs out = { 0, };

      reference_quantized (p, &q, FALSE, &ref);
      run_layer (layer, p, &out);
      check_a (p, &ref, &out, tolerance_a (p->dtype, FALSE), tolerance_a (p->dtype, FALSE), NULL, NULL,
               "current and delayed");
      results_clear (&ref);
      outputs_clear (&out);
      g_assert_true (gmlp_grouped_linear_update_quantizers (layer, &error));
      g_assert_no_error (error);
    }
  quantizers_clear (&q);
}

/* Operands given quantized already: with their columnwise copies, without
 * (the products then fall back to dequantized operands), and a backward
 * whose dy comes quantized (the bias gradient from its dequantized
 * values). */
static void
test_prequantized (void)
{
  g_autoptr(GmlpDevice) device = device_or_skip ();
  gint64 rows[] = { 20, 3, 0, 33 };
  guint r, with_copies;

  if (device == NULL)
    return;

  for (r = 0; r < G_N_ELEMENTS (all_recipes); r++)
    for (with_copies = 0; with_copies < 2; with_copies++)
      {
        GmlpScalingRecipe recipe = all_recipes[r];
        g_autoptr(GmlpGroupedLinear) layer = NULL;
        g_autoptr(Problem) p = NULL;
        g_autoptr(GmlpGroupedTensor) x8 = NULL, dy8 = NULL, y = NULL, dx = NULL;
        g_autoptr(GmlpSavedActivations) saved = NULL;
        g_autoptr(GError) error = NULL;
        g_autofree double *xq = NULL, *dyq = NULL, *dw = NULL, *dyd = NULL;
        g_autofree gint64 *len_y = g_new (gint64, 4), *len_dx = g_new (gint64, 4), *len_w = g_new (gint64, 4);
        g_autofree char *what = g_strdup_printf ("prequantized %s, copies %u", gmlp_test_recipe_name (recipe),
                                                 with_copies);
        Quantizers q = { 0, };
        Results ref = { 0, };
        double tol;
        gsize n;
        guint g;

        quantizers_new (&q, device, recipe, GMLP_FP8_FORMAT_HYBRID, 4);
        layer = new_layer (device, 4, 32, 48, GMLP_DTYPE_BFLOAT16,
                           GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS, &q);
        p = problem_new (layer, rows, 1.0);
        gmlp_quantizer_set_columnwise (q.input, with_copies);
        gmlp_quantizer_set_columnwise (q.grad_output, with_copies);
        x8 = gmlp_quantizer_quantize (q.input, p->xt, &error);
        dy8 = gmlp_quantizer_quantize (q.grad_output, p->dyt, &error);
        g_assert_no_error (error);
        xq = gmlp_test_dequantize (x8);
        dyq = gmlp_test_dequantize (dy8);
        {
          g_autoptr(GmlpGroupedTensor) w8 = gmlp_quantizer_quantize (q.weight, p->wt, &error);
          g_autofree double *wq = NULL;

          g_assert_no_error (error);
          wq = gmlp_test_dequantize (w8);
          /* db from dy's dequantized values (rounded to the layer's dtype). */
          dyd = g_new (double, MAX (p->total * p->o, 1));
          for (gint64 i = 0; i < p->total * p->o; i++)
            dyd[i] = gmlp_test_round (dyq[i], p->dtype);
          reference (p, xq, wq, dyq, dyd, &ref);
          if (with_copies && wgrad_copies (device, recipe))
            reference_wgrad_from_copies (p, x8, dy8, wq, &ref);
        }

        y = gmlp_grouped_linear_forward (layer, x8, &saved, &error);
        g_assert_no_error (error);
        dx = gmlp_grouped_linear_backward (layer, saved, dy8, &error);
        g_assert_no_error (error);

        /* The products of multiplied recipes run on FP8 with the copies,
         * else on dequantized operands (FPROP always reads x rowwise). */
        tol = tolerance_a (p->dtype, !multiplies_fp8 (device, recipe) || !with_copies);
        for (g = 0; g < 4; g++)
          {
            len_y[g] = rows[g] * p->o;
            len_dx[g] = rows[g] * p->k;
            len_w[g] = p->o * p->k;
          }
        {
          g_autofree double *got_y = gmlp_test_download (y, &n);
          g_autofree double *got_dx = gmlp_test_download (dx, &n);
          g_autofree double *got_db = gmlp_test_download (gmlp_grouped_linear_get_bgrad (layer), &n);
          g_autofree gint64 *len_b = g_new (gint64, 4);

          assert_groups_close (got_y, ref.y, 4, len_y, tolerance_a (p->dtype, !multiplies_fp8 (device, recipe)), what);
          assert_groups_close (got_dx, ref.dx, 4, len_dx, tol, what);
          dw = gmlp_test_download (gmlp_grouped_linear_get_wgrad (layer), &n);
          assert_groups_close (dw, ref.dw, 4, len_w, tol, what);
          for (g = 0; g < 4; g++)
            len_b[g] = p->o;
          assert_groups_close (got_db, ref.db, 4, len_b, gmlp_test_tolerance (p->dtype), what);
        }
        results_clear (&ref);
        quantizers_clear (&q);
      }
}

/* Group sizes only on the device: every recipe, through dequantized
 * operands, against (a). */
static GmlpGroupedTensor *
device_sized_copy (GmlpGroupedTensor *host, const gint64 *rows, guint n)
{
  GmlpDevice *device = gmlp_grouped_tensor_get_device (host);
  g_autoptr(GBytes) size_bytes = g_bytes_new (rows, n * sizeof (gint64));
  g_autoptr(GmlpGroupedTensor) sizes = NULL;
  g_autoptr(GError) error = NULL;
  gint64 len = n, capacity = 0;
  guint g;

  for (g = 0; g < n; g++)
    capacity += rows[g];
  sizes = gmlp_grouped_tensor_new_from_bytes (device, GMLP_DTYPE_INT64, &len, 1, 1, size_bytes, &error);
  g_assert_no_error (error);
  return gmlp_test_device_sized_copy (host, sizes, capacity);
}

/* Forward and backward of @layer on copies of @p's x and dy whose group
 * sizes (@rows, of @p's groups) are on the device only; the outputs, kept
 * so, downloaded in @p's host layout: y, dx and the packed weight
 * gradients. */
static void
run_layer_device_sized (GmlpGroupedLinear *layer, const Problem *p, const gint64 *rows, Outputs *out)
{
  g_autoptr(GmlpGroupedTensor) x = device_sized_copy (p->xt, rows, p->n);
  g_autoptr(GmlpGroupedTensor) dy = device_sized_copy (p->dyt, rows, p->n);
  g_autoptr(GmlpGroupedTensor) y = NULL, dx = NULL, yv = NULL, dxv = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GError) error = NULL;
  gsize n;

  y = gmlp_grouped_linear_forward (layer, x, &saved, &error);
  g_assert_no_error (error);
  g_assert_false (gmlp_grouped_tensor_has_host_sizes (y));
  dx = gmlp_grouped_linear_backward (layer, saved, dy, &error);
  g_assert_no_error (error);
  g_assert_false (gmlp_grouped_tensor_has_host_sizes (dx));

  yv = gmlp_test_host_view (y, rows);
  dxv = gmlp_test_host_view (dx, rows);
  out->y = gmlp_test_download (yv, &out->n_y);
  g_assert_cmpuint (out->n_y, ==, p->total * p->o);
  out->dx = gmlp_test_download (dxv, &out->n_dx);
  g_assert_cmpuint (out->n_dx, ==, p->total * p->k);
  out->dw = gmlp_test_download (gmlp_grouped_linear_get_wgrad (layer), &n);
  g_assert_cmpuint (n, ==, p->n * p->o * p->k);
}

/* Long reductions in FP32 on the GPU, against (a): Hopper's FP8 tensor
 * cores keep about 14 significant bits in their sums, so a kernel that
 * summed a whole 4096-deep FPROP reduction there would be off by several
 * 1e-3; promoted into FP32 registers every few stages it stays within
 * tolerance_a(). Device sizes, so that every product runs on libgmlp's
 * own kernel where it multiplies FP8 (Hopper), on 128 × 192 tiles
 * (384 outputs): FPROP reduces over 32 stages, WGRAD over up to 5.
 * Per-tensor recipes: blockwise sums are scaled, so promoted, stage by
 * stage. The measured errors are in the log (docs/fp8.md). */
static void
test_long_reduction (void)
{
  g_autoptr(GmlpDevice) device = device_or_skip ();
  gint64 rows[] = { 600, 0, 200 };
  guint f;

  if (device == NULL)
    return;
  if (!on_gpu)
    {
      g_test_skip ("the CPU sums FP8 products in FP32");
      return;
    }

  for (f = 0; f < G_N_ELEMENTS (test_formats); f++)
    {
      GmlpScalingRecipe recipe = f == 0 ? GMLP_SCALING_RECIPE_CURRENT : GMLP_SCALING_RECIPE_DELAYED;
      g_autoptr(GmlpGroupedLinear) layer = NULL;
      g_autoptr(Problem) p = NULL;
      g_autofree char *what = g_strdup_printf ("long reduction, %s, %s", gmlp_test_recipe_name (recipe),
                                               test_formats[f] == GMLP_FP8_FORMAT_HYBRID ? "hybrid" : "e4m3");
      /* On the GPU every product multiplies FP8 on Hopper only (as in
       * test_device_sizes, WGRAD too). */
      double tol = tolerance_a (GMLP_DTYPE_FLOAT32, !gmlp_test_fp8_native (device));
      Quantizers q = { 0, };
      Results ref = { 0, };
      Outputs out = { 0, };

      quantizers_new (&q, device, recipe, test_formats[f], 4);
      layer = new_layer (device, G_N_ELEMENTS (rows), 4096, 384, GMLP_DTYPE_FLOAT32,
                         GMLP_LINEAR_SINGLE_GROUPED_WEIGHT, &q);
      p = problem_new (layer, rows, 1.0);
      reference_quantized (p, &q, FALSE, &ref);
      run_layer_device_sized (layer, p, rows, &out);

      g_test_message ("(a) %s: fprop %.2e dgrad %.2e wgrad %.2e (tolerance %.0e)", what,
                      gmlp_test_relative_error (out.y, ref.y, out.n_y, what),
                      gmlp_test_relative_error (out.dx, ref.dx, out.n_dx, what),
                      gmlp_test_relative_error (out.dw, ref.dw, p->n * p->o * p->k, what), tol);
      gmlp_test_assert_close (out.y, ref.y, out.n_y, tol, what);
      gmlp_test_assert_close (out.dx, ref.dx, out.n_dx, tol, what);
      gmlp_test_assert_close (out.dw, ref.dw, p->n * p->o * p->k, tol, what);
      results_clear (&ref);
      outputs_clear (&out);
      quantizers_clear (&q);
    }
}

static void
test_device_sizes (void)
{
  g_autoptr(GmlpDevice) device = device_or_skip ();
  /* Sizes no multiple of 16 (the Hopper kernel repacks those groups of
   * WGRAD's copies and reads the others in place), all of them multiples
   * of 16 (nothing repacked), an empty group, and groups of several
   * 128-deep WGRAD stages, more than the 8 whose blockwise scales the
   * kernel copies at a time; features whose FP8 and BF16 rows are whole
   * multiples of 256 bytes (the Hopper kernel's direct schedule for FPROP
   * and DGRAD, row tiles reaching into the next group). */
  const gint64 all_rows[][4] = {
    { 29, 0, 64, 7 }, { 300, 129, 0, 17 }, { 300, 129, 0, 17 }, { 1100, 0, 1300, 5 },
    { 144, 16, 0, 1040 },
  };
  const gint64 features[][2] = { { 48, 32 }, { 48, 32 }, { 256, 256 }, { 256, 144 }, { 256, 192 } };
  guint i;

  if (device == NULL)
    return;

  for (i = 0; i < G_N_ELEMENTS (all_rows) * G_N_ELEMENTS (all_recipes); i++)
    {
      guint s = i / G_N_ELEMENTS (all_recipes);
      GmlpScalingRecipe recipe = all_recipes[i % G_N_ELEMENTS (all_recipes)];
      gint64 rows[4];
      g_autoptr(GmlpGroupedLinear) layer = NULL;
      g_autoptr(Problem) p = NULL;
      g_autofree char *what = g_strdup_printf ("device sizes %u, %s", s, gmlp_test_recipe_name (recipe));
      g_autofree gint64 *len_y = g_new (gint64, 4), *len_dx = g_new (gint64, 4), *len_w = g_new (gint64, 4);
      /* Per-tensor and blockwise FPROP and DGRAD multiply FP8 (the CPU;
       * CUDA on Hopper), and so does WGRAD on Hopper (blockwise: the
       * columnwise copies); the rest dequantized operands. */
      gboolean native = multiplies_fp8 (device, recipe) && gmlp_test_fp8_native (device);
      gboolean native_wgrad = on_gpu && native;
      double tol_w = tolerance_a (GMLP_DTYPE_BFLOAT16, !native_wgrad);
      double tol_native = tolerance_a (GMLP_DTYPE_BFLOAT16, !native);
      Quantizers q = { 0, };
      Results ref = { 0, };
      Outputs out = { 0, };
      guint g;

      memcpy (rows, all_rows[s], sizeof rows);

      quantizers_new (&q, device, recipe, GMLP_FP8_FORMAT_HYBRID, 4);
      layer = new_layer (device, 4, features[s][0], features[s][1], GMLP_DTYPE_BFLOAT16,
                         GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS, &q);
      p = problem_new (layer, rows, 1.0);
      reference_quantized (p, &q, native_wgrad && recipe == GMLP_SCALING_RECIPE_BLOCKWISE, &ref);
      run_layer_device_sized (layer, p, rows, &out);
      for (g = 0; g < 4; g++)
        {
          len_y[g] = rows[g] * p->o;
          len_dx[g] = rows[g] * p->k;
          len_w[g] = p->o * p->k;
        }
      assert_groups_close (out.y, ref.y, 4, len_y, tol_native, what);
      assert_groups_close (out.dx, ref.dx, 4, len_dx, tol_native, what);
      assert_groups_close (out.dw, ref.dw, 4, len_w, tol_w, what);
      results_clear (&ref);
      outputs_clear (&out);
      quantizers_clear (&q);
    }
}

/* The values of a tensor, packed (a columnwise copy's too: its members
 * have the same number of bytes). */
static GBytes *
raw_bytes (GmlpGroupedTensor *t)
{
  g_autoptr(GError) error = NULL;
  GBytes *bytes = gmlp_grouped_tensor_to_bytes (t, &error);

  g_assert_no_error (error);
  return bytes;
}

/* Offload of FP8 saved activations: forward, backward and the weight
 * gradients are bit-identical with and without offload, and what moved to
 * the host is every part of the quantized input. */
static void
test_offload (void)
{
  g_autoptr(GmlpDevice) device = device_or_skip ();
  gint64 rows[] = { 50, 0, 17, 96 };
  guint r;

  if (device == NULL)
    return;

  for (r = 0; r < G_N_ELEMENTS (all_recipes); r++)
    {
      GmlpScalingRecipe recipe = all_recipes[r];
      g_autoptr(GmlpGroupedLinear) layer = NULL;
      g_autoptr(GmlpOffloadContext) ctx = NULL;
      g_autoptr(Problem) p = NULL;
      g_autoptr(GmlpGroupedTensor) y0 = NULL, dx0 = NULL, dw0 = NULL, db0 = NULL;
      g_autoptr(GmlpGroupedTensor) x = NULL, y1 = NULL, dx1 = NULL;
      g_autoptr(GmlpSavedActivations) saved0 = NULL, saved1 = NULL;
      g_autoptr(GError) error = NULL;
      g_autoptr(GBytes) x_bytes = NULL;
      Quantizers q = { 0, };
      guint64 expected;

      quantizers_new (&q, device, recipe, GMLP_FP8_FORMAT_HYBRID, 4);
      layer = new_layer (device, 4, 32, 16, GMLP_DTYPE_BFLOAT16,
                         GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS, &q);
      p = problem_new (layer, rows, 1.0);

      /* Without offload. */
      y0 = gmlp_grouped_linear_forward (layer, p->xt, &saved0, &error);
      g_assert_no_error (error);
      g_assert_false (gmlp_saved_activations_get_offload (saved0));
      dx0 = gmlp_grouped_linear_backward (layer, saved0, p->dyt, &error);
      g_assert_no_error (error);
      dw0 = gmlp_grouped_tensor_convert (gmlp_grouped_linear_get_wgrad (layer), GMLP_DTYPE_BFLOAT16, &error);
      db0 = gmlp_grouped_tensor_convert (gmlp_grouped_linear_get_bgrad (layer), GMLP_DTYPE_BFLOAT16, &error);
      g_assert_no_error (error);

      /* With: the input is a copy the test then overwrites. */
      x_bytes = gmlp_grouped_tensor_to_bytes (p->xt, &error);
      x = gmlp_grouped_tensor_new_from_bytes (device, GMLP_DTYPE_BFLOAT16, rows, 4, p->k, x_bytes, &error);
      g_assert_no_error (error);
      ctx = gmlp_offload_context_new (device, &error);
      g_assert_no_error (error);
      gmlp_offload_context_push_thread_default (ctx, TRUE);
      y1 = gmlp_grouped_linear_forward (layer, x, &saved1, &error);
      g_assert_true (gmlp_offload_context_pop_thread_default (ctx, NULL));
      g_assert_no_error (error);
      g_assert_true (gmlp_saved_activations_get_offload (saved1));
      gmlp_offload_context_flush (ctx);

      /* On the host: the quantized input, its scales and, for the
       * per-tensor and blockwise recipes (whose WGRAD reads it), its
       * columnwise copy; the FP8 weights stay on the device. */
      {
        g_autoptr(GmlpQuantizer) probe = g_object_new (GMLP_TYPE_QUANTIZER, "device", device,
                                                       "recipe", recipe, "role", GMLP_QUANTIZER_ROLE_INPUT,
                                                       "columnwise", recipe != GMLP_SCALING_RECIPE_MXFP8,
                                                       NULL);
        g_autoptr(GmlpGroupedTensor) x8 = gmlp_quantizer_quantize (probe, p->xt, &error);
        GmlpGroupedTensor *cw = gmlp_grouped_tensor_get_columnwise (x8);

        g_assert_no_error (error);
        expected = gmlp_grouped_tensor_get_nbytes (x8) +
                   gmlp_grouped_tensor_get_nbytes (gmlp_grouped_tensor_get_scale_inv (x8));
        if (cw != NULL)
          {
            expected += gmlp_grouped_tensor_get_nbytes (cw);
            if (gmlp_grouped_tensor_get_scale_inv (cw) != gmlp_grouped_tensor_get_scale_inv (x8))
              expected += gmlp_grouped_tensor_get_nbytes (gmlp_grouped_tensor_get_scale_inv (cw));
          }
        g_assert_cmpuint (gmlp_saved_activations_get_host_nbytes (saved1), ==, expected);
      }

      /* Overwritten behind libgmlp's back (as through DLPack: the version
       * stays), so that only the offloaded copy holds the input. */
      g_assert_true (gmlp_device_synchronize (device, NULL));
      g_assert_true (GMLP_DEVICE_CALL (device, fill_bytes, gmlp_grouped_tensor_get_data (x), 0,
                                       gmlp_grouped_tensor_get_nbytes (x), NULL));
      dx1 = gmlp_grouped_linear_backward (layer, saved1, p->dyt, &error);
      g_assert_no_error (error);

      gmlp_test_assert_same_bytes (y0, y1, "fprop (offloaded)");
      gmlp_test_assert_same_bytes (dx0, dx1, "dgrad (reloaded)");
      gmlp_test_assert_same_bytes (dw0, gmlp_grouped_linear_get_wgrad (layer), "wgrad (reloaded)");
      gmlp_test_assert_same_bytes (db0, gmlp_grouped_linear_get_bgrad (layer), "dbias (reloaded)");
      quantizers_clear (&q);
    }
}

/* Saved activations move every part of a quantized tensor, with scales of
 * its own for the columnwise copy too, and give back the same tensor. */
static void
test_offload_parts (void)
{
  g_autoptr(GmlpDevice) device = device_or_skip ();
  gint64 rows[] = { 130, 0, 31 };
  guint r;

  if (device == NULL)
    return;

  for (r = 0; r < G_N_ELEMENTS (all_recipes); r++)
    {
      g_autoptr(GmlpQuantizer) q = NULL;
      g_autoptr(GmlpOffloadContext) ctx = NULL;
      g_autoptr(GmlpSavedActivations) saved = NULL;
      g_autoptr(GmlpGroupedTensor) src = NULL, x8 = NULL;
      g_autoptr(GBytes) data = NULL, scales = NULL, cw = NULL, cw_scales = NULL;
      g_autoptr(GError) error = NULL;
      GmlpGroupedTensor *back, *x8_cw;
      gint64 br0, bc0, br1, bc1;

      q = g_object_new (GMLP_TYPE_QUANTIZER, "device", device, "recipe", all_recipes[r],
                        "role", GMLP_QUANTIZER_ROLE_INPUT, "columnwise", TRUE, NULL);
      src = gmlp_test_random_tensor (device, GMLP_DTYPE_BFLOAT16, rows, 3, 160, 1.0, NULL);
      x8 = gmlp_quantizer_quantize (q, src, &error);
      g_assert_no_error (error);
      x8_cw = gmlp_grouped_tensor_get_columnwise (x8);
      data = raw_bytes (x8);
      scales = raw_bytes (gmlp_grouped_tensor_get_scale_inv (x8));
      cw = raw_bytes (x8_cw);
      cw_scales = raw_bytes (gmlp_grouped_tensor_get_scale_inv (x8_cw));

      saved = gmlp_saved_activations_new (1);
      gmlp_saved_activations_add (saved, "input", x8);
      ctx = gmlp_offload_context_new (device, &error);
      g_assert_no_error (error);
      gmlp_offload_context_push_thread_default (ctx, TRUE);
      g_assert_true (gmlp_saved_activations_apply_offload (saved, &error));
      g_assert_true (gmlp_offload_context_pop_thread_default (ctx, NULL));
      g_assert_no_error (error);
      g_clear_object (&x8);
      gmlp_offload_context_flush (ctx);
      g_assert_cmpuint (gmlp_saved_activations_get_nbytes (saved), ==, 0);
      g_assert_true (gmlp_saved_activations_is_on_host (saved));

      back = gmlp_saved_activations_get (saved, "input", &error);
      g_assert_no_error (error);
      g_assert_cmpint (gmlp_grouped_tensor_get_scaling_recipe (back), ==, all_recipes[r]);
      g_assert_nonnull (gmlp_grouped_tensor_get_columnwise (back));
      g_assert_true (gmlp_grouped_tensor_is_columnwise (gmlp_grouped_tensor_get_columnwise (back)));
      g_assert_true (gmlp_grouped_tensor_get_scale_block (back, &br0, &bc0));
      g_assert_true (gmlp_grouped_tensor_get_scale_block (gmlp_grouped_tensor_get_columnwise (back), &br1, &bc1));
      if (all_recipes[r] == GMLP_SCALING_RECIPE_BLOCKWISE)
        {
          g_assert_cmpint (br0, ==, 1);
          g_assert_cmpint (bc0, ==, 128);
          g_assert_cmpint (br1, ==, 128);
          g_assert_cmpint (bc1, ==, 1);
        }
      {
        g_autoptr(GBytes) d = raw_bytes (back);
        g_autoptr(GBytes) s = raw_bytes (gmlp_grouped_tensor_get_scale_inv (back));
        g_autoptr(GBytes) c = raw_bytes (gmlp_grouped_tensor_get_columnwise (back));
        g_autoptr(GBytes) cs = raw_bytes (gmlp_grouped_tensor_get_scale_inv (gmlp_grouped_tensor_get_columnwise (back)));

        g_assert_true (g_bytes_equal (d, data));
        g_assert_true (g_bytes_equal (s, scales));
        g_assert_true (g_bytes_equal (c, cw));
        g_assert_true (g_bytes_equal (cs, cw_scales));
      }
      /* Per-tensor recipes share one scale tensor between the two. */
      if (per_tensor (all_recipes[r]))
        g_assert_true (gmlp_grouped_tensor_get_scale_inv (back) ==
                       gmlp_grouped_tensor_get_scale_inv (gmlp_grouped_tensor_get_columnwise (back)));
      {
        g_autoptr(GmlpGroupedTensor) again = gmlp_grouped_tensor_dequantize (back, GMLP_DTYPE_FLOAT32, &error);
        g_assert_no_error (error);
      }
      gmlp_saved_activations_consume (saved);
    }
}

/* Bad input: a clear error before anything is written or allocated. */
static void
test_bad_input (void)
{
  g_autoptr(GmlpDevice) device = device_or_skip ();
  g_autoptr(GmlpGroupedLinear) layer = NULL, odd = NULL, plain = NULL;
  g_autoptr(GmlpGroupedTensor) x8_blockwise = NULL, x8_plain = NULL, dy8_plain = NULL;
  g_autoptr(GmlpGroupedTensor) y = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GmlpQuantizer) blockwise = NULL, e5m2_in = NULL, e5m2_w = NULL;
  g_autoptr(Problem) p = NULL;
  g_autoptr(GError) error = NULL;
  Quantizers q = { 0, }, q5 = { 0, };
  gint64 rows[] = { 5, 0, 12 };
  guint64 in_use;

  if (device == NULL)
    return;

  quantizers_new (&q, device, GMLP_SCALING_RECIPE_CURRENT, GMLP_FP8_FORMAT_HYBRID, 4);
  layer = new_layer (device, 3, 32, 16, GMLP_DTYPE_BFLOAT16, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT, NULL);
  p = problem_new (layer, rows, 1.0);

#define EXPECT_FALSE(call, code) \
  G_STMT_START { \
    g_autoptr(GError) _e = NULL; \
    g_assert_false (call); \
    g_assert_error (_e, GMLP_ERROR, (code)); \
  } G_STMT_END

  /* Quantizers: all three or none, the right roles, recipes that meet. */
  EXPECT_FALSE (gmlp_grouped_linear_set_quantizers (layer, q.input, q.weight, NULL, &_e),
                GMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_FALSE (gmlp_grouped_linear_set_quantizers (layer, q.weight, q.input, q.grad_output, &_e),
                GMLP_ERROR_INVALID_ARGUMENT);
  blockwise = gmlp_quantizer_new (device, GMLP_SCALING_RECIPE_BLOCKWISE, GMLP_FP8_FORMAT_HYBRID,
                                  GMLP_QUANTIZER_ROLE_INPUT);
  EXPECT_FALSE (gmlp_grouped_linear_set_quantizers (layer, blockwise, q.weight, q.grad_output, &_e),
                GMLP_ERROR_UNSUPPORTED);
  /* E5M2 × E5M2. */
  quantizers_new (&q5, device, GMLP_SCALING_RECIPE_CURRENT, GMLP_FP8_FORMAT_E5M2, 4);
  EXPECT_FALSE (gmlp_grouped_linear_set_quantizers (layer, q5.input, q5.weight, q5.grad_output, &_e),
                GMLP_ERROR_UNSUPPORTED);
  /* Features that are not multiples of 16, with per-tensor scales. */
  odd = new_layer (device, 3, 24, 16, GMLP_DTYPE_BFLOAT16, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT, NULL);
  EXPECT_FALSE (gmlp_grouped_linear_set_quantizers (odd, q.input, q.weight, q.grad_output, &_e),
                GMLP_ERROR_UNSUPPORTED);
  g_assert_null (gmlp_grouped_linear_get_quantizer (layer, GMLP_QUANTIZER_ROLE_INPUT));
  {
    g_autoptr(GError) e = NULL;
    g_autoptr(GmlpGroupedLinear) half = g_initable_new (GMLP_TYPE_GROUPED_LINEAR, NULL, &e,
                                                        "device", device, "n-groups", 3,
                                                        "in-features", (gint64) 32,
                                                        "out-features", (gint64) 16,
                                                        "input-quantizer", q.input, NULL);
    g_assert_null (half);
    g_assert_error (e, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  }

  /* An FP8 input: without scales, a columnwise copy, or with no
   * quantizers on the layer. */
  plain = new_layer (device, 3, 32, 16, GMLP_DTYPE_BFLOAT16, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT, NULL);
  x8_plain = gmlp_grouped_tensor_convert (p->xt, GMLP_DTYPE_FLOAT8_E4M3, &error);
  dy8_plain = gmlp_grouped_tensor_convert (p->dyt, GMLP_DTYPE_FLOAT8_E5M2, &error);
  g_assert_no_error (error);
  gmlp_quantizer_set_columnwise (blockwise, TRUE);
  x8_blockwise = gmlp_quantizer_quantize (blockwise, p->xt, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_grouped_linear_set_quantizers (layer, q.input, q.weight, q.grad_output, &error));
  g_assert_no_error (error);
  g_assert_true (gmlp_device_synchronize (device, NULL));
  in_use = gmlp_device_get_bytes_in_use (device);

#define EXPECT_NULL(call, code) \
  G_STMT_START { \
    g_autoptr(GError) _e = NULL; \
    g_autoptr(GmlpSavedActivations) _s = NULL; \
    gpointer _r = (call); \
    g_assert_null (_r); \
    g_assert_error (_e, GMLP_ERROR, (code)); \
    g_assert_null (_s); \
    g_assert_cmpuint (gmlp_device_get_bytes_in_use (device), ==, in_use); \
  } G_STMT_END

  EXPECT_NULL (gmlp_grouped_linear_forward (layer, x8_plain, &_s, &_e), GMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_NULL (gmlp_grouped_linear_forward (layer, gmlp_grouped_tensor_get_columnwise (x8_blockwise), &_s, &_e),
               GMLP_ERROR_UNSUPPORTED);
  EXPECT_NULL (gmlp_grouped_linear_forward (layer, x8_blockwise, &_s, &_e), GMLP_ERROR_UNSUPPORTED);
  EXPECT_NULL (gmlp_grouped_linear_forward (plain, x8_blockwise, &_s, &_e), GMLP_ERROR_DTYPE_MISMATCH);
  EXPECT_NULL (gmlp_grouped_linear_forward (layer, p->dyt, &_s, &_e), GMLP_ERROR_SHAPE_MISMATCH);

  /* Backward: dy without scales; then the quantizers are gone. */
  y = gmlp_grouped_linear_forward (layer, p->xt, &saved, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_device_synchronize (device, NULL));
  in_use = gmlp_device_get_bytes_in_use (device);
  EXPECT_NULL (gmlp_grouped_linear_backward (layer, saved, dy8_plain, &_e), GMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_NULL (gmlp_grouped_linear_backward (layer, saved, p->xt, &_e), GMLP_ERROR_SHAPE_MISMATCH);
  g_assert_true (gmlp_grouped_linear_set_quantizers (layer, NULL, NULL, NULL, &error));
  g_assert_no_error (error);
  EXPECT_NULL (gmlp_grouped_linear_backward (layer, saved, p->dyt, &_e), GMLP_ERROR_INVALID_STATE);
  g_assert_false (gmlp_saved_activations_is_consumed (saved));
  g_assert_null (gmlp_grouped_linear_get_wgrad (layer));

  /* The same quantizers again: the backward goes through. */
  g_assert_true (gmlp_grouped_linear_set_quantizers (layer, q.input, q.weight, q.grad_output, &error));
  g_assert_no_error (error);
  {
    g_autoptr(GmlpGroupedTensor) dx = gmlp_grouped_linear_backward (layer, saved, p->dyt, &error);
    g_assert_no_error (error);
    g_assert_nonnull (dx);
  }
#undef EXPECT_NULL
#undef EXPECT_FALSE

  quantizers_clear (&q);
  quantizers_clear (&q5);
}

/* The construct properties, the getter, notifications and update. */
static void
test_properties (void)
{
  g_autoptr(GmlpDevice) device = device_or_skip ();
  g_autoptr(GmlpGroupedLinear) layer = NULL;
  g_autoptr(GmlpQuantizer) got = NULL;
  g_autoptr(GError) error = NULL;
  Quantizers q = { 0, };
  guint notified = 0;

  if (device == NULL)
    return;

  quantizers_new (&q, device, GMLP_SCALING_RECIPE_DELAYED, GMLP_FP8_FORMAT_HYBRID, 2);
  layer = g_initable_new (GMLP_TYPE_GROUPED_LINEAR, NULL, &error,
                          "device", device, "n-groups", 2,
                          "in-features", (gint64) 32, "out-features", (gint64) 16,
                          "dtype", GMLP_DTYPE_BFLOAT16,
                          "input-quantizer", q.input, "weight-quantizer", q.weight,
                          "grad-output-quantizer", q.grad_output, NULL);
  g_assert_no_error (error);
  g_assert_true (gmlp_grouped_linear_get_quantizer (layer, GMLP_QUANTIZER_ROLE_INPUT) == q.input);
  g_assert_true (gmlp_grouped_linear_get_quantizer (layer, GMLP_QUANTIZER_ROLE_WEIGHT) == q.weight);
  g_assert_true (gmlp_grouped_linear_get_quantizer (layer, GMLP_QUANTIZER_ROLE_GRAD_OUTPUT) == q.grad_output);
  g_object_get (layer, "weight-quantizer", &got, NULL);
  g_assert_true (got == q.weight);

  /* Nothing quantized yet: nothing to update. */
  g_assert_true (gmlp_grouped_linear_update_quantizers (layer, &error));
  g_assert_no_error (error);

  g_signal_connect (layer, "notify::input-quantizer", G_CALLBACK (gmlp_test_count_notify), &notified);
  g_signal_connect (layer, "notify::grad-output-quantizer", G_CALLBACK (gmlp_test_count_notify), &notified);
  g_assert_true (gmlp_grouped_linear_set_quantizers (layer, q.input, q.weight, q.grad_output, &error));
  g_assert_cmpuint (notified, ==, 0);
  g_assert_true (gmlp_grouped_linear_set_quantizers (layer, NULL, NULL, NULL, &error));
  g_assert_no_error (error);
  g_assert_cmpuint (notified, ==, 2);
  g_assert_null (gmlp_grouped_linear_get_quantizer (layer, GMLP_QUANTIZER_ROLE_WEIGHT));
  g_assert_true (gmlp_grouped_linear_update_quantizers (layer, &error));
  quantizers_clear (&q);
}

/* Where the backends find each group's members and scales in a GEMM
 * descriptor (gmlp-backend-gemm.h), with host sizes: at the members of
 * the tensors the layer describes by their bases, the quantizer's
 * rowwise and columnwise FP8 data and their scales (per-tensor and
 * blockwise), and the weights' members and scales by a stride. Sizes that
 * are empty, under a block, and not multiples of 16 or 128. */
static void
test_descriptor_layout (void)
{
  static const GmlpScalingRecipe recipes[] = { GMLP_SCALING_RECIPE_CURRENT, GMLP_SCALING_RECIPE_BLOCKWISE };
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  const gint64 rows[] = { 37, 0, 130, 16, 1 };
  const guint n = G_N_ELEMENTS (rows);
  const gint64 k = 272, o = 144;
  guint r;

  if (device == NULL)
    return;

  for (r = 0; r < G_N_ELEMENTS (recipes); r++)
    {
      gboolean blockwise = recipes[r] == GMLP_SCALING_RECIPE_BLOCKWISE;
      g_autoptr(GmlpQuantizer) qx = gmlp_quantizer_new (device, recipes[r], GMLP_FP8_FORMAT_E4M3,
                                                        GMLP_QUANTIZER_ROLE_INPUT);
      g_autoptr(GmlpQuantizer) qw = gmlp_quantizer_new (device, recipes[r], GMLP_FP8_FORMAT_E4M3,
                                                        GMLP_QUANTIZER_ROLE_WEIGHT);
      g_autoptr(GmlpGroupedTensor) x = gmlp_test_random_tensor (device, GMLP_DTYPE_BFLOAT16, rows, n,
                                                                k, 1.0, NULL);
      g_autoptr(GmlpGroupedTensor) w = NULL, x8 = NULL, w8 = NULL;
      g_autoptr(GError) error = NULL;
      GmlpGroupedTensor *x_t, *w_scales;
      gpointer members[G_N_ELEMENTS (rows)];
      const float *scales[G_N_ELEMENTS (rows)];
      GmlpBackendGemm gemm = { .n_groups = n, .n = o, .k = k, .rows = rows };
      guint g;

      w = gmlp_grouped_tensor_new_uniform (device, GMLP_DTYPE_BFLOAT16, n, o, k, &error);
      g_assert_no_error (error);
      g_assert_true (gmlp_grouped_tensor_fill_zero (w, &error));
      x8 = gmlp_quantizer_quantize_full (qx, x, TRUE, &error);
      g_assert_no_error (error);
      w8 = gmlp_quantizer_quantize_full (qw, w, TRUE, &error);
      g_assert_no_error (error);
      x_t = gmlp_grouped_tensor_get_columnwise (x8);
      g_assert_nonnull (x_t);
      w_scales = gmlp_grouped_tensor_get_scale_inv (w8);

      /* FPROP: x8 rowwise (1 × 128 blocks), W8 by a stride (128 × 128
       * tiles, or one scale per member). */
      gemm.kind = GMLP_GEMM_FPROP;
      gemm.a = (GmlpBackendOperand) {
        .layout = GMLP_BACKEND_OPERAND_ROWS,
        .dtype = (int) gmlp_grouped_tensor_get_dtype (x8),
        .base = gmlp_grouped_tensor_get_data (x8),
        .scales = { blockwise ? 1 : 0, blockwise ? (k + 127) / 128 : 0, blockwise ? 1 : 0 },
        .scale_inv = gmlp_grouped_tensor_get_data (gmlp_grouped_tensor_get_scale_inv (x8)),
        .scale_stride = (guint64) gmlp_grouped_tensor_get_member_offset (gmlp_grouped_tensor_get_scale_inv (x8), 1),
      };
      gemm.b = (GmlpBackendOperand) {
        .layout = GMLP_BACKEND_OPERAND_STRIDED,
        .dtype = (int) gmlp_grouped_tensor_get_dtype (w8),
        .base = gmlp_grouped_tensor_get_data (w8),
        .stride = (guint64) gmlp_grouped_tensor_get_member_offset (w8, 1),
        .scale_inv = gmlp_grouped_tensor_get_data (w_scales),
        .scale_stride = (guint64) gmlp_grouped_tensor_get_member_offset (w_scales, 1),
      };
      gmlp_backend_gemm_members (&gemm, &gemm.a, members);
      for (g = 0; g < n; g++)
        g_assert_true (members[g] == gmlp_grouped_tensor_get_member_data (x8, g));
      gmlp_backend_gemm_scale_members (&gemm, &gemm.a, scales);
      for (g = 0; g < n; g++)
        g_assert_true (scales[g] == gmlp_grouped_tensor_get_member_data (gmlp_grouped_tensor_get_scale_inv (x8), g));
      gmlp_backend_gemm_members (&gemm, &gemm.b, members);
      gmlp_backend_gemm_scale_members (&gemm, &gemm.b, scales);
      for (g = 0; g < n; g++)
        {
          g_assert_true (members[g] == gmlp_grouped_tensor_get_member_data (w8, g));
          g_assert_true (scales[g] == gmlp_grouped_tensor_get_member_data (w_scales, g));
        }

      /* WGRAD: the columnwise copy as b (128 × 1 blocks down the tokens). */
      gemm.kind = GMLP_GEMM_WGRAD;
      gemm.b = (GmlpBackendOperand) {
        .layout = GMLP_BACKEND_OPERAND_ROWS,
        .dtype = (int) gmlp_grouped_tensor_get_dtype (x_t),
        .base = gmlp_grouped_tensor_get_data (x_t),
        .scales = { blockwise ? 1 : 0, blockwise ? 1 : 0, blockwise ? k : 0 },
        .scale_inv = gmlp_grouped_tensor_get_data (gmlp_grouped_tensor_get_scale_inv (x_t)),
        .scale_stride = (guint64) gmlp_grouped_tensor_get_member_offset (gmlp_grouped_tensor_get_scale_inv (x_t), 1),
      };
      gmlp_backend_gemm_members (&gemm, &gemm.b, members);
      gmlp_backend_gemm_scale_members (&gemm, &gemm.b, scales);
      for (g = 0; g < n; g++)
        {
          g_assert_true (members[g] == gmlp_grouped_tensor_get_member_data (x_t, g));
          g_assert_true (scales[g] == gmlp_grouped_tensor_get_member_data (gmlp_grouped_tensor_get_scale_inv (x_t), g));
        }
    }
}

int
main (int argc, char *argv[])
{
  setlocale (LC_ALL, "");
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Gmlp/GroupedLinear/fp8/recipes", test_recipes);
  g_test_add_func ("/Gmlp/GroupedLinear/fp8/shapes", test_shapes);
  g_test_add_func ("/Gmlp/GroupedLinear/fp8/tiles", test_tiles);
  g_test_add_func ("/Gmlp/GroupedLinear/fp8/weight-cache", test_weight_cache);
  g_test_add_func ("/Gmlp/GroupedLinear/fp8/delayed-steps", test_delayed_steps);
  g_test_add_func ("/Gmlp/GroupedLinear/fp8/mixed-per-tensor", test_mixed_per_tensor);
  g_test_add_func ("/Gmlp/GroupedLinear/fp8/prequantized", test_prequantized);
  g_test_add_func ("/Gmlp/GroupedLinear/fp8/device-sizes", test_device_sizes);
  g_test_add_func ("/Gmlp/GroupedLinear/fp8/long-reduction", test_long_reduction);
  g_test_add_func ("/Gmlp/GroupedLinear/fp8/offload", test_offload);
  g_test_add_func ("/Gmlp/GroupedLinear/fp8/offload-parts", test_offload_parts);
  g_test_add_func ("/Gmlp/GroupedLinear/fp8/bad-input", test_bad_input);
  g_test_add_func ("/Gmlp/GroupedLinear/fp8/properties", test_properties);
  g_test_add_func ("/Gmlp/GroupedLinear/fp8/descriptor-layout", test_descriptor_layout);

  return g_test_run ();
}
