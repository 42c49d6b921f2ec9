/* Small-batch products y[M, N] = (x * in_scale)[M, K] @ W[N, K]^T + bias for CPU decoding.

At batch 1 a linear layer reads each weight once for one multiply-add: the product is bound by
memory bandwidth, and what matters is streaming the weight rows at full speed with the conversion
to fp32 folded into the load. Library GEMMs are built for the opposite case (they re-lay out or
block for reuse); here each thread takes a contiguous band of output rows, four at a time, and
reads them straight through while every row of x stays in L1.

Weights: fp32, bf16, int8 (one scale per row) or int4 in the layout of PyTorch's CPU int4 kernel
(torch._convert_weight_to_int4pack_for_cpu, read in place; cpu_kernels finds which of its two layouts
this PyTorch writes, and callers check the product on a random input): rows in blocks of B = 32
(PyTorch's AVX2 build) or 64 (its AVX-512 build), for each input k B/2 bytes whose low nibbles are rows
0..B/2-1 of the block and high nibbles rows B/2..B-1; a last, partial block of r rows pairs rows 2i,
2i+1 in byte i (r/2 bytes per input). The kernels work on 32 rows at a time (int4_tile): with B = 64
each half of a block's bytes is such a tile. Codes 0..15 with an fp32 scale and a zero (the value of
code 0) per group of `group` inputs, stored [K/group, N].
Activations x and the output y: fp32 or bf16 (flags). in_scale and bias: fp32 or NULL.

Compiled by portachat.ops.cpu_kernels with -O3 -march=native -fopenmp, sharing the OpenMP
runtime PyTorch has loaded (same soname), so the threads are PyTorch's. Without AVX2 the plain C
loops below are what the compiler vectorizes for the CPU it builds on (e.g. NEON).
*/
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "kernels.h"

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {  /* round to nearest even, as PyTorch does */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 64);  /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Weight value (n, k) in fp32: the scalar path and the tails. */
static inline float weight_at(const Weight *W, int n, int k) {
    size_t K = (size_t)W->K;
    switch (W->kind) {
    case WEIGHT_F32: return ((const float *)W->w)[n * K + k];
    case WEIGHT_BF16: return bf16_to_f32(((const uint16_t *)W->w)[n * K + k]);
    case WEIGHT_INT8: return (float)((const int8_t *)W->w)[n * K + k];
    default: {
        const uint8_t *w = (const uint8_t *)W->w;
        size_t B = (size_t)W->block, n0 = (size_t)n / B * B, j = n - n0, at;
        int high;
        if (n0 + B <= (size_t)W->N) {
            at = n0 * K / 2 + k * (B / 2) + j % (B / 2), high = j >= B / 2;
        } else {  /* the last, partial block: two rows a byte */
            at = n0 * K / 2 + k * ((W->N - n0) / 2) + j / 2, high = j & 1;
        }
        int code = high ? w[at] >> 4 : w[at] & 15;
        size_t g = (size_t)(k / W->group) * W->N + n;
        return code * W->scale[g] + W->zero[g];
    }
    }
}

/* int4 rows 32t..32t+31 when they lie in a full packing block: 1 and their tile (rows tile->lo.. and
   tile->hi.., in the block's order), else 0 (the last, partial block: the scalar path reads it). */
static int int4_tile(const Weight *W, int t, Int4Tile *tile) {
    int B = W->block, n0 = 32 * t, nb = n0 / B * B, half = (n0 - nb) / 32;
    if (nb + B > W->N) return 0;
    tile->p = (const uint8_t *)W->w + (size_t)nb * W->K / 2 + 16 * half;
    tile->stride = B / 2;
    tile->lo = nb + 16 * half;
    tile->hi = nb + B / 2 + 16 * half;
    return 1;
}

/* The weight row of output j of a block: a tile's, or n0 + j. */
static inline int block_row(const Int4Tile *tile, int n0, int j) {
    return tile ? int4_tile_row(tile, j) : n0 + j;
}

