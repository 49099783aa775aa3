/* test-grouped-linear-versions.c: GroupedLinear and tensor versions
 *
 * Which calls bump which versions, a backward refused after its inputs
 * changed, delayed wgrad, and main_grad aliasing.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "test-grouped-linear.h"

/* ---- Versions: what a backward reads must be what its forward read -------- */

/* The bytes of @t, or NULL for no tensor. */
static GBytes *
bytes_or_null (GmlpGroupedTensor *t)
{
  g_autoptr(GError) error = NULL;
  GBytes *bytes;

  if (t == NULL)
    return NULL;
  bytes = gmlp_grouped_tensor_to_bytes (t, &error);
  g_assert_no_error (error);
  return bytes;
}

static void
assert_same_bytes_or_null (GBytes *before, GmlpGroupedTensor *t, const char *what)
{
  g_autoptr(GBytes) after = bytes_or_null (t);

  if (before == NULL || after == NULL)
    {
      if (before != after)
        g_error ("%s: appeared or went away", what);
      return;
    }
  if (!g_bytes_equal (before, after))
    g_error ("%s was written", what);
}

/* One forward and backward, for the gradients they leave. */
static void
run_step (GmlpGroupedLinear *layer, GmlpGroupedTensor *x, GmlpGroupedTensor *dy)
{
  g_autoptr(GmlpGroupedTensor) y = NULL, dx = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GError) error = NULL;

  y = gmlp_grouped_linear_forward (layer, x, &saved, &error);
  g_assert_no_error (error);
  dx = gmlp_grouped_linear_backward (layer, saved, dy, &error);
  g_assert_no_error (error);
}

static void
assert_error_names (GError *error, gint code, const char *name)
{
  g_assert_error (error, GMLP_ERROR, code);
  if (strstr (error->message, name) == NULL)
    g_error ("The error does not name the %s: %s", name, error->message);
}

/* Every write through the API bumps the version of the storage it writes,
 * which every view of that storage shares; reads and failed calls do not;
 * results in new tensors start at 0. */
