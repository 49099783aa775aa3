/* gmlp-grouped-tensor.h: N member matrices packed in one device allocation
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#if !defined(GMLP_INSIDE) && !defined(GMLP_COMPILATION)
# error "Only <gmlp.h> can be included directly."
#endif

#include <glib-object.h>

#include "gmlp-version-macros.h"
#include "gmlp-device.h"
#include "gmlp-dtype.h"

G_BEGIN_DECLS

/**
 * GMLP_MEMBER_ALIGNMENT:
 *
 * Every member of a [class@Gmlp.GroupedTensor] starts on a boundary of this
 * many bytes, counted from the start of the tensor's storage.
 *
 * Since: 0.1
 */
#define GMLP_MEMBER_ALIGNMENT 256

#define GMLP_TYPE_GROUPED_TENSOR (gmlp_grouped_tensor_get_type ())

/**
 * GmlpGroupedTensorClass:
 * @parent_class: the parent class
 *
 * The class structure of #GmlpGroupedTensor, a final type: it has no virtual methods.
 *
 * Since: 0.1
 */
GMLP_AVAILABLE_IN_0_1
G_DECLARE_FINAL_TYPE (GmlpGroupedTensor, gmlp_grouped_tensor, GMLP, GROUPED_TENSOR, GObject)

GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor *gmlp_grouped_tensor_new                  (GmlpDevice         *device,
                                                             GmlpDType           dtype,
                                                             const gint64       *rows,
                                                             guint               n_groups,
                                                             gint64              cols,
                                                             GError            **error);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor *gmlp_grouped_tensor_new_uniform          (GmlpDevice         *device,
                                                             GmlpDType           dtype,
                                                             guint               n_groups,
                                                             gint64              rows,
                                                             gint64              cols,
                                                             GError            **error);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor *gmlp_grouped_tensor_new_from_bytes       (GmlpDevice         *device,
                                                             GmlpDType           dtype,
                                                             const gint64       *rows,
                                                             guint               n_groups,
                                                             gint64              cols,
                                                             GBytes             *bytes,
                                                             GError            **error);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor *gmlp_grouped_tensor_new_from_floats      (GmlpDevice         *device,
                                                             GmlpDType           dtype,
                                                             const gint64       *rows,
                                                             guint               n_groups,
                                                             gint64              cols,
                                                             const float        *values,
                                                             gsize               n_values,
                                                             GError            **error);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor *gmlp_grouped_tensor_new_from_ints        (GmlpDevice         *device,
                                                             GmlpDType           dtype,
                                                             const gint64       *rows,
                                                             guint               n_groups,
                                                             gint64              cols,
                                                             const gint64       *values,
                                                             gsize               n_values,
                                                             GError            **error);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor *gmlp_grouped_tensor_new_from_uint16      (GmlpDevice         *device,
                                                             GmlpDType           dtype,
                                                             const gint64       *rows,
                                                             guint               n_groups,
                                                             gint64              cols,
                                                             const guint16      *values,
                                                             gsize               n_values,
                                                             GError            **error);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor *gmlp_grouped_tensor_new_with_device_sizes (GmlpDevice        *device,
                                                             GmlpDType           dtype,
                                                             GmlpGroupedTensor  *sizes,
                                                             gint64              row_capacity,
                                                             gint64              cols,
                                                             GError            **error);
GMLP_AVAILABLE_IN_0_1
GBytes            *gmlp_grouped_tensor_to_bytes             (GmlpGroupedTensor  *self,
                                                             GError            **error);
GMLP_AVAILABLE_IN_0_1
float             *gmlp_grouped_tensor_to_floats            (GmlpGroupedTensor  *self,
                                                             gsize              *n_values,
                                                             GError            **error);
GMLP_AVAILABLE_IN_0_1
gint64            *gmlp_grouped_tensor_to_ints              (GmlpGroupedTensor  *self,
                                                             gsize              *n_values,
                                                             GError            **error);
GMLP_AVAILABLE_IN_0_1
guint16           *gmlp_grouped_tensor_to_uint16            (GmlpGroupedTensor  *self,
                                                             gsize              *n_values,
                                                             GError            **error);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor *gmlp_grouped_tensor_convert              (GmlpGroupedTensor  *self,
                                                             GmlpDType           dtype,
                                                             GError            **error);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor *gmlp_grouped_tensor_get_member           (GmlpGroupedTensor  *self,
                                                             guint               index,
                                                             GError            **error);
GMLP_AVAILABLE_IN_0_1
gboolean           gmlp_grouped_tensor_fill_zero            (GmlpGroupedTensor  *self,
                                                             GError            **error);
GMLP_AVAILABLE_IN_0_1
gboolean           gmlp_grouped_tensor_fill_random          (GmlpGroupedTensor  *self,
                                                             guint64             seed,
                                                             double              scale,
                                                             GError            **error);
