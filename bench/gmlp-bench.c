/* gmlp-bench: GroupedLinear throughput on the anchor shapes, JSON lines
 *
 * For each shape of ../shared/bench (experts E, routed rows M, in K, out N)
 * and balanced and skewed routing, times fprop (y = x Wᵀ), dgrad
 * (dx = dy W) and wgrad (dW = dyᵀ x) of a BF16 GmlpGroupedLinear on the
 * default device, and the host time one call takes. Each call is timed with
 * device events and the median taken, as the anchors are. The skewed split is
 * the one cublas_anchor.cu uses.
 *
 *   gmlp-bench [--shape NAME] [--iters N] [--divide D] [--rest-ms MS] [--warm-ms MS] [--fp8[=RECIPE]] [--quantized]
 *              [--method steady|do-bench] [--dims E,M,K,N] [--table]
 *   gmlp-bench --quantize [--fp8=RECIPE] [--device-sizes] ...
 *
 * Each measurement is one JSON line (written with json-glib, bench-json.c);
 * --table prints the same records at the end as tables of aligned columns,
 * one per kind of line, for people. bench/plot.py draws the lines as charts.
 *
 * --dims runs one shape of those dimensions instead, named "custom" (to
 * see how a product's time grows with one dimension).
 *
 * --method=do-bench times fprop and wgrad as ../shared/bench/anchors.py
 * times torch (triton's do_bench) instead of the default steady state
 * (time_op()): for comparing libgmlp with those anchors at their own
 * method. The lines then say "method":"do-bench".
 *
 * With --fp8 the layer has quantizers of RECIPE (delayed, the default,
 * current, blockwise or mxfp8; the HYBRID format) and each timed call
 * includes its quantization: fprop quantizes x and W (no columnwise
 * copies: an inference forward), dgrad quantizes dy, wgrad multiplies the
 * operands the forward and backward quantized. With --quantized as well,
 * x and dy are quantized once before the timed calls (with their
 * columnwise copies) and the layer caches its quantized weights
 * (cache-fp8-weights): the calls time the products alone, as
 * torch._scaled_grouped_mm is timed on pre-cast operands. The lines say
 * "dtype":"fp8-RECIPE" and "quantize":"per-call" or "outside"; FLOP/s
 * count the same 2 M K N.
 *
 * With --moe, times a whole BF16 GmlpMoELayer step (forward and backward:
 * router, permutation, SwiGLU experts, combine) with the arguments of
 * ../shared/bench/ep_anchor.py (--tokens, --hidden, --ffn, --experts,
 * --topk; its defaults), then the layer's GroupedMLP alone, forward and
 * backward, on the same routed rows (the layer's own permutation, device
 * sizes): "bench":"gmlp-moe" lines, "part":"experts" and "part":"layer",
 * the latter with the forward alone ("fwd_ms") and "over_experts", the
 * cost of the layer around its experts, and the same step captured in a
 * GmlpGraph and replayed ("graph_ms", "graph_host_us"; on a GPU);
 * "busy_host_us" is the host's time per call while the device is busy,
 * which would approach "ms" if a call waited for the device.
 * With --ep as well (under gmlp-launch -n N), each rank times its step
 * of an expert-parallel layer (--ep-mode exact or graph-safe, whose slots
 * hold --ep-capacity times the balanced rows) on --tokens tokens of its
 * own: one "part":"layer" line per rank, with "ep_ranks" and "rank";
 * --fp8=blockwise or mxfp8 makes its dispatch FP8 ("ep_dispatch");
 * --ep-chunks C pipelines the forward without saved activations ("fwd_ms")
 * and the training step (forward that saves, backward) in C chunks of
 * local experts ("ep_chunks"; expert-parallel-chunks, whose default it
 * keeps unless given).
 * "part":"permute" and "part":"combine" time the routing's permute and
 * combine alone, with "gbps" counting the least traffic: each token's row
 * once one way and a row per choice the other (to compare with the
 * device-to-device copy rate, read + write). The routing is
 * balanced exactly (balanced_tokens()). TFLOP/s count the experts' products as
 * ep_anchor.py does: 18 × tokens × topk × hidden × ffn a step.
 *
 * With --quantize, times the quantizer alone: a BF16 x of each shape (M × K)
 * to FP8 with the --fp8 recipe, rowwise only and with the columnwise copy,
 * as "bench":"gmlp-quantize" lines with the bandwidth of the least traffic.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gmlp.h>

#include "bench-json.h"
#include "bench-shapes.h"
#include "gmlp-tuning-private.h"

/* The shapes run: the anchors', or --dims's. */
static BenchShape custom_shape;
static const BenchShape *shapes = bench_anchor_shapes;
static guint n_shapes;

static char *only_shape = NULL;
static char *dims = NULL;
static char *only_routing = NULL;
static gint iters = 100;
static gint divide = 1;
/* Idle time before each shape and routing, as cublas_loop_steady rests
 * before each of its routings: every routing's timings then start from
 * the same rested GPU rather than from the clock the previous routing's
 * seconds of products left it at. */
static gint rest_ms = 1000;
/* How long each op runs back to back before its timed calls (time_op(),
 * --warm-ms). The GPU runs these products at its power limit: within a
 * few hundred ms of back-to-back GEMMs the SM clock falls from its boost,
 * dips lower about 0.8 s in, and settles back (nvidia-smi). A short timed
 * loop right after an idle moment sees the boost or the dip, and reads far
 * from the steady state; after 400 ms the timed calls see the power
 * limit, and after a few seconds its settled state, past the dip
 * (docs/performance.md, "How to measure"). */
static gint warm_ms = 400;
static gboolean offload_mode = FALSE;
static gboolean mlp_mode = FALSE;
static gboolean quantize_mode = FALSE;
static gboolean device_sizes = FALSE;
static GmlpScalingRecipe fp8_recipe = GMLP_SCALING_RECIPE_NONE;
static gboolean fp8_quantized = FALSE;
static char *method = NULL;
static gboolean table = FALSE;
static char *tuning = NULL;
/* --moe: ep_anchor.py's arguments and defaults. */
static gboolean moe_mode = FALSE;
static gint64 moe_tokens = 8192;
static gint64 moe_hidden = 4096;
static gint64 moe_ffn = 1536;
static gint moe_experts = 64;
static gint moe_topk = 8;
static gint moe_steps = 0;
/* --moe --ep: one rank of an expert-parallel layer under gmlp-launch. */
static gboolean moe_ep = FALSE;
static char *moe_ep_mode = NULL;
static double moe_ep_capacity = 2.0;
static gint moe_ep_chunks = 0;

static const char *const fp8_recipe_names[] = { NULL, "delayed", "current", "blockwise", "mxfp8" };

static gboolean
parse_fp8 (const char *option, const char *value, gpointer data, GError **error)
{
  guint i;

  if (value == NULL)
    {
      fp8_recipe = GMLP_SCALING_RECIPE_DELAYED;
      return TRUE;
    }
  for (i = 1; i < G_N_ELEMENTS (fp8_recipe_names); i++)
    if (strcmp (value, fp8_recipe_names[i]) == 0)
      {
        fp8_recipe = (GmlpScalingRecipe) i;
        return TRUE;
      }
  g_set_error (error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
               "--fp8 takes delayed, current, blockwise or mxfp8, not %s", value);
  return FALSE;
}

