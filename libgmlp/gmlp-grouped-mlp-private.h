/* gmlp-grouped-mlp-private.h: the MLP's activation passes, for the tests
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "gmlp-grouped-mlp.h"
#include "gmlp-quantizer.h"

G_BEGIN_DECLS

/* The MLP's activation of FC1's output @h (rows × fc1's out_features, the
 * MLP's dtype): act(h), rows × ffn_hidden. */
GmlpGroupedTensor *gmlp_grouped_mlp_run_activation          (GmlpGroupedMLP     *self,
                                                             GmlpGroupedTensor  *h,
                                                             GError            **error);
/* The activation's backward: the gradient of @h (rows × fc1's
 * out_features) from @grad (rows × ffn_hidden, the gradient of act(h)), of
 * @h's sizes; @grad must have @h's sizes too (device sizes: the same
 * capacity, and the same values on the caller's word). */
GmlpGroupedTensor *gmlp_grouped_mlp_run_activation_grad     (GmlpGroupedMLP     *self,
                                                             GmlpGroupedTensor  *h,
                                                             GmlpGroupedTensor  *grad,
                                                             GError            **error);
/* The fused pass: act(h) quantized by @quantizer, with the columnwise copy
 * when @with_columnwise, as the FP8 forward makes FC2's input. */
GmlpGroupedTensor *gmlp_grouped_mlp_run_activation_quantize (GmlpGroupedMLP     *self,
                                                             GmlpGroupedTensor  *h,
                                                             GmlpQuantizer      *quantizer,
                                                             gboolean            with_columnwise,
                                                             GError            **error);

/* Whether set_fp8_recipe (@recipe, @format) would succeed (the same
 * checks, the same errors); changes nothing. For MoELayer, which checks
 * its experts and its shared expert before it changes either. */
gboolean           gmlp_grouped_mlp_check_fp8_recipe        (GmlpGroupedMLP     *self,
                                                             GmlpScalingRecipe   recipe,
                                                             GmlpFp8Format       format,
                                                             GError            **error);

/* init_parameters() of groups @first_group onwards of an MLP with more
 * groups (gmlp_grouped_linear_init_parameters_from()). */
gboolean           gmlp_grouped_mlp_init_parameters_from    (GmlpGroupedMLP     *self,
                                                             guint64             seed,
                                                             guint               first_group,
                                                             GError            **error);

/* The checks backward makes before either layer writes (its saved
 * activations, what the forwards read, both layers' output gradients
 * against their forwards: FP8 quantizers present and of recipes that meet
 * the forward's, shapes, dtypes, sizes, main_grad's storage), and only
 * those: no gradient is written, and @saved stays usable (with recompute,
 * FC2's input is made again and kept in it, as backward does; an offloaded
 * @saved is reloaded). @grad_output may be a tensor of the output
 * gradient's shape, dtype, device and sizes, for a caller that checks
 * before it makes the gradient. For MoELayer, which checks every part
 * before any part writes. */
gboolean           gmlp_grouped_mlp_check_backward          (GmlpGroupedMLP       *self,
                                                             GmlpSavedActivations *saved,
                                                             GmlpGroupedTensor    *grad_output,
                                                             GError              **error);

/* What backward_dw does before either layer computes (both layers'
 * gmlp_grouped_linear_backward_dw_prepare()); writes no gradient. For
 * MoELayer, which prepares every part before any computes. */
gboolean           gmlp_grouped_mlp_backward_dw_prepare     (GmlpGroupedMLP       *self,
                                                             GError              **error);
/* gmlp_grouped_linear_add_pending_reads() of both layers. */
void               gmlp_grouped_mlp_add_pending_reads       (GmlpGroupedMLP       *self,
                                                             GPtrArray            *reads);
/* gmlp_grouped_linear_check_wgrad_outputs() on both layers. */
gboolean           gmlp_grouped_mlp_check_wgrad_outputs     (GmlpGroupedMLP       *self,
                                                             GPtrArray            *reads,
                                                             GmlpGroupedTensor    *also,
                                                             const char           *label,
                                                             GError              **error);

/* A backward by chunks of groups (the expert-parallel layer's pipeline):
 * chunk c's saved activations are of a forward whose input had rows in
 * groups [bounds[c], bounds[c + 1]) only. Chunk by chunk, the hooks give
 * its output gradient (a wait for its rows may come first) and take its
 * input gradient; then one weight-gradient computation per layer for all
 * chunks (gmlp_grouped_linear_backward_finish_chunks()): the gradient
 * contract's, with wgrad-ready once, or one delayed entry per layer. Not
 * for FP8 experts. */
typedef struct {
  GmlpGroupedTensor *(*grad_output) (gpointer            data,
                                     guint               c,
                                     GError            **error);
  gboolean           (*grad_input)  (gpointer            data,
                                     guint               c,
                                     GmlpGroupedTensor  *grad_input,
                                     GError            **error);
  gpointer            data;
} GmlpMLPChunkHooks;

gboolean           gmlp_grouped_mlp_backward_chunks         (GmlpGroupedMLP           *self,
                                                             GmlpSavedActivations    **saved,
                                                             const guint              *bounds,
                                                             guint                     n_chunks,
                                                             const GmlpMLPChunkHooks  *hooks,
                                                             GError                  **error);

G_END_DECLS
