/* gmlp-routing-permute.c: tokens to their experts and back
 *
 * The methods of GmlpRouting that move rows: permute (tokens → one row per
 * choice, expert by expert), combine (the weighted sum back per token) and
 * the backward of both. The first permute makes the routing's layout (the
 * backend's routing_map: the padded rows of each expert, written on the
 * device, and which choice goes to which row); every later call reads it.
 * Nothing here reads a device value on the host: the capacities come from
 * T, k, n_experts, the padding and the capacity factor alone.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <math.h>

#include "gmlp-routing-private.h"
#include "gmlp-error.h"
#include "gmlp-error-private.h"
#include "gmlp-grouped-tensor-private.h"
#include "gmlp-saved-activations-private.h"
#include "gmlp-thread-private.h"

/* The routing's permuted layout, referenced for one call. */
typedef struct {
  GmlpGroupedTensor *sizes;
  GmlpGroupedTensor *row_of;
  GmlpGroupedTensor *choice_of;
  gint64             row_capacity;
} Layout;

static void
layout_clear (Layout *layout)
{
  g_clear_object (&layout->sizes);
  g_clear_object (&layout->row_of);
  g_clear_object (&layout->choice_of);
}

G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (Layout, layout_clear)

/* Called with the lock held: FALSE when a tensor the routing reads was
 * written after the routing read it. */
static gboolean
check_versions (GmlpRouting  *self,
                GError      **error)
{
  guint i;

  for (i = 0; i < self->versions->len; i++)
    {
      GmlpVersionRecord *record = &g_array_index (self->versions, GmlpVersionRecord, i);
      guint64 now = gmlp_version_counter_get (record->span.storage);

      if (now == record->seen)
        continue;
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE,
                   "The routing's %s were written after the %s read them (version %" G_GUINT64_FORMAT
                   ", read at version %" G_GUINT64_FORMAT "): make a new routing",
                   record->name, record->reader, now, record->seen);
      return FALSE;
    }
  return TRUE;
}

static void
layout_take (GmlpRouting *self,
             Layout      *layout)
{
  layout->sizes = g_object_ref (self->sizes);
  layout->row_of = g_object_ref (self->row_of);
  layout->choice_of = g_object_ref (self->choice_of);
  layout->row_capacity = self->row_capacity;
}

/* The capacities of a layout, from the arguments alone: every expert's
 * rows fit in row_capacity whatever the indices (Σ roundup (n_e, p) ≤ T k +
 * min (E, T k) (p − 1), and ≤ E × expert_capacity with a capacity). */
static gboolean
layout_capacities (GmlpRouting  *self,
                   gint64        padding,
                   double        capacity_factor,
                   gint64       *expert_capacity,
                   gint64       *row_capacity,
                   GError      **error)
{
  guint64 n_choices = (guint64) self->n_tokens * self->top_k;
  guint64 bound, capped;

  if (!gmlp_checked_mul (MIN ((guint64) self->n_experts, n_choices), (guint64) padding - 1, &bound) ||
      !gmlp_checked_add (bound, n_choices, &bound))
    bound = G_MAXUINT64;
  *expert_capacity = -1;
  if (capacity_factor > 0.0)
    {
      double per = ceil (capacity_factor * (double) n_choices / self->n_experts);
      /* An expert cannot receive more than every choice. */
      guint64 cap = per >= (double) n_choices ? n_choices : (guint64) per;

      cap = (cap + padding - 1) / padding * padding;
      *expert_capacity = (gint64) cap;
      if (gmlp_checked_mul (cap, self->n_experts, &capped))
        bound = MIN (bound, capped);
    }
  if (bound > G_MAXINT64)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "The permuted layout of %" G_GINT64_FORMAT " tokens would be too large",
                   self->n_tokens);
      return FALSE;
    }
  *row_capacity = (gint64) bound;
  return TRUE;
}

/* Called with the lock held: makes the layout, writes it on the device and
 * keeps it (only once all of it was enqueued). */
