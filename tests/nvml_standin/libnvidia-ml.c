/*
 * A stand-in libnvidia-ml.so.1 for tests/nvml/test_nvml_isolation.py: one GPU that answers the
 * few calls below, and misbehaves on command. pynvml loads it exactly as it loads the real
 * library (CDLL("libnvidia-ml.so.1"), found through LD_LIBRARY_PATH) and resolves each
 * function by name when first called: a function missing here answers
 * NVML_ERROR_FUNCTION_NOT_FOUND, which the sampler treats as "not offered" (absent quietly).
 *
 * The misbehaviour: every nvmlDeviceGetCount_v2 (once per sampling pass) reads the file named
 * by $FABRICSCOPE_STANDIN_TRIGGER; "segv" dereferences NULL (a real SIGSEGV), "abort" calls
 * abort() (SIGABRT), "hang" blocks until the file says something else, "leak" allocates and
 * writes LEAK_BLOCKS blocks of LEAK_BLOCK bytes a call, keeping them, until LEAK_MAX in all
 * (when malloc fails the call answers NVML_ERROR_MEMORY, as NVML does when it cannot
 * allocate); "grownull" allocates and writes 1 MiB blocks, one every 10 ms, without end, and
 * writes into what malloc returned without checking it: a careless library at its memory
 * ceiling, killed by SIGSEGV writing to NULL. The
 * real NVML's crashes in issue 13 were a segfault and glibc's abort on a corrupted heap.
 *
 * Build: gcc -shared -fPIC -o libnvidia-ml.so.1 libnvidia-ml.c
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NVML_SUCCESS 0
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_MEMORY 20
#define LEAK_BLOCK (8u << 20)
#define LEAK_BLOCKS 8
#define LEAK_MAX (400u << 20)

typedef void *nvmlDevice_t;
static int the_device; /* its address is the one device handle */

static void trigger_word(char *word, size_t size) {
    const char *path = getenv("FABRICSCOPE_STANDIN_TRIGGER");
    word[0] = '\0';
    if (path == NULL) return;
    FILE *f = fopen(path, "r");
    if (f == NULL) return;
    size_t n = fread(word, 1, size - 1, f);
    fclose(f);
    word[n] = '\0';
    while (n > 0 && (word[n - 1] == '\n' || word[n - 1] == ' ')) word[--n] = '\0';
}

static size_t leaked;

/* NVML_SUCCESS, or NVML_ERROR_MEMORY once malloc failed */
static int leak(void) {
    for (int i = 0; i < LEAK_BLOCKS && leaked < LEAK_MAX; i++) {
        char *block = malloc(LEAK_BLOCK);
        if (block == NULL) return NVML_ERROR_MEMORY;
        memset(block, 0x5a, LEAK_BLOCK); /* resident, not only reserved */
        leaked += LEAK_BLOCK;
    }
    return NVML_SUCCESS;
}

/* never returns: the first malloc that fails is written through (SIGSEGV) */
static void grow_null(void) {
    for (;;) {
        char *block = malloc(1u << 20);
        memset(block, 0x5a, 1u << 20);
        usleep(10000);
    }
}

static int misbehave(void) {
    char word[32];
    trigger_word(word, sizeof word);
    if (strcmp(word, "leak") == 0) return leak();
    if (strcmp(word, "grownull") == 0) grow_null();
    if (strcmp(word, "segv") == 0) {
        volatile int *nowhere = NULL;
        *nowhere = 1;
    } else if (strcmp(word, "abort") == 0) {
        abort();
    }
    while (strcmp(word, "hang") == 0) {
        usleep(10000);
        trigger_word(word, sizeof word);
    }
    return NVML_SUCCESS;
}

static int copy_text(char *out, unsigned int length, const char *text) {
    if (out == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(out, text);
    return NVML_SUCCESS;
}

int nvmlInitWithFlags(unsigned int flags) { (void)flags; return NVML_SUCCESS; }
int nvmlInit_v2(void) { return NVML_SUCCESS; }
int nvmlShutdown(void) { return NVML_SUCCESS; }

const char *nvmlErrorString(int result) {
    switch (result) {
    case 0: return "Success";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 13: return "Function Not Found";
    case 20: return "Insufficient Memory";
    default: return "Unknown Error";
    }
}

int nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    return copy_text(version, length, "999.0-standin");
}

int nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    return copy_text(version, length, "99.999-standin");
}

int nvmlDeviceGetCount_v2(unsigned int *count) {
    int failed = misbehave();
    if (failed != NVML_SUCCESS) return failed;
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *count = 1;
    return NVML_SUCCESS;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (index != 0 || device == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &the_device;
    return NVML_SUCCESS;
}

/* the go-nvml issue 60 A100's MIG devices, slot by slot */
static int the_slices[3]; /* their addresses are the MIG device handles */
static const char *const slice_uuids[3] = {
    "MIG-23de08f7-6fcc-5be3-9094-cc3b4162f0bb",
    "MIG-9d822d55-dc61-5acb-8c24-544828b47b03",
    "MIG-5f16849a-8ae9-571a-bc2c-486916c4a324",
};
static const char *const slice_names[3] = {
    "NVIDIA A100-PCIE-40GB MIG 3g.20gb",
    "NVIDIA A100-PCIE-40GB MIG 2g.10gb",
    "NVIDIA A100-PCIE-40GB MIG 1g.5gb",
};
static const unsigned int slice_gpu_instances[3] = {2, 3, 9};

static int mig(void) {
    const char *which = getenv("FABRICSCOPE_STANDIN_MIG");
    return which != NULL && strcmp(which, "go-nvml-60") == 0;
}

/* the slot of a MIG device handle, or -1 for the GPU itself */
static int slice_of(nvmlDevice_t device) {
    for (int i = 0; i < 3; i++)
        if (device == &the_slices[i]) return i;
    return -1;
}

int nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    int s = slice_of(device);
    if (s >= 0) return copy_text(uuid, length, slice_uuids[s]);
    if (mig()) return copy_text(uuid, length, "GPU-3b722aa5-db24-5b93-84c8-e4e0efcef078");
    return copy_text(uuid, length, "GPU-00000000-0000-0000-0000-57a9d1a00001");
}

int nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    int s = slice_of(device);
    if (s >= 0) return copy_text(name, length, slice_names[s]);
    if (mig()) return copy_text(name, length, "NVIDIA A100-PCIE-40GB");
    return copy_text(name, length, "fabricscope stand-in GPU");
}

int nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending) {
    if (device != &the_device || current == NULL || pending == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!mig()) return NVML_ERROR_NOT_SUPPORTED;
    *current = 1;
    *pending = 1;
    return NVML_SUCCESS;
}

int nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    if (device != &the_device || count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (!mig()) return NVML_ERROR_NOT_SUPPORTED;
    *count = 7;
    return NVML_SUCCESS;
}

int nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                        nvmlDevice_t *slice) {
    if (device != &the_device || slice == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (!mig()) return NVML_ERROR_NOT_SUPPORTED;
    if (index >= 3) return NVML_ERROR_NOT_FOUND;
    *slice = &the_slices[index];
    return NVML_SUCCESS;
}

int nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    int s = slice_of(device);
    if (s < 0 || id == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *id = slice_gpu_instances[s];
    return NVML_SUCCESS;
}

int nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    (void)device;
    (void)id;
    return NVML_ERROR_NOT_SUPPORTED; /* not in the transcript */
}

static int uint_answer(unsigned int *out, unsigned int value) {
    if (out == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *out = value;
    return NVML_SUCCESS;
}

/* no compute process runs on the stand-in GPU (pynvml asks for the count with no buffer) */
int nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count, void *infos) {
    (void)d;
    (void)infos;
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *count = 0;
    return NVML_SUCCESS;
}

/* the compute mode from $FABRICSCOPE_STANDIN_COMPUTE_MODE (unset or empty: 0, the default;
 * "3" is exclusive-process, what an MPS control daemon sets; "none": the call is not
 * supported) */
int nvmlDeviceGetComputeMode(nvmlDevice_t d, unsigned int *mode) {
    (void)d;
    const char *v = getenv("FABRICSCOPE_STANDIN_COMPUTE_MODE");
    if (v != NULL && strcmp(v, "none") == 0) return NVML_ERROR_NOT_SUPPORTED;
    return uint_answer(mode, (v == NULL || v[0] == '\0') ? 0u : (unsigned int)atoi(v));
}

int nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t d, unsigned int *v) { (void)d; return uint_answer(v, 5); }
int nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t d, unsigned int *v) { (void)d; return uint_answer(v, 5); }
int nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t d, unsigned int *v) { (void)d; return uint_answer(v, 16); }
int nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t d, unsigned int *v) { (void)d; return uint_answer(v, 16); }
int nvmlDeviceGetPcieReplayCounter(nvmlDevice_t d, unsigned int *v) { (void)d; return uint_answer(v, 0); }

/*
 * nvmlDeviceGetGpuFabricInfoV, answered from $FABRICSCOPE_STANDIN_FABRIC (read on every call):
 * unset or empty: NVML_ERROR_NOT_SUPPORTED (a GPU without multi-node NVLink, as a lone H200);
 * otherwise "STATE STATUS CLIQUE UUIDHEX" (decimal, decimal, decimal, 32 hex digits), put into
 * the caller's nvmlGpuFabricInfo_v2_t as the real library fills it. A caller whose struct
 * version is not v2's gets NVML_ERROR_ARGUMENT_VERSION_MISMATCH, as the real library answers.
 */
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25
#define FABRIC_INFO_V2 0x02000024u

typedef struct {
    unsigned int version;
    unsigned char clusterUuid[16];
    int status;
    unsigned int cliqueId;
    unsigned int state;
    unsigned int healthMask;
} fabric_info_v2;

int nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, fabric_info_v2 *info) {
    (void)device;
    if (info == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (info->version != FABRIC_INFO_V2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    const char *spec = getenv("FABRICSCOPE_STANDIN_FABRIC");
    if (spec == NULL || spec[0] == '\0') return NVML_ERROR_NOT_SUPPORTED;
    unsigned int state = 0, clique = 0;
    int status = 0;
    char hex[33] = {0};
    if (sscanf(spec, "%u %d %u %32s", &state, &status, &clique, hex) != 4 || strlen(hex) != 32)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < 16; i++) {
        unsigned int byte = 0;
        if (sscanf(hex + 2 * i, "%2x", &byte) != 1) return NVML_ERROR_INVALID_ARGUMENT;
        info->clusterUuid[i] = (unsigned char)byte;
    }
    info->status = status;
    info->cliqueId = clique;
    info->state = state;
    info->healthMask = 0;
    return NVML_SUCCESS;
}
