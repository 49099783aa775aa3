/* test-moe-layer-fp8.c: GmlpMoELayer with FP8 recipes
 *
 * A layer step (forward and backward) with each recipe, FP32 and BF16
 * layers, with and without padding and a shared expert, against a float64
 * reference of the dense formulation in which the experts' operands are
 * quantized as the library quantizes them. The routing is Mixtral's (the
 * softmax over every expert, the top-k renormalized) and stays FP32; the
 * tokens are drawn until every token's choices are clear by a margin, so
 * that the library's FP32 routing equals the float64 one. The reference
 * permutes the tokens expert by expert as the layer does (padding rows
 * included: with expert biases FC1 turns them into rows of act(b1), which
 * FC2's input quantizer sees), and runs each MLP group by group: x, W1,
 * the activation, W2, and the output gradients of FC2 and FC1 are
 * quantized by copies of the layer's own quantizers (their settings and
 * state, so the same bytes; delayed scaling after an update too) and
 * decoded independently of the library (gmlp_test_dequantize()); products
 * in float64, the intermediates rounded to the layer's dtype as it stores
 * them; the weight gradients from the operands the layer's weight
 * gradients read (the columnwise copies where blockwise multiplies FP8
 * there, the operands dequantized to BF16 where the layer multiplies
 * those). The bias gradients come from the unquantized gradients.
 *
 * What is left is the FP32 sums and the rare element that the layer and
 * the reference, whose FP32 and float64 intermediates differ in the last
 * bits, quantize one FP8 step apart: tolerance_fp8(). The same step
 * against the reference without quantization must be further off than
 * that, so that the check can tell. Outputs are poisoned first
 * (GMLP_DEBUG=poison: fresh memory holds NaN).
 *
 * Then the FP8 API: the recipe and format as construct properties and by
 * set_fp8_recipe() on both MLPs, notifications; every recipe with every
 * padding; what is refused (an unknown recipe or format, E5M2 with a
 * per-tensor recipe, widths that are not multiples of 16, in the experts
 * or only in the shared expert: both MLPs unchanged); a recipe changed
 * between a forward and its backward.
 *
 * Every test runs on the CPU and on CUDA against the same references.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <locale.h>
#include <math.h>
#include <string.h>

#include "gmlp-test-util.h"
#include "gmlp-quantizer-private.h"

#define T_TOKENS  128
#define HIDDEN    32
#define FFN       32
#define N_EXPERTS 4
#define TOP_K     2
#define MARGIN    1e-4

static const GmlpScalingRecipe all_recipes[] = {
  GMLP_SCALING_RECIPE_DELAYED, GMLP_SCALING_RECIPE_CURRENT,
  GMLP_SCALING_RECIPE_BLOCKWISE, GMLP_SCALING_RECIPE_MXFP8,
};
static const GmlpQuantizerRole all_roles[] = {
  GMLP_QUANTIZER_ROLE_INPUT, GMLP_QUANTIZER_ROLE_WEIGHT, GMLP_QUANTIZER_ROLE_GRAD_OUTPUT,
};

/* Biases in FP32 layers only: the routed experts' products (device sizes)
 * and the Hopper kernel add a bias to the FP32 product before its one
 * rounding, but cuBLAS and cuBLASLt (the shared expert's host-sizes
 * products: one group) add it to the product as stored, a second rounding
 * of a 16-bit output that the reference does not make and that the FP8
 * quantizations after it carry on (on the H200, 2.7 to 3.6% on the shared
 * expert's FC1 dW against a 2.5% bound). */
static GmlpLinearFlags
layer_flags (GmlpDType dtype)
{
  return GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | (dtype == GMLP_DTYPE_FLOAT32 ? GMLP_LINEAR_BIAS : 0);
}

typedef struct {
  const char *name;
  guint       padding;
  gint64      shared;     /* shared-expert-ffn-hidden */
} Config;

static const Config configs[] = {
  { "plain", 0, 0 },
  { "padding16-shared", 16, 16 },
  { "padding128", 128, 0 },
  { "padding32-shared", 32, 48 },
};

/* ---- The float64 router (Mixtral's) ------------------------------------- */

typedef struct {
  double sm[N_EXPERTS];
  guint  idx[TOP_K];
  double p[TOP_K];
  double margin;    /* the smallest gap between the top k + 1 */
} Route;

static void
route_token (const double *l,
             Route        *r)
{
  double m = -INFINITY, sum = 0.0;
  guint order[TOP_K + 1], e, j;

  for (e = 0; e < N_EXPERTS; e++)
    m = fmax (m, l[e]);
  for (e = 0; e < N_EXPERTS; e++)
    sum += r->sm[e] = exp (l[e] - m);
  for (e = 0; e < N_EXPERTS; e++)
    r->sm[e] /= sum;

  /* The best k + 1, best first, the lower index on ties. */
  for (j = 0; j < MIN (TOP_K + 1, N_EXPERTS); j++)
    {
      gint pick = -1;

      for (e = 0; e < N_EXPERTS; e++)
        {
          gboolean taken = FALSE;
          guint q;

          for (q = 0; q < j; q++)
            taken |= order[q] == e;
          if (!taken && (pick < 0 || r->sm[e] > r->sm[pick]))
            pick = (gint) e;
        }
      order[j] = (guint) pick;
    }
  r->margin = INFINITY;
  for (j = 0; j + 1 < MIN (TOP_K + 1, N_EXPERTS); j++)
    r->margin = fmin (r->margin, r->sm[order[j]] - r->sm[order[j + 1]]);

  sum = 0.0;
  for (j = 0; j < TOP_K; j++)
    {
      r->idx[j] = order[j];
      sum += r->sm[order[j]];
    }
  for (j = 0; j < TOP_K; j++)
    r->p[j] = r->sm[r->idx[j]] / sum;
}

/* d(Σ_j gp_j p_j) / d(logits), the choices held fixed: through the
 * renormalization and the softmax. */
static void
route_token_backward (const Route  *r,
                      const double *gp,
                      double       *dl)
{
  double ds[N_EXPERTS] = { 0.0 }, sum = 0.0, dot = 0.0, dot_sm = 0.0;
  guint j, e;

  for (j = 0; j < TOP_K; j++)
    {
      sum += r->sm[r->idx[j]];
      dot += gp[j] * r->sm[r->idx[j]];
    }
  for (j = 0; j < TOP_K; j++)
    ds[r->idx[j]] = (gp[j] * sum - dot) / (sum * sum);
  for (e = 0; e < N_EXPERTS; e++)
    dot_sm += r->sm[e] * ds[e];
  for (e = 0; e < N_EXPERTS; e++)
    dl[e] = r->sm[e] * (ds[e] - dot_sm);
}

/* ---- The float64 experts, quantized as the layer quantizes ------------- */

/* An MLP's parameters as stored (n groups, SwiGLU: FC1 is 2 × ffn wide),
 * or its gradients. */
typedef struct {
  guint    n;
  gint64   ffn, w1o;
  gboolean has_bias;
  double  *w1, *b1, *w2, *b2;   /* n × w1o × H, n × w1o, n × H × ffn, n × H (0 without bias) */
} Mlp;

static Mlp *
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

