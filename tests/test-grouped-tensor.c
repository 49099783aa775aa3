/* test-grouped-tensor.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <locale.h>
#include <math.h>
#include <string.h>

#include "gmlp-test-util.h"
#include "gmlp-grouped-tensor-private.h"
#include <dlpack/dlpack.h>

static const GmlpDType all_dtypes[] = {
  GMLP_DTYPE_FLOAT32, GMLP_DTYPE_FLOAT16, GMLP_DTYPE_BFLOAT16, GMLP_DTYPE_FLOAT8_E4M3,
  GMLP_DTYPE_FLOAT8_E5M2, GMLP_DTYPE_INT32, GMLP_DTYPE_INT64,
};

static gint64
sum_rows (const gint64 *rows, guint n)
{
  gint64 total = 0;
  guint g;

  for (g = 0; g < n; g++)
    total += rows[g];
  return total;
}

static GmlpGroupedTensor *
upload (GmlpDevice *device, GmlpDType dtype, const gint64 *rows, guint n, gint64 cols,
        GBytes *bytes)
{
  g_autoptr(GError) error = NULL;
  GmlpGroupedTensor *t = gmlp_grouped_tensor_new_from_bytes (device, dtype, rows, n, cols,
                                                             bytes, &error);
  g_assert_no_error (error);
  g_assert_nonnull (t);
  return t;
}

static GBytes *
download (GmlpGroupedTensor *t)
{
  g_autoptr(GError) error = NULL;
  GBytes *bytes = gmlp_grouped_tensor_to_bytes (t, &error);
  g_assert_no_error (error);
  g_assert_nonnull (bytes);
  return bytes;
}

static void
assert_bytes_equal (GBytes *a, GBytes *b)
{
  gsize la, lb;
  const guint8 *pa = g_bytes_get_data (a, &la), *pb = g_bytes_get_data (b, &lb);

  g_assert_cmpuint (la, ==, lb);
  if (la > 0 && memcmp (pa, pb, la) != 0)
    {
      gsize i;
      for (i = 0; i < la && pa[i] == pb[i]; i++)
        ;
      g_error ("bytes differ first at %" G_GSIZE_FORMAT ": %02x != %02x", i, pa[i], pb[i]);
    }
}

/* bytes in -> device -> bytes out, bit for bit, for every dtype, shapes with
 * padding and empty groups. */
static void
test_round_trip (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint k, iter;

  if (device == NULL)
    return;

  for (k = 0; k < G_N_ELEMENTS (all_dtypes); k++)
    for (iter = 0; iter < 12; iter++)
      {
        GmlpDType dtype = all_dtypes[k];
        guint n = g_test_rand_int_range (1, 10);
        gint64 cols = g_test_rand_int_range (1, 300);
        g_autofree gint64 *rows = gmlp_test_random_rows (n, 40);
        gsize n_elem = (gsize) sum_rows (rows, n) * cols;
        g_autoptr(GBytes) in = gmlp_test_random_bytes (dtype, n_elem, 1.0, TRUE);
        g_autoptr(GmlpGroupedTensor) t = upload (device, dtype, rows, n, cols, in);
        g_autoptr(GBytes) out = download (t);
        guint g;

        g_assert_cmpint (gmlp_grouped_tensor_get_dtype (t), ==, dtype);
        g_assert_cmpuint (gmlp_grouped_tensor_get_n_groups (t), ==, n);
        g_assert_cmpint (gmlp_grouped_tensor_get_cols (t), ==, cols);
        g_assert_cmpint (gmlp_grouped_tensor_get_total_rows (t), ==, sum_rows (rows, n));
        g_assert_true (gmlp_grouped_tensor_get_device (t) == device);
        g_assert_true (gmlp_grouped_tensor_has_host_sizes (t));
        for (g = 0; g < n; g++)
          g_assert_cmpint (gmlp_grouped_tensor_get_rows (t, g), ==, rows[g]);
        assert_bytes_equal (in, out);
      }
}

/* Every member starts on a 256-byte boundary of device memory, members do not
 * overlap, and the span covers them all. */
static void
test_alignment (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint iter;

  if (device == NULL)
    return;

  for (iter = 0; iter < 50; iter++)
    {
      GmlpDType dtype = all_dtypes[g_test_rand_int_range (0, G_N_ELEMENTS (all_dtypes))];
      guint n = g_test_rand_int_range (1, 20);
      gint64 cols = g_test_rand_int_range (1, 200);
      g_autofree gint64 *rows = gmlp_test_random_rows (n, 33);
      g_autoptr(GmlpGroupedTensor) t = gmlp_grouped_tensor_new (device, dtype, rows, n, cols, NULL);
      gsize row_bytes = cols * gmlp_dtype_get_size (dtype);
      gint64 end = 0;
      guint g;

      g_assert_nonnull (t);
      g_assert_cmpuint (GPOINTER_TO_SIZE (gmlp_grouped_tensor_get_data (t)) % GMLP_MEMBER_ALIGNMENT, ==, 0);
      for (g = 0; g < n; g++)
        {
          gint64 offset = gmlp_grouped_tensor_get_member_offset (t, g);
          g_autoptr(GmlpGroupedTensor) view = gmlp_grouped_tensor_get_member (t, g, NULL);

          g_assert_cmpint (offset % GMLP_MEMBER_ALIGNMENT, ==, 0);
          g_assert_cmpint (offset, >=, end);
          end = offset + rows[g] * (gint64) row_bytes;
          g_assert_cmpuint (GPOINTER_TO_SIZE (gmlp_grouped_tensor_get_data (view)) % GMLP_MEMBER_ALIGNMENT, ==, 0);
          g_assert_true ((guint8 *) gmlp_grouped_tensor_get_data (view) ==
                         (guint8 *) gmlp_grouped_tensor_get_data (t) + offset);
        }
      g_assert_cmpint (end, <=, (gint64) gmlp_grouped_tensor_get_nbytes (t));
      if (row_bytes % GMLP_MEMBER_ALIGNMENT == 0)
        g_assert_cmpint (gmlp_grouped_tensor_get_nbytes (t), ==, sum_rows (rows, n) * row_bytes);
    }
}

/* Member views alias the parent's storage, both ways, and outlive it. */
static void
test_views (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint iter;

  if (device == NULL)
    return;

  for (iter = 0; iter < 10; iter++)
    {
      GmlpDType dtype = all_dtypes[g_test_rand_int_range (0, 5)];
      gsize elem = gmlp_dtype_get_size (dtype);
      guint n = g_test_rand_int_range (2, 8);
      gint64 cols = g_test_rand_int_range (1, 100);
      g_autofree gint64 *rows = gmlp_test_random_rows (n, 20);
      g_autoptr(GBytes) in = gmlp_test_random_bytes (dtype, sum_rows (rows, n) * cols, 1.0, FALSE);
      GmlpGroupedTensor *t = upload (device, dtype, rows, n, cols, in);
      guint zeroed = g_test_rand_int_range (0, n);
      g_autoptr(GmlpGroupedTensor) view = NULL;
      g_autoptr(GBytes) out = NULL;
      g_autoptr(GBytes) view_out = NULL;
      const guint8 *pin, *pout;
      gsize offset = 0, len;
      guint g;

      for (g = 0; g < n; g++)
        {
          g_autoptr(GmlpGroupedTensor) member = gmlp_grouped_tensor_get_member (t, g, NULL);
          g_autoptr(GBytes) member_out = download (member);
          g_autoptr(GBytes) slice = g_bytes_new_from_bytes (in, offset, rows[g] * cols * elem);

          g_assert_true (gmlp_grouped_tensor_is_view (member));
          g_assert_cmpuint (gmlp_grouped_tensor_get_n_groups (member), ==, 1);
          g_assert_cmpint (gmlp_grouped_tensor_get_rows (member, 0), ==, rows[g]);
          assert_bytes_equal (member_out, slice);
          offset += rows[g] * cols * elem;
        }

      /* Writing through a view changes that member of the parent only. */
      view = gmlp_grouped_tensor_get_member (t, zeroed, NULL);
      g_assert_true (gmlp_grouped_tensor_fill_zero (view, NULL));
      out = download (t);
      pin = g_bytes_get_data (in, NULL);
      pout = g_bytes_get_data (out, &len);
      offset = 0;
      for (g = 0; g < n; g++)
        {
          gsize member = rows[g] * cols * elem, i;

          for (i = 0; i < member; i++)
            g_assert_cmpuint (pout[offset + i], ==, g == zeroed ? 0 : pin[offset + i]);
          offset += member;
        }

      /* And writing the parent shows through the view, which outlives it. */
      g_assert_true (gmlp_grouped_tensor_fill_random (t, 7, 1.0, NULL));
      g_clear_object (&t);
      view_out = download (view);
      if (rows[zeroed] > 0 && gmlp_dtype_is_floating (dtype))
        {
          gboolean all_zero = TRUE;
          const guint8 *pv = g_bytes_get_data (view_out, &len);
          gsize i;

          for (i = 0; i < len; i++)
            all_zero = all_zero && pv[i] == 0;
          g_assert_false (all_zero);
        }
    }
}

