/* libnvidia-ml.so.1 for tests: the NVML calls batchserve makes, answered for simulated GPUs.
 *
 * Real nvidia-ml-py (pynvml) loads this with ctypes and looks each function up by name, so the
 * tests drive pynvml's own structures, error classes and conversions. What the GPUs report is
 * read from the environment at every nvmlInit (comma-separated lists, one entry per GPU; a
 * missing entry takes the default):
 *
 *   NVML_STUB_GPUS          number of GPUs (default 0), or "driver-not-loaded": nvmlInit
 *                           then fails with NVML_ERROR_DRIVER_NOT_LOADED, as without a driver
 *   NVML_STUB_NAMES         product names                 (default "Stub GPU <i>")
 *   NVML_STUB_UUIDS         UUIDs                         (default "GPU-00000000-...-<i>")
 *   NVML_STUB_MEMORY_TOTAL  bytes installed               (default 16 GiB)
 *   NVML_STUB_MEMORY_USED   bytes in use                  (default (i + 1) GiB)
 *   NVML_STUB_UTILIZATION   GPU utilisation, percent      (default 0)
 *   NVML_STUB_TEMPERATURE   core temperature, Celsius     (default 40)
 *   NVML_STUB_POWER_MW      board power, milliwatts; "-" = not supported (default 50000)
 *   NVML_STUB_POWER_LIMIT_MW  power management limit, milliwatts; "-" = not supported
 *                           (default 300000)
 *   NVML_STUB_ENERGY_MJ     energy used since the driver loaded, millijoules, at nvmlInit;
 *                           "-" = not supported (default 1000000)
 *   NVML_STUB_ENERGY_STEP_MJ  millijoules each energy reading adds, as a working board's
 *                           count grows (default 0)
 *   NVML_STUB_LOST          indices of GPUs that answer NVML_ERROR_GPU_IS_LOST (default none)
 *
 * Built with -DNVML_STUB_NO_TEMPERATURE_V it lacks nvmlDeviceGetTemperatureV, as drivers
 * before R565 do, so pynvml raises its real NVMLError_FunctionNotFound.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    SUCCESS = 0,
    UNINITIALIZED = 1,
    INVALID_ARGUMENT = 2,
    NOT_SUPPORTED = 3,
    NOT_FOUND = 6,
    INSUFFICIENT_SIZE = 7,
    DRIVER_NOT_LOADED = 9,
    GPU_IS_LOST = 15,
    ARGUMENT_VERSION_MISMATCH = 25,
};

#define MAX_GPUS 16
#define TEXT 96
#define GIB (1ULL << 30)

typedef struct {
    unsigned index;
    char name[TEXT];
    char uuid[TEXT];
    unsigned long long memory_total, memory_used;
    unsigned utilization;
    int temperature;
    long power_mw; /* < 0: not supported */
    long power_limit_mw; /* < 0: not supported */
    long long energy_mj; /* < 0: not supported */
    unsigned long long energy_step_mj;
    int lost;
} Gpu;

typedef Gpu *Device;

typedef struct {
    unsigned long long total, free, used;
} Memory;

typedef struct {
    unsigned version;
    unsigned long long total, reserved, free, used;
} MemoryV2;

typedef struct {
    unsigned gpu, memory;
} Utilization;

typedef struct {
    unsigned version;
    int sensor_type;
    int temperature;
} Temperature;

static Gpu gpus[MAX_GPUS]; /* static: handles stay valid across nvmlInit calls */
static unsigned gpu_count;
static int initialized;

/* The ``index``-th comma-separated field of variable ``name`` into ``out``; 0 if absent. */
static int field(const char *name, unsigned index, char *out, size_t size) {
    const char *value = getenv(name);
    if (!value) return 0;
    for (unsigned i = 0; i < index; i++) {
        value = strchr(value, ',');
        if (!value) return 0;
        value++;
    }
    size_t length = strcspn(value, ",");
    if (length == 0 || length >= size) return 0;
    memcpy(out, value, length);
    out[length] = '\0';
    return 1;
}

static unsigned long long number(const char *name, unsigned index, unsigned long long fallback) {
    char text[TEXT];
    return field(name, index, text, sizeof text) ? strtoull(text, NULL, 10) : fallback;
}

