/* gmlp-router-private.h: what the MoE layer uses of GmlpRouter
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "gmlp-router.h"

G_BEGIN_DECLS

GmlpGroupedTensor *gmlp_router_backward_into (GmlpRouter            *self,
                                              GmlpSavedActivations  *saved,
                                              GmlpGroupedTensor     *grad_probs,
                                              GmlpGroupedTensor     *grad_input,
                                              GError               **error);
/* gmlp_grouped_linear_add_pending_reads() of the gate: what the oldest
 * pending weight gradient reads. */
void               gmlp_router_add_pending_reads (GmlpRouter           *self,
                                                  GPtrArray            *reads);

G_END_DECLS
