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

G_END_DECLS
