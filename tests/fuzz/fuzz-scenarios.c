/* fuzz-scenarios.c: misuse that takes more than one call
 *
 * Saved activations reused, of another layer or of another class; delayed
 * weight gradients with nothing pending; unbalanced and cross-thread offload
 * pops; a second g_initable_init(); a failed backward then the good one;
 * inputs and weights changed between forward and backward; a layer's own
 * weight as its main_grad; objects dropped while something made from them
 * lives; and the silent wrong answers issue 40 names (convert() of a scaled
 * FP8 tensor, INT64 → INT32, a scale finite as a double only). Every call is
 * judged as in the single-call cases; where the documentation or issue 40
 * asks for an error, a success fails the case.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <math.h>
#include <string.h>

#include "gmlp-fuzz.h"

static gpointer
need (FzCtx      *ctx,
      const char *name)
{
  g_autoptr(GError) error = NULL;
  gpointer value = fz_get (ctx, name, &error);

  if (value == NULL)
    fz_skip (ctx, "could not make %s: %s", name, error->message);
  return value;
}

#define NEED(var, name) G_STMT_START { if ((var = need (ctx, name)) == NULL) return; } G_STMT_END

/* The bytes of a tensor, or NULL (then the case is skipped). */
static GBytes *
bytes_of (FzCtx             *ctx,
          GmlpGroupedTensor *t)
{
  g_autoptr(GError) error = NULL;
  GBytes *bytes;

  if (t == NULL)
    {
      fz_skip (ctx, "no tensor to read back");
      return NULL;
    }
  bytes = gmlp_grouped_tensor_to_bytes (t, &error);
  if (bytes == NULL)
    fz_skip (ctx, "could not read a tensor back: %s", error ? error->message : "no error");
  return bytes;
}

/* A layer's weight, or its first group's where the weights are per group. */
static GmlpGroupedTensor *
weight_of (GmlpGroupedLinear *layer)
{
  GmlpGroupedTensor *w = gmlp_grouped_linear_get_weight (layer);

  return w != NULL ? w : gmlp_grouped_linear_get_weight_member (layer, 0);
}

static GmlpGroupedTensor *
wgrad_of (GmlpGroupedLinear *layer)
{
  GmlpGroupedTensor *w = gmlp_grouped_linear_get_wgrad (layer);

  return w != NULL ? w : gmlp_grouped_linear_get_wgrad_member (layer, 0);
}

static gboolean
is_mlp (gpointer layer)
{
  return GMLP_IS_GROUPED_MLP (layer);
}

static GmlpGroupedTensor *
forward (gpointer               layer,
         GmlpGroupedTensor     *x,
         GmlpSavedActivations **saved,
         GError               **error)
{
  return is_mlp (layer) ? gmlp_grouped_mlp_forward (layer, x, saved, error)
                        : gmlp_grouped_linear_forward (layer, x, saved, error);
}

static GmlpGroupedTensor *
backward (gpointer              layer,
          GmlpSavedActivations *saved,
          GmlpGroupedTensor    *dy,
          GError              **error)
{
  return is_mlp (layer) ? gmlp_grouped_mlp_backward (layer, saved, dy, error)
                        : gmlp_grouped_linear_backward (layer, saved, dy, error);
}

/* A forward that must succeed; NULL (the case skipped) otherwise. */
static GmlpSavedActivations *
good_forward (FzCtx             *ctx,
              gpointer           layer,
              GmlpGroupedTensor *x)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedTensor) y = NULL;
  GmlpSavedActivations *saved = NULL;

  y = forward (layer, x, &saved, &error);
  if (!fz_ok_ptr (ctx, "forward", y, error))
    {
      g_clear_object (&saved);
      fz_skip (ctx, "the forward failed");
    }
  return saved;
}

/* The start of a step: a layer, its input and its output gradient, and
 * with saved, a forward that must succeed. FALSE (the case skipped) when
 * one of them could not be had. */
static gboolean
begin_step (FzCtx                 *ctx,
            const char            *layer_name,
            const char            *x_name,
            const char            *dy_name,
            gpointer              *layer,
            gpointer              *x,
            gpointer              *dy,
            GmlpSavedActivations **saved)
{
  if ((*layer = need (ctx, layer_name)) == NULL || (*x = need (ctx, x_name)) == NULL ||
      (*dy = need (ctx, dy_name)) == NULL)
    return FALSE;
  return saved == NULL || (*saved = good_forward (ctx, *layer, *x)) != NULL;
}

/* Backward with saved activations that are not the layer's own. */
static void
foreign_saved (FzCtx      *ctx,
               const char *layer_name,
               const char *saved_name,
               const char *grad_name,
               int         code,
               const char *why)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedTensor) dx = NULL;
  gpointer layer, saved, dy;

  NEED (layer, layer_name);
  NEED (saved, saved_name);
  NEED (dy, grad_name);
  dx = backward (layer, saved, dy, &error);
  fz_expect_error (ctx, "backward", dx != NULL, error, code, why);
}

static void
linear_backward_other_layers_saved (FzCtx *ctx)
{
  foreign_saved (ctx, "linear:f32", "saved:other-layer", "dy:f32", GMLP_ERROR_INVALID_ARGUMENT,
                 "the activations of another layer (documented: INVALID_ARGUMENT)");
}

static void
linear_backward_mlp_saved (FzCtx *ctx)
{
  foreign_saved (ctx, "linear:f32", "saved:mlp", "dy:f32", GMLP_ERROR_INVALID_ARGUMENT,
                 "a GroupedMLP's activations (documented: INVALID_ARGUMENT)");
}

static void
mlp_backward_linear_saved (FzCtx *ctx)
{
  foreign_saved (ctx, "mlp:f32:gelu", "saved:linear", "dyh:f32", -1,
                 "a GroupedLinear's activations");
}

static void
mlp_backward_other_mlps_saved (FzCtx *ctx)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedTensor) dx = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  gpointer a, b, x, dy;

  NEED (a, "mlp:f32:gelu");
  NEED (b, "mlp:f32:gelu@other");
  NEED (x, "x:f32");
  NEED (dy, "dyh:f32");
  if ((saved = good_forward (ctx, a, x)) == NULL)
    return;
  dx = gmlp_grouped_mlp_backward (b, saved, dy, &error);
  fz_expect_error (ctx, "backward on another MLP", dx != NULL, error, GMLP_ERROR_INVALID_ARGUMENT,
                   "the activations of another layer (documented as GroupedLinear's: INVALID_ARGUMENT)");
}

