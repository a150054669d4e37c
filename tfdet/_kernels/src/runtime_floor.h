// No newer C++ runtime than TensorFlow's own.
//
// TensorFlow 2.16's wheels (manylinux2014) ask for glibc 2.16, libstdc++'s
// GLIBCXX_3.4.19 and the C++ ABI's CXXABI_1.3.7 at most; 2.21's for 2.27,
// 3.4.22 and 1.3.11. Compiled by GCC 12 on glibc 2.36, tfdet's kernels asked
// for more: GCC 11's headers throw std::bad_array_new_length through a
// function first exported in GLIBCXX_3.4.29 (its type info: CXXABI_1.3.8),
// GCC 12's bind condition_variable::wait to its GLIBCXX_3.4.30 version, and
// glibc 2.27 gave expf, logf and powf new versions. A wheel built here would then fail to
// load where TensorFlow itself loads. What follows keeps the kernels to the
// older symbols, and `-fno-sized-deallocation` (build.py) keeps them off
// GCC 5's sized delete (CXXABI_1.3.9); the tests and ci/build_wheel.py read
// `objdump -T` to hold them there.
//
// Included by every kernel source after its other headers.
#ifndef TFDET_KERNELS_RUNTIME_FLOOR_H_
#define TFDET_KERNELS_RUNTIME_FLOOR_H_

#if defined(__GLIBCXX__)
#include <condition_variable>
#include <new>

// The same function under its first version (libstdc++ keeps both).
__asm__(
    ".symver _ZNSt18condition_variable4waitERSt11unique_lockISt5mutexE,"
    "_ZNSt18condition_variable4waitERSt11unique_lockISt5mutexE@GLIBCXX_3.4.11");

namespace std {
// A local definition (not exported: the kernels export only their ops'
// registrations) that throws std::bad_alloc, the base of what libstdc++'s own
// throws (whose type info needs CXXABI_1.3.8); reached only by an array
// size past the address space. (The header declared it with default
// visibility, which a later attribute cannot change; the assembler's
// directive can.)
[[noreturn]] void __throw_bad_array_new_length() { throw bad_alloc(); }
}  // namespace std
__asm__(".hidden _ZSt28__throw_bad_array_new_lengthv");
#endif  // __GLIBCXX__

// glibc's expf, logf and powf under their first versions (2.27 added
// second ones with other error handling; the values are the same
// function's). Eigen's scalar pow and log reach the last two.
#if defined(__GLIBC__) && defined(__x86_64__)
__asm__(".symver expf,expf@GLIBC_2.2.5");
__asm__(".symver logf,logf@GLIBC_2.2.5");
__asm__(".symver powf,powf@GLIBC_2.2.5");
#elif defined(__GLIBC__) && defined(__aarch64__)
__asm__(".symver expf,expf@GLIBC_2.17");
__asm__(".symver logf,logf@GLIBC_2.17");
__asm__(".symver powf,powf@GLIBC_2.17");
#endif

#endif  // TFDET_KERNELS_RUNTIME_FLOOR_H_
