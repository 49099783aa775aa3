/* gmlp-cuda-comm.c: communicators of the CUDA backend, on NCCL
 *
 * libnccl.so.2 is opened at run time (dlopen), never linked: the module
 * loads and runs where NCCL is missing, and only a communicator then fails,
 * with UNSUPPORTED naming the library. The few types and entry points used
 * are declared here (their ABI has been stable since NCCL 2.14), so no NCCL
 * header is needed to build.
 *
 * Communicators are made non-blocking (ncclConfig_t.blocking = 0), so that
 * no NCCL call can hold the host: joining and every enqueue are polled with
 * ncclCommGetAsyncError up to the timeout.
 *
 * The collectives run on a stream of the communicator's own (made with it,
 * at the device's highest priority, so that NCCL's kernels get their SMs
 * beside long products), ordered against the device's compute stream by two
 * events re-recorded for every call: fork, recorded on the compute stream
 * and waited on by the communication stream before a collective (it reads
 * what the compute stream wrote), and join, recorded on the communication
 * stream after it and waited on by the compute stream (which reads what it
 * wrote, and may free or reuse its buffers). An all-to-all may hand the
 * join to its caller instead, as an event of its own (done): the compute
 * stream then goes on with other work while the rows are in flight, and
 * waits for done where it needs them. During a graph capture the fork pulls
 * the communication stream into the capture and the join brings it back,
 * so a captured step holds both streams' work with the same edges (every
 * fork must be joined before the capture ends). A watchdog thread per communicator fails the
 * group where the GPU cannot go on: a collective not complete within the
 * timeout (a peer that never came), or an asynchronous NCCL error (a peer
 * that died). Failing is ncclCommAbort(), which also makes the kernels
 * waiting on the peers return, so the stream drains; every later call
 * returns GMLP_ERROR_ABORTED, as the other ranks' watchdogs make theirs.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <dlfcn.h>
#include <limits.h>
#include <string.h>

#include "gmlp-cuda-private.h"
#include "gmlp-numeric.h"
#include "gmlp-thread-private.h"

#define NCCL_LIBRARY "libnccl.so.2"

/* From nccl.h. */
typedef struct ncclComm *ncclComm_t;
typedef struct { char internal[GMLP_BACKEND_COMM_ID_BYTES]; } ncclUniqueId;
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
} ncclResult_t;
typedef enum {
  ncclInt8 = 0, ncclUint8 = 1, ncclInt32 = 2, ncclUint32 = 3, ncclInt64 = 4, ncclUint64 = 5,
  ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9,
} ncclDataType_t;
typedef enum { ncclSum = 0, ncclAvg = 4 } ncclRedOp_t;
/* ncclConfig_t as NCCL 2.14 made it; later versions read older ones by
 * their size and version. */
typedef struct {
  size_t       size;
  unsigned int magic;
  unsigned int version;
  int          blocking;
  int          cgaClusterSize;
  int          minCTAs;
  int          maxCTAs;
  const char  *netName;
} NcclConfig;
#define NCCL_CONFIG_MAGIC 0xcafebeef
#define NCCL_CONFIG_VERSION_2_14 21403

static struct {
  void *handle;
  const char *(*GetErrorString) (ncclResult_t);
  ncclResult_t (*GetUniqueId) (ncclUniqueId *);
  ncclResult_t (*CommInitRankConfig) (ncclComm_t *, int, ncclUniqueId, int, NcclConfig *);
  ncclResult_t (*CommGetAsyncError) (ncclComm_t, ncclResult_t *);
  ncclResult_t (*CommAbort) (ncclComm_t);
  ncclResult_t (*CommDestroy) (ncclComm_t);
  ncclResult_t (*AllReduce) (const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                             cudaStream_t);
  ncclResult_t (*AllGather) (const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*Send) (const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*Recv) (void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*GroupStart) (void);
  ncclResult_t (*GroupEnd) (void);
  char *why;   /* NULL once loaded */
} nccl;

