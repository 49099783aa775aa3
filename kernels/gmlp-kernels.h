/* gmlp-kernels.h: the C ABI of libgmlp's CUDA kernels
 *
 * Plain C: no GLib, no C++ types. The kernels own no memory; callers pass
 * device pointers and a stream. Every entry point checks its arguments and the
 * launch and returns a status code; none exits or throws.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#ifndef GMLP_KERNELS_H
#define GMLP_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  GMLP_KERNEL_SUCCESS = 0,
  GMLP_KERNEL_INVALID_VALUE,   /* a NULL pointer, a bad dtype, a bad size */
  GMLP_KERNEL_UNSUPPORTED,     /* valid, but not implemented for these types */
  GMLP_KERNEL_LAUNCH_FAILED,   /* the CUDA launch failed: see the cuda error */
} GmlpKernelStatus;

/* dtype codes are the GMLP_NUM_* values of gmlp-numeric.h (= GmlpDType). */

/* A grouped shape whose group sizes are on the device. */
typedef struct {
  const int64_t *device_rows;  /* n_groups values, device memory */
  uint32_t       n_groups;
  int64_t        cols;
  int64_t        row_capacity; /* rows the allocation can hold in total */
} GmlpKernelGroupedShape;

const char      *gmlp_kernel_status_to_string (GmlpKernelStatus status);

/* The cudaError_t of the last failed launch on this thread. */
cudaError_t      gmlp_kernel_get_last_cuda_error (void);

/* Converts every member of a grouped tensor from src_dtype to dst_dtype in
 * one launch; both tensors use the member layout of gmlp_num_member_stride()
 * with their own element size. Floating types convert through float with
 * round-to-nearest-even and FP8 saturation; INT32 <-> INT64 converts exactly. */
GmlpKernelStatus gmlp_kernel_convert_grouped  (const GmlpKernelGroupedShape *shape,
                                               const void                   *src,
                                               int                           src_dtype,
                                               void                         *dst,
                                               int                           dst_dtype,
                                               cudaStream_t                  stream);

/* dst[i] = gmlp_num_random_uniform(seed, i, scale) for i < n_elements. */
GmlpKernelStatus gmlp_kernel_fill_random      (void                         *dst,
                                               int                           dtype,
                                               uint64_t                      n_elements,
                                               uint64_t                      seed,
                                               float                         scale,
                                               cudaStream_t                  stream);

/* Grouped bias operations: one launch covers every group of a grouped
 * linear layer, with the group sizes known on the host.
 *
 *   GMLP_KERNEL_BIAS_ADD   matrix_i[r, :] += vector_i[:]   for r < rows_i
 *   GMLP_KERNEL_BIAS_GRAD  vector_i[j] = Σ_r matrix_i[r, j], summed in FP32
 *                          in a fixed order (the result does not change from
 *                          run to run); zero for a group with no rows
 *
 * matrix_i is dense row-major (leading dimension cols); both operands have
 * the same dtype, FLOAT32, FLOAT16 or BFLOAT16, and the arithmetic is in
 * float, rounded to nearest even on the way back.
 *
 * The caller fills one GmlpKernelBiasGroup per group on the host, lets
 * gmlp_kernel_grouped_bias_plan() split the groups into tiles (it sets
 * first_tile, so that the grid is spread evenly however the rows are split),
 * copies the table to device memory, and launches with
 * gmlp_kernel_grouped_bias(): one kernel for all groups, and for GRAD, when
 * a group spans several tiles, a second, small one that adds up the tiles'
 * partial sums (in plan->scratch_bytes of FP32 scratch). */
typedef enum {
  GMLP_KERNEL_BIAS_ADD,
  GMLP_KERNEL_BIAS_GRAD,
} GmlpKernelBiasOp;

typedef struct {
  void     *matrix;      /* rows × cols: C_i for ADD, A_i for GRAD */
  void     *vector;      /* cols elements: bias_i for ADD, dbias_i for GRAD */
  int64_t   rows;
  uint64_t  first_tile;  /* set by the plan: the group's first tile */
} GmlpKernelBiasGroup;

/* What the plan has worked out; the caller only reads n_tiles and
 * scratch_bytes. */
typedef struct {
  GmlpKernelBiasOp  op;
  int               dtype;
  uint32_t          n_groups;
  int64_t           cols;
  uint64_t          n_tiles;        /* 0: nothing to launch */
  uint64_t          scratch_bytes;  /* device scratch the launch needs, or 0 */
  int               vectorised;
} GmlpKernelBiasPlan;

/* Checks the groups (host memory, n_groups entries) and sets their
 * first_tile. Every group with work must have its pointers set; they and
 * cols decide whether the vectorised kernels can be used. */
