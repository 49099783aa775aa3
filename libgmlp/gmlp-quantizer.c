/* gmlp-quantizer.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <math.h>

#include "gmlp-quantizer-private.h"
#include "gmlp-device-private.h"
#include "gmlp-dtype-private.h"
#include "gmlp-enum-types.h"
#include "gmlp-error.h"
#include "gmlp-error-private.h"
#include "gmlp-grouped-tensor-private.h"
#include "gmlp-quantize-numeric.h"
#include "gmlp-thread-private.h"

G_STATIC_ASSERT ((int) GMLP_SCALING_RECIPE_NONE == GMLP_QUANT_NONE);
G_STATIC_ASSERT ((int) GMLP_SCALING_RECIPE_DELAYED == GMLP_QUANT_DELAYED);
G_STATIC_ASSERT ((int) GMLP_SCALING_RECIPE_CURRENT == GMLP_QUANT_CURRENT);
G_STATIC_ASSERT ((int) GMLP_SCALING_RECIPE_BLOCKWISE == GMLP_QUANT_BLOCKWISE);
G_STATIC_ASSERT ((int) GMLP_SCALING_RECIPE_MXFP8 == GMLP_QUANT_MXFP8);

/**
 * GmlpQuantizer:
 *
 * Turns a [class@Gmlp.GroupedTensor] of FP32, FP16 or BF16 into FP8 with its
 * scales, every group in one launch (two for current scaling), reading the
 * group sizes where they are, on the device too.
 *
 * A quantizer has a [enum@Gmlp.ScalingRecipe], an [enum@Gmlp.Fp8Format] and
 * a [enum@Gmlp.QuantizerRole] (input, weight or output gradient), which
 * together fix the FP8 type ([property@Gmlp.Quantizer:dtype]) and the
 * blocks that share a scale. Each group of a grouped tensor (each expert)
 * has scales of its own.
 *
 * [method@Gmlp.Quantizer.quantize] returns an FP8 tensor that carries its
 * scale inverses ([method@Gmlp.GroupedTensor.get_scale_inv]) and, when
 * [property@Gmlp.Quantizer:columnwise] is set, a transposed copy for the
 * wgrad product, written in the same pass
 * ([method@Gmlp.GroupedTensor.get_columnwise]).
 * [method@Gmlp.GroupedTensor.dequantize] turns it back.
 *
 * Delayed scaling keeps state on the device, per group: the scale in use,
 * the amax seen since the last update and an amax history.
 * [method@Gmlp.Quantizer.update] (once a step) moves the new amax into the
 * history and recomputes the scale, without waiting for the device;
 * [method@Gmlp.Quantizer.save_state] and
 * [method@Gmlp.Quantizer.restore_state] carry the state through a
 * checkpoint as a #GVariant.
 *
 * The CPU and the CUDA backends share the arithmetic, so they give the same
 * bytes for the same input. docs/fp8.md describes the recipes, the formulas
 * and what happens to zeros, NaN and infinities.
 *
 * g_object_new() with the construct properties makes a complete quantizer
 * ([property@Gmlp.Quantizer:device] %NULL stands for
 * [func@Gmlp.Device.get_default]). A quantizer whose recipe is
 * %GMLP_SCALING_RECIPE_NONE quantizes nothing: its methods fail with
 * %GMLP_ERROR_INVALID_ARGUMENT.
 * `GmlpQuantizer` is thread-safe: several threads (and layers) may quantize
 * with one quantizer at once. A delayed-scaling state is made once, and
 * the calls that record amaxes into it, update it, save or restore it take
 * turns, so that after a step the amax is that of every thread's calls.
 * Call [method@Gmlp.Quantizer.update] between steps: during one, it would
 * change the scales of calls running on other threads.
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
 * q = Gmlp.Quantizer.new(dev, Gmlp.ScalingRecipe.CURRENT, Gmlp.Fp8Format.HYBRID,
 *                        Gmlp.QuantizerRole.INPUT)
 * x = Gmlp.GroupedTensor.new(dev, Gmlp.DType.FLOAT32, [32, 64], 128)
 * x.fill_random(1, 1.0)
 * x8 = q.quantize(x)                 # E4M3, one scale per member
 * back = x8.dequantize(Gmlp.DType.FLOAT32)
 * back.add_scaled(-1.0, x)
 * print(x8.get_dtype().value_nick, 'error', back.sum_squares() / x.sum_squares())
 * ```
 *
 * In JavaScript (gjs; run with `gjs -m`):
 *
 * ```js
 * import GLib from 'gi://GLib';
 * import Gmlp from 'gi://Gmlp?version=1.0';
 *
 * const dev = Gmlp.Device.get_default();
 * const q = Gmlp.Quantizer.new(dev, Gmlp.ScalingRecipe.CURRENT, Gmlp.Fp8Format.HYBRID,
 *     Gmlp.QuantizerRole.INPUT);
 * const x = Gmlp.GroupedTensor.new(dev, Gmlp.DType.FLOAT32, [32, 64], 128);
 * x.fill_random(1, 1.0);
 * const x8 = q.quantize(x);              // E4M3, one scale per member
 * const back = x8.dequantize(Gmlp.DType.FLOAT32);
 * back.add_scaled(-1.0, x);
 * print('relative error', back.sum_squares() / x.sum_squares());
 * ```
 *
 * Since: 0.1
 */

struct _GmlpQuantizer
{
  GObject             parent_instance;

  GmlpDevice         *device;
  GmlpScalingRecipe   recipe;
  GmlpFp8Format       format;
  GmlpQuantizerRole   role;
  guint               amax_history_length;
  int                 margin;
  gboolean            power_of_2_scales;
  gboolean            columnwise;

  /* DELAYED: a one-member FP32 tensor of n_groups rows of
   * gmlp_quant_state_stride() floats; made on first use or restore. Every
   * quantize call records its amaxes into it, so state_lock guards both
   * and is held around each call that uses the state (on the CPU the call
   * does the work; on a GPU it enqueues it). */
  GMutex              state_lock;
  GmlpGroupedTensor  *state;
  guint               n_groups;

  GError             *construct_error;   /* an unusable device */
};

G_DEFINE_FINAL_TYPE (GmlpQuantizer, gmlp_quantizer, G_TYPE_OBJECT)

