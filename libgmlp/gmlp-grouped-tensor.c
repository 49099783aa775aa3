/* gmlp-grouped-tensor.c: the grouped tensor object
 *
 * Its type, properties and construction, its layout, its device copy of
 * host sizes and the views of rows that share its storage. Its getters are
 * in gmlp-grouped-tensor-accessors.c, its members as views in
 * gmlp-grouped-tensor-members.c. The checks of a layout's sizes and byte
 * count are in gmlp-grouped-tensor-layout.c, data in and out (bytes, typed
 * arrays, DLPack) in gmlp-grouped-tensor-interop.c, operations on its
 * values in gmlp-grouped-tensor-ops.c, and quantized tensors in
 * gmlp-grouped-tensor-quantized.c.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <gio/gio.h>

#include <math.h>
#include <string.h>

#include "gmlp-grouped-tensor-impl.h"
#include "gmlp-grouped-tensor-private.h"
#include "gmlp-dtype-private.h"
#include "gmlp-enum-types.h"
#include "gmlp-error.h"
#include "gmlp-error-private.h"
#include "gmlp-numeric.h"
#include "gmlp-thread-private.h"

/**
 * GmlpGroupedTensor:
 *
 * N member matrices of `rows[i] × cols` elements packed in one allocation on
 * one [class@Gmlp.Device].
 *
 * Members are stored row-major, in order; each starts on a
 * %GMLP_MEMBER_ALIGNMENT (256-byte) boundary, so a member is padded at its end
 * when its byte size is not a multiple of 256. When `cols × element size` is a
 * multiple of 256 there is no padding and the members are simply consecutive
 * rows.
 *
 * The group sizes ("m_splits") live either on the host, or only on the
 * device: [ctor@Gmlp.GroupedTensor.new_with_device_sizes] takes a device INT64
 * sizes tensor and a row capacity, and nothing on the host needs to know the
 * sizes, so work on such a tensor never waits for the device. Its allocation
 * holds the worst case: the capacity plus the padding of every member.
 *
 * [method@Gmlp.GroupedTensor.get_member] gives a member as a one-group view
 * sharing the storage. Data comes in and goes out in the packed order
 * (members in order, row-major, no padding): as #GBytes, as typed arrays
 * ([ctor@Gmlp.GroupedTensor.new_from_floats],
 * [method@Gmlp.GroupedTensor.to_floats] and their int and 16-bit
 * siblings), or through DLPack, without a copy where the layout allows
 * (see the memory layout page).
 *
 * A tensor can also be made with g_object_new() (`Gmlp.GroupedTensor(rows=…,
 * cols=…)` in Python, `new Gmlp.GroupedTensor({rows: …, cols: …})` in gjs)
 * from its construct properties: [property@Gmlp.GroupedTensor:rows] (host
 * sizes) or [property@Gmlp.GroupedTensor:sizes] with
 * [property@Gmlp.GroupedTensor:row-capacity] (device sizes), and
 * [property@Gmlp.GroupedTensor:cols], [property@Gmlp.GroupedTensor:dtype]
 * and [property@Gmlp.GroupedTensor:device]. Such a tensor is complete; when
 * the properties are invalid, or none is given, every method fails with the
 * reason ([iface@Gio.Initable] reports it too).
 * A tensor's shape, dtype and device never change, and what it makes on
 * demand (the device copy of host group sizes,
 * [method@Gmlp.GroupedTensor.get_sizes]) is made once: any number of threads
 * may read a tensor at once, for example use one input in forwards on
 * several threads. Its data is not locked: a call that writes into a
 * tensor (as an output, or [method@Gmlp.GroupedTensor.fill_zero] and the
 * like) must not run while another thread reads or writes that tensor or a
 * view of its storage; order such calls yourself.
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
 * import array
 *
 * dev = Gmlp.Device.get_default()
 * data = array.array('f', range(3 * 4 + 1 * 4))          # members of 3 and 1 rows, 4 columns
 * x = Gmlp.GroupedTensor.new_from_bytes(dev, Gmlp.DType.FLOAT32, [3, 1], 4,
 *                                       GLib.Bytes.new(data.tobytes()))
 * x.scale(2.0)
 * print(x.get_n_groups(), x.get_total_rows(), x.get_cols(), x.sum_squares())
 * back = array.array('f', x.to_bytes().get_data())     # packed, no padding
 * first = x.get_member(0)                               # a view sharing the storage
 * ```
 *
 * In JavaScript (gjs; run with `gjs -m`):
 *
 * ```js
 * import GLib from 'gi://GLib';
 * import Gmlp from 'gi://Gmlp?version=1.0';
 *
 * const dev = Gmlp.Device.get_default();
 * const data = Float32Array.from({length: 4 * 4}, (_, i) => i);  // members of 3 and 1 rows
 * const x = Gmlp.GroupedTensor.new_from_bytes(dev, Gmlp.DType.FLOAT32, [3, 1], 4,
 *     new GLib.Bytes(new Uint8Array(data.buffer)));    // bytes, not the floats' values
 * x.scale(2.0);
 * print(x.get_n_groups(), x.get_total_rows(), x.get_cols(), x.sum_squares());
 * const back = new Float32Array(x.to_bytes().toArray().slice().buffer);
 * const first = x.get_member(0);                       // a view sharing the storage
 * ```
 *
 * Since: 0.1
 */