GmlpKernelStatus gmlp_kernel_grouped_bias_plan (GmlpKernelBiasOp     op,
                                                int                  dtype,
                                                int64_t              cols,
                                                GmlpKernelBiasGroup *groups,
                                                uint32_t             n_groups,
                                                GmlpKernelBiasPlan  *plan);

/* Enqueues the planned operation: device_groups is a device copy of the
 * planned table, scratch holds plan->scratch_bytes (or is NULL when that is
 * 0). Both are used only by the work enqueued here, so they may be released
 * in stream order right after this returns. */
GmlpKernelStatus gmlp_kernel_grouped_bias      (const GmlpKernelBiasPlan  *plan,
                                                const GmlpKernelBiasGroup *device_groups,
                                                void                      *scratch,
                                                cudaStream_t               stream);

/* Grouped activations of an MLP: one launch covers every group, with the
 * group sizes known on the host. The codes equal GmlpActivation's (and the
 * backend's GMLP_ACT_*). The gated ones read rows of 2f values [a | b]:
 *
 *   GELU    gelu(x) = x/2 (1 + tanh (sqrt(2/pi) (x + 0.044715 x^3)))
 *   RELU    relu(x) = max(x, 0)
 *   SRELU   srelu(x) = relu(x)^2
 *   SWIGLU  silu(a) * b, silu(x) = x / (1 + exp(-x))
 *   GEGLU   gelu(a) * b
 *
 * Forward:  out_i[r, :] = act(in_i[r, :]), f values per row.
 * Backward: out_i[r, :] = d_out_i[r, :] * act'(in_i[r, :]); for the gated
 *           ones the row of out is 2f wide: [d_out * b * act'(a) |
 *           d_out * act(a)].
 *
 * Rows are dense (leading dimension f, or 2f for a gated in and backward
 * out); all operands have the same dtype, FLOAT32, FLOAT16 or BFLOAT16, the
 * arithmetic is in float and the results are rounded to nearest even. out
 * may be the very pointer of an operand of the same row width (in place);
 * any other overlap is undefined.
 *
 * As for the bias operations, the caller fills one GmlpKernelActivationGroup
 * per group on the host, lets gmlp_kernel_grouped_activation_plan() number
 * the groups' tiles of rows (first_tile), copies the table to device memory
 * and launches with gmlp_kernel_grouped_activation(). */
typedef enum {
  GMLP_KERNEL_ACT_GELU = 0,
  GMLP_KERNEL_ACT_RELU = 1,
  GMLP_KERNEL_ACT_SRELU = 2,
  GMLP_KERNEL_ACT_SWIGLU = 3,
  GMLP_KERNEL_ACT_GEGLU = 4,
} GmlpKernelActivation;

typedef struct {
  const void *in;          /* rows × f, or rows × 2f when gated */
  const void *d_out;       /* rows × f; backward only (NULL for forward) */
  void       *out;         /* forward rows × f; backward as wide as in */
  int64_t     rows;
  uint64_t    first_tile;  /* set by the plan: the group's first tile */
} GmlpKernelActivationGroup;

/* What the plan has worked out; the caller only reads n_tiles. */
typedef struct {
  int       activation;
  int       dtype;
  int       backward;
  uint32_t  n_groups;
  int64_t   f;
  uint64_t  n_tiles;     /* 0: nothing to launch */
  int       vectorised;
} GmlpKernelActivationPlan;

/* Checks the groups (host memory, n_groups entries) and sets their
 * first_tile. backward is 0 for the forward pass, 1 for the gradient. Every
 * group with rows must have its pointers set (d_out only when backward);
 * they and f decide whether the vectorised kernels can be used. */
GmlpKernelStatus gmlp_kernel_grouped_activation_plan (int                        activation,
                                                      int                        dtype,
                                                      int                        backward,
                                                      int64_t                    f,
                                                      GmlpKernelActivationGroup *groups,
                                                      uint32_t                   n_groups,
                                                      GmlpKernelActivationPlan  *plan);

/* Enqueues the planned operation; device_groups is a device copy of the
 * planned table, used only by the work enqueued here, so it may be released
 * in stream order right after this returns. */
GmlpKernelStatus gmlp_kernel_grouped_activation      (const GmlpKernelActivationPlan  *plan,
                                                      const GmlpKernelActivationGroup *device_groups,
                                                      cudaStream_t                     stream);

/* The same activations for group sizes that only the device knows
 * (activation_device.cu), with the arithmetic and bits of the kernels
 * above: shape gives the sizes (device memory), the number of groups and
 * the row capacity every operand was allocated for, cols = f. in, d_out
 * (backward only, else NULL) and out are the base pointers of grouped
 * tensors over those sizes, each member laid out with
 * gmlp_num_member_stride() for the operand's own row width (in: f or 2f
 * values, d_out: f, out: f forward, in's width backward). A group keeps
 * the rows that fit in every operand's allocation from its offset (as the
 * device-sizes products do: a negative size counts as 0). A small kernel
 * walks the sizes into workspace (device memory,
 * gmlp_kernel_grouped_activation_device_workspace_bytes(), 8-byte
 * aligned), then the activation kernel reads it: nothing is allocated and
 * the host never reads the sizes, so the call can be captured in a graph.
 * out may be in itself for a backward (the same row width); any other
 * overlap is undefined. */
