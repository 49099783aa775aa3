/* grouped_gemm_sm90.cu: launch code of the Hopper grouped GEMM (device sizes)
 *
 * The host knows the shapes that do not depend on the group sizes: it
 * checks them, encodes one TMA tensor map template per operand, passes the
 * per-group pointers through kernel parameters into the workspace, and
 * enqueues the plan and the GEMM (impls/grouped_gemm_sm90.cuh). FP8 WGRAD
 * reads the columnwise copies, whose rows are m_g bytes long; where the
 * sizes may not be multiples of 16 (TMA's row stride) a repack kernel
 * between the two copies them into workspace rows padded to 16. Nothing
 * here reads the sizes, synchronizes or allocates, so the whole call can be
 * captured in a CUDA graph.
 *
 * This file is compiled for sm_90a only (kernels/meson.build).
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include <cudaTypedefs.h>

#include <cub/block/block_scan.cuh>

#include "gmlp-kernels.h"
#include "gmlp-quantize-numeric.h"
#include "impls/grouped_gemm_sm90.cuh"
#include "impls/sm90_gemm_heuristics.cuh"

namespace gmlp {
namespace sm90 {
namespace {

constexpr int kPlanThreads = 256;   /* and 32 KiB of map slots */

/* A transposed FP8 operand's rows are repacked with this pitch alignment. */
constexpr int64_t kRepackAlign = 16;

/* What the repack copies of one group (plan_kernel() writes it): its n
 * rows of dyᵀ and k rows of xᵀ, each of rows bytes, from the columnwise
 * copies into scratch rows pitch bytes apart. */
struct RepackGroup
{
  const uint8_t *src_a;
  const uint8_t *src_b;
  uint8_t       *dst_a;
  uint8_t       *dst_b;
  int64_t        rows;
  int64_t        pitch;
};

struct PlanParams
{
  TensorMap             template_a;
  TensorMap             template_b;
  TensorMap             template_c;
  const int64_t        *device_rows;   /* or NULL: the sizes are in the tables */
  uint32_t              n_groups;
  int                   kind;          /* GMLP_KERNEL_GEMM_* */
  /* FP8 WGRAD: a and b_rows are the columnwise copies, member g the
   * transpose (cols × m_g, rows of m_g bytes). */
  int                   transposed;
  GroupedOperand        a;             /* x (FPROP) or dy */
  GroupedOperand        rows2;         /* c_rows, or b_rows for WGRAD */
  /* Blockwise FP8: the groups' scale pointers are the tables', or for
   * scales grouped by the device sizes a_scales (FPROP and DGRAD: A's;
   * WGRAD: the columnwise copies' of A and B, with b_scales), member g
   * having blocks_along (m_g, scale_row_block) rows. */
  int                   blockwise;
  int                   a_scales_grouped;
  int                   b_scales_grouped;
  int64_t               scale_row_block;
  GroupedOperand        a_scales;
  GroupedOperand        b_scales;
  uint32_t              tiles_n;       /* output tiles across */
  uint32_t              tiles_m_fixed; /* WGRAD: output tiles down */
  /* The host tables (table_words()): weight (FPROP, DGRAD) or wgrad
   * pointers, bias pointers, group sizes (when known on the host), FP8
   * scale pointers, accumulate flags; in the workspace (tables), or in the
   * kernel's InlineTables parameter (tables NULL). */
  const uint64_t       *tables;
  int                   has_bias;
  int                   has_scales;
  int                   has_accumulate;
  uint32_t             *tile_begin;    /* out: n_groups + 1 */
  GroupWork            *groups;        /* out */
  TensorMap            *maps;          /* out: A and B map of each group */
  /* FP8 WGRAD whose group sizes may not be multiples of 16 (device sizes):
   * the copies' rows are repacked to 16-byte multiples (TMA's row
   * stride) in scratch, A's n rows of each group from repack_a, B's k from
   * repack_b, group g at its padded offset. NULL otherwise. */
  uint8_t              *repack_a;
  uint8_t              *repack_b;
  RepackGroup          *repack;        /* out */
};

/* Writes to dst a copy of the template src pointing at address, with rows
 * rows when rows > 0, or, for a transposed FP8 operand, rows of cols bytes
 * (pitch bytes apart when pitch > 0) when cols > 0. The edits happen on
 * this thread's slot of shared memory (tensormap.replace on a global map
 * is a round trip to memory per edit, and made the plan grow by ~60 ns per
 * group); the result goes out with eight 16-byte stores. */
__device__ __forceinline__ void
write_map (TensorMap *dst, const TensorMap &src, TensorMap *slot, const void *address,
           uint32_t rows, uint32_t cols = 0, uint32_t pitch = 0)
{
  for (int i = 0; i < 16; i++)
    slot->bytes[i] = src.bytes[i];
  tensormap_set_address (slot, address);
  if (rows > 0)
    tensormap_set_rows (slot, rows);
  if (cols > 0)
    {
      tensormap_set_cols (slot, cols);
      tensormap_set_row_stride (slot, pitch > 0 ? pitch : cols);
    }
  for (int i = 0; i < 8; i++)
    reinterpret_cast<uint4 *> (dst)[i] = reinterpret_cast<const uint4 *> (slot)[i];
}

/* The host tables, n = n_groups words each: matrix pointers at words
 * [0, n), bias pointers at [n, 2n), group sizes at [2n, 3n), then for FP8
 * the scale pointers of A at [3n, 4n) and of B at [4n, 5n), and the
 * accumulate flags as bytes after the last table. */
__host__ __device__ constexpr uint32_t
pointer_tables (bool has_scales)
{
  return has_scales ? 5 : 3;
}

__host__ __device__ constexpr size_t
table_words (uint32_t n_groups, bool has_scales)
{
  return (size_t) pointer_tables (has_scales) * n_groups + (n_groups + 7) / 8;
}

/* The tables passed by value, in the plan's own launch. */
template <int kWords>
struct InlineTables
{
  uint64_t words[kWords > 0 ? kWords : 1];
};

constexpr int kInlineSmall = 3 * 256 + 32;   /* up to 256 16-bit groups (153 FP8) */
constexpr int kInlineLarge = 3800;           /* up to 1192 (FP8 745) groups, under 32 KiB */

struct GroupTables
{
  uint64_t matrix;
  uint64_t bias;
  uint64_t a_scale;
  uint64_t b_scale;
  uint32_t accumulate;
};

template <int kWords>
__device__ __forceinline__ GroupTables
group_tables (const PlanParams &p, const InlineTables<kWords> &inline_tables, uint32_t g)
{
  const uint64_t *words = kWords > 0 ? inline_tables.words : p.tables;
  const uint32_t n = p.n_groups;
  GroupTables t;

  t.matrix = words[g];
  t.bias = p.has_bias ? words[n + g] : 0;
  t.a_scale = p.has_scales ? words[3 * n + g] : 0;
  t.b_scale = p.has_scales ? words[4 * n + g] : 0;
  t.accumulate = p.has_accumulate ?
    reinterpret_cast<const uint8_t *> (words + pointer_tables (p.has_scales) * n)[g] : 0;
  return t;
}

/* The rows of a group of raw rows asked for, rows of them placed so far,
 * whose scales (blocks of block rows, from offset in op) fit in op. */
