/* test-router-devices.c: GmlpRouter across contexts and devices
 *
 * Offload, properties, threads, wide routers, the CPU against the GPU, and
 * graphs.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "test-router.h"

/* Saved activations offloaded: the same gradients, bit for bit. */
void
test_offload (void)
{
  const Config *c = config ("sigmoid-deepseek");
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint d;

  if (device == NULL)
    return;
  for (d = 0; d < G_N_ELEMENTS (x_dtypes); d++)
    {
      g_autoptr(Problem) p = problem_new (c, x_dtypes[d], T_TOKENS);
      g_autoptr(GmlpRouter) router = problem_router (p, device, GMLP_LINEAR_NONE);
      g_autofree double *gp = random_grad ((gsize) p->T * c->k);
      g_autoptr(GmlpGroupedTensor) x = gmlp_test_upload_values (device, p->x, p->T, p->H, p->dtype);
      g_autoptr(GmlpGroupedTensor) grad = gmlp_test_upload_values (device, gp, p->T, c->k, GMLP_DTYPE_FLOAT32);
      g_autoptr(GmlpOffloadContext) oc = NULL;
      GBytes *results[2][2] = { { NULL, NULL }, { NULL, NULL } };
      g_autoptr(GError) error = NULL;
      guint offload;

      oc = gmlp_offload_context_new (device, &error);
      g_assert_no_error (error);
      for (offload = 0; offload < 2; offload++)
        {
          g_autoptr(GmlpSavedActivations) saved = NULL;
          g_autoptr(GmlpRouting) routing = NULL;
          g_autoptr(GmlpGroupedTensor) dx = NULL;

          if (offload)
            gmlp_offload_context_push_thread_default (oc, TRUE);
          routing = gmlp_router_forward (router, x, &saved, &error);
          g_assert_no_error (error);
          if (offload)
            {
              g_assert_true (gmlp_offload_context_pop_thread_default (oc, &error));
              g_assert_no_error (error);
            }
          g_assert_cmpint (gmlp_saved_activations_get_offload (saved), ==, offload);
          dx = gmlp_router_backward (router, saved, grad, &error);
          g_assert_no_error (error);
          results[offload][0] = gmlp_grouped_tensor_to_bytes (dx, &error);
          results[offload][1] = gmlp_grouped_tensor_to_bytes (gmlp_router_get_wgrad (router), &error);
          g_assert_no_error (error);
        }
      g_assert_true (g_bytes_equal (results[0][0], results[1][0]));
      g_assert_true (g_bytes_equal (results[0][1], results[1][1]));
      for (offload = 0; offload < 2; offload++)
        {
          g_bytes_unref (results[offload][0]);
          g_bytes_unref (results[offload][1]);
        }
    }
}

/* The properties a router is made with come back. */
void
test_properties (void)
{
  const Config *c = config ("softmax-after-groups-bias");
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpRouter) router = NULL;
  gboolean before, renorm, bias, added;
  guint E, k, groups, topk_groups, pending;
  double scale, rate, aux, z;
  GmlpScoreFunction score;
  GmlpLinearFlags flags;
  GmlpDevice *got_device;
  gint64 hidden;

  if (device == NULL)
    return;
  router = router_new (device, c, 20, GMLP_LINEAR_DELAY_WGRAD_COMPUTE);
  g_object_get (router, "device", &got_device, "hidden", &hidden, "n-experts", &E, "top-k", &k,
                "score-function", &score, "softmax-before-topk", &before, "renormalize", &renorm,
                "scaling-factor", &scale, "n-expert-groups", &groups, "topk-groups", &topk_groups,
                "expert-bias", &bias, "bias-update-rate", &rate, "aux-loss-coeff", &aux,
                "z-loss-coeff", &z, "flags", &flags, "pending-wgrads", &pending,
                "grad-added-to-main-grad", &added, NULL);
  g_assert_true (got_device == device);
  g_object_unref (got_device);
  g_assert_cmpint (hidden, ==, 20);
  g_assert_cmpuint (E, ==, c->E);
  g_assert_cmpuint (k, ==, c->k);
  g_assert_cmpint (score, ==, c->score);
  g_assert_cmpint (before, ==, c->before);
  g_assert_cmpint (renorm, ==, c->renorm);
  g_assert_cmpfloat (scale, ==, c->scale);
  g_assert_cmpuint (groups, ==, c->groups);
  g_assert_cmpuint (topk_groups, ==, c->topk_groups);
  g_assert_cmpint (bias, ==, c->bias);
  g_assert_cmpfloat (rate, ==, 1e-3);
  g_assert_cmpfloat (aux, ==, c->aux);
  g_assert_cmpfloat (z, ==, c->z);
  g_assert_cmpint (flags, ==, GMLP_LINEAR_DELAY_WGRAD_COMPUTE);
  g_assert_cmpuint (pending, ==, 0);
  g_assert_false (added);
  g_assert_cmpint (gmlp_router_get_hidden (router), ==, 20);
  g_assert_cmpuint (gmlp_router_get_n_experts (router), ==, c->E);
  g_assert_cmpuint (gmlp_router_get_top_k (router), ==, c->k);
  g_assert_cmpint (gmlp_router_get_score_function (router), ==, c->score);
  g_assert_true (gmlp_router_get_device (router) == device);
  /* The bias starts at zero, 1 × E. */
  {
    gsize n, i;
    g_autofree double *b = gmlp_test_download (gmlp_router_get_expert_bias (router), &n);

    g_assert_cmpuint (n, ==, c->E);
    g_assert_cmpint (gmlp_grouped_tensor_get_rows (gmlp_router_get_expert_bias (router), 0), ==, 1);
    for (i = 0; i < n; i++)
      gmlp_assert_same_value (b[i], 0.0, "expert bias", i);
  }
}

