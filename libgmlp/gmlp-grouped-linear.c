/* gmlp-grouped-linear.c: the GmlpGroupedLinear object
 *
 * Its type, properties and signal, its construction, the accessors of its
 * shape and state, and its quantizers and cache-fp8-weights (set, read,
 * updated). The parameters are in gmlp-grouped-linear-params.c, the
 * products in gmlp-grouped-linear-products.c over
 * gmlp-grouped-linear-runner.c, FP8's rules and products in
 * gmlp-grouped-linear-fp8.c; gmlp-grouped-linear-impl.h has what they
 * share, and in which order they call each other.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <string.h>

#include <gio/gio.h>

#include "gmlp-grouped-linear-impl.h"
#include "gmlp-enum-types.h"
#include "gmlp-error.h"
#include "gmlp-error-private.h"
#include "gmlp-event-private.h"
#include "gmlp-saved-activations-private.h"
#include "gmlp-thread-private.h"

/**
 * GmlpGroupedLinear:
 *
 * The expert linear layer of a Mixture-of-Experts model: group *i* computes
 * `y_i = x_i W_iᵀ (+ b_i)` on its own rows of the input.
 *
 * The weights are one uniform grouped tensor of `n_groups` members of
 * `out_features × in_features`, owned by the layer; the bias, when enabled,
 * `n_groups` members of `1 × out_features`. Computation is in the layer's
 * [property@Gmlp.GroupedLinear:dtype] (FP32, FP16 or BF16) with FP32
 * accumulation.
 *
 * [method@Gmlp.GroupedLinear.forward] returns the output and a
 * [class@Gmlp.SavedActivations] for [method@Gmlp.GroupedLinear.backward], so
 * several microbatches can be in flight. Backward returns the input gradient
 * `dx_i = dy_i W_i` and computes the weight gradients `dW_i = dy_iᵀ x_i` and
 * `db_i = Σ_rows dy_i` — at once, or, with
 * [property@Gmlp.GroupedLinear:delay-wgrad-compute], in
 * [method@Gmlp.GroupedLinear.backward_dw].
 *
 * ## The gradient contract
 *
 * A *weight-gradient computation* happens in each backward, or, when
 * delayed, in each backward_dw (one per earlier backward, oldest first).
 * After one:
 *
 * - without [property@Gmlp.GroupedLinear:fuse-wgrad-accumulation]: the wgrad
 *   tensor holds `dW` of that backward (overwritten), in the layer's dtype;
 *   main_grad does not exist; [property@Gmlp.GroupedLinear:grad-added-to-main-grad]
 *   is %FALSE;
 * - with it: `main_grad_i += dW_i` in FP32 inside the GEMM (or `=` for the
 *   groups the accumulation mask sets to overwrite); there is no wgrad
 *   tensor (its getters return %NULL); grad-added-to-main-grad is %TRUE;
 * - the bias gradient, when there is a bias, is written (never accumulated)
 *   to the bgrad tensor;
 * - [signal@Gmlp.GroupedLinear::wgrad-ready] is emitted once.
 *
 * A delayed backward changes no weight gradient and emits nothing; it adds
 * one to [property@Gmlp.GroupedLinear:pending-wgrads].
 *
 * With [property@Gmlp.GroupedLinear:single-grouped-weight] the parameters and
 * their gradients are grouped tensors (get_weight(), get_wgrad(),
 * get_main_grad(), …) and the member getters return %NULL; without it they
 * are per group (get_weight_member(), get_wgrad_member(), …; each a
 * one-group tensor) and the grouped getters return %NULL. The weight
 * gradients are views of one packed allocation in both cases.
 *
 * docs/gradient-contract.md has the same contract as a table.
 *
 * ## Group sizes on the device
 *
 * The input may have its group sizes only on the device (for example
 * written by a router kernel; see
 * [ctor@Gmlp.GroupedTensor.new_with_device_sizes]). Forward, backward and
 * backward_dw then never read the sizes on the host and never wait for the
 * device, and allocate nothing but their outputs, which share the input's
 * sizes tensor and row capacity. Sizes that add up to more than the
 * capacity are clamped as docs/memory-layout.md says. The output gradient
 * given to backward must have device sizes of the same values and the same
 * row capacity (see [method@Gmlp.GroupedLinear.backward]); every option and
 * the gradient contract are the same.
 *
 * ## FP8
 *
 * With quantizers for the input, the weights and the output gradient
 * ([method@Gmlp.GroupedLinear.set_quantizers], or the construct properties
 * [property@Gmlp.GroupedLinear:input-quantizer],
 * [property@Gmlp.GroupedLinear:weight-quantizer] and
 * [property@Gmlp.GroupedLinear:grad-output-quantizer]), forward quantizes
 * `x` and `W` and backward quantizes `dy`, and the three products multiply
 * FP8 values with FP32 sums; outputs and gradients keep the layer's dtype
 * and the gradient contract is the same. The input and the output gradient
 * may also be given quantized already (made by a quantizer whose recipe
 * meets the others'). The saved activations hold the quantized input, every
 * part of it offloaded with it. Delayed scaling needs
 * [method@Gmlp.GroupedLinear.update_quantizers] (or
 * [method@Gmlp.Quantizer.update]) once a training step, from the caller:
 * the layer cannot tell where a step ends. docs/fp8.md has the details.
 *
 * ## Threads
 *
 * A layer may be used from several threads at once. Forwards run
 * concurrently: they only read the parameters, and the cached FP8 weights
 * are quantized once. The weight-gradient computations (backward and
 * backward_dw) run one at a time: concurrent calls wait for each other, so
 * with fuse-wgrad-accumulation main_grad receives every thread's dW (in an
 * order that the threads decide, which can change the last bits), and
 * without it wgrad and bgrad hold the dW of whichever ran last. Each saved
 * activations object serves one backward: when threads race to use the
 * same one, one backward runs and the others fail with
 * %GMLP_ERROR_INVALID_STATE. [signal@Gmlp.GroupedLinear::wgrad-ready] is
 * emitted on the thread that computed the gradients, while the layer keeps
 * the others waiting; a handler may call the layer, but must not wait for
 * another thread that runs this layer's backward.
 *
 * Replacing the parameters or the quantizers (init_parameters,
 * set_weight_from_bytes, set_quantizers, an optimizer step on the weights)
 * is not ordered with forwards and backwards that run meanwhile, nor is
 * reading the gradients: do it between steps. Binding main_grad and the
 * accumulation mask wait for a running backward.
 *
 * ## Examples
 *
 * In Python (PyGObject):
 *
 * ```python
 * import gi
 * gi.require_version('Gmlp', '1.0')
 * from gi.repository import GLib, Gmlp
 *
 * dev = Gmlp.Device.get_default()
 * layer = Gmlp.GroupedLinear.new_full(dev, 4, 64, 32, Gmlp.DType.FLOAT32,
 *                                     Gmlp.LinearFlags.BIAS | Gmlp.LinearFlags.SINGLE_GROUPED_WEIGHT)
 * layer.init_parameters(42)
 * x = Gmlp.GroupedTensor.new(dev, Gmlp.DType.FLOAT32, [5, 0, 7, 4], 64)   # rows per expert
 * x.fill_random(1, 1.0)
 * y, saved = layer.forward(x)        # y_i = x_i W_i^T + b_i
 * dy = Gmlp.GroupedTensor.new(dev, Gmlp.DType.FLOAT32, [5, 0, 7, 4], 32)
 * dy.fill_random(2, 1.0)
 * dx = layer.backward(saved, dy)     # and the weight gradients
 * layer.get_weight().add_scaled(-0.1, layer.get_wgrad())   # one SGD step
 * ```
 *
 * In JavaScript (gjs; run with `gjs -m`):
 *
 * ```js
 * import GLib from 'gi://GLib';
 * import Gmlp from 'gi://Gmlp?version=1.0';
 *
 * const dev = Gmlp.Device.get_default();
 * const layer = Gmlp.GroupedLinear.new_full(dev, 4, 64, 32, Gmlp.DType.FLOAT32,
 *     Gmlp.LinearFlags.BIAS | Gmlp.LinearFlags.SINGLE_GROUPED_WEIGHT);
 * layer.init_parameters(42);
 * const x = Gmlp.GroupedTensor.new(dev, Gmlp.DType.FLOAT32, [5, 0, 7, 4], 64);  // rows per expert
 * x.fill_random(1, 1.0);
 * const [y, saved] = layer.forward(x);   // y_i = x_i W_i^T + b_i
 * const dy = Gmlp.GroupedTensor.new(dev, Gmlp.DType.FLOAT32, [5, 0, 7, 4], 32);
 * dy.fill_random(2, 1.0);
 * const dx = layer.backward(saved, dy);  // and the weight gradients
 * layer.get_weight().add_scaled(-0.1, layer.get_wgrad());  // one SGD step
 * ```
 *
 * Since: 0.1
 */

