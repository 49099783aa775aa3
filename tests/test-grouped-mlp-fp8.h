/* test-grouped-mlp-fp8.h: what the parts of test-grouped-mlp-fp8 share
 *
 * The recipes and the checks of the fused activation + quantization
 * (test-grouped-mlp-fp8-check.c), and the FP8 MLP's problems with their
 * float64 reference and bounds (test-grouped-mlp-fp8-reference.c). The
 * tests are in test-grouped-mlp-fp8.c (the fused pass, the MLP's step),
 * test-grouped-mlp-fp8-device-sizes.c (device group sizes) and
 * test-grouped-mlp-fp8-calls.c (bad input, properties, the weight cache).
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <locale.h>
#include <math.h>
#include <string.h>

#include "gmlp-test-util.h"
#include "gmlp-grouped-mlp-private.h"
#include "gmlp-quantizer-private.h"

static const GmlpScalingRecipe all_recipes[] = {
  GMLP_SCALING_RECIPE_DELAYED, GMLP_SCALING_RECIPE_CURRENT,
  GMLP_SCALING_RECIPE_BLOCKWISE, GMLP_SCALING_RECIPE_MXFP8,
};
static const GmlpActivation activations[] = {
  GMLP_ACTIVATION_GELU, GMLP_ACTIVATION_RELU, GMLP_ACTIVATION_SRELU,
  GMLP_ACTIVATION_SWIGLU, GMLP_ACTIVATION_GEGLU,
};
static const char *const activation_names[] = { "gelu", "relu", "srelu", "swiglu", "geglu" };

/* Bounds of the relative errors (‖fp8 − bf16‖ / ‖bf16‖) of the FP8 MLP
 * (HYBRID) against the BF16 MLP with the same parameters; docs/fp8.md
 * records the errors measured on the CPU. The float64 reference of the
 * exact MLP is held to the same bounds. Index: [recipe − 1][ReLU][0 y,
 * 1 dx, 2 fc1 dW, 3 fc2 dW]. ReLU's backward is apart: its gradient jumps
 * at 0, and the few elements of FC1's output that FP8 moves across 0 get
 * the whole of da or nothing (the BF16 MLP shows the same, at a tenth). */
static const double bounds[4][2][4] = {
  /* DELAYED (scale 1 in the first step of a fresh MLP) */
  { { 0.07, 0.12, 0.12, 0.10 }, { 0.07, 0.24, 0.24, 0.10 } },
  /* CURRENT */
  { { 0.07, 0.12, 0.12, 0.10 }, { 0.07, 0.24, 0.24, 0.10 } },
  /* BLOCKWISE */
  { { 0.07, 0.12, 0.12, 0.10 }, { 0.07, 0.24, 0.24, 0.10 } },
  /* MXFP8 */
  { { 0.11, 0.15, 0.15, 0.14 }, { 0.11, 0.28, 0.28, 0.14 } },
};

const double *bounds_for (GmlpScalingRecipe recipe, GmlpActivation act);

static const char *const output_names[] = { "y", "dx", "fc1 wgrad", "fc2 wgrad" };

gboolean gated (GmlpActivation act);
double act_df (GmlpActivation act, double x);
void assert_same_quantized (GmlpGroupedTensor *a, GmlpGroupedTensor *b, const char *what);
void assert_same_state (GmlpQuantizer *a, GmlpQuantizer *b, const char *what);
GmlpQuantizer *new_input_quantizer (GmlpDevice *device, GmlpScalingRecipe recipe, GmlpFp8Format format,
                                    gboolean pow2, guint n_groups, double amax_source);
void check_fused (GmlpDevice *device, GmlpActivation act, GmlpDType dtype, GmlpScalingRecipe recipe,
                  GmlpFp8Format format, gboolean columnwise, guint n, gint64 ffn);

/* ---- The FP8 MLP --------------------------------------------------------- */

/* A problem: the MLP's shapes, fresh data and parameters as stored (BF16),
 * packed, in double. */
typedef struct {
  guint           n;
  gint64         *rows;
  gint64          total, hid, ffn, w1o;
  GmlpActivation  act;
  double         *x, *dy, *w1, *b1, *w2, *b2;
  GmlpGroupedTensor *xt, *dyt;
} Problem;

void problem_free (Problem *p);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (Problem, problem_free)

typedef struct {
  double *y, *dx, *dw1, *dw2, *db1, *db2;
} Outputs;

void outputs_clear (Outputs *o);
Problem *problem_new (GmlpGroupedMLP *mlp, const gint64 *rows, double amplitude);
void reference (const Problem *p, Outputs *out);
void run_mlp (GmlpGroupedMLP *mlp, const Problem *p, Outputs *out);
void copy_parameters (GmlpGroupedMLP *from, GmlpGroupedMLP *to);
GmlpGroupedMLP *new_mlp (GmlpDevice *device, guint n, gint64 hid, gint64 ffn, GmlpActivation act,
                         GmlpScalingRecipe recipe, GmlpLinearFlags extra);
void measure (const Problem *p, const Outputs *fp8, const Outputs *bf16, const double *bound,
              double err[4], double exact_err[4], const char *what);

/* test-grouped-mlp-fp8.c */
void test_recipes (void);

/* test-grouped-mlp-fp8-calls.c */
void test_bad_input (void);
void test_properties (void);
void test_weight_cache (void);

/* test-grouped-mlp-fp8-device-sizes.c */
void test_device_sizes_fused (void);
void test_device_sizes (void);
