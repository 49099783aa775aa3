/* test-moe-layer-state.c: GmlpMoELayer's state
 *
 * Tensor versions, properties, parameter initialization, graphs, main_grad
 * across partial backwards, and a backward_dw that fails without writing.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "test-moe-layer.h"

/* What the forward read, written between forward and backward: the input,
 * the gate weight, an expert's weight, the shared expert's weight. The
 * backward refuses before it writes anything, whichever part of the layer
 * would have found it. */
void
test_versions (void)
{
  Config c = *config ("deepseek");
  g_autoptr(GmlpDevice) device = layer_device_or_skip ();
  g_autoptr(Problem) p = NULL;
  g_autoptr(GmlpMoELayer) layer = NULL;
  g_autoptr(GmlpGroupedTensor) dy = NULL;
  g_auto(Step) first = { NULL, };
  guint d, what;

  if (device == NULL)
    return;
  c.flags = GMLP_LINEAR_BIAS | GMLP_LINEAR_SINGLE_GROUPED_WEIGHT;
  for (d = 0; d < G_N_ELEMENTS (dtypes); d++)
    {
      g_clear_pointer (&p, problem_free);
      g_clear_object (&layer);
      g_clear_object (&dy);
      step_clear (&first);
      p = problem_new (&c, dtypes[d], T_TOKENS);
      layer = problem_layer (p, device, GMLP_LINEAR_NONE);
      run_step (p, device, layer, FALSE, &first);
      /* Another dy than the step's: a part that ran would change its
       * gradients. */
      {
        g_autofree double *dy_values = gmlp_test_normals (p->T * p->H, 1.0, p->dtype);

        dy = gmlp_test_upload_values (device, dy_values, p->T, p->H, p->dtype);
      }

      for (what = 0; what < 5; what++)
        {
          g_autoptr(GmlpGroupedTensor) x = gmlp_test_upload_values (device, p->x, p->T, p->H, p->dtype);
          g_autoptr(GmlpGroupedTensor) y = NULL, dx = NULL;
          g_autoptr(GmlpSavedActivations) saved = NULL;
          g_autoptr(GPtrArray) before = NULL, after = NULL;
          g_autoptr(GError) error = NULL;
          GmlpGroupedLinear *fc1 = gmlp_grouped_mlp_get_fc1 (gmlp_moe_layer_get_experts (layer));
          GmlpGroupedLinear *sfc2 = gmlp_grouped_mlp_get_fc2 (gmlp_moe_layer_get_shared_expert (layer));
          g_autoptr(GmlpRouting) routing = NULL;
          g_autoptr(GBytes) wg = gmlp_test_encode_values (p->wg, c.E * p->H, GMLP_DTYPE_FLOAT32);

          y = gmlp_moe_layer_forward (layer, x, &saved, &error);
          g_assert_no_error (error);
          before = gmlp_test_moe_gradient_bytes (layer);
          switch (what)
            {
            case 0:
              g_assert_true (gmlp_grouped_tensor_fill_zero (x, &error));
              break;
            case 1:
              g_assert_true (gmlp_router_set_weight_from_bytes (gmlp_moe_layer_get_router (layer), wg, &error));
              break;
            case 2:
              gmlp_test_set_linear (fc1, p->experts->w1, p->experts->b1);
              break;
            case 3:
              gmlp_test_set_linear (sfc2, p->shared->w2, p->shared->b2);
              break;
            case 4:
              /* The routing the forward made. */
              routing = gmlp_moe_layer_get_routing (layer);
              g_assert_true (gmlp_grouped_tensor_fill_zero (gmlp_routing_get_probs (routing), &error));
              break;
            default:
              g_assert_not_reached ();
            }
          g_assert_no_error (error);
          dx = gmlp_moe_layer_backward (layer, saved, dy, &error);
          g_assert_null (dx);
          g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
          g_test_message ("stale %u: %s", what, error->message);
          g_assert_false (gmlp_saved_activations_is_consumed (saved));
          after = gmlp_test_moe_gradient_bytes (layer);
          gmlp_test_assert_same_bytes_array (before, after, "gradients after a stale backward");
        }
    }
}

