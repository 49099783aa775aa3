/* test-router.c: GmlpRouter against float64 references
 *
 * The references are computed here from the dense formulation: the logits
 * x Wᵀ, every expert's score and selection value, the best k by the
 * documented ranking, the probabilities of the chosen experts, the counts
 * and the two losses, all in float64. Gradients are finite differences of
 * that float64 loss (Σ grad_probs · probs + aux + z): with respect to each
 * logit with the choices held fixed (the reference of dx and dW), and with
 * respect to W and x through the whole forward, choices included. Random
 * data is drawn token by token until every token's choices are clear (no two
 * candidates within 1e-4 of each other where the order matters), so that
 * the float32 routing must equal the float64 one exactly; ties are tested
 * apart, with data whose float32 and float64 values are exact. Every output
 * is poisoned first (GMLP_DEBUG=poison: fresh memory holds NaN).
 *
 * Every test runs on the suite's device, the CPU or CUDA, against the same
 * references. The CUDA kernels route a token with a warp up to 1024
 * experts and with a block above; /Gmlp/Router/wide covers the block, the
 * groups a warp scores and a radix select of more than 16 groups. In the
 * gpu suite /Gmlp/Router/cpu-gpu holds the two backends to what
 * gmlp-kernels.h promises: the same indices and counts (the data's choices
 * are clear, and NaN ranks the same way on both), the floating results
 * within a few ulps (FP32 per token on both, but the GPU adds a token's E
 * terms in a tree and has its own expf), and on the GPU the same bits on
 * every run; /Gmlp/Router/graph captures a forward and backward once and
 * replays them on new tokens.
 *
 * This file has the tests of the forward and backward's numbers and main();
 * the reference, the checks and the other tests are in the files that
 * test-router.h lists.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "test-router.h"

/* Tests */

/* Every configuration, every input dtype: the routing, the losses, dx and
 * dW against the float64 reference. */
static void
test_forward_backward (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint i, d;

  if (device == NULL)
    return;
  for (i = 0; i < G_N_ELEMENTS (configs); i++)
    for (d = 0; d < G_N_ELEMENTS (x_dtypes); d++)
      {
        g_autoptr(Problem) p = problem_new (&configs[i], x_dtypes[d], T_TOKENS);
        g_autoptr(GmlpRouter) router = problem_router (p, device, GMLP_LINEAR_NONE);
        g_autofree double *gp = random_grad ((gsize) p->T * p->c->k);
        g_autofree char *what = g_strdup_printf ("%s/%s", configs[i].name,
                                                 gmlp_dtype_get_name (x_dtypes[d]));

        run_and_check (p, device, router, gp, NULL, what);
      }
}

/* BF16 tokens: the gate's products run on BF16 tensor cores with the FP32
 * operands split into BF16 parts (libgmlp/gmlp-grouped-linear-split.c),
 * and must be as good as FP32 products: the logits within 5e-7 of the
 * float64 ones (FP32 products: about 1e-7; a BF16 product of the rounded
 * weight is some 2e-3 off, of two parts 2e-6), dW and main_grad (added
 * into, also delayed) within 2e-6 (about 3e-7 on the CPU, the FP32
 * gradient of the logits included), and each value of dx, made or added
 * into a tensor (as the MoE layer has it), within half an ulp of BF16 of
 * the float64 value plus 1e-6 of the size of its terms (and the
 * finite-difference reference's own error): one rounding of an
 * FP32-grade sum (two parts fail it). 8, 16, 64 and 160 experts; hidden
 * sizes that are not multiples of 8 or 128. */
static const Config split_configs[] = {
  { "split-e8", SOFTMAX, TRUE, TRUE, 1.0, 8, 2, 0, 0, FALSE, 0.0, 0.01 },
  { "split-e16", SIGMOID, TRUE, TRUE, 2.5, 16, 4, 4, 2, TRUE, 0.01, 0.0 },
  { "split-e64", SOFTMAX, TRUE, TRUE, 1.0, 64, 8, 0, 0, FALSE, 0.01, 0.001 },
  { "split-e160", SIGMOID, TRUE, FALSE, 1.0, 160, 6, 0, 0, FALSE, 0.0, 0.0 },
};
static const gint64 split_hidden[] = { 200, 12, 136, 75 };

