/* gmlp-offload-context.c: CPU offload of saved activations, nestable
 *
 * The object: its type and properties, the per-thread stacks of contexts,
 * the pool of host memory, and the bookkeeping that saved activations
 * report to as they offload, keep and reload their tensors (the order of
 * the offloads, the counts). It calls nothing of the saved activations:
 * they call it. What the context does to the activations it offloaded,
 * taking their device copy away and reloading them ahead of their
 * backward, is in gmlp-offload-context-schedule.c.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-offload-context-impl.h"
#include "gmlp-device-private.h"
#include "gmlp-error.h"
#include "gmlp-thread-private.h"

/**
 * GmlpOffloadContext:
 *
 * CPU offload of saved activations, with contexts that nest.
 *
 * Each thread has a stack of contexts, like
 * g_main_context_push_thread_default(): every push says whether offload is
 * enabled or disabled, and a layer's forward consults the innermost entry
 * when it saves activations. So
 *
 * ```
 * push (ctx, TRUE);  layer0;  push (ctx, FALSE);  layer1;  pop (ctx);  layer2;  pop (ctx);
 * ```
 *
 * offloads the activations of layer0 and layer2 only. In Python:
 * `with ctx.enabled(): …` and `with ctx.disabled(): …`.
 *
 * Offloading copies every tensor of a [class@Gmlp.SavedActivations] on the
 * device's copy stream into host memory from the context's pool (pinned on a
 * GPU), after the forward that produced it, and lets go of the device memory,
 * which returns to the pool once the copy has read it. The most recently
 * offloaded activations keep their device copy until the next offload
 * through the context (or [method@Gmlp.OffloadContext.flush]): the last
 * layer's backward, which follows its forward at once, then needs no round
 * trip through host memory. A backward reloads
 * its own activations only (waiting on the device for that copy alone) and
 * starts reloading the activations saved just before them, so that reload
 * overlaps this backward; [method@Gmlp.OffloadContext.prefetch] lets callers
 * drive their own schedule. Results are bit-identical with and without
 * offload. On the CPU the copies are plain host copies.
 *
 * `GmlpOffloadContext` is thread-safe: one context may be pushed on any
 * number of threads at once, each with its own stack of entries. The pool
 * of host memory, the counts and the order of offloads are the context's:
 * "the most recently offloaded" and "the activations saved just before"
 * mean in the order in which the forwards of all the threads offloaded. So
 * a forward on one thread may take away the device copy that another
 * thread's last activations kept, and their backward then reloads them;
 * results are the same.
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
 * layer = Gmlp.GroupedLinear.new(dev, 2, 64, 64)
 * x = Gmlp.GroupedTensor.new(dev, Gmlp.DType.FLOAT32, [16, 16], 64)
 * ctx = Gmlp.OffloadContext.new(dev)
 * # With libgmlp's Python overrides installed, `with ctx.enabled():` does
 * # the push and the pop.
 * ctx.push_thread_default(True)      # forwards on this thread offload what they save
 * try:
 *     y, saved = layer.forward(x)
 * finally:
 *     ctx.pop_thread_default()
 * ctx.prefetch(saved)                # start the reload early
 * dx = layer.backward(saved, y)
 * print(ctx.get_bytes_offloaded(), 'bytes went to host memory')
 * ```
 *
 * In JavaScript (gjs; run with `gjs -m`):
 *
 * ```js
 * import GLib from 'gi://GLib';
 * import Gmlp from 'gi://Gmlp?version=1.0';
 *
 * const dev = Gmlp.Device.get_default();
 * const layer = Gmlp.GroupedLinear.new(dev, 2, 64, 64);
 * const x = Gmlp.GroupedTensor.new(dev, Gmlp.DType.FLOAT32, [16, 16], 64);
 * const ctx = Gmlp.OffloadContext.new(dev);
 * ctx.push_thread_default(true);         // forwards on this thread offload what they save
 * let y, saved;
 * try {
 *     [y, saved] = layer.forward(x);
 * } finally {
 *     ctx.pop_thread_default();
 * }
 * ctx.prefetch(saved);                   // start the reload early
 * const dx = layer.backward(saved, y);
 * print(ctx.get_bytes_offloaded(), 'bytes went to host memory');
 * ```
 *
 * Since: 0.1
 */

