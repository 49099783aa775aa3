/* gmlp-device.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <gio/gio.h>

#include <stdlib.h>
#include <string.h>

#include "gmlp-device-private.h"
#include "gmlp-enum-types.h"
#include "gmlp-error.h"
#include "gmlp-error-private.h"
#include "gmlp-thread-private.h"
#include "gmlp-tuning-private.h"

/**
 * GmlpDevice:
 *
 * A compute device: the host CPU or one NVIDIA GPU.
 *
 * There is one `GmlpDevice` per compute device in a process:
 * [ctor@Gmlp.Device.new] returns the same object for the same kind and
 * ordinal. Each device owns a stream, on which all its work is ordered, and a
 * stream-ordered memory pool from which grouped tensors are allocated. Calls
 * return without waiting for the device unless they return host data;
 * [method@Gmlp.Device.synchronize] waits for everything enqueued so far.
 *
 * A build with the CUDA backend still runs on machines without an NVIDIA
 * driver: the CPU then serves, and asking for a CUDA device fails with
 * %GMLP_ERROR_NO_DEVICE.
 *
 * The work enqueued on a GPU's stream can also be recorded into a
 * [class@Gmlp.Graph] and replayed ([method@Gmlp.Device.begin_capture]).
 *
 * g_object_new() with the construct properties
 * [property@Gmlp.Device:kind] and [property@Gmlp.Device:ordinal]
 * (`Gmlp.Device(kind=Gmlp.DeviceKind.CUDA)` in Python) gives the same object
 * as [ctor@Gmlp.Device.new]; when that device cannot be opened, the object's
 * methods fail with the reason, as [iface@Gio.Initable]'s init does.
 * `GmlpDevice` is thread-safe. Every thread that uses a device shares its
 * stream, its pool and, on a GPU, its cuBLAS handles and workspaces: the
 * calls of several threads are enqueued in the order they reach the
 * device, each call's launches kept together. On the CPU the stream is the
 * calling thread, so the threads' work runs at once. A capture records what
 * every thread enqueues on the device.
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
 * dev = Gmlp.Device.get_default()   # GMLP_DEVICE=cpu, cuda or cuda:1 chooses
 * print(dev.get_name(), dev.get_kind().value_nick,
 *       Gmlp.Device.get_count(Gmlp.DeviceKind.CUDA), 'GPUs')
 * cpu = Gmlp.Device.new_from_string('cpu')
 * cpu.synchronize()
 * ```
 *
 * In JavaScript (gjs; run with `gjs -m`):
 *
 * ```js
 * import GLib from 'gi://GLib';
 * import Gmlp from 'gi://Gmlp?version=1.0';
 *
 * const dev = Gmlp.Device.get_default();  // GMLP_DEVICE=cpu, cuda or cuda:1 chooses
 * print(dev.get_name(), Gmlp.Device.get_count(Gmlp.DeviceKind.CUDA), 'GPUs');
 * const cpu = Gmlp.Device.new_from_string('cpu');
 * cpu.synchronize();
 * ```
 *
 * Since: 0.1
 */

struct _GmlpDevice
{
  GObject             parent_instance;

  GmlpDeviceKind      kind;
  int                 ordinal;
  char               *name;
  const GmlpBackend  *backend;
  GmlpBackendDevice  *backend_device;
  gssize              bytes_in_use;   /* atomic; pointer-sized for g_atomic_pointer_add */
  int                 capture_serial; /* atomic: the number of captures begun */
  GError             *construct_error;
  GmlpBackendTuning   tuning;         /* under tuning_lock; zeros when opened
                                       * (block-cache off with
                                       * GMLP_DEBUG=no-block-cache) */
  GMutex              sizes_lock;
  GHashTable         *sizes;          /* under sizes_lock: GBytes of host sizes → device copy */
};

static void gmlp_device_initable_iface_init (GInitableIface *iface);

G_DEFINE_FINAL_TYPE_WITH_CODE (GmlpDevice, gmlp_device, G_TYPE_OBJECT,
                               G_IMPLEMENT_INTERFACE (G_TYPE_INITABLE,
                                                      gmlp_device_initable_iface_init))

enum {
  PROP_0,
  PROP_KIND,
  PROP_ORDINAL,
  PROP_NAME,
  N_PROPS
};

