/* gmlp-dtype-private.h: checks of the scalars the public API narrows
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "gmlp-dtype.h"

G_BEGIN_DECLS

/* What gmlp_dtype_narrow_double() accepts beside 0 and the finite values of
 * normal float magnitude (2^-126 to G_MAXFLOAT). */
typedef enum {
  GMLP_NARROW_DEFAULT      = 0,
  /* Refuse values below zero. */
  GMLP_NARROW_NOT_NEGATIVE = 1 << 0,
  /* Keep ±Inf given as such (a finite value past the float range is still
   * refused). */
  GMLP_NARROW_INFINITY     = 1 << 1,
  /* Keep magnitudes below 2^-126 that are float subnormals (a value that
   * would round to 0 is still refused). */
  GMLP_NARROW_SUBNORMAL    = 1 << 2,
} GmlpNarrowFlags;

/* The one check of every double the public API hands on as a float: value
 * into *out, or FALSE with GMLP_ERROR_INVALID_ARGUMENT naming @name (and
 * *out untouched) where the float would not mean @value: NaN, infinities
 * and negative values unless @flags allow them, finite values beyond
 * G_MAXFLOAT (they would become infinite) and nonzero values that would
 * lose their precision or become 0. */
gboolean  gmlp_dtype_narrow_double (double           value,
                                    const char      *name,
                                    GmlpNarrowFlags  flags,
                                    float           *out,
                                    GError         **error);

G_END_DECLS
