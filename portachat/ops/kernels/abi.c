/* The interface portachat.ops.cpu_kernels mirrors in ctypes, as this build sees it: Python compares
   it with its own mirror when it loads the library, and keeps PyTorch's kernels where they differ
   (a call through a wrong mirror reads garbage or crashes; a comparison costs nothing).

   portachat_abi(out, size) writes "name=value;..." into out (size bytes, NUL-terminated, as snprintf
   does) and returns the length the whole text needs. Names: each entry point's signature (return
   code ':' argument codes; i int, q int64_t, f float, p pointer, v void), the WEIGHT_* values,
   sizeof(Product) and the offset of each field Python's _Product spells out, and MAX_ROWS. Each
   signature below is checked against kernels.h's prototype when this file compiles, so the report
   cannot drift from the functions it describes. */
#include <stddef.h>
#include <stdio.h>

#include "kernels.h"

/* One code per type; a pointer to T selects it, so void (no arguments, no result) has one too. */
#define CODE(T) _Generic((T *)0, int *: 'i', int64_t *: 'q', float *: 'f', void *: 'v', default: 'p')

/* CODE of each of up to 24 types: the signature's argument codes (the trailing `-` keeps FE_PICK's
   `...` non-empty, as ISO C asks). */
#define FE_1(x) CODE(x)
#define FE_2(x, ...) CODE(x), FE_1(__VA_ARGS__)
#define FE_3(x, ...) CODE(x), FE_2(__VA_ARGS__)
#define FE_4(x, ...) CODE(x), FE_3(__VA_ARGS__)
#define FE_5(x, ...) CODE(x), FE_4(__VA_ARGS__)
#define FE_6(x, ...) CODE(x), FE_5(__VA_ARGS__)
#define FE_7(x, ...) CODE(x), FE_6(__VA_ARGS__)
#define FE_8(x, ...) CODE(x), FE_7(__VA_ARGS__)
#define FE_9(x, ...) CODE(x), FE_8(__VA_ARGS__)
#define FE_10(x, ...) CODE(x), FE_9(__VA_ARGS__)
#define FE_11(x, ...) CODE(x), FE_10(__VA_ARGS__)
#define FE_12(x, ...) CODE(x), FE_11(__VA_ARGS__)
#define FE_13(x, ...) CODE(x), FE_12(__VA_ARGS__)
#define FE_14(x, ...) CODE(x), FE_13(__VA_ARGS__)
#define FE_15(x, ...) CODE(x), FE_14(__VA_ARGS__)
#define FE_16(x, ...) CODE(x), FE_15(__VA_ARGS__)
#define FE_17(x, ...) CODE(x), FE_16(__VA_ARGS__)
#define FE_18(x, ...) CODE(x), FE_17(__VA_ARGS__)
#define FE_19(x, ...) CODE(x), FE_18(__VA_ARGS__)
#define FE_20(x, ...) CODE(x), FE_19(__VA_ARGS__)
#define FE_21(x, ...) CODE(x), FE_20(__VA_ARGS__)
#define FE_22(x, ...) CODE(x), FE_21(__VA_ARGS__)
#define FE_23(x, ...) CODE(x), FE_22(__VA_ARGS__)
#define FE_24(x, ...) CODE(x), FE_23(__VA_ARGS__)
#define FE_PICK(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, _17, _18, _19, _20, _21, \
                _22, _23, _24, NAME, ...)                                                                           \
    NAME
#define CODES(...)                                                                                               \
    FE_PICK(__VA_ARGS__, FE_24, FE_23, FE_22, FE_21, FE_20, FE_19, FE_18, FE_17, FE_16, FE_15, FE_14, FE_13,  \
            FE_12, FE_11, FE_10, FE_9, FE_8, FE_7, FE_6, FE_5, FE_4, FE_3, FE_2, FE_1, -)(__VA_ARGS__)

/* An entry point's signature: the function must have exactly this type (else this file does not
   compile), and its text is what portachat_abi reports. */
#define SIGNATURE(name, ret, ...)                                                                         \
    _Static_assert(_Generic(&name, ret(*)(__VA_ARGS__): 1, default: 0),                                  \
                   #name " differs from its signature in abi.c: update both it and cpu_kernels.py");     \
    static const char name##_sig[] = {CODE(ret), ':', CODES(__VA_ARGS__), 0};

SIGNATURE(portachat_gemv, int, int, const void *, const float *, const float *, int, int, int, int, const void *,
          int, int, const float *, const float *, void *, int, int, float, int, const void *)
SIGNATURE(portachat_decode_layers, int, const Product *, const float *, int, void *, int, int, const int64_t *,
          const float *, const float *, float *, float *, int64_t, int64_t, const int64_t *, const int64_t *,
          const uint8_t *, int, int, int, int, int)
SIGNATURE(portachat_int_dot, int, void)
SIGNATURE(portachat_set_int_dot, void, int)
SIGNATURE(portachat_abi, int, char *, int)

int portachat_abi(char *out, int size) {
    const char *sig = "portachat_gemv=%s;portachat_decode_layers=%s;portachat_int_dot=%s;"
                      "portachat_set_int_dot=%s;portachat_abi=%s;";
    const char *values = "weight.fp32=%d;weight.bf16=%d;weight.int8=%d;weight.int4=%d;max_rows=%d;"
                         "sizeof.Product=%zu;Product.kind=%zu;Product.w=%zu;Product.scale=%zu;Product.zero=%zu;"
                         "Product.group=%zu;Product.n=%zu;Product.k=%zu;Product.block=%zu;"
                         "Product.in_scale=%zu;Product.bias=%zu";
    int n = snprintf(out, size, sig, portachat_gemv_sig, portachat_decode_layers_sig, portachat_int_dot_sig,
                     portachat_set_int_dot_sig, portachat_abi_sig);
    if (n < 0) return n;
    int room = n < size ? size - n : 0;
    int m = snprintf(room ? out + n : NULL, room, values, WEIGHT_F32, WEIGHT_BF16, WEIGHT_INT8, WEIGHT_INT4,
                     MAX_ROWS, sizeof(Product), offsetof(Product, weight.kind), offsetof(Product, weight.w),
                     offsetof(Product, weight.scale), offsetof(Product, weight.zero),
                     offsetof(Product, weight.group), offsetof(Product, weight.N), offsetof(Product, weight.K),
                     offsetof(Product, weight.block), offsetof(Product, in_scale), offsetof(Product, bias));
    return m < 0 ? m : n + m;
}
