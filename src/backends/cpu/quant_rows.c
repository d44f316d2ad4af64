/* Block formats into the unpacked form of quant_rows.h, activations into
 * int8 runs, and the scalar dot product. Each unpacker follows the byte
 * layout of ggml-common.h as io/gguf_quant.c's dequantizers read it; the
 * value s * u + c equals the dequantized one (tests/python/test_quant_linear.py). */
#include <math.h>
#include <string.h>

#include "backends/cpu/quant_rows.h"
#include "core/dequant.h"
#include "core/half.h"
#include "hubrt/runtime.h"

/* IQ4_NL / IQ4_XS levels (kvalues_iq4nl), as bytes with 128 added. */
static const uint8_t IQ4_U[16] = {1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241};

/* The two HR_QSUB runs of one 32-element block share s and c. */
static inline void run32(float *s, float *c, float sv, float cv) {
    s[0] = s[1] = sv;
    c[0] = c[1] = cv;
}

static void row_q8_0(const uint8_t *p, int64_t nb, uint8_t *u, float *s, float *c) {
    for (int64_t b = 0; b < nb; b++, p += 34, u += 32, s += 2, c += 2) {
        float d = hr_f16_load(p);
        for (int i = 0; i < 32; i++) u[i] = (uint8_t)(p[2 + i] ^ 0x80); /* int8 q + 128 */
        run32(s, c, d, -128.0f * d);
    }
}

/* Q4_0 / Q4_1 / IQ4_NL: element i < 16 is the low nibble of byte i, 16 + i
 * its high nibble. */
static void nibbles(const uint8_t *q, uint8_t *u, const uint8_t *levels) {
    for (int i = 0; i < 16; i++) {
        u[i] = levels ? levels[q[i] & 0xF] : (uint8_t)(q[i] & 0xF);
        u[i + 16] = levels ? levels[q[i] >> 4] : (uint8_t)(q[i] >> 4);
    }
}

static void row_q4(const uint8_t *p, int64_t nb, bool one, uint8_t *u, float *s, float *c) {
    size_t head = one ? 4 : 2;
    for (int64_t b = 0; b < nb; b++, p += head + 16, u += 32, s += 2, c += 2) {
        float d = hr_f16_load(p);
        nibbles(p + head, u, NULL);
        run32(s, c, d, one ? hr_f16_load(p + 2) : -8.0f * d);
    }
}

static void row_q5(const uint8_t *p, int64_t nb, bool one, uint8_t *u, float *s, float *c) {
    size_t head = one ? 4 : 2;
    for (int64_t b = 0; b < nb; b++, p += head + 20, u += 32, s += 2, c += 2) {
        float d = hr_f16_load(p);
        uint32_t qh;
        memcpy(&qh, p + head, 4);
        const uint8_t *q = p + head + 4;
        for (int i = 0; i < 16; i++) {
            u[i] = (uint8_t)((q[i] & 0xF) | ((qh >> i) << 4 & 0x10));
            u[i + 16] = (uint8_t)((q[i] >> 4) | ((qh >> (i + 12)) & 0x10));
        }
        run32(s, c, d, one ? hr_f16_load(p + 2) : -16.0f * d);
    }
}

static void row_iq4_nl(const uint8_t *p, int64_t nb, uint8_t *u, float *s, float *c) {
    for (int64_t b = 0; b < nb; b++, p += 18, u += 32, s += 2, c += 2) {
        float d = hr_f16_load(p);
        nibbles(p + 2, u, IQ4_U);
        run32(s, c, d, -128.0f * d);
    }
}

/* MXFP4: the doubled e2m1 levels with 12 added, so u >= 0; c = -12 d. */
static const uint8_t MXFP4_U[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};

static void row_mxfp4(const uint8_t *p, int64_t nb, uint8_t *u, float *s, float *c) {
    for (int64_t b = 0; b < nb; b++, p += 17, u += 32, s += 2, c += 2) {
        float d = hr_e8m0_half(p[0]);
        nibbles(p + 1, u, MXFP4_U);
        run32(s, c, d, -12.0f * d);
    }
}

static void row_iq4_xs(const uint8_t *p, int64_t nb, uint8_t *u, float *s, float *c) {
    for (int64_t b = 0; b < nb; b++, p += 136) {
        float d = hr_f16_load(p);
        unsigned scales_h = (unsigned)p[2] | (unsigned)p[3] << 8;
        const uint8_t *qs = p + 8;
        for (int ib = 0; ib < 8; ib++, qs += 16, u += 32, s += 2, c += 2) {
            int ls = ((p[4 + ib / 2] >> 4 * (ib % 2)) & 0xF) | (int)((scales_h >> 2 * ib) & 3) << 4;
            float dl = d * (float)(ls - 32);
            nibbles(qs, u, IQ4_U);
            run32(s, c, dl, -128.0f * dl);
        }
    }
}

