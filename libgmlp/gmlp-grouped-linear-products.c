/* gmlp-grouped-linear-products.c: what GmlpGroupedLinear computes
 *
 * forward, backward (in the three phases of gmlp-grouped-linear-private.h)
 * and backward_dw. Each product of the layer is described once, as a
 * Product (gmlp-grouped-linear-impl.h), which gmlp_linear_run_product()
 * (gmlp-grouped-linear-runner.c) hands to the backend. Here too are the
 * outputs of the weight gradients: wgrad and bgrad, made at the first
 * computation, or main_grad with the accumulation mask, and the checks
 * that nothing they write is read. FP8 products go through
 * gmlp-grouped-linear-fp8.c.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-grouped-linear-impl.h"
#include "gmlp-error.h"
#include "gmlp-error-private.h"
#include "gmlp-offload-context-private.h"
#include "gmlp-quantizer-private.h"
#include "gmlp-saved-activations-private.h"
#include "gmlp-thread-private.h"

/**
 * gmlp_grouped_linear_set_wgrad_accumulation_mask:
 * @self: a #GmlpGroupedLinear
 * @accumulate: (array length=n_groups): per group, %TRUE to add the weight
 *   gradient into main_grad, %FALSE to overwrite main_grad with it
 * @n_groups: the number of groups of the layer
 * @error: return location for a #GError
 *
 * Chooses, per group, how fused accumulation treats main_grad. The mask
 * holds for every later weight-gradient computation, until changed; it starts
 * as all %TRUE. Without fused accumulation it has no effect.
 *
 * Returns: %TRUE on success; %FALSE with %GMLP_ERROR_INVALID_ARGUMENT if
 *   @n_groups is not the layer's
 *
 * Since: 0.1
 */
gboolean
gmlp_grouped_linear_set_wgrad_accumulation_mask (GmlpGroupedLinear  *self,
                                                 const gboolean     *accumulate,
                                                 guint               n_groups,
                                                 GError            **error)
{
  guint g;

  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), FALSE);
  g_return_val_if_fail (accumulate != NULL || n_groups == 0, FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_check_constructed (self, self->construct_error, error))
    return FALSE;

  if (n_groups != self->n_groups)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "The mask has %u entries; the layer has %u groups", n_groups, self->n_groups);
      return FALSE;
    }
  gmlp_rec_mutex_lock (&self->grad_lock);
  for (g = 0; g < n_groups; g++)
    self->accumulate[g] = accumulate[g] ? 1 : 0;
  gmlp_rec_mutex_unlock (&self->grad_lock);
  return TRUE;
}

static gboolean
check_main_grad (GmlpGroupedLinear  *self,
                 GmlpGroupedTensor  *main_grad,
                 guint               n_groups,
                 GmlpLinearFlags     single,
                 GError            **error)
{
  guint g;

  if (!has_flag (self, GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE,
                   "main_grad is only used with fuse-wgrad-accumulation");
      return FALSE;
    }
  if ((self->flags & GMLP_LINEAR_SINGLE_GROUPED_WEIGHT) != single)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE, single ?
                   "Per-group weights: bind main_grad with set_main_grad_member()" :
                   "Single grouped weight: bind main_grad with set_main_grad()");
      return FALSE;
    }
  if (gmlp_grouped_tensor_get_device (main_grad) != self->device)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "main_grad must be on the layer's device");
      return FALSE;
    }
  if (gmlp_grouped_tensor_get_dtype (main_grad) != GMLP_DTYPE_FLOAT32)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_DTYPE_MISMATCH,
                   "main_grad must be float32, not %s",
                   gmlp_dtype_get_name (gmlp_grouped_tensor_get_dtype (main_grad)));
      return FALSE;
    }
  if (gmlp_grouped_tensor_get_n_groups (main_grad) != n_groups ||
      !gmlp_grouped_tensor_has_host_sizes (main_grad) ||
      gmlp_grouped_tensor_get_cols (main_grad) != self->in_features)
    goto mismatch;
  for (g = 0; g < n_groups; g++)
    if (gmlp_grouped_tensor_get_rows (main_grad, g) != self->out_features)
      goto mismatch;
  return TRUE;

mismatch:
  g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
               "main_grad must have %u member(s) of %" G_GINT64_FORMAT " × %" G_GINT64_FORMAT,
               n_groups, self->out_features, self->in_features);
  return FALSE;
}

/* Backward adds into main_grad: it may not share a byte with what the layer
 * keeps (it would add dW into W), nor, per group, with another group's
 * main_grad (@index; G_MAXUINT for a grouped main_grad). */
static gboolean
check_main_grad_storage (GmlpGroupedLinear  *self,
                         GmlpGroupedTensor  *main_grad,
                         guint               index,
                         GError            **error)
{
  const struct { Param *param; const char *name; } kept[] = {
    { &self->weight, "weight" }, { &self->bias, "bias" },
    { &self->wgrad, "weight gradient" }, { &self->bgrad, "bias gradient" },
  };
  guint i, g;

  for (i = 0; i < G_N_ELEMENTS (kept); i++)
    if (kept[i].param->grouped != NULL && gmlp_grouped_tensor_overlaps (main_grad, kept[i].param->grouped))
      {
        g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                     "main_grad shares storage with the layer's %s: backward would add the "
                     "weight gradient into it", kept[i].name);
        return FALSE;
      }
  for (g = 0; index != G_MAXUINT && g < self->n_groups; g++)
    if (g != index && gmlp_grouped_tensor_overlaps (main_grad, self->main_grad.members[g]))
      {
        g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                     "This main_grad shares storage with the main_grad of group %u: the two "
                     "groups' weight gradients would be added into the same values", g);
        return FALSE;
      }
  return TRUE;
}

