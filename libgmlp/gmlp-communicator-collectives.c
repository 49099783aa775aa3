/* gmlp-communicator-collectives.c: a communicator's collectives
 *
 * All-reduce and all-gather of whole tensors, all-to-all of byte spans
 * and of row matrices (at once, or started with an event that holds the
 * tensors until they have travelled). Each checks its communicator and
 * tensors first, then takes the call lock (NCCL's communicators are not
 * thread-safe) and, the first time, waits for the other ranks
 * (gmlp_communicator_join_locked()). The object is in gmlp-communicator.c.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <string.h>

#include "gmlp-communicator-impl.h"
#include "gmlp-device-private.h"
#include "gmlp-enum-types.h"
#include "gmlp-error.h"
#include "gmlp-error-private.h"
#include "gmlp-event-private.h"
#include "gmlp-grouped-tensor-private.h"
#include "gmlp-numeric.h"
#include "gmlp-thread-private.h"

/* What every collective checks first: the communicator, and that each
 * tensor is usable and on its device. */
static gboolean
check_call (GmlpCommunicator   *self,
            const char         *what,
            GmlpGroupedTensor  *a,
            GmlpGroupedTensor  *b,
            GError            **error)
{
  GmlpGroupedTensor *tensors[2] = { a, b };
  guint i;

  if (!gmlp_check_constructed (self, self->construct_error, error))
    return FALSE;
  for (i = 0; i < G_N_ELEMENTS (tensors); i++)
    {
      GmlpDevice *device;

      if (tensors[i] == NULL)
        continue;
      if (!gmlp_grouped_tensor_check_usable (tensors[i], error))
        return FALSE;
      device = gmlp_grouped_tensor_get_device (tensors[i]);
      if (device != self->device)
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                       "%s: a tensor is on %s, the communicator's rank on %s",
                       what, gmlp_device_get_name (device), gmlp_device_get_name (self->device));
          return FALSE;
        }
    }
  if (a != NULL && b != NULL)
    {
      if (gmlp_grouped_tensor_get_dtype (a) != gmlp_grouped_tensor_get_dtype (b))
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_DTYPE_MISMATCH,
                       "%s: send is %s, recv %s", what,
                       gmlp_dtype_get_name (gmlp_grouped_tensor_get_dtype (a)),
                       gmlp_dtype_get_name (gmlp_grouped_tensor_get_dtype (b)));
          return FALSE;
        }
      if (gmlp_grouped_tensor_get_cols (a) != gmlp_grouped_tensor_get_cols (b))
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
                       "%s: send has %" G_GINT64_FORMAT " columns, recv %" G_GINT64_FORMAT,
                       what, gmlp_grouped_tensor_get_cols (a), gmlp_grouped_tensor_get_cols (b));
          return FALSE;
        }
      if (gmlp_grouped_tensor_overlaps (a, b))
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                       "%s: send and recv share memory", what);
          return FALSE;
        }
    }
  return TRUE;
}

static gboolean
check_host_sizes (GmlpGroupedTensor  *tensor,
                  const char         *what,
                  const char         *name,
                  GError            **error)
{
  if (gmlp_grouped_tensor_has_host_sizes (tensor))
    return TRUE;
  g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
               "%s: %s needs its group sizes on the host (its members' bytes are "
               "worked out there)", what, name);
  return FALSE;
}

/**
 * gmlp_communicator_all_reduce:
 * @self: a #GmlpCommunicator
 * @tensor: the tensor to reduce, in place
 * @op: the sum or the average
 * @error: return location for a #GError
 *
 * Replaces @tensor, on every rank, by the sum or the average over the ranks
 * of their @tensor: every element of its storage (padding between members
 * too, and with device sizes the whole capacity). Every rank passes a
 * tensor of the same dtype and storage size; every rank gets the same
 * values. For data-parallel gradients: it may be called from a
 * [signal@Gmlp.GroupedLinear::wgrad-ready] handler, after the device's
 * stream waits for the signal's event.
 *
 * Returns: %TRUE once enqueued; %FALSE with %GMLP_ERROR_INVALID_ARGUMENT
 *   (another device, an unknown @op), %GMLP_ERROR_UNSUPPORTED (a dtype other
 *   than float32, float16, bfloat16, or int32 and int64 with the sum),
 *   %GMLP_ERROR_SHAPE_MISMATCH (the CPU communicator: ranks whose tensors
 *   differ) or %GMLP_ERROR_ABORTED
 *
 * Since: 0.1
 */
