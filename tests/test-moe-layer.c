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
 * Every test runs on the CPU and on CUDA against the same references.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <locale.h>
#include <math.h>
#include <string.h>

#include "gmlp-test-util.h"

#define T_TOKENS   24
#define HIDDEN     16
#define FFN        12
#define MARGIN     1e-4
#define RENORM_EPS 1e-20
#define MAX_K      16

#define SOFTMAX GMLP_SCORE_FUNCTION_SOFTMAX
#define SIGMOID GMLP_SCORE_FUNCTION_SIGMOID

typedef struct {
  const char        *name;
  GmlpScoreFunction  score;
  gboolean           before;       /* softmax-before-topk */
  gboolean           renorm;
  double             scale;
  guint              E, k;
  guint              groups, topk_groups;
  gboolean           bias;         /* expert-bias */
  double             aux, z;
  guint              padding;
  double             capacity;     /* capacity-factor */
  gint64             shared;       /* shared-expert-ffn-hidden */
  GmlpActivation     act;
  GmlpLinearFlags    flags;
} Config;

#define SWIGLU GMLP_ACTIVATION_SWIGLU
#define GELU   GMLP_ACTIVATION_GELU
#define GEGLU  GMLP_ACTIVATION_GEGLU
#define LBIAS  GMLP_LINEAR_BIAS
#define SINGLE GMLP_LINEAR_SINGLE_GROUPED_WEIGHT

static const Config configs[] = {
  /* name, score, before, renorm, scale, E, k, groups, topk_groups, bias, aux, z, padding, capacity,
   * shared, act, flags */
  { "mixtral", SOFTMAX, TRUE, TRUE, 1.0, 8, 2, 0, 0, FALSE, 0.0, 0.0, 0, 0.0, 0, SWIGLU, 0 },
  { "sigmoid-groups", SIGMOID, TRUE, TRUE, 2.5, 8, 2, 4, 2, FALSE, 0.0, 0.0, 0, 0.0, 0, SWIGLU, LBIAS },
  { "softmax-after-gelu", SOFTMAX, FALSE, TRUE, 1.0, 6, 3, 0, 0, FALSE, 0.0, 0.0, 0, 0.0, 0, GELU, SINGLE },
  { "raw-scaled-geglu", SOFTMAX, TRUE, FALSE, 1.5, 8, 3, 0, 0, FALSE, 0.0, 0.0, 0, 0.0, 0, GEGLU,
    LBIAS | SINGLE },
  /* 48 choices over 4 experts, 6 kept each: most experts drop. */
  { "capacity", SOFTMAX, TRUE, TRUE, 1.0, 4, 2, 0, 0, FALSE, 0.0, 0.0, 0, 0.5, 0, SWIGLU, LBIAS },
  /* 6 per expert rounded up to 8, which the busiest expert passes. */
  { "capacity-padded", SOFTMAX, TRUE, TRUE, 1.0, 4, 2, 0, 0, FALSE, 0.0, 0.0, 8, 0.5, 0, SWIGLU, 0 },
  { "padding16", SOFTMAX, TRUE, TRUE, 1.0, 8, 2, 0, 0, FALSE, 0.0, 0.0, 16, 0.0, 0, SWIGLU, LBIAS },
  { "aux-z", SOFTMAX, TRUE, TRUE, 1.0, 8, 2, 0, 0, FALSE, 0.05, 0.01, 0, 0.0, 0, SWIGLU, 0 },
  { "shared", SOFTMAX, TRUE, TRUE, 1.0, 8, 2, 0, 0, FALSE, 0.0, 0.0, 0, 0.0, 20, SWIGLU, LBIAS },
  /* DeepSeek-V3-like: sigmoid, groups, bias, both losses, a shared expert,
   * padding and a capacity. */
  { "deepseek", SIGMOID, TRUE, TRUE, 2.5, 16, 4, 4, 2, TRUE, 0.1, 0.02, 32, 1.5, 8, SWIGLU, SINGLE },
};

static const Config *
config (const char *name)
{
  guint i;

  for (i = 0; i < G_N_ELEMENTS (configs); i++)
    if (g_str_equal (configs[i].name, name))
      return &configs[i];
  g_assert_not_reached ();
}

static const GmlpDType dtypes[] = { GMLP_DTYPE_FLOAT32, GMLP_DTYPE_BFLOAT16 };

/* The device, or NULL after g_test_skip() where none is usable. */
static GmlpDevice *
layer_device_or_skip (void)
{
  return gmlp_test_device_or_skip ();
}

static gboolean
is_gated (GmlpActivation act)
{
  return act == GMLP_ACTIVATION_SWIGLU || act == GMLP_ACTIVATION_GEGLU;
}

/* Float64 router */

/* Whether value a (of expert ia) ranks before value b (of expert ib):
 * higher first, the lower index on ties. */
static gboolean
ranks_before (double a,
              guint  ia,
              double b,
              guint  ib)
{
  return a > b || (a == b && ia < ib);
}

/* The n best of values[0 .. len) whose mask is set (all when mask is
 * NULL), best first, into best[]. */
static void
best_of (const double   *values,
         guint           len,
         const gboolean *mask,
         guint           n,
         guint          *best)
{
  guint i, j;

  for (j = 0; j < n; j++)
    {
      gint pick = -1;

      for (i = 0; i < len; i++)
        {
          gboolean taken = FALSE;
          guint q;

          for (q = 0; q < j && !taken; q++)
            taken = best[q] == i;
          if (taken || (mask != NULL && !mask[i]))
            continue;
          if (pick < 0 || ranks_before (values[i], i, values[pick], pick))
            pick = (gint) i;
        }
      g_assert_cmpint (pick, >=, 0);
      best[j] = (guint) pick;
    }
}

/* One token through the float64 router: softmax sm (and the logsumexp),
 * scores s, selection values v, the choices and their probabilities; the
 * smallest gap that decides the choices into *margin. */
typedef struct {
  double  sm[64], s[64], v[64], lse;
  guint   idx[MAX_K];
  double  p[MAX_K];
  double  margin;
} TokenRoute;

static void
route_token (const Config *c,
             const double *l,
             const double *bias,
             TokenRoute   *r)
{
  gboolean mask[64];
  guint order[MAX_K + 1], j, n_candidates = c->E;
  double m = -INFINITY, sum = 0.0;

  g_assert_cmpuint (c->E, <=, 64);
  for (j = 0; j < c->E; j++)
    m = fmax (m, l[j]);
  for (j = 0; j < c->E; j++)
    sum += r->sm[j] = exp (l[j] - m);
  for (j = 0; j < c->E; j++)
    {
      r->sm[j] /= sum;
      r->s[j] = c->score == SOFTMAX ? r->sm[j] : 1.0 / (1.0 + exp (-l[j]));
      r->v[j] = (c->score == SOFTMAX && !c->before ? l[j] : r->s[j]) + (bias != NULL ? bias[j] : 0.0);
      mask[j] = TRUE;
    }
  r->lse = m + log (sum);
  r->margin = INFINITY;

  if (c->groups > 0)
    {
      guint per = c->E / c->groups, top = MIN (per, 2), g, q, two[2], gorder[64];
      double gscore[64];

      for (g = 0; g < c->groups; g++)
        {
          best_of (r->v + g * per, per, NULL, top, two);
          gscore[g] = 0.0;
          for (q = 0; q < top; q++)
            gscore[g] += r->v[g * per + two[q]];
        }
      best_of (gscore, c->groups, NULL, c->groups, gorder);
      for (j = 0; j < c->E; j++)
        mask[j] = FALSE;
      for (g = 0; g < c->topk_groups; g++)
        for (q = 0; q < per; q++)
          mask[gorder[g] * per + q] = TRUE;
      n_candidates = c->topk_groups * per;
      if (c->topk_groups < c->groups)
        r->margin = fabs (gscore[gorder[c->topk_groups - 1]] - gscore[gorder[c->topk_groups]]);
    }
  best_of (r->v, c->E, mask, MIN (c->k + 1, n_candidates), order);
  for (j = 0; j + 1 < MIN (c->k + 1, n_candidates); j++)
    r->margin = fmin (r->margin, fabs (r->v[order[j]] - r->v[order[j + 1]]));

  sum = 0.0;
  m = -INFINITY;
  for (j = 0; j < c->k; j++)
    {
      r->idx[j] = order[j];
      m = fmax (m, l[order[j]]);
    }
  if (c->score == SOFTMAX && !c->before)
    {
      /* The softmax of the chosen logits. */
      for (j = 0; j < c->k; j++)
        sum += r->p[j] = exp (l[r->idx[j]] - m);
      for (j = 0; j < c->k; j++)
        r->p[j] /= sum;
    }
  else
    {
      for (j = 0; j < c->k; j++)
        sum += r->p[j] = r->s[r->idx[j]];
      for (j = 0; j < c->k && c->renorm; j++)
        r->p[j] /= sum + RENORM_EPS;
    }
  for (j = 0; j < c->k; j++)
    r->p[j] *= c->scale;
}

