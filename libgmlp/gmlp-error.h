/* gmlp-error.h: the GMLP_ERROR domain
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
 * GMLP_ERROR:
 *
 * The error domain of libgmlp. Errors in it use [enum@Gmlp.Error] codes.
 *
 * Since: 0.1
 */
#define GMLP_ERROR (gmlp_error_quark ())

/**
 * GmlpError:
 * @GMLP_ERROR_INVALID_ARGUMENT: an argument is out of its valid range
 *   (negative or absurd sizes, an index out of range, a byte length that
 *   does not match the shape)
 * @GMLP_ERROR_SHAPE_MISMATCH: the shapes of two operands do not agree
 * @GMLP_ERROR_DTYPE_MISMATCH: an operand has the wrong element type
 * @GMLP_ERROR_UNSUPPORTED: the combination is valid but not implemented on
 *   this device or for these types; the message says why
 * @GMLP_ERROR_NO_DEVICE: the requested device does not exist or cannot be
 *   used (for example no NVIDIA driver, or the CUDA backend is not built)
 * @GMLP_ERROR_OUT_OF_MEMORY: an allocation on the device or host failed
 * @GMLP_ERROR_BACKEND: the backend (CUDA runtime, cuBLAS, a kernel) failed;
 *   the message carries the backend's own description
 * @GMLP_ERROR_INVALID_STATE: the object is not in a state that allows the
 *   call (for example saved activations that were already consumed)
 * @GMLP_ERROR_ABORTED: the group of a [class@Gmlp.Communicator] failed: a
 *   rank aborted it, left it or did not take part within the timeout; the
 *   message says which
 *
 * Error codes of the %GMLP_ERROR domain. Every error that depends on data
 * is reported before anything is written.
 *
 * Since: 0.1
 */
typedef enum {
  GMLP_ERROR_INVALID_ARGUMENT,
  GMLP_ERROR_SHAPE_MISMATCH,
  GMLP_ERROR_DTYPE_MISMATCH,
  GMLP_ERROR_UNSUPPORTED,
  GMLP_ERROR_NO_DEVICE,
  GMLP_ERROR_OUT_OF_MEMORY,
  GMLP_ERROR_BACKEND,
  GMLP_ERROR_INVALID_STATE,
  GMLP_ERROR_ABORTED,
} GmlpError;

GMLP_AVAILABLE_IN_0_1
GQuark gmlp_error_quark (void);

G_END_DECLS
