/* test-router-training.c: GmlpRouter in training
 *
 * The expert bias, main_grad accumulation and delayed wgrad.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "test-router.h"

/* Aux-loss-free balancing: the bias chooses, the unbiased scores weigh;
 * update_expert_bias moves it by the documented rule. */
void
test_expert_bias (void)
{
  static const Config c = { "bias", SIGMOID, TRUE, TRUE, 1.0, 8, 2, 0, 0, TRUE, 0.0, 0.0 };
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(Problem) p = NULL;
  g_autoptr(GmlpRouter) router = NULL, plain = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, hand = NULL;
  g_autoptr(GmlpRouting) routing = NULL;
  g_autoptr(GBytes) hand_bytes = NULL;
  g_autoptr(GError) error = NULL;
  g_autofree double *got = NULL;
  double expect[8];
  gint64 hand_counts[8] = { 5, 3, 3, 3, 3, 3, 3, 1 };   /* mean 3 */
  gint64 one = 1;
  guint64 version;
  gsize n, e;

  if (device == NULL)
    return;
  p = problem_new (&c, GMLP_DTYPE_FLOAT32, T_TOKENS);
  /* A bias that overrides any sigmoid score: every token picks 6, then 2. */
  for (e = 0; e < 8; e++)
    p->bias[e] = e == 6 ? 10.0 : e == 2 ? 5.0 : 0.0;
  g_free (p->idx), g_free (p->probs), g_free (p->counts);
  p->idx = g_new (gint64, p->T * c.k);
  p->probs = g_new (double, p->T * c.k);
  p->counts = g_new (double, c.E);
  ref_forward (p, p->x, p->w, p->idx, p->probs, p->counts, &p->aux, &p->z);
  for (e = 0; e < (gsize) p->T; e++)
    {
      g_assert_cmpint (p->idx[2 * e], ==, 6);
      g_assert_cmpint (p->idx[2 * e + 1], ==, 2);
    }

  router = problem_router (p, device, GMLP_LINEAR_NONE);
  x = gmlp_test_upload_values (device, p->x, p->T, p->H, GMLP_DTYPE_FLOAT32);
  routing = gmlp_router_forward (router, x, NULL, &error);
  g_assert_no_error (error);
  /* The probabilities are the sigmoid scores of 6 and 2, renormalized:
   * never the biased values. */
  assert_routing (p, routing, "bias chooses");

  /* update: bias_i += rate × sign (mean − load_i); loads T for 6 and 2, 0
   * for the others, mean T / 4. */
  version = gmlp_grouped_tensor_get_version (gmlp_router_get_expert_bias (router));
  g_assert_true (gmlp_router_update_expert_bias (router, gmlp_routing_get_tokens_per_expert (routing), &error));
  g_assert_no_error (error);
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (gmlp_router_get_expert_bias (router)), >, version);
  for (e = 0; e < 8; e++)
    expect[e] = (float) ((float) p->bias[e] + (e == 6 || e == 2 ? -1e-3f : 1e-3f));
  got = gmlp_test_download (gmlp_router_get_expert_bias (router), &n);
  g_assert_cmpuint (n, ==, 8);
  for (e = 0; e < 8; e++)
    g_assert_cmpfloat_with_epsilon (got[e], expect[e], 1e-6);

  /* Hand-made loads, one row: an expert at the mean keeps its bias. */
  hand_bytes = g_bytes_new_static (hand_counts, sizeof hand_counts);
  hand = gmlp_grouped_tensor_new_from_bytes (device, GMLP_DTYPE_INT64, &one, 1, 8, hand_bytes, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_router_update_expert_bias (router, hand, &error));
  g_assert_no_error (error);
  g_clear_pointer (&got, g_free);
  got = gmlp_test_download (gmlp_router_get_expert_bias (router), &n);
  for (e = 0; e < 8; e++)
    {
      double want = (float) (expect[e] + (e == 0 ? -1e-3f : e == 7 ? 1e-3f : 0.0f));

      g_assert_cmpfloat_with_epsilon (got[e], want, 1e-6);
      if (e > 0 && e < 7)
        g_assert_cmpfloat (got[e], ==, expect[e]);
    }

  /* A router without bias refuses; so do loads of another kind, and the
   * bias is unchanged. */
  plain = gmlp_router_new (device, p->H, 8, 2, &error);
  g_assert_no_error (error);
  g_assert_false (gmlp_router_update_expert_bias (plain, hand, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
  g_clear_error (&error);
  {
    g_autoptr(GBytes) four = g_bytes_new (hand_counts, sizeof (gint64) * 4);
    g_autoptr(GBytes) i32 = g_bytes_new (hand_counts, sizeof hand_counts);
    g_autoptr(GBytes) seven_floats = g_bytes_new (hand_counts, sizeof (float) * 7);
    gint64 four_rows = 4, two_rows[2] = { 4, 4 };
    g_autoptr(GmlpGroupedTensor) short_counts = gmlp_grouped_tensor_new_from_bytes (device, GMLP_DTYPE_INT64,
                                                                                    &four_rows, 1, 1, four, &error);
    g_autoptr(GmlpGroupedTensor) int32_counts = gmlp_grouped_tensor_new_from_bytes (device, GMLP_DTYPE_INT32,
                                                                                    &one, 1, 16, i32, &error);
    g_autoptr(GmlpGroupedTensor) two_groups = gmlp_grouped_tensor_new_from_bytes (device, GMLP_DTYPE_INT64,
                                                                                  two_rows, 2, 1, i32, &error);
    g_autoptr(GBytes) before = gmlp_grouped_tensor_to_bytes (gmlp_router_get_expert_bias (router), &error);
    g_autoptr(GBytes) after = NULL;

    g_assert_no_error (error);
    g_assert_false (gmlp_router_update_expert_bias (router, short_counts, &error));
    g_assert_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH);
    g_clear_error (&error);
    g_assert_false (gmlp_router_update_expert_bias (router, int32_counts, &error));
    g_assert_error (error, GMLP_ERROR, GMLP_ERROR_DTYPE_MISMATCH);
    g_clear_error (&error);
    g_assert_false (gmlp_router_update_expert_bias (router, two_groups, &error));
    g_assert_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH);
    g_clear_error (&error);
    g_assert_false (gmlp_router_set_expert_bias_from_bytes (router, seven_floats, &error));
    g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
    g_clear_error (&error);
    g_assert_false (gmlp_router_set_expert_bias_from_bytes (plain, four, &error));
    g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
    g_clear_error (&error);
    after = gmlp_grouped_tensor_to_bytes (gmlp_router_get_expert_bias (router), &error);
    g_assert_no_error (error);
    g_assert_true (g_bytes_equal (before, after));
  }
}

