/* test-moe-expert-parallel.c: the expert-parallel GmlpMoELayer against the
 * one-device layer, its bad input and its faults
 *
 * Every group is W threads of this process (W = 2, 3 and 4), rank r on a
 * device of its own: cpu:r on the CPU (the in-process communicator), cuda:r
 * in the gpu suite (NCCL; skipped without W GPUs or without libnccl;
 * gmlp-test-group.h).
 *
 * The reference of rank r is a one-device GmlpMoELayer made with the same
 * options and seed, run by rank r on rank r's tokens: its router, aux loss
 * and capacity drops are those of the local tokens, as the expert-parallel
 * layer's are. Each rank's output, input gradient and router gradient must
 * equal its reference's; each local expert's weight gradients the sum over
 * every rank's reference of that expert's; the local experts' parameters
 * after init_parameters() the reference's slice, bit for bit. The data
 * are drawn in the main thread (g_test_rand is not thread-safe), every
 * result read back by its rank and checked in the main thread.
 *
 * Tolerance: FP32, ‖got − want‖ ≤ 1e-5 ‖want‖. The products are
 * the same FP32 products, but the experts see their rows in other groups
 * (rows of every rank together) and the expert gradients are summed over
 * the ranks in another order than one rank's references and the main
 * thread's sum, so the last bits may differ; 1e-5 is some 100 units in the
 * last place of FP32, far below what a row sent to the wrong expert or a
 * missing rank's share would make. BF16 cases: twice the suites' BF16
 * product tolerance (the experts' gradients are rounded to BF16 once here,
 * once per rank in the references before the test sums them).
 *
 * Graph-safe mode with slots too small for the skewed routing drops rows:
 * the reference is then the one-device layer with a capacity factor equal
 * to the expert capacity factor (the same rows kept: each expert's first
 * ones, in token order), and the layer's count of dropped rows equals what
 * the test works out from the reference's tokens per expert.
 *
 * FP8 dispatch (dispatch-fp8-recipe, blockwise and MXFP8): the router and
 * the shared expert see the tokens, the experts their rows quantized and
 * dequantized, and the backward crosses unquantized; two references are
 * exact:
 * - tokens the FP8 dispatch carries exactly (fp8_exact_tokens(): every
 *   block its own power-of-two scale, its values E4M3 times it): the plain
 *   one-device layer, as above, every result to the same tolerance. Any
 *   scale that crossed to the wrong row or block, or not at all, changes
 *   the experts' input by powers of two;
 * - random tokens and a router blind to them (a gate of zeros, so every
 *   logit is 0 and the choice is an expert bias of each rank's own): the
 *   router's scores, choices and aux loss do not depend on the tokens, so
 *   the one-device layer run on the tokens quantized and dequantized by the
 *   test's float64 model of the recipe (model_fp8_dispatch()) computes what
 *   the FP8 dispatch must: the same output, input gradient (the gradient
 *   flows through the quantization as through the identity: the gate's
 *   dgrad is 0) and experts' gradients (the experts saved the quantized
 *   rows), to the same tolerance; this checks the quantization itself
 *   against the model, not a bound. Only the router's weight gradient,
 *   xᵀ dlogits, is of the tokens on one side and of their quantized copy
 *   on the other, and is not compared. No shared expert there (it sees
 *   the tokens).
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <locale.h>
#include <math.h>
#include <string.h>

#include "gmlp-test-group.h"
#include "gmlp-test-router-ref.h"
#include "gmlp-test-util.h"

#define HIDDEN    64   /* FP32 rows of 256 bytes: the exact mode sends and receives in place; BF16 ones are packed */
#define FFN       12
#define TOL       1e-5
#define DEFAULT_CHUNKS 4   /* expert-parallel-chunks' default */

/* One case: the layer's options, the tokens of each rank. */
typedef struct {
  const char             *name;
  guint                   experts_per_rank;
  guint                   top_k;
  gint64                  tokens[GMLP_TEST_MAX_WORLD];     /* 0 for all: 10 + 3 r; -1: none */
  GmlpExpertParallelMode  mode;
  guint                   padding;
  double                  capacity_factor;
  double                  expert_capacity_factor;
  gboolean                skewed;                 /* expert 1 in almost every token's top-k */
  gboolean                bias;
  gint64                  shared;
  double                  aux;
  GmlpDType               dtype;                  /* 0: FLOAT32 */
  gint64                  hidden;                 /* 0: HIDDEN */
  /* FP8 dispatch (see "FP8 dispatch" above): the recipe; tokens exact in
   * FP8 (the reference the plain layer), or random tokens with a router
   * that does not look at them (the reference the plain layer on the
   * tokens quantized and dequantized by the test's model). */
  GmlpScalingRecipe       dispatch_fp8;
  GmlpFp8Format           dispatch_format;        /* 0: E4M3 */
  gboolean                fp8_exact_tokens;
  gboolean                blind_router;
  guint                   chunks;                 /* expert-parallel-chunks; 0: the default */
  /* FUSE_WGRAD_ACCUMULATION (main_grads read as the gradients),
   * DELAY_WGRAD_COMPUTE (backward_dw after the backward): the chunk
   * cases only. */
  GmlpLinearFlags         wgrad_flags;
  /* The experts' own FP8 recipe (fp8-recipe): they train in one chunk,
   * whatever the chunks. */
  GmlpScalingRecipe       experts_fp8;
  gboolean                offload;                /* the forward under an offload context */
} Case;

static gint64
hidden_of (const Case *c)
{
  return c->hidden > 0 ? c->hidden : HIDDEN;
}

/* What one rank computed, and its reference. */
typedef struct {
  double  *y, *dx, *router_grad, *aux;
  double  *expert_grads[4];      /* FC1 dW, FC2 dW, FC1 db, FC2 db: local experts */
  double  *params[4];            /* the same, of the local experts' parameters */
  gsize    n_grads[4];
  double  *shared_grads[2];
  gsize    n_shared[2];
  gint64   dropped;              /* -1: none counted */
  gint64  *tokens_per_expert;    /* the reference's, E */
} Result;

typedef struct {
  const Case  *c;
  guint        n_experts;
  guint64      seed;
  gint64       tokens[GMLP_TEST_MAX_WORLD];
  GBytes      *x[GMLP_TEST_MAX_WORLD];
  GBytes      *ref_x[GMLP_TEST_MAX_WORLD];   /* the reference's tokens, if not x */
  GBytes      *dy[GMLP_TEST_MAX_WORLD];
  Result       got[GMLP_TEST_MAX_WORLD];
  Result       want[GMLP_TEST_MAX_WORLD];
} Run;

static GmlpMoELayer *
layer_new (const Case        *c,
           guint              n_experts,
           GmlpDevice        *device,
           GmlpCommunicator  *comm,
           double             capacity_factor,
           GError           **error)
{
  return g_initable_new (GMLP_TYPE_MOE_LAYER, NULL, error,
                         "device", device,
                         "communicator", comm,
                         "expert-parallel-mode", c->mode,
                         "expert-capacity-factor", comm != NULL ? c->expert_capacity_factor : 0.0,
                         "dispatch-fp8-recipe", comm != NULL ? c->dispatch_fp8 : GMLP_SCALING_RECIPE_NONE,
                         "dispatch-fp8-format", c->dispatch_format,
                         "expert-parallel-chunks", c->chunks > 0 ? c->chunks : DEFAULT_CHUNKS,
                         "fp8-recipe", c->experts_fp8,
                         "hidden", hidden_of (c),
                         "ffn-hidden", (gint64) FFN,
                         "dtype", c->dtype,
                         "n-experts", n_experts,
                         "top-k", c->top_k,
                         "flags", GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | (c->bias ? GMLP_LINEAR_BIAS : 0) | c->wgrad_flags,
                         "padding", c->padding,
                         "capacity-factor", capacity_factor,
                         "shared-expert-ffn-hidden", c->shared,
                         "expert-bias", c->skewed || c->blind_router,
                         "aux-loss-coeff", c->aux,
                         NULL);
}

static double *
download (GmlpGroupedTensor *t,
          gsize             *n)
{
  g_assert_nonnull (t);
  return gmlp_test_download (t, n);
}

