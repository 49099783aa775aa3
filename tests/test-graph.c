/* test-graph.c: capturing a device's stream into a GmlpGraph and replaying it
 *
 * On the CPU only the refusals run (graphs need a GPU); the GPU suite
 * captures tensor arithmetic, replays it with new inputs and new device
 * group sizes, and checks every result against float64 references.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <locale.h>
#include <math.h>
#include <string.h>

#include "gmlp-test-util.h"
#include "gmlp-grouped-tensor-private.h"

/* The device of the suite when it can capture; NULL after g_test_skip()
 * otherwise. */
static GmlpDevice *
capture_device_or_skip (void)
{
  GmlpDevice *device = gmlp_test_device_or_skip ();

  if (device != NULL && gmlp_device_get_kind (device) == GMLP_DEVICE_KIND_CPU)
    {
      g_test_skip ("graphs need a GPU");
      g_clear_object (&device);
    }
  return device;
}

static double
tolerance (GmlpDType dtype)
{
  return dtype == GMLP_DTYPE_FLOAT32 ? 1e-6 : dtype == GMLP_DTYPE_FLOAT16 ? 2e-3 : 1e-2;
}

static void
assert_values (GmlpGroupedTensor *tensor,
               const double      *want,
               gsize              count,
               const char        *what)
{
  gsize n = 0;
  g_autofree double *got = gmlp_test_download (tensor, &n);

  g_assert_cmpuint (n, ==, count);
  gmlp_test_assert_close (got, want, count, tolerance (gmlp_grouped_tensor_get_dtype (tensor)), what);
}

/* Writes values (packed, host layout of rows) into tensor's storage outside
 * any capture, in stream order, as new inputs between replays: through a
 * staging tensor of the same layout and one device copy. */
