/* launch-rank: one rank of a group started by gmlp-launch, for
 * test-launch.c
 *
 *   launch-rank collectives SEED   every collective against references
 *   launch-rank faults SEED        ranks that disagree, then an abort
 *   launch-rank timeout SEED       the last rank stays away past the timeout
 *   launch-rank dies SEED          the last rank kills itself mid-collective
 *   launch-rank fails SEED         the last rank exits with status 3
 *   launch-rank sleeps SEED        every rank sleeps a minute once joined
 *   launch-rank leaves SEED        the last rank leaves the group and exits
 *   launch-rank quits SEED         every rank takes its place in the group
 *                                  (the shared memory made), then exits
 *                                  with 1 before joining (CPU)
 *
 * Every rank draws every rank's inputs from SEED (splitmix64 keyed by the
 * seed, the rank and the call), so each computes the references of what it
 * receives: sums and averages in double in rank order (the CPU
 * communicator rounds once: the same bits; NCCL within its rounding),
 * gathered and exchanged bytes exactly. The ranks run on the CPU or (with
 * gmlp-launch --devices cuda) on GPUs: collectives and dies. Outputs are poisoned (0xff) first. Each rank prints
 * "rank R: ok ..." lines that test-launch.c counts; any failure prints
 * "rank R: FAILED ..." and exits 1.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <locale.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <gmlp.h>

static int rank, world;
static guint64 seed;
static gboolean on_gpu;   /* NCCL: collectives return enqueued */

#define fail(...) G_STMT_START {                                   \
    g_autofree char *msg_ = g_strdup_printf (__VA_ARGS__);          \
    g_print ("rank %d: FAILED %s\n", rank, msg_);                   \
    exit (1);                                                       \
  } G_STMT_END

static void
check_ok (gboolean     ok,
          GError      *error,
          const char  *what)
{
  if (!ok || error != NULL)
    fail ("%s: %s", what, error != NULL ? error->message : "no error set");
}

static guint64
mix (guint64 x)
{
  x += G_GUINT64_CONSTANT (0x9e3779b97f4a7c15);
  x = (x ^ (x >> 30)) * G_GUINT64_CONSTANT (0xbf58476d1ce4e5b9);
  x = (x ^ (x >> 27)) * G_GUINT64_CONSTANT (0x94d049bb133111eb);
  return x ^ (x >> 31);
}

/* The i-th random number of rank r's input to call `call`. */
static guint64
draw (int     r,
      int     call,
      guint64 i)
{
  return mix (mix (mix (seed) ^ ((guint64) r << 32 | (guint64) call)) ^ i);
}

/* n floats of rank r's input to call, in [-1, 1): exact in float. */
static float *
input_floats (int    r,
              int    call,
              gsize  n)
{
  float *v = g_new (float, MAX (n, 1));

  for (gsize i = 0; i < n; i++)
    v[i] = (float) ((double) (draw (r, call, i) >> 40) / (1 << 23) - 1.0);
  return v;
}

static GmlpGroupedTensor *
tensor_from (GmlpDevice    *device,
             GmlpDType      dtype,
             const gint64  *rows,
             guint          n_groups,
             gint64         cols,
             gconstpointer  data,
             gsize          nbytes)
{
  g_autoptr(GBytes) bytes = g_bytes_new (data, nbytes);
  g_autoptr(GError) error = NULL;
  GmlpGroupedTensor *t = gmlp_grouped_tensor_new_from_bytes (device, dtype, rows, n_groups, cols,
                                                             bytes, &error);

  check_ok (t != NULL, error, "new_from_bytes");
  return t;
}

static GmlpGroupedTensor *
poisoned (GmlpDevice   *device,
          GmlpDType     dtype,
          const gint64 *rows,
          guint         n_groups,
          gint64        cols)
{
  gint64 total = 0;
  gsize nbytes;
  g_autofree guint8 *data = NULL;

  for (guint g = 0; g < n_groups; g++)
    total += rows[g];
  nbytes = (gsize) total * cols * gmlp_dtype_get_size (dtype);
  data = g_malloc (MAX (nbytes, 1));
  memset (data, 0xff, nbytes);
  return tensor_from (device, dtype, rows, n_groups, cols, data, nbytes);
}