static const GOptionEntry entries[] = {
  { "shape", 's', 0, G_OPTION_ARG_STRING, &only_shape, "Run one shape only", "NAME" },
  { "routing", 'r', 0, G_OPTION_ARG_STRING, &only_routing,
    "Run one routing only: balanced or skewed (for a profiler)", "ROUTING" },
  { "iters", 'n', 0, G_OPTION_ARG_INT, &iters, "Timed calls per measurement (default 100)", "N" },
  { "divide", 'd', 0, G_OPTION_ARG_INT, &divide, "Divide M, K and N by D (for the CPU)", "D" },
  { "rest-ms", 0, 0, G_OPTION_ARG_INT, &rest_ms,
    "Idle time before each shape and routing (default 1000, as cublas_loop_steady)", "MS" },
  { "warm-ms", 0, 0, G_OPTION_ARG_INT, &warm_ms,
    "Back-to-back calls before each timing (default 400, as cublas_loop_steady's CLS_WARM_MS)", "MS" },
  { "offload", 0, 0, G_OPTION_ARG_NONE, &offload_mode, "Measure activation offload instead", NULL },
  { "mlp", 0, 0, G_OPTION_ARG_NONE, &mlp_mode, "Time a SwiGLU GroupedMLP step instead", NULL },
  { "quantize", 0, 0, G_OPTION_ARG_NONE, &quantize_mode,
    "Time the FP8 quantization of x (the --fp8 recipe) instead", NULL },
  { "device-sizes", 0, 0, G_OPTION_ARG_NONE, &device_sizes,
    "Keep the group sizes on the device only (libgmlp's own grouped GEMM)", NULL },
  { "quantized", 0, 0, G_OPTION_ARG_NONE, &fp8_quantized,
    "With --fp8: operands quantized before the timed calls", NULL },
  { "fp8", 0, G_OPTION_FLAG_OPTIONAL_ARG, G_OPTION_ARG_CALLBACK, (gpointer) parse_fp8,
    "Time FP8 products through quantizers (delayed by default)", "RECIPE" },
  { "moe", 0, 0, G_OPTION_ARG_NONE, &moe_mode,
    "Time a whole MoE layer step and its GroupedMLP alone instead (ep_anchor.py's arguments)", NULL },
  { "tokens", 0, 0, G_OPTION_ARG_INT64, &moe_tokens, "--moe: tokens (default 8192)", "T" },
  { "hidden", 0, 0, G_OPTION_ARG_INT64, &moe_hidden, "--moe: model width (default 4096)", "H" },
  { "ffn", 0, 0, G_OPTION_ARG_INT64, &moe_ffn, "--moe: each expert's FFN width (default 1536)", "F" },
  { "experts", 0, 0, G_OPTION_ARG_INT, &moe_experts, "--moe: experts (default 64)", "E" },
  { "topk", 0, 0, G_OPTION_ARG_INT, &moe_topk, "--moe: experts per token (default 8)", "K" },
  { "ep", 0, 0, G_OPTION_ARG_NONE, &moe_ep,
    "--moe: one rank of an expert-parallel layer, the ranks started by gmlp-launch", NULL },
  { "ep-mode", 0, 0, G_OPTION_ARG_STRING, &moe_ep_mode, "--ep: exact (default) or graph-safe", "MODE" },
  { "ep-capacity", 0, 0, G_OPTION_ARG_DOUBLE, &moe_ep_capacity,
    "--ep graph-safe: the expert capacity factor of the slots (default 2)", "F" },
  { "ep-chunks", 0, 0, G_OPTION_ARG_INT, &moe_ep_chunks,
    "--ep: chunks of local experts the forward and backward pipeline (default: the layer's)",
    "C" },
  { "moe-steps", 0, 0, G_OPTION_ARG_INT, &moe_steps,
    "--moe: run this many layer steps after the warm-up and time nothing (for a profiler)", "N" },
  { "dims", 0, 0, G_OPTION_ARG_STRING, &dims, "Run one shape of these dimensions instead (\"custom\")",
    "E,M,K,N" },
  { "table", 0, 0, G_OPTION_ARG_NONE, &table,
    "Print a table for people at the end instead of JSON lines", NULL },
  { "method", 0, 0, G_OPTION_ARG_STRING, &method,
    "steady (the default) or do-bench (triton's, as anchors.py times torch; fprop and wgrad only)",
    "METHOD" },
  { "tuning", 0, 0, G_OPTION_ARG_STRING, &tuning,
    "Force routes or schedules through the device's tuning, as key=value,... (keys in "
    "libgmlp/gmlp-tuning-private.h; e.g. host-gemm=cublas)", "TUNING" },
  { NULL }
};

/* Group sizes: balanced, or the skewed split of cublas_anchor.cu (in
 * multiples of 16 rows, fewer where --divide shrinks the shape). */
static gint64 *
split_rows (gint64 experts, gint64 rows, gboolean skew)
{
  return bench_split_rows (experts, rows, skew, MAX (16 / divide, 1));
}

/* A record of the shape s with M rows and K in features: "bench",
 * "device", "shape", "E", "M", "K". */
static JsonBuilder *
record_shape (const char *bench, GmlpDevice *device, const BenchShape *s, gint64 rows, gint64 in)
{
  JsonBuilder *record = bench_record_new (bench, gmlp_device_get_name (device));

  bench_record_string (record, "shape", s->name);
  bench_record_int (record, "E", s->experts);
  bench_record_int (record, "M", rows);
  bench_record_int (record, "K", in);
  return record;
}

typedef struct {
  double ms;        /* device time per call: the median over the timed calls */
  double host_us;   /* host time per call, device idle at the start */
  double busy_us;   /* host time per call among the timed ones (the
                     * device busy): near ms where a call waits for it */
} Timing;

typedef gboolean (*Op) (gpointer data, guint i, GError **error);

static int
compare_doubles (gconstpointer a, gconstpointer b)
{
  double x = *(const double *) a, y = *(const double *) b;
  return x < y ? -1 : x > y;
}

/* The host cost of op: HOST_CALLS calls, each on an idle device, the
 * median in µs (one call's time swings with the host's other work). They
 * are calls 0 to HOST_CALLS - 1 of op's data. */
#define HOST_CALLS 7

static gboolean
time_host (GmlpDevice *device, Op op, gpointer data, double *host_us, GError **error)
{
  double us[HOST_CALLS];
  guint i;

  for (i = 0; i < HOST_CALLS; i++)
    {
      gint64 start;

      if (!gmlp_device_synchronize (device, error))
        return FALSE;
      start = g_get_monotonic_time ();
      if (!op (data, i, error))
        return FALSE;
      us[i] = (double) (g_get_monotonic_time () - start);
    }
  qsort (us, HOST_CALLS, sizeof (double), compare_doubles);
  *host_us = us[HOST_CALLS / 2];
  return TRUE;
}

/* Call i of op between two recorded events, appended to events. */
static gboolean
timed_call (GmlpDevice *device, Op op, gpointer data, guint i, GPtrArray *events, GError **error)
{
  GmlpEvent *before = gmlp_event_new_recorded (device, error), *after;

  if (before == NULL)
    return FALSE;
  g_ptr_array_add (events, before);
  if (!op (data, i, error) || (after = gmlp_event_new_recorded (device, error)) == NULL)
    return FALSE;
  g_ptr_array_add (events, after);
  return TRUE;
}

/* The median time between the events of each pair (timed_call()). */
static gboolean
median_ms (GPtrArray *events, double *median, GError **error)
{
  guint i, n = events->len / 2;
  g_autofree double *ms = g_new (double, n);

  for (i = 0; i < n; i++)
    if (!gmlp_event_elapsed_ms (events->pdata[2 * i], events->pdata[2 * i + 1], &ms[i], error))
      return FALSE;
  qsort (ms, n, sizeof (double), compare_doubles);
  *median = ms[n / 2];
  return TRUE;
}

/* Times n calls of op back to back with a pair of device events around
 * each, as the anchors (triton's do_bench, cublas_anchor) do, and takes
 * the median; before them, warm (a call that can be repeated: op may use
 * up state) runs back to back for warm_ms. */
static gboolean
time_op (GmlpDevice *device, Op op, Op warm, gpointer data, guint n, Timing *t, GError **error)
{
  g_autoptr(GPtrArray) events = g_ptr_array_new_with_free_func (g_object_unref);
  g_autofree double *busy = NULL;
  gint64 start;
  guint i;

  if (!time_host (device, op, data, &t->host_us, error))
    return FALSE;
  start = g_get_monotonic_time ();
  for (i = 0; g_get_monotonic_time () - start < (gint64) warm_ms * 1000; i++)
    /* A few calls ahead of the device at most: the clock is the point. */
    if (!warm (data, i, error) || (i % 4 == 3 && !gmlp_device_synchronize (device, error)))
      return FALSE;
  if (!gmlp_device_synchronize (device, error))
    return FALSE;
  busy = g_new (double, n);
  for (i = 0; i < n; i++)
    {
      gint64 call = g_get_monotonic_time ();

      if (!timed_call (device, op, data, HOST_CALLS + i, events, error))
        return FALSE;
      busy[i] = (double) (g_get_monotonic_time () - call);
    }
  qsort (busy, n, sizeof (double), compare_doubles);
  t->busy_us = busy[n / 2];
  return median_ms (events, &t->ms, error);
}

