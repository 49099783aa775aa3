/* test-gate-split.c: the router's split products keep their operands' parts
 *
 * With a BF16 input the router's gate multiplies on BF16 tensor cores, its
 * FP32 operands split into BF16 parts (libgmlp/gmlp-grouped-linear-split.c).
 * The weight's parts are split once per version of the weight and kept with
 * the gate; dy's parts are split once per backward, for DGRAD and WGRAD.
 * These tests hold a router that keeps them against a fresh router (which
 * splits everything anew) with the same weight, byte for byte: after every
 * way the weight can change (set from bytes, add_scaled as an optimizer
 * does, written through a DLPack export, written by a graph's replay), with
 * wgrad now or delayed, main_grad accumulation, and a batch of no tokens.
 * The fresh router's results are themselves held against a float64
 * reference by test-router.c; here the first results are checked against
 * one as well, so that a router that kept nothing right cannot pass.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <math.h>
#include <string.h>

#include <dlpack/dlpack.h>

#include "gmlp-test-util.h"
#include "gmlp-test-router-ref.h"

#define H 96
#define E 8
#define K 2
#define T 40

/* A router; with fused accumulation, a main_grad of zeros or of @grad. */
static GmlpRouter *
new_router (GmlpDevice       *device,
            GmlpLinearFlags   flags,
            GBytes           *grad)
{
  g_autoptr(GError) error = NULL;
  GmlpRouter *router = g_initable_new (GMLP_TYPE_ROUTER, NULL, &error,
                                       "device", device,
                                       "hidden", (gint64) H,
                                       "n-experts", E,
                                       "top-k", K,
                                       "flags", flags,
                                       NULL);

  g_assert_no_error (error);
  if (flags & GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION)
    {
      gint64 rows = E;
      g_autoptr(GmlpGroupedTensor) main_grad = NULL;

      if (grad != NULL)
        {
          main_grad = gmlp_grouped_tensor_new_from_bytes (device, GMLP_DTYPE_FLOAT32, &rows, 1, H, grad,
                                                          &error);
          g_assert_no_error (error);
        }
      else
        {
          main_grad = gmlp_grouped_tensor_new_uniform (device, GMLP_DTYPE_FLOAT32, 1, rows, H, &error);
          g_assert_no_error (error);
          g_assert_true (gmlp_grouped_tensor_fill_zero (main_grad, &error));
          g_assert_no_error (error);
        }
      g_assert_true (gmlp_router_set_main_grad (router, main_grad, &error));
      g_assert_no_error (error);
    }
  return router;
}

static GBytes *
bytes_of (GmlpGroupedTensor *tensor)
{
  g_autoptr(GError) error = NULL;
  GBytes *bytes = gmlp_grouped_tensor_to_bytes (tensor, &error);

  g_assert_no_error (error);
  return bytes;
}

static void
set_weight (GmlpRouter    *router,
            const double  *w)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GBytes) bytes = gmlp_test_encode_values (w, (gsize) E * H, GMLP_DTYPE_FLOAT32);

  g_assert_true (gmlp_router_set_weight_from_bytes (router, bytes, &error));
  g_assert_no_error (error);
}

static void
copy_weight (GmlpRouter *from,
             GmlpRouter *to)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GBytes) bytes = bytes_of (gmlp_router_get_weight (from));

  g_assert_true (gmlp_router_set_weight_from_bytes (to, bytes, &error));
  g_assert_no_error (error);
}

/* One step of @router on x (rows × H BF16) and grad_probs (rows × K): its
 * probabilities, indices, dx and the gate's gradient (main_grad when it
 * fuses), as bytes; wgrad computed by backward_dw when delayed. */
static GPtrArray *
step (GmlpRouter         *router,
      GmlpGroupedTensor  *x,
      GmlpGroupedTensor  *grad_probs)
{
  GPtrArray *out = g_ptr_array_new_with_free_func ((GDestroyNotify) g_bytes_unref);
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GmlpRouting) routing = NULL;
  g_autoptr(GmlpGroupedTensor) dx = NULL;
  GmlpLinearFlags flags = gmlp_router_get_flags (router);

  routing = gmlp_router_forward (router, x, &saved, &error);
  g_assert_no_error (error);
  dx = gmlp_router_backward (router, saved, grad_probs, &error);
  g_assert_no_error (error);
  if (flags & GMLP_LINEAR_DELAY_WGRAD_COMPUTE)
    {
      g_assert_true (gmlp_router_backward_dw (router, &error));
      g_assert_no_error (error);
    }
  g_ptr_array_add (out, bytes_of (gmlp_routing_get_probs (routing)));
  g_ptr_array_add (out, bytes_of (gmlp_routing_get_indices (routing)));
  g_ptr_array_add (out, bytes_of (dx));
  g_ptr_array_add (out, bytes_of ((flags & GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION) ?
                                  gmlp_router_get_main_grad (router) : gmlp_router_get_wgrad (router)));
  return out;
}

