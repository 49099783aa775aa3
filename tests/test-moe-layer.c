/* test-moe-layer.c: GmlpMoELayer against float64 references
 *
 * The reference is the dense formulation, computed here in float64 from the
 * parameters and inputs as stored: the gate's logits x Wgᵀ, the scores, the
 * top-k (group-limited where asked), the probabilities, the capacity's drops
 * (each expert keeps its first choices in token order), then every token
 * through each expert it chose, y[t] = Σ_j kept · probs[t, j] ·
 * MLP_e(t, j)(x[t]) (+ the shared expert's MLP(x[t])). The backward is that
 * of the loss Σ dy · y + aux + z: through the experts row by row, the
 * probabilities' gradient dy[t] · MLP_e(x[t]), and the router's analytic
 * backward through the softmax or sigmoid, the top-k (choices held fixed)
 * and the renormalization, plus the losses' gradients. The intermediates
 * the library stores (FC1's output, the activation, the experts' outputs
 * and their gradients) are rounded to the layer's dtype as it stores them.
 *
 * Inputs are drawn token by token until every token's choices are clear by
 * a margin (no two candidates within 1e-4 where the order matters), so that
 * the library's FP32 routing must equal the float64 one exactly. Every
 * output is poisoned first (GMLP_DEBUG=poison: fresh memory holds NaN).
 *
 * Every test runs on the CPU and on CUDA against the same references. This
 * file has the tests of the step's numbers and main(); the reference, the
 * checks and the other tests are in the files that test-moe-layer.h lists.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "test-moe-layer.h"

/* Tests */

/* gmlp_moe_layer_new() gives Mixtral's layer: SwiGLU experts in FP32 with
 * grouped weights, the router's defaults, no padding, no capacity, no
 * shared expert; nothing of a forward before the first. */