/* The layer's parameters and gradients that the test compares. */
static void
read_layer (GmlpMoELayer *layer,
            Result       *res)
{
  GmlpGroupedMLP *experts = gmlp_moe_layer_get_experts (layer);
  GmlpGroupedMLP *shared = gmlp_moe_layer_get_shared_expert (layer);
  GmlpGroupedLinear *fc[2] = { gmlp_grouped_mlp_get_fc1 (experts), gmlp_grouped_mlp_get_fc2 (experts) };
  GmlpRouter *router = gmlp_moe_layer_get_router (layer);
  gboolean fused = (gmlp_grouped_linear_get_flags (fc[0]) & GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION) != 0;
  gsize n;
  guint i;

  /* Fused accumulation: the main_grads, zero before this one backward. */
  res->router_grad = download (fused ? gmlp_router_get_main_grad (router) : gmlp_router_get_wgrad (router), &n);
  for (i = 0; i < 2; i++)
    {
      res->expert_grads[i] = download (fused ? gmlp_grouped_linear_get_main_grad (fc[i])
                                             : gmlp_grouped_linear_get_wgrad (fc[i]), &res->n_grads[i]);
      res->params[i] = download (gmlp_grouped_linear_get_weight (fc[i]), &n);
      g_assert_cmpuint (n, ==, res->n_grads[i]);
      if (gmlp_grouped_linear_get_flags (fc[i]) & GMLP_LINEAR_BIAS)
        {
          res->expert_grads[2 + i] = download (gmlp_grouped_linear_get_bgrad (fc[i]),
                                               &res->n_grads[2 + i]);
          res->params[2 + i] = download (gmlp_grouped_linear_get_bias (fc[i]), &n);
        }
    }
  if (shared != NULL)
    {
      for (i = 0; i < 2; i++)
        {
          GmlpGroupedLinear *l = i == 0 ? gmlp_grouped_mlp_get_fc1 (shared) : gmlp_grouped_mlp_get_fc2 (shared);

          res->shared_grads[i] = download (fused ? gmlp_grouped_linear_get_main_grad (l)
                                                 : gmlp_grouped_linear_get_wgrad (l), &res->n_shared[i]);
        }
    }
}

static void
result_clear (Result *res)
{
  guint i;

  g_free (res->y);
  g_free (res->dx);
  g_free (res->router_grad);
  g_free (res->aux);
  for (i = 0; i < 4; i++)
    {
      g_free (res->expert_grads[i]);
      g_free (res->params[i]);
    }
  g_free (res->shared_grads[0]);
  g_free (res->shared_grads[1]);
  g_free (res->tokens_per_expert);
}

static void
count_ready (gpointer  instance,
             GmlpEvent *event,
             guint     *count)
{
  (*count)++;
}

/* A forward and a backward of @layer on rank @rank's data (the tokens
 * @tokens); with delayed weight gradients, its backward_dw. The experts'
 * wgrad-ready comes once, after the weight gradients, whatever the chunks. */
static void
step (Run          *run,
      int           rank,
      GmlpDevice   *device,
      GmlpMoELayer *layer,
      GBytes       *tokens,
      Result       *res)
{
  gint64 hidden = hidden_of (run->c);
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, y = NULL, dx = NULL, aux = NULL;
  g_autoptr(GmlpGroupedTensor) dropped = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GmlpOffloadContext) oc = NULL;
  g_autofree double *inference = NULL;
  GmlpGroupedMLP *experts = gmlp_moe_layer_get_experts (layer);
  gboolean delayed = (run->c->wgrad_flags & GMLP_LINEAR_DELAY_WGRAD_COMPUTE) != 0;
  guint ready = 0;
  gulong handler;
  gsize n;

  x = gmlp_grouped_tensor_new_from_bytes (device, run->c->dtype, &run->tokens[rank], 1, hidden,
                                          tokens, &error);
  g_assert_no_error (error);
  dy = gmlp_grouped_tensor_new_from_bytes (device, run->c->dtype, &run->tokens[rank], 1, hidden,
                                           run->dy[rank], &error);
  g_assert_no_error (error);
  /* A forward without saved activations (inference) first: the same. */
  y = gmlp_moe_layer_forward_inference (layer, x, &error);
  g_assert_no_error (error);
  inference = download (y, &n);
  g_clear_object (&y);
  handler = g_signal_connect (experts, "wgrad-ready", G_CALLBACK (count_ready), &ready);
  if (run->c->offload)
    {
      oc = gmlp_offload_context_new (device, &error);
      g_assert_no_error (error);
      gmlp_offload_context_push_thread_default (oc, TRUE);
    }
  y = gmlp_moe_layer_forward (layer, x, &saved, &error);
  g_assert_no_error (error);
  if (oc != NULL)
    {
      g_assert_true (gmlp_offload_context_pop_thread_default (oc, &error));
      g_assert_no_error (error);
      g_assert_true (gmlp_saved_activations_get_offload (saved));
      gmlp_offload_context_flush (oc);
    }
  dx = gmlp_moe_layer_backward (layer, saved, dy, &error);
  g_assert_no_error (error);
  if (delayed)
    {
      GmlpGroupedLinear *fc1 = gmlp_grouped_mlp_get_fc1 (experts);

      g_assert_cmpuint (ready, ==, 0);
      g_assert_cmpuint (gmlp_grouped_linear_get_pending_wgrads (fc1), ==, 1);
      g_assert_cmpuint (gmlp_grouped_linear_get_pending_wgrads (gmlp_grouped_mlp_get_fc2 (experts)), ==, 1);
      g_assert_true (gmlp_moe_layer_backward_dw (layer, &error));
      g_assert_no_error (error);
      g_assert_cmpuint (gmlp_grouped_linear_get_pending_wgrads (fc1), ==, 0);
    }
  g_assert_cmpuint (ready, ==, 1);
  g_signal_handler_disconnect (experts, handler);
  res->y = download (y, &n);
  /* Pipelined by chunks of experts (expert-parallel-chunks), each expert's
   * products the same: the same bits on the CPU; a GPU's route may pick
   * other kernels for the chunks' shapes. */
  if (gmlp_device_get_kind (device) == GMLP_DEVICE_KIND_CPU)
    g_assert_cmpmem (inference, n * sizeof (double), res->y, n * sizeof (double));
  else
    gmlp_test_assert_close (inference, res->y, n,
                            run->c->dtype == GMLP_DTYPE_FLOAT32 ? TOL : 2 * gmlp_test_tolerance (run->c->dtype),
                            "the inference forward");
  res->dx = download (dx, &n);
  aux = gmlp_moe_layer_get_aux_loss (layer);
  res->aux = download (aux, &n);
  read_layer (layer, res);
  dropped = gmlp_moe_layer_get_dropped_rows (layer);
  if (dropped != NULL)
    {
      g_autofree gint64 *v = gmlp_test_download_i64 (dropped, &n);

      g_assert_cmpuint (n, ==, 1);
      res->dropped = v[0];
    }
  else
    res->dropped = -1;
  if (gmlp_moe_layer_get_communicator (layer) == NULL)
    {
      g_autoptr(GmlpGroupedTensor) counts = gmlp_moe_layer_get_tokens_per_expert (layer);

      res->tokens_per_expert = gmlp_test_download_i64 (counts, &n);
    }
}

/* The router's expert bias that makes expert 1 every token's first choice. */
static void
skew (GmlpMoELayer *layer,
      guint         n_experts)
{
  g_autofree double *bias = g_new0 (double, n_experts);
  g_autoptr(GBytes) bytes = NULL;
  g_autoptr(GError) error = NULL;

  bias[1] = 100.0;
  bytes = gmlp_test_encode_values (bias, n_experts, GMLP_DTYPE_FLOAT32);
  g_assert_true (gmlp_router_set_expert_bias_from_bytes (gmlp_moe_layer_get_router (layer), bytes,
                                                         &error));
  g_assert_no_error (error);
}

/* A router that does not look at the tokens: a gate of zeros (every logit
 * 0) and an expert bias, its own on each rank, that picks rank r's top-k
 * experts: (e + 2 r) mod E largest. */
static void
blind (GmlpMoELayer *layer,
       guint         n_experts,
       int           rank)
{
  GmlpRouter *router = gmlp_moe_layer_get_router (layer);
  g_autofree double *bias = g_new0 (double, n_experts);
  g_autoptr(GBytes) bytes = NULL;
  g_autoptr(GError) error = NULL;
  guint e;

  for (e = 0; e < n_experts; e++)
    bias[e] = (double) ((e + 2 * (guint) rank) % n_experts);
  bytes = gmlp_test_encode_values (bias, n_experts, GMLP_DTYPE_FLOAT32);
  g_assert_true (gmlp_router_set_expert_bias_from_bytes (router, bytes, &error));
  g_assert_no_error (error);
  g_assert_true (gmlp_grouped_tensor_fill_zero (gmlp_router_get_weight (router), &error));
  g_assert_no_error (error);
}

