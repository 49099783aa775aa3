/* gmlp-grouped-tensor-quantized.c: FP8 tensors and their scales
 *
 * A tensor made by gmlp_quantizer_quantize() carries what its values mean:
 * the recipe, the scale-inverse tensor and, for the wgrad product, a
 * columnwise copy. They are kept as object data rather than in the instance
 * struct, so that plain tensors pay nothing for them; a member view of a
 * quantized tensor is quantized too (gmlp-grouped-tensor-members.c, through
 * the getters here), and convert() dequantizes it or refuses
 * (gmlp_grouped_tensor_convert_scaled()).
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-grouped-tensor-private.h"
#include "gmlp-dtype-private.h"
#include "gmlp-enum-types.h"
#include "gmlp-error.h"
#include "gmlp-error-private.h"
#include "gmlp-quantize-numeric.h"
#include "gmlp-quantizer-private.h"
#include "gmlp-thread-private.h"

typedef struct {
  GmlpScalingRecipe  recipe;
  int                flags;          /* GMLP_QUANT_FLAG_* */
  GmlpGroupedTensor *scale_inv;
  GmlpGroupedTensor *columnwise;     /* the rowwise tensor's copy, or NULL */
  gboolean           is_columnwise;  /* this is the copy */
} QuantizedInfo;

/* Internal linkage: the macro defines a function of the name declared here. */
static GQuark quantized_info_quark (void);
GMLP_DEFINE_QUARK (gmlp-grouped-tensor-quantized, quantized_info)

/* Marks the E8M0 scale tensor of an MXFP8 tensor: bytes typed E4M3. */
static GQuark e8m0_scales_quark (void);
GMLP_DEFINE_QUARK (gmlp-grouped-tensor-e8m0-scales, e8m0_scales)

static void
quantized_info_free (gpointer data)
{
  QuantizedInfo *info = data;

  g_clear_object (&info->scale_inv);
  g_clear_object (&info->columnwise);
  g_free (info);
}

static QuantizedInfo *
get_quantized_info (GmlpGroupedTensor *self)
{
  return g_object_get_qdata (G_OBJECT (self), quantized_info_quark ());
}

void
gmlp_grouped_tensor_set_quantized (GmlpGroupedTensor  *self,
                                   GmlpScalingRecipe   recipe,
                                   int                 flags,
                                   GmlpGroupedTensor  *scale_inv,
                                   GmlpGroupedTensor  *columnwise,
                                   gboolean            is_columnwise)
{
  QuantizedInfo *info = g_new0 (QuantizedInfo, 1);

  g_assert (gmlp_dtype_is_fp8 (gmlp_grouped_tensor_get_dtype (self)) && scale_inv != NULL);

  info->recipe = recipe;
  info->flags = flags;
  info->scale_inv = g_object_ref (scale_inv);
  info->columnwise = columnwise != NULL ? g_object_ref (columnwise) : NULL;
  info->is_columnwise = is_columnwise;
  g_object_set_qdata_full (G_OBJECT (self), quantized_info_quark (), info, quantized_info_free);
  if (recipe == GMLP_SCALING_RECIPE_MXFP8)
    gmlp_grouped_tensor_mark_e8m0_scales (scale_inv);
}

void
gmlp_grouped_tensor_mark_e8m0_scales (GmlpGroupedTensor *self)
{
  g_object_set_qdata (G_OBJECT (self), e8m0_scales_quark (), GINT_TO_POINTER (TRUE));
}

int
gmlp_grouped_tensor_get_quantize_flags (GmlpGroupedTensor *self)
{
  QuantizedInfo *info = get_quantized_info (self);

  return info != NULL ? info->flags : 0;
}

/**
 * gmlp_grouped_tensor_get_scaling_recipe:
 * @self: a #GmlpGroupedTensor
 *
 * Gets how the scales of an FP8 tensor were computed.
 *
 * Returns: the recipe of the [class@Gmlp.Quantizer] that made @self, or
 *   %GMLP_SCALING_RECIPE_NONE for a tensor without scales
 *
 * Since: 0.1
 */
GmlpScalingRecipe
gmlp_grouped_tensor_get_scaling_recipe (GmlpGroupedTensor *self)
{
  QuantizedInfo *info;

  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), GMLP_SCALING_RECIPE_NONE);

  info = get_quantized_info (self);
  return info != NULL ? info->recipe : GMLP_SCALING_RECIPE_NONE;
}

