/* gmlp-grouped-linear.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <math.h>
#include <string.h>

#include <gio/gio.h>

#include "gmlp-grouped-linear-private.h"
#include "gmlp-device-private.h"
#include "gmlp-enum-types.h"
#include "gmlp-error.h"
#include "gmlp-error-private.h"
#include "gmlp-grouped-tensor-private.h"
#include "gmlp-offload-context-private.h"
#include "gmlp-quantize-numeric.h"
#include "gmlp-quantizer-private.h"
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

/* The per-group face of a grouped tensor: cached member views. */
typedef struct {
  GmlpGroupedTensor  *grouped;
  GmlpGroupedTensor **members;
} Param;

struct _GmlpGroupedLinear
{
  GObject             parent_instance;

  GmlpDevice         *device;
  guint               n_groups;
  gint64              in_features;
  gint64              out_features;
  GmlpDType           dtype;
  GmlpLinearFlags     flags;
  guint64             id;

  Param               weight;
  Param               bias;
  Param               wgrad;       /* allocated at the first unfused weight-gradient computation */
  Param               bgrad;
  Param               main_grad;   /* FP32; members may be rebound to caller tensors */
  guint8             *accumulate;  /* per group, for the fused main_grad */

  /* Runs the weight-gradient computations (backward, backward_dw) one at
   * a time, and guards their state: wgrad and bgrad, made at the first,
   * pending, the two flags, main_grad's bindings and the mask.
   * Recursive, for a wgrad-ready handler that calls back in. */
  GRecMutex           grad_lock;
  GQueue              pending;     /* of PendingWgrad, oldest first */
  gboolean            wgrad_valid;
  gboolean            grad_added_to_main_grad;

  /* FP8 (the FP8 section at the end): all three, or none. */
  GmlpQuantizer      *input_quantizer;
  GmlpQuantizer      *weight_quantizer;
  GmlpQuantizer      *grad_output_quantizer;
  /* The quantized weights of the last forward, reused while
   * cache_fp8_weights is set and nothing has changed the weights. */
  gboolean            cache_fp8_weights;
  GmlpGroupedTensor  *weight_fp8;

  /* Why constructed() failed; every method reports it. */
  GError             *construct_error;
  GMutex              fp8_lock;    /* guards the two above */
};

/* What an FP8 weight-gradient computation would otherwise allocate while
 * it writes, made beforehand by fp8_wgrad_prepare(): dy in the layer's
 * dtype for the bias gradient when dy came quantized, and both operands
 * dequantized where the product cannot multiply FP8. */
typedef struct {
  GmlpGroupedTensor *bias_dy;
  GmlpGroupedTensor *dy;
  GmlpGroupedTensor *x;
} Fp8WgradOperands;

typedef struct {
  GmlpGroupedTensor *input;            /* FP8: quantized */
  GmlpGroupedTensor *grad_output;      /* FP8: NULL when given quantized */
  GmlpGroupedTensor *grad_output_fp8;  /* FP8: quantized; else NULL */
  Fp8WgradOperands   fp8_operands;
  GArray            *versions;         /* GmlpVersionRecord of the input and dy */
} PendingWgrad;

static void gmlp_grouped_linear_initable_iface_init (GInitableIface *iface);

G_DEFINE_FINAL_TYPE_WITH_CODE (GmlpGroupedLinear, gmlp_grouped_linear, G_TYPE_OBJECT,
                               G_IMPLEMENT_INTERFACE (G_TYPE_INITABLE,
                                                      gmlp_grouped_linear_initable_iface_init))

enum {
  PROP_0,
  PROP_DEVICE,
  PROP_N_GROUPS,
  PROP_IN_FEATURES,
  PROP_OUT_FEATURES,
  PROP_DTYPE,
  PROP_BIAS,
  PROP_SINGLE_GROUPED_WEIGHT,
  PROP_FUSE_WGRAD_ACCUMULATION,
  PROP_DELAY_WGRAD_COMPUTE,
  PROP_GRAD_ADDED_TO_MAIN_GRAD,
  PROP_PENDING_WGRADS,
  PROP_INPUT_QUANTIZER,
  PROP_WEIGHT_QUANTIZER,
  PROP_GRAD_OUTPUT_QUANTIZER,
  PROP_CACHE_FP8_WEIGHTS,
  N_PROPS
};

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

/* FP8 (the FP8 section at the end of the file). */
static gboolean           fp8_check_quantizers (GmlpGroupedLinear     *self,
                                                GmlpQuantizer         *input,
                                                GmlpQuantizer         *weight,
                                                GmlpQuantizer         *grad_output,
                                                GError               **error);
static GmlpGroupedTensor *fp8_forward          (GmlpGroupedLinear     *self,
                                                GmlpGroupedTensor     *input,
                                                gboolean               save_input,
                                                GmlpSavedActivations **saved,
                                                GError               **error);
static gboolean           fp8_dgrad            (GmlpGroupedLinear     *self,
                                                GmlpLinearBackward    *step,
                                                GError               **error);
static gboolean           fp8_check_activation (GmlpGroupedLinear     *self,
                                                GmlpGroupedTensor     *tensor,
                                                gint64                 cols,
                                                const char            *what,
                                                GmlpQuantizer         *quantizer,
                                                const char            *product,
                                                GmlpGroupedTensor     *partner,
                                                GmlpQuantizer         *partner_quantizer,
                                                GError               **error);
static GmlpDType          fp8_fallback_dtype   (GmlpGroupedLinear     *self);

static void
param_clear (Param *param,
             guint  n_groups)
{
  guint g;

  if (param->members != NULL)
    for (g = 0; g < n_groups; g++)
      g_clear_object (&param->members[g]);
  g_clear_pointer (&param->members, g_free);
  g_clear_object (&param->grouped);
}

/* Sets the grouped tensor and makes its member views. */
static gboolean
param_set (Param              *param,
           GmlpGroupedTensor  *grouped,
           guint               n_groups,
           GError            **error)
{
  g_autofree GmlpGroupedTensor **members = g_new0 (GmlpGroupedTensor *, n_groups);
  guint g;

  for (g = 0; g < n_groups; g++)
    {
      members[g] = gmlp_grouped_tensor_get_member (grouped, g, error);
      if (members[g] == NULL)
        {
          while (g-- > 0)
            g_object_unref (members[g]);
          return FALSE;
        }
    }

  param_clear (param, n_groups);
  param->grouped = g_object_ref (grouped);
  param->members = g_steal_pointer (&members);
  return TRUE;
}

static gboolean
has_flag (GmlpGroupedLinear *self,
          GmlpLinearFlags    flag)
{
  return (self->flags & flag) != 0;
}

static void
fp8_wgrad_operands_clear (Fp8WgradOperands *operands)
{
  g_clear_object (&operands->bias_dy);
  g_clear_object (&operands->dy);
  g_clear_object (&operands->x);
}

static void
pending_wgrad_free (gpointer data)
{
  PendingWgrad *pending = data;

  fp8_wgrad_operands_clear (&pending->fp8_operands);
  /* backward_dw may run on another thread than the backward that queued
   * these, which may hold them still. */
  gmlp_object_unref_shared (pending->input);
  g_clear_pointer (&pending->grad_output, gmlp_object_unref_shared);
  g_clear_pointer (&pending->grad_output_fp8, gmlp_object_unref_shared);
  g_array_unref (pending->versions);
  g_free (pending);
}

static void
gmlp_grouped_linear_finalize (GObject *object)
{
  GmlpGroupedLinear *self = (GmlpGroupedLinear *) object;

  param_clear (&self->weight, self->n_groups);
  param_clear (&self->bias, self->n_groups);
  param_clear (&self->wgrad, self->n_groups);
  param_clear (&self->bgrad, self->n_groups);
  param_clear (&self->main_grad, self->n_groups);
  g_queue_clear_full (&self->pending, pending_wgrad_free);
  g_clear_pointer (&self->accumulate, g_free);
  g_clear_object (&self->input_quantizer);
  g_clear_object (&self->weight_quantizer);
  g_clear_object (&self->grad_output_quantizer);
  g_clear_object (&self->weight_fp8);
  g_clear_object (&self->device);
  g_clear_error (&self->construct_error);
  g_rec_mutex_clear (&self->grad_lock);
  g_mutex_clear (&self->fp8_lock);

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
}

static GmlpGroupedTensor *
new_uniform (GmlpGroupedLinear  *self,
             GmlpDType           dtype,
             gint64              rows,
             gint64              cols,
             GError            **error)
{
  return gmlp_grouped_tensor_new_uniform (self->device, dtype, self->n_groups, rows, cols, error);
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
  if (!fp8_check_quantizers (self, self->input_quantizer, self->weight_quantizer,
                             self->grad_output_quantizer, error))
    return FALSE;

  self->id = gmlp_layer_id_next ();
  self->accumulate = g_malloc (self->n_groups);
  memset (self->accumulate, 1, self->n_groups);

  weight = new_uniform (self, self->dtype, self->out_features, self->in_features, error);
  if (weight == NULL || !param_set (&self->weight, weight, self->n_groups, error))
    return FALSE;

  if (has_flag (self, GMLP_LINEAR_BIAS))
    {
      bias = new_uniform (self, self->dtype, 1, self->out_features, error);
      if (bias == NULL || !param_set (&self->bias, bias, self->n_groups, error))
        return FALSE;
    }

  if (has_flag (self, GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION))
    {
      main_grad = new_uniform (self, GMLP_DTYPE_FLOAT32, self->out_features, self->in_features, error);
      if (main_grad == NULL ||
          !gmlp_grouped_tensor_fill_zero (main_grad, error) ||
          !param_set (&self->main_grad, main_grad, self->n_groups, error))
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
 * gmlp_grouped_linear_init_parameters:
 * @self: a #GmlpGroupedLinear
 * @seed: the seed
 * @error: return location for a #GError
 *
 * Draws the weights and biases uniformly from ±1/√in_features (the default
 * of common frameworks' linear layers), reproducibly from @seed on every
 * backend.
 *
 * Returns: %TRUE on success
 *
 * Since: 0.1
 */
gboolean
gmlp_grouped_linear_init_parameters (GmlpGroupedLinear  *self,
                                     guint64             seed,
                                     GError            **error)
{
  double bound;

  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_check_constructed (self, self->construct_error, error))
    return FALSE;

  bound = 1.0 / sqrt ((double) self->in_features);
  gmlp_grouped_linear_invalidate_fp8_weights (self);
  if (!gmlp_grouped_tensor_fill_random (self->weight.grouped, seed, bound, error))
    return FALSE;
  if (self->bias.grouped != NULL &&
      !gmlp_grouped_tensor_fill_random (self->bias.grouped, seed ^ G_GUINT64_CONSTANT (0x5bd1e995),
                                        bound, error))
    return FALSE;
  return TRUE;
}

/* Uploads @bytes (all groups packed) into @target. */
static gboolean
set_from_bytes (GmlpGroupedLinear  *self,
                GmlpGroupedTensor  *target,
                GBytes             *bytes,
                const char         *what,
                GError            **error)
{
  g_autoptr(GmlpGroupedTensor) staged = NULL;
  gint64 rows = gmlp_grouped_tensor_get_rows (target, 0);
  gint64 cols = gmlp_grouped_tensor_get_cols (target);
  gsize expected = (gsize) self->n_groups * rows * cols * gmlp_dtype_get_size (self->dtype);

  if (g_bytes_get_size (bytes) != expected)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "%s needs %" G_GSIZE_FORMAT " bytes (%u × %" G_GINT64_FORMAT " × %"
                   G_GINT64_FORMAT " %s), not %" G_GSIZE_FORMAT, what, expected, self->n_groups,
                   rows, cols, gmlp_dtype_get_name (self->dtype), g_bytes_get_size (bytes));
      return FALSE;
    }

  /* Same layout, so one device copy moves it into place (stream-ordered). */
  staged = gmlp_grouped_tensor_new_from_bytes (self->device, self->dtype,
                                               gmlp_grouped_tensor_peek_rows (target),
                                               self->n_groups, cols, bytes, error);
  if (staged == NULL)
    return FALSE;
  gmlp_grouped_tensor_bump_version (target);
  return GMLP_DEVICE_CALL (self->device, copy, gmlp_grouped_tensor_get_data (target),
                           gmlp_grouped_tensor_get_data (staged),
                           gmlp_grouped_tensor_get_nbytes (target), error);
}

/**
 * gmlp_grouped_linear_set_weight_from_bytes:
 * @self: a #GmlpGroupedLinear
 * @bytes: `n_groups × out_features × in_features` values of the layer's
 *   dtype, group after group, row-major
 * @error: return location for a #GError
 *
 * Replaces the weights.
 *
 * Returns: %TRUE on success; %FALSE with %GMLP_ERROR_INVALID_ARGUMENT if the
 *   length of @bytes is wrong (the weights are then unchanged)
 *
 * Since: 0.1
 */
gboolean
gmlp_grouped_linear_set_weight_from_bytes (GmlpGroupedLinear  *self,
                                           GBytes             *bytes,
                                           GError            **error)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), FALSE);
  g_return_val_if_fail (bytes != NULL, FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_check_constructed (self, self->construct_error, error))
    return FALSE;

  if (!set_from_bytes (self, self->weight.grouped, bytes, "The weight", error))
    return FALSE;
  gmlp_grouped_linear_invalidate_fp8_weights (self);
  return TRUE;
}

