/* test-moe-layer-errors.c: GmlpMoELayer on bad input
 *
 * Non-finite logits, invalid construction and invalid calls: each a clear
 * GError before anything is written.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "test-moe-layer.h"

/* Non-finite logits: every token gets k distinct experts in range, the
 * counts stay exact, and the step runs to its end. */
void
test_non_finite (void)
{
  static const char *which[] = { "mixtral", "deepseek", "softmax-after-gelu", "capacity" };
  g_autoptr(GmlpDevice) device = layer_device_or_skip ();
  guint i;

  if (device == NULL)
    return;
  for (i = 0; i < G_N_ELEMENTS (which); i++)
    {
      const Config *c = config (which[i]);
      g_autoptr(Problem) p = problem_new (c, GMLP_DTYPE_FLOAT32, T_TOKENS);
      g_autoptr(GmlpMoELayer) layer = NULL;
      g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, y = NULL, dx = NULL, tokens = NULL;
      g_autoptr(GmlpSavedActivations) saved = NULL;
      g_autoptr(GmlpRouting) routing = NULL;
      g_autoptr(GError) error = NULL;
      g_autofree gint64 *idx = NULL, *counts = NULL;
      g_autofree gint64 *histogram = g_new0 (gint64, c->E);
      gsize n;
      gint64 t, h;
      guint j, q;

      /* Expert 1's gate row is NaN; tokens 0 to 3 have ±∞ or NaN in x;
       * token 4 is zero. */
      for (h = 0; h < p->H; h++)
        p->wg[1 * p->H + h] = NAN;
      p->x[0 * p->H + 1] = INFINITY;
      p->x[1 * p->H + 2] = -INFINITY;
      p->x[2 * p->H + 0] = NAN;
      p->x[3 * p->H + 0] = INFINITY, p->x[3 * p->H + 1] = -INFINITY;
      for (h = 0; h < p->H; h++)
        p->x[4 * p->H + h] = 0.0;
      layer = problem_layer (p, device, GMLP_LINEAR_NONE);
      x = gmlp_test_upload_values (device, p->x, p->T, p->H, GMLP_DTYPE_FLOAT32);
      dy = gmlp_test_upload_values (device, p->dy, p->T, p->H, GMLP_DTYPE_FLOAT32);
      y = gmlp_moe_layer_forward (layer, x, &saved, &error);
      g_assert_no_error (error);
      g_assert_cmpint (gmlp_grouped_tensor_get_total_rows (y), ==, p->T);

      routing = gmlp_moe_layer_get_routing (layer);
      idx = gmlp_test_download_i64 (gmlp_routing_get_indices (routing), &n);
      g_assert_cmpuint (n, ==, (gsize) p->T * c->k);
      for (t = 0; t < p->T; t++)
        for (j = 0; j < c->k; j++)
          {
            gint64 e = idx[t * c->k + j];

            g_assert_cmpint (e, >=, 0);
            g_assert_cmpint (e, <, c->E);
            for (q = 0; q < j; q++)
              g_assert_cmpint (idx[t * c->k + q], !=, e);
            histogram[e]++;
          }
      tokens = gmlp_moe_layer_get_tokens_per_expert (layer);
      counts = gmlp_test_download_i64 (tokens, &n);
      for (j = 0; j < c->E; j++)
        g_assert_cmpint (counts[j], ==, histogram[j]);

      dx = gmlp_moe_layer_backward (layer, saved, dy, &error);
      g_assert_no_error (error);
      g_assert_cmpint (gmlp_grouped_tensor_get_total_rows (dx), ==, p->T);
    }
}

/* A layer made by g_object_new() with these properties reports @code from
 * init and from every method (EITHER: INVALID_ARGUMENT or UNSUPPORTED). */
#define EITHER -1

static void
assert_code (const GError *error,
             int           code)
{
  g_assert_nonnull (error);
  if (code == EITHER)
    g_assert_true (g_error_matches (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT) ||
                   g_error_matches (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED));
  else
    g_assert_error (error, GMLP_ERROR, code);
}

static void
assert_construct_error (GmlpDevice *device,
                        int         code,
                        const char *first_property,
                        ...)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpMoELayer) made = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, y = NULL;
  GObject *object;
  va_list args;
  gint64 rows = 2;

  va_start (args, first_property);
  object = g_object_new_valist (GMLP_TYPE_MOE_LAYER, first_property, args);
  va_end (args);
  made = GMLP_MOE_LAYER (object);
  g_assert_false (g_initable_init (G_INITABLE (made), NULL, &error));
  assert_code (error, code);
  g_test_message ("refused: %s", error->message);
  g_clear_error (&error);

  /* Every method reports it; the getters give nothing. */
  g_assert_null (gmlp_moe_layer_get_router (made));
  g_assert_null (gmlp_moe_layer_get_experts (made));
  g_assert_null (gmlp_moe_layer_get_shared_expert (made));
  x = gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, &rows, 1, 16, &error);
  g_assert_no_error (error);
  y = gmlp_moe_layer_forward (made, x, NULL, &error);
  g_assert_null (y);
  assert_code (error, code);
  g_clear_error (&error);
  g_assert_false (gmlp_moe_layer_init_parameters (made, 1, &error));
  assert_code (error, code);
  g_clear_error (&error);
  g_assert_false (gmlp_moe_layer_backward_dw (made, &error));
  assert_code (error, code);
}