static void
test_uniform (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpGroupedTensor) w = NULL;
  g_autoptr(GmlpGroupedTensor) empty = NULL;
  gint64 rows[] = { 3, 4 };
  g_autoptr(GmlpGroupedTensor) ragged = NULL;
  guint g;

  if (device == NULL)
    return;

  w = gmlp_grouped_tensor_new_uniform (device, GMLP_DTYPE_BFLOAT16, 5, 7, 24, NULL);
  g_assert_nonnull (w);
  g_assert_true (gmlp_grouped_tensor_is_uniform (w));
  g_assert_false (gmlp_grouped_tensor_is_view (w));
  for (g = 0; g < 5; g++)
    {
      g_assert_cmpint (gmlp_grouped_tensor_get_rows (w, g), ==, 7);
      g_assert_cmpint (gmlp_grouped_tensor_get_member_offset (w, g), ==, g * 512);
    }
  g_assert_cmpint (gmlp_grouped_tensor_get_total_rows (w), ==, 35);

  empty = gmlp_grouped_tensor_new_uniform (device, GMLP_DTYPE_FLOAT32, 3, 0, 8, NULL);
  g_assert_nonnull (empty);
  g_assert_cmpint (gmlp_grouped_tensor_get_total_rows (empty), ==, 0);

  ragged = gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, rows, 2, 8, NULL);
  g_assert_false (gmlp_grouped_tensor_is_uniform (ragged));
}

/* Checks dst = convert(src) element by element against the float64 model. */
static void
check_conversion (GBytes *src, GmlpDType src_dtype, GBytes *dst, GmlpDType dst_dtype)
{
  gsize n = g_bytes_get_size (src) / gmlp_dtype_get_size (src_dtype), i;
  const guint8 *ps = g_bytes_get_data (src, NULL), *pd = g_bytes_get_data (dst, NULL);

  g_assert_cmpuint (g_bytes_get_size (dst), ==, n * gmlp_dtype_get_size (dst_dtype));
  for (i = 0; i < n; i++)
    {
      double want;

      if (src_dtype == dst_dtype)
        {
          /* Identity: a copy, infinities and NaN payloads included. */
          want = gmlp_test_decode (ps, src_dtype, i);
        }
      else if (gmlp_dtype_is_floating (src_dtype))
        {
          /* Through float first, as the library converts (exact for every
           * source type but float32 itself). */
          want = gmlp_test_round ((float) gmlp_test_decode (ps, src_dtype, i), dst_dtype);
        }
      else if (dst_dtype == GMLP_DTYPE_INT32 && src_dtype == GMLP_DTYPE_INT64)
        {
          /* Saturated to the INT32 range, not wrapped. */
          want = CLAMP ((double) ((const gint64 *) ps)[i], (double) G_MININT32, (double) G_MAXINT32);
        }
      else
        {
          want = gmlp_test_decode (ps, src_dtype, i);
        }
      gmlp_assert_same_value (gmlp_test_decode (pd, dst_dtype, i), want,
                              gmlp_dtype_get_name (dst_dtype), i);
    }
}

static void
test_convert (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint a, b;

  if (device == NULL)
    return;

  for (a = 0; a < G_N_ELEMENTS (all_dtypes); a++)
    for (b = 0; b < G_N_ELEMENTS (all_dtypes); b++)
      {
        GmlpDType from = all_dtypes[a], to = all_dtypes[b];
        guint n = g_test_rand_int_range (1, 12);
        gint64 cols = g_test_rand_int_range (1, 150);
        g_autofree gint64 *rows = gmlp_test_random_rows (n, 30);
        g_autoptr(GBytes) in = NULL;
        g_autoptr(GmlpGroupedTensor) t = NULL;
        g_autoptr(GmlpGroupedTensor) c = NULL;
        g_autoptr(GBytes) out = NULL;
        g_autoptr(GError) error = NULL;

        if (!gmlp_dtype_can_convert (from, to))
          continue;

        in = gmlp_test_random_bytes (from, sum_rows (rows, n) * cols, 100.0, TRUE);
        t = upload (device, from, rows, n, cols, in);
        c = gmlp_grouped_tensor_convert (t, to, &error);
        g_assert_no_error (error);
        g_assert_cmpint (gmlp_grouped_tensor_get_dtype (c), ==, to);
        g_assert_cmpint (gmlp_grouped_tensor_get_total_rows (c), ==, sum_rows (rows, n));
        out = download (c);
        check_conversion (in, from, out, to);
      }
}

/* INT64 to INT32 saturates, as conversions to FP8 do: random values of
 * every magnitude, the edges of the INT32 range and 2^40 (which used to
 * wrap to 0), into a poisoned output with padding and an empty group. */
static void
test_convert_int64_saturates (void)
{
  static const gint64 edges[] = {
    0, 1, -1, G_MAXINT32, G_MAXINT32 + G_GINT64_CONSTANT (1), G_MININT32,
    G_MININT32 - G_GINT64_CONSTANT (1), G_GINT64_CONSTANT (1) << 40,
    -(G_GINT64_CONSTANT (1) << 40), G_GINT64_CONSTANT (1) << 32, G_MAXINT64, G_MININT64,
  };
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  gint64 rows[] = { 13, 0, 7, 21 };
  gint64 cols = 3, n = 41 * 3, i;
  g_autofree gint64 *values = g_new (gint64, n);
  g_autoptr(GBytes) in = NULL, out = NULL;
  g_autoptr(GmlpGroupedTensor) t = NULL, c = NULL;
  g_autoptr(GError) error = NULL;
  const gint32 *got;

  if (device == NULL)
    return;

  for (i = 0; i < n; i++)
    {
      int bits = g_test_rand_int_range (0, 63);
      gint64 magnitude = (gint64) (((guint64) (guint32) g_test_rand_int () << 32 |
                                    (guint32) g_test_rand_int ()) >> (63 - bits));

      values[i] = i < (gint64) G_N_ELEMENTS (edges) ? edges[i] :
                  g_test_rand_bit () ? -magnitude : magnitude;
    }
  in = g_bytes_new (values, n * sizeof (gint64));
  t = upload (device, GMLP_DTYPE_INT64, rows, G_N_ELEMENTS (rows), cols, in);
  c = gmlp_grouped_tensor_convert (t, GMLP_DTYPE_INT32, &error);
  g_assert_no_error (error);
  out = download (c);
  g_assert_cmpuint (g_bytes_get_size (out), ==, n * sizeof (gint32));
  got = g_bytes_get_data (out, NULL);
  for (i = 0; i < n; i++)
    {
      double want = CLAMP ((double) values[i], (double) G_MININT32, (double) G_MAXINT32);

      if ((double) got[i] != want)
        g_error ("int64 %" G_GINT64_FORMAT " [%" G_GINT64_FORMAT "] became %d, not %.0f",
                 values[i], i, got[i], want);
    }
}