enum {
  PROP_0,
  PROP_DEVICE,
  PROP_RECIPE,
  PROP_FP8_FORMAT,
  PROP_ROLE,
  PROP_AMAX_HISTORY_LENGTH,
  PROP_MARGIN,
  PROP_POWER_OF_2_SCALES,
  PROP_COLUMNWISE,
  PROP_DTYPE,
  N_PROPS
};

static GParamSpec *properties[N_PROPS];

#define STATE_VERSION 1

/* The dtype of an MXFP8 scale tensor: GmlpDType has no E8M0, so a type of
 * one byte holds the E8M0 bytes (see gmlp_grouped_tensor_get_scale_inv()). */
#define E8M0_CONTAINER_DTYPE GMLP_DTYPE_FLOAT8_E4M3

static void
gmlp_quantizer_finalize (GObject *object)
{
  GmlpQuantizer *self = (GmlpQuantizer *) object;

  g_clear_object (&self->state);
  g_clear_object (&self->device);
  g_clear_error (&self->construct_error);
  g_mutex_clear (&self->state_lock);

  G_OBJECT_CLASS (gmlp_quantizer_parent_class)->finalize (object);
}

static void
gmlp_quantizer_constructed (GObject *object)
{
  GmlpQuantizer *self = GMLP_QUANTIZER (object);

  G_OBJECT_CLASS (gmlp_quantizer_parent_class)->constructed (object);

  if (self->device == NULL)
    self->device = g_object_ref (gmlp_device_get_default ());
  (void) gmlp_device_check_usable (self->device, &self->construct_error);
}

static void
gmlp_quantizer_get_property (GObject    *object,
                             guint       prop_id,
                             GValue     *value,
                             GParamSpec *pspec)
{
  GmlpQuantizer *self = GMLP_QUANTIZER (object);

  switch (prop_id)
    {
    case PROP_DEVICE:
      g_value_set_object (value, self->device);
      break;
    case PROP_RECIPE:
      g_value_set_enum (value, self->recipe);
      break;
    case PROP_FP8_FORMAT:
      g_value_set_enum (value, self->format);
      break;
    case PROP_ROLE:
      g_value_set_enum (value, self->role);
      break;
    case PROP_AMAX_HISTORY_LENGTH:
      g_value_set_uint (value, self->amax_history_length);
      break;
    case PROP_MARGIN:
      g_value_set_int (value, self->margin);
      break;
    case PROP_POWER_OF_2_SCALES:
      g_value_set_boolean (value, self->power_of_2_scales);
      break;
    case PROP_COLUMNWISE:
      g_value_set_boolean (value, self->columnwise);
      break;
    case PROP_DTYPE:
      g_value_set_enum (value, gmlp_quantizer_get_dtype (self));
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
    }
}

static void
gmlp_quantizer_set_property (GObject      *object,
                             guint         prop_id,
                             const GValue *value,
                             GParamSpec   *pspec)
{
  GmlpQuantizer *self = GMLP_QUANTIZER (object);

  switch (prop_id)
    {
    case PROP_DEVICE:
      self->device = g_value_dup_object (value);
      break;
    case PROP_RECIPE:
      self->recipe = g_value_get_enum (value);
      break;
    case PROP_FP8_FORMAT:
      self->format = g_value_get_enum (value);
      break;
    case PROP_ROLE:
      self->role = g_value_get_enum (value);
      break;
    case PROP_AMAX_HISTORY_LENGTH:
      self->amax_history_length = g_value_get_uint (value);
      break;
    case PROP_MARGIN:
      self->margin = g_value_get_int (value);
      break;
    case PROP_POWER_OF_2_SCALES:
      self->power_of_2_scales = g_value_get_boolean (value);
      break;
    case PROP_COLUMNWISE:
      gmlp_quantizer_set_columnwise (self, g_value_get_boolean (value));
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
    }
}

static void
gmlp_quantizer_class_init (GmlpQuantizerClass *klass)
{
  GObjectClass *object_class = G_OBJECT_CLASS (klass);

  object_class->constructed = gmlp_quantizer_constructed;
  object_class->finalize = gmlp_quantizer_finalize;
  object_class->get_property = gmlp_quantizer_get_property;
  object_class->set_property = gmlp_quantizer_set_property;

  /**
   * GmlpQuantizer:device:
   *
   * The device of the tensors this quantizer takes, and of its state.
   *
   * Since: 0.1
   */
  properties[PROP_DEVICE] =
    g_param_spec_object ("device", NULL, NULL,
                         GMLP_TYPE_DEVICE,
                         G_PARAM_READWRITE | G_PARAM_CONSTRUCT_ONLY | G_PARAM_STATIC_STRINGS);

  /**
   * GmlpQuantizer:recipe:
   *
   * How the scales are chosen; not %GMLP_SCALING_RECIPE_NONE.
   *
   * Since: 0.1
   */
  properties[PROP_RECIPE] =
    g_param_spec_enum ("recipe", NULL, NULL,
                       GMLP_TYPE_SCALING_RECIPE, GMLP_SCALING_RECIPE_DELAYED,
                       G_PARAM_READWRITE | G_PARAM_CONSTRUCT_ONLY | G_PARAM_STATIC_STRINGS);

  /**
   * GmlpQuantizer:fp8-format:
   *
   * The FP8 types to use; with the role, it fixes
   * [property@Gmlp.Quantizer:dtype].
   *
   * Since: 0.1
   */
  properties[PROP_FP8_FORMAT] =
    g_param_spec_enum ("fp8-format", NULL, NULL,
                       GMLP_TYPE_FP8_FORMAT, GMLP_FP8_FORMAT_HYBRID,
                       G_PARAM_READWRITE | G_PARAM_CONSTRUCT_ONLY | G_PARAM_STATIC_STRINGS);

  /**
   * GmlpQuantizer:role:
   *
   * What the quantizer quantizes: the FP8 type of the hybrid format and the
   * blocks of the blockwise recipe depend on it.
   *
   * Since: 0.1
   */
  properties[PROP_ROLE] =
    g_param_spec_enum ("role", NULL, NULL,
                       GMLP_TYPE_QUANTIZER_ROLE, GMLP_QUANTIZER_ROLE_INPUT,
                       G_PARAM_READWRITE | G_PARAM_CONSTRUCT_ONLY | G_PARAM_STATIC_STRINGS);

  /**
   * GmlpQuantizer:amax-history-length:
   *
   * Delayed scaling: how many steps of amax the scale looks back on (1 to
   * 1024); the scale comes from the largest.
   *
   * Since: 0.1
   */
  properties[PROP_AMAX_HISTORY_LENGTH] =
    g_param_spec_uint ("amax-history-length", NULL, NULL,
                       1, kGmlpQuantMaxHistory, kGmlpQuantMaxHistory,
                       G_PARAM_READWRITE | G_PARAM_CONSTRUCT_ONLY | G_PARAM_STATIC_STRINGS);

  /**
   * GmlpQuantizer:margin:
   *
   * Delayed scaling: the scale is divided by 2^margin (0 to 64), headroom
   * for values that grow between updates.
   *
   * Since: 0.1
   */
  properties[PROP_MARGIN] =
    g_param_spec_int ("margin", NULL, NULL,
                      0, kGmlpQuantMaxMargin, 0,
                      G_PARAM_READWRITE | G_PARAM_CONSTRUCT_ONLY | G_PARAM_STATIC_STRINGS);

  /**
   * GmlpQuantizer:power-of-2-scales:
   *
   * Current and blockwise scaling: round each scale down to a power of two,
   * so that scaling loses no mantissa bits.
   *
   * Since: 0.1
   */
  properties[PROP_POWER_OF_2_SCALES] =
    g_param_spec_boolean ("power-of-2-scales", NULL, NULL,
                          FALSE,
                          G_PARAM_READWRITE | G_PARAM_CONSTRUCT_ONLY | G_PARAM_STATIC_STRINGS);

  /**
   * GmlpQuantizer:columnwise:
   *
   * Whether [method@Gmlp.Quantizer.quantize] also writes the transposed
   * copy that the wgrad product reads
   * ([method@Gmlp.GroupedTensor.get_columnwise]).
   *
   * Since: 0.1
   */
  properties[PROP_COLUMNWISE] =
    g_param_spec_boolean ("columnwise", NULL, NULL,
                          FALSE,
                          G_PARAM_READWRITE | G_PARAM_CONSTRUCT | G_PARAM_EXPLICIT_NOTIFY |
                          G_PARAM_STATIC_STRINGS);

  /**
   * GmlpQuantizer:dtype:
   *
   * The FP8 type of the quantized tensors: from the format and the role.
   *
   * Since: 0.1
   */
  properties[PROP_DTYPE] =
    g_param_spec_enum ("dtype", NULL, NULL,
                       GMLP_TYPE_DTYPE, GMLP_DTYPE_FLOAT8_E4M3,
                       G_PARAM_READABLE | G_PARAM_STATIC_STRINGS);

  g_object_class_install_properties (object_class, N_PROPS, properties);
}

