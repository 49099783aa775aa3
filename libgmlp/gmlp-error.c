/* gmlp-error.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-error.h"
#include "gmlp-error-private.h"
#include "gmlp-thread-private.h"

/**
 * gmlp_error_quark:
 *
 * Gets the quark of libgmlp's error domain, %GMLP_ERROR; bindings use it to
 * tell libgmlp's errors from others.
 *
 * Returns: the quark of %GMLP_ERROR
 *
 * Since: 0.1
 */
GMLP_DEFINE_QUARK (gmlp-error-quark, gmlp_error)

gboolean
gmlp_check_constructed (gconstpointer  object,
                        const GError  *construct_error,
                        GError       **error)
{
  if (G_LIKELY (construct_error == NULL))
    return TRUE;

  g_set_error (error, construct_error->domain, construct_error->code,
               "This %s could not be constructed: %s",
               G_OBJECT_TYPE_NAME (object), construct_error->message);
  return FALSE;
}
