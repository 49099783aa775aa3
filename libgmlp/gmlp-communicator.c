/* gmlp-communicator.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <string.h>

#include "gmlp-communicator-private.h"
#include "gmlp-device-private.h"
#include "gmlp-enum-types.h"
#include "gmlp-error.h"
#include "gmlp-error-private.h"
#include "gmlp-event-private.h"
#include "gmlp-grouped-tensor-private.h"
#include "gmlp-numeric.h"
#include "gmlp-thread-private.h"

/**
 * GmlpCommunicator:
 *
 * One rank of a group of devices that run collectives together: the
 * foundation of expert and data parallelism.
 *
 * A group of `world_size` ranks is named by a unique id, which one rank
 * makes with [func@Gmlp.Communicator.new_unique_id] and hands to the others
 * however it likes (a file, an environment variable, a launcher); each rank
 * then joins with [ctor@Gmlp.Communicator.new], which waits until every
 * rank has joined. On GPUs a rank is a process with one GPU, and the
 * collectives run on NCCL, which the CUDA backend loads at run time
 * (`libnccl.so.2`): without it libgmlp still runs, and a communicator
 * fails with %GMLP_ERROR_UNSUPPORTED. On the CPU the ranks are threads of
 * one process or processes of one machine, each normally with a CPU device
 * of its own (`cpu:0`, `cpu:1`, ...: [ctor@Gmlp.Device.new_from_string]),
 * meeting in shared memory: the same calls, so that the logic of a
 * parallel layer can be tested without a GPU. `gmlp-launch` starts the
 * ranks as processes, which join with
 * [ctor@Gmlp.Communicator.new_from_launcher].
 *
 * The collectives work on [class@Gmlp.GroupedTensor]s of the
 * communicator's device and are ordered on its stream like any other work:
 * they return without waiting for the device (on the CPU, the stream is the
 * calling thread, so they return when the group's work is done). On a GPU
 * they run on a communication stream of the communicator's own, ordered by
 * events: each starts after the work enqueued on the device's stream before
 * the call, and the device's stream waits for it before the work enqueued
 * after. [method@Gmlp.Communicator.all_to_all_start] and
 * [method@Gmlp.Communicator.all_to_all_rows_start] leave that last wait to
 * the caller, as an event, so that the device computes (a shared expert,
 * another micro-batch) while the rows are in flight. Graph captures take
 * both streams (see docs/expert-parallel.md). Every rank
 * must make the same collective calls in the same order, with tensors whose
 * shapes pair up as each call says; bad input on one rank is reported
 * there before anything is enqueued, and the CPU communicator also checks
 * that the ranks' shapes agree (every rank then gets the same error).
 *
 * `GmlpCommunicator` is thread-safe: collectives called from several
 * threads take turns, in the order they reach it (which must be the group's
 * order), and [method@Gmlp.Communicator.abort] may be called from any
 * thread at any time.
 *
 * A rank that errs, leaves or dies must never hang the others: a rank that
 * does not take part in a collective within
 * [property@Gmlp.Communicator:timeout-ms], a call of
 * [method@Gmlp.Communicator.abort] on any rank, or (on the CPU) a rank
 * whose communicator is destroyed or whose process dies, fails the whole
 * group: every waiting
 * and every later call on every rank fails with %GMLP_ERROR_ABORTED, and
 * the ranks make a new group to go on.
 *
 * g_object_new() with the construct properties gives the same object as
 * [ctor@Gmlp.Communicator.new], except that it does not wait for the other
 * ranks: [method@Gio.Initable.init] waits (`comm.init(None)` in Python), or
 * else the first collective does. When joining fails, init and every method
 * fail with the reason. (In Python, make a communicator with
 * `Gmlp.Communicator.new()` or the constructor and `init()`: both let go of
 * the interpreter's lock while they wait, so the ranks can be Python
 * threads.) See `docs/expert-parallel.md`.
 *
 * ## Examples
 *
 * In Python (PyGObject), four ranks as threads on the CPU:
 *
 * ```python
 * import threading
 * import gi
 * gi.require_version('Gmlp', '1.0')
 * from gi.repository import Gmlp
 *
 * uid = Gmlp.Communicator.new_unique_id(Gmlp.Device.new_from_string('cpu'))
 *
 * def rank(r):
 *     dev = Gmlp.Device.new_from_string(f'cpu:{r}')
 *     comm = Gmlp.Communicator.new(dev, uid, r, 4)
 *     grad = Gmlp.GroupedTensor.new_from_floats(dev, Gmlp.DType.FLOAT32, [2], 3,
 *                                              [float(r)] * 6)
 *     comm.all_reduce(grad, Gmlp.ReduceOp.AVERAGE)   # every value 1.5
 *
 * threads = [threading.Thread(target=rank, args=(r,)) for r in range(4)]
 * for t in threads: t.start()
 * for t in threads: t.join()
 * ```
 *
 * In JavaScript (gjs; run with `gjs -m`), a group of one rank (gjs has no
 * threads; a launcher starts one process per GPU):
 *
 * ```js
 * import Gmlp from 'gi://Gmlp?version=1.0';
 *
 * const dev = Gmlp.Device.new_from_string('cpu');
 * const uid = Gmlp.Communicator.new_unique_id(dev);
 * const comm = Gmlp.Communicator.new(dev, uid, 0, 1);
 * const x = Gmlp.GroupedTensor.new_from_floats(dev, Gmlp.DType.FLOAT32, [2], 2, [1, 2, 3, 4]);
 * comm.all_reduce(x, Gmlp.ReduceOp.SUM);
 * print(comm.get_rank(), comm.get_world_size(), x.to_floats());
 * ```
 *
 * Since: 0.1
 */