typedef struct {
  gpointer   ptr;
  gsize      size;
  GmlpEvent *busy_until;   /* a copy may use it until this completes */
} HostBlock;

G_DEFINE_FINAL_TYPE (GmlpOffloadContext, gmlp_offload_context, G_TYPE_OBJECT)

enum {
  PROP_0,
  PROP_DEVICE,
  PROP_BYTES_OFFLOADED,
  PROP_BYTES_ON_HOST,
  PROP_HOST_POOL_BYTES,
  PROP_RELOAD_WAITS,
  PROP_PREFETCHES,
  N_PROPS
};

static GParamSpec *properties[N_PROPS];

/* Host blocks are rounded up to this, so that blocks get reused across
 * steps whose activation sizes differ a little. */
#define HOST_BLOCK_GRANULE ((gsize) 1 << 20)

typedef struct {
  GmlpOffloadContext *context;   /* strong */
  gboolean            enabled;
} Frame;

static void
frame_stack_free (gpointer data)
{
  GArray *stack = data;
  guint i;

  for (i = 0; i < stack->len; i++)
    gmlp_object_unref_shared (g_array_index (stack, Frame, i).context);
  g_array_unref (stack);
}

static GPrivate frame_stack_key = G_PRIVATE_INIT (frame_stack_free);

static GArray *
frame_stack (gboolean create)
{
  GArray *stack = g_private_get (&frame_stack_key);

  if (stack == NULL && create)
    {
      stack = g_array_new (FALSE, FALSE, sizeof (Frame));
      g_private_set (&frame_stack_key, stack);
    }
  return stack;
}

static void
offloaded_free (Offloaded *entry)
{
  g_weak_ref_clear (&entry->ref);
  g_free (entry);
}

GList *
gmlp_offload_context_find_offloaded (GmlpOffloadContext   *self,
                                     GmlpSavedActivations *saved)
{
  GList *l;

  for (l = self->offloaded.tail; l != NULL; l = l->prev)
    if (((Offloaded *) l->data)->key == saved)
      return l;
  return NULL;
}

void
gmlp_offload_context_forget (GmlpOffloadContext   *self,
                             GmlpSavedActivations *saved)
{
  Offloaded *entry = NULL;
  GList *l;

  gmlp_mutex_lock (&self->lock);
  l = gmlp_offload_context_find_offloaded (self, saved);
  if (l != NULL)
    {
      entry = l->data;
      if (self->recent == entry)
        self->recent = NULL;
      g_queue_delete_link (&self->offloaded, l);
    }
  gmlp_mutex_unlock (&self->lock);
  if (entry != NULL)
    offloaded_free (entry);
}

static void
host_block_free (GmlpOffloadContext *self,
                 HostBlock          *block)
{
  if (block->busy_until != NULL)
    (void) gmlp_event_synchronize (block->busy_until, NULL);
  g_clear_object (&block->busy_until);
  GMLP_DEVICE_CALL (self->device, host_free, block->ptr);
  g_free (block);
}

static void
gmlp_offload_context_finalize (GObject *object)
{
  GmlpOffloadContext *self = (GmlpOffloadContext *) object;
  GList *l;

  /* The last reference may go on any thread (gmlp_object_unref_shared()). */
  gmlp_tsan_acquire (self);
  /* Offloaded activations hold the context: none is left. */
  g_queue_clear_full (&self->offloaded, (GDestroyNotify) offloaded_free);
  for (l = self->free_blocks; l != NULL; l = l->next)
    host_block_free (self, l->data);
  g_list_free (self->free_blocks);
  g_clear_object (&self->device);
  g_mutex_clear (&self->lock);

  G_OBJECT_CLASS (gmlp_offload_context_parent_class)->finalize (object);
}

