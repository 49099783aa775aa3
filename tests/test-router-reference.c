/* test-router-reference.c: the float64 reference of a router
 *
 * The configurations, a token's losses and their gradient, and a whole
 * forward and its loss (see test-router.c), on the float64 router of
 * gmlp-test-router-ref.c.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "test-router.h"

const Config *
config (const char *name)
{
  guint i;

  for (i = 0; i < G_N_ELEMENTS (configs); i++)
    if (g_str_equal (configs[i].name, name))
      return &configs[i];
  g_assert_not_reached ();
}

/* Token t's share of Σ gp · p + aux + z, its choices idx and the fractions
 * f (count_i / (T k)) held fixed. */
static double
ref_token_loss (const Config        *c,
                const double        *l,
                const gint64        *idx,
                const double        *gp,
                const double        *f,
                gint64               n_tokens,
                GmlpTestRouterToken *t)
{
  const GmlpTestRouterSpec *r = GMLP_TEST_ROUTER_SPEC (c);
  double p[GMLP_TEST_ROUTER_MAX_K], loss = 0.0;
  guint j;

  gmlp_test_router_ref_scores (r, l, NULL, t);
  gmlp_test_router_ref_probs (r, l, t, idx, p);
  for (j = 0; j < c->k; j++)
    loss += gp[j] * p[j];
  for (j = 0; j < c->E && c->aux != 0.0; j++)
    loss += c->aux * c->E * f[j] * gmlp_test_router_ref_aux_dist (r, t, j) / n_tokens;
  if (c->z != 0.0)
    loss += c->z * t->lse * t->lse / n_tokens;
  return loss;
}

/* d(token loss) / d(logits) by the five-point central difference, whose
 * error is O(h⁴) of the derivatives and ε |loss| / h of the rounding: with
 * h = 1e-3 both are far below what the tests check (the three-point one
 * at h = 1e-6 left about 1e-10 |loss| / h, some 1e-8 of the gradient). */
void
ref_token_grad (const Config *c,
                const double *l,
                const gint64 *idx,
                const double *gp,
                const double *f,
                gint64        n_tokens,
                double       *grad)
{
  g_autofree double *lp = g_memdup2 (l, sizeof (double) * c->E);
  g_autoptr(GmlpTestRouterToken) t = gmlp_test_router_token_new (c->E);
  guint j;

  for (j = 0; j < c->E; j++)
    {
      double h = 1e-3 * MAX (1.0, fabs (l[j])), at[4];
      static const double steps[4] = { 2.0, 1.0, -1.0, -2.0 };
      guint q;

      for (q = 0; q < 4; q++)
        {
          lp[j] = l[j] + steps[q] * h;
          at[q] = ref_token_loss (c, lp, idx, gp, f, n_tokens, t);
        }
      lp[j] = l[j];
      grad[j] = (-at[0] + 8.0 * at[1] - 8.0 * at[2] + at[3]) / (12.0 * h);
    }
}

void
problem_free (Problem *p)
{
  g_free (p->x);
  g_free (p->w);
  g_free (p->bias);
  g_free (p->logits);
  g_free (p->idx);
  g_free (p->probs);
  g_free (p->counts);
  g_free (p);
}

/* Routes every token of x (T × H) with w; the reference forward. Returns
 * the smallest margin of the tokens' choices. */
double
ref_forward (Problem      *p,
             const double *x,
             const double *w,
             gint64       *idx,
             double       *probs,
             double       *counts,
             double       *aux,
             double       *z)
{
  g_autofree double *logits = g_new (double, MAX (p->T * p->c->E, 1));
  gint64 t;

  for (t = 0; t < p->T; t++)
    gmlp_test_router_ref_logits (x + t * p->H, w, p->c->E, p->H, logits + t * p->c->E);
  return gmlp_test_router_ref_forward (GMLP_TEST_ROUTER_SPEC (p->c), p->T, logits, p->bias, idx, probs, counts,
                                       aux, z);
}

/* Σ gp · probs + aux + z through the whole forward (choices included). */
double
ref_total_loss (Problem      *p,
                const double *x,
                const double *w,
                const double *gp)
{
  gsize tk = (gsize) p->T * p->c->k, i;
  g_autofree gint64 *idx = g_new (gint64, tk);
  g_autofree double *probs = g_new (double, tk);
  g_autofree double *counts = g_new (double, p->c->E);
  double aux, z, loss = 0.0;

  ref_forward (p, x, w, idx, probs, counts, &aux, &z);
  for (i = 0; i < tk; i++)
    loss += gp[i] * probs[i];
  return loss + aux + z;
}
