/* gmlp-router.c: the GmlpRouter object
 *
 * Its type, properties and signal, its construction, its parameters and
 * the accessors. What it computes is in gmlp-router-compute.c;
 * gmlp-router-impl.h has what the two share.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <math.h>

#include "gmlp-router-impl.h"
#include "gmlp-dtype-private.h"
#include "gmlp-enum-types.h"
#include "gmlp-error.h"
#include "gmlp-error-private.h"
#include "gmlp-event-private.h"
#include "gmlp-grouped-linear-private.h"
#include "gmlp-grouped-tensor-private.h"
#include "gmlp-saved-activations-private.h"
#include "gmlp-thread-private.h"

/**
 * GmlpRouter:
 *
 * The gate of a Mixture-of-Experts layer: it chooses, for each of `T`
 * tokens, `k` of `n_experts` experts and the weight of each choice, and
 * returns them as a [class@Gmlp.Routing].
 *
 * The gate weight `W` is a one-group FP32 tensor of `n_experts × hidden`
 * ([method@Gmlp.Router.get_weight], laid out as a linear layer's weight,
 * out × in), and the logits are `x Wᵀ`, computed in FP32 whatever the
 * input's dtype (FP32, FP16 or BF16). A BF16 input is multiplied as it is,
 * on BF16 tensor cores: every FP32 operand of the gate's products (`W`,
 * the logits' gradient) is split into three BF16 parts that hold it to its
 * last bit, so that the products are as accurate as FP32 ones, with no
 * FP32 copy of the input; an FP16 input is converted to FP32. `W`'s parts
 * (6 × n_experts × hidden BF16 values) are kept from one product to the
 * next until `W` is written through the API (an optimizer step with
 * [method@Gmlp.GroupedTensor.add_scaled], for example); a weight shared
 * through DLPack, or on a device that has captured a graph, is split for
 * every product, as it may be written where the router cannot see. From the
 * logits of a token, in FP32:
 *
 * - scores ([property@Gmlp.Router:score-function]): the softmax of all its
 *   logits, or the sigmoid of each;
 * - selection: the `k` experts of the highest selection values, best first;
 *   a value is the expert's score, or with the softmax and
 *   [property@Gmlp.Router:softmax-before-topk] off its logit, plus its
 *   entry of the expert bias when [property@Gmlp.Router:expert-bias] is set.
 *   Equal values go to the lower expert index, so the routing is
 *   deterministic;
 * - group-limited routing ([property@Gmlp.Router:n-expert-groups],
 *   [property@Gmlp.Router:topk-groups], as DeepSeek-V3): the experts are in
 *   groups of consecutive indices, each group scores the sum of its best two
 *   selection values (its best one when it has one expert), and only the
 *   experts of the token's best topk-groups groups are candidates;
 * - probabilities: the scores of the chosen experts (never biased), divided
 *   by their sum plus 1e-20 with [property@Gmlp.Router:renormalize]; with
 *   the softmax after the top-k, the softmax of the chosen logits (which
 *   sums to 1 already); then times [property@Gmlp.Router:scaling-factor].
 *
 * [ctor@Gmlp.Router.new] gives Mixtral's routing: the softmax over all
 * experts, the top-k of those probabilities, renormalized to sum to 1 per
 * token; no groups, no bias, no auxiliary loss. Every other option is a
 * construct property ([ctor@GObject.Object.new] with them gives a complete
 * router, or a router that reports why not from [iface@Gio.Initable]'s init
 * and from every method).
 *
 * The routing also holds, as device tensors that nothing reads on the host
 * until the caller does: how many of the `T × k` choices went to each expert
 * ([method@Gmlp.Routing.get_tokens_per_expert]), the load-balancing loss
 * ([property@Gmlp.Router:aux-loss-coeff], the Switch/GShard form `aux =
 * coeff × E × Σ_i f_i P_i`, `f_i` the fraction of the choices that went to
 * expert `i` and `P_i` the mean over the tokens of its probability in the
 * token's full distribution: the softmax of its logits, or its sigmoid
 * scores divided by their sum plus 1e-20) and the z-loss
 * ([property@Gmlp.Router:z-loss-coeff], `coeff × mean_t
 * (logsumexp_j logits[t, j])²`).
 *
 * ## Backward
 *
 * [method@Gmlp.Router.backward] takes the gradient of the probabilities
 * (`T × k` FP32: what the combine's backward of the token permutation
 * gives) and
 * returns the input gradient, in the input's dtype; the gradient of the
 * logits it goes through is that of `Σ grad_probs · probs + aux + z`, the
 * choices and the counts held fixed (they are piecewise constant): so a
 * caller who minimises a task loss plus the two auxiliary losses gets the
 * whole gradient from one backward. The gate weight's gradient follows the
 * gradient contract of [class@Gmlp.GroupedLinear] (docs/gradient-contract.md):
 * [property@Gmlp.Router:flags] takes
 * %GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION (the gradient is added into an FP32
 * main_grad, [method@Gmlp.Router.set_main_grad]) and
 * %GMLP_LINEAR_DELAY_WGRAD_COMPUTE ([method@Gmlp.Router.backward_dw]), and
 * [signal@Gmlp.Router::wgrad-ready] is emitted once per weight-gradient
 * computation. The gate product is a one-group FP32
 * [class@Gmlp.GroupedLinear] inside the router, which gives it exactly that
 * contract. The input gradient of a BF16 input is one rounding of an
 * FP32-accurate sum (in [class@Gmlp.MoELayer], of that sum and the sum of
 * the token's rows that the permute's backward adds it to).
 *
 * Saved activations offload under an enabled [class@Gmlp.OffloadContext]
 * as a layer's do, and a backward refuses to run when what its forward read
 * (the input, the gate weight, the routing's indices and counts) has been
 * written since.
 *
 * ## Aux-loss-free balancing
 *
 * With [property@Gmlp.Router:expert-bias] the router has a per-expert FP32
 * bias ([method@Gmlp.Router.get_expert_bias], zero at first) that is added
 * to the scores for the selection only. After a step,
 * [method@Gmlp.Router.update_expert_bias] moves it on the device, without
 * waiting, from the tokens per expert of that step: `bias_i += rate ×
 * sign (mean load − load_i)` ([property@Gmlp.Router:bias-update-rate]).
 *
 * ## Non-finite logits
 *
 * A logit that is NaN ranks below every number in the selection (and NaNs
 * among themselves by index), so every token gets `k` distinct experts in
 * range whatever its logits, and the counts stay exact. With the softmax, a
 * token with a NaN logit, a +∞ logit or only −∞ logits has NaN scores, hence
 * NaN probabilities; the sigmoid of ±∞ is 1 or 0. The losses are then NaN
 * too (they are 0, exactly, when their coefficient is 0). A BF16 input
 * that holds ±∞ may give its token NaN logits where an FP32 input would
 * give ±∞: the gate multiplies it by each BF16 part of `W`, whose signs
 * may differ, and ∞ × 0 is NaN.
 *
 * On CUDA the router follows the same rules, in FP32 per token, but adds a
 * token's terms over its experts in another order and with CUDA's expf():
 * its results agree with the CPU's within a few ulps (the indices and
 * counts exactly, unless two candidates' values are that close), and each
 * run gives the same bits.
 *
 * ## Threads
 *
 * As for [class@Gmlp.GroupedLinear]: forwards run concurrently (they only
 * read the gate weight and the expert bias); the weight-gradient
 * computations (backward and backward_dw) run one at a time, and
 * [signal@Gmlp.Router::wgrad-ready] is emitted on the thread that computed
 * the gradients. Each saved activations object serves one backward.
 * Replacing the weight or the bias (init_parameters, the set_*_from_bytes
 * calls, update_expert_bias, an optimizer step) is not ordered with
 * forwards and backwards that run meanwhile: do it between steps. Calls
 * that write the expert bias take turns.
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
 * router = Gmlp.Router.new(dev, 32, 8, 2)        # hidden 32, 8 experts, top-2
 * router.init_parameters(1)
 * x = Gmlp.GroupedTensor.new(dev, Gmlp.DType.FLOAT32, [16], 32)
 * x.fill_random(1, 1.0)
 * routing, saved = router.forward(x)
 * print(routing.get_n_tokens(), routing.get_top_k(), routing.get_n_experts())
 * ```
 *
 * In JavaScript (gjs; run with `gjs -m`):
 *
 * ```js
 * import GLib from 'gi://GLib';
 * import Gmlp from 'gi://Gmlp?version=1.0';
 *
 * const dev = Gmlp.Device.new_from_string('cpu');
 * const router = Gmlp.Router.new(dev, 32, 8, 2);  // hidden 32, 8 experts, top-2
 * router.init_parameters(1);
 * const x = Gmlp.GroupedTensor.new(dev, Gmlp.DType.FLOAT32, [16], 32);
 * x.fill_random(1, 1.0);
 * const [routing, saved] = router.forward(x);
 * print(routing.get_n_tokens(), routing.get_top_k(), routing.get_n_experts());
 * ```
 *
 * Since: 0.1
 */

