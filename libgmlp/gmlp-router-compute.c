/* gmlp-router-compute.c: what GmlpRouter computes
 *
 * forward (the gate's product, then the backend's routing), backward (and
 * the MoE layer's backward_fp32, whose input gradient stays FP32 for the
 * permute backward to add), backward_dw and update_expert_bias, with the
 * checks of what they take. The object itself is gmlp-router.c (gmlp-router-impl.h).
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-router-impl.h"
#include "gmlp-dtype-private.h"
#include "gmlp-error.h"
#include "gmlp-error-private.h"
#include "gmlp-grouped-linear-private.h"
#include "gmlp-grouped-tensor-private.h"
#include "gmlp-routing-private.h"
#include "gmlp-saved-activations-private.h"
#include "gmlp-thread-private.h"

static GmlpGroupedTensor *
new_tensor (GmlpRouter  *self,
            GmlpDType    dtype,
            gint64       rows,
            gint64       cols,
            GError     **error)
{
  return gmlp_grouped_tensor_new (self->device, dtype, &rows, 1, cols, error);
}

/* A tensor of one group, with its size on the host, on the router's
 * device: the router's input, and the other tensors its calls take. */
static gboolean
check_one_group (GmlpRouter         *self,
                 GmlpGroupedTensor  *tensor,
                 const char         *what,
                 GError            **error)
{
  if (gmlp_grouped_tensor_get_device (tensor) != self->device)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT, "%s is on %s, the router on %s",
                   what, gmlp_device_get_name (gmlp_grouped_tensor_get_device (tensor)),
                   gmlp_device_get_name (self->device));
      return FALSE;
    }
  if (gmlp_grouped_tensor_get_n_groups (tensor) != 1)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
                   "%s must be one group, not %u", what, gmlp_grouped_tensor_get_n_groups (tensor));
      return FALSE;
    }
  if (!gmlp_grouped_tensor_has_host_sizes (tensor))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "%s must have its size on the host: the token count fixes the routing's shape",
                   what);
      return FALSE;
    }
  return TRUE;
}

static gboolean
check_input (GmlpRouter         *self,
             GmlpGroupedTensor  *input,
             GError            **error)
{
  GmlpDType dtype = gmlp_grouped_tensor_get_dtype (input);

  if (!check_one_group (self, input, "The router's input", error))
    return FALSE;
  if (dtype != GMLP_DTYPE_FLOAT32 && dtype != GMLP_DTYPE_FLOAT16 && dtype != GMLP_DTYPE_BFLOAT16)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_DTYPE_MISMATCH,
                   "The router's input is %s; it takes float32, float16 or bfloat16",
                   gmlp_dtype_get_name (dtype));
      return FALSE;
    }
  if (gmlp_grouped_tensor_get_cols (input) != self->hidden)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
                   "The router's input has %" G_GINT64_FORMAT " columns; the router's hidden size is %"
                   G_GINT64_FORMAT, gmlp_grouped_tensor_get_cols (input), self->hidden);
      return FALSE;
    }
  return TRUE;
}

/**
 * gmlp_router_forward:
 * @self: a #GmlpRouter
 * @input: `x`: one group of `T × hidden` tokens, FP32, FP16 or BF16, on the
 *   router's device, its size on the host
 * @saved: (out) (transfer full) (optional): what backward needs; pass it to
 *   [method@Gmlp.Router.backward]
 * @error: return location for a #GError
 *
 * Routes the tokens, as [class@Gmlp.Router] says, enqueued on the device's
 * stream: nothing waits for the device, and nothing on the host depends on
 * the routing. Zero tokens give an empty routing (its counts and losses
 * zero).
 *
 * Returns: (transfer full): the routing, or %NULL with
 *   %GMLP_ERROR_SHAPE_MISMATCH (another width, or not one group),
 *   %GMLP_ERROR_DTYPE_MISMATCH, %GMLP_ERROR_INVALID_ARGUMENT (another device,
 *   a size only on the device) or an error of the backend; nothing is
 *   written then
 *
 * Since: 0.1
 */
