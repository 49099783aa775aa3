/* test-quantizer.c: GmlpQuantizer against float64 references
 *
 * The reference (test-quantizer-check.c) models each recipe from its documented formulas
 * (docs/fp8.md) in float64, independently of the library's arithmetic:
 * amax, the scale (rounded to FP32 where the library keeps FP32), each
 * element as fp8 (fl32 (x × scale)), the scale inverses and dequantization.
 * Quantization is deterministic, so the comparisons are exact; the
 * dequantized values are also held to the FP8 error bound.
 *
 * This file has the tests of the recipes, special values, device sizes,
 * the columnwise copy and main(); the other tests are in the files that
 * test-quantizer.h lists.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "test-quantizer.h"

/* Every recipe and role, with and without the columnwise copy, from each
 * source dtype: shapes over several 128 × 128 tiles, columns that are not a
 * multiple of any block, and empty groups; and (iter 2) columns a multiple
 * of 8 and rows a multiple of 16, which the GPU moves 16 bytes at a time. */
static void
test_recipes (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint a, b, col, iter;

  if (device == NULL)
    return;

  for (a = 0; a < G_N_ELEMENTS (all_recipes); a++)
    for (b = 0; b < G_N_ELEMENTS (all_roles); b++)
      for (col = 0; col < 2; col++)
        for (iter = 0; iter < 3; iter++)
          {
            Config c = random_config (all_recipes[a], all_roles[b], col);
            GmlpDType src_dtype = source_dtypes[g_test_rand_int_range (0, 3)];
            guint n = g_test_rand_int_range (1, 5);
            gint64 k = iter == 0 ? g_test_rand_int_range (1, 40) :
                       iter == 1 ? g_test_rand_int_range (100, 300) : 8 * g_test_rand_int_range (13, 40);
            g_autofree gint64 *rows = gmlp_test_random_rows (n, iter == 0 ? 20 : 260);
            double spread = ldexp (1.0, g_test_rand_int_range (-20, 20));
            g_autofree double *x = NULL, *delayed = ones (n);
            g_autoptr(GmlpQuantizer) quantizer = config_quantizer (device, &c);
            g_autoptr(GmlpGroupedTensor) src = NULL;
            g_autoptr(GmlpGroupedTensor) q = NULL;
            g_autoptr(GError) error = NULL;
            guint g;

            if (iter == 2)
              for (g = 0; g < n; g++)
                rows[g] -= rows[g] % 16;
            src = random_source (device, src_dtype, rows, n, k, spread, FALSE, &x);

            g_test_message ("recipe %d role %d format %d pow2 %d columnwise %d from %s: %u groups × %"
                            G_GINT64_FORMAT " cols", c.recipe, c.role, c.format, c.pow2, c.columnwise,
                            gmlp_dtype_get_name (src_dtype), n, k);
            g_assert_cmpint (gmlp_quantizer_get_dtype (quantizer), ==, config_dtype (&c));
            q = gmlp_quantizer_quantize (quantizer, src, &error);
            g_assert_no_error (error);
            check_quantized (q, &c, x, rows, n, k, delayed);
          }
}

/* NaN, ±Inf, values past the FP8 range, subnormals, zero groups and blocks,
 * groups holding only NaN or Inf: exact against the reference, and the
 * documented special cases checked by name. */
