/* test-grouped-linear-device-sizes.c: GroupedLinear with device group sizes
 *
 * Products whose group sizes are only on the device: numbers, shapes, tiles,
 * reductions, the direct route, the same results as host sizes, the bias's
 * rounding, the contract, microbatches, bad input and offload.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "test-grouped-linear.h"

/* ---- Group sizes on the device -------------------------------------------- */

/* One forward and backward with the group sizes only on the device
 * (@sizes, as a router would write them: maybe negative, maybe adding up to
 * more than @capacity), against the float64 reference of the rows the
 * kernels use; the outputs start poisoned and nothing outside those rows is
 * written. */
static void
run_device_sizes (GmlpGroupedLinear *layer, const gint64 *sizes, gint64 capacity)
{
  GmlpDevice *device = gmlp_grouped_linear_get_device (layer);
  guint n = gmlp_grouped_linear_get_n_groups (layer);
  gint64 k = gmlp_grouped_linear_get_in_features (layer);
  gint64 o = gmlp_grouped_linear_get_out_features (layer);
  GmlpDType dtype = gmlp_grouped_linear_get_dtype (layer);
  gboolean has_bias = (gmlp_grouped_linear_get_flags (layer) & GMLP_LINEAR_BIAS) != 0;
  gint64 row_bytes[2] = { k * (gint64) gmlp_dtype_get_size (dtype), o * (gint64) gmlp_dtype_get_size (dtype) };
  /* The products use the rows that fit in both operands; the bias gradient
   * reads dy alone, so it may see more of dy's rows. */
  g_autofree gint64 *rows = fitting_rows (sizes, n, capacity, row_bytes, 2);
  g_autofree gint64 *dy_rows = fitting_rows (sizes, n, capacity, &row_bytes[1], 1);
  g_autoptr(GmlpGroupedTensor) x_host = NULL, dy_host = NULL, dy_full = NULL;
  g_autoptr(GmlpGroupedTensor) x_sizes = NULL, dy_sizes = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, y = NULL, dx = NULL, y_view = NULL, dx_view = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GError) error = NULL;
  g_autoptr(Problem) p = problem_new (layer, rows, &x_host, &dy_host);
  double tol = gmlp_test_tolerance (dtype);
  guint g;

  x_sizes = sizes_tensor (device, sizes, n);
  /* The output gradient's sizes: the same values, in the same tensor or
   * in one of its own. */
  dy_sizes = g_test_rand_bit () ? g_object_ref (x_sizes) : sizes_tensor (device, sizes, n);
  x = gmlp_test_device_sized_copy (x_host, x_sizes, capacity);

  /* dy: the problem's rows of each group, then those only the bias
   * gradient sees. */
  {
    gint64 dy_total = 0, r0 = 0, q0 = 0, r, j;
    g_autofree double *values = NULL;
    g_autoptr(GBytes) bytes = NULL;

    for (g = 0; g < n; g++)
      dy_total += dy_rows[g];
    values = g_new (double, MAX (dy_total * o, 1));
    for (g = 0; g < n; g++)
      {
        g_assert_cmpint (dy_rows[g], >=, rows[g]);
        memcpy (values + q0 * o, p->dy + r0 * o, sizeof (double) * rows[g] * o);
        for (r = rows[g]; r < dy_rows[g]; r++)
          for (j = 0; j < o; j++)
            {
              double v = gmlp_test_round ((float) g_test_rand_double_range (-1.0, 1.0), dtype);
              values[(q0 + r) * o + j] = v;
              p->db[g * o + j] += v;
              p->db_abs[g * o + j] += fabs (v);
            }
        p->db_terms[g] = dy_rows[g];
        r0 += rows[g];
        q0 += dy_rows[g];
      }
    bytes = encode_values (values, dy_total * o, dtype);
    dy_full = gmlp_grouped_tensor_new_from_bytes (device, dtype, dy_rows, n, o, bytes, &error);
    g_assert_no_error (error);
  }
  dy = gmlp_test_device_sized_copy (dy_full, dy_sizes, capacity);

  y = gmlp_grouped_linear_forward (layer, x, &saved, &error);
  g_assert_no_error (error);
  g_assert_false (gmlp_grouped_tensor_has_host_sizes (y));
  g_assert_true (gmlp_grouped_tensor_get_sizes (y, NULL) == x_sizes);
  g_assert_cmpint (gmlp_grouped_tensor_get_row_capacity (y), ==, capacity);
  g_assert_cmpint (gmlp_grouped_tensor_get_cols (y), ==, o);
  y_view = gmlp_test_host_view (y, rows);
  check_output (y_view, p->y, p, o, "fprop (device sizes)");
  assert_only_rows_written (y, sizes, rows);

  dx = gmlp_grouped_linear_backward (layer, saved, dy, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_saved_activations_is_consumed (saved));
  g_assert_false (gmlp_grouped_tensor_has_host_sizes (dx));
  g_assert_true (gmlp_grouped_tensor_get_sizes (dx, NULL) == x_sizes);
  g_assert_cmpint (gmlp_grouped_tensor_get_row_capacity (dx), ==, capacity);
  dx_view = gmlp_test_host_view (dx, rows);
  check_output (dx_view, p->dx, p, k, "dgrad (device sizes)");
  assert_only_rows_written (dx, sizes, rows);
  check_per_group (gmlp_grouped_linear_get_wgrad (layer), p->dw, p, o * k, tol, "wgrad (device sizes)");
  if (has_bias)
    check_dbias (gmlp_grouped_linear_get_bgrad (layer), p, "dbias (device sizes)");
}