#define MAX_TOP_K 16

static void gmlp_router_initable_iface_init (GInitableIface *iface);

G_DEFINE_FINAL_TYPE_WITH_CODE (GmlpRouter, gmlp_router, G_TYPE_OBJECT,
                               G_IMPLEMENT_INTERFACE (G_TYPE_INITABLE,
                                                      gmlp_router_initable_iface_init))

enum {
  PROP_0,
  PROP_DEVICE,
  PROP_HIDDEN,
  PROP_N_EXPERTS,
  PROP_TOP_K,
  PROP_SCORE_FUNCTION,
  PROP_SOFTMAX_BEFORE_TOPK,
  PROP_RENORMALIZE,
  PROP_SCALING_FACTOR,
  PROP_N_EXPERT_GROUPS,
  PROP_TOPK_GROUPS,
  PROP_EXPERT_BIAS,
  PROP_BIAS_UPDATE_RATE,
  PROP_AUX_LOSS_COEFF,
  PROP_Z_LOSS_COEFF,
  PROP_FLAGS,
  PROP_PENDING_WGRADS,
  PROP_GRAD_ADDED_TO_MAIN_GRAD,
  N_PROPS
};

enum {
  SIGNAL_WGRAD_READY,
  N_SIGNALS
};

static GParamSpec *properties[N_PROPS];
static guint signals[N_SIGNALS];

static void
gmlp_router_finalize (GObject *object)
{
  GmlpRouter *self = (GmlpRouter *) object;

  g_clear_object (&self->gate);
  g_clear_object (&self->expert_bias);
  g_clear_object (&self->device);
  g_clear_error (&self->construct_error);
  g_rec_mutex_clear (&self->grad_lock);
  g_mutex_clear (&self->bias_lock);

  G_OBJECT_CLASS (gmlp_router_parent_class)->finalize (object);
}

