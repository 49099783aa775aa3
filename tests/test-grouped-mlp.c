/* test-grouped-mlp.c: GroupedMLP against float64 references
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <locale.h>
#include <math.h>
#include <string.h>

#include "gmlp-test-util.h"
#include "gmlp-grouped-mlp-private.h"
#include "gmlp-grouped-tensor-private.h"

static const GmlpActivation activations[] = {
  GMLP_ACTIVATION_GELU, GMLP_ACTIVATION_RELU, GMLP_ACTIVATION_SRELU,
  GMLP_ACTIVATION_SWIGLU, GMLP_ACTIVATION_GEGLU,
};

static gboolean
gated (GmlpActivation act)
{
  return act == GMLP_ACTIVATION_SWIGLU || act == GMLP_ACTIVATION_GEGLU;
}

static double *
values_of (GmlpGroupedTensor *t)
{
  return gmlp_test_download (t, NULL);
}

/* A layer's weight gradient: wgrad, or main_grad with fused accumulation. */
static GmlpGroupedTensor *
weight_gradient (GmlpGroupedLinear *layer)
{
  GmlpGroupedTensor *grad = gmlp_grouped_linear_get_wgrad (layer);

  return grad != NULL ? grad : gmlp_grouped_linear_get_main_grad (layer);
}

/* A step's results against the float64 reference of FC1's output h (as
 * the library stored it) over the packed rows: y and dx (host-sizes views
 * of them), both layers' weight and bias gradients. */
static void
check_against_reference (GmlpGroupedMLP *mlp, const gint64 *rows, const double *xv, const double *h,
                         const double *dyv, GmlpGroupedTensor *y, GmlpGroupedTensor *dx,
                         gboolean check_gradients, const char *what)
{
  GmlpGroupedLinear *fc1 = gmlp_grouped_mlp_get_fc1 (mlp), *fc2 = gmlp_grouped_mlp_get_fc2 (mlp);
  GmlpDType dtype = gmlp_grouped_linear_get_dtype (fc1);
  guint n = gmlp_grouped_linear_get_n_groups (fc1);
  gint64 hid = gmlp_grouped_linear_get_in_features (fc1), ffn = gmlp_grouped_linear_get_in_features (fc2);
  gint64 w1o = gmlp_grouped_linear_get_out_features (fc1), total = 0;
  double tol = gmlp_test_tolerance (dtype) * 2;
  g_autofree double *w1 = values_of (gmlp_grouped_linear_get_weight (fc1));
  g_autofree double *w2 = values_of (gmlp_grouped_linear_get_weight (fc2));
  g_autofree double *b2 = values_of (gmlp_grouped_linear_get_bias (fc2));
  g_autofree double *got = NULL;
  g_autofree char *name = NULL;
  GmlpTestMlpResult want = { NULL, };
  guint g;

  for (g = 0; g < n; g++)
    total += rows[g];
  gmlp_test_mlp_reference (gmlp_grouped_mlp_get_activation (mlp), dtype, rows, n, hid, ffn, xv, h, dyv,
                           w1, w2, b2, &want);

#define CHECK(tensor, ref, count, label) \
  G_STMT_START { \
    got = values_of (tensor); \
    name = g_strdup_printf ("%s: %s", what, label); \
    gmlp_test_assert_close (got, ref, count, tol, name); \
    g_clear_pointer (&got, g_free); \
    g_clear_pointer (&name, g_free); \
  } G_STMT_END

  CHECK (y, want.y, total * hid, "fprop");
  CHECK (dx, want.dx, total * hid, "dgrad");
  if (check_gradients)
    {
      CHECK (weight_gradient (fc1), want.dw1, n * w1o * hid, "fc1 wgrad");
      CHECK (weight_gradient (fc2), want.dw2, n * hid * ffn, "fc2 wgrad");
      CHECK (gmlp_grouped_linear_get_bgrad (fc1), want.db1, n * w1o, "fc1 dbias");
      CHECK (gmlp_grouped_linear_get_bgrad (fc2), want.db2, n * hid, "fc2 dbias");
    }
#undef CHECK
  gmlp_test_mlp_result_clear (&want);
}

/* FC1's output for x (host sizes), as the layer stores it: the reference
 * starts from it. */
static double *
fc1_output (GmlpGroupedMLP *mlp, GmlpGroupedTensor *x)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedTensor) h = gmlp_grouped_linear_forward (gmlp_grouped_mlp_get_fc1 (mlp), x, NULL, &error);

  g_assert_no_error (error);
  return values_of (h);
}

/* Forward and backward of a random MLP against the reference, with the
 * intermediates rounded to the dtype as the library stores them. */
static void
check_mlp (GmlpDevice *device, GmlpActivation act, GmlpDType dtype, GmlpLinearFlags flags,
           const gint64 *rows, guint n, gint64 hid, gint64 ffn)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedMLP) mlp = gmlp_grouped_mlp_new_full (device, n, hid, ffn, act, dtype,
                                                             flags | GMLP_LINEAR_BIAS, &error);
  g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, y = NULL, dx = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autofree double *xv = NULL, *dyv = NULL, *h = NULL;

  g_assert_no_error (error);
  g_assert_true (gmlp_grouped_mlp_init_parameters (mlp, g_test_rand_int (), NULL));
  g_assert_cmpint (gmlp_grouped_linear_get_out_features (gmlp_grouped_mlp_get_fc1 (mlp)), ==,
                   gated (act) ? 2 * ffn : ffn);

  x = gmlp_test_random_tensor (device, dtype, rows, n, hid, 1.0, &xv);
  dy = gmlp_test_random_tensor (device, dtype, rows, n, hid, 1.0, &dyv);
  h = fc1_output (mlp, x);

  y = gmlp_grouped_mlp_forward (mlp, x, &saved, &error);
  g_assert_no_error (error);
  dx = gmlp_grouped_mlp_backward (mlp, saved, dy, &error);
  g_assert_no_error (error);
  check_against_reference (mlp, rows, xv, h, dyv, y, dx, TRUE, "mlp");
}

static void
test_numerics (void)
{
  static const GmlpDType dtypes[] = { GMLP_DTYPE_FLOAT32, GMLP_DTYPE_BFLOAT16 };
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint a, d;

  if (device == NULL)
    return;

  for (a = 0; a < G_N_ELEMENTS (activations); a++)
    for (d = 0; d < G_N_ELEMENTS (dtypes); d++)
      {
        guint n = g_test_rand_int_range (1, 6);
        g_autofree gint64 *rows = gmlp_test_random_rows (n, 40);

        g_test_message ("activation %d dtype %s", activations[a], gmlp_dtype_get_name (dtypes[d]));
        check_mlp (device, activations[a], dtypes[d], GMLP_LINEAR_SINGLE_GROUPED_WEIGHT, rows, n,
                   g_test_rand_int_range (1, 40), g_test_rand_int_range (1, 50));
      }
}