GmlpRouting *
gmlp_router_forward (GmlpRouter            *self,
                     GmlpGroupedTensor     *input,
                     GmlpSavedActivations **saved,
                     GError               **error)
{
  g_autoptr(GmlpGroupedTensor) x32 = NULL, logits = NULL, indices = NULL, probs = NULL;
  g_autoptr(GmlpGroupedTensor) counts = NULL, aux = NULL, z = NULL;
  g_autoptr(GmlpSavedActivations) gate_saved = NULL;
  g_autoptr(GmlpRouting) routing = NULL;
  GmlpBackendRouter options;
  gboolean as_is;
  gint64 n_tokens;

  g_return_val_if_fail (GMLP_IS_ROUTER (self), NULL);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (input), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (saved != NULL)
    *saved = NULL;
  if (!gmlp_check_constructed (self, self->construct_error, error) ||
      !gmlp_grouped_tensor_check_usable (input, error) ||
      !check_input (self, input, error))
    return NULL;

  n_tokens = gmlp_grouped_tensor_get_total_rows (input);

  /* The gate multiplies in FP32: an FP32 input as it is, a BF16 one too,
   * on BF16 tensor cores with the weight split into BF16 parts
   * (gmlp-grouped-linear-split.c); the gate saves either. An FP16 input
   * is converted, and the copy not kept: backward converts it again from
   * the input, which is saved as it came (half the memory, and what an
   * offload moves). */
  as_is = gmlp_grouped_tensor_get_dtype (input) != GMLP_DTYPE_FLOAT16;
  x32 = as_is ? g_object_ref (input) : gmlp_grouped_tensor_convert (input, GMLP_DTYPE_FLOAT32, error);
  if (x32 == NULL)
    return NULL;
  logits = gmlp_grouped_linear_forward_full (self->gate, x32, as_is, saved != NULL ? &gate_saved : NULL,
                                             error);
  if (logits == NULL)
    return NULL;

  indices = new_tensor (self, GMLP_DTYPE_INT64, n_tokens, self->top_k, error);
  probs = indices != NULL ? new_tensor (self, GMLP_DTYPE_FLOAT32, n_tokens, self->top_k, error) : NULL;
  counts = probs != NULL ? new_tensor (self, GMLP_DTYPE_INT64, self->n_experts, 1, error) : NULL;
  aux = counts != NULL ? new_tensor (self, GMLP_DTYPE_FLOAT32, 1, 1, error) : NULL;
  z = aux != NULL ? new_tensor (self, GMLP_DTYPE_FLOAT32, 1, 1, error) : NULL;
  if (z == NULL)
    return NULL;

  options = self->options;
  options.n_tokens = n_tokens;
  if (!GMLP_DEVICE_CALL (self->device, router_forward, &options,
                         gmlp_grouped_tensor_get_data (logits),
                         self->expert_bias != NULL ? gmlp_grouped_tensor_get_data (self->expert_bias) : NULL,
                         gmlp_grouped_tensor_get_data (indices), gmlp_grouped_tensor_get_data (probs),
                         gmlp_grouped_tensor_get_data (counts), gmlp_grouped_tensor_get_data (aux),
                         gmlp_grouped_tensor_get_data (z), error))
    return NULL;
  routing = gmlp_routing_new_for_router (self->device, self->n_experts, indices, probs, counts, aux, z);

  if (saved != NULL)
    {
      g_autoptr(GmlpSavedActivations) own = gmlp_saved_activations_new (self->id);

      gmlp_saved_activations_add_child (own, gate_saved);
      gmlp_saved_activations_add (own, "logit tensor", logits);
      gmlp_saved_activations_add (own, "index tensor", indices);
      if (self->options.aux_loss_coeff != 0.0f)
        gmlp_saved_activations_add (own, "count tensor", counts);
      if (!as_is)
        gmlp_saved_activations_add (own, "input", input);
      if (!gmlp_saved_activations_apply_offload (own, error))
        return NULL;
      *saved = g_steal_pointer (&own);
    }
  return g_steal_pointer (&routing);
}