static gboolean
make_layout (GmlpRouting  *self,
             gint64        padding,
             double        capacity_factor,
             GError      **error)
{
  g_autoptr(GmlpGroupedTensor) sizes = NULL, row_of = NULL, choice_of = NULL;
  gint64 n = self->n_experts, expert_capacity, row_capacity;
  GmlpBackendRoutingMap map;

  if (!layout_capacities (self, padding, capacity_factor, &expert_capacity, &row_capacity, error))
    return FALSE;
  sizes = gmlp_grouped_tensor_new (self->device, GMLP_DTYPE_INT64, &n, 1, 1, error);
  if (sizes == NULL)
    return FALSE;
  row_of = gmlp_grouped_tensor_new (self->device, GMLP_DTYPE_INT64, &self->n_tokens, 1, self->top_k, error);
  if (row_of == NULL)
    return FALSE;
  choice_of = gmlp_grouped_tensor_new (self->device, GMLP_DTYPE_INT64, &row_capacity, 1, 1, error);
  if (choice_of == NULL)
    return FALSE;

  map = (GmlpBackendRoutingMap) {
    .n_tokens = self->n_tokens,
    .top_k = self->top_k,
    .n_experts = self->n_experts,
    .indices = gmlp_grouped_tensor_get_data (self->indices),
    .padding = padding,
    .expert_capacity = expert_capacity,
    .row_capacity = row_capacity,
    .sizes = gmlp_grouped_tensor_get_data (sizes),
    .row_of = gmlp_grouped_tensor_get_data (row_of),
    .choice_of = gmlp_grouped_tensor_get_data (choice_of),
  };
  if (!GMLP_DEVICE_CALL (self->device, routing_map, &map, error))
    return FALSE;

  self->padding = padding;
  self->capacity_factor = capacity_factor;
  self->expert_capacity = expert_capacity;
  self->row_capacity = row_capacity;
  self->sizes = g_steal_pointer (&sizes);
  self->row_of = g_steal_pointer (&row_of);
  self->choice_of = g_steal_pointer (&choice_of);
  gmlp_version_records_add (self->versions, "permuted group sizes", "permute", self->sizes);
  return TRUE;
}

/* The layout for combine and the backwards: made by a permute already. */
static gboolean
get_layout (GmlpRouting  *self,
            Layout       *layout,
            GError      **error)
{
  g_autoptr(GmlpMutexLocker) locker = gmlp_mutex_locker_new (&self->permute_lock);

  if (!check_versions (self, error))
    return FALSE;
  if (self->sizes == NULL)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE,
                   "The routing was never permuted: combine and the backwards take tensors "
                   "in the layout of its permute; call gmlp_routing_permute() first");
      return FALSE;
    }
  layout_take (self, layout);
  return TRUE;
}

/* Checks a tensor that must be in the routing's permuted layout: made with
 * the sizes tensor that the routing's map wrote (the permute's output, or a
 * GroupedLinear's output of it, which shares its sizes). */
static gboolean
check_permuted (GmlpRouting        *self,
                const Layout       *layout,
                GmlpGroupedTensor  *tensor,
                const char         *what,
                gint64              cols,
                GError            **error)
{
  if (!gmlp_routing_check_tensor (self->device, tensor, what, -1, cols, error))
    return FALSE;
  /* A tensor with device sizes has its sizes tensor already: this reads
   * nothing and uploads nothing. */
  if (gmlp_grouped_tensor_has_host_sizes (tensor) ||
      gmlp_grouped_tensor_get_sizes (tensor, NULL) != layout->sizes ||
      gmlp_grouped_tensor_get_row_capacity (tensor) != layout->row_capacity)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "%s is not in this routing's permuted layout: it must have the group sizes "
                   "that the routing's permute wrote (its output, or a tensor made from it as "
                   "a GroupedLinear's output is) and its row capacity", what);
      return FALSE;
    }
  return TRUE;
}