gboolean
gmlp_communicator_all_reduce (GmlpCommunicator   *self,
                              GmlpGroupedTensor  *tensor,
                              GmlpReduceOp        op,
                              GError            **error)
{
  const char *what = "all_reduce";
  g_autoptr(GmlpMutexLocker) locker = NULL;
  GmlpDType dtype;
  gboolean is_float;

  g_return_val_if_fail (GMLP_IS_COMMUNICATOR (self), FALSE);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (tensor), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!check_call (self, what, tensor, NULL, error))
    return FALSE;
  if (op != GMLP_REDUCE_OP_SUM && op != GMLP_REDUCE_OP_AVERAGE)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT, "%s: unknown op %d", what, (int) op);
      return FALSE;
    }
  dtype = gmlp_grouped_tensor_get_dtype (tensor);
  is_float = dtype == GMLP_DTYPE_FLOAT32 || dtype == GMLP_DTYPE_FLOAT16 || dtype == GMLP_DTYPE_BFLOAT16;
  if (!is_float && !((dtype == GMLP_DTYPE_INT32 || dtype == GMLP_DTYPE_INT64) && op == GMLP_REDUCE_OP_SUM))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "%s reduces float32, float16 and bfloat16, and sums int32 and int64; "
                   "not %s%s", what, gmlp_dtype_get_name (dtype),
                   is_float || dtype == GMLP_DTYPE_INT32 || dtype == GMLP_DTYPE_INT64 ? " averages" : "");
      return FALSE;
    }

  locker = gmlp_mutex_locker_new (&self->call_lock);
  if (!gmlp_communicator_join_locked (self, error))
    return FALSE;
  gmlp_grouped_tensor_bump_version (tensor);
  return gmlp_device_get_backend (self->device)->comm_all_reduce (
           self->comm, gmlp_grouped_tensor_get_data (tensor),
           gmlp_grouped_tensor_get_nbytes (tensor) / gmlp_dtype_get_size (dtype),
           (int) dtype, (int) op, error);
}

/**
 * gmlp_communicator_all_gather:
 * @self: a #GmlpCommunicator
 * @send: this rank's part
 * @recv: where every rank's part arrives
 * @error: return location for a #GError
 *
 * Gathers every rank's @send into @recv on every rank: @send has N groups
 * of the same sizes on every rank, and @recv world size × N groups of the
 * same dtype and columns, member r × N + i the shape of @send's member i
 * (rank r's member i arrives there). Both need their group sizes on the
 * host. Only the data moves: an FP8 tensor's scales are a tensor of their
 * own, gathered the same way.
 *
 * Returns: %TRUE once enqueued; %FALSE with %GMLP_ERROR_INVALID_ARGUMENT
 *   (another device, device sizes, @send and @recv sharing memory),
 *   %GMLP_ERROR_DTYPE_MISMATCH, %GMLP_ERROR_SHAPE_MISMATCH (on this rank, or
 *   on the CPU communicator between ranks) or %GMLP_ERROR_ABORTED
 *
 * Since: 0.1
 */
gboolean
gmlp_communicator_all_gather (GmlpCommunicator   *self,
                              GmlpGroupedTensor  *send,
                              GmlpGroupedTensor  *recv,
                              GError            **error)
{
  const char *what = "all_gather";
  g_autoptr(GmlpMutexLocker) locker = NULL;
  const gint64 *send_rows, *recv_rows;
  guint n, r, i;

  g_return_val_if_fail (GMLP_IS_COMMUNICATOR (self), FALSE);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (send), FALSE);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (recv), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!check_call (self, what, send, recv, error) ||
      !check_host_sizes (send, what, "send", error) ||
      !check_host_sizes (recv, what, "recv", error))
    return FALSE;

  n = gmlp_grouped_tensor_get_n_groups (send);
  if ((guint64) gmlp_grouped_tensor_get_n_groups (recv) != (guint64) n * self->world_size)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
                   "%s: recv has %u groups; %d ranks × %u groups of send are %" G_GUINT64_FORMAT,
                   what, gmlp_grouped_tensor_get_n_groups (recv), self->world_size, n,
                   (guint64) n * self->world_size);
      return FALSE;
    }
  send_rows = gmlp_grouped_tensor_peek_rows (send);
  recv_rows = gmlp_grouped_tensor_peek_rows (recv);
  for (r = 0; r < (guint) self->world_size; r++)
    for (i = 0; i < n; i++)
      if (recv_rows[r * n + i] != send_rows[i])
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
                       "%s: recv's group %u has %" G_GINT64_FORMAT " rows, send's group %u %"
                       G_GINT64_FORMAT, what, r * n + i, recv_rows[r * n + i], i, send_rows[i]);
          return FALSE;
        }

  locker = gmlp_mutex_locker_new (&self->call_lock);
  if (!gmlp_communicator_join_locked (self, error))
    return FALSE;
  gmlp_grouped_tensor_bump_version (recv);
  return gmlp_device_get_backend (self->device)->comm_all_gather (
           self->comm, gmlp_grouped_tensor_get_data (send), gmlp_grouped_tensor_get_data (recv),
           gmlp_grouped_tensor_get_nbytes (send), error);
}

