/* gmlp-grouped-mlp.h: the MoE expert block, FC1 → activation → FC2
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#if !defined(GMLP_INSIDE) && !defined(GMLP_COMPILATION)
# error "Only <gmlp.h> can be included directly."
#endif

#include <gio/gio.h>

#include "gmlp-version-macros.h"
#include "gmlp-grouped-linear.h"

G_BEGIN_DECLS

/**
 * GmlpActivation:
 * @GMLP_ACTIVATION_GELU: GELU, tanh approximation:
 *   `x/2 (1 + tanh(√(2/π) (x + 0.044715 x³)))`
 * @GMLP_ACTIVATION_RELU: `max(x, 0)`
 * @GMLP_ACTIVATION_SRELU: squared ReLU, `max(x, 0)²`
 * @GMLP_ACTIVATION_SWIGLU: `silu(a) · b` over FC1's output `[a | b]`
 * @GMLP_ACTIVATION_GEGLU: `gelu(a) · b` over FC1's output `[a | b]`
 *
 * The activation of a [class@Gmlp.GroupedMLP]. The gated ones (SwiGLU,
 * GeGLU) make FC1 `2 × ffn_hidden` wide: the first half of each row is the
 * gate `a`, the second the value `b`.
 *
 * Since: 0.1
 */
typedef enum {
  GMLP_ACTIVATION_GELU,
  GMLP_ACTIVATION_RELU,
  GMLP_ACTIVATION_SRELU,
  GMLP_ACTIVATION_SWIGLU,
  GMLP_ACTIVATION_GEGLU,
} GmlpActivation;

#define GMLP_TYPE_GROUPED_MLP (gmlp_grouped_mlp_get_type ())

/**
 * GmlpGroupedMLPClass:
 * @parent_class: the parent class
 *
 * The class structure of #GmlpGroupedMLP, a final type: it has no virtual methods.
 *
 * Since: 0.1
 */
GMLP_AVAILABLE_IN_0_1
G_DECLARE_FINAL_TYPE (GmlpGroupedMLP, gmlp_grouped_mlp, GMLP, GROUPED_MLP, GObject)

GMLP_AVAILABLE_IN_0_1
GmlpGroupedMLP     *gmlp_grouped_mlp_new                 (GmlpDevice            *device,
                                                          guint                  n_groups,
                                                          gint64                 hidden,
                                                          gint64                 ffn_hidden,
                                                          GmlpActivation         activation,
                                                          GError               **error);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedMLP     *gmlp_grouped_mlp_new_full            (GmlpDevice            *device,
                                                          guint                  n_groups,
                                                          gint64                 hidden,
                                                          gint64                 ffn_hidden,
                                                          GmlpActivation         activation,
                                                          GmlpDType              dtype,
                                                          GmlpLinearFlags        flags,
                                                          GError               **error);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor  *gmlp_grouped_mlp_forward             (GmlpGroupedMLP        *self,
                                                          GmlpGroupedTensor     *input,
                                                          GmlpSavedActivations **saved,
                                                          GError               **error);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor  *gmlp_grouped_mlp_backward            (GmlpGroupedMLP        *self,
                                                          GmlpSavedActivations  *saved,
                                                          GmlpGroupedTensor     *grad_output,
                                                          GError               **error);
GMLP_AVAILABLE_IN_0_1
gboolean            gmlp_grouped_mlp_backward_dw         (GmlpGroupedMLP        *self,
                                                          GError               **error);
GMLP_AVAILABLE_IN_0_1
gboolean            gmlp_grouped_mlp_init_parameters     (GmlpGroupedMLP        *self,
                                                          guint64                seed,
                                                          GError               **error);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedLinear  *gmlp_grouped_mlp_get_fc1             (GmlpGroupedMLP        *self);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedLinear  *gmlp_grouped_mlp_get_fc2             (GmlpGroupedMLP        *self);
GMLP_AVAILABLE_IN_0_1
GmlpActivation      gmlp_grouped_mlp_get_activation      (GmlpGroupedMLP        *self);
GMLP_AVAILABLE_IN_0_1
gboolean            gmlp_grouped_mlp_get_grad_added_to_main_grad (GmlpGroupedMLP *self);

/* FP8: the quantizers of both layers, and the fused activation and
 * quantization of FC2's input. */
GMLP_AVAILABLE_IN_0_1
gboolean            gmlp_grouped_mlp_set_fp8_recipe      (GmlpGroupedMLP        *self,
                                                          GmlpScalingRecipe      recipe,
                                                          GmlpFp8Format          format,
                                                          GError               **error);
GMLP_AVAILABLE_IN_0_1
GmlpScalingRecipe   gmlp_grouped_mlp_get_fp8_recipe      (GmlpGroupedMLP        *self);
GMLP_AVAILABLE_IN_0_1
GmlpFp8Format       gmlp_grouped_mlp_get_fp8_format      (GmlpGroupedMLP        *self);
GMLP_AVAILABLE_IN_0_1
gboolean            gmlp_grouped_mlp_update_quantizers   (GmlpGroupedMLP        *self,
                                                          GError               **error);

/* FP8: the quantized weights of both layers kept between forwards. */
GMLP_AVAILABLE_IN_0_1
void                gmlp_grouped_mlp_set_cache_fp8_weights  (GmlpGroupedMLP        *self,
                                                             gboolean               cache);
GMLP_AVAILABLE_IN_0_1
gboolean            gmlp_grouped_mlp_get_cache_fp8_weights  (GmlpGroupedMLP        *self);
GMLP_AVAILABLE_IN_0_1
void                gmlp_grouped_mlp_invalidate_fp8_weights (GmlpGroupedMLP        *self);

G_END_DECLS
