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
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <locale.h>
#include <math.h>
#include <string.h>

#include "gmlp-test-util.h"
#include "gmlp-grouped-tensor-private.h"
#include "gmlp-router-private.h"
#include "gmlp-saved-activations-private.h"

#define T_TOKENS   24
#define HIDDEN     12
#define MARGIN     1e-4
#define RENORM_EPS 1e-20

typedef struct {
  const char        *name;
  GmlpScoreFunction  score;
  gboolean           before;      /* softmax-before-topk */
  gboolean           renorm;
  double             scale;
  guint              E, k;
  guint              groups, topk_groups;
  gboolean           bias;
  double             aux, z;
} Config;

#define SOFTMAX GMLP_SCORE_FUNCTION_SOFTMAX
#define SIGMOID GMLP_SCORE_FUNCTION_SIGMOID

static const Config configs[] = {
  { "default", SOFTMAX, TRUE, TRUE, 1.0, 8, 2, 0, 0, FALSE, 0.0, 0.0 },
  { "softmax-after", SOFTMAX, FALSE, TRUE, 1.0, 8, 3, 0, 0, FALSE, 0.0, 0.0 },
  /* The softmax of the chosen logits sums to 1 already: without
   * renormalize too. */
  { "softmax-after-raw", SOFTMAX, FALSE, FALSE, 0.5, 8, 3, 0, 0, FALSE, 0.0, 0.0 },
  { "softmax-raw-scaled", SOFTMAX, TRUE, FALSE, 2.5, 16, 4, 0, 0, FALSE, 0.0, 0.0 },
  { "top1", SOFTMAX, TRUE, TRUE, 1.0, 4, 1, 0, 0, FALSE, 0.0, 0.0 },
  { "top16-all", SOFTMAX, TRUE, TRUE, 1.0, 16, 16, 0, 0, FALSE, 0.0, 0.0 },
  { "sigmoid-top16-of-64", SIGMOID, TRUE, TRUE, 1.0, 64, 16, 0, 0, FALSE, 0.0, 0.0 },
  { "sigmoid-raw", SIGMOID, TRUE, FALSE, 1.0, 8, 3, 0, 0, FALSE, 0.0, 0.0 },
  { "sigmoid-deepseek", SIGMOID, TRUE, TRUE, 2.5, 16, 4, 4, 2, TRUE, 0.01, 0.001 },
  { "softmax-groups-bias", SOFTMAX, TRUE, TRUE, 1.0, 12, 3, 3, 2, TRUE, 0.0, 0.0 },
  { "softmax-after-groups-bias", SOFTMAX, FALSE, TRUE, 1.0, 8, 2, 8, 4, TRUE, 0.02, 0.01 },
  { "aux-z", SOFTMAX, TRUE, TRUE, 1.0, 8, 2, 0, 0, FALSE, 0.05, 0.01 },
  { "sigmoid-aux-z", SIGMOID, TRUE, FALSE, 1.0, 8, 2, 2, 1, FALSE, 0.1, 0.02 },
  { "softmax-after-aux", SOFTMAX, FALSE, TRUE, 1.5, 6, 2, 0, 0, FALSE, 0.05, 0.0 },
};

/* Where the CUDA kernels take other paths (impls/router.cuh): more than
 * 1024 experts (a block per token; its groups of 128 scored by a warp
 * each, or 256 groups of 5 by a thread each with 100 kept), groups of 64
 * (a warp per group in a warp's token), more than 16 groups kept. Fewer
 * tokens: the references cost E² per token. */
static const Config wide_configs[] = {
  { "wide-softmax-after-groups", SOFTMAX, FALSE, TRUE, 1.0, 1280, 8, 10, 3, TRUE, 0.01, 0.001 },
  { "wide-sigmoid-top16", SIGMOID, TRUE, TRUE, 2.0, 1088, 16, 0, 0, FALSE, 0.0, 0.01 },
  { "wide-many-groups", SIGMOID, TRUE, FALSE, 1.0, 1280, 4, 256, 100, TRUE, 0.0, 0.0 },
  { "groups-of-64", SOFTMAX, TRUE, TRUE, 1.0, 256, 4, 4, 2, FALSE, 0.02, 0.0 },
  { "many-groups", SIGMOID, TRUE, TRUE, 1.0, 64, 6, 32, 20, TRUE, 0.01, 0.0 },
};

#define WIDE_TOKENS 6

static const Config *
config (const char *name)
{
  guint i;

  for (i = 0; i < G_N_ELEMENTS (configs); i++)
    if (g_str_equal (configs[i].name, name))
      return &configs[i];
  g_assert_not_reached ();
}

static const GmlpDType x_dtypes[] = { GMLP_DTYPE_FLOAT32, GMLP_DTYPE_FLOAT16, GMLP_DTYPE_BFLOAT16 };

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

/* One token: its scores, softmax and logsumexp. */
typedef struct {
  double *s, *sm, *v;
  double  lse;
} Token;

static Token *
token_new (guint E)
{
  Token *t = g_new0 (Token, 1);

  t->s = g_new (double, E);
  t->sm = g_new (double, E);
  t->v = g_new (double, E);
  return t;
}

static void
token_free (Token *t)
{
  g_free (t->s);
  g_free (t->sm);
  g_free (t->v);
  g_free (t);
}
G_DEFINE_AUTOPTR_CLEANUP_FUNC (Token, token_free)

static void
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
static void
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

/* d(token loss) / d(logits) by central differences. */
static void
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
      double h = 1e-6 * MAX (1.0, fabs (l[j])), up, down;

      lp[j] = l[j] + h;
      up = ref_token_loss (c, lp, idx, gp, f, n_tokens, t);
      lp[j] = l[j] - h;
      down = ref_token_loss (c, lp, idx, gp, f, n_tokens, t);
      lp[j] = l[j];
      grad[j] = (up - down) / (2.0 * h);
    }
}

/* A problem: a router's configuration and fresh data, as stored. */
typedef struct {
  const Config *c;
  GmlpDType     dtype;
  gint64        T, H;
  double       *x;       /* T × H */
  double       *w;       /* E × H */
  double       *bias;    /* E, or NULL */
  double       *logits;  /* T × E */
  gint64       *idx;     /* T × k, the reference's choices */
  double       *probs;   /* T × k */
  double       *counts;  /* E */
  double        aux, z;
} Problem;

static void
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
G_DEFINE_AUTOPTR_CLEANUP_FUNC (Problem, problem_free)

static void
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
static double
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
static double
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

static double
random_value (double    scale,
              GmlpDType dtype)
{
  /* Box-Muller: normal values. */
  double u = g_test_rand_double_range (1e-12, 1.0), v = g_test_rand_double ();

  return gmlp_test_round (scale * sqrt (-2.0 * log (u)) * cos (2.0 * G_PI * v), dtype);
}

/* The selection values of a bias: about the spread of the values. */
static double
bias_scale (const Config *c)
{
  if (c->score == SIGMOID)
    return 0.2;
  return c->before ? 0.5 / c->E : 0.5;
}

