/* GGUF: parsing and dequantization of hand-built images (values checked
 * against the ggml block formulas), the q/k row permutation, a corpus of
 * malformed images that must each fail with a clear message (every prefix
 * of a valid image included), and a checkpoint over a GGUF file. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/half.h"
#include "core/tensor_impl.h"
#include "hubrt.h"
#include "io/gguf.h"

typedef struct img {
    uint8_t b[4096];
    size_t n;
} img;

static void put(img *m, const void *p, size_t n) {
    assert_true(m->n + n <= sizeof m->b);
    memcpy(m->b + m->n, p, n);
    m->n += n;
}
static void u32(img *m, uint32_t v) { put(m, &v, 4); }
static void u64(img *m, uint64_t v) { put(m, &v, 8); }
static void str(img *m, const char *s) {
    u64(m, strlen(s));
    put(m, s, strlen(s));
}
static void u16(img *m, uint16_t v) { put(m, &v, 2); }

static void header(img *m, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    m->n = 0;
    u32(m, 0x46554747u);
    u32(m, version);
    u64(m, n_tensors);
    u64(m, n_kv);
}

static void kv_str(img *m, const char *key, const char *v) {
    str(m, key);
    u32(m, GGUF_STRING);
    str(m, v);
}

static void kv_u32(img *m, const char *key, uint32_t v) {
    str(m, key);
    u32(m, GGUF_U32);
    u32(m, v);
}

static void tinfo(img *m, const char *name, int nd, const uint64_t *ne, uint32_t type, uint64_t off) {
    str(m, name);
    u32(m, (uint32_t)nd);
    for (int i = 0; i < nd; i++) u64(m, ne[i]);
    u32(m, type);
    u64(m, off);
}

static void pad(img *m, size_t align) {
    while (m->n % align) m->b[m->n++] = 0;
}

/* A valid image: metadata, then F32 [2,3] at 0, Q8_0 [1, 32] at 32, Q4_0
 * [1, 32] at 96, Q4_1 [1, 32] at 128, F16 [2] at 160, BF16 [2] at 192. */
static void valid_image(img *m) {
    header(m, 3, 6, 3);
    kv_str(m, "general.architecture", "llama");
    kv_u32(m, "general.alignment", 32);
    str(m, "tokenizer.ggml.tokens");
    u32(m, GGUF_ARRAY);
    u32(m, GGUF_STRING);
    u64(m, 2);
    str(m, "a");
    str(m, "b");
    tinfo(m, "f32", 2, (uint64_t[]){3, 2}, GGML_F32, 0);
    tinfo(m, "q8", 2, (uint64_t[]){32, 1}, GGML_Q8_0, 32);
    tinfo(m, "q40", 1, (uint64_t[]){32}, GGML_Q4_0, 96);
    tinfo(m, "q41", 1, (uint64_t[]){32}, GGML_Q4_1, 128);
    tinfo(m, "f16", 1, (uint64_t[]){2}, GGML_F16, 160);
    tinfo(m, "bf16", 1, (uint64_t[]){2}, GGML_BF16, 192);
    pad(m, 32);
    size_t d = m->n;
    for (int i = 0; i < 6; i++) {
        float f = (float)i - 2.5f;
        put(m, &f, 4);
    }
    pad(m, 32);
    assert_int_equal(m->n - d, 32);
    u16(m, hr_f32_to_f16(0.25f)); /* Q8_0: q = i - 16 */
    for (int i = 0; i < 32; i++) m->b[m->n++] = (uint8_t)(int8_t)(i - 16);
    pad(m, 32);
    u16(m, hr_f32_to_f16(2.0f)); /* Q4_0: byte i = low i%16, high 15 - i%16 */
    for (int i = 0; i < 16; i++) m->b[m->n++] = (uint8_t)(i | (15 - i) << 4);
    pad(m, 32);
    u16(m, hr_f32_to_f16(0.5f)); /* Q4_1: d 0.5, m -3 */
    u16(m, hr_f32_to_f16(-3.0f));
    for (int i = 0; i < 16; i++) m->b[m->n++] = (uint8_t)(i | (15 - i) << 4);
    pad(m, 32);
    u16(m, hr_f32_to_f16(1.5f));
    u16(m, hr_f32_to_f16(-0.75f));
    pad(m, 32);
    u16(m, hr_f32_to_bf16(3.0f));
    u16(m, hr_f32_to_bf16(-0.125f));
}

