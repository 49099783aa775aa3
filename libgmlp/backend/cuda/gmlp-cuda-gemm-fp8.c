/* gmlp-cuda-gemm-fp8.c: FP8 grouped products of the CUDA backend
 *
 * The executors of the routes of FP8 products with host sizes, which the
 * entry asked gmlp_cuda_route() for (gmlp-cuda-gemm-entry.c,
 * gmlp-cuda-route.c): many small products run on libgmlp's Hopper kernel
 * where it applies (compute capability 9.0, operands laid out as grouped
 * tensors lay them out, WGRAD groups of multiples of 16 rows), one launch
 * for all groups. The rest takes cuBLASLt: one cublasLtMatmul per group,
 * with per-tensor scales: the groups' scale inverses are the matmul's A
 * and B scale pointers (device memory, read by the kernel, so nothing
 * waits), the sums are FP32 with the partial sums promoted
 * (CUBLASLT_MATMUL_DESC_FAST_ACCUM = 0), and the output is BF16, FP16 or
 * FP32. Blockwise scales have no cuBLASLt path here: those products run
 * on the Hopper kernel (on padded copies for WGRAD groups not of multiples
 * of 16 rows: gmlp_cuda_gemm_fp8_padded_supported()), or the backend's
 * gemm_supported says no, with the kernel's reason, and the layer
 * dequantizes them. An FPROP's bias joins the FP32 sum before the one
 * rounding in the Hopper kernel's epilogue; cuBLASLt's product has it
 * added afterwards.
 *
 * cuBLASLt's FP8 kernels on Hopper and Ada take only the "TN" layout: both
 * operands K-major, the summed dimension contiguous. The backend's
 * operands are given that way (see GmlpBackendGemm: the transposed ones
 * are the quantizer's columnwise copies). With row-major C (R × C) = A (R ×
 * D) · B (C × D)ᵀ, cuBLAS (column-major) computes Cᵀ (C × R, ld C) =
 * op(A') op(B') with A' = our B stored D × C (ld D), transposed, and B' =
 * our A stored D × R (ld D), as is: TN.
 *
 * Alignment: cuBLASLt wants FP8 pointers and leading dimensions on 16
 * bytes, and the summed dimension a multiple of 16. For FPROP and DGRAD
 * that is k and n (the layer's features), refused with the reason
 * otherwise; for WGRAD it is m_i, any number of tokens, so a group whose
 * m_i is not a multiple of 16 gets both operands copied (one 2D copy each)
 * into zeroed scratch whose rows are padded to the next multiple of 16:
 * zeros add nothing to the sums. Everything that can be checked, the
 * cuBLASLt heuristics included, is checked before anything is enqueued.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <string.h>

#include "gmlp-numeric.h"
#include "gmlp-cuda-private.h"

/* As for cuBLAS: enough for every kernel cuBLASLt picks on Hopper. */
#define GMLP_CUDA_CUBLASLT_WORKSPACE ((gsize) 32 << 20)

/* cuBLASLt's FP8 rule for pointers, leading dimensions and the summed
 * dimension, in bytes (one FP8 element is one byte). */
#define GMLP_CUDA_FP8_ALIGNMENT 16

/* The padded scratch of WGRAD starts every operand on this boundary, as
 * grouped tensors start their members. */
#define GMLP_CUDA_FP8_SCRATCH_ALIGNMENT 256

/* Heuristic results are kept per shape; past this many the cache starts
 * over (a layer has a handful of shapes a step, but group sizes vary). */
#define GMLP_CUDA_FP8_ALGO_CACHE_MAX 8192

/* One group as cuBLASLt sees it (column-major, see the top). */
typedef struct {
  guint                   group;
  int                     m, n, k;        /* cuBLAS: C' (m × n), summing over k (padded) */
  int                     depth;          /* the real length of the sums */
  const void             *a, *b;          /* cuBLAS's A' (our b) and B' (our a) */
  const float            *a_scale;        /* of A' (our b) */
  const float            *b_scale;        /* of B' (our a) */
  void                   *c;
  float                   beta;
  /* WGRAD with depth not a multiple of 16: a and b are copied from these
   * into scratch at these offsets, rows padded to k. */
  gboolean                padded;
  const void             *src_a, *src_b;
  gsize                   scratch_a, scratch_b;
  /* Initialised in place (cublasLtMatrixLayoutInit()): nothing to
   * allocate or destroy per call. */
  cublasLtMatrixLayoutOpaque_t layout_a, layout_b, layout_c;
  cublasLtMatmulAlgo_t    algo;
} GmlpCudaFp8Product;

/* What the heuristics depend on. */
typedef struct {
  int      ordinal;
  int      m, n, k;
  int      a_type, b_type, c_type;
  int      accumulate;
  guint32  align_a, align_b, align_c;
} GmlpCudaFp8AlgoKey;

