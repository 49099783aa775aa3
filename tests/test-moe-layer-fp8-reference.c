/* test-moe-layer-fp8-reference.c: the float64 reference of an FP8 MoE layer
 *
 * The experts' MLPs with their operands quantized as the recipes quantize
 * them, and a problem's step (see test-moe-layer-fp8.c), its router
 * gmlp-test-router-ref.c's with Mixtral's configuration.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "test-moe-layer-fp8.h"

/* Biases in FP32 layers only: the routed experts' products (device sizes)
 * and the Hopper kernel add a bias to the FP32 product before its one
 * rounding, but cuBLAS and cuBLASLt (the shared expert's host-sizes
 * products: one group) add it to the product as stored, a second rounding
 * of a 16-bit output that the reference does not make and that the FP8
 * quantizations after it carry on (on the H200, 2.7 to 3.6% on the shared
 * expert's FC1 dW against a 2.5% bound). */
GmlpLinearFlags
layer_flags (GmlpDType dtype)
{
  return GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | (dtype == GMLP_DTYPE_FLOAT32 ? GMLP_LINEAR_BIAS : 0);
}

/* Mixtral's router, the layer's default: a softmax over the experts, the
 * top k renormalized. */
static const GmlpTestRouterSpec mixtral = {
  .score = GMLP_SCORE_FUNCTION_SOFTMAX, .before = TRUE, .renorm = TRUE, .scale = 1.0, .E = N_EXPERTS, .k = TOP_K,
};

Mlp *
mlp_new (guint  n,
         gint64 ffn)
{
  Mlp *m = g_new0 (Mlp, 1);

  m->n = n;
  m->ffn = ffn;
  m->w1o = 2 * ffn;
  m->w1 = g_new0 (double, n * m->w1o * HIDDEN);
  m->b1 = g_new0 (double, n * m->w1o);
  m->w2 = g_new0 (double, n * HIDDEN * ffn);
  m->b2 = g_new0 (double, n * HIDDEN);
  return m;
}

void
mlp_free (Mlp *m)
{
  g_free (m->w1);
  g_free (m->b1);
  g_free (m->w2);
  g_free (m->b2);
  g_free (m);
}

static Mlp *
mlp_random (guint     n,
            gint64    ffn,
            GmlpDType dtype)
{
  Mlp *m = mlp_new (n, ffn);
  gint64 i;

  m->has_bias = (layer_flags (dtype) & GMLP_LINEAR_BIAS) != 0;
  for (i = 0; i < n * m->w1o * HIDDEN; i++)
    m->w1[i] = gmlp_test_normal (1.0 / sqrt ((double) HIDDEN), dtype);
  for (i = 0; i < n * HIDDEN * ffn; i++)
    m->w2[i] = gmlp_test_normal (1.0 / sqrt ((double) ffn), dtype);
  for (i = 0; i < n * m->w1o && m->has_bias; i++)
    m->b1[i] = gmlp_test_normal (0.5, dtype);
  for (i = 0; i < n * HIDDEN && m->has_bias; i++)
    m->b2[i] = gmlp_test_normal (0.2, dtype);
  return m;
}

void
quantizers_clear (Quantizers *qs)
{
  guint l, r;

  for (l = 0; l < 2; l++)
    for (r = 0; r < 3; r++)
      g_clear_object (&qs->q[l][r]);
}

void
quantizers_copy (Quantizers     *qs,
                 GmlpDevice     *device,
                 GmlpGroupedMLP *mlp)
{
  GmlpGroupedLinear *fc[2] = { gmlp_grouped_mlp_get_fc1 (mlp), gmlp_grouped_mlp_get_fc2 (mlp) };
  guint l, r;

  for (l = 0; l < 2; l++)
    for (r = 0; r < 3; r++)
      {
        GmlpQuantizer *q = gmlp_grouped_linear_get_quantizer (fc[l], all_roles[r]);

        g_assert_nonnull (q);
        qs->q[l][r] = gmlp_test_copy_quantizer (device, q);
      }
}

