/* test-moe-layer-reference.c: the float64 reference of a MoE layer's step
 *
 * The configurations, the capacity's drops, the experts' MLPs row by row,
 * and a problem: parameters and inputs drawn until every token's choices
 * are clear, with the step's expected outputs and gradients (see
 * test-moe-layer.c). The router's part, its routing of a token and its
 * backward, is gmlp-test-router-ref.c's.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "test-moe-layer.h"

const Config *
config (const char *name)
{
  guint i;

  for (i = 0; i < G_N_ELEMENTS (configs); i++)
    if (g_str_equal (configs[i].name, name))
      return &configs[i];
  g_assert_not_reached ();
}

/* The device, or NULL after g_test_skip() where none is usable. */
GmlpDevice *
layer_device_or_skip (void)
{
  return gmlp_test_device_or_skip ();
}

static gboolean
is_gated (GmlpActivation act)
{
  return act == GMLP_ACTIVATION_SWIGLU || act == GMLP_ACTIVATION_GEGLU;
}

Mlp *
mlp_new (guint          n,
         gint64         hid,
         gint64         ffn,
         GmlpActivation act,
         gboolean       has_bias)
{
  Mlp *m = g_new0 (Mlp, 1);

  m->n = n, m->hid = hid, m->ffn = ffn, m->act = act, m->has_bias = has_bias;
  m->w1o = is_gated (act) ? 2 * ffn : ffn;
  m->w1 = g_new0 (double, n * m->w1o * hid);
  m->b1 = g_new0 (double, n * m->w1o);
  m->w2 = g_new0 (double, n * hid * ffn);
  m->b2 = g_new0 (double, n * hid);
  return m;
}

void
mlp_free (Mlp *m)
{
  g_free (m->w1);
  g_free (m->b1);
  g_free (m->w2);
  g_free (m->b2);
  g_free (m);
}

static void
mlp_randomize (Mlp       *m,
               GmlpDType  dtype)
{
  gint64 i;

  for (i = 0; i < m->n * m->w1o * m->hid; i++)
    m->w1[i] = gmlp_test_normal (1.0 / sqrt ((double) m->hid), dtype);
  for (i = 0; i < m->n * m->hid * m->ffn; i++)
    m->w2[i] = gmlp_test_normal (1.0 / sqrt ((double) m->ffn), dtype);
  for (i = 0; i < m->n * m->w1o && m->has_bias; i++)
    m->b1[i] = gmlp_test_normal (0.2, dtype);
  for (i = 0; i < m->n * m->hid && m->has_bias; i++)
    m->b2[i] = gmlp_test_normal (0.2, dtype);
}

/* One row through group g: h (w1o), a (ffn) and y (hid), each rounded to
 * dtype as stored. */
static void
mlp_row (const Mlp *m,
         guint      g,
         GmlpDType  dtype,
         const double *x,
         double    *h,
         double    *a,
         double    *y)
{
  const double *w1 = m->w1 + g * m->w1o * m->hid, *w2 = m->w2 + g * m->hid * m->ffn;
  gint64 o, c;

  for (o = 0; o < m->w1o; o++)
    {
      double acc = m->b1[g * m->w1o + o];

      for (c = 0; c < m->hid; c++)
        acc += x[c] * w1[o * m->hid + c];
      h[o] = gmlp_test_round (acc, dtype);
    }
  for (c = 0; c < m->ffn; c++)
    a[c] = gmlp_test_round (is_gated (m->act) ? gmlp_test_act (m->act, h[c]) * h[m->ffn + c]
                                              : gmlp_test_act (m->act, h[c]), dtype);
  for (o = 0; o < m->hid; o++)
    {
      double acc = m->b2[g * m->hid + o];

      for (c = 0; c < m->ffn; c++)
        acc += a[c] * w2[o * m->ffn + c];
      y[o] = gmlp_test_round (acc, dtype);
    }
}

/* The backward of one row of group g for the output gradient gy (as
 * stored): adds to dx (hid) and to grad's group g. */