#define SPLIT_TOKENS 40

/* dx (T × H, as stored) against the reference, value by value: one BF16
 * rounding off an FP32-accurate sum (the FP32 dlogits' own rounding
 * included: an unrounded FP32 dx is checked against the BF16 one). */
static void
assert_dx_one_rounding (const Problem *p,
                        const double  *got,
                        const double  *gp,
                        const double  *dl,
                        const double  *dx_ref,
                        const char    *what)
{
  gint64 t, h;
  guint e, j;

  for (t = 0; t < p->T; t++)
    for (h = 0; h < p->H; h++)
      {
        gint64 i = t * p->H + h;
        double want = dx_ref[i], terms = 0.0, weights = 0.0, g_sum = 0.0;

        for (e = 0; e < p->c->E; e++)
          {
            terms += fabs (dl[t * p->c->E + e] * p->w[e * p->H + h]);
            weights += fabs (p->w[e * p->H + h]);
          }
        for (j = 0; j < p->c->k; j++)
          g_sum += fabs (gp[t * p->c->k + j]);
        /* One BF16 rounding, the split products' FP32 sum, and the FP32
         * dlogits' own error: a few ulps of the probabilities' gradient
         * (the backward of the scores and of the renormalisation subtract
         * sums of p g), which shows where dx cancels far below its terms. */
        if (!(fabs (got[i] - want) <= ldexp (fabs (want), -8) + 1e-6 * terms + ldexp (g_sum * weights, -22) +
              1e-30))
          g_error ("%s: dx (%" G_GINT64_FORMAT ", %" G_GINT64_FORMAT "): %.9g, expected %.9g (terms %g)",
                   what, t, h, got[i], want, terms);
      }
}

/* main_grad (or wgrad) − m0 against dW. */
static void
assert_dw_added (const double *got,
                 const double *m0,
                 const double *dw,
                 gsize         n,
                 const char   *what)
{
  g_autofree double *added = g_new (double, n);
  gsize i;

  for (i = 0; i < n; i++)
    added[i] = got[i] - (m0 != NULL ? m0[i] : 0.0);
  gmlp_test_assert_close (added, dw, n, 2e-6, what);
}