/* Fresh data: W and the bias at random (or those of @like), then each
 * token's x redrawn until its choices are clear by MARGIN. */
static Problem *
problem_new_sized (const Config  *c,
                   GmlpDType      dtype,
                   gint64         n_tokens,
                   gint64         hidden,
                   const Problem *like)
{
  Problem *p = g_new0 (Problem, 1);
  g_autofree double *l = g_new (double, c->E);
  g_autoptr(Token) tok = token_new (c->E);
  gint64 t, h, tries;
  guint e;

  p->c = c;
  p->dtype = dtype;
  p->T = n_tokens;
  p->H = hidden;
  p->x = g_new (double, MAX (p->T * p->H, 1));
  p->w = g_new (double, c->E * p->H);
  for (e = 0; e < c->E * p->H; e++)
    p->w[e] = like != NULL ? like->w[e] : random_value (1.0 / sqrt ((double) p->H), GMLP_DTYPE_FLOAT32);
  if (c->bias)
    {
      p->bias = g_new (double, c->E);
      for (e = 0; e < c->E; e++)
        p->bias[e] = like != NULL ? like->bias[e] : random_value (bias_scale (c), GMLP_DTYPE_FLOAT32);
    }

  for (t = 0; t < p->T; t++)
    for (tries = 0;; tries++)
      {
        gint64 idx[16];
        double margin;

        g_assert_cmpint (tries, <, 10000);
        for (h = 0; h < p->H; h++)
          p->x[t * p->H + h] = random_value (1.0, dtype);
        logits_of (p, p->x, p->w, t, l);
        ref_scores (c, l, p->bias, tok);
        ref_select (c, tok->v, idx, &margin);
        if (margin >= MARGIN)
          break;
      }

  p->logits = g_new (double, MAX (p->T * c->E, 1));
  for (t = 0; t < p->T; t++)
    logits_of (p, p->x, p->w, t, p->logits + t * c->E);
  p->idx = g_new (gint64, MAX (p->T * c->k, 1));
  p->probs = g_new (double, MAX (p->T * c->k, 1));
  p->counts = g_new (double, c->E);
  ref_forward (p, p->x, p->w, p->idx, p->probs, p->counts, &p->aux, &p->z);
  return p;
}

static Problem *
problem_new_like (const Config  *c,
                  GmlpDType      dtype,
                  gint64         n_tokens,
                  const Problem *like)
{
  return problem_new_sized (c, dtype, n_tokens, HIDDEN, like);
}

static Problem *
problem_new (const Config *c,
             GmlpDType     dtype,
             gint64        n_tokens)
{
  return problem_new_like (c, dtype, n_tokens, NULL);
}

/* Library side */

static GmlpRouter *
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
static GmlpRouter *
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
static void
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
static void
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

static void
ref_backward (Problem      *p,
              const double *gp,
              double       *dx,
              double       *dw)
{
  g_autofree double *dl = g_new (double, MAX (p->T * p->c->E, 1));

  ref_backward_full (p, gp, dl, dx, dw);
}

static double *
random_grad (gsize n)
{
  double *gp = g_new (double, MAX (n, 1));
  gsize i;

  for (i = 0; i < n; i++)
    gp[i] = random_value (1.0, GMLP_DTYPE_FLOAT32);
  return gp;
}

static double
dx_tolerance (GmlpDType dtype)
{
  return dtype == GMLP_DTYPE_FLOAT32 ? 1e-4 : 2.0 * gmlp_test_tolerance (dtype);
}

/* One forward and backward of a problem's router; checks the routing and
 * the gradients (dx always; dW from wgrad unless the router fuses or
 * delays). */
static void
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
 * the float64 value plus 1e-6 of the size of its terms: one rounding of an
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

