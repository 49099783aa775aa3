/* gmlp-cuda-block-cache.c: freed device memory kept for the next allocation of its size
 *
 * A training step allocates the same sizes in the same order every time.
 * The stream-ordered pool serves them, but not cheaply: an allocation costs
 * the driver's bookkeeping, and where the step's sizes interleave so that a
 * freed block does not fit the next request, the pool maps new memory.
 * Here a block freed on the compute stream is kept under its size class,
 * and an allocation of that class on the compute stream takes it back:
 * both in compute-stream order, so what the block's last user enqueued runs
 * before what its next user enqueues, as the pool would order them.
 *
 * Only blocks from gmlp_cuda_block_cache_alloc() come back here (the table
 * of live blocks says which): memory of the copy stream and of captures
 * keeps its own path. A failed allocation gives every kept block back to
 * the pool and tries again, and no more than a quarter of the device's
 * memory is kept. The tuning's block-cache=off (GMLP_DEBUG=no-block-cache)
 * keeps none, so that a leak check at exit, with the device never closed,
 * finds no kept block.
 *
 * A kept block stays in the table of live blocks, marked free (size 0):
 * a step hands out and takes back the same blocks, and a table whose
 * entries came and went every step would shrink and grow again with them.
 * Only a block that goes back to the pool leaves it.
 *
 * The real frees end the file: gmlp_cuda_free_now() gives a block to the
 * cache, or back to the pool on the compute stream, and
 * gmlp_cuda_free_after_copies_now() gives it back on the copy stream. The
 * table of memory that graphs keep (gmlp-cuda-graph.c) calls them once
 * nothing holds the memory.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-cuda-block-cache.h"

#define SMALL_LIMIT   (1u << 20)    /* sizes below: classes of 512 bytes */
#define SMALL_QUANTUM 512u
#define LARGE_QUANTUM (1u << 20)    /* above: classes of 1 MiB */

static gsize
size_class (gsize nbytes)
{
  gsize quantum = nbytes < SMALL_LIMIT ? SMALL_QUANTUM : LARGE_QUANTUM;

  return (MAX (nbytes, 1) + quantum - 1) / quantum * quantum;
}

void
gmlp_cuda_block_cache_init (GmlpBackendDevice *device)
{
  size_t free_bytes = 0, total_bytes = 0;

  g_mutex_init (&device->cache_lock);
  device->live_blocks = g_hash_table_new (NULL, NULL);
  device->kept_blocks = g_hash_table_new_full (NULL, NULL, NULL, (GDestroyNotify) g_ptr_array_unref);
  if (cudaMemGetInfo (&free_bytes, &total_bytes) != cudaSuccess)
    (void) cudaGetLastError ();
  device->keep_limit = total_bytes / 4;
  device->kept_limit = device->keep_limit;
}

/* Gives every kept block back to the pool, in compute-stream order. Called
 * with the cache lock held. */
static void
release_kept_locked (GmlpBackendDevice *device)
{
  GHashTableIter iter;
  gpointer key, value;

  g_hash_table_iter_init (&iter, device->kept_blocks);
  while (g_hash_table_iter_next (&iter, &key, &value))
    {
      GPtrArray *blocks = value;

      for (guint i = 0; i < blocks->len; i++)
        {
          g_hash_table_remove (device->live_blocks, blocks->pdata[i]);
          if (cudaFreeAsync (blocks->pdata[i], device->stream) != cudaSuccess)
            (void) cudaGetLastError ();
        }
    }
  g_hash_table_remove_all (device->kept_blocks);
  device->kept_bytes = 0;
}

void
gmlp_cuda_block_cache_fini (GmlpBackendDevice *device)
{
  if (device->live_blocks == NULL)
    return;
  g_mutex_lock (&device->cache_lock);
  release_kept_locked (device);
  g_mutex_unlock (&device->cache_lock);
  g_clear_pointer (&device->kept_blocks, g_hash_table_unref);
  g_clear_pointer (&device->live_blocks, g_hash_table_unref);
  g_mutex_clear (&device->cache_lock);
}

void
gmlp_cuda_block_cache_set_keep (GmlpBackendDevice *device,
                                gboolean           keep)
{
  g_mutex_lock (&device->cache_lock);
  /* No block is kept past a limit of 0: every size class is at least 512
   * bytes. */
  device->kept_limit = keep ? device->keep_limit : 0;
  if (!keep && device->kept_bytes > 0)
    {
      enum cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;

      /* Not while capturing, which would record the frees: the blocks kept
       * so far then go at the next failed allocation, or at close. */
      if (gmlp_cuda_set_current (device->ordinal) == cudaSuccess &&
          cudaStreamIsCapturing (device->stream, &capture) == cudaSuccess &&
          capture == cudaStreamCaptureStatusNone)
        release_kept_locked (device);
      (void) cudaGetLastError ();
    }
  g_mutex_unlock (&device->cache_lock);
}

