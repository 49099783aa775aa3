/* test-moe-layer-fp8.c: GmlpMoELayer with FP8 recipes
 *
 * A layer step (forward and backward) with each recipe, FP32 and BF16
 * layers, with and without padding and a shared expert, against a float64
 * reference of the dense formulation in which the experts' operands are
 * quantized as the library quantizes them. The routing is Mixtral's (the
 * softmax over every expert, the top-k renormalized) and stays FP32; the
 * tokens are drawn until every token's choices are clear by a margin, so
 * that the library's FP32 routing equals the float64 one. The reference
 * permutes the tokens expert by expert as the layer does (padding rows
 * included: with expert biases FC1 turns them into rows of act(b1), which
 * FC2's input quantizer sees), and runs each MLP group by group: x, W1,
 * the activation, W2, and the output gradients of FC2 and FC1 are
 * quantized by copies of the layer's own quantizers (their settings and
 * state, so the same bytes; delayed scaling after an update too) and
 * decoded independently of the library (gmlp_test_dequantize()); products
 * in float64, the intermediates rounded to the layer's dtype as it stores
 * them; the weight gradients from the operands the layer's weight
 * gradients read (the columnwise copies where blockwise multiplies FP8
 * there, the operands dequantized to BF16 where the layer multiplies
 * those). The bias gradients come from the unquantized gradients.
 *
 * What is left is the FP32 sums and the rare element that the layer and
 * the reference, whose FP32 and float64 intermediates differ in the last
 * bits, quantize one FP8 step apart: tolerance_fp8(). The same step
 * against the reference without quantization must be further off than
 * that, so that the check can tell. Outputs are poisoned first
 * (GMLP_DEBUG=poison: fresh memory holds NaN).
 *
 * Then the FP8 API: the recipe and format as construct properties and by
 * set_fp8_recipe() on both MLPs, notifications; every recipe with every
 * padding; what is refused (an unknown recipe or format, E5M2 with a
 * per-tensor recipe, widths that are not multiples of 16, in the experts
 * or only in the shared expert: both MLPs unchanged); a recipe changed
 * between a forward and its backward.
 *
 * Every test runs on the CPU and on CUDA against the same references.
 * This file has the tests of the recipes, the FP8 API and main(); the
 * reference, the checks and the tests of recipes changed between steps
 * are in the files that test-moe-layer-fp8.h lists.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "test-moe-layer-fp8.h"

/* ---- Tests ---------------------------------------------------------------- */

/* Each recipe, FP32 and BF16, each configuration: the recipe given at
 * construction or set afterwards, two steps of fresh data with an update
 * of the quantizers between them (delayed scaling then has scales of its
 * own). */
static void
test_recipes (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  static const GmlpDType dtypes[] = { GMLP_DTYPE_FLOAT32, GMLP_DTYPE_BFLOAT16 };
  guint r, d, c;

  if (device == NULL)
    return;

  for (r = 0; r < G_N_ELEMENTS (all_recipes); r++)
    for (d = 0; d < G_N_ELEMENTS (dtypes); d++)
      for (c = 0; c < G_N_ELEMENTS (configs); c++)
        {
          GmlpScalingRecipe recipe = all_recipes[r];
          gboolean at_construction = (r + d + c) % 2 == 0;
          g_autoptr(Problem) p = problem_new (&configs[c], dtypes[d]);
          g_autoptr(GmlpMoELayer) layer = problem_layer (p, device, at_construction ? recipe
                                                                                     : GMLP_SCALING_RECIPE_NONE);
          g_autoptr(GError) error = NULL;
          guint step;

          if (!at_construction)
            {
              g_assert_true (gmlp_moe_layer_set_fp8_recipe (layer, recipe, GMLP_FP8_FORMAT_HYBRID, &error));
              g_assert_no_error (error);
            }
          g_assert_cmpint (gmlp_moe_layer_get_fp8_recipe (layer), ==, recipe);
          for (step = 0; step < 2; step++)
            {
              g_autofree char *what = g_strdup_printf ("%s %s %s step %u", gmlp_test_recipe_name (recipe),
                                                       gmlp_dtype_get_name (dtypes[d]), configs[c].name, step);

              check_step (p, device, layer, what);
              g_assert_true (gmlp_moe_layer_update_quantizers (layer, &error));
              g_assert_no_error (error);
            }
        }
}

static void
count_notify (GObject    *object,
              GParamSpec *pspec,
              gpointer    counter)
{
  (*(guint *) counter)++;
}

