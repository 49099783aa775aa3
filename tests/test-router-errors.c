/* test-router-errors.c: GmlpRouter on bad and empty input
 *
 * Invalid construction and calls (a clear GError before anything is
 * written), zero tokens and non-finite logits.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "test-router.h"

static void
assert_construct_error (GmlpDevice *device,
                        const char *first_property,
                        ...)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpRouter) made = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL;
  g_autoptr(GmlpRouting) routing = NULL;
  GObject *object;
  va_list args;
  gint64 rows = 2;

  va_start (args, first_property);
  object = g_object_new_valist (GMLP_TYPE_ROUTER, first_property, args);
  va_end (args);
  made = GMLP_ROUTER (object);
  g_assert_false (g_initable_init (G_INITABLE (made), NULL, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_test_message ("refused: %s", error->message);
  g_clear_error (&error);

  /* Every method reports it; the getters give nothing. */
  g_assert_null (gmlp_router_get_weight (made));
  g_assert_null (gmlp_router_get_expert_bias (made));
  x = gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, &rows, 1, 16, &error);
  g_assert_no_error (error);
  routing = gmlp_router_forward (made, x, NULL, &error);
  g_assert_null (routing);
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);
  g_assert_false (gmlp_router_update_expert_bias (made, x, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
}

#define BASE "device", device, "hidden", (gint64) 16

void
test_bad_construction (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpRouter) router = NULL;

  if (device == NULL)
    return;
  assert_construct_error (device, "device", device, "hidden", (gint64) 0, "n-experts", 8, "top-k", 2, NULL);
  assert_construct_error (device, "device", device, "hidden", (gint64) -1, "n-experts", 8, "top-k", 2, NULL);
  assert_construct_error (device, "device", device, "hidden", (gint64) G_MAXINT32 + 1, "n-experts", 8, "top-k", 2, NULL);
  assert_construct_error (device, BASE, "n-experts", 0, "top-k", 1, NULL);
  assert_construct_error (device, BASE, "n-experts", 65536, "top-k", 2, NULL);
  assert_construct_error (device, BASE, "n-experts", 8, "top-k", 0, NULL);
  assert_construct_error (device, BASE, "n-experts", 32, "top-k", 17, NULL);
  assert_construct_error (device, BASE, "n-experts", 4, "top-k", 5, NULL);
  assert_construct_error (device, BASE, "n-experts", 8, "top-k", 2, "n-expert-groups", 4, "topk-groups", 5, NULL);
  assert_construct_error (device, BASE, "n-experts", 8, "top-k", 2, "topk-groups", 1, NULL);
  assert_construct_error (device, BASE, "n-experts", 10, "top-k", 2, "n-expert-groups", 4, "topk-groups", 2, NULL);
  assert_construct_error (device, BASE, "n-experts", 8, "top-k", 3, "n-expert-groups", 4, "topk-groups", 1, NULL);
  assert_construct_error (device, BASE, "n-experts", 8, "top-k", 2, "n-expert-groups", 4, "topk-groups", 0, NULL);
  assert_construct_error (device, BASE, "n-experts", 8, "top-k", 2, "flags", GMLP_LINEAR_BIAS, NULL);
  assert_construct_error (device, BASE, "n-experts", 8, "top-k", 2, "flags", GMLP_LINEAR_RECOMPUTE_ACTIVATION, NULL);
  assert_construct_error (device, BASE, "n-experts", 8, "top-k", 2, "scaling-factor", -1.0, NULL);
  assert_construct_error (device, BASE, "n-experts", 8, "top-k", 2, "scaling-factor", INFINITY, NULL);
  assert_construct_error (device, BASE, "n-experts", 8, "top-k", 2, "aux-loss-coeff", -0.5, NULL);
  assert_construct_error (device, BASE, "n-experts", 8, "top-k", 2, "z-loss-coeff", 1e300, NULL);
  assert_construct_error (device, BASE, "n-experts", 8, "top-k", 2, "bias-update-rate", -INFINITY, NULL);

  /* The edges that are fine: k = 16 = E; groups of one expert; one group. */
  router = g_initable_new (GMLP_TYPE_ROUTER, NULL, &error, BASE, "n-experts", 16, "top-k", 16, NULL);
  g_assert_no_error (error);
  g_clear_object (&router);
  router = g_initable_new (GMLP_TYPE_ROUTER, NULL, &error, BASE, "n-experts", 8, "top-k", 4,
                           "n-expert-groups", 8, "topk-groups", 4, NULL);
  g_assert_no_error (error);
  g_clear_object (&router);
  router = g_initable_new (GMLP_TYPE_ROUTER, NULL, &error, BASE, "n-experts", 8, "top-k", 8,
                           "n-expert-groups", 1, "topk-groups", 1, NULL);
  g_assert_no_error (error);
}

