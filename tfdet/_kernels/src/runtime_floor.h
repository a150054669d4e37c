// No newer C++ runtime than TensorFlow's own.
//
// TensorFlow 2.16-2.21's wheels need libstdc++'s GLIBCXX_3.4.22 at most, so
// they load on any system with GCC 6's runtime or newer. Compiled by a newer
// GCC, tfdet's kernels would need more: GCC 11's headers throw
// std::bad_array_new_length through a function first exported in
// GLIBCXX_3.4.29, and GCC 12's bind condition_variable::wait to its
// GLIBCXX_3.4.30 version. A wheel built here would then fail to load where
// TensorFlow itself loads. The two below keep the kernels to the older
// symbols (the build's test reads `objdump -T` to hold them there).
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
// registrations) that throws what libstdc++'s own throws (its type info is
// in the C++ ABI since GCC 4.9, CXXABI_1.3.8).
// (The header declared it with default visibility, which a later attribute
// cannot change; the assembler's directive can.)
[[noreturn]] void __throw_bad_array_new_length() { throw bad_array_new_length(); }
}  // namespace std
__asm__(".hidden _ZSt28__throw_bad_array_new_lengthv");
#endif  // __GLIBCXX__

#endif  // TFDET_KERNELS_RUNTIME_FLOOR_H_
