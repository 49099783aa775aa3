// cublas_loop_steady: the per-expert cublasGemmEx loop of
// ../shared/bench/cublas_anchor.cu ("cuBLAS loop"), timed as gmlp-bench
// times its ops, so that libgmlp's host-sizes fprop can be compared with it
// like for like.
//
// cublas_anchor takes the median of 30 calls after 10 warm-up calls, which
// can run at the boost clock; gmlp-bench first runs the op back to back for
// 400 ms, which brings the GPU to its power limit (a lower, steady clock),
// then takes the median of 100 calls. Both are printed here, from the same
// problems: the anchor's shapes, its balanced and skewed splits, its fill,
// its cublasGemmEx call and operand layout, a 32 MiB workspace.
//
//   [CLS_MATH=disallow] cublas_loop_steady [-s|--shape NAME] [-n|--iters N]
//
// CLS_MATH=disallow sets libgmlp's cuBLAS math mode (no split-K sums in the
// 16-bit output type). To tell what else could part libgmlp's forward from
// this loop: CLS_FILL=gmlp draws the operands as gmlp-bench does (x from
// [-1, 1), W from ±1/sqrt(K), libgmlp's generator) instead of the anchor's
// fill; CLS_ALLOC=pool allocates y from the stream-ordered pool on every
// call and frees it after, as a libgmlp forward does with its output.
// CLS_CHUNK=C cuts each group's rows into chunks of C rows (0: the balanced
// size), runs every whole chunk in one cublasGemmBatchedEx call and loops
// over the rest: what batching equal products gains over the loop.
// CLS_WARM_MS=T runs the op back to back for T ms before the steady timing
// instead of gmlp-bench's 400: how far the clock still falls after that.
// One JSON line per shape and routing; "cublas_loop_steady_tflops" is
// gmlp-bench's method, "cublas_loop_short_tflops" the anchor's.
//
// SPDX-License-Identifier: LGPL-2.1-or-later

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "gmlp-numeric.h"

#define CK(x) check_cuda((x), #x, __LINE__)
#define CB(x) check_cublas((x), #x, __LINE__)

static void check_cuda(cudaError_t e, const char *what, int line) {
  if (e != cudaSuccess) {
    fprintf(stderr, "cublas_loop_steady: line %d: %s: %s\n", line, what, cudaGetErrorString(e));
    exit(EXIT_FAILURE);
  }
}

static void check_cublas(cublasStatus_t st, const char *what, int line) {
  if (st != CUBLAS_STATUS_SUCCESS) {
    fprintf(stderr, "cublas_loop_steady: line %d: %s: %s\n", line, what, cublasGetStatusName(st));
    exit(EXIT_FAILURE);
  }
}

struct Shape {
  const char *name;
  int E, M, K, N;
};

static const Shape shapes[] = {
    {"mixtral-fc1", 8, 16384, 4096, 14336},
    {"dsv3-fc1", 32, 32768, 7168, 2048},
    {"qwen3-fc1", 128, 65536, 2048, 768},
    {"small-e64", 64, 8192, 1024, 1024},
};

// gmlp-bench's WARM_UP_US and the three host-timed calls before it.
static const long kWarmUpMs = 400;
static const int kHostCalls = 3;
// cublas_anchor's timeit().
static const int kShortWarm = 10, kShortTimed = 30;
// Idle time before the short timing, so that it starts from a clock near
// boost as in cublas_anchor, not from the power limit the previous steady
// timing left the GPU at.
static const auto kRest = std::chrono::milliseconds(1000);

// cublas_anchor's fill, so the data (and the power they draw) are the same.
__global__ void fill(__nv_bfloat16 *p, size_t n, unsigned seed, float scale) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  for (; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995;
    h ^= h >> 15;
    p[i] = __float2bfloat16(((h & 0xffff) / 65535.0f - 0.5f) * scale);
  }
}

// gmlp_grouped_tensor_fill_random()'s values: uniform in [-scale, scale).
__global__ void fill_gmlp(__nv_bfloat16 *p, size_t n, uint64_t seed, float scale) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  for (; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = __float2bfloat16(gmlp_num_random_uniform(seed, i, scale));
}

static bool env_is(const char *name, const char *value) {
  const char *v = getenv(name);
  return v != nullptr && !strcmp(v, value);
}

