/* test-grouped-linear-fp8.h: what the parts of test-grouped-linear-fp8 share
 *
 * The configurations, quantizers and problems, the references (a) and (b)
 * and the checks of a product against them
 * (test-grouped-linear-fp8-check.c). The tests are in
 * test-grouped-linear-fp8.c (recipes, shapes, tiles, caches, delayed
 * scaling, prequantized operands), test-grouped-linear-fp8-device-sizes.c
 * (device group sizes, long reductions) and
 * test-grouped-linear-fp8-calls.c (offload, bad input, properties, the
 * backend's descriptor).
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <locale.h>
#include <math.h>
#include <string.h>

#include "gmlp-test-util.h"
#include "gmlp-grouped-tensor-private.h"
#include "gmlp-quantizer-private.h"
#include "gmlp-saved-activations-private.h"
#include "backend/gmlp-backend-gemm.h"

static const GmlpScalingRecipe all_recipes[] = {
  GMLP_SCALING_RECIPE_DELAYED, GMLP_SCALING_RECIPE_CURRENT,
  GMLP_SCALING_RECIPE_BLOCKWISE, GMLP_SCALING_RECIPE_MXFP8,
};
static const GmlpFp8Format test_formats[] = { GMLP_FP8_FORMAT_E4M3, GMLP_FP8_FORMAT_HYBRID };
static const GmlpDType layer_dtypes[] = {
  GMLP_DTYPE_FLOAT32, GMLP_DTYPE_FLOAT16, GMLP_DTYPE_BFLOAT16,
};

/* (b): relative error (‖fp8 − bf16‖ / ‖bf16‖) of the FP8 layer against
 * the BF16 layer, per recipe and format, for normal inputs and gradients
 * and uniform weights; docs/fp8.md records the values measured. Index:
 * [recipe − 1][format is HYBRID][0 fprop, 1 dgrad, 2 wgrad]. */
static const double bound_b[4][2][3] = {
  /* DELAYED (after an update; the first step, with scale 1, is a little worse) */
  { { 0.06, 0.06, 0.06 }, { 0.06, 0.10, 0.10 } },
  /* CURRENT */
  { { 0.06, 0.06, 0.06 }, { 0.06, 0.10, 0.10 } },
  /* BLOCKWISE */
  { { 0.06, 0.06, 0.06 }, { 0.06, 0.10, 0.10 } },
  /* MXFP8 */
  { { 0.08, 0.08, 0.08 }, { 0.08, 0.13, 0.13 } },
};

gboolean per_tensor (GmlpScalingRecipe recipe);
gboolean multiplies_fp8 (GmlpDevice *device, GmlpScalingRecipe recipe);

/* ---- Layers, quantizers and data ----------------------------------------- */

typedef struct {
  GmlpQuantizer *input, *weight, *grad_output;
} Quantizers;

void quantizers_clear (Quantizers *q);
void quantizers_new (Quantizers *q, GmlpDevice *device, GmlpScalingRecipe recipe, GmlpFp8Format format,
                     guint history);
GmlpGroupedLinear *new_layer (GmlpDevice *device, guint n, gint64 k, gint64 o, GmlpDType dtype, GmlpLinearFlags flags,
                              const Quantizers *q);

/* A problem: shapes and fresh random data, as stored in the layer's dtype,
 * and the tensors holding them (the weights as a grouped tensor of their
 * own, for the test to quantize). */
typedef struct {
  guint              n;
  gint64             k, o;
  gint64            *rows;
  gint64             total;
  GmlpDType          dtype;
  double            *x, *w, *b, *dy;
  GBytes            *w_bytes, *b_bytes;
  GmlpGroupedTensor *xt, *dyt, *wt;
} Problem;

void problem_free (Problem *p);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (Problem, problem_free)

Problem *problem_new (GmlpGroupedLinear *layer, const gint64 *rows, double amplitude);

/* ---- References ----------------------------------------------------------- */

typedef struct {
  double *y, *dx, *dw, *db;
} Results;

void results_clear (Results *r);
void reference (const Problem *p, const double *x, const double *w, const double *dy,
                const double *dy_bias, Results *out);
void reference_wgrad_from_copies (const Problem *p, GmlpGroupedTensor *x8, GmlpGroupedTensor *dy8,
                                  const double *wq, Results *out);
void reference_quantized (const Problem *p, const Quantizers *q, gboolean wgrad_copies, Results *out);
gboolean wgrad_copies (GmlpDevice *device, GmlpScalingRecipe recipe);
double *download_weight_grads (GmlpGroupedLinear *layer, guint n, gint64 len);
void assert_groups_close (const double *got, const double *want, guint n, const gint64 *len,
                          double tol, const char *what);

/* Whether the suite runs on a GPU (see tolerance_a()). */
extern gboolean on_gpu;

GmlpDevice *device_or_skip (void);
double tolerance_a (GmlpDType dtype, gboolean dequantized);

/* What one forward and backward gave. */
typedef struct {
  double *y, *dx, *dw, *db;
  gsize   n_y, n_dx;
} Outputs;

void outputs_clear (Outputs *o);
void run_layer (GmlpGroupedLinear *layer, const Problem *p, Outputs *out);
void check_a (const Problem *p, const Results *ref, const Outputs *out, double tol, double tol_dw,
              const double *dw_base, const gboolean *accumulate, const char *what);
void measure_b (GmlpDevice *device, const Problem *p, GmlpLinearFlags flags, const Outputs *fp8,
                double err[3]);

/* test-grouped-linear-fp8-device-sizes.c */
void test_long_reduction (void);
void test_device_sizes (void);

/* test-grouped-linear-fp8-calls.c */
void test_offload (void);
void test_offload_parts (void);
void test_bad_input (void);
void test_properties (void);
void test_descriptor_layout (void);
