/* test-moe-layer.h: what the parts of test-moe-layer share
 *
 * The configurations, the float64 reference of a MoE layer's step
 * (test-moe-layer-reference.c) and the library side: layers made from a
 * problem, their gradients read back and checked against it
 * (test-moe-layer-check.c). The tests are in test-moe-layer.c (the step's
 * numbers), test-moe-layer-errors.c (bad input) and test-moe-layer-state.c
 * (versions, properties, parameters, graphs, partial backwards); see
 * test-moe-layer.c for the reference's definition.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <locale.h>
#include <math.h>
#include <string.h>

#include "gmlp-test-util.h"
#include "gmlp-test-router-ref.h"

#define T_TOKENS   24
#define HIDDEN     16
#define FFN        12
#define MARGIN     1e-4

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

const Config *config (const char *name);

static const GmlpDType dtypes[] = { GMLP_DTYPE_FLOAT32, GMLP_DTYPE_BFLOAT16 };

GmlpDevice *layer_device_or_skip (void);

/* Float64 experts */

/* An MLP's parameters (n groups), or its gradients, as float64. */
typedef struct {
  guint           n;
  gint64          hid, ffn, w1o;
  GmlpActivation  act;
  gboolean        has_bias;
  double         *w1, *b1, *w2, *b2;   /* n × w1o × hid, n × w1o, n × hid × ffn, n × hid */
} Mlp;

Mlp *mlp_new (guint          n,
              gint64         hid,
              gint64         ffn,
              GmlpActivation act,
              gboolean       has_bias);
void mlp_free (Mlp *m);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (Mlp, mlp_free)

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

void problem_free (Problem *p);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (Problem, problem_free)

void problem_redo_reference (Problem *p);
void problem_draw_data (Problem *p);
Problem *problem_alloc (const Config *c,
                        GmlpDType     dtype,
                        gint64        T);
Problem *problem_new_like (const Config  *c,
                           GmlpDType      dtype,
                           gint64         T,
                           const Problem *like);
Problem *problem_new (const Config *c,
                      GmlpDType     dtype,
                      gint64        T);
GmlpMoELayer *layer_new (GmlpDevice      *device,
                         const Config    *c,
                         GmlpDType        dtype,
                         GmlpLinearFlags  extra_flags);
GmlpMoELayer *problem_layer (Problem         *p,
                             GmlpDevice      *device,
                             GmlpLinearFlags  extra_flags);
Problem *problem_new_from_layer (const Config *c,
                                 GmlpMoELayer *layer,
                                 gint64        T);

typedef enum {
  GRAD_WEIGHT,   /* wgrad, or main_grad with fused accumulation */
  GRAD_BIAS,
} GradKind;

double *linear_grad (GmlpGroupedLinear *linear,
                     GradKind           kind,
                     gsize             *n_values);
double *router_grad (GmlpRouter *router,
                     gsize      *n);
double router_tolerance (GmlpDType dtype);
void assert_close (const double *got,
                   const double *want,
                   gsize         n,
                   double        tol,
                   const char   *what,
                   const char   *part);
double *layer_grads (GmlpMoELayer *layer,
                     gsize        *n_values);
void assert_mlp_grads (GmlpGroupedMLP *mlp,
                       const Mlp      *want,
                       GmlpDType       dtype,
                       const Mlp      *base,
                       const char     *what,
                       const char     *which);

/* The weight gradients a layer holds now (a fused layer's main_grads
 * before a step): experts, shared expert, router. */
typedef struct {
  Mlp    *experts, *shared;
  double *router;
} Held;

void held_free (Held *h);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (Held, held_free)

Held *held_new (GmlpMoELayer *layer);
void problem_accumulate_grads (Problem       *into,
                               const Problem *later);
void assert_main_grads (GmlpMoELayer  *layer,
                        const Held    *held,
                        const Problem *p,
                        const char    *what);

/* A forward and backward of the problem's layer (and backward_dw when it
 * delays), under an offload context when @offload. */
typedef struct {
  GmlpGroupedTensor *y, *dx;
} Step;

void step_clear (Step *s);

G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (Step, step_clear)

void run_step (Problem      *p,
               GmlpDevice   *device,
               GmlpMoELayer *layer,
               gboolean      offload,
               Step         *out);
void check_step (Problem      *p,
                 GmlpMoELayer *layer,
                 Step         *s,
                 gboolean      check_grads,
                 const char   *what);
void run_and_check (Problem      *p,
                    GmlpDevice   *device,
                    GmlpMoELayer *layer,
                    const char   *what);

/* test-moe-layer-errors.c */
void test_non_finite (void);
void test_bad_construction (void);
void test_bad_calls (void);

/* test-moe-layer-state.c */
void test_versions (void);
void test_properties (void);
void test_init_parameters (void);
void test_graph (void);
void test_main_grad_across_parts (void);
void test_backward_dw_no_partial_write (void);