static void
gmlp_router_get_property (GObject    *object,
                          guint       prop_id,
                          GValue     *value,
                          GParamSpec *pspec)
{
  GmlpRouter *self = GMLP_ROUTER (object);

  switch (prop_id)
    {
    case PROP_DEVICE:
      g_value_set_object (value, self->device);
      break;
    case PROP_HIDDEN:
      g_value_set_int64 (value, self->hidden);
      break;
    case PROP_N_EXPERTS:
      g_value_set_uint (value, self->n_experts);
      break;
    case PROP_TOP_K:
      g_value_set_uint (value, self->top_k);
      break;
    case PROP_SCORE_FUNCTION:
      g_value_set_enum (value, self->score_function);
      break;
    case PROP_SOFTMAX_BEFORE_TOPK:
      g_value_set_boolean (value, self->softmax_before_topk);
      break;
    case PROP_RENORMALIZE:
      g_value_set_boolean (value, self->renormalize);
      break;
    case PROP_SCALING_FACTOR:
      g_value_set_double (value, self->scaling_factor);
      break;
    case PROP_N_EXPERT_GROUPS:
      g_value_set_uint (value, self->n_groups);
      break;
    case PROP_TOPK_GROUPS:
      g_value_set_uint (value, self->topk_groups);
      break;
    case PROP_EXPERT_BIAS:
      g_value_set_boolean (value, self->use_expert_bias);
      break;
    case PROP_BIAS_UPDATE_RATE:
      g_value_set_double (value, self->bias_update_rate);
      break;
    case PROP_AUX_LOSS_COEFF:
      g_value_set_double (value, self->aux_loss_coeff);
      break;
    case PROP_Z_LOSS_COEFF:
      g_value_set_double (value, self->z_loss_coeff);
      break;
    case PROP_FLAGS:
      g_value_set_flags (value, self->flags);
      break;
    case PROP_PENDING_WGRADS:
      g_value_set_uint (value, gmlp_router_get_pending_wgrads (self));
      break;
    case PROP_GRAD_ADDED_TO_MAIN_GRAD:
      g_value_set_boolean (value, gmlp_router_get_grad_added_to_main_grad (self));
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
    }
}

/* All construct-only: constructed() checks them together. */
static void
gmlp_router_set_property (GObject      *object,
                          guint         prop_id,
                          const GValue *value,
                          GParamSpec   *pspec)
{
  GmlpRouter *self = GMLP_ROUTER (object);

  switch (prop_id)
    {
    case PROP_DEVICE:
      self->device = g_value_dup_object (value);
      break;
    case PROP_HIDDEN:
      self->hidden = g_value_get_int64 (value);
      break;
    case PROP_N_EXPERTS:
      self->n_experts = g_value_get_uint (value);
      break;
    case PROP_TOP_K:
      self->top_k = g_value_get_uint (value);
      break;
    case PROP_SCORE_FUNCTION:
      self->score_function = g_value_get_enum (value);
      break;
    case PROP_SOFTMAX_BEFORE_TOPK:
      self->softmax_before_topk = g_value_get_boolean (value);
      break;
    case PROP_RENORMALIZE:
      self->renormalize = g_value_get_boolean (value);
      break;
    case PROP_SCALING_FACTOR:
      self->scaling_factor = g_value_get_double (value);
      break;
    case PROP_N_EXPERT_GROUPS:
      self->n_groups = g_value_get_uint (value);
      break;
    case PROP_TOPK_GROUPS:
      self->topk_groups = g_value_get_uint (value);
      break;
    case PROP_EXPERT_BIAS:
      self->use_expert_bias = g_value_get_boolean (value);
      break;
    case PROP_BIAS_UPDATE_RATE:
      self->bias_update_rate = g_value_get_double (value);
      break;
    case PROP_AUX_LOSS_COEFF:
      self->aux_loss_coeff = g_value_get_double (value);
      break;
    case PROP_Z_LOSS_COEFF:
      self->z_loss_coeff = g_value_get_double (value);
      break;
    case PROP_FLAGS:
      self->flags = g_value_get_flags (value);
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
    }
}

static void gmlp_router_constructed (GObject *object);

