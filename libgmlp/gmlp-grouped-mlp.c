/* gmlp-grouped-mlp.c: the GmlpGroupedMLP object
 *
 * Its type, properties and signal, its construction, its FP8 recipe and
 * the accessors. The activation passes, forward and backward are in
 * gmlp-grouped-mlp-steps.c; gmlp-grouped-mlp-impl.h has what the two share.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <string.h>

#include "gmlp-grouped-mlp-impl.h"
#include "gmlp-enum-types.h"
#include "gmlp-error.h"
#include "gmlp-error-private.h"
#include "gmlp-event-private.h"
#include "gmlp-grouped-linear-private.h"
#include "gmlp-quantizer-private.h"
#include "gmlp-saved-activations-private.h"

/**
 * GmlpGroupedMLP:
 *
 * The expert block of a Mixture-of-Experts model: for every group,
 * `y = FC2 (act (FC1 (x)))`, with FC1 `hidden → ffn_hidden` (twice as wide for
 * the gated activations) and FC2 `ffn_hidden → hidden`, two
 * [class@Gmlp.GroupedLinear] layers reachable with
 * [method@Gmlp.GroupedMLP.get_fc1] and [method@Gmlp.GroupedMLP.get_fc2].
 *
 * The options and the gradient contract are those of GroupedLinear
 * (docs/gradient-contract.md), applied to both layers; the MLP emits
 * [signal@Gmlp.GroupedMLP::wgrad-ready] once per weight-gradient computation
 * of the block, after both layers'. The activation runs in one pass that
 * reads FC1's output once and writes FC2's input once, forward and backward.
 *
 * Backward needs FC1's input, FC1's output and FC2's input; with
 * [property@Gmlp.GroupedMLP:recompute-activation] FC2's input is not saved
 * but recomputed from FC1's output. Saved activations offload as a whole
 * under an enabled [class@Gmlp.OffloadContext].
 *
 * ## Group sizes on the device
 *
 * The input may have its group sizes only on the device (for example
 * written by a router kernel; see
 * [ctor@Gmlp.GroupedTensor.new_with_device_sizes]), as for
 * [class@Gmlp.GroupedLinear]: forward, backward and backward_dw then never
 * read the sizes on the host and never wait for the device, so a whole step
 * can be captured in a [class@Gmlp.Graph] and replayed with new sizes. The
 * activation (forward, backward and recompute), the layers' bias passes and
 * the FP8 passes (the fused activation and quantization, the quantizers)
 * read the sizes on the device; every tensor between the layers, and the
 * output and input gradient, share the input's sizes tensor and row
 * capacity. The output gradient given to backward must have the same sizes
 * and capacity (docs/gradient-contract.md). Sizes that add up to more than
 * the capacity are clamped as docs/memory-layout.md says; with rows that
 * are not whole multiples of 256 bytes only the rows that fit in every
 * tensor of the step are meaningful then (docs/gradient-contract.md).
 *
 * ## FP8
 *
 * With [property@Gmlp.GroupedMLP:fp8-recipe] (or
 * [method@Gmlp.GroupedMLP.set_fp8_recipe]) the MLP makes six
 * [class@Gmlp.Quantizer]s, the input, weight and output-gradient quantizers
 * of FC1 and of FC2, and both layers multiply in FP8 as an FP8
 * [class@Gmlp.GroupedLinear] does. Quantizers of other settings can be put
 * on the layers themselves ([method@Gmlp.GroupedLinear.set_quantizers] on
 * [method@Gmlp.GroupedMLP.get_fc1] and [method@Gmlp.GroupedMLP.get_fc2]);
 * each forward uses what the layers have then.
 *
 * When FC2 has quantizers, the activation writes FC2's input quantized: one
 * pass reads FC1's output and writes the FP8 values, their scales and the
 * columnwise copy FC2's weight gradient reads (for the per-tensor recipes,
 * or when the input quantizer asks for it), never the activation itself;
 * the bytes are those of the activation followed by FC2's input quantizer.
 * Delayed scaling, blockwise and MXFP8 take one pass; current scaling two
 * (the amaxes, then the quantization). The backward computes the
 * activation's gradient from FC1's output, in the MLP's dtype, as without
 * FP8, and FC2's output gradient goes through FC2's output-gradient
 * quantizer. Delayed scaling needs [method@Gmlp.GroupedMLP.update_quantizers]
 * once a training step. With [property@Gmlp.GroupedMLP:cache-fp8-weights]
 * both layers quantize their weights once per step, not once per forward.
 * docs/fp8.md has the details and the accuracy.
 *
 * ## Threads
 *
 * As for [class@Gmlp.GroupedLinear]: forwards run concurrently, and the
 * MLP runs backward and backward_dw one at a time, so that FC1's and FC2's
 * weight gradients after each come from the same step and
 * [signal@Gmlp.GroupedMLP::wgrad-ready] follows both. Delayed-scaling
 * quantizers shared by the threads record every thread's amaxes.
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
 * mlp = Gmlp.GroupedMLP.new(dev, 4, 64, 128, Gmlp.Activation.SWIGLU)   # 4 experts, 64 -> 128 -> 64
 * mlp.init_parameters(7)
 * x = Gmlp.GroupedTensor.new(dev, Gmlp.DType.FLOAT32, [3, 9, 0, 4], 64)
 * x.fill_random(1, 1.0)
 * y, saved = mlp.forward(x)
 * dx = mlp.backward(saved, y)        # y as the output gradient, for the example
 * print(mlp.get_fc1().get_out_features(), mlp.get_fc2().get_wgrad().get_n_groups())
 * ```
 *
 * In JavaScript (gjs; run with `gjs -m`):
 *
 * ```js
 * import GLib from 'gi://GLib';
 * import Gmlp from 'gi://Gmlp?version=1.0';
 *
 * const dev = Gmlp.Device.get_default();
 * const mlp = Gmlp.GroupedMLP.new(dev, 4, 64, 128, Gmlp.Activation.SWIGLU);  // 64 -> 128 -> 64
 * mlp.init_parameters(7);
 * const x = Gmlp.GroupedTensor.new(dev, Gmlp.DType.FLOAT32, [3, 9, 0, 4], 64);
 * x.fill_random(1, 1.0);
 * const [y, saved] = mlp.forward(x);
 * const dx = mlp.backward(saved, y);     // y as the output gradient, for the example
 * print(mlp.get_fc1().get_out_features(), mlp.get_fc2().get_wgrad().get_n_groups());
 * ```
 *
 * Since: 0.1
 */

