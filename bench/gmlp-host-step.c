/* gmlp-host-step.c: the host cost of a training step
 *
 *   gmlp-host-step [--what linear|mlp|moe|router|alloc] [--steps N] [--idle]
 *                  [--tokens T] [--hidden H] [--ffn F] [--experts E] [--topk K]
 *
 * linear (the default): a forward and backward of a tiny GroupedLinear
 * (8 groups of one row, 16 → 16 features, FP32) over and over, with no
 * wait: on the CPU the arithmetic is negligible and what is left is the
 * library's own work per call, which `valgrind --tool=callgrind` counts
 * repeatably (docs/performance.md).
 *
 * mlp and moe: a BF16 SwiGLU GroupedMLP step on tokens × top-k rows with
 * device sizes (the rows of a routing), or a whole MoELayer step, at the
 * given shape (the MoE anchor A by default); only the calls are timed.
 * By default each timed step starts while the device still runs the one
 * before, as in training; with --idle, on an idle device, as gmlp-bench's
 * host_us (the driver's first calls after the GPU idles cost more).
 * scripts/dev/hostprof.c samples where that time goes (the steps are
 * host_step_mlp(), host_step_moe() and host_step_router(); leave out
 * untimed_step()).
 *
 * router: the MoE layer's router alone, forward and backward.
 *
 * alloc: tensors of the sizes such a step allocates, made and dropped
 * over and over on an idle device: the host time of an allocation.
 *
 * GMLP_DEVICE chooses the device. Prints one JSON line: the mean and the
 * median host time per step.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <locale.h>
#include <stdlib.h>

#include <gmlp.h>

#include "bench-json.h"

static char *what = NULL;
static gint steps = 0;
static gint64 tokens = 8192, hidden = 4096, ffn = 1536;
static gint experts = 64, topk = 8;
static gboolean idle = FALSE;

static const GOptionEntry entries[] = {
  { "what", 0, 0, G_OPTION_ARG_STRING, &what, "linear, mlp, moe, router or alloc", "WHAT" },
  { "steps", 0, 0, G_OPTION_ARG_INT, &steps, "Steps (2000 linear, 200 otherwise)", "N" },
  { "tokens", 0, 0, G_OPTION_ARG_INT64, &tokens, "Tokens (8192)", "T" },
  { "hidden", 0, 0, G_OPTION_ARG_INT64, &hidden, "Hidden size (4096)", "H" },
  { "ffn", 0, 0, G_OPTION_ARG_INT64, &ffn, "Expert FFN size (1536)", "F" },
  { "experts", 0, 0, G_OPTION_ARG_INT, &experts, "Experts (64)", "E" },
  { "topk", 0, 0, G_OPTION_ARG_INT, &topk, "Experts per token (8)", "K" },
  { "idle", 0, 0, G_OPTION_ARG_NONE, &idle, "Time steps that start on an idle device", NULL },
  { NULL }
};

static int
compare_gint64 (gconstpointer a, gconstpointer b)
{
  gint64 x = *(const gint64 *) a, y = *(const gint64 *) b;
  return x < y ? -1 : x > y;
}

static void
print_result (GmlpDevice *device, const char *name, gint64 *times, int n)
{
  JsonBuilder *record;
  gint64 sum = 0;
  int i;

  for (i = 0; i < n; i++)
    sum += times[i];
  qsort (times, (gsize) n, sizeof *times, compare_gint64);
  record = bench_record_new (NULL, gmlp_device_get_name (device));
  bench_record_string (record, "what", name);
  bench_record_int (record, "steps", n);
  bench_record_double (record, "host_us_per_step", (double) sum / MAX (n, 1), "%.2f");
  bench_record_double (record, "median_us", n ? (double) times[n / 2] : 0.0, "%.1f");
  bench_record_emit (record);
}

static void
host_linear (GmlpDevice *device)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedLinear) layer = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL;
  gint64 rows[8] = { 1, 1, 1, 1, 1, 1, 1, 1 };
  int n = steps > 0 ? steps : 2000, i;
  JsonBuilder *record;
  gint64 start;

  layer = gmlp_grouped_linear_new (device, 8, 16, 16, &error);
  if (layer != NULL)
    x = gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, rows, 8, 16, &error);
  if (x == NULL || !gmlp_grouped_tensor_fill_random (x, 1, 1.0, &error))
    g_error ("%s", error->message);

  start = g_get_monotonic_time ();
  for (i = 0; i < n; i++)
    {
      g_autoptr(GmlpSavedActivations) saved = NULL;
      g_autoptr(GmlpGroupedTensor) y = gmlp_grouped_linear_forward (layer, x, &saved, &error);
      g_autoptr(GmlpGroupedTensor) dx = NULL;

      if (y != NULL)
        dx = gmlp_grouped_linear_backward (layer, saved, y, &error);
      if (dx == NULL)
        g_error ("%s", error->message);
    }
  if (!gmlp_device_synchronize (device, &error))
    g_error ("%s", error->message);

  record = bench_record_new (NULL, gmlp_device_get_name (device));
  bench_record_string (record, "what", "linear");
  bench_record_int (record, "steps", n);
  bench_record_double (record, "host_us_per_step", (double) (g_get_monotonic_time () - start) / MAX (n, 1),
                       "%.2f");
  bench_record_emit (record);
}

/* One step of what is measured, on the tensors in data. */
typedef struct {
  GmlpMoELayer      *layer;
  GmlpGroupedMLP    *mlp;
  GmlpRouter        *router;
  GmlpGroupedTensor *x, *dy;
} Step;