// Balanced (remainder on expert 0, as gmlp-bench), or cublas_anchor's skewed
// split: same generator, multiples of 16, remainder on expert 0.
static std::vector<int> split_rows(const Shape &s, bool skew) {
  std::vector<int> m(s.E);
  if (!skew) {
    for (auto &v : m) v = s.M / s.E;
    m[0] += s.M - (s.M / s.E) * s.E;
    return m;
  }
  double tot = 0;
  std::vector<double> w(s.E);
  unsigned x = 12345;
  for (auto &v : w) {
    x = x * 1103515245u + 12345u;
    v = 1.0 + ((x >> 8) % 1000) / 250.0;
    tot += v;
  }
  int acc = 0;
  for (int i = 0; i < s.E; i++) {
    m[i] = (int)(w[i] / tot * s.M / 16) * 16;
    acc += m[i];
  }
  m[0] += s.M - acc;
  return m;
}

static float elapsed_ms(cudaEvent_t a, cudaEvent_t b) {
  float ms;
  CK(cudaEventElapsedTime(&ms, a, b));
  return ms;
}

static float median(std::vector<float> t) {
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// cublas_anchor's timeit(): 10 calls, then 30 each between two events and
// waited for.
template <class F> static float time_short(cudaStream_t st, F f) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < kShortWarm; i++) f();
  std::vector<float> t;
  for (int r = 0; r < kShortTimed; r++) {
    CK(cudaEventRecord(a, st));
    f();
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    t.push_back(elapsed_ms(a, b));
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return median(t);
}

// gmlp-bench's time_op(): three calls one at a time on an idle device, the
// op back to back for 400 ms (waiting every fourth call, so the host stays
// a few calls ahead at most), then n calls queued back to back, each
// between two events of its own (as gmlp_event_new_recorded makes them),
// and the median.
template <class F> static float time_steady(cudaStream_t st, int n, long warm_ms, F f) {
  const auto warm_up = std::chrono::milliseconds(warm_ms);
  for (int i = 0; i < kHostCalls; i++) {
    CK(cudaStreamSynchronize(st));
    f();
  }
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; std::chrono::steady_clock::now() - start < warm_up; i++) {
    f();
    if (i % 4 == 3) CK(cudaStreamSynchronize(st));
  }
  CK(cudaStreamSynchronize(st));

  std::vector<cudaEvent_t> ev(2 * n);
  for (int i = 0; i < n; i++) {
    CK(cudaEventCreateWithFlags(&ev[2 * i], cudaEventDefault));
    CK(cudaEventRecord(ev[2 * i], st));
    f();
    CK(cudaEventCreateWithFlags(&ev[2 * i + 1], cudaEventDefault));
    CK(cudaEventRecord(ev[2 * i + 1], st));
  }
  CK(cudaStreamSynchronize(st));
  std::vector<float> t(n);
  for (int i = 0; i < n; i++) t[i] = elapsed_ms(ev[2 * i], ev[2 * i + 1]);
  for (auto e : ev) CK(cudaEventDestroy(e));
  return median(t);
}

static void usage(FILE *f) {
  fprintf(f, "usage: cublas_loop_steady [-s|--shape NAME] [-n|--iters N]\n");
}

