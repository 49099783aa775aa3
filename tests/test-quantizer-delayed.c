/* test-quantizer-delayed.c: GmlpQuantizer's delayed scaling
 *
 * The amax history and scale state against their reference, and
 * power-of-2 scales.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "test-quantizer.h"

/* The state of a delayed-scaling quantizer after each step, in float64. */
typedef struct {
  guint    n, len;
  int      margin;
  double   fp8_max;
  double  *scale, *amax, *history;   /* history: n × len, newest first */
} RefState;

static void
ref_state_update (RefState *s)
{
  guint g, i;

  for (g = 0; g < s->n; g++)
    {
      double *h = s->history + (gsize) g * s->len, m = 0.0;

      memmove (h + 1, h, sizeof (double) * (s->len - 1));
      h[0] = s->amax[g];
      s->amax[g] = 0.0;
      for (i = 0; i < s->len; i++)
        m = MAX (m, h[i]);
      if (m > 0.0 && !isinf (m))
        s->scale[g] = CLAMP (to_float (to_float (s->fp8_max / m) * ldexp (1.0, -s->margin)),
                             FLT_MIN, FLT_MAX);
    }
}

static void
check_state (GVariant       *state,
             const RefState *s)
{
  g_autoptr(GVariant) scale = g_variant_lookup_value (state, "scale", G_VARIANT_TYPE ("ad"));
  g_autoptr(GVariant) amax = g_variant_lookup_value (state, "amax", G_VARIANT_TYPE ("ad"));
  g_autoptr(GVariant) history = g_variant_lookup_value (state, "amax-history", G_VARIANT_TYPE ("ad"));
  const double *v;
  gsize len, i;
  guint32 n_groups;

  g_assert_true (g_variant_lookup (state, "n-groups", "u", &n_groups));
  g_assert_cmpuint (n_groups, ==, s->n);
  v = g_variant_get_fixed_array (scale, &len, sizeof (double));
  g_assert_cmpuint (len, ==, s->n);
  for (i = 0; i < len; i++)
    gmlp_assert_same_value (v[i], s->scale[i], "state scale", i);
  v = g_variant_get_fixed_array (amax, &len, sizeof (double));
  g_assert_cmpuint (len, ==, s->n);
  for (i = 0; i < len; i++)
    gmlp_assert_same_value (v[i], s->amax[i], "state amax", i);
  v = g_variant_get_fixed_array (history, &len, sizeof (double));
  g_assert_cmpuint (len, ==, (gsize) s->n * s->len);
  for (i = 0; i < len; i++)
    gmlp_assert_same_value (v[i], s->history[i], "state history", i);
}

/* Delayed scaling over several steps: each quantize uses the scale of the
 * last update and records its amax (the largest of several calls in a
 * step); update shifts the history and rescales from its maximum with the
 * margin; a step whose history is all zero or holds Inf keeps the scale. */
