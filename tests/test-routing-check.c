/* test-routing-check.c: one routing's steps against the reference
 *
 * Counts, permute, combine and both backwards of a routing, each against
 * its float64 reference; on a GPU also against the CPU backend's run
 * from the same inputs (see test-routing.c).
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "test-routing.h"

/* A copy of a tensor with host sizes on another device. */
static GmlpGroupedTensor *
copy_to (GmlpDevice        *device,
         GmlpGroupedTensor *t)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GBytes) bytes = gmlp_grouped_tensor_to_bytes (t, &error);
  guint n = gmlp_grouped_tensor_get_n_groups (t), g;
  g_autofree gint64 *rows = g_new (gint64, n);
  GmlpGroupedTensor *copy;

  g_assert_no_error (error);
  for (g = 0; g < n; g++)
    rows[g] = gmlp_grouped_tensor_get_rows (t, g);
  copy = gmlp_grouped_tensor_new_from_bytes (device, gmlp_grouped_tensor_get_dtype (t), rows, n,
                                             gmlp_grouped_tensor_get_cols (t), bytes, &error);
  g_assert_no_error (error);
  return copy;
}

/* One routing's permute, combine and backwards on one device, from inputs
 * that another device can repeat: x, grad_out and the permute backward's
 * FP32 addend given, the permuted inputs (y, and g for the permute's
 * backward) from seeds. */
typedef struct {
  GmlpRouting       *routing;
  GmlpGroupedTensor *perm, *y, *out, *g, *dx, *dx_add, *grad_y, *grad_probs;
} RoutingRun;

static void
routing_run_clear (RoutingRun *run)
{
  g_clear_object (&run->routing);
  g_clear_object (&run->perm);
  g_clear_object (&run->y);
  g_clear_object (&run->out);
  g_clear_object (&run->g);
  g_clear_object (&run->dx);
  g_clear_object (&run->dx_add);
  g_clear_object (&run->grad_y);
  g_clear_object (&run->grad_probs);
}
G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (RoutingRun, routing_run_clear)

/* What a run repeats on another device. */
typedef struct {
  const gint64 *idx;
  const float  *probs;
  gint64        T;
  guint         k, E, padding;
  double        capacity_factor;
  guint64       y_seed, g_seed;
} RoutingCase;

static void
routing_run (RoutingRun        *run,
             GmlpDevice        *device,
             const RoutingCase *rc,
             GmlpGroupedTensor *x,
             GmlpGroupedTensor *go,
             GmlpGroupedTensor *addend)
{
  g_autoptr(GError) error = NULL;

  run->routing = make_routing (device, rc->idx, rc->probs, rc->T, rc->k, rc->E, NULL, NULL);
  run->perm = gmlp_routing_permute_full (run->routing, x, rc->padding, rc->capacity_factor, &error);
  g_assert_no_error (error);
  run->y = random_permuted (run->perm, gmlp_grouped_tensor_get_dtype (go), gmlp_grouped_tensor_get_cols (go),
                            rc->y_seed);
  run->out = gmlp_routing_combine (run->routing, run->y, &error);
  g_assert_no_error (error);
  run->g = random_permuted (run->perm, gmlp_grouped_tensor_get_dtype (x), gmlp_grouped_tensor_get_cols (x),
                            rc->g_seed);
  run->dx = gmlp_routing_permute_backward (run->routing, run->g, &error);
  g_assert_no_error (error);
  run->dx_add = gmlp_routing_permute_backward_add (run->routing, run->g, addend, &error);
  g_assert_no_error (error);
  run->grad_y = gmlp_routing_combine_backward (run->routing, go, run->y, &run->grad_probs, &error);
  g_assert_no_error (error);
  g_assert_nonnull (run->grad_probs);
}

/* A GPU's run against the CPU backend's from the same inputs: the map and
 * every row bit for bit (the sums go in the order of the choices on
 * both), grad_probs within FP32 rounding (its dot products are summed in
 * another order). */