static void
fc1_backward_with_mlp_saved (FzCtx *ctx)
{
  foreign_saved (ctx, "mlp:fc1", "saved:mlp", "dy:f32", -1,
                 "the activations of the MLP that holds this FC1");
}

static void
backward_twice (FzCtx      *ctx,
                const char *layer_name,
                const char *grad_name)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedTensor) dx1 = NULL, dx2 = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  gpointer layer, x, dy;

  if (!begin_step (ctx, layer_name, "x:f32", grad_name, &layer, &x, &dy, &saved))
    return;
  dx1 = backward (layer, saved, dy, &error);
  if (!fz_ok_ptr (ctx, "backward", dx1, error))
    return;
  dx2 = backward (layer, saved, dy, &error);
  fz_expect_error (ctx, "second backward", dx2 != NULL, error, GMLP_ERROR_INVALID_STATE,
                   "activations already used (documented: INVALID_STATE)");
}

static void
linear_backward_twice (FzCtx *ctx)
{
  backward_twice (ctx, "linear:f32", "dy:f32");
}

static void
mlp_backward_twice (FzCtx *ctx)
{
  backward_twice (ctx, "mlp:f32:gelu", "dyh:f32");
}

static void
delayed_mlp_backward_twice (FzCtx *ctx)
{
  backward_twice (ctx, "mlp:f32:geglu:delay", "dyh:f32");
}

static void
backward_dw_nothing_pending (FzCtx      *ctx,
                             const char *layer_name)
{
  g_autoptr(GError) error = NULL;
  gpointer layer;
  gboolean ok;

  NEED (layer, layer_name);
  ok = is_mlp (layer) ? gmlp_grouped_mlp_backward_dw (layer, &error)
                      : gmlp_grouped_linear_backward_dw (layer, &error);
  fz_check_result (ctx, "backward_dw", ok, error);
}

static void
linear_backward_dw_nothing_pending (FzCtx *ctx)
{
  backward_dw_nothing_pending (ctx, "linear:f32:delay");
}

static void
linear_backward_dw_not_delayed (FzCtx *ctx)
{
  backward_dw_nothing_pending (ctx, "linear:f32");
}

static void
mlp_backward_dw_nothing_pending (FzCtx *ctx)
{
  backward_dw_nothing_pending (ctx, "mlp:f32:geglu:delay");
}

static void
linear_backward_dw_twice (FzCtx *ctx)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedTensor) dx = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  gpointer layer, x, dy;
  gboolean ok;

  if (!begin_step (ctx, "linear:f32:delay", "x:f32", "dy:f32", &layer, &x, &dy, &saved))
    return;
  dx = gmlp_grouped_linear_backward (layer, saved, dy, &error);
  if (!fz_ok_ptr (ctx, "backward", dx, error))
    return;
  ok = gmlp_grouped_linear_backward_dw (layer, &error);
  if (!fz_ok_bool (ctx, "backward_dw", ok, error))
    return;
  ok = gmlp_grouped_linear_backward_dw (layer, &error);
  fz_check_result (ctx, "second backward_dw", ok, error);
  g_clear_error (&error);
  if (gmlp_grouped_linear_get_pending_wgrads (layer) != 0)
    fz_fail (ctx, "wrong state", "%u weight gradients still pending after backward_dw",
             gmlp_grouped_linear_get_pending_wgrads (layer));
}

/* Offload contexts */

static void
offload_pop_without_push (FzCtx *ctx)
{
  g_autoptr(GError) error = NULL;
  GmlpOffloadContext *oc;
  gboolean ok;

  NEED (oc, "offload");
  ok = gmlp_offload_context_pop_thread_default (oc, &error);
  fz_expect_error (ctx, "pop", ok, error, GMLP_ERROR_INVALID_STATE,
                   "an unbalanced pop (documented: INVALID_STATE)");
}

typedef struct {
  GmlpOffloadContext *oc;
  GError             *error;
} PopData;

static gpointer
pop_thread (gpointer data)
{
  PopData *d = data;

  return GINT_TO_POINTER (gmlp_offload_context_pop_thread_default (d->oc, &d->error));
}

static void
offload_pop_on_another_thread (FzCtx *ctx)
{
  g_autoptr(GError) error = NULL;
  PopData d = { NULL, NULL };
  gboolean ok;

  NEED (d.oc, "offload");
  gmlp_offload_context_push_thread_default (d.oc, TRUE);
  ok = GPOINTER_TO_INT (g_thread_join (g_thread_new ("pop", pop_thread, &d)));
  fz_expect_error (ctx, "pop on another thread", ok, d.error, GMLP_ERROR_INVALID_STATE,
                   "that thread pushed nothing (documented: INVALID_STATE)");
  g_clear_error (&d.error);
  ok = gmlp_offload_context_pop_thread_default (d.oc, &error);
  fz_ok_bool (ctx, "pop on the pushing thread", ok, error);
}

static void
offload_push_twice (FzCtx *ctx)
{
  g_autoptr(GError) error = NULL;
  GmlpOffloadContext *oc;
  gboolean ok;

  NEED (oc, "offload");
  gmlp_offload_context_push_thread_default (oc, TRUE);
  gmlp_offload_context_push_thread_default (oc, FALSE);
  if (gmlp_offload_context_get_depth () != 2)
    fz_fail (ctx, "wrong state", "depth %u after two pushes", gmlp_offload_context_get_depth ());
  ok = gmlp_offload_context_pop_thread_default (oc, &error);
  if (!fz_ok_bool (ctx, "first pop", ok, error))
    return;
  ok = gmlp_offload_context_pop_thread_default (oc, &error);
  if (!fz_ok_bool (ctx, "second pop", ok, error))
    return;
  ok = gmlp_offload_context_pop_thread_default (oc, &error);
  fz_expect_error (ctx, "third pop", ok, error, GMLP_ERROR_INVALID_STATE,
                   "an unbalanced pop (documented: INVALID_STATE)");
}

static void
offload_pop_out_of_order (FzCtx *ctx)
{
  g_autoptr(GError) error = NULL;
  GmlpOffloadContext *a, *b;
  gboolean ok;

  NEED (a, "offload");
  NEED (b, "offload@b");
  gmlp_offload_context_push_thread_default (a, TRUE);
  gmlp_offload_context_push_thread_default (b, TRUE);
  ok = gmlp_offload_context_pop_thread_default (a, &error);
  fz_expect_error (ctx, "pop of the outer context", ok, error, GMLP_ERROR_INVALID_STATE,
                   "not the innermost context (documented: INVALID_STATE)");
  g_clear_error (&error);
  if (ok)
    return;
  ok = gmlp_offload_context_pop_thread_default (b, &error);
  if (!fz_ok_bool (ctx, "pop of the inner context", ok, error))
    return;
  ok = gmlp_offload_context_pop_thread_default (a, &error);
  fz_ok_bool (ctx, "pop of the outer context", ok, error);
}