static GBytes *
download (GmlpGroupedTensor *t)
{
  g_autoptr(GError) error = NULL;
  GBytes *bytes = gmlp_grouped_tensor_to_bytes (t, &error);

  check_ok (bytes != NULL, error, "to_bytes");
  return bytes;
}

/* Σ_r |x_r[i]| (averaged as the values are, for an average: an upper bound
 * either way). */
static double
magnitude (float * const *all,
           gsize          i)
{
  double m = 0;

  for (int r = 0; r < world; r++)
    m += fabs (all[r][i]);
  return m;
}

/* all_reduce of n_rows float32 rows of 5 columns, sum or average, against
 * the double sum in rank order. */
static void
all_reduce_f32 (GmlpCommunicator *comm,
                int               call,
                GmlpReduceOp      op,
                gint64            n_rows)
{
  GmlpDevice *device = gmlp_communicator_get_device (comm);
  gint64 cols = 5;
  gsize n = (gsize) n_rows * cols;
  g_autoptr(GmlpGroupedTensor) x = NULL;
  g_autoptr(GBytes) out = NULL;
  g_autoptr(GError) error = NULL;
  float **all = g_new0 (float *, world);
  const float *got;

  for (int r = 0; r < world; r++)
    all[r] = input_floats (r, call, n);
  x = tensor_from (device, GMLP_DTYPE_FLOAT32, &n_rows, 1, cols, all[rank], n * sizeof (float));
  check_ok (gmlp_communicator_all_reduce (comm, x, op, &error), error, "all_reduce");
  out = download (x);
  got = g_bytes_get_data (out, NULL);
  for (gsize i = 0; i < n; i++)
    {
      double want = 0;

      for (int r = 0; r < world; r++)
        want += all[r][i];
      if (op == GMLP_REDUCE_OP_AVERAGE)
        want /= world;
      /* The CPU rounds once, in rank order; NCCL at each step of its own order. */
      if (on_gpu ? !(fabs (got[i] - want) <= world * ldexp (magnitude (all, i), -23))
                 : got[i] != (float) want)
        fail ("all_reduce %s [%" G_GSIZE_FORMAT "]: got %.9g, expected %.9g",
              op == GMLP_REDUCE_OP_SUM ? "sum" : "average", i, got[i], (float) want);
    }
  g_print ("rank %d: ok all_reduce %s float32 (%" G_GSIZE_FORMAT " values)\n", rank,
           op == GMLP_REDUCE_OP_SUM ? "sum" : "average", n);
  for (int r = 0; r < world; r++)
    g_free (all[r]);
  g_free (all);
}

static void
all_reduce_i64 (GmlpCommunicator *comm,
                int               call)
{
  GmlpDevice *device = gmlp_communicator_get_device (comm);
  gint64 rows = 7, cols = 3, n = rows * cols;
  g_autofree gint64 *mine = g_new (gint64, n);
  g_autoptr(GmlpGroupedTensor) x = NULL;
  g_autoptr(GBytes) out = NULL;
  g_autoptr(GError) error = NULL;
  const gint64 *got;

  for (gint64 i = 0; i < n; i++)
    mine[i] = (gint64) draw (rank, call, i) >> 20;
  x = tensor_from (device, GMLP_DTYPE_INT64, &rows, 1, cols, mine, n * sizeof (gint64));
  check_ok (gmlp_communicator_all_reduce (comm, x, GMLP_REDUCE_OP_SUM, &error), error, "all_reduce int64");
  out = download (x);
  got = g_bytes_get_data (out, NULL);
  for (gint64 i = 0; i < n; i++)
    {
      guint64 want = 0;

      for (int r = 0; r < world; r++)
        want += (guint64) ((gint64) draw (r, call, i) >> 20);
      if (got[i] != (gint64) want)
        fail ("all_reduce int64 [%" G_GINT64_FORMAT "]", i);
    }
  g_print ("rank %d: ok all_reduce sum int64\n", rank);
}