typedef gboolean (*StepFunc) (const Step *step, GError **error);

/* Not inlined: the profiler finds the steps by these names. */
G_NO_INLINE static gboolean
host_step_mlp (const Step *s, GError **error)
{
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GmlpGroupedTensor) y = gmlp_grouped_mlp_forward (s->mlp, s->x, &saved, error);
  g_autoptr(GmlpGroupedTensor) dx = y ? gmlp_grouped_mlp_backward (s->mlp, saved, s->dy, error) : NULL;

  return dx != NULL;
}

G_NO_INLINE static gboolean
host_step_moe (const Step *s, GError **error)
{
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GmlpGroupedTensor) y = gmlp_moe_layer_forward (s->layer, s->x, &saved, error);
  g_autoptr(GmlpGroupedTensor) dx = y ? gmlp_moe_layer_backward (s->layer, saved, s->dy, error) : NULL;

  return dx != NULL;
}

/* The router alone: forward, and backward from a gradient of the
 * probabilities (dy). */
G_NO_INLINE static gboolean
host_step_router (const Step *s, GError **error)
{
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GmlpRouting) routing = gmlp_router_forward (s->router, s->x, &saved, error);
  g_autoptr(GmlpGroupedTensor) dx = routing ? gmlp_router_backward (s->router, saved, s->dy, error) : NULL;

  return dx != NULL;
}

/* The steps that are not timed (the first, which loads kernels, and those
 * that start a round on an idle device in the busy measure) go through
 * here, so that a profile can leave them out (hostprof-report.py
 * --exclude untimed_step). */
G_NO_INLINE static gboolean
untimed_step (StepFunc func, const Step *step, GError **error)
{
  return func (step, error);
}

/* Host time per step, two ways. Idle: the device has finished everything
 * when each step starts (gmlp-bench's host_us). Busy: steps follow each
 * other in rounds of four, the device still running the previous step when
 * the last three start, as in training; only those are timed. An idle GPU
 * answers the driver's first calls more slowly, so the idle figure is the
 * higher. */
static void
time_steps (GmlpDevice *device, const char *name, StepFunc func, const Step *step)
{
  g_autoptr(GError) error = NULL;
  int n = steps > 0 ? steps : 200, i, timed = 0;
  g_autofree gint64 *times = g_new (gint64, n);
  g_autofree char *label = g_strdup_printf ("%s%s", name, idle ? " idle" : "");

  if (!untimed_step (func, step, &error))
    g_error ("%s", error->message);
  for (i = 0; timed < n; i++)
    {
      gint64 start;

      if ((idle || i % 4 == 0) && !gmlp_device_synchronize (device, &error))
        g_error ("%s", error->message);
      if (!idle && i % 4 == 0)
        {
          if (!untimed_step (func, step, &error))
            g_error ("%s", error->message);
          continue;
        }
      start = g_get_monotonic_time ();
      if (!func (step, &error))
        g_error ("%s", error->message);
      times[timed++] = g_get_monotonic_time () - start;
    }
  if (!gmlp_device_synchronize (device, &error))
    g_error ("%s", error->message);
  print_result (device, label, times, n);
}

