/* The process group over MPI (hubrt/dist.h), and the exchange the
 * collective ops run through (ops/collective.h).
 *
 * Exchanges are MPI's blocking collectives (Open MPI's non-blocking ones,
 * polled, took ~100x longer per decode step), watched by a thread: an
 * exchange in flight past the deadline means a rank stopped (mpirun
 * notices ranks that ended, not one stuck before a collective), so the
 * watcher names the exchange and ends this rank, and mpirun the rest. */
#include "hubrt/dist.h"

#include <stdio.h>
#include <stdlib.h>

#include "core/error.h"
#include "ops/collective.h"

#ifdef HUBRT_HAVE_MPI

#include <dlfcn.h>
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

static struct {
    bool joined, finalized;
    int rank, size;
    double timeout;
    unsigned long long seq;     /* exchanges so far: messages name which one waited */
    _Atomic long long since_ms; /* when the exchange in flight began (monotonic ms), 0: none */
    _Atomic(const char *) what;
    hr_collectives coll;
} g;

bool hr_dist_available(void) { return true; }

/* HUBRT_DIST_TIMEOUT in seconds (default 120). */
static double timeout_s(void) {
    const char *e = getenv("HUBRT_DIST_TIMEOUT");
    char *end = NULL;
    double v = e ? strtod(e, &end) : 0;
    if (e && end != e && !*end && v > 0) return v;
    if (e) fprintf(stderr, "hubrt: HUBRT_DIST_TIMEOUT='%s' is not a positive number of seconds; using 120\n", e);
    return 120;
}

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The watcher: wakes ten times a second, and past the deadline of the
 * exchange in flight ends this rank (no MPI call from this thread). mpirun then ends the others. */
static void *watch(void *arg) {
    (void)arg;
    for (;;) {
        nanosleep(&(struct timespec){0, 100 * 1000 * 1000}, NULL);
        long long since = atomic_load(&g.since_ms);
        if (!since || (double)(now_ms() - since) < g.timeout * 1000) continue;
        fprintf(stderr, "hubrt: rank %d of %d: %s #%llu waited %.0f s for the other ranks: one of them died, exited "
                "or never reached it (HUBRT_DIST_TIMEOUT); ending every rank\n", g.rank, g.size,
                atomic_load(&g.what), g.seq, (double)(now_ms() - since) / 1000);
        fflush(stderr);
        _exit(3);
    }
    return NULL;
}

static void begin(const char *what) {
    g.seq++;
    atomic_store(&g.what, what);
    atomic_store(&g.since_ms, now_ms());
}

/* Ends the exchange begun; a failed one (MPI_ERRORS_RETURN) ends every
 * rank: the group cannot go on. */
static hr_status end(int rc) {
    atomic_store(&g.since_ms, 0);
    if (rc == MPI_SUCCESS) return HR_OK;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    fprintf(stderr, "hubrt: rank %d of %d: %s #%llu failed: %s; ending every rank\n", g.rank, g.size,
            atomic_load(&g.what), g.seq, msg);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 3);
    _exit(3);
}

static hr_status mpi_all_gather(const void *in, size_t bytes, void *out, const size_t *counts, const size_t *displs) {
    int *c = malloc(2 * sizeof(int) * (size_t)g.size);
    if (!c) return hr_error(HR_ERR_OOM, "all_gather: out of memory");
    int *d = c + g.size;
    for (int r = 0; r < g.size; r++) {
        if (counts[r] > INT_MAX || displs[r] > INT_MAX) {
            free(c);
            return hr_error(HR_ERR_INVALID_ARG, "all_gather: rank %d's part (%zu bytes at %zu) is beyond MPI's int "
                            "counts", r, counts[r], displs[r]);
        }
        c[r] = (int)counts[r];
        d[r] = (int)displs[r];
    }
    begin("all_gather");
    hr_status s = end(MPI_Allgatherv(in, (int)bytes, MPI_BYTE, out, c, d, MPI_BYTE, MPI_COMM_WORLD));
    free(c);
    return s;
}

static hr_status mpi_broadcast(void *buf, size_t bytes, int root) {
    if (bytes > INT_MAX)
        return hr_error(HR_ERR_INVALID_ARG, "broadcast: %zu bytes is beyond MPI's int counts", bytes);
    begin("broadcast");
    return end(MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, MPI_COMM_WORLD));
}

static void at_exit(void) { hr_dist_finalize(); }

/* Whether an MPI launcher started this process: Open MPI's mpirun, or a
 * PMI / PMIx one (MPICH's Hydra, Slurm). A process started otherwise is a
 * group of one and leaves MPI alone: a singleton MPI_Init would set
 * variables that its own children inherit, and an mpirun started from
 * such a child takes itself for a rank and fails. */
