/* gmlp-grouped-tensor-members.c: a grouped tensor's members as views
 *
 * gmlp_grouped_tensor_get_member(): one member as a one-group tensor
 * sharing the storage. A member of a quantized tensor stays quantized: it
 * keeps the member of the scales that belongs to it and the member of the
 * columnwise copy, and a member of MXFP8's E8M0 scales stays marked as
 * such. Above both the object (gmlp-grouped-tensor.c, whose instance it
 * fills in) and the quantized tensors (gmlp-grouped-tensor-quantized.c,
 * whose scales it asks for), so that neither calls the other's way.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-grouped-tensor-impl.h"
#include "gmlp-dtype-private.h"
#include "gmlp-error.h"
#include "gmlp-numeric.h"
#include "gmlp-quantizer-private.h"

/* What view, member index of self, keeps of self's scales. */
static gboolean
keep_scales (GmlpGroupedTensor  *self,
             GmlpGroupedTensor  *view,
             guint               index,
             GError            **error)
{
  GmlpGroupedTensor *scale_inv = gmlp_grouped_tensor_get_scale_inv (self);
  GmlpGroupedTensor *columnwise = gmlp_grouped_tensor_get_columnwise (self);
  g_autoptr(GmlpGroupedTensor) scale_member = NULL;
  g_autoptr(GmlpGroupedTensor) columnwise_member = NULL;

  if (scale_inv == NULL)
    {
      /* Not quantized: scaled only as MXFP8's E8M0 scales themselves. */
      if (gmlp_grouped_tensor_is_scaled (self))
        gmlp_grouped_tensor_mark_e8m0_scales (view);
      return TRUE;
    }

  scale_member = gmlp_grouped_tensor_get_member (scale_inv, index, error);
  if (scale_member == NULL)
    return FALSE;
  if (columnwise != NULL)
    {
      columnwise_member = gmlp_grouped_tensor_get_member (columnwise, index, error);
      if (columnwise_member == NULL)
        return FALSE;
    }
  gmlp_grouped_tensor_set_quantized (view, gmlp_grouped_tensor_get_scaling_recipe (self),
                                     gmlp_grouped_tensor_get_quantize_flags (self), scale_member,
                                     columnwise_member, gmlp_grouped_tensor_is_columnwise (self));
  return TRUE;
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
  view->rows = view->one_group;
  view->rows[0] = self->rows[index];
  view->offsets = view->rows + 1;
  view->offsets[0] = 0;
  view->buffer = gmlp_buffer_ref (self->buffer);
  view->offset = self->offset + (gsize) self->offsets[index];
  view->nbytes = gmlp_num_member_stride (self->rows[index],
                                         (guint64) self->cols * gmlp_dtype_get_size (self->dtype));
  view->uniform = TRUE;
  view->is_view = TRUE;

  if (!keep_scales (self, view, index, error))
    g_clear_object (&view);
  return view;
}
