// launch-cost: the host's time per call of what a layer's step enqueues,
// with the device kept busy (a long kernel first, so that no call waits
// for the device and the queue never fills): the floor under gmlp-bench's
// host_us and gmlp-host-step. Per call, the median of batches of 64 calls:
//
//   - cudaLaunchKernel of an empty kernel, 16-byte and 1 KB parameters;
//   - cudaLaunchKernelEx with a cluster dimension and 1 KB parameters (the
//     Hopper GEMM's launch), and the same after cudaFuncSetAttribute;
//   - cudaMemsetAsync of 8 bytes, cudaEventRecord;
//   - cublasGemmEx of a small BF16 product into FP32 (the router's gate),
//     and cublasLtMatmul of the same with its descriptors and algorithm
//     made once.
//
//   nvcc -O2 -gencode=arch=compute_90a,code=sm_90a -o /tmp/launch-cost \
//     scripts/dev/launch-cost.cu -lcublas -lcublasLt
//
// SPDX-License-Identifier: LGPL-2.1-or-later
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>

#define CK(x) do { auto err_ = (x); if ((int) err_ != 0) { printf("%s: error %d\n", #x, (int) err_); exit(1); } } while (0)

template <int kBytes> struct Params { char pad[kBytes]; };

template <int kBytes>
__global__ void empty_kernel(Params<kBytes> p) { if (p.pad[0] == 1 && threadIdx.x == 1000) asm volatile("trap;"); }

template <int kBytes>
__global__ void __cluster_dims__(2, 1, 1) cluster_kernel(Params<kBytes> p) { if (p.pad[0] == 1 && threadIdx.x == 1000) asm volatile("trap;"); }

__global__ void spin_kernel(long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < (unsigned long long) ns);
}

static cudaStream_t stream;

// The median over batches of the host µs per call of f, each batch behind
// a spin kernel long enough to cover it.
static double per_call(const char *name, const std::function<void()> &f) {
  const int batch = 64, rounds = 30;
  std::vector<double> us;
  for (int r = 0; r < rounds; r++) {
    spin_kernel<<<1, 32, 0, stream>>>(3000000);
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < batch; i++) f();
    auto t1 = std::chrono::steady_clock::now();
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / batch);
    CK(cudaStreamSynchronize(stream));
  }
  std::sort(us.begin(), us.end());
  printf("{\"what\":\"%s\",\"host_us\":%.2f,\"min_us\":%.2f}\n", name, us[us.size() / 2], us[0]);
  return us[us.size() / 2];
}

int main() {
  CK(cudaSetDevice(0));
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Params<16> p16 = {};
  Params<1024> p1k = {};

  per_call("cudaLaunchKernel, 16 B", [&] { empty_kernel<16><<<132, 128, 0, stream>>>(p16); });
  per_call("cudaLaunchKernel, 1 KB", [&] { empty_kernel<1024><<<132, 128, 0, stream>>>(p1k); });
  cudaLaunchConfig_t c = {};
  c.gridDim = dim3(132); c.blockDim = dim3(384); c.dynamicSmemBytes = 200 * 1024; c.stream = stream;
  CK(cudaFuncSetAttribute(cluster_kernel<1024>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  per_call("cudaLaunchKernelEx, cluster 2, 1 KB, 200 KB smem",
           [&] { CK(cudaLaunchKernelEx(&c, cluster_kernel<1024>, p1k)); });
  per_call("the same after cudaFuncSetAttribute each call", [&] {
    CK(cudaFuncSetAttribute(cluster_kernel<1024>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
    CK(cudaLaunchKernelEx(&c, cluster_kernel<1024>, p1k));
  });
  int dev = 0, sms = 0;
  per_call("cudaGetDevice + cudaDeviceGetAttribute", [&] {
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  });
  per_call("cudaSetDevice (already current)", [&] { CK(cudaSetDevice(0)); });
  void *scratch;
  CK(cudaMalloc(&scratch, 64 << 20));
  per_call("cudaMemsetAsync, 8 B", [&] { CK(cudaMemsetAsync(scratch, 0, 8, stream)); });
  cudaEvent_t ev;
  CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  per_call("cudaEventRecord", [&] { CK(cudaEventRecord(ev, stream)); });

  // The router's gate at shape A: x (8192 × 4096 BF16) times three parts of
  // W (192 × 4096 BF16), into FP32 (8192 × 192).
  const int m = 8192, n = 192, k = 4096;
  void *x, *w, *y;
  CK(cudaMalloc(&x, (size_t) m * k * 2));
  CK(cudaMalloc(&w, (size_t) n * k * 2));
  CK(cudaMalloc(&y, (size_t) m * n * 4));
  cublasHandle_t h;
  CK(cublasCreate(&h));
  CK(cublasSetStream(h, stream));
  const float one = 1.0f, zero = 0.0f;
  // Column-major: y^T (n × m) = W (n × k, stored k-major: op T) · x^T (k × m).
  per_call("cublasGemmEx BF16 -> FP32 (8192 x 192 x 4096)", [&] {
    CK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, w, CUDA_R_16BF, k, x, CUDA_R_16BF, k, &zero,
                    y, CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  });
  cublasLtHandle_t lt;
  CK(cublasLtCreate(&lt));
  cublasLtMatmulDesc_t desc;
  CK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  cublasLtMatrixLayout_t la, lb, lc;
  CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, k, n, k));
  CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, m, k));
  CK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, n, m, n));
  cublasLtMatmulPreference_t pref;
  CK(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws_bytes = 32 << 20;
  void *ws; CK(cudaMalloc(&ws, ws_bytes));
  CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
  cublasLtMatmulHeuristicResult_t heur;
  int found = 0;
  CK(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &heur, &found));
  if (found > 0)
    per_call("cublasLtMatmul, descriptors and algorithm kept", [&] {
      CK(cublasLtMatmul(lt, desc, &one, w, la, x, lb, &zero, y, lc, y, lc, &heur.algo, ws, ws_bytes, stream));
    });
  per_call("cublasLtMatmulAlgoGetHeuristic", [&] {
    CK(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &heur, &found));
  });
  CK(cudaDeviceSynchronize());
  return 0;
}