/* The unique id as the caller sees it: a tag, the backend's name, then the
 * backend's own id, so that an id is refused by another backend's device
 * rather than waited on. */
#define ID_MAGIC        "GMLPCOMM"
#define ID_MAGIC_BYTES  8
#define ID_NAME_BYTES   8
#define ID_BYTES        (ID_MAGIC_BYTES + ID_NAME_BYTES + GMLP_BACKEND_COMM_ID_BYTES)

struct _GmlpCommunicator
{
  GObject             parent_instance;

  GmlpDevice         *device;
  GBytes             *unique_id;
  int                 rank;
  int                 world_size;
  guint               timeout_ms;

  GmlpBackendComm    *comm;
  /* Collectives of one communicator are enqueued one at a time (NCCL's
   * communicators are not thread-safe); abort does not take it. */
  GMutex              call_lock;
  /* Under call_lock: the wait for the other ranks is done (GInitable's
   * init or the first collective waits, never g_object_new()). */
  gboolean            joined;
  GError             *join_error;
  GError             *construct_error;
};

static void gmlp_communicator_initable_iface_init (GInitableIface *iface);

G_DEFINE_FINAL_TYPE_WITH_CODE (GmlpCommunicator, gmlp_communicator, G_TYPE_OBJECT,
                               G_IMPLEMENT_INTERFACE (G_TYPE_INITABLE,
                                                      gmlp_communicator_initable_iface_init))

enum {
  PROP_0,
  PROP_DEVICE,
  PROP_UNIQUE_ID,
  PROP_RANK,
  PROP_WORLD_SIZE,
  PROP_TIMEOUT_MS,
  N_PROPS
};

static GParamSpec *properties[N_PROPS];

static void
gmlp_communicator_finalize (GObject *object)
{
  GmlpCommunicator *self = (GmlpCommunicator *) object;

  if (self->comm != NULL)
    gmlp_device_get_backend (self->device)->comm_free (self->comm);
  g_clear_object (&self->device);
  g_clear_pointer (&self->unique_id, g_bytes_unref);
  g_clear_error (&self->construct_error);
  g_clear_error (&self->join_error);
  g_mutex_clear (&self->call_lock);

  G_OBJECT_CLASS (gmlp_communicator_parent_class)->finalize (object);
}