/* Steps @kept and a fresh router with @kept's weight (and flags) on the
 * same new tokens, and asserts the same bytes. The fresh one's main_grad
 * starts from @kept's. */
static void
assert_as_fresh (GmlpDevice  *device,
                 GmlpRouter  *kept,
                 gint64       rows,
                 const char  *what)
{
  GmlpLinearFlags flags = gmlp_router_get_flags (kept);
  g_autoptr(GBytes) grad = (flags & GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION) ?
                           bytes_of (gmlp_router_get_main_grad (kept)) : NULL;
  g_autoptr(GmlpRouter) fresh = new_router (device, flags, grad);
  g_autofree double *x_values = gmlp_test_normals ((gsize) rows * H, 1.0, GMLP_DTYPE_BFLOAT16);
  g_autofree double *gp_values = gmlp_test_normals ((gsize) rows * K, 0.5, GMLP_DTYPE_FLOAT32);
  g_autoptr(GmlpGroupedTensor) x = gmlp_test_upload_values (device, x_values, rows, H, GMLP_DTYPE_BFLOAT16);
  g_autoptr(GmlpGroupedTensor) gp = gmlp_test_upload_values (device, gp_values, rows, K, GMLP_DTYPE_FLOAT32);
  g_autoptr(GPtrArray) got = NULL, want = NULL;

  copy_weight (kept, fresh);
  got = step (kept, x, gp);
  want = step (fresh, x, gp);
  gmlp_test_assert_same_bytes_array (got, want, what);
}

/* The first step's logits against float64: the probabilities of each
 * token's chosen experts, softmax over all E then renormalized over the
 * top K, are those of x Wᵀ. */
static void
check_probs (GmlpDevice    *device,
             GmlpRouter    *router,
             const double  *w)
{
  g_autofree double *x_values = gmlp_test_normals ((gsize) T * H, 1.0, GMLP_DTYPE_BFLOAT16);
  g_autoptr(GmlpGroupedTensor) x = gmlp_test_upload_values (device, x_values, T, H, GMLP_DTYPE_BFLOAT16);
  g_autoptr(GmlpRouting) routing = NULL;
  g_autoptr(GError) error = NULL;
  g_autofree double *probs = NULL, *want = g_new (double, T * K);
  g_autofree gint64 *indices = NULL;
  gsize n;
  gint64 t;

  routing = gmlp_router_forward (router, x, NULL, &error);
  g_assert_no_error (error);
  probs = gmlp_test_download (gmlp_routing_get_probs (routing), &n);
  indices = gmlp_test_download_i64 (gmlp_routing_get_indices (routing), &n);
  g_assert_cmpuint (n, ==, T * K);
  for (t = 0; t < T; t++)
    {
      double logit[K];
      guint j;
      gint64 h;

      for (j = 0; j < K; j++)
        {
          g_assert_cmpint (indices[t * K + j], >=, 0);
          g_assert_cmpint (indices[t * K + j], <, E);
          logit[j] = 0.0;
          for (h = 0; h < H; h++)
            logit[j] += x_values[t * H + h] * w[indices[t * K + j] * H + h];
        }
      gmlp_test_router_ref_softmax (logit, K, want + t * K, NULL);
    }
  gmlp_test_assert_close (probs, want, T * K, 1e-5, "probabilities");
}