static void
gmlp_router_class_init (GmlpRouterClass *klass)
{
  GObjectClass *object_class = G_OBJECT_CLASS (klass);
  const GParamFlags construct = G_PARAM_READWRITE | G_PARAM_CONSTRUCT_ONLY |
                                G_PARAM_EXPLICIT_NOTIFY | G_PARAM_STATIC_STRINGS;
  const GParamFlags readable = G_PARAM_READABLE | G_PARAM_EXPLICIT_NOTIFY | G_PARAM_STATIC_STRINGS;

  object_class->constructed = gmlp_router_constructed;
  object_class->finalize = gmlp_router_finalize;
  object_class->get_property = gmlp_router_get_property;
  object_class->set_property = gmlp_router_set_property;

  /* The ranges are wide on purpose: a bad value is a GError of the
   * construction, not a warning of GObject's. */

  /**
   * GmlpRouter:device:
   *
   * The device the gate lives on and the routing is computed on.
   *
   * Since: 0.1
   */
  properties[PROP_DEVICE] =
    g_param_spec_object ("device", NULL, NULL, GMLP_TYPE_DEVICE, construct);

  /**
   * GmlpRouter:hidden:
   *
   * The width of a token (the columns of the input), 1 to 2^31 − 1.
   *
   * Since: 0.1
   */
  properties[PROP_HIDDEN] =
    g_param_spec_int64 ("hidden", NULL, NULL, G_MININT64, G_MAXINT64, 1, construct);

  /**
   * GmlpRouter:n-experts:
   *
   * The number of experts, `E`, 1 to 65535.
   *
   * Since: 0.1
   */
  properties[PROP_N_EXPERTS] =
    g_param_spec_uint ("n-experts", NULL, NULL, 0, G_MAXUINT, 1, construct);

  /**
   * GmlpRouter:top-k:
   *
   * The number of experts each token chooses, `k`: 1 to 16, and at most
   * [property@Gmlp.Router:n-experts].
   *
   * Since: 0.1
   */
  properties[PROP_TOP_K] =
    g_param_spec_uint ("top-k", NULL, NULL, 0, G_MAXUINT, 1, construct);

  /**
   * GmlpRouter:score-function:
   *
   * How the logits become scores.
   *
   * Since: 0.1
   */
  properties[PROP_SCORE_FUNCTION] =
    g_param_spec_enum ("score-function", NULL, NULL, GMLP_TYPE_SCORE_FUNCTION,
                       GMLP_SCORE_FUNCTION_SOFTMAX, construct);

  /**
   * GmlpRouter:softmax-before-topk:
   *
   * With the softmax: whether the top-k is taken of the softmax over all
   * experts (%TRUE, Mixtral's) or of the logits, the chosen logits then
   * going through a softmax of their own (%FALSE). Ignored with the
   * sigmoid.
   *
   * Since: 0.1
   */
  properties[PROP_SOFTMAX_BEFORE_TOPK] =
    g_param_spec_boolean ("softmax-before-topk", NULL, NULL, TRUE, construct);

  /**
   * GmlpRouter:renormalize:
   *
   * Whether the scores of a token's chosen experts are divided by their
   * sum (plus 1e-20), so that its probabilities sum to the scaling factor.
   * Without effect when the softmax comes after the top-k.
   *
   * Since: 0.1
   */
  properties[PROP_RENORMALIZE] =
    g_param_spec_boolean ("renormalize", NULL, NULL, TRUE, construct);

  /**
   * GmlpRouter:scaling-factor:
   *
   * What the probabilities are multiplied by last; finite and not
   * negative.
   *
   * Since: 0.1
   */
  properties[PROP_SCALING_FACTOR] =
    g_param_spec_double ("scaling-factor", NULL, NULL, -INFINITY, INFINITY, 1.0, construct);

  /**
   * GmlpRouter:n-expert-groups:
   *
   * The number of groups of experts for group-limited routing (each of
   * `n_experts / n_groups` consecutive experts; it must divide
   * [property@Gmlp.Router:n-experts]), or 0 for none.
   *
   * Since: 0.1
   */
  properties[PROP_N_EXPERT_GROUPS] =
    g_param_spec_uint ("n-expert-groups", NULL, NULL, 0, G_MAXUINT, 0, construct);

  /**
   * GmlpRouter:topk-groups:
   *
   * With groups, how many groups a token may choose its experts from: 1
   * to [property@Gmlp.Router:n-expert-groups], and with enough experts in
   * them for [property@Gmlp.Router:top-k]; 0 without groups.
   *
   * Since: 0.1
   */
  properties[PROP_TOPK_GROUPS] =
    g_param_spec_uint ("topk-groups", NULL, NULL, 0, G_MAXUINT, 0, construct);

  /**
   * GmlpRouter:expert-bias:
   *
   * Whether the router has a per-expert bias, added to the scores for the
   * selection only (aux-loss-free balancing; see
   * [method@Gmlp.Router.update_expert_bias]).
   *
   * Since: 0.1
   */
  properties[PROP_EXPERT_BIAS] =
    g_param_spec_boolean ("expert-bias", NULL, NULL, FALSE, construct);

  /**
   * GmlpRouter:bias-update-rate:
   *
   * The step of [method@Gmlp.Router.update_expert_bias]; finite and not
   * negative.
   *
   * Since: 0.1
   */
  properties[PROP_BIAS_UPDATE_RATE] =
    g_param_spec_double ("bias-update-rate", NULL, NULL, -INFINITY, INFINITY, 1e-3, construct);

  /**
   * GmlpRouter:aux-loss-coeff:
   *
   * The coefficient of the load-balancing loss, 0 for none; finite and not
   * negative.
   *
   * Since: 0.1
   */
  properties[PROP_AUX_LOSS_COEFF] =
    g_param_spec_double ("aux-loss-coeff", NULL, NULL, -INFINITY, INFINITY, 0.0, construct);

  /**
   * GmlpRouter:z-loss-coeff:
   *
   * The coefficient of the z-loss, 0 for none; finite and not negative.
   *
   * Since: 0.1
   */
  properties[PROP_Z_LOSS_COEFF] =
    g_param_spec_double ("z-loss-coeff", NULL, NULL, -INFINITY, INFINITY, 0.0, construct);

  /**
   * GmlpRouter:flags:
   *
   * The gradient options of the gate weight:
   * %GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION and
   * %GMLP_LINEAR_DELAY_WGRAD_COMPUTE, as for a [class@Gmlp.GroupedLinear]
   * (%GMLP_LINEAR_SINGLE_GROUPED_WEIGHT is allowed and changes nothing: the
   * gate is one tensor). Other flags are refused.
   *
   * Since: 0.1
   */
  properties[PROP_FLAGS] =
    g_param_spec_flags ("flags", NULL, NULL, GMLP_TYPE_LINEAR_FLAGS, GMLP_LINEAR_NONE, construct);

  /**
   * GmlpRouter:pending-wgrads:
   *
   * How many delayed backwards wait for [method@Gmlp.Router.backward_dw].
   *
   * Since: 0.1
   */
  properties[PROP_PENDING_WGRADS] =
    g_param_spec_uint ("pending-wgrads", NULL, NULL, 0, G_MAXUINT, 0, readable);

  /**
   * GmlpRouter:grad-added-to-main-grad:
   *
   * Whether the last weight-gradient computation added into main_grad, as
   * [property@Gmlp.GroupedLinear:grad-added-to-main-grad].
   *
   * Since: 0.1
   */
  properties[PROP_GRAD_ADDED_TO_MAIN_GRAD] =
    g_param_spec_boolean ("grad-added-to-main-grad", NULL, NULL, FALSE, readable);

  g_object_class_install_properties (object_class, N_PROPS, properties);

  /**
   * GmlpRouter::wgrad-ready:
   * @self: the router
   * @event: completes when the gate weight's gradient is computed
   *
   * Emitted once per weight-gradient computation (in backward, or in
   * backward_dw when delayed), on the calling thread, once the gradient's
   * work is enqueued. See [signal@Gmlp.GroupedLinear::wgrad-ready].
   *
   * Since: 0.1
   */
  signals[SIGNAL_WGRAD_READY] =
    g_signal_new ("wgrad-ready", G_TYPE_FROM_CLASS (klass), G_SIGNAL_RUN_LAST, 0,
                  NULL, NULL, NULL, G_TYPE_NONE, 1, GMLP_TYPE_EVENT);
}

