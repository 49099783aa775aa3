/* test-moe-layer-check.c: the library side of test-moe-layer
 *
 * A layer made from a problem (or a problem from a layer's parameters), its
 * gradients read back, and the checks of a step's outputs, gradients,
 * main_grads and routing against the float64 reference.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "test-moe-layer.h"

/* Library side */

/* A layer of the configuration, made from its properties. */
GmlpMoELayer *
layer_new (GmlpDevice      *device,
           const Config    *c,
           GmlpDType        dtype,
           GmlpLinearFlags  extra_flags)
{
  g_autoptr(GError) error = NULL;
  GmlpMoELayer *layer = g_initable_new (GMLP_TYPE_MOE_LAYER, NULL, &error,
                                        "device", device,
                                        "hidden", (gint64) HIDDEN,
                                        "ffn-hidden", (gint64) FFN,
                                        "n-experts", c->E,
                                        "top-k", c->k,
                                        "activation", c->act,
                                        "dtype", dtype,
                                        "flags", c->flags | extra_flags,
                                        "score-function", c->score,
                                        "softmax-before-topk", c->before,
                                        "renormalize", c->renorm,
                                        "scaling-factor", c->scale,
                                        "n-expert-groups", c->groups,
                                        "topk-groups", c->topk_groups,
                                        "expert-bias", c->bias,
                                        "aux-loss-coeff", c->aux,
                                        "z-loss-coeff", c->z,
                                        "padding", c->padding,
                                        "capacity-factor", c->capacity,
                                        "shared-expert-ffn-hidden", c->shared,
                                        NULL);

  g_assert_no_error (error);
  g_assert_nonnull (layer);
  return layer;
}

static void
set_mlp (GmlpGroupedMLP *mlp,
         const Mlp      *m)
{
  g_assert_nonnull (mlp);
  g_assert_cmpuint (gmlp_grouped_linear_get_n_groups (gmlp_grouped_mlp_get_fc1 (mlp)), ==, m->n);
  g_assert_cmpint (gmlp_grouped_linear_get_out_features (gmlp_grouped_mlp_get_fc1 (mlp)), ==, m->w1o);
  g_assert_cmpint (gmlp_grouped_linear_get_in_features (gmlp_grouped_mlp_get_fc2 (mlp)), ==, m->ffn);
  gmlp_test_set_linear (gmlp_grouped_mlp_get_fc1 (mlp), m->w1, m->b1);
  gmlp_test_set_linear (gmlp_grouped_mlp_get_fc2 (mlp), m->w2, m->b2);
}

/* A layer holding the problem's parameters. */
GmlpMoELayer *
problem_layer (Problem         *p,
               GmlpDevice      *device,
               GmlpLinearFlags  extra_flags)
{
  GmlpMoELayer *layer = layer_new (device, p->c, p->dtype, extra_flags);
  GmlpRouter *router = gmlp_moe_layer_get_router (layer);
  g_autoptr(GBytes) wb = gmlp_test_encode_values (p->wg, p->c->E * p->H, GMLP_DTYPE_FLOAT32);
  g_autoptr(GError) error = NULL;

  g_assert_nonnull (router);
  g_assert_true (gmlp_router_set_weight_from_bytes (router, wb, &error));
  g_assert_no_error (error);
  if (p->bias != NULL)
    {
      g_autoptr(GBytes) bb = gmlp_test_encode_values (p->bias, p->c->E, GMLP_DTYPE_FLOAT32);

      g_assert_true (gmlp_router_set_expert_bias_from_bytes (router, bb, &error));
      g_assert_no_error (error);
    }
  set_mlp (gmlp_moe_layer_get_experts (layer), p->experts);
  if (p->shared != NULL)
    set_mlp (gmlp_moe_layer_get_shared_expert (layer), p->shared);
  else
    g_assert_null (gmlp_moe_layer_get_shared_expert (layer));
  return layer;
}

/* A GroupedLinear's weights (or biases), group after group, whether
 * grouped or per group, as float64. */
