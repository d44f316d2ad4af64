/* hubrt chat templates: Hugging Face chat templates rendered in C (public API).
 *
 * A chat template is the Jinja2 text in tokenizer_config.json's
 * "chat_template" (hr_tokenizer_chat_template). hubrt renders it the way
 * transformers' apply_chat_template does (Jinja2 in a sandbox with
 * trim_blocks and lstrip_blocks, break/continue, raise_exception,
 * strftime_now, and tojson as Python's json.dumps), byte for byte.
 *
 * Rendering is bounded: at most 1,000,000 loop iterations, 64 nested macro
 * calls, 16 MiB of output and 192 MiB of working memory; past any of them
 * the call fails with a message. strftime_now reads the clock, unless
 * HUBRT_CHAT_DATE (YYYY-MM-DD or YYYY-MM-DDTHH:MM:SS) fixes the date. */
#ifndef HUBRT_CHAT_H
#define HUBRT_CHAT_H

#include "base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Renders template_text[0..len) with the variables of context_json[0..ctx_len),
 * a JSON object such as {"messages": [...], "tools": null,
 * "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"}
 * (transformers passes messages, tools, documents, add_generation_prompt,
 * the special tokens and any extra keyword arguments).
 * *out (NUL-terminated, *out_len bytes without the NUL) is malloc'ed: free
 * it with free(). Errors name the template's line and column:
 * HR_ERR_FORMAT for a syntax error or a failed operation, HR_ERR_INVALID_ARG
 * for the template's own raise_exception (its message is kept), HR_ERR_OOM
 * past a bound. */
HR_API hr_status hr_chat_template_render(const char *template_text, size_t len, const char *context_json,
                                         size_t ctx_len, char **out, size_t *out_len);

#ifdef __cplusplus
}
#endif

#endif
