/* test-threads.c: libgmlp objects shared by threads
 *
 * What docs/overview.md ("Threads") promises, each case started from a
 * barrier so that the threads meet in the library: an offload context
 * pushed in every thread, one input whose device sizes are made lazily,
 * one layer (forward, backward, backward_dw), one MLP, one delayed-scaling
 * quantizer and FP8 layer, one device and its events, one graph. Results
 * are held to float64 references and, bit for bit, to the same work done
 * without threads. The suite 'threads' runs it under ThreadSanitizer too.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <locale.h>
#include <math.h>
#include <string.h>

#include "gmlp-test-util.h"
#include "gmlp-grouped-tensor-private.h"

#define N_THREADS 6
#define N_GROUPS  4
#define HIDDEN    32
#define FFN       48
#define N_MICRO   3
#define MAX_ROWS  9

/* ---- Running one function on several threads at once ------------------- */

/* A start line: every thread waits until all have arrived, so that they
 * enter the library together. Atomics rather than a GMutex and GCond, which
 * ThreadSanitizer does not see (gmlp-thread-private.h says why). */
typedef struct {
  int   arrived;
  guint count;
} Barrier;

static void
barrier_wait (Barrier *barrier)
{
  g_atomic_int_inc (&barrier->arrived);
  while ((guint) g_atomic_int_get (&barrier->arrived) < barrier->count)
    g_thread_yield ();
}

typedef void (*WorkFunc) (gpointer data, guint index);

typedef struct {
  WorkFunc  func;
  gpointer  data;
  guint     index;
  Barrier  *barrier;
} Job;

static gpointer
job_run (gpointer data)
{
  Job *job = data;

  barrier_wait (job->barrier);
  job->func (job->data, job->index);
  return NULL;
}

/* func (data, 0 … n − 1), each on a thread of its own, all at once. */
static void
run_in_threads (WorkFunc func,
                gpointer data,
                guint    n)
{
  Barrier barrier = { .count = n };
  Job jobs[N_THREADS];
  GThread *threads[N_THREADS];
  guint t;

  g_assert_cmpuint (n, <=, N_THREADS);
  for (t = 0; t < n; t++)
    {
      jobs[t] = (Job) { func, data, t, &barrier };
      threads[t] = g_thread_new ("gmlp-test", job_run, &jobs[t]);
    }
  for (t = 0; t < n; t++)
    g_thread_join (threads[t]);
}

/* The same work one call after the other, on this thread. */
static void
run_serially (WorkFunc func,
              gpointer data,
              guint    n)
{
  guint t;

  for (t = 0; t < n; t++)
    func (data, t);
}

/* ---- Helpers ------------------------------------------------------------ */

static GBytes *
bytes_of (GmlpGroupedTensor *tensor)
{
  g_autoptr(GError) error = NULL;
  GBytes *bytes;

  g_assert_nonnull (tensor);
  bytes = gmlp_grouped_tensor_to_bytes (tensor, &error);
  g_assert_no_error (error);
  return bytes;
}

static void
assert_same_bytes (GBytes     *got,
                   GBytes     *want,
                   const char *what)
{
  gsize n_got, n_want, i;
  const guint8 *a = g_bytes_get_data (got, &n_got);
  const guint8 *b = g_bytes_get_data (want, &n_want);

  if (n_got != n_want)
    g_error ("%s: %" G_GSIZE_FORMAT " bytes, expected %" G_GSIZE_FORMAT, what, n_got, n_want);
  for (i = 0; i < n_got; i++)
    if (a[i] != b[i])
      g_error ("%s: byte %" G_GSIZE_FORMAT " is 0x%02x, expected 0x%02x (the work without "
               "threads)", what, i, a[i], b[i]);
}

/* FP32 values of packed bytes. */
static double *
values_of_bytes (GBytes *bytes,
                 gsize  *n)
{
  gsize size, i;
  const float *f = g_bytes_get_data (bytes, &size);
  double *values = g_new (double, MAX (size / sizeof (float), 1));

  for (i = 0; i < size / sizeof (float); i++)
    values[i] = f[i];
  *n = size / sizeof (float);
  return values;
}

static void
assert_close_bytes (GBytes       *got,
                    const double *want,
                    gsize         n,
                    const char   *what)
{
  gsize n_got;
  g_autofree double *values = values_of_bytes (got, &n_got);

  g_assert_cmpuint (n_got, ==, n);
  gmlp_test_assert_close (values, want, n, 2 * gmlp_test_tolerance (GMLP_DTYPE_FLOAT32), what);
}

static gint64
total_rows (const gint64 *rows)
{
  gint64 total = 0;
  guint g;

  for (g = 0; g < N_GROUPS; g++)
    total += rows[g];
  return total;
}

static void
count_signal (gpointer  instance,
              GmlpEvent *event,
              gpointer   counter)
{
  g_assert_true (GMLP_IS_EVENT (event));
  g_atomic_int_inc ((int *) counter);
}

static GmlpGroupedLinear *
new_linear (GmlpDevice      *device,
            GmlpLinearFlags  flags,
            guint64          seed)
{
  g_autoptr(GError) error = NULL;
  GmlpGroupedLinear *layer;

  layer = gmlp_grouped_linear_new_full (device, N_GROUPS, HIDDEN, HIDDEN, GMLP_DTYPE_FLOAT32,
                                        GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | flags, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_grouped_linear_init_parameters (layer, seed, &error));
  g_assert_no_error (error);
  return layer;
}

static GmlpGroupedMLP *
new_mlp (GmlpDevice      *device,
         GmlpLinearFlags  flags,
         guint64          seed)
{
  g_autoptr(GError) error = NULL;
  GmlpGroupedMLP *mlp;

  mlp = gmlp_grouped_mlp_new_full (device, N_GROUPS, HIDDEN, FFN, GMLP_ACTIVATION_GELU,
                                   GMLP_DTYPE_FLOAT32, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | flags,
                                   &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_grouped_mlp_init_parameters (mlp, seed, &error));
  g_assert_no_error (error);
  return mlp;
}

static double *
weights_of (GmlpGroupedTensor *tensor)
{
  return tensor != NULL ? gmlp_test_download (tensor, NULL) : NULL;
}

/* One microbatch: its sizes, x and dy of the layer (HIDDEN columns), with
 * their values. */
typedef struct {
  gint64              rows[N_GROUPS];
  GmlpGroupedTensor  *x, *dy;
  double             *xv, *dyv;
} Micro;

static void
micro_init (Micro      *micro,
            GmlpDevice *device)
{
  g_autofree gint64 *rows = gmlp_test_random_rows (N_GROUPS, MAX_ROWS);

  memcpy (micro->rows, rows, sizeof micro->rows);
  micro->x = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, micro->rows, N_GROUPS, HIDDEN,
                                      1.0, &micro->xv);
  micro->dy = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, micro->rows, N_GROUPS, HIDDEN,
                                       1.0, &micro->dyv);
}

