/* gmlp-test-util.h: shared helpers of the C test suites
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <gmlp.h>

G_BEGIN_DECLS

/* The device a suite runs on: GMLP_TEST_DEVICE=cpu (default) or cuda. NULL,
 * after g_test_skip(), when that device is not usable here. Its tuning
 * (libgmlp/gmlp-tuning-private.h) is GMLP_TEST_TUNING's, "key=value,…"
 * (tests/meson.build forces routes and schedules so); none by default. */
GmlpDevice *gmlp_test_device_or_skip   (void);
/* Whether the device's tuning sets key to value. */
gboolean    gmlp_test_tuned            (GmlpDevice *device,
                                        const char *key,
                                        const char *value);

/* Whether fresh memory is poisoned (GMLP_DEBUG=poison, which the suites
 * set): 0xff bytes, NaN in every floating type. */
gboolean    gmlp_test_poisoned         (void);

/* Independent float64 models of the storage formats, for references. */
typedef struct {
  const char *name;
  int         mbits;      /* stored mantissa bits */
  int         emin;       /* exponent of the smallest normal */
  double      max;        /* largest finite value */
  gboolean    saturate;   /* FP8: overflow gives ±max; else ±inf */
} GmlpTestFormat;

const GmlpTestFormat *gmlp_test_format        (GmlpDType dtype);
/* x rounded to the format, nearest even, as a double (NaN stays NaN). */
double      gmlp_test_round               (double x, GmlpDType dtype);
/* Decodes element i of a host array of dtype to double, independently of the
 * library's decoders. */
double      gmlp_test_decode              (gconstpointer data, GmlpDType dtype, gsize i);
/* Random packed host data for a tensor: normal values of the given scale
 * (floating types), with some zeros and, if specials, NaN/±Inf/±0 and values
 * past the range of FP8 and FP16. */
GBytes     *gmlp_test_random_bytes        (GmlpDType dtype, gsize n_elements, double scale,
                                           gboolean specials);
/* Values as packed host data of FLOAT32, FLOAT16 or BFLOAT16 (through
 * float, then the library's conversions). */
GBytes     *gmlp_test_encode_values       (const double *values, gsize n, GmlpDType dtype);
/* n_groups random sizes in [0, max_rows], with about one in five empty. */
gint64     *gmlp_test_random_rows         (guint n_groups, gint64 max_rows);

/* A GObject::notify handler that counts: counter is a guint. */
void        gmlp_test_count_notify        (GObject    *object,
                                           GParamSpec *pspec,
                                           gpointer    counter);

/* Asserts that two doubles agree: both NaN, or equal including the sign of
 * zero. */
#define gmlp_assert_same_value(a, b, what, index) \
  G_STMT_START { \
    double _a = (a), _b = (b); \
    if (!((isnan (_a) && isnan (_b)) || (_a == _b && signbit (_a) == signbit (_b)))) \
      g_error ("%s [%" G_GSIZE_FORMAT "]: got %.9g, expected %.9g", (what), (gsize) (index), _a, _b); \
  } G_STMT_END

G_END_DECLS

G_BEGIN_DECLS

/* A tensor of fresh random normal values (scale × N(0,1)) uploaded from the
 * host; *values receives them, as stored (decoded), packed. */
GmlpGroupedTensor *gmlp_test_random_tensor     (GmlpDevice     *device,
                                                GmlpDType       dtype,
                                                const gint64   *rows,
                                                guint           n_groups,
                                                gint64          cols,
                                                double          scale,
                                                double        **values);
/* A one-group tensor of rows × cols values, stored in dtype (FLOAT32,
 * FLOAT16 or BFLOAT16). */
GmlpGroupedTensor *gmlp_test_upload_values     (GmlpDevice     *device,
                                                const double   *values,
                                                gint64          rows,
                                                gint64          cols,
                                                GmlpDType       dtype);
/* scale × N(0, 1) (Box-Muller on g_test_rand), rounded to dtype; n of them
 * in a new array. */
double             gmlp_test_normal            (double          scale,
                                                GmlpDType       dtype);
double            *gmlp_test_normals           (gsize           n,
                                                double          scale,
                                                GmlpDType       dtype);
/* Sets a layer's weights (n_groups × out × in values, packed) and, when it
 * has biases, its biases (n_groups × out), stored in its dtype. */