/* Each peer's block of n / world members of a host-sized tensor: where it
 * starts and how many bytes it spans (member padding included). */
static void
member_blocks (GmlpGroupedTensor *tensor,
               int                world_size,
               gsize             *offsets,
               gsize             *bytes)
{
  const gint64 *rows = gmlp_grouped_tensor_peek_rows (tensor);
  guint k = gmlp_grouped_tensor_get_n_groups (tensor) / world_size;
  guint64 row_bytes = (guint64) gmlp_grouped_tensor_get_cols (tensor) *
                      gmlp_dtype_get_size (gmlp_grouped_tensor_get_dtype (tensor));
  gsize at = 0;
  int p;
  guint i;

  /* The layout was checked when the tensor was made: no sum overflows. */
  for (p = 0; p < world_size; p++)
    {
      offsets[p] = at;
      for (i = 0; i < k; i++)
        at += gmlp_num_member_stride (rows[p * k + i], row_bytes);
      bytes[p] = at - offsets[p];
    }
}

/* @done NULL: the compute stream waits for the all-to-all. Else *@done:
 * an event that completes with it, which keeps @send and @recv (their
 * memory stays theirs while the rows are in flight). */
static gboolean
enqueue_all_to_all (GmlpCommunicator   *self,
                    GmlpGroupedTensor  *send,
                    const gsize        *send_offsets,
                    const gsize        *send_bytes,
                    GmlpGroupedTensor  *recv,
                    const gsize        *recv_offsets,
                    const gsize        *recv_bytes,
                    GmlpEvent         **done,
                    GError            **error)
{
  g_autoptr(GmlpMutexLocker) locker = gmlp_mutex_locker_new (&self->call_lock);
  GmlpBackendEvent *event = NULL;
  GmlpEvent *result;

  if (!gmlp_communicator_join_locked (self, error))
    return FALSE;
  gmlp_grouped_tensor_bump_version (recv);
  if (!gmlp_device_get_backend (self->device)->comm_all_to_all (
         self->comm, gmlp_grouped_tensor_get_data (send), send_offsets, send_bytes,
         gmlp_grouped_tensor_get_data (recv), recv_offsets, recv_bytes,
         done != NULL ? &event : NULL, error))
    return FALSE;
  if (done == NULL)
    return TRUE;
  /* Without a backend event the rows have arrived already (the CPU): an
   * event of no device, complete. */
  result = event != NULL ? gmlp_event_new_for_backend (self->device, event)
                         : g_object_new (GMLP_TYPE_EVENT, NULL);
  gmlp_communicator_event_hold (result, send, recv);
  *done = result;
  return TRUE;
}

gboolean
gmlp_communicator_all_to_all_spans_full (GmlpCommunicator   *self,
                                         GmlpGroupedTensor  *send,
                                         const gsize        *send_offsets,
                                         const gsize        *send_bytes,
                                         GmlpGroupedTensor  *recv,
                                         const gsize        *recv_offsets,
                                         const gsize        *recv_bytes,
                                         GmlpEvent         **done,
                                         GError            **error)
{
  GmlpGroupedTensor *tensors[2] = { send, recv };
  const gsize *offsets[2] = { send_offsets, recv_offsets }, *bytes[2] = { send_bytes, recv_bytes };
  guint i;
  int p;

  if (!check_call (self, "all_to_all (spans)", send, recv, error))
    return FALSE;
  for (i = 0; i < 2; i++)
    for (p = 0; p < self->world_size; p++)
      {
        gsize size = gmlp_grouped_tensor_get_nbytes (tensors[i]);

        if (offsets[i][p] > size || bytes[i][p] > size - offsets[i][p])
          {
            g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
                         "all_to_all (spans): %s's span for rank %d, %" G_GSIZE_FORMAT " bytes at %"
                         G_GSIZE_FORMAT ", is past its %" G_GSIZE_FORMAT " bytes",
                         i == 0 ? "send" : "recv", p, bytes[i][p], offsets[i][p], size);
            return FALSE;
          }
      }
  return enqueue_all_to_all (self, send, send_offsets, send_bytes, recv, recv_offsets, recv_bytes,
                             done, error);
}

