// The seed's predecessor (safe softmax, paper Algorithm 2) at the V1 (scalar) and V2 (float4) level:
// same block-per-row shape, same reductions, but three passes.
//   pass 1: m = max_j x_j; block max                                     read N
//   pass 2: d = sum_j e^(x_j - m); block sum                             read N
//   pass 3: y_j = e^(x_j - m) / d                                        read N, write N
// 3 reads + 1 write (the online V1/V2: 2 + 1), and two block reductions instead of one.
// Special values: max ignores NaN, the sum catches it; an all -inf row subtracts ref(m) = 0 in pass 2
// (no NaN from -inf - -inf) and gives NaN in pass 3, as torch.
#include "common.cu"

namespace ladder {

constexpr int kSafeBlock = 256;

template <int BLOCK, bool VEC4>
__global__ void __launch_bounds__(BLOCK) safe_softmax(const float* __restrict__ x, float* __restrict__ y, int N) {
    __shared__ float s_max[BLOCK / 32], s_sum[BLOCK / 32];
    const float* xr = x + row_offset(blockIdx.x, N);
    float* yr = y + row_offset(blockIdx.x, N);
    const int tid = threadIdx.x;
    if constexpr (VEC4) {
        const RowSplit r = split_row(xr, N);
        const float4* xv = reinterpret_cast<const float4*>(xr + r.head);
        float4* yv = reinterpret_cast<float4*>(yr + r.head);
        const int j = scalar_index(r, tid);
        float m = j >= 0 ? xr[j] : -INFINITY;                                     // 1. max
#pragma unroll 4
        for (int i = tid; i < r.nvec; i += BLOCK) {
            const float4 v = xv[i];
            m = fmaxf(m, fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w)));
        }
        m = block_reduce_1<BLOCK, true>(m, s_max);
        const float rm = ref(m);
        float d = j >= 0 ? ex(xr[j] - rm) : 0.f;                                  // 2. sum
#pragma unroll 4
        for (int i = tid; i < r.nvec; i += BLOCK) {
            const float4 v = xv[i];
            d += (ex(v.x - rm) + ex(v.y - rm)) + (ex(v.z - rm) + ex(v.w - rm));
        }
        d = block_reduce_1<BLOCK, false>(d, s_sum);
        const float inv_d = 1.f / d;                                              // 3. normalise
        if (j >= 0) yr[j] = ex(xr[j] - m) * inv_d;
#pragma unroll 4
        for (int i = tid; i < r.nvec; i += BLOCK) yv[i] = normalize4(xv[i], m, inv_d);
    } else {
        float m = -INFINITY;                                                      // 1. max
        for (int i = tid; i < N; i += BLOCK) m = fmaxf(m, xr[i]);
        m = block_reduce_1<BLOCK, true>(m, s_max);
        const float rm = ref(m);
        float d = 0.f;                                                            // 2. sum
        for (int i = tid; i < N; i += BLOCK) d += ex(xr[i] - rm);
        d = block_reduce_1<BLOCK, false>(d, s_sum);
        const float inv_d = 1.f / d;                                              // 3. normalise
        for (int i = tid; i < N; i += BLOCK) yr[i] = ex(xr[i] - m) * inv_d;
    }
}

template <bool VEC4>
int launch_safe(const float* x, float* y, long long M, int N, void* stream, int device) {
    if (int e = check_args(x, y, M, N, VEC4)) return e;
    if (M == 0 || N == 0) return 0;
    if (M > 0x7fffffffLL) return static_cast<int>(cudaErrorInvalidConfiguration);
    if (cudaError_t e = cudaSetDevice(device)) return static_cast<int>(e);
    safe_softmax<kSafeBlock, VEC4>
        <<<static_cast<unsigned>(M), kSafeBlock, 0, static_cast<cudaStream_t>(stream)>>>(x, y, N);
    return launched();
}

}  // namespace ladder

extern "C" int ladder_safe_v1(const float* x, float* y, long long M, int N, void* stream, int device) {
    return ladder::launch_safe<false>(x, y, M, N, stream, device);
}

extern "C" int ladder_safe_v2(const float* x, float* y, long long M, int N, void* stream, int device) {
    return ladder::launch_safe<true>(x, y, M, N, stream, device);
}

extern "C" int ladder_safe_info(int vec4, int* block, int* regs, int* local_bytes, int* blocks_per_sm) {
    *block = ladder::kSafeBlock;
    if (vec4)
        return ladder::kernel_info(ladder::safe_softmax<ladder::kSafeBlock, true>, ladder::kSafeBlock, regs,
                                   local_bytes, blocks_per_sm);
    return ladder::kernel_info(ladder::safe_softmax<ladder::kSafeBlock, false>, ladder::kSafeBlock, regs,
                               local_bytes, blocks_per_sm);
}

extern "C" const char* ladder_error_string(int code) {
    return cudaGetErrorString(static_cast<cudaError_t>(code));
}