static void
mlp_free (Mlp *m)
{
  g_free (m->w1);
  g_free (m->b1);
  g_free (m->w2);
  g_free (m->b2);
  g_free (m);
}
G_DEFINE_AUTOPTR_CLEANUP_FUNC (Mlp, mlp_free)

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

/* The quantizers of an FP8 MLP, [layer][role] (FC1, FC2): copies of the
 * layer's, taken before the step. */
typedef struct {
  GmlpQuantizer *q[2][3];
} Quantizers;

static void
quantizers_clear (Quantizers *qs)
{
  guint l, r;

  for (l = 0; l < 2; l++)
    for (r = 0; r < 3; r++)
      g_clear_object (&qs->q[l][r]);
}

static void
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

typedef struct {
  double *y, *dx;      /* R × H */
  Mlp    *grad;
} MlpStep;

static void
mlp_step_clear (MlpStep *s)
{
  g_clear_pointer (&s->y, g_free);
  g_clear_pointer (&s->dx, g_free);
  g_clear_pointer (&s->grad, mlp_free);
}
G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (MlpStep, mlp_step_clear)

static void
round_all (double   *v,
           gsize     n,
           GmlpDType dtype)
{
  gsize i;

  for (i = 0; i < n; i++)
    v[i] = gmlp_test_round (v[i], dtype);
}

/* What the weight gradients multiply: the quantized operands (per-tensor
 * scales: their columnwise copies hold the same values), the columnwise
 * copies (blockwise, whose copies have blocks of their own), or the
 * quantized operands dequantized to BF16 (where no FP8 product takes
 * them: the CPU's device sizes, MXFP8; the layer's FP32 and BF16 dequantize
 * to BF16). */
typedef enum {
  WGRAD_QUANTIZED,
  WGRAD_COPIES,
  WGRAD_DEQUANTIZED,
} WgradOperands;

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

/* ---- A problem: parameters, data and the reference of a layer step ----- */

typedef struct {
  const Config *c;
  GmlpDType     dtype;
  double       *x, *dy;   /* T × H */
  double       *wg;       /* E × H, FP32 */
  Mlp          *experts, *shared;
} Problem;

/* The reference of a step, or what the layer gave (no routes then). */
typedef struct {
  Route  *routes;   /* T */
  double *y, *dx, *dwg;
  Mlp    *dexperts, *dshared;
} Step;

static void
step_clear (Step *s)
{
  g_clear_pointer (&s->routes, g_free);
  g_clear_pointer (&s->y, g_free);
  g_clear_pointer (&s->dx, g_free);
  g_clear_pointer (&s->dwg, g_free);
  g_clear_pointer (&s->dexperts, mlp_free);
  g_clear_pointer (&s->dshared, mlp_free);
}
G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (Step, step_clear)

static void
problem_free (Problem *p)
{
  g_free (p->x);
  g_free (p->dy);
  g_free (p->wg);
  g_clear_pointer (&p->experts, mlp_free);
  g_clear_pointer (&p->shared, mlp_free);
  g_free (p);
}
G_DEFINE_AUTOPTR_CLEANUP_FUNC (Problem, problem_free)

static void
logits_of (const Problem *p,
           gint64         t,
           double        *l)
{
  guint e;
  gint64 i;

  for (e = 0; e < N_EXPERTS; e++)
    {
      l[e] = 0.0;
      for (i = 0; i < HIDDEN; i++)
        l[e] += p->x[t * HIDDEN + i] * p->wg[e * HIDDEN + i];
    }
}

/* Fresh parameters; the problem's data come with problem_draw(). */
static Problem *
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
static void
problem_draw (Problem *p)
{
  double l[N_EXPERTS];
  Route r;
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
        logits_of (p, t, l);
        route_token (l, &r);
        if (r.margin >= MARGIN)
          break;
      }
  p->dy = gmlp_test_normals (T_TOKENS * HIDDEN, 1.0, p->dtype);
}

/* The reference step of the problem's data, the experts' operands
 * quantized by @experts_q and the shared expert's by @shared_q (NULL: not
 * quantized). */