static GMutex algo_cache_lock;
static GHashTable *algo_cache;   /* GmlpCudaFp8AlgoKey -> cublasLtMatmulAlgo_t */

static guint
algo_key_hash (gconstpointer p)
{
  const GmlpCudaFp8AlgoKey *key = p;
  guint h = 5381;

  h = h * 33 + (guint) key->ordinal;
  h = h * 33 + (guint) key->m;
  h = h * 33 + (guint) key->n;
  h = h * 33 + (guint) key->k;
  h = h * 33 + (guint) (key->a_type * 64 + key->b_type * 8 + key->c_type);
  h = h * 33 + (guint) key->accumulate;
  h = h * 33 + key->align_a * 7 + key->align_b * 3 + key->align_c;
  return h;
}

static gboolean
algo_key_equal (gconstpointer a,
                gconstpointer b)
{
  const GmlpCudaFp8AlgoKey *x = a, *y = b;

  return x->ordinal == y->ordinal && x->m == y->m && x->n == y->n && x->k == y->k &&
         x->a_type == y->a_type && x->b_type == y->b_type && x->c_type == y->c_type &&
         x->accumulate == y->accumulate && x->align_a == y->align_a &&
         x->align_b == y->align_b && x->align_c == y->align_c;
}

static gboolean
algo_cache_lookup (const GmlpCudaFp8AlgoKey *key,
                   cublasLtMatmulAlgo_t     *algo)
{
  cublasLtMatmulAlgo_t *found = NULL;

  g_mutex_lock (&algo_cache_lock);
  if (algo_cache != NULL)
    found = g_hash_table_lookup (algo_cache, key);
  if (found != NULL)
    *algo = *found;
  g_mutex_unlock (&algo_cache_lock);
  return found != NULL;
}

static void
algo_cache_insert (const GmlpCudaFp8AlgoKey   *key,
                   const cublasLtMatmulAlgo_t *algo)
{
  g_mutex_lock (&algo_cache_lock);
  if (algo_cache == NULL || g_hash_table_size (algo_cache) >= GMLP_CUDA_FP8_ALGO_CACHE_MAX)
    {
      g_clear_pointer (&algo_cache, g_hash_table_unref);
      algo_cache = g_hash_table_new_full (algo_key_hash, algo_key_equal, g_free, g_free);
    }
  g_hash_table_replace (algo_cache, g_memdup2 (key, sizeof *key), g_memdup2 (algo, sizeof *algo));
  g_mutex_unlock (&algo_cache_lock);
}

static const char *
kind_name (GmlpGemmKind kind)
{
  switch (kind)
    {
    case GMLP_GEMM_FPROP: return "FPROP";
    case GMLP_GEMM_DGRAD: return "DGRAD";
    case GMLP_GEMM_WGRAD: return "WGRAD";
    default:              return "?";
    }
}

gboolean
gmlp_cuda_cublaslt_init (GmlpBackendDevice  *device,
                         GError            **error)
{
  cublasStatus_t status;

  status = cublasLtCreate (&device->cublaslt);
  if (status != CUBLAS_STATUS_SUCCESS)
    {
      device->cublaslt = NULL;
      return gmlp_cuda_blas_fail (error, "cuBLASLt", "cublasLtCreate", status, "cuda:%d", device->ordinal);
    }

  /* cuBLASLt takes its workspace per call; one buffer from the pool serves
   * every call, which all run on the compute stream, in order. */
  device->cublaslt_workspace = gmlp_cuda_alloc (device, GMLP_CUDA_CUBLASLT_WORKSPACE, error);
  return device->cublaslt_workspace != NULL;
}

/* Safe on a partly initialised device. The caller has made the device
 * current and still has its stream. */
void
gmlp_cuda_cublaslt_fini (GmlpBackendDevice *device)
{
  if (device->cublaslt != NULL)
    (void) cublasLtDestroy (device->cublaslt);
  device->cublaslt = NULL;

  /* Stream-ordered: after the products that may still use it. */
  if (device->cublaslt_workspace != NULL && device->stream != NULL)
    (void) cudaFreeAsync (device->cublaslt_workspace, device->stream);
  device->cublaslt_workspace = NULL;
}

static gboolean
fp8_type (int             dtype,
          cudaDataType_t *type)
{
  switch (dtype)
    {
    case GMLP_NUM_FLOAT8_E4M3:
      *type = CUDA_R_8F_E4M3;
      return TRUE;
    case GMLP_NUM_FLOAT8_E5M2:
      *type = CUDA_R_8F_E5M2;
      return TRUE;
    default:
      return FALSE;
    }
}

