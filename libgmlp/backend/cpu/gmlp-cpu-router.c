/* gmlp-cpu-router.c: the reference of the router entries
 *
 * Token by token, in FP32, as a kernel would with one token per block; the
 * sums over tokens (the mean probabilities of the aux loss, the z-loss) in
 * FP64. The rules, which every backend follows:
 *
 * - scores: the softmax of the E logits (the maximum subtracted first), or
 *   the sigmoid of each logit;
 * - the selection value of expert i: its score (softmax before top-k, and
 *   sigmoid) or its logit (softmax after top-k), plus expert_bias[i];
 * - ranking: the higher value first, equal values by the lower index, NaN
 *   below every number (NaNs among themselves by index), so that every token
 *   gets k distinct experts in range whatever its logits;
 * - groups: a group's score is the sum of its best two selection values (its
 *   best one when it has one expert), ranked as above; experts outside the
 *   token's best topk_groups groups are no candidates;
 * - the probabilities of the k choices: after top-k, the softmax of their
 *   logits; else their scores, divided by (their sum + 1e-20) with
 *   renormalize; times scaling_factor;
 * - aux = coeff × E × Σ_i f_i P_i, f_i = count_i / (T k), P_i the mean over
 *   the tokens of the full distribution: the softmax of the logits, or the
 *   sigmoid scores divided by (their sum + 1e-20);
 * - z = coeff × mean over the tokens of (logsumexp_j logits[t, j])².
 *
 * The backward is the exact derivative of these with the choices and the
 * counts held fixed (they are piecewise constant).
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <math.h>
#include <string.h>

#include "backend/cpu/gmlp-cpu-router.h"
#include "gmlp-error.h"

#define MAX_TOP_K     16
#define RENORM_EPS    1e-20f
#define SCORE_SOFTMAX 0
#define SCORE_SIGMOID 1

/* Per-token scratch, allocated once a call. */
typedef struct {
  float  *softmax;      /* E: the softmax of the logits, where needed */
  float  *sigmoid;      /* E: the sigmoid scores (sigmoid only) */
  float  *value;        /* E: selection values */
  float  *ds;           /* E: backward, the gradient of the softmax */
  float  *grad;         /* E: backward, the gradient of the logits */
  guint8 *allowed;      /* E: a candidate after the group limit */
  float  *group_best;   /* topk_groups */
  gint64 *group_index;  /* topk_groups */
  float   lse;          /* logsumexp of the logits */
} Scratch;

static void
scratch_init (Scratch                 *s,
              const GmlpBackendRouter *router)
{
  gsize e = router->n_experts, g = MAX (router->topk_groups, 1);

  s->softmax = g_new (float, e);
  s->sigmoid = g_new (float, e);
  s->value = g_new (float, e);
  s->ds = g_new (float, e);
  s->grad = g_new (float, e);
  s->allowed = g_new (guint8, e);
  s->group_best = g_new (float, g);
  s->group_index = g_new (gint64, g);
  s->lse = 0.0f;
}

static void
scratch_clear (Scratch *s)
{
  g_free (s->softmax);
  g_free (s->sigmoid);
  g_free (s->value);
  g_free (s->ds);
  g_free (s->grad);
  g_free (s->allowed);
  g_free (s->group_best);
  g_free (s->group_index);
}

/* The options, checked again: the CUDA kernels will size their shared
 * memory by them. */
static gboolean
check_router (const GmlpBackendRouter  *router,
              GError                  **error)
{
  guint e = router->n_experts, k = router->top_k, g = router->n_groups;

  if (router->n_tokens < 0 || e == 0 || e > 65535 || k == 0 || k > MIN (MAX_TOP_K, e) ||
      (router->score_function != SCORE_SOFTMAX && router->score_function != SCORE_SIGMOID) ||
      (g > 0 && (e % g != 0 || router->topk_groups == 0 || router->topk_groups > g ||
                 k > router->topk_groups * (e / g))))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "CPU: invalid router options (T %" G_GINT64_FORMAT ", E %u, k %u, groups %u/%u)",
                   router->n_tokens, e, k, router->topk_groups, g);
      return FALSE;
    }
  return TRUE;
}

/* Whether value a of expert (or group) ia ranks before value b of ib. */
static inline gboolean
ranks_before (float  a,
              gint64 ia,
              float  b,
              gint64 ib)
{
  if (isnan (a))
    return isnan (b) && ia < ib;
  if (isnan (b))
    return TRUE;
  return a > b || (a == b && ia < ib);
}

