/* test-grouped-linear.c: GroupedLinear against float64 references
 *
 * This file has the tests of the products' numbers and shapes, bad input,
 * main_grad checks, properties and main(); the checks and the other tests
 * are in the files that test-grouped-linear.h lists.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "test-grouped-linear.h"

/* fprop, dgrad, wgrad and dbias for every dtype, random shapes with empty
 * groups and sizes that are not multiples of 8 or 16. */
static void
test_numerics (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint d, iter;

  if (device == NULL)
    return;

  for (d = 0; d < G_N_ELEMENTS (layer_dtypes); d++)
    for (iter = 0; iter < 6; iter++)
      {
        guint n = g_test_rand_int_range (1, 7);
        gint64 k = g_test_rand_int_range (1, 90), o = g_test_rand_int_range (1, 90);
        GmlpLinearFlags flags = GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | (iter % 2 ? GMLP_LINEAR_BIAS : 0);
        g_autoptr(GmlpGroupedLinear) layer = new_layer (device, n, k, o, layer_dtypes[d], flags);
        g_autofree gint64 *rows = gmlp_test_random_rows (n, 70);

        run_and_check (layer, rows);
      }
}

/* One group, one group holding every row, 256 groups, odd sizes. */
static void
test_shapes (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint shape;

  if (device == NULL)
    return;

  for (shape = 0; shape < 4; shape++)
    {
      guint n = shape == 0 ? 1 : shape == 2 ? 256 : 5;
      gint64 k = shape == 3 ? 33 : 24, o = shape == 3 ? 17 : 40;
      g_autofree gint64 *rows = g_new0 (gint64, n);
      g_autoptr(GmlpGroupedLinear) layer = NULL;
      guint g;

      if (shape == 0)
        rows[0] = 37;
      else if (shape == 1)
        rows[3] = 123;
      else
        for (g = 0; g < n; g++)
          rows[g] = shape == 2 ? g_test_rand_int_range (0, 6) : g_test_rand_int_range (1, 31);

      layer = new_layer (device, n, k, o, GMLP_DTYPE_BFLOAT16,
                         GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS);
      run_and_check (layer, rows);
    }
}

/* Many experts of a few hundred rows each: on CUDA the batched path, which
 * cuts groups into row tiles plus leftover rows. */
static void
test_many_experts (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint iter;

  if (device == NULL)
    return;

  for (iter = 0; iter < 3; iter++)
    {
      const guint n = 24;
      g_autofree gint64 *rows = g_new (gint64, n);
      g_autoptr(GmlpGroupedLinear) layer = NULL;
      guint g;

      /* Long groups (mostly whole 128-row tiles), short ones, and a mix. */
      for (g = 0; g < n; g++)
        rows[g] = g % 7 == 3 ? 0 : g % 5 == 0 ? 256 :
                  iter == 0 ? g_test_rand_int_range (300, 420) :
                  iter == 1 ? g_test_rand_int_range (1, 120) : g_test_rand_int_range (1, 400);
      layer = new_layer (device, n, 64, 48, layer_dtypes[iter],
                         GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS);
      run_and_check (layer, rows);
    }
}

/* Every group of one size (balanced routing): on CUDA with host sizes, one
 * batched cuBLAS call for all groups instead of a loop. Odd sizes, an empty
 * group among equal ones, and wgrad added into main_grad (the same beta for
 * every product, so batched as well). */
