/* gmlp-backend.h: the private backend interface
 *
 * A backend serves one kind of device. The GObjects call into it through this
 * table of function pointers and know nothing else of the device. All device
 * work is enqueued on the device's stream in call order; only `download` and
 * `synchronize` wait for it. Pointers called "device memory" are host
 * pointers for the CPU backend.
 *
 * The CUDA backend is a loadable module (libgmlp-backend-cuda.so) exporting
 * gmlp_backend_cuda_get(), so that libgmlp itself never links CUDA.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* Bumped whenever the table changes; a module built for another version is
 * refused. */
#define GMLP_BACKEND_ABI_VERSION 16

typedef struct _GmlpBackendDevice GmlpBackendDevice;
typedef struct _GmlpBackendEvent GmlpBackendEvent;
typedef struct _GmlpBackendGraph GmlpBackendGraph;

/* A grouped shape whose group sizes are in device memory (n_groups INT64
 * values). Members are laid out with gmlp_num_member_stride(). Sizes beyond
 * row_capacity are clamped by the kernels so nothing outside the allocation is
 * ever touched. */
typedef struct {
  const gint64 *device_rows;
  guint         n_groups;
  gint64        cols;
  gint64        row_capacity;
} GmlpBackendShape;

/* The three products of a grouped linear layer, group by group. All matrices
 * are dense row-major (leading dimension = their column count):
 *   FPROP  C_i[m_i × n]    = A_i[m_i × k] · B_i[n × k]ᵀ    (y = x Wᵀ)
 *   DGRAD  C_i[m_i × k]    = A_i[m_i × n] · B_i[n × k]     (dx = dy W)
 *   WGRAD  C_i[n × k]    (+)= A_i[m_i × n]ᵀ · B_i[m_i × k]  (dW = dyᵀ x)
 * Accumulation is in FP32. For WGRAD a group with m_i = 0 gives C_i = 0, or
 * leaves C_i as it is when accumulating; for FPROP and DGRAD such a group has
 * nothing to write. */
typedef enum {
  GMLP_GEMM_FPROP,
  GMLP_GEMM_DGRAD,
  GMLP_GEMM_WGRAD,
} GmlpGemmKind;

/* Where the FP8 scale inverses of one operand of a product lie, the
 * operand seen K-major as the product reads it (rows × depth, summed over
 * depth). row_block 0: one scale per group (the per-tensor recipes).
 * Otherwise blocks of row_block rows (1 or 128) ×
 * GMLP_BACKEND_FP8_DEPTH_BLOCK values along the depth, from the group's
 * first row and value: the scale of row r, depth d of group i is
 * scales_i[(r / row_block) × row_stride + (d / 128) × depth_stride]
 * (the blockwise recipe: a rowwise tensor's 1 × 128 blocks have row_block
 * 1, row_stride ceil (depth / 128), depth_stride 1; a columnwise copy's
 * row_block 1, row_stride 1, depth_stride its rows; weights' tiles
 * row_block 128). All zeros is per-tensor. */
#define GMLP_BACKEND_FP8_DEPTH_BLOCK 128

typedef struct {
  gint64 row_block;
  gint64 row_stride;
  gint64 depth_stride;
} GmlpBackendFp8Scales;

static inline gboolean
gmlp_backend_fp8_scales_blockwise (const GmlpBackendFp8Scales *a,
                                   const GmlpBackendFp8Scales *b)
{
  return a->row_block != 0 || b->row_block != 0;
}

/* The scale of row row, depth depth in a group's scales. */
static inline float
gmlp_backend_fp8_scale_at (const GmlpBackendFp8Scales *s,
                           const float                *scales,
                           gint64                      row,
                           gint64                      depth)
{
  if (s->row_block == 0)
    return scales[0];
  return scales[(row / s->row_block) * s->row_stride +
                (depth / GMLP_BACKEND_FP8_DEPTH_BLOCK) * s->depth_stride];
}

/* The activations of a grouped MLP; the values equal GmlpActivation's. The
 * gated ones (SWIGLU, GEGLU) read rows of 2f values [a | b] and give
 * act(a) * b. GELU is the tanh approximation:
 *   gelu(x) = x/2 (1 + tanh (sqrt(2/pi) (x + 0.044715 x^3))),
 *   silu(x) = x sigmoid(x), relu(x) = max(x, 0), srelu(x) = relu(x)^2. */
enum {
  GMLP_ACT_GELU = 0,
  GMLP_ACT_RELU = 1,
  GMLP_ACT_SRELU = 2,
  GMLP_ACT_SWIGLU = 3,
  GMLP_ACT_GEGLU = 4,
};

/* One grouped product (the gemm entry), every case: 16-bit, FP32 or FP8
 * operands, group sizes on the host or on the device, bias and
 * accumulation in the epilogue. Each operand is described once, by where
 * its members lie (GmlpBackendOperand), its dtype and, for FP8, its scales:
 *
 *   FPROP  c_i (m_i × n)   = a_i (m_i × k) · b_i (n × k)ᵀ [+ bias_i]
 *   DGRAD  c_i (m_i × k)   = a_i (m_i × n) · b_i (n × k)
 *   WGRAD  c_i (n × k)   [+]= a_i (m_i × n)ᵀ · b_i (m_i × k)
 *
 * a (x or dy), FPROP's and DGRAD's c (y, dx) and WGRAD's b (x) are grouped
 * by the group sizes (ROWS); the weights b (FPROP, DGRAD), the weight
 * gradients c (WGRAD) and the bias are per-group matrices of fixed shape
 * (STRIDED, or TABLE for tensors a caller gave one by one).
 *
 * Sizes: rows (host memory, n_groups values) or, when rows is NULL,
 * device_rows (device memory, read by the device only, so that the call
 * can be captured in a graph) with row_capacity, the rows each grouped
 * operand can hold: a negative size counts as 0 and sizes that overrun the
 * capacity are clamped as in docs/memory-layout.md (a group gets the rows
 * that fit in every grouped operand).
 *
 * Sums are FP32 (FP8: the partial sums promoted to FP32, no reduced
 * "fast accumulation"), stored once in c's dtype: a's dtype, or FLOAT32
 * (FP8: FLOAT32, FLOAT16 or BFLOAT16). An FPROP's bias (n values of c's
 * dtype per group, layout NONE for none) is added to the FP32 sum before
 * that one rounding. A WGRAD group whose accumulate entry is 1 adds into
 * c_i (accumulate, host memory, NULL: overwrite every group); a WGRAD group
 * with m_i = 0 gives c_i = 0, or leaves an accumulating c_i as it is;
 * FPROP and DGRAD groups with no rows have nothing to write.
 *
 * FP8: a and b are FLOAT8_E4M3 or FLOAT8_E5M2, both K-major (the summed
 * dimension contiguous), the transposed ones being the quantizer's
 * columnwise copies: DGRAD's b is Wᵀ_i (k × n); WGRAD's a and b are the
 * copies of dy and x (member i n × m_i and k × m_i, at the offsets of the
 * rowwise members). A value q of group i stands for q × its scale inverse
 * (GmlpBackendOperand.scale_inv). What a backend cannot do it says through
 * gemm_supported, before anything is enqueued. */