size_t           gmlp_kernel_grouped_activation_device_workspace_bytes (uint32_t n_groups);
GmlpKernelStatus gmlp_kernel_grouped_activation_device (const GmlpKernelGroupedShape *shape,
                                                        int                           activation,
                                                        int                           dtype,
                                                        int                           backward,
                                                        const void                   *in,
                                                        const void                   *d_out,
                                                        void                         *out,
                                                        void                         *workspace,
                                                        cudaStream_t                  stream);

/* Copies nbytes (a multiple of 8) of host memory to dst (8-byte aligned
 * device memory), stream-ordered, through kernel parameters: the host never
 * waits, src may be reused at once, and the copy can be graph-captured. */
GmlpKernelStatus gmlp_kernel_write_table      (void                         *dst,
                                               const void                   *src,
                                               size_t                        nbytes,
                                               cudaStream_t                  stream);

/* y = alpha x + beta y over every member (x NULL: y = beta y), in FP32, each
 * tensor laid out for its own dtype; FLOAT32, FLOAT16 and BFLOAT16 only. */
GmlpKernelStatus gmlp_kernel_grouped_axpby    (const GmlpKernelGroupedShape *shape,
                                               const void                   *x,
                                               int                           x_dtype,
                                               void                         *y,
                                               int                           y_dtype,
                                               float                         alpha,
                                               float                         beta,
                                               cudaStream_t                  stream);

/* How many doubles gmlp_kernel_grouped_sum_squares() writes. */
size_t           gmlp_kernel_grouped_sum_squares_partials (const GmlpKernelGroupedShape *shape);

/* Partial sums of squares of every member's elements, one per block, into
 * partials (device memory): the caller adds them in order. */
GmlpKernelStatus gmlp_kernel_grouped_sum_squares (const GmlpKernelGroupedShape *shape,
                                               const void                   *x,
                                               int                           dtype,
                                               double                       *partials,
                                               cudaStream_t                  stream);

/* The gate of an MoE layer (router.cu): the arithmetic of the CPU
 * reference, backend/cpu/gmlp-cpu-router.c, whose header states it (the
 * fields are GmlpBackendRouter's), in FP32 per token; the sums over a
 * token's experts are added in a tree, so results agree with the CPU's
 * within a few ulps (indices and counts exactly, where no two candidates'
 * values are that close), and every run gives the same bits. All tensors
 * are dense device memory; nothing waits for the device, nothing is
 * allocated, and every call can be captured in a graph.
 *
 * forward: from logits (T × E) and expert_bias (E, or NULL), indices and
 * probs (T × k, best first), tokens_per_expert (E) and the two losses (one
 * FP32 each, 0 when their coefficient is 0 or T is 0); T = 0 writes the
 * counts and losses only. workspace: device memory of
 * gmlp_kernel_router_forward_workspace_bytes(), 8-byte aligned, used only
 * by the work enqueued here. backward: grad_logits (T × E, overwritten) =
 * d(Σ grad_probs · probs + aux + z) / d(logits), the choices held fixed;
 * tokens_per_expert is read only with an aux loss; indices out of range
 * contribute nothing. update_bias: expert_bias[i] += rate × sign (mean -
 * tokens_per_expert[i]). */
typedef struct {
  int64_t   n_tokens;             /* T, 0 .. 2^40 */
  uint32_t  n_experts;            /* E, 1 .. 65535 */
  uint32_t  top_k;                /* 1 .. MIN (16, E) */
  int       score_function;       /* 0 softmax, 1 sigmoid */
  int       softmax_before_topk;
  int       renormalize;
  float     scaling_factor;
  uint32_t  n_groups;             /* 0, or a divisor of E */
  uint32_t  topk_groups;          /* 1 .. n_groups, k <= topk_groups × E / n_groups */
  float     aux_loss_coeff;
  float     z_loss_coeff;
} GmlpKernelRouter;

size_t           gmlp_kernel_router_forward_workspace_bytes (const GmlpKernelRouter *router);
GmlpKernelStatus gmlp_kernel_router_forward     (const GmlpKernelRouter       *router,
                                                 const float                  *logits,
                                                 const float                  *expert_bias,
                                                 int64_t                      *indices,
                                                 float                        *probs,
                                                 int64_t                      *tokens_per_expert,
                                                 float                        *aux_loss,
                                                 float                        *z_loss,
                                                 void                         *workspace,
                                                 cudaStream_t                  stream);
