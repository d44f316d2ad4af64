/* libFuzzer target: a kernel package's metadata.json as the kernel hub
 * reads it before it trusts anything in the package. A metadata that
 * parses holds bounded strings, plain file names and 64-digit digests;
 * every refusal carries a message. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/kernel_meta.h"
#include "fuzz_limits.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    hr_kernel_meta m;
    if (hr_kernel_meta_parse("metadata.json", (const char *)data, size, &m) != HR_OK) {
        if (!hr_last_error()[0]) abort();
        return 0;
    }
    if (m.n_files < 1 || m.n_files > HR_KMETA_MAX_FILES || m.version < 1 || !m.id[0] || !m.name[0]) abort();
    for (int i = 0; i < m.n_files; i++) {
        if (strlen(m.files[i].sha256) != 64 || !m.files[i].name[0] || strchr(m.files[i].name, '/') ||
            m.files[i].name[0] == '.')
            abort();
    }
    return 0;
}