static void
gmlp_quantizer_init (GmlpQuantizer *self)
{
  self->recipe = GMLP_SCALING_RECIPE_DELAYED;
  self->format = GMLP_FP8_FORMAT_HYBRID;
  self->amax_history_length = kGmlpQuantMaxHistory;
  g_mutex_init (&self->state_lock);
}

/**
 * gmlp_quantizer_new:
 * @device: the device of the tensors to quantize
 * @recipe: the scaling recipe, not %GMLP_SCALING_RECIPE_NONE
 * @format: the FP8 format
 * @role: what the quantizer quantizes
 *
 * Creates a quantizer (one with %GMLP_SCALING_RECIPE_NONE, or with a value
 * outside an enumeration, quantizes nothing: its methods fail with
 * %GMLP_ERROR_INVALID_ARGUMENT); the other settings ([property@Gmlp.Quantizer:columnwise],
 * [property@Gmlp.Quantizer:amax-history-length],
 * [property@Gmlp.Quantizer:margin],
 * [property@Gmlp.Quantizer:power-of-2-scales]) are properties, for
 * g_object_new() or, for columnwise, a setter.
 *
 * Returns: (transfer full): a new quantizer
 *
 * Since: 0.1
 */
GmlpQuantizer *
gmlp_quantizer_new (GmlpDevice        *device,
                    GmlpScalingRecipe  recipe,
                    GmlpFp8Format      format,
                    GmlpQuantizerRole  role)
{
  GmlpQuantizer *self;

  g_return_val_if_fail (GMLP_IS_DEVICE (device), NULL);

  /* Values outside the enumerations would be GObject's warnings; they are
   * the quantizer's error instead, which its methods report. */
  if ((guint) recipe > GMLP_SCALING_RECIPE_MXFP8 || (guint) format > GMLP_FP8_FORMAT_HYBRID ||
      (guint) role > GMLP_QUANTIZER_ROLE_GRAD_OUTPUT)
    {
      self = g_object_new (GMLP_TYPE_QUANTIZER, "device", device, NULL);
      if (self->construct_error == NULL)
        g_set_error (&self->construct_error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                     "Invalid quantizer settings: recipe %d, format %d, role %d",
                     (int) recipe, (int) format, (int) role);
      return self;
    }

  return g_object_new (GMLP_TYPE_QUANTIZER,
                       "device", device,
                       "recipe", recipe,
                       "fp8-format", format,
                       "role", role,
                       NULL);
}

static int
quantize_flags (GmlpQuantizer *self)
{
  int flags = 0;

  if (self->recipe == GMLP_SCALING_RECIPE_BLOCKWISE && self->role == GMLP_QUANTIZER_ROLE_WEIGHT)
    flags |= GMLP_QUANT_FLAG_WEIGHT_TILES;
  if (self->power_of_2_scales)
    flags |= GMLP_QUANT_FLAG_POW2_SCALES;
  return flags;
}

static const char *
enum_nick (GType type,
           int   value)
{
  g_autoptr(GEnumClass) klass = g_type_class_ref (type);
  GEnumValue *v = g_enum_get_value (klass, value);

  /* The nicks are static strings of the registered type. */
  return v != NULL ? v->value_nick : "invalid";
}

/* The state of a quantizer that has not quantized anything: scale 1, no
 * amax seen. */
