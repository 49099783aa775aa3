/* gmlp-grouped-linear-params.c: the parameters of a GmlpGroupedLinear
 *
 * The weights, biases and their gradients, each kept as a Param (its
 * grouped tensor, its members' views and the table of their pointers,
 * members rebound to a caller's tensors), drawn from a seed, uploaded from
 * bytes, and shown grouped or per group. A change of the weights drops the
 * cached FP8 copy (gmlp_grouped_linear_invalidate_fp8_weights()). The
 * object itself is gmlp-grouped-linear.c (gmlp-grouped-linear-impl.h).
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <math.h>

#include "gmlp-grouped-linear-impl.h"
#include "gmlp-numeric.h"
#include "gmlp-error.h"
#include "gmlp-error-private.h"
#include "gmlp-thread-private.h"

void
gmlp_linear_param_clear (Param *param,
                         guint  n_groups)
{
  guint g;

  if (param->members != NULL)
    for (g = 0; g < n_groups; g++)
      g_clear_object (&param->members[g]);
  g_clear_pointer (&param->members, g_free);
  g_clear_pointer (&param->table, g_free);
  param->rebound = FALSE;
  g_clear_object (&param->grouped);
}

/* Host array of the member pointers of per-group tensors. */
static gpointer *
member_pointers (GmlpGroupedTensor **members,
                 guint               n_groups)
{
  gpointer *ptrs = g_new (gpointer, n_groups);
  guint g;

  for (g = 0; g < n_groups; g++)
    ptrs[g] = gmlp_grouped_tensor_get_member_data (members[g], 0);
  return ptrs;
}

/* Sets the grouped tensor and makes its member views. */
gboolean
gmlp_linear_param_set (Param              *param,
                       GmlpGroupedTensor  *grouped,
                       guint               n_groups,
                       GError            **error)
{
  g_autofree GmlpGroupedTensor **members = g_new0 (GmlpGroupedTensor *, n_groups);
  guint g;

  for (g = 0; g < n_groups; g++)
    {
      members[g] = gmlp_grouped_tensor_get_member (grouped, g, error);
      if (members[g] == NULL)
        {
          while (g-- > 0)
            g_object_unref (members[g]);
          return FALSE;
        }
    }

  gmlp_linear_param_clear (param, n_groups);
  param->grouped = g_object_ref (grouped);
  param->members = g_steal_pointer (&members);
  param->table = member_pointers (param->members, n_groups);
  return TRUE;
}

void
gmlp_linear_param_rebind (Param             *param,
                          guint              index,
                          GmlpGroupedTensor *member)
{
  g_set_object (&param->members[index], member);
  param->table[index] = gmlp_grouped_tensor_get_member_data (member, 0);
  param->rebound = TRUE;
}

/**
 * gmlp_grouped_linear_init_parameters:
 * @self: a #GmlpGroupedLinear
 * @seed: the seed
 * @error: return location for a #GError
 *
 * Draws the weights and biases uniformly from ±1/√in_features (the default
 * of common frameworks' linear layers), reproducibly from @seed on every
 * backend.
 *
 * Returns: %TRUE on success
 *
 * Since: 0.1
 */
gboolean
gmlp_grouped_linear_init_parameters (GmlpGroupedLinear  *self,
                                     guint64             seed,
                                     GError            **error)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  return gmlp_grouped_linear_init_parameters_from (self, seed, 0, error);
}

/* The inverse of gmlp_num_mix64() (splitmix64's finaliser): each xorshift
 * undone, each product by its inverse modulo 2^64. */
static guint64
unmix64 (guint64 z)
{
  z ^= z >> 31 ^ z >> 62;
  z *= G_GUINT64_CONSTANT (0x319642b2d24d8ec3);
  z ^= z >> 27 ^ z >> 54;
  z *= G_GUINT64_CONSTANT (0x96de1b173f119089);
  z ^= z >> 30 ^ z >> 60;
  return z;
}

/* The seed whose element i is element @offset + i of @seed's draw
 * (gmlp_num_random_uniform() hashes mix64 (seed) + i × φ). */