static void
gmlp_router_init (GmlpRouter *self)
{
  self->hidden = 1;
  self->n_experts = 1;
  self->top_k = 1;
  self->score_function = GMLP_SCORE_FUNCTION_SOFTMAX;
  self->softmax_before_topk = TRUE;
  self->renormalize = TRUE;
  self->scaling_factor = 1.0;
  self->bias_update_rate = 1e-3;
  g_rec_mutex_init (&self->grad_lock);
  g_mutex_init (&self->bias_lock);
}

/* The gate's two properties, as the router's own. */
static void
relay_notify (GmlpRouter *self,
              GParamSpec *pspec)
{
  if (g_str_equal (pspec->name, "pending-wgrads"))
    g_object_notify_by_pspec (G_OBJECT (self), properties[PROP_PENDING_WGRADS]);
  else
    g_object_notify_by_pspec (G_OBJECT (self), properties[PROP_GRAD_ADDED_TO_MAIN_GRAD]);
}

static gboolean
check_options (GmlpRouter  *self,
               GError     **error)
{
  const GmlpLinearFlags allowed = GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION |
                                  GMLP_LINEAR_DELAY_WGRAD_COMPUTE |
                                  GMLP_LINEAR_SINGLE_GROUPED_WEIGHT;
  GmlpBackendRouter *o = &self->options;

  if (self->hidden <= 0 || self->hidden > G_MAXINT32)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "Router: hidden must be between 1 and %d, not %" G_GINT64_FORMAT,
                   G_MAXINT32, self->hidden);
      return FALSE;
    }
  if (self->n_experts == 0 || self->n_experts > GMLP_MAX_GROUPS)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "Router: n-experts must be between 1 and %d, not %u", GMLP_MAX_GROUPS,
                   self->n_experts);
      return FALSE;
    }
  if (self->top_k == 0 || self->top_k > MAX_TOP_K || self->top_k > self->n_experts)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "Router: top-k must be between 1 and %u (16, and at most the %u experts), "
                   "not %u", MIN (MAX_TOP_K, self->n_experts), self->n_experts, self->top_k);
      return FALSE;
    }
  if ((guint) self->score_function > GMLP_SCORE_FUNCTION_SIGMOID)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "Router: unknown score function %d", (int) self->score_function);
      return FALSE;
    }
  if (self->topk_groups > self->n_groups)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "Router: topk-groups (%u) is more than n-expert-groups (%u)",
                   self->topk_groups, self->n_groups);
      return FALSE;
    }
  if (self->n_groups > 0)
    {
      if (self->n_experts % self->n_groups != 0)
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                       "Router: %u experts do not divide into %u groups", self->n_experts,
                       self->n_groups);
          return FALSE;
        }
      if (self->topk_groups == 0)
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                       "Router: with %u expert groups, topk-groups must be 1 to %u, not 0",
                       self->n_groups, self->n_groups);
          return FALSE;
        }
      if (self->top_k > self->topk_groups * (self->n_experts / self->n_groups))
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                       "Router: top-k %u is more than the %u experts of the best %u groups",
                       self->top_k, self->topk_groups * (self->n_experts / self->n_groups),
                       self->topk_groups);
          return FALSE;
        }
    }
  if ((self->flags & ~allowed) != 0)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "Router: flags 0x%x are not gradient options of the gate (the router takes "
                   "fuse-wgrad-accumulation and delay-wgrad-compute)",
                   (guint) (self->flags & ~allowed));
      return FALSE;
    }

  *o = (GmlpBackendRouter) {
    .n_experts = self->n_experts,
    .top_k = self->top_k,
    .score_function = (int) self->score_function,
    .softmax_before_topk = self->softmax_before_topk,
    .renormalize = self->renormalize,
    .n_groups = self->n_groups,
    .topk_groups = self->topk_groups,
  };
  return gmlp_dtype_narrow_double (self->scaling_factor, "Router: scaling-factor",
                                   GMLP_NARROW_NOT_NEGATIVE, &o->scaling_factor, error) &&
         gmlp_dtype_narrow_double (self->aux_loss_coeff, "Router: aux-loss-coeff",
                                   GMLP_NARROW_NOT_NEGATIVE, &o->aux_loss_coeff, error) &&
         gmlp_dtype_narrow_double (self->z_loss_coeff, "Router: z-loss-coeff",
                                   GMLP_NARROW_NOT_NEGATIVE, &o->z_loss_coeff, error) &&
         gmlp_dtype_narrow_double (self->bias_update_rate, "Router: bias-update-rate",
                                   GMLP_NARROW_NOT_NEGATIVE, &self->bias_rate, error);
}