/* dx (T × H, as stored) against base + the reference, value by value. */
static void
assert_dx_one_rounding (const Problem *p,
                        const double  *got,
                        const double  *base,
                        const double  *dl,
                        const double  *dx_ref,
                        const char    *what)
{
  gint64 t, h;
  guint e;

  for (t = 0; t < p->T; t++)
    for (h = 0; h < p->H; h++)
      {
        gint64 i = t * p->H + h;
        double want = (base != NULL ? base[i] : 0.0) + dx_ref[i], terms = 0.0;

        for (e = 0; e < p->c->E; e++)
          terms += fabs (dl[t * p->c->E + e] * p->w[e * p->H + h]);
        if (!(fabs (got[i] - want) <= ldexp (fabs (want), -8) + 1e-6 * terms + 1e-30))
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
        g_autofree double *m0 = NULL, *base = NULL, *got = NULL;
        g_autoptr(GmlpGroupedTensor) x = gmlp_test_upload_values (device, p->x, p->T, p->H, p->dtype);
        g_autoptr(GmlpGroupedTensor) grad = gmlp_test_upload_values (device, gp, p->T, c->k, GMLP_DTYPE_FLOAT32);
        g_autoptr(GmlpGroupedTensor) main_grad = NULL, into = NULL, dx = NULL;
        g_autoptr(GmlpSavedActivations) saved = NULL;
        g_autoptr(GmlpRouting) routing = NULL;
        g_autoptr(GError) error = NULL;
        g_autofree char *what = g_strdup_printf ("%s, hidden %" G_GINT64_FORMAT ", %s", c->name, p->H,
                                                 pass == 0 ? "wgrad" : pass == 1 ? "main_grad, into" :
                                                 "main_grad, delayed");

        ref_backward_full (p, gp, dl, dx_ref, dw_ref);
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
          g_clear_pointer (&got, g_free);
        }

        if (pass == 1)
          {
            /* Not into the input, which the weight gradient reads after:
             * refused before anything is written. */
            g_assert_null (gmlp_router_backward_into (router, saved, grad, x, &error));
            g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
            g_clear_error (&error);
            base = gmlp_test_normals (n_x, 0.1, GMLP_DTYPE_BFLOAT16);
            into = gmlp_test_upload_values (device, base, p->T, p->H, GMLP_DTYPE_BFLOAT16);
            dx = gmlp_router_backward_into (router, saved, grad, into, &error);
            g_assert_true (dx == into);
          }
        else
          {
            dx = gmlp_router_backward (router, saved, grad, &error);
          }
        g_assert_no_error (error);
        g_assert_cmpint (gmlp_grouped_tensor_get_dtype (dx), ==, GMLP_DTYPE_BFLOAT16);
        got = gmlp_test_download (dx, &n);
        g_assert_cmpuint (n, ==, n_x);
        assert_dx_one_rounding (p, got, base, dl, dx_ref, what);
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
      g_autoptr(Token) tok = token_new (c->E);
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
            logits_of (p, p->x, p->w, t, l);
            ref_scores (c, l, NULL, tok);
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
        logits_of (p, p->x, p->w, t, p->logits + t * c->E);
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

/* Aux-loss-free balancing: the bias chooses, the unbiased scores weigh;
 * update_expert_bias moves it by the documented rule. */
static void
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
static void
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
static void
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

static void
assert_construct_error (GmlpDevice *device,
                        const char *first_property,
                        ...)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpRouter) made = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL;
  g_autoptr(GmlpRouting) routing = NULL;
  GObject *object;
  va_list args;
  gint64 rows = 2;

  va_start (args, first_property);
  object = g_object_new_valist (GMLP_TYPE_ROUTER, first_property, args);
  va_end (args);
  made = GMLP_ROUTER (object);
  g_assert_false (g_initable_init (G_INITABLE (made), NULL, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_test_message ("refused: %s", error->message);
  g_clear_error (&error);

  /* Every method reports it; the getters give nothing. */
  g_assert_null (gmlp_router_get_weight (made));
  g_assert_null (gmlp_router_get_expert_bias (made));
  x = gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, &rows, 1, 16, &error);
  g_assert_no_error (error);
  routing = gmlp_router_forward (made, x, NULL, &error);
  g_assert_null (routing);
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);
  g_assert_false (gmlp_router_update_expert_bias (made, x, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
}

#define BASE "device", device, "hidden", (gint64) 16

static void
test_bad_construction (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpRouter) router = NULL;

  if (device == NULL)
    return;
  assert_construct_error (device, "device", device, "hidden", (gint64) 0, "n-experts", 8, "top-k", 2, NULL);
  assert_construct_error (device, "device", device, "hidden", (gint64) -1, "n-experts", 8, "top-k", 2, NULL);
  assert_construct_error (device, "device", device, "hidden", (gint64) G_MAXINT32 + 1, "n-experts", 8, "top-k", 2, NULL);
  assert_construct_error (device, BASE, "n-experts", 0, "top-k", 1, NULL);
  assert_construct_error (device, BASE, "n-experts", 65536, "top-k", 2, NULL);
  assert_construct_error (device, BASE, "n-experts", 8, "top-k", 0, NULL);
  assert_construct_error (device, BASE, "n-experts", 32, "top-k", 17, NULL);
  assert_construct_error (device, BASE, "n-experts", 4, "top-k", 5, NULL);
  assert_construct_error (device, BASE, "n-experts", 8, "top-k", 2, "n-expert-groups", 4, "topk-groups", 5, NULL);
  assert_construct_error (device, BASE, "n-experts", 8, "top-k", 2, "topk-groups", 1, NULL);
  assert_construct_error (device, BASE, "n-experts", 10, "top-k", 2, "n-expert-groups", 4, "topk-groups", 2, NULL);
  assert_construct_error (device, BASE, "n-experts", 8, "top-k", 3, "n-expert-groups", 4, "topk-groups", 1, NULL);
  assert_construct_error (device, BASE, "n-experts", 8, "top-k", 2, "n-expert-groups", 4, "topk-groups", 0, NULL);
  assert_construct_error (device, BASE, "n-experts", 8, "top-k", 2, "flags", GMLP_LINEAR_BIAS, NULL);
  assert_construct_error (device, BASE, "n-experts", 8, "top-k", 2, "flags", GMLP_LINEAR_RECOMPUTE_ACTIVATION, NULL);
  assert_construct_error (device, BASE, "n-experts", 8, "top-k", 2, "scaling-factor", -1.0, NULL);
  assert_construct_error (device, BASE, "n-experts", 8, "top-k", 2, "scaling-factor", INFINITY, NULL);
  assert_construct_error (device, BASE, "n-experts", 8, "top-k", 2, "aux-loss-coeff", -0.5, NULL);
  assert_construct_error (device, BASE, "n-experts", 8, "top-k", 2, "z-loss-coeff", 1e300, NULL);
  assert_construct_error (device, BASE, "n-experts", 8, "top-k", 2, "bias-update-rate", -INFINITY, NULL);

  /* The edges that are fine: k = 16 = E; groups of one expert; one group. */
  router = g_initable_new (GMLP_TYPE_ROUTER, NULL, &error, BASE, "n-experts", 16, "top-k", 16, NULL);
  g_assert_no_error (error);
  g_clear_object (&router);
  router = g_initable_new (GMLP_TYPE_ROUTER, NULL, &error, BASE, "n-experts", 8, "top-k", 4,
                           "n-expert-groups", 8, "topk-groups", 4, NULL);
  g_assert_no_error (error);
  g_clear_object (&router);
  router = g_initable_new (GMLP_TYPE_ROUTER, NULL, &error, BASE, "n-experts", 8, "top-k", 8,
                           "n-expert-groups", 1, "topk-groups", 1, NULL);
  g_assert_no_error (error);
}

/* Calls that are refused write nothing: the saved activations stay
 * usable, the gradients as they were. */