static void
gmlp_offload_context_get_property (GObject    *object,
                                   guint       prop_id,
                                   GValue     *value,
                                   GParamSpec *pspec)
{
  GmlpOffloadContext *self = GMLP_OFFLOAD_CONTEXT (object);

  switch (prop_id)
    {
    case PROP_DEVICE:
      g_value_set_object (value, self->device);
      break;
    case PROP_BYTES_OFFLOADED:
      g_value_set_uint64 (value, gmlp_offload_context_get_bytes_offloaded (self));
      break;
    case PROP_BYTES_ON_HOST:
      g_value_set_uint64 (value, gmlp_offload_context_get_bytes_on_host (self));
      break;
    case PROP_HOST_POOL_BYTES:
      g_value_set_uint64 (value, gmlp_offload_context_get_host_pool_bytes (self));
      break;
    case PROP_RELOAD_WAITS:
      g_value_set_uint (value, gmlp_offload_context_get_reload_waits (self));
      break;
    case PROP_PREFETCHES:
      g_value_set_uint (value, gmlp_offload_context_get_prefetches (self));
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
    }
}

static void
gmlp_offload_context_set_property (GObject      *object,
                                   guint         prop_id,
                                   const GValue *value,
                                   GParamSpec   *pspec)
{
  GmlpOffloadContext *self = GMLP_OFFLOAD_CONTEXT (object);

  switch (prop_id)
    {
    case PROP_DEVICE:
      self->device = g_value_dup_object (value);
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
    }
}

static void
gmlp_offload_context_constructed (GObject *object)
{
  GmlpOffloadContext *self = GMLP_OFFLOAD_CONTEXT (object);

  G_OBJECT_CLASS (gmlp_offload_context_parent_class)->constructed (object);

  if (self->device == NULL)
    self->device = g_object_ref (gmlp_device_get_default ());
}

static void
gmlp_offload_context_class_init (GmlpOffloadContextClass *klass)
{
  GObjectClass *object_class = G_OBJECT_CLASS (klass);
  const GParamFlags readable = G_PARAM_READABLE | G_PARAM_EXPLICIT_NOTIFY | G_PARAM_STATIC_STRINGS;

  object_class->constructed = gmlp_offload_context_constructed;
  object_class->finalize = gmlp_offload_context_finalize;
  object_class->get_property = gmlp_offload_context_get_property;
  object_class->set_property = gmlp_offload_context_set_property;

  /**
   * GmlpOffloadContext:device:
   *
   * The device whose activations this context offloads; at construction,
   * %NULL stands for [func@Gmlp.Device.get_default].
   *
   * Since: 0.1
   */
  properties[PROP_DEVICE] =
    g_param_spec_object ("device", NULL, NULL, GMLP_TYPE_DEVICE,
                         G_PARAM_READWRITE | G_PARAM_CONSTRUCT_ONLY |
                         G_PARAM_EXPLICIT_NOTIFY | G_PARAM_STATIC_STRINGS);

  /**
   * GmlpOffloadContext:bytes-offloaded:
   *
   * Bytes copied to host memory so far, over the context's life.
   *
   * Since: 0.1
   */
  properties[PROP_BYTES_OFFLOADED] =
    g_param_spec_uint64 ("bytes-offloaded", NULL, NULL, 0, G_MAXUINT64, 0, readable);

  /**
   * GmlpOffloadContext:bytes-on-host:
   *
   * Bytes of saved activations in host memory now, waiting for their
   * backward.
   *
   * Since: 0.1
   */
  properties[PROP_BYTES_ON_HOST] =
    g_param_spec_uint64 ("bytes-on-host", NULL, NULL, 0, G_MAXUINT64, 0, readable);

  /**
   * GmlpOffloadContext:host-pool-bytes:
   *
   * Host memory the context holds, in use or kept for reuse.
   *
   * Since: 0.1
   */
  properties[PROP_HOST_POOL_BYTES] =
    g_param_spec_uint64 ("host-pool-bytes", NULL, NULL, 0, G_MAXUINT64, 0, readable);

  /**
   * GmlpOffloadContext:reload-waits:
   *
   * How many backwards found their activations still in host memory, not
   * prefetched, and had to start the reload themselves.
   *
   * Since: 0.1
   */
  properties[PROP_RELOAD_WAITS] =
    g_param_spec_uint ("reload-waits", NULL, NULL, 0, G_MAXUINT, 0, readable);

  /**
   * GmlpOffloadContext:prefetches:
   *
   * How many reloads were started ahead of their backward.
   *
   * Since: 0.1
   */
  properties[PROP_PREFETCHES] =
    g_param_spec_uint ("prefetches", NULL, NULL, 0, G_MAXUINT, 0, readable);

  g_object_class_install_properties (object_class, N_PROPS, properties);
}

