/* gmlp-test-util.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <math.h>
#include <string.h>

#include "gmlp-test-util.h"
#include "gmlp-device-private.h"
#include "gmlp-grouped-tensor-private.h"
#include "gmlp-tuning-private.h"

GmlpDevice *
gmlp_test_device_or_skip (void)
{
  g_autoptr(GError) error = NULL;
  const char *spec = g_getenv ("GMLP_TEST_DEVICE");
  GmlpDevice *device;

  if (spec == NULL || spec[0] == '\0')
    spec = "cpu";

  device = gmlp_device_new_from_string (spec, &error);
  if (device == NULL)
    {
      g_autofree char *msg = g_strdup_printf ("device %s not usable: %s", spec, error->message);
      g_assert_error (error, GMLP_ERROR, GMLP_ERROR_NO_DEVICE);
      g_test_skip (msg);
      return NULL;
    }
  /* The device is one object for the whole process: its tuning holds for
   * every test after this. */
  if (!gmlp_device_apply_tuning (device, g_getenv ("GMLP_TEST_TUNING"), &error))
    g_error ("GMLP_TEST_TUNING: %s", error->message);
  return device;
}

gboolean
gmlp_test_tuned (GmlpDevice *device,
                 const char *key,
                 const char *value)
{
  g_autofree char *set = gmlp_device_get_tuning (device, key, NULL);

  g_assert_nonnull (set);
  return g_str_equal (set, value);
}

gboolean
gmlp_test_poisoned (void)
{
  return (gmlp_debug_flags () & GMLP_DEBUG_POISON) != 0;
}

static const GmlpTestFormat formats[] = {
  [GMLP_DTYPE_FLOAT32]     = { "float32",  23, -126, 3.4028234663852886e38, FALSE },
  [GMLP_DTYPE_FLOAT16]     = { "float16",  10, -14,  65504.0,               FALSE },
  [GMLP_DTYPE_BFLOAT16]    = { "bfloat16", 7,  -126, 3.3895313892515355e38, FALSE },
  [GMLP_DTYPE_FLOAT8_E4M3] = { "e4m3",     3,  -6,   448.0,                 TRUE },
  [GMLP_DTYPE_FLOAT8_E5M2] = { "e5m2",     2,  -14,  57344.0,               TRUE },
};

const GmlpTestFormat *
gmlp_test_format (GmlpDType dtype)
{
  g_assert_true (gmlp_dtype_is_floating (dtype));
  return &formats[dtype];
}

double
gmlp_test_round (double x, GmlpDType dtype)
{
  const GmlpTestFormat *f = gmlp_test_format (dtype);
  double quantum, r;
  int e;

  if (isnan (x))
    return x;
  if (isinf (x))
    return f->saturate ? copysign (f->max, x) : x;
  if (x == 0.0)
    return x;

  frexp (x, &e);                       /* |x| = m * 2^e, m in [0.5, 1) */
  quantum = ldexp (1.0, MAX (e - 1, f->emin) - f->mbits);
  r = nearbyint (x / quantum) * quantum;   /* default rounding: nearest even */
  if (fabs (r) > f->max)
    r = f->saturate ? copysign (f->max, x) : copysign (INFINITY, x);
  if (r == 0.0)
    r = copysign (0.0, x);
  return r;
}

static double
decode_bits (guint32 bits, int ebits, int mbits, gboolean ieee_specials, gboolean e4m3)
{
  int sign = (bits >> (ebits + mbits)) & 1;
  int e = (bits >> mbits) & ((1 << ebits) - 1);
  guint32 m = bits & ((1u << mbits) - 1);
  int bias = (1 << (ebits - 1)) - 1;
  double v;

  if (ieee_specials && e == (1 << ebits) - 1)
    v = m ? NAN : INFINITY;
  else if (e4m3 && e == 15 && m == 7)
    v = NAN;
  else if (e == 0)
    v = ldexp ((double) m, 1 - bias - mbits);
  else
    v = ldexp (1.0 + ldexp ((double) m, -mbits), e - bias);
  return sign ? -v : v;
}

double
gmlp_test_decode (gconstpointer data, GmlpDType dtype, gsize i)
{
  switch (dtype)
    {
    case GMLP_DTYPE_FLOAT32: return ((const float *) data)[i];
    case GMLP_DTYPE_FLOAT16: return decode_bits (((const guint16 *) data)[i], 5, 10, TRUE, FALSE);
    case GMLP_DTYPE_BFLOAT16: return decode_bits (((const guint16 *) data)[i], 8, 7, TRUE, FALSE);
    case GMLP_DTYPE_FLOAT8_E4M3: return decode_bits (((const guint8 *) data)[i], 4, 3, FALSE, TRUE);
    case GMLP_DTYPE_FLOAT8_E5M2: return decode_bits (((const guint8 *) data)[i], 5, 2, TRUE, FALSE);
    case GMLP_DTYPE_INT32: return ((const gint32 *) data)[i];
    case GMLP_DTYPE_INT64: return (double) ((const gint64 *) data)[i];
    default: g_assert_not_reached ();
    }
}