void
test_versions_writes (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpGroupedTensor) t = NULL, other = NULL, member = NULL, converted = NULL;
  g_autoptr(GmlpGroupedLinear) layer = NULL, fused = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, y = NULL, dx = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GBytes) bytes = NULL;
  g_autoptr(GError) error = NULL;
  g_autoptr(Problem) p = NULL;
  gint64 rows[] = { 3, 0, 5 };
  GmlpGroupedTensor *weight, *bias;
  guint64 v, vw, vb;

  if (device == NULL)
    return;

  t = gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, rows, 3, 8, &error);
  g_assert_no_error (error);
  other = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, rows, 3, 8, 1.0, NULL);
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (t), ==, 0);
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (other), ==, 0);

  g_assert_true (gmlp_grouped_tensor_fill_zero (t, NULL));
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (t), ==, 1);
  g_assert_true (gmlp_grouped_tensor_fill_random (t, 7, 1.0, NULL));
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (t), ==, 2);
  g_assert_true (gmlp_grouped_tensor_add_scaled (t, 0.5, other, NULL));
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (t), ==, 3);
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (other), ==, 0);
  g_assert_true (gmlp_grouped_tensor_scale (t, 2.0, NULL));
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (t), ==, 4);

  /* Refused writes and reads leave it. */
  g_assert_false (gmlp_grouped_tensor_scale (t, INFINITY, &error));
  g_clear_error (&error);
  g_assert_false (gmlp_grouped_tensor_fill_random (t, 7, -1.0, &error));
  g_clear_error (&error);
  bytes = gmlp_grouped_tensor_to_bytes (t, NULL);
  g_assert_cmpfloat (gmlp_grouped_tensor_sum_squares (t, NULL), >, 0.0);
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (t), ==, 4);

  /* A member view shares the counter both ways. */
  member = gmlp_grouped_tensor_get_member (t, 2, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (member), ==, 4);
  g_assert_true (gmlp_grouped_tensor_fill_zero (member, NULL));
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (t), ==, 5);
  g_assert_true (gmlp_grouped_tensor_scale (t, 3.0, NULL));
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (member), ==, 6);

  /* Results are new tensors. */
  converted = gmlp_grouped_tensor_convert (t, GMLP_DTYPE_BFLOAT16, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (converted), ==, 0);
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (t), ==, 6);

  /* The layer's writes into its parameters and gradients. */
  layer = new_layer (device, 3, 8, 4, GMLP_DTYPE_FLOAT32,
                     GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS);
  weight = gmlp_grouped_linear_get_weight (layer);
  bias = gmlp_grouped_linear_get_bias (layer);
  vw = gmlp_grouped_tensor_get_version (weight);
  vb = gmlp_grouped_tensor_get_version (bias);
  g_assert_true (gmlp_grouped_linear_init_parameters (layer, 3, NULL));
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (weight), >, vw);
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (bias), >, vb);
  vw = gmlp_grouped_tensor_get_version (weight);
  vb = gmlp_grouped_tensor_get_version (bias);
  p = problem_new (layer, rows, &x, &dy);
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (weight), ==, vw + 1);
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (bias), ==, vb + 1);
  vw++;

  y = gmlp_grouped_linear_forward (layer, x, &saved, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (y), ==, 0);
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (x), ==, 0);
  dx = gmlp_grouped_linear_backward (layer, saved, dy, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (dx), ==, 0);
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (dy), ==, 0);
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (weight), ==, vw);
  v = gmlp_grouped_tensor_get_version (gmlp_grouped_linear_get_wgrad (layer));
  g_assert_cmpuint (v, >, 0);
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (gmlp_grouped_linear_get_bgrad (layer)), >, 0);
  run_step (layer, x, dy);
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (gmlp_grouped_linear_get_wgrad (layer)), >, v);

  /* Fused accumulation writes main_grad, the caller's too. */
  fused = new_layer (device, 3, 8, 4, GMLP_DTYPE_FLOAT32,
                     GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION);
  {
    g_autoptr(GmlpGroupedTensor) main_grad = gmlp_grouped_tensor_new_uniform (device, GMLP_DTYPE_FLOAT32,
                                                                              3, 4, 8, NULL);
    g_autoptr(GmlpGroupedTensor) y2 = NULL, dx2 = NULL;
    g_autoptr(GmlpSavedActivations) saved2 = NULL;

    g_assert_true (gmlp_grouped_tensor_fill_zero (main_grad, NULL));
    g_assert_true (gmlp_grouped_linear_set_main_grad (fused, main_grad, &error));
    g_assert_no_error (error);
    g_assert_cmpuint (gmlp_grouped_tensor_get_version (main_grad), ==, 1);
    y2 = gmlp_grouped_linear_forward (fused, x, &saved2, &error);
    g_assert_no_error (error);
    dx2 = gmlp_grouped_linear_backward (fused, saved2, dy, &error);
    g_assert_no_error (error);
    g_assert_cmpuint (gmlp_grouped_tensor_get_version (main_grad), ==, 2);
  }
}

/* A backward whose input or weights were written since its forward fails,
 * naming which, before it writes anything; the activations stay unused.
 * The same for FP8, whose backward reads quantized copies. */