static void
test_bf16_split (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint i, pass;

  if (device == NULL)
    return;
  for (i = 0; i < G_N_ELEMENTS (split_configs); i++)
    for (pass = 0; pass < 3; pass++)
      {
        const Config *c = &split_configs[i];
        GmlpLinearFlags flags = pass == 0 ? GMLP_LINEAR_NONE :
                                pass == 1 ? GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION :
                                GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION | GMLP_LINEAR_DELAY_WGRAD_COMPUTE;
        g_autoptr(Problem) p = problem_new_sized (c, GMLP_DTYPE_BFLOAT16, SPLIT_TOKENS, split_hidden[i], NULL);
        g_autoptr(GmlpRouter) router = problem_router (p, device, flags);
        gsize n_x = (gsize) p->T * p->H, n_w = (gsize) c->E * p->H, n;
        g_autofree double *gp = random_grad ((gsize) p->T * c->k);
        g_autofree double *dl = g_new (double, (gsize) p->T * c->E);
        g_autofree double *dx_ref = g_new (double, n_x);
        g_autofree double *dw_ref = g_new (double, n_w);
        g_autofree double *m0 = NULL, *got = NULL;
        g_autoptr(GmlpGroupedTensor) x = gmlp_test_upload_values (device, p->x, p->T, p->H, p->dtype);
        g_autoptr(GmlpGroupedTensor) grad = gmlp_test_upload_values (device, gp, p->T, c->k, GMLP_DTYPE_FLOAT32);
        g_autoptr(GmlpGroupedTensor) main_grad = NULL, dx = NULL;
        g_autoptr(GmlpSavedActivations) saved = NULL;
        g_autoptr(GmlpRouting) routing = NULL;
        g_autoptr(GError) error = NULL;
        g_autofree char *what = g_strdup_printf ("%s, hidden %" G_GINT64_FORMAT ", %s", c->name, p->H,
                                                 pass == 0 ? "wgrad" : pass == 1 ? "main_grad" :
                                                 "main_grad, delayed");

        if (pass > 0)
          {
            m0 = random_grad (n_w);
            main_grad = gmlp_test_upload_values (device, m0, c->E, p->H, GMLP_DTYPE_FLOAT32);
            g_assert_true (gmlp_router_set_main_grad (router, main_grad, &error));
            g_assert_no_error (error);
          }

        routing = gmlp_router_forward (router, x, &saved, &error);
        g_assert_no_error (error);
        assert_routing (p, routing, what);
        {
          GmlpGroupedTensor *logits = gmlp_saved_activations_get (saved, "logit tensor", &error);
          g_autofree char *label = g_strdup_printf ("%s: logits", what);

          g_assert_no_error (error);
          got = gmlp_test_download (logits, &n);
          g_assert_cmpuint (n, ==, (gsize) p->T * c->E);
          gmlp_test_assert_close (got, p->logits, n, 5e-7, label);
          /* The reference gradients at the logits the router computed
           * (FP32-accurate): how the gradient moves with the logits' own
           * rounding is not what this test checks. */
          memcpy (p->logits, got, n * sizeof (double));
          g_clear_pointer (&got, g_free);
        }
        ref_backward_full (p, gp, dl, dx_ref, dw_ref);

        dx = gmlp_router_backward (router, saved, grad, &error);
        g_assert_no_error (error);
        g_assert_cmpint (gmlp_grouped_tensor_get_dtype (dx), ==, GMLP_DTYPE_BFLOAT16);
        got = gmlp_test_download (dx, &n);
        g_assert_cmpuint (n, ==, n_x);
        assert_dx_one_rounding (p, got, gp, dl, dx_ref, what);
        if (pass == 0)
          {
            /* The MoE layer's FP32 dx of the same step: the sum that the
             * BF16 dx is one rounding of (wgrad, not accumulated, is
             * written again with the same value). */
            g_autoptr(GmlpSavedActivations) saved32 = NULL;
            g_autoptr(GmlpRouting) routing32 = gmlp_router_forward (router, x, &saved32, &error);
            g_autoptr(GmlpGroupedTensor) dx32 = NULL;
            g_autofree double *got32 = NULL;
            gsize q;

            g_assert_no_error (error);
            dx32 = gmlp_router_backward_fp32 (router, saved32, grad, &error);
            g_assert_no_error (error);
            g_assert_cmpint (gmlp_grouped_tensor_get_dtype (dx32), ==, GMLP_DTYPE_FLOAT32);
            got32 = gmlp_test_download (dx32, &n);
            g_assert_cmpuint (n, ==, n_x);
            for (q = 0; q < n_x; q++)
              gmlp_assert_same_value (gmlp_test_round (got32[q], GMLP_DTYPE_BFLOAT16), got[q],
                                      "the FP32 dx, rounded", q);
          }
        g_clear_pointer (&got, g_free);

        if (pass == 2)
          {
            /* Nothing added until backward_dw. */
            got = gmlp_test_download (main_grad, &n);
            g_assert_cmpmem (got, n * sizeof (double), m0, n_w * sizeof (double));
            g_clear_pointer (&got, g_free);
            g_assert_true (gmlp_router_backward_dw (router, &error));
            g_assert_no_error (error);
          }
        got = gmlp_test_download (pass == 0 ? gmlp_router_get_wgrad (router) : main_grad, &n);
        g_assert_cmpuint (n, ==, n_w);
        {
          g_autofree char *label = g_strdup_printf ("%s: dW", what);

          assert_dw_added (got, m0, dw_ref, n, label);
        }
      }
}

