/* gmlp-error.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-error.h"

G_DEFINE_QUARK (gmlp-error-quark, gmlp_error)
