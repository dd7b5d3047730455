/*
 * Test driver: reaches the (stub) CUDA driver one of the ways real programs do and runs a
 * script of calls given on the command line, printing "<command> <result>" per call.
 *
 *   driver PATH COMMAND...
 *   PATH: export (linked symbols) | dlsym (dlopen + dlsym) | gpa2 (cuGetProcAddress_v2) |
 *         gpa1 (legacy cuGetProcAddress) | ptsz (gpa2, per-thread default stream) |
 *         self2 / self1 (gpa2 looks itself up at 12000 / 11030, then resolves through that)
 * Besides the entry points, commands control the run: wait (until the test writes a line),
 * fork, dev:N, setenv:K=V, stubcalls:NAME, threads:N:ITERATIONS, storm:N ... stop.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long cuuint64_t;
typedef void *CUfunction, *CUstream, *CUcontext, *CUevent, *CUgraphExec;
typedef CUresult (*gpa2_fn)(const char *, void **, int, cuuint64_t, int *);
typedef CUresult (*gpa1_fn)(const char *, void **, int, cuuint64_t);

/* Declared so the `export` path links against the stub's symbols directly. */
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **);
CUresult cuLaunchKernelEx(const void *, CUfunction, void **, void **);
CUresult cuLaunchCooperativeKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuMemcpyAsync(CUdeviceptr, CUdeviceptr, size_t, CUstream);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr, const void *, size_t, CUstream);
CUresult cuMemcpyDtoHAsync_v2(void *, CUdeviceptr, size_t, CUstream);
CUresult cuCtxSynchronize(void);
CUresult cuCtxSynchronize_v2(CUcontext);
CUresult cuStreamSynchronize(CUstream);
CUresult cuStreamQuery(CUstream);
CUresult cuEventQuery(CUevent);
CUresult cuEventSynchronize(CUevent);
CUresult cuGraphLaunch(CUgraphExec, CUstream);
CUresult cuGetExportTable(const void **, const void *);
CUresult cuGetProcAddress_v2(const char *, void **, int, cuuint64_t, int *);

static struct {
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **);
    CUresult (*launchex)(const void *, CUfunction, void **, void **);
    CUresult (*coop)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **);
    CUresult (*alloc)(CUdeviceptr *, size_t);
    CUresult (*allocasync)(CUdeviceptr *, size_t, CUstream);
    CUresult (*htod)(CUdeviceptr, const void *, size_t);
    CUresult (*dtoh)(void *, CUdeviceptr, size_t);
    CUresult (*cpyasync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    CUresult (*htodasync)(CUdeviceptr, const void *, size_t, CUstream);
    CUresult (*dtohasync)(void *, CUdeviceptr, size_t, CUstream);
    CUresult (*ctxsync)(void);
    CUresult (*ctxsync2)(CUcontext);
    CUresult (*ssync)(CUstream);
    CUresult (*squery)(CUstream);
    CUresult (*equery)(CUevent);
    CUresult (*esync)(CUevent);
    CUresult (*graph)(CUgraphExec, CUstream);
    CUresult (*exporttable)(const void **, const void *);
} D;

static void *g_cuda;
static gpa2_fn g_gpa2;
static gpa1_fn g_gpa1;
static int g_flags;

static void die(const char *what) {
    fprintf(stderr, "driver: %s\n", what);
    exit(2);
}

static void *sym(const char *name) {
    void *p = dlsym(g_cuda, name);
    if (!p) die(name);
    return p;
}

static void *proc(const char *base, int version) {
    void *p = NULL;
    int status = -1;
    CUresult rc = g_gpa2 ? g_gpa2(base, &p, version, g_flags, &status) : g_gpa1(base, &p, version, g_flags);
    if (rc || !p) die(base);
    return p;
}