/* The work of construction, once, whatever made the object. */
static gboolean
construct_router (GmlpRouter  *self,
                  GError     **error)
{
  const GmlpBackend *backend;
  GmlpLinearFlags gate_flags;

  if (self->device == NULL)
    self->device = g_object_ref (gmlp_device_get_default ());
  if (!gmlp_device_check_usable (self->device, error) || !check_options (self, error))
    return FALSE;

  /* Before anything is enqueued on a device that cannot route. */
  backend = gmlp_device_get_backend (self->device);
  if (backend->router_forward == NULL || backend->router_backward == NULL ||
      backend->router_update_bias == NULL)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "GmlpRouter is not yet on the %s backend", backend->name);
      return FALSE;
    }

  gate_flags = GMLP_LINEAR_SINGLE_GROUPED_WEIGHT |
               (self->flags & (GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION | GMLP_LINEAR_DELAY_WGRAD_COMPUTE));
  self->gate = gmlp_grouped_linear_new_full (self->device, 1, self->hidden, self->n_experts,
                                             GMLP_DTYPE_FLOAT32, gate_flags, error);
  if (self->gate == NULL)
    return FALSE;
  /* BF16 tokens multiply on BF16 tensor cores, at FP32 accuracy. */
  gmlp_grouped_linear_take_bf16_input (self->gate);
  g_signal_connect_object (self->gate, "notify::pending-wgrads", G_CALLBACK (relay_notify), self,
                           G_CONNECT_SWAPPED);
  g_signal_connect_object (self->gate, "notify::grad-added-to-main-grad", G_CALLBACK (relay_notify),
                           self, G_CONNECT_SWAPPED);

  if (self->use_expert_bias)
    {
      self->expert_bias = gmlp_grouped_tensor_new_uniform (self->device, GMLP_DTYPE_FLOAT32, 1, 1,
                                                           self->n_experts, error);
      if (self->expert_bias == NULL || !gmlp_grouped_tensor_fill_zero (self->expert_bias, error))
        return FALSE;
    }

  self->id = gmlp_layer_id_next ();
  return TRUE;
}

static void
gmlp_router_constructed (GObject *object)
{
  GmlpRouter *self = GMLP_ROUTER (object);

  G_OBJECT_CLASS (gmlp_router_parent_class)->constructed (object);

  /* A half-made router keeps no gate: getters then give NULL. */
  if (!construct_router (self, &self->construct_error))
    {
      g_clear_object (&self->gate);
      g_clear_object (&self->expert_bias);
    }
}

/* Construction happened in constructed(): init only reports it. */
static gboolean
gmlp_router_initable_init (GInitable     *initable,
                           GCancellable  *cancellable,
                           GError       **error)
{
  GmlpRouter *self = GMLP_ROUTER (initable);

  return gmlp_check_constructed (self, self->construct_error, error);
}

static void
gmlp_router_initable_iface_init (GInitableIface *iface)
{
  iface->init = gmlp_router_initable_init;
}

/**
 * gmlp_router_new:
 * @device: the device
 * @hidden: the width of a token
 * @n_experts: the number of experts
 * @top_k: the number of experts each token chooses
 * @error: return location for a #GError
 *
 * Creates a router with Mixtral's routing: the softmax over all experts'
 * logits, the top-k of those probabilities, renormalized to sum to 1 per
 * token; no groups, no expert bias, no auxiliary loss. The gate weight is
 * drawn as by [method@Gmlp.Router.init_parameters] with seed 0. Other
 * options are construct properties (see [class@Gmlp.Router]).
 *
 * Returns: (transfer full): the router, or %NULL with
 *   %GMLP_ERROR_INVALID_ARGUMENT for bad sizes, or
 *   %GMLP_ERROR_UNSUPPORTED on a device whose backend has no router
 *
 * Since: 0.1
 */
GmlpRouter *
gmlp_router_new (GmlpDevice  *device,
                 gint64       hidden,
                 guint        n_experts,
                 guint        top_k,
                 GError     **error)
{
  g_return_val_if_fail (GMLP_IS_DEVICE (device), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  return g_initable_new (GMLP_TYPE_ROUTER, NULL, error,
                         "device", device,
                         "hidden", hidden,
                         "n-experts", n_experts,
                         "top-k", top_k,
                         NULL);
}

gboolean
gmlp_router_emit_wgrad_ready (GmlpRouter  *self,
                              GError     **error)
{
  g_autoptr(GmlpEvent) event = NULL;

  if (!gmlp_event_record_for_signal (self, signals[SIGNAL_WGRAD_READY], self->device, &event, error))
    return FALSE;
  if (event != NULL)
    g_signal_emit (self, signals[SIGNAL_WGRAD_READY], 0, event);
  return TRUE;
}

gboolean
gmlp_router_check_has_expert_bias (GmlpRouter  *self,
                                   GError     **error)
{
  if (self->expert_bias == NULL)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE,
                   "This router has no expert bias (see the expert-bias property)");
      return FALSE;
    }
  return TRUE;
}