static gpointer
load_nccl (gpointer data)
{
  struct { const char *name; void **slot; } symbols[] = {
    { "ncclGetErrorString", (void **) &nccl.GetErrorString },
    { "ncclGetUniqueId", (void **) &nccl.GetUniqueId },
    { "ncclCommInitRankConfig", (void **) &nccl.CommInitRankConfig },
    { "ncclCommGetAsyncError", (void **) &nccl.CommGetAsyncError },
    { "ncclCommAbort", (void **) &nccl.CommAbort },
    { "ncclCommDestroy", (void **) &nccl.CommDestroy },
    { "ncclAllReduce", (void **) &nccl.AllReduce },
    { "ncclAllGather", (void **) &nccl.AllGather },
    { "ncclSend", (void **) &nccl.Send },
    { "ncclRecv", (void **) &nccl.Recv },
    { "ncclGroupStart", (void **) &nccl.GroupStart },
    { "ncclGroupEnd", (void **) &nccl.GroupEnd },
  };
  guint i;

  nccl.handle = dlopen (NCCL_LIBRARY, RTLD_NOW | RTLD_LOCAL);
  if (nccl.handle == NULL)
    {
      nccl.why = g_strdup_printf ("NCCL (%s) cannot be loaded: %s", NCCL_LIBRARY, dlerror ());
      return NULL;
    }
  for (i = 0; i < G_N_ELEMENTS (symbols); i++)
    {
      *symbols[i].slot = dlsym (nccl.handle, symbols[i].name);
      if (*symbols[i].slot == NULL)
        {
          nccl.why = g_strdup_printf ("%s has no %s: NCCL 2.14 or later is needed",
                                      NCCL_LIBRARY, symbols[i].name);
          dlclose (nccl.handle);
          nccl.handle = NULL;
          return NULL;
        }
    }
  return NULL;
}

static gboolean
nccl_check_loaded (GError **error)
{
  static GOnce once = G_ONCE_INIT;

  g_once (&once, load_nccl, NULL);
  if (nccl.why == NULL)
    return TRUE;
  g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_UNSUPPORTED,
               "Communicators on CUDA need NCCL: %s", nccl.why);
  return FALSE;
}

struct _GmlpBackendComm
{
  GmlpBackendDevice *device;
  int                rank;
  int                world_size;
  guint              timeout_ms;

  /* Guards nccl (NULL once aborted), failure, pending and n_calls. */
  GMutex             lock;
  ncclComm_t         nccl;
  char              *failure;
  /* Events recorded after each collective, oldest first, with the time
   * each was enqueued (Pending). */
  GQueue             pending;
  guint64            n_calls;
  ncclResult_t       init_result;       /* what ncclCommInitRankConfig gave */

  /* The communication stream and its fork and join events (without timing,
   * re-recorded under lock for every collective). */
  cudaStream_t       stream;
  cudaEvent_t        fork;
  cudaEvent_t        join;

  int                abort_requested;   /* atomic */
  int                stop;              /* atomic: the watchdog's end */
  GThread           *watchdog;
};

typedef struct {
  cudaEvent_t event;
  gint64      enqueued;
  guint64     call;
} Pending;

static void
pending_free (Pending *p)
{
  (void) cudaEventDestroy (p->event);
  g_free (p);
}

/* Fails the group on this rank (the lock held): ncclCommAbort, which lets
 * the kernels waiting on peers return. */
static void
abort_locked (GmlpBackendComm *comm,
              char            *reason)
{
  if (comm->failure == NULL)
    comm->failure = reason;
  else
    g_free (reason);
  if (comm->nccl != NULL)
    {
      (void) nccl.CommAbort (comm->nccl);
      comm->nccl = NULL;
    }
  g_queue_clear_full (&comm->pending, (GDestroyNotify) pending_free);
}

static gboolean
set_failed (GmlpBackendComm  *comm,
            GError          **error)
{
  g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_ABORTED,
               "The communicator's group has failed: %s", comm->failure);
  return FALSE;
}

