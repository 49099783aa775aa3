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

G_END_DECLS
