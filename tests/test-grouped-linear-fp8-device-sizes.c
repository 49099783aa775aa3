/* test-grouped-linear-fp8-device-sizes.c: FP8 GroupedLinear with device sizes
 *
 * Products whose group sizes are only on the device, and long reductions
 * on them.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "test-grouped-linear-fp8.h"

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
void
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

void
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