/**
 * gmlp_communicator_all_to_all:
 * @self: a #GmlpCommunicator
 * @send: what this rank sends, a block of groups per peer
 * @recv: what this rank receives, a block of groups per peer
 * @error: return location for a #GError
 *
 * Exchanges blocks of members between every pair of ranks: the groups of
 * @send and of @recv, whose counts are multiples of the world size W, are
 * taken as W blocks of consecutive members, one per peer, and block p of
 * @send goes to rank p, where it arrives as block r (r: this rank) of its
 * @recv. Each member arrives whole, as the member of the same place in its
 * block; so block p of this rank's @send must hold as many members, of the
 * same rows, as block r of rank p's @recv. With members of equal shape
 * this is the all-to-all of equal splits; with the experts of the ranks as
 * groups and the sizes read back on the host it is the dispatch (and,
 * send and recv swapped, the combine) of an expert-parallel layer. Both
 * tensors need their sizes on the host, the same dtype and columns.
 *
 * Returns: %TRUE once enqueued; %FALSE with %GMLP_ERROR_INVALID_ARGUMENT
 *   (another device, device sizes, @send and @recv sharing memory),
 *   %GMLP_ERROR_DTYPE_MISMATCH, %GMLP_ERROR_SHAPE_MISMATCH (group counts
 *   that are not multiples of the world size, columns; on the CPU
 *   communicator, blocks of the ranks that do not pair up) or
 *   %GMLP_ERROR_ABORTED
 *
 * Since: 0.1
 */
gboolean
gmlp_communicator_all_to_all (GmlpCommunicator   *self,
                              GmlpGroupedTensor  *send,
                              GmlpGroupedTensor  *recv,
                              GError            **error)
{
  g_return_val_if_fail (GMLP_IS_COMMUNICATOR (self), FALSE);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (send), FALSE);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (recv), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  return gmlp_communicator_all_to_all_full (self, send, recv, NULL, error);
}

/**
 * gmlp_communicator_all_to_all_start:
 * @self: a #GmlpCommunicator
 * @send: what this rank sends, a block of groups per peer
 * @recv: what this rank receives, a block of groups per peer
 * @error: return location for a #GError
 *
 * [method@Gmlp.Communicator.all_to_all] whose end the caller waits for:
 * the all-to-all starts, as every collective, after the work enqueued on
 * the device's stream before the call, but that stream does not wait for
 * it, so that the work the caller enqueues next (a shared expert, another
 * micro-batch) overlaps the rows in flight. Make the device's stream wait
 * for the returned event ([method@Gmlp.Event.wait_on_device]) before any
 * work that reads @recv or writes @send or @recv; the event keeps both
 * tensors until it goes. On a GPU the all-to-all runs on the
 * communicator's communication stream; on the CPU it is done when the call
 * returns, and the event is complete. During a graph capture the event
 * must be waited on by the capturing device before the capture ends (the
 * wait is the graph's join).
 *
 * Returns: (transfer full): an event that completes with the all-to-all,
 *   or %NULL with the errors of [method@Gmlp.Communicator.all_to_all]
 *
 * Since: 0.1
 */
GmlpEvent *
gmlp_communicator_all_to_all_start (GmlpCommunicator   *self,
                                    GmlpGroupedTensor  *send,
                                    GmlpGroupedTensor  *recv,
                                    GError            **error)
{
  GmlpEvent *done = NULL;

  g_return_val_if_fail (GMLP_IS_COMMUNICATOR (self), NULL);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (send), NULL);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (recv), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!gmlp_communicator_all_to_all_full (self, send, recv, &done, error))
    return NULL;
  return done;
}