typedef enum {
  GMLP_BACKEND_OPERAND_NONE = 0,  /* no operand (an FPROP without bias) */
  GMLP_BACKEND_OPERAND_ROWS,      /* grouped by the sizes: member i at base +
                                   * Σ_{j<i} gmlp_num_member_stride (m_j, row
                                   * bytes), 256-byte aligned */
  GMLP_BACKEND_OPERAND_STRIDED,   /* fixed shape: member i at base + i × stride */
  GMLP_BACKEND_OPERAND_TABLE,     /* fixed shape: member i at table[i], a host
                                   * array of n_groups device pointers */
} GmlpBackendOperandLayout;

typedef struct {
  GmlpBackendOperandLayout  layout;
  int                       dtype;
  gpointer                  base;       /* ROWS, STRIDED */
  guint64                   stride;     /* STRIDED: bytes from member to member */
  void * const             *table;      /* TABLE */
  /* FP8 only. With per-tensor scales (scales all zeros) group i's one FP32
   * scale inverse is at scale_inv + i × scale_stride bytes. With blockwise
   * scales (see GmlpBackendFp8Scales) a fixed-shape operand's (128 × 128
   * tiles) are there too; a ROWS operand's are grouped by the sizes as the
   * quantizer lays them out, from scale_inv: FPROP's and DGRAD's a has
   * member i m_i × ceil (depth / 128) floats (rows), WGRAD's copies member
   * i ceil (m_i / 128) × n floats for a, × k for b (blocks of 128 rows). */
  GmlpBackendFp8Scales      scales;
  const float              *scale_inv;
  guint64                   scale_stride;
} GmlpBackendOperand;

typedef struct {
  GmlpGemmKind        kind;
  guint               n_groups;
  gint64              n;              /* out_features */
  gint64              k;              /* in_features */
  const gint64       *rows;           /* host sizes, or NULL: */
  const gint64       *device_rows;    /* device sizes */
  gint64              row_capacity;   /* device sizes: rows of each grouped operand */
  GmlpBackendOperand  a;
  GmlpBackendOperand  b;
  GmlpBackendOperand  c;
  GmlpBackendOperand  bias;           /* FPROP, optional */
  const guint8       *accumulate;     /* WGRAD, optional */
} GmlpBackendGemm;

/* The product of a group with m rows as C (rows × cols) = A (rows × depth)
 * · B (cols × depth)ᵀ, the summed dimension last (the K-major terms of the
 * FP8 products and of the output's shape), the same for every backend. */
static inline void
gmlp_backend_gemm_group_shape (GmlpGemmKind  kind,
                               gint64        m,
                               gint64        n,
                               gint64        k,
                               gint64       *rows,
                               gint64       *cols,
                               gint64       *depth)
{
  switch (kind)
    {
    case GMLP_GEMM_FPROP:
      *rows = m, *cols = n, *depth = k;
      break;
    case GMLP_GEMM_DGRAD:
      *rows = m, *cols = k, *depth = n;
      break;
    case GMLP_GEMM_WGRAD:
    default:
      *rows = n, *cols = k, *depth = m;
      break;
    }
}

static inline gboolean
gmlp_backend_gemm_blockwise (const GmlpBackendGemm *gemm)
{
  return gmlp_backend_fp8_scales_blockwise (&gemm->a.scales, &gemm->b.scales);
}

/* Token permutation (gmlp-routing-permute.c). A routing of T tokens with k
 * choices each gives choice c = t k + j the expert indices[c] (T × k INT64,
 * token-major, device memory); an index outside [0, n_experts) is a choice
 * that goes nowhere. The permuted layout is a grouped tensor of n_experts
 * groups whose sizes are only on the device: the routing_map entry writes
 * them. Its rows are numbered by "slots": expert by expert, the padded rows
 * of each back to back (slot s of expert e is its row s − Σ_{e' < e}
 * sizes[e']), whatever the member padding of the tensor's dtype; kernels
 * work out each member's offset from the sizes (docs/memory-layout.md),
 * never on the host. Every count, slot and offset is 64-bit. */
#define GMLP_BACKEND_MAX_TOP_K 16

typedef struct {
  gint64        n_tokens;        /* T */
  guint         top_k;           /* k, 1 .. GMLP_BACKEND_MAX_TOP_K */
  guint         n_experts;
  const gint64 *indices;         /* T × k */
  /* Each expert's rows are rounded up to a multiple of padding (1: none);
   * the padding rows have no choice. */
  gint64        padding;
  /* The most choices an expert keeps, a multiple of padding, or -1
   * (dropless). An expert keeps its choices in slot order (the earliest
   * tokens, Megatron's "position" drop policy) and drops the rest. */
  gint64        expert_capacity;
  /* Slots there are: the host's bound on Σ sizes, T k + min (E, T k) ×
   * (padding − 1), or at most n_experts × expert_capacity. */
  gint64        row_capacity;
  /* Outputs, device memory, every element written: */
  gint64       *sizes;           /* n_experts: padded rows of each expert */
  gint64       *row_of;          /* T × k: the slot of each choice, -1 when it
                                  * goes nowhere (out of range or dropped) */
  gint64       *choice_of;       /* row_capacity: the choice of each slot, -1
                                  * for padding rows and slots past the last */
} GmlpBackendRoutingMap;