static void
mlp_row_backward (const Mlp    *m,
                  guint         g,
                  GmlpDType     dtype,
                  const double *x,
                  const double *h,
                  const double *a,
                  const double *gy,
                  double       *dx,
                  Mlp          *grad)
{
  const double *w1 = m->w1 + g * m->w1o * m->hid, *w2 = m->w2 + g * m->hid * m->ffn;
  double *dw1 = grad->w1 + g * m->w1o * m->hid, *dw2 = grad->w2 + g * m->hid * m->ffn;
  g_autofree double *da = g_new (double, m->ffn);
  g_autofree double *dh = g_new (double, m->w1o);
  gint64 o, c;

  for (c = 0; c < m->ffn; c++)
    {
      double acc = 0.0;

      for (o = 0; o < m->hid; o++)
        acc += gy[o] * w2[o * m->ffn + c];
      da[c] = gmlp_test_round (acc, dtype);
    }
  for (c = 0; c < m->ffn; c++)
    {
      if (is_gated (m->act))
        {
          dh[c] = gmlp_test_round (da[c] * h[m->ffn + c] * gmlp_test_act_grad (m->act, h[c]), dtype);
          dh[m->ffn + c] = gmlp_test_round (da[c] * gmlp_test_act (m->act, h[c]), dtype);
        }
      else
        dh[c] = gmlp_test_round (da[c] * gmlp_test_act_grad (m->act, h[c]), dtype);
    }
  for (o = 0; o < m->hid; o++)
    {
      grad->b2[g * m->hid + o] += gy[o];
      for (c = 0; c < m->ffn; c++)
        dw2[o * m->ffn + c] += gy[o] * a[c];
    }
  for (o = 0; o < m->w1o; o++)
    {
      grad->b1[g * m->w1o + o] += dh[o];
      for (c = 0; c < m->hid; c++)
        dw1[o * m->hid + c] += dh[o] * x[c];
    }
  for (c = 0; c < m->hid; c++)
    {
      double acc = 0.0;

      for (o = 0; o < m->w1o; o++)
        acc += dh[o] * w1[o * m->hid + c];
      dx[c] += gmlp_test_round (acc, dtype);
    }
}

void
problem_free (Problem *p)
{
  g_free (p->x);
  g_free (p->dy);
  g_free (p->wg);
  g_free (p->bias);
  g_clear_pointer (&p->experts, mlp_free);
  g_clear_pointer (&p->shared, mlp_free);
  g_free (p->idx);
  g_free (p->probs);
  g_free (p->kept);
  g_free (p->counts);
  g_free (p->rows);
  g_free (p->y);
  g_free (p->dx);
  g_free (p->dwg);
  g_clear_pointer (&p->dexperts, mlp_free);
  g_clear_pointer (&p->dshared, mlp_free);
  g_free (p);
}

