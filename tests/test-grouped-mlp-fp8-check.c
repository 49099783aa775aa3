/* test-grouped-mlp-fp8-check.c: the checks of the fused activation + quantization
 *
 * The recipes and their bounds, the activation's derivative, quantized
 * tensors and quantizer states compared byte for byte, and the fused pass
 * checked against the activation followed by the quantizer.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "test-grouped-mlp-fp8.h"

const double *
bounds_for (GmlpScalingRecipe recipe, GmlpActivation act)
{
  return bounds[recipe - 1][act == GMLP_ACTIVATION_RELU];
}

gboolean
gated (GmlpActivation act)
{
  return act == GMLP_ACTIVATION_SWIGLU || act == GMLP_ACTIVATION_GEGLU;
}

/* ---- float64 models -------------------------------------------------------- */

/* The derivatives of the activations (gmlp_test_act()) in closed form. */
double
act_df (GmlpActivation act, double x)
{
  switch (act)
    {
    case GMLP_ACTIVATION_GELU:
    case GMLP_ACTIVATION_GEGLU:
      {
        double k = sqrt (2.0 / G_PI), t = tanh (k * (x + 0.044715 * x * x * x));
        return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
      }
    case GMLP_ACTIVATION_SWIGLU:
      {
        double s = 1.0 / (1.0 + exp (-x));
        return s * (1 + x * (1 - s));
      }
    case GMLP_ACTIVATION_RELU:
      return x > 0 ? 1 : 0;
    case GMLP_ACTIVATION_SRELU:
      return x > 0 ? 2 * x : 0;
    default:
      g_assert_not_reached ();
    }
}

/* ---- Comparing quantized tensors ----------------------------------------- */

/* Two quantized tensors are the same: recipe, blocks, FP8 values, scales,
 * and the columnwise copies with their scales. */
void
assert_same_quantized (GmlpGroupedTensor *a, GmlpGroupedTensor *b, const char *what)
{
  static const char *const part_names[] = { "data", "scales", "columnwise copy", "columnwise scales" };
  GmlpGroupedTensor *ca = gmlp_grouped_tensor_get_columnwise (a);
  GmlpGroupedTensor *cb = gmlp_grouped_tensor_get_columnwise (b);
  GmlpGroupedTensor *parts_a[] = { a, gmlp_grouped_tensor_get_scale_inv (a), ca, NULL };
  GmlpGroupedTensor *parts_b[] = { b, gmlp_grouped_tensor_get_scale_inv (b), cb, NULL };
  gint64 br[2], bc[2];
  guint i;

  g_assert_cmpint (gmlp_grouped_tensor_get_scaling_recipe (a), ==, gmlp_grouped_tensor_get_scaling_recipe (b));
  g_assert_true (gmlp_grouped_tensor_get_scale_block (a, &br[0], &bc[0]));
  g_assert_true (gmlp_grouped_tensor_get_scale_block (b, &br[1], &bc[1]));
  g_assert_cmpint (br[0], ==, br[1]);
  g_assert_cmpint (bc[0], ==, bc[1]);
  g_assert_true ((ca == NULL) == (cb == NULL));
  if (ca != NULL)
    {
      g_assert_true (gmlp_grouped_tensor_is_columnwise (ca));
      g_assert_true (gmlp_grouped_tensor_is_columnwise (cb));
      parts_a[3] = gmlp_grouped_tensor_get_scale_inv (ca);
      parts_b[3] = gmlp_grouped_tensor_get_scale_inv (cb);
    }
  for (i = 0; i < (ca != NULL ? 4u : 2u); i++)
    {
      g_autofree char *name = g_strdup_printf ("%s: %s", what, part_names[i]);
      gmlp_test_assert_same_bytes (parts_a[i], parts_b[i], name);
    }
}

void
assert_same_state (GmlpQuantizer *a, GmlpQuantizer *b, const char *what)
{
  g_autoptr(GVariant) x = gmlp_quantizer_save_state (a, NULL);
  g_autoptr(GVariant) y = gmlp_quantizer_save_state (b, NULL);

  g_assert_nonnull (x);
  g_assert_nonnull (y);
  if (!g_variant_equal (x, y))
    {
      g_autofree char *px = g_variant_print (x, FALSE), *py = g_variant_print (y, FALSE);
      g_error ("%s: the quantizer states differ:\n%s\n%s", what, px, py);
    }
}

/* A quantizer for FC2's input. Delayed scaling gets a scale other than 1
 * first: it quantizes a tensor of its own, of amplitude amax_source, and
 * updates. */
GmlpQuantizer *
new_input_quantizer (GmlpDevice *device, GmlpScalingRecipe recipe, GmlpFp8Format format,
                     gboolean pow2, guint n_groups, double amax_source)
{
  GmlpQuantizer *q = g_object_new (GMLP_TYPE_QUANTIZER, "device", device, "recipe", recipe,
                                   "fp8-format", format, "role", GMLP_QUANTIZER_ROLE_INPUT,
                                   "amax-history-length", 4, "power-of-2-scales", pow2, NULL);

  if (recipe == GMLP_SCALING_RECIPE_DELAYED)
    {
      g_autofree gint64 *rows = g_new (gint64, n_groups);
      g_autoptr(GmlpGroupedTensor) t = NULL, t8 = NULL;
      g_autoptr(GError) error = NULL;
      guint g;

      for (g = 0; g < n_groups; g++)
        rows[g] = 5;
      t = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, rows, n_groups, 7, amax_source, NULL);
      t8 = gmlp_quantizer_quantize (q, t, &error);
      g_assert_no_error (error);
      g_assert_true (gmlp_quantizer_update (q, &error));
      g_assert_no_error (error);
    }
  return q;
}

