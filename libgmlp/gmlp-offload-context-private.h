/* gmlp-offload-context-private.h: for the layers and saved activations
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "gmlp-offload-context.h"
#include "gmlp-event.h"

G_BEGIN_DECLS

/* The innermost context of the calling thread and whether it is enabled. */
GmlpOffloadContext *gmlp_offload_context_peek_innermost (gboolean            *enabled);

/* Host memory of at least @nbytes from the context's pool. */
gpointer            gmlp_offload_context_take_host      (GmlpOffloadContext  *self,
                                                         gsize                nbytes,
                                                         gsize               *size,
                                                         GError             **error);
/* Gives host memory back; it is reused once @busy_until has completed. */
void                gmlp_offload_context_give_host      (GmlpOffloadContext  *self,
                                                         gpointer             ptr,
                                                         gsize                size,
                                                         GmlpEvent           *busy_until);

/* Bookkeeping from the saved activations. Offloaded @saved become the most
 * recently offloaded activations: returns those that were (a reference, or
 * NULL), whose device copy the caller then takes away
 * (gmlp_saved_activations_release_device()). */
GmlpSavedActivations *gmlp_offload_context_offloaded    (GmlpOffloadContext  *self,
                                                         GmlpSavedActivations *saved,
                                                         guint64              nbytes);
/* A backward found the device copy still there: no reload was needed. */
void                gmlp_offload_context_kept           (GmlpOffloadContext  *self,
                                                         GmlpSavedActivations *saved,
                                                         guint64              nbytes);
void                gmlp_offload_context_reloading      (GmlpOffloadContext  *self,
                                                         GmlpSavedActivations *saved,
                                                         guint64              nbytes,
                                                         gboolean             prefetch);
/* @saved is being finalized. */
void                gmlp_offload_context_forget         (GmlpOffloadContext  *self,
                                                         GmlpSavedActivations *saved);
/* A backward is about to use @saved: prefetch the activations saved before
 * it, so their reload overlaps this backward (gmlp-offload-context-schedule.c). */
void                gmlp_offload_context_backward_started (GmlpOffloadContext *self,
                                                         GmlpSavedActivations *saved);

G_END_DECLS