/* Whether --method asks for triton's do_bench. */
static gboolean
do_bench_method (void)
{
  return method != NULL && strcmp (method, "do-bench") == 0;
}

/* triton.testing.do_bench (warmup=25, rep=200, the median), which
 * ../shared/bench/anchors.py times torch with: five calls, each after a
 * flush of the cache (zeroing 256 MB), give an estimate; then as many
 * calls as take 25 ms back to back, and as many as take 200 ms, each after
 * a flush and between two events. The flushes leave L2 cold and let the
 * GPU cool between products, unlike the steady state of time_op().
 * prepare, where not NULL, readies one call of op (op may use up state)
 * and runs before each part: for the host-time and estimate calls, then
 * for the counted ones. */
#define DO_BENCH_WARM_UP_MS 25.0
#define DO_BENCH_REP_MS 200.0
#define DO_BENCH_FLUSH_BYTES (256 << 20)

static gboolean
time_op_do_bench (GmlpDevice *device, Op op, Op prepare, gpointer data, Timing *t, GError **error)
{
  static GmlpGroupedTensor *flush = NULL;   /* made once, kept for the program's life */
  g_autoptr(GPtrArray) events = g_ptr_array_new_with_free_func (g_object_unref);
  g_autoptr(GmlpEvent) first = NULL;
  g_autoptr(GmlpEvent) last = NULL;
  double estimate;
  guint i, n_warm, n_rep;

  if (flush == NULL)
    {
      gint64 rows = DO_BENCH_FLUSH_BYTES / (1024 * 4);

      flush = gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, &rows, 1, 1024, error);
      if (flush == NULL)
        return FALSE;
    }
  for (i = 0; prepare != NULL && i < HOST_CALLS + 5; i++)
    if (!prepare (data, i, error))
      return FALSE;
  if (!time_host (device, op, data, &t->host_us, error) ||
      (first = gmlp_event_new_recorded (device, error)) == NULL)
    return FALSE;
  for (i = 0; i < 5; i++)
    if (!gmlp_grouped_tensor_fill_zero (flush, error) || !op (data, HOST_CALLS + i, error))
      return FALSE;
  if ((last = gmlp_event_new_recorded (device, error)) == NULL ||
      !gmlp_event_elapsed_ms (first, last, &estimate, error))
    return FALSE;
  estimate = MAX (estimate / 5, 1e-6);
  n_warm = (guint) MAX (1.0, DO_BENCH_WARM_UP_MS / estimate);
  n_rep = (guint) MAX (1.0, DO_BENCH_REP_MS / estimate);
  for (i = 0; prepare != NULL && i < n_warm + n_rep; i++)
    if (!prepare (data, i, error))
      return FALSE;
  for (i = 0; i < n_warm; i++)
    if (!op (data, 8 + i, error))
      return FALSE;
  for (i = 0; i < n_rep; i++)
    if (!gmlp_grouped_tensor_fill_zero (flush, error) ||
        !timed_call (device, op, data, 8 + n_warm + i, events, error))
      return FALSE;
  return median_ms (events, &t->ms, error);
}

typedef struct {
  GmlpGroupedLinear     *layer;
  GmlpGroupedTensor     *x, *dy;
  GmlpSavedActivations **saved;
} Bench;

static gboolean
op_fprop (gpointer data, guint i, GError **error)
{
  Bench *b = data;
  g_autoptr(GmlpGroupedTensor) y = gmlp_grouped_linear_forward (b->layer, b->x, NULL, error);
  return y != NULL;
}

static gboolean
op_dgrad (gpointer data, guint i, GError **error)
{
  Bench *b = data;
  g_autoptr(GmlpGroupedTensor) dx = gmlp_grouped_linear_backward (b->layer, b->saved[i], b->dy, error);
  return dx != NULL;
}

static gboolean
op_wgrad (gpointer data, guint i, GError **error)
{
  Bench *b = data;
  return gmlp_grouped_linear_backward_dw (b->layer, error);
}

/* A forward and backward, which leave one delayed wgrad for op_wgrad. */
static gboolean
prepare_wgrad (gpointer data, guint i, GError **error)
{
  Bench *b = data;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GmlpGroupedTensor) y = gmlp_grouped_linear_forward (b->layer, b->x, &saved, error);
  g_autoptr(GmlpGroupedTensor) dx = y ? gmlp_grouped_linear_backward (b->layer, saved, b->dy, error) : NULL;

  return dx != NULL;
}

/* The group sizes as a device tensor: one member of n INT64 values. */
static GmlpGroupedTensor *
device_sizes_tensor (GmlpDevice *device, const gint64 *m, guint n, GError **error)
{
  gint64 len = n;
  g_autoptr(GBytes) bytes = g_bytes_new (m, n * sizeof (gint64));

  return gmlp_grouped_tensor_new_from_bytes (device, GMLP_DTYPE_INT64, &len, 1, 1, bytes, error);
}

