/* gmlp-test-router-ref.c: the float64 reference of a router
 *
 * See gmlp-test-router-ref.h. Written from the rules that GmlpRouter's
 * properties document, in float64, independently of libgmlp's routing
 * code.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <math.h>
#include <string.h>

#include "gmlp-test-router-ref.h"

#define SOFTMAX GMLP_SCORE_FUNCTION_SOFTMAX
#define SIGMOID GMLP_SCORE_FUNCTION_SIGMOID
#define RENORM_EPS GMLP_TEST_ROUTER_RENORM_EPS

GmlpTestRouterToken *
gmlp_test_router_token_new (guint E)
{
  GmlpTestRouterToken *t = g_new0 (GmlpTestRouterToken, 1);

  t->sm = g_new (double, E);
  t->s = g_new (double, E);
  t->v = g_new (double, E);
  return t;
}

void
gmlp_test_router_token_free (GmlpTestRouterToken *t)
{
  g_free (t->sm);
  g_free (t->s);
  g_free (t->v);
  g_free (t);
}

/* Whether value a (of expert ia) ranks before value b (of expert ib):
 * higher first, the lower index on ties, NaN last. */
static gboolean
ranks_before (double a,
              gint64 ia,
              double b,
              gint64 ib)
{
  if (isnan (a))
    return isnan (b) && ia < ib;
  if (isnan (b))
    return TRUE;
  return a > b || (a == b && ia < ib);
}

void
gmlp_test_router_ref_softmax (const double *x,
                              guint         n,
                              double       *out,
                              double       *lse)
{
  double m = -INFINITY, sum = 0.0;
  guint j;

  for (j = 0; j < n; j++)
    m = fmax (m, x[j]);
  for (j = 0; j < n; j++)
    sum += out[j] = exp (x[j] - m);
  for (j = 0; j < n; j++)
    out[j] /= sum;
  if (lse != NULL)
    *lse = m + log (sum);
}

void
gmlp_test_router_ref_logits (const double *x,
                             const double *w,
                             guint         E,
                             gint64        H,
                             double       *l)
{
  guint e;
  gint64 h;

  for (e = 0; e < E; e++)
    {
      double sum = 0.0;

      for (h = 0; h < H; h++)
        sum += x[h] * w[e * H + h];
      l[e] = sum;
    }
}

void
gmlp_test_router_ref_scores (const GmlpTestRouterSpec *r,
                             const double             *l,
                             const double             *bias,
                             GmlpTestRouterToken      *t)
{
  gboolean on_logits = r->score == SOFTMAX && !r->before;
  guint j;

  gmlp_test_router_ref_softmax (l, r->E, t->sm, &t->lse);
  for (j = 0; j < r->E; j++)
    {
      t->s[j] = r->score == SOFTMAX ? t->sm[j] : 1.0 / (1.0 + exp (-l[j]));
      t->v[j] = (on_logits ? l[j] : t->s[j]) + (bias != NULL ? bias[j] : 0.0);
    }
}

/* The best n of the values whose allowed[] is set (all when allowed is
 * NULL), best first, by repeated search. */
static void
best_of (const double   *v,
         guint           len,
         const gboolean *allowed,
         guint           n,
         gint64         *best)
{
  guint j, i;

  for (j = 0; j < n; j++)
    {
      gint64 pick = -1;

      for (i = 0; i < len; i++)
        {
          gboolean taken = FALSE;
          guint q;

          for (q = 0; q < j; q++)
            taken |= best[q] == i;
          if ((allowed != NULL && !allowed[i]) || taken)
            continue;
          if (pick < 0 || ranks_before (v[i], i, v[pick], pick))
            pick = i;
        }
      g_assert_cmpint (pick, >=, 0);
      best[j] = pick;
    }
}

void
gmlp_test_router_ref_select (const GmlpTestRouterSpec *r,
                             const double             *v,
                             gint64                   *idx,
                             double                   *margin)
{
  g_autofree gboolean *allowed = g_new (gboolean, r->E);
  g_autofree gint64 *order = g_new (gint64, r->E);
  double gap = INFINITY;
  guint j, n_allowed = r->E;

  g_assert_cmpuint (r->k, <=, GMLP_TEST_ROUTER_MAX_K);
  for (j = 0; j < r->E; j++)
    allowed[j] = TRUE;
  if (r->groups > 0)
    {
      /* A group's score: the sum of its best two values (its best one in
       * groups of one). */
      guint per = r->E / r->groups, m = MIN (per, 2), g;
      g_autofree double *gs = g_new (double, r->groups);
      g_autofree gint64 *gorder = g_new (gint64, r->groups);
      gint64 top[2];

      for (g = 0; g < r->groups; g++)
        {
          best_of (v + g * per, per, NULL, m, top);
          gs[g] = v[g * per + top[0]] + (m == 2 ? v[g * per + top[1]] : 0.0);
        }
      best_of (gs, r->groups, NULL, r->groups, gorder);
      for (j = 0; j < r->E; j++)
        allowed[j] = FALSE;
      for (g = 0; g < r->topk_groups; g++)
        for (j = 0; j < per; j++)
          allowed[gorder[g] * per + j] = TRUE;
      n_allowed = r->topk_groups * per;
      if (r->topk_groups < r->groups)
        gap = fabs (gs[gorder[r->topk_groups - 1]] - gs[gorder[r->topk_groups]]);
    }
  best_of (v, r->E, allowed, MIN (n_allowed, r->k + 1), order);
  for (j = 0; j < r->k; j++)
    idx[j] = order[j];
  for (j = 0; j + 1 < MIN (n_allowed, r->k + 1); j++)
    gap = fmin (gap, fabs (v[order[j]] - v[order[j + 1]]));
  if (margin != NULL)
    *margin = gap;
}