static GParamSpec *properties[N_PROPS];

static void
gmlp_device_finalize (GObject *object)
{
  GmlpDevice *self = (GmlpDevice *) object;

  if (self->sizes != NULL)
    {
      GHashTableIter iter;
      gpointer data;

      g_hash_table_iter_init (&iter, self->sizes);
      while (g_hash_table_iter_next (&iter, NULL, &data))
        self->backend->free (self->backend_device, data);
      g_clear_pointer (&self->sizes, g_hash_table_unref);
    }
  g_mutex_clear (&self->sizes_lock);
  if (self->backend_device != NULL)
    self->backend->close_device (self->backend_device);
  g_clear_pointer (&self->name, g_free);
  g_clear_error (&self->construct_error);

  G_OBJECT_CLASS (gmlp_device_parent_class)->finalize (object);
}

static void
gmlp_device_get_property (GObject    *object,
                          guint       prop_id,
                          GValue     *value,
                          GParamSpec *pspec)
{
  GmlpDevice *self = GMLP_DEVICE (object);

  switch (prop_id)
    {
    case PROP_KIND:
      g_value_set_enum (value, self->kind);
      break;
    case PROP_ORDINAL:
      g_value_set_int (value, self->ordinal);
      break;
    case PROP_NAME:
      g_value_set_string (value, self->name);
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
    }
}

static void
gmlp_device_set_property (GObject      *object,
                          guint         prop_id,
                          const GValue *value,
                          GParamSpec   *pspec)
{
  GmlpDevice *self = GMLP_DEVICE (object);

  switch (prop_id)
    {
    case PROP_KIND:
      self->kind = g_value_get_enum (value);
      break;
    case PROP_ORDINAL:
      self->ordinal = g_value_get_int (value);
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
    }
}

static gboolean open_device (GmlpDevice  *self,
                             GError     **error);

/* The CPU's ordinals: cpu:0 .. cpu:255. */
#define GMLP_CPU_MAX_ORDINALS 256

/* The process-wide registry: devices are created once and live as long as
 * the process, like the streams and pools they own. */
static GMutex registry_lock;
static GHashTable *registry;

static gpointer
registry_key (GmlpDeviceKind kind,
              int            ordinal)
{
  return GINT_TO_POINTER (((int) kind << 16) | (ordinal & 0xffff));
}

/* One object per device, also for g_object_new(): the constructor returns
 * the device's object when it exists, and opens the device otherwise. The
 * registry lock is held throughout, so two threads open a device once. */
static GObject *
gmlp_device_constructor (GType                  type,
                         guint                  n_construct_properties,
                         GObjectConstructParam *construct_properties)
{
  g_autoptr(GmlpMutexLocker) locker = gmlp_mutex_locker_new (&registry_lock);
  GmlpDeviceKind kind = GMLP_DEVICE_KIND_CPU;
  int ordinal = 0;
  GmlpDevice *self;
  guint i;

  for (i = 0; i < n_construct_properties; i++)
    {
      const char *name = construct_properties[i].pspec->name;

      if (g_str_equal (name, "kind"))
        kind = g_value_get_enum (construct_properties[i].value);
      else if (g_str_equal (name, "ordinal"))
        ordinal = g_value_get_int (construct_properties[i].value);
    }

  if (registry == NULL)
    registry = g_hash_table_new (NULL, NULL);
  self = g_hash_table_lookup (registry, registry_key (kind, ordinal));
  if (self != NULL)
    return g_object_ref (G_OBJECT (self));

  self = GMLP_DEVICE (G_OBJECT_CLASS (gmlp_device_parent_class)->constructor (
                        type, n_construct_properties, construct_properties));
  if (open_device (self, &self->construct_error))
    g_hash_table_insert (registry, registry_key (kind, ordinal), g_object_ref (self));
  else
    self->name = g_strdup_printf ("%s:%d (not usable)",
                                  kind == GMLP_DEVICE_KIND_CUDA ? "cuda" : "cpu", ordinal);
  return G_OBJECT (self);
}

static gboolean
gmlp_device_initable_init (GInitable     *initable,
                           GCancellable  *cancellable,
                           GError       **error)
{
  return gmlp_device_check_usable (GMLP_DEVICE (initable), error);
}