__device__ __forceinline__ int64_t
rows_with_scales (int64_t rows, int64_t raw, uint64_t offset, const GroupedOperand &op, int64_t block)
{
  const int64_t blocks = gmlp_quant_blocks_along (raw, block);
  const int64_t fit = rows_that_fit (blocks, offset, op);

  return fit < blocks && fit * block < rows ? fit * block : rows;
}

/* An exclusive scan of the member strides of a group's scales (blocks of
 * block rows of raw rows) over the block's groups, after carry; the total
 * into *total. Every thread calls it. */
template <typename Scan>
__device__ __forceinline__ uint64_t
scale_offsets (typename Scan::TempStorage &storage, bool valid, int64_t raw, const GroupedOperand &op,
               int64_t block, uint64_t carry, uint64_t *total)
{
  uint64_t offset;

  Scan (storage).ExclusiveScan (valid ? member_stride (gmlp_quant_blocks_along (raw, block), op) : 0, offset,
                                (uint64_t) 0, SaturatingAdd (), *total);
  __syncthreads ();
  return SaturatingAdd () (offset, carry);
}

/* Group g's size as asked for (before any clamping): from the device, or
 * from the host's table. */
template <int kWords>
__device__ __forceinline__ int64_t
group_rows (const PlanParams &p, const InlineTables<kWords> &inline_tables, uint32_t g)
{
  if (p.device_rows != nullptr)
    return p.device_rows[g];
  return (int64_t) (kWords > 0 ? inline_tables.words : p.tables)[2 * p.n_groups + g];
}

template <int kWords>
__global__ void __launch_bounds__ (kPlanThreads)
plan_kernel (const __grid_constant__ PlanParams p, const __grid_constant__ InlineTables<kWords> tables)
{
  /* The GEMM may be scheduled now: it waits for this grid's results
   * (griddepcontrol.wait) after its own set-up. */
  launch_dependents ();
  using Scan = cub::BlockScan<uint64_t, kPlanThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  /* Offsets of a, rows2, tiles, a_scales, repacked rows and b_scales so far. */
  __shared__ uint64_t carry[6];
  __shared__ TensorMap map_slots[kPlanThreads];
  TensorMap *slot = &map_slots[threadIdx.x];
  const bool wgrad = p.kind == GMLP_KERNEL_GEMM_WGRAD;

  if (threadIdx.x == 0)
    carry[0] = carry[1] = carry[2] = carry[3] = carry[4] = carry[5] = 0;
  __syncthreads ();

  for (uint32_t base = 0; base < p.n_groups; base += kPlanThreads)
    {
      const uint32_t g = base + threadIdx.x;
      const bool valid = g < p.n_groups;
      const int64_t asked = valid ? group_rows (p, tables, g) : 0;
      const int64_t raw = asked > 0 ? asked : 0;
      uint64_t off_a, off_2, off_s = 0, off_sb = 0, total_a, total_2, total_s = 0, total_sb = 0;
      uint64_t tile_off, tile_total, tiles;
      uint64_t off_r = 0, total_r = 0;
      int64_t rows, pitch;

      Scan (scan_storage).ExclusiveScan (valid ? member_stride (raw, p.a) : 0, off_a,
                                         (uint64_t) 0, SaturatingAdd (), total_a);
      __syncthreads ();
      Scan (scan_storage).ExclusiveScan (valid ? member_stride (raw, p.rows2) : 0, off_2,
                                         (uint64_t) 0, SaturatingAdd (), total_2);
      __syncthreads ();
      if (p.a_scales_grouped)
        off_s = scale_offsets<Scan> (scan_storage, valid, raw, p.a_scales, p.scale_row_block, carry[3],
                                     &total_s);
      if (p.b_scales_grouped)
        off_sb = scale_offsets<Scan> (scan_storage, valid, raw, p.b_scales, p.scale_row_block, carry[5],
                                      &total_sb);
      off_a = SaturatingAdd () (off_a, carry[0]);
      off_2 = SaturatingAdd () (off_2, carry[1]);
      rows = rows_that_fit (raw, off_a, p.a);
      if (rows_that_fit (raw, off_2, p.rows2) < rows)
        rows = rows_that_fit (raw, off_2, p.rows2);
      if (p.a_scales_grouped)
        rows = rows_with_scales (rows, raw, off_s, p.a_scales, p.scale_row_block);
      if (p.b_scales_grouped)
        rows = rows_with_scales (rows, raw, off_sb, p.b_scales, p.scale_row_block);

      if (!valid)
        tiles = 0;
      else if (wgrad)
        tiles = (uint64_t) p.tiles_m_fixed * p.tiles_n;
      else
        tiles = div_up (rows, kBlockM) * p.tiles_n;
      Scan (scan_storage).ExclusiveSum (tiles, tile_off, tile_total);
      tile_off += carry[2];
      /* Repacked rows lie pitch bytes apart (0 for an empty group: its
       * maps, never read, get rows of map_cols bytes). A group whose rows
       * are whole 16-byte units already is read in place (FP8 pipelines
       * commonly pad each expert's rows to 16), and takes no scratch. */
      pitch = div_up (rows, kRepackAlign) * kRepackAlign;
      if (p.repack_a != nullptr)
        {
          __syncthreads ();
          Scan (scan_storage).ExclusiveSum (valid && pitch != rows ? (uint64_t) pitch : 0, off_r, total_r);
          off_r += carry[4];
        }

      if (valid)
        {
          const GroupTables t = group_tables (p, tables, g);
          GroupWork w;
          TensorMap *map_a = p.maps + kMapsPerGroup * (uint64_t) g;
          TensorMap *map_b = map_a + 1;
          TensorMap *map_c = map_a + 2;
          const uint8_t *a_data = rows > 0 ? p.a.data + off_a : p.a.data;
          const uint8_t *rows2_data = rows > 0 ? p.rows2.data + off_2 : p.rows2.data;
          const uint32_t map_rows = rows > 0 ? (uint32_t) rows : 1;
          /* An empty group's maps are never read; TMA wants 16-byte rows. */
          const uint32_t map_cols = rows > 0 ? (uint32_t) rows : 16;

          w.c = wgrad ? (void *) t.matrix : (void *) rows2_data;
          w.bias = (const void *) t.bias;
          w.rows = rows;
          w.accumulate = t.accumulate;
          w.a_scales = p.a_scales_grouped ?
            reinterpret_cast<const float *> (rows > 0 ? p.a_scales.data + off_s : p.a_scales.data) :
            reinterpret_cast<const float *> (t.a_scale);
          w.b_scales = p.b_scales_grouped ?
            reinterpret_cast<const float *> (rows > 0 ? p.b_scales.data + off_sb : p.b_scales.data) :
            reinterpret_cast<const float *> (t.b_scale);
          /* Written by the quantizer earlier in the stream. */
          w.scale = p.has_scales && !p.blockwise ? *reinterpret_cast<const float *> (t.a_scale) *
                                                     *reinterpret_cast<const float *> (t.b_scale)
                                                 : 1.0f;
          p.groups[g] = w;
          p.tile_begin[g] = (uint32_t) tile_off;

          write_map (map_c, p.template_c, slot, wgrad ? (const void *) t.matrix : rows2_data,
                     wgrad ? 0 : map_rows);
          if (p.transposed)
            {
              /* Rows of the group's m_g bytes, read up to there (TMA fills
               * the rest of the last stage with zeros): in place, or
               * repacked pitch apart (rows 0 tells the repack to skip the
               * group). */
              const uint8_t *a_rows_at = a_data, *b_rows_at = rows2_data;
              uint32_t row_pitch = 0;

              if (p.repack_a != nullptr)
                {
                  const bool in_place = pitch == rows;
                  RepackGroup r;

                  r.src_a = a_data;
                  r.src_b = rows2_data;
                  r.dst_a = p.repack_a + off_r * (uint64_t) p.a.row_bytes;
                  r.dst_b = p.repack_b + off_r * (uint64_t) p.rows2.row_bytes;
                  r.rows = in_place ? 0 : rows;
                  r.pitch = pitch;
                  p.repack[g] = r;
                  if (!in_place)
                    {
                      a_rows_at = r.dst_a;
                      b_rows_at = r.dst_b;
                      row_pitch = (uint32_t) pitch;
                    }
                }
              write_map (map_a, p.template_a, slot, a_rows_at, 0, map_cols, row_pitch);
              write_map (map_b, p.template_b, slot, b_rows_at, 0, map_cols, row_pitch);
            }
          else
            {
              write_map (map_a, p.template_a, slot, a_data, map_rows);
              write_map (map_b, p.template_b, slot, wgrad ? rows2_data : (const void *) t.matrix,
                         wgrad ? map_rows : 0);
            }
        }

      __syncthreads ();   /* everyone has read carry and the scan storage */
      if (threadIdx.x == 0)
        {
          carry[0] = SaturatingAdd () (carry[0], total_a);
          carry[1] = SaturatingAdd () (carry[1], total_2);
          carry[2] += tile_total;
          carry[3] = SaturatingAdd () (carry[3], total_s);
          carry[4] += total_r;
          carry[5] = SaturatingAdd () (carry[5], total_sb);
        }
      __syncthreads ();
    }

  if (threadIdx.x == 0)
    p.tile_begin[p.n_groups] = (uint32_t) carry[2];
  tensormap_release ();
}


