/* impls/sm90_ptx.cuh: the Hopper instructions the grouped GEMM is built from
 *
 * Thin wrappers over inline PTX for sm_90a: mbarriers, the bulk tensor copy
 * engine (TMA), tensor maps edited on the device, and warpgroup matrix
 * multiply-accumulate (wgmma). Each wrapper is one instruction or one
 * short, fixed sequence; the kernels decide the protocol.
 *
 * Compiled only for sm_90a (kernels/meson.build); the bodies are empty on
 * anything else, where the host never launches these kernels.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <stdint.h>

namespace gmlp {
namespace sm90 {

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GMLP_SM90_ENABLED 1
#else
#define GMLP_SM90_ENABLED 0
#endif

__device__ __forceinline__ uint32_t
smem_address (const void *ptr)
{
  return static_cast<uint32_t> (__cvta_generic_to_shared (ptr));
}

/* Loads from shared memory by address. A float * into shared memory that
 * the compiler cannot trace back to it is read with generic loads, whose
 * address arithmetic and latency the FP8 promotion then waits on.
 * Volatile, so that a load stays after the mbarrier wait that made its
 * data visible. */
__device__ __forceinline__ float
lds_f32 (uint32_t address)
{
  float v = 0.0f;
#if GMLP_SM90_ENABLED
  asm volatile ("ld.shared.f32 %0, [%1];" : "=f" (v) : "r" (address));
#endif
  return v;
}

__device__ __forceinline__ float2
lds_f32x2 (uint32_t address)
{
  float2 v = make_float2 (0.0f, 0.0f);
#if GMLP_SM90_ENABLED
  asm volatile ("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f" (v.x), "=f" (v.y) : "r" (address));
#endif
  return v;
}

/* Stores to shared memory by address: the epilogue's fragment stores
 * through a generic pointer took 64-bit address arithmetic each. */
__device__ __forceinline__ void
sts_f32x2 (uint32_t address, float x, float y)
{
#if GMLP_SM90_ENABLED
  asm volatile ("st.shared.v2.f32 [%0], {%1, %2};" :: "r" (address), "f" (x), "f" (y) : "memory");
#endif
}

/* Stores four 8 × 8 matrices of 16-bit values, a warp's: register i of
 * lane l holds row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of matrix i
 * (wgmma's fragment layout), and lanes 8 i ... 8 i + 7 give the addresses
 * of matrix i's rows. One instruction where st.shared takes four. */
__device__ __forceinline__ void
stmatrix_x4 (uint32_t address, uint32_t m0, uint32_t m1, uint32_t m2, uint32_t m3)
{
#if GMLP_SM90_ENABLED
  asm volatile ("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};"
                :: "r" (address), "r" (m0), "r" (m1), "r" (m2), "r" (m3) : "memory");
#endif
}

/* Programmatic dependent launch: a grid launched with programmatic stream
 * serialization may start before the grid ahead of it has finished; it
 * waits for that grid's completion and memory with grid_dependency_wait().
 * launch_dependents() lets the next grid be scheduled early. */