static void
gmlp_device_initable_iface_init (GInitableIface *iface)
{
  iface->init = gmlp_device_initable_init;
}

gboolean
gmlp_device_check_usable (GmlpDevice  *self,
                          GError     **error)
{
  if (G_LIKELY (self->backend_device != NULL))
    return TRUE;
  return gmlp_check_constructed (self, self->construct_error, error);
}

static void
gmlp_device_class_init (GmlpDeviceClass *klass)
{
  GObjectClass *object_class = G_OBJECT_CLASS (klass);
  const GParamFlags construct = G_PARAM_READWRITE | G_PARAM_CONSTRUCT_ONLY |
                                G_PARAM_EXPLICIT_NOTIFY | G_PARAM_STATIC_STRINGS;

  object_class->constructor = gmlp_device_constructor;
  object_class->finalize = gmlp_device_finalize;
  object_class->get_property = gmlp_device_get_property;
  object_class->set_property = gmlp_device_set_property;

  /**
   * GmlpDevice:kind:
   *
   * Whether this is the CPU or a CUDA GPU.
   *
   * Since: 0.1
   */
  properties[PROP_KIND] =
    g_param_spec_enum ("kind", NULL, NULL,
                       GMLP_TYPE_DEVICE_KIND, GMLP_DEVICE_KIND_CPU, construct);

  /**
   * GmlpDevice:ordinal:
   *
   * The index of the device among those of its kind (0 for the CPU).
   *
   * Since: 0.1
   */
  /* Negative values are the construction's GError, not GObject's warning. */
  properties[PROP_ORDINAL] =
    g_param_spec_int ("ordinal", NULL, NULL, G_MININT, G_MAXINT, 0, construct);

  /**
   * GmlpDevice:name:
   *
   * A human-readable name, such as "NVIDIA H200" or "cpu".
   *
   * Since: 0.1
   */
  properties[PROP_NAME] =
    g_param_spec_string ("name", NULL, NULL,
                         NULL,
                         G_PARAM_READABLE | G_PARAM_EXPLICIT_NOTIFY | G_PARAM_STATIC_STRINGS);

  g_object_class_install_properties (object_class, N_PROPS, properties);
}

static void
gmlp_device_init (GmlpDevice *self)
{
  g_mutex_init (&self->sizes_lock);
}

static const GmlpBackend *
backend_for_kind (GmlpDeviceKind kind)
{
  switch (kind)
    {
    case GMLP_DEVICE_KIND_CPU:
      return gmlp_backend_cpu_get ();
    case GMLP_DEVICE_KIND_CUDA:
      return gmlp_backend_cuda_load ();
    default:
      return NULL;
    }
}

/**
 * gmlp_device_get_count:
 * @kind: a [enum@Gmlp.DeviceKind]
 *
 * Counts the usable devices of @kind: 1 for the CPU (which opens under the
 * ordinals 0 to 255 too, see [ctor@Gmlp.Device.new_from_string]); for CUDA,
 * the GPUs the driver reports, or 0 when there is no driver or no CUDA
 * backend.
 *
 * Returns: the number of devices
 *
 * Since: 0.1
 */
int
gmlp_device_get_count (GmlpDeviceKind kind)
{
  const GmlpBackend *backend = backend_for_kind (kind);

  return backend != NULL ? backend->get_device_count () : 0;
}

/* Opens the device of self->kind and self->ordinal (the constructor holds
 * the registry lock). */
