/* gmlp-cpu-quantize.h: FP8 quantization entries of the CPU backend
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "backend/gmlp-backend.h"

G_BEGIN_DECLS

/* See the quantize, dequantize and quantizer_update entries of GmlpBackend. */
gboolean gmlp_cpu_quantize         (GmlpBackendDevice       *device,
                                    const GmlpBackendShape  *shape,
                                    int                      recipe,
                                    int                      flags,
                                    gconstpointer            src,
                                    int                      src_dtype,
                                    int                      fp8_dtype,
                                    gpointer                 data,
                                    gpointer                 scale_inv,
                                    gpointer                 columnwise,
                                    gpointer                 columnwise_scale_inv,
                                    gint64                  *derived_rows,
                                    float                   *state,
                                    guint                    history_length,
                                    GError                 **error);
gboolean gmlp_cpu_dequantize       (GmlpBackendDevice       *device,
                                    const GmlpBackendShape  *shape,
                                    int                      recipe,
                                    int                      flags,
                                    gconstpointer            data,
                                    int                      fp8_dtype,
                                    gconstpointer            scale_inv,
                                    gpointer                 dst,
                                    int                      dst_dtype,
                                    GError                 **error);
gboolean gmlp_cpu_quantizer_update (GmlpBackendDevice       *device,
                                    float                   *state,
                                    guint                    n_groups,
                                    guint                    history_length,
                                    int                      fp8_dtype,
                                    int                      margin,
                                    GError                 **error);

G_END_DECLS
