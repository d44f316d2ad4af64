/* hubrt info [--json]: devices and detected CPU features. */
#include <stdio.h>
#include <string.h>

#include "backends/pjrt/pjrt.h"
#include "cli.h"

#define FEATURES(X)                                                          \
    X("avx2", avx2) X("fma", fma) X("f16c", f16c) X("avx512f", avx512f)       \
    X("avx512bw", avx512bw) X("avx512vl", avx512vl) X("avx512_vnni", avx512_vnni) \
    X("avx512_bf16", avx512_bf16) X("avx512_fp16", avx512_fp16) X("avx_vnni", avx_vnni) \
    X("amx_tile", amx_tile) X("amx_bf16", amx_bf16) X("amx_int8", amx_int8)

static void json_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

/* The PJRT backends: the plugin each would load and its C API version, or
 * why it cannot (the paths searched). */
static void print_pjrt(bool json) {
    static const char *const names[] = {"xla_cpu", "tpu"};
    if (!json) printf("\npjrt:\n");
    for (int i = 0; i < 2; i++) {
        hr_pjrt_info info;
        hr_status s = hr_pjrt_backend_info(names[i], &info);
        if (json) {
            printf("%s{\"backend\":", i ? "," : "");
            json_string(names[i]);
            if (s == HR_OK) {
                printf(",\"available\":true,\"path\":");
                json_string(info.path);
                printf(",\"platform\":");
                json_string(info.platform);
                printf(",\"platform_version\":");
                json_string(info.version);
                printf(",\"api_version\":\"%d.%d\",\"devices\":%d}", info.api_major, info.api_minor,
                       info.num_devices);
            } else {
                printf(",\"available\":false,\"error\":");
                json_string(hr_last_error());
                printf("}");
            }
        } else if (s == HR_OK) {
            printf("  %s: %d device%s, platform %s %s, PJRT C API %d.%d\n    plugin %s\n", names[i], info.num_devices,
                   info.num_devices == 1 ? "" : "s", info.platform, info.version, info.api_major, info.api_minor,
                   info.path);
        } else {
            printf("  %s: unavailable: %s\n", names[i], hr_last_error());
        }
    }
}

int hr_cmd_info(int argc, char **argv) {
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = true;
        else {
            fprintf(stderr, "usage: hubrt info [--json]\nunknown argument '%s'\n", argv[i]);
            return HR_EXIT_USAGE;
        }
    }
    const hr_cpu_features *f = hr_cpu_features_get();
    const char *const *backends = hr_device_backends();
    hr_cpu_isa isa = hr_cpu_isa_get();
    int threads = hr_num_threads();
    if (json) {
        printf("{\"version\":");
        json_string(hr_version());
        printf(",\"devices\":[");
        for (int i = 0; backends[i]; i++) {
            printf(i ? "," : "");
            printf("{\"name\":");
            json_string(backends[i]);
            printf("}");
        }
        printf("],\"cpu\":{\"vendor\":");
        json_string(f->vendor);
        printf(",\"brand\":");
        json_string(f->brand);
        printf(",\"logical_cpus\":%d,\"threads\":%d,\"isa\":\"%s\",\"amx_usable\":%s,\"features\":{",
               f->logical_cpus, threads, hr_cpu_isa_name(isa), f->amx_usable ? "true" : "false");
        const char *sep = "";
#define X(name, field) printf("%s\"%s\":%s", sep, name, f->field ? "true" : "false"), sep = ",";
        FEATURES(X)
#undef X
        printf("}},\"pjrt\":[");
        print_pjrt(true);
        printf("]}\n");
        return HR_EXIT_OK;
    }
    printf("hubrt %s\n\ndevices:\n", hr_version());
    for (int i = 0; backends[i]; i++) printf("  %s\n", backends[i]);
    print_pjrt(false);
    printf("\ncpu: %s (%s)\n", f->brand[0] ? f->brand : "unknown", f->vendor[0] ? f->vendor : "?");
    printf("  logical cpus: %d, pool threads: %d, kernel isa: %s\n", f->logical_cpus, threads, hr_cpu_isa_name(isa));
    printf("  features:");
#define X(name, field) if (f->field) printf(" %s", name);
    FEATURES(X)
#undef X
    printf("\n  amx tile permission: %s\n", f->amx_tile ? (f->amx_usable ? "granted" : "refused") : "n/a");
    return HR_EXIT_OK;
}