/* What the permute entry computes, in FP32, stored in the output's dtype
 * (FLOAT32, FLOAT16 or BFLOAT16; each input in its own). "Tokens" tensors
 * are T × cols, dense; "permuted" ones are laid out by shape (the sizes the
 * map wrote, n_experts groups, cols, row_capacity) for their own element
 * size. c = choice_of[s], t = c / k; row (t, j) = row_of[t k + j].
 *   FORWARD           out[s] = tokens[t], 0 for a padding row
 *   COMBINE           out[t] = Σ_j probs[t, j] permuted[row (t, j)]
 *   BACKWARD          out[t] = Σ_j permuted[row (t, j)] (+ addend[t], if
 *                     given: FP32, T × cols, added to the FP32 sum before
 *                     its one rounding into out's dtype)
 *   COMBINE_BACKWARD  out[s] = probs[c] tokens[t], 0 for a padding row;
 *                     grad_probs[c] = tokens[t] · permuted[s] (if given)
 * Sums over j go in the order of the choices, skipping those that go
 * nowhere; a token with none gets zeros, and so does grad_probs of a
 * choice that goes nowhere (every T × k value is written). FORWARD and
 * COMBINE_BACKWARD write every row of every group, padding included, and
 * nothing past the groups; COMBINE and BACKWARD every token. */
typedef enum {
  GMLP_PERMUTE_FORWARD,
  GMLP_PERMUTE_COMBINE,
  GMLP_PERMUTE_BACKWARD,
  GMLP_PERMUTE_COMBINE_BACKWARD,
} GmlpPermuteKind;

typedef struct {
  GmlpPermuteKind   kind;
  GmlpBackendShape  shape;           /* the permuted layout */
  gint64            n_tokens;
  guint             top_k;
  const gint64     *row_of;          /* T × k, from routing_map */
  const gint64     *choice_of;       /* shape.row_capacity, from routing_map */
  const float      *probs;           /* T × k: COMBINE, COMBINE_BACKWARD */
  gconstpointer     tokens;          /* FORWARD: x; COMBINE_BACKWARD: grad_out */
  int               tokens_dtype;
  gconstpointer     permuted;        /* COMBINE: y; BACKWARD: grad; COMBINE_BACKWARD: y */
  int               permuted_dtype;
  gpointer          out;             /* permuted (FORWARD, COMBINE_BACKWARD) or tokens */
  int               out_dtype;
  float            *grad_probs;      /* COMBINE_BACKWARD, optional: T × k */
  const float      *addend;          /* BACKWARD, optional: T × cols */
} GmlpBackendPermute;
/* Chunks of rows whose counts are only on the device (gmlp-row-chunks.c,
 * whose header states the layouts): chunk (a, b) of an n_a × n_b grid
 * moves counts[a n_b + b] rows (negative: 0) from src to dst, each side
 * placing it by its layout. Rows kept: the count, at most max_chunk_rows
 * (-1: no limit) and a SLOTS side's slot_rows; a MEMBERS* chunk also at
 * most what is left of its group from its place, and every chunk at most
 * what fits in both storages from its place. Places: SLOTS by slot_stride;
 * PACKED by the kept rows of the chunks before it (before the fit to the
 * storage); MEMBERS_BY_B within group b by the kept rows of chunks
 * (a' < a, b). Groups of a MEMBERS* side are placed by member_rows as the
 * kernels place device-sized members (gmlp_num_member_stride()); with
 * dst_sizes the destination's groups take the kept rows instead (n_a n_b
 * of them, or Σ_a per b), written into dst_sizes. */
typedef enum {
  GMLP_BACKEND_CHUNKS_SLOTS,
  GMLP_BACKEND_CHUNKS_PACKED,
  GMLP_BACKEND_CHUNKS_MEMBERS,
  GMLP_BACKEND_CHUNKS_MEMBERS_BY_B,
} GmlpBackendChunkLayout;

typedef struct {
  GmlpBackendChunkLayout  layout;
  gpointer                base;         /* the storage's first byte */
  guint64                 capacity;     /* bytes of the storage */
  gint64                  slot_rows;    /* SLOTS */
  guint64                 slot_stride;  /* SLOTS: bytes from slot to slot */
  const gint64           *member_rows;  /* MEMBERS*: device sizes, n_members */
  guint                   n_members;    /* MEMBERS: n_a n_b; MEMBERS_BY_B: n_b */
} GmlpBackendChunkSide;

typedef struct {
  guint                 n_a;
  guint                 n_b;
  const gint64         *counts;          /* device, n_a × n_b */
  gint64                max_chunk_rows;  /* -1: no limit */
  guint64               row_bytes;       /* > 0 */
  GmlpBackendChunkSide  src;
  GmlpBackendChunkSide  dst;
  gint64               *dst_sizes;       /* MEMBERS* dst, or NULL: see above */
  /* MEMBERS* dst: the rows of each group past the chunks' rows become
   * zeros (for MEMBERS_BY_B, past Σ_a of the kept rows). */
  gboolean              zero_rest;
  gint64               *kept;            /* optional, n_a × n_b: rows moved */
  gint64               *dropped;         /* optional, one value: += rows not moved */
} GmlpBackendMoveRows;

/* The gate of an MoE layer (gmlp-router.c): its options, for the three
 * router entries. n_tokens (T) is fixed on the host by the input's shape;
 * every count and loss is made and read on the device, so that no entry
 * waits for it. The arithmetic, which every backend follows
 * (backend/cpu/gmlp-cpu-router.c is the reference; GmlpRouter's
 * documentation states it for users), is FP32 and deterministic. */
typedef struct {
  gint64   n_tokens;             /* T, the rows of the logits; may be 0 */
  guint    n_experts;            /* E, 1 to 65535 */
  guint    top_k;                /* k, 1 to MIN (16, E) */
  int      score_function;       /* GmlpScoreFunction: 0 softmax, 1 sigmoid */
  gboolean softmax_before_topk;  /* softmax: select on the probabilities, not the logits */
  gboolean renormalize;          /* divide the k probabilities by their sum (+ 1e-20) */
  float    scaling_factor;
  guint    n_groups;             /* 0: no group limit; else divides E */
  guint    topk_groups;          /* 1 to n_groups when n_groups > 0 */
  float    aux_loss_coeff;       /* 0: the aux loss is 0 and has no gradient */
  float    z_loss_coeff;         /* 0: the same for the z-loss */
} GmlpBackendRouter;

