/* hetmem IPC — libFuzzer target over the handle decoder (clang
 * -fsanitize=fuzzer). Built from wire.c alone, with logging stubbed out.
 * SPDX-License-Identifier: MIT */
#include "decode_check.h"

#include <stdarg.h>

_Atomic int hm__log_level = HM_LOG_OFF;
void hm__log(hm_log_level_t level, const char *file, int line, const char *fmt, ...) {
    (void)level, (void)file, (void)line, (void)fmt;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    decode_check(data, size);
    decode_check_fixed_crc(data, size);
    return 0;
}
