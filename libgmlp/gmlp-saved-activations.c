/* gmlp-saved-activations.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-saved-activations-private.h"
#include "gmlp-device-private.h"
#include "gmlp-error.h"
#include "gmlp-event-private.h"
#include "gmlp-grouped-tensor-private.h"
#include "gmlp-offload-context-private.h"
#include "gmlp-quantizer-private.h"
#include "gmlp-thread-private.h"

/**
 * GmlpSavedActivations:
 *
 * What a layer's forward keeps for its backward: the tensors the gradients
 * need. Each forward returns its own, so several microbatches can be in
 * flight; each is consumed by exactly one backward of the layer that made it
 * (a second use, or use with another layer, is an error).
 *
 * Under an enabled [class@Gmlp.OffloadContext] every saved tensor is copied
 * to host memory after the forward and brought back for the backward; see
 * [property@Gmlp.SavedActivations:offload].
 *
 * The saved tensors are references to the forward's inputs and intermediates.
 * A backward checks that nothing it reads (those tensors, the layer's
 * weights) has been written since its forward (see
 * [method@Gmlp.GroupedTensor.get_version]) and fails with
 * %GMLP_ERROR_INVALID_STATE otherwise, offloaded or not. A backward that
 * fails for another reason (a wrong output gradient, memory) leaves them
 * unused, for a retry.
 *
 * A saved FP8 tensor made by a [class@Gmlp.Quantizer] moves with every part
 * of it: its data, its scale inverses and its columnwise copy with that
 * copy's scales, and comes back as the same quantized tensor. The FP8 copy
 * of the weights that an FP8 layer keeps for its backward stays on the
 * device (it is not an activation); it counts in
 * [method@Gmlp.SavedActivations.get_nbytes].
 *
 * Saved activations are thread-safe: they may go to another thread for
 * their backward, and the offload context may reload them or take their
 * device copy away from other threads meanwhile. Of several backwards that
 * race for them, one uses them and the others fail with
 * %GMLP_ERROR_INVALID_STATE.
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
 * layer = Gmlp.GroupedLinear.new(dev, 2, 16, 8)
 * x = Gmlp.GroupedTensor.new(dev, Gmlp.DType.FLOAT32, [4, 4], 16)
 * y1, saved1 = layer.forward(x)      # two microbatches in flight
 * y2, saved2 = layer.forward(x)
 * layer.backward(saved2, y2)
 * layer.backward(saved1, y1)
 * print(saved1.is_consumed(), saved1.get_host_nbytes())
 * ```
 *
 * In JavaScript (gjs; run with `gjs -m`):
 *
 * ```js
 * import GLib from 'gi://GLib';
 * import Gmlp from 'gi://Gmlp?version=1.0';
 *
 * const dev = Gmlp.Device.get_default();
 * const layer = Gmlp.GroupedLinear.new(dev, 2, 16, 8);
 * const x = Gmlp.GroupedTensor.new(dev, Gmlp.DType.FLOAT32, [4, 4], 16);
 * const [y1, saved1] = layer.forward(x);  // two microbatches in flight
 * const [y2, saved2] = layer.forward(x);
 * layer.backward(saved2, y2);
 * layer.backward(saved1, y1);
 * print(saved1.is_consumed(), saved1.get_host_nbytes());
 * ```
 *
 * Since: 0.1
 */

/* One saved tensor: on the device (tensor), in host memory (host, with the
 * layout to rebuild it), or both while the most recently offloaded
 * activations keep their device copy.
 *
 * A quantized tensor (FP8 with scales, see gmlp-quantizer-private.h) is
 * saved as one entry for its data and one per other part (name NULL: the
 * scale inverses, the columnwise copy and its scales when they are its
 * own), so that offload moves every byte; get() puts it back together.
 * Resident entries are never offloaded. */
typedef struct {
  const char         *name;           /* NULL for a part of a quantized tensor */
  GmlpGroupedTensor  *tensor;
  GmlpTensorLayout    layout;
  gpointer            host;
  gsize               host_size;
  GmlpEvent          *offload_done;
  GmlpEvent          *reload_done;    /* not yet waited for by the compute stream */
  gboolean            resident;
  /* Quantized tensors: the recipe, its flags and the indices of the parts'
   * entries (-1: none). */
  gboolean            quantized;
  GmlpScalingRecipe   recipe;
  int                 quantize_flags;
  int                 scale_inv_part;
  int                 columnwise_part;
  int                 columnwise_scale_inv_part;
} SavedTensor;

