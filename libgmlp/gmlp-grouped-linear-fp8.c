/* gmlp-grouped-linear-fp8.c: GmlpGroupedLinear with quantizers
 *
 * The rules that say which quantizers, recipes and formats the layer's
 * products take (the quantizers are set in gmlp-grouped-linear.c), its
 * cached FP8 weights, and the FP8 forward and backward: which product each
 * operand takes, with which scales, and where the layer dequantizes
 * instead.
 *
 * With quantizers, the three products take FP8 operands, each described
 * once to the backend's gemm (fp8_describe()), whose FP8 operands are all
 * K-major: FPROP x·Wᵀ reads x and W rowwise, DGRAD dy·W reads dy rowwise
 * and W's columnwise copy, WGRAD dyᵀ·x the columnwise copies of dy and x;
 * the quantizers write the copies in the same pass when the backward will
 * need them. Per-tensor (DELAYED, CURRENT) and blockwise scales take the
 * same products, with host or device sizes (WGRAD with device sizes for
 * the recipes of fp8_device_wgrad()), each operand with its scale layout
 * (fp8_operand_scales()). Before anything is enqueued the layer asks the
 * backend whether it multiplies the operands as they are (gemm_supported:
 * CUDA with device sizes or blockwise scales on its Hopper kernel only,
 * the CPU but its WGRAD of device sizes); where it does not, and for MXFP8
 * and operands given without the copies, the layer dequantizes the FP8
 * operands to gmlp_linear_fp8_fallback_dtype() and runs its usual
 * products: correct, not fast. It never retries a product.
 *
 * The forward saves the quantized input ("input": offload moves every part
 * of it) and the quantized weights ("weight-fp8", resident on the device);
 * a backward is FP8 when its forward was, whatever the quantizers are by
 * then.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-grouped-linear-impl.h"
#include "backend/gmlp-backend-gemm.h"
#include "gmlp-enum-types.h"
#include "gmlp-error.h"
#include "gmlp-error-private.h"
#include "gmlp-quantize-numeric.h"
#include "gmlp-quantizer-private.h"
#include "gmlp-saved-activations-private.h"
#include "gmlp-thread-private.h"

static gboolean
fp8_per_tensor (GmlpScalingRecipe recipe)
{
  return recipe == GMLP_SCALING_RECIPE_DELAYED || recipe == GMLP_SCALING_RECIPE_CURRENT;
}

/* Whether one product can take operands of these recipes: the same one, or
 * two with one scale per group (the product only multiplies the two). */
static gboolean
fp8_recipes_combine (GmlpScalingRecipe a,
                     GmlpScalingRecipe b)
{
  return a == b || (fp8_per_tensor (a) && fp8_per_tensor (b));
}

static const char *
fp8_recipe_name (GmlpScalingRecipe recipe)
{
  g_autoptr(GEnumClass) klass = g_type_class_ref (GMLP_TYPE_SCALING_RECIPE);
  GEnumValue *value = g_enum_get_value (klass, recipe);

  /* Nicks are static strings of the registered type. */
  return value != NULL ? value->value_nick : "invalid";
}

static const char *
fp8_role_name (GmlpQuantizerRole role)
{
  g_autoptr(GEnumClass) klass = g_type_class_ref (GMLP_TYPE_QUANTIZER_ROLE);
  GEnumValue *value = g_enum_get_value (klass, role);

  return value != NULL ? value->value_nick : "invalid";
}

/* The products that multiply two operands, named by their quantizers'
 * roles: FPROP x·W, DGRAD dy·W, WGRAD dy·x. */
static const struct {
  const char        *name;
  GmlpQuantizerRole  first, second;
} fp8_products[] = {
  { "FPROP", GMLP_QUANTIZER_ROLE_INPUT, GMLP_QUANTIZER_ROLE_WEIGHT },
  { "DGRAD", GMLP_QUANTIZER_ROLE_GRAD_OUTPUT, GMLP_QUANTIZER_ROLE_WEIGHT },
  { "WGRAD", GMLP_QUANTIZER_ROLE_GRAD_OUTPUT, GMLP_QUANTIZER_ROLE_INPUT },
};

/* The rules of the per-tensor products for two operands (of recipes and
 * FP8 dtypes): features multiples of 16, and no E5M2 × E5M2 (which
 * cuBLASLt has no kernel for); the same on every backend, so that what runs
 * on the CPU runs on a GPU. */