static gboolean
output_type (int             dtype,
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

static gsize
round_up (gsize n,
          gsize to)
{
  return (n + to - 1) / to * to;
}

/* What a call is, once checked. */
typedef struct {
  cudaDataType_t  a_type, b_type, c_type;   /* our a, b and C */
  GArray         *products;                 /* GmlpCudaFp8Product */
  GArray         *zeroed;                   /* guint: groups whose C_i = 0 */
  gsize           scratch_bytes;
} GmlpCudaFp8Plan;

static void
plan_clear (GmlpCudaFp8Plan *plan)
{
  g_clear_pointer (&plan->products, g_array_unref);
  g_clear_pointer (&plan->zeroed, g_array_unref);
}

/* Checks the call and lists its products; enqueues nothing. */
static gboolean
fp8_validate (const GmlpCudaGroups  *gemm,
              GmlpCudaFp8Plan       *plan,
              GError               **error)
{
  const char *kind = kind_name (gemm->kind);
  gsize c_size;

  if (gemm->kind != GMLP_GEMM_FPROP && gemm->kind != GMLP_GEMM_DGRAD &&
      gemm->kind != GMLP_GEMM_WGRAD)
    {
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "CUDA: FP8 GEMM: no such kind of product (%d)", (int) gemm->kind);
      return FALSE;
    }
  if (!fp8_type (gemm->ab_dtype, &plan->a_type) || !fp8_type (gemm->b_dtype, &plan->b_type))
    {
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "CUDA: FP8 GEMM %s takes FLOAT8_E4M3 or FLOAT8_E5M2 operands, not dtypes %d "
                   "and %d", kind, gemm->ab_dtype, gemm->b_dtype);
      return FALSE;
    }
  if (gemm->ab_dtype == GMLP_NUM_FLOAT8_E5M2 && gemm->b_dtype == GMLP_NUM_FLOAT8_E5M2)
    {
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "CUDA: FP8 GEMM %s: cuBLASLt has no E5M2 × E5M2 product (use E4M3 for "
                   "one operand: the E4M3 or HYBRID format)", kind);
      return FALSE;
    }
  if (!output_type (gemm->c_dtype, &plan->c_type))
    {
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "CUDA: FP8 GEMM %s writes FLOAT32, FLOAT16 or BFLOAT16, not dtype %d",
                   kind, gemm->c_dtype);
      return FALSE;
    }
  if (gemm->n < 0 || gemm->k < 0 || gemm->n > G_MAXINT || gemm->k > G_MAXINT)
    {
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "CUDA: FP8 GEMM %s: sizes out of range (n=%" G_GINT64_FORMAT ", k=%"
                   G_GINT64_FORMAT ")", kind, gemm->n, gemm->k);
      return FALSE;
    }
  if (gemm->n_groups == 0)
    return TRUE;
  if (gemm->n % GMLP_CUDA_FP8_ALIGNMENT != 0 || gemm->k % GMLP_CUDA_FP8_ALIGNMENT != 0)
    {
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "CUDA: FP8 GEMM %s: cuBLASLt's FP8 products need in_features and "
                   "out_features that are multiples of %d (16-byte rows); got k=%" G_GINT64_FORMAT
                   ", n=%" G_GINT64_FORMAT, kind, GMLP_CUDA_FP8_ALIGNMENT, gemm->k, gemm->n);
      return FALSE;
    }
  if (gemm->rows == NULL || gemm->a == NULL || gemm->b == NULL || gemm->c == NULL ||
      gemm->a_scale_inv == NULL || gemm->b_scale_inv == NULL)
    {
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "CUDA: FP8 GEMM %s: missing group sizes, operands or scales", kind);
      return FALSE;
    }

  c_size = gmlp_num_dtype_size (gemm->c_dtype);
  plan->products = g_array_new (FALSE, TRUE, sizeof (GmlpCudaFp8Product));
  plan->zeroed = g_array_new (FALSE, FALSE, sizeof (guint));

  for (guint i = 0; i < gemm->n_groups; i++)
    {
      gint64 rows, cols, depth, padded_depth;
      GmlpCudaFp8Product p = { 0, };

      if (gemm->rows[i] < 0 || gemm->rows[i] > G_MAXINT - GMLP_CUDA_FP8_ALIGNMENT)
        {
          g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_UNSUPPORTED,
                       "CUDA: FP8 GEMM %s: group %u has %" G_GINT64_FORMAT " rows", kind, i,
                       gemm->rows[i]);
          return FALSE;
        }
      gmlp_cuda_groups_shape (gemm, i, &rows, &cols, &depth);
      if (rows == 0 || cols == 0)
        continue;
      if (gemm->c[i] == NULL || (guintptr) gemm->c[i] % GMLP_CUDA_FP8_ALIGNMENT != 0)
        {
          g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_UNSUPPORTED,
                       "CUDA: FP8 GEMM %s: the output of group %u is missing or not aligned "
                       "to %d bytes", kind, i, GMLP_CUDA_FP8_ALIGNMENT);
          return FALSE;
        }
      if (depth == 0)
        {
          /* An empty sum is zero; cuBLASLt is not asked for one. */
          if (!gmlp_cuda_groups_accumulates (gemm, i))
            g_array_append_val (plan->zeroed, i);
          continue;
        }
      if (gemm->a[i] == NULL || gemm->b[i] == NULL ||
          gemm->a_scale_inv[i] == NULL || gemm->b_scale_inv[i] == NULL)
        {
          g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                       "CUDA: FP8 GEMM %s: group %u is missing an operand or a scale", kind, i);
          return FALSE;
        }
      if ((guintptr) gemm->a_scale_inv[i] % sizeof (float) != 0 ||
          (guintptr) gemm->b_scale_inv[i] % sizeof (float) != 0)
        {
          g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                       "CUDA: FP8 GEMM %s: a scale of group %u is not aligned to 4 bytes", kind, i);
          return FALSE;
        }

      padded_depth = (gint64) round_up ((gsize) depth, GMLP_CUDA_FP8_ALIGNMENT);
      p.group = i;
      p.m = (int) cols;
      p.n = (int) rows;
      p.k = (int) padded_depth;
      p.depth = (int) depth;
      p.a = gemm->b[i];
      p.b = gemm->a[i];
      p.a_scale = gemm->b_scale_inv[i];
      p.b_scale = gemm->a_scale_inv[i];
      p.c = gemm->c[i];
      p.beta = gmlp_cuda_groups_accumulates (gemm, i) ? 1.0f : 0.0f;

      if (padded_depth != depth ||
          (guintptr) p.a % GMLP_CUDA_FP8_ALIGNMENT != 0 || (guintptr) p.b % GMLP_CUDA_FP8_ALIGNMENT != 0)
        {
          /* Only WGRAD sums over the tokens; FPROP and DGRAD sum over
           * features, checked above, and their operands are members of
           * grouped tensors, on 256-byte boundaries. */
          if (gemm->kind != GMLP_GEMM_WGRAD)
            {
              g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_UNSUPPORTED,
                           "CUDA: FP8 GEMM %s: an operand of group %u is not aligned to %d bytes",
                           kind, i, GMLP_CUDA_FP8_ALIGNMENT);
              return FALSE;
            }
          p.padded = TRUE;
          p.src_a = p.a;
          p.src_b = p.b;
          p.scratch_a = plan->scratch_bytes;
          plan->scratch_bytes += round_up ((gsize) p.m * (gsize) p.k, GMLP_CUDA_FP8_SCRATCH_ALIGNMENT);
          p.scratch_b = plan->scratch_bytes;
          plan->scratch_bytes += round_up ((gsize) p.n * (gsize) p.k, GMLP_CUDA_FP8_SCRATCH_ALIGNMENT);
        }
      if (((gsize) p.m * c_size) % GMLP_CUDA_FP8_ALIGNMENT != 0)
        {
          g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_UNSUPPORTED,
                       "CUDA: FP8 GEMM %s: output rows of %d values are not a multiple of %d bytes",
                       kind, p.m, GMLP_CUDA_FP8_ALIGNMENT);
          return FALSE;
        }
      g_array_append_val (plan->products, p);
    }
  return TRUE;
}

