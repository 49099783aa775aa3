/* gmlp-quantizer.h: FP8 quantization of grouped tensors
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
#include "gmlp-grouped-tensor.h"
#include "gmlp-scaling-recipe.h"

G_BEGIN_DECLS

#define GMLP_TYPE_QUANTIZER (gmlp_quantizer_get_type ())

/**
 * GmlpQuantizerClass:
 * @parent_class: the parent class
 *
 * The class structure of #GmlpQuantizer, a final type: it has no virtual methods.
 *
 * Since: 0.1
 */
GMLP_AVAILABLE_IN_0_1
G_DECLARE_FINAL_TYPE (GmlpQuantizer, gmlp_quantizer, GMLP, QUANTIZER, GObject)

GMLP_AVAILABLE_IN_0_1
GmlpQuantizer      *gmlp_quantizer_new                     (GmlpDevice         *device,
                                                            GmlpScalingRecipe   recipe,
                                                            GmlpFp8Format       format,
                                                            GmlpQuantizerRole   role);
GMLP_AVAILABLE_IN_0_1
GmlpGroupedTensor  *gmlp_quantizer_quantize                (GmlpQuantizer      *self,
                                                            GmlpGroupedTensor  *src,
                                                            GError            **error);
GMLP_AVAILABLE_IN_0_1
gboolean            gmlp_quantizer_update                  (GmlpQuantizer      *self,
                                                            GError            **error);
GMLP_AVAILABLE_IN_0_1
GVariant           *gmlp_quantizer_save_state              (GmlpQuantizer      *self,
                                                            GError            **error);
GMLP_AVAILABLE_IN_0_1
gboolean            gmlp_quantizer_restore_state           (GmlpQuantizer      *self,
                                                            GVariant           *state,
                                                            GError            **error);
GMLP_AVAILABLE_IN_0_1
GmlpDevice         *gmlp_quantizer_get_device              (GmlpQuantizer      *self);
GMLP_AVAILABLE_IN_0_1
GmlpScalingRecipe   gmlp_quantizer_get_recipe              (GmlpQuantizer      *self);
GMLP_AVAILABLE_IN_0_1
GmlpFp8Format       gmlp_quantizer_get_fp8_format          (GmlpQuantizer      *self);
GMLP_AVAILABLE_IN_0_1
GmlpQuantizerRole   gmlp_quantizer_get_role                (GmlpQuantizer      *self);
GMLP_AVAILABLE_IN_0_1
GmlpDType           gmlp_quantizer_get_dtype               (GmlpQuantizer      *self);
GMLP_AVAILABLE_IN_0_1
guint               gmlp_quantizer_get_amax_history_length (GmlpQuantizer      *self);
GMLP_AVAILABLE_IN_0_1
int                 gmlp_quantizer_get_margin              (GmlpQuantizer      *self);
GMLP_AVAILABLE_IN_0_1
gboolean            gmlp_quantizer_get_power_of_2_scales   (GmlpQuantizer      *self);
GMLP_AVAILABLE_IN_0_1
gboolean            gmlp_quantizer_get_columnwise          (GmlpQuantizer      *self);
GMLP_AVAILABLE_IN_0_1
void                gmlp_quantizer_set_columnwise          (GmlpQuantizer      *self,
                                                            gboolean            columnwise);

G_END_DECLS