static void
test_bad_calls (void)
{
  const Config *c = config ("aux-z");
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(Problem) p = NULL;
  g_autoptr(GmlpRouter) router = NULL, other = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, grad = NULL, dx = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL, other_saved = NULL;
  g_autoptr(GmlpRouting) routing = NULL, other_routing = NULL;
  g_autoptr(GBytes) wgrad_before = NULL, wgrad_after = NULL;
  g_autofree double *gp = NULL;
  g_autoptr(GError) error = NULL;
  gint64 two[2] = { 3, 4 }, rows;
  guint d;

  if (device == NULL)
    return;
  p = problem_new (c, GMLP_DTYPE_FLOAT32, T_TOKENS);
  router = problem_router (p, device, GMLP_LINEAR_NONE);
  gp = random_grad ((gsize) p->T * c->k);
  x = gmlp_test_upload_values (device, p->x, p->T, p->H, GMLP_DTYPE_FLOAT32);
  grad = gmlp_test_upload_values (device, gp, p->T, c->k, GMLP_DTYPE_FLOAT32);
  /* A first step, so that there is a wgrad to keep. */
  run_and_check (p, device, router, gp, NULL, "before the bad calls");
  wgrad_before = gmlp_grouped_tensor_to_bytes (gmlp_router_get_wgrad (router), &error);
  g_assert_no_error (error);

  /* Forward: width, groups, dtype, device sizes. */
  {
    g_autoptr(GmlpGroupedTensor) narrow = gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, two + 1, 1, p->H - 1, &error);
    g_autoptr(GmlpGroupedTensor) grouped = gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, two, 2, p->H, &error);
    g_autoptr(GmlpGroupedTensor) ints = gmlp_grouped_tensor_new (device, GMLP_DTYPE_INT64, two, 1, p->H, &error);
    g_autoptr(GmlpGroupedTensor) fp8 = gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT8_E4M3, two, 1, p->H, &error);
    g_autoptr(GmlpGroupedTensor) sizes = NULL, device_sized = NULL;
    g_autoptr(GBytes) seven = g_bytes_new (two + 1, sizeof (gint64));
    struct { GmlpGroupedTensor *x; int code; } bad[] = {
      { narrow, GMLP_ERROR_SHAPE_MISMATCH },
      { grouped, GMLP_ERROR_SHAPE_MISMATCH },
      { ints, GMLP_ERROR_DTYPE_MISMATCH },
      { fp8, GMLP_ERROR_DTYPE_MISMATCH },
      { NULL, GMLP_ERROR_INVALID_ARGUMENT },
    };
    guint i;

    rows = 1;
    sizes = gmlp_grouped_tensor_new_from_bytes (device, GMLP_DTYPE_INT64, &rows, 1, 1, seven, &error);
    g_assert_no_error (error);
    device_sized = gmlp_grouped_tensor_new_with_device_sizes (device, GMLP_DTYPE_FLOAT32, sizes, 8, p->H, &error);
    g_assert_no_error (error);
    bad[4].x = device_sized;
    for (i = 0; i < G_N_ELEMENTS (bad); i++)
      {
        g_autoptr(GmlpSavedActivations) none = NULL;
        g_autoptr(GmlpRouting) r = gmlp_router_forward (router, bad[i].x, &none, &error);

        g_assert_null (r);
        g_assert_null (none);
        g_assert_error (error, GMLP_ERROR, bad[i].code);
        g_test_message ("forward refused: %s", error->message);
        g_clear_error (&error);
      }
  }

  /* Backward: the gradient's shape and dtype, another router's
   * activations. */
  routing = gmlp_router_forward (router, x, &saved, &error);
  g_assert_no_error (error);
  other = gmlp_router_new (device, p->H, c->E, c->k, &error);
  g_assert_no_error (error);
  other_routing = gmlp_router_forward (other, x, &other_saved, &error);
  g_assert_no_error (error);
  {
    g_autoptr(GmlpGroupedTensor) wide = gmlp_test_upload_values (device, gp, p->T / 2, 2 * c->k, GMLP_DTYPE_FLOAT32);
    g_autoptr(GmlpGroupedTensor) short_grad = gmlp_test_upload_values (device, gp, p->T - 1, c->k, GMLP_DTYPE_FLOAT32);
    g_autoptr(GmlpGroupedTensor) half = gmlp_test_upload_values (device, gp, p->T, c->k, GMLP_DTYPE_FLOAT16);

    g_assert_null (gmlp_router_backward (router, saved, wide, &error));
    g_assert_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH);
    g_clear_error (&error);
    g_assert_null (gmlp_router_backward (router, saved, short_grad, &error));
    g_assert_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH);
    g_clear_error (&error);
    g_assert_null (gmlp_router_backward (router, saved, half, &error));
    g_assert_error (error, GMLP_ERROR, GMLP_ERROR_DTYPE_MISMATCH);
    g_clear_error (&error);
    g_assert_null (gmlp_router_backward (router, other_saved, grad, &error));
    g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
    g_clear_error (&error);
  }
  g_assert_false (gmlp_saved_activations_is_consumed (saved));
  wgrad_after = gmlp_grouped_tensor_to_bytes (gmlp_router_get_wgrad (router), &error);
  g_assert_true (g_bytes_equal (wgrad_before, wgrad_after));

  /* Still usable; once used, refused. */
  dx = gmlp_router_backward (router, saved, grad, &error);
  g_assert_no_error (error);
  g_clear_object (&dx);
  g_assert_null (gmlp_router_backward (router, saved, grad, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
  g_clear_error (&error);

  /* What the forward read, written since: refused, for each dtype of x
   * (a 16-bit input is saved as it came), the weight and the routing. */
  for (d = 0; d < G_N_ELEMENTS (x_dtypes); d++)
    {
      guint what;

      for (what = 0; what < 3; what++)
        {
          g_autoptr(GmlpGroupedTensor) xd = gmlp_test_upload_values (device, p->x, p->T, p->H, x_dtypes[d]);
          g_autoptr(GmlpSavedActivations) s = NULL;
          g_autoptr(GmlpRouting) r = gmlp_router_forward (router, xd, &s, &error);
          g_autoptr(GmlpGroupedTensor) ok = NULL;
          g_autoptr(GBytes) wb = gmlp_test_encode_values (p->w, c->E * p->H, GMLP_DTYPE_FLOAT32);

          g_assert_no_error (error);
          if (what == 0)
            g_assert_true (gmlp_grouped_tensor_fill_zero (xd, &error));
          else if (what == 1)
            g_assert_true (gmlp_router_set_weight_from_bytes (router, wb, &error));
          else
            g_assert_true (gmlp_grouped_tensor_fill_zero (gmlp_routing_get_indices (r), &error));
          g_assert_no_error (error);
          g_assert_null (gmlp_router_backward (router, s, grad, &error));
          g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
          g_test_message ("stale: %s", error->message);
          g_clear_error (&error);
          g_assert_false (gmlp_saved_activations_is_consumed (s));
        }
    }
  g_clear_pointer (&wgrad_after, g_bytes_unref);
  wgrad_after = gmlp_grouped_tensor_to_bytes (gmlp_router_get_wgrad (router), &error);
  g_assert_true (g_bytes_equal (wgrad_before, wgrad_after));
}

/* Zero tokens: an empty routing, zero counts and losses; the backward of
 * nothing is an empty dx and a zero dW. */
static void
test_zero_tokens (void)
{
  const Config *c = config ("sigmoid-deepseek");
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(Problem) p = NULL;
  g_autoptr(GmlpRouter) router = NULL;
  g_autoptr(GError) error = NULL;
  guint d;

  if (device == NULL)
    return;
  p = problem_new (c, GMLP_DTYPE_FLOAT32, 0);
  router = problem_router (p, device, GMLP_LINEAR_NONE);
  for (d = 0; d < G_N_ELEMENTS (x_dtypes); d++)
    {
      gint64 zero = 0;
      g_autoptr(GmlpGroupedTensor) x = gmlp_grouped_tensor_new (device, x_dtypes[d], &zero, 1, p->H, &error);
      g_autoptr(GmlpGroupedTensor) grad = gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, &zero, 1, c->k,
                                                                   &error);
      g_autoptr(GmlpSavedActivations) saved = NULL;
      g_autoptr(GmlpRouting) routing = NULL;
      g_autoptr(GmlpGroupedTensor) dx = NULL;
      g_autofree gint64 *counts = NULL;
      g_autofree double *dw = NULL;
      gsize n, i;

      g_assert_no_error (error);
      routing = gmlp_router_forward (router, x, &saved, &error);
      g_assert_no_error (error);
      g_assert_cmpint (gmlp_routing_get_n_tokens (routing), ==, 0);
      g_assert_cmpint (gmlp_grouped_tensor_get_total_rows (gmlp_routing_get_indices (routing)), ==, 0);
      g_assert_cmpint (gmlp_grouped_tensor_get_cols (gmlp_routing_get_indices (routing)), ==, c->k);
      g_assert_cmpint (gmlp_grouped_tensor_get_total_rows (gmlp_routing_get_probs (routing)), ==, 0);
      counts = gmlp_test_download_i64 (gmlp_routing_get_tokens_per_expert (routing), &n);
      g_assert_cmpuint (n, ==, c->E);
      for (i = 0; i < n; i++)
        g_assert_cmpint (counts[i], ==, 0);
      gmlp_assert_same_value (gmlp_test_download_scalar (gmlp_routing_get_aux_loss (routing)), 0.0, "aux", 0);
      gmlp_assert_same_value (gmlp_test_download_scalar (gmlp_routing_get_z_loss (routing)), 0.0, "z", 0);

      dx = gmlp_router_backward (router, saved, grad, &error);
      g_assert_no_error (error);
      g_assert_cmpint (gmlp_grouped_tensor_get_total_rows (dx), ==, 0);
      g_assert_cmpint (gmlp_grouped_tensor_get_dtype (dx), ==, x_dtypes[d]);
      dw = gmlp_test_download (gmlp_router_get_wgrad (router), &n);
      for (i = 0; i < n; i++)
        gmlp_assert_same_value (dw[i], 0.0, "dW of no tokens", i);
    }
}

