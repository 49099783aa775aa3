/* test-quantizer.h: what the parts of test-quantizer share
 *
 * The configurations, the float64 reference of each recipe and the checks
 * of a quantized tensor against it (test-quantizer-check.c). The tests are
 * in test-quantizer.c (recipes, special values, device sizes, columnwise),
 * test-quantizer-delayed.c (delayed scaling's state, powers of 2) and
 * test-quantizer-calls.c (bad input, conversion, state ranges, properties,
 * the CPU against the GPU).
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <float.h>
#include <locale.h>
#include <math.h>
#include <string.h>

#include "gmlp-test-util.h"
#include "gmlp-grouped-tensor-private.h"
#include "gmlp-quantizer-private.h"

static const GmlpScalingRecipe all_recipes[] = {
  GMLP_SCALING_RECIPE_DELAYED, GMLP_SCALING_RECIPE_CURRENT,
  GMLP_SCALING_RECIPE_BLOCKWISE, GMLP_SCALING_RECIPE_MXFP8,
};
static const GmlpQuantizerRole all_roles[] = {
  GMLP_QUANTIZER_ROLE_INPUT, GMLP_QUANTIZER_ROLE_WEIGHT, GMLP_QUANTIZER_ROLE_GRAD_OUTPUT,
};
static const GmlpDType source_dtypes[] = {
  GMLP_DTYPE_FLOAT32, GMLP_DTYPE_FLOAT16, GMLP_DTYPE_BFLOAT16,
};

typedef struct {
  GmlpScalingRecipe  recipe;
  GmlpQuantizerRole  role;
  GmlpFp8Format      format;
  gboolean           pow2;
  gboolean           columnwise;
  guint              history;     /* delayed scaling */
  int                margin;
} Config;

GmlpDType config_dtype (const Config *c);
void config_blocks (const Config *c,
                    gboolean      columnwise,
                    gint64       *br,
                    gint64       *bc);
gint64 blocks_along (gint64 n, gint64 block);
GmlpQuantizer *config_quantizer (GmlpDevice   *device,
                                 const Config *c);
Config random_config (GmlpScalingRecipe recipe,
                      GmlpQuantizerRole role,
                      gboolean          columnwise);
double fp8_max (GmlpDType fp8);

/* What a block is quantized with, in float64. */
typedef struct {
  double    mult;        /* x × mult is rounded to FP32, then to FP8 */
  double    scale_inv;   /* NaN for an MX block with the NaN scale */
  int       e8m0;
  gboolean  nan_block;
} RefScale;

double to_float (double x);

/* The expected outputs of one quantize call, packed as to_bytes() gives
 * them. */
typedef struct {
  double  *data;          /* rowwise, or the columnwise copy */
  double  *elem_scale_inv;/* the scale inverse of each element of data */
  double  *elem_mult;     /* and what it was multiplied by */
  double  *scales;        /* FP32 scale inverses */
  guint8  *e8m0;          /* MXFP8 scales */
  gsize    n_data;
  gsize    n_scales;
  double  *amax;          /* per group, NaN left out (delayed scaling) */
} RefOut;

GBytes *download (GmlpGroupedTensor *t);
void assert_bytes_equal (GBytes *a, GBytes *b, const char *what);
void check_quantized (GmlpGroupedTensor *q,
                      const Config      *c,
                      const double      *x,
                      const gint64      *rows,
                      guint              n,
                      gint64             k,
                      const double      *delayed);
GmlpGroupedTensor *random_source (GmlpDevice    *device,
                                  GmlpDType      dtype,
                                  const gint64  *rows,
                                  guint          n,
                                  gint64         k,
                                  double         scale,
                                  gboolean       specials,
                                  double       **values);
double *ones (guint n);

/* test-quantizer.c */
GmlpGroupedTensor *sizes_tensor (GmlpDevice *device, const gint64 *rows, guint n);

/* test-quantizer-delayed.c */
void test_delayed (void);
void test_state (void);
void test_power_of_2 (void);

/* test-quantizer-calls.c */
void test_bad_input (void);
void test_convert (void);
void test_state_range (void);
void test_properties (void);
void test_cpu_gpu_identical (void);