/* Empty groups, one group holding every row, a single group and 256 groups. */
static void
test_edge_shapes (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint shape;

  if (device == NULL)
    return;

  for (shape = 0; shape < 4; shape++)
    {
      guint n = shape == 3 ? 256 : 8;
      g_autofree gint64 *rows = g_new0 (gint64, n);
      gint64 cols = 5;
      g_autoptr(GBytes) in = NULL;
      g_autoptr(GmlpGroupedTensor) t = NULL;
      g_autoptr(GmlpGroupedTensor) c = NULL;
      g_autoptr(GBytes) out = NULL;
      guint g;

      if (shape == 1)
        rows[g_test_rand_int_range (0, n)] = 77;          /* one group has it all */
      if (shape == 2)
        n = 1, rows[0] = 13;
      if (shape == 3)
        for (g = 0; g < n; g++)
          rows[g] = g_test_rand_int_range (0, 9);

      in = gmlp_test_random_bytes (GMLP_DTYPE_FLOAT32, sum_rows (rows, n) * cols, 1.0, FALSE);
      t = upload (device, GMLP_DTYPE_FLOAT32, rows, n, cols, in);
      c = gmlp_grouped_tensor_convert (t, GMLP_DTYPE_BFLOAT16, NULL);
      g_assert_nonnull (c);
      out = download (c);
      check_conversion (in, GMLP_DTYPE_FLOAT32, out, GMLP_DTYPE_BFLOAT16);
      g_clear_pointer (&out, g_bytes_unref);
      out = download (t);
      assert_bytes_equal (in, out);
    }
}

static GmlpGroupedTensor *
sizes_tensor (GmlpDevice *device, const gint64 *rows, guint n)
{
  gint64 len = n;
  g_autoptr(GBytes) bytes = g_bytes_new (rows, n * sizeof (gint64));

  return upload (device, GMLP_DTYPE_INT64, &len, 1, 1, bytes);
}

/* With the sizes only on the device, the layout and the results are those of
 * the same tensor with host sizes; sizes past the capacity are clamped. */
static void
test_device_sizes (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint iter;

  if (device == NULL)
    return;

  for (iter = 0; iter < 10; iter++)
    {
      GmlpDType dtype = all_dtypes[g_test_rand_int_range (0, 5)];
      guint n = g_test_rand_int_range (1, 16);
      gint64 cols = g_test_rand_int_range (1, 100);
      g_autofree gint64 *rows = gmlp_test_random_rows (n, 25);
      gint64 total = sum_rows (rows, n);
      gboolean overfull = iter % 3 == 2 && total > 0;
      gint64 capacity = overfull ? total / 2 : total + g_test_rand_int_range (0, 50);
      g_autoptr(GmlpGroupedTensor) sizes = sizes_tensor (device, rows, n);
      g_autoptr(GmlpGroupedTensor) t = NULL;
      g_autoptr(GmlpGroupedTensor) c = NULL;
      g_autoptr(GmlpGroupedTensor) host_t = NULL;
      g_autoptr(GmlpGroupedTensor) host_c = NULL;
      g_autoptr(GError) error = NULL;
      g_autofree gint64 *clamped = g_memdup2 (rows, n * sizeof (gint64));
      g_autofree gint64 *read = NULL;
      g_autoptr(GBytes) out = NULL, host_out = NULL, cout = NULL, host_cout = NULL;
      gint64 left = capacity;
      guint g, n_read;

      for (g = 0; g < n; g++)
        {
          clamped[g] = MIN (rows[g], left);
          left -= clamped[g];
        }

      t = gmlp_grouped_tensor_new_with_device_sizes (device, dtype, sizes, capacity, cols, &error);
      g_assert_no_error (error);
      g_assert_false (gmlp_grouped_tensor_has_host_sizes (t));
      g_assert_cmpuint (gmlp_grouped_tensor_get_n_groups (t), ==, n);
      g_assert_cmpint (gmlp_grouped_tensor_get_rows (t, 0), ==, -1);
      g_assert_cmpint (gmlp_grouped_tensor_get_total_rows (t), ==, -1);
      g_assert_cmpint (gmlp_grouped_tensor_get_member_offset (t, 0), ==, -1);
      g_assert_cmpint (gmlp_grouped_tensor_get_row_capacity (t), ==, capacity);
      g_assert_true (gmlp_grouped_tensor_get_sizes (t, NULL) == sizes);
      read = gmlp_grouped_tensor_read_sizes (t, &n_read, &error);
      g_assert_no_error (error);
      g_assert_cmpuint (n_read, ==, n);
      g_assert_cmpmem (read, n * sizeof (gint64), rows, n * sizeof (gint64));

      host_t = gmlp_grouped_tensor_new (device, dtype, clamped, n, cols, NULL);
      g_assert_true (gmlp_grouped_tensor_fill_random (t, 99 + iter, 3.0, NULL));
      g_assert_true (gmlp_grouped_tensor_fill_random (host_t, 99 + iter, 3.0, NULL));
      out = download (t);
      host_out = download (host_t);
      assert_bytes_equal (out, host_out);

      c = gmlp_grouped_tensor_convert (t, GMLP_DTYPE_FLOAT8_E4M3, &error);
      g_assert_no_error (error);
      g_assert_false (gmlp_grouped_tensor_has_host_sizes (c));
      host_c = gmlp_grouped_tensor_convert (host_t, GMLP_DTYPE_FLOAT8_E4M3, NULL);
      cout = download (c);
      host_cout = download (host_c);
      assert_bytes_equal (cout, host_cout);
      check_conversion (out, dtype, cout, GMLP_DTYPE_FLOAT8_E4M3);

      g_assert_null (gmlp_grouped_tensor_get_member (t, 0, &error));
      g_assert_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED);
    }
}

/* The random fill is in range, reproducible, and the same on every backend;
 * so is conversion. */
static void
test_fill_random (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpDevice) cpu = gmlp_device_new (GMLP_DEVICE_KIND_CPU, 0, NULL);
  guint k;

  if (device == NULL)
    return;

  for (k = 0; k < 5; k++)
    {
      GmlpDType dtype = all_dtypes[k];
      gint64 rows[] = { 17, 0, 129, 1 };
      double scale = g_test_rand_double_range (0.01, 10.0);
      guint64 seed = (guint64) g_test_rand_int ();
      g_autoptr(GmlpGroupedTensor) a = gmlp_grouped_tensor_new (device, dtype, rows, 4, 33, NULL);
      g_autoptr(GmlpGroupedTensor) b = gmlp_grouped_tensor_new (device, dtype, rows, 4, 33, NULL);
      g_autoptr(GmlpGroupedTensor) on_cpu = gmlp_grouped_tensor_new (cpu, dtype, rows, 4, 33, NULL);
      g_autoptr(GmlpGroupedTensor) conv = NULL, conv_cpu = NULL;
      g_autoptr(GBytes) ba = NULL, bb = NULL, bc = NULL, cva = NULL, cvc = NULL;
      const guint8 *p;
      gsize n, i;
      gboolean differs = FALSE;

      g_assert_true (gmlp_grouped_tensor_fill_random (a, seed, scale, NULL));
      g_assert_true (gmlp_grouped_tensor_fill_random (b, seed + 1, scale, NULL));
      g_assert_true (gmlp_grouped_tensor_fill_random (on_cpu, seed, scale, NULL));
      ba = download (a);
      bb = download (b);
      bc = download (on_cpu);
      assert_bytes_equal (ba, bc);

      p = g_bytes_get_data (ba, &n);
      n /= gmlp_dtype_get_size (dtype);
      for (i = 0; i < n; i++)
        {
          double v = gmlp_test_decode (p, dtype, i);
          g_assert_true (isfinite (v));
          /* Rounding to the storage type may reach the edge itself. */
          g_assert_cmpfloat (fabs (v), <=, gmlp_test_round (scale, dtype));
          differs = differs || v != gmlp_test_decode (g_bytes_get_data (bb, NULL), dtype, i);
        }
      g_assert_true (differs);

      conv = gmlp_grouped_tensor_convert (a, all_dtypes[(k + 1) % 5], NULL);
      conv_cpu = gmlp_grouped_tensor_convert (on_cpu, all_dtypes[(k + 1) % 5], NULL);
      cva = download (conv);
      cvc = download (conv_cpu);
      assert_bytes_equal (cva, cvc);
    }
}