static void
test_equal_groups (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint d, g;

  if (device == NULL)
    return;

  for (d = 0; d < G_N_ELEMENTS (layer_dtypes); d++)
    {
      gint64 equal[] = { 37, 37, 37, 37, 37 }, one_empty[] = { 64, 64, 0, 64, 64 };
      g_autoptr(GmlpGroupedLinear) a = new_layer (device, 5, 40, 24, layer_dtypes[d],
                                                  GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS);
      g_autoptr(GmlpGroupedLinear) b = new_layer (device, 5, 24, 56, layer_dtypes[d],
                                                  GMLP_LINEAR_SINGLE_GROUPED_WEIGHT);

      run_and_check (a, equal);
      run_and_check (b, one_empty);
    }

  for (d = 0; d < G_N_ELEMENTS (layer_dtypes); d++)
    {
      const guint n = 4;
      const gint64 k = 24, o = 40;
      gint64 rows[] = { 33, 33, 33, 33 }, wr[] = { o, o, o, o };
      g_autoptr(GmlpGroupedLinear) layer = new_layer (device, n, k, o, layer_dtypes[d],
                                                      GMLP_LINEAR_SINGLE_GROUPED_WEIGHT |
                                                      GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION);
      g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, y = NULL, dx = NULL, mg = NULL;
      g_autoptr(GmlpSavedActivations) saved = NULL;
      g_autoptr(GError) error = NULL;
      g_autoptr(Problem) p = problem_new (layer, rows, &x, &dy);
      g_autofree double *before = NULL, *got = NULL, *want = g_new (double, n * o * k);
      double tol = MAX (gmlp_test_tolerance (p->dtype), 2e-5);

      mg = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, wr, n, k, 1.0, &before);
      g_assert_true (gmlp_grouped_linear_set_main_grad (layer, mg, &error));
      g_assert_no_error (error);
      y = gmlp_grouped_linear_forward (layer, x, &saved, &error);
      g_assert_no_error (error);
      check_output (y, p->y, p, p->o, "fprop");
      dx = gmlp_grouped_linear_backward (layer, saved, dy, &error);
      g_assert_no_error (error);
      check_output (dx, p->dx, p, p->k, "dgrad");
      g_assert_true (gmlp_grouped_linear_get_grad_added_to_main_grad (layer));
      for (g = 0; g < n * o * k; g++)
        want[g] = before[g] + p->dw[g];
      got = gmlp_test_download (mg, NULL);
      gmlp_test_assert_close (got, want, n * o * k, tol, "main_grad");
    }
}