/* A weight-gradient computation writes wgrad (or main_grad) and bgrad
 * while it reads the input and the output gradient (@read, the records of
 * what it reads, and @also when not NULL): those may not share a byte. */
static gboolean
check_wgrad_outputs_unaliased (GmlpGroupedLinear  *self,
                               GArray             *read,
                               GmlpGroupedTensor  *also,
                               GError            **error)
{
  gboolean fused = has_flag (self, GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION);
  gboolean per_group = fused && !has_flag (self, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT);
  GmlpSpan also_span = { NULL, 0, 0 };
  guint i, n = per_group ? self->n_groups : 1;

  if (also != NULL)
    gmlp_grouped_tensor_get_span (also, &also_span);
  /* n outputs for dW (one per group for per-group main_grads), then db. */
  for (i = 0; i <= n; i++)
    {
      GmlpGroupedTensor *out;
      const GmlpVersionRecord *record;
      const char *what;
      GmlpSpan span;

      if (i == n)
        {
          out = self->bgrad.grouped;
          what = "The bias gradient";
        }
      else if (fused)
        {
          out = per_group ? self->main_grad.members[i] : self->main_grad.grouped;
          what = "main_grad";
        }
      else
        {
          out = self->wgrad.grouped;
          what = "The weight gradient";
        }
      if (out == NULL)
        continue;
      gmlp_grouped_tensor_get_span (out, &span);
      record = gmlp_version_records_find_overlap (read, &span);
      if (record != NULL || gmlp_spans_overlap (&span, &also_span))
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                       "%s shares storage with the %s, which the weight-gradient computation "
                       "reads while it writes %s", what,
                       record != NULL ? record->name : "output gradient",
                       i == n || !fused ? "it" : "main_grad");
          return FALSE;
        }
    }
  return TRUE;
}

/**
 * gmlp_grouped_linear_set_main_grad:
 * @self: a #GmlpGroupedLinear with fused accumulation and a single grouped
 *   weight
 * @main_grad: a float32 grouped tensor of `n_groups` members of
 *   `out_features × in_features` on the layer's device
 * @error: return location for a #GError
 *
 * Makes fused accumulation add into @main_grad (for example a slice of an
 * optimizer's flat gradient buffer) instead of the layer's own. It may not
 * share storage with the layer's weights, biases or their gradients; and a
 * backward refuses to add into a main_grad that shares storage with what it
 * reads (the forward's input, the output gradient).
 *
 * Returns: %TRUE on success; %FALSE with %GMLP_ERROR_INVALID_STATE when the
 *   layer does not fuse accumulation or has per-group weights,
 *   %GMLP_ERROR_INVALID_ARGUMENT for a @main_grad that shares storage with
 *   the layer's parameters or their gradients, or a shape or dtype error
 *
 * Since: 0.1
 */
gboolean
gmlp_grouped_linear_set_main_grad (GmlpGroupedLinear  *self,
                                   GmlpGroupedTensor  *main_grad,
                                   GError            **error)
{
  g_autoptr(GmlpRecMutexLocker) locker = NULL;

  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), FALSE);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (main_grad), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_check_constructed (self, self->construct_error, error) ||
      !gmlp_grouped_tensor_check_usable (main_grad, error))
    return FALSE;

  locker = gmlp_rec_mutex_locker_new (&self->grad_lock);
  if (!check_main_grad (self, main_grad, self->n_groups, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT, error) ||
      !check_main_grad_storage (self, main_grad, G_MAXUINT, error))
    return FALSE;
  return gmlp_linear_param_set (&self->main_grad, main_grad, self->n_groups, error);
}

/**
 * gmlp_grouped_linear_set_main_grad_member:
 * @self: a #GmlpGroupedLinear with fused accumulation and per-group weights
 * @index: the group
 * @main_grad: a one-member float32 tensor of `out_features × in_features` on
 *   the layer's device; it may be any allocation
 * @error: return location for a #GError
 *
 * Makes fused accumulation of group @index add into @main_grad, which may
 * not share storage with another group's main_grad either.
 *
 * Returns: %TRUE on success, or %FALSE with an error as for
 *   [method@Gmlp.GroupedLinear.set_main_grad], or
 *   %GMLP_ERROR_INVALID_ARGUMENT for an @index out of range or a
 *   @main_grad that shares storage with another group's
 *
 * Since: 0.1
 */
gboolean
gmlp_grouped_linear_set_main_grad_member (GmlpGroupedLinear  *self,
                                          guint               index,
                                          GmlpGroupedTensor  *main_grad,
                                          GError            **error)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), FALSE);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (main_grad), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_check_constructed (self, self->construct_error, error) ||
      !gmlp_grouped_tensor_check_usable (main_grad, error))
    return FALSE;

  if (!check_main_grad (self, main_grad, 1, 0, error))
    return FALSE;
  if (index >= self->n_groups)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "Group %u out of range: the layer has %u", index, self->n_groups);
      return FALSE;
    }
  if (!check_main_grad_storage (self, main_grad, index, error))
    return FALSE;

  gmlp_rec_mutex_lock (&self->grad_lock);
  gmlp_linear_param_rebind (&self->main_grad, index, main_grad);
  gmlp_rec_mutex_unlock (&self->grad_lock);
  return TRUE;
}