/* Q2_K: 16 runs of 16, each with a 4-bit scale and a 4-bit min. */
static void row_q2_k(const uint8_t *p, int64_t nb, uint8_t *u, float *s, float *c) {
    for (int64_t b = 0; b < nb; b++, p += 84) {
        const uint8_t *sc = p, *q = p + 16;
        float d = hr_f16_load(p + 80), min = hr_f16_load(p + 82);
        int is = 0;
        for (int n = 0; n < 256; n += 128, q += 32)
            for (int shift = 0; shift < 8; shift += 2)
                for (int half = 0; half < 2; half++, is++, u += 16) {
                    *s++ = d * (float)(sc[is] & 0xF);
                    *c++ = -(min * (float)(sc[is] >> 4));
                    for (int l = 0; l < 16; l++) u[l] = (uint8_t)((q[l + 16 * half] >> shift) & 3);
                }
    }
}

/* Q3_K: 16 runs of 16; q in -4..3 becomes u = q + 4. */
static void row_q3_k(const uint8_t *p, int64_t nb, uint8_t *u, float *s, float *c) {
    for (int64_t b = 0; b < nb; b++, p += 110) {
        const uint8_t *hm = p, *q = p + 32, *raw = p + 96;
        float d = hr_f16_load(p + 108);
        int is = 0;
        uint8_t m = 1;
        for (int n = 0; n < 256; n += 128, q += 32)
            for (int shift = 0; shift < 8; shift += 2, m <<= 1)
                for (int half = 0; half < 2; half++, is++, u += 16) {
                    int lo = is < 8 ? raw[is] & 0xF : raw[is - 8] >> 4, hi = (raw[8 + is % 4] >> (2 * (is / 4))) & 3;
                    float dl = d * (float)((lo | hi << 4) - 32);
                    *s++ = dl;
                    *c++ = -4.0f * dl;
                    for (int l = 0; l < 16; l++) {
                        int i = l + 16 * half;
                        u[l] = (uint8_t)(((q[i] >> shift) & 3) + ((hm[i] & m) ? 4 : 0));
                    }
                }
    }
}

/* Q4_K / Q5_K: 8 runs of 32 (two of HR_QSUB each), each with a 6-bit scale
 * and min; 64 elements are 32 bytes' low nibbles, then their high ones. */
static void row_q45_k(const uint8_t *p, int64_t nb, bool five, uint8_t *u, float *s, float *c) {
    size_t bytes = five ? 176 : 144;
    for (int64_t b = 0; b < nb; b++, p += bytes) {
        float d = hr_f16_load(p), min = hr_f16_load(p + 2);
        const uint8_t *sc = p + 4, *qh = p + 16, *ql = p + (five ? 48 : 16);
        uint8_t u1 = 1, u2 = 2;
        for (int j = 0, is = 0; j < 256; j += 64, is += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
            int sv, mv;
            for (int h = 0; h < 2; h++, u += 32, s += 2, c += 2) {
                hr_k4_scale_min(is + h, sc, &sv, &mv);
                run32(s, c, d * (float)sv, -(min * (float)mv));
                uint8_t bit = h ? u2 : u1;
                for (int l = 0; l < 32; l++)
                    u[l] = (uint8_t)((h ? ql[l] >> 4 : ql[l] & 0xF) + (five && (qh[l] & bit) ? 16 : 0));
            }
        }
    }
}