static void
gmlp_communicator_get_property (GObject    *object,
                                guint       prop_id,
                                GValue     *value,
                                GParamSpec *pspec)
{
  GmlpCommunicator *self = GMLP_COMMUNICATOR (object);

  switch (prop_id)
    {
    case PROP_DEVICE:
      g_value_set_object (value, self->device);
      break;
    case PROP_UNIQUE_ID:
      g_value_set_boxed (value, self->unique_id);
      break;
    case PROP_RANK:
      g_value_set_int (value, self->rank);
      break;
    case PROP_WORLD_SIZE:
      g_value_set_int (value, self->world_size);
      break;
    case PROP_TIMEOUT_MS:
      g_value_set_uint (value, self->timeout_ms);
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
    }
}

/* All construct-only: constructed() checks them together. */
static void
gmlp_communicator_set_property (GObject      *object,
                                guint         prop_id,
                                const GValue *value,
                                GParamSpec   *pspec)
{
  GmlpCommunicator *self = GMLP_COMMUNICATOR (object);

  switch (prop_id)
    {
    case PROP_DEVICE:
      self->device = g_value_dup_object (value);
      break;
    case PROP_UNIQUE_ID:
      self->unique_id = g_value_dup_boxed (value);
      break;
    case PROP_RANK:
      self->rank = g_value_get_int (value);
      break;
    case PROP_WORLD_SIZE:
      self->world_size = g_value_get_int (value);
      break;
    case PROP_TIMEOUT_MS:
      self->timeout_ms = g_value_get_uint (value);
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
    }
}

/* The backend's id inside a caller's id, or NULL with the reason. */
static const guint8 *
parse_unique_id (GBytes      *unique_id,
                 const char  *backend_name,
                 GError     **error)
{
  const guint8 *data;
  gsize size;
  char name[ID_NAME_BYTES + 1] = { 0 };

  if (unique_id == NULL)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "A communicator needs the group's unique id "
                   "(gmlp_communicator_new_unique_id())");
      return NULL;
    }
  data = g_bytes_get_data (unique_id, &size);
  if (size != ID_BYTES || memcmp (data, ID_MAGIC, ID_MAGIC_BYTES) != 0)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "The unique id (%" G_GSIZE_FORMAT " bytes) is not one that "
                   "gmlp_communicator_new_unique_id() made (%d bytes)", size, ID_BYTES);
      return NULL;
    }
  memcpy (name, data + ID_MAGIC_BYTES, ID_NAME_BYTES);
  if (strcmp (name, backend_name) != 0)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "The unique id was made for a %s device, not for a %s one",
                   name, backend_name);
      return NULL;
    }
  return data + ID_MAGIC_BYTES + ID_NAME_BYTES;
}

static gboolean
check_backend (GmlpDevice  *device,
               GError     **error)
{
  const GmlpBackend *backend = gmlp_device_get_backend (device);

  if (backend->comm_init == NULL || backend->comm_join == NULL || backend->comm_unique_id == NULL)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "The %s backend has no communicators", backend->name);
      return FALSE;
    }
  return TRUE;
}

static gboolean
construct_communicator (GmlpCommunicator  *self,
                        GError           **error)
{
  const GmlpBackend *backend;
  const guint8 *id;

  if (self->device == NULL)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT, "A communicator needs a device");
      return FALSE;
    }
  if (!gmlp_device_check_usable (self->device, error) || !check_backend (self->device, error))
    return FALSE;
  backend = gmlp_device_get_backend (self->device);
  id = parse_unique_id (self->unique_id, backend->name, error);
  if (id == NULL)
    return FALSE;
  if (self->world_size < 1)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "A group has at least one rank, not %d", self->world_size);
      return FALSE;
    }
  if (self->rank < 0 || self->rank >= self->world_size)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "Rank %d is not one of a group of %d (0 to %d)",
                   self->rank, self->world_size, self->world_size - 1);
      return FALSE;
    }
  if (self->timeout_ms == 0)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "A communicator's timeout is at least 1 ms");
      return FALSE;
    }

  self->comm = backend->comm_init (gmlp_device_get_backend_device (self->device), id,
                                   self->rank, self->world_size, self->timeout_ms, error);
  return self->comm != NULL;
}

