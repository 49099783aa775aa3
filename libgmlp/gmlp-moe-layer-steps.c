/* gmlp-moe-layer-steps.c: what a GmlpMoELayer computes
 *
 * Forward, backward and backward_dw across the layer's parts: the router,
 * the permutation, the routed experts (on this device, or spread over the
 * ranks of a communicator: gmlp-moe-expert-parallel.c), the combine and
 * the shared expert. A backward checks every part before any part writes.
 * The object itself is gmlp-moe-layer.c (gmlp-moe-layer-impl.h).
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-moe-layer-impl.h"
#include "gmlp-moe-expert-parallel-private.h"
#include "gmlp-error.h"
#include "gmlp-error-private.h"
#include "gmlp-grouped-mlp-private.h"
#include "gmlp-grouped-tensor-private.h"
#include "gmlp-router-private.h"
#include "gmlp-routing-private.h"
#include "gmlp-saved-activations-private.h"
#include "gmlp-thread-private.h"

static gboolean
check_tokens (GmlpMoELayer       *self,
              GmlpGroupedTensor  *tokens,
              const char         *what,
              GError            **error)
{
  if (gmlp_grouped_tensor_get_device (tokens) != self->device)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "%s is on %s, the MoE layer on %s", what,
                   gmlp_device_get_name (gmlp_grouped_tensor_get_device (tokens)),
                   gmlp_device_get_name (self->device));
      return FALSE;
    }
  if (gmlp_grouped_tensor_get_dtype (tokens) != self->dtype)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_DTYPE_MISMATCH, "%s is %s, the MoE layer %s",
                   what, gmlp_dtype_get_name (gmlp_grouped_tensor_get_dtype (tokens)),
                   gmlp_dtype_get_name (self->dtype));
      return FALSE;
    }
  if (gmlp_grouped_tensor_get_n_groups (tokens) != 1 ||
      !gmlp_grouped_tensor_has_host_sizes (tokens) ||
      gmlp_grouped_tensor_get_cols (tokens) != self->hidden)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
                   "%s must be one group of tokens × %" G_GINT64_FORMAT " with its size on the "
                   "host", what, self->hidden);
      return FALSE;
    }
  return TRUE;
}

/* The shared expert's forward or backward, which an expert-parallel step
 * enqueues while its dispatch is in flight (GmlpMoEParallelOverlap): the
 * same work as after the experts, sooner. */
typedef struct {
  GmlpMoELayer          *layer;
  GmlpGroupedTensor     *input;     /* the tokens, or the output's gradient */
  GmlpSavedActivations  *saved;     /* the backward's */
  gboolean               save;      /* the forward keeps its saved activations */
  GmlpSavedActivations  *saved_out;
  GmlpGroupedTensor     *out;
} SharedWork;

static gboolean
shared_forward (gpointer   data,
                GError   **error)
{
  SharedWork *work = data;

  work->out = gmlp_grouped_mlp_forward (work->layer->shared, work->input,
                                        work->save ? &work->saved_out : NULL, error);
  return work->out != NULL;
}

static gboolean
shared_backward (gpointer   data,
                 GError   **error)
{
  SharedWork *work = data;

  work->out = gmlp_grouped_mlp_backward (work->layer->shared, work->saved, work->input, error);
  return work->out != NULL;
}

