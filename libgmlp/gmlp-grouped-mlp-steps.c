/* gmlp-grouped-mlp-steps.c: what GmlpGroupedMLP computes
 *
 * The activation passes between the two layers (act, its gradient, and
 * act fused with the quantization of FC2's input under FP8), and forward,
 * backward and backward_dw across both layers: a backward checks both
 * layers before either writes. The object itself is gmlp-grouped-mlp.c
 * (gmlp-grouped-mlp-impl.h).
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-grouped-mlp-impl.h"
#include "gmlp-error.h"
#include "gmlp-error-private.h"
#include "gmlp-grouped-linear-private.h"
#include "gmlp-grouped-tensor-private.h"
#include "gmlp-quantize-numeric.h"
#include "gmlp-quantizer-private.h"
#include "gmlp-saved-activations-private.h"
#include "gmlp-thread-private.h"

/* The activation's result, of the sizes of @in: act(in) (forward), or the
 * gradient of in (@backward). With device-only sizes it shares in's sizes
 * tensor and row capacity, as GroupedLinear's outputs do. */
static GmlpGroupedTensor *
new_activation_output (GmlpGroupedMLP     *self,
                       GmlpGroupedTensor  *in,
                       gboolean            backward,
                       GError            **error)
{
  return gmlp_grouped_tensor_new_blocked (in, self->dtype, 1,
                                          backward ? gmlp_grouped_tensor_get_cols (in) : self->ffn_hidden,
                                          NULL, error);
}

/* act(in) into @out (forward), or the gradient of in from d_out; @out made
 * by new_activation_output(). Host sizes go to the backend's activation
 * with the members' pointers; device-only sizes to activation_device, which
 * finds the members on the device (the sizes of in serve for every operand:
 * d_out has the same values, which GroupedLinear's backward takes on the
 * caller's word, and the same capacity, which it checks). */
static gboolean
run_activation_into (GmlpGroupedMLP     *self,
                     GmlpGroupedTensor  *in,
                     GmlpGroupedTensor  *d_out,
                     GmlpGroupedTensor  *out,
                     GError            **error)
{
  const gint64 *rows = gmlp_grouped_tensor_peek_rows (in);
  g_autofree gpointer *pin = NULL, *pout = NULL, *pdout = NULL;
  GmlpBackendShape shape;
  guint g;

  if (rows == NULL)
    {
      if (!gmlp_grouped_tensor_get_backend_shape (in, &shape, error))
        return FALSE;
      shape.cols = self->ffn_hidden;
      return GMLP_DEVICE_CALL (self->device, activation_device, &shape, (int) self->activation,
                               (int) self->dtype, gmlp_grouped_tensor_get_data (in),
                               d_out != NULL ? gmlp_grouped_tensor_get_data (d_out) : NULL,
                               gmlp_grouped_tensor_get_data (out), error);
    }

  pin = g_new (gpointer, self->n_groups);
  pout = g_new (gpointer, self->n_groups);
  pdout = d_out != NULL ? g_new (gpointer, self->n_groups) : NULL;
  for (g = 0; g < self->n_groups; g++)
    {
      pin[g] = gmlp_grouped_tensor_get_member_data (in, g);
      pout[g] = gmlp_grouped_tensor_get_member_data (out, g);
      if (pdout != NULL)
        pdout[g] = gmlp_grouped_tensor_get_member_data (d_out, g);
    }

  return GMLP_DEVICE_CALL (self->device, activation, (int) self->activation, self->n_groups, rows,
                           self->ffn_hidden, (int) self->dtype, (const void * const *) pin,
                           (const void * const *) pdout, (void * const *) pout, error);
}

/* act(in) into a new tensor. */
static GmlpGroupedTensor *
run_activation (GmlpGroupedMLP     *self,
                GmlpGroupedTensor  *in,
                GError            **error)
{
  g_autoptr(GmlpGroupedTensor) out = new_activation_output (self, in, FALSE, error);

  if (out == NULL || !run_activation_into (self, in, NULL, out, error))
    return NULL;
  return g_steal_pointer (&out);
}

/* ---- FP8: the fused activation and quantization of FC2's input ---------- */

/* Keys of the MLP's saved activations with recompute: the quantizer FC2's
 * input was quantized by, and whether with the columnwise copy, so that the
 * backward recomputes the very tensor the forward multiplied. */