/* A BF16 input with ±∞ (or NaN) in a token: that token's logits are ±∞
 * or NaN (∞ times parts of W of either sign, or zero), as documented; its
 * k experts are still distinct and in range, its probabilities NaN or
 * the sigmoid of ±∞, and the other tokens' routing is as without it. */
static void
test_bf16_non_finite (void)
{
  const Config *c = config ("sigmoid-raw");
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(Problem) p = NULL;
  g_autoptr(GmlpRouter) router = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL;
  g_autoptr(GmlpRouting) routing = NULL;
  g_autoptr(GError) error = NULL;
  g_autofree gint64 *idx = NULL;
  g_autofree double *probs = NULL;
  gsize n;
  gint64 t;
  guint j, q;

  if (device == NULL)
    return;
  p = problem_new (c, GMLP_DTYPE_BFLOAT16, T_TOKENS);
  router = problem_router (p, device, GMLP_LINEAR_NONE);
  p->x[0 * p->H + 3] = INFINITY;
  p->x[1 * p->H + 5] = -INFINITY;
  p->x[2 * p->H + 0] = NAN;
  x = gmlp_test_upload_values (device, p->x, p->T, p->H, GMLP_DTYPE_BFLOAT16);
  routing = gmlp_router_forward (router, x, NULL, &error);
  g_assert_no_error (error);
  idx = gmlp_test_download_i64 (gmlp_routing_get_indices (routing), &n);
  probs = gmlp_test_download (gmlp_routing_get_probs (routing), &n);
  for (t = 0; t < p->T; t++)
    for (j = 0; j < c->k; j++)
      {
        gsize i = (gsize) t * c->k + j;

        g_assert_cmpint (idx[i], >=, 0);
        g_assert_cmpint (idx[i], <, c->E);
        for (q = 0; q < j; q++)
          g_assert_cmpint (idx[i], !=, idx[(gsize) t * c->k + q]);
        if (t < 3)
          g_assert_true (isnan (probs[i]) || probs[i] == 0.0 || probs[i] == 1.0);
        else
          {
            g_assert_cmpint (idx[i], ==, p->idx[i]);
            g_assert_cmpfloat_with_epsilon (probs[i], p->probs[i], 1e-5);
          }
      }
}

/* The defaults of gmlp_router_new() are Mixtral's routing. */
static void
test_defaults (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpRouter) router = NULL;
  g_autoptr(GError) error = NULL;
  gboolean before, renorm, bias;
  guint groups, topk_groups;
  double scale, aux, z;
  GmlpScoreFunction score;
  g_autoptr(Problem) p = NULL;
  g_autoptr(GBytes) wb = NULL;
  g_autofree double *gp = NULL;

  if (device == NULL)
    return;
  router = gmlp_router_new (device, HIDDEN, 8, 2, &error);
  g_assert_no_error (error);
  g_object_get (router, "score-function", &score, "softmax-before-topk", &before, "renormalize", &renorm,
                "scaling-factor", &scale, "n-expert-groups", &groups, "topk-groups", &topk_groups,
                "expert-bias", &bias, "aux-loss-coeff", &aux, "z-loss-coeff", &z, NULL);
  g_assert_cmpint (score, ==, GMLP_SCORE_FUNCTION_SOFTMAX);
  g_assert_true (before && renorm && !bias);
  g_assert_cmpfloat (scale, ==, 1.0);
  g_assert_cmpuint (groups, ==, 0);
  g_assert_cmpuint (topk_groups, ==, 0);
  g_assert_cmpfloat (aux, ==, 0.0);
  g_assert_cmpfloat (z, ==, 0.0);
  g_assert_null (gmlp_router_get_expert_bias (router));
  g_assert_null (gmlp_router_get_main_grad (router));
  g_assert_null (gmlp_router_get_wgrad (router));
  g_assert_cmpint (gmlp_grouped_tensor_get_n_groups (gmlp_router_get_weight (router)), ==, 1);
  g_assert_cmpint (gmlp_grouped_tensor_get_rows (gmlp_router_get_weight (router), 0), ==, 8);
  g_assert_cmpint (gmlp_grouped_tensor_get_cols (gmlp_router_get_weight (router)), ==, HIDDEN);
  g_assert_cmpint (gmlp_grouped_tensor_get_dtype (gmlp_router_get_weight (router)), ==, GMLP_DTYPE_FLOAT32);

  p = problem_new (config ("default"), GMLP_DTYPE_FLOAT32, T_TOKENS);
  wb = gmlp_test_encode_values (p->w, p->c->E * p->H, GMLP_DTYPE_FLOAT32);
  g_assert_true (gmlp_router_set_weight_from_bytes (router, wb, &error));
  g_assert_no_error (error);
  gp = random_grad ((gsize) p->T * p->c->k);
  run_and_check (p, device, router, gp, NULL, "gmlp_router_new");
}