/* Expert 3's logits all NaN; tokens 0 to 3 with ±∞ or NaN in x (logits of
 * ±∞ or NaN); token 4 all zero. */
static void
make_non_finite (Problem *p)
{
  gint64 h;

  g_assert_cmpint (p->T, >=, 5);
  for (h = 0; h < p->H; h++)
    p->w[3 * p->H + h] = NAN;
  p->x[0 * p->H + 1] = INFINITY;
  p->x[1 * p->H + 2] = -INFINITY;
  p->x[2 * p->H + 0] = NAN;
  p->x[3 * p->H + 0] = INFINITY, p->x[3 * p->H + 1] = -INFINITY;
  for (h = 0; h < p->H; h++)
    p->x[4 * p->H + h] = 0.0;
}

/* Non-finite logits: never an expert out of range, never one twice; the
 * counts stay exact; the documented values where they are fixed. */
static void
test_non_finite (void)
{
  static const char *which[] = {
    "default", "softmax-after", "sigmoid-top16-of-64", "sigmoid-deepseek", "softmax-groups-bias",
    "softmax-after-groups-bias",
  };
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint i;

  if (device == NULL)
    return;
  for (i = 0; i < G_N_ELEMENTS (which); i++)
    {
      const Config *c = config (which[i]);
      g_autoptr(Problem) p = problem_new (c, GMLP_DTYPE_FLOAT32, T_TOKENS);
      g_autoptr(GmlpRouter) router = NULL;
      g_autoptr(GmlpGroupedTensor) x = NULL;
      g_autoptr(GmlpRouting) routing = NULL;
      g_autoptr(GError) error = NULL;
      g_autofree gint64 *idx = NULL, *counts = NULL;
      g_autofree double *probs = NULL, *histogram = g_new0 (double, c->E);
      gint64 t;
      gsize n;
      guint j, q;

      make_non_finite (p);
      router = problem_router (p, device, GMLP_LINEAR_NONE);
      x = gmlp_test_upload_values (device, p->x, p->T, p->H, GMLP_DTYPE_FLOAT32);
      routing = gmlp_router_forward (router, x, NULL, &error);
      g_assert_no_error (error);

      idx = gmlp_test_download_i64 (gmlp_routing_get_indices (routing), &n);
      counts = gmlp_test_download_i64 (gmlp_routing_get_tokens_per_expert (routing), &n);
      probs = gmlp_test_download (gmlp_routing_get_probs (routing), &n);
      for (t = 0; t < p->T; t++)
        for (j = 0; j < c->k; j++)
          {
            gint64 e = idx[t * c->k + j];

            g_assert_cmpint (e, >=, 0);
            g_assert_cmpint (e, <, c->E);
            for (q = 0; q < j; q++)
              g_assert_cmpint (idx[t * c->k + q], !=, e);
            histogram[e] += 1.0;
          }
      for (j = 0; j < c->E; j++)
        g_assert_cmpfloat (counts[j], ==, histogram[j]);

      if (c->score == SOFTMAX && c->before && !c->bias && c->groups == 0)
        {
          /* Every score NaN: every token takes the first k experts. */
          for (t = 0; t < p->T; t++)
            for (j = 0; j < c->k; j++)
              g_assert_cmpint (idx[t * c->k + j], ==, j);
        }
      if (c->score == SIGMOID || !c->before)
        {
          /* NaN values rank last: where the other logits are finite
           * (from token 4 on), expert 3 is never chosen, and the sigmoid
           * gives finite probabilities. */
          for (t = 4; t < p->T; t++)
            for (j = 0; j < c->k; j++)
              {
                g_assert_cmpint (idx[t * c->k + j], !=, 3);
                if (c->score == SIGMOID)
                  g_assert_true (isfinite (probs[t * c->k + j]));
              }
        }
      if (c->aux == 0.0)
        gmlp_assert_same_value (gmlp_test_download_scalar (gmlp_routing_get_aux_loss (routing)), 0.0, "aux", 0);
      if (c->z == 0.0)
        gmlp_assert_same_value (gmlp_test_download_scalar (gmlp_routing_get_z_loss (routing)), 0.0, "z", 0);
    }
}

/* Saved activations offloaded: the same gradients, bit for bit. */
static void
test_offload (void)
{
  const Config *c = config ("sigmoid-deepseek");
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint d;

  if (device == NULL)
    return;
  for (d = 0; d < G_N_ELEMENTS (x_dtypes); d++)
    {
      g_autoptr(Problem) p = problem_new (c, x_dtypes[d], T_TOKENS);
      g_autoptr(GmlpRouter) router = problem_router (p, device, GMLP_LINEAR_NONE);
      g_autofree double *gp = random_grad ((gsize) p->T * c->k);
      g_autoptr(GmlpGroupedTensor) x = gmlp_test_upload_values (device, p->x, p->T, p->H, p->dtype);
      g_autoptr(GmlpGroupedTensor) grad = gmlp_test_upload_values (device, gp, p->T, c->k, GMLP_DTYPE_FLOAT32);
      g_autoptr(GmlpOffloadContext) oc = NULL;
      GBytes *results[2][2] = { { NULL, NULL }, { NULL, NULL } };
      g_autoptr(GError) error = NULL;
      guint offload;

      oc = gmlp_offload_context_new (device, &error);
      g_assert_no_error (error);
      for (offload = 0; offload < 2; offload++)
        {
          g_autoptr(GmlpSavedActivations) saved = NULL;
          g_autoptr(GmlpRouting) routing = NULL;
          g_autoptr(GmlpGroupedTensor) dx = NULL;

          if (offload)
            gmlp_offload_context_push_thread_default (oc, TRUE);
          routing = gmlp_router_forward (router, x, &saved, &error);
          g_assert_no_error (error);
          if (offload)
            {
              g_assert_true (gmlp_offload_context_pop_thread_default (oc, &error));
              g_assert_no_error (error);
            }
          g_assert_cmpint (gmlp_saved_activations_get_offload (saved), ==, offload);
          dx = gmlp_router_backward (router, saved, grad, &error);
          g_assert_no_error (error);
          results[offload][0] = gmlp_grouped_tensor_to_bytes (dx, &error);
          results[offload][1] = gmlp_grouped_tensor_to_bytes (gmlp_router_get_wgrad (router), &error);
          g_assert_no_error (error);
        }
      g_assert_true (g_bytes_equal (results[0][0], results[1][0]));
      g_assert_true (g_bytes_equal (results[0][1], results[1][1]));
      for (offload = 0; offload < 2; offload++)
        {
          g_bytes_unref (results[offload][0]);
          g_bytes_unref (results[offload][1]);
        }
    }
}

