/* gmlp-cuda-graph.c: capture of the compute stream into CUDA graphs
 *
 * capture_begin puts the compute stream in capture mode; until capture_end,
 * what libgmlp enqueues on it is recorded into a graph instead of run, and
 * capture_end instantiates the graph for graph_launch to replay.
 *
 * Memory is what needs care. An allocation from the pool on a capturing
 * stream would become an allocation node of the graph, and a graph whose
 * allocations are not freed inside it cannot be launched twice; a free on
 * it would become a free node, and fails for memory the graph did not
 * allocate. So while the compute stream is captured:
 *
 *  - alloc allocates from the same pool on a stream of its own, outside the
 *    capture, and waits for that stream: the memory exists at once and for
 *    every replay;
 *  - free does not free: whatever is freed during a capture, allocated
 *    during it or before, may be used by the captured work, so the capture
 *    takes over the owner's reference and the graph made from it keeps the
 *    memory until it is freed itself;
 *  - upload copies at once on the same outside stream, since the host
 *    buffer is gone by the time of a replay;
 *  - free_after_copies goes through the same table as free. The rest of
 *    offloading (copy_stream_alloc, copy_async, host_alloc) works on the
 *    copy stream, which is never captured; libgmlp refuses to offload
 *    during a capture anyway (gmlp-saved-activations.c).
 *
 * A table (device->kept) counts the references to the memory that graphs
 * or the capture keep: one of its owner (until the owner frees it) and one
 * per graph or capture holding it. The memory goes back to the pool, in
 * compute-stream order, when the count drops to zero: after every replay
 * enqueued before. Memory no graph keeps is not in the table, and its free
 * costs one hash lookup.
 *
 * The capture is made in cudaStreamCaptureModeRelaxed. The other modes
 * forbid "potentially unsafe" calls while a capture is in progress, either
 * in the capturing thread (ThreadLocal) or in every thread of the process
 * (Global): among them the synchronization of the outside stream that
 * allocations and uploads need, and, with Global, any such call that other
 * threads make for unrelated work on other devices. What those modes guard
 * against, a call that waits for the captured stream, libgmlp refuses
 * itself before it reaches the stream (gmlp_device_check_not_capturing()).
 * Relaxed captures may also be ended from another thread.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-cuda-block-cache.h"
#include "gmlp-cuda-graph.h"

/* Memory that graphs or the capture in progress keep alive. */
typedef struct {
  guint     refs;          /* the owner's, until it frees, + one per graph or capture */
  gboolean  after_copies;  /* its owner freed it with free_after_copies */
  gboolean  in_capture;    /* the capture in progress holds one of refs */
} GmlpCudaKept;

struct _GmlpCudaCapture
{
  GPtrArray  *kept;        /* device pointers it holds a reference to */
};

struct _GmlpBackendGraph
{
  GmlpBackendDevice  *device;
  cudaGraphExec_t     exec;
  GPtrArray          *kept;   /* device pointers it holds a reference to */
  /* CUDA does not synchronise calls on one executable graph: replays from
   * several threads take turns. */
  GMutex              launch_lock;
};

void
gmlp_cuda_graph_init_device (GmlpBackendDevice *device)
{
  g_mutex_init (&device->capture_lock);
  device->kept = g_hash_table_new_full (g_direct_hash, g_direct_equal, NULL, g_free);
}

/* The real free, back to the pool in stream order. Called with the capture
 * lock held and no capture in progress. */
static void
free_now (GmlpBackendDevice *device,
          gpointer           ptr,
          gboolean           after_copies)
{
  if (after_copies)
    gmlp_cuda_free_after_copies_now (device, ptr);
  else
    gmlp_cuda_free_now (device, ptr);
}

/* Drops one reference to ptr, which kept describes; during a capture the
 * reference passes to the capture instead, unless it holds one already.
 * Called with the capture lock held. */
static void
release_locked (GmlpBackendDevice *device,
                gpointer           ptr,
                GmlpCudaKept      *kept)
{
  gboolean after_copies;

  if (device->capture != NULL && !kept->in_capture)
    {
      kept->in_capture = TRUE;
      g_ptr_array_add (device->capture->kept, ptr);
      return;
    }

  g_assert (kept->refs > 0);
  if (--kept->refs > 0)
    return;

  /* Only reached with no capture in progress: a capture holding a
   * reference leaves at least that one. */
  after_copies = kept->after_copies;
  g_hash_table_remove (device->kept, ptr);
  free_now (device, ptr, after_copies);
}

