/* test-grouped-mlp-fp8-device-sizes.c: the FP8 MLP with device group sizes
 *
 * The fused pass and the MLP's step with group sizes only on the device,
 * against those with host sizes.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "test-grouped-mlp-fp8.h"

/* ---- Group sizes on the device -------------------------------------------- */

/* Two quantized tensors hold the same values, every part of them read
 * packed (gmlp_test_assert_same_packed()). */
static void
assert_same_quantized_packed (GmlpGroupedTensor *a, GmlpGroupedTensor *b, const char *what)
{
  GmlpGroupedTensor *ca = gmlp_grouped_tensor_get_columnwise (a);
  GmlpGroupedTensor *cb = gmlp_grouped_tensor_get_columnwise (b);
  g_autofree char *scales = g_strdup_printf ("%s: scales", what);
  g_autofree char *copy = g_strdup_printf ("%s: columnwise copy", what);
  g_autofree char *copy_scales = g_strdup_printf ("%s: columnwise scales", what);

  g_assert_cmpint (gmlp_grouped_tensor_get_scaling_recipe (a), ==, gmlp_grouped_tensor_get_scaling_recipe (b));
  gmlp_test_assert_same_packed (a, b, what);
  gmlp_test_assert_same_packed (gmlp_grouped_tensor_get_scale_inv (a), gmlp_grouped_tensor_get_scale_inv (b),
                                scales);
  g_assert_true ((ca == NULL) == (cb == NULL));
  if (ca == NULL)
    return;
  gmlp_test_assert_same_packed (ca, cb, copy);
  gmlp_test_assert_same_packed (gmlp_grouped_tensor_get_scale_inv (ca), gmlp_grouped_tensor_get_scale_inv (cb),
                                copy_scales);
}

/* The fused pass on FC1's output with device sizes (past the capacity
 * too) gives the bytes it gives with the rows it keeps on the host, every
 * part of the FP8 tensor and the delayed state, for every recipe and
 * activation, with and without the columnwise copy: the scales in blocks
 * of rows find their sizes on the device. */
void
test_device_sizes_fused (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint a, r, col;

  if (device == NULL)
    return;

  for (a = 0; a < G_N_ELEMENTS (activations); a++)
    for (r = 0; r < G_N_ELEMENTS (all_recipes); r++)
      for (col = 0; col < 2; col++)
        {
          GmlpActivation act = activations[a];
          GmlpScalingRecipe recipe = all_recipes[r];
          GmlpDType dtype = (a + r) % 2 ? GMLP_DTYPE_FLOAT32 : GMLP_DTYPE_BFLOAT16;
          guint n = g_test_rand_int_range (1, 6), g;
          gint64 ffn = col ? 160 : g_test_rand_int_range (1, 200), in_cols = gated (act) ? 2 * ffn : ffn;
          g_autofree gint64 *sizes = gmlp_test_random_rows (n, 300);
          g_autofree gint64 *rows = NULL;
          gint64 total = 0, capacity;
          g_autoptr(GmlpGroupedMLP) mlp = NULL;
          g_autoptr(GmlpQuantizer) q_host = NULL, q_dev = NULL;
          g_autoptr(GmlpGroupedTensor) h = NULL, sizes_t = NULL, h_dev = NULL, f_host = NULL, f_dev = NULL;
          g_autoptr(GError) error = NULL;
          g_autofree char *what = g_strdup_printf ("device sizes: %s %s %s%s", activation_names[act],
                                                   gmlp_dtype_get_name (dtype), gmlp_test_recipe_name (recipe),
                                                   col ? " columnwise" : "");

          for (g = 0; g < n; g++)
            total += sizes[g];
          capacity = r % 2 ? total / 2 : total + g_test_rand_int_range (0, 40);
          rows = gmlp_test_clamped_rows (sizes, n, capacity);
          g_test_message ("%s, ffn %" G_GINT64_FORMAT ", capacity %" G_GINT64_FORMAT " of %" G_GINT64_FORMAT,
                          what, ffn, capacity, total);
          mlp = gmlp_grouped_mlp_new_full (device, n, 16, ffn, act, dtype, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT, &error);
          g_assert_no_error (error);
          q_host = new_input_quantizer (device, recipe, GMLP_FP8_FORMAT_HYBRID, FALSE, n, 1.5);
          q_dev = gmlp_test_copy_quantizer (device, q_host);

          /* The groups after the one cut short have no rows: copying the
           * host tensor's bytes puts every row where the device sizes
           * say. */
          h = gmlp_test_random_tensor (device, dtype, rows, n, in_cols, 2.0, NULL);
          sizes_t = gmlp_test_sizes_tensor (device, sizes, n);
          h_dev = gmlp_test_device_sized_copy (h, sizes_t, capacity);

          f_host = gmlp_grouped_mlp_run_activation_quantize (mlp, h, q_host, col, &error);
          g_assert_no_error (error);
          f_dev = gmlp_grouped_mlp_run_activation_quantize (mlp, h_dev, q_dev, col, &error);
          g_assert_no_error (error);
          g_assert_false (gmlp_grouped_tensor_has_host_sizes (f_dev));
          g_assert_true (gmlp_grouped_tensor_get_sizes (f_dev, NULL) == sizes_t);
          assert_same_quantized_packed (f_dev, f_host, what);
          if (recipe == GMLP_SCALING_RECIPE_DELAYED)
            assert_same_state (q_dev, q_host, what);
        }
}