static void
test_defaults (void)
{
  g_autoptr(GmlpDevice) device = layer_device_or_skip ();
  g_autoptr(GmlpMoELayer) layer = NULL;
  g_autoptr(GError) error = NULL;
  g_autoptr(Problem) p = NULL;
  GmlpActivation act;
  GmlpDType dtype;
  GmlpLinearFlags flags;
  GmlpScoreFunction score;
  gboolean before, renorm, bias;
  guint padding, groups, topk_groups;
  double capacity, scale, aux, z;
  gint64 shared;
  GmlpGroupedMLP *experts;

  if (device == NULL)
    return;
  layer = gmlp_moe_layer_new (device, HIDDEN, FFN, 8, 2, &error);
  g_assert_no_error (error);
  g_object_get (layer, "activation", &act, "dtype", &dtype, "flags", &flags, "padding", &padding,
                "capacity-factor", &capacity, "shared-expert-ffn-hidden", &shared,
                "score-function", &score, "softmax-before-topk", &before, "renormalize", &renorm,
                "scaling-factor", &scale, "n-expert-groups", &groups, "topk-groups", &topk_groups,
                "expert-bias", &bias, "aux-loss-coeff", &aux, "z-loss-coeff", &z, NULL);
  g_assert_cmpint (act, ==, GMLP_ACTIVATION_SWIGLU);
  g_assert_cmpint (dtype, ==, GMLP_DTYPE_FLOAT32);
  g_assert_cmpint (flags, ==, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT);
  g_assert_cmpuint (padding, ==, 0);
  g_assert_cmpfloat (capacity, ==, 0.0);
  g_assert_cmpint (shared, ==, 0);
  g_assert_cmpint (score, ==, GMLP_SCORE_FUNCTION_SOFTMAX);
  g_assert_true (before && renorm && !bias);
  g_assert_cmpfloat (scale, ==, 1.0);
  g_assert_cmpuint (groups, ==, 0);
  g_assert_cmpuint (topk_groups, ==, 0);
  g_assert_cmpfloat (aux, ==, 0.0);
  g_assert_cmpfloat (z, ==, 0.0);

  g_assert_null (gmlp_moe_layer_get_shared_expert (layer));
  g_assert_null (gmlp_moe_layer_get_routing (layer));
  g_assert_null (gmlp_moe_layer_get_aux_loss (layer));
  g_assert_null (gmlp_moe_layer_get_tokens_per_expert (layer));
  g_assert_nonnull (gmlp_moe_layer_get_router (layer));
  g_assert_cmpuint (gmlp_router_get_n_experts (gmlp_moe_layer_get_router (layer)), ==, 8);
  g_assert_cmpuint (gmlp_router_get_top_k (gmlp_moe_layer_get_router (layer)), ==, 2);
  g_assert_cmpint (gmlp_router_get_hidden (gmlp_moe_layer_get_router (layer)), ==, HIDDEN);
  experts = gmlp_moe_layer_get_experts (layer);
  g_assert_nonnull (experts);
  g_assert_cmpint (gmlp_grouped_mlp_get_activation (experts), ==, GMLP_ACTIVATION_SWIGLU);
  g_assert_cmpuint (gmlp_grouped_linear_get_n_groups (gmlp_grouped_mlp_get_fc1 (experts)), ==, 8);
  g_assert_cmpint (gmlp_grouped_linear_get_in_features (gmlp_grouped_mlp_get_fc1 (experts)), ==, HIDDEN);
  g_assert_cmpint (gmlp_grouped_linear_get_out_features (gmlp_grouped_mlp_get_fc1 (experts)), ==, 2 * FFN);
  g_assert_cmpint (gmlp_grouped_linear_get_out_features (gmlp_grouped_mlp_get_fc2 (experts)), ==, HIDDEN);
  g_assert_cmpint (gmlp_grouped_linear_get_dtype (gmlp_grouped_mlp_get_fc1 (experts)), ==, GMLP_DTYPE_FLOAT32);
  g_assert_true (gmlp_moe_layer_get_device (layer) == device);
  g_assert_cmpint (gmlp_moe_layer_get_hidden (layer), ==, HIDDEN);
  g_assert_cmpint (gmlp_moe_layer_get_ffn_hidden (layer), ==, FFN);
  g_assert_cmpuint (gmlp_moe_layer_get_n_experts (layer), ==, 8);
  g_assert_cmpuint (gmlp_moe_layer_get_top_k (layer), ==, 2);

  /* Its step, with its own parameters (from init_parameters) read back
   * for the reference. */
  g_assert_true (gmlp_moe_layer_init_parameters (layer, g_test_rand_int (), &error));
  g_assert_no_error (error);
  g_assert_nonnull (gmlp_grouped_linear_get_weight (gmlp_grouped_mlp_get_fc1 (experts)));
  p = problem_new_from_layer (config ("mixtral"), layer, T_TOKENS);
  run_and_check (p, device, layer, "gmlp_moe_layer_new");

  /* new_full: the same in BF16, with biases and per-group weights. */
  {
    g_autoptr(GmlpMoELayer) full = NULL;
    g_autoptr(Problem) pb = NULL;
    Config cb = *config ("mixtral");

    cb.flags = GMLP_LINEAR_BIAS;
    full = gmlp_moe_layer_new_full (device, HIDDEN, FFN, 8, 2, GMLP_ACTIVATION_SWIGLU, GMLP_DTYPE_BFLOAT16,
                                    cb.flags, &error);
    g_assert_no_error (error);
    g_assert_true (gmlp_moe_layer_init_parameters (full, g_test_rand_int (), &error));
    g_assert_no_error (error);
    pb = problem_new_from_layer (&cb, full, T_TOKENS);
    run_and_check (pb, device, full, "gmlp_moe_layer_new_full, BF16");
  }
}

/* Every configuration, FP32 and BF16: the routing, the losses, y, dx and
 * every weight gradient against the float64 reference. */
static void
test_forward_backward (void)
{
  g_autoptr(GmlpDevice) device = layer_device_or_skip ();
  guint i, d;

  if (device == NULL)
    return;
  for (i = 0; i < G_N_ELEMENTS (configs); i++)
    for (d = 0; d < G_N_ELEMENTS (dtypes); d++)
      {
        g_autoptr(Problem) p = problem_new (&configs[i], dtypes[d], T_TOKENS);
        g_autoptr(GmlpMoELayer) layer = problem_layer (p, device, GMLP_LINEAR_NONE);
        g_autofree char *what = g_strdup_printf ("%s/%s", configs[i].name, gmlp_dtype_get_name (dtypes[d]));
        gsize q, dropped = 0;

        for (q = 0; q < (gsize) p->T * p->c->k; q++)
          dropped += !p->kept[q];
        /* The capacities drop choices (else the test would not test them). */
        if (p->c->capacity > 0.0 && g_str_has_prefix (p->c->name, "capacity"))
          g_assert_cmpuint (dropped, >, 0);
        g_test_message ("%s: %" G_GSIZE_FORMAT " choices dropped", what, dropped);
        run_and_check (p, device, layer, what);
      }
}

