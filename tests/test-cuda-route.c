/* test-cuda-route.c: the CUDA backend's route, without a GPU
 *
 * gmlp_cuda_route() is a pure function (libgmlp/backend/cuda/
 * gmlp-cuda-route.c, linked here alone): every row of docs/routes.md's
 * table, and the tuning's forced routes, from described products. The
 * rows are named as the table numbers them. Then the description itself:
 * what gmlp_cuda_route_describe() reads of the backend's descriptors, as
 * the gemm entry builds it for every call (the Hopper kernel's answer,
 * which the entry adds, given here), and the route it yields.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <string.h>

#include <glib.h>

#include "gmlp-numeric.h"
#include "backend/cuda/gmlp-cuda-route.h"

static const GmlpCudaDeviceProps h200 = { .major = 9, .minor = 0, .n_sms = 132 };
static const GmlpCudaDeviceProps l40 = { .major = 8, .minor = 9, .n_sms = 142 };
static const GmlpCudaDeviceProps a100 = { .major = 8, .minor = 0, .n_sms = 108 };

/* n products of m × n × k each, all of one shape, on host sizes, covered
 * by the Hopper kernel. */
static GmlpCudaRouteProduct
host_product (GmlpGemmKind kind,
              guint        n_products,
              gint64       m,
              gint64       n,
              gint64       k)
{
  GmlpCudaRouteProduct p = {
    .kind = kind,
    .ab_dtype = GMLP_NUM_BFLOAT16,
    .c_dtype = GMLP_NUM_BFLOAT16,
    .n_products = n_products,
    .total_flop = 2.0 * (double) m * (double) n * (double) k * n_products,
    .aligned = TRUE,
    .uniform = TRUE,
    .rows = m * n_products,
    .tiled_rows = m / GMLP_CUDA_ROW_TILE * GMLP_CUDA_ROW_TILE * n_products,
    .rows_aligned = m % 16 == 0,
    .sm90_covers = TRUE,
  };

  return p;
}

static GmlpCudaRoute
route (const GmlpCudaRouteProduct *p,
       const GmlpCudaDeviceProps  *props,
       const char                 *tuning_spec)
{
  GmlpBackendTuning tuning = { 0, };

  /* The keys the route reads, as gmlp_tuning_parse() sets them. */
  if (tuning_spec != NULL)
    {
      g_auto(GStrv) items = g_strsplit (tuning_spec, ",", -1);

      for (guint i = 0; items[i] != NULL; i++)
        {
          if (g_str_equal (items[i], "host-gemm=cublas"))
            tuning.host_gemm = GMLP_CUDA_HOST_GEMM_CUBLAS;
          else if (g_str_equal (items[i], "host-gemm=sm90"))
            tuning.host_gemm = GMLP_CUDA_HOST_GEMM_SM90;
          else if (g_str_equal (items[i], "device-gemm=portable"))
            tuning.device_gemm = 1;
          else if (g_str_equal (items[i], "row-tiles=off"))
            tuning.row_tiles = 1;
          else if (g_str_equal (items[i], "batched=off"))
            tuning.batched = 1;
          else
            g_assert_not_reached ();
        }
    }
  return gmlp_cuda_route (p, props, &tuning).route;
}

static GmlpCudaRouteChoice
choose (const GmlpCudaRouteProduct *p,
        const GmlpCudaDeviceProps  *props)
{
  GmlpBackendTuning tuning = { 0, };

  return gmlp_cuda_route (p, props, &tuning);
}

#define assert_route(p, props, spec, expected) \
  g_assert_cmpstr (gmlp_cuda_route_name (route ((p), (props), (spec))), ==, \
                   gmlp_cuda_route_name (expected))

/* The route's helpers. */
static void
test_helpers (void)
{
  /* 16 products under 4 GFLOP on average; 15, or 4 GFLOP, no longer. */
  g_assert_true (gmlp_cuda_route_prefer_grouped (16, 16 * 3.9e9));
  g_assert_false (gmlp_cuda_route_prefer_grouped (15, 15 * 1e9));
  g_assert_false (gmlp_cuda_route_prefer_grouped (16, 16 * 4e9));
  g_assert_cmpstr (gmlp_cuda_route_name (GMLP_CUDA_ROUTE_CUBLASLT), ==, "cublaslt");
}

/* Rows G1-G3: the Hopper kernel for host sizes, by the heuristics. */
static void
test_gemm_sm90 (void)
{
  /* G1: many small WGRAD products (qwen3-fc1: 128 experts of 1.6 GFLOP). */
  GmlpCudaRouteProduct p = host_product (GMLP_GEMM_WGRAD, 128, 256, 768, 2048);

  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_SM90);
  /* Uneven rows change nothing for WGRAD. */
  p.uniform = FALSE;
  p.tiled_rows = p.rows;
  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_SM90);

  /* G2: many small FPROP and DGRAD products with under 95% of the rows in
   * whole row tiles (small-e64 skewed). */
  p = host_product (GMLP_GEMM_FPROP, 64, 200, 1024, 1024);
  p.uniform = FALSE;
  g_assert_cmpfloat (p.tiled_rows, <, 0.95 * p.rows);
  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_SM90);
  p.kind = GMLP_GEMM_DGRAD;
  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_SM90);

  /* G3: unequal FPROP and WGRAD products, too few or too large for the
   * grouped rule, under 64 GFLOP each (dsv3-fc1 skewed: 32 experts). */
  p = host_product (GMLP_GEMM_FPROP, 32, 1024, 2048, 7168);
  p.uniform = FALSE;
  g_assert_false (gmlp_cuda_route_prefer_grouped (p.n_products, p.total_flop));
  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_SM90);
  p.kind = GMLP_GEMM_WGRAD;
  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_SM90);
  /* ... but not 16-bit DGRAD (MN-major B), which loops. */
  p.kind = GMLP_GEMM_DGRAD;
  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_CUBLAS_LOOP);
  /* ... nor one product. */
  p = host_product (GMLP_GEMM_FPROP, 1, 1024, 2048, 7168);
  p.uniform = FALSE;
  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_CUBLAS_LOOP);
}

