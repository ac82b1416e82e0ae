/* CUDA runtime on a machine with a driver and no device: every call fails with
 * cudaErrorNoDevice (100), as the real runtime does there. Error strings are the real
 * runtime's, and the kernel registration that runs when a library loads succeeds.
 *
 * CUDART_STUB_DEVICE_COUNT=N makes cudaGetDeviceCount claim N devices (every other call still
 * fails): onnxruntime's option parser checks device_id against that count, so with a count the
 * parser reads every option and the first device call after it (cudaSetDevice) fails. */
#include <stdlib.h>

#include "stub.h"

enum { SUCCESS = 0, INSUFFICIENT_DRIVER = 35, NO_DEVICE = 100 };

const char *cudaGetErrorName(int error) {
    switch (error) {
    case SUCCESS: return "cudaSuccess";
    case INSUFFICIENT_DRIVER: return "cudaErrorInsufficientDriver";
    case NO_DEVICE: return "cudaErrorNoDevice";
    default: return "cudaErrorUnknown";
    }
}

const char *cudaGetErrorString(int error) {
    switch (error) {
    case SUCCESS: return "no error";
    case INSUFFICIENT_DRIVER:
        return "CUDA driver version is insufficient for CUDA runtime version";
    case NO_DEVICE: return "no CUDA-capable device is detected";
    default: return "unknown error";
    }
}

int cudaGetDeviceCount(int *count) {
    const char *claimed = getenv("CUDART_STUB_DEVICE_COUNT");
    int devices = claimed ? atoi(claimed) : 0;
    if (count) *count = devices;
    return devices > 0 ? SUCCESS : NO_DEVICE;
}

int cudaGetDevice(int *device) {
    if (device) *device = 0;
    return NO_DEVICE;
}

int cudaDriverGetVersion(int *version) {
    if (version) *version = STUB_CUDA_VERSION;
    return SUCCESS;
}

int cudaRuntimeGetVersion(int *version) {
    if (version) *version = STUB_CUDA_VERSION;
    return SUCCESS;
}

int cudaGetDriverEntryPointByVersion(const char *symbol, void **function, unsigned version,
                                     unsigned long long flags, int *status) {
    if (function) *function = NULL;
    if (status) *status = 1; /* cudaDriverEntryPointSymbolNotFound */
    return NO_DEVICE;
}

/* Kernel registration, run by the static constructors of libraries with device code. */
static void *fat_binary_handle[4];

void **__cudaRegisterFatBinary(void *fat_cubin) { return fat_binary_handle; }
void __cudaRegisterFatBinaryEnd(void **handle) {}
void __cudaUnregisterFatBinary(void **handle) {}
void __cudaRegisterFunction(void) {}
void __cudaRegisterVar(void) {}
unsigned __cudaPushCallConfiguration(void) { return 0; }
int __cudaPopCallConfiguration(void) { return NO_DEVICE; }
int __cudaGetKernel(void **kernel, const void *entry) {
    if (kernel) *kernel = NULL;
    return NO_DEVICE;
}
int __cudaLaunchKernel(void) { return NO_DEVICE; }