/* ---- The fused pass ------------------------------------------------------ */

/* Whether a delayed-scaling quantizer's scales put some value of the
 * activation av (packed, ffn columns) beyond the FP8 range. */
static gboolean
saturates (GmlpQuantizer *q, const gint64 *rows, guint n, const double *av, gint64 ffn)
{
  double fp8_max = gmlp_quantizer_get_dtype (q) == GMLP_DTYPE_FLOAT8_E5M2 ? 57344.0 : 448.0;
  g_autoptr(GVariant) state = gmlp_quantizer_save_state (q, NULL);
  g_autoptr(GVariant) scales = g_variant_lookup_value (state, "scale", G_VARIANT_TYPE ("ad"));
  const double *scale;
  gsize n_scales, i = 0;
  guint g;

  scale = g_variant_get_fixed_array (scales, &n_scales, sizeof (double));
  g_assert_cmpuint (n_scales, ==, n);
  for (g = 0; g < n; g++)
    {
      gsize end = i + (gsize) (rows[g] * ffn);

      for (; i < end; i++)
        if (fabs (av[i]) * scale[g] > fp8_max)
          return TRUE;
    }
  return FALSE;
}

/* One case: fused against the activation followed by the quantizer, and
 * both against float64. */
void
check_fused (GmlpDevice *device, GmlpActivation act, GmlpDType dtype, GmlpScalingRecipe recipe,
             GmlpFp8Format format, gboolean columnwise, guint n, gint64 ffn)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedMLP) mlp = gmlp_grouped_mlp_new_full (device, n, 16, ffn, act, dtype,
                                                             GMLP_LINEAR_SINGLE_GROUPED_WEIGHT, &error);
  g_autofree gint64 *rows = gmlp_test_random_rows (n, 150);
  gint64 in_cols = gated (act) ? 2 * ffn : ffn, total = 0, r, c;
  double amplitude = g_test_rand_double_range (0.3, 6.0);
  gboolean pow2 = g_test_rand_bit ();
  g_autoptr(GmlpQuantizer) fused_q = NULL, plain_q = NULL;
  g_autoptr(GmlpGroupedTensor) h = NULL, a = NULL, fused = NULL, plain = NULL;
  g_autofree double *hv = NULL, *av = NULL, *want = NULL, *deq = NULL;
  g_autofree char *what = g_strdup_printf ("%s %s %s %s%s", activation_names[act], gmlp_dtype_get_name (dtype),
                                           gmlp_test_recipe_name (recipe),
                                           format == GMLP_FP8_FORMAT_E5M2 ? "e5m2" : "e4m3",
                                           columnwise ? " columnwise" : "");
  double err;
  guint g;

  g_assert_no_error (error);
  for (g = 0; g < n; g++)
    total += rows[g];
  /* Delayed scaling: with the copy, a stale scale, from a source smaller
   * than the activation (some values saturate); without, one with room. */
  fused_q = new_input_quantizer (device, recipe, format, pow2, n,
                                 columnwise ? amplitude * 0.5 : 10 * amplitude * amplitude + 2 * amplitude);
  plain_q = gmlp_test_copy_quantizer (device, fused_q);

  h = gmlp_test_random_tensor (device, dtype, rows, n, in_cols, amplitude, &hv);
  fused = gmlp_grouped_mlp_run_activation_quantize (mlp, h, fused_q, columnwise, &error);
  g_assert_no_error (error);
  a = gmlp_grouped_mlp_run_activation (mlp, h, &error);
  g_assert_no_error (error);
  plain = gmlp_quantizer_quantize_full (plain_q, a, columnwise, &error);
  g_assert_no_error (error);

  g_assert_cmpint (gmlp_grouped_tensor_get_dtype (fused), ==, gmlp_quantizer_get_dtype (fused_q));
  g_assert_cmpint (gmlp_grouped_tensor_get_cols (fused), ==, ffn);
  assert_same_quantized (fused, plain, what);
  if (recipe == GMLP_SCALING_RECIPE_DELAYED)
    assert_same_state (fused_q, plain_q, what);

  /* float64: the activation, rounded to the dtype; the FP8 values within
   * the format's relative precision (3 or 2 mantissa bits, with room for
   * the smallest values and, for delayed scaling, saturation). */
  want = g_new (double, MAX (total * ffn, 1));
  for (r = 0; r < total; r++)
    for (c = 0; c < ffn; c++)
      {
        double v = gmlp_test_act (act, hv[r * in_cols + c]);
        if (gated (act))
          v *= hv[r * in_cols + ffn + c];
        want[r * ffn + c] = v;
      }
  av = gmlp_test_download (a, NULL);
  err = gmlp_test_relative_error (av, want, total * ffn, what);
  if (!(err <= (dtype == GMLP_DTYPE_FLOAT32 ? 1e-6 : dtype == GMLP_DTYPE_FLOAT16 ? 1e-3 : 5e-3)))
    g_error ("%s: the activation's relative error is %.3g", what, err);
  if (recipe == GMLP_SCALING_RECIPE_DELAYED && saturates (plain_q, rows, n, av, ffn))
    {
      g_test_message ("%s: the stale delayed scale saturates (bytes compared only)", what);
      return;
    }
  deq = gmlp_test_dequantize (fused);
  err = gmlp_test_relative_error (deq, av, total * ffn, what);
  if (!(err <= (format == GMLP_FP8_FORMAT_E5M2 ? 0.12 : 0.06) +
               (recipe == GMLP_SCALING_RECIPE_MXFP8 ? 0.02 : 0.0)))
    g_error ("%s: the FP8 values' relative error is %.3g", what, err);
}
