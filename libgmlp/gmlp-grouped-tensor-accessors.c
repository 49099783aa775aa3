/* gmlp-grouped-tensor-accessors.c: what a grouped tensor tells
 *
 * The public getters of GmlpGroupedTensor (device, dtype, groups, rows,
 * offsets, byte count, host or device sizes, view, version) and the
 * private ones the rest of libgmlp reads it through
 * (gmlp-grouped-tensor-private.h): its data, its storage's span and
 * version counter, member data, layout, buffer, shape comparison.
 * The object itself is in gmlp-grouped-tensor.c.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-grouped-tensor-impl.h"
#include "gmlp-dtype-private.h"

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

gpointer
gmlp_grouped_tensor_get_data (GmlpGroupedTensor *self)
{
  return (guint8 *) self->buffer->data + self->offset;
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

gboolean
gmlp_grouped_tensor_is_shared (GmlpGroupedTensor *self)
{
  return self->buffer != NULL &&
         (self->buffer->release != NULL || g_atomic_int_get (&self->buffer->exported));
}

void
gmlp_grouped_tensor_mark_exported (GmlpGroupedTensor *self)
{
  if (self->buffer != NULL)
    g_atomic_int_set (&self->buffer->exported, TRUE);
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

GmlpBuffer *
gmlp_grouped_tensor_get_buffer (GmlpGroupedTensor *self)
{
  return self->buffer;
}

gboolean
gmlp_grouped_tensor_same_shape (GmlpGroupedTensor *a,
                                GmlpGroupedTensor *b)
{
  guint g;

  if (b->n_groups != a->n_groups || b->cols != a->cols ||
      (a->rows == NULL) != (b->rows == NULL) ||
      (a->rows == NULL && (a->sizes != b->sizes || a->row_capacity != b->row_capacity)))
    return FALSE;
  for (g = 0; a->rows != NULL && g < a->n_groups; g++)
    if (a->rows[g] != b->rows[g])
      return FALSE;
  return TRUE;
}
