/* gmlp-grouped-linear-impl.h: what the files of GmlpGroupedLinear share
 *
 * The layer is six files, one job each, listed from the top down: each
 * calls only files below it.
 *
 * - gmlp-grouped-linear-products.c: forward, backward and backward_dw, and
 *   the weight gradients' outputs;
 * - gmlp-grouped-linear.c: the object: type, properties, signal,
 *   construction, accessors, the quantizers and cache-fp8-weights (set,
 *   read, updated); the file above notifies and emits through it;
 * - gmlp-grouped-linear-fp8.c: which quantizers and recipes the products
 *   take, and which FP8 product, scales and fall-back each operand takes;
 * - gmlp-grouped-linear-runner.c: what the plain and FP8 products share:
 *   the checks of activations, the operands of the backend's descriptor,
 *   each product described as a Product and handed to the backend, the
 *   bias gradient;
 * - gmlp-grouped-linear-split.c: an FP32 layer's products of a BF16 input
 *   (the router's gate), on BF16 tensor cores with the FP32 operands split
 *   into BF16 parts;
 * - gmlp-grouped-linear-params.c: the parameters and their gradients:
 *   their per-group faces, drawn, uploaded, read grouped or per group.
 *
 * No other file includes it: GroupedMLP's view of the layer is
 * gmlp-grouped-linear-private.h.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "gmlp-grouped-linear-private.h"
#include "gmlp-device-private.h"
#include "gmlp-event.h"
#include "gmlp-grouped-tensor-private.h"
#include "gmlp-quantizer.h"

G_BEGIN_DECLS

/* The per-group face of a grouped tensor: cached member views. Products
 * read the grouped tensor (base + stride), or, once a member has been
 * rebound to a caller's tensor (main_grad), the table of the members'
 * pointers. */
typedef struct {
  GmlpGroupedTensor  *grouped;
  GmlpGroupedTensor **members;
  gpointer           *table;
  gboolean            rebound;
} Param;

struct _GmlpGroupedLinear
{
  GObject             parent_instance;

  GmlpDevice         *device;
  guint               n_groups;
  gint64              in_features;
  gint64              out_features;
  GmlpDType           dtype;
  GmlpLinearFlags     flags;
  guint64             id;

  Param               weight;
  Param               bias;
  Param               wgrad;       /* allocated at the first unfused weight-gradient computation */
  Param               bgrad;
  Param               main_grad;   /* FP32; members may be rebound to caller tensors */
  guint8             *accumulate;  /* per group, for the fused main_grad */

  /* Runs the weight-gradient computations (backward, backward_dw) one at
   * a time, and guards their state: wgrad and bgrad, made at the first,
   * pending, the two flags, main_grad's bindings and the mask.
   * Recursive, for a wgrad-ready handler that calls back in. */
  GRecMutex           grad_lock;
  GQueue              pending;     /* of PendingWgrad, oldest first */
  gboolean            wgrad_valid;
  gboolean            grad_added_to_main_grad;

  /* FP8 (set in gmlp-grouped-linear.c, used in gmlp-grouped-linear-fp8.c):
   * all three, or none. */
  GmlpQuantizer      *input_quantizer;
  GmlpQuantizer      *weight_quantizer;
  GmlpQuantizer      *grad_output_quantizer;
  /* The quantized weights of the last forward, reused while
   * cache_fp8_weights is set and nothing has changed the weights. */
  gboolean            cache_fp8_weights;
  GmlpGroupedTensor  *weight_fp8;

  /* Why constructed() failed; every method reports it. */
  GError             *construct_error;
  GMutex              fp8_lock;    /* guards the two above */

  /* gmlp_grouped_linear_take_bf16_input(): a BF16 input's products run
   * on BF16 tensor cores (gmlp-grouped-linear-split.c). */
  gboolean            bf16_input;
  /* Their weight in BF16 parts, split once per version of the weight
   * (gmlp-grouped-linear-split.c); split_lock guards the three. */
  GMutex              split_lock;
  GmlpGroupedTensor  *w_parts;
  GmlpGroupedTensor  *w_parts_of;      /* the weight they were split from */
  GArray             *w_parts_version; /* GmlpVersionRecord of that weight */
};

