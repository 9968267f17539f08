#ifndef CFUZZDRIVER_H
#define CFUZZDRIVER_H
#include <stddef.h>
#include <stdint.h>

/// libFuzzer's per-input callback (`LLVMFuzzerTestOneInput`).
typedef int (*CFuzzDriver_Callback)(const uint8_t *data, size_t size);

/// Runs libFuzzer's driver (`LLVMFuzzerRunDriver`) when the binary was linked with
/// `-sanitize=fuzzer`, and returns its exit code; returns -1 at once in a normal build.
///
/// Why: SwiftPM links every Swift executable with `main` aliased to the target's own entry
/// point, so libFuzzer's `main` never runs. The fuzz target's Swift `main` calls this instead;
/// the weak reference below resolves to libFuzzer's driver only when libFuzzer is linked.
int CFuzzDriver_run(int *argc, char ***argv, CFuzzDriver_Callback callback);

#endif
