#include "CFuzzDriver.h"

// Weak: NULL unless libclang_rt.fuzzer is linked (it is, whole-archive, with -sanitize=fuzzer).
extern int LLVMFuzzerRunDriver(int *argc, char ***argv, int (*callback)(const uint8_t *, size_t)) __attribute__((weak));

int CFuzzDriver_run(int *argc, char ***argv, CFuzzDriver_Callback callback) {
    if (!LLVMFuzzerRunDriver) return -1;
    return LLVMFuzzerRunDriver(argc, argv, callback);
}
