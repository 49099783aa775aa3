/* gmlp-grouped-tensor-ops.c: operations on a grouped tensor's values
 *
 * Conversion to another dtype, fills, and the arithmetic of losses and
 * optimizer steps (add_scaled, scale, sum_squares): each one call into the
 * device's backend over the tensor's shape. The object and its layout are
 * in gmlp-grouped-tensor.c.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-grouped-tensor-private.h"
#include "gmlp-dtype-private.h"
#include "gmlp-error.h"
#include "gmlp-error-private.h"

/**
 * gmlp_grouped_tensor_convert:
 * @self: a #GmlpGroupedTensor
 * @dtype: the element type of the result
 * @error: return location for a #GError
 *
 * Converts every element to @dtype into a new tensor of the same group sizes
 * on the same device, in one launch. Floating-point conversions round to
 * nearest even and saturate FP8 as described for [enum@Gmlp.DType]; INT32 and
 * INT64 convert to each other, INT64 saturating to the INT32 range.
 *
 * A tensor made by a [class@Gmlp.Quantizer] means its FP8 values times its
 * scales, and converts as such: to %GMLP_DTYPE_FLOAT32,
 * %GMLP_DTYPE_FLOAT16 or %GMLP_DTYPE_BFLOAT16 with its scales applied,
 * exactly as [method@Gmlp.GroupedTensor.dequantize] does (per-tensor,
 * blockwise and MXFP8 scales alike). To any other type it is refused, as
 * is its columnwise copy (convert the rowwise tensor) and the E8M0 scale
 * tensor of an MXFP8 tensor (read it with
 * [method@Gmlp.GroupedTensor.to_bytes]): FP8 bits without their scales
 * mean nothing, so to requantize, convert to a floating type and quantize
 * that with a [class@Gmlp.Quantizer].
 *
 * Returns: (transfer full): the converted tensor, or %NULL with
 *   %GMLP_ERROR_UNSUPPORTED for a conversion between integer and floating
 *   types, or one that the scales of @self forbid
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_tensor_convert (GmlpGroupedTensor  *self,
                             GmlpDType           dtype,
                             GError            **error)
{
  g_autoptr(GmlpGroupedTensor) result = NULL;
  GmlpBackendShape shape;
  GmlpDType from;

  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!gmlp_grouped_tensor_check_usable (self, error))
    return NULL;

  if (gmlp_grouped_tensor_is_scaled (self))
    return gmlp_grouped_tensor_convert_scaled (self, dtype, error);
  from = gmlp_grouped_tensor_get_dtype (self);
  if (!gmlp_dtype_can_convert (from, dtype))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "Cannot convert %s to %s", gmlp_dtype_get_name (from),
                   gmlp_dtype_get_name (dtype));
      return NULL;
    }

  if (!gmlp_grouped_tensor_get_backend_shape (self, &shape, error))
    return NULL;

  result = gmlp_grouped_tensor_new_like (self, dtype, error);
  if (result == NULL)
    return NULL;

  if (!GMLP_DEVICE_CALL (gmlp_grouped_tensor_get_device (self), convert, &shape,
                         gmlp_grouped_tensor_get_data (self), (int) from,
                         gmlp_grouped_tensor_get_data (result), (int) dtype, error))
    return NULL;

  return g_steal_pointer (&result);
}

/**
 * gmlp_grouped_tensor_fill_zero:
 * @self: a #GmlpGroupedTensor
 * @error: return location for a #GError
 *
 * Sets every byte of the tensor's storage (padding included) to zero,
 * stream-ordered.
 *
 * Returns: %TRUE on success
 *
 * Since: 0.1
 */
gboolean
gmlp_grouped_tensor_fill_zero (GmlpGroupedTensor  *self,
                               GError            **error)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_grouped_tensor_check_usable (self, error))
    return FALSE;

  gmlp_grouped_tensor_bump_version (self);
  return GMLP_DEVICE_CALL (gmlp_grouped_tensor_get_device (self), fill_bytes,
                           gmlp_grouped_tensor_get_data (self), 0,
                           gmlp_grouped_tensor_get_nbytes (self), error);
}