/* The properties a router is made with come back. */
static void
test_properties (void)
{
  const Config *c = config ("softmax-after-groups-bias");
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpRouter) router = NULL;
  gboolean before, renorm, bias, added;
  guint E, k, groups, topk_groups, pending;
  double scale, rate, aux, z;
  GmlpScoreFunction score;
  GmlpLinearFlags flags;
  GmlpDevice *got_device;
  gint64 hidden;

  if (device == NULL)
    return;
  router = router_new (device, c, 20, GMLP_LINEAR_DELAY_WGRAD_COMPUTE);
  g_object_get (router, "device", &got_device, "hidden", &hidden, "n-experts", &E, "top-k", &k,
                "score-function", &score, "softmax-before-topk", &before, "renormalize", &renorm,
                "scaling-factor", &scale, "n-expert-groups", &groups, "topk-groups", &topk_groups,
                "expert-bias", &bias, "bias-update-rate", &rate, "aux-loss-coeff", &aux,
                "z-loss-coeff", &z, "flags", &flags, "pending-wgrads", &pending,
                "grad-added-to-main-grad", &added, NULL);
  g_assert_true (got_device == device);
  g_object_unref (got_device);
  g_assert_cmpint (hidden, ==, 20);
  g_assert_cmpuint (E, ==, c->E);
  g_assert_cmpuint (k, ==, c->k);
  g_assert_cmpint (score, ==, c->score);
  g_assert_cmpint (before, ==, c->before);
  g_assert_cmpint (renorm, ==, c->renorm);
  g_assert_cmpfloat (scale, ==, c->scale);
  g_assert_cmpuint (groups, ==, c->groups);
  g_assert_cmpuint (topk_groups, ==, c->topk_groups);
  g_assert_cmpint (bias, ==, c->bias);
  g_assert_cmpfloat (rate, ==, 1e-3);
  g_assert_cmpfloat (aux, ==, c->aux);
  g_assert_cmpfloat (z, ==, c->z);
  g_assert_cmpint (flags, ==, GMLP_LINEAR_DELAY_WGRAD_COMPUTE);
  g_assert_cmpuint (pending, ==, 0);
  g_assert_false (added);
  g_assert_cmpint (gmlp_router_get_hidden (router), ==, 20);
  g_assert_cmpuint (gmlp_router_get_n_experts (router), ==, c->E);
  g_assert_cmpuint (gmlp_router_get_top_k (router), ==, c->k);
  g_assert_cmpint (gmlp_router_get_score_function (router), ==, c->score);
  g_assert_true (gmlp_router_get_device (router) == device);
  /* The bias starts at zero, 1 × E. */
  {
    gsize n, i;
    g_autofree double *b = gmlp_test_download (gmlp_router_get_expert_bias (router), &n);

    g_assert_cmpuint (n, ==, c->E);
    g_assert_cmpint (gmlp_grouped_tensor_get_rows (gmlp_router_get_expert_bias (router), 0), ==, 1);
    for (i = 0; i < n; i++)
      gmlp_assert_same_value (b[i], 0.0, "expert bias", i);
  }
}

/* Threads share one router: forwards run together, backwards take turns,
 * and main_grad gets every thread's dW. */
typedef struct {
  Problem     *p;
  GmlpDevice  *device;
  GmlpRouter  *router;
  double      *gp;
} ThreadStep;

static gpointer
thread_step (gpointer data)
{
  ThreadStep *step = data;
  Problem *p = step->p;
  g_autoptr(GmlpGroupedTensor) x = gmlp_test_upload_values (step->device, p->x, p->T, p->H, p->dtype);
  g_autoptr(GmlpGroupedTensor) grad = gmlp_test_upload_values (step->device, step->gp, p->T, p->c->k,
                                                               GMLP_DTYPE_FLOAT32);
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GmlpRouting) routing = NULL;
  g_autoptr(GmlpGroupedTensor) dx = NULL;
  g_autoptr(GError) error = NULL;
  guint i;

  for (i = 0; i < 3; i++)
    {
      g_clear_object (&routing);
      routing = gmlp_router_forward (step->router, x, i == 2 ? &saved : NULL, &error);
      g_assert_no_error (error);
    }
  dx = gmlp_router_backward (step->router, saved, grad, &error);
  g_assert_no_error (error);
  return NULL;
}

static void
test_threads (void)
{
  enum { N_THREADS = 4 };
  const Config *c = config ("sigmoid-deepseek");
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpRouter) router = NULL;
  Problem *problems[N_THREADS];
  ThreadStep steps[N_THREADS];
  GThread *threads[N_THREADS];
  g_autofree double *want = NULL, *dw = NULL, *got = NULL;
  gsize n, j;
  guint i;

  if (device == NULL)
    return;
  want = g_new0 (double, c->E * HIDDEN);
  dw = g_new (double, c->E * HIDDEN);
  for (i = 0; i < N_THREADS; i++)
    {
      g_autofree double *dx = NULL;

      problems[i] = problem_new_like (c, x_dtypes[i % 3], T_TOKENS, i > 0 ? problems[0] : NULL);
      steps[i] = (ThreadStep) { problems[i], device, NULL, random_grad ((gsize) T_TOKENS * c->k) };
      dx = g_new (double, T_TOKENS * HIDDEN);
      ref_backward (problems[i], steps[i].gp, dx, dw);
      for (j = 0; j < c->E * HIDDEN; j++)
        want[j] += dw[j];
    }
  router = problem_router (problems[0], device, GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION);
  for (i = 0; i < N_THREADS; i++)
    {
      steps[i].router = router;
      threads[i] = g_thread_new ("router-step", thread_step, &steps[i]);
    }
  for (i = 0; i < N_THREADS; i++)
    g_thread_join (threads[i]);

  got = gmlp_test_download (gmlp_router_get_main_grad (router), &n);
  gmlp_test_assert_close (got, want, n, 1e-4, "main_grad after the threads' backwards");
  for (i = 0; i < N_THREADS; i++)
    {
      g_free (steps[i].gp);
      problem_free (problems[i]);
    }
}