G_STATIC_ASSERT ((int) GMLP_ACTIVATION_GELU == GMLP_ACT_GELU);
G_STATIC_ASSERT ((int) GMLP_ACTIVATION_RELU == GMLP_ACT_RELU);
G_STATIC_ASSERT ((int) GMLP_ACTIVATION_SRELU == GMLP_ACT_SRELU);
G_STATIC_ASSERT ((int) GMLP_ACTIVATION_SWIGLU == GMLP_ACT_SWIGLU);
G_STATIC_ASSERT ((int) GMLP_ACTIVATION_GEGLU == GMLP_ACT_GEGLU);

static void gmlp_grouped_mlp_initable_iface_init (GInitableIface *iface);

G_DEFINE_FINAL_TYPE_WITH_CODE (GmlpGroupedMLP, gmlp_grouped_mlp, G_TYPE_OBJECT,
                               G_IMPLEMENT_INTERFACE (G_TYPE_INITABLE,
                                                      gmlp_grouped_mlp_initable_iface_init))

enum {
  PROP_0,
  PROP_DEVICE,
  PROP_N_GROUPS,
  PROP_HIDDEN,
  PROP_FFN_HIDDEN,
  PROP_ACTIVATION,
  PROP_DTYPE,
  PROP_FLAGS,
  PROP_RECOMPUTE_ACTIVATION,
  PROP_FP8_RECIPE,
  PROP_FP8_FORMAT,
  PROP_CACHE_FP8_WEIGHTS,
  N_PROPS
};

enum {
  SIGNAL_WGRAD_READY,
  N_SIGNALS
};

static GParamSpec *properties[N_PROPS];
static guint signals[N_SIGNALS];

static gboolean
is_gated (GmlpActivation activation)
{
  return activation == GMLP_ACTIVATION_SWIGLU || activation == GMLP_ACTIVATION_GEGLU;
}

static void
gmlp_grouped_mlp_finalize (GObject *object)
{
  GmlpGroupedMLP *self = (GmlpGroupedMLP *) object;

  g_clear_object (&self->fc1);
  g_clear_object (&self->fc2);
  g_clear_object (&self->device);
  g_clear_error (&self->construct_error);
  g_rec_mutex_clear (&self->grad_lock);

  G_OBJECT_CLASS (gmlp_grouped_mlp_parent_class)->finalize (object);
}

static void
gmlp_grouped_mlp_get_property (GObject    *object,
                               guint       prop_id,
                               GValue     *value,
                               GParamSpec *pspec)
{
  GmlpGroupedMLP *self = GMLP_GROUPED_MLP (object);

  switch (prop_id)
    {
    case PROP_DEVICE:
      g_value_set_object (value, self->device);
      break;
    case PROP_N_GROUPS:
      g_value_set_uint (value, self->n_groups);
      break;
    case PROP_HIDDEN:
      g_value_set_int64 (value, self->hidden);
      break;
    case PROP_FFN_HIDDEN:
      g_value_set_int64 (value, self->ffn_hidden);
      break;
    case PROP_ACTIVATION:
      g_value_set_enum (value, self->activation);
      break;
    case PROP_DTYPE:
      g_value_set_enum (value, self->dtype);
      break;
    case PROP_FLAGS:
      g_value_set_flags (value, self->flags);
      break;
    case PROP_RECOMPUTE_ACTIVATION:
      g_value_set_boolean (value, (self->flags & GMLP_LINEAR_RECOMPUTE_ACTIVATION) != 0);
      break;
    case PROP_FP8_RECIPE:
      g_value_set_enum (value, self->fp8_recipe);
      break;
    case PROP_FP8_FORMAT:
      g_value_set_enum (value, self->fp8_format);
      break;
    case PROP_CACHE_FP8_WEIGHTS:
      g_value_set_boolean (value, self->cache_fp8_weights);
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
    }
}