GmlpKernelStatus gmlp_kernel_router_backward    (const GmlpKernelRouter       *router,
                                                 const float                  *logits,
                                                 const int64_t                *indices,
                                                 const int64_t                *tokens_per_expert,
                                                 const float                  *grad_probs,
                                                 float                        *grad_logits,
                                                 cudaStream_t                  stream);
GmlpKernelStatus gmlp_kernel_router_update_bias (uint32_t                      n_experts,
                                                 const int64_t                *tokens_per_expert,
                                                 float                         rate,
                                                 float                        *expert_bias,
                                                 cudaStream_t                  stream);

/* Grouped products with the group sizes on the device (the layouts of
 * GmlpBackendGemm in libgmlp/backend/gmlp-backend.h):
 *
 *   FPROP  c_rows_i (m_i × n) = a_i (m_i × k) · weight_iᵀ     [+ bias_i]
 *   DGRAD  c_rows_i (m_i × k) = a_i (m_i × n) · weight_i
 *   WGRAD  wgrad_i  (n × k)  [+]= a_iᵀ (m_i × n) · b_rows_i (m_i × k)
 *
 * m_i = device_rows[i] is read on the device only: a negative size is 0,
 * and a group gets only the rows that fit, from its offset, in every
 * row-grouped operand (member i at Σ_{j<i} gmlp_num_member_stride (m_j,
 * cols × size), each operand holding row_capacity rows plus its padding).
 * The host arrays weight, wgrad, bias and accumulate (n_groups entries each)
 * are passed to the device through kernel parameters, into the workspace, so
 * a call never allocates, never synchronizes and can be captured in a graph.
 * The Hopper kernel also takes sizes known on the host (host_rows instead of
 * device_rows), through kernel parameters in the same way.
 * The workspace is used by the work enqueued by the call only: successive
 * calls on one stream may share one. */
typedef enum {
  GMLP_KERNEL_GEMM_FPROP = 0,
  GMLP_KERNEL_GEMM_DGRAD = 1,
  GMLP_KERNEL_GEMM_WGRAD = 2,
} GmlpKernelGemmKind;

/* Where the FP8 scale inverses of one operand lie, the operand seen as the
 * product reads it (K-major: rows × depth, depth summed over). row_block 0:
 * one scale per group, *scale_inv[i] (the per-tensor recipes). Otherwise
 * blocks of row_block rows (1 or 128) × 128 values along the depth, counted
 * from the group's first row and first value: the scale of row r, depth d
 * of group i is scale_inv[i][(r / row_block) * row_stride + (d / 128) *
 * depth_stride] (the blockwise recipe, its rowwise tensors and columnwise
 * copies alike). */
typedef struct {
  int64_t row_block;
  int64_t row_stride;
  int64_t depth_stride;
} GmlpKernelFp8Scales;

typedef struct {
  GmlpKernelGemmKind  kind;
  uint32_t            n_groups;
  const int64_t      *device_rows;   /* device memory, or NULL: */
  const int64_t      *host_rows;     /* host array (Hopper kernel only), or NULL */
  int64_t             row_capacity;
  int64_t             n;
  int64_t             k;
  int                 ab_dtype;
  int                 c_dtype;       /* ab_dtype or FLOAT32 */
  const void         *a;
  const void         *b_rows;        /* WGRAD */
  void               *c_rows;        /* FPROP, DGRAD */
  const void * const *weight;        /* host array: FPROP, DGRAD */
  void * const       *wgrad;         /* host array: WGRAD */
  const void * const *bias;          /* host array or NULL: FPROP, c_dtype */
  const uint8_t      *accumulate;    /* host array or NULL: WGRAD */
  /* FP8 operands (Hopper kernel): ab_dtype is A's format (FLOAT8_E4M3 or
   * FLOAT8_E5M2) and b_dtype B's, both K-major, the transposed ones being
   * the quantizer's columnwise copies: DGRAD's weight_i is Wᵀ_i (k × n);
   * WGRAD's a and b_rows are the copies of dy and x (member i n × m_i and
   * k × m_i, at the offsets of the rowwise members). Value
   * q of group i stands for q × *a_scale_inv[i] (B: b_scale_inv), host
   * arrays of device pointers to one FP32 each; c_dtype FLOAT32, FLOAT16
   * or BFLOAT16. Ignored for 16-bit operands. */
  int                 b_dtype;
  const float * const *a_scale_inv;
  const float * const *b_scale_inv;
  /* Blockwise FP8 (row_block > 0; zeros: per-tensor): A's scales in rows
   * (row_block 1), B's in 128 × 128 tiles for FPROP and DGRAD and in rows
   * for WGRAD, E4M3 × E4M3 or E5M2 × E4M3. With device sizes the scales
   * that follow the sizes are tensors grouped by them, and the
   * scale_inv tables of those are not read: FPROP and DGRAD, A's are
   * a_scale_rows (member i: m_i × ceil (depth / 128) floats); WGRAD, the
   * columnwise copies' scales, A's a_scale_rows and B's b_scale_rows
   * (member i: ceil (m_i / 128) × n floats for A, × k for B, as the
   * quantizer lays them out, row capacity
   * gmlp_quant_blocked_capacity (row_capacity, n_groups, 128)). */
  GmlpKernelFp8Scales  a_scales;
  GmlpKernelFp8Scales  b_scales;
  const float         *a_scale_rows;
  const float         *b_scale_rows;
} GmlpKernelDeviceGemm;

