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
#include "gmlp-grouped-tensor-private.h"
#include "gmlp-offload-context-private.h"
#include "gmlp-saved-activations-private.h"

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

  GQueue              pending;     /* of PendingWgrad, oldest first */
  gboolean            wgrad_valid;
  gboolean            grad_added_to_main_grad;
};

typedef struct {
  GmlpGroupedTensor *input;
  GmlpGroupedTensor *grad_output;
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
pending_wgrad_free (gpointer data)
{
  PendingWgrad *pending = data;

  g_object_unref (pending->input);
  g_object_unref (pending->grad_output);
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
  g_clear_object (&self->device);

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
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
    }
}

static void
gmlp_grouped_linear_class_init (GmlpGroupedLinearClass *klass)
{
  GObjectClass *object_class = G_OBJECT_CLASS (klass);
  const GParamFlags construct = G_PARAM_READWRITE | G_PARAM_CONSTRUCT_ONLY |
                                G_PARAM_EXPLICIT_NOTIFY | G_PARAM_STATIC_STRINGS;
  const GParamFlags readable = G_PARAM_READABLE | G_PARAM_EXPLICIT_NOTIFY | G_PARAM_STATIC_STRINGS;

  object_class->finalize = gmlp_grouped_linear_finalize;
  object_class->get_property = gmlp_grouped_linear_get_property;
  object_class->set_property = gmlp_grouped_linear_set_property;

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
    g_param_spec_int64 ("in-features", NULL, NULL, 0, G_MAXINT32, 1, construct);

  /**
   * GmlpGroupedLinear:out-features:
   *
   * The number of output features (columns of the output).
   *
   * Since: 0.1
   */
  properties[PROP_OUT_FEATURES] =
    g_param_spec_int64 ("out-features", NULL, NULL, 0, G_MAXINT32, 1, construct);

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

static gboolean
gmlp_grouped_linear_initable_init (GInitable     *initable,
                                   GCancellable  *cancellable,
                                   GError       **error)
{
  GmlpGroupedLinear *self = GMLP_GROUPED_LINEAR (initable);
  g_autoptr(GmlpGroupedTensor) weight = NULL;
  g_autoptr(GmlpGroupedTensor) bias = NULL;
  g_autoptr(GmlpGroupedTensor) main_grad = NULL;

  if (self->device == NULL)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT, "GroupedLinear needs a device");
      return FALSE;
    }
  if (self->n_groups == 0 || self->n_groups > GMLP_MAX_GROUPS)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "GroupedLinear has 1 to %d groups, not %u", GMLP_MAX_GROUPS, self->n_groups);
      return FALSE;
    }
  if (self->in_features <= 0 || self->out_features <= 0)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "GroupedLinear features must be positive, not %" G_GINT64_FORMAT " → %"
                   G_GINT64_FORMAT, self->in_features, self->out_features);
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
 * with g_initable_new(). The parameters are initialised with seed 0 (see
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

  bound = 1.0 / sqrt ((double) self->in_features);
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

  return set_from_bytes (self, self->weight.grouped, bytes, "The weight", error);
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

  if (n_groups != self->n_groups)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "The mask has %u entries; the layer has %u groups", n_groups, self->n_groups);
      return FALSE;
    }
  for (g = 0; g < n_groups; g++)
    self->accumulate[g] = accumulate[g] ? 1 : 0;
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

/**
 * gmlp_grouped_linear_set_main_grad:
 * @self: a #GmlpGroupedLinear with fused accumulation and a single grouped
 *   weight
 * @main_grad: a float32 grouped tensor of `n_groups` members of
 *   `out_features × in_features` on the layer's device
 * @error: return location for a #GError
 *
 * Makes fused accumulation add into @main_grad (for example a slice of an
 * optimizer's flat gradient buffer) instead of the layer's own.
 *
 * Returns: %TRUE on success; %FALSE with %GMLP_ERROR_INVALID_STATE when the
 *   layer does not fuse accumulation or has per-group weights, or a shape or
 *   dtype error
 *
 * Since: 0.1
 */
gboolean
gmlp_grouped_linear_set_main_grad (GmlpGroupedLinear  *self,
                                   GmlpGroupedTensor  *main_grad,
                                   GError            **error)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), FALSE);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (main_grad), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!check_main_grad (self, main_grad, self->n_groups, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT, error))
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
 * Makes fused accumulation of group @index add into @main_grad.
 *
 * Returns: %TRUE on success, or %FALSE with an error as for
 *   [method@Gmlp.GroupedLinear.set_main_grad], or
 *   %GMLP_ERROR_INVALID_ARGUMENT for an @index out of range
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

  if (!check_main_grad (self, main_grad, 1, 0, error))
    return FALSE;
  if (index >= self->n_groups)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "Group %u out of range: the layer has %u", index, self->n_groups);
      return FALSE;
    }

  g_set_object (&self->main_grad.members[index], main_grad);
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
        .ab_dtype = (int) self->dtype,
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
      .ab_dtype = (int) self->dtype,
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

