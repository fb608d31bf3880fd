/* The C kernels of the CPU path, built with the package (setup.py: the extension module
 * granndis_hpc.nn._cpu_kernels) and called through ctypes by nn/cpu_kernels.py:
 *
 *   csr_spmm_<T>_<I>   out = A @ H for a CSR matrix A [n_rows, n_cols] (values T, indices I) and a dense
 *                      row-major H [n_cols, d]: the aggregations' sparse product;
 *   dropout_<T>        y = h * m with m = keep / (1 - p) and the keyed mask of nn/dropout.py's keep_mask:
 *                      the dropout forward, m kept for the backward.
 *
 * Why not torch's ops: on one CPU thread its CSR product adds every entry into the output row in
 * memory, and the keyed mask takes several int64 passes an element (docs/performance/single-rank.md:
 * an epoch on torch's ops takes 2.5-3x as long).  Here the product keeps an output row's columns in vector registers
 * (blocks of up to 8 vectors), so an entry costs one load of its H row segment and a multiply and an add
 * per vector and the output row is written once; the mask is hashed and applied in one pass.
 *
 * Every output row is the sum of its entries' products in CSR order, bit for bit: multiplies and adds
 * stay separate (C99 mode, no contraction into FMA) and one thread sums a row, whatever the thread count.
 * torch's CPU product gives the same bits where its kernel does the same; MKL's AVX-512 path orders and
 * fuses otherwise (the last bits differ).  Threads take contiguous row ranges (the product: of about equal
 * entry counts). */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#define MAX_THREADS 256

/* One library for x86-64 CPUs of several generations: the row loops below are compiled for AVX-512
 * (x86-64-v4), AVX2 (x86-64-v3) and the baseline, and the dynamic loader picks the best the CPU runs
 * (GCC's and Clang's target_clones, an ifunc).  The code they inline (the blocks, the hash) is compiled
 * inside each clone.  Elsewhere (ARM, other compilers) the loops are compiled once for the build's target. */
#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__) && \
    ((!defined(__clang__) && __GNUC__ >= 12) || (defined(__clang__) && __clang_major__ >= 14))
#define CLONED __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define DISPATCH_KNOWN 1
#else
#define CLONED
#define DISPATCH_KNOWN 0
#endif
#define INLINE static inline __attribute__((always_inline))

/* Which clone the loader takes on this CPU (reported in summary.json's compute). */
const char *cpu_kernels_dispatch(void) {
#if DISPATCH_KNOWN
    __builtin_cpu_init();
    if (__builtin_cpu_supports("x86-64-v4")) return "x86-64-v4";
    if (__builtin_cpu_supports("x86-64-v3")) return "x86-64-v3";
    return "x86-64";
#else
    return "build target";
#endif
}

/* ---- threads: contiguous row spans ---------------------------------------------------------------- */

typedef void (*rows_fn)(int64_t r0, int64_t r1, void *ctx);
typedef struct {
    rows_fn fn;
    void *ctx;
    int64_t r0, r1;
} span_t;

static void *run_span(void *arg) {
    span_t *s = (span_t *)arg;
    s->fn(s->r0, s->r1, s->ctx);
    return 0;
}

/* fn over the spans [bounds[t], bounds[t + 1]), t < n_spans; a span whose thread cannot be started runs on
 * the calling thread. */
static void run_spans(int n_spans, const int64_t *bounds, rows_fn fn, void *ctx) {
    span_t spans[MAX_THREADS];
    pthread_t threads[MAX_THREADS];
    int started[MAX_THREADS];
    for (int t = 0; t < n_spans; ++t) {
        span_t s = {fn, ctx, bounds[t], bounds[t + 1]};
        spans[t] = s;
        started[t] = t > 0 && pthread_create(&threads[t], 0, run_span, &spans[t]) == 0;
    }
    run_span(&spans[0]);
    for (int t = 1; t < n_spans; ++t) {
        if (started[t]) pthread_join(threads[t], 0);
        else run_span(&spans[t]);
    }
}

