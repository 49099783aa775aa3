/* gmlp-graph.c: work captured from a device's stream, replayed as one launch
 *
 * GmlpGraph, and the device's two methods that make one
 * (gmlp_device_begin_capture(), gmlp_device_end_capture()): a capture is
 * begun and ended for the sake of its graph. The device keeps only the
 * capture state that every call consults (whether it is capturing, the
 * capture's number: gmlp-device.c) and calls nothing here, so calls run one
 * way, from the graph to the device.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-graph.h"
#include "gmlp-device-private.h"
#include "gmlp-error.h"

/**
 * GmlpGraph:
 *
 * The work that was enqueued on a [class@Gmlp.Device] between
 * [method@Gmlp.Device.begin_capture] and [method@Gmlp.Device.end_capture],
 * recorded instead of run, which [method@Gmlp.Graph.replay] enqueues again as
 * one launch: a whole forward and backward costs the host one call.
 *
 * ```c
 * gmlp_device_begin_capture (device, &error);
 * y = gmlp_grouped_linear_forward (layer, x, &saved, &error);   // recorded
 * dx = gmlp_grouped_linear_backward (layer, saved, dy, &error);  // recorded
 * graph = gmlp_device_end_capture (device, &error);
 * for (step = 0; step < n_steps; step++)
 *   {
 *     // write new inputs (and device group sizes) into x and dy, then
 *     gmlp_graph_replay (graph, &error);
 *   }
 * ```
 *
 * A replay reads and writes the very tensors the captured calls were given
 * or returned, so new inputs go into those tensors (device sizes included,
 * which is how one graph serves any routing of tokens to experts). Tensors
 * created during the capture hold their results only after a replay.
 *
 * Calls that wait for the device or read its memory on the host cannot be
 * recorded: while a device is capturing they fail with
 * %GMLP_ERROR_INVALID_STATE and leave the capture as it was. Memory that the
 * captured work uses stays allocated for as long as the graph exists, even
 * when its tensor is freed first. `docs/graphs.md` has the details.
 *
 * Graphs need a GPU: on the CPU, [method@Gmlp.Device.begin_capture] fails
 * with %GMLP_ERROR_UNSUPPORTED.
 *
 * Graphs come from [method@Gmlp.Device.end_capture]; one made with
 * g_object_new() holds no work, and replaying it fails with
 * %GMLP_ERROR_INVALID_STATE.
 * `GmlpGraph` is thread-safe: replays from several threads take turns,
 * each enqueued on the device's stream after the work enqueued before it.
 * Since a replay rewrites the same tensors, replays meant to be
 * independent need the caller to order each one's inputs and outputs.
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
 * layer = Gmlp.GroupedLinear.new(dev, 2, 64, 32)
 * x = Gmlp.GroupedTensor.new(dev, Gmlp.DType.FLOAT32, [8, 24], 64)
 * layer.forward(x)                  # once outside, so nothing is allocated in capture
 * if dev.get_kind() == Gmlp.DeviceKind.CUDA:   # graphs need a GPU
 *     dev.begin_capture()
 *     y, saved = layer.forward(x)   # recorded, not run
 *     graph = dev.end_capture()
 *     for step in range(3):
 *         x.fill_random(step, 1.0)
 *         graph.replay()            # y holds this step's output
 * ```
 *
 * In JavaScript (gjs; run with `gjs -m`):
 *
 * ```js
 * import GLib from 'gi://GLib';
 * import Gmlp from 'gi://Gmlp?version=1.0';
 *
 * const dev = Gmlp.Device.get_default();
 * const layer = Gmlp.GroupedLinear.new(dev, 2, 64, 32);
 * const x = Gmlp.GroupedTensor.new(dev, Gmlp.DType.FLOAT32, [8, 24], 64);
 * layer.forward(x);                 // once outside, so nothing is allocated in capture
 * if (dev.get_kind() === Gmlp.DeviceKind.CUDA) {  // graphs need a GPU
 *     dev.begin_capture();
 *     const [y, saved] = layer.forward(x);  // recorded, not run
 *     const graph = dev.end_capture();
 *     for (let step = 0; step < 3; step++) {
 *         x.fill_random(step, 1.0);
 *         graph.replay();           // y holds this step's output
 *     }
 * }
 * ```
 *
 * Since: 0.1
 */