static gboolean
fp8_check_native_rules (GmlpGroupedLinear  *self,
                        const char         *product,
                        GmlpScalingRecipe   recipe_a,
                        GmlpDType           dtype_a,
                        GmlpScalingRecipe   recipe_b,
                        GmlpDType           dtype_b,
                        GError            **error)
{
  if (!fp8_per_tensor (recipe_a) || !fp8_per_tensor (recipe_b))
    return TRUE;
  if (self->in_features % 16 != 0 || self->out_features % 16 != 0)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "FP8 products with per-tensor scales need in_features and out_features that "
                   "are multiples of 16 (16-byte FP8 rows); the layer has %" G_GINT64_FORMAT
                   " → %" G_GINT64_FORMAT, self->in_features, self->out_features);
      return FALSE;
    }
  if (dtype_a == GMLP_DTYPE_FLOAT8_E5M2 && dtype_b == GMLP_DTYPE_FLOAT8_E5M2)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "The %s product would multiply E5M2 by E5M2, which the FP8 GEMMs do not do: "
                   "use the E4M3 or HYBRID format", product);
      return FALSE;
    }
  return TRUE;
}

gboolean
gmlp_linear_fp8_check_quantizers (GmlpGroupedLinear  *self,
                                  GmlpQuantizer      *input,
                                  GmlpQuantizer      *weight,
                                  GmlpQuantizer      *grad_output,
                                  GError            **error)
{
  GmlpQuantizer *by_role[3];
  guint i, given = 0;

  /* Indexed by GmlpQuantizerRole. */
  by_role[GMLP_QUANTIZER_ROLE_INPUT] = input;
  by_role[GMLP_QUANTIZER_ROLE_WEIGHT] = weight;
  by_role[GMLP_QUANTIZER_ROLE_GRAD_OUTPUT] = grad_output;

  for (i = 0; i < 3; i++)
    given += by_role[i] != NULL;
  if (given == 0)
    return TRUE;
  if (given != 3)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "FP8 takes three quantizers (input, weight and grad-output), or none");
      return FALSE;
    }

  for (i = 0; i < 3; i++)
    {
      GmlpQuantizer *q = by_role[i];

      if (gmlp_quantizer_get_device (q) != self->device)
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                       "The %s quantizer is for %s, the layer is on %s", fp8_role_name (i),
                       gmlp_device_get_name (gmlp_quantizer_get_device (q)),
                       gmlp_device_get_name (self->device));
          return FALSE;
        }
      if (gmlp_quantizer_get_role (q) != (GmlpQuantizerRole) i)
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                       "The %s quantizer has the role %s; it must have the role %s",
                       fp8_role_name (i), fp8_role_name (gmlp_quantizer_get_role (q)),
                       fp8_role_name (i));
          return FALSE;
        }
    }

  for (i = 0; i < G_N_ELEMENTS (fp8_products); i++)
    {
      GmlpQuantizer *a = by_role[fp8_products[i].first], *b = by_role[fp8_products[i].second];

      if (!fp8_recipes_combine (gmlp_quantizer_get_recipe (a), gmlp_quantizer_get_recipe (b)))
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                       "The %s product cannot combine the %s recipe (%s quantizer) with the %s "
                       "recipe (%s quantizer): use one recipe, or the two per-tensor ones",
                       fp8_products[i].name, fp8_recipe_name (gmlp_quantizer_get_recipe (a)),
                       fp8_role_name (fp8_products[i].first),
                       fp8_recipe_name (gmlp_quantizer_get_recipe (b)),
                       fp8_role_name (fp8_products[i].second));
          return FALSE;
        }
      if (!fp8_check_native_rules (self, fp8_products[i].name,
                                   gmlp_quantizer_get_recipe (a), gmlp_quantizer_get_dtype (a),
                                   gmlp_quantizer_get_recipe (b), gmlp_quantizer_get_dtype (b),
                                   error))
        return FALSE;
    }
  return TRUE;
}

/* The recipe and FP8 dtype an operand has, or will have once @quantizer
 * has quantized it. */
static GmlpScalingRecipe
fp8_operand_recipe (GmlpGroupedTensor *tensor,
                    GmlpQuantizer     *quantizer)
{
  if (gmlp_dtype_is_fp8 (gmlp_grouped_tensor_get_dtype (tensor)))
    return gmlp_grouped_tensor_get_scaling_recipe (tensor);
  return quantizer != NULL ? gmlp_quantizer_get_recipe (quantizer) : GMLP_SCALING_RECIPE_NONE;
}

static GmlpDType
fp8_operand_dtype (GmlpGroupedTensor *tensor,
                   GmlpQuantizer     *quantizer)
{
  if (gmlp_dtype_is_fp8 (gmlp_grouped_tensor_get_dtype (tensor)) || quantizer == NULL)
    return gmlp_grouped_tensor_get_dtype (tensor);
  return gmlp_quantizer_get_dtype (quantizer);
}