static void
read_linear (GmlpGroupedLinear *linear,
             gboolean           bias,
             double            *out)
{
  gboolean single = gmlp_grouped_linear_get_flags (linear) & GMLP_LINEAR_SINGLE_GROUPED_WEIGHT;
  guint g;
  gsize at = 0;

  for (g = 0; g < (single ? 1 : gmlp_grouped_linear_get_n_groups (linear)); g++)
    {
      GmlpGroupedTensor *t = bias ? (single ? gmlp_grouped_linear_get_bias (linear)
                                            : gmlp_grouped_linear_get_bias_member (linear, g))
                                  : (single ? gmlp_grouped_linear_get_weight (linear)
                                            : gmlp_grouped_linear_get_weight_member (linear, g));
      g_autofree double *v = NULL;
      gsize n;

      g_assert_nonnull (t);
      v = gmlp_test_download (t, &n);
      memcpy (out + at, v, sizeof (double) * n);
      at += n;
    }
}

static Mlp *
read_mlp (GmlpGroupedMLP *mlp,
          gint64          ffn)
{
  GmlpGroupedLinear *fc1 = gmlp_grouped_mlp_get_fc1 (mlp), *fc2 = gmlp_grouped_mlp_get_fc2 (mlp);
  gboolean has_bias = (gmlp_grouped_linear_get_flags (fc1) & GMLP_LINEAR_BIAS) != 0;
  Mlp *m = mlp_new (gmlp_grouped_linear_get_n_groups (fc1), gmlp_grouped_linear_get_in_features (fc1), ffn,
                    gmlp_grouped_mlp_get_activation (mlp), has_bias);

  g_assert_cmpint (gmlp_grouped_linear_get_out_features (fc1), ==, m->w1o);
  read_linear (fc1, FALSE, m->w1);
  read_linear (fc2, FALSE, m->w2);
  if (has_bias)
    {
      read_linear (fc1, TRUE, m->b1);
      read_linear (fc2, TRUE, m->b2);
    }
  return m;
}

/* A problem of @layer's own parameters (as the layer holds them: the
 * experts read from get_experts(), the gate from the router) and fresh
 * data. */
Problem *
problem_new_from_layer (const Config *c,
                        GmlpMoELayer *layer,
                        gint64        T)
{
  GmlpRouter *router = gmlp_moe_layer_get_router (layer);
  GmlpDType dtype = gmlp_grouped_linear_get_dtype (gmlp_grouped_mlp_get_fc1 (gmlp_moe_layer_get_experts (layer)));
  Problem *p = problem_alloc (c, dtype, T);
  gsize n;

  p->wg = gmlp_test_download (gmlp_router_get_weight (router), &n);
  g_assert_cmpuint (n, ==, c->E * p->H);
  if (c->bias)
    p->bias = gmlp_test_download (gmlp_router_get_expert_bias (router), &n);
  p->experts = read_mlp (gmlp_moe_layer_get_experts (layer), p->F);
  if (c->shared > 0)
    p->shared = read_mlp (gmlp_moe_layer_get_shared_expert (layer), c->shared);
  problem_draw_data (p);
  return p;
}

/* A GroupedLinear's weight or bias gradient under the gradient contract,
 * group after group, whether its weights are grouped or per group. */
double *
linear_grad (GmlpGroupedLinear *linear,
             GradKind           kind,
             gsize             *n_values)
{
  GmlpLinearFlags flags = gmlp_grouped_linear_get_flags (linear);
  gboolean fused = (flags & GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION) && kind == GRAD_WEIGHT;
  guint n = gmlp_grouped_linear_get_n_groups (linear), g;
  GArray *all = g_array_new (FALSE, FALSE, sizeof (double));

  if (flags & GMLP_LINEAR_SINGLE_GROUPED_WEIGHT)
    {
      GmlpGroupedTensor *t = kind == GRAD_BIAS ? gmlp_grouped_linear_get_bgrad (linear)
                             : fused ? gmlp_grouped_linear_get_main_grad (linear)
                             : gmlp_grouped_linear_get_wgrad (linear);
      g_autofree double *v = NULL;
      gsize len;

      g_assert_nonnull (t);
      v = gmlp_test_download (t, &len);
      g_array_append_vals (all, v, len);
    }
  else
    for (g = 0; g < n; g++)
      {
        GmlpGroupedTensor *t = kind == GRAD_BIAS ? gmlp_grouped_linear_get_bgrad_member (linear, g)
                               : fused ? gmlp_grouped_linear_get_main_grad_member (linear, g)
                               : gmlp_grouped_linear_get_wgrad_member (linear, g);
        g_autofree double *v = NULL;
        gsize len;

        g_assert_nonnull (t);
        v = gmlp_test_download (t, &len);
        g_array_append_vals (all, v, len);
      }
  *n_values = all->len;
  return (double *) g_array_free (all, FALSE);
}

