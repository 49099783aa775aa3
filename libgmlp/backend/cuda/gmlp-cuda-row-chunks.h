/* gmlp-cuda-row-chunks.h: chunks of rows between layouts on the CUDA
 * backend
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "backend/gmlp-backend.h"

G_BEGIN_DECLS

/* See the move_rows entry of GmlpBackend. */
gboolean gmlp_cuda_move_rows (GmlpBackendDevice          *device,
                              const GmlpBackendMoveRows  *move,
                              GError                    **error);

G_END_DECLS