/* One weight-gradient computation: dW = dyᵀ x (into wgrad or main_grad) and
 * db = Σ dy, then wgrad-ready. */
static gboolean
compute_wgrad (GmlpGroupedLinear  *self,
               GmlpGroupedTensor  *input,
               GmlpGroupedTensor  *grad_output,
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

  if (!run_product (self, &wgrad, error))
    return FALSE;
  if (self->bias.grouped != NULL && !run_bias_grad (self, input, grad_output, error))
    return FALSE;

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
 * Returns: (transfer full): the input gradient, or %NULL with
 *   %GMLP_ERROR_INVALID_ARGUMENT for activations of another layer or an
 *   output gradient whose sizes are on the host when the input's were not
 *   (or the other way round), %GMLP_ERROR_INVALID_STATE for activations
 *   already used, %GMLP_ERROR_SHAPE_MISMATCH for other group sizes or
 *   another row capacity, or a dtype or device error (nothing is written
 *   then)
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_linear_backward (GmlpGroupedLinear     *self,
                              GmlpSavedActivations  *saved,
                              GmlpGroupedTensor     *grad_output,
                              GError               **error)
{
  g_autoptr(GmlpGroupedTensor) grad_input = NULL;
  GmlpGroupedTensor *input;
  Product dgrad = { .kind = GMLP_GEMM_DGRAD };

  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), NULL);
  g_return_val_if_fail (GMLP_IS_SAVED_ACTIVATIONS (saved), NULL);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (grad_output), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!gmlp_saved_activations_check (saved, self->id, "GroupedLinear", error) ||
      !check_activation (self, grad_output, self->out_features, "The output gradient", error))
    return NULL;

  input = gmlp_saved_activations_get (saved, "input", error);
  if (input == NULL)
    return NULL;
  if (gmlp_saved_activations_get_context (saved) != NULL)
    gmlp_offload_context_backward_started (gmlp_saved_activations_get_context (saved), saved);
  if (!check_same_sizes (input, grad_output, error))
    return NULL;

  grad_input = new_activation_like (self, input, self->in_features, error);
  if (grad_input == NULL || !ensure_wgrad_storage (self, error))
    return NULL;

  dgrad.sized_by = input;
  dgrad.a = grad_output;
  dgrad.c_rows = grad_input;
  dgrad.fixed = &self->weight;
  dgrad.c_dtype = self->dtype;
  if (!run_product (self, &dgrad, error))
    return NULL;

  if (has_flag (self, GMLP_LINEAR_DELAY_WGRAD_COMPUTE))
    {
      PendingWgrad *pending = g_new (PendingWgrad, 1);

      pending->input = g_object_ref (input);
      pending->grad_output = g_object_ref (grad_output);
      g_queue_push_tail (&self->pending, pending);
      g_object_notify_by_pspec (G_OBJECT (self), properties[PROP_PENDING_WGRADS]);
    }
  else if (!compute_wgrad (self, input, grad_output, error))
    {
      return NULL;
    }

  gmlp_saved_activations_consume (saved);
  return g_steal_pointer (&grad_input);
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
 * Returns: %TRUE on success; %FALSE with %GMLP_ERROR_INVALID_STATE when the
 *   layer does not delay weight gradients or none is pending
 *
 * Since: 0.1
 */
gboolean
gmlp_grouped_linear_backward_dw (GmlpGroupedLinear  *self,
                                 GError            **error)
{
  PendingWgrad *pending;
  gboolean ok;

  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!has_flag (self, GMLP_LINEAR_DELAY_WGRAD_COMPUTE))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE,
                   "backward_dw() needs delay-wgrad-compute: backward() computed the weight gradients");
      return FALSE;
    }
  if (g_queue_is_empty (&self->pending))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE,
                   "No backward is waiting for its weight gradients");
      return FALSE;
    }
  if (!ensure_wgrad_storage (self, error))
    return FALSE;

  pending = g_queue_pop_head (&self->pending);
  ok = compute_wgrad (self, pending->input, pending->grad_output, error);
  pending_wgrad_free (pending);
  g_object_notify_by_pspec (G_OBJECT (self), properties[PROP_PENDING_WGRADS]);
  return ok;
}

/**
 * gmlp_grouped_linear_get_pending_wgrads:
 * @self: a #GmlpGroupedLinear
 *
 * Returns: the value of [property@Gmlp.GroupedLinear:pending-wgrads]
 *
 * Since: 0.1
 */
guint
gmlp_grouped_linear_get_pending_wgrads (GmlpGroupedLinear *self)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_LINEAR (self), 0);

  return self->pending.length;
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
  g_return_val_if_fail (index < self->n_groups, NULL);

  if (has_flag (self, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT) || !valid || param->members == NULL)
    return NULL;
  return param->members[index];
}

/**
 * gmlp_grouped_linear_get_weight:
 * @self: a #GmlpGroupedLinear
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