static gboolean
ensure_state (GmlpQuantizer  *self,
              guint           n_groups,
              GError        **error)
{
  guint stride = gmlp_quant_state_stride (self->amax_history_length);
  g_autofree float *init = NULL;
  g_autoptr(GBytes) bytes = NULL;
  gint64 rows = n_groups;
  guint g;

  if (self->state != NULL)
    {
      if (self->n_groups != n_groups)
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
                       "This delayed-scaling quantizer keeps the scales of %u groups, not %u",
                       self->n_groups, n_groups);
          return FALSE;
        }
      return TRUE;
    }

  init = g_new0 (float, (gsize) n_groups * stride);
  for (g = 0; g < n_groups; g++)
    init[(gsize) g * stride + GMLP_QUANT_STATE_SCALE] = 1.0f;
  bytes = g_bytes_new_take (g_steal_pointer (&init), sizeof (float) * n_groups * stride);
  self->state = gmlp_grouped_tensor_new_from_bytes (self->device, GMLP_DTYPE_FLOAT32, &rows, 1,
                                                    stride, bytes, error);
  if (self->state == NULL)
    return FALSE;
  self->n_groups = n_groups;
  return TRUE;
}

static gboolean
check_source (GmlpQuantizer      *self,
              GmlpGroupedTensor  *src,
              GError            **error)
{
  GmlpDType dtype = gmlp_grouped_tensor_get_dtype (src);

  if (self->recipe == GMLP_SCALING_RECIPE_NONE || self->recipe > GMLP_SCALING_RECIPE_MXFP8)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "The quantizer has no scaling recipe");
      return FALSE;
    }
  if (dtype != GMLP_DTYPE_FLOAT32 && dtype != GMLP_DTYPE_FLOAT16 && dtype != GMLP_DTYPE_BFLOAT16)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_DTYPE_MISMATCH,
                   "Quantization takes float32, float16 or bfloat16 tensors, not %s",
                   gmlp_dtype_get_name (dtype));
      return FALSE;
    }
  if (gmlp_grouped_tensor_get_device (src) != self->device)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "The tensor is on %s, the quantizer on %s",
                   gmlp_device_get_name (gmlp_grouped_tensor_get_device (src)),
                   self->device != NULL ? gmlp_device_get_name (self->device) : "no device");
      return FALSE;
    }
  if (self->recipe == GMLP_SCALING_RECIPE_DELAYED && self->state != NULL &&
      self->n_groups != gmlp_grouped_tensor_get_n_groups (src))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
                   "This delayed-scaling quantizer keeps the scales of %u groups, not %u",
                   self->n_groups, gmlp_grouped_tensor_get_n_groups (src));
      return FALSE;
    }
  return TRUE;
}

/* See gmlp-quantizer-private.h. */
GmlpGroupedTensor *
gmlp_grouped_tensor_new_blocked (GmlpGroupedTensor  *src,
                                 GmlpDType           dtype,
                                 gint64              row_block,
                                 gint64              cols,
                                 GmlpGroupedTensor  *derived,
                                 GError            **error)
{
  GmlpDevice *device = gmlp_grouped_tensor_get_device (src);
  guint n = gmlp_grouped_tensor_get_n_groups (src);
  const gint64 *src_rows = gmlp_grouped_tensor_peek_rows (src);
  GmlpGroupedTensor *sizes;
  gint64 capacity;

  if (row_block == 0)
    return gmlp_grouped_tensor_new_uniform (device, dtype, n, 1, cols, error);

  if (src_rows != NULL)
    {
      g_autofree gint64 *rows = g_new (gint64, n);
      guint g;

      for (g = 0; g < n; g++)
        rows[g] = gmlp_quant_blocks_along (src_rows[g], row_block);
      return gmlp_grouped_tensor_new (device, dtype, rows, n, cols, error);
    }

  capacity = gmlp_grouped_tensor_get_row_capacity (src);
  if (row_block == 1)
    {
      sizes = gmlp_grouped_tensor_get_sizes (src, error);
      if (sizes == NULL)
        return NULL;
      return gmlp_grouped_tensor_new_with_device_sizes (device, dtype, sizes, capacity, cols, error);
    }

  g_assert (derived != NULL);
  capacity = gmlp_quant_blocked_capacity (capacity, n, row_block);
  return gmlp_grouped_tensor_new_with_device_sizes (device, dtype, derived, capacity, cols, error);
}

/**
 * gmlp_quantizer_quantize:
 * @self: a #GmlpQuantizer
 * @src: a tensor of %GMLP_DTYPE_FLOAT32, %GMLP_DTYPE_FLOAT16 or
 *   %GMLP_DTYPE_BFLOAT16 on the quantizer's device, with its group sizes on
 *   the host or only on the device
 * @error: return location for a #GError
 *
 * Quantizes every group of @src, in one launch (current scaling: two, the
 * first for the amaxes), stream-ordered: nothing waits for the device. The
 * result has the group sizes of @src and [property@Gmlp.Quantizer:dtype];
 * it carries its scale inverses and, if
 * [property@Gmlp.Quantizer:columnwise] is set, its transposed copy. Delayed
 * scaling uses the scales of the quantizer's state and records each group's
 * amax for the next [method@Gmlp.Quantizer.update]; the first call creates
 * that state, with scale 1, for the number of groups of @src.
 *
 * No shape is refused: blocks that run past the end of a member (columns
 * not a multiple of the block, the last rows of a tile) are scaled by the
 * values they hold, as if padded with zeros. docs/fp8.md lists what
 * becomes of zeros, NaN and infinities.
 *
 * Returns: (transfer full): the quantized tensor, or %NULL with
 *   %GMLP_ERROR_DTYPE_MISMATCH for a source of another dtype (FP8
 *   included), %GMLP_ERROR_INVALID_ARGUMENT for a tensor on another device,
 *   %GMLP_ERROR_SHAPE_MISMATCH when a delayed-scaling quantizer's state has
 *   another number of groups, or %GMLP_ERROR_UNSUPPORTED when the device
 *   cannot run the kernels (with the reason); nothing is written then
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_quantizer_quantize (GmlpQuantizer      *self,
                         GmlpGroupedTensor  *src,
                         GError            **error)
{
  g_return_val_if_fail (GMLP_IS_QUANTIZER (self), NULL);

  return gmlp_quantizer_quantize_full (self, src, self->columnwise, error);
}

/* FP8 layers: quantize() with the columnwise copy asked for by the caller
 * (what its backward needs) rather than by the property. */
