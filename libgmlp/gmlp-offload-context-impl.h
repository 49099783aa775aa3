/* gmlp-offload-context-impl.h: the offload context's instance struct
 *
 * Shared by the two files of the object itself: gmlp-offload-context.c
 * (type, properties, thread stacks, host memory, the bookkeeping that saved
 * activations report to) and gmlp-offload-context-schedule.c (what the
 * context does to the activations it offloaded). No other file includes it.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "gmlp-offload-context-private.h"

G_BEGIN_DECLS

/* Activations the context offloaded, until they are finalized: a weak
 * reference, which a thread that did not make them may turn into a strong
 * one safely while their last reference goes on another thread, and the
 * pointer to find them by, never dereferenced. */
typedef struct {
  GWeakRef  ref;
  gpointer  key;
} Offloaded;

/* The lock guards everything below it: threads that share the context
 * offload, reload and take host memory at once. It is never held while
 * calling into saved activations that could take theirs (which call in
 * here with theirs held), nor while dropping a reference to them. */
struct _GmlpOffloadContext
{
  GObject      parent_instance;

  GmlpDevice  *device;
  GMutex       lock;
  GList       *free_blocks;      /* HostBlock (gmlp-offload-context.c) */
  GQueue       offloaded;        /* Offloaded, in the order of the offloads */
  Offloaded   *recent;           /* the last offloaded, still with its device copy */
  guint64      pool_bytes;
  guint64      bytes_offloaded;
  guint64      bytes_on_host;
  guint        reload_waits;
  guint        prefetches;
};

/* The entry of @saved, or NULL; lock held. */
GList                *gmlp_offload_context_find_offloaded (GmlpOffloadContext   *self,
                                                           GmlpSavedActivations *saved);
/* Makes @recent (NULL: none) the most recently offloaded activations; lock
 * held. Returns those that were, whose device copy the caller takes away
 * (gmlp_saved_activations_release_device()) once the lock is let go. */
GmlpSavedActivations *gmlp_offload_context_swap_recent    (GmlpOffloadContext   *self,
                                                           Offloaded            *recent);

G_END_DECLS
