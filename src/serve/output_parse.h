/* Model output into OpenAI's message parts: reasoning_content, content and
 * tool_calls, for the formats the Hub's chat templates teach their models:
 *
 *   think tags   <think> ... </think> then the answer (Qwen3, DeepSeek R1
 *                and V3.1; R1's template opens the tag in the prompt)
 *   Hermes       <tool_call>{"name": ..., "arguments": {...}}</tool_call>
 *                (Qwen2.5, Qwen3, Hermes 3)
 *   DeepSeek     <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
 *                ```json ARGS ```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜> (R1; V3.1
 *                writes NAME<｜tool▁sep｜>ARGS)
 *   Llama 3.1    the whole answer one JSON object {"name", "parameters"}
 *                (after an optional <|python_tag|>), when tools were given
 *   harmony      gpt-oss's messages: <|channel|>analysis<|message|>... is
 *                reasoning, final is content, commentary to=functions.NAME
 *                a tool call
 *
 * The parser is incremental: text goes in as it is decoded, and each feed
 * returns what is certain so far (text that may still begin a marker is
 * held back), so streams carry reasoning_content and content deltas; a
 * tool call comes out whole once it has ended. */
#ifndef HR_SERVE_OUTPUT_PARSE_H
#define HR_SERVE_OUTPUT_PARSE_H

#include <stdbool.h>
#include <stddef.h>

#include "hubrt/base.h"

typedef enum hr_tool_style {
    HR_TOOLS_NONE,
    HR_TOOLS_HERMES,
    HR_TOOLS_DEEPSEEK,
    HR_TOOLS_LLAMA3_JSON,
} hr_tool_style;

typedef struct hr_output_style {
    bool think;          /* <think> ... </think> reasoning */
    bool think_open;     /* the prompt opened <think>: output starts in reasoning */
    bool harmony;        /* gpt-oss channels */
    hr_tool_style tools;
    bool keep_special;   /* the markers are special tokens: detokenize without skipping them */
} hr_output_style;

/* The style for a chat template and the prompt it rendered; tool calls are
 * looked for only when the request gave tools. */
HR_API hr_output_style hr_output_style_detect(const char *tmpl, const char *prompt, size_t prompt_len, bool has_tools);

typedef struct hr_tool_call {
    char *name;
    char *arguments; /* a JSON text, as OpenAI's function.arguments */
} hr_tool_call;

typedef struct hr_output_delta {
    char *reasoning, *content; /* NUL-terminated, malloc'd; NULL when none */
    size_t reasoning_len, content_len;
    hr_tool_call *calls;
    int n_calls;
} hr_output_delta;

typedef struct hr_output_parser hr_output_parser;

HR_API hr_status hr_output_parser_new(const hr_output_style *style, hr_output_parser **out);
HR_API void hr_output_parser_free(hr_output_parser *p);
/* Feeds text; `final` at the end (everything held comes out). *d is
 * filled with this feed's parts (the caller clears it). */
HR_API hr_status hr_output_parser_feed(hr_output_parser *p, const char *text, size_t len, bool final,
                                       hr_output_delta *d);
HR_API void hr_output_delta_clear(hr_output_delta *d);

#endif