gboolean
gmlp_communicator_all_to_all_full (GmlpCommunicator   *self,
                                   GmlpGroupedTensor  *send,
                                   GmlpGroupedTensor  *recv,
                                   GmlpEvent         **done,
                                   GError            **error)
{
  const char *what = "all_to_all";
  g_autofree gsize *counts = NULL;
  GmlpGroupedTensor *tensors[2] = { send, recv };
  guint i, w;

  if (!check_call (self, what, send, recv, error) ||
      !check_host_sizes (send, what, "send", error) ||
      !check_host_sizes (recv, what, "recv", error))
    return FALSE;
  w = (guint) self->world_size;
  for (i = 0; i < 2; i++)
    if (gmlp_grouped_tensor_get_n_groups (tensors[i]) % w != 0)
      {
        g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
                     "%s: %s has %u groups, not a multiple of the %u ranks", what,
                     i == 0 ? "send" : "recv", gmlp_grouped_tensor_get_n_groups (tensors[i]), w);
        return FALSE;
      }

  counts = g_new (gsize, 4 * w);
  member_blocks (send, w, counts, counts + w);
  member_blocks (recv, w, counts + 2 * w, counts + 3 * w);
  return enqueue_all_to_all (self, send, counts, counts + w, recv, counts + 2 * w, counts + 3 * w,
                             done, error);
}

/* The rows of a tensor taken as one matrix: where they may go. */
static gboolean
check_row_matrix (GmlpGroupedTensor  *tensor,
                  const char         *name,
                  const gint64       *rows,
                  guint               n_rows,
                  int                 world_size,
                  gsize              *offsets,
                  gsize              *bytes,
                  GError            **error)
{
  guint64 row_bytes = (guint64) gmlp_grouped_tensor_get_cols (tensor) *
                      gmlp_dtype_get_size (gmlp_grouped_tensor_get_dtype (tensor));
  gint64 limit = gmlp_grouped_tensor_has_host_sizes (tensor) ?
                 gmlp_grouped_tensor_get_total_rows (tensor) :
                 gmlp_grouped_tensor_get_row_capacity (tensor);
  gint64 total = 0;
  guint p;

  if (n_rows != (guint) world_size)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "all_to_all_rows: %u %s row counts for %d ranks", n_rows, name, world_size);
      return FALSE;
    }
  if (gmlp_grouped_tensor_get_n_groups (tensor) > 1 && row_bytes % GMLP_MEMBER_ALIGNMENT != 0)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "all_to_all_rows: the rows of %s are not one matrix (its %u members "
                   "are padded apart); use one group, or all_to_all by members", name,
                   gmlp_grouped_tensor_get_n_groups (tensor));
      return FALSE;
    }
  for (p = 0; p < n_rows; p++)
    {
      if (rows[p] < 0 || rows[p] > limit - total)
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
                       "all_to_all_rows: %s row count %u is %" G_GINT64_FORMAT ", where %"
                       G_GINT64_FORMAT " of the %" G_GINT64_FORMAT " rows are left",
                       name, p, rows[p], limit - total, limit);
          return FALSE;
        }
      offsets[p] = (gsize) total * row_bytes;
      bytes[p] = (gsize) rows[p] * row_bytes;
      total += rows[p];
    }
  return TRUE;
}

/**
 * gmlp_communicator_all_to_all_rows:
 * @self: a #GmlpCommunicator
 * @send: the rows this rank sends, as one matrix
 * @send_rows: (array length=n_send_rows): how many rows go to each rank
 * @n_send_rows: the world size
 * @recv: where the rows from the ranks arrive, as one matrix
 * @recv_rows: (array length=n_recv_rows): how many rows come from each rank
 * @n_recv_rows: the world size
 * @error: return location for a #GError
 *
 * All-to-all with per-peer row counts given on the host (as
 * torch.distributed's `all_to_all_single` with splits): the first
 * @send_rows[0] rows of @send go to rank 0, the next @send_rows[1] to rank
 * 1, and so on; the rows from rank p arrive in @recv after those of the
 * ranks before p, @recv_rows[p] of them. Rank q's @send_rows[p] must equal
 * rank p's @recv_rows[q]. Each tensor is taken as one matrix of rows: one
 * group, or members with no padding between them (rows of a multiple of 256
 * bytes), with its sizes on the host or on the device (then the capacity
 * bounds the rows); the counts must fit in it. Rows of @recv past the counts
 * are left as they are.
 *
 * Returns: %TRUE once enqueued; %FALSE with %GMLP_ERROR_INVALID_ARGUMENT
 *   (another device, a count per rank missing, a tensor whose members are
 *   padded apart, @send and @recv sharing memory),
 *   %GMLP_ERROR_DTYPE_MISMATCH, %GMLP_ERROR_SHAPE_MISMATCH (columns, counts
 *   past the rows; on the CPU communicator, counts of the ranks that do not
 *   pair up) or %GMLP_ERROR_ABORTED
 *
 * Since: 0.1
 */
