/* test-row-chunks.c: moving chunks of rows between layouts
 * (gmlp-row-chunks-private.h) against a model of the documented rule
 *
 * The data move as bytes, so the reference is exact: every result is
 * compared byte for byte with what the rule says, worked out here from the
 * inputs as packed rows. Outputs are fresh memory (GMLP_DEBUG=poison fills it),
 * so a row left unwritten fails. On a GPU every case also runs on the CPU
 * backend, the reference implementation, and both must agree.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <locale.h>
#include <string.h>

#include "gmlp-test-util.h"
#include "gmlp-device-private.h"
#include "gmlp-grouped-tensor-private.h"
#include "gmlp-row-chunks-private.h"

static const GmlpDType dtypes[] = {
  GMLP_DTYPE_FLOAT32, GMLP_DTYPE_BFLOAT16, GMLP_DTYPE_FLOAT8_E4M3, GMLP_DTYPE_INT64,
};

static GmlpGroupedTensor *
ints (GmlpDevice   *device,
      const gint64 *values,
      gint64        n)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GBytes) bytes = g_bytes_new (values, n * sizeof (gint64));
  GmlpGroupedTensor *t = gmlp_grouped_tensor_new_from_bytes (device, GMLP_DTYPE_INT64, &n, 1, 1,
                                                             bytes, &error);

  g_assert_no_error (error);
  return t;
}

static gint64 *
read_ints (GmlpGroupedTensor *t)
{
  gsize n;

  return gmlp_test_download_i64 (t, &n);
}

static GBytes *
random_rows (gint64 rows,
             gsize  row_bytes)
{
  guint8 *data = g_malloc (MAX (rows * row_bytes, 1));
  gsize i;

  for (i = 0; i < rows * row_bytes; i++)
    data[i] = (guint8) g_test_rand_int_range (0, 256);
  return g_bytes_new_take (data, rows * row_bytes);
}

/* A tensor of @n groups of @rows (host sizes) with random bytes. */
static GmlpGroupedTensor *
host_tensor (GmlpDevice    *device,
             GmlpDType      dtype,
             gint64         cols,
             const gint64  *rows,
             guint          n)
{
  g_autoptr(GError) error = NULL;
  gsize row_bytes = cols * gmlp_dtype_get_size (dtype);
  gint64 total = 0;
  g_autoptr(GBytes) bytes = NULL;
  GmlpGroupedTensor *t;
  guint g;

  for (g = 0; g < n; g++)
    total += rows[g];
  bytes = random_rows (total, row_bytes);
  t = gmlp_grouped_tensor_new_from_bytes (device, dtype, rows, n, cols, bytes, &error);
  g_assert_no_error (error);
  return t;
}

/* A tensor with device sizes @sizes (a fresh copy of them) holding random
 * rows, and room for @capacity rows. */
static GmlpGroupedTensor *
members_tensor (GmlpDevice          *device,
                GmlpDType            dtype,
                gint64               cols,
                const gint64        *sizes,
                guint                n,
                gint64               capacity,
                GmlpGroupedTensor  **sizes_out)
{
  g_autoptr(GmlpGroupedTensor) host = host_tensor (device, dtype, cols, sizes, n);
  g_autoptr(GmlpGroupedTensor) sizes_t = ints (device, sizes, n);
  GmlpGroupedTensor *t = gmlp_test_device_sized_copy (host, sizes_t, capacity);

  if (sizes_out != NULL)
    *sizes_out = g_object_ref (sizes_t);
  return t;
}

/* An empty (poisoned) tensor with device sizes from a fresh sizes tensor
 * of @n values (poisoned too: SET_SIZES writes them). */