static gboolean
bench_shape (GmlpDevice *device, const BenchShape *s, gboolean skew, GError **error)
{
  gint64 rows = s->rows / divide, in = MAX (s->in / divide, 1), out = MAX (s->out / divide, 1);
  g_autofree gint64 *m = split_rows (s->experts, rows, skew);
  g_autoptr(GmlpGroupedLinear) layer = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL;
  double flops = 2.0 * rows * in * out;
  static const char *names[] = { "fprop", "dgrad", "wgrad" };
  static const Op ops[] = { op_fprop, op_dgrad, op_wgrad };
  g_autofree char *dtype_name = NULL;
  JsonBuilder *record;
  Bench b;
  guint n_saved = (guint) iters + HOST_CALLS, i, k;

  layer = gmlp_grouped_linear_new_full (device, (guint) s->experts, in, out, GMLP_DTYPE_BFLOAT16,
                                        GMLP_LINEAR_SINGLE_GROUPED_WEIGHT |
                                        GMLP_LINEAR_DELAY_WGRAD_COMPUTE, error);
  if (layer == NULL)
    return FALSE;
  dtype_name = g_strdup ("bf16");
  if (fp8_recipe != GMLP_SCALING_RECIPE_NONE)
    {
      g_autoptr(GmlpQuantizer) qx = gmlp_quantizer_new (device, fp8_recipe, GMLP_FP8_FORMAT_HYBRID,
                                                        GMLP_QUANTIZER_ROLE_INPUT);
      g_autoptr(GmlpQuantizer) qw = gmlp_quantizer_new (device, fp8_recipe, GMLP_FP8_FORMAT_HYBRID,
                                                        GMLP_QUANTIZER_ROLE_WEIGHT);
      g_autoptr(GmlpQuantizer) qdy = gmlp_quantizer_new (device, fp8_recipe, GMLP_FP8_FORMAT_HYBRID,
                                                         GMLP_QUANTIZER_ROLE_GRAD_OUTPUT);

      if (!gmlp_grouped_linear_set_quantizers (layer, qx, qw, qdy, error))
        return FALSE;
      g_free (dtype_name);
      dtype_name = g_strdup_printf ("fp8-%s", fp8_recipe_names[fp8_recipe]);
    }
  if (device_sizes)
    {
      g_autoptr(GmlpGroupedTensor) sizes = device_sizes_tensor (device, m, (guint) s->experts, error);

      if (sizes == NULL)
        return FALSE;
      x = gmlp_grouped_tensor_new_with_device_sizes (device, GMLP_DTYPE_BFLOAT16, sizes, rows, in, error);
      dy = gmlp_grouped_tensor_new_with_device_sizes (device, GMLP_DTYPE_BFLOAT16, sizes, rows, out, error);
    }
  else
    {
      x = gmlp_grouped_tensor_new (device, GMLP_DTYPE_BFLOAT16, m, (guint) s->experts, in, error);
      dy = gmlp_grouped_tensor_new (device, GMLP_DTYPE_BFLOAT16, m, (guint) s->experts, out, error);
    }
  if (x == NULL || dy == NULL ||
      !gmlp_grouped_tensor_fill_random (x, 1, 1.0, error) ||
      !gmlp_grouped_tensor_fill_random (dy, 2, 1.0, error))
    return FALSE;
  if (fp8_recipe != GMLP_SCALING_RECIPE_NONE && fp8_quantized)
    {
      GmlpQuantizer *qx = gmlp_grouped_linear_get_quantizer (layer, GMLP_QUANTIZER_ROLE_INPUT);
      GmlpQuantizer *qdy = gmlp_grouped_linear_get_quantizer (layer, GMLP_QUANTIZER_ROLE_GRAD_OUTPUT);
      GmlpGroupedTensor *x8, *dy8;

      gmlp_quantizer_set_columnwise (qx, TRUE);
      gmlp_quantizer_set_columnwise (qdy, TRUE);
      x8 = gmlp_quantizer_quantize (qx, x, error);
      dy8 = x8 != NULL ? gmlp_quantizer_quantize (qdy, dy, error) : NULL;
      if (dy8 == NULL)
        {
          g_clear_object (&x8);
          return FALSE;
        }
      g_object_unref (x);
      g_object_unref (dy);
      x = x8;
      dy = dy8;
      gmlp_grouped_linear_set_cache_fp8_weights (layer, TRUE);
    }

  b.layer = layer;
  b.x = x;
  b.dy = dy;
  b.saved = g_new0 (GmlpSavedActivations *, n_saved);

  /* Warm up (pool, library handles, kernels), then the forwards whose saved
   * activations the timed backwards consume. */
  for (i = 0; i < 2; i++)
    {
      GmlpSavedActivations *warm = NULL;
      g_autoptr(GmlpGroupedTensor) y = gmlp_grouped_linear_forward (layer, x, &warm, error);
      g_autoptr(GmlpGroupedTensor) dx = y ? gmlp_grouped_linear_backward (layer, warm, dy, error) : NULL;
      g_clear_object (&warm);
      if (dx == NULL || !gmlp_grouped_linear_backward_dw (layer, error))
        return FALSE;
      /* Delayed scaling: the timed steps use scales from the warm-up's. */
      if (!gmlp_grouped_linear_update_quantizers (layer, error))
        return FALSE;
    }
  for (k = 0; k < G_N_ELEMENTS (ops); k++)
    {
      Timing t;

      /* do_bench's call count is not known beforehand, and each dgrad
       * takes a saved activation of its own; the anchors time no dgrad. */
      if (do_bench_method () && ops[k] == op_dgrad)
        continue;
      /* The forwards whose saved activations dgrad and wgrad consume come
       * after fprop's timing, so that fprop is timed after as much work as
       * bench/cublas_loop_steady.cu's loop is (about 0.3 s less on
       * mixtral-fc1; the clock at the power limit still falls then). */
      if (ops[k] == op_dgrad)
        for (i = 0; i < n_saved; i++)
          {
            g_autoptr(GmlpGroupedTensor) y = gmlp_grouped_linear_forward (layer, x, &b.saved[i], error);
            if (y == NULL)
              return FALSE;
          }
      if (!(do_bench_method () ? time_op_do_bench (device, ops[k], ops[k] == op_wgrad ? prepare_wgrad : NULL,
                                                   &b, &t, error)
            : time_op (device, ops[k], op_fprop, &b, (guint) iters, &t, error)))
        return FALSE;
      record = record_shape ("gmlp", device, s, rows, in);
      bench_record_int (record, "N", out);
      bench_record_bool (record, "skew", skew);
      bench_record_string (record, "sizes", device_sizes ? "device" : "host");
      bench_record_string (record, "op", names[k]);
      bench_record_string (record, "dtype", dtype_name);
      if (fp8_recipe != GMLP_SCALING_RECIPE_NONE)
        bench_record_string (record, "quantize", fp8_quantized ? "outside" : "per-call");
      if (do_bench_method ())
        bench_record_string (record, "method", "do-bench");
      bench_record_double (record, "ms", t.ms, "%.4f");
      bench_record_double (record, "tflops", flops / (t.ms * 1e-3) / 1e12, "%.4g");
      bench_record_double (record, "host_us", t.host_us, "%.1f");
      bench_record_emit (record);
    }

  for (i = 0; i < n_saved; i++)
    g_clear_object (&b.saved[i]);
  g_free (b.saved);
  return TRUE;
}

/* The grouped quantization of a BF16 x (M × K) with the --fp8 recipe,
 * without and with its columnwise copy. GB/s counts the least traffic the
 * call needs: x read once, its FP8 copies written once (CURRENT reads x
 * twice, its amax first). */
typedef struct {
  GmlpQuantizer     *quantizer;
  GmlpGroupedTensor *x;
} QuantizeBench;

static gboolean
op_quantize (gpointer data, guint i, GError **error)
{
  QuantizeBench *b = data;
  g_autoptr(GmlpGroupedTensor) x8 = gmlp_quantizer_quantize (b->quantizer, b->x, error);

  return x8 != NULL;
}

static gboolean
bench_quantize (GmlpDevice *device, const BenchShape *s, gboolean skew, GError **error)
{
  gint64 rows = s->rows / divide, in = MAX (s->in / divide, 1);
  g_autofree gint64 *m = split_rows (s->experts, rows, skew);
  g_autoptr(GmlpQuantizer) quantizer = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL;
  JsonBuilder *record;
  QuantizeBench b;
  guint columnwise;

  quantizer = gmlp_quantizer_new (device, fp8_recipe, GMLP_FP8_FORMAT_HYBRID, GMLP_QUANTIZER_ROLE_INPUT);
  if (device_sizes)
    {
      g_autoptr(GmlpGroupedTensor) sizes = device_sizes_tensor (device, m, (guint) s->experts, error);

      if (sizes == NULL)
        return FALSE;
      x = gmlp_grouped_tensor_new_with_device_sizes (device, GMLP_DTYPE_BFLOAT16, sizes, rows, in, error);
    }
  else
    x = gmlp_grouped_tensor_new (device, GMLP_DTYPE_BFLOAT16, m, (guint) s->experts, in, error);
  if (x == NULL || !gmlp_grouped_tensor_fill_random (x, 1, 1.0, error))
    return FALSE;
  b.quantizer = quantizer;
  b.x = x;

  for (columnwise = 0; columnwise < 2; columnwise++)
    {
      double bytes = (double) rows * in * (2.0 + (columnwise ? 2.0 : 1.0));
      Timing t;

      gmlp_quantizer_set_columnwise (quantizer, columnwise);
      if (!op_quantize (&b, 0, error) || !op_quantize (&b, 1, error) ||
          !time_op (device, op_quantize, op_quantize, &b, (guint) iters, &t, error))
        return FALSE;
      record = record_shape ("gmlp-quantize", device, s, rows, in);
      bench_record_bool (record, "skew", skew);
      bench_record_string (record, "sizes", device_sizes ? "device" : "host");
      bench_record_string (record, "recipe", fp8_recipe_names[fp8_recipe]);
      bench_record_bool (record, "columnwise", columnwise);
      bench_record_double (record, "ms", t.ms, "%.4f");
      bench_record_double (record, "gbps", bytes / (t.ms * 1e-3) / 1e9, "%.1f");
      bench_record_double (record, "host_us", t.host_us, "%.1f");
      bench_record_emit (record);
    }
  return TRUE;
}

/* One forward+backward step of a BF16 SwiGLU GroupedMLP (hidden K,
 * ffn_hidden N) per shape and routing, as bench/mlp_anchor.py times it with
 * torch._grouped_mm: 18 M K N flops a step. */
typedef struct {
  GmlpGroupedMLP    *mlp;
  GmlpGroupedTensor *x, *dy;
} MlpBench;

