/* gmlp-cuda-blas-plans.c: one-group 16-bit and FP32 products on cuBLASLt,
 * planned once per problem
 *
 * Why: the per-group loop of cuBLAS calls (route cublas-loop, and so every
 * one-group product such as the router's gate, three a step) ran one
 * cublasGemmEx() per product, and cublasGemmEx() asks cuBLASLt's heuristic
 * for an algorithm on every call. Here the
 * matmul descriptor, the three layouts and the algorithm the heuristic chose
 * are kept per problem (dtypes, transposes, m, n, k, leading dimensions, beta,
 * the pointers' alignment), in a small cache of the device's, bounded
 * (least recently used out first), under a lock of its own, freed when the
 * device closes. A call then costs a look-up and cublasLtMatmul().
 *
 * Numerics: the same as cublasGemmEx() with the handles' settings
 * (gmlp-cuda-gemm.c): CUBLAS_COMPUTE_32F with FP32 alpha and beta (true FP32
 * for FP32 operands, no TF32), the output in C's dtype, rounded once. Like
 * the handles' CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION, the
 * heuristic may choose split-K only where the parts are summed in FP32 in
 * the workspace (GMLP_CUDA_BLAS_REDUCTIONS): never in C's 16-bit dtype, never
 * by atomics, so a product's bits are the same on every run. The kept
 * algorithm for a problem is the one the heuristic gives it, whatever else
 * was asked before, so a result does not depend on the cache's history.
 * Where the heuristic has no algorithm under these terms (or cuBLASLt fails
 * to describe the problem), that is kept too and the caller runs the
 * product as before (cublasGemmEx()).
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <string.h>

#include "gmlp-cuda-blas-plans.h"

/* Problems kept per device: every distinct shape of a model's one-group
 * products many times over; past it the least recently used goes. */
#define GMLP_CUDA_BLAS_PLANS_MAX 256

/* The split-K reductions allowed besides none (see the top). Split-K is
 * what keeps the GPU busy on a small output with a long sum, such as the
 * router gate's WGRAD (3E columns, a sum over the tokens); where bits must
 * not depend on the algorithm's split either, CUBLASLT_REDUCTION_SCHEME_NONE
 * here allows none. */
#define GMLP_CUDA_BLAS_REDUCTIONS CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE

/* Pointer alignment is asked of the heuristic up to this (its default). */
#define GMLP_CUDA_BLAS_MAX_ALIGNMENT 256

/* What a plan depends on; zero-filled before it is set, so that it hashes
 * and compares as bytes (it has no padding). */
typedef struct {
  int       transa, transb;
  int       m, n, k;
  int       lda, ldb, ldc;
  int       ab_type, c_type;
  float     beta;
  guint32   align_a, align_b, align_c;
  guint64   workspace_bytes;
} GmlpCudaBlasKey;

G_STATIC_ASSERT (sizeof (GmlpCudaBlasKey) == 14 * 4 + 8);

typedef struct {
  GmlpCudaBlasKey               key;
  GList                         link;       /* in plans->recent, data = the plan */
  gboolean                      supported;  /* FALSE: no algorithm, run elsewhere */
  cublasLtMatmulDescOpaque_t    desc;
  cublasLtMatrixLayoutOpaque_t  layout_a, layout_b, layout_c;
  cublasLtMatmulAlgo_t          algo;
} GmlpCudaBlasPlan;

struct _GmlpCudaBlasPlans
{
  GMutex       lock;
  GHashTable  *by_key;   /* GmlpCudaBlasKey * -> GmlpCudaBlasPlan *, which owns the key */
  GQueue       recent;   /* most recently used first */
};

static guint
gmlp_cuda_blas_key_hash (gconstpointer key)
{
  const guchar *bytes = key;
  guint32 h = 2166136261u;

  /* FNV-1a */
  for (gsize i = 0; i < sizeof (GmlpCudaBlasKey); i++)
    h = (h ^ bytes[i]) * 16777619u;
  return h;
}