static guint64
seed_at (guint64 seed,
         guint64 offset)
{
  return unmix64 (gmlp_num_mix64 (seed) + offset * G_GUINT64_CONSTANT (0x9e3779b97f4a7c15));
}

/* @tensor's members as those of groups @first_group onwards of a uniform
 * tensor of the same members drawn from @seed. */
static gboolean
fill_random_from (GmlpGroupedTensor  *tensor,
                  guint64             seed,
                  guint               first_group,
                  double              bound,
                  GError            **error)
{
  guint64 row_bytes = (guint64) gmlp_grouped_tensor_get_cols (tensor) *
                      gmlp_dtype_get_size (gmlp_grouped_tensor_get_dtype (tensor));
  guint64 stride = gmlp_num_member_stride (gmlp_grouped_tensor_get_rows (tensor, 0), row_bytes);

  stride /= gmlp_dtype_get_size (gmlp_grouped_tensor_get_dtype (tensor));
  return gmlp_grouped_tensor_fill_random (tensor, seed_at (seed, first_group * stride), bound, error);
}

gboolean
gmlp_grouped_linear_init_parameters_from (GmlpGroupedLinear  *self,
                                          guint64             seed,
                                          guint               first_group,
                                          GError            **error)
{
  double bound;

  if (!gmlp_check_constructed (self, self->construct_error, error))
    return FALSE;

  bound = 1.0 / sqrt ((double) self->in_features);
  gmlp_grouped_linear_invalidate_fp8_weights (self);
  if (!fill_random_from (self->weight.grouped, seed, first_group, bound, error))
    return FALSE;
  if (self->bias.grouped != NULL &&
      !fill_random_from (self->bias.grouped, seed ^ G_GUINT64_CONSTANT (0x5bd1e995), first_group,
                         bound, error))
    return FALSE;
  return TRUE;
}

/* Uploads @bytes (all groups packed) into @target. */
static gboolean
set_from_bytes (GmlpGroupedLinear  *self,
                GmlpGroupedTensor  *target,
                GBytes             *bytes,
                const char         *what,
                GError            **error)
{
  g_autoptr(GmlpGroupedTensor) staged = NULL;
  gint64 rows = gmlp_grouped_tensor_get_rows (target, 0);
  gint64 cols = gmlp_grouped_tensor_get_cols (target);
  gsize expected = (gsize) self->n_groups * rows * cols * gmlp_dtype_get_size (self->dtype);

  if (g_bytes_get_size (bytes) != expected)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "%s needs %" G_GSIZE_FORMAT " bytes (%u × %" G_GINT64_FORMAT " × %"
                   G_GINT64_FORMAT " %s), not %" G_GSIZE_FORMAT, what, expected, self->n_groups,
                   rows, cols, gmlp_dtype_get_name (self->dtype), g_bytes_get_size (bytes));
      return FALSE;
    }

  /* Same layout, so one device copy moves it into place (stream-ordered). */
  staged = gmlp_grouped_tensor_new_from_bytes (self->device, self->dtype,
                                               gmlp_grouped_tensor_peek_rows (target),
                                               self->n_groups, cols, bytes, error);
  if (staged == NULL)
    return FALSE;
  gmlp_grouped_tensor_bump_version (target);
  return GMLP_DEVICE_CALL (self->device, copy, gmlp_grouped_tensor_get_data (target),
                           gmlp_grouped_tensor_get_data (staged),
                           gmlp_grouped_tensor_get_nbytes (target), error);
}

/**
 * gmlp_grouped_linear_set_weight_from_bytes:
 * @self: a #GmlpGroupedLinear
 * @bytes: `n_groups × out_features × in_features` values of the layer's
 *   dtype, group after group, row-major
 * @error: return location for a #GError
 *
 * Replaces the weights.
 *
 * Returns: %TRUE on success; %FALSE with %GMLP_ERROR_INVALID_ARGUMENT if the
 *   length of @bytes is wrong (the weights are then unchanged)
 *
 * Since: 0.1
 */
gboolean
gmlp_grouped_linear_set_weight_from_bytes (GmlpGroupedLinear  *self,
                                           GBytes             *bytes,
                                           GError            **error)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), FALSE);
  g_return_val_if_fail (bytes != NULL, FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_check_constructed (self, self->construct_error, error))
    return FALSE;

  if (!set_from_bytes (self, self->weight.grouped, bytes, "The weight", error))
    return FALSE;
  gmlp_grouped_linear_invalidate_fp8_weights (self);
  return TRUE;
}

