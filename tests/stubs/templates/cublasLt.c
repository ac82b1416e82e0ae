/* cuBLASLt without a device: handles cannot be created (CUBLAS_STATUS_NOT_INITIALIZED). */
#include "stub.h"

enum { NOT_INITIALIZED = 1 };

const char *cublasLtGetStatusName(int status) {
    return status == 0 ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_NOT_INITIALIZED";
}

const char *cublasLtGetStatusString(int status) {
    return status == 0 ? "success" : "the library was not initialized";
}

int cublasLtCreate(void **handle) {
    if (handle) *handle = NULL;
    return NOT_INITIALIZED;
}
