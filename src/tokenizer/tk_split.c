/* Split behaviors (Removed, Isolated, MergedWithPrevious, MergedWithNext,
 * Contiguous) applied to the matches of a pattern, as NormalizedString::split
 * does; empty results are dropped like PreTokenizedString::split does. */
#include <string.h>

#include "tokenizer/tk_internal.h"

hr_status tk_split_behavior_parse(const cJSON *j, const char *field, tk_split_behavior *out) {
    static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    const cJSON *v = tk_json_get(j, field);
    if (!v) return HR_OK; /* keep the caller's default */
    for (int i = 0; i < 5; i++)
        if (cJSON_IsString(v) && !strcmp(v->valuestring, names[i])) {
            *out = (tk_split_behavior)i;
            return HR_OK;
        }
    return hr_error(HR_ERR_FORMAT, "field '%s': unknown split behavior '%s'", field,
                    cJSON_IsString(v) ? v->valuestring : "(not a string)");
}

static hr_status emit(const char *s, const tk_align *al, const tk_span *sp, bool first, tk_pieces *out) {
    if (sp->end <= sp->start) return HR_OK;
    return tk_pieces_add(out, s + sp->start, tk_al_at(al, sp->start), sp->end - sp->start, -1, first && sp->start == 0);
}

hr_status tk_split_apply(tk_spans *spans, tk_split_behavior b, const char *s, const tk_align *al, bool first,
                         tk_pieces *out) {
    tk_span *v = spans->v;
    size_t n = spans->n, m = 0;
    /* Each behavior folds the spans in place into kept spans (match = removed). */
    switch (b) {
    case TK_SPLIT_ISOLATED:
        for (size_t i = 0; i < n; i++) v[i].match = false;
        m = n;
        break;
    case TK_SPLIT_REMOVED:
        m = n;
        break;
    case TK_SPLIT_CONTIGUOUS: {
        bool prev = false;
        for (size_t i = 0; i < n; i++) {
            bool is = v[i].match;
            if (is == prev && m) v[m - 1].end = v[i].end;
            else v[m++] = (tk_span){v[i].start, v[i].end, false};
            prev = is;
        }
        break;
    }
    case TK_SPLIT_MERGED_WITH_PREVIOUS: {
        bool prev = false;
        for (size_t i = 0; i < n; i++) {
            bool is = v[i].match;
            if (is && !prev && m) v[m - 1].end = v[i].end;
            else v[m++] = (tk_span){v[i].start, v[i].end, false};
            prev = is;
        }
        break;
    }
    case TK_SPLIT_MERGED_WITH_NEXT: {
        /* Folded right to left; kept spans fill the array from the end. */
        bool prev = false;
        size_t top = n; /* kept spans are v[top..n) */
        for (size_t i = n; i-- > 0;) {
            tk_span cur = v[i];
            if (cur.match && !prev && top < n) v[top].start = cur.start;
            else v[--top] = (tk_span){cur.start, cur.end, false};
            prev = cur.match;
        }
        memmove(v, v + top, (n - top) * sizeof *v);
        m = n - top;
        break;
    }
    }
    for (size_t i = 0; i < m; i++)
        if (!v[i].match) HR_TRY(emit(s, al, &v[i], first, out));
    return HR_OK;
}
