/* Thread pool: tasks beyond the thread count, tasks claimed by whichever
 * thread is free, back-to-back regions, regions from several threads. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "core/threadpool.h"
#include "hubrt.h"

#define MAX_TASKS_TESTED 4097

typedef struct {
    atomic_int hits[MAX_TASKS_TESTED];
    atomic_int bad_nth;
    int nth;
} tally;

static void tally_body(void *ctx, int ith, int nth) {
    tally *t = ctx;
    if (nth != t->nth) atomic_fetch_add(&t->bad_nth, 1);
    atomic_fetch_add(&t->hits[ith], 1);
}

static void check_tally(tally *t, int nth) {
    assert_int_equal(atomic_load(&t->bad_nth), 0);
    for (int i = 0; i < nth; i++) assert_int_equal(atomic_load(&t->hits[i]), 1);
    for (int i = nth; i < MAX_TASKS_TESTED; i++) assert_int_equal(atomic_load(&t->hits[i]), 0);
}

static void run_tally(int nth) {
    static tally t;
    for (int i = 0; i < MAX_TASKS_TESTED; i++) atomic_store(&t.hits[i], 0);
    atomic_store(&t.bad_nth, 0);
    t.nth = nth;
    hr_parallel_run(tally_body, &t, nth);
    check_tally(&t, nth);
}

/* Every task runs exactly once with the nth it was asked for, however many
 * threads the pool has. */
static void test_tasks_beyond_threads(void **state) {
    int n = hr_num_threads();
    for (int size = 1; size <= 3; size++) {
        assert_int_equal(hr_set_num_threads(size), HR_OK);
        const int counts[] = {1, 2, 3, 17, 4097};
        for (int c = 0; c < 5; c++)
            for (int rep = 0; rep < 20; rep++) run_tally(counts[c]);
    }
    assert_int_equal(hr_set_num_threads(n), HR_OK);
}

static void sleep_us(long us) {
    struct timespec ts = {.tv_sec = 0, .tv_nsec = us * 1000};
    nanosleep(&ts, NULL);
}

/* Task 0 sleeps: the other tasks must still all run (the free threads
 * claim them), and the region returns only after task 0 is done. */
static void slow_first_body(void *ctx, int ith, int nth) {
    atomic_int *hits = ctx;
    if (ith == 0) {
        sleep_us(2000);
        atomic_store(&hits[nth], atomic_load(&hits[nth]) + 1);
    }
    atomic_fetch_add(&hits[ith], 1);
}

static void test_uneven_tasks(void **state) {
    int n = hr_num_threads();
    assert_int_equal(hr_set_num_threads(2), HR_OK);
    for (int rep = 0; rep < 5; rep++) {
        atomic_int hits[9] = {0};
        hr_parallel_run(slow_first_body, hits, 8);
        for (int i = 0; i < 8; i++) assert_int_equal(atomic_load(&hits[i]), 1);
        assert_int_equal(atomic_load(&hits[8]), 1);
    }
    assert_int_equal(hr_set_num_threads(n), HR_OK);
}

/* Idle long enough for the workers to fall asleep, then wake them. */
static void test_wake_after_sleep(void **state) {
    int n = hr_num_threads();
    assert_int_equal(hr_set_num_threads(2), HR_OK);
    for (int rep = 0; rep < 3; rep++) {
        sleep_us(30000);
        run_tally(2);
        run_tally(64);
    }
    assert_int_equal(hr_set_num_threads(n), HR_OK);
}

/* Counts its own failures: cmocka's asserts belong to the main thread. */
static void *region_thread(void *arg) {
    atomic_int *failures = arg;
    for (int rep = 0; rep < 200; rep++) {
        tally *t = calloc(1, sizeof *t);
        t->nth = 5;
        hr_parallel_run(tally_body, t, 5);
        bool ok = atomic_load(&t->bad_nth) == 0;
        for (int i = 0; i < MAX_TASKS_TESTED; i++) ok &= atomic_load(&t->hits[i]) == (i < 5);
        if (!ok) atomic_fetch_add(failures, 1);
        free(t);
    }
    return NULL;
}

/* Regions started from several threads at once: one runs on the pool,
 * the others serially on their own thread; every task still runs once. */
static void test_concurrent_callers(void **state) {
    pthread_t th[3];
    atomic_int failures = 0;
    for (int i = 0; i < 3; i++) assert_int_equal(pthread_create(&th[i], NULL, region_thread, &failures), 0);
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    assert_int_equal(atomic_load(&failures), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tasks_beyond_threads),
        cmocka_unit_test(test_uneven_tasks),
        cmocka_unit_test(test_wake_after_sleep),
        cmocka_unit_test(test_concurrent_callers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
