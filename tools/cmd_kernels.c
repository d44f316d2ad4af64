/* hubrt kernels list|verify|lock: the kernel hub from the command line
 * (hubrt/kernels.h, docs/kernels.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char *usage_text =
    "usage: hubrt kernels list [--cache-dir D]\n"
    "       hubrt kernels verify REPO [--version N | --revision R] [--trust-remote-code] [--lock FILE] [--cache-dir D]\n"
    "       hubrt kernels lock REPO [--version N | --revision R] [--trust-remote-code] [-o FILE] [--cache-dir D]\n"
    "  REPO is a kernel repository (org/name) in the Hugging Face cache, fetched when missing, or a folder.\n"
    "  verify: the checks a load makes (variant, metadata.json, sha256 digests, trusted publisher, lock)\n"
    "  without loading. lock: pins the revision, variant and digests in FILE (default hubrt-kernels.lock).\n"
    "  Trusted publishers: hubrt, and the lines of $HUBRT_KERNELS_TRUSTED (default\n"
    "  ~/.config/hubrt/kernels-trusted.txt).\n";

static void print_kernel(void *ctx, const char *repo, const char *revision, const char *variants) {
    (void)ctx;
    printf("%s\t%s\t%s\n", repo, revision, variants);
}

int hr_cmd_kernels(int argc, char **argv) {
    if (argc < 2 || (strcmp(argv[1], "list") && strcmp(argv[1], "verify") && strcmp(argv[1], "lock"))) {
        fprintf(stderr, "%s", usage_text);
        return HR_EXIT_USAGE;
    }
    const char *sub = argv[1], *repo = NULL, *out = "hubrt-kernels.lock";
    hr_kernel_options o = {0};
    for (int i = 2; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "--trust-remote-code")) {
            o.trust_remote_code = true;
            continue;
        }
        if (f[0] != '-') {
            if (repo || !strcmp(sub, "list")) {
                fprintf(stderr, "hubrt kernels: unexpected argument '%s'\n%s", f, usage_text);
                return HR_EXIT_USAGE;
            }
            repo = f;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "hubrt kernels: %s needs a value\n%s", f, usage_text);
            return HR_EXIT_USAGE;
        }
        const char *v = argv[++i];
        double num = 0;
        if (!strcmp(f, "--version")) {
            if (!hr_cli_number("kernels", f, v, &num)) return HR_EXIT_USAGE;
            if (!(num >= 1 && num <= 1e9) || num != (double)(int64_t)num) {
                fprintf(stderr, "hubrt kernels: --version must be a positive integer\n");
                return HR_EXIT_USAGE;
            }
            o.version = (int64_t)num;
        } else if (!strcmp(f, "--revision")) {
            o.revision = v;
        } else if (!strcmp(f, "--lock")) {
            o.lock_file = v;
        } else if (!strcmp(f, "--cache-dir")) {
            o.cache_dir = v;
        } else if (!strcmp(f, "-o")) {
            out = v;
        } else {
            fprintf(stderr, "hubrt kernels: unknown argument '%s'\n%s", f, usage_text);
            return HR_EXIT_USAGE;
        }
    }
    if (!strcmp(sub, "list")) {
        hr_status s = hr_kernel_list(&o, print_kernel, NULL);
        return s == HR_OK ? HR_EXIT_OK : hr_cli_fail("kernels", s);
    }
    if (!repo) {
        fprintf(stderr, "hubrt kernels %s: no REPO\n%s", sub, usage_text);
        return HR_EXIT_USAGE;
    }
    hr_kernel_info info;
    if (!strcmp(sub, "lock")) {
        hr_status s = hr_kernel_lock(repo, &o, out);
        if (s != HR_OK) return hr_cli_fail("kernels", s);
        printf("locked %s in %s\n", repo, out);
        return HR_EXIT_OK;
    }
    hr_status s = hr_kernel_verify(repo, &o, &info);
    if (s != HR_OK) return hr_cli_fail("kernels", s);
    printf("%s: ok\n  publisher %s\n  revision  %s\n  variant   %s\n  op        %s (version %lld)\n  library   %s\n"
           "  sha256    %s\n", info.repo, info.publisher, info.revision, info.variant, info.name,
           (long long)info.version, info.library, info.digest);
    if (info.rejected[0]) printf("  other variants: %s\n", info.rejected);
    return HR_EXIT_OK;
}
