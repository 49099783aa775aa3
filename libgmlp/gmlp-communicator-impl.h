/* gmlp-communicator-impl.h: what the files of GmlpCommunicator share
 *
 * The object is two files, one job each: gmlp-communicator.c (type,
 * properties, construction, joining the group, the launcher, abort) and
 * gmlp-communicator-collectives.c (the collectives), which calls the
 * object's join and its event's hold, declared here. No other file
 * includes it.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "gmlp-communicator-private.h"
#include "gmlp-event.h"
#include "backend/gmlp-backend.h"

G_BEGIN_DECLS

struct _GmlpCommunicator
{
  GObject             parent_instance;

  GmlpDevice         *device;
  GBytes             *unique_id;
  int                 rank;
  int                 world_size;
  guint               timeout_ms;

  GmlpBackendComm    *comm;
  /* Collectives of one communicator are enqueued one at a time (NCCL's
   * communicators are not thread-safe); abort does not take it. */
  GMutex              call_lock;
  /* Under call_lock: the wait for the other ranks is done (GInitable's
   * init or the first collective waits, never g_object_new()). */
  gboolean            joined;
  GError             *join_error;
  GError             *construct_error;
};

/* Waits for the other ranks once, call_lock held; a failure stays. */
gboolean gmlp_communicator_join_locked (GmlpCommunicator  *self,
                                        GError           **error);
/* Makes event hold send and recv until it is dropped. */
void     gmlp_communicator_event_hold  (GmlpEvent         *event,
                                        GmlpGroupedTensor *send,
                                        GmlpGroupedTensor *recv);

G_END_DECLS
