/* gmlp-event.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <gio/gio.h>

#include "gmlp-event-private.h"
#include "gmlp-device-private.h"
#include "gmlp-error.h"
#include "gmlp-error-private.h"
#include "gmlp-thread-private.h"

/**
 * GmlpEvent:
 *
 * A point in a [class@Gmlp.Device]'s stream: it completes when all the work
 * enqueued on the stream before it has completed.
 *
 * The host can wait for it ([method@Gmlp.Event.synchronize]) or poll it
 * ([method@Gmlp.Event.is_complete]); another device's stream can wait for it
 * without blocking the host ([method@Gmlp.Event.wait_on_device]); and C code
 * can make its own CUDA stream wait for it through
 * [method@Gmlp.Event.get_native_handle], for example to start a gradient
 * all-reduce as soon as [signal@Gmlp.GroupedLinear::wgrad-ready]'s event
 * completes. On the CPU events are complete when they are made.
 *
 * An event recorded while its device captures a graph marks a point in the
 * graph, not in time (see [method@Gmlp.Device.begin_capture]): the host
 * cannot wait for it or poll it, and only the capturing device's own stream
 * may wait for it, during that capture.
 *
 * g_object_new() with [property@Gmlp.Event:device] records the event as
 * [ctor@Gmlp.Event.new_recorded] does (when that fails, every method reports
 * why, as [iface@Gio.Initable]'s init does). An event made without a device
 * marks no work: it is complete, waiting for it returns at once, and it has
 * no device, no native handle and no time.
 * `GmlpEvent` is thread-safe: it does not change once recorded, any number
 * of threads may use it at once, and the last reference may go on any of
 * them.
 *
 * ## Examples
 *
 * In Python (PyGObject):
 *
 * ```python
 * import gi
 * gi.require_version('Gmlp', '1.0')
 * from gi.repository import GLib, Gmlp
 *
 * dev = Gmlp.Device.get_default()
 * x = Gmlp.GroupedTensor.new(dev, Gmlp.DType.FLOAT32, [256, 512], 1024)
 * start = Gmlp.Event.new_recorded(dev)
 * x.fill_random(1, 1.0)
 * end = Gmlp.Event.new_recorded(dev)
 * _, ms = start.elapsed_ms(end)     # waits for the end event
 * print('fill_random took %.3f ms' % ms)
 * ```
 *
 * In JavaScript (gjs; run with `gjs -m`):
 *
 * ```js
 * import GLib from 'gi://GLib';
 * import Gmlp from 'gi://Gmlp?version=1.0';
 *
 * const dev = Gmlp.Device.get_default();
 * const x = Gmlp.GroupedTensor.new(dev, Gmlp.DType.FLOAT32, [256, 512], 1024);
 * const start = Gmlp.Event.new_recorded(dev);
 * x.fill_random(1, 1.0);
 * const end = Gmlp.Event.new_recorded(dev);
 * const [, ms] = start.elapsed_ms(end);
 * print(`fill_random took ${ms.toFixed(3)} ms`);
 * ```
 *
 * Since: 0.1
 */

struct _GmlpEvent
{
  GObject            parent_instance;

  GmlpDevice        *device;
  GmlpBackendEvent  *event;
  /* The capture it was recorded in (gmlp_device_get_capture_serial()), or
   * 0: the backend refuses host waits for such an event, and a capture that
   * tries one breaks. */
  guint              capture_serial;
  GError            *construct_error;
};

/* Host waits and waits of other streams for an event recorded during a
 * capture. */
static gboolean
check_not_captured (GmlpEvent   *self,
                    const char  *what,
                    GError     **error)
{
  if (self->capture_serial == 0)
    return TRUE;

  g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE,
               "%s an event recorded during a graph capture cannot be captured in a graph "
               "nor done after it: the event marks a point in the graph, not in time", what);
  return FALSE;
}

static void gmlp_event_initable_iface_init (GInitableIface *iface);