/* Where the Hopper kernel does not take the product, or the tuning turns
 * it off, rows G4-G7 decide. */
static void
test_gemm_sm90_not_taken (void)
{
  GmlpCudaRouteProduct p = host_product (GMLP_GEMM_WGRAD, 128, 256, 768, 2048);

  p.sm90_covers = FALSE;
  p.sm90_reason = "the Hopper kernel needs a compute capability 9.0 GPU";
  assert_route (&p, &a100, NULL, GMLP_CUDA_ROUTE_CUBLAS_GROUPED);
  p.sm90_covers = TRUE;
  p.sm90_reason = NULL;
  assert_route (&p, &h200, "device-gemm=portable", GMLP_CUDA_ROUTE_CUBLAS_GROUPED);

  p = host_product (GMLP_GEMM_FPROP, 32, 1024, 2048, 7168);
  p.uniform = FALSE;
  p.sm90_covers = FALSE;
  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_CUBLAS_LOOP);
}

/* Rows G4-G5: cuBLAS's grouped call, with and without row tiles. */
static void
test_gemm_grouped (void)
{
  /* G4: balanced qwen3-fc1 FPROP: every row in whole tiles, so not the
   * Hopper kernel; grouped with row tiles. */
  GmlpCudaRouteProduct p = host_product (GMLP_GEMM_FPROP, 128, 256, 768, 2048);
  GmlpCudaRouteChoice c;

  c = choose (&p, &h200);
  g_assert_cmpint (c.route, ==, GMLP_CUDA_ROUTE_CUBLAS_GROUPED);
  g_assert_true (c.row_tiles);
  /* Three quarters of the rows in tiles still tile... */
  p.sm90_covers = FALSE;
  p.rows = 400 * 128;
  p.tiled_rows = 300 * 128;
  c = choose (&p, &h200);
  g_assert_cmpint (c.route, ==, GMLP_CUDA_ROUTE_CUBLAS_GROUPED);
  g_assert_true (c.row_tiles);
  /* ... fewer do not. */
  p.tiled_rows = 299 * 128;
  c = choose (&p, &h200);
  g_assert_cmpint (c.route, ==, GMLP_CUDA_ROUTE_CUBLAS_GROUPED);
  g_assert_false (c.row_tiles);

  /* G5: WGRAD never tiles (it sums over the rows). */
  p = host_product (GMLP_GEMM_WGRAD, 128, 256, 768, 2048);
  p.sm90_covers = FALSE;
  c = choose (&p, &h200);
  g_assert_cmpint (c.route, ==, GMLP_CUDA_ROUTE_CUBLAS_GROUPED);
  g_assert_false (c.row_tiles);

  /* The grouped call wants 16-byte pointers and C of the operands' dtype:
   * else the batched call or the loop. */
  p.aligned = FALSE;
  assert_route (&p, &h200, "host-gemm=cublas", GMLP_CUDA_ROUTE_CUBLAS_LOOP);
  p.aligned = TRUE;
  p.c_dtype = GMLP_NUM_FLOAT32;
  assert_route (&p, &h200, "host-gemm=cublas", GMLP_CUDA_ROUTE_CUBLAS_BATCHED);
}

/* Row G6: one batched call for products of one shape under 64 GFLOP. */
static void
test_gemm_batched (void)
{
  /* dsv3-fc1 balanced: 32 experts of 30 GFLOP. */
  GmlpCudaRouteProduct p = host_product (GMLP_GEMM_FPROP, 32, 1024, 2048, 7168);

  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_CUBLAS_BATCHED);
  p.kind = GMLP_GEMM_DGRAD;
  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_CUBLAS_BATCHED);
  p.kind = GMLP_GEMM_WGRAD;
  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_CUBLAS_BATCHED);
  /* Not aligned, or batched=off: the loop. */
  p.aligned = FALSE;
  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_CUBLAS_LOOP);
  p.aligned = TRUE;
  assert_route (&p, &h200, "batched=off", GMLP_CUDA_ROUTE_CUBLAS_LOOP);
  /* A 32-bit output does not matter to the batched call. */
  p.c_dtype = GMLP_NUM_FLOAT32;
  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_CUBLAS_BATCHED);
}

/* Row G7: the loop, for products of 64 GFLOP and more (mixtral-fc1: 8
 * experts of 240 GFLOP), and for groups only set to zero. */
static void
test_gemm_loop (void)
{
  GmlpCudaRouteProduct p = host_product (GMLP_GEMM_FPROP, 8, 4096, 14336, 4096 / 2);

  g_assert_cmpfloat (p.total_flop / p.n_products, >=, 64e9);
  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_CUBLAS_LOOP);
  p.uniform = FALSE;
  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_CUBLAS_LOOP);
  p.kind = GMLP_GEMM_WGRAD;
  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_CUBLAS_LOOP);

  p = host_product (GMLP_GEMM_WGRAD, 0, 0, 768, 2048);
  p.n_zeroed = 4;
  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_CUBLAS_LOOP);
  assert_route (&p, &h200, "host-gemm=sm90", GMLP_CUDA_ROUTE_CUBLAS_LOOP);
}

