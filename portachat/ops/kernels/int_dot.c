/* Integer products for int8 and int4 weights: what makes quantized decoding compute-light.

Converting every weight code to fp32 for an FMA costs more than streaming the weights at a few rows
of x (measured: int8 and int4 were compute-bound at batch 1, and at 32 rows all widths were). So,
as llama.cpp does, x is quantized too: each row in blocks of 32 inputs to int8 with one fp32 scale
per block (q8_0's layout; |error| <= scale / 2 per input), and the codes are multiplied as
integers with AVX2's maddubs, 32 products an instruction against an FMA's 8. One block's integer
sum is scaled once: y = sum_b d_b * sum_{k in b} code_k q_k (int8: then the row's scale; int4:
per group, scale * that + zero * the rounded x's sum). So y = W x_rounded exactly, up to fp32 sums:
|error| <= |W| times x's rounding. The result depends on each row of x alone, so a row gives
the same output whatever else is in the batch (speculative verification equals plain decoding).

Only with AVX2 (gemv.c keeps the fp32 path otherwise), for K % 32 == 0 and int4 groups that are
multiples of 32 up to 256 (int_dot_fits).
*/
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "kernels.h"

static int int_dot_on = 1;  /* portachat_set_int_dot: off, int8/int4 take the fp32 path (exact in x) */

void portachat_set_int_dot(int on) { int_dot_on = on; }

int int_dot_fits(const Weight *W) {
#ifdef __AVX2__
    if (!int_dot_on || W->K % 32) return 0;
    if (W->kind == WEIGHT_INT8) return 1;
    return W->kind == WEIGHT_INT4 && W->group % 32 == 0 && W->group <= 256;
#else
    (void)W;
    return 0;
#endif
}

#ifdef __AVX2__
/* x [M, K] fp32 -> q [M, K] int8 and d [M, K / 32]: x ~= d * q, per block round to nearest. */
void quantize_rows(const float *x, int M, int K, int8_t *q, float *d) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (size_t b = 0; b < (size_t)M * K / 32; b++) {
        const float *xb = x + 32 * b;
        __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8), v2 = _mm256_loadu_ps(xb + 16),
               v3 = _mm256_loadu_ps(xb + 24);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v0, abs_mask), _mm256_and_ps(v1, abs_mask)),
                                 _mm256_max_ps(_mm256_and_ps(v2, abs_mask), _mm256_and_ps(v3, abs_mask)));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        float amax = _mm_cvtss_f32(h);
        d[b] = amax / 127.f;
        __m256 inv = _mm256_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
        __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, inv)), i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, inv)),
                i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, inv)), i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, inv));
        /* packs interleave the 128-bit lanes: the permute puts the 32 values back in order */
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
        _mm256_storeu_si256((__m256i *)(q + 32 * b), _mm256_permutevar8x32_epi32(p, order));
    }
}

/* Sums of 4 adjacent products |w| * (x with w's sign) in 8 int32 lanes: maddubs wants one operand
   unsigned, and a pair of products fits its int16 (2 * 128 * 127). */
static inline __m256i dot_i8(__m256i w_abs, __m256i w, __m256i x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w_abs, _mm256_sign_epi8(x, w)), _mm256_set1_epi16(1));
}

/* The scaled sum of one int8 weight row with a quantized row of x: two accumulators, even and odd
   blocks. */