static gboolean
op_mlp_step (gpointer data, guint i, GError **error)
{
  MlpBench *b = data;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GmlpGroupedTensor) y = gmlp_grouped_mlp_forward (b->mlp, b->x, &saved, error);
  g_autoptr(GmlpGroupedTensor) dx = y ? gmlp_grouped_mlp_backward (b->mlp, saved, b->dy, error) : NULL;

  return dx != NULL;
}

static gboolean
bench_mlp (GmlpDevice *device, const BenchShape *s, gboolean skew, GError **error)
{
  gint64 rows = s->rows / divide, k = MAX (s->in / divide, 1), n = MAX (s->out / divide, 1);
  g_autofree gint64 *m = split_rows (s->experts, rows, skew);
  g_autoptr(GmlpGroupedMLP) mlp = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL;
  JsonBuilder *record;
  MlpBench b;
  Timing t;
  guint i;

  mlp = gmlp_grouped_mlp_new_full (device, (guint) s->experts, k, n, GMLP_ACTIVATION_SWIGLU,
                                   GMLP_DTYPE_BFLOAT16, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT, error);
  if (mlp == NULL)
    return FALSE;
  x = gmlp_grouped_tensor_new (device, GMLP_DTYPE_BFLOAT16, m, (guint) s->experts, k, error);
  dy = gmlp_grouped_tensor_new (device, GMLP_DTYPE_BFLOAT16, m, (guint) s->experts, k, error);
  if (x == NULL || dy == NULL || !gmlp_grouped_tensor_fill_random (x, 1, 1.0, error) ||
      !gmlp_grouped_tensor_fill_random (dy, 2, 1.0, error))
    return FALSE;
  b.mlp = mlp;
  b.x = x;
  b.dy = dy;
  for (i = 0; i < 2; i++)
    if (!op_mlp_step (&b, i, error))
      return FALSE;
  if (!time_op (device, op_mlp_step, op_mlp_step, &b, (guint) MAX (iters / 4, 5), &t, error))
    return FALSE;
  record = record_shape ("gmlp-mlp", device, s, rows, k);
  bench_record_int (record, "N", n);
  bench_record_bool (record, "skew", skew);
  bench_record_string (record, "activation", "swiglu");
  bench_record_double (record, "ms", t.ms, "%.4f");
  bench_record_double (record, "tflops", 18.0 * rows * k * n / (t.ms * 1e-3) / 1e12, "%.4g");
  bench_record_double (record, "host_us", t.host_us, "%.1f");
  bench_record_emit (record);
  return TRUE;
}

/* Activation offload: device memory held by saved activations with and
 * without offload, the copy rate, and the time of a training step of
 * several layers whose copies take less time than their compute. */
#define OFFLOAD_LAYERS 12

typedef struct {
  GmlpDevice         *device;
  GmlpGroupedLinear  *layers[OFFLOAD_LAYERS];
  GmlpGroupedTensor  *dy;
  gint64             *m;
  guint               experts;
  gint64              in;
} OffloadBench;

/* One step: fresh inputs, forward of every layer (the caller keeps no
 * input), backward in reverse. Returns the device bytes held by saved
 * activations after the forwards. */
static gboolean
offload_step (OffloadBench *b, GmlpOffloadContext *ctx, guint64 *saved_bytes, GError **error)
{
  GmlpSavedActivations *saved[OFFLOAD_LAYERS] = { NULL, };
  guint64 before;
  gboolean ok = FALSE;
  guint i;

  if (ctx != NULL)
    gmlp_offload_context_push_thread_default (ctx, TRUE);
  for (i = 0; i < OFFLOAD_LAYERS; i++)
    {
      g_autoptr(GmlpGroupedTensor) x = gmlp_grouped_tensor_new (b->device, GMLP_DTYPE_BFLOAT16, b->m,
                                                                b->experts, b->in, error);
      g_autoptr(GmlpGroupedTensor) y = NULL;

      if (x == NULL || !gmlp_grouped_tensor_fill_random (x, i, 1.0, error))
        goto out;
      if (i == 0)
        {
          /* What the step holds besides saved activations: the first input. */
          if (!gmlp_device_synchronize (b->device, error))
            goto out;
          before = gmlp_device_get_bytes_in_use (b->device) - gmlp_grouped_tensor_get_nbytes (x);
        }
      y = gmlp_grouped_linear_forward (b->layers[i], x, &saved[i], error);
      if (y == NULL)
        goto out;
    }
  if (ctx != NULL)
    gmlp_offload_context_pop_thread_default (ctx, NULL);
  if (saved_bytes != NULL)
    {
      if (!gmlp_device_synchronize (b->device, error))
        goto out;
      *saved_bytes = gmlp_device_get_bytes_in_use (b->device) - before;
    }
  for (i = OFFLOAD_LAYERS; i-- > 0;)
    {
      g_autoptr(GmlpGroupedTensor) dx = gmlp_grouped_linear_backward (b->layers[i], saved[i], b->dy, error);
      if (dx == NULL)
        goto out;
    }
  ok = TRUE;

out:
  for (i = 0; i < OFFLOAD_LAYERS; i++)
    g_clear_object (&saved[i]);
  return ok;
}

static gboolean
time_steps (OffloadBench *b, GmlpOffloadContext *ctx, guint n, double *ms, GError **error)
{
  gint64 start;
  guint i;

  if (!gmlp_device_synchronize (b->device, error))
    return FALSE;
  start = g_get_monotonic_time ();
  for (i = 0; i < n; i++)
    if (!offload_step (b, ctx, NULL, error))
      return FALSE;
  if (!gmlp_device_synchronize (b->device, error))
    return FALSE;
  *ms = (g_get_monotonic_time () - start) / 1000.0 / n;
  return TRUE;
}