static void
micro_clear (Micro *micro)
{
  g_clear_object (&micro->x);
  g_clear_object (&micro->dy);
  g_clear_pointer (&micro->xv, g_free);
  g_clear_pointer (&micro->dyv, g_free);
}

/* One step of a GroupedLinear or a GroupedMLP on a microbatch: forward,
 * backward and, when asked, backward_dw; y and dx as bytes. */
static void
step (gpointer      layer,
      const Micro  *micro,
      gboolean      backward_dw,
      GBytes      **y_bytes,
      GBytes      **dx_bytes)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GmlpGroupedTensor) y = NULL, dx = NULL;

  if (GMLP_IS_GROUPED_LINEAR (layer))
    {
      y = gmlp_grouped_linear_forward (layer, micro->x, &saved, &error);
      g_assert_no_error (error);
      dx = gmlp_grouped_linear_backward (layer, saved, micro->dy, &error);
      g_assert_no_error (error);
      g_assert_true (!backward_dw || gmlp_grouped_linear_backward_dw (layer, &error));
    }
  else
    {
      y = gmlp_grouped_mlp_forward (layer, micro->x, &saved, &error);
      g_assert_no_error (error);
      dx = gmlp_grouped_mlp_backward (layer, saved, micro->dy, &error);
      g_assert_no_error (error);
      g_assert_true (!backward_dw || gmlp_grouped_mlp_backward_dw (layer, &error));
    }
  g_assert_no_error (error);
  *y_bytes = bytes_of (y);
  *dx_bytes = bytes_of (dx);
}

/* The float64 step of a GroupedLinear (HIDDEN → HIDDEN) with the weights w
 * and b (NULL: no bias): y, dx, dW, db, each allocated. */
typedef struct {
  double *y, *dx, *dw, *db;
} LinearRef;

static void
linear_ref (LinearRef    *ref,
            const Micro  *micro,
            const double *w,
            const double *b)
{
  gint64 total = total_rows (micro->rows);

  ref->y = g_new0 (double, MAX (total * HIDDEN, 1));
  ref->dx = g_new0 (double, MAX (total * HIDDEN, 1));
  ref->dw = g_new0 (double, N_GROUPS * HIDDEN * HIDDEN);
  ref->db = g_new0 (double, N_GROUPS * HIDDEN);
  gmlp_test_linear_reference (micro->rows, N_GROUPS, HIDDEN, HIDDEN, micro->xv, w, b,
                              micro->dyv, micro->dyv, ref->y, ref->dx, ref->dw, ref->db);
}

static void
linear_ref_clear (LinearRef *ref)
{
  g_clear_pointer (&ref->y, g_free);
  g_clear_pointer (&ref->dx, g_free);
  g_clear_pointer (&ref->dw, g_free);
  g_clear_pointer (&ref->db, g_free);
}

/* GELU (tanh form) and its derivative by a central difference, in float64. */
static double
gelu (double x)
{
  return 0.5 * x * (1.0 + tanh (sqrt (2.0 / G_PI) * (x + 0.044715 * x * x * x)));
}

static double
gelu_grad (double x)
{
  return (gelu (x + 1e-6) - gelu (x - 1e-6)) / 2e-6;
}

/* The float64 step of a GELU GroupedMLP: y, dx, and FC1's and FC2's dW. */
typedef struct {
  double *y, *dx, *dw1, *dw2;
} MlpRef;

static void
mlp_ref (MlpRef         *ref,
         const Micro    *micro,
         GmlpGroupedMLP *mlp)
{
  GmlpGroupedLinear *fc1 = gmlp_grouped_mlp_get_fc1 (mlp), *fc2 = gmlp_grouped_mlp_get_fc2 (mlp);
  g_autofree double *w1 = weights_of (gmlp_grouped_linear_get_weight (fc1));
  g_autofree double *b1 = weights_of (gmlp_grouped_linear_get_bias (fc1));
  g_autofree double *w2 = weights_of (gmlp_grouped_linear_get_weight (fc2));
  g_autofree double *b2 = weights_of (gmlp_grouped_linear_get_bias (fc2));
  gint64 total = total_rows (micro->rows), i;
  g_autofree double *h = g_new0 (double, MAX (total * FFN, 1));
  g_autofree double *a = g_new0 (double, MAX (total * FFN, 1));
  g_autofree double *da = g_new0 (double, MAX (total * FFN, 1));

  ref->y = g_new0 (double, MAX (total * HIDDEN, 1));
  ref->dx = g_new0 (double, MAX (total * HIDDEN, 1));
  ref->dw1 = g_new0 (double, N_GROUPS * FFN * HIDDEN);
  ref->dw2 = g_new0 (double, N_GROUPS * HIDDEN * FFN);

  /* h = x W1ᵀ + b1, a = gelu (h), y = a W2ᵀ + b2; da = dy W2, dh = gelu' (h) da,
   * dx = dh W1; dW2 = dyᵀ a, dW1 = dhᵀ x. */
  gmlp_test_linear_reference (micro->rows, N_GROUPS, HIDDEN, FFN, micro->xv, w1, b1,
                              NULL, NULL, h, NULL, NULL, NULL);
  for (i = 0; i < total * FFN; i++)
    a[i] = gelu (h[i]);
  gmlp_test_linear_reference (micro->rows, N_GROUPS, FFN, HIDDEN, a, w2, b2, micro->dyv, NULL,
                              ref->y, da, ref->dw2, NULL);
  for (i = 0; i < total * FFN; i++)
    da[i] *= gelu_grad (h[i]);
  gmlp_test_linear_reference (micro->rows, N_GROUPS, HIDDEN, FFN, micro->xv, w1, NULL, da, NULL,
                              NULL, ref->dx, ref->dw1, NULL);
}

static void
mlp_ref_clear (MlpRef *ref)
{
  g_clear_pointer (&ref->y, g_free);
  g_clear_pointer (&ref->dx, g_free);
  g_clear_pointer (&ref->dw1, g_free);
  g_clear_pointer (&ref->dw2, g_free);
}

/* ---- One offload context, pushed in every thread ------------------------- */

typedef struct {
  GBytes   *y, *dx, *dw, *db;        /* the layer's */
  GBytes   *my, *mdx, *mdw1, *mdw2;  /* the MLP's */
  gboolean  offload, mlp_offload;
} MicroResult;

typedef struct {
  GmlpGroupedLinear  *linear;
  GmlpGroupedMLP     *mlp;
  MicroResult         result[N_MICRO];
} Worker;

typedef struct {
  GmlpOffloadContext *ctx;
  Micro               micro[N_THREADS][N_MICRO];
  Worker              workers[N_THREADS];
} OffloadCase;