GmlpGroupedTensor *
gmlp_quantizer_quantize_full (GmlpQuantizer      *self,
                              GmlpGroupedTensor  *src,
                              gboolean            with_columnwise,
                              GError            **error)
{
  g_autoptr(GmlpGroupedTensor) data = NULL;
  g_autoptr(GmlpGroupedTensor) scale_inv = NULL;
  g_autoptr(GmlpGroupedTensor) columnwise = NULL;
  g_autoptr(GmlpGroupedTensor) columnwise_scale_inv = NULL;
  g_autoptr(GmlpGroupedTensor) derived = NULL;
  GmlpDType dtype, scale_dtype;
  GmlpBackendShape shape;
  gint64 block_rows, block_cols, col_block_rows, col_block_cols, derived_block;
  gboolean own_column_scales;
  guint n_groups;
  g_autoptr(GmlpMutexLocker) locker = NULL;
  gint64 cols;
  int flags;

  g_return_val_if_fail (GMLP_IS_QUANTIZER (self), NULL);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (src), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!gmlp_check_constructed (self, self->construct_error, error) ||
      !gmlp_grouped_tensor_check_usable (src, error))
    return NULL;

  /* Only delayed scaling keeps state, which the call reads and writes. */
  if (self->recipe == GMLP_SCALING_RECIPE_DELAYED)
    locker = gmlp_mutex_locker_new (&self->state_lock);
  if (!check_source (self, src, error))
    return NULL;

  dtype = gmlp_quantizer_get_dtype (self);
  flags = quantize_flags (self);
  n_groups = gmlp_grouped_tensor_get_n_groups (src);
  cols = gmlp_grouped_tensor_get_cols (src);
  scale_dtype = self->recipe == GMLP_SCALING_RECIPE_MXFP8 ? E8M0_CONTAINER_DTYPE : GMLP_DTYPE_FLOAT32;
  gmlp_quant_blocks ((int) self->recipe, flags, FALSE, &block_rows, &block_cols);
  gmlp_quant_blocks ((int) self->recipe, flags, TRUE, &col_block_rows, &col_block_cols);
  own_column_scales = with_columnwise && gmlp_quant_columnwise_has_scales ((int) self->recipe, flags);
  derived_block = gmlp_quant_derived_row_block ((int) self->recipe, flags, with_columnwise);

  if (self->recipe == GMLP_SCALING_RECIPE_DELAYED && !ensure_state (self, n_groups, error))
    return NULL;
  if (!gmlp_grouped_tensor_get_backend_shape (src, &shape, error))
    return NULL;

  if (!gmlp_grouped_tensor_has_host_sizes (src) && derived_block > 0)
    {
      gint64 n = n_groups;

      derived = gmlp_grouped_tensor_new (self->device, GMLP_DTYPE_INT64, &n, 1, 1, error);
      if (derived == NULL)
        return NULL;
    }

  data = gmlp_grouped_tensor_new_blocked (src, dtype, 1, cols, NULL, error);
  if (data == NULL)
    return NULL;
  scale_inv = gmlp_grouped_tensor_new_blocked (src, scale_dtype, block_rows,
                                               gmlp_quant_blocks_along (cols, block_cols), derived, error);
  if (scale_inv == NULL)
    return NULL;
  if (with_columnwise)
    {
      columnwise = gmlp_grouped_tensor_new_blocked (src, dtype, 1, cols, NULL, error);
      if (columnwise == NULL)
        return NULL;
      if (own_column_scales)
        {
          columnwise_scale_inv = gmlp_grouped_tensor_new_blocked (src, scale_dtype, col_block_rows,
                                                                  gmlp_quant_blocks_along (cols, col_block_cols),
                                                                  derived, error);
          if (columnwise_scale_inv == NULL)
            return NULL;
        }
    }

  {
    GmlpBackendQuantize quantize = {
      .shape = shape,
      .recipe = (int) self->recipe,
      .flags = flags,
      .fp8_dtype = (int) dtype,
      .src = gmlp_grouped_tensor_get_data (src),
      .src_dtype = (int) gmlp_grouped_tensor_get_dtype (src),
      .data = gmlp_grouped_tensor_get_data (data),
      .scale_inv = gmlp_grouped_tensor_get_data (scale_inv),
      .columnwise = columnwise != NULL ? gmlp_grouped_tensor_get_data (columnwise) : NULL,
      .columnwise_scale_inv = columnwise_scale_inv != NULL ?
                              gmlp_grouped_tensor_get_data (columnwise_scale_inv) : NULL,
      .derived_rows = derived != NULL ? gmlp_grouped_tensor_get_data (derived) : NULL,
      .state = self->state != NULL ? gmlp_grouped_tensor_get_data (self->state) : NULL,
      .history_length = self->amax_history_length,
    };

    if (!GMLP_DEVICE_CALL (self->device, quantize, &quantize, error))
      return NULL;
  }

  if (columnwise != NULL)
    gmlp_grouped_tensor_set_quantized (columnwise, self->recipe, flags,
                                       own_column_scales ? columnwise_scale_inv : scale_inv,
                                       NULL, TRUE);
  gmlp_grouped_tensor_set_quantized (data, self->recipe, flags, scale_inv, columnwise, FALSE);
  return g_steal_pointer (&data);
}

/**
 * gmlp_quantizer_update:
 * @self: a #GmlpQuantizer
 * @error: return location for a #GError
 *
 * Delayed scaling: ends a step. For each group, the amax recorded since the
 * last update becomes the newest entry of the history (the oldest drops
 * out), and the scale becomes `fp8_max / max(history) / 2^margin`; a
 * history whose largest entry is 0 or infinite keeps the scale. Runs on the
 * device, stream-ordered, without waiting. Other recipes have nothing to
 * update, nor has a quantizer that has not quantized yet: %TRUE.
 *
 * Returns: %TRUE on success
 *
 * Since: 0.1
 */
