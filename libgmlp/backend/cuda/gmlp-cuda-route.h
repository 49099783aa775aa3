/* gmlp-cuda-route.h: which kernel or library runs a product
 *
 * gmlp_cuda_route() is the CUDA backend's one rule for that choice, a pure
 * function of a short description of the product (what validation found
 * out about it, and whether libgmlp's Hopper kernel covers it), the
 * device's properties (read once, when the device opens) and the device's
 * tuning. The backend's gemm entry (gmlp-cuda-gemm-entry.c) hands the
 * descriptor to the executors' files, which describe the product, ask, and
 * run the executor of the route. docs/routes.md states the rule as a table, with
 * the reason for each row.
 *
 * Nothing here includes CUDA: the rule builds and is tested without it
 * (tests/test-cuda-route.c links gmlp-cuda-route.c alone).
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <glib.h>

#include "backend/gmlp-backend.h"

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

/* A product as the route sees it. The executor's file fills it from the
 * checked descriptor; for host sizes the statistics count the groups with a
 * GEMM to run ("products") and those whose output is an empty sum, set
 * to zero ("zeroed"). */
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
  /* The operands are not laid out as the kernel addresses them (FP8 with
   * host sizes): sm90_reason says so, whatever the tuning. */
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

/* All the rows of n_groups groups, and those that lie in whole row
 * tiles. */
void      gmlp_cuda_route_count_rows     (const gint64  *rows,
                                          guint          n_groups,
                                          gint64        *total,
                                          gint64        *tiled);

/* Whether every group has a multiple of 16 rows. */
gboolean  gmlp_cuda_route_rows_aligned   (const gint64  *rows,
                                          guint          n_groups);

/* The route's name, as docs/routes.md writes it. */
const char *gmlp_cuda_route_name         (GmlpCudaRoute route);

G_END_DECLS