/* Q6_K: 16 runs of 16 with int8 scales; q = u - 32, u the 6-bit code. */
static void row_q6_k(const uint8_t *p, int64_t nb, uint8_t *u, float *s, float *c) {
    for (int64_t b = 0; b < nb; b++, p += 210, u += 256, s += 16, c += 16) {
        const uint8_t *ql = p, *qh = p + 128;
        const int8_t *sc = (const int8_t *)(p + 192);
        float d = hr_f16_load(p + 208);
        for (int r = 0; r < 16; r++) {
            s[r] = d * (float)sc[r];
            c[r] = -32.0f * s[r];
        }
        /* each 128 elements: four 32-element quarters from ql[0..64) and qh[0..32) */
        for (int n = 0; n < 2; n++, ql += 64, qh += 32)
            for (int l = 0; l < 32; l++) {
                uint8_t *o = u + 128 * n + l;
                o[0] = (uint8_t)((ql[l] & 0xF) | ((qh[l] >> 0) & 3) << 4);
                o[32] = (uint8_t)((ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4);
                o[64] = (uint8_t)((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4);
                o[96] = (uint8_t)((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4);
            }
    }
}

void hr_quant_unpack_rows(hr_dtype dt, const uint8_t *src, size_t row_bytes, int64_t k, int n, uint8_t *u, float *s,
                          float *c) {
    int64_t nb = k / hr_dtype_block(dt), runs = k / HR_QSUB;
    for (int r = 0; r < n; r++, src += row_bytes, u += k, s += runs, c += runs) {
        switch (dt) {
        case HR_Q8_0: row_q8_0(src, nb, u, s, c); break;
        case HR_Q4_0: row_q4(src, nb, false, u, s, c); break;
        case HR_Q4_1: row_q4(src, nb, true, u, s, c); break;
        case HR_Q5_0: row_q5(src, nb, false, u, s, c); break;
        case HR_Q5_1: row_q5(src, nb, true, u, s, c); break;
        case HR_Q2_K: row_q2_k(src, nb, u, s, c); break;
        case HR_Q3_K: row_q3_k(src, nb, u, s, c); break;
        case HR_Q4_K: row_q45_k(src, nb, false, u, s, c); break;
        case HR_Q5_K: row_q45_k(src, nb, true, u, s, c); break;
        case HR_Q6_K: row_q6_k(src, nb, u, s, c); break;
        case HR_IQ4_NL: row_iq4_nl(src, nb, u, s, c); break;
        case HR_IQ4_XS: row_iq4_xs(src, nb, u, s, c); break;
        case HR_MXFP4: row_mxfp4(src, nb, u, s, c); break;
        default: memset(u, 0, (size_t)k), memset(s, 0, sizeof *s * (size_t)runs), memset(c, 0, sizeof *c * (size_t)runs);
        }
    }
}

static inline float x_at(const void *x, hr_dtype dt, int64_t i) {
    if (dt == HR_F32) return ((const float *)x)[i];
    uint16_t h = ((const uint16_t *)x)[i];
    return dt == HR_BF16 ? hr_bf16_to_f32(h) : hr_f16_to_f32(h);
}

void hr_quant_x_row(const void *x, hr_dtype dt, int64_t k, int8_t *q, float *xd, float *xs) {
    for (int64_t b = 0; b < k; b += HR_QX_BLOCK) {
        float v[HR_QX_BLOCK], amax = 0.0f;
        for (int i = 0; i < HR_QX_BLOCK; i++) {
            v[i] = x_at(x, dt, b + i);
            amax = fmaxf(amax, fabsf(v[i]));
        }
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int r = 0; r < HR_QX_BLOCK / HR_QSUB; r++) {
            int sum = 0;
            for (int i = r * HR_QSUB; i < (r + 1) * HR_QSUB; i++) {
                /* rounded to nearest even, as the vector conversions do;
                 * |v * id| <= 127 up to rounding */
                float t = nearbyintf(v[i] * id);
                int qi = t > 127.0f ? 127 : t < -127.0f ? -127 : (int)t;
                q[b + i] = (int8_t)qi;
                sum += qi;
            }
            xd[(b / HR_QSUB) + r] = d;
            xs[(b / HR_QSUB) + r] = d * (float)sum;
        }
    }
}

void hr_qdot_scalar(int64_t k, int nw, const uint8_t *u, const float *s, const float *c, hr_qx x, float *out) {
    int64_t runs = k / HR_QSUB;
    for (int j = 0; j < nw; j++, u += k, s += runs, c += runs) {
        float acc = 0.0f, cacc = 0.0f;
        for (int64_t r = 0; r < runs; r++) {
            int32_t sum = 0;
            for (int i = 0; i < HR_QSUB; i++) sum += (int32_t)u[r * HR_QSUB + i] * x.q[r * HR_QSUB + i];
            acc += s[r] * x.xd[r] * (float)sum;
            cacc += c[r] * x.xs[r];
        }
        out[j] = acc + cacc;
    }
}

hr_qdot_fn hr_qdot_pick(void) {
    const hr_cpu_features *f = hr_cpu_features_get();
    if (hr_cpu_isa_get() >= HR_ISA_AVX512 && f->avx512bw && f->avx512vl && f->avx512_vnni) return hr_qdot_avx512;
    return hr_qdot_scalar;
}

bool hr_qgemv_has(hr_dtype dt) { return hr_qdot_pick() == hr_qdot_avx512 && hr_qgemv_avx512_has(dt); }

bool hr_quant_tile_has(hr_dtype dt) { return hr_qdot_pick() == hr_qdot_avx512 && hr_quant_tile_avx512_has(dt); }

void hr_quant_interleave(const uint8_t *p, int64_t k, uint8_t *out) {
    int64_t runs = k / HR_QSUB;
    for (int64_t g = 0; g < runs; g += 16) {
        int n = runs - g < 16 ? (int)(runs - g) : 16;
        for (int t = 0; t < 4; t++)
            for (int l = 0; l < n; l++, out += 4) memcpy(out, p + (g + l) * HR_QSUB + 4 * t, 4);
    }
}