static gboolean
open_device (GmlpDevice  *self,
             GError     **error)
{
  const GmlpBackend *backend;
  int count;

  if (self->kind != GMLP_DEVICE_KIND_CPU && self->kind != GMLP_DEVICE_KIND_CUDA)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "Unknown device kind %d", (int) self->kind);
      return FALSE;
    }

  backend = backend_for_kind (self->kind);
  if (backend == NULL)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_NO_DEVICE,
                   "No CUDA backend: libgmlp was built without CUDA, or "
                   "libgmlp-backend-cuda or the CUDA libraries could not be loaded");
      return FALSE;
    }

  /* The CPU opens under several ordinals, each a device of its own with
   * its own stream (the calling thread), so that one process can hold the
   * ranks of an in-process communicator; it still counts as one device. */
  count = self->kind == GMLP_DEVICE_KIND_CPU ? GMLP_CPU_MAX_ORDINALS : backend->get_device_count ();
  if (self->ordinal < 0 || self->ordinal >= count)
    {
      if (count == 0)
        g_set_error (error, GMLP_ERROR, GMLP_ERROR_NO_DEVICE,
                     "No usable %s device (no NVIDIA driver or no GPU)", backend->name);
      else
        g_set_error (error, GMLP_ERROR, GMLP_ERROR_NO_DEVICE,
                     "No %s device %d: there are %d", backend->name, self->ordinal, count);
      return FALSE;
    }

  self->backend_device = backend->open_device (self->ordinal, error);
  if (self->backend_device == NULL)
    return FALSE;
  self->backend = backend;
  self->name = backend->get_device_name (self->backend_device);
  /* A leak check at exit (compute-sanitizer's) would count the blocks that
   * the cache keeps for reuse, since the registry never closes a device. */
  if (gmlp_debug_flags () & GMLP_DEBUG_NO_BLOCK_CACHE)
    {
      self->tuning.block_cache = GMLP_TUNING_NEVER;
      if (backend->set_tuning != NULL)
        backend->set_tuning (self->backend_device, &self->tuning);
    }
  return TRUE;
}

/**
 * gmlp_device_new:
 * @kind: the kind of device
 * @ordinal: its index among the devices of @kind
 * @error: return location for a #GError
 *
 * Gets the device of @kind with index @ordinal, opening it on first use. The
 * same object is returned for the same device every time. The CPU takes
 * the ordinals 0 to 255, each a device of its own (for the ranks of an
 * in-process [class@Gmlp.Communicator]).
 *
 * Returns: (transfer full): the device, or %NULL with %GMLP_ERROR_NO_DEVICE
 *
 * Since: 0.1
 */
GmlpDevice *
gmlp_device_new (GmlpDeviceKind   kind,
                 int              ordinal,
                 GError         **error)
{
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  /* GObject would warn about a kind out of the enumeration's range. */
  if (kind != GMLP_DEVICE_KIND_CPU && kind != GMLP_DEVICE_KIND_CUDA)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "Unknown device kind %d", (int) kind);
      return NULL;
    }

  return g_initable_new (GMLP_TYPE_DEVICE, NULL, error, "kind", kind, "ordinal", ordinal, NULL);
}

/**
 * gmlp_device_new_from_string:
 * @spec: "cpu", "cpu:N", "cuda" or "cuda:N"
 * @error: return location for a #GError
 *
 * Parses a device specification, as the `GMLP_DEVICE` environment variable
 * takes, and gets that device. "cpu:N" (N from 0 to 255) is the CPU under
 * ordinal N: a device object of its own, as the ranks of an in-process
 * [class@Gmlp.Communicator] want ("cpu" is "cpu:0").
 *
 * Returns: (transfer full): the device, or %NULL with an error
 *
 * Since: 0.1
 */
GmlpDevice *
gmlp_device_new_from_string (const char  *spec,
                             GError     **error)
{
  g_autofree char *shown = NULL;

  g_return_val_if_fail (spec != NULL, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  /* Messages are UTF-8, whatever the caller passed. */
  shown = g_utf8_make_valid (spec, -1);

  if (g_ascii_strcasecmp (spec, "cpu") == 0)
    return gmlp_device_new (GMLP_DEVICE_KIND_CPU, 0, error);
  if (g_ascii_strcasecmp (spec, "cuda") == 0)
    return gmlp_device_new (GMLP_DEVICE_KIND_CUDA, 0, error);
  if (g_ascii_strncasecmp (spec, "cuda:", 5) == 0 || g_ascii_strncasecmp (spec, "cpu:", 4) == 0)
    {
      gboolean cpu = g_ascii_strncasecmp (spec, "cpu:", 4) == 0;
      guint64 ordinal;

      if (!g_ascii_string_to_unsigned (spec + (cpu ? 4 : 5), 10, 0, G_MAXINT16, &ordinal, NULL))
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                       "Invalid device ordinal in \"%s\"", shown);
          return NULL;
        }
      return gmlp_device_new (cpu ? GMLP_DEVICE_KIND_CPU : GMLP_DEVICE_KIND_CUDA, (int) ordinal, error);
    }

  g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
               "Invalid device \"%s\": expected cpu, cpu:N, cuda or cuda:N", shown);
  return NULL;
}