static gboolean
check_grad_probs (GmlpRouter         *self,
                  GmlpGroupedTensor  *grad_probs,
                  gint64              n_tokens,
                  GError            **error)
{
  if (!check_one_group (self, grad_probs, "The gradient of the probabilities", error))
    return FALSE;
  if (gmlp_grouped_tensor_get_dtype (grad_probs) != GMLP_DTYPE_FLOAT32)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_DTYPE_MISMATCH,
                   "The gradient of the probabilities must be float32, not %s",
                   gmlp_dtype_get_name (gmlp_grouped_tensor_get_dtype (grad_probs)));
      return FALSE;
    }
  if (gmlp_grouped_tensor_get_total_rows (grad_probs) != n_tokens ||
      gmlp_grouped_tensor_get_cols (grad_probs) != self->top_k)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
                   "The gradient of the probabilities is %" G_GINT64_FORMAT " × %" G_GINT64_FORMAT
                   "; the forward routed %" G_GINT64_FORMAT " × %u",
                   gmlp_grouped_tensor_get_total_rows (grad_probs),
                   gmlp_grouped_tensor_get_cols (grad_probs), n_tokens, self->top_k);
      return FALSE;
    }
  return TRUE;
}

/* gmlp_router_backward(), or with @fp32, gmlp_router_backward_fp32(). */
static GmlpGroupedTensor *
router_backward (GmlpRouter            *self,
                 GmlpSavedActivations  *saved,
                 GmlpGroupedTensor     *grad_probs,
                 gboolean               fp32,
                 GError               **error)
{
  g_autoptr(GmlpRecMutexLocker) locker = NULL;
  g_autoptr(GmlpLinearBackward) step = NULL;
  g_autoptr(GmlpGroupedTensor) grad_logits = NULL, dx = NULL, gate_dx = NULL;
  GmlpGroupedTensor *logits, *indices, *counts = NULL, *input = NULL, *gate_input;
  GmlpSavedActivations *gate_saved;
  GmlpBackendShape dx32_shape;
  GmlpBackendRouter options;
  GmlpDType x_dtype;
  gint64 n_tokens;

  if (!gmlp_check_constructed (self, self->construct_error, error) ||
      !gmlp_grouped_tensor_check_usable (grad_probs, error))
    return NULL;

  locker = gmlp_rec_mutex_locker_new (&self->grad_lock);
  if (!gmlp_saved_activations_check (saved, self->id, "Router", error))
    return NULL;
  gate_saved = gmlp_saved_activations_get_child (saved, 0);
  /* What the forward read, before anything is reloaded. */
  if (!gmlp_saved_activations_check_versions (saved, "Router", error) ||
      !gmlp_saved_activations_check_versions (gate_saved, "Router's gate", error))
    return NULL;

  logits = gmlp_saved_activations_get (saved, "logit tensor", error);
  indices = logits != NULL ? gmlp_saved_activations_get (saved, "index tensor", error) : NULL;
  if (indices == NULL)
    return NULL;
  if (gmlp_saved_activations_contains (saved, "count tensor") &&
      (counts = gmlp_saved_activations_get (saved, "count tensor", error)) == NULL)
    return NULL;
  if (gmlp_saved_activations_contains (saved, "input") &&
      (input = gmlp_saved_activations_get (saved, "input", error)) == NULL)
    return NULL;
  n_tokens = gmlp_grouped_tensor_get_total_rows (logits);
  if (!check_grad_probs (self, grad_probs, n_tokens, error))
    return NULL;

  /* An FP16 input: the gate's FP32 copy, made again (kept with the gate's
   * activations, where a retry finds it). */
  if (input != NULL && !gmlp_saved_activations_contains (gate_saved, "input"))
    {
      g_autoptr(GmlpGroupedTensor) x32 = gmlp_grouped_tensor_convert (input, GMLP_DTYPE_FLOAT32, error);

      if (x32 == NULL)
        return NULL;
      gmlp_saved_activations_add (gate_saved, "input", x32);
    }
  /* Otherwise the gate saved the input as it came, FP32 or BF16. */
  gate_input = gmlp_saved_activations_get (gate_saved, "input", error);
  if (gate_input == NULL)
    return NULL;
  x_dtype = gmlp_grouped_tensor_get_dtype (input != NULL ? input : gate_input);

  /* The gate's checks and allocations, and ours, before any write. The
   * gate's input gradient is FP32 (an FP32 or FP16 input's, through the
   * FP32 copy) or BF16 (a BF16 input's, FP32 with @fp32); an FP16 input
   * gets its own, converted from the FP32 one unless @fp32. */
  grad_logits = new_tensor (self, GMLP_DTYPE_FLOAT32, n_tokens, self->n_experts, error);
  if (grad_logits == NULL)
    return NULL;
  step = fp32 ? gmlp_grouped_linear_backward_begin_fp32 (self->gate, gate_saved, grad_logits, "Router's gate",
                                                         error)
              : gmlp_grouped_linear_backward_begin (self->gate, gate_saved, grad_logits, "Router's gate", error);
  if (step == NULL)
    return NULL;
  if (input != NULL && !fp32)
    {
      dx = new_tensor (self, x_dtype, n_tokens, self->hidden, error);
      if (dx == NULL ||
          !gmlp_grouped_tensor_get_backend_shape (gmlp_linear_backward_get_grad_input (step),
                                                  &dx32_shape, error))
        return NULL;
    }

  options = self->options;
  options.n_tokens = n_tokens;
  if (!GMLP_DEVICE_CALL (self->device, router_backward, &options, gmlp_grouped_tensor_get_data (logits),
                         gmlp_grouped_tensor_get_data (indices),
                         counts != NULL ? gmlp_grouped_tensor_get_data (counts) : NULL,
                         gmlp_grouped_tensor_get_data (grad_probs),
                         gmlp_grouped_tensor_get_data (grad_logits), error) ||
      !gmlp_grouped_linear_backward_dgrad (self->gate, step, error))
    return NULL;
  if (dx != NULL &&
      !GMLP_DEVICE_CALL (self->device, convert, &dx32_shape,
                         gmlp_grouped_tensor_get_data (gmlp_linear_backward_get_grad_input (step)),
                         GMLP_DTYPE_FLOAT32, gmlp_grouped_tensor_get_data (dx),
                         (int) gmlp_grouped_tensor_get_dtype (dx), error))
    return NULL;

  gate_dx = gmlp_grouped_linear_backward_finish (self->gate, step, error);
  if (gate_dx == NULL)
    return NULL;
  gmlp_saved_activations_consume (saved);
  if (!(self->flags & GMLP_LINEAR_DELAY_WGRAD_COMPUTE) && !gmlp_router_emit_wgrad_ready (self, error))
    return NULL;
  return dx != NULL ? g_steal_pointer (&dx) : g_steal_pointer (&gate_dx);
}