static void
equal_rank (GmlpTestGroup    *group,
            int               rank,
            GmlpCommunicator *comm,
            gpointer          data)
{
  Run *run = data;
  const Case *c = run->c;
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpMoELayer) ep = NULL, ref = NULL;
  /* Graph-safe slots drop as the one-device capacity does. */
  double ref_capacity = c->capacity_factor > 0 ? c->capacity_factor
                        : c->mode == GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE ? c->expert_capacity_factor
                        : 0.0;

  ep = layer_new (c, run->n_experts, group->devices[rank], comm, c->capacity_factor, &error);
  g_assert_no_error (error);
  ref = layer_new (c, run->n_experts, group->devices[rank], NULL, ref_capacity, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (gmlp_moe_layer_get_n_local_experts (ep), ==, c->experts_per_rank);
  g_assert_cmpuint (gmlp_moe_layer_get_first_local_expert (ep), ==, rank * c->experts_per_rank);
  g_assert_true (gmlp_moe_layer_get_communicator (ep) == comm);
  g_assert_null (gmlp_moe_layer_get_dropped_rows (ep));
  g_assert_true (gmlp_moe_layer_init_parameters (ep, run->seed, &error));
  g_assert_no_error (error);
  g_assert_true (gmlp_moe_layer_init_parameters (ref, run->seed, &error));
  g_assert_no_error (error);
  if (c->skewed)
    {
      skew (ep, run->n_experts);
      skew (ref, run->n_experts);
    }
  if (c->blind_router)
    {
      blind (ep, run->n_experts, rank);
      blind (ref, run->n_experts, rank);
    }

  step (run, rank, group->devices[rank], ep, run->x[rank], &run->got[rank]);
  step (run, rank, group->devices[rank], ref, run->ref_x[rank] != NULL ? run->ref_x[rank] : run->x[rank],
        &run->want[rank]);
}

/* Tokens that an FP8 dispatch carries exactly, in both recipes: each
 * 1 × 32 block of a row is v × 2^(k − 8), k in {−2, …, 1} drawn per block,
 * v E4M3 values of magnitude 2^-2 to 448 with one ±448 (the block's amax).
 * MXFP8 gives the block the scale 2^(k − 8) and stores v; blockwise gives
 * each 1 × 128 block fp8_max / amax = 2^(8 − kmax), a power of two, and
 * stores v × 2^(k − kmax), whose exponent stays ≥ −5 (normal in E4M3):
 * exact, and the scale inverse exact, so dequantization gives back x. Four
 * significant bits: exact in BF16 and FP32 too. The scales differ from
 * block to block, row to row: a scale that crossed to the wrong row or
 * block would show. */
static GBytes *
fp8_exact_tokens (GmlpDType dtype,
                  gint64    rows,
                  gint64    cols)
{
  g_autofree double *x = g_new (double, MAX (rows * cols, 1));
  gint64 r, c0, c;

  for (r = 0; r < rows; r++)
    for (c0 = 0; c0 < cols; c0 += 32)
      {
        gint64 len = MIN (32, cols - c0), top = g_test_rand_int_range (0, (gint32) len);
        int k = g_test_rand_int_range (-2, 2);

        for (c = 0; c < len; c++)
          {
            int e = g_test_rand_int_range (-2, 9), m = g_test_rand_int_range (0, 8);
            double v = c == top ? 448.0 : MIN (ldexp (1.0 + m / 8.0, e), 448.0);

            x[r * cols + c0 + c] = ldexp (g_test_rand_bit () ? -v : v, k - 8);
          }
      }
  return gmlp_test_encode_values (x, rows * cols, dtype);
}

/* The test's model of what an FP8 dispatch makes of a row, in float64
 * from docs/fp8.md (fp8_max 448 and emax 8 for E4M3, 57344 and 15 for
 * E5M2): blockwise, per 1 × 128 block, s = fl32 (fp8_max / amax) (1 for a
 * block of zeros), kept in [2^-126, FLT_MAX], scale_inv = fl32 (1 / s), q =
 * fp8 (fl32 (x s)); MXFP8, per 1 × 32 block, X = 2^(floor (log2 amax) −
 * emax) (2^0 for zeros), q = fp8 (fl32 (x / X)); fp8 () rounds to nearest
 * even and saturates; both read back as fl32 (q × scale_inv) rounded to
 * the layer's dtype. */
static GBytes *
model_fp8_dispatch (GBytes            *tokens,
                    GmlpDType          dtype,
                    gint64             rows,
                    gint64             cols,
                    GmlpScalingRecipe  recipe,
                    GmlpFp8Format      format)
{
  gconstpointer data = g_bytes_get_data (tokens, NULL);
  gint64 block = recipe == GMLP_SCALING_RECIPE_MXFP8 ? 32 : 128, r, c0, c;
  GmlpDType fp8 = format == GMLP_FP8_FORMAT_E5M2 ? GMLP_DTYPE_FLOAT8_E5M2 : GMLP_DTYPE_FLOAT8_E4M3;
  double fp8_max = fp8 == GMLP_DTYPE_FLOAT8_E5M2 ? 57344.0 : 448.0;
  int emax = fp8 == GMLP_DTYPE_FLOAT8_E5M2 ? 15 : 8;
  g_autofree double *x = g_new (double, MAX (rows * cols, 1));

  for (c = 0; c < rows * cols; c++)
    x[c] = gmlp_test_decode (data, dtype, (gsize) c);
  for (r = 0; r < rows; r++)
    for (c0 = 0; c0 < cols; c0 += block)
      {
        double *v = x + r * cols + c0, amax = 0.0, s, inv;
        gint64 len = MIN (block, cols - c0);

        for (c = 0; c < len; c++)
          amax = MAX (amax, fabs (v[c]));
        if (recipe == GMLP_SCALING_RECIPE_MXFP8)
          {
            int e = 0;

            if (amax > 0.0)
              {
                frexp (amax, &e);            /* amax = m 2^e, m in [0.5, 1) */
                e = CLAMP (e - 1 - emax, -127, 127);
              }
            s = ldexp (1.0, -e);
            inv = ldexp (1.0, e);
          }
        else
          {
            s = amax > 0.0 ? gmlp_test_round (fp8_max / amax, GMLP_DTYPE_FLOAT32) : 1.0;
            s = CLAMP (s, ldexp (1.0, -126), (double) G_MAXFLOAT);
            inv = gmlp_test_round (1.0 / s, GMLP_DTYPE_FLOAT32);
          }
        for (c = 0; c < len; c++)
          {
            double q = gmlp_test_round (gmlp_test_round (v[c] * s, GMLP_DTYPE_FLOAT32), fp8);

            q = CLAMP (q, -fp8_max, fp8_max);

            v[c] = gmlp_test_round (gmlp_test_round (q * inv, GMLP_DTYPE_FLOAT32), dtype);
          }
      }
  return gmlp_test_encode_values (x, rows * cols, dtype);
}

/* The rows a slot of graph-safe mode holds, as the layer works it out. */
static gint64
slot_rows (const Case *c,
           guint       n_experts,
           gint64      tokens)
{
  gint64 n_choices = tokens * c->top_k, padding = MAX (c->padding, 1);
  gint64 cap = gmlp_test_router_ref_capacity (n_choices, n_experts, c->padding, c->expert_capacity_factor);

  /* Without a capacity, every choice (padded). */
  return cap >= 0 ? cap : (n_choices + padding - 1) / padding * padding;
}

