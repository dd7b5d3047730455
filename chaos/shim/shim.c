/*
 * CUDA driver fault-injection shim (LD_PRELOAD).
 *
 * Processes reach the driver three ways, and all three are covered:
 *   1. direct calls to exported symbols      -> the exported wrappers below
 *   2. dlopen("libcuda.so.1") + dlsym(h, ..) -> the dlsym() override
 *   3. cuGetProcAddress(_v2)                 -> wrappers for both, which substitute
 *                                               our wrapper for every entry point we wrap
 * Resolution happens once at start-up, so the decision to inject is made at CALL time:
 * every wrapper first loads one word that says, for the control file's generation it was
 * computed for, which entry points would pass straight through under the current plan
 * (all while disarmed; while armed, those of other symbols, or all for another rank or
 * boot, or once the plan's shots are spent).  If that generation is the file's and the
 * wrapper's bit is set, that is the whole cost.  See README.md for the plan language and
 * the control-file layout.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- minimal CUDA driver types (no CUDA headers needed) ---- */
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long cuuint64_t;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUfunc_st *CUfunction;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUlaunchConfig_st CUlaunchConfig;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_NOT_READY 600
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2

#define API __attribute__((visibility("default")))

/* ---- control file layout (shared with chaos/shim/control.py) ---- */
#define CTL_SIZE 4096
#define CTL_TEXT_OFFSET 64
#define CTL_TEXT_MAX (CTL_SIZE - CTL_TEXT_OFFSET)
struct ctl_hdr {
    char magic[8];     /* "CHAOSCU1" */
    uint32_t gen;      /* seqlock: odd while the writer is mid-update */
    uint32_t len;      /* bytes of plan text; 0 = disarmed */
    uint32_t csum;     /* FNV-1a of the text, guards against torn reads */
    uint32_t reserved[11];
    char text[CTL_TEXT_MAX];
};

/* ---- the wrapped entry points ---- */
enum { K_NONE, K_LAUNCH, K_ALLOC, K_SYNC, K_QUERY };

#define P_LAUNCH (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, \
                  unsigned bz, unsigned shmem, CUstream s, void **kp, void **extra)
#define A_LAUNCH (f, gx, gy, gz, bx, by, bz, shmem, s, kp, extra)
#define P_LAUNCHEX (const CUlaunchConfig *cfg, CUfunction f, void **kp, void **extra)
#define A_LAUNCHEX (cfg, f, kp, extra)
#define P_COOP (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, \
                unsigned bz, unsigned shmem, CUstream s, void **kp)
#define A_COOP (f, gx, gy, gz, bx, by, bz, shmem, s, kp)
#define P_HTOD (CUdeviceptr dst, const void *src, size_t n)
#define P_DTOH (void *dst, CUdeviceptr src, size_t n)
#define P_HTODA (CUdeviceptr dst, const void *src, size_t n, CUstream s)
#define P_DTOHA (void *dst, CUdeviceptr src, size_t n, CUstream s)
#define A_CPY (dst, src, n)
#define A_CPYA (dst, src, n, s)

