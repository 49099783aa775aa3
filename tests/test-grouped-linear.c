/* test-grouped-linear.c: GroupedLinear against float64 references
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <locale.h>
#include <math.h>
#include <string.h>

#include "gmlp-test-util.h"
/* Host views over tensors with device sizes, and raw device copies. */
#include "gmlp-grouped-tensor-private.h"

static const GmlpDType layer_dtypes[] = {
  GMLP_DTYPE_FLOAT32, GMLP_DTYPE_FLOAT16, GMLP_DTYPE_BFLOAT16,
};

/* A problem: the layer's shapes and fresh random data, with its float64
 * reference results. */
typedef struct {
  guint      n;
  gint64     k, o;            /* in_features, out_features */
  gint64    *rows;
  gint64     total;
  GmlpDType  dtype;
  double    *x, *w, *b, *dy;  /* as stored */
  double    *y, *dx, *dw, *db; /* references */
  /* What bounds the error of db's FP32 sums: per group and column Σ |dy|,
   * and per group the number of terms. */
  double    *db_abs;
  gint64    *db_terms;
} Problem;

static void
problem_free (Problem *p)
{
  g_free (p->rows);
  g_free (p->x); g_free (p->w); g_free (p->b); g_free (p->dy);
  g_free (p->y); g_free (p->dx); g_free (p->dw); g_free (p->db);
  g_free (p->db_abs); g_free (p->db_terms);
  g_free (p);
}
G_DEFINE_AUTOPTR_CLEANUP_FUNC (Problem, problem_free)

/* The references; frees those of an earlier call. */
static void
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
static double
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
static double
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
static void
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

static void
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

static GBytes *
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
static Problem *
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
static void
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

static void
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
static void
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

static GmlpGroupedLinear *
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
static GmlpGroupedTensor *
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
static gint64 *
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
static void
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
static void
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

static gboolean
on_cpu (GmlpDevice *device)
{
  return gmlp_device_get_kind (device) == GMLP_DEVICE_KIND_CPU;
}

/* One forward and backward of a fresh problem on @layer, every result
 * checked against the float64 reference within the dtype's tolerance. */
static void
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

/* fprop, dgrad, wgrad and dbias for every dtype, random shapes with empty
 * groups and sizes that are not multiples of 8 or 16. */
static void
test_numerics (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint d, iter;

  if (device == NULL)
    return;

  for (d = 0; d < G_N_ELEMENTS (layer_dtypes); d++)
    for (iter = 0; iter < 6; iter++)
      {
        guint n = g_test_rand_int_range (1, 7);
        gint64 k = g_test_rand_int_range (1, 90), o = g_test_rand_int_range (1, 90);
        GmlpLinearFlags flags = GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | (iter % 2 ? GMLP_LINEAR_BIAS : 0);
        g_autoptr(GmlpGroupedLinear) layer = new_layer (device, n, k, o, layer_dtypes[d], flags);
        g_autofree gint64 *rows = gmlp_test_random_rows (n, 70);

        run_and_check (layer, rows);
      }
}

/* One group, one group holding every row, 256 groups, odd sizes. */
static void
test_shapes (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint shape;

  if (device == NULL)
    return;

  for (shape = 0; shape < 4; shape++)
    {
      guint n = shape == 0 ? 1 : shape == 2 ? 256 : 5;
      gint64 k = shape == 3 ? 33 : 24, o = shape == 3 ? 17 : 40;
      g_autofree gint64 *rows = g_new0 (gint64, n);
      g_autoptr(GmlpGroupedLinear) layer = NULL;
      guint g;

      if (shape == 0)
        rows[0] = 37;
      else if (shape == 1)
        rows[3] = 123;
      else
        for (g = 0; g < n; g++)
          rows[g] = shape == 2 ? g_test_rand_int_range (0, 6) : g_test_rand_int_range (1, 31);

      layer = new_layer (device, n, k, o, GMLP_DTYPE_BFLOAT16,
                         GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS);
      run_and_check (layer, rows);
    }
}

/* Many experts of a few hundred rows each: on CUDA the batched path, which
 * cuts groups into row tiles plus leftover rows. */
static void
test_many_experts (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint iter;

  if (device == NULL)
    return;

  for (iter = 0; iter < 3; iter++)
    {
      const guint n = 24;
      g_autofree gint64 *rows = g_new (gint64, n);
      g_autoptr(GmlpGroupedLinear) layer = NULL;
      guint g;

      /* Long groups (mostly whole 128-row tiles), short ones, and a mix. */
      for (g = 0; g < n; g++)
        rows[g] = g % 7 == 3 ? 0 : g % 5 == 0 ? 256 :
                  iter == 0 ? g_test_rand_int_range (300, 420) :
                  iter == 1 ? g_test_rand_int_range (1, 120) : g_test_rand_int_range (1, 400);
      layer = new_layer (device, n, 64, 48, layer_dtypes[iter],
                         GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS);
      run_and_check (layer, rows);
    }
}

/* Every group of one size (balanced routing): on CUDA with host sizes, one
 * batched cuBLAS call for all groups instead of a loop. Odd sizes, an empty
 * group among equal ones, and wgrad added into main_grad (the same beta for
 * every product, so batched as well). */
static void
test_equal_groups (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint d, g;

  if (device == NULL)
    return;

  for (d = 0; d < G_N_ELEMENTS (layer_dtypes); d++)
    {
      gint64 equal[] = { 37, 37, 37, 37, 37 }, one_empty[] = { 64, 64, 0, 64, 64 };
      g_autoptr(GmlpGroupedLinear) a = new_layer (device, 5, 40, 24, layer_dtypes[d],
                                                  GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS);
      g_autoptr(GmlpGroupedLinear) b = new_layer (device, 5, 24, 56, layer_dtypes[d],
                                                  GMLP_LINEAR_SINGLE_GROUPED_WEIGHT);

      run_and_check (a, equal);
      run_and_check (b, one_empty);
    }

  for (d = 0; d < G_N_ELEMENTS (layer_dtypes); d++)
    {
      const guint n = 4;
      const gint64 k = 24, o = 40;
      gint64 rows[] = { 33, 33, 33, 33 }, wr[] = { o, o, o, o };
      g_autoptr(GmlpGroupedLinear) layer = new_layer (device, n, k, o, layer_dtypes[d],
                                                      GMLP_LINEAR_SINGLE_GROUPED_WEIGHT |
                                                      GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION);
      g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, y = NULL, dx = NULL, mg = NULL;
      g_autoptr(GmlpSavedActivations) saved = NULL;
      g_autoptr(GError) error = NULL;
      g_autoptr(Problem) p = problem_new (layer, rows, &x, &dy);
      g_autofree double *before = NULL, *got = NULL, *want = g_new (double, n * o * k);
      double tol = MAX (gmlp_test_tolerance (p->dtype), 2e-5);

      mg = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, wr, n, k, 1.0, &before);
      g_assert_true (gmlp_grouped_linear_set_main_grad (layer, mg, &error));
      g_assert_no_error (error);
      y = gmlp_grouped_linear_forward (layer, x, &saved, &error);
      g_assert_no_error (error);
      check_output (y, p->y, p, p->o, "fprop");
      dx = gmlp_grouped_linear_backward (layer, saved, dy, &error);
      g_assert_no_error (error);
      check_output (dx, p->dx, p, p->k, "dgrad");
      g_assert_true (gmlp_grouped_linear_get_grad_added_to_main_grad (layer));
      for (g = 0; g < n * o * k; g++)
        want[g] = before[g] + p->dw[g];
      got = gmlp_test_download (mg, NULL);
      gmlp_test_assert_close (got, want, n * o * k, tol, "main_grad");
    }
}

/* The gradient contract, one row per combination of the three options, as
 * in docs/gradient-contract.md. */
typedef struct {
  gboolean delay, fused, single;
} Combo;

static guint wgrad_ready_count;

static void
count_wgrad_ready (GmlpGroupedLinear *layer, GmlpEvent *event, gpointer data)
{
  g_assert_true (GMLP_IS_EVENT (event));
  wgrad_ready_count++;
}

/* The weight-gradient faces the layer shows: grouped or per group. */
static GmlpGroupedTensor *
face (GmlpGroupedLinear *layer, gboolean single,
      GmlpGroupedTensor *(*grouped) (GmlpGroupedLinear *),
      GmlpGroupedTensor *(*member) (GmlpGroupedLinear *, guint))
{
  GmlpGroupedTensor *g = grouped (layer), *m = member (layer, 0);

  /* Never both faces at once. */
  g_assert_true (g == NULL || m == NULL);
  if (single)
    g_assert_null (m);
  else
    g_assert_null (g);
  return single ? g : m;
}

static void
check_contract_state (GmlpGroupedLinear *layer, const Combo *c, gboolean computed,
                      const Problem *p, const double *main_grad_before, const gboolean *mask,
                      GmlpGroupedTensor **separate_main_grads)
{
  GmlpGroupedTensor *wgrad = face (layer, c->single, gmlp_grouped_linear_get_wgrad,
                                   gmlp_grouped_linear_get_wgrad_member);
  GmlpGroupedTensor *bgrad = face (layer, c->single, gmlp_grouped_linear_get_bgrad,
                                   gmlp_grouped_linear_get_bgrad_member);
  GmlpGroupedTensor *main_grad = face (layer, c->single, gmlp_grouped_linear_get_main_grad,
                                       gmlp_grouped_linear_get_main_grad_member);
  gsize wlen = p->o * p->k;
  double tol = MAX (gmlp_test_tolerance (gmlp_grouped_linear_get_dtype (layer)), 2e-5);
  guint g;

  /* Exists iff the table says so. */
  g_assert_true ((wgrad != NULL) == (computed && !c->fused));
  g_assert_true ((bgrad != NULL) == computed);
  g_assert_true ((main_grad != NULL) == c->fused);
  g_assert_true (gmlp_grouped_linear_get_grad_added_to_main_grad (layer) == (computed && c->fused));
  g_assert_cmpuint (wgrad_ready_count, ==, computed ? 1 : 0);
  g_assert_true ((gmlp_grouped_linear_get_weight (layer) != NULL) == c->single);
  g_assert_true ((gmlp_grouped_linear_get_weight_member (layer, 0) != NULL) == !c->single);

  /* And holds what it says. */
  for (g = 0; g < p->n; g++)
    {
      g_autofree char *name = g_strdup_printf ("group %u", g);
      const double *dw = p->dw + g * wlen;

      if (wgrad != NULL)
        {
          GmlpGroupedTensor *t = c->single ? wgrad : gmlp_grouped_linear_get_wgrad_member (layer, g);
          g_autofree double *got = gmlp_test_download (t, NULL);
          gmlp_test_assert_close (got + (c->single ? g * wlen : 0), dw, wlen, tol, name);
        }
      if (bgrad != NULL)
        {
          GmlpGroupedTensor *t = c->single ? bgrad : gmlp_grouped_linear_get_bgrad_member (layer, g);
          g_autofree double *got = gmlp_test_download (t, NULL);
          assert_dbias_group (got + (c->single ? g * p->o : 0), p, g, name);
        }
      if (main_grad != NULL)
        {
          GmlpGroupedTensor *t = c->single ? main_grad : gmlp_grouped_linear_get_main_grad_member (layer, g);
          g_autofree double *got = gmlp_test_download (t, NULL);
          g_autofree double *want = g_new (double, wlen);
          gsize i;

          if (!c->single)
            g_assert_true (t == separate_main_grads[g]);
          for (i = 0; i < wlen; i++)
            want[i] = !computed ? main_grad_before[g * wlen + i] :
                      mask[g] ? main_grad_before[g * wlen + i] + dw[i] : dw[i];
          gmlp_test_assert_close (got + (c->single ? g * wlen : 0), want, wlen, tol, name);
        }
    }
}

