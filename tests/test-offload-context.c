/* test-offload-context.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <locale.h>
#include <string.h>

#include "gmlp-test-util.h"

#define HIDDEN 48
#define N_GROUPS 4

static GmlpGroupedLinear *
new_layer (GmlpDevice *device, GmlpDType dtype, GmlpLinearFlags extra, guint64 seed)
{
  g_autoptr(GError) error = NULL;
  GmlpGroupedLinear *layer = gmlp_grouped_linear_new_full (device, N_GROUPS, HIDDEN, HIDDEN, dtype,
                                                           GMLP_LINEAR_SINGLE_GROUPED_WEIGHT |
                                                           GMLP_LINEAR_BIAS | extra, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_grouped_linear_init_parameters (layer, seed, NULL));
  return layer;
}

static GmlpSavedActivations *
forward (GmlpGroupedLinear *layer, GmlpGroupedTensor *x, GmlpGroupedTensor **y)
{
  g_autoptr(GError) error = NULL;
  GmlpSavedActivations *saved = NULL;

  *y = gmlp_grouped_linear_forward (layer, x, &saved, &error);
  g_assert_no_error (error);
  return saved;
}

/* enabled { layer0; disabled { layer1 }; layer2 } and deeper shapes: which
 * forwards were told to offload. A script is a string: 'E' pushes enabled,
 * 'D' disabled, ')' pops, 'f' runs a forward and records what it was told. */
static void
test_nesting (void)
{
  static const struct {
    const char *script;
    const char *expected;   /* one letter per 'f': 'o' offload, 'k' keep */
  } cases[] = {
    { "E f D f ) f )", "oko" },
    { "f E f ) f", "kok" },
    { "D f E f E f ) D f ) f ) f )", "kookok" },
    { "E E D E f ) f ) f ) f )", "okoo" },
    { "D D D f ) ) )", "k" },
  };
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpOffloadContext) ctx = NULL;
  g_autoptr(GmlpGroupedLinear) layer = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL;
  gint64 rows[N_GROUPS] = { 3, 0, 5, 2 };
  guint c;

  if (device == NULL)
    return;

  ctx = gmlp_offload_context_new (device, NULL);
  layer = new_layer (device, GMLP_DTYPE_FLOAT32, 0, 1);
  x = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, rows, N_GROUPS, HIDDEN, 1.0, NULL);

  for (c = 0; c < G_N_ELEMENTS (cases); c++)
    {
      g_autoptr(GString) got = g_string_new ("");
      const char *p;

      g_assert_null (gmlp_offload_context_get_thread_default ());
      for (p = cases[c].script; *p != '\0'; p++)
        {
          if (*p == 'E' || *p == 'D')
            {
              gmlp_offload_context_push_thread_default (ctx, *p == 'E');
              g_assert_true (gmlp_offload_context_get_thread_default () == ctx);
              g_assert_true (gmlp_offload_context_get_enabled (ctx) == (*p == 'E'));
            }
          else if (*p == ')')
            {
              g_assert_true (gmlp_offload_context_pop_thread_default (ctx, NULL));
            }
          else if (*p == 'f')
            {
              g_autoptr(GmlpGroupedTensor) y = NULL;
              g_autoptr(GmlpSavedActivations) saved = forward (layer, x, &y);
              gboolean offload = gmlp_saved_activations_get_offload (saved);

              g_string_append_c (got, offload ? 'o' : 'k');
              g_assert_true ((gmlp_saved_activations_get_host_nbytes (saved) > 0) == offload);
              /* The most recent offload keeps its device copy until a flush. */
              g_assert_cmpuint (gmlp_saved_activations_get_nbytes (saved), >, 0);
              gmlp_offload_context_flush (ctx);
              g_assert_true ((gmlp_saved_activations_get_nbytes (saved) == 0) == offload);
            }
        }
      g_assert_cmpstr (got->str, ==, cases[c].expected);
      g_assert_cmpuint (gmlp_offload_context_get_depth (), ==, 0);
    }
}