__device__ __forceinline__ void
launch_dependents ()
{
#if GMLP_SM90_ENABLED
  asm volatile ("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void
grid_dependency_wait ()
{
#if GMLP_SM90_ENABLED
  asm volatile ("griddepcontrol.wait;" ::: "memory");
#endif
}

/* Copies 4 bytes from global to shared memory asynchronously (cp.async);
 * cp_async_arrive() makes an mbarrier see when they have landed. */
__device__ __forceinline__ void
cp_async_4 (void *smem_dst, const void *src)
{
#if GMLP_SM90_ENABLED
  asm volatile ("cp.async.ca.shared.global [%0], [%1], 4;"
                :: "r" (smem_address (smem_dst)), "l" (src) : "memory");
#endif
}

/* mbarriers ---------------------------------------------------------------- */

__device__ __forceinline__ void
mbarrier_init (uint64_t *bar, uint32_t count)
{
#if GMLP_SM90_ENABLED
  asm volatile ("mbarrier.init.shared::cta.b64 [%0], %1;"
                :: "r" (smem_address (bar)), "r" (count) : "memory");
#endif
}

/* Makes the barriers' initialisation visible to the copy engine. */
__device__ __forceinline__ void
mbarrier_init_fence ()
{
#if GMLP_SM90_ENABLED
  asm volatile ("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

__device__ __forceinline__ void
mbarrier_arrive_expect_tx (uint64_t *bar, uint32_t bytes)
{
#if GMLP_SM90_ENABLED
  asm volatile ("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                :: "r" (smem_address (bar)), "r" (bytes) : "memory");
#endif
}

__device__ __forceinline__ void
mbarrier_arrive (uint64_t *bar)
{
#if GMLP_SM90_ENABLED
  asm volatile ("mbarrier.arrive.shared::cta.b64 _, [%0];"
                :: "r" (smem_address (bar)) : "memory");
#endif
}

/* Clusters ------------------------------------------------------------------ */

/* The CTAs of the calling CTA's cluster (1 where it was launched without
 * one). Not volatile: the same for the whole kernel. */
__device__ __forceinline__ uint32_t
cluster_ctas ()
{
  uint32_t n = 1;
#if GMLP_SM90_ENABLED
  asm ("mov.u32 %0, %%cluster_nctarank;" : "=r" (n));
#endif
  return n;
}

/* An arrival on the barrier at bar's offset in the shared memory of CTA
 * `rank` of the cluster. Released at CTA scope, as a local arrival is: the
 * reads it vouches for are wgmma's, done once waited for, and a release
 * at cluster scope fences every memory access of the thread before it. */
__device__ __forceinline__ void
mbarrier_arrive_cluster (uint64_t *bar, uint32_t rank)
{
#if GMLP_SM90_ENABLED
  asm volatile ("{\n"
                "  .reg .b32 remote;\n"
                "  mapa.shared::cluster.u32 remote, %0, %1;\n"
                "  mbarrier.arrive.shared::cluster.b64 _, [remote];\n"
                "}"
                :: "r" (smem_address (bar)), "r" (rank) : "memory");
#endif
}

/* Every thread of the cluster's CTAs meets here; what each wrote before
 * (shared memory, barriers' initialisation) is seen by all after. */
__device__ __forceinline__ void
cluster_sync ()
{
#if GMLP_SM90_ENABLED
  asm volatile ("barrier.cluster.arrive.release;\n"
                "barrier.cluster.wait.acquire;" ::: "memory");
#endif
}

/* An arrival on bar once the calling thread's cp.async copies so far have
 * landed; it counts as one of the arrivals bar was initialised with
 * (.noinc). */
__device__ __forceinline__ void
cp_async_arrive (uint64_t *bar)
{
#if GMLP_SM90_ENABLED
  asm volatile ("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];"
                :: "r" (smem_address (bar)) : "memory");
#endif
}

/* Waits until the phase of parity `phase` has completed. */
__device__ __forceinline__ void
mbarrier_wait (uint64_t *bar, uint32_t phase)
{
#if GMLP_SM90_ENABLED
  asm volatile ("{\n"
                "  .reg .pred done;\n"
                "wait_%=:\n"
                "  mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                "  @!done bra wait_%=;\n"
                "}"
                :: "r" (smem_address (bar)), "r" (phase) : "memory");
#endif
}

/* Tensor maps and the copy engine ------------------------------------------ */

/* A CUtensorMap: 128 opaque bytes, 64-byte aligned wherever it lives. */
struct alignas (128) TensorMap
{
  uint64_t bytes[16];
};

/* Points a tensor map in shared memory at a new global address and sets
 * the extent of its outer (row) dimension. (Edits of a map in global memory
 * are a round trip to memory each: the plan edits in shared memory and
 * copies the maps out with plain stores.) */
__device__ __forceinline__ void
tensormap_set_address (TensorMap *map, const void *address)
{
#if GMLP_SM90_ENABLED
  asm volatile ("tensormap.replace.tile.global_address.shared::cta.b1024.b64 [%0], %1;"
                :: "r" (smem_address (map)), "l" (address) : "memory");
#endif
}

__device__ __forceinline__ void
tensormap_set_rows (TensorMap *map, uint32_t rows)
{
#if GMLP_SM90_ENABLED
  asm volatile ("tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [%0], 1, %1;"
                :: "r" (smem_address (map)), "r" (rows) : "memory");
#endif
}

/* A transposed row-grouped operand (cols × m_g, the rows m_g long): its
 * inner extent and its row stride in bytes. */
__device__ __forceinline__ void
tensormap_set_cols (TensorMap *map, uint32_t cols)
{
#if GMLP_SM90_ENABLED
  asm volatile ("tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [%0], 0, %1;"
                :: "r" (smem_address (map)), "r" (cols) : "memory");
#endif
}

__device__ __forceinline__ void
tensormap_set_row_stride (TensorMap *map, uint64_t bytes)
{
#if GMLP_SM90_ENABLED
  asm volatile ("tensormap.replace.tile.global_stride.shared::cta.b1024.b64 [%0], 0, %1;"
                :: "r" (smem_address (map)), "l" (bytes) : "memory");
#endif
}

/* The writer of edited tensor maps releases them, the reader acquires each
 * before its first copy: tensor maps are read through their own proxy. */
__device__ __forceinline__ void
tensormap_release ()
{
#if GMLP_SM90_ENABLED
  asm volatile ("fence.proxy.tensormap::generic.release.gpu;" ::: "memory");
#endif
}

__device__ __forceinline__ void
tensormap_acquire (const TensorMap *map)
{
#if GMLP_SM90_ENABLED
  asm volatile ("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;"
                :: "l" (map) : "memory");
#endif
}

/* Copies the box at (inner, outer) of a 2-D tensor into shared memory;
 * the barrier's transaction count goes down by the box's bytes (all of
 * them, out-of-bounds elements being filled with zeros). */
__device__ __forceinline__ void
tma_load_2d (void *dst, const TensorMap *map, uint64_t *bar, int32_t inner, int32_t outer)
{
#if GMLP_SM90_ENABLED
  asm volatile ("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                " [%0], [%1, {%3, %4}], [%2];"
                :: "r" (smem_address (dst)), "l" (map), "r" (smem_address (bar)),
                   "r" (inner), "r" (outer)
                : "memory");
#endif
}

/* The same for the box at (inner, outer, plane) of a 3-D tensor: a stack
 * of matrices (the groups' weights), each box inside one plane. */
__device__ __forceinline__ void
tma_load_3d (void *dst, const TensorMap *map, uint64_t *bar, int32_t inner, int32_t outer,
             int32_t plane)
{
#if GMLP_SM90_ENABLED
  asm volatile ("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
                " [%0], [%1, {%3, %4, %5}], [%2];"
                :: "r" (smem_address (dst)), "l" (map), "r" (smem_address (bar)),
                   "r" (inner), "r" (outer), "r" (plane)
                : "memory");
#endif
}

/* tma_load_3d() into the same offset of the shared memory of each CTA of
 * the cluster in `ctas` (a bit per rank), each CTA's barrier at bar's
 * offset taking the box's bytes. */
__device__ __forceinline__ void
tma_load_3d_multicast (void *dst, const TensorMap *map, uint64_t *bar, int32_t inner, int32_t outer,
                       int32_t plane, uint16_t ctas)
{
#if GMLP_SM90_ENABLED
  asm volatile ("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
                " [%0], [%1, {%4, %5, %6}], [%2], %3;"
                :: "r" (smem_address (dst)), "l" (map), "r" (smem_address (bar)), "h" (ctas),
                   "r" (inner), "r" (outer), "r" (plane)
                : "memory");
#endif
}

/* Stores (or, with kAdd, adds into FP32 or 16-bit float memory) the
 * shared-memory box at (inner, outer) of a 2-D tensor; elements outside the
 * tensor are not written. One bulk group per commit_bulk(). */
template <bool kAdd>
__device__ __forceinline__ void
tma_store_2d (const TensorMap *map, const void *src, int32_t inner, int32_t outer)
{
#if GMLP_SM90_ENABLED
  if (kAdd)
    asm volatile ("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group"
                  " [%0, {%2, %3}], [%1];"
                  :: "l" (map), "r" (smem_address (src)), "r" (inner), "r" (outer)
                  : "memory");
  else
    asm volatile ("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group"
                  " [%0, {%2, %3}], [%1];"
                  :: "l" (map), "r" (smem_address (src)), "r" (inner), "r" (outer)
                  : "memory");
#endif
}

__device__ __forceinline__ void
bulk_commit ()
{
#if GMLP_SM90_ENABLED
  asm volatile ("cp.async.bulk.commit_group;" ::: "memory");
#endif
}

/* Waits until at most kPending of this thread's bulk groups still read
 * their shared-memory source. */
template <int kPending>
__device__ __forceinline__ void
bulk_wait_read ()
{
#if GMLP_SM90_ENABLED
  asm volatile ("cp.async.bulk.wait_group.read %0;" :: "n" (kPending) : "memory");
#endif
}

/* Waits until every bulk group of this thread has completed. */
__device__ __forceinline__ void
bulk_wait_all ()
{
#if GMLP_SM90_ENABLED
  asm volatile ("cp.async.bulk.wait_group 0;" ::: "memory");
#endif
}

/* Makes this thread's ordinary shared-memory stores visible to the copy
 * engine (before the barrier that precedes a TMA store). */
__device__ __forceinline__ void
fence_async_shared ()
{
#if GMLP_SM90_ENABLED
  asm volatile ("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

/* Warpgroup matrix multiply-accumulate -------------------------------------- */

/* Register budget per thread for warpgroups that issue copies and for
 * those that do the arithmetic (setmaxnreg, sm_90a). */
template <uint32_t kRegisters>
__device__ __forceinline__ void
registers_decrease ()
{
#if GMLP_SM90_ENABLED
  asm volatile ("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n" (kRegisters));
#endif
}

template <uint32_t kRegisters>
__device__ __forceinline__ void
registers_increase ()
{
#if GMLP_SM90_ENABLED
  asm volatile ("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n" (kRegisters));
#endif
}

__device__ __forceinline__ void
wgmma_fence ()
{
#if GMLP_SM90_ENABLED
  asm volatile ("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}

__device__ __forceinline__ void
wgmma_commit ()
{
#if GMLP_SM90_ENABLED
  asm volatile ("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}

template <int kPending>
__device__ __forceinline__ void
wgmma_wait ()
{
#if GMLP_SM90_ENABLED
  asm volatile ("wgmma.wait_group.sync.aligned %0;" :: "n" (kPending) : "memory");
#endif
}

/* Orders the use of registers an asynchronous wgmma writes after the
 * wait for it: to the compiler the asm wrote them when it was issued, and
 * reads of them could otherwise be scheduled before wgmma_wait(). */
template <int kCount>
__device__ __forceinline__ void
wgmma_fence_operand (float (&registers)[kCount])
{
#pragma unroll
  for (int i = 0; i < kCount; i++)
    asm volatile ("" : "+f" (registers[i]) :: "memory");
}

/* A flag between CTAs (the stream-K tail's partial sums): the store
 * publishes, at GPU scope, every write this thread ordered before it (the
 * writers' fences and a barrier order the others'); the load sees them once
 * it reads the stored value. */
__device__ __forceinline__ void
st_release_gpu (uint32_t *flag, uint32_t value)
{
#if GMLP_SM90_ENABLED
  asm volatile ("st.release.gpu.global.u32 [%0], %1;" :: "l" (flag), "r" (value) : "memory");
#endif
}

__device__ __forceinline__ uint32_t
ld_acquire_gpu (const uint32_t *flag)
{
  uint32_t value = 0;

#if GMLP_SM90_ENABLED
  asm volatile ("ld.acquire.gpu.global.u32 %0, [%1];" : "=r" (value) : "l" (flag) : "memory");
#endif
  return value;
}

/* The shared-memory matrix descriptor of wgmma, for 128-byte swizzled
 * tiles: each 128-byte row holds 64 16-bit elements, 8 rows make one
 * 1024-byte swizzle atom.
 *   K-major (the reduction dimension contiguous): rows are M or N, the
 *     stride between 8-row groups (SBO) is 1024; LBO is unused.
 *   MN-major: rows are K, and 64-element chunks of M or N lie `chunk_bytes`
 *     apart (LBO); the stride between 8-row groups of K (SBO) is 1024. */
__device__ __forceinline__ uint64_t
smem_descriptor (uint32_t address, uint32_t leading_bytes)
{
  uint64_t desc = 0;

  desc |= (uint64_t) ((address & 0x3ffff) >> 4);
  desc |= (uint64_t) ((leading_bytes & 0x3ffff) >> 4) << 16;
  desc |= (uint64_t) (1024 >> 4) << 32;
  desc |= 1ull << 62;   /* 128-byte swizzle */
  return desc;
}

/* The descriptor of the tile bytes further on in shared memory (a
 * multiple of 16) than desc's: only the low word's address field changes,
 * and it cannot carry out, shared memory ending below 256 KiB. One add,
 * where building each descriptor from its address took five
 * instructions. */
__device__ __forceinline__ uint64_t
descriptor_plus (uint64_t desc, uint32_t bytes)
{
  const uint32_t low = (uint32_t) desc + (bytes >> 4);

  return (desc & 0xffffffff00000000ull) | low;
}

/* The same for tile bytes further back (no borrow: the address field of
 * desc is at least bytes >> 4). */
__device__ __forceinline__ uint64_t
descriptor_minus (uint64_t desc, uint32_t bytes)
{
  const uint32_t low = (uint32_t) desc - (bytes >> 4);

  return (desc & 0xffffffff00000000ull) | low;
}

}  // namespace sm90
}  // namespace gmlp