/**
 * gmlp_router_init_parameters:
 * @self: a #GmlpRouter
 * @seed: the seed
 * @error: return location for a #GError
 *
 * Draws the gate weight uniformly from ±1/√hidden, reproducibly from @seed
 * on every backend, as [method@Gmlp.GroupedLinear.init_parameters] does.
 * The expert bias is left as it is.
 *
 * Returns: %TRUE on success
 *
 * Since: 0.1
 */
gboolean
gmlp_router_init_parameters (GmlpRouter  *self,
                             guint64      seed,
                             GError     **error)
{
  g_return_val_if_fail (GMLP_IS_ROUTER (self), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_check_constructed (self, self->construct_error, error))
    return FALSE;
  return gmlp_grouped_linear_init_parameters (self->gate, seed, error);
}

/**
 * gmlp_router_set_weight_from_bytes:
 * @self: a #GmlpRouter
 * @bytes: `n_experts × hidden` float32 values, row-major
 * @error: return location for a #GError
 *
 * Replaces the gate weight.
 *
 * Returns: %TRUE on success; %FALSE with %GMLP_ERROR_INVALID_ARGUMENT if the
 *   length of @bytes is wrong (the weight is then unchanged)
 *
 * Since: 0.1
 */
gboolean
gmlp_router_set_weight_from_bytes (GmlpRouter  *self,
                                   GBytes      *bytes,
                                   GError     **error)
{
  g_return_val_if_fail (GMLP_IS_ROUTER (self), FALSE);
  g_return_val_if_fail (bytes != NULL, FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_check_constructed (self, self->construct_error, error))
    return FALSE;
  return gmlp_grouped_linear_set_weight_from_bytes (self->gate, bytes, error);
}

/**
 * gmlp_router_set_expert_bias_from_bytes:
 * @self: a #GmlpRouter with an expert bias
 * @bytes: `n_experts` float32 values
 * @error: return location for a #GError
 *
 * Replaces the expert bias.
 *
 * Returns: %TRUE on success; %FALSE with %GMLP_ERROR_INVALID_STATE for a
 *   router without expert bias, or %GMLP_ERROR_INVALID_ARGUMENT for a wrong
 *   length (the bias is then unchanged)
 *
 * Since: 0.1
 */
gboolean
gmlp_router_set_expert_bias_from_bytes (GmlpRouter  *self,
                                        GBytes      *bytes,
                                        GError     **error)
{
  g_autoptr(GmlpMutexLocker) locker = NULL;
  g_autoptr(GmlpGroupedTensor) staged = NULL;
  gint64 one = 1;

  g_return_val_if_fail (GMLP_IS_ROUTER (self), FALSE);
  g_return_val_if_fail (bytes != NULL, FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_check_constructed (self, self->construct_error, error) ||
      !gmlp_router_check_has_expert_bias (self, error))
    return FALSE;
  if (g_bytes_get_size (bytes) != sizeof (float) * self->n_experts)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "The expert bias needs %" G_GSIZE_FORMAT " bytes (%u float32), not %" G_GSIZE_FORMAT,
                   sizeof (float) * self->n_experts, self->n_experts, g_bytes_get_size (bytes));
      return FALSE;
    }

  staged = gmlp_grouped_tensor_new_from_bytes (self->device, GMLP_DTYPE_FLOAT32, &one, 1,
                                               self->n_experts, bytes, error);
  if (staged == NULL)
    return FALSE;
  locker = gmlp_mutex_locker_new (&self->bias_lock);
  gmlp_grouped_tensor_bump_version (self->expert_bias);
  return GMLP_DEVICE_CALL (self->device, copy, gmlp_grouped_tensor_get_data (self->expert_bias),
                           gmlp_grouped_tensor_get_data (staged), sizeof (float) * self->n_experts,
                           error);
}

/**
 * gmlp_router_set_main_grad:
 * @self: a #GmlpRouter with %GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION
 * @main_grad: a one-group float32 tensor of `n_experts × hidden` on the
 *   router's device
 * @error: return location for a #GError
 *
 * Makes fused accumulation add the gate weight's gradient into @main_grad,
 * as [method@Gmlp.GroupedLinear.set_main_grad] does.
 *
 * Returns: %TRUE on success, or %FALSE with an error as for
 *   [method@Gmlp.GroupedLinear.set_main_grad]
 *
 * Since: 0.1
 */
gboolean
gmlp_router_set_main_grad (GmlpRouter         *self,
                           GmlpGroupedTensor  *main_grad,
                           GError            **error)
{
  g_return_val_if_fail (GMLP_IS_ROUTER (self), FALSE);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (main_grad), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_check_constructed (self, self->construct_error, error))
    return FALSE;
  return gmlp_grouped_linear_set_main_grad (self->gate, main_grad, error);
}

