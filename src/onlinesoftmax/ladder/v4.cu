// V4 (seed §7): V2's two passes, but a fixed grid of resident blocks walks the rows (grid stride)
// instead of one block per row.
//   grid = min(M, SMs × resident blocks per SM) (occupancy API; the seed used 4 × SMs)
//   row loop: pass 1 (m, d), read N; block ⊕; pass 2, read N, write N        — as V2
// FIX (seed: `row * N` in int, float4 on misaligned rows): 64-bit row offsets, split_row (common.cu).
// The seed ends each row with __syncthreads() so the next row's warp leaders cannot overwrite the
// shared-memory slots another warp is still reading; here rows alternate between two slot arrays, and the
// barrier inside the next row's reduction orders the reuse, so there is one barrier per row, not two.
#include "common.cu"

namespace ladder {

constexpr int kV4Block = 256;

template <int BLOCK>
__global__ void __launch_bounds__(BLOCK) online_softmax_v4(const float* __restrict__ x, float* __restrict__ y,
                                                           long long M, int N) {
    __shared__ float sm[2][BLOCK / 32], sd[2][BLOCK / 32];
    int parity = 0;
    for (int64_t row = blockIdx.x; row < M; row += gridDim.x, parity ^= 1) {
        const float* xr = x + row_offset(row, N);
        float* yr = y + row_offset(row, N);
        const RowSplit r = split_row(xr, N);
        MD s = row_state_vec4<BLOCK>(xr, r);                   // 1. thread's (m, d)
        s = block_reduce<BLOCK>(s, sm[parity], sd[parity]);    // 2. row's (m, d)
        row_normalize_vec4<BLOCK>(xr, yr, r, s);               // 3. normalise
    }
}

inline int v4_grid(int device, long long M, int* grid) {
    static int cached[64] = {0};
    if (device < 0 || device >= 64) return static_cast<int>(cudaErrorInvalidDevice);
    if (cached[device] == 0) {
        int sms = 0, per_sm = 0;
        if (cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device))
            return static_cast<int>(e);
        if (cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, online_softmax_v4<kV4Block>,
                                                                          kV4Block, 0))
            return static_cast<int>(e);
        cached[device] = sms * (per_sm > 0 ? per_sm : 1);
    }
    *grid = static_cast<int>(M < cached[device] ? M : cached[device]);
    return 0;
}

}  // namespace ladder

extern "C" int ladder_v4(const float* x, float* y, long long M, int N, void* stream, int device) {
    if (int e = ladder::check_args(x, y, M, N, true)) return e;
    if (M == 0 || N == 0) return 0;
    if (cudaError_t e = cudaSetDevice(device)) return static_cast<int>(e);
    int grid = 0;
    if (int e = ladder::v4_grid(device, M, &grid)) return e;
    ladder::online_softmax_v4<ladder::kV4Block>
        <<<grid, ladder::kV4Block, 0, static_cast<cudaStream_t>(stream)>>>(x, y, M, N);
    return ladder::launched();
}

// grid: the launch's grid for M rows on `device` (M = 0: the full resident grid).
extern "C" int ladder_v4_info(int device, long long M, int* block, int* grid, int* regs, int* local_bytes,
                              int* blocks_per_sm) {
    *block = ladder::kV4Block;
    if (cudaError_t e = cudaSetDevice(device)) return static_cast<int>(e);
    if (int e = ladder::v4_grid(device, M > 0 ? M : (1LL << 40), grid)) return e;
    return ladder::kernel_info(ladder::online_softmax_v4<ladder::kV4Block>, ladder::kV4Block, regs, local_bytes,
                               blocks_per_sm);
}
