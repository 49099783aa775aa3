/* test-router-check.c: problems and the checks of test-router
 *
 * Problems drawn until every token's choices are clear, routers made from
 * them, the backward's reference, and a step run and checked against it.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "test-router.h"

/* Fresh data: W and the bias at random (or those of @like), then each
 * token's x redrawn until its choices are clear by MARGIN. */
Problem *
problem_new_sized (const Config  *c,
                   GmlpDType      dtype,
                   gint64         n_tokens,
                   gint64         hidden,
                   const Problem *like)
{
  Problem *p = g_new0 (Problem, 1);
  g_autofree double *l = g_new (double, c->E);
  g_autoptr(GmlpTestRouterToken) tok = gmlp_test_router_token_new (c->E);
  gint64 t, h, tries;
  guint e;

  p->c = c;
  p->dtype = dtype;
  p->T = n_tokens;
  p->H = hidden;
  p->x = g_new (double, MAX (p->T * p->H, 1));
  p->w = g_new (double, c->E * p->H);
  for (e = 0; e < c->E * p->H; e++)
    p->w[e] = like != NULL ? like->w[e] : gmlp_test_normal (1.0 / sqrt ((double) p->H), GMLP_DTYPE_FLOAT32);
  if (c->bias)
    {
      double scale = gmlp_test_router_ref_bias_scale (GMLP_TEST_ROUTER_SPEC (c));

      p->bias = g_new (double, c->E);
      for (e = 0; e < c->E; e++)
        p->bias[e] = like != NULL ? like->bias[e] : gmlp_test_normal (scale, GMLP_DTYPE_FLOAT32);
    }

  for (t = 0; t < p->T; t++)
    for (tries = 0;; tries++)
      {
        g_assert_cmpint (tries, <, 10000);
        for (h = 0; h < p->H; h++)
          p->x[t * p->H + h] = gmlp_test_normal (1.0, dtype);
        gmlp_test_router_ref_logits (p->x + t * p->H, p->w, c->E, p->H, l);
        gmlp_test_router_ref_route (GMLP_TEST_ROUTER_SPEC (c), l, p->bias, tok);
        if (tok->margin >= MARGIN)
          break;
      }

  p->logits = g_new (double, MAX (p->T * c->E, 1));
  for (t = 0; t < p->T; t++)
    gmlp_test_router_ref_logits (p->x + t * p->H, p->w, c->E, p->H, p->logits + t * c->E);
  p->idx = g_new (gint64, MAX (p->T * c->k, 1));
  p->probs = g_new (double, MAX (p->T * c->k, 1));
  p->counts = g_new (double, c->E);
  ref_forward (p, p->x, p->w, p->idx, p->probs, p->counts, &p->aux, &p->z);
  return p;
}

Problem *
problem_new_like (const Config  *c,
                  GmlpDType      dtype,
                  gint64         n_tokens,
                  const Problem *like)
{
  return problem_new_sized (c, dtype, n_tokens, HIDDEN, like);
}

Problem *
problem_new (const Config *c,
             GmlpDType     dtype,
             gint64        n_tokens)
{
  return problem_new_like (c, dtype, n_tokens, NULL);
}

/* Library side */

GmlpRouter *
router_new (GmlpDevice      *device,
            const Config    *c,
            gint64           hidden,
            GmlpLinearFlags  flags)
{
  g_autoptr(GError) error = NULL;
  GmlpRouter *router = g_initable_new (GMLP_TYPE_ROUTER, NULL, &error,
                                       "device", device,
                                       "hidden", hidden,
                                       "n-experts", c->E,
                                       "top-k", c->k,
                                       "score-function", c->score,
                                       "softmax-before-topk", c->before,
                                       "renormalize", c->renorm,
                                       "scaling-factor", c->scale,
                                       "n-expert-groups", c->groups,
                                       "topk-groups", c->topk_groups,
                                       "expert-bias", c->bias,
                                       "aux-loss-coeff", c->aux,
                                       "z-loss-coeff", c->z,
                                       "flags", flags,
                                       NULL);

  g_assert_no_error (error);
  g_assert_nonnull (router);
  return router;
}

