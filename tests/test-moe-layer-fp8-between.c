/* test-moe-layer-fp8-between.c: FP8 recipes changed between steps
 *
 * A recipe changed between a forward and its backward, in whole steps and
 * in parts, and the quantizers' state across partial steps.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "test-moe-layer-fp8.h"

/* A recipe for the forward, another set before its backward, and the
 * error the backward then gives. */
typedef struct {
  GmlpScalingRecipe forward, between;
  gint              code;
} RecipeChange;

/* A backward that must refuse with @code before anything is written:
 * every gradient the same bytes as @before, the saved activations unused. */
static void
assert_backward_refused (GmlpMoELayer         *layer,
                         GmlpSavedActivations *saved,
                         GmlpGroupedTensor    *dy,
                         GPtrArray            *before,
                         gint                  code)
{
  g_autoptr(GPtrArray) after = NULL;
  g_autoptr(GError) error = NULL;

  g_assert_null (gmlp_moe_layer_backward (layer, saved, dy, &error));
  g_assert_error (error, GMLP_ERROR, code);
  g_assert_false (gmlp_saved_activations_is_consumed (saved));
  after = gmlp_test_moe_gradient_bytes (layer);
  gmlp_test_assert_same_bytes_array (before, after, "gradients after a refused backward");
}

/* A recipe changed between a forward and its backward: the backward of an
 * FP8 forward stays FP8. Without FP8, or with a recipe that does not meet
 * the forward's, it fails before anything is written, the saved
 * activations unused; with the forward's recipe set again it runs, and
 * gives what the uninterrupted step gives; a per-tensor recipe meets the
 * other. */
void
test_recipe_between (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  static const RecipeChange cases[] = {
    { GMLP_SCALING_RECIPE_DELAYED, GMLP_SCALING_RECIPE_NONE, GMLP_ERROR_INVALID_STATE },
    { GMLP_SCALING_RECIPE_BLOCKWISE, GMLP_SCALING_RECIPE_NONE, GMLP_ERROR_INVALID_STATE },
    { GMLP_SCALING_RECIPE_DELAYED, GMLP_SCALING_RECIPE_BLOCKWISE, GMLP_ERROR_UNSUPPORTED },
    { GMLP_SCALING_RECIPE_MXFP8, GMLP_SCALING_RECIPE_CURRENT, GMLP_ERROR_UNSUPPORTED },
  };
  guint i;

  if (device == NULL)
    return;

  for (i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      g_autoptr(Problem) p = problem_new (&configs[1], GMLP_DTYPE_BFLOAT16);
      g_autoptr(GmlpMoELayer) layer = NULL;
      g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, y = NULL, dx = NULL, dx2 = NULL;
      g_autoptr(GmlpSavedActivations) saved = NULL;
      g_autoptr(GPtrArray) before = NULL;
      g_autoptr(GError) error = NULL;
      g_auto(Step) ref = { NULL, }, first = { NULL, };

      /* A whole step first, so that every gradient exists; the recipes
       * other than delayed scaling keep no state, so the retried step
       * must give its dx. */
      layer = problem_layer (p, device, cases[i].forward);
      problem_draw (p);
      problem_reference (p, NULL, NULL, WGRAD_QUANTIZED, WGRAD_QUANTIZED, device, &ref);
      run_step (p, &ref, device, layer, &first);

      x = gmlp_test_upload_values (device, p->x, T_TOKENS, HIDDEN, p->dtype);
      dy = gmlp_test_upload_values (device, p->dy, T_TOKENS, HIDDEN, p->dtype);
      y = gmlp_moe_layer_forward (layer, x, &saved, &error);
      g_assert_no_error (error);
      before = gmlp_test_moe_gradient_bytes (layer);
      g_assert_true (gmlp_moe_layer_set_fp8_recipe (layer, cases[i].between, GMLP_FP8_FORMAT_HYBRID, &error));
      g_assert_no_error (error);
      assert_backward_refused (layer, saved, dy, before, cases[i].code);

      /* The forward's recipe again (fresh quantizers: the backward's
       * scales are the output gradients' own but for delayed scaling). */
      g_assert_true (gmlp_moe_layer_set_fp8_recipe (layer, cases[i].forward, GMLP_FP8_FORMAT_HYBRID, &error));
      g_assert_no_error (error);
      dx = gmlp_moe_layer_backward (layer, saved, dy, &error);
      g_assert_no_error (error);
      g_assert_true (gmlp_saved_activations_is_consumed (saved));
      if (cases[i].forward != GMLP_SCALING_RECIPE_DELAYED)
        {
          g_autofree double *v = gmlp_test_download (dx, NULL);

          gmlp_test_assert_close (v, first.dx, T_TOKENS * HIDDEN, on_gpu (device) ? gmlp_test_tolerance (p->dtype) : 0.0,
                                  "the retried backward");
        }
      g_clear_object (&saved);
      g_clear_object (&y);

      /* Per-tensor meets per-tensor: delayed forward, current backward. */
      if (cases[i].forward == GMLP_SCALING_RECIPE_DELAYED)
        {
          y = gmlp_moe_layer_forward (layer, x, &saved, &error);
          g_assert_no_error (error);
          g_assert_true (gmlp_moe_layer_set_fp8_recipe (layer, GMLP_SCALING_RECIPE_CURRENT, GMLP_FP8_FORMAT_HYBRID,
                                                        &error));
          g_assert_no_error (error);
          dx2 = gmlp_moe_layer_backward (layer, saved, dy, &error);
          g_assert_no_error (error);
        }
    }
}

