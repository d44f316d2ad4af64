/* hr_chat_template_render: lex, parse, read the context, render; every
 * allocation of one call lives in one arena, freed before returning. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "hubrt/chat.h"
#include "tokenizer/jinja.h"

static hr_status render(jj_arena *a, const char *tmpl, size_t len, const char *ctx, size_t ctx_len, jj_buf *out) {
    jj_source src;
    jj_token *toks;
    size_t n_toks;
    jj_node *root;
    jv vars;
    HR_TRY(jj_lex(a, tmpl, len, &src, &toks, &n_toks));
    HR_TRY(jj_parse(a, &src, toks, n_toks, &root));
    HR_TRY(jj_json_parse(a, ctx, ctx_len, &vars));
    if (vars.kind != JV_DICT) return hr_error(HR_ERR_INVALID_ARG, "chat template context: not a JSON object");
    jj_ctx cx = {.arena = a, .src = &src, .out = out};
    const char *now = getenv("HUBRT_CHAT_DATE");
    cx.now = now && *now ? now : NULL;
    HR_TRY(jj_scope_root(&cx, vars.u.d));
    return jj_render(&cx, root);
}

hr_status hr_chat_template_render(const char *template_text, size_t len, const char *context_json, size_t ctx_len,
                                  char **out, size_t *out_len) {
    if (!out || !out_len) return hr_error(HR_ERR_INVALID_ARG, "hr_chat_template_render: out and out_len are required");
    *out = NULL;
    *out_len = 0;
    if (!template_text && len) return hr_error(HR_ERR_INVALID_ARG, "hr_chat_template_render: template is NULL");
    if (!context_json && ctx_len) return hr_error(HR_ERR_INVALID_ARG, "hr_chat_template_render: context is NULL");
    if (len > ((size_t)16 << 20)) return hr_error(HR_ERR_INVALID_ARG, "chat template: longer than 16 MiB");
    if (!context_json || ctx_len == 0) {
        context_json = "{}";
        ctx_len = 2;
    }
    jj_arena a = {0};
    jj_buf b = {0};
    hr_status st = render(&a, template_text ? template_text : "", len, context_json, ctx_len, &b);
    jj_arena_free(&a);
    if (st == HR_OK && b.oom) st = hr_error(HR_ERR_OOM, "chat template: output over 16 MiB, or out of memory");
    if (st != HR_OK) {
        jj_buf_free(&b);
        return st;
    }
    if (!b.p && !(b.p = calloc(1, 1))) return hr_error(HR_ERR_OOM, "chat template: out of memory");
    *out = b.p;
    *out_len = b.n;
    return HR_OK;
}