static void
micro_result_clear (MicroResult *r)
{
  g_clear_pointer (&r->y, g_bytes_unref);
  g_clear_pointer (&r->dx, g_bytes_unref);
  g_clear_pointer (&r->dw, g_bytes_unref);
  g_clear_pointer (&r->db, g_bytes_unref);
  g_clear_pointer (&r->my, g_bytes_unref);
  g_clear_pointer (&r->mdx, g_bytes_unref);
  g_clear_pointer (&r->mdw1, g_bytes_unref);
  g_clear_pointer (&r->mdw2, g_bytes_unref);
}

/* Thread t: the microbatches forward under the shared context (enabled,
 * the second in a nested disabled entry), then backward in reverse, each
 * layer its own. */
static void
offload_work (gpointer data,
              guint    t)
{
  OffloadCase *c = data;
  Worker *w = &c->workers[t];
  GmlpGroupedTensor *y[N_MICRO], *my[N_MICRO];
  GmlpSavedActivations *saved[N_MICRO], *mlp_saved[N_MICRO];
  g_autoptr(GError) error = NULL;
  int m;

  gmlp_offload_context_push_thread_default (c->ctx, TRUE);
  for (m = 0; m < N_MICRO; m++)
    {
      if (m == 1)
        gmlp_offload_context_push_thread_default (c->ctx, FALSE);
      y[m] = gmlp_grouped_linear_forward (w->linear, c->micro[t][m].x, &saved[m], &error);
      g_assert_no_error (error);
      my[m] = gmlp_grouped_mlp_forward (w->mlp, c->micro[t][m].x, &mlp_saved[m], &error);
      g_assert_no_error (error);
      if (m == 1)
        g_assert_true (gmlp_offload_context_pop_thread_default (c->ctx, NULL));
      w->result[m].offload = gmlp_saved_activations_get_offload (saved[m]);
      w->result[m].mlp_offload = gmlp_saved_activations_get_offload (mlp_saved[m]);
      g_thread_yield ();
    }

  for (m = N_MICRO - 1; m >= 0; m--)
    {
      MicroResult *r = &w->result[m];
      g_autoptr(GmlpGroupedTensor) dx = NULL, mdx = NULL;

      dx = gmlp_grouped_linear_backward (w->linear, saved[m], c->micro[t][m].dy, &error);
      g_assert_no_error (error);
      mdx = gmlp_grouped_mlp_backward (w->mlp, mlp_saved[m], c->micro[t][m].dy, &error);
      g_assert_no_error (error);
      r->y = bytes_of (y[m]);
      r->dx = bytes_of (dx);
      r->dw = bytes_of (gmlp_grouped_linear_get_wgrad (w->linear));
      r->db = bytes_of (gmlp_grouped_linear_get_bgrad (w->linear));
      r->my = bytes_of (my[m]);
      r->mdx = bytes_of (mdx);
      r->mdw1 = bytes_of (gmlp_grouped_linear_get_wgrad (gmlp_grouped_mlp_get_fc1 (w->mlp)));
      r->mdw2 = bytes_of (gmlp_grouped_linear_get_wgrad (gmlp_grouped_mlp_get_fc2 (w->mlp)));
      g_object_unref (saved[m]);
      g_object_unref (mlp_saved[m]);
      g_object_unref (y[m]);
      g_object_unref (my[m]);
    }
  g_assert_true (gmlp_offload_context_pop_thread_default (c->ctx, NULL));
  g_assert_cmpuint (gmlp_offload_context_get_depth (), ==, 0);
}

static void
offload_case_init (OffloadCase *c,
                   GmlpDevice  *device,
                   Micro        micro[N_THREADS][N_MICRO])
{
  guint t;

  c->ctx = gmlp_offload_context_new (device, NULL);
  memcpy (c->micro, micro, sizeof c->micro);
  for (t = 0; t < N_THREADS; t++)
    {
      c->workers[t].linear = new_linear (device, GMLP_LINEAR_BIAS, 100 + t);
      c->workers[t].mlp = new_mlp (device, GMLP_LINEAR_BIAS, 200 + t);
    }
}

static void
offload_case_clear (OffloadCase *c)
{
  guint t, m;

  for (t = 0; t < N_THREADS; t++)
    {
      g_clear_object (&c->workers[t].linear);
      g_clear_object (&c->workers[t].mlp);
      for (m = 0; m < N_MICRO; m++)
        micro_result_clear (&c->workers[t].result[m]);
    }
  g_clear_object (&c->ctx);
}

/* Threads each with a layer and an MLP of their own, under one offload
 * context that every thread pushes (enabled, with a nested disabled entry):
 * what each forward was told, and results against float64 and, bit for
 * bit, against the same work done without threads. */
static void
check_offload_shared (GmlpDevice *device)
{
  Micro micro[N_THREADS][N_MICRO];
  OffloadCase threaded = { 0, }, serial = { 0, };
  guint t, m;

  for (t = 0; t < N_THREADS; t++)
    for (m = 0; m < N_MICRO; m++)
      micro_init (&micro[t][m], device);
  offload_case_init (&threaded, device, micro);
  offload_case_init (&serial, device, micro);

  run_in_threads (offload_work, &threaded, N_THREADS);
  run_serially (offload_work, &serial, N_THREADS);

  for (t = 0; t < N_THREADS; t++)
    {
      Worker *w = &threaded.workers[t];
      g_autofree double *weight = weights_of (gmlp_grouped_linear_get_weight (w->linear));
      g_autofree double *bias = weights_of (gmlp_grouped_linear_get_bias (w->linear));

      for (m = 0; m < N_MICRO; m++)
        {
          MicroResult *r = &w->result[m], *s = &serial.workers[t].result[m];
          gint64 total = total_rows (micro[t][m].rows);
          LinearRef ref = { 0, };
          MlpRef mref = { 0, };

          /* Enabled, disabled (nested), enabled again. */
          g_assert_true (r->offload == (m != 1));
          g_assert_true (r->mlp_offload == (m != 1));

          linear_ref (&ref, &micro[t][m], weight, bias);
          assert_close_bytes (r->y, ref.y, total * HIDDEN, "linear y");
          assert_close_bytes (r->dx, ref.dx, total * HIDDEN, "linear dx");
          assert_close_bytes (r->dw, ref.dw, N_GROUPS * HIDDEN * HIDDEN, "linear dW");
          assert_close_bytes (r->db, ref.db, N_GROUPS * HIDDEN, "linear db");
          mlp_ref (&mref, &micro[t][m], w->mlp);
          assert_close_bytes (r->my, mref.y, total * HIDDEN, "mlp y");
          assert_close_bytes (r->mdx, mref.dx, total * HIDDEN, "mlp dx");
          assert_close_bytes (r->mdw1, mref.dw1, N_GROUPS * FFN * HIDDEN, "mlp fc1 dW");
          assert_close_bytes (r->mdw2, mref.dw2, N_GROUPS * HIDDEN * FFN, "mlp fc2 dW");
          linear_ref_clear (&ref);
          mlp_ref_clear (&mref);

          assert_same_bytes (r->y, s->y, "linear y");
          assert_same_bytes (r->dx, s->dx, "linear dx");
          assert_same_bytes (r->dw, s->dw, "linear dW");
          assert_same_bytes (r->db, s->db, "linear db");
          assert_same_bytes (r->my, s->my, "mlp y");
          assert_same_bytes (r->mdx, s->mdx, "mlp dx");
          assert_same_bytes (r->mdw1, s->mdw1, "mlp fc1 dW");
          assert_same_bytes (r->mdw2, s->mdw2, "mlp fc2 dW");
        }
    }

  /* Every offloaded byte came back for its backward. */
  g_assert_cmpuint (gmlp_offload_context_get_bytes_offloaded (threaded.ctx), ==,
                    gmlp_offload_context_get_bytes_offloaded (serial.ctx));
  g_assert_cmpuint (gmlp_offload_context_get_bytes_offloaded (threaded.ctx), >, 0);
  g_assert_cmpuint (gmlp_offload_context_get_bytes_on_host (threaded.ctx), ==, 0);
  g_assert_cmpuint (gmlp_offload_context_get_depth (), ==, 0);

  offload_case_clear (&threaded);
  offload_case_clear (&serial);
  for (t = 0; t < N_THREADS; t++)
    for (m = 0; m < N_MICRO; m++)
      micro_clear (&micro[t][m]);
}