static gint64
sum_of_sizes (const gint64 *sizes, guint n)
{
  gint64 total = 0;
  guint g;

  for (g = 0; g < n; g++)
    total += MAX (sizes[g], 0);
  return total;
}

/* Many tiny groups, half of them empty, one subtile of columns per tile
 * on the Hopper kernel: a consumer's consecutive tiles each store one
 * subtile, and an empty group's zeros follow a group's products within a
 * few hundred cycles, so the epilogue's two staging slots must alternate
 * across tiles (taken by the subtile's index, a store still reading slot 0
 * took the next tile's values; the shapes test saw it a few times in a
 * thousand runs). Host sizes, then device sizes. */
void
test_tiny_groups (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint iter, g;

  if (device == NULL)
    return;

  for (iter = 0; iter < 4; iter++)
    {
      const guint n = 1024;
      g_autofree gint64 *rows = g_new (gint64, n);
      g_autoptr(GmlpGroupedLinear) layer = NULL;

      for (g = 0; g < n; g++)
        rows[g] = g_test_rand_bit () ? 0 : g_test_rand_int_range (1, 9);
      layer = new_layer (device, n, 24, iter % 2 ? 40 : 56,
                         iter % 2 ? GMLP_DTYPE_FLOAT16 : GMLP_DTYPE_BFLOAT16,
                         GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS);
      if (iter < 2)
        run_and_check (layer, rows);
      else
        run_device_sizes (layer, rows, sum_of_sizes (rows, n));
    }
}

/* Every dtype, random shapes and sizes: empty groups, odd sizes, negative
 * sizes, room to spare, and sizes past the capacity. */
void
test_device_sizes_numerics (void)
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
        g_autofree gint64 *sizes = gmlp_test_random_rows (n, 70);
        gint64 total, capacity;

        if (iter % 3 == 1)
          sizes[g_test_rand_int_range (0, n)] = -g_test_rand_int_range (1, 6);
        total = sum_of_sizes (sizes, n);
        capacity = iter % 3 == 2 ? total * 2 / 3 : total + g_test_rand_int_range (0, 20);
        g_test_message ("%s n=%u k=%" G_GINT64_FORMAT " o=%" G_GINT64_FORMAT " capacity=%"
                        G_GINT64_FORMAT " of %" G_GINT64_FORMAT, gmlp_dtype_get_name (layer_dtypes[d]),
                        n, k, o, capacity, total);
        run_device_sizes (layer, sizes, capacity);
      }
}

/* One group, one group holding every row, 256 groups, odd sizes, sizes far
 * past the capacity, a capacity of zero, no rows at all; FP32 too (the
 * portable kernel on a GPU). */