/* Every quantizer of @mlp has @recipe and @format (NONE: has none). */
static void
assert_mlp_recipe (GmlpGroupedMLP    *mlp,
                   GmlpScalingRecipe  recipe,
                   GmlpFp8Format      format)
{
  GmlpGroupedLinear *fc[2] = { gmlp_grouped_mlp_get_fc1 (mlp), gmlp_grouped_mlp_get_fc2 (mlp) };
  guint l, r;

  g_assert_cmpint (gmlp_grouped_mlp_get_fp8_recipe (mlp), ==, recipe);
  for (l = 0; l < 2; l++)
    for (r = 0; r < 3; r++)
      {
        GmlpQuantizer *q = gmlp_grouped_linear_get_quantizer (fc[l], all_roles[r]);

        if (recipe == GMLP_SCALING_RECIPE_NONE)
          {
            g_assert_null (q);
            continue;
          }
        g_assert_nonnull (q);
        g_assert_cmpint (gmlp_quantizer_get_recipe (q), ==, recipe);
        g_assert_cmpint (gmlp_quantizer_get_fp8_format (q), ==, format);
      }
}

/* fp8-recipe and fp8-format: construct properties, given to both MLPs,
 * notified when set_fp8_recipe() changes them; NONE; update_quantizers()
 * without quantizers. */
static void
test_properties (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpMoELayer) layer = NULL;
  g_autoptr(GError) error = NULL;
  GmlpScalingRecipe recipe;
  GmlpFp8Format format;
  guint notified = 0;

  if (device == NULL)
    return;

  layer = g_initable_new (GMLP_TYPE_MOE_LAYER, NULL, &error, "device", device, "hidden", (gint64) HIDDEN,
                          "ffn-hidden", (gint64) FFN, "n-experts", (guint) N_EXPERTS, "top-k", (guint) TOP_K,
                          "shared-expert-ffn-hidden", (gint64) 16,
                          "fp8-recipe", GMLP_SCALING_RECIPE_MXFP8, "fp8-format", GMLP_FP8_FORMAT_E4M3, NULL);
  g_assert_no_error (error);
  g_object_get (layer, "fp8-recipe", &recipe, "fp8-format", &format, NULL);
  g_assert_cmpint (recipe, ==, GMLP_SCALING_RECIPE_MXFP8);
  g_assert_cmpint (format, ==, GMLP_FP8_FORMAT_E4M3);
  g_assert_cmpint (gmlp_moe_layer_get_fp8_format (layer), ==, GMLP_FP8_FORMAT_E4M3);
  assert_mlp_recipe (gmlp_moe_layer_get_experts (layer), GMLP_SCALING_RECIPE_MXFP8, GMLP_FP8_FORMAT_E4M3);
  assert_mlp_recipe (gmlp_moe_layer_get_shared_expert (layer), GMLP_SCALING_RECIPE_MXFP8, GMLP_FP8_FORMAT_E4M3);
  /* The router has no quantizers: its gate stays FP32. */
  g_assert_cmpint (gmlp_grouped_tensor_get_dtype (gmlp_router_get_weight (gmlp_moe_layer_get_router (layer))), ==,
                   GMLP_DTYPE_FLOAT32);

  g_signal_connect (layer, "notify::fp8-recipe", G_CALLBACK (count_notify), &notified);
  g_signal_connect (layer, "notify::fp8-format", G_CALLBACK (count_notify), &notified);
  g_assert_true (gmlp_moe_layer_set_fp8_recipe (layer, GMLP_SCALING_RECIPE_MXFP8, GMLP_FP8_FORMAT_E4M3, &error));
  g_assert_no_error (error);
  g_assert_cmpuint (notified, ==, 0);
  g_assert_true (gmlp_moe_layer_set_fp8_recipe (layer, GMLP_SCALING_RECIPE_CURRENT, GMLP_FP8_FORMAT_E4M3, &error));
  g_assert_no_error (error);
  g_assert_cmpuint (notified, ==, 1);
  assert_mlp_recipe (gmlp_moe_layer_get_experts (layer), GMLP_SCALING_RECIPE_CURRENT, GMLP_FP8_FORMAT_E4M3);
  assert_mlp_recipe (gmlp_moe_layer_get_shared_expert (layer), GMLP_SCALING_RECIPE_CURRENT, GMLP_FP8_FORMAT_E4M3);

  g_assert_true (gmlp_moe_layer_set_fp8_recipe (layer, GMLP_SCALING_RECIPE_NONE, GMLP_FP8_FORMAT_HYBRID, &error));
  g_assert_no_error (error);
  g_assert_cmpuint (notified, ==, 3);
  g_assert_cmpint (gmlp_moe_layer_get_fp8_recipe (layer), ==, GMLP_SCALING_RECIPE_NONE);
  g_assert_cmpint (gmlp_moe_layer_get_fp8_format (layer), ==, GMLP_FP8_FORMAT_HYBRID);
  assert_mlp_recipe (gmlp_moe_layer_get_experts (layer), GMLP_SCALING_RECIPE_NONE, GMLP_FP8_FORMAT_HYBRID);
  assert_mlp_recipe (gmlp_moe_layer_get_shared_expert (layer), GMLP_SCALING_RECIPE_NONE, GMLP_FP8_FORMAT_HYBRID);
  g_assert_true (gmlp_moe_layer_update_quantizers (layer, &error));
  g_assert_no_error (error);
}

