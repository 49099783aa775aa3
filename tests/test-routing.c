/* test-routing.c: GmlpRouting's token permutation against float64 references
 *
 * Every numeric result is compared with a reference computed here from the
 * dense formulation: the map from the rule as documented (expert by expert,
 * the choices in order, the first ones kept under a capacity), the rows and
 * sums in float64 from the inputs as stored. Outputs are fresh memory, which
 * GMLP_DEBUG=poison fills with NaN, so a row left unwritten fails. On a GPU every
 * result is also compared with the CPU backend's from the same inputs: bit
 * for bit, but for grad_probs, whose dot products the GPU sums in another
 * order. /Gmlp/Routing/64-bit runs on the GPU only: past 2^31 elements.
 *
 * This file has the tests of the numbers, the threads' test and main();
 * the reference, the checks and the other tests are in the files that
 * test-routing.h lists.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "test-routing.h"

/* Tests */

static void
test_random (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  static const gint64 hidden[] = { 1, 5, 64, 33 };
  guint i, d;

  if (device == NULL)
    return;
  for (i = 0; i < 4; i++)
    for (d = 0; d < G_N_ELEMENTS (float_dtypes); d++)
      {
        gint64 T = g_test_rand_int_range (1, 60);
        guint k = g_test_rand_int_range (1, 5), E = g_test_rand_int_range (1, 12);
        g_autofree gint64 *idx = random_indices (T, k, E);

        check_routing (device, idx, T, k, E, hidden[i], 0, 0.0, float_dtypes[d],
                       float_dtypes[(d + i) % G_N_ELEMENTS (float_dtypes)]);
      }
}

static void
test_top_k_16 (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autofree gint64 *idx = NULL;

  if (device == NULL)
    return;
  idx = random_indices (20, 16, 64);
  check_routing (device, idx, 20, 16, 64, 8, 16, 0.0, GMLP_DTYPE_BFLOAT16, GMLP_DTYPE_BFLOAT16);
}

static void
test_empty_experts (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  gint64 T = 40, c;
  guint k = 2, E = 16;
  g_autofree gint64 *idx = g_new (gint64, T * k);

  if (device == NULL)
    return;
  /* Only experts 3, 4 and 11: the first, the last and most others empty. */
  for (c = 0; c < T * k; c++)
    idx[c] = (gint64[]) { 3, 4, 11 }[g_test_rand_int_range (0, 3)];
  check_routing (device, idx, T, k, E, 12, 0, 0.0, GMLP_DTYPE_FLOAT32, GMLP_DTYPE_FLOAT32);
  check_routing (device, idx, T, k, E, 12, 16, 0.0, GMLP_DTYPE_FLOAT16, GMLP_DTYPE_FLOAT32);
}

static void
test_one_expert (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  gint64 T = 37, c;
  guint k;

  if (device == NULL)
    return;
  /* Every token to expert 5 of 8; with k = 3, each token thrice. */
  for (k = 1; k <= 3; k += 2)
    {
      g_autofree gint64 *idx = g_new (gint64, T * k);

      for (c = 0; c < T * k; c++)
        idx[c] = 5;
      check_routing (device, idx, T, k, 8, 16, 0, 0.0, GMLP_DTYPE_BFLOAT16, GMLP_DTYPE_FLOAT32);
      check_routing (device, idx, T, k, 8, 16, 32, 1.0, GMLP_DTYPE_FLOAT32, GMLP_DTYPE_BFLOAT16);
    }
}

static void
test_padding (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  static const guint paddings[] = { 0, 1, 4, 16, 32, 128 };
  guint i;

  if (device == NULL)
    return;
  for (i = 0; i < G_N_ELEMENTS (paddings); i++)
    {
      gint64 T = g_test_rand_int_range (1, 50);
      guint k = g_test_rand_int_range (1, 4), E = g_test_rand_int_range (1, 9);
      g_autofree gint64 *idx = random_indices (T, k, E);

      check_routing (device, idx, T, k, E, 7, paddings[i], 0.0,
                     float_dtypes[i % G_N_ELEMENTS (float_dtypes)], GMLP_DTYPE_FLOAT32);
    }
}

