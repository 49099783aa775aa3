/* test-routing-errors.c: GmlpRouting and its backend entries on bad input
 *
 * Invalid arguments and states of the routing's calls, and of the
 * backends' routing_map and permute entries: a clear GError before
 * anything is written.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "test-routing.h"

static void
assert_refused (gpointer     result,
                GError      *error,
                int          code,
                const char  *what)
{
  if (result != NULL || error == NULL || !g_error_matches (error, GMLP_ERROR, code))
    g_error ("%s: expected error %d, got %s", what, code, error != NULL ? error->message : "success");
  if (result != NULL)
    g_object_unref (result);
}

void
test_bad_input (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpDevice) cpu = gmlp_device_new (GMLP_DEVICE_KIND_CPU, 0, NULL);
  gint64 T = 6, k = 2, idx[12] = { 0, 1, 2, 3, 0, 0, 1, 1, 2, 2, 3, 3 }, twelve = 12;
  gint64 rows2[2] = { 3, 3 }, four = 4, zeros[17 * 6] = { 0 };
  float probs[12] = { 0 };
  g_autoptr(GmlpGroupedTensor) indices = NULL, probs_t = NULL, x = NULL;
  g_autoptr(GmlpRouting) routing = NULL;
  GError *error = NULL;
  GmlpGroupedTensor *t;
  gpointer r;
  guint i;

#define CHECK(call, code) \
  G_STMT_START { \
    r = (call); \
    assert_refused (r, error, (code), #call); \
    g_clear_error (&error); \
  } G_STMT_END

  if (device == NULL)
    return;

  /* Everything on the CPU; on a GPU host the GPU's tensors are foreign. */
  indices = upload (cpu, GMLP_DTYPE_INT64, idx, T, k);
  probs_t = upload (cpu, GMLP_DTYPE_FLOAT32, probs, T, k);
  x = gmlp_test_random_tensor (cpu, GMLP_DTYPE_FLOAT32, &T, 1, 8, 1.0, NULL);

  /* gmlp_routing_new */
  {
    g_autoptr(GmlpGroupedTensor) f32 = upload (cpu, GMLP_DTYPE_FLOAT32, probs, T, k);
    g_autoptr(GmlpGroupedTensor) i32 = gmlp_grouped_tensor_new (cpu, GMLP_DTYPE_INT32, &T, 1, k, NULL);
    g_autoptr(GmlpGroupedTensor) p16 = gmlp_grouped_tensor_convert (probs_t, GMLP_DTYPE_FLOAT16, NULL);
    g_autoptr(GmlpGroupedTensor) short_p = upload (cpu, GMLP_DTYPE_FLOAT32, probs, T - 1, k);
    g_autoptr(GmlpGroupedTensor) wide_p = upload (cpu, GMLP_DTYPE_FLOAT32, zeros, T, k + 1);
    g_autoptr(GmlpGroupedTensor) two = gmlp_grouped_tensor_new (cpu, GMLP_DTYPE_INT64, rows2, 2, k, NULL);
    g_autoptr(GmlpGroupedTensor) k17 = upload (cpu, GMLP_DTYPE_INT64, zeros, 6, 17);
    g_autoptr(GmlpGroupedTensor) p17 = upload (cpu, GMLP_DTYPE_FLOAT32, zeros, 6, 17);
    g_autoptr(GmlpGroupedTensor) k0 = gmlp_grouped_tensor_new (cpu, GMLP_DTYPE_INT64, &T, 1, 0, NULL);
    g_autoptr(GmlpGroupedTensor) sizes = upload (cpu, GMLP_DTYPE_INT64, (gint64[]) { 6 }, 1, 1);
    g_autoptr(GmlpGroupedTensor) dev_sized = gmlp_grouped_tensor_new_with_device_sizes (cpu, GMLP_DTYPE_INT64,
                                                                                         sizes, 6, k, NULL);
    g_autoptr(GmlpGroupedTensor) bare = g_object_new (GMLP_TYPE_GROUPED_TENSOR, NULL);

    CHECK (gmlp_routing_new (cpu, f32, probs_t, 4, &error), GMLP_ERROR_DTYPE_MISMATCH);
    CHECK (gmlp_routing_new (cpu, i32, probs_t, 4, &error), GMLP_ERROR_DTYPE_MISMATCH);
    CHECK (gmlp_routing_new (cpu, indices, p16, 4, &error), GMLP_ERROR_DTYPE_MISMATCH);
    CHECK (gmlp_routing_new (cpu, indices, indices, 4, &error), GMLP_ERROR_DTYPE_MISMATCH);
    CHECK (gmlp_routing_new (cpu, indices, short_p, 4, &error), GMLP_ERROR_SHAPE_MISMATCH);
    CHECK (gmlp_routing_new (cpu, indices, wide_p, 4, &error), GMLP_ERROR_SHAPE_MISMATCH);
    CHECK (gmlp_routing_new (cpu, two, probs_t, 4, &error), GMLP_ERROR_SHAPE_MISMATCH);
    CHECK (gmlp_routing_new (cpu, dev_sized, probs_t, 4, &error), GMLP_ERROR_SHAPE_MISMATCH);
    CHECK (gmlp_routing_new (cpu, k17, p17, 4, &error), GMLP_ERROR_INVALID_ARGUMENT);
    if (k0 != NULL)
      CHECK (gmlp_routing_new (cpu, k0, k0, 4, &error), GMLP_ERROR_INVALID_ARGUMENT);
    CHECK (gmlp_routing_new (cpu, indices, probs_t, 0, &error), GMLP_ERROR_INVALID_ARGUMENT);
    CHECK (gmlp_routing_new (cpu, indices, probs_t, 65536, &error), GMLP_ERROR_INVALID_ARGUMENT);
    r = gmlp_routing_new (cpu, bare, probs_t, 4, &error);
    g_assert_null (r);
    g_assert_nonnull (error);
    g_clear_error (&error);
    r = gmlp_routing_new (cpu, indices, bare, 4, &error);
    g_assert_null (r);
    g_assert_nonnull (error);
    g_clear_error (&error);
  }

  routing = gmlp_routing_new (cpu, indices, probs_t, 4, &error);
  g_assert_no_error (error);

  /* Bare routing */
  {
    g_autoptr(GmlpRouting) bare = g_object_new (GMLP_TYPE_ROUTING, NULL);

    g_assert_null (gmlp_routing_get_device (bare));
    g_assert_null (gmlp_routing_get_indices (bare));
    CHECK (gmlp_routing_permute (bare, x, &error), GMLP_ERROR_INVALID_STATE);
    CHECK (gmlp_routing_combine (bare, x, &error), GMLP_ERROR_INVALID_STATE);
    CHECK (gmlp_routing_permute_backward (bare, x, &error), GMLP_ERROR_INVALID_STATE);
    CHECK (gmlp_routing_combine_backward (bare, x, x, NULL, &error), GMLP_ERROR_INVALID_STATE);
  }

  /* Combine and the backwards before any permute. */
  CHECK (gmlp_routing_combine (routing, x, &error), GMLP_ERROR_INVALID_STATE);
  CHECK (gmlp_routing_permute_backward (routing, x, &error), GMLP_ERROR_INVALID_STATE);
  CHECK (gmlp_routing_combine_backward (routing, x, x, NULL, &error), GMLP_ERROR_INVALID_STATE);

  /* Permute's arguments; none of these makes the layout. */
  {
    g_autoptr(GmlpGroupedTensor) short_x = gmlp_test_random_tensor (cpu, GMLP_DTYPE_FLOAT32, &four, 1, 8, 1.0, NULL);
    g_autoptr(GmlpGroupedTensor) x2 = gmlp_test_random_tensor (cpu, GMLP_DTYPE_FLOAT32, rows2, 2, 8, 1.0, NULL);
    g_autoptr(GmlpGroupedTensor) xi = gmlp_grouped_tensor_new (cpu, GMLP_DTYPE_INT64, &T, 1, 8, NULL);
    g_autoptr(GmlpGroupedTensor) x8 = gmlp_grouped_tensor_convert (x, GMLP_DTYPE_FLOAT8_E4M3, NULL);
    static const guint bad_padding[] = { 3, 48, 256, 1u << 31, G_MAXUINT };
    static const double bad_factor[] = { -1.0, -1e-300, NAN, INFINITY, -INFINITY };

    CHECK (gmlp_routing_permute (routing, short_x, &error), GMLP_ERROR_SHAPE_MISMATCH);
    CHECK (gmlp_routing_permute (routing, x2, &error), GMLP_ERROR_SHAPE_MISMATCH);
    CHECK (gmlp_routing_permute (routing, xi, &error), GMLP_ERROR_DTYPE_MISMATCH);
    if (x8 != NULL)
      CHECK (gmlp_routing_permute (routing, x8, &error), GMLP_ERROR_DTYPE_MISMATCH);
    for (i = 0; i < G_N_ELEMENTS (bad_padding); i++)
      CHECK (gmlp_routing_permute_full (routing, x, bad_padding[i], 0.0, &error), GMLP_ERROR_INVALID_ARGUMENT);
    for (i = 0; i < G_N_ELEMENTS (bad_factor); i++)
      CHECK (gmlp_routing_permute_full (routing, x, 16, bad_factor[i], &error), GMLP_ERROR_INVALID_ARGUMENT);
    g_assert_null (routing->sizes);
  }

  /* One layout per routing: padding 16 first; 0 and 1 are the same. */
  {
    g_autoptr(GmlpGroupedTensor) perm = gmlp_routing_permute_full (routing, x, 16, 0.0, &error);
    g_autoptr(GmlpGroupedTensor) again = NULL, host = NULL, other_cap = NULL, ints = NULL;
    g_autoptr(GmlpGroupedTensor) go = gmlp_test_random_tensor (cpu, GMLP_DTYPE_FLOAT32, &T, 1, 8, 1.0, NULL);
    g_autoptr(GmlpGroupedTensor) go_short = gmlp_test_random_tensor (cpu, GMLP_DTYPE_FLOAT32, &four, 1, 8, 1.0, NULL);
    g_autoptr(GmlpGroupedTensor) go_wide = gmlp_test_random_tensor (cpu, GMLP_DTYPE_FLOAT32, &T, 1, 9, 1.0, NULL);
    g_autoptr(GmlpRouting) other = NULL, unpadded = NULL;
    g_autoptr(GmlpGroupedTensor) other_perm = NULL, p0 = NULL, p1 = NULL;
    GmlpGroupedTensor *sizes;

    g_assert_no_error (error);
    CHECK (gmlp_routing_permute_full (routing, x, 32, 0.0, &error), GMLP_ERROR_INVALID_STATE);
    CHECK (gmlp_routing_permute_full (routing, x, 16, 1.0, &error), GMLP_ERROR_INVALID_STATE);
    CHECK (gmlp_routing_permute (routing, x, &error), GMLP_ERROR_INVALID_STATE);
    again = gmlp_routing_permute_full (routing, x, 16, 0.0, &error);
    g_assert_no_error (error);
    g_assert_true (gmlp_grouped_tensor_get_sizes (again, NULL) == gmlp_grouped_tensor_get_sizes (perm, NULL));

    unpadded = gmlp_routing_new (cpu, indices, probs_t, 4, &error);
    g_assert_no_error (error);
    p0 = gmlp_routing_permute_full (unpadded, x, 0, 0.0, &error);
    g_assert_no_error (error);
    p1 = gmlp_routing_permute_full (unpadded, x, 1, 0.0, &error);
    g_assert_no_error (error);

    /* Tensors not in this routing's layout. */
    host = gmlp_test_random_tensor (cpu, GMLP_DTYPE_FLOAT32, &twelve, 1, 8, 1.0, NULL);
    CHECK (gmlp_routing_combine (routing, host, &error), GMLP_ERROR_INVALID_ARGUMENT);
    CHECK (gmlp_routing_combine (routing, x, &error), GMLP_ERROR_INVALID_ARGUMENT);
    CHECK (gmlp_routing_permute_backward (routing, host, &error), GMLP_ERROR_INVALID_ARGUMENT);
    CHECK (gmlp_routing_combine (routing, p0, &error), GMLP_ERROR_INVALID_ARGUMENT);
    CHECK (gmlp_routing_combine (unpadded, perm, &error), GMLP_ERROR_INVALID_ARGUMENT);
    other = gmlp_routing_new (cpu, indices, probs_t, 4, &error);
    other_perm = gmlp_routing_permute_full (other, x, 16, 0.0, &error);
    g_assert_no_error (error);
    CHECK (gmlp_routing_combine (routing, other_perm, &error), GMLP_ERROR_INVALID_ARGUMENT);
    CHECK (gmlp_routing_combine_backward (routing, go, other_perm, NULL, &error), GMLP_ERROR_INVALID_ARGUMENT);
    sizes = gmlp_grouped_tensor_get_sizes (perm, NULL);
    other_cap = gmlp_grouped_tensor_new_with_device_sizes (cpu, GMLP_DTYPE_FLOAT32, sizes,
                                                           gmlp_grouped_tensor_get_row_capacity (perm) + 1, 8, NULL);
    CHECK (gmlp_routing_combine (routing, other_cap, &error), GMLP_ERROR_INVALID_ARGUMENT);
    ints = gmlp_grouped_tensor_new_with_device_sizes (cpu, GMLP_DTYPE_INT32, sizes,
                                                      gmlp_grouped_tensor_get_row_capacity (perm), 8, NULL);
    CHECK (gmlp_routing_combine (routing, ints, &error), GMLP_ERROR_DTYPE_MISMATCH);
    /* The permute backward's addend: FP32, T × the gradient's columns. */
    CHECK (gmlp_routing_permute_backward_add (routing, perm, go_short, &error), GMLP_ERROR_SHAPE_MISMATCH);
    CHECK (gmlp_routing_permute_backward_add (routing, perm, go_wide, &error), GMLP_ERROR_SHAPE_MISMATCH);
    CHECK (gmlp_routing_permute_backward_add (routing, perm, ints, &error), GMLP_ERROR_DTYPE_MISMATCH);

    /* combine_backward's shapes */
    CHECK (gmlp_routing_combine_backward (routing, go_short, perm, NULL, &error), GMLP_ERROR_SHAPE_MISMATCH);
    CHECK (gmlp_routing_combine_backward (routing, go_wide, perm, NULL, &error), GMLP_ERROR_SHAPE_MISMATCH);
    CHECK (gmlp_routing_combine_backward (routing, perm, perm, NULL, &error), GMLP_ERROR_SHAPE_MISMATCH);

    /* Foreign tensors, where there is another device. */
    if (gmlp_device_get_kind (device) != GMLP_DEVICE_KIND_CPU)
      {
        g_autoptr(GmlpGroupedTensor) gx = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, &T, 1, 8, 1.0, NULL);
        g_autoptr(GmlpGroupedTensor) gi = upload (device, GMLP_DTYPE_INT64, idx, T, k);
        g_autoptr(GmlpGroupedTensor) gp = upload (device, GMLP_DTYPE_FLOAT32, probs, T, k);

        CHECK (gmlp_routing_new (cpu, gi, probs_t, 4, &error), GMLP_ERROR_INVALID_ARGUMENT);
        CHECK (gmlp_routing_new (cpu, indices, gp, 4, &error), GMLP_ERROR_INVALID_ARGUMENT);
        CHECK (gmlp_routing_permute_full (routing, gx, 16, 0.0, &error), GMLP_ERROR_INVALID_ARGUMENT);
        CHECK (gmlp_routing_combine (routing, gx, &error), GMLP_ERROR_INVALID_ARGUMENT);
        CHECK (gmlp_routing_combine_backward (routing, gx, perm, NULL, &error), GMLP_ERROR_INVALID_ARGUMENT);
      }

    /* Writes the routing did not expect: the layout's sizes, then its
     * probabilities, then its indices. */
    g_assert_true (gmlp_grouped_tensor_fill_zero (sizes, &error));
    CHECK (gmlp_routing_combine (routing, perm, &error), GMLP_ERROR_INVALID_STATE);
    CHECK (gmlp_routing_permute_full (routing, x, 16, 0.0, &error), GMLP_ERROR_INVALID_STATE);
    t = gmlp_routing_combine (unpadded, p1, &error);
    g_assert_no_error (error);
    g_object_unref (t);
    g_assert_true (gmlp_grouped_tensor_fill_zero (probs_t, &error));
    CHECK (gmlp_routing_combine (unpadded, p1, &error), GMLP_ERROR_INVALID_STATE);
  }
  {
    g_autoptr(GmlpGroupedTensor) i2 = upload (cpu, GMLP_DTYPE_INT64, idx, T, k);
    g_autoptr(GmlpGroupedTensor) p2 = upload (cpu, GMLP_DTYPE_FLOAT32, probs, T, k);
    g_autoptr(GmlpRouting) fresh = gmlp_routing_new (cpu, i2, p2, 4, &error);

    g_assert_no_error (error);
    g_assert_true (gmlp_grouped_tensor_fill_zero (i2, &error));
    CHECK (gmlp_routing_permute (fresh, x, &error), GMLP_ERROR_INVALID_STATE);
  }