/* What an FP8 weight-gradient computation would otherwise allocate while it
 * writes, made beforehand by gmlp_linear_fp8_wgrad_prepare(): dy in the layer's
 * dtype for the bias gradient when dy came quantized, and both operands
 * dequantized where the product cannot multiply FP8. */
typedef struct {
  GmlpGroupedTensor *bias_dy;
  GmlpGroupedTensor *dy;
  GmlpGroupedTensor *x;
} Fp8WgradOperands;

typedef struct {
  GmlpGroupedTensor *input;            /* FP8: quantized */
  GmlpGroupedTensor *grad_output;      /* FP8: NULL when given quantized */
  GmlpGroupedTensor *grad_output_fp8;  /* FP8: quantized; else NULL */
  Fp8WgradOperands   fp8_operands;
  GArray            *versions;         /* GmlpVersionRecord of the input and dy */
  /* A chunked backward's (gmlp_grouped_linear_backward_finish_chunks()):
   * the other chunks' input and dy (GmlpGroupedTensor pairs), and every
   * chunk's groups, n_chunks + 1 bounds; NULL for one. */
  GPtrArray         *chunks;
  guint             *bounds;
} PendingWgrad;

enum {
  PROP_0,
  PROP_DEVICE,
  PROP_N_GROUPS,
  PROP_IN_FEATURES,
  PROP_OUT_FEATURES,
  PROP_DTYPE,
  PROP_BIAS,
  PROP_SINGLE_GROUPED_WEIGHT,
  PROP_FUSE_WGRAD_ACCUMULATION,
  PROP_DELAY_WGRAD_COMPUTE,
  PROP_GRAD_ADDED_TO_MAIN_GRAD,
  PROP_PENDING_WGRADS,
  PROP_INPUT_QUANTIZER,
  PROP_WEIGHT_QUANTIZER,
  PROP_GRAD_OUTPUT_QUANTIZER,
  PROP_CACHE_FP8_WEIGHTS,
  N_PROPS
};

static inline gboolean
has_flag (GmlpGroupedLinear *self,
          GmlpLinearFlags    flag)
{
  return (self->flags & flag) != 0;
}

static inline GmlpGroupedTensor *
new_uniform (GmlpGroupedLinear  *self,
             GmlpDType           dtype,
             gint64              rows,
             gint64              cols,
             GError            **error)
{
  return gmlp_grouped_tensor_new_uniform (self->device, dtype, self->n_groups, rows, cols, error);
}

/* gmlp-grouped-linear.c */

void               gmlp_grouped_linear_notify           (GmlpGroupedLinear  *self,
                                                         guint               prop_id);
/* The event of a wgrad-ready, NULL without a handler
 * (gmlp_event_record_for_signal()); emitting a NULL one does nothing. */
gboolean           gmlp_grouped_linear_record_wgrad_ready (GmlpGroupedLinear  *self,
                                                           GmlpEvent         **event,
                                                           GError            **error);
void               gmlp_grouped_linear_emit_wgrad_ready (GmlpGroupedLinear  *self,
                                                         GmlpEvent          *event);
/* For the queue of delayed weight gradients. */
void               gmlp_linear_pending_wgrad_free       (gpointer            data);

/* gmlp-grouped-linear-params.c */

void               gmlp_linear_param_clear              (Param              *param,
                                                         guint               n_groups);
gboolean           gmlp_linear_param_set                (Param              *param,
                                                         GmlpGroupedTensor  *grouped,
                                                         guint               n_groups,
                                                         GError            **error);
/* Binds member @index of @param to a caller's one-member tensor. */
void               gmlp_linear_param_rebind             (Param              *param,
                                                         guint               index,
                                                         GmlpGroupedTensor  *member);

/* gmlp-grouped-linear-runner.c */

/* The checks of an activation shared by its plain and FP8 paths: on the
 * layer's device; the layer's groups and cols columns. */
gboolean           gmlp_linear_check_activation_device  (GmlpGroupedLinear     *self,
                                                         GmlpGroupedTensor     *tensor,
                                                         const char            *what,
                                                         GError               **error);
gboolean           gmlp_linear_check_activation_shape   (GmlpGroupedLinear     *self,
                                                         GmlpGroupedTensor     *tensor,
                                                         gint64                 cols,
                                                         const char            *what,
                                                         GError               **error);