/**
 * gmlp_grouped_tensor_get_scale_inv:
 * @self: a #GmlpGroupedTensor
 *
 * Gets the scale inverses of a quantized tensor: a value of @self stands for
 * `value × scale_inv` of its block. Member i of the scale tensor belongs to
 * member i of @self and is a row-major grid of
 * `ceil (rows_i / block_rows) × ceil (cols / block_cols)` scales (one for
 * a per-tensor recipe), with the blocks of
 * [method@Gmlp.GroupedTensor.get_scale_block]. The scales are FP32, except
 * for %GMLP_SCALING_RECIPE_MXFP8, whose scales are E8M0 bytes (the value
 * 2^(b − 127), 255 for NaN): as #GmlpDType has no E8M0 type, that tensor is
 * typed %GMLP_DTYPE_FLOAT8_E4M3 as a container of bytes; read it with
 * [method@Gmlp.GroupedTensor.to_bytes], do not convert it. Where @self has
 * device-only sizes, so has the scale tensor. docs/fp8.md has the details.
 *
 * Returns: (transfer none) (nullable): the scales, or %NULL for a tensor
 *   without scales
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_tensor_get_scale_inv (GmlpGroupedTensor *self)
{
  QuantizedInfo *info;

  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), NULL);

  info = get_quantized_info (self);
  return info != NULL ? info->scale_inv : NULL;
}

/**
 * gmlp_grouped_tensor_get_scale_block:
 * @self: a #GmlpGroupedTensor
 * @block_rows: (out) (optional): return location for the rows of a block,
 *   0 for all the rows of a member
 * @block_cols: (out) (optional): return location for the columns of a
 *   block, 0 for all the columns
 *
 * Gets the blocks that share a scale, always in the orientation of the
 * rowwise tensor (`rows_i × cols`), for its columnwise copy too: element
 * (r, c) of member i has the scale at (r / block_rows, c / block_cols) of
 * member i of the scale tensor. Per-tensor recipes give 0 × 0; blockwise
 * 1 × 128 (the copy: 128 × 1), or 128 × 128 for weights; MXFP8 1 × 32 (the
 * copy: 32 × 1).
 *
 * Returns: %TRUE for a quantized tensor, %FALSE (and zeros) for a tensor
 *   without scales
 *
 * Since: 0.1
 */
gboolean
gmlp_grouped_tensor_get_scale_block (GmlpGroupedTensor *self,
                                     gint64            *block_rows,
                                     gint64            *block_cols)
{
  QuantizedInfo *info;
  int64_t rows = 0, cols = 0;

  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), FALSE);

  info = get_quantized_info (self);
  if (info != NULL)
    gmlp_quant_blocks ((int) info->recipe, info->flags, info->is_columnwise, &rows, &cols);
  if (block_rows != NULL)
    *block_rows = rows;
  if (block_cols != NULL)
    *block_cols = cols;
  return info != NULL;
}

/**
 * gmlp_grouped_tensor_get_columnwise:
 * @self: a #GmlpGroupedTensor
 *
 * Gets the columnwise copy of a quantized tensor, made when its quantizer
 * had [property@Gmlp.Quantizer:columnwise] set: the operand of the wgrad
 * product. It has the group sizes and member offsets of @self, but member i
 * holds the transpose, `cols × rows_i` values row-major. Its scales are its
 * own [method@Gmlp.GroupedTensor.get_scale_inv]; for per-tensor recipes and
 * 128 × 128 tiles it quantizes every value exactly as @self does, so its
 * bytes are the transpose of those of @self.
 *
 * Returns: (transfer none) (nullable): the copy, or %NULL
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_tensor_get_columnwise (GmlpGroupedTensor *self)
{
  QuantizedInfo *info;

  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), NULL);

  info = get_quantized_info (self);
  return info != NULL ? info->columnwise : NULL;
}

/**
 * gmlp_grouped_tensor_is_columnwise:
 * @self: a #GmlpGroupedTensor
 *
 * Tells whether @self holds the transposed (columnwise) FP8 copy of a tensor.
 *
 * Returns: %TRUE if @self is the columnwise copy of a quantized tensor (its
 *   members hold transposes)
 *
 * Since: 0.1
 */
gboolean
gmlp_grouped_tensor_is_columnwise (GmlpGroupedTensor *self)
{
  QuantizedInfo *info;

  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), FALSE);

  info = get_quantized_info (self);
  return info != NULL && info->is_columnwise;
}

/* A quantized rowwise tensor, or an error that says why not. */
static QuantizedInfo *
check_quantized (GmlpGroupedTensor  *self,
                 GError            **error)
{
  QuantizedInfo *info = get_quantized_info (self);
  GmlpDType dtype = gmlp_grouped_tensor_get_dtype (self);

  if (!gmlp_dtype_is_fp8 (dtype))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_DTYPE_MISMATCH,
                   "A %s tensor is not quantized: FP8 expected", gmlp_dtype_get_name (dtype));
      return NULL;
    }
  if (info == NULL)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "This %s tensor has no scales: it was not made by a GmlpQuantizer "
                   "(a conversion or a member view has none)", gmlp_dtype_get_name (dtype));
      return NULL;
    }
  if (info->is_columnwise)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "This is the columnwise (transposed) copy of a quantized tensor; "
                   "use the rowwise tensor");
      return NULL;
    }
  return info;
}

