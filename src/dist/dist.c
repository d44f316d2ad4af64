/* The process group over MPI (hubrt/dist.h), and the exchange the
 * collective ops run through (ops/collective.h).
 *
 * Every exchange is non-blocking and polled against a deadline: MPI's
 * blocking collectives wait forever on a rank that stopped, and mpirun
 * notices only ranks that ended, not one stuck before a collective. */
#include "hubrt/dist.h"

#include <stdio.h>
#include <stdlib.h>

#include "core/error.h"
#include "ops/collective.h"

#ifdef HUBRT_HAVE_MPI

#include <dlfcn.h>
#include <limits.h>
#include <mpi.h>
#include <time.h>

static struct {
    bool joined, finalized;
    int rank, size;
    double timeout;
    unsigned long long seq; /* exchanges so far: messages name which one waited */
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

static void die(int code, const char *fmt, const char *what, double waited) {
    fprintf(stderr, fmt, g.rank, g.size, what, g.seq, waited);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    _Exit(code); /* MPI_Abort does not return; should it, the rank still ends */
}

/* Polls req to completion: spinning first (a decode step's exchanges
 * take microseconds), then sleeping between polls; past the deadline,
 * ends every rank. */
static hr_status wait_for(MPI_Request *req, const char *what) {
    double t0 = MPI_Wtime();
    for (long polls = 0;; polls++) {
        int done = 0, rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
            char msg[MPI_MAX_ERROR_STRING];
            int len = 0;
            MPI_Error_string(rc, msg, &len);
            fprintf(stderr, "hubrt: rank %d of %d: %s #%llu failed: %s; ending every rank\n", g.rank, g.size, what,
                    g.seq, msg);
            fflush(stderr);
            MPI_Abort(MPI_COMM_WORLD, 3);
            _Exit(3);
        }
        if (done) return HR_OK;
        if (polls < 20000) continue;
        double waited = MPI_Wtime() - t0;
        if (waited > g.timeout)
            die(3, "hubrt: rank %d of %d: %s #%llu waited %.0f s for the other ranks: one of them died, exited or "
                   "never reached it (HUBRT_DIST_TIMEOUT); ending every rank\n", what, waited);
        nanosleep(&(struct timespec){0, 50 * 1000}, NULL);
    }
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
    MPI_Request req;
    g.seq++;
    int rc = MPI_Iallgatherv(in, (int)bytes, MPI_BYTE, out, c, d, MPI_BYTE, MPI_COMM_WORLD, &req);
    free(c);
    if (rc != MPI_SUCCESS) return hr_error(HR_ERR_IO, "all_gather #%llu: MPI_Iallgatherv failed (%d)", g.seq, rc);
    return wait_for(&req, "all_gather");
}

static void at_exit(void) { hr_dist_finalize(); }

hr_status hr_dist_init(void) {
    if (g.joined) return HR_OK;
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        /* Loaded by a host program (Python's ctypes) with local symbols,
         * Open MPI's plugins would not find libmpi's: make them global. */
        Dl_info info;
        if (dladdr((void *)MPI_Init_thread, &info) && info.dli_fname)
            dlopen(info.dli_fname, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
        int provided = 0;
        /* funneled: the thread pool's workers never call MPI */
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
            return hr_error(HR_ERR_IO, "MPI_Init_thread failed: cannot join the process group");
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &g.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g.size);
    g.timeout = timeout_s();
    g.coll = (hr_collectives){.rank = g.rank, .size = g.size, .all_gather = mpi_all_gather};
    g.joined = true;
    hr_collectives_install(&g.coll);
    atexit(at_exit);
    return HR_OK;
}

int hr_dist_rank(void) { return g.joined ? g.rank : 0; }
int hr_dist_size(void) { return g.joined ? g.size : 1; }

hr_status hr_dist_barrier(void) {
    if (!g.joined || g.size == 1) return HR_OK;
    MPI_Request req;
    g.seq++;
    if (MPI_Ibarrier(MPI_COMM_WORLD, &req) != MPI_SUCCESS)
        return hr_error(HR_ERR_IO, "barrier #%llu: MPI_Ibarrier failed", g.seq);
    return wait_for(&req, "barrier");
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

void hr_dist_abort(int code, const char *why) {
    fprintf(stderr, "hubrt: %s\n", why);
    fflush(stderr);
    _Exit(code ? code : 1);
}

void hr_dist_finalize(void) {}

#endif
