/* gmlp-moe-layer.c: the GmlpMoELayer object
 *
 * Its type and properties, its construction (the router, the experts and
 * the shared expert it makes), its parameters and its FP8 recipe. The
 * steps are in gmlp-moe-layer-steps.c, the getters in
 * gmlp-moe-layer-accessors.c; gmlp-moe-layer-impl.h has what they share.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <math.h>

#include <gio/gio.h>

#include "gmlp-moe-layer-impl.h"
#include "gmlp-moe-expert-parallel-private.h"
#include "gmlp-device-private.h"
#include "gmlp-enum-types.h"
#include "gmlp-error.h"
#include "gmlp-error-private.h"
#include "gmlp-grouped-mlp-private.h"
#include "gmlp-router-private.h"
#include "gmlp-saved-activations-private.h"

/**
 * GmlpMoELayer:
 *
 * A whole Mixture-of-Experts layer: a [class@Gmlp.Router] chooses `top_k`
 * of `n_experts` experts for every token, the tokens are permuted expert by
 * expert ([method@Gmlp.Routing.permute_full]), a [class@Gmlp.GroupedMLP]
 * computes every expert on its tokens, and the outputs are combined back
 * per token, weighted by the router's probabilities
 * ([method@Gmlp.Routing.combine]); an optional shared expert (a dense MLP
 * over every token, [property@Gmlp.MoELayer:shared-expert-ffn-hidden]) adds
 * its output:
 *
 * ```
 * y[t] = Σ_j probs[t, j] · expert_{e(t, j)} (x[t])  (+ shared (x[t]))
 * ```
 *
 * The tokens per expert are counted on the device and become the device
 * sizes of the experts' input, so nothing on the host needs to know the
 * routing. [method@Gmlp.MoELayer.forward] takes a one-group tensor of
 * `tokens × hidden` and returns the output of the same shape with a
 * [class@Gmlp.SavedActivations]; [method@Gmlp.MoELayer.backward] returns
 * the input's gradient and fills the router's, the experts' and the shared
 * expert's gradients, each under the gradient contract of its own class
 * (docs/gradient-contract.md): read them from
 * [method@Gmlp.MoELayer.get_router], [method@Gmlp.MoELayer.get_experts] and
 * [method@Gmlp.MoELayer.get_shared_expert]. The router's auxiliary losses
 * count in the gradient as if added to the task's loss; their values are
 * those of the last forward ([method@Gmlp.MoELayer.get_aux_loss]).
 *
 * Every option is a construct property: the experts' (`activation`,
 * `dtype`, `flags`), the router's, under the names of
 * [class@Gmlp.Router]'s properties, and the permutation's
 * ([property@Gmlp.MoELayer:padding],
 * [property@Gmlp.MoELayer:capacity-factor]). A layer made with
 * g_object_new() from them is complete; one whose properties can't work
 * reports why from [iface@Gio.Initable]'s init and from every method.
 *
 * FP8: with [property@Gmlp.MoELayer:fp8-recipe] (or
 * [method@Gmlp.MoELayer.set_fp8_recipe]) the routed experts and the shared
 * expert multiply in FP8, each with the quantizers of
 * [method@Gmlp.GroupedMLP.set_fp8_recipe]; the router's gate stays FP32.
 * Every recipe works with device-only sizes and with any
 * [property@Gmlp.MoELayer:padding]: the experts' FP8 passes read each
 * expert's rows from the sizes on the device, whatever their number.
 * Delayed scaling needs [method@Gmlp.MoELayer.update_quantizers] once a
 * training step.
 *
 * Expert parallelism: with a [property@Gmlp.MoELayer:communicator] the
 * layer is one rank of a layer whose experts are split evenly over the
 * ranks: the router (replicated, as the shared expert) routes this rank's
 * own tokens over all the experts, each token's rows travel to their
 * experts' ranks and back by all-to-all, and
 * [method@Gmlp.MoELayer.get_experts] holds this rank's experts only. Each
 * rank's output and gradients are the one-device layer's over its own
 * tokens; each local expert's weight gradients sum over every rank's
 * tokens. [property@Gmlp.MoELayer:expert-parallel-mode] says how the rows
 * travel, with a host read of the counts (exact) or in fixed slots
 * (graph-safe); [property@Gmlp.MoELayer:dispatch-fp8-recipe] sends the
 * forward's rows in FP8 with their scales (the return trip and the
 * backward stay in the layer's dtype); docs/expert-parallel.md tells the
 * whole of it.
 *
 * Threads: forwards may run on several threads at once; backwards and
 * backward_dw take turns, as the sub-layers' do. The "last forward" of the
 * getters is the last to finish. An expert-parallel layer's forwards and
 * backwards are collective: every rank calls them in the same order, one
 * at a time.
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
 * dev = Gmlp.Device.new_from_string('cpu')
 * moe = Gmlp.MoELayer(device=dev, hidden=32, ffn_hidden=48, n_experts=8, top_k=2,
 *                     aux_loss_coeff=0.01)
 * moe.init(None)                     # raises what construction found
 * moe.init_parameters(1)
 * x = Gmlp.GroupedTensor.new(dev, Gmlp.DType.FLOAT32, [64], 32)   # 64 tokens
 * x.fill_random(1, 1.0)
 * y, saved = moe.forward(x)          # router, permute, experts, combine
 * dx = moe.backward(saved, y)
 * print(moe.get_tokens_per_expert().to_bytes().get_size() // 8, 'experts')
 * ```
 *
 * In JavaScript (gjs; run with `gjs -m`):
 *
 * ```js
 * import GLib from 'gi://GLib';
 * import Gmlp from 'gi://Gmlp?version=1.0';
 *
 * const dev = Gmlp.Device.new_from_string('cpu');
 * const moe = new Gmlp.MoELayer({device: dev, hidden: 32, ffn_hidden: 48, n_experts: 8,
 *     top_k: 2, aux_loss_coeff: 0.01});
 * moe.init(null);                        // throws what construction found
 * moe.init_parameters(1);
 * const x = Gmlp.GroupedTensor.new(dev, Gmlp.DType.FLOAT32, [64], 32);  // 64 tokens
 * x.fill_random(1, 1.0);
 * const [y, saved] = moe.forward(x);     // router, permute, experts, combine
 * const dx = moe.backward(saved, y);
 * print(new BigInt64Array(moe.get_tokens_per_expert().to_bytes().toArray().slice().buffer));
 * ```
 *
 * Since: 0.1
 */

