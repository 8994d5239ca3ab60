// The int8-activation linear kernels on AVX512-VNNI (vpdpbusd on 256-bit registers, 32 of them);
// chosen at run time where the CPU has AVX512-VNNI, AVX512-VL and AVX512-BW (see q8.h).
#define SS_Q8_PATH 1
#define SS_Q8_ENTRY ss_q8_linear_vnni512
#define SS_Q8_PEAK ss_q8_peak_vnni512
#define SS_Q8_COMPILED ss_q8_compiled_vnni512
#include "q8_entry.h"