/* Rows G8-G9: the tuning's host_gemm forces a side. */
static void
test_gemm_forced (void)
{
  /* G8: host-gemm=sm90 takes what the kernel covers, even one product of
   * a shape the heuristics send to cuBLAS. */
  GmlpCudaRouteProduct p = host_product (GMLP_GEMM_DGRAD, 8, 4096, 14336, 2048);

  assert_route (&p, &h200, "host-gemm=sm90", GMLP_CUDA_ROUTE_SM90);
  p.sm90_covers = FALSE;
  assert_route (&p, &h200, "host-gemm=sm90", GMLP_CUDA_ROUTE_CUBLAS_LOOP);
  p.sm90_covers = TRUE;
  assert_route (&p, &h200, "host-gemm=sm90,device-gemm=portable", GMLP_CUDA_ROUTE_CUBLAS_LOOP);

  /* G9: host-gemm=cublas never takes the kernel. */
  p = host_product (GMLP_GEMM_WGRAD, 128, 256, 768, 2048);
  assert_route (&p, &h200, "host-gemm=cublas", GMLP_CUDA_ROUTE_CUBLAS_GROUPED);
  p = host_product (GMLP_GEMM_FPROP, 32, 1024, 2048, 7168);
  p.uniform = FALSE;
  assert_route (&p, &h200, "host-gemm=cublas", GMLP_CUDA_ROUTE_CUBLAS_LOOP);
  p.uniform = TRUE;
  assert_route (&p, &h200, "host-gemm=cublas", GMLP_CUDA_ROUTE_CUBLAS_BATCHED);
  assert_route (&p, &h200, "host-gemm=cublas,batched=off", GMLP_CUDA_ROUTE_CUBLAS_LOOP);

  /* row-tiles=off */
  p = host_product (GMLP_GEMM_FPROP, 128, 256, 768, 2048);
  {
    GmlpBackendTuning tuning = { .row_tiles = 1 };
    GmlpCudaRouteChoice c = gmlp_cuda_route (&p, &h200, &tuning);

    g_assert_cmpint (c.route, ==, GMLP_CUDA_ROUTE_CUBLAS_GROUPED);
    g_assert_false (c.row_tiles);
  }
}

static GmlpCudaRouteProduct
fp8_product (GmlpGemmKind kind,
             gboolean     blockwise,
             guint        n_products,
             gint64       m,
             gint64       n,
             gint64       k)
{
  GmlpCudaRouteProduct p = host_product (kind, n_products, m, n, k);

  p.ab_dtype = GMLP_NUM_FLOAT8_E4M3;
  p.blockwise = blockwise;
  return p;
}

/* Rows F1-F4: FP8 with blockwise scales, host sizes. */
static void
test_fp8_blockwise (void)
{
  /* F1: WGRAD with a group not of a multiple of 16 rows: padded copies. */
  GmlpCudaRouteProduct p = fp8_product (GMLP_GEMM_WGRAD, TRUE, 4, 100, 4096, 2048);
  GmlpCudaRouteChoice c;

  g_assert_false (p.rows_aligned);
  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_SM90_PADDED);
  /* The host_gemm side does not matter: no cuBLASLt path. */
  assert_route (&p, &h200, "host-gemm=cublas", GMLP_CUDA_ROUTE_SM90_PADDED);
  /* F2: device-gemm=portable: the layer's dequantized fall-back. */
  c = gmlp_cuda_route (&p, &h200, &(GmlpBackendTuning) { .device_gemm = 1 });
  g_assert_cmpint (c.route, ==, GMLP_CUDA_ROUTE_DEQUANTIZED);
  g_assert_nonnull (strstr (c.reason, "device-gemm=portable"));

  /* F3: otherwise the Hopper kernel where it covers the product, whatever
   * the size and host_gemm. */
  p = fp8_product (GMLP_GEMM_WGRAD, TRUE, 4, 128, 4096, 2048);
  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_SM90);
  assert_route (&p, &h200, "host-gemm=cublas", GMLP_CUDA_ROUTE_SM90);
  p = fp8_product (GMLP_GEMM_FPROP, TRUE, 2, 8000, 4096, 2048);
  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_SM90);

  /* F4: not covered (another GPU, operands not laid out as grouped
   * tensors, E5M2 × E5M2 ...) or turned off: dequantized, with the reason. */
  p.sm90_covers = FALSE;
  p.sm90_reason = "the Hopper kernel needs a compute capability 9.0 GPU";
  c = choose (&p, &l40);
  g_assert_cmpint (c.route, ==, GMLP_CUDA_ROUTE_DEQUANTIZED);
  g_assert_cmpstr (c.reason, ==, p.sm90_reason);
  p.sm90_covers = TRUE;
  p.sm90_reason = NULL;
  assert_route (&p, &h200, "device-gemm=portable", GMLP_CUDA_ROUTE_DEQUANTIZED);
  /* Operands not laid out as the kernel reads them: that reason first. */
  p.sm90_covers = FALSE;
  p.sm90_unpacked = TRUE;
  p.sm90_reason = "the operands are not laid out as grouped tensors lay them out";
  c = gmlp_cuda_route (&p, &h200, &(GmlpBackendTuning) { .device_gemm = 1 });
  g_assert_cmpint (c.route, ==, GMLP_CUDA_ROUTE_DEQUANTIZED);
  g_assert_cmpstr (c.reason, ==, p.sm90_reason);
}

/* Rows F5-F8: FP8 with per-tensor scales, host sizes. */
static void
test_fp8_per_tensor (void)
{
  /* F5: FPROP of 16 groups or more: the Hopper kernel, however large. */
  GmlpCudaRouteProduct p = fp8_product (GMLP_GEMM_FPROP, FALSE, 32, 1024, 2048, 7168);
  GmlpCudaRouteChoice c;

  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_SM90);
  /* ... DGRAD and WGRAD of that size: cuBLASLt. */
  p.kind = GMLP_GEMM_DGRAD;
  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_CUBLASLT);
  p.kind = GMLP_GEMM_WGRAD;
  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_CUBLASLT);

  /* F6: many small DGRAD and WGRAD products: the Hopper kernel. */
  p = fp8_product (GMLP_GEMM_DGRAD, FALSE, 128, 256, 768, 2048);
  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_SM90);
  p.kind = GMLP_GEMM_WGRAD;
  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_SM90);

  /* F7: a few large groups: cuBLASLt, on 8.9 and 9.0. */
  p = fp8_product (GMLP_GEMM_FPROP, FALSE, 8, 4096, 14336, 4096);
  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_CUBLASLT);
  assert_route (&p, &l40, NULL, GMLP_CUDA_ROUTE_CUBLASLT);
  /* ... and what the kernel does not cover. */
  p = fp8_product (GMLP_GEMM_FPROP, FALSE, 32, 1024, 2048, 7168);
  p.sm90_covers = FALSE;
  p.sm90_reason = "the Hopper kernel needs a compute capability 9.0 GPU";
  assert_route (&p, &l40, NULL, GMLP_CUDA_ROUTE_CUBLASLT);
  p.sm90_covers = TRUE;
  p.sm90_reason = NULL;
  assert_route (&p, &h200, "device-gemm=portable", GMLP_CUDA_ROUTE_CUBLASLT);

  /* F8: no FP8 tensor cores (before 8.9): refused, no fall-back. */
  p.sm90_covers = FALSE;
  c = choose (&p, &a100);
  g_assert_cmpint (c.route, ==, GMLP_CUDA_ROUTE_UNSUPPORTED);
  g_assert_true (c.reason == gmlp_cuda_route_no_fp8_tensor_cores);
  /* Groups only set to zero need no tensor cores. */
  p = fp8_product (GMLP_GEMM_WGRAD, FALSE, 0, 0, 4096, 2048);
  p.n_zeroed = 3;
  p.sm90_covers = FALSE;
  assert_route (&p, &a100, NULL, GMLP_CUDA_ROUTE_CUBLASLT);
}

