/* gmlp-grouped-tensor.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <gio/gio.h>

#include <math.h>
#include <string.h>

#include "gmlp-grouped-tensor-private.h"
#include <dlpack/dlpack.h>
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

struct _GmlpGroupedTensor
{
  GObject             parent_instance;

  GmlpDevice         *device;
  GmlpDType           dtype;
  guint               n_groups;
  gint64              cols;
  gint64              row_capacity;
  gint64             *rows;        /* host sizes, or NULL when device-only */
  gint64             *offsets;     /* byte offsets of members, NULL when device-only */
  GmlpGroupedTensor  *sizes;       /* device INT64 sizes; lazily uploaded for host sizes */
  GmlpBuffer         *buffer;
  gsize               offset;      /* of this tensor inside buffer */
  gsize               nbytes;      /* span of this tensor inside buffer */
  GError             *construct_error;
  guint               uniform : 1;
  guint               is_view : 1;
  guint               construct_props : 1;  /* made by g_object_new() with properties */
};

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

/* Sizes beyond these are reported as errors, not attempted: no real tensor
 * comes near them. Byte counts are checked for overflow on the way
 * (gmlp_grouped_tensor_layout_bytes()), and once a layout is within
 * MAX_BYTES every later count derived from it is too. */
#define MAX_ROWS  (G_GINT64_CONSTANT (1) << 40)
#define MAX_COLS  (G_GINT64_CONSTANT (1) << 31)
#define MAX_BYTES (G_GUINT64_CONSTANT (1) << 50)

static void
gmlp_grouped_tensor_finalize (GObject *object)
{
  GmlpGroupedTensor *self = (GmlpGroupedTensor *) object;

  /* After the other threads' use (gmlp_object_unref_shared()). */
  gmlp_tsan_acquire (self);
  g_clear_pointer (&self->buffer, gmlp_buffer_unref);
  g_clear_object (&self->sizes);
  g_clear_object (&self->device);
  g_clear_pointer (&self->rows, g_free);
  g_clear_pointer (&self->offsets, g_free);
  g_clear_error (&self->construct_error);

  G_OBJECT_CLASS (gmlp_grouped_tensor_parent_class)->finalize (object);
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

/* Construct-only: constructed() checks them together and allocates. */
static void
gmlp_grouped_tensor_set_property (GObject      *object,
                                  guint         prop_id,
                                  const GValue *value,
                                  GParamSpec   *pspec)
{
  GmlpGroupedTensor *self = GMLP_GROUPED_TENSOR (object);
  GVariant *rows;

  /* GObject sets every construct property, with its default when not
   * given; the library's own constructors give none. */
  if (!g_param_value_defaults (pspec, value))
    self->construct_props = TRUE;

  switch (prop_id)
    {
    case PROP_DEVICE:
      self->device = g_value_dup_object (value);
      break;
    case PROP_DTYPE:
      self->dtype = g_value_get_enum (value);
      break;
    case PROP_COLS:
      self->cols = g_value_get_int64 (value);
      break;
    case PROP_ROW_CAPACITY:
      self->row_capacity = g_value_get_int64 (value);
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
        }
      break;
    case PROP_SIZES:
      self->sizes = g_value_dup_object (value);
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
static gboolean check_common (GmlpDevice  *device,
                              GmlpDType    dtype,
                              guint        n_groups,
                              gint64       cols,
                              GError     **error);
static gboolean check_rows (const gint64  *rows,
                            guint          n_groups,
                            gint64         cols,
                            GmlpDType      dtype,
                            gint64        *total_rows,
                            GError       **error);
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
      if (!check_common (device, self->dtype, n_groups, self->cols, error) ||
          !check_rows (rows, n_groups, self->cols, self->dtype, &row_capacity, error))
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
  GmlpGroupedTensor *self = GMLP_GROUPED_TENSOR (object);

  G_OBJECT_CLASS (gmlp_grouped_tensor_parent_class)->constructed (object);

  /* The library's own constructors give no property and lay the tensor out
   * themselves; a bare g_object_new() stays empty (check_usable() says so). */
  if (self->construct_props && !construct_from_properties (self, &self->construct_error))
    {
      g_clear_pointer (&self->rows, g_free);
      g_clear_pointer (&self->offsets, g_free);
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
}

/* Rounds @bytes up to the member alignment, or FALSE past 64 bits. */
static gboolean
align_member (guint64  bytes,
              guint64 *aligned)
{
  if (!gmlp_checked_add (bytes, kGmlpMemberAlignment - 1, aligned))
    return FALSE;
  *aligned &= ~(guint64) (kGmlpMemberAlignment - 1);
  return TRUE;
}

gboolean
gmlp_grouped_tensor_layout_bytes (guint          n_groups,
                                  const gint64  *rows,
                                  gint64         row_capacity,
                                  guint64        row_bytes,
                                  gsize         *nbytes)
{
  guint64 bytes = 0, member;
  guint g;

  if (rows != NULL)
    {
      for (g = 0; g < n_groups; g++)
        if (rows[g] < 0 ||
            !gmlp_checked_mul ((guint64) rows[g], row_bytes, &member) ||
            !align_member (member, &member) ||
            !gmlp_checked_add (bytes, member, &bytes))
          return FALSE;
    }
  else
    {
      /* As gmlp_num_device_sized_bytes(), checked. */
      if (row_capacity < 0 || !gmlp_checked_mul ((guint64) row_capacity, row_bytes, &bytes))
        return FALSE;
      if (row_bytes % kGmlpMemberAlignment != 0 &&
          !gmlp_checked_add (bytes, (guint64) n_groups * (kGmlpMemberAlignment - 1), &bytes))
        return FALSE;
      if (!align_member (bytes, &bytes))
        return FALSE;
      g_assert (bytes == gmlp_num_device_sized_bytes (n_groups, row_capacity, row_bytes));
    }

  if (bytes > MAX_BYTES)
    return FALSE;
  *nbytes = bytes;
  return TRUE;
}

static gboolean
check_common (GmlpDevice  *device,
              GmlpDType    dtype,
              guint        n_groups,
              gint64       cols,
              GError     **error)
{
  if (gmlp_dtype_get_size (dtype) == 0)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "Invalid dtype %d", (int) dtype);
      return FALSE;
    }
  if (n_groups == 0 || n_groups > GMLP_MAX_GROUPS)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "A grouped tensor has 1 to %d groups, not %u", GMLP_MAX_GROUPS, n_groups);
      return FALSE;
    }
  if (cols <= 0 || cols > MAX_COLS)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "cols must be between 1 and %" G_GINT64_FORMAT ", not %" G_GINT64_FORMAT,
                   MAX_COLS, cols);
      return FALSE;
    }
  return TRUE;
}

/* Checks host group sizes; returns their sum in *total_rows. */
static gboolean
check_rows (const gint64  *rows,
            guint          n_groups,
            gint64         cols,
            GmlpDType      dtype,
            gint64        *total_rows,
            GError       **error)
{
  guint64 row_bytes = (guint64) cols * gmlp_dtype_get_size (dtype);
  gint64 total = 0;
  gsize nbytes;
  guint g;

  if (rows == NULL)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT, "No group sizes given");
      return FALSE;
    }

  for (g = 0; g < n_groups; g++)
    {
      if (rows[g] < 0 || rows[g] > MAX_ROWS)
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                       "Group %u has %" G_GINT64_FORMAT " rows; sizes must be between 0 and %"
                       G_GINT64_FORMAT, g, rows[g], MAX_ROWS);
          return FALSE;
        }
      total += rows[g];
      if (total > MAX_ROWS)
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                       "The group sizes add up to more than %" G_GINT64_FORMAT " rows", MAX_ROWS);
          return FALSE;
        }
    }

  if (!gmlp_grouped_tensor_layout_bytes (n_groups, rows, total, row_bytes, &nbytes))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "A tensor of %" G_GINT64_FORMAT " × %" G_GINT64_FORMAT " %s is too large",
                   total, cols, gmlp_dtype_get_name (dtype));
      return FALSE;
    }

  *total_rows = total;
  return TRUE;
}

