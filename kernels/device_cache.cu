/* device_cache.cu: device attributes and kernel settings, asked once
 *
 * One table of answers keyed by what was asked and the device ordinal (see
 * impls/device_cache.cuh for why). Entries are only ever added, under a
 * mutex; a reader finds one without the lock: its key is written before its
 * ready flag is released and never changes after; its value is atomic, as
 * the value a kernel's shared memory limit was last set to may change. A
 * full table keeps nothing more and every further query goes to the driver,
 * as before.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <stdint.h>

#include <atomic>
#include <mutex>

#include "impls/device_cache.cuh"

namespace {

enum Query
{
  QUERY_ATTRIBUTE = 1,
  QUERY_BLOCKS_PER_SM,
  QUERY_STATIC_SMEM,
  QUERY_MAX_DYNAMIC_SMEM,
  QUERY_MAX_CLUSTERS,
};

struct Key
{
  const void *kernel;
  size_t bytes;
  int device;
  int query;
  int a, b, c;
};

struct Entry
{
  std::atomic<int> ready;
  Key key;
  std::atomic<size_t> value;
};

/* Far more than the kernels times the devices of one process. A power of 2. */
constexpr uint32_t kEntries = 2048;

Entry entries[kEntries];
std::mutex entries_lock;

bool
same_key (const Key &x, const Key &y)
{
  return x.kernel == y.kernel && x.bytes == y.bytes && x.device == y.device &&
         x.query == y.query && x.a == y.a && x.b == y.b && x.c == y.c;
}

uint32_t
hash_key (const Key &k)
{
  uint64_t h = (uint64_t) (uintptr_t) k.kernel;

  /* splitmix64 steps over the fields. */
  for (uint64_t v : { (uint64_t) k.bytes, (uint64_t) (uint32_t) k.device, (uint64_t) k.query,
                      (uint64_t) (uint32_t) k.a, (uint64_t) (uint32_t) k.b,
                      (uint64_t) (uint32_t) k.c })
    {
      h += v + 0x9e3779b97f4a7c15ull;
      h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
      h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
      h ^= h >> 31;
    }
  return (uint32_t) h;
}

/* The entry of key, or nullptr; without the lock. */
Entry *
find (const Key &key)
{
  const uint32_t start = hash_key (key);

  for (uint32_t i = 0; i < kEntries; i++)
    {
      Entry &e = entries[(start + i) & (kEntries - 1)];

      /* Probes stop at the first empty slot: entries are never removed. */
      if (e.ready.load (std::memory_order_acquire) == 0)
        return nullptr;
      if (same_key (e.key, key))
        return &e;
    }
  return nullptr;
}

/* Keeps value for key (replacing the value kept), unless the table is
 * full. */
void
keep (const Key &key, size_t value)
{
  std::lock_guard<std::mutex> hold (entries_lock);
  const uint32_t start = hash_key (key);

  for (uint32_t i = 0; i < kEntries; i++)
    {
      Entry &e = entries[(start + i) & (kEntries - 1)];

      /* Under the lock an entry not ready is empty: only keep() fills. */
      if (e.ready.load (std::memory_order_relaxed) == 0)
        {
          e.key = key;
          e.value.store (value, std::memory_order_relaxed);
          e.ready.store (1, std::memory_order_release);
          return;
        }
      if (same_key (e.key, key))
        {
          e.value.store (value, std::memory_order_release);
          return;
        }
    }
}

/* Sets key's device to the current one and finds its entry: *e, or
 * nullptr. */
cudaError_t
find_current (Key &key, const Entry **e)
{
  cudaError_t err = cudaGetDevice (&key.device);

  *e = err == cudaSuccess ? find (key) : nullptr;
  return err;
}

/* The kept answer to key on the current device, or ask's, kept if it
 * succeeds. ask is called as ask (device, size_t *value). */