static hr_gguf *parse_ok(const img *m) {
    hr_gguf *g = NULL;
    hr_status s = hr_gguf_parse("t.gguf", m->b, m->n, &g);
    if (s != HR_OK) fail_msg("%s", hr_last_error());
    return g;
}

static float *dq(hr_gguf *g, const char *name, int64_t heads, hr_tensor **t) {
    long i = hr_gguf_tensor_index(g, name);
    assert_true(i >= 0);
    assert_int_equal(hr_gguf_dequant(g, &g->tensors[i], HR_F32, heads, t), HR_OK);
    return hr_tensor_ptr(*t);
}

static void test_parse_and_dequant(void **state) {
    (void)state;
    img m;
    valid_image(&m);
    hr_gguf *g = parse_ok(&m);
    assert_int_equal(g->n_tensors, 6);
    int64_t v = 0;
    assert_int_equal(hr_gguf_get_int(g, "general.alignment", &v), HR_OK);
    assert_int_equal(v, 32);
    const gguf_kv *toks = hr_gguf_find(g, "tokenizer.ggml.tokens");
    assert_non_null(toks);
    assert_int_equal(toks->n, 2);
    assert_memory_equal(toks->strs[1].p, "b", 1);
    assert_int_equal(hr_gguf_get_int(g, "missing.key", &v), HR_ERR_NOT_FOUND);
    assert_non_null(strstr(hr_last_error(), "'missing.key'"));
    hr_tensor *t = NULL;
    float *p = dq(g, "f32", 0, &t);
    assert_int_equal(hr_tensor_shape(t)[0], 2); /* dims reversed: ne {3, 2} is [2, 3] */
    assert_int_equal(hr_tensor_shape(t)[1], 3);
    for (int i = 0; i < 6; i++) assert_true(p[i] == (float)i - 2.5f);
    hr_tensor_free(t);
    p = dq(g, "q8", 0, &t);
    for (int i = 0; i < 32; i++) assert_true(p[i] == (float)(i - 16) * 0.25f);
    hr_tensor_free(t);
    p = dq(g, "q40", 0, &t); /* low nibbles are elements 0..15, high ones 16..31 */
    for (int i = 0; i < 16; i++) {
        assert_true(p[i] == (float)(i - 8) * 2.0f);
        assert_true(p[16 + i] == (float)(15 - i - 8) * 2.0f);
    }
    hr_tensor_free(t);
    p = dq(g, "q41", 0, &t);
    for (int i = 0; i < 16; i++) {
        assert_true(p[i] == (float)i * 0.5f - 3.0f);
        assert_true(p[16 + i] == (float)(15 - i) * 0.5f - 3.0f);
    }
    hr_tensor_free(t);
    p = dq(g, "f16", 0, &t);
    assert_true(p[0] == 1.5f && p[1] == -0.75f);
    hr_tensor_free(t);
    p = dq(g, "bf16", 0, &t);
    assert_true(p[0] == 3.0f && p[1] == -0.125f);
    hr_tensor_free(t);
    /* to bf16 directly */
    assert_int_equal(hr_gguf_dequant(g, &g->tensors[3], HR_BF16, 0, &t), HR_OK);
    assert_int_equal(hr_tensor_dtype(t), HR_BF16);
    assert_true(hr_bf16_to_f32(((uint16_t *)hr_tensor_ptr(t))[1]) == 0.5f - 3.0f);
    hr_tensor_free(t);
    assert_int_equal(hr_gguf_dequant(g, &g->tensors[0], HR_I32, 0, &t), HR_ERR_DTYPE);
    hr_gguf_close(g);
}

/* llama.cpp stores head rows as interleaved pairs: HF row h*D + t*D/2 + j
 * was written at h*D + 2j + t. */
