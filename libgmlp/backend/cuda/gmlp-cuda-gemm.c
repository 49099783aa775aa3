/* gmlp-cuda-gemm.c: the grouped products of the CUDA backend, on cuBLAS
 *
 * The backend's matrices are row-major and cuBLAS's column-major. A
 * row-major r × c matrix with leading dimension c is the column-major c × r
 * matrix of its transpose, so each product is computed transposed, with the
 * operands swapped (m_i, n, k are the backend's sizes; cuBLAS computes
 * C' = op(A') op(B') with A' and B' below):
 *
 *   FPROP  C = A Bᵀ   Cᵀ[n × m_i] = B · Aᵀ: A' = B (k × n, ld k) transposed,
 *                     B' = A (k × m_i, ld k) as is; K = k, ldc = n
 *   DGRAD  C = A B    Cᵀ[k × m_i] = Bᵀ · Aᵀ: A' = B (k × n, ld k) as is,
 *                     B' = A (n × m_i, ld n) as is; K = n, ldc = k
 *   WGRAD  C = Aᵀ B   Cᵀ[k × n] = Bᵀ · A: A' = B (k × m_i, ld k) as is,
 *                     B' = A (n × m_i, ld n) transposed; K = m_i, ldc = k
 *
 * Sums are in FP32 (CUBLAS_COMPUTE_32F, which for FP32 operands is true
 * FP32: the handle's math mode allows no TF32). WGRAD accumulation into C is
 * beta = 1, which cuBLAS fuses into the GEMM's epilogue. An FPROP's bias
 * joins the FP32 sum before C's one rounding in the Hopper kernel's
 * epilogue; on the cuBLAS routes it is added to C afterwards
 * (gmlp_cuda_add_bias()): cuBLAS adding into a 16-bit C (beta = 1) rounds
 * the product first anyway, so C holding the bias first would only cost a
 * memset.
 *
 * gmlp_cuda_gemm_groups() checks the call and runs the route that the
 * entry asked gmlp_cuda_route() for (gmlp-cuda-gemm-entry.c,
 * gmlp-cuda-route.c, docs/routes.md): libgmlp's Hopper kernel (many small
 * products; WGRAD of unequal mid-sized ones), cuBLAS's batched and grouped
 * calls for many small products, one batched call for mid-sized products
 * all of one shape, or one product per group, alternating between two
 * streams (on cuBLASLt with a plan kept per problem,
 * gmlp-cuda-blas-plans.c, else cublasGemmEx()); the executors of the cuBLAS
 * routes are here.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <stdlib.h>

#include "gmlp-numeric.h"
#include "gmlp-cuda-private.h"

/* cuBLAS's recommended workspace on Hopper and later: enough for every
 * kernel it picks there. */
#define GMLP_CUDA_CUBLAS_WORKSPACE (32u << 20)

/* What one group of a product asks for. */
typedef enum {
  GMLP_CUDA_GROUP_SKIP,   /* nothing to write */
  GMLP_CUDA_GROUP_ZERO,   /* an empty sum, C_i = 0: a memset, not cuBLAS */
  GMLP_CUDA_GROUP_GEMM,
} GmlpCudaGroupWork;

/* One product in cuBLAS's terms (column-major, see the top), as the kept
 * cuBLASLt plans, cublasGemmEx() and the batched and grouped calls take it. */
typedef GmlpCudaBlasProduct GmlpCudaProduct;

/* The operands' and the output's types in cuBLAS's terms, once checked. */
typedef struct {
  cudaDataType_t  ab_type;
  cudaDataType_t  c_type;
} GmlpCudaGemmPlan;

static const char *
gmlp_cuda_gemm_kind_name (GmlpGemmKind kind)
{
  switch (kind)
    {
    case GMLP_GEMM_FPROP: return "FPROP";
    case GMLP_GEMM_DGRAD: return "DGRAD";
    case GMLP_GEMM_WGRAD: return "WGRAD";
    default:              return "?";
    }
}

static int
gmlp_cuda_cublas_error_code (cublasStatus_t status)
{
  switch (status)
    {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return GMLP_ERROR_OUT_OF_MEMORY;
    case CUBLAS_STATUS_INVALID_VALUE:
      return GMLP_ERROR_INVALID_ARGUMENT;
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return GMLP_ERROR_UNSUPPORTED;
    default:
      return GMLP_ERROR_BACKEND;
    }
}

/* Reports a failed call of cuBLAS or cuBLASLt (library); detail says
 * which product. A failed launch inside the library may have left a
 * runtime error on this thread: it is cleared, as gmlp_cuda_fail() does. */
