/* gmlp-dtype.h: element types
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#if !defined(GMLP_INSIDE) && !defined(GMLP_COMPILATION)
# error "Only <gmlp.h> can be included directly."
#endif

#include <glib.h>

#include "gmlp-version-macros.h"

G_BEGIN_DECLS

/**
 * GmlpDType:
 * @GMLP_DTYPE_FLOAT32: IEEE 754 binary32
 * @GMLP_DTYPE_FLOAT16: IEEE 754 binary16
 * @GMLP_DTYPE_BFLOAT16: bfloat16 (8 exponent bits, 7 mantissa bits)
 * @GMLP_DTYPE_FLOAT8_E4M3: OCP FP8 E4M3 (no infinities, max 448)
 * @GMLP_DTYPE_FLOAT8_E5M2: OCP FP8 E5M2 (max 57344)
 * @GMLP_DTYPE_INT32: 32-bit signed integer
 * @GMLP_DTYPE_INT64: 64-bit signed integer
 *
 * The element type of a [class@Gmlp.GroupedTensor].
 *
 * Conversions between floating-point types round to nearest, ties to even.
 * Conversions to FP8 saturate as the OCP 8-bit floating point specification's
 * saturation mode (and CUDA's `satfinite`) does: finite values and infinities
 * beyond the largest finite value become that value with their sign; NaN stays
 * NaN (`0x7f` with the sign bit of the input). Conversions to FP16, BF16 and
 * FP32 follow IEEE 754: values beyond the range become infinities.
 *
 * INT64 to INT32 saturates too: values beyond the INT32 range become
 * %G_MININT32 or %G_MAXINT32, never a wrapped value. INT32 to INT64 is exact.
 *
 * Since: 0.1
 */
typedef enum {
  GMLP_DTYPE_FLOAT32,
  GMLP_DTYPE_FLOAT16,
  GMLP_DTYPE_BFLOAT16,
  GMLP_DTYPE_FLOAT8_E4M3,
  GMLP_DTYPE_FLOAT8_E5M2,
  GMLP_DTYPE_INT32,
  GMLP_DTYPE_INT64,
} GmlpDType;

GMLP_AVAILABLE_IN_0_1
gsize        gmlp_dtype_get_size        (GmlpDType dtype);
GMLP_AVAILABLE_IN_0_1
const char  *gmlp_dtype_get_name        (GmlpDType dtype);
GMLP_AVAILABLE_IN_0_1
gboolean     gmlp_dtype_is_floating     (GmlpDType dtype);
GMLP_AVAILABLE_IN_0_1
gboolean     gmlp_dtype_is_fp8          (GmlpDType dtype);
GMLP_AVAILABLE_IN_0_1
gboolean     gmlp_dtype_can_convert     (GmlpDType from,
                                         GmlpDType to);
GMLP_AVAILABLE_IN_0_1
guint8       gmlp_dtype_float_to_e4m3   (float     value);
GMLP_AVAILABLE_IN_0_1
guint8       gmlp_dtype_float_to_e5m2   (float     value);
GMLP_AVAILABLE_IN_0_1
guint16      gmlp_dtype_float_to_half   (float     value);
GMLP_AVAILABLE_IN_0_1
guint16      gmlp_dtype_float_to_bfloat16 (float   value);
GMLP_AVAILABLE_IN_0_1
float        gmlp_dtype_e4m3_to_float   (guint8    bits);
GMLP_AVAILABLE_IN_0_1
float        gmlp_dtype_e5m2_to_float   (guint8    bits);
GMLP_AVAILABLE_IN_0_1
float        gmlp_dtype_half_to_float   (guint16   bits);
GMLP_AVAILABLE_IN_0_1
float        gmlp_dtype_bfloat16_to_float (guint16 bits);

G_END_DECLS