/* The aux loss's distribution of one token: the softmax, or the sigmoid
 * scores over their sum. */
static double
aux_dist (const Config     *c,
          const TokenRoute *r,
          guint             e)
{
  double sum = 0.0;
  guint j;

  if (c->score == SOFTMAX)
    return r->sm[e];
  for (j = 0; j < c->E; j++)
    sum += r->s[j];
  return r->s[e] / (sum + RENORM_EPS);
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

/* d(Σ_j gp_j p_j + the token's share of the losses) / d(logits), the
 * choices held fixed: aux_grad[e] = d aux / d dist[e] for this token, z_grad
 * = d z / d lse². Analytic, through the renormalization and the score
 * function. */
static void
route_token_backward (const Config     *c,
                      const TokenRoute *r,
                      const double     *gp,
                      const double     *aux_grad,
                      double            z_grad,
                      double           *dl)
{
  double ds[64] = { 0.0 }, dot = 0.0, sum = 0.0;
  guint j, e;

  for (e = 0; e < c->E; e++)
    dl[e] = 0.0;

  if (c->score == SOFTMAX && !c->before)
    {
      /* p = scale · softmax (chosen logits). */
      double q[MAX_K], g[MAX_K], d[MAX_K] = { 0.0 };

      for (j = 0; j < c->k; j++)
        {
          q[j] = r->p[j] / c->scale;
          g[j] = c->scale * gp[j];
        }
      softmax_backward (q, g, c->k, d);
      for (j = 0; j < c->k; j++)
        dl[r->idx[j]] += d[j];
    }
  else if (c->renorm)
    {
      for (j = 0; j < c->k; j++)
        {
          sum += r->s[r->idx[j]];
          dot += gp[j] * r->s[r->idx[j]];
        }
      /* One fraction, so that a single choice (p = 1) gives exactly 0. */
      sum += RENORM_EPS;
      for (j = 0; j < c->k; j++)
        ds[r->idx[j]] += c->scale * (gp[j] * sum - dot) / (sum * sum);
    }
  else
    for (j = 0; j < c->k; j++)
      ds[r->idx[j]] += c->scale * gp[j];

  /* The aux loss's distribution: the softmax scores themselves, or the
   * sigmoid scores over their sum. */
  if (aux_grad != NULL && c->score == SOFTMAX)
    for (e = 0; e < c->E; e++)
      ds[e] += aux_grad[e];
  else if (aux_grad != NULL)
    {
      double total = RENORM_EPS, d = 0.0;

      for (e = 0; e < c->E; e++)
        {
          total += r->s[e];
          d += aux_grad[e] * r->s[e];
        }
      for (e = 0; e < c->E; e++)
        ds[e] += aux_grad[e] / total - d / (total * total);
    }

  /* Through the score function. */
  if (c->score == SOFTMAX)
    softmax_backward (r->sm, ds, c->E, dl);
  else
    for (e = 0; e < c->E; e++)
      dl[e] += ds[e] * r->s[e] * (1.0 - r->s[e]);

  /* z = coeff × mean lse²: d lse / d l = softmax. */
  for (e = 0; e < c->E; e++)
    dl[e] += z_grad * 2.0 * r->lse * r->sm[e];
}

/* Float64 experts */

/* An MLP's parameters (n groups), or its gradients, as float64. */
typedef struct {
  guint           n;
  gint64          hid, ffn, w1o;
  GmlpActivation  act;
  gboolean        has_bias;
  double         *w1, *b1, *w2, *b2;   /* n × w1o × hid, n × w1o, n × hid × ffn, n × hid */
} Mlp;

static Mlp *
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

static void
mlp_free (Mlp *m)
{
  g_free (m->w1);
  g_free (m->b1);
  g_free (m->w2);
  g_free (m->b2);
  g_free (m);
}
G_DEFINE_AUTOPTR_CLEANUP_FUNC (Mlp, mlp_free)

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

/* A problem: a layer's configuration, parameters and inputs as stored, and
 * the float64 reference of a forward and backward. */
typedef struct {
  const Config *c;
  GmlpDType     dtype;
  gint64        T, H, F;
  double       *x;        /* T × H */
  double       *dy;       /* T × H */
  double       *wg;       /* E × H, FP32 */
  double       *bias;     /* E, or NULL */
  Mlp          *experts;
  Mlp          *shared;   /* or NULL */

  /* The reference. */
  gint64       *idx;      /* T × k */
  double       *probs;    /* T × k */
  gboolean     *kept;     /* T × k */
  gint64       *counts;   /* E, before drops */
  gint64       *rows;     /* E, kept */
  double        aux, z;
  double       *y;        /* T × H */
  double       *dx;       /* T × H */
  double       *dwg;      /* E × H */
  Mlp          *dexperts;
  Mlp          *dshared;
} Problem;

static void
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
G_DEFINE_AUTOPTR_CLEANUP_FUNC (Problem, problem_free)

static void
logits_of (const Problem *p,
           gint64         t,
           double        *l)
{
  guint e;
  gint64 h;

  for (e = 0; e < p->c->E; e++)
    {
      double acc = 0.0;

      for (h = 0; h < p->H; h++)
        acc += p->x[t * p->H + h] * p->wg[e * p->H + h];
      l[e] = acc;
    }
}

/* The capacity of each expert, as documented: ceil (factor × T k / E),
 * at most T k, rounded up to the padding; -1 without a capacity. */
static gint64
expert_capacity (const Config *c,
                 gint64        T)
{
  gint64 n = T * c->k, pad = MAX (c->padding, 1), cap;
  double per;

  if (c->capacity <= 0.0)
    return -1;
  per = ceil (c->capacity * (double) n / c->E);
  cap = per >= (double) n ? n : (gint64) per;
  return (cap + pad - 1) / pad * pad;
}

/* The reference forward and backward of the problem's data. */
static void
problem_reference (Problem *p)
{
  const Config *c = p->c;
  gint64 T = p->T, H = p->H, tk = T * c->k, cap = expert_capacity (c, T), t;
  g_autofree TokenRoute *routes = g_new0 (TokenRoute, MAX (T, 1));
  g_autofree double *l = g_new (double, c->E);
  g_autofree double *gp = g_new0 (double, MAX (tk, 1));
  g_autofree double *aux_grad = g_new0 (double, c->E);
  g_autofree double *mean = g_new0 (double, c->E);
  g_autofree double *dl = g_new (double, c->E);
  g_autofree double *h = g_new (double, 2 * MAX (p->F, p->shared != NULL ? p->shared->ffn : 0));
  g_autofree double *a = g_new (double, MAX (p->F, p->shared != NULL ? p->shared->ffn : 0));
  g_autofree double *ye = g_new (double, H);
  g_autofree double *gy = g_new (double, H);
  g_autofree gint64 *used = g_new0 (gint64, c->E);
  double z_sum = 0.0, sum = 0.0;
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

  /* Routing, counts, drops (each expert keeps its first choices, tokens
   * in order, a token's choices in order), losses. */
  for (t = 0; t < T; t++)
    {
      logits_of (p, t, l);
      route_token (c, l, p->bias, &routes[t]);
      for (j = 0; j < c->k; j++)
        {
          e = routes[t].idx[j];
          p->idx[t * c->k + j] = e;
          p->probs[t * c->k + j] = routes[t].p[j];
          p->counts[e]++;
          p->kept[t * c->k + j] = cap < 0 || used[e] < cap;
          if (p->kept[t * c->k + j])
            used[e]++;
        }
      for (e = 0; e < c->E; e++)
        mean[e] += aux_dist (c, &routes[t], e) / T;
      z_sum += routes[t].lse * routes[t].lse;
    }
  for (e = 0; e < c->E; e++)
    {
      p->rows[e] = used[e];
      sum += (double) p->counts[e] / (double) tk * mean[e];
    }
  p->aux = T > 0 ? c->aux * c->E * sum : 0.0;
  p->z = T > 0 ? c->z * z_sum / T : 0.0;

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
  for (e = 0; e < c->E && T > 0; e++)
    aux_grad[e] = c->aux * c->E * ((double) p->counts[e] / (double) tk) / T;
  for (t = 0; t < T; t++)
    {
      route_token_backward (c, &routes[t], gp + t * c->k, c->aux != 0.0 ? aux_grad : NULL, c->z / T, dl);
      for (i = 0; i < H; i++)
        for (e = 0; e < c->E; e++)
          {
            p->dx[t * H + i] += dl[e] * p->wg[e * H + i];
            p->dwg[e * H + i] += dl[e] * p->x[t * H + i];
          }
    }
}

/* The reference again, after the caller changed the problem's data. */
static void
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
static void
problem_draw_data (Problem *p)
{
  const Config *c = p->c;
  g_autofree double *l = g_new (double, c->E);
  gint64 t, h, tries;
  TokenRoute r;

  p->x = g_new (double, MAX (p->T * p->H, 1));
  for (t = 0; t < p->T; t++)
    for (tries = 0;; tries++)
      {
        g_assert_cmpint (tries, <, 10000);
        for (h = 0; h < p->H; h++)
          p->x[t * p->H + h] = gmlp_test_normal (1.0, p->dtype);
        logits_of (p, t, l);
        route_token (c, l, p->bias, &r);
        if (r.margin >= MARGIN)
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

static Problem *
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
static Problem *
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
        p->bias = gmlp_test_normals (c->E, c->score == SIGMOID ? 0.2 : 0.5 / c->E, GMLP_DTYPE_FLOAT32);
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

static Problem *
problem_new (const Config *c,
             GmlpDType     dtype,
             gint64        T)
{
  return problem_new_like (c, dtype, T, NULL);
}

/* Library side */

/* A layer of the configuration, made from its properties. */
static GmlpMoELayer *
layer_new (GmlpDevice      *device,
           const Config    *c,
           GmlpDType        dtype,
           GmlpLinearFlags  extra_flags)
{
  g_autoptr(GError) error = NULL;
  GmlpMoELayer *layer = g_initable_new (GMLP_TYPE_MOE_LAYER, NULL, &error,
                                        "device", device,
                                        "hidden", (gint64) HIDDEN,
                                        "ffn-hidden", (gint64) FFN,
                                        "n-experts", c->E,
                                        "top-k", c->k,
                                        "activation", c->act,
                                        "dtype", dtype,
                                        "flags", c->flags | extra_flags,
                                        "score-function", c->score,
                                        "softmax-before-topk", c->before,
                                        "renormalize", c->renorm,
                                        "scaling-factor", c->scale,
                                        "n-expert-groups", c->groups,
                                        "topk-groups", c->topk_groups,
                                        "expert-bias", c->bias,
                                        "aux-loss-coeff", c->aux,
                                        "z-loss-coeff", c->z,
                                        "padding", c->padding,
                                        "capacity-factor", c->capacity,
                                        "shared-expert-ffn-hidden", c->shared,
                                        NULL);

  g_assert_no_error (error);
  g_assert_nonnull (layer);
  return layer;
}

static void
set_mlp (GmlpGroupedMLP *mlp,
         const Mlp      *m)
{
  g_assert_nonnull (mlp);
  g_assert_cmpuint (gmlp_grouped_linear_get_n_groups (gmlp_grouped_mlp_get_fc1 (mlp)), ==, m->n);
  g_assert_cmpint (gmlp_grouped_linear_get_out_features (gmlp_grouped_mlp_get_fc1 (mlp)), ==, m->w1o);
  g_assert_cmpint (gmlp_grouped_linear_get_in_features (gmlp_grouped_mlp_get_fc2 (mlp)), ==, m->ffn);
  gmlp_test_set_linear (gmlp_grouped_mlp_get_fc1 (mlp), m->w1, m->b1);
  gmlp_test_set_linear (gmlp_grouped_mlp_get_fc2 (mlp), m->w2, m->b2);
}

/* A layer holding the problem's parameters. */
static GmlpMoELayer *
problem_layer (Problem         *p,
               GmlpDevice      *device,
               GmlpLinearFlags  extra_flags)
{
  GmlpMoELayer *layer = layer_new (device, p->c, p->dtype, extra_flags);
  GmlpRouter *router = gmlp_moe_layer_get_router (layer);
  g_autoptr(GBytes) wb = gmlp_test_encode_values (p->wg, p->c->E * p->H, GMLP_DTYPE_FLOAT32);
  g_autoptr(GError) error = NULL;

  g_assert_nonnull (router);
  g_assert_true (gmlp_router_set_weight_from_bytes (router, wb, &error));
  g_assert_no_error (error);
  if (p->bias != NULL)
    {
      g_autoptr(GBytes) bb = gmlp_test_encode_values (p->bias, p->c->E, GMLP_DTYPE_FLOAT32);

      g_assert_true (gmlp_router_set_expert_bias_from_bytes (router, bb, &error));
      g_assert_no_error (error);
    }
  set_mlp (gmlp_moe_layer_get_experts (layer), p->experts);
  if (p->shared != NULL)
    set_mlp (gmlp_moe_layer_get_shared_expert (layer), p->shared);
  else
    g_assert_null (gmlp_moe_layer_get_shared_expert (layer));
  return layer;
}

/* A GroupedLinear's weights (or biases), group after group, whether
 * grouped or per group, as float64. */
static void
read_linear (GmlpGroupedLinear *linear,
             gboolean           bias,
             double            *out)
{
  gboolean single = gmlp_grouped_linear_get_flags (linear) & GMLP_LINEAR_SINGLE_GROUPED_WEIGHT;
  guint g;
  gsize at = 0;

  for (g = 0; g < (single ? 1 : gmlp_grouped_linear_get_n_groups (linear)); g++)
    {
      GmlpGroupedTensor *t = bias ? (single ? gmlp_grouped_linear_get_bias (linear)
                                            : gmlp_grouped_linear_get_bias_member (linear, g))
                                  : (single ? gmlp_grouped_linear_get_weight (linear)
                                            : gmlp_grouped_linear_get_weight_member (linear, g));
      g_autofree double *v = NULL;
      gsize n;

      g_assert_nonnull (t);
      v = gmlp_test_download (t, &n);
      memcpy (out + at, v, sizeof (double) * n);
      at += n;
    }
}

static Mlp *
read_mlp (GmlpGroupedMLP *mlp,
          gint64          ffn)
{
  GmlpGroupedLinear *fc1 = gmlp_grouped_mlp_get_fc1 (mlp), *fc2 = gmlp_grouped_mlp_get_fc2 (mlp);
  gboolean has_bias = (gmlp_grouped_linear_get_flags (fc1) & GMLP_LINEAR_BIAS) != 0;
  Mlp *m = mlp_new (gmlp_grouped_linear_get_n_groups (fc1), gmlp_grouped_linear_get_in_features (fc1), ffn,
                    gmlp_grouped_mlp_get_activation (mlp), has_bias);

  g_assert_cmpint (gmlp_grouped_linear_get_out_features (fc1), ==, m->w1o);
  read_linear (fc1, FALSE, m->w1);
  read_linear (fc2, FALSE, m->w2);
  if (has_bias)
    {
      read_linear (fc1, TRUE, m->b1);
      read_linear (fc2, TRUE, m->b2);
    }
  return m;
}

/* A problem of @layer's own parameters (as the layer holds them: the
 * experts read from get_experts(), the gate from the router) and fresh
 * data. */
static Problem *
problem_new_from_layer (const Config *c,
                        GmlpMoELayer *layer,
                        gint64        T)
{
  GmlpRouter *router = gmlp_moe_layer_get_router (layer);
  GmlpDType dtype = gmlp_grouped_linear_get_dtype (gmlp_grouped_mlp_get_fc1 (gmlp_moe_layer_get_experts (layer)));
  Problem *p = problem_alloc (c, dtype, T);
  gsize n;

  p->wg = gmlp_test_download (gmlp_router_get_weight (router), &n);
  g_assert_cmpuint (n, ==, c->E * p->H);
  if (c->bias)
    p->bias = gmlp_test_download (gmlp_router_get_expert_bias (router), &n);
  p->experts = read_mlp (gmlp_moe_layer_get_experts (layer), p->F);
  if (c->shared > 0)
    p->shared = read_mlp (gmlp_moe_layer_get_shared_expert (layer), c->shared);
  problem_draw_data (p);
  return p;
}

typedef enum {
  GRAD_WEIGHT,   /* wgrad, or main_grad with fused accumulation */
  GRAD_BIAS,
} GradKind;

/* A GroupedLinear's weight or bias gradient under the gradient contract,
 * group after group, whether its weights are grouped or per group. */
static double *
linear_grad (GmlpGroupedLinear *linear,
             GradKind           kind,
             gsize             *n_values)
{
  GmlpLinearFlags flags = gmlp_grouped_linear_get_flags (linear);
  gboolean fused = (flags & GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION) && kind == GRAD_WEIGHT;
  guint n = gmlp_grouped_linear_get_n_groups (linear), g;
  GArray *all = g_array_new (FALSE, FALSE, sizeof (double));

  if (flags & GMLP_LINEAR_SINGLE_GROUPED_WEIGHT)
    {
      GmlpGroupedTensor *t = kind == GRAD_BIAS ? gmlp_grouped_linear_get_bgrad (linear)
                             : fused ? gmlp_grouped_linear_get_main_grad (linear)
                             : gmlp_grouped_linear_get_wgrad (linear);
      g_autofree double *v = NULL;
      gsize len;

      g_assert_nonnull (t);
      v = gmlp_test_download (t, &len);
      g_array_append_vals (all, v, len);
    }
  else
    for (g = 0; g < n; g++)
      {
        GmlpGroupedTensor *t = kind == GRAD_BIAS ? gmlp_grouped_linear_get_bgrad_member (linear, g)
                               : fused ? gmlp_grouped_linear_get_main_grad_member (linear, g)
                               : gmlp_grouped_linear_get_wgrad_member (linear, g);
        g_autofree double *v = NULL;
        gsize len;

        g_assert_nonnull (t);
        v = gmlp_test_download (t, &len);
        g_array_append_vals (all, v, len);
      }
  *n_values = all->len;
  return (double *) g_array_free (all, FALSE);
}

static double *
router_grad (GmlpRouter *router,
             gsize      *n)
{
  GmlpGroupedTensor *t = gmlp_router_get_wgrad (router);

  if (gmlp_router_get_flags (router) & GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION)
    t = gmlp_router_get_main_grad (router);
  g_assert_nonnull (t);
  return gmlp_test_download (t, n);
}

static double
tolerance (GmlpDType dtype)
{
  return dtype == GMLP_DTYPE_FLOAT32 ? 1e-4 : 2.0 * gmlp_test_tolerance (dtype);
}

/* The gate's gradient sums, over the tokens, dot products of dy with the
 * experts' 16-bit outputs, which largely cancel: a 16-bit rounding that
 * differs by one unit weighs more in it than in the other results. */
static double
router_tolerance (GmlpDType dtype)
{
  return dtype == GMLP_DTYPE_FLOAT32 ? 1e-4 : 4.0 * gmlp_test_tolerance (dtype);
}

static void
assert_close (const double *got,
              const double *want,
              gsize         n,
              double        tol,
              const char   *what,
              const char   *part)
{
  g_autofree char *label = g_strdup_printf ("%s: %s", what, part);

  gmlp_test_assert_close (got, want, n, tol, label);
}

/* An MLP's gradients against the reference's (weights always, biases when
 * it has them); minus @base (a main_grad's earlier contents) when given. */
/* Every gradient the layer holds (the router's, then the experts' and the
 * shared expert's, FC1 then FC2, weight then bias), as float64: to compare
 * two steps bit for bit. */
static double *
layer_grads (GmlpMoELayer *layer,
             gsize        *n_values)
{
  GmlpGroupedMLP *mlps[2] = { gmlp_moe_layer_get_experts (layer), gmlp_moe_layer_get_shared_expert (layer) };
  GArray *all = g_array_new (FALSE, FALSE, sizeof (double));
  g_autofree double *router = NULL;
  gsize n;
  guint m, i, kind;

  router = router_grad (gmlp_moe_layer_get_router (layer), &n);
  g_array_append_vals (all, router, n);
  for (m = 0; m < G_N_ELEMENTS (mlps) && mlps[m] != NULL; m++)
    for (i = 0; i < 2; i++)
      {
        GmlpGroupedLinear *fc = i == 0 ? gmlp_grouped_mlp_get_fc1 (mlps[m]) : gmlp_grouped_mlp_get_fc2 (mlps[m]);

        for (kind = GRAD_WEIGHT; kind <= GRAD_BIAS; kind++)
          {
            g_autofree double *v = NULL;

            if (kind == GRAD_BIAS && !(gmlp_grouped_linear_get_flags (fc) & GMLP_LINEAR_BIAS))
              continue;
            v = linear_grad (fc, kind, &n);
            g_array_append_vals (all, v, n);
          }
      }
  *n_values = all->len;
  return (double *) g_array_free (all, FALSE);
}

static void
assert_mlp_grads (GmlpGroupedMLP *mlp,
                  const Mlp      *want,
                  GmlpDType       dtype,
                  const Mlp      *base,
                  const char     *what,
                  const char     *which)
{
  GmlpGroupedLinear *fc[2] = { gmlp_grouped_mlp_get_fc1 (mlp), gmlp_grouped_mlp_get_fc2 (mlp) };
  const double *wants[2][2] = { { want->w1, want->b1 }, { want->w2, want->b2 } };
  const double *bases[2] = { base != NULL ? base->w1 : NULL, base != NULL ? base->w2 : NULL };
  guint i, kind;

  for (i = 0; i < 2; i++)
    for (kind = GRAD_WEIGHT; kind <= GRAD_BIAS; kind++)
      {
        g_autofree double *got = NULL;
        g_autofree char *part = NULL;
        gsize n, q;

        if (kind == GRAD_BIAS && !(gmlp_grouped_linear_get_flags (fc[i]) & GMLP_LINEAR_BIAS))
          continue;
        got = linear_grad (fc[i], kind, &n);
        g_assert_cmpuint (n, ==, i == 0 ? want->n * want->w1o * (kind == GRAD_WEIGHT ? want->hid : 1)
                                        : want->n * want->hid * (kind == GRAD_WEIGHT ? want->ffn : 1));
        for (q = 0; q < n && kind == GRAD_WEIGHT && bases[i] != NULL; q++)
          got[q] -= bases[i][q];
        part = g_strdup_printf ("%s fc%u %s", which, i + 1, kind == GRAD_WEIGHT ? "dW" : "db");
        assert_close (got, wants[i][kind], n, tolerance (dtype), what, part);
      }
}

/* The experts' gradients: an expert that got no rows has exactly zero. */
static void
assert_empty_experts_zero (GmlpGroupedMLP *mlp,
                           const Problem  *p)
{
  GmlpGroupedLinear *fc1 = gmlp_grouped_mlp_get_fc1 (mlp);
  g_autofree double *got = NULL;
  gsize n, per = p->experts->w1o * p->H, i;
  guint e;

  if (gmlp_grouped_linear_get_flags (fc1) & GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION)
    return;
  got = linear_grad (fc1, GRAD_WEIGHT, &n);
  for (e = 0; e < p->c->E; e++)
    for (i = 0; i < per && p->rows[e] == 0; i++)
      gmlp_assert_same_value (got[e * per + i], 0.0, "dW1 of an expert without rows", e * per + i);
}

/* The weight gradients a layer holds now (a fused layer's main_grads
 * before a step): experts, shared expert, router. */
typedef struct {
  Mlp    *experts, *shared;
  double *router;
} Held;

static void
held_free (Held *h)
{
  g_clear_pointer (&h->experts, mlp_free);
  g_clear_pointer (&h->shared, mlp_free);
  g_free (h->router);
  g_free (h);
}
G_DEFINE_AUTOPTR_CLEANUP_FUNC (Held, held_free)

static Mlp *
held_mlp (GmlpGroupedMLP *mlp)
{
  GmlpGroupedLinear *fc1 = gmlp_grouped_mlp_get_fc1 (mlp), *fc2 = gmlp_grouped_mlp_get_fc2 (mlp);
  Mlp *m = mlp_new (gmlp_grouped_linear_get_n_groups (fc1), gmlp_grouped_linear_get_in_features (fc1),
                    gmlp_grouped_linear_get_in_features (fc2), gmlp_grouped_mlp_get_activation (mlp), FALSE);
  gsize n;

  g_free (m->w1);
  m->w1 = linear_grad (fc1, GRAD_WEIGHT, &n);
  g_assert_cmpuint (n, ==, m->n * m->w1o * m->hid);
  g_free (m->w2);
  m->w2 = linear_grad (fc2, GRAD_WEIGHT, &n);
  g_assert_cmpuint (n, ==, m->n * m->hid * m->ffn);
  return m;
}

static Held *
held_new (GmlpMoELayer *layer)
{
  Held *h = g_new0 (Held, 1);
  gsize n;

  h->experts = held_mlp (gmlp_moe_layer_get_experts (layer));
  if (gmlp_moe_layer_get_shared_expert (layer) != NULL)
    h->shared = held_mlp (gmlp_moe_layer_get_shared_expert (layer));
  h->router = router_grad (gmlp_moe_layer_get_router (layer), &n);
  return h;
}

/* dst += src's weight gradients (accumulated); dst's bias gradients become
 * src's (overwritten, as the contract has them). */
static void
mlp_accumulate (Mlp       *dst,
                const Mlp *src)
{
  gint64 i;

  for (i = 0; i < dst->n * dst->w1o * dst->hid; i++)
    dst->w1[i] += src->w1[i];
  for (i = 0; i < dst->n * dst->hid * dst->ffn; i++)
    dst->w2[i] += src->w2[i];
  memcpy (dst->b1, src->b1, sizeof (double) * dst->n * dst->w1o);
  memcpy (dst->b2, src->b2, sizeof (double) * dst->n * dst->hid);
}

/* The reference gradients of two steps of a fused layer, into @into's:
 * the weights' accumulated, the biases' of the later step. */
static void
problem_accumulate_grads (Problem       *into,
                          const Problem *later)
{
  gint64 i;

  mlp_accumulate (into->dexperts, later->dexperts);
  if (into->dshared != NULL)
    mlp_accumulate (into->dshared, later->dshared);
  for (i = 0; i < into->c->E * into->H; i++)
    into->dwg[i] += later->dwg[i];
}

/* A fused layer's main_grads against @held plus the reference @p's
 * gradients. */
static void
assert_main_grads (GmlpMoELayer  *layer,
                   const Held    *held,
                   const Problem *p,
                   const char    *what)
{
  g_autofree double *got = NULL;
  gsize n, i;

  assert_mlp_grads (gmlp_moe_layer_get_experts (layer), p->dexperts, p->dtype, held->experts, what,
                    "experts' main_grad");
  if (p->shared != NULL)
    assert_mlp_grads (gmlp_moe_layer_get_shared_expert (layer), p->dshared, p->dtype, held->shared, what,
                      "shared main_grad");
  got = router_grad (gmlp_moe_layer_get_router (layer), &n);
  g_assert_cmpuint (n, ==, p->c->E * p->H);
  for (i = 0; i < n; i++)
    got[i] -= held->router[i];
  assert_close (got, p->dwg, n, router_tolerance (p->dtype), what, "router main_grad");
}

/* The layer's routing and losses against the reference. */
static void
assert_routing (Problem      *p,
                GmlpMoELayer *layer,
                const char   *what)
{
  const Config *c = p->c;
  /* The getters of the last forward give references (transfer full). */
  g_autoptr(GmlpRouting) routing = gmlp_moe_layer_get_routing (layer);
  g_autoptr(GmlpGroupedTensor) layer_tokens = gmlp_moe_layer_get_tokens_per_expert (layer);
  g_autoptr(GmlpGroupedTensor) layer_aux = gmlp_moe_layer_get_aux_loss (layer);
  gsize n, tk = (gsize) p->T * c->k, i;
  g_autofree gint64 *idx = NULL, *counts = NULL, *layer_counts = NULL;
  g_autofree double *probs = NULL;

  g_assert_nonnull (routing);
  g_assert_cmpint (gmlp_routing_get_n_tokens (routing), ==, p->T);
  g_assert_cmpuint (gmlp_routing_get_top_k (routing), ==, c->k);
  g_assert_cmpuint (gmlp_routing_get_n_experts (routing), ==, c->E);
  idx = gmlp_test_download_i64 (gmlp_routing_get_indices (routing), &n);
  g_assert_cmpuint (n, ==, tk);
  for (i = 0; i < tk; i++)
    if (idx[i] != p->idx[i])
      g_error ("%s: token %" G_GSIZE_FORMAT " choice %" G_GSIZE_FORMAT ": expert %" G_GINT64_FORMAT
               ", expected %" G_GINT64_FORMAT, what, i / c->k, i % c->k, idx[i], p->idx[i]);
  probs = gmlp_test_download (gmlp_routing_get_probs (routing), &n);
  g_assert_cmpuint (n, ==, tk);
  assert_close (probs, p->probs, tk, 1e-5, what, "probabilities");

  /* Tokens per expert: the choices before any drop, the same from the
   * layer as from its routing. */
  counts = gmlp_test_download_i64 (gmlp_routing_get_tokens_per_expert (routing), &n);
  g_assert_cmpuint (n, ==, c->E);
  layer_counts = gmlp_test_download_i64 (layer_tokens, &n);
  g_assert_cmpuint (n, ==, c->E);
  for (i = 0; i < c->E; i++)
    {
      g_assert_cmpint (counts[i], ==, p->counts[i]);
      g_assert_cmpint (layer_counts[i], ==, p->counts[i]);
    }

  /* The losses: the layer's aux loss is the routing's. */
  if (p->aux == 0.0)   /* no coefficient, or no tokens: exactly 0 */
    gmlp_assert_same_value (gmlp_test_download_scalar (layer_aux), 0.0, "aux loss", 0);
  else
    g_assert_cmpfloat_with_epsilon (gmlp_test_download_scalar (layer_aux), p->aux, 1e-5 * fabs (p->aux));
  gmlp_assert_same_value (gmlp_test_download_scalar (layer_aux),
                          gmlp_test_download_scalar (gmlp_routing_get_aux_loss (routing)),
                          "aux loss of the routing", 0);
  if (p->z == 0.0)
    gmlp_assert_same_value (gmlp_test_download_scalar (gmlp_routing_get_z_loss (routing)), 0.0, "z loss", 0);
  else
    g_assert_cmpfloat_with_epsilon (gmlp_test_download_scalar (gmlp_routing_get_z_loss (routing)), p->z,
                                    1e-5 * fabs (p->z));
}

/* A forward and backward of the problem's layer (and backward_dw when it
 * delays), under an offload context when @offload. */
typedef struct {
  GmlpGroupedTensor *y, *dx;
} Step;

static void
step_clear (Step *s)
{
  g_clear_object (&s->y);
  g_clear_object (&s->dx);
}
G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (Step, step_clear)

static void
run_step (Problem      *p,
          GmlpDevice   *device,
          GmlpMoELayer *layer,
          gboolean      offload,
          Step         *out)
{
  g_autoptr(GmlpGroupedTensor) x = gmlp_test_upload_values (device, p->x, p->T, p->H, p->dtype);
  g_autoptr(GmlpGroupedTensor) dy = gmlp_test_upload_values (device, p->dy, p->T, p->H, p->dtype);
  g_autoptr(GmlpOffloadContext) oc = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GError) error = NULL;

  if (offload)
    {
      oc = gmlp_offload_context_new (device, &error);
      g_assert_no_error (error);
      gmlp_offload_context_push_thread_default (oc, TRUE);
    }
  out->y = gmlp_moe_layer_forward (layer, x, &saved, &error);
  g_assert_no_error (error);
  g_assert_nonnull (out->y);
  if (offload)
    {
      g_assert_true (gmlp_offload_context_pop_thread_default (oc, &error));
      g_assert_no_error (error);
      g_assert_true (gmlp_saved_activations_get_offload (saved));
      gmlp_offload_context_flush (oc);
    }
  g_assert_false (gmlp_saved_activations_is_consumed (saved));
  out->dx = gmlp_moe_layer_backward (layer, saved, dy, &error);
  g_assert_no_error (error);
  g_assert_nonnull (out->dx);
  g_assert_true (gmlp_saved_activations_is_consumed (saved));
}

/* A step's results against the reference: the routing, y, dx, and the
 * gradients unless the layer delays them or @check_grads is FALSE. */
static void
check_step (Problem      *p,
            GmlpMoELayer *layer,
            Step         *s,
            gboolean      check_grads,
            const char   *what)
{
  g_autofree double *y = NULL, *dx = NULL, *dwg = NULL;
  gsize n;

  assert_routing (p, layer, what);
  g_assert_cmpint (gmlp_grouped_tensor_get_dtype (s->y), ==, p->dtype);
  g_assert_cmpint (gmlp_grouped_tensor_get_n_groups (s->y), ==, 1);
  g_assert_cmpint (gmlp_grouped_tensor_get_total_rows (s->y), ==, p->T);
  g_assert_cmpint (gmlp_grouped_tensor_get_cols (s->y), ==, p->H);
  g_assert_cmpint (gmlp_grouped_tensor_get_dtype (s->dx), ==, p->dtype);
  g_assert_cmpint (gmlp_grouped_tensor_get_n_groups (s->dx), ==, 1);
  g_assert_cmpint (gmlp_grouped_tensor_get_total_rows (s->dx), ==, p->T);
  g_assert_cmpint (gmlp_grouped_tensor_get_cols (s->dx), ==, p->H);

  y = gmlp_test_download (s->y, &n);
  assert_close (y, p->y, n, tolerance (p->dtype), what, "y");
  dx = gmlp_test_download (s->dx, &n);
  assert_close (dx, p->dx, n, tolerance (p->dtype), what, "dx");
  if (!check_grads)
    return;

  assert_mlp_grads (gmlp_moe_layer_get_experts (layer), p->dexperts, p->dtype, NULL, what, "experts'");
  assert_empty_experts_zero (gmlp_moe_layer_get_experts (layer), p);
  if (p->shared != NULL)
    assert_mlp_grads (gmlp_moe_layer_get_shared_expert (layer), p->dshared, p->dtype, NULL, what, "shared");
  dwg = router_grad (gmlp_moe_layer_get_router (layer), &n);
  g_assert_cmpuint (n, ==, p->c->E * p->H);
  assert_close (dwg, p->dwg, n, router_tolerance (p->dtype), what, "router dW");
}

static void
run_and_check (Problem      *p,
               GmlpDevice   *device,
               GmlpMoELayer *layer,
               const char   *what)
{
  g_auto(Step) s = { NULL, };

  run_step (p, device, layer, FALSE, &s);
  check_step (p, layer, &s, TRUE, what);
}

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

/* Non-finite logits: every token gets k distinct experts in range, the
 * counts stay exact, and the step runs to its end. */
static void
test_non_finite (void)
{
  static const char *which[] = { "mixtral", "deepseek", "softmax-after-gelu", "capacity" };
  g_autoptr(GmlpDevice) device = layer_device_or_skip ();
  guint i;

  if (device == NULL)
    return;
  for (i = 0; i < G_N_ELEMENTS (which); i++)
    {
      const Config *c = config (which[i]);
      g_autoptr(Problem) p = problem_new (c, GMLP_DTYPE_FLOAT32, T_TOKENS);
      g_autoptr(GmlpMoELayer) layer = NULL;
      g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, y = NULL, dx = NULL, tokens = NULL;
      g_autoptr(GmlpSavedActivations) saved = NULL;
      g_autoptr(GmlpRouting) routing = NULL;
      g_autoptr(GError) error = NULL;
      g_autofree gint64 *idx = NULL, *counts = NULL;
      g_autofree gint64 *histogram = g_new0 (gint64, c->E);
      gsize n;
      gint64 t, h;
      guint j, q;

      /* Expert 1's gate row is NaN; tokens 0 to 3 have ±∞ or NaN in x;
       * token 4 is zero. */
      for (h = 0; h < p->H; h++)
        p->wg[1 * p->H + h] = NAN;
      p->x[0 * p->H + 1] = INFINITY;
      p->x[1 * p->H + 2] = -INFINITY;
      p->x[2 * p->H + 0] = NAN;
      p->x[3 * p->H + 0] = INFINITY, p->x[3 * p->H + 1] = -INFINITY;
      for (h = 0; h < p->H; h++)
        p->x[4 * p->H + h] = 0.0;
      layer = problem_layer (p, device, GMLP_LINEAR_NONE);
      x = gmlp_test_upload_values (device, p->x, p->T, p->H, GMLP_DTYPE_FLOAT32);
      dy = gmlp_test_upload_values (device, p->dy, p->T, p->H, GMLP_DTYPE_FLOAT32);
      y = gmlp_moe_layer_forward (layer, x, &saved, &error);
      g_assert_no_error (error);
      g_assert_cmpint (gmlp_grouped_tensor_get_total_rows (y), ==, p->T);

      routing = gmlp_moe_layer_get_routing (layer);
      idx = gmlp_test_download_i64 (gmlp_routing_get_indices (routing), &n);
      g_assert_cmpuint (n, ==, (gsize) p->T * c->k);
      for (t = 0; t < p->T; t++)
        for (j = 0; j < c->k; j++)
          {
            gint64 e = idx[t * c->k + j];

            g_assert_cmpint (e, >=, 0);
            g_assert_cmpint (e, <, c->E);
            for (q = 0; q < j; q++)
              g_assert_cmpint (idx[t * c->k + q], !=, e);
            histogram[e]++;
          }
      tokens = gmlp_moe_layer_get_tokens_per_expert (layer);
      counts = gmlp_test_download_i64 (tokens, &n);
      for (j = 0; j < c->E; j++)
        g_assert_cmpint (counts[j], ==, histogram[j]);

      dx = gmlp_moe_layer_backward (layer, saved, dy, &error);
      g_assert_no_error (error);
      g_assert_cmpint (gmlp_grouped_tensor_get_total_rows (dx), ==, p->T);
    }
}

/* A layer made by g_object_new() with these properties reports @code from
 * init and from every method (EITHER: INVALID_ARGUMENT or UNSUPPORTED). */
#define EITHER -1

static void
assert_code (const GError *error,
             int           code)
{
  g_assert_nonnull (error);
  if (code == EITHER)
    g_assert_true (g_error_matches (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT) ||
                   g_error_matches (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED));
  else
    g_assert_error (error, GMLP_ERROR, code);
}

static void
assert_construct_error (GmlpDevice *device,
                        int         code,
                        const char *first_property,
                        ...)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpMoELayer) made = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, y = NULL;
  GObject *object;
  va_list args;
  gint64 rows = 2;

  va_start (args, first_property);
  object = g_object_new_valist (GMLP_TYPE_MOE_LAYER, first_property, args);
  va_end (args);
  made = GMLP_MOE_LAYER (object);
  g_assert_false (g_initable_init (G_INITABLE (made), NULL, &error));
  assert_code (error, code);
  g_test_message ("refused: %s", error->message);
  g_clear_error (&error);

  /* Every method reports it; the getters give nothing. */
  g_assert_null (gmlp_moe_layer_get_router (made));
  g_assert_null (gmlp_moe_layer_get_experts (made));
  g_assert_null (gmlp_moe_layer_get_shared_expert (made));
  x = gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, &rows, 1, 16, &error);
  g_assert_no_error (error);
  y = gmlp_moe_layer_forward (made, x, NULL, &error);
  g_assert_null (y);
  assert_code (error, code);
  g_clear_error (&error);
  g_assert_false (gmlp_moe_layer_init_parameters (made, 1, &error));
  assert_code (error, code);
  g_clear_error (&error);
  g_assert_false (gmlp_moe_layer_backward_dw (made, &error));
  assert_code (error, code);
}