/* The router's options a layer forwards to it, under the same names. */
static const char *const router_options[] = {
  "score-function", "softmax-before-topk", "renormalize", "scaling-factor",
  "n-expert-groups", "topk-groups", "expert-bias", "bias-update-rate",
  "aux-loss-coeff", "z-loss-coeff",
};
G_STATIC_ASSERT (G_N_ELEMENTS (router_options) == N_ROUTER_OPTIONS);

static void gmlp_moe_layer_initable_iface_init (GInitableIface *iface);

G_DEFINE_FINAL_TYPE_WITH_CODE (GmlpMoELayer, gmlp_moe_layer, G_TYPE_OBJECT,
                               G_IMPLEMENT_INTERFACE (G_TYPE_INITABLE,
                                                      gmlp_moe_layer_initable_iface_init))

enum {
  PROP_0,
  PROP_DEVICE,
  PROP_HIDDEN,
  PROP_FFN_HIDDEN,
  PROP_N_EXPERTS,
  PROP_TOP_K,
  PROP_ACTIVATION,
  PROP_DTYPE,
  PROP_FLAGS,
  PROP_PADDING,
  PROP_CAPACITY_FACTOR,
  PROP_SHARED_EXPERT_FFN_HIDDEN,
  PROP_FP8_RECIPE,
  PROP_FP8_FORMAT,
  PROP_FIRST_ROUTER_OPTION,
  PROP_FIRST_PARALLEL = PROP_FIRST_ROUTER_OPTION + N_ROUTER_OPTIONS,
  N_PROPS = PROP_FIRST_PARALLEL + GMLP_MOE_PARALLEL_N_PROPS
};

static GParamSpec *properties[N_PROPS];

static void
gmlp_moe_layer_finalize (GObject *object)
{
  GmlpMoELayer *self = (GmlpMoELayer *) object;
  guint i;

  for (i = 0; i < N_ROUTER_OPTIONS; i++)
    if (G_IS_VALUE (&self->router_values[i]))
      g_value_unset (&self->router_values[i]);
  g_clear_object (&self->router);
  g_clear_object (&self->experts);
  g_clear_object (&self->shared);
  g_clear_object (&self->last);
  g_clear_object (&self->last_dropped);
  g_clear_object (&self->communicator);
  g_clear_object (&self->dispatch_quantizer);
  g_clear_object (&self->device);
  g_clear_error (&self->construct_error);
  g_mutex_clear (&self->last_lock);
  g_rec_mutex_clear (&self->grad_lock);

  G_OBJECT_CLASS (gmlp_moe_layer_parent_class)->finalize (object);
}

static void
gmlp_moe_layer_get_property (GObject    *object,
                             guint       prop_id,
                             GValue     *value,
                             GParamSpec *pspec)
{
  GmlpMoELayer *self = GMLP_MOE_LAYER (object);

  if (prop_id >= PROP_FIRST_PARALLEL && prop_id < N_PROPS)
    return gmlp_moe_parallel_get_property (self, prop_id - PROP_FIRST_PARALLEL, value);
  if (prop_id >= PROP_FIRST_ROUTER_OPTION && prop_id < PROP_FIRST_PARALLEL)
    {
      g_value_copy (&self->router_values[prop_id - PROP_FIRST_ROUTER_OPTION], value);
      return;
    }

  switch (prop_id)
    {
    case PROP_DEVICE:
      g_value_set_object (value, self->device);
      break;
    case PROP_HIDDEN:
      g_value_set_int64 (value, self->hidden);
      break;
    case PROP_FFN_HIDDEN:
      g_value_set_int64 (value, self->ffn_hidden);
      break;
    case PROP_N_EXPERTS:
      g_value_set_uint (value, self->n_experts);
      break;
    case PROP_TOP_K:
      g_value_set_uint (value, self->top_k);
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
    case PROP_PADDING:
      g_value_set_uint (value, self->padding);
      break;
    case PROP_CAPACITY_FACTOR:
      g_value_set_double (value, self->capacity_factor);
      break;
    case PROP_SHARED_EXPERT_FFN_HIDDEN:
      g_value_set_int64 (value, self->shared_ffn_hidden);
      break;
    case PROP_FP8_RECIPE:
      g_value_set_enum (value, self->fp8_recipe);
      break;
    case PROP_FP8_FORMAT:
      g_value_set_enum (value, self->fp8_format);
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
    }
}