/* Unbalanced pops are errors and leave the stack as it was. */
static void
test_unbalanced (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpOffloadContext) a = NULL, b = NULL;
  g_autoptr(GError) error = NULL;

  if (device == NULL)
    return;

  a = gmlp_offload_context_new (device, NULL);
  b = gmlp_offload_context_new (device, NULL);

  g_assert_false (gmlp_offload_context_pop_thread_default (a, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
  g_clear_error (&error);

  gmlp_offload_context_push_thread_default (a, TRUE);
  gmlp_offload_context_push_thread_default (b, FALSE);
  g_assert_false (gmlp_offload_context_pop_thread_default (a, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
  g_clear_error (&error);
  g_assert_cmpuint (gmlp_offload_context_get_depth (), ==, 2);
  g_assert_true (gmlp_offload_context_get_thread_default () == b);
  g_assert_false (gmlp_offload_context_get_enabled (a));

  g_assert_true (gmlp_offload_context_pop_thread_default (b, NULL));
  g_assert_true (gmlp_offload_context_get_enabled (a));
  g_assert_true (gmlp_offload_context_pop_thread_default (a, NULL));
  g_assert_cmpuint (gmlp_offload_context_get_depth (), ==, 0);
}

/* Each thread has its own stack. */
typedef struct {
  GmlpOffloadContext *ctx;
  GmlpGroupedLinear  *layer;
  GmlpGroupedTensor  *x;
  gboolean            enable;
  gboolean            told[8];
} ThreadCase;

static gpointer
thread_forwards (gpointer data)
{
  ThreadCase *tc = data;
  guint i;

  g_assert_cmpuint (gmlp_offload_context_get_depth (), ==, 0);
  gmlp_offload_context_push_thread_default (tc->ctx, tc->enable);
  for (i = 0; i < G_N_ELEMENTS (tc->told); i++)
    {
      g_autoptr(GmlpGroupedTensor) y = NULL;
      g_autoptr(GmlpSavedActivations) saved = forward (tc->layer, tc->x, &y);
      tc->told[i] = gmlp_saved_activations_get_offload (saved);
      g_usleep (100);
    }
  g_assert_true (gmlp_offload_context_pop_thread_default (tc->ctx, NULL));
  return NULL;
}

static void
test_threads (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpOffloadContext) ctx = NULL;
  g_autoptr(GmlpGroupedLinear) layer = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL;
  gint64 rows[N_GROUPS] = { 4, 4, 0, 1 };
  ThreadCase cases[4];
  GThread *threads[4];
  guint t, i;

  if (device == NULL)
    return;

  ctx = gmlp_offload_context_new (device, NULL);
  layer = new_layer (device, GMLP_DTYPE_FLOAT32, 0, 2);
  x = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, rows, N_GROUPS, HIDDEN, 1.0, NULL);

  /* This thread keeps a disabled entry, which the others must not see. */
  gmlp_offload_context_push_thread_default (ctx, FALSE);
  for (t = 0; t < G_N_ELEMENTS (threads); t++)
    {
      cases[t] = (ThreadCase) { ctx, layer, x, t % 2 == 0, { FALSE, } };
      threads[t] = g_thread_new ("offload", thread_forwards, &cases[t]);
    }
  for (t = 0; t < G_N_ELEMENTS (threads); t++)
    {
      g_thread_join (threads[t]);
      for (i = 0; i < G_N_ELEMENTS (cases[t].told); i++)
        g_assert_true (cases[t].told[i] == cases[t].enable);
    }
  g_assert_false (gmlp_offload_context_get_enabled (ctx));
  g_assert_true (gmlp_offload_context_pop_thread_default (ctx, NULL));
}

/* Runs a chain of layers forward, then backward in reverse, and returns
 * every output and gradient as bytes. With offload, also checks the
 * counters: one reload wait (the last layer's), a prefetch for each of the
 * others. */
static GPtrArray *
run_chain (GmlpDevice *device, GmlpDType dtype, GmlpLinearFlags extra, gboolean offload,
           guint64 seed, const gint64 *rows)
{
  const guint n_layers = 4;
  g_autoptr(GmlpOffloadContext) ctx = gmlp_offload_context_new (device, NULL);
  GmlpGroupedLinear *layers[4];
  GmlpSavedActivations *saved[4];
  GmlpGroupedTensor *act;
  GPtrArray *results = g_ptr_array_new_with_free_func ((GDestroyNotify) g_bytes_unref);
  g_autoptr(GError) error = NULL;
  guint64 in_use_saved;
  guint i;

  act = gmlp_test_random_tensor (device, dtype, rows, N_GROUPS, HIDDEN, 1.0, NULL);
  /* Same values every run: overwrite with a seeded fill. */
  g_assert_true (gmlp_grouped_tensor_fill_random (act, seed, 1.0, NULL));

  if (offload)
    gmlp_offload_context_push_thread_default (ctx, TRUE);
  for (i = 0; i < n_layers; i++)
    {
      GmlpGroupedTensor *y;

      layers[i] = new_layer (device, dtype, extra, seed + 10 + i);
      saved[i] = forward (layers[i], act, &y);
      g_ptr_array_add (results, gmlp_grouped_tensor_to_bytes (y, NULL));
      g_object_unref (act);     /* the caller lets go: only the saved copy remains */
      act = y;
    }
  if (offload)
    g_assert_true (gmlp_offload_context_pop_thread_default (ctx, NULL));

  g_assert_true (gmlp_device_synchronize (device, NULL));
  in_use_saved = 0;
  for (i = 0; i < n_layers; i++)
    in_use_saved += gmlp_saved_activations_get_nbytes (saved[i]);
  if (offload)
    {
      /* Only the last layer's activations keep their device copy. */
      g_assert_cmpuint (in_use_saved, ==, gmlp_saved_activations_get_nbytes (saved[n_layers - 1]));
      g_assert_cmpuint (gmlp_saved_activations_get_nbytes (saved[0]), ==, 0);
      g_assert_cmpuint (gmlp_offload_context_get_bytes_on_host (ctx), >, 0);
      g_assert_cmpuint (gmlp_offload_context_get_bytes_offloaded (ctx), ==,
                        gmlp_offload_context_get_bytes_on_host (ctx));
    }

  /* Backward in reverse, dy = the output itself. */
  for (i = n_layers; i-- > 0;)
    {
      GmlpGroupedTensor *dx = gmlp_grouped_linear_backward (layers[i], saved[i], act, &error);

      g_assert_no_error (error);
      if (extra & GMLP_LINEAR_DELAY_WGRAD_COMPUTE)
        g_assert_true (gmlp_grouped_linear_backward_dw (layers[i], NULL));
      g_ptr_array_add (results, gmlp_grouped_tensor_to_bytes (dx, NULL));
      g_ptr_array_add (results, gmlp_grouped_tensor_to_bytes (gmlp_grouped_linear_get_wgrad (layers[i]), NULL));
      g_ptr_array_add (results, gmlp_grouped_tensor_to_bytes (gmlp_grouped_linear_get_bgrad (layers[i]), NULL));
      g_object_unref (act);
      act = dx;
    }
  g_object_unref (act);

  if (offload)
    {
      /* The last layer used its device copy; each backward prefetched the
       * layer before it. */
      g_assert_cmpuint (gmlp_offload_context_get_bytes_on_host (ctx), ==, 0);
      g_assert_cmpuint (gmlp_offload_context_get_reload_waits (ctx), ==, 0);
      g_assert_cmpuint (gmlp_offload_context_get_prefetches (ctx), ==, n_layers - 1);
    }
  for (i = 0; i < n_layers; i++)
    {
      g_object_unref (saved[i]);
      g_object_unref (layers[i]);
    }
  return results;
}

/* Forward outputs and every gradient are bit-identical with and without
 * offload, for each dtype and with delayed weight gradients. */
static void
test_bit_identical (void)
{
  static const GmlpDType dtypes[] = { GMLP_DTYPE_FLOAT32, GMLP_DTYPE_BFLOAT16, GMLP_DTYPE_FLOAT16 };
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint d, delayed;

  if (device == NULL)
    return;

  for (d = 0; d < G_N_ELEMENTS (dtypes); d++)
    for (delayed = 0; delayed < 2; delayed++)
      {
        g_autofree gint64 *rows = gmlp_test_random_rows (N_GROUPS, 40);
        guint64 seed = (guint64) g_test_rand_int ();
        GmlpLinearFlags extra = delayed ? GMLP_LINEAR_DELAY_WGRAD_COMPUTE : 0;
        g_autoptr(GPtrArray) plain = NULL;
        g_autoptr(GPtrArray) offloaded = NULL;
        guint i;

        /* At least one row, so that there is something to offload. */
        rows[0] = MAX (rows[0], 1);
        plain = run_chain (device, dtypes[d], extra, FALSE, seed, rows);
        offloaded = run_chain (device, dtypes[d], extra, TRUE, seed, rows);

        g_assert_cmpuint (plain->len, ==, offloaded->len);
        for (i = 0; i < plain->len; i++)
          g_assert_true (g_bytes_equal (plain->pdata[i], offloaded->pdata[i]));
      }
}

/* Several microbatches in flight through one layer, explicit prefetch, and
 * activations dropped without a backward. */
static void
test_microbatches_and_prefetch (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpOffloadContext) ctx = NULL, other = NULL;
  g_autoptr(GmlpGroupedLinear) layer = NULL;
  g_autoptr(GError) error = NULL;
  gint64 rows[N_GROUPS] = { 9, 1, 0, 30 };
  GmlpGroupedTensor *x[3], *y[3];
  GmlpSavedActivations *saved[3];
  guint i;

  if (device == NULL)
    return;

  ctx = gmlp_offload_context_new (device, NULL);
  other = gmlp_offload_context_new (device, NULL);
  layer = new_layer (device, GMLP_DTYPE_BFLOAT16, 0, 5);

  gmlp_offload_context_push_thread_default (ctx, TRUE);
  for (i = 0; i < 3; i++)
    {
      x[i] = gmlp_test_random_tensor (device, GMLP_DTYPE_BFLOAT16, rows, N_GROUPS, HIDDEN, 1.0, NULL);
      saved[i] = forward (layer, x[i], &y[i]);
    }
  g_assert_true (gmlp_offload_context_pop_thread_default (ctx, NULL));

  /* The caller's own schedule: fetch microbatch 0 early. */
  g_assert_false (gmlp_offload_context_prefetch (other, saved[0], &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);
  g_assert_true (gmlp_offload_context_prefetch (ctx, saved[0], &error));
  g_assert_no_error (error);
  g_assert_cmpuint (gmlp_offload_context_get_prefetches (ctx), ==, 1);
  g_assert_cmpuint (gmlp_saved_activations_get_host_nbytes (saved[0]), ==, 0);

  /* Backward of microbatch 0 now waits only for its own (prefetched)
   * reload; microbatch 1 must reload itself (microbatch 2 took the device
   * copy slot); microbatch 2 is dropped without a backward. */
  {
    g_autoptr(GmlpGroupedTensor) dx = gmlp_grouped_linear_backward (layer, saved[0], y[0], &error);
    g_assert_no_error (error);
    g_assert_cmpuint (gmlp_offload_context_get_reload_waits (ctx), ==, 0);
  }
  {
    g_autoptr(GmlpGroupedTensor) dx = gmlp_grouped_linear_backward (layer, saved[1], y[1], &error);
    g_assert_no_error (error);
    g_assert_cmpuint (gmlp_offload_context_get_reload_waits (ctx), ==, 1);
  }
  for (i = 0; i < 3; i++)
    {
      g_object_unref (saved[i]);
      g_object_unref (x[i]);
      g_object_unref (y[i]);
    }
  g_assert_cmpuint (gmlp_offload_context_get_host_pool_bytes (ctx), >, 0);
}

/* The context must belong to the layer's device. */
static void
test_device_mismatch (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpDevice) cpu = gmlp_device_new (GMLP_DEVICE_KIND_CPU, 0, NULL);
  g_autoptr(GmlpOffloadContext) ctx = NULL;
  g_autoptr(GmlpGroupedLinear) layer = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, y = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GError) error = NULL;
  gint64 rows[N_GROUPS] = { 1, 2, 3, 4 };

  if (device == NULL)
    return;
  if (device == cpu)
    {
      g_test_skip ("needs a second kind of device");
      return;
    }

  ctx = gmlp_offload_context_new (cpu, NULL);
  layer = new_layer (device, GMLP_DTYPE_FLOAT32, 0, 3);
  x = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, rows, N_GROUPS, HIDDEN, 1.0, NULL);
  gmlp_offload_context_push_thread_default (ctx, TRUE);
  y = gmlp_grouped_linear_forward (layer, x, &saved, &error);
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_assert_null (y);
  g_assert_null (saved);
  g_assert_true (gmlp_offload_context_pop_thread_default (ctx, NULL));
}

