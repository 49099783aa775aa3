/* gmlp-backend.c: finding the backends
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <gmodule.h>

#include "gmlp-backend.h"

#define CUDA_MODULE_NAME "gmlp-backend-cuda"
#define CUDA_ENTRY_POINT "gmlp_backend_cuda_get"

static const GmlpBackend *
load_cuda_backend (void)
{
  g_autofree char *path = NULL;
  const char *dir;
  GmlpBackendGetFunc get_backend = NULL;
  const GmlpBackend *backend;
  GModule *module;

  /* GMLP_BACKEND_DIR lets the test suite and uninstalled builds point at the
   * module in the build tree. */
  dir = g_getenv ("GMLP_BACKEND_DIR");
  if (dir == NULL || dir[0] == '\0')
    dir = GMLP_BACKEND_DIR;

  path = g_module_build_path (dir, CUDA_MODULE_NAME);
  module = g_module_open (path, G_MODULE_BIND_LAZY | G_MODULE_BIND_LOCAL);
  if (module == NULL)
    {
      g_debug ("CUDA backend not loaded: %s", g_module_error ());
      return NULL;
    }

  if (!g_module_symbol (module, CUDA_ENTRY_POINT, (gpointer *) &get_backend) ||
      get_backend == NULL)
    {
      g_warning ("%s has no %s: %s", path, CUDA_ENTRY_POINT, g_module_error ());
      g_module_close (module);
      return NULL;
    }

  backend = get_backend ();
  if (backend == NULL || backend->abi_version != GMLP_BACKEND_ABI_VERSION)
    {
      g_warning ("%s was built for backend ABI %d, this libgmlp needs %d",
                 path, backend ? backend->abi_version : -1, GMLP_BACKEND_ABI_VERSION);
      g_module_close (module);
      return NULL;
    }

  /* The CUDA runtime keeps state that must outlive every device object. */
  g_module_make_resident (module);
  return backend;
}

const GmlpBackend *
gmlp_backend_cuda_load (void)
{
  static gsize once = 0;
  static const GmlpBackend *backend = NULL;

  if (g_once_init_enter (&once))
    {
      backend = load_cuda_backend ();
      g_once_init_leave (&once, 1);
    }

  return backend;
}
