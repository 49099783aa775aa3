/* gmlp-saved-activations-private.h: for the layers and the offload context
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "gmlp-saved-activations.h"
#include "gmlp-grouped-tensor.h"
#include "gmlp-offload-context.h"
#include "gmlp-device-private.h"

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

/* Versions (gmlp_grouped_tensor_get_version()): a backward refuses to run
 * when a tensor its forward read has been written since. The records keep
 * the storage's counter, not the storage, so offloaded activations are
 * checked as those on the device are. */
typedef struct {
  const char         *name;      /* static: "input", "weight", ... */
  const char         *reader;    /* static: "forward" or "backward" */
  GmlpSpan            span;      /* holds a reference to span.storage */
  guint64             seen;
} GmlpVersionRecord;

/* A GArray of GmlpVersionRecord that clears its elements. */
GArray               *gmlp_version_records_new              (void);
/* Records @tensor's version now, as @reader saw it. */
void                  gmlp_version_records_add              (GArray                *records,
                                                             const char            *name,
                                                             const char            *reader,
                                                             GmlpGroupedTensor     *tensor);
/* Fails with GMLP_ERROR_INVALID_STATE, naming the tensor (and @layer,
 * "GroupedLinear", "GroupedMLP's FC1", ...), if any was written since. */
gboolean              gmlp_version_records_check            (GArray                *records,
                                                             const char            *layer,
                                                             GError               **error);
/* The first record whose bytes overlap @span, or NULL. */
const GmlpVersionRecord *gmlp_version_records_find_overlap  (GArray                *records,
                                                             const GmlpSpan        *span);

/* Records the version of a tensor the backward reads but that is not saved
 * (the layer's weights), or that is saved as a copy (the source of an FP8
 * input). gmlp_saved_activations_add() records the saved tensors'. */
void                  gmlp_saved_activations_watch          (GmlpSavedActivations  *self,
                                                             const char            *name,
                                                             GmlpGroupedTensor     *tensor);
gboolean              gmlp_saved_activations_check_versions (GmlpSavedActivations  *self,
                                                             const char            *layer,
                                                             GError               **error);
/* The same over @self and its children, their children included: a layer
 * made of layers checks every part before any part writes. */
gboolean              gmlp_saved_activations_check_versions_deep (GmlpSavedActivations  *self,
                                                                  const char            *layer,
                                                                  GError               **error);
GArray               *gmlp_saved_activations_get_versions   (GmlpSavedActivations  *self);
/* Appends copies of the records of @name to @records (a delayed weight
 * gradient keeps those of the input). */
void                  gmlp_saved_activations_copy_versions  (GmlpSavedActivations  *self,
                                                             const char            *name,
                                                             GArray                *records);

G_END_DECLS