static void gmlp_grouped_linear_initable_iface_init (GInitableIface *iface);

G_DEFINE_FINAL_TYPE_WITH_CODE (GmlpGroupedLinear, gmlp_grouped_linear, G_TYPE_OBJECT,
                               G_IMPLEMENT_INTERFACE (G_TYPE_INITABLE,
                                                      gmlp_grouped_linear_initable_iface_init))

enum {
  SIGNAL_WGRAD_READY,
  N_SIGNALS
};

static GParamSpec *properties[N_PROPS];
static guint signals[N_SIGNALS];

static const struct {
  guint           prop_id;
  GmlpLinearFlags flag;
} flag_props[] = {
  { PROP_BIAS, GMLP_LINEAR_BIAS },
  { PROP_SINGLE_GROUPED_WEIGHT, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT },
  { PROP_FUSE_WGRAD_ACCUMULATION, GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION },
  { PROP_DELAY_WGRAD_COMPUTE, GMLP_LINEAR_DELAY_WGRAD_COMPUTE },
};

/* For the layer's other files, which cannot see properties[] and
 * signals[] (gmlp-grouped-linear-impl.h). */
void
gmlp_grouped_linear_notify (GmlpGroupedLinear *self,
                            guint              prop_id)
{
  g_object_notify_by_pspec (G_OBJECT (self), properties[prop_id]);
}

gboolean
gmlp_grouped_linear_record_wgrad_ready (GmlpGroupedLinear  *self,
                                        GmlpEvent         **event,
                                        GError            **error)
{
  return gmlp_event_record_for_signal (self, signals[SIGNAL_WGRAD_READY], self->device, event, error);
}

void
gmlp_grouped_linear_emit_wgrad_ready (GmlpGroupedLinear *self,
                                      GmlpEvent         *event)
{
  if (event != NULL)
    g_signal_emit (self, signals[SIGNAL_WGRAD_READY], 0, event);
}

