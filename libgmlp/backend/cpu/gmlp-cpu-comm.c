/* gmlp-cpu-comm.c: the CPU backend's communicator, in-process
 *
 * The ranks are threads of one process (each normally with a CPU device of
 * its own, cpu:0, cpu:1, ...). They meet at a rendezvous named by the
 * unique id, which the first rank to join creates and the last to leave
 * frees. Joining is a barrier (comm_join, after comm_init has taken the
 * rank); every collective is two: at the first each
 * rank has posted its buffers and counts, which every rank then checks
 * against the others' (so all of them agree on an error); between the two
 * each rank reads its peers' inputs and writes its own output; after the
 * second no one reads a peer's buffer any more. A rank that does not reach a
 * barrier within the timeout, comm_abort on any rank, or a rank leaving fails
 * the rendezvous for good: every waiting and every later call then returns
 * GMLP_ERROR_ABORTED with the reason, as an NCCL communicator must be
 * aborted after an error.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <string.h>

#include "backend/cpu/gmlp-cpu-comm.h"
#include "gmlp-error.h"
#include "gmlp-numeric.h"
#include "gmlp-thread-private.h"

typedef enum {
  CPU_COLL_ALL_REDUCE,
  CPU_COLL_ALL_GATHER,
  CPU_COLL_ALL_TO_ALL,
} CpuCollKind;

static const char * const coll_names[] = { "all_reduce", "all_gather", "all_to_all" };

/* What a rank posts for a collective; every pointer stays valid until the
 * rank has passed the collective's second barrier. */
typedef struct {
  CpuCollKind   kind;
  gconstpointer send;
  gpointer      recv;
  gsize         count;     /* all_reduce: elements; all_gather: bytes */
  int           dtype;
  int           op;
  const gsize  *send_offsets, *send_bytes, *recv_offsets, *recv_bytes;
} CpuCollSlot;

typedef struct {
  GBytes       *id;
  int           world_size;
  int           refs;        /* under registry_lock */

  GMutex        lock;
  GCond         cond;
  guint64       generation;  /* barriers completed */
  int           arrived;     /* at the barrier in progress */
  gboolean     *here;        /* world_size: who is at it */
  gboolean     *joined;      /* world_size */
  CpuCollSlot  *slots;       /* world_size */
  char         *failure;     /* why the group failed, or NULL */
} CpuRendezvous;

struct _GmlpBackendComm
{
  CpuRendezvous *rv;
  int            rank;
  guint          timeout_ms;
  guint64        n_calls;
};

static GMutex registry_lock;
static GHashTable *registry;   /* GBytes id -> CpuRendezvous */

/* A fresh id: GMLP_BACKEND_COMM_ID_BYTES random bytes, so that two groups
 * made in one process never meet. */
gboolean
gmlp_cpu_comm_unique_id (GmlpBackendDevice  *device,
                         guint8             *id,
                         GError            **error)
{
  guint i;

  for (i = 0; i < GMLP_BACKEND_COMM_ID_BYTES; i += 4)
    {
      guint32 r = g_random_int ();
      memcpy (id + i, &r, 4);
    }
  return TRUE;
}

static CpuRendezvous *
rendezvous_get (const guint8 *id,
                int           world_size)
{
  g_autoptr(GBytes) key = g_bytes_new (id, GMLP_BACKEND_COMM_ID_BYTES);
  CpuRendezvous *rv;

  gmlp_mutex_lock (&registry_lock);
  if (registry == NULL)
    registry = g_hash_table_new (g_bytes_hash, g_bytes_equal);
  rv = g_hash_table_lookup (registry, key);
  if (rv == NULL)
    {
      rv = g_new0 (CpuRendezvous, 1);
      rv->id = g_bytes_ref (key);
      rv->world_size = world_size;
      g_mutex_init (&rv->lock);
      g_cond_init (&rv->cond);
      rv->here = g_new0 (gboolean, world_size);
      rv->joined = g_new0 (gboolean, world_size);
      rv->slots = g_new0 (CpuCollSlot, world_size);
      g_hash_table_insert (registry, rv->id, rv);
    }
  rv->refs++;
  gmlp_mutex_unlock (&registry_lock);
  return rv;
}

static void
rendezvous_release (CpuRendezvous *rv)
{
  gboolean last;

  gmlp_mutex_lock (&registry_lock);
  last = --rv->refs == 0;
  if (last)
    g_hash_table_remove (registry, rv->id);
  gmlp_mutex_unlock (&registry_lock);
  if (!last)
    return;

  g_bytes_unref (rv->id);
  g_mutex_clear (&rv->lock);
  g_cond_clear (&rv->cond);
  g_free (rv->here);
  g_free (rv->joined);
  g_free (rv->slots);
  g_free (rv->failure);
  g_free (rv);
}