void
test_delayed (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  Config c = { GMLP_SCALING_RECIPE_DELAYED, GMLP_QUANTIZER_ROLE_GRAD_OUTPUT, GMLP_FP8_FORMAT_HYBRID,
               FALSE, TRUE, 3, 1 };
  g_autoptr(GmlpQuantizer) quantizer = NULL;
  RefState s = { 0 };
  guint n = 4, step, g;
  gint64 k = 37;

  if (device == NULL)
    return;

  quantizer = config_quantizer (device, &c);
  g_assert_cmpuint (gmlp_quantizer_get_amax_history_length (quantizer), ==, 3);
  g_assert_cmpint (gmlp_quantizer_get_margin (quantizer), ==, 1);
  s.n = n;
  s.len = 3;
  s.margin = 1;
  s.fp8_max = fp8_max (config_dtype (&c));
  s.scale = ones (n);
  s.amax = g_new0 (double, n);
  s.history = g_new0 (double, n * 3);

  /* No state before the first quantize; update is then a no-op. */
  g_assert_true (gmlp_quantizer_update (quantizer, NULL));
  {
    g_autoptr(GVariant) empty = gmlp_quantizer_save_state (quantizer, NULL);
    RefState none = { 0, 3, 1, 0, NULL, NULL, NULL };
    check_state (empty, &none);
  }

  for (step = 0; step < 8; step++)
    {
      guint calls = step % 3 == 1 ? 2 : 1, call;

      for (call = 0; call < calls; call++)
        {
          g_autofree gint64 *rows = gmlp_test_random_rows (n, 50);
          g_autofree double *x = NULL;
          g_autofree float *f = NULL;
          g_autoptr(GBytes) bytes = NULL;
          g_autoptr(GmlpGroupedTensor) src = NULL, q = NULL;
          g_autoptr(GError) error = NULL;
          double spread = step == 4 ? 0.0 : ldexp (1.0, g_test_rand_int_range (-6, 12));
          gsize i, base = 0, count = 0;

          /* At step 6, an Inf in group 0: recorded, after which the history
           * keeps the scale of group 0 for as long as it holds it. */
          if (step == 6)
            rows[0] = MAX (rows[0], 1);
          for (g = 0; g < n; g++)
            count += (gsize) rows[g] * k;
          bytes = gmlp_test_random_bytes (GMLP_DTYPE_FLOAT32, count, spread, FALSE);
          f = g_memdup2 (g_bytes_get_data (bytes, NULL), sizeof (float) * count);
          if (step == 6 && call == 0)
            f[0] = INFINITY;
          g_clear_pointer (&bytes, g_bytes_unref);
          bytes = g_bytes_new (f, sizeof (float) * count);
          src = gmlp_grouped_tensor_new_from_bytes (device, GMLP_DTYPE_FLOAT32, rows, n, k, bytes, &error);
          g_assert_no_error (error);
          x = g_new (double, MAX (count, 1));
          for (i = 0; i < count; i++)
            x[i] = f[i];

          q = gmlp_quantizer_quantize (quantizer, src, &error);
          g_assert_no_error (error);
          /* Quantized with the scales of the last update. */
          check_quantized (q, &c, x, rows, n, k, s.scale);

          for (g = 0; g < n; g++)
            {
              for (i = base; i < base + (gsize) rows[g] * k; i++)
                s.amax[g] = MAX (s.amax[g], fabs (x[i]));
              base += (gsize) rows[g] * k;
            }
        }
      {
        g_autoptr(GVariant) before = gmlp_quantizer_save_state (quantizer, NULL);
        check_state (before, &s);
      }
      g_assert_true (gmlp_quantizer_update (quantizer, NULL));
      ref_state_update (&s);
      {
        g_autoptr(GVariant) after = gmlp_quantizer_save_state (quantizer, NULL);
        check_state (after, &s);
      }
    }

  g_free (s.scale);
  g_free (s.amax);
  g_free (s.history);
}

/* Save and restore: a state survives a round trip through a new quantizer
 * (and through text), which then quantizes exactly as the old one; states
 * of another recipe, type or history length, or malformed ones, are refused
 * and leave the quantizer as it was. */
