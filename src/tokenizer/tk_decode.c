/* Decoding ids to text, and the vocabulary and config accessors. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tk_internal.h"

size_t hr_tokenizer_vocab_size(const hr_tokenizer *tok) {
    size_t n = tk_model_vocab_size(tok->model);
    size_t a = (size_t)(tk_added_max_id(tok->added) + 1);
    return a > n ? a : n;
}

hr_status hr_tokenizer_token_to_id(const hr_tokenizer *tok, const char *s, size_t len, int32_t *id) {
    if (!tok || (!s && len) || !id) return hr_error(HR_ERR_INVALID_ARG, "hr_tokenizer_token_to_id: NULL argument");
    if (!s) s = "";
    int32_t v = tk_added_token_to_id(tok->added, s, len);
    if (v < 0) v = tk_model_token_to_id(tok->model, s, len);
    if (v < 0) return hr_error(HR_ERR_NOT_FOUND, "token '%.*s' is not in the vocabulary", (int)(len > 200 ? 200 : len), s);
    *id = v;
    return HR_OK;
}

/* The token string of an id: added tokens first, then the model. */
const char *tk_token_str(const hr_tokenizer *tok, int32_t id, size_t *len) {
    const char *s = tk_added_id_to_token(tok->added, id, len, NULL);
    return s ? s : tk_model_id_to_token(tok->model, id, len);
}

hr_status hr_tokenizer_id_to_token(const hr_tokenizer *tok, int32_t id, const char **token, size_t *len) {
    if (!tok || !token || !len) return hr_error(HR_ERR_INVALID_ARG, "hr_tokenizer_id_to_token: NULL argument");
    *token = tk_token_str(tok, id, len);
    if (!*token)
        return hr_error(HR_ERR_NOT_FOUND, "id %d is outside the vocabulary (size %zu)", id, hr_tokenizer_vocab_size(tok));
    return HR_OK;
}

/* tokenizers decides by content: any token whose string is a special added
 * token's is special. */
static bool content_is_special(const hr_tokenizer *tok, const char *s, size_t n) {
    int32_t aid = tk_added_token_to_id(tok->added, s, n);
    bool special = false;
    size_t l;
    return aid >= 0 && tk_added_id_to_token(tok->added, aid, &l, &special) && special;
}

bool hr_tokenizer_is_special(const hr_tokenizer *tok, int32_t id) {
    size_t n;
    const char *s = tok ? tk_token_str(tok, id, &n) : NULL;
    return s && content_is_special(tok, s, n);
}

hr_status hr_tokenizer_decode(const hr_tokenizer *tok, const int32_t *ids, size_t n, bool skip_special, char **text,
                              size_t *len) {
    if (!tok || (!ids && n) || !text) return hr_error(HR_ERR_INVALID_ARG, "hr_tokenizer_decode: NULL argument");
    *text = NULL;
    tk_strs toks = {0};
    tk_buf out = {0};
    hr_status st = HR_OK;
    for (size_t i = 0; st == HR_OK && i < n; i++) {
        size_t l;
        const char *s = tk_token_str(tok, ids[i], &l);
        if (!s)
            st = hr_error(HR_ERR_INVALID_ARG, "decode: id %d at position %zu is outside the vocabulary (size %zu)", ids[i], i,
                          hr_tokenizer_vocab_size(tok));
        else if (!(skip_special && content_is_special(tok, s, l)))
            st = tk_strs_push(&toks, s, l);
    }
    if (st == HR_OK) st = tk_decode_tokens(tok->decoder, &toks, &out);
    if (st == HR_OK && !out.p) st = tk_buf_append(&out, "", 0);
    tk_strs_free(&toks);
    if (st != HR_OK) {
        tk_buf_free(&out);
        return st;
    }
    *text = out.p;
    if (len) *len = out.n;
    return HR_OK;
}

int32_t hr_tokenizer_bos_id(const hr_tokenizer *tok) { return tok ? tok->bos_id : -1; }
int32_t hr_tokenizer_eos_id(const hr_tokenizer *tok) { return tok ? tok->eos_id : -1; }
int32_t hr_tokenizer_pad_id(const hr_tokenizer *tok) { return tok ? tok->pad_id : -1; }
int32_t hr_tokenizer_unk_id(const hr_tokenizer *tok) { return tok ? tok->unk_id : -1; }
int hr_tokenizer_add_bos(const hr_tokenizer *tok) { return tok && tok->has_add_bos ? tok->add_bos : -1; }
int hr_tokenizer_add_eos(const hr_tokenizer *tok) { return tok && tok->has_add_eos ? tok->add_eos : -1; }
const char *hr_tokenizer_chat_template(const hr_tokenizer *tok) { return tok ? tok->chat_template : NULL; }