/* Lays @self out, with no storage yet: the host sizes, the member offsets
 * and the span it needs. The sizes were checked (check_rows(),
 * check_device_sizes()), so no count here overflows. */
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
      self->rows = g_memdup2 (rows, sizeof (gint64) * n_groups);
      self->offsets = g_new (gint64, n_groups);
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

static GmlpGroupedTensor *
grouped_tensor_new_layout (GmlpDevice     *device,
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

static GmlpGroupedTensor *
grouped_tensor_new_internal (GmlpDevice     *device,
                             GmlpDType       dtype,
                             const gint64   *rows,
                             guint           n_groups,
                             gint64          cols,
                             gint64          row_capacity,
                             GError        **error)
{
  g_autoptr(GmlpGroupedTensor) self = grouped_tensor_new_layout (device, dtype, rows, n_groups,
                                                                 cols, row_capacity);

  self->buffer = gmlp_buffer_new (device, self->nbytes, error);
  if (self->buffer == NULL)
    return NULL;

  return g_steal_pointer (&self);
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

  if (!check_common (device, dtype, n_groups, cols, error) ||
      !check_rows (rows, n_groups, cols, dtype, &total_rows, error))
    return NULL;

  return grouped_tensor_new_internal (device, dtype, rows, n_groups, cols, total_rows, error);
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

  if (!check_common (device, dtype, n_groups, cols, error))
    return NULL;

  all_rows = g_new (gint64, n_groups);
  for (g = 0; g < n_groups; g++)
    all_rows[g] = rows;

  return gmlp_grouped_tensor_new (device, dtype, all_rows, n_groups, cols, error);
}

/* Byte length of the packed (unpadded) form of a tensor with host sizes. */
static gsize
packed_bytes (GmlpGroupedTensor *self,
              const gint64      *rows)
{
  gsize total = 0;
  guint g;

  for (g = 0; g < self->n_groups; g++)
    total += (gsize) MAX (rows[g], 0) * (gsize) self->cols * gmlp_dtype_get_size (self->dtype);
  return total;
}

static gboolean
has_padding (GmlpGroupedTensor *self)
{
  return self->n_groups > 1 &&
         (self->cols * gmlp_dtype_get_size (self->dtype)) % kGmlpMemberAlignment != 0;
}

/**
 * gmlp_grouped_tensor_new_from_bytes:
 * @device: the device to allocate on
 * @dtype: the element type of the data
 * @rows: (array length=n_groups): the number of rows of each member
 * @n_groups: the number of members
 * @cols: the number of columns of every member
 * @bytes: the members in order, each row-major, with no padding, in host
 *   byte order
 * @error: return location for a #GError
 *
 * Creates a grouped tensor and uploads @bytes into it. The upload is
 * enqueued on the device's stream; @bytes may be released on return.
 *
 * Returns: (transfer full): a new tensor, or %NULL with
 *   %GMLP_ERROR_INVALID_ARGUMENT if the length of @bytes does not match the
 *   shape (nothing is allocated then)
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_tensor_new_from_bytes (GmlpDevice    *device,
                                    GmlpDType      dtype,
                                    const gint64  *rows,
                                    guint          n_groups,
                                    gint64         cols,
                                    GBytes        *bytes,
                                    GError       **error)
{
  g_autoptr(GmlpGroupedTensor) self = NULL;
  g_autofree guint8 *staging = NULL;
  const guint8 *data;
  gsize length, expected, row_bytes;
  gint64 total_rows;
  guint g;

  g_return_val_if_fail (GMLP_IS_DEVICE (device), NULL);
  g_return_val_if_fail (bytes != NULL, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!check_common (device, dtype, n_groups, cols, error) ||
      !check_rows (rows, n_groups, cols, dtype, &total_rows, error))
    return NULL;

  row_bytes = (gsize) cols * gmlp_dtype_get_size (dtype);
  expected = (gsize) total_rows * row_bytes;
  data = g_bytes_get_data (bytes, &length);
  if (length != expected)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "%" G_GSIZE_FORMAT " bytes given; %" G_GINT64_FORMAT " rows × %"
                   G_GINT64_FORMAT " %s need %" G_GSIZE_FORMAT,
                   length, total_rows, cols, gmlp_dtype_get_name (dtype), expected);
      return NULL;
    }

  self = grouped_tensor_new_internal (device, dtype, rows, n_groups, cols, total_rows, error);
  if (self == NULL)
    return NULL;

  if (has_padding (self))
    {
      /* Lay the members out with their padding on the host, then upload the
       * whole span in one copy. */
      const guint8 *src = data;

      staging = g_malloc0 (self->nbytes);
      for (g = 0; g < n_groups; g++)
        {
          gsize member = (gsize) rows[g] * row_bytes;

          /* An empty GBytes has no data pointer at all. */
          if (member > 0)
            memcpy (staging + self->offsets[g], src, member);
          src += member;
        }
      data = staging;
    }

  if (self->nbytes > 0 &&
      !GMLP_DEVICE_CALL (device, upload, gmlp_grouped_tensor_get_data (self),
                         data, has_padding (self) ? self->nbytes : expected, error))
    return NULL;

  return g_steal_pointer (&self);
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

  self = grouped_tensor_new_internal (device, dtype, NULL, n_groups, cols, row_capacity, error);
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

  /* Past G_MAXUINT, check_common() refuses the count as it refuses any
   * count past GMLP_MAX_GROUPS. */
  if (!gmlp_checked_mul ((guint64) sizes->rows[0], (guint64) sizes->cols, &n_sizes) ||
      n_sizes > G_MAXUINT)
    n_sizes = G_MAXUINT;
  if (!check_common (device, dtype, (guint) n_sizes, cols, error))
    return FALSE;
  if (row_capacity < 0 || row_capacity > MAX_ROWS ||
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

gpointer
gmlp_grouped_tensor_get_data (GmlpGroupedTensor *self)
{
  return (guint8 *) self->buffer->data + self->offset;
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
      g_autoptr(GBytes) bytes = g_bytes_new (self->rows, sizeof (gint64) * self->n_groups);
      g_autoptr(GmlpGroupedTensor) made = NULL;

      made = gmlp_grouped_tensor_new_from_bytes (self->device, GMLP_DTYPE_INT64, &n, 1, 1,
                                                 bytes, error);
      if (made == NULL)
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
  GmlpGroupedTensor *sizes = gmlp_grouped_tensor_get_sizes (self, error);

  if (sizes == NULL)
    return FALSE;

  shape->device_rows = gmlp_grouped_tensor_get_data (sizes);
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

/**
 * gmlp_grouped_tensor_to_bytes:
 * @self: a #GmlpGroupedTensor
 * @error: return location for a #GError
 *
 * Copies the tensor to the host: the members in order, each row-major, with
 * no padding. Waits for the device. For device-only sizes, the sizes are read
 * first (clamped to the row capacity, as the kernels clamp them). Fails with
 * %GMLP_ERROR_INVALID_STATE while the device captures a graph.
 *
 * Returns: (transfer full): the data, or %NULL with an error
 *
 * Since: 0.1
 */
GBytes *
gmlp_grouped_tensor_to_bytes (GmlpGroupedTensor  *self,
                              GError            **error)
{
  g_autofree gint64 *rows = NULL;
  g_autofree guint8 *host = NULL;
  gsize row_bytes, packed, src_offset = 0, dst_offset = 0;
  gint64 rows_left;
  guint n_groups, g;

  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!gmlp_grouped_tensor_check_usable (self, error))
    return NULL;

  if (!gmlp_device_check_not_capturing (self->device, "Reading a tensor to the host", error))
    return NULL;
  rows = gmlp_grouped_tensor_read_sizes (self, &n_groups, error);
  if (rows == NULL)
    return NULL;

  rows_left = self->row_capacity;
  for (g = 0; g < n_groups; g++)
    {
      rows[g] = CLAMP (rows[g], 0, rows_left);
      rows_left -= rows[g];
    }

  row_bytes = (gsize) self->cols * gmlp_dtype_get_size (self->dtype);
  packed = packed_bytes (self, rows);
  host = g_malloc (MAX (self->nbytes, 1));
  if (self->nbytes > 0 &&
      !GMLP_DEVICE_CALL (self->device, download, host,
                         gmlp_grouped_tensor_get_data (self), self->nbytes, error))
    return NULL;

  /* Squeeze the padding out, in place: a member's packed position is never
   * after its padded one. */
  for (g = 0; g < n_groups; g++)
    {
      gsize member = (gsize) rows[g] * row_bytes;

      if (member > 0 && dst_offset != src_offset)
        memmove (host + dst_offset, host + src_offset, member);
      dst_offset += member;
      src_offset += gmlp_num_member_stride (rows[g], row_bytes);
    }

  return g_bytes_new_take (g_realloc (g_steal_pointer (&host), MAX (packed, 1)), packed);
}

GmlpGroupedTensor *
gmlp_grouped_tensor_new_like (GmlpGroupedTensor  *self,
                              GmlpDType           dtype,
                              GError            **error)
{
  GmlpGroupedTensor *result = grouped_tensor_new_internal (self->device, dtype, self->rows,
                                                           self->n_groups, self->cols,
                                                           self->row_capacity, error);

  if (result != NULL && self->rows == NULL)
    result->sizes = g_object_ref (self->sizes);
  return result;
}

/**
 * gmlp_grouped_tensor_convert:
 * @self: a #GmlpGroupedTensor
 * @dtype: the element type of the result
 * @error: return location for a #GError
 *
 * Converts every element to @dtype into a new tensor of the same group sizes
 * on the same device, in one launch. Floating-point conversions round to
 * nearest even and saturate FP8 as described for [enum@Gmlp.DType]; INT32 and
 * INT64 convert to each other, INT64 saturating to the INT32 range.
 *
 * A tensor made by a [class@Gmlp.Quantizer] means its FP8 values times its
 * scales, and converts as such: to %GMLP_DTYPE_FLOAT32,
 * %GMLP_DTYPE_FLOAT16 or %GMLP_DTYPE_BFLOAT16 with its scales applied,
 * exactly as [method@Gmlp.GroupedTensor.dequantize] does (per-tensor,
 * blockwise and MXFP8 scales alike). To any other type it is refused, as
 * is its columnwise copy (convert the rowwise tensor) and the E8M0 scale
 * tensor of an MXFP8 tensor (read it with
 * [method@Gmlp.GroupedTensor.to_bytes]): FP8 bits without their scales
 * mean nothing, so to requantize, convert to a floating type and quantize
 * that with a [class@Gmlp.Quantizer].
 *
 * Returns: (transfer full): the converted tensor, or %NULL with
 *   %GMLP_ERROR_UNSUPPORTED for a conversion between integer and floating
 *   types, or one that the scales of @self forbid
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_tensor_convert (GmlpGroupedTensor  *self,
                             GmlpDType           dtype,
                             GError            **error)
{
  g_autoptr(GmlpGroupedTensor) result = NULL;
  GmlpBackendShape shape;

  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!gmlp_grouped_tensor_check_usable (self, error))
    return NULL;

  if (gmlp_grouped_tensor_is_scaled (self))
    return gmlp_grouped_tensor_convert_scaled (self, dtype, error);
  if (!gmlp_dtype_can_convert (self->dtype, dtype))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "Cannot convert %s to %s", gmlp_dtype_get_name (self->dtype),
                   gmlp_dtype_get_name (dtype));
      return NULL;
    }

  if (!gmlp_grouped_tensor_get_backend_shape (self, &shape, error))
    return NULL;

  result = gmlp_grouped_tensor_new_like (self, dtype, error);
  if (result == NULL)
    return NULL;

  if (!GMLP_DEVICE_CALL (self->device, convert, &shape,
                         gmlp_grouped_tensor_get_data (self), (int) self->dtype,
                         gmlp_grouped_tensor_get_data (result), (int) dtype, error))
    return NULL;

  return g_steal_pointer (&result);
}

/**
 * gmlp_grouped_tensor_get_member:
 * @self: a #GmlpGroupedTensor
 * @index: the member
 * @error: return location for a #GError
 *
 * Gets member @index as a one-group tensor that shares the storage of @self:
 * writes through either are seen by the other.
 *
 * Returns: (transfer full): the view, or %NULL with
 *   %GMLP_ERROR_INVALID_ARGUMENT if @index is out of range, or
 *   %GMLP_ERROR_UNSUPPORTED when the sizes are only on the device
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_tensor_get_member (GmlpGroupedTensor  *self,
                                guint               index,
                                GError            **error)
{
  GmlpGroupedTensor *view;

  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!gmlp_grouped_tensor_check_usable (self, error))
    return NULL;

  if (index >= self->n_groups)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "Member %u out of range: the tensor has %u", index, self->n_groups);
      return NULL;
    }
  if (self->rows == NULL)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "Member views need the group sizes on the host; read them with "
                   "gmlp_grouped_tensor_read_sizes() first");
      return NULL;
    }

  view = g_object_new (GMLP_TYPE_GROUPED_TENSOR, NULL);
  view->device = g_object_ref (self->device);
  view->dtype = self->dtype;
  view->n_groups = 1;
  view->cols = self->cols;
  view->row_capacity = self->rows[index];
  view->rows = g_new (gint64, 1);
  view->rows[0] = self->rows[index];
  view->offsets = g_new0 (gint64, 1);
  view->buffer = gmlp_buffer_ref (self->buffer);
  view->offset = self->offset + (gsize) self->offsets[index];
  view->nbytes = gmlp_num_member_stride (self->rows[index],
                                         (guint64) self->cols * gmlp_dtype_get_size (self->dtype));
  view->uniform = TRUE;
  view->is_view = TRUE;

  if (!gmlp_grouped_tensor_member_keep_scales (self, view, index, error))
    g_clear_object (&view);
  return view;
}

/**
 * gmlp_grouped_tensor_fill_zero:
 * @self: a #GmlpGroupedTensor
 * @error: return location for a #GError
 *
 * Sets every byte of the tensor's storage (padding included) to zero,
 * stream-ordered.
 *
 * Returns: %TRUE on success
 *
 * Since: 0.1
 */
gboolean
gmlp_grouped_tensor_fill_zero (GmlpGroupedTensor  *self,
                               GError            **error)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_grouped_tensor_check_usable (self, error))
    return FALSE;

  gmlp_grouped_tensor_bump_version (self);
  return GMLP_DEVICE_CALL (self->device, fill_bytes, gmlp_grouped_tensor_get_data (self),
                           0, self->nbytes, error);
}