/* The contract holds the same with the group sizes only on the device. */
static void
run_contract (gboolean device_sizes)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint combo;

  if (device == NULL)
    return;

  /* FP32 with odd features, and BF16 with features the Hopper kernel takes
   * (its epilogue adds into the FP32 main_grad). */
  for (combo = 0; combo < 16; combo++)
    {
      Combo c = { combo & 1, (combo >> 1) & 1, (combo >> 2) & 1 };
      const gboolean bf16 = combo >= 8;
      const GmlpDType dtype = bf16 ? GMLP_DTYPE_BFLOAT16 : GMLP_DTYPE_FLOAT32;
      const gint64 k = bf16 ? 16 : 9, o = bf16 ? 24 : 6;
      GmlpLinearFlags flags = GMLP_LINEAR_BIAS |
                              (c.delay ? GMLP_LINEAR_DELAY_WGRAD_COMPUTE : 0) |
                              (c.fused ? GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION : 0) |
                              (c.single ? GMLP_LINEAR_SINGLE_GROUPED_WEIGHT : 0);
      const guint n = 4;
      /* Every case of the mask: rows added, rows written, no rows and
       * main_grad left alone, no rows and main_grad zeroed. */
      gint64 rows[] = { 7, 0, 12, 0 };
      gboolean mask[] = { TRUE, TRUE, FALSE, FALSE };
      g_autoptr(GmlpGroupedLinear) layer = new_layer (device, n, k, o, dtype, flags);
      g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, y = NULL, dx = NULL;
      g_autoptr(GmlpSavedActivations) saved = NULL;
      g_autoptr(GError) error = NULL;
      g_autoptr(Problem) p = problem_new (layer, rows, &x, &dy);
      g_autofree double *main_grad_before = g_new0 (double, n * o * k);
      GmlpGroupedTensor *separate[4] = { NULL, };
      guint g;

      g_test_message ("delay=%d fused=%d single=%d device-sizes=%d %s", c.delay, c.fused, c.single,
                      device_sizes, gmlp_dtype_get_name (dtype));
      if (device_sizes)
        move_sizes_to_device (&x, &dy, rows, n, 3);
      wgrad_ready_count = 0;
      g_signal_connect (layer, "wgrad-ready", G_CALLBACK (count_wgrad_ready), NULL);

      if (c.fused)
        {
          /* The caller's own accumulators, with something in them already. */
          if (c.single)
            {
              g_autoptr(GmlpGroupedTensor) mg = NULL;
              gint64 wr[] = { o, o, o, o };
              g_autofree double *vals = NULL;
              mg = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, wr, n, k, 1.0, &vals);
              memcpy (main_grad_before, vals, sizeof (double) * n * o * k);
              g_assert_true (gmlp_grouped_linear_set_main_grad (layer, mg, &error));
              g_assert_no_error (error);
            }
          else
            for (g = 0; g < n; g++)
              {
                gint64 rows_o = o;
                g_autofree double *vals = NULL;
                separate[g] = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, &rows_o, 1, k, 1.0, &vals);
                memcpy (main_grad_before + g * o * k, vals, sizeof (double) * o * k);
                g_assert_true (gmlp_grouped_linear_set_main_grad_member (layer, g, separate[g], &error));
                g_assert_no_error (error);
              }
          g_assert_true (gmlp_grouped_linear_set_wgrad_accumulation_mask (layer, mask, n, &error));
          g_assert_no_error (error);
        }

      check_contract_state (layer, &c, FALSE, p, main_grad_before, mask, separate);

      y = gmlp_grouped_linear_forward (layer, x, &saved, &error);
      g_assert_no_error (error);
      dx = gmlp_grouped_linear_backward (layer, saved, dy, &error);
      g_assert_no_error (error);
      check_output (dx, p->dx, p, p->k, "dgrad");
      g_assert_cmpuint (gmlp_grouped_linear_get_pending_wgrads (layer), ==, c.delay ? 1 : 0);
      check_contract_state (layer, &c, !c.delay, p, main_grad_before, mask, separate);

      if (c.delay)
        {
          g_assert_true (gmlp_grouped_linear_backward_dw (layer, &error));
          g_assert_no_error (error);
          g_assert_cmpuint (gmlp_grouped_linear_get_pending_wgrads (layer), ==, 0);
          check_contract_state (layer, &c, TRUE, p, main_grad_before, mask, separate);
        }
      g_assert_false (gmlp_grouped_linear_backward_dw (layer, &error));
      g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);

      if (device_sizes)
        g_assert_false (gmlp_grouped_tensor_has_host_sizes (dx));
      for (g = 0; g < n; g++)
        g_clear_object (&separate[g]);
    }
}

static void
test_contract (void)
{
  run_contract (FALSE);
}

/* A handler that waits on the event sees the finished gradients. */
typedef struct {
  const Problem *p;
  guint          calls;
} ReadyCheck;

static void
check_on_wgrad_ready (GmlpGroupedLinear *layer, GmlpEvent *event, ReadyCheck *check)
{
  g_autoptr(GError) error = NULL;
  g_autofree double *got = NULL;

  g_assert_true (gmlp_event_get_device (event) == gmlp_grouped_linear_get_device (layer));
  g_assert_true (gmlp_event_synchronize (event, &error));
  g_assert_no_error (error);
  g_assert_true (gmlp_event_is_complete (event));
  got = gmlp_test_download (gmlp_grouped_linear_get_wgrad (layer), NULL);
  gmlp_test_assert_close (got, check->p->dw, check->p->n * check->p->o * check->p->k, 1e-2,
                          "wgrad in wgrad-ready");
  check->calls++;
}

static void
test_wgrad_ready (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  gint64 rows[] = { 200, 0, 129, 64, 1 };
  g_autoptr(GmlpGroupedLinear) layer = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, y = NULL, dx = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GError) error = NULL;
  g_autoptr(Problem) p = NULL;
  g_autoptr(GmlpEvent) mine = NULL;
  ReadyCheck check = { NULL, 0 };

  if (device == NULL)
    return;

  layer = new_layer (device, 5, 256, 192, GMLP_DTYPE_BFLOAT16, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT);
  p = problem_new (layer, rows, &x, &dy);
  check.p = p;
  g_signal_connect (layer, "wgrad-ready", G_CALLBACK (check_on_wgrad_ready), &check);

  y = gmlp_grouped_linear_forward (layer, x, &saved, &error);
  g_assert_no_error (error);
  dx = gmlp_grouped_linear_backward (layer, saved, dy, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (check.calls, ==, 1);

  /* Events of one's own, and a stream waiting on one. */
  mine = gmlp_event_new_recorded (device, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_event_wait_on_device (mine, device, &error));
  g_assert_no_error (error);
  g_assert_true (gmlp_event_synchronize (mine, &error));
  g_assert_true (gmlp_event_is_complete (mine));
  g_assert_true ((gmlp_event_get_native_handle (mine) != NULL) ==
                 (gmlp_device_get_kind (device) == GMLP_DEVICE_KIND_CUDA));

  /* Device time between two events: the backward's work takes some. */
  {
    g_autoptr(GmlpEvent) start = gmlp_event_new_recorded (device, &error);
    g_autoptr(GmlpEvent) end = NULL;
    g_autoptr(GmlpSavedActivations) saved2 = NULL;
    g_autoptr(GmlpGroupedTensor) y2 = NULL, dx2 = NULL;
    double ms = -1.0;

    y2 = gmlp_grouped_linear_forward (layer, x, &saved2, &error);
    dx2 = gmlp_grouped_linear_backward (layer, saved2, dy, &error);
    g_assert_no_error (error);
    end = gmlp_event_new_recorded (device, &error);
    g_assert_true (gmlp_event_elapsed_ms (start, end, &ms, &error));
    g_assert_no_error (error);
    g_assert_cmpfloat (ms, >, 0.0);
    g_assert_cmpfloat (ms, <, 60000.0);
    g_assert_cmpuint (check.calls, ==, 2);

    if (gmlp_device_get_kind (device) != GMLP_DEVICE_KIND_CPU)
      {
        g_autoptr(GmlpDevice) cpu = gmlp_device_new (GMLP_DEVICE_KIND_CPU, 0, NULL);
        g_autoptr(GmlpEvent) on_cpu = gmlp_event_new_recorded (cpu, NULL);

        g_assert_false (gmlp_event_elapsed_ms (on_cpu, end, &ms, &error));
        g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
        g_clear_error (&error);
        /* A CPU "stream" waits for a GPU event on the host. */
        g_assert_true (gmlp_event_wait_on_device (end, cpu, &error));
        g_assert_no_error (error);
      }
  }
}

/* Several microbatches in flight; backwards in reverse order; delayed
 * weight gradients computed oldest first; fused accumulation sums them. */
static void
run_microbatches (gboolean device_sizes)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint delayed;

  if (device == NULL)
    return;

  for (delayed = 0; delayed < 2; delayed++)
    {
      const guint n = 3, mb = 3;
      GmlpLinearFlags flags = GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION |
                              GMLP_LINEAR_BIAS | (delayed ? GMLP_LINEAR_DELAY_WGRAD_COMPUTE : 0);
      g_autoptr(GmlpGroupedLinear) layer = new_layer (device, n, 20, 11, GMLP_DTYPE_FLOAT32, flags);
      GmlpGroupedTensor *x[3], *dy[3];
      GmlpSavedActivations *saved[3];
      Problem *p[3];
      g_autofree double *sum = g_new0 (double, n * 11 * 20);
      g_autofree double *got = NULL;
      g_autofree gint64 *wlen = g_new (gint64, n);
      g_autoptr(GError) error = NULL;
      guint i, g;
      gsize j;

      /* Every problem first: a backward refuses weights written since its
       * forward (their version), even with the same values. */
      for (i = 0; i < mb; i++)
        {
          g_autofree gint64 *rows = gmlp_test_random_rows (n, 25);

          p[i] = problem_new (layer, rows, &x[i], &dy[i]);
          if (i > 0)
            {
              /* Same parameters for every microbatch: restore the first's. */
              g_autoptr(GBytes) wb = encode_values (p[0]->w, n * 11 * 20, GMLP_DTYPE_FLOAT32);
              g_autoptr(GBytes) bb = encode_values (p[0]->b, n * 11, GMLP_DTYPE_FLOAT32);
              memcpy (p[i]->w, p[0]->w, sizeof (double) * n * 11 * 20);
              memcpy (p[i]->b, p[0]->b, sizeof (double) * n * 11);
              g_assert_true (gmlp_grouped_linear_set_weight_from_bytes (layer, wb, NULL));
              g_assert_true (gmlp_grouped_linear_set_bias_from_bytes (layer, bb, NULL));
              problem_reference (p[i]);
            }
          if (device_sizes)
            move_sizes_to_device (&x[i], &dy[i], rows, n, i);
        }
      for (i = 0; i < mb; i++)
        {
          GmlpGroupedTensor *y = gmlp_grouped_linear_forward (layer, x[i], &saved[i], &error);

          g_assert_no_error (error);
          check_output (y, p[i]->y, p[i], 11, "fprop");
          g_object_unref (y);
          for (j = 0; j < n * 11 * 20; j++)
            sum[j] += p[i]->dw[j];
        }

      for (i = mb; i-- > 0;)
        {
          GmlpGroupedTensor *dx = gmlp_grouped_linear_backward (layer, saved[i], dy[i], &error);
          g_assert_no_error (error);
          check_output (dx, p[i]->dx, p[i], 20, "dgrad");
          g_object_unref (dx);
        }
      g_assert_cmpuint (gmlp_grouped_linear_get_pending_wgrads (layer), ==, delayed ? mb : 0);
      for (i = 0; delayed && i < mb; i++)
        {
          g_assert_true (gmlp_grouped_linear_backward_dw (layer, &error));
          g_assert_no_error (error);
          /* The bias gradient is that of the backward just processed:
           * backwards ran in reverse, so backward_dw i is microbatch mb-1-i. */
          check_dbias (gmlp_grouped_linear_get_bgrad (layer), p[mb - 1 - i], "dbias");
        }

      got = gmlp_test_download (gmlp_grouped_linear_get_main_grad (layer), NULL);
      for (g = 0; g < n; g++)
        wlen[g] = 11 * 20;
      assert_groups_close (got, sum, p[0], wlen, 2e-5, "main_grad after three microbatches");

      for (i = 0; i < mb; i++)
        {
          g_object_unref (x[i]);
          g_object_unref (dy[i]);
          g_object_unref (saved[i]);
          problem_free (p[i]);
        }
    }
}