void
gmlp_linear_pending_wgrad_free (gpointer data)
{
  PendingWgrad *pending = data;

  gmlp_linear_fp8_wgrad_operands_clear (&pending->fp8_operands);
  /* backward_dw may run on another thread than the backward that queued
   * these, which may hold them still. */
  gmlp_object_unref_shared (pending->input);
  g_clear_pointer (&pending->grad_output, gmlp_object_unref_shared);
  g_clear_pointer (&pending->grad_output_fp8, gmlp_object_unref_shared);
  g_array_unref (pending->versions);
  g_clear_pointer (&pending->chunks, g_ptr_array_unref);
  g_free (pending->bounds);
  g_free (pending);
}

static void
gmlp_grouped_linear_finalize (GObject *object)
{
  GmlpGroupedLinear *self = (GmlpGroupedLinear *) object;

  gmlp_linear_param_clear (&self->weight, self->n_groups);
  gmlp_linear_param_clear (&self->bias, self->n_groups);
  gmlp_linear_param_clear (&self->wgrad, self->n_groups);
  gmlp_linear_param_clear (&self->bgrad, self->n_groups);
  gmlp_linear_param_clear (&self->main_grad, self->n_groups);
  g_queue_clear_full (&self->pending, gmlp_linear_pending_wgrad_free);
  g_clear_pointer (&self->accumulate, g_free);
  g_clear_object (&self->input_quantizer);
  g_clear_object (&self->weight_quantizer);
  g_clear_object (&self->grad_output_quantizer);
  g_clear_object (&self->weight_fp8);
  g_clear_object (&self->device);
  g_clear_error (&self->construct_error);
  g_rec_mutex_clear (&self->grad_lock);
  g_mutex_clear (&self->fp8_lock);
  g_clear_object (&self->w_parts);
  g_clear_object (&self->w_parts_of);
  g_clear_pointer (&self->w_parts_version, g_array_unref);
  g_mutex_clear (&self->split_lock);

  G_OBJECT_CLASS (gmlp_grouped_linear_parent_class)->finalize (object);
}

static void
gmlp_grouped_linear_get_property (GObject    *object,
                                  guint       prop_id,
                                  GValue     *value,
                                  GParamSpec *pspec)
{
  GmlpGroupedLinear *self = GMLP_GROUPED_LINEAR (object);
  guint i;

  for (i = 0; i < G_N_ELEMENTS (flag_props); i++)
    if (flag_props[i].prop_id == prop_id)
      {
        g_value_set_boolean (value, has_flag (self, flag_props[i].flag));
        return;
      }

  switch (prop_id)
    {
    case PROP_DEVICE:
      g_value_set_object (value, self->device);
      break;
    case PROP_N_GROUPS:
      g_value_set_uint (value, self->n_groups);
      break;
    case PROP_IN_FEATURES:
      g_value_set_int64 (value, self->in_features);
      break;
    case PROP_OUT_FEATURES:
      g_value_set_int64 (value, self->out_features);
      break;
    case PROP_DTYPE:
      g_value_set_enum (value, self->dtype);
      break;
    case PROP_GRAD_ADDED_TO_MAIN_GRAD:
      g_value_set_boolean (value, self->grad_added_to_main_grad);
      break;
    case PROP_PENDING_WGRADS:
      g_value_set_uint (value, self->pending.length);
      break;
    case PROP_INPUT_QUANTIZER:
      g_value_set_object (value, self->input_quantizer);
      break;
    case PROP_WEIGHT_QUANTIZER:
      g_value_set_object (value, self->weight_quantizer);
      break;
    case PROP_GRAD_OUTPUT_QUANTIZER:
      g_value_set_object (value, self->grad_output_quantizer);
      break;
    case PROP_CACHE_FP8_WEIGHTS:
      g_value_set_boolean (value, gmlp_grouped_linear_get_cache_fp8_weights (self));
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
    }
}

static void
gmlp_grouped_linear_set_property (GObject      *object,
                                  guint         prop_id,
                                  const GValue *value,
                                  GParamSpec   *pspec)
{
  GmlpGroupedLinear *self = GMLP_GROUPED_LINEAR (object);
  guint i;

  for (i = 0; i < G_N_ELEMENTS (flag_props); i++)
    if (flag_props[i].prop_id == prop_id)
      {
        if (g_value_get_boolean (value))
          self->flags |= flag_props[i].flag;
        else
          self->flags &= ~flag_props[i].flag;
        return;
      }

  switch (prop_id)
    {
    case PROP_DEVICE:
      self->device = g_value_dup_object (value);
      break;
    case PROP_N_GROUPS:
      self->n_groups = g_value_get_uint (value);
      break;
    case PROP_IN_FEATURES:
      self->in_features = g_value_get_int64 (value);
      break;
    case PROP_OUT_FEATURES:
      self->out_features = g_value_get_int64 (value);
      break;
    case PROP_DTYPE:
      self->dtype = g_value_get_enum (value);
      break;
    /* Construct-only; constructed() checks them together. */
    case PROP_INPUT_QUANTIZER:
      self->input_quantizer = g_value_dup_object (value);
      break;
    case PROP_WEIGHT_QUANTIZER:
      self->weight_quantizer = g_value_dup_object (value);
      break;
    case PROP_GRAD_OUTPUT_QUANTIZER:
      self->grad_output_quantizer = g_value_dup_object (value);
      break;
    case PROP_CACHE_FP8_WEIGHTS:
      gmlp_grouped_linear_set_cache_fp8_weights (self, g_value_get_boolean (value));
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
    }
}

static void gmlp_grouped_linear_constructed (GObject *object);

