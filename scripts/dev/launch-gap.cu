// launch-gap: the device's idle time between two launches of a 132-CTA
// kernel that spins 20 µs, with and without an event pair around each
// launch, by launch property (parameter size, dynamic shared memory,
// programmatic stream serialisation): what an event-timed benchmark adds
// to every call (the twenty-fifth session of the measurement history,
// git show 2165ca8:docs/performance.md).
//
//   nvcc -O2 -gencode=arch=compute_90a,code=sm_90a -o /tmp/launch-gap scripts/dev/launch-gap.cu
//
// SPDX-License-Identifier: LGPL-2.1-or-later
#include <cstdio>
#include <vector>
#include <algorithm>
#define CK(x) do { cudaError_t err_ = (x); if (err_ != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(err_)); exit(1); } } while (0)

template <int kBytes> struct Params { unsigned long long *times; int iter; long long spin_ns; char pad[kBytes]; };

__device__ __forceinline__ unsigned long long gt() { unsigned long long t; asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t)); return t; }

template <int kBytes>
__global__ void __launch_bounds__(384, 1) spin(Params<kBytes> p) {
  extern __shared__ char smem[];
  asm volatile("griddepcontrol.wait;" ::: "memory");
  unsigned long long t0 = gt();
  if (threadIdx.x == 1000) smem[0] = (char) p.pad[0];
  while (gt() - t0 < (unsigned long long) p.spin_ns) {}
  if (threadIdx.x == 0) {
    atomicMin(&p.times[2 * p.iter], t0);
    atomicMax(&p.times[2 * p.iter + 1], gt());
  }
}

template <int kBytes>
void run(const char *name, int smem, bool pdl, bool events, int grid) {
  const int n = 200;
  unsigned long long *times;
  CK(cudaMalloc(&times, 2 * n * 8));
  std::vector<unsigned long long> init(2 * n);
  for (int i = 0; i < n; i++) { init[2 * i] = ~0ull; init[2 * i + 1] = 0; }
  CK(cudaMemcpy(times, init.data(), 2 * n * 8, cudaMemcpyHostToDevice));
  CK(cudaFuncSetAttribute(spin<kBytes>, cudaFuncAttributeMaxDynamicSharedMemorySize, 232448));
  cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  std::vector<cudaEvent_t> ev(2 * n);
  for (auto &evt : ev) CK(cudaEventCreate(&evt));
  for (int i = 0; i < n; i++) {
    Params<kBytes> p = {}; p.times = times; p.iter = i; p.spin_ns = 20000;
    cudaLaunchConfig_t c = {}; cudaLaunchAttribute a[1];
    a[0].id = cudaLaunchAttributeProgrammaticStreamSerialization; a[0].val.programmaticStreamSerializationAllowed = 1;
    c.gridDim = dim3(grid); c.blockDim = dim3(384); c.dynamicSmemBytes = smem; c.stream = st;
    c.attrs = a; c.numAttrs = pdl ? 1 : 0;
    if (events) CK(cudaEventRecord(ev[2 * i], st));
    CK(cudaLaunchKernelEx(&c, spin<kBytes>, p));
    if (events) CK(cudaEventRecord(ev[2 * i + 1], st));
  }
  CK(cudaStreamSynchronize(st));
  CK(cudaMemcpy(init.data(), times, 2 * n * 8, cudaMemcpyDeviceToHost));
  std::vector<double> gaps, ev_ms;
  for (int i = 20; i < n; i++) gaps.push_back((double)(init[2 * i] - init[2 * i - 1]) / 1000.0);
  if (events) for (int i = 20; i < n; i++) { float ms; CK(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1])); ev_ms.push_back(ms * 1000 - 20); }
  std::sort(gaps.begin(), gaps.end()); std::sort(ev_ms.begin(), ev_ms.end());
  printf("%-34s params %5d smem %6d pdl %d events %d grid %3d: gap med %6.2f us  p10 %6.2f p90 %6.2f  event-time minus spin %6.2f\n",
         name, (int) sizeof(Params<kBytes>), smem, pdl, events, grid, gaps[gaps.size() / 2], gaps[gaps.size() / 10], gaps[gaps.size() * 9 / 10],
         events ? ev_ms[ev_ms.size() / 2] : 0.0);
  for (auto &evt : ev) CK(cudaEventDestroy(evt));
  CK(cudaFree(times)); CK(cudaStreamDestroy(st));
}

int main() {
  for (int rep = 0; rep < 2; rep++)
  for (int ev = 0; ev < 2; ev++) {
    run<8>("small", 0, false, ev, 132);
    run<8>("small pdl", 0, true, ev, 132);
    run<8>("small smem", 227 * 1024, false, ev, 132);
    run<8>("small smem pdl", 227 * 1024, true, ev, 132);
    run<2800>("big", 0, false, ev, 132);
    run<2800>("big smem pdl", 227 * 1024, true, ev, 132);
    run<2800>("big smem", 227 * 1024, false, ev, 132);
    run<8>("small smem pdl grid128", 227 * 1024, true, ev, 128);
  }
}
