/* test-grouped-mlp-fp8-calls.c: the FP8 MLP's other calls
 *
 * Bad input, properties, and the weight cache of both layers.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "test-grouped-mlp-fp8.h"

void
test_bad_input (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpGroupedMLP) mlp = NULL, odd = NULL, wrong = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, x32 = NULL, y = NULL, dy = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GmlpQuantizer) other_groups = NULL;
  g_autoptr(GVariant) before = NULL, after = NULL;
  g_autoptr(GError) error = NULL;
  gint64 rows[] = { 3, 0, 5 };
  gint64 rows2[] = { 4, 4 };

  if (device == NULL)
    return;

  /* Unknown recipe or format. */
  mlp = gmlp_grouped_mlp_new_full (device, 3, 32, 32, GMLP_ACTIVATION_GELU, GMLP_DTYPE_BFLOAT16,
                                   GMLP_LINEAR_SINGLE_GROUPED_WEIGHT, &error);
  g_assert_no_error (error);
  g_assert_false (gmlp_grouped_mlp_set_fp8_recipe (mlp, (GmlpScalingRecipe) 9, GMLP_FP8_FORMAT_HYBRID, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);
  g_assert_false (gmlp_grouped_mlp_set_fp8_recipe (mlp, GMLP_SCALING_RECIPE_DELAYED, (GmlpFp8Format) 7, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);

  /* E5M2 everywhere: a per-tensor product of two E5M2 operands; neither
   * layer changes. */
  g_assert_false (gmlp_grouped_mlp_set_fp8_recipe (mlp, GMLP_SCALING_RECIPE_CURRENT, GMLP_FP8_FORMAT_E5M2, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED);
  g_clear_error (&error);
  g_assert_null (gmlp_grouped_linear_get_quantizer (gmlp_grouped_mlp_get_fc1 (mlp), GMLP_QUANTIZER_ROLE_INPUT));
  g_assert_null (gmlp_grouped_linear_get_quantizer (gmlp_grouped_mlp_get_fc2 (mlp), GMLP_QUANTIZER_ROLE_INPUT));
  g_assert_cmpint (gmlp_grouped_mlp_get_fp8_recipe (mlp), ==, GMLP_SCALING_RECIPE_NONE);

  /* Per-tensor recipes need multiples of 16: with SwiGLU and ffn_hidden 24,
   * FC1 (32 → 48) takes its quantizers, FC2 (24 → 32) refuses them, and
   * FC1 gets its old ones back. Blockwise has no such rule. */
  odd = gmlp_grouped_mlp_new_full (device, 3, 32, 24, GMLP_ACTIVATION_SWIGLU, GMLP_DTYPE_BFLOAT16,
                                   GMLP_LINEAR_SINGLE_GROUPED_WEIGHT, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_grouped_mlp_set_fp8_recipe (odd, GMLP_SCALING_RECIPE_BLOCKWISE, GMLP_FP8_FORMAT_HYBRID, &error));
  g_assert_no_error (error);
  {
    GmlpQuantizer *kept = gmlp_grouped_linear_get_quantizer (gmlp_grouped_mlp_get_fc1 (odd), GMLP_QUANTIZER_ROLE_INPUT);

    g_assert_false (gmlp_grouped_mlp_set_fp8_recipe (odd, GMLP_SCALING_RECIPE_DELAYED, GMLP_FP8_FORMAT_HYBRID, &error));
    g_assert_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED);
    g_clear_error (&error);
    g_assert_true (gmlp_grouped_linear_get_quantizer (gmlp_grouped_mlp_get_fc1 (odd), GMLP_QUANTIZER_ROLE_INPUT) == kept);
    g_assert_cmpint (gmlp_quantizer_get_recipe (gmlp_grouped_linear_get_quantizer (gmlp_grouped_mlp_get_fc2 (odd),
                                                                                   GMLP_QUANTIZER_ROLE_WEIGHT)),
                     ==, GMLP_SCALING_RECIPE_BLOCKWISE);
    g_assert_cmpint (gmlp_grouped_mlp_get_fp8_recipe (odd), ==, GMLP_SCALING_RECIPE_BLOCKWISE);
  }
  /* The same at construction. */
  g_assert_null (g_initable_new (GMLP_TYPE_GROUPED_MLP, NULL, &error, "device", device, "n-groups", 3,
                                 "hidden", 24, "ffn-hidden", 32, "fp8-recipe", GMLP_SCALING_RECIPE_CURRENT, NULL));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED);
  g_clear_error (&error);

  /* An input of another dtype; nothing is saved, no scale moves. */
  g_assert_true (gmlp_grouped_mlp_set_fp8_recipe (mlp, GMLP_SCALING_RECIPE_DELAYED, GMLP_FP8_FORMAT_HYBRID, &error));
  g_assert_no_error (error);
  x32 = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, rows, 3, 32, 1.0, NULL);
  g_assert_null (gmlp_grouped_mlp_forward (mlp, x32, &saved, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_DTYPE_MISMATCH);
  g_assert_null (saved);
  g_clear_error (&error);

  /* FC2's input quantizer keeps delayed scales for another number of
   * groups: refused before FC1 runs (FC1's input quantizer records
   * nothing). */
  wrong = gmlp_grouped_mlp_new_full (device, 3, 32, 32, GMLP_ACTIVATION_GELU, GMLP_DTYPE_BFLOAT16,
                                     GMLP_LINEAR_SINGLE_GROUPED_WEIGHT, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_grouped_mlp_set_fp8_recipe (wrong, GMLP_SCALING_RECIPE_DELAYED, GMLP_FP8_FORMAT_HYBRID, &error));
  other_groups = gmlp_quantizer_new (device, GMLP_SCALING_RECIPE_DELAYED, GMLP_FP8_FORMAT_HYBRID,
                                     GMLP_QUANTIZER_ROLE_INPUT);
  {
    g_autoptr(GmlpGroupedTensor) t = gmlp_test_random_tensor (device, GMLP_DTYPE_BFLOAT16, rows2, 2, 32, 1.0, NULL);
    g_autoptr(GmlpGroupedTensor) t8 = gmlp_quantizer_quantize (other_groups, t, &error);
    GmlpGroupedLinear *fc2 = gmlp_grouped_mlp_get_fc2 (wrong);

    g_assert_no_error (error);
    g_assert_true (gmlp_grouped_linear_set_quantizers (fc2, other_groups,
                                                       gmlp_grouped_linear_get_quantizer (fc2, GMLP_QUANTIZER_ROLE_WEIGHT),
                                                       gmlp_grouped_linear_get_quantizer (fc2, GMLP_QUANTIZER_ROLE_GRAD_OUTPUT),
                                                       &error));
    g_assert_no_error (error);
  }
  x = gmlp_test_random_tensor (device, GMLP_DTYPE_BFLOAT16, rows, 3, 32, 1.0, NULL);
  before = gmlp_quantizer_save_state (gmlp_grouped_linear_get_quantizer (gmlp_grouped_mlp_get_fc1 (wrong),
                                                                         GMLP_QUANTIZER_ROLE_INPUT), NULL);
  g_assert_null (gmlp_grouped_mlp_forward (wrong, x, &saved, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH);
  g_clear_error (&error);
  after = gmlp_quantizer_save_state (gmlp_grouped_linear_get_quantizer (gmlp_grouped_mlp_get_fc1 (wrong),
                                                                        GMLP_QUANTIZER_ROLE_INPUT), NULL);
  g_assert_true (g_variant_equal (before, after));

  /* The fused pass takes FC1's output only. */
  g_assert_null (gmlp_grouped_mlp_run_activation_quantize (mlp, x, other_groups, FALSE, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH);
  g_clear_error (&error);

  /* An FP8 forward, then FP8 taken away: the backward still needs FC2's
   * output-gradient quantizer (GroupedLinear's rule). */
  y = gmlp_grouped_mlp_forward (mlp, x, &saved, &error);
  g_assert_no_error (error);
  dy = gmlp_test_random_tensor (device, GMLP_DTYPE_BFLOAT16, rows, 3, 32, 1.0, NULL);
  g_assert_true (gmlp_grouped_mlp_set_fp8_recipe (mlp, GMLP_SCALING_RECIPE_NONE, GMLP_FP8_FORMAT_HYBRID, &error));
  g_assert_null (gmlp_grouped_mlp_backward (mlp, saved, dy, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
  g_clear_error (&error);
  g_assert_false (gmlp_saved_activations_is_consumed (saved));
}

/* fp8-recipe and fp8-format: construct properties, the quantizers they
 * make, notifications, NONE. */
void
test_properties (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpGroupedMLP) mlp = NULL;
  g_autoptr(GError) error = NULL;
  GmlpScalingRecipe recipe;
  GmlpFp8Format format;
  guint notified = 0, l, role;

  if (device == NULL)
    return;

  mlp = g_initable_new (GMLP_TYPE_GROUPED_MLP, NULL, &error, "device", device, "n-groups", 2,
                        "hidden", 32, "ffn-hidden", 16, "activation", GMLP_ACTIVATION_SWIGLU,
                        "fp8-recipe", GMLP_SCALING_RECIPE_MXFP8, "fp8-format", GMLP_FP8_FORMAT_E4M3, NULL);
  g_assert_no_error (error);
  g_object_get (mlp, "fp8-recipe", &recipe, "fp8-format", &format, NULL);
  g_assert_cmpint (recipe, ==, GMLP_SCALING_RECIPE_MXFP8);
  g_assert_cmpint (format, ==, GMLP_FP8_FORMAT_E4M3);
  for (l = 0; l < 2; l++)
    for (role = 0; role < 3; role++)
      {
        GmlpGroupedLinear *fc = l == 0 ? gmlp_grouped_mlp_get_fc1 (mlp) : gmlp_grouped_mlp_get_fc2 (mlp);
        GmlpQuantizer *q = gmlp_grouped_linear_get_quantizer (fc, (GmlpQuantizerRole) role);

        g_assert_nonnull (q);
        g_assert_cmpint (gmlp_quantizer_get_recipe (q), ==, GMLP_SCALING_RECIPE_MXFP8);
        g_assert_cmpint (gmlp_quantizer_get_fp8_format (q), ==, GMLP_FP8_FORMAT_E4M3);
        g_assert_cmpint (gmlp_quantizer_get_role (q), ==, role);
      }
  /* Six quantizers, none shared between the layers. */
  g_assert_true (gmlp_grouped_linear_get_quantizer (gmlp_grouped_mlp_get_fc1 (mlp), GMLP_QUANTIZER_ROLE_INPUT) !=
                 gmlp_grouped_linear_get_quantizer (gmlp_grouped_mlp_get_fc2 (mlp), GMLP_QUANTIZER_ROLE_INPUT));

  g_signal_connect (mlp, "notify::fp8-recipe", G_CALLBACK (gmlp_test_count_notify), &notified);
  g_signal_connect (mlp, "notify::fp8-format", G_CALLBACK (gmlp_test_count_notify), &notified);
  /* The same again: nothing changes, nothing is notified. */
  g_assert_true (gmlp_grouped_mlp_set_fp8_recipe (mlp, GMLP_SCALING_RECIPE_MXFP8, GMLP_FP8_FORMAT_E4M3, &error));
  g_assert_no_error (error);
  g_assert_cmpuint (notified, ==, 0);

  g_assert_true (gmlp_grouped_mlp_set_fp8_recipe (mlp, GMLP_SCALING_RECIPE_NONE, GMLP_FP8_FORMAT_HYBRID, &error));
  g_assert_no_error (error);
  g_assert_cmpuint (notified, ==, 2);
  g_assert_cmpint (gmlp_grouped_mlp_get_fp8_recipe (mlp), ==, GMLP_SCALING_RECIPE_NONE);
  g_assert_cmpint (gmlp_grouped_mlp_get_fp8_format (mlp), ==, GMLP_FP8_FORMAT_HYBRID);
  g_assert_null (gmlp_grouped_linear_get_quantizer (gmlp_grouped_mlp_get_fc2 (mlp), GMLP_QUANTIZER_ROLE_WEIGHT));
  g_assert_true (gmlp_grouped_mlp_update_quantizers (mlp, &error));
  g_assert_no_error (error);
}

/* A forward of @mlp on @x, without saved activations: y as bytes and, when
 * @values is given, decoded. */
static GBytes *
forward_bytes (GmlpGroupedMLP *mlp, GmlpGroupedTensor *x, double **values)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedTensor) y = gmlp_grouped_mlp_forward (mlp, x, NULL, &error);
  GBytes *bytes;

  g_assert_no_error (error);
  bytes = gmlp_grouped_tensor_to_bytes (y, &error);
  g_assert_no_error (error);
  if (values != NULL)
    *values = gmlp_test_download (y, NULL);
  return bytes;
}

/* Changes the weights of both layers in place, as an optimizer step does:
 * the layers are not told. */
static void
change_weights_in_place (GmlpGroupedMLP *mlp)
{
  g_autoptr(GError) error = NULL;
  guint l;

  for (l = 0; l < 2; l++)
    {
      GmlpGroupedLinear *fc = l == 0 ? gmlp_grouped_mlp_get_fc1 (mlp) : gmlp_grouped_mlp_get_fc2 (mlp);
      double bound = 1.0 / sqrt ((double) gmlp_grouped_linear_get_in_features (fc));

      g_assert_true (gmlp_grouped_tensor_fill_random (gmlp_grouped_linear_get_weight (fc),
                                                      g_test_rand_int (), bound, &error));
      g_assert_no_error (error);
    }
}

/* y of the cached MLP: the bytes of the uncached MLP with the same
 * parameters (the cache changes no bit), within the recipe's bound of
 * float64 (delayed scaling: scale 1, never updated here, as in the first
 * step of delayed-steps). */
static void
check_against_uncached (GmlpGroupedMLP *mlp, GmlpGroupedMLP *plain, GmlpScalingRecipe recipe,
                        const char *what)
{
  static const gint64 rows[] = { 29, 0, 70 };
  g_autoptr(Problem) p = problem_new (mlp, rows, 1.0);
  g_autoptr(GBytes) y = NULL, y_plain = NULL;
  g_autofree double *yv = NULL;
  double bound = bounds_for (recipe, p->act)[0] + (recipe == GMLP_SCALING_RECIPE_DELAYED ? 0.02 : 0.0);
  Outputs exact = { 0, };
  double err;

  copy_parameters (mlp, plain);
  y = forward_bytes (mlp, p->xt, &yv);
  y_plain = forward_bytes (plain, p->xt, NULL);
  if (!g_bytes_equal (y, y_plain))
    g_error ("%s: y differs from the uncached MLP's", what);
  reference (p, &exact);
  err = gmlp_test_relative_error (yv, exact.y, p->total * p->hid, what);
  if (!(err <= bound))
    g_error ("%s: y relative error %.4f from float64, beyond %.4f", what, err, bound);
  outputs_clear (&exact);
}

/* cache-fp8-weights, every recipe: two forwards give the same bits, those
 * of the uncached MLP; after an in-place change of the weights the cache
 * still gives the old output, and after invalidate_fp8_weights the new
 * weights' (uncached MLP, float64); cleared, an in-place change shows at
 * once. The property: default, round trip, notify once per change, both
 * layers, a value given at construction (before the layers exist). */
void
test_weight_cache (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GError) error = NULL;
  gint64 rows[] = { 45, 0, 17 };
  guint r;

  if (device == NULL)
    return;

  for (r = 0; r < G_N_ELEMENTS (all_recipes); r++)
    {
      GmlpScalingRecipe recipe = all_recipes[r];
      g_autoptr(GmlpGroupedMLP) mlp = new_mlp (device, 3, 32, 48, GMLP_ACTIVATION_SWIGLU, recipe, 0);
      g_autoptr(GmlpGroupedMLP) plain = new_mlp (device, 3, 32, 48, GMLP_ACTIVATION_SWIGLU, recipe, 0);
      GmlpGroupedLinear *fc1 = gmlp_grouped_mlp_get_fc1 (mlp), *fc2 = gmlp_grouped_mlp_get_fc2 (mlp);
      g_autoptr(GmlpGroupedTensor) x = gmlp_test_random_tensor (device, GMLP_DTYPE_BFLOAT16, rows, 3, 32, 1.0, NULL);
      g_autoptr(GBytes) y1 = NULL, y2 = NULL, stale = NULL, fresh = NULL;
      g_autofree char *what = g_strdup_printf ("weight cache, %s", gmlp_test_recipe_name (recipe));
      gboolean cache = TRUE;
      guint notified = 0;

      /* The property. */
      g_assert_false (gmlp_grouped_mlp_get_cache_fp8_weights (mlp));
      g_assert_false (gmlp_grouped_linear_get_cache_fp8_weights (fc1));
      g_signal_connect (mlp, "notify::cache-fp8-weights", G_CALLBACK (gmlp_test_count_notify), &notified);
      g_object_set (mlp, "cache-fp8-weights", TRUE, NULL);
      g_assert_cmpuint (notified, ==, 1);
      g_object_get (mlp, "cache-fp8-weights", &cache, NULL);
      g_assert_true (cache);
      g_assert_true (gmlp_grouped_mlp_get_cache_fp8_weights (mlp));
      g_assert_true (gmlp_grouped_linear_get_cache_fp8_weights (fc1));
      g_assert_true (gmlp_grouped_linear_get_cache_fp8_weights (fc2));
      /* Unchanged: no notification, but a layer set apart is set again. */
      gmlp_grouped_linear_set_cache_fp8_weights (fc2, FALSE);
      g_assert_true (gmlp_grouped_mlp_get_cache_fp8_weights (mlp));
      gmlp_grouped_mlp_set_cache_fp8_weights (mlp, TRUE);
      g_assert_cmpuint (notified, ==, 1);
      g_assert_true (gmlp_grouped_linear_get_cache_fp8_weights (fc2));

      /* Two forwards: the same bits; those of the uncached MLP. */
      g_assert_true (gmlp_grouped_mlp_init_parameters (mlp, g_test_rand_int (), &error));
      g_assert_no_error (error);
      y1 = forward_bytes (mlp, x, NULL);
      y2 = forward_bytes (mlp, x, NULL);
      if (!g_bytes_equal (y1, y2))
        g_error ("%s: the second forward differs", what);
      check_against_uncached (mlp, plain, recipe, what);

      /* Weights changed in place: the cache still holds the old ones... */
      change_weights_in_place (mlp);
      stale = forward_bytes (mlp, x, NULL);
      if (!g_bytes_equal (y1, stale))
        g_error ("%s: the forward after an in-place change does not use the cache", what);
      /* ...until invalidated: then the new weights, in both layers. */
      gmlp_grouped_mlp_invalidate_fp8_weights (mlp);
      fresh = forward_bytes (mlp, x, NULL);
      g_assert_false (g_bytes_equal (y1, fresh));
      check_against_uncached (mlp, plain, recipe, what);

      /* Cleared: both layers, and an in-place change shows at once. */
      gmlp_grouped_mlp_set_cache_fp8_weights (mlp, FALSE);
      g_assert_cmpuint (notified, ==, 2);
      g_assert_false (gmlp_grouped_mlp_get_cache_fp8_weights (mlp));
      g_assert_false (gmlp_grouped_linear_get_cache_fp8_weights (fc1));
      g_assert_false (gmlp_grouped_linear_get_cache_fp8_weights (fc2));
      change_weights_in_place (mlp);
      check_against_uncached (mlp, plain, recipe, what);
    }

  /* At construction, before the layers exist; a new recipe keeps it. */
  {
    g_autoptr(GmlpGroupedMLP) mlp = g_initable_new (GMLP_TYPE_GROUPED_MLP, NULL, &error, "device", device,
                                                    "n-groups", 2, "hidden", 32, "ffn-hidden", 16,
                                                    "cache-fp8-weights", TRUE, NULL);

    g_assert_no_error (error);
    g_assert_true (gmlp_grouped_mlp_get_cache_fp8_weights (mlp));
    g_assert_true (gmlp_grouped_linear_get_cache_fp8_weights (gmlp_grouped_mlp_get_fc1 (mlp)));
    g_assert_true (gmlp_grouped_linear_get_cache_fp8_weights (gmlp_grouped_mlp_get_fc2 (mlp)));
    g_assert_true (gmlp_grouped_mlp_set_fp8_recipe (mlp, GMLP_SCALING_RECIPE_CURRENT, GMLP_FP8_FORMAT_HYBRID, &error));
    g_assert_no_error (error);
    g_assert_true (gmlp_grouped_linear_get_cache_fp8_weights (gmlp_grouped_mlp_get_fc1 (mlp)));
    g_assert_true (gmlp_grouped_linear_get_cache_fp8_weights (gmlp_grouped_mlp_get_fc2 (mlp)));
  }
}
