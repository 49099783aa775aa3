/* test-grouped-linear-fp8-calls.c: FP8 GroupedLinear's other calls
 *
 * Offload (whole and in parts), bad input, properties, and the layout of
 * the backend's GEMM descriptor.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "test-grouped-linear-fp8.h"

/* The values of a tensor, packed (a columnwise copy's too: its members
 * have the same number of bytes). */
static GBytes *
raw_bytes (GmlpGroupedTensor *t)
{
  g_autoptr(GError) error = NULL;
  GBytes *bytes = gmlp_grouped_tensor_to_bytes (t, &error);

  g_assert_no_error (error);
  return bytes;
}

/* Offload of FP8 saved activations: forward, backward and the weight
 * gradients are bit-identical with and without offload, and what moved to
 * the host is every part of the quantized input. */
void
test_offload (void)
{
  g_autoptr(GmlpDevice) device = device_or_skip ();
  gint64 rows[] = { 50, 0, 17, 96 };
  guint r;

  if (device == NULL)
    return;

  for (r = 0; r < G_N_ELEMENTS (all_recipes); r++)
    {
      GmlpScalingRecipe recipe = all_recipes[r];
      g_autoptr(GmlpGroupedLinear) layer = NULL;
      g_autoptr(GmlpOffloadContext) ctx = NULL;
      g_autoptr(Problem) p = NULL;
      g_autoptr(GmlpGroupedTensor) y0 = NULL, dx0 = NULL, dw0 = NULL, db0 = NULL;
      g_autoptr(GmlpGroupedTensor) x = NULL, y1 = NULL, dx1 = NULL;
      g_autoptr(GmlpSavedActivations) saved0 = NULL, saved1 = NULL;
      g_autoptr(GError) error = NULL;
      g_autoptr(GBytes) x_bytes = NULL;
      Quantizers q = { 0, };
      guint64 expected;

      quantizers_new (&q, device, recipe, GMLP_FP8_FORMAT_HYBRID, 4);
      layer = new_layer (device, 4, 32, 16, GMLP_DTYPE_BFLOAT16,
                         GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS, &q);
      p = problem_new (layer, rows, 1.0);

      /* Without offload. */
      y0 = gmlp_grouped_linear_forward (layer, p->xt, &saved0, &error);
      g_assert_no_error (error);
      g_assert_false (gmlp_saved_activations_get_offload (saved0));
      dx0 = gmlp_grouped_linear_backward (layer, saved0, p->dyt, &error);
      g_assert_no_error (error);
      dw0 = gmlp_grouped_tensor_convert (gmlp_grouped_linear_get_wgrad (layer), GMLP_DTYPE_BFLOAT16, &error);
      db0 = gmlp_grouped_tensor_convert (gmlp_grouped_linear_get_bgrad (layer), GMLP_DTYPE_BFLOAT16, &error);
      g_assert_no_error (error);

      /* With: the input is a copy the test then overwrites. */
      x_bytes = gmlp_grouped_tensor_to_bytes (p->xt, &error);
      x = gmlp_grouped_tensor_new_from_bytes (device, GMLP_DTYPE_BFLOAT16, rows, 4, p->k, x_bytes, &error);
      g_assert_no_error (error);
      ctx = gmlp_offload_context_new (device, &error);
      g_assert_no_error (error);
      gmlp_offload_context_push_thread_default (ctx, TRUE);
      y1 = gmlp_grouped_linear_forward (layer, x, &saved1, &error);
      g_assert_true (gmlp_offload_context_pop_thread_default (ctx, NULL));
      g_assert_no_error (error);
      g_assert_true (gmlp_saved_activations_get_offload (saved1));
      gmlp_offload_context_flush (ctx);

      /* On the host: the quantized input, its scales and, for the
       * per-tensor and blockwise recipes (whose WGRAD reads it), its
       * columnwise copy; the FP8 weights stay on the device. */
      {
        g_autoptr(GmlpQuantizer) probe = g_object_new (GMLP_TYPE_QUANTIZER, "device", device,
                                                       "recipe", recipe, "role", GMLP_QUANTIZER_ROLE_INPUT,
                                                       "columnwise", recipe != GMLP_SCALING_RECIPE_MXFP8,
                                                       NULL);
        g_autoptr(GmlpGroupedTensor) x8 = gmlp_quantizer_quantize (probe, p->xt, &error);
        GmlpGroupedTensor *cw = gmlp_grouped_tensor_get_columnwise (x8);

        g_assert_no_error (error);
        expected = gmlp_grouped_tensor_get_nbytes (x8) +
                   gmlp_grouped_tensor_get_nbytes (gmlp_grouped_tensor_get_scale_inv (x8));
        if (cw != NULL)
          {
            expected += gmlp_grouped_tensor_get_nbytes (cw);
            if (gmlp_grouped_tensor_get_scale_inv (cw) != gmlp_grouped_tensor_get_scale_inv (x8))
              expected += gmlp_grouped_tensor_get_nbytes (gmlp_grouped_tensor_get_scale_inv (cw));
          }
        g_assert_cmpuint (gmlp_saved_activations_get_host_nbytes (saved1), ==, expected);
      }

      /* Overwritten behind libgmlp's back (as through DLPack: the version
       * stays), so that only the offloaded copy holds the input. */
      g_assert_true (gmlp_device_synchronize (device, NULL));
      g_assert_true (GMLP_DEVICE_CALL (device, fill_bytes, gmlp_grouped_tensor_get_data (x), 0,
                                       gmlp_grouped_tensor_get_nbytes (x), NULL));
      dx1 = gmlp_grouped_linear_backward (layer, saved1, p->dyt, &error);
      g_assert_no_error (error);

      gmlp_test_assert_same_bytes (y0, y1, "fprop (offloaded)");
      gmlp_test_assert_same_bytes (dx0, dx1, "dgrad (reloaded)");
      gmlp_test_assert_same_bytes (dw0, gmlp_grouped_linear_get_wgrad (layer), "wgrad (reloaded)");
      gmlp_test_assert_same_bytes (db0, gmlp_grouped_linear_get_bgrad (layer), "dbias (reloaded)");
      quantizers_clear (&q);
    }
}