/* Offers (value, index) to the best *n (at most k) kept in rank order. */
static void
keep_best (float  *best,
           gint64 *best_index,
           guint  *n,
           guint   k,
           float   value,
           gint64  index)
{
  guint pos;

  if (*n == k)
    {
      if (!ranks_before (value, index, best[k - 1], best_index[k - 1]))
        return;
      pos = k - 1;
    }
  else
    {
      pos = (*n)++;
    }
  while (pos > 0 && ranks_before (value, index, best[pos - 1], best_index[pos - 1]))
    {
      best[pos] = best[pos - 1];
      best_index[pos] = best_index[pos - 1];
      pos--;
    }
  best[pos] = value;
  best_index[pos] = index;
}

static inline float
sigmoid (float x)
{
  float e;

  if (x >= 0.0f)
    return 1.0f / (1.0f + expf (-x));
  e = expf (x);   /* NaN stays NaN */
  return e / (1.0f + e);
}

/* The softmax of n values (the largest subtracted first; a NaN, a +∞ or
 * all −∞ make every value NaN) and their logsumexp. */
static void
softmax (const float *x,
         gsize        n,
         float       *out,
         float       *lse)
{
  float m = -INFINITY, sum = 0.0f;
  gsize j;

  for (j = 0; j < n; j++)
    m = fmaxf (m, x[j]);
  for (j = 0; j < n; j++)
    {
      out[j] = expf (x[j] - m);
      sum += out[j];
    }
  for (j = 0; j < n; j++)
    out[j] /= sum;
  if (lse != NULL)
    *lse = m + logf (sum);
}

/* The scores of a token; its softmax (and logsumexp) too where the
 * softmax is the score or the z-loss needs it. Returns the scores. */
static const float *
token_scores (const GmlpBackendRouter *router,
              const float             *logits,
              Scratch                 *s)
{
  gsize e = router->n_experts, j;

  if (router->score_function == SCORE_SOFTMAX || router->z_loss_coeff != 0.0f)
    softmax (logits, e, s->softmax, &s->lse);
  if (router->score_function == SCORE_SOFTMAX)
    return s->softmax;
  for (j = 0; j < e; j++)
    s->sigmoid[j] = sigmoid (logits[j]);
  return s->sigmoid;
}

/* A token's k choices, best first. */
static void
token_select (const GmlpBackendRouter *router,
              const float             *logits,
              const float             *scores,
              const float             *expert_bias,
              Scratch                 *s,
              gint64                  *chosen)
{
  gboolean on_logits = router->score_function == SCORE_SOFTMAX && !router->softmax_before_topk;
  guint e = router->n_experts, k = router->top_k, n = 0, j, g;
  float best[MAX_TOP_K];

  for (j = 0; j < e; j++)
    s->value[j] = (on_logits ? logits[j] : scores[j]) + (expert_bias != NULL ? expert_bias[j] : 0.0f);

  if (router->n_groups == 0)
    {
      memset (s->allowed, 1, e);
    }
  else
    {
      guint per = e / router->n_groups, m = MIN (per, 2), n_groups_kept = 0;

      memset (s->allowed, 0, e);
      for (g = 0; g < router->n_groups; g++)
        {
          float top[2];
          gint64 top_index[2];
          guint n_top = 0, i;

          for (i = 0; i < per; i++)
            keep_best (top, top_index, &n_top, m, s->value[g * per + i], g * per + i);
          keep_best (s->group_best, s->group_index, &n_groups_kept, router->topk_groups,
                     m == 2 ? top[0] + top[1] : top[0], g);
        }
      for (g = 0; g < n_groups_kept; g++)
        memset (s->allowed + s->group_index[g] * per, 1, per);
    }

  for (j = 0; j < e; j++)
    if (s->allowed[j])
      keep_best (best, chosen, &n, k, s->value[j], j);
}

/* The weights of a token's choices before the scaling factor: after
 * top-k, the softmax of their logits; else their scores, renormalized if
 * asked. Returns the sum the scores were divided by (1 when not). */