/* The properties a layer is made with come back. */
void
test_properties (void)
{
  const Config *c = config ("deepseek");
  g_autoptr(GmlpDevice) device = layer_device_or_skip ();
  g_autoptr(GmlpMoELayer) layer = NULL;
  GmlpDevice *got_device;
  gint64 hidden, ffn, shared;
  guint E, k, groups, topk_groups, padding;
  GmlpActivation act;
  GmlpDType dtype;
  GmlpLinearFlags flags;
  GmlpScoreFunction score;
  gboolean before, renorm, bias;
  double scale, rate, aux, z, capacity;
  g_autoptr(GError) error = NULL;
  GmlpRouter *router;

  if (device == NULL)
    return;
  layer = g_initable_new (GMLP_TYPE_MOE_LAYER, NULL, &error,
                          "device", device, "hidden", (gint64) 24, "ffn-hidden", (gint64) 40,
                          "n-experts", c->E, "top-k", c->k, "activation", GMLP_ACTIVATION_GEGLU,
                          "dtype", GMLP_DTYPE_FLOAT16, "flags", GMLP_LINEAR_BIAS | GMLP_LINEAR_DELAY_WGRAD_COMPUTE,
                          "score-function", c->score, "softmax-before-topk", FALSE, "renormalize", FALSE,
                          "scaling-factor", c->scale, "n-expert-groups", c->groups, "topk-groups", c->topk_groups,
                          "expert-bias", TRUE, "bias-update-rate", 0.25, "aux-loss-coeff", c->aux,
                          "z-loss-coeff", c->z, "padding", 32, "capacity-factor", 1.25,
                          "shared-expert-ffn-hidden", (gint64) 56, NULL);
  g_assert_no_error (error);
  g_object_get (layer, "device", &got_device, "hidden", &hidden, "ffn-hidden", &ffn, "n-experts", &E,
                "top-k", &k, "activation", &act, "dtype", &dtype, "flags", &flags, "score-function", &score,
                "softmax-before-topk", &before, "renormalize", &renorm, "scaling-factor", &scale,
                "n-expert-groups", &groups, "topk-groups", &topk_groups, "expert-bias", &bias,
                "bias-update-rate", &rate, "aux-loss-coeff", &aux, "z-loss-coeff", &z, "padding", &padding,
                "capacity-factor", &capacity, "shared-expert-ffn-hidden", &shared, NULL);
  g_assert_true (got_device == device);
  g_object_unref (got_device);
  g_assert_cmpint (hidden, ==, 24);
  g_assert_cmpint (ffn, ==, 40);
  g_assert_cmpuint (E, ==, c->E);
  g_assert_cmpuint (k, ==, c->k);
  g_assert_cmpint (act, ==, GMLP_ACTIVATION_GEGLU);
  g_assert_cmpint (dtype, ==, GMLP_DTYPE_FLOAT16);
  g_assert_cmpint (flags, ==, GMLP_LINEAR_BIAS | GMLP_LINEAR_DELAY_WGRAD_COMPUTE);
  g_assert_cmpint (score, ==, c->score);
  g_assert_false (before);
  g_assert_false (renorm);
  g_assert_cmpfloat (scale, ==, c->scale);
  g_assert_cmpuint (groups, ==, c->groups);
  g_assert_cmpuint (topk_groups, ==, c->topk_groups);
  g_assert_true (bias);
  g_assert_cmpfloat (rate, ==, 0.25);
  g_assert_cmpfloat (aux, ==, c->aux);
  g_assert_cmpfloat (z, ==, c->z);
  g_assert_cmpuint (padding, ==, 32);
  g_assert_cmpfloat (capacity, ==, 1.25);
  g_assert_cmpint (shared, ==, 56);

  /* The parts are made from them: the router's options, the experts', the
   * shared expert's. */
  router = gmlp_moe_layer_get_router (layer);
  {
    gboolean r_before, r_renorm, r_bias;
    double r_scale, r_rate, r_aux, r_z;
    guint r_groups, r_topk_groups;

    g_object_get (router, "softmax-before-topk", &r_before, "renormalize", &r_renorm, "expert-bias", &r_bias,
                  "scaling-factor", &r_scale, "bias-update-rate", &r_rate, "aux-loss-coeff", &r_aux,
                  "z-loss-coeff", &r_z, "n-expert-groups", &r_groups, "topk-groups", &r_topk_groups, NULL);
    g_assert_false (r_before);
    g_assert_false (r_renorm);
    g_assert_true (r_bias);
    g_assert_cmpfloat (r_scale, ==, c->scale);
    g_assert_cmpfloat (r_rate, ==, 0.25);
    g_assert_cmpfloat (r_aux, ==, c->aux);
    g_assert_cmpfloat (r_z, ==, c->z);
    g_assert_cmpuint (r_groups, ==, c->groups);
    g_assert_cmpuint (r_topk_groups, ==, c->topk_groups);
    g_assert_cmpint (gmlp_router_get_score_function (router), ==, c->score);
    g_assert_cmpint (gmlp_router_get_hidden (router), ==, 24);
    g_assert_cmpint (gmlp_router_get_flags (router), ==, GMLP_LINEAR_DELAY_WGRAD_COMPUTE);
    g_assert_nonnull (gmlp_router_get_expert_bias (router));
  }
  {
    GmlpGroupedMLP *mlps[2] = { gmlp_moe_layer_get_experts (layer), gmlp_moe_layer_get_shared_expert (layer) };
    guint i;

    for (i = 0; i < 2; i++)
      {
        GmlpGroupedLinear *fc1, *fc2;

        g_assert_nonnull (mlps[i]);
        fc1 = gmlp_grouped_mlp_get_fc1 (mlps[i]);
        fc2 = gmlp_grouped_mlp_get_fc2 (mlps[i]);
        g_assert_cmpint (gmlp_grouped_mlp_get_activation (mlps[i]), ==, GMLP_ACTIVATION_GEGLU);
        g_assert_cmpuint (gmlp_grouped_linear_get_n_groups (fc1), ==, i == 0 ? c->E : 1);
        g_assert_cmpint (gmlp_grouped_linear_get_in_features (fc1), ==, 24);
        g_assert_cmpint (gmlp_grouped_linear_get_out_features (fc1), ==, 2 * (i == 0 ? 40 : 56));
        g_assert_cmpint (gmlp_grouped_linear_get_out_features (fc2), ==, 24);
        g_assert_cmpint (gmlp_grouped_linear_get_dtype (fc1), ==, GMLP_DTYPE_FLOAT16);
        g_assert_cmpint (gmlp_grouped_linear_get_flags (fc1), ==, GMLP_LINEAR_BIAS | GMLP_LINEAR_DELAY_WGRAD_COMPUTE);
        g_assert_cmpint (gmlp_grouped_linear_get_flags (fc2), ==, GMLP_LINEAR_BIAS | GMLP_LINEAR_DELAY_WGRAD_COMPUTE);
      }
  }
}