static void
gmlp_grouped_linear_class_init (GmlpGroupedLinearClass *klass)
{
  GObjectClass *object_class = G_OBJECT_CLASS (klass);
  const GParamFlags construct = G_PARAM_READWRITE | G_PARAM_CONSTRUCT_ONLY |
                                G_PARAM_EXPLICIT_NOTIFY | G_PARAM_STATIC_STRINGS;
  const GParamFlags readable = G_PARAM_READABLE | G_PARAM_EXPLICIT_NOTIFY | G_PARAM_STATIC_STRINGS;

  object_class->constructed = gmlp_grouped_linear_constructed;
  object_class->finalize = gmlp_grouped_linear_finalize;
  object_class->get_property = gmlp_grouped_linear_get_property;
  object_class->set_property = gmlp_grouped_linear_set_property;

  /* The ranges of the sizes are wide on purpose: a bad value is a GError of
   * the construction, not a warning of GObject's. */

  /**
   * GmlpGroupedLinear:device:
   *
   * The device the parameters live on and the computation runs on.
   *
   * Since: 0.1
   */
  properties[PROP_DEVICE] =
    g_param_spec_object ("device", NULL, NULL, GMLP_TYPE_DEVICE, construct);

  /**
   * GmlpGroupedLinear:n-groups:
   *
   * The number of groups (experts), 1 to 65535.
   *
   * Since: 0.1
   */
  properties[PROP_N_GROUPS] =
    g_param_spec_uint ("n-groups", NULL, NULL, 0, G_MAXUINT, 1, construct);

  /**
   * GmlpGroupedLinear:in-features:
   *
   * The number of input features (columns of the input).
   *
   * Since: 0.1
   */
  properties[PROP_IN_FEATURES] =
    g_param_spec_int64 ("in-features", NULL, NULL, G_MININT64, G_MAXINT64, 1, construct);

  /**
   * GmlpGroupedLinear:out-features:
   *
   * The number of output features (columns of the output).
   *
   * Since: 0.1
   */
  properties[PROP_OUT_FEATURES] =
    g_param_spec_int64 ("out-features", NULL, NULL, G_MININT64, G_MAXINT64, 1, construct);

  /**
   * GmlpGroupedLinear:dtype:
   *
   * The type of the parameters, activations and gradients: FLOAT32,
   * FLOAT16 or BFLOAT16. Products accumulate in FP32.
   *
   * Since: 0.1
   */
  properties[PROP_DTYPE] =
    g_param_spec_enum ("dtype", NULL, NULL, GMLP_TYPE_DTYPE, GMLP_DTYPE_FLOAT32, construct);

  /**
   * GmlpGroupedLinear:bias:
   *
   * Whether each group adds a bias of `out_features` values.
   *
   * Since: 0.1
   */
  properties[PROP_BIAS] =
    g_param_spec_boolean ("bias", NULL, NULL, FALSE, construct);

  /**
   * GmlpGroupedLinear:single-grouped-weight:
   *
   * Whether the parameters and their gradients are exposed as grouped
   * tensors (one object for all groups) rather than one tensor per group.
   *
   * Since: 0.1
   */
  properties[PROP_SINGLE_GROUPED_WEIGHT] =
    g_param_spec_boolean ("single-grouped-weight", NULL, NULL, TRUE, construct);

  /**
   * GmlpGroupedLinear:fuse-wgrad-accumulation:
   *
   * Whether weight gradients are added into the FP32 main_grad inside the
   * GEMM, instead of being written to a wgrad tensor. The layer allocates a
   * zeroed main_grad; [method@Gmlp.GroupedLinear.set_main_grad] and
   * [method@Gmlp.GroupedLinear.set_main_grad_member] bind the caller's.
   *
   * Since: 0.1
   */
  properties[PROP_FUSE_WGRAD_ACCUMULATION] =
    g_param_spec_boolean ("fuse-wgrad-accumulation", NULL, NULL, FALSE, construct);

  /**
   * GmlpGroupedLinear:delay-wgrad-compute:
   *
   * Whether backward leaves the weight gradients to
   * [method@Gmlp.GroupedLinear.backward_dw].
   *
   * Since: 0.1
   */
  properties[PROP_DELAY_WGRAD_COMPUTE] =
    g_param_spec_boolean ("delay-wgrad-compute", NULL, NULL, FALSE, construct);

  /**
   * GmlpGroupedLinear:grad-added-to-main-grad:
   *
   * Whether the last weight-gradient computation added into main_grad
   * (always so with fused accumulation, never without), so an optimizer
   * knows not to add a wgrad again.
   *
   * Since: 0.1
   */
  properties[PROP_GRAD_ADDED_TO_MAIN_GRAD] =
    g_param_spec_boolean ("grad-added-to-main-grad", NULL, NULL, FALSE, readable);

  /**
   * GmlpGroupedLinear:pending-wgrads:
   *
   * How many delayed backwards wait for [method@Gmlp.GroupedLinear.backward_dw].
   *
   * Since: 0.1
   */
  properties[PROP_PENDING_WGRADS] =
    g_param_spec_uint ("pending-wgrads", NULL, NULL, 0, G_MAXUINT, 0, readable);

  /**
   * GmlpGroupedLinear:input-quantizer:
   *
   * The quantizer of the input (role %GMLP_QUANTIZER_ROLE_INPUT), or %NULL
   * for a layer that computes in its dtype. Set at construction, or with the
   * other two by [method@Gmlp.GroupedLinear.set_quantizers].
   *
   * Since: 0.1
   */
  properties[PROP_INPUT_QUANTIZER] =
    g_param_spec_object ("input-quantizer", NULL, NULL, GMLP_TYPE_QUANTIZER, construct);

  /**
   * GmlpGroupedLinear:weight-quantizer:
   *
   * The quantizer of the weights (role %GMLP_QUANTIZER_ROLE_WEIGHT), or
   * %NULL; see [property@Gmlp.GroupedLinear:input-quantizer].
   *
   * Since: 0.1
   */
  properties[PROP_WEIGHT_QUANTIZER] =
    g_param_spec_object ("weight-quantizer", NULL, NULL, GMLP_TYPE_QUANTIZER, construct);

  /**
   * GmlpGroupedLinear:grad-output-quantizer:
   *
   * The quantizer of the output gradient (role
   * %GMLP_QUANTIZER_ROLE_GRAD_OUTPUT), or %NULL; see
   * [property@Gmlp.GroupedLinear:input-quantizer].
   *
   * Since: 0.1
   */
  properties[PROP_GRAD_OUTPUT_QUANTIZER] =
    g_param_spec_object ("grad-output-quantizer", NULL, NULL, GMLP_TYPE_QUANTIZER, construct);

  /**
   * GmlpGroupedLinear:cache-fp8-weights:
   *
   * Whether an FP8 forward reuses the weights the previous one quantized.
   * Weights change once per optimizer step but are multiplied by every
   * microbatch's forward; with the cache they are quantized once per step
   * (Transformer Engine's `is_first_microbatch`). The layer drops the cache
   * itself when it changes the weights
   * ([method@Gmlp.GroupedLinear.set_weight_from_bytes],
   * [method@Gmlp.GroupedLinear.init_parameters]) or gets another weight
   * quantizer; a caller that writes the weights in any other way (an
   * optimizer step through [method@Gmlp.GroupedLinear.get_weight], DLPack)
   * calls [method@Gmlp.GroupedLinear.invalidate_fp8_weights] afterwards.
   * Delayed scaling records the weights' amax only when they are quantized.
   * Clearing the property drops the cache.
   *
   * Since: 0.1
   */
  properties[PROP_CACHE_FP8_WEIGHTS] =
    g_param_spec_boolean ("cache-fp8-weights", NULL, NULL, FALSE,
                          G_PARAM_READWRITE | G_PARAM_EXPLICIT_NOTIFY | G_PARAM_STATIC_STRINGS);

  g_object_class_install_properties (object_class, N_PROPS, properties);

  /**
   * GmlpGroupedLinear::wgrad-ready:
   * @self: the layer
   * @event: completes when the weight gradients are computed
   *
   * Emitted once per weight-gradient computation (in backward, or in
   * backward_dw when delayed), on the thread that called it, right after the
   * weight-gradient work has been enqueued on the device's stream and before
   * the call returns. The gradients are not computed yet: wait for @event on
   * the host, or make a stream wait for it (for example the stream of a
   * gradient all-reduce, through [method@Gmlp.Event.get_native_handle]), then
   * read them. The gradient storage is not reallocated between computations,
   * so a reader on another stream that waits for @event cannot race with the
   * next write of it as long as it finishes before the next backward.
   * The event is recorded for the handlers: without a handler connected,
   * none is recorded and the signal is not emitted.
   *
   * Since: 0.1
   */
  signals[SIGNAL_WGRAD_READY] =
    g_signal_new ("wgrad-ready",
                  G_TYPE_FROM_CLASS (klass),
                  G_SIGNAL_RUN_LAST,
                  0,
                  NULL, NULL,
                  NULL,
                  G_TYPE_NONE, 1, GMLP_TYPE_EVENT);
}