/* What a backward reports about a write to its input or weights since the
 * forward: the same error, word for word, with or without offload (where
 * the backward reads the host copy, which no write reaches). */
static char *
backward_after_write (GmlpDevice *device, gboolean offload, guint what, GmlpLinearFlags extra)
{
  g_autoptr(GmlpOffloadContext) ctx = gmlp_offload_context_new (device, NULL);
  g_autoptr(GmlpGroupedLinear) layer = new_layer (device, GMLP_DTYPE_FLOAT32, extra, 4);
  g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, y = NULL, dx = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GError) error = NULL;
  gint64 rows[N_GROUPS] = { 5, 0, 7, 2 };
  gboolean delayed = (extra & GMLP_LINEAR_DELAY_WGRAD_COMPUTE) != 0;
  gboolean ok;

  x = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, rows, N_GROUPS, HIDDEN, 1.0, NULL);
  dy = gmlp_test_random_tensor (device, GMLP_DTYPE_FLOAT32, rows, N_GROUPS, HIDDEN, 1.0, NULL);
  if (offload)
    gmlp_offload_context_push_thread_default (ctx, TRUE);
  saved = forward (layer, x, &y);
  if (offload)
    {
      g_assert_true (gmlp_offload_context_pop_thread_default (ctx, NULL));
      gmlp_offload_context_flush (ctx);
      g_assert_cmpuint (gmlp_saved_activations_get_nbytes (saved), ==, 0);
    }
  if (delayed)
    {
      dx = gmlp_grouped_linear_backward (layer, saved, dy, &error);
      g_assert_no_error (error);
    }

  if (what == 0)
    g_assert_true (gmlp_grouped_tensor_fill_zero (x, NULL));
  else
    g_assert_true (gmlp_grouped_linear_init_parameters (layer, 77, NULL));

  if (delayed)
    {
      ok = gmlp_grouped_linear_backward_dw (layer, &error);
      g_assert_cmpuint (gmlp_grouped_linear_get_pending_wgrads (layer), ==, ok ? 0 : 1);
      /* None computed yet: there are none to read. */
      g_assert_true (gmlp_grouped_linear_get_wgrad (layer) == NULL || ok);
    }
  else
    {
      dx = gmlp_grouped_linear_backward (layer, saved, dy, &error);
      ok = dx != NULL;
      g_assert_true (gmlp_saved_activations_is_consumed (saved) == ok);
      g_assert_true (gmlp_grouped_linear_get_wgrad (layer) == NULL || ok);
    }
  if (ok)
    return NULL;
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
  return g_strdup (error->message);
}

