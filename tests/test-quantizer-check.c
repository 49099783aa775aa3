/* test-quantizer-check.c: the reference and checks of test-quantizer
 *
 * The configurations, each recipe's float64 reference (scales from amax,
 * delayed scales, FP8 encoding) and the checks of a quantized tensor's
 * data, scales and dequantization against it.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "test-quantizer.h"

GmlpDType
config_dtype (const Config *c)
{
  if (c->format == GMLP_FP8_FORMAT_E5M2 ||
      (c->format == GMLP_FP8_FORMAT_HYBRID && c->role == GMLP_QUANTIZER_ROLE_GRAD_OUTPUT))
    return GMLP_DTYPE_FLOAT8_E5M2;
  return GMLP_DTYPE_FLOAT8_E4M3;
}

/* The blocks of docs/fp8.md, in the orientation of the source. */
void
config_blocks (const Config *c,
               gboolean      columnwise,
               gint64       *br,
               gint64       *bc)
{
  gint64 along = 0, across = 0;

  if (c->recipe == GMLP_SCALING_RECIPE_BLOCKWISE)
    {
      along = 128;
      across = c->role == GMLP_QUANTIZER_ROLE_WEIGHT ? 128 : 1;
    }
  else if (c->recipe == GMLP_SCALING_RECIPE_MXFP8)
    {
      along = 32;
      across = 1;
    }
  *br = columnwise ? along : across;
  *bc = columnwise ? across : along;
}

gint64
blocks_along (gint64 n, gint64 block)
{
  return block == 0 ? 1 : (n + block - 1) / block;
}

GmlpQuantizer *
config_quantizer (GmlpDevice   *device,
                  const Config *c)
{
  return g_object_new (GMLP_TYPE_QUANTIZER,
                       "device", device,
                       "recipe", c->recipe,
                       "fp8-format", c->format,
                       "role", c->role,
                       "power-of-2-scales", c->pow2,
                       "columnwise", c->columnwise,
                       "amax-history-length", MAX (c->history, 1),
                       "margin", c->margin,
                       NULL);
}

Config
random_config (GmlpScalingRecipe recipe,
               GmlpQuantizerRole role,
               gboolean          columnwise)
{
  Config c = { recipe, role, (GmlpFp8Format) g_test_rand_int_range (0, 3),
               recipe != GMLP_SCALING_RECIPE_DELAYED && recipe != GMLP_SCALING_RECIPE_MXFP8 &&
               g_test_rand_int_range (0, 4) == 0,
               columnwise, 4, 0 };
  return c;
}

double
fp8_max (GmlpDType fp8)
{
  return fp8 == GMLP_DTYPE_FLOAT8_E5M2 ? 57344.0 : 448.0;
}

double
to_float (double x)
{
  return (double) (float) x;
}

static RefScale
ref_scale_from_amax (const Config *c,
                     double        amax,       /* |x| max, NaN left out */
                     gboolean      nonfinite)  /* the block holds NaN or Inf */
{
  GmlpDType fp8 = config_dtype (c);
  RefScale s = { 1.0, 1.0, 0, FALSE };

  if (c->recipe == GMLP_SCALING_RECIPE_MXFP8)
    {
      int e2, e;

      if (nonfinite)
        {
          s.nan_block = TRUE;
          s.e8m0 = 255;
          s.scale_inv = NAN;
          return s;
        }
      if (amax == 0.0)
        e = 0;
      else
        {
          frexp (amax, &e2);                     /* amax = f × 2^e2, f in [0.5, 1) */
          e = (e2 - 1) - (fp8 == GMLP_DTYPE_FLOAT8_E5M2 ? 15 : 8);
          e = CLAMP (e, -127, 127);
        }
      s.e8m0 = e + 127;
      s.mult = ldexp (1.0, -e);
      s.scale_inv = ldexp (1.0, e);
      return s;
    }

  if (amax != 0.0 && !isinf (amax))
    {
      double scale = to_float (fp8_max (fp8) / amax);

      scale = CLAMP (scale, FLT_MIN, FLT_MAX);
      if (c->pow2)
        {
          int e2;
          frexp (scale, &e2);
          scale = ldexp (1.0, e2 - 1);
        }
      s.mult = scale;
    }
  s.scale_inv = to_float (1.0 / s.mult);
  return s;
}

static RefScale
ref_scale_delayed (double scale)
{
  RefScale s = { scale, to_float (1.0 / scale), 0, FALSE };
  return s;
}

