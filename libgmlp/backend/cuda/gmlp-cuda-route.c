/* gmlp-cuda-route.c: the CUDA backend's rule for which kernel or library
 * runs a product, and what it reads of the product
 *
 * Pure functions: no CUDA, no device, no state. gmlp_cuda_route_describe()
 * reads a GmlpBackendGemm (with host sizes, group by group, through the
 * tables of gmlp_cuda_groups_init()) into the short description that
 * gmlp_cuda_route() decides on; the gemm entry (gmlp-cuda-gemm-entry.c)
 * adds the Hopper kernel's answer. docs/routes.md has the rule as a table,
 * row by row with its reason; the comments below say the same in the
 * code's terms.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-numeric.h"
#include "gmlp-cuda-route.h"

/* The grouped call needs GMLP_CUDA_GROUPED_MIN_PRODUCTS products of at
 * most this many floating-point operations (2 m n k) on average. */
#define GMLP_CUDA_GROUPED_MAX_MEAN_FLOP 4e9

/* Products all of one shape (balanced routing) run as one
 * cublasGemmBatchedEx() call, which puts the tiles of all of them in one
 * grid, where a loop leaves each product's last wave part empty, or SMs
 * idle on a product smaller than the GPU. A product that fills the GPU for
 * several waves runs as well or better in the kernel cuBLAS picks for its
 * shape alone, so only products under this mean size are batched. With
 * unequal products, whole row chunks batched and the remainders looped ran
 * below the loop, so only the uniform case is. */
#define GMLP_CUDA_BATCHED_MAX_MEAN_FLOP 64e9

/* The Hopper kernel takes the many small FPROP and DGRAD products unless
 * nearly every row lies in a whole row tile, which cuBLAS's batched call
 * runs best. */
#define GMLP_CUDA_SM90_MAX_TILED 0.95

/* FP8 alignment of cuBLASLt and of TMA: rows of whole 16-byte units. */
#define GMLP_CUDA_ROUTE_FP8_ALIGNMENT 16

/* cuBLAS's own alignment rule for the grouped and batched calls is per
 * size; the one that holds for every size keeps the check simple. */
#define GMLP_CUDA_ROUTE_POINTER_ALIGNMENT 16

const char gmlp_cuda_route_no_fp8_tensor_cores[] =
  "no FP8 tensor cores (compute capability 8.9 or later needed)";

/* Whether one cublasGemmGroupedBatchedEx() call (or one Hopper kernel
 * launch) beats a loop of tuned calls, one per group. A product large
 * enough to fill the GPU on its own runs best in cuBLAS's kernel tuned for
 * its shape; many small products run best as one launch that fills the
 * GPU with all of them. The cut, many (>= 16) products of under 4 GFLOP on
 * average, lies between the anchor shapes of 32 products of 30 GFLOP (the
 * loop wins) and 128 of 1.6 GFLOP (the grouped call wins). */
gboolean
gmlp_cuda_route_prefer_grouped (guint  n_products,
                                double total_flop)
{
  return n_products >= GMLP_CUDA_GROUPED_MIN_PRODUCTS &&
         total_flop < GMLP_CUDA_GROUPED_MAX_MEAN_FLOP * n_products;
}

void
gmlp_cuda_groups_init (const GmlpBackendGemm *gemm,
                       gpointer              *tables,
                       GmlpCudaGroups        *groups)
{
  guint n = gemm->n_groups;
  gboolean bias = gemm->kind == GMLP_GEMM_FPROP && gemm->bias.layout != GMLP_BACKEND_OPERAND_NONE;

  *groups = (GmlpCudaGroups) {
    .kind = gemm->kind,
    .n_groups = n,
    .rows = gemm->rows,
    .n = gemm->n,
    .k = gemm->k,
    .ab_dtype = gemm->a.dtype,
    .b_dtype = gemm->b.dtype,
    .c_dtype = gemm->c.dtype,
    .a = (const void * const *) tables,
    .b = (const void * const *) (tables + n),
    .c = (void * const *) (tables + 2 * n),
    .bias = bias ? (const void * const *) (tables + 3 * n) : NULL,
    .accumulate = gemm->kind == GMLP_GEMM_WGRAD ? gemm->accumulate : NULL,
    .a_scales = gemm->a.scales,
    .b_scales = gemm->b.scales,
  };
  gmlp_backend_gemm_members (gemm, &gemm->a, tables);
  gmlp_backend_gemm_members (gemm, &gemm->b, tables + n);
  gmlp_backend_gemm_members (gemm, &gemm->c, tables + 2 * n);
  if (bias)
    gmlp_backend_gemm_members (gemm, &gemm->bias, tables + 3 * n);
  if (!gmlp_backend_gemm_is_fp8 (gemm) || gemm->a.scale_inv == NULL || gemm->b.scale_inv == NULL)
    return;
  groups->a_scale_inv = (const float * const *) (tables + 4 * n);
  groups->b_scale_inv = (const float * const *) (tables + 5 * n);
  gmlp_backend_gemm_scale_members (gemm, &gemm->a, (const float **) (tables + 4 * n));
  gmlp_backend_gemm_scale_members (gemm, &gemm->b, (const float **) (tables + 5 * n));
}