/* The expert bias decides: every token to one expert (k = 1, the others
 * empty), every token to the same two (six empty), and every token to one
 * expert past its capacity. */
static void
test_skewed (void)
{
  static const Config skewed[] = {
    { "all-to-one", SOFTMAX, TRUE, TRUE, 1.0, 8, 1, 0, 0, TRUE, 0.0, 0.0, 0, 0.0, 0, SWIGLU, LBIAS },
    { "all-to-two", SIGMOID, TRUE, TRUE, 1.0, 8, 2, 0, 0, TRUE, 0.05, 0.0, 16, 0.0, 12, SWIGLU, 0 },
    { "all-to-one-capacity", SOFTMAX, TRUE, FALSE, 1.0, 4, 1, 0, 0, TRUE, 0.0, 0.0, 0, 2.0, 0, GELU, 0 },
  };
  g_autoptr(GmlpDevice) device = layer_device_or_skip ();
  guint i, d, e;

  if (device == NULL)
    return;
  for (i = 0; i < G_N_ELEMENTS (skewed); i++)
    for (d = 0; d < G_N_ELEMENTS (dtypes); d++)
      {
        const Config *c = &skewed[i];
        g_autoptr(Problem) p = problem_new (c, dtypes[d], T_TOKENS);
        g_autoptr(GmlpMoELayer) layer = NULL;
        g_autofree char *what = g_strdup_printf ("%s/%s", c->name, gmlp_dtype_get_name (dtypes[d]));
        guint empty = 0;

        /* The draw, then the bias: 10 for expert 3 (and 5 for expert 1). */
        for (e = 0; e < c->E; e++)
          p->bias[e] = e == 3 ? 10.0 : e == 1 && c->k > 1 ? 5.0 : 0.0;
        problem_redo_reference (p);
        g_assert_cmpint (p->counts[3], ==, p->T);
        for (e = 0; e < c->E; e++)
          empty += p->rows[e] == 0;
        g_assert_cmpuint (empty, ==, c->E - c->k);
        if (c->capacity > 0.0)
          g_assert_cmpint (p->rows[3], <, p->T);

        layer = problem_layer (p, device, GMLP_LINEAR_NONE);
        run_and_check (p, device, layer, what);
      }
}

/* The losses' gradients alone (dy = 0): dx and the router's gradient come
 * from the aux loss and the z-loss only, the experts' gradients are 0. */
static void
test_losses (void)
{
  static const char *which[] = { "aux-z", "deepseek" };
  g_autoptr(GmlpDevice) device = layer_device_or_skip ();
  guint i;

  if (device == NULL)
    return;
  for (i = 0; i < G_N_ELEMENTS (which); i++)
    {
      g_autoptr(Problem) p = problem_new (config (which[i]), GMLP_DTYPE_FLOAT32, T_TOKENS);
      g_autoptr(GmlpMoELayer) layer = NULL;
      gsize n, j;
      double norm = 0.0;

      memset (p->dy, 0, sizeof (double) * p->T * p->H);
      problem_redo_reference (p);
      g_assert_cmpfloat (p->aux, >, 0.0);
      g_assert_cmpfloat (p->z, >, 0.0);
      for (j = 0; j < (gsize) (p->T * p->H); j++)
        norm += p->dx[j] * p->dx[j];
      g_assert_cmpfloat (norm, >, 0.0);
      for (j = 0; j < (gsize) (p->c->E * p->dexperts->w1o * p->H); j++)
        g_assert_cmpfloat (p->dexperts->w1[j], ==, 0.0);

      layer = problem_layer (p, device, GMLP_LINEAR_NONE);
      run_and_check (p, device, layer, which[i]);
      {
        g_autofree double *dw1 = linear_grad (gmlp_grouped_mlp_get_fc1 (gmlp_moe_layer_get_experts (layer)),
                                              GRAD_WEIGHT, &n);

        for (j = 0; j < n; j++)
          gmlp_assert_same_value (fabs (dw1[j]), 0.0, "experts' dW1 for dy = 0", j);
      }
    }
}