void
test_state (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  Config c = { GMLP_SCALING_RECIPE_DELAYED, GMLP_QUANTIZER_ROLE_INPUT, GMLP_FP8_FORMAT_E4M3,
               FALSE, TRUE, 5, 0 };
  gint64 rows[] = { 9, 0, 21 };
  g_autoptr(GmlpQuantizer) a = NULL, b = NULL;
  g_autoptr(GVariant) saved = NULL, restored = NULL, parsed = NULL, other = NULL;
  g_autofree char *text = NULL;
  g_autofree double *x = NULL;
  g_autoptr(GmlpGroupedTensor) src = NULL, qa = NULL, qb = NULL;
  g_autoptr(GBytes) ba = NULL, bb = NULL;
  g_autoptr(GError) error = NULL;
  guint step;

  if (device == NULL)
    return;

  a = config_quantizer (device, &c);
  for (step = 0; step < 4; step++)
    {
      g_autofree double *xs = NULL;
      g_autoptr(GmlpGroupedTensor) s = random_source (device, GMLP_DTYPE_BFLOAT16, rows, 3, 19,
                                                      ldexp (1.0, step * 3), FALSE, &xs);
      g_autoptr(GmlpGroupedTensor) q = gmlp_quantizer_quantize (a, s, &error);

      g_assert_no_error (error);
      g_assert_true (gmlp_quantizer_update (a, &error));
    }
  saved = gmlp_quantizer_save_state (a, &error);
  g_assert_no_error (error);
  g_assert_false (g_variant_is_floating (saved));

  text = g_variant_print (saved, TRUE);
  parsed = g_variant_parse (NULL, text, NULL, NULL, &error);
  g_assert_no_error (error);

  b = config_quantizer (device, &c);
  g_assert_true (gmlp_quantizer_restore_state (b, parsed, &error));
  g_assert_no_error (error);
  restored = gmlp_quantizer_save_state (b, &error);
  g_assert_true (g_variant_equal (saved, restored));

  src = random_source (device, GMLP_DTYPE_FLOAT32, rows, 3, 19, 40.0, FALSE, &x);
  qa = gmlp_quantizer_quantize (a, src, &error);
  qb = gmlp_quantizer_quantize (b, src, &error);
  ba = download (qa);
  bb = download (qb);
  assert_bytes_equal (ba, bb, "restored quantizer");
  g_clear_pointer (&ba, g_bytes_unref);
  g_clear_pointer (&bb, g_bytes_unref);
  ba = download (gmlp_grouped_tensor_get_scale_inv (qa));
  bb = download (gmlp_grouped_tensor_get_scale_inv (qb));
  assert_bytes_equal (ba, bb, "restored scales");

#define EXPECT_REFUSED(quantizer, variant, code) \
  G_STMT_START { \
    g_autoptr(GError) _error = NULL; \
    g_autoptr(GVariant) _before = gmlp_quantizer_save_state ((quantizer), NULL); \
    g_autoptr(GVariant) _after = NULL; \
    g_assert_false (gmlp_quantizer_restore_state ((quantizer), (variant), &_error)); \
    g_assert_error (_error, GMLP_ERROR, (code)); \
    _after = gmlp_quantizer_save_state ((quantizer), NULL); \
    g_assert_true (g_variant_equal (_before, _after)); \
  } G_STMT_END

  /* Another recipe, type or history length. */
  {
    Config cur = c, e5 = c, longer = c;
    g_autoptr(GmlpQuantizer) qcur = NULL, qe5 = NULL, qlong = NULL;

    cur.recipe = GMLP_SCALING_RECIPE_CURRENT;
    e5.format = GMLP_FP8_FORMAT_E5M2;
    longer.history = 6;
    qcur = config_quantizer (device, &cur);
    qe5 = config_quantizer (device, &e5);
    qlong = config_quantizer (device, &longer);
    EXPECT_REFUSED (qcur, saved, GMLP_ERROR_INVALID_ARGUMENT);
    EXPECT_REFUSED (qe5, saved, GMLP_ERROR_DTYPE_MISMATCH);
    EXPECT_REFUSED (qlong, saved, GMLP_ERROR_INVALID_ARGUMENT);

    /* The other way: a current-scaling state has no groups, a delayed one
     * refuses it for its recipe. */
    other = gmlp_quantizer_save_state (qcur, NULL);
    EXPECT_REFUSED (b, other, GMLP_ERROR_INVALID_ARGUMENT);
  }

  /* Malformed: not a dictionary, a missing key, a wrong length, values a
   * state cannot hold. */
  {
    static const char *const bad[] = {
      "[1, 2]",
      "{'version': <uint32 1>}",
      "{'version': <uint32 2>, 'recipe': <'delayed'>, 'dtype': <'float8_e4m3'>, "
      "'amax-history-length': <uint32 5>, 'n-groups': <uint32 0>, 'scale': <@ad []>, "
      "'amax': <@ad []>, 'amax-history': <@ad []>}",
      "{'version': <uint32 1>, 'recipe': <'delayed'>, 'dtype': <'float8_e4m3'>, "
      "'amax-history-length': <uint32 5>, 'n-groups': <uint32 1>, 'scale': <@ad []>, "
      "'amax': <@ad []>, 'amax-history': <@ad []>}",
      "{'version': <uint32 1>, 'recipe': <'delayed'>, 'dtype': <'float8_e4m3'>, "
      "'amax-history-length': <uint32 5>, 'n-groups': <uint32 1>, 'scale': <[-1.0]>, "
      "'amax': <[0.0]>, 'amax-history': <[0.0, 0.0, 0.0, 0.0, 0.0]>}",
      "{'version': <uint32 1>, 'recipe': <'delayed'>, 'dtype': <'float8_e4m3'>, "
      "'amax-history-length': <uint32 5>, 'n-groups': <uint32 1>, 'scale': <[1e39]>, "
      "'amax': <[0.0]>, 'amax-history': <[0.0, 0.0, 0.0, 0.0, 0.0]>}",
      "{'version': <uint32 1>, 'recipe': <'delayed'>, 'dtype': <'float8_e4m3'>, "
      "'amax-history-length': <uint32 5>, 'n-groups': <uint32 1>, 'scale': <[0.0]>, "
      "'amax': <[0.0]>, 'amax-history': <[0.0, 0.0, 0.0, 0.0, 0.0]>}",
      "{'version': <uint32 1>, 'recipe': <'delayed'>, 'dtype': <'float8_e4m3'>, "
      "'amax-history-length': <uint32 5>, 'n-groups': <uint32 1>, 'scale': <[1.0]>, "
      "'amax': <[-1.0]>, 'amax-history': <[0.0, 0.0, 0.0, 0.0, 0.0]>}",
    };
    guint i;

    for (i = 0; i < G_N_ELEMENTS (bad); i++)
      {
        g_autoptr(GError) parse_error = NULL;
        g_autoptr(GVariant) v = g_variant_parse (NULL, bad[i], NULL, NULL, &parse_error);

        g_assert_no_error (parse_error);
        EXPECT_REFUSED (b, v, GMLP_ERROR_INVALID_ARGUMENT);
      }
  }
#undef EXPECT_REFUSED

  /* A state of no groups clears the state; the next quantize starts over. */
  {
    g_autoptr(GmlpQuantizer) fresh = config_quantizer (device, &c);
    g_autoptr(GVariant) empty = gmlp_quantizer_save_state (fresh, NULL);
    g_autoptr(GVariant) cleared = NULL;

    g_assert_true (gmlp_quantizer_restore_state (b, empty, &error));
    cleared = gmlp_quantizer_save_state (b, NULL);
    g_assert_true (g_variant_equal (cleared, empty));
  }
}