static gboolean
pointer_aligned (const void *p)
{
  return (guintptr) p % GMLP_CUDA_ROUTE_POINTER_ALIGNMENT == 0;
}

/* The statistics of host sizes, in one pass over the groups: each group
 * has nothing to write (no output, or an empty sum added into its
 * output), an empty sum to set to zero, or a product. The groups'
 * products differ only in m_i and whether they accumulate. */
static void
describe_groups (const GmlpCudaGroups  *groups,
                 GmlpCudaRouteProduct  *p)
{
  gint64 first_rows = 0;
  gboolean first_accumulates = FALSE;

  p->aligned = p->uniform = p->rows_aligned = TRUE;
  for (guint g = 0; g < groups->n_groups; g++)
    {
      gint64 m = groups->rows[g];
      /* The description comes before the executors' checks, which refuse
       * sizes outside [0, G_MAXINT]; clamped, n_groups of them sum within
       * a gint64. */
      gint64 counted = CLAMP (m, 0, G_MAXINT);
      gboolean accumulates = gmlp_cuda_groups_accumulates (groups, g);
      gint64 out_rows, out_cols, depth;

      p->rows += counted;
      p->tiled_rows += counted / GMLP_CUDA_ROW_TILE * GMLP_CUDA_ROW_TILE;
      p->rows_aligned = p->rows_aligned && m % GMLP_CUDA_ROUTE_FP8_ALIGNMENT == 0;

      gmlp_cuda_groups_shape (groups, g, &out_rows, &out_cols, &depth);
      if (out_rows == 0 || out_cols == 0)
        continue;
      if (depth == 0)
        {
          p->n_zeroed += !accumulates;
          continue;
        }
      p->aligned = p->aligned && pointer_aligned (groups->a[g]) &&
                   pointer_aligned (groups->b[g]) && pointer_aligned (groups->c[g]);
      if (p->n_products == 0)
        first_rows = m, first_accumulates = accumulates;
      else if (m != first_rows || accumulates != first_accumulates)
        p->uniform = FALSE;
      p->n_products++;
      p->total_flop += 2.0 * (double) m * (double) groups->n * (double) groups->k;
    }
}

void
gmlp_cuda_route_describe (const GmlpBackendGemm  *gemm,
                          const GmlpCudaGroups   *groups,
                          GmlpCudaRouteProduct   *product)
{
  gboolean fp8 = gmlp_backend_gemm_is_fp8 (gemm);

  *product = (GmlpCudaRouteProduct) {
    .device_sizes = groups == NULL,
    .kind = gemm->kind,
    .ab_dtype = gemm->a.dtype,
    .c_dtype = gemm->c.dtype,
    .blockwise = fp8 && gmlp_backend_gemm_blockwise (gemm),
  };
  if (groups != NULL)
    describe_groups (groups, product);
}

gboolean
gmlp_cuda_route_asks_sm90 (const GmlpCudaRouteProduct *product)
{
  return product->device_sizes || product->blockwise || product->n_products > 0;
}

gboolean
gmlp_cuda_route_may_dequantize (const GmlpBackendGemm *gemm)
{
  if (!gmlp_backend_gemm_is_fp8 (gemm))
    return FALSE;
  if (gemm->rows == NULL)
    return TRUE;
  return gemm->n_groups > 0 && gmlp_backend_gemm_blockwise (gemm);
}

const char *
gmlp_cuda_route_name (GmlpCudaRoute route)
{
  switch (route)
    {
    case GMLP_CUDA_ROUTE_SM90:           return "sm90";
    case GMLP_CUDA_ROUTE_SM90_PADDED:    return "sm90-padded";
    case GMLP_CUDA_ROUTE_PORTABLE:       return "portable";
    case GMLP_CUDA_ROUTE_CUBLAS_LOOP:    return "cublas-loop";
    case GMLP_CUDA_ROUTE_CUBLAS_BATCHED: return "cublas-batched";
    case GMLP_CUDA_ROUTE_CUBLAS_GROUPED: return "cublas-grouped";
    case GMLP_CUDA_ROUTE_CUBLASLT:       return "cublaslt";
    case GMLP_CUDA_ROUTE_DEQUANTIZED:    return "dequantized";
    case GMLP_CUDA_ROUTE_UNSUPPORTED:    return "unsupported";
    default:                             return "?";
    }
}

