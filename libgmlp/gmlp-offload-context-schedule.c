/* gmlp-offload-context-schedule.c: what an offload context does to the
 * activations it offloaded
 *
 * Takes the device copy away from the most recently offloaded activations
 * (flush), and reloads offloaded activations ahead of their backward: those
 * saved just before the ones a backward starts on, or those a caller names
 * (prefetch). This is the one part of the context that calls into saved
 * activations; the object, its host memory and the bookkeeping the saved
 * activations report to are in gmlp-offload-context.c, below them.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-offload-context-impl.h"
#include "gmlp-error.h"
#include "gmlp-saved-activations-private.h"
#include "gmlp-thread-private.h"

static void
release_previous (GmlpSavedActivations *previous)
{
  if (previous != NULL)
    {
      gmlp_saved_activations_release_device (previous);
      gmlp_object_unref_shared (previous);
    }
}

/**
 * gmlp_offload_context_flush:
 * @self: a #GmlpOffloadContext
 *
 * Lets go of the device copy that the most recently offloaded activations
 * keep (see [class@Gmlp.OffloadContext]), so that all the context's saved
 * activations are in host memory only; their backward will then reload
 * them.
 *
 * Since: 0.1
 */
void
gmlp_offload_context_flush (GmlpOffloadContext *self)
{
  GmlpSavedActivations *previous;

  g_return_if_fail (GMLP_IS_OFFLOAD_CONTEXT (self));

  gmlp_mutex_lock (&self->lock);
  previous = gmlp_offload_context_swap_recent (self, NULL);
  gmlp_mutex_unlock (&self->lock);
  release_previous (previous);
}

void
gmlp_offload_context_backward_started (GmlpOffloadContext   *self,
                                       GmlpSavedActivations *saved)
{
  /* Dropped after the lock: the last reference may go with them. */
  g_autoptr(GPtrArray) passed = g_ptr_array_new_with_free_func (gmlp_object_unref_shared);
  GmlpSavedActivations *previous = NULL;
  GList *l;

  gmlp_mutex_lock (&self->lock);
  l = gmlp_offload_context_find_offloaded (self, saved);
  /* The activations saved just before these, still in host memory. */
  for (l = l != NULL ? l->prev : NULL; l != NULL; l = l->prev)
    {
      GmlpSavedActivations *candidate = g_weak_ref_get (&((Offloaded *) l->data)->ref);

      if (candidate == NULL)
        continue;
      if (gmlp_saved_activations_is_on_host (candidate))
        {
          previous = candidate;
          break;
        }
      g_ptr_array_add (passed, candidate);
    }
  gmlp_mutex_unlock (&self->lock);

  if (previous != NULL)
    {
      g_autoptr(GError) error = NULL;

      /* A failed prefetch is retried, with its error, by that backward. */
      if (!gmlp_saved_activations_reload (previous, TRUE, &error))
        g_debug ("Prefetch failed: %s", error->message);
      gmlp_object_unref_shared (previous);
    }
}

/**
 * gmlp_offload_context_prefetch:
 * @self: a #GmlpOffloadContext
 * @saved: activations this context offloaded
 * @error: return location for a #GError
 *
 * Starts copying @saved back to the device now, on the copy stream, for
 * callers who drive their own schedule. Does nothing if they are on the
 * device already.
 *
 * Returns: %TRUE on success; %FALSE with %GMLP_ERROR_INVALID_ARGUMENT if
 *   another context offloaded @saved
 *
 * Since: 0.1
 */
gboolean
gmlp_offload_context_prefetch (GmlpOffloadContext    *self,
                               GmlpSavedActivations  *saved,
                               GError               **error)
{
  g_return_val_if_fail (GMLP_IS_OFFLOAD_CONTEXT (self), FALSE);
  g_return_val_if_fail (GMLP_IS_SAVED_ACTIVATIONS (saved), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_saved_activations_get_offload (saved))
    return TRUE;
  if (gmlp_saved_activations_get_context (saved) != self)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "These activations were not offloaded by this context");
      return FALSE;
    }
  return gmlp_saved_activations_reload (saved, TRUE, error);
}