static gboolean
gmlp_cuda_blas_key_equal (gconstpointer a,
                          gconstpointer b)
{
  return memcmp (a, b, sizeof (GmlpCudaBlasKey)) == 0;
}

/* The largest power of two up to 256 that divides the address: what
 * cuBLASLt's heuristic is told of a pointer's alignment. */
guint32
gmlp_cuda_blas_pointer_alignment (const void *p)
{
  guintptr v = (guintptr) p;
  guint32 align = GMLP_CUDA_BLAS_MAX_ALIGNMENT;

  while (align > 1 && v % align != 0)
    align /= 2;
  return align;
}

static void
gmlp_cuda_blas_key_of (const GmlpCudaBlasProduct *p,
                       gsize                      workspace_bytes,
                       GmlpCudaBlasKey           *key)
{
  memset (key, 0, sizeof *key);
  key->transa = p->transa;
  key->transb = p->transb;
  key->m = p->m, key->n = p->n, key->k = p->k;
  key->lda = p->lda, key->ldb = p->ldb, key->ldc = p->ldc;
  key->ab_type = p->ab_type;
  key->c_type = p->c_type;
  key->beta = p->beta;
  key->align_a = gmlp_cuda_blas_pointer_alignment (p->a);
  key->align_b = gmlp_cuda_blas_pointer_alignment (p->b);
  key->align_c = gmlp_cuda_blas_pointer_alignment (p->c);
  key->workspace_bytes = workspace_bytes;
}

GmlpCudaBlasPlans *
gmlp_cuda_blas_plans_new (void)
{
  GmlpCudaBlasPlans *plans = g_new0 (GmlpCudaBlasPlans, 1);

  g_mutex_init (&plans->lock);
  plans->by_key = g_hash_table_new_full (gmlp_cuda_blas_key_hash, gmlp_cuda_blas_key_equal,
                                         NULL, g_free);
  g_queue_init (&plans->recent);
  return plans;
}

/* The plans hold no cuBLASLt objects of their own (the descriptors live
 * inside them), so they go without the handle. */
void
gmlp_cuda_blas_plans_free (GmlpCudaBlasPlans *plans)
{
  if (plans == NULL)
    return;
  g_hash_table_destroy (plans->by_key);
  g_mutex_clear (&plans->lock);
  g_free (plans);
}

/* Rows and columns of an operand stored column-major, as cuBLASLt's layout
 * takes them: op (X) is rows_op × cols_op. */
static cublasStatus_t
gmlp_cuda_blas_layout (cublasLtMatrixLayoutOpaque_t *layout,
                       cudaDataType_t                type,
                       cublasOperation_t             op,
                       int                           rows_op,
                       int                           cols_op,
                       int                           ld)
{
  if (op == CUBLAS_OP_N)
    return cublasLtMatrixLayoutInit (layout, type, (uint64_t) rows_op, (uint64_t) cols_op, ld);
  return cublasLtMatrixLayoutInit (layout, type, (uint64_t) cols_op, (uint64_t) rows_op, ld);
}

/* Describes p's problem into plan and asks the heuristic for its algorithm;
 * plan->supported says whether it had one. Any failure of cuBLASLt here
 * only means no algorithm: the product then runs as it did before plans. */