static void
whole_step (GmlpMoELayer      *layer,
            GmlpGroupedTensor *x,
            GmlpGroupedTensor *dy)
{
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GmlpGroupedTensor) y = NULL, dx = NULL;
  g_autoptr(GError) error = NULL;

  y = gmlp_moe_layer_forward (layer, x, &saved, &error);
  g_assert_no_error (error);
  dx = gmlp_moe_layer_backward (layer, saved, dy, &error);
  g_assert_no_error (error);
}

/* The same as test_recipe_between, with the recipe of one part changed
 * through its getter: the shared expert's or the routed experts'. The
 * backward must refuse before any part writes (the router, the experts and
 * the shared expert run one after the other, so a part that refuses late
 * must be found out at the start), leaving every gradient (main_grad when
 * fused) bit for bit as it was; with the part's forward recipe set again
 * the same activations' backward gives the bits of a twin layer whose
 * step was never refused (on the CPU; within the dtype's tolerance on a
 * GPU, whose sums may be ordered otherwise). */
void
test_part_recipe_between (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  static const RecipeChange cases[] = {
    { GMLP_SCALING_RECIPE_DELAYED, GMLP_SCALING_RECIPE_NONE, GMLP_ERROR_INVALID_STATE },
    { GMLP_SCALING_RECIPE_DELAYED, GMLP_SCALING_RECIPE_BLOCKWISE, GMLP_ERROR_UNSUPPORTED },
    { GMLP_SCALING_RECIPE_MXFP8, GMLP_SCALING_RECIPE_CURRENT, GMLP_ERROR_UNSUPPORTED },
  };
  guint i, part, fused;

  if (device == NULL)
    return;

  for (fused = 0; fused < 2; fused++)
    for (part = 0; part < 2; part++)
      for (i = 0; i < G_N_ELEMENTS (cases); i++)
        {
          GmlpLinearFlags flags = fused ? GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION : GMLP_LINEAR_NONE;
          g_autoptr(Problem) p = problem_new (&configs[1], GMLP_DTYPE_BFLOAT16);
          g_autoptr(GmlpMoELayer) layer = NULL, twin = NULL;
          g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, y = NULL, dx = NULL, y_twin = NULL, dx_twin = NULL;
          g_autoptr(GmlpSavedActivations) saved = NULL, saved_twin = NULL;
          g_autoptr(GPtrArray) before = NULL, after = NULL, want = NULL;
          g_autoptr(GError) error = NULL;
          g_autofree double *got_dx = NULL, *want_dx = NULL;
          GmlpGroupedMLP *changed, *changed_twin;

          g_test_message ("%s, %s: %d then %d", fused ? "fused" : "not fused",
                          part == 0 ? "shared expert" : "experts", cases[i].forward, cases[i].between);
          layer = problem_layer_flags (p, device, cases[i].forward, flags);
          twin = problem_layer_flags (p, device, cases[i].forward, flags);
          changed = part == 0 ? gmlp_moe_layer_get_shared_expert (layer) : gmlp_moe_layer_get_experts (layer);
          changed_twin = part == 0 ? gmlp_moe_layer_get_shared_expert (twin) : gmlp_moe_layer_get_experts (twin);
          g_assert_nonnull (changed);

          /* A whole step first on both, so that every gradient exists;
           * other tokens for the step under test, whose gradients differ. */
          problem_draw (p);
          x = gmlp_test_upload_values (device, p->x, T_TOKENS, HIDDEN, p->dtype);
          dy = gmlp_test_upload_values (device, p->dy, T_TOKENS, HIDDEN, p->dtype);
          whole_step (layer, x, dy);
          whole_step (twin, x, dy);
          g_clear_object (&x);
          g_clear_object (&dy);
          problem_draw (p);
          x = gmlp_test_upload_values (device, p->x, T_TOKENS, HIDDEN, p->dtype);
          dy = gmlp_test_upload_values (device, p->dy, T_TOKENS, HIDDEN, p->dtype);
          y = gmlp_moe_layer_forward (layer, x, &saved, &error);
          g_assert_no_error (error);
          before = gmlp_test_moe_gradient_bytes (layer);
          g_assert_true (gmlp_grouped_mlp_set_fp8_recipe (changed, cases[i].between, GMLP_FP8_FORMAT_HYBRID,
                                                          &error));
          g_assert_no_error (error);
          assert_backward_refused (layer, saved, dy, before, cases[i].code);

          /* The forward's recipe again: fresh quantizers, which the twin
           * gets at the same point of its step. */
          g_assert_true (gmlp_grouped_mlp_set_fp8_recipe (changed, cases[i].forward, GMLP_FP8_FORMAT_HYBRID,
                                                          &error));
          g_assert_no_error (error);
          dx = gmlp_moe_layer_backward (layer, saved, dy, &error);
          g_assert_no_error (error);
          g_assert_true (gmlp_saved_activations_is_consumed (saved));

          y_twin = gmlp_moe_layer_forward (twin, x, &saved_twin, &error);
          g_assert_no_error (error);
          g_assert_true (gmlp_grouped_mlp_set_fp8_recipe (changed_twin, cases[i].forward, GMLP_FP8_FORMAT_HYBRID,
                                                          &error));
          g_assert_no_error (error);
          dx_twin = gmlp_moe_layer_backward (twin, saved_twin, dy, &error);
          g_assert_no_error (error);

          got_dx = gmlp_test_download (dx, NULL);
          want_dx = gmlp_test_download (dx_twin, NULL);
          if (on_gpu (device))
            {
              gmlp_test_assert_close (got_dx, want_dx, T_TOKENS * HIDDEN, gmlp_test_tolerance (p->dtype),
                                      "the retried backward's dx");
            }
          else
            {
              gmlp_test_assert_same_bytes (dx, dx_twin, "the retried backward's dx");
              after = gmlp_test_moe_gradient_bytes (layer);
              want = gmlp_test_moe_gradient_bytes (twin);
              gmlp_test_assert_same_bytes_array (after, want, "gradients of the retried backward");
            }
        }
}

