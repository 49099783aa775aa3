/* gmlp-versus-loop: libgmlp's host-sizes products and a cuBLAS loop, interleaved
 *
 * gmlp-bench and bench/cublas_loop_steady.cu time libgmlp's forward and
 * ../shared/bench's "cuBLAS loop" in two processes. At the GPU's power
 * limit the clock that each timed window meets depends on what ran before
 * it, and moves the ratio of the two by a few percent either way even
 * where both run the same kernels (docs/performance.md, "How to
 * measure"). Here both run in one process on the same operands, in
 * alternating blocks of calls (A B, then B A, ...), so that every stretch
 * of the clock is shared between them, and the ratio is taken round by
 * round.
 *
 *   gmlp-versus-loop [-s SHAPE] [-r ROUTING] [--op fprop|dgrad|wgrad]
 *                    [--loop loop|batched|two-streams] [--rounds R]
 *                    [--block-ms MS] [--warm-ms MS] [--rest-ms MS]
 *
 * For fprop the loop is cublas_anchor.cu's: one cublasGemmEx per expert
 * that has rows, y_e = x_e W_eᵀ, row-major BF16, FP32 compute, cuBLAS's
 * default algorithm and math mode, on a handle and stream of its own with
 * a 32 MiB workspace. dgrad (dx_e = dy_e W_e) and wgrad (dW_e = dy_eᵀ x_e)
 * loop the same way. The operands are the layer's and gmlp-bench's (x, W
 * and dy, exported through DLPack); the loop writes a buffer of its own.
 * Other ways to run the same products, to see what each would gain over
 * the loop: --loop batched runs them as one cublasGemmBatchedEx (equal
 * sizes only); --loop two-streams alternates them between two streams and
 * handles (each with its workspace), forked from and joined to the first
 * by events around each call, so that one product's last wave can overlap
 * the next one's first.
 *
 * Before the rounds both sides run alternately for --warm-ms (default
 * 2000: past the clock's dip). Each block is as many
 * calls as take about --block-ms (default 25) on libgmlp's side, the same
 * number on both sides, between one pair of device events. libgmlp's dgrad
 * and wgrad consume what a forward (and backward) left them, so before
 * each of its blocks those run untimed, and after a dgrad block the
 * weight gradients it left pending, waited for before the loop's block.
 *
 * One JSON line per shape and routing: each side's TFLOP/s (the median
 * over rounds), the ratio libgmlp / loop (the median over rounds, its
 * quartiles, and the ratio of the summed times), and the blocks' size.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <gmlp.h>

#include "bench-json.h"
#include "bench-shapes.h"
#include <dlpack/dlpack.h>

static char *only_shape = NULL;
static char *only_routing = NULL;
static char *op_name = NULL;
static char *loop_kind = NULL;
static gint rounds = 40;
static gint block_ms = 25;
static gint warm_ms = 2000;
static gint rest_ms = 1000;

static const GOptionEntry entries[] = {
  { "shape", 's', 0, G_OPTION_ARG_STRING, &only_shape, "Run one shape only", "NAME" },
  { "routing", 'r', 0, G_OPTION_ARG_STRING, &only_routing, "Run one routing only: balanced or skewed",
    "ROUTING" },
  { "op", 0, 0, G_OPTION_ARG_STRING, &op_name, "fprop (the default), dgrad or wgrad", "OP" },
  { "loop", 0, 0, G_OPTION_ARG_STRING, &loop_kind,
    "loop (the default), batched (one cublasGemmBatchedEx, equal sizes) or two-streams", "KIND" },
  { "rounds", 0, 0, G_OPTION_ARG_INT, &rounds, "Rounds of one block each side (default 40)", "R" },
  { "block-ms", 0, 0, G_OPTION_ARG_INT, &block_ms, "About how long one block runs (default 25)", "MS" },
  { "warm-ms", 0, 0, G_OPTION_ARG_INT, &warm_ms, "Both sides alternately before the rounds (default 2000)",
    "MS" },
  { "rest-ms", 0, 0, G_OPTION_ARG_INT, &rest_ms, "Idle time before each shape and routing (default 1000)",
    "MS" },
  { NULL }
};

typedef enum { OP_FPROP, OP_DGRAD, OP_WGRAD } Op;
static const char *const op_names[] = { "fprop", "dgrad", "wgrad" };
static Op op = OP_FPROP;

#define CUDA_WORKSPACE_BYTES (32 << 20)
/* The most calls one block runs (each dgrad holds a forward's saved
 * activations until its call). */