/* Calls that are refused write nothing: the saved activations stay
 * usable, the gradients as they were. */
void
test_bad_calls (void)
{
  const Config *c = config ("aux-z");
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(Problem) p = NULL;
  g_autoptr(GmlpRouter) router = NULL, other = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, grad = NULL, dx = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL, other_saved = NULL;
  g_autoptr(GmlpRouting) routing = NULL, other_routing = NULL;
  g_autoptr(GBytes) wgrad_before = NULL, wgrad_after = NULL;
  g_autofree double *gp = NULL;
  g_autoptr(GError) error = NULL;
  gint64 two[2] = { 3, 4 }, rows;
  guint d;

  if (device == NULL)
    return;
  p = problem_new (c, GMLP_DTYPE_FLOAT32, T_TOKENS);
  router = problem_router (p, device, GMLP_LINEAR_NONE);
  gp = random_grad ((gsize) p->T * c->k);
  x = gmlp_test_upload_values (device, p->x, p->T, p->H, GMLP_DTYPE_FLOAT32);
  grad = gmlp_test_upload_values (device, gp, p->T, c->k, GMLP_DTYPE_FLOAT32);
  /* A first step, so that there is a wgrad to keep. */
  run_and_check (p, device, router, gp, NULL, "before the bad calls");
  wgrad_before = gmlp_grouped_tensor_to_bytes (gmlp_router_get_wgrad (router), &error);
  g_assert_no_error (error);

  /* Forward: width, groups, dtype, device sizes. */
  {
    g_autoptr(GmlpGroupedTensor) narrow = gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, two + 1, 1, p->H - 1, &error);
    g_autoptr(GmlpGroupedTensor) grouped = gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, two, 2, p->H, &error);
    g_autoptr(GmlpGroupedTensor) ints = gmlp_grouped_tensor_new (device, GMLP_DTYPE_INT64, two, 1, p->H, &error);
    g_autoptr(GmlpGroupedTensor) fp8 = gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT8_E4M3, two, 1, p->H, &error);
    g_autoptr(GmlpGroupedTensor) sizes = NULL, device_sized = NULL;
    g_autoptr(GBytes) seven = g_bytes_new (two + 1, sizeof (gint64));
    struct { GmlpGroupedTensor *x; int code; } bad[] = {
      { narrow, GMLP_ERROR_SHAPE_MISMATCH },
      { grouped, GMLP_ERROR_SHAPE_MISMATCH },
      { ints, GMLP_ERROR_DTYPE_MISMATCH },
      { fp8, GMLP_ERROR_DTYPE_MISMATCH },
      { NULL, GMLP_ERROR_INVALID_ARGUMENT },
    };
    guint i;

    rows = 1;
    sizes = gmlp_grouped_tensor_new_from_bytes (device, GMLP_DTYPE_INT64, &rows, 1, 1, seven, &error);
    g_assert_no_error (error);
    device_sized = gmlp_grouped_tensor_new_with_device_sizes (device, GMLP_DTYPE_FLOAT32, sizes, 8, p->H, &error);
    g_assert_no_error (error);
    bad[4].x = device_sized;
    for (i = 0; i < G_N_ELEMENTS (bad); i++)
      {
        g_autoptr(GmlpSavedActivations) none = NULL;
        g_autoptr(GmlpRouting) r = gmlp_router_forward (router, bad[i].x, &none, &error);

        g_assert_null (r);
        g_assert_null (none);
        g_assert_error (error, GMLP_ERROR, bad[i].code);
        g_test_message ("forward refused: %s", error->message);
        g_clear_error (&error);
      }
  }

  /* Backward: the gradient's shape and dtype, another router's
   * activations. */
  routing = gmlp_router_forward (router, x, &saved, &error);
  g_assert_no_error (error);
  other = gmlp_router_new (device, p->H, c->E, c->k, &error);
  g_assert_no_error (error);
  other_routing = gmlp_router_forward (other, x, &other_saved, &error);
  g_assert_no_error (error);
  {
    g_autoptr(GmlpGroupedTensor) wide = gmlp_test_upload_values (device, gp, p->T / 2, 2 * c->k, GMLP_DTYPE_FLOAT32);
    g_autoptr(GmlpGroupedTensor) short_grad = gmlp_test_upload_values (device, gp, p->T - 1, c->k, GMLP_DTYPE_FLOAT32);
    g_autoptr(GmlpGroupedTensor) half = gmlp_test_upload_values (device, gp, p->T, c->k, GMLP_DTYPE_FLOAT16);

    g_assert_null (gmlp_router_backward (router, saved, wide, &error));
    g_assert_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH);
    g_clear_error (&error);
    g_assert_null (gmlp_router_backward (router, saved, short_grad, &error));
    g_assert_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH);
    g_clear_error (&error);
    g_assert_null (gmlp_router_backward (router, saved, half, &error));
    g_assert_error (error, GMLP_ERROR, GMLP_ERROR_DTYPE_MISMATCH);
    g_clear_error (&error);
    g_assert_null (gmlp_router_backward (router, other_saved, grad, &error));
    g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
    g_clear_error (&error);
  }
  g_assert_false (gmlp_saved_activations_is_consumed (saved));
  wgrad_after = gmlp_grouped_tensor_to_bytes (gmlp_router_get_wgrad (router), &error);
  g_assert_true (g_bytes_equal (wgrad_before, wgrad_after));

  /* Still usable; once used, refused. */
  dx = gmlp_router_backward (router, saved, grad, &error);
  g_assert_no_error (error);
  g_clear_object (&dx);
  g_assert_null (gmlp_router_backward (router, saved, grad, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
  g_clear_error (&error);

  /* What the forward read, written since: refused, for each dtype of x
   * (a 16-bit input is saved as it came), the weight and the routing. */
  for (d = 0; d < G_N_ELEMENTS (x_dtypes); d++)
    {
      guint what;

      for (what = 0; what < 3; what++)
        {
          g_autoptr(GmlpGroupedTensor) xd = gmlp_test_upload_values (device, p->x, p->T, p->H, x_dtypes[d]);
          g_autoptr(GmlpSavedActivations) s = NULL;
          g_autoptr(GmlpRouting) r = gmlp_router_forward (router, xd, &s, &error);
          g_autoptr(GmlpGroupedTensor) ok = NULL;
          g_autoptr(GBytes) wb = gmlp_test_encode_values (p->w, c->E * p->H, GMLP_DTYPE_FLOAT32);

          g_assert_no_error (error);
          if (what == 0)
            g_assert_true (gmlp_grouped_tensor_fill_zero (xd, &error));
          else if (what == 1)
            g_assert_true (gmlp_router_set_weight_from_bytes (router, wb, &error));
          else
            g_assert_true (gmlp_grouped_tensor_fill_zero (gmlp_routing_get_indices (r), &error));
          g_assert_no_error (error);
          g_assert_null (gmlp_router_backward (router, s, grad, &error));
          g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
          g_test_message ("stale: %s", error->message);
          g_clear_error (&error);
          g_assert_false (gmlp_saved_activations_is_consumed (s));
        }
    }
  g_clear_pointer (&wgrad_after, g_bytes_unref);
  wgrad_after = gmlp_grouped_tensor_to_bytes (gmlp_router_get_wgrad (router), &error);
  g_assert_true (g_bytes_equal (wgrad_before, wgrad_after));
}

/* Zero tokens: an empty routing, zero counts and losses; the backward of
 * nothing is an empty dx and a zero dW. */
void
test_zero_tokens (void)
{
  const Config *c = config ("sigmoid-deepseek");
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(Problem) p = NULL;
  g_autoptr(GmlpRouter) router = NULL;
  g_autoptr(GError) error = NULL;
  guint d;

  if (device == NULL)
    return;
  p = problem_new (c, GMLP_DTYPE_FLOAT32, 0);
  router = problem_router (p, device, GMLP_LINEAR_NONE);
  for (d = 0; d < G_N_ELEMENTS (x_dtypes); d++)
    {
      gint64 zero = 0;
      g_autoptr(GmlpGroupedTensor) x = gmlp_grouped_tensor_new (device, x_dtypes[d], &zero, 1, p->H, &error);
      g_autoptr(GmlpGroupedTensor) grad = gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, &zero, 1, c->k,
                                                                   &error);
      g_autoptr(GmlpSavedActivations) saved = NULL;
      g_autoptr(GmlpRouting) routing = NULL;
      g_autoptr(GmlpGroupedTensor) dx = NULL;
      g_autofree gint64 *counts = NULL;
      g_autofree double *dw = NULL;
      gsize n, i;

      g_assert_no_error (error);
      routing = gmlp_router_forward (router, x, &saved, &error);
      g_assert_no_error (error);
      g_assert_cmpint (gmlp_routing_get_n_tokens (routing), ==, 0);
      g_assert_cmpint (gmlp_grouped_tensor_get_total_rows (gmlp_routing_get_indices (routing)), ==, 0);
      g_assert_cmpint (gmlp_grouped_tensor_get_cols (gmlp_routing_get_indices (routing)), ==, c->k);
      g_assert_cmpint (gmlp_grouped_tensor_get_total_rows (gmlp_routing_get_probs (routing)), ==, 0);
      counts = gmlp_test_download_i64 (gmlp_routing_get_tokens_per_expert (routing), &n);
      g_assert_cmpuint (n, ==, c->E);
      for (i = 0; i < n; i++)
        g_assert_cmpint (counts[i], ==, 0);
      gmlp_assert_same_value (gmlp_test_download_scalar (gmlp_routing_get_aux_loss (routing)), 0.0, "aux", 0);
      gmlp_assert_same_value (gmlp_test_download_scalar (gmlp_routing_get_z_loss (routing)), 0.0, "z", 0);

      dx = gmlp_router_backward (router, saved, grad, &error);
      g_assert_no_error (error);
      g_assert_cmpint (gmlp_grouped_tensor_get_total_rows (dx), ==, 0);
      g_assert_cmpint (gmlp_grouped_tensor_get_dtype (dx), ==, x_dtypes[d]);
      dw = gmlp_test_download (gmlp_router_get_wgrad (router), &n);
      for (i = 0; i < n; i++)
        gmlp_assert_same_value (dw[i], 0.0, "dW of no tokens", i);
    }
}