static gpointer
choose_default_device (gpointer data)
{
  g_autoptr(GError) error = NULL;
  const char *spec = g_getenv ("GMLP_DEVICE");
  GmlpDevice *device = NULL;

  if (spec != NULL && spec[0] != '\0')
    {
      device = gmlp_device_new_from_string (spec, &error);
      if (device == NULL)
        g_warning ("GMLP_DEVICE=%s: %s; using the CPU", spec, error->message);
    }
  else if (gmlp_device_get_count (GMLP_DEVICE_KIND_CUDA) > 0)
    {
      device = gmlp_device_new (GMLP_DEVICE_KIND_CUDA, 0, &error);
      if (device == NULL)
        g_debug ("CUDA device 0 unusable: %s; using the CPU", error->message);
    }

  if (device == NULL)
    device = gmlp_device_new (GMLP_DEVICE_KIND_CPU, 0, NULL);

  return device;
}

/**
 * gmlp_device_get_default:
 *
 * Gets the default device: the device named by the `GMLP_DEVICE` environment
 * variable (`cpu`, `cuda` or `cuda:N`) if it is set, else the first usable
 * CUDA GPU, else the CPU. The choice is made once per process.
 *
 * Returns: (transfer none): the default device
 *
 * Since: 0.1
 */
GmlpDevice *
gmlp_device_get_default (void)
{
  static GOnce once = G_ONCE_INIT;

  return g_once (&once, choose_default_device, NULL);
}

/**
 * gmlp_device_get_kind:
 * @self: a #GmlpDevice
 *
 * Gets whether @self is the CPU or a CUDA device.
 *
 * Returns: the kind of device
 *
 * Since: 0.1
 */
GmlpDeviceKind
gmlp_device_get_kind (GmlpDevice *self)
{
  g_return_val_if_fail (GMLP_IS_DEVICE (self), GMLP_DEVICE_KIND_CPU);

  return self->kind;
}

/**
 * gmlp_device_get_ordinal:
 * @self: a #GmlpDevice
 *
 * Gets the index of @self among the devices of its kind (the `1` of `cuda:1`;
 * 0 for the CPU).
 *
 * Returns: the index of the device among those of its kind
 *
 * Since: 0.1
 */
int
gmlp_device_get_ordinal (GmlpDevice *self)
{
  g_return_val_if_fail (GMLP_IS_DEVICE (self), 0);

  return self->ordinal;
}

/**
 * gmlp_device_get_name:
 * @self: a #GmlpDevice
 *
 * Gets a name for @self that people can read, such as the GPU's product name.
 *
 * Returns: (transfer none): the device's name
 *
 * Since: 0.1
 */
const char *
gmlp_device_get_name (GmlpDevice *self)
{
  g_return_val_if_fail (GMLP_IS_DEVICE (self), NULL);

  return self->name;
}

/**
 * gmlp_device_get_bytes_in_use:
 * @self: a #GmlpDevice
 *
 * Counts the bytes of device memory that libgmlp objects hold on @self now
 * (allocations from the device's pool that have not been released).
 *
 * Returns: bytes in use
 *
 * Since: 0.1
 */
guint64
gmlp_device_get_bytes_in_use (GmlpDevice *self)
{
  g_return_val_if_fail (GMLP_IS_DEVICE (self), 0);

  return (guint64) g_atomic_pointer_get ((gpointer *) &self->bytes_in_use);
}

/**
 * gmlp_device_synchronize:
 * @self: a #GmlpDevice
 * @error: return location for a #GError
 *
 * Waits until all work enqueued on the device has completed: its stream and
 * the copies of offloaded activations.
 *
 * Returns: %TRUE on success; %FALSE with %GMLP_ERROR_BACKEND if the device
 *   reported an error, or %GMLP_ERROR_INVALID_STATE while @self is capturing
 *   a graph
 *
 * Since: 0.1
 */