/* Dot products of a block's rows (block_row) with every row of x; out[m * stride + j]. Int8's row
   scale is applied by the caller (it is one multiply per output). */
static void rows_scalar(const Weight *W, const Int4Tile *tile, int n0, int rows, const float *x, int M, float *out,
                        int stride) {
    for (int j = 0; j < rows; j++)
        for (int m = 0; m < M; m++) {
            const float *xm = x + (size_t)m * W->K;
            int n = block_row(tile, n0, j);
            float acc = 0.f;
            for (int k = 0; k < W->K; k++) acc += weight_at(W, n, k) * xm[k];
            out[m * stride + j] = acc;
        }
}

#ifdef __AVX2__
static inline __attribute__((always_inline)) __m256 load8(const Weight *W, int kind, int n, int k) {
    size_t off = (size_t)n * W->K + k;
    switch (kind) {
    case WEIGHT_F32: return _mm256_loadu_ps((const float *)W->w + off);
    case WEIGHT_BF16: {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)W->w + off));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    default: {
        __m128i b = _mm_loadl_epi64((const __m128i *)((const int8_t *)W->w + off));
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    }
    }
}

static inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {  /* [sum a, sum b, sum c, sum d] */
    __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

/* Rows n0 + 16 .. n0 + 19 at input k into L2, once per 64-byte line: one row of x reads the weights
   once, bound by how many cache misses a core has in flight, and prefetching 16 rows ahead keeps more
   of them going (+15% measured at batch 1). */
static inline __attribute__((always_inline)) void prefetch_ahead(const Weight *W, int kind, int n0, int k) {
    size_t bytes = kind == WEIGHT_F32 ? 4 : kind == WEIGHT_BF16 ? 2 : 1, row_bytes = bytes * W->K;
    if (n0 + 20 > W->N || (k * bytes) % 64) return;
    const char *at = (const char *)W->w + (size_t)(n0 + 16) * row_bytes + k * bytes;
    _mm_prefetch(at, _MM_HINT_T1);
    _mm_prefetch(at + row_bytes, _MM_HINT_T1);
    _mm_prefetch(at + 2 * row_bytes, _MM_HINT_T1);
    _mm_prefetch(at + 3 * row_bytes, _MM_HINT_T1);
}

/* Four rows (fp32/bf16/int8) times one or two rows of x (x1 NULL: one): each weight row read straight
   through memory, which streams bf16 at 1.35x a core the four rows in lockstep below; four
   accumulators over k per row of x (the FMA latency), prefetching ahead when `first` (the pass that
   reads from memory). `keep` (or NULL): [4, K] floats that receive the converted weights. Every row of
   x gets this same sum (rows4_lockstep too), so a row's output does not depend on the batch around it
   (speculative verification equals plain decoding). Inlined per kind and
   `two` (constants): no switch in the loop. K % 8 == 0 (the caller checks). */
static inline __attribute__((always_inline)) void rows4_pass(const Weight *W, const int kind, int n0, const int two,
                                                             const float *x0, const float *x1, float *out0,
                                                             float *out1, float *keep, int first) {
    size_t bytes = kind == WEIGHT_F32 ? 4 : kind == WEIGHT_BF16 ? 2 : 1;
    int K = W->K;
    __m256 r[4], s[4];
    for (int j = 0; j < 4; j++) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        __m256 w0, w1, w2, w3;
        float *kj = keep ? keep + (size_t)j * K : NULL;
        const char *ahead = (const char *)W->w + (size_t)(n0 + j + 16) * K * bytes;
        int prefetch = first && n0 + j + 16 < W->N, k = 0;
        for (; k + 32 <= K; k += 32) {
            if (prefetch) {
                _mm_prefetch(ahead + k * bytes, _MM_HINT_T1);
                if (bytes == 4) _mm_prefetch(ahead + k * bytes + 64, _MM_HINT_T1);
            }
            w0 = load8(W, kind, n0 + j, k), w1 = load8(W, kind, n0 + j, k + 8);
            w2 = load8(W, kind, n0 + j, k + 16), w3 = load8(W, kind, n0 + j, k + 24);
            if (kj) {
                _mm256_storeu_ps(kj + k, w0), _mm256_storeu_ps(kj + k + 8, w1);
                _mm256_storeu_ps(kj + k + 16, w2), _mm256_storeu_ps(kj + k + 24, w3);
            }
            a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x0 + k), a0);
            a1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x0 + k + 8), a1);
            a2 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(x0 + k + 16), a2);
            a3 = _mm256_fmadd_ps(w3, _mm256_loadu_ps(x0 + k + 24), a3);
            if (two) {
                b0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x1 + k), b0);
                b1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x1 + k + 8), b1);
                b2 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(x1 + k + 16), b2);
                b3 = _mm256_fmadd_ps(w3, _mm256_loadu_ps(x1 + k + 24), b3);
            }
        }
        for (; k < K; k += 8) {
            w0 = load8(W, kind, n0 + j, k);
            if (kj) _mm256_storeu_ps(kj + k, w0);
            a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x0 + k), a0);
            if (two) b0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x1 + k), b0);
        }
        r[j] = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
        if (two) s[j] = _mm256_add_ps(_mm256_add_ps(b0, b1), _mm256_add_ps(b2, b3));
    }
    _mm_storeu_ps(out0, hsum4(r[0], r[1], r[2], r[3]));
    if (two) _mm_storeu_ps(out1, hsum4(s[0], s[1], s[2], s[3]));
}