static void
write_values (GmlpGroupedTensor *tensor,
              const gint64      *rows,
              guint              n_groups,
              GBytes            *bytes)
{
  GmlpDevice *device = gmlp_grouped_tensor_get_device (tensor);
  GmlpDType dtype = gmlp_grouped_tensor_get_dtype (tensor);
  gint64 cols = gmlp_grouped_tensor_get_cols (tensor);
  g_autoptr(GmlpGroupedTensor) staged = NULL;
  g_autoptr(GError) error = NULL;

  staged = gmlp_grouped_tensor_new_from_bytes (device, dtype, rows, n_groups, cols, bytes, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (gmlp_grouped_tensor_get_nbytes (staged), <=, gmlp_grouped_tensor_get_nbytes (tensor));
  g_assert_true (GMLP_DEVICE_CALL (device, copy, gmlp_grouped_tensor_get_data (tensor),
                                   gmlp_grouped_tensor_get_data (staged),
                                   gmlp_grouped_tensor_get_nbytes (staged), &error));
  g_assert_no_error (error);
}

/* Fresh random values for a tensor of these sizes: the bytes, and *values
 * decoded. */
static GBytes *
random_values (GmlpDType      dtype,
               gsize          count,
               double         scale,
               double       **values)
{
  GBytes *bytes = gmlp_test_random_bytes (dtype, count, scale, FALSE);
  gsize i;

  *values = g_new (double, MAX (count, 1));
  for (i = 0; i < count; i++)
    (*values)[i] = gmlp_test_decode (g_bytes_get_data (bytes, NULL), dtype, i);
  return bytes;
}

static gint64
sum_rows (const gint64 *rows,
          guint         n)
{
  gint64 total = 0;
  guint g;

  for (g = 0; g < n; g++)
    total += rows[g];
  return total;
}

/* What run_replay()'s graph does, in float64 with the roundings of each
 * stored result (FP32 arithmetic, as the kernels do). */
typedef struct {
  double  alpha, beta, gamma;
  gsize   count;
  double *x, *y, *acc, *tmp, *c;   /* inputs and state */
  double *a, *b;                   /* results of the last replay */
} ReplayModel;

static void
replay_model_step (ReplayModel *m)
{
  gsize i;

  for (i = 0; i < m->count; i++)
    {
      float a = (float) gmlp_test_round (m->x[i], GMLP_DTYPE_BFLOAT16);

      m->a[i] = gmlp_test_round ((float) m->alpha * (float) m->y[i] + a, GMLP_DTYPE_BFLOAT16);
      m->y[i] = gmlp_test_round ((float) m->beta * (float) m->y[i], GMLP_DTYPE_BFLOAT16);
      m->b[i] = (float) ((float) m->gamma * (float) m->tmp[i] + (float) m->a[i]);
      m->b[i] = (float) ((float) m->c[i] + (float) m->b[i]);
      m->acc[i] = (float) ((float) m->b[i] + (float) m->acc[i]);
    }
}

static void
replay_model_clear (ReplayModel *m)
{
  g_free (m->x);
  g_free (m->y);
  g_free (m->acc);
  g_free (m->tmp);
  g_free (m->c);
  g_free (m->a);
  g_free (m->b);
}

G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (ReplayModel, replay_model_clear)

/* The CPU runs work as it is enqueued: nothing to capture, and the misuse
 * errors come before anything else. */
static void
test_cpu (void)
{
  g_autoptr(GmlpDevice) cpu = gmlp_device_new (GMLP_DEVICE_KIND_CPU, 0, NULL);
  g_autoptr(GmlpGraph) graph = NULL;
  g_autoptr(GError) error = NULL;

  g_assert_false (gmlp_device_is_capturing (cpu));
  g_assert_false (gmlp_device_begin_capture (cpu, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED);
  g_clear_error (&error);
  g_assert_false (gmlp_device_is_capturing (cpu));

  graph = gmlp_device_end_capture (cpu, &error);
  g_assert_null (graph);
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
  g_clear_error (&error);

  /* Nothing was left half-done. */
  g_assert_true (gmlp_device_synchronize (cpu, &error));
  g_assert_no_error (error);
}

/* Misuse on a device that can capture: nested begins, an end without a
 * begin, a replay inside a capture. Each is refused and leaves the capture
 * (or its absence) as it was. */
static void
test_misuse (void)
{
  g_autoptr(GmlpDevice) device = capture_device_or_skip ();
  g_autoptr(GmlpGraph) graph = NULL;
  g_autoptr(GmlpGraph) graph2 = NULL;
  g_autoptr(GmlpGraph) none = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL;
  g_autoptr(GError) error = NULL;
  g_autofree double *xv = NULL, *want = NULL;
  gint64 rows[] = { 4, 0, 3 };
  gsize count = 7 * 5, i;

  if (device == NULL)
    return;

  none = gmlp_device_end_capture (device, &error);
  g_assert_null (none);
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
  g_clear_error (&error);

  x = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, rows, 3, 5, 1.0, &xv);
  g_assert_true (gmlp_device_begin_capture (device, &error));
  g_assert_no_error (error);
  g_assert_true (gmlp_device_is_capturing (device));

  g_assert_false (gmlp_device_begin_capture (device, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
  g_clear_error (&error);
  g_assert_true (gmlp_device_is_capturing (device));

  g_assert_true (gmlp_grouped_tensor_scale (x, 2.0, &error));
  g_assert_no_error (error);
  graph = gmlp_device_end_capture (device, &error);
  g_assert_no_error (error);
  g_assert_true (GMLP_IS_GRAPH (graph));
  g_assert_true (gmlp_graph_get_device (graph) == device);
  g_assert_false (gmlp_device_is_capturing (device));

  none = gmlp_device_end_capture (device, &error);
  g_assert_null (none);
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
  g_clear_error (&error);

  /* A replay cannot be recorded into another graph. */
  g_assert_true (gmlp_device_begin_capture (device, &error));
  g_assert_false (gmlp_graph_replay (graph, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
  g_clear_error (&error);
  graph2 = gmlp_device_end_capture (device, &error);
  g_assert_no_error (error);

  /* Nothing ran during the captures; each replay doubles x. An empty
   * graph replays as nothing. */
  assert_values (x, xv, count, "x before any replay");
  g_assert_true (gmlp_graph_replay (graph, &error));
  g_assert_true (gmlp_graph_replay (graph2, &error));
  g_assert_true (gmlp_graph_replay (graph, &error));
  g_assert_no_error (error);
  want = g_new (double, count);
  for (i = 0; i < count; i++)
    want[i] = 4.0 * xv[i];
  assert_values (x, want, count, "x after two replays");
}

/* A capture of conversions and arithmetic into tensors made before and
 * during it, with temporaries freed during it (allocated before and
 * during), data uploaded during it, and state that carries over from replay
 * to replay; replayed with new inputs written in between, checked against
 * float64 after every replay, then the graph and the tensors made during
 * the capture freed in both orders. */
static void
run_replay (gboolean graph_first)
{
  g_autoptr(GmlpDevice) device = capture_device_or_skip ();
  g_autoptr(GmlpGraph) graph = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, y = NULL, acc = NULL, tmp = NULL;
  g_autoptr(GmlpGroupedTensor) a = NULL, b = NULL, c = NULL, t2 = NULL;
  g_autoptr(GBytes) c_bytes = NULL;
  g_autofree gint64 *rows = NULL;
  g_auto(ReplayModel) m = { 0 };
  g_autoptr(GError) error = NULL;
  guint n = g_test_rand_int_range (1, 9), replay;
  gint64 cols = g_test_rand_int_range (1, 150);
  gsize i;

  if (device == NULL)
    return;

  m.alpha = g_test_rand_double_range (-2.0, 2.0);
  m.beta = g_test_rand_double_range (0.5, 1.0);
  m.gamma = g_test_rand_double_range (-2.0, 2.0);
  rows = gmlp_test_random_rows (n, 40);
  m.count = (gsize) sum_rows (rows, n) * cols;
  x = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, rows, n, cols, 1.0, &m.x);
  y = gmlp_test_random_tensor (device, GMLP_DTYPE_BFLOAT16, rows, n, cols, 1.0, &m.y);
  acc = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, rows, n, cols, 1.0, &m.acc);
  tmp = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT16, rows, n, cols, 1.0, &m.tmp);
  c_bytes = random_values (GMLP_DTYPE_FLOAT32, m.count, 1.0, &m.c);
  m.a = g_new (double, MAX (m.count, 1));
  m.b = g_new (double, MAX (m.count, 1));

  g_assert_true (gmlp_device_begin_capture (device, &error));
  g_assert_no_error (error);
  a = gmlp_grouped_tensor_convert (x, GMLP_DTYPE_BFLOAT16, &error);      /* a = bf16 (x) */
  g_assert_no_error (error);
  g_assert_true (gmlp_grouped_tensor_add_scaled (a, m.alpha, y, &error)); /* a += alpha y */
  g_assert_true (gmlp_grouped_tensor_scale (y, m.beta, &error));          /* y *= beta */
  b = gmlp_grouped_tensor_convert (a, GMLP_DTYPE_FLOAT32, &error);       /* b = a */
  g_assert_no_error (error);
  t2 = gmlp_grouped_tensor_convert (tmp, GMLP_DTYPE_FLOAT32, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_grouped_tensor_add_scaled (b, m.gamma, t2, &error)); /* b += gamma tmp */
  g_assert_no_error (error);
  /* Freed while the graph still needs them: allocated during the capture,
   * and before it. */
  g_clear_object (&t2);
  g_clear_object (&tmp);
  c = gmlp_grouped_tensor_new_from_bytes (device, GMLP_DTYPE_FLOAT32, rows, n, cols, c_bytes, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_grouped_tensor_add_scaled (b, 1.0, c, &error));     /* b += c */
  g_assert_true (gmlp_grouped_tensor_add_scaled (acc, 1.0, b, &error));   /* acc += b */
  g_assert_no_error (error);
  graph = gmlp_device_end_capture (device, &error);
  g_assert_no_error (error);
  g_assert_nonnull (graph);

  /* Nothing ran yet, but the upload made during the capture did. */
  assert_values (y, m.y, m.count, "y before any replay");
  assert_values (acc, m.acc, m.count, "acc before any replay");
  assert_values (c, m.c, m.count, "data uploaded during the capture");
  if (gmlp_test_poisoned ())
    {
      g_autofree double *poisoned = gmlp_test_download (b, NULL);
      for (i = 0; i < m.count; i++)
        g_assert_true (isnan (poisoned[i]));
    }

  for (replay = 0; replay < 4; replay++)
    {
      /* New input, except once, which shows the state carrying over. */
      if (replay != 2)
        {
          g_autoptr(GBytes) bytes = NULL;

          g_clear_pointer (&m.x, g_free);
          bytes = random_values (GMLP_DTYPE_FLOAT32, m.count, 1.0, &m.x);
          write_values (x, rows, n, bytes);
        }
      g_assert_true (gmlp_graph_replay (graph, &error));
      g_assert_no_error (error);
      replay_model_step (&m);
      assert_values (a, m.a, m.count, "a");
      assert_values (y, m.y, m.count, "y");
      assert_values (b, m.b, m.count, "b");
      assert_values (acc, m.acc, m.count, "acc");
    }

  if (graph_first)
    {
      /* The tensors made during the capture outlive the graph. */
      g_clear_object (&graph);
      assert_values (a, m.a, m.count, "a after the graph is gone");
      assert_values (b, m.b, m.count, "b after the graph is gone");
      g_clear_object (&a);
      g_clear_object (&b);
      g_clear_object (&c);
    }
  else
    {
      /* The graph keeps what it uses after the tensors let go of it. */
      g_clear_object (&a);
      g_clear_object (&b);
      g_clear_object (&c);
      for (replay = 0; replay < 2; replay++)
        {
          g_assert_true (gmlp_graph_replay (graph, &error));
          g_assert_no_error (error);
          replay_model_step (&m);
        }
      assert_values (y, m.y, m.count, "y after the tensors are gone");
      assert_values (acc, m.acc, m.count, "acc after the tensors are gone");
      g_clear_object (&graph);
    }
  assert_values (x, m.x, m.count, "x, never written by the graph");
  g_assert_true (gmlp_device_synchronize (device, &error));
  g_assert_no_error (error);
}

static void
test_replay_graph_first (void)
{
  run_replay (TRUE);
}

static void
test_replay_tensors_first (void)
{
  run_replay (FALSE);
}

/* The calls that wait for the device or read it on the host fail during a
 * capture without breaking it; the capture then records what follows. */
static void
test_refused (void)
{
  g_autoptr(GmlpDevice) device = capture_device_or_skip ();
  g_autoptr(GmlpDevice) cpu = gmlp_device_new (GMLP_DEVICE_KIND_CPU, 0, NULL);
  g_autoptr(GmlpGraph) graph = NULL;
  g_autoptr(GmlpGraph) other = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, view = NULL, sizes = NULL, xd = NULL;
  g_autoptr(GmlpEvent) before = NULL, during = NULL;
  g_autoptr(GBytes) sizes_bytes = NULL;
  g_autoptr(GError) error = NULL;
  g_autofree double *xv = NULL, *want = NULL;
  g_autofree gint64 *read = NULL;
  gint64 rows[] = { 3, 0, 5 }, one = 3;
  gpointer dlpack;
  guint n_read;
  double ms = -1.0;
  gsize count = 8 * 7, i;

  if (device == NULL)
    return;

  x = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, rows, 3, 7, 1.0, &xv);
  view = gmlp_grouped_tensor_get_member (x, 0, &error);
  g_assert_no_error (error);
  sizes_bytes = g_bytes_new (rows, sizeof rows);
  sizes = gmlp_grouped_tensor_new_from_bytes (device, GMLP_DTYPE_INT64, &one, 1, 1, sizes_bytes, &error);
  g_assert_no_error (error);
  xd = gmlp_grouped_tensor_new_with_device_sizes (device, GMLP_DTYPE_FLOAT32, sizes, 8, 7, &error);
  g_assert_no_error (error);
  before = gmlp_event_new_recorded (device, &error);
  g_assert_no_error (error);

  g_assert_true (gmlp_device_begin_capture (device, &error));
  g_assert_no_error (error);
  other = gmlp_device_end_capture (device, &error);
  g_assert_no_error (error);

  g_assert_true (gmlp_device_begin_capture (device, &error));
  g_assert_true (gmlp_grouped_tensor_scale (x, 2.0, &error));
  g_assert_no_error (error);

#define EXPECT_REFUSED(call) \
  G_STMT_START { \
    g_assert_false ((call)); \
    g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE); \
    g_assert_nonnull (strstr (error->message, "cannot be captured in a graph")); \
    g_clear_error (&error); \
    g_assert_true (gmlp_device_is_capturing (device)); \
  } G_STMT_END

  EXPECT_REFUSED (gmlp_grouped_tensor_to_bytes (x, &error) != NULL);
  EXPECT_REFUSED (gmlp_device_synchronize (device, &error));
  EXPECT_REFUSED (gmlp_grouped_tensor_sum_squares (x, &error) >= 0.0);
  EXPECT_REFUSED (gmlp_grouped_tensor_read_sizes (xd, &n_read, &error) != NULL);
  dlpack = gmlp_grouped_tensor_to_dlpack (view, &error);
  EXPECT_REFUSED (dlpack != NULL);
  EXPECT_REFUSED (gmlp_graph_replay (other, &error));

  /* Host sizes are on the host: reading them is fine. */
  read = gmlp_grouped_tensor_read_sizes (x, &n_read, &error);
  g_assert_no_error (error);
  g_assert_cmpmem (read, n_read * sizeof (gint64), rows, sizeof rows);

  /* An event recorded now marks a point in the graph: no host waits, no
   * waits from elsewhere; the capturing stream itself may wait for it. An
   * event recorded before the capture may be waited for. */
  during = gmlp_event_new_recorded (device, &error);
  g_assert_no_error (error);
  g_assert_false (gmlp_event_is_complete (during));
  EXPECT_REFUSED (gmlp_event_synchronize (during, &error));
  EXPECT_REFUSED (gmlp_event_elapsed_ms (before, during, &ms, &error));
  EXPECT_REFUSED (gmlp_event_wait_on_device (during, cpu, &error));
  g_assert_true (gmlp_event_wait_on_device (during, device, &error));
  g_assert_no_error (error);
  g_assert_true (gmlp_event_synchronize (before, &error));
  g_assert_no_error (error);

  g_assert_true (gmlp_grouped_tensor_add_scaled (x, 1.0, x, &error));
  g_assert_no_error (error);
  graph = gmlp_device_end_capture (device, &error);
  g_assert_no_error (error);
  g_assert_nonnull (graph);

  /* The captured event stays a point of the graph. */
  g_assert_false (gmlp_device_is_capturing (device));
  g_assert_false (gmlp_event_synchronize (during, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
  g_clear_error (&error);
  g_assert_false (gmlp_event_wait_on_device (during, device, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
  g_clear_error (&error);

#undef EXPECT_REFUSED

  /* Nothing ran during the capture; each replay multiplies by 4 (exact). */
  assert_values (x, xv, count, "x before any replay");
  want = g_new (double, count);
  for (i = 0; i < count; i++)
    want[i] = 4.0 * xv[i];
  g_assert_true (gmlp_graph_replay (graph, &error));
  g_assert_no_error (error);
  assert_values (x, want, count, "x after one replay");
  for (i = 0; i < count; i++)
    want[i] *= 4.0;
  g_assert_true (gmlp_graph_replay (graph, &error));
  assert_values (x, want, count, "x after two replays");
}

/* A capture broken by work that cannot be captured (here a backend call
 * that waits for the stream, made past libgmlp's public checks, as CUDA
 * code using a native handle could): end_capture reports it, gives no
 * graph, and the device works as before. */
static void
test_invalidated (void)
{
  g_autoptr(GmlpDevice) device = capture_device_or_skip ();
  g_autoptr(GmlpGraph) graph = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, y = NULL;
  g_autoptr(GError) error = NULL;
  g_autofree double *xv = NULL, *want = NULL;
  GmlpBackendShape shape;
  gint64 rows[] = { 2, 5 };
  double sum = 0.0;
  gsize count = 7 * 9, i;

  if (device == NULL)
    return;

  x = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, rows, 2, 9, 1.0, &xv);
  g_assert_true (gmlp_grouped_tensor_get_backend_shape (x, &shape, &error));
  g_assert_no_error (error);

  g_assert_true (gmlp_device_begin_capture (device, &error));
  g_assert_no_error (error);
  g_assert_true (gmlp_grouped_tensor_scale (x, 2.0, &error));
  y = gmlp_grouped_tensor_convert (x, GMLP_DTYPE_BFLOAT16, &error);
  g_assert_no_error (error);
  g_assert_false (GMLP_DEVICE_CALL (device, sum_squares, &shape, gmlp_grouped_tensor_get_data (x),
                                    GMLP_DTYPE_FLOAT32, &sum, &error));
  g_assert_nonnull (error);
  g_clear_error (&error);
  g_clear_object (&y);
  graph = gmlp_device_end_capture (device, &error);
  g_assert_null (graph);
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_BACKEND);
  g_clear_error (&error);
  g_assert_false (gmlp_device_is_capturing (device));

  /* Nothing recorded ran, and the device runs work again. */
  assert_values (x, xv, count, "x after the broken capture");
  g_assert_true (gmlp_grouped_tensor_scale (x, 2.0, &error));
  g_assert_no_error (error);
  want = g_new (double, count);
  for (i = 0; i < count; i++)
    want[i] = 2.0 * xv[i];
  assert_values (x, want, count, "x scaled after the broken capture");
  g_assert_true (gmlp_device_synchronize (device, &error));
  g_assert_no_error (error);

  /* And captures again. */
  g_assert_true (gmlp_device_begin_capture (device, &error));
  g_assert_true (gmlp_grouped_tensor_scale (x, 0.5, &error));
  graph = gmlp_device_end_capture (device, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_graph_replay (graph, &error));
  g_assert_no_error (error);
  assert_values (x, xv, count, "x after a replay");
}

/* One graph over tensors whose group sizes are on the device, replayed with
 * other sizes (clamped ones too) and data written in between; each replay
 * equals the same work run eagerly, and the float64 reference. */
static void
test_device_sizes (void)
{
  g_autoptr(GmlpDevice) device = capture_device_or_skip ();
  g_autoptr(GmlpGraph) graph = NULL;
  g_autoptr(GmlpGroupedTensor) sizes = NULL, x = NULL, y = NULL, c = NULL;
  g_autoptr(GBytes) zero_sizes = NULL;
  g_autoptr(GError) error = NULL;
  double alpha = g_test_rand_double_range (-2.0, 2.0);
  guint n = g_test_rand_int_range (1, 9), replay, g;
  gint64 cols = g_test_rand_int_range (1, 100), capacity = 60, one;
  g_autofree gint64 *no_rows = g_new0 (gint64, n);

  if (device == NULL)
    return;

  one = n;
  zero_sizes = g_bytes_new (no_rows, n * sizeof (gint64));
  sizes = gmlp_grouped_tensor_new_from_bytes (device, GMLP_DTYPE_INT64, &one, 1, 1, zero_sizes, &error);
  g_assert_no_error (error);
  x = gmlp_grouped_tensor_new_with_device_sizes (device, GMLP_DTYPE_FLOAT32, sizes, capacity, cols, &error);
  g_assert_no_error (error);
  y = gmlp_grouped_tensor_new_with_device_sizes (device, GMLP_DTYPE_BFLOAT16, sizes, capacity, cols, &error);
  g_assert_no_error (error);

  g_assert_true (gmlp_device_begin_capture (device, &error));
  g_assert_no_error (error);
  c = gmlp_grouped_tensor_convert (x, GMLP_DTYPE_BFLOAT16, &error);   /* c = bf16 (x) */
  g_assert_no_error (error);
  g_assert_true (gmlp_grouped_tensor_add_scaled (c, alpha, y, &error)); /* c += alpha y */
  g_assert_no_error (error);
  graph = gmlp_device_end_capture (device, &error);
  g_assert_no_error (error);

  for (replay = 0; replay < 4; replay++)
    {
      g_autofree gint64 *rows = gmlp_test_random_rows (n, 20);
      g_autofree gint64 *clamped = g_memdup2 (rows, n * sizeof (gint64));
      g_autofree double *xv = NULL, *yv = NULL, *want = NULL;
      g_autoptr(GBytes) xb = NULL, yb = NULL, graph_out = NULL, eager_out = NULL;
      g_autoptr(GmlpGroupedTensor) eager = NULL;
      gint64 left = capacity;
      gsize count, i;

      /* The last replay overflows the capacity: the kernels clamp. */
      if (replay == 3)
        for (g = 0; g < n; g++)
          rows[g] = 2 * capacity / n + 1;
      for (g = 0; g < n; g++)
        {
          clamped[g] = MIN (rows[g], left);
          left -= clamped[g];
        }
      count = (gsize) sum_rows (clamped, n) * cols;
      xb = random_values (GMLP_DTYPE_FLOAT32, count, 1.0, &xv);
      yb = random_values (GMLP_DTYPE_BFLOAT16, count, 1.0, &yv);

      /* As a router would: new sizes into the sizes tensor, then data. */
      g_assert_true (GMLP_DEVICE_CALL (device, upload, gmlp_grouped_tensor_get_data (sizes), rows,
                                       n * sizeof (gint64), &error));
      g_assert_no_error (error);
      write_values (x, clamped, n, xb);
      write_values (y, clamped, n, yb);

      g_assert_true (gmlp_graph_replay (graph, &error));
      g_assert_no_error (error);
      graph_out = gmlp_grouped_tensor_to_bytes (c, &error);
      g_assert_no_error (error);

      eager = gmlp_grouped_tensor_convert (x, GMLP_DTYPE_BFLOAT16, &error);
      g_assert_no_error (error);
      g_assert_true (gmlp_grouped_tensor_add_scaled (eager, alpha, y, &error));
      eager_out = gmlp_grouped_tensor_to_bytes (eager, &error);
      g_assert_no_error (error);
      g_assert_true (g_bytes_equal (graph_out, eager_out));

      want = g_new (double, MAX (count, 1));
      for (i = 0; i < count; i++)
        want[i] = gmlp_test_round ((float) alpha * (float) yv[i] +
                                   (float) gmlp_test_round (xv[i], GMLP_DTYPE_BFLOAT16),
                                   GMLP_DTYPE_BFLOAT16);
      assert_values (c, want, count, "c");
    }
}

/* A GroupedLinear with bias and a single grouped weight of random values
 * (their float64 values in *w and *b). */
static GmlpGroupedLinear *
random_linear (GmlpDevice *device,
               GmlpDType   dtype,
               guint       n,
               gint64      k,
               gint64      o,
               double    **w,
               double    **b)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GBytes) wb = random_values (dtype, n * o * k, 0.5, w);
  g_autoptr(GBytes) bb = random_values (dtype, n * o, 0.5, b);
  GmlpGroupedLinear *layer = gmlp_grouped_linear_new_full (device, n, k, o, dtype,
                                                           GMLP_LINEAR_BIAS | GMLP_LINEAR_SINGLE_GROUPED_WEIGHT,
                                                           &error);

  g_assert_no_error (error);
  g_assert_true (gmlp_grouped_linear_set_weight_from_bytes (layer, wb, &error));
  g_assert_true (gmlp_grouped_linear_set_bias_from_bytes (layer, bb, &error));
  g_assert_no_error (error);
  return layer;
}