/**
 * gmlp_grouped_linear_set_bias_from_bytes:
 * @self: a #GmlpGroupedLinear
 * @bytes: `n_groups × out_features` values of the layer's dtype
 * @error: return location for a #GError
 *
 * Replaces the biases.
 *
 * Returns: %TRUE on success; %FALSE with %GMLP_ERROR_INVALID_STATE if the
 *   layer has no bias, or %GMLP_ERROR_INVALID_ARGUMENT for a wrong length
 *
 * Since: 0.1
 */
gboolean
gmlp_grouped_linear_set_bias_from_bytes (GmlpGroupedLinear  *self,
                                         GBytes             *bytes,
                                         GError            **error)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), FALSE);
  g_return_val_if_fail (bytes != NULL, FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_check_constructed (self, self->construct_error, error))
    return FALSE;

  if (self->bias.grouped == NULL)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE, "This GroupedLinear has no bias");
      return FALSE;
    }
  return set_from_bytes (self, self->bias.grouped, bytes, "The bias", error);
}

/**
 * gmlp_grouped_linear_set_wgrad_accumulation_mask:
 * @self: a #GmlpGroupedLinear
 * @accumulate: (array length=n_groups): per group, %TRUE to add the weight
 *   gradient into main_grad, %FALSE to overwrite main_grad with it
 * @n_groups: the number of groups of the layer
 * @error: return location for a #GError
 *
 * Chooses, per group, how fused accumulation treats main_grad. The mask
 * holds for every later weight-gradient computation, until changed; it starts
 * as all %TRUE. Without fused accumulation it has no effect.
 *
 * Returns: %TRUE on success; %FALSE with %GMLP_ERROR_INVALID_ARGUMENT if
 *   @n_groups is not the layer's
 *
 * Since: 0.1
 */
gboolean
gmlp_grouped_linear_set_wgrad_accumulation_mask (GmlpGroupedLinear  *self,
                                                 const gboolean     *accumulate,
                                                 guint               n_groups,
                                                 GError            **error)
{
  guint g;

  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), FALSE);
  g_return_val_if_fail (accumulate != NULL || n_groups == 0, FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_check_constructed (self, self->construct_error, error))
    return FALSE;

  if (n_groups != self->n_groups)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "The mask has %u entries; the layer has %u groups", n_groups, self->n_groups);
      return FALSE;
    }
  gmlp_rec_mutex_lock (&self->grad_lock);
  for (g = 0; g < n_groups; g++)
    self->accumulate[g] = accumulate[g] ? 1 : 0;
  gmlp_rec_mutex_unlock (&self->grad_lock);
  return TRUE;
}

static gboolean
check_main_grad (GmlpGroupedLinear  *self,
                 GmlpGroupedTensor  *main_grad,
                 guint               n_groups,
                 GmlpLinearFlags     single,
                 GError            **error)
{
  guint g;

  if (!has_flag (self, GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE,
                   "main_grad is only used with fuse-wgrad-accumulation");
      return FALSE;
    }
  if ((self->flags & GMLP_LINEAR_SINGLE_GROUPED_WEIGHT) != single)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE, single ?
                   "Per-group weights: bind main_grad with set_main_grad_member()" :
                   "Single grouped weight: bind main_grad with set_main_grad()");
      return FALSE;
    }
  if (gmlp_grouped_tensor_get_device (main_grad) != self->device)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "main_grad must be on the layer's device");
      return FALSE;
    }
  if (gmlp_grouped_tensor_get_dtype (main_grad) != GMLP_DTYPE_FLOAT32)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_DTYPE_MISMATCH,
                   "main_grad must be float32, not %s",
                   gmlp_dtype_get_name (gmlp_grouped_tensor_get_dtype (main_grad)));
      return FALSE;
    }
  if (gmlp_grouped_tensor_get_n_groups (main_grad) != n_groups ||
      !gmlp_grouped_tensor_has_host_sizes (main_grad) ||
      gmlp_grouped_tensor_get_cols (main_grad) != self->in_features)
    goto mismatch;
  for (g = 0; g < n_groups; g++)
    if (gmlp_grouped_tensor_get_rows (main_grad, g) != self->out_features)
      goto mismatch;
  return TRUE;

mismatch:
  g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
               "main_grad must have %u member(s) of %" G_GINT64_FORMAT " × %" G_GINT64_FORMAT,
               n_groups, self->out_features, self->in_features);
  return FALSE;
}

/* Backward adds into main_grad: it may not share a byte with what the layer
 * keeps (it would add dW into W), nor, per group, with another group's
 * main_grad (@index; G_MAXUINT for a grouped main_grad). */
static gboolean
check_main_grad_storage (GmlpGroupedLinear  *self,
                         GmlpGroupedTensor  *main_grad,
                         guint               index,
                         GError            **error)
{
  const struct { Param *param; const char *name; } kept[] = {
    { &self->weight, "weight" }, { &self->bias, "bias" },
    { &self->wgrad, "weight gradient" }, { &self->bgrad, "bias gradient" },
  };
  guint i, g;

  for (i = 0; i < G_N_ELEMENTS (kept); i++)
    if (kept[i].param->grouped != NULL && gmlp_grouped_tensor_overlaps (main_grad, kept[i].param->grouped))
      {
        g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                     "main_grad shares storage with the layer's %s: backward would add the "
                     "weight gradient into it", kept[i].name);
        return FALSE;
      }
  for (g = 0; index != G_MAXUINT && g < self->n_groups; g++)
    if (g != index && gmlp_grouped_tensor_overlaps (main_grad, self->main_grad.members[g]))
      {
        g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                     "This main_grad shares storage with the main_grad of group %u: the two "
                     "groups' weight gradients would be added into the same values", g);
        return FALSE;
      }
  return TRUE;
}

/* A weight-gradient computation writes wgrad (or main_grad) and bgrad
 * while it reads the input and the output gradient (@read, the records of
 * what it reads, and @also when not NULL): those may not share a byte. */
static gboolean
check_wgrad_outputs_unaliased (GmlpGroupedLinear  *self,
                               GArray             *read,
                               GmlpGroupedTensor  *also,
                               GError            **error)
{
  gboolean fused = has_flag (self, GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION);
  gboolean per_group = fused && !has_flag (self, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT);
  GmlpSpan also_span = { NULL, 0, 0 };
  guint i, n = per_group ? self->n_groups : 1;

  if (also != NULL)
    gmlp_grouped_tensor_get_span (also, &also_span);
  /* n outputs for dW (one per group for per-group main_grads), then db. */
  for (i = 0; i <= n; i++)
    {
      GmlpGroupedTensor *out;
      const GmlpVersionRecord *record;
      const char *what;
      GmlpSpan span;

      if (i == n)
        {
          out = self->bgrad.grouped;
          what = "The bias gradient";
        }
      else if (fused)
        {
          out = per_group ? self->main_grad.members[i] : self->main_grad.grouped;
          what = "main_grad";
        }
      else
        {
          out = self->wgrad.grouped;
          what = "The weight gradient";
        }
      if (out == NULL)
        continue;
      gmlp_grouped_tensor_get_span (out, &span);
      record = gmlp_version_records_find_overlap (read, &span);
      if (record != NULL || gmlp_spans_overlap (&span, &also_span))
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                       "%s shares storage with the %s, which the weight-gradient computation "
                       "reads while it writes %s", what,
                       record != NULL ? record->name : "output gradient",
                       i == n || !fused ? "it" : "main_grad");
          return FALSE;
        }
    }
  return TRUE;
}

/**
 * gmlp_grouped_linear_set_main_grad:
 * @self: a #GmlpGroupedLinear with fused accumulation and a single grouped
 *   weight
 * @main_grad: a float32 grouped tensor of `n_groups` members of
 *   `out_features × in_features` on the layer's device
 * @error: return location for a #GError
 *
 * Makes fused accumulation add into @main_grad (for example a slice of an
 * optimizer's flat gradient buffer) instead of the layer's own. It may not
 * share storage with the layer's weights, biases or their gradients; and a
 * backward refuses to add into a main_grad that shares storage with what it
 * reads (the forward's input, the output gradient).
 *
 * Returns: %TRUE on success; %FALSE with %GMLP_ERROR_INVALID_STATE when the
 *   layer does not fuse accumulation or has per-group weights,
 *   %GMLP_ERROR_INVALID_ARGUMENT for a @main_grad that shares storage with
 *   the layer's parameters or their gradients, or a shape or dtype error
 *
 * Since: 0.1
 */
gboolean
gmlp_grouped_linear_set_main_grad (GmlpGroupedLinear  *self,
                                   GmlpGroupedTensor  *main_grad,
                                   GError            **error)
{
  g_autoptr(GmlpRecMutexLocker) locker = NULL;

  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), FALSE);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (main_grad), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_check_constructed (self, self->construct_error, error) ||
      !gmlp_grouped_tensor_check_usable (main_grad, error))
    return FALSE;

  locker = gmlp_rec_mutex_locker_new (&self->grad_lock);
  if (!check_main_grad (self, main_grad, self->n_groups, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT, error) ||
      !check_main_grad_storage (self, main_grad, G_MAXUINT, error))
    return FALSE;
  return param_set (&self->main_grad, main_grad, self->n_groups, error);
}

/**
 * gmlp_grouped_linear_set_main_grad_member:
 * @self: a #GmlpGroupedLinear with fused accumulation and per-group weights
 * @index: the group
 * @main_grad: a one-member float32 tensor of `out_features × in_features` on
 *   the layer's device; it may be any allocation
 * @error: return location for a #GError
 *
 * Makes fused accumulation of group @index add into @main_grad, which may
 * not share storage with another group's main_grad either.
 *
 * Returns: %TRUE on success, or %FALSE with an error as for
 *   [method@Gmlp.GroupedLinear.set_main_grad], or
 *   %GMLP_ERROR_INVALID_ARGUMENT for an @index out of range or a
 *   @main_grad that shares storage with another group's
 *
 * Since: 0.1
 */
gboolean
gmlp_grouped_linear_set_main_grad_member (GmlpGroupedLinear  *self,
                                          guint               index,
                                          GmlpGroupedTensor  *main_grad,
                                          GError            **error)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), FALSE);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (main_grad), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_check_constructed (self, self->construct_error, error) ||
      !gmlp_grouped_tensor_check_usable (main_grad, error))
    return FALSE;

  if (!check_main_grad (self, main_grad, 1, 0, error))
    return FALSE;
  if (index >= self->n_groups)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "Group %u out of range: the layer has %u", index, self->n_groups);
      return FALSE;
    }
  if (!check_main_grad_storage (self, main_grad, index, error))
    return FALSE;

  gmlp_rec_mutex_lock (&self->grad_lock);
  g_set_object (&self->main_grad.members[index], main_grad);
  gmlp_rec_mutex_unlock (&self->grad_lock);
  return TRUE;
}

/* Checks an activation (input or grad_output) of the layer. */
static gboolean
check_activation (GmlpGroupedLinear  *self,
                  GmlpGroupedTensor  *tensor,
                  gint64              cols,
                  const char         *what,
                  GError            **error)
{
  if (gmlp_grouped_tensor_get_device (tensor) != self->device)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "%s is on %s, the layer on %s", what,
                   gmlp_device_get_name (gmlp_grouped_tensor_get_device (tensor)),
                   gmlp_device_get_name (self->device));
      return FALSE;
    }
  if (gmlp_grouped_tensor_get_dtype (tensor) != self->dtype)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_DTYPE_MISMATCH,
                   "%s is %s; the layer computes in %s", what,
                   gmlp_dtype_get_name (gmlp_grouped_tensor_get_dtype (tensor)),
                   gmlp_dtype_get_name (self->dtype));
      return FALSE;
    }
  if (gmlp_grouped_tensor_get_n_groups (tensor) != self->n_groups)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
                   "%s has %u groups; the layer has %u", what,
                   gmlp_grouped_tensor_get_n_groups (tensor), self->n_groups);
      return FALSE;
    }
  if (gmlp_grouped_tensor_get_cols (tensor) != cols)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
                   "%s has %" G_GINT64_FORMAT " columns; the layer needs %" G_GINT64_FORMAT,
                   what, gmlp_grouped_tensor_get_cols (tensor), cols);
      return FALSE;
    }
  return TRUE;
}

/* An enabled offload context of another device cannot take this layer's
 * activations, and offload cannot be captured in a graph (its copies go to
 * pinned host buffers that the host recycles): both said before anything
 * is written. */
static gboolean
check_offload_context (GmlpGroupedLinear  *self,
                       GError            **error)
{
  gboolean enabled;
  GmlpOffloadContext *context = gmlp_offload_context_peek_innermost (&enabled);

  if (context != NULL && enabled && gmlp_offload_context_get_device (context) != self->device)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "The innermost offload context is for %s, the layer is on %s",
                   gmlp_device_get_name (gmlp_offload_context_get_device (context)),
                   gmlp_device_get_name (self->device));
      return FALSE;
    }
  if (context != NULL && enabled && gmlp_device_is_capturing (self->device))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "Offloading saved activations cannot be captured in a graph: disable the "
                   "offload context (push_thread_default (FALSE)) around the captured step");
      return FALSE;
    }
  return TRUE;
}

