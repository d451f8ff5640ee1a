// Shared by every kernel of the ladder (each version's .cu #includes this file; on its own it compiles to
// nothing). The online normalizer state (m, d) of Milakov & Gimelshein 2018 (arXiv 1805.02867):
//     m = max_j x_j,   d = sum_j e^(x_j - m)
// and its merge  (m1, d1) ⊕ (m2, d2) = (m, d1·e^(m1 - m) + d2·e^(m2 - m)),  m = max(m1, m2),
// associative with identity (-inf, 0), so threads, warps and blocks can merge in any tree.
//
// Special values follow torch.softmax: a row holding NaN or +inf, or only -inf, gives NaN everywhere.
// NaN never enters m (fmaxf drops it) but always enters d (e^NaN), so d carries it to the output.
#ifndef ONLINESOFTMAX_LADDER_COMMON_CU
#define ONLINESOFTMAX_LADDER_COMMON_CU

#include <cstdint>
#include <cuda_runtime.h>

namespace ladder {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr unsigned kFullMask = 0xffffffffu;

// e^t as 2^(t·log2 e) on the special-function unit: one FMUL + one MUFU.EX2 (relative error ~2^-22).
// .ftz flushes results under 2^-126 (softmax outputs under 1.2e-38) to 0; exp2f would add four
// instructions per call to produce those subnormals. No -use_fast_math anywhere.
__device__ __forceinline__ float ex(float t) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(t * kLog2e));
    return r;
}

// FIX (seed §4.3, the NaN the seed describes): the seed rescales with e^(m_i - m_new); when both are -inf
// (identity lanes in the second-level merge, or a row prefix of -inf) that is e^NaN and 0·NaN = NaN
// spreads to the whole row. When m = -inf every value merged so far is -inf (or NaN, which d already
// carries), so any finite reference gives the right e^(-inf) = 0: subtract ref(m) instead of m.
__device__ __forceinline__ float ref(float m) { return m == -INFINITY ? 0.f : m; }

struct MD {
    float m;  // running max
    float d;  // sum of e^(x - m)
};

__device__ __forceinline__ MD md_identity() { return {-INFINITY, 0.f}; }

// (m1, d1) ⊕ (m2, d2)
__device__ __forceinline__ MD md_merge(MD a, MD b) {
    const float m = fmaxf(a.m, b.m);
    const float r = ref(m);
    return {m, a.d * ex(a.m - r) + b.d * ex(b.m - r)};
}

// The paper's Algorithm 3 step for one element: m' = max(m, x); d' = d·e^(m - m') + e^(x - m').
__device__ __forceinline__ MD md_push(MD s, float x) {
    const float m = fmaxf(s.m, x);
    const float r = ref(m);
    return {m, s.d * ex(s.m - r) + ex(x - r)};
}

// Four elements at once: their max first, then one rescale of d: 5 exponentials per 4 elements
// instead of the per-element recurrence's 8.
__device__ __forceinline__ MD md_push4(MD s, float4 v) {
    const float m = fmaxf(s.m, fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w)));
    const float r = ref(m);
    return {m, s.d * ex(s.m - r) + ((ex(v.x - r) + ex(v.y - r)) + (ex(v.z - r) + ex(v.w - r)))};
}

// FIX (seed warpReduceOnline(m, d, num_warps)): the seed's offsets num_warps/2, /4, ... skip lanes when
// the lane count is not a power of two (6 warps: offsets 3, 1 never merge lane 2 into lane 0). The width
// here is a compile-time power of two (static_assert); callers pad with the identity (-inf, 0). The
// butterfly (xor) leaves the result in every lane of the group, so no shared-memory broadcast is needed.
template <int WIDTH = 32>
__device__ __forceinline__ MD warp_reduce(MD s) {
    static_assert(WIDTH >= 1 && WIDTH <= 32 && (WIDTH & (WIDTH - 1)) == 0, "WIDTH: a power of two <= 32");
#pragma unroll
    for (int off = WIDTH / 2; off > 0; off >>= 1) {
        const MD o{__shfl_xor_sync(kFullMask, s.m, off), __shfl_xor_sync(kFullMask, s.d, off)};
        s = md_merge(s, o);
    }
    return s;
}

__host__ __device__ constexpr int next_pow2(int n) { return n <= 1 ? 1 : 2 * next_pow2((n + 1) / 2); }

// Two-level merge of a block: warp butterfly, one barrier, then every warp merges the per-warp states
// (identity-padded to a power of two) and broadcasts lane 0's result. Every thread returns the row's (m, d). `sm`, `sd` hold BLOCK/32
// floats; a caller that reduces again into the same arrays needs a barrier in between (V4 alternates two).
template <int BLOCK>
__device__ __forceinline__ MD block_reduce(MD s, float* sm, float* sd) {
    static_assert(BLOCK % 32 == 0 && BLOCK <= 1024, "BLOCK: a multiple of 32, at most 1024");
    constexpr int kWarps = BLOCK / 32;
    s = warp_reduce<32>(s);
    if constexpr (kWarps == 1) {
        return s;
    } else {
        const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
        if (lane == 0) {
            sm[wid] = s.m;
            sd[wid] = s.d;
        }
        __syncthreads();
        constexpr int kWidth = next_pow2(kWarps);
        MD t = lane < kWarps ? MD{sm[lane], sd[lane]} : md_identity();
        t = warp_reduce<kWidth>(t);   // lanes [0, kWidth) hold the row's state ...
        if constexpr (kWidth < 32) {  // ... and lane 0 gives it to the rest of the warp
            t.m = __shfl_sync(kFullMask, t.m, 0);
            t.d = __shfl_sync(kFullMask, t.d, 0);
        }
        return t;
    }
}

