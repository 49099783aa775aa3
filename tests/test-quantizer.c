/* test-quantizer.c: GmlpQuantizer against float64 references
 *
 * The reference below models each recipe from its documented formulas
 * (docs/fp8.md) in float64, independently of the library's arithmetic:
 * amax, the scale (rounded to FP32 where the library keeps FP32), each
 * element as fp8 (fl32 (x × scale)), the scale inverses and dequantization.
 * Quantization is deterministic, so the comparisons are exact; the
 * dequantized values are also held to the FP8 error bound.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <float.h>
#include <locale.h>
#include <math.h>
#include <string.h>

#include "gmlp-test-util.h"
#include "gmlp-grouped-tensor-private.h"
#include "gmlp-quantizer-private.h"

static const GmlpScalingRecipe all_recipes[] = {
  GMLP_SCALING_RECIPE_DELAYED, GMLP_SCALING_RECIPE_CURRENT,
  GMLP_SCALING_RECIPE_BLOCKWISE, GMLP_SCALING_RECIPE_MXFP8,
};
static const GmlpQuantizerRole all_roles[] = {
  GMLP_QUANTIZER_ROLE_INPUT, GMLP_QUANTIZER_ROLE_WEIGHT, GMLP_QUANTIZER_ROLE_GRAD_OUTPUT,
};
static const GmlpDType source_dtypes[] = {
  GMLP_DTYPE_FLOAT32, GMLP_DTYPE_FLOAT16, GMLP_DTYPE_BFLOAT16,
};

typedef struct {
  GmlpScalingRecipe  recipe;
  GmlpQuantizerRole  role;
  GmlpFp8Format      format;
  gboolean           pow2;
  gboolean           columnwise;
  guint              history;     /* delayed scaling */
  int                margin;
} Config;

static GmlpDType
config_dtype (const Config *c)
{
  if (c->format == GMLP_FP8_FORMAT_E5M2 ||
      (c->format == GMLP_FP8_FORMAT_HYBRID && c->role == GMLP_QUANTIZER_ROLE_GRAD_OUTPUT))
    return GMLP_DTYPE_FLOAT8_E5M2;
  return GMLP_DTYPE_FLOAT8_E4M3;
}

/* The blocks of docs/fp8.md, in the orientation of the source. */
static void
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

static gint64
blocks_along (gint64 n, gint64 block)
{
  return block == 0 ? 1 : (n + block - 1) / block;
}

static GmlpQuantizer *
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

static Config
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

static double
fp8_max (GmlpDType fp8)
{
  return fp8 == GMLP_DTYPE_FLOAT8_E5M2 ? 57344.0 : 448.0;
}

/* What a block is quantized with, in float64. */
typedef struct {
  double    mult;        /* x × mult is rounded to FP32, then to FP8 */
  double    scale_inv;   /* NaN for an MX block with the NaN scale */
  int       e8m0;
  gboolean  nan_block;
} RefScale;

static double
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

/* The expected outputs of one quantize call, packed as to_bytes() gives
 * them. */
typedef struct {
  double  *data;          /* rowwise, or the columnwise copy */
  double  *elem_scale_inv;/* the scale inverse of each element of data */
  double  *elem_mult;     /* and what it was multiplied by */
  double  *scales;        /* FP32 scale inverses */
  guint8  *e8m0;          /* MXFP8 scales */
  gsize    n_data;
  gsize    n_scales;
  double  *amax;          /* per group, NaN left out (delayed scaling) */
} RefOut;

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

static GBytes *
download (GmlpGroupedTensor *t)
{
  g_autoptr(GError) error = NULL;
  GBytes *bytes = gmlp_grouped_tensor_to_bytes (t, &error);

  g_assert_no_error (error);
  return bytes;
}

static void
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
static void
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
static GmlpGroupedTensor *
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

static double *
ones (guint n)
{
  double *v = g_new (double, n);
  guint g;

  for (g = 0; g < n; g++)
    v[g] = 1.0;
  return v;
}

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

static GmlpGroupedTensor *
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
static void
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
static void
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
static void
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

/* Errors before anything is written or allocated. */
static void
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
static void
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

static void
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
static void
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
static void
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
