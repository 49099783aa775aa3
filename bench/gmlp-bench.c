/* gmlp-bench: GroupedLinear throughput on the anchor shapes, JSON lines
 *
 * For each shape of ../shared/bench (experts E, routed rows M, in K, out N)
 * and balanced and skewed routing, times fprop (y = x Wᵀ), dgrad
 * (dx = dy W) and wgrad (dW = dyᵀ x) of a BF16 GmlpGroupedLinear on the
 * default device, and the host time one call takes. Each call is timed with
 * device events and the median taken, as the anchors are. The skewed split is
 * the one cublas_anchor.cu uses.
 *
 *   gmlp-bench [--shape NAME] [--iters N] [--divide D]
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <stdlib.h>
#include <string.h>

#include <gmlp.h>

typedef struct {
  const char *name;
  gint64      experts, rows, in, out;
} Shape;

static const Shape shapes[] = {
  { "mixtral-fc1", 8, 16384, 4096, 14336 },
  { "dsv3-fc1", 32, 32768, 7168, 2048 },
  { "qwen3-fc1", 128, 65536, 2048, 768 },
  { "small-e64", 64, 8192, 1024, 1024 },
};

static char *only_shape = NULL;
static gint iters = 100;
static gint divide = 1;

static const GOptionEntry entries[] = {
  { "shape", 's', 0, G_OPTION_ARG_STRING, &only_shape, "Run one shape only", "NAME" },
  { "iters", 'n', 0, G_OPTION_ARG_INT, &iters, "Timed calls per measurement (default 100)", "N" },
  { "divide", 'd', 0, G_OPTION_ARG_INT, &divide, "Divide M, K and N by D (for the CPU)", "D" },
  { NULL }
};

/* Group sizes: balanced, or the skewed split of cublas_anchor.cu. */
static gint64 *
split_rows (gint64 experts, gint64 rows, gboolean skew)
{
  gint64 *m = g_new (gint64, experts);
  gint64 e, acc = 0;

  if (!skew)
    {
      for (e = 0; e < experts; e++)
        m[e] = rows / experts;
      m[0] += rows - (rows / experts) * experts;
      return m;
    }

  {
    double *w = g_new (double, experts), total = 0.0;
    guint32 x = 12345;
    gint64 align = MAX (16 / divide, 1);

    for (e = 0; e < experts; e++)
      {
        x = x * 1103515245u + 12345u;
        w[e] = 1.0 + ((x >> 8) % 1000) / 250.0;
        total += w[e];
      }
    for (e = 0; e < experts; e++)
      {
        m[e] = (gint64) (w[e] / total * rows / align) * align;
        acc += m[e];
      }
    m[0] += rows - acc;
    g_free (w);
  }
  return m;
}

typedef struct {
  double ms;        /* device time per call: the median over the timed calls */
  double host_us;   /* host time per call, device idle at the start */
} Timing;

typedef gboolean (*Op) (gpointer data, guint i, GError **error);

static int
compare_doubles (gconstpointer a, gconstpointer b)
{
  double x = *(const double *) a, y = *(const double *) b;
  return x < y ? -1 : x > y;
}

/* Times n calls back to back with a pair of device events around each, as
 * the anchors (triton's do_bench, cublas_anchor) do, and takes the median. */