/* The reference forward and backward of the problem's data. */
static void
problem_reference (Problem *p)
{
  const Config *c = p->c;
  const GmlpTestRouterSpec *r = GMLP_TEST_ROUTER_SPEC (c);
  gint64 T = p->T, H = p->H, tk = T * c->k, t;
  gint64 cap = gmlp_test_router_ref_capacity (tk, c->E, c->padding, c->capacity);
  g_autofree double *logits = g_new (double, MAX (T * c->E, 1));
  g_autofree double *counts = g_new (double, c->E);
  g_autofree double *gp = g_new0 (double, MAX (tk, 1));
  g_autofree double *dl = g_new (double, MAX (T * c->E, 1));
  g_autofree double *h = g_new (double, 2 * MAX (p->F, p->shared != NULL ? p->shared->ffn : 0));
  g_autofree double *a = g_new (double, MAX (p->F, p->shared != NULL ? p->shared->ffn : 0));
  g_autofree double *ye = g_new (double, H);
  g_autofree double *gy = g_new (double, H);
  g_autofree gint64 *used = g_new0 (gint64, c->E);
  guint j, e;
  gint64 i;

  p->idx = g_new (gint64, MAX (tk, 1));
  p->probs = g_new (double, MAX (tk, 1));
  p->kept = g_new (gboolean, MAX (tk, 1));
  p->counts = g_new0 (gint64, c->E);
  p->rows = g_new0 (gint64, c->E);
  p->y = g_new0 (double, MAX (T * H, 1));
  p->dx = g_new0 (double, MAX (T * H, 1));
  p->dwg = g_new0 (double, c->E * H);
  p->dexperts = mlp_new (c->E, H, p->F, c->act, TRUE);
  if (p->shared != NULL)
    p->dshared = mlp_new (1, H, p->shared->ffn, c->act, TRUE);

  /* Routing, counts and losses, then the drops: each expert keeps its
   * first choices, tokens in order, a token's choices in order. */
  for (t = 0; t < T; t++)
    gmlp_test_router_ref_logits (p->x + t * H, p->wg, c->E, H, logits + t * c->E);
  gmlp_test_router_ref_forward (r, T, logits, p->bias, p->idx, p->probs, counts, &p->aux, &p->z);
  for (i = 0; i < tk; i++)
    {
      e = (guint) p->idx[i];
      p->kept[i] = cap < 0 || used[e] < cap;
      if (p->kept[i])
        used[e]++;
    }
  for (e = 0; e < c->E; e++)
    {
      p->counts[e] = (gint64) counts[e];
      p->rows[e] = used[e];
    }

  /* Forward and backward, token by token: y[t] = Σ kept p · MLP_e (x[t]);
   * the expert's output gradient p dy[t] (stored in dtype), the
   * probability's gradient dy[t] · MLP_e (x[t]). */
  for (t = 0; t < T; t++)
    {
      const double *xt = p->x + t * H, *dyt = p->dy + t * H;
      double yt[HIDDEN] = { 0.0 };

      g_assert_cmpint (H, <=, HIDDEN);
      for (j = 0; j < c->k; j++)
        {
          gint64 q = t * c->k + j;

          if (!p->kept[q])
            continue;
          e = (guint) p->idx[q];
          mlp_row (p->experts, e, p->dtype, xt, h, a, ye);
          for (i = 0; i < H; i++)
            {
              yt[i] += p->probs[q] * ye[i];
              gp[q] += dyt[i] * ye[i];
              gy[i] = gmlp_test_round (p->probs[q] * dyt[i], p->dtype);
            }
          mlp_row_backward (p->experts, e, p->dtype, xt, h, a, gy, p->dx + t * H, p->dexperts);
        }
      if (p->shared != NULL)
        {
          mlp_row (p->shared, 0, p->dtype, xt, h, a, ye);
          for (i = 0; i < H; i++)
            yt[i] = gmlp_test_round (yt[i], p->dtype) + ye[i];
          mlp_row_backward (p->shared, 0, p->dtype, xt, h, a, dyt, p->dx + t * H, p->dshared);
        }
      for (i = 0; i < H; i++)
        p->y[t * H + i] = gmlp_test_round (yt[i], p->dtype);
    }

  /* The router: dlogits, then dx += dlogits Wg, dWg += dlogitsᵀ x. */
  gmlp_test_router_ref_backward (r, T, logits, p->idx, counts, gp, dl);
  for (t = 0; t < T; t++)
    for (i = 0; i < H; i++)
      for (e = 0; e < c->E; e++)
        {
          p->dx[t * H + i] += dl[t * c->E + e] * p->wg[e * H + i];
          p->dwg[e * H + i] += dl[t * c->E + e] * p->x[t * H + i];
        }
}

/* The reference again, after the caller changed the problem's data. */
void
problem_redo_reference (Problem *p)
{
  g_clear_pointer (&p->idx, g_free);
  g_clear_pointer (&p->probs, g_free);
  g_clear_pointer (&p->kept, g_free);
  g_clear_pointer (&p->counts, g_free);
  g_clear_pointer (&p->rows, g_free);
  g_clear_pointer (&p->y, g_free);
  g_clear_pointer (&p->dx, g_free);
  g_clear_pointer (&p->dwg, g_free);
  g_clear_pointer (&p->dexperts, mlp_free);
  g_clear_pointer (&p->dshared, mlp_free);
  problem_reference (p);
}