double *
router_grad (GmlpRouter *router,
             gsize      *n)
{
  GmlpGroupedTensor *t = gmlp_router_get_wgrad (router);

  if (gmlp_router_get_flags (router) & GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION)
    t = gmlp_router_get_main_grad (router);
  g_assert_nonnull (t);
  return gmlp_test_download (t, n);
}

static double
tolerance (GmlpDType dtype)
{
  return dtype == GMLP_DTYPE_FLOAT32 ? 1e-4 : 2.0 * gmlp_test_tolerance (dtype);
}

/* The gate's gradient sums, over the tokens, dot products of dy with the
 * experts' 16-bit outputs, which largely cancel: a 16-bit rounding that
 * differs by one unit weighs more in it than in the other results. */
double
router_tolerance (GmlpDType dtype)
{
  return dtype == GMLP_DTYPE_FLOAT32 ? 1e-4 : 4.0 * gmlp_test_tolerance (dtype);
}

void
assert_close (const double *got,
              const double *want,
              gsize         n,
              double        tol,
              const char   *what,
              const char   *part)
{
  g_autofree char *label = g_strdup_printf ("%s: %s", what, part);

  gmlp_test_assert_close (got, want, n, tol, label);
}

/* An MLP's gradients against the reference's (weights always, biases when
 * it has them); minus @base (a main_grad's earlier contents) when given. */
/* Every gradient the layer holds (the router's, then the experts' and the
 * shared expert's, FC1 then FC2, weight then bias), as float64: to compare
 * two steps bit for bit. */
double *
layer_grads (GmlpMoELayer *layer,
             gsize        *n_values)
{
  GmlpGroupedMLP *mlps[2] = { gmlp_moe_layer_get_experts (layer), gmlp_moe_layer_get_shared_expert (layer) };
  GArray *all = g_array_new (FALSE, FALSE, sizeof (double));
  g_autofree double *router = NULL;
  gsize n;
  guint m, i, kind;

  router = router_grad (gmlp_moe_layer_get_router (layer), &n);
  g_array_append_vals (all, router, n);
  for (m = 0; m < G_N_ELEMENTS (mlps) && mlps[m] != NULL; m++)
    for (i = 0; i < 2; i++)
      {
        GmlpGroupedLinear *fc = i == 0 ? gmlp_grouped_mlp_get_fc1 (mlps[m]) : gmlp_grouped_mlp_get_fc2 (mlps[m]);

        for (kind = GRAD_WEIGHT; kind <= GRAD_BIAS; kind++)
          {
            g_autofree double *v = NULL;

            if (kind == GRAD_BIAS && !(gmlp_grouped_linear_get_flags (fc) & GMLP_LINEAR_BIAS))
              continue;
            v = linear_grad (fc, kind, &n);
            g_array_append_vals (all, v, n);
          }
      }
  *n_values = all->len;
  return (double *) g_array_free (all, FALSE);
}

void
assert_mlp_grads (GmlpGroupedMLP *mlp,
                  const Mlp      *want,
                  GmlpDType       dtype,
                  const Mlp      *base,
                  const char     *what,
                  const char     *which)
{
  GmlpGroupedLinear *fc[2] = { gmlp_grouped_mlp_get_fc1 (mlp), gmlp_grouped_mlp_get_fc2 (mlp) };
  const double *wants[2][2] = { { want->w1, want->b1 }, { want->w2, want->b2 } };
  const double *bases[2] = { base != NULL ? base->w1 : NULL, base != NULL ? base->w2 : NULL };
  guint i, kind;

  for (i = 0; i < 2; i++)
    for (kind = GRAD_WEIGHT; kind <= GRAD_BIAS; kind++)
      {
        g_autofree double *got = NULL;
        g_autofree char *part = NULL;
        gsize n, q;

        if (kind == GRAD_BIAS && !(gmlp_grouped_linear_get_flags (fc[i]) & GMLP_LINEAR_BIAS))
          continue;
        got = linear_grad (fc[i], kind, &n);
        g_assert_cmpuint (n, ==, i == 0 ? want->n * want->w1o * (kind == GRAD_WEIGHT ? want->hid : 1)
                                        : want->n * want->hid * (kind == GRAD_WEIGHT ? want->ffn : 1));
        for (q = 0; q < n && kind == GRAD_WEIGHT && bases[i] != NULL; q++)
          got[q] -= bases[i][q];
        part = g_strdup_printf ("%s fc%u %s", which, i + 1, kind == GRAD_WEIGHT ? "dW" : "db");
        assert_close (got, wants[i][kind], n, tolerance (dtype), what, part);
      }
}