static void resolve(const char *path) {
    g_cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!g_cuda) die(dlerror());
    if (!strcmp(path, "export")) {
        D.launch = cuLaunchKernel, D.launchex = cuLaunchKernelEx, D.coop = cuLaunchCooperativeKernel;
        D.alloc = cuMemAlloc_v2, D.allocasync = cuMemAllocAsync, D.htod = cuMemcpyHtoD_v2;
        D.dtoh = cuMemcpyDtoH_v2, D.cpyasync = cuMemcpyAsync, D.htodasync = cuMemcpyHtoDAsync_v2;
        D.dtohasync = cuMemcpyDtoHAsync_v2, D.ctxsync = cuCtxSynchronize, D.ctxsync2 = cuCtxSynchronize_v2;
        D.ssync = cuStreamSynchronize, D.squery = cuStreamQuery, D.equery = cuEventQuery;
        D.esync = cuEventSynchronize, D.graph = cuGraphLaunch, D.exporttable = cuGetExportTable;
        return;
    }
    if (!strcmp(path, "dlsym")) {
        D.launch = sym("cuLaunchKernel"), D.launchex = sym("cuLaunchKernelEx");
        D.coop = sym("cuLaunchCooperativeKernel"), D.alloc = sym("cuMemAlloc_v2");
        D.allocasync = sym("cuMemAllocAsync"), D.htod = sym("cuMemcpyHtoD_v2");
        D.dtoh = sym("cuMemcpyDtoH_v2"), D.cpyasync = sym("cuMemcpyAsync");
        D.htodasync = sym("cuMemcpyHtoDAsync_v2"), D.dtohasync = sym("cuMemcpyDtoHAsync_v2");
        D.ctxsync = sym("cuCtxSynchronize"), D.ctxsync2 = sym("cuCtxSynchronize_v2");
        D.ssync = sym("cuStreamSynchronize"), D.squery = sym("cuStreamQuery");
        D.equery = sym("cuEventQuery"), D.esync = sym("cuEventSynchronize");
        D.graph = sym("cuGraphLaunch"), D.exporttable = sym("cuGetExportTable");
        return;
    }
    if (!strcmp(path, "gpa1")) g_gpa1 = sym("cuGetProcAddress");
    else g_gpa2 = sym("cuGetProcAddress_v2");
    if (!strcmp(path, "ptsz")) g_flags = 2;
    if (!strcmp(path, "self2")) g_gpa2 = proc("cuGetProcAddress", 12000);
    if (!strcmp(path, "self1")) g_gpa1 = proc("cuGetProcAddress", 11030), g_gpa2 = NULL;
    D.launch = proc("cuLaunchKernel", 12000), D.launchex = proc("cuLaunchKernelEx", 12000);
    D.coop = proc("cuLaunchCooperativeKernel", 12000), D.alloc = proc("cuMemAlloc", 12000);
    D.allocasync = proc("cuMemAllocAsync", 12000), D.htod = proc("cuMemcpyHtoD", 12000);
    D.dtoh = proc("cuMemcpyDtoH", 12000), D.cpyasync = proc("cuMemcpyAsync", 12000);
    D.htodasync = proc("cuMemcpyHtoDAsync", 12000), D.dtohasync = proc("cuMemcpyDtoHAsync", 12000);
    D.ctxsync = proc("cuCtxSynchronize", 12000), D.ctxsync2 = proc("cuCtxSynchronize", 13000);
    D.ssync = proc("cuStreamSynchronize", 12000), D.squery = proc("cuStreamQuery", 12000);
    D.equery = proc("cuEventQuery", 12000), D.esync = proc("cuEventSynchronize", 12000);
    D.graph = proc("cuGraphLaunch", 12000), D.exporttable = proc("cuGetExportTable", 12000);
}

static CUfunction kernel(const char *name) {
    CUresult (*get)(CUfunction *, void *, const char *) = sym("cuModuleGetFunction");
    CUfunction f = NULL;
    if (get(&f, NULL, name)) die("cuModuleGetFunction");
    return f;
}

static void *dlsym_storm(void *arg) {
    static const char *const names[] = {"cuLaunchKernel", "cuInit", "cuStreamQuery_ptsz", "cuGetProcAddress_v2",
                                        "cuGetExportTable", "cuMemcpyHtoD_v2", "no_such_symbol", "cuEventQuery"};
    long iterations = (long)(intptr_t)arg;
    gpa2_fn gpa = sym("cuGetProcAddress_v2");
    for (long i = 0; i < iterations; i++) {
        const char *name = names[i % 8];
        void *p = dlsym(i % 2 ? g_cuda : RTLD_DEFAULT, name);
        if (!p && strcmp(name, "no_such_symbol") != 0) die(name);
        int status;
        gpa("cuLaunchKernel", &p, 12000, i % 2 ? 2 : 0, &status);
        CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **) = p;
        launch(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    }
    return NULL;
}

static volatile int g_stop;
static pthread_t g_storm[64];
static int g_storm_threads;
static unsigned long g_storm_calls[64];