#define SAVED_FC2_INPUT_QUANTIZER  "gmlp-mlp-fc2-input-quantizer"
#define SAVED_FC2_INPUT_COLUMNWISE "gmlp-mlp-fc2-input-columnwise"

/* Whether a training forward writes the columnwise copy of FC2's input:
 * where FC2's weight gradient multiplies FP8 it reads the copy, as
 * GroupedLinear asks its own quantizers for it: with host sizes, per-tensor
 * and blockwise recipes (always here); with device-only sizes (those of
 * @input), where the FP8 products take the pair with FC2's output
 * gradient (per-tensor with per-tensor, blockwise with blockwise).
 * Otherwise only when the quantizer asks. */
static gboolean
fc2_input_wants_columnwise (GmlpGroupedMLP     *self,
                            GmlpQuantizer      *quantizer,
                            GmlpGroupedTensor  *input)
{
  GmlpQuantizer *weight = gmlp_grouped_linear_get_quantizer (self->fc2, GMLP_QUANTIZER_ROLE_WEIGHT);
  GmlpQuantizer *grad = gmlp_grouped_linear_get_quantizer (self->fc2, GMLP_QUANTIZER_ROLE_GRAD_OUTPUT);
  GmlpScalingRecipe recipe = gmlp_quantizer_get_recipe (quantizer), grad_recipe;

  if (gmlp_quantizer_get_columnwise (quantizer))
    return TRUE;
  if (weight == NULL || !gmlp_scaling_recipe_multiplies_fp8 (recipe) ||
      !gmlp_scaling_recipe_multiplies_fp8 (gmlp_quantizer_get_recipe (weight)))
    return FALSE;
  if (gmlp_grouped_tensor_has_host_sizes (input))
    return TRUE;
  if (grad == NULL)
    return FALSE;
  grad_recipe = gmlp_quantizer_get_recipe (grad);
  if (recipe == GMLP_SCALING_RECIPE_BLOCKWISE || grad_recipe == GMLP_SCALING_RECIPE_BLOCKWISE)
    return recipe == grad_recipe;
  return gmlp_scaling_recipe_multiplies_fp8 (grad_recipe);
}

/* act(h) quantized by @quantizer (with the columnwise copy when asked), in
 * one backend call: the tensor gmlp_quantizer_quantize_full() would make of
 * run_activation()'s output, bit for bit, with every part it carries. */
