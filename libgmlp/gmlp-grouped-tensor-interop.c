/* gmlp-grouped-tensor-interop.c: data in and out of a grouped tensor
 *
 * The packed order (members in order, row-major, no padding) on the host
 * as #GBytes or typed arrays, and other libraries' tensors through DLPack,
 * shared without a copy where the layout allows. The object and its layout
 * are in gmlp-grouped-tensor.c; this file reaches them through the
 * accessors and gmlp-grouped-tensor-private.h.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <string.h>

#include "gmlp-grouped-tensor-private.h"
#include <dlpack/dlpack.h>
#include "gmlp-dtype-private.h"
#include "gmlp-error.h"
#include "gmlp-error-private.h"
#include "gmlp-numeric.h"

/* Bytes of one row of @self. */
static gsize
row_bytes_of (GmlpGroupedTensor *self)
{
  return (gsize) gmlp_grouped_tensor_get_cols (self) *
         gmlp_dtype_get_size (gmlp_grouped_tensor_get_dtype (self));
}

/* Byte length of the packed (unpadded) form of a tensor with host sizes. */
static gsize
packed_bytes (GmlpGroupedTensor *self,
              const gint64      *rows)
{
  gsize total = 0;
  guint g;

  for (g = 0; g < gmlp_grouped_tensor_get_n_groups (self); g++)
    total += (gsize) MAX (rows[g], 0) * row_bytes_of (self);
  return total;
}