static GmlpGroupedTensor *
fresh_members (GmlpDevice  *device,
               GmlpDType    dtype,
               gint64       cols,
               guint        n,
               gint64       capacity)
{
  g_autoptr(GError) error = NULL;
  gint64 one = n;
  g_autoptr(GmlpGroupedTensor) sizes = gmlp_grouped_tensor_new (device, GMLP_DTYPE_INT64, &one, 1, 1,
                                                                &error);
  GmlpGroupedTensor *t;

  g_assert_no_error (error);
  t = gmlp_grouped_tensor_new_with_device_sizes (device, dtype, sizes, capacity, cols, &error);
  g_assert_no_error (error);
  return t;
}

/* The rows of every group of @t, packed (device sizes read back). */
static guint8 *
packed_rows (GmlpGroupedTensor *t,
             gint64           **rows_out)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GBytes) bytes = gmlp_grouped_tensor_to_bytes (t, &error);
  gint64 *rows;

  g_assert_no_error (error);
  rows = gmlp_grouped_tensor_read_sizes (t, &(guint) { 0 }, &error);
  g_assert_no_error (error);
  *rows_out = rows;
  return g_bytes_unref_to_data (g_bytes_ref (bytes), &(gsize) { 0 });
}

static void
move_ok (GmlpGroupedTensor *counts,
         guint              n_a,
         guint              n_b,
         gint64             max_rows,
         GmlpGroupedTensor *src,
         GmlpChunkLayout    src_layout,
         GmlpGroupedTensor *dst,
         GmlpChunkLayout    dst_layout,
         GmlpMoveRowsFlags  flags,
         GmlpGroupedTensor *kept,
         GmlpGroupedTensor *dropped)
{
  g_autoptr(GError) error = NULL;
  GmlpChunkSide s = { src, src_layout }, d = { dst, dst_layout };

  g_assert_true (gmlp_row_chunks_move (counts, n_a, n_b, max_rows, &s, &d, flags, kept, dropped,
                                       &error));
  g_assert_no_error (error);
}

/* Members (a, b) → packed → grouped by b → packed → members: every step
 * against the rule, for random sizes with empty chunks. */
