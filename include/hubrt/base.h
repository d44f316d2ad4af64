/* hubrt base definitions: status codes, dtypes, errors, logging.
 *
 * Every public call returns an hr_status. On failure the thread-local
 * message from hr_last_error() names the file, tensor or field at fault. */
#ifndef HUBRT_BASE_H
#define HUBRT_BASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HUBRT_VERSION_MAJOR 0
#define HUBRT_VERSION_MINOR 1
#define HUBRT_VERSION_PATCH 0
#define HUBRT_VERSION_STRING "0.1.0"

#if defined(__GNUC__)
#define HR_API __attribute__((visibility("default")))
#define HR_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#define HR_NODISCARD __attribute__((warn_unused_result))
#else
#define HR_API
#define HR_PRINTF(fmt, args)
#define HR_NODISCARD
#endif

/* Maximum tensor rank. */
#define HR_MAX_DIMS 8

typedef enum hr_status {
    HR_OK = 0,
    HR_ERR_INVALID_ARG = 1,   /* a caller passed something wrong */
    HR_ERR_SHAPE = 2,         /* shapes do not fit the op */
    HR_ERR_DTYPE = 3,         /* dtype not accepted by the op */
    HR_ERR_OOM = 4,           /* allocation failed */
    HR_ERR_IO = 5,            /* file system error */
    HR_ERR_FORMAT = 6,        /* malformed file content */
    HR_ERR_NOT_FOUND = 7,     /* missing tensor, file, key, device */
    HR_ERR_UNSUPPORTED = 8,   /* valid request hubrt cannot serve */
    HR_ERR_DEVICE = 9,        /* a device or plugin failed */
    HR_ERR_INTERNAL = 10,     /* a bug in hubrt */
    HR_ERR_PERMISSION = 11,   /* refused by policy: an untrusted kernel publisher */
    HR_STATUS_COUNT
} hr_status;

HR_API const char *hr_status_name(hr_status s);

/* The message of the last failed call on this thread ("" when none). */
HR_API const char *hr_last_error(void);
HR_API void hr_clear_error(void);

/* Storage types. Values are stable: they appear in cache keys and the ABI. */
#define HR_DTYPE_LIST(X)                 \
    X(F32, f32, "F32", 4, float)         \
    X(BF16, bf16, "BF16", 2, uint16_t)   \
    X(F16, f16, "F16", 2, uint16_t)      \
    X(I64, i64, "I64", 8, int64_t)       \
    X(I32, i32, "I32", 4, int32_t)       \
    X(U8, u8, "U8", 1, uint8_t)          \
    X(BOOL, bool, "BOOL", 1, uint8_t)    \
    X(F64, f64, "F64", 8, double)        \
    X(I8, i8, "I8", 1, int8_t)           \
    X(I16, i16, "I16", 2, int16_t)
/* Element types added after the block types, which keeps the values
 * stable. F8_E4M3 (the Hub's FP8 weights) is storage only: the FP8 loader
 * reads it, no op does. */
#define HR_DTYPE_LIST_LATE(X) X(F8_E4M3, f8_e4m3, "F8_E4M3", 1, uint8_t)

/* Block-quantized storage types, ggml's block formats byte for byte (FP8:
 * hubrt's own, an f32 scale then 32 F8_E4M3 bytes, the layout the Hub's
 * FP8 checkpoints are repacked into at load): a row of n elements is
 * n / block blocks of `bytes` bytes each. Only the CPU linear and embedding
 * kernels read them (weights kept quantized); views keep whole rows.
 * (name, short name, elements per block, bytes per block) */
#define HR_QTYPE_LIST(X)          \
    X(Q8_0, q8_0, 32, 34)         \
    X(Q4_0, q4_0, 32, 18)         \
    X(Q4_1, q4_1, 32, 20)         \
    X(Q5_0, q5_0, 32, 22)         \
    X(Q5_1, q5_1, 32, 24)         \
    X(Q2_K, q2_k, 256, 84)        \
    X(Q3_K, q3_k, 256, 110)       \
    X(Q4_K, q4_k, 256, 144)       \
    X(Q5_K, q5_k, 256, 176)       \
    X(Q6_K, q6_k, 256, 210)       \
    X(IQ4_NL, iq4_nl, 32, 18)     \
    X(IQ4_XS, iq4_xs, 256, 136)   \
    X(MXFP4, mxfp4, 32, 17)       \
    X(FP8, fp8, 32, 36)

typedef enum hr_dtype {
#define HR_X_(E, n, st, sz, ct) HR_##E,
    HR_DTYPE_LIST(HR_X_)
#undef HR_X_
#define HR_X_(E, n, blk, bytes) HR_##E,
    HR_QTYPE_LIST(HR_X_)
#undef HR_X_
#define HR_X_(E, n, st, sz, ct) HR_##E,
    HR_DTYPE_LIST_LATE(HR_X_)
#undef HR_X_
    HR_DTYPE_COUNT
} hr_dtype;

/* Bytes per element; 0 for a block-quantized type (hr_dtype_nbytes). */
HR_API size_t hr_dtype_size(hr_dtype dt);
/* Elements per block: 1 for the plain types, 32 or 256 for block types. */
HR_API int64_t hr_dtype_block(hr_dtype dt);
/* Bytes of n elements (n a multiple of the block). */
HR_API size_t hr_dtype_nbytes(hr_dtype dt, int64_t n);
HR_API bool hr_dtype_is_quantized(hr_dtype dt);
/* Short name: "f32", "bf16", ... */
HR_API const char *hr_dtype_name(hr_dtype dt);
/* Accepts the short names, safetensors names ("BF16") and torch-style names
 * ("bfloat16", "float32", "float16", "int64", ...). */
HR_API hr_status hr_dtype_parse(const char *name, hr_dtype *out);
/* Name used in safetensors headers ("F32", "BF16", ...). */
HR_API const char *hr_dtype_safetensors_name(hr_dtype dt);
HR_API bool hr_dtype_is_float(hr_dtype dt);

/* Logging: level from HUBRT_LOG=debug|info|warn|error (default warn). */
typedef enum hr_log_level {
    HR_LOG_DEBUG = 0,
    HR_LOG_INFO = 1,
    HR_LOG_WARN = 2,
    HR_LOG_ERROR = 3,
    HR_LOG_OFF = 4
} hr_log_level;

HR_API void hr_log_set_level(hr_log_level level);
HR_API hr_log_level hr_log_get_level(void);
HR_API void hr_log(hr_log_level level, const char *fmt, ...) HR_PRINTF(2, 3);

HR_API const char *hr_version(void);

#ifdef __cplusplus
}
#endif
#endif
