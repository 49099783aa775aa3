/* gmlp-error-private.h: errors shared by every class
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <glib-object.h>

G_BEGIN_DECLS

/* Objects do their construction in constructed(), so that g_object_new()
 * with the construct properties gives a complete object; what went wrong
 * there is kept as @construct_error, returned by GInitable's init and by
 * every method, so that an object whose construction failed never crashes.
 * Returns TRUE when @construct_error is NULL. */
gboolean gmlp_check_constructed (gconstpointer  object,
                                 const GError  *construct_error,
                                 GError       **error);

/* Checked arithmetic for sizes that callers give: FALSE when the result
 * does not fit in 64 bits. */
static inline gboolean
gmlp_checked_mul (guint64  a,
                  guint64  b,
                  guint64 *result)
{
  return !__builtin_mul_overflow (a, b, result);
}

static inline gboolean
gmlp_checked_add (guint64  a,
                  guint64  b,
                  guint64 *result)
{
  return !__builtin_add_overflow (a, b, result);
}

G_END_DECLS
