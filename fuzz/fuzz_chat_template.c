/* libFuzzer target: the chat-template engine (lexer, parser, evaluator)
 * on arbitrary template text, rendered over a small fixed chat. A render
 * must never crash, and every failure must carry a message. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hubrt/chat.h"
#include "fuzz_limits.h"

static const char CONTEXT[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
    " {\"role\": \"user\", \"content\": \"Hi {{ there }} \\u00e9\"},"
    " {\"role\": \"assistant\", \"content\": \"\", \"reasoning_content\": \"hm\", \"tool_calls\": [{\"id\": \"c1\","
    " \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"x\": 1, \"y\": [1.5, null]}}}]},"
    " {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"42\"},"
    " {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"more\"}]}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"d\","
    " \"parameters\": {\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"integer\"}}, \"required\": [\"x\"]}}}],"
    " \"documents\": null, \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *out = NULL;
    size_t n = 0;
    hr_status st = hr_chat_template_render((const char *)data, size, CONTEXT, sizeof CONTEXT - 1, &out, &n);
    if (st == HR_OK) {
        if (!out || out[n] != 0) abort();
        free(out);
    } else if (out || !hr_last_error()[0]) {
        fprintf(stderr, "failure without a message (status %d)\n", (int)st);
        abort();
    }
    return 0;
}
