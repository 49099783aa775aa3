/* gmlp-cuda-route.h: which kernel or library runs a product
 *
 * gmlp_cuda_route() is the CUDA backend's one rule for that choice, a pure
 * function of a short description of the product (GmlpCudaRouteProduct),
 * the device's properties (read once, when the device opens) and the
 * device's tuning. gmlp_cuda_route_describe() fills the description from
 * the backend's descriptor, GmlpBackendGemm (with host sizes through
 * GmlpCudaGroups, the descriptor group by group); the backend's gemm entry
 * (gmlp-cuda-gemm-entry.c) adds the Hopper kernel's answer, asks the route
 * once and hands its answer to the executor of the route, for gemm and
 * gemm_supported alike. docs/routes.md states the rule as a table, with
 * the reason for each row.
 *
 * Nothing here includes CUDA: the description and the rule build and are
 * tested without it (tests/test-cuda-route.c links gmlp-cuda-route.c
 * alone).
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <glib.h>

#include "backend/gmlp-backend.h"
#include "backend/gmlp-backend-gemm.h"

G_BEGIN_DECLS

/* What the route reads of the device, read when it opens. */
typedef struct {
  int  major, minor;   /* the compute capability */
  int  n_sms;          /* streaming multiprocessors */
} GmlpCudaDeviceProps;

/* Which side takes the products with host sizes that both can do, where
 * the tuning's host_gemm forces one (for tests and comparisons): the
 * values of GmlpBackendTuning.host_gemm. */
typedef enum {
  GMLP_CUDA_HOST_GEMM_AUTO = 0,
  GMLP_CUDA_HOST_GEMM_CUBLAS = 1,
  GMLP_CUDA_HOST_GEMM_SM90 = 2,
} GmlpCudaHostGemm;

typedef enum {
  /* libgmlp's Hopper kernel, one launch for all groups. */
  GMLP_CUDA_ROUTE_SM90,
  /* The Hopper kernel on copies of the operands whose groups are padded to
   * multiples of 16 rows (blockwise FP8 WGRAD); the executor checks that
   * the kernel covers the padded product, else answers as
   * GMLP_CUDA_ROUTE_DEQUANTIZED does. */
  GMLP_CUDA_ROUTE_SM90_PADDED,
  /* The portable kernel (device sizes). */
  GMLP_CUDA_ROUTE_PORTABLE,
  /* One product per group, on two streams: cuBLASLt on a kept plan
   * (gmlp-cuda-blas-plans.c), else cublasGemmEx(). */
  GMLP_CUDA_ROUTE_CUBLAS_LOOP,
  /* One cublasGemmBatchedEx() for products all of one shape. */
  GMLP_CUDA_ROUTE_CUBLAS_BATCHED,
  /* One cublasGemmGroupedBatchedEx() (with row tiles batched first where
   * GmlpCudaRouteChoice.row_tiles says). */
  GMLP_CUDA_ROUTE_CUBLAS_GROUPED,
  /* One cublasLtMatmul() per group (FP8, per-tensor scales). */
  GMLP_CUDA_ROUTE_CUBLASLT,
  /* No FP8 product here: the backend's gemm_supported says so (gemm
   * would answer GMLP_ERROR_UNSUPPORTED before enqueuing anything), and
   * the layer multiplies dequantized operands instead
   * (gmlp-grouped-linear-fp8.c). */
  GMLP_CUDA_ROUTE_DEQUANTIZED,
  /* No product here, and no fall-back: GMLP_ERROR_UNSUPPORTED. */
  GMLP_CUDA_ROUTE_UNSUPPORTED,
} GmlpCudaRoute;

/* A descriptor with host sizes, group by group: each group's members (the
 * per-group pointer tables that cuBLAS and cuBLASLt take, built once by
 * gmlp_cuda_groups_init()), for the route's statistics and for the
 * executors that address the groups one by one (cuBLAS in
 * gmlp-cuda-gemm.c, cuBLASLt in gmlp-cuda-gemm-fp8.c; the Hopper kernel
 * takes them back as bases and tables, gmlp_cuda_groups_kernel_gemm()). */
typedef struct {
  GmlpGemmKind          kind;
  guint                 n_groups;
  const gint64         *rows;
  gint64                n;
  gint64                k;
  int                   ab_dtype;      /* a's dtype (FP8: a's format) */
  int                   b_dtype;
  int                   c_dtype;
  const void * const   *a;
  const void * const   *b;
  void * const         *c;
  const void * const   *bias;          /* FPROP, or NULL */
  const guint8         *accumulate;    /* WGRAD, or NULL */
  const float * const  *a_scale_inv;   /* FP8: each group's scales */
  const float * const  *b_scale_inv;
  GmlpBackendFp8Scales  a_scales;
  GmlpBackendFp8Scales  b_scales;
} GmlpCudaGroups;

/* The pointer tables of GmlpCudaGroups: a, b, c, bias and FP8's two
 * scales, GMLP_CUDA_GROUPS_TABLES × n_groups pointers in all. */
#define GMLP_CUDA_GROUPS_TABLES 6

/* The product of group g as C (rows × cols) = A (rows × depth) · B (cols ×
 * depth)ᵀ, in the K-major terms of the FP8 products. */
