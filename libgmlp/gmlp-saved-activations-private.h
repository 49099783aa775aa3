/* gmlp-saved-activations-private.h: for the layers
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "gmlp-saved-activations.h"
#include "gmlp-grouped-tensor.h"

G_BEGIN_DECLS

/* Every layer has a process-unique id; saved activations remember the id of
 * the layer whose forward made them. */
guint64               gmlp_layer_id_next                    (void);

GmlpSavedActivations *gmlp_saved_activations_new            (guint64                owner_id);
void                  gmlp_saved_activations_add            (GmlpSavedActivations  *self,
                                                             const char            *name,
                                                             GmlpGroupedTensor     *tensor);
GmlpGroupedTensor    *gmlp_saved_activations_get            (GmlpSavedActivations  *self,
                                                             const char            *name);
/* Checks that @self came from the layer @owner_id and was not used yet. */
gboolean              gmlp_saved_activations_check          (GmlpSavedActivations  *self,
                                                             guint64                owner_id,
                                                             const char            *layer_name,
                                                             GError               **error);
/* Drops the saved tensors; the object can't be used again. */
void                  gmlp_saved_activations_consume        (GmlpSavedActivations  *self);

G_END_DECLS