gboolean
gmlp_quantizer_update (GmlpQuantizer  *self,
                       GError        **error)
{
  gboolean ok;

  g_return_val_if_fail (GMLP_IS_QUANTIZER (self), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (self->recipe != GMLP_SCALING_RECIPE_DELAYED)
    return TRUE;
  gmlp_mutex_lock (&self->state_lock);
  ok = self->state == NULL ||
       GMLP_DEVICE_CALL (self->device, quantizer_update, gmlp_grouped_tensor_get_data (self->state),
                         self->n_groups, self->amax_history_length,
                         (int) gmlp_quantizer_get_dtype (self), self->margin, error);
  gmlp_mutex_unlock (&self->state_lock);
  return ok;
}

static void
add_floats (GVariantBuilder *builder,
            const char      *key,
            const float     *values,
            gsize            stride,
            gsize            first,
            gsize            count,
            gsize            n_rows)
{
  GVariantBuilder array;
  gsize row, i;

  g_variant_builder_init (&array, G_VARIANT_TYPE ("ad"));
  for (row = 0; row < n_rows; row++)
    for (i = 0; i < count; i++)
      g_variant_builder_add (&array, "d", (double) values[row * stride + first + i]);
  g_variant_builder_add (builder, "{sv}", key, g_variant_builder_end (&array));
}

/**
 * gmlp_quantizer_save_state:
 * @self: a #GmlpQuantizer
 * @error: return location for a #GError
 *
 * Saves what a checkpoint needs of the quantizer, as a dictionary
 * (`a{sv}`): `version` (u, 1), `recipe`, `fp8-format`, `role` (s, the
 * enum nicks), `dtype` (s), `amax-history-length` (u), `margin` (i),
 * `n-groups` (u) and, for delayed scaling, one value per group in `scale`
 * and `amax` (ad) and the histories in `amax-history` (ad, group by group,
 * newest first); with no state yet, `n-groups` is 0 and the arrays are
 * empty. Waits for the device.
 *
 * Returns: (transfer full): the state, or %NULL with an error from the
 *   device
 *
 * Since: 0.1
 */
GVariant *
gmlp_quantizer_save_state (GmlpQuantizer  *self,
                           GError        **error)
{
  g_autoptr(GBytes) bytes = NULL;
  const float *values = NULL;
  GVariantBuilder builder;
  guint stride;
  guint n_groups = 0;

  g_return_val_if_fail (GMLP_IS_QUANTIZER (self), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  stride = gmlp_quant_state_stride (self->amax_history_length);

  gmlp_mutex_lock (&self->state_lock);
  if (self->state != NULL)
    {
      bytes = gmlp_grouped_tensor_to_bytes (self->state, error);
      n_groups = self->n_groups;
    }
  gmlp_mutex_unlock (&self->state_lock);
  if (n_groups > 0 && bytes == NULL)
    return NULL;
  if (bytes != NULL)
    values = g_bytes_get_data (bytes, NULL);

  g_variant_builder_init (&builder, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add (&builder, "{sv}", "version", g_variant_new_uint32 (STATE_VERSION));
  g_variant_builder_add (&builder, "{sv}", "recipe",
                         g_variant_new_string (enum_nick (GMLP_TYPE_SCALING_RECIPE, self->recipe)));
  g_variant_builder_add (&builder, "{sv}", "fp8-format",
                         g_variant_new_string (enum_nick (GMLP_TYPE_FP8_FORMAT, self->format)));
  g_variant_builder_add (&builder, "{sv}", "role",
                         g_variant_new_string (enum_nick (GMLP_TYPE_QUANTIZER_ROLE, self->role)));
  g_variant_builder_add (&builder, "{sv}", "dtype",
                         g_variant_new_string (gmlp_dtype_get_name (gmlp_quantizer_get_dtype (self))));
  g_variant_builder_add (&builder, "{sv}", "amax-history-length",
                         g_variant_new_uint32 (self->amax_history_length));
  g_variant_builder_add (&builder, "{sv}", "margin", g_variant_new_int32 (self->margin));
  g_variant_builder_add (&builder, "{sv}", "n-groups", g_variant_new_uint32 (n_groups));
  add_floats (&builder, "scale", values, stride, GMLP_QUANT_STATE_SCALE, 1, n_groups);
  add_floats (&builder, "amax", values, stride, GMLP_QUANT_STATE_AMAX, 1, n_groups);
  add_floats (&builder, "amax-history", values, stride, GMLP_QUANT_STATE_HISTORY,
              self->amax_history_length, n_groups);

  return g_variant_ref_sink (g_variant_builder_end (&builder));
}

/* Looks up key of the given type; an error names what is missing. */
static GVariant *
lookup (GVariant            *dict,
        const char          *key,
        const GVariantType  *type,
        GError             **error)
{
  GVariant *value = g_variant_lookup_value (dict, key, type);

  if (value == NULL)
    g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                 "The quantizer state has no “%s” of type %s", key,
                 g_variant_type_peek_string (type));
  return value;
}

/* Copies count values per row out of an ad into the state rows; checks
 * the length and that every value is allowed (see restore_state). */
static gboolean
take_floats (GVariant     *dict,
             const char   *key,
             float        *rows,
             gsize         stride,
             gsize         first,
             gsize         count,
             gsize         n_rows,
             gboolean      is_scale,
             GError      **error)
{
  g_autoptr(GVariant) array = lookup (dict, key, G_VARIANT_TYPE ("ad"), error);
  const double *values;
  gsize n, row, i;

  if (array == NULL)
    return FALSE;
  values = g_variant_get_fixed_array (array, &n, sizeof (double));
  if (n != count * n_rows)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "The quantizer state has %" G_GSIZE_FORMAT " values in “%s”, not %"
                   G_GSIZE_FORMAT, n, key, count * n_rows);
      return FALSE;
    }
  /* Scales are finite and positive floats; an amax may be +Inf (seen in
   * the data) or subnormal, as the device records it. */
  for (row = 0; row < n_rows; row++)
    for (i = 0; i < count; i++)
      {
        double v = values[row * count + i];
        float f;

        if (!gmlp_dtype_narrow_double (v, key, is_scale ? GMLP_NARROW_NOT_NEGATIVE :
                                       GMLP_NARROW_NOT_NEGATIVE | GMLP_NARROW_INFINITY |
                                       GMLP_NARROW_SUBNORMAL, &f, error))
          {
            g_prefix_error (error, "The quantizer state holds a value it cannot have "
                            "(%" G_GSIZE_FORMAT " of “%s”): ", row * count + i, key);
            return FALSE;
          }
        if (is_scale && f == 0.0f)
          {
            g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                         "The quantizer state holds a scale of 0 (%" G_GSIZE_FORMAT " of “%s”): "
                         "scales must be positive", row * count + i, key);
            return FALSE;
          }
        rows[row * stride + first + i] = f;
      }
  return TRUE;
}