static void
gmlp_communicator_constructed (GObject *object)
{
  GmlpCommunicator *self = GMLP_COMMUNICATOR (object);

  G_OBJECT_CLASS (gmlp_communicator_parent_class)->constructed (object);

  construct_communicator (self, &self->construct_error);
}

/* Waits for the other ranks once (call_lock held); a failure stays. */
static gboolean
join_locked (GmlpCommunicator  *self,
             GError           **error)
{
  if (!self->joined)
    {
      self->joined = TRUE;
      gmlp_device_get_backend (self->device)->comm_join (self->comm, &self->join_error);
    }
  if (self->join_error == NULL)
    return TRUE;
  g_propagate_error (error, g_error_copy (self->join_error));
  return FALSE;
}

/* constructed() has taken the rank; init waits for the others, outside
 * g_object_new(), which a binding may call holding a lock (Python's GIL). */
static gboolean
gmlp_communicator_initable_init (GInitable     *initable,
                                 GCancellable  *cancellable,
                                 GError       **error)
{
  GmlpCommunicator *self = GMLP_COMMUNICATOR (initable);
  g_autoptr(GmlpMutexLocker) locker = NULL;

  if (!gmlp_check_constructed (self, self->construct_error, error))
    return FALSE;
  locker = gmlp_mutex_locker_new (&self->call_lock);
  return join_locked (self, error);
}

static void
gmlp_communicator_initable_iface_init (GInitableIface *iface)
{
  iface->init = gmlp_communicator_initable_init;
}

/* An all-to-all's event holds its tensors under these keys. */
static GQuark send_quark, recv_quark;

static void
gmlp_communicator_class_init (GmlpCommunicatorClass *klass)
{
  GObjectClass *object_class = G_OBJECT_CLASS (klass);
  const GParamFlags construct = G_PARAM_READWRITE | G_PARAM_CONSTRUCT_ONLY |
                                G_PARAM_EXPLICIT_NOTIFY | G_PARAM_STATIC_STRINGS;

  /* The keys of what an all-to-all's event holds, made once here, before
   * any rank's thread looks them up. */
  send_quark = g_quark_from_static_string ("gmlp-all-to-all-send");
  recv_quark = g_quark_from_static_string ("gmlp-all-to-all-recv");

  object_class->constructed = gmlp_communicator_constructed;
  object_class->finalize = gmlp_communicator_finalize;
  object_class->get_property = gmlp_communicator_get_property;
  object_class->set_property = gmlp_communicator_set_property;

  /**
   * GmlpCommunicator:device:
   *
   * The device of this rank: the collectives take tensors on it and run on
   * its stream.
   *
   * Since: 0.1
   */
  properties[PROP_DEVICE] =
    g_param_spec_object ("device", NULL, NULL, GMLP_TYPE_DEVICE, construct);

  /**
   * GmlpCommunicator:unique-id:
   *
   * The id of the group, from [func@Gmlp.Communicator.new_unique_id] on
   * a device of the same kind; every rank of the group is given the same.
   *
   * Since: 0.1
   */
  properties[PROP_UNIQUE_ID] =
    g_param_spec_boxed ("unique-id", NULL, NULL, G_TYPE_BYTES, construct);

  /**
   * GmlpCommunicator:rank:
   *
   * This rank's number in the group, from 0 to
   * [property@Gmlp.Communicator:world-size] − 1.
   *
   * Since: 0.1
   */
  /* Out of range is the construction's GError, not GObject's warning. */
  properties[PROP_RANK] =
    g_param_spec_int ("rank", NULL, NULL, G_MININT, G_MAXINT, 0, construct);

  /**
   * GmlpCommunicator:world-size:
   *
   * The number of ranks in the group.
   *
   * Since: 0.1
   */
  properties[PROP_WORLD_SIZE] =
    g_param_spec_int ("world-size", NULL, NULL, G_MININT, G_MAXINT, 1, construct);

  /**
   * GmlpCommunicator:timeout-ms:
   *
   * How long a rank waits for the others, in milliseconds, to join the
   * group and at each collective, before the group fails with
   * %GMLP_ERROR_ABORTED (at least 1).
   *
   * Since: 0.1
   */
  properties[PROP_TIMEOUT_MS] =
    g_param_spec_uint ("timeout-ms", NULL, NULL, 0, G_MAXUINT,
                       GMLP_COMMUNICATOR_DEFAULT_TIMEOUT_MS, construct);

  g_object_class_install_properties (object_class, N_PROPS, properties);
}