/* One FP8 forward and backward with the group sizes only on the device
 * (@sizes; @rows what each group keeps, which the host-sizes step gets):
 * against the float64 reference of the exact MLP within the bounds of
 * test_recipes, and, on the CPU, y, dx, the bias gradients and the
 * delayed-scaling states bit for bit against the same step with @rows on
 * the host (the CPU's FP8 weight gradients with device sizes multiply
 * dequantized operands: compared with float64 only; on a GPU the products
 * may take other kernels for host and device sizes). */
static void
check_device_sizes (GmlpDevice *device, GmlpScalingRecipe recipe, GmlpActivation act, GmlpLinearFlags extra,
                    gboolean offload, const gint64 *sizes, const gint64 *rows, guint n, gint64 capacity,
                    gint64 hid, gint64 ffn)
{
  guint64 seed = g_test_rand_int ();
  g_autoptr(GmlpGroupedMLP) mlp_host = new_mlp (device, n, hid, ffn, act, recipe, extra);
  g_autoptr(GmlpGroupedMLP) mlp_dev = new_mlp (device, n, hid, ffn, act, recipe, extra);
  g_autoptr(GmlpGroupedTensor) sizes_t = NULL, x = NULL, dy = NULL, y = NULL, dx = NULL, y_view = NULL, dx_view = NULL;
  g_autoptr(Problem) p = NULL;
  g_autofree char *what = g_strdup_printf ("device sizes: %s %s flags 0x%x%s capacity %" G_GINT64_FORMAT,
                                           gmlp_test_recipe_name (recipe), activation_names[act], extra,
                                           offload ? " offload" : "", capacity);
  const double *bound = bounds_for (recipe, act);
  GmlpGroupedLinear *fc1 = gmlp_grouped_mlp_get_fc1 (mlp_dev), *fc2 = gmlp_grouped_mlp_get_fc2 (mlp_dev);
  Outputs got = { 0, }, exact = { 0, };
  gsize n_y, i;

  g_test_message ("%s", what);
  g_assert_true (gmlp_grouped_mlp_init_parameters (mlp_host, seed, NULL));
  g_assert_true (gmlp_grouped_mlp_init_parameters (mlp_dev, seed, NULL));
  p = problem_new (mlp_dev, rows, 1.0);
  sizes_t = gmlp_test_sizes_tensor (device, sizes, n);
  x = gmlp_test_device_sized_copy (p->xt, sizes_t, capacity);
  dy = gmlp_test_device_sized_copy (p->dyt, sizes_t, capacity);

  gmlp_test_mlp_step (mlp_dev, x, dy, offload, &y, &dx, NULL);
  g_assert_false (gmlp_grouped_tensor_has_host_sizes (y));
  g_assert_true (gmlp_grouped_tensor_get_sizes (dx, NULL) == sizes_t);
  y_view = gmlp_test_host_view (y, rows);
  dx_view = gmlp_test_host_view (dx, rows);

  got.y = gmlp_test_download (y_view, &n_y);
  got.dx = gmlp_test_download (dx_view, NULL);
  got.dw1 = gmlp_test_download (gmlp_grouped_linear_get_wgrad (fc1), NULL);
  got.dw2 = gmlp_test_download (gmlp_grouped_linear_get_wgrad (fc2), NULL);
  got.db2 = gmlp_test_download (gmlp_grouped_linear_get_bgrad (fc2), NULL);
  reference (p, &exact);
  g_assert_cmpuint (n_y, ==, p->total * p->hid);
  {
    const double *gv[4] = { got.y, got.dx, got.dw1, got.dw2 };
    const double *wv[4] = { exact.y, exact.dx, exact.dw1, exact.dw2 };
    gsize len[4] = { n_y, n_y, n * p->w1o * hid, n * hid * ffn };

    for (i = 0; i < 4; i++)
      {
        g_autofree char *name = g_strdup_printf ("%s: %s", what, output_names[i]);
        double err = gmlp_test_relative_error (gv[i], wv[i], len[i], name);

        if (!(err <= bound[i] + 0.02))
          g_error ("%s: relative error %.4f from float64", name, err);
        /* The groups without rows have exactly zero weight gradients. */
        if (i >= 2)
          for (guint g = 0; g < n; g++)
            if (rows[g] == 0)
              for (gsize j = 0; j < len[i] / n; j++)
                g_assert_cmpfloat (gv[i][g * (len[i] / n) + j], ==, 0.0);
      }
  }
  gmlp_test_assert_close (got.db2, exact.db2, n * hid, 1e-2, "fc2 dbias");

  if (gmlp_device_get_kind (device) == GMLP_DEVICE_KIND_CPU)
    {
      g_autoptr(GmlpGroupedTensor) y_host = NULL, dx_host = NULL;
      guint l, role;

      gmlp_test_mlp_step (mlp_host, p->xt, p->dyt, offload, &y_host, &dx_host, NULL);
      gmlp_test_assert_same_bytes (y_view, y_host, "y, device sizes against host sizes");
      gmlp_test_assert_same_bytes (dx_view, dx_host, "dx, device sizes against host sizes");
      for (l = 0; l < 2; l++)
        {
          GmlpGroupedLinear *a = l == 0 ? fc1 : fc2;
          GmlpGroupedLinear *b = l == 0 ? gmlp_grouped_mlp_get_fc1 (mlp_host) : gmlp_grouped_mlp_get_fc2 (mlp_host);

          gmlp_test_assert_same_bytes (gmlp_grouped_linear_get_bgrad (a), gmlp_grouped_linear_get_bgrad (b),
                                       "bias gradient");
          for (role = 0; role < 3; role++)
            if (recipe == GMLP_SCALING_RECIPE_DELAYED)
              assert_same_state (gmlp_grouped_linear_get_quantizer (a, role),
                                 gmlp_grouped_linear_get_quantizer (b, role), what);
        }
    }
  outputs_clear (&got);
  outputs_clear (&exact);
}