static void
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
  g_auto(MlpStep) routed = { NULL, }, shared = { NULL, };
  double l[N_EXPERTS], dl[N_EXPERTS];
  guint e, j;

  step_clear (out);
  out->routes = g_new (Route, T);
  out->y = g_new0 (double, T * H);
  out->dx = g_new0 (double, T * H);
  out->dwg = g_new0 (double, N_EXPERTS * H);

  /* The permuted layout: expert by expert, tokens in order, each expert's
   * rows padded up to the padding with zero rows. */
  for (t = 0; t < T; t++)
    {
      logits_of (p, t, l);
      route_token (l, &out->routes[t]);
      for (j = 0; j < TOP_K; j++)
        rows[out->routes[t].idx[j]]++;
    }
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

        e = out->routes[t].idx[j];
        row = row_of[t * TOP_K + j] = start[e] + used[e]++;
        /* The expert's output gradient, p dy[t], computed in FP32 from the
         * FP32 probability and stored in dtype. */
        for (i = 0; i < H; i++)
          {
            xp[row * H + i] = p->x[t * H + i];
            gyp[row * H + i] = gmlp_test_round ((double) (float) ((double) (float) out->routes[t].p[j] *
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
            acc += out->routes[t].p[j] * routed.y[row_of[t * TOP_K + j] * H + i];
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
      route_token_backward (&out->routes[t], gp + t * TOP_K, dl);
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

/* ---- The library side ---------------------------------------------------- */

static void
set_mlp (GmlpGroupedMLP *mlp,
         const Mlp      *m)
{
  gmlp_test_set_linear (gmlp_grouped_mlp_get_fc1 (mlp), m->w1, m->b1);
  gmlp_test_set_linear (gmlp_grouped_mlp_get_fc2 (mlp), m->w2, m->b2);
}

/* A layer of the configuration with @recipe given at construction (NONE:
 * none), and @flags besides the dtype's. */
static GmlpMoELayer *
layer_new_flags (GmlpDevice        *device,
                 const Config      *c,
                 GmlpDType          dtype,
                 GmlpScalingRecipe  recipe,
                 GmlpLinearFlags    flags,
                 GError           **error)
{
  return g_initable_new (GMLP_TYPE_MOE_LAYER, NULL, error,
                         "device", device,
                         "hidden", (gint64) HIDDEN,
                         "ffn-hidden", (gint64) FFN,
                         "n-experts", (guint) N_EXPERTS,
                         "top-k", (guint) TOP_K,
                         "activation", GMLP_ACTIVATION_SWIGLU,
                         "dtype", dtype,
                         "flags", layer_flags (dtype) | flags,
                         "padding", c->padding,
                         "shared-expert-ffn-hidden", c->shared,
                         "fp8-recipe", recipe,
                         NULL);
}

static GmlpMoELayer *
layer_new (GmlpDevice        *device,
           const Config      *c,
           GmlpDType          dtype,
           GmlpScalingRecipe  recipe,
           GError           **error)
{
  return layer_new_flags (device, c, dtype, recipe, GMLP_LINEAR_NONE, error);
}

/* A layer holding the problem's parameters, with @flags besides the
 * dtype's. */
static GmlpMoELayer *
problem_layer_flags (Problem           *p,
                     GmlpDevice        *device,
                     GmlpScalingRecipe  recipe,
                     GmlpLinearFlags    flags)
{
  g_autoptr(GError) error = NULL;
  GmlpMoELayer *layer = layer_new_flags (device, p->c, p->dtype, recipe, flags, &error);
  g_autoptr(GBytes) wb = gmlp_test_encode_values (p->wg, N_EXPERTS * HIDDEN, GMLP_DTYPE_FLOAT32);

  g_assert_no_error (error);
  g_assert_nonnull (layer);
  g_assert_true (gmlp_router_set_weight_from_bytes (gmlp_moe_layer_get_router (layer), wb, &error));
  g_assert_no_error (error);
  set_mlp (gmlp_moe_layer_get_experts (layer), p->experts);
  if (p->shared != NULL)
    set_mlp (gmlp_moe_layer_get_shared_expert (layer), p->shared);
  return layer;
}

static GmlpMoELayer *
problem_layer (Problem           *p,
               GmlpDevice        *device,
               GmlpScalingRecipe  recipe)
{
  return problem_layer_flags (p, device, recipe, GMLP_LINEAR_NONE);
}

static Mlp *
download_grads (GmlpGroupedMLP *mlp)
{
  GmlpGroupedLinear *fc1 = gmlp_grouped_mlp_get_fc1 (mlp), *fc2 = gmlp_grouped_mlp_get_fc2 (mlp);
  Mlp *m = mlp_new (gmlp_grouped_linear_get_n_groups (fc1), gmlp_grouped_linear_get_in_features (fc2));
  double **slots[4] = { &m->w1, &m->b1, &m->w2, &m->b2 };
  GmlpGroupedTensor *t[4] = {
    gmlp_grouped_linear_get_wgrad (fc1), gmlp_grouped_linear_get_bgrad (fc1),
    gmlp_grouped_linear_get_wgrad (fc2), gmlp_grouped_linear_get_bgrad (fc2),
  };
  gsize want[4] = { m->n * m->w1o * HIDDEN, m->n * m->w1o, m->n * HIDDEN * m->ffn, m->n * HIDDEN };
  guint i;

  m->has_bias = (gmlp_grouped_linear_get_flags (fc1) & GMLP_LINEAR_BIAS) != 0;
  for (i = 0; i < 4; i++)
    {
      gsize n;

      if (!m->has_bias && (i == 1 || i == 3))
        {
          g_assert_null (t[i]);
          continue;
        }
      g_assert_nonnull (t[i]);
      g_free (*slots[i]);
      *slots[i] = gmlp_test_download (t[i], &n);
      g_assert_cmpuint (n, ==, want[i]);
    }
  return m;
}

/* A forward and backward of @layer on the problem's data, whose routing
 * must be @ref's. */
static void
run_step (const Problem *p,
          const Step    *ref,
          GmlpDevice    *device,
          GmlpMoELayer  *layer,
          Step          *got)
{
  g_autoptr(GmlpGroupedTensor) x = gmlp_test_upload_values (device, p->x, T_TOKENS, HIDDEN, p->dtype);
  g_autoptr(GmlpGroupedTensor) dy = gmlp_test_upload_values (device, p->dy, T_TOKENS, HIDDEN, p->dtype);
  g_autoptr(GmlpGroupedTensor) y = NULL, dx = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GmlpRouting) routing = NULL;
  g_autofree gint64 *idx = NULL;
  g_autofree double *probs = NULL;
  g_autoptr(GError) error = NULL;
  gsize n, q;

  y = gmlp_moe_layer_forward (layer, x, &saved, &error);
  g_assert_no_error (error);
  dx = gmlp_moe_layer_backward (layer, saved, dy, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_saved_activations_is_consumed (saved));

  /* The FP32 routing is the float64 one. */
  routing = gmlp_moe_layer_get_routing (layer);
  idx = gmlp_test_download_i64 (gmlp_routing_get_indices (routing), &n);
  probs = gmlp_test_download (gmlp_routing_get_probs (routing), NULL);
  g_assert_cmpuint (n, ==, T_TOKENS * TOP_K);
  for (q = 0; q < n; q++)
    {
      g_assert_cmpint (idx[q], ==, ref->routes[q / TOP_K].idx[q % TOP_K]);
      g_assert_cmpfloat_with_epsilon (probs[q], ref->routes[q / TOP_K].p[q % TOP_K], 1e-5);
    }

  got->y = gmlp_test_download (y, &n);
  g_assert_cmpuint (n, ==, T_TOKENS * HIDDEN);
  got->dx = gmlp_test_download (dx, &n);
  g_assert_cmpuint (n, ==, T_TOKENS * HIDDEN);
  got->dwg = gmlp_test_download (gmlp_router_get_wgrad (gmlp_moe_layer_get_router (layer)), &n);
  g_assert_cmpuint (n, ==, N_EXPERTS * HIDDEN);
  got->dexperts = download_grads (gmlp_moe_layer_get_experts (layer));
  if (p->shared != NULL)
    got->dshared = download_grads (gmlp_moe_layer_get_shared_expert (layer));
}

/* ---- Tolerances ------------------------------------------------------------ */

static gboolean
on_gpu (GmlpDevice *device)
{
  return gmlp_device_get_kind (device) != GMLP_DEVICE_KIND_CPU;
}

/* The FP8 step against its quantized reference (relative, in norm). On
 * the CPU the reference is exact but for the FP32 sums (about 2e-7) and
 * the rare element that the layer and the reference quantize one FP8 step
 * apart: their intermediates, FP32 and float64, can fall either side of
 * an FP8 rounding boundary, and each such element moves a few outputs by
 * up to an eighth of a term (an MXFP8 block whose amax straddles a power
 * of two moves 32 of them): up to 8e-3 in 5568 steps measured. On a GPU
 * the FP8 products keep about 14 bits in their partial sums (docs/fp8.md),
 * which makes such elements more frequent. The unquantized reference is
 * off by 3-9e-2 (the gate's gradient, where the experts' errors largely
 * cancel, by 2.5e-2 and more). */
static double
tolerance_fp8 (GmlpDevice *device)
{
  return on_gpu (device) ? 2.5e-2 : 1.5e-2;
}

/* The parts of a step checked so far: the largest error and where, and
 * how many times further the unquantized reference is, at least. */
typedef struct {
  const char *what;
  double      tol;
  double      worst;
  char       *worst_part;
  double      distance;
} Checks;

static void
check_part (Checks       *checks,
            const double *got,
            const double *want,
            const double *plain,
            gsize         n,
            const char   *part)
{
  g_autofree char *label = g_strdup_printf ("%s: %s", checks->what, part);
  double err = gmlp_test_relative_error (got, want, n, label);

  if (plain != NULL)
    checks->distance = MIN (checks->distance, gmlp_test_relative_error (plain, want, n, label) / MAX (err, 1e-30));
  if (err >= checks->worst)
    {
      checks->worst = err;
      g_free (checks->worst_part);
      checks->worst_part = g_strdup (part);
    }
  if (!(err <= checks->tol))
    g_error ("%s: relative error %.3g from the quantized float64 reference, beyond %.3g", label, err,
             checks->tol);
}

static void
check_mlp (Checks     *checks,
           const Mlp  *got,
           const Mlp  *want,
           const Mlp  *plain,
           const char *which)
{
  g_autofree char *w1 = g_strdup_printf ("%s fc1 dW", which), *w2 = g_strdup_printf ("%s fc2 dW", which);
  g_autofree char *b1 = g_strdup_printf ("%s fc1 db", which), *b2 = g_strdup_printf ("%s fc2 db", which);

  check_part (checks, got->w1, want->w1, plain->w1, want->n * want->w1o * HIDDEN, w1);
  check_part (checks, got->w2, want->w2, plain->w2, want->n * HIDDEN * want->ffn, w2);
  if (!want->has_bias)
    return;
  /* From the unquantized gradients: FC2's the same without FP8. */
  check_part (checks, got->b1, want->b1, plain->b1, want->n * want->w1o, b1);
  check_part (checks, got->b2, want->b2, NULL, want->n * HIDDEN, b2);
}

/* One step of @layer on fresh data against the quantized reference (made
 * with copies of the layer's quantizers as they are now), and the plain
 * reference further off. */
static void
check_step (Problem      *p,
            GmlpDevice   *device,
            GmlpMoELayer *layer,
            const char   *what)
{
  GmlpScalingRecipe recipe = gmlp_moe_layer_get_fp8_recipe (layer);
  /* What the weight gradients multiply (docs/fp8.md, "How each recipe
   * multiplies"). The shared expert's input has its size on the host: the
   * per-tensor recipes multiply FP8 everywhere, blockwise (its columnwise
   * copies) on the CPU and on Hopper. The routed experts' sizes are on the
   * device: FP8 on Hopper only (the CPU dequantizes). MXFP8 dequantizes
   * everywhere. */
  gboolean native = gmlp_test_fp8_native (device);
  WgradOperands fp8 = recipe == GMLP_SCALING_RECIPE_BLOCKWISE ? WGRAD_COPIES : WGRAD_QUANTIZED;
  WgradOperands shared_wgrad = recipe == GMLP_SCALING_RECIPE_MXFP8 ? WGRAD_DEQUANTIZED
                               : recipe == GMLP_SCALING_RECIPE_BLOCKWISE && !native ? WGRAD_DEQUANTIZED
                               : fp8;
  WgradOperands experts_wgrad = recipe == GMLP_SCALING_RECIPE_MXFP8 || !native || !on_gpu (device)
                                ? WGRAD_DEQUANTIZED : fp8;
  Quantizers eq = { { { NULL } } }, sq = { { { NULL } } };
  g_auto(Step) ref = { NULL, }, plain = { NULL, }, got = { NULL, };
  Checks checks = { what, tolerance_fp8 (device), 0.0, NULL, INFINITY };

  g_assert_cmpint (recipe, !=, GMLP_SCALING_RECIPE_NONE);
  problem_draw (p);
  quantizers_copy (&eq, device, gmlp_moe_layer_get_experts (layer));
  if (p->shared != NULL)
    quantizers_copy (&sq, device, gmlp_moe_layer_get_shared_expert (layer));
  problem_reference (p, &eq, p->shared != NULL ? &sq : NULL, experts_wgrad, shared_wgrad, device, &ref);
  /* The same data without quantization. */
  problem_reference (p, NULL, NULL, WGRAD_QUANTIZED, WGRAD_QUANTIZED, device, &plain);

  run_step (p, &ref, device, layer, &got);
  check_part (&checks, got.y, ref.y, plain.y, T_TOKENS * HIDDEN, "y");
  check_part (&checks, got.dx, ref.dx, plain.dx, T_TOKENS * HIDDEN, "dx");
  check_part (&checks, got.dwg, ref.dwg, plain.dwg, N_EXPERTS * HIDDEN, "router dW");
  check_mlp (&checks, got.dexperts, ref.dexperts, plain.dexperts, "experts'");
  if (p->shared != NULL)
    check_mlp (&checks, got.dshared, ref.dshared, plain.dshared, "shared");
  g_test_message ("%s: largest error %.2e (%s); the unquantized reference at least %.1fx further", what,
                  checks.worst, checks.worst_part, checks.distance);
  /* FP8 is what the reference models: without quantization, a reference
   * several times further off. */
  if (!(checks.distance >= 2.0))
    g_error ("%s: the unquantized reference is only %.2f times further off than the quantized one", what,
             checks.distance);
  g_free (checks.worst_part);
  quantizers_clear (&eq);
  quantizers_clear (&sq);
}

/* ---- Tests ---------------------------------------------------------------- */

/* Each recipe, FP32 and BF16, each configuration: the recipe given at
 * construction or set afterwards, two steps of fresh data with an update
 * of the quantizers between them (delayed scaling then has scales of its
 * own). */
static void
test_recipes (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  static const GmlpDType dtypes[] = { GMLP_DTYPE_FLOAT32, GMLP_DTYPE_BFLOAT16 };
  guint r, d, c;

  if (device == NULL)
    return;

  for (r = 0; r < G_N_ELEMENTS (all_recipes); r++)
    for (d = 0; d < G_N_ELEMENTS (dtypes); d++)
      for (c = 0; c < G_N_ELEMENTS (configs); c++)
        {
          GmlpScalingRecipe recipe = all_recipes[r];
          gboolean at_construction = (r + d + c) % 2 == 0;
          g_autoptr(Problem) p = problem_new (&configs[c], dtypes[d]);
          g_autoptr(GmlpMoELayer) layer = problem_layer (p, device, at_construction ? recipe
                                                                                     : GMLP_SCALING_RECIPE_NONE);
          g_autoptr(GError) error = NULL;
          guint step;

          if (!at_construction)
            {
              g_assert_true (gmlp_moe_layer_set_fp8_recipe (layer, recipe, GMLP_FP8_FORMAT_HYBRID, &error));
              g_assert_no_error (error);
            }
          g_assert_cmpint (gmlp_moe_layer_get_fp8_recipe (layer), ==, recipe);
          for (step = 0; step < 2; step++)
            {
              g_autofree char *what = g_strdup_printf ("%s %s %s step %u", gmlp_test_recipe_name (recipe),
                                                       gmlp_dtype_get_name (dtypes[d]), configs[c].name, step);

              check_step (p, device, layer, what);
              g_assert_true (gmlp_moe_layer_update_quantizers (layer, &error));
              g_assert_no_error (error);
            }
        }
}

static void
count_notify (GObject    *object,
              GParamSpec *pspec,
              gpointer    counter)
{
  (*(guint *) counter)++;
}

/* Every quantizer of @mlp has @recipe and @format (NONE: has none). */
static void
assert_mlp_recipe (GmlpGroupedMLP    *mlp,
                   GmlpScalingRecipe  recipe,
                   GmlpFp8Format      format)
{
  GmlpGroupedLinear *fc[2] = { gmlp_grouped_mlp_get_fc1 (mlp), gmlp_grouped_mlp_get_fc2 (mlp) };
  guint l, r;

  g_assert_cmpint (gmlp_grouped_mlp_get_fp8_recipe (mlp), ==, recipe);
  for (l = 0; l < 2; l++)
    for (r = 0; r < 3; r++)
      {
        GmlpQuantizer *q = gmlp_grouped_linear_get_quantizer (fc[l], all_roles[r]);

        if (recipe == GMLP_SCALING_RECIPE_NONE)
          {
            g_assert_null (q);
            continue;
          }
        g_assert_nonnull (q);
        g_assert_cmpint (gmlp_quantizer_get_recipe (q), ==, recipe);
        g_assert_cmpint (gmlp_quantizer_get_fp8_format (q), ==, format);
      }
}

/* fp8-recipe and fp8-format: construct properties, given to both MLPs,
 * notified when set_fp8_recipe() changes them; NONE; update_quantizers()
 * without quantizers. */
static void
test_properties (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpMoELayer) layer = NULL;
  g_autoptr(GError) error = NULL;
  GmlpScalingRecipe recipe;
  GmlpFp8Format format;
  guint notified = 0;

  if (device == NULL)
    return;

  layer = g_initable_new (GMLP_TYPE_MOE_LAYER, NULL, &error, "device", device, "hidden", (gint64) HIDDEN,
                          "ffn-hidden", (gint64) FFN, "n-experts", (guint) N_EXPERTS, "top-k", (guint) TOP_K,
                          "shared-expert-ffn-hidden", (gint64) 16,
                          "fp8-recipe", GMLP_SCALING_RECIPE_MXFP8, "fp8-format", GMLP_FP8_FORMAT_E4M3, NULL);
  g_assert_no_error (error);
  g_object_get (layer, "fp8-recipe", &recipe, "fp8-format", &format, NULL);
  g_assert_cmpint (recipe, ==, GMLP_SCALING_RECIPE_MXFP8);
  g_assert_cmpint (format, ==, GMLP_FP8_FORMAT_E4M3);
  g_assert_cmpint (gmlp_moe_layer_get_fp8_format (layer), ==, GMLP_FP8_FORMAT_E4M3);
  assert_mlp_recipe (gmlp_moe_layer_get_experts (layer), GMLP_SCALING_RECIPE_MXFP8, GMLP_FP8_FORMAT_E4M3);
  assert_mlp_recipe (gmlp_moe_layer_get_shared_expert (layer), GMLP_SCALING_RECIPE_MXFP8, GMLP_FP8_FORMAT_E4M3);
  /* The router has no quantizers: its gate stays FP32. */
  g_assert_cmpint (gmlp_grouped_tensor_get_dtype (gmlp_router_get_weight (gmlp_moe_layer_get_router (layer))), ==,
                   GMLP_DTYPE_FLOAT32);

  g_signal_connect (layer, "notify::fp8-recipe", G_CALLBACK (count_notify), &notified);
  g_signal_connect (layer, "notify::fp8-format", G_CALLBACK (count_notify), &notified);
  g_assert_true (gmlp_moe_layer_set_fp8_recipe (layer, GMLP_SCALING_RECIPE_MXFP8, GMLP_FP8_FORMAT_E4M3, &error));
  g_assert_no_error (error);
  g_assert_cmpuint (notified, ==, 0);
  g_assert_true (gmlp_moe_layer_set_fp8_recipe (layer, GMLP_SCALING_RECIPE_CURRENT, GMLP_FP8_FORMAT_E4M3, &error));
  g_assert_no_error (error);
  g_assert_cmpuint (notified, ==, 1);
  assert_mlp_recipe (gmlp_moe_layer_get_experts (layer), GMLP_SCALING_RECIPE_CURRENT, GMLP_FP8_FORMAT_E4M3);
  assert_mlp_recipe (gmlp_moe_layer_get_shared_expert (layer), GMLP_SCALING_RECIPE_CURRENT, GMLP_FP8_FORMAT_E4M3);

  g_assert_true (gmlp_moe_layer_set_fp8_recipe (layer, GMLP_SCALING_RECIPE_NONE, GMLP_FP8_FORMAT_HYBRID, &error));
  g_assert_no_error (error);
  g_assert_cmpuint (notified, ==, 3);
  g_assert_cmpint (gmlp_moe_layer_get_fp8_recipe (layer), ==, GMLP_SCALING_RECIPE_NONE);
  g_assert_cmpint (gmlp_moe_layer_get_fp8_format (layer), ==, GMLP_FP8_FORMAT_HYBRID);
  assert_mlp_recipe (gmlp_moe_layer_get_experts (layer), GMLP_SCALING_RECIPE_NONE, GMLP_FP8_FORMAT_HYBRID);
  assert_mlp_recipe (gmlp_moe_layer_get_shared_expert (layer), GMLP_SCALING_RECIPE_NONE, GMLP_FP8_FORMAT_HYBRID);
  g_assert_true (gmlp_moe_layer_update_quantizers (layer, &error));
  g_assert_no_error (error);
}

/* Every recipe with every padding, and a forward of each: nothing in the
 * FP8 passes needs the experts' rows aligned (the sizes stay on the
 * device). */
static void
test_any_padding (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  static const guint paddings[] = { 0, 1, 2, 16, 32, 64, 128 };
  g_autofree double *xv = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL;
  guint r, i;

  if (device == NULL)
    return;

  xv = gmlp_test_normals (T_TOKENS * HIDDEN, 1.0, GMLP_DTYPE_BFLOAT16);
  x = gmlp_test_upload_values (device, xv, T_TOKENS, HIDDEN, GMLP_DTYPE_BFLOAT16);
  for (r = 0; r < G_N_ELEMENTS (all_recipes); r++)
    for (i = 0; i < G_N_ELEMENTS (paddings); i++)
      {
        Config c = { "padding", paddings[i], 0 };
        g_autoptr(GError) error = NULL;
        g_autoptr(GmlpMoELayer) layer = layer_new (device, &c, GMLP_DTYPE_BFLOAT16, all_recipes[r], &error);
        g_autoptr(GmlpGroupedTensor) y = NULL;
        g_autofree double *yv = NULL;
        gsize n, q;

        g_assert_no_error (error);
        y = gmlp_moe_layer_forward (layer, x, NULL, &error);
        g_assert_no_error (error);
        yv = gmlp_test_download (y, &n);
        g_assert_cmpuint (n, ==, T_TOKENS * HIDDEN);
        for (q = 0; q < n; q++)
          g_assert_true (isfinite (yv[q]));
      }
}

static void
assert_unchanged (GmlpMoELayer      *layer,
                  GmlpScalingRecipe  recipe,
                  GmlpQuantizer     *experts_q,
                  GmlpQuantizer     *shared_q)
{
  GmlpGroupedMLP *experts = gmlp_moe_layer_get_experts (layer), *shared = gmlp_moe_layer_get_shared_expert (layer);

  g_assert_cmpint (gmlp_moe_layer_get_fp8_recipe (layer), ==, recipe);
  assert_mlp_recipe (experts, recipe, GMLP_FP8_FORMAT_HYBRID);
  g_assert_true (gmlp_grouped_linear_get_quantizer (gmlp_grouped_mlp_get_fc2 (experts), GMLP_QUANTIZER_ROLE_INPUT) ==
                 experts_q);
  if (shared != NULL)
    {
      assert_mlp_recipe (shared, recipe, GMLP_FP8_FORMAT_HYBRID);
      g_assert_true (gmlp_grouped_linear_get_quantizer (gmlp_grouped_mlp_get_fc2 (shared),
                                                        GMLP_QUANTIZER_ROLE_INPUT) == shared_q);
    }
}

/* What set_fp8_recipe() refuses, before either MLP changes: an unknown
 * recipe or format; E5M2 with a per-tensor recipe; a per-tensor recipe
 * where the experts' width, or only the shared expert's, is no multiple
 * of 16 (blockwise takes them); the same at construction. */
static void
test_bad_recipes (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GError) error = NULL;
  guint s;

  if (device == NULL)
    return;

  for (s = 0; s < 2; s++)
    {
      /* s = 0: the shared expert is 24 wide; s = 1: the experts are. */
      g_autoptr(GmlpMoELayer) layer = NULL;
      GmlpQuantizer *experts_q, *shared_q;
      const char *prefix = s == 0 ? "The shared expert: " : "The experts: ";

      layer = g_initable_new (GMLP_TYPE_MOE_LAYER, NULL, &error, "device", device, "hidden", (gint64) HIDDEN,
                              "ffn-hidden", (gint64) (s == 0 ? FFN : 24), "n-experts", (guint) N_EXPERTS,
                              "top-k", (guint) TOP_K, "shared-expert-ffn-hidden", (gint64) (s == 0 ? 24 : 16),
                              "dtype", GMLP_DTYPE_BFLOAT16, NULL);
      g_assert_no_error (error);

      g_assert_false (gmlp_moe_layer_set_fp8_recipe (layer, (GmlpScalingRecipe) 9, GMLP_FP8_FORMAT_HYBRID, &error));
      g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
      g_clear_error (&error);
      g_assert_false (gmlp_moe_layer_set_fp8_recipe (layer, GMLP_SCALING_RECIPE_DELAYED, (GmlpFp8Format) 7, &error));
      g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
      g_clear_error (&error);
      assert_unchanged (layer, GMLP_SCALING_RECIPE_NONE, NULL, NULL);

      /* Blockwise takes any width; its quantizers stay through what
       * follows. */
      g_assert_true (gmlp_moe_layer_set_fp8_recipe (layer, GMLP_SCALING_RECIPE_BLOCKWISE, GMLP_FP8_FORMAT_HYBRID,
                                                    &error));
      g_assert_no_error (error);
      experts_q = gmlp_grouped_linear_get_quantizer (gmlp_grouped_mlp_get_fc2 (gmlp_moe_layer_get_experts (layer)),
                                                     GMLP_QUANTIZER_ROLE_INPUT);
      shared_q = gmlp_grouped_linear_get_quantizer (gmlp_grouped_mlp_get_fc2 (gmlp_moe_layer_get_shared_expert (layer)),
                                                    GMLP_QUANTIZER_ROLE_INPUT);

      g_assert_false (gmlp_moe_layer_set_fp8_recipe (layer, GMLP_SCALING_RECIPE_CURRENT, GMLP_FP8_FORMAT_HYBRID,
                                                     &error));
      g_assert_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED);
      g_assert_true (g_str_has_prefix (error->message, prefix));
      g_clear_error (&error);
      assert_unchanged (layer, GMLP_SCALING_RECIPE_BLOCKWISE, experts_q, shared_q);
      g_assert_false (gmlp_moe_layer_set_fp8_recipe (layer, GMLP_SCALING_RECIPE_DELAYED, GMLP_FP8_FORMAT_HYBRID,
                                                     &error));
      g_assert_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED);
      g_clear_error (&error);
      assert_unchanged (layer, GMLP_SCALING_RECIPE_BLOCKWISE, experts_q, shared_q);

      /* The same at construction. */
      g_assert_null (g_initable_new (GMLP_TYPE_MOE_LAYER, NULL, &error, "device", device,
                                     "hidden", (gint64) HIDDEN, "ffn-hidden", (gint64) (s == 0 ? FFN : 24),
                                     "n-experts", (guint) N_EXPERTS, "top-k", (guint) TOP_K,
                                     "shared-expert-ffn-hidden", (gint64) (s == 0 ? 24 : 16),
                                     "fp8-recipe", GMLP_SCALING_RECIPE_DELAYED, NULL));
      g_assert_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED);
      g_assert_nonnull (strstr (error->message, prefix));
      g_clear_error (&error);
    }

  /* E5M2 everywhere: a per-tensor product of two E5M2 operands. */
  {
    Config c = { "e5m2", 0, 16 };
    g_autoptr(GmlpMoELayer) layer = layer_new (device, &c, GMLP_DTYPE_BFLOAT16, GMLP_SCALING_RECIPE_NONE, &error);

    g_assert_no_error (error);
    g_assert_false (gmlp_moe_layer_set_fp8_recipe (layer, GMLP_SCALING_RECIPE_CURRENT, GMLP_FP8_FORMAT_E5M2, &error));
    g_assert_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED);
    g_clear_error (&error);
    assert_unchanged (layer, GMLP_SCALING_RECIPE_NONE, NULL, NULL);
    /* MXFP8 multiplies dequantized operands: E5M2 will do. */
    g_assert_true (gmlp_moe_layer_set_fp8_recipe (layer, GMLP_SCALING_RECIPE_MXFP8, GMLP_FP8_FORMAT_E5M2, &error));
    g_assert_no_error (error);
  }
}