static void
test_offload_shared (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint round;

  if (device == NULL)
    return;

  for (round = 0; round < 4; round++)
    check_offload_shared (device);
}

/* ---- One input, its device sizes made lazily ------------------------------ */

typedef struct {
  GmlpGroupedTensor  *x;
  GmlpQuantizer      *quantizers[N_THREADS];
  GmlpGroupedTensor  *sizes[N_THREADS];
  gconstpointer       device_rows[N_THREADS];
  GBytes             *quantized[N_THREADS];
} SizesCase;

static void
sizes_work (gpointer data,
            guint    t)
{
  SizesCase *c = data;
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedTensor) q = NULL;
  GmlpBackendShape shape;

  /* Alternately the public getter and the layers' path (through a
   * quantizer, which reads the sizes on the device). */
  if (t % 2 == 0)
    {
      c->sizes[t] = gmlp_grouped_tensor_get_sizes (c->x, &error);
      g_assert_no_error (error);
      g_assert_true (gmlp_grouped_tensor_get_backend_shape (c->x, &shape, &error));
    }
  else
    {
      g_assert_true (gmlp_grouped_tensor_get_backend_shape (c->x, &shape, &error));
      c->sizes[t] = gmlp_grouped_tensor_get_sizes (c->x, &error);
    }
  g_assert_no_error (error);
  c->device_rows[t] = shape.device_rows;
  q = gmlp_quantizer_quantize (c->quantizers[t], c->x, &error);
  g_assert_no_error (error);
  c->quantized[t] = bytes_of (q);
}

/* Threads that use one input with host sizes, whose device copy of the
 * sizes is made on first use: it is made once, every thread gets that one,
 * and none leaks. */
static void
test_shared_input_sizes (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint round, t;

  if (device == NULL)
    return;

  for (round = 0; round < 24; round++)
    {
      g_autofree gint64 *rows = gmlp_test_random_rows (N_GROUPS, MAX_ROWS);
      SizesCase c = { 0, };
      g_autoptr(GBytes) want_sizes = NULL, got_sizes = NULL;
      g_autoptr(GBytes) serial_q = NULL;
      g_autoptr(GError) error = NULL;
      gconstpointer kept = NULL;
      gpointer sizes_alive;
      guint64 before, with_x;

      before = gmlp_device_get_bytes_in_use (device);
      c.x = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, rows, N_GROUPS, HIDDEN, 1.0, NULL);
      with_x = gmlp_device_get_bytes_in_use (device);
      for (t = 0; t < N_THREADS; t++)
        c.quantizers[t] = gmlp_quantizer_new (device, GMLP_SCALING_RECIPE_CURRENT,
                                              GMLP_FP8_FORMAT_E4M3, GMLP_QUANTIZER_ROLE_INPUT);

      run_in_threads (sizes_work, &c, N_THREADS);

      /* The layers' path takes the device's kept copy of these sizes. */
      g_assert_true (gmlp_device_get_uploaded_sizes (device, rows, N_GROUPS, &kept, &error));
      g_assert_no_error (error);
      g_assert_nonnull (kept);
      for (t = 0; t < N_THREADS; t++)
        {
          g_assert_true (c.sizes[t] == c.sizes[0]);
          g_assert_true (c.device_rows[t] == kept);
        }
      g_assert_true (gmlp_grouped_tensor_get_sizes (c.x, NULL) == c.sizes[0]);
      /* One sizes tensor more, no other allocation left behind. */
      g_assert_cmpuint (gmlp_device_get_bytes_in_use (device), ==,
                        with_x + gmlp_grouped_tensor_get_nbytes (c.sizes[0]));
      want_sizes = g_bytes_new (rows, sizeof (gint64) * N_GROUPS);
      got_sizes = bytes_of (c.sizes[0]);
      assert_same_bytes (got_sizes, want_sizes, "device sizes");

      /* The same quantization without threads. */
      {
        g_autoptr(GmlpQuantizer) quantizer = gmlp_quantizer_new (device, GMLP_SCALING_RECIPE_CURRENT,
                                                                 GMLP_FP8_FORMAT_E4M3,
                                                                 GMLP_QUANTIZER_ROLE_INPUT);
        g_autoptr(GmlpGroupedTensor) q = gmlp_quantizer_quantize (quantizer, c.x, NULL);

        serial_q = bytes_of (q);
      }
      for (t = 0; t < N_THREADS; t++)
        assert_same_bytes (c.quantized[t], serial_q, "quantized shared input");

      /* The sizes go with the tensor. */
      sizes_alive = c.sizes[0];
      g_object_add_weak_pointer (G_OBJECT (c.sizes[0]), &sizes_alive);
      g_clear_object (&c.x);
      g_assert_null (sizes_alive);
      g_assert_cmpuint (gmlp_device_get_bytes_in_use (device), ==, before);

      for (t = 0; t < N_THREADS; t++)
        {
          g_clear_object (&c.quantizers[t]);
          g_clear_pointer (&c.quantized[t], g_bytes_unref);
        }
    }
}

/* ---- One layer, used by every thread -------------------------------------- */

typedef struct {
  GmlpGroupedLinear  *layer;
  Micro               micro[N_THREADS];
  GBytes             *y[N_THREADS], *dx[N_THREADS], *dw[N_THREADS];
  gboolean            backward_dw;
} SharedLayerCase;