static void
run_versions_changed (gboolean fp8)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  gint64 rows[] = { 6, 0, 9, 4 };
  guint what;

  if (device == NULL)
    return;

  for (what = 0; what < 4; what++)
    {
      g_autoptr(GmlpGroupedLinear) layer = NULL;
      g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, y = NULL, dx = NULL, member = NULL;
      g_autoptr(GmlpSavedActivations) saved = NULL;
      g_autoptr(GBytes) wgrad = NULL, bgrad = NULL, weight = NULL;
      g_autoptr(GError) error = NULL;
      g_autoptr(Problem) p = NULL;
      GmlpGroupedTensor *w;
      guint64 in_use;

      layer = new_layer (device, 4, 32, 16, GMLP_DTYPE_FLOAT32,
                         GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS);
      if (fp8)
        {
          g_autoptr(GmlpQuantizer) qx = gmlp_quantizer_new (device, GMLP_SCALING_RECIPE_CURRENT,
                                                            GMLP_FP8_FORMAT_HYBRID, GMLP_QUANTIZER_ROLE_INPUT);
          g_autoptr(GmlpQuantizer) qw = gmlp_quantizer_new (device, GMLP_SCALING_RECIPE_CURRENT,
                                                            GMLP_FP8_FORMAT_HYBRID, GMLP_QUANTIZER_ROLE_WEIGHT);
          g_autoptr(GmlpQuantizer) qg = gmlp_quantizer_new (device, GMLP_SCALING_RECIPE_CURRENT,
                                                            GMLP_FP8_FORMAT_HYBRID,
                                                            GMLP_QUANTIZER_ROLE_GRAD_OUTPUT);

          g_assert_true (gmlp_grouped_linear_set_quantizers (layer, qx, qw, qg, &error));
          g_assert_no_error (error);
        }
      w = gmlp_grouped_linear_get_weight (layer);
      p = problem_new (layer, rows, &x, &dy);

      run_step (layer, x, dy);   /* so that the gradients exist */
      y = gmlp_grouped_linear_forward (layer, x, &saved, &error);
      g_assert_no_error (error);
      switch (what)
        {
        case 0:   /* the input */
          g_assert_true (gmlp_grouped_tensor_scale (x, 2.0, NULL));
          break;
        case 1:   /* the input, through a member */
          member = gmlp_grouped_tensor_get_member (x, 2, NULL);
          g_assert_true (gmlp_grouped_tensor_fill_zero (member, NULL));
          break;
        case 2:   /* the weights, by an optimizer step */
          g_assert_true (gmlp_grouped_tensor_add_scaled (w, -0.1, w, NULL));
          break;
        case 3:   /* the weights, replaced */
          g_assert_true (gmlp_grouped_linear_init_parameters (layer, 9, NULL));
          break;
        }

      wgrad = bytes_or_null (gmlp_grouped_linear_get_wgrad (layer));
      bgrad = bytes_or_null (gmlp_grouped_linear_get_bgrad (layer));
      weight = bytes_or_null (w);
      g_assert_true (gmlp_device_synchronize (device, NULL));
      in_use = gmlp_device_get_bytes_in_use (device);

      dx = gmlp_grouped_linear_backward (layer, saved, dy, &error);
      g_assert_null (dx);
      assert_error_names (error, GMLP_ERROR_INVALID_STATE, what < 2 ? "input" : "weight");
      g_clear_error (&error);
      g_assert_false (gmlp_saved_activations_is_consumed (saved));
      g_assert_cmpuint (gmlp_device_get_bytes_in_use (device), ==, in_use);
      assert_same_bytes_or_null (wgrad, gmlp_grouped_linear_get_wgrad (layer), "wgrad");
      assert_same_bytes_or_null (bgrad, gmlp_grouped_linear_get_bgrad (layer), "bgrad");
      assert_same_bytes_or_null (weight, w, "weight");

      /* It stays refused: the values the forward read are gone. */
      g_assert_null (gmlp_grouped_linear_backward (layer, saved, dy, &error));
      g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
      g_clear_error (&error);

      /* A write to another tensor, or to the output, is no concern. */
      g_clear_object (&saved);
      g_clear_object (&y);
      y = gmlp_grouped_linear_forward (layer, x, &saved, &error);
      g_assert_no_error (error);
      g_assert_true (gmlp_grouped_tensor_fill_zero (y, NULL));
      g_assert_true (gmlp_grouped_tensor_scale (dy, 1.0, NULL));
      dx = gmlp_grouped_linear_backward (layer, saved, dy, &error);
      g_assert_no_error (error);
      g_assert_nonnull (dx);
    }
}

void
test_versions_changed (void)
{
  run_versions_changed (FALSE);
}

void
test_versions_changed_fp8 (void)
{
  run_versions_changed (TRUE);
}

/* Delayed weight gradients read the input and the output gradient in
 * backward_dw: a write to either since the backward is refused there,
 * nothing computed, the weight gradient still pending. A write to the
 * weights between the two is fine: dW does not read them. */
