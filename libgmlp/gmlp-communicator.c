/* gmlp-communicator.c: one rank of a group of devices
 *
 * The object: its type, properties and construction, the unique id, the
 * rank joining its group (once, outside g_object_new()), the launcher's
 * environment, abort. Its collectives (all-reduce, all-gather, all-to-all
 * of spans and of rows) are in gmlp-communicator-collectives.c, which
 * calls the join and the event's hold here.
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
gboolean
gmlp_communicator_join_locked (GmlpCommunicator  *self,
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
  return gmlp_communicator_join_locked (self, error);
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

/* An all-to-all's event holds its tensors until it is dropped, under keys
 * made at class init. */
void
gmlp_communicator_event_hold (GmlpEvent         *event,
                              GmlpGroupedTensor *send,
                              GmlpGroupedTensor *recv)
{
  g_object_set_qdata_full (G_OBJECT (event), send_quark, g_object_ref (send), g_object_unref);
  g_object_set_qdata_full (G_OBJECT (event), recv_quark, g_object_ref (recv), g_object_unref);
}
