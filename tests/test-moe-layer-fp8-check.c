/* test-moe-layer-fp8-check.c: the library side of test-moe-layer-fp8
 *
 * Layers made from a problem, a step run with its gradients read back, and
 * the checks of the step against the reference, by dtype and recipe.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "test-moe-layer-fp8.h"

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

GmlpMoELayer *
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
GmlpMoELayer *
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

GmlpMoELayer *
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
void
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
      g_assert_cmpint (idx[q], ==, ref->idx[q]);
      g_assert_cmpfloat_with_epsilon (probs[q], ref->probs[q], 1e-5);
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

gboolean
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
double
tolerance_fp8 (GmlpDevice *device)
{
  return on_gpu (device) ? 2.5e-2 : 1.5e-2;
}

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
    {
      double plain_err = gmlp_test_relative_error (plain, want, n, label);

      checks->distance = MIN (checks->distance, plain_err / MAX (err, 1e-30));
      g_test_message ("part %s: %.3e, unquantized %.3e, %" G_GSIZE_FORMAT " values", label, err, plain_err, n);
    }
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
void
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