static void
gmlp_communicator_init (GmlpCommunicator *self)
{
  g_mutex_init (&self->call_lock);
  self->world_size = 1;
  self->timeout_ms = GMLP_COMMUNICATOR_DEFAULT_TIMEOUT_MS;
}

/**
 * gmlp_communicator_new_unique_id:
 * @device: (nullable): a device of the kind the group will use, or %NULL
 *   for the default device
 * @error: return location for a #GError
 *
 * Makes the id of a new group, which every rank passes to
 * [ctor@Gmlp.Communicator.new]. On a GPU it is NCCL's unique id (which
 * carries the address where the group meets); on the CPU, random bytes
 * that name a meeting place in shared memory. An id serves one group.
 *
 * Returns: (transfer full): the id, opaque bytes, or %NULL with
 *   %GMLP_ERROR_UNSUPPORTED (NCCL cannot be loaded: the message names the
 *   library) or the device's error
 *
 * Since: 0.1
 */
GBytes *
gmlp_communicator_new_unique_id (GmlpDevice  *device,
                                 GError     **error)
{
  const GmlpBackend *backend;
  guint8 *id;

  g_return_val_if_fail (device == NULL || GMLP_IS_DEVICE (device), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (device == NULL)
    device = gmlp_device_get_default ();
  if (!gmlp_device_check_usable (device, error) || !check_backend (device, error))
    return NULL;

  backend = gmlp_device_get_backend (device);
  id = g_malloc0 (ID_BYTES);
  memcpy (id, ID_MAGIC, ID_MAGIC_BYTES);
  strncpy ((char *) id + ID_MAGIC_BYTES, backend->name, ID_NAME_BYTES);
  if (!backend->comm_unique_id (gmlp_device_get_backend_device (device),
                                id + ID_MAGIC_BYTES + ID_NAME_BYTES, error))
    {
      g_free (id);
      return NULL;
    }
  return g_bytes_new_take (id, ID_BYTES);
}

/**
 * gmlp_communicator_new:
 * @device: this rank's device
 * @unique_id: the group's id, from [func@Gmlp.Communicator.new_unique_id]
 * @rank: this rank's number, 0 to @world_size − 1
 * @world_size: the number of ranks
 * @error: return location for a #GError
 *
 * Joins the group named by @unique_id as rank @rank, and waits until all
 * @world_size ranks have joined (at most
 * [property@Gmlp.Communicator:timeout-ms], by default ten minutes; set it
 * with g_object_new() or g_initable_new()).
 *
 * Returns: (transfer full): the communicator, or %NULL with
 *   %GMLP_ERROR_INVALID_ARGUMENT (a bad rank or world size, an id that is not
 *   one or was made for another kind of device, a rank that joined twice),
 *   %GMLP_ERROR_UNSUPPORTED (no NCCL), or %GMLP_ERROR_ABORTED (a rank did
 *   not join in time, or joined with another world size)
 *
 * Since: 0.1
 */
GmlpCommunicator *
gmlp_communicator_new (GmlpDevice  *device,
                       GBytes      *unique_id,
                       int          rank,
                       int          world_size,
                       GError     **error)
{
  g_return_val_if_fail (GMLP_IS_DEVICE (device), NULL);
  g_return_val_if_fail (unique_id != NULL, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  return g_initable_new (GMLP_TYPE_COMMUNICATOR, NULL, error,
                         "device", device, "unique-id", unique_id,
                         "rank", rank, "world-size", world_size, NULL);
}

/* A variable of the launcher's (its value given: the library reads each
 * by its literal name), or FALSE with the error that names it. */
static gboolean
launcher_variable (const char  *name,
                   const char  *value,
                   GError     **error)
{
  if (value != NULL && *value != '\0')
    return TRUE;
  g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE,
               "%s is not set: the process was not started by gmlp-launch "
               "(which hands each rank GMLP_RANK, GMLP_WORLD_SIZE, GMLP_UNIQUE_ID "
               "and GMLP_DEVICE)", name);
  return FALSE;
}

static gboolean
launcher_number (const char  *name,
                 const char  *value,
                 guint64      min,
                 guint64      max,
                 guint64     *out,
                 GError     **error)
{
  if (!launcher_variable (name, value, error))
    return FALSE;
  if (!g_ascii_string_to_unsigned (value, 10, min, max, out, NULL))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE,
                   "%s is \"%s\", not a number from %" G_GUINT64_FORMAT " to %" G_GUINT64_FORMAT,
                   name, value, min, max);
      return FALSE;
    }
  return TRUE;
}