/* Copies each group's rows of the columnwise copies into the repack
 * scratch (RepackGroup), a warp a row, 16 bytes a lane: loaded as one
 * vector where the source row is 16-byte aligned, byte by byte (the bytes
 * past the row as zeros) where not. A vector may carry the start of the
 * next row into the pitch's tail, which no map reads; that row is in the
 * same member (n and k are multiples of 16, so the last row of a group
 * whose rows are not is never aligned). */
__global__ void __launch_bounds__ (256)
repack_kernel (const RepackGroup *groups, uint32_t n_groups, uint32_t a_rows, uint32_t b_rows)
{
  const uint32_t per_group = a_rows + b_rows;
  const uint64_t units = (uint64_t) n_groups * per_group;
  const uint64_t warps = (uint64_t) gridDim.x * (blockDim.x / 32);
  const int lane = threadIdx.x % 32;

  for (uint64_t u = (uint64_t) blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; u < units;
       u += warps)
    {
      const RepackGroup &r = groups[u / per_group];
      const uint32_t row = (uint32_t) (u % per_group);
      const bool is_a = row < a_rows;
      const int64_t rows = r.rows;
      const uint8_t *src;
      uint8_t *dst;

      if (rows == 0)
        continue;
      src = is_a ? r.src_a + (uint64_t) row * rows : r.src_b + (uint64_t) (row - a_rows) * rows;
      dst = is_a ? r.dst_a + (uint64_t) row * r.pitch : r.dst_b + (uint64_t) (row - a_rows) * r.pitch;
      if (reinterpret_cast<uintptr_t> (src) % 16 == 0)
        {
          for (int64_t c = 16 * lane; c < rows; c += 16 * 32)
            *reinterpret_cast<uint4 *> (dst + c) = __ldg (reinterpret_cast<const uint4 *> (src + c));
        }
      else
        {
          for (int64_t c = 16 * lane; c < rows; c += 16 * 32)
            {
              uint32_t words[4];

#pragma unroll
              for (int w = 0; w < 4; w++)
                {
                  words[w] = 0;
#pragma unroll
                  for (int i = 0; i < 4; i++)
                    if (c + 4 * w + i < rows)
                      words[w] |= (uint32_t) __ldg (src + c + 4 * w + i) << (8 * i);
                }
              *reinterpret_cast<uint4 *> (dst + c) = make_uint4 (words[0], words[1], words[2], words[3]);
            }
        }
    }
}

/* The TMA inner box is one 128-byte row; coordinates are 32-bit. */
constexpr int64_t kMaxExtent = INT32_MAX - kMaxBlockN;

struct WorkspaceLayout
{
  size_t tile_begin;
  size_t groups;
  size_t tables;   /* room for table_words (n_groups, true) */
  size_t maps;
  size_t repack;   /* RepackGroup of each group, when repacking */
  size_t repack_a; /* the repacked rows of A, then of B */
  size_t repack_b;
  size_t partials; /* the stream-K tail's (TailSplit), when it may split */
  size_t partial_flags;
  size_t total;
};

/* The split tail's room on a grid of n_sms CTAs (grid_ctas()): each
 * CTA's slot of partial sums and its two flags, or 0 where the product
 * never splits (stream_k_pays()). */
struct StreamKRoom
{
  size_t partials;
  size_t flags;
};

StreamKRoom stream_k_room (const GmlpKernelDeviceGemm *g, const GmlpKernelSm90Tuning &t, int n_sms);
int         device_grid_ctas (const GmlpKernelSm90Tuning &t);

size_t
round_up (size_t n, size_t alignment)
{
  return (n + alignment - 1) / alignment * alignment;
}

/* FP8 WGRAD reads the columnwise copies, rows of m_g bytes. */
bool
host_rows_aligned (const GmlpKernelDeviceGemm *g)
{
  if (g->host_rows == nullptr)
    return false;
  for (uint32_t i = 0; i < g->n_groups; i++)
    if (g->host_rows[i] > 0 && g->host_rows[i] % 16 != 0)
      return false;
  return true;
}

/* Whether the copies of an FP8 WGRAD are repacked first (PlanParams): when
 * any group's rows may not be a multiple of 16. */
bool
repacks (const GmlpKernelDeviceGemm *g)
{
  return gmlp_num_dtype_is_fp8 (g->ab_dtype) && g->kind == GMLP_KERNEL_GEMM_WGRAD &&
         !host_rows_aligned (g);
}

/* The rows the repacked copies can take: every group padded to 16. */
int64_t
repack_capacity (const GmlpKernelDeviceGemm *g)
{
  return g->row_capacity + (kRepackAlign - 1) * (int64_t) g->n_groups;
}

