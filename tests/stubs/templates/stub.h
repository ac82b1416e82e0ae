/* Shared by the stub templates: the CUDA version the stubs claim to be (the runtime's major),
 * so version checks pass and the first real call says "no device". */
#ifndef STUB_H
#define STUB_H

#include <stddef.h>

#ifndef STUB_CUDA_MAJOR
#define STUB_CUDA_MAJOR 13
#endif
#define STUB_CUDA_VERSION (STUB_CUDA_MAJOR * 1000)

#endif