/* The only reference to a pushed context is the stack's; a forward then
 * uses it and the pop finds it again. */
static void
offload_unref_while_pushed (FzCtx *ctx)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedTensor) y = NULL, dx = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  GmlpOffloadContext *oc;
  gpointer layer, x, dy;
  gboolean ok;

  if (!begin_step (ctx, "linear:f32", "x:f32", "dy:f32", &layer, &x, &dy, NULL))
    return;
  oc = gmlp_offload_context_new (ctx->device, &error);
  if (!fz_ok_ptr (ctx, "new", oc, error))
    return;
  gmlp_offload_context_push_thread_default (oc, TRUE);
  g_object_unref (oc);
  y = gmlp_grouped_linear_forward (layer, x, &saved, &error);
  fz_ok_ptr (ctx, "forward", y, error);
  g_clear_error (&error);
  oc = gmlp_offload_context_get_thread_default ();
  if (oc == NULL)
    {
      fz_fail (ctx, "wrong state", "the pushed context is gone");
      return;
    }
  ok = gmlp_offload_context_pop_thread_default (oc, &error);
  if (!fz_ok_bool (ctx, "pop", ok, error) || saved == NULL)
    return;
  dx = gmlp_grouped_linear_backward (layer, saved, dy, &error);
  fz_ok_ptr (ctx, "backward after the context is gone", dx, error);
}

static void
offload_prefetch_twice_and_consumed (FzCtx *ctx)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedTensor) y = NULL, dx = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  GmlpOffloadContext *oc;
  gpointer layer, x, dy;
  gboolean ok;

  NEED (oc, "offload");
  if (!begin_step (ctx, "linear:f32", "x:f32", "dy:f32", &layer, &x, &dy, NULL))
    return;
  gmlp_offload_context_push_thread_default (oc, TRUE);
  y = gmlp_grouped_linear_forward (layer, x, &saved, &error);
  ok = gmlp_offload_context_pop_thread_default (oc, NULL);
  if (!fz_ok_ptr (ctx, "forward", y, error) || !ok)
    return;
  ok = gmlp_offload_context_prefetch (oc, saved, &error);
  fz_check_result (ctx, "prefetch", ok, error);
  g_clear_error (&error);
  ok = gmlp_offload_context_prefetch (oc, saved, &error);
  fz_check_result (ctx, "prefetch again", ok, error);
  g_clear_error (&error);
  dx = gmlp_grouped_linear_backward (layer, saved, dy, &error);
  if (!fz_ok_ptr (ctx, "backward", dx, error))
    return;
  ok = gmlp_offload_context_prefetch (oc, saved, &error);
  fz_check_result (ctx, "prefetch of consumed activations", ok, error);
}

/* A second g_initable_init() is a no-op (issue 40). */
static void
init_twice (FzCtx      *ctx,
            const char *name)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GBytes) before = NULL, after = NULL;
  GmlpGroupedLinear *linear;
  GmlpGroupedTensor *weight;
  gpointer layer;
  gboolean ok;

  NEED (layer, name);
  linear = is_mlp (layer) ? gmlp_grouped_mlp_get_fc1 (layer) : layer;
  weight = weight_of (linear);
  if ((before = bytes_of (ctx, weight)) == NULL)
    return;
  ok = g_initable_init (layer, NULL, &error);
  fz_check_result (ctx, "second g_initable_init", ok, error);
  if ((is_mlp (layer) ? gmlp_grouped_mlp_get_fc1 (layer) : layer) != linear ||
      weight_of (linear) != weight)
    {
      fz_fail (ctx, "second init not a no-op",
               "a second g_initable_init() replaced the layers or the weight tensors (issue 40: a no-op)");
      return;
    }
  if ((after = bytes_of (ctx, weight_of (linear))) == NULL)
    return;
  if (!g_bytes_equal (before, after))
    fz_fail (ctx, "second init not a no-op",
             "a second g_initable_init() changed the weights (issue 40: a no-op)");
}

static void
linear_init_twice (FzCtx *ctx)
{
  init_twice (ctx, "linear:f32:bias");
}

static void
mlp_init_twice (FzCtx *ctx)
{
  init_twice (ctx, "mlp:f32:gelu");
}

static void
init_after_failed_init (FzCtx *ctx)
{
  g_autoptr(GError) error = NULL;
  gpointer layer;
  gboolean ok;

  NEED (layer, "Gmlp.GroupedLinear:failed");
  ok = g_initable_init (layer, NULL, &error);
  fz_check_result (ctx, "g_initable_init after a failed one", ok, error);
}

/* A backward that fails on its gradient writes nothing and leaves the
 * activations for the good one (GmlpError: "reported before anything is
 * written"). */
static void
bad_grad_then_good (FzCtx      *ctx,
                    const char *layer_name,
                    const char *bad_name,
                    const char *good_name)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedTensor) dx = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GBytes) before = NULL, after = NULL;
  GmlpGroupedLinear *probe;
  gpointer layer, x, bad, good;

  NEED (layer, layer_name);
  NEED (x, "x:f32");
  NEED (bad, bad_name);
  NEED (good, good_name);
  if ((saved = good_forward (ctx, layer, x)) == NULL)
    return;
  /* The weight gradient written first by a backward: FC2's in an MLP. */
  probe = is_mlp (layer) ? gmlp_grouped_mlp_get_fc2 (layer) : layer;
  /* Before any backward the gradient may not exist yet: then there is
   * nothing to compare, but it must not appear either. */
  if (wgrad_of (probe) != NULL && (before = bytes_of (ctx, wgrad_of (probe))) == NULL)
    return;
  dx = backward (layer, saved, bad, &error);
  fz_expect_error (ctx, "backward with a gradient of the wrong shape", dx != NULL, error, -1,
                   "the gradient does not fit the output");
  g_clear_error (&error);
  g_clear_object (&dx);
  if (before != NULL)
    {
      if ((after = bytes_of (ctx, wgrad_of (probe))) == NULL)
        return;
      if (!g_bytes_equal (before, after))
        fz_fail (ctx, "partial write", "the failed backward wrote weight gradients");
    }
  dx = backward (layer, saved, good, &error);
  fz_ok_ptr (ctx, "backward with the right gradient after the failed one", dx, error);
}