/**
 * gmlp_communicator_new_from_launcher:
 * @error: return location for a #GError
 *
 * Joins the group of a process started by `gmlp-launch`, as the rank the
 * launcher gave it, on the device it gave it, and waits until every rank
 * has joined, like [ctor@Gmlp.Communicator.new]. The launcher hands each
 * process these environment variables, which are read here and nowhere
 * else in libgmlp (GMLP_DEVICE also picks [func@Gmlp.Device.get_default]):
 *
 * - `GMLP_RANK`: this process's rank, 0 to the world size − 1;
 * - `GMLP_WORLD_SIZE`: the number of ranks;
 * - `GMLP_UNIQUE_ID`: the group's id ([func@Gmlp.Communicator.new_unique_id])
 *   in hexadecimal;
 * - `GMLP_DEVICE`: this rank's device, `cuda:R` or `cpu:R`
 *   ([ctor@Gmlp.Device.new_from_string]);
 * - `GMLP_TIMEOUT_MS` (optional):
 *   [property@Gmlp.Communicator:timeout-ms].
 *
 * The communicator's device is the one [func@Gmlp.Device.get_default]
 * gives in that process: make the rank's tensors there (or on
 * [method@Gmlp.Communicator.get_device]). See `docs/expert-parallel.md`,
 * "Launching N processes".
 *
 * Returns: (transfer full): the communicator, or %NULL with
 *   %GMLP_ERROR_INVALID_STATE (a variable missing or malformed: the message
 *   names it), the device's error, or the errors of
 *   [ctor@Gmlp.Communicator.new]
 *
 * Since: 0.1
 */
GmlpCommunicator *
gmlp_communicator_new_from_launcher (GError **error)
{
  g_autoptr(GmlpDevice) device = NULL;
  g_autoptr(GBytes) uid = NULL;
  const char *world_s = g_getenv ("GMLP_WORLD_SIZE"), *rank_s = g_getenv ("GMLP_RANK");
  const char *hex = g_getenv ("GMLP_UNIQUE_ID"), *spec = g_getenv ("GMLP_DEVICE");
  const char *timeout_s = g_getenv ("GMLP_TIMEOUT_MS");
  guint64 rank, world, timeout_ms = GMLP_COMMUNICATOR_DEFAULT_TIMEOUT_MS;
  gsize len, i;
  guint8 *data;

  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!launcher_number ("GMLP_WORLD_SIZE", world_s, 1, G_MAXINT, &world, error) ||
      !launcher_number ("GMLP_RANK", rank_s, 0, world - 1, &rank, error) ||
      !launcher_variable ("GMLP_UNIQUE_ID", hex, error) ||
      !launcher_variable ("GMLP_DEVICE", spec, error))
    return NULL;
  if (timeout_s != NULL &&
      !launcher_number ("GMLP_TIMEOUT_MS", timeout_s, 1, G_MAXUINT, &timeout_ms, error))
    return NULL;

  len = strlen (hex);
  if (len != 2 * ID_BYTES)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE,
                   "GMLP_UNIQUE_ID has %" G_GSIZE_FORMAT " hexadecimal digits, not %d",
                   len, 2 * ID_BYTES);
      return NULL;
    }
  data = g_malloc (ID_BYTES);
  for (i = 0; i < ID_BYTES; i++)
    {
      int hi = g_ascii_xdigit_value (hex[2 * i]), lo = g_ascii_xdigit_value (hex[2 * i + 1]);

      if (hi < 0 || lo < 0)
        {
          g_free (data);
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE,
                       "GMLP_UNIQUE_ID is not hexadecimal (at digit %" G_GSIZE_FORMAT ")",
                       2 * i + (hi < 0 ? 0 : 1));
          return NULL;
        }
      data[i] = (guint8) (hi << 4 | lo);
    }
  uid = g_bytes_new_take (data, ID_BYTES);

  device = gmlp_device_new_from_string (spec, error);
  if (device == NULL)
    return NULL;
  return g_initable_new (GMLP_TYPE_COMMUNICATOR, NULL, error,
                         "device", device, "unique-id", uid, "rank", (int) rank,
                         "world-size", (int) world, "timeout-ms", (guint) timeout_ms, NULL);
}

