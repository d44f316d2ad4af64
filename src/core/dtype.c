/* dtype table: sizes and names in hubrt, safetensors and torch spellings. */
#include <string.h>
#include <strings.h>

#include "core/error.h"

static const struct {
    const char *name, *st_name;
    size_t size;  /* per element; 0 for block types */
    int64_t block;
    size_t block_bytes;
} dtype_info[HR_DTYPE_COUNT] = {
#define HR_X_(E, n, st, sz, ct) [HR_##E] = {#n, st, sz, 1, sz},
    HR_DTYPE_LIST(HR_X_)
    HR_DTYPE_LIST_LATE(HR_X_)
#undef HR_X_
/* block types have no safetensors spelling: their short name stands in */
#define HR_X_(E, n, blk, bytes) [HR_##E] = {#n, #n, 0, blk, bytes},
    HR_QTYPE_LIST(HR_X_)
#undef HR_X_
};

size_t hr_dtype_size(hr_dtype dt) {
    return (unsigned)dt < HR_DTYPE_COUNT ? dtype_info[dt].size : 0;
}

int64_t hr_dtype_block(hr_dtype dt) { return (unsigned)dt < HR_DTYPE_COUNT ? dtype_info[dt].block : 1; }

size_t hr_dtype_nbytes(hr_dtype dt, int64_t n) {
    if ((unsigned)dt >= HR_DTYPE_COUNT || n <= 0) return 0;
    return (size_t)(n / dtype_info[dt].block) * dtype_info[dt].block_bytes;
}

bool hr_dtype_is_quantized(hr_dtype dt) { return (unsigned)dt < HR_DTYPE_COUNT && dtype_info[dt].block > 1; }

const char *hr_dtype_name(hr_dtype dt) {
    return (unsigned)dt < HR_DTYPE_COUNT ? dtype_info[dt].name : "invalid";
}

const char *hr_dtype_safetensors_name(hr_dtype dt) {
    return (unsigned)dt < HR_DTYPE_COUNT ? dtype_info[dt].st_name : "invalid";
}

bool hr_dtype_is_float(hr_dtype dt) {
    return dt == HR_F32 || dt == HR_BF16 || dt == HR_F16 || dt == HR_F64;
}

static const struct {
    const char *alias;
    hr_dtype dt;
} dtype_aliases[] = {
    {"float32", HR_F32},  {"float", HR_F32},     {"bfloat16", HR_BF16},
    {"float16", HR_F16},  {"half", HR_F16},      {"int64", HR_I64},
    {"long", HR_I64},     {"int32", HR_I32},     {"int", HR_I32},
    {"uint8", HR_U8},     {"float64", HR_F64},   {"double", HR_F64},
    {"int8", HR_I8},      {"int16", HR_I16},     {"torch.float32", HR_F32},
    {"torch.bfloat16", HR_BF16}, {"torch.float16", HR_F16},
};

hr_status hr_dtype_parse(const char *name, hr_dtype *out) {
    if (!name || !out) return hr_error(HR_ERR_INVALID_ARG, "hr_dtype_parse: NULL argument");
    for (int i = 0; i < HR_DTYPE_COUNT; i++) {
        if (!strcmp(name, dtype_info[i].name) || !strcmp(name, dtype_info[i].st_name)) {
            *out = (hr_dtype)i;
            return HR_OK;
        }
    }
    for (size_t i = 0; i < sizeof dtype_aliases / sizeof dtype_aliases[0]; i++) {
        if (!strcasecmp(name, dtype_aliases[i].alias)) {
            *out = dtype_aliases[i].dt;
            return HR_OK;
        }
    }
    return hr_error(HR_ERR_DTYPE,
                    "unknown dtype '%s' (expected one of f32, bf16, f16, i64, i32, u8, bool, "
                    "f64, i8, i16, f8_e4m3, a torch/safetensors spelling, or a block type q8_0, q4_0, q4_1, "
                    "q5_0, q5_1, q2_k .. q6_k, iq4_nl, iq4_xs, mxfp4, fp8)",
                    name);
}