/* Rows F9-F10: the tuning's host_gemm forces a side for per-tensor FP8. */
static void
test_fp8_forced (void)
{
  /* F9: host-gemm=sm90 where the kernel covers the product. */
  GmlpCudaRouteProduct p = fp8_product (GMLP_GEMM_WGRAD, FALSE, 8, 4096, 14336, 4096);

  assert_route (&p, &h200, "host-gemm=sm90", GMLP_CUDA_ROUTE_SM90);
  p.sm90_covers = FALSE;
  assert_route (&p, &h200, "host-gemm=sm90", GMLP_CUDA_ROUTE_CUBLASLT);

  /* F10: host-gemm=cublas: cuBLASLt even for many small FPROP groups. */
  p = fp8_product (GMLP_GEMM_FPROP, FALSE, 128, 256, 768, 2048);
  assert_route (&p, &h200, "host-gemm=cublas", GMLP_CUDA_ROUTE_CUBLASLT);
}

/* Rows D1-D3: group sizes on the device. */
static void
test_device (void)
{
  GmlpCudaRouteProduct p = {
    .device_sizes = TRUE,
    .kind = GMLP_GEMM_FPROP,
    .ab_dtype = GMLP_NUM_BFLOAT16,
    .c_dtype = GMLP_NUM_BFLOAT16,
    .sm90_covers = TRUE,
  };
  GmlpCudaRouteChoice c;

  /* D1: the Hopper kernel where it covers the product, whatever
   * host_gemm says. */
  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_SM90);
  assert_route (&p, &h200, "host-gemm=cublas", GMLP_CUDA_ROUTE_SM90);
  p.ab_dtype = p.c_dtype = GMLP_NUM_FLOAT8_E4M3;
  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_SM90);

  /* D2: FP8 the kernel does not take: dequantized. */
  p.c_dtype = GMLP_NUM_BFLOAT16;
  c = gmlp_cuda_route (&p, &h200, &(GmlpBackendTuning) { .device_gemm = 1 });
  g_assert_cmpint (c.route, ==, GMLP_CUDA_ROUTE_DEQUANTIZED);
  g_assert_nonnull (strstr (c.reason, "device-gemm=portable"));
  p.sm90_covers = FALSE;
  p.sm90_reason = "the Hopper kernel needs a compute capability 9.0 GPU";
  c = choose (&p, &a100);
  g_assert_cmpint (c.route, ==, GMLP_CUDA_ROUTE_DEQUANTIZED);
  g_assert_cmpstr (c.reason, ==, p.sm90_reason);

  /* D3: 16-bit and FP32 elsewhere: the portable kernel. */
  p.ab_dtype = p.c_dtype = GMLP_NUM_BFLOAT16;
  assert_route (&p, &a100, NULL, GMLP_CUDA_ROUTE_PORTABLE);
  p.ab_dtype = p.c_dtype = GMLP_NUM_FLOAT32;
  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_PORTABLE);
  p.ab_dtype = p.c_dtype = GMLP_NUM_BFLOAT16;
  p.sm90_covers = TRUE;
  p.sm90_reason = NULL;
  assert_route (&p, &h200, "device-gemm=portable", GMLP_CUDA_ROUTE_PORTABLE);
}

/* Descriptors as the layer builds them, on fake device addresses: the
 * description reads the pointers only for their alignment. */
#define ADDRESS(a) ((gpointer) (guintptr) (a))

/* At most this many groups in the descriptors below. */
#define MAX_GROUPS 8

/* FPROP y (m_i × n) = x (m_i × k) · W_iᵀ, or with 16-bit operands DGRAD
 * dx = dy W_i, or WGRAD dW_i (+)= dyᵀ x, as the layer describes them:
 * the activations grouped by the sizes, the weights (or their gradients)
 * strided. */
static GmlpBackendGemm
host_gemm (GmlpGemmKind  kind,
           int           ab_dtype,
           int           c_dtype,
           const gint64 *rows,
           guint         n_groups,
           gint64        n,
           gint64        k)
{
  gboolean wgrad = kind == GMLP_GEMM_WGRAD;
  GmlpBackendGemm gemm = {
    .kind = kind,
    .n_groups = n_groups,
    .n = n,
    .k = k,
    .rows = rows,
    .a = { .layout = GMLP_BACKEND_OPERAND_ROWS, .dtype = ab_dtype, .base = ADDRESS (0x10000000) },
    .b = { .layout = wgrad ? GMLP_BACKEND_OPERAND_ROWS : GMLP_BACKEND_OPERAND_STRIDED,
           .dtype = ab_dtype, .base = ADDRESS (0x20000000),
           .stride = wgrad ? 0 : (guint64) (n * k) * gmlp_num_dtype_size (ab_dtype) },
    .c = { .layout = wgrad ? GMLP_BACKEND_OPERAND_STRIDED : GMLP_BACKEND_OPERAND_ROWS,
           .dtype = c_dtype, .base = ADDRESS (0x30000000),
           .stride = wgrad ? (guint64) (n * k) * gmlp_num_dtype_size (c_dtype) : 0 },
  };

  g_assert_cmpuint (n_groups, <=, MAX_GROUPS);
  return gemm;
}

