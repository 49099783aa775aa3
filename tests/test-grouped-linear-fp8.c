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
 * This file has the tests of recipes, shapes, tiles, the weight cache,
 * delayed scaling, mixed and prequantized operands, and main(); the
 * references, the checks and the other tests are in the files that
 * test-grouped-linear-fp8.h lists.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "test-grouped-linear-fp8.h"

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
