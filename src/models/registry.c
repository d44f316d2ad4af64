/* The architecture table: config.json "architectures" -> its file. Adding
 * an architecture is its file and its name in HR_ARCHS. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "models/model_impl.h"

/* Each architecture file defines hr_arch_<name>. */
#define HR_ARCHS(X) X(llama) X(mistral) X(qwen2) X(qwen3) X(qwen3_moe) X(gemma3) X(gemma4) X(gpt_oss)

#define DECLARE_(name) extern const hr_arch hr_arch_##name;
HR_ARCHS(DECLARE_)
#undef DECLARE_

static const hr_arch *const g_archs[] = {
#define REF_(name) &hr_arch_##name,
    HR_ARCHS(REF_)
#undef REF_
};

#define N_ARCHS ((int)(sizeof g_archs / sizeof g_archs[0]))

const hr_arch *hr_arch_at(int i) { return i >= 0 && i < N_ARCHS ? g_archs[i] : NULL; }

const hr_arch *hr_arch_find(const char *name) {
    for (int i = 0; i < N_ARCHS; i++)
        if (!strcmp(g_archs[i]->name, name) || (g_archs[i]->alias && !strcmp(g_archs[i]->alias, name)))
            return g_archs[i];
    return NULL;
}

static char g_list[512];

static void build_list(void) {
    size_t used = 0;
    for (int i = 0; i < N_ARCHS && used < sizeof g_list; i++) {
        used += (size_t)snprintf(g_list + used, sizeof g_list - used, "%s%s", i ? ", " : "", g_archs[i]->name);
        if (g_archs[i]->alias && used < sizeof g_list)
            used += (size_t)snprintf(g_list + used, sizeof g_list - used, ", %s", g_archs[i]->alias);
    }
}

const char *hr_model_supported_archs(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, build_list);
    return g_list;
}