static void
gmlp_offload_context_init (GmlpOffloadContext *self)
{
  g_mutex_init (&self->lock);
  g_queue_init (&self->offloaded);
}

/**
 * gmlp_offload_context_new:
 * @device: the device whose activations to offload
 * @error: return location for a #GError
 *
 * Creates an offload context. It does nothing until pushed with
 * [method@Gmlp.OffloadContext.push_thread_default].
 *
 * Returns: (transfer full): the context
 *
 * Since: 0.1
 */
GmlpOffloadContext *
gmlp_offload_context_new (GmlpDevice  *device,
                          GError     **error)
{
  g_return_val_if_fail (GMLP_IS_DEVICE (device), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!gmlp_device_check_usable (device, error))
    return NULL;
  return g_object_new (GMLP_TYPE_OFFLOAD_CONTEXT, "device", device, NULL);
}

/**
 * gmlp_offload_context_push_thread_default:
 * @self: a #GmlpOffloadContext
 * @enabled: whether forwards under this entry offload
 *
 * Pushes @self onto the calling thread's stack of offload contexts, enabled
 * or disabled. Forwards on this thread consult the innermost entry. Pair
 * with [method@Gmlp.OffloadContext.pop_thread_default].
 *
 * Since: 0.1
 */
void
gmlp_offload_context_push_thread_default (GmlpOffloadContext *self,
                                          gboolean            enabled)
{
  Frame frame;

  g_return_if_fail (GMLP_IS_OFFLOAD_CONTEXT (self));

  frame.context = g_object_ref (self);
  frame.enabled = !!enabled;
  g_array_append_val (frame_stack (TRUE), frame);
}

/**
 * gmlp_offload_context_pop_thread_default:
 * @self: the innermost context of the calling thread
 * @error: return location for a #GError
 *
 * Pops the innermost entry of the calling thread's stack.
 *
 * Returns: %TRUE on success; %FALSE with %GMLP_ERROR_INVALID_STATE, leaving
 *   the stack as it was, if @self is not the innermost context (an
 *   unbalanced pop)
 *
 * Since: 0.1
 */
gboolean
gmlp_offload_context_pop_thread_default (GmlpOffloadContext  *self,
                                         GError             **error)
{
  GArray *stack = frame_stack (FALSE);
  Frame *top;

  g_return_val_if_fail (GMLP_IS_OFFLOAD_CONTEXT (self), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (stack == NULL || stack->len == 0)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE,
                   "Unbalanced pop: this thread has no offload context pushed");
      return FALSE;
    }
  top = &g_array_index (stack, Frame, stack->len - 1);
  if (top->context != self)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE,
                   "Unbalanced pop: this offload context is not the innermost one");
      return FALSE;
    }
  gmlp_object_unref_shared (top->context);
  g_array_set_size (stack, stack->len - 1);
  return TRUE;
}

GmlpOffloadContext *
gmlp_offload_context_peek_innermost (gboolean *enabled)
{
  GArray *stack = frame_stack (FALSE);
  Frame *top;

  *enabled = FALSE;
  if (stack == NULL || stack->len == 0)
    return NULL;
  top = &g_array_index (stack, Frame, stack->len - 1);
  *enabled = top->enabled;
  return top->context;
}

/**
 * gmlp_offload_context_get_thread_default:
 *
 * Gets the offload context that a layer's forward on the calling thread
 * consults now.
 *
 * Returns: (transfer none) (nullable): the innermost offload context of the
 *   calling thread, or %NULL when none is pushed
 *
 * Since: 0.1
 */