/* The experts' gradients: an expert that got no rows has exactly zero. */
static void
assert_empty_experts_zero (GmlpGroupedMLP *mlp,
                           const Problem  *p)
{
  GmlpGroupedLinear *fc1 = gmlp_grouped_mlp_get_fc1 (mlp);
  g_autofree double *got = NULL;
  gsize n, per = p->experts->w1o * p->H, i;
  guint e;

  if (gmlp_grouped_linear_get_flags (fc1) & GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION)
    return;
  got = linear_grad (fc1, GRAD_WEIGHT, &n);
  for (e = 0; e < p->c->E; e++)
    for (i = 0; i < per && p->rows[e] == 0; i++)
      gmlp_assert_same_value (got[e * per + i], 0.0, "dW1 of an expert without rows", e * per + i);
}

void
held_free (Held *h)
{
  g_clear_pointer (&h->experts, mlp_free);
  g_clear_pointer (&h->shared, mlp_free);
  g_free (h->router);
  g_free (h);
}

static Mlp *
held_mlp (GmlpGroupedMLP *mlp)
{
  GmlpGroupedLinear *fc1 = gmlp_grouped_mlp_get_fc1 (mlp), *fc2 = gmlp_grouped_mlp_get_fc2 (mlp);
  Mlp *m = mlp_new (gmlp_grouped_linear_get_n_groups (fc1), gmlp_grouped_linear_get_in_features (fc1),
                    gmlp_grouped_linear_get_in_features (fc2), gmlp_grouped_mlp_get_activation (mlp), FALSE);
  gsize n;

  g_free (m->w1);
  m->w1 = linear_grad (fc1, GRAD_WEIGHT, &n);
  g_assert_cmpuint (n, ==, m->n * m->w1o * m->hid);
  g_free (m->w2);
  m->w2 = linear_grad (fc2, GRAD_WEIGHT, &n);
  g_assert_cmpuint (n, ==, m->n * m->hid * m->ffn);
  return m;
}

Held *
held_new (GmlpMoELayer *layer)
{
  Held *h = g_new0 (Held, 1);
  gsize n;

  h->experts = held_mlp (gmlp_moe_layer_get_experts (layer));
  if (gmlp_moe_layer_get_shared_expert (layer) != NULL)
    h->shared = held_mlp (gmlp_moe_layer_get_shared_expert (layer));
  h->router = router_grad (gmlp_moe_layer_get_router (layer), &n);
  return h;
}

/* dst += src's weight gradients (accumulated); dst's bias gradients become
 * src's (overwritten, as the contract has them). */
static void
mlp_accumulate (Mlp       *dst,
                const Mlp *src)
{
  gint64 i;

  for (i = 0; i < dst->n * dst->w1o * dst->hid; i++)
    dst->w1[i] += src->w1[i];
  for (i = 0; i < dst->n * dst->hid * dst->ffn; i++)
    dst->w2[i] += src->w2[i];
  memcpy (dst->b1, src->b1, sizeof (double) * dst->n * dst->w1o);
  memcpy (dst->b2, src->b2, sizeof (double) * dst->n * dst->hid);
}

/* The reference gradients of two steps of a fused layer, into @into's:
 * the weights' accumulated, the biases' of the later step. */
void
problem_accumulate_grads (Problem       *into,
                          const Problem *later)
{
  gint64 i;

  mlp_accumulate (into->dexperts, later->dexperts);
  if (into->dshared != NULL)
    mlp_accumulate (into->dshared, later->dshared);
  for (i = 0; i < into->c->E * into->H; i++)
    into->dwg[i] += later->dwg[i];
}