gpointer
gmlp_cuda_block_cache_alloc (GmlpBackendDevice  *device,
                             gsize               nbytes,
                             GError            **error)
{
  gsize size = size_class (MAX (nbytes, GMLP_CUDA_MIN_ALLOCATION));
  GPtrArray *blocks;
  gpointer ptr = NULL;

  /* A kept block is in the table already: marking it live replaces a
   * value, it adds no entry. */
  g_mutex_lock (&device->cache_lock);
  blocks = g_hash_table_lookup (device->kept_blocks, GSIZE_TO_POINTER (size));
  if (blocks != NULL && blocks->len > 0)
    {
      ptr = g_ptr_array_steal_index_fast (blocks, blocks->len - 1);
      device->kept_bytes -= size;
      g_hash_table_insert (device->live_blocks, ptr, GSIZE_TO_POINTER (size));
    }
  g_mutex_unlock (&device->cache_lock);
  if (ptr != NULL)
    return ptr;

  {
    g_autoptr(GError) first = NULL;

    ptr = gmlp_cuda_alloc_on_stream (device, size, device->stream, &first);
    if (ptr == NULL)
      {
        /* Kept blocks of other sizes may be what the pool lacks. */
        g_mutex_lock (&device->cache_lock);
        release_kept_locked (device);
        g_mutex_unlock (&device->cache_lock);
        ptr = gmlp_cuda_alloc_on_stream (device, size, device->stream, error);
        if (ptr == NULL)
          return NULL;
      }
  }

  g_mutex_lock (&device->cache_lock);
  g_hash_table_insert (device->live_blocks, ptr, GSIZE_TO_POINTER (size));
  g_mutex_unlock (&device->cache_lock);
  return ptr;
}

gboolean
gmlp_cuda_block_cache_free (GmlpBackendDevice *device,
                            gpointer           ptr)
{
  gpointer value;
  gsize size;
  GPtrArray *blocks;
  gboolean kept = FALSE;

  g_mutex_lock (&device->cache_lock);
  if (g_hash_table_lookup_extended (device->live_blocks, ptr, NULL, &value) &&
      (size = GPOINTER_TO_SIZE (value)) != 0)
    {
      if (device->kept_bytes + size <= device->kept_limit)
        {
          blocks = g_hash_table_lookup (device->kept_blocks, value);
          if (blocks == NULL)
            {
              blocks = g_ptr_array_new ();
              g_hash_table_insert (device->kept_blocks, value, blocks);
            }
          g_ptr_array_add (blocks, ptr);
          device->kept_bytes += size;
          /* Kept: marked free, its entry stays. */
          g_hash_table_insert (device->live_blocks, ptr, GSIZE_TO_POINTER (0));
          kept = TRUE;
        }
      else
        g_hash_table_remove (device->live_blocks, ptr);
    }
  g_mutex_unlock (&device->cache_lock);
  return kept;
}

void
gmlp_cuda_block_cache_forget (GmlpBackendDevice *device,
                              gpointer           ptr)
{
  g_mutex_lock (&device->cache_lock);
  g_hash_table_remove (device->live_blocks, ptr);
  g_mutex_unlock (&device->cache_lock);
}

void
gmlp_cuda_free_now (GmlpBackendDevice *device,
                    gpointer           ptr)
{
  cudaError_t err;

  if (gmlp_cuda_block_cache_free (device, ptr))
    return;
  err = gmlp_cuda_set_current (device->ordinal);
  if (err == cudaSuccess)
    err = cudaFreeAsync (ptr, device->stream);
  if (err != cudaSuccess)
    {
      /* Nothing to report to: free cannot fail. This only happens once the
       * context is broken, and then the next call with a GError says so. */
      g_debug ("CUDA: cudaFreeAsync failed: %s (%s)",
               cudaGetErrorString (err), cudaGetErrorName (err));
      (void) cudaGetLastError ();
    }
}

void
gmlp_cuda_free_after_copies_now (GmlpBackendDevice *device,
                                 gpointer           ptr)
{
  const char *what = "cudaSetDevice";
  cudaError_t err;

  /* Freed on the copy stream once it has caught up with the compute
   * stream, the memory goes back to the pool only after the work enqueued
   * so far on both; not to the compute stream's kept blocks. */
  gmlp_cuda_block_cache_forget (device, ptr);
  err = gmlp_cuda_set_current (device->ordinal);
  if (err == cudaSuccess)
    err = gmlp_cuda_copies_after_compute (device, &what);
  if (err == cudaSuccess)
    {
      what = "cudaFreeAsync";
      err = cudaFreeAsync (ptr, device->copy_stream);
    }
  if (err != cudaSuccess)
    {
      /* Nothing to report to, as in gmlp_cuda_free(). When the copy stream
       * could not be made to wait, the memory is not freed at all: better
       * lost to the pool than handed out while the compute stream may still
       * use it. Either only happens once the context is broken. */
      g_debug ("CUDA: %s failed: %s (%s)",
               what, cudaGetErrorString (err), cudaGetErrorName (err));
      (void) cudaGetLastError ();
    }
}