/* Makes the layouts of every product and finds each its algorithm, from
 * the cache or the heuristics. Enqueues nothing. The scale pointers of the
 * first product stand in for all: the heuristics never read them. */
static gboolean
fp8_prepare (GmlpBackendDevice     *device,
             const GmlpCudaGroups  *gemm,
             GmlpCudaFp8Plan       *plan,
             cublasLtMatmulDesc_t   desc,
             GError               **error)
{
  cublasLtMatmulPreferenceOpaque_t pref_data;
  cublasLtMatmulPreference_t pref = &pref_data;
  const size_t workspace = GMLP_CUDA_CUBLASLT_WORKSPACE;
  cublasStatus_t status;

  /* In place, like the layouts: no allocation per call. */
  status = cublasLtMatmulPreferenceInit (pref);
  if (status != CUBLAS_STATUS_SUCCESS)
    return gmlp_cuda_blas_fail (error, "cuBLASLt", "cublasLtMatmulPreferenceInit", status, "FP8 %s",
                          kind_name (gemm->kind));
  status = cublasLtMatmulPreferenceSetAttribute (pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &workspace, sizeof workspace);
  if (status != CUBLAS_STATUS_SUCCESS)
    return gmlp_cuda_blas_fail (error, "cuBLASLt", "cublasLtMatmulPreferenceSetAttribute", status, "workspace");

  for (guint j = 0; j < plan->products->len; j++)
    {
      GmlpCudaFp8Product *p = &g_array_index (plan->products, GmlpCudaFp8Product, j);
      GmlpCudaFp8AlgoKey key;
      cublasLtMatmulHeuristicResult_t result;
      int n_results = 0;

      if ((status = cublasLtMatrixLayoutInit (&p->layout_a, plan->b_type, p->k, p->m, p->k)) != CUBLAS_STATUS_SUCCESS ||
          (status = cublasLtMatrixLayoutInit (&p->layout_b, plan->a_type, p->k, p->n, p->k)) != CUBLAS_STATUS_SUCCESS ||
          (status = cublasLtMatrixLayoutInit (&p->layout_c, plan->c_type, p->m, p->n, p->m)) != CUBLAS_STATUS_SUCCESS)
        return gmlp_cuda_blas_fail (error, "cuBLASLt", "cublasLtMatrixLayoutInit", status, "FP8 %s group %u",
                                    kind_name (gemm->kind), p->group);

      memset (&key, 0, sizeof key);
      key.ordinal = device->ordinal;
      key.m = p->m;
      key.n = p->n;
      key.k = p->k;
      key.a_type = (int) plan->b_type;
      key.b_type = (int) plan->a_type;
      key.c_type = (int) plan->c_type;
      key.accumulate = p->beta != 0.0f;
      /* The padded scratch is allocated on 256-byte boundaries. */
      key.align_a = p->padded ? GMLP_CUDA_FP8_SCRATCH_ALIGNMENT : gmlp_cuda_blas_pointer_alignment (p->a);
      key.align_b = p->padded ? GMLP_CUDA_FP8_SCRATCH_ALIGNMENT : gmlp_cuda_blas_pointer_alignment (p->b);
      key.align_c = gmlp_cuda_blas_pointer_alignment (p->c);
      if (algo_cache_lookup (&key, &p->algo))
        continue;

      if ((status = cublasLtMatmulPreferenceSetAttribute (pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                          &key.align_a, sizeof key.align_a)) != CUBLAS_STATUS_SUCCESS ||
          (status = cublasLtMatmulPreferenceSetAttribute (pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                          &key.align_b, sizeof key.align_b)) != CUBLAS_STATUS_SUCCESS ||
          (status = cublasLtMatmulPreferenceSetAttribute (pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                          &key.align_c, sizeof key.align_c)) != CUBLAS_STATUS_SUCCESS ||
          (status = cublasLtMatmulPreferenceSetAttribute (pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                          &key.align_c, sizeof key.align_c)) != CUBLAS_STATUS_SUCCESS)
        return gmlp_cuda_blas_fail (error, "cuBLASLt", "cublasLtMatmulPreferenceSetAttribute", status,
                                    "alignment");

      status = cublasLtMatmulAlgoGetHeuristic (device->cublaslt, desc, &p->layout_a, &p->layout_b,
                                               &p->layout_c, &p->layout_c, pref, 1, &result,
                                               &n_results);
      if (status != CUBLAS_STATUS_SUCCESS || n_results == 0)
        {
          g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_UNSUPPORTED,
                       "CUDA: FP8 GEMM %s: cuBLASLt has no kernel for group %u (%d × %d × %d, "
                       "FP8 types %d × %d into %d%s): %s", kind_name (gemm->kind), p->group,
                       p->n, p->m, p->depth, gemm->ab_dtype, gemm->b_dtype, gemm->c_dtype,
                       p->beta != 0.0f ? ", accumulating" : "",
                       status != CUBLAS_STATUS_SUCCESS ? cublasGetStatusName (status)
                                                       : "no algorithm found");
          (void) cudaGetLastError ();
          return FALSE;
        }
      p->algo = result.algo;
      algo_cache_insert (&key, &p->algo);
    }
  return TRUE;
}