/* Saved activations move every part of a quantized tensor, with scales of
 * its own for the columnwise copy too, and give back the same tensor. */
void
test_offload_parts (void)
{
  g_autoptr(GmlpDevice) device = device_or_skip ();
  gint64 rows[] = { 130, 0, 31 };
  guint r;

  if (device == NULL)
    return;

  for (r = 0; r < G_N_ELEMENTS (all_recipes); r++)
    {
      g_autoptr(GmlpQuantizer) q = NULL;
      g_autoptr(GmlpOffloadContext) ctx = NULL;
      g_autoptr(GmlpSavedActivations) saved = NULL;
      g_autoptr(GmlpGroupedTensor) src = NULL, x8 = NULL;
      g_autoptr(GBytes) data = NULL, scales = NULL, cw = NULL, cw_scales = NULL;
      g_autoptr(GError) error = NULL;
      GmlpGroupedTensor *back, *x8_cw;
      gint64 br0, bc0, br1, bc1;

      q = g_object_new (GMLP_TYPE_QUANTIZER, "device", device, "recipe", all_recipes[r],
                        "role", GMLP_QUANTIZER_ROLE_INPUT, "columnwise", TRUE, NULL);
      src = gmlp_test_random_tensor (device, GMLP_DTYPE_BFLOAT16, rows, 3, 160, 1.0, NULL);
      x8 = gmlp_quantizer_quantize (q, src, &error);
      g_assert_no_error (error);
      x8_cw = gmlp_grouped_tensor_get_columnwise (x8);
      data = raw_bytes (x8);
      scales = raw_bytes (gmlp_grouped_tensor_get_scale_inv (x8));
      cw = raw_bytes (x8_cw);
      cw_scales = raw_bytes (gmlp_grouped_tensor_get_scale_inv (x8_cw));

      saved = gmlp_saved_activations_new (1);
      gmlp_saved_activations_add (saved, "input", x8);
      ctx = gmlp_offload_context_new (device, &error);
      g_assert_no_error (error);
      gmlp_offload_context_push_thread_default (ctx, TRUE);
      g_assert_true (gmlp_saved_activations_apply_offload (saved, &error));
      g_assert_true (gmlp_offload_context_pop_thread_default (ctx, NULL));
      g_assert_no_error (error);
      g_clear_object (&x8);
      gmlp_offload_context_flush (ctx);
      g_assert_cmpuint (gmlp_saved_activations_get_nbytes (saved), ==, 0);
      g_assert_true (gmlp_saved_activations_is_on_host (saved));

      back = gmlp_saved_activations_get (saved, "input", &error);
      g_assert_no_error (error);
      g_assert_cmpint (gmlp_grouped_tensor_get_scaling_recipe (back), ==, all_recipes[r]);
      g_assert_nonnull (gmlp_grouped_tensor_get_columnwise (back));
      g_assert_true (gmlp_grouped_tensor_is_columnwise (gmlp_grouped_tensor_get_columnwise (back)));
      g_assert_true (gmlp_grouped_tensor_get_scale_block (back, &br0, &bc0));
      g_assert_true (gmlp_grouped_tensor_get_scale_block (gmlp_grouped_tensor_get_columnwise (back), &br1, &bc1));
      if (all_recipes[r] == GMLP_SCALING_RECIPE_BLOCKWISE)
        {
          g_assert_cmpint (br0, ==, 1);
          g_assert_cmpint (bc0, ==, 128);
          g_assert_cmpint (br1, ==, 128);
          g_assert_cmpint (bc1, ==, 1);
        }
      {
        g_autoptr(GBytes) d = raw_bytes (back);
        g_autoptr(GBytes) s = raw_bytes (gmlp_grouped_tensor_get_scale_inv (back));
        g_autoptr(GBytes) c = raw_bytes (gmlp_grouped_tensor_get_columnwise (back));
        g_autoptr(GBytes) cs = raw_bytes (gmlp_grouped_tensor_get_scale_inv (gmlp_grouped_tensor_get_columnwise (back)));

        g_assert_true (g_bytes_equal (d, data));
        g_assert_true (g_bytes_equal (s, scales));
        g_assert_true (g_bytes_equal (c, cw));
        g_assert_true (g_bytes_equal (cs, cw_scales));
      }
      /* Per-tensor recipes share one scale tensor between the two. */
      if (per_tensor (all_recipes[r]))
        g_assert_true (gmlp_grouped_tensor_get_scale_inv (back) ==
                       gmlp_grouped_tensor_get_scale_inv (gmlp_grouped_tensor_get_columnwise (back)));
      {
        g_autoptr(GmlpGroupedTensor) again = gmlp_grouped_tensor_dequantize (back, GMLP_DTYPE_FLOAT32, &error);
        g_assert_no_error (error);
      }
      gmlp_saved_activations_consume (saved);
    }
}

