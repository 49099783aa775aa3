/* gmlp-quantizer-private.h: what the layers need of quantized tensors
 *
 * A quantized tensor is an FP8 GmlpGroupedTensor that carries its scales
 * (and optionally a columnwise copy); the functions for that live in
 * gmlp-grouped-tensor-quantized.c.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "gmlp-grouped-tensor.h"
#include "gmlp-quantizer.h"

G_BEGIN_DECLS

/* Makes self (FP8) a quantized tensor of recipe and flags (the
 * GMLP_QUANT_FLAG_* of gmlp-quantize-numeric.h) with its scales; for the
 * rowwise tensor, columnwise is its transposed copy or NULL; is_columnwise
 * marks the copy itself. Refs what it is given. */
void      gmlp_grouped_tensor_set_quantized       (GmlpGroupedTensor  *self,
                                                   GmlpScalingRecipe   recipe,
                                                   int                 flags,
                                                   GmlpGroupedTensor  *scale_inv,
                                                   GmlpGroupedTensor  *columnwise,
                                                   gboolean            is_columnwise);
/* The GMLP_QUANT_FLAG_* a quantized tensor was made with (0 otherwise). */
int       gmlp_grouped_tensor_get_quantize_flags  (GmlpGroupedTensor  *self);

/* gmlp_quantizer_quantize() with or without the columnwise copy, whatever
 * the quantizer's columnwise property says (the FP8 layers ask for the
 * copy when their backward needs it). */
GmlpGroupedTensor *gmlp_quantizer_quantize_full   (GmlpQuantizer      *self,
                                                   GmlpGroupedTensor  *src,
                                                   gboolean            with_columnwise,
                                                   GError            **error);

/* For the FP8 products: whether a and b are both quantized, rowwise, with
 * scales, by the same recipe; otherwise a GError that says what is wrong
 * (%GMLP_ERROR_INVALID_ARGUMENT for a tensor without scales or a columnwise
 * copy, %GMLP_ERROR_DTYPE_MISMATCH for one that is not FP8,
 * %GMLP_ERROR_UNSUPPORTED for two recipes). */
gboolean  gmlp_quantized_check_compatible         (GmlpGroupedTensor  *a,
                                                   GmlpGroupedTensor  *b,
                                                   GError            **error);

/* For the producers that write a quantizer's tensors themselves
 * (GmlpGroupedMLP's fused activation and quantization, through the
 * backend's activation_quantize): the GMLP_QUANT_FLAG_* of the quantizer's
 * quantize calls, and its delayed-scaling state for n_groups groups (made,
 * with scale 1, if it has none yet): *state is the device pointer, or NULL
 * for the other recipes. FALSE with %GMLP_ERROR_SHAPE_MISMATCH when the
 * state has another number of groups. */
int       gmlp_quantizer_get_quantize_flags       (GmlpQuantizer      *self);
/* Call get_state_for() and use the state with it locked: every quantize
 * call writes it. */
void      gmlp_quantizer_lock_state               (GmlpQuantizer      *self);
void      gmlp_quantizer_unlock_state             (GmlpQuantizer      *self);
gboolean  gmlp_quantizer_get_state_for            (GmlpQuantizer      *self,
                                                   guint               n_groups,
                                                   float             **state,
                                                   GError            **error);

/* A tensor over the groups of src whose member i has
 * gmlp_quant_blocks_along (rows_i, row_block) rows of cols columns: the
 * layout the backends write (row_block 1: the rows of src; 0: one row),
 * for the quantizer's outputs and for those of producers that write them
 * (GmlpGroupedMLP). With device-only sizes it shares src's sizes tensor
 * and capacity (row_block 1) or, for a row_block over 1, takes the sizes
 * from derived, which the quantize call writes. */
GmlpGroupedTensor *gmlp_grouped_tensor_new_blocked (GmlpGroupedTensor  *src,
                                                    GmlpDType           dtype,
                                                    gint64              row_block,
                                                    gint64              cols,
                                                    GmlpGroupedTensor  *derived,
                                                    GError            **error);

/* Whether the FP8 products multiply operands of this recipe in FP8: one
 * scale per group (DELAYED, CURRENT), or blockwise scales that the
 * products apply per 128-deep block (BLOCKWISE). MXFP8 operands are
 * dequantized first: no backend has a product with its 32-deep E8M0
 * blocks. */
static inline gboolean
gmlp_scaling_recipe_multiplies_fp8 (GmlpScalingRecipe recipe)
{
  return recipe == GMLP_SCALING_RECIPE_DELAYED || recipe == GMLP_SCALING_RECIPE_CURRENT ||
         recipe == GMLP_SCALING_RECIPE_BLOCKWISE;
}

G_END_DECLS