G_DEFINE_FINAL_TYPE_WITH_CODE (GmlpEvent, gmlp_event, G_TYPE_OBJECT,
                               G_IMPLEMENT_INTERFACE (G_TYPE_INITABLE,
                                                      gmlp_event_initable_iface_init))

enum {
  PROP_0,
  PROP_DEVICE,
  N_PROPS
};

static GParamSpec *properties[N_PROPS];

/* An event is shared between threads (the offload context's pool of host
 * memory keeps one per block), and its last reference may go on any of
 * them, through GObject's reference count, which ThreadSanitizer does not
 * see: each use releases the event to its finalize, which acquires it. */
static gboolean
used (GmlpEvent *self,
      gboolean   result)
{
  gmlp_tsan_release (self);
  return result;
}

static void
gmlp_event_finalize (GObject *object)
{
  GmlpEvent *self = (GmlpEvent *) object;

  gmlp_tsan_acquire (self);
  if (self->event != NULL)
    gmlp_device_get_backend (self->device)->event_free (self->event);
  g_clear_object (&self->device);
  g_clear_error (&self->construct_error);

  G_OBJECT_CLASS (gmlp_event_parent_class)->finalize (object);
}

static void
gmlp_event_get_property (GObject    *object,
                         guint       prop_id,
                         GValue     *value,
                         GParamSpec *pspec)
{
  GmlpEvent *self = GMLP_EVENT (object);

  switch (prop_id)
    {
    case PROP_DEVICE:
      g_value_set_object (value, self->device);
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
    }
}

static void
gmlp_event_set_property (GObject      *object,
                         guint         prop_id,
                         const GValue *value,
                         GParamSpec   *pspec)
{
  GmlpEvent *self = GMLP_EVENT (object);

  switch (prop_id)
    {
    case PROP_DEVICE:
      self->device = g_value_dup_object (value);
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
    }
}

/* Records @self on its device's stream, after the work enqueued so far. */
static gboolean
record (GmlpEvent  *self,
        GError    **error)
{
  if (!gmlp_device_check_usable (self->device, error))
    return FALSE;
  self->event = GMLP_DEVICE_CALL (self->device, event_record, error);
  if (self->event == NULL)
    return FALSE;
  self->capture_serial = gmlp_device_get_capture_serial (self->device);
  return TRUE;
}

static void
gmlp_event_constructed (GObject *object)
{
  GmlpEvent *self = GMLP_EVENT (object);

  G_OBJECT_CLASS (gmlp_event_parent_class)->constructed (object);

  /* The library's own constructors give no device and set the event. */
  if (self->device != NULL && !record (self, &self->construct_error))
    g_clear_object (&self->device);
}

static gboolean
gmlp_event_initable_init (GInitable     *initable,
                          GCancellable  *cancellable,
                          GError       **error)
{
  GmlpEvent *self = GMLP_EVENT (initable);

  return gmlp_check_constructed (self, self->construct_error, error);
}

static void
gmlp_event_initable_iface_init (GInitableIface *iface)
{
  iface->init = gmlp_event_initable_init;
}

static void
gmlp_event_class_init (GmlpEventClass *klass)
{
  GObjectClass *object_class = G_OBJECT_CLASS (klass);

  object_class->constructed = gmlp_event_constructed;
  object_class->finalize = gmlp_event_finalize;
  object_class->get_property = gmlp_event_get_property;
  object_class->set_property = gmlp_event_set_property;

  /**
   * GmlpEvent:device:
   *
   * The device on whose stream the event was recorded; %NULL for an event
   * made without one, which marks no work.
   *
   * Since: 0.1
   */
  properties[PROP_DEVICE] =
    g_param_spec_object ("device", NULL, NULL, GMLP_TYPE_DEVICE,
                         G_PARAM_READWRITE | G_PARAM_CONSTRUCT_ONLY |
                         G_PARAM_EXPLICIT_NOTIFY | G_PARAM_STATIC_STRINGS);

  g_object_class_install_properties (object_class, N_PROPS, properties);
}

static void
gmlp_event_init (GmlpEvent *self)
{
}

