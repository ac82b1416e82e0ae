/* CUDA driver with no device: cuInit fails with CUDA_ERROR_NO_DEVICE (100), as on a machine
 * whose driver sees no GPU (or none exposed to this process). cuda-bindings and the static
 * CUDA runtime inside it open this library by name and find every other entry point through
 * cuGetProcAddress, which hands out the functions below or one that answers "no device". */
#include <string.h>

#include "stub.h"

enum { SUCCESS = 0, NOT_FOUND = 500, NO_DEVICE = 100 };

static int no_device(void) { return NO_DEVICE; }

int cuInit(unsigned flags) { return NO_DEVICE; }

int cuDriverGetVersion(int *version) {
    if (version) *version = STUB_CUDA_VERSION;
    return SUCCESS;
}

int cuDeviceGetCount(int *count) {
    if (count) *count = 0;
    return NO_DEVICE;
}

int cuGetErrorName(int error, const char **name) {
    if (!name) return 1;
    *name = error == SUCCESS ? "CUDA_SUCCESS"
            : error == NO_DEVICE ? "CUDA_ERROR_NO_DEVICE" : "CUDA_ERROR_UNKNOWN";
    return SUCCESS;
}

int cuGetErrorString(int error, const char **text) {
    if (!text) return 1;
    *text = error == SUCCESS ? "no error"
            : error == NO_DEVICE ? "no CUDA-capable device is detected" : "unknown error";
    return SUCCESS;
}

int cuGetProcAddress_v2(const char *symbol, void **function, int version,
                        unsigned long long flags, int *status);

static const struct {
    const char *name;
    void *function;
} entry_points[] = {
    {"cuInit", (void *)cuInit},
    {"cuDriverGetVersion", (void *)cuDriverGetVersion},
    {"cuDeviceGetCount", (void *)cuDeviceGetCount},
    {"cuGetErrorName", (void *)cuGetErrorName},
    {"cuGetErrorString", (void *)cuGetErrorString},
    {"cuGetProcAddress", (void *)cuGetProcAddress_v2},
};

int cuGetProcAddress_v2(const char *symbol, void **function, int version,
                        unsigned long long flags, int *status) {
    if (!symbol || !function) return 1; /* CUDA_ERROR_INVALID_VALUE */
    *function = (void *)no_device;
    for (size_t i = 0; i < sizeof entry_points / sizeof entry_points[0]; i++)
        if (strcmp(entry_points[i].name, symbol) == 0) *function = entry_points[i].function;
    if (status) *status = 0; /* CU_GET_PROC_ADDRESS_SUCCESS */
    return SUCCESS;
}

int cuGetProcAddress(const char *symbol, void **function, int version,
                     unsigned long long flags) {
    return cuGetProcAddress_v2(symbol, function, version, flags, NULL);
}
