/* test-quantizer-calls.c: GmlpQuantizer's calls
 *
 * Bad input, conversion of quantized tensors, the state's valid range,
 * properties, and the same bits on the CPU and the GPU.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "test-quantizer.h"

/* Errors before anything is written or allocated. */
void
test_bad_input (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  gint64 rows[] = { 3, 4 }, three[] = { 1, 1, 1 };
  g_autoptr(GmlpQuantizer) delayed = NULL, current = NULL, blockwise = NULL;
  g_autoptr(GmlpGroupedTensor) f32 = NULL, i32 = NULL, e4m3 = NULL, t3 = NULL, q = NULL, qb = NULL;
  g_autoptr(GmlpGroupedTensor) view = NULL;
  g_autoptr(GVariant) state_before = NULL, state_after = NULL;
  g_autoptr(GError) error = NULL;
  guint64 in_use;

  if (device == NULL)
    return;

  delayed = gmlp_quantizer_new (device, GMLP_SCALING_RECIPE_DELAYED, GMLP_FP8_FORMAT_HYBRID,
                                GMLP_QUANTIZER_ROLE_INPUT);
  current = gmlp_quantizer_new (device, GMLP_SCALING_RECIPE_CURRENT, GMLP_FP8_FORMAT_HYBRID,
                                GMLP_QUANTIZER_ROLE_INPUT);
  blockwise = gmlp_quantizer_new (device, GMLP_SCALING_RECIPE_BLOCKWISE, GMLP_FP8_FORMAT_HYBRID,
                                  GMLP_QUANTIZER_ROLE_INPUT);
  gmlp_quantizer_set_columnwise (current, TRUE);
  f32 = gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, rows, 2, 8, NULL);
  g_assert_true (gmlp_grouped_tensor_fill_random (f32, 3, 1.0, NULL));
  i32 = gmlp_grouped_tensor_new (device, GMLP_DTYPE_INT32, rows, 2, 8, NULL);
  e4m3 = gmlp_grouped_tensor_convert (f32, GMLP_DTYPE_FLOAT8_E4M3, NULL);
  t3 = gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, three, 3, 8, NULL);
  q = gmlp_quantizer_quantize (current, f32, &error);
  g_assert_no_error (error);
  qb = gmlp_quantizer_quantize (blockwise, f32, &error);
  g_assert_no_error (error);
  g_object_unref (gmlp_quantizer_quantize (delayed, f32, &error));   /* the state is made */
  g_assert_no_error (error);
  state_before = gmlp_quantizer_save_state (delayed, NULL);