void
test_device_sizes_shapes (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint shape;

  if (device == NULL)
    return;

  for (shape = 0; shape < 8; shape++)
    {
      static const guint n_of[] = { 1, 5, 256, 5, 4, 3, 3, 2 };
      guint n = n_of[shape];
      gint64 k = shape == 3 ? 33 : shape == 7 ? 130 : 24, o = shape == 3 ? 17 : shape == 7 ? 70 : 40;
      GmlpDType dtype = shape % 2 ? GMLP_DTYPE_FLOAT32 : GMLP_DTYPE_BFLOAT16;
      g_autofree gint64 *sizes = g_new0 (gint64, n);
      g_autoptr(GmlpGroupedLinear) layer = NULL;
      gint64 capacity;
      guint g;

      switch (shape)
        {
        case 0: sizes[0] = 37; break;
        case 1: sizes[3] = 123; break;
        case 2:
          for (g = 0; g < n; g++)
            sizes[g] = g_test_rand_int_range (0, 6);
          break;
        case 3:
          for (g = 0; g < n; g++)
            sizes[g] = g_test_rand_int_range (1, 31);
          break;
        case 4: sizes[0] = 1000; sizes[1] = 50; sizes[2] = -3; sizes[3] = 7; break;
        case 5: sizes[0] = 5; sizes[2] = 2; break;
        case 6: break;
        default: sizes[0] = 300; sizes[1] = 129; break;
        }
      capacity = shape == 4 ? 40 : shape == 5 ? 0 : shape == 6 ? 10 :
                 sum_of_sizes (sizes, n) + (shape == 3 ? 9 : 0);

      layer = new_layer (device, n, k, o, dtype, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS);
      run_device_sizes (layer, sizes, capacity);
    }
}

/* More output tiles than a GPU holds blocks at once (the kernels stride
 * over the tile list), groups of several bias tiles, and more groups than
 * one pass of the device-side scan covers (256). */
void
test_device_sizes_many_tiles (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint shape;

  if (device == NULL)
    return;

  for (shape = 0; shape < 2; shape++)
    {
      guint n = shape == 0 ? 4 : 300;
      gint64 k = shape == 0 ? 8 : 70, o = shape == 0 ? 1500 : 130;
      g_autofree gint64 *sizes = g_new (gint64, n);
      g_autoptr(GmlpGroupedLinear) layer = NULL;
      guint g;

      for (g = 0; g < n; g++)
        sizes[g] = shape == 0 ? g_test_rand_int_range (900, 1100) : g_test_rand_int_range (0, 10);
      layer = new_layer (device, n, k, o, shape == 0 ? GMLP_DTYPE_BFLOAT16 : GMLP_DTYPE_FLOAT16,
                         GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS);
      run_device_sizes (layer, sizes, sum_of_sizes (sizes, n) + 17);
    }
}

/* Shapes the Hopper kernel takes on an H100/H200 (16-bit operands,
 * features multiples of 8): several 128 × 256 output tiles with partial
 * ones at both edges, a reduction that ends inside a 64-deep block, row
 * counts that are not multiples of the tiles (last row tiles of 1, 45, 63,
 * 64 and 65 rows: the kernel's short tiles start at 64 or fewer), empty
 * groups, one group with every row, 1 and 256 groups. */
void
test_device_sizes_tiles (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint shape;

  if (device == NULL)
    return;

  for (shape = 0; shape < 6; shape++)
    {
      static const guint n_of[] = { 1, 3, 256, 4, 3, 5 };
      guint n = n_of[shape];
      gint64 k = shape == 2 ? 72 : 136, o = shape == 2 ? 56 : 264;
      GmlpDType dtype = shape % 2 ? GMLP_DTYPE_FLOAT16 : GMLP_DTYPE_BFLOAT16;
      GmlpLinearFlags flags = GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS;
      g_autofree gint64 *sizes = g_new0 (gint64, n);
      g_autoptr(GmlpGroupedLinear) layer = NULL;
      guint g;

      switch (shape)
        {
        case 0: sizes[0] = 301; break;
        case 1: sizes[0] = 129; sizes[2] = 77; break;
        case 2:
          for (g = 0; g < n; g++)
            sizes[g] = g_test_rand_int_range (0, 40);
          break;
        case 3: sizes[2] = 1000; break;
        case 4: sizes[0] = 63; sizes[1] = 65; sizes[2] = 192; break;
        default:
          for (g = 0; g < n; g++)
            sizes[g] = g_test_rand_int_range (0, 300);
          break;
        }
      layer = new_layer (device, n, k, o, dtype, flags);
      run_device_sizes (layer, sizes, sum_of_sizes (sizes, n) + (shape == 5 ? 100 : 0));
    }
}

/* Long reductions on the Hopper kernel's direct schedule (features
 * multiples of 128) with more output tiles than a few CTAs take in whole
 * waves: with the tuning's sm90-grid=6,sm90-stream-k=on (as
 * tests/kernels/test-sm90-gemm forces them on the kernel itself), the last
 * tiles' reductions are split across CTAs and their partial sums
 * added by another (TailSplit in kernels/impls/grouped_gemm_sm90.cuh),
 * FPROP 16 stages deep and DGRAD 6, with biases, empty groups and row
 * tiles of every length. On a whole GPU, and on the CPU, plain products. */