/* Bad input: a clear error before anything is written or allocated. */
void
test_bad_input (void)
{
  g_autoptr(GmlpDevice) device = device_or_skip ();
  g_autoptr(GmlpGroupedLinear) layer = NULL, odd = NULL, plain = NULL;
  g_autoptr(GmlpGroupedTensor) x8_blockwise = NULL, x8_plain = NULL, dy8_plain = NULL;
  g_autoptr(GmlpGroupedTensor) y = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GmlpQuantizer) blockwise = NULL, e5m2_in = NULL, e5m2_w = NULL;
  g_autoptr(Problem) p = NULL;
  g_autoptr(GError) error = NULL;
  Quantizers q = { 0, }, q5 = { 0, };
  gint64 rows[] = { 5, 0, 12 };
  guint64 in_use;

  if (device == NULL)
    return;

  quantizers_new (&q, device, GMLP_SCALING_RECIPE_CURRENT, GMLP_FP8_FORMAT_HYBRID, 4);
  layer = new_layer (device, 3, 32, 16, GMLP_DTYPE_BFLOAT16, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT, NULL);
  p = problem_new (layer, rows, 1.0);

#define EXPECT_FALSE(call, code) \
  G_STMT_START { \
    g_autoptr(GError) _e = NULL; \
    g_assert_false (call); \
    g_assert_error (_e, GMLP_ERROR, (code)); \
  } G_STMT_END

  /* Quantizers: all three or none, the right roles, recipes that meet. */
  EXPECT_FALSE (gmlp_grouped_linear_set_quantizers (layer, q.input, q.weight, NULL, &_e),
                GMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_FALSE (gmlp_grouped_linear_set_quantizers (layer, q.weight, q.input, q.grad_output, &_e),
                GMLP_ERROR_INVALID_ARGUMENT);
  blockwise = gmlp_quantizer_new (device, GMLP_SCALING_RECIPE_BLOCKWISE, GMLP_FP8_FORMAT_HYBRID,
                                  GMLP_QUANTIZER_ROLE_INPUT);
  EXPECT_FALSE (gmlp_grouped_linear_set_quantizers (layer, blockwise, q.weight, q.grad_output, &_e),
                GMLP_ERROR_UNSUPPORTED);
  /* E5M2 × E5M2. */
  quantizers_new (&q5, device, GMLP_SCALING_RECIPE_CURRENT, GMLP_FP8_FORMAT_E5M2, 4);
  EXPECT_FALSE (gmlp_grouped_linear_set_quantizers (layer, q5.input, q5.weight, q5.grad_output, &_e),
                GMLP_ERROR_UNSUPPORTED);
  /* Features that are not multiples of 16, with per-tensor scales. */
  odd = new_layer (device, 3, 24, 16, GMLP_DTYPE_BFLOAT16, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT, NULL);
  EXPECT_FALSE (gmlp_grouped_linear_set_quantizers (odd, q.input, q.weight, q.grad_output, &_e),
                GMLP_ERROR_UNSUPPORTED);
  g_assert_null (gmlp_grouped_linear_get_quantizer (layer, GMLP_QUANTIZER_ROLE_INPUT));
  {
    g_autoptr(GError) e = NULL;
    g_autoptr(GmlpGroupedLinear) half = g_initable_new (GMLP_TYPE_GROUPED_LINEAR, NULL, &e,
                                                        "device", device, "n-groups", 3,
                                                        "in-features", (gint64) 32,
                                                        "out-features", (gint64) 16,
                                                        "input-quantizer", q.input, NULL);
    g_assert_null (half);
    g_assert_error (e, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  }

  /* An FP8 input: without scales, a columnwise copy, or with no
   * quantizers on the layer. */
  plain = new_layer (device, 3, 32, 16, GMLP_DTYPE_BFLOAT16, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT, NULL);
  x8_plain = gmlp_grouped_tensor_convert (p->xt, GMLP_DTYPE_FLOAT8_E4M3, &error);
  dy8_plain = gmlp_grouped_tensor_convert (p->dyt, GMLP_DTYPE_FLOAT8_E5M2, &error);
  g_assert_no_error (error);
  gmlp_quantizer_set_columnwise (blockwise, TRUE);
  x8_blockwise = gmlp_quantizer_quantize (blockwise, p->xt, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_grouped_linear_set_quantizers (layer, q.input, q.weight, q.grad_output, &error));
  g_assert_no_error (error);
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

  EXPECT_NULL (gmlp_grouped_linear_forward (layer, x8_plain, &_s, &_e), GMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_NULL (gmlp_grouped_linear_forward (layer, gmlp_grouped_tensor_get_columnwise (x8_blockwise), &_s, &_e),
               GMLP_ERROR_UNSUPPORTED);
  EXPECT_NULL (gmlp_grouped_linear_forward (layer, x8_blockwise, &_s, &_e), GMLP_ERROR_UNSUPPORTED);
  EXPECT_NULL (gmlp_grouped_linear_forward (plain, x8_blockwise, &_s, &_e), GMLP_ERROR_DTYPE_MISMATCH);
  EXPECT_NULL (gmlp_grouped_linear_forward (layer, p->dyt, &_s, &_e), GMLP_ERROR_SHAPE_MISMATCH);

  /* Backward: dy without scales; then the quantizers are gone. */
  y = gmlp_grouped_linear_forward (layer, p->xt, &saved, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_device_synchronize (device, NULL));
  in_use = gmlp_device_get_bytes_in_use (device);
  EXPECT_NULL (gmlp_grouped_linear_backward (layer, saved, dy8_plain, &_e), GMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_NULL (gmlp_grouped_linear_backward (layer, saved, p->xt, &_e), GMLP_ERROR_SHAPE_MISMATCH);
  g_assert_true (gmlp_grouped_linear_set_quantizers (layer, NULL, NULL, NULL, &error));
  g_assert_no_error (error);
  EXPECT_NULL (gmlp_grouped_linear_backward (layer, saved, p->dyt, &_e), GMLP_ERROR_INVALID_STATE);
  g_assert_false (gmlp_saved_activations_is_consumed (saved));
  g_assert_null (gmlp_grouped_linear_get_wgrad (layer));

  /* The same quantizers again: the backward goes through. */
  g_assert_true (gmlp_grouped_linear_set_quantizers (layer, q.input, q.weight, q.grad_output, &error));
  g_assert_no_error (error);
  {
    g_autoptr(GmlpGroupedTensor) dx = gmlp_grouped_linear_backward (layer, saved, p->dyt, &error);
    g_assert_no_error (error);
    g_assert_nonnull (dx);
  }
#undef EXPECT_NULL
#undef EXPECT_FALSE

  quantizers_clear (&q);
  quantizers_clear (&q5);
}

/* The construct properties, the getter, notifications and update. */
void
test_properties (void)
{
  g_autoptr(GmlpDevice) device = device_or_skip ();
  g_autoptr(GmlpGroupedLinear) layer = NULL;
  g_autoptr(GmlpQuantizer) got = NULL;
  g_autoptr(GError) error = NULL;
  Quantizers q = { 0, };
  guint notified = 0;

  if (device == NULL)
    return;

  quantizers_new (&q, device, GMLP_SCALING_RECIPE_DELAYED, GMLP_FP8_FORMAT_HYBRID, 2);
  layer = g_initable_new (GMLP_TYPE_GROUPED_LINEAR, NULL, &error,
                          "device", device, "n-groups", 2,
                          "in-features", (gint64) 32, "out-features", (gint64) 16,
                          "dtype", GMLP_DTYPE_BFLOAT16,
                          "input-quantizer", q.input, "weight-quantizer", q.weight,
                          "grad-output-quantizer", q.grad_output, NULL);
  g_assert_no_error (error);
  g_assert_true (gmlp_grouped_linear_get_quantizer (layer, GMLP_QUANTIZER_ROLE_INPUT) == q.input);
  g_assert_true (gmlp_grouped_linear_get_quantizer (layer, GMLP_QUANTIZER_ROLE_WEIGHT) == q.weight);
  g_assert_true (gmlp_grouped_linear_get_quantizer (layer, GMLP_QUANTIZER_ROLE_GRAD_OUTPUT) == q.grad_output);
  g_object_get (layer, "weight-quantizer", &got, NULL);
  g_assert_true (got == q.weight);

  /* Nothing quantized yet: nothing to update. */
  g_assert_true (gmlp_grouped_linear_update_quantizers (layer, &error));
  g_assert_no_error (error);

  g_signal_connect (layer, "notify::input-quantizer", G_CALLBACK (gmlp_test_count_notify), &notified);
  g_signal_connect (layer, "notify::grad-output-quantizer", G_CALLBACK (gmlp_test_count_notify), &notified);
  g_assert_true (gmlp_grouped_linear_set_quantizers (layer, q.input, q.weight, q.grad_output, &error));
  g_assert_cmpuint (notified, ==, 0);
  g_assert_true (gmlp_grouped_linear_set_quantizers (layer, NULL, NULL, NULL, &error));
  g_assert_no_error (error);
  g_assert_cmpuint (notified, ==, 2);
  g_assert_null (gmlp_grouped_linear_get_quantizer (layer, GMLP_QUANTIZER_ROLE_WEIGHT));
  g_assert_true (gmlp_grouped_linear_update_quantizers (layer, &error));
  quantizers_clear (&q);
}

/* Where the backends find each group's members and scales in a GEMM
 * descriptor (gmlp-backend-gemm.h), with host sizes: at the members of
 * the tensors the layer describes by their bases, the quantizer's
 * rowwise and columnwise FP8 data and their scales (per-tensor and
 * blockwise), and the weights' members and scales by a stride. Sizes that
 * are empty, under a block, and not multiples of 16 or 128. */
void
test_descriptor_layout (void)
{
  static const GmlpScalingRecipe recipes[] = { GMLP_SCALING_RECIPE_CURRENT, GMLP_SCALING_RECIPE_BLOCKWISE };
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  const gint64 rows[] = { 37, 0, 130, 16, 1 };
  const guint n = G_N_ELEMENTS (rows);
  const gint64 k = 272, o = 144;
  guint r;

  if (device == NULL)
    return;

  for (r = 0; r < G_N_ELEMENTS (recipes); r++)
    {
      gboolean blockwise = recipes[r] == GMLP_SCALING_RECIPE_BLOCKWISE;
      g_autoptr(GmlpQuantizer) qx = gmlp_quantizer_new (device, recipes[r], GMLP_FP8_FORMAT_E4M3,
                                                        GMLP_QUANTIZER_ROLE_INPUT);
      g_autoptr(GmlpQuantizer) qw = gmlp_quantizer_new (device, recipes[r], GMLP_FP8_FORMAT_E4M3,
                                                        GMLP_QUANTIZER_ROLE_WEIGHT);
      g_autoptr(GmlpGroupedTensor) x = gmlp_test_random_tensor (device, GMLP_DTYPE_BFLOAT16, rows, n,
                                                                k, 1.0, NULL);
      g_autoptr(GmlpGroupedTensor) w = NULL, x8 = NULL, w8 = NULL;
      g_autoptr(GError) error = NULL;
      GmlpGroupedTensor *x_t, *w_scales;
      gpointer members[G_N_ELEMENTS (rows)];
      const float *scales[G_N_ELEMENTS (rows)];
      GmlpBackendGemm gemm = { .n_groups = n, .n = o, .k = k, .rows = rows };
      guint g;

      w = gmlp_grouped_tensor_new_uniform (device, GMLP_DTYPE_BFLOAT16, n, o, k, &error);
      g_assert_no_error (error);
      g_assert_true (gmlp_grouped_tensor_fill_zero (w, &error));
      x8 = gmlp_quantizer_quantize_full (qx, x, TRUE, &error);
      g_assert_no_error (error);
      w8 = gmlp_quantizer_quantize_full (qw, w, TRUE, &error);
      g_assert_no_error (error);
      x_t = gmlp_grouped_tensor_get_columnwise (x8);
      g_assert_nonnull (x_t);
      w_scales = gmlp_grouped_tensor_get_scale_inv (w8);

      /* FPROP: x8 rowwise (1 × 128 blocks), W8 by a stride (128 × 128
       * tiles, or one scale per member). */
      gemm.kind = GMLP_GEMM_FPROP;
      gemm.a = (GmlpBackendOperand) {
        .layout = GMLP_BACKEND_OPERAND_ROWS,
        .dtype = (int) gmlp_grouped_tensor_get_dtype (x8),
        .base = gmlp_grouped_tensor_get_data (x8),
        .scales = { blockwise ? 1 : 0, blockwise ? (k + 127) / 128 : 0, blockwise ? 1 : 0 },
        .scale_inv = gmlp_grouped_tensor_get_data (gmlp_grouped_tensor_get_scale_inv (x8)),
        .scale_stride = (guint64) gmlp_grouped_tensor_get_member_offset (gmlp_grouped_tensor_get_scale_inv (x8), 1),
      };
      gemm.b = (GmlpBackendOperand) {
        .layout = GMLP_BACKEND_OPERAND_STRIDED,
        .dtype = (int) gmlp_grouped_tensor_get_dtype (w8),
        .base = gmlp_grouped_tensor_get_data (w8),
        .stride = (guint64) gmlp_grouped_tensor_get_member_offset (w8, 1),
        .scale_inv = gmlp_grouped_tensor_get_data (w_scales),
        .scale_stride = (guint64) gmlp_grouped_tensor_get_member_offset (w_scales, 1),
      };
      gmlp_backend_gemm_members (&gemm, &gemm.a, members);
      for (g = 0; g < n; g++)
        g_assert_true (members[g] == gmlp_grouped_tensor_get_member_data (x8, g));
      gmlp_backend_gemm_scale_members (&gemm, &gemm.a, scales);
      for (g = 0; g < n; g++)
        g_assert_true (scales[g] == gmlp_grouped_tensor_get_member_data (gmlp_grouped_tensor_get_scale_inv (x8), g));
      gmlp_backend_gemm_members (&gemm, &gemm.b, members);
      gmlp_backend_gemm_scale_members (&gemm, &gemm.b, scales);
      for (g = 0; g < n; g++)
        {
          g_assert_true (members[g] == gmlp_grouped_tensor_get_member_data (w8, g));
          g_assert_true (scales[g] == gmlp_grouped_tensor_get_member_data (w_scales, g));
        }

      /* WGRAD: the columnwise copy as b (128 × 1 blocks down the tokens). */
      gemm.kind = GMLP_GEMM_WGRAD;
      gemm.b = (GmlpBackendOperand) {
        .layout = GMLP_BACKEND_OPERAND_ROWS,
        .dtype = (int) gmlp_grouped_tensor_get_dtype (x_t),
        .base = gmlp_grouped_tensor_get_data (x_t),
        .scales = { blockwise ? 1 : 0, blockwise ? 1 : 0, blockwise ? k : 0 },
        .scale_inv = gmlp_grouped_tensor_get_data (gmlp_grouped_tensor_get_scale_inv (x_t)),
        .scale_stride = (guint64) gmlp_grouped_tensor_get_member_offset (gmlp_grouped_tensor_get_scale_inv (x_t), 1),
      };
      gmlp_backend_gemm_members (&gemm, &gemm.b, members);
      gmlp_backend_gemm_scale_members (&gemm, &gemm.b, scales);
      for (g = 0; g < n; g++)
        {
          g_assert_true (members[g] == gmlp_grouped_tensor_get_member_data (x_t, g));
          g_assert_true (scales[g] == gmlp_grouped_tensor_get_member_data (gmlp_grouped_tensor_get_scale_inv (x_t), g));
        }
    }
}
