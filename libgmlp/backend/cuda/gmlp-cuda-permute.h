/* gmlp-cuda-permute.h: token permutation entries of the CUDA backend
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "backend/gmlp-backend.h"

G_BEGIN_DECLS

/* See the routing_count, routing_map and permute entries of GmlpBackend. */
gboolean gmlp_cuda_routing_count (GmlpBackendDevice            *device,
                                  const gint64                 *indices,
                                  gint64                        n_choices,
                                  guint                         n_experts,
                                  gint64                       *counts,
                                  GError                      **error);
gboolean gmlp_cuda_routing_map   (GmlpBackendDevice            *device,
                                  const GmlpBackendRoutingMap  *map,
                                  GError                      **error);
gboolean gmlp_cuda_permute       (GmlpBackendDevice            *device,
                                  const GmlpBackendPermute     *permute,
                                  GError                      **error);

G_END_DECLS