static void
test_specials (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint a, b, iter;

  if (device == NULL)
    return;

  for (a = 0; a < G_N_ELEMENTS (all_recipes); a++)
    for (b = 0; b < G_N_ELEMENTS (all_roles); b++)
      for (iter = 0; iter < 3; iter++)
        {
          Config c = random_config (all_recipes[a], all_roles[b], TRUE);
          GmlpDType src_dtype = source_dtypes[iter];
          guint n = 5;
          gint64 k = g_test_rand_int_range (20, 150);
          gint64 rows[5] = { g_test_rand_int_range (1, 140), 0, 3, 2, 2 };
          g_autoptr(GBytes) bytes = NULL;
          g_autofree double *x = NULL, *delayed = ones (n);
          g_autofree guint8 *raw = NULL;
          g_autoptr(GmlpQuantizer) quantizer = config_quantizer (device, &c);
          g_autoptr(GmlpGroupedTensor) src = NULL;
          g_autoptr(GmlpGroupedTensor) q = NULL;
          g_autoptr(GError) error = NULL;
          gsize esize = gmlp_dtype_get_size (src_dtype), count, first, i;
          gint64 total = 0;
          guint g;

          for (g = 0; g < n; g++)
            total += rows[g];
          count = (gsize) total * k;
          bytes = gmlp_test_random_bytes (src_dtype, count, 1.0, TRUE);
          raw = g_memdup2 (g_bytes_get_data (bytes, NULL), count * esize);
          g_clear_pointer (&bytes, g_bytes_unref);

          /* Group 2 all zeros, group 3 all NaN, group 4 ±Inf and zeros. */
          first = (gsize) (rows[0] + rows[1]) * k;
          memset (raw + first * esize, 0, (gsize) rows[2] * k * esize);
          first += (gsize) rows[2] * k;
          for (i = first; i < first + (gsize) (rows[3] + rows[4]) * k; i++)
            {
              gboolean nan = i < first + (gsize) rows[3] * k;
              float v = nan ? NAN : (i % 3 == 0 ? INFINITY : i % 3 == 1 ? -INFINITY : 0.0f);

              switch (src_dtype)
                {
                case GMLP_DTYPE_FLOAT32: ((float *) raw)[i] = v; break;
                case GMLP_DTYPE_FLOAT16: ((guint16 *) raw)[i] = gmlp_dtype_float_to_half (v); break;
                default: ((guint16 *) raw)[i] = gmlp_dtype_float_to_bfloat16 (v); break;
                }
            }
          bytes = g_bytes_new (raw, count * esize);
          src = gmlp_grouped_tensor_new_from_bytes (device, src_dtype, rows, n, k, bytes, &error);
          g_assert_no_error (error);
          x = g_new (double, count);
          for (i = 0; i < count; i++)
            x[i] = gmlp_test_decode (raw, src_dtype, i);

          q = gmlp_quantizer_quantize (quantizer, src, &error);
          g_assert_no_error (error);
          check_quantized (q, &c, x, rows, n, k, delayed);

          /* By name: a zero group has the scale 1 (not Inf, not NaN) and
           * zeros; NaN keeps its sign in the byte 0x7f. */
          {
            g_autoptr(GBytes) data = download (q);
            g_autoptr(GBytes) scales = download (gmlp_grouped_tensor_get_scale_inv (q));
            const guint8 *d = g_bytes_get_data (data, NULL);
            gsize zero_first = (gsize) (rows[0] + rows[1]) * k;

            for (i = zero_first; i < zero_first + (gsize) rows[2] * k; i++)
              g_assert_cmpuint (d[i] & 0x7f, ==, 0);
            for (i = 0; i < count; i++)
              if (isnan (x[i]))
                g_assert_cmpuint (d[i], ==, (signbit (x[i]) ? 0x80 : 0) | 0x7f);
            if (c.recipe == GMLP_SCALING_RECIPE_CURRENT)
              g_assert_cmpfloat (((const float *) g_bytes_get_data (scales, NULL))[2], ==, 1.0f);
          }
        }
}

/* Nothing but empty groups, and tensors of zeros: every per-tensor scale is
 * written (1), nothing else is. */