static void
check_equal (const Case *c,
             int         world)
{
  GmlpTestGroup group;
  Run run = { .c = c, .n_experts = c->experts_per_rank * world };
  double tol = c->dtype == GMLP_DTYPE_FLOAT32 ? TOL : 2 * gmlp_test_tolerance (c->dtype);
  gint64 hidden = hidden_of (c);
  guint L = c->experts_per_rank, i;
  int r, a;

  if (!gmlp_test_group_init (&group, world, 60000))
    return;
  run.seed = g_test_rand_int ();
  for (r = 0; r < world; r++)
    {
      run.tokens[r] = c->tokens[r] > 0 ? c->tokens[r] : c->tokens[r] < 0 ? 0 : 10 + 3 * r;
      if (c->mode == GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE)
        run.tokens[r] = run.tokens[0];   /* graph-safe: the same tokens on every rank */
      if (c->fp8_exact_tokens)
        run.x[r] = fp8_exact_tokens (c->dtype, run.tokens[r], hidden);
      else
        run.x[r] = gmlp_test_random_bytes (c->dtype, run.tokens[r] * hidden, 1.0, FALSE);
      if (c->dispatch_fp8 != GMLP_SCALING_RECIPE_NONE && !c->fp8_exact_tokens)
        {
          g_assert_true (c->blind_router && c->shared == 0);
          run.ref_x[r] = model_fp8_dispatch (run.x[r], c->dtype, run.tokens[r], hidden,
                                             c->dispatch_fp8, c->dispatch_format);
        }
      run.dy[r] = gmlp_test_random_bytes (c->dtype, run.tokens[r] * hidden, 1.0, FALSE);
    }

  gmlp_test_group_run (&group, equal_rank, &run);

  for (r = 0; r < world; r++)
    {
      g_autofree char *what = g_strdup_printf ("%s, %d ranks, rank %d", c->name, world, r);
      Result *got = &run.got[r], *want = &run.want[r];
      gint64 n = run.tokens[r] * hidden;

      gmlp_test_assert_close (got->y, want->y, n, tol, what);
      gmlp_test_assert_close (got->dx, want->dx, n, tol, what);
      gmlp_test_assert_close (got->aux, want->aux, 1, tol, what);
      /* The router's weight gradient is xᵀ dlogits: of the tokens on the
       * layer, of their quantized copy in the reference. */
      if (run.ref_x[r] == NULL)
        gmlp_test_assert_close (got->router_grad, want->router_grad, run.n_experts * hidden, tol, what);
      if (c->shared > 0)
        {
          for (i = 0; i < 2; i++)
            {
              g_assert_cmpuint (got->n_shared[i], ==, want->n_shared[i]);
              gmlp_test_assert_close (got->shared_grads[i], want->shared_grads[i], want->n_shared[i],
                                      tol, what);
            }
        }

      /* The local experts: the reference's slice of the parameters, and
       * the sum over the ranks of the reference's gradients. */
      for (i = 0; i < 4; i++)
        {
          gsize per, q;
          g_autofree double *sum = NULL;

          if (want->expert_grads[i] == NULL)
            {
              g_assert_null (got->expert_grads[i]);
              continue;
            }
          per = want->n_grads[i] / run.n_experts;
          g_assert_cmpuint (got->n_grads[i], ==, per * L);
          g_assert_cmpmem (got->params[i], per * L * sizeof (double),
                           want->params[i] + per * L * r, per * L * sizeof (double));
          sum = g_new0 (double, per * L);
          for (a = 0; a < world; a++)
            for (q = 0; q < per * L; q++)
              sum[q] += run.want[a].expert_grads[i][per * L * r + q];
          gmlp_test_assert_close (got->expert_grads[i], sum, per * L, tol, what);
        }

      /* Graph-safe: the rows past the slots, from the reference's counts. */
      if (c->mode == GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE)
        {
          gint64 slot = slot_rows (c, run.n_experts, run.tokens[r]), dropped = 0;
          guint64 padding = MAX (c->padding, 1);
          guint e;

          for (e = 0; e < run.n_experts && c->capacity_factor == 0; e++)
            {
              gint64 rows = (want->tokens_per_expert[e] + padding - 1) / padding * padding;

              dropped += MAX (rows - slot, 0);
            }
          g_assert_cmpint (got->dropped, ==, dropped);
          if (world > 1 && c->expert_capacity_factor > 0 && c->skewed && c->capacity_factor == 0)
            g_assert_cmpint (dropped, >, 0);   /* the case drops, as meant */
        }
      else
        g_assert_cmpint (got->dropped, ==, -1);
    }

  for (r = 0; r < world; r++)
    {
      g_bytes_unref (run.x[r]);
      g_clear_pointer (&run.ref_x[r], g_bytes_unref);
      g_bytes_unref (run.dy[r]);
      result_clear (&run.got[r]);
      result_clear (&run.want[r]);
    }
  gmlp_test_group_clear (&group);
}

static void
test_equal (gconstpointer data)
{
  const Case *c = data;
  int world;

  /* A group of one too (on one GPU the only group NCCL makes), where the
   * case's experts are enough for its top-k. */
  for (world = 1; world <= GMLP_TEST_MAX_WORLD; world++)
    if (c->top_k <= c->experts_per_rank * world)
      check_equal (c, world);
}

static const Case cases[] = {
  { .name = "random", .experts_per_rank = 2, .top_k = 2 },
  /* The rows cross as they are; the experts' gradients are rounded to
   * BF16 once here, once per rank in the references. */
  { .name = "random-bf16", .experts_per_rank = 2, .top_k = 2, .dtype = GMLP_DTYPE_BFLOAT16 },
  { .name = "random-bf16-graph-safe", .experts_per_rank = 2, .top_k = 2,
    .dtype = GMLP_DTYPE_BFLOAT16, .mode = GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE },
  { .name = "random-graph-safe", .experts_per_rank = 2, .top_k = 2,
    .mode = GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE },
  { .name = "one-expert-per-rank", .experts_per_rank = 1, .top_k = 1 },
  { .name = "bias-shared-aux", .experts_per_rank = 2, .top_k = 3, .bias = TRUE, .shared = 6,
    .aux = 0.01 },
  { .name = "bias-shared-aux-graph-safe", .experts_per_rank = 2, .top_k = 3, .bias = TRUE,
    .shared = 6, .aux = 0.01, .mode = GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE },
  { .name = "skewed", .experts_per_rank = 2, .top_k = 2, .skewed = TRUE },
  { .name = "skewed-graph-safe", .experts_per_rank = 2, .top_k = 2, .skewed = TRUE,
    .mode = GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE },
  /* More experts than choices: most are empty, on every rank. */
  { .name = "empty-experts", .experts_per_rank = 4, .top_k = 1, .tokens = { 3, 1, 2, 2 } },
  /* A rank without tokens: it sends nothing, its experts still compute. */
  { .name = "rank-without-tokens", .experts_per_rank = 2, .top_k = 2, .tokens = { 5, -1, 7, 4 } },
  { .name = "empty-experts-graph-safe", .experts_per_rank = 4, .top_k = 1, .tokens = { 3, 3, 3, 3 },
    .mode = GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE, .expert_capacity_factor = 2.0 },
  { .name = "padding", .experts_per_rank = 2, .top_k = 2, .padding = 4 },
  { .name = "padding-graph-safe", .experts_per_rank = 2, .top_k = 2, .padding = 4,
    .mode = GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE },
  { .name = "capacity-drops", .experts_per_rank = 2, .top_k = 2, .skewed = TRUE,
    .capacity_factor = 0.5 },
  { .name = "capacity-drops-padding", .experts_per_rank = 2, .top_k = 2, .skewed = TRUE,
    .capacity_factor = 0.75, .padding = 2 },
  { .name = "capacity-drops-graph-safe", .experts_per_rank = 2, .top_k = 2, .skewed = TRUE,
    .capacity_factor = 0.5, .mode = GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE },
  /* Slots too small for the skewed expert: rows dropped and counted. */
  { .name = "slot-drops", .experts_per_rank = 2, .top_k = 2, .skewed = TRUE,
    .mode = GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE, .expert_capacity_factor = 0.5 },
  { .name = "slot-drops-padding", .experts_per_rank = 2, .top_k = 2, .skewed = TRUE, .padding = 2,
    .mode = GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE, .expert_capacity_factor = 1.0 },
  /* FP8 dispatch, tokens it carries exactly: the plain layer's results.
   * 200 columns: blocks that run past the row (128 + 72, 6 × 32 + 8). */
  { .name = "fp8-blockwise-exact-tokens", .experts_per_rank = 2, .top_k = 2, .hidden = 256,
    .dispatch_fp8 = GMLP_SCALING_RECIPE_BLOCKWISE, .fp8_exact_tokens = TRUE },
  { .name = "fp8-blockwise-exact-tokens-bf16-graph-safe", .experts_per_rank = 2, .top_k = 2,
    .hidden = 200, .dtype = GMLP_DTYPE_BFLOAT16, .mode = GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE,
    .dispatch_fp8 = GMLP_SCALING_RECIPE_BLOCKWISE, .fp8_exact_tokens = TRUE },
  { .name = "fp8-mxfp8-exact-tokens-bias-shared-aux", .experts_per_rank = 2, .top_k = 3,
    .hidden = 200, .bias = TRUE, .shared = 6, .aux = 0.01,
    .dispatch_fp8 = GMLP_SCALING_RECIPE_MXFP8, .fp8_exact_tokens = TRUE },
  { .name = "fp8-mxfp8-exact-tokens-bf16-graph-safe", .experts_per_rank = 2, .top_k = 2,
    .hidden = 256, .dtype = GMLP_DTYPE_BFLOAT16, .mode = GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE,
    .dispatch_fp8 = GMLP_SCALING_RECIPE_MXFP8, .fp8_exact_tokens = TRUE },
  /* The rows a slot drops, their scales drop alike. */
  { .name = "fp8-blockwise-slot-drops", .experts_per_rank = 2, .top_k = 2, .skewed = TRUE,
    .hidden = 256, .mode = GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE, .expert_capacity_factor = 0.5,
    .dispatch_fp8 = GMLP_SCALING_RECIPE_BLOCKWISE, .fp8_exact_tokens = TRUE },
  /* FP8 dispatch, random tokens, a router blind to them: the plain layer
   * on the tokens as the test's model quantizes them. */
  { .name = "fp8-blockwise-random", .experts_per_rank = 2, .top_k = 2, .hidden = 200,
    .dispatch_fp8 = GMLP_SCALING_RECIPE_BLOCKWISE, .blind_router = TRUE },
  { .name = "fp8-blockwise-random-bf16-graph-safe", .experts_per_rank = 2, .top_k = 2,
    .hidden = 256, .dtype = GMLP_DTYPE_BFLOAT16, .mode = GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE,
    .dispatch_fp8 = GMLP_SCALING_RECIPE_BLOCKWISE, .blind_router = TRUE },
  { .name = "fp8-mxfp8-random-bf16", .experts_per_rank = 2, .top_k = 2, .hidden = 256,
    .dtype = GMLP_DTYPE_BFLOAT16, .dispatch_fp8 = GMLP_SCALING_RECIPE_MXFP8, .blind_router = TRUE },
  { .name = "fp8-mxfp8-random-graph-safe", .experts_per_rank = 2, .top_k = 2, .hidden = 200,
    .mode = GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE, .bias = TRUE,
    .dispatch_fp8 = GMLP_SCALING_RECIPE_MXFP8, .blind_router = TRUE },
  { .name = "fp8-e5m2-blockwise-random", .experts_per_rank = 2, .top_k = 2, .hidden = 200,
    .dispatch_fp8 = GMLP_SCALING_RECIPE_BLOCKWISE, .dispatch_format = GMLP_FP8_FORMAT_E5M2,
    .blind_router = TRUE },
  { .name = "fp8-e5m2-mxfp8-random-bf16-graph-safe", .experts_per_rank = 2, .top_k = 2,
    .hidden = 256, .dtype = GMLP_DTYPE_BFLOAT16, .mode = GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE,
    .dispatch_fp8 = GMLP_SCALING_RECIPE_MXFP8, .dispatch_format = GMLP_FP8_FORMAT_E5M2,
    .blind_router = TRUE },
};

