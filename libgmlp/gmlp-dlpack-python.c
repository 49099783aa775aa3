/* gmlp-dlpack-python.c: the Python side of DLPack: the destructor of the
 * capsules that the PyGObject overrides make, and the guard that imports
 * from Python producers go through
 *
 * A consumer that refuses an exported tensor (numpy and bfloat16, say) drops
 * the capsule with its exception pending. A destructor written in Python
 * (a ctypes callback) cannot run then, so it is this C function. Python's
 * own functions are looked up in the running interpreter, so libgmlp needs
 * no Python to build or to load.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <gmodule.h>

#include "gmlp-grouped-tensor.h"
#include <dlpack/dlpack.h>

typedef struct {
  int   (*capsule_is_valid)    (gpointer capsule, const char *name);
  void *(*capsule_get_pointer) (gpointer capsule, const char *name);
  /* Python 3.12 and later; before, fetch and restore. */
  void *(*get_raised)          (void);
  void  (*set_raised)          (void *exception);
  void  (*fetch)               (void **type, void **value, void **traceback);
  void  (*restore)             (void *type, void *value, void *traceback);
  int   (*gil_ensure)          (void);
  void  (*gil_release)         (int state);
  int   (*is_initialized)      (void);
} PythonApi;

static gpointer
find_python_api (gpointer data)
{
  PythonApi *api = g_new0 (PythonApi, 1);
  GModule *self = g_module_open (NULL, 0);

  if (self == NULL ||
      !g_module_symbol (self, "PyCapsule_IsValid", (gpointer *) &api->capsule_is_valid) ||
      !g_module_symbol (self, "PyCapsule_GetPointer", (gpointer *) &api->capsule_get_pointer) ||
      !g_module_symbol (self, "PyGILState_Ensure", (gpointer *) &api->gil_ensure) ||
      !g_module_symbol (self, "PyGILState_Release", (gpointer *) &api->gil_release) ||
      !g_module_symbol (self, "Py_IsInitialized", (gpointer *) &api->is_initialized) ||
      (!(g_module_symbol (self, "PyErr_GetRaisedException", (gpointer *) &api->get_raised) &&
         g_module_symbol (self, "PyErr_SetRaisedException", (gpointer *) &api->set_raised)) &&
       !(g_module_symbol (self, "PyErr_Fetch", (gpointer *) &api->fetch) &&
         g_module_symbol (self, "PyErr_Restore", (gpointer *) &api->restore))))
    g_error ("libgmlp's DLPack capsule functions called outside a Python interpreter");
  /* The main program's module stays open for the life of the process. */
  return api;
}

/**
 * gmlp_dlpack_capsule_destructor: (skip)
 * @capsule: a `PyObject *` capsule made around
 *   [method@Gmlp.GroupedTensor.to_dlpack]'s result, named "dltensor"
 *
 * The `PyCapsule_Destructor` of the capsules that libgmlp's PyGObject
 * overrides export: a capsule that no consumer took (still named
 * "dltensor") calls its tensor's deleter; one that a consumer took (renamed
 * "used_dltensor") is the consumer's to delete. Call it only from Python,
 * with the GIL held, as Python calls a capsule's destructor.
 *
 * Since: 0.1
 */
static const PythonApi *
python_api (void)
{
  static GOnce once = G_ONCE_INIT;

  return g_once (&once, find_python_api, NULL);
}

void
gmlp_dlpack_capsule_destructor (gpointer capsule)
{
  const PythonApi *api = python_api ();
  void *raised = NULL, *type = NULL, *value = NULL, *traceback = NULL;

  /* Set aside the exception the consumer may have raised, so that the
   * capsule calls below see none. */
  if (api->get_raised != NULL)
    raised = api->get_raised ();
  else
    api->fetch (&type, &value, &traceback);

  if (api->capsule_is_valid (capsule, "dltensor"))
    {
      DLManagedTensor *managed = api->capsule_get_pointer (capsule, "dltensor");

      managed->deleter (managed);
    }

  if (api->get_raised != NULL)
    api->set_raised (raised);
  else
    api->restore (type, value, traceback);
}

/* A Python producer's DLManagedTensor behind one whose deleter holds the
 * GIL: a GroupedTensor may release it on any thread, with or without it. */
typedef struct {
  DLManagedTensor  managed;
  DLManagedTensor *inner;
} PythonGuard;

static void
python_guard_delete (DLManagedTensor *managed)
{
  PythonGuard *guard = managed->manager_ctx;
  const PythonApi *api = python_api ();

  /* After the interpreter's end the producer's objects are gone with it. */
  if (guard->inner->deleter != NULL && api->is_initialized ())
    {
      int state = api->gil_ensure ();

      guard->inner->deleter (guard->inner);
      api->gil_release (state);
    }
  g_free (guard);
}

/**
 * gmlp_dlpack_python_guard: (skip)
 * @dlpack: a `DLManagedTensor *` taken from a Python producer's "dltensor"
 *   capsule
 *
 * Wraps a Python producer's DLPack tensor for
 * gmlp_grouped_tensor_new_from_dlpack(), as the PyGObject overrides'
 * `from_dlpack()` does: the result describes the same tensor, and its
 * deleter takes the GIL around @dlpack's deleter, which a consumer may
 * otherwise call on any thread (numpy's touches Python objects). The result
 * owns @dlpack: rename the capsule "used_dltensor", and call the result's
 * deleter if the import fails.
 *
 * Returns: (transfer full): a `DLManagedTensor *`
 *
 * Since: 0.1
 */
gpointer
gmlp_dlpack_python_guard (gpointer dlpack)
{
  PythonGuard *guard;

  g_return_val_if_fail (dlpack != NULL, NULL);

  guard = g_new0 (PythonGuard, 1);
  guard->inner = dlpack;
  guard->managed.dl_tensor = guard->inner->dl_tensor;
  guard->managed.manager_ctx = guard;
  guard->managed.deleter = python_guard_delete;
  return &guard->managed;
}
