/* test-router-reference.c: the float64 reference of a router
 *
 * The configurations, a token's scores, choices, probabilities and losses,
 * their gradients, and a whole forward and its loss (see test-router.c).
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

/* Float64 reference */

static gboolean
ref_before (double  a,
            gint64  ia,
            double  b,
            gint64  ib)
{
  if (isnan (a))
    return isnan (b) && ia < ib;
  if (isnan (b))
    return TRUE;
  return a > b || (a == b && ia < ib);
}

static void
ref_softmax (const double *x,
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

Token *
token_new (guint E)
{
  Token *t = g_new0 (Token, 1);

  t->s = g_new (double, E);
  t->sm = g_new (double, E);
  t->v = g_new (double, E);
  return t;
}

void
token_free (Token *t)
{
  g_free (t->s);
  g_free (t->sm);
  g_free (t->v);
  g_free (t);
}

void
ref_scores (const Config *c,
            const double *l,
            const double *bias,
            Token        *t)
{
  gboolean on_logits = c->score == SOFTMAX && !c->before;
  guint j;

  ref_softmax (l, c->E, t->sm, &t->lse);
  for (j = 0; j < c->E; j++)
    {
      t->s[j] = c->score == SOFTMAX ? t->sm[j] : 1.0 / (1.0 + exp (-l[j]));
      t->v[j] = (on_logits ? l[j] : t->s[j]) + (bias != NULL ? bias[j] : 0.0);
    }
}

/* The best n of the values whose allowed[] is set, by repeated search. */
static void
ref_best (const double *v,
          guint         len,
          const gboolean *allowed,
          guint         n,
          gint64       *best)
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
          if (pick < 0 || ref_before (v[i], i, v[pick], pick))
            pick = i;
        }
      g_assert_cmpint (pick, >=, 0);
      best[j] = pick;
    }
}

/* A token's choices; *margin (if not NULL) gets the smallest gap that
 * decides them: between consecutive choices, between the last choice and
 * the best expert left out, and between the last group kept and the best
 * group left out. */
void
ref_select (const Config *c,
            const double *v,
            gint64       *idx,
            double       *margin)
{
  g_autofree gboolean *allowed = g_new (gboolean, c->E);
  g_autofree gint64 *order = g_new (gint64, c->E);
  double gap = INFINITY;
  guint j, n_allowed = c->E;

  for (j = 0; j < c->E; j++)
    allowed[j] = TRUE;
  if (c->groups > 0)
    {
      guint per = c->E / c->groups, m = MIN (per, 2), g;
      g_autofree double *gs = g_new (double, c->groups);
      g_autofree gint64 *gorder = g_new (gint64, c->groups);
      gint64 top[2];

      for (g = 0; g < c->groups; g++)
        {
          ref_best (v + g * per, per, NULL, m, top);
          gs[g] = v[g * per + top[0]] + (m == 2 ? v[g * per + top[1]] : 0.0);
        }
      ref_best (gs, c->groups, NULL, c->groups, gorder);
      for (j = 0; j < c->E; j++)
        allowed[j] = FALSE;
      for (g = 0; g < c->topk_groups; g++)
        for (j = 0; j < per; j++)
          allowed[gorder[g] * per + j] = TRUE;
      n_allowed = c->topk_groups * per;
      if (c->topk_groups < c->groups)
        gap = fabs (gs[gorder[c->topk_groups - 1]] - gs[gorder[c->topk_groups]]);
    }
  ref_best (v, c->E, allowed, MIN (n_allowed, c->k + 1), order);
  for (j = 0; j < c->k; j++)
    idx[j] = order[j];
  for (j = 0; j + 1 < MIN (n_allowed, c->k + 1); j++)
    gap = fmin (gap, fabs (v[order[j]] - v[order[j + 1]]));
  if (margin != NULL)
    *margin = gap;
}