/* The kernels' other paths (wide_configs) against the float64 reference,
 * on both backends. */
static void
test_wide (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint i;

  if (device == NULL)
    return;
  for (i = 0; i < G_N_ELEMENTS (wide_configs); i++)
    {
      g_autoptr(Problem) p = problem_new (&wide_configs[i], GMLP_DTYPE_FLOAT32, WIDE_TOKENS);
      g_autoptr(GmlpRouter) router = problem_router (p, device, GMLP_LINEAR_NONE);
      g_autofree double *gp = random_grad ((gsize) p->T * p->c->k);

      run_and_check (p, device, router, gp, NULL, wide_configs[i].name);
    }
}

/* What a step leaves, as bytes: the routing's tensors, then dx and dW
 * (NULL after a forward alone). */
enum { STEP_INDICES, STEP_PROBS, STEP_COUNTS, STEP_AUX, STEP_Z, STEP_DX, STEP_DW, N_STEP };

static const char *const step_names[N_STEP] = {
  "indices", "probabilities", "tokens per expert", "aux loss", "z loss", "dx", "dW",
};

typedef struct {
  GBytes    *bytes[N_STEP];
  GmlpDType  dtype[N_STEP];
} Step;

static void
step_clear (Step *s)
{
  guint i;

  for (i = 0; i < N_STEP; i++)
    g_clear_pointer (&s->bytes[i], g_bytes_unref);
}
G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (Step, step_clear)

static void
step_collect (GmlpRouter        *router,
              GmlpRouting       *routing,
              GmlpGroupedTensor *dx,
              Step              *s)
{
  GmlpGroupedTensor *t[N_STEP] = {
    gmlp_routing_get_indices (routing), gmlp_routing_get_probs (routing),
    gmlp_routing_get_tokens_per_expert (routing), gmlp_routing_get_aux_loss (routing),
    gmlp_routing_get_z_loss (routing), dx, dx != NULL ? gmlp_router_get_wgrad (router) : NULL,
  };
  g_autoptr(GError) error = NULL;
  guint i;

  for (i = 0; i < N_STEP; i++)
    {
      s->bytes[i] = t[i] != NULL ? gmlp_grouped_tensor_to_bytes (t[i], &error) : NULL;
      g_assert_no_error (error);
      s->dtype[i] = t[i] != NULL ? gmlp_grouped_tensor_get_dtype (t[i]) : GMLP_DTYPE_FLOAT32;
    }
}

/* A forward (and with gp a backward) of a fresh router of the problem on
 * device. */
static void
step_run (Problem      *p,
          GmlpDevice   *device,
          const double *gp,
          Step         *s)
{
  g_autoptr(GmlpRouter) router = problem_router (p, device, GMLP_LINEAR_NONE);
  g_autoptr(GmlpGroupedTensor) x = gmlp_test_upload_values (device, p->x, p->T, p->H, p->dtype);
  g_autoptr(GmlpGroupedTensor) grad = NULL, dx = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GmlpRouting) routing = NULL;
  g_autoptr(GError) error = NULL;

  routing = gmlp_router_forward (router, x, gp != NULL ? &saved : NULL, &error);
  g_assert_no_error (error);
  if (gp != NULL)
    {
      grad = gmlp_test_upload_values (device, gp, p->T, p->c->k, GMLP_DTYPE_FLOAT32);
      dx = gmlp_router_backward (router, saved, grad, &error);
      g_assert_no_error (error);
    }
  step_collect (router, routing, dx, s);
}

/* Every result of two steps the same, byte for byte. */
static void
assert_steps_equal (const Step *a,
                    const Step *b,
                    const char *what)
{
  guint i;

  for (i = 0; i < N_STEP; i++)
    {
      g_assert_true ((a->bytes[i] == NULL) == (b->bytes[i] == NULL));
      if (a->bytes[i] != NULL && !g_bytes_equal (a->bytes[i], b->bytes[i]))
        g_error ("%s: %s differ", what, step_names[i]);
    }
}

/* ‖a − b‖ ≤ tol ‖b‖ over the values that are numbers, NaN where the other
 * is NaN too (and ±∞ where the other is the same). */
static void
assert_close_or_same_special (const double *a,
                              const double *b,
                              gsize         n,
                              double        tol,
                              const char   *what)
{
  double diff = 0.0, norm = 0.0;
  gsize i;

  for (i = 0; i < n; i++)
    {
      if (!isfinite (a[i]) || !isfinite (b[i]))
        {
          if (!((isnan (a[i]) && isnan (b[i])) || a[i] == b[i]))
            g_error ("%s [%" G_GSIZE_FORMAT "]: %g and %g", what, i, a[i], b[i]);
          continue;
        }
      diff += (a[i] - b[i]) * (a[i] - b[i]);
      norm += b[i] * b[i];
    }
  if (!(sqrt (diff) <= tol * sqrt (norm)))
    g_error ("%s: relative difference %g > %g", what, sqrt (diff / norm), tol);
}

/* The CPU step and the GPU step as gmlp-kernels.h says they agree:
 * indices and counts the same bytes; probabilities and losses within 1e-5
 * (a token's E terms are added in another order and expf is CUDA's: a
 * softmax's sum may differ by some ulps per expert, and every value of the
 * token with it); dx and dW, one product further, within 2e-5, or the
 * rounding of a 16-bit dx. */
static void
assert_steps_agree (const Step *cpu,
                    const Step *gpu,
                    GmlpDType   x_dtype,
                    const char *what)
{
  guint i;

  for (i = 0; i < N_STEP; i++)
    {
      gsize n, j, size;
      g_autofree double *a = NULL, *b = NULL;
      g_autofree char *label = g_strdup_printf ("%s: %s, GPU against CPU", what, step_names[i]);
      double tol;

      g_assert_true ((cpu->bytes[i] == NULL) == (gpu->bytes[i] == NULL));
      if (cpu->bytes[i] == NULL)
        continue;
      g_assert_cmpint (cpu->dtype[i], ==, gpu->dtype[i]);
      g_assert_cmpuint (g_bytes_get_size (cpu->bytes[i]), ==, g_bytes_get_size (gpu->bytes[i]));
      if (i == STEP_INDICES || i == STEP_COUNTS)
        {
          const gint64 *ci = g_bytes_get_data (cpu->bytes[i], &size);
          const gint64 *gi = g_bytes_get_data (gpu->bytes[i], NULL);

          for (j = 0; j < size / sizeof (gint64); j++)
            if (ci[j] != gi[j])
              g_error ("%s [%" G_GSIZE_FORMAT "]: %" G_GINT64_FORMAT " on the GPU, %" G_GINT64_FORMAT
                       " on the CPU", label, j, gi[j], ci[j]);
          continue;
        }
      n = g_bytes_get_size (cpu->bytes[i]) / gmlp_dtype_get_size (cpu->dtype[i]);
      a = g_new (double, MAX (n, 1));
      b = g_new (double, MAX (n, 1));
      for (j = 0; j < n; j++)
        {
          a[j] = gmlp_test_decode (g_bytes_get_data (gpu->bytes[i], NULL), gpu->dtype[i], j);
          b[j] = gmlp_test_decode (g_bytes_get_data (cpu->bytes[i], NULL), cpu->dtype[i], j);
        }
      if (i == STEP_DX)
        tol = x_dtype == GMLP_DTYPE_FLOAT32 ? 2e-5 : gmlp_test_tolerance (x_dtype);
      else
        tol = i == STEP_DW ? 2e-5 : 1e-5;
      assert_close_or_same_special (a, b, n, tol, label);
    }
}