/* FP32 values as sums of BF16 parts (split_bfloat16, sum_parts), so that
 * FP32 products run on BF16 tensor cores: a BF16 × BF16 product is exact
 * in FP32, and the tensor cores sum in FP32 (the router's gate). Each
 * describes an FP32 matrix of rows × cols, dense but for its stride. */
#define GMLP_BACKEND_MAX_SPLIT_PARTS 3
#define GMLP_BACKEND_MAX_SPLIT_OUTPUTS 6

/* split_bfloat16: the parts of each value v = src[r × src_stride + c]
 * (gmlp_num_split_bfloat16() of kernels/gmlp-numeric.h, n_parts parts;
 * the same bits on every backend), output j taking part part[j] of every
 * value, at dst[offset[j] + r × dst_row_stride + c × dst_col_stride]
 * (elements of BF16). A part may go to several outputs (the K-concatenated
 * operands of a product whose terms pair the parts), and with
 * dst_row_stride 1 an output holds the matrix transposed. The outputs may
 * not overlap one another or src. */
typedef struct {
  gint64        rows;
  gint64        cols;
  const float  *src;
  gint64        src_stride;
  guint         n_parts;          /* 1 .. GMLP_BACKEND_MAX_SPLIT_PARTS */
  guint16      *dst;
  gint64        dst_row_stride;
  gint64        dst_col_stride;
  guint         n_outputs;        /* 1 .. GMLP_BACKEND_MAX_SPLIT_OUTPUTS */
  guint         part[GMLP_BACKEND_MAX_SPLIT_OUTPUTS];
  gint64        offset[GMLP_BACKEND_MAX_SPLIT_OUTPUTS];
} GmlpBackendSplit;

/* sum_parts: dst[r × dst_stride + c] = the sum of the n_parts values
 * src[offset[p] + r × src_stride + c], added in FP32 from the last part
 * to the first (a split's smallest first), then added to what dst holds
 * when accumulate is set (dst + sum, one more rounding), else stored. dst
 * may not overlap the parts. */
typedef struct {
  gint64        rows;
  gint64        cols;
  const float  *src;
  gint64        src_stride;
  guint         n_parts;          /* 1 .. GMLP_BACKEND_MAX_SPLIT_OUTPUTS */
  gint64        offset[GMLP_BACKEND_MAX_SPLIT_OUTPUTS];
  float        *dst;
  gint64        dst_stride;
  gboolean      accumulate;
} GmlpBackendSumParts;

/* Why a split or a sum of parts is malformed (a static string), or NULL:
 * what every backend checks before it enqueues anything. */
static inline const char *
gmlp_backend_split_invalid (const GmlpBackendSplit *split)
{
  guint j;

  if (split->rows < 0 || split->cols < 0)
    return "negative size";
  if (split->n_parts < 1 || split->n_parts > GMLP_BACKEND_MAX_SPLIT_PARTS)
    return "1 to 3 parts";
  if (split->n_outputs < 1 || split->n_outputs > GMLP_BACKEND_MAX_SPLIT_OUTPUTS)
    return "1 to 6 outputs";
  for (j = 0; j < split->n_outputs; j++)
    if (split->part[j] >= split->n_parts || split->offset[j] < 0)
      return "an output of no part, or before dst";
  if (split->rows > 0 && split->cols > 0 &&
      (split->src == NULL || split->dst == NULL || split->src_stride < split->cols ||
       split->dst_row_stride < 0 || split->dst_col_stride < 0))
    return "missing or overlapping rows";
  return NULL;
}

static inline const char *
gmlp_backend_sum_parts_invalid (const GmlpBackendSumParts *sum)
{
  guint p;

  if (sum->rows < 0 || sum->cols < 0)
    return "negative size";
  if (sum->n_parts < 1 || sum->n_parts > GMLP_BACKEND_MAX_SPLIT_OUTPUTS)
    return "1 to 6 parts";
  for (p = 0; p < sum->n_parts; p++)
    if (sum->offset[p] < 0)
      return "a part before src";
  if (sum->rows > 0 && sum->cols > 0 &&
      (sum->src == NULL || sum->dst == NULL || sum->src_stride < sum->cols ||
       sum->dst_stride < sum->cols))
    return "missing or overlapping rows";
  return NULL;
}

/* A device's tuning (libgmlp/gmlp-tuning-private.h): the choices that a
 * backend's heuristics make from a product, each left to them (0, what a
 * device opens with) or forced one way, for tests and benchmarks. The
 * CUDA backend's meaning of each field:
 *
 *   host_gemm       host sizes: 1 every product on cuBLAS and cuBLASLt,
 *                   2 every one it covers on libgmlp's Hopper kernel
 *   device_gemm     device sizes: 1 every product on the portable kernel
 *   loop_streams    cuBLAS's per-product loop: 1 on the compute stream alone
 *   row_tiles       1 no 128-row tiles in cuBLAS's grouped path
 *   batched         1 no batched call for products of one shape
 *   sm90_direct,    the Hopper kernel's scheduling choices, values of
 *   sm90_short_tiles, GmlpTuningChoice (kernels/gmlp-kernels.h,
 *   sm90_pairs,     GmlpKernelSm90Tuning, says what each forces)
 *   sm90_even_waves,
 *   sm90_stream_k
 *   sm90_fp8_tile_n 0, or 128 or 192 columns
 *   sm90_max_ctas   0, or an even number of CTAs, at least 2
 *   block_cache     GMLP_TUNING_NEVER: freed blocks go back to the pool at
 *                   once (and those kept so far with them), none kept for
 *                   reuse: what GMLP_DEBUG=no-block-cache sets, so that a
 *                   leak check at exit sees no kept block */
typedef enum {
  GMLP_TUNING_AUTO = 0,
  GMLP_TUNING_NEVER = 1,
  GMLP_TUNING_ALWAYS = 2,
} GmlpTuningChoice;