static void
gmlp_grouped_mlp_set_property (GObject      *object,
                               guint         prop_id,
                               const GValue *value,
                               GParamSpec   *pspec)
{
  GmlpGroupedMLP *self = GMLP_GROUPED_MLP (object);

  switch (prop_id)
    {
    case PROP_DEVICE:
      self->device = g_value_dup_object (value);
      break;
    case PROP_N_GROUPS:
      self->n_groups = g_value_get_uint (value);
      break;
    case PROP_HIDDEN:
      self->hidden = g_value_get_int64 (value);
      break;
    case PROP_FFN_HIDDEN:
      self->ffn_hidden = g_value_get_int64 (value);
      break;
    case PROP_ACTIVATION:
      self->activation = g_value_get_enum (value);
      break;
    case PROP_DTYPE:
      self->dtype = g_value_get_enum (value);
      break;
    case PROP_FLAGS:
      self->flags = g_value_get_flags (value) | (self->flags & GMLP_LINEAR_RECOMPUTE_ACTIVATION);
      break;
    case PROP_RECOMPUTE_ACTIVATION:
      if (g_value_get_boolean (value))
        self->flags |= GMLP_LINEAR_RECOMPUTE_ACTIVATION;
      else
        self->flags &= ~GMLP_LINEAR_RECOMPUTE_ACTIVATION;
      break;
    case PROP_FP8_RECIPE:
      self->fp8_recipe = g_value_get_enum (value);
      break;
    case PROP_FP8_FORMAT:
      self->fp8_format = g_value_get_enum (value);
      break;
    case PROP_CACHE_FP8_WEIGHTS:
      gmlp_grouped_mlp_set_cache_fp8_weights (self, g_value_get_boolean (value));
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
    }
}

static void gmlp_grouped_mlp_constructed (GObject *object);

static void
gmlp_grouped_mlp_class_init (GmlpGroupedMLPClass *klass)
{
  GObjectClass *object_class = G_OBJECT_CLASS (klass);
  const GParamFlags construct = G_PARAM_READWRITE | G_PARAM_CONSTRUCT_ONLY |
                                G_PARAM_EXPLICIT_NOTIFY | G_PARAM_STATIC_STRINGS;

  object_class->constructed = gmlp_grouped_mlp_constructed;
  object_class->finalize = gmlp_grouped_mlp_finalize;
  object_class->get_property = gmlp_grouped_mlp_get_property;
  object_class->set_property = gmlp_grouped_mlp_set_property;

  /**
   * GmlpGroupedMLP:device:
   *
   * The device of the parameters and the computation.
   *
   * Since: 0.1
   */
  properties[PROP_DEVICE] = g_param_spec_object ("device", NULL, NULL, GMLP_TYPE_DEVICE, construct);

  /**
   * GmlpGroupedMLP:n-groups:
   *
   * The number of groups (experts).
   *
   * Since: 0.1
   */
  properties[PROP_N_GROUPS] = g_param_spec_uint ("n-groups", NULL, NULL, 0, G_MAXUINT, 1, construct);

  /**
   * GmlpGroupedMLP:hidden:
   *
   * The model width: columns of the input and of the output.
   *
   * Since: 0.1
   */
  properties[PROP_HIDDEN] = g_param_spec_int64 ("hidden", NULL, NULL, G_MININT64, G_MAXINT64, 1, construct);

  /**
   * GmlpGroupedMLP:ffn-hidden:
   *
   * The width between FC1 and FC2 (FC1 is twice as wide for the gated
   * activations).
   *
   * Since: 0.1
   */
  properties[PROP_FFN_HIDDEN] = g_param_spec_int64 ("ffn-hidden", NULL, NULL, G_MININT64, G_MAXINT64, 1,
                                                  construct);

  /**
   * GmlpGroupedMLP:activation:
   *
   * The activation between FC1 and FC2.
   *
   * Since: 0.1
   */
  properties[PROP_ACTIVATION] =
    g_param_spec_enum ("activation", NULL, NULL, GMLP_TYPE_ACTIVATION, GMLP_ACTIVATION_GELU, construct);

  /**
   * GmlpGroupedMLP:dtype:
   *
   * The type of parameters, activations and gradients (FLOAT32, FLOAT16 or
   * BFLOAT16).
   *
   * Since: 0.1
   */
  properties[PROP_DTYPE] =
    g_param_spec_enum ("dtype", NULL, NULL, GMLP_TYPE_DTYPE, GMLP_DTYPE_FLOAT32, construct);

  /**
   * GmlpGroupedMLP:flags:
   *
   * The options of both layers, as for [ctor@Gmlp.GroupedLinear.new_full]
   * (bias, single grouped weight, fused wgrad accumulation, delayed wgrad),
   * and %GMLP_LINEAR_RECOMPUTE_ACTIVATION.
   *
   * Since: 0.1
   */
  properties[PROP_FLAGS] =
    g_param_spec_flags ("flags", NULL, NULL, GMLP_TYPE_LINEAR_FLAGS,
                        GMLP_LINEAR_SINGLE_GROUPED_WEIGHT, construct);

  /**
   * GmlpGroupedMLP:recompute-activation:
   *
   * Whether backward recomputes FC2's input from FC1's output instead of
   * keeping it: less memory, one more activation pass.
   *
   * Since: 0.1
   */
  properties[PROP_RECOMPUTE_ACTIVATION] =
    g_param_spec_boolean ("recompute-activation", NULL, NULL, FALSE, construct);

  /**
   * GmlpGroupedMLP:fp8-recipe:
   *
   * The scaling recipe of the six quantizers the MLP made for FC1 and FC2
   * (their input, weights and output gradient), or
   * %GMLP_SCALING_RECIPE_NONE for no FP8 of the MLP's making. Set at
   * construction or with [method@Gmlp.GroupedMLP.set_fp8_recipe];
   * quantizers put on the layers directly do not change it.
   *
   * Since: 0.1
   */
  properties[PROP_FP8_RECIPE] =
    g_param_spec_enum ("fp8-recipe", NULL, NULL, GMLP_TYPE_SCALING_RECIPE,
                       GMLP_SCALING_RECIPE_NONE, construct);

  /**
   * GmlpGroupedMLP:fp8-format:
   *
   * The FP8 format of the quantizers the MLP makes
   * ([property@Gmlp.GroupedMLP:fp8-recipe]): %GMLP_FP8_FORMAT_HYBRID, E4M3
   * forward and E5M2 for the gradients, by default.
   *
   * Since: 0.1
   */
  properties[PROP_FP8_FORMAT] =
    g_param_spec_enum ("fp8-format", NULL, NULL, GMLP_TYPE_FP8_FORMAT,
                       GMLP_FP8_FORMAT_HYBRID, construct);

  /**
   * GmlpGroupedMLP:cache-fp8-weights:
   *
   * Whether FP8 forwards reuse the weights the previous one quantized, in
   * both layers: [property@Gmlp.GroupedLinear:cache-fp8-weights] of FC1 and
   * FC2, which the MLP sets whenever this property is set (also when it is
   * set at construction). Setting the layers' own property directly does
   * not change this one. After changing the weights in place (an optimizer
   * step), call [method@Gmlp.GroupedMLP.invalidate_fp8_weights]. Clearing
   * the property drops the cached weights.
   *
   * Since: 0.1
   */
  properties[PROP_CACHE_FP8_WEIGHTS] =
    g_param_spec_boolean ("cache-fp8-weights", NULL, NULL, FALSE,
                          G_PARAM_READWRITE | G_PARAM_EXPLICIT_NOTIFY | G_PARAM_STATIC_STRINGS);

  g_object_class_install_properties (object_class, N_PROPS, properties);

  /**
   * GmlpGroupedMLP::wgrad-ready:
   * @self: the MLP
   * @event: completes when the weight gradients of both layers are computed
   *
   * Emitted once per weight-gradient computation of the block (in backward,
   * or in backward_dw when delayed), on the calling thread, once both
   * layers' weight-gradient work is enqueued. See
   * [signal@Gmlp.GroupedLinear::wgrad-ready].
   *
   * Since: 0.1
   */
  signals[SIGNAL_WGRAD_READY] =
    g_signal_new ("wgrad-ready", G_TYPE_FROM_CLASS (klass), G_SIGNAL_RUN_LAST, 0,
                  NULL, NULL, NULL, G_TYPE_NONE, 1, GMLP_TYPE_EVENT);
}