/**
 * gmlp_grouped_tensor_fill_random:
 * @self: a #GmlpGroupedTensor
 * @seed: the seed
 * @scale: the half-width of the distribution, taken as a float: 0, or
 *   from 2^-126 (%G_MINFLOAT) to %G_MAXFLOAT
 * @error: return location for a #GError
 *
 * Fills the tensor with values drawn uniformly from [-@scale, @scale), for
 * demos, initialisation and tests. The values depend only on @seed and the
 * element's position in the tensor's storage, so every backend produces the
 * same tensor.
 *
 * Returns: %TRUE on success; %FALSE with %GMLP_ERROR_UNSUPPORTED for integer
 *   tensors, or %GMLP_ERROR_INVALID_ARGUMENT for a scale that is negative,
 *   NaN or infinite, or that a float cannot hold
 *
 * Since: 0.1
 */
gboolean
gmlp_grouped_tensor_fill_random (GmlpGroupedTensor  *self,
                                 guint64             seed,
                                 double              scale,
                                 GError            **error)
{
  float half_width;
  gsize elem;

  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_grouped_tensor_check_usable (self, error))
    return FALSE;

  if (!gmlp_dtype_is_floating (self->dtype))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "Random fill needs a floating-point tensor, not %s",
                   gmlp_dtype_get_name (self->dtype));
      return FALSE;
    }
  if (!gmlp_dtype_narrow_double (scale, "scale", GMLP_NARROW_NOT_NEGATIVE, &half_width, error))
    return FALSE;

  elem = gmlp_dtype_get_size (self->dtype);
  gmlp_grouped_tensor_bump_version (self);
  return GMLP_DEVICE_CALL (self->device, fill_random, gmlp_grouped_tensor_get_data (self),
                           (int) self->dtype, self->nbytes / elem, seed, half_width, error);
}

