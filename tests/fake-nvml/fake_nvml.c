/* A test double of the NVIDIA driver's NVML library (libnvidia-ml.so.1), so CI can drive Gantry's real
 * NVML backend without a GPU. It implements only the entry points nvml-wrapper 0.13 calls for what Gantry
 * reads; nvml-wrapper resolves every symbol lazily, so the rest may be absent (a call would fail with
 * "function not found").
 *
 * GPUs and their processes come from the JSON file named by GANTRY_FAKE_NVML_CONFIG, re-read whenever the
 * file changes (write a new file and rename it over the old one):
 *   {"gpus": [{"uuid": "GPU-...", "name": "NVIDIA H100 80GB HBM3", "memory_total": 85899345920,
 *              "memory_used": 0, "utilization": 0, "temperature": 40, "power_mw": 70000,
 *              "processes": [{"pid": 1234, "used_memory": 3221225472}],
 *              "mig": [{"uuid": "MIG-...", "name": "...", "memory_total": 10737418240, "memory_used": 0}]}]}
 * A GPU with a non-empty "mig" list reports MIG mode enabled and hands out MIG device handles.
 * An optional top-level "topology" list says how GPUs (by index) connect:
 *   "topology": [{"gpus": [0, 1], "ancestor": "single", "nvlink": true}]
 * "ancestor" is NVML's common-ancestor level (internal, single, multiple, hostbridge, node, system);
 * pairs not listed are "system" without NVLink. Without "topology", both topology calls answer
 * "not supported", as some drivers and virtual machines do. */
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_INVALID_ARGUMENT = 2, NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6, NVML_ERROR_INSUFFICIENT_SIZE = 7, NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_UNKNOWN = 999,
};

#define MAX_GPUS 64
#define MAX_PROCS 64
#define MAX_MIG 8
#define STR 96

typedef struct { unsigned int pid; unsigned long long used; } proc_t;
typedef struct dev dev_t_;
struct dev {
    char uuid[STR], name[STR];
    unsigned long long total, used;
    unsigned int util, temp, power_mw;
    int nproc;
    proc_t procs[MAX_PROCS];
    int nmig;
    dev_t_ *mig; /* MIG instances (for a physical GPU) */
    dev_t_ *parent; /* the physical GPU (for a MIG instance) */
};
typedef dev_t_ *nvmlDevice_t;

typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId, computeInstanceId; } nvmlProcessInfo_t;

/* Handles stay valid across reloads: devices live in fixed arrays and a reload rewrites them in place. */
static dev_t_ gpus[MAX_GPUS];
static dev_t_ migs[MAX_GPUS][MAX_MIG];
static int ngpus;
/* Topology per GPU pair: NVML's common-ancestor level and NVLink, valid when has_topology. */
static int has_topology;
static int topo_level[MAX_GPUS][MAX_GPUS];
static int topo_nvlink[MAX_GPUS][MAX_GPUS];
static int initialized;
static struct stat loaded;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* ---- a small JSON reader: objects, arrays, strings, numbers, true/false/null ---- */
typedef struct { const char *p; int bad; } rd_t;

static void ws(rd_t *r) { while (isspace((unsigned char)*r->p)) r->p++; }
static int eat(rd_t *r, char c) { ws(r); if (*r->p == c) { r->p++; return 1; } return 0; }

static void str(rd_t *r, char *out, size_t cap) {
    size_t n = 0;
    ws(r);
    if (*r->p != '"') { r->bad = 1; return; }
    r->p++;
    while (*r->p && *r->p != '"') {
        char c = *r->p++;
        if (c == '\\' && *r->p) {
            c = *r->p++;
            if (c == 'n') c = '\n'; else if (c == 't') c = '\t';
            else if (c == 'u') { for (int i = 0; i < 4 && isxdigit((unsigned char)*r->p); i++) r->p++; c = '?'; }
        }
        if (out && n + 1 < cap) out[n++] = c;
    }
    if (*r->p != '"') { r->bad = 1; return; }
    r->p++;
    if (out) out[n] = 0;
}

static unsigned long long num(rd_t *r) {
    char *end;
    ws(r);
    double d = strtod(r->p, &end);
    if (end == r->p || d < 0) { r->bad = 1; return 0; }
    r->p = end;
    return (unsigned long long)d;
}

static int boolean(rd_t *r) {
    ws(r);
    if (!strncmp(r->p, "true", 4)) { r->p += 4; return 1; }
    if (!strncmp(r->p, "false", 5)) { r->p += 5; return 0; }
    r->bad = 1;
    return 0;
}