static void
gmlp_grouped_mlp_init (GmlpGroupedMLP *self)
{
  self->n_groups = 1;
  self->hidden = 1;
  self->ffn_hidden = 1;
  self->dtype = GMLP_DTYPE_FLOAT32;
  self->flags = GMLP_LINEAR_SINGLE_GROUPED_WEIGHT;
  self->fp8_recipe = GMLP_SCALING_RECIPE_NONE;
  self->fp8_format = GMLP_FP8_FORMAT_HYBRID;
  g_rec_mutex_init (&self->grad_lock);
}

static gboolean apply_fp8_recipe (GmlpGroupedMLP     *self,
                                  GmlpScalingRecipe   recipe,
                                  GmlpFp8Format       format,
                                  GError            **error);

/* The work of construction, once, whatever made the object. */
static gboolean
construct_mlp (GmlpGroupedMLP  *self,
               GError         **error)
{
  GmlpLinearFlags layer_flags = self->flags & ~GMLP_LINEAR_RECOMPUTE_ACTIVATION;
  gint64 fc1_out;

  if (self->device == NULL)
    self->device = g_object_ref (gmlp_device_get_default ());
  if ((guint) self->activation > GMLP_ACTIVATION_GEGLU)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "Unknown activation %d", (int) self->activation);
      return FALSE;
    }
  if (self->hidden <= 0 || self->hidden > G_MAXINT32)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "hidden must be between 1 and %d, not %" G_GINT64_FORMAT,
                   G_MAXINT32, self->hidden);
      return FALSE;
    }
  if (self->ffn_hidden <= 0 || self->ffn_hidden > G_MAXINT32 / 2)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "ffn_hidden must be between 1 and %d, not %" G_GINT64_FORMAT,
                   G_MAXINT32 / 2, self->ffn_hidden);
      return FALSE;
    }

  fc1_out = is_gated (self->activation) ? 2 * self->ffn_hidden : self->ffn_hidden;
  self->fc1 = gmlp_grouped_linear_new_full (self->device, self->n_groups, self->hidden, fc1_out,
                                            self->dtype, layer_flags, error);
  if (self->fc1 == NULL)
    return FALSE;
  self->fc2 = gmlp_grouped_linear_new_full (self->device, self->n_groups, self->ffn_hidden,
                                            self->hidden, self->dtype, layer_flags, error);
  if (self->fc2 == NULL)
    return FALSE;
  /* A value set at construction came before the layers. */
  gmlp_grouped_linear_set_cache_fp8_weights (self->fc1, self->cache_fp8_weights);
  gmlp_grouped_linear_set_cache_fp8_weights (self->fc2, self->cache_fp8_weights);

  self->id = gmlp_layer_id_next ();
  if (self->fp8_recipe != GMLP_SCALING_RECIPE_NONE &&
      !apply_fp8_recipe (self, self->fp8_recipe, self->fp8_format, error))
    return FALSE;
  return gmlp_grouped_mlp_init_parameters (self, 0, error);
}