/* Many experts (the batched GEMM path on CUDA) and recompute. */
static void
test_many_experts_recompute (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  const guint n = 20;
  g_autofree gint64 *rows = g_new (gint64, n);
  guint g;

  if (device == NULL)
    return;

  for (g = 0; g < n; g++)
    rows[g] = g % 6 == 2 ? 0 : g_test_rand_int_range (100, 300);
  check_mlp (device, GMLP_ACTIVATION_SWIGLU, GMLP_DTYPE_BFLOAT16,
             GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_RECOMPUTE_ACTIVATION, rows, n, 64, 48);
  check_mlp (device, GMLP_ACTIVATION_GELU, GMLP_DTYPE_FLOAT32,
             GMLP_LINEAR_SINGLE_GROUPED_WEIGHT, rows, n, 32, 40);
}

/* Recompute and offload give the very same bits as the plain MLP. */
static void
test_recompute_offload_identical (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  gint64 rows[] = { 17, 0, 33 };
  GBytes *results[3][3];
  guint mode, i;

  if (device == NULL)
    return;

  for (mode = 0; mode < 3; mode++)
    {
      g_autoptr(GmlpGroupedMLP) mlp = gmlp_grouped_mlp_new_full (device, 3, 24, 40, GMLP_ACTIVATION_GEGLU,
                                                                 GMLP_DTYPE_BFLOAT16,
                                                                 GMLP_LINEAR_SINGLE_GROUPED_WEIGHT |
                                                                 (mode == 1 ? GMLP_LINEAR_RECOMPUTE_ACTIVATION : 0),
                                                                 NULL);
      g_autoptr(GmlpOffloadContext) ctx = gmlp_offload_context_new (device, NULL);
      g_autoptr(GmlpGroupedTensor) x = gmlp_grouped_tensor_new (device, GMLP_DTYPE_BFLOAT16, rows, 3, 24, NULL);
      g_autoptr(GmlpGroupedTensor) y = NULL, dx = NULL;
      g_autoptr(GmlpSavedActivations) saved = NULL;
      g_autoptr(GError) error = NULL;

      g_assert_true (gmlp_grouped_mlp_init_parameters (mlp, 11, NULL));
      g_assert_true (gmlp_grouped_tensor_fill_random (x, 12, 1.0, NULL));
      if (mode == 2)
        gmlp_offload_context_push_thread_default (ctx, TRUE);
      y = gmlp_grouped_mlp_forward (mlp, x, &saved, &error);
      g_assert_no_error (error);
      if (mode == 2)
        {
          g_assert_true (gmlp_offload_context_pop_thread_default (ctx, NULL));
          g_assert_true (gmlp_saved_activations_get_offload (saved));
          gmlp_offload_context_flush (ctx);
          g_assert_cmpuint (gmlp_saved_activations_get_host_nbytes (saved), >, 0);
        }
      dx = gmlp_grouped_mlp_backward (mlp, saved, y, &error);
      g_assert_no_error (error);
      results[mode][0] = gmlp_grouped_tensor_to_bytes (dx, NULL);
      results[mode][1] = gmlp_grouped_tensor_to_bytes (gmlp_grouped_linear_get_wgrad (gmlp_grouped_mlp_get_fc1 (mlp)), NULL);
      results[mode][2] = gmlp_grouped_tensor_to_bytes (gmlp_grouped_linear_get_wgrad (gmlp_grouped_mlp_get_fc2 (mlp)), NULL);
    }
  for (mode = 1; mode < 3; mode++)
    for (i = 0; i < 3; i++)
      g_assert_true (g_bytes_equal (results[0][i], results[mode][i]));
  for (mode = 0; mode < 3; mode++)
    for (i = 0; i < 3; i++)
      g_bytes_unref (results[mode][i]);
}

/* The point where the finite differences are taken: the input X, FC1's
 * weights and the gradient R of the loss L = Σ y ⊙ R. */
typedef struct
{
  GmlpDevice *device;
  GmlpGroupedMLP *mlp;
  const gint64 *rows;
  guint n_groups;
  gint64 hid;
  const double *xv, *wv, *rv;
  gsize nx, nw;
} GradientPoint;

/* L with one value moved by @delta: element @i of X, or of FC1's weights. */
static double
loss_moved (const GradientPoint *p, gboolean move_input, gsize i, double delta)
{
  g_autofree float *xf = g_new (float, p->nx), *wf = g_new (float, p->nw);
  g_autoptr(GBytes) xb = NULL, wb = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, y = NULL;
  g_autofree double *yv = NULL;
  double loss = 0;
  gsize k, n_y;

  for (k = 0; k < p->nx; k++)
    xf[k] = (float) (p->xv[k] + (move_input && k == i ? delta : 0.0));
  for (k = 0; k < p->nw; k++)
    wf[k] = (float) (p->wv[k] + (!move_input && k == i ? delta : 0.0));
  xb = g_bytes_new (xf, p->nx * sizeof (float));
  wb = g_bytes_new (wf, p->nw * sizeof (float));
  x = gmlp_grouped_tensor_new_from_bytes (p->device, GMLP_DTYPE_FLOAT32,
                                          p->rows, p->n_groups, p->hid, xb, NULL);
  g_assert_true (gmlp_grouped_linear_set_weight_from_bytes (gmlp_grouped_mlp_get_fc1 (p->mlp), wb, NULL));
  y = gmlp_grouped_mlp_forward (p->mlp, x, NULL, NULL);
  yv = gmlp_test_download (y, &n_y);
  for (k = 0; k < n_y; k++)
    loss += yv[k] * p->rv[k];
  return loss;
}

/* Compares @analytic, the backward's gradient of L over X or over FC1's
 * weights, with central differences L(v + e) - L(v - e) over 2e at two step
 * sizes. A step that crosses a kink of ReLU (or of squared ReLU's slope)
 * says nothing about the gradient: the two step sizes disagree, or, where
 * the kink lies very close to v, the one-sided slopes disagree while the
 * central one lands halfway between them. Such values (only for those two
 * activations) are left out. One pre-activation near zero puts a kink under
 * a whole row of X and a whole row of FC1's weights, so up to half may go;
 * the other half is always checked. */