static void
assert_same_as_cpu (const RoutingRun  *run,
                    const RoutingCase *rc,
                    GmlpGroupedTensor *x,
                    GmlpGroupedTensor *go,
                    GmlpGroupedTensor *addend)
{
  g_autoptr(GmlpDevice) cpu = gmlp_device_new (GMLP_DEVICE_KIND_CPU, 0, NULL);
  g_autoptr(GmlpGroupedTensor) x_cpu = copy_to (cpu, x), go_cpu = copy_to (cpu, go);
  g_autoptr(GmlpGroupedTensor) addend_cpu = copy_to (cpu, addend);
  g_auto(RoutingRun) ref = { 0 };
  g_autofree double *got = NULL, *want = NULL;
  gsize n, n_want;

  routing_run (&ref, cpu, rc, x_cpu, go_cpu, addend_cpu);
  gmlp_test_assert_same_packed (gmlp_routing_get_tokens_per_expert (run->routing),
                                gmlp_routing_get_tokens_per_expert (ref.routing), "tokens per expert (CPU)");
  gmlp_test_assert_same_packed (run->routing->sizes, ref.routing->sizes, "sizes (CPU)");
  gmlp_test_assert_same_packed (run->routing->row_of, ref.routing->row_of, "row_of (CPU)");
  gmlp_test_assert_same_packed (run->routing->choice_of, ref.routing->choice_of, "choice_of (CPU)");
  gmlp_test_assert_same_packed (run->perm, ref.perm, "permute (CPU)");
  gmlp_test_assert_same_packed (run->y, ref.y, "random y (CPU)");
  gmlp_test_assert_same_packed (run->out, ref.out, "combine (CPU)");
  gmlp_test_assert_same_packed (run->g, ref.g, "random g (CPU)");
  gmlp_test_assert_same_packed (run->dx, ref.dx, "permute backward (CPU)");
  gmlp_test_assert_same_packed (run->dx_add, ref.dx_add, "permute backward with an addend (CPU)");
  gmlp_test_assert_same_packed (run->grad_y, ref.grad_y, "grad_y (CPU)");
  got = gmlp_test_download (run->grad_probs, &n);
  want = gmlp_test_download (ref.grad_probs, &n_want);
  g_assert_cmpuint (n, ==, n_want);
  gmlp_test_assert_close (got, want, n, 1e-5, "grad_probs (CPU)");
}

static void
assert_token_zero (const double *got,
                   gint64        t,
                   gint64        cols,
                   const char   *what)
{
  gint64 h;

  for (h = 0; h < cols; h++)
    gmlp_assert_same_value (got[t * cols + h], 0.0, what, t * cols + h);
}

/* Counts, permute, combine and both backwards of one routing, each against
 * its reference; x in @dtype, the experts' side in @y_dtype. */