/* Runs the backend's permute entry with the routing's map. */
static gboolean
run_permute (GmlpRouting        *self,
             const Layout       *layout,
             GmlpPermuteKind     kind,
             GmlpGroupedTensor  *permuted_layout,
             GmlpGroupedTensor  *tokens,
             GmlpGroupedTensor  *permuted,
             GmlpGroupedTensor  *out,
             GmlpGroupedTensor  *grad_probs,
             GmlpGroupedTensor  *addend,
             GError            **error)
{
  GmlpBackendPermute p = {
    .kind = kind,
    .n_tokens = self->n_tokens,
    .top_k = self->top_k,
    .row_of = gmlp_grouped_tensor_get_data (layout->row_of),
    .choice_of = gmlp_grouped_tensor_get_data (layout->choice_of),
    .probs = gmlp_grouped_tensor_get_data (self->probs),
    .tokens = tokens != NULL ? gmlp_grouped_tensor_get_data (tokens) : NULL,
    .tokens_dtype = tokens != NULL ? (int) gmlp_grouped_tensor_get_dtype (tokens) : 0,
    .permuted = permuted != NULL ? gmlp_grouped_tensor_get_data (permuted) : NULL,
    .permuted_dtype = permuted != NULL ? (int) gmlp_grouped_tensor_get_dtype (permuted) : 0,
    .out = gmlp_grouped_tensor_get_data (out),
    .out_dtype = gmlp_grouped_tensor_get_dtype (out),
    .grad_probs = grad_probs != NULL ? gmlp_grouped_tensor_get_data (grad_probs) : NULL,
    .addend = addend != NULL ? gmlp_grouped_tensor_get_data (addend) : NULL,
  };

  return gmlp_grouped_tensor_get_backend_shape (permuted_layout, &p.shape, error) &&
         GMLP_DEVICE_CALL (self->device, permute, &p, error);
}

/* The checks every method starts with. */
static gboolean
check_call (GmlpRouting  *self,
            GError      **error)
{
  return gmlp_routing_check_usable (self, error) && gmlp_routing_check_backend (self->device, error);
}

