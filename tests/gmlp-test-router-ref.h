/* gmlp-test-router-ref.h: the float64 reference of a router, for the
 * test programs of GmlpRouter and of the MoE layers
 *
 * A token's scores (softmax or sigmoid), its top k (group-limited where
 * asked, ties to the lower expert, NaN last), the probabilities of its
 * choices (renormalized where asked, scaled), the aux and z losses of a
 * batch, and the analytic gradient of the logits with the choices held
 * fixed: written here from the documented rules, in float64, with nothing
 * of libgmlp's routing code.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <gmlp.h>

G_BEGIN_DECLS

/* p_j = s_j / (Σ_chosen s + eps) when renormalized; the aux loss's
 * distribution of sigmoid scores likewise. */
#define GMLP_TEST_ROUTER_RENORM_EPS 1e-20
/* The most choices a token has (the router's limit). */
#define GMLP_TEST_ROUTER_MAX_K      16

/* What the reference needs of a router's configuration. */
typedef struct {
  GmlpScoreFunction score;
  gboolean          before;        /* softmax-before-topk */
  gboolean          renorm;
  double            scale;
  guint             E, k;
  guint             groups;        /* 0: no groups */
  guint             topk_groups;
  double            aux, z;        /* the losses' coefficients */
} GmlpTestRouterSpec;

/* A pointer to the spec of a test's configuration @c, whose fields have
 * the same names (valid to the end of the enclosing block). */
#define GMLP_TEST_ROUTER_SPEC(c) \
  (&(const GmlpTestRouterSpec) { .score = (c)->score, .before = (c)->before, .renorm = (c)->renorm, \
                                 .scale = (c)->scale, .E = (c)->E, .k = (c)->k, .groups = (c)->groups, \
                                 .topk_groups = (c)->topk_groups, .aux = (c)->aux, .z = (c)->z })

/* One token through the router. */
typedef struct {
  double *sm;                              /* E: the softmax of the logits */
  double  lse;                             /* and their log-sum-exp */
  double *s;                               /* E: the scores */
  double *v;                               /* E: the selection values */
  gint64  idx[GMLP_TEST_ROUTER_MAX_K];     /* the choices, best first */
  double  p[GMLP_TEST_ROUTER_MAX_K];       /* their probabilities */
  double  margin;                          /* the smallest gap that decides them */
} GmlpTestRouterToken;

GmlpTestRouterToken *gmlp_test_router_token_new       (guint E);
void                 gmlp_test_router_token_free      (GmlpTestRouterToken *t);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (GmlpTestRouterToken, gmlp_test_router_token_free)

/* out = softmax (x[0 .. n)), *lse (when not NULL) = log Σ exp x. */
void   gmlp_test_router_ref_softmax      (const double             *x,
                                          guint                     n,
                                          double                   *out,
                                          double                   *lse);
/* A token's logits l[e] = x · w[e] (x: H values; w: E × H). */
void   gmlp_test_router_ref_logits       (const double             *x,
                                          const double             *w,
                                          guint                     E,
                                          gint64                    H,
                                          double                   *l);
/* t's softmax, log-sum-exp, scores and selection values (the scores, or
 * the logits for a softmax after the top k, plus @bias: E values or NULL)
 * of the logits l. */
void   gmlp_test_router_ref_scores       (const GmlpTestRouterSpec *r,
                                          const double             *l,
                                          const double             *bias,
                                          GmlpTestRouterToken      *t);
/* The k best of the selection values v into idx; *margin (if not NULL)
 * gets the smallest gap that decides them: between consecutive choices,
 * between the last choice and the best expert left out, and between the
 * last group kept and the best group left out. */
void   gmlp_test_router_ref_select       (const GmlpTestRouterSpec *r,
                                          const double             *v,
                                          gint64                   *idx,
                                          double                   *margin);
/* The probabilities p of the choices idx of a token scored into t. */
void   gmlp_test_router_ref_probs        (const GmlpTestRouterSpec *r,
                                          const double             *l,
                                          const GmlpTestRouterToken *t,
                                          const gint64             *idx,
                                          double                   *p);
/* Scores, choices (t->idx, t->margin) and probabilities (t->p). */
void   gmlp_test_router_ref_route        (const GmlpTestRouterSpec *r,
                                          const double             *l,
                                          const double             *bias,
                                          GmlpTestRouterToken      *t);
/* The aux loss's distribution at expert e: the softmax, or the sigmoid
 * scores over their sum. */
double gmlp_test_router_ref_aux_dist     (const GmlpTestRouterSpec *r,
                                          const GmlpTestRouterToken *t,
                                          guint                     e);
/* Routes T tokens of logits (T × E): their choices and probabilities
 * (T × k each), the counts per expert (E, before any drops) and the
 * losses, aux = coeff E Σ_e f_e P_e and z = coeff mean lse², 0 without
 * tokens; counts, aux and z may be NULL. Returns the smallest margin. */
double gmlp_test_router_ref_forward      (const GmlpTestRouterSpec *r,
                                          gint64                    T,
                                          const double             *logits,
                                          const double             *bias,
                                          gint64                   *idx,
                                          double                   *probs,
                                          double                   *counts,
                                          double                   *aux,
                                          double                   *z);
/* dl = d(Σ_j gp_j p_j + the token's share of the losses) / d(l), the
 * choices idx held fixed: aux_grad[e] = d aux / d dist[e] for this token
 * (or NULL), z_grad = d z / d lse². Analytic, through the
 * renormalization and the score function. */
void   gmlp_test_router_ref_token_backward (const GmlpTestRouterSpec *r,
                                            const double             *l,
                                            const gint64             *idx,
                                            const double             *gp,
                                            const double             *aux_grad,
                                            double                    z_grad,
                                            double                   *dl);
/* dl (T × E) of T tokens' logits for the probabilities' gradient gp
 * (T × k) plus the losses, the choices idx and the counts (E) of
 * gmlp_test_router_ref_forward() held fixed. */
void   gmlp_test_router_ref_backward     (const GmlpTestRouterSpec *r,
                                          gint64                    T,
                                          const double             *logits,
                                          const gint64             *idx,
                                          const double             *counts,
                                          const double             *gp,
                                          double                   *dl);
/* The rows an expert keeps of n_choices routed among E experts under a
 * capacity factor, as documented: ceil (factor × n_choices / E), at most
 * n_choices, rounded up to the padding (0 or 1: none); -1 where the
 * factor is not positive (no capacity). */
gint64 gmlp_test_router_ref_capacity     (gint64                    n_choices,
                                          guint                     E,
                                          guint                     padding,
                                          double                    factor);
/* The scale of a random expert bias: about the spread of the selection
 * values. */
double gmlp_test_router_ref_bias_scale   (const GmlpTestRouterSpec *r);

G_END_DECLS
