/* WordPiece (greedy longest-match-first with a continuing-subword prefix)
 * and WordLevel (whole pieces looked up as they are). */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tk_model.h"

hr_status tk_wordpiece_parse(const cJSON *j, tk_model *m) {
    HR_TRY(tk_vocab_from_object(tk_json_get(j, "vocab"), "model 'WordPiece'", &m->vocab));
    const char *unk, *prefix;
    HR_TRY(tk_json_opt_string(j, "unk_token", "model 'WordPiece'", &unk));
    HR_TRY(tk_json_opt_string(j, "continuing_subword_prefix", "model 'WordPiece'", &prefix));
    if (!unk) unk = "[UNK]";
    if (!prefix) prefix = "##";
    m->unk_id = tk_vocab_get(&m->vocab, unk, strlen(unk));
    if (m->unk_id < 0) return hr_error(HR_ERR_FORMAT, "model 'WordPiece': unk_token '%.80s' is not in the vocab", unk);
    m->prefix_len = strlen(prefix);
    m->prefix = malloc(m->prefix_len + 1);
    if (!m->prefix) return hr_error(HR_ERR_OOM, "tokenizer: out of memory");
    memcpy(m->prefix, prefix, m->prefix_len + 1);
    const cJSON *mx = tk_json_get(j, "max_input_chars_per_word");
    m->max_input_chars = cJSON_IsNumber(mx) && mx->valuedouble >= 0 ? (size_t)mx->valuedouble : 100;
    return HR_OK;
}

static hr_status push_range(tk_ids *offs, size_t a, size_t b) {
    if (!offs) return HR_OK;
    HR_TRY(tk_ids_push(offs, (int32_t)a));
    return tk_ids_push(offs, (int32_t)b);
}

hr_status tk_wordpiece_tokenize(const tk_model *m, const char *s, size_t n, tk_ids *out, tk_ids *offs) {
    size_t chars = 0;
    for (size_t i = 0; i < n; i++) chars += ((unsigned char)s[i] & 0xC0) != 0x80;
    if (chars > m->max_input_chars) {
        HR_TRY(push_range(offs, 0, n));
        return tk_ids_push(out, m->unk_id);
    }
    size_t first = out->n, first_off = offs ? offs->n : 0;
    tk_buf sub = {0};
    hr_status st = HR_OK;
    for (size_t start = 0; start < n;) {
        size_t end = n;
        int32_t found = -1;
        while (start < end) {
            sub.n = 0;
            if (start > 0 && (st = tk_buf_append(&sub, m->prefix, m->prefix_len)) != HR_OK) break;
            if ((st = tk_buf_append(&sub, s + start, end - start)) != HR_OK) break;
            found = tk_vocab_get(&m->vocab, sub.p, sub.n);
            if (found >= 0) break;
            do end--;
            while (end > start && ((unsigned char)s[end] & 0xC0) == 0x80);
        }
        if (st != HR_OK) break;
        if (found < 0) {
            /* One unknown piece makes the whole word unknown. */
            out->n = first;
            if (offs) offs->n = first_off;
            st = tk_ids_push(out, m->unk_id);
            if (st == HR_OK) st = push_range(offs, 0, n);
            break;
        }
        if ((st = tk_ids_push(out, found)) != HR_OK || (st = push_range(offs, start, end)) != HR_OK) break;
        start = end;
    }
    tk_buf_free(&sub);
    return st;
}

hr_status tk_wordlevel_parse(const cJSON *j, tk_model *m) {
    HR_TRY(tk_vocab_from_object(tk_json_get(j, "vocab"), "model 'WordLevel'", &m->vocab));
    const char *unk;
    HR_TRY(tk_json_opt_string(j, "unk_token", "model 'WordLevel'", &unk));
    m->unk_id = unk ? tk_vocab_get(&m->vocab, unk, strlen(unk)) : -1;
    return HR_OK;
}