static double
ref_encode (double x, const RefScale *s, GmlpDType fp8)
{
  if (isnan (x) || s->nan_block)
    return NAN;
  return gmlp_test_round (to_float (x * s->mult), fp8);
}

static void
ref_out_clear (RefOut *r)
{
  g_clear_pointer (&r->data, g_free);
  g_clear_pointer (&r->elem_scale_inv, g_free);
  g_clear_pointer (&r->elem_mult, g_free);
  g_clear_pointer (&r->scales, g_free);
  g_clear_pointer (&r->e8m0, g_free);
  g_clear_pointer (&r->amax, g_free);
}

/* x: the source values, packed; delayed: the scale of each group (delayed
 * scaling only). */
static void
ref_quantize (const Config  *c,
              const double  *x,
              const gint64  *rows,
              guint          n,
              gint64         k,
              gboolean       columnwise,
              const double  *delayed,
              RefOut        *out)
{
  GmlpDType fp8 = config_dtype (c);
  gint64 br, bc, total = 0;
  gsize base = 0, scale_base = 0;
  guint g;

  config_blocks (c, columnwise, &br, &bc);
  for (g = 0; g < n; g++)
    total += rows[g];
  memset (out, 0, sizeof *out);
  out->n_data = (gsize) total * k;
  out->data = g_new0 (double, MAX (out->n_data, 1));
  out->elem_scale_inv = g_new0 (double, MAX (out->n_data, 1));
  out->elem_mult = g_new0 (double, MAX (out->n_data, 1));
  out->amax = g_new0 (double, n);
  for (g = 0; g < n; g++)
    out->n_scales += blocks_along (rows[g], br) * blocks_along (k, bc);
  out->scales = g_new0 (double, MAX (out->n_scales, 1));
  out->e8m0 = g_new0 (guint8, MAX (out->n_scales, 1));

  for (g = 0; g < n; g++)
    {
      gint64 m = rows[g];
      gint64 nbr = blocks_along (m, br), nbc = blocks_along (k, bc);
      gint64 bi, bj, r, col;

      for (r = 0; r < m * k; r++)
        if (!isnan (x[base + r]))
          out->amax[g] = MAX (out->amax[g], fabs (x[base + r]));

      for (bi = 0; bi < nbr; bi++)
        for (bj = 0; bj < nbc; bj++)
          {
            gint64 r0 = br ? bi * br : 0, r1 = br ? MIN (r0 + br, m) : m;
            gint64 c0 = bc ? bj * bc : 0, c1 = bc ? MIN (c0 + bc, k) : k;
            double amax = 0.0;
            gboolean nonfinite = FALSE;
            RefScale s;
            gsize si = scale_base + (gsize) (bi * nbc + bj);

            for (r = r0; r < r1; r++)
              for (col = c0; col < c1; col++)
                {
                  double v = x[base + r * k + col];
                  if (!isfinite (v))
                    nonfinite = TRUE;
                  if (!isnan (v))
                    amax = MAX (amax, fabs (v));
                }
            s = c->recipe == GMLP_SCALING_RECIPE_DELAYED ? ref_scale_delayed (delayed[g])
                                                         : ref_scale_from_amax (c, amax, nonfinite);
            out->scales[si] = s.scale_inv;
            out->e8m0[si] = (guint8) s.e8m0;
            for (r = r0; r < r1; r++)
              for (col = c0; col < c1; col++)
                {
                  gsize o = base + (gsize) (columnwise ? col * m + r : r * k + col);
                  out->data[o] = ref_encode (x[base + r * k + col], &s, fp8);
                  out->elem_scale_inv[o] = s.scale_inv;
                  out->elem_mult[o] = s.mult;
                }
          }
      base += (gsize) (m * k);
      scale_base += (gsize) (nbr * nbc);
    }
}

GBytes *
download (GmlpGroupedTensor *t)
{
  g_autoptr(GError) error = NULL;
  GBytes *bytes = gmlp_grouped_tensor_to_bytes (t, &error);

  g_assert_no_error (error);
  return bytes;
}

void
assert_bytes_equal (GBytes *a, GBytes *b, const char *what)
{
  gsize la, lb, i;
  const guint8 *pa = g_bytes_get_data (a, &la), *pb = g_bytes_get_data (b, &lb);

  if (la != lb)
    g_error ("%s: %" G_GSIZE_FORMAT " bytes != %" G_GSIZE_FORMAT, what, la, lb);
  for (i = 0; i < la; i++)
    if (pa[i] != pb[i])
      g_error ("%s: bytes differ first at %" G_GSIZE_FORMAT ": %02x != %02x", what, i, pa[i], pb[i]);
}