static double
random_normal (void)
{
  double u1 = g_test_rand_double_range (1e-12, 1.0), u2 = g_test_rand_double ();
  return sqrt (-2.0 * log (u1)) * cos (2.0 * G_PI * u2);
}

static double
random_value (double scale, gboolean specials)
{
  static const double special_values[] = {
    NAN, -NAN, INFINITY, -INFINITY, 0.0, -0.0, 448.0, 464.0, 465.0, 500.0, -1e6,
    57344.0, 61440.0, 65504.0, 65520.0, 70000.0, 1e-7, 6e-8, 2.9802322387695312e-8,
    0.001953125, 0.0009765625, 1.52587890625e-05, 1e-40, -1e-45,
  };
  int pick = g_test_rand_int_range (0, 100);

  if (specials && pick < 8)
    return special_values[g_test_rand_int_range (0, G_N_ELEMENTS (special_values))];
  if (pick < 12)
    return 0.0;
  if (specials && pick < 30)
    /* Spread over many binades, into every format's subnormals. */
    return (g_test_rand_bit () ? -1 : 1) * ldexp (g_test_rand_double_range (1.0, 2.0),
                                                  g_test_rand_int_range (-30, 20));
  return random_normal () * scale;
}

GBytes *
gmlp_test_encode_values (const double *values, gsize n, GmlpDType dtype)
{
  gsize size = gmlp_dtype_get_size (dtype), i;
  guint8 *data = g_malloc (MAX (n * size, 1));

  g_assert (dtype == GMLP_DTYPE_FLOAT32 || dtype == GMLP_DTYPE_FLOAT16 || dtype == GMLP_DTYPE_BFLOAT16);
  for (i = 0; i < n; i++)
    {
      float f = (float) values[i];

      if (dtype == GMLP_DTYPE_FLOAT32)
        ((float *) data)[i] = f;
      else if (dtype == GMLP_DTYPE_FLOAT16)
        ((guint16 *) data)[i] = gmlp_dtype_float_to_half (f);
      else
        ((guint16 *) data)[i] = gmlp_dtype_float_to_bfloat16 (f);
    }
  return g_bytes_new_take (data, n * size);
}

GBytes *
gmlp_test_random_bytes (GmlpDType dtype, gsize n, double scale, gboolean specials)
{
  gsize elem = gmlp_dtype_get_size (dtype);
  guint8 *data = g_malloc (MAX (n * elem, 1));
  gsize i;

  for (i = 0; i < n; i++)
    {
      double v = random_value (scale, specials);
      float f = (float) v;

      switch (dtype)
        {
        case GMLP_DTYPE_FLOAT32: ((float *) data)[i] = f; break;
        /* Raw random bit patterns exercise every encoding of the small types. */
        case GMLP_DTYPE_FLOAT16:
        case GMLP_DTYPE_BFLOAT16:
          ((guint16 *) data)[i] = specials ? (guint16) g_test_rand_int_range (0, 65536)
                                           : gmlp_dtype_float_to_bfloat16 (f);
          if (!specials && dtype == GMLP_DTYPE_FLOAT16)
            ((guint16 *) data)[i] = gmlp_dtype_float_to_half (f);
          break;
        case GMLP_DTYPE_FLOAT8_E4M3:
          ((guint8 *) data)[i] = specials ? (guint8) g_test_rand_int_range (0, 256)
                                          : gmlp_dtype_float_to_e4m3 (f);
          break;
        case GMLP_DTYPE_FLOAT8_E5M2:
          ((guint8 *) data)[i] = specials ? (guint8) g_test_rand_int_range (0, 256)
                                          : gmlp_dtype_float_to_e5m2 (f);
          break;
        case GMLP_DTYPE_INT32: ((gint32 *) data)[i] = (gint32) g_test_rand_int (); break;
        case GMLP_DTYPE_INT64:
          ((gint64 *) data)[i] = (gint64) (((guint64) (guint32) g_test_rand_int () << 32) |
                                           (guint32) g_test_rand_int ());
          break;
        default: g_assert_not_reached ();
        }
    }
  return g_bytes_new_take (data, n * elem);
}

gint64 *
gmlp_test_random_rows (guint n_groups, gint64 max_rows)
{
  gint64 *rows = g_new (gint64, n_groups);
  guint g;

  for (g = 0; g < n_groups; g++)
    rows[g] = g_test_rand_int_range (0, 5) == 0 ? 0 : g_test_rand_int_range (0, (gint32) max_rows + 1);
  return rows;
}

GmlpGroupedTensor *
gmlp_test_random_tensor (GmlpDevice    *device,
                         GmlpDType      dtype,
                         const gint64  *rows,
                         guint          n_groups,
                         gint64         cols,
                         double         scale,
                         double       **values)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GBytes) bytes = NULL;
  GmlpGroupedTensor *tensor;
  gint64 total = 0;
  gsize n, i;
  guint g;

  for (g = 0; g < n_groups; g++)
    total += rows[g];
  n = (gsize) total * cols;
  bytes = gmlp_test_random_bytes (dtype, n, scale, FALSE);
  tensor = gmlp_grouped_tensor_new_from_bytes (device, dtype, rows, n_groups, cols, bytes, &error);
  g_assert_no_error (error);

  if (values != NULL)
    {
      *values = g_new (double, MAX (n, 1));
      for (i = 0; i < n; i++)
        (*values)[i] = gmlp_test_decode (g_bytes_get_data (bytes, NULL), dtype, i);
    }
  return tensor;
}

