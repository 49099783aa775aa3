/* gmlp-moe-layer-accessors.c: what a GmlpMoELayer tells of itself
 *
 * Its parts, its shape, its expert parallelism and what its last forward
 * left (the routing, the losses, the counts).
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-moe-layer-impl.h"
#include "gmlp-thread-private.h"

/**
 * gmlp_moe_layer_get_router:
 * @self: a #GmlpMoELayer
 *
 * Gets the layer's gate, to fill its weight or read its gradient.
 *
 * Returns: (transfer none) (nullable): the router; %NULL when the layer
 *   could not be constructed
 *
 * Since: 0.1
 */
GmlpRouter *
gmlp_moe_layer_get_router (GmlpMoELayer *self)
{
  g_return_val_if_fail (GMLP_IS_MOE_LAYER (self), NULL);
  return self->router;
}

/**
 * gmlp_moe_layer_get_experts:
 * @self: a #GmlpMoELayer
 *
 * Gets the layer's routed experts, to fill their weights or read their
 * gradients.
 *
 * Returns: (transfer none) (nullable): the experts, a [class@Gmlp.GroupedMLP]
 *   of `n_experts` groups, or with a [property@Gmlp.MoELayer:communicator]
 *   of this rank's experts only (group `i` is expert
 *   [method@Gmlp.MoELayer.get_first_local_expert] + `i`); %NULL when the
 *   layer could not be constructed
 *
 * Since: 0.1
 */
GmlpGroupedMLP *
gmlp_moe_layer_get_experts (GmlpMoELayer *self)
{
  g_return_val_if_fail (GMLP_IS_MOE_LAYER (self), NULL);
  return self->experts;
}

/**
 * gmlp_moe_layer_get_shared_expert:
 * @self: a #GmlpMoELayer
 *
 * Gets the expert that every token goes through beside the routed ones.
 *
 * Returns: (transfer none) (nullable): the shared expert, a one-group
 *   [class@Gmlp.GroupedMLP]; %NULL without one
 *
 * Since: 0.1
 */
GmlpGroupedMLP *
gmlp_moe_layer_get_shared_expert (GmlpMoELayer *self)
{
  g_return_val_if_fail (GMLP_IS_MOE_LAYER (self), NULL);
  return self->shared;
}

/**
 * gmlp_moe_layer_get_routing:
 * @self: a #GmlpMoELayer
 *
 * Gets the routing decided by the last forward: which experts each token went
 * to, with what weight.
 *
 * Returns: (transfer full) (nullable): the routing of the last forward, or
 *   %NULL before the first
 *
 * Since: 0.1
 */
GmlpRouting *
gmlp_moe_layer_get_routing (GmlpMoELayer *self)
{
  GmlpRouting *routing;

  g_return_val_if_fail (GMLP_IS_MOE_LAYER (self), NULL);

  gmlp_mutex_lock (&self->last_lock);
  routing = self->last != NULL ? g_object_ref (self->last) : NULL;
  gmlp_mutex_unlock (&self->last_lock);
  return routing;
}

/**
 * gmlp_moe_layer_get_aux_loss:
 * @self: a #GmlpMoELayer
 *
 * Gets the load-balancing loss of the last forward (see
 * [method@Gmlp.Routing.get_aux_loss]), a `1 × 1` FP32 device tensor.
 *
 * Returns: (transfer full) (nullable): the loss, or %NULL before the first
 *   forward
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_moe_layer_get_aux_loss (GmlpMoELayer *self)
{
  g_autoptr(GmlpRouting) routing = NULL;

  g_return_val_if_fail (GMLP_IS_MOE_LAYER (self), NULL);

  routing = gmlp_moe_layer_get_routing (self);
  return routing != NULL ? g_object_ref (gmlp_routing_get_aux_loss (routing)) : NULL;
}

/**
 * gmlp_moe_layer_get_tokens_per_expert:
 * @self: a #GmlpMoELayer
 *
 * Gets how many tokens chose each expert in the last forward, counted on
 * the device (see [method@Gmlp.Routing.get_tokens_per_expert]).
 *
 * Returns: (transfer full) (nullable): the counts, or %NULL before the
 *   first forward
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_moe_layer_get_tokens_per_expert (GmlpMoELayer *self)
{
  g_autoptr(GmlpRouting) routing = NULL;

  g_return_val_if_fail (GMLP_IS_MOE_LAYER (self), NULL);

  routing = gmlp_moe_layer_get_routing (self);
  return routing != NULL ? g_object_ref (gmlp_routing_get_tokens_per_expert (routing)) : NULL;
}

/**
 * gmlp_moe_layer_get_device:
 * @self: a #GmlpMoELayer
 *
 * Gets the device the layer's weights live on and its work runs on.
 *
 * Returns: (transfer none): the layer's device
 *
 * Since: 0.1
 */