/* A forward (y) and backward (dx) of layer on x and dy, captured. */
static GmlpGraph *
capture_step (GmlpGroupedLinear  *layer,
              GmlpGroupedTensor  *x,
              GmlpGroupedTensor  *dy,
              GmlpGroupedTensor **y,
              GmlpGroupedTensor **dx)
{
  GmlpDevice *device = gmlp_grouped_tensor_get_device (x);
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GError) error = NULL;
  GmlpGraph *graph;

  g_assert_true (gmlp_device_begin_capture (device, &error));
  g_assert_no_error (error);
  *y = gmlp_grouped_linear_forward (layer, x, &saved, &error);
  g_assert_no_error (error);
  *dx = gmlp_grouped_linear_backward (layer, saved, dy, &error);
  g_assert_no_error (error);
  graph = gmlp_device_end_capture (device, &error);
  g_assert_no_error (error);
  return graph;
}

/* After a replay of capture_step()'s graph on x and dy (xv and dyv, rows
 * of n groups): y, dx and layer's weight and bias gradients equal the
 * float64 reference, and the same step run eagerly, bit for bit. */
static void
assert_replayed_step (GmlpGroupedLinear *layer,
                      GmlpGroupedTensor *x,
                      GmlpGroupedTensor *dy,
                      GmlpGroupedTensor *y,
                      GmlpGroupedTensor *dx,
                      const gint64      *rows,
                      guint              n,
                      const double      *xv,
                      const double      *w,
                      const double      *b,
                      const double      *dyv)
{
  gint64 k = gmlp_grouped_tensor_get_cols (x), o = gmlp_grouped_tensor_get_cols (dy);
  gint64 total = sum_rows (rows, n);
  g_autofree double *yr = g_new (double, MAX (total * o, 1)), *dxr = g_new (double, MAX (total * k, 1));
  g_autofree double *dwr = g_new (double, n * o * k), *dbr = g_new (double, n * o);
  g_autoptr(GmlpSavedActivations) eager_saved = NULL;
  g_autoptr(GmlpGroupedTensor) ey = NULL, edx = NULL;
  g_autoptr(GError) error = NULL;
  GBytes *graph_out[4], *eager_out[4];
  guint i;

  gmlp_test_linear_reference (rows, n, k, o, xv, w, b, dyv, dyv, yr, dxr, dwr, dbr);
  assert_values (y, yr, total * o, "y (replay)");
  assert_values (dx, dxr, total * k, "dx (replay)");
  assert_values (gmlp_grouped_linear_get_wgrad (layer), dwr, n * o * k, "dW (replay)");
  assert_values (gmlp_grouped_linear_get_bgrad (layer), dbr, n * o, "db (replay)");

  gmlp_test_step_bytes (layer, y, dx, graph_out);
  ey = gmlp_grouped_linear_forward (layer, x, &eager_saved, &error);
  g_assert_no_error (error);
  edx = gmlp_grouped_linear_backward (layer, eager_saved, dy, &error);
  g_assert_no_error (error);
  gmlp_test_step_bytes (layer, ey, edx, eager_out);
  for (i = 0; i < 4; i++)
    {
      g_assert_true (g_bytes_equal (graph_out[i], eager_out[i]));
      g_bytes_unref (graph_out[i]);
      g_bytes_unref (eager_out[i]);
    }
}