void
gmlp_cuda_release (GmlpBackendDevice *device,
                   gpointer           ptr,
                   gboolean           after_copies)
{
  GmlpCudaKept *kept;

  g_mutex_lock (&device->capture_lock);
  kept = g_hash_table_lookup (device->kept, ptr);
  if (kept == NULL && device->capture == NULL)
    {
      /* The common case: no graph knows this memory. */
      free_now (device, ptr, after_copies);
      g_mutex_unlock (&device->capture_lock);
      return;
    }

  if (kept == NULL)
    {
      /* Allocated before the capture, freed during it: the captured work
       * may still use it at every replay. */
      kept = g_new0 (GmlpCudaKept, 1);
      kept->refs = 1;
      g_hash_table_insert (device->kept, ptr, kept);
    }
  kept->after_copies |= after_copies;
  release_locked (device, ptr, kept);
  g_mutex_unlock (&device->capture_lock);
}

/* The outside stream and the event that orders it after the work enqueued
 * before the capture, made on first use. Called with the capture lock held. */
static gboolean
ensure_outside_stream (GmlpBackendDevice  *device,
                       GError            **error)
{
  cudaError_t err;

  if (device->outside_stream == NULL)
    {
      err = cudaStreamCreateWithFlags (&device->outside_stream, cudaStreamNonBlocking);
      if (err != cudaSuccess)
        {
          device->outside_stream = NULL;
          return gmlp_cuda_fail (error, "cudaStreamCreateWithFlags", err);
        }
    }
  if (device->capture_start == NULL)
    {
      err = cudaEventCreateWithFlags (&device->capture_start, cudaEventDisableTiming);
      if (err != cudaSuccess)
        {
          device->capture_start = NULL;
          return gmlp_cuda_fail (error, "cudaEventCreateWithFlags", err);
        }
    }
  return TRUE;
}

gpointer
gmlp_cuda_capture_alloc (GmlpBackendDevice  *device,
                         gsize               nbytes,
                         GError            **error)
{
  GmlpCudaKept *kept;
  gpointer ptr;
  cudaError_t err;

  g_assert (device->capture != NULL);

  /* After the work enqueued before the capture, as an allocation on the
   * compute stream would have been: the pool may then hand out memory that
   * work freed without adding a dependency of its own. */
  err = cudaStreamWaitEvent (device->outside_stream, device->capture_start, 0);
  if (err != cudaSuccess)
    {
      gmlp_cuda_fail (error, "cudaStreamWaitEvent", err);
      return NULL;
    }
  ptr = gmlp_cuda_alloc_on_stream (device, nbytes, device->outside_stream, error);
  if (ptr == NULL)
    return NULL;
  /* The graph's work may use it from its first replay on, on another
   * stream, with no way to wait for this one: wait now. */
  err = cudaStreamSynchronize (device->outside_stream);
  if (err != cudaSuccess)
    {
      gmlp_cuda_fail (error, "cudaStreamSynchronize (allocation during a capture)", err);
      (void) cudaFreeAsync (ptr, device->outside_stream);
      (void) cudaGetLastError ();
      return NULL;
    }

  /* One reference for its owner, one for the capture. */
  kept = g_new0 (GmlpCudaKept, 1);
  kept->refs = 2;
  kept->in_capture = TRUE;
  g_hash_table_insert (device->kept, ptr, kept);
  g_ptr_array_add (device->capture->kept, ptr);
  return ptr;
}

gboolean
gmlp_cuda_capture_upload (GmlpBackendDevice  *device,
                          gpointer            dst,
                          gconstpointer       src,
                          gsize               nbytes,
                          GError            **error)
{
  const char *what = "cudaStreamWaitEvent";
  cudaError_t err;

  g_mutex_lock (&device->capture_lock);
  /* After the work enqueued before the capture, which may still use dst;
   * the captured work runs only at replays, after this copy. */
  err = cudaStreamWaitEvent (device->outside_stream, device->capture_start, 0);
  if (err == cudaSuccess)
    {
      what = "cudaMemcpyAsync (upload during a capture)";
      err = cudaMemcpyAsync (dst, src, nbytes, cudaMemcpyHostToDevice, device->outside_stream);
    }
  if (err == cudaSuccess)
    {
      what = "cudaStreamSynchronize (upload during a capture)";
      err = cudaStreamSynchronize (device->outside_stream);
    }
  g_mutex_unlock (&device->capture_lock);

  if (err != cudaSuccess)
    return gmlp_cuda_fail (error, what, err);
  return TRUE;
}