/* FP8 operands with one scale a group (per-tensor), or blockwise scales
 * (rowwise 1 × 128 blocks of the activations, 128 × 128 tiles of the
 * weights; WGRAD's columnwise copies 1 × 128 both). */
static GmlpBackendGemm
fp8_gemm (GmlpGemmKind  kind,
          gboolean      blockwise,
          const gint64 *rows,
          guint         n_groups,
          gint64        n,
          gint64        k)
{
  GmlpBackendGemm gemm = host_gemm (kind, GMLP_NUM_FLOAT8_E4M3, GMLP_NUM_BFLOAT16, rows, n_groups, n, k);

  gemm.a.scale_inv = ADDRESS (0x40000000);
  gemm.b.scale_inv = ADDRESS (0x50000000);
  gemm.a.scale_stride = gemm.b.scale_stride = sizeof (float);
  if (!blockwise)
    return gemm;
  if (kind == GMLP_GEMM_WGRAD)
    {
      gemm.a.scales = (GmlpBackendFp8Scales) { .row_block = 1, .row_stride = 1, .depth_stride = n };
      gemm.b.scales = (GmlpBackendFp8Scales) { .row_block = 1, .row_stride = 1, .depth_stride = k };
      return gemm;
    }
  gemm.a.scales = (GmlpBackendFp8Scales) { .row_block = 1, .row_stride = (k + 127) / 128, .depth_stride = 1 };
  gemm.b.scales = (GmlpBackendFp8Scales) { .row_block = 128, .row_stride = (k + 127) / 128, .depth_stride = 1 };
  gemm.b.scale_stride = (guint64) ((n + 127) / 128 * ((k + 127) / 128)) * sizeof (float);
  return gemm;
}

/* The description the gemm entry builds for gemm, the kernel's answer left
 * out; with host sizes its groups' tables in tables. */
static GmlpCudaRouteProduct
describe_in (const GmlpBackendGemm *gemm,
             gpointer              *tables,
             GmlpCudaGroups        *groups)
{
  GmlpCudaRouteProduct p;

  memset (tables, 0, GMLP_CUDA_GROUPS_TABLES * MAX_GROUPS * sizeof (gpointer));
  if (gemm->rows == NULL)
    {
      gmlp_cuda_route_describe (gemm, NULL, &p);
      return p;
    }
  gmlp_cuda_groups_init (gemm, tables, groups);
  gmlp_cuda_route_describe (gemm, groups, &p);
  return p;
}

static GmlpCudaRouteProduct
describe (const GmlpBackendGemm *gemm)
{
  gpointer tables[GMLP_CUDA_GROUPS_TABLES * MAX_GROUPS];
  GmlpCudaGroups groups;

  return describe_in (gemm, tables, &groups);
}

/* The Hopper kernel's answer, as the entry adds it where the route reads
 * it. */
static GmlpCudaRouteProduct
with_sm90 (GmlpCudaRouteProduct  p,
           gboolean              covers,
           const char           *reason)
{
  g_assert_true (gmlp_cuda_route_asks_sm90 (&p));
  p.sm90_covers = covers;
  p.sm90_reason = reason;
  return p;
}

static const char not_sm90[] = "the Hopper kernel needs a compute capability 9.0 GPU";

