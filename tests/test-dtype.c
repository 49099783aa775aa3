/* test-dtype.c: scalar conversions against float64 models of the formats
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <locale.h>
#include <math.h>

#include "gmlp-test-util.h"

static const GmlpDType small_floats[] = {
  GMLP_DTYPE_FLOAT16, GMLP_DTYPE_BFLOAT16, GMLP_DTYPE_FLOAT8_E4M3, GMLP_DTYPE_FLOAT8_E5M2,
};

static guint32
encode (float v, GmlpDType dtype)
{
  switch (dtype)
    {
    case GMLP_DTYPE_FLOAT16: return gmlp_dtype_float_to_half (v);
    case GMLP_DTYPE_BFLOAT16: return gmlp_dtype_float_to_bfloat16 (v);
    case GMLP_DTYPE_FLOAT8_E4M3: return gmlp_dtype_float_to_e4m3 (v);
    case GMLP_DTYPE_FLOAT8_E5M2: return gmlp_dtype_float_to_e5m2 (v);
    default: g_assert_not_reached ();
    }
}

static float
decode (guint32 bits, GmlpDType dtype)
{
  switch (dtype)
    {
    case GMLP_DTYPE_FLOAT16: return gmlp_dtype_half_to_float ((guint16) bits);
    case GMLP_DTYPE_BFLOAT16: return gmlp_dtype_bfloat16_to_float ((guint16) bits);
    case GMLP_DTYPE_FLOAT8_E4M3: return gmlp_dtype_e4m3_to_float ((guint8) bits);
    case GMLP_DTYPE_FLOAT8_E5M2: return gmlp_dtype_e5m2_to_float ((guint8) bits);
    default: g_assert_not_reached ();
    }
}

/* Value of a bit pattern by the test's own model. */
static double
model_decode (guint32 bits, GmlpDType dtype)
{
  guint16 h = (guint16) bits;
  guint8 b = (guint8) bits;

  if (gmlp_dtype_get_size (dtype) == 2)
    return gmlp_test_decode (&h, dtype, 0);
  return gmlp_test_decode (&b, dtype, 0);
}

static void
test_sizes_and_names (void)
{
  g_assert_cmpuint (gmlp_dtype_get_size (GMLP_DTYPE_FLOAT32), ==, 4);
  g_assert_cmpuint (gmlp_dtype_get_size (GMLP_DTYPE_BFLOAT16), ==, 2);
  g_assert_cmpuint (gmlp_dtype_get_size (GMLP_DTYPE_FLOAT16), ==, 2);
  g_assert_cmpuint (gmlp_dtype_get_size (GMLP_DTYPE_FLOAT8_E4M3), ==, 1);
  g_assert_cmpuint (gmlp_dtype_get_size (GMLP_DTYPE_FLOAT8_E5M2), ==, 1);
  g_assert_cmpuint (gmlp_dtype_get_size (GMLP_DTYPE_INT32), ==, 4);
  g_assert_cmpuint (gmlp_dtype_get_size (GMLP_DTYPE_INT64), ==, 8);
  g_assert_cmpuint (gmlp_dtype_get_size ((GmlpDType) 42), ==, 0);
  g_assert_cmpstr (gmlp_dtype_get_name (GMLP_DTYPE_BFLOAT16), ==, "bfloat16");
  g_assert_cmpstr (gmlp_dtype_get_name ((GmlpDType) 42), ==, "invalid");
  g_assert_true (gmlp_dtype_is_fp8 (GMLP_DTYPE_FLOAT8_E5M2));
  g_assert_false (gmlp_dtype_is_fp8 (GMLP_DTYPE_FLOAT16));
  g_assert_true (gmlp_dtype_can_convert (GMLP_DTYPE_FLOAT8_E4M3, GMLP_DTYPE_FLOAT16));
  g_assert_true (gmlp_dtype_can_convert (GMLP_DTYPE_INT32, GMLP_DTYPE_INT64));
  g_assert_false (gmlp_dtype_can_convert (GMLP_DTYPE_INT32, GMLP_DTYPE_FLOAT32));
  g_assert_false (gmlp_dtype_can_convert (GMLP_DTYPE_FLOAT32, GMLP_DTYPE_INT64));
}

/* Every bit pattern of every small format decodes to the model's value and
 * re-encodes to itself (NaNs to a NaN). */
static void
test_exhaustive_decode (void)
{
  guint k;

  for (k = 0; k < G_N_ELEMENTS (small_floats); k++)
    {
      GmlpDType dtype = small_floats[k];
      guint32 n = gmlp_dtype_get_size (dtype) == 2 ? 65536 : 256;
      guint32 bits;

      for (bits = 0; bits < n; bits++)
        {
          double want = model_decode (bits, dtype);
          float got = decode (bits, dtype);

          gmlp_assert_same_value ((double) got, want, gmlp_dtype_get_name (dtype), bits);
          if (isinf (want) && gmlp_test_format (dtype)->saturate)
            /* Re-encoding infinity saturates (E5M2 has infinities). */
            gmlp_assert_same_value (model_decode (encode (got, dtype), dtype),
                                    copysign (gmlp_test_format (dtype)->max, want), "inf", bits);
          else if (!isnan (want))
            g_assert_cmphex (encode (got, dtype), ==, bits);
          else
            g_assert_true (isnan (model_decode (encode (got, dtype), dtype)));
        }
    }
}