/* The operands of the backend's descriptor (GmlpBackendGemm): a tensor
 * grouped by the sizes; the members of a uniform tensor (base + stride);
 * a parameter (its grouped tensor, or the table of rebound members). */
GmlpBackendOperand gmlp_linear_rows_operand             (GmlpGroupedTensor  *tensor);
GmlpBackendOperand gmlp_linear_fixed_operand            (GmlpGroupedTensor  *uniform);
GmlpBackendOperand gmlp_linear_param_operand            (const Param        *param);
/* The group sizes of @sized_by into @gemm: host sizes, or the device's
 * with the row capacity. */
gboolean           gmlp_linear_gemm_sizes               (GmlpBackendGemm    *gemm,
                                                         GmlpGroupedTensor  *sized_by,
                                                         GError            **error);

/* One grouped product of the layer (GmlpGemmKind: FPROP y = x Wᵀ [+ b],
 * DGRAD dx = dy W, WGRAD dW [+]= dyᵀ x). The operands grouped by rows are
 * tensors; the matrices of fixed shape are the members of a parameter.
 * gmlp_linear_run_product() describes it once to the backend's gemm, with
 * the sizes of sized_by (host or device) and the bias in the epilogue. */
typedef struct {
  GmlpGemmKind        kind;
  GmlpGroupedTensor  *sized_by;    /* whose group sizes apply: the forward's input */
  GmlpGroupedTensor  *a;           /* x (FPROP) or dy */
  GmlpGroupedTensor  *b_rows;      /* WGRAD: x */
  GmlpGroupedTensor  *c_rows;      /* FPROP: y; DGRAD: dx */
  Param              *fixed;       /* FPROP, DGRAD: the weights; WGRAD: wgrad or main_grad */
  GmlpDType           c_dtype;
  gboolean            bias;        /* FPROP: add the layer's bias */
  const guint8       *accumulate;  /* WGRAD: per group, add into main_grad;
                                    * a split DGRAD: add into c_rows */
  /* FP8: a, b_rows and fixed (but for WGRAD) hold dequantized values in
   * gmlp_linear_fp8_fallback_dtype() rather than the layer's dtype. */
  gboolean            dequantized;
  /* Split products: a DGRAD leaves dy's BF16 parts here, and the WGRAD of
   * the same backward takes them rather than splitting dy again. */
  GmlpGroupedTensor **dy_parts;
} Product;

gboolean           gmlp_linear_run_product              (GmlpGroupedLinear  *self,
                                                         const Product      *product,
                                                         GError            **error);
gboolean           gmlp_linear_run_bias_grad            (GmlpGroupedLinear  *self,
                                                         GmlpGroupedTensor  *sized_by,
                                                         GmlpGroupedTensor  *grad_output,
                                                         GError            **error);
/* The same into @pdb[i] rather than bgrad (a chunked backward's groups). */
gboolean           gmlp_linear_run_bias_grad_into       (GmlpGroupedLinear  *self,
                                                         GmlpGroupedTensor  *sized_by,
                                                         GmlpGroupedTensor  *grad_output,
                                                         void * const       *pdb,
                                                         GError            **error);
/* A new activation of @cols columns with the group sizes of @like. */
GmlpGroupedTensor *gmlp_linear_new_activation_like      (GmlpGroupedLinear  *self,
                                                         GmlpGroupedTensor  *like,
                                                         gint64              cols,
                                                         GError            **error);
/* Whether the innermost offload context can take this layer's
 * activations now. */
gboolean           gmlp_linear_check_offload_context    (GmlpGroupedLinear  *self,
                                                         GError            **error);
/* Counts the write of a weight-gradient computation in its outputs. */
void               gmlp_linear_bump_wgrad_versions      (GmlpGroupedLinear  *self);
/* The dtype that FP8's fall-back multiplies dequantized operands in. */
GmlpDType          gmlp_linear_fp8_fallback_dtype       (GmlpGroupedLinear  *self);

/* gmlp-grouped-linear-products.c */

/* A backward in three phases (gmlp-grouped-linear-private.h), so that
 * nothing is written before everything is checked, for GroupedMLP across
 * both its layers: begin checks the saved activations, their versions and
 * the output gradient, reloads the input and allocates; dgrad writes only
 * tensors of its own making; finish writes the weight gradients (or queues
 * them) and consumes the saved activations. */