static int listed(const char *name, unsigned index) {
    char text[TEXT];
    for (unsigned i = 0; field(name, i, text, sizeof text); i++)
        if (strtoul(text, NULL, 10) == index) return 1;
    return 0;
}

static void configure(Gpu *gpu, unsigned i) {
    char power[TEXT];
    gpu->index = i;
    if (!field("NVML_STUB_NAMES", i, gpu->name, sizeof gpu->name))
        snprintf(gpu->name, sizeof gpu->name, "Stub GPU %u", i);
    if (!field("NVML_STUB_UUIDS", i, gpu->uuid, sizeof gpu->uuid))
        snprintf(gpu->uuid, sizeof gpu->uuid, "GPU-00000000-0000-0000-0000-%012u", i);
    gpu->memory_total = number("NVML_STUB_MEMORY_TOTAL", i, 16 * GIB);
    gpu->memory_used = number("NVML_STUB_MEMORY_USED", i, (i + 1) * GIB);
    gpu->utilization = (unsigned)number("NVML_STUB_UTILIZATION", i, 0);
    gpu->temperature = (int)number("NVML_STUB_TEMPERATURE", i, 40);
    gpu->power_mw = (long)number("NVML_STUB_POWER_MW", i, 50000);
    if (field("NVML_STUB_POWER_MW", i, power, sizeof power) && strcmp(power, "-") == 0)
        gpu->power_mw = -1;
    gpu->power_limit_mw = (long)number("NVML_STUB_POWER_LIMIT_MW", i, 300000);
    if (field("NVML_STUB_POWER_LIMIT_MW", i, power, sizeof power) && strcmp(power, "-") == 0)
        gpu->power_limit_mw = -1;
    gpu->energy_mj = (long long)number("NVML_STUB_ENERGY_MJ", i, 1000000);
    if (field("NVML_STUB_ENERGY_MJ", i, power, sizeof power) && strcmp(power, "-") == 0)
        gpu->energy_mj = -1;
    gpu->energy_step_mj = number("NVML_STUB_ENERGY_STEP_MJ", i, 0);
    gpu->lost = listed("NVML_STUB_LOST", i);
}

int nvmlInitWithFlags(unsigned flags) {
    const char *count = getenv("NVML_STUB_GPUS");
    if (count && strcmp(count, "driver-not-loaded") == 0) return DRIVER_NOT_LOADED;
    gpu_count = count ? (unsigned)strtoul(count, NULL, 10) : 0;
    if (gpu_count > MAX_GPUS) gpu_count = MAX_GPUS;
    for (unsigned i = 0; i < gpu_count; i++) configure(&gpus[i], i);
    initialized++;
    return SUCCESS;
}

int nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
int nvmlInit(void) { return nvmlInitWithFlags(0); }

int nvmlShutdown(void) {
    if (!initialized) return UNINITIALIZED;
    initialized--;
    return SUCCESS;
}