static void gmlp_grouped_tensor_initable_iface_init (GInitableIface *iface);

G_DEFINE_FINAL_TYPE_WITH_CODE (GmlpGroupedTensor, gmlp_grouped_tensor, G_TYPE_OBJECT,
                               G_IMPLEMENT_INTERFACE (G_TYPE_INITABLE,
                                                      gmlp_grouped_tensor_initable_iface_init))

enum {
  PROP_0,
  PROP_DEVICE,
  PROP_DTYPE,
  PROP_N_GROUPS,
  PROP_COLS,
  PROP_ROW_CAPACITY,
  PROP_ROWS,
  PROP_SIZES,
  N_PROPS
};

static GParamSpec *properties[N_PROPS];

/* The host sizes and offsets of a layout: one allocation, or none for one
 * group. The rows that set_property() takes are apart until layout_init(). */
static void
clear_rows (GmlpGroupedTensor *self)
{
  if (self->rows != self->one_group)
    g_free (self->rows);
  self->rows = NULL;
  self->offsets = NULL;
}

static void
gmlp_grouped_tensor_finalize (GObject *object)
{
  GmlpGroupedTensor *self = (GmlpGroupedTensor *) object;

  /* After the other threads' use (gmlp_object_unref_shared()). */
  gmlp_tsan_acquire (self);
  g_clear_pointer (&self->buffer, gmlp_buffer_unref);
  g_clear_object (&self->sizes);
  g_clear_object (&self->device);
  clear_rows (self);
  g_clear_error (&self->construct_error);

  ((GObjectClass *) gmlp_grouped_tensor_parent_class)->finalize (object);
}

static void
gmlp_grouped_tensor_get_property (GObject    *object,
                                  guint       prop_id,
                                  GValue     *value,
                                  GParamSpec *pspec)
{
  GmlpGroupedTensor *self = GMLP_GROUPED_TENSOR (object);

  switch (prop_id)
    {
    case PROP_DEVICE:
      g_value_set_object (value, self->device);
      break;
    case PROP_DTYPE:
      g_value_set_enum (value, self->dtype);
      break;
    case PROP_N_GROUPS:
      g_value_set_uint (value, self->n_groups);
      break;
    case PROP_COLS:
      g_value_set_int64 (value, self->cols);
      break;
    case PROP_ROW_CAPACITY:
      g_value_set_int64 (value, self->row_capacity);
      break;
    case PROP_ROWS:
      g_value_take_variant (value, self->rows == NULL ? NULL :
                            g_variant_new_fixed_array (G_VARIANT_TYPE_INT64, self->rows,
                                                       self->n_groups, sizeof (gint64)));
      break;
    case PROP_SIZES:
      g_value_set_object (value, self->rows == NULL ? self->sizes : NULL);
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
    }
}

/* Construct-only: constructed() checks them together and allocates.
 * GObject sets every construct property, with its default when not given,
 * and the library's own constructors give none: so each tensor it makes
 * passes here six times, and a value that is its property's default (as
 * g_param_value_defaults() would say, tested here directly, which costs a
 * fraction) is skipped. */