/* Threads share one router: forwards run together, backwards take turns,
 * and main_grad gets every thread's dW. */
typedef struct {
  Problem     *p;
  GmlpDevice  *device;
  GmlpRouter  *router;
  double      *gp;
} ThreadStep;

static gpointer
thread_step (gpointer data)
{
  ThreadStep *step = data;
  Problem *p = step->p;
  g_autoptr(GmlpGroupedTensor) x = gmlp_test_upload_values (step->device, p->x, p->T, p->H, p->dtype);
  g_autoptr(GmlpGroupedTensor) grad = gmlp_test_upload_values (step->device, step->gp, p->T, p->c->k,
                                                               GMLP_DTYPE_FLOAT32);
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GmlpRouting) routing = NULL;
  g_autoptr(GmlpGroupedTensor) dx = NULL;
  g_autoptr(GError) error = NULL;
  guint i;

  for (i = 0; i < 3; i++)
    {
      g_clear_object (&routing);
      routing = gmlp_router_forward (step->router, x, i == 2 ? &saved : NULL, &error);
      g_assert_no_error (error);
    }
  dx = gmlp_router_backward (step->router, saved, grad, &error);
  g_assert_no_error (error);
  return NULL;
}

void
test_threads (void)
{
  enum { N_THREADS = 4 };
  const Config *c = config ("sigmoid-deepseek");
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpRouter) router = NULL;
  Problem *problems[N_THREADS];
  ThreadStep steps[N_THREADS];
  GThread *threads[N_THREADS];
  g_autofree double *want = NULL, *dw = NULL, *got = NULL;
  gsize n, j;
  guint i;

  if (device == NULL)
    return;
  want = g_new0 (double, c->E * HIDDEN);
  dw = g_new (double, c->E * HIDDEN);
  for (i = 0; i < N_THREADS; i++)
    {
      g_autofree double *dx = NULL;

      problems[i] = problem_new_like (c, x_dtypes[i % 3], T_TOKENS, i > 0 ? problems[0] : NULL);
      steps[i] = (ThreadStep) { problems[i], device, NULL, random_grad ((gsize) T_TOKENS * c->k) };
      dx = g_new (double, T_TOKENS * HIDDEN);
      ref_backward (problems[i], steps[i].gp, dx, dw);
      for (j = 0; j < c->E * HIDDEN; j++)
        want[j] += dw[j];
    }
  router = problem_router (problems[0], device, GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION);
  for (i = 0; i < N_THREADS; i++)
    {
      steps[i].router = router;
      threads[i] = g_thread_new ("router-step", thread_step, &steps[i]);
    }
  for (i = 0; i < N_THREADS; i++)
    g_thread_join (threads[i]);

  got = gmlp_test_download (gmlp_router_get_main_grad (router), &n);
  gmlp_test_assert_close (got, want, n, 1e-4, "main_grad after the threads' backwards");
  for (i = 0; i < N_THREADS; i++)
    {
      g_free (steps[i].gp);
      problem_free (problems[i]);
    }
}

/* The kernels' other paths (wide_configs) against the float64 reference,
 * on both backends. */