/* Waits (the lock held) until NCCL has finished with the last call on comm,
 * at most until deadline; a failure aborts. */
static gboolean
wait_ready (GmlpBackendComm  *comm,
            ncclResult_t      result,
            const char       *what,
            gint64            deadline,
            GError          **error)
{
  while (result == ncclInProgress)
    {
      if (g_atomic_int_get (&comm->abort_requested))
        {
          abort_locked (comm, g_strdup_printf ("rank %d aborted it", comm->rank));
          return set_failed (comm, error);
        }
      if (g_get_monotonic_time () > deadline)
        {
          abort_locked (comm, g_strdup_printf ("rank %d waited %u ms for %s", comm->rank,
                                               comm->timeout_ms, what));
          return set_failed (comm, error);
        }
      g_usleep (100);
      if (nccl.CommGetAsyncError (comm->nccl, &result) != ncclSuccess)
        result = ncclInternalError;
    }
  if (result == ncclSuccess)
    return TRUE;
  abort_locked (comm, g_strdup_printf ("%s on rank %d: NCCL: %s", what, comm->rank,
                                       nccl.GetErrorString (result)));
  return set_failed (comm, error);
}

static gpointer
watchdog (gpointer data)
{
  GmlpBackendComm *comm = data;

  (void) cudaSetDevice (comm->device->ordinal);
  while (!g_atomic_int_get (&comm->stop))
    {
      g_usleep (20 * G_TIME_SPAN_MILLISECOND);

      gmlp_mutex_lock (&comm->lock);
      if (comm->nccl != NULL && g_atomic_int_get (&comm->abort_requested))
        abort_locked (comm, g_strdup_printf ("rank %d aborted it", comm->rank));
      if (comm->nccl != NULL)
        {
          ncclResult_t async = ncclSuccess;

          if (nccl.CommGetAsyncError (comm->nccl, &async) != ncclSuccess)
            async = ncclInternalError;
          if (async != ncclSuccess && async != ncclInProgress)
            abort_locked (comm, g_strdup_printf ("NCCL on rank %d: %s", comm->rank,
                                                 nccl.GetErrorString (async)));
        }
      while (comm->nccl != NULL && !g_queue_is_empty (&comm->pending))
        {
          Pending *p = g_queue_peek_head (&comm->pending);
          cudaError_t err = cudaEventQuery (p->event);

          if (err == cudaSuccess)
            {
              pending_free (g_queue_pop_head (&comm->pending));
              continue;
            }
          if (err != cudaErrorNotReady)
            abort_locked (comm, g_strdup_printf ("collective %" G_GUINT64_FORMAT " on rank %d: CUDA: %s",
                                                 p->call, comm->rank, cudaGetErrorString (err)));
          else if (g_get_monotonic_time () - p->enqueued > (gint64) comm->timeout_ms * 1000)
            abort_locked (comm, g_strdup_printf ("collective %" G_GUINT64_FORMAT " did not complete on "
                                                 "rank %d within %u ms: a rank did not take part",
                                                 p->call, comm->rank, comm->timeout_ms));
          break;
        }
      gmlp_mutex_unlock (&comm->lock);
    }
  return NULL;
}

gboolean
gmlp_cuda_comm_unique_id (GmlpBackendDevice  *device,
                          guint8             *id,
                          GError            **error)
{
  ncclUniqueId uid;
  ncclResult_t r;

  if (!nccl_check_loaded (error) || !gmlp_cuda_activate (device, error))
    return FALSE;
  r = nccl.GetUniqueId (&uid);
  if (r != ncclSuccess)
    {
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_BACKEND,
                   "NCCL: ncclGetUniqueId failed: %s", nccl.GetErrorString (r));
      return FALSE;
    }
  memcpy (id, uid.internal, GMLP_BACKEND_COMM_ID_BYTES);
  return TRUE;
}

