// The int8-activation linear kernels on AVX512-VNNI with 512-bit registers (q8_wide.h: two row groups
// per register); chosen at run time where the CPU has AVX512-VNNI and its 512-bit multiply-adds run
// at twice the 256-bit rate (see q8.cpp's best_path).
#define SS_Q8_PATH 3
#define SS_Q8_ENTRY ss_q8_linear_vnni512w
#define SS_Q8_PEAK ss_q8_peak_vnni512w
#define SS_Q8_COMPILED ss_q8_compiled_vnni512w
#include "q8_entry.h"