void
test_device_sizes_long_reduction (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  gint64 scale;
  guint round;

  if (device == NULL)
    return;
  scale = gmlp_device_get_kind (device) == GMLP_DEVICE_KIND_CPU ? 4 : 1;

  for (round = 0; round < 4; round++)
    {
      guint n = round < 2 ? 5 : 9, g;
      gint64 k = 1024 / scale, o = 384 / scale;
      GmlpDType dtype = round % 2 ? GMLP_DTYPE_FLOAT16 : GMLP_DTYPE_BFLOAT16;
      g_autofree gint64 *sizes = g_new0 (gint64, n);
      g_autoptr(GmlpGroupedLinear) layer = NULL;

      for (g = 0; g < n; g++)
        sizes[g] = g == 1 ? 0 : g_test_rand_int_range (1, 700 / (gint32) scale);
      g_test_message ("%s n=%u k=%" G_GINT64_FORMAT " o=%" G_GINT64_FORMAT, gmlp_dtype_get_name (dtype), n, k,
                      o);
      layer = new_layer (device, n, k, o, dtype, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS);
      run_device_sizes (layer, sizes, sum_of_sizes (sizes, n));
    }
}

/* Shapes the Hopper kernel takes on its direct schedule, without a plan
 * (rows of x, y, dy and dx whole multiples of 256 bytes: 16-bit features
 * multiples of 128): row tiles that reach into the next group, empty and
 * negative sizes, a capacity that cuts a group short or leaves rows over,
 * 1 group and 300 (the kernel scans the sizes 32 groups at a time); host
 * sizes too. */
void
test_device_sizes_direct (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  /* The features put the rows on the Hopper kernel's direct schedule (row
   * bytes whole multiples of 256); the CPU backend has no such schedule,
   * and a quarter of them keeps its suite quick under valgrind. */
  gint64 scale;
  guint shape;

  if (device == NULL)
    return;
  scale = gmlp_device_get_kind (device) == GMLP_DEVICE_KIND_CPU ? 4 : 1;

  for (shape = 0; shape < 6; shape++)
    {
      static const guint n_of[] = { 1, 5, 300, 6, 4, 40 };
      guint n = n_of[shape];
      gint64 k = (shape == 2 ? 128 : 256) / scale, o = (shape == 2 ? 256 : 384) / scale;
      GmlpDType dtype = shape % 2 ? GMLP_DTYPE_FLOAT16 : GMLP_DTYPE_BFLOAT16;
      GmlpLinearFlags flags = GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | (shape != 4 ? GMLP_LINEAR_BIAS : 0);
      static const gint64 sizes_1[] = { 129, 0, 77, -3, 256 };
      static const gint64 sizes_3[] = { 1000, 50, -3, 7, 130, 64 };
      static const gint64 sizes_4[] = { 100, 200, 300, 50 };
      g_autofree gint64 *sizes = g_new0 (gint64, n);
      g_autoptr(GmlpGroupedLinear) layer = NULL;
      gint64 capacity;
      guint g;

      switch (shape)
        {
        case 0: sizes[0] = 301; break;
        case 1: memcpy (sizes, sizes_1, sizeof sizes_1); break;
        case 3: memcpy (sizes, sizes_3, sizeof sizes_3); break;
        case 4: memcpy (sizes, sizes_4, sizeof sizes_4); break;
        default:
          for (g = 0; g < n; g++)
            sizes[g] = g_test_rand_int_range (0, shape == 2 ? 12 : 300);
          break;
        }
      /* Shape 3 cuts the first group at 600 rows, shape 4 the third at 50. */
      capacity = shape == 3 ? 600 : shape == 4 ? 350 :
                 sum_of_sizes (sizes, n) + (shape == 1 ? 50 : 0);
      g_test_message ("%s n=%u k=%" G_GINT64_FORMAT " o=%" G_GINT64_FORMAT " capacity=%" G_GINT64_FORMAT,
                      gmlp_dtype_get_name (dtype), n, k, o, capacity);
      layer = new_layer (device, n, k, o, dtype, flags);
      run_device_sizes (layer, sizes, capacity);
      /* The same sizes from the host, where they are all there is (the
       * kernel takes up to 512 groups' sizes in its parameters). */
      if (shape == 0 || shape == 2 || shape == 5)
        run_and_check (layer, sizes);
    }
}