gboolean
gmlp_communicator_all_to_all_rows (GmlpCommunicator   *self,
                                   GmlpGroupedTensor  *send,
                                   const gint64       *send_rows,
                                   guint               n_send_rows,
                                   GmlpGroupedTensor  *recv,
                                   const gint64       *recv_rows,
                                   guint               n_recv_rows,
                                   GError            **error)
{
  g_return_val_if_fail (GMLP_IS_COMMUNICATOR (self), FALSE);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (send), FALSE);
  g_return_val_if_fail (send_rows != NULL || n_send_rows == 0, FALSE);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (recv), FALSE);
  g_return_val_if_fail (recv_rows != NULL || n_recv_rows == 0, FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  return gmlp_communicator_all_to_all_rows_full (self, send, send_rows, n_send_rows, recv,
                                                 recv_rows, n_recv_rows, NULL, error);
}

/**
 * gmlp_communicator_all_to_all_rows_start:
 * @self: a #GmlpCommunicator
 * @send: the rows this rank sends, as one matrix
 * @send_rows: (array length=n_send_rows): how many rows go to each rank
 * @n_send_rows: the world size
 * @recv: where the rows from the ranks arrive, as one matrix
 * @recv_rows: (array length=n_recv_rows): how many rows come from each rank
 * @n_recv_rows: the world size
 * @error: return location for a #GError
 *
 * [method@Gmlp.Communicator.all_to_all_rows] whose end the caller waits
 * for, as [method@Gmlp.Communicator.all_to_all_start] says: the device's
 * stream does not wait for it; make it wait for the returned event before
 * any work that reads @recv or writes @send or @recv.
 *
 * Returns: (transfer full): an event that completes with the all-to-all,
 *   or %NULL with the errors of [method@Gmlp.Communicator.all_to_all_rows]
 *
 * Since: 0.1
 */
GmlpEvent *
gmlp_communicator_all_to_all_rows_start (GmlpCommunicator   *self,
                                         GmlpGroupedTensor  *send,
                                         const gint64       *send_rows,
                                         guint               n_send_rows,
                                         GmlpGroupedTensor  *recv,
                                         const gint64       *recv_rows,
                                         guint               n_recv_rows,
                                         GError            **error)
{
  GmlpEvent *done = NULL;

  g_return_val_if_fail (GMLP_IS_COMMUNICATOR (self), NULL);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (send), NULL);
  g_return_val_if_fail (send_rows != NULL || n_send_rows == 0, NULL);
  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (recv), NULL);
  g_return_val_if_fail (recv_rows != NULL || n_recv_rows == 0, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!gmlp_communicator_all_to_all_rows_full (self, send, send_rows, n_send_rows, recv,
                                               recv_rows, n_recv_rows, &done, error))
    return NULL;
  return done;
}

gboolean
gmlp_communicator_all_to_all_rows_full (GmlpCommunicator   *self,
                                        GmlpGroupedTensor  *send,
                                        const gint64       *send_rows,
                                        guint               n_send_rows,
                                        GmlpGroupedTensor  *recv,
                                        const gint64       *recv_rows,
                                        guint               n_recv_rows,
                                        GmlpEvent         **done,
                                        GError            **error)
{
  g_autofree gsize *counts = NULL;
  guint w;

  if (!check_call (self, "all_to_all_rows", send, recv, error))
    return FALSE;
  w = (guint) self->world_size;
  counts = g_new (gsize, 4 * w);
  if (!check_row_matrix (send, "send", send_rows, n_send_rows, w, counts, counts + w, error) ||
      !check_row_matrix (recv, "recv", recv_rows, n_recv_rows, w, counts + 2 * w, counts + 3 * w,
                         error))
    return FALSE;
  return enqueue_all_to_all (self, send, counts, counts + w, recv, counts + 2 * w, counts + 3 * w,
                             done, error);
}
