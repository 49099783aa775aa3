/* test-communicator.c: GmlpCommunicator's collectives against float64
 * references, its bad input and its faults
 *
 * Every group is W threads of this process (W = 2, 3 and 4), rank r on a
 * device of its own: cpu:r on the CPU (the CPU communicator; test-launch.c
 * runs it across processes), cuda:r in the gpu suite (NCCL; skipped
 * without W GPUs or without libnccl; gmlp-test-group.h). The
 * inputs are drawn in the main thread (g_test_rand is not thread-safe),
 * uploaded by each rank; the outputs are poisoned first (0xff bytes: NaN),
 * read back by each rank, and checked in the main thread: sums and averages
 * against the float64 sum of the stored inputs within the rounding of the
 * dtype, and the same bits on every rank; gathered and exchanged data
 * byte for byte. Faults: a rank that errs, leaves or aborts makes the
 * others fail with GMLP_ERROR_ABORTED, within the timeout (on a GPU the
 * collective is enqueued and the failure shows at the next call, after the
 * watchdog has aborted NCCL).
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <locale.h>
#include <math.h>
#include <string.h>

#include "gmlp-test-group.h"
#include "gmlp-test-util.h"

static GBytes *
poison_bytes (gsize n)
{
  guint8 *data = g_malloc (MAX (n, 1));

  memset (data, 0xff, n);
  return g_bytes_new_take (data, n);
}

/* A tensor of rows on device holding 0xff bytes. */
static GmlpGroupedTensor *
poisoned_tensor (GmlpDevice   *device,
                 GmlpDType     dtype,
                 const gint64 *rows,
                 guint         n_groups,
                 gint64        cols)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GBytes) poison = NULL;
  gint64 total = 0;
  guint g;

  for (g = 0; g < n_groups; g++)
    total += rows[g];
  poison = poison_bytes ((gsize) total * cols * gmlp_dtype_get_size (dtype));
  return gmlp_grouped_tensor_new_from_bytes (device, dtype, rows, n_groups, cols, poison, &error);
}

static gsize
packed_bytes (const gint64 *rows,
              guint         n_groups,
              gint64        cols,
              GmlpDType     dtype)
{
  gsize n = 0;
  guint g;

  for (g = 0; g < n_groups; g++)
    n += (gsize) rows[g] * cols * gmlp_dtype_get_size (dtype);
  return n;
}

static GBytes *
random_packed (GmlpDType dtype,
               gsize     n_elements)
{
  if (dtype == GMLP_DTYPE_INT64 || dtype == GMLP_DTYPE_INT32)
    {
      gsize size = gmlp_dtype_get_size (dtype), i;
      guint8 *data = g_malloc (MAX (n_elements * size, 1));

      for (i = 0; i < n_elements; i++)
        {
          gint64 v = g_test_rand_int_range (-1000000, 1000000);

          if (dtype == GMLP_DTYPE_INT64)
            ((gint64 *) data)[i] = v * 1000003;   /* past 32 bits */
          else
            ((gint32 *) data)[i] = (gint32) v;
        }
      return g_bytes_new_take (data, n_elements * size);
    }
  return gmlp_test_random_bytes (dtype, n_elements, 1.0, FALSE);
}

static double
decode (GBytes    *bytes,
        GmlpDType  dtype,
        gsize      i)
{
  const guint8 *data = g_bytes_get_data (bytes, NULL);

  if (dtype == GMLP_DTYPE_INT64)
    return (double) ((const gint64 *) data)[i];
  if (dtype == GMLP_DTYPE_INT32)
    return (double) ((const gint32 *) data)[i];
  return gmlp_test_decode (data, dtype, i);
}

/* All-reduce: every rank's tensor of random rows (member padding between
 * them: 7 columns) becomes the sum or average of all of them. */
typedef struct {
  GmlpDType     dtype;
  GmlpReduceOp  op;
  guint         n_groups;
  gint64        rows[4];
  gint64        cols;
  GBytes       *in[GMLP_TEST_MAX_WORLD];
  GBytes       *out[GMLP_TEST_MAX_WORLD];
} AllReduce;

static void
all_reduce_rank (GmlpTestGroup    *group,
                 int               rank,
                 GmlpCommunicator *comm,
                 gpointer          data)
{
  AllReduce *t = data;
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL;

  x = gmlp_grouped_tensor_new_from_bytes (group->devices[rank], t->dtype, t->rows, t->n_groups,
                                          t->cols, t->in[rank], &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_communicator_all_reduce (comm, x, t->op, &error));
  g_assert_no_error (error);
  t->out[rank] = gmlp_grouped_tensor_to_bytes (x, &error);
  g_assert_no_error (error);
}

static void
check_all_reduce (int           world,
                  GmlpDType     dtype,
                  GmlpReduceOp  op)
{
  GmlpTestGroup group;
  AllReduce t = { .dtype = dtype, .op = op, .n_groups = 3, .cols = 7 };
  gsize n, i;
  int r;
  guint g;

  if (!gmlp_test_group_init (&group, world, 60000))
    return;
  for (g = 0; g < t.n_groups; g++)
    t.rows[g] = g_test_rand_int_range (0, 6);
  n = packed_bytes (t.rows, t.n_groups, t.cols, dtype) / gmlp_dtype_get_size (dtype);
  for (r = 0; r < world; r++)
    t.in[r] = random_packed (dtype, n);

  gmlp_test_group_run (&group, all_reduce_rank, &t);

  for (r = 1; r < world; r++)
    g_assert_true (g_bytes_equal (t.out[r], t.out[0]));   /* the same bits on every rank */
  for (i = 0; i < n; i++)
    {
      double want = 0, magnitude = 0, got = decode (t.out[0], dtype, i), tol;

      for (r = 0; r < world; r++)
        {
          double x = decode (t.in[r], dtype, i);

          want += x;
          magnitude += fabs (x);
        }
      if (op == GMLP_REDUCE_OP_AVERAGE)
        want /= world, magnitude /= world;
      /* Integers exactly; floats rounded once (NCCL: once per step). */
      tol = gmlp_dtype_is_floating (dtype) ? world * ldexp (magnitude, -gmlp_test_format (dtype)->mbits)
                                           : 0;
      if (!(fabs (got - want) <= tol))
        g_error ("all_reduce %s %s on %d ranks [%" G_GSIZE_FORMAT "]: got %.9g, expected %.9g",
                 gmlp_dtype_get_name (dtype), op == GMLP_REDUCE_OP_SUM ? "sum" : "average",
                 world, i, got, want);
    }

  for (r = 0; r < world; r++)
    {
      g_bytes_unref (t.in[r]);
      g_bytes_unref (t.out[r]);
    }
  gmlp_test_group_clear (&group);
}