/* A whole forward and backward of a GroupedLinear with its group sizes on
 * the device, captured once and replayed with other sizes and data written
 * in between (an empty group among them): each replay equals the same step
 * run eagerly, bit for bit, and the float64 reference. On an H100/H200 the
 * BF16 products run on libgmlp's Hopper kernel. */
static void
test_grouped_linear (void)
{
  g_autoptr(GmlpDevice) device = capture_device_or_skip ();
  const GmlpDType dtype = GMLP_DTYPE_BFLOAT16;
  const guint n = 3;
  const gint64 k = 136, o = 264, capacity = 400, three = n;
  g_autoptr(GmlpGroupedLinear) layer = NULL;
  g_autoptr(GmlpGroupedTensor) sizes = NULL, x = NULL, dy = NULL, y = NULL, dx = NULL;
  g_autoptr(GmlpGraph) graph = NULL;
  g_autoptr(GBytes) zero_sizes = NULL;
  g_autoptr(GError) error = NULL;
  g_autofree double *w = NULL, *b = NULL;
  gint64 no_rows[3] = { 0, 0, 0 };
  guint replay;

  if (device == NULL)
    return;

  layer = random_linear (device, dtype, n, k, o, &w, &b);
  zero_sizes = g_bytes_new (no_rows, sizeof no_rows);
  sizes = gmlp_grouped_tensor_new_from_bytes (device, GMLP_DTYPE_INT64, &three, 1, 1, zero_sizes, &error);
  g_assert_no_error (error);
  x = gmlp_grouped_tensor_new_with_device_sizes (device, dtype, sizes, capacity, k, &error);
  g_assert_no_error (error);
  dy = gmlp_grouped_tensor_new_with_device_sizes (device, dtype, sizes, capacity, o, &error);
  g_assert_no_error (error);
  graph = capture_step (layer, x, dy, &y, &dx);

  for (replay = 0; replay < 3; replay++)
    {
      gint64 rows[3];
      g_autofree double *xv = NULL, *dyv = NULL;
      g_autoptr(GBytes) xb = NULL, dyb = NULL;
      gint64 total;

      rows[0] = g_test_rand_int_range (0, 200);
      rows[1] = replay == 1 ? 0 : g_test_rand_int_range (1, 150);
      rows[2] = g_test_rand_int_range (0, 50);
      total = sum_rows (rows, n);
      xb = random_values (dtype, total * k, 1.0, &xv);
      dyb = random_values (dtype, total * o, 1.0, &dyv);
      g_assert_true (GMLP_DEVICE_CALL (device, upload, gmlp_grouped_tensor_get_data (sizes), rows,
                                       sizeof rows, &error));
      g_assert_no_error (error);
      write_values (x, rows, n, xb);
      write_values (dy, rows, n, dyb);

      g_assert_true (gmlp_graph_replay (graph, &error));
      g_assert_no_error (error);
      assert_replayed_step (layer, x, dy, y, dx, rows, n, xv, w, b, dyv);
    }
}