/* @values (n groups of rows[g] × cols, packed, representable in @dtype)
 * quantized by @q and decoded: the rowwise values, and in *copy (when
 * given) those of the columnwise copy, in the same order. Without @q, the
 * values themselves. */
static double *
fake_quantize (GmlpQuantizer *q,
               GmlpDevice    *device,
               GmlpDType      dtype,
               const double  *values,
               const gint64  *rows,
               guint          n,
               gint64         cols,
               double       **copy)
{
  g_autoptr(GBytes) bytes = NULL;
  g_autoptr(GmlpGroupedTensor) t = NULL, t8 = NULL;
  g_autoptr(GError) error = NULL;
  gint64 total = 0;
  guint g;

  for (g = 0; g < n; g++)
    total += rows[g];
  if (q == NULL)
    {
      if (copy != NULL)
        *copy = g_memdup2 (values, sizeof (double) * MAX (total * cols, 1));
      return g_memdup2 (values, sizeof (double) * MAX (total * cols, 1));
    }

  bytes = gmlp_test_encode_values (values, (gsize) (total * cols), dtype);
  t = gmlp_grouped_tensor_new_from_bytes (device, dtype, rows, n, cols, bytes, &error);
  g_assert_no_error (error);
  t8 = gmlp_quantizer_quantize_full (q, t, copy != NULL, &error);
  g_assert_no_error (error);
  if (copy != NULL)
    {
      g_assert_nonnull (gmlp_grouped_tensor_get_columnwise (t8));
      *copy = gmlp_test_dequantize (gmlp_grouped_tensor_get_columnwise (t8));
    }
  return gmlp_test_dequantize (t8);
}

void
mlp_step_clear (MlpStep *s)
{
  g_clear_pointer (&s->y, g_free);
  g_clear_pointer (&s->dx, g_free);
  g_clear_pointer (&s->grad, mlp_free);
}

static void
round_all (double   *v,
           gsize     n,
           GmlpDType dtype)
{
  gsize i;

  for (i = 0; i < n; i++)
    v[i] = gmlp_test_round (v[i], dtype);
}

/* The operand of a weight gradient from the quantized @values (n_values)
 * or their @copy. */
static double *
wgrad_operand (WgradOperands  how,
               const double  *values,
               double        *copy,
               gsize          n_values)
{
  double *v;
  gsize i;

  if (how == WGRAD_COPIES)
    return copy;
  g_assert_null (copy);
  v = g_memdup2 (values, sizeof (double) * MAX (n_values, 1));
  for (i = 0; i < n_values && how == WGRAD_DEQUANTIZED; i++)
    v[i] = gmlp_test_round ((double) (float) v[i], GMLP_DTYPE_BFLOAT16);
  return v;
}

/* One FP8 step of a SwiGLU GroupedMLP over packed rows (rows[g] of group
 * g) for the output gradient gy, in float64: the operands of each product
 * quantized by @qs (none: not quantized), the weight gradients from the
 * operands @wgrad says. */