static void
run_round_trip (GmlpDevice *device,
                GmlpDType   dtype,
                gint64      cols,
                guint       n_a,
                guint       n_b)
{
  guint n = n_a * n_b, a, b, c;
  gsize row_bytes = cols * gmlp_dtype_get_size (dtype);
  g_autofree gint64 *counts = gmlp_test_random_rows (n, 7);
  g_autofree gint64 *src_rows = NULL, *col_rows = NULL, *kept_read = NULL, *dropped_read = NULL;
  g_autofree gint64 *packed_before = g_new0 (gint64, n + 1);
  g_autofree guint8 *src_bytes = NULL, *bybytes = NULL;
  g_autoptr(GmlpGroupedTensor) counts_t = NULL, src = NULL, packed = NULL, byb = NULL;
  g_autoptr(GmlpGroupedTensor) packed2 = NULL, back = NULL, kept = NULL, dropped = NULL;
  g_autoptr(GBytes) p1 = NULL, p2 = NULL;
  gint64 total = 0, start = 5, slack = 3, total_rows;
  g_autofree gint64 *back_rows = NULL;
  g_autofree guint8 *back_bytes = NULL;
  g_autoptr(GError) error = NULL;

  for (c = 0; c < n; c++)
    {
      packed_before[c] = total;
      total += counts[c];
    }
  src = members_tensor (device, dtype, cols, counts, n, total + 2, &counts_t);
  src_bytes = packed_rows (src, &src_rows);
  total_rows = total + slack;
  packed = host_tensor (device, dtype, cols, &total_rows, 1);
  kept = gmlp_grouped_tensor_new (device, GMLP_DTYPE_INT64, &(gint64) { n }, 1, 1, &error);
  g_assert_no_error (error);
  dropped = ints (device, &start, 1);

  /* Members → packed: the members' rows in order. */
  move_ok (counts_t, n_a, n_b, -1, src, GMLP_CHUNK_LAYOUT_MEMBERS, packed, GMLP_CHUNK_LAYOUT_PACKED,
           0, kept, dropped);
  p1 = gmlp_grouped_tensor_to_bytes (packed, &error);
  g_assert_no_error (error);
  g_assert_cmpmem (g_bytes_get_data (p1, NULL), total * row_bytes, src_bytes, total * row_bytes);
  kept_read = read_ints (kept);
  g_assert_cmpmem (kept_read, n * sizeof (gint64), counts, n * sizeof (gint64));
  dropped_read = read_ints (dropped);
  g_assert_cmpint (dropped_read[0], ==, start);

  /* Packed → grouped by b, its sizes set: group b is chunks (0, b),
   * (1, b), … */
  byb = fresh_members (device, dtype, cols, n_b, total);
  move_ok (counts_t, n_a, n_b, -1, packed, GMLP_CHUNK_LAYOUT_PACKED, byb,
           GMLP_CHUNK_LAYOUT_MEMBERS_BY_B, GMLP_MOVE_ROWS_SET_SIZES, NULL, NULL);
  bybytes = packed_rows (byb, &col_rows);
  {
    gsize at = 0;

    for (b = 0; b < n_b; b++)
      {
        gint64 sum = 0;

        for (a = 0; a < n_a; a++)
          {
            c = a * n_b + b;
            g_assert_cmpmem (bybytes + at, counts[c] * row_bytes,
                             src_bytes + packed_before[c] * row_bytes, counts[c] * row_bytes);
            at += counts[c] * row_bytes;
            sum += counts[c];
          }
        g_assert_cmpint (col_rows[b], ==, sum);
      }
  }

  /* And back: grouped by b → packed → members (sizes as the source's). */
  packed2 = host_tensor (device, dtype, cols, &total_rows, 1);
  move_ok (counts_t, n_a, n_b, -1, byb, GMLP_CHUNK_LAYOUT_MEMBERS_BY_B, packed2,
           GMLP_CHUNK_LAYOUT_PACKED, 0, NULL, NULL);
  p2 = gmlp_grouped_tensor_to_bytes (packed2, &error);
  g_assert_no_error (error);
  g_assert_cmpmem (g_bytes_get_data (p2, NULL), total * row_bytes, src_bytes, total * row_bytes);

  back = fresh_members (device, dtype, cols, n, total + 2);
  move_ok (counts_t, n_a, n_b, -1, packed2, GMLP_CHUNK_LAYOUT_PACKED, back,
           GMLP_CHUNK_LAYOUT_MEMBERS, GMLP_MOVE_ROWS_SET_SIZES, NULL, NULL);
  back_bytes = packed_rows (back, &back_rows);
  g_assert_cmpmem (back_rows, n * sizeof (gint64), counts, n * sizeof (gint64));
  g_assert_cmpmem (back_bytes, total * row_bytes, src_bytes, total * row_bytes);
}

static void
test_round_trip (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint i, n_a;

  if (device == NULL)
    return;
  for (i = 0; i < G_N_ELEMENTS (dtypes); i++)
    for (n_a = 1; n_a <= 4; n_a++)
      {
        /* Odd widths too: rows that are not whole 16-byte vectors. */
        run_round_trip (device, dtypes[i], g_test_rand_int_range (1, 40), n_a,
                        g_test_rand_int_range (1, 6));
        run_round_trip (device, dtypes[i], 64, n_a, g_test_rand_int_range (1, 6));
      }
}

/* Members → slots of C rows: each chunk keeps min (count, C, limit); the
 * rest is dropped and counted. Slots → members of the original sizes with
 * ZERO_REST: the kept rows back, zeros after them. */