static void
gmlp_grouped_tensor_set_property (GObject      *object,
                                  guint         prop_id,
                                  const GValue *value,
                                  GParamSpec   *pspec)
{
  GmlpGroupedTensor *self = (GmlpGroupedTensor *) object;
  GVariant *rows;
  GObject *given;

  switch (prop_id)
    {
    case PROP_DEVICE:
      if ((given = g_value_get_object (value)) != NULL)
        {
          self->device = g_object_ref ((GmlpDevice *) given);
          self->construct_props = TRUE;
        }
      break;
    case PROP_DTYPE:
      if (g_value_get_enum (value) != GMLP_DTYPE_FLOAT32)
        {
          self->dtype = g_value_get_enum (value);
          self->construct_props = TRUE;
        }
      break;
    case PROP_COLS:
      if (g_value_get_int64 (value) != 0)
        {
          self->cols = g_value_get_int64 (value);
          self->construct_props = TRUE;
        }
      break;
    case PROP_ROW_CAPACITY:
      if (g_value_get_int64 (value) != 0)
        {
          self->row_capacity = g_value_get_int64 (value);
          self->construct_props = TRUE;
        }
      break;
    case PROP_ROWS:
      rows = g_value_get_variant (value);
      if (rows != NULL)
        {
          gsize n;
          const gint64 *data = g_variant_get_fixed_array (rows, &n, sizeof (gint64));

          /* More groups than a guint counts are refused in constructed(). */
          self->n_groups = (guint) MIN (n, (gsize) G_MAXUINT);
          self->rows = g_memdup2 (data, sizeof (gint64) * self->n_groups);
          self->construct_props = TRUE;
        }
      break;
    case PROP_SIZES:
      if ((given = g_value_get_object (value)) != NULL)
        {
          self->sizes = g_object_ref ((GmlpGroupedTensor *) given);
          self->construct_props = TRUE;
        }
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
    }
}

static void layout_init (GmlpGroupedTensor *self,
                         GmlpDevice        *device,
                         GmlpDType          dtype,
                         const gint64      *rows,
                         guint              n_groups,
                         gint64             cols,
                         gint64             row_capacity);
static gboolean check_device_sizes (GmlpDevice         *device,
                                    GmlpDType           dtype,
                                    GmlpGroupedTensor  *sizes,
                                    gint64              row_capacity,
                                    gint64              cols,
                                    guint              *n_groups,
                                    GError            **error);

/* The work of the constructors, for a tensor made from its properties. */
static gboolean
construct_from_properties (GmlpGroupedTensor  *self,
                           GError            **error)
{
  g_autoptr(GmlpDevice) device = NULL;
  g_autofree gint64 *rows = g_steal_pointer (&self->rows);
  guint n_groups = self->n_groups;
  gint64 row_capacity;

  if (self->device == NULL)
    self->device = g_object_ref (gmlp_device_get_default ());
  device = g_object_ref (self->device);
  if (!gmlp_device_check_usable (device, error))
    return FALSE;

  if ((rows != NULL) == (self->sizes != NULL))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "A GroupedTensor takes its group sizes from one of the properties "
                   "\"rows\" (on the host) or \"sizes\" (on the device)");
      return FALSE;
    }

  if (rows != NULL)
    {
      if (!gmlp_grouped_tensor_check_common (device, self->dtype, n_groups, self->cols, error) ||
          !gmlp_grouped_tensor_check_rows (rows, n_groups, self->cols, self->dtype, &row_capacity,
                                           error))
        return FALSE;
    }
  else
    {
      row_capacity = self->row_capacity;
      if (!check_device_sizes (device, self->dtype, self->sizes, row_capacity, self->cols,
                               &n_groups, error))
        return FALSE;
    }

  layout_init (self, device, self->dtype, rows, n_groups, self->cols, row_capacity);
  self->buffer = gmlp_buffer_new (device, self->nbytes, error);
  return self->buffer != NULL;
}

static void
gmlp_grouped_tensor_constructed (GObject *object)
{
  GmlpGroupedTensor *self = (GmlpGroupedTensor *) object;

  ((GObjectClass *) gmlp_grouped_tensor_parent_class)->constructed (object);

  /* The library's own constructors give no property and lay the tensor out
   * themselves; a bare g_object_new() stays empty (check_usable() says so). */
  if (self->construct_props && !construct_from_properties (self, &self->construct_error))
    {
      clear_rows (self);
      g_clear_pointer (&self->buffer, gmlp_buffer_unref);
      self->n_groups = 0;
      self->nbytes = 0;
    }
}

