// V1 (seed §4): one block per row; each thread runs Algorithm 3 over a strided slice of the row, then
// the threads' states merge with ⊕ in two levels: warp shuffle, then shared memory across warps.
//   pass 1: thread t: (m, d) over x_t, x_{t+B}, ...; block ⊕            read N (coalesced)
//   pass 2: y_j = e^(x_j - m) / d                                        read N, write N
// Fixes in common.cu: identity merge without NaN (ref), power-of-two shuffle widths with identity
// padding (BLOCK = 96 or 192 gives 3 or 6 warps and stays right), 64-bit row offsets.
#include "common.cu"

namespace ladder {

template <int BLOCK>
__global__ void __launch_bounds__(BLOCK) online_softmax_v1(const float* __restrict__ x, float* __restrict__ y,
                                                           int N) {
    __shared__ float sm[BLOCK / 32], sd[BLOCK / 32];
    const int64_t row = blockIdx.x;
    const float* xr = x + row_offset(row, N);
    float* yr = y + row_offset(row, N);
    MD s = md_identity();
    for (int i = threadIdx.x; i < N; i += BLOCK) s = md_push(s, xr[i]);   // 1. thread's (m, d)
    s = block_reduce<BLOCK>(s, sm, sd);                                    // 2. row's (m, d)
    const float inv_d = 1.f / s.d;
    for (int i = threadIdx.x; i < N; i += BLOCK) yr[i] = ex(xr[i] - s.m) * inv_d;   // 3. normalise
}

template <int BLOCK>
int launch_v1(const float* x, float* y, long long M, int N, cudaStream_t st) {
    online_softmax_v1<BLOCK><<<static_cast<unsigned>(M), BLOCK, 0, st>>>(x, y, N);
    return launched();
}

#define LADDER_V1_BLOCKS(X) X(64) X(96) X(128) X(192) X(256) X(512) X(1024)

}  // namespace ladder

extern "C" int ladder_v1(const float* x, float* y, long long M, int N, int block, void* stream, int device) {
    if (int e = ladder::check_args(x, y, M, N, false)) return e;
    if (M == 0 || N == 0) return 0;
    if (M > 0x7fffffffLL) return static_cast<int>(cudaErrorInvalidConfiguration);
    if (cudaError_t e = cudaSetDevice(device)) return static_cast<int>(e);
    const auto st = static_cast<cudaStream_t>(stream);
    switch (block) {
#define X(B) case B: return ladder::launch_v1<B>(x, y, M, N, st);
        LADDER_V1_BLOCKS(X)
#undef X
        default: return static_cast<int>(cudaErrorInvalidValue);
    }
}

extern "C" int ladder_v1_info(int block, int* regs, int* local_bytes, int* blocks_per_sm) {
    switch (block) {
#define X(B) case B: return ladder::kernel_info(ladder::online_softmax_v1<B>, B, regs, local_bytes, blocks_per_sm);
        LADDER_V1_BLOCKS(X)
#undef X
        default: return static_cast<int>(cudaErrorInvalidValue);
    }
}