/* expert-parallel-chunks: the same layer (seed, tokens) made with 1, 2, 3
 * and more chunks than it has local experts gives the same bits: the
 * pipelined inference forward (step() checks it against the forward that
 * saves), the forward and backward that save, every gradient, the drops. */
static const guint chunk_counts[] = { 1, 2, 3, 1000 };

typedef struct {
  Run     run;
  Result  res[G_N_ELEMENTS (chunk_counts)][GMLP_TEST_MAX_WORLD];
} ChunkRun;

static void
chunks_rank (GmlpTestGroup    *group,
             int               rank,
             GmlpCommunicator *comm,
             gpointer          data)
{
  ChunkRun *cr = data;
  guint k;

  for (k = 0; k < G_N_ELEMENTS (chunk_counts); k++)
    {
      Case c = *cr->run.c;
      g_autoptr(GError) error = NULL;
      g_autoptr(GmlpMoELayer) layer = NULL;

      c.chunks = chunk_counts[k];
      layer = layer_new (&c, cr->run.n_experts, group->devices[rank], comm, c.capacity_factor, &error);
      g_assert_no_error (error);
      g_assert_cmpuint (gmlp_moe_layer_get_expert_parallel_chunks (layer), ==, chunk_counts[k]);
      g_assert_true (gmlp_moe_layer_init_parameters (layer, cr->run.seed, &error));
      g_assert_no_error (error);
      if (c.skewed)
        skew (layer, cr->run.n_experts);
      step (&cr->run, rank, group->devices[rank], layer, cr->run.x[rank], &cr->res[k][rank]);
    }
}

/* The same bits on the CPU; on a GPU the chunks' products (forward and
 * backward) may take other kernels for their shapes: close. */
static void
assert_same (const double *a,
             const double *b,
             gsize         n,
             const Case   *c)
{
  if (a == NULL || b == NULL)
    g_assert_true (a == b);
  else if (!gmlp_test_on_cuda ())
    g_assert_cmpmem (a, n * sizeof (double), b, n * sizeof (double));
  else
    gmlp_test_assert_close (a, b, n, c->dtype == GMLP_DTYPE_FLOAT32 ? TOL : 2 * gmlp_test_tolerance (c->dtype),
                            "chunked against one chunk");
}

static void
check_chunks (const Case *c,
              int         world)
{
  GmlpTestGroup group;
  ChunkRun cr = { .run = { .c = c, .n_experts = c->experts_per_rank * world } };
  gint64 hidden = hidden_of (c);
  guint k, i;
  int r;

  if (!gmlp_test_group_init (&group, world, 60000))
    return;
  cr.run.seed = g_test_rand_int ();
  for (r = 0; r < world; r++)
    {
      gint64 n = c->tokens[r] > 0 ? c->tokens[r] : c->tokens[r] < 0 ? 0 : 10 + 3 * r;

      cr.run.tokens[r] = c->mode == GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE && r > 0 ? cr.run.tokens[0] : n;
      cr.run.x[r] = gmlp_test_random_bytes (c->dtype, cr.run.tokens[r] * hidden, 1.0, FALSE);
      cr.run.dy[r] = gmlp_test_random_bytes (c->dtype, cr.run.tokens[r] * hidden, 1.0, FALSE);
    }

  gmlp_test_group_run (&group, chunks_rank, &cr);

  for (r = 0; r < world; r++)
    {
      gsize n = (gsize) cr.run.tokens[r] * hidden;
      Result *one = &cr.res[0][r];

      for (k = 1; k < G_N_ELEMENTS (chunk_counts); k++)
        {
          Result *got = &cr.res[k][r];

          assert_same (got->y, one->y, n, c);
          assert_same (got->dx, one->dx, n, c);
          assert_same (got->aux, one->aux, 1, c);
          assert_same (got->router_grad, one->router_grad, (gsize) cr.run.n_experts * hidden, c);
          for (i = 0; i < 4; i++)
            {
              g_assert_cmpuint (got->n_grads[i], ==, one->n_grads[i]);
              assert_same (got->expert_grads[i], one->expert_grads[i], one->n_grads[i], c);
            }
          for (i = 0; i < 2; i++)
            {
              g_assert_cmpuint (got->n_shared[i], ==, one->n_shared[i]);
              assert_same (got->shared_grads[i], one->shared_grads[i], one->n_shared[i], c);
            }
          g_assert_cmpint (got->dropped, ==, one->dropped);
        }
      if (c->mode == GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE && c->expert_capacity_factor > 0 &&
          c->skewed && world > 1)
        g_assert_cmpint (one->dropped, >, 0);   /* the case drops, as meant */
    }

  for (r = 0; r < world; r++)
    {
      g_bytes_unref (cr.run.x[r]);
      g_bytes_unref (cr.run.dy[r]);
      for (k = 0; k < G_N_ELEMENTS (chunk_counts); k++)
        result_clear (&cr.res[k][r]);
    }
  gmlp_test_group_clear (&group);
}

static void
test_chunks (gconstpointer data)
{
  const Case *c = data;
  int world;

  for (world = 1; world <= GMLP_TEST_MAX_WORLD; world++)
    if (c->top_k <= c->experts_per_rank * world)
      check_chunks (c, world);
}