/* 16-bit operands with host sizes: the statistics of rows G1-G7. */
static void
test_describe_host (void)
{
  const gint64 rows[] = { 256, 0, 300, 128 };
  const gint64 equal[] = { 256, 256, 256 };
  const gint64 tiles[] = { 0, 127, 128, 300, 16 };
  const gint64 empty[] = { 0, 0 };
  GmlpBackendGemm gemm = host_gemm (GMLP_GEMM_FPROP, GMLP_NUM_BFLOAT16, GMLP_NUM_BFLOAT16,
                                    rows, G_N_ELEMENTS (rows), 768, 2048);
  gpointer tables[GMLP_CUDA_GROUPS_TABLES * MAX_GROUPS];
  GmlpCudaGroups groups;
  GmlpCudaRouteProduct p = describe_in (&gemm, tables, &groups);

  /* The groups: each operand's members, from its base by the sizes or the
   * stride. */
  g_assert_true (groups.a[1] == ADDRESS (0x10000000 + 256 * 2048 * 2));
  g_assert_true (groups.a[2] == groups.a[1]);
  g_assert_true (groups.b[3] == ADDRESS (0x20000000 + 3 * 768 * 2048 * 2));
  g_assert_true (groups.c[3] == ADDRESS (0x30000000 + (256 + 300) * 768 * 2));
  g_assert_null (groups.bias);
  g_assert_null (groups.a_scale_inv);

  /* Three products, none of one shape, every pointer on 16 bytes. */
  g_assert_false (p.device_sizes);
  g_assert_cmpint (p.kind, ==, GMLP_GEMM_FPROP);
  g_assert_cmpint (p.ab_dtype, ==, GMLP_NUM_BFLOAT16);
  g_assert_cmpint (p.c_dtype, ==, GMLP_NUM_BFLOAT16);
  g_assert_false (p.blockwise);
  g_assert_cmpuint (p.n_products, ==, 3);
  g_assert_cmpuint (p.n_zeroed, ==, 0);
  g_assert_cmpfloat (p.total_flop, ==, 2.0 * 684 * 768 * 2048);
  g_assert_true (p.aligned);
  g_assert_false (p.uniform);
  g_assert_cmpint (p.rows, ==, 684);
  g_assert_cmpint (p.tiled_rows, ==, 256 + 256 + 128);
  g_assert_false (p.rows_aligned);
  g_assert_false (p.sm90_covers);
  g_assert_null (p.sm90_reason);
  g_assert_false (gmlp_cuda_route_may_dequantize (&gemm));
  /* G3: unequal mid-sized FPROP products on the kernel; else the loop. */
  p = with_sm90 (p, TRUE, NULL);
  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_SM90);
  p = with_sm90 (describe (&gemm), FALSE, not_sm90);
  assert_route (&p, &a100, NULL, GMLP_CUDA_ROUTE_CUBLAS_LOOP);
  /* Operands not laid out as the kernel reads them. */
  p = describe (&gemm);
  p.sm90_unpacked = TRUE;
  p.sm90_reason = "the operands are not laid out as grouped tensors lay them out";
  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_CUBLAS_LOOP);

  /* G6: products all of one shape, batched; an operand off 16 bytes (yet
   * on its element), the loop. */
  gemm = host_gemm (GMLP_GEMM_FPROP, GMLP_NUM_BFLOAT16, GMLP_NUM_FLOAT32, equal, G_N_ELEMENTS (equal),
                    768, 2048);
  p = with_sm90 (describe (&gemm), TRUE, NULL);
  g_assert_true (p.uniform);
  g_assert_cmpint (p.c_dtype, ==, GMLP_NUM_FLOAT32);
  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_CUBLAS_BATCHED);
  gemm.a.base = ADDRESS (0x10000002);
  p = with_sm90 (describe (&gemm), TRUE, NULL);
  g_assert_false (p.aligned);
  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_CUBLAS_LOOP);

  /* The rows and those in whole row tiles, of every group. */
  gemm = host_gemm (GMLP_GEMM_DGRAD, GMLP_NUM_FLOAT16, GMLP_NUM_FLOAT16, tiles, G_N_ELEMENTS (tiles),
                    768, 2048);
  p = describe (&gemm);
  g_assert_cmpint (p.rows, ==, 571);
  g_assert_cmpint (p.tiled_rows, ==, 128 + 256);
  g_assert_false (p.rows_aligned);
  g_assert_cmpuint (p.n_products, ==, 4);
  gemm = host_gemm (GMLP_GEMM_DGRAD, GMLP_NUM_FLOAT16, GMLP_NUM_FLOAT16, tiles + 2, 1, 768, 2048);
  g_assert_true (describe (&gemm).rows_aligned);
  gemm = host_gemm (GMLP_GEMM_DGRAD, GMLP_NUM_FLOAT16, GMLP_NUM_FLOAT16, tiles, 1, 768, 2048);
  p = describe (&gemm);
  g_assert_true (p.rows_aligned);

  /* No rows: nothing to write, and no kernel to ask; the loop. */
  g_assert_cmpuint (p.n_products, ==, 0);
  g_assert_false (gmlp_cuda_route_asks_sm90 (&p));
  gemm = host_gemm (GMLP_GEMM_FPROP, GMLP_NUM_BFLOAT16, GMLP_NUM_BFLOAT16, empty, G_N_ELEMENTS (empty),
                    768, 2048);
  p = describe (&gemm);
  g_assert_cmpuint (p.n_products + p.n_zeroed, ==, 0);
  g_assert_false (gmlp_cuda_route_asks_sm90 (&p));
  assert_route (&p, &h200, "host-gemm=sm90", GMLP_CUDA_ROUTE_CUBLAS_LOOP);

  /* Sizes the executors' checks refuse afterwards (past G_MAXINT, or
   * negative): described before them, clamped, without overflow. */
  {
    const gint64 refused[] = { G_MAXINT64, G_MAXINT64, -5, 1 };

    gemm = host_gemm (GMLP_GEMM_FPROP, GMLP_NUM_BFLOAT16, GMLP_NUM_BFLOAT16, refused,
                      G_N_ELEMENTS (refused), 768, 2048);
    p = describe (&gemm);
    g_assert_cmpint (p.rows, ==, 2 * (gint64) G_MAXINT + 1);
    g_assert_cmpint (p.tiled_rows, ==, 2 * ((gint64) G_MAXINT / GMLP_CUDA_ROW_TILE * GMLP_CUDA_ROW_TILE));
  }
}

/* WGRAD: an empty sum is set to zero unless it accumulates, and products
 * that accumulate and products that do not differ in shape. A bias goes
 * with FPROP only. */
static void
test_describe_wgrad (void)
{
  const gint64 rows[] = { 0, 0, 64, 64 };
  const guint8 accumulate[] = { 0, 1, 0, 1 };
  GmlpBackendGemm gemm = host_gemm (GMLP_GEMM_WGRAD, GMLP_NUM_BFLOAT16, GMLP_NUM_FLOAT32,
                                    rows, G_N_ELEMENTS (rows), 768, 2048);
  gpointer tables[GMLP_CUDA_GROUPS_TABLES * MAX_GROUPS];
  GmlpCudaGroups groups;
  GmlpCudaRouteProduct p;

  gemm.accumulate = accumulate;
  gemm.bias = (GmlpBackendOperand) { .layout = GMLP_BACKEND_OPERAND_STRIDED, .dtype = GMLP_NUM_FLOAT32,
                                     .base = ADDRESS (0x60000000), .stride = 768 * 4 };
  p = describe_in (&gemm, tables, &groups);
  g_assert_null (groups.bias);
  g_assert_true (groups.accumulate == accumulate);
  g_assert_cmpuint (p.n_products, ==, 2);
  g_assert_cmpuint (p.n_zeroed, ==, 1);
  g_assert_cmpfloat (p.total_flop, ==, 2.0 * 128 * 768 * 2048);
  g_assert_false (p.uniform);
  g_assert_true (p.rows_aligned);
  p = with_sm90 (p, TRUE, NULL);
  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_SM90);
  assert_route (&p, &h200, "host-gemm=cublas", GMLP_CUDA_ROUTE_CUBLAS_LOOP);

  gemm.accumulate = NULL;
  p = describe (&gemm);
  g_assert_cmpuint (p.n_zeroed, ==, 2);
  g_assert_true (p.uniform);
  p = with_sm90 (p, TRUE, NULL);
  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_CUBLAS_BATCHED);

  gemm = host_gemm (GMLP_GEMM_FPROP, GMLP_NUM_BFLOAT16, GMLP_NUM_BFLOAT16, rows, G_N_ELEMENTS (rows),
                    768, 2048);
  gemm.bias = (GmlpBackendOperand) { .layout = GMLP_BACKEND_OPERAND_STRIDED, .dtype = GMLP_NUM_BFLOAT16,
                                     .base = ADDRESS (0x60000000), .stride = 768 * 2 };
  p = describe_in (&gemm, tables, &groups);
  g_assert_true (groups.bias[3] == ADDRESS (0x60000000 + 3 * 768 * 2));
  g_assert_cmpuint (p.n_products, ==, 2);
  g_assert_cmpuint (p.n_zeroed, ==, 0);
}