static void
gmlp_grouped_mlp_constructed (GObject *object)
{
  GmlpGroupedMLP *self = GMLP_GROUPED_MLP (object);

  G_OBJECT_CLASS (gmlp_grouped_mlp_parent_class)->constructed (object);

  /* A half-made MLP keeps no layer: getters then give NULL, not a layer
   * the MLP does not use. */
  if (!construct_mlp (self, &self->construct_error))
    {
      g_clear_object (&self->fc1);
      g_clear_object (&self->fc2);
    }
}

/* Construction happened in constructed(): init only reports it, so a
 * second init changes nothing. */
static gboolean
gmlp_grouped_mlp_initable_init (GInitable     *initable,
                                GCancellable  *cancellable,
                                GError       **error)
{
  GmlpGroupedMLP *self = GMLP_GROUPED_MLP (initable);

  return gmlp_check_constructed (self, self->construct_error, error);
}

static void
gmlp_grouped_mlp_initable_iface_init (GInitableIface *iface)
{
  iface->init = gmlp_grouped_mlp_initable_init;
}

/**
 * gmlp_grouped_mlp_new:
 * @device: the device
 * @n_groups: the number of groups (experts)
 * @hidden: the model width
 * @ffn_hidden: the width between the layers
 * @activation: the activation
 * @error: return location for a #GError
 *
 * Creates an FP32 MLP with single grouped weights and no other option.
 *
 * Returns: (transfer full): the MLP, or %NULL with an error
 *
 * Since: 0.1
 */
GmlpGroupedMLP *
gmlp_grouped_mlp_new (GmlpDevice      *device,
                      guint            n_groups,
                      gint64           hidden,
                      gint64           ffn_hidden,
                      GmlpActivation   activation,
                      GError         **error)
{
  return gmlp_grouped_mlp_new_full (device, n_groups, hidden, ffn_hidden, activation,
                                    GMLP_DTYPE_FLOAT32, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT, error);
}

/**
 * gmlp_grouped_mlp_new_full:
 * @device: the device
 * @n_groups: the number of groups (experts)
 * @hidden: the model width
 * @ffn_hidden: the width between the layers
 * @activation: the activation
 * @dtype: FLOAT32, FLOAT16 or BFLOAT16
 * @flags: the options
 * @error: return location for a #GError
 *
 * Creates an MLP with every construct property given.
 *
 * Returns: (transfer full): the MLP, or %NULL with
 *   %GMLP_ERROR_INVALID_ARGUMENT or %GMLP_ERROR_UNSUPPORTED
 *
 * Since: 0.1
 */
GmlpGroupedMLP *
gmlp_grouped_mlp_new_full (GmlpDevice       *device,
                           guint             n_groups,
                           gint64            hidden,
                           gint64            ffn_hidden,
                           GmlpActivation    activation,
                           GmlpDType         dtype,
                           GmlpLinearFlags   flags,
                           GError          **error)
{
  g_return_val_if_fail (GMLP_IS_DEVICE (device), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (hidden < 0 || hidden > G_MAXINT32 || ffn_hidden < 0 || ffn_hidden > G_MAXINT32 ||
      gmlp_dtype_get_size (dtype) == 0 || (guint) activation > GMLP_ACTIVATION_GEGLU ||
      (flags & ~(GMLP_LINEAR_BIAS | GMLP_LINEAR_SINGLE_GROUPED_WEIGHT |
                 GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION | GMLP_LINEAR_DELAY_WGRAD_COMPUTE |
                 GMLP_LINEAR_RECOMPUTE_ACTIVATION)) != 0)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "Invalid GroupedMLP arguments (sizes, dtype, activation or flags)");
      return NULL;
    }

  return g_initable_new (GMLP_TYPE_GROUPED_MLP, NULL, error,
                         "device", device, "n-groups", n_groups, "hidden", hidden,
                         "ffn-hidden", ffn_hidden, "activation", activation, "dtype", dtype,
                         "flags", flags & ~GMLP_LINEAR_RECOMPUTE_ACTIVATION,
                         "recompute-activation", (flags & GMLP_LINEAR_RECOMPUTE_ACTIVATION) != 0,
                         NULL);
}