/* The inner step of rows4_lockstep: input chunk k of the four rows times two rows of x. */
static inline __attribute__((always_inline)) void lockstep_chunk(const Weight *W, const int kind, int n0, int k,
                                                                 const float *x0, const float *x1, float *keep,
                                                                 int first, __m256 a[4], __m256 b[4]) {
    int K = W->K;
    if (first) prefetch_ahead(W, kind, n0, k);
    __m256 v0 = _mm256_loadu_ps(x0 + k), v1 = _mm256_loadu_ps(x1 + k);
    for (int j = 0; j < 4; j++) {
        __m256 w = load8(W, kind, n0 + j, k);
        if (keep) _mm256_storeu_ps(keep + (size_t)j * K + k, w);
        a[j] = _mm256_fmadd_ps(w, v0, a[j]);
        b[j] = _mm256_fmadd_ps(w, v1, b[j]);
    }
}

/* Four rows times two rows of x in lockstep: 6 loads per 8 FMAs, what many rows need where the
   products are bound by arithmetic (rows4_pass needs 12, and runs 1.3x slower at 64 rows). It sums in
   rows4_pass's order, so every row of x gets the same bits alone or in any batch: the chunks of 8
   inputs fall in four classes (k / 8 mod 4; the tail after the last 32 in class 0), each summed on its
   own in k order, then (0 + 1) + (2 + 3). One pass over k per class: the rows stay in L1 after the
   first. With `keep`, the converted weights are stored there (each chunk once, in its class). */
static inline __attribute__((always_inline)) void rows4_lockstep(const Weight *W, const int kind, int n0,
                                                                 const float *x0, const float *x1, float *out0,
                                                                 float *out1, float *keep, int first) {
    int K = W->K, full = K / 32 * 32;
    __m256 pa[4][4], pb[4][4];
    for (int c = 0; c < 4; c++) {
        __m256 *a = pa[c], *b = pb[c];
        for (int j = 0; j < 4; j++) a[j] = b[j] = _mm256_setzero_ps();
        for (int k = 8 * c; k < full; k += 32) lockstep_chunk(W, kind, n0, k, x0, x1, keep, first, a, b);
        if (c == 0)
            for (int k = full; k < K; k += 8) lockstep_chunk(W, kind, n0, k, x0, x1, keep, first, a, b);
    }
    __m256 ra[4], rb[4];
    for (int j = 0; j < 4; j++) {
        ra[j] = _mm256_add_ps(_mm256_add_ps(pa[0][j], pa[1][j]), _mm256_add_ps(pa[2][j], pa[3][j]));
        rb[j] = _mm256_add_ps(_mm256_add_ps(pb[0][j], pb[1][j]), _mm256_add_ps(pb[2][j], pb[3][j]));
    }
    _mm_storeu_ps(out0, hsum4(ra[0], ra[1], ra[2], ra[3]));
    _mm_storeu_ps(out1, hsum4(rb[0], rb[1], rb[2], rb[3]));
}

