/* gmlp-dtype.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <math.h>

#include "gmlp-dtype-private.h"
#include "gmlp-error.h"
#include "gmlp-numeric.h"

G_STATIC_ASSERT ((int) GMLP_DTYPE_FLOAT32 == (int) GMLP_NUM_FLOAT32);
G_STATIC_ASSERT ((int) GMLP_DTYPE_FLOAT16 == (int) GMLP_NUM_FLOAT16);
G_STATIC_ASSERT ((int) GMLP_DTYPE_BFLOAT16 == (int) GMLP_NUM_BFLOAT16);
G_STATIC_ASSERT ((int) GMLP_DTYPE_FLOAT8_E4M3 == (int) GMLP_NUM_FLOAT8_E4M3);
G_STATIC_ASSERT ((int) GMLP_DTYPE_FLOAT8_E5M2 == (int) GMLP_NUM_FLOAT8_E5M2);
G_STATIC_ASSERT ((int) GMLP_DTYPE_INT32 == (int) GMLP_NUM_INT32);
G_STATIC_ASSERT ((int) GMLP_DTYPE_INT64 == (int) GMLP_NUM_INT64);

/**
 * gmlp_dtype_get_size:
 * @dtype: a [enum@Gmlp.DType]
 *
 * Gets the size of one element of @dtype.
 *
 * Returns: the size of one element in bytes, or 0 for an invalid @dtype
 *
 * Since: 0.1
 */
gsize
gmlp_dtype_get_size (GmlpDType dtype)
{
  return gmlp_num_dtype_size ((int) dtype);
}

/**
 * gmlp_dtype_get_name:
 * @dtype: a [enum@Gmlp.DType]
 *
 * Gets the short name of @dtype, as the benchmarks and error messages print
 * it.
 *
 * Returns: (transfer none): a short name such as "bfloat16", or "invalid"
 *
 * Since: 0.1
 */
const char *
gmlp_dtype_get_name (GmlpDType dtype)
{
  switch (dtype)
    {
    case GMLP_DTYPE_FLOAT32: return "float32";
    case GMLP_DTYPE_FLOAT16: return "float16";
    case GMLP_DTYPE_BFLOAT16: return "bfloat16";
    case GMLP_DTYPE_FLOAT8_E4M3: return "float8_e4m3";
    case GMLP_DTYPE_FLOAT8_E5M2: return "float8_e5m2";
    case GMLP_DTYPE_INT32: return "int32";
    case GMLP_DTYPE_INT64: return "int64";
    default: return "invalid";
    }
}

/**
 * gmlp_dtype_is_floating:
 * @dtype: a [enum@Gmlp.DType]
 *
 * Tells whether @dtype holds floating-point numbers.
 *
 * Returns: %TRUE for the floating-point types, FP8 included
 *
 * Since: 0.1
 */
gboolean
gmlp_dtype_is_floating (GmlpDType dtype)
{
  return dtype >= GMLP_DTYPE_FLOAT32 && dtype <= GMLP_DTYPE_FLOAT8_E5M2;
}

/**
 * gmlp_dtype_is_fp8:
 * @dtype: a [enum@Gmlp.DType]
 *
 * Tells whether @dtype is one of the 8-bit floating-point types,
 * %GMLP_DTYPE_FLOAT8_E4M3 or %GMLP_DTYPE_FLOAT8_E5M2.
 *
 * Returns: %TRUE for the two FP8 types
 *
 * Since: 0.1
 */
gboolean
gmlp_dtype_is_fp8 (GmlpDType dtype)
{
  return dtype == GMLP_DTYPE_FLOAT8_E4M3 || dtype == GMLP_DTYPE_FLOAT8_E5M2;
}

/**
 * gmlp_dtype_can_convert:
 * @from: the source type
 * @to: the destination type
 *
 * Whether [method@Gmlp.GroupedTensor.convert] supports this pair for a
 * tensor without scales: any floating type to any floating type, INT32 and
 * INT64 to each other (INT64 to INT32 saturating), and any type to itself.
 * A tensor made by a [class@Gmlp.Quantizer] converts to FP32, FP16 and
 * BF16 only, with its scales applied.
 *
 * Returns: %TRUE if the conversion is supported
 *
 * Since: 0.1
 */
gboolean
gmlp_dtype_can_convert (GmlpDType from,
                        GmlpDType to)
{
  if (gmlp_dtype_get_size (from) == 0 || gmlp_dtype_get_size (to) == 0)
    return FALSE;
  return from == to ||
         (gmlp_dtype_is_floating (from) && gmlp_dtype_is_floating (to)) ||
         (!gmlp_dtype_is_floating (from) && !gmlp_dtype_is_floating (to));
}

