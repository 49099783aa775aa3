/* test-grouped-mlp.c: GroupedMLP against float64 references
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <math.h>
#include <string.h>

#include "gmlp-test-util.h"

static const GmlpActivation activations[] = {
  GMLP_ACTIVATION_GELU, GMLP_ACTIVATION_RELU, GMLP_ACTIVATION_SRELU,
  GMLP_ACTIVATION_SWIGLU, GMLP_ACTIVATION_GEGLU,
};

static gboolean
gated (GmlpActivation act)
{
  return act == GMLP_ACTIVATION_SWIGLU || act == GMLP_ACTIVATION_GEGLU;
}

/* The activations in float64, written independently of the library. */
static double
act_f (GmlpActivation act, double x)
{
  switch (act)
    {
    case GMLP_ACTIVATION_GELU:
    case GMLP_ACTIVATION_GEGLU:
      return 0.5 * x * (1.0 + tanh (sqrt (2.0 / G_PI) * (x + 0.044715 * x * x * x)));
    case GMLP_ACTIVATION_SWIGLU:
      return x / (1.0 + exp (-x));
    case GMLP_ACTIVATION_RELU:
      return x > 0 ? x : 0;
    case GMLP_ACTIVATION_SRELU:
      return x > 0 ? x * x : 0;
    default:
      g_assert_not_reached ();
    }
}

/* The derivative by a central difference of the float64 function: an
 * independent check of the library's closed forms. */
static double
act_df (GmlpActivation act, double x)
{
  const double h = 1e-6;

  if ((act == GMLP_ACTIVATION_RELU || act == GMLP_ACTIVATION_SRELU) && fabs (x) < h)
    return act == GMLP_ACTIVATION_RELU ? (x > 0) : 0.0;
  return (act_f (act, x + h) - act_f (act, x - h)) / (2 * h);
}

static double *
values_of (GmlpGroupedTensor *t)
{
  return gmlp_test_download (t, NULL);
}

