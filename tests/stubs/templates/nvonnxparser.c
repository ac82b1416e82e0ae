/* TensorRT's ONNX parser: the factories return NULL (no parser without TensorRT). */
#include "stub.h"

void *createNvOnnxParser_INTERNAL(void *network, void *logger, int version) { return NULL; }
void *createNvOnnxParserRefitter_INTERNAL(void *refitter, void *logger, int version) {
    return NULL;
}
int getNvOnnxParserVersion(void) { return STUB_MAJOR * 10000; }