/* A fused layer's main_grads against @held plus the reference @p's
 * gradients. */
void
assert_main_grads (GmlpMoELayer  *layer,
                   const Held    *held,
                   const Problem *p,
                   const char    *what)
{
  g_autofree double *got = NULL;
  gsize n, i;

  assert_mlp_grads (gmlp_moe_layer_get_experts (layer), p->dexperts, p->dtype, held->experts, what,
                    "experts' main_grad");
  if (p->shared != NULL)
    assert_mlp_grads (gmlp_moe_layer_get_shared_expert (layer), p->dshared, p->dtype, held->shared, what,
                      "shared main_grad");
  got = router_grad (gmlp_moe_layer_get_router (layer), &n);
  g_assert_cmpuint (n, ==, p->c->E * p->H);
  for (i = 0; i < n; i++)
    got[i] -= held->router[i];
  assert_close (got, p->dwg, n, router_tolerance (p->dtype), what, "router main_grad");
}

/* The layer's routing and losses against the reference. */
static void
assert_routing (Problem      *p,
                GmlpMoELayer *layer,
                const char   *what)
{
  const Config *c = p->c;
  /* The getters of the last forward give references (transfer full). */
  g_autoptr(GmlpRouting) routing = gmlp_moe_layer_get_routing (layer);
  g_autoptr(GmlpGroupedTensor) layer_tokens = gmlp_moe_layer_get_tokens_per_expert (layer);
  g_autoptr(GmlpGroupedTensor) layer_aux = gmlp_moe_layer_get_aux_loss (layer);
  gsize n, tk = (gsize) p->T * c->k, i;
  g_autofree gint64 *idx = NULL, *counts = NULL, *layer_counts = NULL;
  g_autofree double *probs = NULL;

  g_assert_nonnull (routing);
  g_assert_cmpint (gmlp_routing_get_n_tokens (routing), ==, p->T);
  g_assert_cmpuint (gmlp_routing_get_top_k (routing), ==, c->k);
  g_assert_cmpuint (gmlp_routing_get_n_experts (routing), ==, c->E);
  idx = gmlp_test_download_i64 (gmlp_routing_get_indices (routing), &n);
  g_assert_cmpuint (n, ==, tk);
  for (i = 0; i < tk; i++)
    if (idx[i] != p->idx[i])
      g_error ("%s: token %" G_GSIZE_FORMAT " choice %" G_GSIZE_FORMAT ": expert %" G_GINT64_FORMAT
               ", expected %" G_GINT64_FORMAT, what, i / c->k, i % c->k, idx[i], p->idx[i]);
  probs = gmlp_test_download (gmlp_routing_get_probs (routing), &n);
  g_assert_cmpuint (n, ==, tk);
  assert_close (probs, p->probs, tk, 1e-5, what, "probabilities");

  /* Tokens per expert: the choices before any drop, the same from the
   * layer as from its routing. */
  counts = gmlp_test_download_i64 (gmlp_routing_get_tokens_per_expert (routing), &n);
  g_assert_cmpuint (n, ==, c->E);
  layer_counts = gmlp_test_download_i64 (layer_tokens, &n);
  g_assert_cmpuint (n, ==, c->E);
  for (i = 0; i < c->E; i++)
    {
      g_assert_cmpint (counts[i], ==, p->counts[i]);
      g_assert_cmpint (layer_counts[i], ==, p->counts[i]);
    }

  /* The losses: the layer's aux loss is the routing's. */
  if (p->aux == 0.0)   /* no coefficient, or no tokens: exactly 0 */
    gmlp_assert_same_value (gmlp_test_download_scalar (layer_aux), 0.0, "aux loss", 0);
  else
    g_assert_cmpfloat_with_epsilon (gmlp_test_download_scalar (layer_aux), p->aux, 1e-5 * fabs (p->aux));
  gmlp_assert_same_value (gmlp_test_download_scalar (layer_aux),
                          gmlp_test_download_scalar (gmlp_routing_get_aux_loss (routing)),
                          "aux loss of the routing", 0);
  if (p->z == 0.0)
    gmlp_assert_same_value (gmlp_test_download_scalar (gmlp_routing_get_z_loss (routing)), 0.0, "z loss", 0);
  else
    g_assert_cmpfloat_with_epsilon (gmlp_test_download_scalar (gmlp_routing_get_z_loss (routing)), p->z,
                                    1e-5 * fabs (p->z));
}

