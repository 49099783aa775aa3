/* gmlp-grouped-linear-private.h: for GmlpGroupedMLP
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "gmlp-grouped-linear.h"

G_BEGIN_DECLS

/* forward(), optionally without saving the input (the caller puts it into
 * the saved activations, under "input", before the backward: quantized by
 * the layer's input quantizer, with its columnwise copy where the per-tensor
 * products read it, when the forward was FP8; an FP8 forward saves its
 * quantized weights in any case). */
GmlpGroupedTensor *gmlp_grouped_linear_forward_full (GmlpGroupedLinear     *self,
                                                     GmlpGroupedTensor     *input,
                                                     gboolean               save_input,
                                                     GmlpSavedActivations **saved,
                                                     GError               **error);

/* A backward in three phases, so that GroupedMLP checks and allocates for
 * both its layers before either writes anything:
 *
 * - begin: checks the saved activations (owner, use, the versions of what
 *   the forward read, labelled @label in errors: "GroupedMLP's FC1"), the
 *   output gradient (only its shape, dtype and device: it may be written
 *   later, before dgrad) and main_grad's storage; reloads the input;
 *   allocates the input gradient and the weight-gradient storage. Writes
 *   nothing.
 * - dgrad: the input gradient (FP8: dy quantized first). Writes only
 *   tensors that begin or it made.
 * - finish: the weight gradients, or queues them when delayed; consumes
 *   the saved activations; returns the input gradient (transfer full).
 *   Only the backend can fail here.
 *
 * gmlp_grouped_linear_backward() is the three in a row. */
typedef struct _GmlpLinearBackward GmlpLinearBackward;

GmlpLinearBackward *gmlp_grouped_linear_backward_begin  (GmlpGroupedLinear     *self,
                                                         GmlpSavedActivations  *saved,
                                                         GmlpGroupedTensor     *grad_output,
                                                         const char            *label,
                                                         GError               **error);
gboolean            gmlp_grouped_linear_backward_dgrad  (GmlpGroupedLinear     *self,
                                                         GmlpLinearBackward    *step,
                                                         GError               **error);
GmlpGroupedTensor  *gmlp_grouped_linear_backward_finish (GmlpGroupedLinear     *self,
                                                         GmlpLinearBackward    *step,
                                                         GError               **error);
/* For GmlpRouter's gate: makes an FP32 layer of one group and no bias or
 * FP8 take a BF16 input too (host sizes), multiplying it on BF16 tensor
 * cores at FP32 accuracy: the FP32 operands split into BF16 parts
 * (gmlp-grouped-linear-split.c says which products). The input gradient
 * of such a forward is BF16. Call it once, before the first forward. */
void                gmlp_grouped_linear_take_bf16_input (GmlpGroupedLinear     *self);
/* backward_begin whose input gradient is FP32: for a BF16 input of such a
 * layer, the FP32 sum of its split products, not rounded (the MoE layer
 * adds it to its permute backward's sum before that one rounding); any
 * other input's gradient is the layer's own, as backward_begin makes it. */
GmlpLinearBackward *gmlp_grouped_linear_backward_begin_fp32 (GmlpGroupedLinear     *self,
                                                             GmlpSavedActivations  *saved,
                                                             GmlpGroupedTensor     *grad_output,
                                                             const char            *label,
                                                             GError               **error);
/* What begin checks, and only that: writes and allocates nothing (an
 * offloaded input is reloaded, as begin would). @grad_output may be a
 * tensor of the output gradient's shape, dtype, device and sizes, for a
 * caller that checks before it makes the gradient (MoELayer, before any of
 * its parts writes). */
gboolean            gmlp_grouped_linear_check_backward  (GmlpGroupedLinear     *self,
                                                         GmlpSavedActivations  *saved,
                                                         GmlpGroupedTensor     *grad_output,
                                                         const char            *label,
                                                         GError               **error);
/* For MoELayer, whose parts write one after the other: whether this
 * layer's weight-gradient outputs (wgrad or main_grad, bgrad) share no
 * byte with anything recorded in @reads (GArrays of GmlpVersionRecord:
 * what every part's forward read, or what every part's backward_dw reads)
 * nor with @also (NULL: none), so that no part reads what this one wrote.
 * Whatever the flags: the caller checks where the outputs are written
 * (backward, or backward_dw when delayed). Errors are prefixed with @label. */
gboolean            gmlp_grouped_linear_check_wgrad_outputs (GmlpGroupedLinear  *self,
                                                             GPtrArray          *reads,
                                                             GmlpGroupedTensor  *also,
                                                             const char         *label,
                                                             GError            **error);
/* The input gradient that dgrad writes (transfer none). */
/* The finish of a backward by chunks of groups: chunk c's step (of its
 * own forward) has rows in groups [bounds[c], bounds[c + 1]) only, and the
 * weight gradients of those groups come from it. One weight-gradient
 * computation for all: each chunk's products write its own groups only,
 * wgrad-ready is emitted once, and a delayed one is one pending entry.
 * Not for FP8 or split products. Gives each chunk's input gradient, in
 * @grad_inputs (transfer full). */
gboolean            gmlp_grouped_linear_backward_finish_chunks (GmlpGroupedLinear   *self,
                                                                GmlpLinearBackward **steps,
                                                                const guint         *bounds,
                                                                guint                n_chunks,
                                                                GmlpGroupedTensor  **grad_inputs,
                                                                GError             **error);
GmlpGroupedTensor  *gmlp_linear_backward_get_grad_input (GmlpLinearBackward    *step);
void                gmlp_linear_backward_free           (GmlpLinearBackward    *step);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (GmlpLinearBackward, gmlp_linear_backward_free)

/* Adds to @reads (a GPtrArray of GArrays of GmlpVersionRecord, transfer
 * none) the records of what the oldest pending weight gradient reads, its
 * input and output gradient; nothing when none is pending. For MoELayer's
 * backward_dw, which checks every part's outputs against them first. */
void                gmlp_grouped_linear_add_pending_reads   (GmlpGroupedLinear   *self,
                                                             GPtrArray           *reads);
/* What backward_dw does before it writes: checks the flag, that a weight
 * gradient is pending, the versions of its input and output gradient and
 * the storage of its outputs; allocates what it needs. Writes nothing. */
gboolean            gmlp_grouped_linear_backward_dw_prepare (GmlpGroupedLinear   *self,
                                                             const char          *label,
                                                             GError             **error);

/* Whether set_quantizers() would take these quantizers (the same checks,
 * the same errors); changes nothing. For GroupedMLP and MoELayer, which
 * check every layer before they give any its quantizers. */
gboolean            gmlp_grouped_linear_check_quantizers (GmlpGroupedLinear  *self,
                                                          GmlpQuantizer      *input,
                                                          GmlpQuantizer      *weight,
                                                          GmlpQuantizer      *grad_output,
                                                          GError            **error);

/* init_parameters() of groups @first_group onwards of a layer with more
 * groups: each group gets the values that group first_group + g of that
 * layer gets from @seed (an expert-parallel rank's slice of the experts). */
gboolean           gmlp_grouped_linear_init_parameters_from (GmlpGroupedLinear  *self,
                                                             guint64             seed,
                                                             guint               first_group,
                                                             GError            **error);

G_END_DECLS