/**
 * gmlp_moe_layer_forward:
 * @self: a #GmlpMoELayer
 * @input: the tokens: one group of `tokens × hidden`, of the layer's dtype
 * @saved: (out) (optional) (transfer full): return location for what the
 *   backward needs
 * @error: return location for a #GError
 *
 * Routes the tokens, runs the experts on their tokens and combines their
 * outputs (and adds the shared expert's). Stream-ordered; nothing waits for
 * the device, and nothing on the host reads the routing.
 *
 * Returns: (transfer full): the output, `tokens × hidden`, or %NULL with an
 *   error (nothing is written then)
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_moe_layer_forward (GmlpMoELayer          *self,
                        GmlpGroupedTensor     *input,
                        GmlpSavedActivations **saved,
                        GError               **error)
{
  g_autoptr(GmlpSavedActivations) router_saved = NULL, experts_saved = NULL;
  g_autoptr(GmlpSavedActivations) shared_saved = NULL, own = NULL;
  g_autoptr(GmlpRouting) routing = NULL;
  g_autoptr(GmlpGroupedTensor) permuted = NULL, expert_out = NULL, output = NULL;
  g_autoptr(GmlpGroupedTensor) shared_out = NULL;
  GmlpMoEParallelStep *step = NULL;

  g_return_val_if_fail (GMLP_IS_MOE_LAYER (self), NULL);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (input), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (saved != NULL)
    *saved = NULL;
  if (!gmlp_moe_parallel_ensure_agreed (self, error) ||
      !gmlp_grouped_tensor_check_usable (input, error) ||
      !check_tokens (self, input, "The input", error))
    return NULL;

  routing = gmlp_router_forward (self->router, input, saved ? &router_saved : NULL, error);
  if (routing == NULL)
    return NULL;
  permuted = gmlp_routing_permute_full (routing, input, self->padding, self->capacity_factor, error);
  if (permuted == NULL)
    return NULL;
  if (self->communicator != NULL)
    {
      SharedWork work = { self, input, NULL, saved != NULL, NULL, NULL };

      expert_out = gmlp_moe_parallel_forward (self, routing, permuted, saved ? &experts_saved : NULL,
                                              saved ? &step : NULL,
                                              self->shared != NULL ? shared_forward : NULL, &work,
                                              error);
      shared_out = work.out;
      shared_saved = work.saved_out;
      if (expert_out == NULL)
        return NULL;
    }
  else
    expert_out = gmlp_grouped_mlp_forward (self->experts, permuted, saved ? &experts_saved : NULL,
                                           error);
  if (expert_out == NULL)
    return NULL;
  if (step != NULL)
    g_object_set_data_full (G_OBJECT (experts_saved), SAVED_PARALLEL, step,
                            gmlp_moe_parallel_step_free);
  output = gmlp_routing_combine (routing, expert_out, error);
  if (output == NULL)
    return NULL;
  if (self->shared != NULL)
    {
      if (shared_out == NULL)
        shared_out = gmlp_grouped_mlp_forward (self->shared, input, saved ? &shared_saved : NULL,
                                               error);
      if (shared_out == NULL || !gmlp_grouped_tensor_add_scaled (output, 1.0, shared_out, error))
        return NULL;
    }

  if (saved != NULL)
    {
      own = gmlp_saved_activations_new (self->id);
      gmlp_saved_activations_add_child (own, router_saved);
      gmlp_saved_activations_add_child (own, experts_saved);
      if (shared_saved != NULL)
        gmlp_saved_activations_add_child (own, shared_saved);
      gmlp_saved_activations_add (own, "expert-output", expert_out);
      g_object_set_data_full (G_OBJECT (own), SAVED_ROUTING, g_object_ref (routing),
                              g_object_unref);
      if (!gmlp_saved_activations_apply_offload (own, error))
        return NULL;
      *saved = g_steal_pointer (&own);
    }

  gmlp_mutex_lock (&self->last_lock);
  g_set_object (&self->last, routing);
  gmlp_mutex_unlock (&self->last_lock);
  return g_steal_pointer (&output);
}

/**
 * gmlp_moe_layer_forward_inference:
 * @self: a #GmlpMoELayer
 * @input: the tokens: one group of `tokens × hidden`, of the layer's dtype
 * @error: return location for a #GError
 *
 * [method@Gmlp.MoELayer.forward] with nothing saved for a backward, for
 * languages whose bindings always ask for an optional out argument
 * (Python, JavaScript): the same as `forward` with @saved %NULL. The
 * results are the same as a forward that saves; nothing is kept for a
 * backward (an expert-parallel layer pipelines its experts by
 * [property@Gmlp.MoELayer:expert-parallel-chunks] either way).
 *
 * Returns: (transfer full): the output, `tokens × hidden`, or %NULL with an
 *   error (nothing is written then)
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_moe_layer_forward_inference (GmlpMoELayer       *self,
                                  GmlpGroupedTensor  *input,
                                  GError            **error)
{
  return gmlp_moe_layer_forward (self, input, NULL, error);
}

/* The parts write their weight gradients one after the other (backward:
 * the experts, the router, the shared expert; backward_dw: the router, the
 * experts, the shared expert), and each checks its own against what it
 * reads: a part's main_grad that holds what another part reads (the
 * tokens, a weight, the output gradient) would make that part refuse, or
 * compute from changed values, after the first had written. So every
 * part's outputs against @reads (GArrays of GmlpVersionRecord: what any
 * part reads) and @also (NULL: none), before any part writes; @step names
 * the call in the router's error. */
