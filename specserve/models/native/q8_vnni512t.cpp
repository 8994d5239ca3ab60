// The int8-activation linear kernels on AVX512-VNNI, tiled by the pass (q8_entry.h): passes of one or
// two tokens (bound by the weight stream) on q8.h's 8-row tile, one weight stream per thread; longer
// passes on q8_wide.h's 16-row tile, its activations copied block-major (ActRuns) and both weight
// streams prefetched in the order they are read.  The same bits as every other path.
// Chosen at run time where the CPU has AVX512-VNNI (see q8.cpp's best_path).
#define SS_Q8_PATH 4
#define SS_Q8_ENTRY ss_q8_linear_vnni512t
#define SS_Q8_PEAK ss_q8_peak_vnni512t
#define SS_Q8_COMPILED ss_q8_compiled_vnni512t
#include "q8_entry.h"