/* Fails the group (the lock held); the first reason stays. */
static void
rendezvous_fail (CpuRendezvous *rv,
                 char          *reason)
{
  if (rv->failure == NULL)
    rv->failure = reason;
  else
    g_free (reason);
  g_cond_broadcast (&rv->cond);
}

static gboolean
set_failed (CpuRendezvous  *rv,
            GError        **error)
{
  g_set_error (error, GMLP_ERROR, GMLP_ERROR_ABORTED,
               "The communicator's group has failed: %s", rv->failure);
  return FALSE;
}

/* Waits until every rank has reached this barrier (the lock held), at most
 * timeout_ms; what names the barrier in the failure. */
static gboolean
rendezvous_barrier (CpuRendezvous  *rv,
                    int             rank,
                    guint           timeout_ms,
                    const char     *what,
                    GError        **error)
{
  gint64 deadline = g_get_monotonic_time () + (gint64) timeout_ms * G_TIME_SPAN_MILLISECOND;
  guint64 generation = rv->generation;

  if (rv->failure != NULL)
    return set_failed (rv, error);

  rv->here[rank] = TRUE;
  if (++rv->arrived == rv->world_size)
    {
      rv->arrived = 0;
      memset (rv->here, 0, sizeof (gboolean) * rv->world_size);
      rv->generation++;
      g_cond_broadcast (&rv->cond);
      return TRUE;
    }

  while (rv->generation == generation && rv->failure == NULL)
    {
      gboolean woken;

      /* The wait lets go of the lock and takes it back, inside GLib where
       * ThreadSanitizer does not see it (gmlp-thread-private.h). */
      gmlp_tsan_release (&rv->lock);
      woken = g_cond_wait_until (&rv->cond, &rv->lock, deadline);
      gmlp_tsan_acquire (&rv->lock);
      if (!woken && rv->generation == generation && rv->failure == NULL)
        {
          GString *missing = g_string_new (NULL);
          int r, n_missing = 0;

          for (r = 0; r < rv->world_size; r++)
            if (!rv->here[r])
              g_string_append_printf (missing, "%s%d", n_missing++ ? ", " : "", r);
          rendezvous_fail (rv, g_strdup_printf ("rank %d waited %u ms at %s for %s %s",
                                                rank, timeout_ms, what,
                                                n_missing > 1 ? "ranks" : "rank", missing->str));
          g_string_free (missing, TRUE);
        }
    }

  /* A barrier that completed stands, whatever happened since. */
  if (rv->generation != generation)
    return TRUE;
  return set_failed (rv, error);
}

GmlpBackendComm *
gmlp_cpu_comm_init (GmlpBackendDevice  *device,
                    const guint8       *id,
                    int                 rank,
                    int                 world_size,
                    guint               timeout_ms,
                    GError            **error)
{
  CpuRendezvous *rv = rendezvous_get (id, world_size);
  GmlpBackendComm *comm;
  gboolean ok;

  gmlp_mutex_lock (&rv->lock);
  if (rv->world_size != world_size)
    {
      /* The group can never be complete: fail it for the others too. */
      rendezvous_fail (rv, g_strdup_printf ("rank %d joined a group of %d ranks "
                                            "as one of %d", rank, rv->world_size, world_size));
      ok = set_failed (rv, error);
    }
  else if (rv->joined[rank])
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "Rank %d of this unique id has joined already: each rank joins once", rank);
      ok = FALSE;
    }
  else if (rv->failure != NULL)
    {
      ok = set_failed (rv, error);
    }
  else
    {
      rv->joined[rank] = TRUE;
      ok = TRUE;
    }
  gmlp_mutex_unlock (&rv->lock);

  if (!ok)
    {
      rendezvous_release (rv);
      return NULL;
    }

  comm = g_new0 (GmlpBackendComm, 1);
  comm->rv = rv;
  comm->rank = rank;
  comm->timeout_ms = timeout_ms;
  return comm;
}

gboolean
gmlp_cpu_comm_join (GmlpBackendComm  *comm,
                    GError          **error)
{
  CpuRendezvous *rv = comm->rv;
  gboolean ok;

  gmlp_mutex_lock (&rv->lock);
  ok = rendezvous_barrier (rv, comm->rank, comm->timeout_ms, "joining the group", error);
  gmlp_mutex_unlock (&rv->lock);
  return ok;
}

