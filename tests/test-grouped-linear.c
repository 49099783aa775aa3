/* test-grouped-linear.c: GroupedLinear against float64 references
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <math.h>
#include <string.h>

#include "gmlp-test-util.h"

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
} Problem;

static void
problem_free (Problem *p)
{
  g_free (p->rows);
  g_free (p->x); g_free (p->w); g_free (p->b); g_free (p->dy);
  g_free (p->y); g_free (p->dx); g_free (p->dw); g_free (p->db);
  g_free (p);
}
G_DEFINE_AUTOPTR_CLEANUP_FUNC (Problem, problem_free)

static void
problem_reference (Problem *p)
{
  gint64 r0 = 0;
  guint g;

  p->y = g_new0 (double, MAX (p->total * p->o, 1));
  p->dx = g_new0 (double, MAX (p->total * p->k, 1));
  p->dw = g_new0 (double, p->n * p->o * p->k);
  p->db = g_new0 (double, p->n * p->o);

  for (g = 0; g < p->n; g++)
    {
      const double *w = p->w + g * p->o * p->k;
      gint64 r, j, c;

      for (r = r0; r < r0 + p->rows[g]; r++)
        for (j = 0; j < p->o; j++)
          {
            double acc = p->b != NULL ? p->b[g * p->o + j] : 0.0;
            for (c = 0; c < p->k; c++)
              acc += p->x[r * p->k + c] * w[j * p->k + c];
            p->y[r * p->o + j] = acc;
          }
      for (r = r0; r < r0 + p->rows[g]; r++)
        for (c = 0; c < p->k; c++)
          {
            double acc = 0.0;
            for (j = 0; j < p->o; j++)
              acc += p->dy[r * p->o + j] * w[j * p->k + c];
            p->dx[r * p->k + c] = acc;
          }
      for (j = 0; j < p->o; j++)
        {
          for (c = 0; c < p->k; c++)
            {
              double acc = 0.0;
              for (r = r0; r < r0 + p->rows[g]; r++)
                acc += p->dy[r * p->o + j] * p->x[r * p->k + c];
              p->dw[(g * p->o + j) * p->k + c] = acc;
            }
          for (r = r0; r < r0 + p->rows[g]; r++)
            p->db[g * p->o + j] += p->dy[r * p->o + j];
        }
      r0 += p->rows[g];
    }
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
    check_per_group (gmlp_grouped_linear_get_bgrad (layer), p->db, p, p->o, tol, "dbias");
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
          gmlp_test_assert_close (got + (c->single ? g * wlen : 0), dw, wlen, 2e-5, name);
        }
      if (bgrad != NULL)
        {
          GmlpGroupedTensor *t = c->single ? bgrad : gmlp_grouped_linear_get_bgrad_member (layer, g);
          g_autofree double *got = gmlp_test_download (t, NULL);
          gmlp_test_assert_close (got + (c->single ? g * p->o : 0), p->db + g * p->o, p->o, 2e-5, name);
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
          gmlp_test_assert_close (got + (c->single ? g * wlen : 0), want, wlen, 2e-5, name);
        }
    }
}

static void
test_contract (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint combo;

  if (device == NULL)
    return;

  for (combo = 0; combo < 8; combo++)
    {
      Combo c = { combo & 1, (combo >> 1) & 1, (combo >> 2) & 1 };
      GmlpLinearFlags flags = GMLP_LINEAR_BIAS |
                              (c.delay ? GMLP_LINEAR_DELAY_WGRAD_COMPUTE : 0) |
                              (c.fused ? GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION : 0) |
                              (c.single ? GMLP_LINEAR_SINGLE_GROUPED_WEIGHT : 0);
      const guint n = 4;
      gint64 rows[] = { 7, 0, 12, 3 };
      gboolean mask[] = { TRUE, TRUE, FALSE, TRUE };
      g_autoptr(GmlpGroupedLinear) layer = new_layer (device, n, 9, 6, GMLP_DTYPE_FLOAT32, flags);
      g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, y = NULL, dx = NULL;
      g_autoptr(GmlpSavedActivations) saved = NULL;
      g_autoptr(GError) error = NULL;
      g_autoptr(Problem) p = problem_new (layer, rows, &x, &dy);
      g_autofree double *main_grad_before = g_new0 (double, n * 6 * 9);
      GmlpGroupedTensor *separate[4] = { NULL, };
      guint g;

      g_test_message ("delay=%d fused=%d single=%d", c.delay, c.fused, c.single);
      wgrad_ready_count = 0;
      g_signal_connect (layer, "wgrad-ready", G_CALLBACK (count_wgrad_ready), NULL);

      if (c.fused)
        {
          /* The caller's own accumulators, with something in them already. */
          if (c.single)
            {
              g_autoptr(GmlpGroupedTensor) mg = NULL;
              gint64 wr[] = { 6, 6, 6, 6 };
              g_autofree double *vals = NULL;
              mg = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, wr, n, 9, 1.0, &vals);
              memcpy (main_grad_before, vals, sizeof (double) * n * 54);
              g_assert_true (gmlp_grouped_linear_set_main_grad (layer, mg, &error));
              g_assert_no_error (error);
            }
          else
            for (g = 0; g < n; g++)
              {
                gint64 six = 6;
                g_autofree double *vals = NULL;
                separate[g] = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, &six, 1, 9, 1.0, &vals);
                memcpy (main_grad_before + g * 54, vals, sizeof (double) * 54);
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

      for (g = 0; g < n; g++)
        g_clear_object (&separate[g]);
    }
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
test_microbatches (void)
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

      for (i = 0; i < mb; i++)
        {
          g_autofree gint64 *rows = gmlp_test_random_rows (n, 25);
          GmlpGroupedTensor *y;

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
              g_free (p[i]->y); g_free (p[i]->dx); g_free (p[i]->dw); g_free (p[i]->db);
              problem_reference (p[i]);
            }
          y = gmlp_grouped_linear_forward (layer, x[i], &saved[i], &error);
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
          check_per_group (gmlp_grouped_linear_get_bgrad (layer), p[mb - 1 - i]->db, p[0], 11,
                           2e-5, "dbias");
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

