/* test-moe-layer-fp8.h: what the parts of test-moe-layer-fp8 share
 *
 * The recipes, the float64 reference of an FP8 MoE layer's step
 * (test-moe-layer-fp8-reference.c), and layers made from a problem with
 * the checks of a step against it (test-moe-layer-fp8-check.c). The tests
 * are in test-moe-layer-fp8.c (recipes, properties, padding, refused
 * recipes) and test-moe-layer-fp8-between.c (a recipe changed between a
 * forward and its backward, partial steps); see test-moe-layer-fp8.c for
 * the reference's definition.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <locale.h>
#include <math.h>
#include <string.h>

#include "gmlp-test-util.h"
#include "gmlp-test-router-ref.h"
#include "gmlp-quantizer-private.h"

#define T_TOKENS  128
#define HIDDEN    32
#define FFN       32
#define N_EXPERTS 4
#define TOP_K     2
#define MARGIN    1e-4

static const GmlpScalingRecipe all_recipes[] = {
  GMLP_SCALING_RECIPE_DELAYED, GMLP_SCALING_RECIPE_CURRENT,
  GMLP_SCALING_RECIPE_BLOCKWISE, GMLP_SCALING_RECIPE_MXFP8,
};
static const GmlpQuantizerRole all_roles[] = {
  GMLP_QUANTIZER_ROLE_INPUT, GMLP_QUANTIZER_ROLE_WEIGHT, GMLP_QUANTIZER_ROLE_GRAD_OUTPUT,
};

GmlpLinearFlags layer_flags (GmlpDType dtype);

typedef struct {
  const char *name;
  guint       padding;
  gint64      shared;     /* shared-expert-ffn-hidden */
} Config;

static const Config configs[] = {
  { "plain", 0, 0 },
  { "padding16-shared", 16, 16 },
  { "padding128", 128, 0 },
  { "padding32-shared", 32, 48 },
};

/* ---- The float64 experts, quantized as the layer quantizes ------------- */

/* An MLP's parameters as stored (n groups, SwiGLU: FC1 is 2 × ffn wide),
 * or its gradients. */
typedef struct {
  guint    n;
  gint64   ffn, w1o;
  gboolean has_bias;
  double  *w1, *b1, *w2, *b2;   /* n × w1o × H, n × w1o, n × H × ffn, n × H (0 without bias) */
} Mlp;

Mlp *mlp_new (guint  n,
              gint64 ffn);
void mlp_free (Mlp *m);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (Mlp, mlp_free)

/* The quantizers of an FP8 MLP, [layer][role] (FC1, FC2): copies of the
 * layer's, taken before the step. */
typedef struct {
  GmlpQuantizer *q[2][3];
} Quantizers;

void quantizers_clear (Quantizers *qs);
void quantizers_copy (Quantizers     *qs,
                      GmlpDevice     *device,
                      GmlpGroupedMLP *mlp);

typedef struct {
  double *y, *dx;      /* R × H */
  Mlp    *grad;
} MlpStep;

void mlp_step_clear (MlpStep *s);

G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (MlpStep, mlp_step_clear)

/* What the weight gradients multiply: the quantized operands (per-tensor
 * scales: their columnwise copies hold the same values), the columnwise
 * copies (blockwise, whose copies have blocks of their own), or the
 * quantized operands dequantized to BF16 (where no FP8 product takes
 * them: the CPU's device sizes, MXFP8; the layer's FP32 and BF16 dequantize
 * to BF16). */
typedef enum {
  WGRAD_QUANTIZED,
  WGRAD_COPIES,
  WGRAD_DEQUANTIZED,
} WgradOperands;

/* ---- A problem: parameters, data and the reference of a layer step ----- */

typedef struct {
  const Config *c;
  GmlpDType     dtype;
  double       *x, *dy;   /* T × H */
  double       *wg;       /* E × H, FP32 */
  Mlp          *experts, *shared;
} Problem;

/* The reference of a step, or what the layer gave (no routing then). */
typedef struct {
  gint64 *idx;      /* T × k, the reference's choices */
  double *probs;    /* T × k */
  double *y, *dx, *dwg;
  Mlp    *dexperts, *dshared;
} Step;

void step_clear (Step *s);

G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (Step, step_clear)

void problem_free (Problem *p);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (Problem, problem_free)

Problem *problem_new (const Config *c,
                      GmlpDType     dtype);
void problem_draw (Problem *p);
void problem_reference (const Problem *p,
                        Quantizers    *experts_q,
                        Quantizers    *shared_q,
                        WgradOperands  experts_wgrad,
                        WgradOperands  shared_wgrad,
                        GmlpDevice    *device,
                        Step          *out);
GmlpMoELayer *layer_new (GmlpDevice        *device,
                         const Config      *c,
                         GmlpDType          dtype,
                         GmlpScalingRecipe  recipe,
                         GError           **error);
GmlpMoELayer *problem_layer_flags (Problem           *p,
                                   GmlpDevice        *device,
                                   GmlpScalingRecipe  recipe,
                                   GmlpLinearFlags    flags);
GmlpMoELayer *problem_layer (Problem           *p,
                             GmlpDevice        *device,
                             GmlpScalingRecipe  recipe);
void run_step (const Problem *p,
               const Step    *ref,
               GmlpDevice    *device,
               GmlpMoELayer  *layer,
               Step          *got);
gboolean on_gpu (GmlpDevice *device);
double tolerance_fp8 (GmlpDevice *device);

/* The parts of a step checked so far: the largest error and where, and
 * how many times further the unquantized reference is, at least. */
typedef struct {
  const char *what;
  double      tol;
  double      worst;
  char       *worst_part;
  double      distance;
} Checks;

void check_step (Problem      *p,
                 GmlpDevice   *device,
                 GmlpMoELayer *layer,
                 const char   *what);

/* test-moe-layer-fp8-between.c */
void test_recipe_between (void);
void test_part_recipe_between (void);
void test_part_quantizer_state (void);