static void
mlp_backward_bad_grad_then_good (FzCtx *ctx)
{
  bad_grad_then_good (ctx, "mlp:f32:gelu", "dy:f32", "dyh:f32");
}

static void
mlp_backward_bad_rows_then_good (FzCtx *ctx)
{
  bad_grad_then_good (ctx, "mlp:f32:gelu", "dyh:f32:3g", "dyh:f32");
}

static void
linear_backward_bad_grad_then_good (FzCtx *ctx)
{
  bad_grad_then_good (ctx, "linear:f32", "dy:f32:cols16", "dy:f32");
}

static void
linear_backward_bad_dtype_then_good (FzCtx *ctx)
{
  bad_grad_then_good (ctx, "linear:f32", "dy:bf16", "dy:f32");
}

/* An input or weight changed between forward and backward: issue 40 asks
 * for an error, with or without offload. */
typedef enum {
  CHANGE_INPUT_SCALE,
  CHANGE_INPUT_ZERO,
  CHANGE_WEIGHT_INIT,
  CHANGE_WEIGHT_BYTES,
  CHANGE_WEIGHT_SCALE,
} Change;

static void
changed_between (FzCtx      *ctx,
                 const char *layer_name,
                 Change      change,
                 gboolean    offload)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedTensor) y = NULL, dx = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GBytes) w = NULL;
  GmlpOffloadContext *oc = NULL;
  GmlpGroupedLinear *linear;
  gpointer layer, x, dy;
  gboolean ok = FALSE;

  if (!begin_step (ctx, layer_name, "x:f32@changed", g_str_has_prefix (layer_name, "mlp") ? "dyh:f32" : "dy:f32",
                   &layer, &x, &dy, NULL))
    return;
  if (offload)
    {
      NEED (oc, "offload");
      gmlp_offload_context_push_thread_default (oc, TRUE);
    }
  y = forward (layer, x, &saved, &error);
  if (oc != NULL && !gmlp_offload_context_pop_thread_default (oc, NULL))
    fz_fail (ctx, "wrong state", "pop after the forward failed");
  if (!fz_ok_ptr (ctx, "forward", y, error))
    return;
  if (oc != NULL)
    gmlp_offload_context_flush (oc);

  linear = is_mlp (layer) ? gmlp_grouped_mlp_get_fc1 (layer) : layer;
  switch (change)
    {
    case CHANGE_INPUT_SCALE:
      ok = gmlp_grouped_tensor_scale (x, 2.0, &error);
      break;
    case CHANGE_INPUT_ZERO:
      ok = gmlp_grouped_tensor_fill_zero (x, &error);
      break;
    case CHANGE_WEIGHT_INIT:
      ok = is_mlp (layer) ? gmlp_grouped_mlp_init_parameters (layer, 99, &error)
                          : gmlp_grouped_linear_init_parameters (layer, 99, &error);
      break;
    case CHANGE_WEIGHT_BYTES:
      if ((w = bytes_of (ctx, weight_of (linear))) == NULL)
        return;
      ok = gmlp_grouped_linear_set_weight_from_bytes (linear, w, &error);
      break;
    case CHANGE_WEIGHT_SCALE:
      ok = gmlp_grouped_tensor_scale (weight_of (linear), 0.5, &error);
      break;
    default:
      g_assert_not_reached ();
    }
  if (!fz_ok_bool (ctx, "the change", ok, error))
    return;
  dx = backward (layer, saved, dy, &error);
  fz_expect_error (ctx, "backward", dx != NULL, error, -1,
                   change <= CHANGE_INPUT_ZERO
                     ? "the saved input changed since the forward (issue 40: a clear error)"
                     : "the weight changed since the forward (issue 40: a clear error)");
}

static void linear_input_scaled (FzCtx *ctx) { changed_between (ctx, "linear:f32", CHANGE_INPUT_SCALE, FALSE); }
static void linear_input_scaled_offload (FzCtx *ctx) { changed_between (ctx, "linear:f32", CHANGE_INPUT_SCALE, TRUE); }
static void linear_weight_init (FzCtx *ctx) { changed_between (ctx, "linear:f32", CHANGE_WEIGHT_INIT, FALSE); }
static void linear_weight_bytes_offload (FzCtx *ctx) { changed_between (ctx, "linear:f32", CHANGE_WEIGHT_BYTES, TRUE); }
static void linear_weight_scaled (FzCtx *ctx) { changed_between (ctx, "linear:f32", CHANGE_WEIGHT_SCALE, FALSE); }
static void mlp_input_zeroed (FzCtx *ctx) { changed_between (ctx, "mlp:f32:gelu", CHANGE_INPUT_ZERO, FALSE); }
static void mlp_input_zeroed_offload (FzCtx *ctx) { changed_between (ctx, "mlp:f32:gelu", CHANGE_INPUT_ZERO, TRUE); }
static void mlp_weight_init (FzCtx *ctx) { changed_between (ctx, "mlp:f32:gelu", CHANGE_WEIGHT_INIT, FALSE); }

/* A layer's own weight as its main_grad: backward would add dW into W
 * (issue 40). */
static void
set_main_grad_own_weight (FzCtx *ctx)
{
  g_autoptr(GError) error = NULL;
  GmlpGroupedLinear *layer;
  gboolean ok;

  NEED (layer, "linear:f32:fuse");
  ok = gmlp_grouped_linear_set_main_grad (layer, weight_of (layer), &error);
  fz_expect_error (ctx, "set_main_grad (its own weight)", ok, error, -1,
                   "backward would add dW into W (issue 40)");
}

static void
set_main_grad_member_own_weight (FzCtx *ctx)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedLinear) layer = NULL;
  gboolean ok;

  layer = gmlp_grouped_linear_new_full (ctx->device, FZ_GROUPS, FZ_K, FZ_O, GMLP_DTYPE_FLOAT32,
                                        GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION, &error);
  if (!fz_ok_ptr (ctx, "new_full", layer, error))
    return;
  ok = gmlp_grouped_linear_set_main_grad_member (layer, 0, gmlp_grouped_linear_get_weight_member (layer, 0),
                                                 &error);
  fz_expect_error (ctx, "set_main_grad_member (its own weight)", ok, error, -1,
                   "backward would add dW into W (issue 40)");
}