/* init_parameters: reproducible from the seed, different for another
 * seed, and for every part (router, experts, shared expert). */
void
test_init_parameters (void)
{
  const Config *c = config ("deepseek");
  g_autoptr(GmlpDevice) device = layer_device_or_skip ();
  GmlpMoELayer *layers[3];
  GBytes *bytes[3][4];
  g_autoptr(GError) error = NULL;
  guint i, j;

  if (device == NULL)
    return;
  for (i = 0; i < 3; i++)
    {
      GmlpGroupedTensor *w[4];

      layers[i] = layer_new (device, c, GMLP_DTYPE_BFLOAT16, GMLP_LINEAR_NONE);
      g_assert_true (gmlp_moe_layer_init_parameters (layers[i], i == 2 ? 8 : 7, &error));
      g_assert_no_error (error);
      w[0] = gmlp_router_get_weight (gmlp_moe_layer_get_router (layers[i]));
      w[1] = gmlp_grouped_linear_get_weight (gmlp_grouped_mlp_get_fc1 (gmlp_moe_layer_get_experts (layers[i])));
      w[2] = gmlp_grouped_linear_get_weight (gmlp_grouped_mlp_get_fc2 (gmlp_moe_layer_get_experts (layers[i])));
      w[3] = gmlp_grouped_linear_get_weight (gmlp_grouped_mlp_get_fc1 (gmlp_moe_layer_get_shared_expert (layers[i])));
      for (j = 0; j < 4; j++)
        {
          g_autofree double *v = NULL;
          gsize n, q;
          double norm = 0.0;

          g_assert_nonnull (w[j]);
          bytes[i][j] = gmlp_grouped_tensor_to_bytes (w[j], &error);
          g_assert_no_error (error);
          v = gmlp_test_download (w[j], &n);
          for (q = 0; q < n; q++)
            {
              g_assert_true (isfinite (v[q]));
              norm += v[q] * v[q];
            }
          g_assert_cmpfloat (norm, >, 0.0);
        }
    }
  for (j = 0; j < 4; j++)
    {
      g_assert_true (g_bytes_equal (bytes[0][j], bytes[1][j]));
      g_assert_false (g_bytes_equal (bytes[0][j], bytes[2][j]));
    }
  for (i = 0; i < 3; i++)
    {
      for (j = 0; j < 4; j++)
        g_bytes_unref (bytes[i][j]);
      g_object_unref (layers[i]);
    }
}

