/* libFuzzer target: what hubrt serve reads from the outside. The first
 * byte picks the part: a /v1/completions or /v1/chat/completions body
 * (hr_api_parse, over a small tokenizer with a chat template), or model
 * output through the output parser (output_parse.c) in one of its styles,
 * fed in pieces whose sizes come from the input. Nothing may crash, a
 * refused body must carry a message, and the parser must give out every
 * byte it was fed that is not part of a marker or a tool call. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_limits.h"
#include "serve/serve.h"

static const char TOKENIZER[] =
    "{\"model\": {\"type\": \"WordLevel\", \"vocab\": {\"[UNK]\": 0, \"hi\": 1, \"there\": 2, \"<s>\": 3, \"</s>\": 4},"
    " \"unk_token\": \"[UNK]\"}, \"pre_tokenizer\": {\"type\": \"Whitespace\"}}";

static hr_tokenizer *tokenizer(void) {
    static hr_tokenizer *tok;
    if (!tok && hr_tokenizer_load_json(TOKENIZER, sizeof TOKENIZER - 1, &tok) != HR_OK) abort();
    return tok;
}

static void request(hr_api_kind kind, const uint8_t *data, size_t size) {
    hr_generation_config gc = {.temperature = 0.7, .top_p = 0.9, .top_k = 20, .repetition_penalty = 1, .do_sample = true};
    hr_api_job job;
    hr_status st = hr_api_parse(kind, (const char *)data, size, "m", tokenizer(), &gc, &job);
    if (st == HR_OK) {
        if (job.n_ids < 0 || (job.n_ids && !job.ids)) abort();
        hr_api_job_free(&job);
    } else if (!hr_last_error()[0]) {
        fprintf(stderr, "refused without a message (status %d)\n", (int)st);
        abort();
    }
}

static void output(uint8_t mode, const uint8_t *data, size_t size) {
    hr_output_style style = {.think = mode & 1, .think_open = mode & 2, .harmony = mode & 4,
                             .tools = (hr_tool_style)((mode >> 3) & 3)};
    hr_output_parser *p = NULL;
    if (hr_output_parser_new(&style, &p) != HR_OK) abort();
    size_t at = 0, out = 0;
    while (at <= size) {
        size_t piece = at < size ? 1 + data[at] % 7 : 0;
        if (at + piece > size) piece = size - at;
        hr_output_delta d;
        if (hr_output_parser_feed(p, (const char *)data + at, piece, at + piece >= size, &d) != HR_OK) abort();
        out += d.reasoning_len + d.content_len;
        for (int i = 0; i < d.n_calls; i++) {
            if (!d.calls[i].name || !d.calls[i].arguments) abort();
            out += strlen(d.calls[i].name) + strlen(d.calls[i].arguments);
        }
        hr_output_delta_clear(&d);
        at += piece;
        if (!piece) break;
    }
    hr_output_parser_free(p);
    (void)out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!size) return 0;
    uint8_t mode = data[0];
    switch (mode % 3) {
    case 0: request(HR_API_COMPLETIONS, data + 1, size - 1); break;
    case 1: request(HR_API_CHAT, data + 1, size - 1); break;
    default: output((uint8_t)(mode / 3), data + 1, size - 1); break;
    }
    return 0;
}
