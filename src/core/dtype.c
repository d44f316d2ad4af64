/* dtype table: sizes and names in hubrt, safetensors and torch spellings. */
#include <string.h>
#include <strings.h>

#include "core/error.h"

static const struct {
    const char *name, *st_name;
    size_t size;
} dtype_info[HR_DTYPE_COUNT] = {
#define HR_X_(E, n, st, sz, ct) [HR_##E] = {#n, st, sz},
    HR_DTYPE_LIST(HR_X_)
#undef HR_X_
};

size_t hr_dtype_size(hr_dtype dt) {
    return (unsigned)dt < HR_DTYPE_COUNT ? dtype_info[dt].size : 0;
}

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
                    "f64, i8, i16 or a torch/safetensors spelling)",
                    name);
}