#define BASE "device", device, "hidden", (gint64) 16, "ffn-hidden", (gint64) 8
#define E8K2 "n-experts", 8, "top-k", 2
#define INVALID GMLP_ERROR_INVALID_ARGUMENT

void
test_bad_construction (void)
{
  g_autoptr(GmlpDevice) device = layer_device_or_skip ();
  g_autoptr(GmlpMoELayer) layer = NULL;
  g_autoptr(GError) error = NULL;

  if (device == NULL)
    return;
  /* Sizes. */
  assert_construct_error (device, INVALID, "device", device, "hidden", (gint64) 0, "ffn-hidden", (gint64) 8,
                          "n-experts", 8, "top-k", 2, NULL);
  assert_construct_error (device, INVALID, "device", device, "hidden", (gint64) -16, "ffn-hidden", (gint64) 8,
                          "n-experts", 8, "top-k", 2, NULL);
  assert_construct_error (device, INVALID, "device", device, "hidden", (gint64) 16, "ffn-hidden", (gint64) 0,
                          "n-experts", 8, "top-k", 2, NULL);
  assert_construct_error (device, INVALID, "device", device, "hidden", (gint64) 16, "ffn-hidden", G_MININT64,
                          "n-experts", 8, "top-k", 2, NULL);
  assert_construct_error (device, INVALID, BASE, "n-experts", 0, "top-k", 1, NULL);
  assert_construct_error (device, INVALID, BASE, E8K2, "shared-expert-ffn-hidden", (gint64) -1, NULL);
  /* k = 0, k > n_experts, k past 16. */
  assert_construct_error (device, INVALID, BASE, "n-experts", 8, "top-k", 0, NULL);
  assert_construct_error (device, INVALID, BASE, "n-experts", 4, "top-k", 5, NULL);
  assert_construct_error (device, INVALID, BASE, "n-experts", 32, "top-k", 17, NULL);
  /* Groups: topk_groups > n_groups, n_experts not divisible, none kept,
   * fewer candidates than k. */
  assert_construct_error (device, INVALID, BASE, E8K2, "n-expert-groups", 4, "topk-groups", 5, NULL);
  assert_construct_error (device, INVALID, BASE, "n-experts", 10, "top-k", 2, "n-expert-groups", 4,
                          "topk-groups", 2, NULL);
  assert_construct_error (device, INVALID, BASE, E8K2, "n-expert-groups", 4, "topk-groups", 0, NULL);
  assert_construct_error (device, INVALID, BASE, "n-experts", 8, "top-k", 3, "n-expert-groups", 4,
                          "topk-groups", 1, NULL);
  /* Capacity factors below 0 or infinite (GObject itself refuses a NaN for
   * a double property); paddings that are not a power of two up to 128. */
  assert_construct_error (device, INVALID, BASE, E8K2, "capacity-factor", -0.5, NULL);
  assert_construct_error (device, INVALID, BASE, E8K2, "capacity-factor", -INFINITY, NULL);
  assert_construct_error (device, INVALID, BASE, E8K2, "capacity-factor", INFINITY, NULL);
  assert_construct_error (device, INVALID, BASE, E8K2, "padding", 3, NULL);
  assert_construct_error (device, INVALID, BASE, E8K2, "padding", 256, NULL);
  /* The router's other options. */
  assert_construct_error (device, INVALID, BASE, E8K2, "scaling-factor", -1.0, NULL);
  assert_construct_error (device, INVALID, BASE, E8K2, "aux-loss-coeff", -1.0, NULL);
  assert_construct_error (device, INVALID, BASE, E8K2, "z-loss-coeff", INFINITY, NULL);
  /* dtypes the experts don't take (GroupedLinear says UNSUPPORTED). */
  assert_construct_error (device, EITHER, BASE, E8K2, "dtype", GMLP_DTYPE_INT64, NULL);
  assert_construct_error (device, EITHER, BASE, E8K2, "dtype", GMLP_DTYPE_FLOAT8_E4M3, NULL);

  /* The edges that are fine: k = n_experts = 16, capacity 0 (dropless),
   * padding 1 and 128, groups, the layers' flags (the router takes only
   * its own). */
  layer = g_initable_new (GMLP_TYPE_MOE_LAYER, NULL, &error, BASE, "n-experts", 16, "top-k", 16, NULL);
  g_assert_no_error (error);
  g_clear_object (&layer);
  layer = g_initable_new (GMLP_TYPE_MOE_LAYER, NULL, &error, BASE, "n-experts", 8, "top-k", 2,
                          "capacity-factor", 0.0, "padding", 1, NULL);
  g_assert_no_error (error);
  g_clear_object (&layer);
  layer = g_initable_new (GMLP_TYPE_MOE_LAYER, NULL, &error, BASE, "n-experts", 8, "top-k", 8,
                          "padding", 128, "n-expert-groups", 1, "topk-groups", 1, NULL);
  g_assert_no_error (error);
  g_clear_object (&layer);
  layer = g_initable_new (GMLP_TYPE_MOE_LAYER, NULL, &error, BASE, "n-experts", 8, "top-k", 2,
                          "flags", GMLP_LINEAR_BIAS | GMLP_LINEAR_RECOMPUTE_ACTIVATION |
                          GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_DELAY_WGRAD_COMPUTE |
                          GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION, NULL);
  g_assert_no_error (error);
  g_assert_cmpint (gmlp_router_get_flags (gmlp_moe_layer_get_router (layer)), ==,
                   GMLP_LINEAR_DELAY_WGRAD_COMPUTE | GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION);
}