WorkspaceLayout
workspace_layout (const GmlpKernelDeviceGemm *g, const GmlpKernelSm90Tuning &t)
{
  const uint32_t n_groups = g->n_groups;
  WorkspaceLayout l;
  size_t off = 0;

  l.tile_begin = off;
  off = round_up (off + (n_groups + 1) * sizeof (uint32_t), 256);
  l.groups = off;
  off = round_up (off + n_groups * sizeof (GroupWork), 256);
  /* The host tables are contiguous: one write through parameters. */
  l.tables = off;
  off = round_up (off + table_words (n_groups, true) * sizeof (uint64_t), 256);
  l.maps = off;
  off += (size_t) n_groups * kMapsPerGroup * sizeof (TensorMap);
  l.repack = l.repack_a = l.repack_b = off;
  if (repacks (g))
    {
      l.repack = off = round_up (off, 256);
      off = round_up (off + n_groups * sizeof (RepackGroup), 256);
      l.repack_a = off;
      off = round_up (off + (size_t) g->n * (size_t) repack_capacity (g), 256);
      l.repack_b = off;
      off += (size_t) g->k * (size_t) repack_capacity (g);
    }
  {
    const StreamKRoom room = stream_k_room (g, t, device_grid_ctas (t));

    l.partials = off = round_up (off, 256);
    off += room.partials;
    l.partial_flags = off = round_up (off, 256);
    off += room.flags;
  }
  l.total = off;
  return l;
}