/* On the same data, the device-sizes path gives the results of the
 * host-sizes path: the same bits on the CPU (the same arithmetic: with a
 * bias too, which both add to the FP32 product before its one rounding,
 * test_device_sizes_bias_rounding), within the dtype's tolerance on a GPU
 * (other kernels, another summation order). */
void
test_device_sizes_same_as_host (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint d;

  if (device == NULL)
    return;

  for (d = 0; d < G_N_ELEMENTS (layer_dtypes); d++)
    {
      const guint n = 6;
      GmlpDType dtype = layer_dtypes[d];
      g_autoptr(GmlpGroupedLinear) layer = new_layer (device, n, 40, 24, dtype,
                                                      GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS);
      g_autofree gint64 *rows = gmlp_test_random_rows (n, 50);
      g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, x_dev = NULL, dy_dev = NULL;
      g_autoptr(Problem) p = problem_new (layer, rows, &x, &dy);
      GBytes *host[4], *dev[4];
      const char *what[4] = { "fprop", "dgrad", "wgrad", "dbias" };
      guint pass, i;

      x_dev = g_object_ref (x);
      dy_dev = g_object_ref (dy);
      move_sizes_to_device (&x_dev, &dy_dev, rows, n, 5);

      for (pass = 0; pass < 2; pass++)
        {
          g_autoptr(GmlpGroupedTensor) y = NULL, dx = NULL;
          g_autoptr(GmlpSavedActivations) saved = NULL;
          g_autoptr(GError) error = NULL;

          y = gmlp_grouped_linear_forward (layer, pass == 0 ? x : x_dev, &saved, &error);
          g_assert_no_error (error);
          dx = gmlp_grouped_linear_backward (layer, saved, pass == 0 ? dy : dy_dev, &error);
          g_assert_no_error (error);
          g_assert_true (gmlp_grouped_tensor_has_host_sizes (dx) == (pass == 0));
          gmlp_test_step_bytes (layer, y, dx, pass == 0 ? host : dev);
        }

      for (i = 0; i < 4; i++)
        {
          gsize len = g_bytes_get_size (host[i]) / gmlp_dtype_get_size (dtype), j;
          g_autofree double *h = g_new (double, MAX (len, 1));
          g_autofree double *v = g_new (double, MAX (len, 1));

          g_assert_cmpuint (g_bytes_get_size (dev[i]), ==, g_bytes_get_size (host[i]));
          if (on_cpu (device))
            g_assert_true (g_bytes_equal (host[i], dev[i]));
          for (j = 0; j < len; j++)
            {
              h[j] = gmlp_test_decode (g_bytes_get_data (host[i], NULL), dtype, j);
              v[j] = gmlp_test_decode (g_bytes_get_data (dev[i], NULL), dtype, j);
            }
          gmlp_test_assert_close (v, h, len, gmlp_test_tolerance (dtype), what[i]);
          g_bytes_unref (host[i]);
          g_bytes_unref (dev[i]);
        }
    }
}

/* Bias gradients whose sums cancel: one output column, each group's last
 * row of dy the negated sum of the others (rounded to FP32), so that db is
 * a few ulps of the terms. The FP32 sum is then off by much of db itself,
 * which a tolerance relative to |db| refuses, but by no more than
 * γ_m Σ |dy|, check_dbias()'s bound (what once made "dbias (device sizes)"
 * fail, 4.2e-5 against 2e-5, by chance). Host sizes and device sizes. */
void
test_dbias_cancellation (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint pass;

  if (device == NULL)
    return;

  for (pass = 0; pass < 2; pass++)
    {
      const guint n = 3;
      gint64 rows[] = { 70, 41, 9 };
      g_autoptr(GmlpGroupedLinear) layer = new_layer (device, n, 8, 1, GMLP_DTYPE_FLOAT32,
                                                      GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS);
      g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, y = NULL, dx = NULL;
      g_autoptr(GmlpSavedActivations) saved = NULL;
      g_autoptr(GBytes) bytes = NULL;
      g_autoptr(GError) error = NULL;
      g_autoptr(Problem) p = problem_new (layer, rows, &x, &dy);
      gint64 r0 = 0, r;
      guint g;

      for (g = 0; g < n; r0 += rows[g], g++)
        {
          double sum = 0.0;

          for (r = r0; r < r0 + rows[g] - 1; r++)
            sum += p->dy[r];
          p->dy[r0 + rows[g] - 1] = (float) -sum;
        }
      problem_reference (p);
      g_clear_object (&dy);
      bytes = encode_values (p->dy, p->total, GMLP_DTYPE_FLOAT32);
      dy = gmlp_grouped_tensor_new_from_bytes (device, GMLP_DTYPE_FLOAT32, rows, n, 1, bytes, &error);
      g_assert_no_error (error);
      if (pass == 1)
        move_sizes_to_device (&x, &dy, rows, n, 4);

      y = gmlp_grouped_linear_forward (layer, x, &saved, &error);
      g_assert_no_error (error);
      dx = gmlp_grouped_linear_backward (layer, saved, dy, &error);
      g_assert_no_error (error);
      for (g = 0; g < n; g++)
        g_test_message ("%s sizes, group %u: db %.3g, Σ |dy| %.3g", pass ? "device" : "host", g,
                        p->db[g], p->db_abs[g]);
      check_dbias (gmlp_grouped_linear_get_bgrad (layer), p, pass ? "dbias (device sizes)" : "dbias");
    }
}