gboolean
gmlp_cuda_capture_begin (GmlpBackendDevice  *device,
                         GError            **error)
{
  cudaError_t err;

  if (!gmlp_cuda_activate (device, error))
    return FALSE;

  g_mutex_lock (&device->capture_lock);
  if (device->capture != NULL)
    {
      g_mutex_unlock (&device->capture_lock);
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_INVALID_STATE,
                   "CUDA: cuda:%d is capturing a graph already", device->ordinal);
      return FALSE;
    }
  if (!ensure_outside_stream (device, error))
    {
      g_mutex_unlock (&device->capture_lock);
      return FALSE;
    }

  err = cudaEventRecord (device->capture_start, device->stream);
  if (err != cudaSuccess)
    {
      g_mutex_unlock (&device->capture_lock);
      return gmlp_cuda_fail (error, "cudaEventRecord", err);
    }
  err = cudaStreamBeginCapture (device->stream, cudaStreamCaptureModeRelaxed);
  if (err != cudaSuccess)
    {
      g_mutex_unlock (&device->capture_lock);
      return gmlp_cuda_fail (error, "cudaStreamBeginCapture", err);
    }

  device->capture = g_new0 (GmlpCudaCapture, 1);
  device->capture->kept = g_ptr_array_new ();
  g_mutex_unlock (&device->capture_lock);
  return TRUE;
}

/* Drops the references of a capture that gave no graph. Called with the
 * capture lock held, after device->capture is cleared: the memory that
 * only the capture kept goes back to the pool now. */
static void
drop_capture_locked (GmlpBackendDevice *device,
                     GmlpCudaCapture   *capture)
{
  guint i;

  for (i = 0; i < capture->kept->len; i++)
    {
      gpointer ptr = g_ptr_array_index (capture->kept, i);
      GmlpCudaKept *kept = g_hash_table_lookup (device->kept, ptr);

      kept->in_capture = FALSE;
      release_locked (device, ptr, kept);
    }
  g_ptr_array_unref (capture->kept);
  g_free (capture);
}

GmlpBackendGraph *
gmlp_cuda_capture_end (GmlpBackendDevice  *device,
                       GError            **error)
{
  GmlpCudaCapture *capture;
  GmlpBackendGraph *graph;
  cudaGraph_t captured = NULL;
  cudaGraphExec_t exec = NULL;
  cudaError_t err;
  guint i;

  if (!gmlp_cuda_activate (device, error))
    return NULL;

  g_mutex_lock (&device->capture_lock);
  capture = g_steal_pointer (&device->capture);
  if (capture == NULL)
    {
      g_mutex_unlock (&device->capture_lock);
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_INVALID_STATE,
                   "CUDA: no graph capture is in progress on cuda:%d", device->ordinal);
      return NULL;
    }

  /* This ends the capture even when it was invalidated: the stream runs
   * work again either way. */
  err = cudaStreamEndCapture (device->stream, &captured);
  if (err != cudaSuccess || captured == NULL)
    {
      if (err == cudaErrorStreamCaptureInvalidated)
        {
          (void) cudaGetLastError ();
          g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_BACKEND,
                       "CUDA: the capture on cuda:%d was invalidated by an operation that "
                       "cannot be captured in a graph, such as a wait for the stream or a "
                       "copy to pageable host memory made on it from outside libgmlp; "
                       "nothing was recorded (%s)", device->ordinal, cudaGetErrorName (err));
        }
      else if (err != cudaSuccess)
        gmlp_cuda_fail (error, "cudaStreamEndCapture", err);
      else
        g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_BACKEND,
                     "CUDA: cudaStreamEndCapture gave no graph");
      drop_capture_locked (device, capture);
      g_mutex_unlock (&device->capture_lock);
      return NULL;
    }

  err = cudaGraphInstantiate (&exec, captured, 0);
  (void) cudaGraphDestroy (captured);
  if (err != cudaSuccess)
    {
      gmlp_cuda_fail (error, "cudaGraphInstantiate", err);
      drop_capture_locked (device, capture);
      g_mutex_unlock (&device->capture_lock);
      return NULL;
    }

  /* The capture's references become the graph's. */
  graph = g_new0 (GmlpBackendGraph, 1);
  g_mutex_init (&graph->launch_lock);
  graph->device = device;
  graph->exec = exec;
  graph->kept = g_steal_pointer (&capture->kept);
  for (i = 0; i < graph->kept->len; i++)
    {
      GmlpCudaKept *kept = g_hash_table_lookup (device->kept, g_ptr_array_index (graph->kept, i));
      kept->in_capture = FALSE;
    }
  g_free (capture);
  g_mutex_unlock (&device->capture_lock);
  return graph;
}