gboolean
gmlp_cuda_blas_fail (GError         **error,
                     const char      *library,
                     const char      *what,
                     cublasStatus_t   status,
                     const char      *detail_format,
                     ...)
{
  g_autofree char *detail = NULL;
  va_list args;

  (void) cudaGetLastError ();

  va_start (args, detail_format);
  detail = g_strdup_vprintf (detail_format, args);
  va_end (args);

  g_set_error (error, GMLP_CUDA_ERROR, gmlp_cuda_cublas_error_code (status),
               "%s: %s failed: %s (%s)",
               library, what, cublasGetStatusName (status), detail);
  return FALSE;
}

/* A cuBLAS handle bound to stream, with a workspace of its own from the
 * pool (taken in the compute stream's order, before any use on stream). */
static gboolean
gmlp_cuda_cublas_handle_init (GmlpBackendDevice  *device,
                              cudaStream_t        stream,
                              cublasHandle_t     *handle,
                              void              **workspace,
                              GError            **error)
{
  cublasStatus_t status;

  status = cublasCreate (handle);
  if (status != CUBLAS_STATUS_SUCCESS)
    {
      *handle = NULL;
      return gmlp_cuda_blas_fail (error, "cuBLAS", "cublasCreate", status, "cuda:%d", device->ordinal);
    }

  /* cublasSetStream() puts back cuBLAS's own workspace, so ours is set
   * after it. */
  status = cublasSetStream (*handle, stream);
  if (status != CUBLAS_STATUS_SUCCESS)
    return gmlp_cuda_blas_fail (error, "cuBLAS", "cublasSetStream", status, "cuda:%d", device->ordinal);

  *workspace = gmlp_cuda_alloc (device, GMLP_CUDA_CUBLAS_WORKSPACE, error);
  if (*workspace == NULL)
    return FALSE;
  status = cublasSetWorkspace (*handle, *workspace, GMLP_CUDA_CUBLAS_WORKSPACE);
  if (status != CUBLAS_STATUS_SUCCESS)
    return gmlp_cuda_blas_fail (error, "cuBLAS", "cublasSetWorkspace", status, "cuda:%d", device->ordinal);

  /* No TF32 or other reduced-precision tensor-core paths for FP32 (the
   * default mode already, but the default may change), and no split-K
   * reductions in the 16-bit output type: sums are FP32 throughout, as the
   * backend interface promises. */
  status = cublasSetMathMode (*handle,
                              (cublasMath_t) (CUBLAS_DEFAULT_MATH |
                                              CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
  if (status != CUBLAS_STATUS_SUCCESS)
    return gmlp_cuda_blas_fail (error, "cuBLAS", "cublasSetMathMode", status, "cuda:%d", device->ordinal);

  /* alpha and beta live on the host. */
  status = cublasSetPointerMode (*handle, CUBLAS_POINTER_MODE_HOST);
  if (status != CUBLAS_STATUS_SUCCESS)
    return gmlp_cuda_blas_fail (error, "cuBLAS", "cublasSetPointerMode", status, "cuda:%d", device->ordinal);

  return TRUE;
}

gboolean
gmlp_cuda_cublas_init (GmlpBackendDevice  *device,
                       GError            **error)
{
  cudaEvent_t *events[] = { &device->side_fork, &device->side_join };
  cudaError_t err;

  if (!gmlp_cuda_cublas_handle_init (device, device->stream, &device->cublas, &device->cublas_workspace, error))
    return FALSE;
  device->blas_plans = gmlp_cuda_blas_plans_new ();

  err = cudaStreamCreateWithFlags (&device->side_stream, cudaStreamNonBlocking);
  if (err != cudaSuccess)
    {
      device->side_stream = NULL;
      return gmlp_cuda_fail (error, "cudaStreamCreateWithFlags", err);
    }
  for (guint i = 0; i < G_N_ELEMENTS (events); i++)
    {
      err = cudaEventCreateWithFlags (events[i], cudaEventDisableTiming);
      if (err != cudaSuccess)
        {
          *events[i] = NULL;
          return gmlp_cuda_fail (error, "cudaEventCreateWithFlags", err);
        }
    }
  return gmlp_cuda_cublas_handle_init (device, device->side_stream, &device->side_cublas,
                                       &device->side_cublas_workspace, error);
}

/* cublasDestroy() waits for the device first, so nothing of cuBLAS's is
 * still running when the workspace goes back to the pool (in the compute
 * stream's order, which the side stream's work has joined). */
static void
gmlp_cuda_cublas_handle_fini (GmlpBackendDevice  *device,
                              cublasHandle_t     *handle,
                              void              **workspace)
{
  if (*handle != NULL)
    (void) cublasDestroy (*handle);
  *handle = NULL;
  if (*workspace != NULL && device->stream != NULL)
    (void) cudaFreeAsync (*workspace, device->stream);
  *workspace = NULL;
}

/* Safe on a partly initialised device. The caller has made the device
 * current and still has its stream. */
void
gmlp_cuda_cublas_fini (GmlpBackendDevice *device)
{
  gmlp_cuda_cublas_handle_fini (device, &device->cublas, &device->cublas_workspace);
  gmlp_cuda_cublas_handle_fini (device, &device->side_cublas, &device->side_cublas_workspace);
  gmlp_cuda_blas_plans_free (device->blas_plans);
  device->blas_plans = NULL;
  if (device->side_stream != NULL)
    {
      (void) cudaStreamSynchronize (device->side_stream);
      (void) cudaStreamDestroy (device->side_stream);
    }
  device->side_stream = NULL;
  if (device->side_fork != NULL)
    (void) cudaEventDestroy (device->side_fork);
  if (device->side_join != NULL)
    (void) cudaEventDestroy (device->side_join);
  device->side_fork = device->side_join = NULL;
}

static gboolean
gmlp_cuda_gemm_data_type (int             dtype,
                          cudaDataType_t *type)
{
  switch (dtype)
    {
    case GMLP_NUM_FLOAT32:
      *type = CUDA_R_32F;
      return TRUE;
    case GMLP_NUM_FLOAT16:
      *type = CUDA_R_16F;
      return TRUE;
    case GMLP_NUM_BFLOAT16:
      *type = CUDA_R_16BF;
      return TRUE;
    default:
      return FALSE;
    }
}

static GmlpCudaGroupWork
gmlp_cuda_gemm_group_work (const GmlpCudaGroups *gemm,
                           guint                 i)
{
  gint64 out_rows, out_cols, depth;

  gmlp_cuda_groups_shape (gemm, i, &out_rows, &out_cols, &depth);
  if (out_rows == 0 || out_cols == 0)
    return GMLP_CUDA_GROUP_SKIP;
  /* An empty sum is zero; cuBLAS is not asked for one (with k = 0 it would
   * scale C by beta, and 0 × a poisoned NaN is NaN). */
  if (depth == 0)
    return gmlp_cuda_groups_accumulates (gemm, i) ? GMLP_CUDA_GROUP_SKIP : GMLP_CUDA_GROUP_ZERO;
  return GMLP_CUDA_GROUP_GEMM;
}

/* Group i as a cuBLAS product; only for GMLP_CUDA_GROUP_GEMM groups, whose
 * sizes validation has checked to fit in an int. */
static void
gmlp_cuda_gemm_product (const GmlpCudaGroups    *gemm,
                        const GmlpCudaGemmPlan  *plan,
                        guint                    i,
                        GmlpCudaProduct         *p)
{
  int m = (int) gemm->rows[i];
  int n = (int) gemm->n;
  int k = (int) gemm->k;

  p->ab_type = plan->ab_type;
  p->c_type = plan->c_type;
  p->a = gemm->b[i];
  p->b = gemm->a[i];
  p->c = gemm->c[i];
  p->beta = gmlp_cuda_groups_accumulates (gemm, i) ? 1.0f : 0.0f;

  switch (gemm->kind)
    {
    case GMLP_GEMM_FPROP:
      p->transa = CUBLAS_OP_T, p->transb = CUBLAS_OP_N;
      p->m = n, p->n = m, p->k = k;
      p->lda = k, p->ldb = k, p->ldc = n;
      break;
    case GMLP_GEMM_DGRAD:
      p->transa = CUBLAS_OP_N, p->transb = CUBLAS_OP_N;
      p->m = k, p->n = m, p->k = n;
      p->lda = k, p->ldb = n, p->ldc = k;
      break;
    case GMLP_GEMM_WGRAD:
    default:
      p->transa = CUBLAS_OP_N, p->transb = CUBLAS_OP_T;
      p->m = k, p->n = n, p->k = m;
      p->lda = k, p->ldb = n, p->ldc = k;
      break;
    }
}

static gboolean
gmlp_cuda_gemm_is_aligned (const void *p,
                           gsize       alignment)
{
  return (guintptr) p % alignment == 0;
}

/* Checks everything that can be checked before anything is enqueued (the
 * route's statistics are the entry's description's). */
static gboolean
gmlp_cuda_gemm_validate (const GmlpCudaGroups  *gemm,
                         GmlpCudaGemmPlan      *plan,
                         GError               **error)
{
  gsize ab_size, c_size;

  memset (plan, 0, sizeof *plan);

  if (gemm == NULL ||
      (gemm->kind != GMLP_GEMM_FPROP && gemm->kind != GMLP_GEMM_DGRAD &&
       gemm->kind != GMLP_GEMM_WGRAD))
    {
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "CUDA: GEMM: no such kind of product");
      return FALSE;
    }
  if (!gmlp_cuda_gemm_data_type (gemm->ab_dtype, &plan->ab_type) ||
      (gemm->c_dtype != gemm->ab_dtype && gemm->c_dtype != GMLP_NUM_FLOAT32) ||
      !gmlp_cuda_gemm_data_type (gemm->c_dtype, &plan->c_type))
    {
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "CUDA: GEMM %s: operands of dtype %d into an output of dtype %d "
                   "are not supported (FLOAT32, FLOAT16 or BFLOAT16 into the same "
                   "or FLOAT32)",
                   gmlp_cuda_gemm_kind_name (gemm->kind), gemm->ab_dtype, gemm->c_dtype);
      return FALSE;
    }
  if (gemm->n < 0 || gemm->k < 0)
    {
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "CUDA: GEMM %s: negative size (n=%" G_GINT64_FORMAT ", k=%"
                   G_GINT64_FORMAT ")", gmlp_cuda_gemm_kind_name (gemm->kind),
                   gemm->n, gemm->k);
      return FALSE;
    }
  if (gemm->n_groups == 0)
    return TRUE;
  if (gemm->rows == NULL || gemm->a == NULL || gemm->b == NULL || gemm->c == NULL)
    {
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "CUDA: GEMM %s: missing group sizes or operand arrays",
                   gmlp_cuda_gemm_kind_name (gemm->kind));
      return FALSE;
    }
  if (gemm->n > G_MAXINT || gemm->k > G_MAXINT)
    {
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "CUDA: GEMM %s: sizes beyond %d are not supported (n=%" G_GINT64_FORMAT
                   ", k=%" G_GINT64_FORMAT ")", gmlp_cuda_gemm_kind_name (gemm->kind),
                   G_MAXINT, gemm->n, gemm->k);
      return FALSE;
    }

  ab_size = gmlp_num_dtype_size (gemm->ab_dtype);
  c_size = gmlp_num_dtype_size (gemm->c_dtype);

  for (guint i = 0; i < gemm->n_groups; i++)
    {
      gint64 m = gemm->rows[i];
      gint64 out_rows, out_cols, depth;

      if (m < 0)
        {
          g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                       "CUDA: GEMM %s: group %u has %" G_GINT64_FORMAT " rows",
                       gmlp_cuda_gemm_kind_name (gemm->kind), i, m);
          return FALSE;
        }
      if (m > G_MAXINT)
        {
          g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_UNSUPPORTED,
                       "CUDA: GEMM %s: group %u has %" G_GINT64_FORMAT " rows; more "
                       "than %d are not supported", gmlp_cuda_gemm_kind_name (gemm->kind),
                       i, m, G_MAXINT);
          return FALSE;
        }

      gmlp_cuda_groups_shape (gemm, i, &out_rows, &out_cols, &depth);
      switch (gmlp_cuda_gemm_group_work (gemm, i))
        {
        case GMLP_CUDA_GROUP_SKIP:
          break;

        case GMLP_CUDA_GROUP_ZERO:
          if (gemm->c[i] == NULL)
            {
              g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                           "CUDA: GEMM %s: group %u has no output matrix",
                           gmlp_cuda_gemm_kind_name (gemm->kind), i);
              return FALSE;
            }
          /* Each size fits in an int, so the product fits in 62 bits. */
          if ((guint64) (out_rows * out_cols) > G_MAXSIZE / c_size)
            {
              g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                           "CUDA: GEMM %s: the output of group %u does not fit in memory",
                           gmlp_cuda_gemm_kind_name (gemm->kind), i);
              return FALSE;
            }
          break;

        case GMLP_CUDA_GROUP_GEMM:
        default:
          if (gemm->a[i] == NULL || gemm->b[i] == NULL || gemm->c[i] == NULL)
            {
              g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                           "CUDA: GEMM %s: group %u is missing an operand",
                           gmlp_cuda_gemm_kind_name (gemm->kind), i);
              return FALSE;
            }
          if (!gmlp_cuda_gemm_is_aligned (gemm->a[i], ab_size) ||
              !gmlp_cuda_gemm_is_aligned (gemm->b[i], ab_size) ||
              !gmlp_cuda_gemm_is_aligned (gemm->c[i], c_size))
            {
              g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                           "CUDA: GEMM %s: an operand of group %u is not aligned to "
                           "its element size", gmlp_cuda_gemm_kind_name (gemm->kind), i);
              return FALSE;
            }
          break;
        }
    }
  return TRUE;
}