/**
 * gmlp_grouped_tensor_get_device:
 * @self: a #GmlpGroupedTensor
 *
 * Gets the device whose memory holds the tensor.
 *
 * Returns: (transfer none): the device holding the storage
 *
 * Since: 0.1
 */
GmlpDevice *
gmlp_grouped_tensor_get_device (GmlpGroupedTensor *self)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), NULL);

  return self->device;
}

/**
 * gmlp_grouped_tensor_get_dtype:
 * @self: a #GmlpGroupedTensor
 *
 * Gets the type of the tensor's elements.
 *
 * Returns: the element type
 *
 * Since: 0.1
 */
GmlpDType
gmlp_grouped_tensor_get_dtype (GmlpGroupedTensor *self)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), GMLP_DTYPE_FLOAT32);

  return self->dtype;
}

/**
 * gmlp_grouped_tensor_get_n_groups:
 * @self: a #GmlpGroupedTensor
 *
 * Gets the number of member matrices.
 *
 * Returns: the number of members
 *
 * Since: 0.1
 */
guint
gmlp_grouped_tensor_get_n_groups (GmlpGroupedTensor *self)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), 0);

  return self->n_groups;
}

/**
 * gmlp_grouped_tensor_get_cols:
 * @self: a #GmlpGroupedTensor
 *
 * Gets the number of columns, the same for every member.
 *
 * Returns: the number of columns of every member
 *
 * Since: 0.1
 */
gint64
gmlp_grouped_tensor_get_cols (GmlpGroupedTensor *self)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), 0);

  return self->cols;
}

/**
 * gmlp_grouped_tensor_get_rows:
 * @self: a #GmlpGroupedTensor
 * @index: the member
 *
 * Gets the number of rows of one member.
 *
 * Returns: the number of rows of member @index, or -1 when the sizes are
 *   only on the device (see [method@Gmlp.GroupedTensor.read_sizes]) or
 *   @index is out of range
 *
 * Since: 0.1
 */
gint64
gmlp_grouped_tensor_get_rows (GmlpGroupedTensor *self,
                              guint              index)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), -1);

  return self->rows != NULL && index < self->n_groups ? self->rows[index] : -1;
}

/**
 * gmlp_grouped_tensor_get_total_rows:
 * @self: a #GmlpGroupedTensor
 *
 * Gets the number of rows of all members together.
 *
 * Returns: the sum of the group sizes, or -1 when they are only on the
 *   device
 *
 * Since: 0.1
 */
gint64
gmlp_grouped_tensor_get_total_rows (GmlpGroupedTensor *self)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), -1);

  return self->rows != NULL ? self->row_capacity : -1;
}

/**
 * gmlp_grouped_tensor_get_row_capacity:
 * @self: a #GmlpGroupedTensor
 *
 * Gets how many rows the tensor's storage has room for; with device-only
 * sizes this bounds the sum of the sizes.
 *
 * Returns: the number of rows the storage holds over all members
 *
 * Since: 0.1
 */
gint64
gmlp_grouped_tensor_get_row_capacity (GmlpGroupedTensor *self)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), 0);

  return self->row_capacity;
}

/**
 * gmlp_grouped_tensor_get_member_offset:
 * @self: a #GmlpGroupedTensor
 * @index: the member
 *
 * Gets where one member starts in the tensor's storage (see [the memory
 * layout](memory-layout.html)).
 *
 * Returns: the byte offset of member @index from the start of the tensor, a
 *   multiple of %GMLP_MEMBER_ALIGNMENT, or -1 when the sizes are only on the
 *   device or @index is out of range
 *
 * Since: 0.1
 */
gint64
gmlp_grouped_tensor_get_member_offset (GmlpGroupedTensor *self,
                                       guint              index)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), -1);

  return self->offsets != NULL && index < self->n_groups ? self->offsets[index] : -1;
}

/**
 * gmlp_grouped_tensor_get_nbytes:
 * @self: a #GmlpGroupedTensor
 *
 * Gets the size of the tensor's storage in bytes.
 *
 * Returns: the bytes of storage the tensor spans, padding included
 *
 * Since: 0.1
 */
gsize
gmlp_grouped_tensor_get_nbytes (GmlpGroupedTensor *self)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), 0);

  return self->nbytes;
}

/**
 * gmlp_grouped_tensor_has_host_sizes:
 * @self: a #GmlpGroupedTensor
 *
 * Tells whether the host knows the group sizes, or whether they live only on
 * the device.
 *
 * Returns: %TRUE if the group sizes are known on the host
 *
 * Since: 0.1
 */
gboolean
gmlp_grouped_tensor_has_host_sizes (GmlpGroupedTensor *self)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), FALSE);

  return self->rows != NULL;
}

/**
 * gmlp_grouped_tensor_is_uniform:
 * @self: a #GmlpGroupedTensor
 *
 * Tells whether all members have the same shape, as weight tensors do.
 *
 * Returns: %TRUE if every member has the same number of rows
 *
 * Since: 0.1
 */
gboolean
gmlp_grouped_tensor_is_uniform (GmlpGroupedTensor *self)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), FALSE);

  return self->uniform;
}

/**
 * gmlp_grouped_tensor_is_view:
 * @self: a #GmlpGroupedTensor
 *
 * Tells whether @self is a view of a member of another tensor.
 *
 * Returns: %TRUE if @self is a member view sharing another tensor's storage
 *
 * Since: 0.1
 */
gboolean
gmlp_grouped_tensor_is_view (GmlpGroupedTensor *self)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), FALSE);

  return self->is_view;
}

/**
 * gmlp_grouped_tensor_get_version:
 * @self: a #GmlpGroupedTensor
 *
 * Gets the version of the tensor's storage, as torch's `_version`: 0 for a
 * new tensor (the result of a forward, a backward, a conversion or a
 * quantization included), and one more after each call that writes into
 * existing storage: [method@Gmlp.GroupedTensor.fill_zero],
 * [method@Gmlp.GroupedTensor.fill_random],
 * [method@Gmlp.GroupedTensor.add_scaled], [method@Gmlp.GroupedTensor.scale],
 * a layer's writes into its parameters
 * ([method@Gmlp.GroupedLinear.set_weight_from_bytes],
 * [method@Gmlp.GroupedLinear.init_parameters], …) and into its gradients
 * (wgrad, bgrad and main_grad, also a main_grad of the caller's). A call
 * that fails before it writes leaves the version as it was. The version
 * belongs to the storage: a member view and its tensor share it, so a write
 * through either counts for both.
 *
 * A layer's backward compares the versions of the tensors it reads (the
 * forward's input and the weights) with those its forward saw, and fails
 * with %GMLP_ERROR_INVALID_STATE if they changed, with or without an
 * offload context (see [method@Gmlp.GroupedLinear.backward]).
 *
 * Writes that do not go through libgmlp are not counted: writes through a
 * DLPack export ([method@Gmlp.GroupedTensor.to_dlpack]), and the work a
 * [class@Gmlp.Graph] replays.
 *
 * Returns: the version
 *
 * Since: 0.1
 */
guint64
gmlp_grouped_tensor_get_version (GmlpGroupedTensor *self)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), 0);

  return self->buffer != NULL ? gmlp_version_counter_get (self->buffer->version) : 0;
}

GmlpVersionCounter *
gmlp_grouped_tensor_get_version_counter (GmlpGroupedTensor *self)
{
  return self->buffer != NULL ? self->buffer->version : NULL;
}

void
gmlp_grouped_tensor_bump_version (GmlpGroupedTensor *self)
{
  if (self->buffer != NULL)
    gmlp_version_counter_bump (self->buffer->version);
}

void
gmlp_grouped_tensor_get_span (GmlpGroupedTensor *self,
                              GmlpSpan          *span)
{
  span->storage = gmlp_grouped_tensor_get_version_counter (self);
  span->offset = self->offset;
  span->nbytes = self->nbytes;
}

gboolean
gmlp_grouped_tensor_overlaps (GmlpGroupedTensor *a,
                              GmlpGroupedTensor *b)
{
  GmlpSpan sa, sb;

  gmlp_grouped_tensor_get_span (a, &sa);
  gmlp_grouped_tensor_get_span (b, &sb);
  return gmlp_spans_overlap (&sa, &sb);
}