/* The bytes of a GroupedMLP step (each to unref): y and dx as read over
 * @rows (host-sizes views of device-sizes results), and both layers'
 * weight and bias gradients. */
static void
mlp_step_bytes (GmlpGroupedMLP    *mlp,
                GmlpGroupedTensor *y,
                GmlpGroupedTensor *dx,
                const gint64      *rows,
                GBytes            *out[6])
{
  g_autoptr(GmlpGroupedTensor) y_view = gmlp_test_host_view (y, rows);
  g_autoptr(GmlpGroupedTensor) dx_view = gmlp_test_host_view (dx, rows);
  GmlpGroupedLinear *fc1 = gmlp_grouped_mlp_get_fc1 (mlp), *fc2 = gmlp_grouped_mlp_get_fc2 (mlp);
  GmlpGroupedTensor *results[6] = { y_view, dx_view, gmlp_grouped_linear_get_wgrad (fc1),
                                    gmlp_grouped_linear_get_bgrad (fc1), gmlp_grouped_linear_get_wgrad (fc2),
                                    gmlp_grouped_linear_get_bgrad (fc2) };
  g_autoptr(GError) error = NULL;

  for (guint i = 0; i < 6; i++)
    {
      /* Every result in the MLP's dtype: the caller decodes them so. */
      g_assert_cmpint (gmlp_grouped_tensor_get_dtype (results[i]), ==, gmlp_grouped_tensor_get_dtype (y));
      out[i] = gmlp_grouped_tensor_to_bytes (results[i], &error);
      g_assert_no_error (error);
    }
}

