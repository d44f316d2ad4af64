/* The op catalog is complete: every op has inference and a CPU kernel,
 * names round-trip, and attribute tables fit their structs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "hubrt.h"
#include "ops/op_impl.h"

static void test_every_op_has_inference_and_cpu_kernel(void **state) {
    const hr_infer_fn *infer = hr_infer_table();
    const hr_cpu_kernel_fn *kern = hr_cpu_kernel_table();
    int missing = 0;
    for (int op = 0; op < HR_OP_COUNT; op++) {
        if (!infer[op]) print_error("op '%s' has no inference\n", hr_op_name((hr_op)op)), missing++;
        if (!kern[op]) print_error("op '%s' has no cpu kernel\n", hr_op_name((hr_op)op)), missing++;
    }
    assert_int_equal(missing, 0);
}

static void test_names_round_trip(void **state) {
    for (int op = 0; op < HR_OP_COUNT; op++) {
        hr_op found;
        assert_int_equal(hr_op_find(hr_op_name((hr_op)op), &found), HR_OK);
        assert_int_equal(found, op);
        assert_true(hr_op_min_inputs((hr_op)op) <= hr_op_max_inputs((hr_op)op));
        assert_true(hr_op_max_inputs((hr_op)op) <= HR_MAX_OP_INPUTS);
        assert_true(hr_op_num_outputs((hr_op)op) <= HR_MAX_OP_OUTPUTS);
    }
    hr_op found;
    assert_int_equal(hr_op_find("conv3d", &found), HR_ERR_NOT_FOUND);
}

static void test_attr_fields_fit(void **state) {
    for (int op = 0; op < HR_OP_COUNT; op++) {
        int n;
        const hr_attr_field *f = hr_op_attr_fields((hr_op)op, &n);
        size_t size = hr_op_attrs_size((hr_op)op);
        for (int i = 0; i < n; i++) {
            size_t width = f[i].type == HR_ATTR_BOOL ? 1 : f[i].type == HR_ATTR_INTS ? sizeof(hr_ints) : 8;
            assert_true(f[i].offset + width <= size);
        }
    }
    int n;
    hr_op_attr_fields(HR_OP_sdpa, &n);
    assert_int_equal(n, 7); /* scale, softcap, window, is_causal, exact, exact_from, sinks */
    hr_op_attr_fields(HR_OP_rope_cos_sin, &n);
    assert_int_equal(n, 2); /* attention_scaling, dtype: an op listed between them once hid dtype */
    hr_op_attr_fields(HR_OP_conv2d, &n);
    assert_int_equal(n, 7);
    /* every op's fields are one run of the table: the runs add up to it */
    size_t sum = 0;
    for (int op = 0; op < HR_OP_COUNT; op++) {
        hr_op_attr_fields((hr_op)op, &n);
        sum += (size_t)n;
    }
    assert_int_equal(sum, hr_op_attr_field_total());
    hr_op_attr_fields(HR_OP_add, &n);
    assert_int_equal(n, 0);
}

static void test_dispatch_errors(void **state) {
    int64_t shape[1] = {3};
    hr_tensor *a = NULL, *out = NULL;
    assert_int_equal(hr_tensor_zeros(NULL, HR_F32, 1, shape, &a), HR_OK);
    const hr_tensor *in[1] = {a};
    assert_int_equal(hr_op_run(HR_OP_add, NULL, in, 1, &out, 1), HR_ERR_INVALID_ARG);
    assert_non_null(strstr(hr_last_error(), "'add' takes 2..2 inputs"));
    assert_null(out);
    hr_tensor *outs[2] = {0};
    assert_int_equal(hr_op_run(HR_OP_exp, NULL, in, 1, outs, 2), HR_ERR_INVALID_ARG);
    assert_int_equal(hr_op_run((hr_op)HR_OP_COUNT, NULL, in, 1, &out, 1), HR_ERR_INVALID_ARG);
    hr_tensor_free(a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_op_has_inference_and_cpu_kernel),
        cmocka_unit_test(test_names_round_trip),
        cmocka_unit_test(test_attr_fields_fit),
        cmocka_unit_test(test_dispatch_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