static gboolean
gmlp_grouped_tensor_initable_init (GInitable     *initable,
                                   GCancellable  *cancellable,
                                   GError       **error)
{
  return gmlp_grouped_tensor_check_usable (GMLP_GROUPED_TENSOR (initable), error);
}

static void
gmlp_grouped_tensor_initable_iface_init (GInitableIface *iface)
{
  iface->init = gmlp_grouped_tensor_initable_init;
}

gboolean
gmlp_grouped_tensor_check_usable (GmlpGroupedTensor  *self,
                                  GError            **error)
{
  if (G_LIKELY (self->buffer != NULL))
    return TRUE;
  if (self->construct_error != NULL)
    return gmlp_check_constructed (self, self->construct_error, error);

  g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE,
               "This GroupedTensor has no storage: it was made by g_object_new() without its "
               "construct properties (rows or sizes, and cols)");
  return FALSE;
}

static void
gmlp_grouped_tensor_class_init (GmlpGroupedTensorClass *klass)
{
  GObjectClass *object_class = G_OBJECT_CLASS (klass);

  const GParamFlags construct = G_PARAM_READWRITE | G_PARAM_CONSTRUCT_ONLY |
                                G_PARAM_EXPLICIT_NOTIFY | G_PARAM_STATIC_STRINGS;

  object_class->finalize = gmlp_grouped_tensor_finalize;
  object_class->get_property = gmlp_grouped_tensor_get_property;
  object_class->set_property = gmlp_grouped_tensor_set_property;
  object_class->constructed = gmlp_grouped_tensor_constructed;

  /* The ranges of the construct properties are wide on purpose: a bad value
   * is a GError of the construction, not a warning of GObject's. */

  /**
   * GmlpGroupedTensor:device:
   *
   * The device holding the storage; at construction, %NULL stands for
   * [func@Gmlp.Device.get_default].
   *
   * Since: 0.1
   */
  properties[PROP_DEVICE] =
    g_param_spec_object ("device", NULL, NULL, GMLP_TYPE_DEVICE, construct);

  /**
   * GmlpGroupedTensor:dtype:
   *
   * The element type.
   *
   * Since: 0.1
   */
  properties[PROP_DTYPE] =
    g_param_spec_enum ("dtype", NULL, NULL, GMLP_TYPE_DTYPE, GMLP_DTYPE_FLOAT32, construct);

  /**
   * GmlpGroupedTensor:n-groups:
   *
   * The number of members.
   *
   * Since: 0.1
   */
  properties[PROP_N_GROUPS] =
    g_param_spec_uint ("n-groups", NULL, NULL,
                       0, G_MAXUINT, 0,
                       G_PARAM_READABLE | G_PARAM_EXPLICIT_NOTIFY | G_PARAM_STATIC_STRINGS);

  /**
   * GmlpGroupedTensor:cols:
   *
   * The number of columns of every member.
   *
   * Since: 0.1
   */
  properties[PROP_COLS] =
    g_param_spec_int64 ("cols", NULL, NULL, G_MININT64, G_MAXINT64, 0, construct);

  /**
   * GmlpGroupedTensor:row-capacity:
   *
   * The number of rows the storage can hold over all members: the total row
   * count when the sizes are on the host. At construction it is given with
   * [property@Gmlp.GroupedTensor:sizes] (and ignored with
   * [property@Gmlp.GroupedTensor:rows]).
   *
   * Since: 0.1
   */
  properties[PROP_ROW_CAPACITY] =
    g_param_spec_int64 ("row-capacity", NULL, NULL, G_MININT64, G_MAXINT64, 0, construct);

  /**
   * GmlpGroupedTensor:rows:
   *
   * The group sizes on the host, as an array of int64 (`ax`), or %NULL when
   * they are only on the device. At construction it gives the tensor host
   * sizes, as [ctor@Gmlp.GroupedTensor.new] does.
   *
   * Since: 0.1
   */
  properties[PROP_ROWS] =
    g_param_spec_variant ("rows", NULL, NULL, G_VARIANT_TYPE ("ax"), NULL, construct);

  /**
   * GmlpGroupedTensor:sizes:
   *
   * The device INT64 sizes tensor of a tensor with device-only sizes, or
   * %NULL when the sizes are on the host. At construction it gives the
   * tensor device sizes, with [property@Gmlp.GroupedTensor:row-capacity], as
   * [ctor@Gmlp.GroupedTensor.new_with_device_sizes] does.
   *
   * Since: 0.1
   */
  properties[PROP_SIZES] =
    g_param_spec_object ("sizes", NULL, NULL, GMLP_TYPE_GROUPED_TENSOR, construct);

  g_object_class_install_properties (object_class, N_PROPS, properties);
}