#define EXPECT_ERROR(call, code) \
  G_STMT_START { \
    g_autoptr(GError) _error = NULL; \
    gpointer _result; \
    in_use = gmlp_device_get_bytes_in_use (device); \
    _result = (gpointer) (call); \
    g_assert_null (_result); \
    g_assert_error (_error, GMLP_ERROR, (code)); \
    g_assert_cmpuint (gmlp_device_get_bytes_in_use (device), ==, in_use); \
  } G_STMT_END

  /* Quantize: integer and FP8 sources, a state of another group count. */
  EXPECT_ERROR (gmlp_quantizer_quantize (current, i32, &_error), GMLP_ERROR_DTYPE_MISMATCH);
  EXPECT_ERROR (gmlp_quantizer_quantize (current, e4m3, &_error), GMLP_ERROR_DTYPE_MISMATCH);
  EXPECT_ERROR (gmlp_quantizer_quantize (current, q, &_error), GMLP_ERROR_DTYPE_MISMATCH);
  EXPECT_ERROR (gmlp_quantizer_quantize (delayed, t3, &_error), GMLP_ERROR_SHAPE_MISMATCH);
  {
    g_autoptr(GmlpQuantizer) none = g_object_new (GMLP_TYPE_QUANTIZER, "device", device,
                                                  "recipe", GMLP_SCALING_RECIPE_NONE, NULL);
    EXPECT_ERROR (gmlp_quantizer_quantize (none, f32, &_error), GMLP_ERROR_INVALID_ARGUMENT);
  }

  /* Dequantize: FP8 without scales (a conversion), not FP8, a target that
   * is not a float type, the columnwise copy. A member view keeps its
   * member's scales (it lost them, and converted to raw FP8 values). */
  view = gmlp_grouped_tensor_get_member (q, 0, NULL);
  g_assert_cmpint (gmlp_grouped_tensor_get_scaling_recipe (view), ==,
                   gmlp_grouped_tensor_get_scaling_recipe (q));
  {
    g_autoptr(GmlpGroupedTensor) whole = gmlp_grouped_tensor_dequantize (q, GMLP_DTYPE_FLOAT32, &error);
    g_autoptr(GmlpGroupedTensor) whole_member = gmlp_grouped_tensor_get_member (whole, 0, &error);
    g_autoptr(GmlpGroupedTensor) from_view = gmlp_grouped_tensor_convert (view, GMLP_DTYPE_FLOAT32, &error);

    g_assert_no_error (error);
    gmlp_test_assert_same_bytes (from_view, whole_member, "member view of a quantized tensor");
  }
  g_assert_null (gmlp_grouped_tensor_get_scale_inv (e4m3));
  g_assert_false (gmlp_grouped_tensor_get_scale_block (e4m3, NULL, NULL));
  EXPECT_ERROR (gmlp_grouped_tensor_dequantize (e4m3, GMLP_DTYPE_FLOAT32, &_error), GMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_ERROR (gmlp_grouped_tensor_dequantize (f32, GMLP_DTYPE_FLOAT32, &_error), GMLP_ERROR_DTYPE_MISMATCH);
  EXPECT_ERROR (gmlp_grouped_tensor_dequantize (q, GMLP_DTYPE_FLOAT8_E5M2, &_error), GMLP_ERROR_DTYPE_MISMATCH);
  EXPECT_ERROR (gmlp_grouped_tensor_dequantize (q, GMLP_DTYPE_INT64, &_error), GMLP_ERROR_DTYPE_MISMATCH);
  EXPECT_ERROR (gmlp_grouped_tensor_dequantize (gmlp_grouped_tensor_get_columnwise (q), GMLP_DTYPE_FLOAT32, &_error),
                GMLP_ERROR_UNSUPPORTED);
#undef EXPECT_ERROR

  /* The operands of an FP8 product: one recipe, both with scales. */
  g_assert_true (gmlp_quantized_check_compatible (q, q, &error));
  g_assert_no_error (error);
  g_assert_false (gmlp_quantized_check_compatible (q, qb, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED);
  g_clear_error (&error);
  g_assert_false (gmlp_quantized_check_compatible (q, e4m3, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);
  g_assert_false (gmlp_quantized_check_compatible (f32, q, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_DTYPE_MISMATCH);
  g_clear_error (&error);

  /* A tensor on another device. */
  if (gmlp_device_get_kind (device) != GMLP_DEVICE_KIND_CPU)
    {
      g_autoptr(GmlpDevice) cpu = gmlp_device_new (GMLP_DEVICE_KIND_CPU, 0, NULL);
      g_autoptr(GmlpGroupedTensor) host = gmlp_grouped_tensor_new (cpu, GMLP_DTYPE_FLOAT32, rows, 2, 8, NULL);

      g_assert_null (gmlp_quantizer_quantize (current, host, &error));
      g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
      g_clear_error (&error);
    }

  /* The failed calls left the delayed state alone. */
  state_after = gmlp_quantizer_save_state (delayed, NULL);
  g_assert_true (g_variant_equal (state_before, state_after));
}

/* A quantized copy of src; delayed scaling first records src's amax and
 * updates, so that its scale fits the data. */
static GmlpGroupedTensor *
quantize_fitted (GmlpQuantizer     *quantizer,
                 GmlpGroupedTensor *src)
{
  g_autoptr(GError) error = NULL;
  GmlpGroupedTensor *q;

  if (gmlp_quantizer_get_recipe (quantizer) == GMLP_SCALING_RECIPE_DELAYED)
    {
      g_object_unref (gmlp_quantizer_quantize (quantizer, src, &error));
      g_assert_no_error (error);
      g_assert_true (gmlp_quantizer_update (quantizer, &error));
    }
  q = gmlp_quantizer_quantize (quantizer, src, &error);
  g_assert_no_error (error);
  return q;
}

/* convert() of a quantized tensor applies its scales: every recipe and
 * block shape (per tensor, 1 × 128, 128 × 128, 1 × 32), to FP32, FP16 and
 * BF16, from data whose largest value is about 0.003 (whose conversion used
 * to read back the raw FP8 values, up to 448). Exact against float64 (the
 * FP8 bits times their block's scale, rounded to FP32 and then to the
 * target), within the FP8 error of the source, and the bytes of
 * dequantize(); with device-only sizes too. To FP8 or integers, the
 * columnwise copy and MXFP8's E8M0 scales are refused, allocating nothing. */
void
test_convert (void)
{
  static const GmlpDType refused[] = {
    GMLP_DTYPE_FLOAT8_E4M3, GMLP_DTYPE_FLOAT8_E5M2, GMLP_DTYPE_INT32, GMLP_DTYPE_INT64,
  };
  static const GmlpQuantizerRole roles[] = { GMLP_QUANTIZER_ROLE_INPUT, GMLP_QUANTIZER_ROLE_WEIGHT };
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint a, b, k, i;

  if (device == NULL)
    return;

  for (a = 0; a < G_N_ELEMENTS (all_recipes); a++)
    for (b = 0; b < G_N_ELEMENTS (roles); b++)
      {
        Config c = random_config (all_recipes[a], roles[b], TRUE);
        GmlpDType fp8 = config_dtype (&c);
        guint n = g_test_rand_int_range (1, 5);
        gint64 cols = g_test_rand_int_range (1, 300), capacity = 0;
        g_autofree gint64 *rows = gmlp_test_random_rows (n, 260);
        g_autofree double *x = NULL, *ref = NULL;
        g_autoptr(GmlpQuantizer) quantizer = config_quantizer (device, &c);
        g_autoptr(GmlpGroupedTensor) src = NULL, q = NULL, sizes = NULL, src_d = NULL, q_d = NULL;
        guint64 in_use;
        guint g;

        for (g = 0; g < n; g++)
          capacity += rows[g];
        src = random_source (device, source_dtypes[g_test_rand_int_range (0, 3)], rows, n, cols,
                             0.001, FALSE, &x);
        q = quantize_fitted (quantizer, src);
        ref = gmlp_test_dequantize (q);
        /* The same scales for the device-sized copy: delayed scaling keeps
         * its scale until the next update. */
        sizes = sizes_tensor (device, rows, n);
        src_d = gmlp_test_device_sized_copy (src, sizes, capacity);
        q_d = gmlp_quantizer_quantize (quantizer, src_d, NULL);
        g_assert_nonnull (q_d);

        for (k = 0; k < G_N_ELEMENTS (source_dtypes); k++)
          {
            GmlpDType dtype = source_dtypes[k];
            g_autoptr(GError) error = NULL;
            g_autoptr(GmlpGroupedTensor) d = gmlp_grouped_tensor_convert (q, dtype, &error);
            g_autoptr(GmlpGroupedTensor) dq = NULL, d_d = NULL, view = NULL;
            g_autoptr(GBytes) got_d = NULL, want_d = NULL;
            g_autofree double *got = NULL;
            double error_bound = fp8 == GMLP_DTYPE_FLOAT8_E4M3 ? 0.07 : 0.14, rel;
            gsize count, j;

            g_assert_no_error (error);
            g_assert_cmpint (gmlp_grouped_tensor_get_dtype (d), ==, dtype);
            got = gmlp_test_download (d, &count);
            for (j = 0; j < count; j++)
              gmlp_assert_same_value (got[j], gmlp_test_round (to_float (ref[j]), dtype), "convert", j);
            rel = gmlp_test_relative_error (got, x, count, "convert");
            if (!(rel <= error_bound))
              g_error ("%s %s to %s: relative error %g against the source, over %g",
                       gmlp_test_recipe_name (c.recipe), gmlp_dtype_get_name (fp8),
                       gmlp_dtype_get_name (dtype), rel, error_bound);
            dq = gmlp_grouped_tensor_dequantize (q, dtype, &error);
            g_assert_no_error (error);
            gmlp_test_assert_same_bytes (d, dq, "convert and dequantize");

            d_d = gmlp_grouped_tensor_convert (q_d, dtype, &error);
            g_assert_no_error (error);
            g_assert_false (gmlp_grouped_tensor_has_host_sizes (d_d));
            view = gmlp_test_host_view (d_d, rows);
            got_d = download (view);
            want_d = download (d);
            assert_bytes_equal (got_d, want_d, "convert with device sizes");
          }

        /* Refused, naming the route, with nothing allocated. */
        g_assert_true (gmlp_device_synchronize (device, NULL));
        in_use = gmlp_device_get_bytes_in_use (device);
        for (i = 0; i < G_N_ELEMENTS (refused) + 2; i++)
          {
            GmlpGroupedTensor *t = i < G_N_ELEMENTS (refused) ? q :
                                   i == G_N_ELEMENTS (refused) ? gmlp_grouped_tensor_get_columnwise (q) :
                                   gmlp_grouped_tensor_get_scale_inv (q);
            GmlpDType to = i < G_N_ELEMENTS (refused) ? refused[i] : GMLP_DTYPE_FLOAT32;
            g_autoptr(GError) error = NULL;

            if (i == G_N_ELEMENTS (refused) + 1 && c.recipe != GMLP_SCALING_RECIPE_MXFP8)
              continue;   /* FP32 scales are values: they convert */
            g_assert_null (gmlp_grouped_tensor_convert (t, to, &error));
            g_assert_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED);
            if (i < G_N_ELEMENTS (refused) && strstr (error->message, "GmlpQuantizer") == NULL)
              g_error ("“%s” does not name the quantizer", error->message);
            g_assert_cmpuint (gmlp_device_get_bytes_in_use (device), ==, in_use);
          }
      }
}

/* A double of a state that an FP32 state cannot hold is refused, naming
 * its key, and the quantizer is unchanged (1e300 in an amax used to become
 * +Inf); +Inf and subnormal amaxes, as the device records them, and fresh
 * random floats round-trip exactly. */
static GVariant *
delayed_state (double scale, double amax, double h0, double h1)
{
  GVariantBuilder builder;
  double history[] = { h0, h1 };

  g_variant_builder_init (&builder, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add (&builder, "{sv}", "version", g_variant_new_uint32 (1));
  g_variant_builder_add (&builder, "{sv}", "recipe", g_variant_new_string ("delayed"));
  g_variant_builder_add (&builder, "{sv}", "dtype", g_variant_new_string ("float8_e4m3"));
  g_variant_builder_add (&builder, "{sv}", "amax-history-length", g_variant_new_uint32 (2));
  g_variant_builder_add (&builder, "{sv}", "n-groups", g_variant_new_uint32 (1));
  g_variant_builder_add (&builder, "{sv}", "scale",
                         g_variant_new_fixed_array (G_VARIANT_TYPE_DOUBLE, &scale, 1, sizeof (double)));
  g_variant_builder_add (&builder, "{sv}", "amax",
                         g_variant_new_fixed_array (G_VARIANT_TYPE_DOUBLE, &amax, 1, sizeof (double)));
  g_variant_builder_add (&builder, "{sv}", "amax-history",
                         g_variant_new_fixed_array (G_VARIANT_TYPE_DOUBLE, history, 2, sizeof (double)));
  return g_variant_ref_sink (g_variant_builder_end (&builder));
}

void
test_state_range (void)
{
  static const struct { double scale, amax, h0, h1; const char *key; } refused[] = {
    { 1.0, 1e300, 0.0, 0.0, "amax" },
    { 1.0, 0.0, 1e300, 0.0, "amax-history" },
    { 1.0, 0.0, 0.0, 3.5e38, "amax-history" },
    { 1.0, 1e-50, 0.0, 0.0, "amax" },
    { 1.0, -INFINITY, 0.0, 0.0, "amax" },
    { 1.0, NAN, 0.0, 0.0, "amax" },
    { 1e300, 0.0, 0.0, 0.0, "scale" },
    { 1e-300, 0.0, 0.0, 0.0, "scale" },
    { INFINITY, 0.0, 0.0, 0.0, "scale" },
    { 0.0, 0.0, 0.0, 0.0, "scale" },
  };
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  Config c = { GMLP_SCALING_RECIPE_DELAYED, GMLP_QUANTIZER_ROLE_INPUT, GMLP_FP8_FORMAT_E4M3,
               FALSE, FALSE, 2, 0 };
  g_autoptr(GmlpQuantizer) quantizer = NULL;
  guint i;

  if (device == NULL)
    return;

  quantizer = config_quantizer (device, &c);
  for (i = 0; i < 4; i++)
    {
      float scale = ldexp (g_test_rand_double_range (1.0, 2.0), g_test_rand_int_range (-126, 127));
      float amax = ldexp (g_test_rand_double_range (1.0, 2.0), g_test_rand_int_range (-149, 127));
      float h0 = i == 0 ? INFINITY : ldexp (g_test_rand_double_range (1.0, 2.0), g_test_rand_int_range (-140, -126));
      float h1 = i == 1 ? 1e-45f : ldexp (g_test_rand_double_range (1.0, 2.0), g_test_rand_int_range (-10, 10));
      g_autoptr(GVariant) state = delayed_state (scale, amax, h0, h1);
      g_autoptr(GVariant) saved = NULL;
      g_autoptr(GError) error = NULL;

      g_assert_true (gmlp_quantizer_restore_state (quantizer, state, &error));
      g_assert_no_error (error);
      saved = gmlp_quantizer_save_state (quantizer, &error);
      g_assert_no_error (error);
      {
        g_autoptr(GVariant) s = g_variant_lookup_value (saved, "scale", G_VARIANT_TYPE ("ad"));
        g_autoptr(GVariant) m = g_variant_lookup_value (saved, "amax", G_VARIANT_TYPE ("ad"));
        g_autoptr(GVariant) h = g_variant_lookup_value (saved, "amax-history", G_VARIANT_TYPE ("ad"));
        const double *sv, *mv, *hv;
        gsize ns, nm, nh;

        sv = g_variant_get_fixed_array (s, &ns, sizeof (double));
        mv = g_variant_get_fixed_array (m, &nm, sizeof (double));
        hv = g_variant_get_fixed_array (h, &nh, sizeof (double));
        g_assert_cmpuint (ns + nm + nh, ==, 4);
        gmlp_assert_same_value (sv[0], (double) scale, "scale", 0);
        gmlp_assert_same_value (mv[0], (double) amax, "amax", 0);
        gmlp_assert_same_value (hv[0], (double) h0, "amax-history", 0);
        gmlp_assert_same_value (hv[1], (double) h1, "amax-history", 1);
      }
    }

  for (i = 0; i < G_N_ELEMENTS (refused); i++)
    {
      g_autoptr(GVariant) state = delayed_state (refused[i].scale, refused[i].amax, refused[i].h0,
                                                 refused[i].h1);
      g_autoptr(GVariant) before = gmlp_quantizer_save_state (quantizer, NULL);
      g_autoptr(GVariant) after = NULL;
      g_autoptr(GError) error = NULL;
      g_autofree char *quoted = g_strdup_printf ("“%s”", refused[i].key);

      g_assert_false (gmlp_quantizer_restore_state (quantizer, state, &error));
      g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
      if (strstr (error->message, quoted) == NULL)
        g_error ("“%s” does not name %s", error->message, quoted);
      after = gmlp_quantizer_save_state (quantizer, NULL);
      g_assert_true (g_variant_equal (before, after));
    }
}

static void
notify_count (GObject *object, GParamSpec *pspec, gpointer data)
{
  (*(guint *) data)++;
}

/* Properties and the dtype of each format and role. */
void
test_properties (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpQuantizer) q = NULL;
  GmlpScalingRecipe recipe;
  GmlpDType dtype;
  guint notified = 0, f, r;

  if (device == NULL)
    return;

  for (f = 0; f < 3; f++)
    for (r = 0; r < 3; r++)
      {
        g_autoptr(GmlpQuantizer) fq = gmlp_quantizer_new (device, GMLP_SCALING_RECIPE_CURRENT, f, r);
        Config c = { GMLP_SCALING_RECIPE_CURRENT, r, f, FALSE, FALSE, 1, 0 };

        g_assert_cmpint (gmlp_quantizer_get_dtype (fq), ==, config_dtype (&c));
        g_assert_cmpint (gmlp_quantizer_get_fp8_format (fq), ==, f);
        g_assert_cmpint (gmlp_quantizer_get_role (fq), ==, r);
      }

  q = gmlp_quantizer_new (device, GMLP_SCALING_RECIPE_MXFP8, GMLP_FP8_FORMAT_HYBRID,
                          GMLP_QUANTIZER_ROLE_GRAD_OUTPUT);
  g_object_get (q, "recipe", &recipe, "dtype", &dtype, NULL);
  g_assert_cmpint (recipe, ==, GMLP_SCALING_RECIPE_MXFP8);
  g_assert_cmpint (dtype, ==, GMLP_DTYPE_FLOAT8_E5M2);
  g_assert_true (gmlp_quantizer_get_device (q) == device);
  g_assert_cmpuint (gmlp_quantizer_get_amax_history_length (q), ==, 1024);
  g_assert_cmpint (gmlp_quantizer_get_margin (q), ==, 0);
  g_assert_false (gmlp_quantizer_get_columnwise (q));
  g_assert_false (gmlp_quantizer_get_power_of_2_scales (q));

  g_signal_connect (q, "notify::columnwise", G_CALLBACK (notify_count), &notified);
  gmlp_quantizer_set_columnwise (q, TRUE);
  gmlp_quantizer_set_columnwise (q, TRUE);
  g_assert_true (gmlp_quantizer_get_columnwise (q));
  g_assert_cmpuint (notified, ==, 1);
  g_object_set (q, "columnwise", FALSE, NULL);
  g_assert_cmpuint (notified, ==, 2);
}

/* The CPU and the GPU give the same bytes for the same input: data, scales,
 * the columnwise copy, the derived sizes, dequantized values, and delayed
 * scaling's state over several steps. */
void
test_cpu_gpu_identical (void)
{
  g_autoptr(GmlpDevice) cpu = gmlp_device_new (GMLP_DEVICE_KIND_CPU, 0, NULL);
  g_autoptr(GmlpDevice) gpu = NULL;
  g_autoptr(GError) error = NULL;
  guint a, b, iter;

  gpu = gmlp_device_new (GMLP_DEVICE_KIND_CUDA, 0, &error);
  if (gpu == NULL)
    {
      g_test_skip ("no CUDA device");
      return;
    }

  for (a = 0; a < G_N_ELEMENTS (all_recipes); a++)
    for (b = 0; b < G_N_ELEMENTS (all_roles); b++)
      for (iter = 0; iter < 5; iter++)
        {
          /* iter 3: whole 16-byte rows (columns a multiple of 8, rows of
           * 16); iter 4: more groups than a block has threads. */
          Config c = random_config (all_recipes[a], all_roles[b], iter != 1);
          GmlpDType src_dtype = source_dtypes[iter % 3];
          guint n = iter == 4 ? 300 : g_test_rand_int_range (1, 9), g;
          gint64 k = iter >= 3 ? 8 * g_test_rand_int_range (1, 50) : g_test_rand_int_range (1, 400);
          g_autofree gint64 *rows = gmlp_test_random_rows (n, iter == 4 ? 40 : 400);
          gint64 total = 0;
          g_autoptr(GBytes) bytes = NULL;
          g_autoptr(GmlpQuantizer) qc = config_quantizer (cpu, &c);
          g_autoptr(GmlpQuantizer) qg = config_quantizer (gpu, &c);
          guint step;

          for (g = 0; g < n; g++)
            total += rows[g];
          for (step = 0; step < (c.recipe == GMLP_SCALING_RECIPE_DELAYED ? 3 : 1); step++)
            {
              g_autoptr(GmlpGroupedTensor) xc = NULL, xg = NULL, yc = NULL, yg = NULL;
              GmlpGroupedTensor *pairs[4][2];
              guint p, k2;

              bytes = gmlp_test_random_bytes (src_dtype, (gsize) total * k, ldexp (1.0, g_test_rand_int_range (-10, 10)), TRUE);
              xc = gmlp_grouped_tensor_new_from_bytes (cpu, src_dtype, rows, n, k, bytes, &error);
              g_assert_no_error (error);
              xg = gmlp_grouped_tensor_new_from_bytes (gpu, src_dtype, rows, n, k, bytes, &error);
              g_assert_no_error (error);
              g_clear_pointer (&bytes, g_bytes_unref);
              yc = gmlp_quantizer_quantize (qc, xc, &error);
              g_assert_no_error (error);
              yg = gmlp_quantizer_quantize (qg, xg, &error);
              g_assert_no_error (error);

              pairs[0][0] = yc; pairs[0][1] = yg;
              pairs[1][0] = gmlp_grouped_tensor_get_scale_inv (yc);
              pairs[1][1] = gmlp_grouped_tensor_get_scale_inv (yg);
              pairs[2][0] = gmlp_grouped_tensor_get_columnwise (yc);
              pairs[2][1] = gmlp_grouped_tensor_get_columnwise (yg);
              pairs[3][0] = pairs[2][0] ? gmlp_grouped_tensor_get_scale_inv (pairs[2][0]) : NULL;
              pairs[3][1] = pairs[2][1] ? gmlp_grouped_tensor_get_scale_inv (pairs[2][1]) : NULL;
              for (p = 0; p < 4; p++)
                {
                  g_autoptr(GBytes) bc = NULL, bg = NULL;

                  g_assert_true ((pairs[p][0] == NULL) == (pairs[p][1] == NULL));
                  if (pairs[p][0] == NULL)
                    continue;
                  bc = download (pairs[p][0]);
                  bg = download (pairs[p][1]);
                  assert_bytes_equal (bc, bg, p == 0 ? "data" : p == 1 ? "scales" : p == 2 ? "columnwise" : "columnwise scales");
                }
              for (k2 = 0; k2 < G_N_ELEMENTS (source_dtypes); k2++)
                {
                  g_autoptr(GmlpGroupedTensor) dc = gmlp_grouped_tensor_dequantize (yc, source_dtypes[k2], NULL);
                  g_autoptr(GmlpGroupedTensor) dg = gmlp_grouped_tensor_dequantize (yg, source_dtypes[k2], NULL);
                  g_autoptr(GBytes) bc = download (dc), bg = download (dg);

                  assert_bytes_equal (bc, bg, "dequantized");
                }
              if (c.recipe == GMLP_SCALING_RECIPE_DELAYED)
                {
                  g_autoptr(GVariant) sc = NULL, sg = NULL;

                  g_assert_true (gmlp_quantizer_update (qc, NULL));
                  g_assert_true (gmlp_quantizer_update (qg, NULL));
                  sc = gmlp_quantizer_save_state (qc, NULL);
                  sg = gmlp_quantizer_save_state (qg, NULL);
                  g_assert_true (g_variant_equal (sc, sg));
                }
            }

          /* Device-only sizes, some past the capacity. */
          {
            g_autoptr(GmlpGroupedTensor) sc = sizes_tensor (cpu, rows, n), sg = sizes_tensor (gpu, rows, n);
            gint64 capacity = total > 1 && iter == 2 ? total / 2 : total + 17;
            g_autoptr(GmlpGroupedTensor) xc = gmlp_grouped_tensor_new_with_device_sizes (cpu, GMLP_DTYPE_FLOAT32, sc, capacity, k, NULL);
            g_autoptr(GmlpGroupedTensor) xg = gmlp_grouped_tensor_new_with_device_sizes (gpu, GMLP_DTYPE_FLOAT32, sg, capacity, k, NULL);
            g_autoptr(GmlpGroupedTensor) yc = NULL, yg = NULL;
            g_autoptr(GBytes) bc = NULL, bg = NULL;

            g_assert_true (gmlp_grouped_tensor_fill_random (xc, 5 + iter, 30.0, NULL));
            g_assert_true (gmlp_grouped_tensor_fill_random (xg, 5 + iter, 30.0, NULL));
            yc = gmlp_quantizer_quantize (qc, xc, &error);
            g_assert_no_error (error);
            yg = gmlp_quantizer_quantize (qg, xg, &error);
            g_assert_no_error (error);
            bc = download (yc);
            bg = download (yg);
            assert_bytes_equal (bc, bg, "data, device sizes");
            g_clear_pointer (&bc, g_bytes_unref);
            g_clear_pointer (&bg, g_bytes_unref);
            bc = download (gmlp_grouped_tensor_get_scale_inv (yc));
            bg = download (gmlp_grouped_tensor_get_scale_inv (yg));
            assert_bytes_equal (bc, bg, "scales, device sizes");
            if (c.columnwise)
              {
                g_clear_pointer (&bc, g_bytes_unref);
                g_clear_pointer (&bg, g_bytes_unref);
                bc = download (gmlp_grouped_tensor_get_scale_inv (gmlp_grouped_tensor_get_columnwise (yc)));
                bg = download (gmlp_grouped_tensor_get_scale_inv (gmlp_grouped_tensor_get_columnwise (yg)));
                assert_bytes_equal (bc, bg, "columnwise scales, device sizes");
              }
          }
        }
}