GmlpDevice *
gmlp_moe_layer_get_device (GmlpMoELayer *self)
{
  g_return_val_if_fail (GMLP_IS_MOE_LAYER (self), NULL);
  return self->device;
}

/**
 * gmlp_moe_layer_get_hidden:
 * @self: a #GmlpMoELayer
 *
 * Gets the width of a token.
 *
 * Returns: the model width
 *
 * Since: 0.1
 */
gint64
gmlp_moe_layer_get_hidden (GmlpMoELayer *self)
{
  g_return_val_if_fail (GMLP_IS_MOE_LAYER (self), 0);
  return self->hidden;
}

/**
 * gmlp_moe_layer_get_ffn_hidden:
 * @self: a #GmlpMoELayer
 *
 * Gets the hidden width of each expert.
 *
 * Returns: the experts' width between their layers
 *
 * Since: 0.1
 */
gint64
gmlp_moe_layer_get_ffn_hidden (GmlpMoELayer *self)
{
  g_return_val_if_fail (GMLP_IS_MOE_LAYER (self), 0);
  return self->ffn_hidden;
}

/**
 * gmlp_moe_layer_get_n_experts:
 * @self: a #GmlpMoELayer
 *
 * Gets the number of routed experts.
 *
 * Returns: the number of experts
 *
 * Since: 0.1
 */
guint
gmlp_moe_layer_get_n_experts (GmlpMoELayer *self)
{
  g_return_val_if_fail (GMLP_IS_MOE_LAYER (self), 0);
  return self->n_experts;
}

/**
 * gmlp_moe_layer_get_top_k:
 * @self: a #GmlpMoELayer
 *
 * Gets the number of experts each token is sent to.
 *
 * Returns: how many experts each token goes to
 *
 * Since: 0.1
 */
guint
gmlp_moe_layer_get_top_k (GmlpMoELayer *self)
{
  g_return_val_if_fail (GMLP_IS_MOE_LAYER (self), 0);
  return self->top_k;
}

/**
 * gmlp_moe_layer_get_communicator:
 * @self: a #GmlpMoELayer
 *
 * Gets the communicator whose ranks share the experts.
 *
 * Returns: (transfer none) (nullable): the value of
 *   [property@Gmlp.MoELayer:communicator]; %NULL on one device
 *
 * Since: 0.1
 */
GmlpCommunicator *
gmlp_moe_layer_get_communicator (GmlpMoELayer *self)
{
  g_return_val_if_fail (GMLP_IS_MOE_LAYER (self), NULL);
  return self->communicator;
}

/**
 * gmlp_moe_layer_get_expert_parallel_mode:
 * @self: a #GmlpMoELayer
 *
 * Gets how an expert-parallel layer moves the rows.
 *
 * Returns: the value of [property@Gmlp.MoELayer:expert-parallel-mode]
 *
 * Since: 0.1
 */
GmlpExpertParallelMode
gmlp_moe_layer_get_expert_parallel_mode (GmlpMoELayer *self)
{
  g_return_val_if_fail (GMLP_IS_MOE_LAYER (self), GMLP_EXPERT_PARALLEL_MODE_EXACT);
  return self->parallel_mode;
}

/**
 * gmlp_moe_layer_get_dispatch_fp8_recipe:
 * @self: a #GmlpMoELayer
 *
 * Gets how an expert-parallel layer's forward dispatch quantizes the rows
 * it sends.
 *
 * Returns: the value of [property@Gmlp.MoELayer:dispatch-fp8-recipe]
 *
 * Since: 0.1
 */