static const char sm90_turned_off[] = "turned off by the device's tuning (device-gemm=portable)";

/* Whether the Hopper kernel takes the product: it covers it, and the
 * tuning's device_gemm 1 (device-gemm=portable, which the tests use to
 * reach the other routes on Hopper) does not turn it off; if not, why. */
static gboolean
sm90_takes (const GmlpCudaRouteProduct  *p,
            const GmlpBackendTuning     *tuning,
            const char                 **reason)
{
  if (p->sm90_unpacked)
    {
      *reason = p->sm90_reason;
      return FALSE;
    }
  if (tuning->device_gemm != 0)
    {
      *reason = sm90_turned_off;
      return FALSE;
    }
  *reason = p->sm90_reason != NULL ? p->sm90_reason : "not covered";
  return p->sm90_covers;
}

static GmlpCudaRouteChoice
route_to (GmlpCudaRoute route)
{
  return (GmlpCudaRouteChoice) { .route = route };
}

static GmlpCudaRouteChoice
route_refused (GmlpCudaRoute  route,
               const char    *reason)
{
  return (GmlpCudaRouteChoice) { .route = route, .reason = reason };
}

/* Whether there are two products or more, averaging under the batched
 * size. */
static gboolean
below_batched_size (const GmlpCudaRouteProduct *p)
{
  return p->n_products >= 2 &&
         p->total_flop < GMLP_CUDA_BATCHED_MAX_MEAN_FLOP * p->n_products;
}

/* Where libgmlp's Hopper kernel beats cuBLAS with host sizes:
 * - the many small products of gmlp_cuda_route_prefer_grouped(): WGRAD
 *   always, FPROP and DGRAD unless nearly every row lies in a whole row
 *   tile, which cuBLAS's batched call runs best;
 * - WGRAD and FPROP of unequal products below the batched size (a uniform
 *   set runs batched, faster still): the loop runs each product, of under
 *   a wave or a few, as a grid of its own ending in a part-empty wave,
 *   where the kernel runs all of them in one grid and its split tail
 *   evens the last wave.
 * 16-bit DGRAD stays on cuBLAS: its B arrives MN-major, which the kernel
 * reads slower. The tuning's host_gemm forces one side. */
static gboolean
gemm_prefer_sm90 (const GmlpCudaRouteProduct *p,
                  const GmlpBackendTuning    *tuning)
{
  GmlpCudaHostGemm forced = (GmlpCudaHostGemm) tuning->host_gemm;

  if (forced != GMLP_CUDA_HOST_GEMM_AUTO)
    return forced == GMLP_CUDA_HOST_GEMM_SM90;
  if (!gmlp_cuda_route_prefer_grouped (p->n_products, p->total_flop))
    {
      if (p->kind == GMLP_GEMM_DGRAD || !below_batched_size (p))
        return FALSE;
      return !p->uniform;
    }
  if (p->kind == GMLP_GEMM_WGRAD)
    return TRUE;
  return p->tiled_rows < GMLP_CUDA_SM90_MAX_TILED * p->rows;
}

/* The many-small-experts path of cuBLAS cuts FPROP's and DGRAD's groups
 * into tiles of GMLP_CUDA_ROW_TILE rows, batched, and runs the rows left
 * over as one grouped call: used when the tiles cover at least three
 * quarters of the rows. WGRAD sums over the rows, so its groups stay
 * whole. The tuning's row_tiles 1 turns tiling off. */
static gboolean
gemm_row_tiles (const GmlpCudaRouteProduct *p,
                const GmlpBackendTuning    *tuning)
{
  if (p->kind == GMLP_GEMM_WGRAD || tuning->row_tiles == 1)
    return FALSE;
  return p->tiled_rows * 4 >= p->rows * 3;
}

/* 16-bit and FP32 products with host sizes. */
static GmlpCudaRouteChoice
route_gemm (const GmlpCudaRouteProduct *p,
            const GmlpBackendTuning    *tuning)
{
  const char *reason;

  /* Rows G1-G3, G8 and G9 of docs/routes.md. */
  if (p->n_products > 0 && gemm_prefer_sm90 (p, tuning) && sm90_takes (p, tuning, &reason))
    return route_to (GMLP_CUDA_ROUTE_SM90);

  /* G4-G5. cuBLAS's grouped call takes only C of the operands' dtype. */
  if (p->n_products > 0 && p->aligned && p->c_dtype == p->ab_dtype &&
      p->n_products <= G_MAXINT &&
      gmlp_cuda_route_prefer_grouped (p->n_products, p->total_flop))
    {
      GmlpCudaRouteChoice choice = route_to (GMLP_CUDA_ROUTE_CUBLAS_GROUPED);

      choice.row_tiles = gemm_row_tiles (p, tuning);
      return choice;
    }

  /* G6. */
  if (p->aligned && p->n_products <= G_MAXINT && below_batched_size (p) &&
      tuning->batched != 1 && p->uniform)
    return route_to (GMLP_CUDA_ROUTE_CUBLAS_BATCHED);
  /* G7, also for groups that are only set to zero, with no product. */
  return route_to (GMLP_CUDA_ROUTE_CUBLAS_LOOP);
}