/**
 * gmlp_grouped_linear_set_bias_from_bytes:
 * @self: a #GmlpGroupedLinear
 * @bytes: `n_groups × out_features` values of the layer's dtype
 * @error: return location for a #GError
 *
 * Replaces the biases.
 *
 * Returns: %TRUE on success; %FALSE with %GMLP_ERROR_INVALID_STATE if the
 *   layer has no bias, or %GMLP_ERROR_INVALID_ARGUMENT for a wrong length
 *
 * Since: 0.1
 */
gboolean
gmlp_grouped_linear_set_bias_from_bytes (GmlpGroupedLinear  *self,
                                         GBytes             *bytes,
                                         GError            **error)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), FALSE);
  g_return_val_if_fail (bytes != NULL, FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_check_constructed (self, self->construct_error, error))
    return FALSE;

  if (self->bias.grouped == NULL)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE, "This GroupedLinear has no bias");
      return FALSE;
    }
  return set_from_bytes (self, self->bias.grouped, bytes, "The bias", error);
}

/**
 * gmlp_grouped_linear_invalidate_fp8_weights:
 * @self: a #GmlpGroupedLinear
 *
 * Drops the cached quantized weights (see
 * [property@Gmlp.GroupedLinear:cache-fp8-weights]): the next FP8 forward
 * quantizes the weights again. Call it after changing the weights in place,
 * for example after each optimizer step. Backwards of earlier forwards
 * still use the weights their forward multiplied.
 *
 * Since: 0.1
 */
void
gmlp_grouped_linear_invalidate_fp8_weights (GmlpGroupedLinear *self)
{
  GmlpGroupedTensor *old;

  g_return_if_fail (GMLP_IS_GROUPED_LINEAR (self));

  gmlp_mutex_lock (&self->fp8_lock);
  old = g_steal_pointer (&self->weight_fp8);
  gmlp_mutex_unlock (&self->fp8_lock);
  g_clear_object (&old);
}

/* The grouped face of a parameter, in single-grouped-weight mode only. */
static GmlpGroupedTensor *
grouped_face (GmlpGroupedLinear *self,
              Param             *param,
              gboolean           valid)
{
  if (!has_flag (self, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT) || !valid)
    return NULL;
  return param->grouped;
}

/* The per-group face, in per-group mode only. */
static GmlpGroupedTensor *
member_face (GmlpGroupedLinear *self,
             Param             *param,
             guint              index,
             gboolean           valid)
{
  if (index >= self->n_groups || has_flag (self, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT) || !valid ||
      param->members == NULL)
    return NULL;
  return param->members[index];
}