/**
 * gmlp_grouped_tensor_dequantize:
 * @self: a quantized tensor (see [class@Gmlp.Quantizer])
 * @dtype: the element type of the result: %GMLP_DTYPE_FLOAT32,
 *   %GMLP_DTYPE_FLOAT16 or %GMLP_DTYPE_BFLOAT16
 * @error: return location for a #GError
 *
 * Computes `value × scale_inv` for every element, in FP32, into a new tensor
 * of the same group sizes on the same device, in one launch, rounded to
 * nearest even into @dtype. NaN stays NaN; an MXFP8 block with the NaN
 * scale gives NaN.
 *
 * Returns: (transfer full): the dequantized tensor, or %NULL with
 *   %GMLP_ERROR_DTYPE_MISMATCH when @self is not FP8 or @dtype is not one of
 *   the three, %GMLP_ERROR_INVALID_ARGUMENT for an FP8 tensor without
 *   scales, or %GMLP_ERROR_UNSUPPORTED for a columnwise copy
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_tensor_dequantize (GmlpGroupedTensor  *self,
                                GmlpDType           dtype,
                                GError            **error)
{
  g_autoptr(GmlpGroupedTensor) result = NULL;
  QuantizedInfo *info;
  GmlpBackendShape shape;

  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!gmlp_grouped_tensor_check_usable (self, error))
    return NULL;

  info = check_quantized (self, error);
  if (info == NULL)
    return NULL;
  if (dtype != GMLP_DTYPE_FLOAT32 && dtype != GMLP_DTYPE_FLOAT16 && dtype != GMLP_DTYPE_BFLOAT16)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_DTYPE_MISMATCH,
                   "Dequantization gives float32, float16 or bfloat16, not %s",
                   gmlp_dtype_get_name (dtype));
      return NULL;
    }

  if (!gmlp_grouped_tensor_get_backend_shape (self, &shape, error))
    return NULL;
  result = gmlp_grouped_tensor_new_like (self, dtype, error);
  if (result == NULL)
    return NULL;

  {
    GmlpBackendQuantize dequantize = {
      .shape = shape,
      .recipe = (int) info->recipe,
      .flags = info->flags,
      .fp8_dtype = (int) gmlp_grouped_tensor_get_dtype (self),
      .data = gmlp_grouped_tensor_get_data (self),
      .scale_inv = gmlp_grouped_tensor_get_data (info->scale_inv),
      .dst = gmlp_grouped_tensor_get_data (result),
      .dst_dtype = (int) dtype,
    };

    if (!GMLP_DEVICE_CALL (gmlp_grouped_tensor_get_device (self), dequantize, &dequantize, error))
      return NULL;
  }

  return g_steal_pointer (&result);
}

gboolean
gmlp_grouped_tensor_is_scaled (GmlpGroupedTensor *self)
{
  return get_quantized_info (self) != NULL ||
         g_object_get_qdata (G_OBJECT (self), e8m0_scales_quark ()) != NULL;
}

GmlpGroupedTensor *
gmlp_grouped_tensor_convert_scaled (GmlpGroupedTensor  *self,
                                    GmlpDType           dtype,
                                    GError            **error)
{
  if (get_quantized_info (self) == NULL)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "This tensor holds the E8M0 scales of an MXFP8 tensor, bytes typed %s for "
                   "want of an E8M0 type, not values to convert to %s: read them with "
                   "gmlp_grouped_tensor_to_bytes()",
                   gmlp_dtype_get_name (gmlp_grouped_tensor_get_dtype (self)),
                   gmlp_dtype_get_name (dtype));
      return NULL;
    }
  if (dtype != GMLP_DTYPE_FLOAT32 && dtype != GMLP_DTYPE_FLOAT16 && dtype != GMLP_DTYPE_BFLOAT16)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "Cannot convert a tensor quantized by a GmlpQuantizer to %s: without its "
                   "scales its values mean nothing. It converts to float32, float16 or "
                   "bfloat16 with its scales applied (gmlp_grouped_tensor_dequantize()); to "
                   "requantize, quantize that with a GmlpQuantizer",
                   gmlp_dtype_get_name (dtype));
      return NULL;
    }
  return gmlp_grouped_tensor_dequantize (self, dtype, error);
}

gboolean
gmlp_quantized_check_compatible (GmlpGroupedTensor  *a,
                                 GmlpGroupedTensor  *b,
                                 GError            **error)
{
  QuantizedInfo *info_a, *info_b;

  info_a = check_quantized (a, error);
  if (info_a == NULL)
    return FALSE;
  info_b = check_quantized (b, error);
  if (info_b == NULL)
    return FALSE;
  if (info_a->recipe != info_b->recipe)
    {
      g_autoptr(GEnumClass) recipes = g_type_class_ref (GMLP_TYPE_SCALING_RECIPE);

      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "The operands were quantized by two recipes (%s and %s); an FP8 product "
                   "needs one", g_enum_get_value (recipes, info_a->recipe)->value_nick,
                   g_enum_get_value (recipes, info_b->recipe)->value_nick);
      return FALSE;
    }
  return TRUE;
}