double *
gmlp_test_download (GmlpGroupedTensor *tensor,
                    gsize             *n_values)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GBytes) bytes = gmlp_grouped_tensor_to_bytes (tensor, &error);
  GmlpDType dtype = gmlp_grouped_tensor_get_dtype (tensor);
  gsize n, i;
  double *values;

  g_assert_no_error (error);
  n = g_bytes_get_size (bytes) / gmlp_dtype_get_size (dtype);
  values = g_new (double, MAX (n, 1));
  for (i = 0; i < n; i++)
    values[i] = gmlp_test_decode (g_bytes_get_data (bytes, NULL), dtype, i);
  if (n_values != NULL)
    *n_values = n;
  return values;
}

GmlpGroupedTensor *
gmlp_test_upload_values (GmlpDevice   *device,
                         const double *values,
                         gint64        rows,
                         gint64        cols,
                         GmlpDType     dtype)
{
  g_autoptr(GBytes) bytes = gmlp_test_encode_values (values, (gsize) (rows * cols), dtype);
  g_autoptr(GError) error = NULL;
  GmlpGroupedTensor *t = gmlp_grouped_tensor_new_from_bytes (device, dtype, &rows, 1, cols, bytes, &error);

  g_assert_no_error (error);
  return t;
}

double
gmlp_test_normal (double    scale,
                  GmlpDType dtype)
{
  double u = g_test_rand_double_range (1e-12, 1.0), v = g_test_rand_double ();

  return gmlp_test_round (scale * sqrt (-2.0 * log (u)) * cos (2.0 * G_PI * v), dtype);
}

double *
gmlp_test_normals (gsize     n,
                   double    scale,
                   GmlpDType dtype)
{
  double *values = g_new (double, MAX (n, 1));
  gsize i;

  for (i = 0; i < n; i++)
    values[i] = gmlp_test_normal (scale, dtype);
  return values;
}

void
gmlp_test_set_linear (GmlpGroupedLinear *linear,
                      const double      *w,
                      const double      *b)
{
  GmlpDType dtype = gmlp_grouped_linear_get_dtype (linear);
  gsize n_b = (gsize) gmlp_grouped_linear_get_n_groups (linear) * gmlp_grouped_linear_get_out_features (linear);
  g_autoptr(GBytes) wb = gmlp_test_encode_values (w, n_b * gmlp_grouped_linear_get_in_features (linear), dtype);
  g_autoptr(GError) error = NULL;

  g_assert_true (gmlp_grouped_linear_set_weight_from_bytes (linear, wb, &error));
  g_assert_no_error (error);
  if (gmlp_grouped_linear_get_flags (linear) & GMLP_LINEAR_BIAS)
    {
      g_autoptr(GBytes) bb = gmlp_test_encode_values (b, n_b, dtype);

      g_assert_true (gmlp_grouped_linear_set_bias_from_bytes (linear, bb, &error));
      g_assert_no_error (error);
    }
}

static void
add_bytes (GPtrArray         *all,
           GmlpGroupedTensor *tensor)
{
  g_autoptr(GError) error = NULL;

  g_assert_nonnull (tensor);
  g_ptr_array_add (all, gmlp_grouped_tensor_to_bytes (tensor, &error));
  g_assert_no_error (error);
}

GPtrArray *
gmlp_test_moe_gradient_bytes (GmlpMoELayer *layer)
{
  GPtrArray *all = g_ptr_array_new_with_free_func ((GDestroyNotify) g_bytes_unref);
  GmlpGroupedMLP *mlps[2] = { gmlp_moe_layer_get_experts (layer), gmlp_moe_layer_get_shared_expert (layer) };
  GmlpRouter *router = gmlp_moe_layer_get_router (layer);
  gboolean fused = (gmlp_router_get_flags (router) & GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION) != 0;
  guint i, j, g;

  add_bytes (all, fused ? gmlp_router_get_main_grad (router) : gmlp_router_get_wgrad (router));
  for (i = 0; i < 2 && mlps[i] != NULL; i++)
    for (j = 0; j < 2; j++)
      {
        GmlpGroupedLinear *fc = j == 0 ? gmlp_grouped_mlp_get_fc1 (mlps[i]) : gmlp_grouped_mlp_get_fc2 (mlps[i]);

        if (!fused)
          add_bytes (all, gmlp_grouped_linear_get_wgrad (fc));
        else if (gmlp_grouped_linear_get_main_grad (fc) != NULL)
          add_bytes (all, gmlp_grouped_linear_get_main_grad (fc));
        else
          for (g = 0; g < gmlp_grouped_linear_get_n_groups (fc); g++)
            add_bytes (all, gmlp_grouped_linear_get_main_grad_member (fc, g));
        if (gmlp_grouped_linear_get_bgrad (fc) != NULL)
          add_bytes (all, gmlp_grouped_linear_get_bgrad (fc));
      }
  return all;
}