/* A recipe for the forward, another set before its backward, and the
 * error the backward then gives. */
typedef struct {
  GmlpScalingRecipe forward, between;
  gint              code;
} RecipeChange;

/* A backward that must refuse with @code before anything is written:
 * every gradient the same bytes as @before, the saved activations unused. */
static void
assert_backward_refused (GmlpMoELayer         *layer,
                         GmlpSavedActivations *saved,
                         GmlpGroupedTensor    *dy,
                         GPtrArray            *before,
                         gint                  code)
{
  g_autoptr(GPtrArray) after = NULL;
  g_autoptr(GError) error = NULL;

  g_assert_null (gmlp_moe_layer_backward (layer, saved, dy, &error));
  g_assert_error (error, GMLP_ERROR, code);
  g_assert_false (gmlp_saved_activations_is_consumed (saved));
  after = gmlp_test_moe_gradient_bytes (layer);
  gmlp_test_assert_same_bytes_array (before, after, "gradients after a refused backward");
}

/* A recipe changed between a forward and its backward: the backward of an
 * FP8 forward stays FP8. Without FP8, or with a recipe that does not meet
 * the forward's, it fails before anything is written, the saved
 * activations unused; with the forward's recipe set again it runs, and
 * gives what the uninterrupted step gives; a per-tensor recipe meets the
 * other. */
