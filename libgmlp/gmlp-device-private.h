/* gmlp-device-private.h: what the other classes need of a GmlpDevice
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "gmlp-device.h"
#include "backend/gmlp-backend.h"

G_BEGIN_DECLS

/* The keys of GMLP_DEBUG, a list like G_DEBUG's ("poison", "all" or
 * "help"), read once per process: testing aids, never a route. */
typedef enum {
  GMLP_DEBUG_POISON = 1 << 0,          /* fresh memory holds 0xff bytes: NaN */
  GMLP_DEBUG_NO_BLOCK_CACHE = 1 << 1,  /* devices open with the tuning
                                        * block-cache=off: freed memory goes
                                        * back at once (leak checks) */
} GmlpDebugFlags;

GmlpDebugFlags gmlp_debug_flags (void);

/* The version of a storage, as torch's tensors have one: every write
 * through the API adds one (gmlp_version_counter_bump()), and a backward
 * compares it with what its forward saw. Reference-counted apart from the
 * storage, so that saved activations can keep it while they let go of the
 * device memory (offload). */
typedef struct _GmlpVersionCounter GmlpVersionCounter;

GmlpVersionCounter *gmlp_version_counter_ref   (GmlpVersionCounter *counter);
void                gmlp_version_counter_unref (GmlpVersionCounter *counter);
guint64             gmlp_version_counter_get   (GmlpVersionCounter *counter);
void                gmlp_version_counter_bump  (GmlpVersionCounter *counter);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (GmlpVersionCounter, gmlp_version_counter_unref)

/* A reference-counted device allocation; grouped tensors and their views
 * share one, and its version. Freed stream-ordered when the last reference
 * goes. */
typedef struct {
  int                 ref_count;  /* atomic: g_atomic_int_* */
  GmlpDevice         *device;
  gpointer            data;
  gsize               nbytes;
  int                 copied;     /* atomic: a copy-stream copy has read it */
  GmlpVersionCounter *version;
  GDestroyNotify      release;    /* foreign memory: called instead of free */
  int                 exported;   /* atomic: exported through DLPack */
  gpointer            release_data;
} GmlpBuffer;

/* FALSE with the reason when @self could not be opened (made by
 * g_object_new() for a device that does not exist). Objects check their
 * device with it before they keep it. */
gboolean           gmlp_device_check_usable        (GmlpDevice  *self,
                                                    GError     **error);
const GmlpBackend *gmlp_device_get_backend         (GmlpDevice  *self);
GmlpBackendDevice *gmlp_device_get_backend_device  (GmlpDevice  *self);

GmlpBuffer        *gmlp_buffer_new                 (GmlpDevice  *device,
                                                    gsize        nbytes,
                                                    GError     **error);
/* Takes ownership of device memory that the backend allocated. */
GmlpBuffer        *gmlp_buffer_new_wrapped         (GmlpDevice  *device,
                                                    gpointer     data,
                                                    gsize        nbytes);
/* Wraps memory that libgmlp did not allocate (a DLPack import): the last
 * unref waits for the device, then calls @release (@release_data) instead
 * of freeing. Not counted in the device's bytes in use. */
GmlpBuffer        *gmlp_buffer_new_foreign         (GmlpDevice     *device,
                                                    gpointer        data,
                                                    gsize           nbytes,
                                                    GDestroyNotify  release,
                                                    gpointer        release_data);
/* Marks the buffer as read by the copy stream: its memory then goes back to
 * the pool only after the copies too. */
void               gmlp_buffer_mark_copied         (GmlpBuffer  *buffer);
GmlpBuffer        *gmlp_buffer_ref                 (GmlpBuffer  *buffer);
void               gmlp_buffer_unref               (GmlpBuffer  *buffer);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (GmlpBuffer, gmlp_buffer_unref)

/* Where a tensor's bytes lie: in which storage, named by its version
 * counter (one per GmlpBuffer, and it outlives the memory, so saved
 * activations keep naming the storage after offload), and where in it. */
typedef struct {
  GmlpVersionCounter *storage;
  gsize               offset;
  gsize               nbytes;
} GmlpSpan;

/* Whether two spans share a byte: the one test for aliasing (main_grad
 * against parameters and inputs, outputs against inputs). Each buffer owns
 * its memory alone, so spans of two storages never overlap; empty spans
 * overlap nothing. */
gboolean           gmlp_spans_overlap              (const GmlpSpan *a,
                                                    const GmlpSpan *b);

/* Fails with GMLP_ERROR_INVALID_STATE while self is capturing a graph, for
 * the calls that wait for the device or read its memory on the host: a
 * graph cannot record them, and trying would break the capture. Call it
 * before touching the stream; what names the call in the message ("Reading
 * a tensor to the host"). */
gboolean           gmlp_device_check_not_capturing (GmlpDevice  *self,
                                                    const char  *what,
                                                    GError     **error);
/* Counts one more capture begun on self (gmlp_device_begin_capture(), in
 * gmlp-graph.c), before the backend begins it. */
void               gmlp_device_bump_capture_serial (GmlpDevice  *self);
/* The number of the capture in progress on self, counting from 1, or 0 when
 * self is not capturing; events remember it (gmlp-event.c). */
guint              gmlp_device_get_capture_serial  (GmlpDevice  *self);
/* Whether a capture was ever begun on self: its graphs' replays then write
 * tensors without bumping their versions, and a cache keyed by versions
 * cannot be trusted on it. */
gboolean           gmlp_device_has_captured        (GmlpDevice  *self);
/* A device copy of the host group sizes @rows, uploaded on the first call
 * with these values and kept as long as the device, for the shapes that the
 * backends take of tensors with host sizes: a step makes such tensors anew
 * with the same sizes, and each would upload its own. Nobody writes it.
 * TRUE with NULL in @device_rows when none is kept (too many groups or
 * sizes, or @self is capturing: memory allocated then belongs to the
 * graph); FALSE when the allocation or the upload failed. */
gboolean           gmlp_device_get_uploaded_sizes  (GmlpDevice     *self,
                                                    const gint64   *rows,
                                                    guint           n_groups,
                                                    gconstpointer  *device_rows,
                                                    GError        **error);

/* Calls a backend entry point with the device's backend handle. */
#define GMLP_DEVICE_CALL(device, func, ...) \
  (gmlp_device_get_backend (device)->func (gmlp_device_get_backend_device (device), __VA_ARGS__))

G_END_DECLS
