// The int8-activation linear kernels on AVX-VNNI (the VEX-encoded vpdpbusd of CPUs without
// AVX-512); chosen at run time where the CPU has it and lacks AVX512-VNNI (see q8.h).
#define SS_Q8_PATH 2
#define SS_Q8_ENTRY ss_q8_linear_avxvnni
#define SS_Q8_PEAK ss_q8_peak_avxvnni
#define SS_Q8_COMPILED ss_q8_compiled_avxvnni
#include "q8_entry.h"