/* Checks an activation (input or grad_output) of the layer. */
static gboolean
check_activation (GmlpGroupedLinear  *self,
                  GmlpGroupedTensor  *tensor,
                  gint64              cols,
                  const char         *what,
                  GError            **error)
{
  if (!gmlp_linear_check_activation_device (self, tensor, what, error))
    return FALSE;
  if (gmlp_grouped_tensor_get_dtype (tensor) != self->dtype)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_DTYPE_MISMATCH,
                   "%s is %s; the layer computes in %s", what,
                   gmlp_dtype_get_name (gmlp_grouped_tensor_get_dtype (tensor)),
                   gmlp_dtype_get_name (self->dtype));
      return FALSE;
    }
  return gmlp_linear_check_activation_shape (self, tensor, cols, what, error);
}

/**
 * gmlp_grouped_linear_forward:
 * @self: a #GmlpGroupedLinear
 * @input: `x`: `n_groups` members of `rows_i × in_features`, of the layer's
 *   dtype, on its device; group sizes on the host, or only on the device
 * @saved: (out) (transfer full) (optional): what backward needs; pass it to
 *   [method@Gmlp.GroupedLinear.backward]
 * @error: return location for a #GError
 *
 * Computes `y_i = x_i W_iᵀ (+ b_i)` for every group, enqueued on the
 * device's stream. Groups with no rows are valid and produce no rows.
 *
 * When @input has its group sizes only on the device (see
 * [ctor@Gmlp.GroupedTensor.new_with_device_sizes]), so does the output: it
 * shares @input's sizes tensor and row capacity, and the call neither reads
 * the sizes on the host nor waits for the device.
 *
 * A forward writes no tensor but its output. One that fails after an FP8
 * quantization (for want of memory, or a device error) leaves the amax it
 * recorded in a delayed-scaling quantizer; a retry records the same.
 *
 * Returns: (transfer full): the output, `rows_i × out_features` per group, or
 *   %NULL with %GMLP_ERROR_SHAPE_MISMATCH, %GMLP_ERROR_DTYPE_MISMATCH,
 *   %GMLP_ERROR_INVALID_ARGUMENT or %GMLP_ERROR_UNSUPPORTED (nothing is
 *   written then)
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_linear_forward (GmlpGroupedLinear     *self,
                             GmlpGroupedTensor     *input,
                             GmlpSavedActivations **saved,
                             GError               **error)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), NULL);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (input), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!gmlp_check_constructed (self, self->construct_error, error) ||
      !gmlp_grouped_tensor_check_usable (input, error))
    return NULL;

  return gmlp_grouped_linear_forward_full (self, input, TRUE, saved, error);
}

GmlpGroupedTensor *
gmlp_grouped_linear_forward_full (GmlpGroupedLinear     *self,
                                  GmlpGroupedTensor     *input,
                                  gboolean               save_input,
                                  GmlpSavedActivations **saved,
                                  GError               **error)
{
  g_autoptr(GmlpGroupedTensor) output = NULL;
  Product fprop = { .kind = GMLP_GEMM_FPROP, .sized_by = input, .a = input, .fixed = &self->weight,
                    .c_dtype = self->dtype, .bias = self->bias.grouped != NULL };

  if (saved != NULL)
    *saved = NULL;
  /* FP8: with quantizers, or for an input that is quantized already. */
  if (self->input_quantizer != NULL || gmlp_dtype_is_fp8 (gmlp_grouped_tensor_get_dtype (input)))
    return gmlp_linear_fp8_forward (self, input, save_input, saved, error);
  if (gmlp_linear_splits (self, input))
    {
      if (!gmlp_linear_check_activation_device (self, input, "The input", error) ||
          !gmlp_linear_check_activation_shape (self, input, self->in_features, "The input", error) ||
          !gmlp_linear_check_split_input (self, input, error))
        return NULL;
    }
  else if (!check_activation (self, input, self->in_features, "The input", error))
    {
      return NULL;
    }
  if (!gmlp_linear_check_offload_context (self, error))
    return NULL;

  output = gmlp_linear_new_activation_like (self, input, self->out_features, error);
  if (output == NULL)
    return NULL;
  fprop.c_rows = output;
  if (!gmlp_linear_run_product (self, &fprop, error))
    return NULL;

  if (saved != NULL)
    {
      g_autoptr(GmlpSavedActivations) new_saved = gmlp_saved_activations_new (self->id);

      if (save_input)
        gmlp_saved_activations_add (new_saved, "input", input);
      /* DGRAD reads the weights as they are at the backward. */
      gmlp_saved_activations_watch (new_saved, "weight", self->weight.grouped);
      if (!gmlp_saved_activations_apply_offload (new_saved, error))
        return NULL;
      *saved = g_steal_pointer (&new_saved);
    }

  return g_steal_pointer (&output);
}

/* Makes sure the outputs of a weight-gradient computation exist, before
 * anything is enqueued. The storage persists across computations. */
static gboolean
ensure_wgrad_storage (GmlpGroupedLinear  *self,
                      GError            **error)
{
  if (!has_flag (self, GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION) && self->wgrad.grouped == NULL)
    {
      g_autoptr(GmlpGroupedTensor) wgrad = new_uniform (self, self->dtype, self->out_features,
                                                        self->in_features, error);
      if (wgrad == NULL || !gmlp_linear_param_set (&self->wgrad, wgrad, self->n_groups, error))
        return FALSE;
      g_assert (gmlp_grouped_tensor_get_member_offset (wgrad, self->n_groups - 1) %
                GMLP_MEMBER_ALIGNMENT == 0);
    }
  if (self->bias.grouped != NULL && self->bgrad.grouped == NULL)
    {
      g_autoptr(GmlpGroupedTensor) bgrad = new_uniform (self, self->dtype, 1, self->out_features, error);
      if (bgrad == NULL || !gmlp_linear_param_set (&self->bgrad, bgrad, self->n_groups, error))
        return FALSE;
    }
  return TRUE;
}