static void
gmlp_moe_layer_set_property (GObject      *object,
                             guint         prop_id,
                             const GValue *value,
                             GParamSpec   *pspec)
{
  GmlpMoELayer *self = GMLP_MOE_LAYER (object);

  if (prop_id >= PROP_FIRST_PARALLEL && prop_id < N_PROPS)
    return gmlp_moe_parallel_set_property (self, prop_id - PROP_FIRST_PARALLEL, value);
  if (prop_id >= PROP_FIRST_ROUTER_OPTION && prop_id < PROP_FIRST_PARALLEL)
    {
      GValue *option = &self->router_values[prop_id - PROP_FIRST_ROUTER_OPTION];

      if (G_IS_VALUE (option))
        g_value_unset (option);
      g_value_init (option, G_VALUE_TYPE (value));
      g_value_copy (value, option);
      return;
    }

  switch (prop_id)
    {
    case PROP_DEVICE:
      self->device = g_value_dup_object (value);
      break;
    case PROP_HIDDEN:
      self->hidden = g_value_get_int64 (value);
      break;
    case PROP_FFN_HIDDEN:
      self->ffn_hidden = g_value_get_int64 (value);
      break;
    case PROP_N_EXPERTS:
      self->n_experts = g_value_get_uint (value);
      break;
    case PROP_TOP_K:
      self->top_k = g_value_get_uint (value);
      break;
    case PROP_ACTIVATION:
      self->activation = g_value_get_enum (value);
      break;
    case PROP_DTYPE:
      self->dtype = g_value_get_enum (value);
      break;
    case PROP_FLAGS:
      self->flags = g_value_get_flags (value);
      break;
    case PROP_PADDING:
      self->padding = g_value_get_uint (value);
      break;
    case PROP_CAPACITY_FACTOR:
      self->capacity_factor = g_value_get_double (value);
      break;
    case PROP_SHARED_EXPERT_FFN_HIDDEN:
      self->shared_ffn_hidden = g_value_get_int64 (value);
      break;
    case PROP_FP8_RECIPE:
      self->fp8_recipe = g_value_get_enum (value);
      break;
    case PROP_FP8_FORMAT:
      self->fp8_format = g_value_get_enum (value);
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
    }
}

/* The router's own property of that name, with the same type, range and
 * default, so that a layer's router options are the router's. */
static GParamSpec *
router_option_pspec (GObjectClass *router_class,
                     const char   *name)
{
  const GParamFlags construct = G_PARAM_READWRITE | G_PARAM_CONSTRUCT_ONLY |
                                G_PARAM_EXPLICIT_NOTIFY | G_PARAM_STATIC_NAME;
  GParamSpec *of = g_object_class_find_property (router_class, name);
  g_autofree char *blurb = g_strdup_printf ("The router's GmlpRouter:%s", name);

  g_assert (of != NULL);
  if (G_IS_PARAM_SPEC_BOOLEAN (of))
    return g_param_spec_boolean (name, NULL, blurb, G_PARAM_SPEC_BOOLEAN (of)->default_value,
                                 construct);
  if (G_IS_PARAM_SPEC_UINT (of))
    return g_param_spec_uint (name, NULL, blurb, G_PARAM_SPEC_UINT (of)->minimum,
                              G_PARAM_SPEC_UINT (of)->maximum, G_PARAM_SPEC_UINT (of)->default_value,
                              construct);
  if (G_IS_PARAM_SPEC_DOUBLE (of))
    return g_param_spec_double (name, NULL, blurb, G_PARAM_SPEC_DOUBLE (of)->minimum,
                                G_PARAM_SPEC_DOUBLE (of)->maximum,
                                G_PARAM_SPEC_DOUBLE (of)->default_value, construct);
  if (G_IS_PARAM_SPEC_ENUM (of))
    return g_param_spec_enum (name, NULL, blurb, of->value_type,
                              G_PARAM_SPEC_ENUM (of)->default_value, construct);
  g_assert_not_reached ();
}

static void gmlp_moe_layer_constructed (GObject *object);