gboolean
gmlp_device_synchronize (GmlpDevice  *self,
                         GError     **error)
{
  g_return_val_if_fail (GMLP_IS_DEVICE (self), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_device_check_usable (self, error) ||
      !gmlp_device_check_not_capturing (self, "Synchronizing", error))
    return FALSE;
  return self->backend->synchronize (self->backend_device, error);
}

/**
 * gmlp_device_is_capturing:
 * @self: a #GmlpDevice
 *
 * Tells whether work enqueued on @self's stream is being captured into a
 * [class@Gmlp.Graph] rather than run.
 *
 * Returns: %TRUE between [method@Gmlp.Device.begin_capture] and
 *   [method@Gmlp.Device.end_capture]
 *
 * Since: 0.1
 */
gboolean
gmlp_device_is_capturing (GmlpDevice *self)
{
  g_return_val_if_fail (GMLP_IS_DEVICE (self), FALSE);

  return self->backend_device != NULL && self->backend->is_capturing (self->backend_device);
}

gboolean
gmlp_device_check_not_capturing (GmlpDevice  *self,
                                 const char  *what,
                                 GError     **error)
{
  if (!self->backend->is_capturing (self->backend_device))
    return TRUE;

  g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE,
               "%s cannot be captured in a graph, and %s is capturing one "
               "(docs/graphs.md says what can be)", what, self->name);
  return FALSE;
}

void
gmlp_device_bump_capture_serial (GmlpDevice *self)
{
  g_atomic_int_inc (&self->capture_serial);
}

guint
gmlp_device_get_capture_serial (GmlpDevice *self)
{
  if (!self->backend->is_capturing (self->backend_device))
    return 0;
  return (guint) g_atomic_int_get (&self->capture_serial);
}

gboolean
gmlp_device_has_captured (GmlpDevice *self)
{
  return g_atomic_int_get (&self->capture_serial) > 0;
}

/* Bounds of the sizes kept by gmlp_device_get_uploaded_sizes(): a step
 * makes a few layouts of host sizes (the tokens of a layer, its experts'
 * rows), the same from step to step. */
#define MAX_KEPT_SIZES        256
#define MAX_KEPT_SIZES_GROUPS 1024

gboolean
gmlp_device_get_uploaded_sizes (GmlpDevice     *self,
                                const gint64   *rows,
                                guint           n_groups,
                                gconstpointer  *device_rows,
                                GError        **error)
{
  g_autoptr(GmlpMutexLocker) locker = NULL;
  g_autoptr(GBytes) key = NULL;
  gsize nbytes = sizeof (gint64) * n_groups;
  gpointer data;

  *device_rows = NULL;
  if (n_groups == 0 || n_groups > MAX_KEPT_SIZES_GROUPS)
    return TRUE;

  locker = gmlp_mutex_locker_new (&self->sizes_lock);
  if (self->sizes == NULL)
    self->sizes = g_hash_table_new_full (g_bytes_hash, g_bytes_equal,
                                         (GDestroyNotify) g_bytes_unref, NULL);
  key = g_bytes_new_static (rows, nbytes);
  data = g_hash_table_lookup (self->sizes, key);
  /* Memory allocated during a capture belongs to its graph's table. */
  if (data == NULL && g_hash_table_size (self->sizes) < MAX_KEPT_SIZES &&
      !self->backend->is_capturing (self->backend_device))
    {
      data = self->backend->alloc (self->backend_device, nbytes, error);
      if (data == NULL)
        return FALSE;
      if (!self->backend->upload (self->backend_device, data, rows, nbytes, error))
        {
          self->backend->free (self->backend_device, data);
          return FALSE;
        }
      g_hash_table_insert (self->sizes, g_bytes_new (rows, nbytes), data);
    }
  *device_rows = data;
  return TRUE;
}

const GmlpBackend *
gmlp_device_get_backend (GmlpDevice *self)
{
  return self->backend;
}

GmlpBackendDevice *
gmlp_device_get_backend_device (GmlpDevice *self)
{
  return self->backend_device;
}

/* ---- Tuning (gmlp-tuning-private.h) ------------------------------------ */

static GMutex tuning_lock;

/* Changes self's tuning by change (key and value, or a spec) and hands
 * the result to the backend, under tuning_lock so that two threads' changes
 * reach it in the order they are made. */
