/* fake.h — what the emulated launchers need of the fake runtime (fake_cudart.cpp). */
#pragma once
#include <cstddef>
#include <functional>
/* the emulated device: work enqueued on a stream runs at its synchronization */
void fake_enqueue(void *stream, std::function<void()> fn);
/* [p, p + n) lies in memory a kernel may touch (device, pinned, registered, managed) */
bool fake_dev_ok(const void *p, size_t n);
void fake_fail(const char *what);