static void
gmlp_moe_layer_class_init (GmlpMoELayerClass *klass)
{
  GObjectClass *object_class = G_OBJECT_CLASS (klass);
  const GParamFlags construct = G_PARAM_READWRITE | G_PARAM_CONSTRUCT_ONLY |
                                G_PARAM_EXPLICIT_NOTIFY | G_PARAM_STATIC_STRINGS;
  g_autoptr(GTypeClass) router_class = g_type_class_ref (GMLP_TYPE_ROUTER);
  guint i;

  object_class->constructed = gmlp_moe_layer_constructed;
  object_class->finalize = gmlp_moe_layer_finalize;
  object_class->get_property = gmlp_moe_layer_get_property;
  object_class->set_property = gmlp_moe_layer_set_property;

  /* The ranges of the sizes are wide on purpose: a bad value is a GError of
   * the construction, not a warning of GObject's. */

  /**
   * GmlpMoELayer:device:
   *
   * The device of the parameters and the computation; at construction,
   * %NULL stands for [func@Gmlp.Device.get_default].
   *
   * Since: 0.1
   */
  properties[PROP_DEVICE] = g_param_spec_object ("device", NULL, NULL, GMLP_TYPE_DEVICE, construct);

  /**
   * GmlpMoELayer:hidden:
   *
   * The model width: the columns of the input and the output.
   *
   * Since: 0.1
   */
  properties[PROP_HIDDEN] =
    g_param_spec_int64 ("hidden", NULL, NULL, G_MININT64, G_MAXINT64, 1, construct);

  /**
   * GmlpMoELayer:ffn-hidden:
   *
   * The width of every expert between its two layers.
   *
   * Since: 0.1
   */
  properties[PROP_FFN_HIDDEN] =
    g_param_spec_int64 ("ffn-hidden", NULL, NULL, G_MININT64, G_MAXINT64, 1, construct);

  /**
   * GmlpMoELayer:n-experts:
   *
   * The number of experts, 1 to 65535; with a
   * [property@Gmlp.MoELayer:communicator], of all the ranks together (a
   * multiple of its world size).
   *
   * Since: 0.1
   */
  properties[PROP_N_EXPERTS] =
    g_param_spec_uint ("n-experts", NULL, NULL, 0, G_MAXUINT, 1, construct);

  /**
   * GmlpMoELayer:top-k:
   *
   * How many experts each token goes to, 1 to 16 and at most
   * [property@Gmlp.MoELayer:n-experts].
   *
   * Since: 0.1
   */
  properties[PROP_TOP_K] = g_param_spec_uint ("top-k", NULL, NULL, 0, G_MAXUINT, 1, construct);

  /**
   * GmlpMoELayer:activation:
   *
   * The experts' activation (and the shared expert's).
   *
   * Since: 0.1
   */
  properties[PROP_ACTIVATION] =
    g_param_spec_enum ("activation", NULL, NULL, GMLP_TYPE_ACTIVATION, GMLP_ACTIVATION_SWIGLU,
                       construct);

  /**
   * GmlpMoELayer:dtype:
   *
   * The type of the tokens and of the experts' parameters: FLOAT32,
   * FLOAT16 or BFLOAT16 (the router computes in FP32).
   *
   * Since: 0.1
   */
  properties[PROP_DTYPE] =
    g_param_spec_enum ("dtype", NULL, NULL, GMLP_TYPE_DTYPE, GMLP_DTYPE_FLOAT32, construct);

  /**
   * GmlpMoELayer:flags:
   *
   * The experts' options (and the shared expert's);
   * %GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION and
   * %GMLP_LINEAR_DELAY_WGRAD_COMPUTE go to the router too.
   *
   * Since: 0.1
   */
  properties[PROP_FLAGS] =
    g_param_spec_flags ("flags", NULL, NULL, GMLP_TYPE_LINEAR_FLAGS,
                        GMLP_LINEAR_SINGLE_GROUPED_WEIGHT, construct);

  /**
   * GmlpMoELayer:padding:
   *
   * Every expert's rows are padded to a multiple of this (0 or 1: none; a
   * power of two up to 128), for FP8 and aligned kernels; see
   * [method@Gmlp.Routing.permute_full].
   *
   * Since: 0.1
   */
  properties[PROP_PADDING] = g_param_spec_uint ("padding", NULL, NULL, 0, G_MAXUINT, 0, construct);

  /**
   * GmlpMoELayer:capacity-factor:
   *
   * The most tokens an expert takes, as a factor of an even share
   * (`ceil (factor × tokens × top_k / n_experts)`); the choices past it are
   * dropped and contribute zero. 0 (the default) is dropless; a negative or
   * infinite factor is an error.
   *
   * Since: 0.1
   */
  properties[PROP_CAPACITY_FACTOR] =
    g_param_spec_double ("capacity-factor", NULL, NULL, -INFINITY, INFINITY, 0.0, construct);

  /**
   * GmlpMoELayer:shared-expert-ffn-hidden:
   *
   * The width of a shared expert, a dense MLP over every token whose output
   * is added to the experts' ([method@Gmlp.MoELayer.get_shared_expert]);
   * 0 for none.
   *
   * Since: 0.1
   */
  properties[PROP_SHARED_EXPERT_FFN_HIDDEN] =
    g_param_spec_int64 ("shared-expert-ffn-hidden", NULL, NULL, G_MININT64, G_MAXINT64, 0,
                        construct);

  /**
   * GmlpMoELayer:fp8-recipe:
   *
   * The scaling recipe the layer gave the routed experts and the shared
   * expert ([method@Gmlp.MoELayer.set_fp8_recipe]), or
   * %GMLP_SCALING_RECIPE_NONE for no FP8 of the layer's making. Set at
   * construction or with [method@Gmlp.MoELayer.set_fp8_recipe]; recipes or
   * quantizers given to the experts directly do not change it.
   *
   * Since: 0.1
   */
  properties[PROP_FP8_RECIPE] =
    g_param_spec_enum ("fp8-recipe", NULL, NULL, GMLP_TYPE_SCALING_RECIPE,
                       GMLP_SCALING_RECIPE_NONE, construct);

  /**
   * GmlpMoELayer:fp8-format:
   *
   * The FP8 format of [property@Gmlp.MoELayer:fp8-recipe]:
   * %GMLP_FP8_FORMAT_HYBRID, E4M3 forward and E5M2 for the gradients, by
   * default.
   *
   * Since: 0.1
   */
  properties[PROP_FP8_FORMAT] =
    g_param_spec_enum ("fp8-format", NULL, NULL, GMLP_TYPE_FP8_FORMAT,
                       GMLP_FP8_FORMAT_HYBRID, construct);

  /* The router's options, under the router's names (router_options). */

  /**
   * GmlpMoELayer:score-function:
   *
   * How the router turns the logits into scores (softmax or sigmoid). The
   * layer gives it to its router: see [property@Gmlp.Router:score-function].
   *
   * Since: 0.1
   */

  /**
   * GmlpMoELayer:softmax-before-topk:
   *
   * With the softmax: whether the top-k is taken of the softmax over all
   * experts (%TRUE) or of the logits (%FALSE). The layer gives it to its
   * router: see [property@Gmlp.Router:softmax-before-topk].
   *
   * Since: 0.1
   */

  /**
   * GmlpMoELayer:renormalize:
   *
   * Whether the probabilities of a token's chosen experts are divided by
   * their sum. The layer gives it to its router: see
   * [property@Gmlp.Router:renormalize].
   *
   * Since: 0.1
   */

  /**
   * GmlpMoELayer:scaling-factor:
   *
   * What the probabilities are multiplied by last. The layer gives it to its
   * router: see [property@Gmlp.Router:scaling-factor].
   *
   * Since: 0.1
   */

  /**
   * GmlpMoELayer:n-expert-groups:
   *
   * The number of groups of experts for group-limited routing, or 0 for none.
   * The layer gives it to its router: see
   * [property@Gmlp.Router:n-expert-groups].
   *
   * Since: 0.1
   */

  /**
   * GmlpMoELayer:topk-groups:
   *
   * With groups, how many groups a token may choose its experts from. The
   * layer gives it to its router: see [property@Gmlp.Router:topk-groups].
   *
   * Since: 0.1
   */

  /**
   * GmlpMoELayer:expert-bias:
   *
   * Whether the router has a per-expert bias for aux-loss-free balancing. The
   * layer gives it to its router: see [property@Gmlp.Router:expert-bias].
   *
   * Since: 0.1
   */

  /**
   * GmlpMoELayer:bias-update-rate:
   *
   * The step of the expert bias's update. The layer gives it to its router:
   * see [property@Gmlp.Router:bias-update-rate].
   *
   * Since: 0.1
   */

  /**
   * GmlpMoELayer:aux-loss-coeff:
   *
   * The coefficient of the load-balancing loss, 0 for none. The layer gives
   * it to its router: see [property@Gmlp.Router:aux-loss-coeff].
   *
   * Since: 0.1
   */

  /**
   * GmlpMoELayer:z-loss-coeff:
   *
   * The coefficient of the z-loss, 0 for none. The layer gives it to its
   * router: see [property@Gmlp.Router:z-loss-coeff].
   *
   * Since: 0.1
   */

  for (i = 0; i < N_ROUTER_OPTIONS; i++)
    properties[PROP_FIRST_ROUTER_OPTION + i] =
      router_option_pspec (G_OBJECT_CLASS (router_class), router_options[i]);
  /* communicator, expert-parallel-mode, expert-capacity-factor */
  gmlp_moe_parallel_make_pspecs (properties + PROP_FIRST_PARALLEL);

  g_object_class_install_properties (object_class, N_PROPS, properties);
  /* The saved activations' keys, made here once rather than by the first
   * forwards of several threads at once. */
  (void) g_quark_from_static_string (SAVED_ROUTING);
  (void) g_quark_from_static_string (SAVED_PARALLEL);
}