void
gmlp_test_router_ref_probs (const GmlpTestRouterSpec  *r,
                            const double              *l,
                            const GmlpTestRouterToken *t,
                            const gint64              *idx,
                            double                    *p)
{
  double sum = 0.0, chosen[GMLP_TEST_ROUTER_MAX_K] = { 0.0 };
  guint j;

  g_assert_cmpuint (r->k, <=, GMLP_TEST_ROUTER_MAX_K);
  if (r->score == SOFTMAX && !r->before)
    {
      /* The softmax of the chosen logits. */
      for (j = 0; j < r->k; j++)
        chosen[j] = l[idx[j]];
      gmlp_test_router_ref_softmax (chosen, r->k, p, NULL);
    }
  else
    {
      for (j = 0; j < r->k; j++)
        sum += p[j] = t->s[idx[j]];
      for (j = 0; j < r->k && r->renorm; j++)
        p[j] /= sum + RENORM_EPS;
    }
  for (j = 0; j < r->k; j++)
    p[j] *= r->scale;
}

void
gmlp_test_router_ref_route (const GmlpTestRouterSpec *r,
                            const double             *l,
                            const double             *bias,
                            GmlpTestRouterToken      *t)
{
  gmlp_test_router_ref_scores (r, l, bias, t);
  gmlp_test_router_ref_select (r, t->v, t->idx, &t->margin);
  gmlp_test_router_ref_probs (r, l, t, t->idx, t->p);
}

double
gmlp_test_router_ref_aux_dist (const GmlpTestRouterSpec  *r,
                               const GmlpTestRouterToken *t,
                               guint                      e)
{
  double sum = 0.0;
  guint j;

  if (r->score == SOFTMAX)
    return t->sm[e];
  for (j = 0; j < r->E; j++)
    sum += t->s[j];
  return t->s[e] / (sum + RENORM_EPS);
}

double
gmlp_test_router_ref_forward (const GmlpTestRouterSpec *r,
                              gint64                    T,
                              const double             *logits,
                              const double             *bias,
                              gint64                   *idx,
                              double                   *probs,
                              double                   *counts,
                              double                   *aux,
                              double                   *z)
{
  g_autoptr(GmlpTestRouterToken) tok = gmlp_test_router_token_new (r->E);
  g_autofree double *own_counts = counts == NULL ? g_new (double, r->E) : NULL;
  g_autofree double *mean = g_new0 (double, r->E);
  double margin = INFINITY, z_sum = 0.0, sum = 0.0, m;
  gint64 t;
  guint j;

  if (counts == NULL)
    counts = own_counts;
  memset (counts, 0, sizeof (double) * r->E);
  for (t = 0; t < T; t++)
    {
      const double *l = logits + t * r->E;

      gmlp_test_router_ref_scores (r, l, bias, tok);
      gmlp_test_router_ref_select (r, tok->v, idx + t * r->k, &m);
      margin = fmin (margin, m);
      gmlp_test_router_ref_probs (r, l, tok, idx + t * r->k, probs + t * r->k);
      for (j = 0; j < r->k; j++)
        counts[idx[t * r->k + j]] += 1.0;
      for (j = 0; j < r->E; j++)
        mean[j] += gmlp_test_router_ref_aux_dist (r, tok, j) / T;
      z_sum += tok->lse * tok->lse;
    }
  for (j = 0; j < r->E; j++)
    sum += counts[j] / ((double) T * r->k) * mean[j];
  if (aux != NULL)
    *aux = T > 0 ? r->aux * r->E * sum : 0.0;
  if (z != NULL)
    *z = T > 0 ? r->z * z_sum / T : 0.0;
  return margin;
}

/* out += the vector-Jacobian product of a softmax q (n values) with g:
 * q_i (g_i − Σ_j q_j g_j). */