#define MAX_BLOCK_CALLS 4096

/* One cublasGemmEx in cuBLAS's column-major terms. */
typedef struct {
  cublasOperation_t  transa, transb;
  int                m, n, k, lda, ldb, ldc;
  const void        *a, *b;
  void              *c;
} Product;

/* The cuBLAS side: a handle on a stream of its own (and a second of each
 * for --loop two-streams), and the products of the current shape. */
typedef struct {
  cudaStream_t    stream, stream2;
  cublasHandle_t  handle, handle2;
  void           *workspace, *workspace2;
  cudaEvent_t     start, end, fork, join;
  GArray         *products;
  void          **table;     /* --loop batched: A, B and C pointers on the device */
} Loop;

static gboolean
cuda_ok (cudaError_t status, const char *what, GError **error)
{
  if (status == cudaSuccess)
    return TRUE;
  g_set_error (error, G_IO_ERROR, G_IO_ERROR_FAILED, "%s: %s", what, cudaGetErrorString (status));
  return FALSE;
}

static gboolean
cublas_ok (cublasStatus_t status, const char *what, GError **error)
{
  if (status == CUBLAS_STATUS_SUCCESS)
    return TRUE;
  g_set_error (error, G_IO_ERROR, G_IO_ERROR_FAILED, "%s: %s", what, cublasGetStatusName (status));
  return FALSE;
}

static gboolean
batched (void)
{
  return g_strcmp0 (loop_kind, "batched") == 0;
}

static gboolean
two_streams (void)
{
  return g_strcmp0 (loop_kind, "two-streams") == 0;
}

/* A non-blocking stream, and a handle on it with a workspace of its own
 * (cublasSetStream() puts back cuBLAS's own, so ours comes after). */
static gboolean
handle_init (cudaStream_t *stream, cublasHandle_t *handle, void **workspace, GError **error)
{
  return cuda_ok (cudaStreamCreateWithFlags (stream, cudaStreamNonBlocking), "cudaStreamCreate", error) &&
         cublas_ok (cublasCreate (handle), "cublasCreate", error) &&
         cublas_ok (cublasSetStream (*handle, *stream), "cublasSetStream", error) &&
         cuda_ok (cudaMalloc (workspace, CUDA_WORKSPACE_BYTES), "cudaMalloc", error) &&
         cublas_ok (cublasSetWorkspace (*handle, *workspace, CUDA_WORKSPACE_BYTES), "cublasSetWorkspace", error);
}

static gboolean
loop_init (Loop *l, GError **error)
{
  memset (l, 0, sizeof *l);
  l->products = g_array_new (FALSE, FALSE, sizeof (Product));
  return handle_init (&l->stream, &l->handle, &l->workspace, error) &&
         handle_init (&l->stream2, &l->handle2, &l->workspace2, error) &&
         cuda_ok (cudaEventCreate (&l->start), "cudaEventCreate", error) &&
         cuda_ok (cudaEventCreate (&l->end), "cudaEventCreate", error) &&
         cuda_ok (cudaEventCreateWithFlags (&l->fork, cudaEventDisableTiming), "cudaEventCreate", error) &&
         cuda_ok (cudaEventCreateWithFlags (&l->join, cudaEventDisableTiming), "cudaEventCreate", error);
}

/* The products of op, one per group with rows (row-major BF16 x: M × K,
 * W: E × N × K, dy: M × N; out the loop's own, as large as the largest of
 * y, dx and dW), in cuBLAS's transposed view:
 *   fprop  yᵀ  [N × m] = W_e (K × N)ᵀ · xᵀ (K × m)
 *   dgrad  dxᵀ [K × m] = W_e (K × N) · dyᵀ (N × m)
 *   wgrad  dWᵀ [K × N] = xᵀ (K × m) · (dyᵀ (N × m))ᵀ */
