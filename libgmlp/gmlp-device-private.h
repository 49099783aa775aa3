/* gmlp-device-private.h: what the other classes need of a GmlpDevice
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "gmlp-device.h"
#include "backend/gmlp-backend.h"

G_BEGIN_DECLS

/* A reference-counted device allocation; grouped tensors and their views
 * share one. Freed stream-ordered when the last reference goes. */
typedef struct {
  int              ref_count;  /* atomic: g_atomic_int_* */
  GmlpDevice      *device;
  gpointer         data;
  gsize            nbytes;
  int              copied;     /* atomic: a copy-stream copy has read it */
} GmlpBuffer;

const GmlpBackend *gmlp_device_get_backend         (GmlpDevice  *self);
GmlpBackendDevice *gmlp_device_get_backend_device  (GmlpDevice  *self);

GmlpBuffer        *gmlp_buffer_new                 (GmlpDevice  *device,
                                                    gsize        nbytes,
                                                    GError     **error);
/* Takes ownership of device memory that the backend allocated. */
GmlpBuffer        *gmlp_buffer_new_wrapped         (GmlpDevice  *device,
                                                    gpointer     data,
                                                    gsize        nbytes);
/* Marks the buffer as read by the copy stream: its memory then goes back to
 * the pool only after the copies too. */
void               gmlp_buffer_mark_copied         (GmlpBuffer  *buffer);
GmlpBuffer        *gmlp_buffer_ref                 (GmlpBuffer  *buffer);
void               gmlp_buffer_unref               (GmlpBuffer  *buffer);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (GmlpBuffer, gmlp_buffer_unref)

/* Fails with GMLP_ERROR_INVALID_STATE while self is capturing a graph, for
 * the calls that wait for the device or read its memory on the host: a
 * graph cannot record them, and trying would break the capture. Call it
 * before touching the stream; what names the call in the message ("Reading
 * a tensor to the host"). */
gboolean           gmlp_device_check_not_capturing (GmlpDevice  *self,
                                                    const char  *what,
                                                    GError     **error);
/* The number of the capture in progress on self, counting from 1, or 0 when
 * self is not capturing; events remember it (gmlp-event.c). */
guint              gmlp_device_get_capture_serial  (GmlpDevice  *self);

/* Calls a backend entry point with the device's backend handle. */
#define GMLP_DEVICE_CALL(device, func, ...) \
  (gmlp_device_get_backend (device)->func (gmlp_device_get_backend_device (device), __VA_ARGS__))

G_END_DECLS