static void
gmlp_grouped_tensor_init (GmlpGroupedTensor *self)
{
  /* The dtype property's default, which set_property() skips. */
  self->dtype = GMLP_DTYPE_FLOAT32;
}

/* Lays @self out, with no storage yet: the host sizes, the member offsets
 * and the span it needs. The sizes were checked
 * (gmlp_grouped_tensor_check_rows(), check_device_sizes()), so no count here
 * overflows. */
static void
layout_init (GmlpGroupedTensor *self,
             GmlpDevice        *device,
             GmlpDType          dtype,
             const gint64      *rows,
             guint              n_groups,
             gint64             cols,
             gint64             row_capacity)
{
  guint64 row_bytes = (guint64) cols * gmlp_dtype_get_size (dtype);
  gsize offset = 0;
  guint g;

  g_set_object (&self->device, device);
  self->dtype = dtype;
  self->n_groups = n_groups;
  self->cols = cols;
  self->row_capacity = row_capacity;
  self->uniform = rows != NULL;

  if (rows != NULL)
    {
      self->rows = n_groups == 1 ? self->one_group : g_new (gint64, 2 * (gsize) n_groups);
      self->offsets = self->rows + n_groups;
      memcpy (self->rows, rows, sizeof (gint64) * n_groups);
      for (g = 0; g < n_groups; g++)
        {
          self->offsets[g] = (gint64) offset;
          offset += gmlp_num_member_stride (rows[g], row_bytes);
          if (rows[g] != rows[0])
            self->uniform = FALSE;
        }
    }

  if (!gmlp_grouped_tensor_layout_bytes (n_groups, rows, row_capacity, row_bytes, &self->nbytes))
    g_assert_not_reached ();
}

GmlpGroupedTensor *
gmlp_grouped_tensor_new_layout (GmlpDevice     *device,
                                GmlpDType       dtype,
                                const gint64   *rows,
                                guint           n_groups,
                                gint64          cols,
                                gint64          row_capacity)
{
  GmlpGroupedTensor *self = g_object_new (GMLP_TYPE_GROUPED_TENSOR, NULL);

  layout_init (self, device, dtype, rows, n_groups, cols, row_capacity);
  return self;
}

GmlpGroupedTensor *
gmlp_grouped_tensor_new_internal (GmlpDevice     *device,
                                  GmlpDType       dtype,
                                  const gint64   *rows,
                                  guint           n_groups,
                                  gint64          cols,
                                  gint64          row_capacity,
                                  GError        **error)
{
  g_autoptr(GmlpGroupedTensor) self = gmlp_grouped_tensor_new_layout (device, dtype, rows, n_groups,
                                                                      cols, row_capacity);

  self->buffer = gmlp_buffer_new (device, self->nbytes, error);
  if (self->buffer == NULL)
    return NULL;

  return g_steal_pointer (&self);
}

void
gmlp_grouped_tensor_take_buffer (GmlpGroupedTensor *self,
                                 GmlpBuffer        *buffer)
{
  g_assert (self->buffer == NULL && buffer->nbytes >= self->nbytes);

  self->buffer = buffer;
}