/* Fused accumulation: each main_grad (the experts', the router's, the
 * shared expert's) gets both steps' gradients; the wgrad getters give
 * nothing. */
static void
test_main_grad (void)
{
  const Config *c = config ("deepseek");
  g_autoptr(GmlpDevice) device = layer_device_or_skip ();
  guint single;

  if (device == NULL)
    return;
  /* Per-group weights with biases, then grouped ones. */
  for (single = 0; single < 2; single++)
    {
      Config cs = *c;
      g_autoptr(Problem) p1 = NULL, p2 = NULL;
      g_autoptr(GmlpMoELayer) layer = NULL;
      g_autoptr(Held) held = NULL;
      g_auto(Step) s1 = { NULL, }, s2 = { NULL, };
      GmlpGroupedMLP *experts;
      GmlpRouter *router;

      cs.flags = single ? GMLP_LINEAR_SINGLE_GROUPED_WEIGHT : GMLP_LINEAR_BIAS;
      p1 = problem_new (&cs, GMLP_DTYPE_BFLOAT16, T_TOKENS);
      p2 = problem_new_like (&cs, GMLP_DTYPE_BFLOAT16, 17, p1);
      layer = problem_layer (p1, device, GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION);
      experts = gmlp_moe_layer_get_experts (layer);
      router = gmlp_moe_layer_get_router (layer);
      g_assert_true (gmlp_router_get_flags (router) & GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION);
      held = held_new (layer);

      run_step (p1, device, layer, FALSE, &s1);
      check_step (p1, layer, &s1, FALSE, "fused, step 1");
      run_step (p2, device, layer, FALSE, &s2);
      check_step (p2, layer, &s2, FALSE, "fused, step 2");

      g_assert_null (gmlp_router_get_wgrad (router));
      g_assert_true (gmlp_router_get_grad_added_to_main_grad (router));
      g_assert_true (gmlp_grouped_mlp_get_grad_added_to_main_grad (experts));
      g_assert_true (gmlp_grouped_mlp_get_grad_added_to_main_grad (gmlp_moe_layer_get_shared_expert (layer)));
      g_assert_null (gmlp_grouped_linear_get_wgrad (gmlp_grouped_mlp_get_fc1 (experts)));
      g_assert_null (gmlp_grouped_linear_get_wgrad_member (gmlp_grouped_mlp_get_fc1 (experts), 0));

      /* main_grad − before = dW1 + dW2. */
      problem_accumulate_grads (p1, p2);
      assert_main_grads (layer, held, p1, "fused");
    }
}

static void
count_ready (gpointer  instance,
             GmlpEvent *event,
             gpointer  data)
{
  (*(guint *) data)++;
}

/* Delayed weight gradients: backward changes none; backward_dw computes
 * the oldest pending step's of the experts, the router and the shared
 * expert; fused or not. */
