/* Graph capture: while a jit function runs under capture, every op that
 * dispatch runs at top level is recorded with its attrs and the exact
 * layout (shape, strides, offset, buffer) of each input and output. */
#ifndef HR_OPS_CAPTURE_H
#define HR_OPS_CAPTURE_H

#include "core/tensor_impl.h"

#define HR_CAPTURE_ATTRS_MAX 128

typedef enum hr_value_kind {
    HR_VALUE_CONST = 0,  /* existed before the call: weights, caches */
    HR_VALUE_INPUT = 1,  /* the buffer of input `index` */
    HR_VALUE_TEMP = 2,   /* made during the call, dead at its end */
    HR_VALUE_OUTPUT = 3, /* made during the call, returned as output `index` */
} hr_value_kind;

typedef struct hr_cap_value {
    uint64_t seq;
    hr_value_kind kind;
    int index;           /* input/output number */
    size_t nbytes;
    hr_buffer *buf;      /* CONST: retained; others: capture-time only */
    int64_t base_offset; /* INPUT/CONST: element offset of the named/input tensor */
    hr_dtype base_dtype;
    char name[HR_TENSOR_NAME_CAP]; /* CONST: the tensor name, "" if unnamed */
} hr_cap_value;

typedef struct hr_cap_tensor {
    hr_dtype dtype;
    int ndim;
    int64_t shape[HR_MAX_DIMS];
    int64_t strides[HR_MAX_DIMS];
    int64_t offset;
    int value; /* index into values */
} hr_cap_tensor;

typedef struct hr_cap_node {
    hr_op op;
    int n_in, n_out;
    int first_tensor; /* inputs then outputs, in the tensors array */
    size_t attrs_size;
    unsigned char attrs[HR_CAPTURE_ATTRS_MAX];
} hr_cap_node;

typedef struct hr_capture {
    uint64_t start_seq;
    hr_device *device;
    hr_cap_node *nodes;
    int n_nodes, cap_nodes;
    hr_cap_tensor *tensors;
    int n_tensors, cap_tensors;
    hr_cap_value *values;
    int n_values, cap_values;
    uint64_t *host_written; /* seqs of buffers filled from host memory */
    int n_host_written, cap_host_written;
    hr_status failure;      /* first reason the capture cannot be replayed */
    char failure_msg[512];
} hr_capture;

/* Starts capturing on this thread; `inputs` become INPUT values. */
hr_status hr_capture_begin(hr_capture *cap, const hr_tensor *const *inputs, int n_in);
/* Stops capturing; marks the outputs' buffers. Returns the capture's
 * failure, if any, with its message. */
hr_status hr_capture_end(hr_capture *cap, hr_tensor *const *outputs, int n_out);
void hr_capture_free(hr_capture *cap);

bool hr_capture_active(void);
/* Called by dispatch for each top-level op that ran. */
void hr_capture_record(hr_op op, const void *attrs, const hr_tensor *const *in, int n_in,
                       hr_tensor *const *out, int n_out);
/* Called when host memory is copied into or wrapped as a buffer (core's
 * hr_host_write_hook while a capture runs). */
void hr_capture_note_host_write(const hr_buffer *buf);
/* Fails when t's values depend on the call being captured. */
hr_status hr_capture_check_host_read(const hr_tensor *t);
/* Dispatch nesting: only depth-0 ops are recorded (kernels may run ops). */
void hr_capture_enter_op(void);
void hr_capture_leave_op(void);
bool hr_capture_recording(void);

#endif
