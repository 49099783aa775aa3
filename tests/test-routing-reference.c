/* test-routing-reference.c: the reference map of test-routing and the
 * routings, tokens and permuted tensors its parts make
 *
 * The map as documented, computed expert by expert; a tensor in the
 * permuted layout read back slot by slot against it; the routing's own
 * map checked against it (see test-routing.c).
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "test-routing.h"

GmlpGroupedTensor *
upload (GmlpDevice    *device,
        GmlpDType      dtype,
        gconstpointer  data,
        gint64         rows,
        gint64         cols)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GBytes) bytes = g_bytes_new (data, rows * cols * gmlp_dtype_get_size (dtype));
  GmlpGroupedTensor *t = gmlp_grouped_tensor_new_from_bytes (device, dtype, &rows, 1, cols, bytes, &error);

  g_assert_no_error (error);
  return t;
}

float *
random_probs (gint64 n)
{
  float *p = g_new (float, MAX (n, 1));
  gint64 i;

  for (i = 0; i < n; i++)
    p[i] = (float) g_test_rand_double_range (0.05, 1.0);
  return p;
}

/* A routing of the caller's indices, with @probs (random when NULL); its
 * tensors in *indices_out and *probs_out when asked. */
GmlpRouting *
make_routing (GmlpDevice          *device,
              const gint64        *idx,
              const float         *probs,
              gint64               T,
              guint                k,
              guint                E,
              GmlpGroupedTensor  **indices_out,
              GmlpGroupedTensor  **probs_out)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedTensor) indices = upload (device, GMLP_DTYPE_INT64, idx, T, k);
  g_autoptr(GmlpGroupedTensor) probs_t = upload (device, GMLP_DTYPE_FLOAT32, probs, T, k);
  GmlpRouting *routing = gmlp_routing_new (device, indices, probs_t, E, &error);

  g_assert_no_error (error);
  g_assert_nonnull (routing);
  if (indices_out != NULL)
    *indices_out = g_object_ref (indices);
  if (probs_out != NULL)
    *probs_out = g_object_ref (probs_t);
  return routing;
}

void
ref_map_free (RefMap *m)
{
  g_free (m->sizes);
  g_free (m->slot_of);
  g_free (m->choice_of);
  g_free (m);
}

RefMap *
ref_map_new (const gint64 *idx,
             gint64        T,
             guint         k,
             guint         E,
             guint         padding,
             double        capacity_factor)
{
  RefMap *m = g_new0 (RefMap, 1);
  gint64 n = T * k, c, p = MAX (padding, 1), dropless;
  guint e;

  m->T = T, m->k = k, m->E = E, m->padding = p;
  m->expert_capacity = gmlp_test_router_ref_capacity (n, E, padding, capacity_factor);
  dropless = n + MIN ((gint64) E, n) * (p - 1);
  m->row_capacity = dropless;
  if (m->expert_capacity >= 0)
    m->row_capacity = MIN (dropless, m->expert_capacity * (gint64) E);

  m->sizes = g_new0 (gint64, E);
  m->slot_of = g_new (gint64, MAX (n, 1));
  for (c = 0; c < n; c++)
    m->slot_of[c] = -1;
  for (e = 0; e < E; e++)
    {
      gint64 kept = 0;

      for (c = 0; c < n; c++)
        if (idx[c] == (gint64) e && (m->expert_capacity < 0 || kept < m->expert_capacity))
          m->slot_of[c] = m->total + kept++;
      m->sizes[e] = (kept + p - 1) / p * p;
      m->total += m->sizes[e];
    }
  g_assert_cmpint (m->total, <=, m->row_capacity);
  m->choice_of = g_new (gint64, MAX (m->total, 1));
  for (c = 0; c < m->total; c++)
    m->choice_of[c] = -1;
  for (c = 0; c < n; c++)
    if (m->slot_of[c] >= 0)
      m->choice_of[m->slot_of[c]] = c;
  return m;
}

/* The values of a tensor in the permuted layout, slot by slot, after
 * checking that its device sizes are the reference's. */