/* A whole forward and backward of a GroupedMLP (SwiGLU, bias, BF16) with
 * its group sizes on the device, captured once and replayed with other
 * sizes and data written in between: an empty group, and sizes past the
 * capacity (rows of whole multiples of 256 bytes: every pass keeps the
 * sizes clamped in order). Each replay equals the float64 reference and
 * the same step run eagerly, bit for bit. The capture itself shows that
 * nothing in the step reads the sizes on the host or waits for the device:
 * either fails during a capture. */
static void
test_grouped_mlp (void)
{
  g_autoptr(GmlpDevice) device = capture_device_or_skip ();
  const GmlpDType dtype = GMLP_DTYPE_BFLOAT16;
  const guint n = 3;
  const gint64 hid = 128, ffn = 128, capacity = 300;
  g_autoptr(GmlpGroupedMLP) mlp = NULL;
  g_autoptr(GmlpGroupedTensor) sizes = NULL, x = NULL, dy = NULL, y = NULL, dx = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GmlpGraph) graph = NULL;
  g_autoptr(GError) error = NULL;
  g_autofree double *w1 = NULL, *w2 = NULL, *b2 = NULL;
  gint64 no_rows[3] = { 0, 0, 0 };
  guint replay;

  if (device == NULL)
    return;

  mlp = gmlp_grouped_mlp_new_full (device, n, hid, ffn, GMLP_ACTIVATION_SWIGLU, dtype,
                                   GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_grouped_mlp_init_parameters (mlp, g_test_rand_int (), &error));
  g_assert_no_error (error);
  w1 = gmlp_test_download (gmlp_grouped_linear_get_weight (gmlp_grouped_mlp_get_fc1 (mlp)), NULL);
  w2 = gmlp_test_download (gmlp_grouped_linear_get_weight (gmlp_grouped_mlp_get_fc2 (mlp)), NULL);
  b2 = gmlp_test_download (gmlp_grouped_linear_get_bias (gmlp_grouped_mlp_get_fc2 (mlp)), NULL);
  sizes = gmlp_test_sizes_tensor (device, no_rows, n);
  x = gmlp_grouped_tensor_new_with_device_sizes (device, dtype, sizes, capacity, hid, &error);
  g_assert_no_error (error);
  dy = gmlp_grouped_tensor_new_with_device_sizes (device, dtype, sizes, capacity, hid, &error);
  g_assert_no_error (error);

  g_assert_true (gmlp_device_begin_capture (device, &error));
  g_assert_no_error (error);
  y = gmlp_grouped_mlp_forward (mlp, x, &saved, &error);
  g_assert_no_error (error);
  dx = gmlp_grouped_mlp_backward (mlp, saved, dy, &error);
  g_assert_no_error (error);
  graph = gmlp_device_end_capture (device, &error);
  g_assert_no_error (error);
  g_assert_false (gmlp_grouped_tensor_has_host_sizes (y));
  g_assert_false (gmlp_grouped_tensor_has_host_sizes (dx));

  for (replay = 0; replay < 3; replay++)
    {
      gint64 given[3], rows[3], left = capacity, total;
      g_autofree double *xv = NULL, *dyv = NULL, *h = NULL;
      g_autoptr(GBytes) xb = NULL, dyb = NULL;
      g_autoptr(GmlpGroupedTensor) x_host = NULL, h_host = NULL, ey = NULL, edx = NULL;
      g_autoptr(GmlpSavedActivations) eager_saved = NULL;
      GmlpTestMlpResult want = { NULL, };
      GBytes *graph_out[6], *eager_out[6];
      double tol = gmlp_test_tolerance (dtype) * 2;
      guint g, i;

      given[0] = g_test_rand_int_range (1, 150);
      given[1] = replay == 1 ? 0 : g_test_rand_int_range (1, 120);
      given[2] = replay == 2 ? capacity : g_test_rand_int_range (0, 30);
      for (g = 0; g < n; g++)
        {
          rows[g] = MIN (given[g], left);
          left -= rows[g];
        }
      total = sum_rows (rows, n);
      xb = random_values (dtype, total * hid, 1.0, &xv);
      dyb = random_values (dtype, total * hid, 1.0, &dyv);
      g_assert_true (GMLP_DEVICE_CALL (device, upload, gmlp_grouped_tensor_get_data (sizes), given,
                                       sizeof given, &error));
      g_assert_no_error (error);
      write_values (x, rows, n, xb);
      write_values (dy, rows, n, dyb);

      g_assert_true (gmlp_graph_replay (graph, &error));
      g_assert_no_error (error);
      mlp_step_bytes (mlp, y, dx, rows, graph_out);

      /* The float64 reference, from FC1's output as the layer stores it. */
      x_host = gmlp_grouped_tensor_new_from_bytes (device, dtype, rows, n, hid, xb, &error);
      g_assert_no_error (error);
      h_host = gmlp_grouped_linear_forward (gmlp_grouped_mlp_get_fc1 (mlp), x_host, NULL, &error);
      g_assert_no_error (error);
      h = gmlp_test_download (h_host, NULL);
      gmlp_test_mlp_reference (GMLP_ACTIVATION_SWIGLU, dtype, rows, n, hid, ffn, xv, h, dyv, w1, w2, b2, &want);
      {
        const double *refs[6] = { want.y, want.dx, want.dw1, want.db1, want.dw2, want.db2 };
        static const char *const names[6] = { "y", "dx", "fc1 dW", "fc1 db", "fc2 dW", "fc2 db" };

        for (i = 0; i < 6; i++)
          {
            gsize count = g_bytes_get_size (graph_out[i]) / gmlp_dtype_get_size (dtype);
            g_autofree double *got = g_new (double, MAX (count, 1));

            for (gsize k = 0; k < count; k++)
              got[k] = gmlp_test_decode (g_bytes_get_data (graph_out[i], NULL), dtype, k);
            gmlp_test_assert_close (got, refs[i], count, tol, names[i]);
          }
      }
      gmlp_test_mlp_result_clear (&want);

      ey = gmlp_grouped_mlp_forward (mlp, x, &eager_saved, &error);
      g_assert_no_error (error);
      edx = gmlp_grouped_mlp_backward (mlp, eager_saved, dy, &error);
      g_assert_no_error (error);
      mlp_step_bytes (mlp, ey, edx, rows, eager_out);
      for (i = 0; i < 6; i++)
        {
          g_assert_true (g_bytes_equal (graph_out[i], eager_out[i]));
          g_bytes_unref (graph_out[i]);
          g_bytes_unref (eager_out[i]);
        }
    }
}