static void
loop_set_products (Loop *l, const BenchShape *s, const gint64 *m, const guint16 *x, const guint16 *w,
                   const guint16 *dy, guint16 *out)
{
  const int K = (int) s->in, N = (int) s->out;
  gint64 row0 = 0;

  g_array_set_size (l->products, 0);
  for (gint64 e = 0; e < s->experts; row0 += m[e], e++)
    {
      const guint16 *w_e = w + e * s->out * s->in;
      Product p;

      if (m[e] == 0)
        continue;
      switch (op)
        {
        case OP_FPROP:
          p = (Product) { CUBLAS_OP_T, CUBLAS_OP_N, N, (int) m[e], K, K, K, N, w_e, x + row0 * K, out + row0 * N };
          break;
        case OP_DGRAD:
          p = (Product) { CUBLAS_OP_N, CUBLAS_OP_N, K, (int) m[e], N, K, N, K, w_e, dy + row0 * N, out + row0 * K };
          break;
        case OP_WGRAD:
          p = (Product) { CUBLAS_OP_N, CUBLAS_OP_T, K, N, (int) m[e], K, N, K, x + row0 * K, dy + row0 * N,
                          out + e * s->out * s->in };
          break;
        default:
          g_assert_not_reached ();
        }
      g_array_append_val (l->products, p);
    }
}

/* --loop batched: the pointer table of one batched call over every product. */
static gboolean
loop_make_table (Loop *l, GError **error)
{
  guint n = l->products->len;
  g_autofree const void **table = g_new (const void *, 3 * n);

  for (guint i = 0; i < n; i++)
    {
      const Product *p = &g_array_index (l->products, Product, i), *p0 = &g_array_index (l->products, Product, 0);

      if (p->m != p0->m || p->n != p0->n || p->k != p0->k)
        {
          g_set_error (error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                       "--loop batched needs products of one shape (balanced routing of an even split)");
          return FALSE;
        }
      table[i] = p->a;
      table[n + i] = p->b;
      table[2 * n + i] = p->c;
    }
  return cuda_ok (cudaMalloc ((void **) &l->table, 3 * n * sizeof (void *)), "cudaMalloc", error) &&
         cuda_ok (cudaMemcpy (l->table, table, 3 * n * sizeof (void *), cudaMemcpyHostToDevice), "cudaMemcpy",
                  error);
}

/* The products: one cublasGemmEx each, one batched call, or a cublasGemmEx
 * each alternating between the two streams. */
