/* gmlp-event-private.h
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "gmlp-event.h"
#include "backend/gmlp-backend.h"

G_BEGIN_DECLS

/* Wraps an event the backend made (a copy's or an all-to-all's
 * completion); takes it over. */
GmlpEvent *gmlp_event_new_for_backend (GmlpDevice       *device,
                                       GmlpBackendEvent *event);
/* For a wgrad-ready signal (@signal_id of @instance, one event argument): an
 * event recorded now on @device's stream in @event, or NULL there when no
 * handler is connected to the signal, which is then not emitted either: the
 * event is for handlers to wait on, and recording one every step costs. */
gboolean   gmlp_event_record_for_signal (gpointer     instance,
                                         guint        signal_id,
                                         GmlpDevice  *device,
                                         GmlpEvent  **event,
                                         GError     **error);

G_END_DECLS