static void
test_capacity (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  static const struct { double factor; guint padding; } cases[] = {
    { 0.25, 0 }, { 0.5, 0 }, { 1.0, 0 }, { 1.25, 0 }, { 0.5, 16 }, { 1.0, 32 }, { 1e6, 0 }, { 1e-9, 0 },
  };
  guint i;

  if (device == NULL)
    return;
  for (i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      gint64 T = 48, c;
      guint k = 2, E = 6;
      g_autofree gint64 *idx = random_indices (T, k, E);

      /* Skewed: most choices to expert 0, so that it drops. */
      for (c = 0; c < T * k; c += 3)
        idx[c] = 0;
      check_routing (device, idx, T, k, E, 9, cases[i].padding, cases[i].factor,
                     GMLP_DTYPE_FLOAT32, GMLP_DTYPE_FLOAT16);
    }
}

/* The documented order, spelt out: ties of expert go token by token, a
 * token's choices in order. */
static void
test_stable (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  static const gint64 idx[10] = { 1, 0,  0, 1,  1, 1,  2, 0,  0, 0 };
  static const gint64 want_rows[10] = { 5, 0,  1, 6,  7, 8,  9, 2,  3, 4 };
  static const double want_tokens[10] = { 0, 1, 3, 4, 4,  0, 1, 2, 2,  3 };
  static const float x[5] = { 0, 1, 2, 3, 4 };
  g_autofree float *probs = random_probs (10);
  g_autoptr(GmlpRouting) routing = NULL;
  g_autoptr(GmlpGroupedTensor) xt = NULL, perm = NULL;
  g_autoptr(GError) error = NULL;
  g_autofree double *rows = NULL, *values = NULL;
  g_autoptr(RefMap) m = NULL;
  guint i;

  if (device == NULL)
    return;
  routing = make_routing (device, idx, probs, 5, 2, 3, NULL, NULL);
  xt = upload (device, GMLP_DTYPE_FLOAT32, x, 5, 1);
  perm = gmlp_routing_permute (routing, xt, &error);
  g_assert_no_error (error);
  rows = gmlp_test_download (routing->row_of, NULL);
  for (i = 0; i < 10; i++)
    gmlp_assert_same_value (rows[i], (double) want_rows[i], "row", i);
  m = ref_map_new (idx, 5, 2, 3, 0, 0.0);
  values = download_permuted (perm, m);
  for (i = 0; i < 10; i++)
    gmlp_assert_same_value (values[i], want_tokens[i], "permuted token", i);
  check_routing (device, idx, 5, 2, 3, 4, 0, 0.0, GMLP_DTYPE_FLOAT32, GMLP_DTYPE_FLOAT32);
}

/* permute → combine with probabilities 1/k gives the tokens back. */
static void
test_round_trip (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint d;

  if (device == NULL)
    return;
  for (d = 0; d < G_N_ELEMENTS (float_dtypes); d++)
    {
      gint64 T = g_test_rand_int_range (1, 80), H = 24, c;
      guint k = d + 1, E = 7;
      g_autofree gint64 *idx = random_indices (T, k, E);
      g_autofree float *probs = g_new (float, T * k);
      g_autoptr(GmlpRouting) routing = NULL;
      g_autoptr(GmlpGroupedTensor) x = NULL, perm = NULL, back = NULL;
      g_autofree double *xv = NULL, *got = NULL;
      g_autoptr(GError) error = NULL;

      for (c = 0; c < T * k; c++)
        probs[c] = 1.0f / k;
      routing = make_routing (device, idx, probs, T, k, E, NULL, NULL);
      x = gmlp_test_random_tensor (device, float_dtypes[d], &T, 1, H, 1.0, &xv);
      perm = gmlp_routing_permute_full (routing, x, 16, 0.0, &error);
      g_assert_no_error (error);
      back = gmlp_routing_combine (routing, perm, &error);
      g_assert_no_error (error);
      got = gmlp_test_download (back, NULL);
      gmlp_test_assert_close (got, xv, T * H, gmlp_test_tolerance (float_dtypes[d]), "round trip");
    }
}

/* The dense formulation end to end, with a GroupedLinear of one weight per
 * expert taking the permuted tensor as it is: out[t] = Σ_j p W_e x_t over
 * the kept choices, and its gradients (dx, the probabilities' and the
 * weights'). */