static void
run_slots (GmlpDevice *device,
           GmlpDType   dtype,
           gint64      cols,
           guint       n_a,
           guint       n_b,
           gint64      slot_rows,
           gint64      max_rows)
{
  guint n = n_a * n_b, c;
  gsize row_bytes = cols * gmlp_dtype_get_size (dtype);
  g_autofree gint64 *counts = gmlp_test_random_rows (n, 9);
  g_autofree gint64 *slots_rows = g_new (gint64, n), *src_rows = NULL, *kept_read = NULL;
  g_autofree gint64 *dropped_read = NULL, *back_rows = NULL;
  g_autofree guint8 *src_bytes = NULL, *back_bytes = NULL;
  g_autoptr(GmlpGroupedTensor) counts_t = NULL, src = NULL, slots = NULL, kept = NULL;
  g_autoptr(GmlpGroupedTensor) dropped = NULL, back = NULL, sizes2 = NULL;
  g_autoptr(GBytes) slot_bytes = NULL;
  g_autoptr(GError) error = NULL;
  gint64 total = 0, expect_dropped = 0, zero = 0, limit;
  gsize at = 0;

  limit = max_rows >= 0 ? MIN (max_rows, slot_rows) : slot_rows;
  for (c = 0; c < n; c++)
    {
      slots_rows[c] = slot_rows;
      total += counts[c];
      expect_dropped += counts[c] - MIN (counts[c], limit);
    }
  src = members_tensor (device, dtype, cols, counts, n, total, &counts_t);
  src_bytes = packed_rows (src, &src_rows);
  slots = host_tensor (device, dtype, cols, slots_rows, n);
  kept = gmlp_grouped_tensor_new (device, GMLP_DTYPE_INT64, &(gint64) { n }, 1, 1, &error);
  g_assert_no_error (error);
  dropped = ints (device, &zero, 1);

  move_ok (counts_t, n_a, n_b, max_rows, src, GMLP_CHUNK_LAYOUT_MEMBERS, slots,
           GMLP_CHUNK_LAYOUT_SLOTS, 0, kept, dropped);
  kept_read = read_ints (kept);
  dropped_read = read_ints (dropped);
  g_assert_cmpint (dropped_read[0], ==, expect_dropped);
  slot_bytes = gmlp_grouped_tensor_to_bytes (slots, &error);
  g_assert_no_error (error);
  for (c = 0; c < n; c++)
    {
      g_assert_cmpint (kept_read[c], ==, MIN (counts[c], limit));
      g_assert_cmpmem ((const guint8 *) g_bytes_get_data (slot_bytes, NULL) + c * slot_rows * row_bytes,
                       kept_read[c] * row_bytes, src_bytes + at, kept_read[c] * row_bytes);
      at += counts[c] * row_bytes;
    }

  /* Back into members of the original sizes: the kept rows, then zeros. */
  sizes2 = ints (device, counts, n);
  back = gmlp_grouped_tensor_new_with_device_sizes (device, dtype, sizes2, total, cols, &error);
  g_assert_no_error (error);
  move_ok (kept, n_a, n_b, -1, slots, GMLP_CHUNK_LAYOUT_SLOTS, back, GMLP_CHUNK_LAYOUT_MEMBERS,
           GMLP_MOVE_ROWS_ZERO_REST, NULL, NULL);
  back_bytes = packed_rows (back, &back_rows);
  at = 0;
  for (c = 0; c < n; c++)
    {
      g_autofree guint8 *zeros = g_malloc0 (MAX (counts[c] * row_bytes, 1));

      g_assert_cmpmem (back_bytes + at, kept_read[c] * row_bytes, src_bytes + at,
                       kept_read[c] * row_bytes);
      g_assert_cmpmem (back_bytes + at + kept_read[c] * row_bytes,
                       (counts[c] - kept_read[c]) * row_bytes, zeros,
                       (counts[c] - kept_read[c]) * row_bytes);
      at += counts[c] * row_bytes;
    }
}

static void
test_slots (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint i, n_a;

  if (device == NULL)
    return;
  for (i = 0; i < G_N_ELEMENTS (dtypes); i++)
    for (n_a = 1; n_a <= 4; n_a++)
      {
        run_slots (device, dtypes[i], g_test_rand_int_range (1, 40), n_a,
                   g_test_rand_int_range (1, 6), 4, -1);
        run_slots (device, dtypes[i], 128, n_a, g_test_rand_int_range (1, 6), 5, 2);
        run_slots (device, dtypes[i], 7, n_a, 3, 0, -1);
      }
}