/**
 * gmlp_router_backward:
 * @self: a #GmlpRouter
 * @saved: what the forward returned; consumed by this call
 * @grad_probs: the gradient of the routing's probabilities, `T × k` FP32
 *   (one group, its size on the host)
 * @error: return location for a #GError
 *
 * Computes the input gradient through the gate, from the gradient of the
 * probabilities and those of the forward's aux loss and z-loss (see
 * [class@Gmlp.Router]), and the gate weight's gradient as the gradient
 * contract says: now, or queued for [method@Gmlp.Router.backward_dw] when
 * delayed. Enqueued on the device's stream; no host synchronisation.
 *
 * Everything is checked, and everything allocated, before anything is
 * written: a backward that fails leaves @saved unused, so it can be retried.
 *
 * Returns: (transfer full): the input gradient, `T × hidden` in the input's
 *   dtype, or %NULL with %GMLP_ERROR_INVALID_ARGUMENT for activations of
 *   another router, %GMLP_ERROR_INVALID_STATE for activations already used
 *   or for an input, gate weight or routing written since the forward,
 *   %GMLP_ERROR_SHAPE_MISMATCH or %GMLP_ERROR_DTYPE_MISMATCH for another
 *   @grad_probs, or an error of the gate's backward (main_grad)
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_router_backward (GmlpRouter            *self,
                      GmlpSavedActivations  *saved,
                      GmlpGroupedTensor     *grad_probs,
                      GError               **error)
{
  g_return_val_if_fail (GMLP_IS_ROUTER (self), NULL);
  g_return_val_if_fail (GMLP_IS_SAVED_ACTIVATIONS (saved), NULL);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (grad_probs), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  return router_backward (self, saved, grad_probs, FALSE, error);
}

GmlpGroupedTensor *
gmlp_router_backward_fp32 (GmlpRouter            *self,
                           GmlpSavedActivations  *saved,
                           GmlpGroupedTensor     *grad_probs,
                           GError               **error)
{
  g_return_val_if_fail (GMLP_IS_ROUTER (self), NULL);
  g_return_val_if_fail (GMLP_IS_SAVED_ACTIVATIONS (saved), NULL);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (grad_probs), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  return router_backward (self, saved, grad_probs, TRUE, error);
}

void
gmlp_router_add_pending_reads (GmlpRouter  *self,
                               GPtrArray   *reads)
{
  if (self->gate != NULL)
    gmlp_grouped_linear_add_pending_reads (self->gate, reads);
}

/**
 * gmlp_router_backward_dw:
 * @self: a #GmlpRouter with delayed weight gradients
 * @error: return location for a #GError
 *
 * Computes the gate weight's gradient of the oldest backward still waiting
 * for it, as [method@Gmlp.GroupedLinear.backward_dw] does, and emits
 * [signal@Gmlp.Router::wgrad-ready].
 *
 * Returns: %TRUE on success; %FALSE with %GMLP_ERROR_INVALID_STATE when the
 *   router does not delay weight gradients, none is pending, or what it
 *   reads was written since, or an error as for
 *   [method@Gmlp.GroupedLinear.backward_dw]
 *
 * Since: 0.1
 */