#define BASE "device", device, "hidden", (gint64) 16, "ffn-hidden", (gint64) 8
#define E8K2 "n-experts", 8, "top-k", 2
#define INVALID GMLP_ERROR_INVALID_ARGUMENT

static void
test_bad_construction (void)
{
  g_autoptr(GmlpDevice) device = layer_device_or_skip ();
  g_autoptr(GmlpMoELayer) layer = NULL;
  g_autoptr(GError) error = NULL;

  if (device == NULL)
    return;
  /* Sizes. */
  assert_construct_error (device, INVALID, "device", device, "hidden", (gint64) 0, "ffn-hidden", (gint64) 8,
                          "n-experts", 8, "top-k", 2, NULL);
  assert_construct_error (device, INVALID, "device", device, "hidden", (gint64) -16, "ffn-hidden", (gint64) 8,
                          "n-experts", 8, "top-k", 2, NULL);
  assert_construct_error (device, INVALID, "device", device, "hidden", (gint64) 16, "ffn-hidden", (gint64) 0,
                          "n-experts", 8, "top-k", 2, NULL);
  assert_construct_error (device, INVALID, "device", device, "hidden", (gint64) 16, "ffn-hidden", G_MININT64,
                          "n-experts", 8, "top-k", 2, NULL);
  assert_construct_error (device, INVALID, BASE, "n-experts", 0, "top-k", 1, NULL);
  assert_construct_error (device, INVALID, BASE, E8K2, "shared-expert-ffn-hidden", (gint64) -1, NULL);
  /* k = 0, k > n_experts, k past 16. */
  assert_construct_error (device, INVALID, BASE, "n-experts", 8, "top-k", 0, NULL);
  assert_construct_error (device, INVALID, BASE, "n-experts", 4, "top-k", 5, NULL);
  assert_construct_error (device, INVALID, BASE, "n-experts", 32, "top-k", 17, NULL);
  /* Groups: topk_groups > n_groups, n_experts not divisible, none kept,
   * fewer candidates than k. */
  assert_construct_error (device, INVALID, BASE, E8K2, "n-expert-groups", 4, "topk-groups", 5, NULL);
  assert_construct_error (device, INVALID, BASE, "n-experts", 10, "top-k", 2, "n-expert-groups", 4,
                          "topk-groups", 2, NULL);
  assert_construct_error (device, INVALID, BASE, E8K2, "n-expert-groups", 4, "topk-groups", 0, NULL);
  assert_construct_error (device, INVALID, BASE, "n-experts", 8, "top-k", 3, "n-expert-groups", 4,
                          "topk-groups", 1, NULL);
  /* Capacity factors below 0 or infinite (GObject itself refuses a NaN for
   * a double property); paddings that are not a power of two up to 128. */
  assert_construct_error (device, INVALID, BASE, E8K2, "capacity-factor", -0.5, NULL);
  assert_construct_error (device, INVALID, BASE, E8K2, "capacity-factor", -INFINITY, NULL);
  assert_construct_error (device, INVALID, BASE, E8K2, "capacity-factor", INFINITY, NULL);
  assert_construct_error (device, INVALID, BASE, E8K2, "padding", 3, NULL);
  assert_construct_error (device, INVALID, BASE, E8K2, "padding", 256, NULL);
  /* The router's other options. */
  assert_construct_error (device, INVALID, BASE, E8K2, "scaling-factor", -1.0, NULL);
  assert_construct_error (device, INVALID, BASE, E8K2, "aux-loss-coeff", -1.0, NULL);
  assert_construct_error (device, INVALID, BASE, E8K2, "z-loss-coeff", INFINITY, NULL);
  /* dtypes the experts don't take (GroupedLinear says UNSUPPORTED). */
  assert_construct_error (device, EITHER, BASE, E8K2, "dtype", GMLP_DTYPE_INT64, NULL);
  assert_construct_error (device, EITHER, BASE, E8K2, "dtype", GMLP_DTYPE_FLOAT8_E4M3, NULL);

  /* The edges that are fine: k = n_experts = 16, capacity 0 (dropless),
   * padding 1 and 128, groups, the layers' flags (the router takes only
   * its own). */
  layer = g_initable_new (GMLP_TYPE_MOE_LAYER, NULL, &error, BASE, "n-experts", 16, "top-k", 16, NULL);
  g_assert_no_error (error);
  g_clear_object (&layer);
  layer = g_initable_new (GMLP_TYPE_MOE_LAYER, NULL, &error, BASE, "n-experts", 8, "top-k", 2,
                          "capacity-factor", 0.0, "padding", 1, NULL);
  g_assert_no_error (error);
  g_clear_object (&layer);
  layer = g_initable_new (GMLP_TYPE_MOE_LAYER, NULL, &error, BASE, "n-experts", 8, "top-k", 8,
                          "padding", 128, "n-expert-groups", 1, "topk-groups", 1, NULL);
  g_assert_no_error (error);
  g_clear_object (&layer);
  layer = g_initable_new (GMLP_TYPE_MOE_LAYER, NULL, &error, BASE, "n-experts", 8, "top-k", 2,
                          "flags", GMLP_LINEAR_BIAS | GMLP_LINEAR_RECOMPUTE_ACTIVATION |
                          GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_DELAY_WGRAD_COMPUTE |
                          GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION, NULL);
  g_assert_no_error (error);
  g_assert_cmpint (gmlp_router_get_flags (gmlp_moe_layer_get_router (layer)), ==,
                   GMLP_LINEAR_DELAY_WGRAD_COMPUTE | GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION);
}