static int clamp_threads(int n_threads, int64_t n_rows) {
    if (n_threads > MAX_THREADS) n_threads = MAX_THREADS;
    if (n_threads > n_rows) n_threads = (int)n_rows;
    return n_threads < 1 ? 1 : n_threads;
}

/* ---- the sparse product ----------------------------------------------------------------------------- */

/* 32-byte vectors (GCC/Clang vector extensions: AVX registers on x86-64, pairs of 16-byte ones on
 * ARM and older x86) and 16-byte ones; loads and stores through memcpy, which compiles to unaligned
 * vector moves. */
typedef float vf32 __attribute__((vector_size(32)));
typedef double vf64 __attribute__((vector_size(32)));
typedef float hf32 __attribute__((vector_size(16)));
typedef double hf64 __attribute__((vector_size(16)));

/* One column block of NV vectors for rows [r0, r1): the accumulators stay in registers (NV <= 8 of the
 * 16 vector registers), the output row segment is written once.  The H rows an entry reads are at
 * random addresses the hardware cannot predict, so each entry prefetches the segment of the entry AHEAD
 * on (about 4 KiB ahead: 16 entries of 256 bytes, 64 of 64 bytes; nearer or farther was slower on the
 * 100k synthetic graph at 64 and 16 columns). */
#define BLOCK(NAME, T, V, I, NV)                                                                   \
    INLINE void NAME(int64_t r0, int64_t r1, const I *crow, const I *col, const T *val,              \
                     const T *h, int64_t d, int64_t c0, T *out) {                                    \
        enum { L = (int)(sizeof(V) / sizeof(T)), BYTES = NV * (int)sizeof(V),                        \
               AHEAD = 4096 / BYTES < 8 ? 8 : 4096 / BYTES > 64 ? 64 : 4096 / BYTES };                \
        const int64_t last = (int64_t)crow[r1];                                                      \
        for (int64_t i = r0; i < r1; ++i) {                                                          \
            V acc[NV];                                                                               \
            _Pragma("GCC unroll 8") for (int k = 0; k < NV; ++k) acc[k] = (V){0};                    \
            const int64_t end = (int64_t)crow[i + 1];                                                \
            for (int64_t j = (int64_t)crow[i]; j < end; ++j) {                                       \
                if (j + AHEAD < last) { /* the row segment AHEAD entries on, every cache line of it */ \
                    const char *p = (const char *)(h + (int64_t)col[j + AHEAD] * d + c0);            \
                    _Pragma("GCC unroll 8") for (int q = 0; q < BYTES; q += 64) __builtin_prefetch(p + q, 0, 3); \
                    __builtin_prefetch(p + BYTES - 1, 0, 3);                                         \
                }                                                                                    \
                const T *hr = h + (int64_t)col[j] * d + c0;                                          \
                const V v = (V){0} + val[j];                                                         \
                _Pragma("GCC unroll 8") for (int k = 0; k < NV; ++k) {                               \
                    V x;                                                                             \
                    memcpy(&x, hr + k * L, sizeof(V));                                               \
                    acc[k] += v * x;                                                                 \
                }                                                                                    \
            }                                                                                        \
            T *o = out + i * d + c0;                                                                 \
            _Pragma("GCC unroll 8") for (int k = 0; k < NV; ++k) memcpy(o + k * L, &acc[k], sizeof(V)); \
        }                                                                                            \
    }

/* The last columns of a row (fewer than a half vector): a scalar loop over the output row. */
#define TAIL(NAME, T, I)                                                                             \
    INLINE void NAME(int64_t r0, int64_t r1, const I *crow, const I *col, const T *val,              \
                     const T *h, int64_t d, int64_t c0, T *out) {                                    \
        const int64_t w = d - c0;                                                                    \
        for (int64_t i = r0; i < r1; ++i) {                                                          \
            T *o = out + i * d + c0;                                                                 \
            for (int64_t k = 0; k < w; ++k) o[k] = 0;                                                \
            const int64_t end = (int64_t)crow[i + 1];                                                \
            for (int64_t j = (int64_t)crow[i]; j < end; ++j) {                                       \
                const T v = val[j];                                                                  \
                const T *hr = h + (int64_t)col[j] * d + c0;                                          \
                for (int64_t k = 0; k < w; ++k) o[k] += v * hr[k];                                   \
            }                                                                                        \
        }                                                                                            \
    }