static void
gmlp_grouped_linear_init (GmlpGroupedLinear *self)
{
  self->dtype = GMLP_DTYPE_FLOAT32;
  self->n_groups = 1;
  self->in_features = 1;
  self->out_features = 1;
  self->flags = GMLP_LINEAR_SINGLE_GROUPED_WEIGHT;
  g_queue_init (&self->pending);
  g_rec_mutex_init (&self->grad_lock);
  g_mutex_init (&self->fp8_lock);
  g_mutex_init (&self->split_lock);
}

/* The work of construction, once, whatever made the object. */
static gboolean
construct_layer (GmlpGroupedLinear  *self,
                 GError            **error)
{
  g_autoptr(GmlpGroupedTensor) weight = NULL;
  g_autoptr(GmlpGroupedTensor) bias = NULL;
  g_autoptr(GmlpGroupedTensor) main_grad = NULL;

  if (self->device == NULL)
    self->device = g_object_ref (gmlp_device_get_default ());
  if (!gmlp_device_check_usable (self->device, error))
    return FALSE;
  if (self->n_groups == 0 || self->n_groups > GMLP_MAX_GROUPS)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "GroupedLinear has 1 to %d groups, not %u", GMLP_MAX_GROUPS, self->n_groups);
      return FALSE;
    }
  if (self->in_features <= 0 || self->out_features <= 0 ||
      self->in_features > G_MAXINT32 || self->out_features > G_MAXINT32)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "GroupedLinear features must be between 1 and %d, not %" G_GINT64_FORMAT
                   " → %" G_GINT64_FORMAT, G_MAXINT32, self->in_features, self->out_features);
      return FALSE;
    }
  if (self->dtype != GMLP_DTYPE_FLOAT32 && self->dtype != GMLP_DTYPE_FLOAT16 &&
      self->dtype != GMLP_DTYPE_BFLOAT16)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "GroupedLinear computes in float32, float16 or bfloat16, not %s "
                   "(FP8 goes through a quantizer)", gmlp_dtype_get_name (self->dtype));
      return FALSE;
    }
  if (!gmlp_linear_fp8_check_quantizers (self, self->input_quantizer, self->weight_quantizer,
                                         self->grad_output_quantizer, error))
    return FALSE;

  self->id = gmlp_layer_id_next ();
  self->accumulate = g_malloc (self->n_groups);
  memset (self->accumulate, 1, self->n_groups);

  weight = new_uniform (self, self->dtype, self->out_features, self->in_features, error);
  if (weight == NULL || !gmlp_linear_param_set (&self->weight, weight, self->n_groups, error))
    return FALSE;

  if (has_flag (self, GMLP_LINEAR_BIAS))
    {
      bias = new_uniform (self, self->dtype, 1, self->out_features, error);
      if (bias == NULL || !gmlp_linear_param_set (&self->bias, bias, self->n_groups, error))
        return FALSE;
    }

  if (has_flag (self, GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION))
    {
      main_grad = new_uniform (self, GMLP_DTYPE_FLOAT32, self->out_features, self->in_features, error);
      if (main_grad == NULL ||
          !gmlp_grouped_tensor_fill_zero (main_grad, error) ||
          !gmlp_linear_param_set (&self->main_grad, main_grad, self->n_groups, error))
        return FALSE;
    }

  return gmlp_grouped_linear_init_parameters (self, 0, error);
}