/**
 * gmlp_grouped_tensor_fill_random:
 * @self: a #GmlpGroupedTensor
 * @seed: the seed
 * @scale: the half-width of the distribution, taken as a float: 0, or
 *   from 2^-126 (%G_MINFLOAT) to %G_MAXFLOAT
 * @error: return location for a #GError
 *
 * Fills the tensor with values drawn uniformly from [-@scale, @scale), for
 * demos, initialisation and tests. The values depend only on @seed and the
 * element's position in the tensor's storage, so every backend produces the
 * same tensor.
 *
 * Returns: %TRUE on success; %FALSE with %GMLP_ERROR_UNSUPPORTED for integer
 *   tensors, or %GMLP_ERROR_INVALID_ARGUMENT for a scale that is negative,
 *   NaN or infinite, or that a float cannot hold
 *
 * Since: 0.1
 */
gboolean
gmlp_grouped_tensor_fill_random (GmlpGroupedTensor  *self,
                                 guint64             seed,
                                 double              scale,
                                 GError            **error)
{
  GmlpDType dtype;
  float half_width;
  gsize elem;

  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_grouped_tensor_check_usable (self, error))
    return FALSE;

  dtype = gmlp_grouped_tensor_get_dtype (self);
  if (!gmlp_dtype_is_floating (dtype))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "Random fill needs a floating-point tensor, not %s",
                   gmlp_dtype_get_name (dtype));
      return FALSE;
    }
  if (!gmlp_dtype_narrow_double (scale, "scale", GMLP_NARROW_NOT_NEGATIVE, &half_width, error))
    return FALSE;

  elem = gmlp_dtype_get_size (dtype);
  gmlp_grouped_tensor_bump_version (self);
  return GMLP_DEVICE_CALL (gmlp_grouped_tensor_get_device (self), fill_random,
                           gmlp_grouped_tensor_get_data (self), (int) dtype,
                           gmlp_grouped_tensor_get_nbytes (self) / elem, seed, half_width, error);
}

static gboolean
check_arithmetic_dtype (GmlpGroupedTensor  *self,
                        GError            **error)
{
  GmlpDType dtype = gmlp_grouped_tensor_get_dtype (self);

  if (dtype != GMLP_DTYPE_FLOAT32 && dtype != GMLP_DTYPE_FLOAT16 && dtype != GMLP_DTYPE_BFLOAT16)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "Arithmetic on %s tensors is not supported (float32, float16, bfloat16)",
                   gmlp_dtype_get_name (dtype));
      return FALSE;
    }
  return TRUE;
}

/**
 * gmlp_grouped_tensor_add_scaled:
 * @self: the tensor to update
 * @alpha: the factor, applied as a float: 0, or finite with a magnitude
 *   from 2^-126 (%G_MINFLOAT) to %G_MAXFLOAT
 * @other: a tensor of the same group sizes and columns on the same device;
 *   its dtype may differ (for example an FP32 gradient into BF16 weights)
 * @error: return location for a #GError
 *
 * Computes `self += alpha × other` element by element, in FP32, stream-ordered
 * and in one launch: the update step of a plain SGD optimizer, or the
 * difference of two outputs. A factor that a float cannot hold (NaN, an
 * infinity, a magnitude past %G_MAXFLOAT or a nonzero one below
 * %G_MINFLOAT) is refused rather than rounded to infinity or 0. Products
 * that overflow FP32 give infinities, as FP32 arithmetic does.
 *
 * Returns: %TRUE on success; %FALSE with %GMLP_ERROR_SHAPE_MISMATCH,
 *   %GMLP_ERROR_INVALID_ARGUMENT (another device, a factor that a float
 *   cannot hold) or %GMLP_ERROR_UNSUPPORTED (integer or FP8 tensors), with
 *   @self unchanged
 *
 * Since: 0.1
 */