/**
 * gmlp_grouped_mlp_init_parameters:
 * @self: a #GmlpGroupedMLP
 * @seed: the seed
 * @error: return location for a #GError
 *
 * Initialises both layers as [method@Gmlp.GroupedLinear.init_parameters]
 * does, from @seed.
 *
 * Returns: %TRUE on success
 *
 * Since: 0.1
 */
gboolean
gmlp_grouped_mlp_init_parameters (GmlpGroupedMLP  *self,
                                  guint64          seed,
                                  GError         **error)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_MLP (self), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  return gmlp_grouped_mlp_init_parameters_from (self, seed, 0, error);
}

gboolean
gmlp_grouped_mlp_init_parameters_from (GmlpGroupedMLP  *self,
                                       guint64          seed,
                                       guint            first_group,
                                       GError         **error)
{
  if (!gmlp_check_constructed (self, self->construct_error, error))
    return FALSE;

  return gmlp_grouped_linear_init_parameters_from (self->fc1, seed, first_group, error) &&
         gmlp_grouped_linear_init_parameters_from (self->fc2, seed + 0x9e3779b97f4a7c15ull,
                                                   first_group, error);
}

gboolean
gmlp_grouped_mlp_emit_wgrad_ready (GmlpGroupedMLP  *self,
                                   GError         **error)
{
  g_autoptr(GmlpEvent) event = NULL;

  if (!gmlp_event_record_for_signal (self, signals[SIGNAL_WGRAD_READY], self->device, &event, error))
    return FALSE;
  if (event != NULL)
    g_signal_emit (self, signals[SIGNAL_WGRAD_READY], 0, event);
  return TRUE;
}

/**
 * gmlp_grouped_mlp_get_fc1:
 * @self: a #GmlpGroupedMLP
 *
 * Gets the MLP's first grouped linear layer, to fill its weights or read its
 * gradients.
 *
 * Returns: (transfer none) (nullable): the first layer, `hidden → ffn_hidden`
 *   (twice as wide for gated activations); %NULL when the MLP could not be
 *   constructed
 *
 * Since: 0.1
 */
GmlpGroupedLinear *
gmlp_grouped_mlp_get_fc1 (GmlpGroupedMLP *self)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_MLP (self), NULL);
  return self->fc1;
}

/**
 * gmlp_grouped_mlp_get_fc2:
 * @self: a #GmlpGroupedMLP
 *
 * Gets the MLP's second grouped linear layer, to fill its weights or read its
 * gradients.
 *
 * Returns: (transfer none) (nullable): the second layer, `ffn_hidden →
 *   hidden`; %NULL when the MLP could not be constructed
 *
 * Since: 0.1
 */
GmlpGroupedLinear *
gmlp_grouped_mlp_get_fc2 (GmlpGroupedMLP *self)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_MLP (self), NULL);
  return self->fc2;
}

/**
 * gmlp_grouped_mlp_get_activation:
 * @self: a #GmlpGroupedMLP
 *
 * Gets the activation between the MLP's two layers.
 *
 * Returns: the activation
 *
 * Since: 0.1
 */
GmlpActivation
gmlp_grouped_mlp_get_activation (GmlpGroupedMLP *self)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_MLP (self), GMLP_ACTIVATION_GELU);
  return self->activation;
}

/**
 * gmlp_grouped_mlp_get_grad_added_to_main_grad:
 * @self: a #GmlpGroupedMLP
 *
 * Tells whether the last weight-gradient computation added into the layers'
 * main_grad.
 *
 * Returns: whether the last weight-gradient computation added into the
 *   layers' main_grad (see [property@Gmlp.GroupedLinear:grad-added-to-main-grad])
 *
 * Since: 0.1
 */
gboolean
gmlp_grouped_mlp_get_grad_added_to_main_grad (GmlpGroupedMLP *self)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_MLP (self), FALSE);
  return self->fc1 != NULL && gmlp_grouped_linear_get_grad_added_to_main_grad (self->fc1);
}

static gboolean
check_recipe_known (GmlpScalingRecipe   recipe,
                    GmlpFp8Format       format,
                    GError            **error)
{
  if ((guint) recipe > GMLP_SCALING_RECIPE_MXFP8 || (guint) format > GMLP_FP8_FORMAT_HYBRID)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "Unknown FP8 recipe %d or format %d", (int) recipe, (int) format);
      return FALSE;
    }
  return TRUE;
}

gboolean
gmlp_grouped_mlp_check_fp8_recipe (GmlpGroupedMLP     *self,
                                   GmlpScalingRecipe   recipe,
                                   GmlpFp8Format       format,
                                   GError            **error)
{
  g_autoptr(GmlpQuantizer) input = NULL, weight = NULL, grad_output = NULL;

  if (!gmlp_check_constructed (self, self->construct_error, error) ||
      !check_recipe_known (recipe, format, error))
    return FALSE;
  if (recipe == GMLP_SCALING_RECIPE_NONE)
    return TRUE;

  /* The checks look at the quantizers' settings only: one set serves
   * both layers. */
  input = gmlp_quantizer_new (self->device, recipe, format, GMLP_QUANTIZER_ROLE_INPUT);
  weight = gmlp_quantizer_new (self->device, recipe, format, GMLP_QUANTIZER_ROLE_WEIGHT);
  grad_output = gmlp_quantizer_new (self->device, recipe, format, GMLP_QUANTIZER_ROLE_GRAD_OUTPUT);
  return gmlp_grouped_linear_check_quantizers (self->fc1, input, weight, grad_output, error) &&
         gmlp_grouped_linear_check_quantizers (self->fc2, input, weight, grad_output, error);
}