/* Rows [r0, r1), every column: blocks of 8 vectors while they fill, then one each of 4, 2, 1 and a
 * half vector, then the tail (64 float columns: one block; 47: 4 + 1 + 1/2 vectors and 3 tail columns). */
#define SPMM(SFX, T, V, H, I)                                                                        \
    BLOCK(block8_##SFX, T, V, I, 8)                                                                  \
    BLOCK(block4_##SFX, T, V, I, 4)                                                                  \
    BLOCK(block2_##SFX, T, V, I, 2)                                                                  \
    BLOCK(block1_##SFX, T, V, I, 1)                                                                  \
    BLOCK(blockh_##SFX, T, H, I, 1)                                                                  \
    TAIL(tail_##SFX, T, I)                                                                           \
    typedef struct {                                                                                 \
        const I *crow, *col;                                                                         \
        const T *val, *h;                                                                            \
        int64_t d;                                                                                   \
        T *out;                                                                                      \
    } spmm_##SFX##_t;                                                                                \
    CLONED static void spmm_rows_##SFX(int64_t r0, int64_t r1, void *ctx) {                          \
        const spmm_##SFX##_t *a = (const spmm_##SFX##_t *)ctx;                                       \
        const I *crow = a->crow, *col = a->col;                                                      \
        const T *val = a->val, *h = a->h;                                                            \
        const int64_t d = a->d, L = (int64_t)(sizeof(V) / sizeof(T));                                \
        T *out = a->out;                                                                             \
        int64_t c0 = 0;                                                                              \
        for (; c0 + 8 * L <= d; c0 += 8 * L) block8_##SFX(r0, r1, crow, col, val, h, d, c0, out);    \
        if (c0 + 4 * L <= d) { block4_##SFX(r0, r1, crow, col, val, h, d, c0, out); c0 += 4 * L; }   \
        if (c0 + 2 * L <= d) { block2_##SFX(r0, r1, crow, col, val, h, d, c0, out); c0 += 2 * L; }   \
        if (c0 + L <= d) { block1_##SFX(r0, r1, crow, col, val, h, d, c0, out); c0 += L; }           \
        if (c0 + L / 2 <= d) { blockh_##SFX(r0, r1, crow, col, val, h, d, c0, out); c0 += L / 2; }   \
        if (c0 < d) tail_##SFX(r0, r1, crow, col, val, h, d, c0, out);                               \
    }                                                                                                \
    void csr_spmm_##SFX(int64_t n_rows, int64_t d, const I *crow, const I *col, const T *val,        \
                        const T *h, T *out, int n_threads) {                                         \
        spmm_##SFX##_t args = {crow, col, val, h, d, out};                                           \
        n_threads = clamp_threads(n_threads, n_rows);                                                \
        int64_t bounds[MAX_THREADS + 1];                                                             \
        bounds[0] = 0;                                                                               \
        /* Span t ends at the first row whose work before it (entries + rows) reaches (t + 1) / T. */ \
        const int64_t work = (int64_t)crow[n_rows] + n_rows;                                         \
        for (int t = 1; t < n_threads; ++t) {                                                        \
            const int64_t target = work / n_threads * t;                                             \
            int64_t lo = bounds[t - 1], hi = n_rows;                                                 \
            while (lo < hi) {                                                                        \
                const int64_t mid = lo + (hi - lo) / 2;                                              \
                if ((int64_t)crow[mid] + mid < target) lo = mid + 1; else hi = mid;                  \
            }                                                                                        \
            bounds[t] = lo;                                                                          \
        }                                                                                            \
        bounds[n_threads] = n_rows;                                                                  \
        run_spans(n_threads, bounds, spmm_rows_##SFX, &args);                                        \
    }

SPMM(f32_i32, float, vf32, hf32, int32_t)
SPMM(f32_i64, float, vf32, hf32, int64_t)
SPMM(f64_i32, double, vf64, hf64, int32_t)
SPMM(f64_i64, double, vf64, hf64, int64_t)

/* ---- keyed dropout ---------------------------------------------------------------------------------- */

#define GOLDEN 0x9E3779B97F4A7C15ULL

/* splitmix64's finaliser (nn/dropout.py _mix). */
INLINE uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* Row i's start is start[i]; its word j is mix(start + (j + 1) GOLDEN), whose 16-bit lane k (bits
 * 16k..16k+15, as a signed int16) keeps column 4j + k iff it is at least threshold.  A row is done in
 * chunks of DROP_CHUNK columns: the chunk's words are hashed into a buffer (scalar 64-bit multiplies),
 * then its lanes compared (as int16, against an int16 threshold) and applied by a select, in a loop
 * the compiler vectorises (a branch on a random keep bit would be mispredicted half the time at p = 0.5,
 * and converting the comparison to a float serialised on the conversion). */
#define DROP_CHUNK 64
#define DROPOUT(T)                                                                                   \
    typedef struct {                                                                                 \
        int64_t width;                                                                               \
        const int64_t *start;                                                                        \
        int16_t threshold;                                                                           \
        T scale;                                                                                     \
        const T *h;                                                                                  \
        T *y, *m;                                                                                    \
    } dropout_##T##_t;                                                                               \
    CLONED static void dropout_rows_##T(int64_t r0, int64_t r1, void *ctx) {                         \
        const dropout_##T##_t *a = (const dropout_##T##_t *)ctx;                                     \
        const int64_t width = a->width;                                                              \
        const int16_t threshold = a->threshold;                                                      \
        const T scale = a->scale;                                                                    \
        uint64_t words[DROP_CHUNK / 4];                                                              \
        int16_t lanes[DROP_CHUNK];                                                                   \
        for (int64_t i = r0; i < r1; ++i) {                                                          \
            const uint64_t start = (uint64_t)a->start[i];                                            \
            for (int64_t c0 = 0; c0 < width; c0 += DROP_CHUNK) {                                     \
                const int64_t w = width - c0 < DROP_CHUNK ? width - c0 : DROP_CHUNK;                 \
                for (int j = 0; j < DROP_CHUNK / 4; ++j) /* (a chunk past the row's end: unused) */   \
                    words[j] = mix(start + (uint64_t)(c0 / 4 + j + 1) * GOLDEN);                     \
                memcpy(lanes, words, sizeof words); /* little-endian: lane k of word j */            \
                const T *restrict h = a->h + i * width + c0;                                         \
                T *restrict y = a->y + i * width + c0;                                               \
                T *restrict m = a->m + i * width + c0;                                               \
                for (int64_t c = 0; c < w; ++c) {                                                    \
                    const T keep = lanes[c] >= threshold ? scale : (T)0;                             \
                    m[c] = keep;                                                                     \
                    y[c] = h[c] * keep;                                                              \
                }                                                                                    \
            }                                                                                        \
        }                                                                                            \
    }                                                                                                \
    void dropout_##T(int64_t n_rows, int64_t width, const int64_t *start, int32_t threshold, T scale, \
                     const T *h, T *y, T *m, int n_threads) {                                        \
        /* A threshold past every int16 (p within 2^-17 of 1) keeps nothing: every lane passes, at 0. */ \
        const int past = threshold > INT16_MAX;                                                      \
        dropout_##T##_t args = {width, start, past ? INT16_MIN : (int16_t)threshold, past ? (T)0 : scale, \
                                h, y, m};                                                            \
        n_threads = clamp_threads(n_threads, n_rows);                                                \
        int64_t bounds[MAX_THREADS + 1];                                                             \
        for (int t = 0; t <= n_threads; ++t) bounds[t] = n_rows / n_threads * t;                     \
        bounds[n_threads] = n_rows;                                                                  \
        run_spans(n_threads, bounds, dropout_rows_##T, &args);                                       \
    }

DROPOUT(float)
DROPOUT(double)