/* all_gather: 3 members of random rows (zeros among them), bfloat16 bits. */
static void
all_gather (GmlpCommunicator *comm,
            int               call)
{
  GmlpDevice *device = gmlp_communicator_get_device (comm);
  gint64 rows[3], cols = 6, total = 0;
  g_autofree gint64 *recv_rows = g_new (gint64, 3 * world);
  g_autoptr(GmlpGroupedTensor) send = NULL, recv = NULL;
  g_autoptr(GBytes) out = NULL;
  g_autoptr(GError) error = NULL;
  g_autofree guint16 *mine = NULL;
  const guint16 *got;
  gsize n;

  for (int g = 0; g < 3; g++)
    total += rows[g] = (gint64) (draw (-1, call, g) % 5);
  n = (gsize) total * cols;
  mine = g_new (guint16, MAX (n, 1));
  for (gsize i = 0; i < n; i++)
    mine[i] = (guint16) (0x3f00 | (draw (rank, call, i) & 0xff));
  for (int r = 0; r < world; r++)
    memcpy (recv_rows + 3 * r, rows, sizeof rows);
  send = tensor_from (device, GMLP_DTYPE_BFLOAT16, rows, 3, cols, mine, n * 2);
  recv = poisoned (device, GMLP_DTYPE_BFLOAT16, recv_rows, 3 * world, cols);
  check_ok (gmlp_communicator_all_gather (comm, send, recv, &error), error, "all_gather");
  out = download (recv);
  got = g_bytes_get_data (out, NULL);
  for (int r = 0; r < world; r++)
    for (gsize i = 0; i < n; i++)
      if (got[r * n + i] != (guint16) (0x3f00 | (draw (r, call, i) & 0xff)))
        fail ("all_gather: rank %d's value %" G_GSIZE_FORMAT, r, i);
  g_print ("rank %d: ok all_gather bfloat16\n", rank);
}

/* rows[p][q][j]: the rows of member j of the block rank p sends rank q. */
static gint64
a2a_rows (int call,
          int p,
          int q,
          int j,
          gint64 scale)
{
  return (gint64) (draw (-2, call, (guint64) (p * 64 + q) * 4 + j) % 4) * scale;
}

/* all_to_all by members (2 per peer), float32; scale > 1 makes pieces
 * larger than a staging area's share. */
static void
all_to_all (GmlpCommunicator *comm,
            int               call,
            gint64            scale)
{
  GmlpDevice *device = gmlp_communicator_get_device (comm);
  gint64 cols = 64;
  g_autofree gint64 *send_rows = g_new (gint64, 2 * world), *recv_rows = g_new (gint64, 2 * world);
  g_autoptr(GmlpGroupedTensor) send = NULL, recv = NULL;
  g_autoptr(GBytes) out = NULL;
  g_autoptr(GError) error = NULL;
  g_autofree float *mine = NULL;
  const float *got;
  gint64 n_send = 0, at = 0;

  for (int q = 0; q < world; q++)
    for (int j = 0; j < 2; j++)
      {
        n_send += send_rows[2 * q + j] = a2a_rows (call, rank, q, j, scale);
        recv_rows[2 * q + j] = a2a_rows (call, q, rank, j, scale);
      }
  mine = input_floats (rank, call, n_send * cols);
  send = tensor_from (device, GMLP_DTYPE_FLOAT32, send_rows, 2 * world, cols, mine,
                      n_send * cols * sizeof (float));
  recv = poisoned (device, GMLP_DTYPE_FLOAT32, recv_rows, 2 * world, cols);
  check_ok (gmlp_communicator_all_to_all (comm, send, recv, &error), error, "all_to_all");
  out = download (recv);
  got = g_bytes_get_data (out, NULL);
  /* Block p of recv: rank p's block for this rank, from where it starts in
   * rank p's input. */
  for (int p = 0; p < world; p++)
    {
      gint64 first = 0, len = 0;
      g_autofree float *theirs = NULL;
      gint64 n_theirs = 0;

      for (int q = 0; q < world; q++)
        for (int j = 0; j < 2; j++)
          {
            gint64 rw = a2a_rows (call, p, q, j, scale);

            if (q < rank)
              first += rw;
            if (q == rank)
              len += rw;
            n_theirs += rw;
          }
      theirs = input_floats (p, call, n_theirs * cols);
      if (memcmp (got + at * cols, theirs + first * cols, len * cols * sizeof (float)) != 0)
        fail ("all_to_all: the block from rank %d", p);
      at += len;
    }
  g_print ("rank %d: ok all_to_all float32 (%" G_GINT64_FORMAT " rows received)\n", rank, at);
}