static inline __attribute__((always_inline)) float int8_finish(__m256 a0, __m256 a1) {
    __m256 a = _mm256_add_ps(a0, a1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    h = _mm_hadd_ps(h, h);
    return _mm_cvtss_f32(_mm_hadd_ps(h, h));
}

/* Int8 rows n0..n0+3 times one or two quantized rows of x (`two`, a constant once inlined), sharing
   the weight loads and |w|; out0[j], out1[j]. Each weight row is read straight through memory (as
   gemv.c's rows4_pass; 1.25x the four rows in lockstep at one row of x). Each row of x gets the same
   sum, in the same order, alone or paired: its output does not depend on the batch. */
static inline __attribute__((always_inline)) void int8_pass(const Weight *W, int n0, const int two, const int8_t *x0,
                                                            const float *d0, const int8_t *x1, const float *d1,
                                                            float *out0, float *out1, int first) {
    size_t K = (size_t)W->K;
    int blocks = W->K / 32, prefetch = first && n0 + 20 <= W->N;  /* 16 rows ahead into L2, as gemv.c */
    for (int j = 0; j < 4; j++) {
        const int8_t *w = (const int8_t *)W->w + (size_t)(n0 + j) * K;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0;
        int b = 0;
        for (; b + 2 <= blocks; b += 2) {
            size_t k = 32 * (size_t)b;
            if (prefetch) _mm_prefetch((const char *)(w + 16 * K + k), _MM_HINT_T1);
            __m256i w0 = _mm256_loadu_si256((const __m256i *)(w + k)), u0 = _mm256_sign_epi8(w0, w0);
            __m256i w1 = _mm256_loadu_si256((const __m256i *)(w + k + 32)), u1 = _mm256_sign_epi8(w1, w1);
            __m256i s0 = dot_i8(u0, w0, _mm256_loadu_si256((const __m256i *)(x0 + k)));
            __m256i s1 = dot_i8(u1, w1, _mm256_loadu_si256((const __m256i *)(x0 + k + 32)));
            a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_set1_ps(d0[b]), a0);
            a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1), _mm256_set1_ps(d0[b + 1]), a1);
            if (two) {
                s0 = dot_i8(u0, w0, _mm256_loadu_si256((const __m256i *)(x1 + k)));
                s1 = dot_i8(u1, w1, _mm256_loadu_si256((const __m256i *)(x1 + k + 32)));
                b0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_set1_ps(d1[b]), b0);
                b1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1), _mm256_set1_ps(d1[b + 1]), b1);
            }
        }
        if (b < blocks) {
            size_t k = 32 * (size_t)b;
            __m256i w0 = _mm256_loadu_si256((const __m256i *)(w + k)), u0 = _mm256_sign_epi8(w0, w0);
            __m256i s0 = dot_i8(u0, w0, _mm256_loadu_si256((const __m256i *)(x0 + k)));
            a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_set1_ps(d0[b]), a0);
            if (two) {
                s0 = dot_i8(u0, w0, _mm256_loadu_si256((const __m256i *)(x1 + k)));
                b0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_set1_ps(d1[b]), b0);
            }
        }
        out0[j] = int8_finish(a0, a1);
        if (two) out1[j] = int8_finish(b0, b1);
    }
}

/* Int8 rows n0..n0+3 (codes, without their row scale) times every quantized row of x, two rows of x a
   pass; out[m * 4 + j]. */
void int8_rows4(const Weight *W, int n0, const int8_t *q, const float *d, int M, float *out) {
    size_t K = (size_t)W->K, blocks = K / 32;
    int m = 0;
    for (; m + 2 <= M; m += 2)
        int8_pass(W, n0, 1, q + m * K, d + m * blocks, q + (m + 1) * K, d + (m + 1) * blocks, out + 4 * m,
                  out + 4 * m + 4, m == 0);
    if (m < M) int8_pass(W, n0, 0, q + m * K, d + m * blocks, NULL, NULL, out + 4 * m, NULL, m == 0);
}

/* The codes of inputs k and k + 1 for the 32 rows of an int4 tile (gemv.c's layout: per input 16
   bytes at p + k * stride, low nibbles rows lo.., high nibbles rows hi..), laid out for maddubs, which
   sums adjacent byte pairs: [row r at k, row r at k + 1] for the low rows (rows) and the high ones
   (rows_high). One 32-byte load where the two inputs' bytes are adjacent (32-row packing blocks), two
   16-byte ones otherwise; the permute puts each row's two bytes in one 128-bit lane, the shuffle
   interleaves them. */
