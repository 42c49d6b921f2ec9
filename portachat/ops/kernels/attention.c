/* Decode attention for one layer over a paged fp32 KV cache, in one call (CPU).

At batch 1 PyTorch's path is ~25 small operations per layer (rotary, two cache writes, a gather,
two batched products, softmax, the casts between them), each costing more in dispatch than in
arithmetic. This does the same mathematics in one pass per row:

  1. rotary on q and k in place: x * cos + roll(x, D/2) * sin_signed (the sine's first half
     negated, so rotate_half is a roll), at the row's position;
  2. the row's key and value into the cache at its slot;
  3. for each query head, softmax(q . k_l / sqrt(D)) over the row's context slots, times v_l.

qkv: [B, (H + 2 H_kv) D] fp32 (q heads, then k heads, then v heads), rotated in place.
Cache: [H_kv, num_slots, D] fp32 (device.paged_attention's layout). slots: [B, L] slot of each
context position (the new token's included), mask: NULL or [B, L] bytes (1 = attend). y: [B, H D].
*/
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void rotate(float *x, const float *cos, const float *sin_signed, int D) {
    float tmp[512];  /* D <= 512: the caller checks */
    memcpy(tmp, x, sizeof(float) * D);
    int half = D / 2;
    for (int i = 0; i < D; i++) x[i] = tmp[i] * cos[i] + tmp[(i + half) % D] * sin_signed[i];
}

int portachat_decode_attention(float *qkv, const int64_t *positions, const float *cos, const float *sin_signed,
                               float *k_cache, float *v_cache, int64_t num_slots, const int64_t *slot_mapping,
                               const int64_t *slots, const uint8_t *mask, int B, int L, int H, int H_kv, int D,
                               float *y, int threads) {
    if (D > 512 || H % H_kv) return -1;
    size_t row = (size_t)(H + 2 * H_kv) * D;
    for (int b = 0; b < B; b++) {
        float *q = qkv + b * row, *k = q + (size_t)H * D, *v = k + (size_t)H_kv * D;
        const float *c = cos + positions[b] * D, *s = sin_signed + positions[b] * D;
        for (int h = 0; h < H + H_kv; h++) rotate(q + (size_t)h * D, c, s, D);
        for (int h = 0; h < H_kv; h++) {
            size_t at = ((size_t)h * num_slots + slot_mapping[b]) * D;
            memcpy(k_cache + at, k + (size_t)h * D, sizeof(float) * D);
            memcpy(v_cache + at, v + (size_t)h * D, sizeof(float) * D);
        }
    }
    float scale = 1.f / sqrtf((float)D);
    int group = H / H_kv, ok = 1;
#pragma omp parallel num_threads(threads)
    {
        float *p = (float *)malloc(sizeof(float) * (size_t)L);
        if (!p) {
#pragma omp atomic write
            ok = 0;
        }
#pragma omp for schedule(static) collapse(2)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++) {
                if (!p) continue;
                const float *q = qkv + b * row + (size_t)h * D;
                const int64_t *sl = slots + (size_t)b * L;
                const uint8_t *mk = mask ? mask + (size_t)b * L : NULL;
                size_t head = (size_t)(h / group) * num_slots;
                float top = -INFINITY;
                for (int l = 0; l < L; l++) {
                    if (mk && !mk[l]) { p[l] = -INFINITY; continue; }
                    const float *kl = k_cache + (head + sl[l]) * D;
                    float dot = 0.f;
#pragma omp simd reduction(+ : dot)
                    for (int i = 0; i < D; i++) dot += q[i] * kl[i];
                    p[l] = dot * scale;
                    if (p[l] > top) top = p[l];
                }
                float total = 0.f;
                for (int l = 0; l < L; l++) {
                    p[l] = p[l] == -INFINITY ? 0.f : expf(p[l] - top);
                    total += p[l];
                }
                float *out = y + (size_t)b * H * D + (size_t)h * D;
                memset(out, 0, sizeof(float) * D);
                for (int l = 0; l < L; l++) {
                    if (p[l] == 0.f) continue;
                    const float *vl = v_cache + (head + sl[l]) * D;
                    float w = p[l] / total;
                    for (int i = 0; i < D; i++) out[i] += w * vl[i];
                }
            }
        free(p);
    }
    return ok ? 0 : -1;
}