/* all_to_all_rows: counts[p][q] rows from p to q, one float32 matrix each,
 * 2 slack rows that stay poisoned. */
static void
all_to_all_rows (GmlpCommunicator *comm,
                 int               call)
{
  GmlpDevice *device = gmlp_communicator_get_device (comm);
  gint64 cols = 3, send_total = 2, recv_total = 2, at = 0;
  g_autofree gint64 *send_counts = g_new (gint64, world), *recv_counts = g_new (gint64, world);
  g_autoptr(GmlpGroupedTensor) send = NULL, recv = NULL;
  g_autoptr(GBytes) out = NULL;
  g_autoptr(GError) error = NULL;
  g_autofree float *mine = NULL;
  const guint32 *got;

  for (int q = 0; q < world; q++)
    {
      send_total += send_counts[q] = (gint64) (draw (-3, call, rank * 64 + q) % 6);
      recv_total += recv_counts[q] = (gint64) (draw (-3, call, q * 64 + rank) % 6);
    }
  mine = input_floats (rank, call, send_total * cols);
  send = tensor_from (device, GMLP_DTYPE_FLOAT32, &send_total, 1, cols, mine,
                      send_total * cols * sizeof (float));
  recv = poisoned (device, GMLP_DTYPE_FLOAT32, &recv_total, 1, cols);
  check_ok (gmlp_communicator_all_to_all_rows (comm, send, send_counts, world, recv, recv_counts,
                                               world, &error), error, "all_to_all_rows");
  out = download (recv);
  got = g_bytes_get_data (out, NULL);
  for (int p = 0; p < world; p++)
    {
      gint64 first = 0, n_theirs = 2;
      g_autofree float *theirs = NULL;

      for (int q = 0; q < world; q++)
        {
          gint64 c = (gint64) (draw (-3, call, p * 64 + q) % 6);

          if (q < rank)
            first += c;
          n_theirs += c;
        }
      theirs = input_floats (p, call, n_theirs * cols);
      if (memcmp (got + at * cols, theirs + first * cols, recv_counts[p] * cols * sizeof (float)) != 0)
        fail ("all_to_all_rows: the rows from rank %d", p);
      at += recv_counts[p];
    }
  for (gint64 i = at * cols; i < recv_total * cols; i++)
    if (got[i] != 0xffffffffu)
      fail ("all_to_all_rows: a slack row was written");
  g_print ("rank %d: ok all_to_all_rows\n", rank);
}

static void
run_collectives (GmlpCommunicator *comm)
{
  all_reduce_f32 (comm, 1, GMLP_REDUCE_OP_SUM, 13);
  all_reduce_f32 (comm, 2, GMLP_REDUCE_OP_AVERAGE, 9);
  all_reduce_i64 (comm, 3);
  all_gather (comm, 4);
  all_to_all (comm, 5, 1);
  all_to_all_rows (comm, 6);
  /* Larger than the staging areas: several rounds (2 MiB areas). */
  all_reduce_f32 (comm, 7, GMLP_REDUCE_OP_SUM, 600000);
  all_to_all (comm, 8, 2000);
}

/* The ranks disagree on a shape: every rank gets SHAPE_MISMATCH, and the
 * group goes on; then the last rank aborts and the others get ABORTED. */