/* A part's output-gradient quantizer that cannot quantize its output
 * gradient: the shared expert's FC1 given, between the forward and the
 * backward, a delayed-scaling one that keeps the scales of two groups (the
 * shared expert has one). The backward refuses before any part writes,
 * every gradient as it was; with the quantizers of the forward again it
 * runs. */
void
test_part_quantizer_state (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(Problem) p = NULL;
  g_autoptr(GmlpMoELayer) layer = NULL, twin = NULL;
  g_autoptr(GmlpQuantizer) other = NULL, input_q = NULL, weight_q = NULL, grad_q = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, y = NULL, dx = NULL, two = NULL, two8 = NULL;
  g_autoptr(GmlpGroupedTensor) y_twin = NULL, dx_twin = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL, saved_twin = NULL;
  g_autoptr(GPtrArray) before = NULL;
  g_autoptr(GError) error = NULL;
  gint64 two_rows[] = { 16, 16 };
  GmlpGroupedLinear *fc1;

  if (device == NULL)
    return;

  p = problem_new (&configs[1], GMLP_DTYPE_BFLOAT16);
  layer = problem_layer (p, device, GMLP_SCALING_RECIPE_DELAYED);
  fc1 = gmlp_grouped_mlp_get_fc1 (gmlp_moe_layer_get_shared_expert (layer));
  problem_draw (p);
  x = gmlp_test_upload_values (device, p->x, T_TOKENS, HIDDEN, p->dtype);
  dy = gmlp_test_upload_values (device, p->dy, T_TOKENS, HIDDEN, p->dtype);
  twin = problem_layer (p, device, GMLP_SCALING_RECIPE_DELAYED);
  whole_step (layer, x, dy);
  whole_step (twin, x, dy);
  /* Other tokens for the step under test: its gradients differ. */
  g_clear_object (&x);
  g_clear_object (&dy);
  problem_draw (p);
  x = gmlp_test_upload_values (device, p->x, T_TOKENS, HIDDEN, p->dtype);
  dy = gmlp_test_upload_values (device, p->dy, T_TOKENS, HIDDEN, p->dtype);

  other = gmlp_quantizer_new (device, GMLP_SCALING_RECIPE_DELAYED, GMLP_FP8_FORMAT_HYBRID,
                              GMLP_QUANTIZER_ROLE_GRAD_OUTPUT);
  two = gmlp_test_random_tensor (device, GMLP_DTYPE_BFLOAT16, two_rows, 2, HIDDEN, 1.0, NULL);
  two8 = gmlp_quantizer_quantize (other, two, &error);
  g_assert_no_error (error);
  input_q = g_object_ref (gmlp_grouped_linear_get_quantizer (fc1, GMLP_QUANTIZER_ROLE_INPUT));
  weight_q = g_object_ref (gmlp_grouped_linear_get_quantizer (fc1, GMLP_QUANTIZER_ROLE_WEIGHT));
  grad_q = g_object_ref (gmlp_grouped_linear_get_quantizer (fc1, GMLP_QUANTIZER_ROLE_GRAD_OUTPUT));

  y = gmlp_moe_layer_forward (layer, x, &saved, &error);
  g_assert_no_error (error);
  before = gmlp_test_moe_gradient_bytes (layer);
  g_assert_true (gmlp_grouped_linear_set_quantizers (fc1, input_q, weight_q, other, &error));
  g_assert_no_error (error);
  assert_backward_refused (layer, saved, dy, before, GMLP_ERROR_SHAPE_MISMATCH);

  g_assert_true (gmlp_grouped_linear_set_quantizers (fc1, input_q, weight_q, grad_q, &error));
  g_assert_no_error (error);
  dx = gmlp_moe_layer_backward (layer, saved, dy, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_saved_activations_is_consumed (saved));

  /* The bits of the twin's step, which was never refused (on the CPU). */
  y_twin = gmlp_moe_layer_forward (twin, x, &saved_twin, &error);
  g_assert_no_error (error);
  dx_twin = gmlp_moe_layer_backward (twin, saved_twin, dy, &error);
  g_assert_no_error (error);
  if (!on_gpu (device))
    {
      g_autoptr(GPtrArray) got = gmlp_test_moe_gradient_bytes (layer), want = gmlp_test_moe_gradient_bytes (twin);

      gmlp_test_assert_same_bytes (dx, dx_twin, "the retried backward's dx");
      gmlp_test_assert_same_bytes_array (got, want, "gradients of the retried backward");
    }
}
