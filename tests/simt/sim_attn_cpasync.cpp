/* The attention kernels' device code with attn_mma's tiles copied by
 * cp.async in every lane — the path of the sm_80, sm_100 and sm_121 builds
 * (kernels/tq_cuda_attn.cu, TQC_BULK 0) — on the SIMT emulator:
 * test_cuda_simt_cpasync.  With the phase clocks too (TQC_PHASES, as
 * tqbench-phases' kernels): test_attn_phases checks them here, and every
 * other case runs with them built in and disarmed. */
#define TQC_SIMT_CP_ASYNC 1
#define TQC_PHASES 1
#include "sim_attn.cpp"