const char *nvmlErrorString(int result) {
    switch (result) {
    case SUCCESS: return "Success";
    case UNINITIALIZED: return "Uninitialized";
    case INVALID_ARGUMENT: return "Invalid Argument";
    case NOT_SUPPORTED: return "Not Supported";
    case NOT_FOUND: return "Not Found";
    case INSUFFICIENT_SIZE: return "Insufficient Size";
    case DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case GPU_IS_LOST: return "GPU is lost";
    case ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

int nvmlDeviceGetCount_v2(unsigned *count) {
    if (!initialized) return UNINITIALIZED;
    if (!count) return INVALID_ARGUMENT;
    *count = gpu_count;
    return SUCCESS;
}

int nvmlDeviceGetCount(unsigned *count) { return nvmlDeviceGetCount_v2(count); }

int nvmlDeviceGetHandleByIndex_v2(unsigned index, Device *device) {
    if (!initialized) return UNINITIALIZED;
    if (!device || index >= gpu_count) return INVALID_ARGUMENT;
    *device = &gpus[index];
    return SUCCESS;
}

int nvmlDeviceGetHandleByIndex(unsigned index, Device *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

int nvmlDeviceGetHandleByUUID(const char *uuid, Device *device) {
    if (!initialized) return UNINITIALIZED;
    if (!uuid || !device) return INVALID_ARGUMENT;
    for (unsigned i = 0; i < gpu_count; i++) {
        if (strcmp(gpus[i].uuid, uuid) == 0) {
            *device = &gpus[i];
            return gpus[i].lost ? GPU_IS_LOST : SUCCESS;
        }
    }
    return NOT_FOUND;
}

/* Every per-device call starts here: initialised, a handle of ours, the GPU answering. */
static int check(Device device, const void *out) {
    if (!initialized) return UNINITIALIZED;
    if (!out || device < gpus || device >= gpus + gpu_count) return INVALID_ARGUMENT;
    return device->lost ? GPU_IS_LOST : SUCCESS;
}

static int copy_text(const char *text, char *out, unsigned length) {
    if (strlen(text) + 1 > length) return INSUFFICIENT_SIZE;
    strcpy(out, text);
    return SUCCESS;
}

int nvmlDeviceGetIndex(Device device, unsigned *index) {
    int status = check(device, index);
    if (status == SUCCESS) *index = device->index;
    return status;
}

int nvmlDeviceGetName(Device device, char *name, unsigned length) {
    int status = check(device, name);
    return status == SUCCESS ? copy_text(device->name, name, length) : status;
}

int nvmlDeviceGetUUID(Device device, char *uuid, unsigned length) {
    int status = check(device, uuid);
    return status == SUCCESS ? copy_text(device->uuid, uuid, length) : status;
}

int nvmlDeviceGetMemoryInfo(Device device, Memory *memory) {
    int status = check(device, memory);
    if (status != SUCCESS) return status;
    memory->total = device->memory_total;
    memory->used = device->memory_used;
    memory->free = device->memory_total - device->memory_used;
    return SUCCESS;
}

int nvmlDeviceGetMemoryInfo_v2(Device device, MemoryV2 *memory) {
    int status = check(device, memory);
    if (status != SUCCESS) return status;
    if (memory->version >> 24 != 2) return ARGUMENT_VERSION_MISMATCH;
    memory->total = device->memory_total;
    memory->reserved = 0;
    memory->used = device->memory_used;
    memory->free = device->memory_total - device->memory_used;
    return SUCCESS;
}

int nvmlDeviceGetUtilizationRates(Device device, Utilization *utilization) {
    int status = check(device, utilization);
    if (status != SUCCESS) return status;
    utilization->gpu = device->utilization;
    utilization->memory = 0;
    return SUCCESS;
}

int nvmlDeviceGetTemperature(Device device, int sensor, unsigned *temperature) {
    int status = check(device, temperature);
    if (status != SUCCESS) return status;
    if (sensor != 0) return NOT_SUPPORTED; /* NVML_TEMPERATURE_GPU only */
    *temperature = (unsigned)device->temperature;
    return SUCCESS;
}

#ifndef NVML_STUB_NO_TEMPERATURE_V
int nvmlDeviceGetTemperatureV(Device device, Temperature *temperature) {
    int status = check(device, temperature);
    if (status != SUCCESS) return status;
    if (temperature->version != (sizeof(Temperature) | 1U << 24)) return ARGUMENT_VERSION_MISMATCH;
    if (temperature->sensor_type != 0) return NOT_SUPPORTED;
    temperature->temperature = device->temperature;
    return SUCCESS;
}
#endif

int nvmlDeviceGetPowerUsage(Device device, unsigned *milliwatts) {
    int status = check(device, milliwatts);
    if (status != SUCCESS) return status;
    if (device->power_mw < 0) return NOT_SUPPORTED;
    *milliwatts = (unsigned)device->power_mw;
    return SUCCESS;
}

int nvmlDeviceGetPowerManagementLimit(Device device, unsigned *milliwatts) {
    int status = check(device, milliwatts);
    if (status != SUCCESS) return status;
    if (device->power_limit_mw < 0) return NOT_SUPPORTED;
    *milliwatts = (unsigned)device->power_limit_mw;
    return SUCCESS;
}

int nvmlDeviceGetTotalEnergyConsumption(Device device, unsigned long long *millijoules) {
    int status = check(device, millijoules);
    if (status != SUCCESS) return status;
    if (device->energy_mj < 0) return NOT_SUPPORTED;
    device->energy_mj += (long long)device->energy_step_mj;
    *millijoules = (unsigned long long)device->energy_mj;
    return SUCCESS;
}