static void
softmax_backward (const double *q,
                  const double *g,
                  guint         n,
                  double       *out)
{
  double dot = 0.0;
  guint i;

  for (i = 0; i < n; i++)
    dot += q[i] * g[i];
  for (i = 0; i < n; i++)
    out[i] += q[i] * (g[i] - dot);
}

void
gmlp_test_router_ref_token_backward (const GmlpTestRouterSpec *r,
                                     const double             *l,
                                     const gint64             *idx,
                                     const double             *gp,
                                     const double             *aux_grad,
                                     double                    z_grad,
                                     double                   *dl)
{
  g_autoptr(GmlpTestRouterToken) t = gmlp_test_router_token_new (r->E);
  g_autofree double *ds = g_new0 (double, r->E);
  double p[GMLP_TEST_ROUTER_MAX_K], dot = 0.0, sum = 0.0;
  guint j, e;

  gmlp_test_router_ref_scores (r, l, NULL, t);
  gmlp_test_router_ref_probs (r, l, t, idx, p);
  for (e = 0; e < r->E; e++)
    dl[e] = 0.0;

  if (r->score == SOFTMAX && !r->before)
    {
      /* p = scale · softmax (chosen logits). */
      double q[GMLP_TEST_ROUTER_MAX_K] = { 0.0 }, g[GMLP_TEST_ROUTER_MAX_K] = { 0.0 };
      double d[GMLP_TEST_ROUTER_MAX_K] = { 0.0 };

      for (j = 0; j < r->k; j++)
        {
          q[j] = p[j] / r->scale;
          g[j] = r->scale * gp[j];
        }
      softmax_backward (q, g, r->k, d);
      for (j = 0; j < r->k; j++)
        dl[idx[j]] += d[j];
    }
  else if (r->renorm)
    {
      for (j = 0; j < r->k; j++)
        {
          sum += t->s[idx[j]];
          dot += gp[j] * t->s[idx[j]];
        }
      /* One fraction, so that a single choice (p = 1) gives exactly 0. */
      sum += RENORM_EPS;
      for (j = 0; j < r->k; j++)
        ds[idx[j]] += r->scale * (gp[j] * sum - dot) / (sum * sum);
    }
  else
    for (j = 0; j < r->k; j++)
      ds[idx[j]] += r->scale * gp[j];

  /* The aux loss's distribution: the softmax scores themselves, or the
   * sigmoid scores over their sum. */
  if (aux_grad != NULL && r->score == SOFTMAX)
    for (e = 0; e < r->E; e++)
      ds[e] += aux_grad[e];
  else if (aux_grad != NULL)
    {
      double total = RENORM_EPS, d = 0.0;

      for (e = 0; e < r->E; e++)
        {
          total += t->s[e];
          d += aux_grad[e] * t->s[e];
        }
      for (e = 0; e < r->E; e++)
        ds[e] += aux_grad[e] / total - d / (total * total);
    }

  /* Through the score function. */
  if (r->score == SOFTMAX)
    softmax_backward (t->sm, ds, r->E, dl);
  else
    for (e = 0; e < r->E; e++)
      dl[e] += ds[e] * t->s[e] * (1.0 - t->s[e]);

  /* z = coeff × mean lse²: d lse / d l = softmax. */
  for (e = 0; e < r->E; e++)
    dl[e] += z_grad * 2.0 * t->lse * t->sm[e];
}

void
gmlp_test_router_ref_backward (const GmlpTestRouterSpec *r,
                               gint64                    T,
                               const double             *logits,
                               const gint64             *idx,
                               const double             *counts,
                               const double             *gp,
                               double                   *dl)
{
  g_autofree double *aux_grad = g_new0 (double, r->E);
  gint64 tk = T * r->k, t;
  guint e;

  /* aux = coeff E Σ_e f_e mean_t dist_t[e], the fractions f held fixed. */
  for (e = 0; e < r->E && T > 0; e++)
    aux_grad[e] = r->aux * r->E * (counts[e] / (double) tk) / T;
  for (t = 0; t < T; t++)
    gmlp_test_router_ref_token_backward (r, logits + t * r->E, idx + t * r->k, gp + t * r->k,
                                         r->aux != 0.0 ? aux_grad : NULL, r->z / T, dl + t * r->E);
}

gint64
gmlp_test_router_ref_capacity (gint64 n_choices,
                               guint  E,
                               guint  padding,
                               double factor)
{
  gint64 pad = MAX (padding, 1), cap;
  double per;

  if (!(factor > 0.0))
    return -1;
  per = ceil (factor * (double) n_choices / E);
  cap = per >= (double) n_choices ? n_choices : (gint64) per;
  return (cap + pad - 1) / pad * pad;
}

double
gmlp_test_router_ref_bias_scale (const GmlpTestRouterSpec *r)
{
  if (r->score == SIGMOID)
    return 0.2;
  return r->before ? 0.5 / r->E : 0.5;
}
