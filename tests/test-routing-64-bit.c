/* test-routing-64-bit.c: GmlpRouting past 2^31 elements and 2^32 bytes
 *
 * The map checked whole, the rows on a sample read back in part, with
 * offsets computed here from the documented member layout.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "test-routing.h"

/* FALSE with no error; TRUE, the test skipped, on a lack of memory. */
static gboolean
skipped_for_memory (GError     *error,
                    const char *what)
{
  if (g_error_matches (error, GMLP_ERROR, GMLP_ERROR_OUT_OF_MEMORY))
    {
      g_autofree char *msg = g_strdup_printf ("not enough GPU memory for %s: %s", what, error->message);

      g_test_skip (msg);
      return TRUE;
    }
  g_assert_no_error (error);
  return FALSE;
}

/* Bytes from the start of a permuted tensor's storage to slot s, by the
 * member layout of docs/memory-layout.md. */
static guint64
slot_offset (const RefMap *m,
             gint64        s,
             guint64       row_bytes)
{
  guint64 offset = 0;
  gint64 first = 0;
  guint e;

  for (e = 0; e < m->E; e++)
    {
      if (s < first + m->sizes[e])
        return offset + (guint64) (s - first) * row_bytes;
      offset += ((guint64) m->sizes[e] * row_bytes + 255) / 256 * 256;
      first += m->sizes[e];
    }
  g_assert_not_reached ();
}

/* cols values from byte offset of a tensor's storage, decoded
 * independently of the library: a partial download, so that a sample of
 * rows of a tensor of several GiB can be read. */
static void
read_row (GmlpGroupedTensor *t,
          guint64            offset,
          gint64             cols,
          double            *values)
{
  GmlpDType dtype = gmlp_grouped_tensor_get_dtype (t);
  gsize bytes = cols * gmlp_dtype_get_size (dtype);
  g_autofree guint8 *buf = g_malloc (bytes);
  g_autoptr(GError) error = NULL;
  gint64 h;

  g_assert_true (GMLP_DEVICE_CALL (gmlp_grouped_tensor_get_device (t), download, buf,
                                   (const guint8 *) gmlp_grouped_tensor_get_data (t) + offset, bytes,
                                   &error));
  g_assert_no_error (error);
  for (h = 0; h < cols; h++)
    values[h] = gmlp_test_decode (buf, dtype, h);
}

/* Tokens × k × hidden past 2^31 elements and the permuted tensors past
 * 2^32 bytes (issue 43): every count, slot and offset must be 64-bit. The
 * map is checked whole, the rows on a sample, half of it past 4 GiB. On
 * the GPU only (the CPU suite would take minutes); skipped where the GPU
 * lacks the memory (about 12 GB). */