/**
 * gmlp_event_new_recorded:
 * @device: a #GmlpDevice
 * @error: return location for a #GError
 *
 * Records an event on @device's stream, after the work enqueued so far.
 *
 * Returns: (transfer full): the event, or %NULL with %GMLP_ERROR_BACKEND
 *
 * Since: 0.1
 */
GmlpEvent *
gmlp_event_new_recorded (GmlpDevice  *device,
                         GError     **error)
{
  g_autoptr(GmlpEvent) self = NULL;

  g_return_val_if_fail (GMLP_IS_DEVICE (device), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  self = g_object_new (GMLP_TYPE_EVENT, NULL);
  self->device = g_object_ref (device);
  if (!record (self, error))
    return NULL;
  return g_steal_pointer (&self);
}

gboolean
gmlp_event_record_for_signal (gpointer     instance,
                              guint        signal_id,
                              GmlpDevice  *device,
                              GmlpEvent  **event,
                              GError     **error)
{
  *event = NULL;
  if (!g_signal_has_handler_pending (instance, signal_id, 0, TRUE))
    return TRUE;
  *event = gmlp_event_new_recorded (device, error);
  return *event != NULL;
}

GmlpEvent *
gmlp_event_new_for_backend (GmlpDevice       *device,
                            GmlpBackendEvent *event)
{
  GmlpEvent *self = g_object_new (GMLP_TYPE_EVENT, NULL);

  self->device = g_object_ref (device);
  self->event = event;
  /* A communicator's all-to-all may end in a capture. */
  self->capture_serial = gmlp_device_get_capture_serial (device);
  return self;
}

/**
 * gmlp_event_get_device:
 * @self: a #GmlpEvent
 *
 * Gets the device on whose stream @self was recorded.
 *
 * Returns: (transfer none) (nullable): the device on whose stream the event
 *   was recorded, or %NULL for an event made without one
 *
 * Since: 0.1
 */
GmlpDevice *
gmlp_event_get_device (GmlpEvent *self)
{
  g_return_val_if_fail (GMLP_IS_EVENT (self), NULL);

  return self->device;
}

/**
 * gmlp_event_is_complete:
 * @self: a #GmlpEvent
 *
 * Polls the event without blocking.
 *
 * Returns: %TRUE once the work before the event has completed; %FALSE for
 *   an event recorded during a graph capture
 *
 * Since: 0.1
 */
gboolean
gmlp_event_is_complete (GmlpEvent *self)
{
  g_return_val_if_fail (GMLP_IS_EVENT (self), FALSE);

  if (self->event == NULL)
    return TRUE;
  /* CUDA forbids the query, and it would break a capture in progress. */
  if (self->capture_serial != 0)
    return used (self, FALSE);

  return used (self, gmlp_device_get_backend (self->device)->event_query (self->event));
}

/**
 * gmlp_event_synchronize:
 * @self: a #GmlpEvent
 * @error: return location for a #GError
 *
 * Blocks the calling thread until the event has completed.
 *
 * Returns: %TRUE on success; %FALSE with %GMLP_ERROR_BACKEND if the device
 *   reported an error, or %GMLP_ERROR_INVALID_STATE for an event recorded
 *   during a graph capture
 *
 * Since: 0.1
 */
gboolean
gmlp_event_synchronize (GmlpEvent  *self,
                        GError    **error)
{
  g_return_val_if_fail (GMLP_IS_EVENT (self), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_check_constructed (self, self->construct_error, error) ||
      !check_not_captured (self, "Waiting on the host for", error))
    return used (self, FALSE);
  if (self->event == NULL)
    return used (self, TRUE);

  return used (self, gmlp_device_get_backend (self->device)->event_synchronize (self->event, error));
}

/**
 * gmlp_event_wait_on_device:
 * @self: a #GmlpEvent
 * @device: the device whose stream waits
 * @error: return location for a #GError
 *
 * Makes @device's stream wait for the event: work enqueued on @device after
 * this call starts only once the event has completed. The host does not
 * wait.
 *
 * Returns: %TRUE on success; %FALSE with %GMLP_ERROR_UNSUPPORTED if @device
 *   is of another kind than the event's device, or
 *   %GMLP_ERROR_INVALID_STATE for an event recorded during a graph capture
 *   unless @device is the event's device and still in that capture
 *
 * Since: 0.1
 */
gboolean
gmlp_event_wait_on_device (GmlpEvent   *self,
                           GmlpDevice  *device,
                           GError     **error)
{
  g_return_val_if_fail (GMLP_IS_EVENT (self), FALSE);
  g_return_val_if_fail (GMLP_IS_DEVICE (device), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_check_constructed (self, self->construct_error, error) ||
      !gmlp_device_check_usable (device, error))
    return FALSE;
  if (self->event == NULL)
    return TRUE;
  /* Within the capture the wait is an edge of the graph; any other stream
   * would be pulled into the capture, or cross its boundary. */
  if (self->capture_serial != 0 &&
      (device != self->device || gmlp_device_get_capture_serial (device) != self->capture_serial) &&
      !check_not_captured (self, "Waiting from another stream or capture for", error))
    return used (self, FALSE);

  if (gmlp_device_get_backend (device) != gmlp_device_get_backend (self->device))
    {
      /* The CPU runs its work on the calling thread: waiting on the host
       * orders it after the event. */
      if (gmlp_device_get_kind (device) == GMLP_DEVICE_KIND_CPU)
        return gmlp_event_synchronize (self, error);
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "A %s stream cannot wait for an event of %s",
                   gmlp_device_get_name (device), gmlp_device_get_name (self->device));
      return used (self, FALSE);
    }

  return used (self, GMLP_DEVICE_CALL (device, event_wait, self->event, error));
}