/* Random floats over the whole range, the exact midpoints between
 * neighbouring values (ties), and the specials. */
static void
test_rounding (void)
{
  static const float specials[] = {
    0.0f, -0.0f, INFINITY, -INFINITY, 448.0f, 464.0f, 464.00003f, 479.9f, 480.0f, 1e30f,
    57344.0f, 61439.0f, 61440.0f, 65504.0f, 65519.99f, 65520.0f, -65520.0f, 1e-45f, -1e-45f,
    5.9604645e-08f, 2.9802322e-08f, 2.9802326e-08f, 0.0009765625f, 0.00048828125f, 3.4028235e38f,
  };
  guint k, i;

  for (k = 0; k < G_N_ELEMENTS (small_floats); k++)
    {
      GmlpDType dtype = small_floats[k];
      const char *name = gmlp_dtype_get_name (dtype);
      guint32 n_codes = gmlp_dtype_get_size (dtype) == 2 ? 65536 : 256;

      for (i = 0; i < G_N_ELEMENTS (specials); i++)
        gmlp_assert_same_value (model_decode (encode (specials[i], dtype), dtype),
                                gmlp_test_round (specials[i], dtype), name, i);

      for (i = 0; i < 200000; i++)
        {
          float v;

          if (i % 2 == 0)
            {
              /* Any float at all, over every binade. */
              guint32 u = (guint32) g_test_rand_int ();
              union { guint32 u; float f; } cast = { .u = u };
              v = cast.f;
            }
          else
            {
              /* The midpoint of two neighbouring codes, or a hair off it. */
              guint32 code = (guint32) g_test_rand_int_range (0, (gint32) n_codes - 1);
              double lo = model_decode (code, dtype), hi = model_decode (code + 1, dtype);
              if (!isfinite (lo) || !isfinite (hi) || signbit (lo) != signbit (hi))
                continue;
              v = (float) ((lo + hi) / 2.0);
              if (i % 3 == 0)
                v = nextafterf (v, g_test_rand_bit () ? INFINITY : -INFINITY);
            }
          gmlp_assert_same_value (model_decode (encode (v, dtype), dtype),
                                  gmlp_test_round (v, dtype), name, i);
        }
    }
}

/* FP8 saturates (OCP saturation mode): overflow and infinities become ±max,
 * NaN stays NaN with its sign. FP16/BF16 overflow to infinity. */
static void
test_specials (void)
{
  g_assert_cmphex (gmlp_dtype_float_to_e4m3 (INFINITY), ==, 0x7e);
  g_assert_cmphex (gmlp_dtype_float_to_e4m3 (-INFINITY), ==, 0xfe);
  g_assert_cmphex (gmlp_dtype_float_to_e4m3 (1e9f), ==, 0x7e);
  g_assert_cmphex (gmlp_dtype_float_to_e4m3 (NAN), ==, 0x7f);
  g_assert_cmphex (gmlp_dtype_float_to_e4m3 (-NAN), ==, 0xff);
  g_assert_cmphex (gmlp_dtype_float_to_e5m2 (INFINITY), ==, 0x7b);
  g_assert_cmphex (gmlp_dtype_float_to_e5m2 (-1e9f), ==, 0xfb);
  g_assert_cmphex (gmlp_dtype_float_to_e5m2 (NAN), ==, 0x7f);
  g_assert_cmphex (gmlp_dtype_float_to_e5m2 (-0.0f), ==, 0x80);
  g_assert_cmphex (gmlp_dtype_float_to_half (INFINITY), ==, 0x7c00);
  g_assert_cmphex (gmlp_dtype_float_to_half (70000.0f), ==, 0x7c00);
  g_assert_cmphex (gmlp_dtype_float_to_half (-0.0f), ==, 0x8000);
  g_assert_true (isnan (gmlp_dtype_half_to_float (gmlp_dtype_float_to_half (NAN))));
  g_assert_cmphex (gmlp_dtype_float_to_bfloat16 (-INFINITY), ==, 0xff80);
  g_assert_true (isnan (gmlp_dtype_bfloat16_to_float (gmlp_dtype_float_to_bfloat16 (NAN))));
  /* Smallest subnormals. */
  g_assert_cmphex (gmlp_dtype_float_to_e4m3 (0.001953125f), ==, 0x01);
  g_assert_cmphex (gmlp_dtype_float_to_e5m2 (1.52587890625e-05f), ==, 0x01);
  g_assert_cmphex (gmlp_dtype_float_to_half (5.9604645e-08f), ==, 0x0001);
}

int
main (int argc, char *argv[])
{
  setlocale (LC_ALL, "");
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Gmlp/DType/sizes-and-names", test_sizes_and_names);
  g_test_add_func ("/Gmlp/DType/exhaustive-decode", test_exhaustive_decode);
  g_test_add_func ("/Gmlp/DType/rounding", test_rounding);
  g_test_add_func ("/Gmlp/DType/specials", test_specials);

  return g_test_run ();
}