static void
test_delayed_wgrad (void)
{
  const Config *c = config ("deepseek");
  g_autoptr(GmlpDevice) device = layer_device_or_skip ();
  guint fused;

  if (device == NULL)
    return;
  for (fused = 0; fused < 2; fused++)
    {
      GmlpLinearFlags flags = GMLP_LINEAR_DELAY_WGRAD_COMPUTE | (fused ? GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION : 0);
      g_autoptr(Problem) p1 = problem_new (c, GMLP_DTYPE_FLOAT32, T_TOKENS);
      g_autoptr(Problem) p2 = problem_new_like (c, GMLP_DTYPE_FLOAT32, 9, p1);
      g_autoptr(GmlpMoELayer) layer = problem_layer (p1, device, flags);
      GmlpGroupedMLP *experts = gmlp_moe_layer_get_experts (layer);
      GmlpGroupedMLP *shared = gmlp_moe_layer_get_shared_expert (layer);
      GmlpRouter *router = gmlp_moe_layer_get_router (layer);
      GmlpGroupedLinear *fc1 = gmlp_grouped_mlp_get_fc1 (experts);
      g_auto(Step) s1 = { NULL, }, s2 = { NULL, };
      g_autoptr(Held) held = fused ? held_new (layer) : NULL;
      g_autoptr(GError) error = NULL;
      guint ready_router = 0, ready_fc1 = 0;

      g_assert_true (gmlp_router_get_flags (router) & GMLP_LINEAR_DELAY_WGRAD_COMPUTE);
      g_signal_connect (router, "wgrad-ready", G_CALLBACK (count_ready), &ready_router);
      g_signal_connect (fc1, "wgrad-ready", G_CALLBACK (count_ready), &ready_fc1);
      run_step (p1, device, layer, FALSE, &s1);
      check_step (p1, layer, &s1, FALSE, "delayed, step 1");
      run_step (p2, device, layer, FALSE, &s2);
      check_step (p2, layer, &s2, FALSE, "delayed, step 2");
      g_assert_cmpuint (ready_router, ==, 0);
      g_assert_cmpuint (ready_fc1, ==, 0);
      g_assert_cmpuint (gmlp_router_get_pending_wgrads (router), ==, 2);
      g_assert_cmpuint (gmlp_grouped_linear_get_pending_wgrads (fc1), ==, 2);
      g_assert_cmpuint (gmlp_grouped_linear_get_pending_wgrads (gmlp_grouped_mlp_get_fc2 (shared)), ==, 2);
      if (!fused)
        {
          g_assert_null (gmlp_router_get_wgrad (router));
          g_assert_null (gmlp_grouped_linear_get_wgrad (fc1));
        }

      g_assert_true (gmlp_moe_layer_backward_dw (layer, &error));
      g_assert_no_error (error);
      g_assert_cmpuint (ready_router, ==, 1);
      g_assert_cmpuint (ready_fc1, ==, 1);
      g_assert_cmpuint (gmlp_router_get_pending_wgrads (router), ==, 1);
      g_assert_cmpuint (gmlp_grouped_linear_get_pending_wgrads (fc1), ==, 1);
      if (!fused)
        {
          assert_mlp_grads (experts, p1->dexperts, p1->dtype, NULL, "backward_dw 1", "experts'");
          assert_mlp_grads (shared, p1->dshared, p1->dtype, NULL, "backward_dw 1", "shared");
          {
            gsize n;
            g_autofree double *got = router_grad (router, &n);

            assert_close (got, p1->dwg, n, router_tolerance (p1->dtype), "backward_dw 1", "router dW");
          }
        }

      g_assert_true (gmlp_moe_layer_backward_dw (layer, &error));
      g_assert_no_error (error);
      g_assert_cmpuint (ready_router, ==, 2);
      g_assert_cmpuint (ready_fc1, ==, 2);
      g_assert_cmpuint (gmlp_router_get_pending_wgrads (router), ==, 0);
      g_assert_cmpuint (gmlp_grouped_linear_get_pending_wgrads (fc1), ==, 0);
      if (fused)
        {
          /* main_grad − before = both steps'. */
          problem_accumulate_grads (p1, p2);
          assert_main_grads (layer, held, p1, "backward_dw 2, fused");
        }
      else
        {
          g_autofree double *got = NULL;
          gsize n;

          assert_mlp_grads (experts, p2->dexperts, p2->dtype, NULL, "backward_dw 2", "experts'");
          assert_mlp_grads (shared, p2->dshared, p2->dtype, NULL, "backward_dw 2", "shared");
          got = router_grad (router, &n);
          assert_close (got, p2->dwg, n, router_tolerance (p2->dtype), "backward_dw 2", "router dW");
        }

      /* Nothing left. */
      g_assert_false (gmlp_moe_layer_backward_dw (layer, &error));
      g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
      g_assert_cmpuint (ready_router, ==, 2);
      g_assert_cmpuint (ready_fc1, ==, 2);
    }

  /* Without the flag, backward computes, and backward_dw refuses. */
  {
    g_autoptr(Problem) p = problem_new (c, GMLP_DTYPE_FLOAT32, T_TOKENS);
    g_autoptr(GmlpMoELayer) layer = problem_layer (p, device, GMLP_LINEAR_NONE);
    g_autoptr(GError) error = NULL;

    run_and_check (p, device, layer, "not delayed");
    g_assert_false (gmlp_moe_layer_backward_dw (layer, &error));
    g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
  }
}