/* The FP8 values of t equal want, exactly. */
static void
check_data (GmlpGroupedTensor *t,
            const double      *want,
            gsize              n,
            const char        *what)
{
  g_autoptr(GBytes) bytes = download (t);
  GmlpDType dtype = gmlp_grouped_tensor_get_dtype (t);
  gsize i;

  g_assert_cmpuint (g_bytes_get_size (bytes), ==, n * gmlp_dtype_get_size (dtype));
  for (i = 0; i < n; i++)
    gmlp_assert_same_value (gmlp_test_decode (g_bytes_get_data (bytes, NULL), dtype, i), want[i],
                            what, i);
}

static void
check_scales (GmlpGroupedTensor *scales,
              const Config      *c,
              const RefOut      *ref,
              const char        *what)
{
  g_autoptr(GBytes) bytes = download (scales);
  gsize i;

  if (c->recipe == GMLP_SCALING_RECIPE_MXFP8)
    {
      const guint8 *got = g_bytes_get_data (bytes, NULL);

      g_assert_cmpuint (g_bytes_get_size (bytes), ==, ref->n_scales);
      for (i = 0; i < ref->n_scales; i++)
        if (got[i] != ref->e8m0[i])
          g_error ("%s [%" G_GSIZE_FORMAT "]: E8M0 %u, expected %u", what, i, got[i], ref->e8m0[i]);
      return;
    }
  g_assert_cmpint (gmlp_grouped_tensor_get_dtype (scales), ==, GMLP_DTYPE_FLOAT32);
  g_assert_cmpuint (g_bytes_get_size (bytes), ==, ref->n_scales * sizeof (float));
  for (i = 0; i < ref->n_scales; i++)
    {
      double got = ((const float *) g_bytes_get_data (bytes, NULL))[i];

      if (!isfinite (got) || got <= 0.0)
        g_error ("%s [%" G_GSIZE_FORMAT "] is %g: a scale must be finite and positive", what, i, got);
      gmlp_assert_same_value (got, ref->scales[i], what, i);
    }
}

/* Dequantization against the reference, exactly, and against the source
 * within the FP8 error bound. */
static void
check_dequantize (GmlpGroupedTensor *q,
                  const Config      *c,
                  const RefOut      *ref,
                  const double      *x)
{
  GmlpDType fp8 = config_dtype (c);
  const GmlpTestFormat *f = gmlp_test_format (fp8);
  guint k;

  for (k = 0; k < G_N_ELEMENTS (source_dtypes); k++)
    {
      GmlpDType dtype = source_dtypes[k];
      g_autoptr(GError) error = NULL;
      g_autoptr(GmlpGroupedTensor) d = gmlp_grouped_tensor_dequantize (q, dtype, &error);
      g_autofree double *got = NULL;
      gsize n, i;

      g_assert_no_error (error);
      g_assert_cmpint (gmlp_grouped_tensor_get_dtype (d), ==, dtype);
      got = gmlp_test_download (d, &n);
      g_assert_cmpuint (n, ==, ref->n_data);
      for (i = 0; i < n; i++)
        {
          double qv = ref->data[i], s = ref->elem_scale_inv[i], want;

          if (isnan (qv) || isnan (s))
            want = NAN;
          else
            want = gmlp_test_round (to_float (qv * s), dtype);
          gmlp_assert_same_value (got[i], want, "dequantize", i);

          /* The error bound: half a unit in the last place of FP8 (or of its
           * subnormals), in the scaled domain; values beyond the range
           * saturate to ±max. */
          if (dtype == GMLP_DTYPE_FLOAT32 && isfinite (x[i]) && !isnan (s))
            {
              double scaled = to_float (x[i] * ref->elem_mult[i]);
              /* ... plus a few FP32 roundings (of x × scale, of 1 / scale,
               * of the product) */
              double bound = fabs (x[i]) * (ldexp (1.0, -f->mbits - 1) + 1e-6) +
                             ldexp (1.0, f->emin - f->mbits - 1) * s * (1.0 + 1e-6);

              if (isinf (got[i]) && fabs (qv * s) > FLT_MAX)
                ;   /* near FLT_MAX, value × scale_inv is past the FP32 range */
              else if (fabs (scaled) > f->max)
                {
                  if (fabs (got[i]) != to_float (f->max * s))
                    g_error ("dequantize [%" G_GSIZE_FORMAT "]: %g saturated to %g, not ±%g",
                             i, x[i], got[i], f->max * s);
                }
              else if (!(fabs (got[i] - x[i]) <= bound))
                g_error ("dequantize [%" G_GSIZE_FORMAT "]: %.9g for %.9g, error over %.3g "
                         "(recipe %d role %d %s, ×%g)", i, got[i], x[i], bound, c->recipe, c->role,
                         gmlp_dtype_get_name (fp8), ref->elem_mult[i]);
            }
        }
    }
}

