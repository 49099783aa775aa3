/* gemm-case.h: one grouped product of gmlp-kernels.h, its operands laid out
 * as libgmlp's CUDA backend lays them out, and its float64 reference
 *
 * A GemmCase holds a host image of every allocation the product reads or
 * writes (grouped operands at gmlp_num_member_stride() offsets, FP8 scale
 * tables as the quantizer writes them), the values those images stand for
 * (FP8 codes times their scales) and the reference worked out from them in
 * float64. The images go to the device with gemm_case_upload(); the
 * outputs come back and are compared with gemm_case_check().
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <glib.h>

#include "gmlp-kernels.h"
#include "gmlp-numeric.h"

G_BEGIN_DECLS

typedef struct {
  const char *name;
  int         ab_dtype;    /* A's (and B's, for 16-bit operands) */
  int         b_dtype;     /* B's, FP8 only */
  int         c_dtype;
  gboolean    blockwise;   /* FP8: 1 × 128 rows and 128 × 128 tiles */
} GemmDtypes;

typedef struct {
  const char    *name;
  guint          n_groups;
  const gint64  *rows;       /* NULL: random sizes 0 .. max_random */
  gint64         max_random;
  gint64         n;
  gint64         k;
  gboolean       device_only;  /* negative sizes, cuts: only the device's are so */
  gint64         cut;          /* the capacity this many rows short of the sizes */
} GemmShape;

typedef enum {
  GEMM_VARIANT_PLAIN = 0,
  GEMM_VARIANT_BIAS,         /* FPROP: a bias per group */
  GEMM_VARIANT_ACCUMULATE,   /* WGRAD: every other group adds into its output */
  GEMM_VARIANT_SCATTERED,    /* FPROP, DGRAD: weights not equally spaced */
  GEMM_N_VARIANTS,
} GemmVariant;

typedef struct {
  GmlpKernelGemmKind  kind;
  const GemmDtypes   *dtypes;
  const GemmShape    *shape;
  gboolean            device_rows;
  GemmVariant         variant;
} GemmProblem;

/* One allocation: its host image and, once uploaded, its device copy.
 * bytes is what the product may touch; a poisoned guard follows. */
typedef struct {
  guint8 *host;
  void   *device;
  gsize   bytes;
} GemmBuffer;

enum { GEMM_GUARD_BYTES = 4096 };

typedef struct {
  GemmProblem          p;
  guint                n_groups;
  gint64               n;
  gint64               k;
  gint64              *rows;        /* the sizes given to the kernel */
  gint64              *kept;        /* the rows of each that fit in the capacity */
  gint64               capacity;
  gint64               total_rows;  /* Σ kept */
  gint64              *first_row;   /* group i's first kept row among all groups' */
  GemmBuffer           a;
  GemmBuffer           b_rows;
  GemmBuffer           c_rows;
  GemmBuffer           weight;
  GemmBuffer           wgrad;
  GemmBuffer           bias;
  GemmBuffer           a_scales;
  GemmBuffer           b_scales;
  GemmBuffer           device_rows;
  guint8              *c_start;     /* the output's image before the call (poison, priors) */
  struct {
    guint64  row_bytes;
    gint64   block;
    guint64 *offsets;
  }                    prefixes[8];  /* member offsets by layout (member_offset()) */
  guint64             *weight_offset;
  guint64             *wgrad_offset;
  guint64             *bias_offset;
  guint8              *accumulate;
  GmlpKernelFp8Scales  a_layout;
  GmlpKernelFp8Scales  b_layout;
  /* The values as stored, in float64: FPROP x (rows × k) and W (n × k);
   * DGRAD dy (rows × n) and W (n × k); WGRAD dy (rows × n) and x (rows × k). */
  double              *a_values;
  double              *b_values;
  double              *bias_values;  /* n_groups × n */
  double              *prior;        /* WGRAD: n_groups × n × k, the accumulated groups' */
  double              *want;         /* the reference, laid out as the outputs' values */
  /* The kernel's arguments (gemm_case_describe()), and its tables. */
  GmlpKernelDeviceGemm gemm;
  const void         **weight_table;
  void               **wgrad_table;
  const void         **bias_table;
  const float        **a_scale_table;
  const float        **b_scale_table;
} GemmCase;

/* The columns of the output's rows (WGRAD: of each wgrad_i), and the
 * reduction's depth (WGRAD: the rows of all groups). */
gint64       gemm_case_out_cols   (const GemmCase *c);
gint64       gemm_case_depth      (const GemmCase *c);

/* with_values FALSE: the layouts and tables only (for _check). */
GemmCase    *gemm_case_new        (const GemmProblem *p,
                                   guint32            seed,
                                   gboolean           with_values);
void         gemm_case_free       (GemmCase          *c);
void         gemm_case_reference  (GemmCase          *c);
/* The reference again, the slow way: every value read back from the
 * images through the layouts of gmlp-kernels.h (the CPU self-test). */
double      *gemm_case_naive      (const GemmCase    *c);
/* Whether every image's guard is still poison: nothing was laid out past
 * the allocations' sizes. */
gboolean     gemm_case_images_fit (const GemmCase    *c);
/* Fills in c->gemm with the device copies (on_device) or the host images
 * (for _check alone, which reads no data). */
void         gemm_case_describe   (GemmCase          *c,
                                   gboolean           on_device);
gboolean     gemm_case_upload     (GemmCase          *c,
                                   GError           **error);
/* Writes the outputs' starting image (poison, priors) to the device. */
gboolean     gemm_case_reset      (GemmCase          *c,
                                   cudaStream_t       stream,
                                   GError           **error);
/* Downloads the outputs and compares them with the reference within tol
 * (relative, in the 2-norm, per group); FALSE and why in *message. */
gboolean     gemm_case_check      (GemmCase          *c,
                                   double             tol,
                                   char             **message);
double       gemm_case_tolerance  (const GemmCase    *c);
char        *gemm_problem_name    (const GemmProblem *p);

/* The norm comparison of the library's tests (gmlp_test_assert_close). */
gboolean     gemm_close           (const double      *got,
                                   const double      *want,
                                   gsize              n,
                                   double             tol,
                                   char             **message);

/* Whether the first CUDA device is usable: its compute capability. */
gboolean     gemm_cuda_device     (int               *major,
                                   int               *minor,
                                   int               *n_sms);

G_END_DECLS