static gboolean
bench_offload (GmlpDevice *device, GError **error)
{
  /* Wide layers: compute per saved byte is high enough that the copies
   * (at the pinned copy rate) take less time than the compute. */
  gint64 rows = 8192 / divide, in = MAX (2048 / divide, 1), out = MAX (16384 / divide, 1);
  g_autoptr(GmlpOffloadContext) ctx = gmlp_offload_context_new (device, error);
  OffloadBench b = { device, { NULL, }, NULL, NULL, 8, in };
  guint64 held_plain = 0, held_offload = 0, offloaded;
  double ms_plain = 0.0, ms_offload = 0.0, copy_ms = 0.0, flops;
  JsonBuilder *record;
  gboolean ok = FALSE;
  guint i;

  b.m = split_rows (b.experts, rows, TRUE);
  for (i = 0; i < OFFLOAD_LAYERS; i++)
    {
      b.layers[i] = gmlp_grouped_linear_new_full (device, b.experts, in, out, GMLP_DTYPE_BFLOAT16,
                                                  GMLP_LINEAR_SINGLE_GROUPED_WEIGHT, error);
      if (b.layers[i] == NULL)
        goto out;
    }
  b.dy = gmlp_grouped_tensor_new (device, GMLP_DTYPE_BFLOAT16, b.m, b.experts, out, error);
  if (b.dy == NULL || !gmlp_grouped_tensor_fill_random (b.dy, 9, 1.0, error))
    goto out;

  /* Warm up both ways (pinned pool, cuBLAS), then measure. */
  if (!offload_step (&b, NULL, NULL, error) || !offload_step (&b, ctx, NULL, error) ||
      !offload_step (&b, NULL, &held_plain, error) || !offload_step (&b, ctx, &held_offload, error))
    goto out;

  for (i = 0; i < 3; i++)
    {
      double a, c;
      if (!time_steps (&b, NULL, (guint) MAX (iters / 10, 2), &a, error) ||
          !time_steps (&b, ctx, (guint) MAX (iters / 10, 2), &c, error))
        goto out;
      ms_plain = i == 0 ? a : MIN (ms_plain, a);
      ms_offload = i == 0 ? c : MIN (ms_offload, c);
    }

  /* The copy rate: one large tensor through a layer with next to no
   * compute, timed from the forward to the end of its copy. */
  {
    gint64 big_rows[1] = { (G_GINT64_CONSTANT (1) << 30) / divide / 2 / 4096 };
    g_autoptr(GmlpGroupedLinear) thin = gmlp_grouped_linear_new_full (device, 1, 4096, 1, GMLP_DTYPE_BFLOAT16,
                                                                       GMLP_LINEAR_SINGLE_GROUPED_WEIGHT, error);
    g_autoptr(GmlpGroupedTensor) big = NULL;
    guint64 bytes0;
    gint64 start;

    if (thin == NULL ||
        (big = gmlp_grouped_tensor_new (device, GMLP_DTYPE_BFLOAT16, big_rows, 1, 4096, error)) == NULL ||
        !gmlp_grouped_tensor_fill_random (big, 3, 1.0, error))
      goto out;
    for (i = 0; i < 4; i++)
      {
        g_autoptr(GmlpSavedActivations) saved = NULL;
        g_autoptr(GmlpGroupedTensor) y = NULL;
        double t;

        if (!gmlp_device_synchronize (device, error))
          goto out;
        bytes0 = gmlp_offload_context_get_bytes_offloaded (ctx);
        start = g_get_monotonic_time ();
        gmlp_offload_context_push_thread_default (ctx, TRUE);
        y = gmlp_grouped_linear_forward (thin, big, &saved, error);
        gmlp_offload_context_pop_thread_default (ctx, NULL);
        if (y == NULL || !gmlp_device_synchronize (device, error))
          goto out;
        t = (g_get_monotonic_time () - start) / 1000.0;
        offloaded = gmlp_offload_context_get_bytes_offloaded (ctx) - bytes0;
        if (i > 0)
          copy_ms = i == 1 ? t : MIN (copy_ms, t);
      }
  }

  flops = 3.0 * 2.0 * rows * in * out * OFFLOAD_LAYERS;
  record = bench_record_new ("gmlp-offload", gmlp_device_get_name (device));
  bench_record_int (record, "layers", OFFLOAD_LAYERS);
  bench_record_int (record, "E", b.experts);
  bench_record_int (record, "M", rows);
  bench_record_int (record, "K", in);
  bench_record_int (record, "N", out);
  bench_record_int (record, "saved_bytes_plain", (gint64) held_plain);
  bench_record_int (record, "saved_bytes_offload", (gint64) held_offload);
  bench_record_double (record, "saved_drop", held_plain ? 1.0 - (double) held_offload / held_plain : 0.0, "%.4f");
  bench_record_double (record, "copy_GBps", offloaded / (copy_ms * 1e-3) / 1e9, "%.1f");
  bench_record_double (record, "step_ms_plain", ms_plain, "%.3f");
  bench_record_double (record, "step_ms_offload", ms_offload, "%.3f");
  bench_record_double (record, "slowdown", ms_offload / ms_plain - 1.0, "%.4f");
  bench_record_double (record, "step_tflops", flops / (ms_plain * 1e-3) / 1e12, "%.4g");
  bench_record_double (record, "copy_ms_per_step",
                       2.0 * OFFLOAD_LAYERS * rows * in * 2 / (offloaded / (copy_ms * 1e-3)) * 1e3, "%.3f");
  bench_record_emit (record);
  ok = TRUE;

out:
  for (i = 0; i < OFFLOAD_LAYERS; i++)
    g_clear_object (&b.layers[i]);
  g_clear_object (&b.dy);
  g_free (b.m);
  return ok;
}

/* Whether --routing (or its absence) asks for the balanced or the skewed
 * split. */
static gboolean
routing_selected (gboolean skew)
{
  return only_routing == NULL || strcmp (only_routing, skew ? "skewed" : "balanced") == 0;
}

/* Waits for the device to finish, then idles for rest_ms. */
static gboolean
rest (GmlpDevice *device, GError **error)
{
  if (!gmlp_device_synchronize (device, error))
    return FALSE;
  g_usleep ((gulong) rest_ms * 1000);
  return TRUE;
}

/* --moe: a whole MoE layer step, forward and backward, and its GroupedMLP
 * alone on the same routed rows. */
typedef struct {
  GmlpMoELayer      *layer;
  GmlpGroupedTensor *x, *dy;
} MoeBench;

static gboolean
op_moe_step (gpointer data, guint i, GError **error)
{
  MoeBench *b = data;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GmlpGroupedTensor) y = gmlp_moe_layer_forward (b->layer, b->x, &saved, error);
  g_autoptr(GmlpGroupedTensor) dx = y ? gmlp_moe_layer_backward (b->layer, saved, b->dy, error) : NULL;

  return dx != NULL;
}

typedef struct {
  GmlpRouting       *routing;
  GmlpGroupedTensor *x, *permuted;
} PermuteBench;

static gboolean
op_permute (gpointer data, guint i, GError **error)
{
  PermuteBench *b = data;
  g_autoptr(GmlpGroupedTensor) out = gmlp_routing_permute_full (b->routing, b->x, 0, 0.0, error);

  return out != NULL;
}

static gboolean
op_combine (gpointer data, guint i, GError **error)
{
  PermuteBench *b = data;
  g_autoptr(GmlpGroupedTensor) out = gmlp_routing_combine (b->routing, b->permuted, error);

  return out != NULL;
}

static gboolean
op_graph_replay (gpointer data, guint i, GError **error)
{
  return gmlp_graph_replay (data, error);
}

static gboolean
op_moe_forward (gpointer data, guint i, GError **error)
{
  MoeBench *b = data;
  g_autoptr(GmlpGroupedTensor) y = gmlp_moe_layer_forward (b->layer, b->x, NULL, error);

  return y != NULL;
}

/* Tokens that the gate set by balanced_gate() routes evenly: token t's
 * logit is 2 for the experts (t·k + j) mod E, j < k, and 0 for the others,
 * so every expert gets T·k/E choices (give or take one); its other columns
 * are uniform in [-1, 1). Made on the host in BF16 (the high half of a
 * float: exact for 0 and 2). */
static GmlpGroupedTensor *
balanced_tokens (GmlpDevice *device, GError **error)
{
  gsize n = (gsize) moe_tokens * moe_hidden, i;
  guint16 *v = g_new (guint16, n);
  guint64 state = 0x9e3779b97f4a7c15;
  g_autoptr(GBytes) bytes = NULL;
  gint64 t;
  gint j;

  for (i = 0; i < n; i++)
    {
      float f = 0.0f;
      guint32 bits;

      if ((gint64) (i % moe_hidden) >= moe_experts)
        {
          state ^= state << 13;
          state ^= state >> 7;
          state ^= state << 17;
          f = (float) ((state >> 11) * (2.0 / 9007199254740992.0) - 1.0);
        }
      memcpy (&bits, &f, sizeof bits);
      v[i] = (guint16) (bits >> 16);
    }
  for (t = 0; t < moe_tokens; t++)
    for (j = 0; j < moe_topk; j++)
      v[t * moe_hidden + (t * moe_topk + j) % moe_experts] = 0x4000;   /* 2.0 */
  bytes = g_bytes_new_take (v, n * sizeof (guint16));
  return gmlp_grouped_tensor_new_from_bytes (device, GMLP_DTYPE_BFLOAT16, &moe_tokens, 1, moe_hidden,
                                             bytes, error);
}

/* The gate that reads the logits off the first E columns of the tokens:
 * the identity there, zero elsewhere. */
static gboolean
balanced_gate (GmlpRouter *router, GError **error)
{
  gsize n = (gsize) moe_experts * moe_hidden;
  float *w = g_new0 (float, n);
  g_autoptr(GBytes) bytes = NULL;
  gint e;

  for (e = 0; e < moe_experts; e++)
    w[(gsize) e * moe_hidden + e] = 1.0f;
  bytes = g_bytes_new_take (w, n * sizeof (float));
  return gmlp_router_set_weight_from_bytes (router, bytes, error);
}