static void
set_main_grad_then_backward_twice (FzCtx *ctx)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedTensor) dx = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  gpointer layer, mg, x, dy;
  gboolean ok;

  NEED (mg, "w:f32");
  if (!begin_step (ctx, "linear:f32:fuse", "x:f32", "dy:f32", &layer, &x, &dy, NULL))
    return;
  ok = gmlp_grouped_linear_set_main_grad (layer, mg, &error);
  if (!fz_ok_bool (ctx, "set_main_grad", ok, error))
    return;
  if ((saved = good_forward (ctx, layer, x)) == NULL)
    return;
  /* The main_grad replaced while a backward is due. */
  ok = gmlp_grouped_linear_set_main_grad (layer, mg, &error);
  fz_check_result (ctx, "set_main_grad again", ok, error);
  g_clear_error (&error);
  dx = gmlp_grouped_linear_backward (layer, saved, dy, &error);
  fz_ok_ptr (ctx, "backward", dx, error);
}

/* Objects dropped while something made from them lives */

static void
saved_outlives_layer (FzCtx *ctx)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedLinear) layer = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GmlpGroupedTensor) dx = NULL;
  gpointer other, x, dy;

  NEED (other, "linear:f32");
  NEED (x, "x:f32");
  NEED (dy, "dy:f32");
  layer = gmlp_grouped_linear_new (ctx->device, FZ_GROUPS, FZ_K, FZ_O, &error);
  if (!fz_ok_ptr (ctx, "new", layer, error))
    return;
  if ((saved = good_forward (ctx, layer, x)) == NULL)
    return;
  g_clear_object (&layer);
  dx = gmlp_grouped_linear_backward (other, saved, dy, &error);
  fz_expect_error (ctx, "backward on another layer after the forward's layer is gone", dx != NULL,
                   error, GMLP_ERROR_INVALID_ARGUMENT,
                   "the activations of another layer (documented: INVALID_ARGUMENT)");
}

static void
member_outlives_tensor (FzCtx *ctx)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedTensor) t = NULL, member = NULL, member2 = NULL;
  g_autoptr(GBytes) bytes = NULL;
  gint64 rows[FZ_GROUPS] = { FZ_ROWS0, FZ_ROWS1 };

  t = gmlp_grouped_tensor_new (ctx->device, GMLP_DTYPE_FLOAT32, rows, FZ_GROUPS, FZ_K, &error);
  if (!fz_ok_ptr (ctx, "new", t, error) || !fz_ok_bool (ctx, "fill_zero", gmlp_grouped_tensor_fill_zero (t, &error), error))
    return;
  member = gmlp_grouped_tensor_get_member (t, 1, &error);
  if (!fz_ok_ptr (ctx, "get_member", member, error))
    return;
  g_clear_object (&t);
  bytes = gmlp_grouped_tensor_to_bytes (member, &error);
  fz_ok_ptr (ctx, "to_bytes of the member after its tensor is gone", bytes, error);
  member2 = gmlp_grouped_tensor_get_member (member, 0, &error);
  fz_ok_ptr (ctx, "member of the member", member2, error);
  g_clear_error (&error);
  g_clear_object (&member2);
  member2 = gmlp_grouped_tensor_get_member (member, 1, &error);
  fz_expect_error (ctx, "member 1 of a one-member view", member2 != NULL, error, -1, "out of range");
}

static void
dlpack_outlives_tensor (FzCtx *ctx)
{
  typedef struct DLManaged {
    void *data;
    gint32 device[2];
    gint32 ndim;
    guint8 dtype[4];
    gint64 *shape;
    gint64 *strides;
    guint64 byte_offset;
    void *manager_ctx;
    void (*deleter) (struct DLManaged *self);
  } DLManaged;
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedTensor) t = NULL;
  gint64 rows[1] = { 4 };
  DLManaged *m;
  float sum = 0;
  int i;

  t = gmlp_grouped_tensor_new (ctx->device, GMLP_DTYPE_FLOAT32, rows, 1, FZ_K, &error);
  if (!fz_ok_ptr (ctx, "new", t, error) || !fz_ok_bool (ctx, "fill_zero", gmlp_grouped_tensor_fill_zero (t, &error), error))
    return;
  m = gmlp_grouped_tensor_to_dlpack (t, &error);
  if (!fz_ok_ptr (ctx, "to_dlpack", m, error))
    return;
  g_clear_object (&t);
  if (!ctx->cuda)
    for (i = 0; i < 4 * FZ_K; i++)
      sum += ((float *) m->data)[i];
  if (sum != 0)
    fz_fail (ctx, "wrong result", "the exported zeros add up to %g", sum);
  m->deleter (m);
}

/* Quantizers */

static void
delayed_quantizer_other_groups (FzCtx *ctx)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedTensor) q = NULL;
  gpointer quantizer, x;

  NEED (quantizer, "q:delayed:used");
  NEED (x, "x:f32:3g");
  q = gmlp_quantizer_quantize (quantizer, x, &error);
  fz_expect_error (ctx, "quantize 3 groups after 2", q != NULL, error, GMLP_ERROR_SHAPE_MISMATCH,
                   "a delayed quantizer's state has another number of groups (documented: SHAPE_MISMATCH)");
}

static void
restore_state_of_other_recipe (FzCtx *ctx)
{
  g_autoptr(GError) error = NULL;
  gpointer quantizer, state;
  gboolean ok;

  NEED (quantizer, "q:mxfp8:weight");
  NEED (state, "var:state:delayed");
  ok = gmlp_quantizer_restore_state (quantizer, state, &error);
  fz_check_result (ctx, "restore_state", ok, error);
}

static void
restore_then_quantize_other_groups (FzCtx *ctx)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedTensor) q = NULL;
  gpointer quantizer, state, x;
  gboolean ok;

  NEED (quantizer, "q:delayed:input");
  NEED (state, "var:state:delayed-3g");
  NEED (x, "x:f32");
  ok = gmlp_quantizer_restore_state (quantizer, state, &error);
  if (!fz_ok_bool (ctx, "restore_state (3 groups)", ok, error))
    return;
  q = gmlp_quantizer_quantize (quantizer, x, &error);
  fz_expect_error (ctx, "quantize 2 groups", q != NULL, error, GMLP_ERROR_SHAPE_MISMATCH,
                   "the state has another number of groups (documented: SHAPE_MISMATCH)");
}

