/* test-robustness.c: sizes that overflow, and objects made by g_object_new()
 *
 * Every class made from its construct properties alone is complete; made
 * bare, or with properties that cannot work, its methods fail with a GError
 * instead of crashing. Byte counts that would wrap in 64 bits are errors.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <locale.h>
#include <math.h>
#include <string.h>

#include "gmlp-test-util.h"

#define HUGE_SIDE (G_GINT64_CONSTANT (1) << 31)

static void
assert_refused (gpointer    result,
                GError     *error,
                GQuark      domain,
                int         code,
                const char *what)
{
  if (result != NULL || error == NULL)
    g_error ("%s: expected an error, got %s", what, result != NULL ? "a result" : "no GError");
  if (!g_error_matches (error, domain, code))
    g_error ("%s: expected error code %d, got %s %d: %s", what, code,
             g_quark_to_string (error->domain), error->code, error->message);
}

/* rows × cols × 4 is 2^64 here: it wrapped to 0 and was accepted. */
static void
test_sizes_overflow (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GBytes) empty = g_bytes_new (NULL, 0);
  g_autoptr(GmlpGroupedTensor) ok = NULL;
  gint64 huge_rows[] = { HUGE_SIDE };
  gint64 three_huge[] = { HUGE_SIDE, HUGE_SIDE, HUGE_SIDE };
  gint64 zero_rows[] = { 0, 0 };
  gint64 n_sizes = 4;
  GmlpGroupedTensor *t;
  GmlpGroupedTensor *sizes;
  GmlpGroupedLinear *layer;
  GError *error = NULL;

  if (device == NULL)
    return;

  t = gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, huge_rows, 1, HUGE_SIDE, &error);
  assert_refused (t, error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT, "new 2^31 × 2^31");
  g_clear_error (&error);

  t = gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, three_huge, 3, HUGE_SIDE,
                               &error);
  assert_refused (t, error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT, "new 3 × 2^31 × 2^31");
  g_clear_error (&error);

  t = gmlp_grouped_tensor_new_uniform (device, GMLP_DTYPE_FLOAT32, 1, HUGE_SIDE, HUGE_SIDE, &error);
  assert_refused (t, error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT, "new_uniform 2^31 × 2^31");
  g_clear_error (&error);

  /* The length check compared 0 with the wrapped 0. */
  t = gmlp_grouped_tensor_new_from_bytes (device, GMLP_DTYPE_FLOAT32, huge_rows, 1, HUGE_SIDE,
                                          empty, &error);
  assert_refused (t, error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT, "new_from_bytes 2^31 × 2^31");
  g_clear_error (&error);

  /* An empty GBytes has no data pointer: for members of no rows it is the
   * right length, and nothing may be copied from it. */
  ok = gmlp_grouped_tensor_new_from_bytes (device, GMLP_DTYPE_FLOAT32, zero_rows, 2, 3, empty, &error);
  g_assert_no_error (error);
  g_assert_cmpint (gmlp_grouped_tensor_get_total_rows (ok), ==, 0);

  /* Device sizes: the capacity times the row bytes wraps too. */
  sizes = gmlp_grouped_tensor_new (device, GMLP_DTYPE_INT64, &n_sizes, 1, 1, &error);
  g_assert_no_error (error);
  t = gmlp_grouped_tensor_new_with_device_sizes (device, GMLP_DTYPE_FLOAT32, sizes,
                                                 G_GINT64_CONSTANT (1) << 40, HUGE_SIDE, &error);
  assert_refused (t, error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT, "device sizes 2^40 × 2^31");
  g_clear_error (&error);
  g_object_unref (sizes);

  /* A layer whose weights alone would wrap the byte count. */
  layer = gmlp_grouped_linear_new_full (device, 65535, G_MAXINT32, G_MAXINT32, GMLP_DTYPE_FLOAT32,
                                        GMLP_LINEAR_SINGLE_GROUPED_WEIGHT, &error);
  assert_refused (layer, error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT, "layer 2^31 features");
  g_clear_error (&error);
}

/* A tensor from its properties equals one from the constructor; a bare one
 * refuses every method. */