static GmlpGroupedTensor *
run_activation_quantize (GmlpGroupedMLP     *self,
                         GmlpGroupedTensor  *h,
                         GmlpQuantizer      *quantizer,
                         gboolean            with_columnwise,
                         GError            **error)
{
  GmlpScalingRecipe recipe = gmlp_quantizer_get_recipe (quantizer);
  GmlpDType fp8_dtype = gmlp_quantizer_get_dtype (quantizer);
  /* MXFP8's E8M0 scales are bytes, held in a one-byte dtype (as the
   * quantizer holds them). */
  GmlpDType scale_dtype = recipe == GMLP_SCALING_RECIPE_MXFP8 ? GMLP_DTYPE_FLOAT8_E4M3
                                                               : GMLP_DTYPE_FLOAT32;
  int flags = gmlp_quantizer_get_quantize_flags (quantizer);
  g_autoptr(GmlpGroupedTensor) data = NULL, scale_inv = NULL;
  g_autoptr(GmlpGroupedTensor) columnwise = NULL, columnwise_scale_inv = NULL, derived = NULL;
  gint64 block_rows, block_cols, col_block_rows, col_block_cols, derived_block;
  gboolean own_column_scales, ok;
  GmlpBackendShape shape;
  float *state = NULL;

  if (gmlp_quantizer_get_device (quantizer) != self->device)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "FC2's input quantizer is for %s, the MLP is on %s",
                   gmlp_device_get_name (gmlp_quantizer_get_device (quantizer)),
                   gmlp_device_get_name (self->device));
      return NULL;
    }
  gmlp_quant_blocks ((int) recipe, flags, FALSE, &block_rows, &block_cols);
  gmlp_quant_blocks ((int) recipe, flags, TRUE, &col_block_rows, &col_block_cols);
  own_column_scales = with_columnwise && gmlp_quant_columnwise_has_scales ((int) recipe, flags);
  derived_block = gmlp_quant_derived_row_block ((int) recipe, flags, with_columnwise);

  /* Laid out as the quantizer lays out its outputs; with device-only
   * sizes, scales in blocks of rows take their sizes from derived, which
   * the call writes. */
  if (!gmlp_grouped_tensor_has_host_sizes (h) && derived_block > 0)
    {
      gint64 n = self->n_groups;

      derived = gmlp_grouped_tensor_new (self->device, GMLP_DTYPE_INT64, &n, 1, 1, error);
      if (derived == NULL)
        return NULL;
    }
  data = gmlp_grouped_tensor_new_blocked (h, fp8_dtype, 1, self->ffn_hidden, NULL, error);
  if (data == NULL)
    return NULL;
  scale_inv = gmlp_grouped_tensor_new_blocked (h, scale_dtype, block_rows,
                                               gmlp_quant_blocks_along (self->ffn_hidden, block_cols),
                                               derived, error);
  if (scale_inv == NULL)
    return NULL;
  if (with_columnwise)
    {
      columnwise = gmlp_grouped_tensor_new_blocked (h, fp8_dtype, 1, self->ffn_hidden, NULL, error);
      if (columnwise == NULL)
        return NULL;
      if (own_column_scales)
        {
          columnwise_scale_inv = gmlp_grouped_tensor_new_blocked (h, scale_dtype, col_block_rows,
                                                                  gmlp_quant_blocks_along (self->ffn_hidden,
                                                                                           col_block_cols),
                                                                  derived, error);
          if (columnwise_scale_inv == NULL)
            return NULL;
        }
    }

  /* The sizes of h, which are those of every output; the shape's columns
   * are the activation's output's. */
  if (!gmlp_grouped_tensor_get_backend_shape (h, &shape, error))
    return NULL;
  shape.cols = self->ffn_hidden;
  /* The call records amaxes into a delayed-scaling state, which quantize
   * calls of other threads write too. */
  gmlp_quantizer_lock_state (quantizer);
  ok = gmlp_quantizer_get_state_for (quantizer, self->n_groups, &state, error);
  if (ok)
    {
      GmlpBackendQuantize quantize = {
        .shape = shape,
        .recipe = (int) recipe,
        .flags = flags,
        .fp8_dtype = (int) fp8_dtype,
        .src = gmlp_grouped_tensor_get_data (h),
        .src_dtype = (int) self->dtype,
        .activation = (int) self->activation,
        .data = gmlp_grouped_tensor_get_data (data),
        .scale_inv = gmlp_grouped_tensor_get_data (scale_inv),
        .columnwise = columnwise != NULL ? gmlp_grouped_tensor_get_data (columnwise) : NULL,
        .columnwise_scale_inv = columnwise_scale_inv != NULL ?
                                gmlp_grouped_tensor_get_data (columnwise_scale_inv) : NULL,
        .derived_rows = derived != NULL ? gmlp_grouped_tensor_get_data (derived) : NULL,
        .state = state,
        .history_length = gmlp_quantizer_get_amax_history_length (quantizer),
      };

      ok = GMLP_DEVICE_CALL (self->device, activation_quantize, &quantize, error);
    }
  gmlp_quantizer_unlock_state (quantizer);
  if (!ok)
    return NULL;

  if (columnwise != NULL)
    gmlp_grouped_tensor_set_quantized (columnwise, recipe, flags,
                                       own_column_scales ? columnwise_scale_inv : scale_inv,
                                       NULL, TRUE);
  gmlp_grouped_tensor_set_quantized (data, recipe, flags, scale_inv, columnwise, FALSE);
  return g_steal_pointer (&data);
}

/* For the tests (gmlp-grouped-mlp-private.h): the two passes, with the
 * checks of a forward's input. */
static gboolean
check_fc1_output (GmlpGroupedMLP     *self,
                  GmlpGroupedTensor  *h,
                  GError            **error)
{
  GmlpGroupedLinear *fc1 = self->fc1;

  if (gmlp_grouped_tensor_get_device (h) != self->device ||
      gmlp_grouped_tensor_get_dtype (h) != self->dtype ||
      gmlp_grouped_tensor_get_n_groups (h) != self->n_groups ||
      gmlp_grouped_tensor_get_cols (h) != gmlp_grouped_linear_get_out_features (fc1))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
                   "FC1's output must be on the MLP's device, of its dtype, with %u groups of %"
                   G_GINT64_FORMAT " columns", self->n_groups,
                   gmlp_grouped_linear_get_out_features (fc1));
      return FALSE;
    }
  return TRUE;
}