static void test_qk_permutation(void **state) {
    (void)state;
    img m;
    header(&m, 3, 1, 0);
    tinfo(&m, "q", 2, (uint64_t[]){1, 8}, GGML_F32, 0);
    pad(&m, 32);
    for (int i = 0; i < 8; i++) {
        float f = (float)i;
        put(&m, &f, 4);
    }
    hr_gguf *g = parse_ok(&m);
    hr_tensor *t = NULL;
    float *p = dq(g, "q", 2, &t); /* 2 heads of D = 4 */
    const float want[8] = {0, 2, 1, 3, 4, 6, 5, 7};
    for (int i = 0; i < 8; i++) assert_true(p[i] == want[i]);
    hr_tensor_free(t);
    assert_int_equal(hr_gguf_dequant(g, &g->tensors[0], HR_F32, 3, &t), HR_ERR_SHAPE);
    hr_gguf_close(g);
}

static void expect_fail(const img *m, const char *needle) {
    hr_gguf *g = NULL;
    hr_status s = hr_gguf_parse("bad.gguf", m->b, m->n, &g);
    assert_int_not_equal(s, HR_OK);
    assert_null(g);
    if (!strstr(hr_last_error(), needle) || strncmp(hr_last_error(), "bad.gguf: ", 10))
        fail_msg("expected '%s' in: %s", needle, hr_last_error());
}

static void test_malformed(void **state) {
    (void)state;
    img m;
    valid_image(&m);
    /* every prefix of a valid image fails with a message (or parses when
     * only unused trailing bytes are cut) and never reads past its end */
    for (size_t n = 0; n < m.n; n++) {
        hr_gguf *g = NULL;
        if (hr_gguf_parse("bad.gguf", m.b, n, &g) == HR_OK) fail_msg("prefix %zu parsed", n);
        assert_true(strncmp(hr_last_error(), "bad.gguf: ", 10) == 0);
    }
    m.b[0] = 'X';
    expect_fail(&m, "bad magic");
    header(&m, 1, 0, 0);
    expect_fail(&m, "version 1 is not supported");
    header(&m, 3, UINT64_MAX, 0);
    expect_fail(&m, "cannot fit");
    header(&m, 3, 0, (uint64_t)1 << 40);
    expect_fail(&m, "cannot fit");
    header(&m, 3, 0, 1);
    u64(&m, 1000);
    u64(&m, 0);
    expect_fail(&m, "truncated");
    header(&m, 3, 0, 1);
    str(&m, "k");
    u32(&m, 99);
    u64(&m, 0);
    expect_fail(&m, "key 'k' has unknown value type 99");
    header(&m, 3, 0, 1);
    str(&m, "k");
    u32(&m, GGUF_ARRAY);
    u32(&m, GGUF_ARRAY);
    u64(&m, 0);
    expect_fail(&m, "key 'k' is an array of unsupported type 9");
    header(&m, 3, 0, 1);
    str(&m, "k");
    u32(&m, GGUF_ARRAY);
    u32(&m, GGUF_U64);
    u64(&m, (uint64_t)1 << 61);
    expect_fail(&m, "run past the end");
    header(&m, 3, 0, 1);
    str(&m, "k");
    u32(&m, GGUF_BOOL);
    m.b[m.n++] = 2;
    u64(&m, 0);
    expect_fail(&m, "bool value 2");
    header(&m, 3, 0, 2);
    kv_u32(&m, "k", 1);
    kv_u32(&m, "k", 2);
    expect_fail(&m, "metadata key 'k' appears twice");
    header(&m, 3, 0, 1);
    kv_u32(&m, "general.alignment", 24);
    expect_fail(&m, "general.alignment must be a u32 power of two");
    header(&m, 3, 1, 0);
    tinfo(&m, "w", 5, (uint64_t[]){1, 1, 1, 1, 1}, GGML_F32, 0);
    expect_fail(&m, "tensor 'w' has rank 5");
    header(&m, 3, 1, 0);
    tinfo(&m, "w", 2, (uint64_t[]){(uint64_t)1 << 41, 1}, GGML_F32, 0);
    expect_fail(&m, "tensor 'w': dim 0");
    header(&m, 3, 1, 0);
    tinfo(&m, "w", 1, (uint64_t[]){256}, 16 /* IQ2_XXS */, 0);
    expect_fail(&m, "tensor 'w' has ggml type 16");
    header(&m, 3, 1, 0);
    tinfo(&m, "w", 1, (uint64_t[]){32}, 4 /* Q4_2, long retired: a gap in the numbering */, 0);
    expect_fail(&m, "tensor 'w' has ggml type 4");
    header(&m, 3, 1, 0);
    tinfo(&m, "w", 1, (uint64_t[]){32}, GGML_Q4_K, 0);
    expect_fail(&m, "not a multiple of the block size 256");
    header(&m, 3, 1, 0);
    tinfo(&m, "w", 1, (uint64_t[]){33}, GGML_Q8_0, 0);
    expect_fail(&m, "not a multiple of the block size 32");
    header(&m, 3, 1, 0);
    tinfo(&m, "w", 1, (uint64_t[]){4}, GGML_F32, 8);
    pad(&m, 32);
    memset(m.b + m.n, 0, 64);
    m.n += 64;
    expect_fail(&m, "tensor 'w': offset 8 is not a multiple of the alignment 32");
    header(&m, 3, 1, 0);
    tinfo(&m, "w", 1, (uint64_t[]){64}, GGML_F32, 0);
    pad(&m, 32);
    m.n += 16;
    expect_fail(&m, "tensor 'w': bytes [0, 256) of the data section lie outside the file");
    header(&m, 3, 2, 0);
    tinfo(&m, "a", 1, (uint64_t[]){16}, GGML_F32, 0);
    tinfo(&m, "b", 1, (uint64_t[]){8}, GGML_F32, 32);
    pad(&m, 32);
    memset(m.b + m.n, 0, 64);
    m.n += 64;
    expect_fail(&m, "tensors 'a' and 'b' overlap");
    header(&m, 3, 2, 0);
    tinfo(&m, "a", 1, (uint64_t[]){8}, GGML_F32, 0);
    tinfo(&m, "a", 1, (uint64_t[]){8}, GGML_F32, 32);
    pad(&m, 32);
    memset(m.b + m.n, 0, 64);
    m.n += 64;
    expect_fail(&m, "tensor 'a' appears twice");
}