/* Bad input gives the right error, allocates nothing and writes nothing. */
static void
test_bad_input (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  gint64 rows[] = { 2, 3 };
  gint64 negative[] = { 2, -1 };
  gint64 absurd[] = { G_GINT64_CONSTANT (1) << 50, 1 };
  gint64 overflow[] = { G_MAXINT64, G_MAXINT64 };
  g_autoptr(GBytes) five_rows = NULL;
  g_autoptr(GBytes) before = NULL, after = NULL;
  g_autoptr(GmlpGroupedTensor) t = NULL;
  g_autoptr(GmlpGroupedTensor) f32_sizes = NULL;
  g_autoptr(GmlpGroupedTensor) sizes = NULL;
  guint64 in_use;
  guint i;

  if (device == NULL)
    return;

  five_rows = gmlp_test_random_bytes (GMLP_DTYPE_FLOAT32, 5 * 4, 1.0, FALSE);
  t = upload (device, GMLP_DTYPE_FLOAT32, rows, 2, 4, five_rows);
  before = download (t);
  g_assert_true (gmlp_device_synchronize (device, NULL));
  in_use = gmlp_device_get_bytes_in_use (device);

#define EXPECT_ERROR(call, code) \
  G_STMT_START { \
    g_autoptr(GError) _error = NULL; \
    gpointer _result = (gpointer) (gsize) (call); \
    g_assert_true (_result == NULL); \
    g_assert_error (_error, GMLP_ERROR, (code)); \
    g_assert_cmpuint (gmlp_device_get_bytes_in_use (device), ==, in_use); \
  } G_STMT_END

  /* Sizes that do not add up to the data, wrong byte lengths. */
  {
    gint64 four[] = { 2, 2 }, six[] = { 3, 3 };
    EXPECT_ERROR (gmlp_grouped_tensor_new_from_bytes (device, GMLP_DTYPE_FLOAT32, four, 2, 4, five_rows, &_error), GMLP_ERROR_INVALID_ARGUMENT);
    EXPECT_ERROR (gmlp_grouped_tensor_new_from_bytes (device, GMLP_DTYPE_FLOAT32, six, 2, 4, five_rows, &_error), GMLP_ERROR_INVALID_ARGUMENT);
    EXPECT_ERROR (gmlp_grouped_tensor_new_from_bytes (device, GMLP_DTYPE_BFLOAT16, rows, 2, 4, five_rows, &_error), GMLP_ERROR_INVALID_ARGUMENT);
    EXPECT_ERROR (gmlp_grouped_tensor_new_from_bytes (device, GMLP_DTYPE_FLOAT32, rows, 2, 3, five_rows, &_error), GMLP_ERROR_INVALID_ARGUMENT);
  }
  /* Negative, absurd and overflowing sizes; cols = 0 or negative; no groups;
   * too many groups; an invalid dtype. */
  EXPECT_ERROR (gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, negative, 2, 4, &_error), GMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_ERROR (gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, absurd, 2, 4, &_error), GMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_ERROR (gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, overflow, 2, 4, &_error), GMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_ERROR (gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, rows, 2, 0, &_error), GMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_ERROR (gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, rows, 2, -3, &_error), GMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_ERROR (gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, rows, 0, 4, &_error), GMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_ERROR (gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, NULL, 2, 4, &_error), GMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_ERROR (gmlp_grouped_tensor_new (device, (GmlpDType) 99, rows, 2, 4, &_error), GMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_ERROR (gmlp_grouped_tensor_new_uniform (device, GMLP_DTYPE_FLOAT32, 70000, 1, 4, &_error), GMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_ERROR (gmlp_grouped_tensor_new_uniform (device, GMLP_DTYPE_FLOAT32, 2, -5, 4, &_error), GMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_ERROR (gmlp_grouped_tensor_new_uniform (device, GMLP_DTYPE_FLOAT32, 2, 1, G_GINT64_CONSTANT (1) << 40, &_error), GMLP_ERROR_INVALID_ARGUMENT);

  /* Member index out of range. */
  EXPECT_ERROR (gmlp_grouped_tensor_get_member (t, 2, &_error), GMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_ERROR (gmlp_grouped_tensor_get_member (t, G_MAXUINT, &_error), GMLP_ERROR_INVALID_ARGUMENT);

  /* Conversions that do not exist; random fill of integers or a bad scale. */
  EXPECT_ERROR (gmlp_grouped_tensor_convert (t, GMLP_DTYPE_INT32, &_error), GMLP_ERROR_UNSUPPORTED);
  EXPECT_ERROR (gmlp_grouped_tensor_convert (t, (GmlpDType) -1, &_error), GMLP_ERROR_UNSUPPORTED);
  EXPECT_ERROR (gmlp_grouped_tensor_fill_random (t, 1, NAN, &_error), GMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_ERROR (gmlp_grouped_tensor_fill_random (t, 1, -1.0, &_error), GMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_ERROR (gmlp_grouped_tensor_fill_random (t, 1, INFINITY, &_error), GMLP_ERROR_INVALID_ARGUMENT);

  /* Device sizes of the wrong dtype, or the wrong shape, or a bad capacity. */
  f32_sizes = gmlp_grouped_tensor_new_uniform (device, GMLP_DTYPE_FLOAT32, 1, 2, 1, NULL);
  sizes = sizes_tensor (device, rows, 2);
  in_use = gmlp_device_get_bytes_in_use (device);
  EXPECT_ERROR (gmlp_grouped_tensor_new_with_device_sizes (device, GMLP_DTYPE_FLOAT32, f32_sizes, 10, 4, &_error), GMLP_ERROR_DTYPE_MISMATCH);
  EXPECT_ERROR (gmlp_grouped_tensor_new_with_device_sizes (device, GMLP_DTYPE_FLOAT32, sizes, -1, 4, &_error), GMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_ERROR (gmlp_grouped_tensor_new_with_device_sizes (device, GMLP_DTYPE_FLOAT32, sizes, 10, 0, &_error), GMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_ERROR (gmlp_grouped_tensor_new_with_device_sizes (device, GMLP_DTYPE_FLOAT32, t, 10, 4, &_error), GMLP_ERROR_DTYPE_MISMATCH);
  {
    g_autoptr(GmlpGroupedTensor) two_members = gmlp_grouped_tensor_new_uniform (device, GMLP_DTYPE_INT64, 2, 1, 1, NULL);
    in_use = gmlp_device_get_bytes_in_use (device);
    EXPECT_ERROR (gmlp_grouped_tensor_new_with_device_sizes (device, GMLP_DTYPE_FLOAT32, two_members, 10, 4, &_error), GMLP_ERROR_INVALID_ARGUMENT);
  }
  if (gmlp_device_get_kind (device) != GMLP_DEVICE_KIND_CPU)
    {
      g_autoptr(GmlpDevice) cpu = gmlp_device_new (GMLP_DEVICE_KIND_CPU, 0, NULL);
      in_use = gmlp_device_get_bytes_in_use (device);
      EXPECT_ERROR (gmlp_grouped_tensor_new_with_device_sizes (cpu, GMLP_DTYPE_FLOAT32, sizes, 10, 4, &_error), GMLP_ERROR_INVALID_ARGUMENT);
    }

#undef EXPECT_ERROR

  /* Nothing of the tensor was touched by the failed calls. */
  after = download (t);
  assert_bytes_equal (before, after);
  for (i = 0; i < 2; i++)
    g_assert_cmpint (gmlp_grouped_tensor_get_rows (t, i), ==, rows[i]);
}

/* self += alpha other, scale and the sum of squares, against float64, with
 * padding, empty groups and mixed dtypes; bad input leaves self alone. */
static void
test_arithmetic (void)
{
  static const GmlpDType dtypes[] = { GMLP_DTYPE_FLOAT32, GMLP_DTYPE_FLOAT16, GMLP_DTYPE_BFLOAT16 };
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint a, b;

  if (device == NULL)
    return;

  for (a = 0; a < G_N_ELEMENTS (dtypes); a++)
    for (b = 0; b < G_N_ELEMENTS (dtypes); b++)
      {
        guint n = g_test_rand_int_range (1, 9);
        gint64 cols = g_test_rand_int_range (1, 150);
        g_autofree gint64 *rows = gmlp_test_random_rows (n, 30);
        g_autofree double *yv = NULL, *xv = NULL, *got = NULL, *want = NULL;
        g_autoptr(GmlpGroupedTensor) y = gmlp_test_random_tensor (device, dtypes[a], rows, n, cols, 2.0, &yv);
        g_autoptr(GmlpGroupedTensor) x = gmlp_test_random_tensor (device, dtypes[b], rows, n, cols, 2.0, &xv);
        double alpha = g_test_rand_double_range (-3.0, 3.0), ss = -1.0, ss_want = 0.0;
        g_autoptr(GError) error = NULL;
        gsize count, i;

        g_assert_true (gmlp_grouped_tensor_add_scaled (y, alpha, x, &error));
        g_assert_no_error (error);
        got = gmlp_test_download (y, &count);
        want = g_new (double, MAX (count, 1));
        for (i = 0; i < count; i++)
          want[i] = gmlp_test_round ((float) ((float) alpha * (float) xv[i] + (float) yv[i]), dtypes[a]);
        gmlp_test_assert_close (got, want, count, dtypes[a] == GMLP_DTYPE_FLOAT32 ? 1e-6 : 1e-2,
                                "add_scaled");

        g_assert_true (gmlp_grouped_tensor_scale (y, -0.5, &error));
        g_clear_pointer (&got, g_free);
        got = gmlp_test_download (y, NULL);
        for (i = 0; i < count; i++)
          {
            want[i] = gmlp_test_round (-0.5 * want[i], dtypes[a]);
            ss_want += got[i] * got[i];
          }
        gmlp_test_assert_close (got, want, count, 1e-2, "scale");
        ss = gmlp_grouped_tensor_sum_squares (y, &error);
        g_assert_no_error (error);
        g_assert_cmpfloat (fabs (ss - ss_want), <=, 1e-5 * (ss_want + 1e-30));
      }

  /* Bad input: shapes, dtypes, factors; nothing changes. */
  {
    gint64 r1[] = { 3, 4 }, r2[] = { 4, 3 };
    g_autoptr(GmlpGroupedTensor) y = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, r1, 2, 8, 1.0, NULL);
    g_autoptr(GmlpGroupedTensor) other_rows = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, r2, 2, 8, 1.0, NULL);
    g_autoptr(GmlpGroupedTensor) other_cols = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, r1, 2, 9, 1.0, NULL);
    g_autoptr(GmlpGroupedTensor) fp8 = gmlp_grouped_tensor_convert (y, GMLP_DTYPE_FLOAT8_E4M3, NULL);
    g_autoptr(GBytes) before = gmlp_grouped_tensor_to_bytes (y, NULL);
    g_autoptr(GBytes) after = NULL;
    g_autoptr(GError) error = NULL;
    double ss;

    g_assert_false (gmlp_grouped_tensor_add_scaled (y, 1.0, other_rows, &error));
    g_assert_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH);
    g_clear_error (&error);
    g_assert_false (gmlp_grouped_tensor_add_scaled (y, 1.0, other_cols, &error));
    g_assert_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH);
    g_clear_error (&error);
    g_assert_false (gmlp_grouped_tensor_add_scaled (y, NAN, y, &error));
    g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
    g_clear_error (&error);
    g_assert_false (gmlp_grouped_tensor_add_scaled (y, 1.0, fp8, &error));
    g_assert_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED);
    g_clear_error (&error);
    g_assert_false (gmlp_grouped_tensor_scale (fp8, 2.0, &error));
    g_assert_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED);
    g_clear_error (&error);
    ss = gmlp_grouped_tensor_sum_squares (fp8, &error);
    g_assert_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED);
    g_assert_cmpfloat (ss, ==, -1.0);
    after = gmlp_grouped_tensor_to_bytes (y, NULL);
    assert_bytes_equal (before, after);
  }
}