typedef struct {
  int               host_gemm;
  int               device_gemm;
  int               loop_streams;
  int               row_tiles;
  int               batched;
  GmlpTuningChoice  sm90_direct;
  GmlpTuningChoice  sm90_short_tiles;
  GmlpTuningChoice  sm90_pairs;
  GmlpTuningChoice  sm90_even_waves;
  GmlpTuningChoice  sm90_stream_k;
  int               sm90_fp8_tile_n;
  int               sm90_max_ctas;
  GmlpTuningChoice  block_cache;
} GmlpBackendTuning;

/* One call of quantize, dequantize or activation_quantize (the entries
 * say which fields each reads). shape: the group sizes (read where they
 * are) and row capacity of every operand, cols their columns; recipe:
 * GmlpScalingRecipe's values; flags: the GMLP_QUANT_FLAG_* of
 * kernels/gmlp-quantize-numeric.h. */
typedef struct {
  GmlpBackendShape  shape;
  int               recipe;
  int               flags;
  int               fp8_dtype;
  /* quantize: src (src_dtype) is quantized; activation_quantize: act (in)
   * is (in: src, src_dtype, f values a row, 2f for the gated activations). */
  gconstpointer     src;
  int               src_dtype;
  int               activation;
  /* The FP8 tensor: written by quantize and activation_quantize, read by
   * dequantize (data and scale_inv). */
  gpointer          data;
  gpointer          scale_inv;
  gpointer          columnwise;            /* or NULL */
  gpointer          columnwise_scale_inv;  /* or NULL */
  gint64           *derived_rows;          /* or NULL */
  float            *state;                 /* DELAYED: n_groups rows of history */
  guint             history_length;
  /* dequantize's output. */
  gpointer          dst;
  int               dst_dtype;
} GmlpBackendQuantize;

/* Communicators (gmlp-communicator.c): one rank of a group of world_size
 * ranks, each on a device of one backend. The unique id that names the
 * group is GMLP_BACKEND_COMM_ID_BYTES opaque bytes (NCCL's ncclUniqueId for
 * CUDA). */
typedef struct _GmlpBackendComm GmlpBackendComm;

#define GMLP_BACKEND_COMM_ID_BYTES 128

/* The reductions of comm_all_reduce; the values equal GmlpReduceOp's. */
enum {
  GMLP_COMM_SUM = 0,
  GMLP_COMM_AVERAGE = 1,
};