void
gmlp_cpu_comm_abort (GmlpBackendComm *comm)
{
  CpuRendezvous *rv = comm->rv;

  gmlp_mutex_lock (&rv->lock);
  rendezvous_fail (rv, g_strdup_printf ("rank %d aborted it", comm->rank));
  gmlp_mutex_unlock (&rv->lock);
}

void
gmlp_cpu_comm_free (GmlpBackendComm *comm)
{
  CpuRendezvous *rv = comm->rv;

  /* The others' later collectives need this rank: they fail at once. Its
   * past ones are complete (each ends on a barrier), so nothing of it is
   * read any more. */
  gmlp_mutex_lock (&rv->lock);
  rendezvous_fail (rv, g_strdup_printf ("rank %d left it", comm->rank));
  gmlp_mutex_unlock (&rv->lock);
  rendezvous_release (rv);
  g_free (comm);
}

/* The posted slots agree (the same checks on every rank, so every rank
 * gives the same answer). */
static gboolean
slots_agree (CpuRendezvous  *rv,
             GError        **error)
{
  const CpuCollSlot *s0 = &rv->slots[0];
  int p, q;

  for (p = 1; p < rv->world_size; p++)
    {
      const CpuCollSlot *s = &rv->slots[p];

      if (s->kind != s0->kind)
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE,
                       "The ranks called different collectives: rank 0 %s, rank %d %s",
                       coll_names[s0->kind], p, coll_names[s->kind]);
          return FALSE;
        }
      if (s->kind != CPU_COLL_ALL_TO_ALL &&
          (s->count != s0->count || s->dtype != s0->dtype || s->op != s0->op))
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
                       "The ranks' %s disagree: rank 0 gave %" G_GSIZE_FORMAT " %s of dtype %d "
                       "(op %d), rank %d %" G_GSIZE_FORMAT " of dtype %d (op %d)",
                       coll_names[s0->kind], s0->count,
                       s0->kind == CPU_COLL_ALL_REDUCE ? "elements" : "bytes",
                       s0->dtype, s0->op, p, s->count, s->dtype, s->op);
          return FALSE;
        }
    }

  if (s0->kind == CPU_COLL_ALL_TO_ALL)
    for (p = 0; p < rv->world_size; p++)
      for (q = 0; q < rv->world_size; q++)
        if (rv->slots[p].send_bytes[q] != rv->slots[q].recv_bytes[p])
          {
            g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
                         "all_to_all: rank %d sends %" G_GSIZE_FORMAT " bytes to rank %d, "
                         "which expects %" G_GSIZE_FORMAT, p, rv->slots[p].send_bytes[q], q,
                         rv->slots[q].recv_bytes[p]);
            return FALSE;
          }
  return TRUE;
}

/* The sum (or average) of every rank's data, in rank order, in double (or
 * 64-bit integers), rounded once: the same bits on every rank. */
static void
reduce_into (CpuRendezvous *rv,
             gpointer       out)
{
  const CpuCollSlot *s0 = &rv->slots[0];
  gsize i;
  int p;

  for (i = 0; i < s0->count; i++)
    {
      if (s0->dtype == GMLP_NUM_INT64 || s0->dtype == GMLP_NUM_INT32)
        {
          guint64 acc = 0;   /* wraps as two's complement, as NCCL's does */

          for (p = 0; p < rv->world_size; p++)
            acc += s0->dtype == GMLP_NUM_INT64 ? (guint64) ((const gint64 *) rv->slots[p].send)[i]
                                               : (guint64) (gint64) ((const gint32 *) rv->slots[p].send)[i];
          if (s0->dtype == GMLP_NUM_INT64)
            ((gint64 *) out)[i] = (gint64) acc;
          else
            ((gint32 *) out)[i] = (gint32) (guint32) acc;
        }
      else
        {
          double acc = 0;

          for (p = 0; p < rv->world_size; p++)
            acc += gmlp_num_load_float (rv->slots[p].send, s0->dtype, i);
          if (s0->op == GMLP_COMM_AVERAGE)
            acc /= rv->world_size;
          gmlp_num_store_float (out, s0->dtype, i, (float) acc);
        }
    }
}