static gboolean
loop_call (Loop *l, GError **error)
{
  const float one = 1.0f, zero = 0.0f;
  const Product *p0 = &g_array_index (l->products, Product, 0);
  guint n = l->products->len;

  if (l->table != NULL)
    return cublas_ok (cublasGemmBatchedEx (l->handle, p0->transa, p0->transb, p0->m, p0->n, p0->k, &one,
                                           (const void *const *) l->table, CUDA_R_16BF, p0->lda,
                                           (const void *const *) (l->table + n), CUDA_R_16BF, p0->ldb, &zero,
                                           l->table + 2 * n, CUDA_R_16BF, p0->ldc, (int) n, CUBLAS_COMPUTE_32F,
                                           CUBLAS_GEMM_DEFAULT),
                      "cublasGemmBatchedEx", error);
  if (two_streams () &&
      (!cuda_ok (cudaEventRecord (l->fork, l->stream), "cudaEventRecord", error) ||
       !cuda_ok (cudaStreamWaitEvent (l->stream2, l->fork, 0), "cudaStreamWaitEvent", error)))
    return FALSE;
  for (guint i = 0; i < n; i++)
    {
      const Product *p = &g_array_index (l->products, Product, i);
      cublasHandle_t handle = two_streams () && i % 2 == 1 ? l->handle2 : l->handle;

      if (!cublas_ok (cublasGemmEx (handle, p->transa, p->transb, p->m, p->n, p->k, &one, p->a, CUDA_R_16BF,
                                    p->lda, p->b, CUDA_R_16BF, p->ldb, &zero, p->c, CUDA_R_16BF, p->ldc,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                      "cublasGemmEx", error))
        return FALSE;
    }
  return !two_streams () ||
         (cuda_ok (cudaEventRecord (l->join, l->stream2), "cudaEventRecord", error) &&
          cuda_ok (cudaStreamWaitEvent (l->stream, l->join, 0), "cudaStreamWaitEvent", error));
}

/* n loop calls between the loop's events; *ms their time. */
static gboolean
loop_block (Loop *l, guint n, double *ms, GError **error)
{
  float t;

  if (!cuda_ok (cudaEventRecord (l->start, l->stream), "cudaEventRecord", error))
    return FALSE;
  for (guint i = 0; i < n; i++)
    if (!loop_call (l, error))
      return FALSE;
  if (!cuda_ok (cudaEventRecord (l->end, l->stream), "cudaEventRecord", error) ||
      !cuda_ok (cudaEventSynchronize (l->end), "cudaEventSynchronize", error) ||
      !cuda_ok (cudaEventElapsedTime (&t, l->start, l->end), "cudaEventElapsedTime", error))
    return FALSE;
  *ms = t;
  return TRUE;
}

/* libgmlp's side: the layer, its operands, and what its dgrad consumes. */
typedef struct {
  GmlpGroupedLinear     *layer;
  GmlpGroupedTensor     *x, *dy;
  GmlpSavedActivations **saved;
} Layer;

/* What n calls of op need: n forwards' saved activations for dgrad, n
 * pending weight gradients for wgrad. */
static gboolean
gmlp_prepare (Layer *g, guint n, GError **error)
{
  for (guint i = 0; op != OP_FPROP && i < n; i++)
    {
      g_autoptr(GmlpGroupedTensor) y = gmlp_grouped_linear_forward (g->layer, g->x, &g->saved[i], error);
      g_autoptr(GmlpGroupedTensor) dx = NULL;

      if (y == NULL)
        return FALSE;
      /* wgrad: the backward that leaves its weight gradients pending. */
      if (op == OP_WGRAD)
        {
          dx = gmlp_grouped_linear_backward (g->layer, g->saved[i], g->dy, error);
          g_clear_object (&g->saved[i]);
          if (dx == NULL)
            return FALSE;
        }
    }
  return TRUE;
}

static gboolean
gmlp_call (Layer *g, guint i, GError **error)
{
  g_autoptr(GmlpGroupedTensor) out = NULL;

  switch (op)
    {
    case OP_FPROP:
      out = gmlp_grouped_linear_forward (g->layer, g->x, NULL, error);
      return out != NULL;
    case OP_DGRAD:
      out = gmlp_grouped_linear_backward (g->layer, g->saved[i], g->dy, error);
      g_clear_object (&g->saved[i]);
      return out != NULL;
    case OP_WGRAD:
      return gmlp_grouped_linear_backward_dw (g->layer, error);
    }
  return FALSE;
}

/* n calls of op between two of libgmlp's events (*ms their time), after
 * what they consume and before dgrad's pending weight gradients go. */
static gboolean
gmlp_block (Layer *g, guint n, double *ms, GError **error)
{
  GmlpDevice *device = gmlp_grouped_tensor_get_device (g->x);
  g_autoptr(GmlpEvent) start = NULL;
  g_autoptr(GmlpEvent) end = NULL;

  if (!gmlp_prepare (g, n, error) || (start = gmlp_event_new_recorded (device, error)) == NULL)
    return FALSE;
  for (guint i = 0; i < n; i++)
    if (!gmlp_call (g, i, error))
      return FALSE;
  if ((end = gmlp_event_new_recorded (device, error)) == NULL ||
      !gmlp_event_synchronize (end, error) ||
      !gmlp_event_elapsed_ms (start, end, ms, error))
    return FALSE;
  for (guint i = 0; op == OP_DGRAD && i < n; i++)
    if (!gmlp_grouped_linear_backward_dw (g->layer, error))
      return FALSE;
  /* Done before the loop's block starts, which would share the GPU. */
  return gmlp_device_synchronize (device, error);
}

/* The device pointer of a tensor that is one array, through DLPack. */
static gboolean
device_pointer (GmlpGroupedTensor *t, const guint16 **pointer, DLManagedTensor **keep, GError **error)
{
  DLManagedTensor *dl = gmlp_grouped_tensor_to_dlpack (t, error);

  if (dl == NULL)
    return FALSE;
  if (dl->dl_tensor.device.device_type != kDLCUDA)
    {
      dl->deleter (dl);
      g_set_error (error, G_IO_ERROR, G_IO_ERROR_NOT_SUPPORTED, "the tensors are not on a CUDA device");
      return FALSE;
    }
  *pointer = (const guint16 *) ((const guint8 *) dl->dl_tensor.data + dl->dl_tensor.byte_offset);
  *keep = dl;
  return TRUE;
}

static int
compare_doubles (gconstpointer a, gconstpointer b)
{
  double x = *(const double *) a, y = *(const double *) b;
  return x < y ? -1 : x > y;
}

/* The q-quantile of n sorted values (nearest rank). */
static double
quantile (const double *sorted, guint n, double q)
{
  return sorted[MIN ((guint) (q * n), n - 1)];
}

static gboolean
versus_loop (GmlpDevice *device, Loop *l, const BenchShape *s, gboolean skew, GError **error)
{
  g_autofree gint64 *m = bench_split_rows (s->experts, s->rows, skew, 16);
  g_autoptr(GmlpGroupedLinear) layer = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL;
  DLManagedTensor *dl[3] = { NULL, NULL, NULL };
  const guint16 *x_data, *w_data, *dy_data;
  guint16 *out = NULL;
  gsize out_bytes = 2 * (gsize) MAX (s->rows * MAX (s->in, s->out), s->experts * s->in * s->out);
  g_autofree double *gmlp_ms = g_new (double, rounds);
  g_autofree double *loop_ms = g_new (double, rounds);
  g_autofree double *ratio = g_new (double, rounds);
  double flops = 2.0 * s->rows * s->in * s->out, once, gmlp_sum = 0.0, loop_sum = 0.0;
  Layer g = { NULL, NULL, NULL, NULL };
  gboolean ok = FALSE;
  guint block = 1;
  JsonBuilder *record;
  gint64 start;

  layer = gmlp_grouped_linear_new_full (device, (guint) s->experts, s->in, s->out, GMLP_DTYPE_BFLOAT16,
                                        GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_DELAY_WGRAD_COMPUTE,
                                        error);
  if (layer == NULL ||
      (x = gmlp_grouped_tensor_new (device, GMLP_DTYPE_BFLOAT16, m, (guint) s->experts, s->in, error)) == NULL ||
      (dy = gmlp_grouped_tensor_new (device, GMLP_DTYPE_BFLOAT16, m, (guint) s->experts, s->out, error)) == NULL ||
      !gmlp_grouped_tensor_fill_random (x, 1, 1.0, error) ||
      !gmlp_grouped_tensor_fill_random (dy, 2, 1.0, error) ||
      !device_pointer (x, &x_data, &dl[0], error) ||
      !device_pointer (gmlp_grouped_linear_get_weight (layer), &w_data, &dl[1], error) ||
      !device_pointer (dy, &dy_data, &dl[2], error) ||
      !cuda_ok (cudaMalloc ((void **) &out, out_bytes), "cudaMalloc", error))
    goto out;
  loop_set_products (l, s, m, x_data, w_data, dy_data, out);
  if (batched () && !loop_make_table (l, error))
    goto out;
  g.layer = layer;
  g.x = x;
  g.dy = dy;
  g.saved = g_new0 (GmlpSavedActivations *, MAX_BLOCK_CALLS);

  /* Both sides alternately, a call at a time, past the clock's dip; then
   * the block size from libgmlp's time for one call. */
  start = g_get_monotonic_time ();
  while (g_get_monotonic_time () - start < (gint64) warm_ms * 1000)
    if (!gmlp_block (&g, 1, &once, error) || !loop_block (l, 1, &once, error))
      goto out;
  if (!gmlp_block (&g, 4, &once, error))
    goto out;
  block = (guint) CLAMP (block_ms / (once / 4), 1.0, MAX_BLOCK_CALLS);

  for (gint r = 0; r < rounds; r++)
    {
      /* A B, then B A: neither side always follows the other. */
      if (r % 2 == 0 ? !gmlp_block (&g, block, &gmlp_ms[r], error) || !loop_block (l, block, &loop_ms[r], error)
                     : !loop_block (l, block, &loop_ms[r], error) || !gmlp_block (&g, block, &gmlp_ms[r], error))
        goto out;
      ratio[r] = loop_ms[r] / gmlp_ms[r];
      gmlp_sum += gmlp_ms[r];
      loop_sum += loop_ms[r];
    }
  qsort (gmlp_ms, rounds, sizeof (double), compare_doubles);
  qsort (loop_ms, rounds, sizeof (double), compare_doubles);
  qsort (ratio, rounds, sizeof (double), compare_doubles);
  record = bench_record_new ("gmlp-versus-loop", gmlp_device_get_name (device));
  bench_record_string (record, "shape", s->name);
  bench_record_int (record, "E", s->experts);
  bench_record_int (record, "M", s->rows);
  bench_record_int (record, "K", s->in);
  bench_record_int (record, "N", s->out);
  bench_record_bool (record, "skew", skew);
  bench_record_string (record, "op", op_names[op]);
  bench_record_string (record, "loop", loop_kind != NULL ? loop_kind : "loop");
  bench_record_int (record, "rounds", rounds);
  bench_record_int (record, "block_calls", block);
  bench_record_double (record, "gmlp_tflops", flops * block / (quantile (gmlp_ms, rounds, 0.5) * 1e-3) / 1e12, "%.1f");
  bench_record_double (record, "loop_tflops", flops * block / (quantile (loop_ms, rounds, 0.5) * 1e-3) / 1e12, "%.1f");
  bench_record_double (record, "ratio", quantile (ratio, rounds, 0.5), "%.4f");
  bench_record_double (record, "ratio_q1", quantile (ratio, rounds, 0.25), "%.4f");
  bench_record_double (record, "ratio_q3", quantile (ratio, rounds, 0.75), "%.4f");
  bench_record_double (record, "ratio_of_sums", loop_sum / gmlp_sum, "%.4f");
  bench_record_emit (record);
  ok = TRUE;

out:
  /* Nothing of the loop's may still read the layer's tensors. */
  if (!cuda_ok (cudaDeviceSynchronize (), "cudaDeviceSynchronize", ok ? error : NULL))
    ok = FALSE;
  for (guint i = 0; i < G_N_ELEMENTS (dl); i++)
    if (dl[i] != NULL)
      dl[i]->deleter (dl[i]);
  for (guint i = 0; g.saved != NULL && i < MAX_BLOCK_CALLS; i++)
    g_clear_object (&g.saved[i]);
  g_free (g.saved);
  cudaFree (out);
  cudaFree (l->table);
  l->table = NULL;
  return ok;
}

static gboolean
routing_selected (gboolean skew)
{
  return only_routing == NULL || strcmp (only_routing, skew ? "skewed" : "balanced") == 0;
}

int
main (int argc, char *argv[])
{
  g_autoptr(GOptionContext) context =
    g_option_context_new ("- libgmlp's host-sizes products and a cuBLAS loop, interleaved; JSON lines");
  g_autoptr(GError) error = NULL;
  GmlpDevice *device;
  Loop l;
  gboolean any = FALSE;

  setlocale (LC_ALL, "");
  g_option_context_add_main_entries (context, entries, NULL);
  if (!g_option_context_parse (context, &argc, &argv, &error))
    {
      g_printerr ("%s\n", error->message);
      return EXIT_FAILURE;
    }
  if (!routing_selected (FALSE) && !routing_selected (TRUE))
    {
      g_printerr ("--routing takes balanced or skewed, not %s\n", only_routing);
      return EXIT_FAILURE;
    }
  for (op = OP_FPROP; op_name != NULL && op <= OP_WGRAD && strcmp (op_name, op_names[op]) != 0; op++)
    ;
  if (op > OP_WGRAD)
    {
      g_printerr ("--op takes fprop, dgrad or wgrad, not %s\n", op_name);
      return EXIT_FAILURE;
    }
  if (loop_kind != NULL && strcmp (loop_kind, "loop") != 0 && !batched () && !two_streams ())
    {
      g_printerr ("--loop takes loop, batched or two-streams, not %s\n", loop_kind);
      return EXIT_FAILURE;
    }
  if (rounds < 1 || block_ms < 1 || warm_ms < 0 || rest_ms < 0)
    {
      g_printerr ("--rounds and --block-ms must be positive, --warm-ms and --rest-ms not negative\n");
      return EXIT_FAILURE;
    }

  device = gmlp_device_get_default ();
  if (gmlp_device_get_kind (device) != GMLP_DEVICE_KIND_CUDA || !loop_init (&l, &error))
    {
      g_printerr ("gmlp-versus-loop: %s\n", error != NULL ? error->message : "needs a CUDA device");
      return EXIT_FAILURE;
    }
  for (guint i = 0; i < bench_n_anchor_shapes; i++)
    {
      const BenchShape *s = &bench_anchor_shapes[i];

      if (only_shape != NULL && strcmp (only_shape, s->name) != 0)
        continue;
      any = TRUE;
      for (int skew = 0; skew < 2; skew++)
        {
          if (!routing_selected (skew))
            continue;
          if (!gmlp_device_synchronize (device, &error))
            break;
          g_usleep ((gulong) rest_ms * 1000);
          if (!versus_loop (device, &l, s, skew, &error))
            break;
        }
      if (error != NULL)
        {
          g_printerr ("gmlp-versus-loop: %s: %s\n", s->name, error->message);
          return EXIT_FAILURE;
        }
    }
  if (!any)
    {
      g_printerr ("gmlp-versus-loop: no shape named %s\n", only_shape);
      return EXIT_FAILURE;
    }
  return EXIT_SUCCESS;
}