/* Expert 3's logits all NaN; tokens 0 to 3 with ±∞ or NaN in x (logits of
 * ±∞ or NaN); token 4 all zero. */
void
make_non_finite (Problem *p)
{
  gint64 h;

  g_assert_cmpint (p->T, >=, 5);
  for (h = 0; h < p->H; h++)
    p->w[3 * p->H + h] = NAN;
  p->x[0 * p->H + 1] = INFINITY;
  p->x[1 * p->H + 2] = -INFINITY;
  p->x[2 * p->H + 0] = NAN;
  p->x[3 * p->H + 0] = INFINITY, p->x[3 * p->H + 1] = -INFINITY;
  for (h = 0; h < p->H; h++)
    p->x[4 * p->H + h] = 0.0;
}

/* Non-finite logits: never an expert out of range, never one twice; the
 * counts stay exact; the documented values where they are fixed. */
void
test_non_finite (void)
{
  static const char *which[] = {
    "default", "softmax-after", "sigmoid-top16-of-64", "sigmoid-deepseek", "softmax-groups-bias",
    "softmax-after-groups-bias",
  };
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint i;

  if (device == NULL)
    return;
  for (i = 0; i < G_N_ELEMENTS (which); i++)
    {
      const Config *c = config (which[i]);
      g_autoptr(Problem) p = problem_new (c, GMLP_DTYPE_FLOAT32, T_TOKENS);
      g_autoptr(GmlpRouter) router = NULL;
      g_autoptr(GmlpGroupedTensor) x = NULL;
      g_autoptr(GmlpRouting) routing = NULL;
      g_autoptr(GError) error = NULL;
      g_autofree gint64 *idx = NULL, *counts = NULL;
      g_autofree double *probs = NULL, *histogram = g_new0 (double, c->E);
      gint64 t;
      gsize n;
      guint j, q;

      make_non_finite (p);
      router = problem_router (p, device, GMLP_LINEAR_NONE);
      x = gmlp_test_upload_values (device, p->x, p->T, p->H, GMLP_DTYPE_FLOAT32);
      routing = gmlp_router_forward (router, x, NULL, &error);
      g_assert_no_error (error);

      idx = gmlp_test_download_i64 (gmlp_routing_get_indices (routing), &n);
      counts = gmlp_test_download_i64 (gmlp_routing_get_tokens_per_expert (routing), &n);
      probs = gmlp_test_download (gmlp_routing_get_probs (routing), &n);
      for (t = 0; t < p->T; t++)
        for (j = 0; j < c->k; j++)
          {
            gint64 e = idx[t * c->k + j];

            g_assert_cmpint (e, >=, 0);
            g_assert_cmpint (e, <, c->E);
            for (q = 0; q < j; q++)
              g_assert_cmpint (idx[t * c->k + q], !=, e);
            histogram[e] += 1.0;
          }
      for (j = 0; j < c->E; j++)
        g_assert_cmpfloat (counts[j], ==, histogram[j]);

      if (c->score == SOFTMAX && c->before && !c->bias && c->groups == 0)
        {
          /* Every score NaN: every token takes the first k experts. */
          for (t = 0; t < p->T; t++)
            for (j = 0; j < c->k; j++)
              g_assert_cmpint (idx[t * c->k + j], ==, j);
        }
      if (c->score == SIGMOID || !c->before)
        {
          /* NaN values rank last: where the other logits are finite
           * (from token 4 on), expert 3 is never chosen, and the sigmoid
           * gives finite probabilities. */
          for (t = 4; t < p->T; t++)
            for (j = 0; j < c->k; j++)
              {
                g_assert_cmpint (idx[t * c->k + j], !=, 3);
                if (c->score == SIGMOID)
                  g_assert_true (isfinite (probs[t * c->k + j]));
              }
        }
      if (c->aux == 0.0)
        gmlp_assert_same_value (gmlp_test_download_scalar (gmlp_routing_get_aux_loss (routing)), 0.0, "aux", 0);
      if (c->z == 0.0)
        gmlp_assert_same_value (gmlp_test_download_scalar (gmlp_routing_get_z_loss (routing)), 0.0, "z", 0);
    }
}