static gboolean
time_op (GmlpDevice *device, Op op, gpointer data, guint n, Timing *t, GError **error)
{
  g_autofree double *ms = g_new (double, n);
  GPtrArray *events = g_ptr_array_new_with_free_func (g_object_unref);
  gint64 start, host = 0;
  gboolean ok = FALSE;
  guint i;

  /* Host cost: one call at a time on an idle device. */
  for (i = 0; i < 3; i++)
    {
      if (!gmlp_device_synchronize (device, error))
        goto out;
      start = g_get_monotonic_time ();
      if (!op (data, i, error))
        goto out;
      host += g_get_monotonic_time () - start;
    }
  if (!gmlp_device_synchronize (device, error))
    goto out;

  for (i = 0; i < n; i++)
    {
      GmlpEvent *before = gmlp_event_new_recorded (device, error), *after;

      if (before == NULL)
        goto out;
      g_ptr_array_add (events, before);
      if (!op (data, 3 + i, error) || (after = gmlp_event_new_recorded (device, error)) == NULL)
        goto out;
      g_ptr_array_add (events, after);
    }
  for (i = 0; i < n; i++)
    if (!gmlp_event_elapsed_ms (events->pdata[2 * i], events->pdata[2 * i + 1], &ms[i], error))
      goto out;

  qsort (ms, n, sizeof (double), compare_doubles);
  t->ms = ms[n / 2];
  t->host_us = host / 3.0;
  ok = TRUE;

out:
  g_ptr_array_unref (events);
  return ok;
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

static gboolean
bench_shape (GmlpDevice *device, const Shape *s, gboolean skew, GError **error)
{
  gint64 rows = s->rows / divide, in = MAX (s->in / divide, 1), out = MAX (s->out / divide, 1);
  g_autofree gint64 *m = split_rows (s->experts, rows, skew);
  g_autoptr(GmlpGroupedLinear) layer = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL;
  double flops = 2.0 * rows * in * out;
  static const char *names[] = { "fprop", "dgrad", "wgrad" };
  static const Op ops[] = { op_fprop, op_dgrad, op_wgrad };
  Bench b;
  guint n_saved = (guint) iters + 3, i, k;

  layer = gmlp_grouped_linear_new_full (device, (guint) s->experts, in, out, GMLP_DTYPE_BFLOAT16,
                                        GMLP_LINEAR_SINGLE_GROUPED_WEIGHT |
                                        GMLP_LINEAR_DELAY_WGRAD_COMPUTE, error);
  if (layer == NULL)
    return FALSE;
  x = gmlp_grouped_tensor_new (device, GMLP_DTYPE_BFLOAT16, m, (guint) s->experts, in, error);
  dy = gmlp_grouped_tensor_new (device, GMLP_DTYPE_BFLOAT16, m, (guint) s->experts, out, error);
  if (x == NULL || dy == NULL ||
      !gmlp_grouped_tensor_fill_random (x, 1, 1.0, error) ||
      !gmlp_grouped_tensor_fill_random (dy, 2, 1.0, error))
    return FALSE;

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
    }
  for (i = 0; i < n_saved; i++)
    {
      g_autoptr(GmlpGroupedTensor) y = gmlp_grouped_linear_forward (layer, x, &b.saved[i], error);
      if (y == NULL)
        return FALSE;
    }

  for (k = 0; k < G_N_ELEMENTS (ops); k++)
    {
      Timing t;

      if (!time_op (device, ops[k], &b, (guint) iters, &t, error))
        return FALSE;
      g_print ("{\"bench\":\"gmlp\",\"device\":\"%s\",\"shape\":\"%s\",\"E\":%" G_GINT64_FORMAT
               ",\"M\":%" G_GINT64_FORMAT ",\"K\":%" G_GINT64_FORMAT ",\"N\":%" G_GINT64_FORMAT
               ",\"skew\":%s,\"op\":\"%s\",\"dtype\":\"bf16\",\"ms\":%.4f,\"tflops\":%.4g,\"host_us\":%.1f}\n",
               gmlp_device_get_name (device), s->name, s->experts, rows, in, out,
               skew ? "true" : "false", names[k], t.ms, flops / (t.ms * 1e-3) / 1e12, t.host_us);
    }

  for (i = 0; i < n_saved; i++)
    g_clear_object (&b.saved[i]);
  g_free (b.saved);
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

  g_option_context_add_main_entries (context, entries, NULL);
  if (!g_option_context_parse (context, &argc, &argv, &error))
    {
      g_printerr ("%s\n", error->message);
      return EXIT_FAILURE;
    }
  if (iters < 1 || divide < 1)
    {
      g_printerr ("--iters and --divide must be positive\n");
      return EXIT_FAILURE;
    }

  device = gmlp_device_get_default ();
  for (s = 0; s < G_N_ELEMENTS (shapes); s++)
    {
      if (only_shape != NULL && strcmp (only_shape, shapes[s].name) != 0)
        continue;
      any = TRUE;
      for (skew = 0; skew < 2; skew++)
        if (!bench_shape (device, &shapes[s], skew, &error))
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
  return EXIT_SUCCESS;
}
