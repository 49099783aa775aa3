/* gmlp-routing.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-routing-private.h"
#include "gmlp-error.h"
#include "gmlp-grouped-tensor-private.h"
#include "gmlp-saved-activations-private.h"

/**
 * GmlpRouting:
 *
 * Where each token of a Mixture-of-Experts layer goes: for each of its
 * `T` tokens, the `k` experts it chose ([method@Gmlp.Routing.get_indices],
 * INT64) and their weights ([method@Gmlp.Routing.get_probs], FP32), both
 * `T × k` one-group tensors on the device, token-major, and how many tokens
 * chose each expert ([method@Gmlp.Routing.get_tokens_per_expert]), counted
 * on the device, so that nothing on the host needs to know the routing.
 * A [class@Gmlp.Router]'s forward makes one, with its auxiliary losses;
 * [ctor@Gmlp.Routing.new] makes one from indices and probabilities computed
 * elsewhere.
 *
 * A routing moves the tokens to its experts and back:
 * [method@Gmlp.Routing.permute] gathers one row per token and chosen
 * expert into a [class@Gmlp.GroupedTensor] of `n_experts` groups, expert
 * by expert, whose group sizes are only on the device (so that a
 * [class@Gmlp.GroupedLinear] takes it as it is and nothing waits for the
 * device); [method@Gmlp.Routing.combine] sums each token's expert outputs
 * weighted by its probabilities; [method@Gmlp.Routing.permute_backward] and
 * [method@Gmlp.Routing.combine_backward] are their gradients.
 * [method@Gmlp.Routing.permute_full] pads every expert's rows and can drop
 * choices past a capacity. The order is stable: expert by expert, and
 * within an expert token by token, a token's choices in order, so results
 * are deterministic.
 *
 * The first permute fixes the routing's permuted layout (which choice goes
 * to which row, the padding and the capacity); later permutes of other
 * tensors with the same padding and capacity factor reuse it, and one with
 * others is refused: a routing has one layout, which combine and the
 * backwards read. An expert layer needs no second one, and one layout per
 * routing lets these calls take the routing alone, with no map to pass
 * around.
 *
 * A routing reads its indices and probabilities where they are: writing
 * into them afterwards (or into its permuted layout's group sizes) makes
 * every later permute, combine and backward fail with
 * %GMLP_ERROR_INVALID_STATE rather than use a routing that changed.
 *
 * Any number of threads may use a routing at once: the layout is made
 * once, under a lock, by the first permute.
 *
 * ## Examples
 *
 * In Python (PyGObject):
 *
 * ```python
 * import gi
 * gi.require_version('Gmlp', '1.0')
 * from gi.repository import GLib, Gmlp
 *
 * import array
 *
 * dev = Gmlp.Device.new_from_string('cpu')
 * def upload(values, code, dtype, cols):
 *     data = array.array(code, values)
 *     return Gmlp.GroupedTensor.new_from_bytes(dev, dtype, [len(data) // cols], cols,
 *                                             GLib.Bytes.new(data.tobytes()))
 * # 3 tokens, each sent to 2 of 4 experts with these weights.
 * indices = upload([0, 2, 1, 2, 3, 0], 'q', Gmlp.DType.INT64, 2)
 * probs = upload([0.5, 0.5, 0.7, 0.3, 0.9, 0.1], 'f', Gmlp.DType.FLOAT32, 2)
 * routing = Gmlp.Routing.new(dev, indices, probs, 4)
 * x = Gmlp.GroupedTensor.new(dev, Gmlp.DType.FLOAT32, [3], 8)
 * x.fill_random(1, 1.0)
 * rows = routing.permute(x)          # one row per choice, grouped by expert
 * out = routing.combine(rows)        # the weighted sum back per token
 * ```
 *
 * In JavaScript (gjs; run with `gjs -m`):
 *
 * ```js
 * import GLib from 'gi://GLib';
 * import Gmlp from 'gi://Gmlp?version=1.0';
 *
 * const dev = Gmlp.Device.new_from_string('cpu');
 * const upload = (typed, dtype, cols) => Gmlp.GroupedTensor.new_from_bytes(dev, dtype,
 *     [typed.length / cols], cols, new GLib.Bytes(new Uint8Array(typed.buffer)));
 * // 3 tokens, each sent to 2 of 4 experts with these weights.
 * const indices = upload(BigInt64Array.from([0n, 2n, 1n, 2n, 3n, 0n]), Gmlp.DType.INT64, 2);
 * const probs = upload(Float32Array.from([0.5, 0.5, 0.7, 0.3, 0.9, 0.1]), Gmlp.DType.FLOAT32, 2);
 * const routing = Gmlp.Routing.new(dev, indices, probs, 4);
 * const x = Gmlp.GroupedTensor.new(dev, Gmlp.DType.FLOAT32, [3], 8);
 * x.fill_random(1, 1.0);
 * const rows = routing.permute(x);       // one row per choice, grouped by expert
 * const out = routing.combine(rows);     // the weighted sum back per token
 * ```
 *
 * Since: 0.1
 */

