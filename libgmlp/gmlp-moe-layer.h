/* gmlp-moe-layer.h: a whole Mixture-of-Experts layer
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#if !defined(GMLP_INSIDE) && !defined(GMLP_COMPILATION)
# error "Only <gmlp.h> can be included directly."
#endif

#include <glib-object.h>

#include "gmlp-version-macros.h"
#include "gmlp-communicator.h"
#include "gmlp-device.h"
#include "gmlp-dtype.h"
#include "gmlp-grouped-linear.h"
#include "gmlp-grouped-mlp.h"
#include "gmlp-grouped-tensor.h"
#include "gmlp-router.h"
#include "gmlp-routing.h"
#include "gmlp-saved-activations.h"
#include "gmlp-scaling-recipe.h"

G_BEGIN_DECLS

/**
 * GmlpExpertParallelMode:
 * @GMLP_EXPERT_PARALLEL_MODE_EXACT: the tokens per expert are exchanged
 *   and read on the host once a forward; the rows travel in buffers of
 *   exactly their number (Megatron-Core's dispatcher). Dropless, as the
 *   one-device layer, but the forward waits for the device once.
 * @GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE: nothing is read on the host: each
 *   rank receives each of its experts' rows from each rank in a slot of a
 *   fixed number of rows ([property@Gmlp.MoELayer:expert-capacity-factor]),
 *   the counts travel on the device; rows past a slot are dropped and
 *   counted ([method@Gmlp.MoELayer.get_dropped_rows]). A step can be
 *   captured into a [class@Gmlp.Graph].
 *
 * How an expert-parallel [class@Gmlp.MoELayer] moves the tokens to their
 * experts' ranks and back ([property@Gmlp.MoELayer:expert-parallel-mode]).
 *
 * Since: 0.1
 */
typedef enum {
  GMLP_EXPERT_PARALLEL_MODE_EXACT,
  GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE,
} GmlpExpertParallelMode;

#define GMLP_TYPE_MOE_LAYER (gmlp_moe_layer_get_type ())

/**
 * GmlpMoELayerClass:
 * @parent_class: the parent class
 *
 * The class structure of #GmlpMoELayer, a final type: it has no virtual methods.
 *
 * Since: 0.1
 */
GMLP_AVAILABLE_IN_0_1
G_DECLARE_FINAL_TYPE (GmlpMoELayer, gmlp_moe_layer, GMLP, MOE_LAYER, GObject)

GMLP_AVAILABLE_IN_0_1
GmlpMoELayer      *gmlp_moe_layer_new                   (GmlpDevice            *device,
                                                         gint64                 hidden,
                                                         gint64                 ffn_hidden,
                                                         guint                  n_experts,
                                                         guint                  top_k,
                                                         GError               **error);
GMLP_AVAILABLE_IN_0_1
GmlpMoELayer      *gmlp_moe_layer_new_full              (GmlpDevice            *device,
                                                         gint64                 hidden,
                                                         gint64                 ffn_hidden,
                                                         guint                  n_experts,
                                                         guint                  top_k,
                                                         GmlpActivation         activation,
                                                         GmlpDType              dtype,
                                                         GmlpLinearFlags        flags,
                                                         GError               **error);

GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor *gmlp_moe_layer_forward               (GmlpMoELayer          *self,
                                                         GmlpGroupedTensor     *input,
                                                         GmlpSavedActivations **saved,
                                                         GError               **error);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor *gmlp_moe_layer_forward_inference     (GmlpMoELayer          *self,
                                                         GmlpGroupedTensor     *input,
                                                         GError               **error);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor *gmlp_moe_layer_backward              (GmlpMoELayer          *self,
                                                         GmlpSavedActivations  *saved,
                                                         GmlpGroupedTensor     *grad_output,
                                                         GError               **error);
GMLP_AVAILABLE_IN_0_1
gboolean           gmlp_moe_layer_backward_dw           (GmlpMoELayer          *self,
                                                         GError               **error);
GMLP_AVAILABLE_IN_0_1
gboolean           gmlp_moe_layer_init_parameters       (GmlpMoELayer          *self,
                                                         guint64                seed,
                                                         GError               **error);

GMLP_AVAILABLE_IN_0_1
gboolean           gmlp_moe_layer_set_fp8_recipe        (GmlpMoELayer          *self,
                                                         GmlpScalingRecipe      recipe,
                                                         GmlpFp8Format          format,
                                                         GError               **error);
GMLP_AVAILABLE_IN_0_1
GmlpScalingRecipe  gmlp_moe_layer_get_fp8_recipe        (GmlpMoELayer          *self);
GMLP_AVAILABLE_IN_0_1
GmlpFp8Format      gmlp_moe_layer_get_fp8_format        (GmlpMoELayer          *self);
GMLP_AVAILABLE_IN_0_1
gboolean           gmlp_moe_layer_update_quantizers     (GmlpMoELayer          *self,
                                                         GError               **error);

GMLP_AVAILABLE_IN_0_1
GmlpRouter        *gmlp_moe_layer_get_router            (GmlpMoELayer          *self);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedMLP    *gmlp_moe_layer_get_experts           (GmlpMoELayer          *self);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedMLP    *gmlp_moe_layer_get_shared_expert     (GmlpMoELayer          *self);
GMLP_AVAILABLE_IN_0_1
GmlpRouting       *gmlp_moe_layer_get_routing           (GmlpMoELayer          *self);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor *gmlp_moe_layer_get_aux_loss          (GmlpMoELayer          *self);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor *gmlp_moe_layer_get_tokens_per_expert (GmlpMoELayer          *self);

GMLP_AVAILABLE_IN_0_1
GmlpCommunicator  *gmlp_moe_layer_get_communicator      (GmlpMoELayer          *self);
GMLP_AVAILABLE_IN_0_1
GmlpExpertParallelMode gmlp_moe_layer_get_expert_parallel_mode (GmlpMoELayer     *self);
GMLP_AVAILABLE_IN_0_1
GmlpScalingRecipe  gmlp_moe_layer_get_dispatch_fp8_recipe (GmlpMoELayer        *self);
GMLP_AVAILABLE_IN_0_1
GmlpFp8Format      gmlp_moe_layer_get_dispatch_fp8_format (GmlpMoELayer        *self);
GMLP_AVAILABLE_IN_0_1
guint              gmlp_moe_layer_get_expert_parallel_chunks (GmlpMoELayer     *self);
GMLP_AVAILABLE_IN_0_1
guint              gmlp_moe_layer_get_first_local_expert (GmlpMoELayer         *self);
GMLP_AVAILABLE_IN_0_1
guint              gmlp_moe_layer_get_n_local_experts   (GmlpMoELayer          *self);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor *gmlp_moe_layer_get_dropped_rows      (GmlpMoELayer          *self);

GMLP_AVAILABLE_IN_0_1
GmlpDevice        *gmlp_moe_layer_get_device            (GmlpMoELayer          *self);
GMLP_AVAILABLE_IN_0_1
gint64             gmlp_moe_layer_get_hidden            (GmlpMoELayer          *self);
GMLP_AVAILABLE_IN_0_1
gint64             gmlp_moe_layer_get_ffn_hidden        (GmlpMoELayer          *self);
GMLP_AVAILABLE_IN_0_1
guint              gmlp_moe_layer_get_n_experts         (GmlpMoELayer          *self);
GMLP_AVAILABLE_IN_0_1
guint              gmlp_moe_layer_get_top_k             (GmlpMoELayer          *self);

G_END_DECLS