/* Host array of the member pointers of a grouped tensor or of per-group
 * tensors. */
static gpointer *
member_pointers (GmlpGroupedTensor  *grouped,
                 GmlpGroupedTensor **members,
                 guint               n_groups)
{
  gpointer *ptrs = g_new (gpointer, n_groups);
  guint g;

  for (g = 0; g < n_groups; g++)
    ptrs[g] = members != NULL ? gmlp_grouped_tensor_get_member_data (members[g], 0)
                              : gmlp_grouped_tensor_get_member_data (grouped, g);
  return ptrs;
}

/* A new activation of @cols columns with the group sizes of @like: the
 * same host sizes, or, for device-only sizes, the same sizes tensor and row
 * capacity (so nothing on the host needs to read them). */
static GmlpGroupedTensor *
new_activation_like (GmlpGroupedLinear  *self,
                     GmlpGroupedTensor  *like,
                     gint64              cols,
                     GError            **error)
{
  GmlpGroupedTensor *sizes;

  if (gmlp_grouped_tensor_has_host_sizes (like))
    return gmlp_grouped_tensor_new (self->device, self->dtype, gmlp_grouped_tensor_peek_rows (like),
                                    self->n_groups, cols, error);

  sizes = gmlp_grouped_tensor_get_sizes (like, error);
  if (sizes == NULL)
    return NULL;
  return gmlp_grouped_tensor_new_with_device_sizes (self->device, self->dtype, sizes,
                                                    gmlp_grouped_tensor_get_row_capacity (like),
                                                    cols, error);
}

/* One grouped product of the layer (GmlpGemmKind: FPROP y = x Wᵀ [+ b],
 * DGRAD dx = dy W, WGRAD dW [+]= dyᵀ x). The operands grouped by rows are
 * tensors; the matrices of fixed shape are the members of a parameter.
 * With the sizes of sized_by on the host it is the backend's gemm (and
 * add_bias); with them only on the device, its gemm_device, which reads
 * them on the device only and fuses the bias. */
typedef struct {
  GmlpGemmKind        kind;
  GmlpGroupedTensor  *sized_by;    /* whose group sizes apply: the forward's input */
  GmlpGroupedTensor  *a;           /* x (FPROP) or dy */
  GmlpGroupedTensor  *b_rows;      /* WGRAD: x */
  GmlpGroupedTensor  *c_rows;      /* FPROP: y; DGRAD: dx */
  Param              *fixed;       /* FPROP, DGRAD: the weights; WGRAD: wgrad or main_grad */
  GmlpDType           c_dtype;
  gboolean            bias;        /* FPROP: add the layer's bias */
  const guint8       *accumulate;  /* WGRAD: per group, add into main_grad */
  /* FP8: a, b_rows and fixed (but for WGRAD) hold dequantized values in
   * fp8_fallback_dtype() rather than the layer's dtype. */
  gboolean            dequantized;
} Product;

static gboolean
run_product (GmlpGroupedLinear  *self,
             const Product      *product,
             GError            **error)
{
  gboolean wgrad = product->kind == GMLP_GEMM_WGRAD;
  GmlpGroupedTensor *second = wgrad ? product->b_rows : product->c_rows;
  const gint64 *rows = gmlp_grouped_tensor_peek_rows (product->sized_by);
  g_autofree gpointer *fixed = member_pointers (NULL, product->fixed->members, self->n_groups);
  g_autofree gpointer *bias = product->bias ? member_pointers (NULL, self->bias.members,
                                                               self->n_groups) : NULL;
  int ab_dtype = (int) (product->dequantized ? fp8_fallback_dtype (self) : self->dtype);
  GmlpBackendShape shape;

  if (rows != NULL)
    {
      g_autofree gpointer *pa = member_pointers (product->a, NULL, self->n_groups);
      g_autofree gpointer *psecond = member_pointers (second, NULL, self->n_groups);
      GmlpBackendGemm gemm = {
        .kind = product->kind,
        .n_groups = self->n_groups,
        .rows = rows,
        .n = self->out_features,
        .k = self->in_features,
        .ab_dtype = ab_dtype,
        .c_dtype = (int) product->c_dtype,
        .a = (const void * const *) pa,
        .b = (const void * const *) (wgrad ? psecond : fixed),
        .c = (void * const *) (wgrad ? fixed : psecond),
        .accumulate = product->accumulate,
      };

      if (!GMLP_DEVICE_CALL (self->device, gemm, &gemm, error))
        return FALSE;
      return bias == NULL ||
             GMLP_DEVICE_CALL (self->device, add_bias, self->n_groups, rows, self->out_features,
                               (int) product->c_dtype, (void * const *) psecond,
                               (const void * const *) bias, error);
    }

  if (!gmlp_grouped_tensor_get_backend_shape (product->sized_by, &shape, error))
    return FALSE;
  {
    GmlpBackendGemmDevice gemm = {
      .kind = product->kind,
      .n_groups = self->n_groups,
      .device_rows = shape.device_rows,
      .row_capacity = shape.row_capacity,
      .n = self->out_features,
      .k = self->in_features,
      .ab_dtype = ab_dtype,
      .c_dtype = (int) product->c_dtype,
      .a = gmlp_grouped_tensor_get_data (product->a),
      .b_rows = wgrad ? gmlp_grouped_tensor_get_data (second) : NULL,
      .c_rows = wgrad ? NULL : gmlp_grouped_tensor_get_data (second),
      .weight = wgrad ? NULL : (const void * const *) fixed,
      .wgrad = wgrad ? (void * const *) fixed : NULL,
      .bias = (const void * const *) bias,
      .accumulate = product->accumulate,
    };

    return GMLP_DEVICE_CALL (self->device, gemm_device, &gemm, error);
  }
}

/* db_i = Σ_rows dy_i into bgrad, over the group sizes of @sized_by. */
static gboolean
run_bias_grad (GmlpGroupedLinear  *self,
               GmlpGroupedTensor  *sized_by,
               GmlpGroupedTensor  *grad_output,
               GError            **error)
{
  g_autofree gpointer *pdb = member_pointers (NULL, self->bgrad.members, self->n_groups);
  const gint64 *rows = gmlp_grouped_tensor_peek_rows (sized_by);
  GmlpBackendShape shape;

  if (rows != NULL)
    {
      g_autofree gpointer *pa = member_pointers (grad_output, NULL, self->n_groups);

      return GMLP_DEVICE_CALL (self->device, bias_grad, self->n_groups, rows, self->out_features,
                               (int) self->dtype, (const void * const *) pa,
                               (void * const *) pdb, error);
    }

  if (!gmlp_grouped_tensor_get_backend_shape (sized_by, &shape, error))
    return FALSE;
  shape.cols = self->out_features;
  return GMLP_DEVICE_CALL (self->device, bias_grad_device, &shape, (int) self->dtype,
                           gmlp_grouped_tensor_get_data (grad_output), (void * const *) pdb,
                           error);
}

/**
 * gmlp_grouped_linear_forward:
 * @self: a #GmlpGroupedLinear
 * @input: `x`: `n_groups` members of `rows_i × in_features`, of the layer's
 *   dtype, on its device; group sizes on the host, or only on the device
 * @saved: (out) (transfer full) (optional): what backward needs; pass it to
 *   [method@Gmlp.GroupedLinear.backward]
 * @error: return location for a #GError
 *
 * Computes `y_i = x_i W_iᵀ (+ b_i)` for every group, enqueued on the
 * device's stream. Groups with no rows are valid and produce no rows.
 *
 * When @input has its group sizes only on the device (see
 * [ctor@Gmlp.GroupedTensor.new_with_device_sizes]), so does the output: it
 * shares @input's sizes tensor and row capacity, and the call neither reads
 * the sizes on the host nor waits for the device.
 *
 * A forward writes no tensor but its output. One that fails after an FP8
 * quantization (for want of memory, or a device error) leaves the amax it
 * recorded in a delayed-scaling quantizer; a retry records the same.
 *
 * Returns: (transfer full): the output, `rows_i × out_features` per group, or
 *   %NULL with %GMLP_ERROR_SHAPE_MISMATCH, %GMLP_ERROR_DTYPE_MISMATCH,
 *   %GMLP_ERROR_INVALID_ARGUMENT or %GMLP_ERROR_UNSUPPORTED (nothing is
 *   written then)
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_linear_forward (GmlpGroupedLinear     *self,
                             GmlpGroupedTensor     *input,
                             GmlpSavedActivations **saved,
                             GError               **error)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), NULL);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (input), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!gmlp_check_constructed (self, self->construct_error, error) ||
      !gmlp_grouped_tensor_check_usable (input, error))
    return NULL;

  return gmlp_grouped_linear_forward_full (self, input, TRUE, saved, error);
}

GmlpGroupedTensor *
gmlp_grouped_linear_forward_full (GmlpGroupedLinear     *self,
                                  GmlpGroupedTensor     *input,
                                  gboolean               save_input,
                                  GmlpSavedActivations **saved,
                                  GError               **error)
{
  g_autoptr(GmlpGroupedTensor) output = NULL;
  Product fprop = { .kind = GMLP_GEMM_FPROP, .sized_by = input, .a = input, .fixed = &self->weight,
                    .c_dtype = self->dtype, .bias = self->bias.grouped != NULL };

  if (saved != NULL)
    *saved = NULL;
  /* FP8: with quantizers, or for an input that is quantized already. */
  if (self->input_quantizer != NULL || gmlp_dtype_is_fp8 (gmlp_grouped_tensor_get_dtype (input)))
    return fp8_forward (self, input, save_input, saved, error);
  if (!check_activation (self, input, self->in_features, "The input", error) ||
      !check_offload_context (self, error))
    return NULL;

  output = new_activation_like (self, input, self->out_features, error);
  if (output == NULL)
    return NULL;
  fprop.c_rows = output;
  if (!run_product (self, &fprop, error))
    return NULL;

  if (saved != NULL)
    {
      g_autoptr(GmlpSavedActivations) new_saved = gmlp_saved_activations_new (self->id);

      if (save_input)
        gmlp_saved_activations_add (new_saved, "input", input);
      /* DGRAD reads the weights as they are at the backward. */
      gmlp_saved_activations_watch (new_saved, "weight", self->weight.grouped);
      if (!gmlp_saved_activations_apply_offload (new_saved, error))
        return NULL;
      *saved = g_steal_pointer (&new_saved);
    }

  return g_steal_pointer (&output);
}

/* Makes sure the outputs of a weight-gradient computation exist, before
 * anything is enqueued. The storage persists across computations. */
static gboolean
ensure_wgrad_storage (GmlpGroupedLinear  *self,
                      GError            **error)
{
  if (!has_flag (self, GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION) && self->wgrad.grouped == NULL)
    {
      g_autoptr(GmlpGroupedTensor) wgrad = new_uniform (self, self->dtype, self->out_features,
                                                        self->in_features, error);
      if (wgrad == NULL || !param_set (&self->wgrad, wgrad, self->n_groups, error))
        return FALSE;
      g_assert (gmlp_grouped_tensor_get_member_offset (wgrad, self->n_groups - 1) %
                GMLP_MEMBER_ALIGNMENT == 0);
    }
  if (self->bias.grouped != NULL && self->bgrad.grouped == NULL)
    {
      g_autoptr(GmlpGroupedTensor) bgrad = new_uniform (self, self->dtype, 1, self->out_features, error);
      if (bgrad == NULL || !param_set (&self->bgrad, bgrad, self->n_groups, error))
        return FALSE;
    }
  return TRUE;
}

static gboolean fp8_wgrad_prepare (GmlpGroupedLinear  *self,
                                   GmlpGroupedTensor  *input,
                                   GmlpGroupedTensor  *grad_output,
                                   GmlpGroupedTensor  *grad_output_fp8,
                                   Fp8WgradOperands   *operands,
                                   GError            **error);
static gboolean fp8_wgrad         (GmlpGroupedLinear  *self,
                                   const Product      *wgrad,
                                   GmlpGroupedTensor  *input,
                                   GmlpGroupedTensor  *grad_output,
                                   GmlpGroupedTensor  *grad_output_fp8,
                                   Fp8WgradOperands   *operands,
                                   GError            **error);

/* Counts the write of a weight-gradient computation in the versions of its
 * outputs: once per storage (per-group main_grads may be views of one). */
static void
bump_wgrad_versions (GmlpGroupedLinear *self)
{
  GmlpVersionCounter *last = NULL;
  guint g;

  if (!has_flag (self, GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION))
    gmlp_grouped_tensor_bump_version (self->wgrad.grouped);
  else if (has_flag (self, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT))
    gmlp_grouped_tensor_bump_version (self->main_grad.grouped);
  else
    for (g = 0; g < self->n_groups; g++)
      {
        GmlpVersionCounter *counter = gmlp_grouped_tensor_get_version_counter (self->main_grad.members[g]);

        if (counter != last)
          gmlp_grouped_tensor_bump_version (self->main_grad.members[g]);
        last = counter;
      }
  if (self->bgrad.grouped != NULL)
    gmlp_grouped_tensor_bump_version (self->bgrad.grouped);
}