static void
gmlp_grouped_linear_constructed (GObject *object)
{
  GmlpGroupedLinear *self = GMLP_GROUPED_LINEAR (object);

  G_OBJECT_CLASS (gmlp_grouped_linear_parent_class)->constructed (object);

  (void) construct_layer (self, &self->construct_error);
}

/* Construction happened in constructed(): init only reports it, so a
 * second init changes nothing. */
static gboolean
gmlp_grouped_linear_initable_init (GInitable     *initable,
                                   GCancellable  *cancellable,
                                   GError       **error)
{
  GmlpGroupedLinear *self = GMLP_GROUPED_LINEAR (initable);

  return gmlp_check_constructed (self, self->construct_error, error);
}

static void
gmlp_grouped_linear_initable_iface_init (GInitableIface *iface)
{
  iface->init = gmlp_grouped_linear_initable_init;
}

/**
 * gmlp_grouped_linear_new:
 * @device: the device
 * @n_groups: the number of groups (experts)
 * @in_features: columns of the input
 * @out_features: columns of the output
 * @error: return location for a #GError
 *
 * Creates an FP32 layer with a single grouped weight and no other option;
 * see [ctor@Gmlp.GroupedLinear.new_full], or set the construct properties
 * with g_object_new() or g_initable_new() (a layer made with bad properties
 * reports why from [iface@Gio.Initable]'s init and from every method). The
 * parameters are initialised with seed 0 (see
 * [method@Gmlp.GroupedLinear.init_parameters]).
 *
 * Returns: (transfer full): the layer, or %NULL with an error
 *
 * Since: 0.1
 */
GmlpGroupedLinear *
gmlp_grouped_linear_new (GmlpDevice  *device,
                         guint        n_groups,
                         gint64       in_features,
                         gint64       out_features,
                         GError     **error)
{
  return gmlp_grouped_linear_new_full (device, n_groups, in_features, out_features,
                                       GMLP_DTYPE_FLOAT32, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT,
                                       error);
}

/**
 * gmlp_grouped_linear_new_full:
 * @device: the device
 * @n_groups: the number of groups (experts)
 * @in_features: columns of the input
 * @out_features: columns of the output
 * @dtype: FLOAT32, FLOAT16 or BFLOAT16
 * @flags: the options
 * @error: return location for a #GError
 *
 * Creates a layer with every construct property given.
 *
 * Returns: (transfer full): the layer, or %NULL with
 *   %GMLP_ERROR_INVALID_ARGUMENT for bad sizes or %GMLP_ERROR_UNSUPPORTED for
 *   another dtype
 *
 * Since: 0.1
 */
GmlpGroupedLinear *
gmlp_grouped_linear_new_full (GmlpDevice       *device,
                              guint             n_groups,
                              gint64            in_features,
                              gint64            out_features,
                              GmlpDType         dtype,
                              GmlpLinearFlags   flags,
                              GError          **error)
{
  g_return_val_if_fail (GMLP_IS_DEVICE (device), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (in_features > G_MAXINT32 || out_features > G_MAXINT32 || in_features < 0 || out_features < 0)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "GroupedLinear features must be between 1 and %d", G_MAXINT32);
      return NULL;
    }
  if (gmlp_dtype_get_size (dtype) == 0)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT, "Invalid dtype %d", (int) dtype);
      return NULL;
    }

  return g_initable_new (GMLP_TYPE_GROUPED_LINEAR, NULL, error,
                         "device", device,
                         "n-groups", n_groups,
                         "in-features", in_features,
                         "out-features", out_features,
                         "dtype", dtype,
                         "bias", (flags & GMLP_LINEAR_BIAS) != 0,
                         "single-grouped-weight", (flags & GMLP_LINEAR_SINGLE_GROUPED_WEIGHT) != 0,
                         "fuse-wgrad-accumulation", (flags & GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION) != 0,
                         "delay-wgrad-compute", (flags & GMLP_LINEAR_DELAY_WGRAD_COMPUTE) != 0,
                         NULL);
}

/**
 * gmlp_grouped_linear_get_pending_wgrads:
 * @self: a #GmlpGroupedLinear
 *
 * Gets how many weight-gradient computations were delayed and wait for
 * [method@Gmlp.GroupedLinear.backward_dw].
 *
 * Returns: the value of [property@Gmlp.GroupedLinear:pending-wgrads]
 *
 * Since: 0.1
 */