static const Case chunk_cases[] = {
  { .name = "random", .experts_per_rank = 5, .top_k = 2 },
  { .name = "random-graph-safe", .experts_per_rank = 5, .top_k = 2,
    .mode = GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE },
  { .name = "skewed-bf16", .experts_per_rank = 3, .top_k = 2, .skewed = TRUE,
    .dtype = GMLP_DTYPE_BFLOAT16 },
  { .name = "empty-experts", .experts_per_rank = 6, .top_k = 1, .tokens = { 3, 1, 2, 2 } },
  { .name = "empty-experts-graph-safe", .experts_per_rank = 6, .top_k = 1, .tokens = { 3, 3, 3, 3 },
    .mode = GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE, .expert_capacity_factor = 2.0 },
  { .name = "rank-without-tokens", .experts_per_rank = 4, .top_k = 2, .tokens = { 5, -1, 7, 4 } },
  { .name = "capacity-drops-padding", .experts_per_rank = 4, .top_k = 2, .skewed = TRUE,
    .capacity_factor = 0.75, .padding = 2 },
  { .name = "slot-drops-shared", .experts_per_rank = 3, .top_k = 2, .skewed = TRUE, .shared = 6,
    .bias = TRUE, .mode = GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE, .expert_capacity_factor = 0.5 },
  { .name = "padding-bf16-graph-safe", .experts_per_rank = 4, .top_k = 3, .padding = 4,
    .dtype = GMLP_DTYPE_BFLOAT16, .mode = GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE },
  { .name = "fp8-blockwise", .experts_per_rank = 3, .top_k = 2, .hidden = 256,
    .dispatch_fp8 = GMLP_SCALING_RECIPE_BLOCKWISE },
  { .name = "fp8-mxfp8-bf16-graph-safe-slot-drops", .experts_per_rank = 3, .top_k = 2,
    .hidden = 200, .skewed = TRUE, .dtype = GMLP_DTYPE_BFLOAT16, .expert_capacity_factor = 0.5,
    .mode = GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE, .dispatch_fp8 = GMLP_SCALING_RECIPE_MXFP8 },
  /* The gradient contract's options (main_grad fusion, delayed weight
   * gradients): the same gradients, wgrad-ready once, pending-wgrads one. */
  { .name = "main-grad-empty-experts", .experts_per_rank = 6, .top_k = 1, .tokens = { 3, 1, 2, 2 },
    .bias = TRUE, .shared = 6, .wgrad_flags = GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION },
  { .name = "delayed-skewed-graph-safe", .experts_per_rank = 4, .top_k = 2, .skewed = TRUE,
    .expert_capacity_factor = 0.75, .mode = GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE,
    .wgrad_flags = GMLP_LINEAR_DELAY_WGRAD_COMPUTE },
  { .name = "delayed-main-grad-fp8-shared", .experts_per_rank = 3, .top_k = 2, .hidden = 256, .shared = 6,
    .dispatch_fp8 = GMLP_SCALING_RECIPE_BLOCKWISE,
    .wgrad_flags = GMLP_LINEAR_DELAY_WGRAD_COMPUTE | GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION },
  { .name = "recompute-bias-graph-safe", .experts_per_rank = 4, .top_k = 2, .bias = TRUE,
    .mode = GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE, .wgrad_flags = GMLP_LINEAR_RECOMPUTE_ACTIVATION },
  { .name = "offload-delayed-shared", .experts_per_rank = 4, .top_k = 2, .shared = 6, .offload = TRUE,
    .wgrad_flags = GMLP_LINEAR_DELAY_WGRAD_COMPUTE },
  { .name = "offload-recompute-graph-safe", .experts_per_rank = 3, .top_k = 2, .offload = TRUE,
    .mode = GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE, .expert_capacity_factor = 1.0,
    .wgrad_flags = GMLP_LINEAR_RECOMPUTE_ACTIVATION | GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION },
  { .name = "experts-fp8-blockwise", .experts_per_rank = 3, .top_k = 2, .hidden = 256,
    .experts_fp8 = GMLP_SCALING_RECIPE_BLOCKWISE, .wgrad_flags = GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION },
  { .name = "delayed-main-grad-graph-safe-drops", .experts_per_rank = 5, .top_k = 2, .skewed = TRUE,
    .bias = TRUE, .shared = 6, .expert_capacity_factor = 0.5, .mode = GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE,
    .wgrad_flags = GMLP_LINEAR_DELAY_WGRAD_COMPUTE | GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION },
};

/* Construction that every rank must refuse alike. */
typedef enum {
  BAD_DIVIDE,        /* n_experts not a multiple of the world size */
  BAD_DEVICE,        /* rank 0's layer on another device than its communicator */
  BAD_HIDDEN,        /* the last rank's hidden differs */
  BAD_EXPERTS,       /* the last rank's n_experts differs */
  BAD_MODE,          /* the last rank's mode differs */
  BAD_FACTOR,        /* a negative expert capacity factor */
  BAD_DISPATCH_RECIPE,  /* an FP8 dispatch of a per-tensor recipe */
  BAD_DISPATCH_DIFFERS, /* the last rank's FP8 dispatch differs */
} Bad;

typedef struct {
  Bad      bad;
  GError  *errors[GMLP_TEST_MAX_WORLD];
} Bads;

static void
bad_rank (GmlpTestGroup    *group,
          int               rank,
          GmlpCommunicator *comm,
          gpointer          data)
{
  Bads *t = data;
  gboolean last = rank == group->world - 1;
  GmlpDevice *device = group->devices[t->bad == BAD_DEVICE && rank == 0 ? 1 : rank];
  guint n_experts = t->bad == BAD_DIVIDE ? 2 * group->world + 1
                    : t->bad == BAD_EXPERTS && last ? 4 * group->world : 2 * group->world;
  g_autoptr(GmlpMoELayer) layer = NULL;

  layer = g_initable_new (GMLP_TYPE_MOE_LAYER, NULL, &t->errors[rank],
                          "device", device, "communicator", comm,
                          "hidden", (gint64) (t->bad == BAD_HIDDEN && last ? HIDDEN + 4 : HIDDEN),
                          "ffn-hidden", (gint64) FFN, "n-experts", n_experts, "top-k", 2,
                          "expert-parallel-mode", t->bad == BAD_MODE && last
                                                  ? GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE
                                                  : GMLP_EXPERT_PARALLEL_MODE_EXACT,
                          "expert-capacity-factor", t->bad == BAD_FACTOR ? -1.0 : 0.0,
                          "dispatch-fp8-recipe", t->bad == BAD_DISPATCH_RECIPE
                                                 ? GMLP_SCALING_RECIPE_DELAYED
                                                 : t->bad == BAD_DISPATCH_DIFFERS && last
                                                 ? GMLP_SCALING_RECIPE_BLOCKWISE
                                                 : GMLP_SCALING_RECIPE_NONE,
                          NULL);
  g_assert_null (layer);
}

static void
check_bad (Bad  bad,
           int  world)
{
  GmlpTestGroup group;
  Bads t = { .bad = bad };
  int r;

  if (!gmlp_test_group_init (&group, world, 60000))
    return;
  gmlp_test_group_run (&group, bad_rank, &t);
  for (r = 0; r < world; r++)
    {
      int want = GMLP_ERROR_INVALID_ARGUMENT;

      if (bad == BAD_HIDDEN || bad == BAD_EXPERTS || bad == BAD_MODE || bad == BAD_DISPATCH_DIFFERS)
        want = GMLP_ERROR_SHAPE_MISMATCH;
      if (bad == BAD_DISPATCH_RECIPE)
        want = GMLP_ERROR_UNSUPPORTED;
      g_assert_error (t.errors[r], GMLP_ERROR, want);
      if (bad == BAD_DEVICE)
        g_assert_nonnull (strstr (t.errors[r]->message, r == 0 ? "communicator is on" : "Rank 0"));
      if (bad == BAD_DIVIDE)
        g_assert_nonnull (strstr (t.errors[r]->message, "divide"));
      if (bad == BAD_HIDDEN)
        g_assert_nonnull (strstr (t.errors[r]->message, "hidden"));
      if (bad == BAD_EXPERTS)
        g_assert_nonnull (strstr (t.errors[r]->message, "n-experts"));
      if (bad == BAD_DISPATCH_RECIPE)
        g_assert_nonnull (strstr (t.errors[r]->message, "delayed"));
      if (bad == BAD_DISPATCH_DIFFERS)
        g_assert_nonnull (strstr (t.errors[r]->message, "dispatch-fp8-recipe"));
      g_clear_error (&t.errors[r]);
    }
  gmlp_test_group_clear (&group);
}

static void
test_bad_construction (void)
{
  Bad bad;

  for (bad = BAD_DIVIDE; bad <= BAD_DISPATCH_DIFFERS; bad++)
    {
      check_bad (bad, 2);
      check_bad (bad, 3);
    }
}

/* Without init the ranks agree at the first forward: ranks of different
 * widths all fail there, with the same error every later call repeats. */
typedef struct {
  GError  *errors[GMLP_TEST_MAX_WORLD];
  GError  *later[GMLP_TEST_MAX_WORLD];
} Late;

static void
late_rank (GmlpTestGroup    *group,
           int               rank,
           GmlpCommunicator *comm,
           gpointer          data)
{
  Late *t = data;
  gint64 hidden = rank == 1 ? HIDDEN + 4 : HIDDEN, tokens = 4;
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpMoELayer) layer = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, y = NULL;

  layer = g_object_new (GMLP_TYPE_MOE_LAYER, "device", group->devices[rank], "communicator", comm,
                        "hidden", hidden, "ffn-hidden", (gint64) FFN, "n-experts", 2 * group->world,
                        "top-k", 2, NULL);
  x = gmlp_grouped_tensor_new (group->devices[rank], GMLP_DTYPE_FLOAT32, &tokens, 1, hidden, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_grouped_tensor_fill_random (x, rank + 1, 1.0, &error));
  y = gmlp_moe_layer_forward (layer, x, NULL, &t->errors[rank]);
  g_assert_null (y);
  g_assert_false (g_initable_init (G_INITABLE (layer), NULL, &t->later[rank]));
}

