/* gmlp-cuda-event.c: events of the CUDA backend
 *
 * A GmlpBackendEvent is a cudaEvent_t recorded once, on a stream of the
 * device it was recorded on: the compute stream, or the copy stream for
 * copy_async(). Timing stays enabled so that two events can measure the
 * device time between them (benchmarks, profiling).
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-cuda-private.h"

/* Records a new event on stream, the compute or the copy stream of device,
 * which must be current already. Either way the event belongs to device:
 * event_elapsed() may pair events of its two streams. */
GmlpBackendEvent *
gmlp_cuda_event_record_on_stream (GmlpBackendDevice  *device,
                                  cudaStream_t        stream,
                                  GError            **error)
{
  GmlpBackendEvent *event;
  cudaError_t err;

  event = g_new0 (GmlpBackendEvent, 1);
  event->ordinal = device->ordinal;

  err = cudaEventCreateWithFlags (&event->event, cudaEventDefault);
  if (err != cudaSuccess)
    {
      g_free (event);
      gmlp_cuda_fail (error, "cudaEventCreateWithFlags", err);
      return NULL;
    }

  err = cudaEventRecord (event->event, stream);
  if (err != cudaSuccess)
    {
      gmlp_cuda_fail (error, "cudaEventRecord", err);
      (void) cudaEventDestroy (event->event);
      g_free (event);
      return NULL;
    }
  return event;
}

GmlpBackendEvent *
gmlp_cuda_event_record (GmlpBackendDevice  *device,
                        GError            **error)
{
  if (!gmlp_cuda_activate (device, error))
    return NULL;
  return gmlp_cuda_event_record_on_stream (device, device->stream, error);
}

/* Makes the event's device current on the calling thread, as every other
 * call does, so that a thread that never used a device does not bring up
 * device 0's context by accident. */
static cudaError_t
gmlp_cuda_event_activate (GmlpBackendEvent *event)
{
  return gmlp_cuda_set_current (event->ordinal);
}

gboolean
gmlp_cuda_event_synchronize (GmlpBackendEvent  *event,
                             GError           **error)
{
  cudaError_t err = gmlp_cuda_event_activate (event);

  if (err != cudaSuccess)
    return gmlp_cuda_fail (error, "cudaSetDevice", err);

  err = cudaEventSynchronize (event->event);
  if (err != cudaSuccess)
    return gmlp_cuda_fail (error, "cudaEventSynchronize", err);
  return TRUE;
}

gboolean
gmlp_cuda_event_query (GmlpBackendEvent *event)
{
  cudaError_t err = gmlp_cuda_event_activate (event);

  if (err == cudaSuccess)
    err = cudaEventQuery (event->event);
  if (err == cudaSuccess)
    return TRUE;

  /* cudaErrorNotReady is the usual answer. Anything else is a failure of
   * earlier work that this call cannot report; the next call that takes a
   * GError does (sticky errors stay). Either way nothing is left on this
   * thread for an unrelated check to trip over. */
  if (err != cudaErrorNotReady)
    g_debug ("CUDA: cudaEventQuery failed: %s (%s)",
             cudaGetErrorString (err), cudaGetErrorName (err));
  (void) cudaGetLastError ();
  return FALSE;
}

gboolean
gmlp_cuda_event_wait (GmlpBackendDevice  *device,
                      GmlpBackendEvent   *event,
                      GError            **error)
{
  cudaError_t err;

  if (!gmlp_cuda_activate (device, error))
    return FALSE;

  /* Works across devices: the wait is enqueued on this device's stream and
   * the event may belong to any device's context. */
  err = cudaStreamWaitEvent (device->stream, event->event, 0);
  if (err != cudaSuccess)
    return gmlp_cuda_fail (error, "cudaStreamWaitEvent", err);
  return TRUE;
}

gpointer
gmlp_cuda_event_get_native (GmlpBackendEvent *event)
{
  /* cudaEvent_t is a pointer type. */
  return (gpointer) event->event;
}

void
gmlp_cuda_event_free (GmlpBackendEvent *event)
{
  cudaError_t err;

  if (event == NULL)
    return;

  /* Safe while the event is pending: its resources go once it completes. */
  err = gmlp_cuda_event_activate (event);
  if (err == cudaSuccess)
    err = cudaEventDestroy (event->event);
  if (err != cudaSuccess)
    {
      g_debug ("CUDA: cudaEventDestroy failed: %s (%s)",
               cudaGetErrorString (err), cudaGetErrorName (err));
      (void) cudaGetLastError ();
    }
  g_free (event);
}

gboolean
gmlp_cuda_event_elapsed (GmlpBackendEvent  *start,
                         GmlpBackendEvent  *end,
                         double            *ms,
                         GError           **error)
{
  cudaError_t err = gmlp_cuda_event_activate (end);
  float elapsed = 0.0f;

  if (err == cudaSuccess)
    err = cudaEventSynchronize (end->event);
  if (err == cudaSuccess)
    err = cudaEventElapsedTime (&elapsed, start->event, end->event);
  if (err != cudaSuccess)
    return gmlp_cuda_fail (error, "cudaEventElapsedTime", err);
  *ms = elapsed;
  return TRUE;
}