static gboolean
fp8_set_desc (cublasLtMatmulDesc_t       desc,
              cublasLtMatmulDescAttributes_t attr,
              const void                *value,
              size_t                     size,
              GError                   **error)
{
  cublasStatus_t status = cublasLtMatmulDescSetAttribute (desc, attr, value, size);

  if (status != CUBLAS_STATUS_SUCCESS)
    return gmlp_cuda_blas_fail (error, "cuBLASLt", "cublasLtMatmulDescSetAttribute", status, "attribute %d", (int) attr);
  return TRUE;
}

/* Copies the operands of the padded WGRAD groups into zeroed scratch. */
static gboolean
fp8_pad_operands (GmlpBackendDevice  *device,
                  GmlpCudaFp8Plan    *plan,
                  guint8             *scratch,
                  GError            **error)
{
  cudaError_t err;

  err = cudaMemsetAsync (scratch, 0, plan->scratch_bytes, device->stream);
  if (err != cudaSuccess)
    return gmlp_cuda_fail (error, "cudaMemsetAsync", err);

  for (guint j = 0; j < plan->products->len; j++)
    {
      GmlpCudaFp8Product *p = &g_array_index (plan->products, GmlpCudaFp8Product, j);

      if (!p->padded)
        continue;
      /* A' is m rows (of the transposed weight gradient's columns) of depth
       * bytes, B' n rows; each row padded to k. */
      err = cudaMemcpy2DAsync (scratch + p->scratch_a, (size_t) p->k, p->src_a, (size_t) p->depth,
                               (size_t) p->depth, (size_t) p->m, cudaMemcpyDeviceToDevice,
                               device->stream);
      if (err == cudaSuccess)
        err = cudaMemcpy2DAsync (scratch + p->scratch_b, (size_t) p->k, p->src_b, (size_t) p->depth,
                                 (size_t) p->depth, (size_t) p->n, cudaMemcpyDeviceToDevice,
                                 device->stream);
      if (err != cudaSuccess)
        return gmlp_cuda_fail (error, "cudaMemcpy2DAsync", err);
      p->a = scratch + p->scratch_a;
      p->b = scratch + p->scratch_b;
    }
  return TRUE;
}