/**
 * gmlp_routing_permute:
 * @self: a #GmlpRouting
 * @x: the tokens: `T × H`, one group, FP32, FP16 or BF16, on the routing's
 *   device
 * @error: return location for a #GError
 *
 * Gathers one row per token and chosen expert: what
 * [method@Gmlp.Routing.permute_full] gives with no padding and no capacity
 * (every choice whose index is in range has its row).
 *
 * Returns: (transfer full): the permuted rows, `n_experts` groups of `H`
 *   columns in @x's dtype, whose sizes are only on the device; or %NULL
 *   with an error as [method@Gmlp.Routing.permute_full] has them
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_routing_permute (GmlpRouting        *self,
                      GmlpGroupedTensor  *x,
                      GError            **error)
{
  return gmlp_routing_permute_full (self, x, 0, 0.0, error);
}

/**
 * gmlp_routing_permute_full:
 * @self: a #GmlpRouting
 * @x: the tokens: `T × H`, one group, FP32, FP16 or BF16, on the routing's
 *   device
 * @padding: round every expert's rows up to a multiple of this: 0 or 1
 *   (none), or a power of two up to 128 (16, 32 and 128 are those FP8 and
 *   aligned kernels want)
 * @capacity_factor: 0 for no capacity (dropless); otherwise each expert
 *   keeps at most `ceil (capacity_factor × T × k / n_experts)` choices
 *   (computed in double precision, at most `T × k`), rounded up to
 *   @padding
 * @error: return location for a #GError
 *
 * Gathers one row per token and chosen expert into a grouped tensor of
 * `n_experts` groups: the rows of expert 0, then of expert 1, and so on;
 * within an expert the tokens in order, and a token that chose the expert
 * more than once has a row per choice, in the order of its choices. An
 * expert's rows are followed by zero rows up to a multiple of @padding (an
 * expert with no rows has none). Choices whose index is out of range have
 * no row.
 *
 * With a capacity, an expert keeps the choices that come first in that
 * order (the earliest tokens, Megatron's "position" drop policy) and drops
 * the others: a dropped choice has no row and adds zero to
 * [method@Gmlp.Routing.combine] and to every gradient. The counts of
 * [method@Gmlp.Routing.get_tokens_per_expert] are before any drop.
 *
 * The group sizes (the padded rows of each expert) are written on the
 * device and never read on the host: the result has device-only sizes
 * ([ctor@Gmlp.GroupedTensor.new_with_device_sizes]) and a row capacity
 * fixed on the host from the arguments, `T × k + min (n_experts, T × k) ×
 * (padding − 1)`, or at most `n_experts ×` the capacity per expert. A
 * [class@Gmlp.GroupedLinear] of `n_experts` groups takes it as it is, and
 * its output is in the same layout, for [method@Gmlp.Routing.combine].
 *
 * The first permute fixes the routing's layout; a later one with the same
 * @padding and @capacity_factor reuses it (another tensor of tokens, or a
 * recomputation), and one with others is refused (see [class@Gmlp.Routing]).
 *
 * Returns: (transfer full): the permuted rows, in @x's dtype; or %NULL
 *   with %GMLP_ERROR_SHAPE_MISMATCH (@x is not `T × H` of one group),
 *   %GMLP_ERROR_DTYPE_MISMATCH, %GMLP_ERROR_INVALID_ARGUMENT (another
 *   device, a bad @padding, a negative or non-finite @capacity_factor),
 *   %GMLP_ERROR_INVALID_STATE (the routing has another layout, or its
 *   indices or probabilities were written since it was made) or
 *   %GMLP_ERROR_UNSUPPORTED (a backend without token permutation yet);
 *   nothing is written then
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_routing_permute_full (GmlpRouting        *self,
                           GmlpGroupedTensor  *x,
                           guint               padding,
                           double              capacity_factor,
                           GError            **error)
{
  g_auto(Layout) layout = { 0 };
  g_autoptr(GmlpGroupedTensor) out = NULL;
  gint64 rows_multiple = MAX (padding, 1);

  g_return_val_if_fail (GMLP_IS_ROUTING (self), NULL);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (x), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!gmlp_routing_check_usable (self, error) ||
      !gmlp_routing_check_tokens (self->device, x, "The input", -1, self->n_tokens, -1, error))
    return NULL;
  if (padding > 128 || (padding & (padding - 1)) != 0)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "The padding must be 0, or a power of two up to 128, not %u", padding);
      return NULL;
    }
  if (!isfinite (capacity_factor) || capacity_factor < 0.0)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "The capacity factor must be 0 (dropless) or positive, not %g", capacity_factor);
      return NULL;
    }
  if (!gmlp_routing_check_backend (self->device, error))
    return NULL;

  {
    g_autoptr(GmlpMutexLocker) locker = gmlp_mutex_locker_new (&self->permute_lock);

    if (!check_versions (self, error))
      return NULL;
    if (self->sizes != NULL &&
        (self->padding != rows_multiple || self->capacity_factor != capacity_factor))
      {
        g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE,
                     "This routing was permuted with padding %" G_GINT64_FORMAT " and capacity "
                     "factor %g; a routing keeps one permuted layout (make another routing for "
                     "padding %u and capacity factor %g)", self->padding, self->capacity_factor,
                     padding, capacity_factor);
        return NULL;
      }
    if (self->sizes == NULL && !make_layout (self, rows_multiple, capacity_factor, error))
      return NULL;
    layout_take (self, &layout);
  }

  out = gmlp_grouped_tensor_new_with_device_sizes (self->device, gmlp_grouped_tensor_get_dtype (x),
                                                   layout.sizes, layout.row_capacity,
                                                   gmlp_grouped_tensor_get_cols (x), error);
  if (out == NULL ||
      !run_permute (self, &layout, GMLP_PERMUTE_FORWARD, out, x, NULL, out, NULL, NULL, error))
    return NULL;
  return g_steal_pointer (&out);
}

/* A new T × cols tensor of the tokens. */
static GmlpGroupedTensor *
new_tokens (GmlpRouting  *self,
            GmlpDType     dtype,
            gint64        cols,
            GError      **error)
{
  return gmlp_grouped_tensor_new (self->device, dtype, &self->n_tokens, 1, cols, error);
}