void
test_64_bit (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  const gint64 T = 69632, H = 4096;
  const guint k = 8, E = 64, padding = 128, n_samples = 64;
  const GmlpDType dtype = GMLP_DTYPE_BFLOAT16;
  const guint64 row_bytes = H * 2, far = (G_GUINT64_CONSTANT (1) << 32) / row_bytes;
  const double tol = gmlp_test_tolerance (dtype);
  g_autofree gint64 *idx = NULL, *sizes = NULL;
  g_autofree float *probs = NULL;
  g_autofree double *a = NULL, *b = NULL, *want = NULL, *gp = NULL;
  g_autoptr(RefMap) m = NULL;
  g_autoptr(GmlpRouting) routing = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, perm = NULL, y = NULL, out = NULL, dx = NULL, go = NULL;
  g_autoptr(GmlpGroupedTensor) grad_y = NULL, grad_probs = NULL;
  g_autoptr(GError) error = NULL;
  gint64 slots[64], tokens[64], h;
  guint i, j, n;

  if (device == NULL)
    return;
  if (gmlp_device_get_kind (device) == GMLP_DEVICE_KIND_CPU)
    {
      g_test_skip ("a GPU test: several GiB of rows");
      return;
    }

  idx = random_indices (T, k, E);
  probs = random_probs (T * k);
  m = ref_map_new (idx, T, k, E, padding, 0.0);
  g_assert_cmpint (T * k * H, >, G_MAXINT32);
  g_assert_cmpuint ((guint64) m->total, >, far);
  routing = make_routing (device, idx, probs, T, k, E, NULL, NULL);

  x = gmlp_grouped_tensor_new (device, dtype, &T, 1, H, &error);
  if (skipped_for_memory (error, "the tokens"))
    return;
  g_assert_true (gmlp_grouped_tensor_fill_random (x, g_test_rand_int (), 1.0, &error));
  g_assert_no_error (error);
  perm = gmlp_routing_permute_full (routing, x, padding, 0.0, &error);
  if (skipped_for_memory (error, "the permuted tokens"))
    return;
  sizes = gmlp_grouped_tensor_read_sizes (perm, &n, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (n, ==, E);
  for (i = 0; i < E; i++)
    g_assert_cmpint (sizes[i], ==, m->sizes[i]);
  assert_map (routing, m);

  /* The sample: the first and last slots and tokens, then random ones,
   * every other one past 4 GiB (a slot there, a token with a row there). */
  slots[0] = 0, slots[1] = m->total - 1;
  tokens[0] = 0, tokens[1] = T - 1;
  for (i = 2; i < n_samples; i++)
    {
      gboolean far_only = i % 2 == 1;

      slots[i] = g_test_rand_int_range (far_only ? (gint32) far : 0, (gint32) m->total);
      for (;;)
        {
          gboolean has_far = FALSE;

          tokens[i] = g_test_rand_int_range (0, (gint32) T);
          for (j = 0; j < k; j++)
            has_far |= m->slot_of[tokens[i] * k + j] >= (gint64) far;
          if (has_far || !far_only)
            break;
        }
    }

  /* Permute: each sampled slot holds its token's row, or zeros. */
  a = g_new (double, H);
  b = g_new (double, H);
  want = g_new (double, H);
  for (i = 0; i < n_samples; i++)
    {
      gint64 c = m->choice_of[slots[i]];

      read_row (perm, slot_offset (m, slots[i], row_bytes), H, a);
      if (c >= 0)
        read_row (x, (guint64) (c / k) * row_bytes, H, b);
      for (h = 0; h < H; h++)
        gmlp_assert_same_value (a[h], c < 0 ? 0.0 : b[h], "permuted past 2^31", slots[i] * H + h);
    }
  g_clear_object (&x);

  /* Combine and permute backward of random rows in the layout. */
  y = random_permuted_full (perm, dtype, H, g_test_rand_int (), TRUE);
  if (y == NULL)
    {
      g_test_skip ("not enough GPU memory for the experts' output");
      return;
    }
  g_clear_object (&perm);
  out = gmlp_routing_combine (routing, y, &error);
  if (skipped_for_memory (error, "combine"))
    return;
  dx = gmlp_routing_permute_backward (routing, y, &error);
  if (skipped_for_memory (error, "the permute's backward"))
    return;
  go = gmlp_grouped_tensor_new (device, dtype, &T, 1, H, &error);
  if (skipped_for_memory (error, "the output gradient"))
    return;
  g_assert_true (gmlp_grouped_tensor_fill_random (go, g_test_rand_int (), 1.0, &error));
  g_assert_no_error (error);
  grad_y = gmlp_routing_combine_backward (routing, go, y, &grad_probs, &error);
  if (skipped_for_memory (error, "combine's backward"))
    return;
  gp = gmlp_test_download (grad_probs, NULL);

  for (i = 0; i < n_samples; i++)
    {
      gint64 t = tokens[i];
      g_autofree double *sum = g_new0 (double, H), *weighted = g_new0 (double, H);
      double gp_want[16] = { 0 }, gp_got[16];

      read_row (go, (guint64) t * row_bytes, H, b);
      for (j = 0; j < k; j++)
        {
          gint64 c = t * k + j, s = m->slot_of[c];

          gp_got[j] = gp[c];
          if (s < 0)
            continue;
          read_row (y, slot_offset (m, s, row_bytes), H, a);
          for (h = 0; h < H; h++)
            {
              sum[h] += a[h];
              weighted[h] += probs[c] * a[h];
              gp_want[j] += b[h] * a[h];
            }
        }
      read_row (out, (guint64) t * row_bytes, H, a);
      gmlp_test_assert_close (a, weighted, H, tol, "combine past 2^31");
      read_row (dx, (guint64) t * row_bytes, H, a);
      gmlp_test_assert_close (a, sum, H, tol, "permute backward past 2^31");
      gmlp_test_assert_close (gp_got, gp_want, k, gmlp_test_tolerance (GMLP_DTYPE_FLOAT32),
                              "grad_probs past 2^31");
    }

  /* grad_y: each sampled slot is its choice's probability times its
   * token's gradient, or zeros. */
  for (i = 0; i < n_samples; i++)
    {
      gint64 c = m->choice_of[slots[i]];

      read_row (grad_y, slot_offset (m, slots[i], row_bytes), H, a);
      if (c >= 0)
        read_row (go, (guint64) (c / k) * row_bytes, H, b);
      for (h = 0; h < H; h++)
        want[h] = c < 0 ? 0.0 : probs[c] * b[h];
      gmlp_test_assert_close (a, want, H, tol, "grad_y past 2^31");
    }
}