static void
shared_layer_work (gpointer data,
                   guint    t)
{
  SharedLayerCase *c = data;

  step (c->layer, &c->micro[t], c->backward_dw, &c->y[t], &c->dx[t]);
}

/* The same work without threads, on a copy of the layer (same seed), each
 * thread's dW read after its backward. */
static void
shared_layer_serial (SharedLayerCase *c,
                     GmlpDevice      *device,
                     GmlpLinearFlags  flags,
                     guint64          seed)
{
  SharedLayerCase s = { 0, };
  guint t;

  s.layer = new_linear (device, flags, seed);
  memcpy (s.micro, c->micro, sizeof s.micro);
  s.backward_dw = c->backward_dw;
  for (t = 0; t < N_THREADS; t++)
    {
      shared_layer_work (&s, t);
      assert_same_bytes (c->y[t], s.y[t], "y of a shared layer");
      assert_same_bytes (c->dx[t], s.dx[t], "dx of a shared layer");
      if (!(flags & GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION))
        c->dw[t] = bytes_of (gmlp_grouped_linear_get_wgrad (s.layer));
      g_clear_pointer (&s.y[t], g_bytes_unref);
      g_clear_pointer (&s.dx[t], g_bytes_unref);
    }
  g_clear_object (&s.layer);
}

/* Threads running forward and backward (and backward_dw) of one layer at
 * once, each on its own microbatch: forwards share the weights, and the
 * layer runs the weight-gradient computations one at a time, so that
 * main_grad receives every dW, wgrad holds one backward's dW (whichever
 * ran last), wgrad-ready is emitted once per computation and nothing stays
 * pending. */
static void
check_shared_layer (GmlpDevice      *device,
                    GmlpLinearFlags  flags)
{
  gboolean fused = (flags & GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION) != 0;
  SharedLayerCase c = { 0, };
  g_autofree double *w = NULL, *sum = g_new0 (double, N_GROUPS * HIDDEN * HIDDEN);
  int ready = 0;
  guint t, i;

  c.layer = new_linear (device, flags, 7);
  c.backward_dw = (flags & GMLP_LINEAR_DELAY_WGRAD_COMPUTE) != 0;
  g_signal_connect (c.layer, "wgrad-ready", G_CALLBACK (count_signal), &ready);
  for (t = 0; t < N_THREADS; t++)
    micro_init (&c.micro[t], device);
  w = weights_of (gmlp_grouped_linear_get_weight (c.layer));

  run_in_threads (shared_layer_work, &c, N_THREADS);

  g_assert_cmpint (ready, ==, N_THREADS);
  g_assert_cmpuint (gmlp_grouped_linear_get_pending_wgrads (c.layer), ==, 0);
  for (t = 0; t < N_THREADS; t++)
    {
      LinearRef ref = { 0, };
      gint64 total = total_rows (c.micro[t].rows);

      linear_ref (&ref, &c.micro[t], w, NULL);
      assert_close_bytes (c.y[t], ref.y, total * HIDDEN, "y of a shared layer");
      assert_close_bytes (c.dx[t], ref.dx, total * HIDDEN, "dx of a shared layer");
      for (i = 0; i < N_GROUPS * HIDDEN * HIDDEN; i++)
        sum[i] += ref.dw[i];
      linear_ref_clear (&ref);
    }

  shared_layer_serial (&c, device, flags, 7);

  if (fused)
    {
      g_autoptr(GBytes) main_grad = bytes_of (gmlp_grouped_linear_get_main_grad (c.layer));

      g_assert_null (gmlp_grouped_linear_get_wgrad (c.layer));
      assert_close_bytes (main_grad, sum, N_GROUPS * HIDDEN * HIDDEN, "main_grad of a shared layer");
    }
  else
    {
      /* Exactly one thread's dW, not a mixture. */
      g_autoptr(GBytes) wgrad = bytes_of (gmlp_grouped_linear_get_wgrad (c.layer));
      gboolean found = FALSE;

      for (t = 0; t < N_THREADS; t++)
        found |= g_bytes_equal (wgrad, c.dw[t]);
      g_assert_true (found);
    }

  for (t = 0; t < N_THREADS; t++)
    {
      micro_clear (&c.micro[t]);
      g_clear_pointer (&c.y[t], g_bytes_unref);
      g_clear_pointer (&c.dx[t], g_bytes_unref);
      g_clear_pointer (&c.dw[t], g_bytes_unref);
    }
  g_clear_object (&c.layer);
}

static void
test_shared_layer (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();

  if (device == NULL)
    return;

  check_shared_layer (device, GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION);
  check_shared_layer (device, GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION | GMLP_LINEAR_DELAY_WGRAD_COMPUTE);
  check_shared_layer (device, 0);
  check_shared_layer (device, GMLP_LINEAR_DELAY_WGRAD_COMPUTE);
}

typedef struct {
  GmlpGroupedLinear    *layer;
  GmlpSavedActivations *saved;
  GmlpGroupedTensor    *dy;
  int                   succeeded;
  int                   refused;
} SavedOnceCase;

static void
saved_once_work (gpointer data,
                 guint    t)
{
  SavedOnceCase *c = data;
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedTensor) dx = gmlp_grouped_linear_backward (c->layer, c->saved, c->dy, &error);

  if (dx != NULL)
    {
      g_assert_no_error (error);
      g_atomic_int_inc (&c->succeeded);
    }
  else
    {
      g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
      g_atomic_int_inc (&c->refused);
    }
}

/* Threads racing to use the same saved activations: one backward uses
 * them, the others are refused. */
static void
test_saved_once (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpOffloadContext) ctx = NULL;
  guint round;

  if (device == NULL)
    return;

  ctx = gmlp_offload_context_new (device, NULL);
  for (round = 0; round < 8; round++)
    {
      SavedOnceCase c = { 0, };
      g_autoptr(GmlpGroupedTensor) y = NULL;
      g_autoptr(GError) error = NULL;
      Micro micro = { { 0, }, };

      micro_init (&micro, device);
      c.layer = new_linear (device, GMLP_LINEAR_BIAS, round);
      c.dy = micro.dy;
      /* Every other round offloaded. */
      gmlp_offload_context_push_thread_default (ctx, round % 2 == 0);
      y = gmlp_grouped_linear_forward (c.layer, micro.x, &c.saved, &error);
      g_assert_no_error (error);
      g_assert_true (gmlp_offload_context_pop_thread_default (ctx, NULL));

      run_in_threads (saved_once_work, &c, N_THREADS);

      g_assert_cmpint (c.succeeded, ==, 1);
      g_assert_cmpint (c.refused, ==, N_THREADS - 1);
      g_assert_true (gmlp_saved_activations_is_consumed (c.saved));
      g_clear_object (&c.saved);
      g_clear_object (&c.layer);
      micro_clear (&micro);
    }
  g_assert_cmpuint (gmlp_offload_context_get_bytes_on_host (ctx), ==, 0);
}