static void
count_wgrad_ready (GmlpRouter *router,
                   GmlpEvent  *event,
                   gpointer    data)
{
  guint *count = data;
  g_autoptr(GError) error = NULL;

  g_assert_true (GMLP_IS_EVENT (event));
  g_assert_true (gmlp_event_synchronize (event, &error));
  g_assert_no_error (error);
  (*count)++;
}

/* Fused accumulation: main_grad += dW, into a main_grad of the caller's. */
void
test_main_grad (void)
{
  const Config *c = config ("sigmoid-deepseek");   /* groups, bias, aux, z */
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(Problem) p1 = NULL, p2 = NULL;
  g_autoptr(GmlpRouter) router = NULL, plain = NULL;
  g_autoptr(GmlpGroupedTensor) main_grad = NULL, wrong = NULL;
  g_autoptr(GError) error = NULL;
  g_autofree double *m0 = NULL, *dw1 = NULL, *dw2 = NULL, *got = NULL, *gp1 = NULL, *gp2 = NULL;
  guint ready = 0;
  gsize i, n;

  if (device == NULL)
    return;
  p1 = problem_new (c, GMLP_DTYPE_BFLOAT16, T_TOKENS);
  p2 = problem_new_like (c, GMLP_DTYPE_BFLOAT16, T_TOKENS, p1);
  router = problem_router (p1, device, GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION);
  g_signal_connect (router, "wgrad-ready", G_CALLBACK (count_wgrad_ready), &ready);
  g_assert_nonnull (gmlp_router_get_main_grad (router));
  got = gmlp_test_download (gmlp_router_get_main_grad (router), &n);
  for (i = 0; i < n; i++)
    g_assert_cmpfloat (got[i], ==, 0.0);

  m0 = random_grad (c->E * p1->H);
  main_grad = gmlp_test_upload_values (device, m0, c->E, p1->H, GMLP_DTYPE_FLOAT32);
  g_assert_true (gmlp_router_set_main_grad (router, main_grad, &error));
  g_assert_no_error (error);
  g_assert_true (gmlp_router_get_main_grad (router) == main_grad);

  dw1 = g_new (double, c->E * p1->H);
  dw2 = g_new (double, c->E * p1->H);
  gp1 = random_grad ((gsize) p1->T * c->k);
  gp2 = random_grad ((gsize) p2->T * c->k);
  run_and_check (p1, device, router, gp1, dw1, "fused, step 1");
  g_assert_null (gmlp_router_get_wgrad (router));
  g_assert_true (gmlp_router_get_grad_added_to_main_grad (router));
  run_and_check (p2, device, router, gp2, dw2, "fused, step 2");
  g_assert_cmpuint (ready, ==, 2);

  for (i = 0; i < (gsize) (c->E * p1->H); i++)
    m0[i] += dw1[i] + dw2[i];
  g_clear_pointer (&got, g_free);
  got = gmlp_test_download (main_grad, &n);
  gmlp_test_assert_close (got, m0, n, 1e-4, "main_grad = m0 + dW1 + dW2");

  /* main_grad needs fused accumulation, and the gate's shape. */
  plain = gmlp_router_new (device, p1->H, c->E, c->k, &error);
  g_assert_no_error (error);
  g_assert_false (gmlp_router_set_main_grad (plain, main_grad, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
  g_clear_error (&error);
  wrong = gmlp_test_upload_values (device, m0, p1->H, c->E, GMLP_DTYPE_FLOAT32);
  g_assert_false (gmlp_router_set_main_grad (router, wrong, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH);
  g_assert_true (gmlp_router_get_main_grad (router) == main_grad);
}

/* Delayed weight gradients: backward queues, backward_dw computes, oldest
 * first, and emits wgrad-ready; also into main_grad. */
void
test_delayed_wgrad (void)
{
  const Config *c = config ("aux-z");
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint fused;

  if (device == NULL)
    return;
  for (fused = 0; fused < 2; fused++)
    {
      GmlpLinearFlags flags = GMLP_LINEAR_DELAY_WGRAD_COMPUTE |
                              (fused ? GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION : 0);
      g_autoptr(Problem) p1 = problem_new (c, GMLP_DTYPE_FLOAT32, T_TOKENS);
      g_autoptr(Problem) p2 = problem_new_like (c, GMLP_DTYPE_FLOAT32, 9, p1);
      g_autoptr(GmlpRouter) router = problem_router (p1, device, flags);
      g_autofree double *dw1 = g_new (double, c->E * p1->H);
      g_autofree double *dw2 = g_new (double, c->E * p1->H);
      g_autofree double *gp1 = random_grad ((gsize) p1->T * c->k);
      g_autofree double *gp2 = random_grad ((gsize) p2->T * c->k);
      g_autofree double *got = NULL;
      g_autoptr(GError) error = NULL;
      guint ready = 0, notified = 0;
      gsize i, n;

      g_signal_connect (router, "wgrad-ready", G_CALLBACK (count_wgrad_ready), &ready);
      g_signal_connect (router, "notify::pending-wgrads", G_CALLBACK (gmlp_test_count_notify), &notified);
      run_and_check (p1, device, router, gp1, dw1, "delayed, step 1");
      run_and_check (p2, device, router, gp2, dw2, "delayed, step 2");
      g_assert_cmpuint (ready, ==, 0);
      g_assert_cmpuint (gmlp_router_get_pending_wgrads (router), ==, 2);
      g_assert_cmpuint (notified, ==, 2);
      g_assert_null (gmlp_router_get_wgrad (router));

      g_assert_true (gmlp_router_backward_dw (router, &error));
      g_assert_no_error (error);
      g_assert_cmpuint (ready, ==, 1);
      g_assert_cmpuint (gmlp_router_get_pending_wgrads (router), ==, 1);
      if (!fused)
        {
          got = gmlp_test_download (gmlp_router_get_wgrad (router), &n);
          gmlp_test_assert_close (got, dw1, n, 1e-4, "backward_dw 1: the first step's dW");
          g_clear_pointer (&got, g_free);
        }
      g_assert_true (gmlp_router_backward_dw (router, &error));
      g_assert_no_error (error);
      g_assert_cmpuint (ready, ==, 2);
      g_assert_cmpuint (gmlp_router_get_pending_wgrads (router), ==, 0);
      if (fused)
        {
          for (i = 0; i < (gsize) (c->E * p1->H); i++)
            dw1[i] += dw2[i];
          got = gmlp_test_download (gmlp_router_get_main_grad (router), &n);
          gmlp_test_assert_close (got, dw1, n, 1e-4, "backward_dw: main_grad = dW1 + dW2");
        }
      else
        {
          got = gmlp_test_download (gmlp_router_get_wgrad (router), &n);
          gmlp_test_assert_close (got, dw2, n, 1e-4, "backward_dw 2: the second step's dW");
        }

      g_assert_false (gmlp_router_backward_dw (router, &error));
      g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
      g_assert_cmpuint (ready, ==, 2);
    }

  /* Without the flag, backward computes, and backward_dw refuses. */
  {
    g_autoptr(Problem) p = problem_new (c, GMLP_DTYPE_FLOAT32, T_TOKENS);
    g_autoptr(GmlpRouter) router = problem_router (p, device, GMLP_LINEAR_NONE);
    g_autofree double *gp = random_grad ((gsize) p->T * c->k);
    g_autoptr(GError) error = NULL;
    guint ready = 0;

    g_signal_connect (router, "wgrad-ready", G_CALLBACK (count_wgrad_ready), &ready);
    run_and_check (p, device, router, gp, NULL, "not delayed");
    g_assert_cmpuint (ready, ==, 1);
    g_assert_false (gmlp_router_backward_dw (router, &error));
    g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
  }
}