static void
linear_quantizers_changed_mid_step (FzCtx *ctx)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedTensor) dx = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  gpointer layer, x, dy;
  gboolean ok;

  if (!begin_step (ctx, "linear:fp8:current", "x:bf16", "dy:bf16", &layer, &x, &dy, &saved))
    return;
  ok = gmlp_grouped_linear_set_quantizers (layer, NULL, NULL, NULL, &error);
  if (!fz_ok_bool (ctx, "set_quantizers (none)", ok, error))
    return;
  dx = gmlp_grouped_linear_backward (layer, saved, dy, &error);
  fz_check_result (ctx, "backward", dx != NULL, error);
}

static void
mlp_recipe_changed_mid_step (FzCtx *ctx)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedTensor) dx = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  gpointer layer, x, dy;
  gboolean ok;

  if (!begin_step (ctx, "mlp:bf16:swiglu", "x:bf16", "dyh:bf16", &layer, &x, &dy, &saved))
    return;
  ok = gmlp_grouped_mlp_set_fp8_recipe (layer, GMLP_SCALING_RECIPE_BLOCKWISE, GMLP_FP8_FORMAT_HYBRID, &error);
  fz_check_result (ctx, "set_fp8_recipe (blockwise)", ok, error);
  g_clear_error (&error);
  dx = gmlp_grouped_mlp_backward (layer, saved, dy, &error);
  fz_check_result (ctx, "backward", dx != NULL, error);
}

static void
update_quantizers_before_forward (FzCtx *ctx)
{
  g_autoptr(GError) error = NULL;
  gpointer layer;
  gboolean ok;

  NEED (layer, "mlp:fp8:delayed");
  ok = gmlp_grouped_mlp_update_quantizers (layer, &error);
  fz_check_result (ctx, "update_quantizers", ok, error);
}

/* Sizes on the device */

static void
device_sized_forward_host_sized_grad (FzCtx *ctx)
{
  foreign_saved (ctx, "linear:f32", "saved:dev", "dy:f32", GMLP_ERROR_INVALID_ARGUMENT,
                 "an output gradient whose sizes are on the host when the input's were not "
                 "(documented: INVALID_ARGUMENT)");
}

static void
host_sized_forward_device_sized_grad (FzCtx *ctx)
{
  foreign_saved (ctx, "linear:f32", "saved:linear", "dy:dev:f32", GMLP_ERROR_INVALID_ARGUMENT,
                 "an output gradient whose sizes are on the device when the input's were not "
                 "(documented: INVALID_ARGUMENT)");
}

static void
device_sizes_changed_before_backward (FzCtx *ctx)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedTensor) dx = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  gpointer layer, x, dy, sizes;
  gboolean ok;

  NEED (sizes, "sizes");
  if (!begin_step (ctx, "linear:f32", "x:dev:f32", "dy:dev:f32", &layer, &x, &dy, &saved))
    return;
  /* Random sizes, past the capacity and negative: the documented promise
   * is broken, but nothing outside the tensors may be touched. */
  ok = gmlp_grouped_tensor_fill_random (sizes, 3, 1e12, &error);
  fz_check_result (ctx, "fill_random of the INT64 sizes", ok, error);
  g_clear_error (&error);
  if (!ok)
    {
      gpointer hostile;

      NEED (hostile, "sizes:hostile");
      ok = gmlp_grouped_tensor_add_scaled (sizes, 1.0, hostile, &error);
      fz_check_result (ctx, "add_scaled of -1 and 2^40 to the INT64 sizes", ok, error);
    }
  g_clear_error (&error);
  dx = gmlp_grouped_linear_backward (layer, saved, dy, &error);
  fz_check_result (ctx, "backward", dx != NULL, error);
}

/* Silent wrong answers named by issue 40 */

static void
convert_scaled_fp8 (FzCtx *ctx)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpQuantizer) q = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, x8 = NULL, conv = NULL, deq = NULL;
  g_autoptr(GBytes) a = NULL, b = NULL;
  gint64 rows[1] = { 4 };
  float values[4 * FZ_K];
  int i;

  for (i = 0; i < 4 * FZ_K; i++)
    values[i] = 0.003f * (float) ((i % 7) - 3) / 3.0f;
  {
    g_autoptr(GBytes) data = g_bytes_new (values, sizeof values);

    x = gmlp_grouped_tensor_new_from_bytes (ctx->device, GMLP_DTYPE_FLOAT32, rows, 1, FZ_K, data, &error);
  }
  if (!fz_ok_ptr (ctx, "new_from_bytes", x, error))
    return;
  q = gmlp_quantizer_new (ctx->device, GMLP_SCALING_RECIPE_CURRENT, GMLP_FP8_FORMAT_E4M3,
                          GMLP_QUANTIZER_ROLE_INPUT);
  x8 = gmlp_quantizer_quantize (q, x, &error);
  if (!fz_ok_ptr (ctx, "quantize", x8, error))
    return;
  deq = gmlp_grouped_tensor_dequantize (x8, GMLP_DTYPE_FLOAT32, &error);
  if (!fz_ok_ptr (ctx, "dequantize", deq, error))
    return;
  conv = gmlp_grouped_tensor_convert (x8, GMLP_DTYPE_FLOAT32, &error);
  fz_check_result (ctx, "convert of the scaled tensor", conv != NULL, error);
  if (conv == NULL)
    return;
  if ((a = bytes_of (ctx, conv)) == NULL || (b = bytes_of (ctx, deq)) == NULL)
    return;
  if (!g_bytes_equal (a, b))
    fz_fail (ctx, "silent wrong answer",
             "convert() of a scaled FP8 tensor differs from dequantize() (issue 40: apply the "
             "scales or refuse); first value %g, dequantized %g",
             ((const float *) g_bytes_get_data (a, NULL))[0], ((const float *) g_bytes_get_data (b, NULL))[0]);
}

static void
convert_int64_to_int32 (FzCtx *ctx)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedTensor) t = NULL, c = NULL;
  g_autoptr(GBytes) out = NULL;
  gint64 rows[1] = { 1 };
  gint64 values[4] = { (gint64) 1 << 40, -((gint64) 1 << 40), G_MAXINT64, 5 };
  const gint32 *r;

  {
    g_autoptr(GBytes) data = g_bytes_new (values, sizeof values);

    t = gmlp_grouped_tensor_new_from_bytes (ctx->device, GMLP_DTYPE_INT64, rows, 1, 4, data, &error);
  }
  if (!fz_ok_ptr (ctx, "new_from_bytes", t, error))
    return;
  c = gmlp_grouped_tensor_convert (t, GMLP_DTYPE_INT32, &error);
  fz_check_result (ctx, "convert INT64 → INT32", c != NULL, error);
  if (c == NULL || (out = bytes_of (ctx, c)) == NULL)
    return;
  r = g_bytes_get_data (out, NULL);
  if (r[0] != G_MAXINT32 || r[1] != G_MININT32 || r[2] != G_MAXINT32 || r[3] != 5)
    fz_fail (ctx, "silent wrong answer",
             "INT64 → INT32 gave %d, %d, %d, %d for 2^40, -2^40, INT64_MAX, 5 (issue 40: saturate "
             "as the float conversions do, or refuse)", r[0], r[1], r[2], r[3]);
}