static void
test_microbatches (void)
{
  run_microbatches (FALSE);
}

/* Bad input: the right error, nothing written, nothing allocated. */
static void
test_bad_input (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpGroupedLinear) layer = NULL, other = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, y = NULL, dx = NULL, x16 = NULL;
  g_autoptr(GmlpGroupedTensor) wide = NULL, three = NULL, dy_short = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL, other_saved = NULL;
  g_autoptr(GBytes) weight_before = NULL, weight_after = NULL, short_bytes = NULL;
  g_autoptr(GError) error = NULL;
  g_autoptr(Problem) p = NULL;
  gint64 rows[] = { 5, 0, 3, 2 };
  gint64 rows3[] = { 5, 3, 2 };
  gint64 rows_short[] = { 5, 0, 2, 2 };
  gboolean mask[] = { TRUE, FALSE, TRUE };
  guint64 in_use;

  if (device == NULL)
    return;

  layer = new_layer (device, 4, 16, 8, GMLP_DTYPE_FLOAT32, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_DELAY_WGRAD_COMPUTE);
  other = new_layer (device, 4, 16, 8, GMLP_DTYPE_FLOAT32, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT);
  p = problem_new (layer, rows, &x, &dy);
  x16 = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT16, rows, 4, 16, 1.0, NULL);
  wide = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, rows, 4, 17, 1.0, NULL);
  three = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, rows3, 3, 16, 1.0, NULL);
  dy_short = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, rows_short, 4, 8, 1.0, NULL);
  y = gmlp_grouped_linear_forward (other, x, &other_saved, &error);
  g_assert_no_error (error);
  g_clear_object (&y);

  weight_before = gmlp_grouped_tensor_to_bytes (gmlp_grouped_linear_get_weight (layer), NULL);
  g_assert_true (gmlp_device_synchronize (device, NULL));
  in_use = gmlp_device_get_bytes_in_use (device);

