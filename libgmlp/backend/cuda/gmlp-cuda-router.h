/* gmlp-cuda-router.h: the router entries of the CUDA backend
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "backend/gmlp-backend.h"

G_BEGIN_DECLS

/* See the router_forward, router_backward and router_update_bias entries
 * of GmlpBackend. */
gboolean gmlp_cuda_router_forward     (GmlpBackendDevice        *device,
                                       const GmlpBackendRouter  *router,
                                       const float              *logits,
                                       const float              *expert_bias,
                                       gint64                   *indices,
                                       float                    *probs,
                                       gint64                   *tokens_per_expert,
                                       float                    *aux_loss,
                                       float                    *z_loss,
                                       GError                  **error);
gboolean gmlp_cuda_router_backward    (GmlpBackendDevice        *device,
                                       const GmlpBackendRouter  *router,
                                       const float              *logits,
                                       const gint64             *indices,
                                       const gint64             *tokens_per_expert,
                                       const float              *grad_probs,
                                       float                    *grad_logits,
                                       GError                  **error);
gboolean gmlp_cuda_router_update_bias (GmlpBackendDevice        *device,
                                       guint                     n_experts,
                                       const gint64             *tokens_per_expert,
                                       float                     rate,
                                       float                    *expert_bias,
                                       GError                  **error);

G_END_DECLS
