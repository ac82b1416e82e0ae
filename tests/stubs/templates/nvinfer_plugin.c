/* TensorRT's plugin library: registering the plugins fails (returns false). */
#include "stub.h"

int initLibNvInferPlugins(void *logger, const char *plugin_namespace) { return 0; }