#define EXPECT_NULL(call, code) \
  G_STMT_START { \
    g_autoptr(GError) _e = NULL; \
    g_autoptr(GmlpSavedActivations) _s = NULL; \
    gpointer _r = (call); \
    g_assert_null (_r); \
    g_assert_error (_e, GMLP_ERROR, (code)); \
    g_assert_null (_s); \
    g_assert_cmpuint (gmlp_device_get_bytes_in_use (device), ==, in_use); \
  } G_STMT_END

  EXPECT_NULL (gmlp_grouped_linear_forward (layer, x16, &_s, &_e), GMLP_ERROR_DTYPE_MISMATCH);
  EXPECT_NULL (gmlp_grouped_linear_forward (layer, wide, &_s, &_e), GMLP_ERROR_SHAPE_MISMATCH);
  EXPECT_NULL (gmlp_grouped_linear_forward (layer, three, &_s, &_e), GMLP_ERROR_SHAPE_MISMATCH);

  /* Saved activations of another layer, output gradients of the wrong shape. */
  y = gmlp_grouped_linear_forward (layer, x, &saved, &error);
  g_assert_no_error (error);
  in_use = gmlp_device_get_bytes_in_use (device);
  EXPECT_NULL (gmlp_grouped_linear_backward (layer, other_saved, dy, &_e), GMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_NULL (gmlp_grouped_linear_backward (layer, saved, x, &_e), GMLP_ERROR_SHAPE_MISMATCH);
  EXPECT_NULL (gmlp_grouped_linear_backward (layer, saved, dy_short, &_e), GMLP_ERROR_SHAPE_MISMATCH);
  EXPECT_NULL (gmlp_grouped_linear_backward (layer, saved, x16, &_e), GMLP_ERROR_DTYPE_MISMATCH);
  g_assert_false (gmlp_saved_activations_is_consumed (saved));
  g_assert_cmpuint (gmlp_grouped_linear_get_pending_wgrads (layer), ==, 0);

  /* Used once: fine; twice: an error. */
  dx = gmlp_grouped_linear_backward (layer, saved, dy, &error);
  g_assert_no_error (error);
  check_output (dx, p->dx, p, 16, "dgrad");
  in_use = gmlp_device_get_bytes_in_use (device);
  EXPECT_NULL (gmlp_grouped_linear_backward (layer, saved, dy, &_e), GMLP_ERROR_INVALID_STATE);

  /* Parameters: wrong lengths, masks, main_grad without fusion. */
  short_bytes = g_bytes_new_static ("abcd", 4);
  g_assert_false (gmlp_grouped_linear_set_weight_from_bytes (layer, short_bytes, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);
  g_assert_false (gmlp_grouped_linear_set_bias_from_bytes (layer, short_bytes, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
  g_clear_error (&error);
  g_assert_false (gmlp_grouped_linear_set_wgrad_accumulation_mask (layer, mask, 3, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);
  g_assert_false (gmlp_grouped_linear_set_main_grad (layer, x, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
  g_clear_error (&error);
  g_assert_false (gmlp_grouped_linear_backward_dw (other, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
  g_clear_error (&error);
  weight_after = gmlp_grouped_tensor_to_bytes (gmlp_grouped_linear_get_weight (layer), NULL);
  g_assert_true (g_bytes_equal (weight_before, weight_after));

  /* Construction: no groups, no features, FP8. */
  EXPECT_NULL (gmlp_grouped_linear_new (device, 0, 4, 4, &_e), GMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_NULL (gmlp_grouped_linear_new (device, 2, 0, 4, &_e), GMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_NULL (gmlp_grouped_linear_new (device, 2, 4, -1, &_e), GMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_NULL (gmlp_grouped_linear_new_full (device, 2, 4, 4, GMLP_DTYPE_FLOAT8_E4M3, 0, &_e), GMLP_ERROR_UNSUPPORTED);
  EXPECT_NULL (gmlp_grouped_linear_new_full (device, 2, 4, 4, GMLP_DTYPE_INT32, 0, &_e), GMLP_ERROR_UNSUPPORTED);
#undef EXPECT_NULL
}

/* Fused accumulation with main_grad checks: dtype, shape, mode. */
static void
test_main_grad_checks (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpGroupedLinear) single = NULL, per_group = NULL;
  g_autoptr(GmlpGroupedTensor) bf16 = NULL, wrong = NULL, member = NULL;
  g_autoptr(GError) error = NULL;
  gint64 r3[] = { 8, 8, 8 };

  if (device == NULL)
    return;

  single = new_layer (device, 3, 4, 8, GMLP_DTYPE_FLOAT32,
                      GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION);
  per_group = new_layer (device, 3, 4, 8, GMLP_DTYPE_FLOAT32, GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION);
  bf16 = gmlp_grouped_tensor_new (device, GMLP_DTYPE_BFLOAT16, r3, 3, 4, NULL);
  wrong = gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, r3, 3, 5, NULL);
  member = gmlp_grouped_tensor_new_uniform (device, GMLP_DTYPE_FLOAT32, 1, 8, 4, NULL);

  g_assert_false (gmlp_grouped_linear_set_main_grad (single, bf16, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_DTYPE_MISMATCH);
  g_clear_error (&error);
  g_assert_false (gmlp_grouped_linear_set_main_grad (single, wrong, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH);
  g_clear_error (&error);
  g_assert_false (gmlp_grouped_linear_set_main_grad_member (single, 0, member, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
  g_clear_error (&error);
  g_assert_false (gmlp_grouped_linear_set_main_grad (per_group, wrong, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
  g_clear_error (&error);
  g_assert_false (gmlp_grouped_linear_set_main_grad_member (per_group, 3, member, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);
  g_assert_true (gmlp_grouped_linear_set_main_grad_member (per_group, 2, member, &error));
  g_assert_no_error (error);
  g_assert_true (gmlp_grouped_linear_get_main_grad_member (per_group, 2) == member);
}

static void
test_properties (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpGroupedLinear) layer = NULL;
  g_autoptr(GError) error = NULL;
  gboolean bias, single, fused, delay;
  guint n;
  gint64 in, out;
  GmlpDType dtype;

  if (device == NULL)
    return;

  layer = g_initable_new (GMLP_TYPE_GROUPED_LINEAR, NULL, &error,
                          "device", device, "n-groups", 6, "in-features", (gint64) 12,
                          "out-features", (gint64) 10, "dtype", GMLP_DTYPE_BFLOAT16,
                          "bias", TRUE, "single-grouped-weight", FALSE,
                          "fuse-wgrad-accumulation", TRUE, NULL);
  g_assert_no_error (error);
  g_object_get (layer, "n-groups", &n, "in-features", &in, "out-features", &out,
                "dtype", &dtype, "bias", &bias, "single-grouped-weight", &single,
                "fuse-wgrad-accumulation", &fused, "delay-wgrad-compute", &delay, NULL);
  g_assert_cmpuint (n, ==, 6);
  g_assert_cmpint (in, ==, 12);
  g_assert_cmpint (out, ==, 10);
  g_assert_cmpint (dtype, ==, GMLP_DTYPE_BFLOAT16);
  g_assert_true (bias && !single && fused && !delay);
  g_assert_cmpint (gmlp_grouped_linear_get_flags (layer), ==,
                   GMLP_LINEAR_BIAS | GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION);
  g_assert_null (gmlp_grouped_linear_get_weight (layer));
  g_assert_cmpint (gmlp_grouped_tensor_get_rows (gmlp_grouped_linear_get_weight_member (layer, 5), 0), ==, 10);
  g_assert_cmpint (gmlp_grouped_tensor_get_cols (gmlp_grouped_linear_get_bias_member (layer, 5)), ==, 10);
  g_assert_cmpint (gmlp_grouped_tensor_get_dtype (gmlp_grouped_linear_get_main_grad_member (layer, 0)), ==,
                   GMLP_DTYPE_FLOAT32);

  /* The seeded initialisation is reproducible and within ±1/√in. */
  {
    g_autoptr(GmlpGroupedLinear) a = new_layer (device, 2, 50, 3, GMLP_DTYPE_FLOAT32, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT);
    g_autoptr(GmlpGroupedLinear) b = new_layer (device, 2, 50, 3, GMLP_DTYPE_FLOAT32, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT);
    g_autoptr(GBytes) wa = NULL, wb = NULL;
    g_autofree double *v = NULL;
    gsize i, nv;

    g_assert_true (gmlp_grouped_linear_init_parameters (a, 77, NULL));
    g_assert_true (gmlp_grouped_linear_init_parameters (b, 77, NULL));
    wa = gmlp_grouped_tensor_to_bytes (gmlp_grouped_linear_get_weight (a), NULL);
    wb = gmlp_grouped_tensor_to_bytes (gmlp_grouped_linear_get_weight (b), NULL);
    g_assert_true (g_bytes_equal (wa, wb));
    v = gmlp_test_download (gmlp_grouped_linear_get_weight (a), &nv);
    for (i = 0; i < nv; i++)
      g_assert_cmpfloat (fabs (v[i]), <=, 1.0 / sqrt (50.0));
  }
}

/* ---- Group sizes on the device -------------------------------------------- */

/* One forward and backward with the group sizes only on the device
 * (@sizes, as a router would write them: maybe negative, maybe adding up to
 * more than @capacity), against the float64 reference of the rows the
 * kernels use; the outputs start poisoned and nothing outside those rows is
 * written. */
static void
run_device_sizes (GmlpGroupedLinear *layer, const gint64 *sizes, gint64 capacity)
{
  GmlpDevice *device = gmlp_grouped_linear_get_device (layer);
  guint n = gmlp_grouped_linear_get_n_groups (layer);
  gint64 k = gmlp_grouped_linear_get_in_features (layer);
  gint64 o = gmlp_grouped_linear_get_out_features (layer);
  GmlpDType dtype = gmlp_grouped_linear_get_dtype (layer);
  gboolean has_bias = (gmlp_grouped_linear_get_flags (layer) & GMLP_LINEAR_BIAS) != 0;
  gint64 row_bytes[2] = { k * (gint64) gmlp_dtype_get_size (dtype), o * (gint64) gmlp_dtype_get_size (dtype) };
  /* The products use the rows that fit in both operands; the bias gradient
   * reads dy alone, so it may see more of dy's rows. */
  g_autofree gint64 *rows = fitting_rows (sizes, n, capacity, row_bytes, 2);
  g_autofree gint64 *dy_rows = fitting_rows (sizes, n, capacity, &row_bytes[1], 1);
  g_autoptr(GmlpGroupedTensor) x_host = NULL, dy_host = NULL, dy_full = NULL;
  g_autoptr(GmlpGroupedTensor) x_sizes = NULL, dy_sizes = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, y = NULL, dx = NULL, y_view = NULL, dx_view = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GError) error = NULL;
  g_autoptr(Problem) p = problem_new (layer, rows, &x_host, &dy_host);
  double tol = gmlp_test_tolerance (dtype);
  guint g;

  x_sizes = sizes_tensor (device, sizes, n);
  /* The output gradient's sizes: the same values, in the same tensor or
   * in one of its own. */
  dy_sizes = g_test_rand_bit () ? g_object_ref (x_sizes) : sizes_tensor (device, sizes, n);
  x = gmlp_test_device_sized_copy (x_host, x_sizes, capacity);

  /* dy: the problem's rows of each group, then those only the bias
   * gradient sees. */
  {
    gint64 dy_total = 0, r0 = 0, q0 = 0, r, j;
    g_autofree double *values = NULL;
    g_autoptr(GBytes) bytes = NULL;

    for (g = 0; g < n; g++)
      dy_total += dy_rows[g];
    values = g_new (double, MAX (dy_total * o, 1));
    for (g = 0; g < n; g++)
      {
        g_assert_cmpint (dy_rows[g], >=, rows[g]);
        memcpy (values + q0 * o, p->dy + r0 * o, sizeof (double) * rows[g] * o);
        for (r = rows[g]; r < dy_rows[g]; r++)
          for (j = 0; j < o; j++)
            {
              double v = gmlp_test_round ((float) g_test_rand_double_range (-1.0, 1.0), dtype);
              values[(q0 + r) * o + j] = v;
              p->db[g * o + j] += v;
              p->db_abs[g * o + j] += fabs (v);
            }
        p->db_terms[g] = dy_rows[g];
        r0 += rows[g];
        q0 += dy_rows[g];
      }
    bytes = encode_values (values, dy_total * o, dtype);
    dy_full = gmlp_grouped_tensor_new_from_bytes (device, dtype, dy_rows, n, o, bytes, &error);
    g_assert_no_error (error);
  }
  dy = gmlp_test_device_sized_copy (dy_full, dy_sizes, capacity);

  y = gmlp_grouped_linear_forward (layer, x, &saved, &error);
  g_assert_no_error (error);
  g_assert_false (gmlp_grouped_tensor_has_host_sizes (y));
  g_assert_true (gmlp_grouped_tensor_get_sizes (y, NULL) == x_sizes);
  g_assert_cmpint (gmlp_grouped_tensor_get_row_capacity (y), ==, capacity);
  g_assert_cmpint (gmlp_grouped_tensor_get_cols (y), ==, o);
  y_view = gmlp_test_host_view (y, rows);
  check_output (y_view, p->y, p, o, "fprop (device sizes)");
  assert_only_rows_written (y, sizes, rows);

  dx = gmlp_grouped_linear_backward (layer, saved, dy, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_saved_activations_is_consumed (saved));
  g_assert_false (gmlp_grouped_tensor_has_host_sizes (dx));
  g_assert_true (gmlp_grouped_tensor_get_sizes (dx, NULL) == x_sizes);
  g_assert_cmpint (gmlp_grouped_tensor_get_row_capacity (dx), ==, capacity);
  dx_view = gmlp_test_host_view (dx, rows);
  check_output (dx_view, p->dx, p, k, "dgrad (device sizes)");
  assert_only_rows_written (dx, sizes, rows);
  check_per_group (gmlp_grouped_linear_get_wgrad (layer), p->dw, p, o * k, tol, "wgrad (device sizes)");
  if (has_bias)
    check_dbias (gmlp_grouped_linear_get_bgrad (layer), p, "dbias (device sizes)");
}

static gint64
sum_of_sizes (const gint64 *sizes, guint n)
{
  gint64 total = 0;
  guint g;

  for (g = 0; g < n; g++)
    total += MAX (sizes[g], 0);
  return total;
}

/* Many tiny groups, half of them empty, one subtile of columns per tile
 * on the Hopper kernel: a consumer's consecutive tiles each store one
 * subtile, and an empty group's zeros follow a group's products within a
 * few hundred cycles, so the epilogue's two staging slots must alternate
 * across tiles (taken by the subtile's index, a store still reading slot 0
 * took the next tile's values; the shapes test saw it a few times in a
 * thousand runs). Host sizes, then device sizes. */
static void
test_tiny_groups (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint iter, g;

  if (device == NULL)
    return;

  for (iter = 0; iter < 4; iter++)
    {
      const guint n = 1024;
      g_autofree gint64 *rows = g_new (gint64, n);
      g_autoptr(GmlpGroupedLinear) layer = NULL;

      for (g = 0; g < n; g++)
        rows[g] = g_test_rand_bit () ? 0 : g_test_rand_int_range (1, 9);
      layer = new_layer (device, n, 24, iter % 2 ? 40 : 56,
                         iter % 2 ? GMLP_DTYPE_FLOAT16 : GMLP_DTYPE_BFLOAT16,
                         GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS);
      if (iter < 2)
        run_and_check (layer, rows);
      else
        run_device_sizes (layer, rows, sum_of_sizes (rows, n));
    }
}

/* Every dtype, random shapes and sizes: empty groups, odd sizes, negative
 * sizes, room to spare, and sizes past the capacity. */
static void
test_device_sizes_numerics (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint d, iter;

  if (device == NULL)
    return;

  for (d = 0; d < G_N_ELEMENTS (layer_dtypes); d++)
    for (iter = 0; iter < 6; iter++)
      {
        guint n = g_test_rand_int_range (1, 7);
        gint64 k = g_test_rand_int_range (1, 90), o = g_test_rand_int_range (1, 90);
        GmlpLinearFlags flags = GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | (iter % 2 ? GMLP_LINEAR_BIAS : 0);
        g_autoptr(GmlpGroupedLinear) layer = new_layer (device, n, k, o, layer_dtypes[d], flags);
        g_autofree gint64 *sizes = gmlp_test_random_rows (n, 70);
        gint64 total, capacity;

        if (iter % 3 == 1)
          sizes[g_test_rand_int_range (0, n)] = -g_test_rand_int_range (1, 6);
        total = sum_of_sizes (sizes, n);
        capacity = iter % 3 == 2 ? total * 2 / 3 : total + g_test_rand_int_range (0, 20);
        g_test_message ("%s n=%u k=%" G_GINT64_FORMAT " o=%" G_GINT64_FORMAT " capacity=%"
                        G_GINT64_FORMAT " of %" G_GINT64_FORMAT, gmlp_dtype_get_name (layer_dtypes[d]),
                        n, k, o, capacity, total);
        run_device_sizes (layer, sizes, capacity);
      }
}

/* One group, one group holding every row, 256 groups, odd sizes, sizes far
 * past the capacity, a capacity of zero, no rows at all; FP32 too (the
 * portable kernel on a GPU). */
static void
test_device_sizes_shapes (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint shape;

  if (device == NULL)
    return;

  for (shape = 0; shape < 8; shape++)
    {
      static const guint n_of[] = { 1, 5, 256, 5, 4, 3, 3, 2 };
      guint n = n_of[shape];
      gint64 k = shape == 3 ? 33 : shape == 7 ? 130 : 24, o = shape == 3 ? 17 : shape == 7 ? 70 : 40;
      GmlpDType dtype = shape % 2 ? GMLP_DTYPE_FLOAT32 : GMLP_DTYPE_BFLOAT16;
      g_autofree gint64 *sizes = g_new0 (gint64, n);
      g_autoptr(GmlpGroupedLinear) layer = NULL;
      gint64 capacity;
      guint g;

      switch (shape)
        {
        case 0: sizes[0] = 37; break;
        case 1: sizes[3] = 123; break;
        case 2:
          for (g = 0; g < n; g++)
            sizes[g] = g_test_rand_int_range (0, 6);
          break;
        case 3:
          for (g = 0; g < n; g++)
            sizes[g] = g_test_rand_int_range (1, 31);
          break;
        case 4: sizes[0] = 1000; sizes[1] = 50; sizes[2] = -3; sizes[3] = 7; break;
        case 5: sizes[0] = 5; sizes[2] = 2; break;
        case 6: break;
        default: sizes[0] = 300; sizes[1] = 129; break;
        }
      capacity = shape == 4 ? 40 : shape == 5 ? 0 : shape == 6 ? 10 :
                 sum_of_sizes (sizes, n) + (shape == 3 ? 9 : 0);

      layer = new_layer (device, n, k, o, dtype, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS);
      run_device_sizes (layer, sizes, capacity);
    }
}

/* More output tiles than a GPU holds blocks at once (the kernels stride
 * over the tile list), groups of several bias tiles, and more groups than
 * one pass of the device-side scan covers (256). */
static void
test_device_sizes_many_tiles (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint shape;

  if (device == NULL)
    return;

  for (shape = 0; shape < 2; shape++)
    {
      guint n = shape == 0 ? 4 : 300;
      gint64 k = shape == 0 ? 8 : 70, o = shape == 0 ? 1500 : 130;
      g_autofree gint64 *sizes = g_new (gint64, n);
      g_autoptr(GmlpGroupedLinear) layer = NULL;
      guint g;

      for (g = 0; g < n; g++)
        sizes[g] = shape == 0 ? g_test_rand_int_range (900, 1100) : g_test_rand_int_range (0, 10);
      layer = new_layer (device, n, k, o, shape == 0 ? GMLP_DTYPE_BFLOAT16 : GMLP_DTYPE_FLOAT16,
                         GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS);
      run_device_sizes (layer, sizes, sum_of_sizes (sizes, n) + 17);
    }
}

/* Shapes the Hopper kernel takes on an H100/H200 (16-bit operands,
 * features multiples of 8): several 128 × 256 output tiles with partial
 * ones at both edges, a reduction that ends inside a 64-deep block, row
 * counts that are not multiples of the tiles (last row tiles of 1, 45, 63,
 * 64 and 65 rows: the kernel's short tiles start at 64 or fewer), empty
 * groups, one group with every row, 1 and 256 groups. */
static void
test_device_sizes_tiles (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint shape;

  if (device == NULL)
    return;

  for (shape = 0; shape < 6; shape++)
    {
      static const guint n_of[] = { 1, 3, 256, 4, 3, 5 };
      guint n = n_of[shape];
      gint64 k = shape == 2 ? 72 : 136, o = shape == 2 ? 56 : 264;
      GmlpDType dtype = shape % 2 ? GMLP_DTYPE_FLOAT16 : GMLP_DTYPE_BFLOAT16;
      GmlpLinearFlags flags = GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS;
      g_autofree gint64 *sizes = g_new0 (gint64, n);
      g_autoptr(GmlpGroupedLinear) layer = NULL;
      guint g;

      switch (shape)
        {
        case 0: sizes[0] = 301; break;
        case 1: sizes[0] = 129; sizes[2] = 77; break;
        case 2:
          for (g = 0; g < n; g++)
            sizes[g] = g_test_rand_int_range (0, 40);
          break;
        case 3: sizes[2] = 1000; break;
        case 4: sizes[0] = 63; sizes[1] = 65; sizes[2] = 192; break;
        default:
          for (g = 0; g < n; g++)
            sizes[g] = g_test_rand_int_range (0, 300);
          break;
        }
      layer = new_layer (device, n, k, o, dtype, flags);
      run_device_sizes (layer, sizes, sum_of_sizes (sizes, n) + (shape == 5 ? 100 : 0));
    }
}

/* Long reductions on the Hopper kernel's direct schedule (features
 * multiples of 128) with more output tiles than a few CTAs take in whole
 * waves: with the tuning's sm90-grid=6,sm90-stream-k=on (as
 * tests/kernels/test-sm90-gemm forces them on the kernel itself), the last
 * tiles' reductions are split across CTAs and their partial sums
 * added by another (TailSplit in kernels/impls/grouped_gemm_sm90.cuh),
 * FPROP 16 stages deep and DGRAD 6, with biases, empty groups and row
 * tiles of every length. On a whole GPU, and on the CPU, plain products. */
static void
test_device_sizes_long_reduction (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  gint64 scale;
  guint round;

  if (device == NULL)
    return;
  scale = gmlp_device_get_kind (device) == GMLP_DEVICE_KIND_CPU ? 4 : 1;

  for (round = 0; round < 4; round++)
    {
      guint n = round < 2 ? 5 : 9, g;
      gint64 k = 1024 / scale, o = 384 / scale;
      GmlpDType dtype = round % 2 ? GMLP_DTYPE_FLOAT16 : GMLP_DTYPE_BFLOAT16;
      g_autofree gint64 *sizes = g_new0 (gint64, n);
      g_autoptr(GmlpGroupedLinear) layer = NULL;

      for (g = 0; g < n; g++)
        sizes[g] = g == 1 ? 0 : g_test_rand_int_range (1, 700 / (gint32) scale);
      g_test_message ("%s n=%u k=%" G_GINT64_FORMAT " o=%" G_GINT64_FORMAT, gmlp_dtype_get_name (dtype), n, k,
                      o);
      layer = new_layer (device, n, k, o, dtype, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS);
      run_device_sizes (layer, sizes, sum_of_sizes (sizes, n));
    }
}

/* Shapes the Hopper kernel takes on its direct schedule, without a plan
 * (rows of x, y, dy and dx whole multiples of 256 bytes: 16-bit features
 * multiples of 128): row tiles that reach into the next group, empty and
 * negative sizes, a capacity that cuts a group short or leaves rows over,
 * 1 group and 300 (the kernel scans the sizes 32 groups at a time); host
 * sizes too. */
static void
test_device_sizes_direct (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  /* The features put the rows on the Hopper kernel's direct schedule (row
   * bytes whole multiples of 256); the CPU backend has no such schedule,
   * and a quarter of them keeps its suite quick under valgrind. */
  gint64 scale;
  guint shape;

  if (device == NULL)
    return;
  scale = gmlp_device_get_kind (device) == GMLP_DEVICE_KIND_CPU ? 4 : 1;

  for (shape = 0; shape < 6; shape++)
    {
      static const guint n_of[] = { 1, 5, 300, 6, 4, 40 };
      guint n = n_of[shape];
      gint64 k = (shape == 2 ? 128 : 256) / scale, o = (shape == 2 ? 256 : 384) / scale;
      GmlpDType dtype = shape % 2 ? GMLP_DTYPE_FLOAT16 : GMLP_DTYPE_BFLOAT16;
      GmlpLinearFlags flags = GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | (shape != 4 ? GMLP_LINEAR_BIAS : 0);
      static const gint64 sizes_1[] = { 129, 0, 77, -3, 256 };
      static const gint64 sizes_3[] = { 1000, 50, -3, 7, 130, 64 };
      static const gint64 sizes_4[] = { 100, 200, 300, 50 };
      g_autofree gint64 *sizes = g_new0 (gint64, n);
      g_autoptr(GmlpGroupedLinear) layer = NULL;
      gint64 capacity;
      guint g;

      switch (shape)
        {
        case 0: sizes[0] = 301; break;
        case 1: memcpy (sizes, sizes_1, sizeof sizes_1); break;
        case 3: memcpy (sizes, sizes_3, sizeof sizes_3); break;
        case 4: memcpy (sizes, sizes_4, sizeof sizes_4); break;
        default:
          for (g = 0; g < n; g++)
            sizes[g] = g_test_rand_int_range (0, shape == 2 ? 12 : 300);
          break;
        }
      /* Shape 3 cuts the first group at 600 rows, shape 4 the third at 50. */
      capacity = shape == 3 ? 600 : shape == 4 ? 350 :
                 sum_of_sizes (sizes, n) + (shape == 1 ? 50 : 0);
      g_test_message ("%s n=%u k=%" G_GINT64_FORMAT " o=%" G_GINT64_FORMAT " capacity=%" G_GINT64_FORMAT,
                      gmlp_dtype_get_name (dtype), n, k, o, capacity);
      layer = new_layer (device, n, k, o, dtype, flags);
      run_device_sizes (layer, sizes, capacity);
      /* The same sizes from the host, where they are all there is (the
       * kernel takes up to 512 groups' sizes in its parameters). */
      if (shape == 0 || shape == 2 || shape == 5)
        run_and_check (layer, sizes);
    }
}

/* On the same data, the device-sizes path gives the results of the
 * host-sizes path: the same bits on the CPU (the same arithmetic: with a
 * bias too, which both add to the FP32 product before its one rounding,
 * test_device_sizes_bias_rounding), within the dtype's tolerance on a GPU
 * (other kernels, another summation order). */
static void
test_device_sizes_same_as_host (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint d;

  if (device == NULL)
    return;

  for (d = 0; d < G_N_ELEMENTS (layer_dtypes); d++)
    {
      const guint n = 6;
      GmlpDType dtype = layer_dtypes[d];
      g_autoptr(GmlpGroupedLinear) layer = new_layer (device, n, 40, 24, dtype,
                                                      GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS);
      g_autofree gint64 *rows = gmlp_test_random_rows (n, 50);
      g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, x_dev = NULL, dy_dev = NULL;
      g_autoptr(Problem) p = problem_new (layer, rows, &x, &dy);
      GBytes *host[4], *dev[4];
      const char *what[4] = { "fprop", "dgrad", "wgrad", "dbias" };
      guint pass, i;

      x_dev = g_object_ref (x);
      dy_dev = g_object_ref (dy);
      move_sizes_to_device (&x_dev, &dy_dev, rows, n, 5);

      for (pass = 0; pass < 2; pass++)
        {
          g_autoptr(GmlpGroupedTensor) y = NULL, dx = NULL;
          g_autoptr(GmlpSavedActivations) saved = NULL;
          g_autoptr(GError) error = NULL;

          y = gmlp_grouped_linear_forward (layer, pass == 0 ? x : x_dev, &saved, &error);
          g_assert_no_error (error);
          dx = gmlp_grouped_linear_backward (layer, saved, pass == 0 ? dy : dy_dev, &error);
          g_assert_no_error (error);
          g_assert_true (gmlp_grouped_tensor_has_host_sizes (dx) == (pass == 0));
          gmlp_test_step_bytes (layer, y, dx, pass == 0 ? host : dev);
        }

      for (i = 0; i < 4; i++)
        {
          gsize len = g_bytes_get_size (host[i]) / gmlp_dtype_get_size (dtype), j;
          g_autofree double *h = g_new (double, MAX (len, 1));
          g_autofree double *v = g_new (double, MAX (len, 1));

          g_assert_cmpuint (g_bytes_get_size (dev[i]), ==, g_bytes_get_size (host[i]));
          if (on_cpu (device))
            g_assert_true (g_bytes_equal (host[i], dev[i]));
          for (j = 0; j < len; j++)
            {
              h[j] = gmlp_test_decode (g_bytes_get_data (host[i], NULL), dtype, j);
              v[j] = gmlp_test_decode (g_bytes_get_data (dev[i], NULL), dtype, j);
            }
          gmlp_test_assert_close (v, h, len, gmlp_test_tolerance (dtype), what[i]);
          g_bytes_unref (host[i]);
          g_bytes_unref (dev[i]);
        }
    }
}

/* Bias gradients whose sums cancel: one output column, each group's last
 * row of dy the negated sum of the others (rounded to FP32), so that db is
 * a few ulps of the terms. The FP32 sum is then off by much of db itself,
 * which a tolerance relative to |db| refuses, but by no more than
 * γ_m Σ |dy|, check_dbias()'s bound (what once made "dbias (device sizes)"
 * fail, 4.2e-5 against 2e-5, by chance). Host sizes and device sizes. */
static void
test_dbias_cancellation (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint pass;

  if (device == NULL)
    return;

  for (pass = 0; pass < 2; pass++)
    {
      const guint n = 3;
      gint64 rows[] = { 70, 41, 9 };
      g_autoptr(GmlpGroupedLinear) layer = new_layer (device, n, 8, 1, GMLP_DTYPE_FLOAT32,
                                                      GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS);
      g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, y = NULL, dx = NULL;
      g_autoptr(GmlpSavedActivations) saved = NULL;
      g_autoptr(GBytes) bytes = NULL;
      g_autoptr(GError) error = NULL;
      g_autoptr(Problem) p = problem_new (layer, rows, &x, &dy);
      gint64 r0 = 0, r;
      guint g;

      for (g = 0; g < n; r0 += rows[g], g++)
        {
          double sum = 0.0;

          for (r = r0; r < r0 + rows[g] - 1; r++)
            sum += p->dy[r];
          p->dy[r0 + rows[g] - 1] = (float) -sum;
        }
      problem_reference (p);
      g_clear_object (&dy);
      bytes = encode_values (p->dy, p->total, GMLP_DTYPE_FLOAT32);
      dy = gmlp_grouped_tensor_new_from_bytes (device, GMLP_DTYPE_FLOAT32, rows, n, 1, bytes, &error);
      g_assert_no_error (error);
      if (pass == 1)
        move_sizes_to_device (&x, &dy, rows, n, 4);

      y = gmlp_grouped_linear_forward (layer, x, &saved, &error);
      g_assert_no_error (error);
      dx = gmlp_grouped_linear_backward (layer, saved, dy, &error);
      g_assert_no_error (error);
      for (g = 0; g < n; g++)
        g_test_message ("%s sizes, group %u: db %.3g, Σ |dy| %.3g", pass ? "device" : "host", g,
                        p->db[g], p->db_abs[g]);
      check_dbias (gmlp_grouped_linear_get_bgrad (layer), p, pass ? "dbias (device sizes)" : "dbias");
    }
}

/* A 16-bit FPROP with a bias, device sizes (and host sizes on the CPU),
 * against float64: one rounding after the bias. The data make the bias cancel the product: each group's
 * tokens are one token x_g with one element moved by a few steps of the
 * dtype, and the bias is minus x_g's product rounded to the dtype, so that
 * y is a fraction of an ulp of the product. Rounded once, y is within
 * u |y| of the exact value, plus the FP32 sum's error (γ_{k+1} of the
 * magnitudes, twice for the slack); rounded to the dtype before the bias
 * is added, the product loses up to half its ulp, which is most of y. */
static void
test_device_sizes_bias_rounding (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  static const GmlpDType dtypes[] = { GMLP_DTYPE_BFLOAT16, GMLP_DTYPE_FLOAT16 };
  guint d;

  if (device == NULL)
    return;

  for (d = 0; d < G_N_ELEMENTS (dtypes); d++)
    {
      const guint n = 4;
      const gint64 k = 48, o = 40;
      GmlpDType dtype = dtypes[d];
      gint64 rows[] = { 7, 0, 19, 12 };
      gint64 total = 38, capacity = total + 9, r0 = 0, r, j, c;
      g_autoptr(GmlpGroupedLinear) layer = new_layer (device, n, k, o, dtype,
                                                      GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS);
      g_autofree double *w = g_new (double, n * o * k), *b = g_new (double, n * o);
      g_autofree double *x = g_new (double, total * k), *want = g_new (double, total * o);
      g_autofree double *mag = g_new (double, total * o);
      g_autoptr(GBytes) wb = NULL, bb = NULL, xb = NULL;
      g_autoptr(GmlpGroupedTensor) x_host = NULL, x_dev = NULL, sizes = NULL;
      g_autoptr(GError) error = NULL;
      double u = unit_roundoff (dtype);
      guint g, pass;
      gsize i;

      for (i = 0; i < (gsize) (n * o * k); i++)
        w[i] = gmlp_test_round (g_test_rand_double_range (-1.0, 1.0), dtype);
      for (g = 0; g < n; r0 += rows[g], g++)
        {
          double base[48];

          for (c = 0; c < k; c++)
            base[c] = gmlp_test_round (g_test_rand_double_range (1.0, 2.0), dtype);
          /* b = −(x_g W_gᵀ) rounded as the dtype stores it. */
          for (j = 0; j < o; j++)
            {
              double acc = 0.0;

              for (c = 0; c < k; c++)
                acc += base[c] * w[(g * o + j) * k + c];
              b[g * o + j] = -gmlp_test_round (acc, dtype);
            }
          for (r = r0; r < r0 + rows[g]; r++)
            {
              double *moved = &x[r * k + (r - r0) % k];

              memcpy (x + r * k, base, sizeof (double) * k);
              /* Steps of the dtype in [1, 2): 2u each (rounded: past 2
               * the steps are twice as long). */
              *moved = gmlp_test_round (*moved + 2.0 * u * g_test_rand_int_range (-3, 4), dtype);
            }
        }
      r0 = 0;
      for (g = 0; g < n; r0 += rows[g], g++)
        for (r = r0; r < r0 + rows[g]; r++)
          for (j = 0; j < o; j++)
            {
              double acc = b[g * o + j], m = fabs (b[g * o + j]);

              for (c = 0; c < k; c++)
                {
                  acc += x[r * k + c] * w[(g * o + j) * k + c];
                  m += fabs (x[r * k + c] * w[(g * o + j) * k + c]);
                }
              want[r * o + j] = acc;
              mag[r * o + j] = m;
            }

      wb = encode_values (w, n * o * k, dtype);
      g_assert_true (gmlp_grouped_linear_set_weight_from_bytes (layer, wb, &error));
      g_assert_no_error (error);
      bb = encode_values (b, n * o, dtype);
      g_assert_true (gmlp_grouped_linear_set_bias_from_bytes (layer, bb, &error));
      g_assert_no_error (error);
      xb = encode_values (x, total * k, dtype);
      x_host = gmlp_grouped_tensor_new_from_bytes (device, dtype, rows, n, k, xb, &error);
      g_assert_no_error (error);
      sizes = sizes_tensor (device, rows, n);
      x_dev = gmlp_test_device_sized_copy (x_host, sizes, capacity);

      /* Device sizes; then host sizes on the CPU, and on a GPU where the
       * Hopper kernel takes them (the default tuning), which add the bias
       * before the one rounding too (cuBLAS adds it to the stored
       * product). */
      for (pass = 0; pass < (on_cpu (device) || g_getenv ("GMLP_TEST_TUNING") == NULL ? 2 : 1); pass++)
        {
          g_autoptr(GmlpGroupedTensor) y = NULL, y_view = NULL;
          g_autofree double *got = NULL;
          const char *where = pass == 0 ? "device" : "host";
          double worst = 0.0;
          gsize len, e, off = 0;

          y = gmlp_grouped_linear_forward (layer, pass == 0 ? x_dev : x_host, NULL, &error);
          g_assert_no_error (error);
          y_view = pass == 0 ? gmlp_test_host_view (y, rows) : g_object_ref (y);
          got = gmlp_test_download (y_view, &len);
          g_assert_cmpuint (len, ==, total * o);
          for (e = 0; e < len; e++)
            {
              double bound = u * fabs (want[e]) + 2.0 * gamma32 (k + 1) * mag[e];
              double err = fabs (got[e] - want[e]);

              /* The test means something: y is small against its parts. */
              g_assert_cmpfloat (fabs (want[e]), <, 0.05 * mag[e]);
              worst = MAX (worst, err / bound);
              if (err > bound)
                off++;
            }
          g_test_message ("%s, %s sizes: %" G_GSIZE_FORMAT " of %" G_GSIZE_FORMAT " outside u |y| + "
                          "2 γ Σ |terms|, worst %.3g times it", gmlp_dtype_get_name (dtype), where, off,
                          len, worst);
          if (off > 0)
            g_error ("%s fprop with a bias and %s sizes: %" G_GSIZE_FORMAT " of %" G_GSIZE_FORMAT
                     " elements off by more than one rounding, the worst %.3g times the bound",
                     gmlp_dtype_get_name (dtype), where, off, len, worst);
        }
    }
}

static void
test_device_sizes_contract (void)
{
  run_contract (TRUE);
}

static void
test_device_sizes_microbatches (void)
{
  run_microbatches (TRUE);
}

/* Host sizes on one side and device sizes on the other, another row
 * capacity, another number of groups: an error, nothing written or
 * allocated, and the saved activations still usable. */
static void
test_device_sizes_bad_input (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpGroupedLinear) layer = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, x_dev = NULL, dy_dev = NULL, dy_cap = NULL;
  g_autoptr(GmlpGroupedTensor) sizes = NULL, sizes3 = NULL, x3 = NULL, dy_wide = NULL;
  g_autoptr(GmlpGroupedTensor) y = NULL, y_dev = NULL, dx = NULL, dx_dev = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL, saved_dev = NULL;
  g_autoptr(GError) error = NULL;
  g_autoptr(Problem) p = NULL;
  gint64 rows[] = { 5, 0, 3, 2 };
  guint64 in_use;

  if (device == NULL)
    return;

  layer = new_layer (device, 4, 16, 8, GMLP_DTYPE_FLOAT32, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS);
  p = problem_new (layer, rows, &x, &dy);
  sizes = sizes_tensor (device, rows, 4);
  sizes3 = sizes_tensor (device, rows, 3);
  x_dev = gmlp_test_device_sized_copy (x, sizes, 12);
  dy_dev = gmlp_test_device_sized_copy (dy, sizes, 12);
  dy_cap = gmlp_test_device_sized_copy (dy, sizes, 13);
  x3 = gmlp_grouped_tensor_new_with_device_sizes (device, GMLP_DTYPE_FLOAT32, sizes3, 12, 16, &error);
  g_assert_no_error (error);
  dy_wide = gmlp_grouped_tensor_new_with_device_sizes (device, GMLP_DTYPE_FLOAT32, sizes, 12, 9, &error);
  g_assert_no_error (error);

  y = gmlp_grouped_linear_forward (layer, x, &saved, &error);
  g_assert_no_error (error);
  y_dev = gmlp_grouped_linear_forward (layer, x_dev, &saved_dev, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_device_synchronize (device, NULL));
  in_use = gmlp_device_get_bytes_in_use (device);

#define EXPECT_NULL(call, code) \
  G_STMT_START { \
    g_autoptr(GError) _e = NULL; \
    g_autoptr(GmlpSavedActivations) _s = NULL; \
    gpointer _r = (call); \
    g_assert_null (_r); \
    g_assert_error (_e, GMLP_ERROR, (code)); \
    g_assert_null (_s); \
    g_assert_cmpuint (gmlp_device_get_bytes_in_use (device), ==, in_use); \
  } G_STMT_END

  EXPECT_NULL (gmlp_grouped_linear_forward (layer, x3, &_s, &_e), GMLP_ERROR_SHAPE_MISMATCH);
  EXPECT_NULL (gmlp_grouped_linear_backward (layer, saved, dy_dev, &_e), GMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_NULL (gmlp_grouped_linear_backward (layer, saved_dev, dy, &_e), GMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_NULL (gmlp_grouped_linear_backward (layer, saved_dev, dy_cap, &_e), GMLP_ERROR_SHAPE_MISMATCH);
  EXPECT_NULL (gmlp_grouped_linear_backward (layer, saved_dev, dy_wide, &_e), GMLP_ERROR_SHAPE_MISMATCH);
#undef EXPECT_NULL

  g_assert_false (gmlp_saved_activations_is_consumed (saved));
  g_assert_false (gmlp_saved_activations_is_consumed (saved_dev));
  g_assert_null (gmlp_grouped_linear_get_wgrad (layer));

  /* Then both work. */
  dx_dev = gmlp_grouped_linear_backward (layer, saved_dev, dy_dev, &error);
  g_assert_no_error (error);
  check_output (dx_dev, p->dx, p, 16, "dgrad (device sizes)");
  check_per_group (gmlp_grouped_linear_get_wgrad (layer), p->dw, p, 8 * 16, 2e-5, "wgrad (device sizes)");
  check_dbias (gmlp_grouped_linear_get_bgrad (layer), p, "dbias (device sizes)");
  dx = gmlp_grouped_linear_backward (layer, saved, dy, &error);
  g_assert_no_error (error);
  check_output (dx, p->dx, p, 16, "dgrad");
}

/* Saved activations with device sizes offload and reload their whole
 * allocation, and backward computes from the reloaded copy. */
static void
test_device_sizes_offload (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpOffloadContext) ctx = NULL;
  g_autoptr(GmlpGroupedLinear) layer = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, y = NULL, dx = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GError) error = NULL;
  g_autoptr(Problem) p = NULL;
  gint64 rows[] = { 9, 0, 14, 3 };

  if (device == NULL)
    return;

  layer = new_layer (device, 4, 24, 16, GMLP_DTYPE_FLOAT32,
                     GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS);
  p = problem_new (layer, rows, &x, &dy);
  move_sizes_to_device (&x, &dy, rows, 4, 5);
  ctx = gmlp_offload_context_new (device, &error);
  g_assert_no_error (error);

  gmlp_offload_context_push_thread_default (ctx, TRUE);
  y = gmlp_grouped_linear_forward (layer, x, &saved, &error);
  g_assert_true (gmlp_offload_context_pop_thread_default (ctx, NULL));
  g_assert_no_error (error);
  check_output (y, p->y, p, 16, "fprop (device sizes, offloaded)");

  g_assert_true (gmlp_saved_activations_get_offload (saved));
  gmlp_offload_context_flush (ctx);
  g_assert_cmpuint (gmlp_saved_activations_get_nbytes (saved), ==, 0);
  g_assert_cmpuint (gmlp_saved_activations_get_host_nbytes (saved), ==, gmlp_grouped_tensor_get_nbytes (x));

  /* The caller's input changes, behind libgmlp's back (as through DLPack,
   * so that its version does not change): backward must use the offloaded
   * copy. */
  g_assert_true (gmlp_device_synchronize (device, NULL));
  g_assert_true (GMLP_DEVICE_CALL (device, fill_bytes, gmlp_grouped_tensor_get_data (x), 0,
                                   gmlp_grouped_tensor_get_nbytes (x), NULL));

  dx = gmlp_grouped_linear_backward (layer, saved, dy, &error);
  g_assert_no_error (error);
  g_assert_false (gmlp_grouped_tensor_has_host_sizes (dx));
  check_output (dx, p->dx, p, 24, "dgrad (device sizes, reloaded)");
  check_per_group (gmlp_grouped_linear_get_wgrad (layer), p->dw, p, 16 * 24, 2e-5, "wgrad (reloaded)");
  check_dbias (gmlp_grouped_linear_get_bgrad (layer), p, "dbias (reloaded)");
}

/* ---- Versions: what a backward reads must be what its forward read -------- */

/* The bytes of @t, or NULL for no tensor. */
static GBytes *
bytes_or_null (GmlpGroupedTensor *t)
{
  g_autoptr(GError) error = NULL;
  GBytes *bytes;

  if (t == NULL)
    return NULL;
  bytes = gmlp_grouped_tensor_to_bytes (t, &error);
  g_assert_no_error (error);
  return bytes;
}

static void
assert_same_bytes_or_null (GBytes *before, GmlpGroupedTensor *t, const char *what)
{
  g_autoptr(GBytes) after = bytes_or_null (t);

  if (before == NULL || after == NULL)
    {
      if (before != after)
        g_error ("%s: appeared or went away", what);
      return;
    }
  if (!g_bytes_equal (before, after))
    g_error ("%s was written", what);
}

/* One forward and backward, for the gradients they leave. */
static void
run_step (GmlpGroupedLinear *layer, GmlpGroupedTensor *x, GmlpGroupedTensor *dy)
{
  g_autoptr(GmlpGroupedTensor) y = NULL, dx = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GError) error = NULL;

  y = gmlp_grouped_linear_forward (layer, x, &saved, &error);
  g_assert_no_error (error);
  dx = gmlp_grouped_linear_backward (layer, saved, dy, &error);
  g_assert_no_error (error);
}

static void
assert_error_names (GError *error, gint code, const char *name)
{
  g_assert_error (error, GMLP_ERROR, code);
  if (strstr (error->message, name) == NULL)
    g_error ("The error does not name the %s: %s", name, error->message);
}

/* Every write through the API bumps the version of the storage it writes,
 * which every view of that storage shares; reads and failed calls do not;
 * results in new tensors start at 0. */
static void
test_versions_writes (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpGroupedTensor) t = NULL, other = NULL, member = NULL, converted = NULL;
  g_autoptr(GmlpGroupedLinear) layer = NULL, fused = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, y = NULL, dx = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GBytes) bytes = NULL;
  g_autoptr(GError) error = NULL;
  g_autoptr(Problem) p = NULL;
  gint64 rows[] = { 3, 0, 5 };
  GmlpGroupedTensor *weight, *bias;
  guint64 v, vw, vb;

  if (device == NULL)
    return;

  t = gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, rows, 3, 8, &error);
  g_assert_no_error (error);
  other = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, rows, 3, 8, 1.0, NULL);
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (t), ==, 0);
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (other), ==, 0);

  g_assert_true (gmlp_grouped_tensor_fill_zero (t, NULL));
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (t), ==, 1);
  g_assert_true (gmlp_grouped_tensor_fill_random (t, 7, 1.0, NULL));
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (t), ==, 2);
  g_assert_true (gmlp_grouped_tensor_add_scaled (t, 0.5, other, NULL));
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (t), ==, 3);
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (other), ==, 0);
  g_assert_true (gmlp_grouped_tensor_scale (t, 2.0, NULL));
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (t), ==, 4);

  /* Refused writes and reads leave it. */
  g_assert_false (gmlp_grouped_tensor_scale (t, INFINITY, &error));
  g_clear_error (&error);
  g_assert_false (gmlp_grouped_tensor_fill_random (t, 7, -1.0, &error));
  g_clear_error (&error);
  bytes = gmlp_grouped_tensor_to_bytes (t, NULL);
  g_assert_cmpfloat (gmlp_grouped_tensor_sum_squares (t, NULL), >, 0.0);
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (t), ==, 4);

  /* A member view shares the counter both ways. */
  member = gmlp_grouped_tensor_get_member (t, 2, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (member), ==, 4);
  g_assert_true (gmlp_grouped_tensor_fill_zero (member, NULL));
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (t), ==, 5);
  g_assert_true (gmlp_grouped_tensor_scale (t, 3.0, NULL));
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (member), ==, 6);

  /* Results are new tensors. */
  converted = gmlp_grouped_tensor_convert (t, GMLP_DTYPE_BFLOAT16, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (converted), ==, 0);
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (t), ==, 6);

  /* The layer's writes into its parameters and gradients. */
  layer = new_layer (device, 3, 8, 4, GMLP_DTYPE_FLOAT32,
                     GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS);
  weight = gmlp_grouped_linear_get_weight (layer);
  bias = gmlp_grouped_linear_get_bias (layer);
  vw = gmlp_grouped_tensor_get_version (weight);
  vb = gmlp_grouped_tensor_get_version (bias);
  g_assert_true (gmlp_grouped_linear_init_parameters (layer, 3, NULL));
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (weight), >, vw);
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (bias), >, vb);
  vw = gmlp_grouped_tensor_get_version (weight);
  vb = gmlp_grouped_tensor_get_version (bias);
  p = problem_new (layer, rows, &x, &dy);
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (weight), ==, vw + 1);
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (bias), ==, vb + 1);
  vw++;

  y = gmlp_grouped_linear_forward (layer, x, &saved, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (y), ==, 0);
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (x), ==, 0);
  dx = gmlp_grouped_linear_backward (layer, saved, dy, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (dx), ==, 0);
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (dy), ==, 0);
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (weight), ==, vw);
  v = gmlp_grouped_tensor_get_version (gmlp_grouped_linear_get_wgrad (layer));
  g_assert_cmpuint (v, >, 0);
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (gmlp_grouped_linear_get_bgrad (layer)), >, 0);
  run_step (layer, x, dy);
  g_assert_cmpuint (gmlp_grouped_tensor_get_version (gmlp_grouped_linear_get_wgrad (layer)), >, v);

  /* Fused accumulation writes main_grad, the caller's too. */
  fused = new_layer (device, 3, 8, 4, GMLP_DTYPE_FLOAT32,
                     GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION);
  {
    g_autoptr(GmlpGroupedTensor) main_grad = gmlp_grouped_tensor_new_uniform (device, GMLP_DTYPE_FLOAT32,
                                                                              3, 4, 8, NULL);
    g_autoptr(GmlpGroupedTensor) y2 = NULL, dx2 = NULL;
    g_autoptr(GmlpSavedActivations) saved2 = NULL;

    g_assert_true (gmlp_grouped_tensor_fill_zero (main_grad, NULL));
    g_assert_true (gmlp_grouped_linear_set_main_grad (fused, main_grad, &error));
    g_assert_no_error (error);
    g_assert_cmpuint (gmlp_grouped_tensor_get_version (main_grad), ==, 1);
    y2 = gmlp_grouped_linear_forward (fused, x, &saved2, &error);
    g_assert_no_error (error);
    dx2 = gmlp_grouped_linear_backward (fused, saved2, dy, &error);
    g_assert_no_error (error);
    g_assert_cmpuint (gmlp_grouped_tensor_get_version (main_grad), ==, 2);
  }
}