void               gmlp_test_set_linear        (GmlpGroupedLinear *linear,
                                                const double      *w,
                                                const double      *b);
/* Every weight gradient an MoE layer holds, as bytes (each to unref): the
 * router's, then the experts' and the shared expert's, FC1's and FC2's
 * weight and bias gradients (those that exist); with fused accumulation the
 * main_grads instead of the weight gradients (member by member where they
 * are per group). */
GPtrArray         *gmlp_test_moe_gradient_bytes (GmlpMoELayer   *layer);
/* Asserts that two arrays of GBytes hold the same bytes, item by item. */
void               gmlp_test_assert_same_bytes_array (GPtrArray  *a,
                                                      GPtrArray  *b,
                                                      const char *what);
/* An INT64 tensor's values, packed (*n of them). */
gint64            *gmlp_test_download_i64      (GmlpGroupedTensor *tensor,
                                                gsize             *n);
/* The value of a 1 × 1 tensor. */
double             gmlp_test_download_scalar   (GmlpGroupedTensor *tensor);
/* The tensor's values, packed, decoded to double. */
double            *gmlp_test_download          (GmlpGroupedTensor *tensor,
                                                gsize             *n_values);
/* Initialises every libgmlp class and GLib's own lazily made locks before
 * a test starts threads: GLib does it on first use under locks inside
 * libglib that ThreadSanitizer does not see, so that what it reports is
 * libgmlp's. */
void               gmlp_test_prepare_threads   (void);
/* Relative tolerance of a product stored in dtype, FP32 accumulation. */
double             gmlp_test_tolerance         (GmlpDType       dtype);
/* Asserts every value is finite (poisoned memory is NaN) and
 * ‖got − want‖ ≤ tol ‖want‖; where want is all zero, got must be exactly
 * zero. */
void               gmlp_test_assert_close      (const double   *got,
                                                const double   *want,
                                                gsize           n,
                                                double          tol,
                                                const char     *what);
/* ‖got − want‖ / ‖want‖ (‖got − want‖ where want is all zero); every value
 * must be finite (poisoned memory is NaN). */
double             gmlp_test_relative_error    (const double   *got,
                                                const double   *want,
                                                gsize           n,
                                                const char     *what);

/* A tensor with the group sizes of @sizes (device-only) and row capacity
 * @capacity holding a byte copy of @host's members (whose rows are the
 * rows that fit, so the member offsets agree wherever there are rows). */
GmlpGroupedTensor *gmlp_test_device_sized_copy (GmlpGroupedTensor *host,
                                                GmlpGroupedTensor *sizes,
                                                gint64             capacity);
/* A host-sizes view of @t's storage whose members have @rows rows, to read
 * results where the kernels put them. */
GmlpGroupedTensor *gmlp_test_host_view         (GmlpGroupedTensor *t,
                                                const gint64      *rows);

/* FP8 tensors. */

/* The recipe's name in messages: "delayed", "current", ... */
const char        *gmlp_test_recipe_name       (GmlpScalingRecipe  recipe);
/* A quantized tensor's values, packed, decoded independently of the
 * library: the FP8 bits (gmlp_test_decode()) times the scale of their block
 * (FP32, or 2^(b − 127) for an E8M0 byte b), in float64. Host sizes. For
 * a columnwise copy, the values in the rowwise tensor's order (member i
 * m_i × cols, read from the copy's transposed member). */
double            *gmlp_test_dequantize        (GmlpGroupedTensor *q);
/* A new quantizer of q's settings (recipe, format, role, history,
 * power-of-2 scales) and state: what q would quantize, it quantizes to
 * the same bytes. */
GmlpQuantizer     *gmlp_test_copy_quantizer    (GmlpDevice        *device,
                                                GmlpQuantizer     *q);
/* Whether the FP8 products of this device multiply FP8 operands where the
 * recipe lets them (per-tensor, blockwise): the CPU, or a Hopper GPU (the
 * CUDA backend's Hopper kernel; known by name, the API has no compute
 * capability), unless the tuning's device-gemm=portable forces the
 * portable kernel. Elsewhere they run on dequantized operands. */
gboolean           gmlp_test_fp8_native        (GmlpDevice        *device);
/* Asserts that two tensors have the same dtype, columns and values, read
 * packed over the sizes each has (device sizes clamped in order to the
 * capacity, as to_bytes() reads them): the first byte that differs, if
 * one does. */