static void
gmlp_moe_layer_init (GmlpMoELayer *self)
{
  self->hidden = 1;
  self->ffn_hidden = 1;
  self->n_experts = 1;
  self->top_k = 1;
  self->activation = GMLP_ACTIVATION_SWIGLU;
  self->dtype = GMLP_DTYPE_FLOAT32;
  self->flags = GMLP_LINEAR_SINGLE_GROUPED_WEIGHT;
  self->fp8_recipe = GMLP_SCALING_RECIPE_NONE;
  self->fp8_format = GMLP_FP8_FORMAT_HYBRID;
  g_mutex_init (&self->last_lock);
  g_rec_mutex_init (&self->grad_lock);
}

/* @recipe and @format on the routed experts and on the shared expert,
 * both or neither: both are checked before either changes (GroupedMLP's
 * rules: their widths differ). */
static gboolean
apply_fp8_recipe (GmlpMoELayer       *self,
                  GmlpScalingRecipe   recipe,
                  GmlpFp8Format       format,
                  GError            **error)
{
  if (!gmlp_grouped_mlp_check_fp8_recipe (self->experts, recipe, format, error))
    {
      g_prefix_error (error, "The experts: ");
      return FALSE;
    }
  if (self->shared != NULL && !gmlp_grouped_mlp_check_fp8_recipe (self->shared, recipe, format, error))
    {
      g_prefix_error (error, "The shared expert: ");
      return FALSE;
    }
  if (!gmlp_grouped_mlp_set_fp8_recipe (self->experts, recipe, format, error) ||
      (self->shared != NULL && !gmlp_grouped_mlp_set_fp8_recipe (self->shared, recipe, format, error)))
    g_return_val_if_reached (FALSE);
  return TRUE;
}