/* A backward whose input or weights were written since its forward fails,
 * naming which, before it writes anything; the activations stay unused.
 * The same for FP8, whose backward reads quantized copies. */
static void
run_versions_changed (gboolean fp8)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  gint64 rows[] = { 6, 0, 9, 4 };
  guint what;

  if (device == NULL)
    return;

  for (what = 0; what < 4; what++)
    {
      g_autoptr(GmlpGroupedLinear) layer = NULL;
      g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, y = NULL, dx = NULL, member = NULL;
      g_autoptr(GmlpSavedActivations) saved = NULL;
      g_autoptr(GBytes) wgrad = NULL, bgrad = NULL, weight = NULL;
      g_autoptr(GError) error = NULL;
      g_autoptr(Problem) p = NULL;
      GmlpGroupedTensor *w;
      guint64 in_use;

      layer = new_layer (device, 4, 32, 16, GMLP_DTYPE_FLOAT32,
                         GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS);
      if (fp8)
        {
          g_autoptr(GmlpQuantizer) qx = gmlp_quantizer_new (device, GMLP_SCALING_RECIPE_CURRENT,
                                                            GMLP_FP8_FORMAT_HYBRID, GMLP_QUANTIZER_ROLE_INPUT);
          g_autoptr(GmlpQuantizer) qw = gmlp_quantizer_new (device, GMLP_SCALING_RECIPE_CURRENT,
                                                            GMLP_FP8_FORMAT_HYBRID, GMLP_QUANTIZER_ROLE_WEIGHT);
          g_autoptr(GmlpQuantizer) qg = gmlp_quantizer_new (device, GMLP_SCALING_RECIPE_CURRENT,
                                                            GMLP_FP8_FORMAT_HYBRID,
                                                            GMLP_QUANTIZER_ROLE_GRAD_OUTPUT);

          g_assert_true (gmlp_grouped_linear_set_quantizers (layer, qx, qw, qg, &error));
          g_assert_no_error (error);
        }
      w = gmlp_grouped_linear_get_weight (layer);
      p = problem_new (layer, rows, &x, &dy);

      run_step (layer, x, dy);   /* so that the gradients exist */
      y = gmlp_grouped_linear_forward (layer, x, &saved, &error);
      g_assert_no_error (error);
      switch (what)
        {
        case 0:   /* the input */
          g_assert_true (gmlp_grouped_tensor_scale (x, 2.0, NULL));
          break;
        case 1:   /* the input, through a member */
          member = gmlp_grouped_tensor_get_member (x, 2, NULL);
          g_assert_true (gmlp_grouped_tensor_fill_zero (member, NULL));
          break;
        case 2:   /* the weights, by an optimizer step */
          g_assert_true (gmlp_grouped_tensor_add_scaled (w, -0.1, w, NULL));
          break;
        case 3:   /* the weights, replaced */
          g_assert_true (gmlp_grouped_linear_init_parameters (layer, 9, NULL));
          break;
        }

      wgrad = bytes_or_null (gmlp_grouped_linear_get_wgrad (layer));
      bgrad = bytes_or_null (gmlp_grouped_linear_get_bgrad (layer));
      weight = bytes_or_null (w);
      g_assert_true (gmlp_device_synchronize (device, NULL));
      in_use = gmlp_device_get_bytes_in_use (device);

      dx = gmlp_grouped_linear_backward (layer, saved, dy, &error);
      g_assert_null (dx);
      assert_error_names (error, GMLP_ERROR_INVALID_STATE, what < 2 ? "input" : "weight");
      g_clear_error (&error);
      g_assert_false (gmlp_saved_activations_is_consumed (saved));
      g_assert_cmpuint (gmlp_device_get_bytes_in_use (device), ==, in_use);
      assert_same_bytes_or_null (wgrad, gmlp_grouped_linear_get_wgrad (layer), "wgrad");
      assert_same_bytes_or_null (bgrad, gmlp_grouped_linear_get_bgrad (layer), "bgrad");
      assert_same_bytes_or_null (weight, w, "weight");

      /* It stays refused: the values the forward read are gone. */
      g_assert_null (gmlp_grouped_linear_backward (layer, saved, dy, &error));
      g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
      g_clear_error (&error);

      /* A write to another tensor, or to the output, is no concern. */
      g_clear_object (&saved);
      g_clear_object (&y);
      y = gmlp_grouped_linear_forward (layer, x, &saved, &error);
      g_assert_no_error (error);
      g_assert_true (gmlp_grouped_tensor_fill_zero (y, NULL));
      g_assert_true (gmlp_grouped_tensor_scale (dy, 1.0, NULL));
      dx = gmlp_grouped_linear_backward (layer, saved, dy, &error);
      g_assert_no_error (error);
      g_assert_nonnull (dx);
    }
}