static void
check_moe_linear (GmlpDevice *device,
                  GmlpDType   dtype,
                  guint       padding,
                  double      capacity_factor)
{
  gint64 T = 30, H = 16, O = 8, c, h, o;
  guint k = 2, E = 5, e;
  g_autofree gint64 *idx = random_indices (T, k, E);
  g_autofree float *probs = random_probs (T * k);
  g_autoptr(GmlpRouting) routing = make_routing (device, idx, probs, T, k, E, NULL, NULL);
  g_autoptr(RefMap) m = ref_map_new (idx, T, k, E, padding, capacity_factor);
  g_autoptr(GmlpGroupedLinear) linear = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, perm = NULL, y = NULL, out = NULL, go = NULL;
  g_autoptr(GmlpGroupedTensor) grad_y = NULL, grad_probs = NULL, dperm = NULL, dx = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GBytes) wb = NULL;
  g_autoptr(GError) error = NULL;
  g_autofree double *xv = NULL, *gov = NULL, *w = NULL, *got = NULL, *want = NULL;
  g_autofree float *wf = g_new (float, E * O * H);
  double tol = 3 * gmlp_test_tolerance (dtype);

  linear = gmlp_grouped_linear_new_full (device, E, H, O, dtype, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT, &error);
  g_assert_no_error (error);
  w = g_new (double, E * O * H);
  for (c = 0; c < E * O * H; c++)
    {
      wf[c] = (float) g_test_rand_double_range (-0.5, 0.5);
      w[c] = gmlp_test_round (wf[c], dtype);
    }
  {
    g_autoptr(GmlpGroupedTensor) w32 = upload (device, GMLP_DTYPE_FLOAT32, wf, E * O, H);
    g_autoptr(GmlpGroupedTensor) wd = gmlp_grouped_tensor_convert (w32, dtype, &error);

    g_assert_no_error (error);
    wb = gmlp_grouped_tensor_to_bytes (wd, &error);
    g_assert_no_error (error);
  }
  g_assert_true (gmlp_grouped_linear_set_weight_from_bytes (linear, wb, &error));
  g_assert_no_error (error);

  x = gmlp_test_random_tensor (device, dtype, &T, 1, H, 1.0, &xv);
  perm = gmlp_routing_permute_full (routing, x, padding, capacity_factor, &error);
  g_assert_no_error (error);
  y = gmlp_grouped_linear_forward (linear, perm, &saved, &error);
  g_assert_no_error (error);
  out = gmlp_routing_combine (routing, y, &error);
  g_assert_no_error (error);

  got = gmlp_test_download (out, NULL);
  want = g_new0 (double, T * O);
  for (c = 0; c < T * k; c++)
    if (m->slot_of[c] >= 0)
      for (o = 0; o < O; o++)
        {
          double v = 0;

          for (h = 0; h < H; h++)
            v += w[(idx[c] * O + o) * H + h] * xv[(c / k) * H + h];
          want[(c / k) * O + o] += probs[c] * v;
        }
  gmlp_test_assert_close (got, want, T * O, tol, "moe forward");

  go = gmlp_test_random_tensor (device, dtype, &T, 1, O, 1.0, &gov);
  grad_y = gmlp_routing_combine_backward (routing, go, y, &grad_probs, &error);
  g_assert_no_error (error);
  dperm = gmlp_grouped_linear_backward (linear, saved, grad_y, &error);
  g_assert_no_error (error);
  dx = gmlp_routing_permute_backward (routing, dperm, &error);
  g_assert_no_error (error);

  /* dx[t] = Σ_j p W_eᵀ go[t] */
  g_free (got), g_free (want);
  got = gmlp_test_download (dx, NULL);
  want = g_new0 (double, T * H);
  for (c = 0; c < T * k; c++)
    if (m->slot_of[c] >= 0)
      for (h = 0; h < H; h++)
        for (o = 0; o < O; o++)
          want[(c / k) * H + h] += probs[c] * w[(idx[c] * O + o) * H + h] * gov[(c / k) * O + o];
  gmlp_test_assert_close (got, want, T * H, tol, "moe dx");

  /* grad_probs[t, j] = go[t] · W_e x_t */
  g_free (got), g_free (want);
  got = gmlp_test_download (grad_probs, NULL);
  want = g_new0 (double, T * k);
  for (c = 0; c < T * k; c++)
    if (m->slot_of[c] >= 0)
      for (o = 0; o < O; o++)
        for (h = 0; h < H; h++)
          want[c] += gov[(c / k) * O + o] * w[(idx[c] * O + o) * H + h] * xv[(c / k) * H + h];
  gmlp_test_assert_close (got, want, T * k, tol, "moe grad_probs");

  /* dW_e = Σ over e's kept choices of p go[t] x[t]ᵀ: padding rows add
   * nothing. */
  g_free (got), g_free (want);
  got = gmlp_test_download (gmlp_grouped_linear_get_wgrad (linear), NULL);
  want = g_new0 (double, E * O * H);
  for (c = 0; c < T * k; c++)
    if (m->slot_of[c] >= 0)
      for (o = 0; o < O; o++)
        for (h = 0; h < H; h++)
          want[(idx[c] * O + o) * H + h] += probs[c] * gov[(c / k) * O + o] * xv[(c / k) * H + h];
  for (e = 0; e < E; e++)
    gmlp_test_assert_close (got + e * O * H, want + e * O * H, O * H, tol, "moe wgrad");
}