/* Every recipe with every padding, and a forward of each: nothing in the
 * FP8 passes needs the experts' rows aligned (the sizes stay on the
 * device). */
static void
test_any_padding (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  static const guint paddings[] = { 0, 1, 2, 16, 32, 64, 128 };
  g_autofree double *xv = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL;
  guint r, i;

  if (device == NULL)
    return;

  xv = gmlp_test_normals (T_TOKENS * HIDDEN, 1.0, GMLP_DTYPE_BFLOAT16);
  x = gmlp_test_upload_values (device, xv, T_TOKENS, HIDDEN, GMLP_DTYPE_BFLOAT16);
  for (r = 0; r < G_N_ELEMENTS (all_recipes); r++)
    for (i = 0; i < G_N_ELEMENTS (paddings); i++)
      {
        Config c = { "padding", paddings[i], 0 };
        g_autoptr(GError) error = NULL;
        g_autoptr(GmlpMoELayer) layer = layer_new (device, &c, GMLP_DTYPE_BFLOAT16, all_recipes[r], &error);
        g_autoptr(GmlpGroupedTensor) y = NULL;
        g_autofree double *yv = NULL;
        gsize n, q;

        g_assert_no_error (error);
        y = gmlp_moe_layer_forward (layer, x, NULL, &error);
        g_assert_no_error (error);
        yv = gmlp_test_download (y, &n);
        g_assert_cmpuint (n, ==, T_TOKENS * HIDDEN);
        for (q = 0; q < n; q++)
          g_assert_true (isfinite (yv[q]));
      }
}

static void
assert_unchanged (GmlpMoELayer      *layer,
                  GmlpScalingRecipe  recipe,
                  GmlpQuantizer     *experts_q,
                  GmlpQuantizer     *shared_q)
{
  GmlpGroupedMLP *experts = gmlp_moe_layer_get_experts (layer), *shared = gmlp_moe_layer_get_shared_expert (layer);

  g_assert_cmpint (gmlp_moe_layer_get_fp8_recipe (layer), ==, recipe);
  assert_mlp_recipe (experts, recipe, GMLP_FP8_FORMAT_HYBRID);
  g_assert_true (gmlp_grouped_linear_get_quantizer (gmlp_grouped_mlp_get_fc2 (experts), GMLP_QUANTIZER_ROLE_INPUT) ==
                 experts_q);
  if (shared != NULL)
    {
      assert_mlp_recipe (shared, recipe, GMLP_FP8_FORMAT_HYBRID);
      g_assert_true (gmlp_grouped_linear_get_quantizer (gmlp_grouped_mlp_get_fc2 (shared),
                                                        GMLP_QUANTIZER_ROLE_INPUT) == shared_q);
    }
}

/* What set_fp8_recipe() refuses, before either MLP changes: an unknown
 * recipe or format; E5M2 with a per-tensor recipe; a per-tensor recipe
 * where the experts' width, or only the shared expert's, is no multiple
 * of 16 (blockwise takes them); the same at construction. */