/* Asserts that a call failed with GMLP_ERROR_INVALID_ARGUMENT naming name
 * (*error is read after the call, whatever the order of the arguments). */
static void
assert_refused (gboolean     ok,
                GError     **error,
                const char  *name)
{
  g_assert_false (ok);
  g_assert_error (*error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  if (strstr ((*error)->message, name) == NULL)
    g_error ("“%s” does not name %s", (*error)->message, name);
}

/* Factors that a float cannot hold (NaN, infinities, 1e300, which used to
 * turn every element into inf, and magnitudes below 2^-126, which used to
 * become 0 or lose their bits) are refused, naming the argument, and the
 * tensor is left alone; the largest and smallest factors a float holds are
 * applied as float64 says. */
static void
test_scalar_range (void)
{
  static const double refused[] = {
    1e300, -1e300, 3.5e38, 1e39, 1e-300, -1e-300, 1e-40, -1e-45, 1e-50, NAN, INFINITY, -INFINITY,
  };
  static const GmlpDType dtypes[] = { GMLP_DTYPE_FLOAT32, GMLP_DTYPE_BFLOAT16 };
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint d, i;

  if (device == NULL)
    return;

  for (d = 0; d < G_N_ELEMENTS (dtypes); d++)
    {
      GmlpDType dtype = dtypes[d];
      guint n = g_test_rand_int_range (1, 6);
      gint64 cols = g_test_rand_int_range (1, 70);
      g_autofree gint64 *rows = gmlp_test_random_rows (n, 20);
      g_autofree double *tiny = NULL, *huge = NULL, *unit = NULL, *got = NULL, *want = NULL;
      g_autoptr(GmlpGroupedTensor) a = gmlp_test_random_tensor (device, dtype, rows, n, cols, 1e-30, &tiny);
      g_autoptr(GmlpGroupedTensor) b = gmlp_test_random_tensor (device, dtype, rows, n, cols, 1e37, &huge);
      g_autoptr(GmlpGroupedTensor) c = gmlp_test_random_tensor (device, dtype, rows, n, cols, 1.0, &unit);
      g_autoptr(GBytes) before = download (a), after = NULL;
      float big = (float) g_test_rand_double_range (1e37, G_MAXFLOAT);
      float small = (float) g_test_rand_double_range (G_MINFLOAT, 1e-37);
      double tol = dtype == GMLP_DTYPE_FLOAT32 ? 1e-6 : 1e-2;
      gsize count, k;

      for (i = 0; i < G_N_ELEMENTS (refused); i++)
        {
          g_autoptr(GError) e1 = NULL, e2 = NULL, e3 = NULL;

          assert_refused (gmlp_grouped_tensor_scale (a, refused[i], &e1), &e1, "alpha");
          assert_refused (gmlp_grouped_tensor_add_scaled (a, refused[i], b, &e2), &e2, "alpha");
          assert_refused (gmlp_grouped_tensor_fill_random (a, 1, refused[i], &e3), &e3, "scale");
        }
      after = download (a);
      assert_bytes_equal (before, after);

      /* a × big: ~1e-30 becomes ~1e7; b × small: ~1e37 becomes ~1. */
      g_assert_true (gmlp_grouped_tensor_scale (a, big, NULL));
      got = gmlp_test_download (a, &count);
      want = g_new (double, MAX (count, 1));
      for (k = 0; k < count; k++)
        want[k] = gmlp_test_round ((float) (big * (float) tiny[k]), dtype);
      gmlp_test_assert_close (got, want, count, 0.0, "scale by a large factor");
      g_clear_pointer (&got, g_free);

      /* c += small × b, before b changes. */
      g_assert_true (gmlp_grouped_tensor_add_scaled (c, small, b, NULL));
      got = gmlp_test_download (c, NULL);
      for (k = 0; k < count; k++)
        want[k] = gmlp_test_round ((float) ((float) (small * (float) huge[k]) + (float) unit[k]), dtype);
      gmlp_test_assert_close (got, want, count, tol, "add with a small factor");
      g_clear_pointer (&got, g_free);

      g_assert_true (gmlp_grouped_tensor_scale (b, small, NULL));
      got = gmlp_test_download (b, NULL);
      for (k = 0; k < count; k++)
        want[k] = gmlp_test_round ((float) (small * (float) huge[k]), dtype);
      gmlp_test_assert_close (got, want, count, 0.0, "scale by a small factor");
    }
}

/* The sum of squares accumulates squares in FP64: values whose squares
 * overflow (~1e30) or underflow (~1e-30) a float still add up as float64
 * says. */
static void
test_sum_squares_range (void)
{
  static const double scales[] = { 1e30, 1e-30, 1e19 };
  static const GmlpDType dtypes[] = { GMLP_DTYPE_FLOAT32, GMLP_DTYPE_BFLOAT16 };
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint d, s;

  if (device == NULL)
    return;

  for (d = 0; d < G_N_ELEMENTS (dtypes); d++)
    for (s = 0; s < G_N_ELEMENTS (scales); s++)
      {
        guint n = g_test_rand_int_range (1, 9);
        gint64 cols = g_test_rand_int_range (1, 300);
        g_autofree gint64 *rows = gmlp_test_random_rows (n, 200);
        g_autofree double *x = NULL;
        g_autoptr(GmlpGroupedTensor) t = NULL;
        g_autoptr(GError) error = NULL;
        double got, want = 0.0;
        gsize count = 0, k;
        guint g;

        t = gmlp_test_random_tensor (device, dtypes[d], rows, n, cols, scales[s], &x);
        for (g = 0; g < n; g++)
          count += (gsize) rows[g] * cols;
        for (k = 0; k < count; k++)
          want += x[k] * x[k];
        got = gmlp_grouped_tensor_sum_squares (t, &error);
        g_assert_no_error (error);
        if (!(fabs (got - want) <= 1e-12 * want))
          g_error ("sum of squares of %s × %g: %.17g, float64 says %.17g",
                   gmlp_dtype_get_name (dtypes[d]), scales[s], got, want);
      }
}

/* On a GPU, scale, add_scaled (no product fused into a sum) and INT64 to
 * INT32 give the CPU backend's bits, from the same fresh random inputs. */
static void
test_same_as_cpu (void)
{
  static const GmlpDType dtypes[] = { GMLP_DTYPE_FLOAT32, GMLP_DTYPE_FLOAT16, GMLP_DTYPE_BFLOAT16 };
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpDevice) cpu = gmlp_device_new (GMLP_DEVICE_KIND_CPU, 0, NULL);
  guint a, b;

  if (device == NULL)
    return;
  if (gmlp_device_get_kind (device) == GMLP_DEVICE_KIND_CPU)
    {
      g_test_skip ("compares another device with the CPU");
      return;
    }

  for (a = 0; a < G_N_ELEMENTS (dtypes); a++)
    for (b = 0; b < G_N_ELEMENTS (dtypes); b++)
      {
        guint n = g_test_rand_int_range (1, 9);
        gint64 cols = g_test_rand_int_range (1, 300);
        g_autofree gint64 *rows = gmlp_test_random_rows (n, 300);
        gsize count = (gsize) sum_rows (rows, n) * cols;
        g_autoptr(GBytes) yb = gmlp_test_random_bytes (dtypes[a], count, 3.0, FALSE);
        g_autoptr(GBytes) xb = gmlp_test_random_bytes (dtypes[b], count, 3.0, FALSE);
        g_autoptr(GmlpGroupedTensor) y = upload (device, dtypes[a], rows, n, cols, yb);
        g_autoptr(GmlpGroupedTensor) x = upload (device, dtypes[b], rows, n, cols, xb);
        g_autoptr(GmlpGroupedTensor) y_cpu = upload (cpu, dtypes[a], rows, n, cols, yb);
        g_autoptr(GmlpGroupedTensor) x_cpu = upload (cpu, dtypes[b], rows, n, cols, xb);
        g_autoptr(GBytes) got = NULL, want = NULL;
        double alpha = g_test_rand_double_range (-3.0, 3.0), beta = g_test_rand_double_range (-3.0, 3.0);

        g_assert_true (gmlp_grouped_tensor_add_scaled (y, alpha, x, NULL));
        g_assert_true (gmlp_grouped_tensor_add_scaled (y_cpu, alpha, x_cpu, NULL));
        g_assert_true (gmlp_grouped_tensor_scale (y, beta, NULL));
        g_assert_true (gmlp_grouped_tensor_scale (y_cpu, beta, NULL));
        got = download (y);
        want = download (y_cpu);
        assert_bytes_equal (got, want);
      }

  {
    gint64 rows[] = { 40, 0, 300 };
    g_autoptr(GBytes) in = gmlp_test_random_bytes (GMLP_DTYPE_INT64, 340 * 7, 1.0, FALSE);
    g_autoptr(GmlpGroupedTensor) t = upload (device, GMLP_DTYPE_INT64, rows, 3, 7, in);
    g_autoptr(GmlpGroupedTensor) t_cpu = upload (cpu, GMLP_DTYPE_INT64, rows, 3, 7, in);
    g_autoptr(GmlpGroupedTensor) c = gmlp_grouped_tensor_convert (t, GMLP_DTYPE_INT32, NULL);
    g_autoptr(GmlpGroupedTensor) c_cpu = gmlp_grouped_tensor_convert (t_cpu, GMLP_DTYPE_INT32, NULL);
    g_autoptr(GBytes) got = download (c), want = download (c_cpu);

    assert_bytes_equal (got, want);
  }
}