/* The padded copies of fp8_blockwise_padded(): each group's rows rounded
 * up to 16, the copies of a then of b laid out from scratch as grouped
 * tensors of those rows, and the product on them; the bytes they take. */
static gsize
fp8_padded_describe (const GmlpCudaGroups *gemm,
                     guint8               *scratch,
                     gint64               *rows,
                     gpointer             *pa,
                     gpointer             *pb,
                     GmlpCudaGroups       *padded)
{
  guint n = gemm->n_groups;
  gsize total = 0;

  for (guint g = 0; g < n; g++)
    {
      rows[g] = (gint64) round_up ((gsize) MAX (gemm->rows[g], 0), GMLP_CUDA_FP8_ALIGNMENT);
      pa[g] = scratch + total;
      total += gmlp_num_member_stride (rows[g], (guint64) gemm->n);
    }
  for (guint g = 0; g < n; g++)
    {
      pb[g] = scratch + total;
      total += gmlp_num_member_stride (rows[g], (guint64) gemm->k);
    }
  *padded = *gemm;
  padded->rows = rows;
  padded->a = (const void * const *) pa;
  padded->b = (const void * const *) pb;
  return total;
}

/* Whether the Hopper kernel takes the padded product (*reason: why not).
 * The check reads the layout only, never the memory: scratch may be any
 * address aligned as the pool aligns its blocks. */
static gboolean
fp8_padded_covered (GmlpBackendDevice     *device,
                    const GmlpCudaGroups  *gemm,
                    guint8                *scratch,
                    gint64                *rows,
                    gpointer              *pa,
                    gpointer              *pb,
                    GmlpKernelDeviceGemm  *kernel_gemm,
                    gsize                 *total,
                    const char           **reason)
{
  GmlpCudaGroups padded;

  *total = fp8_padded_describe (gemm, scratch, rows, pa, pb, &padded);
  return gmlp_cuda_groups_kernel_gemm (&padded, kernel_gemm, reason) &&
         gmlp_cuda_gemm_sm90_covers (device, kernel_gemm, reason);
}

/* Blockwise WGRAD whose groups' rows are not all multiples of 16: the
 * kernel reads the columnwise copies (rows of m_i bytes) by TMA, which
 * wants 16-byte rows, so the copies go into zeroed scratch laid out as
 * grouped tensors of round_up (m_i, 16) rows. Zeros add nothing, and the
 * padded rows stay inside each group's last 128-deep block of scales
 * (128 is a multiple of 16). The kernel's taking the padded product was
 * asked beforehand (gmlp_cuda_gemm_fp8_padded_supported()). */
static gboolean
fp8_blockwise_padded (GmlpBackendDevice     *device,
                      const GmlpCudaGroups  *gemm,
                      GError               **error)
{
  guint n = gemm->n_groups;
  g_autofree gint64 *rows = g_new (gint64, n);
  g_autofree gpointer *pa = g_new (gpointer, 2 * (gsize) n);
  gpointer *pb = pa + n;
  GmlpKernelDeviceGemm kernel_gemm;
  GmlpCudaGroups padded;
  const char *reason = NULL;
  gsize total;
  guint8 *scratch;
  gboolean ok = FALSE;
  cudaError_t err;

  total = fp8_padded_describe (gemm, (guint8 *) (guintptr) GMLP_CUDA_FP8_SCRATCH_ALIGNMENT, rows,
                               pa, pb, &padded);
  scratch = gmlp_cuda_alloc (device, MAX (total, 1), error);
  if (scratch == NULL)
    return FALSE;
  if (!fp8_padded_covered (device, gemm, scratch, rows, pa, pb, &kernel_gemm, &total, &reason))
    {
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "CUDA: FP8 GEMM %s with blockwise scales runs on libgmlp's Hopper kernel only: %s",
                   kind_name (gemm->kind), reason != NULL ? reason : "not covered");
      goto out;
    }

  err = cudaMemsetAsync (scratch, 0, total, device->stream);
  for (guint g = 0; g < n && err == cudaSuccess; g++)
    {
      gsize m = (gsize) MAX (gemm->rows[g], 0);

      if (m == 0)
        continue;
      /* Member g of a copy: n (or k) rows of m_g bytes. */
      err = cudaMemcpy2DAsync (pa[g], (size_t) rows[g], gemm->a[g], m, m, (size_t) gemm->n,
                               cudaMemcpyDeviceToDevice, device->stream);
      if (err == cudaSuccess)
        err = cudaMemcpy2DAsync (pb[g], (size_t) rows[g], gemm->b[g], m, m, (size_t) gemm->k,
                                 cudaMemcpyDeviceToDevice, device->stream);
    }
  if (err != cudaSuccess)
    {
      gmlp_cuda_fail (error, "cudaMemcpy2DAsync", err);
      goto out;
    }
  ok = gmlp_cuda_gemm_sm90_run (device, &kernel_gemm, error);