PFN_cuTensorMapEncodeTiled_v12000
encode_tiled (void)
{
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void *f = nullptr;
    cudaDriverEntryPointQueryResult found;

    if (cudaGetDriverEntryPointByVersion ("cuTensorMapEncodeTiled", &f, 12000,
                                          cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      return (PFN_cuTensorMapEncodeTiled_v12000) nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000> (f);
  } ();

  return fn;
}

/* A row-major [rows × cols] matrix at data, of a 16-bit float dtype,
 * FLOAT32 or an FP8 format (as bytes), read or written in boxes of one
 * 128-byte row segment × box_rows rows with the 128-byte swizzle; with
 * planes > 0, a stack of planes such matrices plane_stride bytes apart
 * (the groups' B matrices on the direct schedule), boxes inside one. */
bool
encode_map (TensorMap *map, const void *data, int64_t rows, int64_t cols, int dtype,
            uint32_t box_rows, uint32_t planes = 0, uint64_t plane_stride = 0)
{
  PFN_cuTensorMapEncodeTiled_v12000 encode = encode_tiled ();
  const uint32_t size = gmlp_num_dtype_size (dtype);
  const cuuint64_t dims[3] = { (cuuint64_t) cols, (cuuint64_t) (rows > 0 ? rows : 1), planes };
  const cuuint64_t strides[2] = { (cuuint64_t) cols * size, plane_stride };
  const cuuint32_t box[3] = { 128 / size, box_rows, 1 };
  const cuuint32_t element_strides[3] = { 1, 1, 1 };
  static_assert (sizeof (TensorMap) == sizeof (CUtensorMap), "a tensor map is 128 bytes");

  if (encode == nullptr)
    return false;
  return encode (reinterpret_cast<CUtensorMap *> (map),
                 dtype == GMLP_NUM_BFLOAT16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 :
                 dtype == GMLP_NUM_FLOAT16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 :
                 size == 1 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 :
                             CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
                 planes > 0 ? 3 : 2, const_cast<void *> (data), dims, strides, box,
                 element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

bool
pointers_ok (const void * const *table, uint32_t n)
{
  if (table == nullptr)
    return false;
  for (uint32_t i = 0; i < n; i++)
    if (table[i] == nullptr || !is_aligned (table[i], 16))
      return false;
  return true;
}

/* Whether A's scales are grouped by the device sizes (a_scale_rows). */
bool
grouped_a_scales (const GmlpKernelDeviceGemm *g)
{
  return g->device_rows != nullptr && blockwise (g);
}

/* Whether B's are (b_scale_rows): WGRAD's, the columnwise copy's of x. */
bool
grouped_b_scales (const GmlpKernelDeviceGemm *g)
{
  return grouped_a_scales (g) && g->kind == GMLP_KERNEL_GEMM_WGRAD;
}

/* Where a grouped scale tensor's rows are (rows of blocks of this many of
 * the operand's rows): A's scale rows for FPROP and DGRAD, 128-row blocks
 * of the tokens for WGRAD's columnwise copies. */
int64_t
scale_row_block (const GmlpKernelDeviceGemm *g)
{
  return g->kind == GMLP_KERNEL_GEMM_WGRAD ? 128 : 1;
}

/* A grouped scale tensor at data (grouped_a_scales(), grouped_b_scales())
 * with cols scales a row, as the quantizer allocated it. */
bool
describe_scales (GroupedOperand *op, const float *data, int64_t cols, const GmlpKernelDeviceGemm *g)
{
  GmlpKernelGroupedShape shape;

  shape.device_rows = g->device_rows;
  shape.n_groups = g->n_groups;
  shape.row_capacity = gmlp_quant_blocked_capacity (g->row_capacity, g->n_groups, scale_row_block (g));
  shape.cols = cols;
  return describe_operand (op, data, sizeof (float), &shape);
}

/* Whether one operand's FP8 scales are given: a grouped scale tensor
 * (rows, 16-byte aligned) or a pointer for every group (table). */
bool
scales_given (bool grouped, const float *rows, const float * const *table, uint32_t n_groups)
{
  return grouped ? rows != nullptr && is_aligned (rows, 16)
                 : pointers_ok ((const void * const *) table, n_groups);
}

/* Why the kernel does not take these blockwise scales, or nullptr. The
 * depth blocks are the stages (128 deep, from each group's first value);
 * A's scales are per row (activations and gradients, the only A operands
 * the layers make), B's per tile for FPROP and DGRAD (weights) and per row
 * for WGRAD. */
const char *
blockwise_refusal (const GmlpKernelDeviceGemm *g)
{
  const GmlpKernelFp8Scales &a = g->a_scales, &b = g->b_scales;
  const bool wgrad = g->kind == GMLP_KERNEL_GEMM_WGRAD;

  if (a.row_block != 1 || b.row_block != (wgrad ? 1 : 128))
    return wgrad ? "the Hopper kernel's blockwise FP8 WGRAD takes scales of rows (1 × 128 "
                   "blocks) for both operands"
                 : "the Hopper kernel's blockwise FP8 FPROP and DGRAD take A's scales in rows "
                   "(1 × 128 blocks) and B's in 128 × 128 tiles";
  if (a.row_stride < 0 || a.depth_stride < 0 || b.row_stride < 0 || b.depth_stride < 0)
    return "negative scale strides";
  return nullptr;
}

/* Whether the n pointers of table lie stride bytes apart (stride >= 0;
 * 0 for a single one). */
bool
equally_spaced (const void * const *table, uint32_t n, uint64_t *stride)
{
  const uintptr_t first = reinterpret_cast<uintptr_t> (table[0]);

  *stride = n > 1 ? reinterpret_cast<uintptr_t> (table[1]) - first : 0;
  if (n > 1 && reinterpret_cast<uintptr_t> (table[1]) < first)
    return false;
  for (uint32_t i = 2; i < n; i++)
    if (reinterpret_cast<uintptr_t> (table[i]) != first + i * *stride)
      return false;
  return true;
}

/* How FPROP and DGRAD read each group's B matrix (the weight): W_i (n × k)
 * K-major in block_n-row boxes for FPROP, in MN-major chunks of 64 rows
 * for 16-bit DGRAD; FP8 DGRAD's Wᵀ_i (k × n), K-major. */
struct WeightLayout
{
  int64_t  rows;
  int64_t  cols;
  uint32_t box_rows;
};

WeightLayout
weight_layout (const GmlpKernelDeviceGemm *g, const GmlpKernelSm90Tuning &t)
{
  const bool fp8 = gmlp_num_dtype_is_fp8 (g->ab_dtype);
  const bool dgrad = g->kind == GMLP_KERNEL_GEMM_DGRAD;

  if (dgrad && fp8)
    return { g->k, g->n, (uint32_t) block_n_of (g, t) };
  return { g->n, g->k, dgrad ? (uint32_t) Config<kOpsBf16>::kBlockK : (uint32_t) block_n_of (g, t) };
}

uint64_t
tile_bound (const GmlpKernelDeviceGemm *g, const GmlpKernelSm90Tuning &t)
{
  const Extents e = extents_of (g);
  const uint64_t tiles_n = div_up (e.out_cols, block_n_of (g, t));

  if (g->kind == GMLP_KERNEL_GEMM_WGRAD)
    return (uint64_t) g->n_groups * div_up (g->n, kBlockM) * tiles_n;
  return (div_up (g->row_capacity, kBlockM) + g->n_groups) * tiles_n;
}

/* Blockwise FP8 on the direct schedule: A's scales as one grouped tensor,
 * member i group i's m_i rows of ceil (k / 128) scales (the quantizer's
 * layout, which scale_member_offset() walks). With device sizes they are
 * one (a_scale_rows); with host sizes, a pointer per group, taken where
 * each lies where that layout puts it. */
bool
direct_a_scales (const GmlpKernelDeviceGemm *g, GroupedOperand *op)
{
  const int64_t cols = div_up (extents_of (g).a_cols, (int64_t) 128);
  uint64_t offset = 0;

  if (grouped_a_scales (g))
    return describe_scales (op, g->a_scale_rows, cols, g);
  if (!describe_scales (op, g->a_scale_inv[0], cols, g))
    return false;
  for (uint32_t i = 0; i < g->n_groups; i++)
    {
      if (reinterpret_cast<const uint8_t *> (g->a_scale_inv[i]) != op->data + offset)
        return false;
      offset += gmlp_num_member_stride (g->host_rows[i] > 0 ? g->host_rows[i] : 0, op->row_bytes);
    }
  return true;
}

/* The CTAs of a launch on the current device (grid_ctas()), or 0. */
int
device_grid_ctas (const GmlpKernelSm90Tuning &t)
{
  int n_sms = 0;

  if (current_device_attribute (cudaDevAttrMultiProcessorCount, &n_sms) != cudaSuccess)
    {
      (void) cudaGetLastError ();
      return 0;
    }
  return grid_ctas (t, n_sms);
}

StreamKRoom
stream_k_room (const GmlpKernelDeviceGemm *g, const GmlpKernelSm90Tuning &t, int n_sms)
{
  StreamKRoom room = { 0, 0 };

  if (n_sms <= 0 || !stream_k_pays (g, t, block_n_of (g, t), n_sms))
    return room;
  /* A slot: two halves of 64 rows × block_n FP32 sums. */
  room.partials = (size_t) n_sms * 128 * (size_t) block_n_of (g, t) * sizeof (float);
  room.flags = (size_t) n_sms * 2 * sizeof (uint32_t);
  return room;
}

/* Fills in the direct schedule (DirectSchedule) where it takes the call:
 * FPROP or DGRAD (blockwise: small products on 128 × 128 tiles; 16-bit
 * DGRAD: small products, kDgrad16DirectMaxMacs); rows of A
 * and C that are whole multiples of the member alignment, so that member g
 * starts at row P_g of one matrix; the groups' B matrices, biases and
 * scales equally spaced (blockwise: B's; A's as direct_a_scales() takes
 * them); host sizes that fit in the parameters; not where the tuning's
 * direct is NEVER (the tests check the plan on shapes the direct schedule
 * takes). With b_half, also B's map in boxes of half a tile's rows (paired
 * CTAs', pairs_pay()). */
bool
direct_schedule (const GmlpKernelDeviceGemm *g, const GmlpKernelSm90Tuning &t, DirectSchedule *d,
                 TensorMap *b_half)
{
  const bool fp8 = gmlp_num_dtype_is_fp8 (g->ab_dtype);
  const Extents e = extents_of (g);
  const int b_dtype = fp8 ? g->b_dtype : g->ab_dtype;
  const uint64_t a_row_bytes = (uint64_t) e.a_cols * gmlp_num_dtype_size (g->ab_dtype);
  const uint64_t c_row_bytes = (uint64_t) e.out_cols * gmlp_num_dtype_size (g->c_dtype);
  const WeightLayout b = weight_layout (g, t);   /* as the plan's template reads it */
  uint64_t b_stride, bias_stride = 0, a_scale_stride = 0, b_scale_stride = 0;

  const bool blocks = fp8 && blockwise (g);
  /* The product's multiply-adds at the rows A can hold. */
  const double macs = (double) g->row_capacity * (double) e.out_cols * (double) e.reduction;
  GroupedOperand a_scales = {};

  if (t.direct == GMLP_KERNEL_CHOICE_NEVER || !direct_capable (operands_of (g, t), g->kind) ||
      (blocks && macs > kBlockwiseDirectMaxMacs) ||
      (!fp8 && g->kind == GMLP_KERNEL_GEMM_DGRAD && macs > kDgrad16DirectMaxMacs) ||
      a_row_bytes % kGmlpMemberAlignment != 0 || c_row_bytes % kGmlpMemberAlignment != 0 ||
      (g->host_rows != nullptr && g->n_groups > kDirectHostGroups))
    return false;
  if (!equally_spaced (g->weight, g->n_groups, &b_stride) ||
      (g->bias != nullptr && !equally_spaced (g->bias, g->n_groups, &bias_stride)) ||
      (fp8 && !equally_spaced ((const void * const *) g->b_scale_inv, g->n_groups, &b_scale_stride)) ||
      (fp8 && !blocks && !equally_spaced ((const void * const *) g->a_scale_inv, g->n_groups, &a_scale_stride)) ||
      (blocks && !direct_a_scales (g, &a_scales)))
    return false;
  if (g->n_groups == 1)
    b_stride = (uint64_t) b.rows * (uint64_t) b.cols * gmlp_num_dtype_size (b_dtype);
  if (b_stride == 0 || b_stride % 16 != 0)
    return false;

  memset (d, 0, sizeof *d);
  if (!encode_map (&d->a, g->a, g->row_capacity, e.a_cols, g->ab_dtype, kBlockM) ||
      !encode_map (&d->c, g->c_rows, g->row_capacity, e.out_cols, g->c_dtype, 64) ||
      !encode_map (&d->b, g->weight[0], b.rows, b.cols, b_dtype, b.box_rows, g->n_groups,
                   b_stride) ||
      (b_half != nullptr && !encode_map (b_half, g->weight[0], b.rows, b.cols, b_dtype, b.box_rows / 2,
                                         g->n_groups, b_stride)))
    return false;
  d->device_rows = g->device_rows;
  d->capacity = g->row_capacity;
  d->c_data = static_cast<uint8_t *> (g->c_rows);
  d->c_row_bytes = c_row_bytes;
  d->bias = g->bias != nullptr ? static_cast<const uint8_t *> (g->bias[0]) : nullptr;
  d->bias_stride = bias_stride;
  if (fp8)
    {
      d->a_scale = blocks ? nullptr : reinterpret_cast<const uint8_t *> (g->a_scale_inv[0]);
      d->b_scale = reinterpret_cast<const uint8_t *> (g->b_scale_inv[0]);
      d->a_scale_stride = a_scale_stride;
      d->b_scale_stride = b_scale_stride;
      d->a_scales = a_scales;
    }
  if (g->host_rows != nullptr)
    for (uint32_t i = 0; i < g->n_groups; i++)
      d->host_rows[i] = (uint32_t) (g->host_rows[i] < 0 ? 0 :
                                    g->host_rows[i] < g->row_capacity ? g->host_rows[i] :
                                                                        g->row_capacity);
  return true;
}

template <int kWords>
GmlpKernelStatus
launch_plan (const PlanParams &plan, const uint64_t *table, size_t n_words, cudaStream_t stream)
{
  InlineTables<kWords> tables;

  memset (&tables, 0, sizeof tables);
  if (kWords > 0)
    memcpy (tables.words, table, n_words * sizeof (uint64_t));
  plan_kernel<kWords><<<1, kPlanThreads, 0, stream>>> (plan, tables);
  return check_launch ();
}

template <int kOps>
GmlpKernelStatus
launch_kind (int kind, const GemmParams &params, int n_sms, cudaStream_t stream)
{
  switch (kind)
    {
    case GMLP_KERNEL_GEMM_FPROP: return launch_gemm<kOps, GMLP_KERNEL_GEMM_FPROP> (params, n_sms, stream);
    case GMLP_KERNEL_GEMM_DGRAD: return launch_gemm<kOps, GMLP_KERNEL_GEMM_DGRAD> (params, n_sms, stream);
    default:                     return launch_gemm<kOps, GMLP_KERNEL_GEMM_WGRAD> (params, n_sms, stream);
    }
}

/* FP8: FPROP's instance for DGRAD too (Operands). */
template <int kOps>
GmlpKernelStatus
launch_fp8_kind (bool wgrad, const GemmParams &params, int n_sms, cudaStream_t stream)
{
  return wgrad ? launch_gemm<kOps, GMLP_KERNEL_GEMM_WGRAD> (params, n_sms, stream)
               : launch_gemm<kOps, GMLP_KERNEL_GEMM_FPROP> (params, n_sms, stream);
}

GmlpKernelStatus
launch_fp8 (int ops, bool wgrad, const GemmParams &params, int n_sms, cudaStream_t stream)
{
  switch (ops)
    {
    case kOpsE4m3E4m3: return launch_fp8_kind<kOpsE4m3E4m3> (wgrad, params, n_sms, stream);
    case kOpsE4m3E5m2: return launch_fp8_kind<kOpsE4m3E5m2> (wgrad, params, n_sms, stream);
    case kOpsE5m2E4m3: return launch_fp8_kind<kOpsE5m2E4m3> (wgrad, params, n_sms, stream);
    case kOpsE4m3E4m3Wide: return launch_fp8_kind<kOpsE4m3E4m3Wide> (wgrad, params, n_sms, stream);
    case kOpsE4m3E5m2Wide: return launch_fp8_kind<kOpsE4m3E5m2Wide> (wgrad, params, n_sms, stream);
    case kOpsE5m2E4m3Wide: return launch_fp8_kind<kOpsE5m2E4m3Wide> (wgrad, params, n_sms, stream);
    case kOpsE4m3E4m3Blocks: return launch_fp8_kind<kOpsE4m3E4m3Blocks> (wgrad, params, n_sms, stream);
    case kOpsE5m2E4m3Blocks: return launch_fp8_kind<kOpsE5m2E4m3Blocks> (wgrad, params, n_sms, stream);
    case kOpsE4m3E4m3BlocksWide: return launch_fp8_kind<kOpsE4m3E4m3BlocksWide> (wgrad, params, n_sms, stream);
    default:           return launch_fp8_kind<kOpsE5m2E4m3BlocksWide> (wgrad, params, n_sms, stream);
    }
}

GmlpKernelStatus
launch_operands (int ops, int kind, const GemmParams &params, int n_sms, cudaStream_t stream)
{
  switch (ops)
    {
    case kOpsBf16: return launch_kind<kOpsBf16> (kind, params, n_sms, stream);
    case kOpsFp16: return launch_kind<kOpsFp16> (kind, params, n_sms, stream);
    default:       return launch_fp8 (ops, kind == GMLP_KERNEL_GEMM_WGRAD, params, n_sms, stream);
    }
}

}  // namespace
}  // namespace sm90
}  // namespace gmlp