/* Exact ties (data whose float32 and float64 logits are exact): equal
 * values go to the lower expert, equal groups to the lower group. */
static void
test_ties (void)
{
  static const Config tie_configs[] = {
    { "ties-softmax", SOFTMAX, TRUE, TRUE, 1.0, 8, 3, 0, 0, FALSE, 0.0, 0.0 },
    { "ties-softmax-after", SOFTMAX, FALSE, TRUE, 1.0, 8, 3, 0, 0, FALSE, 0.0, 0.0 },
    { "ties-sigmoid", SIGMOID, TRUE, TRUE, 1.0, 8, 3, 0, 0, FALSE, 0.0, 0.0 },
    { "ties-groups", SIGMOID, TRUE, TRUE, 1.0, 8, 3, 4, 2, FALSE, 0.0, 0.0 },
    { "ties-one-group", SOFTMAX, TRUE, TRUE, 1.0, 8, 2, 4, 1, FALSE, 0.0, 0.0 },
  };
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint i;

  if (device == NULL)
    return;
  for (i = 0; i < G_N_ELEMENTS (tie_configs); i++)
    {
      const Config *c = &tie_configs[i];
      g_autoptr(Problem) p = g_new0 (Problem, 1);
      g_autoptr(GmlpRouter) router = NULL;
      g_autoptr(GmlpTestRouterToken) tok = gmlp_test_router_token_new (c->E);
      g_autofree double *l = g_new (double, c->E);
      g_autofree double *gp = NULL;
      gint64 t, h;
      guint e;

      p->c = c;
      p->dtype = GMLP_DTYPE_FLOAT32;
      p->T = 8;
      p->H = 8;
      /* Expert e + 4 is a twin of expert e (and group g + 2 of group g):
       * W in quarters, x in halves, so every logit is an exact multiple of
       * 1/8 in both precisions. */
      p->w = g_new (double, c->E * p->H);
      for (e = 0; e < 4; e++)
        for (h = 0; h < p->H; h++)
          p->w[(e + 4) * p->H + h] = p->w[e * p->H + h] = g_test_rand_int_range (-4, 5) / 4.0;
      p->x = g_new0 (double, p->T * p->H);
      for (t = 1; t < p->T; t++)   /* token 0: all logits 0, one tie of all */
        for (;;)
          {
            double g0, g1;
            gboolean twins;

            for (h = 0; h < p->H; h++)
              p->x[t * p->H + h] = g_test_rand_int_range (-4, 5) / 2.0;
            gmlp_test_router_ref_logits (p->x + t * p->H, p->w, c->E, p->H, l);
            gmlp_test_router_ref_scores (GMLP_TEST_ROUTER_SPEC (c), l, NULL, tok);
            /* Values of different logits are far apart, but sums of two
             * (the group scores) may come close without being equal
             * (σ(a) + σ(−a) = 1 for any a): only groups of the same logits
             * may be that close. */
            g0 = tok->v[0] + tok->v[1];
            g1 = tok->v[2] + tok->v[3];
            twins = (l[0] == l[2] && l[1] == l[3]) || (l[0] == l[3] && l[1] == l[2]);
            if (c->groups == 0 || twins || fabs (g0 - g1) >= 1e-6)
              break;
          }
      p->logits = g_new (double, p->T * c->E);
      for (t = 0; t < p->T; t++)
        gmlp_test_router_ref_logits (p->x + t * p->H, p->w, c->E, p->H, p->logits + t * c->E);
      p->idx = g_new (gint64, p->T * c->k);
      p->probs = g_new (double, p->T * c->k);
      p->counts = g_new (double, c->E);
      ref_forward (p, p->x, p->w, p->idx, p->probs, p->counts, &p->aux, &p->z);

      /* The reference breaks ties as documented: token 0 takes the first
       * experts (of the first groups). */
      for (e = 0; e < c->k; e++)
        g_assert_cmpint (p->idx[e], ==, e);
      /* Without groups every token's best value is that of twins: where
       * no other expert has it, both are chosen first, the lower first. */
      for (t = 1; t < p->T && c->groups == 0; t++)
        {
          const double *lt = p->logits + t * c->E;
          guint best = 0, n_best = 0;

          for (e = 1; e < 4; e++)
            best = lt[e] > lt[best] ? e : best;
          for (e = 0; e < 4; e++)
            n_best += lt[e] == lt[best];
          if (n_best == 1)
            {
              g_assert_cmpint (p->idx[t * c->k], ==, best);
              g_assert_cmpint (p->idx[t * c->k + 1], ==, best + 4);
            }
        }

      router = problem_router (p, device, GMLP_LINEAR_NONE);
      gp = random_grad ((gsize) p->T * c->k);
      run_and_check (p, device, router, gp, NULL, c->name);
    }
}