static gboolean
change_tuning (GmlpDevice  *self,
               const char  *key,
               const char  *value,
               const char  *spec,
               GError     **error)
{
  g_autoptr(GmlpMutexLocker) locker = NULL;
  GmlpBackendTuning tuning;

  g_return_val_if_fail (GMLP_IS_DEVICE (self), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_device_check_usable (self, error))
    return FALSE;
  locker = gmlp_mutex_locker_new (&tuning_lock);
  tuning = self->tuning;
  if (key != NULL ? !gmlp_tuning_set (&tuning, key, value, error)
                  : !gmlp_tuning_parse (&tuning, spec, error))
    return FALSE;
  self->tuning = tuning;
  if (self->backend->set_tuning != NULL)
    self->backend->set_tuning (self->backend_device, &tuning);
  return TRUE;
}

gboolean
gmlp_device_set_tuning (GmlpDevice  *self,
                        const char  *key,
                        const char  *value,
                        GError     **error)
{
  g_return_val_if_fail (key != NULL, FALSE);

  return change_tuning (self, key, value, NULL, error);
}

gboolean
gmlp_device_apply_tuning (GmlpDevice  *self,
                          const char  *spec,
                          GError     **error)
{
  return change_tuning (self, NULL, NULL, spec != NULL ? spec : "", error);
}