/* Whether the WGRAD of device-only group sizes multiplies FP8, reading the
 * columnwise copies of dy and x (gmlp_linear_fp8_wgrad()): per-tensor scales
 * on both, or blockwise on both (the copies' own 128 × 1 blocks). */
static gboolean
fp8_device_wgrad (GmlpScalingRecipe x_recipe,
                  GmlpScalingRecipe dy_recipe)
{
  return (fp8_per_tensor (x_recipe) && fp8_per_tensor (dy_recipe)) ||
         (x_recipe == GMLP_SCALING_RECIPE_BLOCKWISE && dy_recipe == GMLP_SCALING_RECIPE_BLOCKWISE);
}

/* An activation operand of an FP8 product (the input or the output
 * gradient): of the layer's dtype, for @quantizer to quantize, or
 * quantized already, rowwise, with its scales; either way of a recipe that
 * meets @partner's (an operand it is multiplied with) in @product. */
gboolean
gmlp_linear_fp8_check_activation (GmlpGroupedLinear  *self,
                                  GmlpGroupedTensor  *tensor,
                                  gint64              cols,
                                  const char         *what,
                                  GmlpQuantizer      *quantizer,
                                  const char         *product,
                                  GmlpGroupedTensor  *partner,
                                  GmlpQuantizer      *partner_quantizer,
                                  GError            **error)
{
  GmlpDType dtype = gmlp_grouped_tensor_get_dtype (tensor);
  GmlpScalingRecipe recipe, partner_recipe;

  if (!gmlp_linear_check_activation_device (self, tensor, what, error))
    return FALSE;
  if (!gmlp_dtype_is_fp8 (dtype))
    {
      if (dtype != self->dtype)
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_DTYPE_MISMATCH,
                       "%s is %s; the layer computes in %s (or takes FP8 made by a "
                       "GmlpQuantizer)", what, gmlp_dtype_get_name (dtype),
                       gmlp_dtype_get_name (self->dtype));
          return FALSE;
        }
      if (quantizer == NULL)
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE,
                       "%s is %s and the layer has no quantizers now, but this backward "
                       "belongs to an FP8 forward: set the quantizers again, or give it "
                       "quantized", what, gmlp_dtype_get_name (dtype));
          return FALSE;
        }
    }
  else if (gmlp_grouped_tensor_get_scale_inv (tensor) == NULL)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "%s is %s without scales: FP8 operands must come from a GmlpQuantizer "
                   "(a conversion or a member view has none)", what, gmlp_dtype_get_name (dtype));
      return FALSE;
    }
  else if (gmlp_grouped_tensor_is_columnwise (tensor))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "%s is the columnwise (transposed) copy of a quantized tensor; give the "
                   "rowwise tensor", what);
      return FALSE;
    }
  else if (self->weight_quantizer == NULL && partner == NULL)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_DTYPE_MISMATCH,
                   "%s is %s: FP8 operands need the layer's quantizers (set_quantizers())",
                   what, gmlp_dtype_get_name (dtype));
      return FALSE;
    }

  if (!gmlp_linear_check_activation_shape (self, tensor, cols, what, error))
    return FALSE;

  recipe = fp8_operand_recipe (tensor, quantizer);
  partner_recipe = partner != NULL ? gmlp_grouped_tensor_get_scaling_recipe (partner)
                                   : gmlp_quantizer_get_recipe (partner_quantizer);
  if (!fp8_recipes_combine (recipe, partner_recipe))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "%s has the %s recipe, which the %s product cannot combine with the %s "
                   "recipe of its other operand", what, fp8_recipe_name (recipe), product,
                   fp8_recipe_name (partner_recipe));
      return FALSE;
    }
  return fp8_check_native_rules (self, product, recipe, fp8_operand_dtype (tensor, quantizer),
                                 partner_recipe,
                                 partner != NULL ? gmlp_grouped_tensor_get_dtype (partner)
                                                 : gmlp_quantizer_get_dtype (partner_quantizer),
                                 error);
}

/* @tensor quantized by @quantizer (with the columnwise copy when asked), or
 * @tensor itself when it is quantized already. */
static GmlpGroupedTensor *
fp8_quantize (GmlpGroupedTensor  *tensor,
              GmlpQuantizer      *quantizer,
              gboolean            columnwise,
              GError            **error)
{
  if (gmlp_dtype_is_fp8 (gmlp_grouped_tensor_get_dtype (tensor)))
    return g_object_ref (tensor);
  return gmlp_quantizer_quantize_full (quantizer, tensor, columnwise, error);
}

