/* hubrt launch -n N [--hosts H,...] [--threads T] -- command: one process
 * per rank through mpirun (Open MPI), for tensor parallelism (--tp N).
 *
 * What a bare mpirun lacks here is set for the ranks: threads per rank
 * (this host's cores / its ranks, HUBRT_NUM_THREADS), no core binding (a
 * rank's thread pool spans its share), more ranks than cores when asked
 * (--oversubscribe), running as root in containers, and shared-memory
 * transfers without the kernel's cross-memory attach (often refused in
 * containers). The command runs as it would under a plain mpirun.
 *
 * --tpu: one chip per rank. The launcher passes libtpu's variables that
 * every process shares (the process grid, one chip per process, every
 * process's address: ranks fill each host's slots in turn) and the base
 * port; each rank's own three (its chip, port and task id) are derived
 * from its place in the MPI layout by libhubrt as it loads libtpu
 * (backends/pjrt/pjrt_plugin.c). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

#define MAX_ARGS 64

static void usage(FILE *f) {
    fprintf(f,
            "usage: hubrt launch -n N [--hosts H1,H2,...] [--threads T] [--mpirun PATH] [--dry-run]\n"
            "                    [--tpu [--port P] [--process-bounds X,Y,Z]] -- command [args]\n"
            "  Runs `command` as N MPI ranks (mpirun), for `hubrt run --tp N` and DistributedConfig(tp_size=N).\n"
            "  --hosts    the hosts to spread the ranks over, in order (default: this one)\n"
            "  --threads  threads per rank (default: this host's cores / its ranks, at least 1)\n"
            "  --mpirun   the launcher (default: mpirun on PATH)\n"
            "  --dry-run  print the mpirun command instead of running it\n"
            "  --tpu      one TPU chip per rank: libtpu's variables from the MPI layout (--port P, default\n"
            "             8476, process i of a host on P + i; --process-bounds, default by N as --nproc's)\n");
}

/* Ranks placed on this host when n ranks go over `hosts` hosts round-robin
 * by slot: mpirun fills each host's slots in turn; with --host h1,h2 and
 * no counts each host has one slot, so ranks alternate. */
static int ranks_here(int n, int hosts) { return hosts > 1 ? (n + hosts - 1) / hosts : n; }

/* --tpu: each host's slots (`here` ranks each, so rank r is on host
 * r / here, its local index r % here) into hostbuf, and the four
 * variables every rank shares. 0, or -1 with the message printed. */
static int tpu_layout(int n, const char *hosts, int here, int port, const char *bounds, char *hostbuf, size_t hn,
                      char env[4][1200]) {
    if (!bounds) bounds = hr_cli_tpu_default_bounds(n);
    if (!bounds || !hr_cli_tpu_bounds_valid(bounds, n)) {
        fprintf(stderr, "hubrt launch: --process-bounds %s must be X,Y,Z with X*Y*Z = %d processes\n",
                bounds ? bounds : "(none: no default for this count)", n);
        return -1;
    }
    char list[1024];
    snprintf(list, sizeof list, "%s", hosts ? hosts : "localhost");
    const char *names[64];
    int n_hosts = 0;
    for (char *save = NULL, *h = strtok_r(list, ",", &save); h && n_hosts < 64; h = strtok_r(NULL, ",", &save))
        names[n_hosts++] = h;
    size_t used = 0;
    for (int h = 0; hosts && h < n_hosts; h++)
        used += (size_t)snprintf(hostbuf + used, used < hn ? hn - used : 0, "%s%s:%d", h ? "," : "", names[h], here);
    snprintf(env[0], sizeof env[0], "TPU_PROCESS_BOUNDS=%s", bounds);
    snprintf(env[1], sizeof env[1], "TPU_CHIPS_PER_PROCESS_BOUNDS=1,1,1");
    used = (size_t)snprintf(env[2], sizeof env[2], "TPU_PROCESS_ADDRESSES=");
    for (int r = 0; r < n; r++)
        used += (size_t)snprintf(env[2] + used, used < sizeof env[2] ? sizeof env[2] - used : 0, "%s%s:%d",
                                 r ? "," : "", names[r / here < n_hosts ? r / here : n_hosts - 1], port + r % here);
    if (used >= sizeof env[2] || (hosts && strlen(hostbuf) >= hn)) {
        fprintf(stderr, "hubrt launch: too many hosts or processes for --tpu's address list\n");
        return -1;
    }
    snprintf(env[3], sizeof env[3], "HUBRT_TPU_BASE_PORT=%d", port);
    return 0;
}

int hr_cmd_launch_mpi(int argc, char **argv) {
    int n = 0, threads = 0, cmd = -1, port = 8476;
    const char *hosts = NULL, *mpirun = "mpirun", *bounds = NULL;
    bool dry = false, tpu = false;
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
        } else if (!strcmp(f, "--tpu")) {
            tpu = true;
        } else if (!strcmp(f, "--port") && v) {
            if (!hr_cli_number("launch", f, v, &num) || num < 1 || num > 65535 - 64 || num != (int)num) {
                fprintf(stderr, "hubrt launch: --port must be 1..%d, got '%s'\n", 65535 - 64, v);
                return HR_EXIT_USAGE;
            }
            port = (int)num;
            i++;
        } else if (!strcmp(f, "--process-bounds") && v) {
            bounds = argv[++i];
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
    char nbuf[16], tbuf[48], hostbuf[1024] = "", tpu_env[4][1200];
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
    if (tpu && tpu_layout(n, hosts, here, port, bounds, hostbuf, sizeof hostbuf, tpu_env) != 0) return HR_EXIT_USAGE;
    if (hosts) {
        args[k++] = "--host";
        args[k++] = hostbuf[0] ? hostbuf : hosts;
    }
    for (int j = 0; tpu && j < 4; j++) args[k++] = "-x", args[k++] = tpu_env[j];
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
