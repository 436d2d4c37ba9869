/* The encoder's device code (kernels/tq_cuda_encode.cu) on the SIMT emulator. */
#include "simt.h"
#include "fake.h"
#define TQC_SIMT 1
#include "tq_cuda_encode.cu"
#include "launch_enc.inc"