/* Where libgmlp's Hopper kernel beats cuBLASLt (measured on the anchor
 * shapes, operands quantized beforehand). For FPROP one launch for all
 * groups wins from about 16 groups on; cuBLASLt's kernels for one large
 * product keep the few large groups, and for DGRAD and WGRAD whatever
 * gmlp_cuda_route_prefer_grouped() leaves them. The tuning's host_gemm
 * forces one side. */
static gboolean
fp8_prefer_sm90 (const GmlpCudaRouteProduct *p,
                 const GmlpBackendTuning    *tuning)
{
  GmlpCudaHostGemm forced = (GmlpCudaHostGemm) tuning->host_gemm;

  if (forced != GMLP_CUDA_HOST_GEMM_AUTO)
    return forced == GMLP_CUDA_HOST_GEMM_SM90;
  if (p->kind == GMLP_GEMM_FPROP && p->n_products >= GMLP_CUDA_GROUPED_MIN_PRODUCTS)
    return TRUE;
  return gmlp_cuda_route_prefer_grouped (p->n_products, p->total_flop);
}

/* FP8 products with host sizes. Blockwise scales have no cuBLASLt path:
 * the Hopper kernel, or the layer's dequantized fall-back. Per-tensor
 * scales take the Hopper kernel where it wins and covers the product,
 * else cuBLASLt, which needs FP8 tensor cores. */
static GmlpCudaRouteChoice
route_fp8 (const GmlpCudaRouteProduct *p,
           const GmlpCudaDeviceProps  *props,
           const GmlpBackendTuning    *tuning)
{
  const char *reason;

  if (p->blockwise)
    {
      /* F1-F2: the kernel reads WGRAD's columnwise copies (rows of m_i
       * bytes) by TMA, which wants 16-byte rows. */
      if (p->kind == GMLP_GEMM_WGRAD && !p->rows_aligned)
        {
          if (tuning->device_gemm != 0)
            return route_refused (GMLP_CUDA_ROUTE_DEQUANTIZED, sm90_turned_off);
          return route_to (GMLP_CUDA_ROUTE_SM90_PADDED);
        }
      /* F3-F4. */
      if (sm90_takes (p, tuning, &reason))
        return route_to (GMLP_CUDA_ROUTE_SM90);
      return route_refused (GMLP_CUDA_ROUTE_DEQUANTIZED, reason);
    }

  /* F5, F6, F9, F10. */
  if (p->n_products > 0 && fp8_prefer_sm90 (p, tuning) && sm90_takes (p, tuning, &reason))
    return route_to (GMLP_CUDA_ROUTE_SM90);
  /* F7-F8. FP8 tensor cores: compute capability 8.9 (Ada) and 9.0
   * (Hopper) on. Groups that are only set to zero need none. */
  if (p->n_products > 0 && props->major * 10 + props->minor < 89)
    return route_refused (GMLP_CUDA_ROUTE_UNSUPPORTED, gmlp_cuda_route_no_fp8_tensor_cores);
  return route_to (GMLP_CUDA_ROUTE_CUBLASLT);
}

/* Device sizes: the Hopper kernel where it covers the product (sm_90, the
 * operands it multiplies, feature counts that TMA can address; the
 * tuning's device_gemm 1 turns it off), else the portable kernel, correct
 * if slower, which has no FP8 product. */
static GmlpCudaRouteChoice
route_device_sizes (const GmlpCudaRouteProduct *p,
                    const GmlpBackendTuning    *tuning)
{
  const char *reason;

  /* D1-D3. */
  if (sm90_takes (p, tuning, &reason))
    return route_to (GMLP_CUDA_ROUTE_SM90);
  if (gmlp_num_dtype_is_fp8 (p->ab_dtype))
    return route_refused (GMLP_CUDA_ROUTE_DEQUANTIZED, reason);
  return route_to (GMLP_CUDA_ROUTE_PORTABLE);
}

GmlpCudaRouteChoice
gmlp_cuda_route (const GmlpCudaRouteProduct  *product,
                 const GmlpCudaDeviceProps   *props,
                 const GmlpBackendTuning     *tuning)
{
  if (product->device_sizes)
    return route_device_sizes (product, tuning);
  if (gmlp_num_dtype_is_fp8 (product->ab_dtype))
    return route_fp8 (product, props, tuning);
      return route_gemm (product, tuning);
}
