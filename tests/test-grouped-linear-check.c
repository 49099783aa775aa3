/* test-grouped-linear-check.c: problems and checks of test-grouped-linear
 *
 * A problem's inputs and its float64 reference, the error bounds of the
 * sums, layers and device sizes made for a problem, and the checks of a
 * step's outputs and of the rows it may write.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "test-grouped-linear.h"

void
problem_free (Problem *p)
{
  g_free (p->rows);
  g_free (p->x); g_free (p->w); g_free (p->b); g_free (p->dy);
  g_free (p->y); g_free (p->dx); g_free (p->dw); g_free (p->db);
  g_free (p->db_abs); g_free (p->db_terms);
  g_free (p);
}

/* The references; frees those of an earlier call. */
void
problem_reference (Problem *p)
{
  gint64 r0 = 0, r, j;
  guint g;

  g_free (p->y); g_free (p->dx); g_free (p->dw); g_free (p->db);
  g_free (p->db_abs); g_free (p->db_terms);
  p->y = g_new0 (double, MAX (p->total * p->o, 1));
  p->dx = g_new0 (double, MAX (p->total * p->k, 1));
  p->dw = g_new0 (double, p->n * p->o * p->k);
  p->db = g_new0 (double, p->n * p->o);
  gmlp_test_linear_reference (p->rows, p->n, p->k, p->o, p->x, p->w, p->b, p->dy, p->dy,
                              p->y, p->dx, p->dw, p->db);
  p->db_abs = g_new0 (double, p->n * p->o);
  p->db_terms = g_new0 (gint64, p->n);
  for (g = 0; g < p->n; r0 += p->rows[g], g++)
    {
      p->db_terms[g] = p->rows[g];
      for (r = r0; r < r0 + p->rows[g]; r++)
        for (j = 0; j < p->o; j++)
          p->db_abs[g * p->o + j] += fabs (p->dy[r * p->o + j]);
    }
}

/* The unit roundoff of a dtype's round to nearest: half its epsilon. */
double
unit_roundoff (GmlpDType dtype)
{
  switch (dtype)
    {
    case GMLP_DTYPE_FLOAT32: return ldexp (1.0, -24);
    case GMLP_DTYPE_FLOAT16: return ldexp (1.0, -11);
    case GMLP_DTYPE_BFLOAT16: return ldexp (1.0, -8);
    default: g_assert_not_reached ();
    }
}

/* γ_n = n u / (1 − n u) of FP32: a sum of n terms in FP32, in any order,
 * is within γ_{n−1} Σ |term| of the exact sum (Higham, Accuracy and
 * Stability of Numerical Algorithms, §4.2). */
double
gamma32 (gint64 n)
{
  double nu = (double) n * ldexp (1.0, -24);

  g_assert_cmpfloat (nu, <, 0.5);
  return nu / (1.0 - nu);
}

/* The bias gradient, element by element: db = Σ dy is summed in FP32 (in
 * any order: a GPU adds partial sums) and rounded to the dtype, so it is
 * within u |db| + γ_m Σ |dy| of the float64 sum (twice γ, for slack). Not
 * relative to |db| in norm: the sum of m values of either sign can cancel
 * to far less than Σ |dy| (a group of one output column and some 70 rows,
 * FP32, was once 4.2e-5 off in that norm, against 2e-5; its FP32 sum was
 * as good as FP32 sums are). A group without rows must give exact zeros. */
void
assert_dbias_group (const double *got, const Problem *p, guint g, const char *what)
{
  const double *want = p->db + g * p->o, *abs_sum = p->db_abs + g * p->o;
  double u = unit_roundoff (p->dtype), gamma = 2.0 * gamma32 (MAX (p->db_terms[g], 1));
  gint64 j;

  for (j = 0; j < p->o; j++)
    if (!(fabs (got[j] - want[j]) <= u * fabs (want[j]) + gamma * abs_sum[j]))
      g_error ("%s, group %u [%" G_GINT64_FORMAT "]: %.9g for %.9g, more than u |db| + 2 γ_%"
               G_GINT64_FORMAT " Σ |dy| = %.3g off", what, g, j, got[j], want[j], p->db_terms[g],
               u * fabs (want[j]) + gamma * abs_sum[j]);
}