static void
test_all_reduce (void)
{
  static const GmlpDType dtypes[] = { GMLP_DTYPE_FLOAT32, GMLP_DTYPE_FLOAT16, GMLP_DTYPE_BFLOAT16 };
  int world;
  guint d;

  for (world = 1; world <= GMLP_TEST_MAX_WORLD; world++)
    {
      for (d = 0; d < G_N_ELEMENTS (dtypes); d++)
        {
          check_all_reduce (world, dtypes[d], GMLP_REDUCE_OP_SUM);
          check_all_reduce (world, dtypes[d], GMLP_REDUCE_OP_AVERAGE);
        }
      check_all_reduce (world, GMLP_DTYPE_INT64, GMLP_REDUCE_OP_SUM);
      check_all_reduce (world, GMLP_DTYPE_INT32, GMLP_REDUCE_OP_SUM);
    }
}

/* All-gather: recv holds every rank's send, rank by rank. */
typedef struct {
  GmlpDType  dtype;
  guint      n_groups;
  gint64     rows[3 * GMLP_TEST_MAX_WORLD];
  gint64     cols;
  GBytes    *in[GMLP_TEST_MAX_WORLD];
  GBytes    *out[GMLP_TEST_MAX_WORLD];
} AllGather;

static void
all_gather_rank (GmlpTestGroup    *group,
                 int               rank,
                 GmlpCommunicator *comm,
                 gpointer          data)
{
  AllGather *t = data;
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedTensor) send = NULL, recv = NULL;
  gint64 recv_rows[3 * GMLP_TEST_MAX_WORLD * GMLP_TEST_MAX_WORLD];
  int p;

  for (p = 0; p < group->world; p++)
    memcpy (recv_rows + p * t->n_groups, t->rows, t->n_groups * sizeof (gint64));
  send = gmlp_grouped_tensor_new_from_bytes (group->devices[rank], t->dtype, t->rows, t->n_groups,
                                             t->cols, t->in[rank], &error);
  g_assert_no_error (error);
  recv = poisoned_tensor (group->devices[rank], t->dtype, recv_rows, t->n_groups * group->world, t->cols);
  g_assert_true (gmlp_communicator_all_gather (comm, send, recv, &error));
  g_assert_no_error (error);
  t->out[rank] = gmlp_grouped_tensor_to_bytes (recv, &error);
  g_assert_no_error (error);
}

static void
test_all_gather (void)
{
  static const GmlpDType dtypes[] = { GMLP_DTYPE_FLOAT32, GMLP_DTYPE_BFLOAT16, GMLP_DTYPE_INT64 };
  int world;
  guint d;

  for (world = 1; world <= GMLP_TEST_MAX_WORLD; world++)
    for (d = 0; d < G_N_ELEMENTS (dtypes); d++)
      {
        GmlpTestGroup group;
        AllGather t = { .dtype = dtypes[d], .n_groups = 3, .cols = 5 };
        g_autoptr(GByteArray) want = g_byte_array_new ();
        gsize n;
        int r;
        guint g;

        if (!gmlp_test_group_init (&group, world, 60000))
          return;
        for (g = 0; g < t.n_groups; g++)
          t.rows[g] = g_test_rand_int_range (0, 5);
        n = packed_bytes (t.rows, t.n_groups, t.cols, t.dtype) / gmlp_dtype_get_size (t.dtype);
        for (r = 0; r < world; r++)
          {
            t.in[r] = random_packed (t.dtype, n);
            g_byte_array_append (want, g_bytes_get_data (t.in[r], NULL), g_bytes_get_size (t.in[r]));
          }

        gmlp_test_group_run (&group, all_gather_rank, &t);

        for (r = 0; r < world; r++)
          {
            g_assert_cmpmem (g_bytes_get_data (t.out[r], NULL), g_bytes_get_size (t.out[r]),
                             want->data, want->len);
            g_bytes_unref (t.in[r]);
            g_bytes_unref (t.out[r]);
          }
        gmlp_test_group_clear (&group);
      }
}

/* All-to-all by members: rank p sends k members to each rank q, member j
 * of its block q having sizes[p][q][j] rows (zeros among them). */
#define A2A_K 2

typedef struct {
  GmlpDType  dtype;
  gint64     cols;
  gboolean   start;     /* all_to_all_start(), the caller waiting */
  gint64     sizes[GMLP_TEST_MAX_WORLD][GMLP_TEST_MAX_WORLD][A2A_K];
  GBytes    *in[GMLP_TEST_MAX_WORLD];
  GBytes    *out[GMLP_TEST_MAX_WORLD];
} AllToAll;