static void
test_versions (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint what, delayed;

  if (device == NULL)
    return;

  for (delayed = 0; delayed < 2; delayed++)
    for (what = 0; what < 2; what++)
      {
        GmlpLinearFlags extra = delayed ? GMLP_LINEAR_DELAY_WGRAD_COMPUTE : 0;
        g_autofree char *plain = backward_after_write (device, FALSE, what, extra);
        g_autofree char *offloaded = backward_after_write (device, TRUE, what, extra);

        /* The weights are not read by a delayed weight gradient. */
        if (delayed && what == 1)
          {
            g_assert_null (plain);
            g_assert_null (offloaded);
            continue;
          }
        g_assert_nonnull (plain);
        g_assert_cmpstr (plain, ==, offloaded);
      }
}

/* A backward that fails after the reload (group sizes that are not the
 * forward's) leaves the activations usable: the retry gives the bits of a
 * backward without offload. */
static void
test_retry_after_reload (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpOffloadContext) ctx = NULL;
  g_autoptr(GmlpGroupedLinear) layer = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, dy_other = NULL, y = NULL, dx = NULL, dx_ref = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GBytes) wgrad_ref = NULL, wgrad = NULL;
  g_autoptr(GError) error = NULL;
  gint64 rows[N_GROUPS] = { 3, 8, 0, 6 };
  gint64 rows_other[N_GROUPS] = { 3, 7, 1, 6 };

  if (device == NULL)
    return;

  ctx = gmlp_offload_context_new (device, NULL);
  layer = new_layer (device, GMLP_DTYPE_BFLOAT16, 0, 6);
  x = gmlp_test_random_tensor (device, GMLP_DTYPE_BFLOAT16, rows, N_GROUPS, HIDDEN, 1.0, NULL);
  dy = gmlp_test_random_tensor (device, GMLP_DTYPE_BFLOAT16, rows, N_GROUPS, HIDDEN, 1.0, NULL);
  dy_other = gmlp_test_random_tensor (device, GMLP_DTYPE_BFLOAT16, rows_other, N_GROUPS, HIDDEN, 1.0, NULL);

  saved = forward (layer, x, &y);
  dx_ref = gmlp_grouped_linear_backward (layer, saved, dy, &error);
  g_assert_no_error (error);
  wgrad_ref = gmlp_grouped_tensor_to_bytes (gmlp_grouped_linear_get_wgrad (layer), NULL);
  g_clear_object (&saved);
  g_clear_object (&y);

  gmlp_offload_context_push_thread_default (ctx, TRUE);
  saved = forward (layer, x, &y);
  g_assert_true (gmlp_offload_context_pop_thread_default (ctx, NULL));
  gmlp_offload_context_flush (ctx);
  g_assert_cmpuint (gmlp_saved_activations_get_host_nbytes (saved), >, 0);
  g_assert_true (gmlp_grouped_tensor_fill_zero (gmlp_grouped_linear_get_wgrad (layer), NULL));

  g_assert_null (gmlp_grouped_linear_backward (layer, saved, dy_other, &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH);
  g_clear_error (&error);
  g_assert_false (gmlp_saved_activations_is_consumed (saved));

  dx = gmlp_grouped_linear_backward (layer, saved, dy, &error);
  g_assert_no_error (error);
  gmlp_test_assert_same_bytes (dx, dx_ref, "dx after a retry");
  wgrad = gmlp_grouped_tensor_to_bytes (gmlp_grouped_linear_get_wgrad (layer), NULL);
  g_assert_true (g_bytes_equal (wgrad, wgrad_ref));
}

int
main (int argc, char *argv[])
{
  setlocale (LC_ALL, "");
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Gmlp/OffloadContext/nesting", test_nesting);
  g_test_add_func ("/Gmlp/OffloadContext/unbalanced", test_unbalanced);
  g_test_add_func ("/Gmlp/OffloadContext/threads", test_threads);
  g_test_add_func ("/Gmlp/OffloadContext/bit-identical", test_bit_identical);
  g_test_add_func ("/Gmlp/OffloadContext/microbatches-and-prefetch", test_microbatches_and_prefetch);
  g_test_add_func ("/Gmlp/OffloadContext/device-mismatch", test_device_mismatch);
  g_test_add_func ("/Gmlp/OffloadContext/versions", test_versions);
  g_test_add_func ("/Gmlp/OffloadContext/retry-after-reload", test_retry_after_reload);

  return g_test_run ();
}