static void *storm(void *arg) { /* slow-path traffic while a test re-arms */
    unsigned long *calls = arg;
    while (!g_stop) {
        D.launch(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
        D.equery(NULL);
        ++*calls;
    }
    return NULL;
}

static CUresult run(const char *cmd) {
    static char host[64], dev[64];
    CUdeviceptr d = (CUdeviceptr)(uintptr_t)dev;
    if (!strncmp(cmd, "launch", 6) && (cmd[6] == 0 || cmd[6] == ':'))
        return D.launch(kernel(cmd[6] ? cmd + 7 : "k"), 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    if (!strcmp(cmd, "launchex")) return D.launchex(NULL, kernel("k"), NULL, NULL);
    if (!strcmp(cmd, "coop")) return D.coop(kernel("k"), 1, 1, 1, 1, 1, 1, 0, NULL, NULL);
    if (!strcmp(cmd, "alloc")) return D.alloc(&d, 16);
    if (!strcmp(cmd, "allocasync")) return D.allocasync(&d, 16, NULL);
    if (!strcmp(cmd, "htod")) return D.htod(d, host, sizeof host);
    if (!strcmp(cmd, "dtoh")) return D.dtoh(host, d, sizeof host);
    if (!strcmp(cmd, "cpyasync")) return D.cpyasync(d, d, sizeof dev, NULL);
    if (!strcmp(cmd, "htodasync")) return D.htodasync(d, host, sizeof host, NULL);
    if (!strcmp(cmd, "dtohasync")) return D.dtohasync(host, d, sizeof host, NULL);
    if (!strcmp(cmd, "ctxsync")) return D.ctxsync();
    if (!strcmp(cmd, "ctxsync2")) return D.ctxsync2(NULL);
    if (!strcmp(cmd, "ssync")) return D.ssync(NULL);
    if (!strcmp(cmd, "squery")) return D.squery(NULL);
    if (!strcmp(cmd, "equery")) return D.equery(NULL);
    if (!strcmp(cmd, "esync")) return D.esync(NULL);
    if (!strcmp(cmd, "graph")) return D.graph(NULL, NULL);
    if (!strcmp(cmd, "exporttable")) {
        const void *table = NULL;
        CUresult rc = D.exporttable(&table, NULL);
        printf("table %llx\n", table ? (unsigned long long)*(const uint64_t *)table : 0ULL);
        return rc;
    }
    if (!strncmp(cmd, "dev:", 4)) {
        CUresult (*retain)(CUcontext *, int) = sym("cuDevicePrimaryCtxRetain");
        CUresult (*set)(CUcontext) = sym("cuCtxSetCurrent");
        CUcontext ctx;
        return retain(&ctx, atoi(cmd + 4)) || set(ctx);
    }
    if (!strncmp(cmd, "setenv:", 7)) return putenv(strdup(cmd + 7));
    if (!strncmp(cmd, "stubcalls:", 10)) {
        unsigned long (*calls)(const char *) = sym("chaosStubCalls");
        printf("calls %s %lu\n", cmd + 10, calls(cmd + 10));
        return 0;
    }
    if (!strcmp(cmd, "wait")) { /* the test arms/disarms, then writes a line */
        char line[16];
        printf("waiting\n");
        fflush(stdout);
        return fgets(line, sizeof line, stdin) ? 0 : 1;
    }
    if (!strncmp(cmd, "threads:", 8)) {
        int n = atoi(cmd + 8);
        long iterations = atol(strchr(cmd + 8, ':') + 1);
        pthread_t t[64];
        for (int i = 0; i < n && i < 64; i++) pthread_create(&t[i], NULL, dlsym_storm, (void *)(intptr_t)iterations);
        for (int i = 0; i < n && i < 64; i++) pthread_join(t[i], NULL);
        return 0;
    }
    if (!strncmp(cmd, "storm:", 6)) {
        for (g_storm_threads = 0; g_storm_threads < atoi(cmd + 6) && g_storm_threads < 64; g_storm_threads++)
            pthread_create(&g_storm[g_storm_threads], NULL, storm, &g_storm_calls[g_storm_threads]);
        return 0;
    }
    if (!strcmp(cmd, "stop")) {
        unsigned long total = 0;
        g_stop = 1;
        for (int i = 0; i < g_storm_threads; i++) pthread_join(g_storm[i], NULL), total += g_storm_calls[i];
        printf("calls storm %lu\n", total);
        return 0;
    }
    fprintf(stderr, "driver: unknown command %s\n", cmd);
    exit(2);
}

int main(int argc, char **argv) {
    if (argc < 2) die("usage: driver PATH COMMAND...");
    resolve(argv[1]);
    const char *who = "";
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "fork")) { /* the child runs the rest; the parent reaps it */
            fflush(stdout);
            pid_t pid = fork();
            if (pid > 0) {
                int status;
                waitpid(pid, &status, 0);
                return WIFEXITED(status) ? WEXITSTATUS(status) : 3;
            }
            who = "child ";
            continue;
        }
        CUresult rc = run(argv[i]);
        printf("%s%s %d\n", who, argv[i], rc);
        fflush(stdout);
    }
    return 0;
}