out:
  /* Stream-ordered: the product enqueued above still reads it. */
  gmlp_cuda_free (device, scratch);
  return ok;
}

/* Whether the Hopper kernel takes the padded copies of
 * GMLP_CUDA_ROUTE_SM90_PADDED; FALSE: why, in *reason. */
gboolean
gmlp_cuda_gemm_fp8_padded_supported (GmlpBackendDevice     *device,
                                     const GmlpCudaGroups  *gemm,
                                     const char           **reason)
{
  g_autofree gint64 *rows = g_new (gint64, gemm->n_groups);
  g_autofree gpointer *pointers = g_new (gpointer, 2 * (gsize) gemm->n_groups);
  GmlpKernelDeviceGemm kernel_gemm;
  gsize total;

  return fp8_padded_covered (device, gemm, (guint8 *) (guintptr) GMLP_CUDA_FP8_SCRATCH_ALIGNMENT,
                             rows, pointers, pointers + gemm->n_groups, &kernel_gemm, &total,
                             reason);
}

/* Blockwise scales: the Hopper kernel's (gemm_supported said it takes
 * the product). */
static gboolean
fp8_blockwise (GmlpBackendDevice        *device,
               const GmlpCudaGroups     *gemm,
               const GmlpCudaGemmRoute  *route,
               GError                  **error)
{
  if (gemm->n_groups == 0)
    return TRUE;
  if (gemm->rows == NULL || gemm->a == NULL || gemm->b == NULL || gemm->c == NULL ||
      gemm->a_scale_inv == NULL || gemm->b_scale_inv == NULL)
    {
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "CUDA: FP8 GEMM %s: missing group sizes, operands or scales",
                   kind_name (gemm->kind));
      return FALSE;
    }
  if (!gmlp_cuda_activate (device, error))
    return FALSE;

  switch (route->choice.route)
    {
    case GMLP_CUDA_ROUTE_SM90_PADDED:
      return fp8_blockwise_padded (device, gemm, error);

    case GMLP_CUDA_ROUTE_SM90:
      return gmlp_cuda_gemm_sm90_run (device, &route->kernel_gemm, error);

    case GMLP_CUDA_ROUTE_DEQUANTIZED:
    default:
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "CUDA: FP8 GEMM %s with blockwise scales runs on libgmlp's Hopper kernel only: %s",
                   kind_name (gemm->kind),
                   route->choice.reason != NULL ? route->choice.reason : "not covered");
      return FALSE;
    }
}

/* The route's executors, under scratch_lock: cuBLASLt's handle and
 * workspace and the device-sizes workspace are the device's. */