/* The quantized weights, with the columnwise copy when asked: the cached
 * ones when they will do, else quantized now (and cached when the layer
 * caches). Under the lock, so that forwards on several threads quantize
 * them once. */
static GmlpGroupedTensor *
fp8_weights (GmlpGroupedLinear  *self,
             gboolean            columnwise,
             GError            **error)
{
  g_autoptr(GmlpMutexLocker) locker = gmlp_mutex_locker_new (&self->fp8_lock);
  GmlpGroupedTensor *w8;

  if (self->weight_fp8 != NULL &&
      (!columnwise || gmlp_grouped_tensor_get_columnwise (self->weight_fp8) != NULL))
    return g_object_ref (self->weight_fp8);

  w8 = gmlp_quantizer_quantize_full (self->weight_quantizer, self->weight.grouped, columnwise,
                                     error);
  if (w8 != NULL && self->cache_fp8_weights)
    g_set_object (&self->weight_fp8, w8);
  return w8;
}

/* Whether both tensors are quantized by recipes whose products multiply
 * FP8 (gmlp_scaling_recipe_multiplies_fp8()). */
static gboolean
fp8_multiplied (GmlpGroupedTensor *a,
                GmlpGroupedTensor *b)
{
  return gmlp_scaling_recipe_multiplies_fp8 (gmlp_grouped_tensor_get_scaling_recipe (a)) &&
         gmlp_scaling_recipe_multiplies_fp8 (gmlp_grouped_tensor_get_scaling_recipe (b));
}

/* Whether a product of a and b multiplies FP8 with host sizes: recipes it
 * multiplies, host sizes (of sized_by), and the K-major operands it reads
 * (the columnwise copies, for the transposed ones; NULL otherwise). */
static gboolean
fp8_native (GmlpGroupedTensor *sized_by,
            GmlpGroupedTensor *a,
            GmlpGroupedTensor *b)
{
  return gmlp_grouped_tensor_has_host_sizes (sized_by) && a != NULL && b != NULL &&
         fp8_multiplied (a, b);
}

/* How a product reads the scales of t, a quantized tensor or columnwise
 * copy seen K-major (GmlpBackendFp8Scales): zeros for per-tensor scales;
 * for blocks, the scale tensor's members are blocks_along (rows_i) ×
 * blocks_along (cols) in the rowwise orientation (gmlp_quant_blocks()),
 * so a rowwise tensor's rows are its rows, a copy's its columns. FALSE
 * where the depth blocks are not the products' 128 (MXFP8). */
static gboolean
fp8_operand_scales (GmlpGroupedTensor    *t,
                    GmlpBackendFp8Scales *out)
{
  gint64 block_rows, block_cols, cols = gmlp_grouped_tensor_get_cols (t);

  *out = (GmlpBackendFp8Scales) { 0, };
  gmlp_grouped_tensor_get_scale_block (t, &block_rows, &block_cols);
  if (block_rows == 0 && block_cols == 0)
    return TRUE;
  if (!gmlp_grouped_tensor_is_columnwise (t))
    {
      if (block_cols != GMLP_BACKEND_FP8_DEPTH_BLOCK)
        return FALSE;
      *out = (GmlpBackendFp8Scales) { block_rows, gmlp_quant_blocks_along (cols, block_cols), 1 };
      return TRUE;
    }
  if (block_rows != GMLP_BACKEND_FP8_DEPTH_BLOCK)
    return FALSE;
  *out = (GmlpBackendFp8Scales) { block_cols, 1, gmlp_quant_blocks_along (cols, block_cols) };
  return TRUE;
}

/* An FP8 operand of a product: t, a quantized tensor or columnwise copy,
 * grouped by the sizes (rows) or the per-group weights, with its scales:
 * one per group (member i of its scale tensor, i strides on), or blocks
 * (fp8_operand_scales()) of a tensor grouped like t or of uniform members. */
static GmlpBackendOperand
fp8_operand (GmlpGroupedTensor          *t,
             gboolean                    rows,
             const GmlpBackendFp8Scales *scales)
{
  GmlpGroupedTensor *scale_inv = gmlp_grouped_tensor_get_scale_inv (t);
  GmlpBackendOperand op = rows ? gmlp_linear_rows_operand (t) : gmlp_linear_fixed_operand (t);

  op.scales = *scales;
  op.scale_inv = gmlp_grouped_tensor_get_data (scale_inv);
  if (!gmlp_backend_operand_scales_follow_rows (&op))
    op.scale_stride = gmlp_linear_fixed_operand (scale_inv).stride;
  return op;
}