/* FP8 operands with host sizes: rows F1-F10 from descriptors. */
static void
test_describe_fp8 (void)
{
  const gint64 rows[] = { 32, 0, 64 };
  const gint64 ragged[] = { 100, 128 };
  const gint64 empty[] = { 0, 0 };
  GmlpBackendGemm gemm = fp8_gemm (GMLP_GEMM_FPROP, FALSE, rows, G_N_ELEMENTS (rows), 4096, 4096);
  gpointer tables[GMLP_CUDA_GROUPS_TABLES * MAX_GROUPS];
  GmlpCudaGroups groups;
  GmlpCudaRouteProduct p = describe_in (&gemm, tables, &groups);
  GmlpCudaRouteChoice c;

  /* Per-tensor scales: each group's scale, two products. */
  g_assert_true (groups.a_scale_inv[2] == ADDRESS (0x40000000 + 2 * sizeof (float)));
  g_assert_true (groups.b_scale_inv[1] == ADDRESS (0x50000000 + sizeof (float)));
  g_assert_cmpint (p.ab_dtype, ==, GMLP_NUM_FLOAT8_E4M3);
  g_assert_cmpint (p.c_dtype, ==, GMLP_NUM_BFLOAT16);
  g_assert_false (p.blockwise);
  g_assert_cmpuint (p.n_products, ==, 2);
  g_assert_cmpfloat (p.total_flop, ==, 2.0 * 96 * 4096 * 4096);
  g_assert_false (gmlp_cuda_route_may_dequantize (&gemm));
  /* F7-F8: two large products on cuBLASLt, which needs FP8 tensor
   * cores. */
  p = with_sm90 (p, TRUE, NULL);
  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_CUBLASLT);
  assert_route (&p, &h200, "host-gemm=sm90", GMLP_CUDA_ROUTE_SM90);
  p = with_sm90 (describe (&gemm), FALSE, not_sm90);
  c = choose (&p, &a100);
  g_assert_cmpint (c.route, ==, GMLP_CUDA_ROUTE_UNSUPPORTED);
  g_assert_true (c.reason == gmlp_cuda_route_no_fp8_tensor_cores);
  /* Only groups set to zero: no kernel to ask, and no tensor cores
   * needed. */
  gemm = fp8_gemm (GMLP_GEMM_WGRAD, FALSE, empty, G_N_ELEMENTS (empty), 4096, 4096);
  p = describe (&gemm);
  g_assert_cmpuint (p.n_products, ==, 0);
  g_assert_cmpuint (p.n_zeroed, ==, 2);
  g_assert_false (gmlp_cuda_route_asks_sm90 (&p));
  assert_route (&p, &a100, NULL, GMLP_CUDA_ROUTE_CUBLASLT);
  /* Scales missing: no scale tables (the executor refuses the call). */
  gemm = fp8_gemm (GMLP_GEMM_FPROP, FALSE, rows, G_N_ELEMENTS (rows), 4096, 4096);
  gemm.b.scale_inv = NULL;
  describe_in (&gemm, tables, &groups);
  g_assert_null (groups.a_scale_inv);
  g_assert_null (groups.b_scale_inv);

  /* F1-F2: blockwise WGRAD of groups not all of multiples of 16 rows. */
  gemm = fp8_gemm (GMLP_GEMM_WGRAD, TRUE, ragged, G_N_ELEMENTS (ragged), 4096, 2048);
  p = describe_in (&gemm, tables, &groups);
  g_assert_true (p.blockwise);
  g_assert_false (p.rows_aligned);
  g_assert_cmpint (groups.a_scales.depth_stride, ==, 4096);
  g_assert_true (gmlp_cuda_route_may_dequantize (&gemm));
  p = with_sm90 (p, FALSE, "the Hopper kernel's blockwise FP8 WGRAD of host sizes needs each a multiple of 16");
  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_SM90_PADDED);
  assert_route (&p, &h200, "device-gemm=portable", GMLP_CUDA_ROUTE_DEQUANTIZED);

  /* F3-F4: blockwise FPROP, the kernel's whatever the size, even with no
   * product to run (the kernel is asked); else dequantized, with its
   * reason. */
  gemm = fp8_gemm (GMLP_GEMM_FPROP, TRUE, empty, G_N_ELEMENTS (empty), 4096, 2048);
  p = describe (&gemm);
  g_assert_true (p.blockwise);
  g_assert_cmpuint (p.n_products, ==, 0);
  p = with_sm90 (p, TRUE, NULL);
  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_SM90);
  p = with_sm90 (describe (&gemm), FALSE, not_sm90);
  c = choose (&p, &l40);
  g_assert_cmpint (c.route, ==, GMLP_CUDA_ROUTE_DEQUANTIZED);
  g_assert_cmpstr (c.reason, ==, not_sm90);
  /* No group at all: nothing to multiply, nothing to refuse. */
  gemm.n_groups = 0;
  g_assert_false (gmlp_cuda_route_may_dequantize (&gemm));
}

