/* gmlp-saved-activations.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-saved-activations-private.h"
#include "gmlp-error.h"

/**
 * GmlpSavedActivations:
 *
 * What a layer's forward keeps for its backward: the tensors the gradients
 * need. Each forward returns its own, so several microbatches can be in
 * flight; each is consumed by exactly one backward of the layer that made it
 * (a second use, or use with another layer, is an error).
 *
 * The saved tensors are references to the forward's inputs and intermediates:
 * do not write into a tensor you passed to a forward until its backward has
 * run.
 *
 * Since: 0.1
 */

struct _GmlpSavedActivations
{
  GObject      parent_instance;

  guint64      owner_id;
  GHashTable  *tensors;     /* name → GmlpGroupedTensor */
  gboolean     offload;
  gboolean     consumed;
};

G_DEFINE_FINAL_TYPE (GmlpSavedActivations, gmlp_saved_activations, G_TYPE_OBJECT)

enum {
  PROP_0,
  PROP_OFFLOAD,
  PROP_CONSUMED,
  N_PROPS
};

static GParamSpec *properties[N_PROPS];

static void
gmlp_saved_activations_finalize (GObject *object)
{
  GmlpSavedActivations *self = (GmlpSavedActivations *) object;

  g_clear_pointer (&self->tensors, g_hash_table_unref);

  G_OBJECT_CLASS (gmlp_saved_activations_parent_class)->finalize (object);
}

static void
gmlp_saved_activations_get_property (GObject    *object,
                                     guint       prop_id,
                                     GValue     *value,
                                     GParamSpec *pspec)
{
  GmlpSavedActivations *self = GMLP_SAVED_ACTIVATIONS (object);

  switch (prop_id)
    {
    case PROP_OFFLOAD:
      g_value_set_boolean (value, self->offload);
      break;
    case PROP_CONSUMED:
      g_value_set_boolean (value, self->consumed);
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
    }
}

static void
gmlp_saved_activations_class_init (GmlpSavedActivationsClass *klass)
{
  GObjectClass *object_class = G_OBJECT_CLASS (klass);

  object_class->finalize = gmlp_saved_activations_finalize;
  object_class->get_property = gmlp_saved_activations_get_property;

  /**
   * GmlpSavedActivations:offload:
   *
   * Whether the forward that made these activations was told to offload
   * them to host memory.
   *
   * Since: 0.1
   */
  properties[PROP_OFFLOAD] =
    g_param_spec_boolean ("offload", NULL, NULL, FALSE,
                          G_PARAM_READABLE | G_PARAM_EXPLICIT_NOTIFY | G_PARAM_STATIC_STRINGS);

  /**
   * GmlpSavedActivations:consumed:
   *
   * Whether a backward has used these activations already.
   *
   * Since: 0.1
   */
  properties[PROP_CONSUMED] =
    g_param_spec_boolean ("consumed", NULL, NULL, FALSE,
                          G_PARAM_READABLE | G_PARAM_EXPLICIT_NOTIFY | G_PARAM_STATIC_STRINGS);

  g_object_class_install_properties (object_class, N_PROPS, properties);
}

static void
gmlp_saved_activations_init (GmlpSavedActivations *self)
{
  self->tensors = g_hash_table_new_full (g_str_hash, g_str_equal, NULL, g_object_unref);
}

guint64
gmlp_layer_id_next (void)
{
  static gint64 last_id = 0;

  return (guint64) g_atomic_pointer_add ((gpointer *) &last_id, 1) + 1;
}

GmlpSavedActivations *
gmlp_saved_activations_new (guint64 owner_id)
{
  GmlpSavedActivations *self = g_object_new (GMLP_TYPE_SAVED_ACTIVATIONS, NULL);

  self->owner_id = owner_id;
  return self;
}

void
gmlp_saved_activations_add (GmlpSavedActivations *self,
                            const char           *name,
                            GmlpGroupedTensor    *tensor)
{
  g_hash_table_replace (self->tensors, (gpointer) name, g_object_ref (tensor));
}

GmlpGroupedTensor *
gmlp_saved_activations_get (GmlpSavedActivations *self,
                            const char           *name)
{
  return g_hash_table_lookup (self->tensors, name);
}

gboolean
gmlp_saved_activations_check (GmlpSavedActivations  *self,
                              guint64                owner_id,
                              const char            *layer_name,
                              GError               **error)
{
  if (self->owner_id != owner_id)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "These saved activations come from another layer's forward, not this %s's",
                   layer_name);
      return FALSE;
    }
  if (self->consumed)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE,
                   "These saved activations were already used by a backward");
      return FALSE;
    }
  return TRUE;
}

void
gmlp_saved_activations_consume (GmlpSavedActivations *self)
{
  g_hash_table_remove_all (self->tensors);
  self->consumed = TRUE;
  g_object_notify_by_pspec (G_OBJECT (self), properties[PROP_CONSUMED]);
}

/**
 * gmlp_saved_activations_get_offload:
 * @self: a #GmlpSavedActivations
 *
 * Returns: the value of [property@Gmlp.SavedActivations:offload]
 *
 * Since: 0.1
 */
gboolean
gmlp_saved_activations_get_offload (GmlpSavedActivations *self)
{
  g_return_val_if_fail (GMLP_IS_SAVED_ACTIVATIONS (self), FALSE);

  return self->offload;
}

/**
 * gmlp_saved_activations_is_consumed:
 * @self: a #GmlpSavedActivations
 *
 * Returns: the value of [property@Gmlp.SavedActivations:consumed]
 *
 * Since: 0.1
 */
gboolean
gmlp_saved_activations_is_consumed (GmlpSavedActivations *self)
{
  g_return_val_if_fail (GMLP_IS_SAVED_ACTIVATIONS (self), FALSE);

  return self->consumed;
}

/**
 * gmlp_saved_activations_get_nbytes:
 * @self: a #GmlpSavedActivations
 *
 * Counts the bytes of device storage the saved tensors span (a tensor saved
 * twice counts once).
 *
 * Returns: the number of bytes; 0 once consumed
 *
 * Since: 0.1
 */
guint64
gmlp_saved_activations_get_nbytes (GmlpSavedActivations *self)
{
  g_autoptr(GHashTable) seen = g_hash_table_new (NULL, NULL);
  GHashTableIter iter;
  gpointer tensor;
  guint64 total = 0;

  g_return_val_if_fail (GMLP_IS_SAVED_ACTIVATIONS (self), 0);

  g_hash_table_iter_init (&iter, self->tensors);
  while (g_hash_table_iter_next (&iter, NULL, &tensor))
    if (g_hash_table_add (seen, tensor))
      total += gmlp_grouped_tensor_get_nbytes (tensor);
  return total;
}