/**
 * gmlp_grouped_tensor_new:
 * @device: the device to allocate on
 * @dtype: the element type
 * @rows: (array length=n_groups): the number of rows of each member
 * @n_groups: the number of members
 * @cols: the number of columns of every member
 * @error: return location for a #GError
 *
 * Allocates a grouped tensor with its group sizes on the host. The contents
 * are undefined until written (see [method@Gmlp.GroupedTensor.fill_zero]).
 * Members with zero rows are valid.
 *
 * Returns: (transfer full): a new tensor, or %NULL with %GMLP_ERROR_INVALID_ARGUMENT
 *   for negative or absurd sizes, `cols <= 0`, no groups or more than 65535,
 *   or %GMLP_ERROR_OUT_OF_MEMORY
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_tensor_new (GmlpDevice    *device,
                         GmlpDType      dtype,
                         const gint64  *rows,
                         guint          n_groups,
                         gint64         cols,
                         GError       **error)
{
  gint64 total_rows;

  g_return_val_if_fail (GMLP_IS_DEVICE (device), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!gmlp_grouped_tensor_check_common (device, dtype, n_groups, cols, error) ||
      !gmlp_grouped_tensor_check_rows (rows, n_groups, cols, dtype, &total_rows, error))
    return NULL;

  return gmlp_grouped_tensor_new_internal (device, dtype, rows, n_groups, cols, total_rows, error);
}

/**
 * gmlp_grouped_tensor_new_uniform:
 * @device: the device to allocate on
 * @dtype: the element type
 * @n_groups: the number of members
 * @rows: the number of rows of every member
 * @cols: the number of columns of every member
 * @error: return location for a #GError
 *
 * Allocates a grouped tensor whose members all have the same shape, as
 * weights and their gradients do.
 *
 * Returns: (transfer full): a new tensor, or %NULL with an error
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_tensor_new_uniform (GmlpDevice  *device,
                                 GmlpDType    dtype,
                                 guint        n_groups,
                                 gint64       rows,
                                 gint64       cols,
                                 GError     **error)
{
  g_autofree gint64 *all_rows = NULL;
  guint g;

  g_return_val_if_fail (GMLP_IS_DEVICE (device), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!gmlp_grouped_tensor_check_common (device, dtype, n_groups, cols, error))
    return NULL;

  all_rows = g_new (gint64, n_groups);
  for (g = 0; g < n_groups; g++)
    all_rows[g] = rows;

  return gmlp_grouped_tensor_new (device, dtype, all_rows, n_groups, cols, error);
}

/**
 * gmlp_grouped_tensor_new_with_device_sizes:
 * @device: the device to allocate on
 * @dtype: the element type
 * @sizes: a one-member INT64 tensor on @device holding the row count of each
 *   group; it is referenced, not copied, so writing new sizes into it changes
 *   the layout of the tensor
 * @row_capacity: the largest total number of rows the groups may have
 * @cols: the number of columns of every member
 * @error: return location for a #GError
 *
 * Allocates a grouped tensor whose group sizes are known only on the device,
 * for example as written by a router kernel. The number of groups is the
 * number of elements of @sizes. Nothing on the host reads the sizes, so work
 * on the tensor never waits for the device; the kernels clamp sizes that add
 * up to more than @row_capacity.
 *
 * Returns: (transfer full): a new tensor, or %NULL with
 *   %GMLP_ERROR_DTYPE_MISMATCH if @sizes is not INT64, or
 *   %GMLP_ERROR_INVALID_ARGUMENT for a @sizes tensor on another device or of
 *   several members, or a negative or absurd capacity
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_tensor_new_with_device_sizes (GmlpDevice         *device,
                                           GmlpDType           dtype,
                                           GmlpGroupedTensor  *sizes,
                                           gint64              row_capacity,
                                           gint64              cols,
                                           GError            **error)
{
  GmlpGroupedTensor *self;
  guint n_groups;

  g_return_val_if_fail (GMLP_IS_DEVICE (device), NULL);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (sizes), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!check_device_sizes (device, dtype, sizes, row_capacity, cols, &n_groups, error))
    return NULL;

  self = gmlp_grouped_tensor_new_internal (device, dtype, NULL, n_groups, cols, row_capacity, error);
  if (self != NULL)
    self->sizes = g_object_ref (sizes);
  return self;
}

/* Checks the arguments of a tensor with device-only sizes; the number of
 * groups is the number of elements of @sizes. */