static void
check_gradient (const GradientPoint *p, GmlpActivation act, gboolean over_input, const double *analytic)
{
  gboolean kinked = act == GMLP_ACTIVATION_RELU || act == GMLP_ACTIVATION_SRELU;
  const double *v = over_input ? p->xv : p->wv;
  gsize n = over_input ? p->nx : p->nw, i, skipped = 0;
  double loss0 = loss_moved (p, over_input, 0, 0.0);

  for (i = 0; i < n; i++)
    {
      double fd[2], one_sided_gap = 0;
      guint h;

      for (h = 0; h < 2; h++)
        {
          double e = (h == 0 ? 1e-3 : 5e-4) * MAX (fabs (v[i]), 0.1);
          double up = loss_moved (p, over_input, i, e), down = loss_moved (p, over_input, i, -e);

          fd[h] = (up - down) / (2 * e);
          one_sided_gap = MAX (one_sided_gap, fabs ((up - loss0) - (loss0 - down)) / e);
        }

      if (fabs (fd[0] - fd[1]) > 1e-2 * (1 + fabs (fd[0])) ||
          (kinked && one_sided_gap > 2.5e-3 * (1 + fabs (fd[0]))))
        {
          g_assert_true (kinked);
          skipped++;
          continue;
        }
      /* FP32 forward: agree to a few parts in a thousand. */
      if (fabs (fd[0] - analytic[i]) > 5e-3 * (1 + fabs (analytic[i])))
        g_error ("activation %d, %s %" G_GSIZE_FORMAT ": finite difference %g, backward %g",
                 act, over_input ? "input" : "fc1 weight", i, fd[0], analytic[i]);
    }
  g_assert_cmpuint (skipped, <=, n / 2);
}

/* Finite differences on a tiny FP32 MLP on the CPU: the backward's input
 * and FC1 weight gradients are the gradients of L = Σ y ⊙ R. */
static void
test_gradient_check (void)
{
  g_autoptr(GmlpDevice) cpu = gmlp_device_new (GMLP_DEVICE_KIND_CPU, 0, NULL);
  guint a;

  if (g_strcmp0 (g_getenv ("GMLP_TEST_DEVICE"), "cuda") == 0)
    {
      g_test_skip ("a CPU test");
      return;
    }

  for (a = 0; a < G_N_ELEMENTS (activations); a++)
    {
      GmlpActivation act = activations[a];
      gint64 rows[] = { 3, 2 };
      const gint64 hid = 4, ffn = 5;
      g_autoptr(GmlpGroupedMLP) mlp = gmlp_grouped_mlp_new (cpu, 2, hid, ffn, act, NULL);
      GmlpGroupedLinear *fc1 = gmlp_grouped_mlp_get_fc1 (mlp);
      g_autoptr(GmlpGroupedTensor) x = NULL, r = NULL, y = NULL, dx = NULL;
      g_autoptr(GmlpSavedActivations) saved = NULL;
      g_autofree double *rv = NULL, *wv = NULL, *dw = NULL, *dxv = NULL, *xv = NULL;
      GradientPoint point;

      g_assert_true (gmlp_grouped_mlp_init_parameters (mlp, g_test_rand_int (), NULL));
      x = gmlp_test_random_tensor (cpu, GMLP_DTYPE_FLOAT32, rows, 2, hid, 1.0, &xv);
      r = gmlp_test_random_tensor (cpu, GMLP_DTYPE_FLOAT32, rows, 2, hid, 1.0, &rv);
      y = gmlp_grouped_mlp_forward (mlp, x, &saved, NULL);
      dx = gmlp_grouped_mlp_backward (mlp, saved, r, NULL);   /* dL/dy = R */
      dw = values_of (gmlp_grouped_linear_get_wgrad (fc1));
      dxv = values_of (dx);
      wv = values_of (gmlp_grouped_linear_get_weight (fc1));

      point = (GradientPoint) { cpu, mlp, rows, 2, hid, xv, wv, rv, 5 * hid,
                                2 * gmlp_grouped_linear_get_out_features (fc1) * hid };
      check_gradient (&point, act, FALSE, dw);
      check_gradient (&point, act, TRUE, dxv);
    }
}