static void
test_moe_linear (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();

  if (device == NULL)
    return;
  check_moe_linear (device, GMLP_DTYPE_FLOAT32, 0, 0.0);
  check_moe_linear (device, GMLP_DTYPE_FLOAT32, 16, 0.75);
  check_moe_linear (device, GMLP_DTYPE_BFLOAT16, 32, 0.0);
}

static void
test_out_of_range (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  gint64 T = 24, c;
  guint k = 3, E = 5;
  g_autofree gint64 *idx = NULL;

  if (device == NULL)
    return;
  idx = random_indices (T, k, E);
  for (c = 0; c < T * k; c += 2)
    idx[c] = (gint64[]) { -1, E, E + 7, G_MAXINT64, G_MININT64, -(gint64) E }[g_test_rand_int_range (0, 6)];
  /* Token 3 chose nowhere at all. */
  idx[9] = idx[10] = idx[11] = -1;
  check_routing (device, idx, T, k, E, 6, 0, 0.0, GMLP_DTYPE_FLOAT32, GMLP_DTYPE_BFLOAT16);
  check_routing (device, idx, T, k, E, 6, 16, 0.5, GMLP_DTYPE_FLOAT16, GMLP_DTYPE_FLOAT16);
}

static void
test_zero_tokens (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  static const struct { guint padding; double factor; } cases[] = { { 0, 0.0 }, { 16, 0.0 }, { 32, 1.5 } };
  gint64 idx[1] = { 0 };
  guint i;

  if (device == NULL)
    return;
  for (i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      g_autoptr(GmlpRouting) routing = NULL;
      g_autoptr(GmlpGroupedTensor) x = NULL, perm = NULL, out = NULL, dx = NULL, gy = NULL, gp = NULL;
      g_autoptr(GError) error = NULL;
      g_autofree double *counts = NULL;
      g_autofree gint64 *sizes = NULL;
      float probs[1] = { 0 };
      gint64 T = 0;
      guint n, e;

      routing = make_routing (device, idx, probs, 0, 2, 4, NULL, NULL);
      g_assert_cmpint (gmlp_routing_get_n_tokens (routing), ==, 0);
      counts = gmlp_test_download (gmlp_routing_get_tokens_per_expert (routing), NULL);
      for (e = 0; e < 4; e++)
        gmlp_assert_same_value (counts[e], 0.0, "tokens per expert", e);

      x = gmlp_grouped_tensor_new (device, GMLP_DTYPE_BFLOAT16, &T, 1, 8, &error);
      g_assert_no_error (error);
      perm = gmlp_routing_permute_full (routing, x, cases[i].padding, cases[i].factor, &error);
      g_assert_no_error (error);
      g_assert_cmpint (gmlp_grouped_tensor_get_row_capacity (perm), ==, 0);
      sizes = gmlp_grouped_tensor_read_sizes (perm, &n, &error);
      g_assert_no_error (error);
      g_assert_cmpuint (n, ==, 4);
      for (e = 0; e < 4; e++)
        g_assert_cmpint (sizes[e], ==, 0);

      out = gmlp_routing_combine (routing, perm, &error);
      g_assert_no_error (error);
      g_assert_cmpint (gmlp_grouped_tensor_get_total_rows (out), ==, 0);
      dx = gmlp_routing_permute_backward (routing, perm, &error);
      g_assert_no_error (error);
      g_assert_cmpint (gmlp_grouped_tensor_get_total_rows (dx), ==, 0);
      gy = gmlp_routing_combine_backward (routing, x, perm, &gp, &error);
      g_assert_no_error (error);
      g_assert_cmpint (gmlp_grouped_tensor_get_row_capacity (gy), ==, 0);
      g_assert_cmpint (gmlp_grouped_tensor_get_total_rows (gp), ==, 0);
      g_assert_cmpint (gmlp_grouped_tensor_get_cols (gp), ==, 2);
    }
}

