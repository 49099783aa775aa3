/* gmlp-routing-private.h: what the router and the permutation share
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "gmlp-routing.h"

G_BEGIN_DECLS

struct _GmlpRouting
{
  GObject             parent_instance;

  GmlpDevice         *device;
  gint64              n_tokens;
  guint               top_k;
  guint               n_experts;
  GmlpGroupedTensor  *indices;            /* T × k INT64, one group */
  GmlpGroupedTensor  *probs;              /* T × k FP32, one group */
  GmlpGroupedTensor  *tokens_per_expert;  /* one member of n_experts INT64 values */
  GmlpGroupedTensor  *aux_loss;           /* 1 × 1 FP32 */
  GmlpGroupedTensor  *z_loss;             /* 1 × 1 FP32 */
};

/* A routing from a router's forward: every tensor made by the router's
 * backend entry and referenced here (T = the rows of indices). */
GmlpRouting *gmlp_routing_new_for_router (GmlpDevice        *device,
                                          guint              n_experts,
                                          GmlpGroupedTensor *indices,
                                          GmlpGroupedTensor *probs,
                                          GmlpGroupedTensor *tokens_per_expert,
                                          GmlpGroupedTensor *aux_loss,
                                          GmlpGroupedTensor *z_loss);

G_END_DECLS