static void
test_recipe_between (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  static const RecipeChange cases[] = {
    { GMLP_SCALING_RECIPE_DELAYED, GMLP_SCALING_RECIPE_NONE, GMLP_ERROR_INVALID_STATE },
    { GMLP_SCALING_RECIPE_BLOCKWISE, GMLP_SCALING_RECIPE_NONE, GMLP_ERROR_INVALID_STATE },
    { GMLP_SCALING_RECIPE_DELAYED, GMLP_SCALING_RECIPE_BLOCKWISE, GMLP_ERROR_UNSUPPORTED },
    { GMLP_SCALING_RECIPE_MXFP8, GMLP_SCALING_RECIPE_CURRENT, GMLP_ERROR_UNSUPPORTED },
  };
  guint i;

  if (device == NULL)
    return;

  for (i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      g_autoptr(Problem) p = problem_new (&configs[1], GMLP_DTYPE_BFLOAT16);
      g_autoptr(GmlpMoELayer) layer = NULL;
      g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, y = NULL, dx = NULL, dx2 = NULL;
      g_autoptr(GmlpSavedActivations) saved = NULL;
      g_autoptr(GPtrArray) before = NULL;
      g_autoptr(GError) error = NULL;
      g_auto(Step) ref = { NULL, }, first = { NULL, };

      /* A whole step first, so that every gradient exists; the recipes
       * other than delayed scaling keep no state, so the retried step
       * must give its dx. */
      layer = problem_layer (p, device, cases[i].forward);
      problem_draw (p);
      problem_reference (p, NULL, NULL, WGRAD_QUANTIZED, WGRAD_QUANTIZED, device, &ref);
      run_step (p, &ref, device, layer, &first);

      x = gmlp_test_upload_values (device, p->x, T_TOKENS, HIDDEN, p->dtype);
      dy = gmlp_test_upload_values (device, p->dy, T_TOKENS, HIDDEN, p->dtype);
      y = gmlp_moe_layer_forward (layer, x, &saved, &error);
      g_assert_no_error (error);
      before = gmlp_test_moe_gradient_bytes (layer);
      g_assert_true (gmlp_moe_layer_set_fp8_recipe (layer, cases[i].between, GMLP_FP8_FORMAT_HYBRID, &error));
      g_assert_no_error (error);
      assert_backward_refused (layer, saved, dy, before, cases[i].code);

      /* The forward's recipe again (fresh quantizers: the backward's
       * scales are the output gradients' own but for delayed scaling). */
      g_assert_true (gmlp_moe_layer_set_fp8_recipe (layer, cases[i].forward, GMLP_FP8_FORMAT_HYBRID, &error));
      g_assert_no_error (error);
      dx = gmlp_moe_layer_backward (layer, saved, dy, &error);
      g_assert_no_error (error);
      g_assert_true (gmlp_saved_activations_is_consumed (saved));
      if (cases[i].forward != GMLP_SCALING_RECIPE_DELAYED)
        {
          g_autofree double *v = gmlp_test_download (dx, NULL);

          gmlp_test_assert_close (v, first.dx, T_TOKENS * HIDDEN, on_gpu (device) ? gmlp_test_tolerance (p->dtype) : 0.0,
                                  "the retried backward");
        }
      g_clear_object (&saved);
      g_clear_object (&y);

      /* Per-tensor meets per-tensor: delayed forward, current backward. */
      if (cases[i].forward == GMLP_SCALING_RECIPE_DELAYED)
        {
          y = gmlp_moe_layer_forward (layer, x, &saved, &error);
          g_assert_no_error (error);
          g_assert_true (gmlp_moe_layer_set_fp8_recipe (layer, GMLP_SCALING_RECIPE_CURRENT, GMLP_FP8_FORMAT_HYBRID,
                                                        &error));
          g_assert_no_error (error);
          dx2 = gmlp_moe_layer_backward (layer, saved, dy, &error);
          g_assert_no_error (error);
        }
    }
}