/* One weight-gradient computation: dW = dyᵀ x (into wgrad or main_grad) and
 * db = Σ dy, then wgrad-ready. FP8 (grad_output_fp8 given): input is
 * quantized too, grad_output, the unquantized dy, may be NULL, and
 * @fp8_operands holds what gmlp_linear_fp8_wgrad_prepare() made (it makes
 * what is missing). What can fail for want of memory fails before the first
 * write, but for the dequantized operands of an FP8 product that the device
 * turns down at run time (no kernel for it there); after the first write
 * only the backend can fail, and the gradients are then unspecified. */
static gboolean wgrad_done (GmlpGroupedLinear  *self,
                            GError            **error);

/* dW = dyᵀ x into wgrad, or into main_grad with fused accumulation. */
static Product
wgrad_product (GmlpGroupedLinear  *self,
               GmlpGroupedTensor  *input,
               GmlpGroupedTensor  *grad_output,
               const guint8       *accumulate)
{
  gboolean fused = has_flag (self, GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION);

  return (Product) {
    .kind = GMLP_GEMM_WGRAD,
    .sized_by = input,
    .a = grad_output,
    .b_rows = input,
    .fixed = fused ? &self->main_grad : &self->wgrad,
    .c_dtype = fused ? GMLP_DTYPE_FLOAT32 : self->dtype,
    .accumulate = accumulate,
  };
}

static gboolean
compute_wgrad (GmlpGroupedLinear  *self,
               GmlpGroupedTensor  *input,
               GmlpGroupedTensor  *grad_output,
               GmlpGroupedTensor  *grad_output_fp8,
               Fp8WgradOperands   *fp8_operands,
               GmlpGroupedTensor **dy_parts,
               GError            **error)
{
  Product wgrad = wgrad_product (self, input, grad_output,
                                 has_flag (self, GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION) ? self->accumulate : NULL);

  wgrad.dy_parts = dy_parts;
  if (grad_output_fp8 != NULL)
    {
      if (!gmlp_linear_fp8_wgrad (self, &wgrad, input, grad_output, grad_output_fp8, fp8_operands,
                                  error))
        return FALSE;
    }
  else
    {
      gmlp_linear_bump_wgrad_versions (self);
      if (!gmlp_linear_run_product (self, &wgrad, error) ||
          (self->bias.grouped != NULL &&
           !gmlp_linear_run_bias_grad (self, input, grad_output, error)))
        return FALSE;
    }

  return wgrad_done (self, error);
}

/* Groups [g0, g1) of a chunked weight-gradient computation: the input and
 * dy have rows in those groups only, so the other groups' products have no
 * rows, and with accumulate 1 they leave their gradients as they are
 * (GmlpBackendGemm); the bias gradient's other groups go to a scratch. */
static gboolean
wgrad_range (GmlpGroupedLinear  *self,
             GmlpGroupedTensor  *input,
             GmlpGroupedTensor  *grad_output,
             guint               g0,
             guint               g1,
             GmlpGroupedTensor  *scratch,
             GError            **error)
{
  gboolean fused = has_flag (self, GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION);
  g_autofree guint8 *accumulate = g_malloc (self->n_groups);
  Product wgrad = wgrad_product (self, input, grad_output, accumulate);
  g_autofree gpointer *pdb = NULL;
  guint g;

  for (g = 0; g < self->n_groups; g++)
    accumulate[g] = g < g0 || g >= g1 ? 1 : fused ? self->accumulate[g] : 0;
  if (!gmlp_linear_run_product (self, &wgrad, error))
    return FALSE;
  if (self->bias.grouped == NULL)
    return TRUE;
  pdb = g_new (gpointer, self->n_groups);
  for (g = 0; g < self->n_groups; g++)
    pdb[g] = g < g0 || g >= g1 ? gmlp_grouped_tensor_get_data (scratch) : self->bgrad.table[g];
  return gmlp_linear_run_bias_grad_into (self, input, grad_output, (void * const *) pdb, error);
}

/* One weight-gradient computation of a chunked backward: chunk c's input
 * and dy (@inputs[c], @grad_outputs[c]) for groups [bounds[c],
 * bounds[c + 1]). Each group's product is the one an unchunked backward
 * computes from the same rows. */
static gboolean
compute_wgrad_chunks (GmlpGroupedLinear  *self,
                      GmlpGroupedTensor **inputs,
                      GmlpGroupedTensor **grad_outputs,
                      const guint        *bounds,
                      guint               n_chunks,
                      GError            **error)
{
  g_autoptr(GmlpGroupedTensor) scratch = NULL;
  guint c;

  /* Allocated before the first write. */
  if (self->bias.grouped != NULL)
    {
      scratch = gmlp_grouped_tensor_new_uniform (self->device, self->dtype, 1, 1, self->out_features, error);
      if (scratch == NULL)
        return FALSE;
    }
  gmlp_linear_bump_wgrad_versions (self);
  for (c = 0; c < n_chunks; c++)
    if (!wgrad_range (self, inputs[c], grad_outputs[c], bounds[c], bounds[c + 1], scratch, error))
      return FALSE;
  return wgrad_done (self, error);
}