/* Four rows times every row of x, out[m * 4 + j]: the first one or two rows of x read the weight rows
   straight through (rows4_pass, bound by memory); later pairs run in lockstep from L1 (bound by
   arithmetic), a last odd row on its own.
   With more than two rows of x and `keep` ([4, K] floats), the first pass also stores the converted
   weights there and later passes multiply those from L1 (converting bf16 again would cost more than
   the products). Every path sums in the same order: a row's output is the same bits whatever the
   batch (speculative verification equals plain decoding; a prompt resumed from the prefix cache
   equals the whole prompt). */
static inline __attribute__((always_inline)) void rows4_simd(const Weight *W, const int kind, int n0,
                                                             const float *x, int M, float *out, float *keep) {
    size_t K = (size_t)W->K;
    Weight kept = {WEIGHT_F32, keep, NULL, NULL, 0, 4, W->K};
    if (M <= 2) keep = NULL;
    int m = 0;
    for (; m + 2 <= M; m += 2) {
        const float *x0 = x + m * K;
        if (m == 0) rows4_pass(W, kind, n0, 1, x0, x0 + K, out, out + 4, keep, 1);  /* from memory: straight */
        else if (keep) rows4_lockstep(&kept, WEIGHT_F32, 0, x0, x0 + K, out + 4 * m, out + 4 * m + 4, NULL, 0);
        else rows4_lockstep(W, kind, n0, x0, x0 + K, out + 4 * m, out + 4 * m + 4, NULL, 0);
    }
    if (m < M) {
        if (m > 0 && keep) rows4_pass(&kept, WEIGHT_F32, 0, 0, x + m * K, NULL, out + 4 * m, NULL, NULL, 0);
        else rows4_pass(W, kind, n0, 0, x + m * K, NULL, out + 4 * m, NULL, NULL, m == 0);
    }
}

/* A tile of 32 int4 rows for every row of x: per input, one 16-byte load gives the 32 rows' codes;
   codes times x add up per group, then scale and zero apply once per group
   (sum_k w x = scale * sum_k code x + zero * sum_k x). xsum: x's sums per group, [M, K / group]. */
static void rows32_int4(const Weight *W, const Int4Tile *t, const float *x, int M, const float *xsum, float *out) {
    int K = W->K, groups = K / W->group, stride = t->stride;
    const uint8_t *p = t->p;
    const __m128i low4 = _mm_set1_epi8(15);
    /* the next block (B * K / 2 bytes on), one 64-byte line at a time, as rows4_simd does */
    int prefetch = M == 1 && t->lo + 2 * W->block <= W->N, every = 64 / stride;
    for (int m = 0; m < M; m++) {
        const float *xm = x + (size_t)m * K;
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int g = 0; g < groups; g++) {
            __m256 ga[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
            for (int k = g * W->group; k < (g + 1) * W->group; k++) {
                if (prefetch && k % every == 0)
                    _mm_prefetch((const char *)p + (size_t)K * stride + (size_t)k * stride, _MM_HINT_T1);
                __m256 xv = _mm256_broadcast_ss(xm + k);
                __m128i v = _mm_loadu_si128((const __m128i *)(p + (size_t)k * stride));
                __m128i lo = _mm_and_si128(v, low4), hi = _mm_and_si128(_mm_srli_epi16(v, 4), low4);
                ga[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), xv, ga[0]);
                ga[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))), xv, ga[1]);
                ga[2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), xv, ga[2]);
                ga[3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))), xv, ga[3]);
            }
            const float *s = W->scale + (size_t)g * W->N, *z = W->zero + (size_t)g * W->N;
            __m256 sx = _mm256_broadcast_ss(xsum + (size_t)m * groups + g);
            for (int j = 0; j < 4; j++) {
                int row = int4_tile_row(t, 8 * j);
                acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(z + row), sx,
                                         _mm256_fmadd_ps(ga[j], _mm256_loadu_ps(s + row), acc[j]));
            }
        }
        for (int j = 0; j < 4; j++) _mm256_storeu_ps(out + m * 32 + 8 * j, acc[j]);
    }
}
#endif