static gboolean
check_weight_gradients_against (GmlpMoELayer       *self,
                                GPtrArray          *reads,
                                GmlpGroupedTensor  *also,
                                const char         *step,
                                GError            **error)
{
  GmlpGroupedTensor *router_grad = gmlp_router_get_main_grad (self->router);
  guint i;

  /* The router's own weight gradient is its own storage; a main_grad is
   * the caller's. */
  if (router_grad != NULL)
    {
      const GmlpVersionRecord *record = NULL;
      GmlpSpan span;

      gmlp_grouped_tensor_get_span (router_grad, &span);
      for (i = 0; i < reads->len && record == NULL; i++)
        record = gmlp_version_records_find_overlap (g_ptr_array_index (reads, i), &span);
      if (record != NULL || (also != NULL && gmlp_grouped_tensor_overlaps (router_grad, also)))
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                       "The router's main_grad shares storage with the %s, which the layer's "
                       "%s reads", record != NULL ? record->name : "output gradient", step);
          return FALSE;
        }
    }
  return gmlp_grouped_mlp_check_wgrad_outputs (self->experts, reads, also, "The experts", error) &&
         (self->shared == NULL ||
          gmlp_grouped_mlp_check_wgrad_outputs (self->shared, reads, also, "The shared expert", error));
}

/* In backward: what any part's forward read (@saved and its parts') and
 * the output gradient. Delayed, the parts write nothing here: backward_dw
 * checks then. */
static gboolean
check_weight_gradients_apart (GmlpMoELayer          *self,
                              GmlpSavedActivations  *saved,
                              GmlpGroupedTensor     *grad_output,
                              GError               **error)
{
  GmlpSavedActivations *parts[3], *router_saved = gmlp_saved_activations_get_child (saved, 0);
  g_autoptr(GPtrArray) reads = g_ptr_array_new ();
  guint n_parts = 0, i, j;

  if (self->flags & GMLP_LINEAR_DELAY_WGRAD_COMPUTE)
    return TRUE;
  parts[n_parts++] = gmlp_saved_activations_get_child (saved, 1);
  if (self->shared != NULL)
    parts[n_parts++] = gmlp_saved_activations_get_child (saved, 2);
  g_ptr_array_add (reads, gmlp_saved_activations_get_versions (saved));
  g_ptr_array_add (reads, gmlp_saved_activations_get_versions (router_saved));
  g_ptr_array_add (reads, gmlp_saved_activations_get_versions (gmlp_saved_activations_get_child (router_saved, 0)));
  for (i = 0; i < n_parts; i++)
    {
      g_ptr_array_add (reads, gmlp_saved_activations_get_versions (parts[i]));
      for (j = 0; j < 2; j++)
        g_ptr_array_add (reads, gmlp_saved_activations_get_versions (gmlp_saved_activations_get_child (parts[i], j)));
    }
  return check_weight_gradients_against (self, reads, grad_output, "backward", error);
}