/* The probabilities of a token's choices. */
static void
ref_probs (const Config *c,
           const double *l,
           const Token  *t,
           const gint64 *idx,
           double       *p)
{
  double sum = 0.0, chosen[16];
  guint j;

  if (c->score == SOFTMAX && !c->before)
    {
      for (j = 0; j < c->k; j++)
        chosen[j] = l[idx[j]];
      ref_softmax (chosen, c->k, p, NULL);
    }
  else
    {
      for (j = 0; j < c->k; j++)
        sum += p[j] = t->s[idx[j]];
      for (j = 0; j < c->k && c->renorm; j++)
        p[j] /= sum + RENORM_EPS;
    }
  for (j = 0; j < c->k; j++)
    p[j] *= c->scale;
}

/* The full distribution of the aux loss. */
static double
ref_aux_dist (const Config *c,
              const Token  *t,
              guint         i)
{
  double sum = 0.0;
  guint j;

  if (c->score == SOFTMAX)
    return t->sm[i];
  for (j = 0; j < c->E; j++)
    sum += t->s[j];
  return t->s[i] / (sum + RENORM_EPS);
}

/* Token t's share of Σ gp · p + aux + z, its choices idx and the fractions
 * f (count_i / (T k)) held fixed. */
static double
ref_token_loss (const Config *c,
                const double *l,
                const gint64 *idx,
                const double *gp,
                const double *f,
                gint64        n_tokens,
                Token        *t)
{
  double p[16], loss = 0.0;
  guint j;

  ref_scores (c, l, NULL, t);
  ref_probs (c, l, t, idx, p);
  for (j = 0; j < c->k; j++)
    loss += gp[j] * p[j];
  for (j = 0; j < c->E && c->aux != 0.0; j++)
    loss += c->aux * c->E * f[j] * ref_aux_dist (c, t, j) / n_tokens;
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
  g_autoptr(Token) t = token_new (c->E);
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

void
logits_of (const Problem *p,
           const double  *x,
           const double  *w,
           gint64         t,
           double        *l)
{
  guint e;
  gint64 h;

  for (e = 0; e < p->c->E; e++)
    {
      double sum = 0.0;

      for (h = 0; h < p->H; h++)
        sum += x[t * p->H + h] * w[e * p->H + h];
      l[e] = sum;
    }
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
  const Config *c = p->c;
  g_autoptr(Token) tok = token_new (c->E);
  g_autofree double *l = g_new (double, c->E);
  g_autofree double *mean = g_new0 (double, c->E);
  double margin = INFINITY, z_sum = 0.0, sum = 0.0, m;
  gint64 t;
  guint j;

  memset (counts, 0, sizeof (double) * c->E);
  for (t = 0; t < p->T; t++)
    {
      logits_of (p, x, w, t, l);
      ref_scores (c, l, p->bias, tok);
      ref_select (c, tok->v, idx + t * c->k, &m);
      margin = fmin (margin, m);
      ref_probs (c, l, tok, idx + t * c->k, probs + t * c->k);
      for (j = 0; j < c->k; j++)
        counts[idx[t * c->k + j]] += 1.0;
      for (j = 0; j < c->E; j++)
        mean[j] += ref_aux_dist (c, tok, j) / p->T;
      z_sum += tok->lse * tok->lse;
    }
  for (j = 0; j < c->E; j++)
    sum += counts[j] / ((double) p->T * c->k) * mean[j];
  *aux = p->T > 0 ? c->aux * c->E * sum : 0.0;
  *z = p->T > 0 ? c->z * z_sum / p->T : 0.0;
  return margin;
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

double
random_value (double    scale,
              GmlpDType dtype)
{
  /* Box-Muller: normal values. */
  double u = g_test_rand_double_range (1e-12, 1.0), v = g_test_rand_double ();

  return gmlp_test_round (scale * sqrt (-2.0 * log (u)) * cos (2.0 * G_PI * v), dtype);
}

/* The selection values of a bias: about the spread of the values. */
double
bias_scale (const Config *c)
{
  if (c->score == SIGMOID)
    return 0.2;
  return c->before ? 0.5 / c->E : 0.5;
}