template <typename Ask>
cudaError_t
answer (Key key, size_t *value, Ask ask)
{
  const Entry *e;
  cudaError_t err = find_current (key, &e);

  if (err != cudaSuccess)
    return err;
  if (e != nullptr)
    {
      *value = e->value.load (std::memory_order_acquire);
      return cudaSuccess;
    }
  err = ask (key.device, value);
  if (err == cudaSuccess)
    keep (key, *value);
  return err;
}

Key
key_of (int query, const void *kernel, size_t bytes, int a, int b, int c)
{
  Key key;

  key.kernel = kernel;
  key.bytes = bytes;
  key.device = 0;
  key.query = query;
  key.a = a;
  key.b = b;
  key.c = c;
  return key;
}

/* answer() for an int (kept as its unsigned bits). ask is called as
 * ask (device, int *value). */
template <typename Ask>
cudaError_t
answer_int (Key key, int *value, Ask ask)
{
  size_t kept = 0;
  cudaError_t err;

  err = answer (key, &kept, [&ask] (int device, size_t *v) {
    int got = 0;
    cudaError_t e = ask (device, &got);

    *v = (size_t) (unsigned) got;
    return e;
  });
  if (err == cudaSuccess)
    *value = (int) (unsigned) kept;
  return err;
}

}  // namespace

namespace gmlp {

cudaError_t
current_device_attribute (cudaDeviceAttr attr, int *value)
{
  return answer_int (key_of (QUERY_ATTRIBUTE, nullptr, 0, (int) attr, 0, 0), value,
                     [attr] (int device, int *v) { return cudaDeviceGetAttribute (v, attr, device); });
}

cudaError_t
current_sm_count (int *sm_count)
{
  cudaError_t err = current_device_attribute (cudaDevAttrMultiProcessorCount, sm_count);

  if (err == cudaSuccess && *sm_count < 1)
    *sm_count = 1;
  return err;
}

cudaError_t
current_blocks_per_sm (const void *kernel, int threads, size_t dynamic_smem, int *blocks)
{
  return answer_int (key_of (QUERY_BLOCKS_PER_SM, kernel, dynamic_smem, threads, 0, 0), blocks,
                     [=] (int, int *v) {
                       return cudaOccupancyMaxActiveBlocksPerMultiprocessor (v, kernel, threads,
                                                                            dynamic_smem);
                     });
}

cudaError_t
current_static_smem (const void *kernel, size_t *bytes)
{
  return answer (key_of (QUERY_STATIC_SMEM, kernel, 0, 0, 0, 0), bytes,
                 [=] (int, size_t *v) {
                   cudaFuncAttributes attrs;
                   cudaError_t e = cudaFuncGetAttributes (&attrs, kernel);

                   *v = e == cudaSuccess ? attrs.sharedSizeBytes : 0;
                   return e;
                 });
}

cudaError_t
current_max_dynamic_smem (const void *kernel, int bytes)
{
  Key key = key_of (QUERY_MAX_DYNAMIC_SMEM, kernel, 0, 0, 0, 0);
  const Entry *e;
  cudaError_t err = find_current (key, &e);

  /* The value kept is the limit last set: set again only to another. */
  if (err != cudaSuccess ||
      (e != nullptr && e->value.load (std::memory_order_acquire) == (size_t) (unsigned) bytes))
    return err;
  err = cudaFuncSetAttribute (kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == cudaSuccess)
    keep (key, (size_t) (unsigned) bytes);
  return err;
}

cudaError_t
current_max_clusters (const void               *kernel,
                      const cudaLaunchConfig_t *config,
                      int                       cluster_ctas,
                      int                      *clusters)
{
  return answer_int (key_of (QUERY_MAX_CLUSTERS, kernel, config->dynamicSmemBytes,
                             (int) config->gridDim.x, (int) config->blockDim.x, cluster_ctas),
                     clusters,
                     [=] (int, int *v) { return cudaOccupancyMaxActiveClusters (v, kernel, config); });
}

}  // namespace gmlp