static inline void
gmlp_cuda_groups_shape (const GmlpCudaGroups *groups,
                        guint                 g,
                        gint64               *rows,
                        gint64               *cols,
                        gint64               *depth)
{
  gmlp_backend_gemm_group_shape (groups->kind, groups->rows[g], groups->n, groups->k, rows, cols, depth);
}

/* TRUE when group g adds into its output: WGRAD with the mask set. */
static inline gboolean
gmlp_cuda_groups_accumulates (const GmlpCudaGroups *groups,
                              guint                 g)
{
  return groups->kind == GMLP_GEMM_WGRAD && groups->accumulate != NULL && groups->accumulate[g];
}

/* A product as the route sees it. gmlp_cuda_route_describe() fills it from
 * the descriptor, before the executor checks the descriptor (a call that
 * fails the checks is refused whatever its route); for host sizes the
 * statistics count the groups with a GEMM to run ("products") and those
 * whose output is an empty sum, set to zero ("zeroed"). The sm90_ fields
 * are the Hopper kernel's answer, which the entry asks where
 * gmlp_cuda_route_asks_sm90() says the route reads it. */
typedef struct {
  gboolean       device_sizes;      /* the group sizes on the device */
  GmlpGemmKind   kind;
  int            ab_dtype;          /* GMLP_NUM_*; FP8: A's */
  int            c_dtype;
  gboolean       blockwise;         /* FP8 scales of 128-deep blocks */

  /* Host sizes. */
  guint          n_products;
  guint          n_zeroed;
  double         total_flop;        /* 2 m n k over the products */
  gboolean       aligned;           /* every product's pointers on 16 bytes */
  gboolean       uniform;           /* every product of one shape and beta */
  gint64         rows;              /* the rows of all groups */
  gint64         tiled_rows;        /* of those, the rows in whole row tiles */
  gboolean       rows_aligned;      /* every group a multiple of 16 rows */

  /* Whether libgmlp's Hopper kernel covers the product on this device
   * (gmlp_kernel_device_gemm_sm90_check(), the operands' layout, and the
   * tuning's device_gemm), and if not why. */
  gboolean       sm90_covers;
  const char    *sm90_reason;
  /* The operands are not laid out as the kernel addresses them (host
   * sizes): sm90_reason says so, whatever the tuning. */
  gboolean       sm90_unpacked;
} GmlpCudaRouteProduct;

typedef struct {
  GmlpCudaRoute  route;
  /* GMLP_CUDA_ROUTE_CUBLAS_GROUPED: the whole 128-row tiles of FPROP and
   * DGRAD run as one batched call first. */
  gboolean       row_tiles;
  /* GMLP_CUDA_ROUTE_DEQUANTIZED and _UNSUPPORTED: why (a static string). */
  const char    *reason;
} GmlpCudaRouteChoice;

/* The rows of the cuBLAS path's row tiles. */
#define GMLP_CUDA_ROW_TILE 128

/* From this many products on, one launch for all can beat a tuned call
 * each. */
#define GMLP_CUDA_GROUPED_MIN_PRODUCTS 16

/* The reason of GMLP_CUDA_ROUTE_UNSUPPORTED for FP8 with per-tensor scales
 * on a GPU without FP8 tensor cores (the entry point words the error). */
extern const char gmlp_cuda_route_no_fp8_tensor_cores[];

GmlpCudaRouteChoice gmlp_cuda_route (const GmlpCudaRouteProduct  *product,
                                     const GmlpCudaDeviceProps   *props,
                                     const GmlpBackendTuning     *tuning);

/* Whether n_products products of total_flop FLOP in all run best as one
 * grouped launch rather than as one tuned call each. */
gboolean  gmlp_cuda_route_prefer_grouped (guint  n_products,
                                          double total_flop);

/* The groups of a descriptor with host sizes; tables holds
 * GMLP_CUDA_GROUPS_TABLES × n_groups pointers, zeroed. */
void      gmlp_cuda_groups_init          (const GmlpBackendGemm  *gemm,
                                          gpointer               *tables,
                                          GmlpCudaGroups         *groups);

/* The description of a descriptor: groups is its GmlpCudaGroups with host
 * sizes, NULL with device sizes. The sm90_ fields are left unset. */
void      gmlp_cuda_route_describe       (const GmlpBackendGemm  *gemm,
                                          const GmlpCudaGroups   *groups,
                                          GmlpCudaRouteProduct   *product);

/* Whether the route reads the Hopper kernel's answer for a described
 * product: with device sizes and blockwise scales always, otherwise where
 * there is a product to run. */
gboolean  gmlp_cuda_route_asks_sm90      (const GmlpCudaRouteProduct *product);

/* Whether the route may answer GMLP_CUDA_ROUTE_DEQUANTIZED for a
 * descriptor, or GMLP_CUDA_ROUTE_SM90_PADDED, which may answer as it does:
 * only for FP8 operands with device sizes, or with blockwise scales and at
 * least one group (host sizes; with none there is nothing to multiply).
 * The backend's gemm_supported says yes at once where it may not. */
gboolean  gmlp_cuda_route_may_dequantize (const GmlpBackendGemm  *gemm);

/* The route's name, as docs/routes.md writes it. */
const char *gmlp_cuda_route_name         (GmlpCudaRoute route);

G_END_DECLS