/* The communication stream and its events (the device current). */
static gboolean
make_stream (GmlpBackendComm  *comm,
             GError          **error)
{
  int least = 0, greatest = 0;
  cudaError_t err;

  err = cudaDeviceGetStreamPriorityRange (&least, &greatest);
  if (err == cudaSuccess)
    err = cudaStreamCreateWithPriority (&comm->stream, cudaStreamNonBlocking, greatest);
  if (err != cudaSuccess)
    return gmlp_cuda_fail (error, "cudaStreamCreateWithPriority", err);
  err = cudaEventCreateWithFlags (&comm->fork, cudaEventDisableTiming);
  if (err == cudaSuccess)
    err = cudaEventCreateWithFlags (&comm->join, cudaEventDisableTiming);
  if (err != cudaSuccess)
    return gmlp_cuda_fail (error, "cudaEventCreateWithFlags", err);
  return TRUE;
}

/* Safe with work pending: CUDA lets the stream and events go once it has
 * completed. */
static void
free_stream (GmlpBackendComm *comm)
{
  if (comm->join != NULL)
    (void) cudaEventDestroy (comm->join);
  if (comm->fork != NULL)
    (void) cudaEventDestroy (comm->fork);
  if (comm->stream != NULL)
    (void) cudaStreamDestroy (comm->stream);
  comm->join = comm->fork = NULL;
  comm->stream = NULL;
}

GmlpBackendComm *
gmlp_cuda_comm_init (GmlpBackendDevice  *device,
                     const guint8       *id,
                     int                 rank,
                     int                 world_size,
                     guint               timeout_ms,
                     GError            **error)
{
  NcclConfig config = {
    .size = sizeof (NcclConfig),
    .magic = NCCL_CONFIG_MAGIC,
    .version = NCCL_CONFIG_VERSION_2_14,
    .blocking = 0,
    .cgaClusterSize = INT_MIN,
    .minCTAs = INT_MIN,
    .maxCTAs = INT_MIN,
    .netName = NULL,
  };
  GmlpBackendComm *comm;
  ncclUniqueId uid;
  ncclResult_t r;

  if (!nccl_check_loaded (error) || !gmlp_cuda_activate (device, error))
    return NULL;

  comm = g_new0 (GmlpBackendComm, 1);
  comm->device = device;
  comm->rank = rank;
  comm->world_size = world_size;
  comm->timeout_ms = timeout_ms;
  g_mutex_init (&comm->lock);
  g_queue_init (&comm->pending);
  if (!make_stream (comm, error))
    {
      free_stream (comm);
      g_mutex_clear (&comm->lock);
      g_free (comm);
      return NULL;
    }

  memcpy (uid.internal, id, GMLP_BACKEND_COMM_ID_BYTES);
  r = nccl.CommInitRankConfig (&comm->nccl, world_size, uid, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress)
    {
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_BACKEND,
                   "NCCL: ncclCommInitRankConfig failed on rank %d: %s", rank, nccl.GetErrorString (r));
      if (comm->nccl != NULL)
        (void) nccl.CommAbort (comm->nccl);
      free_stream (comm);
      g_mutex_clear (&comm->lock);
      g_free (comm);
      return NULL;
    }
  comm->init_result = r;
  return comm;
}

/* The others join in the background of ncclCommInitRankConfig (a
 * non-blocking communicator): wait for them, then start the watchdog. */
gboolean
gmlp_cuda_comm_join (GmlpBackendComm  *comm,
                     GError          **error)
{
  gboolean ok;

  gmlp_mutex_lock (&comm->lock);
  if (comm->nccl == NULL)
    ok = set_failed (comm, error);
  else
    ok = gmlp_cuda_activate (comm->device, error) &&
         wait_ready (comm, comm->init_result, "the other ranks to join",
                     g_get_monotonic_time () + (gint64) comm->timeout_ms * 1000, error);
  gmlp_mutex_unlock (&comm->lock);
  if (ok)
    comm->watchdog = g_thread_new ("gmlp-nccl-watchdog", watchdog, comm);
  return ok;
}