static void
test_versions_changed (void)
{
  run_versions_changed (FALSE);
}

static void
test_versions_changed_fp8 (void)
{
  run_versions_changed (TRUE);
}

/* Delayed weight gradients read the input and the output gradient in
 * backward_dw: a write to either since the backward is refused there,
 * nothing computed, the weight gradient still pending. A write to the
 * weights between the two is fine: dW does not read them. */
static void
test_versions_delayed (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  gint64 rows[] = { 5, 7, 0 };
  guint what;

  if (device == NULL)
    return;

  for (what = 0; what < 3; what++)
    {
      g_autoptr(GmlpGroupedLinear) layer = NULL;
      g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, y = NULL, dx = NULL;
      g_autoptr(GmlpSavedActivations) saved = NULL;
      g_autoptr(GBytes) main_grad = NULL, bgrad = NULL;
      g_autoptr(GError) error = NULL;
      g_autoptr(Problem) p = NULL;
      GmlpGroupedTensor *w;

      layer = new_layer (device, 3, 12, 8, GMLP_DTYPE_FLOAT32,
                         GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS |
                         GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION | GMLP_LINEAR_DELAY_WGRAD_COMPUTE);
      w = gmlp_grouped_linear_get_weight (layer);
      p = problem_new (layer, rows, &x, &dy);
      y = gmlp_grouped_linear_forward (layer, x, &saved, &error);
      g_assert_no_error (error);
      dx = gmlp_grouped_linear_backward (layer, saved, dy, &error);
      g_assert_no_error (error);
      check_output (dx, p->dx, p, 12, "dgrad");
      g_assert_cmpuint (gmlp_grouped_linear_get_pending_wgrads (layer), ==, 1);

      if (what == 0)
        g_assert_true (gmlp_grouped_tensor_fill_zero (x, NULL));
      else if (what == 1)
        g_assert_true (gmlp_grouped_tensor_scale (dy, -1.0, NULL));
      else
        g_assert_true (gmlp_grouped_tensor_add_scaled (w, -0.1, w, NULL));
      main_grad = bytes_or_null (gmlp_grouped_linear_get_main_grad (layer));
      bgrad = bytes_or_null (gmlp_grouped_linear_get_bgrad (layer));

      if (what == 2)
        {
          g_autofree gint64 *len = g_new (gint64, 3);
          guint g;

          g_assert_true (gmlp_grouped_linear_backward_dw (layer, &error));
          g_assert_no_error (error);
          for (g = 0; g < 3; g++)
            len[g] = 8 * 12;
          {
            g_autofree double *got = gmlp_test_download (gmlp_grouped_linear_get_main_grad (layer), NULL);
            assert_groups_close (got, p->dw, p, len, 2e-5, "main_grad");
          }
          continue;
        }

      g_assert_false (gmlp_grouped_linear_backward_dw (layer, &error));
      assert_error_names (error, GMLP_ERROR_INVALID_STATE, what == 0 ? "input" : "output gradient");
      g_clear_error (&error);
      g_assert_cmpuint (gmlp_grouped_linear_get_pending_wgrads (layer), ==, 1);
      assert_same_bytes_or_null (main_grad, gmlp_grouped_linear_get_main_grad (layer), "main_grad");
      assert_same_bytes_or_null (bgrad, gmlp_grouped_linear_get_bgrad (layer), "bgrad");
    }
}