/* One weight-gradient computation: dW = dyᵀ x (into wgrad or main_grad) and
 * db = Σ dy, then wgrad-ready. FP8 (grad_output_fp8 given): input is
 * quantized too, grad_output, the unquantized dy, may be NULL, and
 * @fp8_operands holds what fp8_wgrad_prepare() made (it makes what is
 * missing). What can fail for want of memory fails before the first write,
 * but for the dequantized operands of an FP8 product that the device
 * turns down at run time (no kernel for it there); after the first write only
 * the backend can fail, and the gradients are then unspecified. */
static gboolean
compute_wgrad (GmlpGroupedLinear  *self,
               GmlpGroupedTensor  *input,
               GmlpGroupedTensor  *grad_output,
               GmlpGroupedTensor  *grad_output_fp8,
               Fp8WgradOperands   *fp8_operands,
               GError            **error)
{
  gboolean fused = has_flag (self, GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION);
  Product wgrad = {
    .kind = GMLP_GEMM_WGRAD,
    .sized_by = input,
    .a = grad_output,
    .b_rows = input,
    .fixed = fused ? &self->main_grad : &self->wgrad,
    .c_dtype = fused ? GMLP_DTYPE_FLOAT32 : self->dtype,
    .accumulate = fused ? self->accumulate : NULL,
  };
  g_autoptr(GmlpEvent) event = NULL;

  if (grad_output_fp8 != NULL)
    {
      if (!fp8_wgrad (self, &wgrad, input, grad_output, grad_output_fp8, fp8_operands, error))
        return FALSE;
    }
  else
    {
      bump_wgrad_versions (self);
      if (!run_product (self, &wgrad, error) ||
          (self->bias.grouped != NULL && !run_bias_grad (self, input, grad_output, error)))
        return FALSE;
    }

  event = gmlp_event_new_recorded (self->device, error);
  if (event == NULL)
    return FALSE;

  self->wgrad_valid = !fused;
  if (self->grad_added_to_main_grad != fused)
    {
      self->grad_added_to_main_grad = fused;
      g_object_notify_by_pspec (G_OBJECT (self), properties[PROP_GRAD_ADDED_TO_MAIN_GRAD]);
    }
  g_signal_emit (self, signals[SIGNAL_WGRAD_READY], 0, event);
  return TRUE;
}

/* The output gradient must have the group sizes of the forward's input:
 * the same host sizes, or device-only sizes in a tensor of the same row
 * capacity (their values cannot be compared without waiting for the
 * device: that is the caller's promise). */
static gboolean
check_same_sizes (GmlpGroupedTensor  *input,
                  GmlpGroupedTensor  *grad_output,
                  GError            **error)
{
  gboolean input_on_host = gmlp_grouped_tensor_has_host_sizes (input);
  guint g;

  if (input_on_host != gmlp_grouped_tensor_has_host_sizes (grad_output))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "The output gradient has its group sizes %s, the forward input %s; "
                   "both must have them in the same place",
                   input_on_host ? "only on the device" : "on the host",
                   input_on_host ? "on the host" : "only on the device");
      return FALSE;
    }

  if (!input_on_host)
    {
      if (gmlp_grouped_tensor_get_row_capacity (input) !=
          gmlp_grouped_tensor_get_row_capacity (grad_output))
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
                       "The output gradient has a row capacity of %" G_GINT64_FORMAT
                       ", the forward input %" G_GINT64_FORMAT "; with device sizes they "
                       "must be the same", gmlp_grouped_tensor_get_row_capacity (grad_output),
                       gmlp_grouped_tensor_get_row_capacity (input));
          return FALSE;
        }
      return TRUE;
    }

  for (g = 0; g < gmlp_grouped_tensor_get_n_groups (input); g++)
    if (gmlp_grouped_tensor_get_rows (input, g) != gmlp_grouped_tensor_get_rows (grad_output, g))
      {
        g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
                     "The output gradient's group sizes differ from the forward input's");
        return FALSE;
      }
  return TRUE;
}

/**
 * gmlp_grouped_linear_backward:
 * @self: a #GmlpGroupedLinear
 * @saved: what the forward returned; consumed by this call
 * @grad_output: `dy`: the gradient of the forward's output, of its shape and
 *   the layer's dtype
 * @error: return location for a #GError
 *
 * Computes the input gradient `dx_i = dy_i W_i`, and the weight gradients as
 * the gradient contract of [class@Gmlp.GroupedLinear] says: now, or queued
 * for [method@Gmlp.GroupedLinear.backward_dw] when delayed. Enqueued on the
 * device's stream; no host synchronisation.
 *
 * If the forward's input had its group sizes only on the device, @grad_output
 * must too, with the same row capacity, and the input gradient shares the
 * input's sizes tensor. The values of the sizes cannot be compared on the
 * host without waiting for the device, so they are the caller's promise:
 * @grad_output's sizes must hold the forward's values, and the sizes tensor
 * of the forward's input must not change until this backward (and, with
 * [property@Gmlp.GroupedLinear:delay-wgrad-compute], its backward_dw) has
 * been enqueued. The products follow the forward input's sizes; different
 * values give wrong gradients, but nothing outside the tensors is touched.
 *
 * The forward's input and the weights must not have been written since the
 * forward (their versions, see [method@Gmlp.GroupedTensor.get_version]):
 * the gradients would not be those of the forward. That holds with or
 * without an [class@Gmlp.OffloadContext], although an offloaded input is
 * read from its copy.
 *
 * Everything is checked, and everything allocated, before anything is
 * written; a backward that fails leaves @saved unused, so it can be
 * retried. Only a device error while the weight gradients are written (a
 * CUDA launch that fails) leaves them unspecified.
 *
 * Returns: (transfer full): the input gradient, or %NULL with
 *   %GMLP_ERROR_INVALID_ARGUMENT for activations of another layer, an
 *   output gradient whose sizes are on the host when the input's were not
 *   (or the other way round) or a main_grad that shares storage with the
 *   input or the output gradient, %GMLP_ERROR_INVALID_STATE for activations
 *   already used or an input or weights written since the forward,
 *   %GMLP_ERROR_SHAPE_MISMATCH for other group sizes or another row
 *   capacity, or a dtype or device error (nothing is written then)
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_linear_backward (GmlpGroupedLinear     *self,
                              GmlpSavedActivations  *saved,
                              GmlpGroupedTensor     *grad_output,
                              GError               **error)
{
  g_autoptr(GmlpLinearBackward) step = NULL;
  g_autoptr(GmlpRecMutexLocker) locker = NULL;

  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), NULL);
  g_return_val_if_fail (GMLP_IS_SAVED_ACTIVATIONS (saved), NULL);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (grad_output), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!gmlp_check_constructed (self, self->construct_error, error) ||
      !gmlp_grouped_tensor_check_usable (grad_output, error))
    return NULL;

  /* One backward at a time: it writes the weight gradients, and it uses up
   * its saved activations (a second use is refused, not raced). */
  locker = gmlp_rec_mutex_locker_new (&self->grad_lock);
  step = gmlp_grouped_linear_backward_begin (self, saved, grad_output, "GroupedLinear", error);
  if (step == NULL || !gmlp_grouped_linear_backward_dgrad (self, step, error))
    return NULL;
  return gmlp_grouped_linear_backward_finish (self, step, error);
}

/* A backward in three phases (gmlp-grouped-linear-private.h), so that
 * nothing is written before everything is checked, for GroupedMLP across
 * both its layers: begin checks the saved activations, their versions and
 * the output gradient, reloads the input and allocates; dgrad writes only
 * tensors of its own making; finish writes the weight gradients (or queues
 * them) and consumes the saved activations. */
struct _GmlpLinearBackward
{
  GmlpSavedActivations *saved;
  GmlpGroupedTensor    *input;             /* as saved: x, or x8 for FP8 */
  GmlpGroupedTensor    *w8;                /* FP8: the forward's quantized weights */
  GmlpGroupedTensor    *grad_output;       /* dy, as given */
  GmlpGroupedTensor    *grad_output_fp8;   /* FP8: dy quantized (dgrad) */
  Fp8WgradOperands      fp8_operands;      /* FP8: made by dgrad */
  GmlpGroupedTensor    *grad_input;        /* dx: made by begin, written by dgrad */
};

void
gmlp_linear_backward_free (GmlpLinearBackward *step)
{
  g_clear_object (&step->saved);
  g_clear_object (&step->input);
  g_clear_object (&step->w8);
  g_clear_object (&step->grad_output);
  g_clear_object (&step->grad_output_fp8);
  fp8_wgrad_operands_clear (&step->fp8_operands);
  g_clear_object (&step->grad_input);
  g_free (step);
}

GmlpGroupedTensor *
gmlp_linear_backward_get_grad_input (GmlpLinearBackward *step)
{
  return step->grad_input;
}

GmlpLinearBackward *
gmlp_grouped_linear_backward_begin (GmlpGroupedLinear     *self,
                                    GmlpSavedActivations  *saved,
                                    GmlpGroupedTensor     *grad_output,
                                    const char            *label,
                                    GError               **error)
{
  g_autoptr(GmlpLinearBackward) step = NULL;
  g_autoptr(GmlpGroupedTensor) grad_input = NULL;
  GmlpGroupedTensor *input, *w8 = NULL;

  if (!gmlp_saved_activations_check (saved, self->id, "GroupedLinear", error) ||
      !gmlp_saved_activations_check_versions (saved, label, error))
    return NULL;
  /* FP8: whatever the layer's quantizers are now, the forward was. Its
   * quantized weights stay on the device: getting them reloads nothing. */
  if (gmlp_saved_activations_contains (saved, "weight-fp8"))
    {
      w8 = gmlp_saved_activations_get (saved, "weight-fp8", error);
      if (w8 == NULL ||
          !fp8_check_activation (self, grad_output, self->out_features, "The output gradient",
                                 self->grad_output_quantizer, "DGRAD", w8, NULL, error))
        return NULL;
    }
  else if (!check_activation (self, grad_output, self->out_features, "The output gradient", error))
    {
      return NULL;
    }

  input = gmlp_saved_activations_get (saved, "input", error);
  if (input == NULL)
    return NULL;
  if (gmlp_saved_activations_get_context (saved) != NULL)
    gmlp_offload_context_backward_started (gmlp_saved_activations_get_context (saved), saved);
  if ((w8 != NULL &&
       !fp8_check_activation (self, grad_output, self->out_features, "The output gradient",
                              self->grad_output_quantizer, "WGRAD", input, NULL, error)) ||
      !check_same_sizes (input, grad_output, error))
    return NULL;
  /* A delayed weight gradient checks its outputs in its backward_dw. */
  if (!has_flag (self, GMLP_LINEAR_DELAY_WGRAD_COMPUTE) &&
      !check_wgrad_outputs_unaliased (self, gmlp_saved_activations_get_versions (saved), grad_output, error))
    return NULL;

  grad_input = new_activation_like (self, input, self->in_features, error);
  if (grad_input == NULL || !ensure_wgrad_storage (self, error))
    return NULL;

  step = g_new0 (GmlpLinearBackward, 1);
  step->saved = g_object_ref (saved);
  step->input = g_object_ref (input);
  step->w8 = w8 != NULL ? g_object_ref (w8) : NULL;
  step->grad_output = g_object_ref (grad_output);
  step->grad_input = g_steal_pointer (&grad_input);
  return g_steal_pointer (&step);
}

gboolean
gmlp_grouped_linear_backward_dgrad (GmlpGroupedLinear   *self,
                                    GmlpLinearBackward  *step,
                                    GError             **error)
{
  Product dgrad = {
    .kind = GMLP_GEMM_DGRAD,
    .sized_by = step->input,
    .a = step->grad_output,
    .c_rows = step->grad_input,
    .fixed = &self->weight,
    .c_dtype = self->dtype,
  };

  if (step->w8 != NULL)
    return fp8_dgrad (self, step, error);
  return run_product (self, &dgrad, error);
}

GmlpGroupedTensor *
gmlp_grouped_linear_backward_finish (GmlpGroupedLinear   *self,
                                     GmlpLinearBackward  *step,
                                     GError             **error)
{
  GmlpGroupedTensor *unquantized = step->grad_output;

  if (gmlp_dtype_is_fp8 (gmlp_grouped_tensor_get_dtype (step->grad_output)))
    unquantized = NULL;
  if (has_flag (self, GMLP_LINEAR_DELAY_WGRAD_COMPUTE))
    {
      PendingWgrad *pending = g_new (PendingWgrad, 1);

      pending->input = g_object_ref (step->input);
      pending->grad_output = unquantized != NULL ? g_object_ref (unquantized) : NULL;
      pending->grad_output_fp8 = step->grad_output_fp8 != NULL ? g_object_ref (step->grad_output_fp8) : NULL;
      pending->fp8_operands = (Fp8WgradOperands) { NULL, NULL, NULL };
      /* The weight gradient reads the input (as the forward saw it) and dy. */
      pending->versions = gmlp_version_records_new ();
      gmlp_saved_activations_copy_versions (step->saved, "input", pending->versions);
      gmlp_version_records_add (pending->versions, "output gradient", "backward", step->grad_output);
      g_queue_push_tail (&self->pending, pending);
      g_object_notify_by_pspec (G_OBJECT (self), properties[PROP_PENDING_WGRADS]);
    }
  else if (!compute_wgrad (self, step->input, unquantized, step->grad_output_fp8,
                           &step->fp8_operands, error))
    {
      return NULL;
    }

  gmlp_saved_activations_consume (step->saved);
  return g_object_ref (step->grad_input);
}