static void
all_to_all_rank (GmlpTestGroup    *group,
                 int               rank,
                 GmlpCommunicator *comm,
                 gpointer          data)
{
  AllToAll *t = data;
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedTensor) send = NULL, recv = NULL;
  gint64 send_rows[GMLP_TEST_MAX_WORLD * A2A_K], recv_rows[GMLP_TEST_MAX_WORLD * A2A_K];
  int w = group->world, p, j;

  for (p = 0; p < w; p++)
    for (j = 0; j < A2A_K; j++)
      {
        send_rows[p * A2A_K + j] = t->sizes[rank][p][j];
        recv_rows[p * A2A_K + j] = t->sizes[p][rank][j];
      }
  send = gmlp_grouped_tensor_new_from_bytes (group->devices[rank], t->dtype, send_rows, w * A2A_K,
                                             t->cols, t->in[rank], &error);
  g_assert_no_error (error);
  recv = poisoned_tensor (group->devices[rank], t->dtype, recv_rows, w * A2A_K, t->cols);
  if (t->start)
    {
      g_autoptr(GmlpEvent) done = gmlp_communicator_all_to_all_start (comm, send, recv, &error);

      g_assert_no_error (error);
      g_assert_nonnull (done);
      /* The event keeps send while the rows are in flight. */
      g_clear_object (&send);
      g_assert_true (gmlp_event_wait_on_device (done, group->devices[rank], &error));
    }
  else
    g_assert_true (gmlp_communicator_all_to_all (comm, send, recv, &error));
  g_assert_no_error (error);
  t->out[rank] = gmlp_grouped_tensor_to_bytes (recv, &error);
  g_assert_no_error (error);
}

static void
check_all_to_all (gboolean start)
{
  static const GmlpDType dtypes[] = { GMLP_DTYPE_FLOAT32, GMLP_DTYPE_BFLOAT16 };
  int world;
  guint d;

  for (world = 1; world <= GMLP_TEST_MAX_WORLD; world++)
    for (d = 0; d < G_N_ELEMENTS (dtypes); d++)
      {
        GmlpTestGroup group;
        AllToAll t = { .dtype = dtypes[d], .cols = 6, .start = start };
        gsize row_bytes = t.cols * gmlp_dtype_get_size (t.dtype);
        int p, q, j;

        if (!gmlp_test_group_init (&group, world, 60000))
          return;
        for (p = 0; p < world; p++)
          {
            gsize n = 0;

            for (q = 0; q < world; q++)
              for (j = 0; j < A2A_K; j++)
                n += t.sizes[p][q][j] = g_test_rand_int_range (0, 4);
            t.in[p] = random_packed (t.dtype, n * t.cols);
          }

        gmlp_test_group_run (&group, all_to_all_rank, &t);

        /* Rank q's recv: block p is rank p's block q, packed. */
        for (q = 0; q < world; q++)
          {
            g_autoptr(GByteArray) want = g_byte_array_new ();

            for (p = 0; p < world; p++)
              {
                const guint8 *in = g_bytes_get_data (t.in[p], NULL);
                gsize at = 0, len = 0;
                int b;

                for (b = 0; b < q; b++)
                  for (j = 0; j < A2A_K; j++)
                    at += t.sizes[p][b][j] * row_bytes;
                for (j = 0; j < A2A_K; j++)
                  len += t.sizes[p][q][j] * row_bytes;
                g_byte_array_append (want, in + at, len);
              }
            g_assert_cmpmem (g_bytes_get_data (t.out[q], NULL), g_bytes_get_size (t.out[q]),
                             want->data, want->len);
          }
        for (p = 0; p < world; p++)
          {
            g_bytes_unref (t.in[p]);
            g_bytes_unref (t.out[p]);
          }
        gmlp_test_group_clear (&group);
      }
}

static void
test_all_to_all (void)
{
  check_all_to_all (FALSE);
}

static void
test_all_to_all_start (void)
{
  check_all_to_all (TRUE);
}

/* All-to-all with row counts on the host: counts[p][q] rows from rank p to
 * rank q, each tensor one group with SLACK rows past the counts, which must
 * stay poisoned in recv. */
#define SLACK 2

typedef struct {
  GmlpDType  dtype;
  gint64     cols;
  gboolean   start;     /* all_to_all_rows_start(), the caller waiting */
  gint64     counts[GMLP_TEST_MAX_WORLD][GMLP_TEST_MAX_WORLD];
  GBytes    *in[GMLP_TEST_MAX_WORLD];
  GBytes    *out[GMLP_TEST_MAX_WORLD];
} AllToAllRows;

static void
all_to_all_rows_rank (GmlpTestGroup    *group,
                      int               rank,
                      GmlpCommunicator *comm,
                      gpointer          data)
{
  AllToAllRows *t = data;
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedTensor) send = NULL, recv = NULL;
  gint64 send_counts[GMLP_TEST_MAX_WORLD], recv_counts[GMLP_TEST_MAX_WORLD];
  gint64 send_total = SLACK, recv_total = SLACK;
  int w = group->world, p;

  for (p = 0; p < w; p++)
    {
      send_total += send_counts[p] = t->counts[rank][p];
      recv_total += recv_counts[p] = t->counts[p][rank];
    }
  send = gmlp_grouped_tensor_new_from_bytes (group->devices[rank], t->dtype, &send_total, 1,
                                             t->cols, t->in[rank], &error);
  g_assert_no_error (error);
  recv = poisoned_tensor (group->devices[rank], t->dtype, &recv_total, 1, t->cols);
  if (t->start)
    {
      g_autoptr(GmlpEvent) done = NULL;

      done = gmlp_communicator_all_to_all_rows_start (comm, send, send_counts, w, recv, recv_counts,
                                                      w, &error);
      g_assert_no_error (error);
      g_assert_nonnull (done);
      g_clear_object (&send);
      g_assert_true (gmlp_event_wait_on_device (done, group->devices[rank], &error));
    }
  else
    g_assert_true (gmlp_communicator_all_to_all_rows (comm, send, send_counts, w, recv, recv_counts,
                                                      w, &error));
  g_assert_no_error (error);
  t->out[rank] = gmlp_grouped_tensor_to_bytes (recv, &error);
  g_assert_no_error (error);
}