static void
mlp_reference (const Mlp    *m,
               Quantizers   *qs,
               WgradOperands wgrad,
               GmlpDevice   *device,
               GmlpDType     dtype,
               const gint64 *rows,
               const double *x,
               const double *gy,
               MlpStep      *out)
{
#define Q(l, r) (qs != NULL ? qs->q[l][r] : NULL)
  const guint n = m->n;
  const gint64 F = m->ffn, W1O = m->w1o;
  g_autofree gint64 *w1_rows = g_new (gint64, n), *w2_rows = g_new (gint64, n);
  g_autofree double *xq = NULL, *xw = NULL, *w1q = NULL, *aq = NULL, *aw = NULL, *w2q = NULL;
  g_autofree double *gyq = NULL, *gyw = NULL, *dhq = NULL, *dhw = NULL;
  g_autofree double *h = NULL, *a = NULL, *da = NULL, *dh = NULL;
  const gboolean copies = wgrad == WGRAD_COPIES;
  gint64 R = 0, r, c;
  guint g;

  for (g = 0; g < n; g++)
    {
      R += rows[g];
      w1_rows[g] = W1O;
      w2_rows[g] = HIDDEN;
    }
  h = g_new (double, MAX (R * W1O, 1));
  a = g_new (double, MAX (R * F, 1));
  da = g_new (double, MAX (R * F, 1));
  dh = g_new (double, MAX (R * W1O, 1));
  out->y = g_new (double, MAX (R * HIDDEN, 1));
  out->dx = g_new (double, MAX (R * HIDDEN, 1));
  out->grad = mlp_new (n, F);
  out->grad->has_bias = m->has_bias;

  /* Forward: h = x W1ᵀ + b1, a = silu (h_gate) h_lin, y = a W2ᵀ + b2, each
   * stored in dtype; FC2's input quantized from a as stored. */
  xq = fake_quantize (Q (0, 0), device, dtype, x, rows, n, HIDDEN, copies ? &xw : NULL);
  w1q = fake_quantize (Q (0, 1), device, dtype, m->w1, w1_rows, n, HIDDEN, NULL);
  gmlp_test_linear_reference (rows, n, HIDDEN, W1O, xq, w1q, m->b1, NULL, NULL, h, NULL, NULL, NULL);
  round_all (h, R * W1O, dtype);
  for (r = 0; r < R; r++)
    for (c = 0; c < F; c++)
      a[r * F + c] = gmlp_test_round (gmlp_test_act (GMLP_ACTIVATION_SWIGLU, h[r * W1O + c]) *
                                      h[r * W1O + F + c], dtype);
  aq = fake_quantize (Q (1, 0), device, dtype, a, rows, n, F, copies ? &aw : NULL);
  w2q = fake_quantize (Q (1, 1), device, dtype, m->w2, w2_rows, n, F, NULL);

  /* FC2: y, da = gy W2, db2 = Σ gy (unquantized). */
  gyq = fake_quantize (Q (1, 2), device, dtype, gy, rows, n, HIDDEN, copies ? &gyw : NULL);
  aw = wgrad_operand (wgrad, aq, aw, R * F);
  gyw = wgrad_operand (wgrad, gyq, gyw, R * HIDDEN);
  gmlp_test_linear_reference (rows, n, F, HIDDEN, aq, w2q, m->b2, gyq, gy, out->y, da, NULL,
                              out->grad->b2);
  gmlp_test_linear_reference (rows, n, F, HIDDEN, aw, w2q, NULL, gyw, NULL, NULL, NULL, out->grad->w2, NULL);
  round_all (out->y, R * HIDDEN, dtype);
  round_all (da, R * F, dtype);

  /* The activation's gradient from h, in dtype. */
  for (r = 0; r < R; r++)
    for (c = 0; c < F; c++)
      {
        double hg = h[r * W1O + c], hl = h[r * W1O + F + c], d = da[r * F + c];

        dh[r * W1O + c] = gmlp_test_round (d * hl * gmlp_test_act_grad (GMLP_ACTIVATION_SWIGLU, hg), dtype);
        dh[r * W1O + F + c] = gmlp_test_round (d * gmlp_test_act (GMLP_ACTIVATION_SWIGLU, hg), dtype);
      }

  /* FC1: dx = dh W1, db1 = Σ dh (unquantized), dW1. */
  dhq = fake_quantize (Q (0, 2), device, dtype, dh, rows, n, W1O, copies ? &dhw : NULL);
  xw = wgrad_operand (wgrad, xq, xw, R * HIDDEN);
  dhw = wgrad_operand (wgrad, dhq, dhw, R * W1O);
  gmlp_test_linear_reference (rows, n, HIDDEN, W1O, xq, w1q, NULL, dhq, dh, NULL, out->dx, NULL,
                              out->grad->b1);
  gmlp_test_linear_reference (rows, n, HIDDEN, W1O, xw, w1q, NULL, dhw, NULL, NULL, NULL, out->grad->w1, NULL);
  round_all (out->dx, R * HIDDEN, dtype);
  /* The gradients as stored, in dtype. */
  round_all (out->grad->w1, n * W1O * HIDDEN, dtype);
  round_all (out->grad->b1, n * W1O, dtype);
  round_all (out->grad->w2, n * HIDDEN * F, dtype);
  round_all (out->grad->b2, n * HIDDEN, dtype);
#undef Q
}