/* A file on disk through hr_checkpoint_open: tensors under HF names (the
 * unmapped one left out), errors naming the file. */
static void test_checkpoint(void **state) {
    (void)state;
    char path[] = "/tmp/hubrt_gguf_XXXXXX.gguf";
    int fd = mkstemps(path, 5);
    assert_true(fd >= 0);
    img m;
    header(&m, 3, 2, 2);
    kv_str(&m, "general.architecture", "llama");
    kv_u32(&m, "llama.attention.head_count", 1);
    tinfo(&m, "blk.0.attn_norm.weight", 1, (uint64_t[]){4}, GGML_F32, 0);
    tinfo(&m, "rope_freqs.weight", 1, (uint64_t[]){4}, GGML_F32, 32);
    pad(&m, 32);
    memset(m.b + m.n, 0, 64);
    m.n += 64;
    assert_int_equal(write(fd, m.b, m.n), (ssize_t)m.n);
    close(fd);
    hr_checkpoint *ck = NULL;
    assert_int_equal(hr_checkpoint_open(path, &ck), HR_OK);
    assert_int_equal(hr_checkpoint_count(ck), 1);
    assert_string_equal(hr_checkpoint_name(ck, 0), "model.layers.0.input_layernorm.weight");
    hr_tensor_info info;
    assert_int_equal(hr_checkpoint_info(ck, "model.layers.0.input_layernorm.weight", &info), HR_OK);
    assert_int_equal(info.dtype, HR_F32);
    assert_int_equal(info.shape[0], 4);
    hr_checkpoint_close(ck);
    hr_model *model = NULL;
    assert_int_not_equal(hr_model_load(path, NULL, &model), HR_OK); /* no block_count and friends */
    assert_non_null(strstr(hr_last_error(), "llama.embedding_length"));
    unlink(path);
}

