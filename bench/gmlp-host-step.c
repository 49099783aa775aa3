/* gmlp-host-step.c: the host cost of a training step
 *
 *   gmlp-host-step [--what linear|mlp|moe] [--steps N] [--tokens T]
 *                  [--hidden H] [--ffn F] [--experts E] [--topk K]
 *
 * linear (the default): a forward and backward of a tiny GroupedLinear
 * (8 groups of one row, 16 → 16 features, FP32) over and over, with no
 * wait: on the CPU the arithmetic is negligible and what is left is the
 * library's own work per call, which `valgrind --tool=callgrind` counts
 * repeatably (docs/performance.md).
 *
 * mlp and moe: a BF16 SwiGLU GroupedMLP step on tokens × top-k rows with
 * device sizes (the rows of a routing), or a whole MoELayer step, at the
 * given shape (the MoE anchor A by default). The device is idle when each
 * step starts, as gmlp-bench's host_us, and only the calls are timed.
 * scripts/dev/hostprof.c samples where that time goes (the steps are
 * host_step_mlp() and host_step_moe()).
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

static const GOptionEntry entries[] = {
  { "what", 0, 0, G_OPTION_ARG_STRING, &what, "linear, mlp, moe, router or alloc", "WHAT" },
  { "steps", 0, 0, G_OPTION_ARG_INT, &steps, "Steps (2000 linear, 200 otherwise)", "N" },
  { "tokens", 0, 0, G_OPTION_ARG_INT64, &tokens, "Tokens (8192)", "T" },
  { "hidden", 0, 0, G_OPTION_ARG_INT64, &hidden, "Hidden size (4096)", "H" },
  { "ffn", 0, 0, G_OPTION_ARG_INT64, &ffn, "Expert FFN size (1536)", "F" },
  { "experts", 0, 0, G_OPTION_ARG_INT, &experts, "Experts (64)", "E" },
  { "topk", 0, 0, G_OPTION_ARG_INT, &topk, "Experts per token (8)", "K" },
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

/* Not inlined: the profiler finds the steps by these names. */
G_NO_INLINE static gboolean
host_step_mlp (GmlpGroupedMLP *mlp, GmlpGroupedTensor *x, GmlpGroupedTensor *dy, GError **error)
{
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GmlpGroupedTensor) y = gmlp_grouped_mlp_forward (mlp, x, &saved, error);
  g_autoptr(GmlpGroupedTensor) dx = y ? gmlp_grouped_mlp_backward (mlp, saved, dy, error) : NULL;

  return dx != NULL;
}

G_NO_INLINE static gboolean
host_step_moe (GmlpMoELayer *layer, GmlpGroupedTensor *x, GmlpGroupedTensor *dy, GError **error)
{
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GmlpGroupedTensor) y = gmlp_moe_layer_forward (layer, x, &saved, error);
  g_autoptr(GmlpGroupedTensor) dx = y ? gmlp_moe_layer_backward (layer, saved, dy, error) : NULL;

  return dx != NULL;
}

G_NO_INLINE static gboolean
host_step_router (GmlpRouter *router, GmlpGroupedTensor *x, GmlpGroupedTensor *grad_probs, GError **error)
{
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GmlpRouting) routing = gmlp_router_forward (router, x, &saved, error);
  g_autoptr(GmlpGroupedTensor) dx = routing ? gmlp_router_backward (router, saved, grad_probs, error) : NULL;

  return dx != NULL;
}

G_NO_INLINE static gboolean
warm_up_router (GmlpRouter *router, GmlpGroupedTensor *x, GmlpGroupedTensor *grad_probs, GError **error)
{
  return host_step_router (router, x, grad_probs, error);
}

/* The layer's router alone: its forward, and its backward from a gradient
 * of the probabilities. */