/* Describes the FP8 product C_i = A_i B_iᵀ of a (grouped by the sizes) and
 * b (grouped too for WGRAD, else the per-group weights), both K-major,
 * rowwise tensors or columnwise copies (see GmlpBackendGemm), each with its
 * scales; the caller adds the output, its sizes, the mask or the bias.
 * FALSE where no product takes the operands' scale layout (MXFP8). */
static gboolean
fp8_describe (GmlpGroupedLinear  *self,
              GmlpGemmKind        kind,
              GmlpGroupedTensor  *a,
              GmlpGroupedTensor  *b,
              GmlpBackendGemm    *gemm)
{
  GmlpBackendFp8Scales a_scales, b_scales;

  if (!fp8_operand_scales (a, &a_scales) || !fp8_operand_scales (b, &b_scales))
    return FALSE;
  *gemm = (GmlpBackendGemm) {
    .kind = kind,
    .n_groups = self->n_groups,
    .n = self->out_features,
    .k = self->in_features,
    .a = fp8_operand (a, TRUE, &a_scales),
    .b = fp8_operand (b, kind == GMLP_GEMM_WGRAD, &b_scales),
  };
  return TRUE;
}

/* The sizes of sized_by into a described product, and whether the backend
 * multiplies its FP8 operands as they are (asked before anything is
 * enqueued): if not, the caller dequantizes them. */
static gboolean
fp8_takes (GmlpGroupedLinear  *self,
           GmlpBackendGemm    *gemm,
           GmlpGroupedTensor  *sized_by,
           gboolean           *takes,
           GError            **error)
{
  const char *reason = NULL;

  *takes = FALSE;
  if (!gmlp_linear_gemm_sizes (gemm, sized_by, error))
    return FALSE;
  *takes = GMLP_DEVICE_CALL (self->device, gemm_supported, gemm, &reason);
  if (!*takes)
    g_debug ("FP8 product on dequantized operands: %s", reason != NULL ? reason : "refused");
  return TRUE;
}

/* A described FP8 product on the backend's gemm, with the sizes of
 * sized_by. *ran says whether it ran: a product the backend does not take
 * (fp8_takes()) does not, and the caller dequantizes. */
static gboolean
fp8_run (GmlpGroupedLinear  *self,
         GmlpBackendGemm    *gemm,
         GmlpGroupedTensor  *sized_by,
         gboolean           *ran,
         GError            **error)
{
  if (!fp8_takes (self, gemm, sized_by, ran, error))
    return FALSE;
  return !*ran || GMLP_DEVICE_CALL (self->device, gemm, gemm, error);
}

/* FPROP y = x8 W8ᵀ [+ b] or DGRAD dx = dy8 (W8ᵀ)ᵀ into c (grouped like
 * a8): w8 the quantized weights (DGRAD: their columnwise copy). *ran as
 * for fp8_run(); operands whose scale layout no product takes (MXFP8) do
 * not run either. */
static gboolean
fp8_run_rows (GmlpGroupedLinear  *self,
              GmlpGemmKind        kind,
              GmlpGroupedTensor  *sized_by,
              GmlpGroupedTensor  *a8,
              GmlpGroupedTensor  *w8,
              GmlpGroupedTensor  *c,
              gboolean           *ran,
              GError            **error)
{
  GmlpBackendGemm gemm;

  *ran = FALSE;
  if (!fp8_describe (self, kind, a8, w8, &gemm))
    return TRUE;
  gemm.c = gmlp_linear_rows_operand (c);
  gemm.c.dtype = (int) self->dtype;
  if (kind == GMLP_GEMM_FPROP && self->bias.grouped != NULL)
    gemm.bias = gmlp_linear_param_operand (&self->bias);
  return fp8_run (self, &gemm, sized_by, ran, error);
}

/* Whether WGRAD can multiply the columnwise copies dy_t and x_t: the
 * recipes of a product with host sizes, or of one with device sizes
 * (fp8_device_wgrad()). */
static gboolean
fp8_wgrad_multiplies (GmlpGroupedTensor *sized_by,
                      GmlpGroupedTensor *dy_t,
                      GmlpGroupedTensor *x_t)
{
  return fp8_native (sized_by, dy_t, x_t) ||
         (dy_t != NULL && x_t != NULL &&
          fp8_device_wgrad (gmlp_grouped_tensor_get_scaling_recipe (x_t),
                            gmlp_grouped_tensor_get_scaling_recipe (dy_t)));
}