GMLP_AVAILABLE_IN_0_1
gboolean           gmlp_grouped_tensor_add_scaled           (GmlpGroupedTensor  *self,
                                                             double              alpha,
                                                             GmlpGroupedTensor  *other,
                                                             GError            **error);
GMLP_AVAILABLE_IN_0_1
gboolean           gmlp_grouped_tensor_scale                (GmlpGroupedTensor  *self,
                                                             double              alpha,
                                                             GError            **error);
GMLP_AVAILABLE_IN_0_1
double             gmlp_grouped_tensor_sum_squares          (GmlpGroupedTensor  *self,
                                                             GError            **error);
GMLP_AVAILABLE_IN_0_1
gpointer           gmlp_grouped_tensor_to_dlpack            (GmlpGroupedTensor  *self,
                                                             GError            **error);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor *gmlp_grouped_tensor_new_from_dlpack      (GmlpDevice         *device,
                                                             gpointer            dlpack,
                                                             const gint64       *rows,
                                                             guint               n_groups,
                                                             GError            **error);
GMLP_AVAILABLE_IN_0_1
void               gmlp_dlpack_capsule_destructor           (gpointer            capsule);
GMLP_AVAILABLE_IN_0_1
gpointer           gmlp_dlpack_python_guard                 (gpointer            dlpack);
GMLP_AVAILABLE_IN_0_1
GmlpDevice        *gmlp_grouped_tensor_get_device           (GmlpGroupedTensor  *self);
GMLP_AVAILABLE_IN_0_1
GmlpDType          gmlp_grouped_tensor_get_dtype            (GmlpGroupedTensor  *self);
GMLP_AVAILABLE_IN_0_1
guint              gmlp_grouped_tensor_get_n_groups         (GmlpGroupedTensor  *self);
GMLP_AVAILABLE_IN_0_1
gint64             gmlp_grouped_tensor_get_cols             (GmlpGroupedTensor  *self);
GMLP_AVAILABLE_IN_0_1
gint64             gmlp_grouped_tensor_get_rows             (GmlpGroupedTensor  *self,
                                                             guint               index);
GMLP_AVAILABLE_IN_0_1
gint64             gmlp_grouped_tensor_get_total_rows       (GmlpGroupedTensor  *self);
GMLP_AVAILABLE_IN_0_1
gint64             gmlp_grouped_tensor_get_row_capacity     (GmlpGroupedTensor  *self);
GMLP_AVAILABLE_IN_0_1
gint64             gmlp_grouped_tensor_get_member_offset    (GmlpGroupedTensor  *self,
                                                             guint               index);
GMLP_AVAILABLE_IN_0_1
gsize              gmlp_grouped_tensor_get_nbytes           (GmlpGroupedTensor  *self);
GMLP_AVAILABLE_IN_0_1
gboolean           gmlp_grouped_tensor_has_host_sizes       (GmlpGroupedTensor  *self);
GMLP_AVAILABLE_IN_0_1
gboolean           gmlp_grouped_tensor_is_uniform           (GmlpGroupedTensor  *self);
GMLP_AVAILABLE_IN_0_1
gboolean           gmlp_grouped_tensor_is_view              (GmlpGroupedTensor  *self);
GMLP_AVAILABLE_IN_0_1
guint64            gmlp_grouped_tensor_get_version          (GmlpGroupedTensor  *self);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor *gmlp_grouped_tensor_get_sizes            (GmlpGroupedTensor  *self,
                                                             GError            **error);
GMLP_AVAILABLE_IN_0_1
gint64            *gmlp_grouped_tensor_read_sizes           (GmlpGroupedTensor  *self,
                                                             guint              *n_groups,
                                                             GError            **error);

G_END_DECLS

/* FP8: tensors made by a GmlpQuantizer carry their scales (gmlp-quantizer.c
 * makes them; the accessors are in gmlp-grouped-tensor-quantized.c). */

#include "gmlp-scaling-recipe.h"

G_BEGIN_DECLS

GMLP_AVAILABLE_IN_0_1
GmlpScalingRecipe  gmlp_grouped_tensor_get_scaling_recipe   (GmlpGroupedTensor  *self);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor *gmlp_grouped_tensor_get_scale_inv        (GmlpGroupedTensor  *self);
GMLP_AVAILABLE_IN_0_1
gboolean           gmlp_grouped_tensor_get_scale_block      (GmlpGroupedTensor  *self,
                                                             gint64             *block_rows,
                                                             gint64             *block_cols);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor *gmlp_grouped_tensor_get_columnwise       (GmlpGroupedTensor  *self);
GMLP_AVAILABLE_IN_0_1
gboolean           gmlp_grouped_tensor_is_columnwise        (GmlpGroupedTensor  *self);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor *gmlp_grouped_tensor_dequantize           (GmlpGroupedTensor  *self,
                                                             GmlpDType           dtype,
                                                             GError            **error);

G_END_DECLS