/* ---- One MLP, used by every thread ---------------------------------------- */

typedef struct {
  GmlpGroupedMLP     *mlp;
  gboolean            backward_dw;
  gboolean            serial;
  Micro               micro[N_THREADS];
  GBytes             *y[N_THREADS], *dx[N_THREADS];
  /* Without threads: FC1's and FC2's dW after each step. */
  GBytes             *dw1[N_THREADS], *dw2[N_THREADS];
} SharedMlpCase;

static void
shared_mlp_work (gpointer data,
                 guint    t)
{
  SharedMlpCase *c = data;

  step (c->mlp, &c->micro[t], c->backward_dw, &c->y[t], &c->dx[t]);
  if (c->serial && gmlp_grouped_linear_get_wgrad (gmlp_grouped_mlp_get_fc1 (c->mlp)) != NULL)
    {
      c->dw1[t] = bytes_of (gmlp_grouped_linear_get_wgrad (gmlp_grouped_mlp_get_fc1 (c->mlp)));
      c->dw2[t] = bytes_of (gmlp_grouped_linear_get_wgrad (gmlp_grouped_mlp_get_fc2 (c->mlp)));
    }
}

/* Threads running forward and backward (and backward_dw) of one MLP at
 * once: the MLP runs the weight-gradient computations of its two layers
 * one block at a time, so that every FC1 and FC2 dW lands in main_grad,
 * the wgrad tensors hold FC1's and FC2's dW of one and the same step, and
 * wgrad-ready is emitted once per step. */
static void
check_shared_mlp (GmlpDevice      *device,
                  GmlpLinearFlags  flags)
{
  gboolean fused = (flags & GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION) != 0;
  SharedMlpCase c = { 0, }, s = { 0, };
  g_autofree double *sum1 = g_new0 (double, N_GROUPS * FFN * HIDDEN);
  g_autofree double *sum2 = g_new0 (double, N_GROUPS * HIDDEN * FFN);
  int ready = 0;
  guint t, i;

  c.mlp = new_mlp (device, GMLP_LINEAR_BIAS | flags, 11);
  s.mlp = new_mlp (device, GMLP_LINEAR_BIAS | flags, 11);
  c.backward_dw = s.backward_dw = (flags & GMLP_LINEAR_DELAY_WGRAD_COMPUTE) != 0;
  s.serial = TRUE;
  g_signal_connect (c.mlp, "wgrad-ready", G_CALLBACK (count_signal), &ready);
  for (t = 0; t < N_THREADS; t++)
    micro_init (&c.micro[t], device);
  memcpy (s.micro, c.micro, sizeof s.micro);

  run_in_threads (shared_mlp_work, &c, N_THREADS);
  run_serially (shared_mlp_work, &s, N_THREADS);

  g_assert_cmpint (ready, ==, N_THREADS);
  for (t = 0; t < N_THREADS; t++)
    {
      MlpRef ref = { 0, };
      gint64 total = total_rows (c.micro[t].rows);

      mlp_ref (&ref, &c.micro[t], c.mlp);
      assert_close_bytes (c.y[t], ref.y, total * HIDDEN, "y of a shared MLP");
      assert_close_bytes (c.dx[t], ref.dx, total * HIDDEN, "dx of a shared MLP");
      assert_same_bytes (c.y[t], s.y[t], "y of a shared MLP");
      assert_same_bytes (c.dx[t], s.dx[t], "dx of a shared MLP");
      for (i = 0; i < N_GROUPS * FFN * HIDDEN; i++)
        {
          sum1[i] += ref.dw1[i];
          sum2[i] += ref.dw2[i];
        }
      mlp_ref_clear (&ref);
    }
  if (fused)
    {
      g_autoptr(GBytes) main_grad1 = NULL, main_grad2 = NULL;

      main_grad1 = bytes_of (gmlp_grouped_linear_get_main_grad (gmlp_grouped_mlp_get_fc1 (c.mlp)));
      main_grad2 = bytes_of (gmlp_grouped_linear_get_main_grad (gmlp_grouped_mlp_get_fc2 (c.mlp)));
      assert_close_bytes (main_grad1, sum1, N_GROUPS * FFN * HIDDEN, "FC1 main_grad of a shared MLP");
      assert_close_bytes (main_grad2, sum2, N_GROUPS * HIDDEN * FFN, "FC2 main_grad of a shared MLP");
    }
  else
    {
      /* FC1's and FC2's dW of one thread's step, not of two. */
      g_autoptr(GBytes) dw1 = NULL, dw2 = NULL;
      gboolean found = FALSE;

      dw1 = bytes_of (gmlp_grouped_linear_get_wgrad (gmlp_grouped_mlp_get_fc1 (c.mlp)));
      dw2 = bytes_of (gmlp_grouped_linear_get_wgrad (gmlp_grouped_mlp_get_fc2 (c.mlp)));
      for (t = 0; t < N_THREADS; t++)
        found |= g_bytes_equal (dw1, s.dw1[t]) && g_bytes_equal (dw2, s.dw2[t]);
      g_assert_true (found);
    }

  for (t = 0; t < N_THREADS; t++)
    {
      micro_clear (&c.micro[t]);
      g_clear_pointer (&c.y[t], g_bytes_unref);
      g_clear_pointer (&c.dx[t], g_bytes_unref);
      g_clear_pointer (&s.y[t], g_bytes_unref);
      g_clear_pointer (&s.dx[t], g_bytes_unref);
      g_clear_pointer (&s.dw1[t], g_bytes_unref);
      g_clear_pointer (&s.dw2[t], g_bytes_unref);
    }
  g_clear_object (&c.mlp);
  g_clear_object (&s.mlp);
}

static void
test_shared_mlp (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint round;

  if (device == NULL)
    return;

  for (round = 0; round < 3; round++)
    {
      check_shared_mlp (device, GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION);
      check_shared_mlp (device, 0);
      check_shared_mlp (device, GMLP_LINEAR_DELAY_WGRAD_COMPUTE);
    }
}

/* ---- Delayed scaling: one quantizer, one FP8 layer and MLP ---------------- */

typedef struct {
  GmlpQuantizer      *quantizer;
  GmlpGroupedTensor  *x[N_THREADS];
  GBytes             *q[N_THREADS][2];
} QuantizerCase;

static void
quantizer_work (gpointer data,
                guint    t)
{
  QuantizerCase *c = data;
  guint i;

  for (i = 0; i < 2; i++)
    {
      g_autoptr(GError) error = NULL;
      g_autoptr(GmlpGroupedTensor) q = gmlp_quantizer_quantize (c->quantizer, c->x[t], &error);

      g_assert_no_error (error);
      c->q[t][i] = bytes_of (q);
    }
}