/* d(total loss) / d(values[j]) by central differences through the whole
 * forward, values being x's or W's (each perturbed in place, then put
 * back). */
static void
fd_total (Problem      *p,
          const double *x,
          const double *w,
          const double *gp,
          double       *values,
          gsize         n,
          double       *grad)
{
  const double h = 1e-7;
  gsize j;

  for (j = 0; j < n; j++)
    {
      double v = values[j], up, down;

      values[j] = v + h;
      up = ref_total_loss (p, x, w, gp);
      values[j] = v - h;
      down = ref_total_loss (p, x, w, gp);
      values[j] = v;
      grad[j] = (up - down) / (2 * h);
    }
}

/* The gradient by finite differences of the float64 forward through W and
 * x, choices recomputed: the reference's own gradient is checked too. */
static void
test_finite_differences (void)
{
  static const char *which[] = {
    "default", "softmax-after", "softmax-after-raw", "sigmoid-raw", "sigmoid-deepseek",
    "softmax-after-groups-bias", "aux-z", "sigmoid-aux-z", "softmax-after-aux",
  };
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint i;

  if (device == NULL)
    return;
  for (i = 0; i < G_N_ELEMENTS (which); i++)
    {
      const Config *c = config (which[i]);
      g_autoptr(Problem) p = problem_new (c, GMLP_DTYPE_FLOAT32, 16);
      g_autoptr(GmlpRouter) router = problem_router (p, device, GMLP_LINEAR_NONE);
      g_autofree double *gp = random_grad ((gsize) p->T * c->k);
      g_autofree double *fd_w = g_new (double, c->E * p->H);
      g_autofree double *fd_x = g_new (double, p->T * p->H);
      g_autofree double *wp = g_memdup2 (p->w, sizeof (double) * c->E * p->H);
      g_autofree double *xp = g_memdup2 (p->x, sizeof (double) * p->T * p->H);
      g_autofree double *got = NULL;
      g_autoptr(GmlpGroupedTensor) x = gmlp_test_upload_values (device, p->x, p->T, p->H, p->dtype);
      g_autoptr(GmlpGroupedTensor) grad = gmlp_test_upload_values (device, gp, p->T, c->k, GMLP_DTYPE_FLOAT32);
      g_autoptr(GmlpSavedActivations) saved = NULL;
      g_autoptr(GmlpRouting) routing = NULL;
      g_autoptr(GmlpGroupedTensor) dx = NULL;
      g_autoptr(GError) error = NULL;
      g_autofree char *label = NULL;
      gsize n;

      fd_total (p, xp, wp, gp, wp, c->E * p->H, fd_w);
      fd_total (p, xp, wp, gp, xp, p->T * p->H, fd_x);

      routing = gmlp_router_forward (router, x, &saved, &error);
      g_assert_no_error (error);
      dx = gmlp_router_backward (router, saved, grad, &error);
      g_assert_no_error (error);
      got = gmlp_test_download (gmlp_router_get_wgrad (router), &n);
      label = g_strdup_printf ("%s: dW against finite differences", c->name);
      gmlp_test_assert_close (got, fd_w, n, 2e-4, label);
      g_free (got);
      got = gmlp_test_download (dx, &n);
      g_free (label);
      label = g_strdup_printf ("%s: dx against finite differences", c->name);
      gmlp_test_assert_close (got, fd_x, n, 2e-4, label);
    }
}