/* alpha finite as a double and not as a float: 0 × alpha must stay 0. */
static void
scale_by_huge (FzCtx    *ctx,
               gboolean  add)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedTensor) t = NULL, zeros = NULL;
  g_autoptr(GBytes) out = NULL;
  gint64 rows[1] = { 2 };
  const float *v;
  gboolean ok;
  gsize n, i;

  t = gmlp_grouped_tensor_new (ctx->device, GMLP_DTYPE_FLOAT32, rows, 1, FZ_K, &error);
  zeros = t != NULL ? gmlp_grouped_tensor_new (ctx->device, GMLP_DTYPE_FLOAT32, rows, 1, FZ_K, &error) : NULL;
  if (!fz_ok_ptr (ctx, "new", zeros, error) ||
      !fz_ok_bool (ctx, "fill_zero", gmlp_grouped_tensor_fill_zero (t, &error), error) ||
      !fz_ok_bool (ctx, "fill_zero", gmlp_grouped_tensor_fill_zero (zeros, &error), error))
    return;
  ok = add ? gmlp_grouped_tensor_add_scaled (t, 1e300, zeros, &error)
           : gmlp_grouped_tensor_scale (t, 1e300, &error);
  fz_check_result (ctx, add ? "add_scaled (1e300, zeros)" : "scale (1e300) of zeros", ok, error);
  if (!ok || (out = bytes_of (ctx, t)) == NULL)
    return;
  v = g_bytes_get_data (out, &n);
  for (i = 0; i < n / sizeof (float); i++)
    if (v[i] != 0.0f)
      {
        fz_fail (ctx, "silent wrong answer",
                 "0 × 1e300 gave %g (issue 40: a scale finite as a double only)", v[i]);
        return;
      }
}

static void scale_zeros_by_1e300 (FzCtx *ctx) { scale_by_huge (ctx, FALSE); }
static void add_scaled_zeros_by_1e300 (FzCtx *ctx) { scale_by_huge (ctx, TRUE); }

/* Aliasing */

static void
add_scaled_to_itself (FzCtx *ctx)
{
  g_autoptr(GError) error = NULL;
  gpointer t;
  gboolean ok;

  NEED (t, "x:f32");
  ok = gmlp_grouped_tensor_add_scaled (t, -1.0, t, &error);
  fz_check_result (ctx, "add_scaled (t, -1, t)", ok, error);
}

static void
forward_on_own_weight (FzCtx *ctx)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedTensor) y = NULL, dx = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  gpointer layer, w, dy;

  NEED (layer, "linear:f32");
  NEED (dy, "dy:f32");
  w = weight_of (layer);
  y = gmlp_grouped_linear_forward (layer, w, &saved, &error);
  fz_check_result (ctx, "forward of its own weight", y != NULL, error);
  if (y == NULL)
    return;
  dx = gmlp_grouped_linear_backward (layer, saved, y, &error);
  fz_check_result (ctx, "backward with its own output as the gradient", dx != NULL, error);
}

/* Devices, events, graphs */

static void
capture_misuse (FzCtx *ctx)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGraph) graph = NULL;
  gboolean ok, begun;

  graph = gmlp_device_end_capture (ctx->device, &error);
  fz_expect_error (ctx, "end_capture without begin", graph != NULL, error, -1, "no capture in progress");
  g_clear_error (&error);
  begun = gmlp_device_begin_capture (ctx->device, &error);
  fz_check_result (ctx, "begin_capture", begun, error);
  g_clear_error (&error);
  if (!begun)
    return;
  ok = gmlp_device_begin_capture (ctx->device, &error);
  fz_expect_error (ctx, "begin_capture twice", ok, error, -1, "a capture is in progress");
  g_clear_error (&error);
  ok = gmlp_device_synchronize (ctx->device, &error);
  fz_check_result (ctx, "synchronize while capturing", ok, error);
  g_clear_error (&error);
  graph = gmlp_device_end_capture (ctx->device, &error);
  fz_check_result (ctx, "end_capture", graph != NULL, error);
  g_clear_error (&error);
  if (graph != NULL)
    {
      ok = gmlp_graph_replay (graph, &error);
      fz_check_result (ctx, "replay of an empty graph", ok, error);
    }
}

static void
graph_outlives_its_tensors (FzCtx *ctx)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGraph) graph = NULL;
  g_autoptr(GmlpGroupedTensor) t = NULL;
  gint64 rows[1] = { 4 };
  gboolean ok;

  t = gmlp_grouped_tensor_new (ctx->device, GMLP_DTYPE_FLOAT32, rows, 1, FZ_K, &error);
  if (!fz_ok_ptr (ctx, "new", t, error))
    return;
  ok = gmlp_device_begin_capture (ctx->device, &error);
  if (!ok)
    {
      fz_check_result (ctx, "begin_capture", ok, error);
      return;
    }
  ok = gmlp_grouped_tensor_fill_zero (t, &error);
  fz_check_result (ctx, "fill_zero while capturing", ok, error);
  g_clear_error (&error);
  graph = gmlp_device_end_capture (ctx->device, &error);
  if (!fz_ok_ptr (ctx, "end_capture", graph, error))
    return;
  g_clear_object (&t);
  ok = gmlp_graph_replay (graph, &error);
  fz_check_result (ctx, "replay after the tensor is gone", ok, error);
}

static void
event_elapsed_same_and_reversed (FzCtx *ctx)
{
  g_autoptr(GError) error = NULL;
  gpointer a, b;
  double ms = -1;
  gboolean ok;

  NEED (a, "event");
  NEED (b, "event@later");
  ok = gmlp_event_elapsed_ms (a, a, &ms, &error);
  fz_check_result (ctx, "elapsed_ms (e, e)", ok, error);
  g_clear_error (&error);
  ok = gmlp_event_elapsed_ms (b, a, &ms, &error);
  fz_check_result (ctx, "elapsed_ms (later, earlier)", ok, error);
  if (ok && !(ms <= 0))
    fz_note (ctx, "reversed elapsed %g ms", ms);
}