/* Makes six quantizers of @recipe and @format (none for NONE) and gives
 * them to both layers, both or neither: a layer that refuses them leaves
 * the MLP as it was. */
static gboolean
apply_fp8_recipe (GmlpGroupedMLP     *self,
                  GmlpScalingRecipe   recipe,
                  GmlpFp8Format       format,
                  GError            **error)
{
  static const GmlpQuantizerRole roles[] = {
    GMLP_QUANTIZER_ROLE_INPUT, GMLP_QUANTIZER_ROLE_WEIGHT, GMLP_QUANTIZER_ROLE_GRAD_OUTPUT,
  };
  GmlpGroupedLinear *layers[2] = { self->fc1, self->fc2 };
  GmlpQuantizer *made[2][3] = { { NULL } };
  GmlpQuantizer *old_fc1[3];
  gboolean ok = FALSE;
  guint l, r;

  if (!check_recipe_known (recipe, format, error))
    return FALSE;

  if (recipe != GMLP_SCALING_RECIPE_NONE)
    for (l = 0; l < 2; l++)
      for (r = 0; r < 3; r++)
        made[l][r] = gmlp_quantizer_new (self->device, recipe, format, roles[r]);
  for (r = 0; r < 3; r++)
    {
      old_fc1[r] = gmlp_grouped_linear_get_quantizer (self->fc1, roles[r]);
      if (old_fc1[r] != NULL)
        g_object_ref (old_fc1[r]);
    }

  if (gmlp_grouped_linear_set_quantizers (layers[0], made[0][0], made[0][1], made[0][2], error))
    {
      ok = gmlp_grouped_linear_set_quantizers (layers[1], made[1][0], made[1][1], made[1][2], error);
      /* FC1 took them and FC2 did not: FC1 as it was (it took these before). */
      if (!ok && !gmlp_grouped_linear_set_quantizers (layers[0], old_fc1[0], old_fc1[1], old_fc1[2], NULL))
        g_warn_if_reached ();
    }

  for (r = 0; r < 3; r++)
    {
      g_clear_object (&old_fc1[r]);
      for (l = 0; l < 2; l++)
        g_clear_object (&made[l][r]);
    }
  if (!ok)
    return FALSE;

  g_object_freeze_notify (G_OBJECT (self));
  if (self->fp8_recipe != recipe)
    {
      self->fp8_recipe = recipe;
      g_object_notify_by_pspec (G_OBJECT (self), properties[PROP_FP8_RECIPE]);
    }
  if (self->fp8_format != format)
    {
      self->fp8_format = format;
      g_object_notify_by_pspec (G_OBJECT (self), properties[PROP_FP8_FORMAT]);
    }
  g_object_thaw_notify (G_OBJECT (self));
  return TRUE;
}

/**
 * gmlp_grouped_mlp_set_fp8_recipe:
 * @self: a #GmlpGroupedMLP
 * @recipe: the scaling recipe, or %GMLP_SCALING_RECIPE_NONE to take FP8
 *   away
 * @format: the FP8 format
 * @error: return location for a #GError
 *
 * Makes both layers FP8: six new [class@Gmlp.Quantizer]s of @recipe and
 * @format (default settings otherwise: an amax history of 1024 for delayed
 * scaling), the input, weight and output-gradient quantizers of FC1 and of
 * FC2, given to the layers with [method@Gmlp.GroupedLinear.set_quantizers].
 * With %GMLP_SCALING_RECIPE_NONE both layers lose their quantizers. New
 * quantizers start afresh (delayed scaling: scale 1 until the first
 * update).
 *
 * The rules are GroupedLinear's, for both layers: the per-tensor recipes
 * need `hidden` and `ffn_hidden` multiples of 16 and a format other than
 * %GMLP_FP8_FORMAT_E5M2. Saved activations of earlier forwards keep what
 * they were made with.
 *
 * Returns: %TRUE on success; %FALSE with %GMLP_ERROR_INVALID_ARGUMENT for
 *   an unknown recipe or format, or %GMLP_ERROR_UNSUPPORTED for sizes or a
 *   format the FP8 products do not take; neither layer is changed then
 *
 * Since: 0.1
 */
gboolean
gmlp_grouped_mlp_set_fp8_recipe (GmlpGroupedMLP     *self,
                                 GmlpScalingRecipe   recipe,
                                 GmlpFp8Format       format,
                                 GError            **error)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_MLP (self), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_check_constructed (self, self->construct_error, error))
    return FALSE;

  return apply_fp8_recipe (self, recipe, format, error);
}

/**
 * gmlp_grouped_mlp_get_fp8_recipe:
 * @self: a #GmlpGroupedMLP
 *
 * Gets the FP8 scaling recipe of the MLP's products.
 *
 * Returns: the value of [property@Gmlp.GroupedMLP:fp8-recipe]
 *
 * Since: 0.1
 */
