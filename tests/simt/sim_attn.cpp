/* The attention kernels' device code (kernels/tq_cuda_attn.cu) on the SIMT emulator. */
#include "simt.h"
#include "fake.h"
#define TQC_SIMT 1
#include "tq_cuda_attn.cu"
#include "launch_attn.inc"
