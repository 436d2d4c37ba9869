/* The attention kernels' device code with attn_mma's tiles copied by
 * cp.async in every lane — the path of the sm_80, sm_100 and sm_121 builds
 * (kernels/tq_cuda_attn.cu, TQC_BULK 0) — on the SIMT emulator:
 * test_cuda_simt_cpasync. */
#define TQC_SIMT_CP_ASYNC 1
#include "sim_attn.cpp"