/**
 * gmlp_event_elapsed_ms:
 * @start: an event
 * @end: a later event of the same device
 * @ms: (out): return location for the time between them, in milliseconds
 * @error: return location for a #GError
 *
 * Measures the device time between two events, as benchmarks do: record one
 * before the work and one after, then ask. Waits for @end.
 *
 * Returns: %TRUE on success; %FALSE with %GMLP_ERROR_INVALID_ARGUMENT for
 *   events of two devices, or %GMLP_ERROR_INVALID_STATE for an event
 *   recorded during a graph capture
 *
 * Since: 0.1
 */
gboolean
gmlp_event_elapsed_ms (GmlpEvent  *start,
                       GmlpEvent  *end,
                       double     *ms,
                       GError    **error)
{
  g_return_val_if_fail (GMLP_IS_EVENT (start), FALSE);
  g_return_val_if_fail (GMLP_IS_EVENT (end), FALSE);
  g_return_val_if_fail (ms != NULL, FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  *ms = 0.0;
  if (!gmlp_check_constructed (start, start->construct_error, error) ||
      !gmlp_check_constructed (end, end->construct_error, error) ||
      !check_not_captured (start, "Timing", error) ||
      !check_not_captured (end, "Timing", error))
    return FALSE;
  if (start->event == NULL || end->event == NULL)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "An event made without a device marks no time");
      return FALSE;
    }
  if (start->device != end->device)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "The events were recorded on two devices (%s and %s)",
                   gmlp_device_get_name (start->device), gmlp_device_get_name (end->device));
      return FALSE;
    }
  return gmlp_device_get_backend (start->device)->event_elapsed (start->event, end->event, ms, error);
}

/**
 * gmlp_event_get_native_handle:
 * @self: a #GmlpEvent
 *
 * Gets the backend's own event, for C code that drives its own streams: a
 * `cudaEvent_t` for a CUDA device (pass it to `cudaStreamWaitEvent()`), %NULL
 * for the CPU and for an event made without a device. It stays valid as
 * long as @self.
 *
 * Returns: (nullable) (transfer none): the native event
 *
 * Since: 0.1
 */
gpointer
gmlp_event_get_native_handle (GmlpEvent *self)
{
  g_return_val_if_fail (GMLP_IS_EVENT (self), NULL);

  if (self->event == NULL)
    return NULL;
  return gmlp_device_get_backend (self->device)->event_get_native (self->event);
}