void
check_dbias (GmlpGroupedTensor *t, const Problem *p, const char *what)
{
  g_autofree double *got = NULL;
  gsize n;
  guint g;

  got = gmlp_test_download (t, &n);
  g_assert_cmpuint (n, ==, p->n * p->o);
  for (g = 0; g < p->n; g++)
    assert_dbias_group (got + g * p->o, p, g, what);
}

GBytes *
encode_values (const double *values, gsize n, GmlpDType dtype)
{
  gsize size = gmlp_dtype_get_size (dtype), i;
  guint8 *data = g_malloc (MAX (n * size, 1));

  for (i = 0; i < n; i++)
    {
      float f = (float) values[i];
      if (dtype == GMLP_DTYPE_FLOAT32)
        ((float *) data)[i] = f;
      else if (dtype == GMLP_DTYPE_FLOAT16)
        ((guint16 *) data)[i] = gmlp_dtype_float_to_half (f);
      else
        ((guint16 *) data)[i] = gmlp_dtype_float_to_bfloat16 (f);
    }
  return g_bytes_new_take (data, n * size);
}

/* Makes a problem, sets the layer's parameters to its values and returns the
 * input and output-gradient tensors. */
Problem *
problem_new (GmlpGroupedLinear  *layer,
             const gint64       *rows,
             GmlpGroupedTensor **x,
             GmlpGroupedTensor **dy)
{
  GmlpDevice *device = gmlp_grouped_linear_get_device (layer);
  gboolean has_bias = (gmlp_grouped_linear_get_flags (layer) & GMLP_LINEAR_BIAS) != 0;
  Problem *p = g_new0 (Problem, 1);
  g_autoptr(GBytes) wb = NULL, bb = NULL;
  g_autoptr(GError) error = NULL;
  gsize i;
  guint g;

  p->n = gmlp_grouped_linear_get_n_groups (layer);
  p->k = gmlp_grouped_linear_get_in_features (layer);
  p->o = gmlp_grouped_linear_get_out_features (layer);
  p->dtype = gmlp_grouped_linear_get_dtype (layer);
  p->rows = g_memdup2 (rows, p->n * sizeof (gint64));
  for (g = 0; g < p->n; g++)
    p->total += rows[g];

  /* Parameters: random, rounded to the layer's dtype as stored. */
  p->w = g_new (double, p->n * p->o * p->k);
  for (i = 0; i < (gsize) (p->n * p->o * p->k); i++)
    p->w[i] = gmlp_test_round ((float) g_test_rand_double_range (-0.5, 0.5), p->dtype);
  wb = encode_values (p->w, p->n * p->o * p->k, p->dtype);
  g_assert_true (gmlp_grouped_linear_set_weight_from_bytes (layer, wb, &error));
  g_assert_no_error (error);
  if (has_bias)
    {
      p->b = g_new (double, p->n * p->o);
      for (i = 0; i < (gsize) (p->n * p->o); i++)
        p->b[i] = gmlp_test_round ((float) g_test_rand_double_range (-1.0, 1.0), p->dtype);
      bb = encode_values (p->b, p->n * p->o, p->dtype);
      g_assert_true (gmlp_grouped_linear_set_bias_from_bytes (layer, bb, &error));
      g_assert_no_error (error);
    }

  *x = gmlp_test_random_tensor (device, p->dtype, rows, p->n, p->k, 1.0, &p->x);
  *dy = gmlp_test_random_tensor (device, p->dtype, rows, p->n, p->o, 1.0, &p->dy);
  problem_reference (p);
  return p;
}

/* Checks a packed per-group result group by group, so that an empty
 * reference group must be exactly zero. */
void
assert_groups_close (const double *got, const double *want, const Problem *p,
                     const gint64 *group_len, double tol, const char *what)
{
  gsize offset = 0;
  guint g;

  for (g = 0; g < p->n; g++)
    {
      g_autofree char *name = g_strdup_printf ("%s, group %u", what, g);
      gmlp_test_assert_close (got + offset, want + offset, group_len[g], tol, name);
      offset += group_len[g];
    }
}