void
gmlp_test_assert_same_bytes_array (GPtrArray  *a,
                                   GPtrArray  *b,
                                   const char *what)
{
  guint i;

  g_assert_cmpuint (a->len, ==, b->len);
  for (i = 0; i < a->len; i++)
    if (!g_bytes_equal (a->pdata[i], b->pdata[i]))
      g_error ("%s: result %u differs", what, i);
}

gint64 *
gmlp_test_download_i64 (GmlpGroupedTensor *tensor,
                        gsize             *n)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GBytes) bytes = NULL;

  g_assert_nonnull (tensor);
  g_assert_cmpint (gmlp_grouped_tensor_get_dtype (tensor), ==, GMLP_DTYPE_INT64);
  bytes = gmlp_grouped_tensor_to_bytes (tensor, &error);
  g_assert_no_error (error);
  *n = g_bytes_get_size (bytes) / sizeof (gint64);
  return g_memdup2 (g_bytes_get_data (bytes, NULL), MAX (g_bytes_get_size (bytes), 1));
}

double
gmlp_test_download_scalar (GmlpGroupedTensor *tensor)
{
  g_autofree double *v = NULL;
  gsize n;

  g_assert_nonnull (tensor);
  g_assert_cmpint (gmlp_grouped_tensor_get_total_rows (tensor), ==, 1);
  v = gmlp_test_download (tensor, &n);
  g_assert_cmpuint (n, ==, 1);
  return v[0];
}

double
gmlp_test_tolerance (GmlpDType dtype)
{
  switch (dtype)
    {
    case GMLP_DTYPE_FLOAT32: return 2e-5;
    case GMLP_DTYPE_FLOAT16: return 2e-3;
    case GMLP_DTYPE_BFLOAT16: return 1e-2;
    default: g_assert_not_reached ();
    }
}

/* ‖got − want‖² into *diff and ‖want‖² into *norm; every value of got
 * must be finite (poisoned memory is NaN). */
static void
sums_of_squares (const double *got,
                 const double *want,
                 gsize         n,
                 const char   *what,
                 double       *diff,
                 double       *norm)
{
  gsize i;

  *diff = 0.0;
  *norm = 0.0;
  for (i = 0; i < n; i++)
    {
      if (!isfinite (got[i]))
        g_error ("%s [%" G_GSIZE_FORMAT "] is %g (unwritten or overflowed)", what, i, got[i]);
      *diff += (got[i] - want[i]) * (got[i] - want[i]);
      *norm += want[i] * want[i];
    }
}

double
gmlp_test_relative_error (const double *got,
                          const double *want,
                          gsize         n,
                          const char   *what)
{
  double diff, norm;

  sums_of_squares (got, want, n, what, &diff, &norm);
  return norm > 0.0 ? sqrt (diff / norm) : sqrt (diff);
}

void
gmlp_test_assert_close (const double *got,
                        const double *want,
                        gsize         n,
                        double        tol,
                        const char   *what)
{
  double diff, norm;
  gsize i;

  sums_of_squares (got, want, n, what, &diff, &norm);
  if (norm == 0.0)
    {
      for (i = 0; i < n; i++)
        if (got[i] != 0.0)
          g_error ("%s [%" G_GSIZE_FORMAT "] is %g where it must be exactly 0", what, i, got[i]);
      return;
    }
  if (!(sqrt (diff) <= tol * sqrt (norm)))
    {
      /* Where it went wrong, so that a failure seen once (a race, say)
       * tells from its log alone whether a few elements or whole blocks
       * are off: the elements off by more than tol times the reference's
       * root mean square, the first and the worst of them. */
      double rms = sqrt (norm / n), worst = 0.0;
      gsize off = 0, first = 0, at = 0;

      for (i = 0; i < n; i++)
        {
          double d = fabs (got[i] - want[i]);

          if (d > tol * rms && off++ == 0)
            first = i;
          if (d > worst)
            {
              worst = d;
              at = i;
            }
        }
      g_error ("%s: relative error %.3g > tolerance %.3g; %" G_GSIZE_FORMAT " of %" G_GSIZE_FORMAT
               " elements off by more than %.3g, the first at [%" G_GSIZE_FORMAT "] (%g for %g), "
               "the worst at [%" G_GSIZE_FORMAT "] (%g for %g)", what, sqrt (diff / norm), tol, off, n,
               tol * rms, first, got[first], want[first], at, got[at], want[at]);
    }
}

/* A tensor with device sizes @sizes and @capacity rows holding the
 * members of @host (whose rows are the fitting rows: the member offsets
 * then agree wherever there are rows). Poisoned past @host's bytes. */