gpointer
gmlp_grouped_tensor_get_member_data (GmlpGroupedTensor *self,
                                     guint              index)
{
  g_assert (self->offsets != NULL && index < self->n_groups);

  return (guint8 *) gmlp_grouped_tensor_get_data (self) + self->offsets[index];
}

const gint64 *
gmlp_grouped_tensor_peek_rows (GmlpGroupedTensor *self)
{
  return self->rows;
}

void
gmlp_grouped_tensor_get_layout (GmlpGroupedTensor *self,
                                GmlpTensorLayout  *layout)
{
  layout->device = g_object_ref (self->device);
  layout->dtype = self->dtype;
  layout->n_groups = self->n_groups;
  layout->cols = self->cols;
  layout->row_capacity = self->row_capacity;
  layout->rows = self->rows != NULL ? g_memdup2 (self->rows, sizeof (gint64) * self->n_groups) : NULL;
  layout->sizes = self->rows == NULL ? g_object_ref (self->sizes) : NULL;
  layout->nbytes = self->nbytes;
}

void
gmlp_tensor_layout_clear (GmlpTensorLayout *layout)
{
  g_clear_object (&layout->device);
  g_clear_pointer (&layout->rows, g_free);
  g_clear_object (&layout->sizes);
}

GmlpGroupedTensor *
gmlp_grouped_tensor_new_with_buffer (const GmlpTensorLayout *layout,
                                     GmlpBuffer             *buffer)
{
  GmlpGroupedTensor *self = grouped_tensor_new_layout (layout->device, layout->dtype, layout->rows,
                                                       layout->n_groups, layout->cols,
                                                       layout->row_capacity);

  g_assert (self->nbytes == layout->nbytes && buffer->nbytes >= layout->nbytes);

  if (layout->rows == NULL)
    self->sizes = g_object_ref (layout->sizes);
  self->buffer = gmlp_buffer_ref (buffer);
  return self;
}

GmlpBuffer *
gmlp_grouped_tensor_get_buffer (GmlpGroupedTensor *self)
{
  return self->buffer;
}

static gboolean
check_arithmetic_dtype (GmlpGroupedTensor  *self,
                        GError            **error)
{
  if (self->dtype != GMLP_DTYPE_FLOAT32 && self->dtype != GMLP_DTYPE_FLOAT16 &&
      self->dtype != GMLP_DTYPE_BFLOAT16)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "Arithmetic on %s tensors is not supported (float32, float16, bfloat16)",
                   gmlp_dtype_get_name (self->dtype));
      return FALSE;
    }
  return TRUE;
}

/**
 * gmlp_grouped_tensor_add_scaled:
 * @self: the tensor to update
 * @alpha: the factor, applied as a float: 0, or finite with a magnitude
 *   from 2^-126 (%G_MINFLOAT) to %G_MAXFLOAT
 * @other: a tensor of the same group sizes and columns on the same device;
 *   its dtype may differ (for example an FP32 gradient into BF16 weights)
 * @error: return location for a #GError
 *
 * Computes `self += alpha × other` element by element, in FP32, stream-ordered
 * and in one launch: the update step of a plain SGD optimizer, or the
 * difference of two outputs. A factor that a float cannot hold (NaN, an
 * infinity, a magnitude past %G_MAXFLOAT or a nonzero one below
 * %G_MINFLOAT) is refused rather than rounded to infinity or 0. Products
 * that overflow FP32 give infinities, as FP32 arithmetic does.
 *
 * Returns: %TRUE on success; %FALSE with %GMLP_ERROR_SHAPE_MISMATCH,
 *   %GMLP_ERROR_INVALID_ARGUMENT (another device, a factor that a float
 *   cannot hold) or %GMLP_ERROR_UNSUPPORTED (integer or FP8 tensors), with
 *   @self unchanged
 *
 * Since: 0.1
 */
gboolean
gmlp_grouped_tensor_add_scaled (GmlpGroupedTensor  *self,
                                double              alpha,
                                GmlpGroupedTensor  *other,
                                GError            **error)
{
  GmlpBackendShape shape;
  float factor;
  guint g;

  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), FALSE);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (other), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_grouped_tensor_check_usable (self, error) ||
      !gmlp_grouped_tensor_check_usable (other, error))
    return FALSE;

  if (!check_arithmetic_dtype (self, error) || !check_arithmetic_dtype (other, error) ||
      !gmlp_dtype_narrow_double (alpha, "alpha", GMLP_NARROW_DEFAULT, &factor, error))
    return FALSE;
  if (other->device != self->device)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "The tensors are on two devices");
      return FALSE;
    }
  if (other->n_groups != self->n_groups || other->cols != self->cols ||
      (self->rows == NULL) != (other->rows == NULL) ||
      (self->rows == NULL && (self->sizes != other->sizes || self->row_capacity != other->row_capacity)))
    goto mismatch;
  for (g = 0; self->rows != NULL && g < self->n_groups; g++)
    if (self->rows[g] != other->rows[g])
      goto mismatch;

  if (!gmlp_grouped_tensor_get_backend_shape (self, &shape, error))
    return FALSE;
  gmlp_grouped_tensor_bump_version (self);
  return GMLP_DEVICE_CALL (self->device, axpby, &shape, gmlp_grouped_tensor_get_data (other),
                           (int) other->dtype, gmlp_grouped_tensor_get_data (self), (int) self->dtype,
                           factor, 1.0f, error);

mismatch:
  g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
               "The tensors differ in group sizes or columns");
  return FALSE;
}

/**
 * gmlp_grouped_tensor_scale:
 * @self: the tensor to update
 * @alpha: the factor, applied as a float: 0, or finite with a magnitude
 *   from 2^-126 (%G_MINFLOAT) to %G_MAXFLOAT
 * @error: return location for a #GError
 *
 * Multiplies every element by @alpha, in FP32, stream-ordered. A factor
 * that a float cannot hold is refused, as for
 * [method@Gmlp.GroupedTensor.add_scaled].
 *
 * Returns: %TRUE on success; %FALSE with %GMLP_ERROR_UNSUPPORTED for
 *   integer or FP8 tensors, or %GMLP_ERROR_INVALID_ARGUMENT for a factor that
 *   a float cannot hold, with @self unchanged
 *
 * Since: 0.1
 */
gboolean
gmlp_grouped_tensor_scale (GmlpGroupedTensor  *self,
                           double              alpha,
                           GError            **error)
{
  GmlpBackendShape shape;
  float factor;

  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_grouped_tensor_check_usable (self, error))
    return FALSE;

  if (!check_arithmetic_dtype (self, error) ||
      !gmlp_dtype_narrow_double (alpha, "alpha", GMLP_NARROW_DEFAULT, &factor, error) ||
      !gmlp_grouped_tensor_get_backend_shape (self, &shape, error))
    return FALSE;
  gmlp_grouped_tensor_bump_version (self);
  return GMLP_DEVICE_CALL (self->device, axpby, &shape, NULL, (int) self->dtype,
                           gmlp_grouped_tensor_get_data (self), (int) self->dtype,
                           0.0f, factor, error);
}

/**
 * gmlp_grouped_tensor_sum_squares:
 * @self: a #GmlpGroupedTensor
 * @error: return location for a #GError
 *
 * Sums the squares of the elements (a loss, or a norm), squaring and
 * accumulating in FP64, so that no FP32 value's square overflows or
 * vanishes. Waits for the device.
 *
 * Returns: the sum, or -1 with %GMLP_ERROR_UNSUPPORTED for integer or FP8
 *   tensors, or %GMLP_ERROR_INVALID_STATE while the device captures a graph
 *
 * Since: 0.1
 */
double
gmlp_grouped_tensor_sum_squares (GmlpGroupedTensor  *self,
                                 GError            **error)
{
  GmlpBackendShape shape;
  double result = 0.0;

  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), -1.0);
  g_return_val_if_fail (error == NULL || *error == NULL, -1.0);

  if (!gmlp_grouped_tensor_check_usable (self, error))
    return -1.0;

  if (!check_arithmetic_dtype (self, error) ||
      !gmlp_device_check_not_capturing (self->device, "A sum of squares", error) ||
      !gmlp_grouped_tensor_get_backend_shape (self, &shape, error) ||
      !GMLP_DEVICE_CALL (self->device, sum_squares, &shape, gmlp_grouped_tensor_get_data (self),
                         (int) self->dtype, &result, error))
    return -1.0;
  return result;
}