gboolean
gmlp_grouped_linear_backward_dw_prepare (GmlpGroupedLinear  *self,
                                         const char         *label,
                                         GError            **error)
{
  PendingWgrad *pending;

  if (!has_flag (self, GMLP_LINEAR_DELAY_WGRAD_COMPUTE))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE,
                   "%s: backward_dw() needs delay-wgrad-compute: backward() computed the weight "
                   "gradients", label);
      return FALSE;
    }
  if (g_queue_is_empty (&self->pending))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE,
                   "%s: no backward is waiting for its weight gradients", label);
      return FALSE;
    }
  pending = g_queue_peek_head (&self->pending);
  return gmlp_version_records_check (pending->versions, label, error) &&
         check_wgrad_outputs_unaliased (self, pending->versions, NULL, error) &&
         ensure_wgrad_storage (self, error) &&
         (pending->grad_output_fp8 == NULL ||
          fp8_wgrad_prepare (self, pending->input, pending->grad_output, pending->grad_output_fp8,
                             &pending->fp8_operands, error));
}

/**
 * gmlp_grouped_linear_backward_dw:
 * @self: a #GmlpGroupedLinear with delayed weight gradients
 * @error: return location for a #GError
 *
 * Computes the weight gradients of the oldest backward still waiting for
 * them, as the gradient contract says, and emits
 * [signal@Gmlp.GroupedLinear::wgrad-ready].
 *
 * The input of that backward's forward and its output gradient must not
 * have been written since (see [method@Gmlp.GroupedTensor.get_version]);
 * the weights may have been: the weight gradients do not read them. A call
 * that fails leaves the computation pending and the gradients as they were,
 * but for a device error while they are written.
 *
 * Returns: %TRUE on success; %FALSE with %GMLP_ERROR_INVALID_STATE when the
 *   layer does not delay weight gradients, none is pending, or the input or
 *   the output gradient was written since, or
 *   %GMLP_ERROR_INVALID_ARGUMENT when main_grad shares storage with them
 *
 * Since: 0.1
 */
gboolean
gmlp_grouped_linear_backward_dw (GmlpGroupedLinear  *self,
                                 GError            **error)
{
  g_autoptr(GmlpRecMutexLocker) locker = NULL;
  PendingWgrad *pending;

  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_check_constructed (self, self->construct_error, error))
    return FALSE;

  locker = gmlp_rec_mutex_locker_new (&self->grad_lock);
  if (!gmlp_grouped_linear_backward_dw_prepare (self, "GroupedLinear", error))
    return FALSE;

  pending = g_queue_peek_head (&self->pending);
  if (!compute_wgrad (self, pending->input, pending->grad_output, pending->grad_output_fp8,
                      &pending->fp8_operands, error))
    return FALSE;
  pending_wgrad_free (g_queue_pop_head (&self->pending));
  g_object_notify_by_pspec (G_OBJECT (self), properties[PROP_PENDING_WGRADS]);
  return TRUE;
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

/* The grouped face of a parameter, in single-grouped-weight mode only. */
static GmlpGroupedTensor *
grouped_face (GmlpGroupedLinear *self,
              Param             *param,
              gboolean           valid)
{
  if (!has_flag (self, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT) || !valid)
    return NULL;
  return param->grouped;
}

/* The per-group face, in per-group mode only. */
static GmlpGroupedTensor *
member_face (GmlpGroupedLinear *self,
             Param             *param,
             guint              index,
             gboolean           valid)
{
  if (index >= self->n_groups || has_flag (self, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT) || !valid ||
      param->members == NULL)
    return NULL;
  return param->members[index];
}

/**
 * gmlp_grouped_linear_get_weight:
 * @self: a #GmlpGroupedLinear
 *
 * Gets the layer's single grouped weight tensor, to fill or to read.
 *
 * Returns: (transfer none) (nullable): the weights, `n_groups` members of
 *   `out_features × in_features`; %NULL with per-group weights
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_linear_get_weight (GmlpGroupedLinear *self)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), NULL);
  return grouped_face (self, &self->weight, TRUE);
}

/**
 * gmlp_grouped_linear_get_bias:
 * @self: a #GmlpGroupedLinear
 *
 * Gets the layer's single grouped bias tensor.
 *
 * Returns: (transfer none) (nullable): the biases, `n_groups` members of
 *   `1 × out_features`; %NULL without bias or with per-group weights
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_linear_get_bias (GmlpGroupedLinear *self)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), NULL);
  return grouped_face (self, &self->bias, self->bias.grouped != NULL);
}

/**
 * gmlp_grouped_linear_get_wgrad:
 * @self: a #GmlpGroupedLinear
 *
 * Gets the weight gradients that the last weight-gradient computation wrote.
 *
 * Returns: (transfer none) (nullable): the weight gradients of the last
 *   weight-gradient computation; %NULL before the first one, with fused
 *   accumulation, or with per-group weights
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_linear_get_wgrad (GmlpGroupedLinear *self)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), NULL);
  return grouped_face (self, &self->wgrad, self->wgrad_valid);
}

/**
 * gmlp_grouped_linear_get_bgrad:
 * @self: a #GmlpGroupedLinear
 *
 * Gets the bias gradients that the last weight-gradient computation wrote.
 *
 * Returns: (transfer none) (nullable): the bias gradients of the last
 *   weight-gradient computation; %NULL without bias, before the first one,
 *   or with per-group weights
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_linear_get_bgrad (GmlpGroupedLinear *self)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), NULL);
  return grouped_face (self, &self->bgrad, self->bgrad.grouped != NULL &&
                       (self->wgrad_valid || self->grad_added_to_main_grad));
}

/**
 * gmlp_grouped_linear_get_main_grad:
 * @self: a #GmlpGroupedLinear
 *
 * Gets the FP32 tensor that weight gradients are accumulated into with
 * %GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION.
 *
 * Returns: (transfer none) (nullable): the FP32 gradient accumulators;
 *   %NULL without fused accumulation or with per-group weights
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_linear_get_main_grad (GmlpGroupedLinear *self)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), NULL);
  return grouped_face (self, &self->main_grad, self->main_grad.grouped != NULL);
}

/**
 * gmlp_grouped_linear_get_weight_member:
 * @self: a #GmlpGroupedLinear
 * @index: the group
 *
 * Gets the weight of one group of a layer made with per-group weights.
 *
 * Returns: (transfer none) (nullable): the weight of group @index, a view
 *   of `out_features × in_features`; %NULL with a single grouped weight
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_linear_get_weight_member (GmlpGroupedLinear *self,
                                       guint              index)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), NULL);
  return member_face (self, &self->weight, index, TRUE);
}

/**
 * gmlp_grouped_linear_get_bias_member:
 * @self: a #GmlpGroupedLinear
 * @index: the group
 *
 * Gets the bias of one group of a layer made with per-group weights.
 *
 * Returns: (transfer none) (nullable): the bias of group @index; %NULL
 *   without bias or with a single grouped weight
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_linear_get_bias_member (GmlpGroupedLinear *self,
                                     guint              index)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), NULL);
  return member_face (self, &self->bias, index, TRUE);
}

/**
 * gmlp_grouped_linear_get_wgrad_member:
 * @self: a #GmlpGroupedLinear
 * @index: the group
 *
 * Gets the weight gradient of one group of a layer made with per-group
 * weights.
 *
 * Returns: (transfer none) (nullable): the weight gradient of group @index
 *   from the last weight-gradient computation, a view into one packed
 *   allocation; %NULL before the first one, with fused accumulation, or
 *   with a single grouped weight
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_linear_get_wgrad_member (GmlpGroupedLinear *self,
                                      guint              index)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), NULL);
  return member_face (self, &self->wgrad, index, self->wgrad_valid);
}

/**
 * gmlp_grouped_linear_get_bgrad_member:
 * @self: a #GmlpGroupedLinear
 * @index: the group
 *
 * Gets the bias gradient of one group of a layer made with per-group weights.
 *
 * Returns: (transfer none) (nullable): the bias gradient of group @index;
 *   %NULL without bias, before the first weight-gradient computation, or
 *   with a single grouped weight
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_linear_get_bgrad_member (GmlpGroupedLinear *self,
                                      guint              index)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), NULL);
  return member_face (self, &self->bgrad, index,
                      self->wgrad_valid || self->grad_added_to_main_grad);
}

/**
 * gmlp_grouped_linear_get_main_grad_member:
 * @self: a #GmlpGroupedLinear
 * @index: the group
 *
 * Gets the FP32 gradient accumulator of one group of a layer made with
 * per-group weights.
 *
 * Returns: (transfer none) (nullable): the FP32 gradient accumulator of group
 *   @index (the layer's, or the one bound with
 *   [method@Gmlp.GroupedLinear.set_main_grad_member]); %NULL without fused
 *   accumulation or with a single grouped weight
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_linear_get_main_grad_member (GmlpGroupedLinear *self,
                                          guint              index)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), NULL);
  return member_face (self, &self->main_grad, index, TRUE);
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

/* ---- FP8 ------------------------------------------------------------------
 *
 * With quantizers, the three products take FP8 operands. Per-tensor recipes
 * (DELAYED, CURRENT) with host group sizes multiply FP8 on the backend's
 * gemm_fp8, whose operands are all K-major: FPROP x·Wᵀ reads x and W
 * rowwise, DGRAD dy·W reads dy rowwise and W's columnwise copy, WGRAD dyᵀ·x
 * the columnwise copies of dy and x; the quantizers write the copies in the
 * same pass when the backward will need them. With device-only group sizes
 * FPROP and DGRAD take gemm_device's FP8 products where the backend has them
 * (fp8_run_device(): CUDA on Hopper, the CPU), and so does WGRAD on the
 * columnwise copies (fp8_run_device_wgrad(): CUDA on Hopper). Blockwise
 * scales take the same products, each operand with its scale layout
 * (fp8_operand_scales(): CUDA on its Hopper kernel, the CPU); where a
 * backend refuses them (UNSUPPORTED: another GPU, the CPU's WGRAD of
 * device sizes, WGRAD groups whose rows the kernel cannot read) and for
 * MXFP8 and operands given without the copies, the layer dequantizes the
 * FP8 operands to fp8_fallback_dtype() and runs its usual products:
 * correct, not fast.
 *
 * The forward saves the quantized input ("input": offload moves every part
 * of it) and the quantized weights ("weight-fp8", resident on the device);
 * a backward is FP8 when its forward was, whatever the quantizers are by
 * then. */

static gboolean
fp8_per_tensor (GmlpScalingRecipe recipe)
{
  return recipe == GMLP_SCALING_RECIPE_DELAYED || recipe == GMLP_SCALING_RECIPE_CURRENT;
}

/* Whether one product can take operands of these recipes: the same one, or
 * two with one scale per group (the product only multiplies the two). */
static gboolean
fp8_recipes_combine (GmlpScalingRecipe a,
                     GmlpScalingRecipe b)
{
  return a == b || (fp8_per_tensor (a) && fp8_per_tensor (b));
}

static const char *
fp8_recipe_name (GmlpScalingRecipe recipe)
{
  g_autoptr(GEnumClass) klass = g_type_class_ref (GMLP_TYPE_SCALING_RECIPE);
  GEnumValue *value = g_enum_get_value (klass, recipe);

  /* Nicks are static strings of the registered type. */
  return value != NULL ? value->value_nick : "invalid";
}

static const char *
fp8_role_name (GmlpQuantizerRole role)
{
  g_autoptr(GEnumClass) klass = g_type_class_ref (GMLP_TYPE_QUANTIZER_ROLE);
  GEnumValue *value = g_enum_get_value (klass, role);

  return value != NULL ? value->value_nick : "invalid";
}

/* The dtype the fallback multiplies dequantized operands in: 16 bits, for
 * the tensor cores; FP16 for an FP16 layer, whose outputs the backends'
 * products only write from FP16 or FP32 operands. */
static GmlpDType
fp8_fallback_dtype (GmlpGroupedLinear *self)
{
  return self->dtype == GMLP_DTYPE_FLOAT16 ? GMLP_DTYPE_FLOAT16 : GMLP_DTYPE_BFLOAT16;
}

/* The products that multiply two operands, named by their quantizers'
 * roles: FPROP x·W, DGRAD dy·W, WGRAD dy·x. */
static const struct {
  const char        *name;
  GmlpQuantizerRole  first, second;
} fp8_products[] = {
  { "FPROP", GMLP_QUANTIZER_ROLE_INPUT, GMLP_QUANTIZER_ROLE_WEIGHT },
  { "DGRAD", GMLP_QUANTIZER_ROLE_GRAD_OUTPUT, GMLP_QUANTIZER_ROLE_WEIGHT },
  { "WGRAD", GMLP_QUANTIZER_ROLE_GRAD_OUTPUT, GMLP_QUANTIZER_ROLE_INPUT },
};