void
check_output (GmlpGroupedTensor *t, const double *want, const Problem *p, gint64 cols,
              const char *what)
{
  g_autofree double *got = NULL;
  g_autofree gint64 *len = g_new (gint64, p->n);
  gsize n;
  guint g;

  got = gmlp_test_download (t, &n);
  g_assert_cmpuint (n, ==, p->total * cols);
  for (g = 0; g < p->n; g++)
    len[g] = p->rows[g] * cols;
  assert_groups_close (got, want, p, len, gmlp_test_tolerance (p->dtype), what);
}

/* Weight-shaped results: n_groups blocks of len each. */
void
check_per_group (GmlpGroupedTensor *t, const double *want, const Problem *p, gint64 len,
                 double tol, const char *what)
{
  g_autofree double *got = NULL;
  g_autofree gint64 *lens = g_new (gint64, p->n);
  gsize n;
  guint g;

  got = gmlp_test_download (t, &n);
  g_assert_cmpuint (n, ==, p->n * len);
  for (g = 0; g < p->n; g++)
    lens[g] = len;
  assert_groups_close (got, want, p, lens, tol, what);
}

GmlpGroupedLinear *
new_layer (GmlpDevice *device, guint n, gint64 k, gint64 o, GmlpDType dtype, GmlpLinearFlags flags)
{
  g_autoptr(GError) error = NULL;
  GmlpGroupedLinear *layer = gmlp_grouped_linear_new_full (device, n, k, o, dtype, flags, &error);

  g_assert_no_error (error);
  g_assert_nonnull (layer);
  return layer;
}

/* ---- Group sizes on the device --------------------------------------------
 *
 * The layer reads device sizes on the device only. A test builds such a
 * tensor from the host-sizes tensor of a Problem (the same bytes: the
 * layouts agree on every member that has rows) and reads the results back
 * through host-sizes views of the same storage, with the rows the kernels
 * use, which the test works out itself from docs/memory-layout.md. */

/* The sizes tensor: one member of n INT64 values. */
GmlpGroupedTensor *
sizes_tensor (GmlpDevice *device, const gint64 *sizes, guint n)
{
  g_autoptr(GBytes) bytes = g_bytes_new (sizes, n * sizeof (gint64));
  g_autoptr(GError) error = NULL;
  gint64 len = n;
  GmlpGroupedTensor *t = gmlp_grouped_tensor_new_from_bytes (device, GMLP_DTYPE_INT64, &len, 1, 1,
                                                             bytes, &error);

  g_assert_no_error (error);
  return t;
}

static gint64
round_up_256 (gint64 bytes)
{
  return (bytes + 255) / 256 * 256;
}

/* The rows each group gets from device sizes, by docs/memory-layout.md: a
 * negative size counts as 0; member g starts at Σ_{j<g} align256 (size_j ×
 * row_bytes) with the sizes as given; and it keeps the rows that fit, from
 * there, in the allocation of every operand (row_bytes[o] wide): capacity
 * rows plus 255 bytes per member (none when rows are multiples of 256),
 * rounded up to 256. */
gint64 *
fitting_rows (const gint64 *sizes, guint n, gint64 capacity, const gint64 *row_bytes, guint n_ops)
{
  gint64 *fit = g_new (gint64, n);
  gint64 alloc[2], offset[2] = { 0, 0 };
  guint g, o;

  g_assert_cmpuint (n_ops, <=, 2);
  for (o = 0; o < n_ops; o++)
    alloc[o] = round_up_256 (capacity * row_bytes[o] + (row_bytes[o] % 256 != 0 ? 255 * (gint64) n : 0));
  for (g = 0; g < n; g++)
    {
      gint64 rows = MAX (sizes[g], 0);

      fit[g] = rows;
      for (o = 0; o < n_ops; o++)
        {
          gint64 room = offset[o] < alloc[o] ? (alloc[o] - offset[o]) / row_bytes[o] : 0;
          fit[g] = MIN (fit[g], room);
        }
      for (o = 0; o < n_ops; o++)
        offset[o] += round_up_256 (rows * row_bytes[o]);
    }
  return fit;
}