struct _GmlpLinearBackward
{
  GmlpSavedActivations *saved;
  GmlpGroupedTensor    *input;             /* as saved: x, or x8 for FP8 */
  GmlpGroupedTensor    *w8;                /* FP8: the forward's quantized weights */
  GmlpGroupedTensor    *grad_output;       /* dy, as given */
  GmlpGroupedTensor    *grad_output_fp8;   /* FP8: dy quantized (dgrad) */
  Fp8WgradOperands      fp8_operands;      /* FP8: made by dgrad */
  GmlpGroupedTensor    *grad_input;        /* dx: made by begin, written by dgrad */
  GmlpGroupedTensor    *dy_parts;          /* split: dy's parts, from dgrad to wgrad */
};

/* gmlp-grouped-linear-split.c */

/* Whether @input (a forward's input, as saved) is a BF16 input that this
 * layer multiplies through split products. */
gboolean           gmlp_linear_splits                   (GmlpGroupedLinear     *self,
                                                         GmlpGroupedTensor     *input);
/* Whether @product is one of those products (its BF16 operand: FPROP's
 * a, DGRAD's c_rows, WGRAD's b_rows). */
gboolean           gmlp_linear_product_splits           (GmlpGroupedLinear     *self,
                                                         const Product         *product);
/* The checks of such an input beyond its dtype: host sizes. */
gboolean           gmlp_linear_check_split_input        (GmlpGroupedLinear     *self,
                                                         GmlpGroupedTensor     *input,
                                                         GError               **error);
gboolean           gmlp_linear_run_split_product        (GmlpGroupedLinear     *self,
                                                         const Product         *product,
                                                         GError               **error);
/* The input gradient of a split backward: a new BF16 tensor of the
 * input's shape, or FP32 with @fp32. */
GmlpGroupedTensor *gmlp_linear_split_grad_input         (GmlpGroupedLinear     *self,
                                                         GmlpGroupedTensor     *input,
                                                         gboolean               fp32,
                                                         GError               **error);

/* gmlp-grouped-linear-fp8.c */

gboolean           gmlp_linear_fp8_check_quantizers     (GmlpGroupedLinear     *self,
                                                         GmlpQuantizer         *input,
                                                         GmlpQuantizer         *weight,
                                                         GmlpQuantizer         *grad_output,
                                                         GError               **error);
gboolean           gmlp_linear_fp8_check_activation     (GmlpGroupedLinear     *self,
                                                         GmlpGroupedTensor     *tensor,
                                                         gint64                 cols,
                                                         const char            *what,
                                                         GmlpQuantizer         *quantizer,
                                                         const char            *product,
                                                         GmlpGroupedTensor     *partner,
                                                         GmlpQuantizer         *partner_quantizer,
                                                         GError               **error);
GmlpGroupedTensor *gmlp_linear_fp8_forward              (GmlpGroupedLinear     *self,
                                                         GmlpGroupedTensor     *input,
                                                         gboolean               save_input,
                                                         GmlpSavedActivations **saved,
                                                         GError               **error);
gboolean           gmlp_linear_fp8_dgrad                (GmlpGroupedLinear     *self,
                                                         GmlpLinearBackward    *step,
                                                         GError               **error);
gboolean           gmlp_linear_fp8_wgrad_prepare        (GmlpGroupedLinear     *self,
                                                         GmlpGroupedTensor     *input,
                                                         GmlpGroupedTensor     *grad_output,
                                                         GmlpGroupedTensor     *grad_output_fp8,
                                                         Fp8WgradOperands      *operands,
                                                         GError               **error);
gboolean           gmlp_linear_fp8_wgrad                (GmlpGroupedLinear     *self,
                                                         const Product         *wgrad,
                                                         GmlpGroupedTensor     *input,
                                                         GmlpGroupedTensor     *grad_output,
                                                         GmlpGroupedTensor     *grad_output_fp8,
                                                         Fp8WgradOperands      *operands,
                                                         GError               **error);
void               gmlp_linear_fp8_wgrad_operands_clear (Fp8WgradOperands      *operands);

G_END_DECLS