/* A choice that the Hopper kernel's heuristics make from the problem,
 * left to them (AUTO) or forced: NEVER, or ALWAYS wherever the kernel's
 * instance can. */
typedef enum {
  GMLP_KERNEL_CHOICE_AUTO = 0,
  GMLP_KERNEL_CHOICE_NEVER = 1,
  GMLP_KERNEL_CHOICE_ALWAYS = 2,
} GmlpKernelChoice;

/* The Hopper kernel's configuration that tests and benchmarks may force
 * (libgmlp's device tuning, libgmlp/gmlp-tuning-private.h); all zeros, or
 * a NULL pointer, leave every choice to the heuristics. Pass the same one
 * to _check, _workspace_bytes and the launch.
 *
 *   fp8_tile_n   0: by shape; 128 or 192: every FP8 product's output tiles
 *                that wide
 *   direct       NEVER: every product through the plan, also those that
 *                the direct schedule would take
 *   short_tiles  NEVER: a group's last tile of 64 rows or fewer computed
 *                as a whole 128-row one; ALWAYS: 16-bit idle halves on
 *                every reduction
 *   pairs        paired CTAs sharing B's tiles (direct schedule)
 *   even_waves   as few CTAs as keep the waves
 *   stream_k     the direct schedule's tail split
 *   max_ctas     0: one CTA per SM; N (even, at least 2): at most N, so
 *                that small products make several waves */
typedef struct {
  int               fp8_tile_n;
  GmlpKernelChoice  direct;
  GmlpKernelChoice  short_tiles;
  GmlpKernelChoice  pairs;
  GmlpKernelChoice  even_waves;
  GmlpKernelChoice  stream_k;
  int               max_ctas;
} GmlpKernelSm90Tuning;

/* libgmlp's Hopper kernel (sm_90a: TMA, wgmma, a persistent device-side
 * scheduler). _check says whether it covers the arguments (SUCCESS), and if
 * not why (*reason, a static string); the launch checks again. tuning may
 * be NULL. */
GmlpKernelStatus gmlp_kernel_device_gemm_sm90_check (const GmlpKernelDeviceGemm   *gemm,
                                                     const GmlpKernelSm90Tuning   *tuning,
                                                     int                           device_major,
                                                     int                           device_minor,
                                                     const char                  **reason);
size_t           gmlp_kernel_device_gemm_sm90_workspace_bytes (const GmlpKernelDeviceGemm *gemm,
                                                               const GmlpKernelSm90Tuning *tuning);
GmlpKernelStatus gmlp_kernel_device_gemm_sm90       (const GmlpKernelDeviceGemm   *gemm,
                                                     const GmlpKernelSm90Tuning   *tuning,
                                                     void                         *workspace,
                                                     int                           n_sms,
                                                     cudaStream_t                  stream);

/* The portable kernel: any GPU, FLOAT32, FLOAT16 or BFLOAT16 operands,
 * FP32 accumulation. Correct everywhere; slow next to the Hopper kernel. */
size_t           gmlp_kernel_device_gemm_simt_workspace_bytes (const GmlpKernelDeviceGemm *gemm);
GmlpKernelStatus gmlp_kernel_device_gemm_simt       (const GmlpKernelDeviceGemm *gemm,
                                                     void                       *workspace,
                                                     cudaStream_t                stream);

/* dbias_i[j] = Σ_r a_i[r, j] for a tensor whose sizes are on the device
 * (shape), summed in FP32 in a fixed order and stored as dtype (FLOAT32,
 * FLOAT16 or BFLOAT16); zero for an empty group. dbias is a host array of
 * n_groups device pointers, passed through kernel parameters into the
 * workspace. */
size_t           gmlp_kernel_grouped_bias_grad_device_workspace_bytes (const GmlpKernelGroupedShape *shape);
GmlpKernelStatus gmlp_kernel_grouped_bias_grad_device (const GmlpKernelGroupedShape *shape,
                                                       int                           dtype,
                                                       const void                   *a,
                                                       void * const                 *dbias,
                                                       void                         *workspace,
                                                       cudaStream_t                  stream);