GmlpOffloadContext *
gmlp_offload_context_get_thread_default (void)
{
  gboolean enabled;

  return gmlp_offload_context_peek_innermost (&enabled);
}

/**
 * gmlp_offload_context_get_depth:
 *
 * Gets the depth of the calling thread's stack of offload contexts.
 *
 * Returns: how many offload contexts the calling thread has pushed
 *
 * Since: 0.1
 */
guint
gmlp_offload_context_get_depth (void)
{
  GArray *stack = frame_stack (FALSE);

  return stack != NULL ? stack->len : 0;
}

/**
 * gmlp_offload_context_get_enabled:
 * @self: a #GmlpOffloadContext
 *
 * Tells whether a forward on the calling thread would offload its saved
 * activations through @self now.
 *
 * Returns: %TRUE if @self is the calling thread's innermost context and its
 *   innermost entry is enabled, that is, if a forward now would offload
 *
 * Since: 0.1
 */
gboolean
gmlp_offload_context_get_enabled (GmlpOffloadContext *self)
{
  gboolean enabled;

  g_return_val_if_fail (GMLP_IS_OFFLOAD_CONTEXT (self), FALSE);

  return gmlp_offload_context_peek_innermost (&enabled) == self && enabled;
}

gpointer
gmlp_offload_context_take_host (GmlpOffloadContext  *self,
                                gsize                nbytes,
                                gsize               *size,
                                GError             **error)
{
  gsize want = (MAX (nbytes, 1) + HOST_BLOCK_GRANULE - 1) / HOST_BLOCK_GRANULE * HOST_BLOCK_GRANULE;
  gpointer ptr = NULL;
  GList *l;

  gmlp_mutex_lock (&self->lock);
  for (l = self->free_blocks; l != NULL; l = l->next)
    {
      HostBlock *block = l->data;

      /* Big enough, not wastefully so, and no copy still using it. */
      if (block->size >= want && block->size <= 2 * want &&
          (block->busy_until == NULL || gmlp_event_is_complete (block->busy_until)))
        {
          ptr = block->ptr;
          *size = block->size;
          g_clear_object (&block->busy_until);
          g_free (block);
          self->free_blocks = g_list_delete_link (self->free_blocks, l);
          break;
        }
    }
  gmlp_mutex_unlock (&self->lock);
  if (ptr != NULL)
    return ptr;

  ptr = GMLP_DEVICE_CALL (self->device, host_alloc, want, error);
  if (ptr == NULL)
    return NULL;
  *size = want;
  gmlp_mutex_lock (&self->lock);
  self->pool_bytes += want;
  gmlp_mutex_unlock (&self->lock);
  return ptr;
}

void
gmlp_offload_context_give_host (GmlpOffloadContext *self,
                                gpointer            ptr,
                                gsize               size,
                                GmlpEvent          *busy_until)
{
  HostBlock *block = g_new0 (HostBlock, 1);

  block->ptr = ptr;
  block->size = size;
  block->busy_until = busy_until != NULL ? g_object_ref (busy_until) : NULL;
  gmlp_mutex_lock (&self->lock);
  self->free_blocks = g_list_prepend (self->free_blocks, block);
  gmlp_mutex_unlock (&self->lock);
}

GmlpSavedActivations *
gmlp_offload_context_swap_recent (GmlpOffloadContext *self,
                                  Offloaded          *recent)
{
  GmlpSavedActivations *previous;

  previous = self->recent != NULL ? g_weak_ref_get (&self->recent->ref) : NULL;
  self->recent = recent;
  return previous;
}

GmlpSavedActivations *
gmlp_offload_context_offloaded (GmlpOffloadContext   *self,
                                GmlpSavedActivations *saved,
                                guint64               nbytes)
{
  Offloaded *entry = g_new0 (Offloaded, 1);
  GmlpSavedActivations *previous;

  g_weak_ref_init (&entry->ref, saved);
  entry->key = saved;
  gmlp_mutex_lock (&self->lock);
  self->bytes_offloaded += nbytes;
  self->bytes_on_host += nbytes;
  g_queue_push_tail (&self->offloaded, entry);
  previous = gmlp_offload_context_swap_recent (self, entry);
  gmlp_mutex_unlock (&self->lock);
  return previous;
}