/* A "gmlp-moe" record of part: the layer's arguments, then "part". */
static JsonBuilder *
record_moe (GmlpDevice *device, gint64 fewest, gint64 most, const char *part)
{
  JsonBuilder *record = bench_record_new ("gmlp-moe", gmlp_device_get_name (device));

  bench_record_int (record, "tokens", moe_tokens);
  bench_record_int (record, "hidden", moe_hidden);
  bench_record_int (record, "ffn", moe_ffn);
  bench_record_int (record, "experts", moe_experts);
  bench_record_int (record, "topk", moe_topk);
  bench_record_string (record, "routing", "balanced");
  bench_record_int (record, "min_tokens", fewest);
  bench_record_int (record, "max_tokens", most);
  bench_record_string (record, "dtype", "bf16");
  bench_record_string (record, "activation", "swiglu");
  bench_record_string (record, "part", part);
  return record;
}

/* Ends and emits the record of a permute or combine that moved moved
 * bytes in t.ms. */
static void
emit_moe_moved (JsonBuilder *record, const Timing *t, double moved)
{
  bench_record_double (record, "ms", t->ms, "%.4f");
  bench_record_double (record, "gbps", moved / (t->ms * 1e-3) / 1e9, "%.1f");
  bench_record_double (record, "host_us", t->host_us, "%.1f");
  bench_record_emit (record);
}

static gboolean
bench_moe (GmlpDevice *device, GError **error)
{
  g_autoptr(GmlpMoELayer) layer = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, permuted = NULL, dy_permuted = NULL;
  GmlpGroupedTensor *sizes;   /* the permuted tensor's */
  g_autoptr(GmlpRouting) routing = NULL;
  g_autoptr(GBytes) counts = NULL;
  JsonBuilder *record;
  const gint64 *count;
  gint64 fewest, most;
  double flops = 18.0 * moe_tokens * moe_topk * moe_hidden * moe_ffn;
  MoeBench b;
  MlpBench e;
  Timing layer_t, fwd_t, experts_t, graph_t, permute_t, combine_t;
  PermuteBench pb;
  /* What a permute or combine moves at the least: each token's row once
   * one way, a row per choice the other (BF16). */
  double moved = (moe_topk + 1.0) * moe_tokens * moe_hidden * 2;
  g_autoptr(GmlpGraph) graph = NULL;
  g_autoptr(GmlpCommunicator) comm = NULL;
  guint n = (guint) MAX (iters / 4, 5), i;

  if (moe_tokens < 1 || moe_ffn < 1 || moe_experts < 1 || moe_topk < 1 || moe_hidden < moe_experts)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "--tokens, --ffn, --experts and --topk must be positive, --hidden at least --experts "
                   "(the balanced routing reads the logits off the first --experts columns)");
      return FALSE;
    }
  if (moe_ep)
    {
      gboolean graph_safe = moe_ep_mode != NULL && strcmp (moe_ep_mode, "graph-safe") == 0;

      if (moe_ep_mode != NULL && !graph_safe && strcmp (moe_ep_mode, "exact") != 0)
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                       "--ep-mode takes exact or graph-safe, not %s", moe_ep_mode);
          return FALSE;
        }
      if (moe_ep_chunks < 0)
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                       "--ep-chunks must be positive, not %d", moe_ep_chunks);
          return FALSE;
        }
      if (moe_ep_chunks == 0)
        {
          g_autoptr(GTypeClass) klass = g_type_class_ref (GMLP_TYPE_MOE_LAYER);

          moe_ep_chunks = (gint) G_PARAM_SPEC_UINT (g_object_class_find_property (G_OBJECT_CLASS (klass),
                                                                                  "expert-parallel-chunks"))->default_value;
        }
      comm = gmlp_communicator_new_from_launcher (error);
      if (comm == NULL)
        return FALSE;
      layer = g_initable_new (GMLP_TYPE_MOE_LAYER, NULL, error, "device", device,
                              "hidden", moe_hidden, "ffn-hidden", moe_ffn,
                              "n-experts", (guint) moe_experts, "top-k", (guint) moe_topk,
                              "dtype", GMLP_DTYPE_BFLOAT16, "communicator", comm,
                              "expert-parallel-mode", graph_safe ? GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE
                                                                 : GMLP_EXPERT_PARALLEL_MODE_EXACT,
                              "expert-capacity-factor", graph_safe ? moe_ep_capacity : 0.0,
                              "dispatch-fp8-recipe", fp8_recipe,
                              "expert-parallel-chunks", (guint) moe_ep_chunks, NULL);
    }
  else
    layer = gmlp_moe_layer_new_full (device, moe_hidden, moe_ffn, (guint) moe_experts, (guint) moe_topk,
                                     GMLP_ACTIVATION_SWIGLU, GMLP_DTYPE_BFLOAT16,
                                     GMLP_LINEAR_SINGLE_GROUPED_WEIGHT, error);
  if (layer == NULL)
    return FALSE;
  x = balanced_tokens (device, error);
  dy = x ? gmlp_grouped_tensor_new (device, GMLP_DTYPE_BFLOAT16, &moe_tokens, 1, moe_hidden, error) : NULL;
  if (dy == NULL || !gmlp_grouped_tensor_fill_random (dy, 2, 1.0, error) ||
      !balanced_gate (gmlp_moe_layer_get_router (layer), error))
    return FALSE;
  b.layer = layer;
  b.x = x;
  b.dy = dy;

  /* Warm up; the routing of the last forward is the one the experts are
   * then timed on, and it must be balanced (one host read, untimed). */
  for (i = 0; i < 2; i++)
    if (!op_moe_step (&b, i, error))
      return FALSE;
  routing = gmlp_moe_layer_get_routing (layer);
  counts = gmlp_grouped_tensor_to_bytes (gmlp_routing_get_tokens_per_expert (routing), error);
  if (counts == NULL)
    return FALSE;
  count = g_bytes_get_data (counts, NULL);
  fewest = most = count[0];
  for (i = 1; i < (guint) moe_experts; i++)
    {
      fewest = MIN (fewest, count[i]);
      most = MAX (most, count[i]);
    }
  if (most - fewest > 1)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_BACKEND,
                   "the backend did not route as the gate says: %" G_GINT64_FORMAT " to %"
                   G_GINT64_FORMAT " tokens per expert, not balanced", fewest, most);
      return FALSE;
    }

  if (moe_steps > 0)
    {
      for (i = 0; i < (guint) moe_steps; i++)
        if (!op_moe_step (&b, i, error))
          return FALSE;
      return gmlp_device_synchronize (device, error);
    }
  /* Each timing after the same rest: back to back, the GPU would meet the
   * later ones hotter, at lower clocks. */
  if (!rest (device, error) || !time_op (device, op_moe_step, op_moe_step, &b, n, &layer_t, error) ||
      !rest (device, error) || !time_op (device, op_moe_forward, op_moe_forward, &b, n, &fwd_t, error))
    return FALSE;

  /* The same step captured once and replayed (graph_ms, graph_host_us),
   * where graphs exist. */
  graph_t.ms = graph_t.host_us = 0.0;
  if (gmlp_device_get_kind (device) != GMLP_DEVICE_KIND_CPU &&
      (comm == NULL || (moe_ep_mode != NULL && strcmp (moe_ep_mode, "graph-safe") == 0)))
    {
      if (!gmlp_device_begin_capture (device, error))
        return FALSE;
      if (!op_moe_step (&b, 0, error))
        {
          g_autoptr(GmlpGraph) abandoned = gmlp_device_end_capture (device, NULL);
          return FALSE;
        }
      graph = gmlp_device_end_capture (device, error);
      if (graph == NULL || !rest (device, error) ||
          !time_op (device, op_graph_replay, op_graph_replay, graph, n, &graph_t, error))
        return FALSE;
    }

  /* Expert parallel: the layer's step, each rank's own record (the
   * experts alone are another layer's: they hold E / world experts). */
  if (comm != NULL)
    {
      record = record_moe (device, fewest, most, "layer");
      bench_record_int (record, "ep_ranks", gmlp_communicator_get_world_size (comm));
      bench_record_int (record, "rank", gmlp_communicator_get_rank (comm));
      bench_record_string (record, "ep_mode", moe_ep_mode != NULL ? moe_ep_mode : "exact");
      bench_record_string (record, "ep_dispatch", fp8_recipe == GMLP_SCALING_RECIPE_NONE ? "bf16"
                                                  : fp8_recipe_names[fp8_recipe]);
      bench_record_int (record, "ep_chunks", gmlp_moe_layer_get_expert_parallel_chunks (layer));
      bench_record_double (record, "fwd_ms", fwd_t.ms, "%.4f");
      bench_record_double (record, "ms", layer_t.ms, "%.4f");
      bench_record_double (record, "tflops", flops / (layer_t.ms * 1e-3) / 1e12, "%.4g");
      bench_record_double (record, "host_us", layer_t.host_us, "%.1f");
      bench_record_double (record, "busy_host_us", layer_t.busy_us, "%.1f");
      if (graph != NULL)
        {
          bench_record_double (record, "graph_ms", graph_t.ms, "%.4f");
          bench_record_double (record, "graph_host_us", graph_t.host_us, "%.1f");
        }
      bench_record_emit (record);
      return TRUE;
    }

  /* The experts alone: the layer's GroupedMLP on the layer's own
   * permutation of the same tokens (device sizes, as in the layer). */
  permuted = gmlp_routing_permute_full (routing, x, 0, 0.0, error);
  sizes = permuted ? gmlp_grouped_tensor_get_sizes (permuted, error) : NULL;
  dy_permuted = sizes ? gmlp_grouped_tensor_new_with_device_sizes (device, GMLP_DTYPE_BFLOAT16, sizes,
                                                                   gmlp_grouped_tensor_get_row_capacity (permuted),
                                                                   moe_hidden, error) : NULL;
  if (dy_permuted == NULL || !gmlp_grouped_tensor_fill_random (dy_permuted, 3, 1.0, error))
    return FALSE;
  pb.routing = routing;
  pb.x = x;
  pb.permuted = permuted;
  if (!rest (device, error) || !time_op (device, op_permute, op_permute, &pb, n, &permute_t, error) ||
      !rest (device, error) || !time_op (device, op_combine, op_combine, &pb, n, &combine_t, error))
    return FALSE;
  e.mlp = gmlp_moe_layer_get_experts (layer);
  e.x = permuted;
  e.dy = dy_permuted;
  if (!rest (device, error) || !op_mlp_step (&e, 0, error) ||
      !time_op (device, op_mlp_step, op_mlp_step, &e, n, &experts_t, error))
    return FALSE;

  record = record_moe (device, fewest, most, "experts");
  bench_record_int (record, "rows", moe_tokens * moe_topk);
  bench_record_double (record, "ms", experts_t.ms, "%.4f");
  bench_record_double (record, "tflops", flops / (experts_t.ms * 1e-3) / 1e12, "%.4g");
  bench_record_double (record, "host_us", experts_t.host_us, "%.1f");
  bench_record_emit (record);

  record = record_moe (device, fewest, most, "layer");
  bench_record_double (record, "fwd_ms", fwd_t.ms, "%.4f");
  bench_record_double (record, "fwd_host_us", fwd_t.host_us, "%.1f");
  bench_record_double (record, "ms", layer_t.ms, "%.4f");
  bench_record_double (record, "tflops", flops / (layer_t.ms * 1e-3) / 1e12, "%.4g");
  bench_record_double (record, "host_us", layer_t.host_us, "%.1f");
  bench_record_double (record, "busy_host_us", layer_t.busy_us, "%.1f");
  bench_record_double (record, "over_experts", layer_t.ms / experts_t.ms, "%.4f");
  if (graph != NULL)
    {
      bench_record_double (record, "graph_ms", graph_t.ms, "%.4f");
      bench_record_double (record, "graph_host_us", graph_t.host_us, "%.1f");
    }
  bench_record_emit (record);

  emit_moe_moved (record_moe (device, fewest, most, "permute"), &permute_t, moved);
  emit_moe_moved (record_moe (device, fewest, most, "combine"), &combine_t, moved);
  return TRUE;
}

