/* test-cuda-blas-plans.c: the CUDA backend's kept cuBLASLt plans
 *
 * gmlp-cuda-blas-plans.c (linked here alone, with cuBLASLt and the CUDA
 * runtime) runs the per-group loop's products on plans kept per problem.
 * Each product here, in the three layouts the backend gives cuBLAS (FPROP,
 * DGRAD, WGRAD, see gmlp-cuda-gemm.c) and the router gate's shapes, is
 * checked against a float64 reference from fresh random inputs, its output
 * poisoned first; and a product's bits must not depend on the cache's
 * history: the same on a miss, on a hit, after its plan was pushed out by
 * many others, and in a fresh cache. Without a GPU every case skips.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <math.h>
#include <string.h>

#include <glib.h>

#include "gmlp-numeric.h"
#include "backend/cuda/gmlp-cuda-blas-plans.h"

#define WORKSPACE_BYTES (32u << 20)

typedef struct {
  cublasOperation_t  transa, transb;
  int                m, n, k;
  int                pad;        /* added to each leading dimension */
  int                ab_dtype;   /* GMLP_NUM_* */
  int                c_dtype;
  float              beta;
  gsize              offset;     /* bytes past 256-byte alignment of every pointer */
} Case;

typedef struct {
  cublasLtHandle_t  lt;
  cudaStream_t      stream;
  void             *workspace;
} Gpu;

static gboolean
gpu_open (Gpu *gpu)
{
  int count = 0;

  memset (gpu, 0, sizeof *gpu);
  if (cudaGetDeviceCount (&count) != cudaSuccess || count < 1)
    {
      (void) cudaGetLastError ();
      g_test_skip ("no CUDA device");
      return FALSE;
    }
  g_assert_cmpint (cudaSetDevice (0), ==, cudaSuccess);
  g_assert_cmpint (cublasLtCreate (&gpu->lt), ==, CUBLAS_STATUS_SUCCESS);
  g_assert_cmpint (cudaStreamCreate (&gpu->stream), ==, cudaSuccess);
  g_assert_cmpint (cudaMalloc (&gpu->workspace, WORKSPACE_BYTES), ==, cudaSuccess);
  return TRUE;
}

static void
gpu_close (Gpu *gpu)
{
  g_assert_cmpint (cudaStreamSynchronize (gpu->stream), ==, cudaSuccess);
  (void) cudaFree (gpu->workspace);
  (void) cudaStreamDestroy (gpu->stream);
  (void) cublasLtDestroy (gpu->lt);
}

static cudaDataType_t
cuda_type (int dtype)
{
  switch (dtype)
    {
    case GMLP_NUM_FLOAT16:
      return CUDA_R_16F;
    case GMLP_NUM_BFLOAT16:
      return CUDA_R_16BF;
    default:
      return CUDA_R_32F;
    }
}

/* Column-major storage of op (X) = rows × cols under op: (stored rows,
 * stored cols). */
static void
stored_shape (cublasOperation_t op, int rows, int cols, int *srows, int *scols)
{
  *srows = op == CUBLAS_OP_N ? rows : cols;
  *scols = op == CUBLAS_OP_N ? cols : rows;
}

/* Host images of A, B and C (C's initial values, for beta = 1), their
 * float64 reference and device copies. */
typedef struct {
  int      lda, ldb, ldc;
  gsize    a_elems, b_elems, c_elems;
  guint8  *a, *b, *c0;
  double  *ref;
  guint8  *dev_a, *dev_b, *dev_c;   /* allocation + offset */
  void    *alloc_a, *alloc_b, *alloc_c;
} Operands;

static double
image_value (const guint8 *image, int dtype, gsize i)
{
  return gmlp_num_load_float (image, dtype, i);
}