static gboolean
has_padding (GmlpGroupedTensor *self)
{
  return gmlp_grouped_tensor_get_n_groups (self) > 1 &&
         row_bytes_of (self) % kGmlpMemberAlignment != 0;
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

  if (!gmlp_grouped_tensor_check_host_layout (device, dtype, rows, n_groups, cols, &total_rows,
                                              error))
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

  self = gmlp_grouped_tensor_new_internal (device, dtype, rows, n_groups, cols, total_rows, error);
  if (self == NULL)
    return NULL;

  if (has_padding (self))
    {
      /* Lay the members out with their padding on the host, then upload the
       * whole span in one copy. */
      const guint8 *src = data;

      staging = g_malloc0 (gmlp_grouped_tensor_get_nbytes (self));
      for (g = 0; g < n_groups; g++)
        {
          gsize member = (gsize) rows[g] * row_bytes;

          /* An empty GBytes has no data pointer at all. */
          if (member > 0)
            memcpy (staging + gmlp_grouped_tensor_get_member_offset (self, g), src, member);
          src += member;
        }
      data = staging;
    }

  if (gmlp_grouped_tensor_get_nbytes (self) > 0 &&
      !GMLP_DEVICE_CALL (device, upload, gmlp_grouped_tensor_get_data (self), data,
                         has_padding (self) ? gmlp_grouped_tensor_get_nbytes (self) : expected,
                         error))
    return NULL;

  return g_steal_pointer (&self);
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
  gsize row_bytes, packed, nbytes, src_offset = 0, dst_offset = 0;
  gint64 rows_left;
  guint n_groups, g;

  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!gmlp_grouped_tensor_check_usable (self, error))
    return NULL;

  if (!gmlp_device_check_not_capturing (gmlp_grouped_tensor_get_device (self),
                                        "Reading a tensor to the host", error))
    return NULL;
  rows = gmlp_grouped_tensor_read_sizes (self, &n_groups, error);
  if (rows == NULL)
    return NULL;

  rows_left = gmlp_grouped_tensor_get_row_capacity (self);
  for (g = 0; g < n_groups; g++)
    {
      rows[g] = CLAMP (rows[g], 0, rows_left);
      rows_left -= rows[g];
    }

  row_bytes = row_bytes_of (self);
  packed = packed_bytes (self, rows);
  nbytes = gmlp_grouped_tensor_get_nbytes (self);
  host = g_malloc (MAX (nbytes, 1));
  if (nbytes > 0 &&
      !GMLP_DEVICE_CALL (gmlp_grouped_tensor_get_device (self), download, host,
                         gmlp_grouped_tensor_get_data (self), nbytes, error))
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
  GmlpDevice *device;

  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!gmlp_grouped_tensor_check_usable (self, error))
    return NULL;

  switch (gmlp_grouped_tensor_get_dtype (self))
    {
    case GMLP_DTYPE_FLOAT32: dtype.code = kDLFloat; dtype.bits = 32; break;
    case GMLP_DTYPE_FLOAT16: dtype.code = kDLFloat; dtype.bits = 16; break;
    case GMLP_DTYPE_BFLOAT16: dtype.code = kDLBfloat; dtype.bits = 16; break;
    case GMLP_DTYPE_INT32: dtype.code = kDLInt; dtype.bits = 32; break;
    case GMLP_DTYPE_INT64: dtype.code = kDLInt; dtype.bits = 64; break;
    default:
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "No DLPack export for %s tensors",
                   gmlp_dtype_get_name (gmlp_grouped_tensor_get_dtype (self)));
      return NULL;
    }
  if (gmlp_grouped_tensor_peek_rows (self) == NULL)
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
                   gmlp_grouped_tensor_get_cols (self),
                   gmlp_dtype_get_name (gmlp_grouped_tensor_get_dtype (self)), GMLP_MEMBER_ALIGNMENT);
      return NULL;
    }
  /* The export promises complete data, which a capture has not computed. */
  device = gmlp_grouped_tensor_get_device (self);
  if (!gmlp_device_check_not_capturing (device, "DLPack export", error) ||
      !gmlp_device_synchronize (device, error))
    return NULL;

  export = g_new0 (DLPackExport, 1);
  export->tensor = g_object_ref (self);
  gmlp_grouped_tensor_mark_exported (self);
  export->shape[0] = gmlp_grouped_tensor_get_row_capacity (self);
  export->shape[1] = gmlp_grouped_tensor_get_cols (self);
  export->managed.dl_tensor.data = gmlp_grouped_tensor_get_data (self);
  export->managed.dl_tensor.device.device_type =
    gmlp_device_get_kind (device) == GMLP_DEVICE_KIND_CUDA ? kDLCUDA : kDLCPU;
  export->managed.dl_tensor.device.device_id = gmlp_device_get_ordinal (device);
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
  GmlpBuffer *buffer;
  GmlpDType dtype;
  gint64 total_rows, cols;
  gsize row_bytes, nbytes;
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
  if (!gmlp_grouped_tensor_check_host_layout (device, dtype, rows, n_groups, cols, &total_rows,
                                              error))
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
  self = gmlp_grouped_tensor_new_layout (device, dtype, rows, n_groups, cols, total_rows);
  nbytes = gmlp_grouped_tensor_get_nbytes (self);

  if (nbytes > 0 && nbytes == (gsize) total_rows * row_bytes &&
      GPOINTER_TO_SIZE (data) % DLPACK_MIN_ALIGNMENT == 0)
    {
      gmlp_grouped_tensor_take_buffer (self,
                                       gmlp_buffer_new_foreign (device, (gpointer) data, nbytes,
                                                                dlpack_release, managed));
      return g_steal_pointer (&self);
    }

  buffer = gmlp_buffer_new (device, nbytes, error);
  if (buffer == NULL)
    return NULL;
  gmlp_grouped_tensor_take_buffer (self, buffer);
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
  if (!gmlp_grouped_tensor_check_host_layout (device, dtype, rows, n_groups, cols, &total_rows,
                                              error))
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
      !gmlp_device_check_not_capturing (gmlp_grouped_tensor_get_device (self),
                                        "Reading a tensor to the host", error))
    return NULL;
  if (gmlp_grouped_tensor_get_dtype (self) != as || gmlp_grouped_tensor_is_scaled (self))
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
  GmlpDType dtype;

  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (self), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!gmlp_grouped_tensor_check_usable (self, error))
    return NULL;
  dtype = gmlp_grouped_tensor_get_dtype (self);
  if ((dtype != GMLP_DTYPE_FLOAT16 && dtype != GMLP_DTYPE_BFLOAT16) ||
      gmlp_grouped_tensor_is_scaled (self))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_DTYPE_MISMATCH,
                   "to_uint16() reads FLOAT16 and BFLOAT16 tensors, not %s%s",
                   gmlp_grouped_tensor_is_scaled (self) ? "scaled " : "", gmlp_dtype_get_name (dtype));
      return NULL;
    }
  return to_host_array (self, dtype, n_values, error);
}