GmlpGroupedTensor *
gmlp_grouped_mlp_run_activation (GmlpGroupedMLP     *self,
                                 GmlpGroupedTensor  *h,
                                 GError            **error)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_MLP (self), NULL);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (h), NULL);

  if (!check_fc1_output (self, h, error))
    return NULL;
  return run_activation (self, h, error);
}

GmlpGroupedTensor *
gmlp_grouped_mlp_run_activation_grad (GmlpGroupedMLP     *self,
                                      GmlpGroupedTensor  *h,
                                      GmlpGroupedTensor  *grad,
                                      GError            **error)
{
  g_autoptr(GmlpGroupedTensor) dh = NULL;
  gboolean host = gmlp_grouped_tensor_has_host_sizes (h);

  g_return_val_if_fail (GMLP_IS_GROUPED_MLP (self), NULL);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (h), NULL);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (grad), NULL);

  if (!check_fc1_output (self, h, error))
    return NULL;
  if (gmlp_grouped_tensor_get_dtype (grad) != self->dtype ||
      gmlp_grouped_tensor_get_cols (grad) != self->ffn_hidden ||
      gmlp_grouped_tensor_get_n_groups (grad) != self->n_groups ||
      host != gmlp_grouped_tensor_has_host_sizes (grad) ||
      (host ? memcmp (gmlp_grouped_tensor_peek_rows (h), gmlp_grouped_tensor_peek_rows (grad),
                      self->n_groups * sizeof (gint64)) != 0
            : gmlp_grouped_tensor_get_row_capacity (h) != gmlp_grouped_tensor_get_row_capacity (grad)))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
                   "The activation's output gradient must have FC1's output's sizes and %"
                   G_GINT64_FORMAT " columns of the MLP's dtype", self->ffn_hidden);
      return NULL;
    }
  dh = new_activation_output (self, h, TRUE, error);
  if (dh == NULL || !run_activation_into (self, h, grad, dh, error))
    return NULL;
  return g_steal_pointer (&dh);
}

GmlpGroupedTensor *
gmlp_grouped_mlp_run_activation_quantize (GmlpGroupedMLP     *self,
                                          GmlpGroupedTensor  *h,
                                          GmlpQuantizer      *quantizer,
                                          gboolean            with_columnwise,
                                          GError            **error)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_MLP (self), NULL);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (h), NULL);
  g_return_val_if_fail (GMLP_IS_QUANTIZER (quantizer), NULL);

  if (!check_fc1_output (self, h, error))
    return NULL;
  return run_activation_quantize (self, h, quantizer, with_columnwise, error);
}

/* FC2's input from FC1's output: quantized in the same pass when FC2 has
 * quantizers (@quantizer, its input quantizer), else the plain activation. */
static GmlpGroupedTensor *
make_fc2_input (GmlpGroupedMLP     *self,
                GmlpGroupedTensor  *h,
                GmlpQuantizer      *quantizer,
                gboolean            with_columnwise,
                GError            **error)
{
  if (quantizer != NULL)
    return run_activation_quantize (self, h, quantizer, with_columnwise, error);
  return run_activation (self, h, error);
}