/* X(name, gpa base name, min cudaVersion, per-thread-stream variant, kind, params, args, CUfunction) */
#define WRAPPED(X)                                                                               \
    X(cuLaunchKernel, "cuLaunchKernel", 4000, 0, K_LAUNCH, P_LAUNCH, A_LAUNCH, f)                \
    X(cuLaunchKernel_ptsz, "cuLaunchKernel", 4000, 1, K_LAUNCH, P_LAUNCH, A_LAUNCH, f)           \
    X(cuLaunchKernelEx, "cuLaunchKernelEx", 11060, 0, K_LAUNCH, P_LAUNCHEX, A_LAUNCHEX, f)       \
    X(cuLaunchKernelEx_ptsz, "cuLaunchKernelEx", 11060, 1, K_LAUNCH, P_LAUNCHEX, A_LAUNCHEX, f)  \
    X(cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel", 9000, 0, K_LAUNCH, P_COOP, A_COOP, f) \
    X(cuLaunchCooperativeKernel_ptsz, "cuLaunchCooperativeKernel", 9000, 1, K_LAUNCH, P_COOP, A_COOP, f) \
    X(cuMemAlloc_v2, "cuMemAlloc", 3020, 0, K_ALLOC, (CUdeviceptr *p, size_t n), (p, n), NULL)    \
    X(cuMemAllocAsync, "cuMemAllocAsync", 11020, 0, K_LAUNCH, (CUdeviceptr *p, size_t n, CUstream s), (p, n, s), NULL) \
    X(cuMemAllocAsync_ptsz, "cuMemAllocAsync", 11020, 1, K_LAUNCH, (CUdeviceptr *p, size_t n, CUstream s), (p, n, s), NULL) \
    X(cuMemcpyHtoD_v2, "cuMemcpyHtoD", 3020, 0, K_SYNC, P_HTOD, A_CPY, NULL)                      \
    X(cuMemcpyHtoD_v2_ptds, "cuMemcpyHtoD", 3020, 1, K_SYNC, P_HTOD, A_CPY, NULL)                 \
    X(cuMemcpyDtoH_v2, "cuMemcpyDtoH", 3020, 0, K_SYNC, P_DTOH, A_CPY, NULL)                      \
    X(cuMemcpyDtoH_v2_ptds, "cuMemcpyDtoH", 3020, 1, K_SYNC, P_DTOH, A_CPY, NULL)                 \
    X(cuMemcpyAsync, "cuMemcpyAsync", 4000, 0, K_LAUNCH, (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s), A_CPYA, NULL) \
    X(cuMemcpyAsync_ptsz, "cuMemcpyAsync", 4000, 1, K_LAUNCH, (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s), A_CPYA, NULL) \
    X(cuMemcpyHtoDAsync_v2, "cuMemcpyHtoDAsync", 3020, 0, K_LAUNCH, P_HTODA, A_CPYA, NULL)        \
    X(cuMemcpyHtoDAsync_v2_ptsz, "cuMemcpyHtoDAsync", 3020, 1, K_LAUNCH, P_HTODA, A_CPYA, NULL)   \
    X(cuMemcpyDtoHAsync_v2, "cuMemcpyDtoHAsync", 3020, 0, K_LAUNCH, P_DTOHA, A_CPYA, NULL)        \
    X(cuMemcpyDtoHAsync_v2_ptsz, "cuMemcpyDtoHAsync", 3020, 1, K_LAUNCH, P_DTOHA, A_CPYA, NULL)   \
    X(cuCtxSynchronize, "cuCtxSynchronize", 2000, 0, K_SYNC, (void), (), NULL)                    \
    X(cuCtxSynchronize_v2, "cuCtxSynchronize", 13000, 0, K_SYNC, (CUcontext ctx), (ctx), NULL)    \
    X(cuStreamSynchronize, "cuStreamSynchronize", 2000, 0, K_SYNC, (CUstream s), (s), NULL)       \
    X(cuStreamSynchronize_ptsz, "cuStreamSynchronize", 2000, 1, K_SYNC, (CUstream s), (s), NULL)  \
    X(cuStreamQuery, "cuStreamQuery", 2000, 0, K_QUERY, (CUstream s), (s), NULL)                  \
    X(cuStreamQuery_ptsz, "cuStreamQuery", 2000, 1, K_QUERY, (CUstream s), (s), NULL)             \
    X(cuEventQuery, "cuEventQuery", 2000, 0, K_QUERY, (CUevent e), (e), NULL)                     \
    X(cuEventSynchronize, "cuEventSynchronize", 2000, 0, K_SYNC, (CUevent e), (e), NULL)          \
    X(cuGraphLaunch, "cuGraphLaunch", 10000, 0, K_LAUNCH, (CUgraphExec g, CUstream s), (g, s), NULL) \
    X(cuGraphLaunch_ptsz, "cuGraphLaunch", 10000, 1, K_LAUNCH, (CUgraphExec g, CUstream s), (g, s), NULL)

#define ENUM_ID(name, ...) W_##name,
enum { WRAPPED(ENUM_ID) W_INJECTABLE, W_cuGetProcAddress = W_INJECTABLE, W_cuGetProcAddress_v2, W_COUNT };
_Static_assert(W_INJECTABLE <= 32, "the pass word holds a generation and a 32-bit mask of entry points");

/* Entry points that consume a deferred fault (they fail while one is pending). */
#define SYNC_BIT(name, base, minver, ptsz, kind, ...) | ((kind) == K_SYNC || (kind) == K_QUERY ? 1ULL << W_##name : 0)
static const uint64_t k_sync_mask = 0 WRAPPED(SYNC_BIT);
#define ALL_PASS ((1ULL << W_INJECTABLE) - 1)

/* Real driver functions, filled lazily (exported path) or by dlsym/cuGetProcAddress. */
static void *g_real[W_COUNT];

static void *real_for(int id);
static CUresult gate(int id, int kind, void *func);

/* ---- the plan ---- */
enum { M_ERROR, M_DEFERRED, M_HANG, M_DELAY };
static const char *const k_mode_names[] = {"error", "deferred", "hang", "delay"};

/* Immutable once published, except the run-time counters; never freed, because a thread
 * may still be reading an old plan when a new one is armed (arming is rare, plans small). */
typedef struct plan {
    char plan_id[64];
    uint64_t mask; /* bit per W_ id the symbols globs matched */
    int mode, sticky, error;
    uint64_t after, every, times, seed, delay_us;
    double probability;
    int rank, local_rank, device; /* -1 = any */
    char boot_id[40];             /* "" = any host */
    int other_boot;               /* set when applied: boot_id is not this host's (or unreadable) */
    char kernel[128];
    /* run-time state, reset on arm (new plan) and in a forked child */
    uint64_t calls, fired;
    int pending, tripped;
} plan_t;

static struct ctl_hdr g_dummy_ctl;           /* stands in when no control file is mapped */
static struct ctl_hdr *g_ctl = &g_dummy_ctl;
#define GEN_NEVER (1ULL << 32)               /* no 32-bit generation equals it */
static uint64_t g_seen_gen = GEN_NEVER;      /* last generation applied */
/* The fast path's state in one word: the generation it holds for (high 32 bits) and a bit
 * per wrapped entry point (low 32) whose calls pass straight through; 0 = none do.
 * Recomputed by update_pass() after every change of what it summarises. */
static uint64_t g_pass;
static plan_t *g_plan;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_rank = -1, g_local_rank = -1;   /* read lazily: Ray sets them after start */
static char g_boot_id[40];                   /* this host's, read once when a plan first selects one */
static int g_boot_id_read, g_boot_id_reported;
static char g_host[256];
static int g_log_fd = -1;

static inline int passes(int id) {
    uint64_t bit = 1ULL << id, want = (uint64_t)__atomic_load_n(&g_ctl->gen, __ATOMIC_RELAXED) << 32 | bit;
    return (__atomic_load_n(&g_pass, __ATOMIC_RELAXED) & (0xffffffff00000000ULL | bit)) == want;
}

/* ---- exported wrappers ---- */
#define DEFINE_WRAPPER(name, base, minver, ptsz, kind, params, args, func)      \
    typedef CUresult(*name##_fn) params;                                        \
    static __attribute__((noinline)) CUresult name##_slow params {              \
        name##_fn real = (name##_fn)real_for(W_##name);                         \
        if (!real) return CUDA_ERROR_NOT_INITIALIZED;                           \
        CUresult rc = gate(W_##name, kind, (void *)(func));                     \
        return rc != CUDA_SUCCESS ? rc : real args;                             \
    }                                                                           \
    API CUresult name params {                                                  \
        name##_fn real = (name##_fn)__atomic_load_n(&g_real[W_##name], __ATOMIC_RELAXED); \
        if (__builtin_expect(real != NULL && passes(W_##name), 1)) return real args; \
        return name##_slow args;                                                \
    }
WRAPPED(DEFINE_WRAPPER)

API CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags);
API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                 int *status);

struct row {
    const char *name, *base;
    int minver, ptsz;
    void *wrapper;
};
#define ROW(name, base, minver, ptsz, ...) {#name, base, minver, ptsz, (void *)name},
static const struct row k_rows[W_COUNT] = {
    WRAPPED(ROW)
    {"cuGetProcAddress", "cuGetProcAddress", 11030, 0, (void *)cuGetProcAddress},
    {"cuGetProcAddress_v2", "cuGetProcAddress", 12000, 0, (void *)cuGetProcAddress_v2},
};

static int row_by_name(const char *name) {
    if (name[0] != 'c' || name[1] != 'u') return -1;
    for (int i = 0; i < W_COUNT; i++)
        if (strcmp(k_rows[i].name, name) == 0) return i;
    return -1;
}

/* ---- resolving the real driver ---- */
typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn g_real_dlsym;
static __thread int t_resolving_dlsym; /* recursion guard, in case dlvsym is itself hooked */

static dlsym_fn real_dlsym(void) {
    dlsym_fn f = __atomic_load_n(&g_real_dlsym, __ATOMIC_ACQUIRE);
    if (f || t_resolving_dlsym) return f;
    t_resolving_dlsym = 1;
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
    for (size_t i = 0; !f && i < sizeof versions / sizeof *versions; i++)
        f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    t_resolving_dlsym = 0;
    __atomic_store_n(&g_real_dlsym, f, __ATOMIC_RELEASE);
    return f;
}

static void *driver_handle(void) {
    static void *handle;
    void *h = __atomic_load_n(&handle, __ATOMIC_ACQUIRE);
    if (!h) {
        h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
        if (!h) h = dlopen("libcuda.so.1", RTLD_LAZY);
        __atomic_store_n(&handle, h, __ATOMIC_RELEASE);
    }
    return h;
}

/* The driver's own export of `name` (never ours: a handle's scope excludes LD_PRELOAD). */
static void *driver_export(const char *name) {
    dlsym_fn ds = real_dlsym();
    void *h = driver_handle();
    return ds && h ? ds(h, name) : NULL;
}

static void remember_real(int id, void *p) {
    void *expected = NULL;
    if (p && p != k_rows[id].wrapper)
        __atomic_compare_exchange_n(&g_real[id], &expected, p, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
}

static void *real_for(int id) {
    void *p = __atomic_load_n(&g_real[id], __ATOMIC_ACQUIRE);
    if (p) return p;
    dlsym_fn ds = real_dlsym();
    if (ds) p = ds(RTLD_NEXT, k_rows[id].name); /* next after the shim: a linked driver */
    if (!p || p == k_rows[id].wrapper) p = driver_export(k_rows[id].name);
    remember_real(id, p);
    return __atomic_load_n(&g_real[id], __ATOMIC_ACQUIRE);
}

/* ---- path 2: dlsym ---- */
API void *dlsym(void *handle, const char *name) {
    dlsym_fn ds = real_dlsym();
    if (!ds) return NULL;
    int id = row_by_name(name);
    if (id < 0) return ds(handle, name); /* tail call: RTLD_NEXT still sees the caller */
    void *p = ds(handle, name);          /* caller's handle decides whether it exists */
    if (!p) return NULL;
    remember_real(id, p);
    return k_rows[id].wrapper;
}

/* ---- path 3: cuGetProcAddress ---- */

/* Which of our rows does the driver's answer `p` for (symbol, version, flags) correspond
 * to?  Prefer identity with the driver's exported variant (exact whatever the driver's
 * version rules are); fall back to CUDA's naming rules (_v2 by version, _ptsz/_ptds by
 * flag), then to the symbol as a concrete name.  -1 = not ours: the driver's pointer passes through untouched. */
static int row_for_lookup(const char *symbol, int version, cuuint64_t flags, void *p) {
    int want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    int best = -1;
    for (int i = 0; i < W_COUNT; i++) {
        if (strcmp(k_rows[i].base, symbol) != 0) continue;
        if (driver_export(k_rows[i].name) == p) return i;
        if (k_rows[i].minver > version) continue;
        if (k_rows[i].ptsz && !want_ptsz) continue;
        if (best < 0 || k_rows[i].ptsz > k_rows[best].ptsz ||
            (k_rows[i].ptsz == k_rows[best].ptsz && k_rows[i].minver > k_rows[best].minver))
            best = i;
    }
    return best >= 0 ? best : row_by_name(symbol); /* asked for a concrete name, e.g. "..._ptsz" */
}

static void substitute(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    if (!symbol || !pfn || !*pfn) return;
    int id = row_for_lookup(symbol, version, flags, *pfn);
    if (id < 0) return;
    remember_real(id, *pfn);
    *pfn = k_rows[id].wrapper;
}

typedef CUresult (*gpa1_fn)(const char *, void **, int, cuuint64_t);
typedef CUresult (*gpa2_fn)(const char *, void **, int, cuuint64_t, int *);

API CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    gpa1_fn real = (gpa1_fn)real_for(W_cuGetProcAddress);
    if (!real) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = real(symbol, pfn, version, flags);
    if (rc == CUDA_SUCCESS) substitute(symbol, pfn, version, flags);
    return rc;
}

API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                 int *status) {
    gpa2_fn real = (gpa2_fn)real_for(W_cuGetProcAddress_v2);
    if (!real) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = real(symbol, pfn, version, flags, status);
    if (rc == CUDA_SUCCESS) substitute(symbol, pfn, version, flags);
    return rc;
}

/* ---- error names (for the log) ---- */
static const struct { int code; const char *name; } k_errors[] = {
    {1, "CUDA_ERROR_INVALID_VALUE"},         {2, "CUDA_ERROR_OUT_OF_MEMORY"},
    {3, "CUDA_ERROR_NOT_INITIALIZED"},       {4, "CUDA_ERROR_DEINITIALIZED"},
    {100, "CUDA_ERROR_NO_DEVICE"},           {101, "CUDA_ERROR_INVALID_DEVICE"},
    {201, "CUDA_ERROR_INVALID_CONTEXT"},     {214, "CUDA_ERROR_ECC_UNCORRECTABLE"},
    {220, "CUDA_ERROR_NVLINK_UNCORRECTABLE"}, {226, "CUDA_ERROR_CONTAINED"},
    {600, "CUDA_ERROR_NOT_READY"},           {700, "CUDA_ERROR_ILLEGAL_ADDRESS"},
    {714, "CUDA_ERROR_HARDWARE_STACK_ERROR"}, {715, "CUDA_ERROR_ILLEGAL_INSTRUCTION"},
    {716, "CUDA_ERROR_MISALIGNED_ADDRESS"},  {719, "CUDA_ERROR_LAUNCH_FAILED"},
    {999, "CUDA_ERROR_UNKNOWN"},
};

static const char *error_name(int code) {
    for (size_t i = 0; i < sizeof k_errors / sizeof *k_errors; i++)
        if (k_errors[i].code == code) return k_errors[i].name;
    return "CUDA_ERROR_UNRECOGNIZED";
}

/* ---- JSON log: one write() per line, O_APPEND, so concurrent processes never interleave ---- */
static int env_int(const char *var, int *cache) {
    int v = __atomic_load_n(cache, __ATOMIC_RELAXED);
    if (v >= 0) return v;
    const char *s = getenv(var);
    char *end;
    if (!s || !*s) return -1;
    long n = strtol(s, &end, 10);
    if (*end || n < 0 || n > 1000000) return -1;
    __atomic_store_n(cache, (int)n, __ATOMIC_RELAXED);
    return (int)n;
}

static void log_event(const char *event, const plan_t *p, const char *symbol, uint64_t call) {
    int log_fd = __atomic_load_n(&g_log_fd, __ATOMIC_ACQUIRE);
    if (log_fd < 0) {
        const char *path = getenv("CHAOS_CUDA_LOG");
        int fd = path && *path ? open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666) : -1;
        log_fd = fd >= 0 ? fd : STDERR_FILENO;
        int unset = -1;
        if (!__atomic_compare_exchange_n(&g_log_fd, &unset, log_fd, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            if (fd >= 0) close(fd); /* another thread opened it first */
            log_fd = unset;
        }
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    char rank[16] = "null";
    int r = env_int("RANK", &g_rank);
    if (r >= 0) snprintf(rank, sizeof rank, "%d", r);
    /* what the application sees: hangs show up as "not ready", delays as success */
    int err = p->mode == M_HANG ? CUDA_ERROR_NOT_READY : p->mode == M_DELAY ? CUDA_SUCCESS : p->error;
    char line[1024];
    int n = snprintf(line, sizeof line,
                     "{\"t\":%lld.%06ld,\"host\":\"%s\",\"pid\":%d,\"rank\":%s,\"symbol\":\"%s\","
                     "\"call\":%llu,\"mode\":\"%s\",\"sticky\":%s,\"error\":%d,\"error_name\":\"%s\","
                     "\"plan_id\":\"%s\",\"event\":\"%s\"}\n",
                     (long long)ts.tv_sec, ts.tv_nsec / 1000, g_host, (int)getpid(), rank, symbol,
                     (unsigned long long)call, k_mode_names[p->mode], p->sticky ? "true" : "false",
                     err, err ? error_name(err) : "CUDA_SUCCESS", p->plan_id, event);
    if (n > 0 && (size_t)n < sizeof line && write(log_fd, line, (size_t)n) < 0) {
        /* nowhere left to report a failed log write */
    }
}

/* The `arm` line, plus once per process a line saying a boot_id plan cannot fire here
 * because this host's boot id is unreadable. */
static void log_arm(const plan_t *p) {
    log_event("arm", p, "", 0);
    if (p->boot_id[0] && !g_boot_id[0] && !__atomic_exchange_n(&g_boot_id_reported, 1, __ATOMIC_RELAXED))
        log_event("boot_id_unreadable", p, "", 0);
}

/* ---- plan parsing: `key=value`, one per line or ';'-separated ---- */
static int parse_u64(const char *s, uint64_t *out) {
    char *end;
    if (!*s || *s == '-') return -1;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return -1;
    *out = v;
    return 0;
}

static int parse_error(const char *s, int *out) {
    uint64_t v;
    if (parse_u64(s, &v) == 0 && v > 0 && v < 100000) return *out = (int)v, 0;
    for (size_t i = 0; i < sizeof k_errors / sizeof *k_errors; i++)
        if (strcmp(k_errors[i].name, s) == 0) return *out = k_errors[i].code, 0;
    return -1;
}

static int parse_symbols(char *list, uint64_t *mask) {
    char *save = NULL;
    for (char *g = strtok_r(list, ",", &save); g; g = strtok_r(NULL, ",", &save)) {
        uint64_t m = 0;
        for (int i = 0; i < W_INJECTABLE; i++)
            if (fnmatch(g, k_rows[i].name, 0) == 0 || fnmatch(g, k_rows[i].base, 0) == 0)
                m |= 1ULL << i;
        if (!m) return -1;
        *mask |= m;
    }
    return *mask ? 0 : -1;
}

/* The kernel's form: a lowercase UUID, as /proc/sys/kernel/random/boot_id holds it. */
static int parse_boot_id(const char *s, char *out) {
    if (strlen(s) != 36) return -1;
    for (int i = 0; i < 36; i++) {
        int dash = i == 8 || i == 13 || i == 18 || i == 23;
        if (dash ? s[i] != '-' : !((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return -1;
    }
    memcpy(out, s, 37);
    return 0;
}

static int parse_kv(plan_t *p, const char *k, char *v) {
    uint64_t u;
    if (!strcmp(k, "plan_id")) {
        snprintf(p->plan_id, sizeof p->plan_id, "%s", v);
        for (char *c = p->plan_id; *c; c++) /* keep the JSON log valid whatever was written */
            if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
                  strchr("_.:-", *c)))
                *c = '_';
        return 0;
    }
    if (!strcmp(k, "symbols")) return parse_symbols(v, &p->mask);
    if (!strcmp(k, "mode")) {
        if (!strcmp(v, "sticky")) return p->mode = M_ERROR, p->sticky = 1, 0;
        for (int i = 0; i < 4; i++)
            if (!strcmp(v, k_mode_names[i])) return p->mode = i, 0;
        return -1;
    }
    if (!strcmp(k, "error")) return parse_error(v, &p->error);
    if (!strcmp(k, "boot_id")) return parse_boot_id(v, p->boot_id);
    if (!strcmp(k, "kernel")) return snprintf(p->kernel, sizeof p->kernel, "%s", v) < (int)sizeof p->kernel ? 0 : -1;
    if (!strcmp(k, "probability")) {
        char *end;
        p->probability = strtod(v, &end);
        return *end || !(p->probability > 0.0 && p->probability <= 1.0) ? -1 : 0;
    }
    if (parse_u64(v, &u) != 0) return -1;
    if (!strcmp(k, "sticky")) return u > 1 ? -1 : (p->sticky |= (int)u, 0);
    if (!strcmp(k, "after")) return p->after = u, 0;
    if (!strcmp(k, "every")) return u == 0 ? -1 : (p->every = u, 0);
    if (!strcmp(k, "times")) return p->times = u, 0;
    if (!strcmp(k, "seed")) return p->seed = u, 0;
    if (!strcmp(k, "delay_us")) return p->delay_us = u, 0;
    if (!strcmp(k, "rank")) return p->rank = (int)u, 0;
    if (!strcmp(k, "local_rank")) return p->local_rank = (int)u, 0;
    if (!strcmp(k, "device")) return p->device = (int)u, 0;
    return -1;
}

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t' || *s == '\r') s++;
    char *e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r')) *--e = 0;
    return s;
}

/* NULL with *bad set = rejected; NULL with *bad NULL = empty text (disarm). */
static plan_t *parse_plan(const char *text, size_t len, const char **bad) {
    static char bad_line[128];
    char buf[CTL_TEXT_MAX + 1];
    *bad = NULL;
    if (len > CTL_TEXT_MAX) len = CTL_TEXT_MAX;
    memcpy(buf, text, len);
    buf[len] = 0;
    plan_t *p = calloc(1, sizeof *p);
    if (!p) return *bad = "out of memory", NULL;
    *p = (plan_t){.mode = M_ERROR, .error = 719, .every = 1, .times = 1, .probability = 1.0,
                  .rank = -1, .local_rank = -1, .device = -1};
    strcpy(p->plan_id, "inline");
    int any = 0;
    char *save = NULL;
    for (char *line = strtok_r(buf, "\n;", &save); line; line = strtok_r(NULL, "\n;", &save)) {
        line = trim(line);
        if (!*line || *line == '#') continue;
        char *eq = strchr(line, '=');
        if (eq) *eq = 0;
        if (!eq || parse_kv(p, trim(line), trim(eq + 1)) != 0) {
            if (eq) *eq = '=';
            snprintf(bad_line, sizeof bad_line, "%s", line);
            *bad = bad_line;
            free(p);
            return NULL;
        }
        any = 1;
    }
    if (any && !p->mask) *bad = "no symbols= line";
    if (!any || *bad) return free(p), NULL;
    return p;
}

/* ---- arming: seqlock read of the control file ---- */
static uint32_t fnv1a(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

/* Copies a consistent snapshot of the plan text; 0 on success. */
static int read_control(char *buf, uint32_t *len, uint32_t *gen) {
    struct ctl_hdr *c = g_ctl;
    for (int tries = 0; tries < 200; tries++) {
        uint32_t g1 = __atomic_load_n(&c->gen, __ATOMIC_ACQUIRE);
        if (g1 & 1) { sched_yield(); continue; }
        uint32_t n = __atomic_load_n(&c->len, __ATOMIC_RELAXED);
        uint32_t sum = __atomic_load_n(&c->csum, __ATOMIC_RELAXED);
        if (n > CTL_TEXT_MAX) n = CTL_TEXT_MAX;
        memcpy(buf, c->text, n);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&c->gen, __ATOMIC_RELAXED) != g1) continue;
        if (n && (memcmp(c->magic, "CHAOSCU1", 8) != 0 || fnv1a(buf, n) != sum)) continue;
        *len = n, *gen = g1;
        return 0;
    }
    return -1;
}

static int g_arm_unlogged;

/* The plan selects a rank this process is known not to be (RANK/LOCAL_RANK, once read, are
 * cached for good). */
static int other_rank(const plan_t *p) {
    int rank = __atomic_load_n(&g_rank, __ATOMIC_RELAXED), local = __atomic_load_n(&g_local_rank, __ATOMIC_RELAXED);
    return (p->rank >= 0 && rank >= 0 && rank != p->rank) ||
           (p->local_rank >= 0 && local >= 0 && local != p->local_rank);
}

/* This host's boot id ("" if unreadable), read on first use; caller holds g_lock. */
static const char *boot_id(void) {
    if (!g_boot_id_read) {
        g_boot_id_read = 1;
        int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
        ssize_t n = fd >= 0 ? read(fd, g_boot_id, sizeof g_boot_id - 1) : -1;
        if (fd >= 0) close(fd);
        if (n > 0 && g_boot_id[n - 1] == '\n') n--;
        g_boot_id[n > 0 ? n : 0] = 0;
    }
    return g_boot_id;
}

/* Recomputes g_pass for the applied generation; caller holds g_lock.  Every change of
 * what it reads (plan, arm log, trip, pending fault, shots left, known rank) is followed
 * by a call, so the last call sees the latest state.  Calls that find their bit set are
 * exactly those gate() would let through untouched and uncounted. */
static void update_pass(void) {
    uint64_t gen = __atomic_load_n(&g_seen_gen, __ATOMIC_RELAXED), pass = 0;
    plan_t *p = __atomic_load_n(&g_plan, __ATOMIC_RELAXED);
    if (gen == GEN_NEVER) {
        __atomic_store_n(&g_pass, 0, __ATOMIC_RELEASE);
        return;
    }
    if (!p) {
        pass = ALL_PASS;
    } else if (!__atomic_load_n(&g_arm_unlogged, __ATOMIC_ACQUIRE) && !__atomic_load_n(&p->tripped, __ATOMIC_ACQUIRE)) {
        int spent = p->times && __atomic_load_n(&p->fired, __ATOMIC_ACQUIRE) >= p->times;
        pass = other_rank(p) || p->other_boot || spent ? ALL_PASS : ALL_PASS & ~p->mask;
        if (__atomic_load_n(&p->pending, __ATOMIC_ACQUIRE)) pass &= ~k_sync_mask;
    }
    __atomic_store_n(&g_pass, gen << 32 | pass, __ATOMIC_RELEASE);
}

static void refresh_pass(void) {
    pthread_mutex_lock(&g_lock);
    update_pass();
    pthread_mutex_unlock(&g_lock);
}

/* Publishes `p` (NULL = disarmed) as the plan for generation `gen`; caller holds g_lock.
 * A plan armed at start-up is logged at the process's first driver call instead: every
 * child of a shimmed process inherits LD_PRELOAD, and most never touch CUDA. */
static void publish(plan_t *p, uint32_t gen, int at_startup) {
    plan_t *old = g_plan;
    if (p && p->boot_id[0]) p->other_boot = strcmp(p->boot_id, boot_id()) != 0; /* fails safe: "" never matches */
    __atomic_store_n(&g_plan, p, __ATOMIC_RELEASE);
    __atomic_store_n(&g_seen_gen, (uint64_t)gen, __ATOMIC_RELEASE);
    int old_unlogged = __atomic_exchange_n(&g_arm_unlogged, p && at_startup, __ATOMIC_ACQ_REL);
    update_pass();
    if (p && !at_startup) log_arm(p);
    else if (!p && old && !old_unlogged) log_event("disarm", old, "", 0);
}

static plan_t *apply_text(const char *text, uint32_t len, const char *origin) {
    const char *bad;
    plan_t *p = parse_plan(text, len, &bad);
    if (bad) fprintf(stderr, "chaos-cuda: ignoring %s plan, bad line: %s\n", origin, bad);
    return p;
}

static void reload(void) {
    char buf[CTL_TEXT_MAX];
    uint32_t len, gen;
    pthread_mutex_lock(&g_lock);
    uint32_t now = __atomic_load_n(&g_ctl->gen, __ATOMIC_ACQUIRE);
    if (now != __atomic_load_n(&g_seen_gen, __ATOMIC_RELAXED)) {
        if (read_control(buf, &len, &gen) == 0)
            publish(apply_text(buf, len, "control-file"), gen, 0);
        else { /* a writer is mid-update (or died there): keep the plan, look again when gen moves */
            __atomic_store_n(&g_seen_gen, (uint64_t)now, __ATOMIC_RELEASE);
            update_pass();
        }
    }
    pthread_mutex_unlock(&g_lock);
}

static plan_t *current_plan(void) {
    if ((uint64_t)__atomic_load_n(&g_ctl->gen, __ATOMIC_ACQUIRE) != __atomic_load_n(&g_seen_gen, __ATOMIC_ACQUIRE))
        reload();
    return __atomic_load_n(&g_plan, __ATOMIC_ACQUIRE);
}

/* ---- the injection decision (slow path only) ---- */
static uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static int selectors_match(const plan_t *p, int kind, void *func) {
    if (p->other_boot) return 0;
    if (p->rank >= 0 && env_int("RANK", &g_rank) != p->rank) return 0;
    if (p->local_rank >= 0 && env_int("LOCAL_RANK", &g_local_rank) != p->local_rank) return 0;
    if (p->device >= 0) {
        CUresult (*get_dev)(CUdevice *) = (CUresult(*)(CUdevice *))driver_export("cuCtxGetDevice");
        CUdevice d = -1;
        if (!get_dev || get_dev(&d) != CUDA_SUCCESS || d != p->device) return 0;
    }
    if (p->kernel[0]) {
        CUresult (*get_name)(const char **, CUfunction) =
            (CUresult(*)(const char **, CUfunction))driver_export("cuFuncGetName");
        const char *name = NULL;
        if (kind != K_LAUNCH || !func || !get_name || get_name(&name, (CUfunction)func) != CUDA_SUCCESS ||
            !name || fnmatch(p->kernel, name, 0) != 0)
            return 0;
    }
    return 1;
}

static int triggered(const plan_t *p, uint64_t call) {
    if (call <= p->after || (call - p->after) % p->every != 0) return 0;
    if (p->probability < 1.0 &&
        (double)(splitmix64(p->seed ^ splitmix64(call)) >> 11) / 9007199254740992.0 >= p->probability)
        return 0;
    return 1;
}

/* A hung device: queries report "not ready", syncs block until the plan goes away. */
static CUresult hang(plan_t *p, int kind) {
    if (kind == K_QUERY) return CUDA_ERROR_NOT_READY;
    if (kind != K_SYNC) return CUDA_SUCCESS;
    const struct timespec tick = {0, 1000000};
    while (current_plan() == p) nanosleep(&tick, NULL);
    return CUDA_SUCCESS;
}

static CUresult gate(int id, int kind, void *func) {
    plan_t *p = current_plan();
    if (!p) return CUDA_SUCCESS;
    if (__atomic_load_n(&g_arm_unlogged, __ATOMIC_RELAXED) && __atomic_exchange_n(&g_arm_unlogged, 0, __ATOMIC_ACQ_REL)) {
        log_arm(p);
        refresh_pass();
    }
    if (__atomic_load_n(&p->tripped, __ATOMIC_ACQUIRE))
        return p->mode == M_HANG ? hang(p, kind) : p->error;
    /* a plain load first: the locked exchange only when a fault is actually pending */
    if ((kind == K_SYNC || kind == K_QUERY) && __atomic_load_n(&p->pending, __ATOMIC_ACQUIRE) &&
        __atomic_exchange_n(&p->pending, 0, __ATOMIC_ACQ_REL)) {
        if (p->sticky) __atomic_store_n(&p->tripped, 1, __ATOMIC_RELEASE);
        refresh_pass();
        return p->error;
    }
    if (!(p->mask >> id & 1)) return CUDA_SUCCESS;
    if (!selectors_match(p, kind, func)) {
        if (other_rank(p)) refresh_pass(); /* the rank just became known: later calls skip gate() */
        return CUDA_SUCCESS;
    }
    uint64_t call = __atomic_add_fetch(&p->calls, 1, __ATOMIC_ACQ_REL);
    if (!triggered(p, call)) return CUDA_SUCCESS;
    if (p->times && __atomic_fetch_add(&p->fired, 1, __ATOMIC_ACQ_REL) >= p->times) return CUDA_SUCCESS;
    log_event("inject", p, k_rows[id].name, call);
    if (p->mode == M_DEFERRED) __atomic_store_n(&p->pending, 1, __ATOMIC_RELEASE);
    if (p->mode == M_HANG || (p->mode == M_ERROR && p->sticky)) __atomic_store_n(&p->tripped, 1, __ATOMIC_RELEASE);
    refresh_pass(); /* before a hang or delay blocks: the other threads see the new state at once */
    switch (p->mode) {
    case M_DEFERRED:
        return CUDA_SUCCESS;
    case M_DELAY: {
        struct timespec d = {(time_t)(p->delay_us / 1000000), (long)(p->delay_us % 1000000) * 1000};
        while (nanosleep(&d, &d) != 0 && errno == EINTR) {}
        return CUDA_SUCCESS;
    }
    case M_HANG:
        return hang(p, kind);
    default:
        return p->error;
    }
}

/* ---- start-up and fork ---- */
static void map_control(const char *path) {
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || (st.st_size < CTL_SIZE && ftruncate(fd, CTL_SIZE) != 0)) {
        fprintf(stderr, "chaos-cuda: cannot use control file %s: %s\n", path, strerror(errno));
        if (fd >= 0) close(fd);
        return;
    }
    void *m = mmap(NULL, CTL_SIZE, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        fprintf(stderr, "chaos-cuda: cannot map control file %s: %s\n", path, strerror(errno));
        return;
    }
    __atomic_store_n(&g_ctl, (struct ctl_hdr *)m, __ATOMIC_RELEASE);
}

static void before_fork(void) { pthread_mutex_lock(&g_lock); }
static void after_fork_parent(void) { pthread_mutex_unlock(&g_lock); }
static void after_fork_child(void) {
    plan_t *p = g_plan;
    if (p) p->calls = p->fired = 0, p->pending = p->tripped = 0;
    update_pass(); /* a plan whose shots the parent spent has them all again */
    pthread_mutex_unlock(&g_lock);
}

__attribute__((constructor)) static void chaos_init(void) {
    if (gethostname(g_host, sizeof g_host - 1) != 0) strcpy(g_host, "unknown");
    for (char *c = g_host; *c; c++)
        if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20) *c = '_';
    const char *path = getenv("CHAOS_CUDA_CONTROL");
    if (path && *path) map_control(path);
    /* The inline plan holds from start-up until the control file's generation changes;
     * a control file that is already armed wins. */
    char buf[CTL_TEXT_MAX];
    uint32_t len = 0, gen = 0;
    if (read_control(buf, &len, &gen) != 0) len = 0;
    plan_t *p = len ? apply_text(buf, len, "control-file") : NULL;
    const char *inline_plan = getenv("CHAOS_CUDA_PLAN");
    if (!p && !len && inline_plan && *inline_plan)
        p = apply_text(inline_plan, (uint32_t)strlen(inline_plan), "CHAOS_CUDA_PLAN");
    pthread_mutex_lock(&g_lock);
    publish(p, gen, 1);
    pthread_mutex_unlock(&g_lock);
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}