/* The rules of the per-tensor products for two operands (of recipes and
 * FP8 dtypes): features multiples of 16, and no E5M2 × E5M2 (which
 * cuBLASLt has no kernel for); the same on every backend, so that what runs
 * on the CPU runs on a GPU. */
static gboolean
fp8_check_native_rules (GmlpGroupedLinear  *self,
                        const char         *product,
                        GmlpScalingRecipe   recipe_a,
                        GmlpDType           dtype_a,
                        GmlpScalingRecipe   recipe_b,
                        GmlpDType           dtype_b,
                        GError            **error)
{
  if (!fp8_per_tensor (recipe_a) || !fp8_per_tensor (recipe_b))
    return TRUE;
  if (self->in_features % 16 != 0 || self->out_features % 16 != 0)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "FP8 products with per-tensor scales need in_features and out_features that "
                   "are multiples of 16 (16-byte FP8 rows); the layer has %" G_GINT64_FORMAT
                   " → %" G_GINT64_FORMAT, self->in_features, self->out_features);
      return FALSE;
    }
  if (dtype_a == GMLP_DTYPE_FLOAT8_E5M2 && dtype_b == GMLP_DTYPE_FLOAT8_E5M2)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "The %s product would multiply E5M2 by E5M2, which the FP8 GEMMs do not do: "
                   "use the E4M3 or HYBRID format", product);
      return FALSE;
    }
  return TRUE;
}

static gboolean
fp8_check_quantizers (GmlpGroupedLinear  *self,
                      GmlpQuantizer      *input,
                      GmlpQuantizer      *weight,
                      GmlpQuantizer      *grad_output,
                      GError            **error)
{
  GmlpQuantizer *by_role[3];
  guint i, given = 0;

  /* Indexed by GmlpQuantizerRole. */
  by_role[GMLP_QUANTIZER_ROLE_INPUT] = input;
  by_role[GMLP_QUANTIZER_ROLE_WEIGHT] = weight;
  by_role[GMLP_QUANTIZER_ROLE_GRAD_OUTPUT] = grad_output;

  for (i = 0; i < 3; i++)
    given += by_role[i] != NULL;
  if (given == 0)
    return TRUE;
  if (given != 3)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "FP8 takes three quantizers (input, weight and grad-output), or none");
      return FALSE;
    }

  for (i = 0; i < 3; i++)
    {
      GmlpQuantizer *q = by_role[i];

      if (gmlp_quantizer_get_device (q) != self->device)
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                       "The %s quantizer is for %s, the layer is on %s", fp8_role_name (i),
                       gmlp_device_get_name (gmlp_quantizer_get_device (q)),
                       gmlp_device_get_name (self->device));
          return FALSE;
        }
      if (gmlp_quantizer_get_role (q) != (GmlpQuantizerRole) i)
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                       "The %s quantizer has the role %s; it must have the role %s",
                       fp8_role_name (i), fp8_role_name (gmlp_quantizer_get_role (q)),
                       fp8_role_name (i));
          return FALSE;
        }
    }

  for (i = 0; i < G_N_ELEMENTS (fp8_products); i++)
    {
      GmlpQuantizer *a = by_role[fp8_products[i].first], *b = by_role[fp8_products[i].second];

      if (!fp8_recipes_combine (gmlp_quantizer_get_recipe (a), gmlp_quantizer_get_recipe (b)))
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                       "The %s product cannot combine the %s recipe (%s quantizer) with the %s "
                       "recipe (%s quantizer): use one recipe, or the two per-tensor ones",
                       fp8_products[i].name, fp8_recipe_name (gmlp_quantizer_get_recipe (a)),
                       fp8_role_name (fp8_products[i].first),
                       fp8_recipe_name (gmlp_quantizer_get_recipe (b)),
                       fp8_role_name (fp8_products[i].second));
          return FALSE;
        }
      if (!fp8_check_native_rules (self, fp8_products[i].name,
                                   gmlp_quantizer_get_recipe (a), gmlp_quantizer_get_dtype (a),
                                   gmlp_quantizer_get_recipe (b), gmlp_quantizer_get_dtype (b),
                                   error))
        return FALSE;
    }
  return TRUE;
}

/* The recipe and FP8 dtype an operand has, or will have once @quantizer
 * has quantized it. */
static GmlpScalingRecipe
fp8_operand_recipe (GmlpGroupedTensor *tensor,
                    GmlpQuantizer     *quantizer)
{
  if (gmlp_dtype_is_fp8 (gmlp_grouped_tensor_get_dtype (tensor)))
    return gmlp_grouped_tensor_get_scaling_recipe (tensor);
  return quantizer != NULL ? gmlp_quantizer_get_recipe (quantizer) : GMLP_SCALING_RECIPE_NONE;
}

static GmlpDType
fp8_operand_dtype (GmlpGroupedTensor *tensor,
                   GmlpQuantizer     *quantizer)
{
  if (gmlp_dtype_is_fp8 (gmlp_grouped_tensor_get_dtype (tensor)) || quantizer == NULL)
    return gmlp_grouped_tensor_get_dtype (tensor);
  return gmlp_quantizer_get_dtype (quantizer);
}

/* Whether the WGRAD of device-only group sizes multiplies FP8, reading the
 * columnwise copies of dy and x (fp8_run_device_wgrad()): per-tensor scales
 * on both, or blockwise on both (the copies' own 128 × 1 blocks). */
static gboolean
fp8_device_wgrad (GmlpScalingRecipe x_recipe,
                  GmlpScalingRecipe dy_recipe)
{
  return (fp8_per_tensor (x_recipe) && fp8_per_tensor (dy_recipe)) ||
         (x_recipe == GMLP_SCALING_RECIPE_BLOCKWISE && dy_recipe == GMLP_SCALING_RECIPE_BLOCKWISE);
}

/* An activation operand of an FP8 product (the input or the output
 * gradient): of the layer's dtype, for @quantizer to quantize, or
 * quantized already, rowwise, with its scales; either way of a recipe that
 * meets @partner's (an operand it is multiplied with) in @product. */
static gboolean
fp8_check_activation (GmlpGroupedLinear  *self,
                      GmlpGroupedTensor  *tensor,
                      gint64              cols,
                      const char         *what,
                      GmlpQuantizer      *quantizer,
                      const char         *product,
                      GmlpGroupedTensor  *partner,
                      GmlpQuantizer      *partner_quantizer,
                      GError            **error)
{
  GmlpDType dtype = gmlp_grouped_tensor_get_dtype (tensor);
  GmlpScalingRecipe recipe, partner_recipe;

  if (gmlp_grouped_tensor_get_device (tensor) != self->device)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "%s is on %s, the layer on %s", what,
                   gmlp_device_get_name (gmlp_grouped_tensor_get_device (tensor)),
                   gmlp_device_get_name (self->device));
      return FALSE;
    }
  if (!gmlp_dtype_is_fp8 (dtype))
    {
      if (dtype != self->dtype)
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_DTYPE_MISMATCH,
                       "%s is %s; the layer computes in %s (or takes FP8 made by a "
                       "GmlpQuantizer)", what, gmlp_dtype_get_name (dtype),
                       gmlp_dtype_get_name (self->dtype));
          return FALSE;
        }
      if (quantizer == NULL)
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE,
                       "%s is %s and the layer has no quantizers now, but this backward "
                       "belongs to an FP8 forward: set the quantizers again, or give it "
                       "quantized", what, gmlp_dtype_get_name (dtype));
          return FALSE;
        }
    }
  else if (gmlp_grouped_tensor_get_scale_inv (tensor) == NULL)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "%s is %s without scales: FP8 operands must come from a GmlpQuantizer "
                   "(a conversion or a member view has none)", what, gmlp_dtype_get_name (dtype));
      return FALSE;
    }
  else if (gmlp_grouped_tensor_is_columnwise (tensor))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "%s is the columnwise (transposed) copy of a quantized tensor; give the "
                   "rowwise tensor", what);
      return FALSE;
    }
  else if (self->weight_quantizer == NULL && partner == NULL)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_DTYPE_MISMATCH,
                   "%s is %s: FP8 operands need the layer's quantizers (set_quantizers())",
                   what, gmlp_dtype_get_name (dtype));
      return FALSE;
    }

  if (gmlp_grouped_tensor_get_n_groups (tensor) != self->n_groups)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
                   "%s has %u groups; the layer has %u", what,
                   gmlp_grouped_tensor_get_n_groups (tensor), self->n_groups);
      return FALSE;
    }
  if (gmlp_grouped_tensor_get_cols (tensor) != cols)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
                   "%s has %" G_GINT64_FORMAT " columns; the layer needs %" G_GINT64_FORMAT,
                   what, gmlp_grouped_tensor_get_cols (tensor), cols);
      return FALSE;
    }

  recipe = fp8_operand_recipe (tensor, quantizer);
  partner_recipe = partner != NULL ? gmlp_grouped_tensor_get_scaling_recipe (partner)
                                   : gmlp_quantizer_get_recipe (partner_quantizer);
  if (!fp8_recipes_combine (recipe, partner_recipe))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "%s has the %s recipe, which the %s product cannot combine with the %s "
                   "recipe of its other operand", what, fp8_recipe_name (recipe), product,
                   fp8_recipe_name (partner_recipe));
      return FALSE;
    }
  return fp8_check_native_rules (self, product, recipe, fp8_operand_dtype (tensor, quantizer),
                                 partner_recipe,
                                 partner != NULL ? gmlp_grouped_tensor_get_dtype (partner)
                                                 : gmlp_quantizer_get_dtype (partner_quantizer),
                                 error);
}

/* @tensor quantized by @quantizer (with the columnwise copy when asked), or
 * @tensor itself when it is quantized already. */
static GmlpGroupedTensor *
fp8_quantize (GmlpGroupedTensor  *tensor,
              GmlpQuantizer      *quantizer,
              gboolean            columnwise,
              GError            **error)
{
  if (gmlp_dtype_is_fp8 (gmlp_grouped_tensor_get_dtype (tensor)))
    return g_object_ref (tensor);
  return gmlp_quantizer_quantize_full (quantizer, tensor, columnwise, error);
}

/* The quantized weights, with the columnwise copy when asked: the cached
 * ones when they will do, else quantized now (and cached when the layer
 * caches). Under the lock, so that forwards on several threads quantize
 * them once. */
static GmlpGroupedTensor *
fp8_weights (GmlpGroupedLinear  *self,
             gboolean            columnwise,
             GError            **error)
{
  g_autoptr(GmlpMutexLocker) locker = gmlp_mutex_locker_new (&self->fp8_lock);
  GmlpGroupedTensor *w8;

  if (self->weight_fp8 != NULL &&
      (!columnwise || gmlp_grouped_tensor_get_columnwise (self->weight_fp8) != NULL))
    return g_object_ref (self->weight_fp8);

  w8 = gmlp_quantizer_quantize_full (self->weight_quantizer, self->weight.grouped, columnwise,
                                     error);
  if (w8 != NULL && self->cache_fp8_weights)
    g_set_object (&self->weight_fp8, w8);
  return w8;
}

/* Whether both tensors are quantized by recipes whose products multiply
 * FP8 (gmlp_scaling_recipe_multiplies_fp8()). */
static gboolean
fp8_multiplied (GmlpGroupedTensor *a,
                GmlpGroupedTensor *b)
{
  return gmlp_scaling_recipe_multiplies_fp8 (gmlp_grouped_tensor_get_scaling_recipe (a)) &&
         gmlp_scaling_recipe_multiplies_fp8 (gmlp_grouped_tensor_get_scaling_recipe (b));
}

/* Whether a product of a and b runs on gemm_fp8: recipes it multiplies,
 * host sizes (of sized_by), and the K-major operands it reads (the
 * columnwise copies, for the transposed ones; NULL otherwise). */
static gboolean
fp8_native (GmlpGroupedTensor *sized_by,
            GmlpGroupedTensor *a,
            GmlpGroupedTensor *b)
{
  return gmlp_grouped_tensor_has_host_sizes (sized_by) && a != NULL && b != NULL &&
         fp8_multiplied (a, b);
}

/* How a product reads the scales of t, a quantized tensor or columnwise
 * copy seen K-major (GmlpBackendFp8Scales): zeros for per-tensor scales;
 * for blocks, the scale tensor's members are blocks_along (rows_i) ×
 * blocks_along (cols) in the rowwise orientation (gmlp_quant_blocks()),
 * so a rowwise tensor's rows are its rows, a copy's its columns. FALSE
 * where the depth blocks are not the products' 128 (MXFP8). */
static gboolean
fp8_operand_scales (GmlpGroupedTensor    *t,
                    GmlpBackendFp8Scales *out)
{
  gint64 block_rows, block_cols, cols = gmlp_grouped_tensor_get_cols (t);

  *out = (GmlpBackendFp8Scales) { 0, };
  gmlp_grouped_tensor_get_scale_block (t, &block_rows, &block_cols);
  if (block_rows == 0 && block_cols == 0)
    return TRUE;
  if (!gmlp_grouped_tensor_is_columnwise (t))
    {
      if (block_cols != GMLP_BACKEND_FP8_DEPTH_BLOCK)
        return FALSE;
      *out = (GmlpBackendFp8Scales) { block_rows, gmlp_quant_blocks_along (cols, block_cols), 1 };
      return TRUE;
    }
  if (block_rows != GMLP_BACKEND_FP8_DEPTH_BLOCK)
    return FALSE;
  *out = (GmlpBackendFp8Scales) { block_cols, 1, gmlp_quant_blocks_along (cols, block_cols) };
  return TRUE;
}

