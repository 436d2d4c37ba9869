/* The attention kernels' device code (kernels/tq_cuda_attn.cu) on the SIMT emulator. */
#include <cuda_runtime_api.h> /* the launcher's runtime calls: fake_cudart.cpp */
#include "simt.h"
#include "fake.h"
#define TQC_SIMT 1
#define TQC_SIMT_DYN_SMEM (227u << 10) /* attn_mma's dynamic shared memory: an H100's */
#include "tq_cuda_attn.cu"
#include "launch_attn.inc"
