/* fake.h — what the emulated launchers need of the fake runtime (fake_cudart.cpp). */
#pragma once
#include <cstddef>
#include <functional>
/* the emulated device: work enqueued on a stream runs at its synchronization */
void fake_enqueue(void *stream, std::function<void()> fn);
/* [p, p + n) lies in memory a kernel may touch (device, pinned, registered, managed) */
bool fake_dev_ok(const void *p, size_t n);
/* A codec descriptor's dense rotations (the whole codec's, or each tq*o
 * half's) are in device memory; true when it has none. */
struct tqc_codec_desc;
bool fake_desc_rot_ok(const struct tqc_codec_desc *d);
void fake_fail(const char *what);
/* A kernel's dynamic shared memory limit (cudaFuncSetAttribute's
 * MaxDynamicSharedMemorySize: 48 KiB until raised), and the registers a
 * thread of it takes, which the occupancy query needs and the emulator
 * cannot count (its launcher says, once per kernel). */
int fake_func_smem(const void *func);
void fake_func_regs(const void *func, int regs);