/* A 16-bit FPROP with a bias, device sizes (and host sizes on the CPU),
 * against float64: one rounding after the bias. The data make the bias cancel the product: each group's
 * tokens are one token x_g with one element moved by a few steps of the
 * dtype, and the bias is minus x_g's product rounded to the dtype, so that
 * y is a fraction of an ulp of the product. Rounded once, y is within
 * u |y| of the exact value, plus the FP32 sum's error (γ_{k+1} of the
 * magnitudes, twice for the slack); rounded to the dtype before the bias
 * is added, the product loses up to half its ulp, which is most of y. */
void
test_device_sizes_bias_rounding (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  static const GmlpDType dtypes[] = { GMLP_DTYPE_BFLOAT16, GMLP_DTYPE_FLOAT16 };
  guint d;

  if (device == NULL)
    return;

  for (d = 0; d < G_N_ELEMENTS (dtypes); d++)
    {
      const guint n = 4;
      const gint64 k = 48, o = 40;
      GmlpDType dtype = dtypes[d];
      gint64 rows[] = { 7, 0, 19, 12 };
      gint64 total = 38, capacity = total + 9, r0 = 0, r, j, c;
      g_autoptr(GmlpGroupedLinear) layer = new_layer (device, n, k, o, dtype,
                                                      GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS);
      g_autofree double *w = g_new (double, n * o * k), *b = g_new (double, n * o);
      g_autofree double *x = g_new (double, total * k), *want = g_new (double, total * o);
      g_autofree double *mag = g_new (double, total * o);
      g_autoptr(GBytes) wb = NULL, bb = NULL, xb = NULL;
      g_autoptr(GmlpGroupedTensor) x_host = NULL, x_dev = NULL, sizes = NULL;
      g_autoptr(GError) error = NULL;
      double u = unit_roundoff (dtype);
      guint g, pass;
      gsize i;

      for (i = 0; i < (gsize) (n * o * k); i++)
        w[i] = gmlp_test_round (g_test_rand_double_range (-1.0, 1.0), dtype);
      for (g = 0; g < n; r0 += rows[g], g++)
        {
          double base[48];

          for (c = 0; c < k; c++)
            base[c] = gmlp_test_round (g_test_rand_double_range (1.0, 2.0), dtype);
          /* b = −(x_g W_gᵀ) rounded as the dtype stores it. */
          for (j = 0; j < o; j++)
            {
              double acc = 0.0;

              for (c = 0; c < k; c++)
                acc += base[c] * w[(g * o + j) * k + c];
              b[g * o + j] = -gmlp_test_round (acc, dtype);
            }
          for (r = r0; r < r0 + rows[g]; r++)
            {
              double *moved = &x[r * k + (r - r0) % k];

              memcpy (x + r * k, base, sizeof (double) * k);
              /* Steps of the dtype in [1, 2): 2u each (rounded: past 2
               * the steps are twice as long). */
              *moved = gmlp_test_round (*moved + 2.0 * u * g_test_rand_int_range (-3, 4), dtype);
            }
        }
      r0 = 0;
      for (g = 0; g < n; r0 += rows[g], g++)
        for (r = r0; r < r0 + rows[g]; r++)
          for (j = 0; j < o; j++)
            {
              double acc = b[g * o + j], m = fabs (b[g * o + j]);

              for (c = 0; c < k; c++)
                {
                  acc += x[r * k + c] * w[(g * o + j) * k + c];
                  m += fabs (x[r * k + c] * w[(g * o + j) * k + c]);
                }
              want[r * o + j] = acc;
              mag[r * o + j] = m;
            }

      wb = encode_values (w, n * o * k, dtype);
      g_assert_true (gmlp_grouped_linear_set_weight_from_bytes (layer, wb, &error));
      g_assert_no_error (error);
      bb = encode_values (b, n * o, dtype);
      g_assert_true (gmlp_grouped_linear_set_bias_from_bytes (layer, bb, &error));
      g_assert_no_error (error);
      xb = encode_values (x, total * k, dtype);
      x_host = gmlp_grouped_tensor_new_from_bytes (device, dtype, rows, n, k, xb, &error);
      g_assert_no_error (error);
      sizes = sizes_tensor (device, rows, n);
      x_dev = gmlp_test_device_sized_copy (x_host, sizes, capacity);

      /* Device sizes; then host sizes on the CPU, and on a GPU where the
       * Hopper kernel takes them (the default tuning), which add the bias
       * before the one rounding too (cuBLAS adds it to the stored
       * product). */
      for (pass = 0; pass < (on_cpu (device) || g_getenv ("GMLP_TEST_TUNING") == NULL ? 2 : 1); pass++)
        {
          g_autoptr(GmlpGroupedTensor) y = NULL, y_view = NULL;
          g_autofree double *got = NULL;
          const char *where = pass == 0 ? "device" : "host";
          double worst = 0.0;
          gsize len, e, off = 0;

          y = gmlp_grouped_linear_forward (layer, pass == 0 ? x_dev : x_host, NULL, &error);
          g_assert_no_error (error);
          y_view = pass == 0 ? gmlp_test_host_view (y, rows) : g_object_ref (y);
          got = gmlp_test_download (y_view, &len);
          g_assert_cmpuint (len, ==, total * o);
          for (e = 0; e < len; e++)
            {
              double bound = u * fabs (want[e]) + 2.0 * gamma32 (k + 1) * mag[e];
              double err = fabs (got[e] - want[e]);

              /* The test means something: y is small against its parts. */
              g_assert_cmpfloat (fabs (want[e]), <, 0.05 * mag[e]);
              worst = MAX (worst, err / bound);
              if (err > bound)
                off++;
            }
          g_test_message ("%s, %s sizes: %" G_GSIZE_FORMAT " of %" G_GSIZE_FORMAT " outside u |y| + "
                          "2 γ Σ |terms|, worst %.3g times it", gmlp_dtype_get_name (dtype), where, off,
                          len, worst);
          if (off > 0)
            g_error ("%s fprop with a bias and %s sizes: %" G_GSIZE_FORMAT " of %" G_GSIZE_FORMAT
                     " elements off by more than one rounding, the worst %.3g times the bound",
                     gmlp_dtype_get_name (dtype), where, off, len, worst);
        }
    }
}