double *
download_permuted (GmlpGroupedTensor *t,
                   const RefMap      *m)
{
  g_autoptr(GError) error = NULL;
  g_autofree gint64 *sizes = NULL;
  g_autoptr(GmlpGroupedTensor) view = NULL;
  guint n, e;

  g_assert_false (gmlp_grouped_tensor_has_host_sizes (t));
  g_assert_cmpuint (gmlp_grouped_tensor_get_n_groups (t), ==, m->E);
  g_assert_cmpint (gmlp_grouped_tensor_get_row_capacity (t), ==, m->row_capacity);
  sizes = gmlp_grouped_tensor_read_sizes (t, &n, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (n, ==, m->E);
  for (e = 0; e < m->E; e++)
    {
      g_assert_cmpint (sizes[e], ==, m->sizes[e]);
      g_assert_cmpint (sizes[e] % m->padding, ==, 0);
    }
  view = gmlp_test_host_view (t, sizes);
  return gmlp_test_download (view, NULL);
}

/* The routing's own map equals the reference, choice by choice and slot
 * by slot (-1 for padding rows and the slots past the last). */
void
assert_map (GmlpRouting  *routing,
            const RefMap *m)
{
  g_autofree gint64 *row_of = NULL, *choice_of = NULL;
  gsize n;
  gint64 c, s;

  g_assert_nonnull (routing->row_of);
  row_of = gmlp_test_download_i64 (routing->row_of, &n);
  g_assert_cmpuint (n, ==, m->T * m->k);
  for (c = 0; c < m->T * m->k; c++)
    if (row_of[c] != m->slot_of[c])
      g_error ("row of choice %" G_GINT64_FORMAT ": %" G_GINT64_FORMAT ", expected %" G_GINT64_FORMAT,
               c, row_of[c], m->slot_of[c]);
  choice_of = gmlp_test_download_i64 (routing->choice_of, &n);
  g_assert_cmpuint (n, ==, m->row_capacity);
  for (s = 0; s < m->row_capacity; s++)
    {
      gint64 want = s < m->total ? m->choice_of[s] : -1;

      if (choice_of[s] != want)
        g_error ("choice of slot %" G_GINT64_FORMAT ": %" G_GINT64_FORMAT ", expected %" G_GINT64_FORMAT,
                 s, choice_of[s], want);
    }
}

/* A random tensor in @like's permuted layout: every byte of the
 * allocation random, padding rows included (the library must not read
 * them). A seed gives the same values on every backend; NULL on a lack
 * of memory, where @oom allows it. */
GmlpGroupedTensor *
random_permuted_full (GmlpGroupedTensor  *like,
                      GmlpDType           dtype,
                      gint64              cols,
                      guint64             seed,
                      gboolean            oom)
{
  g_autoptr(GError) error = NULL;
  GmlpGroupedTensor *sizes = gmlp_grouped_tensor_get_sizes (like, &error);
  GmlpGroupedTensor *t;

  g_assert_no_error (error);
  t = gmlp_grouped_tensor_new_with_device_sizes (gmlp_grouped_tensor_get_device (like), dtype, sizes,
                                                 gmlp_grouped_tensor_get_row_capacity (like), cols, &error);
  if (oom && g_error_matches (error, GMLP_ERROR, GMLP_ERROR_OUT_OF_MEMORY))
    return NULL;
  g_assert_no_error (error);
  g_assert_true (gmlp_grouped_tensor_fill_random (t, seed, 1.0, &error));
  g_assert_no_error (error);
  return t;
}

GmlpGroupedTensor *
random_permuted (GmlpGroupedTensor *like,
                 GmlpDType          dtype,
                 gint64             cols,
                 guint64            seed)
{
  return random_permuted_full (like, dtype, cols, seed, FALSE);
}

gint64 *
random_indices (gint64 T,
                guint  k,
                guint  E)
{
  gint64 *idx = g_new (gint64, MAX (T * k, 1));
  gint64 c;

  for (c = 0; c < T * k; c++)
    idx[c] = g_test_rand_int_range (0, E);
  return idx;
}