/* The CPU and the GPU route alike (gpu suite only): every configuration,
 * FP32 and for some BF16 inputs, forward and backward; the non-finite
 * logits of /Gmlp/Router/non-finite, forward. The GPU gives the same bits
 * when run again. */
static void
test_cpu_gpu (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpDevice) cpu = NULL;
  g_autoptr(GError) error = NULL;
  guint i, pass;

  if (device == NULL)
    return;
  if (gmlp_device_get_kind (device) == GMLP_DEVICE_KIND_CPU)
    {
      g_test_skip ("compares the CPU with a GPU: runs in the gpu suite");
      return;
    }
  cpu = gmlp_device_new_from_string ("cpu", &error);
  g_assert_no_error (error);

  for (pass = 0; pass < 3; pass++)
    for (i = 0; i < G_N_ELEMENTS (configs) + G_N_ELEMENTS (wide_configs); i++)
      {
        gboolean wide = i >= G_N_ELEMENTS (configs);
        const Config *c = wide ? &wide_configs[i - G_N_ELEMENTS (configs)] : &configs[i];
        /* pass 0: FP32; 1: BF16 (the narrow configurations); 2: non-finite
         * logits, forward only. */
        GmlpDType dtype = pass == 1 ? GMLP_DTYPE_BFLOAT16 : GMLP_DTYPE_FLOAT32;
        g_autoptr(Problem) p = NULL;
        g_autofree double *gp = NULL;
        g_autofree char *what = NULL;
        g_auto(Step) on_cpu = { { NULL } }, on_gpu = { { NULL } }, again = { { NULL } };

        if (pass == 1 && wide)
          continue;
        p = problem_new (c, dtype, wide ? WIDE_TOKENS : T_TOKENS);
        if (pass == 2)
          make_non_finite (p);
        else
          gp = random_grad ((gsize) p->T * c->k);
        what = g_strdup_printf ("%s/%s%s", c->name, gmlp_dtype_get_name (dtype),
                                pass == 2 ? "/non-finite" : "");

        step_run (p, cpu, gp, &on_cpu);
        step_run (p, device, gp, &on_gpu);
        step_run (p, device, gp, &again);
        assert_steps_agree (&on_cpu, &on_gpu, dtype, what);
        assert_steps_equal (&on_gpu, &again, what);
      }
}

/* A forward and backward captured once into a graph (groups, bias, aux
 * and z), replayed on new tokens written into the same input: every replay
 * gives the float64 reference's routing and gradients, and the same bits as
 * the step run eagerly. That the capture succeeds shows that nothing in the
 * step waits for the device or reads it on the host. */
static void
test_graph (void)
{
  static const GmlpDType dtypes[] = { GMLP_DTYPE_FLOAT32, GMLP_DTYPE_BFLOAT16 };
  const Config *c = config ("sigmoid-deepseek");
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint d, replay;

  if (device == NULL)
    return;
  if (gmlp_device_get_kind (device) == GMLP_DEVICE_KIND_CPU)
    {
      g_test_skip ("graphs need a GPU");
      return;
    }
  for (d = 0; d < G_N_ELEMENTS (dtypes); d++)
    {
      g_autoptr(Problem) p = problem_new (c, dtypes[d], T_TOKENS);
      g_autoptr(GmlpRouter) router = problem_router (p, device, GMLP_LINEAR_NONE);
      g_autofree double *gp = random_grad ((gsize) p->T * c->k);
      g_autoptr(GmlpGroupedTensor) x = gmlp_test_upload_values (device, p->x, p->T, p->H, p->dtype);
      g_autoptr(GmlpGroupedTensor) grad = gmlp_test_upload_values (device, gp, p->T, c->k, GMLP_DTYPE_FLOAT32);
      g_autoptr(GmlpSavedActivations) saved = NULL;
      g_autoptr(GmlpRouting) routing = NULL;
      g_autoptr(GmlpGroupedTensor) dx = NULL;
      g_autoptr(GmlpGraph) graph = NULL;
      g_autoptr(GError) error = NULL;

      g_assert_true (gmlp_device_begin_capture (device, &error));
      g_assert_no_error (error);
      routing = gmlp_router_forward (router, x, &saved, &error);
      g_assert_no_error (error);
      dx = gmlp_router_backward (router, saved, grad, &error);
      g_assert_no_error (error);
      graph = gmlp_device_end_capture (device, &error);
      g_assert_no_error (error);

      for (replay = 0; replay < 3; replay++)
        {
          g_autoptr(Problem) q = problem_new_like (c, dtypes[d], T_TOKENS, p);
          g_autofree double *gq = random_grad ((gsize) q->T * c->k);
          g_autofree double *dx_ref = g_new (double, q->T * q->H), *dw_ref = g_new (double, c->E * q->H);
          g_autofree double *got = NULL;
          g_autoptr(GmlpSavedActivations) eager_saved = NULL;
          g_autoptr(GmlpRouting) eager = NULL;
          g_autoptr(GmlpGroupedTensor) eager_dx = NULL;
          g_auto(Step) replayed = { { NULL } }, eagerly = { { NULL } };
          g_autofree char *what = g_strdup_printf ("%s replay %u", gmlp_dtype_get_name (dtypes[d]), replay);
          gsize n;

          gmlp_test_overwrite_values (x, q->x);
          gmlp_test_overwrite_values (grad, gq);
          g_assert_true (gmlp_graph_replay (graph, &error));
          g_assert_no_error (error);

          assert_routing (q, routing, what);
          ref_backward (q, gq, dx_ref, dw_ref);
          got = gmlp_test_download (dx, &n);
          gmlp_test_assert_close (got, dx_ref, n, dx_tolerance (q->dtype), what);
          g_clear_pointer (&got, g_free);
          got = gmlp_test_download (gmlp_router_get_wgrad (router), &n);
          gmlp_test_assert_close (got, dw_ref, n, 1e-4, what);
          step_collect (router, routing, dx, &replayed);

          eager = gmlp_router_forward (router, x, &eager_saved, &error);
          g_assert_no_error (error);
          eager_dx = gmlp_router_backward (router, eager_saved, grad, &error);
          g_assert_no_error (error);
          step_collect (router, eager, eager_dx, &eagerly);
          assert_steps_equal (&replayed, &eagerly, what);
        }
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