/* Every result of a step as bytes: y, dx, then each weight and bias
 * gradient (experts, router, shared expert). */
static GPtrArray *
step_bytes (GmlpMoELayer *layer,
            Step         *s)
{
  GPtrArray *all = g_ptr_array_new_with_free_func ((GDestroyNotify) g_bytes_unref);
  GmlpGroupedMLP *mlps[2] = { gmlp_moe_layer_get_experts (layer), gmlp_moe_layer_get_shared_expert (layer) };
  g_autoptr(GError) error = NULL;
  guint i, j, g;

  g_ptr_array_add (all, gmlp_grouped_tensor_to_bytes (s->y, &error));
  g_ptr_array_add (all, gmlp_grouped_tensor_to_bytes (s->dx, &error));
  g_ptr_array_add (all, gmlp_grouped_tensor_to_bytes (gmlp_router_get_wgrad (gmlp_moe_layer_get_router (layer)),
                                                      &error));
  g_assert_no_error (error);
  for (i = 0; i < 2 && mlps[i] != NULL; i++)
    for (j = 0; j < 2; j++)
      {
        GmlpGroupedLinear *fc = j == 0 ? gmlp_grouped_mlp_get_fc1 (mlps[i]) : gmlp_grouped_mlp_get_fc2 (mlps[i]);

        gboolean single = gmlp_grouped_linear_get_flags (fc) & GMLP_LINEAR_SINGLE_GROUPED_WEIGHT;
        gboolean bias = gmlp_grouped_linear_get_flags (fc) & GMLP_LINEAR_BIAS;

        for (g = 0; g < (single ? 1 : gmlp_grouped_linear_get_n_groups (fc)); g++)
          {
            GmlpGroupedTensor *w = single ? gmlp_grouped_linear_get_wgrad (fc)
                                          : gmlp_grouped_linear_get_wgrad_member (fc, g);
            GmlpGroupedTensor *b = single ? gmlp_grouped_linear_get_bgrad (fc)
                                          : gmlp_grouped_linear_get_bgrad_member (fc, g);

            g_ptr_array_add (all, gmlp_grouped_tensor_to_bytes (w, &error));
            g_assert_no_error (error);
            if (bias)
              {
                g_ptr_array_add (all, gmlp_grouped_tensor_to_bytes (b, &error));
                g_assert_no_error (error);
              }
          }
      }
  return all;
}

/* A step of a layer made with @flags (offloaded when @offload) against
 * the reference, and bit for bit the step of a plain layer with the same
 * parameters. */
static void
check_same_as_plain (Problem         *p,
                     GmlpDevice      *device,
                     GmlpLinearFlags  flags,
                     gboolean         offload,
                     const char      *what)
{
  g_autoptr(GmlpMoELayer) plain = problem_layer (p, device, GMLP_LINEAR_NONE);
  g_autoptr(GmlpMoELayer) variant = problem_layer (p, device, flags);
  g_autoptr(GPtrArray) a = NULL, b = NULL;
  g_auto(Step) s1 = { NULL, }, s2 = { NULL, };
  GmlpLinearFlags got;

  g_object_get (gmlp_moe_layer_get_experts (variant), "flags", &got, NULL);
  g_assert_cmpint (got & flags, ==, flags);
  run_step (p, device, plain, FALSE, &s1);
  a = step_bytes (plain, &s1);
  run_step (p, device, variant, offload, &s2);
  check_step (p, variant, &s2, TRUE, what);
  b = step_bytes (variant, &s2);
  gmlp_test_assert_same_bytes_array (a, b, what);
}

/* Saved activations offloaded, and activations recomputed: the same
 * results, bit for bit. */