GmlpGroupedTensor *
gmlp_test_device_sized_copy (GmlpGroupedTensor *host, GmlpGroupedTensor *sizes, gint64 capacity)
{
  GmlpDevice *device = gmlp_grouped_tensor_get_device (host);
  g_autoptr(GError) error = NULL;
  GmlpGroupedTensor *t;

  t = gmlp_grouped_tensor_new_with_device_sizes (device, gmlp_grouped_tensor_get_dtype (host), sizes,
                                                 capacity, gmlp_grouped_tensor_get_cols (host), &error);
  g_assert_no_error (error);
  g_assert_false (gmlp_grouped_tensor_has_host_sizes (t));
  g_assert_cmpuint (gmlp_grouped_tensor_get_nbytes (host), <=, gmlp_grouped_tensor_get_nbytes (t));
  g_assert_true (GMLP_DEVICE_CALL (device, copy, gmlp_grouped_tensor_get_data (t),
                                   gmlp_grouped_tensor_get_data (host),
                                   gmlp_grouped_tensor_get_nbytes (host), &error));
  g_assert_no_error (error);
  return t;
}

/* A host-sizes view of @t's storage whose members have @rows rows (the
 * fitting rows), to read results where the kernels put them. */
GmlpGroupedTensor *
gmlp_test_host_view (GmlpGroupedTensor *t, const gint64 *rows)
{
  GmlpGroupedTensor *view = gmlp_grouped_tensor_new_rows_view (t, rows,
                                                               gmlp_grouped_tensor_get_n_groups (t));

  g_assert_nonnull (view);
  return view;
}

const char *
gmlp_test_recipe_name (GmlpScalingRecipe recipe)
{
  static const char *const names[] = { "none", "delayed", "current", "blockwise", "mxfp8" };

  g_assert_cmpuint (recipe, <, G_N_ELEMENTS (names));
  return names[recipe];
}

double *
gmlp_test_dequantize (GmlpGroupedTensor *q)
{
  g_autoptr(GError) error = NULL;
  GmlpGroupedTensor *scales = gmlp_grouped_tensor_get_scale_inv (q);
  g_autoptr(GBytes) data = gmlp_grouped_tensor_to_bytes (q, &error);
  g_autoptr(GBytes) scale_bytes = NULL;
  gboolean mx = gmlp_grouped_tensor_get_scaling_recipe (q) == GMLP_SCALING_RECIPE_MXFP8;
  GmlpDType dtype = gmlp_grouped_tensor_get_dtype (q);
  guint n = gmlp_grouped_tensor_get_n_groups (q), g;
  gint64 cols = gmlp_grouped_tensor_get_cols (q), br, bc;
  gboolean transposed = gmlp_grouped_tensor_is_columnwise (q);
  const guint8 *d, *s;
  gsize i = 0, s0 = 0;
  double *values;

  g_assert_no_error (error);
  g_assert_nonnull (data);
  g_assert_nonnull (scales);
  g_assert_true (gmlp_grouped_tensor_get_scale_block (q, &br, &bc));
  scale_bytes = gmlp_grouped_tensor_to_bytes (scales, &error);
  g_assert_no_error (error);
  d = g_bytes_get_data (data, NULL);
  s = g_bytes_get_data (scale_bytes, NULL);
  values = g_new (double, MAX (g_bytes_get_size (data), 1));

  for (g = 0; g < n; g++)
    {
      gint64 m = gmlp_grouped_tensor_get_rows (q, g), r, c;
      gsize member = i;   /* the member's first value */
      gint64 grid_rows = br == 0 ? 1 : (m + br - 1) / br;
      gint64 grid_cols = bc == 0 ? 1 : (cols + bc - 1) / bc;

      for (r = 0; r < m; r++)
        for (c = 0; c < cols; c++, i++)
          {
            gsize at = s0 + (gsize) ((br == 0 ? 0 : r / br) * grid_cols + (bc == 0 ? 0 : c / bc));
            double scale;

            if (mx)
              scale = s[at] == 255 ? NAN : ldexp (1.0, (int) s[at] - 127);
            else
              {
                float f;
                memcpy (&f, s + at * sizeof (float), sizeof f);
                scale = f;
              }
            values[i] = gmlp_test_decode (d, dtype, transposed ? member + (gsize) (c * m + r) : i) * scale;
          }
      /* Per-tensor scales have a member for an empty group too. */
      s0 += (gsize) (grid_rows * grid_cols);
    }
  g_assert_cmpuint (i * gmlp_dtype_get_size (dtype), ==, g_bytes_get_size (data));
  return values;
}

GmlpQuantizer *
gmlp_test_copy_quantizer (GmlpDevice    *device,
                          GmlpQuantizer *q)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GVariant) state = gmlp_quantizer_save_state (q, &error);
  GmlpQuantizer *copy = g_object_new (GMLP_TYPE_QUANTIZER, "device", device,
                                      "recipe", gmlp_quantizer_get_recipe (q),
                                      "fp8-format", gmlp_quantizer_get_fp8_format (q),
                                      "role", gmlp_quantizer_get_role (q),
                                      "amax-history-length", gmlp_quantizer_get_amax_history_length (q),
                                      "power-of-2-scales", gmlp_quantizer_get_power_of_2_scales (q),
                                      NULL);

  g_assert_no_error (error);
  g_assert_true (gmlp_quantizer_restore_state (copy, state, &error));
  g_assert_no_error (error);
  return copy;
}