void
test_device_sizes_contract (void)
{
  run_contract (TRUE);
}

void
test_device_sizes_microbatches (void)
{
  run_microbatches (TRUE);
}

/* Host sizes on one side and device sizes on the other, another row
 * capacity, another number of groups: an error, nothing written or
 * allocated, and the saved activations still usable. */
void
test_device_sizes_bad_input (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpGroupedLinear) layer = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, x_dev = NULL, dy_dev = NULL, dy_cap = NULL;
  g_autoptr(GmlpGroupedTensor) sizes = NULL, sizes3 = NULL, x3 = NULL, dy_wide = NULL;
  g_autoptr(GmlpGroupedTensor) y = NULL, y_dev = NULL, dx = NULL, dx_dev = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL, saved_dev = NULL;
  g_autoptr(GError) error = NULL;
  g_autoptr(Problem) p = NULL;
  gint64 rows[] = { 5, 0, 3, 2 };
  guint64 in_use;

  if (device == NULL)
    return;

  layer = new_layer (device, 4, 16, 8, GMLP_DTYPE_FLOAT32, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS);
  p = problem_new (layer, rows, &x, &dy);
  sizes = sizes_tensor (device, rows, 4);
  sizes3 = sizes_tensor (device, rows, 3);
  x_dev = gmlp_test_device_sized_copy (x, sizes, 12);
  dy_dev = gmlp_test_device_sized_copy (dy, sizes, 12);
  dy_cap = gmlp_test_device_sized_copy (dy, sizes, 13);
  x3 = gmlp_grouped_tensor_new_with_device_sizes (device, GMLP_DTYPE_FLOAT32, sizes3, 12, 16, &error);
  g_assert_no_error (error);
  dy_wide = gmlp_grouped_tensor_new_with_device_sizes (device, GMLP_DTYPE_FLOAT32, sizes, 12, 9, &error);
  g_assert_no_error (error);

  y = gmlp_grouped_linear_forward (layer, x, &saved, &error);
  g_assert_no_error (error);
  y_dev = gmlp_grouped_linear_forward (layer, x_dev, &saved_dev, &error);
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

  EXPECT_NULL (gmlp_grouped_linear_forward (layer, x3, &_s, &_e), GMLP_ERROR_SHAPE_MISMATCH);
  EXPECT_NULL (gmlp_grouped_linear_backward (layer, saved, dy_dev, &_e), GMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_NULL (gmlp_grouped_linear_backward (layer, saved_dev, dy, &_e), GMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_NULL (gmlp_grouped_linear_backward (layer, saved_dev, dy_cap, &_e), GMLP_ERROR_SHAPE_MISMATCH);
  EXPECT_NULL (gmlp_grouped_linear_backward (layer, saved_dev, dy_wide, &_e), GMLP_ERROR_SHAPE_MISMATCH);
#undef EXPECT_NULL

  g_assert_false (gmlp_saved_activations_is_consumed (saved));
  g_assert_false (gmlp_saved_activations_is_consumed (saved_dev));
  g_assert_null (gmlp_grouped_linear_get_wgrad (layer));

  /* Then both work. */
  dx_dev = gmlp_grouped_linear_backward (layer, saved_dev, dy_dev, &error);
  g_assert_no_error (error);
  check_output (dx_dev, p->dx, p, 16, "dgrad (device sizes)");
  check_per_group (gmlp_grouped_linear_get_wgrad (layer), p->dw, p, 8 * 16, 2e-5, "wgrad (device sizes)");
  check_dbias (gmlp_grouped_linear_get_bgrad (layer), p, "dbias (device sizes)");
  dx = gmlp_grouped_linear_backward (layer, saved, dy, &error);
  g_assert_no_error (error);
  check_output (dx, p->dx, p, 16, "dgrad");
}

/* Saved activations with device sizes offload and reload their whole
 * allocation, and backward computes from the reloaded copy. */
void
test_device_sizes_offload (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpOffloadContext) ctx = NULL;
  g_autoptr(GmlpGroupedLinear) layer = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, y = NULL, dx = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GError) error = NULL;
  g_autoptr(Problem) p = NULL;
  gint64 rows[] = { 9, 0, 14, 3 };

  if (device == NULL)
    return;

  layer = new_layer (device, 4, 24, 16, GMLP_DTYPE_FLOAT32,
                     GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS);
  p = problem_new (layer, rows, &x, &dy);
  move_sizes_to_device (&x, &dy, rows, 4, 5);
  ctx = gmlp_offload_context_new (device, &error);
  g_assert_no_error (error);

  gmlp_offload_context_push_thread_default (ctx, TRUE);
  y = gmlp_grouped_linear_forward (layer, x, &saved, &error);
  g_assert_true (gmlp_offload_context_pop_thread_default (ctx, NULL));
  g_assert_no_error (error);
  check_output (y, p->y, p, 16, "fprop (device sizes, offloaded)");

  g_assert_true (gmlp_saved_activations_get_offload (saved));
  gmlp_offload_context_flush (ctx);
  g_assert_cmpuint (gmlp_saved_activations_get_nbytes (saved), ==, 0);
  g_assert_cmpuint (gmlp_saved_activations_get_host_nbytes (saved), ==, gmlp_grouped_tensor_get_nbytes (x));

  /* The caller's input changes, behind libgmlp's back (as through DLPack,
   * so that its version does not change): backward must use the offloaded
   * copy. */
  g_assert_true (gmlp_device_synchronize (device, NULL));
  g_assert_true (GMLP_DEVICE_CALL (device, fill_bytes, gmlp_grouped_tensor_get_data (x), 0,
                                   gmlp_grouped_tensor_get_nbytes (x), NULL));

  dx = gmlp_grouped_linear_backward (layer, saved, dy, &error);
  g_assert_no_error (error);
  g_assert_false (gmlp_grouped_tensor_has_host_sizes (dx));
  check_output (dx, p->dx, p, 24, "dgrad (device sizes, reloaded)");
  check_per_group (gmlp_grouped_linear_get_wgrad (layer), p->dw, p, 16 * 24, 2e-5, "wgrad (reloaded)");
  check_dbias (gmlp_grouped_linear_get_bgrad (layer), p, "dbias (reloaded)");
}
