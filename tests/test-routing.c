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
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <locale.h>
#include <math.h>
#include <string.h>

#include "gmlp-test-util.h"
/* Host views over tensors with device sizes; the routing's map. */
#include "gmlp-device-private.h"
#include "gmlp-grouped-tensor-private.h"
#include "gmlp-routing-private.h"

static const GmlpDType float_dtypes[] = {
  GMLP_DTYPE_FLOAT32, GMLP_DTYPE_FLOAT16, GMLP_DTYPE_BFLOAT16,
};

static GmlpGroupedTensor *
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

static float *
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
static GmlpRouting *
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

/* The map as documented, computed expert by expert (not in the library's
 * one pass): slots of each choice, choices of each slot, padded sizes. */
typedef struct {
  gint64  T;
  guint   k, E;
  gint64  padding, expert_capacity, row_capacity, total;
  gint64 *sizes;
  gint64 *slot_of;    /* T × k, -1: no row */
  gint64 *choice_of;  /* total, -1: padding */
} RefMap;

static void
ref_map_free (RefMap *m)
{
  g_free (m->sizes);
  g_free (m->slot_of);
  g_free (m->choice_of);
  g_free (m);
}
G_DEFINE_AUTOPTR_CLEANUP_FUNC (RefMap, ref_map_free)

static RefMap *
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
  m->expert_capacity = -1;
  dropless = n + MIN ((gint64) E, n) * (p - 1);
  m->row_capacity = dropless;
  if (capacity_factor > 0)
    {
      double per = ceil (capacity_factor * (double) n / E);
      gint64 cap = per >= (double) n ? n : (gint64) per;

      m->expert_capacity = (cap + p - 1) / p * p;
      m->row_capacity = MIN (dropless, m->expert_capacity * (gint64) E);
    }

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
static double *
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
static void
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
static GmlpGroupedTensor *
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

static GmlpGroupedTensor *
random_permuted (GmlpGroupedTensor *like,
                 GmlpDType          dtype,
                 gint64             cols,
                 guint64            seed)
{
  return random_permuted_full (like, dtype, cols, seed, FALSE);
}

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
static void
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

static gint64 *
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

static void
assert_refused (gpointer     result,
                GError      *error,
                int          code,
                const char  *what)
{
  if (result != NULL || error == NULL || !g_error_matches (error, GMLP_ERROR, code))
    g_error ("%s: expected error %d, got %s", what, code, error != NULL ? error->message : "success");
  if (result != NULL)
    g_object_unref (result);
}

static void
test_bad_input (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpDevice) cpu = gmlp_device_new (GMLP_DEVICE_KIND_CPU, 0, NULL);
  gint64 T = 6, k = 2, idx[12] = { 0, 1, 2, 3, 0, 0, 1, 1, 2, 2, 3, 3 }, twelve = 12;
  gint64 rows2[2] = { 3, 3 }, four = 4, zeros[17 * 6] = { 0 };
  float probs[12] = { 0 };
  g_autoptr(GmlpGroupedTensor) indices = NULL, probs_t = NULL, x = NULL;
  g_autoptr(GmlpRouting) routing = NULL;
  GError *error = NULL;
  GmlpGroupedTensor *t;
  gpointer r;
  guint i;