static void
operands_make (const Case *c, Operands *o)
{
  const gsize ab = gmlp_num_dtype_size (c->ab_dtype), cs = gmlp_num_dtype_size (c->c_dtype);
  int ar, ac, br, bc;

  stored_shape (c->transa, c->m, c->k, &ar, &ac);
  stored_shape (c->transb, c->k, c->n, &br, &bc);
  o->lda = ar + c->pad;
  o->ldb = br + c->pad;
  o->ldc = c->m + c->pad;
  o->a_elems = (gsize) o->lda * ac;
  o->b_elems = (gsize) o->ldb * bc;
  o->c_elems = (gsize) o->ldc * c->n;
  o->a = g_malloc (o->a_elems * ab);
  o->b = g_malloc (o->b_elems * ab);
  o->c0 = g_malloc (o->c_elems * cs);
  for (gsize i = 0; i < o->a_elems; i++)
    gmlp_num_store_float (o->a, c->ab_dtype, i, (float) g_test_rand_double_range (-1, 1));
  for (gsize i = 0; i < o->b_elems; i++)
    gmlp_num_store_float (o->b, c->ab_dtype, i, (float) g_test_rand_double_range (-1, 1));
  for (gsize i = 0; i < o->c_elems; i++)
    gmlp_num_store_float (o->c0, c->c_dtype, i, (float) g_test_rand_double_range (-1, 1));

  o->ref = g_new0 (double, o->c_elems);
  for (int j = 0; j < c->n; j++)
    for (int i = 0; i < c->m; i++)
      {
        double sum = 0;

        for (int l = 0; l < c->k; l++)
          {
            gsize ai = c->transa == CUBLAS_OP_N ? (gsize) i + (gsize) l * o->lda : (gsize) l + (gsize) i * o->lda;
            gsize bi = c->transb == CUBLAS_OP_N ? (gsize) l + (gsize) j * o->ldb : (gsize) j + (gsize) l * o->ldb;

            sum += image_value (o->a, c->ab_dtype, ai) * image_value (o->b, c->ab_dtype, bi);
          }
        if (c->beta != 0.0f)
          sum += c->beta * image_value (o->c0, c->c_dtype, (gsize) i + (gsize) j * o->ldc);
        o->ref[(gsize) i + (gsize) j * o->ldc] = sum;
      }

  g_assert_cmpint (cudaMalloc (&o->alloc_a, o->a_elems * ab + c->offset), ==, cudaSuccess);
  g_assert_cmpint (cudaMalloc (&o->alloc_b, o->b_elems * ab + c->offset), ==, cudaSuccess);
  g_assert_cmpint (cudaMalloc (&o->alloc_c, o->c_elems * cs + c->offset), ==, cudaSuccess);
  o->dev_a = (guint8 *) o->alloc_a + c->offset;
  o->dev_b = (guint8 *) o->alloc_b + c->offset;
  o->dev_c = (guint8 *) o->alloc_c + c->offset;
  g_assert_cmpint (cudaMemcpy (o->dev_a, o->a, o->a_elems * ab, cudaMemcpyHostToDevice), ==, cudaSuccess);
  g_assert_cmpint (cudaMemcpy (o->dev_b, o->b, o->b_elems * ab, cudaMemcpyHostToDevice), ==, cudaSuccess);
}

static void
operands_free (Operands *o)
{
  (void) cudaFree (o->alloc_a);
  (void) cudaFree (o->alloc_b);
  (void) cudaFree (o->alloc_c);
  g_free (o->a);
  g_free (o->b);
  g_free (o->c0);
  g_free (o->ref);
}

/* Runs c through plans into a poisoned (beta = 0) or C0-holding C and
 * returns C's bytes. */
static guint8 *
run_case (GmlpCudaBlasPlans *plans,
          Gpu               *gpu,
          const Case        *c,
          Operands          *o)
{
  const gsize cs = gmlp_num_dtype_size (c->c_dtype);
  GmlpCudaBlasProduct p = {
    .transa = c->transa, .transb = c->transb,
    .m = c->m, .n = c->n, .k = c->k,
    .lda = o->lda, .ldb = o->ldb, .ldc = o->ldc,
    .ab_type = cuda_type (c->ab_dtype), .c_type = cuda_type (c->c_dtype),
    .a = o->dev_a, .b = o->dev_b, .c = o->dev_c,
    .beta = c->beta,
  };
  guint8 *out = g_malloc (o->c_elems * cs);

  /* All ones: NaN in every float dtype. */
  if (c->beta == 0.0f)
    g_assert_cmpint (cudaMemset (o->dev_c, 0xff, o->c_elems * cs), ==, cudaSuccess);
  else
    g_assert_cmpint (cudaMemcpy (o->dev_c, o->c0, o->c_elems * cs, cudaMemcpyHostToDevice), ==,
                     cudaSuccess);
  g_assert_cmpint (gmlp_cuda_blas_plans_run (plans, gpu->lt, &p, gpu->workspace, WORKSPACE_BYTES,
                                             gpu->stream), ==, CUBLAS_STATUS_SUCCESS);
  g_assert_cmpint (cudaStreamSynchronize (gpu->stream), ==, cudaSuccess);
  g_assert_cmpint (cudaMemcpy (out, o->dev_c, o->c_elems * cs, cudaMemcpyDeviceToHost), ==, cudaSuccess);
  return out;
}

static void
check_case (const Case *c, const Operands *o, const guint8 *out)
{
  /* FP32 sums of k products of values in [-1, 1], rounded once to C. */
  const double tol = c->c_dtype == GMLP_NUM_BFLOAT16 ? 1.0 / 128 :
                     c->c_dtype == GMLP_NUM_FLOAT16 ? 1.0 / 1024 : 1e-5;

  for (int j = 0; j < c->n; j++)
    for (int i = 0; i < c->m; i++)
      {
        gsize at = (gsize) i + (gsize) j * o->ldc;
        double got = gmlp_num_load_float (out, c->c_dtype, at);

        if (!(fabs (got - o->ref[at]) <= tol * (1.0 + fabs (o->ref[at]) + sqrt ((double) c->k))))
          g_error ("m=%d n=%d k=%d: C[%d, %d] = %g, expected %g", c->m, c->n, c->k, i, j, got,
                   o->ref[at]);
      }
}

