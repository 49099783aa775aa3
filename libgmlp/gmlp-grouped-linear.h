/* gmlp-grouped-linear.h: the MoE expert linear layer
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
#include "gmlp-dtype.h"
#include "gmlp-event.h"
#include "gmlp-grouped-tensor.h"
#include "gmlp-quantizer.h"
#include "gmlp-saved-activations.h"

G_BEGIN_DECLS

/**
 * GmlpLinearFlags:
 * @GMLP_LINEAR_NONE: no option
 * @GMLP_LINEAR_BIAS: the layer has a bias per group
 *   ([property@Gmlp.GroupedLinear:bias])
 * @GMLP_LINEAR_SINGLE_GROUPED_WEIGHT: parameters and their gradients are
 *   exposed as grouped tensors rather than per group
 *   ([property@Gmlp.GroupedLinear:single-grouped-weight])
 * @GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION: weight gradients are added into the
 *   FP32 main_grad in the GEMM epilogue
 *   ([property@Gmlp.GroupedLinear:fuse-wgrad-accumulation])
 * @GMLP_LINEAR_DELAY_WGRAD_COMPUTE: weight gradients are computed by
 *   [method@Gmlp.GroupedLinear.backward_dw], not by backward
 *   ([property@Gmlp.GroupedLinear:delay-wgrad-compute])
 * @GMLP_LINEAR_RECOMPUTE_ACTIVATION: for [class@Gmlp.GroupedMLP] only: the
 *   activation is recomputed in backward instead of saved
 *   ([property@Gmlp.GroupedMLP:recompute-activation])
 *
 * Options of [ctor@Gmlp.GroupedLinear.new_full] and
 * [ctor@Gmlp.GroupedMLP.new_full], one per construct property.
 *
 * Since: 0.1
 */
typedef enum /*< flags >*/ {
  GMLP_LINEAR_NONE = 0,
  GMLP_LINEAR_BIAS = 1 << 0,
  GMLP_LINEAR_SINGLE_GROUPED_WEIGHT = 1 << 1,
  GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION = 1 << 2,
  GMLP_LINEAR_DELAY_WGRAD_COMPUTE = 1 << 3,
  GMLP_LINEAR_RECOMPUTE_ACTIVATION = 1 << 4,
} GmlpLinearFlags;

#define GMLP_TYPE_GROUPED_LINEAR (gmlp_grouped_linear_get_type ())

/**
 * GmlpGroupedLinearClass:
 * @parent_class: the parent class
 *
 * The class structure of #GmlpGroupedLinear, a final type: it has no virtual methods.
 *
 * Since: 0.1
 */
GMLP_AVAILABLE_IN_0_1
G_DECLARE_FINAL_TYPE (GmlpGroupedLinear, gmlp_grouped_linear, GMLP, GROUPED_LINEAR, GObject)

GMLP_AVAILABLE_IN_0_1
GmlpGroupedLinear    *gmlp_grouped_linear_new                     (GmlpDevice            *device,
                                                                   guint                  n_groups,
                                                                   gint64                 in_features,
                                                                   gint64                 out_features,
                                                                   GError               **error);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedLinear    *gmlp_grouped_linear_new_full                (GmlpDevice            *device,
                                                                   guint                  n_groups,
                                                                   gint64                 in_features,
                                                                   gint64                 out_features,
                                                                   GmlpDType              dtype,
                                                                   GmlpLinearFlags        flags,
                                                                   GError               **error);

GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor    *gmlp_grouped_linear_forward                 (GmlpGroupedLinear     *self,
                                                                   GmlpGroupedTensor     *input,
                                                                   GmlpSavedActivations **saved,
                                                                   GError               **error);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor    *gmlp_grouped_linear_backward                (GmlpGroupedLinear     *self,
                                                                   GmlpSavedActivations  *saved,
                                                                   GmlpGroupedTensor     *grad_output,
                                                                   GError               **error);
GMLP_AVAILABLE_IN_0_1
gboolean              gmlp_grouped_linear_backward_dw             (GmlpGroupedLinear     *self,
                                                                   GError               **error);
GMLP_AVAILABLE_IN_0_1
guint                 gmlp_grouped_linear_get_pending_wgrads      (GmlpGroupedLinear     *self);

GMLP_AVAILABLE_IN_0_1
gboolean              gmlp_grouped_linear_init_parameters         (GmlpGroupedLinear     *self,
                                                                   guint64                seed,
                                                                   GError               **error);
GMLP_AVAILABLE_IN_0_1
gboolean              gmlp_grouped_linear_set_weight_from_bytes   (GmlpGroupedLinear     *self,
                                                                   GBytes                *bytes,
                                                                   GError               **error);