/* The end of a weight-gradient computation: the flags, wgrad-ready. */
static gboolean
wgrad_done (GmlpGroupedLinear  *self,
            GError            **error)
{
  gboolean fused = has_flag (self, GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION);
  g_autoptr(GmlpEvent) event = NULL;

  if (!gmlp_grouped_linear_record_wgrad_ready (self, &event, error))
    return FALSE;

  self->wgrad_valid = !fused;
  if (self->grad_added_to_main_grad != fused)
    {
      self->grad_added_to_main_grad = fused;
      gmlp_grouped_linear_notify (self, PROP_GRAD_ADDED_TO_MAIN_GRAD);
    }
  gmlp_grouped_linear_emit_wgrad_ready (self, event);
  return TRUE;
}

/* The output gradient must have the group sizes of the forward's input:
 * the same host sizes, or device-only sizes in a tensor of the same row
 * capacity (their values cannot be compared without waiting for the
 * device: that is the caller's promise). */
static gboolean
check_same_sizes (GmlpGroupedTensor  *input,
                  GmlpGroupedTensor  *grad_output,
                  GError            **error)
{
  gboolean input_on_host = gmlp_grouped_tensor_has_host_sizes (input);
  guint g;

  if (input_on_host != gmlp_grouped_tensor_has_host_sizes (grad_output))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "The output gradient has its group sizes %s, the forward input %s; "
                   "both must have them in the same place",
                   input_on_host ? "only on the device" : "on the host",
                   input_on_host ? "on the host" : "only on the device");
      return FALSE;
    }

  if (!input_on_host)
    {
      if (gmlp_grouped_tensor_get_row_capacity (input) !=
          gmlp_grouped_tensor_get_row_capacity (grad_output))
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
                       "The output gradient has a row capacity of %" G_GINT64_FORMAT
                       ", the forward input %" G_GINT64_FORMAT "; with device sizes they "
                       "must be the same", gmlp_grouped_tensor_get_row_capacity (grad_output),
                       gmlp_grouped_tensor_get_row_capacity (input));
          return FALSE;
        }
      return TRUE;
    }

  for (g = 0; g < gmlp_grouped_tensor_get_n_groups (input); g++)
    if (gmlp_grouped_tensor_get_rows (input, g) != gmlp_grouped_tensor_get_rows (grad_output, g))
      {
        g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
                     "The output gradient's group sizes differ from the forward input's");
        return FALSE;
      }
  return TRUE;
}

/**
 * gmlp_grouped_linear_backward:
 * @self: a #GmlpGroupedLinear
 * @saved: what the forward returned; consumed by this call
 * @grad_output: `dy`: the gradient of the forward's output, of its shape and
 *   the layer's dtype
 * @error: return location for a #GError
 *
 * Computes the input gradient `dx_i = dy_i W_i`, and the weight gradients as
 * the gradient contract of [class@Gmlp.GroupedLinear] says: now, or queued
 * for [method@Gmlp.GroupedLinear.backward_dw] when delayed. Enqueued on the
 * device's stream; no host synchronisation.
 *
 * If the forward's input had its group sizes only on the device, @grad_output
 * must too, with the same row capacity, and the input gradient shares the
 * input's sizes tensor. The values of the sizes cannot be compared on the
 * host without waiting for the device, so they are the caller's promise:
 * @grad_output's sizes must hold the forward's values, and the sizes tensor
 * of the forward's input must not change until this backward (and, with
 * [property@Gmlp.GroupedLinear:delay-wgrad-compute], its backward_dw) has
 * been enqueued. The products follow the forward input's sizes; different
 * values give wrong gradients, but nothing outside the tensors is touched.
 *
 * The forward's input and the weights must not have been written since the
 * forward (their versions, see [method@Gmlp.GroupedTensor.get_version]):
 * the gradients would not be those of the forward. That holds with or
 * without an [class@Gmlp.OffloadContext], although an offloaded input is
 * read from its copy.
 *
 * Everything is checked, and everything allocated, before anything is
 * written; a backward that fails leaves @saved unused, so it can be
 * retried. Only a device error while the weight gradients are written (a
 * CUDA launch that fails) leaves them unspecified.
 *
 * Returns: (transfer full): the input gradient, or %NULL with
 *   %GMLP_ERROR_INVALID_ARGUMENT for activations of another layer, an
 *   output gradient whose sizes are on the host when the input's were not
 *   (or the other way round) or a main_grad that shares storage with the
 *   input or the output gradient, %GMLP_ERROR_INVALID_STATE for activations
 *   already used or an input or weights written since the forward,
 *   %GMLP_ERROR_SHAPE_MISMATCH for other group sizes or another row
 *   capacity, or a dtype or device error (nothing is written then)
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_linear_backward (GmlpGroupedLinear     *self,
                              GmlpSavedActivations  *saved,
                              GmlpGroupedTensor     *grad_output,
                              GError               **error)
{
  g_autoptr(GmlpLinearBackward) step = NULL;
  g_autoptr(GmlpRecMutexLocker) locker = NULL;

  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), NULL);
  g_return_val_if_fail (GMLP_IS_SAVED_ACTIVATIONS (saved), NULL);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (grad_output), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!gmlp_check_constructed (self, self->construct_error, error) ||
      !gmlp_grouped_tensor_check_usable (grad_output, error))
    return NULL;

  /* One backward at a time: it writes the weight gradients, and it uses up
   * its saved activations (a second use is refused, not raced). */
  locker = gmlp_rec_mutex_locker_new (&self->grad_lock);
  step = gmlp_grouped_linear_backward_begin (self, saved, grad_output, "GroupedLinear", error);
  if (step == NULL || !gmlp_grouped_linear_backward_dgrad (self, step, error))
    return NULL;
  return gmlp_grouped_linear_backward_finish (self, step, error);
}