void
step_clear (Step *s)
{
  g_clear_pointer (&s->idx, g_free);
  g_clear_pointer (&s->probs, g_free);
  g_clear_pointer (&s->y, g_free);
  g_clear_pointer (&s->dx, g_free);
  g_clear_pointer (&s->dwg, g_free);
  g_clear_pointer (&s->dexperts, mlp_free);
  g_clear_pointer (&s->dshared, mlp_free);
}

void
problem_free (Problem *p)
{
  g_free (p->x);
  g_free (p->dy);
  g_free (p->wg);
  g_clear_pointer (&p->experts, mlp_free);
  g_clear_pointer (&p->shared, mlp_free);
  g_free (p);
}

/* Fresh parameters; the problem's data come with problem_draw(). */
Problem *
problem_new (const Config *c,
             GmlpDType     dtype)
{
  Problem *p = g_new0 (Problem, 1);

  p->c = c;
  p->dtype = dtype;
  p->wg = gmlp_test_normals (N_EXPERTS * HIDDEN, 1.0 / sqrt ((double) HIDDEN), GMLP_DTYPE_FLOAT32);
  p->experts = mlp_random (N_EXPERTS, FFN, dtype);
  if (c->shared > 0)
    p->shared = mlp_random (1, c->shared, dtype);
  return p;
}

/* Fresh tokens, each drawn until its choices are clear by MARGIN, and a
 * fresh output gradient. */
void
problem_draw (Problem *p)
{
  g_autoptr(GmlpTestRouterToken) tok = gmlp_test_router_token_new (N_EXPERTS);
  double l[N_EXPERTS];
  gint64 t, i, tries;

  g_clear_pointer (&p->x, g_free);
  g_clear_pointer (&p->dy, g_free);
  p->x = g_new (double, T_TOKENS * HIDDEN);
  for (t = 0; t < T_TOKENS; t++)
    for (tries = 0;; tries++)
      {
        g_assert_cmpint (tries, <, 10000);
        for (i = 0; i < HIDDEN; i++)
          p->x[t * HIDDEN + i] = gmlp_test_normal (1.0, p->dtype);
        gmlp_test_router_ref_logits (p->x + t * HIDDEN, p->wg, N_EXPERTS, HIDDEN, l);
        gmlp_test_router_ref_route (&mixtral, l, NULL, tok);
        if (tok->margin >= MARGIN)
          break;
      }
  p->dy = gmlp_test_normals (T_TOKENS * HIDDEN, 1.0, p->dtype);
}

/* The reference step of the problem's data, the experts' operands
 * quantized by @experts_q and the shared expert's by @shared_q (NULL: not
 * quantized). */
