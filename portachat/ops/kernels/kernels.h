/* What the kernels' files share (portachat/ops/kernels). */
#ifndef PORTACHAT_KERNELS_H
#define PORTACHAT_KERNELS_H

#include <stdint.h>

enum { WEIGHT_F32 = 0, WEIGHT_BF16 = 1, WEIGHT_INT8 = 2, WEIGHT_INT4 = 3 };

#define MAX_ROWS 64 /* rows of x per gemv_run (its per-thread output tile) */

typedef struct {
    int kind;
    const void *w;       /* [N, K] (int4: N * K / 2 bytes in PyTorch's packed layout, see gemv.c) */
    const float *scale;  /* int8: [N]; int4: [K / group, N] */
    const float *zero;   /* int4: [K / group, N], the value of code 0 */
    int group;
    int N, K;
    int block;           /* int4: rows per packing block, 32 or 64 (PyTorch's AVX2 or AVX-512 build) */
} Weight;

/* A product of decode_step.c: its weight, the norm's weight (qkv, gate_up) or NULL, and the q/k/v
   biases (Qwen2) or NULL. */
typedef struct {
    Weight weight;
    const float *in_scale;
    const float *bias;
} Product;

/* 32 rows of an int4 weight inside one full packing block: the codes of input k are the 16 bytes at
   p + k * stride, low nibbles rows lo..lo+15, high nibbles rows hi..hi+15 (gemv.c's int4_tile). */
typedef struct {
    const uint8_t *p;
    int stride, lo, hi;
} Int4Tile;

/* The weight row of a tile's output j (0..31): its low rows, then its high ones. */
static inline int int4_tile_row(const Int4Tile *t, int j) { return j < 16 ? t->lo + j : t->hi + j - 16; }

/* y [M, N] = W (x's rows read as gemv.c's read_row says) + bias (+ residual, in y's dtype). x_bf16 /
   y_bf16: whether x and y are bf16 (else fp32). M <= MAX_ROWS. Returns 0, or -1 when out of memory. */
int gemv_run(const Weight *W, const void *x, int x_bf16, int M, const float *in_scale, const float *bias,
             void *y, int y_bf16, int threads, float norm_eps, int swiglu, const void *residual);

/* int_dot.c: int8/int4 weights times x quantized to int8 in blocks of 32 (AVX2 only). */
int int_dot_fits(const Weight *W);
void quantize_rows(const float *x, int M, int K, int8_t *q, float *d);
void int8_rows4(const Weight *W, int n0, const int8_t *q, const float *d, int M, float *out);
void int4_rows32(const Weight *W, const Int4Tile *t, const int8_t *q, const float *d, const float *xsum, int M,
                 float *out);

int portachat_decode_attention(float *qkv, const int64_t *positions, const float *cos, const float *sin_signed,
                               float *k_cache, float *v_cache, int64_t num_slots, const int64_t *slot_mapping,
                               const int64_t *slots, const uint8_t *mask, int B, int L, int H, int H_kv, int D,
                               float *y, int threads);

/* The entry points Python calls (portachat.ops.cpu_kernels.ENTRY_POINTS mirrors them; abi.c reports
   their signatures, checked against these prototypes when it compiles). */
int portachat_gemv(int kind, const void *w, const float *scale, const float *zero, int group, int N, int K,
                   int block, const void *x, int x_bf16, int M, const float *in_scale, const float *bias, void *y,
                   int y_bf16, int threads, float norm_eps, int swiglu, const void *residual);
int portachat_decode_layers(const Product *products, const float *norm_eps, int layers, void *x, int x_bf16,
                            int M, const int64_t *positions, const float *cos, const float *sin_signed,
                            float *k_cache, float *v_cache, int64_t layer_stride, int64_t num_slots,
                            const int64_t *slot_mapping, const int64_t *slots, const uint8_t *mask, int L, int H,
                            int H_kv, int D, int threads);
int portachat_int_dot(void);
void portachat_set_int_dot(int on);
int portachat_abi(char *out, int size);

#endif