void
gmlp_linear_backward_free (GmlpLinearBackward *step)
{
  g_clear_object (&step->saved);
  g_clear_object (&step->input);
  g_clear_object (&step->w8);
  g_clear_object (&step->grad_output);
  g_clear_object (&step->grad_output_fp8);
  gmlp_linear_fp8_wgrad_operands_clear (&step->fp8_operands);
  g_clear_object (&step->grad_input);
  g_clear_object (&step->dy_parts);
  g_free (step);
}

GmlpGroupedTensor *
gmlp_linear_backward_get_grad_input (GmlpLinearBackward *step)
{
  return step->grad_input;
}

/* Whether @quantizer can quantize @n_groups groups: a delayed-scaling one
 * keeps its scales for one number of groups (it makes them at its first
 * use, as the quantization would). */
static gboolean
check_quantizer_state (GmlpQuantizer  *quantizer,
                       guint           n_groups,
                       GError        **error)
{
  float *state;
  gboolean fits;

  gmlp_quantizer_lock_state (quantizer);
  fits = gmlp_quantizer_get_state_for (quantizer, n_groups, &state, error);
  gmlp_quantizer_unlock_state (quantizer);
  return fits;
}

/* The checks of a backward's begin (gmlp-grouped-linear-private.h), which
 * write nothing: the saved activations and what their forward read, the
 * output gradient against the forward's operands (for an FP8 forward, the
 * quantizer it needs now and the recipes it must meet), main_grad's storage.
 * Gives the saved input (reloaded when offloaded) and the FP8 forward's
 * quantized weights (transfer none; NULL for a forward that was not FP8). */
static gboolean
check_backward (GmlpGroupedLinear     *self,
                GmlpSavedActivations  *saved,
                GmlpGroupedTensor     *grad_output,
                const char            *label,
                GmlpGroupedTensor    **input_out,
                GmlpGroupedTensor    **w8_out,
                GError               **error)
{
  GmlpGroupedTensor *input, *w8 = NULL;

  if (!gmlp_saved_activations_check (saved, self->id, "GroupedLinear", error) ||
      !gmlp_saved_activations_check_versions (saved, label, error))
    return FALSE;
  /* FP8: whatever the layer's quantizers are now, the forward was. Its
   * quantized weights stay on the device: getting them reloads nothing. */
  if (gmlp_saved_activations_contains (saved, "weight-fp8"))
    {
      w8 = gmlp_saved_activations_get (saved, "weight-fp8", error);
      if (w8 == NULL ||
          !gmlp_linear_fp8_check_activation (self, grad_output, self->out_features,
                                             "The output gradient", self->grad_output_quantizer,
                                             "DGRAD", w8, NULL, error))
        return FALSE;
      /* dgrad quantizes an output gradient given unquantized. */
      if (!gmlp_dtype_is_fp8 (gmlp_grouped_tensor_get_dtype (grad_output)) &&
          !check_quantizer_state (self->grad_output_quantizer, self->n_groups, error))
        return FALSE;
    }
  else if (!check_activation (self, grad_output, self->out_features, "The output gradient", error))
    {
      return FALSE;
    }

  input = gmlp_saved_activations_get (saved, "input", error);
  if (input == NULL)
    return FALSE;
  if ((w8 != NULL &&
       !gmlp_linear_fp8_check_activation (self, grad_output, self->out_features,
                                          "The output gradient", self->grad_output_quantizer,
                                          "WGRAD", input, NULL, error)) ||
      !check_same_sizes (input, grad_output, error))
    return FALSE;
  /* A delayed weight gradient checks its outputs in its backward_dw. */
  if (!has_flag (self, GMLP_LINEAR_DELAY_WGRAD_COMPUTE) &&
      !check_wgrad_outputs_unaliased (self, gmlp_saved_activations_get_versions (saved), grad_output, error))
    return FALSE;

  *input_out = input;
  *w8_out = w8;
  return TRUE;
}

gboolean
gmlp_grouped_linear_check_backward (GmlpGroupedLinear     *self,
                                    GmlpSavedActivations  *saved,
                                    GmlpGroupedTensor     *grad_output,
                                    const char            *label,
                                    GError               **error)
{
  g_autoptr(GmlpRecMutexLocker) locker = gmlp_rec_mutex_locker_new (&self->grad_lock);
  GmlpGroupedTensor *input, *w8;

  return check_backward (self, saved, grad_output, label, &input, &w8, error);
}

gboolean
gmlp_grouped_linear_check_wgrad_outputs (GmlpGroupedLinear  *self,
                                         GPtrArray          *reads,
                                         GmlpGroupedTensor  *also,
                                         const char         *label,
                                         GError            **error)
{
  g_autoptr(GmlpRecMutexLocker) locker = gmlp_rec_mutex_locker_new (&self->grad_lock);
  guint i;

  for (i = 0; i < reads->len; i++)
    if (!check_wgrad_outputs_unaliased (self, g_ptr_array_index (reads, i), also, error))
      {
        g_prefix_error (error, "%s: ", label);
        return FALSE;
      }
  return TRUE;
}