static bool launched_by_mpi(void) {
    static const char *const markers[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK", "PMIX_RANK"};
    for (size_t i = 0; i < sizeof markers / sizeof markers[0]; i++)
        if (getenv(markers[i])) return true;
    return false;
}

hr_status hr_dist_init(void) {
    if (g.joined) return HR_OK;
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited && !launched_by_mpi()) {
        g.rank = 0, g.size = 1;
        g.joined = true;
        g.finalized = true; /* nothing to leave */
        return HR_OK;
    }
    if (!inited) {
        /* Loaded by a host program (Python's ctypes) with local symbols,
         * Open MPI's plugins would not find libmpi's: make them global. */
        Dl_info info;
        if (dladdr((void *)MPI_Init_thread, &info) && info.dli_fname)
            dlopen(info.dli_fname, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
        int provided = 0;
        /* serialized: one thread at a time calls MPI (the thread running
         * the model: a server's engine thread); the pool's workers and the
         * watcher never do */
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
            return hr_error(HR_ERR_IO, "MPI_Init_thread failed: cannot join the process group");
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &g.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g.size);
    g.timeout = timeout_s();
    g.coll = (hr_collectives){.rank = g.rank, .size = g.size, .all_gather = mpi_all_gather, .broadcast = mpi_broadcast};
    g.joined = true;
    pthread_t t;
    if (g.size > 1 && pthread_create(&t, NULL, watch, NULL) == 0) pthread_detach(t);
    hr_collectives_install(&g.coll);
    atexit(at_exit);
    return HR_OK;
}

int hr_dist_rank(void) { return g.joined ? g.rank : 0; }
int hr_dist_size(void) { return g.joined ? g.size : 1; }

hr_status hr_dist_barrier(void) {
    if (!g.joined || g.size == 1) return HR_OK;
    begin("barrier");
    return end(MPI_Barrier(MPI_COMM_WORLD));
}

hr_status hr_dist_broadcast_idle(void *buf, size_t bytes, int root) {
    if (!g.joined || g.size == 1) return root == 0 ? HR_OK : hr_error(HR_ERR_INVALID_ARG, "broadcast: root %d "
                                                                       "is not a rank of a group of one", root);
    if (root < 0 || root >= g.size || bytes > INT_MAX)
        return hr_error(HR_ERR_INVALID_ARG, "broadcast: root %d of %d, %zu bytes", root, g.size, bytes);
    /* point to point: a receive posted and polled, sleeping between polls
     * once idle (a blocking MPI call spins a core while it waits) */
    enum { TAG = 7001 };
    if (g.rank == root) {
        for (int r = 0; r < g.size; r++)
            if (r != root && MPI_Send(buf, (int)bytes, MPI_BYTE, r, TAG, MPI_COMM_WORLD) != MPI_SUCCESS)
                return hr_error(HR_ERR_IO, "broadcast: MPI_Send to rank %d failed", r);
        return HR_OK;
    }
    MPI_Request req;
    if (MPI_Irecv(buf, (int)bytes, MPI_BYTE, root, TAG, MPI_COMM_WORLD, &req) != MPI_SUCCESS)
        return hr_error(HR_ERR_IO, "broadcast: MPI_Irecv from rank %d failed", root);
    for (long polls = 0;; polls++) {
        int done = 0;
        if (MPI_Test(&req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
            return hr_error(HR_ERR_IO, "broadcast: receiving from rank %d failed", root);
        if (done) return HR_OK;
        if (polls > 10000) nanosleep(&(struct timespec){0, 500 * 1000}, NULL);
    }
}

hr_status hr_dist_broadcast(void *buf, size_t bytes, int root) {
    if (!g.joined || g.size == 1) return root == 0 ? HR_OK : hr_error(HR_ERR_INVALID_ARG, "broadcast: root %d "
                                                                       "is not a rank of a group of one", root);
    if (root < 0 || root >= g.size)
        return hr_error(HR_ERR_INVALID_ARG, "broadcast: root %d is not a rank of the group of %d", root, g.size);
    return mpi_broadcast(buf, bytes, root);
}

void hr_dist_abort(int code, const char *why) {
    fprintf(stderr, "hubrt: rank %d of %d: %s; ending every rank\n", hr_dist_rank(), hr_dist_size(), why);
    fflush(stderr);
    if (g.joined && !g.finalized && g.size > 1) MPI_Abort(MPI_COMM_WORLD, code ? code : 1);
    _Exit(code ? code : 1);
}

void hr_dist_finalize(void) {
    if (!g.joined || g.finalized) return;
    g.finalized = true;
    hr_collectives_install(NULL);
    int done = 0;
    MPI_Finalized(&done);
    if (!done) MPI_Finalize();
}

#else /* no MPI in this build: a group of one */

bool hr_dist_available(void) { return false; }

hr_status hr_dist_init(void) {
    return hr_error(HR_ERR_UNSUPPORTED, "this hubrt was built without MPI: tensor parallelism (tp_size > 1) needs "
                    "an MPI library at build time (Debian: libopenmpi-dev; cmake -DHUBRT_MPI=ON)");
}
int hr_dist_rank(void) { return 0; }
int hr_dist_size(void) { return 1; }
hr_status hr_dist_barrier(void) { return HR_OK; }

hr_status hr_dist_broadcast_idle(void *buf, size_t bytes, int root) { return hr_dist_broadcast(buf, bytes, root); }

hr_status hr_dist_broadcast(void *buf, size_t bytes, int root) {
    (void)buf, (void)bytes;
    return root == 0 ? HR_OK : hr_error(HR_ERR_INVALID_ARG, "broadcast: root %d is not a rank of a group of one", root);
}

void hr_dist_abort(int code, const char *why) {
    fprintf(stderr, "hubrt: %s\n", why);
    fflush(stderr);
    _Exit(code ? code : 1);
}

void hr_dist_finalize(void) {}

#endif