/**
 * gmlp_quantizer_restore_state:
 * @self: a #GmlpQuantizer
 * @state: a state from [method@Gmlp.Quantizer.save_state]
 * @error: return location for a #GError
 *
 * Restores a saved state, stream-ordered: the next quantize call uses it.
 * The state must come from a quantizer of the same recipe, FP8 type and
 * history length (the margin may differ: it applies from the next update).
 * A state without groups clears the quantizer's state.
 *
 * The values are kept as floats, so each must be one: a scale is finite
 * and positive, from 2^-126 (%G_MINFLOAT) to %G_MAXFLOAT; an amax is
 * not negative and may be +Inf (data that held infinities) or a float
 * subnormal. NaN, and a finite value that a float cannot hold (past
 * %G_MAXFLOAT, or nonzero that would round to 0), are refused rather than
 * narrowed.
 *
 * Returns: %TRUE on success; %FALSE with %GMLP_ERROR_INVALID_ARGUMENT for a
 *   state that is malformed, of another version, recipe or history length,
 *   or holds values a state cannot have (see above), or
 *   %GMLP_ERROR_DTYPE_MISMATCH for another FP8 type; the quantizer is
 *   unchanged then
 *
 * Since: 0.1
 */
gboolean
gmlp_quantizer_restore_state (GmlpQuantizer  *self,
                              GVariant       *state,
                              GError        **error)
{
  g_autoptr(GVariant) version = NULL;
  g_autoptr(GVariant) recipe = NULL;
  g_autoptr(GVariant) dtype = NULL;
  g_autoptr(GVariant) history = NULL;
  g_autoptr(GVariant) groups = NULL;
  g_autoptr(GBytes) bytes = NULL;
  g_autofree float *rows = NULL;
  const char *own_recipe, *own_dtype;
  guint stride;
  guint n_groups;
  gint64 n;
  GmlpGroupedTensor *restored;

  g_return_val_if_fail (GMLP_IS_QUANTIZER (self), FALSE);
  g_return_val_if_fail (state != NULL, FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_check_constructed (self, self->construct_error, error))
    return FALSE;
  stride = gmlp_quant_state_stride (self->amax_history_length);

  if (!g_variant_is_of_type (state, G_VARIANT_TYPE_VARDICT))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "A quantizer state is a dictionary (a{sv}), not %s",
                   g_variant_get_type_string (state));
      return FALSE;
    }
  if ((version = lookup (state, "version", G_VARIANT_TYPE_UINT32, error)) == NULL ||
      (recipe = lookup (state, "recipe", G_VARIANT_TYPE_STRING, error)) == NULL ||
      (dtype = lookup (state, "dtype", G_VARIANT_TYPE_STRING, error)) == NULL ||
      (history = lookup (state, "amax-history-length", G_VARIANT_TYPE_UINT32, error)) == NULL ||
      (groups = lookup (state, "n-groups", G_VARIANT_TYPE_UINT32, error)) == NULL)
    return FALSE;

  own_recipe = enum_nick (GMLP_TYPE_SCALING_RECIPE, self->recipe);
  own_dtype = gmlp_dtype_get_name (gmlp_quantizer_get_dtype (self));
  if (g_variant_get_uint32 (version) != STATE_VERSION)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "Quantizer state version %u; this libgmlp reads version %d",
                   g_variant_get_uint32 (version), STATE_VERSION);
      return FALSE;
    }
  if (g_strcmp0 (g_variant_get_string (recipe, NULL), own_recipe) != 0)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "The state is of the %s recipe; this quantizer's is %s",
                   g_variant_get_string (recipe, NULL), own_recipe);
      return FALSE;
    }
  if (g_strcmp0 (g_variant_get_string (dtype, NULL), own_dtype) != 0)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_DTYPE_MISMATCH,
                   "The state is for %s; this quantizer makes %s",
                   g_variant_get_string (dtype, NULL), own_dtype);
      return FALSE;
    }
  if (g_variant_get_uint32 (history) != self->amax_history_length)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "The state has an amax history of %u; this quantizer's is %u",
                   g_variant_get_uint32 (history), self->amax_history_length);
      return FALSE;
    }

  n_groups = g_variant_get_uint32 (groups);
  if (n_groups > GMLP_MAX_GROUPS || (n_groups > 0 && self->recipe != GMLP_SCALING_RECIPE_DELAYED))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "A %s quantizer's state cannot have %u groups", own_recipe, n_groups);
      return FALSE;
    }

  rows = g_new0 (float, MAX ((gsize) n_groups * stride, 1));
  if (!take_floats (state, "scale", rows, stride, GMLP_QUANT_STATE_SCALE, 1, n_groups, TRUE, error) ||
      !take_floats (state, "amax", rows, stride, GMLP_QUANT_STATE_AMAX, 1, n_groups, FALSE, error) ||
      !take_floats (state, "amax-history", rows, stride, GMLP_QUANT_STATE_HISTORY,
                    self->amax_history_length, n_groups, FALSE, error))
    return FALSE;

  if (n_groups == 0)
    {
      gmlp_mutex_lock (&self->state_lock);
      g_clear_object (&self->state);
      self->n_groups = 0;
      gmlp_mutex_unlock (&self->state_lock);
      return TRUE;
    }

  n = n_groups;
  bytes = g_bytes_new_take (g_steal_pointer (&rows), sizeof (float) * n_groups * stride);
  restored = gmlp_grouped_tensor_new_from_bytes (self->device, GMLP_DTYPE_FLOAT32, &n, 1, stride,
                                                 bytes, error);
  if (restored == NULL)
    return FALSE;
  gmlp_mutex_lock (&self->state_lock);
  g_clear_object (&self->state);
  self->state = restored;
  self->n_groups = n_groups;
  gmlp_mutex_unlock (&self->state_lock);
  return TRUE;
}

/**
 * gmlp_quantizer_get_device:
 * @self: a #GmlpQuantizer
 *
 * Gets the device the quantizer works on.
 *
 * Returns: (transfer none): the device of the quantizer
 *
 * Since: 0.1
 */
GmlpDevice *
gmlp_quantizer_get_device (GmlpQuantizer *self)
{
  g_return_val_if_fail (GMLP_IS_QUANTIZER (self), NULL);

  return self->device;
}

/**
 * gmlp_quantizer_get_recipe:
 * @self: a #GmlpQuantizer
 *
 * Gets how the quantizer computes its scales.
 *
 * Returns: the scaling recipe
 *
 * Since: 0.1
 */
GmlpScalingRecipe
gmlp_quantizer_get_recipe (GmlpQuantizer *self)
{
  g_return_val_if_fail (GMLP_IS_QUANTIZER (self), GMLP_SCALING_RECIPE_NONE);

  return self->recipe;
}