static void
check_all_to_all_rows (gboolean start)
{
  int world;

  for (world = 1; world <= GMLP_TEST_MAX_WORLD; world++)
    {
      GmlpTestGroup group;
      AllToAllRows t = { .dtype = GMLP_DTYPE_FLOAT16, .cols = 9, .start = start };
      gsize row_bytes = t.cols * gmlp_dtype_get_size (t.dtype);
      int p, q, b;

      if (!gmlp_test_group_init (&group, world, 60000))
        return;
      for (p = 0; p < world; p++)
        {
          gint64 n = SLACK;

          for (q = 0; q < world; q++)
            n += t.counts[p][q] = g_test_rand_int_range (0, 6);
          t.in[p] = random_packed (t.dtype, n * t.cols);
        }

      gmlp_test_group_run (&group, all_to_all_rows_rank, &t);

      for (q = 0; q < world; q++)
        {
          g_autoptr(GByteArray) want = g_byte_array_new ();
          g_autoptr(GBytes) slack = poison_bytes (SLACK * row_bytes);

          for (p = 0; p < world; p++)
            {
              gsize at = 0;

              for (b = 0; b < q; b++)
                at += t.counts[p][b] * row_bytes;
              g_byte_array_append (want, (const guint8 *) g_bytes_get_data (t.in[p], NULL) + at,
                                   t.counts[p][q] * row_bytes);
            }
          g_byte_array_append (want, g_bytes_get_data (slack, NULL), SLACK * row_bytes);
          g_assert_cmpmem (g_bytes_get_data (t.out[q], NULL), g_bytes_get_size (t.out[q]),
                           want->data, want->len);
        }
      for (p = 0; p < world; p++)
        {
          g_bytes_unref (t.in[p]);
          g_bytes_unref (t.out[p]);
        }
      gmlp_test_group_clear (&group);
    }
}

static void
test_all_to_all_rows (void)
{
  check_all_to_all_rows (FALSE);
}

/* The all-to-all whose end the caller waits for: the same rows. */
static void
test_all_to_all_rows_start (void)
{
  check_all_to_all_rows (TRUE);
}

/* A group of one rank: every collective is a copy, and the bad input is
 * refused on the rank that gives it, before anything is written. */
static GmlpCommunicator *
solo (GmlpDevice *device)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GBytes) uid = gmlp_communicator_new_unique_id (device, &error);
  GmlpCommunicator *comm;

  if (uid == NULL)
    {
      g_assert_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED);
      g_test_skip (error->message);
      return NULL;
    }
  comm = gmlp_communicator_new (device, uid, 0, 1, &error);
  g_assert_no_error (error);
  return comm;
}

static void
assert_untouched (GmlpGroupedTensor *t,
                  guint64            version)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GBytes) bytes = gmlp_grouped_tensor_to_bytes (t, &error);
  g_autoptr(GBytes) poison = poison_bytes (g_bytes_get_size (bytes));

  g_assert_no_error (error);
  g_assert_true (g_bytes_equal (bytes, poison));
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (t), ==, version);
}