/**
 * gmlp_grouped_mlp_forward:
 * @self: a #GmlpGroupedMLP
 * @input: `n_groups` members of `rows_i × hidden`, of the MLP's dtype, on
 *   its device, group sizes on the host or only on the device
 * @saved: (out) (transfer full) (optional): what backward needs
 * @error: return location for a #GError
 *
 * Computes `FC2 (act (FC1 (x)))` for every group. When FC2 has quantizers
 * (FP8), the activation writes FC2's input quantized by FC2's input
 * quantizer, in the same pass.
 *
 * With @input's group sizes only on the device, nothing reads them on the
 * host or waits for the device, and the output has @input's sizes tensor
 * and row capacity (see "Group sizes on the device" in the class
 * documentation).
 *
 * As for [method@Gmlp.GroupedLinear.forward], a forward writes no tensor
 * but its output; one that fails in FC2 leaves the amaxes FC1's FP8
 * quantizers recorded (a retry records the same).
 *
 * Returns: (transfer full): the output, `rows_i × hidden` per group, or
 *   %NULL with an error as for [method@Gmlp.GroupedLinear.forward], or
 *   %GMLP_ERROR_SHAPE_MISMATCH when FC2's input quantizer keeps delayed
 *   scales for another number of groups
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_mlp_forward (GmlpGroupedMLP        *self,
                          GmlpGroupedTensor     *input,
                          GmlpSavedActivations **saved,
                          GError               **error)
{
  gboolean recompute;
  g_autoptr(GmlpSavedActivations) s1 = NULL, s2 = NULL, own = NULL;
  g_autoptr(GmlpGroupedTensor) h = NULL, a = NULL, y = NULL;
  GmlpQuantizer *fc2_quantizer;
  gboolean columnwise = FALSE;

  g_return_val_if_fail (GMLP_IS_GROUPED_MLP (self), NULL);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (input), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  recompute = (self->flags & GMLP_LINEAR_RECOMPUTE_ACTIVATION) != 0;

  if (!gmlp_check_constructed (self, self->construct_error, error) ||
      !gmlp_grouped_tensor_check_usable (input, error))
    return NULL;

  if (saved != NULL)
    *saved = NULL;

  /* FP8: FC2's input comes quantized out of the activation. A delayed
   * scaling state that does not fit is refused before FC1 runs. */
  fc2_quantizer = gmlp_grouped_linear_get_quantizer (self->fc2, GMLP_QUANTIZER_ROLE_INPUT);
  if (fc2_quantizer != NULL)
    {
      float *state;
      gboolean fits;

      gmlp_quantizer_lock_state (fc2_quantizer);
      fits = gmlp_quantizer_get_state_for (fc2_quantizer, self->n_groups, &state, error);
      gmlp_quantizer_unlock_state (fc2_quantizer);
      if (!fits)
        return NULL;
      columnwise = saved != NULL && fc2_input_wants_columnwise (self, fc2_quantizer, input);
    }

  h = gmlp_grouped_linear_forward_full (self->fc1, input, TRUE, saved ? &s1 : NULL, error);
  if (h == NULL)
    return NULL;
  a = make_fc2_input (self, h, fc2_quantizer, columnwise, error);
  if (a == NULL)
    return NULL;
  y = gmlp_grouped_linear_forward_full (self->fc2, a, !recompute, saved ? &s2 : NULL, error);
  if (y == NULL)
    return NULL;

  if (saved != NULL)
    {
      own = gmlp_saved_activations_new (self->id);
      gmlp_saved_activations_add_child (own, s1);
      gmlp_saved_activations_add_child (own, s2);
      gmlp_saved_activations_add (own, "fc1-output", h);
      if (recompute && fc2_quantizer != NULL)
        {
          g_object_set_data_full (G_OBJECT (own), SAVED_FC2_INPUT_QUANTIZER,
                                  g_object_ref (fc2_quantizer), g_object_unref);
          g_object_set_data (G_OBJECT (own), SAVED_FC2_INPUT_COLUMNWISE, GINT_TO_POINTER (columnwise));
        }
      if (!gmlp_saved_activations_apply_offload (own, error))
        return NULL;
      *saved = g_steal_pointer (&own);
    }
  return g_steal_pointer (&y);
}

void
gmlp_grouped_mlp_add_pending_reads (GmlpGroupedMLP  *self,
                                    GPtrArray       *reads)
{
  gmlp_grouped_linear_add_pending_reads (self->fc1, reads);
  gmlp_grouped_linear_add_pending_reads (self->fc2, reads);
}

gboolean
gmlp_grouped_mlp_check_wgrad_outputs (GmlpGroupedMLP     *self,
                                      GPtrArray          *reads,
                                      GmlpGroupedTensor  *also,
                                      const char         *label,
                                      GError            **error)
{
  /* "<label>'s FC1: ...", the name made only for an error. */
  if (gmlp_grouped_linear_check_wgrad_outputs (self->fc1, reads, also, "FC1", error) &&
      gmlp_grouped_linear_check_wgrad_outputs (self->fc2, reads, also, "FC2", error))
    return TRUE;
  g_prefix_error (error, "%s's ", label);
  return FALSE;
}