gboolean
gmlp_test_fp8_native (GmlpDevice *device)
{
  const char *name = gmlp_device_get_name (device);

  if (gmlp_device_get_kind (device) == GMLP_DEVICE_KIND_CPU)
    return TRUE;
  if (gmlp_test_tuned (device, "device-gemm", "portable"))
    return FALSE;
  return strstr (name, "H100") != NULL || strstr (name, "H200") != NULL || strstr (name, "H800") != NULL;
}

void
gmlp_test_step_bytes (GmlpGroupedLinear *layer,
                      GmlpGroupedTensor *y,
                      GmlpGroupedTensor *dx,
                      GBytes            *out[4])
{
  GmlpGroupedTensor *results[4] = { y, dx, gmlp_grouped_linear_get_wgrad (layer),
                                    gmlp_grouped_linear_get_bgrad (layer) };
  g_autoptr(GError) error = NULL;

  for (guint i = 0; i < 4; i++)
    {
      out[i] = gmlp_grouped_tensor_to_bytes (results[i], &error);
      g_assert_no_error (error);
    }
}

void
gmlp_test_assert_same_packed (GmlpGroupedTensor *a,
                              GmlpGroupedTensor *b,
                              const char        *what)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GBytes) x = NULL, y = NULL;
  const guint8 *p, *q;
  gsize i, n;

  g_assert_nonnull (a);
  g_assert_nonnull (b);
  g_assert_cmpint (gmlp_grouped_tensor_get_dtype (a), ==, gmlp_grouped_tensor_get_dtype (b));
  g_assert_cmpint (gmlp_grouped_tensor_get_n_groups (a), ==, gmlp_grouped_tensor_get_n_groups (b));
  g_assert_cmpint (gmlp_grouped_tensor_get_cols (a), ==, gmlp_grouped_tensor_get_cols (b));
  x = gmlp_grouped_tensor_to_bytes (a, &error);
  g_assert_no_error (error);
  y = gmlp_grouped_tensor_to_bytes (b, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (g_bytes_get_size (x), ==, g_bytes_get_size (y));
  p = g_bytes_get_data (x, &n);
  q = g_bytes_get_data (y, NULL);
  for (i = 0; i < n; i++)
    if (p[i] != q[i])
      g_error ("%s: byte %" G_GSIZE_FORMAT " of %" G_GSIZE_FORMAT " differs: 0x%02x, 0x%02x",
               what, i, n, p[i], q[i]);
}

void
gmlp_test_assert_same_bytes (GmlpGroupedTensor *a,
                             GmlpGroupedTensor *b,
                             const char        *what)
{
  guint i;

  g_assert_nonnull (a);
  g_assert_nonnull (b);
  g_assert_cmpint (gmlp_grouped_tensor_get_n_groups (a), ==, gmlp_grouped_tensor_get_n_groups (b));
  for (i = 0; i < gmlp_grouped_tensor_get_n_groups (a); i++)
    g_assert_cmpint (gmlp_grouped_tensor_get_rows (a, i), ==, gmlp_grouped_tensor_get_rows (b, i));
  gmlp_test_assert_same_packed (a, b, what);
}

void
gmlp_test_overwrite_values (GmlpGroupedTensor *tensor,
                            const double      *values)
{
  GmlpDevice *device = gmlp_grouped_tensor_get_device (tensor);
  g_autoptr(GmlpGroupedTensor) staged = gmlp_test_upload_values (device, values,
                                                                 gmlp_grouped_tensor_get_total_rows (tensor),
                                                                 gmlp_grouped_tensor_get_cols (tensor),
                                                                 gmlp_grouped_tensor_get_dtype (tensor));
  g_autoptr(GError) error = NULL;

  g_assert_cmpuint (gmlp_grouped_tensor_get_nbytes (staged), ==, gmlp_grouped_tensor_get_nbytes (tensor));
  g_assert_true (GMLP_DEVICE_CALL (device, copy, gmlp_grouped_tensor_get_data (tensor),
                                   gmlp_grouped_tensor_get_data (staged),
                                   gmlp_grouped_tensor_get_nbytes (staged), &error));
  g_assert_no_error (error);
}

void
gmlp_test_count_notify (GObject    *object,
                        GParamSpec *pspec,
                        gpointer    counter)
{
  (*(guint *) counter)++;
}