/* Negative counts move nothing and drop nothing; counts past a group are
 * cut to it and the rest is counted as dropped. */
static void
test_limits (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  const gint64 sizes[] = { 3, 0, 2, 4 }, counts[] = { -2, 5, 2, 1 };
  g_autoptr(GmlpGroupedTensor) sizes_t = NULL, src = NULL, counts_t = NULL, dst = NULL;
  g_autoptr(GmlpGroupedTensor) kept = NULL, dropped = NULL;
  g_autofree gint64 *kept_read = NULL, *dropped_read = NULL, *rows = NULL, *dst_rows = NULL;
  g_autofree guint8 *src_bytes = NULL, *dst_bytes = NULL;
  gint64 zero = 0, dst_total = 12;
  g_autoptr(GError) error = NULL;

  if (device == NULL)
    return;
  src = members_tensor (device, GMLP_DTYPE_FLOAT32, 8, sizes, 4, 9, &sizes_t);
  src_bytes = packed_rows (src, &rows);
  counts_t = ints (device, counts, 4);
  dst = host_tensor (device, GMLP_DTYPE_FLOAT32, 8, &dst_total, 1);
  kept = gmlp_grouped_tensor_new (device, GMLP_DTYPE_INT64, &(gint64) { 4 }, 1, 1, &error);
  dropped = ints (device, &zero, 1);
  move_ok (counts_t, 2, 2, -1, src, GMLP_CHUNK_LAYOUT_MEMBERS, dst, GMLP_CHUNK_LAYOUT_PACKED, 0,
           kept, dropped);
  kept_read = read_ints (kept);
  dropped_read = read_ints (dropped);
  /* Chunk 0: nothing (negative); chunk 1: its group is empty, 5 dropped;
   * chunk 2: 2 of 2; chunk 3: 1 of 4. */
  g_assert_cmpint (kept_read[0], ==, 0);
  g_assert_cmpint (kept_read[1], ==, 0);
  g_assert_cmpint (kept_read[2], ==, 2);
  g_assert_cmpint (kept_read[3], ==, 1);
  g_assert_cmpint (dropped_read[0], ==, 5);
  /* PACKED places by the counts kept before the groups cut them: chunk 2
   * after chunk 1's 5 rows. */
  dst_bytes = packed_rows (dst, &dst_rows);
  g_assert_cmpmem (dst_bytes + 5 * 32, 2 * 32, src_bytes + 3 * 32, 2 * 32);
  g_assert_cmpmem (dst_bytes + 7 * 32, 32, src_bytes + 5 * 32, 32);
}

static void
assert_move_fails (GmlpGroupedTensor *counts,
                   guint              n_a,
                   guint              n_b,
                   GmlpGroupedTensor *src,
                   GmlpChunkLayout    src_layout,
                   GmlpGroupedTensor *dst,
                   GmlpChunkLayout    dst_layout,
                   GmlpMoveRowsFlags  flags,
                   int                code)
{
  g_autoptr(GError) error = NULL;
  GmlpChunkSide s = { src, src_layout }, d = { dst, dst_layout };
  guint64 version = gmlp_grouped_tensor_get_version (dst);

  g_assert_false (gmlp_row_chunks_move (counts, n_a, n_b, -1, &s, &d, flags, NULL, NULL, &error));
  g_assert_error (error, GMLP_ERROR, code);
  g_test_message ("refused: %s", error->message);
  /* Nothing was enqueued. */
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (dst), ==, version);
}