/* The backend's three layouts (gmlp-cuda-gemm.c, cuBLAS's terms) and the
 * router gate's products (T = 200 tokens, E = 8 experts, H = 96). */
static const Case cases[] = {
  /* FPROP: C' = B'^T A', n_out × m_rows */
  { CUBLAS_OP_T, CUBLAS_OP_N, 48, 37, 64, 0, GMLP_NUM_BFLOAT16, GMLP_NUM_BFLOAT16, 0.0f, 0 },
  { CUBLAS_OP_T, CUBLAS_OP_N, 24, 200, 96, 0, GMLP_NUM_BFLOAT16, GMLP_NUM_FLOAT32, 0.0f, 0 },
  { CUBLAS_OP_T, CUBLAS_OP_N, 40, 33, 72, 0, GMLP_NUM_FLOAT16, GMLP_NUM_FLOAT16, 0.0f, 16 },
  { CUBLAS_OP_T, CUBLAS_OP_N, 16, 9, 24, 0, GMLP_NUM_FLOAT32, GMLP_NUM_FLOAT32, 0.0f, 0 },
  /* DGRAD */
  { CUBLAS_OP_N, CUBLAS_OP_N, 64, 45, 48, 0, GMLP_NUM_BFLOAT16, GMLP_NUM_BFLOAT16, 0.0f, 0 },
  { CUBLAS_OP_N, CUBLAS_OP_N, 32, 17, 40, 8, GMLP_NUM_FLOAT32, GMLP_NUM_FLOAT32, 0.0f, 0 },
  /* WGRAD, storing and accumulating; the gate's long sum over tokens */
  { CUBLAS_OP_N, CUBLAS_OP_T, 64, 48, 131, 0, GMLP_NUM_BFLOAT16, GMLP_NUM_BFLOAT16, 0.0f, 0 },
  { CUBLAS_OP_N, CUBLAS_OP_T, 64, 48, 131, 0, GMLP_NUM_BFLOAT16, GMLP_NUM_FLOAT32, 1.0f, 0 },
  { CUBLAS_OP_N, CUBLAS_OP_T, 96, 24, 200, 0, GMLP_NUM_BFLOAT16, GMLP_NUM_FLOAT32, 0.0f, 0 },
  { CUBLAS_OP_N, CUBLAS_OP_T, 56, 40, 77, 0, GMLP_NUM_FLOAT16, GMLP_NUM_FLOAT32, 1.0f, 16 },
};

static void
test_products (void)
{
  GmlpCudaBlasPlans *plans;
  Gpu gpu;

  if (!gpu_open (&gpu))
    return;
  plans = gmlp_cuda_blas_plans_new ();
  for (guint i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      Operands o;
      guint8 *out;

      operands_make (&cases[i], &o);
      out = run_case (plans, &gpu, &cases[i], &o);
      check_case (&cases[i], &o, out);
      g_free (out);
      operands_free (&o);
    }
  gmlp_cuda_blas_plans_free (plans);
  gpu_close (&gpu);
}

/* A miss, a hit, a run after 300 other problems pushed the plan out (the
 * cache keeps 256), and a fresh cache: the same bits every time. */
static void
test_history (void)
{
  const Case *c = &cases[8];
  const gsize bytes = gmlp_num_dtype_size (c->c_dtype);
  GmlpCudaBlasPlans *plans;
  guint8 *first, *again;
  Operands o;
  Gpu gpu;

  if (!gpu_open (&gpu))
    return;
  plans = gmlp_cuda_blas_plans_new ();
  operands_make (c, &o);
  first = run_case (plans, &gpu, c, &o);
  check_case (c, &o, first);

  again = run_case (plans, &gpu, c, &o);
  g_assert_cmpmem (first, o.c_elems * bytes, again, o.c_elems * bytes);
  g_free (again);

  for (int m = 1; m <= 300; m++)
    {
      Case other = *c;
      Operands p;

      other.m = m, other.n = 8, other.k = 16;
      operands_make (&other, &p);
      g_free (run_case (plans, &gpu, &other, &p));
      operands_free (&p);
    }
  again = run_case (plans, &gpu, c, &o);
  g_assert_cmpmem (first, o.c_elems * bytes, again, o.c_elems * bytes);
  g_free (again);
  gmlp_cuda_blas_plans_free (plans);

  plans = gmlp_cuda_blas_plans_new ();
  again = run_case (plans, &gpu, c, &o);
  g_assert_cmpmem (first, o.c_elems * bytes, again, o.c_elems * bytes);
  g_free (again);
  gmlp_cuda_blas_plans_free (plans);

  g_free (first);
  operands_free (&o);
  gpu_close (&gpu);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add_func ("/Gmlp/Cuda/BlasPlans/products", test_products);
  g_test_add_func ("/Gmlp/Cuda/BlasPlans/history", test_history);
  return g_test_run ();
}