void
gmlp_test_linear_reference (const gint64 *rows,
                            guint         n_groups,
                            gint64        k,
                            gint64        o,
                            const double *x,
                            const double *w,
                            const double *b,
                            const double *dy,
                            const double *dy_bias,
                            double       *y,
                            double       *dx,
                            double       *dw,
                            double       *db)
{
  gint64 r0 = 0;
  guint g;

  for (g = 0; g < n_groups; g++)
    {
      const double *wg = w + g * o * k;
      gint64 r, j, c;

      if (y != NULL)
        for (r = r0; r < r0 + rows[g]; r++)
          for (j = 0; j < o; j++)
            {
              double acc = b != NULL ? b[g * o + j] : 0.0;
              for (c = 0; c < k; c++)
                acc += x[r * k + c] * wg[j * k + c];
              y[r * o + j] = acc;
            }
      if (dx != NULL)
        for (r = r0; r < r0 + rows[g]; r++)
          for (c = 0; c < k; c++)
            {
              double acc = 0.0;
              for (j = 0; j < o; j++)
                acc += dy[r * o + j] * wg[j * k + c];
              dx[r * k + c] = acc;
            }
      for (j = 0; j < o; j++)
        {
          if (dw != NULL)
            for (c = 0; c < k; c++)
              {
                double acc = 0.0;
                for (r = r0; r < r0 + rows[g]; r++)
                  acc += dy[r * o + j] * x[r * k + c];
                dw[(g * o + j) * k + c] = acc;
              }
          if (db != NULL)
            {
              double acc = 0.0;
              for (r = r0; r < r0 + rows[g]; r++)
                acc += dy_bias[r * o + j];
              db[g * o + j] = acc;
            }
        }
      r0 += rows[g];
    }
}

gint64 *
gmlp_test_clamped_rows (const gint64 *sizes,
                        guint         n,
                        gint64        capacity)
{
  gint64 *rows = g_new (gint64, MAX (n, 1));
  gint64 left = capacity;
  guint g;

  for (g = 0; g < n; g++)
    {
      rows[g] = MIN (MAX (sizes[g], 0), left);
      left -= rows[g];
    }
  return rows;
}

GmlpGroupedTensor *
gmlp_test_sizes_tensor (GmlpDevice   *device,
                        const gint64 *sizes,
                        guint         n)
{
  g_autoptr(GBytes) bytes = g_bytes_new (sizes, n * sizeof (gint64));
  g_autoptr(GError) error = NULL;
  gint64 len = n;
  GmlpGroupedTensor *t = gmlp_grouped_tensor_new_from_bytes (device, GMLP_DTYPE_INT64, &len, 1, 1,
                                                             bytes, &error);

  g_assert_no_error (error);
  return t;
}

double
gmlp_test_act (GmlpActivation act,
               double         x)
{
  switch (act)
    {
    case GMLP_ACTIVATION_GELU:
    case GMLP_ACTIVATION_GEGLU:
      {
        /* 1 + tanh (y) = 2 / (1 + exp (-2y)), which keeps its digits for
         * very negative y where 1 + tanh (y) cancels. */
        double y = sqrt (2.0 / G_PI) * (x + 0.044715 * x * x * x);
        return x / (1.0 + exp (-2.0 * y));
      }
    case GMLP_ACTIVATION_SWIGLU:
      return x / (1.0 + exp (-x));
    case GMLP_ACTIVATION_RELU:
      return x > 0 ? x : 0;
    case GMLP_ACTIVATION_SRELU:
      return x > 0 ? x * x : 0;
    default:
      g_assert_not_reached ();
    }
}

/* A central difference of the float64 function: an independent check of
 * the library's closed forms. */
double
gmlp_test_act_grad (GmlpActivation act,
                    double         x)
{
  const double h = 1e-6;

  if ((act == GMLP_ACTIVATION_RELU || act == GMLP_ACTIVATION_SRELU) && fabs (x) < h)
    return act == GMLP_ACTIVATION_RELU ? (x > 0) : 0.0;
  return (gmlp_test_act (act, x + h) - gmlp_test_act (act, x - h)) / (2 * h);
}

void
gmlp_test_mlp_reference (GmlpActivation     act,
                         GmlpDType          dtype,
                         const gint64      *rows,
                         guint              n_groups,
                         gint64             hid,
                         gint64             ffn,
                         const double      *x,
                         const double      *h,
                         const double      *dy,
                         const double      *w1,
                         const double      *w2,
                         const double      *b2,
                         GmlpTestMlpResult *out)
{
  gboolean gated = act == GMLP_ACTIVATION_SWIGLU || act == GMLP_ACTIVATION_GEGLU;
  gint64 w1o = gated ? 2 * ffn : ffn, total = 0, r, c;
  g_autofree double *a = NULL, *da = NULL, *dh = NULL;
  guint g;

  for (g = 0; g < n_groups; g++)
    total += rows[g];
  a = g_new0 (double, MAX (total * ffn, 1));
  da = g_new0 (double, MAX (total * ffn, 1));
  dh = g_new0 (double, MAX (total * w1o, 1));
  out->y = g_new0 (double, MAX (total * hid, 1));
  out->dx = g_new0 (double, MAX (total * hid, 1));
  out->dw1 = g_new0 (double, n_groups * w1o * hid);
  out->db1 = g_new0 (double, n_groups * w1o);
  out->dw2 = g_new0 (double, n_groups * hid * ffn);
  out->db2 = g_new0 (double, n_groups * hid);

  /* a = act (h), y = a W2ᵀ + b2; da = dy W2, dh = act' (h) da. */
  for (r = 0; r < total; r++)
    for (c = 0; c < ffn; c++)
      a[r * ffn + c] = gmlp_test_round (gated ? gmlp_test_act (act, h[r * w1o + c]) * h[r * w1o + ffn + c]
                                              : gmlp_test_act (act, h[r * w1o + c]), dtype);
  gmlp_test_linear_reference (rows, n_groups, ffn, hid, a, w2, b2, dy, dy, out->y, da, out->dw2, out->db2);
  for (r = 0; r < total; r++)
    for (c = 0; c < ffn; c++)
      {
        double hv = h[r * w1o + c];

        da[r * ffn + c] = gmlp_test_round (da[r * ffn + c], dtype);
        if (gated)
          {
            dh[r * w1o + c] = gmlp_test_round (da[r * ffn + c] * h[r * w1o + ffn + c] *
                                               gmlp_test_act_grad (act, hv), dtype);
            dh[r * w1o + ffn + c] = gmlp_test_round (da[r * ffn + c] * gmlp_test_act (act, hv), dtype);
          }
        else
          dh[r * w1o + c] = gmlp_test_round (da[r * ffn + c] * gmlp_test_act_grad (act, hv), dtype);
      }
  /* dx = dh W1, dW1 = dhᵀ x, db1 = Σ dh. */
  gmlp_test_linear_reference (rows, n_groups, hid, w1o, x, w1, NULL, dh, dh, NULL, out->dx, out->dw1,
                              out->db1);
}