/* Token permutation (permute.cu): the backend's routing_count,
 * routing_map and permute entries, whose contract is the comment above
 * GmlpBackendRoutingMap in libgmlp/backend/gmlp-backend.h (slots, row_of,
 * choice_of, padding, expert capacity). Everything that depends on the
 * indices is made and read on the device: no call waits or allocates, so
 * each can be captured in a graph. Results do not depend on scheduling
 * (no floating-point atomics); the map, and every row and sum but the dot
 * products of grad_probs, equal the CPU backend's bit for bit.
 *
 * counts[e] = the indices equal to e, for e < n_experts (indices out of
 * range count nowhere); every count is written. */
GmlpKernelStatus gmlp_kernel_routing_count    (const int64_t                *indices,
                                               int64_t                       n_choices,
                                               uint32_t                      n_experts,
                                               int64_t                      *counts,
                                               cudaStream_t                  stream);

/* The map of a routing (GmlpBackendRoutingMap): sizes (n_experts), row_of
 * (T × k) and choice_of (row_capacity), every element written. n_experts
 * 1 .. 65535; padding 1 .. 2^62; expert_capacity -1 (dropless) or the
 * most choices an expert keeps. row_capacity must bound Σ sizes (the
 * host's bound): a choice whose slot would fall past it is dropped instead
 * of written. Five stream operations (a memset of choice_of, then counts
 * per tile, a scan, the sizes and the scatter) in workspace
 * (gmlp_kernel_routing_map_workspace_bytes(), 8-byte aligned; 0: too
 * large). */
typedef struct {
  int64_t        n_tokens;
  uint32_t       top_k;            /* 1 .. 16 */
  uint32_t       n_experts;
  const int64_t *indices;          /* T × k */
  int64_t        padding;
  int64_t        expert_capacity;
  int64_t        row_capacity;
  int64_t       *sizes;
  int64_t       *row_of;
  int64_t       *choice_of;
} GmlpKernelRoutingMap;

size_t           gmlp_kernel_routing_map_workspace_bytes (const GmlpKernelRoutingMap *map);
GmlpKernelStatus gmlp_kernel_routing_map      (const GmlpKernelRoutingMap   *map,
                                               void                         *workspace,
                                               cudaStream_t                  stream);

/* The rows to and from the permuted layout (GmlpBackendPermute, whose
 * kinds these equal): FLOAT32, FLOAT16 or BFLOAT16 operands, each in its
 * own dtype, FP32 arithmetic. A small kernel walks shape's device sizes
 * into workspace (gmlp_kernel_permute_workspace_bytes (n_groups), 8-byte
 * aligned), then one kernel writes every output row (FORWARD,
 * COMBINE_BACKWARD: every row of every member, clamped to the allocation;
 * COMBINE, BACKWARD: every token), 16-byte packs where cols is a multiple
 * of 8 and the bases allow. COMBINE_BACKWARD zeroes grad_probs first (a
 * memset). */
typedef enum {
  GMLP_KERNEL_PERMUTE_FORWARD = 0,
  GMLP_KERNEL_PERMUTE_COMBINE = 1,
  GMLP_KERNEL_PERMUTE_BACKWARD = 2,
  GMLP_KERNEL_PERMUTE_COMBINE_BACKWARD = 3,
} GmlpKernelPermuteKind;

typedef struct {
  GmlpKernelPermuteKind   kind;
  GmlpKernelGroupedShape  shape;       /* the permuted layout */
  int64_t                 n_tokens;
  uint32_t                top_k;
  const int64_t          *row_of;
  const int64_t          *choice_of;
  const float            *probs;
  const void             *tokens;
  int                     tokens_dtype;
  const void             *permuted;
  int                     permuted_dtype;
  void                   *out;
  int                     out_dtype;
  float                  *grad_probs;  /* COMBINE_BACKWARD, or NULL */
  const float            *addend;      /* BACKWARD, or NULL: T × cols, added
                                        * to each FP32 sum before rounding */
} GmlpKernelPermute;

size_t           gmlp_kernel_permute_workspace_bytes (uint32_t n_groups);
GmlpKernelStatus gmlp_kernel_permute          (const GmlpKernelPermute      *permute,
                                               void                         *workspace,
                                               cudaStream_t                  stream);

/* Chunks of rows whose counts are only on the device (row_chunks.cu): the
 * move_rows entry of the backend, whose contract (GmlpBackendMoveRows,
 * libgmlp/backend/gmlp-backend.h) these fields copy; the layout codes
 * equal GmlpBackendChunkLayout's. One single-block kernel plans every
 * chunk into workspace (gmlp_kernel_move_rows_workspace_bytes, 16-byte
 * aligned), then one kernel moves the rows, a warp per row, in the
 * widest vectors the bases, strides and row width allow. */