/**
 * gmlp_moe_layer_backward:
 * @self: a #GmlpMoELayer
 * @saved: what the forward saved
 * @grad_output: the gradient of the output, `tokens × hidden`, of the
 *   layer's dtype
 * @error: return location for a #GError
 *
 * Computes the input's gradient: through the combine (which also gives the
 * probabilities' gradient), the experts, the permutation and the router,
 * plus the shared expert's. The router's, the experts' and the shared
 * expert's weight gradients follow their gradient contract
 * (docs/gradient-contract.md); the auxiliary losses count as if added to
 * the loss whose gradient @grad_output is. Consumes @saved.
 *
 * The backward of an FP8 forward is FP8, whatever the recipe is by then
 * (see [method@Gmlp.MoELayer.set_fp8_recipe]).
 *
 * Returns: (transfer full): the input's gradient, or %NULL with an error
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_moe_layer_backward (GmlpMoELayer          *self,
                         GmlpSavedActivations  *saved,
                         GmlpGroupedTensor     *grad_output,
                         GError               **error)
{
  g_autoptr(GmlpRecMutexLocker) locker = NULL;
  g_autoptr(GmlpGroupedTensor) grad_expert_out = NULL, grad_probs = NULL;
  g_autoptr(GmlpGroupedTensor) grad_permuted = NULL, grad_input = NULL;
  g_autoptr(GmlpGroupedTensor) grad_router = NULL, grad_shared = NULL;
  GmlpSavedActivations *router_saved, *experts_saved, *shared_saved = NULL;
  GmlpGroupedTensor *expert_out;
  GmlpRouting *routing;

  g_return_val_if_fail (GMLP_IS_MOE_LAYER (self), NULL);
  g_return_val_if_fail (GMLP_IS_SAVED_ACTIVATIONS (saved), NULL);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (grad_output), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!gmlp_check_constructed (self, self->construct_error, error) ||
      !gmlp_grouped_tensor_check_usable (grad_output, error) ||
      !check_tokens (self, grad_output, "The output gradient", error))
    return NULL;

  locker = gmlp_rec_mutex_locker_new (&self->grad_lock);
  if (!gmlp_saved_activations_check (saved, self->id, "MoELayer", error))
    return NULL;
  routing = g_object_get_data (G_OBJECT (saved), SAVED_ROUTING);
  router_saved = gmlp_saved_activations_get_child (saved, 0);
  experts_saved = gmlp_saved_activations_get_child (saved, 1);
  if (self->shared != NULL)
    shared_saved = gmlp_saved_activations_get_child (saved, 2);
  if (gmlp_grouped_tensor_get_total_rows (grad_output) != gmlp_routing_get_n_tokens (routing))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
                   "The output gradient has %" G_GINT64_FORMAT " tokens, the forward had %"
                   G_GINT64_FORMAT, gmlp_grouped_tensor_get_total_rows (grad_output),
                   gmlp_routing_get_n_tokens (routing));
      return NULL;
    }
  /* What every part's forward read (the parts of the parts too), before
   * any part writes. */
  if (!gmlp_saved_activations_check_versions_deep (saved, "MoELayer", error))
    return NULL;
  expert_out = gmlp_saved_activations_get (saved, "expert-output", error);
  if (expert_out == NULL)
    return NULL;
  /* What the experts' and the shared expert's backwards would refuse (an
   * FP8 recipe changed through get_experts() or get_shared_expert() since
   * the forward, main_grad's storage, ...), before the experts and the
   * router write: the experts' output gradient will have the shape of
   * their output. The router refuses nothing that these checks let
   * through. Expert parallel, the local experts' gradient arrives by the
   * dispatch: their backward, the first part to write, checks it then (a
   * refusal there aborts the communicator, as any failure mid-step). */
  if ((self->communicator == NULL &&
       !gmlp_grouped_mlp_check_backward (self->experts, experts_saved, expert_out, error)) ||
      (shared_saved != NULL &&
       !gmlp_grouped_mlp_check_backward (self->shared, shared_saved, grad_output, error)) ||
      !check_weight_gradients_apart (self, saved, grad_output, error))
    return NULL;

  grad_expert_out = gmlp_routing_combine_backward (routing, grad_output, expert_out, &grad_probs,
                                                   error);
  if (grad_expert_out == NULL)
    return NULL;
  if (self->communicator != NULL)
    {
      SharedWork work = { self, grad_output, shared_saved, FALSE, NULL, NULL };

      grad_permuted = gmlp_moe_parallel_backward (self, experts_saved,
                                                  g_object_get_data (G_OBJECT (experts_saved),
                                                                     SAVED_PARALLEL),
                                                  grad_expert_out,
                                                  shared_saved != NULL ? shared_backward : NULL,
                                                  &work, error);
      grad_shared = work.out;
    }
  else
    grad_permuted = gmlp_grouped_mlp_backward (self->experts, experts_saved, grad_expert_out, error);
  if (grad_permuted == NULL)
    return NULL;
  /* The router's input gradient in FP32, added to each token's sum of its
   * rows before that sum's one rounding: one pass, one rounding. */
  grad_router = gmlp_router_backward_fp32 (self->router, router_saved, grad_probs, error);
  if (grad_router == NULL)
    return NULL;
  grad_input = gmlp_routing_permute_backward_add (routing, grad_permuted, grad_router, error);
  if (grad_input == NULL)
    return NULL;
  if (shared_saved != NULL)
    {
      if (grad_shared == NULL)
        grad_shared = gmlp_grouped_mlp_backward (self->shared, shared_saved, grad_output, error);
      if (grad_shared == NULL ||
          !gmlp_grouped_tensor_add_scaled (grad_input, 1.0, grad_shared, error))
        return NULL;
    }

  gmlp_saved_activations_consume (saved);
  return g_steal_pointer (&grad_input);
}