/* A whole step (forward, backward, the aux and z losses) captured once in
 * a GmlpGraph and replayed on new tokens and output gradients written into
 * the same tensors: each replay gives the float64 reference of its data,
 * and the same bytes (outputs and every gradient) as the step run eagerly
 * on that data by a second layer with the same parameters (the layer's
 * getters keep naming the captured forward's routing and losses, which a
 * forward of its own would replace). While a device captures, every call
 * that would wait for it or read its memory on the host fails
 * (test-graph.c), so a step that is captured whole synchronizes nothing;
 * the replays show that what was captured is the whole step. */
void
test_graph (void)
{
  static const char *const names[] = { "mixtral", "deepseek", "capacity-padded" };
  g_autoptr(GmlpDevice) device = layer_device_or_skip ();
  guint i, d, replay;

  if (device == NULL)
    return;
  if (gmlp_device_get_kind (device) == GMLP_DEVICE_KIND_CPU)
    {
      g_test_skip ("graphs need a GPU");
      return;
    }
  for (i = 0; i < G_N_ELEMENTS (names); i++)
    for (d = 0; d < G_N_ELEMENTS (dtypes); d++)
      {
        const Config *c = config (names[i]);
        g_autoptr(Problem) p = problem_new (c, dtypes[d], T_TOKENS);
        g_autoptr(GmlpMoELayer) layer = problem_layer (p, device, GMLP_LINEAR_NONE);
        g_autoptr(GmlpMoELayer) eager_layer = problem_layer (p, device, GMLP_LINEAR_NONE);
        g_autoptr(GmlpGroupedTensor) x = gmlp_test_upload_values (device, p->x, p->T, p->H, p->dtype);
        g_autoptr(GmlpGroupedTensor) dy = gmlp_test_upload_values (device, p->dy, p->T, p->H, p->dtype);
        g_autoptr(GmlpSavedActivations) saved = NULL;
        g_autoptr(GmlpGraph) graph = NULL;
        g_autoptr(GError) error = NULL;
        g_auto(Step) captured = { NULL, };

        g_assert_true (gmlp_device_begin_capture (device, &error));
        g_assert_no_error (error);
        captured.y = gmlp_moe_layer_forward (layer, x, &saved, &error);
        g_assert_no_error (error);
        captured.dx = gmlp_moe_layer_backward (layer, saved, dy, &error);
        g_assert_no_error (error);
        graph = gmlp_device_end_capture (device, &error);
        g_assert_no_error (error);
        g_assert_nonnull (graph);

        for (replay = 0; replay < 3; replay++)
          {
            g_autoptr(Problem) q = problem_new_like (c, dtypes[d], T_TOKENS, p);
            g_autofree char *what = g_strdup_printf ("%s %s replay %u", c->name, gmlp_dtype_get_name (dtypes[d]),
                                                     replay);
            g_autofree double *replayed_grads = NULL, *eager_grads = NULL;
            g_auto(Step) eager = { NULL, };
            gsize n, m, k;

            gmlp_test_overwrite_values (x, q->x);
            gmlp_test_overwrite_values (dy, q->dy);
            g_assert_true (gmlp_graph_replay (graph, &error));
            g_assert_no_error (error);
            check_step (q, layer, &captured, TRUE, what);
            replayed_grads = layer_grads (layer, &n);

            run_step (q, device, eager_layer, FALSE, &eager);
            gmlp_test_assert_same_bytes (captured.y, eager.y, what);
            gmlp_test_assert_same_bytes (captured.dx, eager.dx, what);
            eager_grads = layer_grads (eager_layer, &m);
            g_assert_cmpuint (n, ==, m);
            for (k = 0; k < n; k++)
              if (memcmp (&replayed_grads[k], &eager_grads[k], sizeof (double)) != 0)
                g_error ("%s: gradient value %" G_GSIZE_FORMAT ": %.17g replayed, %.17g eagerly", what, k,
                         replayed_grads[k], eager_grads[k]);
          }
      }
}

