/* test-router.h: what the parts of test-router share
 *
 * The configurations, the float64 reference of a router's forward and
 * backward (test-router-reference.c), and problems with routers made from
 * them and the checks of a step against the reference
 * (test-router-check.c). The tests are in test-router.c (the numbers),
 * test-router-training.c (expert bias, main_grad, delayed wgrad),
 * test-router-errors.c (bad and empty input) and test-router-devices.c
 * (offload, properties, threads, wide routers, CPU against GPU, graphs);
 * see test-router.c for the reference's definition.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <locale.h>
#include <math.h>
#include <string.h>

#include "gmlp-test-util.h"
#include "gmlp-test-router-ref.h"
#include "gmlp-grouped-tensor-private.h"
#include "gmlp-router-private.h"
#include "gmlp-saved-activations-private.h"

#define T_TOKENS   24
#define HIDDEN     12
#define MARGIN     1e-4

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

const Config *config (const char *name);

static const GmlpDType x_dtypes[] = { GMLP_DTYPE_FLOAT32, GMLP_DTYPE_FLOAT16, GMLP_DTYPE_BFLOAT16 };

void ref_token_grad (const Config *c,
                     const double *l,
                     const gint64 *idx,
                     const double *gp,
                     const double *f,
                     gint64        n_tokens,
                     double       *grad);

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

void problem_free (Problem *p);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (Problem, problem_free)

double ref_forward (Problem      *p,
                    const double *x,
                    const double *w,
                    gint64       *idx,
                    double       *probs,
                    double       *counts,
                    double       *aux,
                    double       *z);
double ref_total_loss (Problem      *p,
                       const double *x,
                       const double *w,
                       const double *gp);
Problem *problem_new_sized (const Config  *c,
                            GmlpDType      dtype,
                            gint64         n_tokens,
                            gint64         hidden,
                            const Problem *like);
Problem *problem_new_like (const Config  *c,
                           GmlpDType      dtype,
                           gint64         n_tokens,
                           const Problem *like);
Problem *problem_new (const Config *c,
                      GmlpDType     dtype,
                      gint64        n_tokens);
GmlpRouter *router_new (GmlpDevice      *device,
                        const Config    *c,
                        gint64           hidden,
                        GmlpLinearFlags  flags);
GmlpRouter *problem_router (Problem         *p,
                            GmlpDevice      *device,
                            GmlpLinearFlags  flags);
void assert_routing (Problem     *p,
                     GmlpRouting *routing,
                     const char  *what);
void ref_backward_full (Problem      *p,
                        const double *gp,
                        double       *dl,
                        double       *dx,
                        double       *dw);
void ref_backward (Problem      *p,
                   const double *gp,
                   double       *dx,
                   double       *dw);
double *random_grad (gsize n);
double dx_tolerance (GmlpDType dtype);
void run_and_check (Problem         *p,
                    GmlpDevice      *device,
                    GmlpRouter      *router,
                    const double    *gp,
                    double          *dw_out,
                    const char      *what);

/* test-router-training.c */
void test_expert_bias (void);
void test_main_grad (void);
void test_delayed_wgrad (void);

/* test-router-errors.c */
void test_bad_construction (void);
void test_bad_calls (void);
void test_zero_tokens (void);
void make_non_finite (Problem *p);
void test_non_finite (void);

/* test-router-devices.c */
void test_offload (void);
void test_properties (void);
void test_threads (void);
void test_wide (void);
void test_cpu_gpu (void);
void test_graph (void);