#undef CHECK
}

/* The backend entries themselves refuse bad arguments with a GError, the
 * same on every backend, before they enqueue anything. */
void
test_backend_checks (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpGroupedTensor) idx = NULL, sizes = NULL, row_of = NULL, choice_of = NULL, out = NULL;
  gint64 rows = 8, expert_sizes[2] = { 2, 0 }, zeros[8] = { 0 };
  GmlpBackendRoutingMap map, bad_map;
  GmlpBackendPermute p, bad;
  GError *error = NULL;
  guint i;

  if (device == NULL)
    return;
  idx = upload (device, GMLP_DTYPE_INT64, zeros, 4, 2);
  sizes = gmlp_test_sizes_tensor (device, expert_sizes, 2);
  row_of = gmlp_grouped_tensor_new (device, GMLP_DTYPE_INT64, &rows, 1, 1, &error);
  choice_of = gmlp_grouped_tensor_new (device, GMLP_DTYPE_INT64, &rows, 1, 1, &error);
  out = gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, &rows, 1, 4, &error);
  g_assert_no_error (error);

  map = (GmlpBackendRoutingMap) {
    .n_tokens = 4, .top_k = 2, .n_experts = 2, .indices = gmlp_grouped_tensor_get_data (idx),
    .padding = 1, .expert_capacity = -1, .row_capacity = 8,
    .sizes = gmlp_grouped_tensor_get_data (sizes), .row_of = gmlp_grouped_tensor_get_data (row_of),
    .choice_of = gmlp_grouped_tensor_get_data (choice_of),
  };
  for (i = 0; i < 7; i++)
    {
      bad_map = map;
      switch (i)
        {
        case 0: bad_map.padding = 0; break;
        case 1: bad_map.top_k = 17; break;
        case 2: bad_map.n_experts = 0; break;
        case 3: bad_map.n_tokens = -1; break;
        case 4: bad_map.expert_capacity = -2; break;
        case 5: bad_map.choice_of = NULL; break;
        default: bad_map.indices = NULL; break;
        }
      g_assert_false (GMLP_DEVICE_CALL (device, routing_map, &bad_map, &error));
      g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
      g_clear_error (&error);
    }

  p = (GmlpBackendPermute) {
    .kind = GMLP_PERMUTE_FORWARD,
    .shape = { gmlp_grouped_tensor_get_data (sizes), 1, 4, 8 },
    .n_tokens = 4, .top_k = 2,
    .row_of = gmlp_grouped_tensor_get_data (row_of),
    .choice_of = gmlp_grouped_tensor_get_data (choice_of),
    .tokens = gmlp_grouped_tensor_get_data (out), .tokens_dtype = GMLP_DTYPE_FLOAT32,
    .out = gmlp_grouped_tensor_get_data (out), .out_dtype = GMLP_DTYPE_FLOAT32,
  };
  for (i = 0; i < 9; i++)
    {
      bad = p;
      switch (i)
        {
        case 0: bad.kind = (GmlpPermuteKind) 4; break;
        case 1: bad.shape.cols = 0; break;
        case 2: bad.shape.n_groups = 0; break;
        case 3: bad.out_dtype = GMLP_DTYPE_INT64; break;
        case 4: bad.tokens_dtype = GMLP_DTYPE_FLOAT8_E4M3; break;
        case 5: bad.choice_of = NULL; break;
        case 6: bad.kind = GMLP_PERMUTE_COMBINE; break;   /* no probs, no permuted input */
        case 7: bad.addend = gmlp_grouped_tensor_get_data (out); break;   /* only BACKWARD's */
        default: bad.top_k = 0; break;
        }
      g_assert_false (GMLP_DEVICE_CALL (device, permute, &bad, &error));
      g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
      g_clear_error (&error);
    }
}
