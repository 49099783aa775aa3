/* gmlp-cuda-block-cache.h: freed device memory kept for the next allocation of its size
 *
 * The block cache over the device's pool, and the real frees, which give
 * memory to it or back to the pool (gmlp-cuda-block-cache.c). The table of
 * memory that graphs keep (gmlp-cuda-graph.h) stands above: it calls the
 * real frees once nothing holds the memory.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "gmlp-cuda-device.h"

G_BEGIN_DECLS

/* gmlp-cuda-block-cache.c */
void      gmlp_cuda_block_cache_init   (GmlpBackendDevice  *device);
void      gmlp_cuda_block_cache_fini   (GmlpBackendDevice  *device);
/* Memory for the compute stream: a kept block of the size class, else one
 * from the pool. */
gpointer  gmlp_cuda_block_cache_alloc  (GmlpBackendDevice  *device,
                                        gsize               nbytes,
                                        GError            **error);
/* Keeps ptr for reuse when it came from gmlp_cuda_block_cache_alloc() and
 * there is room; FALSE when the caller must free it. */
gboolean  gmlp_cuda_block_cache_free   (GmlpBackendDevice  *device,
                                        gpointer            ptr);
/* With keep FALSE (the tuning's block-cache=off) no freed block is kept
 * and those kept go back to the pool now; TRUE keeps them again. */
void      gmlp_cuda_block_cache_set_keep (GmlpBackendDevice  *device,
                                          gboolean            keep);
/* ptr leaves by another path (the copy stream's free). */
void      gmlp_cuda_block_cache_forget (GmlpBackendDevice  *device,
                                        gpointer            ptr);

/* The real free, in compute-stream order, whatever graphs hold. */
void      gmlp_cuda_free_now              (GmlpBackendDevice  *device,
                                           gpointer            ptr);
/* The real free after the copies, whatever graphs hold. */
void      gmlp_cuda_free_after_copies_now (GmlpBackendDevice  *device,
                                           gpointer            ptr);

G_END_DECLS
