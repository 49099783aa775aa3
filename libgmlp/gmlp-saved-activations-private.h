/* gmlp-saved-activations-private.h: for the layers and the offload context
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "gmlp-saved-activations.h"
#include "gmlp-grouped-tensor.h"
#include "gmlp-offload-context.h"

G_BEGIN_DECLS

/* Every layer has a process-unique id; saved activations remember the id of
 * the layer whose forward made them. */
guint64               gmlp_layer_id_next                    (void);

GmlpSavedActivations *gmlp_saved_activations_new            (guint64                owner_id);
/* Saves a tensor; a quantized one (FP8 with scales) with every part, which
 * offload moves and get() gives back as the same quantized tensor. */
void                  gmlp_saved_activations_add            (GmlpSavedActivations  *self,
                                                             const char            *name,
                                                             GmlpGroupedTensor     *tensor);
/* Saves a tensor that offload leaves on the device (a layer's FP8 copy of
 * its weights: not an activation). */
void                  gmlp_saved_activations_add_resident   (GmlpSavedActivations  *self,
                                                             const char            *name,
                                                             GmlpGroupedTensor     *tensor);
/* The tensor for a backward on @device's compute stream: reloaded if it was
 * offloaded, with the stream made to wait for the reload. (transfer none) */
GmlpGroupedTensor    *gmlp_saved_activations_get            (GmlpSavedActivations  *self,
                                                             const char            *name,
                                                             GError               **error);
/* Whether a tensor was saved under @name; reloads nothing. */
gboolean              gmlp_saved_activations_contains       (GmlpSavedActivations  *self,
                                                             const char            *name);
/* Checks that @self came from the layer @owner_id and was not used yet. */
gboolean              gmlp_saved_activations_check          (GmlpSavedActivations  *self,
                                                             guint64                owner_id,
                                                             const char            *layer_name,
                                                             GError               **error);
/* Saved activations of sub-layers (a GroupedMLP's fc1 and fc2). */
void                  gmlp_saved_activations_add_child      (GmlpSavedActivations  *self,
                                                             GmlpSavedActivations  *child);
GmlpSavedActivations *gmlp_saved_activations_get_child      (GmlpSavedActivations  *self,
                                                             guint                  index);
/* Drops the saved tensors; the object can't be used again. */
void                  gmlp_saved_activations_consume        (GmlpSavedActivations  *self);

/* What the innermost offload context told the forward: sets the offload
 * property, and with an enabled context copies every tensor to host memory
 * through it. */
gboolean              gmlp_saved_activations_apply_offload  (GmlpSavedActivations  *self,
                                                             GError               **error);
/* Starts copying offloaded tensors back (a prefetch, or the backward's own
 * reload); does nothing for tensors on the device. */
gboolean              gmlp_saved_activations_reload         (GmlpSavedActivations  *self,
                                                             gboolean               prefetch,
                                                             GError               **error);
/* Whether a reload is still needed. */
gboolean              gmlp_saved_activations_is_on_host     (GmlpSavedActivations  *self);
/* Lets go of the device copy of tensors that are in host memory too. */
void                  gmlp_saved_activations_release_device (GmlpSavedActivations  *self);
GmlpOffloadContext   *gmlp_saved_activations_get_context    (GmlpSavedActivations  *self);

G_END_DECLS
