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
// 16-bit output type).
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
static const auto kWarmUp = std::chrono::milliseconds(400);
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
template <class F> static float time_steady(cudaStream_t st, int n, F f) {
  for (int i = 0; i < kHostCalls; i++) {
    CK(cudaStreamSynchronize(st));
    f();
  }
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; std::chrono::steady_clock::now() - start < kWarmUp; i++) {
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
  const char *math = getenv("CLS_MATH");
  const bool disallow = math != nullptr && !strcmp(math, "disallow");
  if (disallow)
    CB(cublasSetMathMode(h, (cublasMath_t)(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));

  for (auto &s : shapes) {
    if (only != nullptr && strcmp(only, s.name)) continue;
    __nv_bfloat16 *x, *w, *y;
    CK(cudaMalloc(&x, (size_t)s.M * s.K * 2));
    CK(cudaMalloc(&w, (size_t)s.E * s.N * s.K * 2));
    CK(cudaMalloc(&y, (size_t)s.M * s.N * 2));
    fill<<<1024, 256, 0, st>>>(x, (size_t)s.M * s.K, 1, 2.f);
    CK(cudaGetLastError());
    fill<<<1024, 256, 0, st>>>(w, (size_t)s.E * s.N * s.K, 2, 0.04f);
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(st));
    double flops = 2.0 * s.M * s.N * s.K;

    for (int skew = 0; skew < 2; skew++) {
      std::vector<int> m = split_rows(s, skew);
      // cublas_anchor's loop1: y_e = x_e W_e^T, row-major, empty experts skipped.
      auto loop = [&] {
        const float one = 1.f, zero = 0.f;
        size_t r = 0;
        for (int e = 0; e < s.E; e++) {
          if (m[e])
            CB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, s.N, m[e], s.K, &one, w + (size_t)e * s.N * s.K,
                            CUDA_R_16BF, s.K, x + r * s.K, CUDA_R_16BF, s.K, &zero, y + r * s.N, CUDA_R_16BF,
                            s.N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
          r += m[e];
        }
      };
      CK(cudaStreamSynchronize(st));
      std::this_thread::sleep_for(kRest);
      float short_ms = time_short(st, loop);
      float steady_ms = time_steady(st, iters, loop);
      printf("{\"bench\":\"cublas-loop-steady\",\"device\":\"%s\",\"shape\":\"%s\",\"E\":%d,\"M\":%d,\"K\":%d,"
             "\"N\":%d,\"skew\":%d,\"math\":\"%s\",\"iters\":%d,\"steady_ms\":%.4f,\"short_ms\":%.4f,"
             "\"cublas_loop_steady_tflops\":%.1f,\"cublas_loop_short_tflops\":%.1f}\n",
             prop.name, s.name, s.E, s.M, s.K, s.N, skew, disallow ? "disallow-reduced" : "default", iters, steady_ms, short_ms,
             flops / steady_ms / 1e9, flops / short_ms / 1e9);
      fflush(stdout);
    }
    CK(cudaFree(x));
    CK(cudaFree(w));
    CK(cudaFree(y));
  }
  CB(cublasDestroy(h));
  CK(cudaFree(ws));
  CK(cudaStreamDestroy(st));
  return EXIT_SUCCESS;
}