void
test_wide (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint i;

  if (device == NULL)
    return;
  for (i = 0; i < G_N_ELEMENTS (wide_configs); i++)
    {
      g_autoptr(Problem) p = problem_new (&wide_configs[i], GMLP_DTYPE_FLOAT32, WIDE_TOKENS);
      g_autoptr(GmlpRouter) router = problem_router (p, device, GMLP_LINEAR_NONE);
      g_autofree double *gp = random_grad ((gsize) p->T * p->c->k);

      run_and_check (p, device, router, gp, NULL, wide_configs[i].name);
    }
}

/* What a step leaves, as bytes: the routing's tensors, then dx and dW
 * (NULL after a forward alone). */
enum { STEP_INDICES, STEP_PROBS, STEP_COUNTS, STEP_AUX, STEP_Z, STEP_DX, STEP_DW, N_STEP };

static const char *const step_names[N_STEP] = {
  "indices", "probabilities", "tokens per expert", "aux loss", "z loss", "dx", "dW",
};

typedef struct {
  GBytes    *bytes[N_STEP];
  GmlpDType  dtype[N_STEP];
} Step;

static void
step_clear (Step *s)
{
  guint i;

  for (i = 0; i < N_STEP; i++)
    g_clear_pointer (&s->bytes[i], g_bytes_unref);
}
G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (Step, step_clear)

static void
step_collect (GmlpRouter        *router,
              GmlpRouting       *routing,
              GmlpGroupedTensor *dx,
              Step              *s)
{
  GmlpGroupedTensor *t[N_STEP] = {
    gmlp_routing_get_indices (routing), gmlp_routing_get_probs (routing),
    gmlp_routing_get_tokens_per_expert (routing), gmlp_routing_get_aux_loss (routing),
    gmlp_routing_get_z_loss (routing), dx, dx != NULL ? gmlp_router_get_wgrad (router) : NULL,
  };
  g_autoptr(GError) error = NULL;
  guint i;

  for (i = 0; i < N_STEP; i++)
    {
      s->bytes[i] = t[i] != NULL ? gmlp_grouped_tensor_to_bytes (t[i], &error) : NULL;
      g_assert_no_error (error);
      s->dtype[i] = t[i] != NULL ? gmlp_grouped_tensor_get_dtype (t[i]) : GMLP_DTYPE_FLOAT32;
    }
}

/* A forward (and with gp a backward) of a fresh router of the problem on
 * device. */
static void
step_run (Problem      *p,
          GmlpDevice   *device,
          const double *gp,
          Step         *s)
{
  g_autoptr(GmlpRouter) router = problem_router (p, device, GMLP_LINEAR_NONE);
  g_autoptr(GmlpGroupedTensor) x = gmlp_test_upload_values (device, p->x, p->T, p->H, p->dtype);
  g_autoptr(GmlpGroupedTensor) grad = NULL, dx = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GmlpRouting) routing = NULL;
  g_autoptr(GError) error = NULL;

  routing = gmlp_router_forward (router, x, gp != NULL ? &saved : NULL, &error);
  g_assert_no_error (error);
  if (gp != NULL)
    {
      grad = gmlp_test_upload_values (device, gp, p->T, p->c->k, GMLP_DTYPE_FLOAT32);
      dx = gmlp_router_backward (router, saved, grad, &error);
      g_assert_no_error (error);
    }
  step_collect (router, routing, dx, s);
}

/* Every result of two steps the same, byte for byte. */
static void
assert_steps_equal (const Step *a,
                    const Step *b,
                    const char *what)
{
  guint i;

  for (i = 0; i < N_STEP; i++)
    {
      g_assert_true ((a->bytes[i] == NULL) == (b->bytes[i] == NULL));
      if (a->bytes[i] != NULL && !g_bytes_equal (a->bytes[i], b->bytes[i]))
        g_error ("%s: %s differ", what, step_names[i]);
    }
}

/* ‖a − b‖ ≤ tol ‖b‖ over the values that are numbers, NaN where the other
 * is NaN too (and ±∞ where the other is the same). */
static void
assert_close_or_same_special (const double *a,
                              const double *b,
                              gsize         n,
                              double        tol,
                              const char   *what)
{
  double diff = 0.0, norm = 0.0;
  gsize i;

  for (i = 0; i < n; i++)
    {
      if (!isfinite (a[i]) || !isfinite (b[i]))
        {
          if (!((isnan (a[i]) && isnan (b[i])) || a[i] == b[i]))
            g_error ("%s [%" G_GSIZE_FORMAT "]: %g and %g", what, i, a[i], b[i]);
          continue;
        }
      diff += (a[i] - b[i]) * (a[i] - b[i]);
      norm += b[i] * b[i];
    }
  if (!(sqrt (diff) <= tol * sqrt (norm)))
    g_error ("%s: relative difference %g > %g", what, sqrt (diff / norm), tol);
}