enum {
  GMLP_KERNEL_CHUNKS_SLOTS = 0,
  GMLP_KERNEL_CHUNKS_PACKED = 1,
  GMLP_KERNEL_CHUNKS_MEMBERS = 2,
  GMLP_KERNEL_CHUNKS_MEMBERS_BY_B = 3,
};

typedef struct {
  int             layout;
  void           *base;
  uint64_t        capacity;     /* bytes */
  int64_t         slot_rows;
  uint64_t        slot_stride;
  const int64_t  *member_rows;
  uint32_t        n_members;
} GmlpKernelChunkSide;

typedef struct {
  uint32_t             n_a;
  uint32_t             n_b;
  const int64_t       *counts;
  int64_t              max_chunk_rows;
  uint64_t             row_bytes;
  GmlpKernelChunkSide  src;
  GmlpKernelChunkSide  dst;
  int64_t             *dst_sizes;
  int                  zero_rest;
  int64_t             *kept;
  int64_t             *dropped;
} GmlpKernelMoveRows;

size_t           gmlp_kernel_move_rows_workspace_bytes (const GmlpKernelMoveRows *move);
GmlpKernelStatus gmlp_kernel_move_rows        (const GmlpKernelMoveRows     *move,
                                               void                         *workspace,
                                               cudaStream_t                  stream);

/* FP32 values as sums of BF16 parts and back (split.cu): the
 * split_bfloat16 and sum_parts entries of the backend, whose contracts
 * (GmlpBackendSplit, GmlpBackendSumParts, libgmlp/backend/gmlp-backend.h)
 * these fields copy; the parts are gmlp_num_split_bfloat16()'s bits and
 * the sums are added in the order stated there, so the CPU backend gives
 * the same bits. One launch each, over 32 × 32 tiles of the matrix: an
 * output whose row stride is 1 (a transposed one) is written through
 * shared memory, so that its stores are as coalesced as the loads. */
#define GMLP_KERNEL_MAX_SPLIT_PARTS 3
#define GMLP_KERNEL_MAX_SPLIT_OUTPUTS 6

typedef struct {
  int64_t         rows;
  int64_t         cols;
  const float    *src;
  int64_t         src_stride;
  uint32_t        n_parts;
  uint16_t       *dst;
  int64_t         dst_row_stride;
  int64_t         dst_col_stride;
  uint32_t        n_outputs;
  uint32_t        part[GMLP_KERNEL_MAX_SPLIT_OUTPUTS];
  int64_t         offset[GMLP_KERNEL_MAX_SPLIT_OUTPUTS];
} GmlpKernelSplit;

typedef struct {
  int64_t         rows;
  int64_t         cols;
  const float    *src;
  int64_t         src_stride;
  uint32_t        n_parts;
  int64_t         offset[GMLP_KERNEL_MAX_SPLIT_OUTPUTS];
  float          *dst;
  int64_t         dst_stride;
  int             accumulate;
} GmlpKernelSumParts;

GmlpKernelStatus gmlp_kernel_split_bfloat16   (const GmlpKernelSplit        *split,
                                               cudaStream_t                  stream);
GmlpKernelStatus gmlp_kernel_sum_parts        (const GmlpKernelSumParts     *sum,
                                               cudaStream_t                  stream);

/* FP8 quantization of grouped tensors (quantize.cu). The recipe codes
 * (GMLP_QUANT_*, = GmlpScalingRecipe), flags, block geometry, state layout
 * and all the arithmetic are those of gmlp-quantize-numeric.h, which the CPU
 * backend shares, so both give the same bits; docs/fp8.md has the formulas.
 *
 * Every output is a grouped layout over the group sizes of shape (read on
 * the device, clamped to the capacity as everywhere): member i of
 *   data         the FP8 values, m_i × cols, the layout of src;
 *   scale_inv    gmlp_quant_blocks_along (m_i, block_rows) ×
 *                gmlp_quant_blocks_along (cols, block_cols) scales (FP32, or
 *                E8M0 bytes for MXFP8), rowwise blocks of gmlp_quant_blocks();
 *   columnwise   or NULL: the transposed copy, cols × m_i, in the member
 *                layout of data;
 *   columnwise_scale_inv  its scales, in the same way for the columnwise
 *                blocks, where gmlp_quant_columnwise_has_scales() (else the
 *                copy uses scale_inv);
 *   derived_rows or NULL: n_groups INT64, gmlp_quant_blocks_along (m_i, b)
 *                for b = gmlp_quant_derived_row_block(), the sizes of the
 *                scale tensors whose rows are blocks of rows.
 * DELAYED reads each group's scale from state (n_groups rows of
 * gmlp_quant_state_stride (history_length) floats) and max-es the group's
 * amax into the row's amax; CURRENT runs an amax pass first, into
 * workspace (gmlp_kernel_grouped_quantize_workspace_bytes(): zeroed here).
 * At most three stream operations, whatever the number of groups. */