/* Bad input: the right error, nothing written, nothing allocated. */
static void
test_bad_input (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpGroupedLinear) layer = NULL, other = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, y = NULL, dx = NULL, x16 = NULL;
  g_autoptr(GmlpGroupedTensor) wide = NULL, three = NULL, dy_short = NULL, sizes = NULL, dev_x = NULL;
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
  {
    gint64 four = 4;
    g_autoptr(GBytes) sb = g_bytes_new (rows, sizeof rows);
    sizes = gmlp_grouped_tensor_new_from_bytes (device, GMLP_DTYPE_INT64, &four, 1, 1, sb, NULL);
    dev_x = gmlp_grouped_tensor_new_with_device_sizes (device, GMLP_DTYPE_FLOAT32, sizes, 10, 16, NULL);
  }
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
  EXPECT_NULL (gmlp_grouped_linear_forward (layer, dev_x, &_s, &_e), GMLP_ERROR_UNSUPPORTED);

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

int
main (int argc, char *argv[])
{
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Gmlp/GroupedLinear/numerics", test_numerics);
  g_test_add_func ("/Gmlp/GroupedLinear/shapes", test_shapes);
  g_test_add_func ("/Gmlp/GroupedLinear/many-experts", test_many_experts);
  g_test_add_func ("/Gmlp/GroupedLinear/contract", test_contract);
  g_test_add_func ("/Gmlp/GroupedLinear/wgrad-ready", test_wgrad_ready);
  g_test_add_func ("/Gmlp/GroupedLinear/microbatches", test_microbatches);
  g_test_add_func ("/Gmlp/GroupedLinear/bad-input", test_bad_input);
  g_test_add_func ("/Gmlp/GroupedLinear/main-grad-checks", test_main_grad_checks);
  g_test_add_func ("/Gmlp/GroupedLinear/properties", test_properties);

  return g_test_run ();
}