/* A main_grad that holds what another part reads: the router's main_grad
 * (experts × hidden, FP32) as the tokens of a step of as many tokens as
 * experts, or as its output gradient. The parts write one after the other
 * (backward: the experts, the router, the shared expert; backward_dw: the
 * router, the experts, the shared expert), so without a check of every
 * part's main_grad against what any part reads the router refused after
 * the experts had added into theirs, or added into the output gradient
 * before the shared expert read it. Refused first, every main_grad as it
 * was and the step still usable: by backward, or with delayed weight
 * gradients (backward writes none) by backward_dw, every part's still
 * pending. */
void
test_main_grad_across_parts (void)
{
  g_autoptr(GmlpDevice) device = layer_device_or_skip ();
  guint which, delayed;

  if (device == NULL)
    return;

  for (delayed = 0; delayed < 2; delayed++)
    for (which = 0; which < 2; which++)
      {
        const guint n_experts = 8;
        g_autoptr(GmlpMoELayer) layer = NULL;
        g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, y = NULL, dx = NULL, other = NULL;
        g_autoptr(GmlpSavedActivations) saved = NULL;
        g_autoptr(GPtrArray) before = NULL, after = NULL;
        g_autoptr(GError) error = NULL;
        gint64 tokens = n_experts;
        GmlpGroupedTensor *router_grad;
        GmlpRouter *router;

        layer = g_initable_new (GMLP_TYPE_MOE_LAYER, NULL, &error, "device", device,
                                "hidden", (gint64) HIDDEN, "ffn-hidden", (gint64) FFN,
                                "n-experts", n_experts, "top-k", 2u, "dtype", GMLP_DTYPE_FLOAT32,
                                "flags", GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION |
                                         (delayed ? GMLP_LINEAR_DELAY_WGRAD_COMPUTE : 0),
                                "shared-expert-ffn-hidden", (gint64) FFN, NULL);
        g_assert_no_error (error);
        g_assert_true (gmlp_moe_layer_init_parameters (layer, 7, &error));
        g_assert_no_error (error);
        router = gmlp_moe_layer_get_router (layer);
        router_grad = gmlp_router_get_main_grad (router);
        g_assert_nonnull (router_grad);
        g_assert_true (gmlp_grouped_tensor_fill_random (router_grad, 3, 1.0, &error));
        g_assert_no_error (error);
        other = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, &tokens, 1, HIDDEN, 1.0, NULL);
        x = g_object_ref (which == 0 ? router_grad : other);
        dy = g_object_ref (which == 0 ? other : router_grad);

        y = gmlp_moe_layer_forward (layer, x, &saved, &error);
        g_assert_no_error (error);
        before = gmlp_test_moe_gradient_bytes (layer);
        dx = gmlp_moe_layer_backward (layer, saved, dy, &error);
        if (delayed)
          {
            g_assert_no_error (error);
            g_assert_nonnull (dx);
            g_assert_false (gmlp_moe_layer_backward_dw (layer, &error));
          }
        else
          g_assert_null (dx);
        g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
        g_assert_nonnull (strstr (error->message, "main_grad"));
        g_test_message ("%s", error->message);
        g_clear_error (&error);
        g_assert_true (gmlp_saved_activations_is_consumed (saved) == (delayed != 0));
        after = gmlp_test_moe_gradient_bytes (layer);
        gmlp_test_assert_same_bytes_array (before, after, delayed ? "main_grads after a refused backward_dw"
                                                                  : "main_grads after a refused backward");
        if (delayed)
          {
            g_assert_cmpuint (gmlp_router_get_pending_wgrads (router), ==, 1);
            g_assert_cmpuint (gmlp_grouped_linear_get_pending_wgrads (
                                gmlp_grouped_mlp_get_fc1 (gmlp_moe_layer_get_experts (layer))), ==, 1);
            g_assert_cmpuint (gmlp_grouped_linear_get_pending_wgrads (
                                gmlp_grouped_mlp_get_fc2 (gmlp_moe_layer_get_shared_expert (layer))), ==, 1);
          }
      }
}