gboolean
gmlp_router_backward_dw (GmlpRouter  *self,
                         GError     **error)
{
  g_autoptr(GmlpRecMutexLocker) locker = NULL;

  g_return_val_if_fail (GMLP_IS_ROUTER (self), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_check_constructed (self, self->construct_error, error))
    return FALSE;

  locker = gmlp_rec_mutex_locker_new (&self->grad_lock);
  return gmlp_grouped_linear_backward_dw_prepare (self->gate, "Router", error) &&
         gmlp_grouped_linear_backward_dw (self->gate, error) &&
         gmlp_router_emit_wgrad_ready (self, error);
}

/**
 * gmlp_router_update_expert_bias:
 * @self: a #GmlpRouter with an expert bias
 * @tokens_per_expert: the load of each expert: one group of `n_experts`
 *   INT64 values on the router's device (a routing's
 *   [method@Gmlp.Routing.get_tokens_per_expert], or the sum of several)
 * @error: return location for a #GError
 *
 * Moves the expert bias towards balance, on the device and without waiting
 * for it: `bias_i += rate × sign (mean − load_i)`, where `mean` is the
 * average load and `rate` [property@Gmlp.Router:bias-update-rate]; an
 * expert at the mean keeps its bias. Aux-loss-free balancing calls it once
 * per step, with that step's loads.
 *
 * Returns: %TRUE on success; %FALSE with %GMLP_ERROR_INVALID_STATE for a
 *   router without expert bias, %GMLP_ERROR_DTYPE_MISMATCH,
 *   %GMLP_ERROR_SHAPE_MISMATCH or %GMLP_ERROR_INVALID_ARGUMENT for other
 *   loads (the bias is then unchanged)
 *
 * Since: 0.1
 */
gboolean
gmlp_router_update_expert_bias (GmlpRouter         *self,
                                GmlpGroupedTensor  *tokens_per_expert,
                                GError            **error)
{
  g_autoptr(GmlpMutexLocker) locker = NULL;
  GmlpGroupedTensor *counts = tokens_per_expert;
  guint64 n_values;

  g_return_val_if_fail (GMLP_IS_ROUTER (self), FALSE);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (tokens_per_expert), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_check_constructed (self, self->construct_error, error) ||
      !gmlp_grouped_tensor_check_usable (counts, error) ||
      !gmlp_router_check_has_expert_bias (self, error) ||
      !check_one_group (self, counts, "The tokens per expert", error))
    return FALSE;
  if (gmlp_grouped_tensor_get_dtype (counts) != GMLP_DTYPE_INT64)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_DTYPE_MISMATCH,
                   "The tokens per expert must be int64, not %s",
                   gmlp_dtype_get_name (gmlp_grouped_tensor_get_dtype (counts)));
      return FALSE;
    }
  if (!gmlp_checked_mul ((guint64) gmlp_grouped_tensor_get_total_rows (counts),
                         (guint64) gmlp_grouped_tensor_get_cols (counts), &n_values) ||
      n_values != self->n_experts)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
                   "The tokens per expert must be %u values, one per expert", self->n_experts);
      return FALSE;
    }

  locker = gmlp_mutex_locker_new (&self->bias_lock);
  gmlp_grouped_tensor_bump_version (self->expert_bias);
  return GMLP_DEVICE_CALL (self->device, router_update_bias, self->n_experts,
                           gmlp_grouped_tensor_get_data (counts), self->bias_rate,
                           gmlp_grouped_tensor_get_data (self->expert_bias), error);
}