void
check_routing (GmlpDevice   *device,
               const gint64 *idx,
               gint64        T,
               guint         k,
               guint         E,
               gint64        H,
               guint         padding,
               double        capacity_factor,
               GmlpDType     dtype,
               GmlpDType     y_dtype)
{
  g_autofree float *probs = random_probs (T * k);
  g_autoptr(RefMap) m = ref_map_new (idx, T, k, E, padding, capacity_factor);
  g_autoptr(GmlpGroupedTensor) x = NULL, go = NULL, addend = NULL;
  g_auto(RoutingRun) run = { 0 };
  g_autofree double *av = NULL, *dxav = NULL;
  g_autofree double *xv = NULL, *pv = NULL, *counts = NULL, *yv = NULL, *outv = NULL;
  g_autofree double *gv = NULL, *dxv = NULL, *gov = NULL, *gyv = NULL, *gpv = NULL;
  g_autofree double *want = NULL, *want_gp = NULL;
  RoutingCase rc = { idx, probs, T, k, E, padding, capacity_factor, g_test_rand_int (), g_test_rand_int () };
  gint64 H2 = H + 3, c, s, h, t;
  guint e;

  x = gmlp_test_random_tensor (device, dtype, &T, 1, H, 1.0, &xv);
  go = gmlp_test_random_tensor (device, y_dtype, &T, 1, H2, 1.0, &gov);
  addend = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, &T, 1, H, 1.0, &av);
  routing_run (&run, device, &rc, x, go, addend);

  /* Tokens per expert: every choice in range, before drops. */
  counts = gmlp_test_download (gmlp_routing_get_tokens_per_expert (run.routing), NULL);
  for (e = 0; e < E; e++)
    {
      gint64 n = 0;

      for (c = 0; c < T * k; c++)
        n += idx[c] == (gint64) e;
      gmlp_assert_same_value (counts[e], (double) n, "tokens per expert", e);
    }

  /* Permute: each kept choice's token, padding rows zero. */
  g_assert_cmpint (gmlp_grouped_tensor_get_dtype (run.perm), ==, dtype);
  g_assert_cmpint (gmlp_grouped_tensor_get_cols (run.perm), ==, H);
  pv = download_permuted (run.perm, m);
  assert_map (run.routing, m);
  for (s = 0; s < m->total; s++)
    for (h = 0; h < H; h++)
      {
        c = m->choice_of[s];
        gmlp_assert_same_value (pv[s * H + h], c < 0 ? 0.0 : xv[(c / k) * H + h], "permuted", s * H + h);
      }

  /* Combine: out[t] = Σ_j p y[row], kept choices only; y's padding rows
   * are random and must not count. */
  yv = download_permuted (run.y, m);
  g_assert_cmpint (gmlp_grouped_tensor_get_dtype (run.out), ==, y_dtype);
  g_assert_cmpint (gmlp_grouped_tensor_get_total_rows (run.out), ==, T);
  g_assert_cmpint (gmlp_grouped_tensor_get_cols (run.out), ==, H2);
  outv = gmlp_test_download (run.out, NULL);
  want = g_new0 (double, MAX (T * H2, 1));
  for (c = 0; c < T * k; c++)
    if (m->slot_of[c] >= 0)
      for (h = 0; h < H2; h++)
        want[(c / k) * H2 + h] += (double) probs[c] * yv[m->slot_of[c] * H2 + h];
  gmlp_test_assert_close (outv, want, T * H2, gmlp_test_tolerance (y_dtype), "combine");
  for (t = 0; t < T; t++)
    {
      gboolean any = FALSE;
      guint j;

      for (j = 0; j < k; j++)
        any |= m->slot_of[t * k + j] >= 0;
      if (!any)
        assert_token_zero (outv, t, H2, "combine of a token with no row");
    }

  /* Permute backward: dx[t] = Σ_j g[row]. */
  gv = download_permuted (run.g, m);
  g_assert_cmpint (gmlp_grouped_tensor_get_dtype (run.dx), ==, dtype);
  dxv = gmlp_test_download (run.dx, NULL);
  g_free (want);
  want = g_new0 (double, MAX (T * H, 1));
  for (c = 0; c < T * k; c++)
    if (m->slot_of[c] >= 0)
      for (h = 0; h < H; h++)
        want[(c / k) * H + h] += gv[m->slot_of[c] * H + h];
  gmlp_test_assert_close (dxv, want, T * H, gmlp_test_tolerance (dtype), "permute backward");

  /* With an addend: dx[t] + a[t], rounded once: the FP32 sum of the rows
   * in the order of the choices, plus a, then one rounding to dx's dtype,
   * which is what the test computes here too (the float64 sum within the
   * dtype's tolerance besides). */
  g_assert_cmpint (gmlp_grouped_tensor_get_dtype (run.dx_add), ==, dtype);
  dxav = gmlp_test_download (run.dx_add, NULL);
  for (t = 0; t < T; t++)
    for (h = 0; h < H; h++)
      {
        volatile float acc = 0.0f;
        guint j;

        for (j = 0; j < k; j++)
          if (m->slot_of[t * k + j] >= 0)
            acc = acc + (float) gv[m->slot_of[t * k + j] * H + h];
        acc = acc + (float) av[t * H + h];
        gmlp_assert_same_value (dxav[t * H + h], gmlp_test_round (acc, dtype), "permute backward with an addend",
                                t * H + h);
        want[t * H + h] += av[t * H + h];
      }
  gmlp_test_assert_close (dxav, want, T * H, gmlp_test_tolerance (dtype), "permute backward with an addend");

  /* Combine backward: grad_y[row] = p grad_out[t] (padding rows zero),
   * grad_probs = grad_out[t] · y[row] (zero with no row). */
  g_assert_cmpint (gmlp_grouped_tensor_get_dtype (run.grad_y), ==, y_dtype);
  g_assert_cmpint (gmlp_grouped_tensor_get_dtype (run.grad_probs), ==, GMLP_DTYPE_FLOAT32);
  g_assert_cmpint (gmlp_grouped_tensor_get_total_rows (run.grad_probs), ==, T);
  g_assert_cmpint (gmlp_grouped_tensor_get_cols (run.grad_probs), ==, k);
  gyv = download_permuted (run.grad_y, m);
  g_free (want);
  want = g_new0 (double, MAX (m->total * H2, 1));
  for (s = 0; s < m->total; s++)
    {
      c = m->choice_of[s];
      for (h = 0; h < H2; h++)
        {
          if (c < 0)
            gmlp_assert_same_value (gyv[s * H2 + h], 0.0, "grad_y padding row", s * H2 + h);
          else
            want[s * H2 + h] = (double) probs[c] * gov[(c / k) * H2 + h];
        }
    }
  gmlp_test_assert_close (gyv, want, m->total * H2, gmlp_test_tolerance (y_dtype), "grad_y");
  gpv = gmlp_test_download (run.grad_probs, NULL);
  want_gp = g_new0 (double, MAX (T * k, 1));
  for (c = 0; c < T * k; c++)
    {
      if (m->slot_of[c] < 0)
        {
          gmlp_assert_same_value (gpv[c], 0.0, "grad_probs of a choice with no row", c);
          continue;
        }
      for (h = 0; h < H2; h++)
        want_gp[c] += gov[(c / k) * H2 + h] * yv[m->slot_of[c] * H2 + h];
    }
  gmlp_test_assert_close (gpv, want_gp, T * k, gmlp_test_tolerance (GMLP_DTYPE_FLOAT32), "grad_probs");

  if (gmlp_device_get_kind (device) != GMLP_DEVICE_KIND_CPU)
    assert_same_as_cpu (&run, &rc, x, go, addend);
}