/* A forward and backward of a GroupedLinear with host sizes, captured once
 * and replayed with new data written in between. Its few unaligned
 * products (an empty group among them) run as the loop of per-group cuBLAS
 * calls, which alternates them between the compute stream and a side
 * stream forked from it and joined back: the capture must take in both.
 * Each replay equals the same step run eagerly, bit for bit, and the
 * float64 reference; FP32 (cuBLAS for every product) and BF16. */
static void
test_host_sizes (void)
{
  g_autoptr(GmlpDevice) device = capture_device_or_skip ();
  static const GmlpDType dtypes[] = { GMLP_DTYPE_FLOAT32, GMLP_DTYPE_BFLOAT16 };
  gint64 rows[] = { 37, 0, 21, 9 };
  const guint n = G_N_ELEMENTS (rows);
  const gint64 k = 24, o = 40, total = sum_rows (rows, n);

  if (device == NULL)
    return;

  for (guint d = 0; d < G_N_ELEMENTS (dtypes); d++)
    {
      const GmlpDType dtype = dtypes[d];
      g_autoptr(GmlpGroupedLinear) layer = NULL;
      g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, y = NULL, dx = NULL;
      g_autoptr(GmlpGraph) graph = NULL;
      g_autoptr(GError) error = NULL;
      g_autofree double *w = NULL, *b = NULL;

      layer = random_linear (device, dtype, n, k, o, &w, &b);
      x = gmlp_grouped_tensor_new (device, dtype, rows, n, k, &error);
      g_assert_no_error (error);
      dy = gmlp_grouped_tensor_new (device, dtype, rows, n, o, &error);
      g_assert_no_error (error);
      graph = capture_step (layer, x, dy, &y, &dx);

      for (guint replay = 0; replay < 2; replay++)
        {
          g_autofree double *xv = NULL, *dyv = NULL;
          g_autoptr(GBytes) xb = random_values (dtype, total * k, 1.0, &xv);
          g_autoptr(GBytes) dyb = random_values (dtype, total * o, 1.0, &dyv);

          write_values (x, rows, n, xb);
          write_values (dy, rows, n, dyb);
          g_assert_true (gmlp_graph_replay (graph, &error));
          g_assert_no_error (error);
          assert_replayed_step (layer, x, dy, y, dx, rows, n, xv, w, b, dyv);
        }
    }
}

