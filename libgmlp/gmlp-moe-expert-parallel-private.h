/* gmlp-moe-expert-parallel-private.h: GmlpMoELayer's experts spread over
 * the ranks of a communicator
 *
 * What gmlp-moe-layer.c and gmlp-moe-layer-steps.c call of the
 * expert-parallel files: the properties, the checks and the ranks'
 * agreement at construction (gmlp-moe-expert-parallel-properties.c), and
 * the experts' step (dispatch, the local experts, the return trip)
 * forward and backward (gmlp-moe-expert-parallel.c, which the files of
 * gmlp-moe-expert-parallel-impl.h serve). Every function takes the layer
 * (gmlp-moe-layer-impl.h).
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "gmlp-moe-layer.h"

G_BEGIN_DECLS

/* The layer's properties of expert parallelism, in this order from the
 * layer's first such property id. */
enum {
  GMLP_MOE_PARALLEL_PROP_COMMUNICATOR,
  GMLP_MOE_PARALLEL_PROP_MODE,
  GMLP_MOE_PARALLEL_PROP_CAPACITY_FACTOR,
  GMLP_MOE_PARALLEL_PROP_DISPATCH_FP8_RECIPE,
  GMLP_MOE_PARALLEL_PROP_DISPATCH_FP8_FORMAT,
  GMLP_MOE_PARALLEL_PROP_CHUNKS,
  GMLP_MOE_PARALLEL_N_PROPS
};

void     gmlp_moe_parallel_make_pspecs  (GParamSpec    **pspecs);
void     gmlp_moe_parallel_get_property (GmlpMoELayer   *self,
                                         guint           index,
                                         GValue         *value);
void     gmlp_moe_parallel_set_property (GmlpMoELayer   *self,
                                         guint           index,
                                         const GValue   *value);

/* At construction, before the experts are made: the options' checks, the
 * experts this rank holds (first_expert, n_local_experts; all of them
 * without a communicator), and the quantizer of an FP8 dispatch. */
gboolean gmlp_moe_parallel_check        (GmlpMoELayer   *self,
                                         GError        **error);
/* gmlp_check_constructed() of the layer; with a communicator, first (once:
 * at init or at the first forward) every rank gathers every rank's
 * construct properties, so that all fail alike, with a GError kept as the
 * layer's construct error, where one could not construct or they differ.
 * Collective. */
gboolean gmlp_moe_parallel_ensure_agreed (GmlpMoELayer  *self,
                                          GError       **error);

/* What a forward's experts' step keeps for its backward. */
typedef struct _GmlpMoEParallelStep GmlpMoEParallelStep;

void     gmlp_moe_parallel_step_free    (gpointer        step);

/* Work of the caller's (the shared expert's) that the step enqueues on the
 * compute stream while its first rows are in flight; FALSE with an error
 * fails the step. */
typedef gboolean (*GmlpMoEParallelOverlap) (gpointer   data,
                                            GError   **error);

/* The experts' step of a layer with a communicator: @permuted (the
 * routing's permuted layout, every expert's rows) to the experts' ranks,
 * through the local experts, and back, in the permuted layout; @saved and
 * @step (both or neither) for the backward. @overlap (optional) runs once,
 * while the dispatch is in flight. */
GmlpGroupedTensor *gmlp_moe_parallel_forward  (GmlpMoELayer           *self,
                                               GmlpRouting            *routing,
                                               GmlpGroupedTensor      *permuted,
                                               GmlpSavedActivations  **saved,
                                               GmlpMoEParallelStep   **step,
                                               GmlpMoEParallelOverlap  overlap,
                                               gpointer                overlap_data,
                                               GError                **error);
/* Its backward: the gradient of its output (in the permuted layout) to
 * the experts' ranks, through their backward, and back; @overlap as the
 * forward's. */
GmlpGroupedTensor *gmlp_moe_parallel_backward (GmlpMoELayer           *self,
                                               GmlpSavedActivations   *saved,
                                               GmlpMoEParallelStep    *step,
                                               GmlpGroupedTensor      *grad_output,
                                               GmlpMoEParallelOverlap  overlap,
                                               gpointer                overlap_data,
                                               GError                **error);

G_END_DECLS
