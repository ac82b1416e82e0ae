/* TensorRT's core library: every factory returns NULL, as TensorRT does when it cannot start.
 * The Python bindings' own classes (Logger, enums, docstrings) need nothing more. */
#include "stub.h"

void *createInferBuilder_INTERNAL(void *logger, int version) { return NULL; }
void *createInferRuntime_INTERNAL(void *logger, int version) { return NULL; }
void *createInferRefitter_INTERNAL(void *engine, void *logger, int version) { return NULL; }
void *getBuilderPluginRegistry(int capability) { return NULL; }
int getInferLibVersion(void) { return STUB_MAJOR * 10000; }

/* The plugin registry is never NULL in TensorRT, and onnxruntime's TensorRT provider calls
 * through it (getAllCreators) when it registers TensorRT's plugins. A C++ object starts with
 * a pointer to its table of virtual functions: here every entry answers 0 (no creators, NULL,
 * false), so this is a registry that holds no plugin. */
static long answer_zero(void) { return 0; }

static void *registry_methods[64];
static struct {
    void **methods;
} empty_registry = {registry_methods};

__attribute__((constructor)) static void fill_registry(void) {
    for (size_t i = 0; i < sizeof registry_methods / sizeof registry_methods[0]; i++)
        registry_methods[i] = (void *)answer_zero;
}

void *getPluginRegistry(void) { return &empty_registry; }