void
test_versions_delayed (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  gint64 rows[] = { 5, 7, 0 };
  guint what;

  if (device == NULL)
    return;

  for (what = 0; what < 3; what++)
    {
      g_autoptr(GmlpGroupedLinear) layer = NULL;
      g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, y = NULL, dx = NULL;
      g_autoptr(GmlpSavedActivations) saved = NULL;
      g_autoptr(GBytes) main_grad = NULL, bgrad = NULL;
      g_autoptr(GError) error = NULL;
      g_autoptr(Problem) p = NULL;
      GmlpGroupedTensor *w;

      layer = new_layer (device, 3, 12, 8, GMLP_DTYPE_FLOAT32,
                         GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS |
                         GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION | GMLP_LINEAR_DELAY_WGRAD_COMPUTE);
      w = gmlp_grouped_linear_get_weight (layer);
      p = problem_new (layer, rows, &x, &dy);
      y = gmlp_grouped_linear_forward (layer, x, &saved, &error);
      g_assert_no_error (error);
      dx = gmlp_grouped_linear_backward (layer, saved, dy, &error);
      g_assert_no_error (error);
      check_output (dx, p->dx, p, 12, "dgrad");
      g_assert_cmpuint (gmlp_grouped_linear_get_pending_wgrads (layer), ==, 1);

      if (what == 0)
        g_assert_true (gmlp_grouped_tensor_fill_zero (x, NULL));
      else if (what == 1)
        g_assert_true (gmlp_grouped_tensor_scale (dy, -1.0, NULL));
      else
        g_assert_true (gmlp_grouped_tensor_add_scaled (w, -0.1, w, NULL));
      main_grad = bytes_or_null (gmlp_grouped_linear_get_main_grad (layer));
      bgrad = bytes_or_null (gmlp_grouped_linear_get_bgrad (layer));

      if (what == 2)
        {
          g_autofree gint64 *len = g_new (gint64, 3);
          guint g;

          g_assert_true (gmlp_grouped_linear_backward_dw (layer, &error));
          g_assert_no_error (error);
          for (g = 0; g < 3; g++)
            len[g] = 8 * 12;
          {
            g_autofree double *got = gmlp_test_download (gmlp_grouped_linear_get_main_grad (layer), NULL);
            assert_groups_close (got, p->dw, p, len, 2e-5, "main_grad");
          }
          continue;
        }

      g_assert_false (gmlp_grouped_linear_backward_dw (layer, &error));
      assert_error_names (error, GMLP_ERROR_INVALID_STATE, what == 0 ? "input" : "output gradient");
      g_clear_error (&error);
      g_assert_cmpuint (gmlp_grouped_linear_get_pending_wgrads (layer), ==, 1);
      assert_same_bytes_or_null (main_grad, gmlp_grouped_linear_get_main_grad (layer), "main_grad");
      assert_same_bytes_or_null (bgrad, gmlp_grouped_linear_get_bgrad (layer), "bgrad");
    }
}

/* main_grad may not share storage with the layer's parameters or their
 * gradients (backward would add dW into W), nor one group's main_grad
 * with another's; and backward does not write a weight gradient (main_grad,
 * wgrad, bgrad) that shares storage with its input or output gradient. */
