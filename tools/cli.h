/* The `hubrt` command: one file per subcommand, dispatched from main.c.
 * Exit codes: 0 success, 1 runtime failure, 2 bad input or usage. */
#ifndef HUBRT_TOOLS_CLI_H
#define HUBRT_TOOLS_CLI_H

#include "hubrt.h"

#define HR_EXIT_OK 0
#define HR_EXIT_FAIL 1
#define HR_EXIT_USAGE 2

/* Prints "hubrt <cmd>: <hr_last_error()>" to stderr and returns the exit
 * code for `s` (2 for bad input, 1 otherwise); in a group of ranks, ends
 * every rank with that code instead (hr_dist_abort). */
int hr_cli_fail(const char *cmd, hr_status s);
/* --tp N (ranks), --tp-plan JSON (transformers' tp_plan laid over the
 * architecture's) and --ep N (experts split over the group) into o: 1 when `flag` was one of them (its value
 * used), 0 when not, -1 on a bad value (printed). */
int hr_cli_tp_flag(const char *cmd, const char *flag, const char *value, hr_model_options *o);
/* Ranks other than 0 of a tensor-parallel run print nothing on stdout
 * (call after the model loaded: the group is joined then). */
void hr_cli_tp_quiet(void);
/* A model named by a path or a Hub repository id (org/name, at
 * `revision` or main): its local folder, fetched into the Hugging Face
 * cache when missing (a progress line on a terminal). *dir is malloc'd. */
hr_status hr_cli_model_dir(const char *ref, const char *revision, char **dir);
/* One stderr line with the compile-cache statistics (--stats). */
void hr_cli_print_compile_stats(void);

int hr_cmd_info(int argc, char **argv);
int hr_cmd_inspect(int argc, char **argv);
int hr_cmd_run(int argc, char **argv);
int hr_cmd_chat(int argc, char **argv);
int hr_cmd_serve(int argc, char **argv);
int hr_cmd_bench(int argc, char **argv);
int hr_cmd_launch(int argc, char **argv);
int hr_cmd_launch_mpi(int argc, char **argv);
/* A TPU host's process grid X,Y,Z for n processes of one chip each (1, 2,
 * 4, 8), or NULL; and whether b is a grid of n processes. */
const char *hr_cli_tpu_default_bounds(int n);
bool hr_cli_tpu_bounds_valid(const char *b, int n);
int hr_cmd_tokenize(int argc, char **argv);
int hr_cmd_detokenize(int argc, char **argv);
int hr_cmd_kernels(int argc, char **argv);
int hr_cmd_text_to_image(int argc, char **argv);
int hr_cmd_quantize(int argc, char **argv);

/* The text `token` adds to a generation's output through detokenizer d
 * (NULL with *err set when it fails): the token_text of run and chat. */
const char *hr_cli_token_text(hr_detokenizer *d, hr_status *err, int64_t token, size_t *len);

/* Parses `text` as a number for option `flag`; prints the error and returns
 * false on junk. */
bool hr_cli_number(const char *cmd, const char *flag, const char *text, double *out);

#endif