typedef struct {
  GmlpKernelGroupedShape  shape;
  int                     recipe;
  int                     flags;
  int                     src_dtype;              /* FLOAT32, FLOAT16 or BFLOAT16 */
  int                     fp8_dtype;              /* FLOAT8_E4M3 or FLOAT8_E5M2 */
  const void             *src;
  void                   *data;
  void                   *scale_inv;
  void                   *columnwise;
  void                   *columnwise_scale_inv;
  int64_t                *derived_rows;
  float                  *state;
  uint32_t                history_length;
} GmlpKernelQuantize;

/* SUCCESS when the kernels cover the call; otherwise why not (*reason, a
 * static string), so that the caller can refuse it before any launch. */
GmlpKernelStatus gmlp_kernel_grouped_quantize_check           (const GmlpKernelQuantize *q,
                                                               const char              **reason);
size_t           gmlp_kernel_grouped_quantize_workspace_bytes (const GmlpKernelQuantize *q);
GmlpKernelStatus gmlp_kernel_grouped_quantize                 (const GmlpKernelQuantize *q,
                                                               void                     *workspace,
                                                               cudaStream_t              stream);

/* dst = data × scale_inv per element, by the rowwise blocks of the recipe
 * and flags; dst is FLOAT32, FLOAT16 or BFLOAT16, laid out like data with
 * its own element size. One launch. */
typedef struct {
  GmlpKernelGroupedShape  shape;
  int                     recipe;
  int                     flags;
  int                     fp8_dtype;
  const void             *data;
  const void             *scale_inv;
  void                   *dst;
  int                     dst_dtype;
} GmlpKernelDequantize;

GmlpKernelStatus gmlp_kernel_grouped_dequantize (const GmlpKernelDequantize *d,
                                                 cudaStream_t                stream);

/* gmlp_quant_delayed_update() of each of the n_groups state rows, one
 * launch. */
GmlpKernelStatus gmlp_kernel_quantizer_update   (float                      *state,
                                                 uint32_t                    n_groups,
                                                 uint32_t                    history_length,
                                                 int                         fp8_dtype,
                                                 int                         margin,
                                                 cudaStream_t                stream);

/* Activation and FP8 quantization in one pass (activation_quantize.cu):
 * the FC2 input of an FP8 GroupedMLP. The activation (the codes of
 * GmlpKernelActivation, the arithmetic of gmlp-activation-numeric.h) of
 * in, rounded to dtype as gmlp_kernel_grouped_activation() stores it, is
 * quantized exactly as gmlp_kernel_grouped_quantize() would quantize that
 * stored tensor: the same bytes and scales, the same amax recorded into a
 * DELAYED state, without the activation ever being written out.
 *
 * shape: the group sizes (read on the device, clamped to the capacity as
 * everywhere) and row capacity of in and of the outputs; cols = f, the
 * columns of the activation's output. in has f values per row, 2f for the
 * gated activations ([a | b]), in the member layout of its own row size.
 * The outputs, recipe, flags, state and derived_rows are those of
 * GmlpKernelQuantize. One launch reads in once and writes the FP8 data, its
 * scales and the columnwise copy; CURRENT launches the kernel twice (the
 * per-group amaxes of the activation into workspace, zeroed here, then the
 * quantization, which computes the activation again). */
typedef struct {
  GmlpKernelGroupedShape  shape;                  /* cols = f */
  int                     activation;
  int                     dtype;                  /* of in: FLOAT32, FLOAT16 or BFLOAT16 */
  const void             *in;
  int                     recipe;
  int                     flags;
  int                     fp8_dtype;
  void                   *data;
  void                   *scale_inv;
  void                   *columnwise;
  void                   *columnwise_scale_inv;
  int64_t                *derived_rows;
  float                  *state;
  uint32_t                history_length;
} GmlpKernelActivationQuantize;

/* SUCCESS when the kernels cover the call; otherwise why not (*reason, a
 * static string), so that the caller can refuse it before any launch. */
GmlpKernelStatus gmlp_kernel_grouped_activation_quantize_check (const GmlpKernelActivationQuantize *q,
                                                                const char                        **reason);
size_t           gmlp_kernel_grouped_activation_quantize_workspace_bytes (const GmlpKernelActivationQuantize *q);
GmlpKernelStatus gmlp_kernel_grouped_activation_quantize       (const GmlpKernelActivationQuantize *q,
                                                                void                               *workspace,
                                                                cudaStream_t                        stream);

#ifdef __cplusplus
}
#endif

#endif /* GMLP_KERNELS_H */
