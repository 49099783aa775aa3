/* gmlp-cpu-gemm-fp8.h: FP8 grouped products of the CPU backend
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "backend/gmlp-backend.h"

G_BEGIN_DECLS

/* See the gemm_fp8 entry of GmlpBackend. */
gboolean gmlp_cpu_gemm_fp8 (GmlpBackendDevice          *device,
                            const GmlpBackendGemmFp8   *gemm,
                            GError                    **error);

G_END_DECLS