void
test_main_grad_aliasing (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpGroupedLinear) single = NULL, per_group = NULL, square = NULL;
  g_autoptr(GmlpGroupedTensor) own = NULL, mine = NULL, x = NULL, y = NULL, dy = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GBytes) before = NULL;
  g_autoptr(GError) error = NULL;
  gint64 rows[] = { 8, 8 };
  guint g;

  if (device == NULL)
    return;

  single = new_layer (device, 2, 8, 8, GMLP_DTYPE_FLOAT32,
                      GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION);
  own = g_object_ref (gmlp_grouped_linear_get_main_grad (single));
  g_assert_false (gmlp_grouped_linear_set_main_grad (single, gmlp_grouped_linear_get_weight (single), &error));
  assert_error_names (error, GMLP_ERROR_INVALID_ARGUMENT, "weight");
  g_clear_error (&error);
  g_assert_true (gmlp_grouped_linear_get_main_grad (single) == own);

  per_group = new_layer (device, 2, 8, 8, GMLP_DTYPE_FLOAT32, GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION);
  for (g = 0; g < 2; g++)
    {
      GmlpGroupedTensor *before_g = gmlp_grouped_linear_get_main_grad_member (per_group, g);

      g_assert_false (gmlp_grouped_linear_set_main_grad_member (per_group, g,
                                                                gmlp_grouped_linear_get_weight_member (per_group, 1 - g),
                                                                &error));
      assert_error_names (error, GMLP_ERROR_INVALID_ARGUMENT, "weight");
      g_clear_error (&error);
      g_assert_true (gmlp_grouped_linear_get_main_grad_member (per_group, g) == before_g);
    }
  mine = gmlp_grouped_tensor_new_uniform (device, GMLP_DTYPE_FLOAT32, 1, 8, 8, NULL);
  g_assert_true (gmlp_grouped_linear_set_main_grad_member (per_group, 0, mine, &error));
  g_assert_no_error (error);
  g_assert_false (gmlp_grouped_linear_set_main_grad_member (per_group, 1, mine, &error));
  assert_error_names (error, GMLP_ERROR_INVALID_ARGUMENT, "main_grad");
  g_clear_error (&error);
  /* Binding the same tensor to its own group again is fine. */
  g_assert_true (gmlp_grouped_linear_set_main_grad_member (per_group, 0, mine, &error));
  g_assert_no_error (error);

  /* x (and dy) of 8 × 8 per group can be main_grad itself. */
  square = new_layer (device, 2, 8, 8, GMLP_DTYPE_FLOAT32,
                      GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION);
  x = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, rows, 2, 8, 1.0, NULL);
  dy = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, rows, 2, 8, 1.0, NULL);
  for (g = 0; g < 2; g++)
    {
      GmlpGroupedTensor *main_grad = gmlp_grouped_linear_get_main_grad (square);
      GmlpGroupedTensor *in = g == 0 ? main_grad : x;
      GmlpGroupedTensor *grad = g == 0 ? dy : main_grad;

      g_assert_true (gmlp_grouped_tensor_has_host_sizes (main_grad));
      y = gmlp_grouped_linear_forward (square, in, &saved, &error);
      g_assert_no_error (error);
      before = bytes_or_null (main_grad);
      g_assert_null (gmlp_grouped_linear_backward (square, saved, grad, &error));
      assert_error_names (error, GMLP_ERROR_INVALID_ARGUMENT, "main_grad");
      g_clear_error (&error);
      g_assert_false (gmlp_saved_activations_is_consumed (saved));
      assert_same_bytes_or_null (before, main_grad, "main_grad");
      g_clear_pointer (&before, g_bytes_unref);
      g_clear_object (&saved);
      g_clear_object (&y);
    }

  /* Without fused accumulation, the same for the layer's own weight and
   * bias gradients (a one-row group's dy can be bgrad). */
  {
    g_autoptr(GmlpGroupedLinear) plain = new_layer (device, 2, 8, 8, GMLP_DTYPE_FLOAT32,
                                                    GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS);
    gint64 one[] = { 1, 1 };
    g_autoptr(GmlpGroupedTensor) x1 = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, one, 2, 8, 1.0, NULL);
    GmlpGroupedTensor *wgrad, *bgrad;

    run_step (plain, x, dy);
    wgrad = gmlp_grouped_linear_get_wgrad (plain);
    bgrad = gmlp_grouped_linear_get_bgrad (plain);

    for (g = 0; g < 2; g++)
      {
        GmlpGroupedTensor *in = g == 0 ? wgrad : x1;
        GmlpGroupedTensor *grad = g == 0 ? dy : bgrad;
        GmlpGroupedTensor *written = g == 0 ? wgrad : bgrad;

        y = gmlp_grouped_linear_forward (plain, in, &saved, &error);
        g_assert_no_error (error);
        before = bytes_or_null (written);
        g_assert_null (gmlp_grouped_linear_backward (plain, saved, grad, &error));
        assert_error_names (error, GMLP_ERROR_INVALID_ARGUMENT, g == 0 ? "weight gradient" : "bias gradient");
        g_clear_error (&error);
        g_assert_false (gmlp_saved_activations_is_consumed (saved));
        assert_same_bytes_or_null (before, written, g == 0 ? "wgrad" : "bgrad");
        g_clear_pointer (&before, g_bytes_unref);
        g_clear_object (&saved);
        g_clear_object (&y);
      }
  }
}
