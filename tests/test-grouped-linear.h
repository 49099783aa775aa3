/* test-grouped-linear.h: what the parts of test-grouped-linear share
 *
 * Problems with their float64 references, layers made for them and the
 * checks of a step (test-grouped-linear-check.c). The tests are in
 * test-grouped-linear.c (numbers, shapes, bad input, properties),
 * test-grouped-linear-contract.c (the gradient contract, wgrad-ready,
 * microbatches), test-grouped-linear-device-sizes.c (group sizes on the
 * device) and test-grouped-linear-versions.c (tensor versions and
 * aliasing).
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <locale.h>
#include <math.h>
#include <string.h>

#include "gmlp-test-util.h"
/* Host views over tensors with device sizes, and raw device copies. */
#include "gmlp-grouped-tensor-private.h"

static const GmlpDType layer_dtypes[] = {
  GMLP_DTYPE_FLOAT32, GMLP_DTYPE_FLOAT16, GMLP_DTYPE_BFLOAT16,
};

/* A problem: the layer's shapes and fresh random data, with its float64
 * reference results. */
typedef struct {
  guint      n;
  gint64     k, o;            /* in_features, out_features */
  gint64    *rows;
  gint64     total;
  GmlpDType  dtype;
  double    *x, *w, *b, *dy;  /* as stored */
  double    *y, *dx, *dw, *db; /* references */
  /* What bounds the error of db's FP32 sums: per group and column Σ |dy|,
   * and per group the number of terms. */
  double    *db_abs;
  gint64    *db_terms;
} Problem;

void problem_free (Problem *p);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (Problem, problem_free)

void problem_reference (Problem *p);
double unit_roundoff (GmlpDType dtype);
double gamma32 (gint64 n);
void assert_dbias_group (const double *got, const Problem *p, guint g, const char *what);
void check_dbias (GmlpGroupedTensor *t, const Problem *p, const char *what);
GBytes *encode_values (const double *values, gsize n, GmlpDType dtype);
Problem *problem_new (GmlpGroupedLinear  *layer,
                      const gint64       *rows,
                      GmlpGroupedTensor **x,
                      GmlpGroupedTensor **dy);
void assert_groups_close (const double *got, const double *want, const Problem *p,
                          const gint64 *group_len, double tol, const char *what);
void check_output (GmlpGroupedTensor *t, const double *want, const Problem *p, gint64 cols,
                   const char *what);
void check_per_group (GmlpGroupedTensor *t, const double *want, const Problem *p, gint64 len,
                      double tol, const char *what);
GmlpGroupedLinear *new_layer (GmlpDevice *device, guint n, gint64 k, gint64 o, GmlpDType dtype, GmlpLinearFlags flags);
GmlpGroupedTensor *sizes_tensor (GmlpDevice *device, const gint64 *sizes, guint n);
gint64 *fitting_rows (const gint64 *sizes, guint n, gint64 capacity, const gint64 *row_bytes, guint n_ops);
void assert_only_rows_written (GmlpGroupedTensor *t, const gint64 *sizes, const gint64 *rows);
void move_sizes_to_device (GmlpGroupedTensor **x, GmlpGroupedTensor **dy, const gint64 *rows, guint n,
                           gint64 slack);
gboolean on_cpu (GmlpDevice *device);
void run_and_check (GmlpGroupedLinear *layer, const gint64 *rows);

/* test-grouped-linear-contract.c */
void run_contract (gboolean device_sizes);
void test_contract (void);
void test_wgrad_ready (void);
void run_microbatches (gboolean device_sizes);
void test_microbatches (void);

/* test-grouped-linear-device-sizes.c */
void test_tiny_groups (void);
void test_device_sizes_numerics (void);
void test_device_sizes_shapes (void);
void test_device_sizes_many_tiles (void);
void test_device_sizes_tiles (void);
void test_device_sizes_long_reduction (void);
void test_device_sizes_direct (void);
void test_device_sizes_same_as_host (void);
void test_dbias_cancellation (void);
void test_device_sizes_bias_rounding (void);
void test_device_sizes_contract (void);
void test_device_sizes_microbatches (void);
void test_device_sizes_bad_input (void);
void test_device_sizes_offload (void);

/* test-grouped-linear-versions.c */
void test_versions_writes (void);
void test_versions_changed (void);
void test_versions_changed_fp8 (void);
void test_versions_delayed (void);
void test_main_grad_aliasing (void);