/* y_i = x_i W_iᵀ + b_i over packed rows. */
static double *
linear_ref (const double *x, const double *w, const double *b, const gint64 *rows, guint n,
            gint64 k, gint64 o, GmlpDType round_to)
{
  gint64 total = 0, i;
  double *y;
  guint g;

  for (g = 0; g < n; g++)
    total += rows[g];
  y = g_new0 (double, MAX (total * o, 1));
  gmlp_test_linear_reference (rows, n, k, o, x, w, b, NULL, NULL, y, NULL, NULL, NULL);
  for (i = 0; i < total * o; i++)
    y[i] = gmlp_test_round (y[i], round_to);
  return y;
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
  g_autofree double *xv = NULL, *dyv = NULL, *w1 = NULL, *b1 = NULL, *w2 = NULL, *b2 = NULL;
  g_autofree double *h = NULL, *a = NULL, *yref = NULL, *da = NULL, *dh = NULL, *dxref = NULL;
  g_autofree double *got = NULL, *dw1 = NULL, *dw2 = NULL, *db1 = NULL, *db2 = NULL;
  GmlpGroupedLinear *fc1, *fc2;
  gint64 w1o = gated (act) ? 2 * ffn : ffn, total = 0, r, j, c, r0;
  double tol = gmlp_test_tolerance (dtype) * 2;
  guint g;

  g_assert_no_error (error);
  g_assert_true (gmlp_grouped_mlp_init_parameters (mlp, g_test_rand_int (), NULL));
  fc1 = gmlp_grouped_mlp_get_fc1 (mlp);
  fc2 = gmlp_grouped_mlp_get_fc2 (mlp);
  g_assert_cmpint (gmlp_grouped_linear_get_out_features (fc1), ==, w1o);
  for (g = 0; g < n; g++)
    total += rows[g];

  x = gmlp_test_random_tensor (device, dtype, rows, n, hid, 1.0, &xv);
  dy = gmlp_test_random_tensor (device, dtype, rows, n, hid, 1.0, &dyv);
  w1 = values_of (gmlp_grouped_linear_get_weight (fc1));
  b1 = values_of (gmlp_grouped_linear_get_bias (fc1));
  w2 = values_of (gmlp_grouped_linear_get_weight (fc2));
  b2 = values_of (gmlp_grouped_linear_get_bias (fc2));

  /* Forward reference. FC1's output is taken from the layer itself (its
   * own tests check it): near a kink of ReLU, a float64 h could round to the
   * other side of zero and gate differently from the stored one. */
  {
    g_autoptr(GmlpGroupedTensor) h_lib = gmlp_grouped_linear_forward (fc1, x, NULL, &error);
    g_assert_no_error (error);
    h = values_of (h_lib);
  }
  a = g_new0 (double, MAX (total * ffn, 1));
  for (r = 0; r < total; r++)
    for (j = 0; j < ffn; j++)
      a[r * ffn + j] = gmlp_test_round (gated (act) ? act_f (act, h[r * w1o + j]) * h[r * w1o + ffn + j]
                                                    : act_f (act, h[r * w1o + j]), dtype);
  yref = linear_ref (a, w2, b2, rows, n, ffn, hid, GMLP_DTYPE_FLOAT32);

  y = gmlp_grouped_mlp_forward (mlp, x, &saved, &error);
  g_assert_no_error (error);
  got = values_of (y);
  gmlp_test_assert_close (got, yref, total * hid, tol, "mlp fprop");
  g_clear_pointer (&got, g_free);

  /* Backward reference: da = dy W2, dh = act'(h) da, dx = dh W1. */
  da = g_new0 (double, MAX (total * ffn, 1));
  dh = g_new0 (double, MAX (total * w1o, 1));
  dxref = g_new0 (double, MAX (total * hid, 1));
  dw1 = g_new0 (double, n * w1o * hid);
  dw2 = g_new0 (double, n * hid * ffn);
  db1 = g_new0 (double, n * w1o);
  db2 = g_new0 (double, n * hid);
  r0 = 0;
  for (g = 0; g < n; g++)
    {
      for (r = r0; r < r0 + rows[g]; r++)
        {
          for (c = 0; c < ffn; c++)
            {
              double acc = 0;
              for (j = 0; j < hid; j++)
                acc += dyv[r * hid + j] * w2[(g * hid + j) * ffn + c];
              da[r * ffn + c] = gmlp_test_round (acc, dtype);
            }
          for (c = 0; c < ffn; c++)
            {
              double hv = h[r * w1o + c];
              if (gated (act))
                {
                  double bv = h[r * w1o + ffn + c];
                  dh[r * w1o + c] = gmlp_test_round (da[r * ffn + c] * bv * act_df (act, hv), dtype);
                  dh[r * w1o + ffn + c] = gmlp_test_round (da[r * ffn + c] * act_f (act, hv), dtype);
                }
              else
                dh[r * w1o + c] = gmlp_test_round (da[r * ffn + c] * act_df (act, hv), dtype);
            }
          for (c = 0; c < hid; c++)
            {
              double acc = 0;
              for (j = 0; j < w1o; j++)
                acc += dh[r * w1o + j] * w1[(g * w1o + j) * hid + c];
              dxref[r * hid + c] = acc;
            }
          for (j = 0; j < hid; j++)
            {
              db2[g * hid + j] += dyv[r * hid + j];
              for (c = 0; c < ffn; c++)
                dw2[(g * hid + j) * ffn + c] += dyv[r * hid + j] * a[r * ffn + c];
            }
          for (j = 0; j < w1o; j++)
            {
              db1[g * w1o + j] += dh[r * w1o + j];
              for (c = 0; c < hid; c++)
                dw1[(g * w1o + j) * hid + c] += dh[r * w1o + j] * xv[r * hid + c];
            }
        }
      r0 += rows[g];
    }

  dx = gmlp_grouped_mlp_backward (mlp, saved, dy, &error);
  g_assert_no_error (error);
  got = values_of (dx);
  gmlp_test_assert_close (got, dxref, total * hid, tol, "mlp dgrad");
  g_clear_pointer (&got, g_free);
  got = values_of (gmlp_grouped_linear_get_wgrad (fc2));
  gmlp_test_assert_close (got, dw2, n * hid * ffn, tol, "fc2 wgrad");
  g_clear_pointer (&got, g_free);
  got = values_of (gmlp_grouped_linear_get_wgrad (fc1));
  gmlp_test_assert_close (got, dw1, n * w1o * hid, tol, "fc1 wgrad");
  g_clear_pointer (&got, g_free);
  got = values_of (gmlp_grouped_linear_get_bgrad (fc1));
  gmlp_test_assert_close (got, db1, n * w1o, tol, "fc1 dbias");
  g_clear_pointer (&got, g_free);
  got = values_of (gmlp_grouped_linear_get_bgrad (fc2));
  gmlp_test_assert_close (got, db2, n * hid, tol, "fc2 dbias");
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

/* The MLP's activation kernels take host sizes: a tensor whose sizes are
 * only on the device is refused before anything is enqueued or allocated,
 * in forward and in backward (where the saved activations stay usable). */
static void
test_device_sizes_unsupported (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpGroupedMLP) mlp = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, sizes = NULL, x_dev = NULL, dy_dev = NULL;
  g_autoptr(GmlpGroupedTensor) y = NULL, dx = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL, saved_dev = NULL;
  g_autoptr(GBytes) size_bytes = NULL;
  g_autoptr(GError) error = NULL;
  gint64 rows[] = { 3, 0, 4 };
  gint64 three = 3;
  guint64 in_use;

  if (device == NULL)
    return;

  mlp = gmlp_grouped_mlp_new (device, 3, 8, 6, GMLP_ACTIVATION_GELU, &error);
  g_assert_no_error (error);
  x = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, rows, 3, 8, 1.0, NULL);
  dy = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, rows, 3, 8, 1.0, NULL);
  size_bytes = g_bytes_new (rows, sizeof rows);
  sizes = gmlp_grouped_tensor_new_from_bytes (device, GMLP_DTYPE_INT64, &three, 1, 1, size_bytes, &error);
  g_assert_no_error (error);
  x_dev = gmlp_grouped_tensor_new_with_device_sizes (device, GMLP_DTYPE_FLOAT32, sizes, 7, 8, &error);
  g_assert_no_error (error);
  dy_dev = gmlp_grouped_tensor_new_with_device_sizes (device, GMLP_DTYPE_FLOAT32, sizes, 7, 8, &error);
  g_assert_no_error (error);

  y = gmlp_grouped_mlp_forward (mlp, x, &saved, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_device_synchronize (device, NULL));
  in_use = gmlp_device_get_bytes_in_use (device);

  g_assert_null (gmlp_grouped_mlp_forward (mlp, x_dev, &saved_dev, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED);
  g_assert_null (saved_dev);
  g_clear_error (&error);
  g_assert_null (gmlp_grouped_mlp_backward (mlp, saved, dy_dev, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED);
  g_clear_error (&error);
  g_assert_cmpuint (gmlp_device_get_bytes_in_use (device), ==, in_use);
  g_assert_false (gmlp_saved_activations_is_consumed (saved));

  dx = gmlp_grouped_mlp_backward (mlp, saved, dy, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_saved_activations_is_consumed (saved));
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
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Gmlp/GroupedMLP/numerics", test_numerics);
  g_test_add_func ("/Gmlp/GroupedMLP/many-experts-recompute", test_many_experts_recompute);
  g_test_add_func ("/Gmlp/GroupedMLP/recompute-offload-identical", test_recompute_offload_identical);
  g_test_add_func ("/Gmlp/GroupedMLP/gradient-check", test_gradient_check);
  g_test_add_func ("/Gmlp/GroupedMLP/bad-input", test_bad_input);
  g_test_add_func ("/Gmlp/GroupedMLP/device-sizes-unsupported", test_device_sizes_unsupported);
  g_test_add_func ("/Gmlp/GroupedMLP/versions", test_versions);
  g_test_add_func ("/Gmlp/GroupedMLP/backward-no-partial-write", test_backward_no_partial_write);
  g_test_add_func ("/Gmlp/GroupedMLP/backward-dw-no-partial-write", test_backward_dw_no_partial_write);

  return g_test_run ();
}