/* x quantized for int_dot.c's integer products: q [M, K] int8, d [M, K / 32]; q NULL where they do
   not apply (no AVX2, or a shape int_dot_fits refuses). */
typedef struct {
    const int8_t *q;
    const float *d;
} QuantizedX;

/* A block's rows (4 rows from n0; int4: the 32 rows of `tile`, or rows n0.. of the last, partial
   packing block where tile is NULL) into out[m * stride + j]. scratch: NULL or [4, K] floats
   (rows4_simd's keep). */
static void block_rows(const Weight *W, const Int4Tile *tile, int n0, int rows, const float *x, const QuantizedX *xq,
                       int M, const float *xsum, float *out, int stride, float *scratch) {
#ifdef __AVX2__
    if (xq->q && W->kind == WEIGHT_INT8 && rows == 4) { int8_rows4(W, n0, xq->q, xq->d, M, out); return; }
    if (xq->q && tile) { int4_rows32(W, tile, xq->q, xq->d, xsum, M, out); return; }
    if (W->kind == WEIGHT_INT4) {
        if (tile && W->group % 8 == 0) { rows32_int4(W, tile, x, M, xsum, out); return; }
    } else if (rows == 4 && W->K % 8 == 0) {
        if (W->kind == WEIGHT_F32) rows4_simd(W, WEIGHT_F32, n0, x, M, out, NULL);
        else if (W->kind == WEIGHT_BF16) rows4_simd(W, WEIGHT_BF16, n0, x, M, out, scratch);
        else rows4_simd(W, WEIGHT_INT8, n0, x, M, out, NULL);  /* int8 converts cheaper than L1 reads fp32 */
        return;
    }
#endif
    (void)xsum;
    (void)xq;
    (void)scratch;
    rows_scalar(W, tile, n0, rows, x, M, out, stride);
}

/* Reads input row m as fp32 into xf: x's own row, or silu(gate) * up for a SwiGLU input (x's row
   is [gate | up], 2K wide); then the RMS norm's 1/rms (norm_eps >= 0) and in_scale (the norm's
   weight) multiply it, the norm as it runs before the product: y = W (x / rms(x) * w). */
static void read_row(const void *x, int x_bf16, int m, int K, int swiglu, float norm_eps, const float *in_scale,
                     float *xf) {
    size_t width = swiglu ? 2 * (size_t)K : (size_t)K, at = (size_t)m * width;
    for (int k = 0; k < K; k++) {
        float v = x_bf16 ? bf16_to_f32(((const uint16_t *)x)[at + k]) : ((const float *)x)[at + k];
        if (swiglu) {
            float u = x_bf16 ? bf16_to_f32(((const uint16_t *)x)[at + K + k]) : ((const float *)x)[at + K + k];
            v = v / (1.f + expf(-v)) * u;
        }
        xf[k] = v;
    }
    float s = 1.f;
    if (norm_eps >= 0.f) {
        double sq = 0.0;
        for (int k = 0; k < K; k++) sq += (double)xf[k] * xf[k];
        s = 1.f / sqrtf((float)(sq / K) + norm_eps);
    }
    for (int k = 0; k < K; k++) xf[k] *= in_scale ? s * in_scale[k] : s;
}