/* Every way the weight changes between steps, for each gradient option. */
static void
test_weight_versions (void)
{
  static const GmlpLinearFlags options[] = {
    0,
    GMLP_LINEAR_DELAY_WGRAD_COMPUTE,
    GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION,
    GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION | GMLP_LINEAR_DELAY_WGRAD_COMPUTE,
  };
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint o;

  if (device == NULL)
    return;
  for (o = 0; o < G_N_ELEMENTS (options); o++)
    {
      g_autoptr(GmlpRouter) router = new_router (device, options[o], NULL);
      g_autofree double *w = gmlp_test_normals ((gsize) E * H, 0.2, GMLP_DTYPE_FLOAT32);
      g_autofree double *w2 = gmlp_test_normals ((gsize) E * H, 0.2, GMLP_DTYPE_FLOAT32);
      g_autoptr(GError) error = NULL;

      set_weight (router, w);
      check_probs (device, router, w);
      /* The same weight twice: its parts kept. */
      assert_as_fresh (device, router, T, "unchanged weight");
      assert_as_fresh (device, router, T, "unchanged weight, again");
      /* Set from bytes. */
      set_weight (router, w2);
      assert_as_fresh (device, router, T, "weight set from bytes");
      /* An optimizer's step. */
      g_assert_true (gmlp_grouped_tensor_add_scaled (gmlp_router_get_weight (router), -0.5,
                                                     gmlp_router_get_main_grad (router) != NULL ?
                                                     gmlp_router_get_main_grad (router) :
                                                     gmlp_router_get_wgrad (router), &error));
      g_assert_no_error (error);
      assert_as_fresh (device, router, T, "weight after add_scaled");
      /* No tokens, then a single one. */
      assert_as_fresh (device, router, 0, "no tokens");
      assert_as_fresh (device, router, 1, "one token");
    }
}

/* A weight exported through DLPack may be written behind its version:
 * its parts are split again on every product. */
static void
test_dlpack_write (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpRouter) router = NULL;
  g_autoptr(GError) error = NULL;
  DLManagedTensor *managed;
  float *data;
  gsize i;

  if (device == NULL)
    return;
  if (gmlp_device_get_kind (device) != GMLP_DEVICE_KIND_CPU)
    {
      g_test_skip ("writes the export on the host");
      return;
    }
  router = new_router (device, 0, NULL);
  g_assert_true (gmlp_router_init_parameters (router, 5, &error));
  g_assert_no_error (error);
  assert_as_fresh (device, router, T, "before the export");

  managed = gmlp_grouped_tensor_to_dlpack (gmlp_router_get_weight (router), &error);
  g_assert_no_error (error);
  data = managed->dl_tensor.data;
  for (i = 0; i < (gsize) E * H; i++)
    data[i] = -2.0f * data[i] + 0.01f;
  assert_as_fresh (device, router, T, "written through DLPack");
  for (i = 0; i < (gsize) E * H; i++)
    data[i] = 0.5f * data[i];
  assert_as_fresh (device, router, T, "written through DLPack again");
  managed->deleter (managed);
}

/* A graph's replay writes without bumping versions: a device that has
 * captured splits the weight on every product. */
static void
test_graph_replay_write (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpRouter) router = NULL;
  g_autoptr(GmlpGroupedTensor) delta = NULL;
  g_autoptr(GmlpGraph) graph = NULL;
  g_autoptr(GError) error = NULL;
  gint64 rows = E;

  if (device == NULL)
    return;
  if (gmlp_device_get_kind (device) == GMLP_DEVICE_KIND_CPU)
    {
      g_test_skip ("graphs need a GPU");
      return;
    }
  router = new_router (device, 0, NULL);
  g_assert_true (gmlp_router_init_parameters (router, 6, &error));
  g_assert_no_error (error);
  delta = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, &rows, 1, H, 0.3, NULL);

  g_assert_true (gmlp_device_begin_capture (device, &error));
  g_assert_no_error (error);
  g_assert_true (gmlp_grouped_tensor_add_scaled (gmlp_router_get_weight (router), 1.0, delta, &error));
  g_assert_no_error (error);
  graph = gmlp_device_end_capture (device, &error);
  g_assert_no_error (error);

  assert_as_fresh (device, router, T, "after the capture");
  g_assert_true (gmlp_graph_replay (graph, &error));
  g_assert_no_error (error);
  assert_as_fresh (device, router, T, "after a replay wrote the weight");
}

int
main (int argc, char *argv[])
{
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Gmlp/GateSplit/weight-versions", test_weight_versions);
  g_test_add_func ("/Gmlp/GateSplit/dlpack-write", test_dlpack_write);
  g_test_add_func ("/Gmlp/GateSplit/graph-replay-write", test_graph_replay_write);

  return g_test_run ();
}
