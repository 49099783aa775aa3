/* gmlp-router.h: the gate of a Mixture-of-Experts layer
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#if !defined(GMLP_INSIDE) && !defined(GMLP_COMPILATION)
# error "Only <gmlp.h> can be included directly."
#endif

#include <gio/gio.h>

#include "gmlp-version-macros.h"
#include "gmlp-device.h"
#include "gmlp-event.h"
#include "gmlp-grouped-linear.h"
#include "gmlp-grouped-tensor.h"
#include "gmlp-routing.h"
#include "gmlp-saved-activations.h"

G_BEGIN_DECLS

/**
 * GmlpScoreFunction:
 * @GMLP_SCORE_FUNCTION_SOFTMAX: the softmax over all experts' logits
 * @GMLP_SCORE_FUNCTION_SIGMOID: the sigmoid of each logit (DeepSeek-V3)
 *
 * How a [class@Gmlp.Router] turns its logits into scores.
 *
 * Since: 0.1
 */
typedef enum {
  GMLP_SCORE_FUNCTION_SOFTMAX,
  GMLP_SCORE_FUNCTION_SIGMOID,
} GmlpScoreFunction;

#define GMLP_TYPE_ROUTER (gmlp_router_get_type ())

/**
 * GmlpRouterClass:
 * @parent_class: the parent class
 *
 * The class structure of #GmlpRouter, a final type: it has no virtual methods.
 *
 * Since: 0.1
 */
GMLP_AVAILABLE_IN_0_1
G_DECLARE_FINAL_TYPE (GmlpRouter, gmlp_router, GMLP, ROUTER, GObject)

GMLP_AVAILABLE_IN_0_1
GmlpRouter         *gmlp_router_new                       (GmlpDevice            *device,
                                                           gint64                 hidden,
                                                           guint                  n_experts,
                                                           guint                  top_k,
                                                           GError               **error);

GMLP_AVAILABLE_IN_0_1
GmlpRouting        *gmlp_router_forward                   (GmlpRouter            *self,
                                                           GmlpGroupedTensor     *input,
                                                           GmlpSavedActivations **saved,
                                                           GError               **error);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor  *gmlp_router_backward                  (GmlpRouter            *self,
                                                           GmlpSavedActivations  *saved,
                                                           GmlpGroupedTensor     *grad_probs,
                                                           GError               **error);
GMLP_AVAILABLE_IN_0_1
gboolean            gmlp_router_backward_dw               (GmlpRouter            *self,
                                                           GError               **error);
GMLP_AVAILABLE_IN_0_1
gboolean            gmlp_router_update_expert_bias        (GmlpRouter            *self,
                                                           GmlpGroupedTensor     *tokens_per_expert,
                                                           GError               **error);

GMLP_AVAILABLE_IN_0_1
gboolean            gmlp_router_init_parameters           (GmlpRouter            *self,
                                                           guint64                seed,
                                                           GError               **error);
GMLP_AVAILABLE_IN_0_1
gboolean            gmlp_router_set_weight_from_bytes     (GmlpRouter            *self,
                                                           GBytes                *bytes,
                                                           GError               **error);
GMLP_AVAILABLE_IN_0_1
gboolean            gmlp_router_set_expert_bias_from_bytes (GmlpRouter           *self,
                                                           GBytes                *bytes,
                                                           GError               **error);
GMLP_AVAILABLE_IN_0_1
gboolean            gmlp_router_set_main_grad             (GmlpRouter            *self,
                                                           GmlpGroupedTensor     *main_grad,
                                                           GError               **error);

GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor  *gmlp_router_get_weight                (GmlpRouter            *self);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor  *gmlp_router_get_wgrad                 (GmlpRouter            *self);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor  *gmlp_router_get_main_grad             (GmlpRouter            *self);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor  *gmlp_router_get_expert_bias           (GmlpRouter            *self);

GMLP_AVAILABLE_IN_0_1
GmlpDevice         *gmlp_router_get_device                (GmlpRouter            *self);
GMLP_AVAILABLE_IN_0_1
gint64              gmlp_router_get_hidden                (GmlpRouter            *self);
GMLP_AVAILABLE_IN_0_1
guint               gmlp_router_get_n_experts             (GmlpRouter            *self);
GMLP_AVAILABLE_IN_0_1
guint               gmlp_router_get_top_k                 (GmlpRouter            *self);
GMLP_AVAILABLE_IN_0_1
GmlpScoreFunction   gmlp_router_get_score_function        (GmlpRouter            *self);
GMLP_AVAILABLE_IN_0_1
GmlpLinearFlags     gmlp_router_get_flags                 (GmlpRouter            *self);
GMLP_AVAILABLE_IN_0_1
guint               gmlp_router_get_pending_wgrads        (GmlpRouter            *self);
GMLP_AVAILABLE_IN_0_1
gboolean            gmlp_router_get_grad_added_to_main_grad (GmlpRouter          *self);

G_END_DECLS