GMLP_AVAILABLE_IN_0_1
gboolean              gmlp_grouped_linear_set_bias_from_bytes     (GmlpGroupedLinear     *self,
                                                                   GBytes                *bytes,
                                                                   GError               **error);
GMLP_AVAILABLE_IN_0_1
gboolean              gmlp_grouped_linear_set_wgrad_accumulation_mask (GmlpGroupedLinear *self,
                                                                   const gboolean        *accumulate,
                                                                   guint                  n_groups,
                                                                   GError               **error);
GMLP_AVAILABLE_IN_0_1
gboolean              gmlp_grouped_linear_set_main_grad           (GmlpGroupedLinear     *self,
                                                                   GmlpGroupedTensor     *main_grad,
                                                                   GError               **error);
GMLP_AVAILABLE_IN_0_1
gboolean              gmlp_grouped_linear_set_main_grad_member    (GmlpGroupedLinear     *self,
                                                                   guint                  index,
                                                                   GmlpGroupedTensor     *main_grad,
                                                                   GError               **error);

GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor    *gmlp_grouped_linear_get_weight              (GmlpGroupedLinear     *self);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor    *gmlp_grouped_linear_get_bias                (GmlpGroupedLinear     *self);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor    *gmlp_grouped_linear_get_wgrad               (GmlpGroupedLinear     *self);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor    *gmlp_grouped_linear_get_bgrad               (GmlpGroupedLinear     *self);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor    *gmlp_grouped_linear_get_main_grad           (GmlpGroupedLinear     *self);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor    *gmlp_grouped_linear_get_weight_member       (GmlpGroupedLinear     *self,
                                                                   guint                  index);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor    *gmlp_grouped_linear_get_bias_member         (GmlpGroupedLinear     *self,
                                                                   guint                  index);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor    *gmlp_grouped_linear_get_wgrad_member        (GmlpGroupedLinear     *self,
                                                                   guint                  index);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor    *gmlp_grouped_linear_get_bgrad_member        (GmlpGroupedLinear     *self,
                                                                   guint                  index);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor    *gmlp_grouped_linear_get_main_grad_member    (GmlpGroupedLinear     *self,
                                                                   guint                  index);

GMLP_AVAILABLE_IN_0_1
GmlpDevice           *gmlp_grouped_linear_get_device              (GmlpGroupedLinear     *self);
GMLP_AVAILABLE_IN_0_1
guint                 gmlp_grouped_linear_get_n_groups            (GmlpGroupedLinear     *self);
GMLP_AVAILABLE_IN_0_1
gint64                gmlp_grouped_linear_get_in_features         (GmlpGroupedLinear     *self);
GMLP_AVAILABLE_IN_0_1
gint64                gmlp_grouped_linear_get_out_features        (GmlpGroupedLinear     *self);
GMLP_AVAILABLE_IN_0_1
GmlpDType             gmlp_grouped_linear_get_dtype               (GmlpGroupedLinear     *self);
GMLP_AVAILABLE_IN_0_1
GmlpLinearFlags       gmlp_grouped_linear_get_flags               (GmlpGroupedLinear     *self);
GMLP_AVAILABLE_IN_0_1
gboolean              gmlp_grouped_linear_get_grad_added_to_main_grad (GmlpGroupedLinear *self);

/* FP8: the products through quantizers (gmlp-grouped-linear-fp8.c). */
GMLP_AVAILABLE_IN_0_1
gboolean              gmlp_grouped_linear_set_quantizers          (GmlpGroupedLinear     *self,
                                                                   GmlpQuantizer         *input,
                                                                   GmlpQuantizer         *weight,
                                                                   GmlpQuantizer         *grad_output,
                                                                   GError               **error);
GMLP_AVAILABLE_IN_0_1
GmlpQuantizer        *gmlp_grouped_linear_get_quantizer           (GmlpGroupedLinear     *self,
                                                                   GmlpQuantizerRole      role);
GMLP_AVAILABLE_IN_0_1
gboolean              gmlp_grouped_linear_update_quantizers       (GmlpGroupedLinear     *self,
                                                                   GError               **error);

GMLP_AVAILABLE_IN_0_1
void                  gmlp_grouped_linear_set_cache_fp8_weights   (GmlpGroupedLinear     *self,
                                                                   gboolean               cache);
GMLP_AVAILABLE_IN_0_1
gboolean              gmlp_grouped_linear_get_cache_fp8_weights   (GmlpGroupedLinear     *self);
GMLP_AVAILABLE_IN_0_1
void                  gmlp_grouped_linear_invalidate_fp8_weights  (GmlpGroupedLinear     *self);

G_END_DECLS