struct _GmlpSavedActivations
{
  GObject             parent_instance;

  guint64             owner_id;
  /* Guards tensors and children: once offloaded, the activations are the
   * offload context's too, and a forward or backward on another thread may
   * take their device copy away (release_device()) or start their reload
   * (a prefetch) while their own backward runs. */
  GMutex              lock;
  GArray             *tensors;        /* SavedTensor */
  GmlpOffloadContext *context;        /* the context that offloaded them */
  GPtrArray          *children;       /* GmlpSavedActivations of sub-layers */
  GArray             *versions;       /* GmlpVersionRecord of what the forward read */
  gboolean            offload;
  int                 consumed;       /* atomic */
  int                 on_host;        /* atomic: a reload is needed */
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
saved_tensor_clear (GmlpSavedActivations *self,
                    SavedTensor          *saved)
{
  g_clear_pointer (&saved->tensor, gmlp_object_unref_shared);
  if (saved->host != NULL)
    gmlp_offload_context_give_host (self->context, saved->host, saved->host_size,
                                    saved->offload_done);
  saved->host = NULL;
  gmlp_tensor_layout_clear (&saved->layout);
  g_clear_object (&saved->offload_done);
  g_clear_object (&saved->reload_done);
}

static void
release_tensors (GmlpSavedActivations *self)
{
  guint i;

  for (i = 0; i < self->tensors->len; i++)
    saved_tensor_clear (self, &g_array_index (self->tensors, SavedTensor, i));
  g_array_set_size (self->tensors, 0);
  g_ptr_array_set_size (self->children, 0);
  g_array_set_size (self->versions, 0);
}

/* Whether a tensor waits in host memory alone; lock held. */
static void
update_on_host (GmlpSavedActivations *self)
{
  gboolean on_host = FALSE;
  guint i;

  for (i = 0; i < self->tensors->len && !on_host; i++)
    {
      SavedTensor *saved = &g_array_index (self->tensors, SavedTensor, i);
      on_host = saved->host != NULL && saved->tensor == NULL;
    }
  g_atomic_int_set (&self->on_host, on_host);
}

static void
gmlp_saved_activations_finalize (GObject *object)
{
  GmlpSavedActivations *self = (GmlpSavedActivations *) object;

  /* The last reference may go on any thread: after the other threads' use
   * (gmlp_object_unref_shared(), and the lock). */
  gmlp_tsan_acquire (self);
  gmlp_mutex_lock (&self->lock);
  release_tensors (self);
  gmlp_mutex_unlock (&self->lock);
  if (self->context != NULL)
    gmlp_offload_context_forget (self->context, self);
  g_clear_pointer (&self->tensors, g_array_unref);
  g_clear_pointer (&self->children, g_ptr_array_unref);
  g_clear_pointer (&self->versions, g_array_unref);
  g_clear_pointer (&self->context, gmlp_object_unref_shared);
  g_mutex_clear (&self->lock);

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
      g_value_set_boolean (value, g_atomic_int_get (&self->consumed));
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
   * them by the innermost [class@Gmlp.OffloadContext] of its thread (on
   * every backend, so nesting can be checked anywhere).
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
  g_mutex_init (&self->lock);
  self->tensors = g_array_new (FALSE, TRUE, sizeof (SavedTensor));
  self->children = g_ptr_array_new_with_free_func (gmlp_object_unref_shared);
  self->versions = gmlp_version_records_new ();
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

/* Appends an entry and returns its index. */
static int
append_entry (GmlpSavedActivations *self,
              const char           *name,
              GmlpGroupedTensor    *tensor,
              gboolean              resident)
{
  SavedTensor saved = { 0, };

  saved.name = name;
  saved.tensor = g_object_ref (tensor);
  saved.resident = resident;
  saved.scale_inv_part = saved.columnwise_part = saved.columnwise_scale_inv_part = -1;
  g_array_append_val (self->tensors, saved);
  return (int) self->tensors->len - 1;
}

void
gmlp_saved_activations_add (GmlpSavedActivations *self,
                            const char           *name,
                            GmlpGroupedTensor    *tensor)
{
  GmlpGroupedTensor *scale_inv = gmlp_grouped_tensor_get_scale_inv (tensor);
  GmlpGroupedTensor *columnwise, *columnwise_scale_inv;
  int index, scale_part, columnwise_part = -1, columnwise_scale_part = -1;
  SavedTensor *saved;

  gmlp_mutex_lock (&self->lock);
  index = append_entry (self, name, tensor, FALSE);
  gmlp_version_records_add (self->versions, name, "forward", tensor);
  if (scale_inv == NULL)
    {
      gmlp_mutex_unlock (&self->lock);
      return;
    }

  /* A quantized tensor: its parts are entries of their own. The columnwise
   * copy shares the rowwise scales in per-tensor recipes and 128 × 128
   * tiles: they are saved once. */
  scale_part = append_entry (self, NULL, scale_inv, FALSE);
  gmlp_version_records_add (self->versions, name, "forward", scale_inv);
  columnwise = gmlp_grouped_tensor_get_columnwise (tensor);
  if (columnwise != NULL)
    {
      columnwise_part = append_entry (self, NULL, columnwise, FALSE);
      gmlp_version_records_add (self->versions, name, "forward", columnwise);
      columnwise_scale_inv = gmlp_grouped_tensor_get_scale_inv (columnwise);
      if (columnwise_scale_inv == scale_inv)
        {
          columnwise_scale_part = scale_part;
        }
      else
        {
          columnwise_scale_part = append_entry (self, NULL, columnwise_scale_inv, FALSE);
          gmlp_version_records_add (self->versions, name, "forward", columnwise_scale_inv);
        }
    }

  saved = &g_array_index (self->tensors, SavedTensor, index);
  saved->quantized = TRUE;
  saved->recipe = gmlp_grouped_tensor_get_scaling_recipe (tensor);
  saved->quantize_flags = gmlp_grouped_tensor_get_quantize_flags (tensor);
  saved->scale_inv_part = scale_part;
  saved->columnwise_part = columnwise_part;
  saved->columnwise_scale_inv_part = columnwise_scale_part;
  gmlp_mutex_unlock (&self->lock);
}

static void
version_record_clear (gpointer data)
{
  GmlpVersionRecord *record = data;

  g_clear_pointer (&record->span.storage, gmlp_version_counter_unref);
}

GArray *
gmlp_version_records_new (void)
{
  GArray *records = g_array_new (FALSE, TRUE, sizeof (GmlpVersionRecord));

  g_array_set_clear_func (records, version_record_clear);
  return records;
}

void
gmlp_version_records_add (GArray            *records,
                          const char        *name,
                          const char        *reader,
                          GmlpGroupedTensor *tensor)
{
  GmlpVersionRecord record = { name, reader, { NULL, 0, 0 }, 0 };

  gmlp_grouped_tensor_get_span (tensor, &record.span);
  if (record.span.storage == NULL)
    return;
  gmlp_version_counter_ref (record.span.storage);
  record.seen = gmlp_version_counter_get (record.span.storage);
  g_array_append_val (records, record);
}

gboolean
gmlp_version_records_check (GArray      *records,
                            const char  *layer,
                            GError     **error)
{
  guint i;

  for (i = 0; i < records->len; i++)
    {
      GmlpVersionRecord *record = &g_array_index (records, GmlpVersionRecord, i);
      guint64 now = gmlp_version_counter_get (record->span.storage);

      if (now == record->seen)
        continue;
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE,
                   "%s: the %s was written after the %s read it (its version is %" G_GUINT64_FORMAT
                   ", the %s read version %" G_GUINT64_FORMAT "), so these gradients would not be "
                   "those of the forward; run the forward again", layer, record->name,
                   record->reader, now, record->reader, record->seen);
      return FALSE;
    }
  return TRUE;
}

const GmlpVersionRecord *
gmlp_version_records_find_overlap (GArray         *records,
                                   const GmlpSpan *span)
{
  guint i;

  for (i = 0; i < records->len; i++)
    if (gmlp_spans_overlap (&g_array_index (records, GmlpVersionRecord, i).span, span))
      return &g_array_index (records, GmlpVersionRecord, i);
  return NULL;
}

void
gmlp_saved_activations_watch (GmlpSavedActivations *self,
                              const char           *name,
                              GmlpGroupedTensor    *tensor)
{
  gmlp_version_records_add (self->versions, name, "forward", tensor);
}

gboolean
gmlp_saved_activations_check_versions (GmlpSavedActivations  *self,
                                       const char            *layer,
                                       GError               **error)
{
  return gmlp_version_records_check (self->versions, layer, error);
}

gboolean
gmlp_saved_activations_check_versions_deep (GmlpSavedActivations  *self,
                                            const char            *layer,
                                            GError               **error)
{
  guint i;

  if (!gmlp_version_records_check (self->versions, layer, error))
    return FALSE;
  for (i = 0; i < self->children->len; i++)
    if (!gmlp_saved_activations_check_versions_deep (g_ptr_array_index (self->children, i), layer,
                                                     error))
      return FALSE;
  return TRUE;
}

GArray *
gmlp_saved_activations_get_versions (GmlpSavedActivations *self)
{
  return self->versions;
}

void
gmlp_saved_activations_copy_versions (GmlpSavedActivations *self,
                                      const char           *name,
                                      GArray               *records)
{
  guint i;

  for (i = 0; i < self->versions->len; i++)
    {
      GmlpVersionRecord record = g_array_index (self->versions, GmlpVersionRecord, i);

      if (!g_str_equal (record.name, name))
        continue;
      gmlp_version_counter_ref (record.span.storage);
      g_array_append_val (records, record);
    }
}

void
gmlp_saved_activations_add_resident (GmlpSavedActivations *self,
                                     const char           *name,
                                     GmlpGroupedTensor    *tensor)
{
  gmlp_mutex_lock (&self->lock);
  append_entry (self, name, tensor, TRUE);
  gmlp_mutex_unlock (&self->lock);
}

void
gmlp_saved_activations_add_child (GmlpSavedActivations *self,
                                  GmlpSavedActivations *child)
{
  gmlp_mutex_lock (&self->lock);
  g_ptr_array_add (self->children, g_object_ref (child));
  gmlp_mutex_unlock (&self->lock);
}

GmlpSavedActivations *
gmlp_saved_activations_get_child (GmlpSavedActivations *self,
                                  guint                 index)
{
  GmlpSavedActivations *child;

  gmlp_mutex_lock (&self->lock);
  child = g_ptr_array_index (self->children, index);
  gmlp_mutex_unlock (&self->lock);
  return child;
}

static SavedTensor *
find (GmlpSavedActivations *self,
      const char           *name)
{
  guint i;

  for (i = 0; i < self->tensors->len; i++)
    {
      const char *entry = g_array_index (self->tensors, SavedTensor, i).name;

      if (entry != NULL && g_str_equal (entry, name))
        return &g_array_index (self->tensors, SavedTensor, i);
    }
  return NULL;
}

gboolean
gmlp_saved_activations_apply_offload (GmlpSavedActivations  *self,
                                      GError               **error)
{
  GmlpOffloadContext *context;
  GmlpSavedActivations *previous;
  GmlpDevice *device;
  gboolean enabled;
  guint64 total = 0;
  guint i;

  context = gmlp_offload_context_peek_innermost (&enabled);
  if (context == NULL || !enabled)
    return TRUE;
  /* The copies run on the copy stream, outside any graph, into host memory
   * that is handed out again: nothing a replay could repeat. */
  if (!gmlp_device_check_not_capturing (gmlp_offload_context_get_device (context),
                                        "Offloading saved activations (disable the offload "
                                        "context around the capture)", error))
    return FALSE;

  gmlp_mutex_lock (&self->lock);
  self->offload = TRUE;
  self->context = g_object_ref (context);
  device = gmlp_offload_context_get_device (context);

  for (i = 0; i < self->tensors->len; i++)
    {
      SavedTensor *saved = &g_array_index (self->tensors, SavedTensor, i);
      GmlpBackendEvent *done;
      GmlpBuffer *buffer;

      g_assert (saved->tensor != NULL);
      g_assert (gmlp_grouped_tensor_get_device (saved->tensor) == device);
      if (saved->resident)
        continue;

      gmlp_grouped_tensor_get_layout (saved->tensor, &saved->layout);
      saved->host = gmlp_offload_context_take_host (context, saved->layout.nbytes,
                                                    &saved->host_size, error);
      if (saved->host == NULL)
        goto fail;
      /* After the forward that wrote it: the copy waits for the compute
       * stream. The device memory goes back to the pool after the copy,
       * whoever lets go of it last. */
      buffer = gmlp_grouped_tensor_get_buffer (saved->tensor);
      done = GMLP_DEVICE_CALL (device, copy_async, saved->host,
                               gmlp_grouped_tensor_get_data (saved->tensor),
                               saved->layout.nbytes, TRUE, TRUE, error);
      if (done == NULL)
        goto fail;
      gmlp_buffer_mark_copied (buffer);
      saved->offload_done = gmlp_event_new_for_backend (device, done);
      total += saved->layout.nbytes;
    }

  update_on_host (self);
  gmlp_mutex_unlock (&self->lock);

  /* The device copy stays until the next offload through the context (see
   * gmlp_saved_activations_release_device()). Outside the lock: that
   * offload releases the device copy of other activations. */
  previous = gmlp_offload_context_offloaded (context, self, total);
  if (previous != NULL)
    {
      gmlp_saved_activations_release_device (previous);
      gmlp_object_unref_shared (previous);
    }
  g_object_notify_by_pspec (G_OBJECT (self), properties[PROP_OFFLOAD]);
  return TRUE;

fail:
  gmlp_mutex_unlock (&self->lock);
  return FALSE;
}

void
gmlp_saved_activations_release_device (GmlpSavedActivations *self)
{
  guint i;

  gmlp_mutex_lock (&self->lock);
  for (i = 0; i < self->tensors->len; i++)
    {
      SavedTensor *saved = &g_array_index (self->tensors, SavedTensor, i);

      if (saved->host != NULL)
        g_clear_pointer (&saved->tensor, gmlp_object_unref_shared);
    }
  update_on_host (self);
  gmlp_mutex_unlock (&self->lock);
}

/* Activations whose device copy is still there need no reload: the host copy
 * goes back to the pool once its copy has completed. Lock held. */
static void
drop_host_copies (GmlpSavedActivations *self)
{
  guint64 total = 0;
  guint i;

  for (i = 0; i < self->tensors->len; i++)
    {
      SavedTensor *saved = &g_array_index (self->tensors, SavedTensor, i);

      if (saved->host == NULL || saved->tensor == NULL)
        continue;
      gmlp_offload_context_give_host (self->context, saved->host, saved->host_size,
                                      saved->offload_done);
      saved->host = NULL;
      total += saved->layout.nbytes;
      gmlp_tensor_layout_clear (&saved->layout);
    }
  if (total > 0)
    gmlp_offload_context_kept (self->context, self, total);
}

/* Lock held. */
static gboolean
reload_locked (GmlpSavedActivations  *self,
               gboolean               prefetch,
               GError               **error)
{
  guint64 total = 0;
  gboolean any = FALSE, ok = TRUE;
  guint i;

  /* Entry by entry: one that fails stays in host memory for a retry, and
   * those reloaded before it are accounted for. */
  for (i = 0; ok && i < self->tensors->len; i++)
    {
      SavedTensor *saved = &g_array_index (self->tensors, SavedTensor, i);
      GmlpDevice *device = saved->layout.device;
      g_autoptr(GmlpBuffer) buffer = NULL;
      GmlpBackendEvent *done;
      gpointer data;

      if (saved->host == NULL || saved->tensor != NULL)
        continue;
      if (!gmlp_device_check_not_capturing (device, "Reloading offloaded activations", error))
        {
          ok = FALSE;
          break;
        }

      /* Copy-stream order puts this after the offload copy. */
      data = GMLP_DEVICE_CALL (device, copy_stream_alloc, saved->layout.nbytes, error);
      if (data == NULL)
        {
          ok = FALSE;
          break;
        }
      buffer = gmlp_buffer_new_wrapped (device, data, saved->layout.nbytes);
      done = GMLP_DEVICE_CALL (device, copy_async, data, saved->host, saved->layout.nbytes,
                               FALSE, FALSE, error);
      if (done == NULL)
        {
          ok = FALSE;
          break;
        }

      saved->reload_done = gmlp_event_new_for_backend (device, done);
      saved->tensor = gmlp_grouped_tensor_new_with_buffer (&saved->layout, buffer);
      gmlp_offload_context_give_host (self->context, saved->host, saved->host_size,
                                      saved->reload_done);
      saved->host = NULL;
      total += saved->layout.nbytes;
      gmlp_tensor_layout_clear (&saved->layout);
      any = TRUE;
    }

  if (any)
    gmlp_offload_context_reloading (self->context, self, total, prefetch);
  return ok;
}

gboolean
gmlp_saved_activations_reload (GmlpSavedActivations  *self,
                               gboolean               prefetch,
                               GError               **error)
{
  gboolean ok;

  gmlp_mutex_lock (&self->lock);
  ok = reload_locked (self, prefetch, error);
  update_on_host (self);
  gmlp_mutex_unlock (&self->lock);
  return ok;
}

/* Without the lock, so that the offload context may ask while holding its
 * own: a hint, which reload() checks again. */
gboolean
gmlp_saved_activations_is_on_host (GmlpSavedActivations *self)
{
  return g_atomic_int_get (&self->on_host);
}

GmlpOffloadContext *
gmlp_saved_activations_get_context (GmlpSavedActivations *self)
{
  return self->context;
}

/* Makes the compute stream wait for the reload of one entry (index -1:
 * none). Lock held. */
static gboolean
wait_for_reload (GmlpSavedActivations  *self,
                 int                    index,
                 GError               **error)
{
  SavedTensor *saved;

  if (index < 0)
    return TRUE;
  saved = &g_array_index (self->tensors, SavedTensor, index);
  if (saved->reload_done == NULL)
    return TRUE;
  /* The compute stream waits for this reload only. That wait would
   * cross the boundary of a capture. */
  if (!gmlp_device_check_not_capturing (gmlp_grouped_tensor_get_device (saved->tensor),
                                        "Using activations reloaded from the host", error))
    return FALSE;
  if (!gmlp_event_wait_on_device (saved->reload_done,
                                  gmlp_grouped_tensor_get_device (saved->tensor), error))
    return FALSE;
  g_clear_object (&saved->reload_done);
  return TRUE;
}

static GmlpGroupedTensor *
part_tensor (GmlpSavedActivations *self,
             int                   index)
{
  return index >= 0 ? g_array_index (self->tensors, SavedTensor, index).tensor : NULL;
}

static GmlpGroupedTensor *
get_locked (GmlpSavedActivations  *self,
            const char            *name,
            GError               **error)
{
  SavedTensor *saved = find (self, name);
  int index;

  g_assert (saved != NULL);
  index = (int) (saved - &g_array_index (self->tensors, SavedTensor, 0));
  drop_host_copies (self);
  if (saved->host != NULL && !reload_locked (self, FALSE, error))
    return NULL;
  if (!wait_for_reload (self, index, error))
    return NULL;
  saved = &g_array_index (self->tensors, SavedTensor, index);
  if (!saved->quantized)
    return saved->tensor;

  if (!wait_for_reload (self, saved->scale_inv_part, error) ||
      !wait_for_reload (self, saved->columnwise_part, error) ||
      !wait_for_reload (self, saved->columnwise_scale_inv_part, error))
    return NULL;
  saved = &g_array_index (self->tensors, SavedTensor, index);
  if (gmlp_grouped_tensor_get_scale_inv (saved->tensor) == NULL)
    {
      /* Reloaded as plain FP8 storage: the same quantized tensor again. */
      GmlpGroupedTensor *columnwise = part_tensor (self, saved->columnwise_part);

      if (columnwise != NULL)
        gmlp_grouped_tensor_set_quantized (columnwise, saved->recipe, saved->quantize_flags,
                                           part_tensor (self, saved->columnwise_scale_inv_part),
                                           NULL, TRUE);
      gmlp_grouped_tensor_set_quantized (saved->tensor, saved->recipe, saved->quantize_flags,
                                         part_tensor (self, saved->scale_inv_part), columnwise,
                                         FALSE);
    }
  return saved->tensor;
}

GmlpGroupedTensor *
gmlp_saved_activations_get (GmlpSavedActivations  *self,
                            const char            *name,
                            GError               **error)
{
  GmlpGroupedTensor *tensor;

  /* Once got, a tensor is on the device and stays: nothing else takes it
   * away before consume(). */
  gmlp_mutex_lock (&self->lock);
  tensor = get_locked (self, name, error);
  update_on_host (self);
  gmlp_mutex_unlock (&self->lock);
  return tensor;
}

gboolean
gmlp_saved_activations_contains (GmlpSavedActivations *self,
                                 const char           *name)
{
  gboolean found;

  gmlp_mutex_lock (&self->lock);
  found = find (self, name) != NULL;
  gmlp_mutex_unlock (&self->lock);
  return found;
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
  if (g_atomic_int_get (&self->consumed))
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
  gmlp_mutex_lock (&self->lock);
  release_tensors (self);
  g_atomic_int_set (&self->consumed, TRUE);
  update_on_host (self);
  gmlp_mutex_unlock (&self->lock);
  g_object_notify_by_pspec (G_OBJECT (self), properties[PROP_CONSUMED]);
}

/**
 * gmlp_saved_activations_get_offload:
 * @self: a #GmlpSavedActivations
 *
 * Tells whether the saved activations were offloaded to host memory by a
 * [class@Gmlp.OffloadContext].
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
 * Tells whether a backward has used the saved activations already; they serve
 * one backward only.
 *
 * Returns: the value of [property@Gmlp.SavedActivations:consumed]
 *
 * Since: 0.1
 */
gboolean
gmlp_saved_activations_is_consumed (GmlpSavedActivations *self)
{
  g_return_val_if_fail (GMLP_IS_SAVED_ACTIVATIONS (self), FALSE);

  return g_atomic_int_get (&self->consumed);
}

/**
 * gmlp_saved_activations_get_nbytes:
 * @self: a #GmlpSavedActivations
 *
 * Counts the bytes of device storage the saved tensors hold now: 0 once
 * they are offloaded to host memory (the most recently offloaded ones keep
 * their device copy until the next offload, see
 * [method@Gmlp.OffloadContext.flush]), and once consumed.
 *
 * Returns: the number of bytes
 *
 * Since: 0.1
 */
guint64
gmlp_saved_activations_get_nbytes (GmlpSavedActivations *self)
{
  guint64 total = 0;
  guint i;

  g_return_val_if_fail (GMLP_IS_SAVED_ACTIVATIONS (self), 0);

  gmlp_mutex_lock (&self->lock);
  for (i = 0; i < self->tensors->len; i++)
    {
      SavedTensor *saved = &g_array_index (self->tensors, SavedTensor, i);
      if (saved->tensor != NULL)
        total += gmlp_grouped_tensor_get_nbytes (saved->tensor);
    }
  for (i = 0; i < self->children->len; i++)
    total += gmlp_saved_activations_get_nbytes (self->children->pdata[i]);
  gmlp_mutex_unlock (&self->lock);
  return total;
}

/**
 * gmlp_saved_activations_get_host_nbytes:
 * @self: a #GmlpSavedActivations
 *
 * Gets how many bytes of the saved activations are in host memory now.
 *
 * Returns: the bytes of the saved tensors that are in host memory now
 *
 * Since: 0.1
 */
guint64
gmlp_saved_activations_get_host_nbytes (GmlpSavedActivations *self)
{
  guint64 total = 0;
  guint i;

  g_return_val_if_fail (GMLP_IS_SAVED_ACTIVATIONS (self), 0);

  gmlp_mutex_lock (&self->lock);
  for (i = 0; i < self->tensors->len; i++)
    {
      SavedTensor *saved = &g_array_index (self->tensors, SavedTensor, i);
      if (saved->host != NULL)
        total += saved->layout.nbytes;
    }
  for (i = 0; i < self->children->len; i++)
    total += gmlp_saved_activations_get_host_nbytes (self->children->pdata[i]);
  gmlp_mutex_unlock (&self->lock);
  return total;
}
