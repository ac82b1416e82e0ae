/* cuDNN without a device: handles cannot be created (CUDNN_STATUS_NOT_INITIALIZED). */
#include "stub.h"

enum { NOT_INITIALIZED = 1001 };

const char *cudnnGetErrorString(int status) {
    return status == 0 ? "CUDNN_STATUS_SUCCESS" : "CUDNN_STATUS_NOT_INITIALIZED";
}

size_t cudnnGetVersion(void) { return STUB_MAJOR * 10000; }

int cudnnCreate(void **handle) {
    if (handle) *handle = NULL;
    return NOT_INITIALIZED;
}