// Plain max / sum block reductions for the three-pass safe softmax (same two-level shape).
template <int BLOCK, bool kMax>
__device__ __forceinline__ float block_reduce_1(float v, float* s) {
    constexpr int kWarps = BLOCK / 32;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float o = __shfl_xor_sync(kFullMask, v, off);
        v = kMax ? fmaxf(v, o) : v + o;
    }
    if constexpr (kWarps == 1) {
        return v;
    } else {
        const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
        if (lane == 0) s[wid] = v;
        __syncthreads();
        v = lane < kWarps ? s[lane] : (kMax ? -INFINITY : 0.f);
#pragma unroll
        for (int off = next_pow2(kWarps) / 2; off > 0; off >>= 1) {
            const float o = __shfl_xor_sync(kFullMask, v, off);
            v = kMax ? fmaxf(v, o) : v + o;
        }
        return next_pow2(kWarps) < 32 ? __shfl_sync(kFullMask, v, 0) : v;
    }
}

// FIX (seed V2/V4 `reinterpret_cast<float4*>(x + row * N)`): a row starts on a 16-byte boundary only when
// row·N·4 is a multiple of 16, i.e. not for odd rows when N % 4 != 0 (and never for an input view that
// starts mid-vector); a misaligned float4 load faults. Each row is split into `head` scalars up to the
// next 16-byte boundary, `nvec` aligned float4, and `tail` scalars. x and y must share the same address
// modulo 16 (the launchers check; the Python side allocates y so).
struct RowSplit {
    int head, nvec, tail;
};

__device__ __forceinline__ RowSplit split_row(const float* xr, int n) {
    int head = static_cast<int>(((16u - (static_cast<unsigned>(reinterpret_cast<uintptr_t>(xr)) & 15u)) & 15u) >> 2);
    head = head < n ? head : n;
    const int nvec = (n - head) >> 2;
    return {head, nvec, n - head - 4 * nvec};
}

// Index of the one scalar (head or tail) element this thread owns, or -1. head + tail <= 6 < 32 threads.
__device__ __forceinline__ int scalar_index(const RowSplit& r, int tid) {
    if (tid < r.head) return tid;
    if (tid < r.head + r.tail) return 4 * r.nvec + tid;  // = head + 4·nvec + (tid - head)
    return -1;
}

__device__ __forceinline__ float4 normalize4(float4 v, float m, float inv_d) {
    return make_float4(ex(v.x - m) * inv_d, ex(v.y - m) * inv_d, ex(v.z - m) * inv_d, ex(v.w - m) * inv_d);
}

// Pass 1 over one row: this thread's (m, d). Used by V2 and V4.
template <int BLOCK>
__device__ __forceinline__ MD row_state_vec4(const float* __restrict__ xr, const RowSplit& r) {
    const float4* xv = reinterpret_cast<const float4*>(xr + r.head);
    MD s = md_identity();
    const int j = scalar_index(r, threadIdx.x);
    if (j >= 0) s = md_push(s, xr[j]);
#pragma unroll 4
    for (int i = threadIdx.x; i < r.nvec; i += BLOCK) s = md_push4(s, xv[i]);
    return s;
}

// Pass 2 over one row: y = e^(x - m) / d. Used by V2 and V4.
template <int BLOCK>
__device__ __forceinline__ void row_normalize_vec4(const float* __restrict__ xr, float* __restrict__ yr,
                                                   const RowSplit& r, MD s) {
    const float4* xv = reinterpret_cast<const float4*>(xr + r.head);
    float4* yv = reinterpret_cast<float4*>(yr + r.head);
    const float inv_d = 1.f / s.d;
    const int j = scalar_index(r, threadIdx.x);
    if (j >= 0) yr[j] = ex(xr[j] - s.m) * inv_d;
#pragma unroll 4
    for (int i = threadIdx.x; i < r.nvec; i += BLOCK) yv[i] = normalize4(xv[i], s.m, inv_d);
}

// FIX (seed `input + row * N` with int row, int N): the product overflows int past 2^31 elements
// (e.g. 32768 x 65536). Row offsets are 64-bit everywhere.
__device__ __forceinline__ int64_t row_offset(int64_t row, int n) { return row * static_cast<int64_t>(n); }

// ---- host side: every launcher returns a cudaError_t as int (0 = success) ----

inline int check_args(const float* x, const float* y, long long m, int n, bool vectorized) {
    if (x == nullptr || y == nullptr || m < 0 || n < 0) return static_cast<int>(cudaErrorInvalidValue);
    if (vectorized && ((reinterpret_cast<uintptr_t>(x) ^ reinterpret_cast<uintptr_t>(y)) & 15u) != 0)
        return static_cast<int>(cudaErrorMisalignedAddress);
    return 0;
}

inline int launched() { return static_cast<int>(cudaGetLastError()); }

template <typename Kernel>
inline int kernel_info(Kernel k, int block, int* regs, int* local_bytes, int* blocks_per_sm) {
    cudaFuncAttributes a{};
    cudaError_t e = cudaFuncGetAttributes(&a, k);
    if (e != cudaSuccess) return static_cast<int>(e);
    *regs = a.numRegs;
    *local_bytes = static_cast<int>(a.localSizeBytes);
    return static_cast<int>(cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, k, block, 0));
}

}  // namespace ladder

#endif  // ONLINESOFTMAX_LADDER_COMMON_CU