/* Power-of-two scales are powers of two, and what the reference says. */
void
test_power_of_2 (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint a;

  if (device == NULL)
    return;

  for (a = 0; a < 2; a++)
    {
      Config c = { a == 0 ? GMLP_SCALING_RECIPE_CURRENT : GMLP_SCALING_RECIPE_BLOCKWISE,
                   GMLP_QUANTIZER_ROLE_INPUT, GMLP_FP8_FORMAT_E4M3, TRUE, FALSE, 1, 0 };
      gint64 rows[] = { 33, 5 };
      g_autofree double *x = NULL, *delayed = ones (2);
      g_autoptr(GmlpQuantizer) quantizer = config_quantizer (device, &c);
      g_autoptr(GmlpGroupedTensor) src = random_source (device, GMLP_DTYPE_FLOAT32, rows, 2, 300, 7.3, FALSE, &x);
      g_autoptr(GmlpGroupedTensor) q = gmlp_quantizer_quantize (quantizer, src, NULL);
      g_autoptr(GBytes) scales = download (gmlp_grouped_tensor_get_scale_inv (q));
      const float *s = g_bytes_get_data (scales, NULL);
      gsize i;

      g_assert_true (gmlp_quantizer_get_power_of_2_scales (quantizer));
      check_quantized (q, &c, x, rows, 2, 300, delayed);
      for (i = 0; i < g_bytes_get_size (scales) / sizeof (float); i++)
        {
          int e;
          g_assert_cmpfloat (frexp (s[i], &e), ==, 0.5);
        }
    }
}