/* A router of the problem's configuration holding its W and bias. */
GmlpRouter *
problem_router (Problem         *p,
                GmlpDevice      *device,
                GmlpLinearFlags  flags)
{
  GmlpRouter *router = router_new (device, p->c, p->H, flags);
  g_autoptr(GBytes) wb = gmlp_test_encode_values (p->w, p->c->E * p->H, GMLP_DTYPE_FLOAT32);
  g_autoptr(GError) error = NULL;

  g_assert_true (gmlp_router_set_weight_from_bytes (router, wb, &error));
  g_assert_no_error (error);
  if (p->bias != NULL)
    {
      g_autoptr(GBytes) bb = gmlp_test_encode_values (p->bias, p->c->E, GMLP_DTYPE_FLOAT32);

      g_assert_true (gmlp_router_set_expert_bias_from_bytes (router, bb, &error));
      g_assert_no_error (error);
    }
  return router;
}

/* Checks a routing against the problem's reference. */
void
assert_routing (Problem     *p,
                GmlpRouting *routing,
                const char  *what)
{
  const Config *c = p->c;
  gsize n, tk = (gsize) p->T * c->k, i;
  g_autofree gint64 *idx = gmlp_test_download_i64 (gmlp_routing_get_indices (routing), &n);
  g_autofree gint64 *counts = NULL;
  g_autofree double *probs = NULL;
  g_autofree char *label = NULL;

  g_assert_cmpint (gmlp_routing_get_n_tokens (routing), ==, p->T);
  g_assert_cmpuint (gmlp_routing_get_top_k (routing), ==, c->k);
  g_assert_cmpuint (gmlp_routing_get_n_experts (routing), ==, c->E);
  g_assert_cmpuint (n, ==, tk);
  for (i = 0; i < tk; i++)
    if (idx[i] != p->idx[i])
      g_error ("%s: token %" G_GSIZE_FORMAT " choice %" G_GSIZE_FORMAT ": expert %" G_GINT64_FORMAT
               ", expected %" G_GINT64_FORMAT, what, i / c->k, i % c->k, idx[i], p->idx[i]);

  probs = gmlp_test_download (gmlp_routing_get_probs (routing), &n);
  g_assert_cmpuint (n, ==, tk);
  label = g_strdup_printf ("%s: probabilities", what);
  gmlp_test_assert_close (probs, p->probs, tk, 1e-5, label);

  counts = gmlp_test_download_i64 (gmlp_routing_get_tokens_per_expert (routing), &n);
  g_assert_cmpuint (n, ==, c->E);
  g_assert_cmpint (gmlp_grouped_tensor_get_n_groups (gmlp_routing_get_tokens_per_expert (routing)), ==, 1);
  for (i = 0; i < c->E; i++)
    g_assert_cmpfloat (counts[i], ==, p->counts[i]);

  if (c->aux == 0.0)
    gmlp_assert_same_value (gmlp_test_download_scalar (gmlp_routing_get_aux_loss (routing)), 0.0, "aux loss", 0);
  else
    g_assert_cmpfloat_with_epsilon (gmlp_test_download_scalar (gmlp_routing_get_aux_loss (routing)), p->aux,
                                    1e-5 * fabs (p->aux));
  if (c->z == 0.0)
    gmlp_assert_same_value (gmlp_test_download_scalar (gmlp_routing_get_z_loss (routing)), 0.0, "z loss", 0);
  else
    g_assert_cmpfloat_with_epsilon (gmlp_test_download_scalar (gmlp_routing_get_z_loss (routing)), p->z,
                                    1e-5 * fabs (p->z));
}

/* The reference gradients of Σ gp · probs + aux + z: dlogits by finite
 * differences with the choices fixed, then dx = dlogits W, dW = dlogitsᵀ x. */