/* Calls that are refused write nothing: the last forward's routing stays,
 * the saved activations stay usable, the gradients as they were. */
void
test_bad_calls (void)
{
  Config c = *config ("deepseek");
  g_autoptr(GmlpDevice) device = layer_device_or_skip ();
  g_autoptr(Problem) p = NULL;
  g_autoptr(GmlpMoELayer) layer = NULL, other = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, dy2 = NULL, y = NULL, dx = NULL, other_y = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL, other_saved = NULL;
  g_autoptr(GPtrArray) before = NULL, after = NULL;
  g_autoptr(GError) error = NULL;
  g_auto(Step) first = { NULL, };
  g_autoptr(GmlpRouting) routing = NULL;
  gint64 two[2] = { 3, 4 }, rows;

  if (device == NULL)
    return;
  c.flags = GMLP_LINEAR_BIAS | GMLP_LINEAR_SINGLE_GROUPED_WEIGHT;
  p = problem_new (&c, GMLP_DTYPE_FLOAT32, T_TOKENS);
  layer = problem_layer (p, device, GMLP_LINEAR_NONE);
  x = gmlp_test_upload_values (device, p->x, p->T, p->H, p->dtype);
  dy = gmlp_test_upload_values (device, p->dy, p->T, p->H, p->dtype);
  /* A first step, so that there are gradients to keep; the refused calls
   * get another dy, so that a part that ran would change them. */
  run_step (p, device, layer, FALSE, &first);
  {
    g_autofree double *dy2_values = gmlp_test_normals (p->T * p->H, 1.0, p->dtype);

    dy2 = gmlp_test_upload_values (device, dy2_values, p->T, p->H, p->dtype);
  }
  check_step (p, layer, &first, TRUE, "before the bad calls");
  before = gmlp_test_moe_gradient_bytes (layer);
  routing = gmlp_moe_layer_get_routing (layer);

  /* Forward: the width (hidden), groups, dtypes, device sizes. */
  {
    g_autoptr(GmlpGroupedTensor) narrow = gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, two + 1, 1, p->H - 1,
                                                                   &error);
    g_autoptr(GmlpGroupedTensor) wide = gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, two + 1, 1, p->H + 1,
                                                                 &error);
    g_autoptr(GmlpGroupedTensor) grouped = gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, two, 2, p->H, &error);
    g_autoptr(GmlpGroupedTensor) bf16 = gmlp_grouped_tensor_new (device, GMLP_DTYPE_BFLOAT16, two, 1, p->H, &error);
    g_autoptr(GmlpGroupedTensor) ints = gmlp_grouped_tensor_new (device, GMLP_DTYPE_INT64, two, 1, p->H, &error);
    g_autoptr(GmlpGroupedTensor) sizes = NULL, device_sized = NULL;
    struct { GmlpGroupedTensor *x; int code; } bad[] = {
      { narrow, GMLP_ERROR_SHAPE_MISMATCH },
      { wide, GMLP_ERROR_SHAPE_MISMATCH },
      { grouped, GMLP_ERROR_SHAPE_MISMATCH },
      { bf16, GMLP_ERROR_DTYPE_MISMATCH },
      { ints, GMLP_ERROR_DTYPE_MISMATCH },
      { NULL, -1 },   /* device sizes: refused, whatever the code */
    };
    guint i;

    g_assert_no_error (error);
    rows = 7;
    sizes = gmlp_test_sizes_tensor (device, &rows, 1);
    device_sized = gmlp_grouped_tensor_new_with_device_sizes (device, GMLP_DTYPE_FLOAT32, sizes, 8, p->H, &error);
    g_assert_no_error (error);
    bad[5].x = device_sized;
    for (i = 0; i < G_N_ELEMENTS (bad); i++)
      {
        g_autoptr(GmlpSavedActivations) none = NULL;
        g_autoptr(GmlpGroupedTensor) out = gmlp_moe_layer_forward (layer, bad[i].x, &none, &error);
        g_autoptr(GmlpRouting) last = NULL;

        g_assert_null (out);
        g_assert_null (none);
        g_assert_nonnull (error);
        if (bad[i].code >= 0)
          g_assert_error (error, GMLP_ERROR, bad[i].code);
        else
          g_assert_true (error->domain == GMLP_ERROR);
        g_test_message ("forward refused: %s", error->message);
        g_clear_error (&error);
        last = gmlp_moe_layer_get_routing (layer);
        g_assert_true (last == routing);
      }
  }

  /* Backward: dy's rows, width, groups and dtype; another layer's
   * activations. */
  y = gmlp_moe_layer_forward (layer, x, &saved, &error);
  g_assert_no_error (error);
  other = problem_layer (p, device, GMLP_LINEAR_NONE);
  other_y = gmlp_moe_layer_forward (other, x, &other_saved, &error);
  g_assert_no_error (error);
  {
    g_autoptr(GmlpGroupedTensor) short_dy = gmlp_test_upload_values (device, p->dy, p->T - 1, p->H, p->dtype);
    g_autoptr(GmlpGroupedTensor) long_dy = gmlp_grouped_tensor_new (device, p->dtype, (gint64[]) { p->T + 1 }, 1,
                                                                    p->H, &error);
    g_autoptr(GmlpGroupedTensor) narrow_dy = gmlp_test_upload_values (device, p->dy, p->T, p->H - 1, p->dtype);
    g_autoptr(GmlpGroupedTensor) grouped_dy = gmlp_grouped_tensor_new (device, p->dtype,
                                                                       (gint64[]) { 10, p->T - 10 }, 2, p->H,
                                                                       &error);
    g_autoptr(GmlpGroupedTensor) half_dy = gmlp_test_upload_values (device, p->dy, p->T, p->H, GMLP_DTYPE_BFLOAT16);
    struct { GmlpSavedActivations *saved; GmlpGroupedTensor *dy; int code; } bad[] = {
      { saved, short_dy, GMLP_ERROR_SHAPE_MISMATCH },
      { saved, long_dy, GMLP_ERROR_SHAPE_MISMATCH },
      { saved, narrow_dy, GMLP_ERROR_SHAPE_MISMATCH },
      { saved, grouped_dy, GMLP_ERROR_SHAPE_MISMATCH },
      { saved, half_dy, GMLP_ERROR_DTYPE_MISMATCH },
      { other_saved, dy2, GMLP_ERROR_INVALID_ARGUMENT },
    };
    guint i;

    g_assert_no_error (error);
    for (i = 0; i < G_N_ELEMENTS (bad); i++)
      {
        g_autoptr(GmlpGroupedTensor) out = gmlp_moe_layer_backward (layer, bad[i].saved, bad[i].dy, &error);

        g_assert_null (out);
        g_assert_error (error, GMLP_ERROR, bad[i].code);
        g_test_message ("backward refused: %s", error->message);
        g_clear_error (&error);
      }
  }
  g_assert_false (gmlp_saved_activations_is_consumed (saved));
  g_assert_false (gmlp_saved_activations_is_consumed (other_saved));
  after = gmlp_test_moe_gradient_bytes (layer);
  gmlp_test_assert_same_bytes_array (before, after, "gradients after refused calls");

  /* Still usable; once used, refused. */
  dx = gmlp_moe_layer_backward (layer, saved, dy, &error);
  g_assert_no_error (error);
  {
    g_auto(Step) s = { g_steal_pointer (&y), g_steal_pointer (&dx) };

    check_step (p, layer, &s, TRUE, "after the refused calls");
  }
  g_clear_pointer (&before, g_ptr_array_unref);
  before = gmlp_test_moe_gradient_bytes (layer);
  g_assert_null (gmlp_moe_layer_backward (layer, saved, dy2, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
  g_test_message ("second backward refused: %s", error->message);
  g_clear_error (&error);
  g_clear_pointer (&after, g_ptr_array_unref);
  after = gmlp_test_moe_gradient_bytes (layer);
  gmlp_test_assert_same_bytes_array (before, after, "gradients after a second backward");
}