static void
test_offload_recompute (void)
{
  static const char *which[] = { "deepseek", "shared", "capacity-padded", "softmax-after-gelu" };
  g_autoptr(GmlpDevice) device = layer_device_or_skip ();
  guint i, d;

  if (device == NULL)
    return;
  for (i = 0; i < G_N_ELEMENTS (which); i++)
    for (d = 0; d < G_N_ELEMENTS (dtypes); d++)
      {
        g_autoptr(Problem) p = problem_new (config (which[i]), dtypes[d], T_TOKENS);
        g_autofree char *offloaded = g_strdup_printf ("offloaded %s/%s", which[i], gmlp_dtype_get_name (dtypes[d]));
        g_autofree char *recomputed = g_strdup_printf ("recomputed %s/%s", which[i],
                                                       gmlp_dtype_get_name (dtypes[d]));

        check_same_as_plain (p, device, GMLP_LINEAR_NONE, TRUE, offloaded);
        check_same_as_plain (p, device, GMLP_LINEAR_RECOMPUTE_ACTIVATION, FALSE, recomputed);
      }
}

/* Zero tokens: an empty output; the backward of nothing is an empty dx and
 * zero weight gradients; zero counts and losses. */
static void
test_zero_tokens (void)
{
  static const char *which[] = { "mixtral", "deepseek", "capacity" };
  g_autoptr(GmlpDevice) device = layer_device_or_skip ();
  guint i, d;

  if (device == NULL)
    return;
  for (i = 0; i < G_N_ELEMENTS (which); i++)
    for (d = 0; d < G_N_ELEMENTS (dtypes); d++)
      {
        g_autoptr(Problem) p = problem_new (config (which[i]), dtypes[d], 0);
        g_autoptr(GmlpMoELayer) layer = problem_layer (p, device, GMLP_LINEAR_NONE);
        g_auto(Step) s = { NULL, };

        run_step (p, device, layer, FALSE, &s);
        g_assert_cmpint (gmlp_grouped_tensor_get_total_rows (s.y), ==, 0);
        g_assert_cmpint (gmlp_grouped_tensor_get_cols (s.y), ==, HIDDEN);
        g_assert_cmpint (gmlp_grouped_tensor_get_dtype (s.y), ==, dtypes[d]);
        g_assert_cmpint (gmlp_grouped_tensor_get_total_rows (s.dx), ==, 0);
        g_assert_cmpint (gmlp_grouped_tensor_get_cols (s.dx), ==, HIDDEN);
        /* An empty routing, zero counts and losses, every gradient exactly
         * zero: the reference's are. */
        check_step (p, layer, &s, TRUE, which[i]);
      }
}

int
main (int argc, char *argv[])
{
  setlocale (LC_ALL, "");
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Gmlp/MoELayer/defaults", test_defaults);
  g_test_add_func ("/Gmlp/MoELayer/forward-backward", test_forward_backward);
  g_test_add_func ("/Gmlp/MoELayer/skewed", test_skewed);
  g_test_add_func ("/Gmlp/MoELayer/losses", test_losses);
  g_test_add_func ("/Gmlp/MoELayer/main-grad", test_main_grad);
  g_test_add_func ("/Gmlp/MoELayer/delayed-wgrad", test_delayed_wgrad);
  g_test_add_func ("/Gmlp/MoELayer/offload-recompute", test_offload_recompute);
  g_test_add_func ("/Gmlp/MoELayer/zero-tokens", test_zero_tokens);
  g_test_add_func ("/Gmlp/MoELayer/non-finite", test_non_finite);
  g_test_add_func ("/Gmlp/MoELayer/bad-construction", test_bad_construction);
  g_test_add_func ("/Gmlp/MoELayer/bad-calls", test_bad_calls);
  g_test_add_func ("/Gmlp/MoELayer/versions", test_versions);
  g_test_add_func ("/Gmlp/MoELayer/main-grad-across-parts", test_main_grad_across_parts);
  g_test_add_func ("/Gmlp/MoELayer/backward-dw-no-partial-write", test_backward_dw_no_partial_write);
  g_test_add_func ("/Gmlp/MoELayer/properties", test_properties);
  g_test_add_func ("/Gmlp/MoELayer/init-parameters", test_init_parameters);
  g_test_add_func ("/Gmlp/MoELayer/graph", test_graph);

  return g_test_run ();
}