G_DEFINE_FINAL_TYPE (GmlpRouting, gmlp_routing, G_TYPE_OBJECT)

static void
gmlp_routing_finalize (GObject *object)
{
  GmlpRouting *self = (GmlpRouting *) object;

  g_clear_object (&self->indices);
  g_clear_object (&self->probs);
  g_clear_object (&self->tokens_per_expert);
  g_clear_object (&self->aux_loss);
  g_clear_object (&self->z_loss);
  g_clear_object (&self->sizes);
  g_clear_object (&self->row_of);
  g_clear_object (&self->choice_of);
  g_clear_pointer (&self->versions, g_array_unref);
  g_mutex_clear (&self->permute_lock);
  g_clear_object (&self->device);

  G_OBJECT_CLASS (gmlp_routing_parent_class)->finalize (object);
}

static void
gmlp_routing_class_init (GmlpRoutingClass *klass)
{
  G_OBJECT_CLASS (klass)->finalize = gmlp_routing_finalize;
}

static void
gmlp_routing_init (GmlpRouting *self)
{
  g_mutex_init (&self->permute_lock);
  self->versions = gmlp_version_records_new ();
  self->padding = 1;
  self->expert_capacity = -1;
}

GmlpRouting *
gmlp_routing_new_for_router (GmlpDevice        *device,
                             guint              n_experts,
                             GmlpGroupedTensor *indices,
                             GmlpGroupedTensor *probs,
                             GmlpGroupedTensor *tokens_per_expert,
                             GmlpGroupedTensor *aux_loss,
                             GmlpGroupedTensor *z_loss)
{
  GmlpRouting *self = g_object_new (GMLP_TYPE_ROUTING, NULL);

  self->device = g_object_ref (device);
  self->n_experts = n_experts;
  self->n_tokens = gmlp_grouped_tensor_get_total_rows (indices);
  self->top_k = (guint) gmlp_grouped_tensor_get_cols (indices);
  self->indices = g_object_ref (indices);
  self->probs = g_object_ref (probs);
  self->tokens_per_expert = g_object_ref (tokens_per_expert);
  self->aux_loss = g_object_ref (aux_loss);
  self->z_loss = g_object_ref (z_loss);
  gmlp_version_records_add (self->versions, "indices", "routing", indices);
  gmlp_version_records_add (self->versions, "probabilities", "routing", probs);
  return self;
}

gboolean
gmlp_routing_check_usable (GmlpRouting  *self,
                           GError      **error)
{
  if (self->indices != NULL)
    return TRUE;
  g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE,
               "This routing routes nothing: it was made with g_object_new(); "
               "make one with gmlp_routing_new() or a router's forward");
  return FALSE;
}

gboolean
gmlp_routing_check_backend (GmlpDevice  *device,
                            GError     **error)
{
  const GmlpBackend *backend = gmlp_device_get_backend (device);

  if (backend->routing_count != NULL && backend->routing_map != NULL && backend->permute != NULL)
    return TRUE;
  g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
               "Token routing and permutation are not yet on this backend (%s)",
               gmlp_device_get_name (device));
  return FALSE;
}

gboolean
gmlp_routing_check_tensor (GmlpDevice         *device,
                           GmlpGroupedTensor  *tensor,
                           const char         *what,
                           int                 dtype,
                           gint64              cols,
                           GError            **error)
{
  GmlpDType got;

  if (!gmlp_grouped_tensor_check_usable (tensor, error))
    return FALSE;
  if (gmlp_grouped_tensor_get_device (tensor) != device)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT, "%s is on %s, the routing on %s",
                   what, gmlp_device_get_name (gmlp_grouped_tensor_get_device (tensor)),
                   gmlp_device_get_name (device));
      return FALSE;
    }
  got = gmlp_grouped_tensor_get_dtype (tensor);
  if (dtype >= 0 ? got != (GmlpDType) dtype : !gmlp_dtype_is_floating (got) || gmlp_dtype_is_fp8 (got))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_DTYPE_MISMATCH, "%s is %s; it must be %s", what,
                   gmlp_dtype_get_name (got),
                   dtype >= 0 ? gmlp_dtype_get_name (dtype) : "float32, float16 or bfloat16");
      return FALSE;
    }
  if (cols >= 0 && gmlp_grouped_tensor_get_cols (tensor) != cols)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
                   "%s has %" G_GINT64_FORMAT " columns, not %" G_GINT64_FORMAT,
                   what, gmlp_grouped_tensor_get_cols (tensor), cols);
      return FALSE;
    }
  return TRUE;
}