static void
assert_same_state (GmlpQuantizer *got,
                   GmlpQuantizer *want,
                   const char    *what)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GVariant) a = gmlp_quantizer_save_state (got, &error);
  g_autoptr(GVariant) b = NULL;

  g_assert_no_error (error);
  b = gmlp_quantizer_save_state (want, &error);
  g_assert_no_error (error);
  if (!g_variant_equal (a, b))
    {
      g_autofree char *sa = g_variant_print (a, FALSE), *sb = g_variant_print (b, FALSE);
      g_error ("%s: state %.600s, expected %.600s (the work without threads)", what, sa, sb);
    }
}

/* Threads quantizing with one delayed-scaling quantizer: each records its
 * amaxes into the one state, which the update then turns into the same
 * scales as the same calls without threads; quantized bytes agree too. */
static void
test_shared_quantizer (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  QuantizerCase c = { 0, }, s = { 0, };
  guint step, t, i;

  if (device == NULL)
    return;

  c.quantizer = gmlp_quantizer_new (device, GMLP_SCALING_RECIPE_DELAYED, GMLP_FP8_FORMAT_E4M3,
                                    GMLP_QUANTIZER_ROLE_INPUT);
  s.quantizer = gmlp_quantizer_new (device, GMLP_SCALING_RECIPE_DELAYED, GMLP_FP8_FORMAT_E4M3,
                                    GMLP_QUANTIZER_ROLE_INPUT);
  for (step = 0; step < 3; step++)
    {
      for (t = 0; t < N_THREADS; t++)
        {
          g_autofree gint64 *rows = gmlp_test_random_rows (N_GROUPS, MAX_ROWS);

          /* Different ranges, so that the amax of the step is one thread's. */
          c.x[t] = s.x[t] = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, rows, N_GROUPS,
                                                     HIDDEN, 0.5 + t, NULL);
        }
      run_in_threads (quantizer_work, &c, N_THREADS);
      run_serially (quantizer_work, &s, N_THREADS);
      g_assert_true (gmlp_quantizer_update (c.quantizer, NULL));
      g_assert_true (gmlp_quantizer_update (s.quantizer, NULL));
      assert_same_state (c.quantizer, s.quantizer, "shared delayed-scaling quantizer");
      for (t = 0; t < N_THREADS; t++)
        {
          for (i = 0; i < 2; i++)
            {
              assert_same_bytes (c.q[t][i], s.q[t][i], "quantized by a shared quantizer");
              g_clear_pointer (&c.q[t][i], g_bytes_unref);
              g_clear_pointer (&s.q[t][i], g_bytes_unref);
            }
          g_clear_object (&c.x[t]);
          s.x[t] = NULL;
        }
    }
  g_clear_object (&c.quantizer);
  g_clear_object (&s.quantizer);
}

typedef struct {
  GmlpGroupedLinear  *layer;
  GmlpGroupedMLP     *mlp;
  Micro               micro[N_THREADS];
  GBytes             *y[N_THREADS], *dx[N_THREADS], *my[N_THREADS], *mdx[N_THREADS];
} Fp8Case;

static void
fp8_work (gpointer data,
          guint    t)
{
  Fp8Case *c = data;

  step (c->layer, &c->micro[t], FALSE, &c->y[t], &c->dx[t]);
  step (c->mlp, &c->micro[t], FALSE, &c->my[t], &c->mdx[t]);
}

static void
fp8_case_init (Fp8Case    *c,
               GmlpDevice *device)
{
  g_autoptr(GError) error = NULL;
  GmlpQuantizer *q[3];
  guint r;

  c->layer = new_linear (device, GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION, 21);
  for (r = 0; r < 3; r++)
    q[r] = gmlp_quantizer_new (device, GMLP_SCALING_RECIPE_DELAYED, GMLP_FP8_FORMAT_HYBRID,
                               (GmlpQuantizerRole) r);
  g_assert_true (gmlp_grouped_linear_set_quantizers (c->layer, q[GMLP_QUANTIZER_ROLE_INPUT],
                                                     q[GMLP_QUANTIZER_ROLE_WEIGHT],
                                                     q[GMLP_QUANTIZER_ROLE_GRAD_OUTPUT], &error));
  g_assert_no_error (error);
  for (r = 0; r < 3; r++)
    g_object_unref (q[r]);
  gmlp_grouped_linear_set_cache_fp8_weights (c->layer, TRUE);

  c->mlp = new_mlp (device, GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION, 22);
  g_assert_true (gmlp_grouped_mlp_set_fp8_recipe (c->mlp, GMLP_SCALING_RECIPE_DELAYED,
                                                  GMLP_FP8_FORMAT_HYBRID, &error));
  g_assert_no_error (error);
  gmlp_grouped_mlp_set_cache_fp8_weights (c->mlp, TRUE);
}

static void
fp8_case_clear (Fp8Case *c)
{
  guint t;

  for (t = 0; t < N_THREADS; t++)
    {
      g_clear_pointer (&c->y[t], g_bytes_unref);
      g_clear_pointer (&c->dx[t], g_bytes_unref);
      g_clear_pointer (&c->my[t], g_bytes_unref);
      g_clear_pointer (&c->mdx[t], g_bytes_unref);
    }
}

/* Threads running FP8 steps of one layer and one MLP with delayed-scaling
 * quantizers and cached FP8 weights: the outputs and, after the update,
 * every quantizer's state are those of the same steps without threads. */
static void
test_shared_fp8 (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  Fp8Case c = { 0, }, s = { 0, };
  guint step, t, r;

  if (device == NULL)
    return;

  fp8_case_init (&c, device);
  fp8_case_init (&s, device);
  for (step = 0; step < 2; step++)
    {
      for (t = 0; t < N_THREADS; t++)
        micro_init (&c.micro[t], device);
      memcpy (s.micro, c.micro, sizeof s.micro);

      run_in_threads (fp8_work, &c, N_THREADS);
      run_serially (fp8_work, &s, N_THREADS);

      for (t = 0; t < N_THREADS; t++)
        {
          assert_same_bytes (c.y[t], s.y[t], "FP8 y of a shared layer");
          assert_same_bytes (c.dx[t], s.dx[t], "FP8 dx of a shared layer");
          assert_same_bytes (c.my[t], s.my[t], "FP8 y of a shared MLP");
          assert_same_bytes (c.mdx[t], s.mdx[t], "FP8 dx of a shared MLP");
        }
      g_assert_true (gmlp_grouped_linear_update_quantizers (c.layer, NULL));
      g_assert_true (gmlp_grouped_linear_update_quantizers (s.layer, NULL));
      g_assert_true (gmlp_grouped_mlp_update_quantizers (c.mlp, NULL));
      g_assert_true (gmlp_grouped_mlp_update_quantizers (s.mlp, NULL));
      for (r = 0; r < 3; r++)
        {
          assert_same_state (gmlp_grouped_linear_get_quantizer (c.layer, r),
                             gmlp_grouped_linear_get_quantizer (s.layer, r), "FP8 layer's quantizer");
          assert_same_state (gmlp_grouped_linear_get_quantizer (gmlp_grouped_mlp_get_fc1 (c.mlp), r),
                             gmlp_grouped_linear_get_quantizer (gmlp_grouped_mlp_get_fc1 (s.mlp), r),
                             "FP8 MLP's FC1 quantizer");
          assert_same_state (gmlp_grouped_linear_get_quantizer (gmlp_grouped_mlp_get_fc2 (c.mlp), r),
                             gmlp_grouped_linear_get_quantizer (gmlp_grouped_mlp_get_fc2 (s.mlp), r),
                             "FP8 MLP's FC2 quantizer");
        }
      /* A new step quantizes the weights again. */
      gmlp_grouped_linear_invalidate_fp8_weights (c.layer);
      gmlp_grouped_linear_invalidate_fp8_weights (s.layer);
      fp8_case_clear (&c);
      fp8_case_clear (&s);
      for (t = 0; t < N_THREADS; t++)
        micro_clear (&c.micro[t]);
    }
  g_clear_object (&c.layer);
  g_clear_object (&s.layer);
  g_clear_object (&c.mlp);
  g_clear_object (&s.mlp);
}