typedef struct {
  int          abi_version;
  const char  *name;

  int                 (*get_device_count)  (void);
  GmlpBackendDevice  *(*open_device)       (int                 ordinal,
                                            GError            **error);
  void                (*close_device)      (GmlpBackendDevice  *device);
  char               *(*get_device_name)   (GmlpBackendDevice  *device);

  /* Stream-ordered allocation from the device's pool; the result is aligned
   * to at least 256 bytes. nbytes == 0 gives a valid unique pointer. */
  gpointer            (*alloc)             (GmlpBackendDevice  *device,
                                            gsize               nbytes,
                                            GError            **error);
  /* Stream-ordered: the memory returns to the pool once the work enqueued
   * before this call has finished. */
  void                (*free)              (GmlpBackendDevice  *device,
                                            gpointer            ptr);

  /* Host to device; the host buffer may be reused as soon as this returns. */
  gboolean            (*upload)            (GmlpBackendDevice  *device,
                                            gpointer            dst,
                                            gconstpointer       src,
                                            gsize               nbytes,
                                            GError            **error);
  /* Device to host; waits for the stream, so the data is there on return. */
  gboolean            (*download)          (GmlpBackendDevice  *device,
                                            gpointer            dst,
                                            gconstpointer       src,
                                            gsize               nbytes,
                                            GError            **error);
  gboolean            (*copy)              (GmlpBackendDevice  *device,
                                            gpointer            dst,
                                            gconstpointer       src,
                                            gsize               nbytes,
                                            GError            **error);
  /* Sets nbytes bytes at dst to value (0..255), stream-ordered. */
  gboolean            (*fill_bytes)        (GmlpBackendDevice  *device,
                                            gpointer            dst,
                                            int                 value,
                                            gsize               nbytes,
                                            GError            **error);
  /* Waits for all work on the device: both streams. */
  gboolean            (*synchronize)       (GmlpBackendDevice  *device,
                                            GError            **error);

  /* Element-wise conversion of every member, one launch. dtype codes are
   * GmlpDType values; the caller has checked gmlp_dtype_can_convert(). */
  gboolean            (*convert)           (GmlpBackendDevice      *device,
                                            const GmlpBackendShape *shape,
                                            gconstpointer           src,
                                            int                     src_dtype,
                                            gpointer                dst,
                                            int                     dst_dtype,
                                            GError                **error);
  /* Fills n_elements of a floating dtype with gmlp_num_random_uniform(seed,
   * i, scale) for i = 0 .. n_elements-1. */
  gboolean            (*fill_random)       (GmlpBackendDevice  *device,
                                            gpointer            dst,
                                            int                 dtype,
                                            guint64             n_elements,
                                            guint64             seed,
                                            float               scale,
                                            GError            **error);

  /* The grouped product of GmlpBackendGemm; one call enqueues every
   * group. */
  gboolean            (*gemm)              (GmlpBackendDevice      *device,
                                            const GmlpBackendGemm  *gemm,
                                            GError                **error);
  /* Whether gemm multiplies the FP8 operands of a descriptor as they are;
   * if not, why in *reason (a static string), and the caller multiplies
   * them dequantized instead (docs/routes.md's `dequantized`). Looks at
   * nothing but the descriptor and the device: nothing is enqueued or
   * waited for. TRUE for every other descriptor: gemm itself refuses what
   * is wrong with it, or what it cannot do and has no fall-back for (FP8
   * with per-tensor scales without FP8 tensor cores). */
  gboolean            (*gemm_supported)    (GmlpBackendDevice      *device,
                                            const GmlpBackendGemm  *gemm,
                                            const char            **reason);
  /* dbias_i[j] = Σ_r A_i[r, j] over the rows[i] rows of group i, summed in
   * FP32 and stored as dtype (A's dtype); zero for an empty group. */
  gboolean            (*bias_grad)         (GmlpBackendDevice  *device,
                                            guint               n_groups,
                                            const gint64       *rows,
                                            gint64              n,
                                            int                 dtype,
                                            const void * const *a,
                                            void * const       *dbias,
                                            GError            **error);

  /* Events: record one on the device's stream after the work enqueued so far. */
  GmlpBackendEvent   *(*event_record)      (GmlpBackendDevice  *device,
                                            GError            **error);
  /* Blocks the host until the event has completed. */
  gboolean            (*event_synchronize) (GmlpBackendEvent   *event,
                                            GError            **error);
  /* TRUE once the event has completed; never blocks. */
  gboolean            (*event_query)       (GmlpBackendEvent   *event);
  /* Makes the device's stream wait for the event (which may come from
   * another device of the same backend) without blocking the host. */
  gboolean            (*event_wait)        (GmlpBackendDevice  *device,
                                            GmlpBackendEvent   *event,
                                            GError            **error);
  /* Milliseconds of device time between two completed events of one device
   * (waits for end first). */
  gboolean            (*event_elapsed)     (GmlpBackendEvent   *start,
                                            GmlpBackendEvent   *end,
                                            double             *ms,
                                            GError            **error);
  /* The backend's own handle (a cudaEvent_t for CUDA), or NULL. */
  gpointer            (*event_get_native)  (GmlpBackendEvent   *event);
  void                (*event_free)        (GmlpBackendEvent   *event);

  /* Offload support. Each device has a second stream, the copy stream, so
   * that copies of saved activations overlap compute.
   *
   * Host memory the copies can use at full speed (pinned for CUDA). Slow to
   * get: callers keep a pool. */
  gpointer            (*host_alloc)        (GmlpBackendDevice  *device,
                                            gsize               nbytes,
                                            GError            **error);
  void                (*host_free)         (GmlpBackendDevice  *device,
                                            gpointer            ptr);
  /* Enqueues a copy of nbytes on the copy stream, device to host when
   * to_host, else host to device. With after_compute, the copy first waits
   * for all the work enqueued on the compute stream so far (the producer of
   * the data). Returns an event that completes with the copy; the host
   * memory must stay untouched until then. */
  GmlpBackendEvent   *(*copy_async)        (GmlpBackendDevice  *device,
                                            gpointer            dst,
                                            gconstpointer       src,
                                            gsize               nbytes,
                                            gboolean            to_host,
                                            gboolean            after_compute,
                                            GError            **error);
  /* Device memory from the pool, in stream order on the copy stream (the
   * destination of a reload). The compute stream may use it after waiting
   * for an event recorded on the copy stream after the allocation. */
  gpointer            (*copy_stream_alloc) (GmlpBackendDevice  *device,
                                            gsize               nbytes,
                                            GError            **error);
  /* Returns device memory to the pool after everything enqueued so far on
   * both streams (a buffer a copy may still be reading). */
  void                (*free_after_copies) (GmlpBackendDevice  *device,
                                            gpointer            ptr);

  /* Element-wise activation of every row of every group, in FP32, stored in
   * dtype (FLOAT32, FLOAT16 or BFLOAT16). Rows are dense: in has f values per
   * row (2f for gated activations), out and d_out f.
   *   forward  (d_out == NULL): out_i = act(in_i)
   *   backward (d_out given):   out_i = d in_i, the gradient with respect to
   *                             in (2f wide for gated activations)
   * Groups with no rows have nothing to write. */
  gboolean            (*activation)        (GmlpBackendDevice  *device,
                                            int                 activation,
                                            guint               n_groups,
                                            const gint64       *rows,
                                            gint64              f,
                                            int                 dtype,
                                            const void * const *in,
                                            const void * const *d_out,
                                            void * const       *out,
                                            GError            **error);
  /* activation for group sizes that are only on the device (GroupedMLP
   * with device sizes): the same arithmetic and bits. shape gives the
   * sizes, the number of groups and the row capacity every operand was laid
   * out for (cols: f); in, d_out and out are the base pointers of grouped
   * tensors over those sizes, each member laid out for its own row width
   * (gmlp_num_member_stride()). A group keeps the rows that fit in every
   * operand, as in gemm with device sizes (docs/memory-layout.md). The
   * sizes are read by the device only; nothing waits or is allocated per
   * call, so it can be captured in a graph. (Host sizes keep the entry
   * above: this one needs them uploaded and walked on the device first.) */
  gboolean            (*activation_device) (GmlpBackendDevice      *device,
                                            const GmlpBackendShape *shape,
                                            int                     activation,
                                            int                     dtype,
                                            gconstpointer           in,
                                            gconstpointer           d_out,
                                            gpointer                out,
                                            GError                **error);

  /* Element-wise over every member of two tensors of one shape (each laid
   * out for its own dtype, padding untouched): y = alpha x + beta y in FP32,
   * stored in y's dtype; with x NULL, y = beta y. Floating dtypes only. */
  gboolean            (*axpby)             (GmlpBackendDevice      *device,
                                            const GmlpBackendShape *shape,
                                            gconstpointer           x,
                                            int                     x_dtype,
                                            gpointer                y,
                                            int                     y_dtype,
                                            float                   alpha,
                                            float                   beta,
                                            GError                **error);
  /* The sum of squares of every element of every member (padding left
   * out), accumulated in FP32 per element block and in FP64 overall,
   * written to *result on the host: waits for the device. */
  gboolean            (*sum_squares)       (GmlpBackendDevice      *device,
                                            const GmlpBackendShape *shape,
                                            gconstpointer           x,
                                            int                     dtype,
                                            double                 *result,
                                            GError                **error);

  /* bias_grad for a tensor whose sizes are on the device: dbias_i[j] =
   * Σ_r A_i[r, j] in FP32, stored as dtype; zero for an empty group. */
  gboolean            (*bias_grad_device)  (GmlpBackendDevice            *device,
                                            const GmlpBackendShape       *shape,
                                            int                           dtype,
                                            gconstpointer                 a,
                                            void * const                 *dbias,
                                            GError                      **error);

  /* Graphs. Between capture_begin and capture_end, the work enqueued on the
   * device's compute stream is recorded, not run; capture_end turns it into
   * a graph that graph_launch replays on the compute stream. Memory
   * allocated while capturing stays valid for as long as either its owner
   * or the graph holds it. Backends without graphs fail with UNSUPPORTED. */
  gboolean            (*capture_begin)     (GmlpBackendDevice  *device,
                                            GError            **error);
  GmlpBackendGraph   *(*capture_end)       (GmlpBackendDevice  *device,
                                            GError            **error);
  /* TRUE while the device's compute stream is being captured. */
  gboolean            (*is_capturing)      (GmlpBackendDevice  *device);
  gboolean            (*graph_launch)      (GmlpBackendGraph   *graph,
                                            GError            **error);
  void                (*graph_free)        (GmlpBackendGraph   *graph);

  /* FP8 quantization (gmlp-quantizer): entries below this line. */

  /* Quantizes every member of src (shape; src_dtype FLOAT32, FLOAT16 or
   * BFLOAT16) to fp8_dtype by a recipe (GmlpScalingRecipe's values) and the
   * GMLP_QUANT_FLAG_* flags of kernels/gmlp-quantize-numeric.h, whose
   * arithmetic every backend uses, in a constant number of device
   * operations whatever the number of groups; the sizes are read where
   * they are, on the device. The outputs, laid out over the clamped group
   * sizes of shape (kernels/gmlp-kernels.h, GmlpKernelQuantize, has the
   * details): data (the layout of src, one byte per element); scale_inv
   * (the rowwise scales); columnwise (or NULL: member i transposed, cols ×
   * m_i, in the layout of data) and columnwise_scale_inv (its scales, where
   * gmlp_quant_columnwise_has_scales(), else NULL); derived_rows (or NULL:
   * gmlp_quant_blocks_along (m_i, gmlp_quant_derived_row_block()) per
   * group). DELAYED reads each group's scale from state (n_groups rows of
   * gmlp_quant_state_stride (history_length) floats) and max-es the group's
   * amax into it. Backends that cannot do a case fail with UNSUPPORTED and
   * the reason, before anything is written. */
  gboolean            (*quantize)          (GmlpBackendDevice          *device,
                                            const GmlpBackendQuantize  *quantize,
                                            GError                    **error);
  /* dst = data × scale_inv, element by element, by the rowwise blocks of
   * recipe and flags; dst (dst_dtype: FLOAT32, FLOAT16 or BFLOAT16) laid
   * out like data with its own element size. */
  gboolean            (*dequantize)        (GmlpBackendDevice          *device,
                                            const GmlpBackendQuantize  *quantize,
                                            GError                    **error);
  /* gmlp_quant_delayed_update() of each of the n_groups rows of state,
   * stream-ordered, without waiting. */
  gboolean            (*quantizer_update)  (GmlpBackendDevice       *device,
                                            float                   *state,
                                            guint                    n_groups,
                                            guint                    history_length,
                                            int                      fp8_dtype,
                                            int                      margin,
                                            GError                 **error);

  /* GroupedMLP, FP8: the activation of in, quantized, in one pass over in
   * (two for CURRENT, whose scale needs the amax of the whole group first:
   * the first pass only finds the amaxes). The FP8 result, every output
   * byte and every scale, is what the activation entry followed by the
   * quantize entry of its output would give, bit for bit: act(in) in FP32,
   * rounded to dtype, then quantized. shape: the group sizes (read where
   * they are) and row capacity of in and of the outputs, cols = f, the
   * columns of the activation's output; in (src, of src_dtype FLOAT32,
   * FLOAT16 or BFLOAT16) has f values per row, 2f for the gated
   * activations; activation a GMLP_ACT_* value. recipe,
   * flags, fp8_dtype, the outputs, derived_rows, state and history_length
   * are those of quantize (DELAYED: the scale from state, the amax of the
   * activation's output max-ed into it). Refused with UNSUPPORTED (and the
   * reason) before anything is written where a backend cannot do it. */
  gboolean            (*activation_quantize) (GmlpBackendDevice          *device,
                                              const GmlpBackendQuantize  *quantize,
                                              GError                    **error);

  /* Token permutation (GmlpBackendRoutingMap, GmlpBackendPermute above):
   * entries below this line. None reads anything on the host, synchronizes
   * or depends on a size the host does not know. Backends without them
   * leave them NULL, and GmlpRouting refuses their devices with
   * UNSUPPORTED. */

  /* counts[e] = how many of the n_choices indices equal e (those outside
   * [0, n_experts) count nowhere); every one of the n_experts counts is
   * written. */
  gboolean            (*routing_count)     (GmlpBackendDevice           *device,
                                            const gint64                *indices,
                                            gint64                       n_choices,
                                            guint                        n_experts,
                                            gint64                      *counts,
                                            GError                     **error);
  /* The expert-contiguous, stable map of a routing: within an expert,
   * choices in the order of c (token by token, a token's choices in
   * order); see GmlpBackendRoutingMap. */
  gboolean            (*routing_map)       (GmlpBackendDevice           *device,
                                            const GmlpBackendRoutingMap *map,
                                            GError                     **error);
  /* Rows to and from the permuted layout (GmlpBackendPermute): one pass
   * over the output, no atomics (every output row or value has one
   * writer), so results do not depend on scheduling. */
  gboolean            (*permute)           (GmlpBackendDevice           *device,
                                            const GmlpBackendPermute    *permute,
                                            GError                     **error);
  /* Router (gmlp-router): entries below this line. All tensors dense in
   * device memory; none of them waits for the device.
   *
   * router_forward: from logits (T × E), and expert_bias (E values, or
   * NULL), each token's k experts (indices, T × k, best first), their
   * probabilities (probs, T × k), how many of the T × k choices went to
   * each expert (tokens_per_expert, E values), and the two losses
   * (aux_loss, z_loss: one value each, 0 when their coefficient is 0 or T
   * is 0). With T = 0 it writes the counts and the losses only. */
  gboolean            (*router_forward)      (GmlpBackendDevice        *device,
                                              const GmlpBackendRouter  *router,
                                              const float              *logits,
                                              const float              *expert_bias,
                                              gint64                   *indices,
                                              float                    *probs,
                                              gint64                   *tokens_per_expert,
                                              float                    *aux_loss,
                                              float                    *z_loss,
                                              GError                  **error);
  /* router_backward: grad_logits (T × E, overwritten) = d(Σ grad_probs ·
   * probs + aux_loss + z_loss) / d(logits), the choices held fixed: from
   * the forward's logits, indices and tokens_per_expert (read only when the
   * aux loss has a coefficient, else may be NULL) and grad_probs (T × k).
   * Indices outside 0 .. E-1 contribute nothing. */
  gboolean            (*router_backward)     (GmlpBackendDevice        *device,
                                              const GmlpBackendRouter  *router,
                                              const float              *logits,
                                              const gint64             *indices,
                                              const gint64             *tokens_per_expert,
                                              const float              *grad_probs,
                                              float                    *grad_logits,
                                              GError                  **error);
  /* router_update_bias: expert_bias[i] += rate × sign (mean − load_i) for
   * the n_experts loads in tokens_per_expert (mean: their average; sign 0
   * for 0), read on the device. */
  gboolean            (*router_update_bias)  (GmlpBackendDevice        *device,
                                              guint                     n_experts,
                                              const gint64             *tokens_per_expert,
                                              float                     rate,
                                              float                    *expert_bias,
                                              GError                  **error);

  /* set_tuning: the device's tuning from now on (tests and benchmarks,
   * through gmlp_device_set_tuning()); the calls already enqueued keep
   * theirs. NULL for a backend whose heuristics have nothing to force. */
  void                (*set_tuning)          (GmlpBackendDevice        *device,
                                              const GmlpBackendTuning  *tuning);

  /* Communicators (gmlp-communicator.c): entries below this line. Every
   * collective runs on the communicator's own stream (its communication
   * stream) in the order of the calls, ordered by events: it starts after
   * the work enqueued on the device's compute stream before the call, and
   * the compute stream's later work waits for it (the all-to-all may hand
   * that wait to the caller: its done). A backend that runs collectives on
   * the calling thread (the CPU) honours the same order by finishing them
   * before it returns. Every rank must make the same
   * calls in the same order. Byte counts and offsets are the caller's,
   * worked out on the host from the tensors' host sizes. A rank that does
   * not take part within timeout_ms (a rank that errs, leaves or dies), or
   * comm_abort on any rank, fails the group: then every call on every rank
   * fails with GMLP_ERROR_ABORTED, never hangs. Backends without
   * communicators leave these NULL (UNSUPPORTED). */
  /* Writes a fresh id (GMLP_BACKEND_COMM_ID_BYTES bytes) into id. */
  gboolean            (*comm_unique_id)      (GmlpBackendDevice        *device,
                                              guint8                   *id,
                                              GError                  **error);
  /* Starts joining the group named by id as rank (0 .. world_size-1),
   * without waiting for the others: g_object_new() must not block (a
   * binding may hold a lock, such as Python's GIL, across it). */
  GmlpBackendComm    *(*comm_init)           (GmlpBackendDevice        *device,
                                              const guint8             *id,
                                              int                       rank,
                                              int                       world_size,
                                              guint                     timeout_ms,
                                              GError                  **error);
  /* Waits until every rank has joined, at most timeout_ms; called once,
   * before the first collective. */
  gboolean            (*comm_join)           (GmlpBackendComm          *comm,
                                              GError                  **error);
  /* Fails the group at once: calls waiting on any rank return
   * GMLP_ERROR_ABORTED. Safe from any thread, also during a call. */
  void                (*comm_abort)          (GmlpBackendComm          *comm);
  /* Leaves the group (the other ranks' later calls fail) and frees comm. */
  void                (*comm_free)           (GmlpBackendComm          *comm);
  /* In place: data (count elements of dtype: FLOAT32, FLOAT16, BFLOAT16,
   * or INT32, INT64 with SUM) becomes the sum, or the average, over the
   * ranks; every rank gets the same bits. */
  gboolean            (*comm_all_reduce)     (GmlpBackendComm          *comm,
                                              gpointer                  data,
                                              gsize                     count,
                                              int                       dtype,
                                              int                       op,
                                              GError                  **error);
  /* recv (world_size × nbytes) holds every rank's send (nbytes), by rank. */
  gboolean            (*comm_all_gather)     (GmlpBackendComm          *comm,
                                              gconstpointer             send,
                                              gpointer                  recv,
                                              gsize                     nbytes,
                                              GError                  **error);
  /* To every peer p: send_bytes[p] bytes from send + send_offsets[p];
   * from every peer p: recv_bytes[p] bytes into recv + recv_offsets[p]
   * (world_size entries each, host memory). The ranks' counts must pair
   * up: send_bytes[q] of rank p equals recv_bytes[p] of rank q.
   * done NULL: the compute stream waits for the all-to-all. done given: it
   * does not; *done is an event that completes with the all-to-all, which
   * the caller makes the compute stream wait for (event_wait) before it
   * touches send or recv again, or NULL where the all-to-all has completed
   * already (a backend of the calling thread). */
  gboolean            (*comm_all_to_all)     (GmlpBackendComm          *comm,
                                              gconstpointer             send,
                                              const gsize              *send_offsets,
                                              const gsize              *send_bytes,
                                              gpointer                  recv,
                                              const gsize              *recv_offsets,
                                              const gsize              *recv_bytes,
                                              GmlpBackendEvent        **done,
                                              GError                  **error);

  /* move_rows: chunks of rows between layouts (GmlpBackendMoveRows),
   * counts read on the device only; NULL where the backend has none. */
  gboolean            (*move_rows)           (GmlpBackendDevice        *device,
                                              const GmlpBackendMoveRows *move,
                                              GError                  **error);

  /* FP32 values as BF16 parts and back (GmlpBackendSplit,
   * GmlpBackendSumParts): stream-ordered, one launch each, nothing read
   * on the host, so both can be captured in a graph. A call with no
   * values enqueues nothing. */
  gboolean            (*split_bfloat16)      (GmlpBackendDevice        *device,
                                              const GmlpBackendSplit   *split,
                                              GError                  **error);
  gboolean            (*sum_parts)           (GmlpBackendDevice        *device,
                                              const GmlpBackendSumParts *sum,
                                              GError                  **error);
} GmlpBackend;

const GmlpBackend *gmlp_backend_cpu_get  (void);
/* The CUDA backend, loaded on first use; NULL (with a debug message) when the
 * module or the CUDA libraries it needs cannot be loaded. */
const GmlpBackend *gmlp_backend_cuda_load (void);

/* The entry point a backend module exports. */
typedef const GmlpBackend *(*GmlpBackendGetFunc) (void);

G_END_DECLS