/* backward_begin; @fp32: a split input's gradient in FP32 (begin_fp32). */
static GmlpLinearBackward *
backward_begin (GmlpGroupedLinear     *self,
                GmlpSavedActivations  *saved,
                GmlpGroupedTensor     *grad_output,
                gboolean               fp32,
                const char            *label,
                GError               **error)
{
  g_autoptr(GmlpLinearBackward) step = NULL;
  g_autoptr(GmlpGroupedTensor) grad_input = NULL;
  GmlpGroupedTensor *input, *w8;

  if (!check_backward (self, saved, grad_output, label, &input, &w8, error))
    return NULL;
  if (gmlp_saved_activations_get_context (saved) != NULL)
    gmlp_offload_context_backward_started (gmlp_saved_activations_get_context (saved), saved);

  /* A split input's gradient is BF16, or its FP32 sum. */
  if (gmlp_linear_splits (self, input))
    grad_input = gmlp_linear_split_grad_input (self, input, fp32, error);
  else
    grad_input = gmlp_linear_new_activation_like (self, input, self->in_features, error);
  if (grad_input == NULL || !ensure_wgrad_storage (self, error))
    return NULL;

  step = g_new0 (GmlpLinearBackward, 1);
  step->saved = g_object_ref (saved);
  step->input = g_object_ref (input);
  step->w8 = w8 != NULL ? g_object_ref (w8) : NULL;
  step->grad_output = g_object_ref (grad_output);
  step->grad_input = g_steal_pointer (&grad_input);
  return g_steal_pointer (&step);
}

GmlpLinearBackward *
gmlp_grouped_linear_backward_begin (GmlpGroupedLinear     *self,
                                    GmlpSavedActivations  *saved,
                                    GmlpGroupedTensor     *grad_output,
                                    const char            *label,
                                    GError               **error)
{
  return backward_begin (self, saved, grad_output, FALSE, label, error);
}

GmlpLinearBackward *
gmlp_grouped_linear_backward_begin_fp32 (GmlpGroupedLinear     *self,
                                         GmlpSavedActivations  *saved,
                                         GmlpGroupedTensor     *grad_output,
                                         const char            *label,
                                         GError               **error)
{
  return backward_begin (self, saved, grad_output, TRUE, label, error);
}

gboolean
gmlp_grouped_linear_backward_dgrad (GmlpGroupedLinear   *self,
                                    GmlpLinearBackward  *step,
                                    GError             **error)
{
  Product dgrad = {
    .kind = GMLP_GEMM_DGRAD,
    .sized_by = step->input,
    .a = step->grad_output,
    .c_rows = step->grad_input,
    .fixed = &self->weight,
    .c_dtype = gmlp_grouped_tensor_get_dtype (step->grad_input),
    .dy_parts = &step->dy_parts,
  };

  if (step->w8 != NULL)
    return gmlp_linear_fp8_dgrad (self, step, error);
  return gmlp_linear_run_product (self, &dgrad, error);
}

GmlpGroupedTensor *
gmlp_grouped_linear_backward_finish (GmlpGroupedLinear   *self,
                                     GmlpLinearBackward  *step,
                                     GError             **error)
{
  GmlpGroupedTensor *unquantized = step->grad_output;

  if (gmlp_dtype_is_fp8 (gmlp_grouped_tensor_get_dtype (step->grad_output)))
    unquantized = NULL;
  if (has_flag (self, GMLP_LINEAR_DELAY_WGRAD_COMPUTE))
    {
      PendingWgrad *pending = g_new0 (PendingWgrad, 1);

      pending->input = g_object_ref (step->input);
      pending->grad_output = unquantized != NULL ? g_object_ref (unquantized) : NULL;
      pending->grad_output_fp8 = step->grad_output_fp8 != NULL ? g_object_ref (step->grad_output_fp8) : NULL;
      pending->fp8_operands = (Fp8WgradOperands) { NULL, NULL, NULL };
      /* The weight gradient reads the input (as the forward saw it) and dy. */
      pending->versions = gmlp_version_records_new ();
      gmlp_saved_activations_copy_versions (step->saved, "input", pending->versions);
      gmlp_version_records_add (pending->versions, "output gradient", "backward", step->grad_output);
      g_queue_push_tail (&self->pending, pending);
      gmlp_grouped_linear_notify (self, PROP_PENDING_WGRADS);
    }
  else if (!compute_wgrad (self, step->input, unquantized, step->grad_output_fp8,
                           &step->fp8_operands, &step->dy_parts, error))
    {
      return NULL;
    }

  gmlp_saved_activations_consume (step->saved);
  return g_object_ref (step->grad_input);
}

gboolean
gmlp_grouped_linear_backward_finish_chunks (GmlpGroupedLinear   *self,
                                            GmlpLinearBackward **steps,
                                            const guint         *bounds,
                                            guint                n_chunks,
                                            GmlpGroupedTensor  **grad_inputs,
                                            GError             **error)
{
  g_autofree GmlpGroupedTensor **inputs = g_new (GmlpGroupedTensor *, n_chunks);
  g_autofree GmlpGroupedTensor **dys = g_new (GmlpGroupedTensor *, n_chunks);
  g_autoptr(GmlpRecMutexLocker) locker = gmlp_rec_mutex_locker_new (&self->grad_lock);
  guint c;

  for (c = 0; c < n_chunks; c++)
    {
      g_return_val_if_fail (steps[c]->w8 == NULL && steps[c]->grad_output_fp8 == NULL, FALSE);
      inputs[c] = steps[c]->input;
      dys[c] = steps[c]->grad_output;
    }
  if (has_flag (self, GMLP_LINEAR_DELAY_WGRAD_COMPUTE))
    {
      PendingWgrad *pending = g_new0 (PendingWgrad, 1);

      pending->input = g_object_ref (inputs[0]);
      pending->grad_output = g_object_ref (dys[0]);
      pending->versions = gmlp_version_records_new ();
      pending->chunks = g_ptr_array_new_with_free_func (gmlp_object_unref_shared);
      pending->bounds = g_memdup2 (bounds, (n_chunks + 1) * sizeof (guint));
      for (c = 0; c < n_chunks; c++)
        {
          if (c > 0)
            {
              g_ptr_array_add (pending->chunks, g_object_ref (inputs[c]));
              g_ptr_array_add (pending->chunks, g_object_ref (dys[c]));
            }
          gmlp_saved_activations_copy_versions (steps[c]->saved, "input", pending->versions);
          gmlp_version_records_add (pending->versions, "output gradient", "backward", dys[c]);
        }
      g_queue_push_tail (&self->pending, pending);
      gmlp_grouped_linear_notify (self, PROP_PENDING_WGRADS);
    }
  else if (!compute_wgrad_chunks (self, inputs, dys, bounds, n_chunks, error))
    {
      return FALSE;
    }

  for (c = 0; c < n_chunks; c++)
    {
      gmlp_saved_activations_consume (steps[c]->saved);
      grad_inputs[c] = g_object_ref (steps[c]->grad_input);
    }
  return TRUE;
}

