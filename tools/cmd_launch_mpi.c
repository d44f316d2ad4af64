/* hubrt launch -n N [--hosts H,...] [--threads T] -- command: one process
 * per rank through mpirun (Open MPI), for tensor parallelism (--tp N).
 *
 * What a bare mpirun lacks here is set for the ranks: threads per rank
 * (this host's cores / its ranks, HUBRT_NUM_THREADS), no core binding (a
 * rank's thread pool spans its share), more ranks than cores when asked
 * (--oversubscribe), running as root in containers, and shared-memory
 * transfers without the kernel's cross-memory attach (often refused in
 * containers). The command runs as it would under a plain mpirun. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

#define MAX_ARGS 64

static void usage(FILE *f) {
    fprintf(f,
            "usage: hubrt launch -n N [--hosts H1,H2,...] [--threads T] [--mpirun PATH] [--dry-run] -- command [args]\n"
            "  Runs `command` as N MPI ranks (mpirun), for `hubrt run --tp N` and DistributedConfig(tp_size=N).\n"
            "  --hosts    the hosts to spread the ranks over, in order (default: this one)\n"
            "  --threads  threads per rank (default: this host's cores / its ranks, at least 1)\n"
            "  --mpirun   the launcher (default: mpirun on PATH)\n"
            "  --dry-run  print the mpirun command instead of running it\n");
}

/* Ranks placed on this host when n ranks go over `hosts` hosts round-robin
 * by slot: mpirun fills each host's slots in turn; with --host h1,h2 and
 * no counts each host has one slot, so ranks alternate. */
static int ranks_here(int n, int hosts) { return hosts > 1 ? (n + hosts - 1) / hosts : n; }

int hr_cmd_launch_mpi(int argc, char **argv) {
    int n = 0, threads = 0, cmd = -1;
    const char *hosts = NULL, *mpirun = "mpirun";
    bool dry = false;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        double num = 0;
        if (!strcmp(f, "--")) {
            cmd = i + 1;
            break;
        } else if ((!strcmp(f, "-n") || !strcmp(f, "--threads")) && v) {
            if (!hr_cli_number("launch", f, v, &num) || num < 1 || num > 4096 || num != (int)num) {
                fprintf(stderr, "hubrt launch: %s must be a whole number in 1..4096, got '%s'\n", f, v);
                return HR_EXIT_USAGE;
            }
            *(!strcmp(f, "-n") ? &n : &threads) = (int)num;
            i++;
        } else if (!strcmp(f, "--hosts") && v) {
            hosts = argv[++i];
        } else if (!strcmp(f, "--mpirun") && v) {
            mpirun = argv[++i];
        } else if (!strcmp(f, "--dry-run")) {
            dry = true;
        } else if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            usage(stdout);
            return HR_EXIT_OK;
        } else {
            fprintf(stderr, "hubrt launch: unknown argument '%s' (or it needs a value)\n", f);
            usage(stderr);
            return HR_EXIT_USAGE;
        }
    }
    if (n < 1 || cmd < 0 || cmd >= argc) {
        fprintf(stderr, "hubrt launch: %s\n", n < 1 ? "-n N is required" : "no command given (put it after --)");
        usage(stderr);
        return HR_EXIT_USAGE;
    }
    int n_hosts = 1;
    for (const char *p = hosts; p && *p; p++) n_hosts += *p == ',';
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int here = ranks_here(n, n_hosts);
    if (!threads) threads = cores / here > 0 ? (int)(cores / here) : 1;
    char nbuf[16], tbuf[48];
    snprintf(nbuf, sizeof nbuf, "%d", n);
    snprintf(tbuf, sizeof tbuf, "HUBRT_NUM_THREADS=%d", threads);
    const char *args[MAX_ARGS * 2];
    int k = 0;
    args[k++] = mpirun;
    args[k++] = "-n";
    args[k++] = nbuf;
    args[k++] = "--bind-to";
    args[k++] = "none";
    if (here > cores) args[k++] = "--oversubscribe";
    if (geteuid() == 0) args[k++] = "--allow-run-as-root";
    if (hosts) {
        args[k++] = "--host";
        args[k++] = hosts;
    }
    args[k++] = "-x";
    args[k++] = tbuf;
    /* a container often refuses cross-memory attach; copies through shared memory instead */
    args[k++] = "--mca";
    args[k++] = "btl_vader_single_copy_mechanism";
    args[k++] = "none";
    /* what the ranks need from this environment on other hosts */
    static const char *const pass[] = {"PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "HUBRT_LIBRARY", "HUBRT_DIST_TIMEOUT",
                                       "HUBRT_CACHE_DIR", "HF_HOME", "HF_HUB_OFFLINE"};
    for (size_t j = 0; j < sizeof pass / sizeof pass[0]; j++)
        if (getenv(pass[j])) args[k++] = "-x", args[k++] = pass[j];
    for (int i = cmd; i < argc && k < MAX_ARGS * 2 - 1; i++) args[k++] = argv[i];
    if (k >= MAX_ARGS * 2 - 1) {
        fprintf(stderr, "hubrt launch: the command has too many arguments\n");
        return HR_EXIT_USAGE;
    }
    args[k] = NULL;
    if (dry) {
        for (int i = 0; i < k; i++) printf("%s%s", i ? " " : "", args[i]);
        printf("\n");
        return HR_EXIT_OK;
    }
    fflush(NULL);
    execvp(mpirun, (char *const *)args);
    fprintf(stderr, "hubrt launch: cannot run '%s': %s (Debian: apt-get install openmpi-bin)\n", mpirun,
            strerror(errno));
    return HR_EXIT_FAIL;
}
