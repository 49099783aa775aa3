/* gmlp-cpu-activation-quantize.h: the fused activation and FP8 quantization
 * of the CPU backend
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "backend/gmlp-backend.h"

G_BEGIN_DECLS

/* See the activation_quantize entry of GmlpBackend. */
gboolean gmlp_cpu_activation_quantize (GmlpBackendDevice          *device,
                                       const GmlpBackendQuantize  *quantize,
                                       GError                    **error);

G_END_DECLS