/* @t dequantized to @dtype, or @t itself when it is not FP8 (dequantized
 * already, by gmlp_linear_fp8_wgrad_prepare()). */
static GmlpGroupedTensor *
fp8_dequantized (GmlpGroupedTensor  *t,
                 GmlpDType           dtype,
                 GError            **error)
{
  if (!gmlp_dtype_is_fp8 (gmlp_grouped_tensor_get_dtype (t)))
    return g_object_ref (t);
  return gmlp_grouped_tensor_dequantize (t, dtype, error);
}

/* @product on dequantized operands: a8, b_rows8 (WGRAD's x) and weight8
 * (FPROP's and DGRAD's W) are dequantized to gmlp_linear_fp8_fallback_dtype()
 * (a8 and b_rows8 may be given so already) and the layer's usual product runs
 * on them, host or device sizes alike. */
static gboolean
fp8_run_dequantized (GmlpGroupedLinear  *self,
                     const Product      *product,
                     GmlpGroupedTensor  *a8,
                     GmlpGroupedTensor  *b_rows8,
                     GmlpGroupedTensor  *weight8,
                     GError            **error)
{
  GmlpDType dtype = gmlp_linear_fp8_fallback_dtype (self);
  g_autoptr(GmlpGroupedTensor) a = NULL;
  g_autoptr(GmlpGroupedTensor) b_rows = NULL;
  g_autoptr(GmlpGroupedTensor) weight = NULL;
  Param weight_param = { NULL, NULL };
  Product dequantized = *product;
  gboolean ok;

  a = fp8_dequantized (a8, dtype, error);
  if (a == NULL)
    return FALSE;
  if (b_rows8 != NULL && (b_rows = fp8_dequantized (b_rows8, dtype, error)) == NULL)
    return FALSE;
  if (weight8 != NULL &&
      ((weight = gmlp_grouped_tensor_dequantize (weight8, dtype, error)) == NULL ||
       !gmlp_linear_param_set (&weight_param, weight, self->n_groups, error)))
    return FALSE;

  dequantized.a = a;
  dequantized.b_rows = b_rows;
  if (weight != NULL)
    dequantized.fixed = &weight_param;
  dequantized.dequantized = TRUE;
  ok = gmlp_linear_run_product (self, &dequantized, error);
  gmlp_linear_param_clear (&weight_param, self->n_groups);
  return ok;
}

GmlpGroupedTensor *
gmlp_linear_fp8_forward (GmlpGroupedLinear     *self,
                         GmlpGroupedTensor     *input,
                         gboolean               save_input,
                         GmlpSavedActivations **saved,
                         GError               **error)
{
  g_autoptr(GmlpGroupedTensor) x8 = NULL;
  g_autoptr(GmlpGroupedTensor) w8 = NULL;
  g_autoptr(GmlpGroupedTensor) output = NULL;
  const gint64 *rows = gmlp_grouped_tensor_peek_rows (input);
  GmlpScalingRecipe x_recipe;
  gboolean multiplied, native, x_copy, ran = FALSE, training = saved != NULL;

  if (!gmlp_linear_fp8_check_activation (self, input, self->in_features, "The input",
                                         self->input_quantizer, "FPROP", NULL,
                                         self->weight_quantizer, error) ||
      !gmlp_linear_check_offload_context (self, error))
    return NULL;

  /* The columnwise copies are written only for a backward that reads
   * them: DGRAD reads W's (host or device sizes), WGRAD x's (host sizes;
   * device sizes with per-tensor or blockwise scales on both). */
  x_recipe = fp8_operand_recipe (input, self->input_quantizer);
  multiplied = gmlp_scaling_recipe_multiplies_fp8 (x_recipe) &&
               gmlp_scaling_recipe_multiplies_fp8 (gmlp_quantizer_get_recipe (self->weight_quantizer));
  native = rows != NULL && multiplied;
  x_copy = native || (multiplied && self->grad_output_quantizer != NULL &&
                      fp8_device_wgrad (x_recipe, gmlp_quantizer_get_recipe (self->grad_output_quantizer)));
  /* The output first: quantizing records amaxes in delayed-scaling
   * quantizers, which a forward that then fails for want of memory should
   * not have done. (A failure between the two quantizations, or a device
   * error, leaves the input's amax recorded; a retry records the same.) */
  output = gmlp_linear_new_activation_like (self, input, self->out_features, error);
  if (output == NULL)
    return NULL;
  x8 = fp8_quantize (input, self->input_quantizer, training && x_copy, error);
  if (x8 == NULL)
    return NULL;
  w8 = fp8_weights (self, training && multiplied, error);
  if (w8 == NULL)
    return NULL;

  if (multiplied && !fp8_run_rows (self, GMLP_GEMM_FPROP, input, x8, w8, output, &ran, error))
    return NULL;
  if (!ran)
    {
      Product fprop = { .kind = GMLP_GEMM_FPROP, .sized_by = input, .c_rows = output,
                        .c_dtype = self->dtype, .bias = self->bias.grouped != NULL };

      if (!fp8_run_dequantized (self, &fprop, x8, NULL, w8, error))
        return NULL;
    }

  if (saved != NULL)
    {
      g_autoptr(GmlpSavedActivations) new_saved = gmlp_saved_activations_new (self->id);

      /* Without the input (GroupedMLP's recompute adds the quantized
       * input before the backward), the FP8 weights are saved all the
       * same: a backward is FP8 when its forward was. */
      if (save_input)
        gmlp_saved_activations_add (new_saved, "input", x8);
      gmlp_saved_activations_add_resident (new_saved, "weight-fp8", w8);
      /* The backward reads the quantized copies; their sources are checked
       * all the same, so that FP8 and the other dtypes agree on what a
       * write between forward and backward does. */
      if (x8 != input)
        gmlp_saved_activations_watch (new_saved, "input", input);
      gmlp_saved_activations_watch (new_saved, "weight", self->weight.grouped);
      if (!gmlp_saved_activations_apply_offload (new_saved, error))
        return NULL;
      *saved = g_steal_pointer (&new_saved);
    }

  return g_steal_pointer (&output);
}

