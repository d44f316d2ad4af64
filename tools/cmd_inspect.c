/* hubrt inspect PATH: the tensors of a safetensors file or model folder,
 * one line each ("name dtype [shape]", sorted by name), then a summary. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char *human_bytes(double b, char *buf, size_t n) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024 && u < 4) b /= 1024, u++;
    snprintf(buf, n, u ? "%.2f %s" : "%.0f %s", b, units[u]);
    return buf;
}

int hr_cmd_inspect(int argc, char **argv) {
    if (argc != 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        fprintf(argc == 2 ? stdout : stderr,
                "usage: hubrt inspect PATH\n"
                "PATH: a .safetensors file, a model.safetensors.index.json, a model folder or a Hub id\n");
        return argc == 2 ? HR_EXIT_OK : HR_EXIT_USAGE;
    }
    hr_checkpoint *ck;
    char *dir = NULL;
    hr_status s = hr_cli_model_dir(argv[1], NULL, &dir);
    if (s == HR_OK) s = hr_checkpoint_open(dir, &ck);
    free(dir);
    if (s != HR_OK) return hr_cli_fail("inspect", s);
    size_t n = hr_checkpoint_count(ck);
    unsigned long long total = 0;
    for (size_t i = 0; i < n; i++) {
        const char *name = hr_checkpoint_name(ck, i);
        hr_tensor_info info;
        s = hr_checkpoint_info(ck, name, &info);
        if (s != HR_OK) {
            hr_checkpoint_close(ck);
            return hr_cli_fail("inspect", s);
        }
        char shape[256];
        printf("%s %s %s\n", name, hr_dtype_safetensors_name(info.dtype),
               hr_shape_str(info.ndim, info.shape, shape, sizeof shape));
        total += info.nbytes;
    }
    size_t shards = hr_checkpoint_shard_count(ck);
    char hb[32];
    printf("\n%zu tensor%s, %llu bytes (%s), %zu shard%s\n", n, n == 1 ? "" : "s", total,
           human_bytes((double)total, hb, sizeof hb), shards, shards == 1 ? "" : "s");
    for (size_t sh = 0; sh < shards; sh++) {
        const hr_safetensors *st = hr_checkpoint_shard(ck, sh);
        for (size_t i = 0; i < hr_safetensors_metadata_count(st); i++) {
            hr_kv kv = hr_safetensors_metadata_at(st, i);
            printf("metadata %s: %s=%s\n", hr_checkpoint_shard_path(ck, sh), kv.key, kv.value);
        }
    }
    hr_checkpoint_close(ck);
    return HR_EXIT_OK;
}