/* NVML's topology levels by name (nvmlGpuTopologyLevel_t). */
static int level(rd_t *r) {
    static const char *names[] = {"internal", "single", "multiple", "hostbridge", "node", "system"};
    char s[32] = "";
    str(r, s, sizeof s);
    for (int i = 0; i < 6; i++) if (!strcmp(s, names[i])) return i * 10;
    r->bad = 1;
    return 50;
}

static void skip(rd_t *r) {
    ws(r);
    if (*r->p == '"') { str(r, NULL, 0); return; }
    if (eat(r, '{')) {
        if (eat(r, '}')) return;
        do { str(r, NULL, 0); if (!eat(r, ':')) { r->bad = 1; return; } skip(r); } while (!r->bad && eat(r, ','));
        if (!eat(r, '}')) r->bad = 1;
        return;
    }
    if (eat(r, '[')) {
        if (eat(r, ']')) return;
        do skip(r); while (!r->bad && eat(r, ','));
        if (!eat(r, ']')) r->bad = 1;
        return;
    }
    for (const char *w = "true\0false\0null\0"; *w; w += strlen(w) + 1)
        if (!strncmp(r->p, w, strlen(w))) { r->p += strlen(w); return; }
    num(r);
}

/* Run the body for each element of an array, with the element's index in `i`. */
#define EACH(r, i, ...) do { \
    if (!eat(r, '[')) { r->bad = 1; break; } \
    if (eat(r, ']')) break; \
    int i = 0; \
    do { __VA_ARGS__; i++; } while (!r->bad && eat(r, ',')); \
    if (!eat(r, ']')) r->bad = 1; \
} while (0)

/* For each key `k` of an object, the body reads its value (or skips it). */
#define KEYS(r, k, ...) do { \
    char k[64]; \
    if (!eat(r, '{')) { r->bad = 1; break; } \
    if (eat(r, '}')) break; \
    do { str(r, k, sizeof k); if (r->bad || !eat(r, ':')) { r->bad = 1; break; } __VA_ARGS__; } while (!r->bad && eat(r, ',')); \
    if (!r->bad && !eat(r, '}')) r->bad = 1; \
} while (0)

static void device(rd_t *r, dev_t_ *d, dev_t_ *mig_slots) {
    memset(d, 0, sizeof *d);
    strcpy(d->name, "NVIDIA Fake GPU");
    d->mig = mig_slots;
    KEYS(r, k, {
        if (!strcmp(k, "uuid")) str(r, d->uuid, STR);
        else if (!strcmp(k, "name")) str(r, d->name, STR);
        else if (!strcmp(k, "memory_total")) d->total = num(r);
        else if (!strcmp(k, "memory_used")) d->used = num(r);
        else if (!strcmp(k, "utilization")) d->util = (unsigned)num(r);
        else if (!strcmp(k, "temperature")) d->temp = (unsigned)num(r);
        else if (!strcmp(k, "power_mw")) d->power_mw = (unsigned)num(r);
        else if (!strcmp(k, "processes")) EACH(r, i, {
            proc_t p = {0, ~0ULL}; /* no used_memory: "not available", as NVML says */
            KEYS(r, pk, {
                if (!strcmp(pk, "pid")) p.pid = (unsigned)num(r);
                else if (!strcmp(pk, "used_memory")) p.used = num(r);
                else skip(r);
            });
            if (i < MAX_PROCS) { d->procs[i] = p; d->nproc = i + 1; }
        });
        else if (!strcmp(k, "mig") && mig_slots) EACH(r, i, {
            if (i < MAX_MIG) { device(r, &mig_slots[i], NULL); mig_slots[i].parent = d; d->nmig = i + 1; }
            else skip(r);
        });
        else skip(r);
    });
}