static void
gmlp_cuda_blas_plan_make (GmlpCudaBlasPlan          *plan,
                          cublasLtHandle_t           handle,
                          const GmlpCudaBlasProduct *p)
{
  const GmlpCudaBlasKey *key = &plan->key;
  const guint32 reductions = GMLP_CUDA_BLAS_REDUCTIONS;
  const uint64_t max_workspace = key->workspace_bytes;
  const cublasOperation_t transa = p->transa, transb = p->transb;
  const guint32 align[4] = { key->align_a, key->align_b, key->align_c, key->align_c };
  const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
  };
  cublasLtMatmulPreferenceOpaque_t pref;
  cublasLtMatmulHeuristicResult_t result;
  int found = 0;
  cublasStatus_t status;

  plan->supported = FALSE;
  status = cublasLtMatmulDescInit (&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulDescSetAttribute (&plan->desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                             &transa, sizeof transa);
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulDescSetAttribute (&plan->desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                             &transb, sizeof transb);
  if (status == CUBLAS_STATUS_SUCCESS)
    status = gmlp_cuda_blas_layout (&plan->layout_a, p->ab_type, p->transa, p->m, p->k, p->lda);
  if (status == CUBLAS_STATUS_SUCCESS)
    status = gmlp_cuda_blas_layout (&plan->layout_b, p->ab_type, p->transb, p->k, p->n, p->ldb);
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatrixLayoutInit (&plan->layout_c, p->c_type, (uint64_t) p->m,
                                       (uint64_t) p->n, p->ldc);
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulPreferenceInit (&pref);
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulPreferenceSetAttribute (&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                   &max_workspace, sizeof max_workspace);
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulPreferenceSetAttribute (&pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                   &reductions, sizeof reductions);
  for (guint i = 0; status == CUBLAS_STATUS_SUCCESS && i < G_N_ELEMENTS (align); i++)
    status = cublasLtMatmulPreferenceSetAttribute (&pref, align_attr[i], &align[i], sizeof align[i]);
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulAlgoGetHeuristic (handle, &plan->desc, &plan->layout_a, &plan->layout_b,
                                             &plan->layout_c, &plan->layout_c, &pref, 1, &result,
                                             &found);
  if (status != CUBLAS_STATUS_SUCCESS || found < 1 || result.state != CUBLAS_STATUS_SUCCESS)
    return;
  plan->algo = result.algo;
  plan->supported = TRUE;
}

/* The plan of key, made and kept if there is none; the lock is held. */
static GmlpCudaBlasPlan *
gmlp_cuda_blas_plan_locked (GmlpCudaBlasPlans         *plans,
                            const GmlpCudaBlasKey     *key,
                            cublasLtHandle_t           handle,
                            const GmlpCudaBlasProduct *p)
{
  GmlpCudaBlasPlan *plan = g_hash_table_lookup (plans->by_key, key);

  if (plan != NULL)
    {
      g_queue_unlink (&plans->recent, &plan->link);
      g_queue_push_head_link (&plans->recent, &plan->link);
      return plan;
    }

  plan = g_new0 (GmlpCudaBlasPlan, 1);
  plan->key = *key;
  plan->link.data = plan;
  gmlp_cuda_blas_plan_make (plan, handle, p);
  if (plans->recent.length >= GMLP_CUDA_BLAS_PLANS_MAX)
    {
      GList *oldest = g_queue_pop_tail_link (&plans->recent);

      g_hash_table_remove (plans->by_key, &((GmlpCudaBlasPlan *) oldest->data)->key);
    }
  g_hash_table_insert (plans->by_key, &plan->key, plan);
  g_queue_push_head_link (&plans->recent, &plan->link);
  return plan;
}

cublasStatus_t
gmlp_cuda_blas_plans_run (GmlpCudaBlasPlans         *plans,
                          cublasLtHandle_t           handle,
                          const GmlpCudaBlasProduct *p,
                          void                      *workspace,
                          gsize                      workspace_bytes,
                          cudaStream_t               stream)
{
  const float alpha = 1.0f;
  GmlpCudaBlasKey key;
  GmlpCudaBlasPlan *plan;
  cublasStatus_t status;

  if (plans == NULL || handle == NULL)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  gmlp_cuda_blas_key_of (p, workspace_bytes, &key);

  /* Held while enqueuing too, so that no other thread drops the plan in
   * use; the callers hold the device's scratch_lock anyway. */
  g_mutex_lock (&plans->lock);
  plan = gmlp_cuda_blas_plan_locked (plans, &key, handle, p);
  if (!plan->supported)
    status = CUBLAS_STATUS_NOT_SUPPORTED;
  else
    status = cublasLtMatmul (handle, &plan->desc, &alpha, p->a, &plan->layout_a, p->b,
                             &plan->layout_b, &p->beta, p->c, &plan->layout_c, p->c,
                             &plan->layout_c, &plan->algo, workspace, workspace_bytes, stream);
  g_mutex_unlock (&plans->lock);
  return status;
}