/* Whether a backend's error says it does not take the product (UNSUPPORTED:
 * no kernel for it there): then the caller dequantizes. Clears it. */
static gboolean
fp8_refused (GError **local_error)
{
  if ((*local_error)->code != GMLP_ERROR_UNSUPPORTED)
    return FALSE;
  g_debug ("FP8 product on dequantized operands: %s", (*local_error)->message);
  g_clear_error (local_error);
  return TRUE;
}

/* C_i = A_i B_iᵀ on the backend's gemm_fp8 (see GmlpBackendGemmFp8: a and b
 * K-major, rowwise tensors or columnwise copies, each with its scales).
 * *ran says whether it ran: blockwise products a backend does not take are
 * refused before anything is enqueued, and the caller dequantizes. */
static gboolean
fp8_run_native (GmlpGroupedLinear  *self,
                GmlpGemmKind        kind,
                const gint64       *rows,
                GmlpGroupedTensor  *a,
                GmlpGroupedTensor  *b,
                void * const       *c,
                GmlpDType           c_dtype,
                const guint8       *accumulate,
                gboolean           *ran,
                GError            **error)
{
  g_autoptr(GError) local_error = NULL;
  GmlpBackendFp8Scales a_scales, b_scales;
  gboolean blockwise;

  g_autofree gpointer *pa = member_pointers (a, NULL, self->n_groups);
  g_autofree gpointer *pb = member_pointers (b, NULL, self->n_groups);
  g_autofree gpointer *sa = member_pointers (gmlp_grouped_tensor_get_scale_inv (a), NULL, self->n_groups);
  g_autofree gpointer *sb = member_pointers (gmlp_grouped_tensor_get_scale_inv (b), NULL, self->n_groups);
  GmlpBackendGemmFp8 gemm = {
    .kind = kind,
    .n_groups = self->n_groups,
    .rows = rows,
    .n = self->out_features,
    .k = self->in_features,
    .a_dtype = (int) gmlp_grouped_tensor_get_dtype (a),
    .b_dtype = (int) gmlp_grouped_tensor_get_dtype (b),
    .c_dtype = (int) c_dtype,
    .a = (const void * const *) pa,
    .b = (const void * const *) pb,
    .a_scale_inv = (const float * const *) sa,
    .b_scale_inv = (const float * const *) sb,
    .c = c,
    .accumulate = accumulate,
  };

  *ran = FALSE;
  if (!fp8_operand_scales (a, &a_scales) || !fp8_operand_scales (b, &b_scales))
    return TRUE;
  gemm.a_scales = a_scales;
  gemm.b_scales = b_scales;
  blockwise = gmlp_backend_fp8_scales_blockwise (&a_scales, &b_scales);
  *ran = GMLP_DEVICE_CALL (self->device, gemm_fp8, &gemm, &local_error);
  if (*ran || (blockwise && fp8_refused (&local_error)))
    return TRUE;
  g_propagate_error (error, g_steal_pointer (&local_error));
  return FALSE;
}

/* An FP8 product with device sizes on the backend's gemm_device. *ran says
 * whether it ran: a backend without such a product (the CPU's WGRAD, CUDA
 * off Hopper) says UNSUPPORTED before enqueuing anything, and the caller
 * dequantizes instead. */
static gboolean
fp8_gemm_device (GmlpGroupedLinear            *self,
                 const GmlpBackendGemmDevice  *gemm,
                 gboolean                     *ran,
                 GError                      **error)
{
  g_autoptr(GError) local_error = NULL;

  *ran = GMLP_DEVICE_CALL (self->device, gemm_device, gemm, &local_error);
  /* The backends' errors share GmlpError's codes. */
  if (*ran || fp8_refused (&local_error))
    return TRUE;
  g_propagate_error (error, g_steal_pointer (&local_error));
  return FALSE;
}

/* FPROP y = x8 W8ᵀ [+ b] or DGRAD dx = dy8 (W8ᵀ)ᵀ with the group sizes of
 * sized_by on the device only, on the backend's gemm_device: a8 grouped by
 * those sizes, w8 the quantized weights (DGRAD: their columnwise copy),
 * per-tensor or blockwise scales. *ran as for fp8_gemm_device(); operands
 * whose scale layout no product takes (MXFP8) do not run either. */
static gboolean
fp8_run_device (GmlpGroupedLinear  *self,
                GmlpGemmKind        kind,
                GmlpGroupedTensor  *sized_by,
                GmlpGroupedTensor  *a8,
                GmlpGroupedTensor  *w8,
                GmlpGroupedTensor  *c,
                gboolean           *ran,
                GError            **error)
{
  gboolean bias = kind == GMLP_GEMM_FPROP && self->bias.grouped != NULL;
  g_autofree gpointer *pw = member_pointers (w8, NULL, self->n_groups);
  g_autofree gpointer *sw = member_pointers (gmlp_grouped_tensor_get_scale_inv (w8), NULL, self->n_groups);
  g_autofree gpointer *sa = NULL;
  g_autofree gpointer *pbias = bias ? member_pointers (NULL, self->bias.members, self->n_groups) : NULL;
  GmlpBackendFp8Scales a_scales, w_scales;
  GmlpBackendShape shape;
  gboolean blockwise;

  *ran = FALSE;
  if (!fp8_operand_scales (a8, &a_scales) || !fp8_operand_scales (w8, &w_scales))
    return TRUE;
  blockwise = gmlp_backend_fp8_scales_blockwise (&a_scales, &w_scales);
  /* Blockwise: a8's scales are grouped by the device sizes, from their base. */
  if (!blockwise)
    sa = member_pointers (gmlp_grouped_tensor_get_scale_inv (a8), NULL, self->n_groups);
  if (!gmlp_grouped_tensor_get_backend_shape (sized_by, &shape, error))
    return FALSE;
  {
    GmlpBackendGemmDevice gemm = {
      .kind = kind,
      .n_groups = self->n_groups,
      .device_rows = shape.device_rows,
      .row_capacity = shape.row_capacity,
      .n = self->out_features,
      .k = self->in_features,
      .ab_dtype = (int) gmlp_grouped_tensor_get_dtype (a8),
      .b_dtype = (int) gmlp_grouped_tensor_get_dtype (w8),
      .c_dtype = (int) self->dtype,
      .a = gmlp_grouped_tensor_get_data (a8),
      .c_rows = gmlp_grouped_tensor_get_data (c),
      .weight = (const void * const *) pw,
      .bias = (const void * const *) pbias,
      .a_scale_inv = (const float * const *) sa,
      .b_scale_inv = (const float * const *) sw,
      .a_scales = a_scales,
      .b_scales = w_scales,
      .a_scale_rows = blockwise ? gmlp_grouped_tensor_get_data (gmlp_grouped_tensor_get_scale_inv (a8)) : NULL,
    };

    return fp8_gemm_device (self, &gemm, ran, error);
  }
}

/* WGRAD dW [+]= dy8ᵀ x8 with the group sizes of sized_by on the device
 * only, on the backend's gemm_device: dy_t and x_t are the columnwise
 * copies (per-tensor or blockwise scales, fp8_device_wgrad()), the outputs
 * and the accumulation mask @wgrad's. *ran as for fp8_gemm_device(). */
static gboolean
fp8_run_device_wgrad (GmlpGroupedLinear  *self,
                      const Product      *wgrad,
                      GmlpGroupedTensor  *sized_by,
                      GmlpGroupedTensor  *dy_t,
                      GmlpGroupedTensor  *x_t,
                      gboolean           *ran,
                      GError            **error)
{
  GmlpGroupedTensor *dy_scales = gmlp_grouped_tensor_get_scale_inv (dy_t);
  GmlpGroupedTensor *x_scales = gmlp_grouped_tensor_get_scale_inv (x_t);
  g_autofree gpointer *pdw = member_pointers (NULL, wgrad->fixed->members, self->n_groups);
  g_autofree gpointer *sdy = NULL;
  g_autofree gpointer *sx = NULL;
  GmlpBackendFp8Scales dy_layout, x_layout;
  GmlpBackendShape shape;
  gboolean blockwise;

  *ran = FALSE;
  if (!fp8_operand_scales (dy_t, &dy_layout) || !fp8_operand_scales (x_t, &x_layout))
    return TRUE;
  /* Blockwise: the copies' scales are grouped by the blocks of the device
   * sizes, read from their bases; per-tensor: one per group. */
  blockwise = gmlp_backend_fp8_scales_blockwise (&dy_layout, &x_layout);
  if (!blockwise)
    {
      sdy = member_pointers (dy_scales, NULL, self->n_groups);
      sx = member_pointers (x_scales, NULL, self->n_groups);
    }
  if (!gmlp_grouped_tensor_get_backend_shape (sized_by, &shape, error))
    return FALSE;
  {
    GmlpBackendGemmDevice gemm = {
      .kind = GMLP_GEMM_WGRAD,
      .n_groups = self->n_groups,
      .device_rows = shape.device_rows,
      .row_capacity = shape.row_capacity,
      .n = self->out_features,
      .k = self->in_features,
      .ab_dtype = (int) gmlp_grouped_tensor_get_dtype (dy_t),
      .b_dtype = (int) gmlp_grouped_tensor_get_dtype (x_t),
      .c_dtype = (int) wgrad->c_dtype,
      .a = gmlp_grouped_tensor_get_data (dy_t),
      .b_rows = gmlp_grouped_tensor_get_data (x_t),
      .wgrad = (void * const *) pdw,
      .accumulate = wgrad->accumulate,
      .a_scale_inv = (const float * const *) sdy,
      .b_scale_inv = (const float * const *) sx,
      .a_scales = dy_layout,
      .b_scales = x_layout,
      .a_scale_rows = blockwise ? gmlp_grouped_tensor_get_data (dy_scales) : NULL,
      .b_scale_rows = blockwise ? gmlp_grouped_tensor_get_data (x_scales) : NULL,
    };

    return fp8_gemm_device (self, &gemm, ran, error);
  }
}

/* @t dequantized to @dtype, or @t itself when it is not FP8 (dequantized
 * already, by fp8_wgrad_prepare()). */
static GmlpGroupedTensor *
fp8_dequantized (GmlpGroupedTensor  *t,
                 GmlpDType           dtype,
                 GError            **error)
{
  if (!gmlp_dtype_is_fp8 (gmlp_grouped_tensor_get_dtype (t)))
    return g_object_ref (t);
  return gmlp_grouped_tensor_dequantize (t, dtype, error);
}

/* @product on dequantized operands: a8, b_rows8 (WGRAD's x) and weight8
 * (FPROP's and DGRAD's W) are dequantized to fp8_fallback_dtype() (a8 and
 * b_rows8 may be given so already) and the layer's usual product runs on
 * them, host or device sizes alike. */
static gboolean
fp8_run_dequantized (GmlpGroupedLinear  *self,
                     const Product      *product,
                     GmlpGroupedTensor  *a8,
                     GmlpGroupedTensor  *b_rows8,
                     GmlpGroupedTensor  *weight8,
                     GError            **error)
{
  GmlpDType dtype = fp8_fallback_dtype (self);
  g_autoptr(GmlpGroupedTensor) a = NULL;
  g_autoptr(GmlpGroupedTensor) b_rows = NULL;
  g_autoptr(GmlpGroupedTensor) weight = NULL;
  Param weight_param = { NULL, NULL };
  Product dequantized = *product;
  gboolean ok;

  a = fp8_dequantized (a8, dtype, error);
  if (a == NULL)
    return FALSE;
  if (b_rows8 != NULL && (b_rows = fp8_dequantized (b_rows8, dtype, error)) == NULL)
    return FALSE;
  if (weight8 != NULL &&
      ((weight = gmlp_grouped_tensor_dequantize (weight8, dtype, error)) == NULL ||
       !param_set (&weight_param, weight, self->n_groups, error)))
    return FALSE;

  dequantized.a = a;
  dequantized.b_rows = b_rows;
  if (weight != NULL)
    dequantized.fixed = &weight_param;
  dequantized.dequantized = TRUE;
  ok = run_product (self, &dequantized, error);
  param_clear (&weight_param, self->n_groups);
  return ok;
}