/* ---- One device and its events -------------------------------------------- */

typedef struct {
  GmlpDevice  *device;
  GmlpEvent   *event;
  GmlpDevice  *got[N_THREADS];
} DeviceCase;

static void
device_work (gpointer data,
             guint    t)
{
  DeviceCase *c = data;
  g_autoptr(GError) error = NULL;
  guint i;

  c->got[t] = gmlp_device_new (gmlp_device_get_kind (c->device), gmlp_device_get_ordinal (c->device),
                               &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_event_synchronize (c->event, &error));
  g_assert_no_error (error);
  g_assert_true (gmlp_event_wait_on_device (c->event, c->device, &error));
  g_assert_no_error (error);
  for (i = 0; i < 20; i++)
    {
      gint64 rows[N_GROUPS] = { 3, 0, 5, 1 };
      g_autoptr(GmlpGroupedTensor) x = gmlp_grouped_tensor_new (c->device, GMLP_DTYPE_FLOAT32, rows,
                                                                N_GROUPS, HIDDEN, &error);
      g_autoptr(GmlpEvent) event = NULL;

      g_assert_no_error (error);
      g_assert_true (gmlp_grouped_tensor_fill_zero (x, &error));
      g_assert_cmpfloat (gmlp_grouped_tensor_sum_squares (x, &error), ==, 0.0);
      g_assert_no_error (error);
      event = gmlp_event_new_recorded (c->device, &error);
      g_assert_no_error (error);
      g_assert_true (gmlp_event_synchronize (event, &error));
      g_assert_true (gmlp_event_is_complete (event));
      g_assert_true (gmlp_event_is_complete (c->event));
    }
}

/* Threads opening the same device (one object), allocating from its pool
 * and waiting for one event at once: nothing is left allocated. */
static void
test_shared_device (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GError) error = NULL;
  DeviceCase c = { 0, };
  guint64 before;
  guint t;

  if (device == NULL)
    return;

  c.device = device;
  c.event = gmlp_event_new_recorded (device, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_device_synchronize (device, &error));
  before = gmlp_device_get_bytes_in_use (device);

  run_in_threads (device_work, &c, N_THREADS);

  g_assert_true (gmlp_device_synchronize (device, &error));
  g_assert_no_error (error);
  for (t = 0; t < N_THREADS; t++)
    {
      g_assert_true (c.got[t] == device);
      g_clear_object (&c.got[t]);
    }
  g_assert_cmpuint (gmlp_device_get_bytes_in_use (device), ==, before);
  g_clear_object (&c.event);
}

/* ---- One graph, replayed by every thread (a GPU) ------------------------- */

typedef struct {
  GmlpGraph *graph;
} GraphCase;

static void
graph_work (gpointer data,
            guint    t)
{
  GraphCase *c = data;
  guint i;

  for (i = 0; i < 4; i++)
    {
      g_autoptr(GError) error = NULL;

      g_assert_true (gmlp_graph_replay (c->graph, &error));
      g_assert_no_error (error);
    }
}

/* Threads replaying one graph at once: replays run one after the other,
 * and each recomputes the captured forward from the same input. */
static void
test_shared_graph (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpGroupedLinear) layer = NULL;
  g_autoptr(GmlpGroupedTensor) y = NULL, want = NULL;
  g_autoptr(GBytes) got_bytes = NULL, want_bytes = NULL;
  g_autoptr(GError) error = NULL;
  GraphCase c = { 0, };
  Micro micro = { { 0, }, };

  if (device == NULL)
    return;
  if (gmlp_device_get_kind (device) == GMLP_DEVICE_KIND_CPU)
    {
      g_test_skip ("graphs need a GPU");
      return;
    }

  layer = new_linear (device, GMLP_LINEAR_BIAS, 31);
  micro_init (&micro, device);
  want = gmlp_grouped_linear_forward (layer, micro.x, NULL, &error);
  g_assert_no_error (error);

  g_assert_true (gmlp_device_begin_capture (device, &error));
  g_assert_no_error (error);
  y = gmlp_grouped_linear_forward (layer, micro.x, NULL, &error);
  g_assert_no_error (error);
  c.graph = gmlp_device_end_capture (device, &error);
  g_assert_no_error (error);

  run_in_threads (graph_work, &c, N_THREADS);

  got_bytes = bytes_of (y);
  want_bytes = bytes_of (want);
  assert_same_bytes (got_bytes, want_bytes, "y of a graph replayed by threads");
  g_clear_object (&c.graph);
  micro_clear (&micro);
}

int
main (int   argc,
      char *argv[])
{
  setlocale (LC_ALL, "");
  g_test_init (&argc, &argv, NULL);
  gmlp_test_prepare_threads ();

  g_test_add_func ("/Gmlp/Threads/offload-shared", test_offload_shared);
  g_test_add_func ("/Gmlp/Threads/shared-input-sizes", test_shared_input_sizes);
  g_test_add_func ("/Gmlp/Threads/shared-layer", test_shared_layer);
  g_test_add_func ("/Gmlp/Threads/saved-once", test_saved_once);
  g_test_add_func ("/Gmlp/Threads/shared-mlp", test_shared_mlp);
  g_test_add_func ("/Gmlp/Threads/shared-quantizer", test_shared_quantizer);
  g_test_add_func ("/Gmlp/Threads/shared-fp8", test_shared_fp8);
  g_test_add_func ("/Gmlp/Threads/shared-device", test_shared_device);
  g_test_add_func ("/Gmlp/Threads/shared-graph", test_shared_graph);

  return g_test_run ();
}
