/* hubrt's process group: one process per device, joined over MPI
 * (public API).
 *
 * A tensor-parallel model (hr_model_options.tp_size) runs one process
 * per rank, started by `hubrt launch -n N` or a plain `mpirun -n N`; each
 * joins the group when its model loads (or here, earlier). The collective
 * ops (all_reduce, all_gather) then exchange through MPI. Every exchange
 * has a deadline, HUBRT_DIST_TIMEOUT seconds (default 120): a rank that
 * waits longer prints which exchange it waited on and ends every rank
 * (MPI_Abort), so a rank that died, exited or hangs never leaves the
 * others hanging. A build without MPI (-DHUBRT_MPI=OFF, or no MPI found)
 * is a group of one and says so when asked for more. */
#ifndef HUBRT_DIST_H
#define HUBRT_DIST_H

#include "base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether this build has MPI. */
HR_API bool hr_dist_available(void);
/* Joins the group of the processes mpirun started (idempotent); a
 * process no MPI launcher started (no OMPI_COMM_WORLD_SIZE, PMI_SIZE,
 * PMI_RANK or PMIX_RANK in its environment) is a group of one, and MPI is
 * not initialized in it. */
HR_API hr_status hr_dist_init(void);
/* This process's rank and the group's size (0 and 1 before hr_dist_init). */
HR_API int hr_dist_rank(void);
HR_API int hr_dist_size(void);
/* Waits for every rank (with the deadline). */
HR_API hr_status hr_dist_barrier(void);
/* buf's `bytes` bytes from rank `root` into every rank's buf (with the
 * deadline): what one rank read (a prompt, a random seed) for all. */
HR_API hr_status hr_dist_broadcast(void *buf, size_t bytes, int root);
/* The same for a rank that may wait long for the root (a server's
 * follower ranks between requests): no deadline, and the wait sleeps
 * instead of spinning a core. Every rank of the group calls it for the
 * same message, as with hr_dist_broadcast (the two do not match). */
HR_API hr_status hr_dist_broadcast_idle(void *buf, size_t bytes, int root);
/* Ends every rank now with exit code `code`, after printing `why` with
 * this rank's number to stderr: a rank that failed calls it so that the
 * others do not wait on it. Without a group, exits the process. */
HR_API void hr_dist_abort(int code, const char *why);
/* Leaves the group (MPI_Finalize); also run at a normal exit. */
HR_API void hr_dist_finalize(void);

#ifdef __cplusplus
}
#endif

#endif