/* What a DLPack export keeps alive: the tensor (hence its storage) and the
 * shape array. */
typedef struct {
  DLManagedTensor  managed;
  GmlpGroupedTensor   *tensor;
  int64_t              shape[2];
} DLPackExport;

static void
dlpack_delete (DLManagedTensor *managed)
{
  DLPackExport *export = (DLPackExport *) managed;

  g_object_unref (export->tensor);
  g_free (export);
}

/**
 * gmlp_grouped_tensor_to_dlpack: (skip)
 * @self: a #GmlpGroupedTensor
 * @error: return location for a #GError
 *
 * Exports the tensor without a copy as a DLPack `DLManagedTensor`: a
 * two-dimensional `total_rows × cols` array over the storage. It keeps the
 * tensor alive until its `deleter` is called. In Python the tensor supports
 * the DLPack protocol (`numpy.from_dlpack (t)`, `torch.from_dlpack (t)`),
 * and `to_dlpack()` gives a capsule that owns the export; the C function is
 * not in the typelib, where a pointer that no binding frees would leak.
 *
 * Waits for the device, so the data is complete when a consumer on another
 * stream reads it; while the device captures a graph it fails with
 * %GMLP_ERROR_INVALID_STATE.
 *
 * Returns: (transfer full) (nullable): a `DLManagedTensor *`, or %NULL with
 *   %GMLP_ERROR_UNSUPPORTED when the tensor is not one array (members padded
 *   between each other; export a member view instead), its sizes are only on
 *   the device, or its dtype has no DLPack code here (FP8)
 *
 * Since: 0.1
 */
gpointer
gmlp_grouped_tensor_to_dlpack (GmlpGroupedTensor  *self,
                               GError            **error)
{
  DLPackExport *export;
  DLDataType dtype = { 0, 0, 1 };

  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!gmlp_grouped_tensor_check_usable (self, error))
    return NULL;

  switch (self->dtype)
    {
    case GMLP_DTYPE_FLOAT32: dtype.code = kDLFloat; dtype.bits = 32; break;
    case GMLP_DTYPE_FLOAT16: dtype.code = kDLFloat; dtype.bits = 16; break;
    case GMLP_DTYPE_BFLOAT16: dtype.code = kDLBfloat; dtype.bits = 16; break;
    case GMLP_DTYPE_INT32: dtype.code = kDLInt; dtype.bits = 32; break;
    case GMLP_DTYPE_INT64: dtype.code = kDLInt; dtype.bits = 64; break;
    default:
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "No DLPack export for %s tensors", gmlp_dtype_get_name (self->dtype));
      return NULL;
    }
  if (self->rows == NULL)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "DLPack export needs the group sizes on the host");
      return NULL;
    }
  if (has_padding (self))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "The members are padded apart (%" G_GINT64_FORMAT " columns of %s are not a "
                   "multiple of %d bytes): export each member view instead",
                   self->cols, gmlp_dtype_get_name (self->dtype), GMLP_MEMBER_ALIGNMENT);
      return NULL;
    }
  /* The export promises complete data, which a capture has not computed. */
  if (!gmlp_device_check_not_capturing (self->device, "DLPack export", error) ||
      !gmlp_device_synchronize (self->device, error))
    return NULL;

  export = g_new0 (DLPackExport, 1);
  export->tensor = g_object_ref (self);
  export->shape[0] = self->row_capacity;
  export->shape[1] = self->cols;
  export->managed.dl_tensor.data = gmlp_grouped_tensor_get_data (self);
  export->managed.dl_tensor.device.device_type =
    gmlp_device_get_kind (self->device) == GMLP_DEVICE_KIND_CUDA ? kDLCUDA : kDLCPU;
  export->managed.dl_tensor.device.device_id = gmlp_device_get_ordinal (self->device);
  export->managed.dl_tensor.ndim = 2;
  export->managed.dl_tensor.dtype = dtype;
  export->managed.dl_tensor.shape = export->shape;
  export->managed.dl_tensor.strides = NULL;      /* row-major, compact */
  export->managed.dl_tensor.byte_offset = 0;
  export->managed.manager_ctx = export;
  export->managed.deleter = dlpack_delete;
  return &export->managed;
}

/* DLPack import: the producer's DLManagedTensor is kept until the storage
 * dies, then its deleter is called (gmlp_buffer_new_foreign()). */
static void
dlpack_release (gpointer data)
{
  DLManagedTensor *managed = data;

  if (managed->deleter != NULL)
    managed->deleter (managed);
}

static gboolean
dlpack_import_dtype (DLDataType  dl,
                     GmlpDType  *dtype)
{
  if (dl.lanes != 1)
    return FALSE;
  if (dl.code == kDLFloat && dl.bits == 32)
    *dtype = GMLP_DTYPE_FLOAT32;
  else if (dl.code == kDLFloat && dl.bits == 16)
    *dtype = GMLP_DTYPE_FLOAT16;
  else if (dl.code == kDLBfloat && dl.bits == 16)
    *dtype = GMLP_DTYPE_BFLOAT16;
  else if (dl.code == kDLInt && dl.bits == 32)
    *dtype = GMLP_DTYPE_INT32;
  else if (dl.code == kDLInt && dl.bits == 64)
    *dtype = GMLP_DTYPE_INT64;
  else
    return FALSE;
  return TRUE;
}

/* Whether the DLPack tensor lives where @device computes. */
static gboolean
dlpack_on_device (const DLTensor *dl,
                  GmlpDevice     *device)
{
  if (gmlp_device_get_kind (device) == GMLP_DEVICE_KIND_CUDA)
    return dl->device.device_type == kDLCUDA &&
           dl->device.device_id == gmlp_device_get_ordinal (device);
  return dl->device.device_type == kDLCPU || dl->device.device_type == kDLCUDAHost;
}

/* Row-major and compact: what the strides (in elements) must be, where a
 * dimension of one element may have any. */
static gboolean
dlpack_is_compact (const DLTensor *dl)
{
  int64_t expected = 1;
  int d;

  if (dl->strides == NULL)
    return TRUE;
  for (d = dl->ndim - 1; d >= 0; d--)
    {
      if (dl->shape[d] != 1 && dl->strides[d] != expected)
        return FALSE;
      expected *= dl->shape[d];
    }
  return TRUE;
}

/* Bytes of the producer's data a zero-copy import may start at: the
 * backends' vector loads need no more. */
#define DLPACK_MIN_ALIGNMENT 16