/**
 * gmlp_grouped_mlp_backward:
 * @self: a #GmlpGroupedMLP
 * @saved: what the forward returned; consumed by this call
 * @grad_output: the gradient of the forward's output
 * @error: return location for a #GError
 *
 * Computes the input gradient and, as the gradient contract says, the
 * weight gradients of both layers. The backward of an FP8 forward is FP8:
 * each layer's output gradient goes through its output-gradient quantizer
 * (see [method@Gmlp.GroupedLinear.backward]); the activation's gradient is
 * computed from FC1's output in the MLP's dtype.
 *
 * Both layers are checked (their saved activations, what their forwards
 * read, their quantizers, main_grad) and everything both need is allocated
 * before anything is written: then both input gradients are computed, and
 * then both layers' weight gradients. A backward that fails leaves @saved
 * unused and the weight gradients as they were, so it can be retried; only
 * a device error while the weight gradients are written leaves them
 * unspecified.
 *
 * Returns: (transfer full): the input gradient, or %NULL with an error as
 *   for [method@Gmlp.GroupedLinear.backward] (for either layer; with device
 *   sizes, @grad_output must have its sizes on the device too, of the
 *   forward input's values and row capacity)
 *
 * Since: 0.1
 */
/* What a backward does before either layer's: checks the saved
 * activations and what the three forwards read, gets FC1's output
 * (transfer none) and, with recompute, makes FC2's input again. Writes no
 * gradient. Under the grad lock. */
static gboolean
prepare_backward (GmlpGroupedMLP        *self,
                  GmlpSavedActivations  *saved,
                  GmlpGroupedTensor    **h_out,
                  GError               **error)
{
  GmlpSavedActivations *s1, *s2;
  GmlpGroupedTensor *h;

  if (!gmlp_saved_activations_check (saved, self->id, "GroupedMLP", error))
    return FALSE;
  s1 = gmlp_saved_activations_get_child (saved, 0);
  s2 = gmlp_saved_activations_get_child (saved, 1);
  /* What the three forwards read, before anything is reloaded. */
  if (!gmlp_saved_activations_check_versions (saved, "GroupedMLP", error) ||
      !gmlp_saved_activations_check_versions (s1, "GroupedMLP's FC1", error) ||
      !gmlp_saved_activations_check_versions (s2, "GroupedMLP's FC2", error))
    return FALSE;
  h = gmlp_saved_activations_get (saved, "fc1-output", error);
  if (h == NULL)
    return FALSE;

  /* Recompute: FC2's input as the forward made it (with an FP8 forward,
   * quantized by the same quantizer, whose scales do not change before the
   * step's update). Saved with FC2's activations, where a retry finds it. */
  if ((self->flags & GMLP_LINEAR_RECOMPUTE_ACTIVATION) && !gmlp_saved_activations_is_consumed (s2) &&
      !gmlp_saved_activations_contains (s2, "input"))
    {
      GmlpQuantizer *quantizer = g_object_get_data (G_OBJECT (saved), SAVED_FC2_INPUT_QUANTIZER);
      gboolean columnwise = GPOINTER_TO_INT (g_object_get_data (G_OBJECT (saved),
                                                                SAVED_FC2_INPUT_COLUMNWISE));
      g_autoptr(GmlpGroupedTensor) a = make_fc2_input (self, h, quantizer, columnwise, error);

      if (a == NULL)
        return FALSE;
      gmlp_saved_activations_add (s2, "input", a);
    }

  *h_out = h;
  return TRUE;
}

/* For MoELayer (gmlp-grouped-mlp-private.h): the checks of both layers'
 * backwards. FC1's output gradient is made by the backward, with FC1's
 * output's shape: FC1's output stands for it. */
gboolean
gmlp_grouped_mlp_check_backward (GmlpGroupedMLP        *self,
                                 GmlpSavedActivations  *saved,
                                 GmlpGroupedTensor     *grad_output,
                                 GError               **error)
{
  g_autoptr(GmlpRecMutexLocker) locker = NULL;
  GmlpGroupedTensor *h;

  g_return_val_if_fail (GMLP_IS_GROUPED_MLP (self), FALSE);
  g_return_val_if_fail (GMLP_IS_SAVED_ACTIVATIONS (saved), FALSE);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (grad_output), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_check_constructed (self, self->construct_error, error) ||
      !gmlp_grouped_tensor_check_usable (grad_output, error))
    return FALSE;

  locker = gmlp_rec_mutex_locker_new (&self->grad_lock);
  return prepare_backward (self, saved, &h, error) &&
         gmlp_grouped_linear_check_backward (self->fc2, gmlp_saved_activations_get_child (saved, 1),
                                             grad_output, "GroupedMLP's FC2", error) &&
         gmlp_grouped_linear_check_backward (self->fc1, gmlp_saved_activations_get_child (saved, 0),
                                             h, "GroupedMLP's FC1", error);
}