/* Parse into fresh arrays, then swap in: a half-written or broken file keeps the previous GPUs. */
static int parse(const char *text) {
    static dev_t_ g2[MAX_GPUS], m2[MAX_GPUS][MAX_MIG];
    static int lv2[MAX_GPUS][MAX_GPUS], nv2[MAX_GPUS][MAX_GPUS];
    int n = 0, topo = 0;
    for (int a = 0; a < MAX_GPUS; a++) for (int b = 0; b < MAX_GPUS; b++) { lv2[a][b] = a == b ? 0 : 50; nv2[a][b] = 0; }
    rd_t r = {text, 0};
    KEYS((&r), k, {
        if (!strcmp(k, "gpus")) EACH((&r), i, { if (i < MAX_GPUS) { device(&r, &g2[i], m2[i]); n = i + 1; } else skip(&r); });
        else if (!strcmp(k, "topology")) { topo = 1; EACH((&r), i, {
            unsigned long long ab[2] = {MAX_GPUS, MAX_GPUS};
            int lv = 50, nv = 0;
            KEYS((&r), tk, {
                if (!strcmp(tk, "gpus")) EACH((&r), j, { if (j < 2) ab[j] = num(&r); else skip(&r); });
                else if (!strcmp(tk, "ancestor")) lv = level(&r);
                else if (!strcmp(tk, "nvlink")) nv = boolean(&r);
                else skip(&r);
            });
            if (ab[0] >= MAX_GPUS || ab[1] >= MAX_GPUS) r.bad = 1;
            else { lv2[ab[0]][ab[1]] = lv2[ab[1]][ab[0]] = lv; nv2[ab[0]][ab[1]] = nv2[ab[1]][ab[0]] = nv; }
            (void)i;
        }); }
        else skip(&r);
    });
    ws(&r);
    if (r.bad || *r.p) return -1;
    has_topology = topo;
    memcpy(topo_level, lv2, sizeof topo_level);
    memcpy(topo_nvlink, nv2, sizeof topo_nvlink);
    for (int i = 0; i < n; i++) {
        gpus[i] = g2[i];
        gpus[i].mig = migs[i];
        for (int j = 0; j < g2[i].nmig; j++) { migs[i][j] = m2[i][j]; migs[i][j].parent = &gpus[i]; }
    }
    ngpus = n;
    return 0;
}

/* Re-read the config when it changed (another inode, mtime or size). Called with `lock` held. */
static nvmlReturn_t refresh(void) {
    const char *path = getenv("GANTRY_FAKE_NVML_CONFIG");
    struct stat st;
    if (!path || stat(path, &st) != 0) {
        if (!initialized) fprintf(stderr, "fake NVML: set GANTRY_FAKE_NVML_CONFIG to a readable JSON file (%s)\n", path ? path : "unset");
        return initialized ? NVML_SUCCESS : NVML_ERROR_DRIVER_NOT_LOADED;
    }
    if (initialized && st.st_ino == loaded.st_ino && st.st_size == loaded.st_size
        && st.st_mtim.tv_sec == loaded.st_mtim.tv_sec && st.st_mtim.tv_nsec == loaded.st_mtim.tv_nsec)
        return NVML_SUCCESS;
    FILE *f = fopen(path, "r");
    if (!f) return initialized ? NVML_SUCCESS : NVML_ERROR_DRIVER_NOT_LOADED;
    char *buf = calloc(1, (size_t)st.st_size + 1);
    size_t got = buf ? fread(buf, 1, (size_t)st.st_size, f) : 0;
    fclose(f);
    int ok = buf && got == (size_t)st.st_size && parse(buf) == 0;
    free(buf);
    if (!ok) {
        fprintf(stderr, "fake NVML: %s is not valid JSON in the expected format%s\n", path, initialized ? "; keeping the previous GPUs" : "");
        return initialized ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
    }
    loaded = st;
    return NVML_SUCCESS;
}

#define ENTER(d) \
    pthread_mutex_lock(&lock); \
    if (!initialized) { pthread_mutex_unlock(&lock); return NVML_ERROR_UNINITIALIZED; } \
    refresh(); \
    if (!valid(d)) { pthread_mutex_unlock(&lock); return NVML_ERROR_INVALID_ARGUMENT; }
#define LEAVE(rc) do { pthread_mutex_unlock(&lock); return (rc); } while (0)

/* A handle is valid if it names a present GPU or one of its present MIG instances. */
static int valid(dev_t_ *d) {
    if (!d) return 1; /* calls without a device */
    for (int i = 0; i < ngpus; i++) {
        if (d == &gpus[i]) return 1;
        if (d >= migs[i] && d < migs[i] + gpus[i].nmig) return 1;
    }
    return 0;
}