/* Bad input: the right error, nothing written, nothing allocated. */
static void
test_bad_input (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpGroupedLinear) layer = NULL, other = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, y = NULL, dx = NULL, x16 = NULL;
  g_autoptr(GmlpGroupedTensor) wide = NULL, three = NULL, dy_short = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL, other_saved = NULL;
  g_autoptr(GBytes) weight_before = NULL, weight_after = NULL, short_bytes = NULL;
  g_autoptr(GError) error = NULL;
  g_autoptr(Problem) p = NULL;
  gint64 rows[] = { 5, 0, 3, 2 };
  gint64 rows3[] = { 5, 3, 2 };
  gint64 rows_short[] = { 5, 0, 2, 2 };
  gboolean mask[] = { TRUE, FALSE, TRUE };
  guint64 in_use;

  if (device == NULL)
    return;

  layer = new_layer (device, 4, 16, 8, GMLP_DTYPE_FLOAT32, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_DELAY_WGRAD_COMPUTE);
  other = new_layer (device, 4, 16, 8, GMLP_DTYPE_FLOAT32, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT);
  p = problem_new (layer, rows, &x, &dy);
  x16 = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT16, rows, 4, 16, 1.0, NULL);
  wide = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, rows, 4, 17, 1.0, NULL);
  three = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, rows3, 3, 16, 1.0, NULL);
  dy_short = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, rows_short, 4, 8, 1.0, NULL);
  y = gmlp_grouped_linear_forward (other, x, &other_saved, &error);
  g_assert_no_error (error);
  g_clear_object (&y);

  weight_before = gmlp_grouped_tensor_to_bytes (gmlp_grouped_linear_get_weight (layer), NULL);
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

  EXPECT_NULL (gmlp_grouped_linear_forward (layer, x16, &_s, &_e), GMLP_ERROR_DTYPE_MISMATCH);
  EXPECT_NULL (gmlp_grouped_linear_forward (layer, wide, &_s, &_e), GMLP_ERROR_SHAPE_MISMATCH);
  EXPECT_NULL (gmlp_grouped_linear_forward (layer, three, &_s, &_e), GMLP_ERROR_SHAPE_MISMATCH);

  /* Saved activations of another layer, output gradients of the wrong shape. */
  y = gmlp_grouped_linear_forward (layer, x, &saved, &error);
  g_assert_no_error (error);
  in_use = gmlp_device_get_bytes_in_use (device);
  EXPECT_NULL (gmlp_grouped_linear_backward (layer, other_saved, dy, &_e), GMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_NULL (gmlp_grouped_linear_backward (layer, saved, x, &_e), GMLP_ERROR_SHAPE_MISMATCH);
  EXPECT_NULL (gmlp_grouped_linear_backward (layer, saved, dy_short, &_e), GMLP_ERROR_SHAPE_MISMATCH);
  EXPECT_NULL (gmlp_grouped_linear_backward (layer, saved, x16, &_e), GMLP_ERROR_DTYPE_MISMATCH);
  g_assert_false (gmlp_saved_activations_is_consumed (saved));
  g_assert_cmpuint (gmlp_grouped_linear_get_pending_wgrads (layer), ==, 0);

  /* Used once: fine; twice: an error. */
  dx = gmlp_grouped_linear_backward (layer, saved, dy, &error);
  g_assert_no_error (error);
  check_output (dx, p->dx, p, 16, "dgrad");
  in_use = gmlp_device_get_bytes_in_use (device);
  EXPECT_NULL (gmlp_grouped_linear_backward (layer, saved, dy, &_e), GMLP_ERROR_INVALID_STATE);

  /* Parameters: wrong lengths, masks, main_grad without fusion. */
  short_bytes = g_bytes_new_static ("abcd", 4);
  g_assert_false (gmlp_grouped_linear_set_weight_from_bytes (layer, short_bytes, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);
  g_assert_false (gmlp_grouped_linear_set_bias_from_bytes (layer, short_bytes, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
  g_clear_error (&error);
  g_assert_false (gmlp_grouped_linear_set_wgrad_accumulation_mask (layer, mask, 3, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);
  g_assert_false (gmlp_grouped_linear_set_main_grad (layer, x, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
  g_clear_error (&error);
  g_assert_false (gmlp_grouped_linear_backward_dw (other, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
  g_clear_error (&error);
  weight_after = gmlp_grouped_tensor_to_bytes (gmlp_grouped_linear_get_weight (layer), NULL);
  g_assert_true (g_bytes_equal (weight_before, weight_after));

  /* Construction: no groups, no features, FP8. */
  EXPECT_NULL (gmlp_grouped_linear_new (device, 0, 4, 4, &_e), GMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_NULL (gmlp_grouped_linear_new (device, 2, 0, 4, &_e), GMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_NULL (gmlp_grouped_linear_new (device, 2, 4, -1, &_e), GMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_NULL (gmlp_grouped_linear_new_full (device, 2, 4, 4, GMLP_DTYPE_FLOAT8_E4M3, 0, &_e), GMLP_ERROR_UNSUPPORTED);
  EXPECT_NULL (gmlp_grouped_linear_new_full (device, 2, 4, 4, GMLP_DTYPE_INT32, 0, &_e), GMLP_ERROR_UNSUPPORTED);
#undef EXPECT_NULL
}

/* Fused accumulation with main_grad checks: dtype, shape, mode. */
static void
test_main_grad_checks (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpGroupedLinear) single = NULL, per_group = NULL;
  g_autoptr(GmlpGroupedTensor) bf16 = NULL, wrong = NULL, member = NULL;
  g_autoptr(GError) error = NULL;
  gint64 r3[] = { 8, 8, 8 };

  if (device == NULL)
    return;

  single = new_layer (device, 3, 4, 8, GMLP_DTYPE_FLOAT32,
                      GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION);
  per_group = new_layer (device, 3, 4, 8, GMLP_DTYPE_FLOAT32, GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION);
  bf16 = gmlp_grouped_tensor_new (device, GMLP_DTYPE_BFLOAT16, r3, 3, 4, NULL);
  wrong = gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, r3, 3, 5, NULL);
  member = gmlp_grouped_tensor_new_uniform (device, GMLP_DTYPE_FLOAT32, 1, 8, 4, NULL);

  g_assert_false (gmlp_grouped_linear_set_main_grad (single, bf16, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_DTYPE_MISMATCH);
  g_clear_error (&error);
  g_assert_false (gmlp_grouped_linear_set_main_grad (single, wrong, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH);
  g_clear_error (&error);
  g_assert_false (gmlp_grouped_linear_set_main_grad_member (single, 0, member, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
  g_clear_error (&error);
  g_assert_false (gmlp_grouped_linear_set_main_grad (per_group, wrong, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
  g_clear_error (&error);
  g_assert_false (gmlp_grouped_linear_set_main_grad_member (per_group, 3, member, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);
  g_assert_true (gmlp_grouped_linear_set_main_grad_member (per_group, 2, member, &error));
  g_assert_no_error (error);
  g_assert_true (gmlp_grouped_linear_get_main_grad_member (per_group, 2) == member);
}

static void
test_properties (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpGroupedLinear) layer = NULL;
  g_autoptr(GError) error = NULL;
  gboolean bias, single, fused, delay;
  guint n;
  gint64 in, out;
  GmlpDType dtype;

  if (device == NULL)
    return;

  layer = g_initable_new (GMLP_TYPE_GROUPED_LINEAR, NULL, &error,
                          "device", device, "n-groups", 6, "in-features", (gint64) 12,
                          "out-features", (gint64) 10, "dtype", GMLP_DTYPE_BFLOAT16,
                          "bias", TRUE, "single-grouped-weight", FALSE,
                          "fuse-wgrad-accumulation", TRUE, NULL);
  g_assert_no_error (error);
  g_object_get (layer, "n-groups", &n, "in-features", &in, "out-features", &out,
                "dtype", &dtype, "bias", &bias, "single-grouped-weight", &single,
                "fuse-wgrad-accumulation", &fused, "delay-wgrad-compute", &delay, NULL);
  g_assert_cmpuint (n, ==, 6);
  g_assert_cmpint (in, ==, 12);
  g_assert_cmpint (out, ==, 10);
  g_assert_cmpint (dtype, ==, GMLP_DTYPE_BFLOAT16);
  g_assert_true (bias && !single && fused && !delay);
  g_assert_cmpint (gmlp_grouped_linear_get_flags (layer), ==,
                   GMLP_LINEAR_BIAS | GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION);
  g_assert_null (gmlp_grouped_linear_get_weight (layer));
  g_assert_cmpint (gmlp_grouped_tensor_get_rows (gmlp_grouped_linear_get_weight_member (layer, 5), 0), ==, 10);
  g_assert_cmpint (gmlp_grouped_tensor_get_cols (gmlp_grouped_linear_get_bias_member (layer, 5)), ==, 10);
  g_assert_cmpint (gmlp_grouped_tensor_get_dtype (gmlp_grouped_linear_get_main_grad_member (layer, 0)), ==,
                   GMLP_DTYPE_FLOAT32);

  /* The seeded initialisation is reproducible and within ±1/√in. */
  {
    g_autoptr(GmlpGroupedLinear) a = new_layer (device, 2, 50, 3, GMLP_DTYPE_FLOAT32, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT);
    g_autoptr(GmlpGroupedLinear) b = new_layer (device, 2, 50, 3, GMLP_DTYPE_FLOAT32, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT);
    g_autoptr(GBytes) wa = NULL, wb = NULL;
    g_autofree double *v = NULL;
    gsize i, nv;

    g_assert_true (gmlp_grouped_linear_init_parameters (a, 77, NULL));
    g_assert_true (gmlp_grouped_linear_init_parameters (b, 77, NULL));
    wa = gmlp_grouped_tensor_to_bytes (gmlp_grouped_linear_get_weight (a), NULL);
    wb = gmlp_grouped_tensor_to_bytes (gmlp_grouped_linear_get_weight (b), NULL);
    g_assert_true (g_bytes_equal (wa, wb));
    v = gmlp_test_download (gmlp_grouped_linear_get_weight (a), &nv);
    for (i = 0; i < nv; i++)
      g_assert_cmpfloat (fabs (v[i]), <=, 1.0 / sqrt (50.0));
  }
}

int
main (int argc, char *argv[])
{
  setlocale (LC_ALL, "");
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Gmlp/GroupedLinear/numerics", test_numerics);
  g_test_add_func ("/Gmlp/GroupedLinear/shapes", test_shapes);
  g_test_add_func ("/Gmlp/GroupedLinear/many-experts", test_many_experts);
  g_test_add_func ("/Gmlp/GroupedLinear/equal-groups", test_equal_groups);
  g_test_add_func ("/Gmlp/GroupedLinear/contract", test_contract);
  g_test_add_func ("/Gmlp/GroupedLinear/wgrad-ready", test_wgrad_ready);
  g_test_add_func ("/Gmlp/GroupedLinear/microbatches", test_microbatches);
  g_test_add_func ("/Gmlp/GroupedLinear/bad-input", test_bad_input);
  g_test_add_func ("/Gmlp/GroupedLinear/main-grad-checks", test_main_grad_checks);
  g_test_add_func ("/Gmlp/GroupedLinear/properties", test_properties);
  g_test_add_func ("/Gmlp/GroupedLinear/device-sizes/numerics", test_device_sizes_numerics);
  g_test_add_func ("/Gmlp/GroupedLinear/device-sizes/shapes", test_device_sizes_shapes);
  g_test_add_func ("/Gmlp/GroupedLinear/device-sizes/many-tiles", test_device_sizes_many_tiles);
  g_test_add_func ("/Gmlp/GroupedLinear/device-sizes/tiles", test_device_sizes_tiles);
  g_test_add_func ("/Gmlp/GroupedLinear/device-sizes/long-reduction", test_device_sizes_long_reduction);
  g_test_add_func ("/Gmlp/GroupedLinear/device-sizes/tiny-groups", test_tiny_groups);
  g_test_add_func ("/Gmlp/GroupedLinear/device-sizes/direct", test_device_sizes_direct);
  g_test_add_func ("/Gmlp/GroupedLinear/device-sizes/same-as-host", test_device_sizes_same_as_host);
  g_test_add_func ("/Gmlp/GroupedLinear/device-sizes/bias-rounding", test_device_sizes_bias_rounding);
  g_test_add_func ("/Gmlp/GroupedLinear/dbias-cancellation", test_dbias_cancellation);
  g_test_add_func ("/Gmlp/GroupedLinear/device-sizes/contract", test_device_sizes_contract);
  g_test_add_func ("/Gmlp/GroupedLinear/device-sizes/microbatches", test_device_sizes_microbatches);
  g_test_add_func ("/Gmlp/GroupedLinear/device-sizes/bad-input", test_device_sizes_bad_input);
  g_test_add_func ("/Gmlp/GroupedLinear/device-sizes/offload", test_device_sizes_offload);
  g_test_add_func ("/Gmlp/GroupedLinear/versions/writes", test_versions_writes);
  g_test_add_func ("/Gmlp/GroupedLinear/versions/changed", test_versions_changed);
  g_test_add_func ("/Gmlp/GroupedLinear/versions/changed-fp8", test_versions_changed_fp8);
  g_test_add_func ("/Gmlp/GroupedLinear/versions/delayed", test_versions_delayed);
  g_test_add_func ("/Gmlp/GroupedLinear/main-grad-aliasing", test_main_grad_aliasing);

  return g_test_run ();
}