/* Sets the output of every empty sum to zero (+0.0 in every float dtype). */
static gboolean
gmlp_cuda_gemm_zero_groups (GmlpBackendDevice     *device,
                            const GmlpCudaGroups  *gemm,
                            GError               **error)
{
  gsize c_size = gmlp_num_dtype_size (gemm->c_dtype);

  for (guint i = 0; i < gemm->n_groups; i++)
    {
      gint64 out_rows, out_cols, depth;
      cudaError_t err;

      if (gmlp_cuda_gemm_group_work (gemm, i) != GMLP_CUDA_GROUP_ZERO)
        continue;
      gmlp_cuda_groups_shape (gemm, i, &out_rows, &out_cols, &depth);
      err = cudaMemsetAsync (gemm->c[i], 0, (gsize) (out_rows * out_cols) * c_size,
                             device->stream);
      if (err != cudaSuccess)
        return gmlp_cuda_fail (error, "cudaMemsetAsync", err);
    }
  return TRUE;
}

/* Orders waiter after all work on producer so far, through event. */
static gboolean
gmlp_cuda_stream_after (cudaStream_t   waiter,
                        cudaStream_t   producer,
                        cudaEvent_t    event,
                        GError       **error)
{
  cudaError_t err = cudaEventRecord (event, producer);

  if (err == cudaSuccess)
    err = cudaStreamWaitEvent (waiter, event, 0);
  return err == cudaSuccess || gmlp_cuda_fail (error, "ordering one stream after another", err);
}