/**
 * gmlp_grouped_tensor_new_from_dlpack: (skip)
 * @device: the device the data is on
 * @dlpack: (not nullable): a `DLManagedTensor *` (DLPack 0.6 and later's
 *   unversioned struct), as a producer's `__dlpack__` capsule holds
 * @rows: (array length=n_groups): the number of rows of each member
 * @n_groups: the number of members
 * @error: return location for a #GError
 *
 * Makes a grouped tensor over another library's tensor: numpy's, torch's or
 * any DLPack producer's. The DLPack tensor is one matrix (two dimensions;
 * one dimension counts as one column) whose rows are split into groups of
 * @rows rows each, in order.
 *
 * The import shares the producer's memory when the layout allows: when
 * every member's bytes are a multiple of %GMLP_MEMBER_ALIGNMENT (for
 * example `cols × element size` a multiple of 256, or a single group of
 * such a size) and the data starts on a 16-byte boundary. The tensor then
 * keeps @dlpack until its storage (views included) is finalized, waits for
 * the device, and calls @dlpack's deleter; writes through either side show
 * on the other. Otherwise the data is copied into a fresh allocation with
 * the members padded apart, and the deleter is called before this returns.
 *
 * The data is taken as complete: for a producer on a GPU, make its stream's
 * work visible first (Python's `from_dlpack()` below synchronizes a torch
 * tensor's stream).
 *
 * In Python, `Gmlp.GroupedTensor.from_dlpack (obj, rows)` takes any object
 * with a `__dlpack__` method; this function is not in the typelib, where a
 * raw pointer has no owner.
 *
 * Returns: (transfer full) (nullable): a new tensor that owns @dlpack, or
 *   %NULL with an error, @dlpack then still the caller's:
 *   %GMLP_ERROR_DTYPE_MISMATCH for a dtype other than FLOAT32, FLOAT16,
 *   BFLOAT16, INT32 or INT64; %GMLP_ERROR_INVALID_ARGUMENT for data on
 *   another device, strides that are not row-major and compact, more than
 *   two dimensions, or group sizes that do not add up to the rows
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_tensor_new_from_dlpack (GmlpDevice    *device,
                                     gpointer       dlpack,
                                     const gint64  *rows,
                                     guint          n_groups,
                                     GError       **error)
{
  DLManagedTensor *managed = dlpack;
  g_autoptr(GmlpGroupedTensor) self = NULL;
  const DLTensor *dl;
  const guint8 *data;
  GmlpDType dtype;
  gint64 total_rows, cols;
  gsize row_bytes;
  guint g;

  g_return_val_if_fail (GMLP_IS_DEVICE (device), NULL);
  g_return_val_if_fail (dlpack != NULL, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!gmlp_device_check_usable (device, error))
    return NULL;

  dl = &managed->dl_tensor;
  if (!dlpack_import_dtype (dl->dtype, &dtype))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_DTYPE_MISMATCH,
                   "No GroupedTensor dtype for DLPack type code %u of %u bits × %u lanes "
                   "(float32, float16, bfloat16, int32 and int64 import)",
                   dl->dtype.code, dl->dtype.bits, dl->dtype.lanes);
      return NULL;
    }
  if (!dlpack_on_device (dl, device))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "The DLPack tensor is on DLPack device %d:%d, not on %s",
                   dl->device.device_type, dl->device.device_id, gmlp_device_get_name (device));
      return NULL;
    }
  if (dl->ndim < 1 || dl->ndim > 2 || dl->shape[0] < 0 || (dl->ndim == 2 && dl->shape[1] < 0))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "A GroupedTensor imports a matrix (rows × cols), not a %d-dimensional tensor",
                   dl->ndim);
      return NULL;
    }
  if (!dlpack_is_compact (dl))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "The DLPack tensor is not row-major and compact (a transpose or a slice "
                   "with steps?): make a contiguous copy first");
      return NULL;
    }

  cols = dl->ndim == 2 ? dl->shape[1] : 1;
  if (!check_common (device, dtype, n_groups, cols, error) ||
      !check_rows (rows, n_groups, cols, dtype, &total_rows, error))
    return NULL;
  if (total_rows != dl->shape[0])
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "The group sizes add up to %" G_GINT64_FORMAT " rows; the DLPack tensor has %"
                   G_GINT64_FORMAT, total_rows, (gint64) dl->shape[0]);
      return NULL;
    }

  data = (const guint8 *) dl->data + dl->byte_offset;
  row_bytes = (gsize) cols * gmlp_dtype_get_size (dtype);
  self = grouped_tensor_new_layout (device, dtype, rows, n_groups, cols, total_rows);

  if (self->nbytes > 0 && self->nbytes == (gsize) total_rows * row_bytes &&
      GPOINTER_TO_SIZE (data) % DLPACK_MIN_ALIGNMENT == 0)
    {
      self->buffer = gmlp_buffer_new_foreign (device, (gpointer) data, self->nbytes,
                                              dlpack_release, managed);
      return g_steal_pointer (&self);
    }

  self->buffer = gmlp_buffer_new (device, self->nbytes, error);
  if (self->buffer == NULL)
    return NULL;
  for (g = 0; g < n_groups; g++)
    {
      gsize member = (gsize) rows[g] * row_bytes;
      gpointer dst = gmlp_grouped_tensor_get_member_data (self, g);

      if (member > 0 &&
          !(gmlp_device_get_kind (device) == GMLP_DEVICE_KIND_CUDA
            ? GMLP_DEVICE_CALL (device, copy, dst, data, member, error)
            : GMLP_DEVICE_CALL (device, upload, dst, data, member, error)))
        return NULL;
      data += member;
    }
  /* The copies must have read the producer's memory before it goes. */
  if (!gmlp_device_synchronize (device, error))
    return NULL;
  dlpack_release (managed);
  return g_steal_pointer (&self);
}

/* The typed constructors: @n_values host values of type @from, uploaded
 * and converted to @dtype on the device; @dtype_ok says whether the
 * constructor @name makes @dtype (it makes @accepted). */
static GmlpGroupedTensor *
new_from_host_array (GmlpDevice     *device,
                     GmlpDType       from,
                     GmlpDType       dtype,
                     gboolean        dtype_ok,
                     const char     *name,
                     const char     *accepted,
                     const gint64   *rows,
                     guint           n_groups,
                     gint64          cols,
                     gconstpointer   values,
                     gsize           n_values,
                     GError        **error)
{
  g_autoptr(GmlpGroupedTensor) staged = NULL;
  g_autoptr(GBytes) bytes = NULL;
  gint64 total_rows;

  if (!dtype_ok)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_DTYPE_MISMATCH,
                   "%s() makes %s tensors, not %s", name, accepted, gmlp_dtype_get_name (dtype));
      return NULL;
    }
  if (!check_common (device, dtype, n_groups, cols, error) ||
      !check_rows (rows, n_groups, cols, dtype, &total_rows, error))
    return NULL;
  if ((guint64) n_values != (guint64) total_rows * (guint64) cols)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "%" G_GSIZE_FORMAT " values given; %" G_GINT64_FORMAT " rows × %"
                   G_GINT64_FORMAT " columns need %" G_GINT64_FORMAT,
                   n_values, total_rows, cols, total_rows * cols);
      return NULL;
    }

  bytes = g_bytes_new_static (values, n_values * gmlp_dtype_get_size (from));
  staged = gmlp_grouped_tensor_new_from_bytes (device, from, rows, n_groups, cols, bytes, error);
  if (staged == NULL || from == dtype)
    return g_steal_pointer (&staged);
  return gmlp_grouped_tensor_convert (staged, dtype, error);
}