#define CHECK(call, code) \
  G_STMT_START { \
    r = (call); \
    assert_refused (r, error, (code), #call); \
    g_clear_error (&error); \
  } G_STMT_END

  if (device == NULL)
    return;

  /* Everything on the CPU; on a GPU host the GPU's tensors are foreign. */
  indices = upload (cpu, GMLP_DTYPE_INT64, idx, T, k);
  probs_t = upload (cpu, GMLP_DTYPE_FLOAT32, probs, T, k);
  x = gmlp_test_random_tensor (cpu, GMLP_DTYPE_FLOAT32, &T, 1, 8, 1.0, NULL);

  /* gmlp_routing_new */
  {
    g_autoptr(GmlpGroupedTensor) f32 = upload (cpu, GMLP_DTYPE_FLOAT32, probs, T, k);
    g_autoptr(GmlpGroupedTensor) i32 = gmlp_grouped_tensor_new (cpu, GMLP_DTYPE_INT32, &T, 1, k, NULL);
    g_autoptr(GmlpGroupedTensor) p16 = gmlp_grouped_tensor_convert (probs_t, GMLP_DTYPE_FLOAT16, NULL);
    g_autoptr(GmlpGroupedTensor) short_p = upload (cpu, GMLP_DTYPE_FLOAT32, probs, T - 1, k);
    g_autoptr(GmlpGroupedTensor) wide_p = upload (cpu, GMLP_DTYPE_FLOAT32, zeros, T, k + 1);
    g_autoptr(GmlpGroupedTensor) two = gmlp_grouped_tensor_new (cpu, GMLP_DTYPE_INT64, rows2, 2, k, NULL);
    g_autoptr(GmlpGroupedTensor) k17 = upload (cpu, GMLP_DTYPE_INT64, zeros, 6, 17);
    g_autoptr(GmlpGroupedTensor) p17 = upload (cpu, GMLP_DTYPE_FLOAT32, zeros, 6, 17);
    g_autoptr(GmlpGroupedTensor) k0 = gmlp_grouped_tensor_new (cpu, GMLP_DTYPE_INT64, &T, 1, 0, NULL);
    g_autoptr(GmlpGroupedTensor) sizes = upload (cpu, GMLP_DTYPE_INT64, (gint64[]) { 6 }, 1, 1);
    g_autoptr(GmlpGroupedTensor) dev_sized = gmlp_grouped_tensor_new_with_device_sizes (cpu, GMLP_DTYPE_INT64,
                                                                                         sizes, 6, k, NULL);
    g_autoptr(GmlpGroupedTensor) bare = g_object_new (GMLP_TYPE_GROUPED_TENSOR, NULL);

    CHECK (gmlp_routing_new (cpu, f32, probs_t, 4, &error), GMLP_ERROR_DTYPE_MISMATCH);
    CHECK (gmlp_routing_new (cpu, i32, probs_t, 4, &error), GMLP_ERROR_DTYPE_MISMATCH);
    CHECK (gmlp_routing_new (cpu, indices, p16, 4, &error), GMLP_ERROR_DTYPE_MISMATCH);
    CHECK (gmlp_routing_new (cpu, indices, indices, 4, &error), GMLP_ERROR_DTYPE_MISMATCH);
    CHECK (gmlp_routing_new (cpu, indices, short_p, 4, &error), GMLP_ERROR_SHAPE_MISMATCH);
    CHECK (gmlp_routing_new (cpu, indices, wide_p, 4, &error), GMLP_ERROR_SHAPE_MISMATCH);
    CHECK (gmlp_routing_new (cpu, two, probs_t, 4, &error), GMLP_ERROR_SHAPE_MISMATCH);
    CHECK (gmlp_routing_new (cpu, dev_sized, probs_t, 4, &error), GMLP_ERROR_SHAPE_MISMATCH);
    CHECK (gmlp_routing_new (cpu, k17, p17, 4, &error), GMLP_ERROR_INVALID_ARGUMENT);
    if (k0 != NULL)
      CHECK (gmlp_routing_new (cpu, k0, k0, 4, &error), GMLP_ERROR_INVALID_ARGUMENT);
    CHECK (gmlp_routing_new (cpu, indices, probs_t, 0, &error), GMLP_ERROR_INVALID_ARGUMENT);
    CHECK (gmlp_routing_new (cpu, indices, probs_t, 65536, &error), GMLP_ERROR_INVALID_ARGUMENT);
    r = gmlp_routing_new (cpu, bare, probs_t, 4, &error);
    g_assert_null (r);
    g_assert_nonnull (error);
    g_clear_error (&error);
    r = gmlp_routing_new (cpu, indices, bare, 4, &error);
    g_assert_null (r);
    g_assert_nonnull (error);
    g_clear_error (&error);
  }

  routing = gmlp_routing_new (cpu, indices, probs_t, 4, &error);
  g_assert_no_error (error);

  /* Bare routing */
  {
    g_autoptr(GmlpRouting) bare = g_object_new (GMLP_TYPE_ROUTING, NULL);

    g_assert_null (gmlp_routing_get_device (bare));
    g_assert_null (gmlp_routing_get_indices (bare));
    CHECK (gmlp_routing_permute (bare, x, &error), GMLP_ERROR_INVALID_STATE);
    CHECK (gmlp_routing_combine (bare, x, &error), GMLP_ERROR_INVALID_STATE);
    CHECK (gmlp_routing_permute_backward (bare, x, &error), GMLP_ERROR_INVALID_STATE);
    CHECK (gmlp_routing_combine_backward (bare, x, x, NULL, &error), GMLP_ERROR_INVALID_STATE);
  }

  /* Combine and the backwards before any permute. */
  CHECK (gmlp_routing_combine (routing, x, &error), GMLP_ERROR_INVALID_STATE);
  CHECK (gmlp_routing_permute_backward (routing, x, &error), GMLP_ERROR_INVALID_STATE);
  CHECK (gmlp_routing_combine_backward (routing, x, x, NULL, &error), GMLP_ERROR_INVALID_STATE);

  /* Permute's arguments; none of these makes the layout. */
  {
    g_autoptr(GmlpGroupedTensor) short_x = gmlp_test_random_tensor (cpu, GMLP_DTYPE_FLOAT32, &four, 1, 8, 1.0, NULL);
    g_autoptr(GmlpGroupedTensor) x2 = gmlp_test_random_tensor (cpu, GMLP_DTYPE_FLOAT32, rows2, 2, 8, 1.0, NULL);
    g_autoptr(GmlpGroupedTensor) xi = gmlp_grouped_tensor_new (cpu, GMLP_DTYPE_INT64, &T, 1, 8, NULL);
    g_autoptr(GmlpGroupedTensor) x8 = gmlp_grouped_tensor_convert (x, GMLP_DTYPE_FLOAT8_E4M3, NULL);
    static const guint bad_padding[] = { 3, 48, 256, 1u << 31, G_MAXUINT };
    static const double bad_factor[] = { -1.0, -1e-300, NAN, INFINITY, -INFINITY };

    CHECK (gmlp_routing_permute (routing, short_x, &error), GMLP_ERROR_SHAPE_MISMATCH);
    CHECK (gmlp_routing_permute (routing, x2, &error), GMLP_ERROR_SHAPE_MISMATCH);
    CHECK (gmlp_routing_permute (routing, xi, &error), GMLP_ERROR_DTYPE_MISMATCH);
    if (x8 != NULL)
      CHECK (gmlp_routing_permute (routing, x8, &error), GMLP_ERROR_DTYPE_MISMATCH);
    for (i = 0; i < G_N_ELEMENTS (bad_padding); i++)
      CHECK (gmlp_routing_permute_full (routing, x, bad_padding[i], 0.0, &error), GMLP_ERROR_INVALID_ARGUMENT);
    for (i = 0; i < G_N_ELEMENTS (bad_factor); i++)
      CHECK (gmlp_routing_permute_full (routing, x, 16, bad_factor[i], &error), GMLP_ERROR_INVALID_ARGUMENT);
    g_assert_null (routing->sizes);
  }

  /* One layout per routing: padding 16 first; 0 and 1 are the same. */
  {
    g_autoptr(GmlpGroupedTensor) perm = gmlp_routing_permute_full (routing, x, 16, 0.0, &error);
    g_autoptr(GmlpGroupedTensor) again = NULL, host = NULL, other_cap = NULL, ints = NULL;
    g_autoptr(GmlpGroupedTensor) go = gmlp_test_random_tensor (cpu, GMLP_DTYPE_FLOAT32, &T, 1, 8, 1.0, NULL);
    g_autoptr(GmlpGroupedTensor) go_short = gmlp_test_random_tensor (cpu, GMLP_DTYPE_FLOAT32, &four, 1, 8, 1.0, NULL);
    g_autoptr(GmlpGroupedTensor) go_wide = gmlp_test_random_tensor (cpu, GMLP_DTYPE_FLOAT32, &T, 1, 9, 1.0, NULL);
    g_autoptr(GmlpRouting) other = NULL, unpadded = NULL;
    g_autoptr(GmlpGroupedTensor) other_perm = NULL, p0 = NULL, p1 = NULL;
    GmlpGroupedTensor *sizes;

    g_assert_no_error (error);
    CHECK (gmlp_routing_permute_full (routing, x, 32, 0.0, &error), GMLP_ERROR_INVALID_STATE);
    CHECK (gmlp_routing_permute_full (routing, x, 16, 1.0, &error), GMLP_ERROR_INVALID_STATE);
    CHECK (gmlp_routing_permute (routing, x, &error), GMLP_ERROR_INVALID_STATE);
    again = gmlp_routing_permute_full (routing, x, 16, 0.0, &error);
    g_assert_no_error (error);
    g_assert_true (gmlp_grouped_tensor_get_sizes (again, NULL) == gmlp_grouped_tensor_get_sizes (perm, NULL));

    unpadded = gmlp_routing_new (cpu, indices, probs_t, 4, &error);
    g_assert_no_error (error);
    p0 = gmlp_routing_permute_full (unpadded, x, 0, 0.0, &error);
    g_assert_no_error (error);
    p1 = gmlp_routing_permute_full (unpadded, x, 1, 0.0, &error);
    g_assert_no_error (error);

    /* Tensors not in this routing's layout. */
    host = gmlp_test_random_tensor (cpu, GMLP_DTYPE_FLOAT32, &twelve, 1, 8, 1.0, NULL);
    CHECK (gmlp_routing_combine (routing, host, &error), GMLP_ERROR_INVALID_ARGUMENT);
    CHECK (gmlp_routing_combine (routing, x, &error), GMLP_ERROR_INVALID_ARGUMENT);
    CHECK (gmlp_routing_permute_backward (routing, host, &error), GMLP_ERROR_INVALID_ARGUMENT);
    CHECK (gmlp_routing_combine (routing, p0, &error), GMLP_ERROR_INVALID_ARGUMENT);
    CHECK (gmlp_routing_combine (unpadded, perm, &error), GMLP_ERROR_INVALID_ARGUMENT);
    other = gmlp_routing_new (cpu, indices, probs_t, 4, &error);
    other_perm = gmlp_routing_permute_full (other, x, 16, 0.0, &error);
    g_assert_no_error (error);
    CHECK (gmlp_routing_combine (routing, other_perm, &error), GMLP_ERROR_INVALID_ARGUMENT);
    CHECK (gmlp_routing_combine_backward (routing, go, other_perm, NULL, &error), GMLP_ERROR_INVALID_ARGUMENT);
    sizes = gmlp_grouped_tensor_get_sizes (perm, NULL);
    other_cap = gmlp_grouped_tensor_new_with_device_sizes (cpu, GMLP_DTYPE_FLOAT32, sizes,
                                                           gmlp_grouped_tensor_get_row_capacity (perm) + 1, 8, NULL);
    CHECK (gmlp_routing_combine (routing, other_cap, &error), GMLP_ERROR_INVALID_ARGUMENT);
    ints = gmlp_grouped_tensor_new_with_device_sizes (cpu, GMLP_DTYPE_INT32, sizes,
                                                      gmlp_grouped_tensor_get_row_capacity (perm), 8, NULL);
    CHECK (gmlp_routing_combine (routing, ints, &error), GMLP_ERROR_DTYPE_MISMATCH);
    /* The permute backward's addend: FP32, T × the gradient's columns. */
    CHECK (gmlp_routing_permute_backward_add (routing, perm, go_short, &error), GMLP_ERROR_SHAPE_MISMATCH);
    CHECK (gmlp_routing_permute_backward_add (routing, perm, go_wide, &error), GMLP_ERROR_SHAPE_MISMATCH);
    CHECK (gmlp_routing_permute_backward_add (routing, perm, ints, &error), GMLP_ERROR_DTYPE_MISMATCH);

    /* combine_backward's shapes */
    CHECK (gmlp_routing_combine_backward (routing, go_short, perm, NULL, &error), GMLP_ERROR_SHAPE_MISMATCH);
    CHECK (gmlp_routing_combine_backward (routing, go_wide, perm, NULL, &error), GMLP_ERROR_SHAPE_MISMATCH);
    CHECK (gmlp_routing_combine_backward (routing, perm, perm, NULL, &error), GMLP_ERROR_SHAPE_MISMATCH);

    /* Foreign tensors, where there is another device. */
    if (gmlp_device_get_kind (device) != GMLP_DEVICE_KIND_CPU)
      {
        g_autoptr(GmlpGroupedTensor) gx = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, &T, 1, 8, 1.0, NULL);
        g_autoptr(GmlpGroupedTensor) gi = upload (device, GMLP_DTYPE_INT64, idx, T, k);
        g_autoptr(GmlpGroupedTensor) gp = upload (device, GMLP_DTYPE_FLOAT32, probs, T, k);

        CHECK (gmlp_routing_new (cpu, gi, probs_t, 4, &error), GMLP_ERROR_INVALID_ARGUMENT);
        CHECK (gmlp_routing_new (cpu, indices, gp, 4, &error), GMLP_ERROR_INVALID_ARGUMENT);
        CHECK (gmlp_routing_permute_full (routing, gx, 16, 0.0, &error), GMLP_ERROR_INVALID_ARGUMENT);
        CHECK (gmlp_routing_combine (routing, gx, &error), GMLP_ERROR_INVALID_ARGUMENT);
        CHECK (gmlp_routing_combine_backward (routing, gx, perm, NULL, &error), GMLP_ERROR_INVALID_ARGUMENT);
      }

    /* Writes the routing did not expect: the layout's sizes, then its
     * probabilities, then its indices. */
    g_assert_true (gmlp_grouped_tensor_fill_zero (sizes, &error));
    CHECK (gmlp_routing_combine (routing, perm, &error), GMLP_ERROR_INVALID_STATE);
    CHECK (gmlp_routing_permute_full (routing, x, 16, 0.0, &error), GMLP_ERROR_INVALID_STATE);
    t = gmlp_routing_combine (unpadded, p1, &error);
    g_assert_no_error (error);
    g_object_unref (t);
    g_assert_true (gmlp_grouped_tensor_fill_zero (probs_t, &error));
    CHECK (gmlp_routing_combine (unpadded, p1, &error), GMLP_ERROR_INVALID_STATE);
  }
  {
    g_autoptr(GmlpGroupedTensor) i2 = upload (cpu, GMLP_DTYPE_INT64, idx, T, k);
    g_autoptr(GmlpGroupedTensor) p2 = upload (cpu, GMLP_DTYPE_FLOAT32, probs, T, k);
    g_autoptr(GmlpRouting) fresh = gmlp_routing_new (cpu, i2, p2, 4, &error);

    g_assert_no_error (error);
    g_assert_true (gmlp_grouped_tensor_fill_zero (i2, &error));
    CHECK (gmlp_routing_permute (fresh, x, &error), GMLP_ERROR_INVALID_STATE);
  }