static void
test_bad_input (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpGroupedMLP) mlp = NULL, other = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, wide = NULL, y = NULL, y2 = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL, other_saved = NULL;
  g_autoptr(GError) error = NULL;
  gint64 rows[] = { 2, 3 };

  if (device == NULL)
    return;

  g_assert_null (gmlp_grouped_mlp_new (device, 2, 8, 8, (GmlpActivation) 17, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);
  g_assert_null (gmlp_grouped_mlp_new (device, 2, 8, 0, GMLP_ACTIVATION_RELU, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);

  mlp = gmlp_grouped_mlp_new (device, 2, 8, 6, GMLP_ACTIVATION_SWIGLU, NULL);
  other = gmlp_grouped_mlp_new (device, 2, 8, 6, GMLP_ACTIVATION_SWIGLU, NULL);
  x = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, rows, 2, 8, 1.0, NULL);
  wide = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, rows, 2, 9, 1.0, NULL);

  g_assert_null (gmlp_grouped_mlp_forward (mlp, wide, &saved, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH);
  g_assert_null (saved);
  g_clear_error (&error);

  y = gmlp_grouped_mlp_forward (mlp, x, &saved, &error);
  y2 = gmlp_grouped_mlp_forward (other, x, &other_saved, &error);
  g_assert_no_error (error);
  g_assert_null (gmlp_grouped_mlp_backward (mlp, other_saved, y, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);
  g_assert_null (gmlp_grouped_mlp_backward (mlp, saved, wide, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH);
  g_clear_error (&error);
  g_assert_false (gmlp_grouped_mlp_backward_dw (mlp, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
}

/* ---- Group sizes on the device ------------------------------------------ */

/* The rows a group gets from device sizes (docs/memory-layout.md): a
 * negative size counts as 0; member g of an operand of row_bytes[o] bytes
 * a row starts at Σ_{j<g} align256 (size_j × row_bytes[o]), with the sizes
 * as given, and keeps the rows that fit from there in the operand's
 * allocation (capacity rows plus 255 bytes per member, none when rows are
 * multiples of 256 bytes, rounded up to 256). A pass keeps the rows that
 * fit in every operand it reads or writes; over all of @row_bytes, the rows
 * every pass of a step keeps. */
static gint64 *
rows_that_fit (const gint64 *sizes, guint n, gint64 capacity, const gint64 *row_bytes, guint n_ops)
{
  gint64 *fit = g_new (gint64, n);
  g_autofree gint64 *offset = g_new0 (gint64, n_ops);
  guint g, o;

  for (g = 0; g < n; g++)
    {
      gint64 rows = MAX (sizes[g], 0);

      fit[g] = rows;
      for (o = 0; o < n_ops; o++)
        {
          gint64 padding = row_bytes[o] % 256 != 0 ? 255 * (gint64) n : 0;
          gint64 alloc = (capacity * row_bytes[o] + padding + 255) / 256 * 256;
          gint64 room = offset[o] < alloc ? (alloc - offset[o]) / row_bytes[o] : 0;

          fit[g] = MIN (fit[g], room);
          offset[o] += (rows * row_bytes[o] + 255) / 256 * 256;
        }
    }
  return fit;
}

/* All of @t's storage as one group of one column (to read or fill it
 * whole, padding and rows past the sizes included). */
static GmlpGroupedTensor *
storage_view (GmlpGroupedTensor *t)
{
  gsize nbytes = gmlp_grouped_tensor_get_nbytes (t);
  gint64 elements = (gint64) (nbytes / gmlp_dtype_get_size (gmlp_grouped_tensor_get_dtype (t)));
  GmlpTensorLayout layout;
  GmlpGroupedTensor *view;

  gmlp_grouped_tensor_get_layout (t, &layout);
  g_clear_object (&layout.sizes);
  g_clear_pointer (&layout.rows, g_free);
  layout.n_groups = 1;
  layout.cols = 1;
  layout.rows = g_memdup2 (&elements, sizeof elements);
  layout.row_capacity = elements;
  layout.nbytes = nbytes;
  view = gmlp_grouped_tensor_new_with_buffer (&layout, gmlp_grouped_tensor_get_buffer (t));
  gmlp_tensor_layout_clear (&layout);
  return view;
}

static void
fill_storage (GmlpGroupedTensor *t, double scale)
{
  g_autoptr(GmlpGroupedTensor) whole = storage_view (t);
  g_autoptr(GError) error = NULL;

  g_assert_true (gmlp_grouped_tensor_fill_random (whole, g_test_rand_int (), scale, &error));
  g_assert_no_error (error);
}

/* Outside the first rows[g] rows of each member (laid out by @sizes),
 * every byte of @t still holds the poison of fresh memory (GMLP_DEBUG=poison:
 * 0xff): nothing else was written. */
static void
assert_only_rows_written (GmlpGroupedTensor *t, const gint64 *sizes, const gint64 *rows)
{
  guint n = gmlp_grouped_tensor_get_n_groups (t);
  gsize nbytes = gmlp_grouped_tensor_get_nbytes (t);
  gint64 row_bytes = gmlp_grouped_tensor_get_cols (t) * gmlp_dtype_get_size (gmlp_grouped_tensor_get_dtype (t));
  g_autofree guint8 *written = g_malloc0 (MAX (nbytes, 1));
  g_autoptr(GmlpGroupedTensor) whole = NULL;
  g_autoptr(GBytes) bytes = NULL;
  const guint8 *data;
  gint64 offset = 0;
  gsize i;
  guint g;

  if (!gmlp_test_poisoned ())
    return;
  whole = storage_view (t);
  bytes = gmlp_grouped_tensor_to_bytes (whole, NULL);
  g_assert_nonnull (bytes);
  g_assert_cmpuint (g_bytes_get_size (bytes), ==, nbytes);
  data = g_bytes_get_data (bytes, NULL);
  for (g = 0; g < n; g++)
    {
      if (rows[g] > 0)
        {
          g_assert_cmpint (offset + rows[g] * row_bytes, <=, (gint64) nbytes);
          memset (written + offset, 1, rows[g] * row_bytes);
        }
      offset += (MAX (sizes[g], 0) * row_bytes + 255) / 256 * 256;
    }
  for (i = 0; i < nbytes; i++)
    if (!written[i] && data[i] != 0xff)
      g_error ("byte %" G_GSIZE_FORMAT " of %" G_GSIZE_FORMAT " outside the rows was written", i, nbytes);
}

/* A host-sizes view of a device-sizes result, its rows where the kernels
 * put them (the groups before the last with rows have all their rows). */
static GmlpGroupedTensor *
view_of (GmlpGroupedTensor *t, const gint64 *rows)
{
  return gmlp_test_host_view (t, rows);
}

static GmlpGroupedMLP *
new_mlp (GmlpDevice *device, guint n, gint64 hid, gint64 ffn, GmlpActivation act, GmlpDType dtype,
         GmlpLinearFlags flags, guint64 seed)
{
  g_autoptr(GError) error = NULL;
  GmlpGroupedMLP *mlp = gmlp_grouped_mlp_new_full (device, n, hid, ffn, act, dtype, flags, &error);

  g_assert_no_error (error);
  g_assert_true (gmlp_grouped_mlp_init_parameters (mlp, seed, &error));
  g_assert_no_error (error);
  if (flags & GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION)
    for (guint l = 0; l < 2; l++)
      {
        GmlpGroupedLinear *layer = l == 0 ? gmlp_grouped_mlp_get_fc1 (mlp) : gmlp_grouped_mlp_get_fc2 (mlp);
        g_assert_true (gmlp_grouped_tensor_fill_zero (gmlp_grouped_linear_get_main_grad (layer), NULL));
      }
  return mlp;
}

/* One forward and backward with the group sizes only on the device
 * (@sizes: maybe negative, maybe past @capacity; @rows, the rows every pass
 * keeps, all of whose rows are defined): against the float64 reference of
 * those rows and, on the CPU, where both run the same code, bit for bit
 * against the same step of an MLP of the same parameters with @rows on the
 * host (on a GPU the products may take other kernels for the two).
 * Results are views of the device-sizes outputs, which share the input's
 * sizes tensor and capacity. @check_gradients is FALSE where rows past
 * @rows, which the weight gradients add up, are undefined. */
static void
check_device_sizes (GmlpDevice *device, GmlpActivation act, GmlpDType dtype, GmlpLinearFlags flags,
                    gboolean offload, const gint64 *sizes, const gint64 *rows, guint n, gint64 capacity,
                    gint64 hid, gint64 ffn, gboolean check_gradients)
{
  guint64 seed = g_test_rand_int ();
  g_autoptr(GmlpGroupedMLP) mlp_host = new_mlp (device, n, hid, ffn, act, dtype, flags, seed);
  g_autoptr(GmlpGroupedMLP) mlp_dev = new_mlp (device, n, hid, ffn, act, dtype, flags, seed);
  g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, x_sizes = NULL, dy_sizes = NULL, x_dev = NULL, dy_dev = NULL;
  g_autoptr(GmlpGroupedTensor) y = NULL, dx = NULL, y_dev = NULL, dx_dev = NULL, y_view = NULL, dx_view = NULL;
  g_autofree double *xv = NULL, *dyv = NULL, *h = NULL;
  g_autofree char *what = g_strdup_printf ("activation %d %s flags 0x%x%s n=%u capacity=%" G_GINT64_FORMAT,
                                           act, gmlp_dtype_get_name (dtype), flags, offload ? " offload" : "",
                                           n, capacity);

  g_test_message ("%s", what);
  x = gmlp_test_random_tensor (device, dtype, rows, n, hid, 1.0, &xv);
  dy = gmlp_test_random_tensor (device, dtype, rows, n, hid, 1.0, &dyv);
  x_sizes = gmlp_test_sizes_tensor (device, sizes, n);
  /* The output gradient's sizes: the same values, in the same tensor or in
   * one of its own. */
  dy_sizes = g_test_rand_bit () ? g_object_ref (x_sizes) : gmlp_test_sizes_tensor (device, sizes, n);
  x_dev = gmlp_test_device_sized_copy (x, x_sizes, capacity);
  dy_dev = gmlp_test_device_sized_copy (dy, dy_sizes, capacity);
  /* FC1's output as the device-sizes path stores it: on a GPU its product
   * and bias may round otherwise than the host-sizes path's, and a ReLU's
   * derivative flips on one ulp at zero. */
  {
    g_autoptr(GError) error = NULL;
    g_autoptr(GmlpGroupedTensor) h_dev = gmlp_grouped_linear_forward (gmlp_grouped_mlp_get_fc1 (mlp_dev), x_dev,
                                                                      NULL, &error);
    g_autoptr(GmlpGroupedTensor) h_view = NULL;

    g_assert_no_error (error);
    h_view = view_of (h_dev, rows);
    h = values_of (h_view);
  }

  gmlp_test_mlp_step (mlp_dev, x_dev, dy_dev, offload, &y_dev, &dx_dev, NULL);
  g_assert_false (gmlp_grouped_tensor_has_host_sizes (y_dev));
  g_assert_false (gmlp_grouped_tensor_has_host_sizes (dx_dev));
  g_assert_true (gmlp_grouped_tensor_get_sizes (y_dev, NULL) == x_sizes);
  g_assert_true (gmlp_grouped_tensor_get_sizes (dx_dev, NULL) == x_sizes);
  g_assert_cmpint (gmlp_grouped_tensor_get_row_capacity (y_dev), ==, capacity);
  g_assert_cmpint (gmlp_grouped_tensor_get_row_capacity (dx_dev), ==, capacity);
  y_view = view_of (y_dev, rows);
  dx_view = view_of (dx_dev, rows);
  check_against_reference (mlp_dev, rows, xv, h, dyv, y_view, dx_view, check_gradients, what);

  if (gmlp_device_get_kind (device) == GMLP_DEVICE_KIND_CPU)
    {
      gmlp_test_mlp_step (mlp_host, x, dy, offload, &y, &dx, NULL);
      gmlp_test_assert_same_bytes (y_view, y, "y, device sizes against host sizes");
      gmlp_test_assert_same_bytes (dx_view, dx, "dx, device sizes against host sizes");
      if (check_gradients)
        for (guint l = 0; l < 2; l++)
          {
            GmlpGroupedLinear *a = l == 0 ? gmlp_grouped_mlp_get_fc1 (mlp_dev) : gmlp_grouped_mlp_get_fc2 (mlp_dev);
            GmlpGroupedLinear *b = l == 0 ? gmlp_grouped_mlp_get_fc1 (mlp_host) : gmlp_grouped_mlp_get_fc2 (mlp_host);

            gmlp_test_assert_same_bytes (weight_gradient (a), weight_gradient (b), "weight gradient");
            gmlp_test_assert_same_bytes (gmlp_grouped_linear_get_bgrad (a), gmlp_grouped_linear_get_bgrad (b),
                                         "bias gradient");
          }
    }
}

/* Every activation with bias, and recompute, delayed weight gradients
 * into main_grad, offload; FP32 and BF16; random sizes with empty groups,
 * a negative size, room to spare. */
static void
test_device_sizes (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  static const GmlpLinearFlags modes[] = {
    0, GMLP_LINEAR_RECOMPUTE_ACTIVATION,
    GMLP_LINEAR_DELAY_WGRAD_COMPUTE | GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION, 0,
  };
  guint a, m, g;

  if (device == NULL)
    return;

  for (a = 0; a < G_N_ELEMENTS (activations); a++)
    for (m = 0; m < G_N_ELEMENTS (modes); m++)
      {
        GmlpDType dtype = (a + m) % 2 ? GMLP_DTYPE_BFLOAT16 : GMLP_DTYPE_FLOAT32;
        guint n = g_test_rand_int_range (1, 6);
        g_autofree gint64 *sizes = gmlp_test_random_rows (n, 40);
        g_autofree gint64 *rows = NULL;
        gint64 capacity = g_test_rand_int_range (0, 20);

        if (m == 1)
          sizes[g_test_rand_int_range (0, n)] = -g_test_rand_int_range (1, 6);
        rows = gmlp_test_clamped_rows (sizes, n, G_MAXINT32);
        for (g = 0; g < n; g++)
          capacity += rows[g];
        check_device_sizes (device, activations[a], dtype,
                            GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS | modes[m], m == 3,
                            sizes, rows, n, capacity, g_test_rand_int_range (1, 40),
                            g_test_rand_int_range (1, 50), TRUE);
      }
}

/* Sizes past the capacity, a capacity of zero, no rows at all, a capacity
 * that the sizes fill exactly. With rows of whole multiples of 256 bytes
 * (FP32 64 wide, BF16 128 wide) every pass keeps the sizes clamped in
 * order to the capacity, and the whole step is that of those rows. With
 * other widths each pass keeps what fits in its own operands; the rows
 * that fit in all of them are still the step's (the groups after the last
 * one cut short have none, so nothing moves). */
static void
test_device_sizes_capacity (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  static const struct {
    guint n;
    gint64 sizes[6];
    gint64 capacity;
  } cases[] = {
    { 6, { 30, 0, 50, 20, -3, 10 }, 60 },
    { 3, { 5, 9, 2 }, 0 },
    { 4, { 0, 0, 0, 0 }, 16 },
    { 2, { 5, 7 }, 12 },
    { 3, { 9, 0, 70 }, 40 },
  };
  guint c, aligned;

  if (device == NULL)
    return;

  for (c = 0; c < G_N_ELEMENTS (cases); c++)
    for (aligned = 0; aligned < 2; aligned++)
      {
        guint n = cases[c].n;
        GmlpActivation act = (c + aligned) % 2 ? GMLP_ACTIVATION_SWIGLU : GMLP_ACTIVATION_GELU;
        GmlpDType dtype = aligned && c % 2 ? GMLP_DTYPE_FLOAT32 : GMLP_DTYPE_BFLOAT16;
        gint64 width = dtype == GMLP_DTYPE_FLOAT32 ? 64 : 128;
        gint64 hid = aligned ? width : 24, ffn = aligned ? width : 40;
        gint64 size = gmlp_dtype_get_size (dtype);
        gint64 row_bytes[3] = { hid * size, ffn * size, (act == GMLP_ACTIVATION_SWIGLU ? 2 : 1) * ffn * size };
        g_autofree gint64 *rows = aligned ? gmlp_test_clamped_rows (cases[c].sizes, n, cases[c].capacity)
                                          : rows_that_fit (cases[c].sizes, n, cases[c].capacity, row_bytes, 3);
        gboolean whole = TRUE;

        if (aligned)
          {
            /* The clamped sizes are what the kernels' rule gives here. */
            g_autofree gint64 *fit = rows_that_fit (cases[c].sizes, n, cases[c].capacity, row_bytes, 3);

            g_assert_cmpmem (fit, n * sizeof (gint64), rows, n * sizeof (gint64));
          }
        else
          {
            /* Only the last group with rows may be cut short here (see
             * view_of()); where it is, the rows past its fit are undefined. */
            for (guint g = 0; g < n; g++)
              whole = whole && rows[g] == MAX (cases[c].sizes[g], 0);
          }
        check_device_sizes (device, act, dtype, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS,
                            FALSE, cases[c].sizes, rows, n, cases[c].capacity, hid, ffn, whole);
      }
}

/* The activation alone, forward and backward, every activation and dtype,
 * widths that take the vectorised kernels and widths that do not: with
 * device sizes (past the capacity too) the same bytes as with the rows
 * that fit on the host, on any device (one kernel body serves both), and
 * nothing written outside those rows. */
static void
test_device_sizes_activation (void)
{
  static const GmlpDType dtypes[] = { GMLP_DTYPE_FLOAT32, GMLP_DTYPE_FLOAT16, GMLP_DTYPE_BFLOAT16 };
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint a, d, iter;

  if (device == NULL)
    return;

  for (a = 0; a < G_N_ELEMENTS (activations); a++)
    for (d = 0; d < G_N_ELEMENTS (dtypes); d++)
      for (iter = 0; iter < 3; iter++)
        {
          GmlpActivation act = activations[a];
          GmlpDType dtype = dtypes[d];
          guint n = g_test_rand_int_range (1, 7), g;
          gint64 ffn = iter == 0 ? 64 : iter == 1 ? 8 * g_test_rand_int_range (1, 20) : g_test_rand_int_range (1, 70);
          gint64 in_cols = gated (act) ? 2 * ffn : ffn, size = gmlp_dtype_get_size (dtype), total = 0, capacity;
          g_autofree gint64 *sizes = gmlp_test_random_rows (n, 90);
          g_autofree gint64 *rows = NULL;
          g_autoptr(GmlpGroupedMLP) mlp = new_mlp (device, n, 8, ffn, act, dtype, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT, 1);
          g_autoptr(GmlpGroupedTensor) h = NULL, da = NULL, sizes_t = NULL, h_dev = NULL, da_dev = NULL;
          g_autoptr(GmlpGroupedTensor) out = NULL, out_dev = NULL, grad = NULL, grad_dev = NULL;
          g_autoptr(GmlpGroupedTensor) out_view = NULL, grad_view = NULL;
          g_autoptr(GError) error = NULL;
          gint64 row_bytes[2] = { in_cols * size, ffn * size };

          for (g = 0; g < n; g++)
            total += sizes[g];
          /* Room to spare, or sizes past the capacity. */
          capacity = iter == 2 ? total / 2 : total + g_test_rand_int_range (0, 30);
          rows = rows_that_fit (sizes, n, capacity, row_bytes, 2);
          g_test_message ("activation %d %s f=%" G_GINT64_FORMAT " n=%u capacity %" G_GINT64_FORMAT
                          " of %" G_GINT64_FORMAT, act, gmlp_dtype_get_name (dtype), ffn, n, capacity, total);

          /* Random values over the whole storage of the device-sizes
           * tensors; host-sizes views of them hold the rows that fit, where
           * the kernels find them (the groups after one cut short have no
           * rows: the next member starts past the allocation). */
          sizes_t = gmlp_test_sizes_tensor (device, sizes, n);
          h_dev = gmlp_grouped_tensor_new_with_device_sizes (device, dtype, sizes_t, capacity, in_cols, &error);
          g_assert_no_error (error);
          da_dev = gmlp_grouped_tensor_new_with_device_sizes (device, dtype, sizes_t, capacity, ffn, &error);
          g_assert_no_error (error);
          fill_storage (h_dev, 2.0);
          fill_storage (da_dev, 1.0);
          h = view_of (h_dev, rows);
          da = view_of (da_dev, rows);

          out = gmlp_grouped_mlp_run_activation (mlp, h, &error);
          g_assert_no_error (error);
          out_dev = gmlp_grouped_mlp_run_activation (mlp, h_dev, &error);
          g_assert_no_error (error);
          grad = gmlp_grouped_mlp_run_activation_grad (mlp, h, da, &error);
          g_assert_no_error (error);
          grad_dev = gmlp_grouped_mlp_run_activation_grad (mlp, h_dev, da_dev, &error);
          g_assert_no_error (error);

          g_assert_false (gmlp_grouped_tensor_has_host_sizes (out_dev));
          g_assert_true (gmlp_grouped_tensor_get_sizes (out_dev, NULL) == sizes_t);
          g_assert_cmpint (gmlp_grouped_tensor_get_cols (out_dev), ==, ffn);
          g_assert_cmpint (gmlp_grouped_tensor_get_cols (grad_dev), ==, in_cols);
          out_view = view_of (out_dev, rows);
          grad_view = view_of (grad_dev, rows);
          gmlp_test_assert_same_bytes (out_view, out, "activation, device sizes");
          gmlp_test_assert_same_bytes (grad_view, grad, "activation gradient, device sizes");
          assert_only_rows_written (out_dev, sizes, rows);
          assert_only_rows_written (grad_dev, sizes, rows);
        }
}

/* ---- Versions and no partial writes ------------------------------------- */

static GBytes *
bytes_of (GmlpGroupedTensor *t)
{
  g_autoptr(GError) error = NULL;
  GBytes *bytes = gmlp_grouped_tensor_to_bytes (t, &error);

  g_assert_no_error (error);
  return bytes;
}

/* The weight gradients of both layers (main_grad with fused accumulation),
 * as bytes, to tell whether a call wrote any. */
static void
gradient_bytes (GmlpGroupedMLP *mlp, GBytes *out[2])
{
  guint i;

  for (i = 0; i < 2; i++)
    {
      GmlpGroupedLinear *layer = i == 0 ? gmlp_grouped_mlp_get_fc1 (mlp) : gmlp_grouped_mlp_get_fc2 (mlp);
      GmlpGroupedTensor *grad = gmlp_grouped_linear_get_wgrad (layer);

      if (grad == NULL)
        grad = gmlp_grouped_linear_get_main_grad (layer);
      out[i] = bytes_of (grad);
    }
}

static void
assert_gradients_unchanged (GmlpGroupedMLP *mlp, GBytes *before[2])
{
  GBytes *after[2];
  guint i;

  gradient_bytes (mlp, after);
  for (i = 0; i < 2; i++)
    {
      if (!g_bytes_equal (before[i], after[i]))
        g_error ("FC%u's weight gradients were written by a call that failed", i + 1);
      g_bytes_unref (after[i]);
    }
}

static void
gradient_bytes_clear (GBytes *bytes[2])
{
  g_clear_pointer (&bytes[0], g_bytes_unref);
  g_clear_pointer (&bytes[1], g_bytes_unref);
}

/* A backward whose input, or either layer's weights, were written since
 * the forward fails before either layer writes, naming the tensor. */
static void
test_versions (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  gint64 rows[] = { 7, 0, 4 };
  guint what;

  if (device == NULL)
    return;

  for (what = 0; what < 3; what++)
    {
      g_autoptr(GmlpGroupedMLP) mlp = NULL;
      g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, y = NULL, dx = NULL;
      g_autoptr(GmlpSavedActivations) saved = NULL;
      g_autoptr(GError) error = NULL;
      GBytes *before[2];
      const char *name;

      mlp = gmlp_grouped_mlp_new_full (device, 3, 16, 12, GMLP_ACTIVATION_SWIGLU, GMLP_DTYPE_FLOAT32,
                                       GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS, &error);
      g_assert_no_error (error);
      x = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, rows, 3, 16, 1.0, NULL);
      dy = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, rows, 3, 16, 1.0, NULL);
      y = gmlp_grouped_mlp_forward (mlp, x, &saved, &error);
      g_assert_no_error (error);
      dx = gmlp_grouped_mlp_backward (mlp, saved, dy, &error);
      g_assert_no_error (error);
      g_clear_object (&saved);
      g_clear_object (&y);
      g_clear_object (&dx);

      y = gmlp_grouped_mlp_forward (mlp, x, &saved, &error);
      g_assert_no_error (error);
      if (what == 0)
        {
          g_assert_true (gmlp_grouped_tensor_scale (x, 0.5, NULL));
          name = "input";
        }
      else
        {
          GmlpGroupedLinear *layer = what == 1 ? gmlp_grouped_mlp_get_fc1 (mlp) : gmlp_grouped_mlp_get_fc2 (mlp);
          GmlpGroupedTensor *w = gmlp_grouped_linear_get_weight (layer);

          g_assert_true (gmlp_grouped_tensor_add_scaled (w, -0.1, w, NULL));
          name = what == 1 ? "FC1" : "FC2";
        }
      gradient_bytes (mlp, before);

      g_assert_null (gmlp_grouped_mlp_backward (mlp, saved, dy, &error));
      g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
      if (strstr (error->message, name) == NULL || (what > 0 && strstr (error->message, "weight") == NULL))
        g_error ("The error does not say what changed: %s", error->message);
      g_clear_error (&error);
      g_assert_false (gmlp_saved_activations_is_consumed (saved));
      assert_gradients_unchanged (mlp, before);
      gradient_bytes_clear (before);
    }
}

/* One step of an MLP whose FC1 multiplies in FP8 (current scaling) with
 * fused accumulation from zeroed main_grads: dx and both main_grads. */
static GmlpGroupedMLP *
new_fp8_fc1_mlp (GmlpDevice *device, GmlpLinearFlags flags)
{
  g_autoptr(GError) error = NULL;
  GmlpGroupedMLP *mlp = gmlp_grouped_mlp_new_full (device, 3, 32, 16, GMLP_ACTIVATION_GELU,
                                                   GMLP_DTYPE_BFLOAT16,
                                                   GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS |
                                                   GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION | flags, &error);

  g_assert_no_error (error);
  g_assert_true (gmlp_grouped_mlp_init_parameters (mlp, 5, NULL));
  return mlp;
}

static void
set_fc1_fp8 (GmlpGroupedMLP *mlp, gboolean on)
{
  GmlpDevice *device = gmlp_grouped_linear_get_device (gmlp_grouped_mlp_get_fc1 (mlp));
  g_autoptr(GmlpQuantizer) qx = NULL, qw = NULL, qg = NULL;
  g_autoptr(GError) error = NULL;

  if (on)
    {
      qx = gmlp_quantizer_new (device, GMLP_SCALING_RECIPE_CURRENT, GMLP_FP8_FORMAT_HYBRID,
                               GMLP_QUANTIZER_ROLE_INPUT);
      qw = gmlp_quantizer_new (device, GMLP_SCALING_RECIPE_CURRENT, GMLP_FP8_FORMAT_HYBRID,
                               GMLP_QUANTIZER_ROLE_WEIGHT);
      qg = gmlp_quantizer_new (device, GMLP_SCALING_RECIPE_CURRENT, GMLP_FP8_FORMAT_HYBRID,
                               GMLP_QUANTIZER_ROLE_GRAD_OUTPUT);
    }
  g_assert_true (gmlp_grouped_linear_set_quantizers (gmlp_grouped_mlp_get_fc1 (mlp), qx, qw, qg, &error));
  g_assert_no_error (error);
}

static void
zero_main_grads (GmlpGroupedMLP *mlp)
{
  g_assert_true (gmlp_grouped_tensor_fill_zero (gmlp_grouped_linear_get_main_grad (gmlp_grouped_mlp_get_fc1 (mlp)), NULL));
  g_assert_true (gmlp_grouped_tensor_fill_zero (gmlp_grouped_linear_get_main_grad (gmlp_grouped_mlp_get_fc2 (mlp)), NULL));
}

/* A backward that FC1 cannot run (its FP8 forward's quantizers are gone)
 * fails before FC2 accumulates into its main_grad; the activations stay
 * usable, and the retry gives the bits of a step that never failed. With
 * an output gradient of the wrong shape, the same. */
static void
test_backward_no_partial_write (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  gint64 rows[] = { 9, 0, 6 };
  gint64 rows_other[] = { 9, 1, 5 };
  guint offload;

  if (device == NULL)
    return;

  for (offload = 0; offload < 2; offload++)
    {
      g_autoptr(GmlpGroupedMLP) mlp = new_fp8_fc1_mlp (device, 0);
      g_autoptr(GmlpOffloadContext) ctx = gmlp_offload_context_new (device, NULL);
      g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, dy_other = NULL, y = NULL, dx = NULL, dx_ref = NULL;
      g_autoptr(GmlpSavedActivations) saved = NULL;
      g_autoptr(GError) error = NULL;
      GBytes *before[2], *reference[2];

      x = gmlp_test_random_tensor (device, GMLP_DTYPE_BFLOAT16, rows, 3, 32, 1.0, NULL);
      dy = gmlp_test_random_tensor (device, GMLP_DTYPE_BFLOAT16, rows, 3, 32, 1.0, NULL);
      dy_other = gmlp_test_random_tensor (device, GMLP_DTYPE_BFLOAT16, rows_other, 3, 32, 1.0, NULL);
      set_fc1_fp8 (mlp, TRUE);

      /* The reference: a step that does not fail. */
      zero_main_grads (mlp);
      y = gmlp_grouped_mlp_forward (mlp, x, &saved, &error);
      g_assert_no_error (error);
      dx_ref = gmlp_grouped_mlp_backward (mlp, saved, dy, &error);
      g_assert_no_error (error);
      gradient_bytes (mlp, reference);
      g_clear_object (&saved);
      g_clear_object (&y);

      zero_main_grads (mlp);
      if (offload)
        gmlp_offload_context_push_thread_default (ctx, TRUE);
      y = gmlp_grouped_mlp_forward (mlp, x, &saved, &error);
      g_assert_no_error (error);
      if (offload)
        {
          g_assert_true (gmlp_offload_context_pop_thread_default (ctx, NULL));
          gmlp_offload_context_flush (ctx);
          g_assert_cmpuint (gmlp_saved_activations_get_host_nbytes (saved), >, 0);
        }
      gradient_bytes (mlp, before);

      g_assert_null (gmlp_grouped_mlp_backward (mlp, saved, dy_other, &error));
      g_assert_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH);
      g_clear_error (&error);
      g_assert_false (gmlp_saved_activations_is_consumed (saved));
      assert_gradients_unchanged (mlp, before);

      set_fc1_fp8 (mlp, FALSE);
      g_assert_null (gmlp_grouped_mlp_backward (mlp, saved, dy, &error));
      g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
      g_clear_error (&error);
      g_assert_false (gmlp_saved_activations_is_consumed (saved));
      assert_gradients_unchanged (mlp, before);

      set_fc1_fp8 (mlp, TRUE);
      dx = gmlp_grouped_mlp_backward (mlp, saved, dy, &error);
      g_assert_no_error (error);
      g_assert_true (gmlp_saved_activations_is_consumed (saved));
      gmlp_test_assert_same_bytes (dx, dx_ref, "dx after a retry");
      assert_gradients_unchanged (mlp, reference);
      gradient_bytes_clear (before);
      gradient_bytes_clear (reference);
    }
}

/* backward_dw computes both layers' weight gradients or neither: with FC1
 * having nothing pending (its own backward_dw ran), or with the input
 * written since the backward, FC2's stays pending and unwritten. */
static void
test_backward_dw_no_partial_write (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  gint64 rows[] = { 4, 11, 0 };
  guint what;

  if (device == NULL)
    return;

  for (what = 0; what < 2; what++)
    {
      g_autoptr(GmlpGroupedMLP) mlp = NULL;
      g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, y = NULL, dx = NULL;
      g_autoptr(GmlpSavedActivations) saved = NULL;
      g_autoptr(GError) error = NULL;
      GmlpGroupedLinear *fc1, *fc2;
      GBytes *before[2];

      mlp = gmlp_grouped_mlp_new_full (device, 3, 16, 8, GMLP_ACTIVATION_RELU, GMLP_DTYPE_FLOAT32,
                                       GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS |
                                       GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION |
                                       GMLP_LINEAR_DELAY_WGRAD_COMPUTE, &error);
      g_assert_no_error (error);
      fc1 = gmlp_grouped_mlp_get_fc1 (mlp);
      fc2 = gmlp_grouped_mlp_get_fc2 (mlp);
      x = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, rows, 3, 16, 1.0, NULL);
      dy = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, rows, 3, 16, 1.0, NULL);
      y = gmlp_grouped_mlp_forward (mlp, x, &saved, &error);
      g_assert_no_error (error);
      dx = gmlp_grouped_mlp_backward (mlp, saved, dy, &error);
      g_assert_no_error (error);
      g_assert_cmpuint (gmlp_grouped_linear_get_pending_wgrads (fc1), ==, 1);
      g_assert_cmpuint (gmlp_grouped_linear_get_pending_wgrads (fc2), ==, 1);

      if (what == 0)
        {
          g_assert_true (gmlp_grouped_linear_backward_dw (fc1, &error));
          g_assert_no_error (error);
        }
      else
        {
          g_assert_true (gmlp_grouped_tensor_fill_zero (x, NULL));
        }
      gradient_bytes (mlp, before);

      g_assert_false (gmlp_grouped_mlp_backward_dw (mlp, &error));
      g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
      if (what == 1 && strstr (error->message, "input") == NULL)
        g_error ("The error does not name the input: %s", error->message);
      g_clear_error (&error);
      g_assert_cmpuint (gmlp_grouped_linear_get_pending_wgrads (fc2), ==, 1);
      g_assert_cmpuint (gmlp_grouped_linear_get_pending_wgrads (fc1), ==, what == 0 ? 0 : 1);
      assert_gradients_unchanged (mlp, before);
      gradient_bytes_clear (before);
    }
}