static void
host_router (GmlpDevice *device)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpMoELayer) layer = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, grad_probs = NULL;
  g_autofree gint64 *times = NULL;
  gint64 choices = tokens;
  GmlpRouter *router;
  int n = steps > 0 ? steps : 200, i;

  layer = gmlp_moe_layer_new_full (device, hidden, ffn, (guint) experts, (guint) topk,
                                   GMLP_ACTIVATION_SWIGLU, GMLP_DTYPE_BFLOAT16,
                                   GMLP_LINEAR_SINGLE_GROUPED_WEIGHT, &error);
  if (layer != NULL)
    x = gmlp_grouped_tensor_new (device, GMLP_DTYPE_BFLOAT16, &tokens, 1, hidden, &error);
  if (x != NULL)
    grad_probs = gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, &choices, 1, topk, &error);
  if (grad_probs == NULL || !gmlp_grouped_tensor_fill_random (x, 1, 1.0, &error) ||
      !gmlp_grouped_tensor_fill_random (grad_probs, 2, 1.0, &error))
    g_error ("%s", error->message);
  router = gmlp_moe_layer_get_router (layer);
  if (!warm_up_router (router, x, grad_probs, &error))
    g_error ("%s", error->message);
  times = g_new (gint64, n);
  for (i = 0; i < n; i++)
    {
      gint64 start;
      gboolean ok;

      if (!gmlp_device_synchronize (device, &error))
        g_error ("%s", error->message);
      start = g_get_monotonic_time ();
      ok = host_step_router (router, x, grad_probs, &error);
      times[i] = g_get_monotonic_time () - start;
      if (!ok)
        g_error ("%s", error->message);
    }
  print_result (device, "router", times, n);
}

/* The untimed first steps (which load the kernels) go through these, so
 * that a profile can leave them out (hostprof-report.py --exclude warm_up_moe). */
G_NO_INLINE static gboolean
warm_up_moe (GmlpMoELayer *layer, GmlpGroupedTensor *x, GmlpGroupedTensor *dy, GError **error)
{
  return host_step_moe (layer, x, dy, error);
}

G_NO_INLINE static gboolean
warm_up_mlp (GmlpGroupedMLP *mlp, GmlpGroupedTensor *x, GmlpGroupedTensor *dy, GError **error)
{
  return host_step_mlp (mlp, x, dy, error);
}

static void
host_layer (GmlpDevice *device, gboolean moe)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpMoELayer) layer = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, permuted = NULL, dy_permuted = NULL;
  g_autofree gint64 *times = NULL;
  GmlpGroupedMLP *mlp;
  int n = steps > 0 ? steps : 200, i;

  layer = gmlp_moe_layer_new_full (device, hidden, ffn, (guint) experts, (guint) topk,
                                   GMLP_ACTIVATION_SWIGLU, GMLP_DTYPE_BFLOAT16,
                                   GMLP_LINEAR_SINGLE_GROUPED_WEIGHT, &error);
  if (layer != NULL)
    x = gmlp_grouped_tensor_new (device, GMLP_DTYPE_BFLOAT16, &tokens, 1, hidden, &error);
  if (x != NULL)
    dy = gmlp_grouped_tensor_new (device, GMLP_DTYPE_BFLOAT16, &tokens, 1, hidden, &error);
  if (dy == NULL || !gmlp_grouped_tensor_fill_random (x, 1, 1.0, &error) ||
      !gmlp_grouped_tensor_fill_random (dy, 2, 1.0, &error) ||
      !warm_up_moe (layer, x, dy, &error))
    g_error ("%s", error->message);
  mlp = gmlp_moe_layer_get_experts (layer);
  if (!moe)
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
      if (dy_permuted == NULL || !gmlp_grouped_tensor_fill_random (dy_permuted, 3, 1.0, &error) ||
          !warm_up_mlp (mlp, permuted, dy_permuted, &error))
        g_error ("%s", error->message);
    }

  times = g_new (gint64, n);
  for (i = 0; i < n; i++)
    {
      gint64 start;
      gboolean ok;

      if (!gmlp_device_synchronize (device, &error))
        g_error ("%s", error->message);
      start = g_get_monotonic_time ();
      ok = moe ? host_step_moe (layer, x, dy, &error) : host_step_mlp (mlp, permuted, dy_permuted, &error);
      times[i] = g_get_monotonic_time () - start;
      if (!ok)
        g_error ("%s", error->message);
    }
  if (!gmlp_device_synchronize (device, &error))
    g_error ("%s", error->message);
  print_result (device, moe ? "moe" : "mlp", times, n);
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
  else if (g_strcmp0 (what, "router") == 0)
    host_router (device);
  else if (g_strcmp0 (what, "alloc") == 0)
    host_alloc (device);
  else if (g_strcmp0 (what, "mlp") == 0 || g_strcmp0 (what, "moe") == 0)
    host_layer (device, g_strcmp0 (what, "moe") == 0);
  else
    g_error ("--what must be linear, mlp, moe, router or alloc");
  return 0;
}
