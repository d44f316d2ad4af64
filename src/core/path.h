/* Paths of model folders: whether a file resolves inside its folder, and
 * whether a file is there. */
#ifndef HR_CORE_PATH_H
#define HR_CORE_PATH_H

#include <stdbool.h>

#include "hubrt/base.h"

/* HR_OK when `path` (a file of model folder `dir`) resolves, links
 * followed, to a file inside `dir`, or inside the cache's blobs/ folder when
 * `dir` is a Hugging Face cache snapshot (<repo>/snapshots/<revision>);
 * also HR_OK when either does not exist (the opener reports that).
 * HR_ERR_FORMAT naming both otherwise, unless HUBRT_ALLOW_OUTSIDE_LINKS=1. */
hr_status hr_path_check_inside(const char *dir, const char *path);

/* Whether `path` names a regular file (links followed). */
bool hr_path_is_file(const char *path);

#endif