/**
 * gmlp_grouped_tensor_new_from_floats:
 * @device: the device to allocate on
 * @dtype: a floating-point element type
 * @rows: (array length=n_groups): the number of rows of each member
 * @n_groups: the number of members
 * @cols: the number of columns of every member
 * @values: (array length=n_values) (nullable): the members in order, each
 *   row-major, with no padding
 * @n_values: the number of values: the total rows times @cols
 * @error: return location for a #GError
 *
 * Creates a grouped tensor from 32-bit floats, converted to @dtype as
 * [method@Gmlp.GroupedTensor.convert] does (round to nearest even, FP8
 * saturating). A Python list of numbers or a gjs `Float32Array` (or array
 * of numbers) goes in as it is, with no #GBytes.
 *
 * Returns: (transfer full): a new tensor, or %NULL with
 *   %GMLP_ERROR_DTYPE_MISMATCH for an integer @dtype, or
 *   %GMLP_ERROR_INVALID_ARGUMENT when @n_values does not match the shape
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_tensor_new_from_floats (GmlpDevice    *device,
                                     GmlpDType      dtype,
                                     const gint64  *rows,
                                     guint          n_groups,
                                     gint64         cols,
                                     const float   *values,
                                     gsize          n_values,
                                     GError       **error)
{
  g_return_val_if_fail (GMLP_IS_DEVICE (device), NULL);
  g_return_val_if_fail (values != NULL || n_values == 0, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  return new_from_host_array (device, GMLP_DTYPE_FLOAT32, dtype, gmlp_dtype_is_floating (dtype),
                              "new_from_floats", "floating-point", rows, n_groups, cols,
                              values, n_values, error);
}

/**
 * gmlp_grouped_tensor_new_from_ints:
 * @device: the device to allocate on
 * @dtype: %GMLP_DTYPE_INT64 or %GMLP_DTYPE_INT32
 * @rows: (array length=n_groups): the number of rows of each member
 * @n_groups: the number of members
 * @cols: the number of columns of every member
 * @values: (array length=n_values) (nullable): the members in order, each
 *   row-major, with no padding
 * @n_values: the number of values: the total rows times @cols
 * @error: return location for a #GError
 *
 * Creates an integer grouped tensor from 64-bit integers: a device sizes
 * tensor for [ctor@Gmlp.GroupedTensor.new_with_device_sizes], token
 * indices. A Python list of ints or a gjs array of numbers goes in as it
 * is.
 *
 * Returns: (transfer full): a new tensor, or %NULL with
 *   %GMLP_ERROR_DTYPE_MISMATCH for a floating-point @dtype, or
 *   %GMLP_ERROR_INVALID_ARGUMENT when @n_values does not match the shape or
 *   a value does not fit in INT32 (nothing is allocated then)
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_tensor_new_from_ints (GmlpDevice    *device,
                                   GmlpDType      dtype,
                                   const gint64  *rows,
                                   guint          n_groups,
                                   gint64         cols,
                                   const gint64  *values,
                                   gsize          n_values,
                                   GError       **error)
{
  gsize i;

  g_return_val_if_fail (GMLP_IS_DEVICE (device), NULL);
  g_return_val_if_fail (values != NULL || n_values == 0, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (dtype == GMLP_DTYPE_INT32)
    for (i = 0; i < n_values; i++)
      if (values[i] < G_MININT32 || values[i] > G_MAXINT32)
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                       "Value %" G_GSIZE_FORMAT " (%" G_GINT64_FORMAT ") does not fit in INT32",
                       i, values[i]);
          return NULL;
        }
  return new_from_host_array (device, GMLP_DTYPE_INT64, dtype,
                              dtype == GMLP_DTYPE_INT64 || dtype == GMLP_DTYPE_INT32,
                              "new_from_ints", "INT64 or INT32", rows, n_groups, cols,
                              values, n_values, error);
}

/**
 * gmlp_grouped_tensor_new_from_uint16:
 * @device: the device to allocate on
 * @dtype: %GMLP_DTYPE_FLOAT16 or %GMLP_DTYPE_BFLOAT16
 * @rows: (array length=n_groups): the number of rows of each member
 * @n_groups: the number of members
 * @cols: the number of columns of every member
 * @values: (array length=n_values) (nullable): the bit patterns of the
 *   members' elements in order, each row-major, with no padding
 * @n_values: the number of values: the total rows times @cols
 * @error: return location for a #GError
 *
 * Creates a 16-bit floating-point grouped tensor from the raw bits of its
 * elements, unchanged: a gjs `Uint16Array`, a Python list of ints, or
 * numpy's `float16` array viewed as `uint16`.
 *
 * Returns: (transfer full): a new tensor, or %NULL with
 *   %GMLP_ERROR_DTYPE_MISMATCH for a @dtype that is not 16 bits wide, or
 *   %GMLP_ERROR_INVALID_ARGUMENT when @n_values does not match the shape
 *
 * Since: 0.1
 */
GmlpGroupedTensor *
gmlp_grouped_tensor_new_from_uint16 (GmlpDevice     *device,
                                     GmlpDType       dtype,
                                     const gint64   *rows,
                                     guint           n_groups,
                                     gint64          cols,
                                     const guint16  *values,
                                     gsize           n_values,
                                     GError        **error)
{
  g_return_val_if_fail (GMLP_IS_DEVICE (device), NULL);
  g_return_val_if_fail (values != NULL || n_values == 0, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  return new_from_host_array (device, dtype, dtype,
                              dtype == GMLP_DTYPE_FLOAT16 || dtype == GMLP_DTYPE_BFLOAT16,
                              "new_from_uint16", "FLOAT16 or BFLOAT16", rows, n_groups, cols,
                              values, n_values, error);
}

/* The typed readers: the packed values converted to @as on the device,
 * then copied to the host. */
static gpointer
to_host_array (GmlpGroupedTensor  *self,
               GmlpDType           as,
               gsize              *n_values,
               GError            **error)
{
  g_autoptr(GmlpGroupedTensor) converted = NULL;
  g_autoptr(GBytes) bytes = NULL;
  gpointer values;
  gsize size;

  if (!gmlp_grouped_tensor_check_usable (self, error) ||
      !gmlp_device_check_not_capturing (self->device, "Reading a tensor to the host", error))
    return NULL;
  if (self->dtype != as || gmlp_grouped_tensor_is_scaled (self))
    {
      converted = gmlp_grouped_tensor_convert (self, as, error);
      if (converted == NULL)
        return NULL;
    }
  bytes = gmlp_grouped_tensor_to_bytes (converted != NULL ? converted : self, error);
  if (bytes == NULL)
    return NULL;

  values = g_bytes_unref_to_data (g_steal_pointer (&bytes), &size);
  if (values == NULL)
    values = g_malloc0 (1);   /* an empty array, not a NULL result */
  if (n_values != NULL)
    *n_values = size / gmlp_dtype_get_size (as);
  return values;
}

/**
 * gmlp_grouped_tensor_to_floats:
 * @self: a floating-point #GmlpGroupedTensor
 * @n_values: (out) (optional): the number of values
 * @error: return location for a #GError
 *
 * Reads the tensor to the host as 32-bit floats: the members in order, each
 * row-major, with no padding (a Python list, a gjs array of numbers). FP16
 * and BF16 widen exactly; a quantized tensor's values are dequantized with
 * its scales (see [method@Gmlp.GroupedTensor.convert]). Waits for the device.
 *
 * Returns: (transfer full) (array length=n_values): the values, or %NULL
 *   with %GMLP_ERROR_UNSUPPORTED for an integer tensor
 *
 * Since: 0.1
 */
float *
gmlp_grouped_tensor_to_floats (GmlpGroupedTensor  *self,
                               gsize              *n_values,
                               GError            **error)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  return to_host_array (self, GMLP_DTYPE_FLOAT32, n_values, error);
}

/**
 * gmlp_grouped_tensor_to_ints:
 * @self: an INT64 or INT32 #GmlpGroupedTensor
 * @n_values: (out) (optional): the number of values
 * @error: return location for a #GError
 *
 * Reads an integer tensor to the host as 64-bit integers: the members in
 * order, each row-major, with no padding. Waits for the device.
 *
 * Returns: (transfer full) (array length=n_values): the values, or %NULL
 *   with %GMLP_ERROR_UNSUPPORTED for a floating-point tensor
 *
 * Since: 0.1
 */
gint64 *
gmlp_grouped_tensor_to_ints (GmlpGroupedTensor  *self,
                             gsize              *n_values,
                             GError            **error)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  return to_host_array (self, GMLP_DTYPE_INT64, n_values, error);
}

/**
 * gmlp_grouped_tensor_to_uint16:
 * @self: a FLOAT16 or BFLOAT16 #GmlpGroupedTensor
 * @n_values: (out) (optional): the number of values
 * @error: return location for a #GError
 *
 * Reads a 16-bit floating-point tensor to the host as the raw bits of its
 * elements: the members in order, each row-major, with no padding (a gjs
 * `Uint16Array`'s contents, a Python list of ints). Waits for the device.
 *
 * Returns: (transfer full) (array length=n_values): the bit patterns, or
 *   %NULL with %GMLP_ERROR_DTYPE_MISMATCH for another dtype
 *
 * Since: 0.1
 */
guint16 *
gmlp_grouped_tensor_to_uint16 (GmlpGroupedTensor  *self,
                               gsize              *n_values,
                               GError            **error)
{
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!gmlp_grouped_tensor_check_usable (self, error))
    return NULL;
  if ((self->dtype != GMLP_DTYPE_FLOAT16 && self->dtype != GMLP_DTYPE_BFLOAT16) ||
      gmlp_grouped_tensor_is_scaled (self))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_DTYPE_MISMATCH,
                   "to_uint16() reads FLOAT16 and BFLOAT16 tensors, not %s%s",
                   gmlp_grouped_tensor_is_scaled (self) ? "scaled " : "", gmlp_dtype_get_name (self->dtype));
      return NULL;
    }
  return to_host_array (self, self->dtype, n_values, error);
}
