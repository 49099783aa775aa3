/* gmlp-routing.h: where each token of a Mixture-of-Experts layer goes
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#if !defined(GMLP_INSIDE) && !defined(GMLP_COMPILATION)
# error "Only <gmlp.h> can be included directly."
#endif

#include <glib-object.h>

#include "gmlp-version-macros.h"
#include "gmlp-device.h"
#include "gmlp-grouped-tensor.h"

G_BEGIN_DECLS

#define GMLP_TYPE_ROUTING (gmlp_routing_get_type ())

/**
 * GmlpRoutingClass:
 * @parent_class: the parent class
 *
 * The class structure of #GmlpRouting, a final type: it has no virtual methods.
 *
 * Since: 0.1
 */
GMLP_AVAILABLE_IN_0_1
G_DECLARE_FINAL_TYPE (GmlpRouting, gmlp_routing, GMLP, ROUTING, GObject)

GMLP_AVAILABLE_IN_0_1
GmlpRouting       *gmlp_routing_new                   (GmlpDevice         *device,
                                                       GmlpGroupedTensor  *indices,
                                                       GmlpGroupedTensor  *probs,
                                                       guint               n_experts,
                                                       GError            **error);
GMLP_AVAILABLE_IN_0_1
GmlpDevice        *gmlp_routing_get_device            (GmlpRouting *self);
GMLP_AVAILABLE_IN_0_1
gint64             gmlp_routing_get_n_tokens          (GmlpRouting *self);
GMLP_AVAILABLE_IN_0_1
guint              gmlp_routing_get_top_k             (GmlpRouting *self);
GMLP_AVAILABLE_IN_0_1
guint              gmlp_routing_get_n_experts         (GmlpRouting *self);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor *gmlp_routing_get_indices           (GmlpRouting *self);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor *gmlp_routing_get_probs             (GmlpRouting *self);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor *gmlp_routing_get_tokens_per_expert (GmlpRouting *self);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor *gmlp_routing_get_aux_loss          (GmlpRouting *self);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor *gmlp_routing_get_z_loss            (GmlpRouting *self);

GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor *gmlp_routing_permute               (GmlpRouting        *self,
                                                       GmlpGroupedTensor  *x,
                                                       GError            **error);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor *gmlp_routing_permute_full          (GmlpRouting        *self,
                                                       GmlpGroupedTensor  *x,
                                                       guint               padding,
                                                       double              capacity_factor,
                                                       GError            **error);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor *gmlp_routing_combine               (GmlpRouting        *self,
                                                       GmlpGroupedTensor  *y,
                                                       GError            **error);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor *gmlp_routing_permute_backward      (GmlpRouting        *self,
                                                       GmlpGroupedTensor  *grad_permuted,
                                                       GError            **error);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor *gmlp_routing_combine_backward      (GmlpRouting        *self,
                                                       GmlpGroupedTensor  *grad_out,
                                                       GmlpGroupedTensor  *y,
                                                       GmlpGroupedTensor **grad_probs,
                                                       GError            **error);

G_END_DECLS