void
gmlp_test_mlp_result_clear (GmlpTestMlpResult *result)
{
  g_clear_pointer (&result->y, g_free);
  g_clear_pointer (&result->dx, g_free);
  g_clear_pointer (&result->dw1, g_free);
  g_clear_pointer (&result->db1, g_free);
  g_clear_pointer (&result->dw2, g_free);
  g_clear_pointer (&result->db2, g_free);
}

void
gmlp_test_mlp_step (GmlpGroupedMLP     *mlp,
                    GmlpGroupedTensor  *x,
                    GmlpGroupedTensor  *dy,
                    gboolean            offload,
                    GmlpGroupedTensor **y,
                    GmlpGroupedTensor **dx,
                    guint64            *saved_nbytes)
{
  GmlpDevice *device = gmlp_grouped_linear_get_device (gmlp_grouped_mlp_get_fc1 (mlp));
  g_autoptr(GmlpOffloadContext) ctx = gmlp_offload_context_new (device, NULL);
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GError) error = NULL;
  GmlpLinearFlags flags;

  g_object_get (mlp, "flags", &flags, NULL);
  if (offload)
    gmlp_offload_context_push_thread_default (ctx, TRUE);
  *y = gmlp_grouped_mlp_forward (mlp, x, &saved, &error);
  if (offload)
    g_assert_true (gmlp_offload_context_pop_thread_default (ctx, NULL));
  g_assert_no_error (error);
  if (saved_nbytes != NULL)
    *saved_nbytes = gmlp_saved_activations_get_nbytes (saved);
  if (offload)
    {
      g_assert_true (gmlp_saved_activations_get_offload (saved));
      gmlp_offload_context_flush (ctx);
      g_assert_true (gmlp_saved_activations_get_host_nbytes (saved) > 0 ||
                     gmlp_saved_activations_get_nbytes (saved) == 0);
    }
  *dx = gmlp_grouped_mlp_backward (mlp, saved, dy, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_saved_activations_is_consumed (saved));
  if (flags & GMLP_LINEAR_DELAY_WGRAD_COMPUTE)
    {
      g_assert_true (gmlp_grouped_mlp_backward_dw (mlp, &error));
      g_assert_no_error (error);
    }
}

void
gmlp_test_prepare_threads (void)
{
  const GType types[] = {
    GMLP_TYPE_DEVICE, GMLP_TYPE_EVENT, GMLP_TYPE_GRAPH, GMLP_TYPE_GROUPED_TENSOR,
    GMLP_TYPE_GROUPED_LINEAR, GMLP_TYPE_GROUPED_MLP, GMLP_TYPE_QUANTIZER,
    GMLP_TYPE_OFFLOAD_CONTEXT, GMLP_TYPE_SAVED_ACTIVATIONS, GMLP_TYPE_COMMUNICATOR,
    GMLP_TYPE_ROUTER, GMLP_TYPE_ROUTING, GMLP_TYPE_MOE_LAYER, GMLP_TYPE_ACTIVATION,
    GMLP_TYPE_EXPERT_PARALLEL_MODE,
    GMLP_TYPE_DEVICE_KIND, GMLP_TYPE_DTYPE, GMLP_TYPE_ERROR, GMLP_TYPE_FP8_FORMAT,
    GMLP_TYPE_LINEAR_FLAGS, GMLP_TYPE_QUANTIZER_ROLE, GMLP_TYPE_SCALING_RECIPE,
  };
  g_autoptr(GObject) object = g_object_new (G_TYPE_OBJECT, NULL);
  GWeakRef weak;
  guint i;

  for (i = 0; i < G_N_ELEMENTS (types); i++)
    g_type_class_ref (types[i]);
  g_weak_ref_init (&weak, object);
  g_weak_ref_clear (&weak);
  (void) gmlp_error_quark ();
  /* GLib makes the lock of its error domains on first use: once here,
   * before the threads. */
  g_clear_error (&(GError *) { g_error_new_literal (GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT, "") });
}