/* DLPack export: a 2-D view of the storage that keeps the tensor alive;
 * padded, device-sized and FP8 tensors are refused. */
static void
test_dlpack (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  gint64 rows[] = { 5, 0, 7 };
  g_autoptr(GmlpGroupedTensor) padded = NULL, fp8 = NULL;
  g_autoptr(GError) error = NULL;
  GmlpGroupedTensor *t;
  DLManagedTensor *m;
  GWeakRef weak;

  if (device == NULL)
    return;

  t = gmlp_test_random_tensor (device, GMLP_DTYPE_BFLOAT16, rows, 3, 128, 1.0, NULL);
  m = gmlp_grouped_tensor_to_dlpack (t, &error);
  g_assert_no_error (error);
  g_assert_true (m->dl_tensor.data == gmlp_grouped_tensor_get_data (t));
  g_assert_cmpint (m->dl_tensor.ndim, ==, 2);
  g_assert_cmpint (m->dl_tensor.shape[0], ==, 12);
  g_assert_cmpint (m->dl_tensor.shape[1], ==, 128);
  g_assert_cmpint (m->dl_tensor.dtype.code, ==, kDLBfloat);
  g_assert_cmpint (m->dl_tensor.dtype.bits, ==, 16);
  g_assert_cmpint (m->dl_tensor.device.device_type, ==,
                   gmlp_device_get_kind (device) == GMLP_DEVICE_KIND_CUDA ? kDLCUDA : kDLCPU);
  g_assert_null (m->dl_tensor.strides);

  /* The export keeps the tensor until its deleter runs. */
  g_weak_ref_init (&weak, t);
  g_object_unref (t);
  t = g_weak_ref_get (&weak);
  g_assert_nonnull (t);
  g_object_unref (t);
  m->deleter (m);
  g_assert_null (g_weak_ref_get (&weak));
  g_weak_ref_clear (&weak);

  padded = gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, rows, 3, 5, NULL);
  g_assert_null (gmlp_grouped_tensor_to_dlpack (padded, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED);
  g_clear_error (&error);
  fp8 = gmlp_grouped_tensor_new_uniform (device, GMLP_DTYPE_FLOAT8_E4M3, 1, 4, 256, NULL);
  g_assert_null (gmlp_grouped_tensor_to_dlpack (fp8, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED);
}

/* A DLPack producer on the host: one matrix of its own memory, and a count
 * of the calls of its deleter. */
typedef struct {
  DLManagedTensor  managed;
  int64_t          shape[3];
  int64_t          strides[3];
  gpointer         data;
  int             *deleted;
} HostProducer;

static void
host_producer_delete (DLManagedTensor *managed)
{
  HostProducer *p = managed->manager_ctx;

  (*p->deleted)++;
  g_free (p->data);
  g_free (p);
}

static HostProducer *
host_producer_new (DLDataType dtype, int64_t rows, int64_t cols, GBytes *bytes, int *deleted)
{
  HostProducer *p = g_new0 (HostProducer, 1);
  gsize size;
  gconstpointer data = g_bytes_get_data (bytes, &size);

  /* 256-byte aligned storage, so only the layout decides about copying. */
  p->data = g_malloc0 (size + 256);
  p->managed.dl_tensor.data = (gpointer) (((guintptr) p->data + 255) & ~(guintptr) 255);
  if (size > 0)
    memcpy (p->managed.dl_tensor.data, data, size);
  p->managed.dl_tensor.device.device_type = kDLCPU;
  p->managed.dl_tensor.ndim = 2;
  p->managed.dl_tensor.dtype = dtype;
  p->shape[0] = rows;
  p->shape[1] = cols;
  p->strides[0] = cols;
  p->strides[1] = 1;
  p->managed.dl_tensor.shape = p->shape;
  p->managed.dl_tensor.strides = p->strides;
  p->managed.manager_ctx = p;
  p->managed.deleter = host_producer_delete;
  p->deleted = deleted;
  return p;
}

/* DLPack import of libgmlp's own export, on every backend: the same
 * storage regrouped, kept until the import and its views go. */
static void
test_dlpack_import (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  gint64 rows[] = { 5, 0, 7 }, regrouped[] = { 4, 8 };
  g_autoptr(GError) error = NULL;
  g_autoptr(GBytes) want = NULL, got = NULL, member = NULL;
  GmlpGroupedTensor *t, *imported, *view;
  DLManagedTensor *m;
  GWeakRef weak;
  gsize size;

  if (device == NULL)
    return;

  t = gmlp_test_random_tensor (device, GMLP_DTYPE_BFLOAT16, rows, 3, 128, 1.0, NULL);
  want = download (t);
  m = gmlp_grouped_tensor_to_dlpack (t, &error);
  g_assert_no_error (error);
  imported = gmlp_grouped_tensor_new_from_dlpack (device, m, regrouped, 2, &error);
  g_assert_no_error (error);
  g_assert_nonnull (imported);
  g_assert_true (gmlp_grouped_tensor_get_data (imported) == gmlp_grouped_tensor_get_data (t));
  g_assert_cmpint (gmlp_grouped_tensor_get_dtype (imported), ==, GMLP_DTYPE_BFLOAT16);
  g_assert_cmpint (gmlp_grouped_tensor_get_cols (imported), ==, 128);
  g_assert_cmpint (gmlp_grouped_tensor_get_rows (imported, 1), ==, 8);
  got = download (imported);
  assert_bytes_equal (got, want);

  /* A write through the import shows in the producer's tensor. */
  view = gmlp_grouped_tensor_get_member (imported, 1, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_grouped_tensor_fill_zero (view, &error));
  g_assert_no_error (error);
  g_clear_pointer (&got, g_bytes_unref);
  got = download (t);
  g_assert_cmpuint (g_bytes_get_size (got), ==, 12 * 128 * 2);
  for (size = 4 * 128 * 2; size < 12 * 128 * 2; size++)
    g_assert_cmpint (((const guint8 *) g_bytes_get_data (got, NULL))[size], ==, 0);

  /* The producer's tensor lives until the import's storage goes: the
   * import, then its view. */
  g_weak_ref_init (&weak, t);
  g_object_unref (t);
  g_object_unref (imported);
  t = g_weak_ref_get (&weak);
  g_assert_nonnull (t);
  g_object_unref (t);
  member = download (view);
  g_assert_cmpuint (g_bytes_get_size (member), ==, 8 * 128 * 2);
  g_object_unref (view);
  g_assert_null (g_weak_ref_get (&weak));
  g_weak_ref_clear (&weak);
}

/* Where the members must be padded apart, the import copies and releases
 * the producer's tensor at once; the values are the same. */
static void
test_dlpack_import_copy (void)
{
  g_autoptr(GmlpDevice) device = gmlp_device_new (GMLP_DEVICE_KIND_CPU, 0, NULL);
  gint64 rows[] = { 2, 0, 5 };
  g_autoptr(GBytes) in = gmlp_test_random_bytes (GMLP_DTYPE_FLOAT32, 7 * 3, 1.0, FALSE);
  g_autoptr(GBytes) got = NULL;
  g_autoptr(GmlpGroupedTensor) t = NULL;
  g_autoptr(GError) error = NULL;
  DLDataType f32 = { kDLFloat, 32, 1 };
  int deleted = 0;
  HostProducer *p = host_producer_new (f32, 7, 3, in, &deleted);

  t = gmlp_grouped_tensor_new_from_dlpack (device, &p->managed, rows, 3, &error);
  g_assert_no_error (error);
  g_assert_cmpint (deleted, ==, 1);
  g_assert_cmpint (gmlp_grouped_tensor_get_member_offset (t, 2) % GMLP_MEMBER_ALIGNMENT, ==, 0);
  got = download (t);
  assert_bytes_equal (got, in);
}

/* The same copy on every backend: libgmlp's own export seen as narrower
 * rows (16 bytes), which groups of these sizes must pad apart. */
static void
test_dlpack_import_copy_device (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  gint64 rows[] = { 12 }, regrouped[] = { 100, 0, 92 };
  g_autoptr(GmlpGroupedTensor) imported = NULL;
  g_autoptr(GBytes) want = NULL, got = NULL;
  g_autoptr(GError) error = NULL;
  GmlpGroupedTensor *t;
  DLManagedTensor *m;
  GWeakRef weak;

  if (device == NULL)
    return;

  t = gmlp_test_random_tensor (device, GMLP_DTYPE_BFLOAT16, rows, 1, 128, 1.0, NULL);
  want = download (t);
  m = gmlp_grouped_tensor_to_dlpack (t, &error);
  g_assert_no_error (error);
  m->dl_tensor.shape[0] = 12 * 128 / 8;
  m->dl_tensor.shape[1] = 8;
  g_weak_ref_init (&weak, t);
  g_object_unref (t);

  imported = gmlp_grouped_tensor_new_from_dlpack (device, m, regrouped, 3, &error);
  g_assert_no_error (error);
  /* Copied, and the export released at once. */
  g_assert_null (g_weak_ref_get (&weak));
  g_weak_ref_clear (&weak);
  g_assert_cmpint (gmlp_grouped_tensor_get_member_offset (imported, 2), ==, 1792);
  got = download (imported);
  assert_bytes_equal (got, want);
}

/* Bad imports are refused before anything is kept: the caller still owns
 * the DLPack tensor. */
static void
test_dlpack_import_errors (void)
{
  g_autoptr(GmlpDevice) device = gmlp_device_new (GMLP_DEVICE_KIND_CPU, 0, NULL);
  gint64 rows[] = { 2, 2 }, short_rows[] = { 2, 1 };
  g_autoptr(GBytes) in = gmlp_test_random_bytes (GMLP_DTYPE_FLOAT32, 4 * 64, 1.0, FALSE);
  DLDataType f32 = { kDLFloat, 32, 1 }, u8 = { kDLUInt, 8, 1 }, f32x2 = { kDLFloat, 32, 2 };
  int deleted = 0;
  HostProducer *p;
  GmlpGroupedTensor *t;
  GError *error = NULL;

#define REFUSED(producer, r, code)                                                  \
  G_STMT_START {                                                                    \
    t = gmlp_grouped_tensor_new_from_dlpack (device, &(producer)->managed, r,      \
                                             G_N_ELEMENTS (r), &error);             \
    g_assert_null (t);                                                              \
    g_assert_error (error, GMLP_ERROR, code);                                       \
    g_test_message ("%s", error->message);                                          \
    g_clear_error (&error);                                                         \
    g_assert_cmpint (deleted, ==, 0);                                               \
  } G_STMT_END

  p = host_producer_new (u8, 4, 64, in, &deleted);
  REFUSED (p, rows, GMLP_ERROR_DTYPE_MISMATCH);
  p->managed.dl_tensor.dtype = f32x2;
  REFUSED (p, rows, GMLP_ERROR_DTYPE_MISMATCH);
  p->managed.dl_tensor.dtype = f32;
  p->managed.dl_tensor.device.device_type = kDLCUDA;
  REFUSED (p, rows, GMLP_ERROR_INVALID_ARGUMENT);
  p->managed.dl_tensor.device.device_type = kDLCPU;
  /* A transpose: column-major strides. */
  p->strides[0] = 1;
  p->strides[1] = 4;
  REFUSED (p, rows, GMLP_ERROR_INVALID_ARGUMENT);
  /* Every other row. */
  p->strides[0] = 128;
  p->strides[1] = 1;
  REFUSED (p, rows, GMLP_ERROR_INVALID_ARGUMENT);
  p->strides[0] = 64;
  p->managed.dl_tensor.ndim = 3;
  p->shape[2] = 1;
  REFUSED (p, rows, GMLP_ERROR_INVALID_ARGUMENT);
  p->managed.dl_tensor.ndim = 2;
  REFUSED (p, short_rows, GMLP_ERROR_INVALID_ARGUMENT);

  /* Compact strides pass, NULL strides too. */
  p->managed.dl_tensor.strides = NULL;
  t = gmlp_grouped_tensor_new_from_dlpack (device, &p->managed, rows, 2, &error);
  g_assert_no_error (error);
  g_assert_cmpint (deleted, ==, 0);
  g_object_unref (t);
  g_assert_cmpint (deleted, ==, 1);
#undef REFUSED
}

/* The typed constructors and readers, against float64 references. */
static void
test_typed_arrays (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  static const GmlpDType floats[] = { GMLP_DTYPE_FLOAT32, GMLP_DTYPE_FLOAT16,
                                      GMLP_DTYPE_BFLOAT16, GMLP_DTYPE_FLOAT8_E4M3 };
  gint64 rows[] = { 3, 0, 4 };
  const gint64 cols = 5, n = 7 * 5;
  g_autoptr(GError) error = NULL;
  float values[7 * 5];
  gint64 ints[7 * 5];
  gsize i, k, n_out;

  if (device == NULL)
    return;

  for (i = 0; i < (gsize) n; i++)
    {
      values[i] = (float) gmlp_test_normal (3.0, GMLP_DTYPE_FLOAT32);
      ints[i] = g_test_rand_int_range (-1000000, 1000000) * (gint64) 3000;
    }

  for (k = 0; k < G_N_ELEMENTS (floats); k++)
    {
      g_autoptr(GmlpGroupedTensor) t =
        gmlp_grouped_tensor_new_from_floats (device, floats[k], rows, 3, cols, values, n, &error);
      g_autofree float *back = NULL;

      g_assert_no_error (error);
      g_assert_cmpint (gmlp_grouped_tensor_get_dtype (t), ==, floats[k]);
      back = gmlp_grouped_tensor_to_floats (t, &n_out, &error);
      g_assert_no_error (error);
      g_assert_cmpuint (n_out, ==, n);
      for (i = 0; i < (gsize) n; i++)
        g_assert_cmpfloat (back[i], ==, gmlp_test_round (values[i], floats[k]));
    }

  {
    g_autoptr(GmlpGroupedTensor) t64 =
      gmlp_grouped_tensor_new_from_ints (device, GMLP_DTYPE_INT64, rows, 3, cols, ints, n, &error);
    g_autofree gint64 *back = NULL;

    g_assert_no_error (error);
    back = gmlp_grouped_tensor_to_ints (t64, &n_out, &error);
    g_assert_no_error (error);
    g_assert_cmpuint (n_out, ==, n);
    g_assert_cmpmem (back, n * sizeof (gint64), ints, n * sizeof (gint64));
    /* Past the INT32 range: refused, not saturated. */
    g_assert_null (gmlp_grouped_tensor_new_from_ints (device, GMLP_DTYPE_INT32, rows, 3, cols,
                                                      ints, n, &error));
    g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
    g_clear_error (&error);
    /* Integers do not read as floats, nor floats as integers. */
    g_assert_null (gmlp_grouped_tensor_to_floats (t64, &n_out, &error));
    g_assert_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED);
    g_clear_error (&error);
  }
  for (i = 0; i < (gsize) n; i++)
    ints[i] = g_test_rand_int ();
  {
    g_autoptr(GmlpGroupedTensor) t32 =
      gmlp_grouped_tensor_new_from_ints (device, GMLP_DTYPE_INT32, rows, 3, cols, ints, n, &error);
    g_autofree gint64 *back = NULL;

    g_assert_no_error (error);
    g_assert_cmpint (gmlp_grouped_tensor_get_dtype (t32), ==, GMLP_DTYPE_INT32);
    back = gmlp_grouped_tensor_to_ints (t32, NULL, &error);
    g_assert_no_error (error);
    g_assert_cmpmem (back, n * sizeof (gint64), ints, n * sizeof (gint64));
  }

  /* 16-bit raw: the bits go in and out unchanged, NaN payloads included. */
  for (k = 0; k < 2; k++)
    {
      GmlpDType dtype = k == 0 ? GMLP_DTYPE_FLOAT16 : GMLP_DTYPE_BFLOAT16;
      guint16 bits[7 * 5];
      g_autoptr(GmlpGroupedTensor) h = NULL;
      g_autofree guint16 *back = NULL;
      g_autofree float *wide = NULL;

      for (i = 0; i < (gsize) n; i++)
        bits[i] = (guint16) g_test_rand_int_range (0, 65536);
      h = gmlp_grouped_tensor_new_from_uint16 (device, dtype, rows, 3, cols, bits, n, &error);
      g_assert_no_error (error);
      back = gmlp_grouped_tensor_to_uint16 (h, &n_out, &error);
      g_assert_no_error (error);
      g_assert_cmpuint (n_out, ==, n);
      g_assert_cmpmem (back, n * sizeof (guint16), bits, n * sizeof (guint16));
      wide = gmlp_grouped_tensor_to_floats (h, NULL, &error);
      g_assert_no_error (error);
      for (i = 0; i < (gsize) n; i++)
        {
          double want = gmlp_test_decode (bits, dtype, i);

          if (isnan (want))
            g_assert_true (isnan (wide[i]));
          else
            g_assert_cmpfloat (wide[i], ==, want);
        }
    }

  /* Wrong lengths and dtypes: errors, nothing made. */
  g_assert_null (gmlp_grouped_tensor_new_from_floats (device, GMLP_DTYPE_FLOAT32, rows, 3, cols,
                                                      values, n - 1, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);
  g_assert_null (gmlp_grouped_tensor_new_from_floats (device, GMLP_DTYPE_INT32, rows, 3, cols,
                                                      values, n, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_DTYPE_MISMATCH);
  g_clear_error (&error);
  g_assert_null (gmlp_grouped_tensor_new_from_ints (device, GMLP_DTYPE_FLOAT32, rows, 3, cols,
                                                    ints, n, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_DTYPE_MISMATCH);
  g_clear_error (&error);
  g_assert_null (gmlp_grouped_tensor_new_from_uint16 (device, GMLP_DTYPE_FLOAT32, rows, 3, cols,
                                                      NULL, 0, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_DTYPE_MISMATCH);
  g_clear_error (&error);
  {
    g_autoptr(GmlpGroupedTensor) f =
      gmlp_grouped_tensor_new_from_floats (device, GMLP_DTYPE_FLOAT32, rows, 3, cols,
                                           values, n, &error);

    g_assert_null (gmlp_grouped_tensor_to_uint16 (f, NULL, &error));
    g_assert_error (error, GMLP_ERROR, GMLP_ERROR_DTYPE_MISMATCH);
    g_clear_error (&error);
    g_assert_null (gmlp_grouped_tensor_to_ints (f, NULL, &error));
    g_assert_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED);
    g_clear_error (&error);
  }
}

int
main (int argc, char *argv[])
{
  setlocale (LC_ALL, "");
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Gmlp/GroupedTensor/round-trip", test_round_trip);
  g_test_add_func ("/Gmlp/GroupedTensor/alignment", test_alignment);
  g_test_add_func ("/Gmlp/GroupedTensor/views", test_views);
  g_test_add_func ("/Gmlp/GroupedTensor/uniform", test_uniform);
  g_test_add_func ("/Gmlp/GroupedTensor/convert", test_convert);
  g_test_add_func ("/Gmlp/GroupedTensor/edge-shapes", test_edge_shapes);
  g_test_add_func ("/Gmlp/GroupedTensor/device-sizes", test_device_sizes);
  g_test_add_func ("/Gmlp/GroupedTensor/fill-random", test_fill_random);
  g_test_add_func ("/Gmlp/GroupedTensor/bad-input", test_bad_input);
  g_test_add_func ("/Gmlp/GroupedTensor/arithmetic", test_arithmetic);
  g_test_add_func ("/Gmlp/GroupedTensor/dlpack", test_dlpack);
  g_test_add_func ("/Gmlp/GroupedTensor/dlpack-import", test_dlpack_import);
  g_test_add_func ("/Gmlp/GroupedTensor/dlpack-import-copy", test_dlpack_import_copy);
  g_test_add_func ("/Gmlp/GroupedTensor/dlpack-import-copy-device", test_dlpack_import_copy_device);
  g_test_add_func ("/Gmlp/GroupedTensor/dlpack-import-errors", test_dlpack_import_errors);
  g_test_add_func ("/Gmlp/GroupedTensor/typed-arrays", test_typed_arrays);
  g_test_add_func ("/Gmlp/GroupedTensor/convert-int64-saturates", test_convert_int64_saturates);
  g_test_add_func ("/Gmlp/GroupedTensor/scalar-range", test_scalar_range);
  g_test_add_func ("/Gmlp/GroupedTensor/sum-squares-range", test_sum_squares_range);
  g_test_add_func ("/Gmlp/GroupedTensor/same-as-cpu", test_same_as_cpu);

  return g_test_run ();
}