static void str_array(img *m, const char *key, int n, const char *const *v) {
    str(m, key);
    u32(m, GGUF_ARRAY);
    u32(m, GGUF_STRING);
    u64(m, (uint64_t)n);
    for (int i = 0; i < n; i++) str(m, v[i]);
}

static void write_file(const char *path, const img *m) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(m->b, 1, m->n, f), m->n);
    fclose(f);
}

/* A byte-level BPE vocabulary: merges applied, the control token matched
 * whole, BOS prepended when add_bos_token says so, other models refused. */
static void test_tokenizer_json(void **state) {
    (void)state;
    const char *path = "/tmp/hubrt_gguf_tok.gguf";
    img m;
    for (int add_bos = 0; add_bos < 2; add_bos++) {
        header(&m, 3, 0, 6);
        kv_str(&m, "tokenizer.ggml.model", "gpt2");
        str_array(&m, "tokenizer.ggml.tokens", 4, (const char *const[]){"<s>", "a", "b", "ab"});
        str_array(&m, "tokenizer.ggml.merges", 1, (const char *const[]){"a b"});
        str(&m, "tokenizer.ggml.token_type");
        u32(&m, GGUF_ARRAY);
        u32(&m, GGUF_I32);
        u64(&m, 4);
        for (int i = 0; i < 4; i++) u32(&m, i == 0 ? 3 : 1);
        kv_u32(&m, "tokenizer.ggml.bos_token_id", 0);
        str(&m, "tokenizer.ggml.add_bos_token");
        u32(&m, GGUF_BOOL);
        m.b[m.n++] = (uint8_t)add_bos;
        write_file(path, &m);
        char *json = NULL;
        size_t len = 0;
        assert_int_equal(hr_gguf_tokenizer_json(path, &json, &len), HR_OK);
        hr_tokenizer *tok = NULL;
        hr_status s = hr_tokenizer_load_json(json, len, &tok);
        free(json);
        if (s != HR_OK) fail_msg("%s", hr_last_error());
        int32_t *ids = NULL;
        size_t n = 0;
        assert_int_equal(hr_tokenizer_encode(tok, "ab<s>a", 6, true, &ids, &n), HR_OK);
        size_t k = 0;
        if (add_bos) assert_int_equal(ids[k++], 0);
        assert_int_equal(n, k + 3);
        assert_int_equal(ids[k], 3);     /* "ab" merged */
        assert_int_equal(ids[k + 1], 0); /* "<s>" whole */
        assert_int_equal(ids[k + 2], 1);
        hr_tokenizer_free_array(ids);
        hr_tokenizer_free(tok);
    }
    header(&m, 3, 0, 1);
    kv_str(&m, "tokenizer.ggml.model", "llama");
    write_file(path, &m);
    char *json = NULL;
    size_t len = 0;
    assert_int_equal(hr_gguf_tokenizer_json(path, &json, &len), HR_ERR_UNSUPPORTED);
    assert_non_null(strstr(hr_last_error(), "tokenizer.ggml.model 'llama' is not supported"));
    unlink(path);
}

static void kv_f32(img *m, const char *key, float v) {
    str(m, key);
    u32(m, GGUF_F32);
    put(m, &v, 4);
}

/* The sizes every Llama-family config needs, under arch's prefix. */
static void arch_sizes(img *m, const char *arch) {
    char key[64];
    static const char *const names[] = {"block_count", "embedding_length", "feed_forward_length",
                                        "attention.head_count", "attention.head_count_kv", "attention.key_length",
                                        "vocab_size"};
    static const uint32_t values[] = {1, 8, 16, 2, 1, 4, 32};
    kv_str(m, "general.architecture", arch);
    for (int i = 0; i < 7; i++) {
        snprintf(key, sizeof key, "%s.%s", arch, names[i]);
        kv_u32(m, key, values[i]);
    }
}

