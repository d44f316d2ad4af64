/* Segment claims (core/claims.h): a segment's owner takes its items in
 * order from the front, a thief from the back; a task's hr_claims_next
 * goes through its own segment and then the others'; the segments are
 * hr_split_range's; and tasks claiming at once, on their own segments and
 * then on the others', take every item exactly once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "core/claims.h"
#include "core/threadpool.h"

static void test_front_and_back(void **state) {
    (void)state;
    hr_claims c;
    hr_claims_init(&c, 5, 1);
    assert_int_equal(hr_claims_take(&c, 0, true), 0);
    assert_int_equal(hr_claims_take(&c, 0, false), 4);
    assert_int_equal(hr_claims_take(&c, 0, true), 1);
    assert_int_equal(hr_claims_take(&c, 0, false), 3);
    assert_int_equal(hr_claims_take(&c, 0, true), 2);
    assert_int_equal(hr_claims_take(&c, 0, true), -1);
    assert_int_equal(hr_claims_take(&c, 0, false), -1);
}

/* One task alone: its own segment forward, then the next segment's items
 * from the back, then the one after. */
static void test_next_own_then_others_backs(void **state) {
    (void)state;
    hr_claims c;
    hr_claims_init(&c, 9, 3); /* [0, 3) [3, 6) [6, 9) */
    static const int64_t want[] = {3, 4, 5, 8, 7, 6, 2, 1, 0};
    static const int segs[] = {0, 0, 0, 1, 1, 1, 2, 2, 2};
    int seg = 0;
    for (int k = 0; k < 9; k++) {
        assert_int_equal(hr_claims_next(&c, 1, 3, &seg), want[k]);
        assert_int_equal(seg, segs[k]);
    }
    assert_int_equal(hr_claims_next(&c, 1, 3, &seg), -1);
}

static void test_segments_are_split_ranges(void **state) {
    (void)state;
    hr_claims c;
    const int64_t items = 10;
    const int segs = 3;
    hr_claims_init(&c, items, segs);
    for (int s = 0; s < segs; s++) {
        int64_t b, e;
        hr_split_range(items, s, segs, &b, &e);
        for (int64_t i = b; i < e; i++) assert_int_equal(hr_claims_take(&c, s, true), i);
        assert_int_equal(hr_claims_take(&c, s, true), -1);
    }
    hr_claims_init(&c, 0, 2); /* no items: nothing to take anywhere */
    assert_int_equal(hr_claims_take(&c, 0, true), -1);
    assert_int_equal(hr_claims_take(&c, 1, false), -1);
}

enum { TASKS = 4, ITEMS = 200003 };

typedef struct {
    hr_claims claims;
    atomic_int taken[ITEMS];
    atomic_int out_of_order; /* an owner's items not in increasing order */
} shared_run;

typedef struct {
    shared_run *run;
    int t;
} task_arg;

/* As the kernels do: the task's own segment forward, then the others' backs. */
static void *task(void *p) {
    task_arg *a = p;
    shared_run *r = a->run;
    int64_t last = -1;
    int seg = 0;
    for (int64_t i; (i = hr_claims_next(&r->claims, a->t, TASKS, &seg)) >= 0;) {
        atomic_fetch_add(&r->taken[i], 1);
        if (seg == 0) {
            if (i <= last) atomic_fetch_add(&r->out_of_order, 1);
            last = i;
        }
    }
    return NULL;
}

static void test_concurrent_tasks_take_each_item_once(void **state) {
    (void)state;
    shared_run *r = calloc(1, sizeof *r);
    assert_non_null(r);
    for (int round = 0; round < 5; round++) {
        for (int i = 0; i < ITEMS; i++) atomic_init(&r->taken[i], 0);
        atomic_init(&r->out_of_order, 0);
        hr_claims_init(&r->claims, ITEMS, TASKS);
        pthread_t th[TASKS];
        task_arg args[TASKS];
        for (int t = 0; t < TASKS; t++) {
            args[t] = (task_arg){r, t};
            assert_int_equal(pthread_create(&th[t], NULL, task, &args[t]), 0);
        }
        for (int t = 0; t < TASKS; t++) pthread_join(th[t], NULL);
        int wrong = 0;
        for (int i = 0; i < ITEMS; i++) wrong += atomic_load(&r->taken[i]) != 1;
        assert_int_equal(wrong, 0);
        assert_int_equal(atomic_load(&r->out_of_order), 0);
    }
    free(r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_front_and_back),
        cmocka_unit_test(test_next_own_then_others_backs),
        cmocka_unit_test(test_segments_are_split_ranges),
        cmocka_unit_test(test_concurrent_tasks_take_each_item_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