/* main_grad may not share storage with the layer's parameters or their
 * gradients (backward would add dW into W), nor one group's main_grad
 * with another's; and backward does not write a weight gradient (main_grad,
 * wgrad, bgrad) that shares storage with its input or output gradient. */
static void
test_main_grad_aliasing (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpGroupedLinear) single = NULL, per_group = NULL, square = NULL;
  g_autoptr(GmlpGroupedTensor) own = NULL, mine = NULL, x = NULL, y = NULL, dy = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GBytes) before = NULL;
  g_autoptr(GError) error = NULL;
  gint64 rows[] = { 8, 8 };
  guint g;

  if (device == NULL)
    return;

  single = new_layer (device, 2, 8, 8, GMLP_DTYPE_FLOAT32,
                      GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION);
  own = g_object_ref (gmlp_grouped_linear_get_main_grad (single));
  g_assert_false (gmlp_grouped_linear_set_main_grad (single, gmlp_grouped_linear_get_weight (single), &error));
  assert_error_names (error, GMLP_ERROR_INVALID_ARGUMENT, "weight");
  g_clear_error (&error);
  g_assert_true (gmlp_grouped_linear_get_main_grad (single) == own);

  per_group = new_layer (device, 2, 8, 8, GMLP_DTYPE_FLOAT32, GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION);
  for (g = 0; g < 2; g++)
    {
      GmlpGroupedTensor *before_g = gmlp_grouped_linear_get_main_grad_member (per_group, g);

      g_assert_false (gmlp_grouped_linear_set_main_grad_member (per_group, g,
                                                                gmlp_grouped_linear_get_weight_member (per_group, 1 - g),
                                                                &error));
      assert_error_names (error, GMLP_ERROR_INVALID_ARGUMENT, "weight");
      g_clear_error (&error);
      g_assert_true (gmlp_grouped_linear_get_main_grad_member (per_group, g) == before_g);
    }
  mine = gmlp_grouped_tensor_new_uniform (device, GMLP_DTYPE_FLOAT32, 1, 8, 8, NULL);
  g_assert_true (gmlp_grouped_linear_set_main_grad_member (per_group, 0, mine, &error));
  g_assert_no_error (error);
  g_assert_false (gmlp_grouped_linear_set_main_grad_member (per_group, 1, mine, &error));
  assert_error_names (error, GMLP_ERROR_INVALID_ARGUMENT, "main_grad");
  g_clear_error (&error);
  /* Binding the same tensor to its own group again is fine. */
  g_assert_true (gmlp_grouped_linear_set_main_grad_member (per_group, 0, mine, &error));
  g_assert_no_error (error);

  /* x (and dy) of 8 × 8 per group can be main_grad itself. */
  square = new_layer (device, 2, 8, 8, GMLP_DTYPE_FLOAT32,
                      GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION);
  x = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, rows, 2, 8, 1.0, NULL);
  dy = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, rows, 2, 8, 1.0, NULL);
  for (g = 0; g < 2; g++)
    {
      GmlpGroupedTensor *main_grad = gmlp_grouped_linear_get_main_grad (square);
      GmlpGroupedTensor *in = g == 0 ? main_grad : x;
      GmlpGroupedTensor *grad = g == 0 ? dy : main_grad;

      g_assert_true (gmlp_grouped_tensor_has_host_sizes (main_grad));
      y = gmlp_grouped_linear_forward (square, in, &saved, &error);
      g_assert_no_error (error);
      before = bytes_or_null (main_grad);
      g_assert_null (gmlp_grouped_linear_backward (square, saved, grad, &error));
      assert_error_names (error, GMLP_ERROR_INVALID_ARGUMENT, "main_grad");
      g_clear_error (&error);
      g_assert_false (gmlp_saved_activations_is_consumed (saved));
      assert_same_bytes_or_null (before, main_grad, "main_grad");
      g_clear_pointer (&before, g_bytes_unref);
      g_clear_object (&saved);
      g_clear_object (&y);
    }

  /* Without fused accumulation, the same for the layer's own weight and
   * bias gradients (a one-row group's dy can be bgrad). */
  {
    g_autoptr(GmlpGroupedLinear) plain = new_layer (device, 2, 8, 8, GMLP_DTYPE_FLOAT32,
                                                    GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS);
    gint64 one[] = { 1, 1 };
    g_autoptr(GmlpGroupedTensor) x1 = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, one, 2, 8, 1.0, NULL);
    GmlpGroupedTensor *wgrad, *bgrad;

    run_step (plain, x, dy);
    wgrad = gmlp_grouped_linear_get_wgrad (plain);
    bgrad = gmlp_grouped_linear_get_bgrad (plain);

    for (g = 0; g < 2; g++)
      {
        GmlpGroupedTensor *in = g == 0 ? wgrad : x1;
        GmlpGroupedTensor *grad = g == 0 ? dy : bgrad;
        GmlpGroupedTensor *written = g == 0 ? wgrad : bgrad;

        y = gmlp_grouped_linear_forward (plain, in, &saved, &error);
        g_assert_no_error (error);
        before = bytes_or_null (written);
        g_assert_null (gmlp_grouped_linear_backward (plain, saved, grad, &error));
        assert_error_names (error, GMLP_ERROR_INVALID_ARGUMENT, g == 0 ? "weight gradient" : "bias gradient");
        g_clear_error (&error);
        g_assert_false (gmlp_saved_activations_is_consumed (saved));
        assert_same_bytes_or_null (before, written, g == 0 ? "wgrad" : "bgrad");
        g_clear_pointer (&before, g_bytes_unref);
        g_clear_object (&saved);
        g_clear_object (&y);
      }
  }
}