/* The CPU step and the GPU step as gmlp-kernels.h says they agree:
 * indices and counts the same bytes; probabilities and losses within 1e-5
 * (a token's E terms are added in another order and expf is CUDA's: a
 * softmax's sum may differ by some ulps per expert, and every value of the
 * token with it); dx and dW, one product further, within 2e-5, or the
 * rounding of a 16-bit dx. */
static void
assert_steps_agree (const Step *cpu,
                    const Step *gpu,
                    GmlpDType   x_dtype,
                    const char *what)
{
  guint i;

  for (i = 0; i < N_STEP; i++)
    {
      gsize n, j, size;
      g_autofree double *a = NULL, *b = NULL;
      g_autofree char *label = g_strdup_printf ("%s: %s, GPU against CPU", what, step_names[i]);
      double tol;

      g_assert_true ((cpu->bytes[i] == NULL) == (gpu->bytes[i] == NULL));
      if (cpu->bytes[i] == NULL)
        continue;
      g_assert_cmpint (cpu->dtype[i], ==, gpu->dtype[i]);
      g_assert_cmpuint (g_bytes_get_size (cpu->bytes[i]), ==, g_bytes_get_size (gpu->bytes[i]));
      if (i == STEP_INDICES || i == STEP_COUNTS)
        {
          const gint64 *ci = g_bytes_get_data (cpu->bytes[i], &size);
          const gint64 *gi = g_bytes_get_data (gpu->bytes[i], NULL);

          for (j = 0; j < size / sizeof (gint64); j++)
            if (ci[j] != gi[j])
              g_error ("%s [%" G_GSIZE_FORMAT "]: %" G_GINT64_FORMAT " on the GPU, %" G_GINT64_FORMAT
                       " on the CPU", label, j, gi[j], ci[j]);
          continue;
        }
      n = g_bytes_get_size (cpu->bytes[i]) / gmlp_dtype_get_size (cpu->dtype[i]);
      a = g_new (double, MAX (n, 1));
      b = g_new (double, MAX (n, 1));
      for (j = 0; j < n; j++)
        {
          a[j] = gmlp_test_decode (g_bytes_get_data (gpu->bytes[i], NULL), gpu->dtype[i], j);
          b[j] = gmlp_test_decode (g_bytes_get_data (cpu->bytes[i], NULL), cpu->dtype[i], j);
        }
      if (i == STEP_DX)
        tol = x_dtype == GMLP_DTYPE_FLOAT32 ? 2e-5 : gmlp_test_tolerance (x_dtype);
      else
        tol = i == STEP_DW ? 2e-5 : 1e-5;
      assert_close_or_same_special (a, b, n, tol, label);
    }
}

/* The CPU and the GPU route alike (gpu suite only): every configuration,
 * FP32 and for some BF16 inputs, forward and backward; the non-finite
 * logits of /Gmlp/Router/non-finite, forward. The GPU gives the same bits
 * when run again. */
void
test_cpu_gpu (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpDevice) cpu = NULL;
  g_autoptr(GError) error = NULL;
  guint i, pass;

  if (device == NULL)
    return;
  if (gmlp_device_get_kind (device) == GMLP_DEVICE_KIND_CPU)
    {
      g_test_skip ("compares the CPU with a GPU: runs in the gpu suite");
      return;
    }
  cpu = gmlp_device_new_from_string ("cpu", &error);
  g_assert_no_error (error);

  for (pass = 0; pass < 3; pass++)
    for (i = 0; i < G_N_ELEMENTS (configs) + G_N_ELEMENTS (wide_configs); i++)
      {
        gboolean wide = i >= G_N_ELEMENTS (configs);
        const Config *c = wide ? &wide_configs[i - G_N_ELEMENTS (configs)] : &configs[i];
        /* pass 0: FP32; 1: BF16 (the narrow configurations); 2: non-finite
         * logits, forward only. */
        GmlpDType dtype = pass == 1 ? GMLP_DTYPE_BFLOAT16 : GMLP_DTYPE_FLOAT32;
        g_autoptr(Problem) p = NULL;
        g_autofree double *gp = NULL;
        g_autofree char *what = NULL;
        g_auto(Step) on_cpu = { { NULL } }, on_gpu = { { NULL } }, again = { { NULL } };

        if (pass == 1 && wide)
          continue;
        p = problem_new (c, dtype, wide ? WIDE_TOKENS : T_TOKENS);
        if (pass == 2)
          make_non_finite (p);
        else
          gp = random_grad ((gsize) p->T * c->k);
        what = g_strdup_printf ("%s/%s%s", c->name, gmlp_dtype_get_name (dtype),
                                pass == 2 ? "/non-finite" : "");

        step_run (p, cpu, gp, &on_cpu);
        step_run (p, device, gp, &on_gpu);
        step_run (p, device, gp, &again);
        assert_steps_agree (&on_cpu, &on_gpu, dtype, what);
        assert_steps_equal (&on_gpu, &again, what);
      }
}

