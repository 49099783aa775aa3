/* gmlp-dlpack-python.c: the destructor of the DLPack capsules that the
 * PyGObject overrides make
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
} PythonApi;

static gpointer
find_python_api (gpointer data)
{
  PythonApi *api = g_new0 (PythonApi, 1);
  GModule *self = g_module_open (NULL, 0);

  if (self == NULL ||
      !g_module_symbol (self, "PyCapsule_IsValid", (gpointer *) &api->capsule_is_valid) ||
      !g_module_symbol (self, "PyCapsule_GetPointer", (gpointer *) &api->capsule_get_pointer) ||
      (!(g_module_symbol (self, "PyErr_GetRaisedException", (gpointer *) &api->get_raised) &&
         g_module_symbol (self, "PyErr_SetRaisedException", (gpointer *) &api->set_raised)) &&
       !(g_module_symbol (self, "PyErr_Fetch", (gpointer *) &api->fetch) &&
         g_module_symbol (self, "PyErr_Restore", (gpointer *) &api->restore))))
    g_error ("gmlp_dlpack_capsule_destructor() called outside a Python interpreter");
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
void
gmlp_dlpack_capsule_destructor (gpointer capsule)
{
  static GOnce once = G_ONCE_INIT;
  const PythonApi *api = g_once (&once, find_python_api, NULL);
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
