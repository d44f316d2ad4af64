/* Incremental detokenizer: decodes a sliding window of ids and emits the
 * text past what the window's older part already gave, holding back while
 * the tail ends in U+FFFD (an unfinished UTF-8 sequence split across
 * tokens). Decoding a window rather than single tokens keeps decoders that
 * look at neighbours (Metaspace, WordPiece) right. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tk_internal.h"

struct hr_detokenizer {
    const hr_tokenizer *tok;
    bool skip_special;
    tk_ids ids;
    size_t prefix, read; /* window start, and end of the part already emitted */
    tk_buf out;
};

hr_status hr_detokenizer_init(const hr_tokenizer *tok, bool skip_special, hr_detokenizer **out) {
    if (!tok || !out) return hr_error(HR_ERR_INVALID_ARG, "hr_detokenizer_init: NULL argument");
    hr_detokenizer *d = calloc(1, sizeof *d);
    if (!d) return hr_error(HR_ERR_OOM, "tokenizer: out of memory");
    d->tok = tok;
    d->skip_special = skip_special;
    *out = d;
    return HR_OK;
}

void hr_detokenizer_free(hr_detokenizer *d) {
    if (!d) return;
    tk_ids_free(&d->ids);
    tk_buf_free(&d->out);
    free(d);
}

static bool ends_with_replacement(const char *s, size_t n) { return n >= 3 && !memcmp(s + n - 3, "\xEF\xBF\xBD", 3); }

/* Sets d->out to the new text; with `force`, emits even an unfinished tail. */
static hr_status step(hr_detokenizer *d, bool force, const char **text, size_t *len) {
    char *before = NULL, *after = NULL;
    size_t nb = 0, na = 0;
    hr_status st = hr_tokenizer_decode(d->tok, d->ids.p + d->prefix, d->read - d->prefix, d->skip_special, &before, &nb);
    if (st == HR_OK)
        st = hr_tokenizer_decode(d->tok, d->ids.p + d->prefix, d->ids.n - d->prefix, d->skip_special, &after, &na);
    d->out.n = 0;
    if (st == HR_OK) st = tk_buf_append(&d->out, "", 0);
    if (st == HR_OK && na > nb && (force || !ends_with_replacement(after, na))) {
        /* Emit from the first byte where the windows differ, on a character boundary. */
        size_t common = nb;
        if (memcmp(before, after, nb) != 0) {
            common = 0;
            while (common < nb && before[common] == after[common]) common++;
            while (common > 0 && ((unsigned char)after[common] & 0xC0) == 0x80) common--;
        }
        st = tk_buf_append(&d->out, after + common, na - common);
        d->prefix = d->read;
        d->read = d->ids.n;
    } else if (st == HR_OK && force) {
        d->prefix = d->read = d->ids.n;
    }
    free(before);
    free(after);
    HR_TRY(st);
    *text = d->out.p;
    *len = d->out.n;
    return HR_OK;
}

hr_status hr_detokenizer_push(hr_detokenizer *d, int32_t id, const char **text, size_t *len) {
    if (!d || !text || !len) return hr_error(HR_ERR_INVALID_ARG, "hr_detokenizer_push: NULL argument");
    const char *tokstr;
    size_t tl;
    HR_TRY(hr_tokenizer_id_to_token(d->tok, id, &tokstr, &tl));
    HR_TRY(tk_ids_push(&d->ids, id));
    return step(d, false, text, len);
}

hr_status hr_detokenizer_flush(hr_detokenizer *d, const char **text, size_t *len) {
    if (!d || !text || !len) return hr_error(HR_ERR_INVALID_ARG, "hr_detokenizer_flush: NULL argument");
    return step(d, true, text, len);
}