int main(int argc, char **argv) {
  const char *only = nullptr;
  int iters = 100;  // gmlp-bench's default
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = nullptr;
    bool shape = false, n = false;
    if (!strcmp(a, "-s") || !strcmp(a, "--shape")) shape = true, v = i + 1 < argc ? argv[++i] : nullptr;
    else if (!strncmp(a, "--shape=", 8)) shape = true, v = a + 8;
    else if (!strcmp(a, "-n") || !strcmp(a, "--iters")) n = true, v = i + 1 < argc ? argv[++i] : nullptr;
    else if (!strncmp(a, "--iters=", 8)) n = true, v = a + 8;
    else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return EXIT_SUCCESS; }
    if ((!shape && !n) || v == nullptr) { usage(stderr); return EXIT_FAILURE; }
    if (shape) only = v;
    else {
      char *end;
      long l = strtol(v, &end, 10);
      if (*v == '\0' || *end != '\0' || l < 1 || l > 1000000) {
        fprintf(stderr, "cublas_loop_steady: --iters must be a positive integer\n");
        return EXIT_FAILURE;
      }
      iters = (int)l;
    }
  }
  bool any = false;
  for (auto &s : shapes) any |= only == nullptr || !strcmp(only, s.name);
  if (!any) {
    fprintf(stderr, "cublas_loop_steady: no shape named %s\n", only);
    return EXIT_FAILURE;
  }

  int dev;
  cudaDeviceProp prop;
  CK(cudaGetDevice(&dev));
  CK(cudaGetDeviceProperties(&prop, dev));
  // One non-blocking stream with the handle on it, as libgmlp's device;
  // cublasSetStream() puts back cuBLAS's own workspace, so ours comes after.
  cudaStream_t st;
  cublasHandle_t h;
  void *ws;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  CB(cublasCreate(&h));
  CB(cublasSetStream(h, st));
  CK(cudaMalloc(&ws, 32 << 20));
  CB(cublasSetWorkspace(h, ws, 32 << 20));
  // CLS_MATH (see the top): to tell the math mode's effect from the timing
  // method's.
  const bool disallow = env_is("CLS_MATH", "disallow");
  const bool gmlp_fill = env_is("CLS_FILL", "gmlp"), pool = env_is("CLS_ALLOC", "pool");
  const char *chunk_env = getenv("CLS_CHUNK"), *warm_env = getenv("CLS_WARM_MS");
  long warm_ms = kWarmUpMs;
  if (warm_env != nullptr) {
    char *end;
    warm_ms = strtol(warm_env, &end, 10);
    if (*warm_env == '\0' || *end != '\0' || warm_ms < 0 || warm_ms > 600000) {
      fprintf(stderr, "cublas_loop_steady: CLS_WARM_MS must be a number of milliseconds\n");
      return EXIT_FAILURE;
    }
  }
  // CLS_CHUNK's rows; 0 (or not a positive number) means each shape's balanced size.
  const int chunk_rows = chunk_env == nullptr ? -1 : std::max(atoi(chunk_env), 0);
  if (chunk_env != nullptr && pool) {
    fprintf(stderr, "cublas_loop_steady: CLS_CHUNK and CLS_ALLOC=pool do not combine\n");
    return EXIT_FAILURE;
  }
  // libgmlp's pool (gmlp-cuda-backend.c): its own, keeping what is freed.
  cudaMemPool_t mem_pool;
  cudaMemPoolProps pool_props = {};
  uint64_t keep_all = UINT64_MAX;
  pool_props.allocType = cudaMemAllocationTypePinned;
  pool_props.location.type = cudaMemLocationTypeDevice;
  pool_props.location.id = dev;
  CK(cudaMemPoolCreate(&mem_pool, &pool_props));
  CK(cudaMemPoolSetAttribute(mem_pool, cudaMemPoolAttrReleaseThreshold, &keep_all));
  if (disallow)
    CB(cublasSetMathMode(h, (cublasMath_t)(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));

  for (auto &s : shapes) {
    if (only != nullptr && strcmp(only, s.name)) continue;
    __nv_bfloat16 *x, *w, *y_fixed;
    CK(cudaMalloc(&x, (size_t)s.M * s.K * 2));
    CK(cudaMalloc(&w, (size_t)s.E * s.N * s.K * 2));
    CK(cudaMalloc(&y_fixed, (size_t)s.M * s.N * 2));
    if (gmlp_fill) {
      // gmlp-bench: x with seed 1, scale 1; the layer's weights with seed 0, ±1/sqrt(K).
      fill_gmlp<<<1024, 256, 0, st>>>(x, (size_t)s.M * s.K, 1, 1.f);
      CK(cudaGetLastError());
      fill_gmlp<<<1024, 256, 0, st>>>(w, (size_t)s.E * s.N * s.K, 0, 1.f / sqrtf((float)s.K));
    } else {
      fill<<<1024, 256, 0, st>>>(x, (size_t)s.M * s.K, 1, 2.f);
      CK(cudaGetLastError());
      fill<<<1024, 256, 0, st>>>(w, (size_t)s.E * s.N * s.K, 2, 0.04f);
    }
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(st));
    double flops = 2.0 * s.M * s.N * s.K;

    for (int skew = 0; skew < 2; skew++) {
      std::vector<int> m = split_rows(s, skew);
      // CLS_CHUNK: the whole chunks' A, B and C pointers in one device table.
      const int chunk = chunk_rows == 0 ? s.M / s.E : chunk_rows;
      std::vector<const void *> weights, inputs, outputs;
      struct Rest { int e; size_t row0; int rows; };
      std::vector<Rest> rest;
      size_t row0 = 0;
      for (int e = 0; e < s.E; e++) {
        int done = 0;
        for (; chunk > 0 && done + chunk <= m[e]; done += chunk) {
          weights.push_back(w + (size_t)e * s.N * s.K);
          inputs.push_back(x + (row0 + done) * s.K);
          outputs.push_back(y_fixed + (row0 + done) * s.N);
        }
        if (m[e] > done) rest.push_back({e, row0 + done, m[e] - done});
        row0 += m[e];
      }
      const size_t batch = weights.size();
      std::vector<const void *> table(weights);
      table.insert(table.end(), inputs.begin(), inputs.end());
      table.insert(table.end(), outputs.begin(), outputs.end());
      void **device_table = nullptr;
      if (batch > 0) {
        CK(cudaMalloc(&device_table, table.size() * sizeof(void *)));
        CK(cudaMemcpy(device_table, table.data(), table.size() * sizeof(void *), cudaMemcpyHostToDevice));
      }
      // cublas_anchor's loop1: y_e = x_e W_e^T, row-major, empty experts
      // skipped. Without CLS_CHUNK, rest holds every group that has rows.
      auto loop = [&] {
        const float one = 1.f, zero = 0.f;
        __nv_bfloat16 *y = y_fixed;
        if (pool) CK(cudaMallocFromPoolAsync((void **)&y, (size_t)s.M * s.N * 2, mem_pool, st));
        if (batch > 0)
          CB(cublasGemmBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, s.N, chunk, s.K, &one,
                                 (const void *const *)device_table, CUDA_R_16BF, s.K,
                                 (const void *const *)(device_table + batch), CUDA_R_16BF, s.K, &zero,
                                 device_table + 2 * batch, CUDA_R_16BF, s.N, (int)batch, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT));
        for (auto &q : rest)
          CB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, s.N, q.rows, s.K, &one, w + (size_t)q.e * s.N * s.K,
                          CUDA_R_16BF, s.K, x + q.row0 * s.K, CUDA_R_16BF, s.K, &zero, y + q.row0 * s.N,
                          CUDA_R_16BF, s.N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        if (pool) CK(cudaFreeAsync(y, st));
      };
      CK(cudaStreamSynchronize(st));
      std::this_thread::sleep_for(kRest);
      float short_ms = time_short(st, loop);
      float steady_ms = time_steady(st, iters, warm_ms, loop);
      printf("{\"bench\":\"cublas-loop-steady\",\"device\":\"%s\",\"shape\":\"%s\",\"E\":%d,\"M\":%d,\"K\":%d,"
             "\"N\":%d,\"skew\":%d,\"math\":\"%s\",\"fill\":\"%s\",\"y\":\"%s\",\"chunk\":%d,\"warm_ms\":%ld,\"iters\":%d,\"steady_ms\":%.4f,\"short_ms\":%.4f,"
             "\"cublas_loop_steady_tflops\":%.1f,\"cublas_loop_short_tflops\":%.1f}\n",
             prop.name, s.name, s.E, s.M, s.K, s.N, skew, disallow ? "disallow-reduced" : "default",
             gmlp_fill ? "gmlp" : "anchor", pool ? "pool" : "fixed", chunk, warm_ms, iters, steady_ms, short_ms,
             flops / steady_ms / 1e9, flops / short_ms / 1e9);
      fflush(stdout);
      if (device_table != nullptr) CK(cudaFree(device_table));
    }
    CK(cudaFree(x));
    CK(cudaFree(w));
    CK(cudaFree(y_fixed));
  }
  CB(cublasDestroy(h));
  CK(cudaMemPoolDestroy(mem_pool));
  CK(cudaFree(ws));
  CK(cudaStreamDestroy(st));
  return EXIT_SUCCESS;
}