static void
test_bad_input (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpDevice) other = NULL;
  const gint64 sizes[] = { 1, 2, 3, 4 }, six = 6, ten = 10;
  g_autoptr(GmlpGroupedTensor) sizes_t = NULL, members = NULL, packed = NULL, counts3 = NULL;
  g_autoptr(GmlpGroupedTensor) packed16 = NULL, byb = NULL, elsewhere = NULL;
  g_autoptr(GError) error = NULL;

  if (device == NULL)
    return;
  members = members_tensor (device, GMLP_DTYPE_FLOAT32, 4, sizes, 4, 10, &sizes_t);
  packed = host_tensor (device, GMLP_DTYPE_FLOAT32, 4, &ten, 1);
  packed16 = host_tensor (device, GMLP_DTYPE_BFLOAT16, 4, &ten, 1);
  counts3 = ints (device, sizes, 3);
  byb = fresh_members (device, GMLP_DTYPE_FLOAT32, 4, 2, 10);

  /* Counts of another grid; layouts of another grid. */
  assert_move_fails (counts3, 2, 2, members, GMLP_CHUNK_LAYOUT_MEMBERS, packed,
                     GMLP_CHUNK_LAYOUT_PACKED, 0, GMLP_ERROR_SHAPE_MISMATCH);
  assert_move_fails (sizes_t, 2, 2, members, GMLP_CHUNK_LAYOUT_MEMBERS_BY_B, packed,
                     GMLP_CHUNK_LAYOUT_PACKED, 0, GMLP_ERROR_SHAPE_MISMATCH);
  assert_move_fails (sizes_t, 2, 2, packed, GMLP_CHUNK_LAYOUT_MEMBERS, members,
                     GMLP_CHUNK_LAYOUT_MEMBERS, 0, GMLP_ERROR_SHAPE_MISMATCH);
  assert_move_fails (sizes_t, 2, 2, members, GMLP_CHUNK_LAYOUT_MEMBERS, packed,
                     GMLP_CHUNK_LAYOUT_SLOTS, 0, GMLP_ERROR_SHAPE_MISMATCH);
  assert_move_fails (sizes_t, 0, 4, members, GMLP_CHUNK_LAYOUT_MEMBERS, packed,
                     GMLP_CHUNK_LAYOUT_PACKED, 0, GMLP_ERROR_INVALID_ARGUMENT);
  /* Another dtype; flags on a packed destination; the same storage. */
  assert_move_fails (sizes_t, 2, 2, members, GMLP_CHUNK_LAYOUT_MEMBERS, packed16,
                     GMLP_CHUNK_LAYOUT_PACKED, 0, GMLP_ERROR_DTYPE_MISMATCH);
  assert_move_fails (sizes_t, 2, 2, members, GMLP_CHUNK_LAYOUT_MEMBERS, packed,
                     GMLP_CHUNK_LAYOUT_PACKED, GMLP_MOVE_ROWS_ZERO_REST, GMLP_ERROR_INVALID_ARGUMENT);
  assert_move_fails (sizes_t, 2, 2, packed, GMLP_CHUNK_LAYOUT_PACKED, packed,
                     GMLP_CHUNK_LAYOUT_PACKED, 0, GMLP_ERROR_INVALID_ARGUMENT);
  /* The destination's sizes are the counts: they would be overwritten
   * while read. */
  {
    g_autoptr(GmlpGroupedTensor) own = gmlp_grouped_tensor_new_with_device_sizes (
        device, GMLP_DTYPE_FLOAT32, sizes_t, 10, 4, &error);

    g_assert_no_error (error);
    assert_move_fails (sizes_t, 2, 2, packed, GMLP_CHUNK_LAYOUT_PACKED, own,
                       GMLP_CHUNK_LAYOUT_MEMBERS, GMLP_MOVE_ROWS_SET_SIZES,
                       GMLP_ERROR_INVALID_ARGUMENT);
  }
  /* A tensor on another device. */
  if (g_str_has_prefix (gmlp_device_get_name (device), "cpu"))
    {
      other = gmlp_device_new_from_string ("cpu:1", &error);
      g_assert_no_error (error);
      elsewhere = host_tensor (other, GMLP_DTYPE_FLOAT32, 4, &six, 1);
      assert_move_fails (sizes_t, 2, 2, members, GMLP_CHUNK_LAYOUT_MEMBERS, elsewhere,
                         GMLP_CHUNK_LAYOUT_PACKED, 0, GMLP_ERROR_INVALID_ARGUMENT);
    }
}