static void
whole_step (GmlpMoELayer      *layer,
            GmlpGroupedTensor *x,
            GmlpGroupedTensor *dy)
{
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GmlpGroupedTensor) y = NULL, dx = NULL;
  g_autoptr(GError) error = NULL;

  y = gmlp_moe_layer_forward (layer, x, &saved, &error);
  g_assert_no_error (error);
  dx = gmlp_moe_layer_backward (layer, saved, dy, &error);
  g_assert_no_error (error);
}

/* The same as test_recipe_between, with the recipe of one part changed
 * through its getter: the shared expert's or the routed experts'. The
 * backward must refuse before any part writes (the router, the experts and
 * the shared expert run one after the other, so a part that refuses late
 * must be found out at the start), leaving every gradient (main_grad when
 * fused) bit for bit as it was; with the part's forward recipe set again
 * the same activations' backward gives the bits of a twin layer whose
 * step was never refused (on the CPU; within the dtype's tolerance on a
 * GPU, whose sums may be ordered otherwise). */
static void
test_part_recipe_between (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  static const RecipeChange cases[] = {
    { GMLP_SCALING_RECIPE_DELAYED, GMLP_SCALING_RECIPE_NONE, GMLP_ERROR_INVALID_STATE },
    { GMLP_SCALING_RECIPE_DELAYED, GMLP_SCALING_RECIPE_BLOCKWISE, GMLP_ERROR_UNSUPPORTED },
    { GMLP_SCALING_RECIPE_MXFP8, GMLP_SCALING_RECIPE_CURRENT, GMLP_ERROR_UNSUPPORTED },
  };
  guint i, part, fused;

  if (device == NULL)
    return;

  for (fused = 0; fused < 2; fused++)
    for (part = 0; part < 2; part++)
      for (i = 0; i < G_N_ELEMENTS (cases); i++)
        {
          GmlpLinearFlags flags = fused ? GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION : GMLP_LINEAR_NONE;
          g_autoptr(Problem) p = problem_new (&configs[1], GMLP_DTYPE_BFLOAT16);
          g_autoptr(GmlpMoELayer) layer = NULL, twin = NULL;
          g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, y = NULL, dx = NULL, y_twin = NULL, dx_twin = NULL;
          g_autoptr(GmlpSavedActivations) saved = NULL, saved_twin = NULL;
          g_autoptr(GPtrArray) before = NULL, after = NULL, want = NULL;
          g_autoptr(GError) error = NULL;
          g_autofree double *got_dx = NULL, *want_dx = NULL;
          GmlpGroupedMLP *changed, *changed_twin;

          g_test_message ("%s, %s: %d then %d", fused ? "fused" : "not fused",
                          part == 0 ? "shared expert" : "experts", cases[i].forward, cases[i].between);
          layer = problem_layer_flags (p, device, cases[i].forward, flags);
          twin = problem_layer_flags (p, device, cases[i].forward, flags);
          changed = part == 0 ? gmlp_moe_layer_get_shared_expert (layer) : gmlp_moe_layer_get_experts (layer);
          changed_twin = part == 0 ? gmlp_moe_layer_get_shared_expert (twin) : gmlp_moe_layer_get_experts (twin);
          g_assert_nonnull (changed);

          /* A whole step first on both, so that every gradient exists;
           * other tokens for the step under test, whose gradients differ. */
          problem_draw (p);
          x = gmlp_test_upload_values (device, p->x, T_TOKENS, HIDDEN, p->dtype);
          dy = gmlp_test_upload_values (device, p->dy, T_TOKENS, HIDDEN, p->dtype);
          whole_step (layer, x, dy);
          whole_step (twin, x, dy);
          g_clear_object (&x);
          g_clear_object (&dy);
          problem_draw (p);
          x = gmlp_test_upload_values (device, p->x, T_TOKENS, HIDDEN, p->dtype);
          dy = gmlp_test_upload_values (device, p->dy, T_TOKENS, HIDDEN, p->dtype);
          y = gmlp_moe_layer_forward (layer, x, &saved, &error);
          g_assert_no_error (error);
          before = gmlp_test_moe_gradient_bytes (layer);
          g_assert_true (gmlp_grouped_mlp_set_fp8_recipe (changed, cases[i].between, GMLP_FP8_FORMAT_HYBRID,
                                                          &error));
          g_assert_no_error (error);
          assert_backward_refused (layer, saved, dy, before, cases[i].code);

          /* The forward's recipe again: fresh quantizers, which the twin
           * gets at the same point of its step. */
          g_assert_true (gmlp_grouped_mlp_set_fp8_recipe (changed, cases[i].forward, GMLP_FP8_FORMAT_HYBRID,
                                                          &error));
          g_assert_no_error (error);
          dx = gmlp_moe_layer_backward (layer, saved, dy, &error);
          g_assert_no_error (error);
          g_assert_true (gmlp_saved_activations_is_consumed (saved));

          y_twin = gmlp_moe_layer_forward (twin, x, &saved_twin, &error);
          g_assert_no_error (error);
          g_assert_true (gmlp_grouped_mlp_set_fp8_recipe (changed_twin, cases[i].forward, GMLP_FP8_FORMAT_HYBRID,
                                                          &error));
          g_assert_no_error (error);
          dx_twin = gmlp_moe_layer_backward (twin, saved_twin, dy, &error);
          g_assert_no_error (error);

          got_dx = gmlp_test_download (dx, NULL);
          want_dx = gmlp_test_download (dx_twin, NULL);
          if (on_gpu (device))
            {
              gmlp_test_assert_close (got_dx, want_dx, T_TOKENS * HIDDEN, gmlp_test_tolerance (p->dtype),
                                      "the retried backward's dx");
            }
          else
            {
              gmlp_test_assert_same_bytes (dx, dx_twin, "the retried backward's dx");
              after = gmlp_test_moe_gradient_bytes (layer);
              want = gmlp_test_moe_gradient_bytes (twin);
              gmlp_test_assert_same_bytes_array (after, want, "gradients of the retried backward");
            }
        }
}

