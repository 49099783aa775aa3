/* gmlp-scaling-recipe.h: the enums of FP8 quantization
 *
 * Apart from gmlp-quantizer.h so that gmlp-grouped-tensor.h can use them.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#if !defined(GMLP_INSIDE) && !defined(GMLP_COMPILATION)
# error "Only <gmlp.h> can be included directly."
#endif

#include <glib.h>

#include "gmlp-version-macros.h"

G_BEGIN_DECLS

/**
 * GmlpScalingRecipe:
 * @GMLP_SCALING_RECIPE_NONE: no scales: the tensor was not made by a
 *   [class@Gmlp.Quantizer] (another dtype, or FP8 from
 *   [method@Gmlp.GroupedTensor.convert]). Never the recipe of a quantizer.
 * @GMLP_SCALING_RECIPE_DELAYED: per-tensor delayed scaling: each group is
 *   quantized with the scale its quantizer holds, `fp8_max / max(amax
 *   history) / 2^margin`, and its amax is recorded; the scale changes only
 *   when [method@Gmlp.Quantizer.update] is called (once a training step)
 * @GMLP_SCALING_RECIPE_CURRENT: per-tensor current scaling: each group is
 *   quantized with `fp8_max / amax` of that group, computed in the same
 *   call
 * @GMLP_SCALING_RECIPE_BLOCKWISE: blockwise scaling (the DeepSeek-V3
 *   recipe): one FP32 scale per 1 × 128 block of a row for inputs and
 *   gradients, per 128 × 128 tile for weights
 * @GMLP_SCALING_RECIPE_MXFP8: OCP microscaling: one power-of-two E8M0 scale
 *   per 1 × 32 block of a row
 *
 * How a [class@Gmlp.Quantizer] chooses its scales. docs/fp8.md gives the
 * formulas, the handling of zeros, NaN and infinities, and the layout of the
 * scales.
 *
 * Since: 0.1
 */
typedef enum {
  GMLP_SCALING_RECIPE_NONE,
  GMLP_SCALING_RECIPE_DELAYED,
  GMLP_SCALING_RECIPE_CURRENT,
  GMLP_SCALING_RECIPE_BLOCKWISE,
  GMLP_SCALING_RECIPE_MXFP8,
} GmlpScalingRecipe;

/**
 * GmlpFp8Format:
 * @GMLP_FP8_FORMAT_E4M3: E4M3 for every role (more precision, range ±448)
 * @GMLP_FP8_FORMAT_E5M2: E5M2 for every role (more range, ±57344)
 * @GMLP_FP8_FORMAT_HYBRID: E4M3 for inputs and weights (the forward pass),
 *   E5M2 for output gradients (the backward pass), as in Transformer
 *   Engine's `Format.HYBRID`
 *
 * The FP8 element types a [class@Gmlp.Quantizer] uses, by its
 * [enum@Gmlp.QuantizerRole].
 *
 * Since: 0.1
 */
typedef enum {
  GMLP_FP8_FORMAT_E4M3,
  GMLP_FP8_FORMAT_E5M2,
  GMLP_FP8_FORMAT_HYBRID,
} GmlpFp8Format;

/**
 * GmlpQuantizerRole:
 * @GMLP_QUANTIZER_ROLE_INPUT: activations, the input of a linear layer
 * @GMLP_QUANTIZER_ROLE_WEIGHT: weights: 128 × 128 tiles in the blockwise
 *   recipe
 * @GMLP_QUANTIZER_ROLE_GRAD_OUTPUT: the gradient of a layer's output: E5M2
 *   in the hybrid format
 *
 * What a [class@Gmlp.Quantizer] quantizes: it decides the FP8 type of the
 * hybrid format and the block shape of the blockwise recipe.
 *
 * Since: 0.1
 */
typedef enum {
  GMLP_QUANTIZER_ROLE_INPUT,
  GMLP_QUANTIZER_ROLE_WEIGHT,
  GMLP_QUANTIZER_ROLE_GRAD_OUTPUT,
} GmlpQuantizerRole;

G_END_DECLS