/* The FP8 backward's dgrad phase: dy quantized, then dx = dy8 W8 (W8's
 * columnwise copy, which the forward made). */
gboolean
gmlp_linear_fp8_dgrad (GmlpGroupedLinear   *self,
                       GmlpLinearBackward  *step,
                       GError             **error)
{
  GmlpGroupedTensor *input = step->input, *grad_output = step->grad_output, *w8 = step->w8;
  GmlpGroupedTensor *dy8, *w8_t;
  const gint64 *rows = gmlp_grouped_tensor_peek_rows (input);
  GmlpScalingRecipe dy_recipe, x_recipe;
  gboolean native_wgrad, ran = FALSE;

  /* WGRAD reads dy's columnwise copy when it can run on FP8. */
  dy_recipe = fp8_operand_recipe (grad_output, self->grad_output_quantizer);
  x_recipe = gmlp_grouped_tensor_get_scaling_recipe (input);
  native_wgrad = gmlp_grouped_tensor_get_columnwise (input) != NULL &&
                 gmlp_scaling_recipe_multiplies_fp8 (dy_recipe) &&
                 gmlp_scaling_recipe_multiplies_fp8 (x_recipe) &&
                 (rows != NULL || fp8_device_wgrad (x_recipe, dy_recipe));
  if (step->grad_output_fp8 == NULL)
    step->grad_output_fp8 = fp8_quantize (grad_output, self->grad_output_quantizer, native_wgrad, error);
  dy8 = step->grad_output_fp8;
  if (dy8 == NULL)
    return FALSE;
  /* What the weight gradient would allocate, now (a delayed one makes it
   * in its backward_dw). */
  if (!has_flag (self, GMLP_LINEAR_DELAY_WGRAD_COMPUTE) &&
      !gmlp_linear_fp8_wgrad_prepare (self, input, grad_output == dy8 ? NULL : grad_output, dy8,
                                      &step->fp8_operands, error))
    return FALSE;

  w8_t = gmlp_grouped_tensor_get_columnwise (w8);
  if (w8_t != NULL && fp8_multiplied (dy8, w8) &&
      !fp8_run_rows (self, GMLP_GEMM_DGRAD, input, dy8, w8_t, step->grad_input, &ran, error))
    return FALSE;
  if (!ran)
    {
      Product dgrad = { .kind = GMLP_GEMM_DGRAD, .sized_by = input, .c_rows = step->grad_input,
                        .c_dtype = self->dtype };

      /* dy dequantized for the weight gradient serves here too. */
      if (!fp8_run_dequantized (self, &dgrad,
                                step->fp8_operands.dy != NULL ? step->fp8_operands.dy : dy8, NULL, w8,
                                error))
        return FALSE;
    }
  return TRUE;
}

/* Whether an FP8 weight gradient multiplies on dequantized operands
 * whatever the device: no FP8 product takes its operands (no columnwise
 * copies, MXFP8, ...). gmlp_linear_fp8_wgrad() tries the others first. */