GmlpScalingRecipe
gmlp_grouped_mlp_get_fp8_recipe (GmlpGroupedMLP *self)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_MLP (self), GMLP_SCALING_RECIPE_NONE);
  return self->fp8_recipe;
}

/**
 * gmlp_grouped_mlp_get_fp8_format:
 * @self: a #GmlpGroupedMLP
 *
 * Gets the FP8 formats of the MLP's products.
 *
 * Returns: the value of [property@Gmlp.GroupedMLP:fp8-format]
 *
 * Since: 0.1
 */
GmlpFp8Format
gmlp_grouped_mlp_get_fp8_format (GmlpGroupedMLP *self)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_MLP (self), GMLP_FP8_FORMAT_HYBRID);
  return self->fp8_format;
}

/**
 * gmlp_grouped_mlp_update_quantizers:
 * @self: a #GmlpGroupedMLP
 * @error: return location for a #GError
 *
 * Ends a training step for the quantizers of both layers:
 * [method@Gmlp.Quantizer.update] once on each, a quantizer that several
 * roles or both layers share included. Delayed scaling needs it once a
 * step, after the step's last backward (and backward_dw), as
 * [method@Gmlp.GroupedLinear.update_quantizers] explains; the other recipes
 * have nothing to update. Stream-ordered; nothing waits. Only a device
 * error can make it fail, after the quantizers before the failing one were
 * updated.
 *
 * Returns: %TRUE on success (also without quantizers)
 *
 * Since: 0.1
 */
gboolean
gmlp_grouped_mlp_update_quantizers (GmlpGroupedMLP  *self,
                                    GError         **error)
{
  GmlpQuantizer *all[6];
  guint i, j;

  g_return_val_if_fail (GMLP_IS_GROUPED_MLP (self), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_check_constructed (self, self->construct_error, error))
    return FALSE;

  for (i = 0; i < 3; i++)
    {
      all[i] = gmlp_grouped_linear_get_quantizer (self->fc1, (GmlpQuantizerRole) i);
      all[3 + i] = gmlp_grouped_linear_get_quantizer (self->fc2, (GmlpQuantizerRole) i);
    }
  for (i = 0; i < G_N_ELEMENTS (all); i++)
    {
      gboolean seen = FALSE;

      for (j = 0; j < i; j++)
        seen |= all[j] == all[i];
      if (all[i] != NULL && !seen && !gmlp_quantizer_update (all[i], error))
        return FALSE;
    }
  return TRUE;
}

/**
 * gmlp_grouped_mlp_set_cache_fp8_weights:
 * @self: a #GmlpGroupedMLP
 * @cache: whether FP8 forwards reuse the quantized weights
 *
 * Sets [property@Gmlp.GroupedMLP:cache-fp8-weights], and
 * [property@Gmlp.GroupedLinear:cache-fp8-weights] of both layers.
 *
 * Since: 0.1
 */
void
gmlp_grouped_mlp_set_cache_fp8_weights (GmlpGroupedMLP *self,
                                        gboolean        cache)
{
  g_return_if_fail (GMLP_IS_GROUPED_MLP (self));

  cache = !!cache;
  /* The layers too when the MLP's value is unchanged (they may have been
   * set apart); none yet at construction (constructed() gives them it). */
  if (self->fc1 != NULL)
    gmlp_grouped_linear_set_cache_fp8_weights (self->fc1, cache);
  if (self->fc2 != NULL)
    gmlp_grouped_linear_set_cache_fp8_weights (self->fc2, cache);
  if (self->cache_fp8_weights == cache)
    return;
  self->cache_fp8_weights = cache;
  g_object_notify_by_pspec (G_OBJECT (self), properties[PROP_CACHE_FP8_WEIGHTS]);
}

/**
 * gmlp_grouped_mlp_get_cache_fp8_weights:
 * @self: a #GmlpGroupedMLP
 *
 * Tells whether both layers keep the FP8 copy of their weights between calls.
 *
 * Returns: the value of [property@Gmlp.GroupedMLP:cache-fp8-weights]
 *
 * Since: 0.1
 */
gboolean
gmlp_grouped_mlp_get_cache_fp8_weights (GmlpGroupedMLP *self)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_MLP (self), FALSE);
  return self->cache_fp8_weights;
}

/**
 * gmlp_grouped_mlp_invalidate_fp8_weights:
 * @self: a #GmlpGroupedMLP
 *
 * Drops the cached quantized weights of both layers (see
 * [property@Gmlp.GroupedMLP:cache-fp8-weights] and
 * [method@Gmlp.GroupedLinear.invalidate_fp8_weights]): the next FP8
 * forward quantizes them again. Call it after changing the weights in
 * place, for example after each optimizer step.
 *
 * Since: 0.1
 */
void
gmlp_grouped_mlp_invalidate_fp8_weights (GmlpGroupedMLP *self)
{
  g_return_if_fail (GMLP_IS_GROUPED_MLP (self));

  if (self->fc1 != NULL)
    gmlp_grouped_linear_invalidate_fp8_weights (self->fc1);
  if (self->fc2 != NULL)
    gmlp_grouped_linear_invalidate_fp8_weights (self->fc2);
}
