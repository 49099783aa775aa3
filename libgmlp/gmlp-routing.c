/* gmlp-routing.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-routing-private.h"
#include "gmlp-grouped-tensor-private.h"

/**
 * GmlpRouting:
 *
 * Where each token of a Mixture-of-Experts layer goes: for each of its
 * `T` tokens, the `k` experts it chose ([method@Gmlp.Routing.get_indices],
 * INT64) and their weights ([method@Gmlp.Routing.get_probs], FP32), both
 * `T × k` one-group tensors on the device, token-major, and how many tokens
 * chose each expert ([method@Gmlp.Routing.get_tokens_per_expert]), counted
 * on the device, so that nothing on the host needs to know the routing.
 * A [class@Gmlp.Router]'s forward makes one, with its auxiliary losses.
 *
 * A routing does not change once made: any number of threads may read it
 * at once.
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
  return self;
}

/**
 * gmlp_routing_get_device:
 * @self: a #GmlpRouting
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