int gemv_run(const Weight *Wp, const void *x, int x_bf16, int M, const float *in_scale, const float *bias,
             void *y, int y_bf16, int threads, float norm_eps, int swiglu, const void *residual) {
    Weight W = *Wp;
    int kind = W.kind, N = W.N, K = W.K, group = W.group;
    const float *scale = W.scale;
    int groups = kind == WEIGHT_INT4 ? K / group : 0;
    int integer = int_dot_fits(&W);
    size_t floats = (size_t)M * K + (size_t)M * groups + (integer ? (size_t)M * K / 32 + (size_t)M * K / 4 : 0);
    float *xf = (float *)malloc(sizeof(float) * floats);
    if (!xf) return -1;
    float *xsum = xf + (size_t)M * K;
    for (int m = 0; m < M; m++) read_row(x, x_bf16, m, K, swiglu, norm_eps, in_scale, xf + (size_t)m * K);
    QuantizedX xq = {NULL, NULL};
#ifdef __AVX2__
    if (integer) {
        float *d = xsum + (size_t)M * groups;
        int8_t *q = (int8_t *)(d + (size_t)M * K / 32);
        quantize_rows(xf, M, K, q, d);
        xq.q = q, xq.d = d;
        /* int4's zero term takes the sums of the rounded x, so the product is exactly W times it: the
           error is then W (x - x_rounded), not (W - zero)(x - x_rounded), larger for wide groups */
        for (int m = 0; m < M; m++)
            for (int g = 0; g < groups; g++) {
                float t = 0.f;
                for (int b = g * group / 32; b < (g + 1) * group / 32; b++) {
                    int s = 0;
                    for (int k = 32 * b; k < 32 * b + 32; k++) s += q[(size_t)m * K + k];
                    t += d[(size_t)m * K / 32 + b] * (float)s;
                }
                xsum[m * groups + g] = t;
            }
    }
#endif
    for (int m = 0; m < M && !xq.q; m++)
        for (int g = 0; g < groups; g++) {
            float t = 0.f;
            for (int k = g * group; k < (g + 1) * group; k++) t += xf[(size_t)m * K + k];
            xsum[m * groups + g] = t;
        }
    int block = kind == WEIGHT_INT4 ? 32 : 4, blocks = (N + block - 1) / block;
#pragma omp parallel num_threads(threads)
    {
    /* NULL (no memory) only costs speed: rows4_simd then converts the weights for every pair of rows. */
    float *scratch = M > 2 && kind == WEIGHT_BF16 ? (float *)malloc(sizeof(float) * 4 * (size_t)K) : NULL;
#pragma omp for schedule(static)
    for (int b = 0; b < blocks; b++) {
        int n0 = b * block, rows = N - n0 < block ? N - n0 : block;
        Int4Tile tile_at;
        const Int4Tile *tile = kind == WEIGHT_INT4 && int4_tile(&W, b, &tile_at) ? &tile_at : NULL;
        float out[32 * MAX_ROWS];
        block_rows(&W, tile, n0, rows, xf, &xq, M, xsum, out, block, scratch);
        for (int m = 0; m < M; m++)
            for (int j = 0; j < rows; j++) {
                int n = block_row(tile, n0, j);
                float v = out[m * block + j];
                if (kind == WEIGHT_INT8) v *= scale[n];
                if (bias) v += bias[n];
                size_t at = (size_t)m * N + n;
                if (residual) v += y_bf16 ? bf16_to_f32(((const uint16_t *)residual)[at]) : ((const float *)residual)[at];
                if (y_bf16) ((uint16_t *)y)[at] = f32_to_bf16(v);
                else ((float *)y)[at] = v;
            }
    }
    free(scratch);
    }
    free(xf);
    return 0;
}

/* The entry point from Python (cpu_kernels.SmallBatchLinear): gemv_run over a weight given by parts. */
int portachat_gemv(int kind, const void *w, const float *scale, const float *zero, int group, int N, int K,
                   int block, const void *x, int x_bf16, int M, const float *in_scale, const float *bias, void *y,
                   int y_bf16, int threads, float norm_eps, int swiglu, const void *residual) {
    Weight W = {kind, w, scale, zero, group, N, K, block};
    return gemv_run(&W, x, x_bf16, M, in_scale, bias, y, y_bf16, threads, norm_eps, swiglu, residual);
}