static void
run_collective (CpuRendezvous *rv,
                int            rank,
                gpointer       scratch)
{
  const CpuCollSlot *mine = &rv->slots[rank];
  int p;

  switch (mine->kind)
    {
    case CPU_COLL_ALL_REDUCE:
      reduce_into (rv, scratch);
      break;
    case CPU_COLL_ALL_GATHER:
      for (p = 0; p < rv->world_size; p++)
        if (mine->count > 0)
          memcpy ((guint8 *) mine->recv + p * mine->count, rv->slots[p].send, mine->count);
      break;
    case CPU_COLL_ALL_TO_ALL:
      for (p = 0; p < rv->world_size; p++)
        {
          const CpuCollSlot *peer = &rv->slots[p];

          if (mine->recv_bytes[p] > 0)
            memcpy ((guint8 *) mine->recv + mine->recv_offsets[p],
                    (const guint8 *) peer->send + peer->send_offsets[rank], mine->recv_bytes[p]);
        }
      break;
    default:
      g_assert_not_reached ();
    }
}

static gboolean
collective (GmlpBackendComm    *comm,
            const CpuCollSlot  *slot,
            GError            **error)
{
  CpuRendezvous *rv = comm->rv;
  g_autofree char *what = NULL, *end = NULL;
  g_autofree guint8 *scratch = NULL;
  GError *mismatch = NULL;
  gboolean ok;

  comm->n_calls++;
  what = g_strdup_printf ("%s (collective %" G_GUINT64_FORMAT ")", coll_names[slot->kind], comm->n_calls);
  end = g_strdup_printf ("the end of %s", what);
  /* All-reduce is in place: the result waits here until no rank reads the
   * inputs any more. */
  if (slot->kind == CPU_COLL_ALL_REDUCE)
    scratch = g_malloc (MAX (slot->count, 1) * gmlp_num_dtype_size (slot->dtype));

  gmlp_mutex_lock (&rv->lock);
  if (rv->failure == NULL)
    rv->slots[comm->rank] = *slot;
  ok = rendezvous_barrier (rv, comm->rank, comm->timeout_ms, what, error);
  gmlp_mutex_unlock (&rv->lock);
  if (!ok)
    return FALSE;

  /* Between the barriers nothing posted changes: no rank posts again
   * before it has passed the second one. */
  if (slots_agree (rv, &mismatch))
    run_collective (rv, comm->rank, scratch);

  gmlp_mutex_lock (&rv->lock);
  ok = rendezvous_barrier (rv, comm->rank, comm->timeout_ms, end, mismatch ? NULL : error);
  gmlp_mutex_unlock (&rv->lock);

  if (mismatch != NULL)
    {
      g_propagate_error (error, mismatch);
      return FALSE;
    }
  if (!ok)
    return FALSE;
  if (slot->kind == CPU_COLL_ALL_REDUCE && slot->count > 0)
    memcpy (slot->recv, scratch, slot->count * gmlp_num_dtype_size (slot->dtype));
  return TRUE;
}

gboolean
gmlp_cpu_comm_all_reduce (GmlpBackendComm  *comm,
                          gpointer          data,
                          gsize             count,
                          int               dtype,
                          int               op,
                          GError          **error)
{
  CpuCollSlot slot = { .kind = CPU_COLL_ALL_REDUCE, .send = data, .recv = data,
                       .count = count, .dtype = dtype, .op = op };

  if (dtype != GMLP_NUM_FLOAT32 && dtype != GMLP_NUM_FLOAT16 && dtype != GMLP_NUM_BFLOAT16 &&
      ((dtype != GMLP_NUM_INT32 && dtype != GMLP_NUM_INT64) || op != GMLP_COMM_SUM))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "all_reduce takes float32, float16 and bfloat16, and int32 and int64 "
                   "for sums, not dtype %d with op %d", dtype, op);
      return FALSE;
    }
  return collective (comm, &slot, error);
}

gboolean
gmlp_cpu_comm_all_gather (GmlpBackendComm  *comm,
                          gconstpointer     send,
                          gpointer          recv,
                          gsize             nbytes,
                          GError          **error)
{
  CpuCollSlot slot = { .kind = CPU_COLL_ALL_GATHER, .send = send, .recv = recv, .count = nbytes };

  return collective (comm, &slot, error);
}

gboolean
gmlp_cpu_comm_all_to_all (GmlpBackendComm  *comm,
                          gconstpointer     send,
                          const gsize      *send_offsets,
                          const gsize      *send_bytes,
                          gpointer          recv,
                          const gsize      *recv_offsets,
                          const gsize      *recv_bytes,
                          GError          **error)
{
  CpuCollSlot slot = { .kind = CPU_COLL_ALL_TO_ALL, .send = send, .recv = recv,
                       .send_offsets = send_offsets, .send_bytes = send_bytes,
                       .recv_offsets = recv_offsets, .recv_bytes = recv_bytes };

  return collective (comm, &slot, error);
}
