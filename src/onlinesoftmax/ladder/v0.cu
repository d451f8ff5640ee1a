// V0 (seed §3): one thread per row, the paper's Algorithm 3 run serially by that thread.
//   pass 1: for j: m' = max(m, x_j); d = d·e^(m - m') + e^(x_j - m')     read N
//   pass 2: y_j = e^(x_j - m) / d                                          read N, write N
// Global traffic per row: 2 reads + 1 write of N floats. A warp's 32 threads walk 32 different rows, so
// each load instruction touches 32 cache lines: no coalescing, the baseline only.
#include "common.cu"

namespace ladder {

constexpr int kV0Block = 32;  // 32 rows per block spreads M = 4096 rows over 128 of the H200's 132 SMs

__global__ void __launch_bounds__(kV0Block) online_softmax_v0(const float* __restrict__ x,
                                                              float* __restrict__ y, long long M, int N) {
    const int64_t row = static_cast<int64_t>(blockIdx.x) * kV0Block + threadIdx.x;
    if (row >= M) return;
    const float* xr = x + row_offset(row, N);
    float* yr = y + row_offset(row, N);
    MD s = md_identity();
    for (int i = 0; i < N; ++i) s = md_push(s, xr[i]);   // 1. (m, d) in one read
    const float inv_d = 1.f / s.d;
    for (int i = 0; i < N; ++i) yr[i] = ex(xr[i] - s.m) * inv_d;   // 2. normalise: read + write
}

}  // namespace ladder

extern "C" int ladder_v0(const float* x, float* y, long long M, int N, void* stream, int device) {
    if (int e = ladder::check_args(x, y, M, N, false)) return e;
    if (M == 0 || N == 0) return 0;
    if (cudaError_t e = cudaSetDevice(device)) return static_cast<int>(e);
    const long long grid = (M + ladder::kV0Block - 1) / ladder::kV0Block;
    if (grid > 0x7fffffffLL) return static_cast<int>(cudaErrorInvalidConfiguration);
    ladder::online_softmax_v0<<<static_cast<unsigned>(grid), ladder::kV0Block, 0,
                                static_cast<cudaStream_t>(stream)>>>(x, y, M, N);
    return ladder::launched();
}

extern "C" int ladder_v0_info(int* block, int* regs, int* local_bytes, int* blocks_per_sm) {
    *block = ladder::kV0Block;
    return ladder::kernel_info(ladder::online_softmax_v0, ladder::kV0Block, regs, local_bytes, blocks_per_sm);
}