static gboolean
construct_layer (GmlpMoELayer  *self,
                 GError       **error)
{
  const GmlpLinearFlags router_flags = GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION |
                                       GMLP_LINEAR_DELAY_WGRAD_COMPUTE;
  const char *names[N_ROUTER_OPTIONS + 5];
  GValue values[N_ROUTER_OPTIONS + 5] = { G_VALUE_INIT, };
  guint n = 0, i;
  gboolean ok;

  if (self->device == NULL)
    self->device = g_object_ref (gmlp_device_get_default ());
  if (!gmlp_device_check_usable (self->device, error))
    return FALSE;
  if (!(self->capacity_factor >= 0.0 && self->capacity_factor <= G_MAXFLOAT))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "The capacity factor must be finite and not negative (0: dropless), not %g",
                   self->capacity_factor);
      return FALSE;
    }
  /* The permutation's rule (gmlp_routing_permute_full()), said here so
   * that a layer that can't permute is not made. */
  if (self->padding > 128 || (self->padding & (self->padding - 1)) != 0)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "The padding must be 0 or a power of two up to 128, not %u", self->padding);
      return FALSE;
    }
  if (self->shared_ffn_hidden < 0)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "The shared expert's width must not be negative, not %" G_GINT64_FORMAT,
                   self->shared_ffn_hidden);
      return FALSE;
    }

  /* The router checks hidden, n_experts, top_k and its options. */
  names[n] = "device";
  g_value_init (&values[n], GMLP_TYPE_DEVICE);
  g_value_set_object (&values[n++], self->device);
  names[n] = "hidden";
  g_value_init (&values[n], G_TYPE_INT64);
  g_value_set_int64 (&values[n++], self->hidden);
  names[n] = "n-experts";
  g_value_init (&values[n], G_TYPE_UINT);
  g_value_set_uint (&values[n++], self->n_experts);
  names[n] = "top-k";
  g_value_init (&values[n], G_TYPE_UINT);
  g_value_set_uint (&values[n++], self->top_k);
  names[n] = "flags";
  g_value_init (&values[n], GMLP_TYPE_LINEAR_FLAGS);
  g_value_set_flags (&values[n++], self->flags & router_flags);
  for (i = 0; i < N_ROUTER_OPTIONS; i++)
    if (G_IS_VALUE (&self->router_values[i]))
      {
        names[n] = router_options[i];
        g_value_init (&values[n], G_VALUE_TYPE (&self->router_values[i]));
        g_value_copy (&self->router_values[i], &values[n++]);
      }
  self->router = GMLP_ROUTER (g_object_new_with_properties (GMLP_TYPE_ROUTER, n, names, values));
  for (i = 0; i < n; i++)
    g_value_unset (&values[i]);
  if (!g_initable_init (G_INITABLE (self->router), NULL, error) ||
      !gmlp_moe_parallel_check (self, error))
    return FALSE;

  self->experts = gmlp_grouped_mlp_new_full (self->device, self->n_local_experts, self->hidden,
                                             self->ffn_hidden, self->activation, self->dtype,
                                             self->flags, error);
  if (self->experts == NULL)
    return FALSE;
  if (self->shared_ffn_hidden > 0)
    {
      self->shared = gmlp_grouped_mlp_new_full (self->device, 1, self->hidden,
                                                self->shared_ffn_hidden, self->activation,
                                                self->dtype, self->flags, error);
      if (self->shared == NULL)
        return FALSE;
    }

  if (self->fp8_recipe != GMLP_SCALING_RECIPE_NONE &&
      !apply_fp8_recipe (self, self->fp8_recipe, self->fp8_format, error))
    return FALSE;

  self->id = gmlp_layer_id_next ();
  ok = gmlp_moe_layer_init_parameters (self, 0, error);
  return ok;
}