static void
run_faults (GmlpCommunicator *comm)
{
  GmlpDevice *device = gmlp_communicator_get_device (comm);
  g_autoptr(GError) error = NULL;
  gint64 rows = 2 + rank, one = 1;
  g_autoptr(GmlpGroupedTensor) x = poisoned (device, GMLP_DTYPE_FLOAT32, &rows, 1, 64);
  g_autoptr(GmlpGroupedTensor) y = NULL;
  float v = 1.0f;
  const float *got;
  g_autoptr(GBytes) out = NULL;
  gint64 start;

  if (gmlp_communicator_all_reduce (comm, x, GMLP_REDUCE_OP_SUM, &error) ||
      !g_error_matches (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH))
    fail ("all_reduce of different shapes: %s", error != NULL ? error->message : "no error");
  g_print ("rank %d: ok shape mismatch: %s\n", rank, error->message);
  g_clear_error (&error);

  y = tensor_from (device, GMLP_DTYPE_FLOAT32, &one, 1, 1, &v, sizeof v);
  check_ok (gmlp_communicator_all_reduce (comm, y, GMLP_REDUCE_OP_SUM, &error), error,
            "all_reduce after a mismatch");
  out = download (y);
  got = g_bytes_get_data (out, NULL);
  if (got[0] != (float) world)
    fail ("all_reduce after a mismatch: %g", got[0]);
  g_print ("rank %d: ok the group goes on\n", rank);

  if (rank == world - 1)
    {
      g_usleep (100 * G_TIME_SPAN_MILLISECOND);
      gmlp_communicator_abort (comm);
      g_print ("rank %d: ok aborted\n", rank);
      return;
    }
  start = g_get_monotonic_time ();
  if (gmlp_communicator_all_reduce (comm, y, GMLP_REDUCE_OP_SUM, &error) ||
      !g_error_matches (error, GMLP_ERROR, GMLP_ERROR_ABORTED) ||
      strstr (error->message, "aborted it") == NULL)
    fail ("all_reduce with a rank that aborts: %s", error != NULL ? error->message : "no error");
  /* far sooner than the 20 s timeout */
  if (g_get_monotonic_time () - start > 10 * G_USEC_PER_SEC)
    fail ("the abort took %" G_GINT64_FORMAT " µs", g_get_monotonic_time () - start);
  g_print ("rank %d: ok ABORTED: %s\n", rank, error->message);
}

/* The last rank stays away past the timeout (the launcher's --timeout-ms):
 * the others get ABORTED naming it, within the timeout and not before. */
static void
run_timeout (GmlpCommunicator *comm)
{
  GmlpDevice *device = gmlp_communicator_get_device (comm);
  g_autoptr(GError) error = NULL;
  gint64 one = 1, start;
  float v = 1.0f;
  g_autoptr(GmlpGroupedTensor) y = tensor_from (device, GMLP_DTYPE_FLOAT32, &one, 1, 1, &v, sizeof v);
  guint timeout_ms = gmlp_communicator_get_timeout_ms (comm);
  g_autofree char *missing = g_strdup_printf ("for rank %d", world - 1);

  if (rank == world - 1)
    {
      g_usleep ((timeout_ms + 500) * G_TIME_SPAN_MILLISECOND);
      g_print ("rank %d: ok stayed away\n", rank);
      return;
    }
  start = g_get_monotonic_time ();
  if (gmlp_communicator_all_reduce (comm, y, GMLP_REDUCE_OP_SUM, &error) ||
      !g_error_matches (error, GMLP_ERROR, GMLP_ERROR_ABORTED) ||
      strstr (error->message, missing) == NULL)
    fail ("all_reduce with a rank away: %s", error != NULL ? error->message : "no error");
  if (g_get_monotonic_time () - start < (gint64) timeout_ms * 1000 ||
      g_get_monotonic_time () - start > (gint64) (timeout_ms + 5000) * 1000)
    fail ("the timeout took %" G_GINT64_FORMAT " µs", g_get_monotonic_time () - start);
  g_print ("rank %d: ok ABORTED: %s\n", rank, error->message);
}

/* The last rank drops its communicator and exits with 0: the others get
 * ABORTED naming it at once (far within the 60 s timeout). */