/* A qwen3 image with one 8x8 matrix of `type` (esize bytes an element, zeros). */
static void qwen3_image(img *m, ggml_type type, size_t esize) {
    header(m, 3, 1, 8);
    arch_sizes(m, "qwen3");
    tinfo(m, "blk.0.attn_q.weight", 2, (uint64_t[]){8, 8}, type, 0);
    pad(m, 32);
    memset(m->b + m->n, 0, 64 * esize);
    m->n += 64 * esize;
}

static char *config_of(const img *m, hr_status want) {
    hr_gguf *g = parse_ok(m);
    char *json = NULL;
    size_t len = 0;
    hr_status s = hr_gguf_config_json_of(g, &json, &len);
    hr_gguf_close(g);
    if (s != want) fail_msg("status %d: %s", s, hr_last_error());
    return json;
}

/* config.json from the metadata of each architecture: Qwen3's class, its
 * q/k rows left as they are (llama's put back); llama.cpp's rope_freqs as
 * longrope factors, and bad ones refused naming the tensor. */
static void test_config_json(void **state) {
    (void)state;
    img m;
    qwen3_image(&m, GGML_F32, 4);
    char *json = config_of(&m, HR_OK);
    assert_non_null(strstr(json, "\"Qwen3ForCausalLM\""));
    assert_non_null(strstr(json, "\"head_dim\":4"));
    assert_null(strstr(json, "rope_parameters"));
    assert_non_null(strstr(json, "\"torch_dtype\":\"float32\""));
    free(json);
    /* matrices all in BF16: the model loads in bfloat16, as its safetensors twin would */
    qwen3_image(&m, GGML_BF16, 2);
    json = config_of(&m, HR_OK);
    assert_non_null(strstr(json, "\"torch_dtype\":\"bfloat16\""));
    free(json);
    hr_gguf *g = parse_ok(&m);
    char name[128];
    int64_t perm = -1;
    assert_true(hr_gguf_hf_name(g, "blk.0.attn_q.weight", name, sizeof name, &perm));
    assert_string_equal(name, "model.layers.0.self_attn.q_proj.weight");
    assert_int_equal(perm, 0);
    assert_true(hr_gguf_hf_name(g, "blk.0.attn_k_norm.weight", name, sizeof name, &perm));
    assert_string_equal(name, "model.layers.0.self_attn.k_norm.weight");
    hr_gguf_close(g);

    for (int bad = 0; bad < 3; bad++) {
        /* rope dim 4: two factors; bad 1: a zero factor, bad 2: three of them */
        header(&m, 3, 1, 9);
        arch_sizes(&m, "llama");
        kv_f32(&m, "llama.rope.freq_base", 500000.0f);
        tinfo(&m, "rope_freqs.weight", 1, (uint64_t[]){bad == 2 ? 3 : 2}, GGML_F32, 0);
        pad(&m, 32);
        float f[3] = {1.5f, bad == 1 ? 0.0f : 8.0f, 8.0f};
        put(&m, f, sizeof f);
        json = config_of(&m, bad ? HR_ERR_FORMAT : HR_OK);
        if (bad) {
            assert_non_null(strstr(hr_last_error(), "t.gguf: "));
            assert_non_null(strstr(hr_last_error(), "rope_freqs.weight"));
            continue;
        }
        assert_non_null(strstr(json, "\"LlamaForCausalLM\""));
        assert_non_null(strstr(json, "\"rope_type\":\"longrope\""));
        assert_non_null(strstr(json, "\"short_factor\":[1.5,8]"));
        assert_non_null(strstr(json, "\"long_factor\":[1.5,8]"));
        assert_non_null(strstr(json, "\"attention_factor\":1"));
        assert_non_null(strstr(json, "\"rope_theta\":500000"));
        free(json);
    }

    header(&m, 3, 0, 1);
    kv_str(&m, "general.architecture", "falcon");
    assert_null(config_of(&m, HR_ERR_UNSUPPORTED));
    assert_non_null(strstr(hr_last_error(), "architecture 'falcon' is not supported (llama, qwen2, qwen3, qwen3moe, gemma3)"));
}

/* A qwen3 image (no tensors) with rope.scaling keys: type, factor, the
 * original context length and the yarn extras (NaN: not written), and
 * with `freqs` a llama.cpp rope_freqs tensor of rope dim 4 as well. */