/* The losses' gradients alone (grad_probs zero), and losses of zero
 * coefficients exactly zero. */
static void
test_aux_losses (void)
{
  static const Config loss_configs[] = {
    { "aux-only", SOFTMAX, TRUE, TRUE, 1.0, 8, 2, 0, 0, FALSE, 0.3, 0.0 },
    { "z-only", SOFTMAX, TRUE, TRUE, 1.0, 8, 2, 0, 0, FALSE, 0.0, 0.2 },
    { "sigmoid-aux-z", SIGMOID, TRUE, TRUE, 1.0, 16, 4, 4, 2, TRUE, 0.3, 0.2 },
    { "softmax-after-aux-z", SOFTMAX, FALSE, TRUE, 1.0, 8, 2, 0, 0, FALSE, 0.3, 0.2 },
  };
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint i;

  if (device == NULL)
    return;
  for (i = 0; i < G_N_ELEMENTS (loss_configs); i++)
    {
      g_autoptr(Problem) p = problem_new (&loss_configs[i], GMLP_DTYPE_FLOAT32, T_TOKENS);
      g_autoptr(GmlpRouter) router = problem_router (p, device, GMLP_LINEAR_NONE);
      g_autofree double *gp = g_new0 (double, (gsize) p->T * p->c->k);

      g_assert_cmpfloat (p->aux + p->z, >, 0.0);
      run_and_check (p, device, router, gp, NULL, loss_configs[i].name);
    }
}

int
main (int argc, char *argv[])
{
  setlocale (LC_ALL, "");
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Gmlp/Router/forward-backward", test_forward_backward);
  g_test_add_func ("/Gmlp/Router/bf16-split", test_bf16_split);
  g_test_add_func ("/Gmlp/Router/bf16-non-finite", test_bf16_non_finite);
  g_test_add_func ("/Gmlp/Router/defaults", test_defaults);
  g_test_add_func ("/Gmlp/Router/ties", test_ties);
  g_test_add_func ("/Gmlp/Router/finite-differences", test_finite_differences);
  g_test_add_func ("/Gmlp/Router/aux-losses", test_aux_losses);
  g_test_add_func ("/Gmlp/Router/expert-bias", test_expert_bias);
  g_test_add_func ("/Gmlp/Router/main-grad", test_main_grad);
  g_test_add_func ("/Gmlp/Router/delayed-wgrad", test_delayed_wgrad);
  g_test_add_func ("/Gmlp/Router/bad-construction", test_bad_construction);
  g_test_add_func ("/Gmlp/Router/bad-calls", test_bad_calls);
  g_test_add_func ("/Gmlp/Router/zero-tokens", test_zero_tokens);
  g_test_add_func ("/Gmlp/Router/non-finite", test_non_finite);
  g_test_add_func ("/Gmlp/Router/offload", test_offload);
  g_test_add_func ("/Gmlp/Router/properties", test_properties);
  g_test_add_func ("/Gmlp/Router/threads", test_threads);
  g_test_add_func ("/Gmlp/Router/wide", test_wide);
  g_test_add_func ("/Gmlp/Router/cpu-gpu", test_cpu_gpu);
  g_test_add_func ("/Gmlp/Router/graph", test_graph);

  return g_test_run ();
}