/**
 * gmlp_router_get_weight:
 * @self: a #GmlpRouter
 *
 * Gets the router's gate weight, to fill or to read.
 *
 * Returns: (transfer none) (nullable): the gate weight, one group of
 *   `n_experts × hidden` float32; %NULL for a router whose construction
 *   failed
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_router_get_weight (GmlpRouter *self)
{
  g_return_val_if_fail (GMLP_IS_ROUTER (self), NULL);
  return self->gate != NULL ? gmlp_grouped_linear_get_weight (self->gate) : NULL;
}

/**
 * gmlp_router_get_wgrad:
 * @self: a #GmlpRouter
 *
 * Gets the gradient of the gate weight that the last weight-gradient
 * computation wrote.
 *
 * Returns: (transfer none) (nullable): the gate weight's gradient of the
 *   last weight-gradient computation; %NULL before the first one and with
 *   fused accumulation
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_router_get_wgrad (GmlpRouter *self)
{
  g_return_val_if_fail (GMLP_IS_ROUTER (self), NULL);
  return self->gate != NULL ? gmlp_grouped_linear_get_wgrad (self->gate) : NULL;
}

/**
 * gmlp_router_get_main_grad:
 * @self: a #GmlpRouter
 *
 * Gets the FP32 tensor that gate-weight gradients are accumulated into.
 *
 * Returns: (transfer none) (nullable): the FP32 gradient accumulator of the
 *   gate weight (the router's, or the one bound with
 *   [method@Gmlp.Router.set_main_grad]); %NULL without fused accumulation
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_router_get_main_grad (GmlpRouter *self)
{
  g_return_val_if_fail (GMLP_IS_ROUTER (self), NULL);
  return self->gate != NULL ? gmlp_grouped_linear_get_main_grad (self->gate) : NULL;
}

/**
 * gmlp_router_get_expert_bias:
 * @self: a #GmlpRouter
 *
 * Gets the per-expert bias added to the scores for choosing experts
 * (aux-loss-free balancing).
 *
 * Returns: (transfer none) (nullable): the expert bias, one group of
 *   `1 × n_experts` float32; %NULL without
 *   [property@Gmlp.Router:expert-bias]
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_router_get_expert_bias (GmlpRouter *self)
{
  g_return_val_if_fail (GMLP_IS_ROUTER (self), NULL);
  return self->expert_bias;
}

/**
 * gmlp_router_get_device:
 * @self: a #GmlpRouter
 *
 * Gets the device the router's weight lives on and its work runs on.
 *
 * Returns: (transfer none) (nullable): the router's device
 *
 * Since: 0.1
 */
GmlpDevice *
gmlp_router_get_device (GmlpRouter *self)
{
  g_return_val_if_fail (GMLP_IS_ROUTER (self), NULL);
  return self->device;
}

/**
 * gmlp_router_get_hidden:
 * @self: a #GmlpRouter
 *
 * Gets the width of the tokens the router scores.
 *
 * Returns: the width of a token
 *
 * Since: 0.1
 */
gint64
gmlp_router_get_hidden (GmlpRouter *self)
{
  g_return_val_if_fail (GMLP_IS_ROUTER (self), 0);
  return self->hidden;
}

/**
 * gmlp_router_get_n_experts:
 * @self: a #GmlpRouter
 *
 * Gets the number of experts the router chooses among.
 *
 * Returns: the number of experts
 *
 * Since: 0.1
 */
guint
gmlp_router_get_n_experts (GmlpRouter *self)
{
  g_return_val_if_fail (GMLP_IS_ROUTER (self), 0);
  return self->n_experts;
}

/**
 * gmlp_router_get_top_k:
 * @self: a #GmlpRouter
 *
 * Gets the number of experts each token is sent to.
 *
 * Returns: the number of experts each token chooses
 *
 * Since: 0.1
 */
guint
gmlp_router_get_top_k (GmlpRouter *self)
{
  g_return_val_if_fail (GMLP_IS_ROUTER (self), 0);
  return self->top_k;
}

/**
 * gmlp_router_get_score_function:
 * @self: a #GmlpRouter
 *
 * Gets the function (softmax or sigmoid) that turns the logits into scores.
 *
 * Returns: how the logits become scores
 *
 * Since: 0.1
 */
GmlpScoreFunction
gmlp_router_get_score_function (GmlpRouter *self)
{
  g_return_val_if_fail (GMLP_IS_ROUTER (self), GMLP_SCORE_FUNCTION_SOFTMAX);
  return self->score_function;
}

/**
 * gmlp_router_get_flags:
 * @self: a #GmlpRouter
 *
 * Gets the gradient options the router was made with.
 *
 * Returns: the gradient options of the gate
 *
 * Since: 0.1
 */
GmlpLinearFlags
gmlp_router_get_flags (GmlpRouter *self)
{
  g_return_val_if_fail (GMLP_IS_ROUTER (self), GMLP_LINEAR_NONE);
  return self->flags;
}

/**
 * gmlp_router_get_pending_wgrads:
 * @self: a #GmlpRouter
 *
 * Gets how many delayed weight-gradient computations wait for
 * [method@Gmlp.Router.backward_dw].
 *
 * Returns: the value of [property@Gmlp.Router:pending-wgrads]
 *
 * Since: 0.1
 */
guint
gmlp_router_get_pending_wgrads (GmlpRouter *self)
{
  g_return_val_if_fail (GMLP_IS_ROUTER (self), 0);
  return self->gate != NULL ? gmlp_grouped_linear_get_pending_wgrads (self->gate) : 0;
}

/**
 * gmlp_router_get_grad_added_to_main_grad:
 * @self: a #GmlpRouter
 *
 * Tells whether the last weight-gradient computation added into main_grad
 * rather than writing the wgrad tensor.
 *
 * Returns: the value of [property@Gmlp.Router:grad-added-to-main-grad]
 *
 * Since: 0.1
 */
gboolean
gmlp_router_get_grad_added_to_main_grad (GmlpRouter *self)
{
  g_return_val_if_fail (GMLP_IS_ROUTER (self), FALSE);
  return self->gate != NULL && gmlp_grouped_linear_get_grad_added_to_main_grad (self->gate);
}