/* backward_dw computes every part's weight gradients or none: with the
 * tokens written since the backward, the router and the shared expert
 * (whose forwards read them) refuse, and the experts (whose forward read
 * the permuted tokens) must not have added into their main_grads first.
 * Every part's stays pending. */
void
test_backward_dw_no_partial_write (void)
{
  g_autoptr(GmlpDevice) device = layer_device_or_skip ();
  g_autoptr(GmlpMoELayer) layer = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, y = NULL, dx = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GPtrArray) before = NULL, after = NULL;
  g_autoptr(GError) error = NULL;
  gint64 tokens = T_TOKENS;

  if (device == NULL)
    return;

  layer = g_initable_new (GMLP_TYPE_MOE_LAYER, NULL, &error, "device", device,
                          "hidden", (gint64) HIDDEN, "ffn-hidden", (gint64) FFN,
                          "n-experts", 8u, "top-k", 2u, "dtype", GMLP_DTYPE_FLOAT32,
                          "flags", GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION |
                                   GMLP_LINEAR_DELAY_WGRAD_COMPUTE,
                          "shared-expert-ffn-hidden", (gint64) FFN, NULL);
  g_assert_no_error (error);
  g_assert_true (gmlp_moe_layer_init_parameters (layer, 5, &error));
  g_assert_no_error (error);
  x = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, &tokens, 1, HIDDEN, 1.0, NULL);
  dy = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, &tokens, 1, HIDDEN, 1.0, NULL);

  y = gmlp_moe_layer_forward (layer, x, &saved, &error);
  g_assert_no_error (error);
  dx = gmlp_moe_layer_backward (layer, saved, dy, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_grouped_tensor_fill_random (x, 9, 1.0, &error));
  g_assert_no_error (error);

  before = gmlp_test_moe_gradient_bytes (layer);
  g_assert_false (gmlp_moe_layer_backward_dw (layer, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
  g_test_message ("%s", error->message);
  g_clear_error (&error);
  after = gmlp_test_moe_gradient_bytes (layer);
  gmlp_test_assert_same_bytes_array (before, after, "main_grads after a refused backward_dw");
  g_assert_cmpuint (gmlp_grouped_linear_get_pending_wgrads (gmlp_grouped_mlp_get_fc1 (gmlp_moe_layer_get_experts (layer))),
                    ==, 1);
  g_assert_cmpuint (gmlp_router_get_pending_wgrads (gmlp_moe_layer_get_router (layer)), ==, 1);
}