static void
test_construct_tensor (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpGroupedTensor) made = NULL;
  g_autoptr(GmlpGroupedTensor) bare = NULL;
  g_autoptr(GmlpGroupedTensor) bad = NULL;
  g_autoptr(GmlpGroupedTensor) sizes = NULL;
  g_autoptr(GmlpGroupedTensor) device_sized = NULL;
  g_autoptr(GBytes) bytes = NULL;
  g_autoptr(GError) error = NULL;
  gint64 rows[] = { 3, 0, 5 };
  gint64 n_sizes = 3;
  guint n;

  if (device == NULL)
    return;

  made = g_object_new (GMLP_TYPE_GROUPED_TENSOR,
                       "device", device,
                       "dtype", GMLP_DTYPE_BFLOAT16,
                       "rows", g_variant_new_fixed_array (G_VARIANT_TYPE_INT64, rows, 3, sizeof (gint64)),
                       "cols", (gint64) 7,
                       NULL);
  g_assert_true (g_initable_init (G_INITABLE (made), NULL, &error));
  g_assert_no_error (error);
  g_assert_cmpuint (gmlp_grouped_tensor_get_n_groups (made), ==, 3);
  g_assert_cmpint (gmlp_grouped_tensor_get_rows (made, 2), ==, 5);
  g_assert_cmpint (gmlp_grouped_tensor_get_total_rows (made), ==, 8);
  g_assert_true (gmlp_grouped_tensor_fill_zero (made, &error));
  bytes = gmlp_grouped_tensor_to_bytes (made, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (g_bytes_get_size (bytes), ==, 8 * 7 * 2);

  sizes = gmlp_grouped_tensor_new (device, GMLP_DTYPE_INT64, &n_sizes, 1, 1, &error);
  g_assert_no_error (error);
  device_sized = g_object_new (GMLP_TYPE_GROUPED_TENSOR,
                               "device", device, "sizes", sizes, "row-capacity", (gint64) 16,
                               "cols", (gint64) 4, NULL);
  g_assert_true (g_initable_init (G_INITABLE (device_sized), NULL, &error));
  g_assert_false (gmlp_grouped_tensor_has_host_sizes (device_sized));
  g_assert_cmpuint (gmlp_grouped_tensor_get_n_groups (device_sized), ==, 3);
  g_assert_cmpint (gmlp_grouped_tensor_get_row_capacity (device_sized), ==, 16);

  /* Negative columns: a construction error, not GObject's warning. */
  bad = g_object_new (GMLP_TYPE_GROUPED_TENSOR,
                      "rows", g_variant_new_fixed_array (G_VARIANT_TYPE_INT64, rows, 3, sizeof (gint64)),
                      "cols", (gint64) -1, NULL);
  g_assert_false (g_initable_init (G_INITABLE (bad), NULL, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);
  g_assert_false (gmlp_grouped_tensor_fill_zero (bad, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);

  bare = g_object_new (GMLP_TYPE_GROUPED_TENSOR, NULL);
  g_assert_false (g_initable_init (G_INITABLE (bare), NULL, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
  g_clear_error (&error);
  g_assert_null (gmlp_grouped_tensor_to_bytes (bare, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
  g_clear_error (&error);
  g_assert_null (gmlp_grouped_tensor_read_sizes (bare, &n, &error));
  g_assert_cmpuint (n, ==, 0);
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
  g_clear_error (&error);
  g_assert_false (gmlp_grouped_tensor_add_scaled (made, 1.0, bare, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
  g_clear_error (&error);
  g_assert_cmpint (gmlp_grouped_tensor_get_rows (bare, 0), ==, -1);
  g_assert_cmpint (gmlp_grouped_tensor_get_member_offset (bare, 7), ==, -1);
  g_assert_cmpuint (gmlp_grouped_tensor_get_n_groups (bare), ==, 0);
}

/* GroupedLinear from g_object_new() alone (what `Gmlp.GroupedLinear(...)`
 * does in Python): forward gives x Wᵀ against a float64 reference, and a
 * second init changes nothing. */
static void
test_construct_linear (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpGroupedLinear) layer = NULL;
  g_autoptr(GmlpGroupedLinear) bad = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL;
  g_autoptr(GmlpGroupedTensor) y = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GmlpSavedActivations) bare_saved = NULL;
  g_autoptr(GBytes) w_before = NULL;
  g_autoptr(GBytes) w_after = NULL;
  g_autoptr(GError) error = NULL;
  g_autofree double *xv = NULL;
  g_autofree double *wv = NULL;
  g_autofree double *yv = NULL;
  g_autofree double *want = NULL;
  gint64 rows[] = { 3, 5 };
  gsize n;

  if (device == NULL)
    return;

  layer = g_object_new (GMLP_TYPE_GROUPED_LINEAR, "device", device, "n-groups", 2,
                        "in-features", (gint64) 4, "out-features", (gint64) 8, NULL);
  w_before = gmlp_grouped_tensor_to_bytes (gmlp_grouped_linear_get_weight (layer), &error);
  g_assert_no_error (error);
  g_assert_true (g_initable_init (G_INITABLE (layer), NULL, &error));
  g_assert_true (g_initable_init (G_INITABLE (layer), NULL, &error));
  w_after = gmlp_grouped_tensor_to_bytes (gmlp_grouped_linear_get_weight (layer), &error);
  g_assert_no_error (error);
  g_assert_true (g_bytes_equal (w_before, w_after));

  x = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, rows, 2, 4, 1.0, &xv);
  y = gmlp_grouped_linear_forward (layer, x, &saved, &error);
  g_assert_no_error (error);
  wv = gmlp_test_download (gmlp_grouped_linear_get_weight (layer), &n);
  g_assert_cmpuint (n, ==, 2 * 8 * 4);
  yv = gmlp_test_download (y, &n);
  g_assert_cmpuint (n, ==, 8 * 8);
  want = g_new0 (double, 8 * 8);
  gmlp_test_linear_reference (rows, 2, 4, 8, xv, wv, NULL, NULL, NULL, want, NULL, NULL, NULL);
  gmlp_test_assert_close (yv, want, n, gmlp_test_tolerance (GMLP_DTYPE_FLOAT32), "forward");

  /* A bare SavedActivations belongs to no layer. */
  bare_saved = g_object_new (GMLP_TYPE_SAVED_ACTIVATIONS, NULL);
  g_assert_null (gmlp_grouped_linear_backward (layer, bare_saved, y, &error));
  g_assert_nonnull (error);
  g_clear_error (&error);

  /* Zero groups: the construction fails, and so does every method, with
   * the reason; getters give nothing. */
  bad = g_object_new (GMLP_TYPE_GROUPED_LINEAR, "device", device, "n-groups", 0, NULL);
  g_assert_false (g_initable_init (G_INITABLE (bad), NULL, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);
  g_assert_null (gmlp_grouped_linear_forward (bad, x, NULL, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);
  g_assert_false (gmlp_grouped_linear_init_parameters (bad, 1, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);
  g_assert_null (gmlp_grouped_linear_get_weight (bad));
  g_assert_null (gmlp_grouped_linear_get_weight_member (bad, 0));
  g_assert_null (gmlp_grouped_linear_get_weight_member (layer, 99));
  g_assert_null (gmlp_grouped_linear_get_quantizer (layer, 99));
}

/* GroupedMLP from g_object_new(): complete; a second init keeps the layers
 * (it made new ones, and leaked the old, before). */
static void
test_construct_mlp (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpGroupedMLP) mlp = NULL;
  g_autoptr(GmlpGroupedMLP) bad = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL;
  g_autoptr(GmlpGroupedTensor) y = NULL;
  g_autoptr(GError) error = NULL;
  g_autofree double *xv = NULL;
  GmlpGroupedLinear *fc1;
  gint64 rows[] = { 2, 4, 0 };

  if (device == NULL)
    return;

  mlp = g_object_new (GMLP_TYPE_GROUPED_MLP, "device", device, "n-groups", 3,
                      "hidden", (gint64) 8, "ffn-hidden", (gint64) 16,
                      "activation", GMLP_ACTIVATION_SWIGLU, NULL);
  fc1 = gmlp_grouped_mlp_get_fc1 (mlp);
  g_assert_nonnull (fc1);
  g_assert_cmpint (gmlp_grouped_linear_get_out_features (fc1), ==, 32);
  g_assert_true (g_initable_init (G_INITABLE (mlp), NULL, &error));
  g_assert_true (g_initable_init (G_INITABLE (mlp), NULL, &error));
  g_assert_true (gmlp_grouped_mlp_get_fc1 (mlp) == fc1);

  x = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, rows, 3, 8, 1.0, &xv);
  y = gmlp_grouped_mlp_forward (mlp, x, NULL, &error);
  g_assert_no_error (error);
  g_assert_cmpint (gmlp_grouped_tensor_get_total_rows (y), ==, 6);

  bad = g_object_new (GMLP_TYPE_GROUPED_MLP, "device", device, "hidden", (gint64) -3, NULL);
  g_assert_false (g_initable_init (G_INITABLE (bad), NULL, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);
  g_assert_null (gmlp_grouped_mlp_forward (bad, x, NULL, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);
  g_assert_null (gmlp_grouped_mlp_get_fc1 (bad));
  g_assert_false (gmlp_grouped_mlp_get_grad_added_to_main_grad (bad));
}

/* Device, Event, Graph, Quantizer and OffloadContext from g_object_new(). */
static void
test_construct_others (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpDevice) same = NULL;
  g_autoptr(GmlpDevice) missing = NULL;
  g_autoptr(GmlpEvent) event = NULL;
  g_autoptr(GmlpEvent) bare_event = NULL;
  g_autoptr(GmlpGraph) graph = NULL;
  g_autoptr(GmlpQuantizer) quantizer = NULL;
  g_autoptr(GmlpOffloadContext) context = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL;
  g_autoptr(GmlpGroupedTensor) q = NULL;
  g_autoptr(GError) error = NULL;
  g_autofree double *xv = NULL;
  gint64 rows[] = { 4 };
  double ms;

  if (device == NULL)
    return;

  same = g_object_new (GMLP_TYPE_DEVICE, "kind", gmlp_device_get_kind (device),
                       "ordinal", gmlp_device_get_ordinal (device), NULL);
  g_assert_true (same == device);

  missing = g_object_new (GMLP_TYPE_DEVICE, "kind", GMLP_DEVICE_KIND_CUDA, "ordinal", 4096, NULL);
  g_assert_false (g_initable_init (G_INITABLE (missing), NULL, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_NO_DEVICE);
  g_clear_error (&error);
  g_assert_false (gmlp_device_synchronize (missing, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_NO_DEVICE);
  g_clear_error (&error);
  g_assert_false (gmlp_device_is_capturing (missing));
  g_assert_nonnull (gmlp_device_get_name (missing));
  g_assert_null (gmlp_grouped_tensor_new (missing, GMLP_DTYPE_FLOAT32, rows, 1, 4, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_NO_DEVICE);
  g_clear_error (&error);
  g_assert_null (gmlp_grouped_linear_new (missing, 2, 4, 4, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_NO_DEVICE);
  g_clear_error (&error);

  event = g_object_new (GMLP_TYPE_EVENT, "device", device, NULL);
  g_assert_true (g_initable_init (G_INITABLE (event), NULL, &error));
  g_assert_true (gmlp_event_get_device (event) == device);
  g_assert_true (gmlp_event_synchronize (event, &error));
  g_assert_true (gmlp_event_is_complete (event));

  bare_event = g_object_new (GMLP_TYPE_EVENT, NULL);
  g_assert_true (gmlp_event_is_complete (bare_event));
  g_assert_true (gmlp_event_synchronize (bare_event, &error));
  g_assert_true (gmlp_event_wait_on_device (bare_event, device, &error));
  g_assert_null (gmlp_event_get_native_handle (bare_event));
  g_assert_false (gmlp_event_elapsed_ms (bare_event, event, &ms, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);

  graph = g_object_new (GMLP_TYPE_GRAPH, NULL);
  g_assert_false (gmlp_graph_replay (graph, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
  g_clear_error (&error);
  g_assert_null (gmlp_graph_get_device (graph));

  quantizer = g_object_new (GMLP_TYPE_QUANTIZER, "recipe", GMLP_SCALING_RECIPE_CURRENT, NULL);
  g_assert_nonnull (gmlp_quantizer_get_device (quantizer));
  x = gmlp_test_random_tensor (gmlp_quantizer_get_device (quantizer), GMLP_DTYPE_FLOAT32, rows, 1,
                               16, 1.0, &xv);
  q = gmlp_quantizer_quantize (quantizer, x, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_dtype_is_fp8 (gmlp_grouped_tensor_get_dtype (q)));

  /* Values outside the enumerations: the quantizer's error, not GObject's
   * warning, and no critical from the getters. */
  g_clear_object (&quantizer);
  quantizer = gmlp_quantizer_new (device, 99, GMLP_FP8_FORMAT_HYBRID, GMLP_QUANTIZER_ROLE_INPUT);
  g_clear_object (&q);
  q = gmlp_quantizer_quantize (quantizer, x, &error);
  g_assert_null (q);
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);
  g_assert_null (gmlp_grouped_mlp_new_full (device, 2, 8, 8, GMLP_ACTIVATION_GELU, GMLP_DTYPE_FLOAT32,
                                            0xff, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);
  g_assert_null (gmlp_device_new_from_string ("\xff\xfe", &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_assert_true (g_utf8_validate (error->message, -1, NULL));
  g_clear_error (&error);

  context = g_object_new (GMLP_TYPE_OFFLOAD_CONTEXT, NULL);
  g_assert_nonnull (gmlp_offload_context_get_device (context));
  gmlp_offload_context_push_thread_default (context, TRUE);
  g_assert_true (gmlp_offload_context_pop_thread_default (context, &error));
  g_assert_no_error (error);
}

int
main (int argc, char *argv[])
{
  setlocale (LC_ALL, "");
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Gmlp/Robustness/sizes/overflow", test_sizes_overflow);
  g_test_add_func ("/Gmlp/Robustness/construct/grouped-tensor", test_construct_tensor);
  g_test_add_func ("/Gmlp/Robustness/construct/grouped-linear", test_construct_linear);
  g_test_add_func ("/Gmlp/Robustness/construct/grouped-mlp", test_construct_mlp);
  g_test_add_func ("/Gmlp/Robustness/construct/others", test_construct_others);

  return g_test_run ();
}