guint
gmlp_grouped_linear_get_pending_wgrads (GmlpGroupedLinear *self)
{
  guint length;

  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), 0);

  gmlp_rec_mutex_lock (&self->grad_lock);
  length = self->pending.length;
  gmlp_rec_mutex_unlock (&self->grad_lock);
  return length;
}

/**
 * gmlp_grouped_linear_get_device:
 * @self: a #GmlpGroupedLinear
 *
 * Gets the device the layer's weights live on and its work runs on.
 *
 * Returns: (transfer none): the layer's device
 *
 * Since: 0.1
 */
GmlpDevice *
gmlp_grouped_linear_get_device (GmlpGroupedLinear *self)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), NULL);
  return self->device;
}

/**
 * gmlp_grouped_linear_get_n_groups:
 * @self: a #GmlpGroupedLinear
 *
 * Gets the number of groups (experts) of the layer.
 *
 * Returns: the number of groups
 *
 * Since: 0.1
 */
guint
gmlp_grouped_linear_get_n_groups (GmlpGroupedLinear *self)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), 0);
  return self->n_groups;
}

/**
 * gmlp_grouped_linear_get_in_features:
 * @self: a #GmlpGroupedLinear
 *
 * Gets the width of the layer's input rows.
 *
 * Returns: the number of input features
 *
 * Since: 0.1
 */
gint64
gmlp_grouped_linear_get_in_features (GmlpGroupedLinear *self)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), 0);
  return self->in_features;
}

/**
 * gmlp_grouped_linear_get_out_features:
 * @self: a #GmlpGroupedLinear
 *
 * Gets the width of the layer's output rows.
 *
 * Returns: the number of output features
 *
 * Since: 0.1
 */
gint64
gmlp_grouped_linear_get_out_features (GmlpGroupedLinear *self)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), 0);
  return self->out_features;
}

/**
 * gmlp_grouped_linear_get_dtype:
 * @self: a #GmlpGroupedLinear
 *
 * Gets the element type of the layer's weights, inputs and outputs.
 *
 * Returns: the layer's dtype
 *
 * Since: 0.1
 */
GmlpDType
gmlp_grouped_linear_get_dtype (GmlpGroupedLinear *self)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), GMLP_DTYPE_FLOAT32);
  return self->dtype;
}

/**
 * gmlp_grouped_linear_get_flags:
 * @self: a #GmlpGroupedLinear
 *
 * Gets the options the layer was made with.
 *
 * Returns: the options, as flags
 *
 * Since: 0.1
 */
GmlpLinearFlags
gmlp_grouped_linear_get_flags (GmlpGroupedLinear *self)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), GMLP_LINEAR_NONE);
  return self->flags;
}

/**
 * gmlp_grouped_linear_get_grad_added_to_main_grad:
 * @self: a #GmlpGroupedLinear
 *
 * Tells whether the last weight-gradient computation added into main_grad
 * rather than writing the wgrad tensors.
 *
 * Returns: the value of [property@Gmlp.GroupedLinear:grad-added-to-main-grad]
 *
 * Since: 0.1
 */
gboolean
gmlp_grouped_linear_get_grad_added_to_main_grad (GmlpGroupedLinear *self)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), FALSE);
  return self->grad_added_to_main_grad;
}

/**
 * gmlp_grouped_linear_set_quantizers:
 * @self: a #GmlpGroupedLinear
 * @input: (nullable): the quantizer of the input, of role
 *   %GMLP_QUANTIZER_ROLE_INPUT
 * @weight: (nullable): the quantizer of the weights, of role
 *   %GMLP_QUANTIZER_ROLE_WEIGHT
 * @grad_output: (nullable): the quantizer of the output gradient, of role
 *   %GMLP_QUANTIZER_ROLE_GRAD_OUTPUT
 * @error: return location for a #GError
 *
 * Makes the layer's products FP8 (all three quantizers), or takes FP8 away
 * (all %NULL). The quantizers must be on the layer's device and have the
 * roles above. The products combine operands of one recipe, or of the two
 * per-tensor recipes (%GMLP_SCALING_RECIPE_DELAYED and
 * %GMLP_SCALING_RECIPE_CURRENT); with those, the features must be
 * multiples of 16 and no product may multiply E5M2 by E5M2 (the
 * %GMLP_FP8_FORMAT_E5M2 format). docs/fp8.md has the rules and the
 * accuracy of each recipe.
 *
 * The layer asks its quantizers for the columnwise copies its backward
 * needs, whatever their [property@Gmlp.Quantizer:columnwise] says. The
 * caller updates delayed-scaling quantizers: see
 * [method@Gmlp.GroupedLinear.update_quantizers]. Activations saved by
 * earlier forwards keep what they were made with: a backward is FP8 when
 * its forward was.
 *
 * Returns: %TRUE on success; %FALSE with %GMLP_ERROR_INVALID_ARGUMENT for
 *   one or two quantizers, another device or a wrong role, or
 *   %GMLP_ERROR_UNSUPPORTED for recipes that no product can combine, or
 *   features or formats the FP8 products do not take (the layer is
 *   unchanged then)
 *
 * Since: 0.1
 */