static gboolean
check_device_sizes (GmlpDevice         *device,
                    GmlpDType           dtype,
                    GmlpGroupedTensor  *sizes,
                    gint64              row_capacity,
                    gint64              cols,
                    guint              *n_groups,
                    GError            **error)
{
  guint64 n_sizes;
  gsize nbytes;

  if (!gmlp_grouped_tensor_check_usable (sizes, error))
    return FALSE;
  if (sizes->dtype != GMLP_DTYPE_INT64)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_DTYPE_MISMATCH,
                   "Group sizes must be int64, not %s", gmlp_dtype_get_name (sizes->dtype));
      return FALSE;
    }
  if (sizes->device != device)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "The group sizes are on %s, the tensor on %s",
                   gmlp_device_get_name (sizes->device), gmlp_device_get_name (device));
      return FALSE;
    }
  if (sizes->rows == NULL || sizes->n_groups != 1)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "The group sizes must be one contiguous member");
      return FALSE;
    }

  /* Past G_MAXUINT, gmlp_grouped_tensor_check_common() refuses the count as
   * it refuses any count past GMLP_MAX_GROUPS. */
  if (!gmlp_checked_mul ((guint64) sizes->rows[0], (guint64) sizes->cols, &n_sizes) ||
      n_sizes > G_MAXUINT)
    n_sizes = G_MAXUINT;
  if (!gmlp_grouped_tensor_check_common (device, dtype, (guint) n_sizes, cols, error))
    return FALSE;
  if (row_capacity < 0 || row_capacity > GMLP_MAX_ROWS ||
      !gmlp_grouped_tensor_layout_bytes ((guint) n_sizes, NULL, row_capacity,
                                         (guint64) cols * gmlp_dtype_get_size (dtype), &nbytes))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "Invalid row capacity %" G_GINT64_FORMAT, row_capacity);
      return FALSE;
    }

  *n_groups = (guint) n_sizes;
  return TRUE;
}

/**
 * gmlp_grouped_tensor_get_sizes:
 * @self: a #GmlpGroupedTensor
 * @error: return location for a #GError
 *
 * Gets the group sizes as a device tensor: one member of `n_groups × 1`
 * INT64 values. For a tensor with device-only sizes this is the tensor it
 * was created with; for host sizes they are uploaded on the first call,
 * once, also when several threads call at the same time.
 *
 * Returns: (transfer none): the sizes tensor, or %NULL with an error
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_tensor_get_sizes (GmlpGroupedTensor  *self,
                               GError            **error)
{
  GmlpGroupedTensor *sizes;

  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!gmlp_grouped_tensor_check_usable (self, error))
    return NULL;

  sizes = g_atomic_pointer_get (&self->sizes);
  if (sizes == NULL)
    {
      gint64 n = self->n_groups;
      g_autoptr(GmlpGroupedTensor) made = NULL;

      /* One member of n rows, one INT64 column: no padding to lay out. */
      made = gmlp_grouped_tensor_new_internal (self->device, GMLP_DTYPE_INT64, &n, 1, 1, n, error);
      if (made == NULL ||
          !GMLP_DEVICE_CALL (self->device, upload, gmlp_grouped_tensor_get_data (made), self->rows,
                             sizeof (gint64) * self->n_groups, error))
        return NULL;
      /* Threads that share the tensor may upload at once: the first copy
       * published is the one, the others are dropped. */
      if (g_atomic_pointer_compare_and_exchange (&self->sizes, NULL, made))
        sizes = g_steal_pointer (&made);
      else
        sizes = g_atomic_pointer_get (&self->sizes);
    }

  return sizes;
}

gboolean
gmlp_grouped_tensor_get_backend_shape (GmlpGroupedTensor  *self,
                                       GmlpBackendShape   *shape,
                                       GError            **error)
{
  gconstpointer device_rows = g_atomic_pointer_get (&self->kept_rows);
  GmlpGroupedTensor *sizes;

  /* Host sizes: the device's copy of these values when it keeps one
   * (uploaded once for every tensor of the same sizes), else the tensor's
   * own (get_sizes()), uploaded once. */
  if (device_rows == NULL && self->rows != NULL)
    {
      if (!gmlp_grouped_tensor_check_usable (self, error) ||
          !gmlp_device_get_uploaded_sizes (self->device, self->rows, self->n_groups, &device_rows,
                                           error))
        return FALSE;
      if (device_rows != NULL)
        g_atomic_pointer_set (&self->kept_rows, device_rows);
    }
  if (device_rows == NULL)
    {
      sizes = gmlp_grouped_tensor_get_sizes (self, error);
      if (sizes == NULL)
        return FALSE;
      device_rows = gmlp_grouped_tensor_get_data (sizes);
    }

  shape->device_rows = (gpointer) device_rows;
  shape->n_groups = self->n_groups;
  shape->cols = self->cols;
  shape->row_capacity = self->row_capacity;
  return TRUE;
}