static void
host_layer (GmlpDevice *device, const char *what_name)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpMoELayer) layer = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, permuted = NULL, dy_permuted = NULL;
  g_autoptr(GmlpGroupedTensor) grad_probs = NULL;
  gint64 choices = tokens;
  Step step = { 0 };

  layer = gmlp_moe_layer_new_full (device, hidden, ffn, (guint) experts, (guint) topk,
                                   GMLP_ACTIVATION_SWIGLU, GMLP_DTYPE_BFLOAT16,
                                   GMLP_LINEAR_SINGLE_GROUPED_WEIGHT, &error);
  if (layer != NULL)
    x = gmlp_grouped_tensor_new (device, GMLP_DTYPE_BFLOAT16, &tokens, 1, hidden, &error);
  if (x != NULL)
    dy = gmlp_grouped_tensor_new (device, GMLP_DTYPE_BFLOAT16, &tokens, 1, hidden, &error);
  step.layer = layer;
  step.x = x;
  step.dy = dy;
  if (dy == NULL || !gmlp_grouped_tensor_fill_random (x, 1, 1.0, &error) ||
      !gmlp_grouped_tensor_fill_random (dy, 2, 1.0, &error) ||
      !untimed_step (host_step_moe, &step, &error))
    g_error ("%s", error->message);

  if (g_strcmp0 (what_name, "moe") == 0)
    time_steps (device, "moe", host_step_moe, &step);
  else if (g_strcmp0 (what_name, "router") == 0)
    {
      grad_probs = gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, &choices, 1, topk, &error);
      if (grad_probs == NULL || !gmlp_grouped_tensor_fill_random (grad_probs, 2, 1.0, &error))
        g_error ("%s", error->message);
      step.router = gmlp_moe_layer_get_router (layer);
      step.dy = grad_probs;
      time_steps (device, "router", host_step_router, &step);
    }
  else
    {
      /* The experts' rows as the layer routed them: device sizes. */
      GmlpRouting *routing = gmlp_moe_layer_get_routing (layer);
      GmlpGroupedTensor *sizes;

      permuted = gmlp_routing_permute_full (routing, x, 0, 0.0, &error);
      g_object_unref (routing);
      sizes = permuted ? gmlp_grouped_tensor_get_sizes (permuted, &error) : NULL;
      dy_permuted = sizes ? gmlp_grouped_tensor_new_with_device_sizes (
                              device, GMLP_DTYPE_BFLOAT16, sizes,
                              gmlp_grouped_tensor_get_row_capacity (permuted), hidden, &error) : NULL;
      if (dy_permuted == NULL || !gmlp_grouped_tensor_fill_random (dy_permuted, 3, 1.0, &error))
        g_error ("%s", error->message);
      step.mlp = gmlp_moe_layer_get_experts (layer);
      step.x = permuted;
      step.dy = dy_permuted;
      time_steps (device, "mlp", host_step_mlp, &step);
    }
}

/* Each size's median time to make a tensor (µs), the tensors of a round
 * kept until its end, as a step keeps its activations. */
static void
host_alloc (GmlpDevice *device)
{
  static const gint64 rows[] = { 65536 + 1024, 65536 + 1024, 8192, 8192, 64, 65536, 1 };
  static const gint64 cols[] = { 4096, 3072, 4096, 64, 1, 1536, 8 };
  const guint n_sizes = G_N_ELEMENTS (rows);
  int n = steps > 0 ? steps : 50, i;
  g_autofree gint64 *times = g_new (gint64, (gsize) n * n_sizes);
  g_autoptr(GError) error = NULL;
  guint j;

  for (i = 0; i < n; i++)
    {
      GmlpGroupedTensor *kept[G_N_ELEMENTS (rows)];

      if (!gmlp_device_synchronize (device, &error))
        g_error ("%s", error->message);
      for (j = 0; j < n_sizes; j++)
        {
          gint64 start = g_get_monotonic_time ();

          kept[j] = gmlp_grouped_tensor_new (device, GMLP_DTYPE_BFLOAT16, &rows[j], 1, cols[j], &error);
          times[j * n + i] = g_get_monotonic_time () - start;
          if (kept[j] == NULL)
            g_error ("%s", error->message);
        }
      for (j = 0; j < n_sizes; j++)
        g_object_unref (kept[j]);
    }
  for (j = 0; j < n_sizes; j++)
    {
      g_autofree char *name = g_strdup_printf ("alloc %" G_GINT64_FORMAT "x%" G_GINT64_FORMAT " bf16",
                                               rows[j], cols[j]);

      print_result (device, name, times + j * n, n);
    }
}

int
main (int   argc,
      char *argv[])
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GOptionContext) context = g_option_context_new ("- the host time of a step");
  GmlpDevice *device;

  setlocale (LC_ALL, "");
  g_option_context_add_main_entries (context, entries, NULL);
  if (!g_option_context_parse (context, &argc, &argv, &error))
    g_error ("%s", error->message);
  /* The old form: gmlp-host-step STEPS */
  if (argc > 1)
    steps = atoi (argv[1]);
  device = gmlp_device_get_default ();
  if (what == NULL || g_strcmp0 (what, "linear") == 0)
    host_linear (device);
  else if (g_strcmp0 (what, "alloc") == 0)
    host_alloc (device);
  else if (g_strcmp0 (what, "mlp") == 0 || g_strcmp0 (what, "moe") == 0 || g_strcmp0 (what, "router") == 0)
    host_layer (device, what);
  else
    g_error ("--what must be linear, mlp, moe, router or alloc");
  return 0;
}
