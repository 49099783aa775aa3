/* gmlp-cuda-blas-plans.h: one-group 16-bit and FP32 products on cuBLASLt,
 * planned once per problem
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <glib.h>

#include <cublas_v2.h>
#include <cublasLt.h>
#include <cuda_runtime_api.h>

G_BEGIN_DECLS

typedef struct _GmlpCudaBlasPlans GmlpCudaBlasPlans;

/* One product in cuBLAS's column-major terms, as cublasGemmEx takes it:
 * C = alpha op(A) op(B) + beta C, alpha = 1, beta 0 or 1, sums in FP32. */
typedef struct {
  cublasOperation_t  transa;
  cublasOperation_t  transb;
  int                m, n, k;
  int                lda, ldb, ldc;
  cudaDataType_t     ab_type;
  cudaDataType_t     c_type;
  const void        *a;
  const void        *b;
  void              *c;
  float              beta;
} GmlpCudaBlasProduct;

guint32            gmlp_cuda_blas_pointer_alignment (const void *p);

GmlpCudaBlasPlans *gmlp_cuda_blas_plans_new  (void);
void               gmlp_cuda_blas_plans_free (GmlpCudaBlasPlans *plans);

/* Enqueues p on stream through cuBLASLt (handle, with workspace of
 * workspace_bytes), with the plan kept for p's problem, made now if there is
 * none. Returns CUBLAS_STATUS_NOT_SUPPORTED, having enqueued nothing, where
 * cuBLASLt has no algorithm for the problem: the caller runs it elsewhere. */
cublasStatus_t     gmlp_cuda_blas_plans_run  (GmlpCudaBlasPlans         *plans,
                                              cublasLtHandle_t           handle,
                                              const GmlpCudaBlasProduct *p,
                                              void                      *workspace,
                                              gsize                      workspace_bytes,
                                              cudaStream_t               stream);

G_END_DECLS