void
gmlp_cuda_comm_abort (GmlpBackendComm *comm)
{
  /* A call polling NCCL holds the lock: the flag makes it abort. */
  g_atomic_int_set (&comm->abort_requested, 1);
  gmlp_mutex_lock (&comm->lock);
  abort_locked (comm, g_strdup_printf ("rank %d aborted it", comm->rank));
  gmlp_mutex_unlock (&comm->lock);
}

void
gmlp_cuda_comm_free (GmlpBackendComm *comm)
{
  gint64 deadline = g_get_monotonic_time () + (gint64) comm->timeout_ms * 1000;

  g_atomic_int_set (&comm->stop, 1);
  if (comm->watchdog != NULL)
    g_thread_join (comm->watchdog);

  /* ncclCommDestroy waits for the collectives enqueued: only when they
   * have completed, else abort. */
  gmlp_mutex_lock (&comm->lock);
  (void) cudaSetDevice (comm->device->ordinal);
  if (comm->watchdog == NULL && comm->nccl != NULL)
    abort_locked (comm, g_strdup ("left before the group was complete"));
  while (comm->nccl != NULL && !g_queue_is_empty (&comm->pending))
    {
      Pending *p = g_queue_peek_head (&comm->pending);

      if (cudaEventQuery (p->event) == cudaSuccess)
        pending_free (g_queue_pop_head (&comm->pending));
      else if (g_get_monotonic_time () > deadline)
        abort_locked (comm, g_strdup ("left with collectives in flight"));
      else
        g_usleep (1000);
    }
  if (comm->nccl != NULL)
    (void) nccl.CommDestroy (comm->nccl);
  g_queue_clear_full (&comm->pending, (GDestroyNotify) pending_free);
  free_stream (comm);
  gmlp_mutex_unlock (&comm->lock);

  g_free (comm->failure);
  g_mutex_clear (&comm->lock);
  g_free (comm);
}

/* The start of a collective (the lock taken): FALSE once the group has
 * failed. */
static gboolean
begin_call (GmlpBackendComm  *comm,
            GError          **error)
{
  cudaError_t err;

  gmlp_mutex_lock (&comm->lock);
  if (comm->nccl == NULL && comm->failure == NULL)
    comm->failure = g_strdup ("aborted");
  if (comm->failure != NULL || !gmlp_cuda_activate (comm->device, error))
    {
      if (comm->failure != NULL)
        set_failed (comm, error);
      gmlp_mutex_unlock (&comm->lock);
      return FALSE;
    }
  comm->n_calls++;
  /* Fork: the collective starts after the compute stream's work so far. */
  err = cudaEventRecord (comm->fork, comm->device->stream);
  if (err == cudaSuccess)
    err = cudaStreamWaitEvent (comm->stream, comm->fork, 0);
  if (err != cudaSuccess)
    {
      gmlp_cuda_fail (error, "cudaEventRecord/cudaStreamWaitEvent (fork)", err);
      gmlp_mutex_unlock (&comm->lock);
      return FALSE;
    }
  return TRUE;
}

/* The end of a collective: waits for NCCL to have enqueued it, joins it
 * (@done NULL: the compute stream waits for it now; else *@done, an event
 * on the communication stream, for the caller to wait on), notes it for
 * the watchdog, drops the lock. A collective that failed is joined too, so
 * that no capture is left with the communication stream forked. */
