/* gmlp-router-private.h: what the MoE layer uses of GmlpRouter
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "gmlp-router.h"

G_BEGIN_DECLS

/* gmlp_router_backward() whose input gradient is FP32, not rounded to the
 * input's dtype (the MoE layer adds it to its permute backward's sum
 * before that one rounding). */
GmlpGroupedTensor *gmlp_router_backward_fp32 (GmlpRouter            *self,
                                              GmlpSavedActivations  *saved,
                                              GmlpGroupedTensor     *grad_probs,
                                              GError               **error);
/* gmlp_grouped_linear_add_pending_reads() of the gate: what the oldest
 * pending weight gradient reads. */
void               gmlp_router_add_pending_reads (GmlpRouter           *self,
                                                  GPtrArray            *reads);

G_END_DECLS