void
step_clear (Step *s)
{
  g_clear_object (&s->y);
  g_clear_object (&s->dx);
}

void
run_step (Problem      *p,
          GmlpDevice   *device,
          GmlpMoELayer *layer,
          gboolean      offload,
          Step         *out)
{
  g_autoptr(GmlpGroupedTensor) x = gmlp_test_upload_values (device, p->x, p->T, p->H, p->dtype);
  g_autoptr(GmlpGroupedTensor) dy = gmlp_test_upload_values (device, p->dy, p->T, p->H, p->dtype);
  g_autoptr(GmlpOffloadContext) oc = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GError) error = NULL;

  if (offload)
    {
      oc = gmlp_offload_context_new (device, &error);
      g_assert_no_error (error);
      gmlp_offload_context_push_thread_default (oc, TRUE);
    }
  out->y = gmlp_moe_layer_forward (layer, x, &saved, &error);
  g_assert_no_error (error);
  g_assert_nonnull (out->y);
  if (offload)
    {
      g_assert_true (gmlp_offload_context_pop_thread_default (oc, &error));
      g_assert_no_error (error);
      g_assert_true (gmlp_saved_activations_get_offload (saved));
      gmlp_offload_context_flush (oc);
    }
  g_assert_false (gmlp_saved_activations_is_consumed (saved));
  out->dx = gmlp_moe_layer_backward (layer, saved, dy, &error);
  g_assert_no_error (error);
  g_assert_nonnull (out->dx);
  g_assert_true (gmlp_saved_activations_is_consumed (saved));
}

/* A step's results against the reference: the routing, y, dx, and the
 * gradients unless the layer delays them or @check_grads is FALSE. */
void
check_step (Problem      *p,
            GmlpMoELayer *layer,
            Step         *s,
            gboolean      check_grads,
            const char   *what)
{
  g_autofree double *y = NULL, *dx = NULL, *dwg = NULL;
  gsize n;

  assert_routing (p, layer, what);
  g_assert_cmpint (gmlp_grouped_tensor_get_dtype (s->y), ==, p->dtype);
  g_assert_cmpint (gmlp_grouped_tensor_get_n_groups (s->y), ==, 1);
  g_assert_cmpint (gmlp_grouped_tensor_get_total_rows (s->y), ==, p->T);
  g_assert_cmpint (gmlp_grouped_tensor_get_cols (s->y), ==, p->H);
  g_assert_cmpint (gmlp_grouped_tensor_get_dtype (s->dx), ==, p->dtype);
  g_assert_cmpint (gmlp_grouped_tensor_get_n_groups (s->dx), ==, 1);
  g_assert_cmpint (gmlp_grouped_tensor_get_total_rows (s->dx), ==, p->T);
  g_assert_cmpint (gmlp_grouped_tensor_get_cols (s->dx), ==, p->H);

  y = gmlp_test_download (s->y, &n);
  assert_close (y, p->y, n, tolerance (p->dtype), what, "y");
  dx = gmlp_test_download (s->dx, &n);
  assert_close (dx, p->dx, n, tolerance (p->dtype), what, "dx");
  if (!check_grads)
    return;

  assert_mlp_grads (gmlp_moe_layer_get_experts (layer), p->dexperts, p->dtype, NULL, what, "experts'");
  assert_empty_experts_zero (gmlp_moe_layer_get_experts (layer), p);
  if (p->shared != NULL)
    assert_mlp_grads (gmlp_moe_layer_get_shared_expert (layer), p->dshared, p->dtype, NULL, what, "shared");
  dwg = router_grad (gmlp_moe_layer_get_router (layer), &n);
  g_assert_cmpuint (n, ==, p->c->E * p->H);
  assert_close (dwg, p->dwg, n, router_tolerance (p->dtype), what, "router dW");
}

void
run_and_check (Problem      *p,
               GmlpDevice   *device,
               GmlpMoELayer *layer,
               const char   *what)
{
  g_auto(Step) s = { NULL, };

  run_step (p, device, layer, FALSE, &s);
  check_step (p, layer, &s, TRUE, what);
}