static gboolean
fp8_wgrad_dequantizes (GmlpGroupedTensor *input,
                       GmlpGroupedTensor *grad_output_fp8)
{
  GmlpGroupedTensor *x_t = gmlp_grouped_tensor_get_columnwise (input);
  GmlpGroupedTensor *dy_t = gmlp_grouped_tensor_get_columnwise (grad_output_fp8);

  return !fp8_wgrad_multiplies (input, dy_t, x_t);
}

void
gmlp_linear_fp8_wgrad_operands_clear (Fp8WgradOperands *operands)
{
  g_clear_object (&operands->bias_dy);
  g_clear_object (&operands->dy);
  g_clear_object (&operands->x);
}

/* Makes what @operands lacks of what gmlp_linear_fp8_wgrad() will read (see
 * Fp8WgradOperands), so that it allocates nothing once it writes. */
gboolean
gmlp_linear_fp8_wgrad_prepare (GmlpGroupedLinear  *self,
                               GmlpGroupedTensor  *input,
                               GmlpGroupedTensor  *grad_output,
                               GmlpGroupedTensor  *grad_output_fp8,
                               Fp8WgradOperands   *operands,
                               GError            **error)
{
  if (self->bias.grouped != NULL && grad_output == NULL && operands->bias_dy == NULL)
    {
      operands->bias_dy = gmlp_grouped_tensor_dequantize (grad_output_fp8, self->dtype, error);
      if (operands->bias_dy == NULL)
        return FALSE;
    }
  if (operands->dy == NULL && fp8_wgrad_dequantizes (input, grad_output_fp8))
    {
      g_autoptr(GmlpGroupedTensor) dy =
        gmlp_grouped_tensor_dequantize (grad_output_fp8, gmlp_linear_fp8_fallback_dtype (self),
                                        error);
      g_autoptr(GmlpGroupedTensor) x = NULL;

      if (dy == NULL)
        return FALSE;
      x = gmlp_grouped_tensor_dequantize (input, gmlp_linear_fp8_fallback_dtype (self), error);
      if (x == NULL)
        return FALSE;
      operands->dy = g_steal_pointer (&dy);
      operands->x = g_steal_pointer (&x);
    }
  return TRUE;
}

/* The weight gradients of an FP8 backward: dW from the quantized x and dy
 * (into wgrad->fixed, as compute_wgrad() set it up), or from their
 * dequantized values where no FP8 product takes them; db from the
 * unquantized dy, or, when dy came quantized, from its dequantized values. */
gboolean
gmlp_linear_fp8_wgrad (GmlpGroupedLinear  *self,
                       const Product      *wgrad,
                       GmlpGroupedTensor  *input,
                       GmlpGroupedTensor  *grad_output,
                       GmlpGroupedTensor  *grad_output_fp8,
                       Fp8WgradOperands   *operands,
                       GError            **error)
{
  GmlpGroupedTensor *x_t = gmlp_grouped_tensor_get_columnwise (input);
  GmlpGroupedTensor *dy_t = gmlp_grouped_tensor_get_columnwise (grad_output_fp8);
  GmlpBackendGemm gemm;
  gboolean takes = FALSE;

  if (!gmlp_linear_fp8_wgrad_prepare (self, input, grad_output, grad_output_fp8, operands, error))
    return FALSE;

  /* Which product, decided before anything is written: the copies' FP8
   * product where the backend takes it, else dequantized operands (made
   * here where the backend refused, which cannot be known before the
   * outputs are: the one allocation left in the weight-gradient phase,
   * see compute_wgrad()). */
  if (fp8_wgrad_multiplies (input, dy_t, x_t) &&
      fp8_describe (self, GMLP_GEMM_WGRAD, dy_t, x_t, &gemm))
    {
      gemm.c = gmlp_linear_param_operand (wgrad->fixed);
      gemm.c.dtype = (int) wgrad->c_dtype;
      gemm.accumulate = wgrad->accumulate;
      if (!fp8_takes (self, &gemm, input, &takes, error))
        return FALSE;
    }

  gmlp_linear_bump_wgrad_versions (self);
  if (takes)
    {
      if (!GMLP_DEVICE_CALL (self->device, gemm, &gemm, error))
        return FALSE;
    }
  else if (!fp8_run_dequantized (self, wgrad,
                                 operands->dy != NULL ? operands->dy : grad_output_fp8,
                                 operands->x != NULL ? operands->x : input, NULL, error))
    {
      return FALSE;
    }

  if (self->bias.grouped == NULL)
    return TRUE;
  return gmlp_linear_run_bias_grad (self, input,
                                    grad_output != NULL ? grad_output : operands->bias_dy, error);
}