static float
token_weights (const GmlpBackendRouter *router,
               const float             *logits,
               const float             *scores,
               const gint64            *chosen,
               const gboolean          *valid,
               float                   *weights)
{
  guint k = router->top_k, j;
  float sum = 0.0f;

  if (router->score_function == SCORE_SOFTMAX && !router->softmax_before_topk)
    {
      float chosen_logits[MAX_TOP_K] = { 0 };
      guint n = 0;

      for (j = 0; j < k; j++)
        if (valid[j])
          chosen_logits[n++] = logits[chosen[j]];
      softmax (chosen_logits, n, chosen_logits, NULL);
      for (j = 0, n = 0; j < k; j++)
        weights[j] = valid[j] ? chosen_logits[n++] : 0.0f;
      return 1.0f;
    }

  for (j = 0; j < k; j++)
    {
      weights[j] = valid[j] ? scores[chosen[j]] : 0.0f;
      sum += weights[j];
    }
  if (!router->renormalize)
    return 1.0f;
  sum += RENORM_EPS;
  for (j = 0; j < k; j++)
    weights[j] /= sum;
  return sum;
}

/* The normalizer of the sigmoid scores in the aux loss's distribution. */
static float
sigmoid_sum (const float *sig,
             guint        e)
{
  float sum = 0.0f;
  guint j;

  for (j = 0; j < e; j++)
    sum += sig[j];
  return sum + RENORM_EPS;
}

gboolean
gmlp_cpu_router_forward (GmlpBackendDevice        *device,
                         const GmlpBackendRouter  *router,
                         const float              *logits,
                         const float              *expert_bias,
                         gint64                   *indices,
                         float                    *probs,
                         gint64                   *tokens_per_expert,
                         float                    *aux_loss,
                         float                    *z_loss,
                         GError                  **error)
{
  gboolean valid[MAX_TOP_K];
  g_autofree double *mean_prob = NULL;
  double z_sum = 0.0;
  guint e, k, j;
  Scratch s;
  gint64 t;

  if (!check_router (router, error))
    return FALSE;
  e = router->n_experts;
  k = router->top_k;
  for (j = 0; j < k; j++)
    valid[j] = TRUE;

  memset (tokens_per_expert, 0, sizeof (gint64) * e);
  *aux_loss = 0.0f;
  *z_loss = 0.0f;
  if (router->n_tokens == 0)
    return TRUE;

  mean_prob = g_new0 (double, e);
  scratch_init (&s, router);
  for (t = 0; t < router->n_tokens; t++)
    {
      const float *l = logits + t * e;
      const float *scores = token_scores (router, l, &s);
      gint64 *chosen = indices + t * k;
      float *p = probs + t * k;

      token_select (router, l, scores, expert_bias, &s, chosen);
      token_weights (router, l, scores, chosen, valid, p);
      for (j = 0; j < k; j++)
        {
          p[j] *= router->scaling_factor;
          tokens_per_expert[chosen[j]]++;
        }

      if (router->aux_loss_coeff != 0.0f)
        {
          float norm = router->score_function == SCORE_SOFTMAX ? 1.0f : sigmoid_sum (scores, e);

          for (j = 0; j < e; j++)
            mean_prob[j] += scores[j] / norm;
        }
      if (router->z_loss_coeff != 0.0f)
        z_sum += (double) s.lse * s.lse;
    }
  scratch_clear (&s);

  if (router->aux_loss_coeff != 0.0f)
    {
      double sum = 0.0, tk = (double) router->n_tokens * k;

      for (j = 0; j < e; j++)
        sum += (tokens_per_expert[j] / tk) * (mean_prob[j] / router->n_tokens);
      *aux_loss = (float) (router->aux_loss_coeff * (double) e * sum);
    }
  if (router->z_loss_coeff != 0.0f)
    *z_loss = (float) (router->z_loss_coeff * z_sum / router->n_tokens);
  return TRUE;
}