#undef CHECK
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

/* The backend entries themselves refuse bad arguments with a GError, the
 * same on every backend, before they enqueue anything. */
static void
test_backend_checks (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpGroupedTensor) idx = NULL, sizes = NULL, row_of = NULL, choice_of = NULL, out = NULL;
  gint64 rows = 8, expert_sizes[2] = { 2, 0 }, zeros[8] = { 0 };
  GmlpBackendRoutingMap map, bad_map;
  GmlpBackendPermute p, bad;
  GError *error = NULL;
  guint i;

  if (device == NULL)
    return;
  idx = upload (device, GMLP_DTYPE_INT64, zeros, 4, 2);
  sizes = gmlp_test_sizes_tensor (device, expert_sizes, 2);
  row_of = gmlp_grouped_tensor_new (device, GMLP_DTYPE_INT64, &rows, 1, 1, &error);
  choice_of = gmlp_grouped_tensor_new (device, GMLP_DTYPE_INT64, &rows, 1, 1, &error);
  out = gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, &rows, 1, 4, &error);
  g_assert_no_error (error);

  map = (GmlpBackendRoutingMap) {
    .n_tokens = 4, .top_k = 2, .n_experts = 2, .indices = gmlp_grouped_tensor_get_data (idx),
    .padding = 1, .expert_capacity = -1, .row_capacity = 8,
    .sizes = gmlp_grouped_tensor_get_data (sizes), .row_of = gmlp_grouped_tensor_get_data (row_of),
    .choice_of = gmlp_grouped_tensor_get_data (choice_of),
  };
  for (i = 0; i < 7; i++)
    {
      bad_map = map;
      switch (i)
        {
        case 0: bad_map.padding = 0; break;
        case 1: bad_map.top_k = 17; break;
        case 2: bad_map.n_experts = 0; break;
        case 3: bad_map.n_tokens = -1; break;
        case 4: bad_map.expert_capacity = -2; break;
        case 5: bad_map.choice_of = NULL; break;
        default: bad_map.indices = NULL; break;
        }
      g_assert_false (GMLP_DEVICE_CALL (device, routing_map, &bad_map, &error));
      g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
      g_clear_error (&error);
    }

  p = (GmlpBackendPermute) {
    .kind = GMLP_PERMUTE_FORWARD,
    .shape = { gmlp_grouped_tensor_get_data (sizes), 1, 4, 8 },
    .n_tokens = 4, .top_k = 2,
    .row_of = gmlp_grouped_tensor_get_data (row_of),
    .choice_of = gmlp_grouped_tensor_get_data (choice_of),
    .tokens = gmlp_grouped_tensor_get_data (out), .tokens_dtype = GMLP_DTYPE_FLOAT32,
    .out = gmlp_grouped_tensor_get_data (out), .out_dtype = GMLP_DTYPE_FLOAT32,
  };
  for (i = 0; i < 9; i++)
    {
      bad = p;
      switch (i)
        {
        case 0: bad.kind = (GmlpPermuteKind) 4; break;
        case 1: bad.shape.cols = 0; break;
        case 2: bad.shape.n_groups = 0; break;
        case 3: bad.out_dtype = GMLP_DTYPE_INT64; break;
        case 4: bad.tokens_dtype = GMLP_DTYPE_FLOAT8_E4M3; break;
        case 5: bad.choice_of = NULL; break;
        case 6: bad.kind = GMLP_PERMUTE_COMBINE; break;   /* no probs, no permuted input */
        case 7: bad.addend = gmlp_grouped_tensor_get_data (out); break;   /* only BACKWARD's */
        default: bad.top_k = 0; break;
        }
      g_assert_false (GMLP_DEVICE_CALL (device, permute, &bad, &error));
      g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
      g_clear_error (&error);
    }
}

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
static void
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
