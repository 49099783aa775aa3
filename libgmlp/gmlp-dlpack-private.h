/* gmlp-dlpack-private.h: the DLPack exchange structures
 *
 * Written from the DLPack specification (dmlc/dlpack, ABI of v0.8 and
 * later's DLManagedTensor), so that libgmlp needs no DLPack header.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <stdint.h>

enum {
  GMLP_DL_CPU = 1,
  GMLP_DL_CUDA = 2,
};

enum {
  GMLP_DL_INT = 0,
  GMLP_DL_FLOAT = 2,
  GMLP_DL_BFLOAT = 4,
};

typedef struct {
  int32_t device_type;
  int32_t device_id;
} GmlpDLDevice;

typedef struct {
  uint8_t  code;
  uint8_t  bits;
  uint16_t lanes;
} GmlpDLDataType;

typedef struct {
  void           *data;
  GmlpDLDevice    device;
  int32_t         ndim;
  GmlpDLDataType  dtype;
  int64_t        *shape;
  int64_t        *strides;
  uint64_t        byte_offset;
} GmlpDLTensor;

typedef struct GmlpDLManagedTensor {
  GmlpDLTensor  dl_tensor;
  void         *manager_ctx;
  void        (*deleter) (struct GmlpDLManagedTensor *self);
} GmlpDLManagedTensor;
