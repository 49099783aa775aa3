/* test-grouped-linear-contract.c: GroupedLinear's gradient contract
 *
 * What a backward leaves in wgrad and main_grad in each mode, the
 * wgrad-ready signal, and microbatches accumulated.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "test-grouped-linear.h"

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
void
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

void
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

void
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
void
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

void
test_microbatches (void)
{
  run_microbatches (FALSE);
}