/* Calls that are refused write nothing: the last forward's routing stays,
 * the saved activations stay usable, the gradients as they were. */
static void
test_bad_calls (void)
{
  Config c = *config ("deepseek");
  g_autoptr(GmlpDevice) device = layer_device_or_skip ();
  g_autoptr(Problem) p = NULL;
  g_autoptr(GmlpMoELayer) layer = NULL, other = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, dy2 = NULL, y = NULL, dx = NULL, other_y = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL, other_saved = NULL;
  g_autoptr(GPtrArray) before = NULL, after = NULL;
  g_autoptr(GError) error = NULL;
  g_auto(Step) first = { NULL, };
  g_autoptr(GmlpRouting) routing = NULL;
  gint64 two[2] = { 3, 4 }, rows;

  if (device == NULL)
    return;
  c.flags = GMLP_LINEAR_BIAS | GMLP_LINEAR_SINGLE_GROUPED_WEIGHT;
  p = problem_new (&c, GMLP_DTYPE_FLOAT32, T_TOKENS);
  layer = problem_layer (p, device, GMLP_LINEAR_NONE);
  x = gmlp_test_upload_values (device, p->x, p->T, p->H, p->dtype);
  dy = gmlp_test_upload_values (device, p->dy, p->T, p->H, p->dtype);
  /* A first step, so that there are gradients to keep; the refused calls
   * get another dy, so that a part that ran would change them. */
  run_step (p, device, layer, FALSE, &first);
  {
    g_autofree double *dy2_values = gmlp_test_normals (p->T * p->H, 1.0, p->dtype);

    dy2 = gmlp_test_upload_values (device, dy2_values, p->T, p->H, p->dtype);
  }
  check_step (p, layer, &first, TRUE, "before the bad calls");
  before = gmlp_test_moe_gradient_bytes (layer);
  routing = gmlp_moe_layer_get_routing (layer);

  /* Forward: the width (hidden), groups, dtypes, device sizes. */
  {
    g_autoptr(GmlpGroupedTensor) narrow = gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, two + 1, 1, p->H - 1,
                                                                   &error);
    g_autoptr(GmlpGroupedTensor) wide = gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, two + 1, 1, p->H + 1,
                                                                 &error);
    g_autoptr(GmlpGroupedTensor) grouped = gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, two, 2, p->H, &error);
    g_autoptr(GmlpGroupedTensor) bf16 = gmlp_grouped_tensor_new (device, GMLP_DTYPE_BFLOAT16, two, 1, p->H, &error);
    g_autoptr(GmlpGroupedTensor) ints = gmlp_grouped_tensor_new (device, GMLP_DTYPE_INT64, two, 1, p->H, &error);
    g_autoptr(GmlpGroupedTensor) sizes = NULL, device_sized = NULL;
    struct { GmlpGroupedTensor *x; int code; } bad[] = {
      { narrow, GMLP_ERROR_SHAPE_MISMATCH },
      { wide, GMLP_ERROR_SHAPE_MISMATCH },
      { grouped, GMLP_ERROR_SHAPE_MISMATCH },
      { bf16, GMLP_ERROR_DTYPE_MISMATCH },
      { ints, GMLP_ERROR_DTYPE_MISMATCH },
      { NULL, -1 },   /* device sizes: refused, whatever the code */
    };
    guint i;

    g_assert_no_error (error);
    rows = 7;
    sizes = gmlp_test_sizes_tensor (device, &rows, 1);
    device_sized = gmlp_grouped_tensor_new_with_device_sizes (device, GMLP_DTYPE_FLOAT32, sizes, 8, p->H, &error);
    g_assert_no_error (error);
    bad[5].x = device_sized;
    for (i = 0; i < G_N_ELEMENTS (bad); i++)
      {
        g_autoptr(GmlpSavedActivations) none = NULL;
        g_autoptr(GmlpGroupedTensor) out = gmlp_moe_layer_forward (layer, bad[i].x, &none, &error);
        g_autoptr(GmlpRouting) last = NULL;

        g_assert_null (out);
        g_assert_null (none);
        g_assert_nonnull (error);
        if (bad[i].code >= 0)
          g_assert_error (error, GMLP_ERROR, bad[i].code);
        else
          g_assert_true (error->domain == GMLP_ERROR);
        g_test_message ("forward refused: %s", error->message);
        g_clear_error (&error);
        last = gmlp_moe_layer_get_routing (layer);
        g_assert_true (last == routing);
      }
  }

  /* Backward: dy's rows, width, groups and dtype; another layer's
   * activations. */
  y = gmlp_moe_layer_forward (layer, x, &saved, &error);
  g_assert_no_error (error);
  other = problem_layer (p, device, GMLP_LINEAR_NONE);
  other_y = gmlp_moe_layer_forward (other, x, &other_saved, &error);
  g_assert_no_error (error);
  {
    g_autoptr(GmlpGroupedTensor) short_dy = gmlp_test_upload_values (device, p->dy, p->T - 1, p->H, p->dtype);
    g_autoptr(GmlpGroupedTensor) long_dy = gmlp_grouped_tensor_new (device, p->dtype, (gint64[]) { p->T + 1 }, 1,
                                                                    p->H, &error);
    g_autoptr(GmlpGroupedTensor) narrow_dy = gmlp_test_upload_values (device, p->dy, p->T, p->H - 1, p->dtype);
    g_autoptr(GmlpGroupedTensor) grouped_dy = gmlp_grouped_tensor_new (device, p->dtype,
                                                                       (gint64[]) { 10, p->T - 10 }, 2, p->H,
                                                                       &error);
    g_autoptr(GmlpGroupedTensor) half_dy = gmlp_test_upload_values (device, p->dy, p->T, p->H, GMLP_DTYPE_BFLOAT16);
    struct { GmlpSavedActivations *saved; GmlpGroupedTensor *dy; int code; } bad[] = {
      { saved, short_dy, GMLP_ERROR_SHAPE_MISMATCH },
      { saved, long_dy, GMLP_ERROR_SHAPE_MISMATCH },
      { saved, narrow_dy, GMLP_ERROR_SHAPE_MISMATCH },
      { saved, grouped_dy, GMLP_ERROR_SHAPE_MISMATCH },
      { saved, half_dy, GMLP_ERROR_DTYPE_MISMATCH },
      { other_saved, dy2, GMLP_ERROR_INVALID_ARGUMENT },
    };
    guint i;

    g_assert_no_error (error);
    for (i = 0; i < G_N_ELEMENTS (bad); i++)
      {
        g_autoptr(GmlpGroupedTensor) out = gmlp_moe_layer_backward (layer, bad[i].saved, bad[i].dy, &error);

        g_assert_null (out);
        g_assert_error (error, GMLP_ERROR, bad[i].code);
        g_test_message ("backward refused: %s", error->message);
        g_clear_error (&error);
      }
  }
  g_assert_false (gmlp_saved_activations_is_consumed (saved));
  g_assert_false (gmlp_saved_activations_is_consumed (other_saved));
  after = gmlp_test_moe_gradient_bytes (layer);
  gmlp_test_assert_same_bytes_array (before, after, "gradients after refused calls");

  /* Still usable; once used, refused. */
  dx = gmlp_moe_layer_backward (layer, saved, dy, &error);
  g_assert_no_error (error);
  {
    g_auto(Step) s = { g_steal_pointer (&y), g_steal_pointer (&dx) };

    check_step (p, layer, &s, TRUE, "after the refused calls");
  }
  g_clear_pointer (&before, g_ptr_array_unref);
  before = gmlp_test_moe_gradient_bytes (layer);
  g_assert_null (gmlp_moe_layer_backward (layer, saved, dy2, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
  g_test_message ("second backward refused: %s", error->message);
  g_clear_error (&error);
  g_clear_pointer (&after, g_ptr_array_unref);
  after = gmlp_test_moe_gradient_bytes (layer);
  gmlp_test_assert_same_bytes_array (before, after, "gradients after a second backward");
}

/* What the forward read, written between forward and backward: the input,
 * the gate weight, an expert's weight, the shared expert's weight. The
 * backward refuses before it writes anything, whichever part of the layer
 * would have found it. */
static void
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
static void
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
static void
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
static void
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
static void
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
static void
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