gboolean
gmlp_dtype_narrow_double (double           value,
                          const char      *name,
                          GmlpNarrowFlags  flags,
                          float           *out,
                          GError         **error)
{
  double magnitude = fabs (value);
  const char *why = NULL;

  if (isnan (value))
    why = "it must be a number";
  else if (value < 0.0 && (flags & GMLP_NARROW_NOT_NEGATIVE) != 0)
    why = "it must not be negative";
  else if (isinf (value))
    why = (flags & GMLP_NARROW_INFINITY) != 0 ? NULL : "it must be finite";
  else if (magnitude > G_MAXFLOAT)
    why = "beyond the float range (3.4e38), it would become infinite";
  else if (magnitude != 0.0 && magnitude < G_MINFLOAT &&
           ((flags & GMLP_NARROW_SUBNORMAL) == 0 || (float) magnitude == 0.0f))
    why = (flags & GMLP_NARROW_SUBNORMAL) != 0
          ? "below the smallest float (1.4e-45), it would become 0"
          : "below the float range (1.2e-38), it would lose its precision or become 0";

  if (why != NULL)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT, "%s is %g: %s", name, value, why);
      return FALSE;
    }
  *out = (float) value;
  return TRUE;
}

/**
 * gmlp_dtype_float_to_e4m3:
 * @value: a float
 *
 * Rounds @value to FP8 E4M3 as libgmlp's kernels do (nearest even,
 * saturating, see [enum@Gmlp.DType]).
 *
 * Returns: the E4M3 bit pattern
 *
 * Since: 0.1
 */
guint8
gmlp_dtype_float_to_e4m3 (float value)
{
  return gmlp_num_float_to_e4m3 (value);
}

/**
 * gmlp_dtype_float_to_e5m2:
 * @value: a float
 *
 * Rounds @value to FP8 E5M2 (nearest even, saturating).
 *
 * Returns: the E5M2 bit pattern
 *
 * Since: 0.1
 */
guint8
gmlp_dtype_float_to_e5m2 (float value)
{
  return gmlp_num_float_to_e5m2 (value);
}

/**
 * gmlp_dtype_float_to_half:
 * @value: a float
 *
 * Rounds @value to IEEE binary16 (nearest even; overflow gives infinity).
 *
 * Returns: the binary16 bit pattern
 *
 * Since: 0.1
 */
guint16
gmlp_dtype_float_to_half (float value)
{
  return gmlp_num_float_to_half (value);
}

/**
 * gmlp_dtype_float_to_bfloat16:
 * @value: a float
 *
 * Rounds @value to bfloat16 (nearest even; NaN stays a quiet NaN).
 *
 * Returns: the bfloat16 bit pattern
 *
 * Since: 0.1
 */
guint16
gmlp_dtype_float_to_bfloat16 (float value)
{
  return gmlp_num_float_to_bfloat16 (value);
}

/**
 * gmlp_dtype_e4m3_to_float:
 * @bits: an FP8 E4M3 bit pattern
 *
 * Decodes one FP8 E4M3 byte (4 exponent bits, 3 mantissa bits, no infinities)
 * into a float.
 *
 * Returns: its value (exact)
 *
 * Since: 0.1
 */
float
gmlp_dtype_e4m3_to_float (guint8 bits)
{
  return gmlp_num_e4m3_to_float (bits);
}

/**
 * gmlp_dtype_e5m2_to_float:
 * @bits: an FP8 E5M2 bit pattern
 *
 * Decodes one FP8 E5M2 byte (5 exponent bits, 2 mantissa bits) into a float.
 *
 * Returns: its value (exact)
 *
 * Since: 0.1
 */
float
gmlp_dtype_e5m2_to_float (guint8 bits)
{
  return gmlp_num_e5m2_to_float (bits);
}

/**
 * gmlp_dtype_half_to_float:
 * @bits: an IEEE binary16 bit pattern
 *
 * Decodes one IEEE binary16 value, given as its 16 bits, into a float.
 *
 * Returns: its value (exact)
 *
 * Since: 0.1
 */
float
gmlp_dtype_half_to_float (guint16 bits)
{
  return gmlp_num_half_to_float (bits);
}

/**
 * gmlp_dtype_bfloat16_to_float:
 * @bits: a bfloat16 bit pattern
 *
 * Decodes one bfloat16 value, given as its 16 bits, into a float.
 *
 * Returns: its value (exact)
 *
 * Since: 0.1
 */
float
gmlp_dtype_bfloat16_to_float (guint16 bits)
{
  return gmlp_num_bfloat16_to_float (bits);
}