/* A part's output-gradient quantizer that cannot quantize its output
 * gradient: the shared expert's FC1 given, between the forward and the
 * backward, a delayed-scaling one that keeps the scales of two groups (the
 * shared expert has one). The backward refuses before any part writes,
 * every gradient as it was; with the quantizers of the forward again it
 * runs. */
static void
test_part_quantizer_state (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(Problem) p = NULL;
  g_autoptr(GmlpMoELayer) layer = NULL, twin = NULL;
  g_autoptr(GmlpQuantizer) other = NULL, input_q = NULL, weight_q = NULL, grad_q = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, y = NULL, dx = NULL, two = NULL, two8 = NULL;
  g_autoptr(GmlpGroupedTensor) y_twin = NULL, dx_twin = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL, saved_twin = NULL;
  g_autoptr(GPtrArray) before = NULL;
  g_autoptr(GError) error = NULL;
  gint64 two_rows[] = { 16, 16 };
  GmlpGroupedLinear *fc1;

  if (device == NULL)
    return;

  p = problem_new (&configs[1], GMLP_DTYPE_BFLOAT16);
  layer = problem_layer (p, device, GMLP_SCALING_RECIPE_DELAYED);
  fc1 = gmlp_grouped_mlp_get_fc1 (gmlp_moe_layer_get_shared_expert (layer));
  problem_draw (p);
  x = gmlp_test_upload_values (device, p->x, T_TOKENS, HIDDEN, p->dtype);
  dy = gmlp_test_upload_values (device, p->dy, T_TOKENS, HIDDEN, p->dtype);
  twin = problem_layer (p, device, GMLP_SCALING_RECIPE_DELAYED);
  whole_step (layer, x, dy);
  whole_step (twin, x, dy);
  /* Other tokens for the step under test: its gradients differ. */
  g_clear_object (&x);
  g_clear_object (&dy);
  problem_draw (p);
  x = gmlp_test_upload_values (device, p->x, T_TOKENS, HIDDEN, p->dtype);
  dy = gmlp_test_upload_values (device, p->dy, T_TOKENS, HIDDEN, p->dtype);

  other = gmlp_quantizer_new (device, GMLP_SCALING_RECIPE_DELAYED, GMLP_FP8_FORMAT_HYBRID,
                              GMLP_QUANTIZER_ROLE_GRAD_OUTPUT);
  two = gmlp_test_random_tensor (device, GMLP_DTYPE_BFLOAT16, two_rows, 2, HIDDEN, 1.0, NULL);
  two8 = gmlp_quantizer_quantize (other, two, &error);
  g_assert_no_error (error);
  input_q = g_object_ref (gmlp_grouped_linear_get_quantizer (fc1, GMLP_QUANTIZER_ROLE_INPUT));
  weight_q = g_object_ref (gmlp_grouped_linear_get_quantizer (fc1, GMLP_QUANTIZER_ROLE_WEIGHT));
  grad_q = g_object_ref (gmlp_grouped_linear_get_quantizer (fc1, GMLP_QUANTIZER_ROLE_GRAD_OUTPUT));

  y = gmlp_moe_layer_forward (layer, x, &saved, &error);
  g_assert_no_error (error);
  before = gmlp_test_moe_gradient_bytes (layer);
  g_assert_true (gmlp_grouped_linear_set_quantizers (fc1, input_q, weight_q, other, &error));
  g_assert_no_error (error);
  assert_backward_refused (layer, saved, dy, before, GMLP_ERROR_SHAPE_MISMATCH);

  g_assert_true (gmlp_grouped_linear_set_quantizers (fc1, input_q, weight_q, grad_q, &error));
  g_assert_no_error (error);
  dx = gmlp_moe_layer_backward (layer, saved, dy, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_saved_activations_is_consumed (saved));

  /* The bits of the twin's step, which was never refused (on the CPU). */
  y_twin = gmlp_moe_layer_forward (twin, x, &saved_twin, &error);
  g_assert_no_error (error);
  dx_twin = gmlp_moe_layer_backward (twin, saved_twin, dy, &error);
  g_assert_no_error (error);
  if (!on_gpu (device))
    {
      g_autoptr(GPtrArray) got = gmlp_test_moe_gradient_bytes (layer), want = gmlp_test_moe_gradient_bytes (twin);

      gmlp_test_assert_same_bytes (dx, dx_twin, "the retried backward's dx");
      gmlp_test_assert_same_bytes_array (got, want, "gradients of the retried backward");
    }
}

int
main (int argc, char *argv[])
{
  setlocale (LC_ALL, "");
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Gmlp/MoELayer/fp8/recipes", test_recipes);
  g_test_add_func ("/Gmlp/MoELayer/fp8/properties", test_properties);
  g_test_add_func ("/Gmlp/MoELayer/fp8/any-padding", test_any_padding);
  g_test_add_func ("/Gmlp/MoELayer/fp8/bad-recipes", test_bad_recipes);
  g_test_add_func ("/Gmlp/MoELayer/fp8/recipe-between", test_recipe_between);
  g_test_add_func ("/Gmlp/MoELayer/fp8/part-recipe-between", test_part_recipe_between);
  g_test_add_func ("/Gmlp/MoELayer/fp8/part-quantizer-state", test_part_quantizer_state);

  return g_test_run ();
}