gboolean
gmlp_routing_check_tokens (GmlpDevice         *device,
                           GmlpGroupedTensor  *tensor,
                           const char         *what,
                           int                 dtype,
                           gint64              rows,
                           gint64              cols,
                           GError            **error)
{
  if (!gmlp_routing_check_tensor (device, tensor, what, dtype, cols, error))
    return FALSE;
  if (gmlp_grouped_tensor_get_n_groups (tensor) != 1 || !gmlp_grouped_tensor_has_host_sizes (tensor))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
                   "%s must be one group whose size is on the host, token by token", what);
      return FALSE;
    }
  if (rows >= 0 && gmlp_grouped_tensor_get_total_rows (tensor) != rows)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
                   "%s has %" G_GINT64_FORMAT " rows; the routing has %" G_GINT64_FORMAT " tokens",
                   what, gmlp_grouped_tensor_get_total_rows (tensor), rows);
      return FALSE;
    }
  return TRUE;
}

/**
 * gmlp_routing_new:
 * @device: the device of @indices and @probs
 * @indices: the experts each token chose: `T × k` INT64 values, one group,
 *   token-major, `k` from 1 to 16
 * @probs: the weight of each choice: `T × k` FP32 values, one group
 * @n_experts: the number of experts, 1 to 65535
 * @error: return location for a #GError
 *
 * Makes a routing from indices and probabilities computed elsewhere (by
 * your own router, or a fixed routing for a test), and counts the tokens
 * per expert ([method@Gmlp.Routing.get_tokens_per_expert]) on the device,
 * without waiting for it. The routing references @indices and @probs (no
 * copy): do not write into them while it is in use; if you do, its later
 * calls fail with %GMLP_ERROR_INVALID_STATE.
 *
 * An index outside `[0, n_experts)`, negative ones included, is a choice
 * that goes nowhere: counted for no expert, given no row by a permute, and
 * adding zero to combine and to the gradients, as a dropped choice does.
 * Such a routing has no auxiliary losses: they are `1 × 1` zeros. `T` may
 * be 0 (every result is then empty).
 *
 * Returns: (transfer full): a new routing, or %NULL with
 *   %GMLP_ERROR_DTYPE_MISMATCH, %GMLP_ERROR_SHAPE_MISMATCH or
 *   %GMLP_ERROR_INVALID_ARGUMENT for bad arguments, or
 *   %GMLP_ERROR_UNSUPPORTED on a device whose backend has no token
 *   permutation; nothing is enqueued then
 *
 * Since: 0.1
 */
GmlpRouting *
gmlp_routing_new (GmlpDevice         *device,
                  GmlpGroupedTensor  *indices,
                  GmlpGroupedTensor  *probs,
                  guint               n_experts,
                  GError            **error)
{
  g_autoptr(GmlpGroupedTensor) counts = NULL, aux_loss = NULL, z_loss = NULL;
  gint64 n_tokens, top_k, n = n_experts;

  g_return_val_if_fail (GMLP_IS_DEVICE (device), NULL);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (indices), NULL);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (probs), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!gmlp_device_check_usable (device, error) ||
      !gmlp_routing_check_tokens (device, indices, "The indices", GMLP_DTYPE_INT64, -1, -1, error))
    return NULL;
  n_tokens = gmlp_grouped_tensor_get_total_rows (indices);
  top_k = gmlp_grouped_tensor_get_cols (indices);
  if (top_k < 1 || top_k > GMLP_BACKEND_MAX_TOP_K)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "A token chooses 1 to %d experts, not %" G_GINT64_FORMAT,
                   GMLP_BACKEND_MAX_TOP_K, top_k);
      return NULL;
    }
  if (n_experts < 1 || n_experts > GMLP_MAX_GROUPS)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "A routing has 1 to %d experts, not %u", GMLP_MAX_GROUPS, n_experts);
      return NULL;
    }
  if (!gmlp_routing_check_tokens (device, probs, "The probabilities", GMLP_DTYPE_FLOAT32,
                                  n_tokens, top_k, error) ||
      !gmlp_routing_check_backend (device, error))
    return NULL;

  counts = gmlp_grouped_tensor_new (device, GMLP_DTYPE_INT64, &n, 1, 1, error);
  if (counts == NULL)
    return NULL;
  aux_loss = gmlp_grouped_tensor_new_uniform (device, GMLP_DTYPE_FLOAT32, 1, 1, 1, error);
  if (aux_loss == NULL)
    return NULL;
  z_loss = gmlp_grouped_tensor_new_uniform (device, GMLP_DTYPE_FLOAT32, 1, 1, 1, error);
  if (z_loss == NULL ||
      !gmlp_grouped_tensor_fill_zero (aux_loss, error) ||
      !gmlp_grouped_tensor_fill_zero (z_loss, error) ||
      !GMLP_DEVICE_CALL (device, routing_count, gmlp_grouped_tensor_get_data (indices),
                         n_tokens * top_k, n_experts, gmlp_grouped_tensor_get_data (counts), error))
    return NULL;

  return gmlp_routing_new_for_router (device, n_experts, indices, probs, counts, aux_loss, z_loss);
}