int
main (int argc, char *argv[])
{
  g_autoptr(GOptionContext) context = g_option_context_new ("- GroupedLinear throughput, JSON lines");
  g_autoptr(GError) error = NULL;
  GmlpDevice *device;
  guint s, skew;
  gboolean any = FALSE;

  setlocale (LC_ALL, "");
  n_shapes = bench_n_anchor_shapes;
  g_option_context_add_main_entries (context, entries, NULL);
  if (!g_option_context_parse (context, &argc, &argv, &error))
    {
      g_printerr ("%s\n", error->message);
      return EXIT_FAILURE;
    }
  bench_output_set_table (table);
  if (quantize_mode && fp8_recipe == GMLP_SCALING_RECIPE_NONE)
    fp8_recipe = GMLP_SCALING_RECIPE_DELAYED;
  if (!routing_selected (FALSE) && !routing_selected (TRUE))
    {
      g_printerr ("--routing takes balanced or skewed, not %s\n", only_routing);
      return EXIT_FAILURE;
    }
  if (method != NULL && strcmp (method, "steady") != 0 && !do_bench_method ())
    {
      g_printerr ("--method takes steady or do-bench, not %s\n", method);
      return EXIT_FAILURE;
    }
  if (iters < 1 || divide < 1 || rest_ms < 0 || warm_ms < 0)
    {
      g_printerr ("--iters and --divide must be positive, --rest-ms and --warm-ms not negative\n");
      return EXIT_FAILURE;
    }

  if (dims != NULL)
    {
      BenchShape custom = { "custom", 0, 0, 0, 0 };
      char end;

      if (sscanf (dims, "%" G_GINT64_FORMAT ",%" G_GINT64_FORMAT ",%" G_GINT64_FORMAT ",%" G_GINT64_FORMAT "%c",
                  &custom.experts, &custom.rows, &custom.in, &custom.out, &end) != 4 ||
          custom.experts < 1 || custom.rows < 1 || custom.in < 1 || custom.out < 1)
        {
          g_printerr ("--dims takes four positive integers E,M,K,N, not %s\n", dims);
          return EXIT_FAILURE;
        }
      custom_shape = custom;
      shapes = &custom_shape;
      n_shapes = 1;
      only_shape = NULL;
    }

  device = gmlp_device_get_default ();
  if (!gmlp_device_apply_tuning (device, tuning, &error))
    {
      g_printerr ("gmlp-bench: --tuning: %s\n", error->message);
      return EXIT_FAILURE;
    }
  if (moe_mode)
    {
      if (mlp_mode || offload_mode || quantize_mode || (fp8_recipe != GMLP_SCALING_RECIPE_NONE && !moe_ep))
        {
          g_printerr ("gmlp-bench: --moe times a BF16 layer alone: no --mlp, --offload, --quantize or --fp8 "
                      "(with --ep, --fp8=blockwise or mxfp8 is the dispatch's)\n");
          return EXIT_FAILURE;
        }
      if (!rest (device, &error) || !bench_moe (device, &error))
        {
          g_printerr ("gmlp-bench: --moe: %s\n", error->message);
          return EXIT_FAILURE;
        }
      bench_output_print_table ();
      return EXIT_SUCCESS;
    }
  if (offload_mode)
    {
      if (!bench_offload (device, &error))
        {
          g_printerr ("gmlp-bench: offload: %s\n", error->message);
          return EXIT_FAILURE;
        }
      bench_output_print_table ();
      return EXIT_SUCCESS;
    }
  for (s = 0; s < n_shapes; s++)
    {
      if (only_shape != NULL && strcmp (only_shape, shapes[s].name) != 0)
        continue;
      any = TRUE;
      for (skew = 0; skew < 2; skew++)
        if (routing_selected (skew) &&
            (!rest (device, &error) ||
             !(mlp_mode ? bench_mlp (device, &shapes[s], skew, &error)
               : quantize_mode ? bench_quantize (device, &shapes[s], skew, &error)
               : bench_shape (device, &shapes[s], skew, &error))))
          {
            g_printerr ("gmlp-bench: %s: %s\n", shapes[s].name, error->message);
            return EXIT_FAILURE;
          }
    }
  if (!any)
    {
      g_printerr ("gmlp-bench: no shape named %s\n", only_shape);
      return EXIT_FAILURE;
    }
  bench_output_print_table ();
  return EXIT_SUCCESS;
}
