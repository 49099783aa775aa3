/* gmlp-communicator-private.h: the all-to-alls with their join in hand
 *
 * What gmlp_communicator_all_to_all() and _all_to_all_rows() do, with
 * @done: NULL, the device's stream waits for the all-to-all (the public
 * calls); else *@done is the event the caller makes it wait on (the
 * _start() calls, and the expert-parallel layer's chunks). No argument
 * checks of g_return_val_if_fail: the callers made them.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "gmlp-communicator.h"
#include "gmlp-event.h"

G_BEGIN_DECLS

gboolean gmlp_communicator_all_to_all_full      (GmlpCommunicator   *self,
                                                 GmlpGroupedTensor  *send,
                                                 GmlpGroupedTensor  *recv,
                                                 GmlpEvent         **done,
                                                 GError            **error);
gboolean gmlp_communicator_all_to_all_rows_full (GmlpCommunicator   *self,
                                                 GmlpGroupedTensor  *send,
                                                 const gint64       *send_rows,
                                                 guint               n_send_rows,
                                                 GmlpGroupedTensor  *recv,
                                                 const gint64       *recv_rows,
                                                 guint               n_recv_rows,
                                                 GmlpEvent         **done,
                                                 GError            **error);
/* The bytes [offsets[p], offsets[p] + bytes[p]) of each tensor's storage
 * to and from each peer p (world size entries each), checked against the
 * storage: the chunks of the expert-parallel layer's trips. */
gboolean gmlp_communicator_all_to_all_spans_full (GmlpCommunicator   *self,
                                                  GmlpGroupedTensor  *send,
                                                  const gsize        *send_offsets,
                                                  const gsize        *send_bytes,
                                                  GmlpGroupedTensor  *recv,
                                                  const gsize        *recv_offsets,
                                                  const gsize        *recv_bytes,
                                                  GmlpEvent         **done,
                                                  GError            **error);

G_END_DECLS