/* Every recipe, GELU and SwiGLU, plain, with recompute, offload and
 * delayed weight gradients, empty groups; then sizes past the capacity
 * with rows of whole multiples of 256 bytes (FC2's FP8 input too: 256
 * wide), where every pass keeps the sizes clamped in order; and no rows
 * at all. */
void
test_device_sizes (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  static const GmlpLinearFlags modes[] = {
    0, GMLP_LINEAR_RECOMPUTE_ACTIVATION, 0, GMLP_LINEAR_DELAY_WGRAD_COMPUTE,
  };
  gint64 sizes[] = { 37, 0, 130, 9 };
  gint64 over[] = { 40, 100, 30 };
  gint64 none[] = { 0, 0, 0 };
  guint r, a;

  if (device == NULL)
    return;

  for (r = 0; r < G_N_ELEMENTS (all_recipes); r++)
    for (a = 0; a < G_N_ELEMENTS (activations); a += 3)   /* GELU and SwiGLU */
      {
        guint m = (r + a) % G_N_ELEMENTS (modes);

        check_device_sizes (device, all_recipes[r], activations[a], modes[m], m == 2, sizes, sizes, 4,
                            176 + 16 * r, 64, 48);
      }
  for (r = 0; r < G_N_ELEMENTS (all_recipes); r++)
    {
      g_autofree gint64 *rows = gmlp_test_clamped_rows (over, 3, 100);

      check_device_sizes (device, all_recipes[r], r % 2 ? GMLP_ACTIVATION_SWIGLU : GMLP_ACTIVATION_GELU, 0, FALSE,
                          over, rows, 3, 100, 128, 256);
      /* No rows at all. */
      check_device_sizes (device, all_recipes[r], GMLP_ACTIVATION_GELU, GMLP_LINEAR_RECOMPUTE_ACTIVATION, FALSE,
                          none, none, 3, 24, 32, 48);
    }
}