void
gmlp_offload_context_kept (GmlpOffloadContext   *self,
                           GmlpSavedActivations *saved,
                           guint64               nbytes)
{
  gmlp_mutex_lock (&self->lock);
  self->bytes_on_host -= MIN (nbytes, self->bytes_on_host);
  if (self->recent != NULL && self->recent->key == saved)
    self->recent = NULL;
  gmlp_mutex_unlock (&self->lock);
}

void
gmlp_offload_context_reloading (GmlpOffloadContext   *self,
                                GmlpSavedActivations *saved,
                                guint64               nbytes,
                                gboolean              prefetch)
{
  gmlp_mutex_lock (&self->lock);
  self->bytes_on_host -= MIN (nbytes, self->bytes_on_host);
  if (prefetch)
    self->prefetches++;
  else
    self->reload_waits++;
  gmlp_mutex_unlock (&self->lock);
}

/**
 * gmlp_offload_context_get_device:
 * @self: a #GmlpOffloadContext
 *
 * Gets the device whose activations the context moves to host memory.
 *
 * Returns: (transfer none): the context's device
 *
 * Since: 0.1
 */
GmlpDevice *
gmlp_offload_context_get_device (GmlpOffloadContext *self)
{
  g_return_val_if_fail (GMLP_IS_OFFLOAD_CONTEXT (self), NULL);
  return self->device;
}

#define LOCKED_GETTER(type, name, field) \
  type \
  gmlp_offload_context_get_##name (GmlpOffloadContext *self) \
  { \
    type value; \
    g_return_val_if_fail (GMLP_IS_OFFLOAD_CONTEXT (self), 0); \
    gmlp_mutex_lock (&self->lock); \
    value = self->field; \
    gmlp_mutex_unlock (&self->lock); \
    return value; \
  }

/**
 * gmlp_offload_context_get_bytes_offloaded:
 * @self: a #GmlpOffloadContext
 *
 * Gets how many bytes of saved activations the context has copied to host
 * memory in all.
 *
 * Returns: the value of [property@Gmlp.OffloadContext:bytes-offloaded]
 *
 * Since: 0.1
 */
LOCKED_GETTER (guint64, bytes_offloaded, bytes_offloaded)

/**
 * gmlp_offload_context_get_bytes_on_host:
 * @self: a #GmlpOffloadContext
 *
 * Gets how many bytes of saved activations are in host memory now.
 *
 * Returns: the value of [property@Gmlp.OffloadContext:bytes-on-host]
 *
 * Since: 0.1
 */
LOCKED_GETTER (guint64, bytes_on_host, bytes_on_host)

/**
 * gmlp_offload_context_get_host_pool_bytes:
 * @self: a #GmlpOffloadContext
 *
 * Gets the size of the pinned host memory the context holds for offloaded
 * activations.
 *
 * Returns: the value of [property@Gmlp.OffloadContext:host-pool-bytes]
 *
 * Since: 0.1
 */
LOCKED_GETTER (guint64, host_pool_bytes, pool_bytes)

/**
 * gmlp_offload_context_get_reload_waits:
 * @self: a #GmlpOffloadContext
 *
 * Gets how many backwards found their activations still in host memory and
 * had to start the reload themselves.
 *
 * Returns: the value of [property@Gmlp.OffloadContext:reload-waits]
 *
 * Since: 0.1
 */
LOCKED_GETTER (guint, reload_waits, reload_waits)

/**
 * gmlp_offload_context_get_prefetches:
 * @self: a #GmlpOffloadContext
 *
 * Gets how many reloads were started ahead of the backward that needed them.
 *
 * Returns: the value of [property@Gmlp.OffloadContext:prefetches]
 *
 * Since: 0.1
 */
LOCKED_GETTER (guint, prefetches, prefetches)