/**
 * gmlp_communicator_get_device:
 * @self: a #GmlpCommunicator
 *
 * Gets the device of this rank.
 *
 * Returns: (transfer none) (nullable): the device (%NULL only for an object
 *   made without one)
 *
 * Since: 0.1
 */
GmlpDevice *
gmlp_communicator_get_device (GmlpCommunicator *self)
{
  g_return_val_if_fail (GMLP_IS_COMMUNICATOR (self), NULL);

  return self->device;
}

/**
 * gmlp_communicator_get_rank:
 * @self: a #GmlpCommunicator
 *
 * Gets this rank's number in the group.
 *
 * Returns: the rank, 0 to the world size − 1
 *
 * Since: 0.1
 */
int
gmlp_communicator_get_rank (GmlpCommunicator *self)
{
  g_return_val_if_fail (GMLP_IS_COMMUNICATOR (self), 0);

  return self->rank;
}

/**
 * gmlp_communicator_get_world_size:
 * @self: a #GmlpCommunicator
 *
 * Gets the number of ranks in the group.
 *
 * Returns: the world size
 *
 * Since: 0.1
 */
int
gmlp_communicator_get_world_size (GmlpCommunicator *self)
{
  g_return_val_if_fail (GMLP_IS_COMMUNICATOR (self), 0);

  return self->world_size;
}

/**
 * gmlp_communicator_get_timeout_ms:
 * @self: a #GmlpCommunicator
 *
 * Gets how long this rank waits for the others before the group fails.
 *
 * Returns: the timeout in milliseconds
 *
 * Since: 0.1
 */
guint
gmlp_communicator_get_timeout_ms (GmlpCommunicator *self)
{
  g_return_val_if_fail (GMLP_IS_COMMUNICATOR (self), 0);

  return self->timeout_ms;
}

/**
 * gmlp_communicator_abort:
 * @self: a #GmlpCommunicator
 *
 * Fails the group at once: every collective waiting on any rank, and every
 * later one, fails with %GMLP_ERROR_ABORTED (NCCL's ncclCommAbort() on a
 * GPU). Call it from any thread, also while another thread waits in a
 * collective of @self, for example when this rank has met an error that
 * keeps it from the next collective, so that the others need not wait for
 * their timeout.
 *
 * Since: 0.1
 */
void
gmlp_communicator_abort (GmlpCommunicator *self)
{
  g_return_if_fail (GMLP_IS_COMMUNICATOR (self));

  if (self->comm != NULL)
    gmlp_device_get_backend (self->device)->comm_abort (self->comm);
}

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
  if (!join_locked (self, error))
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
  if (!join_locked (self, error))
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

  if (!join_locked (self, error))
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
  g_object_set_qdata_full (G_OBJECT (result), send_quark, g_object_ref (send), g_object_unref);
  g_object_set_qdata_full (G_OBJECT (result), recv_quark, g_object_ref (recv), g_object_unref);
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