/* Everything one quantize call wrote, against the reference. */
void
check_quantized (GmlpGroupedTensor *q,
                 const Config      *c,
                 const double      *x,
                 const gint64      *rows,
                 guint              n,
                 gint64             k,
                 const double      *delayed)
{
  RefOut ref, col_ref;
  GmlpGroupedTensor *scales = gmlp_grouped_tensor_get_scale_inv (q);
  GmlpGroupedTensor *col = gmlp_grouped_tensor_get_columnwise (q);
  gint64 br, bc, cbr, cbc, gbr, gbc;

  g_assert_cmpint (gmlp_grouped_tensor_get_dtype (q), ==, config_dtype (c));
  g_assert_cmpint (gmlp_grouped_tensor_get_scaling_recipe (q), ==, c->recipe);
  g_assert_nonnull (scales);
  g_assert_false (gmlp_grouped_tensor_is_columnwise (q));
  config_blocks (c, FALSE, &br, &bc);
  g_assert_true (gmlp_grouped_tensor_get_scale_block (q, &gbr, &gbc));
  g_assert_cmpint (gbr, ==, br);
  g_assert_cmpint (gbc, ==, bc);
  g_assert_cmpint (gmlp_grouped_tensor_get_n_groups (scales), ==, n);

  ref_quantize (c, x, rows, n, k, FALSE, delayed, &ref);
  check_data (q, ref.data, ref.n_data, "data");
  check_scales (scales, c, &ref, "scale_inv");
  check_dequantize (q, c, &ref, x);

  if (!c->columnwise)
    g_assert_null (col);
  else
    {
      g_assert_nonnull (col);
      g_assert_true (gmlp_grouped_tensor_is_columnwise (col));
      g_assert_null (gmlp_grouped_tensor_get_columnwise (col));
      config_blocks (c, TRUE, &cbr, &cbc);
      g_assert_true (gmlp_grouped_tensor_get_scale_block (col, &gbr, &gbc));
      g_assert_cmpint (gbr, ==, cbr);
      g_assert_cmpint (gbc, ==, cbc);
      ref_quantize (c, x, rows, n, k, TRUE, delayed, &col_ref);
      check_data (col, col_ref.data, col_ref.n_data, "columnwise");
      if (cbr == br && cbc == bc)
        g_assert_true (gmlp_grouped_tensor_get_scale_inv (col) == scales);
      else
        check_scales (gmlp_grouped_tensor_get_scale_inv (col), c, &col_ref, "columnwise scale_inv");
      ref_out_clear (&col_ref);
    }
  ref_out_clear (&ref);
}

/* Fresh random source data, uploaded; its values as stored. */
GmlpGroupedTensor *
random_source (GmlpDevice    *device,
               GmlpDType      dtype,
               const gint64  *rows,
               guint          n,
               gint64         k,
               double         scale,
               gboolean       specials,
               double       **values)
{
  g_autoptr(GError) error = NULL;
  gint64 total = 0;
  g_autoptr(GBytes) bytes = NULL;
  GmlpGroupedTensor *t;
  gsize count, i;
  guint g;

  for (g = 0; g < n; g++)
    total += rows[g];
  count = (gsize) total * k;
  bytes = gmlp_test_random_bytes (dtype, count, scale, specials);
  t = gmlp_grouped_tensor_new_from_bytes (device, dtype, rows, n, k, bytes, &error);
  g_assert_no_error (error);
  *values = g_new (double, MAX (count, 1));
  for (i = 0; i < count; i++)
    (*values)[i] = gmlp_test_decode (g_bytes_get_data (bytes, NULL), dtype, i);
  return t;
}

double *
ones (guint n)
{
  double *v = g_new (double, n);
  guint g;

  for (g = 0; g < n; g++)
    v[g] = 1.0;
  return v;
}