GmlpGroupedTensor *
gmlp_grouped_mlp_backward (GmlpGroupedMLP        *self,
                           GmlpSavedActivations  *saved,
                           GmlpGroupedTensor     *grad_output,
                           GError               **error)
{
  g_autoptr(GmlpLinearBackward) fc2_step = NULL, fc1_step = NULL;
  g_autoptr(GmlpGroupedTensor) da = NULL, dh = NULL, dx = NULL;
  g_autoptr(GmlpRecMutexLocker) locker = NULL;
  GmlpSavedActivations *s1, *s2;
  GmlpGroupedTensor *h;

  g_return_val_if_fail (GMLP_IS_GROUPED_MLP (self), NULL);
  g_return_val_if_fail (GMLP_IS_SAVED_ACTIVATIONS (saved), NULL);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (grad_output), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!gmlp_check_constructed (self, self->construct_error, error) ||
      !gmlp_grouped_tensor_check_usable (grad_output, error))
    return NULL;

  locker = gmlp_rec_mutex_locker_new (&self->grad_lock);
  if (!prepare_backward (self, saved, &h, error))
    return NULL;
  s1 = gmlp_saved_activations_get_child (saved, 0);
  s2 = gmlp_saved_activations_get_child (saved, 1);

  /* Both layers checked, and all allocated (FC1's output gradient too,
   * which the activation writes later), before either writes. */
  fc2_step = gmlp_grouped_linear_backward_begin (self->fc2, s2, grad_output, "GroupedMLP's FC2", error);
  if (fc2_step == NULL)
    return NULL;
  dh = new_activation_output (self, h, TRUE, error);
  if (dh == NULL)
    return NULL;
  fc1_step = gmlp_grouped_linear_backward_begin (self->fc1, s1, dh, "GroupedMLP's FC1", error);
  if (fc1_step == NULL)
    return NULL;

  /* The input gradients, into tensors of this call's own. */
  if (!gmlp_grouped_linear_backward_dgrad (self->fc2, fc2_step, error) ||
      !run_activation_into (self, h, gmlp_linear_backward_get_grad_input (fc2_step), dh, error) ||
      !gmlp_grouped_linear_backward_dgrad (self->fc1, fc1_step, error))
    return NULL;

  /* The weight gradients: only the backend can fail from here. */
  da = gmlp_grouped_linear_backward_finish (self->fc2, fc2_step, error);
  if (da == NULL)
    return NULL;
  dx = gmlp_grouped_linear_backward_finish (self->fc1, fc1_step, error);
  if (dx == NULL)
    return NULL;

  gmlp_saved_activations_consume (saved);
  if (!(self->flags & GMLP_LINEAR_DELAY_WGRAD_COMPUTE) && !gmlp_grouped_mlp_emit_wgrad_ready (self, error))
    return NULL;
  return g_steal_pointer (&dx);
}

