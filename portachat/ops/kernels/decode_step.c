/* The layers of a small step (decode rows, speculative verifications, short prefill chunks) in one
   call: per layer, the q/k/v product with the input norm fused in, attention (rotary and the cache
   writes included), the output product added to the residual, the gate/up product with the
   post-attention norm, and the down product over SwiGLU added to the residual. Python then pays one
   call a step instead of five a layer (the engine's PackedModel.forward_decode).

   products: 4 a layer (qkv, o, gate_up, down); norm_eps: 2 a layer (input, post-attention).
   x: the residual stream [M, C] (bf16 or fp32), updated in place. The caches: [layers, H_kv,
   num_slots, D] fp32, layer i at i * layer_stride floats. */
#include <stdlib.h>

#include "kernels.h"

int portachat_decode_layers(const Product *products, const float *norm_eps, int layers, void *x, int x_bf16,
                            int M, const int64_t *positions, const float *cos, const float *sin_signed,
                            float *k_cache, float *v_cache, int64_t layer_stride, int64_t num_slots,
                            const int64_t *slot_mapping, const int64_t *slots, const uint8_t *mask, int L, int H,
                            int H_kv, int D, int threads) {
    size_t qkv_width = (size_t)(H + 2 * H_kv) * D, gate_up_width = (size_t)products[2].weight.N;
    float *qkv = (float *)malloc(sizeof(float) * M * qkv_width);
    float *y = (float *)malloc(sizeof(float) * M * (size_t)H * D);
    float *gate_up = (float *)malloc(sizeof(float) * M * gate_up_width);
    int rc = qkv && y && gate_up ? 0 : -1;
    for (int i = 0; i < layers && rc == 0; i++) {
        const Product *p = products + 4 * i;
        float *kc = k_cache + i * layer_stride, *vc = v_cache + i * layer_stride;
        rc = gemv_run(&p[0].weight, x, x_bf16, M, p[0].in_scale, p[0].bias, qkv, 0, threads, norm_eps[2 * i], 0,
                      NULL);
        if (rc == 0)
            rc = portachat_decode_attention(qkv, positions, cos, sin_signed, kc, vc, num_slots, slot_mapping, slots,
                                            mask, M, L, H, H_kv, D, y, threads);
        if (rc == 0) rc = gemv_run(&p[1].weight, y, 0, M, NULL, p[1].bias, x, x_bf16, threads, -1.f, 0, x);
        if (rc == 0)
            rc = gemv_run(&p[2].weight, x, x_bf16, M, p[2].in_scale, p[2].bias, gate_up, 0, threads,
                          norm_eps[2 * i + 1], 0, NULL);
        if (rc == 0) rc = gemv_run(&p[3].weight, gate_up, 0, M, NULL, p[3].bias, x, x_bf16, threads, -1.f, 1, x);
    }
    free(qkv);
    free(y);
    free(gate_up);
    return rc;
}