/* combine and permute_backward: the rows back to their tokens, weighted
 * or not; BACKWARD's FP32 addend, T × cols, where given. */
static GmlpGroupedTensor *
to_tokens (GmlpRouting        *self,
           GmlpGroupedTensor  *permuted,
           GmlpGroupedTensor  *addend,
           GmlpPermuteKind     kind,
           const char         *what,
           GError            **error)
{
  g_auto(Layout) layout = { 0 };
  g_autoptr(GmlpGroupedTensor) out = NULL;

  if (!check_call (self, error) ||
      !gmlp_grouped_tensor_check_usable (permuted, error) ||
      !get_layout (self, &layout, error) ||
      !check_permuted (self, &layout, permuted, what, -1, error) ||
      (addend != NULL &&
       !gmlp_routing_check_tokens (self->device, addend, "The addend", GMLP_DTYPE_FLOAT32, self->n_tokens,
                                   gmlp_grouped_tensor_get_cols (permuted), error)))
    return NULL;

  out = new_tokens (self, gmlp_grouped_tensor_get_dtype (permuted),
                    gmlp_grouped_tensor_get_cols (permuted), error);
  if (out == NULL ||
      !run_permute (self, &layout, kind, permuted, NULL, permuted, out, NULL, addend, error))
    return NULL;
  return g_steal_pointer (&out);
}