char *
gmlp_device_get_tuning (GmlpDevice  *self,
                        const char  *key,
                        GError     **error)
{
  g_autoptr(GmlpMutexLocker) locker = NULL;

  g_return_val_if_fail (GMLP_IS_DEVICE (self), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  locker = gmlp_mutex_locker_new (&tuning_lock);
  return gmlp_tuning_get (&self->tuning, key, error);
}

/* Parsed once, like G_DEBUG: "help" lists the keys, "all" sets them all.
 * The bit above the keys tells a parsed value from the initial zero. */
GmlpDebugFlags
gmlp_debug_flags (void)
{
  static const GDebugKey keys[] = {
    { "poison", GMLP_DEBUG_POISON },
    { "no-block-cache", GMLP_DEBUG_NO_BLOCK_CACHE },
  };
  static gsize flags = 0;

  if (g_once_init_enter (&flags))
    {
      guint parsed = g_parse_debug_string (g_getenv ("GMLP_DEBUG"), keys, G_N_ELEMENTS (keys));

      g_once_init_leave (&flags, (gsize) parsed | ((gsize) 1 << 31));
    }
  return (GmlpDebugFlags) (flags & G_MAXINT);
}

/* Fills fresh memory with 0xff bytes. While capturing, a fill would be
 * recorded and redone by every replay, over what an upload (which happens at
 * once during a capture, docs/graphs.md) put there meanwhile: the poison is
 * uploaded instead, once. */
static gboolean
poison_buffer (GmlpDevice  *device,
               gpointer     data,
               gsize        nbytes,
               GError     **error)
{
  g_autofree guint8 *poison = NULL;

  if (!device->backend->is_capturing (device->backend_device))
    return device->backend->fill_bytes (device->backend_device, data, 0xff, nbytes, error);

  poison = g_malloc (nbytes);
  memset (poison, 0xff, nbytes);
  return device->backend->upload (device->backend_device, data, poison, nbytes, error);
}

GmlpBuffer *
gmlp_buffer_new (GmlpDevice  *device,
                 gsize        nbytes,
                 GError     **error)
{
  gpointer data;

  g_return_val_if_fail (GMLP_IS_DEVICE (device), NULL);

  if (!gmlp_device_check_usable (device, error))
    return NULL;
  data = device->backend->alloc (device->backend_device, nbytes, error);
  if (data == NULL)
    return NULL;

  /* With GMLP_DEBUG=poison (the test suites set it), fresh memory holds
   * 0xff bytes (NaN in every floating type), so an output that a kernel
   * forgot to write shows up in the tests. */
  if (nbytes > 0 && (gmlp_debug_flags () & GMLP_DEBUG_POISON) && !poison_buffer (device, data, nbytes, error))
    {
      device->backend->free (device->backend_device, data);
      return NULL;
    }

  return gmlp_buffer_new_wrapped (device, data, nbytes);
}

struct _GmlpVersionCounter
{
  gatomicrefcount ref_count;  /* its buffer holds one */
  gsize           value;      /* atomic */
};

/* A buffer and its version counter in one allocation. The counter may
 * outlive the buffer (saved activations name the storage by it), so the
 * allocation goes with the counter's last reference. */
typedef struct {
  GmlpVersionCounter counter;   /* first: the allocation's address */
  GmlpBuffer         buffer;
} BufferBlock;

G_STATIC_ASSERT (G_STRUCT_OFFSET (BufferBlock, counter) == 0);

GmlpVersionCounter *
gmlp_version_counter_ref (GmlpVersionCounter *counter)
{
  g_atomic_ref_count_inc (&counter->ref_count);
  return counter;
}

void
gmlp_version_counter_unref (GmlpVersionCounter *counter)
{
  /* The whole BufferBlock, its buffer gone already. */
  if (g_atomic_ref_count_dec (&counter->ref_count))
    g_free (counter);
}

guint64
gmlp_version_counter_get (GmlpVersionCounter *counter)
{
  return (guint64) GPOINTER_TO_SIZE (g_atomic_pointer_get ((gpointer *) &counter->value));
}

void
gmlp_version_counter_bump (GmlpVersionCounter *counter)
{
  g_atomic_pointer_add ((gpointer *) &counter->value, 1);
}

gboolean
gmlp_spans_overlap (const GmlpSpan *a,
                    const GmlpSpan *b)
{
  if (a->storage == NULL || a->storage != b->storage || a->nbytes == 0 || b->nbytes == 0)
    return FALSE;
  return a->offset < b->offset + b->nbytes && b->offset < a->offset + a->nbytes;
}

static GmlpBuffer *
buffer_new (GmlpDevice *device,
            gpointer    data,
            gsize       nbytes)
{
  BufferBlock *block = g_new0 (BufferBlock, 1);
  GmlpBuffer *buffer = &block->buffer;

  g_atomic_ref_count_init (&block->counter.ref_count);
  /* g_atomic_int_*, which ThreadSanitizer sees: the last unref frees the
   * memory that other threads used (gmlp-thread-private.h). */
  g_atomic_int_set (&buffer->ref_count, 1);
  buffer->device = g_object_ref (device);
  buffer->data = data;
  buffer->nbytes = nbytes;
  buffer->version = &block->counter;
  return buffer;
}

GmlpBuffer *
gmlp_buffer_new_wrapped (GmlpDevice *device,
                         gpointer    data,
                         gsize       nbytes)
{
  g_atomic_pointer_add ((gpointer *) &device->bytes_in_use, (gssize) nbytes);
  return buffer_new (device, data, nbytes);
}

GmlpBuffer *
gmlp_buffer_new_foreign (GmlpDevice     *device,
                         gpointer        data,
                         gsize           nbytes,
                         GDestroyNotify  release,
                         gpointer        release_data)
{
  GmlpBuffer *buffer = buffer_new (device, data, nbytes);

  buffer->release = release;
  buffer->release_data = release_data;
  return buffer;
}

void
gmlp_buffer_mark_copied (GmlpBuffer *buffer)
{
  g_atomic_int_set (&buffer->copied, 1);
}

GmlpBuffer *
gmlp_buffer_ref (GmlpBuffer *buffer)
{
  g_atomic_int_inc (&buffer->ref_count);
  return buffer;
}

void
gmlp_buffer_unref (GmlpBuffer *buffer)
{
  GmlpDevice *device;

  if (!g_atomic_int_dec_and_test (&buffer->ref_count))
    return;

  device = buffer->device;
  if (buffer->release != NULL)
    {
      /* The owner may reuse the memory at once: nothing of ours may still
       * read or write it. A failure here has no one to report to. */
      device->backend->synchronize (device->backend_device, NULL);
      buffer->release (buffer->release_data);
      g_object_unref (device);
      gmlp_version_counter_unref (buffer->version);   /* may free buffer */
      return;
    }
  if (g_atomic_int_get (&buffer->copied))
    device->backend->free_after_copies (device->backend_device, buffer->data);
  else
    device->backend->free (device->backend_device, buffer->data);
  g_atomic_pointer_add ((gpointer *) &device->bytes_in_use, -(gssize) buffer->nbytes);
  g_object_unref (device);
  gmlp_version_counter_unref (buffer->version);   /* may free buffer */
}
