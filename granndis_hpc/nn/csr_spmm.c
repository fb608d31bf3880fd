/* out = A @ H for a CSR matrix A [n_rows, n_cols] and a dense row-major H [n_cols, d] (nn/csr_kernel.py
 * builds this file into a shared library on first use and calls it through ctypes).
 *
 * Why not torch's CSR product: on one CPU thread it ran 5-15x the time its bytes take at this machine's
 * memory bandwidth (docs/performance/single-rank.md), because it accumulates every entry into the output
 * row in memory.  Here an output row's columns are taken in blocks of up to 8 vectors held in registers,
 * so an entry costs one load of its H row segment and a multiply and an add per vector, and the output
 * row is written once.  Multiplies and adds stay separate (C99 mode, no contraction into FMA): the
 * products equal torch's bit for bit.
 *
 * Every output row is summed by one thread in the CSR order of its entries, so the result does not
 * depend on the thread count.  Threads take contiguous row ranges of about equal entry counts. */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#define MAX_THREADS 256

/* 32-byte vectors (GCC/Clang vector extensions: AVX registers on x86-64, pairs of 16-byte ones on
 * ARM and older x86); loads and stores through memcpy, which compiles to unaligned vector moves. */
typedef float vf32 __attribute__((vector_size(32)));
typedef double vf64 __attribute__((vector_size(32)));
typedef float hf32 __attribute__((vector_size(16)));
typedef double hf64 __attribute__((vector_size(16)));

/* One column block of NV vectors for rows [r0, r1): the accumulators stay in registers (NV <= 8 of the
 * 16 vector registers), the output row segment is written once. */
#define BLOCK(NAME, T, V, I, NV)                                                                   \
    static void NAME(int64_t r0, int64_t r1, const I *crow, const I *col, const T *val,              \
                     const T *h, int64_t d, int64_t c0, T *out) {                                    \
        enum { L = (int)(sizeof(V) / sizeof(T)) };                                                   \
        for (int64_t i = r0; i < r1; ++i) {                                                          \
            V acc[NV];                                                                               \
            _Pragma("GCC unroll 8") for (int k = 0; k < NV; ++k) acc[k] = (V){0};                    \
            const int64_t end = (int64_t)crow[i + 1];                                                \
            for (int64_t j = (int64_t)crow[i]; j < end; ++j) {                                       \
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
    static void NAME(int64_t r0, int64_t r1, const I *crow, const I *col, const T *val,              \
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
#define ROWS(SFX, T, V, H, I)                                                                        \
    BLOCK(block8_##SFX, T, V, I, 8)                                                                  \
    BLOCK(block4_##SFX, T, V, I, 4)                                                                  \
    BLOCK(block2_##SFX, T, V, I, 2)                                                                  \
    BLOCK(block1_##SFX, T, V, I, 1)                                                                  \
    BLOCK(blockh_##SFX, T, H, I, 1)                                                                  \
    TAIL(tail_##SFX, T, I)                                                                           \
    static void rows_##SFX(int64_t r0, int64_t r1, const I *crow, const I *col, const T *val,        \
                           const T *h, int64_t d, T *out) {                                          \
        const int64_t L = (int64_t)(sizeof(V) / sizeof(T));                                          \
        int64_t c0 = 0;                                                                              \
        for (; c0 + 8 * L <= d; c0 += 8 * L) block8_##SFX(r0, r1, crow, col, val, h, d, c0, out);    \
        if (c0 + 4 * L <= d) { block4_##SFX(r0, r1, crow, col, val, h, d, c0, out); c0 += 4 * L; }   \
        if (c0 + 2 * L <= d) { block2_##SFX(r0, r1, crow, col, val, h, d, c0, out); c0 += 2 * L; }   \
        if (c0 + L <= d) { block1_##SFX(r0, r1, crow, col, val, h, d, c0, out); c0 += L; }           \
        if (c0 + L / 2 <= d) { blockh_##SFX(r0, r1, crow, col, val, h, d, c0, out); c0 += L / 2; }   \
        if (c0 < d) tail_##SFX(r0, r1, crow, col, val, h, d, c0, out);                               \
    }                                                                                                \
    typedef struct {                                                                                 \
        int64_t r0, r1, d;                                                                           \
        const I *crow, *col;                                                                         \
        const T *val, *h;                                                                            \
        T *out;                                                                                      \
    } task_##SFX;                                                                                    \
    static void *run_##SFX(void *arg) {                                                              \
        task_##SFX *t = (task_##SFX *)arg;                                                           \
        rows_##SFX(t->r0, t->r1, t->crow, t->col, t->val, t->h, t->d, t->out);                       \
        return 0;                                                                                    \
    }                                                                                                \
    /* A thread that cannot be started leaves its rows to the calling thread. */                     \
    void csr_spmm_##SFX(int64_t n_rows, int64_t d, const I *crow, const I *col, const T *val,         \
                       const T *h, T *out, int n_threads) {                                          \
        if (n_threads < 1) n_threads = 1;                                                            \
        if (n_threads > MAX_THREADS) n_threads = MAX_THREADS;                                        \
        if (n_threads > n_rows) n_threads = n_rows > 0 ? (int)n_rows : 1;                            \
        if (n_threads == 1) {                                                                        \
            rows_##SFX(0, n_rows, crow, col, val, h, d, out);                                        \
            return;                                                                                  \
        }                                                                                            \
        /* Split points: thread t starts at the first row whose work (entries + rows) reaches t/T. */ \
        const int64_t work = (int64_t)crow[n_rows] + n_rows;                                         \
        task_##SFX tasks[MAX_THREADS];                                                               \
        pthread_t threads[MAX_THREADS];                                                              \
        int64_t start = 0;                                                                           \
        for (int t = 0; t < n_threads; ++t) {                                                        \
            int64_t stop = n_rows;                                                                   \
            if (t + 1 < n_threads) {                                                                 \
                const int64_t target = work / n_threads * (t + 1);                                   \
                int64_t lo = start, hi = n_rows;                                                     \
                while (lo < hi) {                                                                    \
                    const int64_t mid = lo + (hi - lo) / 2;                                          \
                    if ((int64_t)crow[mid] + mid < target) lo = mid + 1; else hi = mid;              \
                }                                                                                    \
                stop = lo;                                                                           \
            }                                                                                        \
            task_##SFX tk = {start, stop, d, crow, col, val, h, out};                                \
            tasks[t] = tk;                                                                           \
            start = stop;                                                                            \
        }                                                                                            \
        int started = 0, failed = 0;                                                                 \
        for (int t = 1; t < n_threads; ++t) {                                                        \
            if (pthread_create(&threads[t], 0, run_##SFX, &tasks[t]) != 0) { failed = 1; break; }    \
            started = t;                                                                             \
        }                                                                                            \
        run_##SFX(&tasks[0]);                                                                        \
        for (int t = 1; t <= started; ++t) pthread_join(threads[t], 0);                              \
        if (failed) {                                                                                \
            for (int t = started + 1; t < n_threads; ++t) run_##SFX(&tasks[t]);                      \
        }                                                                                            \
    }

ROWS(f32_i32, float, vf32, hf32, int32_t)
ROWS(f32_i64, float, vf32, hf32, int64_t)
ROWS(f64_i32, double, vf64, hf64, int32_t)
ROWS(f64_i64, double, vf64, hf64, int64_t)