gboolean
gmlp_cuda_is_capturing (GmlpBackendDevice *device)
{
  gboolean capturing;

  g_mutex_lock (&device->capture_lock);
  capturing = device->capture != NULL;
  g_mutex_unlock (&device->capture_lock);
  return capturing;
}

gboolean
gmlp_cuda_check_not_capturing (GmlpBackendDevice  *device,
                               const char         *what,
                               GError            **error)
{
  if (!gmlp_cuda_is_capturing (device))
    return TRUE;
  g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_INVALID_STATE,
               "CUDA: %s cannot be captured in a graph, and cuda:%d is capturing one",
               what, device->ordinal);
  return FALSE;
}

gboolean
gmlp_cuda_graph_launch (GmlpBackendGraph  *graph,
                        GError           **error)
{
  GmlpBackendDevice *device = graph->device;
  cudaError_t err;

  if (!gmlp_cuda_activate (device, error))
    return FALSE;
  /* Recorded into another graph, the replay would use memory that only
   * this graph keeps. */
  if (!gmlp_cuda_check_not_capturing (device, "a replay", error))
    return FALSE;

  g_mutex_lock (&graph->launch_lock);
  err = cudaGraphLaunch (graph->exec, device->stream);
  g_mutex_unlock (&graph->launch_lock);
  if (err != cudaSuccess)
    return gmlp_cuda_fail (error, "cudaGraphLaunch", err);
  return TRUE;
}

void
gmlp_cuda_graph_free (GmlpBackendGraph *graph)
{
  GmlpBackendDevice *device;
  cudaError_t err;
  guint i;

  if (graph == NULL)
    return;
  device = graph->device;

  /* Replays still in flight are not cut short: the driver frees the
   * executable graph once they complete. */
  err = cudaSetDevice (device->ordinal);
  if (err == cudaSuccess)
    err = cudaGraphExecDestroy (graph->exec);
  if (err != cudaSuccess)
    {
      g_debug ("CUDA: cudaGraphExecDestroy failed: %s (%s)",
               cudaGetErrorString (err), cudaGetErrorName (err));
      (void) cudaGetLastError ();
    }

  /* Its memory goes back to the pool in stream order, after those replays,
   * unless an owner or another graph still holds it. */
  g_mutex_lock (&device->capture_lock);
  for (i = 0; i < graph->kept->len; i++)
    {
      gpointer ptr = g_ptr_array_index (graph->kept, i);
      release_locked (device, ptr, g_hash_table_lookup (device->kept, ptr));
    }
  g_mutex_unlock (&device->capture_lock);

  g_ptr_array_unref (graph->kept);
  g_mutex_clear (&graph->launch_lock);
  g_free (graph);
}

void
gmlp_cuda_graph_fini_device (GmlpBackendDevice *device)
{
  /* Devices live as long as the process and graphs hold their device, so
   * this only matters for a device that failed to open, or a capture left
   * running at exit. */
  (void) cudaSetDevice (device->ordinal);
  if (device->capture != NULL)
    {
      cudaGraph_t captured = NULL;

      if (cudaStreamEndCapture (device->stream, &captured) == cudaSuccess && captured != NULL)
        (void) cudaGraphDestroy (captured);
      g_ptr_array_unref (device->capture->kept);
      g_clear_pointer (&device->capture, g_free);
    }
  if (device->outside_stream != NULL)
    {
      (void) cudaStreamSynchronize (device->outside_stream);
      (void) cudaStreamDestroy (device->outside_stream);
      device->outside_stream = NULL;
    }
  if (device->capture_start != NULL)
    {
      (void) cudaEventDestroy (device->capture_start);
      device->capture_start = NULL;
    }
  (void) cudaGetLastError ();
  g_clear_pointer (&device->kept, g_hash_table_unref);
  g_mutex_clear (&device->capture_lock);
}
