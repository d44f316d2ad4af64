/* hubrt launch: one process per TPU chip on this host (--nproc), or MPI
 * ranks (-n; cmd_launch_mpi.c).
 *
 * libtpu reads its slice of the host from the environment: each child sees
 * one chip (TPU_VISIBLE_CHIPS), the process grid (TPU_PROCESS_BOUNDS), one
 * chip per process (TPU_CHIPS_PER_PROCESS_BOUNDS), every process's address
 * (TPU_PROCESS_ADDRESSES), its own port (TPU_PROCESS_PORT) and its rank
 * (CLOUD_TPU_TASK_ID). The children run the given command; the exit code
 * is the first failing child's. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"

#define MAX_PROCS 64

static void usage(FILE *f) {
    fprintf(f,
            "usage: hubrt launch [--nproc N] [--process-bounds X,Y,Z] [--port P] [--dry-run] -- command [args]\n"
            "  Runs `command` once per TPU chip of this host, each process seeing one chip.\n"
            "  --nproc N            processes (chips), default 4\n"
            "  --process-bounds B   process grid X,Y,Z (default for N = 1, 2, 4, 8: 1,1,1 1,2,1 2,2,1 2,4,1)\n"
            "  --port P             first process port, default 8476 (process i uses P + i)\n"
            "  --dry-run            print each child's environment instead of running it\n"
            "       hubrt launch -n N [--hosts H,...] [--threads T] -- command: N MPI ranks (launch -n 1 --help)\n");
}

/* The host's chip grid when one process drives each chip. */
const char *hr_cli_tpu_default_bounds(int n) {
    switch (n) {
    case 1: return "1,1,1";
    case 2: return "1,2,1";
    case 4: return "2,2,1";
    case 8: return "2,4,1";
    default: return NULL;
    }
}

bool hr_cli_tpu_bounds_valid(const char *b, int n) {
    int x, y, z;
    char end;
    return sscanf(b, "%d,%d,%d%c", &x, &y, &z, &end) == 3 && x > 0 && y > 0 && z > 0 && x * y * z == n;
}

typedef struct {
    char name[32];
    char value[64 * 24];
} env_var;

/* The six variables child `rank` of n receives. */
static void child_env(int rank, int n, const char *bounds, int port, env_var env[6]) {
    snprintf(env[0].name, sizeof env[0].name, "TPU_VISIBLE_CHIPS");
    snprintf(env[0].value, sizeof env[0].value, "%d", rank);
    snprintf(env[1].name, sizeof env[1].name, "TPU_PROCESS_BOUNDS");
    snprintf(env[1].value, sizeof env[1].value, "%s", bounds);
    snprintf(env[2].name, sizeof env[2].name, "TPU_CHIPS_PER_PROCESS_BOUNDS");
    snprintf(env[2].value, sizeof env[2].value, "1,1,1");
    snprintf(env[3].name, sizeof env[3].name, "TPU_PROCESS_ADDRESSES");
    size_t used = 0;
    env[3].value[0] = '\0';
    for (int i = 0; i < n; i++)
        used += (size_t)snprintf(env[3].value + used, sizeof env[3].value - used, "%slocalhost:%d", i ? "," : "",
                                 port + i);
    snprintf(env[4].name, sizeof env[4].name, "TPU_PROCESS_PORT");
    snprintf(env[4].value, sizeof env[4].value, "%d", port + rank);
    snprintf(env[5].name, sizeof env[5].name, "CLOUD_TPU_TASK_ID");
    snprintf(env[5].value, sizeof env[5].value, "%d", rank);
}

static int parse_int(const char *s, int lo, int hi, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

int hr_cmd_launch(int argc, char **argv) {
    /* -n, --hosts, --threads or --tpu: MPI ranks (cmd_launch_mpi.c) */
    for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
        if (!strcmp(argv[i], "-n") || !strcmp(argv[i], "--hosts") || !strcmp(argv[i], "--threads") ||
            !strcmp(argv[i], "--tpu"))
            return hr_cmd_launch_mpi(argc, argv);
    int n = 4, port = 8476, cmd = -1;
    const char *bounds = NULL;
    bool dry = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--")) {
            cmd = i + 1;
            break;
        } else if (!strcmp(argv[i], "--nproc") && i + 1 < argc) {
            if (parse_int(argv[++i], 1, MAX_PROCS, &n)) {
                fprintf(stderr, "hubrt launch: --nproc must be 1..%d, got '%s'\n", MAX_PROCS, argv[i]);
                return HR_EXIT_USAGE;
            }
        } else if (!strcmp(argv[i], "--port") && i + 1 < argc) {
            if (parse_int(argv[++i], 1, 65535 - MAX_PROCS, &port)) {
                fprintf(stderr, "hubrt launch: --port must be 1..%d, got '%s'\n", 65535 - MAX_PROCS, argv[i]);
                return HR_EXIT_USAGE;
            }
        } else if (!strcmp(argv[i], "--process-bounds") && i + 1 < argc) {
            bounds = argv[++i];
        } else if (!strcmp(argv[i], "--dry-run")) {
            dry = true;
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return HR_EXIT_OK;
        } else {
            fprintf(stderr, "hubrt launch: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return HR_EXIT_USAGE;
        }
    }
    if (cmd < 0 || cmd >= argc) {
        fprintf(stderr, "hubrt launch: no command given (put it after --)\n");
        usage(stderr);
        return HR_EXIT_USAGE;
    }
    if (!bounds) bounds = hr_cli_tpu_default_bounds(n);
    if (!bounds || !hr_cli_tpu_bounds_valid(bounds, n)) {
        fprintf(stderr, "hubrt launch: --process-bounds %s must be X,Y,Z with X*Y*Z = %d processes\n",
                bounds ? bounds : "(none: no default for this count)", n);
        return HR_EXIT_USAGE;
    }
    pid_t pids[MAX_PROCS];
    int started = 0, code = HR_EXIT_OK;
    for (int rank = 0; rank < n; rank++) {
        env_var env[6];
        child_env(rank, n, bounds, port, env);
        if (dry) {
            for (int k = 0; k < 6; k++) printf("%s%s=%s", k ? " " : "", env[k].name, env[k].value);
            printf("\n");
            continue;
        }
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "hubrt launch: fork failed for process %d: %s\n", rank, strerror(errno));
            code = HR_EXIT_FAIL;
            break;
        }
        if (pid == 0) {
            for (int k = 0; k < 6; k++) setenv(env[k].name, env[k].value, 1);
            execvp(argv[cmd], argv + cmd);
            fprintf(stderr, "hubrt launch: cannot run '%s': %s\n", argv[cmd], strerror(errno));
            _exit(127);
        }
        pids[started++] = pid;
    }
    for (int i = 0; i < started; i++) {
        int st;
        while (waitpid(pids[i], &st, 0) < 0 && errno == EINTR) {}
        int rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
        if (rc && code == HR_EXIT_OK) {
            fprintf(stderr, "hubrt launch: process %d exited with status %d\n", i, rc);
            code = rc;
        }
    }
    return code;
}