gboolean
gmlp_cpu_router_backward (GmlpBackendDevice        *device,
                          const GmlpBackendRouter  *router,
                          const float              *logits,
                          const gint64             *indices,
                          const gint64             *tokens_per_expert,
                          const float              *grad_probs,
                          float                    *grad_logits,
                          GError                  **error)
{
  gboolean softmax_scores, aux;
  g_autofree float *aux_grad = NULL;
  float z_scale;
  guint e, k, j;
  Scratch s;
  gint64 t;

  if (!check_router (router, error))
    return FALSE;
  if (router->n_tokens == 0)
    return TRUE;
  e = router->n_experts;
  k = router->top_k;
  softmax_scores = router->score_function == SCORE_SOFTMAX;
  aux = router->aux_loss_coeff != 0.0f;

  /* d(aux) / d(P_i of token t) = coeff × E × f_i / T. */
  if (aux)
    {
      double t2k = (double) router->n_tokens * router->n_tokens * k;

      aux_grad = g_new (float, e);
      for (j = 0; j < e; j++)
        aux_grad[j] = (float) (router->aux_loss_coeff * (double) e * tokens_per_expert[j] / t2k);
    }
  z_scale = (float) (2.0 * router->z_loss_coeff / router->n_tokens);

  scratch_init (&s, router);
  for (t = 0; t < router->n_tokens; t++)
    {
      const float *l = logits + t * e;
      const float *scores = token_scores (router, l, &s);
      const gint64 *chosen = indices + t * k;
      const float *gp = grad_probs + t * k;
      float *d = s.grad;
      float weights[MAX_TOP_K], g[MAX_TOP_K], dot = 0.0f;
      gboolean valid[MAX_TOP_K];

      memset (d, 0, sizeof (float) * e);
      memset (s.ds, 0, sizeof (float) * e);
      for (j = 0; j < k; j++)
        {
          valid[j] = chosen[j] >= 0 && chosen[j] < e;
          g[j] = valid[j] ? gp[j] * router->scaling_factor : 0.0f;
        }

      if (softmax_scores && !router->softmax_before_topk)
        {
          /* p = softmax (chosen logits): dl = p (g − Σ p g). */
          token_weights (router, l, scores, chosen, valid, weights);
          for (j = 0; j < k; j++)
            dot += weights[j] * g[j];
          for (j = 0; j < k; j++)
            if (valid[j])
              d[chosen[j]] += weights[j] * (g[j] - dot);
        }
      else
        {
          /* p = q / S (S = Σ q + ε) with renormalize, else q: the
           * gradient of the chosen scores q, then of their logits. */
          float sum = token_weights (router, l, scores, chosen, valid, weights);

          if (router->renormalize)
            for (j = 0; j < k; j++)
              dot += g[j] * weights[j];   /* Σ g q / S */
          for (j = 0; j < k; j++)
            {
              float q = valid[j] ? scores[chosen[j]] : 0.0f;
              float dq = router->renormalize ? (g[j] - dot) / sum : g[j];

              if (!valid[j])
                continue;
              if (softmax_scores)
                s.ds[chosen[j]] += dq;
              else
                d[chosen[j]] += dq * q * (1.0f - q);
            }
        }

      if (aux && softmax_scores)
        {
          for (j = 0; j < e; j++)
            s.ds[j] += aux_grad[j];
        }
      else if (aux)
        {
          /* P = σ / S with S = Σ σ + ε. */
          float sum = sigmoid_sum (scores, e), a_dot = 0.0f;

          for (j = 0; j < e; j++)
            a_dot += aux_grad[j] * scores[j];
          for (j = 0; j < e; j++)
            d[j] += (aux_grad[j] - a_dot / sum) / sum * scores[j] * (1.0f - scores[j]);
        }

      if (softmax_scores)
        {
          /* Through the softmax: dl = s (ds − Σ s ds). */
          float s_dot = 0.0f;

          for (j = 0; j < e; j++)
            s_dot += scores[j] * s.ds[j];
          for (j = 0; j < e; j++)
            d[j] += scores[j] * (s.ds[j] - s_dot);
        }

      /* d(lse²) / dl = 2 lse softmax (l). */
      if (router->z_loss_coeff != 0.0f)
        for (j = 0; j < e; j++)
          d[j] += z_scale * s.lse * s.softmax[j];

      memcpy (grad_logits + t * e, d, sizeof (float) * e);
    }
  scratch_clear (&s);
  return TRUE;
}

gboolean
gmlp_cpu_router_update_bias (GmlpBackendDevice  *device,
                             guint               n_experts,
                             const gint64       *tokens_per_expert,
                             float               rate,
                             float              *expert_bias,
                             GError            **error)
{
  double mean = 0.0;
  guint i;

  for (i = 0; i < n_experts; i++)
    mean += (double) tokens_per_expert[i];
  mean /= MAX (n_experts, 1);
  for (i = 0; i < n_experts; i++)
    {
      double diff = mean - (double) tokens_per_expert[i];

      expert_bias[i] += diff > 0.0 ? rate : diff < 0.0 ? -rate : 0.0f;
    }
  return TRUE;
}