/* Outside the first rows[g] rows of each member (laid out by @sizes), every
 * byte of @t still holds the poison of fresh memory (GMLP_DEBUG=poison: 0xff): the
 * kernels wrote nothing else. */
void
assert_only_rows_written (GmlpGroupedTensor *t, const gint64 *sizes, const gint64 *rows)
{
  GmlpDevice *device = gmlp_grouped_tensor_get_device (t);
  guint n = gmlp_grouped_tensor_get_n_groups (t);
  gsize nbytes = gmlp_grouped_tensor_get_nbytes (t);
  gint64 row_bytes = gmlp_grouped_tensor_get_cols (t) * gmlp_dtype_get_size (gmlp_grouped_tensor_get_dtype (t));
  g_autofree guint8 *bytes = g_malloc (nbytes);
  g_autofree guint8 *written = g_malloc0 (nbytes);
  g_autoptr(GError) error = NULL;
  gint64 offset = 0;
  gsize i;
  guint g;

  if (!gmlp_test_poisoned ())
    return;
  g_assert_true (GMLP_DEVICE_CALL (device, download, bytes, gmlp_grouped_tensor_get_data (t), nbytes, &error));
  g_assert_no_error (error);
  for (g = 0; g < n; g++)
    {
      if (rows[g] > 0)
        {
          g_assert_cmpint (offset + rows[g] * row_bytes, <=, (gint64) nbytes);
          memset (written + offset, 1, rows[g] * row_bytes);
        }
      offset += round_up_256 (MAX (sizes[g], 0) * row_bytes);
    }
  for (i = 0; i < nbytes; i++)
    if (!written[i] && bytes[i] != 0xff)
      g_error ("byte %" G_GSIZE_FORMAT " of %" G_GSIZE_FORMAT " outside the rows was written", i, nbytes);
}

/* Replaces the host-sizes tensors *x and *dy by copies whose sizes (the
 * same values: rows, all of which fit) are only on the device; dy gets a
 * sizes tensor of its own. */
void
move_sizes_to_device (GmlpGroupedTensor **x, GmlpGroupedTensor **dy, const gint64 *rows, guint n,
                      gint64 slack)
{
  GmlpDevice *device = gmlp_grouped_tensor_get_device (*x);
  g_autoptr(GmlpGroupedTensor) x_sizes = sizes_tensor (device, rows, n);
  g_autoptr(GmlpGroupedTensor) dy_sizes = sizes_tensor (device, rows, n);
  GmlpGroupedTensor *x_dev, *dy_dev;
  gint64 capacity = slack;
  guint g;

  for (g = 0; g < n; g++)
    capacity += rows[g];
  x_dev = gmlp_test_device_sized_copy (*x, x_sizes, capacity);
  dy_dev = gmlp_test_device_sized_copy (*dy, dy_sizes, capacity);
  g_object_unref (*x);
  g_object_unref (*dy);
  *x = x_dev;
  *dy = dy_dev;
}

gboolean
on_cpu (GmlpDevice *device)
{
  return gmlp_device_get_kind (device) == GMLP_DEVICE_KIND_CPU;
}

/* One forward and backward of a fresh problem on @layer, every result
 * checked against the float64 reference within the dtype's tolerance. */
void
run_and_check (GmlpGroupedLinear *layer, const gint64 *rows)
{
  g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, y = NULL, dx = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GError) error = NULL;
  g_autoptr(Problem) p = problem_new (layer, rows, &x, &dy);
  double tol = gmlp_test_tolerance (p->dtype);

  y = gmlp_grouped_linear_forward (layer, x, &saved, &error);
  g_assert_no_error (error);
  check_output (y, p->y, p, p->o, "fprop");

  dx = gmlp_grouped_linear_backward (layer, saved, dy, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_saved_activations_is_consumed (saved));
  check_output (dx, p->dx, p, p->k, "dgrad");
  check_per_group (gmlp_grouped_linear_get_wgrad (layer), p->dw, p, p->o * p->k, tol, "wgrad");
  if (gmlp_grouped_linear_get_flags (layer) & GMLP_LINEAR_BIAS)
    check_dbias (gmlp_grouped_linear_get_bgrad (layer), p, "dbias");
}