void
problem_reference (const Problem *p,
                   Quantizers    *experts_q,
                   Quantizers    *shared_q,
                   WgradOperands  experts_wgrad,
                   WgradOperands  shared_wgrad,
                   GmlpDevice    *device,
                   Step          *out)
{
  const gint64 T = T_TOKENS, H = HIDDEN, pad = MAX (p->c->padding, 1);
  gint64 rows[N_EXPERTS] = { 0 }, start[N_EXPERTS], used[N_EXPERTS] = { 0 }, R = 0, t, i;
  g_autofree gint64 *row_of = g_new (gint64, T * TOP_K);
  g_autofree double *xp = NULL, *gyp = NULL, *gp = g_new0 (double, T * TOP_K);
  g_autofree double *logits = g_new (double, T * N_EXPERTS);
  g_auto(MlpStep) routed = { NULL, }, shared = { NULL, };
  double dl[N_EXPERTS];
  guint e, j;

  step_clear (out);
  out->idx = g_new (gint64, T * TOP_K);
  out->probs = g_new (double, T * TOP_K);
  out->y = g_new0 (double, T * H);
  out->dx = g_new0 (double, T * H);
  out->dwg = g_new0 (double, N_EXPERTS * H);

  /* The routing, then the permuted layout: expert by expert, tokens in
   * order, each expert's rows padded up to the padding with zero rows. */
  for (t = 0; t < T; t++)
    gmlp_test_router_ref_logits (p->x + t * H, p->wg, N_EXPERTS, H, logits + t * N_EXPERTS);
  gmlp_test_router_ref_forward (&mixtral, T, logits, NULL, out->idx, out->probs, NULL, NULL, NULL);
  for (i = 0; i < T * TOP_K; i++)
    rows[out->idx[i]]++;
  for (e = 0; e < N_EXPERTS; e++)
    {
      rows[e] = (rows[e] + pad - 1) / pad * pad;
      start[e] = R;
      R += rows[e];
    }
  xp = g_new0 (double, MAX (R * H, 1));
  gyp = g_new0 (double, MAX (R * H, 1));
  for (t = 0; t < T; t++)
    for (j = 0; j < TOP_K; j++)
      {
        gint64 row;

        e = (guint) out->idx[t * TOP_K + j];
        row = row_of[t * TOP_K + j] = start[e] + used[e]++;
        /* The expert's output gradient, p dy[t], computed in FP32 from the
         * FP32 probability and stored in dtype. */
        for (i = 0; i < H; i++)
          {
            xp[row * H + i] = p->x[t * H + i];
            gyp[row * H + i] = gmlp_test_round ((double) (float) ((double) (float) out->probs[t * TOP_K + j] *
                                                                   p->dy[t * H + i]), p->dtype);
          }
      }

  mlp_reference (p->experts, experts_q, experts_wgrad, device, p->dtype, rows, xp, gyp, &routed);
  out->dexperts = g_steal_pointer (&routed.grad);
  if (p->shared != NULL)
    {
      gint64 all = T;

      mlp_reference (p->shared, shared_q, shared_wgrad, device, p->dtype, &all, p->x, p->dy, &shared);
      out->dshared = g_steal_pointer (&shared.grad);
    }

  /* Combine (then the shared expert's output added to it as stored), the
   * gradients of the probabilities, and dx through the permutation. */
  for (t = 0; t < T; t++)
    {
      for (i = 0; i < H; i++)
        {
          double acc = 0.0;

          for (j = 0; j < TOP_K; j++)
            acc += out->probs[t * TOP_K + j] * routed.y[row_of[t * TOP_K + j] * H + i];
          out->y[t * H + i] = gmlp_test_round (acc, p->dtype);
          if (p->shared != NULL)
            out->y[t * H + i] = gmlp_test_round (out->y[t * H + i] + shared.y[t * H + i], p->dtype);
        }
      for (j = 0; j < TOP_K; j++)
        {
          gint64 row = row_of[t * TOP_K + j];

          for (i = 0; i < H; i++)
            {
              gp[t * TOP_K + j] += p->dy[t * H + i] * routed.y[row * H + i];
              out->dx[t * H + i] += routed.dx[row * H + i];
            }
        }

      /* The router: dl, dWg += dlᵀ x; dx: the permutation's (as stored)
       * plus the router's (dl Wg, as stored), then the shared expert's,
       * each sum stored. */
      gmlp_test_router_ref_token_backward (&mixtral, logits + t * N_EXPERTS, out->idx + t * TOP_K, gp + t * TOP_K,
                                           NULL, 0.0, dl);
      for (i = 0; i < H; i++)
        {
          double through_router = 0.0;

          for (e = 0; e < N_EXPERTS; e++)
            {
              through_router += dl[e] * p->wg[e * H + i];
              out->dwg[e * H + i] += dl[e] * p->x[t * H + i];
            }
          out->dx[t * H + i] = gmlp_test_round (gmlp_test_round (out->dx[t * H + i], p->dtype) +
                                                gmlp_test_round (through_router, p->dtype), p->dtype);
          if (p->shared != NULL)
            out->dx[t * H + i] = gmlp_test_round (out->dx[t * H + i] + shared.dx[t * H + i], p->dtype);
        }
    }
}