/* The products to compute, in group order, with their number in *count. */
static GmlpCudaProduct *
gmlp_cuda_gemm_products (const GmlpCudaGroups    *gemm,
                         const GmlpCudaGemmPlan  *plan,
                         guint                   *count)
{
  GmlpCudaProduct *products = g_new (GmlpCudaProduct, MAX (gemm->n_groups, 1));
  guint n = 0;

  for (guint i = 0; i < gemm->n_groups; i++)
    if (gmlp_cuda_gemm_group_work (gemm, i) == GMLP_CUDA_GROUP_GEMM)
      gmlp_cuda_gemm_product (gemm, plan, i, &products[n++]);
  *count = n;
  return products;
}

/* One product at a time: on cuBLASLt with the plan kept for its problem
 * (gmlp-cuda-blas-plans.c: no heuristic per call), or where cuBLASLt has no
 * algorithm for it, cublasGemmEx(). More than one alternate between the
 * compute stream and the side stream, forked from it before the first and
 * joined to it after the last: the products are independent (each writes
 * its own C), and on one stream each would wait for the last CTAs of the
 * one before it and for cuBLAS's set-up of its own (a 4-byte memset before
 * each of its Hopper kernels), where on two the next product's CTAs take
 * the SMs that the last wave of the one before leaves idle: faster than
 * one stream on every product measured, interleaved in one process
 * (bench/gmlp-versus-loop.c). */