static nvmlReturn_t copy(char *out, unsigned int len, const char *s) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(s) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(out, s);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&lock);
    int was = initialized;
    nvmlReturn_t rc = was ? NVML_SUCCESS : refresh();
    if (rc == NVML_SUCCESS) initialized++;
    pthread_mutex_unlock(&lock);
    return rc;
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t rc = initialized ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (initialized) initialized--;
    pthread_mutex_unlock(&lock);
    return rc;
}

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded (fake NVML: GANTRY_FAKE_NVML_CONFIG missing)";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int len) {
    ENTER(NULL);
    LEAVE(copy(version, len, "550.54.15-fake"));
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    ENTER(NULL);
    if (!count) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *count = (unsigned)ngpus;
    LEAVE(NVML_SUCCESS);
}
nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
    ENTER(NULL);
    if (!d || i >= (unsigned)ngpus) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *d = &gpus[i];
    LEAVE(NVML_SUCCESS);
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *d) { return nvmlDeviceGetHandleByIndex_v2(i, d); }

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len) {
    ENTER(d);
    LEAVE(d ? copy(uuid, len, d->uuid) : NVML_ERROR_INVALID_ARGUMENT);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int len) {
    ENTER(d);
    LEAVE(d ? copy(name, len, d->name) : NVML_ERROR_INVALID_ARGUMENT);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    ENTER(d);
    if (!d || !m) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    m->total = d->total;
    m->reserved = 0;
    m->used = d->used < d->total ? d->used : d->total;
    m->free = d->total - m->used;
    LEAVE(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    ENTER(d);
    if (!d || !m) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    m->total = d->total;
    m->used = d->used < d->total ? d->used : d->total;
    m->free = d->total - m->used;
    LEAVE(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    ENTER(d);
    if (!d || !u) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    if (d->parent) LEAVE(NVML_ERROR_NOT_SUPPORTED); /* as on real MIG instances */
    u->gpu = d->util;
    u->memory = d->total ? (unsigned)(d->used * 100 / d->total) : 0;
    LEAVE(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *t) {
    ENTER(d);
    if (!d || !t || sensor != 0) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    if (d->parent) LEAVE(NVML_ERROR_NOT_SUPPORTED);
    *t = d->temp;
    LEAVE(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) {
    ENTER(d);
    if (!d || !mw) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    if (d->parent) LEAVE(NVML_ERROR_NOT_SUPPORTED);
    *mw = d->power_mw;
    LEAVE(NVML_SUCCESS);
}

/* NVML's count protocol: too small a buffer (or none) -> INSUFFICIENT_SIZE with the count needed. */
static nvmlReturn_t processes(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *out) {
    ENTER(d);
    if (!d || !count) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    unsigned int n = (unsigned)d->nproc, cap = *count;
    *count = n;
    if (cap < n || (!out && n > 0)) LEAVE(NVML_ERROR_INSUFFICIENT_SIZE);
    for (unsigned int i = 0; i < n; i++) {
        out[i].pid = d->procs[i].pid;
        out[i].usedGpuMemory = d->procs[i].used;
        out[i].gpuInstanceId = out[i].computeInstanceId = 0xFFFFFFFFu;
    }
    LEAVE(NVML_SUCCESS);
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *p) { return processes(d, c, p); }
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *p) { return processes(d, c, p); }

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending) {
    ENTER(d);
    if (!d || !current || !pending) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    if (d->parent) LEAVE(NVML_ERROR_NOT_SUPPORTED);
    *current = *pending = d->nmig > 0;
    LEAVE(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *count) {
    ENTER(d);
    if (!d || !count) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    if (d->parent || d->nmig == 0) LEAVE(NVML_ERROR_NOT_SUPPORTED);
    *count = (unsigned)d->nmig;
    LEAVE(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int i, nvmlDevice_t *mig) {
    ENTER(d);
    if (!d || !mig || d->parent) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    if (i >= (unsigned)d->nmig) LEAVE(NVML_ERROR_NOT_FOUND);
    *mig = &d->mig[i];
    LEAVE(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned int *is_mig) {
    ENTER(d);
    if (!d || !is_mig) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *is_mig = d->parent != NULL;
    LEAVE(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t d, nvmlDevice_t *parent) {
    ENTER(d);
    if (!d || !parent || !d->parent) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *parent = d->parent;
    LEAVE(NVML_SUCCESS);
}

/* The index of a physical GPU handle, or -1 (a MIG instance). Called with `lock` held. */
static int gpu_index(dev_t_ *d) {
    for (int i = 0; i < ngpus; i++) if (d == &gpus[i]) return i;
    return -1;
}

nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t a, nvmlDevice_t b, int *lvl) {
    ENTER(a);
    if (!a || !b || !lvl || !valid(b)) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    int i = gpu_index(a), j = gpu_index(b);
    if (!has_topology || i < 0 || j < 0) LEAVE(NVML_ERROR_NOT_SUPPORTED);
    *lvl = topo_level[i][j];
    LEAVE(NVML_SUCCESS);
}

/* Only NVLink differs between pairs; the other capabilities (PCIe read/write, ...) are "OK". */
nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t a, nvmlDevice_t b, int caps_index, int *status) {
    ENTER(a);
    if (!a || !b || !status || !valid(b)) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    int i = gpu_index(a), j = gpu_index(b);
    if (!has_topology || i < 0 || j < 0) LEAVE(NVML_ERROR_NOT_SUPPORTED);
    enum { CAPS_NVLINK = 2, P2P_OK = 0, P2P_NOT_SUPPORTED = 5 };
    *status = caps_index != CAPS_NVLINK || topo_nvlink[i][j] ? P2P_OK : P2P_NOT_SUPPORTED;
    LEAVE(NVML_SUCCESS);
}