/* Several threads permute one routing at once: one layout, made once. */
typedef struct {
  GmlpRouting       *routing;
  GmlpGroupedTensor *x;
  GmlpGroupedTensor *out;
} ThreadArgs;

static gpointer
permute_thread (gpointer data)
{
  ThreadArgs *a = data;
  g_autoptr(GError) error = NULL;

  a->out = gmlp_routing_permute_full (a->routing, a->x, 32, 0.0, &error);
  g_assert_no_error (error);
  return NULL;
}

static void
test_threads (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  ThreadArgs args[4];
  GThread *threads[4];
  gint64 T = 200;
  guint k = 4, E = 16, i;
  g_autofree gint64 *idx = NULL;
  g_autofree float *probs = NULL;
  g_autoptr(GmlpRouting) routing = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL;
  g_autoptr(RefMap) m = NULL;
  g_autofree double *first = NULL;

  if (device == NULL)
    return;
  idx = random_indices (T, k, E);
  probs = random_probs (T * k);
  routing = make_routing (device, idx, probs, T, k, E, NULL, NULL);
  x = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, &T, 1, 16, 1.0, NULL);
  m = ref_map_new (idx, T, k, E, 32, 0.0);
  for (i = 0; i < 4; i++)
    {
      args[i] = (ThreadArgs) { routing, x, NULL };
      threads[i] = g_thread_new ("permute", permute_thread, &args[i]);
    }
  for (i = 0; i < 4; i++)
    g_thread_join (threads[i]);
  first = download_permuted (args[0].out, m);
  for (i = 0; i < 4; i++)
    {
      g_autofree double *v = download_permuted (args[i].out, m);

      g_assert_true (gmlp_grouped_tensor_get_sizes (args[i].out, NULL) ==
                     gmlp_grouped_tensor_get_sizes (args[0].out, NULL));
      g_assert_cmpmem (v, m->total * 16 * sizeof (double), first, m->total * 16 * sizeof (double));
    }
  for (i = 0; i < 4; i++)
    g_object_unref (args[i].out);
  assert_map (routing, m);
}

int
main (int argc, char *argv[])
{
  /* Fresh memory poisoned (NaN), so that an unwritten output fails. */
  g_setenv ("GMLP_DEBUG", "poison", FALSE);
  setlocale (LC_ALL, "");
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Gmlp/Routing/random", test_random);
  g_test_add_func ("/Gmlp/Routing/top-k-16", test_top_k_16);
  g_test_add_func ("/Gmlp/Routing/empty-experts", test_empty_experts);
  g_test_add_func ("/Gmlp/Routing/one-expert", test_one_expert);
  g_test_add_func ("/Gmlp/Routing/padding", test_padding);
  g_test_add_func ("/Gmlp/Routing/capacity", test_capacity);
  g_test_add_func ("/Gmlp/Routing/stable", test_stable);
  g_test_add_func ("/Gmlp/Routing/round-trip", test_round_trip);
  g_test_add_func ("/Gmlp/Routing/moe-linear", test_moe_linear);
  g_test_add_func ("/Gmlp/Routing/out-of-range", test_out_of_range);
  g_test_add_func ("/Gmlp/Routing/zero-tokens", test_zero_tokens);
  g_test_add_func ("/Gmlp/Routing/bad-input", test_bad_input);
  g_test_add_func ("/Gmlp/Routing/backend-checks", test_backend_checks);
  g_test_add_func ("/Gmlp/Routing/threads", test_threads);
  g_test_add_func ("/Gmlp/Routing/64-bit", test_64_bit);

  return g_test_run ();
}
