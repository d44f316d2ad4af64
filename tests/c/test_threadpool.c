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

typedef struct {
    pthread_t caller;
    atomic_int elsewhere, ran;
} where_ran;

/* Each task holds its thread ~50 us, long enough for the pool's workers
 * to claim some of a region's tasks when they may. */
static void note_thread(void *ctx, int ith, int nth) {
    where_ran *w = ctx;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do clock_gettime(CLOCK_MONOTONIC, &t1);
    while ((t1.tv_sec - t0.tv_sec) * 1000000000L + (t1.tv_nsec - t0.tv_nsec) < 50000);
    if (!pthread_equal(pthread_self(), w->caller)) atomic_fetch_add(&w->elsewhere, 1);
    atomic_fetch_add(&w->ran, 1);
}

/* A planned count of 1 keeps every region on the caller; a larger one
 * caps hr_parallel_threads_for; 0 lifts the plan. */
static void test_planned_thread_count(void **state) {
    int before = hr_num_threads();
    assert_int_equal(hr_set_num_threads(4), HR_OK);
    where_ran w = {.caller = pthread_self()};
    hr_parallel_plan_set(1);
    assert_int_equal(hr_parallel_threads_for(1 << 30, 1), 1);
    for (int rep = 0; rep < 50; rep++) hr_parallel_run(note_thread, &w, 8);
    assert_int_equal(atomic_load(&w.ran), 50 * 8);
    assert_int_equal(atomic_load(&w.elsewhere), 0);
    hr_parallel_plan_set(2);
    assert_int_equal(hr_parallel_threads_for(1 << 30, 1), 2);
    assert_int_equal(hr_parallel_threads_for(100, 64), 1);
    hr_parallel_plan_set(0);
    assert_int_equal(hr_parallel_threads_for(1 << 30, 1), 4);
    run_tally(8); /* the pool still serves regions */
    assert_int_equal(hr_set_num_threads(before), HR_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tasks_beyond_threads),
        cmocka_unit_test(test_uneven_tasks),
        cmocka_unit_test(test_wake_after_sleep),
        cmocka_unit_test(test_concurrent_callers),
        cmocka_unit_test(test_planned_thread_count),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
