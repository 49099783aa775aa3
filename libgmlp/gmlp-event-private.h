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

G_END_DECLS
