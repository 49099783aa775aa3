/* gmlp-version-macros.h: symbol visibility and availability annotations
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#if !defined(GMLP_INSIDE) && !defined(GMLP_COMPILATION)
# error "Only <gmlp.h> can be included directly."
#endif

#include <glib.h>

#include "gmlp-version.h"

#ifndef _GMLP_EXTERN
# define _GMLP_EXTERN __attribute__((visibility ("default"))) extern
#endif

#define GMLP_VERSION_0_1 (G_ENCODE_VERSION (0, 1))

#define GMLP_VERSION_CUR_STABLE (G_ENCODE_VERSION (GMLP_MAJOR_VERSION, GMLP_MINOR_VERSION))

#ifndef GMLP_VERSION_MIN_REQUIRED
# define GMLP_VERSION_MIN_REQUIRED GMLP_VERSION_CUR_STABLE
#endif

#ifndef GMLP_VERSION_MAX_ALLOWED
# define GMLP_VERSION_MAX_ALLOWED GMLP_VERSION_CUR_STABLE
#endif

#define GMLP_AVAILABLE_IN_ALL _GMLP_EXTERN

#if GMLP_VERSION_MAX_ALLOWED < GMLP_VERSION_0_1
# define GMLP_AVAILABLE_IN_0_1 G_UNAVAILABLE (0, 1) _GMLP_EXTERN
#else
# define GMLP_AVAILABLE_IN_0_1 _GMLP_EXTERN
#endif