struct _GmlpGraph
{
  GObject            parent_instance;

  GmlpDevice        *device;
  GmlpBackendGraph  *graph;
};

G_DEFINE_FINAL_TYPE (GmlpGraph, gmlp_graph, G_TYPE_OBJECT)

enum {
  PROP_0,
  PROP_DEVICE,
  N_PROPS
};

static GParamSpec *properties[N_PROPS];

static void
gmlp_graph_finalize (GObject *object)
{
  GmlpGraph *self = (GmlpGraph *) object;

  /* Replays still in flight finish first: the backend frees the graph and
   * the memory it kept in stream order. */
  if (self->graph != NULL)
    gmlp_device_get_backend (self->device)->graph_free (self->graph);
  g_clear_object (&self->device);

  G_OBJECT_CLASS (gmlp_graph_parent_class)->finalize (object);
}

static void
gmlp_graph_get_property (GObject    *object,
                         guint       prop_id,
                         GValue     *value,
                         GParamSpec *pspec)
{
  GmlpGraph *self = GMLP_GRAPH (object);

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
gmlp_graph_class_init (GmlpGraphClass *klass)
{
  GObjectClass *object_class = G_OBJECT_CLASS (klass);

  object_class->finalize = gmlp_graph_finalize;
  object_class->get_property = gmlp_graph_get_property;

  /**
   * GmlpGraph:device:
   *
   * The device whose stream was captured, and on which the graph replays.
   *
   * Since: 0.1
   */
  properties[PROP_DEVICE] =
    g_param_spec_object ("device", NULL, NULL,
                         GMLP_TYPE_DEVICE,
                         G_PARAM_READABLE | G_PARAM_EXPLICIT_NOTIFY | G_PARAM_STATIC_STRINGS);

  g_object_class_install_properties (object_class, N_PROPS, properties);
}

static void
gmlp_graph_init (GmlpGraph *self)
{
}

/* Wraps a graph the backend made from a capture of device; takes it over. */
static GmlpGraph *
gmlp_graph_new_for_backend (GmlpDevice       *device,
                            GmlpBackendGraph *graph)
{
  GmlpGraph *self = g_object_new (GMLP_TYPE_GRAPH, NULL);

  self->device = g_object_ref (device);
  self->graph = graph;
  return self;
}

/**
 * gmlp_device_begin_capture:
 * @self: a #GmlpDevice
 * @error: return location for a #GError
 *
 * Starts recording the work enqueued on @self's stream into a graph instead
 * of running it, until [method@Gmlp.Device.end_capture]. Every libgmlp call
 * that only enqueues work may be captured (tensor arithmetic, conversions,
 * grouped linear and MLP forward and backward with device group sizes);
 * those that wait for the device or read its memory on the host
 * ([method@Gmlp.Device.synchronize], [method@Gmlp.GroupedTensor.to_bytes],
 * [method@Gmlp.GroupedTensor.sum_squares], offloading activations, ...) fail
 * with %GMLP_ERROR_INVALID_STATE meanwhile, and the capture goes on.
 *
 * The capture records what every thread enqueues on @self. Tensors
 * allocated during it are allocated at once, outside the graph, and data
 * uploaded from the host during it (such as
 * [ctor@Gmlp.GroupedTensor.new_from_bytes]) is copied at once, not at every
 * replay. See `docs/graphs.md`.
 *
 * Returns: %TRUE on success; %FALSE with %GMLP_ERROR_UNSUPPORTED on the CPU,
 *   which has no graphs, or %GMLP_ERROR_INVALID_STATE when @self is capturing
 *   already (captures do not nest)
 *
 * Since: 0.1
 */
gboolean
gmlp_device_begin_capture (GmlpDevice  *self,
                           GError     **error)
{
  g_return_val_if_fail (GMLP_IS_DEVICE (self), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_device_check_usable (self, error))
    return FALSE;
  if (gmlp_device_is_capturing (self))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE,
                   "%s is capturing a graph already; captures do not nest",
                   gmlp_device_get_name (self));
      return FALSE;
    }

  /* Before the capture starts, so that an event recorded by the first
   * captured call already carries the new number. */
  gmlp_device_bump_capture_serial (self);
  return GMLP_DEVICE_CALL (self, capture_begin, error);
}