extern "C" GmlpKernelStatus
gmlp_kernel_device_gemm_sm90_check (const GmlpKernelDeviceGemm  *gemm,
                                    const GmlpKernelSm90Tuning  *tuning,
                                    int                          device_major,
                                    int                          device_minor,
                                    const char                 **reason)
{
  using namespace gmlp;
  using namespace gmlp::sm90;
  const GmlpKernelSm90Tuning &t = tuning != nullptr ? *tuning : kNoTuning;
  const char *unused;
  bool wgrad;

  if (reason == nullptr)
    reason = &unused;
  *reason = nullptr;
  if (gemm == nullptr || gemm->n_groups == 0 ||
      (gemm->device_rows == nullptr) == (gemm->host_rows == nullptr) ||
      gemm->row_capacity < 0 || gemm->n <= 0 || gemm->k <= 0 || gemm->a == nullptr ||
      (gemm->kind != GMLP_KERNEL_GEMM_FPROP && gemm->kind != GMLP_KERNEL_GEMM_DGRAD &&
       gemm->kind != GMLP_KERNEL_GEMM_WGRAD))
    {
      *reason = "invalid arguments";
      return GMLP_KERNEL_INVALID_VALUE;
    }
  wgrad = gemm->kind == GMLP_KERNEL_GEMM_WGRAD;
  if (wgrad ? (gemm->b_rows == nullptr || !pointers_ok ((const void * const *) gemm->wgrad, gemm->n_groups))
            : (gemm->c_rows == nullptr || !pointers_ok (gemm->weight, gemm->n_groups)))
    {
      *reason = "an operand pointer is missing or not 16-byte aligned";
      return GMLP_KERNEL_INVALID_VALUE;
    }
  if (gemm->bias != nullptr &&
      (gemm->kind != GMLP_KERNEL_GEMM_FPROP || !pointers_ok (gemm->bias, gemm->n_groups)))
    {
      *reason = "a bias is added only by FPROP, and needs every group's pointer";
      return GMLP_KERNEL_INVALID_VALUE;
    }
  if (device_major != 9 || device_minor != 0)
    {
      *reason = "the Hopper kernel needs a compute capability 9.0 GPU";
      return GMLP_KERNEL_UNSUPPORTED;
    }
  if (gmlp_num_dtype_is_fp8 (gemm->ab_dtype))
    {
      if (operands_of (gemm, t) < 0)
        {
          *reason = blockwise (gemm) ?
            "the Hopper kernel multiplies FP8 operands with blockwise scales E4M3 × E4M3 or "
            "E5M2 × E4M3" :
            "the Hopper kernel multiplies FP8 operands E4M3 × E4M3, E4M3 × E5M2 or E5M2 × E4M3";
          return GMLP_KERNEL_UNSUPPORTED;
        }
      if (blockwise (gemm) && (*reason = blockwise_refusal (gemm)) != nullptr)
        return GMLP_KERNEL_UNSUPPORTED;
      if (wgrad && blockwise (gemm) && gemm->host_rows != nullptr && !host_rows_aligned (gemm))
        {
          *reason = "the Hopper kernel's blockwise FP8 WGRAD of host sizes needs each a multiple "
                    "of 16 (TMA reads rows of whole 16-byte units)";
          return GMLP_KERNEL_UNSUPPORTED;
        }
      if (!scales_given (grouped_a_scales (gemm), gemm->a_scale_rows, gemm->a_scale_inv, gemm->n_groups) ||
          !scales_given (grouped_b_scales (gemm), gemm->b_scale_rows, gemm->b_scale_inv, gemm->n_groups))
        {
          *reason = "FP8 operands need every group's scale inverse pointers";
          return GMLP_KERNEL_INVALID_VALUE;
        }
      if (gemm->c_dtype != GMLP_NUM_FLOAT32 && gemm->c_dtype != GMLP_NUM_BFLOAT16 &&
          gemm->c_dtype != GMLP_NUM_FLOAT16)
        {
          *reason = "the Hopper kernel writes FP8 products as float32, bfloat16 or float16";
          return GMLP_KERNEL_UNSUPPORTED;
        }
      if (gemm->n % 16 != 0 || gemm->k % 16 != 0)
        {
          *reason = "TMA needs rows of whole 16-byte units: FP8 in and out features multiples of 16";
          return GMLP_KERNEL_UNSUPPORTED;
        }
    }
  else if (operands_of (gemm, t) < 0)
    {
      *reason = "the Hopper kernel multiplies bfloat16, float16 or FP8 operands";
      return GMLP_KERNEL_UNSUPPORTED;
    }
  else if (gemm->c_dtype != gemm->ab_dtype && gemm->c_dtype != GMLP_NUM_FLOAT32)
    {
      *reason = "the Hopper kernel writes the operands' dtype or float32";
      return GMLP_KERNEL_UNSUPPORTED;
    }
  else if (gemm->n % 8 != 0 || gemm->k % 8 != 0)
    {
      *reason = "TMA needs rows of whole 16-byte units: in and out features multiples of 8";
      return GMLP_KERNEL_UNSUPPORTED;
    }
  if (gemm->n > kMaxExtent || gemm->k > kMaxExtent || gemm->row_capacity > kMaxExtent ||
      tile_bound (gemm, t) > (uint64_t) INT32_MAX ||
      (repacks (gemm) && repack_capacity (gemm) > kMaxExtent))
    {
      *reason = "the shapes exceed the kernel's 32-bit coordinates";
      return GMLP_KERNEL_UNSUPPORTED;
    }
  return GMLP_KERNEL_SUCCESS;
}