static void
test_bad_input (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpDevice) other = NULL;
  g_autoptr(GmlpCommunicator) comm = NULL;
  g_autoptr(GmlpGroupedTensor) f32 = NULL, bf16 = NULL, recv = NULL, wide = NULL, other_t = NULL;
  g_autoptr(GmlpGroupedTensor) fp8 = NULL, i32 = NULL, padded = NULL, sized = NULL, sizes = NULL;
  g_autoptr(GError) error = NULL;
  gint64 rows[2] = { 3, 2 }, two_rows[4] = { 3, 2, 3, 2 }, count = 5, big = 6, i64_sizes[2] = { 3, 2 };
  guint64 version;

  if (device == NULL || (comm = solo (device)) == NULL)
    return;

  f32 = poisoned_tensor (device, GMLP_DTYPE_FLOAT32, rows, 2, 4);
  bf16 = poisoned_tensor (device, GMLP_DTYPE_BFLOAT16, rows, 2, 4);
  wide = poisoned_tensor (device, GMLP_DTYPE_FLOAT32, rows, 2, 5);
  recv = poisoned_tensor (device, GMLP_DTYPE_FLOAT32, rows, 2, 4);
  version = gmlp_grouped_tensor_get_version (recv);

  /* dtype, columns, the same storage */
  g_assert_false (gmlp_communicator_all_gather (comm, bf16, recv, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_DTYPE_MISMATCH);
  g_clear_error (&error);
  g_assert_false (gmlp_communicator_all_to_all (comm, wide, recv, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH);
  g_clear_error (&error);
  g_assert_false (gmlp_communicator_all_to_all (comm, recv, recv, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);
  /* the _start calls refuse alike, with no event */
  g_assert_null (gmlp_communicator_all_to_all_start (comm, wide, recv, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH);
  g_clear_error (&error);
  {
    gint64 too_many = 9;

    g_assert_null (gmlp_communicator_all_to_all_rows_start (comm, f32, &too_many, 1, recv, &too_many, 1,
                                                            &error));
    g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
    g_clear_error (&error);
  }

  /* all_gather: recv's groups and rows are world × send's */
  {
    g_autoptr(GmlpGroupedTensor) four = poisoned_tensor (device, GMLP_DTYPE_FLOAT32, two_rows, 4, 4);
    gint64 swapped[2] = { 2, 3 };
    g_autoptr(GmlpGroupedTensor) other_rows = poisoned_tensor (device, GMLP_DTYPE_FLOAT32, swapped, 2, 4);

    g_assert_false (gmlp_communicator_all_gather (comm, f32, four, &error));
    g_assert_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH);
    g_clear_error (&error);
    g_assert_false (gmlp_communicator_all_gather (comm, f32, other_rows, &error));
    g_assert_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH);
    g_clear_error (&error);
    assert_untouched (four, gmlp_grouped_tensor_get_version (four));
  }

  /* another device */
  other = gmlp_device_new_from_string (gmlp_test_on_cuda () ? "cpu" : "cpu:7", &error);
  g_assert_no_error (error);
  other_t = poisoned_tensor (other, GMLP_DTYPE_FLOAT32, rows, 2, 4);
  g_assert_false (gmlp_communicator_all_reduce (comm, other_t, GMLP_REDUCE_OP_SUM, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);
  g_assert_false (gmlp_communicator_all_to_all (comm, other_t, recv, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);

  /* all_reduce: dtypes and ops */
  fp8 = poisoned_tensor (device, GMLP_DTYPE_FLOAT8_E4M3, rows, 2, 16);
  g_assert_false (gmlp_communicator_all_reduce (comm, fp8, GMLP_REDUCE_OP_SUM, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED);
  g_clear_error (&error);
  i32 = poisoned_tensor (device, GMLP_DTYPE_INT32, rows, 2, 4);
  g_assert_false (gmlp_communicator_all_reduce (comm, i32, GMLP_REDUCE_OP_AVERAGE, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED);
  g_clear_error (&error);
  g_assert_false (gmlp_communicator_all_reduce (comm, recv, (GmlpReduceOp) 7, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);

  /* all_to_all_rows: one count per rank, counts within the rows, one
   * matrix */
  {
    gint64 two[2] = { 1, 1 };
    g_autoptr(GmlpGroupedTensor) one = poisoned_tensor (device, GMLP_DTYPE_FLOAT32, &count, 1, 4);
    g_autoptr(GmlpGroupedTensor) one_recv = poisoned_tensor (device, GMLP_DTYPE_FLOAT32, &count, 1, 4);
    guint64 one_version = gmlp_grouped_tensor_get_version (one_recv);

    g_assert_false (gmlp_communicator_all_to_all_rows (comm, one, two, 2, one_recv, two, 2, &error));
    g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
    g_clear_error (&error);
    g_assert_false (gmlp_communicator_all_to_all_rows (comm, one, &big, 1, one_recv, &count, 1, &error));
    g_assert_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH);
    g_clear_error (&error);
    g_assert_false (gmlp_communicator_all_to_all_rows (comm, one, &count, 1, one_recv, &big, 1, &error));
    g_assert_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH);
    g_clear_error (&error);
    padded = poisoned_tensor (device, GMLP_DTYPE_FLOAT32, rows, 2, 4);
    g_assert_false (gmlp_communicator_all_to_all_rows (comm, padded, &count, 1, one_recv, &count, 1, &error));
    g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
    g_clear_error (&error);
    assert_untouched (one_recv, one_version);

    /* Done right, a group of one copies. */
    g_assert_true (gmlp_communicator_all_to_all_rows (comm, one, &count, 1, one_recv, &count, 1, &error));
    g_assert_no_error (error);
  }

  /* all_gather and all_to_all need host sizes */
  sizes = gmlp_grouped_tensor_new_from_ints (device, GMLP_DTYPE_INT64, (gint64[]) { 2 }, 1, 1,
                                             i64_sizes, 2, &error);
  g_assert_no_error (error);
  sized = gmlp_grouped_tensor_new_with_device_sizes (device, GMLP_DTYPE_FLOAT32, sizes, 5, 4, &error);
  g_assert_no_error (error);
  g_assert_false (gmlp_communicator_all_gather (comm, sized, recv, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);
  g_assert_false (gmlp_communicator_all_to_all (comm, f32, sized, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);

  assert_untouched (recv, version);
}

static void
test_construct_errors (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GBytes) uid = NULL, bad = NULL, foreign = NULL;
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedTensor) t = NULL;
  GmlpCommunicator *comm;
  gint64 rows = 2;
  guint8 *data;
  gsize size;

  if (device == NULL)
    return;
  uid = gmlp_communicator_new_unique_id (device, &error);
  if (uid == NULL)
    {
      g_assert_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED);
      g_test_skip (error->message);
      return;
    }

  g_assert_null (gmlp_communicator_new (device, uid, 2, 2, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);
  g_assert_null (gmlp_communicator_new (device, uid, -1, 2, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);
  g_assert_null (gmlp_communicator_new (device, uid, 0, 0, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);

  bad = g_bytes_new_static ("not an id", 9);
  g_assert_null (gmlp_communicator_new (device, bad, 0, 1, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);

  /* An id made for another kind of device. */
  data = g_bytes_unref_to_data (g_bytes_ref (uid), &size);
  memcpy (data + 8, "tpu\0\0\0\0\0", 8);
  foreign = g_bytes_new_take (data, size);
  g_assert_null (gmlp_communicator_new (device, foreign, 0, 1, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_assert_nonnull (strstr (error->message, "tpu"));
  g_clear_error (&error);

  g_assert_null (g_initable_new (GMLP_TYPE_COMMUNICATOR, NULL, &error, "device", device,
                                 "unique-id", uid, "timeout-ms", 0, NULL));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);

  /* g_object_new without a device: an object whose methods fail. */
  comm = g_object_new (GMLP_TYPE_COMMUNICATOR, NULL);
  t = poisoned_tensor (device, GMLP_DTYPE_FLOAT32, &rows, 1, 4);
  g_assert_false (gmlp_communicator_all_reduce (comm, t, GMLP_REDUCE_OP_SUM, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);
  gmlp_communicator_abort (comm);
  g_object_unref (comm);

  /* A rank alone within the timeout: its join fails, it does not hang. */
  if (!gmlp_test_on_cuda ())
    {
      g_autoptr(GBytes) lonely = gmlp_communicator_new_unique_id (device, NULL);
      gint64 start = g_get_monotonic_time ();

      g_assert_null (g_initable_new (GMLP_TYPE_COMMUNICATOR, NULL, &error, "device", device,
                                     "unique-id", lonely, "rank", 1, "world-size", 2,
                                     "timeout-ms", 100, NULL));
      g_assert_error (error, GMLP_ERROR, GMLP_ERROR_ABORTED);
      g_assert_nonnull (strstr (error->message, "rank 0"));
      g_assert_cmpint (g_get_monotonic_time () - start, >=, 100 * 1000);
      g_clear_error (&error);
    }
}

static void
test_properties (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpCommunicator) comm = NULL;
  g_autoptr(GmlpDevice) got_device = NULL;
  g_autoptr(GBytes) uid = NULL, got_uid = NULL;
  g_autoptr(GError) error = NULL;
  int rank, world;
  guint timeout;

  if (device == NULL)
    return;
  uid = gmlp_communicator_new_unique_id (device, &error);
  if (uid == NULL)
    {
      g_test_skip (error->message);
      return;
    }
  /* g_object_new and its properties give a complete object. */
  comm = g_object_new (GMLP_TYPE_COMMUNICATOR, "device", device, "unique-id", uid,
                       "rank", 0, "world-size", 1, "timeout-ms", 123456, NULL);
  /* (A timeout that a first NCCL join on a busy host cannot outlast.) */
  g_initable_init (G_INITABLE (comm), NULL, &error);
  g_assert_no_error (error);
  g_object_get (comm, "device", &got_device, "unique-id", &got_uid, "rank", &rank,
                "world-size", &world, "timeout-ms", &timeout, NULL);
  g_assert_true (got_device == device);
  g_assert_true (g_bytes_equal (got_uid, uid));
  g_assert_cmpint (rank, ==, 0);
  g_assert_cmpint (world, ==, 1);
  g_assert_cmpuint (timeout, ==, 123456);
  g_assert_true (gmlp_communicator_get_device (comm) == device);
  g_assert_cmpint (gmlp_communicator_get_world_size (comm), ==, 1);
  g_assert_cmpuint (gmlp_communicator_get_timeout_ms (comm), ==, 123456);

  /* Two ids differ. */
  {
    g_autoptr(GBytes) again = gmlp_communicator_new_unique_id (device, NULL);
    g_assert_false (g_bytes_equal (again, uid));
  }
}

/* The ranks disagree on a collective's shape (the CPU communicator checks):
 * every rank gets the error, and the group goes on. */
static void
mismatch_rank (GmlpTestGroup    *group,
               int               rank,
               GmlpCommunicator *comm,
               gpointer          data)
{
  g_autoptr(GError) error = NULL;
  gint64 rows = 2 + rank, one = 1;
  g_autoptr(GmlpGroupedTensor) x = poisoned_tensor (group->devices[rank], GMLP_DTYPE_FLOAT32, &rows, 1, 64);
  g_autoptr(GmlpGroupedTensor) y = poisoned_tensor (group->devices[rank], GMLP_DTYPE_FLOAT32, &one, 1, 4);
  g_autoptr(GmlpGroupedTensor) z = poisoned_tensor (group->devices[rank], GMLP_DTYPE_FLOAT32, &one, 1, 4);
  gint64 send_counts[2] = { 0, 1 }, recv_counts[2] = { 0, 0 };

  /* 128 values (whole rows of 256 bytes) on rank 0, 192 on rank 1 */
  g_assert_false (gmlp_communicator_all_reduce (comm, x, GMLP_REDUCE_OP_SUM, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH);
  g_clear_error (&error);
  /* every rank sends one row to rank 1, which expects none */
  g_assert_false (gmlp_communicator_all_to_all_rows (comm, y, send_counts, 2, z, recv_counts, 2, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH);
  g_clear_error (&error);
  g_assert_true (gmlp_communicator_all_reduce (comm, y, GMLP_REDUCE_OP_SUM, &error));
  g_assert_no_error (error);
}

static void
test_mismatch (void)
{
  GmlpTestGroup group;

  if (gmlp_test_on_cuda ())
    {
      g_test_skip ("NCCL does not compare the ranks' shapes");
      return;
    }
  if (!gmlp_test_group_init (&group, 2, 60000))
    return;
  gmlp_test_group_run (&group, mismatch_rank, NULL);
  gmlp_test_group_clear (&group);
}

/* Faults: one rank errs (or leaves, or aborts) instead of taking part;
 * the others get GMLP_ERROR_ABORTED within the timeout, then at once. */
typedef enum {
  FAULT_ERROR,    /* a bad call, then no collective: the others time out */
  FAULT_LEAVE,    /* the communicator is destroyed */
  FAULT_ABORT,    /* gmlp_communicator_abort() */
} Fault;

typedef struct {
  Fault   fault;
  gint64  elapsed_us[GMLP_TEST_MAX_WORLD];
  GError *errors[GMLP_TEST_MAX_WORLD];
  GError *later[GMLP_TEST_MAX_WORLD];
} Faults;

static void
fault_rank (GmlpTestGroup    *group,
            int               rank,
            GmlpCommunicator *comm,
            gpointer          data)
{
  Faults *t = data;
  gint64 rows = 3, start;
  g_autoptr(GmlpGroupedTensor) x = poisoned_tensor (group->devices[rank], GMLP_DTYPE_FLOAT32, &rows, 1, 4);

  if (rank == group->world - 1)
    {
      g_autoptr(GmlpGroupedTensor) half = poisoned_tensor (group->devices[rank], GMLP_DTYPE_FLOAT16,
                                                           &rows, 1, 4);

      switch (t->fault)
        {
        case FAULT_ERROR:
          g_assert_false (gmlp_communicator_all_gather (comm, x, half, &t->errors[rank]));
          g_assert_error (t->errors[rank], GMLP_ERROR, GMLP_ERROR_DTYPE_MISMATCH);
          /* Stays in the group past the others' timeout. */
          g_usleep ((group->timeout_ms + 300) * G_TIME_SPAN_MILLISECOND);
          break;
        case FAULT_LEAVE:
          /* Returns: rank_thread drops the communicator, which leaves. */
          g_usleep (50 * G_TIME_SPAN_MILLISECOND);
          break;
        case FAULT_ABORT:
          g_usleep (50 * G_TIME_SPAN_MILLISECOND);
          gmlp_communicator_abort (comm);
          g_assert_false (gmlp_communicator_all_reduce (comm, x, GMLP_REDUCE_OP_SUM, &t->later[rank]));
          break;
        }
      return;
    }

  start = g_get_monotonic_time ();
  if (gmlp_communicator_all_reduce (comm, x, GMLP_REDUCE_OP_SUM, &t->errors[rank]))
    {
      /* A GPU enqueues the collective; NCCL's kernel waits for the missing
       * rank until the watchdog aborts the communicator, which lets it
       * return: the stream drains, and the next call fails. */
      g_assert_true (gmlp_test_on_cuda ());
      (void) gmlp_device_synchronize (group->devices[rank], NULL);
      g_assert_false (gmlp_communicator_all_reduce (comm, x, GMLP_REDUCE_OP_SUM, &t->errors[rank]));
    }
  t->elapsed_us[rank] = g_get_monotonic_time () - start;
  g_assert_false (gmlp_communicator_all_reduce (comm, x, GMLP_REDUCE_OP_SUM, &t->later[rank]));
}

static void
check_fault (Fault fault,
             int   world,
             guint timeout_ms)
{
  GmlpTestGroup group;
  Faults t = { .fault = fault };
  gint64 longest = 0;
  int r;

  if (!gmlp_test_group_init (&group, world, timeout_ms))
    return;
  gmlp_test_group_run (&group, fault_rank, &t);
  for (r = 0; r < world - 1; r++)
    {
      longest = MAX (longest, t.elapsed_us[r]);
      g_assert_error (t.errors[r], GMLP_ERROR, GMLP_ERROR_ABORTED);
      g_assert_error (t.later[r], GMLP_ERROR, GMLP_ERROR_ABORTED);
      if (gmlp_test_on_cuda ())
        {
          /* NCCL learns of a peer that aborted by the timeout too. */
          g_assert_cmpint (t.elapsed_us[r], <, (gint64) (timeout_ms + 5000) * 1000);
        }
      else if (fault == FAULT_ERROR)
        {
          /* within the timeout (not before it: below) */
          g_assert_cmpint (t.elapsed_us[r], <, (gint64) (timeout_ms + 5000) * 1000);
        }
      else
        {
          /* at once: far sooner than the timeout */
          g_assert_cmpint (t.elapsed_us[r], <, (gint64) timeout_ms * 1000 / 2);
        }
    }
  /* The first rank to time out waited the whole timeout and failed the
   * group for the others, which may have started their wait a little
   * later (under load, some milliseconds). */
  if (fault == FAULT_ERROR && !gmlp_test_on_cuda ())
    g_assert_cmpint (longest, >=, (gint64) timeout_ms * 1000);
  if (fault == FAULT_ABORT)
    g_assert_error (t.later[world - 1], GMLP_ERROR, GMLP_ERROR_ABORTED);
  for (r = 0; r < world; r++)
    {
      g_clear_error (&t.errors[r]);
      g_clear_error (&t.later[r]);
    }
  gmlp_test_group_clear (&group);
}

static void
test_rank_errors (void)
{
  check_fault (FAULT_ERROR, 2, 200);
  check_fault (FAULT_ERROR, 3, 200);
}

static void
test_rank_leaves (void)
{
  if (gmlp_test_on_cuda ())
    {
      g_test_skip ("NCCL learns of a rank that left by the timeout");
      return;
    }
  check_fault (FAULT_LEAVE, 3, 20000);
}

static void
test_abort (void)
{
  /* On the CPU the others fail at once, far within the timeout; on GPUs
   * by their watchdog's timeout. */
  guint timeout_ms = gmlp_test_on_cuda () ? 1000 : 20000;

  check_fault (FAULT_ABORT, 2, timeout_ms);
  check_fault (FAULT_ABORT, 4, timeout_ms);
}

/* Data-parallel gradients: each rank's layer all-reduces its weight
 * gradient from its wgrad-ready handler, stream-ordered after the signal's
 * event; every rank then holds the average of the ranks' dyᵀ x. */
#define DP_GROUPS 2
#define DP_IN     8
#define DP_OUT    6

typedef struct {
  gint64   rows[DP_GROUPS];
  double  *x[GMLP_TEST_MAX_WORLD];
  double  *dy[GMLP_TEST_MAX_WORLD];
  double  *wgrad[GMLP_TEST_MAX_WORLD];
  guint    n_signals[GMLP_TEST_MAX_WORLD];
} DataParallel;

typedef struct {
  GmlpCommunicator *comm;
  DataParallel     *t;
  int               rank;
} DpHandler;

static void
on_wgrad_ready (GmlpGroupedLinear *layer,
                GmlpEvent         *event,
                DpHandler         *h)
{
  g_autoptr(GError) error = NULL;

  g_assert_true (gmlp_event_wait_on_device (event, gmlp_communicator_get_device (h->comm), &error));
  g_assert_true (gmlp_communicator_all_reduce (h->comm, gmlp_grouped_linear_get_wgrad (layer),
                                               GMLP_REDUCE_OP_AVERAGE, &error));
  g_assert_no_error (error);
  h->t->n_signals[h->rank]++;
}

static GmlpGroupedTensor *
upload_f32 (GmlpDevice   *device,
            const double *values,
            const gint64 *rows,
            gint64        cols)
{
  g_autoptr(GBytes) bytes = gmlp_test_encode_values (values, (gsize) (rows[0] + rows[1]) * cols,
                                                     GMLP_DTYPE_FLOAT32);
  g_autoptr(GError) error = NULL;
  GmlpGroupedTensor *t = gmlp_grouped_tensor_new_from_bytes (device, GMLP_DTYPE_FLOAT32, rows, DP_GROUPS,
                                                             cols, bytes, &error);

  g_assert_no_error (error);
  return t;
}

static void
data_parallel_rank (GmlpTestGroup    *group,
                    int               rank,
                    GmlpCommunicator *comm,
                    gpointer          data)
{
  DataParallel *t = data;
  GmlpDevice *device = group->devices[rank];
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedLinear) layer = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, y = NULL, dx = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  DpHandler h = { comm, t, rank };

  layer = gmlp_grouped_linear_new_full (device, DP_GROUPS, DP_IN, DP_OUT, GMLP_DTYPE_FLOAT32,
                                        GMLP_LINEAR_SINGLE_GROUPED_WEIGHT, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_grouped_linear_init_parameters (layer, 42, &error));
  g_signal_connect (layer, "wgrad-ready", G_CALLBACK (on_wgrad_ready), &h);
  x = upload_f32 (device, t->x[rank], t->rows, DP_IN);
  dy = upload_f32 (device, t->dy[rank], t->rows, DP_OUT);
  y = gmlp_grouped_linear_forward (layer, x, &saved, &error);
  g_assert_no_error (error);
  dx = gmlp_grouped_linear_backward (layer, saved, dy, &error);
  g_assert_no_error (error);
  t->wgrad[rank] = gmlp_test_download (gmlp_grouped_linear_get_wgrad (layer), NULL);
  g_signal_handlers_disconnect_by_data (layer, &h);
}

static void
test_wgrad_ready (void)
{
  int world;

  for (world = 2; world <= 3; world++)
    {
      GmlpTestGroup group;
      DataParallel t = { .rows = { 5, 3 } };
      g_autofree double *want = g_new0 (double, DP_GROUPS * DP_OUT * DP_IN);
      gsize n_rows = t.rows[0] + t.rows[1];
      int r;

      if (!gmlp_test_group_init (&group, world, 60000))
        return;
      for (r = 0; r < world; r++)
        {
          gint64 first = 0;
          guint g;

          t.x[r] = gmlp_test_normals (n_rows * DP_IN, 1.0, GMLP_DTYPE_FLOAT32);
          t.dy[r] = gmlp_test_normals (n_rows * DP_OUT, 1.0, GMLP_DTYPE_FLOAT32);
          /* dW_g = dy_gᵀ x_g, averaged over the ranks */
          for (g = 0; g < DP_GROUPS; first += t.rows[g], g++)
            for (gint64 i = 0; i < DP_OUT; i++)
              for (gint64 j = 0; j < DP_IN; j++)
                for (gint64 m = first; m < first + t.rows[g]; m++)
                  want[(g * DP_OUT + i) * DP_IN + j] +=
                    t.dy[r][m * DP_OUT + i] * t.x[r][m * DP_IN + j] / world;
        }

      gmlp_test_group_run (&group, data_parallel_rank, &t);

      for (r = 0; r < world; r++)
        {
          g_assert_cmpuint (t.n_signals[r], ==, 1);
          gmlp_test_assert_close (t.wgrad[r], want, DP_GROUPS * DP_OUT * DP_IN,
                                  gmlp_test_tolerance (GMLP_DTYPE_FLOAT32), "averaged wgrad");
          g_free (t.x[r]);
          g_free (t.dy[r]);
          g_free (t.wgrad[r]);
        }
      gmlp_test_group_clear (&group);
    }
}

int
main (int    argc,
      char **argv)
{
  setlocale (LC_ALL, "");
  g_test_init (&argc, &argv, NULL);
  gmlp_test_prepare_threads ();

  g_test_add_func ("/Gmlp/Communicator/properties", test_properties);
  g_test_add_func ("/Gmlp/Communicator/construct-errors", test_construct_errors);
  g_test_add_func ("/Gmlp/Communicator/bad-input", test_bad_input);
  g_test_add_func ("/Gmlp/Communicator/all-reduce", test_all_reduce);
  g_test_add_func ("/Gmlp/Communicator/all-gather", test_all_gather);
  g_test_add_func ("/Gmlp/Communicator/all-to-all", test_all_to_all);
  g_test_add_func ("/Gmlp/Communicator/all-to-all-rows", test_all_to_all_rows);
  g_test_add_func ("/Gmlp/Communicator/all-to-all/start", test_all_to_all_start);
  g_test_add_func ("/Gmlp/Communicator/all-to-all-rows/start", test_all_to_all_rows_start);
  g_test_add_func ("/Gmlp/Communicator/wgrad-ready", test_wgrad_ready);
  g_test_add_func ("/Gmlp/Communicator/mismatch", test_mismatch);
  g_test_add_func ("/Gmlp/Communicator/rank-errors", test_rank_errors);
  g_test_add_func ("/Gmlp/Communicator/rank-leaves", test_rank_leaves);
  g_test_add_func ("/Gmlp/Communicator/abort", test_abort);

  return g_test_run ();
}