/**
 * gmlp_grouped_tensor_read_sizes:
 * @self: a #GmlpGroupedTensor
 * @n_groups: (out): return location for the number of groups
 * @error: return location for a #GError
 *
 * Reads the group sizes into host memory. For device-only sizes this waits
 * for the device; the values are those after all work enqueued so far. That
 * fails with %GMLP_ERROR_INVALID_STATE while the device captures a graph.
 *
 * Returns: (array length=n_groups) (transfer full): the row count of each
 *   group, or %NULL with an error
 *
 * Since: 0.1
 */
gint64 *
gmlp_grouped_tensor_read_sizes (GmlpGroupedTensor  *self,
                                guint              *n_groups,
                                GError            **error)
{
  gint64 *rows;

  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), NULL);
  g_return_val_if_fail (n_groups != NULL, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  *n_groups = 0;
  if (!gmlp_grouped_tensor_check_usable (self, error))
    return NULL;
  if (self->rows != NULL)
    {
      *n_groups = self->n_groups;
      return g_memdup2 (self->rows, sizeof (gint64) * self->n_groups);
    }

  if (!gmlp_device_check_not_capturing (self->device, "Reading device group sizes", error))
    return NULL;
  rows = g_new (gint64, self->n_groups);
  if (!GMLP_DEVICE_CALL (self->device, download, rows,
                         gmlp_grouped_tensor_get_data (self->sizes),
                         sizeof (gint64) * self->n_groups, error))
    {
      g_free (rows);
      return NULL;
    }

  *n_groups = self->n_groups;
  return rows;
}

GmlpGroupedTensor *
gmlp_grouped_tensor_new_like (GmlpGroupedTensor  *self,
                              GmlpDType           dtype,
                              GError            **error)
{
  GmlpGroupedTensor *result = gmlp_grouped_tensor_new_internal (self->device, dtype, self->rows,
                                                                self->n_groups, self->cols,
                                                                self->row_capacity, error);

  if (result != NULL && self->rows == NULL)
    result->sizes = g_object_ref (self->sizes);
  return result;
}

GmlpGroupedTensor *
gmlp_grouped_tensor_new_with_buffer (const GmlpTensorLayout *layout,
                                     GmlpBuffer             *buffer)
{
  GmlpGroupedTensor *self = gmlp_grouped_tensor_new_layout (layout->device, layout->dtype,
                                                            layout->rows, layout->n_groups,
                                                            layout->cols, layout->row_capacity);

  g_assert (self->nbytes == layout->nbytes && buffer->nbytes >= layout->nbytes);

  if (layout->rows == NULL)
    self->sizes = g_object_ref (layout->sizes);
  self->buffer = gmlp_buffer_ref (buffer);
  return self;
}

GmlpGroupedTensor *
gmlp_grouped_tensor_new_rows_view (GmlpGroupedTensor *self,
                                   const gint64      *rows,
                                   guint              n_groups)
{
  GmlpTensorLayout layout;
  GmlpGroupedTensor *view = NULL;
  gint64 total = 0;
  guint g;

  for (g = 0; g < n_groups; g++)
    {
      if (rows[g] < 0 || total > G_MAXINT64 - rows[g])
        return NULL;
      total += rows[g];
    }
  if (self->offset != 0)
    return NULL;
  gmlp_grouped_tensor_get_layout (self, &layout);
  g_clear_object (&layout.sizes);
  g_free (layout.rows);
  layout.n_groups = n_groups;
  layout.rows = g_memdup2 (rows, n_groups * sizeof (gint64));
  layout.row_capacity = total;
  if (gmlp_grouped_tensor_layout_bytes (n_groups, rows, total,
                                        (guint64) layout.cols * gmlp_dtype_get_size (layout.dtype),
                                        &layout.nbytes) &&
      layout.nbytes <= self->nbytes)
    view = gmlp_grouped_tensor_new_with_buffer (&layout, self->buffer);
  gmlp_tensor_layout_clear (&layout);
  return view;
}