static void
gmlp_moe_layer_constructed (GObject *object)
{
  GmlpMoELayer *self = GMLP_MOE_LAYER (object);

  G_OBJECT_CLASS (gmlp_moe_layer_parent_class)->constructed (object);

  /* A half-made layer keeps no sub-layer: getters then give NULL. */
  if (!construct_layer (self, &self->construct_error))
    {
      g_clear_object (&self->router);
      g_clear_object (&self->experts);
      g_clear_object (&self->shared);
    }
}

/* Construction happened in constructed(): init only reports it, so a
 * second init changes nothing; with a communicator the ranks' agreement
 * comes first (collective: here, where bindings let go of their locks,
 * or at the first forward). */
static gboolean
gmlp_moe_layer_initable_init (GInitable     *initable,
                              GCancellable  *cancellable,
                              GError       **error)
{
  GmlpMoELayer *self = GMLP_MOE_LAYER (initable);

  return gmlp_moe_parallel_ensure_agreed (self, error);
}

static void
gmlp_moe_layer_initable_iface_init (GInitableIface *iface)
{
  iface->init = gmlp_moe_layer_initable_init;
}

/**
 * gmlp_moe_layer_new:
 * @device: the device
 * @hidden: the model width
 * @ffn_hidden: the width of every expert between its layers
 * @n_experts: the number of experts
 * @top_k: how many experts each token goes to
 * @error: return location for a #GError
 *
 * Creates an FP32 layer of SwiGLU experts with Mixtral's routing (the
 * softmax over every expert's logit, the top-k of those probabilities,
 * renormalized to sum to 1), dropless, without a shared expert or
 * auxiliary loss.
 *
 * Returns: (transfer full): the layer, or %NULL with an error
 *
 * Since: 0.1
 */
GmlpMoELayer *
gmlp_moe_layer_new (GmlpDevice  *device,
                    gint64       hidden,
                    gint64       ffn_hidden,
                    guint        n_experts,
                    guint        top_k,
                    GError     **error)
{
  return gmlp_moe_layer_new_full (device, hidden, ffn_hidden, n_experts, top_k,
                                  GMLP_ACTIVATION_SWIGLU, GMLP_DTYPE_FLOAT32,
                                  GMLP_LINEAR_SINGLE_GROUPED_WEIGHT, error);
}

/**
 * gmlp_moe_layer_new_full:
 * @device: the device
 * @hidden: the model width
 * @ffn_hidden: the width of every expert between its layers
 * @n_experts: the number of experts
 * @top_k: how many experts each token goes to
 * @activation: the experts' activation
 * @dtype: FLOAT32, FLOAT16 or BFLOAT16
 * @flags: the experts' options
 * @error: return location for a #GError
 *
 * Creates a layer; the router's options, the padding, the capacity factor
 * and the shared expert are construct properties (g_object_new()).
 *
 * Returns: (transfer full): the layer, or %NULL with
 *   %GMLP_ERROR_INVALID_ARGUMENT or %GMLP_ERROR_UNSUPPORTED
 *
 * Since: 0.1
 */
GmlpMoELayer *
gmlp_moe_layer_new_full (GmlpDevice       *device,
                         gint64            hidden,
                         gint64            ffn_hidden,
                         guint             n_experts,
                         guint             top_k,
                         GmlpActivation    activation,
                         GmlpDType         dtype,
                         GmlpLinearFlags   flags,
                         GError          **error)
{
  g_autoptr(GFlagsClass) flags_class = NULL;

  g_return_val_if_fail (GMLP_IS_DEVICE (device), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  /* Values GObject would warn about are the construction's errors. */
  flags_class = g_type_class_ref (GMLP_TYPE_LINEAR_FLAGS);
  if (gmlp_dtype_get_size (dtype) == 0 || (guint) activation > GMLP_ACTIVATION_GEGLU ||
      (flags & ~flags_class->mask) != 0)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "Invalid MoELayer arguments (dtype, activation or flags)");
      return NULL;
    }

  return g_initable_new (GMLP_TYPE_MOE_LAYER, NULL, error,
                         "device", device, "hidden", hidden, "ffn-hidden", ffn_hidden,
                         "n-experts", n_experts, "top-k", top_k, "activation", activation,
                         "dtype", dtype, "flags", flags, NULL);
}

/**
 * gmlp_moe_layer_init_parameters:
 * @self: a #GmlpMoELayer
 * @seed: the seed
 * @error: return location for a #GError
 *
 * Draws every parameter (the router's gate, the experts', the shared
 * expert's) as their own init_parameters do, from @seed.
 *
 * Returns: %TRUE on success
 *
 * Since: 0.1
 */
gboolean
gmlp_moe_layer_init_parameters (GmlpMoELayer  *self,
                                guint64        seed,
                                GError       **error)
{
  g_return_val_if_fail (GMLP_IS_MOE_LAYER (self), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_check_constructed (self, self->construct_error, error))
    return FALSE;

  return gmlp_router_init_parameters (self->router, seed, error) &&
         gmlp_grouped_mlp_init_parameters_from (self->experts, seed + 1, self->first_expert, error) &&
         (self->shared == NULL || gmlp_grouped_mlp_init_parameters (self->shared, seed + 2, error));
}