static void
test_agree_at_forward (void)
{
  GmlpTestGroup group;
  Late t = { { NULL, } };
  int r;

  if (!gmlp_test_group_init (&group, 3, 60000))
    return;
  gmlp_test_group_run (&group, late_rank, &t);
  for (r = 0; r < 3; r++)
    {
      g_assert_error (t.errors[r], GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH);
      g_assert_nonnull (strstr (t.errors[r]->message, "hidden"));
      g_assert_error (t.later[r], GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH);
      g_clear_error (&t.errors[r]);
      g_clear_error (&t.later[r]);
    }
  gmlp_test_group_clear (&group);
}

/* Graph-safe mode sizes its slots from the tokens, which every rank must
 * have alike: the CPU communicator sees that the slots do not pair up, and
 * every rank fails the same forward, the group still usable. */
typedef struct {
  GError  *errors[GMLP_TEST_MAX_WORLD];
} Uneven;

static void
uneven_rank (GmlpTestGroup    *group,
             int               rank,
             GmlpCommunicator *comm,
             gpointer          data)
{
  Uneven *t = data;
  gint64 tokens = 6 + 24 * rank;   /* slots whose bytes differ, past the members' alignment */
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpMoELayer) layer = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, y = NULL, sum = NULL;

  layer = g_initable_new (GMLP_TYPE_MOE_LAYER, NULL, &error, "device", group->devices[rank],
                          "communicator", comm, "hidden", (gint64) HIDDEN, "ffn-hidden", (gint64) FFN,
                          "n-experts", 2 * group->world, "top-k", 2,
                          "expert-parallel-mode", GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE, NULL);
  g_assert_no_error (error);
  x = gmlp_grouped_tensor_new (group->devices[rank], GMLP_DTYPE_FLOAT32, &tokens, 1, HIDDEN, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_grouped_tensor_fill_random (x, rank + 1, 1.0, &error));
  y = gmlp_moe_layer_forward (layer, x, NULL, &t->errors[rank]);
  g_assert_null (y);
  /* Not aborted: the next collective works. */
  tokens = 3;
  sum = gmlp_grouped_tensor_new (group->devices[rank], GMLP_DTYPE_FLOAT32, &tokens, 1, 2, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_communicator_all_reduce (comm, sum, GMLP_REDUCE_OP_SUM, &error));
  g_assert_no_error (error);
}

static void
test_graph_safe_uneven (void)
{
  GmlpTestGroup group;
  Uneven t = { { NULL, } };
  int r;

  if (gmlp_test_on_cuda ())
    {
      g_test_skip ("NCCL cannot see that the ranks' slots differ");
      return;
    }
  if (!gmlp_test_group_init (&group, 2, 60000))
    return;
  gmlp_test_group_run (&group, uneven_rank, &t);
  for (r = 0; r < 2; r++)
    {
      g_assert_error (t.errors[r], GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH);
      g_clear_error (&t.errors[r]);
    }
  gmlp_test_group_clear (&group);
}

/* The one-device layer is what it was: no communicator, every expert. */
static void
test_one_device (void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpDevice) device = gmlp_device_new_from_string ("cpu", &error);
  g_autoptr(GmlpMoELayer) layer = NULL;
  GmlpExpertParallelMode mode;
  GmlpGroupedLinear *fc1;
  double factor;

  g_assert_no_error (error);
  layer = gmlp_moe_layer_new (device, HIDDEN, FFN, 6, 2, &error);
  g_assert_no_error (error);
  g_assert_null (gmlp_moe_layer_get_communicator (layer));
  g_assert_cmpuint (gmlp_moe_layer_get_n_local_experts (layer), ==, 6);
  g_assert_cmpuint (gmlp_moe_layer_get_first_local_expert (layer), ==, 0);
  g_assert_cmpint (gmlp_moe_layer_get_expert_parallel_mode (layer), ==, GMLP_EXPERT_PARALLEL_MODE_EXACT);
  g_assert_null (gmlp_moe_layer_get_dropped_rows (layer));
  g_object_get (layer, "expert-parallel-mode", &mode, "expert-capacity-factor", &factor, NULL);
  g_assert_cmpint (mode, ==, GMLP_EXPERT_PARALLEL_MODE_EXACT);
  g_assert_cmpfloat (factor, ==, 0.0);
  fc1 = gmlp_grouped_mlp_get_fc1 (gmlp_moe_layer_get_experts (layer));
  g_assert_cmpuint (gmlp_grouped_linear_get_n_groups (fc1), ==, 6);
  g_assert_cmpint (gmlp_moe_layer_get_dispatch_fp8_recipe (layer), ==, GMLP_SCALING_RECIPE_NONE);
  g_assert_cmpint (gmlp_moe_layer_get_dispatch_fp8_format (layer), ==, GMLP_FP8_FORMAT_E4M3);
  g_clear_object (&layer);

  /* An FP8 dispatch without a communicator changes nothing, but its
   * recipe is checked all the same. */
  layer = g_initable_new (GMLP_TYPE_MOE_LAYER, NULL, &error, "device", device,
                          "hidden", (gint64) HIDDEN, "ffn-hidden", (gint64) FFN, "n-experts", 6,
                          "top-k", 2, "dispatch-fp8-recipe", GMLP_SCALING_RECIPE_MXFP8,
                          "dispatch-fp8-format", GMLP_FP8_FORMAT_E5M2, NULL);
  g_assert_no_error (error);
  g_assert_cmpint (gmlp_moe_layer_get_dispatch_fp8_recipe (layer), ==, GMLP_SCALING_RECIPE_MXFP8);
  g_assert_cmpint (gmlp_moe_layer_get_dispatch_fp8_format (layer), ==, GMLP_FP8_FORMAT_E5M2);
  g_clear_object (&layer);
  layer = g_initable_new (GMLP_TYPE_MOE_LAYER, NULL, &error, "device", device,
                          "hidden", (gint64) HIDDEN, "ffn-hidden", (gint64) FFN, "n-experts", 6,
                          "top-k", 2, "dispatch-fp8-recipe", GMLP_SCALING_RECIPE_CURRENT, NULL);
  g_assert_null (layer);
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED);
  g_assert_nonnull (strstr (error->message, "current"));
}

/* Faults: the last rank aborts its communicator instead of taking part in
 * the forward (or, after the forward, the backward); the others get
 * GMLP_ERROR_ABORTED at once, far within the timeout, never a hang. */
typedef struct {
  gboolean                in_backward;
  GmlpExpertParallelMode  mode;
  gint64                  elapsed_us[GMLP_TEST_MAX_WORLD];
  GError                 *errors[GMLP_TEST_MAX_WORLD];
} Faults;

static void
fault_rank (GmlpTestGroup    *group,
            int               rank,
            GmlpCommunicator *comm,
            gpointer          data)
{
  Faults *t = data;
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpMoELayer) layer = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, y = NULL, dx = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  gint64 tokens = 8, start;

  layer = g_initable_new (GMLP_TYPE_MOE_LAYER, NULL, &error, "device", group->devices[rank],
                          "communicator", comm, "hidden", (gint64) HIDDEN, "ffn-hidden", (gint64) FFN,
                          "n-experts", 2 * group->world, "top-k", 2, "expert-parallel-mode", t->mode,
                          NULL);
  g_assert_no_error (error);
  x = gmlp_grouped_tensor_new (group->devices[rank], GMLP_DTYPE_FLOAT32, &tokens, 1, HIDDEN, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_grouped_tensor_fill_random (x, rank + 1, 1.0, &error));

  if (rank == group->world - 1 && !t->in_backward)
    {
      g_usleep (50 * G_TIME_SPAN_MILLISECOND);
      gmlp_communicator_abort (comm);
      return;
    }
  start = g_get_monotonic_time ();
  y = gmlp_moe_layer_forward (layer, x, &saved, &t->errors[rank]);
  if (t->in_backward)
    {
      g_assert_no_error (t->errors[rank]);
      if (rank == group->world - 1)
        {
          g_usleep (50 * G_TIME_SPAN_MILLISECOND);
          gmlp_communicator_abort (comm);
          return;
        }
      start = g_get_monotonic_time ();
      dx = gmlp_moe_layer_backward (layer, saved, y, &t->errors[rank]);
    }
  t->elapsed_us[rank] = g_get_monotonic_time () - start;
}

static void
check_fault (gboolean                in_backward,
             GmlpExpertParallelMode  mode,
             int                     world)
{
  GmlpTestGroup group;
  Faults t = { .in_backward = in_backward, .mode = mode };
  guint timeout_ms = gmlp_test_on_cuda () ? 2000 : 20000;
  int r;

  if (!gmlp_test_group_init (&group, world, timeout_ms))
    return;
  gmlp_test_group_run (&group, fault_rank, &t);
  for (r = 0; r < world - 1; r++)
    {
      g_assert_error (t.errors[r], GMLP_ERROR, GMLP_ERROR_ABORTED);
      if (!gmlp_test_on_cuda ())
        g_assert_cmpint (t.elapsed_us[r], <, (gint64) timeout_ms * 1000 / 2);
      g_clear_error (&t.errors[r]);
    }
  gmlp_test_group_clear (&group);
}