int
main (int argc, char *argv[])
{
  setlocale (LC_ALL, "");
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Gmlp/GroupedLinear/numerics", test_numerics);
  g_test_add_func ("/Gmlp/GroupedLinear/shapes", test_shapes);
  g_test_add_func ("/Gmlp/GroupedLinear/many-experts", test_many_experts);
  g_test_add_func ("/Gmlp/GroupedLinear/equal-groups", test_equal_groups);
  g_test_add_func ("/Gmlp/GroupedLinear/contract", test_contract);
  g_test_add_func ("/Gmlp/GroupedLinear/wgrad-ready", test_wgrad_ready);
  g_test_add_func ("/Gmlp/GroupedLinear/microbatches", test_microbatches);
  g_test_add_func ("/Gmlp/GroupedLinear/bad-input", test_bad_input);
  g_test_add_func ("/Gmlp/GroupedLinear/main-grad-checks", test_main_grad_checks);
  g_test_add_func ("/Gmlp/GroupedLinear/properties", test_properties);
  g_test_add_func ("/Gmlp/GroupedLinear/device-sizes/numerics", test_device_sizes_numerics);
  g_test_add_func ("/Gmlp/GroupedLinear/device-sizes/shapes", test_device_sizes_shapes);
  g_test_add_func ("/Gmlp/GroupedLinear/device-sizes/many-tiles", test_device_sizes_many_tiles);
  g_test_add_func ("/Gmlp/GroupedLinear/device-sizes/tiles", test_device_sizes_tiles);
  g_test_add_func ("/Gmlp/GroupedLinear/device-sizes/long-reduction", test_device_sizes_long_reduction);
  g_test_add_func ("/Gmlp/GroupedLinear/device-sizes/tiny-groups", test_tiny_groups);
  g_test_add_func ("/Gmlp/GroupedLinear/device-sizes/direct", test_device_sizes_direct);
  g_test_add_func ("/Gmlp/GroupedLinear/device-sizes/same-as-host", test_device_sizes_same_as_host);
  g_test_add_func ("/Gmlp/GroupedLinear/device-sizes/bias-rounding", test_device_sizes_bias_rounding);
  g_test_add_func ("/Gmlp/GroupedLinear/dbias-cancellation", test_dbias_cancellation);
  g_test_add_func ("/Gmlp/GroupedLinear/device-sizes/contract", test_device_sizes_contract);
  g_test_add_func ("/Gmlp/GroupedLinear/device-sizes/microbatches", test_device_sizes_microbatches);
  g_test_add_func ("/Gmlp/GroupedLinear/device-sizes/bad-input", test_device_sizes_bad_input);
  g_test_add_func ("/Gmlp/GroupedLinear/device-sizes/offload", test_device_sizes_offload);
  g_test_add_func ("/Gmlp/GroupedLinear/versions/writes", test_versions_writes);
  g_test_add_func ("/Gmlp/GroupedLinear/versions/changed", test_versions_changed);
  g_test_add_func ("/Gmlp/GroupedLinear/versions/changed-fp8", test_versions_changed_fp8);
  g_test_add_func ("/Gmlp/GroupedLinear/versions/delayed", test_versions_delayed);
  g_test_add_func ("/Gmlp/GroupedLinear/main-grad-aliasing", test_main_grad_aliasing);

  return g_test_run ();
}
