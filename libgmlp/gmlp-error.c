/* gmlp-error.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-error.h"
#include "gmlp-thread-private.h"

GMLP_DEFINE_QUARK (gmlp-error-quark, gmlp_error)
