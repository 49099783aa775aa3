/* table.cu: small host tables into device memory, through kernel parameters
 *
 * The GEMM pointer arrays and the bias kernels' group tables change with
 * every call. A cudaMemcpyAsync from pageable host memory may wait for the
 * stream (the runtime stages pageable data), which would stall the host
 * behind the device on every layer call. Kernel parameters are copied by
 * the launch itself: the host never waits, and the copy is stream-ordered
 * and can be captured in a CUDA graph.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <string.h>

#include "gmlp-kernels.h"
#include "impls/common.cuh"

namespace {

/* NOTE: kernel parameters are limited to 32764 bytes since CUDA 12.1 on
 * Volta and later; a large chunk stays well below with its header. Every
 * launch passes the whole parameter block, so small tables (the common case:
 * three pointers per expert) take a small chunk. */
constexpr unsigned kSmallChunkWords = 512;
constexpr unsigned kLargeChunkWords = 4000;

template <unsigned kWords>
struct TableChunk
{
  uint64_t words[kWords];
};

static_assert (sizeof (TableChunk<kLargeChunkWords>) + 2 * sizeof (void *) < 32764,
               "a table chunk must fit in the kernel parameter space");

template <unsigned kWords>
__global__ void
write_table_kernel (const __grid_constant__ TableChunk<kWords> chunk,
                    uint64_t                                *dst,
                    unsigned                                 n_words)
{
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n_words; i += gridDim.x * blockDim.x)
    dst[i] = chunk.words[i];
}

template <unsigned kWords>
cudaError_t
write_chunk (uint64_t *dst, const uint8_t *src, unsigned n_words, cudaStream_t stream)
{
  TableChunk<kWords> chunk;

  memcpy (chunk.words, src, n_words * sizeof (uint64_t));
  write_table_kernel<kWords><<<(n_words + 255) / 256, 256, 0, stream>>> (chunk, dst, n_words);
  return cudaGetLastError ();
}

}  // namespace

extern "C" GmlpKernelStatus
gmlp_kernel_write_table (void         *dst,
                         const void   *src,
                         size_t        nbytes,
                         cudaStream_t  stream)
{
  const uint8_t *bytes = static_cast<const uint8_t *> (src);
  size_t done = 0;

  if (nbytes == 0)
    return GMLP_KERNEL_SUCCESS;
  if (dst == NULL || src == NULL || nbytes % sizeof (uint64_t) != 0 ||
      reinterpret_cast<uintptr_t> (dst) % alignof (uint64_t) != 0)
    return GMLP_KERNEL_INVALID_VALUE;

  while (done < nbytes)
    {
      size_t left_words = (nbytes - done) / sizeof (uint64_t);
      unsigned n_words = static_cast<unsigned> (left_words < kLargeChunkWords ? left_words
                                                                               : kLargeChunkWords);
      uint64_t *to = reinterpret_cast<uint64_t *> (static_cast<uint8_t *> (dst) + done);
      cudaError_t err = n_words <= kSmallChunkWords
                        ? write_chunk<kSmallChunkWords> (to, bytes + done, n_words, stream)
                        : write_chunk<kLargeChunkWords> (to, bytes + done, n_words, stream);

      if (err != cudaSuccess)
        return gmlp::record_cuda_error (err);
      done += n_words * sizeof (uint64_t);
    }
  return GMLP_KERNEL_SUCCESS;
}