/**
 * gmlp_moe_layer_set_fp8_recipe:
 * @self: a #GmlpMoELayer
 * @recipe: the scaling recipe, or %GMLP_SCALING_RECIPE_NONE to take FP8
 *   away
 * @format: the FP8 format
 * @error: return location for a #GError
 *
 * Makes the experts FP8: [method@Gmlp.GroupedMLP.set_fp8_recipe] on the
 * routed experts and on the shared expert, when there is one (six new
 * [class@Gmlp.Quantizer]s each, of @recipe and @format, starting afresh).
 * With %GMLP_SCALING_RECIPE_NONE both lose their quantizers. The router's
 * gate stays FP32.
 *
 * The rules are GroupedMLP's, for both: the per-tensor recipes need
 * `hidden`, `ffn_hidden` and
 * [property@Gmlp.MoELayer:shared-expert-ffn-hidden] multiples of 16 and a
 * format other than %GMLP_FP8_FORMAT_E5M2. Both are checked before either
 * changes.
 *
 * Nothing is asked of [property@Gmlp.MoELayer:padding]: every recipe
 * takes experts of any number of rows, read from the sizes on the device
 * (a block of scales that runs past an expert's last row gets the scale of
 * the rows it holds; docs/fp8.md). A padding of 16 spares the GPU's FP8
 * weight gradients the copy of each expert's operands whose row count is
 * not a multiple of 16 into rows padded to 16.
 *
 * Saved activations of earlier forwards keep what they were made with:
 * the backward of an FP8 forward is FP8 and needs FP8 quantizers still,
 * of a recipe its operands meet. Taking FP8 away, or a recipe that does
 * not combine with the forward's, makes that backward fail
 * (%GMLP_ERROR_INVALID_STATE, %GMLP_ERROR_UNSUPPORTED) before it writes
 * anything, the saved activations unused: it runs once a fitting recipe is
 * set again.
 *
 * Not ordered with forwards and backwards running on other threads: set
 * it between steps.
 *
 * Returns: %TRUE on success; %FALSE with %GMLP_ERROR_INVALID_ARGUMENT for
 *   an unknown recipe or format, or %GMLP_ERROR_UNSUPPORTED for sizes or a
 *   format the FP8 products do not take; neither the experts nor the shared
 *   expert is changed then
 *
 * Since: 0.1
 */
gboolean
gmlp_moe_layer_set_fp8_recipe (GmlpMoELayer       *self,
                               GmlpScalingRecipe   recipe,
                               GmlpFp8Format       format,
                               GError            **error)
{
  g_return_val_if_fail (GMLP_IS_MOE_LAYER (self), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_check_constructed (self, self->construct_error, error) ||
      !apply_fp8_recipe (self, recipe, format, error))
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
 * gmlp_moe_layer_get_fp8_recipe:
 * @self: a #GmlpMoELayer
 *
 * Gets the FP8 scaling recipe of the experts' products.
 *
 * Returns: the value of [property@Gmlp.MoELayer:fp8-recipe]
 *
 * Since: 0.1
 */
GmlpScalingRecipe
gmlp_moe_layer_get_fp8_recipe (GmlpMoELayer *self)
{
  g_return_val_if_fail (GMLP_IS_MOE_LAYER (self), GMLP_SCALING_RECIPE_NONE);
  return self->fp8_recipe;
}

/**
 * gmlp_moe_layer_get_fp8_format:
 * @self: a #GmlpMoELayer
 *
 * Gets the FP8 formats of the experts' products.
 *
 * Returns: the value of [property@Gmlp.MoELayer:fp8-format]
 *
 * Since: 0.1
 */
GmlpFp8Format
gmlp_moe_layer_get_fp8_format (GmlpMoELayer *self)
{
  g_return_val_if_fail (GMLP_IS_MOE_LAYER (self), GMLP_FP8_FORMAT_HYBRID);
  return self->fp8_format;
}

/**
 * gmlp_moe_layer_update_quantizers:
 * @self: a #GmlpMoELayer
 * @error: return location for a #GError
 *
 * Ends a training step for the quantizers of the routed experts and of the
 * shared expert: [method@Gmlp.GroupedMLP.update_quantizers] on each.
 * Delayed scaling needs it once a step, after the step's last backward
 * (and backward_dw); the other recipes have nothing to update.
 * Stream-ordered; nothing waits. Only a device error can make it fail.
 *
 * Returns: %TRUE on success (also without quantizers)
 *
 * Since: 0.1
 */
gboolean
gmlp_moe_layer_update_quantizers (GmlpMoELayer  *self,
                                  GError       **error)
{
  g_return_val_if_fail (GMLP_IS_MOE_LAYER (self), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_check_constructed (self, self->construct_error, error))
    return FALSE;

  return gmlp_grouped_mlp_update_quantizers (self->experts, error) &&
         (self->shared == NULL || gmlp_grouped_mlp_update_quantizers (self->shared, error));
}