int
main (int argc, char *argv[])
{
  setlocale (LC_ALL, "");
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Gmlp/GroupedMLP/numerics", test_numerics);
  g_test_add_func ("/Gmlp/GroupedMLP/many-experts-recompute", test_many_experts_recompute);
  g_test_add_func ("/Gmlp/GroupedMLP/recompute-offload-identical", test_recompute_offload_identical);
  g_test_add_func ("/Gmlp/GroupedMLP/gradient-check", test_gradient_check);
  g_test_add_func ("/Gmlp/GroupedMLP/bad-input", test_bad_input);
  g_test_add_func ("/Gmlp/GroupedMLP/device-sizes", test_device_sizes);
  g_test_add_func ("/Gmlp/GroupedMLP/device-sizes/capacity", test_device_sizes_capacity);
  g_test_add_func ("/Gmlp/GroupedMLP/device-sizes/activation", test_device_sizes_activation);
  g_test_add_func ("/Gmlp/GroupedMLP/versions", test_versions);
  g_test_add_func ("/Gmlp/GroupedMLP/backward-no-partial-write", test_backward_no_partial_write);
  g_test_add_func ("/Gmlp/GroupedMLP/backward-dw-no-partial-write", test_backward_dw_no_partial_write);

  return g_test_run ();
}