static GmlpGroupedTensor *
fp8_forward (GmlpGroupedLinear     *self,
             GmlpGroupedTensor     *input,
             gboolean               save_input,
             GmlpSavedActivations **saved,
             GError               **error)
{
  g_autoptr(GmlpGroupedTensor) x8 = NULL;
  g_autoptr(GmlpGroupedTensor) w8 = NULL;
  g_autoptr(GmlpGroupedTensor) output = NULL;
  const gint64 *rows = gmlp_grouped_tensor_peek_rows (input);
  GmlpScalingRecipe x_recipe;
  gboolean multiplied, native, x_copy, ran = FALSE, training = saved != NULL;

  if (!fp8_check_activation (self, input, self->in_features, "The input", self->input_quantizer,
                             "FPROP", NULL, self->weight_quantizer, error) ||
      !check_offload_context (self, error))
    return NULL;

  /* The columnwise copies are written only for a backward that reads
   * them: DGRAD reads W's (host or device sizes), WGRAD x's (host sizes;
   * device sizes with per-tensor or blockwise scales on both). */
  x_recipe = fp8_operand_recipe (input, self->input_quantizer);
  multiplied = gmlp_scaling_recipe_multiplies_fp8 (x_recipe) &&
               gmlp_scaling_recipe_multiplies_fp8 (gmlp_quantizer_get_recipe (self->weight_quantizer));
  native = rows != NULL && multiplied;
  x_copy = native || (multiplied && self->grad_output_quantizer != NULL &&
                      fp8_device_wgrad (x_recipe, gmlp_quantizer_get_recipe (self->grad_output_quantizer)));
  /* The output first: quantizing records amaxes in delayed-scaling
   * quantizers, which a forward that then fails for want of memory should
   * not have done. (A failure between the two quantizations, or a device
   * error, leaves the input's amax recorded; a retry records the same.) */
  output = new_activation_like (self, input, self->out_features, error);
  if (output == NULL)
    return NULL;
  x8 = fp8_quantize (input, self->input_quantizer, training && x_copy, error);
  if (x8 == NULL)
    return NULL;
  w8 = fp8_weights (self, training && multiplied, error);
  if (w8 == NULL)
    return NULL;

  if (native)
    {
      g_autofree gpointer *py = member_pointers (output, NULL, self->n_groups);

      if (!fp8_run_native (self, GMLP_GEMM_FPROP, rows, x8, w8, (void * const *) py, self->dtype,
                           NULL, &ran, error))
        return NULL;
      if (ran && self->bias.grouped != NULL)
        {
          g_autofree gpointer *pb = member_pointers (NULL, self->bias.members, self->n_groups);

          if (!GMLP_DEVICE_CALL (self->device, add_bias, self->n_groups, rows, self->out_features,
                                 (int) self->dtype, (void * const *) py,
                                 (const void * const *) pb, error))
            return NULL;
        }
    }
  else if (multiplied && !fp8_run_device (self, GMLP_GEMM_FPROP, input, x8, w8, output, &ran, error))
    {
      return NULL;
    }
  if (!ran)
    {
      Product fprop = { .kind = GMLP_GEMM_FPROP, .sized_by = input, .c_rows = output,
                        .c_dtype = self->dtype, .bias = self->bias.grouped != NULL };

      if (!fp8_run_dequantized (self, &fprop, x8, NULL, w8, error))
        return NULL;
    }

  if (saved != NULL)
    {
      g_autoptr(GmlpSavedActivations) new_saved = gmlp_saved_activations_new (self->id);

      /* Without the input (GroupedMLP's recompute adds the quantized
       * input before the backward), the FP8 weights are saved all the
       * same: a backward is FP8 when its forward was. */
      if (save_input)
        gmlp_saved_activations_add (new_saved, "input", x8);
      gmlp_saved_activations_add_resident (new_saved, "weight-fp8", w8);
      /* The backward reads the quantized copies; their sources are checked
       * all the same, so that FP8 and the other dtypes agree on what a
       * write between forward and backward does. */
      if (x8 != input)
        gmlp_saved_activations_watch (new_saved, "input", input);
      gmlp_saved_activations_watch (new_saved, "weight", self->weight.grouped);
      if (!gmlp_saved_activations_apply_offload (new_saved, error))
        return NULL;
      *saved = g_steal_pointer (&new_saved);
    }

  return g_steal_pointer (&output);
}

/* The FP8 backward's dgrad phase: dy quantized, then dx = dy8 W8 (W8's
 * columnwise copy, which the forward made). */
static gboolean
fp8_dgrad (GmlpGroupedLinear   *self,
           GmlpLinearBackward  *step,
           GError             **error)
{
  GmlpGroupedTensor *input = step->input, *grad_output = step->grad_output, *w8 = step->w8;
  GmlpGroupedTensor *dy8, *w8_t;
  const gint64 *rows = gmlp_grouped_tensor_peek_rows (input);
  GmlpScalingRecipe dy_recipe, x_recipe;
  gboolean native_wgrad, ran = FALSE;

  /* WGRAD reads dy's columnwise copy when it can run on FP8. */
  dy_recipe = fp8_operand_recipe (grad_output, self->grad_output_quantizer);
  x_recipe = gmlp_grouped_tensor_get_scaling_recipe (input);
  native_wgrad = gmlp_grouped_tensor_get_columnwise (input) != NULL &&
                 gmlp_scaling_recipe_multiplies_fp8 (dy_recipe) &&
                 gmlp_scaling_recipe_multiplies_fp8 (x_recipe) &&
                 (rows != NULL || fp8_device_wgrad (x_recipe, dy_recipe));
  if (step->grad_output_fp8 == NULL)
    step->grad_output_fp8 = fp8_quantize (grad_output, self->grad_output_quantizer, native_wgrad, error);
  dy8 = step->grad_output_fp8;
  if (dy8 == NULL)
    return FALSE;
  /* What the weight gradient would allocate, now (a delayed one makes it
   * in its backward_dw). */
  if (!has_flag (self, GMLP_LINEAR_DELAY_WGRAD_COMPUTE) &&
      !fp8_wgrad_prepare (self, input, grad_output == dy8 ? NULL : grad_output, dy8,
                          &step->fp8_operands, error))
    return FALSE;

  w8_t = gmlp_grouped_tensor_get_columnwise (w8);
  if (fp8_native (input, dy8, w8_t))
    {
      g_autofree gpointer *pdx = member_pointers (step->grad_input, NULL, self->n_groups);

      if (!fp8_run_native (self, GMLP_GEMM_DGRAD, rows, dy8, w8_t, (void * const *) pdx, self->dtype,
                           NULL, &ran, error))
        return FALSE;
    }
  else if (w8_t != NULL && fp8_multiplied (dy8, w8) &&
           !fp8_run_device (self, GMLP_GEMM_DGRAD, input, dy8, w8_t, step->grad_input, &ran, error))
    {
      return FALSE;
    }
  if (!ran)
    {
      Product dgrad = { .kind = GMLP_GEMM_DGRAD, .sized_by = input, .c_rows = step->grad_input,
                        .c_dtype = self->dtype };

      /* dy dequantized for the weight gradient serves here too. */
      if (!fp8_run_dequantized (self, &dgrad,
                                step->fp8_operands.dy != NULL ? step->fp8_operands.dy : dy8, NULL, w8,
                                error))
        return FALSE;
    }
  return TRUE;
}

/* Whether an FP8 weight gradient multiplies on dequantized operands
 * whatever the device: no FP8 product takes its operands (no columnwise
 * copies, MXFP8, ...). fp8_wgrad() tries the others first. */
static gboolean
fp8_wgrad_dequantizes (GmlpGroupedTensor *input,
                       GmlpGroupedTensor *grad_output_fp8)
{
  GmlpGroupedTensor *x_t = gmlp_grouped_tensor_get_columnwise (input);
  GmlpGroupedTensor *dy_t = gmlp_grouped_tensor_get_columnwise (grad_output_fp8);

  return !fp8_native (input, dy_t, x_t) &&
         !(dy_t != NULL && x_t != NULL &&
           fp8_device_wgrad (gmlp_grouped_tensor_get_scaling_recipe (x_t),
                             gmlp_grouped_tensor_get_scaling_recipe (dy_t)));
}

/* Makes what @operands lacks of what fp8_wgrad() will read (see
 * Fp8WgradOperands), so that it allocates nothing once it writes. */
static gboolean
fp8_wgrad_prepare (GmlpGroupedLinear  *self,
                   GmlpGroupedTensor  *input,
                   GmlpGroupedTensor  *grad_output,
                   GmlpGroupedTensor  *grad_output_fp8,
                   Fp8WgradOperands   *operands,
                   GError            **error)
{
  if (self->bias.grouped != NULL && grad_output == NULL && operands->bias_dy == NULL)
    {
      operands->bias_dy = gmlp_grouped_tensor_dequantize (grad_output_fp8, self->dtype, error);
      if (operands->bias_dy == NULL)
        return FALSE;
    }
  if (operands->dy == NULL && fp8_wgrad_dequantizes (input, grad_output_fp8))
    {
      g_autoptr(GmlpGroupedTensor) dy = gmlp_grouped_tensor_dequantize (grad_output_fp8,
                                                                        fp8_fallback_dtype (self), error);
      g_autoptr(GmlpGroupedTensor) x = NULL;

      if (dy == NULL)
        return FALSE;
      x = gmlp_grouped_tensor_dequantize (input, fp8_fallback_dtype (self), error);
      if (x == NULL)
        return FALSE;
      operands->dy = g_steal_pointer (&dy);
      operands->x = g_steal_pointer (&x);
    }
  return TRUE;
}

/* The weight gradients of an FP8 backward: dW from the quantized x and dy
 * (into wgrad->fixed, as compute_wgrad() set it up), or from their
 * dequantized values where no FP8 product takes them; db from the
 * unquantized dy, or, when dy came quantized, from its dequantized values. */
static gboolean
fp8_wgrad (GmlpGroupedLinear  *self,
           const Product      *wgrad,
           GmlpGroupedTensor  *input,
           GmlpGroupedTensor  *grad_output,
           GmlpGroupedTensor  *grad_output_fp8,
           Fp8WgradOperands   *operands,
           GError            **error)
{
  GmlpGroupedTensor *x_t = gmlp_grouped_tensor_get_columnwise (input);
  GmlpGroupedTensor *dy_t = gmlp_grouped_tensor_get_columnwise (grad_output_fp8);
  gboolean ran = FALSE;

  if (!fp8_wgrad_prepare (self, input, grad_output, grad_output_fp8, operands, error))
    return FALSE;

  bump_wgrad_versions (self);
  if (fp8_native (input, dy_t, x_t))
    {
      g_autofree gpointer *pdw = member_pointers (NULL, wgrad->fixed->members, self->n_groups);

      if (!fp8_run_native (self, GMLP_GEMM_WGRAD, gmlp_grouped_tensor_peek_rows (input), dy_t, x_t,
                           (void * const *) pdw, wgrad->c_dtype, wgrad->accumulate, &ran, error))
        return FALSE;
    }
  else if (dy_t != NULL && x_t != NULL &&
           fp8_device_wgrad (gmlp_grouped_tensor_get_scaling_recipe (x_t),
                             gmlp_grouped_tensor_get_scaling_recipe (dy_t)) &&
           !fp8_run_device_wgrad (self, wgrad, input, dy_t, x_t, &ran, error))
    {
      return FALSE;
    }
  /* A product the device refused (before enqueuing anything) dequantizes
   * here: the refusal cannot be known beforehand, so this is the one
   * allocation left in the weight-gradient phase (see compute_wgrad()). */
  if (!ran && !fp8_run_dequantized (self, wgrad,
                                    operands->dy != NULL ? operands->dy : grad_output_fp8,
                                    operands->x != NULL ? operands->x : input, NULL, error))
    {
      return FALSE;
    }

  if (self->bias.grouped == NULL)
    return TRUE;
  return run_bias_grad (self, input, grad_output != NULL ? grad_output : operands->bias_dy, error);
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

  if (!fp8_check_quantizers (self, input, weight, grad_output, error))
    return FALSE;

  g_object_freeze_notify (G_OBJECT (self));
  if (g_set_object (&self->input_quantizer, input))
    g_object_notify_by_pspec (G_OBJECT (self), properties[PROP_INPUT_QUANTIZER]);
  if (g_set_object (&self->weight_quantizer, weight))
    {
      gmlp_grouped_linear_invalidate_fp8_weights (self);
      g_object_notify_by_pspec (G_OBJECT (self), properties[PROP_WEIGHT_QUANTIZER]);
    }
  if (g_set_object (&self->grad_output_quantizer, grad_output))
    g_object_notify_by_pspec (G_OBJECT (self), properties[PROP_GRAD_OUTPUT_QUANTIZER]);
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
         fp8_check_quantizers (self, input, weight, grad_output, error);
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
  g_object_notify_by_pspec (G_OBJECT (self), properties[PROP_CACHE_FP8_WEIGHTS]);
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

/**
 * gmlp_grouped_linear_invalidate_fp8_weights:
 * @self: a #GmlpGroupedLinear
 *
 * Drops the cached quantized weights (see
 * [property@Gmlp.GroupedLinear:cache-fp8-weights]): the next FP8 forward
 * quantizes the weights again. Call it after changing the weights in place,
 * for example after each optimizer step. Backwards of earlier forwards
 * still use the weights their forward multiplied.
 *
 * Since: 0.1
 */
void
gmlp_grouped_linear_invalidate_fp8_weights (GmlpGroupedLinear *self)
{
  GmlpGroupedTensor *old;

  g_return_if_fail (GMLP_IS_GROUPED_LINEAR (self));

  gmlp_mutex_lock (&self->fp8_lock);
  old = g_steal_pointer (&self->weight_fp8);
  gmlp_mutex_unlock (&self->fp8_lock);
  g_clear_object (&old);
}