/**
 * gmlp_device_end_capture:
 * @self: a #GmlpDevice
 * @error: return location for a #GError
 *
 * Stops the capture that [method@Gmlp.Device.begin_capture] started and
 * makes the recorded work into a graph. Whether or not it succeeds, @self
 * runs the work enqueued after this call again.
 *
 * Returns: (transfer full): the graph, or %NULL with
 *   %GMLP_ERROR_INVALID_STATE when no capture is in progress, or
 *   %GMLP_ERROR_BACKEND when something recorded broke the capture (for
 *   example a CUDA call made on the device's stream from outside libgmlp
 *   that cannot be captured) or the graph could not be built
 *
 * Since: 0.1
 */
GmlpGraph *
gmlp_device_end_capture (GmlpDevice  *self,
                         GError     **error)
{
  GmlpBackendGraph *graph;

  g_return_val_if_fail (GMLP_IS_DEVICE (self), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!gmlp_device_check_usable (self, error))
    return NULL;
  if (!gmlp_device_is_capturing (self))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE,
                   "No graph capture is in progress on %s", gmlp_device_get_name (self));
      return NULL;
    }

  graph = GMLP_DEVICE_CALL (self, capture_end, error);
  if (graph == NULL)
    return NULL;
  return gmlp_graph_new_for_backend (self, graph);
}

/**
 * gmlp_graph_replay:
 * @self: a #GmlpGraph
 * @error: return location for a #GError
 *
 * Enqueues one replay of the captured work on the device's stream, after the
 * work enqueued so far; like every other call it returns without waiting for
 * the device. Replays of one graph run one after the other.
 *
 * Returns: %TRUE on success; %FALSE with %GMLP_ERROR_INVALID_STATE while the
 *   device is capturing (a graph cannot be replayed inside another capture)
 *   or for a graph that holds no work, or %GMLP_ERROR_BACKEND if the launch
 *   failed
 *
 * Since: 0.1
 */
gboolean
gmlp_graph_replay (GmlpGraph  *self,
                   GError    **error)
{
  g_return_val_if_fail (GMLP_IS_GRAPH (self), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (self->graph == NULL)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE,
                   "This graph holds no captured work: graphs come from "
                   "gmlp_device_end_capture()");
      return FALSE;
    }
  /* Recorded into another graph, the replay would use memory that only
   * this graph keeps alive. */
  if (!gmlp_device_check_not_capturing (self->device, "Replaying a graph", error))
    return FALSE;

  return gmlp_device_get_backend (self->device)->graph_launch (self->graph, error);
}

/**
 * gmlp_graph_get_device:
 * @self: a #GmlpGraph
 *
 * Gets the device whose stream was captured into @self.
 *
 * Returns: (transfer none) (nullable): the device whose stream was
 *   captured, or %NULL for a graph that holds no work
 *
 * Since: 0.1
 */
GmlpDevice *
gmlp_graph_get_device (GmlpGraph *self)
{
  g_return_val_if_fail (GMLP_IS_GRAPH (self), NULL);

  return self->device;
}