static void scaled_image(img *m, const char *type, float factor, uint32_t orig, float attn, float ext, bool freqs) {
    int n_kv = 8 + (type != NULL) + (factor == factor) + (orig > 0) + (attn == attn) + (ext == ext);
    header(m, 3, freqs, (uint64_t)n_kv);
    arch_sizes(m, "qwen3");
    if (type) kv_str(m, "qwen3.rope.scaling.type", type);
    if (factor == factor) kv_f32(m, "qwen3.rope.scaling.factor", factor);
    if (orig) kv_u32(m, "qwen3.rope.scaling.original_context_length", orig);
    if (attn == attn) kv_f32(m, "qwen3.rope.scaling.yarn_attn_factor", attn);
    if (ext == ext) kv_f32(m, "qwen3.rope.scaling.yarn_ext_factor", ext);
    if (!freqs) return;
    tinfo(m, "rope_freqs.weight", 1, (uint64_t[]){2}, GGML_F32, 0);
    pad(m, 32);
    put(m, (float[]){1.0f, 2.0f}, 8);
}

/* llama.cpp's rope.scaling keys (linear, yarn) back into the config's
 * rope_parameters; "none" is plain rope; other types, bad factors, an
 * extrapolation mix and a rope_freqs tensor beside them are refused,
 * naming the key. */
static void test_rope_scaling_keys(void **state) {
    (void)state;
    img m;
    const float no = NAN;
    scaled_image(&m, "none", no, 0, no, no, false);
    char *json = config_of(&m, HR_OK);
    assert_null(strstr(json, "rope_parameters"));
    free(json);
    scaled_image(&m, "linear", 4.0f, 0, no, no, false);
    json = config_of(&m, HR_OK);
    assert_non_null(strstr(json, "\"rope_parameters\":{\"rope_type\":\"linear\",\"factor\":4}"));
    free(json);
    scaled_image(&m, "yarn", 8.0f, 4096, 1.5f, 1.0f, false);
    json = config_of(&m, HR_OK);
    assert_non_null(strstr(json, "\"rope_type\":\"yarn\",\"factor\":8,\"original_max_position_embeddings\":4096,"
                                 "\"attention_factor\":1.5}"));
    free(json);

    scaled_image(&m, "longrope", no, 0, no, no, false);
    assert_null(config_of(&m, HR_ERR_UNSUPPORTED));
    assert_non_null(strstr(hr_last_error(), "t.gguf: 'qwen3.rope.scaling.type' is 'longrope'"));
    scaled_image(&m, "linear", 0.5f, 0, no, no, false);
    assert_null(config_of(&m, HR_ERR_FORMAT));
    assert_non_null(strstr(hr_last_error(), "'qwen3.rope.scaling.factor' is 0.5"));
    scaled_image(&m, "linear", no, 0, no, no, false);
    assert_null(config_of(&m, HR_ERR_NOT_FOUND));
    assert_non_null(strstr(hr_last_error(), "qwen3.rope.scaling.factor"));
    scaled_image(&m, "yarn", 8.0f, 0, no, no, false);
    assert_null(config_of(&m, HR_ERR_NOT_FOUND));
    assert_non_null(strstr(hr_last_error(), "qwen3.rope.scaling.original_context_length"));
    scaled_image(&m, "yarn", 8.0f, 4096, no, 0.5f, false);
    assert_null(config_of(&m, HR_ERR_UNSUPPORTED));
    assert_non_null(strstr(hr_last_error(), "'qwen3.rope.scaling.yarn_ext_factor' is 0.5"));
    scaled_image(&m, "linear", 2.0f, 0, no, no, true);
    assert_null(config_of(&m, HR_ERR_FORMAT));
    assert_non_null(strstr(hr_last_error(), "a rope_freqs tensor and a rope.scaling.type"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_and_dequant),
        cmocka_unit_test(test_qk_permutation),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_checkpoint),
        cmocka_unit_test(test_tokenizer_json),
        cmocka_unit_test(test_config_json),
        cmocka_unit_test(test_rope_scaling_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