/* On a GPU: a large case, its bytes equal the CPU backend's. */
static void
test_same_as_cpu (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpDevice) cpu = NULL;
  g_autoptr(GError) error = NULL;
  const guint n_a = 4, n_b = 16, n = n_a * n_b;
  const gint64 cols = 4096;
  g_autofree gint64 *counts = gmlp_test_random_rows (n, 300);
  g_autofree gint64 *r1 = NULL, *r2 = NULL;
  g_autofree guint8 *b1 = NULL, *b2 = NULL;
  g_autoptr(GBytes) data = NULL;
  g_autoptr(GmlpGroupedTensor) h1 = NULL, h2 = NULL, s1 = NULL, s2 = NULL, d1 = NULL, d2 = NULL;
  g_autoptr(GmlpGroupedTensor) c1 = NULL, c2 = NULL;
  gint64 total = 0;
  guint c;

  if (device == NULL)
    return;
  if (g_str_has_prefix (gmlp_device_get_name (device), "cpu"))
    {
      g_test_skip ("compares a GPU with the CPU backend");
      return;
    }
  cpu = gmlp_device_new_from_string ("cpu", &error);
  g_assert_no_error (error);
  for (c = 0; c < n; c++)
    total += counts[c];
  data = random_rows (total, cols * 2);
  h1 = gmlp_grouped_tensor_new_from_bytes (device, GMLP_DTYPE_BFLOAT16, counts, n, cols, data, &error);
  g_assert_no_error (error);
  h2 = gmlp_grouped_tensor_new_from_bytes (cpu, GMLP_DTYPE_BFLOAT16, counts, n, cols, data, &error);
  g_assert_no_error (error);
  c1 = ints (device, counts, n);
  c2 = ints (cpu, counts, n);
  s1 = gmlp_test_device_sized_copy (h1, c1, total);
  s2 = gmlp_test_device_sized_copy (h2, c2, total);
  d1 = fresh_members (device, GMLP_DTYPE_BFLOAT16, cols, n_b, total);
  d2 = fresh_members (cpu, GMLP_DTYPE_BFLOAT16, cols, n_b, total);
  move_ok (c1, n_a, n_b, 250, s1, GMLP_CHUNK_LAYOUT_MEMBERS, d1, GMLP_CHUNK_LAYOUT_MEMBERS_BY_B,
           GMLP_MOVE_ROWS_SET_SIZES, NULL, NULL);
  move_ok (c2, n_a, n_b, 250, s2, GMLP_CHUNK_LAYOUT_MEMBERS, d2, GMLP_CHUNK_LAYOUT_MEMBERS_BY_B,
           GMLP_MOVE_ROWS_SET_SIZES, NULL, NULL);
  b1 = packed_rows (d1, &r1);
  b2 = packed_rows (d2, &r2);
  g_assert_cmpmem (r1, n_b * sizeof (gint64), r2, n_b * sizeof (gint64));
  total = 0;
  for (c = 0; c < n_b; c++)
    total += r1[c];
  g_assert_cmpmem (b1, total * cols * 2, b2, total * cols * 2);
}

int
main (int argc, char *argv[])
{
  g_setenv ("GMLP_DEBUG", "poison", FALSE);
  setlocale (LC_ALL, "");
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Gmlp/RowChunks/round-trip", test_round_trip);
  g_test_add_func ("/Gmlp/RowChunks/slots", test_slots);
  g_test_add_func ("/Gmlp/RowChunks/limits", test_limits);
  g_test_add_func ("/Gmlp/RowChunks/bad-input", test_bad_input);
  g_test_add_func ("/Gmlp/RowChunks/same-as-cpu", test_same_as_cpu);

  return g_test_run ();
}