void
ref_backward_full (Problem      *p,
                   const double *gp,
                   double       *dl,
                   double       *dx,
                   double       *dw)
{
  const Config *c = p->c;
  g_autofree double *f = g_new (double, c->E);
  gint64 t, h;
  guint e;

  for (e = 0; e < c->E; e++)
    f[e] = p->counts[e] / ((double) p->T * c->k);
  for (t = 0; t < p->T; t++)
    ref_token_grad (c, p->logits + t * c->E, p->idx + t * c->k, gp + t * c->k, f, p->T,
                    dl + t * c->E);
  for (t = 0; t < p->T; t++)
    for (h = 0; h < p->H; h++)
      {
        double sum = 0.0;

        for (e = 0; e < c->E; e++)
          sum += dl[t * c->E + e] * p->w[e * p->H + h];
        dx[t * p->H + h] = sum;
      }
  for (e = 0; e < c->E; e++)
    for (h = 0; h < p->H; h++)
      {
        double sum = 0.0;

        for (t = 0; t < p->T; t++)
          sum += dl[t * c->E + e] * p->x[t * p->H + h];
        dw[e * p->H + h] = sum;
      }
}

void
ref_backward (Problem      *p,
              const double *gp,
              double       *dx,
              double       *dw)
{
  g_autofree double *dl = g_new (double, MAX (p->T * p->c->E, 1));

  ref_backward_full (p, gp, dl, dx, dw);
}

double *
random_grad (gsize n)
{
  double *gp = g_new (double, MAX (n, 1));
  gsize i;

  for (i = 0; i < n; i++)
    gp[i] = gmlp_test_normal (1.0, GMLP_DTYPE_FLOAT32);
  return gp;
}

double
dx_tolerance (GmlpDType dtype)
{
  return dtype == GMLP_DTYPE_FLOAT32 ? 1e-4 : 2.0 * gmlp_test_tolerance (dtype);
}

/* One forward and backward of a problem's router; checks the routing and
 * the gradients (dx always; dW from wgrad unless the router fuses or
 * delays). */
void
run_and_check (Problem         *p,
               GmlpDevice      *device,
               GmlpRouter      *router,
               const double    *gp,
               double          *dw_out,
               const char      *what)
{
  gsize n;
  g_autoptr(GmlpGroupedTensor) x = gmlp_test_upload_values (device, p->x, p->T, p->H, p->dtype);
  g_autoptr(GmlpGroupedTensor) grad = gmlp_test_upload_values (device, gp, p->T, p->c->k, GMLP_DTYPE_FLOAT32);
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GmlpRouting) routing = NULL;
  g_autoptr(GmlpGroupedTensor) dx = NULL;
  g_autofree double *dx_ref = g_new (double, MAX (p->T * p->H, 1));
  g_autofree double *dw_ref = g_new (double, p->c->E * p->H);
  g_autofree double *got = NULL;
  g_autoptr(GError) error = NULL;
  g_autofree char *label = NULL;

  routing = gmlp_router_forward (router, x, &saved, &error);
  g_assert_no_error (error);
  assert_routing (p, routing, what);

  dx = gmlp_router_backward (router, saved, grad, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_saved_activations_is_consumed (saved));
  g_assert_cmpint (gmlp_grouped_tensor_get_dtype (dx), ==, p->dtype);
  g_assert_cmpint (gmlp_grouped_tensor_get_total_rows (dx), ==, p->T);
  g_assert_cmpint (gmlp_grouped_tensor_get_cols (dx), ==, p->H);

  ref_backward (p, gp, dx_ref, dw_ref);
  got = gmlp_test_download (dx, &n);
  label = g_strdup_printf ("%s: dx", what);
  gmlp_test_assert_close (got, dx_ref, n, dx_tolerance (p->dtype), label);
  if (dw_out != NULL)
    memcpy (dw_out, dw_ref, sizeof (double) * p->c->E * p->H);
  if (gmlp_router_get_wgrad (router) != NULL && !(gmlp_router_get_flags (router) & GMLP_LINEAR_DELAY_WGRAD_COMPUTE))
    {
      g_clear_pointer (&got, g_free);
      got = gmlp_test_download (gmlp_router_get_wgrad (router), &n);
      g_assert_cmpuint (n, ==, p->c->E * p->H);
      g_free (label);
      label = g_strdup_printf ("%s: dW", what);
      gmlp_test_assert_close (got, dw_ref, n, 1e-4, label);
    }
}