static void
run_leaves (GmlpCommunicator **comm)
{
  GmlpDevice *device = gmlp_communicator_get_device (*comm);
  g_autoptr(GError) error = NULL;
  gint64 one = 1, start;
  float v = 1.0f;
  g_autoptr(GmlpGroupedTensor) y = tensor_from (device, GMLP_DTYPE_FLOAT32, &one, 1, 1, &v, sizeof v);
  g_autofree char *who = g_strdup_printf ("rank %d left it", world - 1);

  if (rank == world - 1)
    {
      g_usleep (100 * G_TIME_SPAN_MILLISECOND);
      g_clear_object (comm);
      g_print ("rank %d: ok left\n", rank);
      return;
    }
  start = g_get_monotonic_time ();
  if (gmlp_communicator_all_reduce (*comm, y, GMLP_REDUCE_OP_SUM, &error) ||
      !g_error_matches (error, GMLP_ERROR, GMLP_ERROR_ABORTED) || strstr (error->message, who) == NULL)
    fail ("all_reduce with a rank that left: %s", error != NULL ? error->message : "no error");
  if (g_get_monotonic_time () - start > 10 * G_USEC_PER_SEC)
    fail ("leaving took %" G_GINT64_FORMAT " µs", g_get_monotonic_time () - start);
  g_print ("rank %d: ok ABORTED: %s\n", rank, error->message);
}

static gpointer
killer (gpointer data)
{
  g_usleep (GPOINTER_TO_INT (data) * G_TIME_SPAN_MILLISECOND);
  raise (SIGKILL);
  return NULL;
}

/* The last rank kills itself (SIGKILL, from a thread) while the group runs
 * all-reduces of several rounds each: the others get ABORTED naming it, at
 * once (far within the 60 s timeout). The launcher sends them SIGTERM,
 * which they ignore (from the start) so as to report. */
static void
run_dies (GmlpCommunicator *comm)
{
  GmlpDevice *device = gmlp_communicator_get_device (comm);
  gint64 rows = 1 << 19, cols = 4, start, n_done = 0;
  g_autoptr(GmlpGroupedTensor) x = poisoned (device, GMLP_DTYPE_FLOAT32, &rows, 1, cols);
  g_autoptr(GError) error = NULL;
  g_autofree char *who = g_strdup_printf ("rank %d (process", world - 1);

  if (rank == world - 1)
    g_thread_unref (g_thread_new ("killer", killer, GINT_TO_POINTER (300)));
  start = g_get_monotonic_time ();
  while (gmlp_communicator_all_reduce (comm, x, GMLP_REDUCE_OP_SUM, &error))
    {
      /* On a GPU the collective is enqueued: it ends when the peers' do, or
       * when the watchdog has aborted NCCL, and the next call fails. */
      if (on_gpu)
        (void) gmlp_device_synchronize (device, NULL);
      n_done++;
      if (g_get_monotonic_time () - start > 30 * G_USEC_PER_SEC)
        fail ("the group still runs after 30 s");
    }
  if (rank == world - 1)
    fail ("the dying rank outlived its collectives: %s", error->message);
  /* The CPU communicator names the rank that died; NCCL's watchdog says
   * what it saw. */
  if (!g_error_matches (error, GMLP_ERROR, GMLP_ERROR_ABORTED) ||
      (!on_gpu && (strstr (error->message, who) == NULL || strstr (error->message, "died") == NULL)))
    fail ("a rank died: %s", error->message);
  g_print ("rank %d: ok ABORTED after %" G_GINT64_FORMAT " collectives: %s\n", rank, n_done,
           error->message);
}

/* Every rank takes its place without joining (g_object_new() makes or opens
 * the CPU group's shared memory; g_initable_init() would join), checks that
 * the memory's name is there, and exits with 1: no rank gets to unlink it,
 * so the launcher must. (The launcher's SIGTERM after the first exit may
 * end the others sooner.) */