/* Offloading saved activations cannot be captured: a forward under an
 * enabled offload context fails during a capture, and so does the backward
 * of activations offloaded before it; both work again once it is over. */
static void
test_offload_refused (void)
{
  g_autoptr(GmlpDevice) device = capture_device_or_skip ();
  g_autoptr(GmlpOffloadContext) ctx = NULL;
  g_autoptr(GmlpGroupedLinear) layer = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, y = NULL, y2 = NULL, dx = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL, saved2 = NULL;
  g_autoptr(GmlpGraph) graph = NULL;
  g_autoptr(GError) error = NULL;
  gint64 rows[] = { 5, 0, 7 };

  if (device == NULL)
    return;

  ctx = gmlp_offload_context_new (device, &error);
  g_assert_no_error (error);
  layer = gmlp_grouped_linear_new (device, 3, 16, 8, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_grouped_linear_init_parameters (layer, 1, &error));
  x = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, rows, 3, 16, 1.0, NULL);

  /* Offloaded before the capture, host-only after the flush. */
  gmlp_offload_context_push_thread_default (ctx, TRUE);
  y = gmlp_grouped_linear_forward (layer, x, &saved, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_saved_activations_get_offload (saved));
  gmlp_offload_context_flush (ctx);

  g_assert_true (gmlp_device_begin_capture (device, &error));
  g_assert_no_error (error);
  y2 = gmlp_grouped_linear_forward (layer, x, &saved2, &error);
  g_assert_null (y2);
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED);
  g_clear_error (&error);
  g_assert_false (gmlp_offload_context_prefetch (ctx, saved, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
  g_clear_error (&error);
  dx = gmlp_grouped_linear_backward (layer, saved, y, &error);
  g_assert_null (dx);
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
  g_clear_error (&error);
  graph = gmlp_device_end_capture (device, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_offload_context_pop_thread_default (ctx, &error));

  /* After the capture the same activations reload and serve a backward. */
  dx = gmlp_grouped_linear_backward (layer, saved, y, &error);
  g_assert_no_error (error);
  g_assert_nonnull (dx);
  g_assert_true (gmlp_device_synchronize (device, &error));
  g_assert_no_error (error);
}

int
main (int argc, char *argv[])
{
  setlocale (LC_ALL, "");
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Gmlp/Graph/cpu", test_cpu);
  g_test_add_func ("/Gmlp/Graph/misuse", test_misuse);
  g_test_add_func ("/Gmlp/Graph/replay/graph-freed-first", test_replay_graph_first);
  g_test_add_func ("/Gmlp/Graph/replay/tensors-freed-first", test_replay_tensors_first);
  g_test_add_func ("/Gmlp/Graph/refused", test_refused);
  g_test_add_func ("/Gmlp/Graph/invalidated", test_invalidated);
  g_test_add_func ("/Gmlp/Graph/device-sizes", test_device_sizes);
  g_test_add_func ("/Gmlp/Graph/grouped-linear", test_grouped_linear);
  g_test_add_func ("/Gmlp/Graph/grouped-mlp", test_grouped_mlp);
  g_test_add_func ("/Gmlp/Graph/host-sizes", test_host_sizes);
  g_test_add_func ("/Gmlp/Graph/offload-refused", test_offload_refused);

  return g_test_run ();
}