static void
test_bad_recipes (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GError) error = NULL;
  guint s;

  if (device == NULL)
    return;

  for (s = 0; s < 2; s++)
    {
      /* s = 0: the shared expert is 24 wide; s = 1: the experts are. */
      g_autoptr(GmlpMoELayer) layer = NULL;
      GmlpQuantizer *experts_q, *shared_q;
      const char *prefix = s == 0 ? "The shared expert: " : "The experts: ";

      layer = g_initable_new (GMLP_TYPE_MOE_LAYER, NULL, &error, "device", device, "hidden", (gint64) HIDDEN,
                              "ffn-hidden", (gint64) (s == 0 ? FFN : 24), "n-experts", (guint) N_EXPERTS,
                              "top-k", (guint) TOP_K, "shared-expert-ffn-hidden", (gint64) (s == 0 ? 24 : 16),
                              "dtype", GMLP_DTYPE_BFLOAT16, NULL);
      g_assert_no_error (error);

      g_assert_false (gmlp_moe_layer_set_fp8_recipe (layer, (GmlpScalingRecipe) 9, GMLP_FP8_FORMAT_HYBRID, &error));
      g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
      g_clear_error (&error);
      g_assert_false (gmlp_moe_layer_set_fp8_recipe (layer, GMLP_SCALING_RECIPE_DELAYED, (GmlpFp8Format) 7, &error));
      g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
      g_clear_error (&error);
      assert_unchanged (layer, GMLP_SCALING_RECIPE_NONE, NULL, NULL);

      /* Blockwise takes any width; its quantizers stay through what
       * follows. */
      g_assert_true (gmlp_moe_layer_set_fp8_recipe (layer, GMLP_SCALING_RECIPE_BLOCKWISE, GMLP_FP8_FORMAT_HYBRID,
                                                    &error));
      g_assert_no_error (error);
      experts_q = gmlp_grouped_linear_get_quantizer (gmlp_grouped_mlp_get_fc2 (gmlp_moe_layer_get_experts (layer)),
                                                     GMLP_QUANTIZER_ROLE_INPUT);
      shared_q = gmlp_grouped_linear_get_quantizer (gmlp_grouped_mlp_get_fc2 (gmlp_moe_layer_get_shared_expert (layer)),
                                                    GMLP_QUANTIZER_ROLE_INPUT);

      g_assert_false (gmlp_moe_layer_set_fp8_recipe (layer, GMLP_SCALING_RECIPE_CURRENT, GMLP_FP8_FORMAT_HYBRID,
                                                     &error));
      g_assert_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED);
      g_assert_true (g_str_has_prefix (error->message, prefix));
      g_clear_error (&error);
      assert_unchanged (layer, GMLP_SCALING_RECIPE_BLOCKWISE, experts_q, shared_q);
      g_assert_false (gmlp_moe_layer_set_fp8_recipe (layer, GMLP_SCALING_RECIPE_DELAYED, GMLP_FP8_FORMAT_HYBRID,
                                                     &error));
      g_assert_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED);
      g_clear_error (&error);
      assert_unchanged (layer, GMLP_SCALING_RECIPE_BLOCKWISE, experts_q, shared_q);

      /* The same at construction. */
      g_assert_null (g_initable_new (GMLP_TYPE_MOE_LAYER, NULL, &error, "device", device,
                                     "hidden", (gint64) HIDDEN, "ffn-hidden", (gint64) (s == 0 ? FFN : 24),
                                     "n-experts", (guint) N_EXPERTS, "top-k", (guint) TOP_K,
                                     "shared-expert-ffn-hidden", (gint64) (s == 0 ? 24 : 16),
                                     "fp8-recipe", GMLP_SCALING_RECIPE_DELAYED, NULL));
      g_assert_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED);
      g_assert_nonnull (strstr (error->message, prefix));
      g_clear_error (&error);
    }

  /* E5M2 everywhere: a per-tensor product of two E5M2 operands. */
  {
    Config c = { "e5m2", 0, 16 };
    g_autoptr(GmlpMoELayer) layer = layer_new (device, &c, GMLP_DTYPE_BFLOAT16, GMLP_SCALING_RECIPE_NONE, &error);

    g_assert_no_error (error);
    g_assert_false (gmlp_moe_layer_set_fp8_recipe (layer, GMLP_SCALING_RECIPE_CURRENT, GMLP_FP8_FORMAT_E5M2, &error));
    g_assert_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED);
    g_clear_error (&error);
    assert_unchanged (layer, GMLP_SCALING_RECIPE_NONE, NULL, NULL);
    /* MXFP8 multiplies dequantized operands: E5M2 will do. */
    g_assert_true (gmlp_moe_layer_set_fp8_recipe (layer, GMLP_SCALING_RECIPE_MXFP8, GMLP_FP8_FORMAT_E5M2, &error));
    g_assert_no_error (error);
  }
}

int
main (int argc, char *argv[])
{
  setlocale (LC_ALL, "");
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Gmlp/MoELayer/fp8/recipes", test_recipes);
  g_test_add_func ("/Gmlp/MoELayer/fp8/properties", test_properties);
  g_test_add_func ("/Gmlp/MoELayer/fp8/any-padding", test_any_padding);
  g_test_add_func ("/Gmlp/MoELayer/fp8/bad-recipes", test_bad_recipes);
  g_test_add_func ("/Gmlp/MoELayer/fp8/recipe-between", test_recipe_between);
  g_test_add_func ("/Gmlp/MoELayer/fp8/part-recipe-between", test_part_recipe_between);
  g_test_add_func ("/Gmlp/MoELayer/fp8/part-quantizer-state", test_part_quantizer_state);

  return g_test_run ();
}