static void
test_empty_and_zero (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint a, b;

  if (device == NULL)
    return;

  for (a = 0; a < G_N_ELEMENTS (all_recipes); a++)
    for (b = 0; b < G_N_ELEMENTS (all_roles); b++)
      {
        Config c = random_config (all_recipes[a], all_roles[b], TRUE);
        gint64 empty[] = { 0, 0, 0 }, some[] = { 130, 0, 7 };
        g_autoptr(GmlpQuantizer) quantizer = config_quantizer (device, &c);
        g_autoptr(GmlpGroupedTensor) e = gmlp_grouped_tensor_new (device, GMLP_DTYPE_BFLOAT16, empty, 3, 200, NULL);
        g_autoptr(GmlpGroupedTensor) z = gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, some, 3, 45, NULL);
        g_autoptr(GmlpGroupedTensor) qe = NULL, qz = NULL, de = NULL;
        g_autoptr(GError) error = NULL;
        g_autofree double *zeros = g_new0 (double, 137 * 45), *delayed = ones (3);

        qe = gmlp_quantizer_quantize (quantizer, e, &error);
        g_assert_no_error (error);
        check_quantized (qe, &c, zeros, empty, 3, 200, delayed);
        de = gmlp_grouped_tensor_dequantize (qe, GMLP_DTYPE_FLOAT32, &error);
        g_assert_no_error (error);
        g_assert_cmpint (gmlp_grouped_tensor_get_total_rows (de), ==, 0);

        g_assert_true (gmlp_grouped_tensor_fill_zero (z, NULL));
        qz = gmlp_quantizer_quantize (quantizer, z, &error);
        g_assert_no_error (error);
        check_quantized (qz, &c, zeros, some, 3, 45, delayed);
      }
}

GmlpGroupedTensor *
sizes_tensor (GmlpDevice *device, const gint64 *rows, guint n)
{
  g_autoptr(GBytes) bytes = g_bytes_new (rows, n * sizeof (gint64));
  gint64 len = n;
  GmlpGroupedTensor *t = gmlp_grouped_tensor_new_from_bytes (device, GMLP_DTYPE_INT64, &len, 1, 1,
                                                             bytes, NULL);
  g_assert_nonnull (t);
  return t;
}