extern "C" size_t
gmlp_kernel_device_gemm_sm90_workspace_bytes (const GmlpKernelDeviceGemm *gemm,
                                              const GmlpKernelSm90Tuning *tuning)
{
  using namespace gmlp::sm90;

  return gemm != nullptr ? workspace_layout (gemm, tuning != nullptr ? *tuning : kNoTuning).total : 0;
}

extern "C" GmlpKernelStatus
gmlp_kernel_device_gemm_sm90 (const GmlpKernelDeviceGemm *gemm,
                              const GmlpKernelSm90Tuning *tuning,
                              void                       *workspace,
                              int                         n_sms,
                              cudaStream_t                stream)
{
  using namespace gmlp;
  using namespace gmlp::sm90;
  const GmlpKernelSm90Tuning &t = tuning != nullptr ? *tuning : kNoTuning;
  int major = 0, minor = 0;
  GmlpKernelStatus status;
  WorkspaceLayout layout;
  GmlpKernelGroupedShape shape;
  PlanParams plan;
  GemmParams params;
  uint8_t *ws = static_cast<uint8_t *> (workspace);
  uint64_t *table;
  size_t table_words;
  const bool wgrad = gemm != nullptr && gemm->kind == GMLP_KERNEL_GEMM_WGRAD;
  const bool fp8 = gemm != nullptr && gmlp_num_dtype_is_fp8 (gemm->ab_dtype);
  const uint32_t a_size = gemm != nullptr ? gmlp_num_dtype_size (gemm->ab_dtype) : 0;
  const uint32_t c_size = gemm != nullptr ? gmlp_num_dtype_size (gemm->c_dtype) : 0;
  /* B's dtype: its own for FP8, A's otherwise. */
  const int b_dtype = fp8 ? gemm->b_dtype : gemm != nullptr ? gemm->ab_dtype : 0;
  const int block_n = gemm != nullptr ? block_n_of (gemm, t) : 0;
  const int block_k = gemm != nullptr ? block_k_of (gemm) : 0;
  Extents e;

  if (current_device_attribute (cudaDevAttrComputeCapabilityMajor, &major) != cudaSuccess ||
      current_device_attribute (cudaDevAttrComputeCapabilityMinor, &minor) != cudaSuccess)
    return GMLP_KERNEL_LAUNCH_FAILED;
  status = gmlp_kernel_device_gemm_sm90_check (gemm, tuning, major, minor, nullptr);
  if (status != GMLP_KERNEL_SUCCESS)
    return status;
  if (workspace == nullptr || !is_aligned (workspace, 256) || n_sms <= 0)
    return GMLP_KERNEL_INVALID_VALUE;
  n_sms = grid_ctas (t, n_sms);

  layout = workspace_layout (gemm, t);
  e = extents_of (gemm);

  memset (&params, 0, sizeof params);
  params.n_groups = gemm->n_groups;
  params.tiles_n = (uint32_t) div_up (e.out_cols, block_n);
  params.tiles_m_fixed = wgrad ? (uint32_t) div_up (gemm->n, kBlockM) : 0;
  params.out_rows_fixed = wgrad ? gemm->n : 0;
  params.out_cols = e.out_cols;
  params.reduction = e.reduction;
  params.c_dtype = gemm->c_dtype;
  params.short_tiles = short_tiles_on (t, fp8, e.reduction);
  params.a_scales = gemm->a_scales;
  params.b_scales = gemm->b_scales;
  params.pairs = pairs_pay (gemm, t, block_n, n_sms);
  params.even_waves = even_waves (gemm, t, block_n, n_sms);
  if (direct_schedule (gemm, t, &params.direct, params.pairs ? &params.b_half : nullptr))
    {
      params.use_direct = 1;
      const StreamKRoom room = stream_k_room (gemm, t, n_sms);

      if (room.flags != 0)
        {
          /* The workspace's room was sized for the current device's grid:
           * this one's must fit it. The flags start lowered. */
          if (layout.partial_flags - layout.partials < room.partials || layout.total - layout.partial_flags < room.flags)
            return GMLP_KERNEL_INVALID_VALUE;
          params.stream_k = 1;
          params.partials = reinterpret_cast<float *> (ws + layout.partials);
          params.partial_flags = reinterpret_cast<uint32_t *> (ws + layout.partial_flags);
          const cudaError_t err = cudaMemsetAsync (params.partial_flags, 0, room.flags, stream);

          if (err != cudaSuccess)
            return record_cuda_error (err);
        }
      return launch_operands (operands_of (gemm, t), gemm->kind, params, n_sms, stream);
    }
  /* The plan's schedule never runs paired (Pairable). */
  params.pairs = 0;

  memset (&plan, 0, sizeof plan);
  shape.device_rows = gemm->device_rows;
  shape.n_groups = gemm->n_groups;
  shape.row_capacity = gemm->row_capacity;
  shape.cols = e.a_cols;
  if (!describe_operand (&plan.a, gemm->a, a_size, &shape))
    return GMLP_KERNEL_INVALID_VALUE;
  shape.cols = e.rows2_cols;
  if (!describe_operand (&plan.rows2, wgrad ? gemm->b_rows : gemm->c_rows,
                         wgrad ? gmlp_num_dtype_size (b_dtype) : c_size, &shape))
    return GMLP_KERNEL_INVALID_VALUE;

  /* Templates: the plan edits each copy's address and, for row-grouped
   * operands, its row count. C is written in boxes of 64 rows. */
  if (!encode_map (&plan.template_c, wgrad ? gemm->wgrad[0] : gemm->c_rows,
                   wgrad ? gemm->n : 1, e.out_cols, gemm->c_dtype, 64))
    return GMLP_KERNEL_LAUNCH_FAILED;
  if (wgrad && fp8)
    {
      /* dyᵀ_g (n × m_g) and xᵀ_g (k × m_g), K-major; the plan sets each
       * group's row length and stride. */
      if (!encode_map (&plan.template_a, gemm->a, gemm->n, 128, gemm->ab_dtype, kBlockM) ||
          !encode_map (&plan.template_b, gemm->b_rows, gemm->k, 128, b_dtype, block_n))
        return GMLP_KERNEL_LAUNCH_FAILED;
    }
  else if (wgrad)
    {
      if (!encode_map (&plan.template_a, gemm->a, 1, gemm->n, gemm->ab_dtype, block_k) ||
          !encode_map (&plan.template_b, gemm->b_rows, 1, gemm->k, gemm->ab_dtype, block_k))
        return GMLP_KERNEL_LAUNCH_FAILED;
    }
  else
    {
      const WeightLayout b = weight_layout (gemm, t);

      if (!encode_map (&plan.template_a, gemm->a, 1, e.a_cols, gemm->ab_dtype, kBlockM) ||
          !encode_map (&plan.template_b, gemm->weight[0], b.rows, b.cols, b_dtype, b.box_rows))
        return GMLP_KERNEL_LAUNCH_FAILED;
    }

  plan.device_rows = gemm->device_rows;
  plan.n_groups = gemm->n_groups;
  plan.kind = gemm->kind;
  plan.transposed = wgrad && fp8;
  plan.tiles_n = params.tiles_n;
  plan.tiles_m_fixed = params.tiles_m_fixed;
  plan.has_bias = gemm->bias != nullptr;
  plan.has_scales = fp8;
  plan.blockwise = fp8 && blockwise (gemm);
  plan.a_scales_grouped = fp8 && grouped_a_scales (gemm);
  plan.b_scales_grouped = fp8 && grouped_b_scales (gemm);
  plan.scale_row_block = scale_row_block (gemm);
  /* FPROP, DGRAD: A's member i is m_i rows of ceil (depth / 128) scales.
   * WGRAD: the copies' member i is ceil (m_i / 128) rows of n (A) or k (B). */
  if (plan.a_scales_grouped &&
      !describe_scales (&plan.a_scales, gemm->a_scale_rows,
                        wgrad ? gemm->n : div_up (e.a_cols, (int64_t) 128), gemm))
    return GMLP_KERNEL_INVALID_VALUE;
  if (plan.b_scales_grouped && !describe_scales (&plan.b_scales, gemm->b_scale_rows, gemm->k, gemm))
    return GMLP_KERNEL_INVALID_VALUE;
  plan.has_accumulate = gemm->accumulate != nullptr;
  plan.tile_begin = reinterpret_cast<uint32_t *> (ws + layout.tile_begin);
  plan.groups = reinterpret_cast<GroupWork *> (ws + layout.groups);
  plan.maps = reinterpret_cast<TensorMap *> (ws + layout.maps);
  if (repacks (gemm))
    {
      plan.repack = reinterpret_cast<RepackGroup *> (ws + layout.repack);
      plan.repack_a = ws + layout.repack_a;
      plan.repack_b = ws + layout.repack_b;
    }

  /* The host tables go by kernel parameter: inside the plan's own launch
   * when they fit, else written into the workspace first. */
  table_words = gmlp::sm90::table_words (gemm->n_groups, fp8);
  table = static_cast<uint64_t *> (calloc (table_words, sizeof (uint64_t)));
  if (table == nullptr)
    return GMLP_KERNEL_INVALID_VALUE;
  for (uint32_t g = 0, n = gemm->n_groups; g < n; g++)
    {
      table[g] = (uint64_t) (uintptr_t) (wgrad ? gemm->wgrad[g] : gemm->weight[g]);
      table[n + g] = gemm->bias != nullptr ? (uint64_t) (uintptr_t) gemm->bias[g] : 0;
      table[2 * n + g] = gemm->host_rows != nullptr ? (uint64_t) gemm->host_rows[g] : 0;
      if (fp8)
        {
          table[3 * n + g] = grouped_a_scales (gemm) ? 0 : (uint64_t) (uintptr_t) gemm->a_scale_inv[g];
          table[4 * n + g] = grouped_b_scales (gemm) ? 0 : (uint64_t) (uintptr_t) gemm->b_scale_inv[g];
        }
    }
  if (gemm->accumulate != nullptr)
    memcpy (table + pointer_tables (fp8) * gemm->n_groups, gemm->accumulate, gemm->n_groups);
  if (table_words <= (size_t) kInlineSmall)
    status = launch_plan<kInlineSmall> (plan, table, table_words, stream);
  else if (table_words <= (size_t) kInlineLarge)
    status = launch_plan<kInlineLarge> (plan, table, table_words, stream);
  else
    {
      status = gmlp_kernel_write_table (ws + layout.tables, table,
                                        table_words * sizeof (uint64_t), stream);
      plan.tables = reinterpret_cast<const uint64_t *> (ws + layout.tables);
      if (status == GMLP_KERNEL_SUCCESS)
        status = launch_plan<0> (plan, table, 0, stream);
    }
  free (table);
  if (status != GMLP_KERNEL_SUCCESS)
    return status;
  if (plan.repack != nullptr)
    {
      /* After the whole plan (an ordinary launch): the GEMM, its
       * programmatic dependent, then waits for the repack. */
      repack_kernel<<<4 * n_sms, 256, 0, stream>>> (plan.repack, gemm->n_groups,
                                                     (uint32_t) gemm->n, (uint32_t) gemm->k);
      status = check_launch ();
      if (status != GMLP_KERNEL_SUCCESS)
        return status;
    }

  params.tile_begin = plan.tile_begin;
  params.groups = plan.groups;
  params.maps = plan.maps;
  return launch_operands (operands_of (gemm, t), gemm->kind, params, n_sms, stream);
}
