/* `hubrt tokenize PATH [--add-special-tokens]`: JSON strings, one per line on
 * stdin, to JSON arrays of ids on stdout. `hubrt detokenize PATH
 * [--skip-special-tokens]`: the reverse. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "core/error.h"

static int usage(const char *cmd, const char *flag) {
    fprintf(stderr, "usage: hubrt %s PATH [%s] < lines\n", cmd, flag);
    return HR_EXIT_USAGE;
}

/* Parses argv into the tokenizer path and the one optional flag. */
static int parse_args(int argc, char **argv, const char *flag, const char **path, bool *on) {
    *path = NULL;
    *on = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], flag)) *on = true;
        else if (argv[i][0] == '-' || *path) return -1;
        else *path = argv[i];
    }
    return *path ? 0 : -1;
}

static hr_status tokenize_line(const hr_tokenizer *tok, const char *line, size_t lineno, bool special) {
    cJSON *j = cJSON_Parse(line);
    if (!cJSON_IsString(j)) {
        cJSON_Delete(j);
        return hr_error(HR_ERR_INVALID_ARG, "line %zu: expected a JSON string", lineno);
    }
    int32_t *ids;
    size_t n;
    hr_status st = hr_tokenizer_encode(tok, j->valuestring, strlen(j->valuestring), special, &ids, &n);
    cJSON_Delete(j);
    if (st != HR_OK) return hr_error_context(st, "line %zu", lineno);
    putchar('[');
    for (size_t i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
    puts("]");
    hr_tokenizer_free_array(ids);
    return HR_OK;
}

static hr_status detokenize_line(const hr_tokenizer *tok, const char *line, size_t lineno, bool skip) {
    cJSON *j = cJSON_Parse(line);
    hr_status st = HR_OK;
    int n = cJSON_IsArray(j) ? cJSON_GetArraySize(j) : -1;
    int32_t *ids = n >= 0 ? malloc(((size_t)n + 1) * sizeof *ids) : NULL;
    if (n < 0) st = hr_error(HR_ERR_INVALID_ARG, "line %zu: expected a JSON array of ids", lineno);
    else if (!ids) st = hr_error(HR_ERR_OOM, "out of memory");
    const cJSON *it;
    int k = 0;
    if (st == HR_OK) cJSON_ArrayForEach(it, j) {
        if (!cJSON_IsNumber(it) || it->valuedouble != (double)(int32_t)it->valuedouble) {
            st = hr_error(HR_ERR_INVALID_ARG, "line %zu: element %d is not an integer id", lineno, k);
            break;
        }
        ids[k++] = (int32_t)it->valuedouble;
    }
    char *text = NULL;
    size_t len;
    if (st == HR_OK && (st = hr_tokenizer_decode(tok, ids, (size_t)k, skip, &text, &len)) != HR_OK)
        hr_error_context(st, "line %zu", lineno);
    if (st == HR_OK) {
        cJSON *s = cJSON_CreateString(text);
        char *out = s ? cJSON_PrintUnformatted(s) : NULL;
        if (out) puts(out);
        else st = hr_error(HR_ERR_OOM, "out of memory");
        free(out);
        cJSON_Delete(s);
    }
    hr_tokenizer_free_array(text);
    free(ids);
    cJSON_Delete(j);
    return st;
}

static int run(int argc, char **argv, const char *cmd, const char *flag,
               hr_status (*line_fn)(const hr_tokenizer *, const char *, size_t, bool)) {
    const char *path;
    bool on;
    if (parse_args(argc, argv, flag, &path, &on)) return usage(cmd, flag);
    hr_tokenizer *tok = NULL;
    char *dir = NULL;
    hr_status st = hr_cli_model_dir(path, NULL, &dir);
    if (st == HR_OK) st = hr_tokenizer_load(dir, &tok);
    free(dir);
    if (st != HR_OK) return hr_cli_fail(cmd, st);
    char *line = NULL;
    size_t cap = 0, lineno = 0;
    ssize_t got;
    while (st == HR_OK && (got = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = '\0';
        if (got == 0) continue;
        st = line_fn(tok, line, lineno, on);
    }
    free(line);
    hr_tokenizer_free(tok);
    fflush(stdout);
    return st == HR_OK ? HR_EXIT_OK : hr_cli_fail(cmd, st);
}

int hr_cmd_tokenize(int argc, char **argv) {
    return run(argc, argv, "tokenize", "--add-special-tokens", tokenize_line);
}

int hr_cmd_detokenize(int argc, char **argv) {
    return run(argc, argv, "detokenize", "--skip-special-tokens", detokenize_line);
}