/* Group sizes on the device: rows D1-D3. */
static void
test_describe_device (void)
{
  GmlpBackendGemm gemm = host_gemm (GMLP_GEMM_FPROP, GMLP_NUM_BFLOAT16, GMLP_NUM_BFLOAT16, NULL, 8,
                                    768, 2048);
  GmlpCudaRouteProduct p;
  GmlpCudaRouteChoice c;

  gemm.device_rows = ADDRESS (0x70000000);
  gemm.row_capacity = 4096;
  p = describe (&gemm);
  g_assert_true (p.device_sizes);
  g_assert_cmpuint (p.n_products, ==, 0);
  g_assert_cmpint (p.rows, ==, 0);
  g_assert_false (gmlp_cuda_route_may_dequantize (&gemm));
  p = with_sm90 (p, TRUE, NULL);
  assert_route (&p, &h200, "host-gemm=cublas", GMLP_CUDA_ROUTE_SM90);
  p = with_sm90 (describe (&gemm), FALSE, not_sm90);
  assert_route (&p, &a100, NULL, GMLP_CUDA_ROUTE_PORTABLE);

  gemm = fp8_gemm (GMLP_GEMM_WGRAD, TRUE, NULL, 8, 4096, 2048);
  gemm.device_rows = ADDRESS (0x70000000);
  gemm.row_capacity = 4096;
  p = describe (&gemm);
  g_assert_true (p.device_sizes);
  g_assert_true (p.blockwise);
  g_assert_true (gmlp_cuda_route_may_dequantize (&gemm));
  p = with_sm90 (p, TRUE, NULL);
  assert_route (&p, &h200, NULL, GMLP_CUDA_ROUTE_SM90);
  p = with_sm90 (describe (&gemm), FALSE, not_sm90);
  c = choose (&p, &l40);
  g_assert_cmpint (c.route, ==, GMLP_CUDA_ROUTE_DEQUANTIZED);
  g_assert_cmpstr (c.reason, ==, not_sm90);
}

/* Where gmlp_cuda_route_may_dequantize() says no, gemm_supported says
 * yes without asking the route: no answer of the kernel, tuning or GPU
 * makes the route refuse those descriptors. (FP8 with blockwise scales
 * and no group, which it says no to as well, has nothing to multiply: the
 * executor does nothing, whatever the route.) */
static void
test_may_dequantize (void)
{
  static const gint64 rows[] = { 100, 0, 128, 4000 };
  static const char * const tunings[] = { NULL, "device-gemm=portable", "host-gemm=sm90",
                                          "host-gemm=cublas", "row-tiles=off,batched=off" };
  const GmlpCudaDeviceProps *gpus[] = { &h200, &l40, &a100 };
  GmlpBackendGemm gemms[7];
  guint n = 0;

  for (GmlpGemmKind kind = GMLP_GEMM_FPROP; kind <= GMLP_GEMM_WGRAD; kind++)
    {
      gemms[n++] = host_gemm (kind, GMLP_NUM_BFLOAT16, GMLP_NUM_FLOAT32, rows, G_N_ELEMENTS (rows), 64, 4096);
      gemms[n++] = fp8_gemm (kind, FALSE, rows, G_N_ELEMENTS (rows), 64, 4096);
    }
  gemms[n] = host_gemm (GMLP_GEMM_DGRAD, GMLP_NUM_FLOAT32, GMLP_NUM_FLOAT32, NULL, 4, 64, 4096);
  gemms[n++].row_capacity = 8192;

  for (guint i = 0; i < n; i++)
    {
      g_assert_false (gmlp_cuda_route_may_dequantize (&gemms[i]));
      for (guint answer = 0; answer < 3; answer++)
        for (guint t = 0; t < G_N_ELEMENTS (tunings); t++)
          for (guint d = 0; d < G_N_ELEMENTS (gpus); d++)
            {
              GmlpCudaRouteProduct p = describe (&gemms[i]);
              GmlpCudaRoute r;

              p.sm90_covers = answer == 0;
              p.sm90_unpacked = answer == 2;
              p.sm90_reason = answer == 0 ? NULL : not_sm90;
              r = route (&p, gpus[d], tunings[t]);
              g_assert_cmpint (r, !=, GMLP_CUDA_ROUTE_DEQUANTIZED);
              g_assert_cmpint (r, !=, GMLP_CUDA_ROUTE_SM90_PADDED);
            }
    }
}

int
main (int    argc,
      char **argv)
{
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Gmlp/CudaRoute/helpers", test_helpers);
  g_test_add_func ("/Gmlp/CudaRoute/gemm/sm90", test_gemm_sm90);
  g_test_add_func ("/Gmlp/CudaRoute/gemm/sm90-not-taken", test_gemm_sm90_not_taken);
  g_test_add_func ("/Gmlp/CudaRoute/gemm/grouped", test_gemm_grouped);
  g_test_add_func ("/Gmlp/CudaRoute/gemm/batched", test_gemm_batched);
  g_test_add_func ("/Gmlp/CudaRoute/gemm/loop", test_gemm_loop);
  g_test_add_func ("/Gmlp/CudaRoute/gemm/forced", test_gemm_forced);
  g_test_add_func ("/Gmlp/CudaRoute/fp8/blockwise", test_fp8_blockwise);
  g_test_add_func ("/Gmlp/CudaRoute/fp8/per-tensor", test_fp8_per_tensor);
  g_test_add_func ("/Gmlp/CudaRoute/fp8/forced", test_fp8_forced);
  g_test_add_func ("/Gmlp/CudaRoute/device", test_device);
  g_test_add_func ("/Gmlp/CudaRoute/describe/host", test_describe_host);
  g_test_add_func ("/Gmlp/CudaRoute/describe/wgrad", test_describe_wgrad);
  g_test_add_func ("/Gmlp/CudaRoute/describe/fp8", test_describe_fp8);
  g_test_add_func ("/Gmlp/CudaRoute/describe/device", test_describe_device);
  g_test_add_func ("/Gmlp/CudaRoute/describe/may-dequantize", test_may_dequantize);

  return g_test_run ();
}
