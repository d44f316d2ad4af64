/* Python's str methods that chat templates call (strip, split, replace,
 * startswith, upper, ...), on UTF-8 strings, with Python's notion of
 * whitespace and case. */
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "tokenizer/jinja.h"

/* Python's str.isspace. */
bool jj_py_space(uint32_t c) {
    return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

static uint32_t next_cp(const char *s, size_t n, size_t i, size_t *len) {
    return jj_utf8_next((const unsigned char *)s + i, n - i, len);
}

/* Start of the code point that ends at `end`. */
static size_t prev_start(const char *s, size_t end) {
    size_t i = end - 1;
    size_t lim = end >= 4 ? end - 4 : 0;
    while (i > lim && ((unsigned char)s[i] & 0xc0) == 0x80) i--;
    size_t len;
    jj_utf8_next((const unsigned char *)s + i, end - i, &len);
    return i + len == end ? i : end - 1;
}

static bool in_set(uint32_t c, const jv *chars) {
    if (!chars) return jj_py_space(c);
    for (size_t i = 0; i < chars->u.s.n;) {
        size_t len;
        if (next_cp(chars->u.s.p, chars->u.s.n, i, &len) == c) return true;
        i += len;
    }
    return false;
}

jv jj_str_strip(jv s, const jv *chars, bool left, bool right) {
    size_t a = 0, b = s.u.s.n;
    while (left && a < b) {
        size_t len;
        if (!in_set(next_cp(s.u.s.p, b, a, &len), chars)) break;
        a += len;
    }
    while (right && b > a) {
        size_t st = prev_start(s.u.s.p, b), len;
        if (st < a || !in_set(next_cp(s.u.s.p, b, st, &len), chars)) break;
        b = st;
    }
    return jv_strn(s.u.s.p + a, b - a);
}

static bool list_push(jj_arena *a, jj_buf *items, jv v) {
    (void)a;
    jj_buf_put(items, (const char *)&v, sizeof v);
    return !items->oom;
}

static jj_list *list_take(jj_arena *a, jj_buf *items) {
    size_t n = items->n / sizeof(jv);
    jj_list *l = items->oom ? NULL : jj_list_new(a, n);
    if (l && n) memcpy(l->v, items->p, n * sizeof(jv));
    jj_buf_free(items);
    return l;
}

/* Python's str.split / str.rsplit (sep NULL: runs of whitespace). */
jj_list *jj_str_split(jj_arena *a, jv s, const jv *sep, int64_t maxsplit, bool from_right) {
    jj_buf items = {0};
    const char *p = s.u.s.p;
    size_t n = s.u.s.n;
    if (from_right && maxsplit >= 0) {
        /* Split from the right, then put the pieces back in order. */
        jj_buf rev = {0};
        size_t end = n;
        int64_t done = 0;
        if (!sep) {
            while (end > 0) {
                size_t st = prev_start(p, end), len;
                if (!jj_py_space(next_cp(p, end, st, &len))) break;
                end = st;
            }
            while (end > 0) {
                size_t b = end;
                while (b > 0) {
                    size_t st = prev_start(p, b), len;
                    if (jj_py_space(next_cp(p, b, st, &len))) break;
                    b = st;
                }
                size_t e2 = b;
                while (e2 > 0) {
                    size_t st = prev_start(p, e2), len;
                    if (!jj_py_space(next_cp(p, e2, st, &len))) break;
                    e2 = st;
                }
                if (done == maxsplit || e2 == 0) {
                    list_push(a, &rev, jv_strn(p, end));
                    end = 0;
                    break;
                }
                list_push(a, &rev, jv_strn(p + b, end - b));
                done++;
                end = e2;
            }
        } else {
            size_t m = sep->u.s.n;
            for (;;) {
                size_t found = (size_t)-1;
                if (done < maxsplit && end >= m)
                    for (size_t i = end - m + 1; i-- > 0;)
                        if (!memcmp(p + i, sep->u.s.p, m)) { found = i; break; }
                if (found == (size_t)-1) {
                    list_push(a, &rev, jv_strn(p, end));
                    break;
                }
                list_push(a, &rev, jv_strn(p + found + m, end - found - m));
                end = found;
                done++;
            }
        }
        size_t k = rev.n / sizeof(jv);
        for (size_t i = k; i-- > 0;) list_push(a, &items, ((jv *)rev.p)[i]);
        if (rev.oom) items.oom = true;
        jj_buf_free(&rev);
        return list_take(a, &items);
    }
    int64_t done = 0;
    if (!sep) {
        size_t i = 0;
        for (;;) {
            size_t len;
            while (i < n && jj_py_space(next_cp(p, n, i, &len))) i += len;
            if (i >= n) break;
            if (maxsplit >= 0 && done == maxsplit) {
                size_t e = n;
                while (e > i) {
                    size_t st = prev_start(p, e);
                    if (!jj_py_space(next_cp(p, e, st, &len))) break;
                    e = st;
                }
                list_push(a, &items, jv_strn(p + i, e - i));
                break;
            }
            size_t j = i;
            while (j < n && !jj_py_space(next_cp(p, n, j, &len))) j += len;
            list_push(a, &items, jv_strn(p + i, j - i));
            done++;
            i = j;
        }
        return list_take(a, &items);
    }
    size_t m = sep->u.s.n, start = 0;
    for (size_t i = 0; i + m <= n;) {
        if ((maxsplit < 0 || done < maxsplit) && !memcmp(p + i, sep->u.s.p, m)) {
            list_push(a, &items, jv_strn(p + start, i - start));
            done++;
            i += m;
            start = i;
        } else {
            i++;
        }
    }
    list_push(a, &items, jv_strn(p + start, n - start));
    return list_take(a, &items);
}

bool jj_str_replace(jj_buf *b, jv s, jv old, jv new_, int64_t count) {
    const char *p = s.u.s.p;
    size_t n = s.u.s.n, m = old.u.s.n;
    int64_t done = 0;
    if (m == 0) {
        /* Python puts `new` before every character and at the end. */
        for (size_t i = 0; i <= n;) {
            if (count < 0 || done < count) {
                jj_buf_put(b, new_.u.s.p, new_.u.s.n);
                done++;
            }
            if (i == n) break;
            size_t len;
            next_cp(p, n, i, &len);
            jj_buf_put(b, p + i, len);
            i += len;
        }
        return !b->oom;
    }
    size_t i = 0, start = 0;
    while (i + m <= n) {
        if ((count < 0 || done < count) && !memcmp(p + i, old.u.s.p, m)) {
            jj_buf_put(b, p + start, i - start);
            jj_buf_put(b, new_.u.s.p, new_.u.s.n);
            done++;
            i += m;
            start = i;
        } else {
            i++;
        }
    }
    jj_buf_put(b, p + start, n - start);
    return !b->oom;
}

static bool is_cased_letter(uint32_t c) {
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}

/* mode: 'u' upper, 'l' lower, 't' Python's title, 'c' capitalize. */
bool jj_str_case(jj_buf *b, jv s, char mode) {
    bool prev_cased = false, first = true;
    for (size_t i = 0; i < s.u.s.n;) {
        size_t len;
        uint32_t c = next_cp(s.u.s.p, s.u.s.n, i, &len);
        uint32_t r = c;
        bool upper = mode == 'u' || (mode == 't' && !prev_cased) || (mode == 'c' && first);
        if (c <= 0x10ffff && len > 0 && !(len == 1 && c >= 0x80))
            r = (uint32_t)(upper ? utf8proc_toupper((utf8proc_int32_t)c) : utf8proc_tolower((utf8proc_int32_t)c));
        if (r == c) {
            jj_buf_put(b, s.u.s.p + i, len);
        } else {
            utf8proc_uint8_t tmp[4];
            utf8proc_ssize_t k = utf8proc_encode_char((utf8proc_int32_t)r, tmp);
            jj_buf_put(b, (const char *)tmp, (size_t)k);
        }
        prev_cased = is_cased_letter(c);
        first = false;
        i += len;
    }
    return !b->oom;
}

/* str.isdigit, isalpha, isalnum, isspace, isupper, islower. */
bool jj_str_is(jv s, const char *what) {
    if (!strcmp(what, "isupper") || !strcmp(what, "islower")) {
        bool want_upper = what[2] == 'u', any = false;
        for (size_t i = 0; i < s.u.s.n;) {
            size_t len;
            uint32_t c = next_cp(s.u.s.p, s.u.s.n, i, &len);
            utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
            if (k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LT) {
                if (!want_upper) return false;
                any = true;
            } else if (k == UTF8PROC_CATEGORY_LL) {
                if (want_upper) return false;
                any = true;
            }
            i += len;
        }
        return any;
    }
    if (s.u.s.n == 0) return false;
    for (size_t i = 0; i < s.u.s.n;) {
        size_t len;
        uint32_t c = next_cp(s.u.s.p, s.u.s.n, i, &len);
        utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
        bool alpha = k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
        bool digit = k == UTF8PROC_CATEGORY_ND;
        bool ok = !strcmp(what, "isdigit") ? digit : !strcmp(what, "isalpha") ? alpha
                : !strcmp(what, "isalnum") ? alpha || digit || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO
                : jj_py_space(c);
        if (!ok) return false;
        i += len;
    }
    return true;
}

size_t jj_str_len(jv s) {
    size_t count = 0;
    for (size_t i = 0; i < s.u.s.n; count++) {
        size_t len;
        next_cp(s.u.s.p, s.u.s.n, i, &len);
        i += len;
    }
    return count;
}

/* Byte offset of a substring, or -1; the result counts code points. */
int64_t jj_str_find(jv s, jv sub, bool last) {
    int64_t found = -1;
    for (size_t i = 0; i + sub.u.s.n <= s.u.s.n; i++)
        if (!memcmp(s.u.s.p + i, sub.u.s.p, sub.u.s.n)) {
            found = (int64_t)i;
            if (!last) break;
        }
    if (found < 0) return -1;
    return (int64_t)jj_str_len(jv_strn(s.u.s.p, (size_t)found));
}