gboolean
gmlp_grouped_linear_set_quantizers (GmlpGroupedLinear  *self,
                                    GmlpQuantizer      *input,
                                    GmlpQuantizer      *weight,
                                    GmlpQuantizer      *grad_output,
                                    GError            **error)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), FALSE);
  g_return_val_if_fail (input == NULL || GMLP_IS_QUANTIZER (input), FALSE);
  g_return_val_if_fail (weight == NULL || GMLP_IS_QUANTIZER (weight), FALSE);
  g_return_val_if_fail (grad_output == NULL || GMLP_IS_QUANTIZER (grad_output), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_check_constructed (self, self->construct_error, error))
    return FALSE;

  if (!gmlp_linear_fp8_check_quantizers (self, input, weight, grad_output, error))
    return FALSE;

  g_object_freeze_notify (G_OBJECT (self));
  if (g_set_object (&self->input_quantizer, input))
    gmlp_grouped_linear_notify (self, PROP_INPUT_QUANTIZER);
  if (g_set_object (&self->weight_quantizer, weight))
    {
      gmlp_grouped_linear_invalidate_fp8_weights (self);
      gmlp_grouped_linear_notify (self, PROP_WEIGHT_QUANTIZER);
    }
  if (g_set_object (&self->grad_output_quantizer, grad_output))
    gmlp_grouped_linear_notify (self, PROP_GRAD_OUTPUT_QUANTIZER);
  g_object_thaw_notify (G_OBJECT (self));
  return TRUE;
}

gboolean
gmlp_grouped_linear_check_quantizers (GmlpGroupedLinear  *self,
                                      GmlpQuantizer      *input,
                                      GmlpQuantizer      *weight,
                                      GmlpQuantizer      *grad_output,
                                      GError            **error)
{
  return gmlp_check_constructed (self, self->construct_error, error) &&
         gmlp_linear_fp8_check_quantizers (self, input, weight, grad_output, error);
}

/**
 * gmlp_grouped_linear_get_quantizer:
 * @self: a #GmlpGroupedLinear
 * @role: which quantizer
 *
 * Gets the FP8 quantizer the layer uses for one of its operands.
 *
 * Returns: (transfer none) (nullable): the quantizer of @role, or %NULL for
 *   a layer without FP8 or an unknown @role
 *
 * Since: 0.1
 */
GmlpQuantizer *
gmlp_grouped_linear_get_quantizer (GmlpGroupedLinear *self,
                                   GmlpQuantizerRole  role)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), NULL);

  switch (role)
    {
    case GMLP_QUANTIZER_ROLE_INPUT:
      return self->input_quantizer;
    case GMLP_QUANTIZER_ROLE_WEIGHT:
      return self->weight_quantizer;
    case GMLP_QUANTIZER_ROLE_GRAD_OUTPUT:
      return self->grad_output_quantizer;
    default:
      return NULL;
    }
}

/**
 * gmlp_grouped_linear_update_quantizers:
 * @self: a #GmlpGroupedLinear
 * @error: return location for a #GError
 *
 * Ends a training step for the layer's quantizers: calls
 * [method@Gmlp.Quantizer.update] on each (once on a quantizer shared by
 * several roles or layers per call). Delayed scaling needs it once a step,
 * after the step's last backward and backward_dw, so that the next step
 * quantizes with scales from the amaxes seen so far; the other recipes have
 * nothing to update. The layer never calls it itself: it cannot tell where
 * a step ends (microbatches, gradient accumulation, delayed weight
 * gradients). Stream-ordered; nothing waits. Only a device error can make
 * it fail, after the quantizers before the failing one were updated.
 *
 * Returns: %TRUE on success (also for a layer without quantizers)
 *
 * Since: 0.1
 */
gboolean
gmlp_grouped_linear_update_quantizers (GmlpGroupedLinear  *self,
                                       GError            **error)
{
  GmlpQuantizer *quantizers[3];
  guint i, j;

  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_check_constructed (self, self->construct_error, error))
    return FALSE;

  quantizers[0] = self->input_quantizer;
  quantizers[1] = self->weight_quantizer;
  quantizers[2] = self->grad_output_quantizer;
  for (i = 0; i < 3; i++)
    {
      gboolean seen = FALSE;

      for (j = 0; j < i; j++)
        seen |= quantizers[j] == quantizers[i];
      if (quantizers[i] != NULL && !seen && !gmlp_quantizer_update (quantizers[i], error))
        return FALSE;
    }
  return TRUE;
}

/**
 * gmlp_grouped_linear_set_cache_fp8_weights:
 * @self: a #GmlpGroupedLinear
 * @cache: whether FP8 forwards reuse the quantized weights
 *
 * Sets [property@Gmlp.GroupedLinear:cache-fp8-weights].
 *
 * Since: 0.1
 */
void
gmlp_grouped_linear_set_cache_fp8_weights (GmlpGroupedLinear *self,
                                           gboolean           cache)
{
  g_return_if_fail (GMLP_IS_GROUPED_LINEAR (self));

  cache = !!cache;
  if (!cache)
    gmlp_grouped_linear_invalidate_fp8_weights (self);
  gmlp_mutex_lock (&self->fp8_lock);
  if (self->cache_fp8_weights == cache)
    {
      gmlp_mutex_unlock (&self->fp8_lock);
      return;
    }
  self->cache_fp8_weights = cache;
  gmlp_mutex_unlock (&self->fp8_lock);
  gmlp_grouped_linear_notify (self, PROP_CACHE_FP8_WEIGHTS);
}

/**
 * gmlp_grouped_linear_get_cache_fp8_weights:
 * @self: a #GmlpGroupedLinear
 *
 * Tells whether the layer keeps the FP8 copy of its weights between calls.
 *
 * Returns: the value of [property@Gmlp.GroupedLinear:cache-fp8-weights]
 *
 * Since: 0.1
 */
gboolean
gmlp_grouped_linear_get_cache_fp8_weights (GmlpGroupedLinear *self)
{
  gboolean cache;

  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), FALSE);

  gmlp_mutex_lock (&self->fp8_lock);
  cache = self->cache_fp8_weights;
  gmlp_mutex_unlock (&self->fp8_lock);
  return cache;
}
