/* cuBLAS without a device: handles cannot be created (CUBLAS_STATUS_NOT_INITIALIZED). */
#include "stub.h"

enum { NOT_INITIALIZED = 1 };

const char *cublasGetStatusName(int status) {
    return status == 0 ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_NOT_INITIALIZED";
}

const char *cublasGetStatusString(int status) {
    return status == 0 ? "success" : "the library was not initialized";
}

int cublasCreate_v2(void **handle) {
    if (handle) *handle = NULL;
    return NOT_INITIALIZED;
}