/**
 * gmlp_moe_layer_backward_dw:
 * @self: a #GmlpMoELayer made with %GMLP_LINEAR_DELAY_WGRAD_COMPUTE
 * @error: return location for a #GError
 *
 * Computes the weight gradients of the oldest backward still waiting for
 * them: the router's, the experts' and the shared expert's (see
 * [method@Gmlp.GroupedLinear.backward_dw]). Every part is checked before
 * any computes: a call that fails leaves all of them pending and their
 * gradients as they were, but for a device error while they are written.
 *
 * Returns: %TRUE on success; %FALSE with %GMLP_ERROR_INVALID_STATE without
 *   delayed weight gradients, with none pending, or with what a part's
 *   forward read written since, or %GMLP_ERROR_INVALID_ARGUMENT when a
 *   part's main_grad shares storage with what a part reads (the tokens,
 *   the output gradient)
 *
 * Since: 0.1
 */
gboolean
gmlp_moe_layer_backward_dw (GmlpMoELayer  *self,
                            GError       **error)
{
  g_autoptr(GmlpRecMutexLocker) locker = NULL;
  g_autoptr(GPtrArray) reads = NULL;

  g_return_val_if_fail (GMLP_IS_MOE_LAYER (self), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_check_constructed (self, self->construct_error, error))
    return FALSE;

  locker = gmlp_rec_mutex_locker_new (&self->grad_lock);
  /* Every part checked before any computes: the experts and the shared
   * expert prepared (nothing pending, what they read written since, ...),
   * every part's outputs against what any part reads (the router's
   * main_grad holding the output gradient, which the shared expert reads
   * after the router has written, ...), then the router, which checks
   * before it writes, then the two. */
  if (!gmlp_grouped_mlp_backward_dw_prepare (self->experts, error) ||
      (self->shared != NULL && !gmlp_grouped_mlp_backward_dw_prepare (self->shared, error)))
    return FALSE;
  reads = g_ptr_array_new ();
  gmlp_router_add_pending_reads (self->router, reads);
  gmlp_grouped_mlp_add_pending_reads (self->experts, reads);
  if (self->shared != NULL)
    gmlp_grouped_mlp_add_pending_reads (self->shared, reads);
  return check_weight_gradients_against (self, reads, NULL, "backward_dw", error) &&
         gmlp_router_backward_dw (self->router, error) &&
         gmlp_grouped_mlp_backward_dw (self->experts, error) &&
         (self->shared == NULL || gmlp_grouped_mlp_backward_dw (self->shared, error));
}