gboolean
gmlp_grouped_mlp_backward_chunks (GmlpGroupedMLP           *self,
                                  GmlpSavedActivations    **saved,
                                  const guint              *bounds,
                                  guint                     n_chunks,
                                  const GmlpMLPChunkHooks  *hooks,
                                  GError                  **error)
{
  g_autoptr(GPtrArray) fc2_steps = g_ptr_array_new_with_free_func ((GDestroyNotify) gmlp_linear_backward_free);
  g_autoptr(GPtrArray) fc1_steps = g_ptr_array_new_with_free_func ((GDestroyNotify) gmlp_linear_backward_free);
  g_autofree GmlpGroupedTensor **h = g_new0 (GmlpGroupedTensor *, n_chunks);
  g_autofree GmlpGroupedTensor **grads = g_new0 (GmlpGroupedTensor *, n_chunks);
  g_autoptr(GmlpRecMutexLocker) locker = NULL;
  guint c, i;

  g_return_val_if_fail (GMLP_IS_GROUPED_MLP (self), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_check_constructed (self, self->construct_error, error))
    return FALSE;

  locker = gmlp_rec_mutex_locker_new (&self->grad_lock);
  for (c = 0; c < n_chunks; c++)
    if (!prepare_backward (self, saved[c], &h[c], error))
      return FALSE;

  /* Chunk by chunk, the input gradients into tensors of this call's own:
   * nothing of the layers is written before the weight gradients. */
  for (c = 0; c < n_chunks; c++)
    {
      g_autoptr(GmlpGroupedTensor) dy = hooks->grad_output (hooks->data, c, error);
      g_autoptr(GmlpGroupedTensor) dh = NULL;
      GmlpLinearBackward *fc2_step, *fc1_step;

      if (dy == NULL)
        return FALSE;
      fc2_step = gmlp_grouped_linear_backward_begin (self->fc2, gmlp_saved_activations_get_child (saved[c], 1),
                                                     dy, "GroupedMLP's FC2", error);
      if (fc2_step == NULL)
        return FALSE;
      g_ptr_array_add (fc2_steps, fc2_step);
      dh = new_activation_output (self, h[c], TRUE, error);
      if (dh == NULL)
        return FALSE;
      fc1_step = gmlp_grouped_linear_backward_begin (self->fc1, gmlp_saved_activations_get_child (saved[c], 0),
                                                     dh, "GroupedMLP's FC1", error);
      if (fc1_step == NULL)
        return FALSE;
      g_ptr_array_add (fc1_steps, fc1_step);
      if (!gmlp_grouped_linear_backward_dgrad (self->fc2, fc2_step, error) ||
          !run_activation_into (self, h[c], gmlp_linear_backward_get_grad_input (fc2_step), dh, error) ||
          !gmlp_grouped_linear_backward_dgrad (self->fc1, fc1_step, error) ||
          !hooks->grad_input (hooks->data, c, gmlp_linear_backward_get_grad_input (fc1_step), error))
        return FALSE;
    }

  /* The weight gradients, FC2's then FC1's, as backward(): each chunk's
   * products write its groups only. */
  for (i = 0; i < 2; i++)
    {
      gboolean ok = gmlp_grouped_linear_backward_finish_chunks (i == 0 ? self->fc2 : self->fc1,
                                                                (GmlpLinearBackward **) (i == 0 ? fc2_steps
                                                                                                : fc1_steps)->pdata,
                                                                bounds, n_chunks, grads, error);

      for (c = 0; c < n_chunks; c++)
        g_clear_object (&grads[c]);
      if (!ok)
        return FALSE;
    }

  for (c = 0; c < n_chunks; c++)
    gmlp_saved_activations_consume (saved[c]);
  return (self->flags & GMLP_LINEAR_DELAY_WGRAD_COMPUTE) || gmlp_grouped_mlp_emit_wgrad_ready (self, error);
}

gboolean
gmlp_grouped_mlp_backward_dw_prepare (GmlpGroupedMLP  *self,
                                      GError         **error)
{
  g_autoptr(GmlpRecMutexLocker) locker = NULL;

  g_return_val_if_fail (GMLP_IS_GROUPED_MLP (self), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_check_constructed (self, self->construct_error, error))
    return FALSE;

  locker = gmlp_rec_mutex_locker_new (&self->grad_lock);
  return gmlp_grouped_linear_backward_dw_prepare (self->fc2, "GroupedMLP's FC2", error) &&
         gmlp_grouped_linear_backward_dw_prepare (self->fc1, "GroupedMLP's FC1", error);
}

/**
 * gmlp_grouped_mlp_backward_dw:
 * @self: a #GmlpGroupedMLP with delayed weight gradients
 * @error: return location for a #GError
 *
 * Computes the weight gradients of both layers for the oldest backward
 * still waiting for them, as [method@Gmlp.GroupedLinear.backward_dw] does:
 * both layers are checked before either computes, so a call that fails
 * leaves both pending and their gradients as they were (but for a device
 * error while they are written).
 *
 * Returns: %TRUE on success; %FALSE with %GMLP_ERROR_INVALID_STATE when the
 *   MLP does not delay weight gradients, either layer has none pending, or
 *   what they read was written since, or an error as for
 *   [method@Gmlp.GroupedLinear.backward_dw]
 *
 * Since: 0.1
 */
gboolean
gmlp_grouped_mlp_backward_dw (GmlpGroupedMLP  *self,
                              GError         **error)
{
  g_autoptr(GmlpRecMutexLocker) locker = NULL;

  g_return_val_if_fail (GMLP_IS_GROUPED_MLP (self), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_check_constructed (self, self->construct_error, error))
    return FALSE;

  locker = gmlp_rec_mutex_locker_new (&self->grad_lock);
  return gmlp_grouped_mlp_backward_dw_prepare (self, error) &&
         gmlp_grouped_linear_backward_dw (self->fc2, error) &&
         gmlp_grouped_linear_backward_dw (self->fc1, error) &&
         gmlp_grouped_mlp_emit_wgrad_ready (self, error);
}