GmlpScalingRecipe
gmlp_moe_layer_get_dispatch_fp8_recipe (GmlpMoELayer *self)
{
  g_return_val_if_fail (GMLP_IS_MOE_LAYER (self), GMLP_SCALING_RECIPE_NONE);
  return self->dispatch_fp8_recipe;
}

/**
 * gmlp_moe_layer_get_dispatch_fp8_format:
 * @self: a #GmlpMoELayer
 *
 * Gets the FP8 type of the rows an FP8 dispatch sends.
 *
 * Returns: the value of [property@Gmlp.MoELayer:dispatch-fp8-format]
 *
 * Since: 0.1
 */
GmlpFp8Format
gmlp_moe_layer_get_dispatch_fp8_format (GmlpMoELayer *self)
{
  g_return_val_if_fail (GMLP_IS_MOE_LAYER (self), GMLP_FP8_FORMAT_E4M3);
  return self->dispatch_fp8_format;
}

/**
 * gmlp_moe_layer_get_expert_parallel_chunks:
 * @self: a #GmlpMoELayer
 *
 * Gets how many chunks of its local experts an expert-parallel forward
 * and backward pipeline.
 *
 * Returns: the value of [property@Gmlp.MoELayer:expert-parallel-chunks]
 *
 * Since: 0.1
 */
guint
gmlp_moe_layer_get_expert_parallel_chunks (GmlpMoELayer *self)
{
  g_return_val_if_fail (GMLP_IS_MOE_LAYER (self), 1);
  return self->parallel_chunks;
}

/**
 * gmlp_moe_layer_get_first_local_expert:
 * @self: a #GmlpMoELayer
 *
 * Gets the index, among all the layer's experts, of the first expert this
 * rank holds: group `i` of [method@Gmlp.MoELayer.get_experts] is expert
 * `first + i`.
 *
 * Returns: `rank × n_experts / world_size`; 0 on one device
 *
 * Since: 0.1
 */
guint
gmlp_moe_layer_get_first_local_expert (GmlpMoELayer *self)
{
  g_return_val_if_fail (GMLP_IS_MOE_LAYER (self), 0);
  return self->first_expert;
}

/**
 * gmlp_moe_layer_get_n_local_experts:
 * @self: a #GmlpMoELayer
 *
 * Gets how many experts this rank holds: the groups of
 * [method@Gmlp.MoELayer.get_experts].
 *
 * Returns: `n_experts / world_size`; `n_experts` on one device
 *
 * Since: 0.1
 */
guint
gmlp_moe_layer_get_n_local_experts (GmlpMoELayer *self)
{
  g_return_val_if_fail (GMLP_IS_MOE_LAYER (self), 0);
  return self->n_local_experts;
}

/**
 * gmlp_moe_layer_get_dropped_rows:
 * @self: a #GmlpMoELayer
 *
 * Gets how many rows the last forward's dispatch dropped because they did
 * not fit in their slot, counted on the device (graph-safe mode; see
 * [property@Gmlp.MoELayer:expert-capacity-factor]): a `1 × 1` INT64 device
 * tensor, summed over this rank's chunks (its rows to every rank's
 * experts). With [property@Gmlp.MoELayer:padding] an expert's rows are
 * counted padded, as they travel. The drops of
 * [property@Gmlp.MoELayer:capacity-factor] are not in it (they happen
 * before, in the permute, on every layer).
 *
 * Returns: (transfer full) (nullable): the count, or %NULL before the first
 *   forward, on one device and in exact mode (which drops nothing)
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_moe_layer_get_dropped_rows (GmlpMoELayer *self)
{
  GmlpGroupedTensor *dropped;

  g_return_val_if_fail (GMLP_IS_MOE_LAYER (self), NULL);

  gmlp_mutex_lock (&self->last_lock);
  dropped = self->last_dropped != NULL ? g_object_ref (self->last_dropped) : NULL;
  gmlp_mutex_unlock (&self->last_lock);
  return dropped;
}