static int
run_quits (void)
{
  const char *hex = g_getenv ("GMLP_UNIQUE_ID");
  gsize n = hex != NULL ? strlen (hex) / 2 : 0;
  g_autofree guint8 *id = g_new0 (guint8, MAX (n, 1));
  g_autofree char *path = NULL;
  g_autoptr(GBytes) uid = NULL;
  GmlpCommunicator *comm;

  rank = atoi (g_getenv ("GMLP_RANK"));
  world = atoi (g_getenv ("GMLP_WORLD_SIZE"));
  if (n < 32)
    fail ("GMLP_UNIQUE_ID is too short");
  for (gsize i = 0; i < n; i++)
    id[i] = (guint8) (g_ascii_xdigit_value (hex[2 * i]) << 4 | g_ascii_xdigit_value (hex[2 * i + 1]));
  uid = g_bytes_new (id, n);
  comm = g_object_new (GMLP_TYPE_COMMUNICATOR, "device", gmlp_device_get_default (), "unique-id", uid,
                       "rank", rank, "world-size", world, NULL);
  /* the name test-launch.c looks for: the backend's id after 16 bytes */
  path = g_strdup_printf ("/dev/shm/gmlp-%.32s", hex + 32);
  if (!g_file_test (path, G_FILE_TEST_EXISTS))
    fail ("no %s once the rank is taken", path);
  g_print ("rank %d: ok quitting before the join, id %s\n", rank, hex);
  (void) comm;   /* kept: the exit ends the process as a crash would */
  exit (1);
}

int
main (int   argc,
      char *argv[])
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpCommunicator) comm = NULL;
  const char *mode;

  setlocale (LC_ALL, "");
  if (argc != 3)
    {
      g_printerr ("usage: launch-rank collectives|faults|timeout|dies|fails|sleeps|leaves|quits SEED\n");
      return 2;
    }
  mode = argv[1];
  seed = g_ascii_strtoull (argv[2], NULL, 10);
  rank = -1;

  /* dies: the launcher's SIGTERM must not come before the report */
  if (g_str_equal (mode, "dies"))
    signal (SIGTERM, SIG_IGN);
  if (g_str_equal (mode, "quits"))
    return run_quits ();
  comm = gmlp_communicator_new_from_launcher (&error);
  if (comm == NULL)
    {
      g_print ("rank ?: FAILED gmlp_communicator_new_from_launcher: %s\n", error->message);
      return 1;
    }
  rank = gmlp_communicator_get_rank (comm);
  world = gmlp_communicator_get_world_size (comm);
  on_gpu = gmlp_device_get_kind (gmlp_communicator_get_device (comm)) == GMLP_DEVICE_KIND_CUDA;
  if (rank == 0)
    g_print ("rank 0: id %s\n", g_getenv ("GMLP_UNIQUE_ID"));
  /* The launcher's device is also the process's default. */
  if (gmlp_communicator_get_device (comm) != gmlp_device_get_default () ||
      gmlp_device_get_ordinal (gmlp_communicator_get_device (comm)) != rank)
    fail ("the communicator is not on the default device, ordinal %d", rank);

  if (g_str_equal (mode, "collectives"))
    run_collectives (comm);
  else if (g_str_equal (mode, "faults"))
    run_faults (comm);
  else if (g_str_equal (mode, "timeout"))
    run_timeout (comm);
  else if (g_str_equal (mode, "dies"))
    run_dies (comm);
  else if (g_str_equal (mode, "leaves"))
    run_leaves (&comm);
  else if (g_str_equal (mode, "fails"))
    {
      if (rank == world - 1)
        {
          g_print ("rank %d: ok exiting with 3\n", rank);
          return 3;
        }
      /* The others wait: the launcher stops them. */
      g_usleep (60 * G_USEC_PER_SEC);
      fail ("not stopped by the launcher");
    }
  else if (g_str_equal (mode, "sleeps"))
    {
      g_print ("rank %d: ok sleeping\n", rank);
      g_usleep (60 * G_USEC_PER_SEC);
      fail ("not stopped by the launcher");
    }
  else
    fail ("unknown mode %s", mode);
  return 0;
}