gboolean
gmlp_cuda_gemm_fp8_groups (GmlpBackendDevice        *device,
                           const GmlpCudaGroups     *gemm,
                           const GmlpCudaGemmRoute  *route,
                           GError                  **error)
{
  GmlpCudaFp8Plan plan = { 0, };
  cublasLtMatmulDescOpaque_t desc_data;
  cublasLtMatmulDesc_t desc = NULL;
  const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  const int8_t fast_accum = 0;
  const float alpha = 1.0f;
  gpointer scratch = NULL;
  cublasStatus_t status;
  gsize c_size;
  gboolean ok = FALSE;

  if (route->product.blockwise)
    return fp8_blockwise (device, gemm, route, error);
  if (!fp8_validate (gemm, &plan, error))
    goto out;
  if (plan.products == NULL || (plan.products->len == 0 && plan.zeroed->len == 0))
    {
      ok = TRUE;
      goto out;
    }
  if (!gmlp_cuda_activate (device, error))
    goto out;

  /* On libgmlp's Hopper kernel where the route puts it: one launch for
   * all groups instead of a cuBLASLt call per group. */
  if (route->choice.route == GMLP_CUDA_ROUTE_SM90)
    {
      ok = gmlp_cuda_gemm_sm90_run (device, &route->kernel_gemm, error);
      goto out;
    }
  if (route->choice.route != GMLP_CUDA_ROUTE_CUBLASLT)
    {
      /* FP8 tensor cores: compute capability 8.9 (Ada) and 9.0 (Hopper) on. */
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "CUDA: FP8 GEMM: %s (cuda:%d, compute capability %d.%d) has no FP8 tensor "
                   "cores (8.9 or later needed); use the blockwise or MXFP8 recipe, which "
                   "multiply dequantized values", device->name, device->ordinal,
                   device->props.major, device->props.minor);
      goto out;
    }

  c_size = gmlp_num_dtype_size (gemm->c_dtype);
  if (plan.products->len > 0)
    {
      const GmlpCudaFp8Product *first = &g_array_index (plan.products, GmlpCudaFp8Product, 0);

      /* In place: nothing to allocate or destroy per call. */
      status = cublasLtMatmulDescInit (&desc_data, CUBLAS_COMPUTE_32F, CUDA_R_32F);
      if (status != CUBLAS_STATUS_SUCCESS)
        {
          gmlp_cuda_blas_fail (error, "cuBLASLt", "cublasLtMatmulDescInit", status, "FP8 %s", kind_name (gemm->kind));
          goto out;
        }
      desc = &desc_data;
      /* TN, FP32 sums promoted out of the tensor cores' accumulators. */
      if (!fp8_set_desc (desc, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof transa, error) ||
          !fp8_set_desc (desc, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof transb, error) ||
          !fp8_set_desc (desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum, sizeof fast_accum, error) ||
          !fp8_set_desc (desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &first->a_scale,
                         sizeof first->a_scale, error) ||
          !fp8_set_desc (desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &first->b_scale,
                         sizeof first->b_scale, error))
        goto out;
      if (!fp8_prepare (device, gemm, &plan, desc, error))
        goto out;
    }

  /* Checked: from here on, work is enqueued. */
  if (plan.scratch_bytes > 0)
    {
      scratch = gmlp_cuda_alloc (device, plan.scratch_bytes, error);
      if (scratch == NULL || !fp8_pad_operands (device, &plan, scratch, error))
        goto out;
    }

  for (guint j = 0; j < plan.zeroed->len; j++)
    {
      guint i = g_array_index (plan.zeroed, guint, j);
      gint64 rows, cols, depth;
      cudaError_t err;

      gmlp_cuda_groups_shape (gemm, i, &rows, &cols, &depth);
      err = cudaMemsetAsync (gemm->c[i], 0, (gsize) rows * (gsize) cols * c_size, device->stream);
      if (err != cudaSuccess)
        {
          gmlp_cuda_fail (error, "cudaMemsetAsync", err);
          goto out;
        }
    }

  for (guint j = 0; j < plan.products->len; j++)
    {
      GmlpCudaFp8Product *p = &g_array_index (plan.products, GmlpCudaFp8Product, j);

      /* The pointers are read now, on the host: one descriptor serves all
       * groups. */
      if (!fp8_set_desc (desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &p->a_scale,
                         sizeof p->a_scale, error) ||
          !fp8_set_desc (desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &p->b_scale,
                         sizeof p->b_scale, error))
        goto out;
      status = cublasLtMatmul (device->cublaslt, desc, &alpha, p->a, &p->layout_a, p->b, &p->layout_b,
                               &p->beta, p->c, &p->layout_c, p->c, &p->layout_c, &p->algo,
                               device->cublaslt_workspace, GMLP_CUDA_CUBLASLT_WORKSPACE,
                               device->stream);
      if (status != CUBLAS_STATUS_SUCCESS)
        {
          gmlp_cuda_blas_fail (error, "cuBLASLt", "cublasLtMatmul", status, "FP8 %s group %u, m=%" G_GINT64_FORMAT
                         ", n=%" G_GINT64_FORMAT ", k=%" G_GINT64_FORMAT, kind_name (gemm->kind),
                         p->group, gemm->rows[p->group], gemm->n, gemm->k);
          goto out;
        }
    }
  /* An FPROP's bias onto the stored product (cuBLASLt adding into a
   * 16-bit C would round the product first anyway). */
  ok = gemm->kind != GMLP_GEMM_FPROP || gemm->bias == NULL ||
       gmlp_cuda_add_bias (device, gemm->n_groups, gemm->rows, gemm->n, gemm->c_dtype, gemm->c,
                           gemm->bias, error);

out:
  /* Stream-ordered: the products enqueued above still read it. */
  if (scratch != NULL)
    gmlp_cuda_free (device, scratch);
  plan_clear (&plan);
  return ok;
}