static gboolean
gmlp_cuda_run_looped (GmlpBackendDevice       *device,
                      const GmlpCudaGroups    *gemm,
                      const GmlpCudaGemmPlan  *plan,
                      const GmlpCudaProduct   *products,
                      guint                    count,
                      GError                 **error)
{
  const float alpha = 1.0f;
  gboolean two = count > 1 && device->tuning.loop_streams != 1;
  gboolean ok = TRUE;

  if (two && !gmlp_cuda_stream_after (device->side_stream, device->stream, device->side_fork, error))
    return FALSE;
  for (guint j = 0; ok && j < count; j++)
    {
      const GmlpCudaProduct *p = &products[j];
      const gboolean side = two && j % 2 == 1;
      const char *library = "cuBLASLt", *what = "cublasLtMatmul";
      cublasStatus_t status;

      /* Each stream's products on the workspace of its cuBLAS handle, in
       * that stream's order. */
      status = gmlp_cuda_blas_plans_run (device->blas_plans, device->cublaslt, p,
                                         side ? device->side_cublas_workspace : device->cublas_workspace,
                                         GMLP_CUDA_CUBLAS_WORKSPACE,
                                         side ? device->side_stream : device->stream);
      if (status == CUBLAS_STATUS_NOT_SUPPORTED)
        {
          library = "cuBLAS", what = "cublasGemmEx";
          status = cublasGemmEx (side ? device->side_cublas : device->cublas,
                                 p->transa, p->transb, p->m, p->n, p->k,
                                 &alpha, p->a, plan->ab_type, p->lda,
                                 p->b, plan->ab_type, p->ldb,
                                 &p->beta, p->c, plan->c_type, p->ldc,
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        }
      if (status != CUBLAS_STATUS_SUCCESS)
        ok = gmlp_cuda_blas_fail (error, library, what, status,
                                  "%s product %u of %u, m=%d, n=%d, k=%d",
                                  gmlp_cuda_gemm_kind_name (gemm->kind), j, count,
                                  p->m, p->n, p->k);
    }
  /* Joined after a failure too: a capture cannot end with the side stream
   * forked from it. */
  if (two &&
      !gmlp_cuda_stream_after (device->stream, device->side_stream, device->side_join, ok ? error : NULL))
    ok = FALSE;
  return ok;
}

/* Orders products by shape, so that equal shapes sit next to each other,
 * largest first: the grouped kernel hands out work in order, and starting
 * the big products first leaves small ones to fill the tail. */
static int
gmlp_cuda_product_compare (gconstpointer a,
                           gconstpointer b)
{
  const GmlpCudaProduct *p = a, *q = b;

  if ((gint64) p->m * p->n != (gint64) q->m * q->n)
    return (gint64) p->m * p->n > (gint64) q->m * q->n ? -1 : 1;
  if (p->m != q->m)
    return p->m < q->m ? -1 : 1;
  if (p->n != q->n)
    return p->n < q->n ? -1 : 1;
  if (p->k != q->k)
    return p->k < q->k ? -1 : 1;
  if (p->beta != q->beta)
    return p->beta < q->beta ? -1 : 1;
  return 0;
}

static gboolean
gmlp_cuda_product_same_shape (const GmlpCudaProduct *p,
                              const GmlpCudaProduct *q)
{
  return gmlp_cuda_product_compare (p, q) == 0 && p->transa == q->transa &&
         p->transb == q->transb && p->lda == q->lda && p->ldb == q->ldb && p->ldc == q->ldc;
}

/* Products of one shape as one cublasGemmBatchedEx() call: cuBLAS runs
 * pointer-array batches on its Hopper (wgmma) kernels, while its grouped
 * kernels use warp-level MMA. The A, B and C pointer arrays go to the device
 * in one table. */
static gboolean
gmlp_cuda_run_batched (GmlpBackendDevice       *device,
                       const GmlpCudaGroups    *gemm,
                       const GmlpCudaGemmPlan  *plan,
                       const GmlpCudaProduct   *products,
                       guint                    count,
                       GError                 **error)
{
  const gsize pointer_bytes = 3 * (gsize) count * sizeof (void *);
  g_autofree const void **pointers = g_new (const void *, 3 * (gsize) count);
  const GmlpCudaProduct *p = &products[0];
  const float alpha = 1.0f;
  void **device_pointers;
  cublasStatus_t status;

  for (guint j = 0; j < count; j++)
    {
      pointers[j] = products[j].a;
      pointers[count + j] = products[j].b;
      pointers[2 * count + j] = products[j].c;
    }

  device_pointers = gmlp_cuda_upload_table (device, pointers, pointer_bytes, 0, NULL, error);
  if (device_pointers == NULL)
    return FALSE;

  status = cublasGemmBatchedEx (device->cublas, p->transa, p->transb, p->m, p->n, p->k, &alpha,
                                (const void * const *) device_pointers, plan->ab_type, p->lda,
                                (const void * const *) (device_pointers + count), plan->ab_type, p->ldb,
                                &p->beta,
                                (void * const *) (device_pointers + 2 * (gsize) count), plan->c_type, p->ldc,
                                (int) count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  gmlp_cuda_free (device, device_pointers);
  if (status != CUBLAS_STATUS_SUCCESS)
    return gmlp_cuda_blas_fail (error, "cuBLAS", "cublasGemmBatchedEx", status,
                                  "%s, %u products of %d × %d × %d",
                                  gmlp_cuda_gemm_kind_name (gemm->kind), count, p->m, p->n, p->k);
  return TRUE;
}

/* Products as one cublasGemmGroupedBatchedEx() call. Products of the same
 * shape form one cuBLAS group. Its A, B and C pointer arrays must be in
 * device memory: they go up in one table, released stream-ordered right
 * after the call. The other arrays are read on the host.
 *
 * When cuBLAS has no grouped kernel for the call it says so before running
 * anything: then *fall_back is set and error is not. */
static gboolean
gmlp_cuda_run_grouped (GmlpBackendDevice       *device,
                       const GmlpCudaGroups    *gemm,
                       const GmlpCudaGemmPlan  *plan,
                       GmlpCudaProduct         *products,
                       guint                    count,
                       gboolean                *fall_back,
                       GError                 **error)
{
  const gsize pointer_bytes = 3 * (gsize) count * sizeof (void *);
  g_autofree guint8 *block = NULL;
  const void **pointers;
  cublasOperation_t *transa, *transb;
  int *m, *n, *k, *lda, *ldb, *ldc, *group_size;
  float *alpha, *beta;
  void **device_pointers;
  cublasStatus_t status;
  guint n_shapes = 0;

  qsort (products, count, sizeof *products, gmlp_cuda_product_compare);

  /* One host block: the pointer table that is uploaded, then the arrays
   * cuBLAS reads on the host (all 4-byte elements), one entry per shape. */
  block = g_malloc (pointer_bytes + (gsize) count * (2 * sizeof (cublasOperation_t) +
                                                     7 * sizeof (int) + 2 * sizeof (float)));
  pointers = (const void **) block;
  transa = (cublasOperation_t *) (block + pointer_bytes);
  transb = transa + count;
  m = (int *) (transb + count);
  n = m + count;
  k = n + count;
  lda = k + count;
  ldb = lda + count;
  ldc = ldb + count;
  group_size = ldc + count;
  alpha = (float *) (group_size + count);
  beta = alpha + count;

  for (guint j = 0; j < count; j++)
    {
      const GmlpCudaProduct *p = &products[j];

      pointers[j] = p->a;
      pointers[count + j] = p->b;
      pointers[2 * count + j] = p->c;
      if (j > 0 && gmlp_cuda_product_same_shape (p, &products[j - 1]))
        {
          group_size[n_shapes - 1]++;
          continue;
        }
      transa[n_shapes] = p->transa;
      transb[n_shapes] = p->transb;
      m[n_shapes] = p->m;
      n[n_shapes] = p->n;
      k[n_shapes] = p->k;
      lda[n_shapes] = p->lda;
      ldb[n_shapes] = p->ldb;
      ldc[n_shapes] = p->ldc;
      group_size[n_shapes] = 1;
      alpha[n_shapes] = 1.0f;
      beta[n_shapes] = p->beta;
      n_shapes++;
    }

  device_pointers = gmlp_cuda_upload_table (device, pointers, pointer_bytes, 0, NULL, error);
  if (device_pointers == NULL)
    return FALSE;

  status = cublasGemmGroupedBatchedEx (device->cublas, transa, transb, m, n, k, alpha,
                                       (const void * const *) device_pointers,
                                       plan->ab_type, lda,
                                       (const void * const *) (device_pointers + count),
                                       plan->ab_type, ldb,
                                       beta,
                                       (void * const *) (device_pointers + 2 * (gsize) count),
                                       plan->c_type, ldc,
                                       (int) n_shapes, group_size, CUBLAS_COMPUTE_32F);
  gmlp_cuda_free (device, device_pointers);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED)
    {
      g_debug ("cuBLAS: cublasGemmGroupedBatchedEx: %s for %s with %u products; "
               "one cublasGemmEx per group instead", cublasGetStatusName (status),
               gmlp_cuda_gemm_kind_name (gemm->kind), count);
      (void) cudaGetLastError ();
      *fall_back = TRUE;
      return FALSE;
    }
  if (status != CUBLAS_STATUS_SUCCESS)
    return gmlp_cuda_blas_fail (error, "cuBLAS", "cublasGemmGroupedBatchedEx", status,
                                  "%s, %u products in %u shapes, n=%" G_GINT64_FORMAT
                                  ", k=%" G_GINT64_FORMAT, gmlp_cuda_gemm_kind_name (gemm->kind),
                                  count, n_shapes, gemm->n, gemm->k);
  return TRUE;
}

/* The many-small-experts path. For FPROP and DGRAD, whose groups split by
 * rows, each group is cut into tiles of GMLP_CUDA_ROW_TILE rows where the
 * route says (row_tiles): the tiles have one shape and run as one
 * pointer-array batch on cuBLAS's wgmma kernels, much faster than its
 * grouped kernels. The rows left over in each group run as one grouped
 * call (measured, smaller tiles for the leftovers lose). WGRAD sums over the rows, so its groups stay whole in the grouped
 * call. */
static gboolean
gmlp_cuda_gemm_grouped (GmlpBackendDevice       *device,
                        const GmlpCudaGroups    *gemm,
                        const GmlpCudaGemmPlan  *plan,
                        gboolean                 tiled,
                        gboolean                *fall_back,
                        GError                 **error)
{
  g_autoptr(GArray) tiles = g_array_new (FALSE, FALSE, sizeof (GmlpCudaProduct));
  g_autoptr(GArray) rest = g_array_new (FALSE, FALSE, sizeof (GmlpCudaProduct));
  gsize ab_size = gmlp_num_dtype_size (gemm->ab_dtype);
  gsize c_size = gmlp_num_dtype_size (gemm->c_dtype);

  for (guint i = 0; i < gemm->n_groups; i++)
    {
      GmlpCudaProduct p;
      int done = 0;

      if (gmlp_cuda_gemm_group_work (gemm, i) != GMLP_CUDA_GROUP_GEMM)
        continue;
      gmlp_cuda_gemm_product (gemm, plan, i, &p);

      /* The rows of an M-grouped product are cuBLAS's columns (n). */
      while (tiled && p.n - done >= GMLP_CUDA_ROW_TILE)
        {
          GmlpCudaProduct t = p;

          t.n = GMLP_CUDA_ROW_TILE;
          t.b = (const guint8 *) p.b + (gsize) done * p.ldb * ab_size;
          t.c = (guint8 *) p.c + (gsize) done * p.ldc * c_size;
          g_array_append_val (tiles, t);
          done += GMLP_CUDA_ROW_TILE;
        }
      if (done < p.n)
        {
          GmlpCudaProduct t = p;

          t.n = p.n - done;
          t.b = (const guint8 *) p.b + (gsize) done * p.ldb * ab_size;
          t.c = (guint8 *) p.c + (gsize) done * p.ldc * c_size;
          g_array_append_val (rest, t);
        }
    }

  if (!gmlp_cuda_gemm_zero_groups (device, gemm, error))
    return FALSE;
  if (tiles->len > 0 &&
      !gmlp_cuda_run_batched (device, gemm, plan, (GmlpCudaProduct *) tiles->data, tiles->len, error))
    return FALSE;
  if (rest->len == 0 ||
      gmlp_cuda_run_grouped (device, gemm, plan, (GmlpCudaProduct *) rest->data, rest->len,
                             fall_back, error))
    return TRUE;
  if (!*fall_back || tiles->len == 0)
    return FALSE;

  /* The tiles are enqueued already: only the rest falls back, here. */
  *fall_back = FALSE;
  return gmlp_cuda_run_looped (device, gemm, plan, (GmlpCudaProduct *) rest->data, rest->len, error);
}

/* The route's executor, under scratch_lock: the handles, their
 * workspaces, the side stream's events and the device-sizes workspace are
 * the device's. */
gboolean
gmlp_cuda_gemm_groups (GmlpBackendDevice        *device,
                       const GmlpCudaGroups     *gemm,
                       const GmlpCudaGemmRoute  *route,
                       GError                  **error)
{
  g_autofree GmlpCudaProduct *products = NULL;
  GmlpCudaGemmPlan plan;
  gboolean bias = gemm->kind == GMLP_GEMM_FPROP && gemm->bias != NULL;
  gboolean fall_back = FALSE;
  guint count;

  if (!gmlp_cuda_gemm_validate (gemm, &plan, error))
    return FALSE;
  /* (With a bias, empty sums (k = 0) still give C = the bias.) */
  if (route->product.n_products == 0 && route->product.n_zeroed == 0 && !bias)
    return TRUE;
  if (!gmlp_cuda_activate (device, error))
    return FALSE;

  switch (route->choice.route)
    {
    case GMLP_CUDA_ROUTE_SM90:
      /* The bias in the kernel's epilogue. */
      return gmlp_cuda_gemm_sm90_run (device, &route->kernel_gemm, error);

    case GMLP_CUDA_ROUTE_CUBLAS_GROUPED:
      if (!gmlp_cuda_gemm_grouped (device, gemm, &plan, route->choice.row_tiles, &fall_back, error))
        {
          if (!fall_back)
            return FALSE;
          products = gmlp_cuda_gemm_products (gemm, &plan, &count);
          if (!gmlp_cuda_run_looped (device, gemm, &plan, products, count, error))
            return FALSE;
        }
      break;

    case GMLP_CUDA_ROUTE_CUBLAS_BATCHED:
      products = gmlp_cuda_gemm_products (gemm, &plan, &count);
      if (!gmlp_cuda_gemm_zero_groups (device, gemm, error) ||
          !gmlp_cuda_run_batched (device, gemm, &plan, products, count, error))
        return FALSE;
      break;

    case GMLP_CUDA_ROUTE_CUBLAS_LOOP:
    default:
      products = gmlp_cuda_gemm_products (gemm, &plan, &count);
      if (!gmlp_cuda_gemm_zero_groups (device, gemm, error) ||
          !gmlp_cuda_run_looped (device, gemm, &plan, products, count, error))
        return FALSE;
      break;
    }
  /* cuBLAS: the bias onto the stored product. */
  return !bias || gmlp_cuda_add_bias (device, gemm->n_groups, gemm->rows, gemm->n, gemm->c_dtype,
                                      gemm->c, gemm->bias, error);
}