/**
 * gmlp_routing_combine:
 * @self: a #GmlpRouting
 * @y: the experts' outputs in the routing's permuted layout: the output of
 *   [method@Gmlp.Routing.permute], or a tensor made from it (a
 *   [class@Gmlp.GroupedLinear]'s or [class@Gmlp.GroupedMLP]'s output keeps
 *   its group sizes); FP32, FP16 or BF16
 * @error: return location for a #GError
 *
 * Sums each token's expert outputs, weighted by its probabilities:
 * `out[t] = Σ_j probs[t, j] × y[row (t, j)]`, over the token's choices in
 * order, leaving out those that have no row (out of range or dropped), in
 * FP32, stored in @y's dtype. A token with no row gets zeros.
 *
 * Returns: (transfer full): the combined tokens, `T × H` (H: @y's
 *   columns), one group; or %NULL with %GMLP_ERROR_INVALID_ARGUMENT (@y is
 *   not in this routing's permuted layout, or on another device),
 *   %GMLP_ERROR_DTYPE_MISMATCH, %GMLP_ERROR_INVALID_STATE (the routing was
 *   never permuted, or a tensor it read was written since) or
 *   %GMLP_ERROR_UNSUPPORTED; nothing is written then
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_routing_combine (GmlpRouting        *self,
                      GmlpGroupedTensor  *y,
                      GError            **error)
{
  g_return_val_if_fail (GMLP_IS_ROUTING (self), NULL);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (y), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  return to_tokens (self, y, NULL, GMLP_PERMUTE_COMBINE, "The experts' output", error);
}

/**
 * gmlp_routing_permute_backward:
 * @self: a #GmlpRouting
 * @grad_permuted: the gradient of [method@Gmlp.Routing.permute]'s output
 *   (a GroupedLinear's input gradient, say), in the routing's permuted
 *   layout; FP32, FP16 or BF16
 * @error: return location for a #GError
 *
 * The gradient of a permute with respect to its input: `dx[t] = Σ_j
 * grad_permuted[row (t, j)]` over the token's choices that have a row, in
 * FP32, stored in @grad_permuted's dtype. Padding rows are not read.
 *
 * Returns: (transfer full): `dx`, `T × H`, one group; or %NULL with an
 *   error as [method@Gmlp.Routing.combine] has them
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_routing_permute_backward (GmlpRouting        *self,
                               GmlpGroupedTensor  *grad_permuted,
                               GError            **error)
{
  g_return_val_if_fail (GMLP_IS_ROUTING (self), NULL);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (grad_permuted), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  return to_tokens (self, grad_permuted, NULL, GMLP_PERMUTE_BACKWARD, "The permuted gradient", error);
}

GmlpGroupedTensor *
gmlp_routing_permute_backward_add (GmlpRouting        *self,
                                   GmlpGroupedTensor  *grad_permuted,
                                   GmlpGroupedTensor  *addend,
                                   GError            **error)
{
  g_return_val_if_fail (GMLP_IS_ROUTING (self), NULL);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (grad_permuted), NULL);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (addend), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  return to_tokens (self, grad_permuted, addend, GMLP_PERMUTE_BACKWARD, "The permuted gradient", error);
}

/**
 * gmlp_routing_combine_backward:
 * @self: a #GmlpRouting
 * @grad_out: the gradient of [method@Gmlp.Routing.combine]'s output, `T ×
 *   H`, one group; FP32, FP16 or BF16
 * @y: what combine read, in the routing's permuted layout, `H` columns
 * @grad_probs: (out) (transfer full) (optional): the gradient with respect
 *   to the routing's probabilities, `T × k` FP32: `grad_out[t] · y[row (t,
 *   j)]`, 0 for a choice with no row
 * @error: return location for a #GError
 *
 * The gradients of a combine: with respect to its input, `grad_y[row (t,
 * j)] = probs[t, j] × grad_out[t]` (padding rows zero), in @y's dtype and
 * layout; and, when @grad_probs is given, with respect to the
 * probabilities, which is what a router's backward takes. Products and
 * sums in FP32.
 *
 * Returns: (transfer full): `grad_y`; or %NULL with
 *   %GMLP_ERROR_SHAPE_MISMATCH (@grad_out is not `T × H`) or an error as
 *   [method@Gmlp.Routing.combine] has them
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_routing_combine_backward (GmlpRouting        *self,
                               GmlpGroupedTensor  *grad_out,
                               GmlpGroupedTensor  *y,
                               GmlpGroupedTensor **grad_probs,
                               GError            **error)
{
  g_auto(Layout) layout = { 0 };
  g_autoptr(GmlpGroupedTensor) grad_y = NULL, dprobs = NULL;

  g_return_val_if_fail (GMLP_IS_ROUTING (self), NULL);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (grad_out), NULL);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (y), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (grad_probs != NULL)
    *grad_probs = NULL;
  if (!check_call (self, error) ||
      !gmlp_routing_check_tokens (self->device, grad_out, "The output gradient", -1,
                                  self->n_tokens, -1, error) ||
      !gmlp_grouped_tensor_check_usable (y, error) ||
      !get_layout (self, &layout, error) ||
      !check_permuted (self, &layout, y, "The experts' output", gmlp_grouped_tensor_get_cols (grad_out),
                       error))
    return NULL;

  grad_y = gmlp_grouped_tensor_new_with_device_sizes (self->device, gmlp_grouped_tensor_get_dtype (y),
                                                      layout.sizes, layout.row_capacity,
                                                      gmlp_grouped_tensor_get_cols (y), error);
  if (grad_y == NULL)
    return NULL;
  if (grad_probs != NULL)
    {
      dprobs = gmlp_grouped_tensor_new (self->device, GMLP_DTYPE_FLOAT32, &self->n_tokens, 1,
                                        self->top_k, error);
      if (dprobs == NULL)
        return NULL;
    }
  if (!run_permute (self, &layout, GMLP_PERMUTE_COMBINE_BACKWARD, grad_y, grad_out, y, grad_y, dprobs, NULL,
                    error))
    return NULL;

  if (grad_probs != NULL)
    *grad_probs = g_steal_pointer (&dprobs);
  return g_steal_pointer (&grad_y);
}