static void
accumulation_mask_then_backward (FzCtx *ctx)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedTensor) dx = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  gboolean mask[3] = { FALSE, TRUE, TRUE };
  gpointer layer, x, dy;
  gboolean ok;

  if (!begin_step (ctx, "linear:f32:delay", "x:f32", "dy:f32", &layer, &x, &dy, &saved))
    return;
  ok = gmlp_grouped_linear_set_wgrad_accumulation_mask (layer, mask, 3, &error);
  fz_expect_error (ctx, "set_wgrad_accumulation_mask (3 for 2 groups)", ok, error,
                   GMLP_ERROR_INVALID_ARGUMENT, "n_groups is not the layer's (documented: INVALID_ARGUMENT)");
  g_clear_error (&error);
  dx = gmlp_grouped_linear_backward (layer, saved, dy, &error);
  if (!fz_ok_ptr (ctx, "backward", dx, error))
    return;
  ok = gmlp_grouped_linear_set_wgrad_accumulation_mask (layer, mask, 2, &error);
  fz_check_result (ctx, "set_wgrad_accumulation_mask while a wgrad is pending", ok, error);
  g_clear_error (&error);
  ok = gmlp_grouped_linear_backward_dw (layer, &error);
  fz_ok_bool (ctx, "backward_dw", ok, error);
}

static void
forward_on_foreign_device (FzCtx *ctx)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedTensor) y = NULL;
  gpointer layer, x;

  if (!ctx->cuda)
    {
      fz_skip (ctx, "one CPU device per process: no foreign device to mix with");
      return;
    }
  NEED (layer, "linear:f32");
  NEED (x, "x:cpu");
  y = gmlp_grouped_linear_forward (layer, x, NULL, &error);
  fz_expect_error (ctx, "forward of a CPU tensor on a GPU layer", y != NULL, error, -1,
                   "an input on another device");
}

static const FzScenario scenarios[] = {
  { "linear-backward-other-layers-saved", linear_backward_other_layers_saved },
  { "linear-backward-mlp-saved", linear_backward_mlp_saved },
  { "mlp-backward-linear-saved", mlp_backward_linear_saved },
  { "mlp-backward-other-mlps-saved", mlp_backward_other_mlps_saved },
  { "fc1-backward-with-mlp-saved", fc1_backward_with_mlp_saved },
  { "linear-backward-twice", linear_backward_twice },
  { "mlp-backward-twice", mlp_backward_twice },
  { "delayed-mlp-backward-twice", delayed_mlp_backward_twice },
  { "linear-backward-dw-nothing-pending", linear_backward_dw_nothing_pending },
  { "linear-backward-dw-not-delayed", linear_backward_dw_not_delayed },
  { "mlp-backward-dw-nothing-pending", mlp_backward_dw_nothing_pending },
  { "linear-backward-dw-twice", linear_backward_dw_twice },
  { "offload-pop-without-push", offload_pop_without_push },
  { "offload-pop-on-another-thread", offload_pop_on_another_thread },
  { "offload-push-twice", offload_push_twice },
  { "offload-pop-out-of-order", offload_pop_out_of_order },
  { "offload-unref-while-pushed", offload_unref_while_pushed },
  { "offload-prefetch-twice-and-consumed", offload_prefetch_twice_and_consumed },
  { "linear-init-twice", linear_init_twice },
  { "mlp-init-twice", mlp_init_twice },
  { "init-after-failed-init", init_after_failed_init },
  { "mlp-backward-bad-grad-then-good", mlp_backward_bad_grad_then_good },
  { "mlp-backward-bad-rows-then-good", mlp_backward_bad_rows_then_good },
  { "linear-backward-bad-grad-then-good", linear_backward_bad_grad_then_good },
  { "linear-backward-bad-dtype-then-good", linear_backward_bad_dtype_then_good },
  { "linear-input-scaled-before-backward", linear_input_scaled },
  { "linear-input-scaled-before-backward-offload", linear_input_scaled_offload },
  { "linear-weight-reinit-before-backward", linear_weight_init },
  { "linear-weight-set-before-backward-offload", linear_weight_bytes_offload },
  { "linear-weight-scaled-before-backward", linear_weight_scaled },
  { "mlp-input-zeroed-before-backward", mlp_input_zeroed },
  { "mlp-input-zeroed-before-backward-offload", mlp_input_zeroed_offload },
  { "mlp-weight-reinit-before-backward", mlp_weight_init },
  { "set-main-grad-own-weight", set_main_grad_own_weight },
  { "set-main-grad-member-own-weight", set_main_grad_member_own_weight },
  { "set-main-grad-mid-step", set_main_grad_then_backward_twice },
  { "saved-outlives-layer", saved_outlives_layer },
  { "member-outlives-tensor", member_outlives_tensor },
  { "dlpack-outlives-tensor", dlpack_outlives_tensor },
  { "delayed-quantizer-other-groups", delayed_quantizer_other_groups },
  { "restore-state-of-other-recipe", restore_state_of_other_recipe },
  { "restore-then-quantize-other-groups", restore_then_quantize_other_groups },
  { "linear-quantizers-changed-mid-step", linear_quantizers_changed_mid_step },
  { "mlp-recipe-changed-mid-step", mlp_recipe_changed_mid_step },
  { "update-quantizers-before-forward", update_quantizers_before_forward },
  { "device-sized-forward-host-sized-grad", device_sized_forward_host_sized_grad },
  { "host-sized-forward-device-sized-grad", host_sized_forward_device_sized_grad },
  { "device-sizes-changed-before-backward", device_sizes_changed_before_backward },
  { "convert-scaled-fp8", convert_scaled_fp8 },
  { "convert-int64-to-int32", convert_int64_to_int32 },
  { "scale-zeros-by-1e300", scale_zeros_by_1e300 },
  { "add-scaled-zeros-by-1e300", add_scaled_zeros_by_1e300 },
  { "add-scaled-to-itself", add_scaled_to_itself },
  { "forward-on-own-weight", forward_on_own_weight },
  { "capture-misuse", capture_misuse },
  { "graph-outlives-its-tensors", graph_outlives_its_tensors },
  { "event-elapsed-same-and-reversed", event_elapsed_same_and_reversed },
  { "accumulation-mask-then-backward", accumulation_mask_then_backward },
  { "forward-on-foreign-device", forward_on_foreign_device },
};

const FzScenario *
fz_scenarios (guint *n)
{
  *n = G_N_ELEMENTS (scenarios);
  return scenarios;
}