static void
check_device_sizes_of (GmlpGroupedTensor *t,
                       const gint64      *want,
                       guint              n)
{
  g_autoptr(GError) error = NULL;
  g_autofree gint64 *got = NULL;
  guint n_got;

  if (gmlp_grouped_tensor_has_host_sizes (t))
    return;
  got = gmlp_grouped_tensor_read_sizes (t, &n_got, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (n_got, ==, n);
  g_assert_cmpmem (got, n * sizeof (gint64), want, n * sizeof (gint64));
}

/* With the group sizes only on the device (and some past the capacity), the
 * outputs are those of the same tensor with host sizes, the scale tensors
 * have device sizes too (derived ones where their rows are blocks). */
static void
test_device_sizes (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint a, b;

  if (device == NULL)
    return;

  for (a = 0; a < G_N_ELEMENTS (all_recipes); a++)
    for (b = 0; b < G_N_ELEMENTS (all_roles); b++)
      {
        Config c = random_config (all_recipes[a], all_roles[b], TRUE);
        guint n = g_test_rand_int_range (1, 7), g;
        gint64 k = g_test_rand_int_range (1, 200);
        g_autofree gint64 *rows = gmlp_test_random_rows (n, 200);
        g_autofree gint64 *clamped = g_memdup2 (rows, n * sizeof (gint64));
        g_autofree gint64 *blocked = g_new (gint64, n);
        gint64 total = 0, capacity, left, br, bc, cbr, cbc;
        g_autoptr(GmlpGroupedTensor) sizes = sizes_tensor (device, rows, n);
        g_autoptr(GmlpGroupedTensor) t = NULL, host_t = NULL, q = NULL, host_q = NULL;
        g_autoptr(GmlpQuantizer) quantizer = config_quantizer (device, &c);
        g_autoptr(GmlpQuantizer) host_quantizer = config_quantizer (device, &c);
        g_autoptr(GBytes) src_bytes = NULL;
        g_autoptr(GError) error = NULL;
        g_autofree double *x = NULL, *delayed = ones (n);
        gsize i, count;

        for (g = 0; g < n; g++)
          total += rows[g];
        capacity = b == 2 && total > 1 ? total / 2 : total + g_test_rand_int_range (0, 300);
        for (g = 0, left = capacity; g < n; g++)
          {
            clamped[g] = MIN (rows[g], left);
            left -= clamped[g];
          }

        t = gmlp_grouped_tensor_new_with_device_sizes (device, GMLP_DTYPE_BFLOAT16, sizes, capacity, k, &error);
        g_assert_no_error (error);
        host_t = gmlp_grouped_tensor_new (device, GMLP_DTYPE_BFLOAT16, clamped, n, k, &error);
        g_assert_no_error (error);
        g_assert_true (gmlp_grouped_tensor_fill_random (t, 7 + a, 100.0, NULL));
        g_assert_true (gmlp_grouped_tensor_fill_random (host_t, 7 + a, 100.0, NULL));
        src_bytes = download (host_t);
        count = g_bytes_get_size (src_bytes) / 2;
        x = g_new (double, MAX (count, 1));
        for (i = 0; i < count; i++)
          x[i] = gmlp_test_decode (g_bytes_get_data (src_bytes, NULL), GMLP_DTYPE_BFLOAT16, i);

        q = gmlp_quantizer_quantize (quantizer, t, &error);
        g_assert_no_error (error);
        host_q = gmlp_quantizer_quantize (host_quantizer, host_t, &error);
        g_assert_no_error (error);
        g_assert_false (gmlp_grouped_tensor_has_host_sizes (q));

        /* The same values as with host sizes, and the reference. */
        {
          g_autoptr(GBytes) got = download (q), want = download (host_q);
          assert_bytes_equal (got, want, "data");
        }
        check_quantized (q, &c, x, clamped, n, k, delayed);

        config_blocks (&c, FALSE, &br, &bc);
        config_blocks (&c, TRUE, &cbr, &cbc);
        for (g = 0; g < n; g++)
          blocked[g] = br > 1 ? blocks_along (clamped[g], br) : clamped[g];
        if (br != 0)
          check_device_sizes_of (gmlp_grouped_tensor_get_scale_inv (q), br > 1 ? blocked : rows, n);
        if (cbr > 1)
          {
            for (g = 0; g < n; g++)
              blocked[g] = blocks_along (clamped[g], cbr);
            check_device_sizes_of (gmlp_grouped_tensor_get_scale_inv (gmlp_grouped_tensor_get_columnwise (q)),
                                   blocked, n);
          }
      }
}

/* The columnwise copy: for per-tensor scales and 128 × 128 tiles, the bytes
 * are the transpose of the rowwise ones; for 1 × 128 and 1 × 32 blocks,
 * each member is exactly what quantizing the transposed member rowwise
 * gives, with the transposed scale grid. */
static void
test_columnwise (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint a, b;

  if (device == NULL)
    return;

  for (a = 0; a < G_N_ELEMENTS (all_recipes); a++)
    for (b = 0; b < G_N_ELEMENTS (all_roles); b++)
      {
        Config c = random_config (all_recipes[a], all_roles[b], TRUE);
        guint n = 3, g;
        gint64 k = g_test_rand_int_range (1, 260);
        gint64 rows[3] = { g_test_rand_int_range (1, 300), 0, g_test_rand_int_range (1, 40) };
        g_autofree double *x = NULL;
        g_autoptr(GmlpQuantizer) quantizer = config_quantizer (device, &c);
        g_autoptr(GmlpGroupedTensor) src = random_source (device, GMLP_DTYPE_FLOAT32, rows, n, k, 3.0, FALSE, &x);
        g_autoptr(GmlpGroupedTensor) q = NULL;
        g_autoptr(GBytes) row_bytes = NULL, col_bytes = NULL;
        g_autoptr(GError) error = NULL;
        const guint8 *rb, *cb;
        gint64 br, bc, cbr, cbc;
        gsize base = 0;

        q = gmlp_quantizer_quantize (quantizer, src, &error);
        g_assert_no_error (error);
        row_bytes = download (q);
        col_bytes = download (gmlp_grouped_tensor_get_columnwise (q));
        rb = g_bytes_get_data (row_bytes, NULL);
        cb = g_bytes_get_data (col_bytes, NULL);
        config_blocks (&c, FALSE, &br, &bc);
        config_blocks (&c, TRUE, &cbr, &cbc);

        for (g = 0; g < n; g++)
          {
            gint64 m = rows[g], r, col;

            if (br == cbr && bc == cbc)
              {
                for (r = 0; r < m; r++)
                  for (col = 0; col < k; col++)
                    g_assert_cmpuint (cb[base + col * m + r], ==, rb[base + r * k + col]);
              }
            else if (m > 0)
              {
                /* The transposed member as a tensor of its own, quantized
                 * rowwise by an input quantizer of the recipe. */
                Config tc = c;
                g_autofree float *xt = g_new (float, m * k);
                g_autoptr(GBytes) xt_bytes = NULL, qt_bytes = NULL, st_bytes = NULL, cs_bytes = NULL;
                g_autoptr(GmlpGroupedTensor) t = NULL, qt = NULL;
                g_autoptr(GmlpQuantizer) tq = NULL;
                gsize scale_size = c.recipe == GMLP_SCALING_RECIPE_MXFP8 ? 1 : 4;
                gint64 nt = blocks_along (m, cbr);
                const guint8 *st, *cs;
                gsize cs_base = 0;
                guint j, t_idx;

                for (r = 0; r < m; r++)
                  for (col = 0; col < k; col++)
                    xt[col * m + r] = (float) x[base + r * k + col];
                xt_bytes = g_bytes_new (xt, sizeof (float) * m * k);
                t = gmlp_grouped_tensor_new_from_bytes (device, GMLP_DTYPE_FLOAT32, &k, 1, m, xt_bytes, &error);
                g_assert_no_error (error);
                tc.role = GMLP_QUANTIZER_ROLE_INPUT;
                tc.format = config_dtype (&c) == GMLP_DTYPE_FLOAT8_E5M2 ? GMLP_FP8_FORMAT_E5M2
                                                                        : GMLP_FP8_FORMAT_E4M3;
                tc.columnwise = FALSE;
                tq = config_quantizer (device, &tc);
                qt = gmlp_quantizer_quantize (tq, t, &error);
                g_assert_no_error (error);
                qt_bytes = download (qt);
                g_assert_cmpmem (g_bytes_get_data (qt_bytes, NULL), m * k, cb + base, m * k);

                /* Its scales, [col][tile], are the copy's, [tile][col]. */
                st_bytes = download (gmlp_grouped_tensor_get_scale_inv (qt));
                cs_bytes = download (gmlp_grouped_tensor_get_scale_inv (gmlp_grouped_tensor_get_columnwise (q)));
                st = g_bytes_get_data (st_bytes, NULL);
                cs = g_bytes_get_data (cs_bytes, NULL);
                for (j = 0; j < g; j++)
                  cs_base += (gsize) blocks_along (rows[j], cbr) * k * scale_size;
                for (col = 0; col < k; col++)
                  for (t_idx = 0; t_idx < nt; t_idx++)
                    g_assert_cmpmem (st + ((gsize) col * nt + t_idx) * scale_size, scale_size,
                                     cs + cs_base + ((gsize) t_idx * k + col) * scale_size, scale_size);
              }
            base += (gsize) (m * k);
          }
      }
}

int
main (int argc, char *argv[])
{
  setlocale (LC_ALL, "");
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Gmlp/Quantizer/recipes", test_recipes);
  g_test_add_func ("/Gmlp/Quantizer/specials", test_specials);
  g_test_add_func ("/Gmlp/Quantizer/empty-and-zero", test_empty_and_zero);
  g_test_add_func ("/Gmlp/Quantizer/device-sizes", test_device_sizes);
  g_test_add_func ("/Gmlp/Quantizer/columnwise", test_columnwise);
  g_test_add_func ("/Gmlp/Quantizer/delayed", test_delayed);
  g_test_add_func ("/Gmlp/Quantizer/state", test_state);
  g_test_add_func ("/Gmlp/Quantizer/power-of-2", test_power_of_2);
  g_test_add_func ("/Gmlp/Quantizer/bad-input", test_bad_input);
  g_test_add_func ("/Gmlp/Quantizer/properties", test_properties);
  g_test_add_func ("/Gmlp/Quantizer/cpu-gpu-identical", test_cpu_gpu_identical);
  g_test_add_func ("/Gmlp/Quantizer/convert", test_convert);
  g_test_add_func ("/Gmlp/Quantizer/state-range", test_state_range);

  return g_test_run ();
}