/**
 * gmlp_quantizer_get_fp8_format:
 * @self: a #GmlpQuantizer
 *
 * Gets the FP8 format the quantizer writes.
 *
 * Returns: the FP8 format
 *
 * Since: 0.1
 */
GmlpFp8Format
gmlp_quantizer_get_fp8_format (GmlpQuantizer *self)
{
  g_return_val_if_fail (GMLP_IS_QUANTIZER (self), GMLP_FP8_FORMAT_HYBRID);

  return self->format;
}

/**
 * gmlp_quantizer_get_role:
 * @self: a #GmlpQuantizer
 *
 * Gets which operand of a product the quantizer is for.
 *
 * Returns: what the quantizer quantizes
 *
 * Since: 0.1
 */
GmlpQuantizerRole
gmlp_quantizer_get_role (GmlpQuantizer *self)
{
  g_return_val_if_fail (GMLP_IS_QUANTIZER (self), GMLP_QUANTIZER_ROLE_INPUT);

  return self->role;
}

/**
 * gmlp_quantizer_get_dtype:
 * @self: a #GmlpQuantizer
 *
 * Gets the FP8 type of the tensors the quantizer makes: E4M3 or E5M2 as
 * the format says, and for %GMLP_FP8_FORMAT_HYBRID, E5M2 for
 * %GMLP_QUANTIZER_ROLE_GRAD_OUTPUT and E4M3 otherwise.
 *
 * Returns: %GMLP_DTYPE_FLOAT8_E4M3 or %GMLP_DTYPE_FLOAT8_E5M2
 *
 * Since: 0.1
 */
GmlpDType
gmlp_quantizer_get_dtype (GmlpQuantizer *self)
{
  g_return_val_if_fail (GMLP_IS_QUANTIZER (self), GMLP_DTYPE_FLOAT8_E4M3);

  switch (self->format)
    {
    case GMLP_FP8_FORMAT_E5M2:
      return GMLP_DTYPE_FLOAT8_E5M2;
    case GMLP_FP8_FORMAT_HYBRID:
      return self->role == GMLP_QUANTIZER_ROLE_GRAD_OUTPUT ? GMLP_DTYPE_FLOAT8_E5M2
                                                           : GMLP_DTYPE_FLOAT8_E4M3;
    case GMLP_FP8_FORMAT_E4M3:
    default:
      return GMLP_DTYPE_FLOAT8_E4M3;
    }
}

/**
 * gmlp_quantizer_get_amax_history_length:
 * @self: a #GmlpQuantizer
 *
 * Gets how many past maxima delayed scaling keeps.
 *
 * Returns: the length of the amax history of delayed scaling
 *
 * Since: 0.1
 */
guint
gmlp_quantizer_get_amax_history_length (GmlpQuantizer *self)
{
  g_return_val_if_fail (GMLP_IS_QUANTIZER (self), 0);

  return self->amax_history_length;
}

/**
 * gmlp_quantizer_get_margin:
 * @self: a #GmlpQuantizer
 *
 * Gets the margin of delayed scaling: scales are divided by 2 to this power.
 *
 * Returns: the margin of delayed scaling
 *
 * Since: 0.1
 */
int
gmlp_quantizer_get_margin (GmlpQuantizer *self)
{
  g_return_val_if_fail (GMLP_IS_QUANTIZER (self), 0);

  return self->margin;
}

/**
 * gmlp_quantizer_get_power_of_2_scales:
 * @self: a #GmlpQuantizer
 *
 * Tells whether the quantizer rounds its scales to powers of two.
 *
 * Returns: whether current and blockwise scales are rounded down to powers
 *   of two
 *
 * Since: 0.1
 */
gboolean
gmlp_quantizer_get_power_of_2_scales (GmlpQuantizer *self)
{
  g_return_val_if_fail (GMLP_IS_QUANTIZER (self), FALSE);

  return self->power_of_2_scales;
}

/**
 * gmlp_quantizer_get_columnwise:
 * @self: a #GmlpQuantizer
 *
 * Tells whether the quantizer also writes the transposed (columnwise) copy
 * that backward needs.
 *
 * Returns: whether quantized tensors get a columnwise copy
 *
 * Since: 0.1
 */
gboolean
gmlp_quantizer_get_columnwise (GmlpQuantizer *self)
{
  g_return_val_if_fail (GMLP_IS_QUANTIZER (self), FALSE);

  return self->columnwise;
}

/**
 * gmlp_quantizer_set_columnwise:
 * @self: a #GmlpQuantizer
 * @columnwise: whether to write the transposed copy too
 *
 * Sets [property@Gmlp.Quantizer:columnwise]: training needs the copy of
 * the inputs and output gradients for wgrad, inference does not.
 *
 * Since: 0.1
 */
void
gmlp_quantizer_set_columnwise (GmlpQuantizer *self,
                               gboolean       columnwise)
{
  g_return_if_fail (GMLP_IS_QUANTIZER (self));

  columnwise = !!columnwise;
  if (self->columnwise == columnwise)
    return;
  self->columnwise = columnwise;
  g_object_notify_by_pspec (G_OBJECT (self), properties[PROP_COLUMNWISE]);
}

/* ---- For fused producers (gmlp-quantizer-private.h) ---------------------- */

int
gmlp_quantizer_get_quantize_flags (GmlpQuantizer *self)
{
  g_return_val_if_fail (GMLP_IS_QUANTIZER (self), 0);

  return quantize_flags (self);
}

void
gmlp_quantizer_lock_state (GmlpQuantizer *self)
{
  gmlp_mutex_lock (&self->state_lock);
}

void
gmlp_quantizer_unlock_state (GmlpQuantizer *self)
{
  gmlp_mutex_unlock (&self->state_lock);
}

gboolean
gmlp_quantizer_get_state_for (GmlpQuantizer  *self,
                              guint           n_groups,
                              float         **state,
                              GError        **error)
{
  g_return_val_if_fail (GMLP_IS_QUANTIZER (self), FALSE);
  g_return_val_if_fail (state != NULL, FALSE);

  *state = NULL;
  if (self->recipe != GMLP_SCALING_RECIPE_DELAYED)
    return TRUE;
  if (!ensure_state (self, n_groups, error))
    return FALSE;
  *state = gmlp_grouped_tensor_get_data (self->state);
  return TRUE;
}