static void
test_abort (void)
{
  GmlpExpertParallelMode mode;

  for (mode = GMLP_EXPERT_PARALLEL_MODE_EXACT; mode <= GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE; mode++)
    {
      check_fault (FALSE, mode, 2);
      check_fault (TRUE, mode, 3);
    }
}

/* Graph-safe mode on a GPU: a whole step of each rank captured once in a
 * GmlpGraph (NCCL's collectives in it) and replayed on new tokens and
 * output gradients written into the same tensors. While a device
 * captures, every call that would wait for it or read its memory on the
 * host fails, so a step captured whole reads nothing on the host; each
 * replay gives the same bytes (output, input gradient, every expert's and
 * the router's gradient) as a second layer with the same parameters run
 * eagerly on that data. */
typedef struct {
  const Case *c;
  guint       n_experts;
  guint64     seed;
  gint64      tokens;
} GraphRun;

static void
graph_rank (GmlpTestGroup    *group,
            int               rank,
            GmlpCommunicator *comm,
            gpointer          data)
{
  GraphRun *run = data;
  GmlpDevice *device = group->devices[rank];
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpMoELayer) layer = NULL, eager = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL, dy = NULL, y = NULL, dx = NULL, iy = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GmlpGraph) graph = NULL, inference = NULL;
  guint replay;

  layer = layer_new (run->c, run->n_experts, device, comm, 0.0, &error);
  g_assert_no_error (error);
  eager = layer_new (run->c, run->n_experts, device, comm, 0.0, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_moe_layer_init_parameters (layer, run->seed, &error));
  g_assert_true (gmlp_moe_layer_init_parameters (eager, run->seed, &error));
  x = gmlp_grouped_tensor_new (device, run->c->dtype, &run->tokens, 1, HIDDEN, &error);
  g_assert_no_error (error);
  dy = gmlp_grouped_tensor_new (device, run->c->dtype, &run->tokens, 1, HIDDEN, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_grouped_tensor_fill_random (x, run->seed + rank, 1.0, &error));
  g_assert_true (gmlp_grouped_tensor_fill_random (dy, run->seed + 100 + rank, 1.0, &error));

  /* A training step: with chunks, the forward's and the backward's
   * pipelines, the experts' weight gradients by chunk. */
  g_assert_true (gmlp_device_begin_capture (device, &error));
  g_assert_no_error (error);
  y = gmlp_moe_layer_forward (layer, x, &saved, &error);
  g_assert_no_error (error);
  dx = gmlp_moe_layer_backward (layer, saved, dy, &error);
  g_assert_no_error (error);
  graph = gmlp_device_end_capture (device, &error);
  g_assert_no_error (error);
  g_assert_nonnull (graph);
  /* A forward without saved activations: the chunks' pipeline, the
   * communication stream forked and joined inside the capture. */
  g_assert_true (gmlp_device_begin_capture (device, &error));
  iy = gmlp_moe_layer_forward (layer, x, NULL, &error);
  g_assert_no_error (error);
  inference = gmlp_device_end_capture (device, &error);
  g_assert_no_error (error);
  g_assert_nonnull (inference);

  for (replay = 0; replay < 3; replay++)
    {
      g_autofree char *what = g_strdup_printf ("rank %d replay %u", rank, replay);
      g_autoptr(GmlpGroupedTensor) ey = NULL, edx = NULL, eiy = NULL;
      g_autoptr(GmlpSavedActivations) esaved = NULL;
      Result got = { NULL, }, want = { NULL, };
      gsize n, m;
      guint i;

      /* New data in the captured tensors, the same on the eager side. */
      g_assert_true (gmlp_grouped_tensor_fill_random (x, run->seed + 1000 * (replay + 1) + rank, 1.0,
                                                      &error));
      g_assert_true (gmlp_grouped_tensor_fill_random (dy, run->seed + 2000 * (replay + 1) + rank,
                                                      1.0, &error));
      g_assert_true (gmlp_graph_replay (graph, &error));
      g_assert_no_error (error);
      ey = gmlp_moe_layer_forward (eager, x, &esaved, &error);
      g_assert_no_error (error);
      edx = gmlp_moe_layer_backward (eager, esaved, dy, &error);
      g_assert_no_error (error);
      gmlp_test_assert_same_bytes (y, ey, what);
      gmlp_test_assert_same_bytes (dx, edx, what);
      g_assert_true (gmlp_graph_replay (inference, &error));
      g_assert_no_error (error);
      eiy = gmlp_moe_layer_forward (eager, x, NULL, &error);
      g_assert_no_error (error);
      gmlp_test_assert_same_bytes (iy, eiy, what);
      read_layer (layer, &got);
      read_layer (eager, &want);
      for (i = 0; i < 4; i++)
        if (got.expert_grads[i] != NULL)
          {
            n = got.n_grads[i];
            m = want.n_grads[i];
            g_assert_cmpuint (n, ==, m);
            g_assert_cmpmem (got.expert_grads[i], n * sizeof (double), want.expert_grads[i],
                             m * sizeof (double));
          }
      gmlp_test_assert_same_bytes (gmlp_router_get_wgrad (gmlp_moe_layer_get_router (layer)),
                                   gmlp_router_get_wgrad (gmlp_moe_layer_get_router (eager)), what);
      result_clear (&got);
      result_clear (&want);
    }
}

static void
test_graph_replay (void)
{
  /* Plain, with an FP8 dispatch (its quantize and dequantize in the graph
   * too), and with a shared expert and chunks. */
  static const Case graph_cases[] = {
    { .name = "graph", .experts_per_rank = 2, .top_k = 2, .bias = TRUE,
      .mode = GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE, .expert_capacity_factor = 1.5 },
    { .name = "graph-fp8", .experts_per_rank = 2, .top_k = 2, .bias = TRUE,
      .mode = GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE, .expert_capacity_factor = 1.5,
      .dtype = GMLP_DTYPE_BFLOAT16, .dispatch_fp8 = GMLP_SCALING_RECIPE_BLOCKWISE },
    /* The shared expert while the dispatch is in flight; three chunks. */
    { .name = "graph-shared-chunks", .experts_per_rank = 4, .top_k = 2, .shared = 6,
      .mode = GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE, .expert_capacity_factor = 1.5, .chunks = 3 },
  };
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint i;
  int world;

  if (device == NULL)
    return;
  if (gmlp_device_get_kind (device) == GMLP_DEVICE_KIND_CPU)
    {
      g_test_skip ("graphs need a GPU");
      return;
    }
  for (i = 0; i < G_N_ELEMENTS (graph_cases); i++)
    for (world = 1; world <= GMLP_TEST_MAX_WORLD; world++)
      {
        GmlpTestGroup group;
        GraphRun run = { &graph_cases[i], graph_cases[i].experts_per_rank * world, g_test_rand_int (), 24 };

        if (!gmlp_test_group_init (&group, world, 60000))
          continue;
        gmlp_test_group_run (&group, graph_rank, &run);
        gmlp_test_group_clear (&group);
      }
}

int
main (int    argc,
      char **argv)
{
  guint i;

  setlocale (LC_ALL, "");
  g_test_init (&argc, &argv, NULL);
  gmlp_test_prepare_threads ();

  g_test_add_func ("/Gmlp/MoELayer/expert-parallel/one-device", test_one_device);
  for (i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      g_autofree char *path = g_strdup_printf ("/Gmlp/MoELayer/expert-parallel/equal/%s", cases[i].name);

      g_test_add_data_func (path, &cases[i], test_equal);
    }
  for (i = 0; i < G_N_ELEMENTS (chunk_cases); i++)
    {
      g_autofree char *path = g_strdup_printf ("/Gmlp/MoELayer/expert-parallel/chunks/%s",
                                               chunk_cases[i].name);

      g_test_add_data_func (path, &chunk_cases[i], test_chunks);
    }
  g_test_add_func ("/Gmlp/MoELayer/expert-parallel/bad-construction", test_bad_construction);
  g_test_add_func ("/Gmlp/MoELayer/expert-parallel/agree-at-forward", test_agree_at_forward);
  g_test_add_func ("/Gmlp/MoELayer/expert-parallel/graph-safe-uneven", test_graph_safe_uneven);
  g_test_add_func ("/Gmlp/MoELayer/expert-parallel/abort", test_abort);
  g_test_add_func ("/Gmlp/MoELayer/expert-parallel/graph-replay", test_graph_replay);

  return g_test_run ();
}