/**
 * gmlp_grouped_linear_get_weight:
 * @self: a #GmlpGroupedLinear
 *
 * Gets the layer's single grouped weight tensor, to fill or to read.
 *
 * Returns: (transfer none) (nullable): the weights, `n_groups` members of
 *   `out_features × in_features`; %NULL with per-group weights
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_linear_get_weight (GmlpGroupedLinear *self)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), NULL);
  return grouped_face (self, &self->weight, TRUE);
}

/**
 * gmlp_grouped_linear_get_bias:
 * @self: a #GmlpGroupedLinear
 *
 * Gets the layer's single grouped bias tensor.
 *
 * Returns: (transfer none) (nullable): the biases, `n_groups` members of
 *   `1 × out_features`; %NULL without bias or with per-group weights
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_linear_get_bias (GmlpGroupedLinear *self)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), NULL);
  return grouped_face (self, &self->bias, self->bias.grouped != NULL);
}

/**
 * gmlp_grouped_linear_get_wgrad:
 * @self: a #GmlpGroupedLinear
 *
 * Gets the weight gradients that the last weight-gradient computation wrote.
 *
 * Returns: (transfer none) (nullable): the weight gradients of the last
 *   weight-gradient computation; %NULL before the first one, with fused
 *   accumulation, or with per-group weights
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_linear_get_wgrad (GmlpGroupedLinear *self)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), NULL);
  return grouped_face (self, &self->wgrad, self->wgrad_valid);
}

/**
 * gmlp_grouped_linear_get_bgrad:
 * @self: a #GmlpGroupedLinear
 *
 * Gets the bias gradients that the last weight-gradient computation wrote.
 *
 * Returns: (transfer none) (nullable): the bias gradients of the last
 *   weight-gradient computation; %NULL without bias, before the first one,
 *   or with per-group weights
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_linear_get_bgrad (GmlpGroupedLinear *self)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), NULL);
  return grouped_face (self, &self->bgrad, self->bgrad.grouped != NULL &&
                       (self->wgrad_valid || self->grad_added_to_main_grad));
}

/**
 * gmlp_grouped_linear_get_main_grad:
 * @self: a #GmlpGroupedLinear
 *
 * Gets the FP32 tensor that weight gradients are accumulated into with
 * %GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION.
 *
 * Returns: (transfer none) (nullable): the FP32 gradient accumulators;
 *   %NULL without fused accumulation or with per-group weights
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_linear_get_main_grad (GmlpGroupedLinear *self)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), NULL);
  return grouped_face (self, &self->main_grad, self->main_grad.grouped != NULL);
}

/**
 * gmlp_grouped_linear_get_weight_member:
 * @self: a #GmlpGroupedLinear
 * @index: the group
 *
 * Gets the weight of one group of a layer made with per-group weights.
 *
 * Returns: (transfer none) (nullable): the weight of group @index, a view
 *   of `out_features × in_features`; %NULL with a single grouped weight
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_linear_get_weight_member (GmlpGroupedLinear *self,
                                       guint              index)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), NULL);
  return member_face (self, &self->weight, index, TRUE);
}

/**
 * gmlp_grouped_linear_get_bias_member:
 * @self: a #GmlpGroupedLinear
 * @index: the group
 *
 * Gets the bias of one group of a layer made with per-group weights.
 *
 * Returns: (transfer none) (nullable): the bias of group @index; %NULL
 *   without bias or with a single grouped weight
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_linear_get_bias_member (GmlpGroupedLinear *self,
                                     guint              index)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), NULL);
  return member_face (self, &self->bias, index, TRUE);
}

/**
 * gmlp_grouped_linear_get_wgrad_member:
 * @self: a #GmlpGroupedLinear
 * @index: the group
 *
 * Gets the weight gradient of one group of a layer made with per-group
 * weights.
 *
 * Returns: (transfer none) (nullable): the weight gradient of group @index
 *   from the last weight-gradient computation, a view into one packed
 *   allocation; %NULL before the first one, with fused accumulation, or
 *   with a single grouped weight
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_linear_get_wgrad_member (GmlpGroupedLinear *self,
                                      guint              index)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), NULL);
  return member_face (self, &self->wgrad, index, self->wgrad_valid);
}

/**
 * gmlp_grouped_linear_get_bgrad_member:
 * @self: a #GmlpGroupedLinear
 * @index: the group
 *
 * Gets the bias gradient of one group of a layer made with per-group weights.
 *
 * Returns: (transfer none) (nullable): the bias gradient of group @index;
 *   %NULL without bias, before the first weight-gradient computation, or
 *   with a single grouped weight
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_linear_get_bgrad_member (GmlpGroupedLinear *self,
                                      guint              index)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), NULL);
  return member_face (self, &self->bgrad, index,
                      self->wgrad_valid || self->grad_added_to_main_grad);
}

/**
 * gmlp_grouped_linear_get_main_grad_member:
 * @self: a #GmlpGroupedLinear
 * @index: the group
 *
 * Gets the FP32 gradient accumulator of one group of a layer made with
 * per-group weights.
 *
 * Returns: (transfer none) (nullable): the FP32 gradient accumulator of group
 *   @index (the layer's, or the one bound with
 *   [method@Gmlp.GroupedLinear.set_main_grad_member]); %NULL without fused
 *   accumulation or with a single grouped weight
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_linear_get_main_grad_member (GmlpGroupedLinear *self,
                                          guint              index)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), NULL);
  return member_face (self, &self->main_grad, index, TRUE);
}