/* A forward and backward captured once into a graph (groups, bias, aux
 * and z), replayed on new tokens written into the same input: every replay
 * gives the float64 reference's routing and gradients, and the same bits as
 * the step run eagerly. That the capture succeeds shows that nothing in the
 * step waits for the device or reads it on the host. */
void
test_graph (void)
{
  static const GmlpDType dtypes[] = { GMLP_DTYPE_FLOAT32, GMLP_DTYPE_BFLOAT16 };
  const Config *c = config ("sigmoid-deepseek");
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint d, replay;

  if (device == NULL)
    return;
  if (gmlp_device_get_kind (device) == GMLP_DEVICE_KIND_CPU)
    {
      g_test_skip ("graphs need a GPU");
      return;
    }
  for (d = 0; d < G_N_ELEMENTS (dtypes); d++)
    {
      g_autoptr(Problem) p = problem_new (c, dtypes[d], T_TOKENS);
      g_autoptr(GmlpRouter) router = problem_router (p, device, GMLP_LINEAR_NONE);
      g_autofree double *gp = random_grad ((gsize) p->T * c->k);
      g_autoptr(GmlpGroupedTensor) x = gmlp_test_upload_values (device, p->x, p->T, p->H, p->dtype);
      g_autoptr(GmlpGroupedTensor) grad = gmlp_test_upload_values (device, gp, p->T, c->k, GMLP_DTYPE_FLOAT32);
      g_autoptr(GmlpSavedActivations) saved = NULL;
      g_autoptr(GmlpRouting) routing = NULL;
      g_autoptr(GmlpGroupedTensor) dx = NULL;
      g_autoptr(GmlpGraph) graph = NULL;
      g_autoptr(GError) error = NULL;

      g_assert_true (gmlp_device_begin_capture (device, &error));
      g_assert_no_error (error);
      routing = gmlp_router_forward (router, x, &saved, &error);
      g_assert_no_error (error);
      dx = gmlp_router_backward (router, saved, grad, &error);
      g_assert_no_error (error);
      graph = gmlp_device_end_capture (device, &error);
      g_assert_no_error (error);

      for (replay = 0; replay < 3; replay++)
        {
          g_autoptr(Problem) q = problem_new_like (c, dtypes[d], T_TOKENS, p);
          g_autofree double *gq = random_grad ((gsize) q->T * c->k);
          g_autofree double *dx_ref = g_new (double, q->T * q->H), *dw_ref = g_new (double, c->E * q->H);
          g_autofree double *got = NULL;
          g_autoptr(GmlpSavedActivations) eager_saved = NULL;
          g_autoptr(GmlpRouting) eager = NULL;
          g_autoptr(GmlpGroupedTensor) eager_dx = NULL;
          g_auto(Step) replayed = { { NULL } }, eagerly = { { NULL } };
          g_autofree char *what = g_strdup_printf ("%s replay %u", gmlp_dtype_get_name (dtypes[d]), replay);
          gsize n;

          gmlp_test_overwrite_values (x, q->x);
          gmlp_test_overwrite_values (grad, gq);
          g_assert_true (gmlp_graph_replay (graph, &error));
          g_assert_no_error (error);

          assert_routing (q, routing, what);
          ref_backward (q, gq, dx_ref, dw_ref);
          got = gmlp_test_download (dx, &n);
          gmlp_test_assert_close (got, dx_ref, n, dx_tolerance (q->dtype), what);
          g_clear_pointer (&got, g_free);
          got = gmlp_test_download (gmlp_router_get_wgrad (router), &n);
          gmlp_test_assert_close (got, dw_ref, n, 1e-4, what);
          step_collect (router, routing, dx, &replayed);

          eager = gmlp_router_forward (router, x, &eager_saved, &error);
          g_assert_no_error (error);
          eager_dx = gmlp_router_backward (router, eager_saved, grad, &error);
          g_assert_no_error (error);
          step_collect (router, eager, eager_dx, &eagerly);
          assert_steps_equal (&replayed, &eagerly, what);
        }
    }
}