static gboolean
end_call (GmlpBackendComm    *comm,
          ncclResult_t        result,
          const char         *what,
          GmlpBackendEvent  **done,
          GError            **error)
{
  gboolean ok = wait_ready (comm, result, what,
                            g_get_monotonic_time () + (gint64) comm->timeout_ms * 1000, error);
  cudaError_t err = cudaSuccess;

  if (done != NULL)
    *done = NULL;
  if (ok && done != NULL)
    {
      *done = gmlp_cuda_event_record_on_stream (comm->device, comm->stream, error);
      ok = *done != NULL;
    }
  if (done == NULL || !ok)
    {
      err = cudaEventRecord (comm->join, comm->stream);
      if (err == cudaSuccess)
        err = cudaStreamWaitEvent (comm->device->stream, comm->join, 0);
      if (err != cudaSuccess && ok)
        ok = gmlp_cuda_fail (error, "cudaEventRecord/cudaStreamWaitEvent (join)", err);
    }

  /* An event recorded during a capture cannot be queried: graphs replay
   * collectives that the watchdog does not see. */
  if (ok && !gmlp_cuda_is_capturing (comm->device))
    {
      Pending *p = g_new0 (Pending, 1);

      p->enqueued = g_get_monotonic_time ();
      p->call = comm->n_calls;
      if (cudaEventCreateWithFlags (&p->event, cudaEventDisableTiming) == cudaSuccess &&
          cudaEventRecord (p->event, comm->stream) == cudaSuccess)
        g_queue_push_tail (&comm->pending, p);
      else
        {
          (void) cudaGetLastError ();
          if (p->event != NULL)
            (void) cudaEventDestroy (p->event);
          g_free (p);
        }
    }
  gmlp_mutex_unlock (&comm->lock);
  return ok;
}

static ncclDataType_t
nccl_dtype (int dtype)
{
  switch (dtype)
    {
    case GMLP_NUM_FLOAT16: return ncclFloat16;
    case GMLP_NUM_BFLOAT16: return ncclBfloat16;
    case GMLP_NUM_INT32: return ncclInt32;
    case GMLP_NUM_INT64: return ncclInt64;
    case GMLP_NUM_FLOAT32:
    default: return ncclFloat32;
    }
}

gboolean
gmlp_cuda_comm_all_reduce (GmlpBackendComm  *comm,
                           gpointer          data,
                           gsize             count,
                           int               dtype,
                           int               op,
                           GError          **error)
{
  ncclResult_t r;

  if (!begin_call (comm, error))
    return FALSE;
  r = nccl.AllReduce (data, data, count, nccl_dtype (dtype), op == GMLP_COMM_AVERAGE ? ncclAvg : ncclSum,
                      comm->nccl, comm->stream);
  return end_call (comm, r, "ncclAllReduce", NULL, error);
}

gboolean
gmlp_cuda_comm_all_gather (GmlpBackendComm  *comm,
                           gconstpointer     send,
                           gpointer          recv,
                           gsize             nbytes,
                           GError          **error)
{
  ncclResult_t r;

  if (!begin_call (comm, error))
    return FALSE;
  r = nccl.AllGather (send, recv, nbytes, ncclUint8, comm->nccl, comm->stream);
  return end_call (comm, r, "ncclAllGather", NULL, error);
}

gboolean
gmlp_cuda_comm_all_to_all (GmlpBackendComm  *comm,
                           gconstpointer     send,
                           const gsize      *send_offsets,
                           const gsize      *send_bytes,
                           gpointer          recv,
                           const gsize      *recv_offsets,
                           const gsize      *recv_bytes,
                           GmlpBackendEvent **done,
                           GError          **error)
{
  ncclResult_t r;
  int p;

  if (!begin_call (comm, error))
    return FALSE;
  /* Grouped point-to-point, as Megatron's all-to-all: one launch. */
  r = nccl.GroupStart ();
  for (p = 0; p < comm->world_size && (r == ncclSuccess || r == ncclInProgress); p++)
    {
      if (send_bytes[p] > 0)
        r = nccl.Send ((const guint8 *) send + send_offsets[p], send_bytes[p], ncclUint8, p,
                       comm->nccl, comm->stream);
      if (recv_bytes[p] > 0 && (r == ncclSuccess || r == ncclInProgress))
        r = nccl.Recv ((guint8 *) recv + recv_offsets[p], recv_bytes[p], ncclUint8, p,
                       comm->nccl, comm->stream);
    }
  {
    ncclResult_t end = nccl.GroupEnd ();

    if (r == ncclSuccess || r == ncclInProgress)
      r = end;
  }
  return end_call (comm, r, "ncclSend/ncclRecv", done, error);
}
