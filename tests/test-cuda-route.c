/* test-cuda-route.c: the CUDA backend's route, without a GPU
 *
 * gmlp_cuda_route() is a pure function (libgmlp/backend/cuda/
 * gmlp-cuda-route.c, linked here alone): every row of docs/routes.md's
 * table, and the tuning's forced routes, from described products. The
 * rows are named as the table numbers them.
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

/* The statistics the executors' files fill with the route's helpers. */
static void
test_helpers (void)
{
  const gint64 rows[] = { 0, 127, 128, 300, 16 };
  gint64 total, tiled;

  gmlp_cuda_route_count_rows (rows, G_N_ELEMENTS (rows), &total, &tiled);
  g_assert_cmpint (total, ==, 571);
  g_assert_cmpint (tiled, ==, 128 + 256);
  g_assert_false (gmlp_cuda_route_rows_aligned (rows, G_N_ELEMENTS (rows)));
  g_assert_true (gmlp_cuda_route_rows_aligned (rows + 2, 1));
  g_assert_true (gmlp_cuda_route_rows_aligned (rows, 1));

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

  return g_test_run ();
}