/**
 * gmlp_routing_get_device:
 * @self: a #GmlpRouting
 *
 * Gets the device whose memory holds the routing's tensors.
 *
 * Returns: (transfer none) (nullable): the device of the routing's tensors;
 *   %NULL for a routing made with g_object_new(), which routes nothing
 *
 * Since: 0.1
 */
GmlpDevice *
gmlp_routing_get_device (GmlpRouting *self)
{
  g_return_val_if_fail (GMLP_IS_ROUTING (self), NULL);
  return self->device;
}

/**
 * gmlp_routing_get_n_tokens:
 * @self: a #GmlpRouting
 *
 * Gets the number of tokens that were routed.
 *
 * Returns: the number of tokens routed, `T`
 *
 * Since: 0.1
 */
gint64
gmlp_routing_get_n_tokens (GmlpRouting *self)
{
  g_return_val_if_fail (GMLP_IS_ROUTING (self), 0);
  return self->n_tokens;
}

/**
 * gmlp_routing_get_top_k:
 * @self: a #GmlpRouting
 *
 * Gets the number of experts each token was sent to.
 *
 * Returns: the number of experts each token chose, `k`
 *
 * Since: 0.1
 */
guint
gmlp_routing_get_top_k (GmlpRouting *self)
{
  g_return_val_if_fail (GMLP_IS_ROUTING (self), 0);
  return self->top_k;
}

/**
 * gmlp_routing_get_n_experts:
 * @self: a #GmlpRouting
 *
 * Gets the number of experts of the router that made the routing.
 *
 * Returns: the number of experts the tokens chose among
 *
 * Since: 0.1
 */
guint
gmlp_routing_get_n_experts (GmlpRouting *self)
{
  g_return_val_if_fail (GMLP_IS_ROUTING (self), 0);
  return self->n_experts;
}

/**
 * gmlp_routing_get_indices:
 * @self: a #GmlpRouting
 *
 * Gets the experts that each token was sent to.
 *
 * Returns: (transfer none) (nullable): the experts each token chose, `T × k`
 *   INT64 values, in the order of the choices
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_routing_get_indices (GmlpRouting *self)
{
  g_return_val_if_fail (GMLP_IS_ROUTING (self), NULL);
  return self->indices;
}

/**
 * gmlp_routing_get_probs:
 * @self: a #GmlpRouting
 *
 * Gets the weights with which each token's chosen experts are combined.
 *
 * Returns: (transfer none) (nullable): the weight of each choice in the
 *   combined output, `T × k` FP32 values
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_routing_get_probs (GmlpRouting *self)
{
  g_return_val_if_fail (GMLP_IS_ROUTING (self), NULL);
  return self->probs;
}

/**
 * gmlp_routing_get_tokens_per_expert:
 * @self: a #GmlpRouting
 *
 * Gets how many tokens chose each expert, counted on the device: one member
 * of `n_experts` INT64 values, before any drop or padding. Reading it on the
 * host ([method@Gmlp.GroupedTensor.to_bytes]) waits for the device.
 *
 * Returns: (transfer none) (nullable): the counts
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_routing_get_tokens_per_expert (GmlpRouting *self)
{
  g_return_val_if_fail (GMLP_IS_ROUTING (self), NULL);
  return self->tokens_per_expert;
}

/**
 * gmlp_routing_get_aux_loss:
 * @self: a #GmlpRouting
 *
 * Gets the load-balancing loss of the router's forward (its coefficient
 * included), a `1 × 1` FP32 device tensor, 0 when the router has none.
 * Reading it on the host waits for the device.
 *
 * Returns: (transfer none) (nullable): the loss
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_routing_get_aux_loss (GmlpRouting *self)
{
  g_return_val_if_fail (GMLP_IS_ROUTING (self), NULL);
  return self->aux_loss;
}

/**
 * gmlp_routing_get_z_loss:
 * @self: a #GmlpRouting
 *
 * Gets the z-loss of the router's forward (its coefficient included), a
 * `1 × 1` FP32 device tensor, 0 when the router has none.
 *
 * Returns: (transfer none) (nullable): the loss
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_routing_get_z_loss (GmlpRouting *self)
{
  g_return_val_if_fail (GMLP_IS_ROUTING (self), NULL);
  return self->z_loss;
}