gboolean
gmlp_grouped_tensor_add_scaled (GmlpGroupedTensor  *self,
                                double              alpha,
                                GmlpGroupedTensor  *other,
                                GError            **error)
{
  GmlpBackendShape shape;
  float factor;

  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), FALSE);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (other), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_grouped_tensor_check_usable (self, error) ||
      !gmlp_grouped_tensor_check_usable (other, error))
    return FALSE;

  if (!check_arithmetic_dtype (self, error) || !check_arithmetic_dtype (other, error) ||
      !gmlp_dtype_narrow_double (alpha, "alpha", GMLP_NARROW_DEFAULT, &factor, error))
    return FALSE;
  if (gmlp_grouped_tensor_get_device (other) != gmlp_grouped_tensor_get_device (self))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "The tensors are on two devices");
      return FALSE;
    }
  if (!gmlp_grouped_tensor_same_shape (self, other))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
                   "The tensors differ in group sizes or columns");
      return FALSE;
    }

  if (!gmlp_grouped_tensor_get_backend_shape (self, &shape, error))
    return FALSE;
  gmlp_grouped_tensor_bump_version (self);
  return GMLP_DEVICE_CALL (gmlp_grouped_tensor_get_device (self), axpby, &shape,
                           gmlp_grouped_tensor_get_data (other),
                           (int) gmlp_grouped_tensor_get_dtype (other),
                           gmlp_grouped_tensor_get_data (self),
                           (int) gmlp_grouped_tensor_get_dtype (self), factor, 1.0f, error);
}

/**
 * gmlp_grouped_tensor_scale:
 * @self: the tensor to update
 * @alpha: the factor, applied as a float: 0, or finite with a magnitude
 *   from 2^-126 (%G_MINFLOAT) to %G_MAXFLOAT
 * @error: return location for a #GError
 *
 * Multiplies every element by @alpha, in FP32, stream-ordered. A factor
 * that a float cannot hold is refused, as for
 * [method@Gmlp.GroupedTensor.add_scaled].
 *
 * Returns: %TRUE on success; %FALSE with %GMLP_ERROR_UNSUPPORTED for
 *   integer or FP8 tensors, or %GMLP_ERROR_INVALID_ARGUMENT for a factor that
 *   a float cannot hold, with @self unchanged
 *
 * Since: 0.1
 */
gboolean
gmlp_grouped_tensor_scale (GmlpGroupedTensor  *self,
                           double              alpha,
                           GError            **error)
{
  GmlpBackendShape shape;
  float factor;

  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_grouped_tensor_check_usable (self, error))
    return FALSE;

  if (!check_arithmetic_dtype (self, error) ||
      !gmlp_dtype_narrow_double (alpha, "alpha", GMLP_NARROW_DEFAULT, &factor, error) ||
      !gmlp_grouped_tensor_get_backend_shape (self, &shape, error))
    return FALSE;
  gmlp_grouped_tensor_bump_version (self);
  return GMLP_DEVICE_CALL (gmlp_grouped_tensor_get_device (self), axpby, &shape, NULL,
                           (int) gmlp_grouped_tensor_get_dtype (self),
                           gmlp_grouped_tensor_get_data (self),
                           (int) gmlp_grouped_tensor_get_dtype (self), 0.0f, factor, error);
}

/**
 * gmlp_grouped_tensor_sum_squares:
 * @self: a #GmlpGroupedTensor
 * @error: return location for a #GError
 *
 * Sums the squares of the elements (a loss, or a norm), squaring and
 * accumulating in FP64, so that no FP32 value's square overflows or
 * vanishes. Waits for the device.
 *
 * Returns: the sum, or -1 with %GMLP_ERROR_UNSUPPORTED for integer or FP8
 *   tensors, or %GMLP_ERROR_INVALID_STATE while the device captures a graph
 *
 * Since: 0.1
 */
double
gmlp_grouped_tensor_sum_squares (GmlpGroupedTensor  *self,
                                 GError            **error)
{
  GmlpBackendShape shape;
  double result = 0.0;

  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), -1.0);
  g_return_val_if_fail (error == NULL || *error == NULL, -1.0);

  if (!gmlp_grouped_tensor_check_usable (self, error))
    return -1.0;

  if (!check_arithmetic_dtype (self, error) ||
      !gmlp_device_check_not_capturing (gmlp_grouped_tensor_get_device (self), "A sum of squares",
                                        error) ||
      !gmlp_grouped_tensor_get_backend_shape (self, &shape, error) ||
      !GMLP_DEVICE_CALL (gmlp_grouped_tensor_get_device (self), sum_squares, &shape,
                         gmlp_grouped_tensor_get_data (self),
                         (int) gmlp_grouped_tensor_get_dtype (self), &result, error))
    return -1.0;
  return result;
}