void               gmlp_test_assert_same_packed (GmlpGroupedTensor *a,
                                                 GmlpGroupedTensor *b,
                                                 const char        *what);
/* Writes @values (as @tensor's dtype) into a one-group tensor's storage by
 * a device copy, without a new version: new inputs for a captured graph's
 * next replay. */
void               gmlp_test_overwrite_values  (GmlpGroupedTensor *tensor,
                                                const double      *values);
/* Asserts that two tensors have the same dtype, shape and bytes (the
 * first byte that differs, if one does). */
void               gmlp_test_assert_same_bytes (GmlpGroupedTensor *a,
                                                GmlpGroupedTensor *b,
                                                const char        *what);

/* A GroupedLinear step's results as bytes (each to unref): y, dx, and
 * layer's weight and bias gradients, in that order. */
void               gmlp_test_step_bytes        (GmlpGroupedLinear *layer,
                                                GmlpGroupedTensor *y,
                                                GmlpGroupedTensor *dx,
                                                GBytes            *out[4]);

/* The float64 products of a GroupedLinear over packed rows (rows[g] rows of
 * group g): y = x Wᵀ + b, dx = dy W, dW = dyᵀ x and db = Σ dy_bias, group by
 * group. An output that is NULL is not computed; b may be NULL (no bias). */
void               gmlp_test_linear_reference  (const gint64 *rows,
                                                guint         n_groups,
                                                gint64        k,
                                                gint64        o,
                                                const double *x,
                                                const double *w,
                                                const double *b,
                                                const double *dy,
                                                const double *dy_bias,
                                                double       *y,
                                                double       *dx,
                                                double       *dw,
                                                double       *db);


/* The rows device sizes leave each group when clamped in order to what the
 * capacity has left (a negative size counting as 0): what the passes over
 * one layout keep, and every pass where rows are whole multiples of 256
 * bytes (docs/memory-layout.md). */
gint64            *gmlp_test_clamped_rows      (const gint64 *sizes,
                                                guint         n,
                                                gint64        capacity);
/* A device tensor of group sizes: one member of n INT64 values. */
GmlpGroupedTensor *gmlp_test_sizes_tensor      (GmlpDevice   *device,
                                                const gint64 *sizes,
                                                guint         n);

/* The activations of a GroupedMLP in float64, written independently of
 * the library (the tanh form of GELU; the gated ones' act(a)), and their
 * derivatives by central differences. */
double             gmlp_test_act               (GmlpActivation act,
                                                double         x);
double             gmlp_test_act_grad          (GmlpActivation act,
                                                double         x);

/* The float64 results of a GroupedMLP step (each n_values long, packed
 * rows): y, dx, and the weight and bias gradients of FC1 and FC2. */
typedef struct {
  double *y, *dx, *dw1, *db1, *dw2, *db2;
} GmlpTestMlpResult;

/* A GroupedMLP's forward and backward for dL/dy = dy over packed rows
 * (rows[g] of group g), from FC1's output h as the library stored it (so
 * that a float64 h near a kink of ReLU cannot gate differently), with the
 * intermediates (the activation, its input gradient, FC1's output
 * gradient) rounded to dtype as the library stores them. */
void               gmlp_test_mlp_reference     (GmlpActivation     act,
                                                GmlpDType          dtype,
                                                const gint64      *rows,
                                                guint              n_groups,
                                                gint64             hid,
                                                gint64             ffn,
                                                const double      *x,
                                                const double      *h,
                                                const double      *dy,
                                                const double      *w1,
                                                const double      *w2,
                                                const double      *b2,
                                                GmlpTestMlpResult *out);
void               gmlp_test_mlp_result_clear  (GmlpTestMlpResult *result);

/* A forward and backward of @mlp (and backward_dw when it delays weight
 * gradients), under an offload context when @offload, whose saved
 * activations must then have gone to the host (when there was anything to
 * offload); *saved_nbytes (optional): the bytes they held. */
void               gmlp_test_mlp_step          (GmlpGroupedMLP     *mlp,
                                                GmlpGroupedTensor  *x,
                                                GmlpGroupedTensor  *dy,
                                                gboolean            offload,
                                                GmlpGroupedTensor **y,
                                                GmlpGroupedTensor **dx,
                                                guint64            *saved_nbytes);

G_END_DECLS
