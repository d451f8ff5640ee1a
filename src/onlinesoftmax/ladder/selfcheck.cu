// Stand-alone checker for compute-sanitizer (memcheck, racecheck) and a torch-free correctness check:
// runs every version through its extern "C" launcher on small odd shapes, misaligned rows and special
// values, and compares with a double-precision safe softmax on the host.
// Build: nvcc -arch=sm_90 -O3 -std=c++17 -lineinfo -o selfcheck selfcheck.cu v0.cu v1.cu v2.cu v3.cu v4.cu safe.cu
// Run:   compute-sanitizer --tool memcheck --error-exitcode 1 ./selfcheck
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>

extern "C" {
int ladder_v0(const float*, float*, long long, int, void*, int);
int ladder_v1(const float*, float*, long long, int, int, void*, int);
int ladder_v2(const float*, float*, long long, int, void*, int);
int ladder_v3(const float*, float*, long long, int, int, int, void*, int);
int ladder_v4(const float*, float*, long long, int, void*, int);
int ladder_safe_v1(const float*, float*, long long, int, void*, int);
int ladder_safe_v2(const float*, float*, long long, int, void*, int);
}

static int v3_auto(const float* x, float* y, long long m, int n, void* s, int d) {
    static const int plan[][2] = {{128, 1}, {128, 2}, {128, 4}, {256, 4}, {512, 4}, {1024, 4}, {1024, 8}};
    for (auto& p : plan)
        if (n <= 4 * p[0] * p[1]) return ladder_v3(x, y, m, n, p[0], p[1], s, d);
    return ladder_v2(x, y, m, n, s, d);
}
static int v1_96(const float* x, float* y, long long m, int n, void* s, int d) { return ladder_v1(x, y, m, n, 96, s, d); }
static int v1_192(const float* x, float* y, long long m, int n, void* s, int d) { return ladder_v1(x, y, m, n, 192, s, d); }
static int v1_256(const float* x, float* y, long long m, int n, void* s, int d) { return ladder_v1(x, y, m, n, 256, s, d); }
static int v3_1024x8(const float* x, float* y, long long m, int n, void* s, int d) {
    return n <= 32768 ? ladder_v3(x, y, m, n, 1024, 8, s, d) : 0;
}

struct Version { const char* name; int (*fn)(const float*, float*, long long, int, void*, int); };
static const Version kVersions[] = {
    {"v0", ladder_v0}, {"v1<256>", v1_256}, {"v1<96>", v1_96}, {"v1<192>", v1_192}, {"v2", ladder_v2},
    {"v3", v3_auto}, {"v3<1024,8>", v3_1024x8}, {"v4", ladder_v4}, {"safe_v1", ladder_safe_v1},
    {"safe_v2", ladder_safe_v2}};

static unsigned long long rng = 88172645463325252ull;
static float frand() {  // xorshift, N(0, 1)-ish via sum of uniforms
    float s = 0;
    for (int i = 0; i < 4; ++i) {
        rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
        s += (rng >> 40) / float(1 << 24);
    }
    return (s - 2.f) * 1.7f;
}

// torch semantics: NaN or +inf in the row, or only -inf: NaN everywhere.
static void reference(const float* x, double* y, long long m, int n) {
    for (long long r = 0; r < m; ++r) {
        const float* xr = x + r * n;
        double mx = -INFINITY; bool nan = false;
        for (int i = 0; i < n; ++i) { nan |= std::isnan(xr[i]); if (xr[i] > mx) mx = xr[i]; }
        double d = 0;
        for (int i = 0; i < n; ++i) d += std::exp(double(xr[i]) - mx);
        for (int i = 0; i < n; ++i)
            y[r * n + i] = (nan || mx == INFINITY || mx == -INFINITY) ? NAN : std::exp(double(xr[i]) - mx) / d;
    }
}

#define CK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); std::exit(2); } } while (0)

int main() {
    struct Shape { long long m; int n; int offset; int special; };
    const Shape shapes[] = {{1, 1, 0, 0}, {3, 3, 0, 0}, {2, 4, 0, 0}, {5, 4097, 0, 0}, {2, 12672, 0, 0},
                            {7, 1000, 1, 0}, {3, 4096, 3, 0}, {4, 777, 2, 0}, {300, 33, 0, 0},
                            {6, 2048, 0, 1}, {6, 5, 0, 1}, {1, 40000, 0, 0}};
    int failures = 0;
    for (const Shape& sh : shapes) {
        const size_t count = size_t(sh.m) * sh.n;
        std::vector<float> hx(count), hy(count);
        std::vector<double> ref(count);
        for (auto& v : hx) v = frand();
        if (sh.special) {  // rows: all -inf; -inf prefix; NaN; +inf; huge; all equal
            for (int i = 0; i < sh.n; ++i) hx[0 * sh.n + i] = -INFINITY;
            for (int i = 0; i < sh.n / 2 + 1; ++i) hx[1 * sh.n + i] = -INFINITY;
            hx[2 * sh.n + sh.n / 2] = NAN;
            hx[3 * sh.n + sh.n - 1] = INFINITY;
            for (int i = 0; i < sh.n; ++i) hx[4 * sh.n + i] = 1e30f * (i % 3 == 0 ? 1.f : -1.f);
            for (int i = 0; i < sh.n; ++i) hx[5 * sh.n + i] = 7.f;
        }
        reference(hx.data(), ref.data(), sh.m, sh.n);
        float *dx, *dy;
        CK(cudaMalloc(&dx, (count + 4) * sizeof(float)));
        CK(cudaMalloc(&dy, (count + 4) * sizeof(float)));
        float* x = dx + sh.offset;  // misaligned rows from the first one on
        float* y = dy + sh.offset;
        CK(cudaMemcpy(x, hx.data(), count * sizeof(float), cudaMemcpyHostToDevice));
        for (const Version& v : kVersions) {
            CK(cudaMemset(dy, 0x7f, (count + 4) * sizeof(float)));  // poison: 3.4e38, never a softmax value
            int e = v.fn(x, y, sh.m, sh.n, nullptr, 0);
            if (e) { std::printf("FAIL %-10s %lldx%d: launch error %d\n", v.name, sh.m, sh.n, e); ++failures; continue; }
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(hy.data(), y, count * sizeof(float), cudaMemcpyDeviceToHost));
            if (std::strcmp(v.name, "v3<1024,8>") == 0 && sh.n > 32768) continue;
            double worst = 0; long long bad = -1;
            for (size_t i = 0; i < count; ++i) {
                const double r = ref[i], g = hy[i];
                if (std::isnan(r) != std::isnan(g)) { bad = (long long)i; break; }
                if (std::isnan(r)) continue;
                const double err = std::fabs(g - r) / (std::fabs(r) + 1e-7);
                if (err > worst) worst = err;
                if (err > (v.name[1] == '0' ? 5e-4 : 2e-5)) { bad = (long long)i; break; }
            }
            if (bad >= 0) {
                std::printf("FAIL %-10s %lldx%d off %d: y[%lld] = %g, reference %g\n", v.name, sh.m, sh.n,
                            sh.offset, bad, hy[bad], ref[bad]);
                ++failures;
            } else {
                std::printf("ok   %-10s %lldx%d off %d  max rel err %.2e\n", v.name, sh.m, sh.n, sh.offset, worst);
            }
        }
        CK(cudaFree(dx));
        CK(cudaFree(dy));
    }
    std::printf(failures ? "selfcheck: %d FAILURES\n" : "selfcheck: all ok\n", failures);
    return failures ? 1 : 0;
}