static inline __attribute__((always_inline)) void int4_pair(const uint8_t *p, int stride, int k, __m256i *rows,
                                                           __m256i *rows_high) {
    const __m256i low4 = _mm256_set1_epi8(15);
    const __m256i interleave = _mm256_setr_epi8(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15,
                                                0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
    const uint8_t *at = p + (size_t)k * stride;
    __m256i v = stride == 16 ? _mm256_loadu_si256((const __m256i *)at)
                             : _mm256_loadu2_m128i((const __m128i *)(at + stride), (const __m128i *)at);
    __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
    *rows = _mm256_shuffle_epi8(_mm256_permute4x64_epi64(lo, 0xD8), interleave);
    *rows_high = _mm256_shuffle_epi8(_mm256_permute4x64_epi64(hi, 0xD8), interleave);
}

/* One group's sums for the 32 rows of a block and one quantized row of x (xq, xd: the group's inputs
   and block scales): f[j] = rows 8j..8j+7, sum_b d_b * sum_k code q. The codes come from `pairs`
   (int4_pair's layout, laid out once for many rows of x) or, with `direct`, straight from the packed
   weight (`tile`) at input k0 (one row of x: laying them out first would cost more than the products).
   Either way the same integers and the same float sums: a row's output does not depend on the batch.
   A pair sum is <= 2 * 15 * 127, so 8 of them still fit int16. */
static inline __attribute__((always_inline)) void int4_group(const uint8_t *pairs, const int direct,
                                                            const Int4Tile *tile, int k0, int G, const int8_t *xq,
                                                            const float *xd, __m256 f[4]) {
    for (int j = 0; j < 4; j++) f[j] = _mm256_setzero_ps();
    for (int b = 0; b < G / 32; b++) {
        __m256i i32[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                          _mm256_setzero_si256()};
        for (int half = 0; half < 2; half++) {
            __m256i s0 = _mm256_setzero_si256(), s1 = s0, w0, w1;
            for (int i = 0; i < 8; i++) {
                int kk = 32 * b + 16 * half + 2 * i;
                int16_t xp;
                memcpy(&xp, xq + kk, 2);
                __m256i x = _mm256_set1_epi16(xp);
                if (direct) {
                    int4_pair(tile->p, tile->stride, k0 + kk, &w0, &w1);
                } else {
                    w0 = _mm256_load_si256((const __m256i *)(pairs + 32 * (size_t)kk));
                    w1 = _mm256_load_si256((const __m256i *)(pairs + 32 * (size_t)kk + 32));
                }
                s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(w0, x));
                s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(w1, x));
            }
            i32[0] = _mm256_add_epi32(i32[0], _mm256_cvtepi16_epi32(_mm256_castsi256_si128(s0)));
            i32[1] = _mm256_add_epi32(i32[1], _mm256_cvtepi16_epi32(_mm256_extracti128_si256(s0, 1)));
            i32[2] = _mm256_add_epi32(i32[2], _mm256_cvtepi16_epi32(_mm256_castsi256_si128(s1)));
            i32[3] = _mm256_add_epi32(i32[3], _mm256_cvtepi16_epi32(_mm256_extracti128_si256(s1, 1)));
        }
        __m256 db = _mm256_set1_ps(xd[b]);
        for (int j = 0; j < 4; j++) f[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i32[j]), db, f[j]);
    }
}

/* A tile of 32 int4 rows times every quantized row of x; out[m * 32 + j] (j < 16: rows t->lo + j, else
   t->hi + j - 16), scales and zeros applied (xsum: the rounded x's sums per group, [M, groups]). One
   group at a time; with several rows of x its codes are laid out once (int4_pair) into `pairs`, 64
   bytes per two inputs. */
void int4_rows32(const Weight *W, const Int4Tile *t, const int8_t *q, const float *d, const float *xsum, int M,
                 float *out) {
    int K = W->K, G = W->group, groups = K / G, blocks = K / 32, stride = t->stride;
    const uint8_t *p = t->p;
    int prefetch = M == 1 && t->lo + 2 * W->block <= W->N;
    uint8_t pairs[256 * 32] __attribute__((aligned(32)));
    memset(out, 0, sizeof(float) * 32 * (size_t)M);
    for (int g = 0; g < groups; g++) {
        if (prefetch)  /* the next packing block, one 64-byte line at a time */
            for (int k = g * G; k < (g + 1) * G; k += 64 / stride)
                _mm_prefetch((const char *)p + (size_t)K * stride + (size_t)k * stride, _MM_HINT_T1);
        if (M > 1)
            for (int i = 0; i < G / 2; i++) {
                __m256i w0, w1;
                int4_pair(p, stride, g * G + 2 * i, &w0, &w1);
                _mm256_store_si256((__m256i *)(pairs + 64 * (size_t)i), w0);
                _mm256_store_si256((__m256i *)(pairs + 64 * (size_t)i + 32), w1);
            }
        const float *scale = W->scale + (size_t)g * W->N, *zero = W->zero + (size_t)g * W->N;
        for (int m = 0; m < M; m++) {
            const int8_t *xq = q + (size_t)m * K + (size_t)g * G;
            const float *xd = d + (size_t)m * blocks + g * G / 32;
            __m256 f[4];
            if (M == 1) int4_group(NULL, 1, t, g * G, G, xq, xd, f);
            else int4_group(pairs, 0, t, g * G, G, xq, xd, f);
            __m256 sx = _mm256_set1_ps(xsum[(size_t)m * groups + g]);
            for (int j = 0; j < 4; j++) {
                float *o = out + (size_t)m * 32 + 8 * j;
                int row = int4_tile_row(t, 8 * j);
                __m256 v = _mm256_fmadd_ps(f[j], _mm256_loadu_ps(scale + row), _mm256_loadu_ps(o));
                _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_loadu_ps(zero + row), sx, v));
            }
        }
    }
}
#endif

/* Whether int8/int4 weights are multiplied as integers (portachat.ops.cpu_kernels asks). */
int portachat_int_dot(void) {
#ifdef __AVX2__
    return int_dot_on;
#else
    return 0;
#endif
}