/* A delayed chunked computation's chunks, as compute_wgrad_chunks() takes
 * them. */
static gboolean
compute_pending_chunks (GmlpGroupedLinear  *self,
                        PendingWgrad       *pending,
                        GError            **error)
{
  guint n_chunks = pending->chunks->len / 2 + 1, c;
  g_autofree GmlpGroupedTensor **inputs = g_new (GmlpGroupedTensor *, n_chunks);
  g_autofree GmlpGroupedTensor **dys = g_new (GmlpGroupedTensor *, n_chunks);

  inputs[0] = pending->input;
  dys[0] = pending->grad_output;
  for (c = 1; c < n_chunks; c++)
    {
      inputs[c] = g_ptr_array_index (pending->chunks, 2 * (c - 1));
      dys[c] = g_ptr_array_index (pending->chunks, 2 * (c - 1) + 1);
    }
  return compute_wgrad_chunks (self, inputs, dys, pending->bounds, n_chunks, error);
}

void
gmlp_grouped_linear_add_pending_reads (GmlpGroupedLinear  *self,
                                       GPtrArray          *reads)
{
  g_autoptr(GmlpRecMutexLocker) locker = gmlp_rec_mutex_locker_new (&self->grad_lock);
  PendingWgrad *pending = g_queue_peek_head (&self->pending);

  if (pending != NULL)
    g_ptr_array_add (reads, pending->versions);
}

gboolean
gmlp_grouped_linear_backward_dw_prepare (GmlpGroupedLinear  *self,
                                         const char         *label,
                                         GError            **error)
{
  PendingWgrad *pending;

  if (!has_flag (self, GMLP_LINEAR_DELAY_WGRAD_COMPUTE))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE,
                   "%s: backward_dw() needs delay-wgrad-compute: backward() computed the weight "
                   "gradients", label);
      return FALSE;
    }
  if (g_queue_is_empty (&self->pending))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE,
                   "%s: no backward is waiting for its weight gradients", label);
      return FALSE;
    }
  pending = g_queue_peek_head (&self->pending);
  return gmlp_version_records_check (pending->versions, label, error) &&
         check_wgrad_outputs_unaliased (self, pending->versions, NULL, error) &&
         ensure_wgrad_storage (self, error) &&
         (pending->grad_output_fp8 == NULL ||
          gmlp_linear_fp8_wgrad_prepare (self, pending->input, pending->grad_output,
                                         pending->grad_output_fp8, &pending->fp8_operands,
                                         error));
}

/**
 * gmlp_grouped_linear_backward_dw:
 * @self: a #GmlpGroupedLinear with delayed weight gradients
 * @error: return location for a #GError
 *
 * Computes the weight gradients of the oldest backward still waiting for
 * them, as the gradient contract says, and emits
 * [signal@Gmlp.GroupedLinear::wgrad-ready].
 *
 * The input of that backward's forward and its output gradient must not
 * have been written since (see [method@Gmlp.GroupedTensor.get_version]);
 * the weights may have been: the weight gradients do not read them. A call
 * that fails leaves the computation pending and the gradients as they were,
 * but for a device error while they are written.
 *
 * Returns: %TRUE on success; %FALSE with %GMLP_ERROR_INVALID_STATE when the
 *   layer does not delay weight gradients, none is pending, or the input or
 *   the output gradient was written since, or
 *   %GMLP_ERROR_INVALID_ARGUMENT when main_grad shares storage with them
 *
 * Since: 0.1
 */
gboolean
gmlp_grouped_linear_backward_dw (GmlpGroupedLinear  *self,
                                 GError            **error)
{
  g_autoptr(GmlpRecMutexLocker) locker = NULL;
  PendingWgrad *pending;

  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_check_constructed (self, self->construct_error, error))
    return FALSE;

  locker = gmlp_rec_mutex_locker_new (&self->grad_lock);
  if (!gmlp_grouped_linear_backward_dw_prepare (self, "GroupedLinear", error))
    return FALSE;

  pending = g_queue_peek_head (&self->pending);
  if (pending->chunks != NULL ? !compute_pending_chunks (self, pending, error)
                              : !compute_wgrad (self, pending->input, pending->grad_output,
                                                pending->grad_output_fp8, &pending->fp8_operands,
                                                NULL, error))
    return FALSE;
  gmlp_linear_pending_wgrad_free (g_queue_pop_head (&self->pending));
  gmlp_grouped_linear_notify (self, PROP_PENDING_WGRADS);
  return TRUE;
}