/* Each token's x drawn until its choices are clear by MARGIN, then dy, and
 * the reference. */
void
problem_draw_data (Problem *p)
{
  const Config *c = p->c;
  g_autofree double *l = g_new (double, c->E);
  g_autoptr(GmlpTestRouterToken) tok = gmlp_test_router_token_new (c->E);
  gint64 t, h, tries;

  p->x = g_new (double, MAX (p->T * p->H, 1));
  for (t = 0; t < p->T; t++)
    for (tries = 0;; tries++)
      {
        g_assert_cmpint (tries, <, 10000);
        for (h = 0; h < p->H; h++)
          p->x[t * p->H + h] = gmlp_test_normal (1.0, p->dtype);
        gmlp_test_router_ref_logits (p->x + t * p->H, p->wg, c->E, p->H, l);
        gmlp_test_router_ref_route (GMLP_TEST_ROUTER_SPEC (c), l, p->bias, tok);
        if (tok->margin >= MARGIN)
          break;
      }
  p->dy = gmlp_test_normals (p->T * p->H, 1.0, p->dtype);
  problem_reference (p);
}

static Mlp *
mlp_copy (const Mlp *m)
{
  Mlp *copy = mlp_new (m->n, m->hid, m->ffn, m->act, m->has_bias);

  memcpy (copy->w1, m->w1, sizeof (double) * m->n * m->w1o * m->hid);
  memcpy (copy->b1, m->b1, sizeof (double) * m->n * m->w1o);
  memcpy (copy->w2, m->w2, sizeof (double) * m->n * m->hid * m->ffn);
  memcpy (copy->b2, m->b2, sizeof (double) * m->n * m->hid);
  return copy;
}

Problem *
problem_alloc (const Config *c,
               GmlpDType     dtype,
               gint64        T)
{
  Problem *p = g_new0 (Problem, 1);

  p->c = c;
  p->dtype = dtype;
  p->T = T;
  p->H = HIDDEN;
  p->F = FFN;
  return p;
}

/* Fresh parameters (or those of @like: another step of the same layer)
 * and data for a configuration. */
Problem *
problem_new_like (const Config  *c,
                  GmlpDType      dtype,
                  gint64         T,
                  const Problem *like)
{
  Problem *p = problem_alloc (c, dtype, T);

  if (like != NULL)
    {
      p->wg = g_memdup2 (like->wg, sizeof (double) * c->E * p->H);
      p->bias = like->bias != NULL ? g_memdup2 (like->bias, sizeof (double) * c->E) : NULL;
      p->experts = mlp_copy (like->experts);
      p->shared = like->shared != NULL ? mlp_copy (like->shared) : NULL;
    }
  else
    {
      p->wg = gmlp_test_normals (c->E * p->H, 1.0 / sqrt ((double) p->H), GMLP_DTYPE_FLOAT32);
      if (c->bias)
        p->bias = gmlp_test_normals (c->E, gmlp_test_router_ref_bias_scale (GMLP_TEST_ROUTER_SPEC (c)),
                                     GMLP_DTYPE_FLOAT32);
      p->experts = mlp_new (c->E, p->H, p->F, c->act, (c->flags & GMLP_LINEAR_BIAS) != 0);
      mlp_randomize (p->experts, dtype);
      if (c->shared > 0)
        {
          p->shared = mlp_new (1, p->H, c->shared, c->act, (c->flags & GMLP_LINEAR_BIAS) != 0);
          mlp_randomize (p->shared, dtype);
        }
    }
  problem_draw_data (p);
  return p;
}

Problem *
problem_new (const Config *c,
             GmlpDType     dtype,
             gint64        T)
{
  return problem_new_like (c, dtype, T, NULL);
}
